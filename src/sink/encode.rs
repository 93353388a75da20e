//! A send's rows, found in its input: NDJSON lines, the elements of one JSON array, or typed
//! rows written as JSON lines; and the columns they fill (configured, else the first row's
//! keys). Nothing here reads a value: every row is read once, straight into its columns, by
//! [`super::native::Block::push_row`], which also checks the row's keys. The rows are kept
//! as ranges of the input, so JSON input keeps each value's exact text (large integers and
//! float text are never re-encoded).

use std::borrow::Cow;
#[cfg(any(test, feature = "command"))]
use std::io::BufRead;
use std::io::Write;

use crate::client::Error;

use super::json::{json_value, object_keys_until, Refusal};

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

/// What a send's rows came as, which decides how a message names a row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Source {
    /// NDJSON: a row is named by its line (from 1, blank lines counted).
    #[default]
    Lines,
    /// A JSON array: by its element's place (from 1).
    Elements,
    /// Typed rows: by its place in the call (from 1).
    Rows,
    /// Packed rows ([`super::packed`]): by their place, as typed rows.
    #[cfg(feature = "speed")]
    Packed,
}

/// A send's rows: each row's JSON text, as a range of the input (or of the typed rows'
/// own JSON lines), and the columns.
#[derive(Debug, Default)]
pub struct Encoded<'a> {
    /// The columns: the configured ones, else the first row's keys.
    pub columns: Vec<String>,
    /// Whether the columns are configured (else the first row's keys named them).
    pub configured: bool,
    input: Cow<'a, [u8]>,
    spans: Vec<(usize, usize)>,
    source: Source,
    /// Packed rows' keys, which their rows name by index (with `speed`: the library component
    /// leaves packed rows out).
    #[cfg(feature = "speed")]
    keys: Vec<Vec<u8>>,
}

// A count of rows found, never asked whether it is zero (an empty input is refused earlier).
#[allow(clippy::len_without_is_empty)]
impl Encoded<'_> {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Row `n`'s JSON text.
    pub fn line(&self, n: usize) -> &[u8] {
        let (a, b) = self.spans[n];
        &self.input[a..b]
    }

    /// How a message names row `n`: `line 7` (NDJSON, counted in the input given), `element
    /// 3` (a JSON array) or `row 2` (typed rows).
    pub fn name(&self, n: usize) -> String {
        match self.source {
            Source::Lines => format!("line {}", line_number(&self.input, self.spans[n].0)),
            Source::Elements => format!("element {}", n + 1),
            Source::Rows => format!("row {}", n + 1),
            #[cfg(feature = "speed")]
            Source::Packed => format!("row {}", n + 1),
        }
    }

    /// Refuses packed row `n` whose JSON line (its table sent as JSONEachRow) is over the
    /// limit a JSON row has; `scratch` holds the line.
    #[cfg(feature = "speed")]
    pub fn check_json_row(&self, n: usize, scratch: &mut Vec<u8>) -> Result<(), Error> {
        scratch.clear();
        super::packed::write_json_row(scratch, self.line(n), &self.keys);
        check_row_size(scratch.len(), || {
            format!("{} (as the JSON its table is sent as)", self.name(n))
        })
    }

    /// Packed rows' keys (their rows name them by index); `None`: JSON rows.
    #[cfg(feature = "speed")]
    pub fn packed_keys(&self) -> Option<&[Vec<u8>]> {
        (self.source == Source::Packed).then_some(&self.keys[..])
    }

    /// The bytes of rows `start..end` as JSONEachRow, each row on one line, in one new buffer
    /// (an array element's line breaks, which JSON allows only between tokens, become spaces).
    pub fn rows(&self, start: usize, end: usize) -> Vec<u8> {
        let size: usize = self.spans[start..end].iter().map(|(a, b)| b - a + 1).sum();
        let mut out = Vec::with_capacity(size);
        for n in start..end {
            let from = out.len();
            #[cfg(feature = "speed")]
            if self.source == Source::Packed {
                super::packed::write_json_row(&mut out, self.line(n), &self.keys);
                out.push(b'\n');
                continue;
            }
            out.extend_from_slice(self.line(n));
            if self.source == Source::Elements {
                for b in &mut out[from..] {
                    if matches!(*b, b'\n' | b'\r') {
                        *b = b' ';
                    }
                }
            }
            out.push(b'\n');
        }
        out
    }

    /// Takes the columns: the configured ones, else row 0's keys (which must be a non-empty
    /// set).
    fn columns_from(&mut self, columns: Option<&[String]>) -> Result<(), Error> {
        if self.spans.is_empty() {
            return Err(Error::invalid("send needs at least one row"));
        }
        if let Some(c) = columns {
            self.columns = c.to_vec();
            self.configured = true;
            return Ok(());
        }
        let name = self.name(0);
        #[cfg(feature = "speed")]
        let first = if self.source == Source::Packed {
            super::packed::row_keys(self.line(0), &self.keys)
        } else {
            object_keys_until(self.line(0))
        };
        #[cfg(not(feature = "speed"))]
        let first = object_keys_until(self.line(0));
        let keys = match first {
            (keys, None) => keys,
            // A value that is not JSON: the row's reader names its column.
            (keys, Some(_)) if !keys.is_empty() => keys,
            (_, Some(refusal)) => return Err(row_refusal(&name, refusal)),
        };
        if keys.is_empty() {
            return Err(Error::invalid(format!(
                "{name} is empty: without configured columns the first row's keys name the columns"
            )));
        }
        for (n, key) in keys.iter().enumerate() {
            // Packed rows' keys are distinct names up to the first one named twice, their
            // last ([`super::packed::row_keys`]): only it is looked for (in linear time).
            #[cfg(feature = "speed")]
            if self.source == Source::Packed && n + 1 < keys.len() {
                continue;
            }
            if keys[..n].contains(key) {
                return Err(Error::invalid(format!(
                    "{name}: key {} appears twice",
                    shown(&String::from_utf8_lossy(key))
                )));
            }
        }
        self.columns = keys
            .into_iter()
            .map(|k| String::from_utf8_lossy(&k).into_owned())
            .collect();
        Ok(())
    }
}

