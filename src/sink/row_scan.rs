//! The fast path of the JSON row reader: one pass over a flat object (`{"key": scalar, ...}`),
//! without allocating, for the rows a pipeline sends most (NDJSON lines of strings, numbers,
//! booleans and nulls).
//!
//! It only ever *accepts*: when it returns the fields, serde_json (the reader's slow path)
//! would have accepted the same text and read the same keys and value texts. Anything it does
//! not decide on its own (an escaped key, a nested value, leading whitespace, a newline, any
//! syntax error) is left to serde_json, which reads it and words its error. So the rules stay
//! serde_json's, byte for byte: whitespace is space, tab and `\r`; numbers are
//! `-? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)?`, kept as their exact text; string
//! values may hold any escape serde_json accepts (`\" \\ \/ \b \f \n \r \t \uXXXX`, a lone
//! surrogate included: serde_json does not check them in a value it only keeps as text) and
//! no control character.

use std::borrow::Cow;

/// A row's field: the key (unescaped) and the value's exact JSON text.
pub(super) type Field<'a> = (Cow<'a, str>, &'a str);

/// Reads `item` as a flat JSON object into `fields` (cleared first). Returns `false`, with
/// `fields` in no particular state, when the slow path must decide.
pub(super) fn scan_flat_object<'a>(item: &'a str, fields: &mut Vec<Field<'a>>) -> bool {
    scan_flat_object_at(item, 0, fields) == Some(item.len())
}

/// Reads the flat JSON object that starts at byte `start` of `text` (with its `{`) into
/// `fields` (cleared first); returns the index just past its `}`, whatever follows it. `None`,
/// with `fields` in no particular state, when the slow path must decide.
pub(super) fn scan_flat_object_at<'a>(
    text: &'a str,
    start: usize,
    fields: &mut Vec<Field<'a>>,
) -> Option<usize> {
    fields.clear();
    let b = text.as_bytes();
    if b.get(start) != Some(&b'{') {
        return None;
    }
    let mut i = skip_ws(b, start + 1);
    if b.get(i) == Some(&b'}') {
        // `{}` (or `{ }`): no fields.
        return Some(i + 1);
    }
    loop {
        // The key: a string without escapes (an escaped key is unescaped by the slow path).
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let key_start = i + 1;
        let key_end = plain_string_end(b, key_start)?;
        i = skip_ws(b, key_end + 1);
        if b.get(i) != Some(&b':') {
            return None;
        }
        let value_start = skip_ws(b, i + 1);
        let value_end = scalar_end(b, value_start)?;
        // Both ends are ASCII delimiters, so both slices fall on char boundaries.
        fields.push((
            Cow::Borrowed(&text[key_start..key_end]),
            &text[value_start..value_end],
        ));
        i = skip_ws(b, value_end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return Some(i + 1),
            _ => return None,
        }
    }
}

/// The keys of a table's columns as a compact row writes them (`"name":`), for
/// [`scan_in_order`]; `None` when a name holds a quote, a backslash or a control character
/// (a row writes it escaped, so only the general reader compares it).
pub(super) fn key_patterns(columns: &[String]) -> Option<Vec<Vec<u8>>> {
    columns
        .iter()
        .map(|c| {
            let plain = c.bytes().all(|b| !matches!(b, b'"' | b'\\' | 0..=0x1f));
            plain.then(|| [b"\"", c.as_bytes(), b"\":"].concat())
        })
        .collect()
}

/// Reads, at byte `start` of `b`, a compact flat row whose keys are exactly `keys` (from
/// [`key_patterns`]) in order, each value a scalar as [`scan_flat_object_at`] reads it, and no
/// whitespace anywhere: `{"a":1,"b":"x"}`. Returns the index just past its `}`; `None` for
/// anything else (the general reader decides). `values` gets each value's range, in column
/// order.
pub(super) fn scan_in_order(
    b: &[u8],
    start: usize,
    keys: &[Vec<u8>],
    values: &mut Vec<(usize, usize)>,
) -> Option<usize> {
    values.clear();
    let mut i = start;
    for (n, key) in keys.iter().enumerate() {
        if b.get(i) != Some(if n == 0 { &b'{' } else { &b',' }) {
            return None;
        }
        i += 1;
        // An inline compare: a call to the guest's memcmp per key costs more.
        let text = b.get(i..i + key.len())?;
        if !text.iter().zip(key).all(|(x, y)| x == y) {
            return None;
        }
        i += key.len();
        let value = i;
        i = scalar_end(b, i)?;
        values.push((value, i));
    }
    (!keys.is_empty() && b.get(i) == Some(&b'}')).then_some(i + 1)
}

