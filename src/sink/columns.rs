//! The target table's columns and their types ([`Type`]), read once per sink: what every
//! value of a send is read for ([`super::native`]) before its first INSERT, and whether the
//! send travels as Native (every column's type covered) or as JSONEachRow.

use std::borrow::Cow;

use crate::client::{Error, ErrorKind};

use super::encode::{row_refusal, shown, Encoded};
use super::native::{Block, Encoding, RowRefusal};
use super::types::Type;

/// A table's columns, in the table's order, and the server's time zone (for date-time
/// columns that name none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableColumns {
    columns: Vec<(String, Type)>,
    server_zone: String,
}

/// How a send's rows travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One Native block per chunk.
    Native,
    /// JSONEachRow: a column's type is one the sink does not encode.
    JsonEachRow,
}

impl Format {
    /// The name an INSERT's `FORMAT` clause gives it.
    pub fn name(self) -> &'static str {
        match self {
            Format::Native => "Native",
            Format::JsonEachRow => "JSONEachRow",
        }
    }
}

impl TableColumns {
    /// From `(name, type)` pairs and the server's time zone.
    pub fn new(columns: Vec<(String, Type)>, server_zone: String) -> Self {
        TableColumns {
            columns,
            server_zone,
        }
    }

    /// Whether a column of the table is a date-time without a zone of its own (then the
    /// server's zone is what its wall-clock values mean).
    pub fn needs_server_zone(columns: &[(String, Type)]) -> bool {
        fn zoneless(t: &Type) -> bool {
            match t {
                Type::DateTime(None) | Type::DateTime64(_, None) => true,
                Type::Nullable(t)
                | Type::LowCardinality(t)
                | Type::Array(t)
                | Type::SimpleAggregateFunction(_, t) => zoneless(t),
                Type::Map(k, v) => zoneless(k) || zoneless(v),
                Type::Tuple(e) => e.iter().any(|(_, t)| zoneless(t)),
                Type::Nested(e) => e.iter().any(|(_, t)| zoneless(t)),
                _ => false,
            }
        }
        columns.iter().any(|(_, t)| zoneless(t))
    }

    /// The type of `column`.
    pub fn get(&self, column: &str) -> Option<&Type> {
        self.columns
            .iter()
            .find(|(name, _)| name == column)
            .map(|(_, t)| t)
    }

    /// How rows of these columns travel: Native when the sink encodes every one's type.
    pub fn format(&self, columns: &[String]) -> Format {
        let covered = columns
            .iter()
            .all(|c| self.get(c).is_some_and(Type::is_covered));
        if covered {
            Format::Native
        } else {
            Format::JsonEachRow
        }
    }

    /// A block for rows of `columns`; `misconfigured` naming a column the table lacks.
    pub fn block(&self, columns: &[String], table: &str) -> Result<Block, Error> {
        let encoding = Encoding {
            server_zone: &self.server_zone,
            json: self.format(columns) == Format::JsonEachRow,
        };
        let mut typed = Vec::with_capacity(columns.len());
        for column in columns {
            let ty = self.get(column).ok_or_else(|| {
                Error::new(
                    ErrorKind::Misconfigured,
                    format!(
                        "table {} has no column '{}' (the rows name it)",
                        crate::text::escaped(table),
                        crate::text::escaped(&column.chars().take(64).collect::<String>())
                    ),
                )
            })?;
            typed.push((column.as_str(), ty));
        }
        Ok(Block::new(typed, encoding))
    }

    /// Reads rows `start..end` of `encoded` into `block`: each value for its column's type.
    /// `invalid-input` names the first row refused and why: its keys are not the columns,
    /// it is not a JSON object, or a value is refused (then its column, text, why, and the
    /// column's type).
    pub fn read(
        &self,
        encoded: &Encoded,
        start: usize,
        end: usize,
        block: &mut Block,
    ) -> Result<(), Error> {
        #[cfg(feature = "speed")]
        if let Some(keys) = encoded.packed_keys() {
            let columns: Vec<Option<usize>> = keys.iter().map(|k| block.column_index(k)).collect();
            let json = self.format(&encoded.columns) == Format::JsonEachRow;
            let mut scratch = Vec::new();
            for row in start..end {
                block
                    .push_packed_row(encoded.line(row), keys, &columns, &mut scratch)
                    .map_err(|e| self.refused(encoded, row, block, e))?;
                if json {
                    encoded.check_json_row(row, &mut scratch)?;
                }
            }
            return Ok(());
        }
        for row in start..end {
            block
                .push_row(encoded.line(row))
                .map_err(|e| self.refused(encoded, row, block, e))?;
        }
        Ok(())
    }

