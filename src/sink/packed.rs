//! Packed rows: the rows of a send in a compact binary form that a binding writes straight
//! from its own values (the Python binding from Python objects) and the sink reads straight
//! into its columns ([`super::native::Block::push_packed_row`]), by the same rules as JSON:
//! a plain string, integer, float, bool or null has no JSON text on the way, and each of
//! Python's own value types keeps a tag of its own, so a column may refuse what
//! clickhouse-connect refuses (a `datetime` into a `String` column).
//!
//! ```text
//! packed := "CCP1" row* keys keys-at:u32-le             keys-at: where `keys` starts
//! keys   := count:varuint (len:varuint key-bytes){count}
//! row    := len:u32-le count:varuint (key:varuint value){count}
//!                                      len: the bytes after it; key: an index into the keys
//! value  := tag:u8 payload
//! ```
//! (The keys come last so that a writer writes each row once, into the buffer it sends.)
//! Tags and payloads ([`Tag`]): null, false and true have none; an `int` (i64) and a `uint`
//! (u64) 8 bytes little-endian, a `float` the 8 bytes of an f64; every other tag a
//! `len:varuint` and that many bytes: UTF-8 text (`str`; JSON text for a nested value; the
//! text of a date-time, date, time, decimal, UUID or IP address) or any bytes (`bytes`).
//! Varuints are LEB128, as the Native format writes them.

use std::io::Write;

use super::json::{refuse, write_json_string, Refusal};

/// The first bytes of packed rows.
pub const MAGIC: &[u8; 4] = b"CCP1";

/// A value's tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Tag {
    /// SQL NULL.
    Null = 0,
    /// `false`.
    False = 1,
    /// `true`.
    True = 2,
    /// A signed 64-bit integer.
    Int = 3,
    /// An unsigned 64-bit integer (above `i64::MAX`).
    Uint = 4,
    /// A 64-bit float.
    Float = 5,
    /// UTF-8 text.
    Str = 6,
    /// Bytes, UTF-8 or not (for `String` and `FixedString` columns).
    Bytes = 7,
    /// A nested value (a list, tuple or dict) as JSON text.
    Json = 8,
    /// A date-time's text: `YYYY-MM-DD hh:mm:ss[.ffffff]`, with an offset when it is aware.
    DateTime = 9,
    /// A date's text, `YYYY-MM-DD`.
    Date = 10,
    /// A time of day's text, `hh:mm:ss[.ffffff]`.
    Time = 11,
    /// A decimal number's digits, as a JSON number.
    Decimal = 12,
    /// A UUID's text.
    Uuid = 13,
    /// An IPv4 or IPv6 address's text.
    Ip = 14,
}

impl Tag {
    fn from_u8(b: u8) -> Option<Tag> {
        const TAGS: [Tag; 15] = [
            Tag::Null,
            Tag::False,
            Tag::True,
            Tag::Int,
            Tag::Uint,
            Tag::Float,
            Tag::Str,
            Tag::Bytes,
            Tag::Json,
            Tag::DateTime,
            Tag::Date,
            Tag::Time,
            Tag::Decimal,
            Tag::Uuid,
            Tag::Ip,
        ];
        TAGS.get(usize::from(b)).copied()
    }

    /// What a message calls a value of this tag that a column refuses.
    pub fn name(self) -> &'static str {
        match self {
            Tag::DateTime => "a datetime",
            Tag::Date => "a date",
            Tag::Time => "a time",
            Tag::Decimal => "a Decimal",
            Tag::Uuid => "a UUID",
            Tag::Ip => "an IP address",
            _ => "a value",
        }
    }
}

