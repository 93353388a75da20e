//! Rows to JSONEachRow bytes, with every row rule checked first: at least one row; every row
//! an object; with configured columns every row has exactly those keys, without them every row
//! has the first row's keys; values written in column order. JSON input keeps each value's
//! exact text (large integers and float text are never re-encoded); a line whose keys are
//! already in column order is copied as is.

use std::borrow::Cow;
use std::fmt;
use std::io::Write;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::client::Error;

use super::row_scan::{key_patterns, scan_flat_object, scan_flat_object_at, scan_in_order, Field};

/// One value of a typed row (the WIT `value` variant).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// SQL NULL (only for Nullable columns: the sink never lets ClickHouse turn it into a default).
    Null,
    /// Bool.
    Bool(bool),
    /// Signed 64-bit integer.
    Int(i64),
    /// Unsigned 64-bit integer.
    Uint(u64),
    /// 64-bit float (finite).
    Float(f64),
    /// Text.
    Text(String),
    /// A JSON value given as text (for nested columns: JSON, Array, Map, Tuple; or a String
    /// column that stores the JSON text).
    Json(String),
    /// Raw bytes (for String / FixedString columns), sent unchanged.
    Bytes(Vec<u8>),
}

/// A typed row: column name and value pairs.
pub type Row = Vec<(String, Value)>;

/// Encoded rows: JSONEachRow lines, each either a range of the caller's input (passed through
/// as is) or a range of the encoder's own buffer (rebuilt in column order).
#[derive(Debug, Default)]
pub struct Encoded<'a> {
    /// The columns, in the order values were written.
    pub columns: Vec<String>,
    input: &'a [u8],
    buffer: Vec<u8>,
    lines: Vec<Line>,
}

#[derive(Clone, Copy, Debug)]
enum Line {
    Input(usize, usize),
    Own(usize, usize),
}

impl Encoded<'_> {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Row `n`'s JSON text (one line, without its `\n`).
    pub fn line(&self, n: usize) -> &[u8] {
        match self.lines[n] {
            Line::Input(a, b) => &self.input[a..b],
            Line::Own(a, b) => &self.buffer[a..b],
        }
    }

    /// The bytes of rows `start..end`, each line ending with `\n`, in one new buffer.
    pub fn rows(&self, start: usize, end: usize) -> Vec<u8> {
        let slice = |line: &Line| match *line {
            Line::Input(a, b) => &self.input[a..b],
            Line::Own(a, b) => &self.buffer[a..b],
        };
        let size: usize = self.lines[start..end]
            .iter()
            .map(|l| slice(l).len() + 1)
            .sum();
        let mut out = Vec::with_capacity(size);
        for line in &self.lines[start..end] {
            out.extend_from_slice(slice(line));
            out.push(b'\n');
        }
        out
    }

    /// Writes one row as a JSON object in column order into the own buffer: each column's
    /// name, then whatever `value` writes for it.
    fn push_row<E>(
        &mut self,
        mut value: impl FnMut(&str, &mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        let start = self.buffer.len();
        self.buffer.push(b'{');
        for (n, column) in self.columns.iter().enumerate() {
            if n > 0 {
                self.buffer.push(b',');
            }
            write_json_string(&mut self.buffer, column.as_bytes());
            self.buffer.push(b':');
            value(column, &mut self.buffer)?;
        }
        self.buffer.push(b'}');
        self.lines.push(Line::Own(start, self.buffer.len()));
        Ok(())
    }
}

fn shown(name: &str) -> String {
    let s: String = name.chars().take(64).collect();
    format!("'{}'", s.escape_debug())
}

fn key_list(keys: &[&str]) -> String {
    let mut names: Vec<String> = keys.iter().take(10).map(|k| shown(k)).collect();
    if keys.len() > 10 {
        names.push(format!("and {} more", keys.len() - 10));
    }
    names.join(", ")
}