    fn refused(&self, encoded: &Encoded, row: usize, block: &Block, e: RowRefusal) -> Error {
        let name = encoded.name(row);
        match e {
            RowRefusal::Shape(refusal) => row_refusal(&name, refusal),
            RowRefusal::Keys(keys) => keys_refused(&name, &keys, encoded),
            RowRefusal::Value { column, refusal } => {
                let column = block.column_name(column);
                let ty: String = self
                    .get(column)
                    .map(ToString::to_string)
                    .unwrap_or_default()
                    .chars()
                    .take(80)
                    .collect();
                Error::invalid(format!(
                    "{name}, column {}: {} is {}; the column's type is {ty} (nothing was sent)",
                    shown(column),
                    refusal.value,
                    refusal.reason,
                ))
            }
        }
    }
}

/// A row whose keys are not the columns: the key it repeats, else the columns it lacks and
/// the keys it has beyond them (up to 10 of each).
fn keys_refused(name: &str, keys: &[Vec<u8>], encoded: &Encoded) -> Error {
    let keys: Vec<Cow<str>> = keys.iter().map(|k| String::from_utf8_lossy(k)).collect();
    if let Some(twice) = keys
        .iter()
        .enumerate()
        .find(|(n, k)| keys[..*n].contains(k))
    {
        return Error::invalid(format!("{name}: key {} appears twice", shown(twice.1)));
    }
    let columns = &encoded.columns;
    let missing: Vec<&str> = columns
        .iter()
        .map(String::as_str)
        .filter(|c| !keys.iter().any(|k| k == c))
        .collect();
    let extra: Vec<&str> = keys
        .iter()
        .map(|k| k.as_ref())
        .filter(|k| !columns.iter().any(|c| c == k))
        .collect();
    let list = |names: &[&str]| {
        let mut shown: Vec<String> = names.iter().take(10).map(|k| shown(k)).collect();
        if names.len() > 10 {
            shown.push(format!("and {} more", names.len() - 10));
        }
        shown.join(", ")
    };
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!("missing {}", list(&missing)));
    }
    if !extra.is_empty() {
        parts.push(format!("extra {}", list(&extra)));
    }
    let rule = if encoded.configured {
        "every row must have exactly the configured columns"
    } else {
        "every row must have the same keys as the first row"
    };
    Error::invalid(format!("{name}: {} ({rule})", parts.join("; ")))
}