/// The line number (from 1) of byte `at` of `input`.
fn line_number(input: &[u8], at: usize) -> usize {
    memchr::memchr_iter(b'\n', &input[..at]).count() + 1
}

/// `invalid-input` for a row that is not one JSON object, named `name`.
pub fn row_refusal(name: &str, refusal: Refusal) -> Error {
    #[cfg(feature = "speed")]
    if refusal.reason.starts_with("packed rows") {
        return Error::invalid(format!("{name}: {}", refusal.reason));
    }
    if refusal.reason == "not a JSON object" {
        Error::invalid(format!("{name} is not a JSON object"))
    } else if refusal.reason.starts_with("nested ") {
        Error::invalid(format!("{name} is {}", refusal.reason))
    } else {
        Error::invalid(format!(
            "{name} is not valid JSON: {} at `{}`",
            refusal.reason, refusal.value
        ))
    }
}

/// A name (a key or column) as a message shows it: quoted, at most 64 characters, escaped.
pub fn shown(name: &str) -> String {
    let s: String = name.chars().take(64).collect();
    format!("'{}'", crate::text::escaped(&s))
}

#[cfg(feature = "speed")]
/// Finds the rows of packed input ([`super::packed`]): its keys, checked, and every row by
/// the length before it; each row is read (its layout, key indexes and text checked) later,
/// into its columns, before anything is sent.
pub fn encode_packed<'a>(data: &'a [u8], columns: Option<&[String]>) -> Result<Encoded<'a>, Error> {
    let (keys, spans) = super::packed::find_rows(data, &|n, bytes| {
        check_row_size(bytes, || format!("row {n}"))
    })?;
    let mut out = Encoded {
        input: Cow::Borrowed(data),
        spans,
        source: Source::Packed,
        keys,
        ..Default::default()
    };
    out.columns_from(columns)?;
    Ok(out)
}

