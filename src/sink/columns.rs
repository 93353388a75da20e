//! The target table's columns and their types ([`Type`]), read once per sink: what every
//! value of a send is read for ([`super::native`]) before its first INSERT, and whether the
//! send travels as Native (every column's type covered) or as JSONEachRow.

use crate::client::{Error, ErrorKind};

use super::encode::Encoded;
use super::native::{Block, Encoding};
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
                        table.escape_debug(),
                        column.chars().take(64).collect::<String>().escape_debug()
                    ),
                )
            })?;
            typed.push((column.as_str(), ty));
        }
        Ok(Block::new(typed, encoding))
    }

    /// Reads rows `start..end` of `encoded` into `block`: each value for its column's type.
    /// `invalid-input` names the first value refused: its row, column, text, why, and the
    /// column's type.
    pub fn read(
        &self,
        encoded: &Encoded,
        start: usize,
        end: usize,
        block: &mut Block,
    ) -> Result<(), Error> {
        for row in start..end {
            block.push_row(encoded.line(row)).map_err(|e| {
                let column = block.column_name(e.column).to_string();
                let ty: String = self
                    .get(&column)
                    .map(ToString::to_string)
                    .unwrap_or_default()
                    .chars()
                    .take(80)
                    .collect();
                Error::invalid(format!(
                    "row index {row}, column '{}': {} is {}; the column's type is {ty} (nothing was sent)",
                    column.chars().take(64).collect::<String>().escape_debug(),
                    e.refusal.value,
                    e.refusal.reason,
                ))
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::encode::encode_json;

    fn table(columns: &[(&str, &str)]) -> TableColumns {
        TableColumns::new(
            columns
                .iter()
                .map(|(n, t)| (n.to_string(), Type::parse(t).unwrap()))
                .collect(),
            "UTC".into(),
        )
    }

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
                .starts_with("row index 1, column 'ts': \"yesterday\" is not a date and time"),
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
                .starts_with("row index 0, column 'n': 256 is out of the range of the column's integer type; the column's type is UInt8"),
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
}