/// One packed value, borrowed from its row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Packed<'a> {
    /// SQL NULL.
    Null,
    /// A bool.
    Bool(bool),
    /// An i64.
    Int(i64),
    /// A u64.
    Uint(u64),
    /// An f64.
    Float(f64),
    /// UTF-8 text.
    Str(&'a [u8]),
    /// Any bytes.
    Bytes(&'a [u8]),
    /// JSON text of a nested value.
    Json(&'a [u8]),
    /// The text of one of Python's own values, by its tag (date-time to IP address).
    Std(Tag, &'a [u8]),
}

impl Packed<'_> {
    /// The value as the JSON the JSONEachRow path carries (and the rules read): the text of
    /// Python's own values as a string, a decimal's as a number.
    pub fn write_json(&self, buf: &mut Vec<u8>) {
        match *self {
            Packed::Null => buf.extend_from_slice(b"null"),
            Packed::Bool(b) => buf.extend_from_slice(if b { b"true" } else { b"false" }),
            Packed::Int(i) => drop(write!(buf, "{i}")),
            Packed::Uint(u) => drop(write!(buf, "{u}")),
            // (Shortest, as `encode::write_value`; a float that is not finite, which no column
            // takes, as null.)
            Packed::Float(f) => drop(serde_json::to_writer(&mut *buf, &f)),
            Packed::Json(text) | Packed::Std(Tag::Decimal, text) => buf.extend_from_slice(text),
            Packed::Str(s) | Packed::Bytes(s) | Packed::Std(_, s) => write_json_string(buf, s),
        }
    }
}

/// A reader of packed bytes: each call reads one item at its place, or says what is wrong.
pub struct Reader<'a> {
    s: &'a [u8],
    at: usize,
}

/// Packed input that does not follow the layout.
pub(super) fn malformed(what: &str) -> Refusal {
    refuse(b"", format!("packed rows that are malformed ({what})"))
}

impl<'a> Reader<'a> {
    /// A reader at the start of `s`.
    pub fn new(s: &'a [u8]) -> Self {
        Reader { s, at: 0 }
    }

    /// Whether every byte was read.
    pub fn at_end(&self) -> bool {
        self.at == self.s.len()
    }

    /// A varuint that fits `usize`.
    pub fn varuint(&mut self) -> Result<usize, Refusal> {
        let mut n: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = *self.s.get(self.at).ok_or_else(|| malformed("cut short"))?;
            self.at += 1;
            n |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return usize::try_from(n).map_err(|_| malformed("a length too large"));
            }
        }
        Err(malformed("a varuint over 10 bytes"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Refusal> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.s.len())
            .ok_or_else(|| malformed("cut short"))?;
        let bytes = &self.s[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn eight(&mut self) -> Result<[u8; 8], Refusal> {
        let bytes = self.take(8)?;
        Ok(bytes.try_into().unwrap_or_default())
    }

    /// One value; its text, if any, checked for UTF-8.
    pub fn value(&mut self) -> Result<Packed<'a>, Refusal> {
        let value = self.value_unchecked()?;
        if let Packed::Str(t) | Packed::Json(t) | Packed::Std(_, t) = value {
            if !is_utf8(t) {
                return Err(refuse(t, "text that is not UTF-8"));
            }
        }
        Ok(value)
    }

    /// One value by the layout alone (a row already read, or one looked at for its keys).
    fn value_unchecked(&mut self) -> Result<Packed<'a>, Refusal> {
        let b = *self.s.get(self.at).ok_or_else(|| malformed("cut short"))?;
        self.at += 1;
        let tag = Tag::from_u8(b).ok_or_else(|| malformed("an unknown tag"))?;
        Ok(match tag {
            Tag::Null => Packed::Null,
            Tag::False => Packed::Bool(false),
            Tag::True => Packed::Bool(true),
            Tag::Int => Packed::Int(i64::from_le_bytes(self.eight()?)),
            Tag::Uint => Packed::Uint(u64::from_le_bytes(self.eight()?)),
            Tag::Float => Packed::Float(f64::from_le_bytes(self.eight()?)),
            _ => {
                let len = self.varuint()?;
                let bytes = self.take(len)?;
                match tag {
                    Tag::Str => Packed::Str(bytes),
                    Tag::Bytes => Packed::Bytes(bytes),
                    Tag::Json => Packed::Json(bytes),
                    std => Packed::Std(std, bytes),
                }
            }
        })
    }
}

/// The most keys packed input may name: more than any table's columns (ClickHouse's own
/// tables stay far below), so a send's keys take bounded memory.
pub const MAX_KEYS: usize = 100_000;

/// Packed input's keys, and its rows' spans.
pub type KeysAndRows = (Vec<Vec<u8>>, Vec<(usize, usize)>);