/// Writes typed rows as JSON lines (each row's keys in its own order: the reader takes keys
/// in any order), for the reader as any other rows.
pub fn encode_rows(rows: &[Row], columns: Option<&[String]>) -> Result<Encoded<'static>, Error> {
    let mut buf = Vec::new();
    let mut spans = Vec::with_capacity(rows.len());
    for (index, row) in rows.iter().enumerate() {
        let start = buf.len();
        buf.push(b'{');
        for (n, (key, value)) in row.iter().enumerate() {
            if n > 0 {
                buf.push(b',');
            }
            write_json_string(&mut buf, key.as_bytes());
            buf.push(b':');
            write_value(&mut buf, value).map_err(|why| {
                Error::invalid(format!("row {}, column {}: {why}", index + 1, shown(key)))
            })?;
        }
        buf.push(b'}');
        spans.push((start, buf.len()));
    }
    let mut out = Encoded {
        input: Cow::Owned(buf),
        spans,
        source: Source::Rows,
        ..Default::default()
    };
    out.columns_from(columns)?;
    Ok(out)
}

/// Writes one typed value as the JSON the INSERT carries (the typed-row path, and hosts that
/// turn typed rows into JSONEachRow themselves, as the Python binding does); an error says why
/// the value cannot be sent.
pub fn write_value(buf: &mut Vec<u8>, value: &Value) -> Result<(), String> {
    match value {
        Value::Null => buf.extend_from_slice(b"null"),
        Value::Bool(b) => buf.extend_from_slice(if *b { b"true" } else { b"false" }),
        // Writing into a Vec cannot fail (and `expect` would link io::Error's `Debug`).
        Value::Int(i) => drop(write!(buf, "{i}")),
        Value::Uint(u) => drop(write!(buf, "{u}")),
        // serde_json's shortest form (zmij): core's float formatting would add ~20 KB to the
        // library component.
        Value::Float(f) if f.is_finite() => {
            drop(serde_json::to_writer(&mut *buf, f));
        }
        Value::Float(_) => return Err("NaN and infinity cannot be sent as JSON".into()),
        Value::Text(s) => write_json_string(buf, s.as_bytes()),
        Value::Json(text) => {
            let value = json_value(text.as_bytes()).map_err(|r| {
                format!(
                    "the json value is not valid JSON: {} at `{}`",
                    r.reason, r.value
                )
            })?;
            buf.extend_from_slice(value);
        }
        Value::Bytes(bytes) => write_json_string(buf, bytes),
    }
    Ok(())
}

/// [`super::json::write_json_string`], where the JSON reader and writer live.
pub use super::json::write_json_string;

/// Most bytes one row may have (its JSON text): a row over it is refused before anything is
/// sent. Far above any row onestep-clickhouse sends in practice; it bounds the memory one row
/// takes in the CLI, which reads rows one line at a time.
pub const MAX_ROW_BYTES: usize = 64 << 20;

/// Refuses row `name` of `bytes` over [`MAX_ROW_BYTES`].
fn check_row_size(bytes: usize, name: impl FnOnce() -> String) -> Result<(), Error> {
    if bytes > MAX_ROW_BYTES {
        return Err(Error::invalid(format!(
            "{} is over {} MiB, the most one row may be",
            name(),
            MAX_ROW_BYTES >> 20
        )));
    }
    Ok(())
}