/// Checks a row's keys against the columns; the error names the row, missing and extra keys.
fn check_keys<'k>(
    index: usize,
    keys: impl Iterator<Item = &'k str> + Clone,
    columns: &[String],
    configured: bool,
) -> Result<(), Error> {
    // The common case, cheaply: a later row with exactly the columns, in their order. The
    // columns are unique (configured ones are checked at open; the first row's passed the
    // full check below), so no key can appear twice.
    let mut in_order = keys.clone();
    if index > 0
        && columns.iter().all(|c| in_order.next() == Some(c.as_str()))
        && in_order.next().is_none()
    {
        return Ok(());
    }
    let mut seen: Vec<&str> = Vec::with_capacity(columns.len());
    for key in keys.clone() {
        if seen.contains(&key) {
            return Err(Error::invalid(format!(
                "row index {index}: key {} appears twice",
                shown(key)
            )));
        }
        seen.push(key);
    }
    let missing: Vec<&str> = columns
        .iter()
        .map(String::as_str)
        .filter(|c| !seen.contains(c))
        .collect();
    let extra: Vec<&str> = seen
        .iter()
        .copied()
        .filter(|k| !columns.iter().any(|c| c == k))
        .collect();
    if missing.is_empty() && extra.is_empty() {
        return Ok(());
    }
    let rule = if configured {
        "every row must have exactly the configured columns"
    } else {
        "every row must have the same keys as the first row"
    };
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!("missing {}", key_list(&missing)));
    }
    if !extra.is_empty() {
        parts.push(format!("extra {}", key_list(&extra)));
    }
    Err(Error::invalid(format!(
        "row index {index}: {} ({rule})",
        parts.join("; ")
    )))
}

/// Encodes typed rows as JSON lines in column order (their values are read for their
/// columns' types afterwards, with every other row: [`super::native`]).
pub fn encode_rows(rows: &[Row], columns: Option<&[String]>) -> Result<Encoded<'static>, Error> {
    let first = rows
        .first()
        .ok_or_else(|| Error::invalid("send needs at least one row"))?;
    let configured = columns.is_some();
    let columns: Vec<String> = match columns {
        Some(c) => c.to_vec(),
        None => {
            if first.is_empty() {
                return Err(Error::invalid(
                    "row index 0 is empty: without configured columns the first row's keys name the columns",
                ));
            }
            first.iter().map(|(k, _)| k.clone()).collect()
        }
    };
    let mut out = Encoded {
        columns,
        ..Default::default()
    };
    for (index, row) in rows.iter().enumerate() {
        check_keys(
            index,
            row.iter().map(|(k, _)| k.as_str()),
            &out.columns,
            configured,
        )?;
        out.push_row(|column, buf| {
            let value = &row.iter().find(|(k, _)| k == column).expect("checked").1;
            let refuse = |why: String| {
                Error::invalid(format!(
                    "row index {index}, column {}: {why}",
                    shown(column)
                ))
            };
            write_value(buf, value).map_err(refuse)
        })?;
    }
    Ok(out)
}

/// Writes one typed value as the JSON the INSERT carries (the typed-row path, and hosts that
/// turn typed rows into JSONEachRow themselves, as the Python binding does); an error says why
/// the value cannot be sent.
pub fn write_value(buf: &mut Vec<u8>, value: &Value) -> Result<(), String> {
    match value {
        Value::Null => buf.extend_from_slice(b"null"),
        Value::Bool(b) => buf.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Int(i) => write!(buf, "{i}").expect("write to Vec"),
        Value::Uint(u) => write!(buf, "{u}").expect("write to Vec"),
        Value::Float(f) if f.is_finite() => write!(buf, "{f:?}").expect("write to Vec"),
        Value::Float(_) => return Err("NaN and infinity cannot be sent as JSON".into()),
        Value::Text(s) => write_json_string(buf, s.as_bytes()),
        Value::Json(text) => {
            let raw: &RawValue = serde_json::from_str(text)
                .map_err(|e| format!("the json value is not valid JSON: {e}"))?;
            buf.extend_from_slice(raw.get().trim().as_bytes());
        }
        Value::Bytes(bytes) => write_json_string(buf, bytes),
    }
    Ok(())
}

/// A JSON string of arbitrary bytes: quotes, backslashes and control characters escaped, every
/// other byte unchanged (ClickHouse reads string bytes verbatim, UTF-8 or not).
pub fn write_json_string(buf: &mut Vec<u8>, bytes: &[u8]) {
    buf.push(b'"');
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: Option<&[u8]> = match b {
            b'"' => Some(b"\\\""),
            b'\\' => Some(b"\\\\"),
            b'\n' => Some(b"\\n"),
            b'\r' => Some(b"\\r"),
            b'\t' => Some(b"\\t"),
            0..=0x1f | 0x7f => None,
            _ => continue,
        };
        buf.extend_from_slice(&bytes[start..i]);
        match escape {
            Some(e) => buf.extend_from_slice(e),
            None => write!(buf, "\\u{b:04x}").expect("write to Vec"),
        }
        start = i + 1;
    }
    buf.extend_from_slice(&bytes[start..]);
    buf.push(b'"');
}