/// The keys and the rows of packed input: each key's bytes (UTF-8), and each row's span (by
/// the length before it, which is not part of the span). The values are checked as they are
/// read, into their columns, before anything is sent; `row_limit` names a row over the size
/// limit.
pub fn find_rows(
    data: &[u8],
    row_limit: &dyn Fn(usize, usize) -> Result<(), crate::client::Error>,
) -> Result<KeysAndRows, crate::client::Error> {
    use crate::client::Error;
    let bad = |n: Option<usize>, r: Refusal| match n {
        Some(n) => Error::invalid(format!("row {n}: {}", r.reason)),
        None => Error::invalid(format!("the packed rows' keys: {}", r.reason)),
    };
    if !data.starts_with(MAGIC) {
        return Err(Error::invalid(
            "packed rows start with \"CCP1\" (send-packed takes the binding's packed rows; send-json takes JSON)",
        ));
    }
    let keys_at = data
        .len()
        .checked_sub(4)
        .filter(|&end| end >= MAGIC.len())
        .map(|end| {
            (
                end,
                u32::from_le_bytes(data[end..].try_into().unwrap_or_default()) as usize,
            )
        })
        .filter(|&(end, at)| (MAGIC.len()..=end).contains(&at));
    let Some((end, keys_at)) = keys_at else {
        return Err(bad(None, malformed("the keys' place is not in them")));
    };
    let mut r = Reader::new(&data[..end]);
    r.at = keys_at;
    let count = r.varuint().map_err(|e| bad(None, e))?;
    if count > MAX_KEYS {
        return Err(bad(None, malformed("more keys than a table has columns")));
    }
    let mut keys = Vec::with_capacity(count);
    for _ in 0..count {
        let len = r.varuint().map_err(|e| bad(None, e))?;
        let key = r.take(len).map_err(|e| bad(None, e))?;
        if !is_utf8(key) {
            return Err(Error::invalid(
                "the packed rows' keys: a key that is not UTF-8",
            ));
        }
        keys.push(key.to_vec());
    }
    let mut sorted: Vec<&Vec<u8>> = keys.iter().collect();
    sorted.sort_unstable();
    if let Some(twice) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::invalid(format!(
            "the packed rows' keys: '{}' is given twice",
            crate::text::escaped(&String::from_utf8_lossy(twice[0]))
        )));
    }
    if !r.at_end() {
        return Err(bad(None, malformed("bytes after the keys")));
    }
    let mut r = Reader::new(&data[..keys_at]);
    r.at = MAGIC.len();
    let mut spans = Vec::with_capacity(data.len() / 64 + 1);
    while !r.at_end() {
        let n = spans.len() + 1;
        let len = r.take(4).map_err(|e| bad(Some(n), e))?;
        let len = u32::from_le_bytes(len.try_into().unwrap_or_default()) as usize;
        let start = r.at;
        r.take(len).map_err(|e| bad(Some(n), e))?;
        row_limit(n, len)?;
        spans.push((start, r.at));
    }
    Ok((keys, spans))
}

/// Whether `s` is UTF-8: ASCII a word at a time (core's test), else std's check (a value is
/// mostly short and ASCII; std's check reads four bytes a step on wasm32).
fn is_utf8(s: &[u8]) -> bool {
    s.is_ascii() || std::str::from_utf8(s).is_ok()
}

/// The keys of one packed row, in its order, up to the first one named twice (for a message
/// and the first row's columns); with why the row is malformed, if it is (the keys before
/// that place). Its values are skipped by their layout, not read.
pub fn row_keys(row: &[u8], keys: &[Vec<u8>]) -> (Vec<Vec<u8>>, Option<Refusal>) {
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut named = vec![false; keys.len()];
    let mut r = Reader::new(row);
    let mut read = || -> Result<(), Refusal> {
        for _ in 0..r.varuint()? {
            let n = r.varuint()?;
            let key = keys
                .get(n)
                .ok_or_else(|| malformed("a key index past the keys"))?;
            out.push(key.clone());
            // Up to the first key named twice, which is what a message names: a row of a
            // million pairs of one key copies it twice, not a million times.
            if std::mem::replace(&mut named[n], true) {
                return Ok(());
            }
            r.value_unchecked()?;
        }
        match r.at_end() {
            true => Ok(()),
            false => Err(malformed("bytes after its values")),
        }
    };
    let refusal = read().err();
    (out, refusal)
}

/// Writes packed rows: the binding's side ([`MAGIC`], the rows, then the keys).
pub struct Writer {
    keys: Vec<Vec<u8>>,
    rows: Vec<u8>,
    /// Where the row being written starts (its length, written when it ends).
    row_at: Option<usize>,
}

impl Default for Writer {
    fn default() -> Self {
        Writer {
            keys: Vec::new(),
            rows: MAGIC.to_vec(),
            row_at: None,
        }
    }
}

impl Writer {
    /// A new writer.
    pub fn new() -> Self {
        Writer::default()
    }