/// Finds the rows of JSON input: NDJSON (one object per line; blank lines skipped) or one
/// JSON array of objects. Each row is read (and its keys checked) later, into its columns.
pub fn encode_json<'a>(data: &'a [u8], columns: Option<&[String]>) -> Result<Encoded<'a>, Error> {
    check_utf8(data)?;
    let from = if data.starts_with(BOM) { BOM.len() } else { 0 };
    let mut out = Encoded {
        input: Cow::Borrowed(data),
        spans: Vec::with_capacity(data.len() / 64 + 1),
        ..Default::default()
    };
    let first = data[from..].iter().position(|b| !b.is_ascii_whitespace());
    if let Some(open) = first.filter(|&n| data[from + n] == b'[') {
        out.source = Source::Elements;
        let elements = super::json::array_elements(&data[from + open..]).map_err(|r| {
            Error::invalid(format!(
                "the JSON array is not valid JSON: {} at `{}`",
                r.reason, r.value
            ))
        })?;
        let base = from + open;
        for (n, (a, b)) in elements.into_iter().enumerate() {
            check_row_size(b - a, || format!("element {}", n + 1))?;
            out.spans.push((base + a, base + b));
        }
    } else {
        let mut pos = from;
        while pos < data.len() {
            let end = memchr::memchr(b'\n', &data[pos..]).map_or(data.len(), |n| pos + n);
            let mut line = &data[pos..end];
            while let [rest @ .., b' ' | b'\t' | b'\r'] = line {
                line = rest;
            }
            if line.iter().any(|b| !b.is_ascii_whitespace()) {
                check_row_size(line.len(), || format!("line {}", line_number(data, pos)))?;
                out.spans.push((pos, pos + line.len()));
            }
            pos = end + 1;
        }
    }
    out.columns_from(columns)?;
    Ok(out)
}

/// A byte order mark, which JSON input may start with (and which is not part of its first row).
pub const BOM: &[u8] = "\u{feff}".as_bytes();

/// Whether `data` is UTF-8, as `std::str::from_utf8` decides, from the first byte that is not
/// ASCII on: std's check reads four bytes a step on wasm32 (its word), this scan 32 (the input
/// is mostly ASCII; 6% of the CLI's first pass went to std's).
fn check_utf8(data: &[u8]) -> Result<(), Error> {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
    let mut ascii = 0;
    for chunk in data.chunks_exact(32) {
        let any =
            word(&chunk[..8]) | word(&chunk[8..16]) | word(&chunk[16..24]) | word(&chunk[24..]);
        if any & HIGH != 0 {
            break;
        }
        ascii += 32;
    }
    std::str::from_utf8(&data[ascii..]).map_err(|e| {
        Error::invalid(format!(
            "the JSON input is not UTF-8 (at byte {})",
            ascii + e.valid_up_to()
        ))
    })?;
    Ok(())
}

/// The rows of NDJSON whose lines were found as it was read ([`read_line`]): `rows` holds each
/// non-blank line's span in `data`, its line end and trailing spaces left out. The same rows
/// as [`encode_json`] finds in `data`, without looking for them again.
#[cfg(any(test, feature = "command"))]
pub fn encode_lines<'a>(
    data: &'a [u8],
    rows: &[(usize, usize)],
    columns: Option<&[String]>,
) -> Result<Encoded<'a>, Error> {
    check_utf8(data)?;
    for &(a, b) in rows {
        check_row_size(b - a, || format!("line {}", line_number(data, a)))?;
    }
    let mut spans = rows.to_vec();
    if data.starts_with(BOM) {
        if let Some(first) = spans.first_mut().filter(|(a, _)| *a == 0) {
            first.0 = BOM.len();
            if data[first.0..first.1].iter().all(u8::is_ascii_whitespace) {
                spans.remove(0);
            }
        }
    }
    let mut out = Encoded {
        input: Cow::Borrowed(data),
        spans,
        ..Default::default()
    };
    out.columns_from(columns)?;
    Ok(out)
}

/// The span of the line `buf[start..]` (as [`read_line`] left it) that [`encode_json`] takes as
/// a row: without its line end and trailing spaces; `None` for a blank line.
#[cfg(any(test, feature = "command"))]
pub fn row_span(buf: &[u8], start: usize) -> Option<(usize, usize)> {
    let mut line = &buf[start..];
    if let [rest @ .., b'\n'] = line {
        line = rest;
    }
    while let [rest @ .., b' ' | b'\t' | b'\r'] = line {
        line = rest;
    }
    (!line.iter().all(u8::is_ascii_whitespace)).then_some((start, start + line.len()))
}