/// A JSON row as serde_json parses it: keys (unescaped) and raw value texts.
struct RawRow<'a> {
    fields: Vec<Field<'a>>,
}

impl<'de> serde::Deserialize<'de> for RawRow<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(RowVisitor)
    }
}

struct RowVisitor;

impl<'de> Visitor<'de> for RowVisitor {
    type Value = RawRow<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawRow<'de>, A::Error> {
        let mut fields = Vec::with_capacity(8);
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let value: &'de RawValue = map.next_value()?;
            fields.push((key, value.get()));
        }
        Ok(RawRow { fields })
    }
}

struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

/// What [`encode_json`] adds rows from: the input text, where it starts in the input bytes,
/// and the configured columns.
struct JsonInput<'t> {
    text: &'t str,
    base: usize,
    columns: Option<&'t [String]>,
    /// Lines of NDJSON (else elements of a JSON array).
    ndjson: bool,
    /// Whether rows are read by the flat scan where it can (always, except in a test that
    /// compares with serde_json alone).
    scan: bool,
}

impl JsonInput<'_> {
    /// Adds row `index`, `item` (a slice of the text): read into `fields` by the flat scan, or
    /// by serde_json where the scan leaves it, then [`JsonInput::accept`]ed.
    fn add<'t>(
        &self,
        item: &'t str,
        fields: &mut Vec<Field<'t>>,
        out: &mut Encoded,
        index: usize,
    ) -> Result<(), Error> {
        check_row_size(item.len(), index)?;
        if self.scan && scan_flat_object(item, fields) {
            return self.accept(item, fields, out, index);
        }
        check_row_depth(item, index)?;
        *fields = read_row(item, index)?;
        self.accept(item.trim(), fields, out, index)
    }

    /// Adds row `index`, read as `fields` from `item` (a slice of the text from its `{` to
    /// its `}`): its keys checked against the columns (the first row's name them when none are
    /// configured); kept as the input's own bytes when
    /// its keys are in column order on one line, else re-encoded in column order.
    fn accept(
        &self,
        item: &str,
        fields: &[Field<'_>],
        out: &mut Encoded,
        index: usize,
    ) -> Result<(), Error> {
        let configured = self.columns.is_some();
        if !configured && index == 0 {
            if fields.is_empty() {
                return Err(Error::invalid(
                    "row index 0 is empty: without configured columns the first row's keys name the columns",
                ));
            }
            out.columns = fields.iter().map(|(k, _)| k.to_string()).collect();
        }
        let in_order = fields.len() == out.columns.len()
            && fields
                .iter()
                .zip(&out.columns)
                .all(|((k, _), c)| same_text(k, c));
        // Keys that are the columns in order pass (configured columns are unique: the sink's
        // options refuse a repeated name), except the first row's keys that name the columns
        // (they may repeat one).
        if !in_order || (index == 0 && !configured) {
            check_keys(
                index,
                fields.iter().map(|(k, _)| k.as_ref()),
                &out.columns,
                configured,
            )?;
        }
        // An NDJSON line holds no newline; an array element may, and must lose it.
        if in_order && (self.ndjson || !item.contains('\n')) {
            let start = self.base + (item.as_ptr() as usize - self.text.as_ptr() as usize);
            out.lines.push(Line::Input(start, start + item.len()));
        } else {
            out.push_row(|column, buf| {
                let raw = fields.iter().find(|(k, _)| k == column).expect("checked").1;
                buf.extend_from_slice(raw.trim().as_bytes());
                Ok::<(), Error>(())
            })?;
        }
        Ok(())
    }
}

/// Whether two keys are the same text: an inline loop (a row's keys are short; a call to the
/// guest's `memcmp` per key cost more than the compare).
fn same_text(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).all(|(x, y)| x == y)
}

/// Most bytes one row may have (its JSON text): a row over it is refused before anything is
/// sent. Far above any row onestep-clickhouse sends in practice; it bounds the memory one row
/// takes in the CLI, which reads rows one line at a time.
pub const MAX_ROW_BYTES: usize = 64 << 20;