    /// Room for `additional` more bytes of rows, at once, if the allocator gives it (a writer
    /// that can tell the size of what it writes saves the copies of growing; an estimate far
    /// too large is not an error, at most 4 GiB is asked for).
    pub fn reserve(&mut self, additional: usize) {
        let _ = self.rows.try_reserve(additional.min(u32::MAX as usize));
    }

    /// The index of `key`, added to the keys if it is new.
    pub fn key(&mut self, key: &[u8]) -> usize {
        match self.keys.iter().position(|k| k == key) {
            Some(n) => n,
            None => {
                self.keys.push(key.to_vec());
                self.keys.len() - 1
            }
        }
    }

    /// The bytes written so far.
    pub fn written(&self) -> usize {
        self.rows.len()
    }

    /// Undoes a nested value started at `mark` ([`Writer::start_json`]), its tag too.
    pub fn cancel_json(&mut self, mark: usize) {
        self.rows.truncate(mark - 1);
    }

    /// A row of `count` values starts (the one before it ends); then `count` times a key
    /// index and a value.
    pub fn row(&mut self, count: usize) {
        self.end_row();
        self.row_at = Some(self.rows.len());
        self.rows.extend_from_slice(&[0; 4]);
        write_varuint(&mut self.rows, count);
    }

    /// The row being written ends: its length goes before it (a row past 4 GiB is cut to
    /// it, and refused as malformed: the component's memory is smaller).
    fn end_row(&mut self) {
        if let Some(at) = self.row_at.take() {
            let len = u32::try_from(self.rows.len() - at - 4).unwrap_or(u32::MAX);
            self.rows[at..at + 4].copy_from_slice(&len.to_le_bytes());
        }
    }

    /// The key index of the next value.
    pub fn key_index(&mut self, n: usize) {
        write_varuint(&mut self.rows, n);
    }

    /// A value without a payload, or an 8-byte one.
    pub fn null(&mut self) {
        self.rows.push(Tag::Null as u8);
    }

    /// A bool.
    pub fn bool(&mut self, b: bool) {
        self.rows
            .push(if b { Tag::True as u8 } else { Tag::False as u8 });
    }

    /// An i64.
    pub fn int(&mut self, i: i64) {
        self.rows.push(Tag::Int as u8);
        self.rows.extend_from_slice(&i.to_le_bytes());
    }

    /// A u64.
    pub fn uint(&mut self, u: u64) {
        self.rows.push(Tag::Uint as u8);
        self.rows.extend_from_slice(&u.to_le_bytes());
    }

    /// An f64.
    pub fn float(&mut self, f: f64) {
        self.rows.push(Tag::Float as u8);
        self.rows.extend_from_slice(&f.to_bits().to_le_bytes());
    }

    /// A value with a length and bytes (`Str`, `Bytes`, `Json` and Python's own values).
    pub fn bytes(&mut self, tag: Tag, bytes: &[u8]) {
        self.rows.push(tag as u8);
        write_varuint(&mut self.rows, bytes.len());
        self.rows.extend_from_slice(bytes);
    }

    /// The buffer a nested value's JSON text is written into in place: call
    /// [`Writer::end_json`] with the mark this returns once it is written.
    pub fn start_json(&mut self) -> (usize, &mut Vec<u8>) {
        self.rows.push(Tag::Json as u8);
        let mark = self.rows.len();
        (mark, &mut self.rows)
    }

    /// Ends a nested value started at `mark`: its length goes before its text.
    pub fn end_json(&mut self, mark: usize) {
        let len = self.rows.len() - mark;
        let mut prefix = Vec::with_capacity(10);
        write_varuint(&mut prefix, len);
        self.rows.splice(mark..mark, prefix);
    }

    /// The packed rows.
    pub fn finish(mut self) -> Vec<u8> {
        self.end_row();
        let mut out = self.rows;
        let keys_at = out.len();
        write_varuint(&mut out, self.keys.len());
        for key in &self.keys {
            write_varuint(&mut out, key.len());
            out.extend_from_slice(key);
        }
        // (Past 4 GiB the send is refused: the component's memory is smaller.)
        out.extend_from_slice(&u32::try_from(keys_at).unwrap_or(u32::MAX).to_le_bytes());
        out
    }
}