/// JSON whitespace, as serde_json skips it, except the newline: in NDJSON a newline ends the
/// row, so a row that holds one is left to the slow path.
fn is_ws(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r')
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).copied().is_some_and(is_ws) {
        i += 1;
    }
    i
}

/// The index of the closing quote of a string starting at `i` (after its opening quote) that
/// holds no escape and no control character; `None` otherwise.
fn plain_string_end(b: &[u8], mut i: usize) -> Option<usize> {
    loop {
        match *b.get(i)? {
            b'"' => return Some(i),
            b'\\' | 0..=0x1f => return None,
            _ => i += 1,
        }
    }
}

/// The end (exclusive) of the scalar value starting at `i`: a string (escapes checked as
/// serde_json checks them), a number, `true`, `false` or `null`. `None` for anything else
/// (a nested value, or text serde_json refuses).
fn scalar_end(b: &[u8], mut i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => {
            i += 1;
            loop {
                i = skip_plain_bytes(b, i);
                match *b.get(i)? {
                    b'"' => return Some(i + 1),
                    b'\\' => match *b.get(i + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                        b'u' => {
                            let hex = b.get(i + 2..i + 6)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return None;
                            }
                            i += 6;
                        }
                        _ => return None,
                    },
                    0..=0x1f => return None,
                    _ => i += 1,
                }
            }
        }
        b'-' | b'0'..=b'9' => number_end(b, i),
        b't' => literal_end(b, i, b"true"),
        b'f' => literal_end(b, i, b"false"),
        b'n' => literal_end(b, i, b"null"),
        _ => None,
    }
}

/// Skips, eight bytes at a time, the bytes of a string that need no look (anything but `"`,
/// `\\` and control characters); returns the index of the first that may (or near the end).
fn skip_plain_bytes(b: &[u8], mut i: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // Whether a byte of `w` is zero / below 0x20: exact for "any byte" (SWAR, no false
    // negatives; a word it flags is looked at byte by byte).
    let has_zero = |w: u64| w.wrapping_sub(ONES) & !w & HIGH != 0;
    while let Some(chunk) = b.get(i..i + 8) {
        let w = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        if has_zero(w ^ (ONES * b'"' as u64))
            || has_zero(w ^ (ONES * b'\\' as u64))
            || w.wrapping_sub(ONES * 0x20) & !w & HIGH != 0
        {
            break;
        }
        i += 8;
    }
    i
}

fn literal_end(b: &[u8], i: usize, literal: &[u8]) -> Option<usize> {
    (b.get(i..i + literal.len())? == literal).then_some(i + literal.len())
}