/// Reads one line onto `buf` (through its `\n`, or to the end of the input) as `read_until`
/// does, but refuses a line over [`MAX_ROW_BYTES`] (plus its line end) having read no more of
/// it than that: whatever the input, a line takes bounded memory. Returns the bytes read.
#[cfg(any(test, feature = "command"))]
pub fn read_line(
    reader: &mut impl BufRead,
    buf: &mut Vec<u8>,
    line_no: u64,
) -> Result<usize, Error> {
    let start = buf.len();
    loop {
        let available = reader
            .fill_buf()
            .map_err(|e| Error::invalid(format!("reading the input: {e}")))?;
        if available.is_empty() {
            return Ok(buf.len() - start);
        }
        let (take, ends) = match memchr::memchr(b'\n', available) {
            Some(at) => (at + 1, true),
            None => (available.len(), false),
        };
        if buf.len() - start + take > MAX_ROW_BYTES + 2 {
            return Err(Error::invalid(format!(
                "line {line_no} is over {} MiB, the most one row may be (nothing of its batch was sent)",
                MAX_ROW_BYTES >> 20
            )));
        }
        buf.extend_from_slice(&available[..take]);
        reader.consume(take);
        if ends {
            return Ok(buf.len() - start);
        }
    }
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
    fn rows_over_the_size_limit_are_refused_by_their_line_or_element() {
        let big = format!("{{\"s\":\"{}\"}}", "x".repeat(MAX_ROW_BYTES));
        let input = format!("{{\"s\":\"a\"}}\n\n{big}\n");
        let message = err_json(&input, None);
        assert!(message.starts_with("line 3 is over 64 MiB"), "{message}");
        // The same, its rows found as the CLI reads its lines.
        let rows = [(0, 9), (11, 11 + big.len())];
        let e = encode_lines(input.as_bytes(), &rows, None).unwrap_err();
        assert!(
            e.message.starts_with("line 3 is over 64 MiB"),
            "{}",
            e.message
        );
        let message = err_json(&format!("[{big}]"), None);
        assert!(message.starts_with("element 1 is over 64 MiB"), "{message}");
        // Just under: found (read later).
        let fits = format!("{{\"s\":\"{}\"}}", "x".repeat(MAX_ROW_BYTES - 8));
        assert_eq!(encode_json(fits.as_bytes(), None).unwrap().len(), 1);
    }

    #[test]
    fn typed_rows_as_json_lines_in_their_own_order() {
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
            "{\"b\":-9223372036854775808,\"a\":18446744073709551615,\"c\":\"tab\\t\\\"q\\\" é\"}\n{\"c\":null,\"a\":0.1,\"b\":{\"x\": [1, 2.50]}}\n"
        );
        assert!(e.configured);
        assert_eq!(e.name(1), "row 2");
        // Without configured columns the first row's order is the column order.
        let e = encode_rows(&rows, None).unwrap();
        assert_eq!(e.columns, cols(&["b", "a", "c"]));
        assert!(!e.configured);
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
            b"{\"b\":\"\xff\\u0000\\\"a\\u001f\",\"t\":true,\"f\":1e+300}\n"
        );
        let nan: Vec<Row> = vec![vec![("f".into(), Value::Float(f64::NAN))]];
        let msg = encode_rows(&nan, None).unwrap_err().message;
        assert!(msg.contains("row 1, column 'f': NaN"), "{msg}");
        for bad in ["{", "", "1 2", "[1,]", "\"\\x\""] {
            let rows: Vec<Row> = vec![vec![("j".into(), Value::Json(bad.into()))]];
            let msg = encode_rows(&rows, None).unwrap_err().message;
            assert!(
                msg.contains("the json value is not valid JSON"),
                "{bad}: {msg}"
            );
        }
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
            .starts_with("row 1 is empty"));
        // An empty row with configured columns is found here and refused when read.
        assert!(encode_rows(&empty, Some(&cols(&["a"]))).is_ok());
        let dup: Vec<Row> = vec![vec![
            ("a".into(), Value::Int(1)),
            ("a".into(), Value::Int(2)),
        ]];
        assert_eq!(
            encode_rows(&dup, None).unwrap_err().message,
            "row 1: key 'a' appears twice"
        );
    }

    #[test]
    fn json_lines_keep_their_exact_text_and_are_named_by_line() {
        let input = "\u{feff}{\"id\":1,\"big\":123456789012345678901234567890,\"f\":1.10000000000000000000001}\n\n{\"big\":2,\"id\":3e2,\"f\":-0.0} \r\n";
        let e = encode_json(input.as_bytes(), None).unwrap();
        assert_eq!(e.columns, cols(&["id", "big", "f"]));
        assert_eq!(
            text(&e),
            "{\"id\":1,\"big\":123456789012345678901234567890,\"f\":1.10000000000000000000001}\n{\"big\":2,\"id\":3e2,\"f\":-0.0}\n"
        );
        assert_eq!(e.len(), 2);
        assert_eq!(
            (e.name(0).as_str(), e.name(1).as_str()),
            ("line 1", "line 3")
        );
        assert_eq!(e.line(1), b"{\"big\":2,\"id\":3e2,\"f\":-0.0}");
    }

    #[test]
    fn json_arrays_go_one_row_a_line() {
        let input = "[\n {\"a\": 1,\n  \"b\": \"x\"},\n {\"b\": \"y\", \"\\u0061\": 2}\n]";
        let e = encode_json(input.as_bytes(), Some(&cols(&["a", "b"]))).unwrap();
        assert_eq!(
            text(&e),
            "{\"a\": 1,   \"b\": \"x\"}\n{\"b\": \"y\", \"\\u0061\": 2}\n"
        );
        assert_eq!(e.name(1), "element 2");
    }

    #[test]
    fn json_rules() {
        assert!(err_json("", None).contains("at least one row"));
        assert!(err_json("\n \n", None).contains("at least one row"));
        assert!(err_json("[]", None).contains("at least one row"));
        assert_eq!(err_json("[1]", None), "element 1 is not a JSON object");
        assert_eq!(err_json("\n\"s\"", None), "line 2 is not a JSON object");
        assert!(err_json("{}", None).starts_with("line 1 is empty"));
        assert_eq!(
            err_json("{\"a\":1,\"a\":2}", None),
            "line 1: key 'a' appears twice"
        );
        assert!(err_json("{\"a\" 1}", None).starts_with("line 1 is not valid JSON"));
        // A first row whose value is not JSON names its keys so far: the row's reader then
        // names the column (sink::columns' tests).
        assert_eq!(encode_json(b"{\"a\":", None).unwrap().columns, ["a"]);
        assert!(err_json("[{\"a\":1}", None).starts_with("the JSON array is not valid JSON"));
        assert!(err_json("[{\"a\":1}] x", None).starts_with("the JSON array is not valid JSON"));
        let e = encode_json(&[b'{', 0xff, b'}'], None).unwrap_err();
        assert!(e.message.contains("not UTF-8"));
    }

    #[test]
    fn utf8_is_checked_as_std_checks_it_wherever_the_first_other_byte_is() {
        // ASCII for several of the fast scan's 32-byte steps, then not.
        let text = "{\"a\":\"plain\"}\n".repeat(9) + &"{\"a\":\"é😀\"}\n".repeat(4);
        for at in 0..text.len() + 1 {
            for bad in [&[0xff][..], &[0xc3], &[0xe2, 0x82], &[0xed, 0xa0, 0x80]] {
                let mut data = text.as_bytes().to_vec();
                data.splice(at..at, bad.iter().copied());
                let want = std::str::from_utf8(&data).map_err(|e| e.valid_up_to());
                let got = check_utf8(&data).map_err(|e| e.message);
                match want {
                    Ok(_) => assert!(got.is_ok(), "{at} {bad:?}"),
                    Err(n) => assert_eq!(
                        got.unwrap_err(),
                        format!("the JSON input is not UTF-8 (at byte {n})")
                    ),
                }
            }
        }
        assert!(check_utf8(text.as_bytes()).is_ok());
    }
}