/// A table of these columns (name, type), its server in UTC (the unit tests').
#[cfg(test)]
pub(crate) fn test_table(columns: &[(&str, &str)]) -> TableColumns {
    TableColumns::new(
        columns
            .iter()
            .map(|(n, t)| (n.to_string(), Type::parse(t).unwrap()))
            .collect(),
        "UTC".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::encode::encode_json;
    use crate::sink::json::MAX_ROW_DEPTH;
    use crate::sink::native::RowRefusal;

    use super::test_table as table;

    #[test]
    fn the_first_refused_value_is_named_with_its_row_column_and_type() {
        let t = table(&[("id", "UInt64"), ("ts", "DateTime64(3)")]);
        let data = b"{\"id\":1,\"ts\":\"2026-01-01 00:00:00\"}\n{\"id\":2,\"ts\":\"yesterday\"}\n";
        let encoded = encode_json(data, None).unwrap();
        let mut block = t.block(&encoded.columns, "db.t").unwrap();
        let e = t.read(&encoded, 0, encoded.len(), &mut block).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput);
        assert!(
            e.message
                .starts_with("line 2, column 'ts': \"yesterday\" is not a date and time"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("the column's type is DateTime64(3)"),
            "{}",
            e.message
        );
    }

    #[test]
    fn typed_rows_are_read_as_the_json_they_are_written_as() {
        use crate::sink::encode::{encode_rows, Value};
        let t = table(&[("b", "String"), ("n", "UInt8"), ("d", "Date")]);
        let rows = vec![vec![
            ("b".to_string(), Value::Bytes(vec![0xff, 0, b'"'])),
            ("n".to_string(), Value::Uint(255)),
            ("d".to_string(), Value::Text("2026-01-01".into())),
        ]];
        let encoded = encode_rows(&rows, None).unwrap();
        let mut block = t.block(&encoded.columns, "t").unwrap();
        t.read(&encoded, 0, 1, &mut block).unwrap();
        let mut out = Vec::new();
        block.write(&mut out);
        // The bytes of the String as given, not UTF-8 and all.
        assert!(out.windows(4).any(|w| w == [3, 0xff, 0, b'"']), "{out:?}");
        let rows = vec![vec![
            ("b".to_string(), Value::Text("x".into())),
            ("n".to_string(), Value::Int(256)),
            ("d".to_string(), Value::Text("2026-01-01".into())),
        ]];
        let encoded = encode_rows(&rows, None).unwrap();
        let e = t.read(&encoded, 0, 1, &mut block).unwrap_err();
        assert!(
            e.message
                .starts_with("row 1, column 'n': 256 is out of the range of the column's integer type; the column's type is UInt8"),
            "{}",
            e.message
        );
    }

    #[test]
    fn a_column_the_table_lacks_is_misconfigured_and_other_types_go_as_json() {
        let t = table(&[("a", "UInt8"), ("j", "JSON")]);
        let e = t.block(&["a".into(), "zz".into()], "db.t").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Misconfigured);
        assert!(e.message.contains("no column 'zz'"), "{}", e.message);
        assert_eq!(t.format(&["a".into()]), Format::Native);
        assert_eq!(t.format(&["a".into(), "j".into()]), Format::JsonEachRow);
    }

    #[test]
    fn the_server_zone_is_needed_for_zoneless_date_times_only() {
        let cols = |ty: &str| vec![("c".to_string(), Type::parse(ty).unwrap())];
        assert!(TableColumns::needs_server_zone(&cols("DateTime")));
        assert!(TableColumns::needs_server_zone(&cols(
            "Array(Nullable(DateTime64(3)))"
        )));
        assert!(!TableColumns::needs_server_zone(&cols("DateTime('UTC')")));
        assert!(!TableColumns::needs_server_zone(&cols("Date")));
    }

    fn read_json(t: &TableColumns, data: &str, columns: Option<&[&str]>) -> Result<Block, Error> {
        let columns: Option<Vec<String>> =
            columns.map(|c| c.iter().map(|s| s.to_string()).collect());
        let encoded = encode_json(data.as_bytes(), columns.as_deref())?;
        let mut block = t.block(&encoded.columns, "t")?;
        t.read(&encoded, 0, encoded.len(), &mut block)?;
        Ok(block)
    }

    fn refused(t: &TableColumns, data: &str, columns: Option<&[&str]>) -> String {
        let e = read_json(t, data, columns).expect_err("refused");
        assert_eq!(e.kind, ErrorKind::InvalidInput);
        e.message
    }

    #[test]
    fn keys_in_any_order_fill_the_same_block() {
        let t = table(&[("a", "UInt8"), ("b", "String"), ("c", "Nullable(Int8)")]);
        let block = |data: &str| {
            let mut out = Vec::new();
            read_json(&t, data, None).unwrap().write(&mut out);
            out
        };
        let in_order = block("{\"a\":1,\"b\":\"x\",\"c\":null}\n{\"a\":2,\"b\":\"y\",\"c\":-1}");
        assert_eq!(
            in_order,
            block("{\"a\":1,\"b\":\"x\",\"c\":null}\n{\"c\":-1,\"b\":\"y\",\"a\":2}")
        );
        assert_eq!(
            in_order,
            block("{\"a\":1,\"b\":\"x\",\"c\":null}\n { \"b\" : \"y\" , \"\\u0061\" : 2 , \"c\" : -1 } ")
        );
    }

    #[test]
    fn a_row_whose_keys_are_not_the_columns_is_named_with_what_differs() {
        let t = table(&[
            ("a", "UInt8"),
            ("b", "UInt8"),
            ("x", "UInt8"),
            ("z", "UInt8"),
        ]);
        assert_eq!(
            refused(&t, "{\"a\":1,\"b\":2}\n\n{\"a\":1}", None),
            "line 3: missing 'b' (every row must have the same keys as the first row)"
        );
        assert_eq!(
            refused(&t, "{\"a\":1,\"x\":2}", Some(&["a", "b"])),
            "line 1: missing 'b'; extra 'x' (every row must have exactly the configured columns)"
        );
        assert_eq!(
            refused(&t, "{\"a\":1,\"b\":2}\n{\"b\":1,\"a\":2,\"b\":3}", None),
            "line 2: key 'b' appears twice"
        );
        assert_eq!(
            refused(&t, "{\"a\":1,\"b\":2}\n{\"a\":1,\"b\":2,\"a\":3}", None),
            "line 2: key 'a' appears twice"
        );
        assert_eq!(
            refused(&t, "{\"a\":1}\n{\"a\":1,\"zz\":2}", None),
            "line 2: extra 'zz' (every row must have the same keys as the first row)"
        );
        assert!(refused(&t, "{}", Some(&["a"])).contains("missing 'a'"));
        let message = refused(&t, "{\"a\":1}\n{\"a\":", None);
        assert!(
            message.starts_with("line 2, column 'a':") && message.contains("not valid JSON"),
            "{message}"
        );
        assert!(refused(&t, "{\"a\":1} {\"a\":2}", None).starts_with("line 1 is not valid JSON"));
        assert_eq!(
            refused(&t, "{\"a\":1}\n[1]", None),
            "line 2 is not a JSON object"
        );
        // An unknown key in a row that is not JSON after it: the JSON is what is wrong.
        assert!(refused(&t, "{\"a\":1}\n{\"q\":1,", None).starts_with("line 2 is not valid JSON"));
    }

    #[test]
    fn rows_nested_past_the_servers_depth_are_refused() {
        let t = table(&[("j", "String")]);
        // MAX_ROW_DEPTH levels, the row's object included: accepted; one more: refused.
        let nested = |levels: usize| {
            format!(
                "{{\"j\":{}1{}}}\n",
                "[".repeat(levels - 1),
                "]".repeat(levels - 1)
            )
        };
        assert!(read_json(&t, &nested(MAX_ROW_DEPTH), None).is_ok());
        for columns in [None, Some(&["j"][..])] {
            let message = refused(&t, &nested(MAX_ROW_DEPTH + 1), columns);
            assert!(
                message.starts_with("line 1, column 'j': [[[[")
                    && message.contains("is nested more than 1000 levels"),
                "{message}"
            );
        }
        // In an array of rows the array is a level too.
        let message = refused(&t, &format!("[{}]", nested(MAX_ROW_DEPTH)), None);
        assert!(
            message.starts_with("the JSON array is not valid JSON: nested more"),
            "{message}"
        );
        // Brackets inside strings are not nesting.
        let strings = format!("{{\"j\":\"{}\\\"{}\"}}", "[".repeat(5000), "{".repeat(5000));
        assert!(read_json(&t, &strings, None).is_ok());
        // Composite types count their levels too.
        let t = table(&[("a", "Array(String)")]);
        let nested = format!("{{\"a\":[{}1{}]}}", "[".repeat(998), "]".repeat(998));
        assert!(read_json(&t, &nested, None).is_ok());
        let nested = format!("{{\"a\":[{}1{}]}}", "[".repeat(999), "]".repeat(999));
        assert!(refused(&t, &nested, None).contains("nested more than 1000"));
    }

    /// Random JSON rows built from pieces that are valid, nearly valid and not JSON, some
    /// then cut or spliced: a fixed xorshift sequence, so every run (and every failure) is
    /// the same.
    struct RandomRows(u64);

    impl RandomRows {
        const KEYS: &'static [&'static str] = &[
            "\"a\"",
            "\"b\"",
            "\"é\"",
            "\"\\u0061\"",
            "\"\"",
            "\"a\\\"\"",
            "\"a\tb\"",
            "a",
            "\"c",
        ];
        /// The first `VALID_VALUES` are valid JSON.
        const VALUES: &'static [&'static str] = &[
            "\"x\"",
            "\"\"",
            "\"é\\\"\\/\\b\\f\\n\\r\\t\"",
            "\"\\u00e9\\uD83D\\uDE00\"",
            "0",
            "-0",
            "1.5",
            "1e5",
            "1E+2",
            "-12.5e-3",
            "123456789012345678901234567890",
            "true",
            "false",
            "null",
            "{}",
            "[1,2]",
            "{\"x\":null}",
            "[{\"y\":[]},\"]\"]",
            "\"abcdefghijklm\\\"nopqrstuvwxyz\"",
            "\"ééééééééé\"",
            "\"0123456789abcdef\\u00e9x\"",
            // Not valid:
            "\"\\x\"",
            "\"\\u12g4\"",
            "\"\\u12\"",
            "\"\\uD800\"",
            "\"tab\there\"",
            "01",
            "1.",
            "-",
            "2e-",
            ".5",
            "+1",
            "tru",
            "nul",
            "truex",
            "NaN",
            "[1,]",
            "{\"x\"}",
            "\"unterminated",
        ];
        const VALID_VALUES: usize = 21;
        const SPACE: &'static [&'static str] = &["", "", "", " ", "\t", "\r", "\n", "  "];

        fn next(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }

        fn pick(&mut self, from: &[&'static str]) -> &'static str {
            from[self.next(from.len())]
        }

        /// A row; `valid` keeps to valid pieces and the keys a, b and é (mostly in that
        /// order), uncut.
        fn row(&mut self, valid: bool) -> String {
            let values = if valid {
                &Self::VALUES[..Self::VALID_VALUES]
            } else {
                Self::VALUES
            };
            let space = match (valid, self.next(2)) {
                (true, 0) => &Self::SPACE[..1],
                _ => Self::SPACE,
            };
            let mut item = String::from("{");
            let fields = if valid { 3 } else { self.next(5) };
            let rotate = if valid { self.next(3) } else { 0 };
            for f in 0..fields {
                let key = if valid {
                    Self::KEYS[(f + rotate) % 3]
                } else {
                    self.pick(Self::KEYS)
                };
                if f > 0 {
                    item.push_str(self.pick(space));
                    item.push(',');
                }
                for piece in [self.pick(space), key, self.pick(space)] {
                    item.push_str(piece);
                }
                item.push(':');
                item.push_str(self.pick(space));
                item.push_str(self.pick(values));
            }
            item.push_str(self.pick(space));
            item.push('}');
            if !valid && self.next(4) == 0 {
                // Cut, double or drop one character.
                let chars: Vec<char> = item.chars().collect();
                let at = self.next(chars.len());
                let mut cut: String = chars[..at].iter().collect();
                match self.next(3) {
                    0 => {}
                    1 => cut.extend(&chars[at - at.min(1)..]),
                    _ => cut.extend(&chars[at + 1..]),
                }
                item = cut;
            }
            item
        }
    }

    /// The reader accepts a row exactly when serde_json reads it as an object whose keys are
    /// the columns, each once; and a String column holds what serde_json reads.
    #[test]
    fn the_row_reader_agrees_with_serde_json() {
        let t = table(&[
            ("a", "Nullable(String)"),
            ("b", "Nullable(String)"),
            ("é", "Nullable(String)"),
        ]);
        let columns: Vec<String> = ["a", "b", "é"].iter().map(|s| s.to_string()).collect();
        let mut rows = RandomRows(0x9e37_79b9_7f4a_7c15);
        let mut block = t.block(&columns, "t").unwrap();
        let (mut accepted, mut keys) = (0, 0);
        for n in 0..200_000 {
            let item = rows.row(n % 3 == 0);
            block.clear();
            let ours = block.push_row(item.as_bytes());
            let theirs: Result<serde_json::Map<String, serde_json::Value>, _> =
                serde_json::from_str(&item);
            match (&ours, &theirs) {
                (Ok(()), Ok(map)) => {
                    accepted += 1;
                    assert!(
                        map.len() == 3 && columns.iter().all(|c| map.contains_key(c)),
                        "{item:?}"
                    );
                    // Each string as the String column holds it: its content, escapes undone.
                    let mut out = Vec::new();
                    block.write(&mut out);
                    for value in map.values() {
                        if let serde_json::Value::String(held) = value {
                            assert!(
                                held.is_empty()
                                    || out.windows(held.len()).any(|w| w == held.as_bytes()),
                                "{item:?}: {held:?} not in the block"
                            );
                        }
                    }
                }
                (Err(RowRefusal::Keys(_)), Ok(map)) => {
                    // The same keys read twice (serde_json keeps the last), or other keys.
                    keys += 1;
                    let all = map.len() == 3 && columns.iter().all(|c| map.contains_key(c));
                    let (read, _) = crate::sink::json::object_keys_until(item.as_bytes());
                    assert!(!all || read.len() > 3, "{item:?}");
                }
                (Err(_), Err(_)) => {}
                (Ok(()), Err(e)) => panic!("{item:?}: accepted, serde_json refuses: {e}"),
                (Err(e), Ok(_)) => panic!("{item:?}: refused as {e:?}, serde_json accepts"),
            }
        }
        // Not vacuous: a good share of the rows were accepted, and some refused for keys.
        assert!(accepted > 50_000, "only {accepted} of 200000 rows accepted");
        assert!(keys > 1_000, "only {keys} key refusals");
    }
}