fn write_varuint(out: &mut Vec<u8>, mut n: usize) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// One packed row as a JSONEachRow line (without its line end), for a table the sink sends
/// as JSON: each value as [`Packed::write_json`] writes it. The row was checked by
/// [`find_rows`] and every value by its column (a float that is not finite is refused there),
/// so nothing here fails.
pub fn write_json_row(out: &mut Vec<u8>, row: &[u8], keys: &[Vec<u8>]) {
    let mut r = Reader::new(row);
    let count = r.varuint().unwrap_or(0);
    out.push(b'{');
    for n in 0..count {
        let (Ok(key), Ok(value)) = (r.varuint(), r.value_unchecked()) else {
            break;
        };
        if n > 0 {
            out.push(b',');
        }
        write_json_string(out, keys.get(key).map_or(&b""[..], |k| &k[..]));
        out.push(b':');
        let from = out.len();
        value.write_json(out);
        if let Packed::Json(_) | Packed::Std(Tag::Decimal, _) = value {
            // A JSON text's line ends are spaces between its tokens (a string holds none
            // unescaped): one row, one line.
            for b in &mut out[from..] {
                if matches!(*b, b'\n' | b'\r') {
                    *b = b' ';
                }
            }
        }
    }
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::ErrorKind;
    use crate::sink::columns::{test_table as table, TableColumns};
    use crate::sink::encode::{encode_json, encode_packed, Encoded};

    /// The Native block `encoded`'s rows make, or the message refusing them.
    fn block(t: &TableColumns, encoded: &Encoded) -> Result<Vec<u8>, String> {
        let mut block = t.block(&encoded.columns, "t").map_err(|e| e.message)?;
        t.read(encoded, 0, encoded.len(), &mut block)
            .map_err(|e| e.message)?;
        let mut out = Vec::new();
        block.write(&mut out);
        Ok(out)
    }

    /// The invalid-input message refusing packed `data` for `t`.
    fn refused(t: &TableColumns, data: &[u8]) -> String {
        let e = encode_packed(data, None)
            .and_then(|e| block(t, &e).map_err(crate::client::Error::invalid))
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput);
        e.message
    }

    /// Packed rows of `(key, value)` pairs.
    fn packed(rows: &[&[(&str, Packed<'_>)]]) -> Vec<u8> {
        let mut w = Writer::new();
        for row in rows {
            w.row(row.len());
            for (key, value) in *row {
                let n = w.key(key.as_bytes());
                w.key_index(n);
                match *value {
                    Packed::Null => w.null(),
                    Packed::Bool(b) => w.bool(b),
                    Packed::Int(i) => w.int(i),
                    Packed::Uint(u) => w.uint(u),
                    Packed::Float(f) => w.float(f),
                    Packed::Str(s) => w.bytes(Tag::Str, s),
                    Packed::Bytes(s) => w.bytes(Tag::Bytes, s),
                    Packed::Json(s) => {
                        let (mark, buf) = w.start_json();
                        buf.extend_from_slice(s);
                        w.end_json(mark);
                    }
                    Packed::Std(tag, s) => w.bytes(tag, s),
                }
            }
        }
        w.finish()
    }

    const COLUMNS: &[(&str, &str)] = &[
        ("s", "String"),
        ("i", "Int32"),
        ("u", "UInt64"),
        ("n", "Nullable(Int8)"),
        ("f", "Float64"),
        ("d", "Decimal(9, 2)"),
        ("t", "DateTime64(3, 'UTC')"),
        ("a", "Array(String)"),
        ("m", "Map(String, UInt8)"),
        ("b", "Bool"),
        ("fs", "FixedString(3)"),
        ("id", "UUID"),
        ("ip", "IPv4"),
        ("day", "Date"),
    ];

    #[test]
    fn packed_rows_fill_the_same_block_as_their_json() {
        let t = table(COLUMNS);
        let big = "x".repeat(300);
        let long = Packed::Str(big.as_bytes());
        let first: &[(&str, Packed)] = &[
            ("s", Packed::Str("a \"quoted\"\n é".as_bytes())),
            ("i", Packed::Int(-2_147_483_648)),
            ("u", Packed::Uint(u64::MAX)),
            ("n", Packed::Null),
            ("f", Packed::Float(0.1)),
            ("d", Packed::Std(Tag::Decimal, b"-1234567.89")),
            ("t", Packed::Std(Tag::DateTime, b"2024-05-06 07:08:09.123")),
            ("a", Packed::Json(br#"["x","y"]"#)),
            ("m", Packed::Json(br#"{"k":7}"#)),
            ("b", Packed::Bool(true)),
            ("fs", Packed::Str(b"abc")),
            (
                "id",
                Packed::Std(Tag::Uuid, b"6f1c8a52-0e4b-4a55-9d1e-2b7c3f4a5d6e"),
            ),
            ("ip", Packed::Std(Tag::Ip, b"10.1.2.3")),
            ("day", Packed::Std(Tag::Date, b"2024-02-29")),
        ];
        // The second row's keys in another order, its integers at their other bounds.
        let second: &[(&str, Packed)] = &[
            ("day", Packed::Str(b"1970-01-01")),
            ("ip", Packed::Str(b"0.0.0.0")),
            ("id", Packed::Str(b"00000000-0000-0000-0000-000000000000")),
            ("fs", Packed::Str(b"")),
            ("b", Packed::Bool(false)),
            ("m", Packed::Json(b"{}")),
            ("a", Packed::Json(b"[]")),
            ("t", Packed::Str(b"1970-01-01 00:00:00")),
            ("d", Packed::Int(3)),
            ("f", Packed::Int(-7)),
            ("n", Packed::Int(-128)),
            ("u", Packed::Int(0)),
            ("i", Packed::Int(2_147_483_647)),
            ("s", long),
        ];
        let json = format!(
            "{}\n{}\n",
            r#"{"s":"a \"quoted\"\n é","i":-2147483648,"u":18446744073709551615,"n":null,"f":0.1,"d":-1234567.89,"t":"2024-05-06 07:08:09.123","a":["x","y"],"m":{"k":7},"b":true,"fs":"abc","id":"6f1c8a52-0e4b-4a55-9d1e-2b7c3f4a5d6e","ip":"10.1.2.3","day":"2024-02-29"}"#,
            format_args!(
                r#"{{"day":"1970-01-01","ip":"0.0.0.0","id":"00000000-0000-0000-0000-000000000000","fs":"","b":false,"m":{{}},"a":[],"t":"1970-01-01 00:00:00","d":3,"f":-7,"n":-128,"u":0,"i":2147483647,"s":"{big}"}}"#
            )
        );
        let data = packed(&[first, second]);
        let from_packed = block(&t, &encode_packed(&data, None).unwrap()).unwrap();
        let from_json = block(&t, &encode_json(json.as_bytes(), None).unwrap()).unwrap();
        assert_eq!(from_packed, from_json);
        // As JSON (a table sent as JSONEachRow), the same lines but for key order and
        // number spellings the reader reads alike.
        let lines = encode_packed(&data, None).unwrap().rows(0, 2);
        let again = block(&t, &encode_json(&lines, None).unwrap()).unwrap();
        assert_eq!(again, from_json);
    }

    #[test]
    fn packed_values_are_refused_as_their_json_is_and_strings_refuse_pythons_own_values() {
        let t = table(&[("c", "UInt8"), ("s", "String"), ("fs", "FixedString(4)")]);
        let ok: [(&str, Packed); 2] = [("s", Packed::Str(b"x")), ("fs", Packed::Str(b"abcd"))];
        let refused = |column: &str, value: Packed| -> String {
            let mut row = vec![("c", Packed::Int(1))];
            row.extend(ok.iter().copied().filter(|(k, _)| *k != column));
            if column == "c" {
                row.remove(0);
            }
            row.push((column, value));
            let data = packed(&[&ok_row(), &row]);
            let e = block(&t, &encode_packed(&data, None).unwrap()).unwrap_err();
            assert!(e.starts_with("row 2, column "), "{e}");
            e
        };
        fn ok_row() -> Vec<(&'static str, Packed<'static>)> {
            vec![
                ("c", Packed::Int(1)),
                ("s", Packed::Str(b"x")),
                ("fs", Packed::Str(b"abcd")),
            ]
        }
        // Each as its JSON is refused, word for word.
        for (value, json) in [
            (Packed::Int(256), "256"),
            (Packed::Int(-1), "-1"),
            (Packed::Uint(u64::MAX), "18446744073709551615"),
            (Packed::Str(b"x"), "\"x\""),
            (Packed::Null, "null"),
            (Packed::Float(1.5), "1.5"),
            (Packed::Json(b"[1]"), "[1]"),
            (Packed::Std(Tag::Decimal, b"1.5"), "1.5"),
        ] {
            let row = format!("{{\"c\":1,\"s\":\"x\",\"fs\":\"abcd\"}}\n{{\"s\":\"x\",\"fs\":\"abcd\",\"c\":{json}}}\n");
            let want = block(&t, &encode_json(row.as_bytes(), None).unwrap()).unwrap_err();
            assert_eq!(refused("c", value), want.replace("line 2", "row 2"));
        }
        assert!(refused("c", Packed::Float(f64::NAN)).contains("NaN or an infinity"));
        assert!(refused("c", Packed::Float(f64::INFINITY)).contains("an infinity is NaN"));
        // Python's own values in a column of strings: refused as clickhouse-connect refuses
        // them, naming what they are.
        for (tag, column) in [
            (Tag::DateTime, "s"),
            (Tag::Date, "fs"),
            (Tag::Time, "s"),
            (Tag::Decimal, "s"),
            (Tag::Uuid, "fs"),
            (Tag::Ip, "s"),
        ] {
            let e = refused(column, Packed::Std(tag, b"1.25"));
            assert!(
                e.contains(&format!("{}, for a column of strings", tag.name())),
                "{e}"
            );
        }
        // Bytes, UTF-8 or not, are a String's as they are.
        let data = packed(&[&[
            ("c", Packed::Int(255)),
            ("s", Packed::Bytes(&[0xff, 0, b'"'])),
            ("fs", Packed::Str(b"ab")),
        ]]);
        let out = block(&t, &encode_packed(&data, None).unwrap()).unwrap();
        assert!(out.windows(4).any(|w| w == [3, 0xff, 0, b'"']), "{out:?}");
    }

    #[test]
    fn malformed_packed_rows_are_refused_whole_and_never_panic() {
        let t = table(&[("a", "UInt8"), ("s", "String")]);
        let good = packed(&[
            &[("a", Packed::Int(1)), ("s", Packed::Str(b"hello"))],
            &[("s", Packed::Str(b"x")), ("a", Packed::Int(2))],
        ]);
        assert!(block(&t, &encode_packed(&good, None).unwrap()).is_ok());
        // Every cut and every flipped byte: an error or a block, never a panic.
        for end in 0..good.len() {
            if let Ok(encoded) = encode_packed(&good[..end], None) {
                let _ = block(&t, &encoded);
            }
        }
        for at in 0..good.len() {
            for bit in 0..8 {
                let mut bad = good.clone();
                bad[at] ^= 1 << bit;
                if let Ok(encoded) = encode_packed(&bad, None) {
                    let _ = block(&t, &encoded);
                }
            }
        }
        let invalid = |data: &[u8]| refused(&t, data);
        assert!(invalid(b"{\"a\":1}").contains("start with \"CCP1\""));
        assert!(invalid(b"CCP1").contains("the keys' place is not in them"));
        assert!(invalid(b"CCP1\0\x04\0\0\0").contains("send needs at least one row"));
        assert!(invalid(b"CCP1\0\x06\0\0\0").contains("the keys' place is not in them"));
        assert!(invalid(b"CCP1\0\0\x04\0\0\0").contains("bytes after the keys"));
        // Cut: the keys' place is lost; rows cut short before their keys.
        assert!(invalid(&good[..good.len() - 2]).contains("the keys' place is not in them"));
        let keys_at = good.len() - 4 - 1 - 2 * 2;
        let mut cut = good[..keys_at - 2].to_vec();
        cut.extend_from_slice(&good[keys_at..good.len() - 4]);
        cut.extend_from_slice(&((keys_at - 2) as u32).to_le_bytes());
        assert!(
            invalid(&cut).starts_with("row 2: packed rows that are malformed (cut short)"),
            "{}",
            invalid(&cut)
        );
        // A key index past the keys, an unknown tag, bytes after a row's values.
        let mut past = good.clone();
        // The magic, the first row's length and count: its first key index.
        let first_key = MAGIC.len() + 4 + 1;
        assert_eq!(past[first_key], 0);
        past[first_key] = 9;
        let e = invalid(&past);
        assert!(
            e.starts_with("row 1: packed rows that are malformed (a key index past the keys)"),
            "{e}"
        );
        let mut tag = good.clone();
        tag[first_key + 1] = 99;
        assert!(invalid(&tag).starts_with("row 1: packed rows that are malformed (an unknown tag)"));
        let mut count = good.clone();
        count[first_key - 1] = 1;
        assert!(invalid(&count)
            .starts_with("row 1: packed rows that are malformed (bytes after its values)"));
        // Text that is not UTF-8 (named by its column, as a refused value), and a key that
        // is not.
        let text = packed(&[&[("a", Packed::Int(1)), ("s", Packed::Str(&[b'a', 0xff]))]]);
        let e = invalid(&text);
        assert!(
            e.starts_with("row 1, column 's': a") && e.contains("is text that is not UTF-8"),
            "{e}"
        );
        let mut key = packed(&[&[("\u{e9}", Packed::Int(1))]]);
        let at = key.len() - 4 - 2;
        assert_eq!(key[at..at + 2], *"\u{e9}".as_bytes());
        key[at] = 0xff;
        assert!(invalid(&key).contains("a key that is not UTF-8"));
        // Rows whose keys are not the columns.
        let keys = packed(&[
            &[("a", Packed::Int(1)), ("s", Packed::Str(b"x"))],
            &[("a", Packed::Int(1)), ("a", Packed::Int(2))],
        ]);
        assert!(invalid(&keys).contains("row 2: key 'a' appears twice"));
        let keys = packed(&[
            &[("a", Packed::Int(1)), ("s", Packed::Str(b"x"))],
            &[("a", Packed::Int(1)), ("zz", Packed::Int(2))],
        ]);
        let e = invalid(&keys);
        assert!(e.contains("row 2: missing 's'; extra 'zz'"), "{e}");
    }

    /// Raw packed bytes: `rows` (each a count and its pairs, already laid out) and the keys.
    fn raw(rows: &[Vec<u8>], keys: &[&[u8]]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        for row in rows {
            out.extend_from_slice(&(row.len() as u32).to_le_bytes());
            out.extend_from_slice(row);
        }
        let keys_at = out.len() as u32;
        write_varuint(&mut out, keys.len());
        for k in keys {
            write_varuint(&mut out, k.len());
            out.extend_from_slice(k);
        }
        out.extend_from_slice(&keys_at.to_le_bytes());
        out
    }

    #[test]
    fn hostile_keys_take_bounded_memory_and_time() {
        let t = table(&[("a", "Nullable(UInt8)")]);
        let invalid = |data: &[u8]| refused(&t, data);
        // A row of a million pairs naming one key (2 MB): refused as a key named twice,
        // its first row's keys read up to that place (not copied a million times).
        let mut row = Vec::new();
        write_varuint(&mut row, 1_000_000);
        for _ in 0..1_000_000 {
            row.extend_from_slice(&[0, Tag::Null as u8]);
        }
        let e = invalid(&raw(&[row.clone()], &[&[b'a'; 4096]]));
        assert!(e.contains("appears twice"), "{e}");
        // The same as the second row, the first being right.
        let first = vec![1, 0, Tag::Null as u8];
        let e = invalid(&raw(&[first.clone(), row], &[b"a"]));
        assert!(e.starts_with("row 2: key 'a' appears twice"), "{e}");
        // A key given twice in the keys, and more keys than any table has.
        let e = invalid(&raw(std::slice::from_ref(&first), &[b"a", b"a"]));
        assert!(e.contains("'a' is given twice"), "{e}");
        let many: Vec<Vec<u8>> = (0..=MAX_KEYS).map(|n| n.to_string().into_bytes()).collect();
        let many: Vec<&[u8]> = many.iter().map(Vec::as_slice).collect();
        let e = invalid(&raw(&[first], &many));
        assert!(e.contains("more keys than a table has columns"), "{e}");
    }

    #[test]
    fn a_first_row_with_text_that_is_not_utf8_names_its_column() {
        let t = table(&[("a", "String"), ("b", "UInt8")]);
        let data = packed(&[&[("a", Packed::Str(&[0xff])), ("b", Packed::Int(1))]]);
        let e = block(&t, &encode_packed(&data, None).unwrap()).unwrap_err();
        assert!(
            e.starts_with("row 1, column 'a': ") && e.contains("is text that is not UTF-8"),
            "{e}"
        );
    }

    #[test]
    fn nested_values_are_one_json_line_and_json_null_is_a_nullable_null() {
        let t = table(&[("j", "Nullable(String)"), ("n", "Nullable(Int8)")]);
        let data = packed(&[
            &[
                ("j", Packed::Json(b"[1,\n2]")),
                ("n", Packed::Json(b" null\n")),
            ],
            &[("j", Packed::Null), ("n", Packed::Std(Tag::Decimal, b"5"))],
        ]);
        let encoded = encode_packed(&data, None).unwrap();
        // (As a JSON array: a line of NDJSON holds no line end.)
        let json = b"[{\"j\":[1,\n2],\"n\":null},{\"j\":null,\"n\":5}]";
        assert_eq!(
            block(&t, &encoded).unwrap(),
            block(&t, &encode_json(json, None).unwrap()).unwrap()
        );
        assert_eq!(
            encoded.rows(0, 2),
            b"{\"j\":[1, 2],\"n\": null }\n{\"j\":null,\"n\":5}\n"
        );
    }
}