/// `-? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)?`; `None` where serde_json refuses the
/// text (a leading zero followed by a digit, a bare `-`, `1.`, `1e`).
fn number_end(b: &[u8], mut i: usize) -> Option<usize> {
    let digits = |b: &[u8], mut i: usize| -> Option<usize> {
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        (i > start).then_some(i)
    };
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    i = match *b.get(i)? {
        b'0' if b.get(i + 1).is_some_and(u8::is_ascii_digit) => return None,
        b'0' => i + 1,
        b'1'..=b'9' => digits(b, i)?,
        _ => return None,
    };
    if b.get(i) == Some(&b'.') {
        i = digits(b, i + 1)?;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        i = digits(b, i)?;
    }
    Some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(item: &str) -> Option<Vec<(String, String)>> {
        let mut fields = Vec::new();
        scan_flat_object(item, &mut fields).then(|| {
            fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
    }

    fn kv(pairs: &[(&str, &str)]) -> Option<Vec<(String, String)>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn reads_flat_objects() {
        assert_eq!(scan("{}"), kv(&[]));
        assert_eq!(scan("{ \t}"), kv(&[]));
        assert_eq!(
            scan(r#"{"a":1,"b" : "x\"\u00e9\/" ,"c":-0.5e+10,"d":true,"é":null,"f":false}"#),
            kv(&[
                ("a", "1"),
                ("b", r#""x\"\u00e9\/""#),
                ("c", "-0.5e+10"),
                ("d", "true"),
                ("é", "null"),
                ("f", "false"),
            ])
        );
        // A lone surrogate in a value: serde_json keeps it as text, and so does the scan.
        assert_eq!(scan(r#"{"a":"\ud800"}"#), kv(&[("a", r#""\ud800""#)]));
        assert_eq!(
            scan("{\"n\":123456789012345678901234567890.000000000000000000001}"),
            kv(&[("n", "123456789012345678901234567890.000000000000000000001")])
        );
    }

    #[test]
    fn word_skip_stops_at_every_byte_that_needs_a_look() {
        for len in 0..40 {
            for at in 0..len {
                for special in [b'"', b'\\', 0x00, 0x1f, b'\n'] {
                    let mut b = vec![b'a'; len];
                    b[at] = special;
                    assert!(skip_plain_bytes(&b, 0) <= at, "{len} {at} {special}");
                }
                // Bytes that need no look (space, DEL, UTF-8) are skipped a word at a time.
                let mut b = vec![0xc3; len];
                b[at] = if at % 2 == 0 { b' ' } else { 0x7f };
                assert!(skip_plain_bytes(&b, 0) + 8 > len, "{len} {at}");
            }
        }
    }

    #[test]
    fn reads_compact_rows_in_column_order() {
        let keys = key_patterns(&["a".into(), "é b".into()]).unwrap();
        let row = |text: &str| scan_in_order(text.as_bytes(), 0, &keys, &mut Vec::new());
        assert_eq!(row(r#"{"a":1,"é b":"x"}"#), Some(18));
        assert_eq!(row(r#"{"a":null,"é b":"x"}rest"#), Some(21));
        assert_eq!(row(r#"{"a":nul,"é b":"x"}"#), None);
        for other in [
            r#"{"é b":"x","a":1}"#,
            r#"{"a":1}"#,
            r#"{"a":1,"é b":"x","c":2}"#,
            r#"{"a": 1,"é b":"x"}"#,
            r#"{"a":1,"é b":{}}"#,
            r#"{"a":01,"é b":"x"}"#,
            r#"{"ab":1,"é b":"x"}"#,
            r#"{"a":1,"é b":"x""#,
        ] {
            assert_eq!(row(other), None, "{other}");
        }
        assert_eq!(key_patterns(&["a".into(), "b\"c".into()]), None);
        assert_eq!(key_patterns(&["tab\there".into()]), None);
    }

    #[test]
    fn leaves_everything_else_to_the_slow_path() {
        for item in [
            " {\"a\":1}",
            "{\"a\":1} ",
            "{\"a\":{}}",
            "{\"a\":[1]}",
            "{\"\\u0061\":1}",
            "{\"a\":01}",
            "{\"a\":-}",
            "{\"a\":1.}",
            "{\"a\":1e}",
            "{\"a\":.5}",
            "{\"a\":+1}",
            "{\"a\":tru}",
            "{\"a\":truex}",
            "{\"a\":NaN}",
            "{\"a\":\"\\x\"}",
            "{\"a\":\"\\u12g4\"}",
            "{\"a\":\"tab\there\"}",
            "{\"a\":1,}",
            "{,\"a\":1}",
            "{\"a\" 1}",
            "{\"a\":1 \"b\":2}",
            "{\"a\":1}}",
            "{\"a\":\"}",
            "{\"a\":1,\"b\"}",
            "{a:1}",
            "{",
            "}",
            "[]",
        ] {
            assert_eq!(scan(item), None, "{item}");
        }
    }
}