/// Most levels of objects and arrays one row may nest, the row's own object included: the
/// server's default `input_format_json_max_depth` (1000), past which it refuses the row anyway
/// (onestep-clickhouse's Python rows cannot nest so deep either: Python's recursion limit is
/// 1000 frames).
pub const MAX_ROW_DEPTH: usize = 1000;

/// Refuses a row over [`MAX_ROW_BYTES`].
pub fn check_row_size(bytes: usize, index: usize) -> Result<(), Error> {
    if bytes > MAX_ROW_BYTES {
        return Err(row_too_large(index));
    }
    Ok(())
}

/// The error for row `index` over [`MAX_ROW_BYTES`].
pub fn row_too_large(index: usize) -> Error {
    Error::invalid(format!(
        "row index {index} is over {} MiB, the most one row may be",
        MAX_ROW_BYTES >> 20
    ))
}

/// Refuses a row whose objects and arrays nest deeper than [`MAX_ROW_DEPTH`] (counted over
/// the text, strings skipped; what is not JSON is left to the reader that words the error).
fn check_row_depth(item: &str, index: usize) -> Result<(), Error> {
    let mut depth = 0usize;
    let mut bytes = item.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'"' => {
                while let Some(b) = bytes.next() {
                    match b {
                        b'\\' => {
                            bytes.next();
                        }
                        b'"' => break,
                        _ => {}
                    }
                }
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_ROW_DEPTH {
                    return Err(Error::invalid(format!(
                        "row index {index} nests objects and arrays more than {MAX_ROW_DEPTH} levels deep, the most one row may"
                    )));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Reads row `index` with serde_json: the slow path, for what [`scan_flat_object`] leaves.
fn read_row(item: &str, index: usize) -> Result<Vec<Field<'_>>, Error> {
    let row: RawRow = serde_json::from_str(item).map_err(|e| {
        if item.trim_start().starts_with('{') {
            Error::invalid(format!("row index {index} is not valid JSON: {e}"))
        } else {
            Error::invalid(format!("row index {index} is not a JSON object"))
        }
    })?;
    Ok(row.fields)
}

/// Encodes JSON input: NDJSON (one object per line; blank lines skipped) or one JSON array of
/// objects, as JSON lines in column order (their values are read for their columns' types
/// afterwards: [`super::native`]).
pub fn encode_json<'a>(data: &'a [u8], columns: Option<&[String]>) -> Result<Encoded<'a>, Error> {
    encode_json_with(data, columns, true)
}

/// [`encode_json`], with the flat scan or (`scan` false, for tests) without: then every row is
/// read by serde_json.
fn encode_json_with<'a>(
    data: &'a [u8],
    columns: Option<&[String]>,
    scan: bool,
) -> Result<Encoded<'a>, Error> {
    let text = std::str::from_utf8(data).map_err(|e| {
        Error::invalid(format!(
            "the JSON input is not UTF-8 (at byte {})",
            e.valid_up_to()
        ))
    })?;
    let text = text.trim_start_matches('\u{feff}');
    let mut out = Encoded {
        input: data,
        lines: Vec::with_capacity(data.len() / 64 + 1),
        ..Default::default()
    };
    if let Some(c) = columns {
        out.columns = c.to_vec();
    }
    let ndjson = !text.trim_start().starts_with('[');
    let configured = columns.is_some();
    let input = JsonInput {
        text,
        // Offset of `text` within `data` (text is `data` minus a leading BOM).
        base: data.len() - text.len(),
        columns,
        ndjson,
        scan,
    };
    let mut index = 0usize;
    let mut fields = Vec::with_capacity(16);
    if !ndjson {
        let items: Vec<&RawValue> = serde_json::from_str(text)
            .map_err(|e| Error::invalid(format!("the JSON array is not valid JSON: {e}")))?;
        for item in items {
            input.add(item.get(), &mut fields, &mut out, index)?;
            index += 1;
        }
    } else {
        let bytes = text.as_bytes();
        // Where the next line starts when a row read at `pos` ends at `end`: right after its
        // newline; `None` when more follows on its line (the general reader decides then).
        let next_line = |end: usize| match &bytes[end..] {
            [] => Some(end),
            [b'\n', ..] => Some(end + 1),
            [b'\r', b'\n', ..] => Some(end + 2),
            _ => None,
        };
        // The columns' keys, once the columns are known (configured, or named by row 0).
        let mut keys: Option<Option<Vec<Vec<u8>>>> = None;
        // The compact rows' value ranges.
        let mut values = Vec::with_capacity(16);
        let mut pos = 0;
        while pos < bytes.len() {
            if input.scan && (configured || index > 0) {
                let keys = keys.get_or_insert_with(|| key_patterns(&out.columns));
                // A compact row of exactly the columns in order is kept as it is.
                let compact = keys
                    .as_deref()
                    .and_then(|k| scan_in_order(bytes, pos, k, &mut values));
                if let Some(end) = compact {
                    if let Some(next) = next_line(end) {
                        check_row_size(end - pos, index)?;
                        out.lines
                            .push(Line::Input(input.base + pos, input.base + end));
                        index += 1;
                        pos = next;
                        continue;
                    }
                }
            }
            // A line that is a flat object is read in one pass, which also finds its end.
            let scanned = input
                .scan
                .then(|| scan_flat_object_at(text, pos, &mut fields))
                .flatten();
            if let Some((end, next)) = scanned.and_then(|end| Some((end, next_line(end)?))) {
                check_row_size(end - pos, index)?;
                input.accept(&text[pos..end], &fields, &mut out, index)?;
                index += 1;
                pos = next;
                continue;
            }
            // Any other line (blank ones skipped).
            let line_end = text[pos..].find('\n').map_or(bytes.len(), |n| pos + n);
            let line = text[pos..line_end].trim_end_matches('\r');
            pos = line_end + 1;
            if line.trim().is_empty() {
                continue;
            }
            input.add(line, &mut fields, &mut out, index)?;
            index += 1;
        }
    }
    if out.is_empty() {
        return Err(Error::invalid("send needs at least one row"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::ErrorKind;

    fn cols(c: &[&str]) -> Vec<String> {
        c.iter().map(|s| s.to_string()).collect()
    }

    fn text(e: &Encoded) -> String {
        String::from_utf8(e.rows(0, e.len())).unwrap()
    }

    fn err_json(data: &str, columns: Option<&[&str]>) -> String {
        let c = columns.map(cols);
        let e = encode_json(data.as_bytes(), c.as_deref()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput);
        e.message
    }

    #[test]
    fn rows_over_the_size_or_depth_limit_are_refused() {
        // MAX_ROW_DEPTH levels, the row's object included: accepted; one more: refused.
        let nested = |levels: usize| {
            format!(
                "{{\"j\":{}1{}}}\n",
                "[".repeat(levels - 1),
                "]".repeat(levels - 1)
            )
        };
        assert!(encode_json(nested(MAX_ROW_DEPTH).as_bytes(), None).is_ok());
        let message = err_json(&nested(MAX_ROW_DEPTH + 1), None);
        assert!(message.contains("more than 1000 levels"), "{message}");
        // Brackets inside strings are not nesting.
        let strings = format!("{{\"s\":\"{}\\\"{}\"}}", "[".repeat(5000), "{".repeat(5000));
        assert!(encode_json(strings.as_bytes(), None).is_ok());
        // Bytes: one row over the limit, as NDJSON and in an array, names its index.
        let big = format!("{{\"s\":\"{}\"}}", "x".repeat(MAX_ROW_BYTES));
        let message = err_json(&format!("{{\"s\":\"a\"}}\n{big}\n"), None);
        assert!(
            message.starts_with("row index 1 is over 64 MiB"),
            "{message}"
        );
        let message = err_json(&format!("[{big}]"), None);
        assert!(
            message.starts_with("row index 0 is over 64 MiB"),
            "{message}"
        );
    }

    #[test]
    fn typed_rows_in_column_order() {
        let rows: Vec<Row> = vec![
            vec![
                ("b".into(), Value::Int(-9223372036854775808)),
                ("a".into(), Value::Uint(u64::MAX)),
                ("c".into(), Value::Text("tab\t\"q\" é".into())),
            ],
            vec![
                ("c".into(), Value::Null),
                ("a".into(), Value::Float(0.1)),
                ("b".into(), Value::Json(r#" {"x": [1, 2.50]} "#.into())),
            ],
        ];
        let e = encode_rows(&rows, Some(&cols(&["a", "b", "c"]))).unwrap();
        assert_eq!(
            text(&e),
            "{\"a\":18446744073709551615,\"b\":-9223372036854775808,\"c\":\"tab\\t\\\"q\\\" é\"}\n{\"a\":0.1,\"b\":{\"x\": [1, 2.50]},\"c\":null}\n"
        );
        // Without configured columns the first row's order is the column order.
        let e = encode_rows(&rows, None).unwrap();
        assert_eq!(e.columns, cols(&["b", "a", "c"]));
    }

    #[test]
    fn bytes_bools_and_floats() {
        let rows: Vec<Row> = vec![vec![
            ("b".into(), Value::Bytes(vec![0xff, 0x00, b'"', b'a', 0x1f])),
            ("t".into(), Value::Bool(true)),
            ("f".into(), Value::Float(1e300)),
        ]];
        let e = encode_rows(&rows, None).unwrap();
        assert_eq!(
            e.rows(0, 1),
            b"{\"b\":\"\xff\\u0000\\\"a\\u001f\",\"t\":true,\"f\":1e300}\n"
        );
        let nan: Vec<Row> = vec![vec![("f".into(), Value::Float(f64::NAN))]];
        let msg = encode_rows(&nan, None).unwrap_err().message;
        assert!(msg.contains("row index 0, column 'f': NaN"), "{msg}");
        let bad: Vec<Row> = vec![vec![("j".into(), Value::Json("{".into()))]];
        assert!(encode_rows(&bad, None)
            .unwrap_err()
            .message
            .contains("not valid JSON"));
    }

    #[test]
    fn typed_row_rules() {
        assert!(encode_rows(&[], None)
            .unwrap_err()
            .message
            .contains("at least one row"));
        let empty: Vec<Row> = vec![vec![]];
        assert!(encode_rows(&empty, None)
            .unwrap_err()
            .message
            .contains("row index 0 is empty"));
        let rows: Vec<Row> = vec![
            vec![("a".into(), Value::Int(1)), ("b".into(), Value::Int(1))],
            vec![("a".into(), Value::Int(1)), ("c".into(), Value::Int(1))],
        ];
        let msg = encode_rows(&rows, None).unwrap_err().message;
        assert_eq!(msg, "row index 1: missing 'b'; extra 'c' (every row must have the same keys as the first row)");
        let msg = encode_rows(&rows, Some(&cols(&["a", "b", "z"])))
            .unwrap_err()
            .message;
        assert_eq!(
            msg,
            "row index 0: missing 'z' (every row must have exactly the configured columns)"
        );
        let dup: Vec<Row> = vec![vec![
            ("a".into(), Value::Int(1)),
            ("a".into(), Value::Int(2)),
        ]];
        assert!(encode_rows(&dup, None)
            .unwrap_err()
            .message
            .contains("appears twice"));
    }

    #[test]
    fn json_lines_pass_through_with_exact_numbers() {
        let input = "{\"id\":1,\"big\":123456789012345678901234567890,\"f\":1.10000000000000000000001}\n\n{\"big\":2,\"id\":3e2,\"f\":-0.0}\r\n";
        let e = encode_json(input.as_bytes(), None).unwrap();
        assert_eq!(e.columns, cols(&["id", "big", "f"]));
        assert_eq!(
            text(&e),
            "{\"id\":1,\"big\":123456789012345678901234567890,\"f\":1.10000000000000000000001}\n{\"id\":3e2,\"big\":2,\"f\":-0.0}\n"
        );
        assert_eq!(e.len(), 2);
        assert_eq!(e.rows(1, 2), b"{\"id\":3e2,\"big\":2,\"f\":-0.0}\n");
    }

    #[test]
    fn json_arrays_and_escaped_keys() {
        let input = "[\n {\"a\": 1,\n  \"b\": \"x\"},\n {\"b\": \"y\", \"\\u0061\": 2}\n]";
        let e = encode_json(input.as_bytes(), Some(&cols(&["a", "b"]))).unwrap();
        assert_eq!(text(&e), "{\"a\":1,\"b\":\"x\"}\n{\"a\":2,\"b\":\"y\"}\n");
    }

    /// Random JSON rows built from pieces that are valid, nearly valid and out of the flat
    /// scan's reach, some then cut or spliced: a fixed xorshift sequence, so every run (and
    /// every failure) is the same.
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
            "\"\\u00e9\\uD800\"",
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
            "\"abcdefghijklmnopqrstuvwxyz\"",
            "\"abcdefghijklm\\\"nopqrstuvwxyz\"",
            "\"ééééééééé\"",
            "\"0123456789abcdef\\u00e9x\"",
            // Not valid:
            "\"\\x\"",
            "\"\\u12g4\"",
            "\"\\u12\"",
            "\"tab\there\"",
            "\"abcdefghijklm\there\"",
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
            // Valid rows are compact (no whitespace) half the time.
            let space = match (valid, self.next(2)) {
                (true, 0) => &Self::SPACE[..1],
                (true, _) => &Self::SPACE[..5],
                (false, _) => Self::SPACE,
            };
            let mut item = String::from(if !valid && self.next(20) == 0 {
                " {"
            } else {
                "{"
            });
            let fields = if valid { 3 } else { self.next(5) };
            let rotate = if valid && self.next(4) == 0 { 1 } else { 0 };
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

    /// The fast reader of flat objects only ever accepts what serde_json accepts, with the same
    /// keys and value texts.
    #[test]
    fn flat_object_scan_agrees_with_serde_json() {
        let mut rows = RandomRows(0x9e37_79b9_7f4a_7c15);
        let mut fast = 0;
        for n in 0..200_000 {
            let item = rows.row(n % 4 == 0);
            let mut fields = Vec::new();
            let slow: Result<RawRow, _> = serde_json::from_str(&item);
            if scan_flat_object(&item, &mut fields) {
                fast += 1;
                let slow =
                    slow.unwrap_or_else(|e| panic!("{item:?}: accepted, serde_json refuses: {e}"));
                assert_eq!(fields, slow.fields, "{item:?}");
            }
        }
        // Not vacuous: a good share of the rows took the fast path.
        assert!(
            fast > 40_000,
            "only {fast} of 200000 rows took the fast path"
        );
    }

    /// NDJSON read with the flat scan gives what it gives without (every line split at `\n`
    /// and read by serde_json): the same bytes and columns, or the same error.
    #[test]
    fn ndjson_reads_the_same_with_and_without_the_flat_scan() {
        let mut rows = RandomRows(0x2545_f491_4f6c_dd1d);
        const ENDS: &[&str] = &[
            "\n", "\n", "\n", "\r\n", "\r\r\n", " \n", "\n\n", "\n \t\n", "", "\r",
        ];
        let columns = cols(&["a", "b", "é"]);
        let (mut ok, mut texts) = (0, 0);
        for n in 0..30_000 {
            let valid = n % 2 == 0;
            let mut text = String::new();
            for _ in 0..1 + rows.next(4) {
                text.push_str(&rows.row(valid));
                text.push_str(rows.pick(ENDS));
            }
            let configured = (n % 3 == 0).then_some(columns.as_slice());
            let read = |scan| {
                encode_json_with(text.as_bytes(), configured, scan)
                    .map(|e| (e.columns.clone(), e.rows(0, e.len())))
                    .map_err(|e| e.message)
            };
            let (with, without) = (read(true), read(false));
            assert_eq!(with, without, "{text:?}");
            texts += 1;
            ok += usize::from(with.is_ok());
        }
        assert!(ok > 2_000, "only {ok} of {texts} texts were accepted");
    }

    #[test]
    fn json_rules() {
        assert!(err_json("", None).contains("at least one row"));
        assert!(err_json("\n \n", None).contains("at least one row"));
        assert!(err_json("[]", None).contains("at least one row"));
        assert!(err_json("[1]", None).contains("row index 0 is not a JSON object"));
        assert!(err_json("{\"a\":1}\n[1,2]", None).contains("row index 1 is not a JSON object"));
        assert!(err_json("{\"a\":1}\n\"s\"", None).contains("row index 1 is not a JSON object"));
        assert!(err_json("{}", None).contains("row index 0 is empty"));
        assert!(err_json("{\"a\":1}\n{\"a\":", None).contains("row index 1 is not valid JSON"));
        assert!(err_json("{\"a\":1,\"a\":2}", None).contains("appears twice"));
        assert_eq!(
            err_json("{\"a\":1,\"b\":2}\n{\"a\":1}", None),
            "row index 1: missing 'b' (every row must have the same keys as the first row)"
        );
        assert_eq!(
            err_json("{\"a\":1,\"x\":2}", Some(&["a", "b"])),
            "row index 0: missing 'b'; extra 'x' (every row must have exactly the configured columns)"
        );
        assert!(err_json("[{\"a\":1}", None).contains("not valid JSON"));
        let e = encode_json(&[b'{', 0xff, b'}'], None).unwrap_err();
        assert!(e.message.contains("not UTF-8"));
        // With configured columns an empty object is a missing-keys error, not "empty first row".
        assert!(err_json("{}", Some(&["a"])).contains("missing 'a'"));
    }
}
