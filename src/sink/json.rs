//! The JSON reader every typed path reads rows with (the CLI, the Singer target, the library's
//! `send-json`, and the Python binding's rows), and the one JSON string writer: a [`Cursor`]
//! over a row's text gives each value as a token or skips it, with the server's limits (depth,
//! escapes, surrogates, number shapes); the builders of [`super::native`] read values from it
//! straight into their columns. Nothing here knows a column type.

use std::borrow::Cow;

use super::scalars::Why;

/// Why a value was refused: the value's text (capped) and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The refused value's JSON text, at most [`SHOWN_BYTES`] of it.
    pub value: String,
    /// Why.
    pub reason: Why,
}

pub(super) const TOO_DEEP: &str = "nested more than 1000 levels of arrays and objects deep, counting the row's own object (the server's input_format_json_max_depth)";

/// How much of a refused value a message shows.
pub const SHOWN_BYTES: usize = 80;

pub(super) fn refuse(text: &[u8], reason: impl Into<Why>) -> Refusal {
    let shown = String::from_utf8_lossy(&text[..text.len().min(SHOWN_BYTES)]);
    let mut value: String = shown.chars().filter(|c| !c.is_control()).collect();
    if text.len() > SHOWN_BYTES {
        value.push_str("...");
    }
    Refusal {
        value,
        reason: reason.into(),
    }
}

/// Whether `t` is a number as JSON writes one: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
fn is_json_number(t: &[u8]) -> bool {
    let digits = |t: &[u8]| t.iter().take_while(|b| b.is_ascii_digit()).count();
    let t = t.strip_prefix(b"-").unwrap_or(t);
    let int = digits(t);
    if int == 0 || (int > 1 && t[0] == b'0') {
        return false;
    }
    let mut t = &t[int..];
    if let Some(rest) = t.strip_prefix(b".") {
        let n = digits(rest);
        if n == 0 {
            return false;
        }
        t = &rest[n..];
    }
    if let Some(rest) = t.strip_prefix(b"e").or_else(|| t.strip_prefix(b"E")) {
        let rest = rest
            .strip_prefix(b"+")
            .or_else(|| rest.strip_prefix(b"-"))
            .unwrap_or(rest);
        let n = digits(rest);
        return n > 0 && n == rest.len();
    }
    t.is_empty()
}

/// The high bit of each byte of `x` (little-endian) that is `"`, `\\` or a control character
/// (below 0x20), or with `DEL` also 0x7f (the bytes the JSON writer escapes), and perhaps of
/// bytes above the lowest such: the zero-byte test of "Bit Twiddling Hacks", whose lowest bit
/// is exact (a borrow only runs upwards).
fn string_specials<const DEL: bool>(x: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let quote = zero(x ^ (ONES * u64::from(b'"')));
    let backslash = zero(x ^ (ONES * u64::from(b'\\')));
    let control = x.wrapping_sub(ONES * 0x20) & !x & HIGH;
    let del = if DEL { zero(x ^ (ONES * 0x7f)) } else { 0 };
    quote | backslash | control | del
}

/// Where, from `at` on, the first `"`, `\\` or control character of `s` is (with `DEL`, or
/// 0x7f); or, if there is none in the whole eight-byte steps, where the last few bytes (fewer
/// than eight) start, for the caller's byte-by-byte scan.
fn first_string_special_scalar<const DEL: bool>(s: &[u8], mut at: usize) -> usize {
    while let Some(chunk) = s.get(at..at + 8) {
        let word = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        let specials = string_specials::<DEL>(word);
        if specials != 0 {
            return at + specials.trailing_zeros() as usize / 8;
        }
        at += 8;
    }
    at
}

/// [`first_string_special_scalar`], sixteen bytes a step with wasm's `simd128` (the
/// component's build for speed has it; the library component's, for size, does not).
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
fn first_string_special<const DEL: bool>(s: &[u8], mut at: usize) -> usize {
    use core::arch::wasm32::{u8x16, u8x16_bitmask, u8x16_eq, u8x16_lt, u8x16_splat, v128_or};
    while let Some(b) = s.get(at..at + 16) {
        // (A safe load: the 16 lanes from the slice compile to one `v128.load`.)
        let v = u8x16(
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
            b[14], b[15],
        );
        let mut specials = v128_or(
            v128_or(
                u8x16_eq(v, u8x16_splat(b'"')),
                u8x16_eq(v, u8x16_splat(b'\\')),
            ),
            u8x16_lt(v, u8x16_splat(0x20)),
        );
        if DEL {
            specials = v128_or(specials, u8x16_eq(v, u8x16_splat(0x7f)));
        }
        let bits = u8x16_bitmask(specials);
        if bits != 0 {
            return at + bits.trailing_zeros() as usize;
        }
        at += 16;
    }
    first_string_special_scalar::<DEL>(s, at)
}

#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
fn first_string_special<const DEL: bool>(s: &[u8], at: usize) -> usize {
    first_string_special_scalar::<DEL>(s, at)
}

/// One JSON value at a [`Cursor`].
pub(super) enum Token<'a> {
    Null,
    Bool(bool),
    /// A number's text.
    Number(&'a [u8]),
    /// A string's content, escapes undone; and its text with the quotes.
    Str(Cow<'a, [u8]>, &'a [u8]),
    /// An array or object starts at the cursor (not consumed).
    Open,
}

/// Reads JSON values from a row's text, byte by byte.
pub struct Cursor<'a> {
    pub(super) s: &'a [u8],
    pub(super) at: usize,
    /// Arrays and objects open around the cursor (a row's own object counts).
    pub(super) depth: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `s`.
    pub fn new(s: &'a [u8]) -> Self {
        Cursor { s, at: 0, depth: 0 }
    }

    pub(super) fn space(&mut self) {
        while matches!(self.s.get(self.at), Some(b' ' | b'\t' | b'\r' | b'\n')) {
            self.at += 1;
        }
    }

    pub(super) fn peek(&mut self) -> Option<u8> {
        self.space();
        self.s.get(self.at).copied()
    }

    pub(super) fn eat(&mut self, b: u8) -> bool {
        if self.peek() == Some(b) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    pub(super) fn rest(&self) -> &'a [u8] {
        &self.s[self.at.min(self.s.len())..]
    }

    pub(super) fn malformed(&self) -> Refusal {
        refuse(self.rest(), "not valid JSON here")
    }

    /// The next value's token (an array or object is only announced).
    pub(super) fn token(&mut self) -> Result<Token<'a>, Refusal> {
        let b = self.peek().ok_or_else(|| self.malformed())?;
        let literal = |c: &mut Self, word: &[u8], token: Token<'a>| {
            if c.rest().starts_with(word) {
                c.at += word.len();
                Ok(token)
            } else {
                Err(c.malformed())
            }
        };
        match b {
            b'n' => literal(self, b"null", Token::Null),
            b't' => literal(self, b"true", Token::Bool(true)),
            b'f' => literal(self, b"false", Token::Bool(false)),
            b'"' => {
                let (content, text) = self.string()?;
                Ok(Token::Str(content, text))
            }
            b'[' | b'{' => Ok(Token::Open),
            b'-' | b'0'..=b'9' => {
                let start = self.at;
                while self.s.get(self.at).is_some_and(|b| {
                    b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E')
                }) {
                    self.at += 1;
                }
                let text = &self.s[start..self.at];
                if !is_json_number(text) {
                    return Err(refuse(text, "not a JSON number"));
                }
                Ok(Token::Number(text))
            }
            _ => Err(self.malformed()),
        }
    }

    /// A plain JSON integer at the cursor (`0` or `-?[1-9][0-9]{0,18}`, a whole token) that a
    /// column of `bits` (at most 64) holds: its value's two's complement, the cursor past it.
    /// `None` for anything else (the cursor unmoved): the general reading refuses or reads it.
    #[cfg(feature = "speed")]
    pub(super) fn small_integer(&mut self, signed: bool, bits: u16) -> Option<u64> {
        self.space();
        let rest = self.rest();
        let negative = rest.first() == Some(&b'-');
        let digits = &rest[usize::from(negative)..];
        let n = digits.iter().take_while(|b| b.is_ascii_digit()).count();
        // The general reading's token runs on through these (and names the whole text).
        let whole = !matches!(digits.get(n), Some(b'.' | b'e' | b'E' | b'+' | b'-'));
        if n == 0 || n > 19 || (n > 1 && digits[0] == b'0') || !whole || (negative && !signed) {
            return None;
        }
        let magnitude = digits[..n]
            .iter()
            .fold(0u64, |v, d| v * 10 + u64::from(d - b'0'));
        let limit = if signed { 1u64 << (bits - 1) } else { 0 };
        let value = match (signed, negative) {
            (false, _) if bits == 64 || magnitude >> bits == 0 => magnitude,
            (true, false) if magnitude < limit => magnitude,
            (true, true) if magnitude <= limit => magnitude.wrapping_neg(),
            _ => return None,
        };
        self.at += usize::from(negative) + n;
        Some(value)
    }

    /// A string at the cursor: its content (escapes undone) and its text, quotes included.
    pub(super) fn string(&mut self) -> Result<(Cow<'a, [u8]>, &'a [u8]), Refusal> {
        let start = self.at;
        self.at += 1;
        let from = self.at;
        // The common case: no escape. Straight to the first quote, backslash or control
        // character (strings are most of a row's bytes).
        self.at = first_string_special::<false>(self.s, self.at);
        while let Some(&b) = self.s.get(self.at) {
            match b {
                b'"' => {
                    self.at += 1;
                    return Ok((
                        Cow::Borrowed(&self.s[from..self.at - 1]),
                        &self.s[start..self.at],
                    ));
                }
                b'\\' => break,
                0..=0x1f => {
                    return Err(refuse(&self.s[start..], "a control character in a string"))
                }
                _ => self.at += 1,
            }
        }
        let mut out = self.s[from..self.at].to_vec();
        while let Some(&b) = self.s.get(self.at) {
            self.at += 1;
            match b {
                b'"' => return Ok((Cow::Owned(out), &self.s[start..self.at])),
                b'\\' => {
                    let e = *self.s.get(self.at).ok_or_else(|| self.malformed())?;
                    self.at += 1;
                    match e {
                        b'"' | b'\\' | b'/' => out.push(e),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'n' => out.push(b'\n'),
                        b'r' => out.push(b'\r'),
                        b't' => out.push(b'\t'),
                        b'u' => {
                            let mut c = self.hex4()?;
                            if (0xD800..0xDC00).contains(&c) {
                                // A surrogate pair.
                                if !self.rest().starts_with(b"\\u") {
                                    return Err(refuse(
                                        &self.s[start..],
                                        "a lone surrogate in a string",
                                    ));
                                }
                                self.at += 2;
                                let low = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&low) {
                                    return Err(refuse(
                                        &self.s[start..],
                                        "a lone surrogate in a string",
                                    ));
                                }
                                c = 0x10000 + ((c - 0xD800) << 10) + (low - 0xDC00);
                            }
                            let ch = char::from_u32(c).ok_or_else(|| {
                                refuse(&self.s[start..], "a lone surrogate in a string")
                            })?;
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                        }
                        _ => return Err(refuse(&self.s[start..], "a bad escape in a string")),
                    }
                }
                0..=0x1f => {
                    return Err(refuse(&self.s[start..], "a control character in a string"))
                }
                b => out.push(b),
            }
        }
        Err(refuse(&self.s[start..], "an unterminated string"))
    }

    /// Four hex digits, exactly (no sign: `u32::from_str_radix` would take `+041`).
    pub(super) fn hex4(&mut self) -> Result<u32, Refusal> {
        let digits = self
            .s
            .get(self.at..self.at + 4)
            .filter(|d| d.iter().all(u8::is_ascii_hexdigit))
            .ok_or_else(|| self.malformed())?;
        let v = digits
            .iter()
            .fold(0, |v, d| v << 4 | (*d as char).to_digit(16).unwrap_or(0));
        self.at += 4;
        Ok(v)
    }

    /// Reads the members of an array or object whose opening bracket was read, each by
    /// `member`, up to its `close` bracket.
    pub(super) fn each(
        &mut self,
        close: u8,
        mut member: impl FnMut(&mut Self) -> Result<(), Refusal>,
    ) -> Result<(), Refusal> {
        if self.eat(close) {
            return Ok(());
        }
        loop {
            member(self)?;
            if self.eat(close) {
                return Ok(());
            }
            if !self.eat(b',') {
                return Err(self.malformed());
            }
        }
    }

    /// An object's key and its colon: the key's content and text.
    pub(super) fn key(&mut self) -> Result<(Cow<'a, [u8]>, &'a [u8]), Refusal> {
        if self.peek() != Some(b'"') {
            return Err(self.malformed());
        }
        let key = self.string()?;
        if !self.eat(b':') {
            return Err(self.malformed());
        }
        Ok(key)
    }

    /// Skips one value; returns its text.
    pub(super) fn skip(&mut self) -> Result<&'a [u8], Refusal> {
        self.space();
        let start = self.at;
        // The arrays and objects open inside the value: true for an object.
        let mut open: Vec<bool> = Vec::new();
        loop {
            if let Token::Open = self.token()? {
                let object = self.s[self.at] == b'{';
                self.at += 1;
                if self.depth + open.len() + 1 > MAX_ROW_DEPTH {
                    return Err(refuse(&self.s[start..], TOO_DEEP));
                }
                if !self.eat(if object { b'}' } else { b']' }) {
                    open.push(object);
                    if object {
                        self.key()?;
                    }
                    continue;
                }
            }
            // After a value: the next member, or the end of containers.
            loop {
                let Some(&object) = open.last() else {
                    return Ok(&self.s[start..self.at]);
                };
                if self.eat(b',') {
                    if object {
                        self.key()?;
                    }
                    break;
                }
                if !self.eat(if object { b'}' } else { b']' }) {
                    return Err(self.malformed());
                }
                open.pop();
            }
        }
    }

    /// Whether only whitespace is left.
    pub fn at_end(&mut self) -> bool {
        self.peek().is_none()
    }
}

impl Cursor<'_> {
    pub(super) fn shape(&mut self, wanted: &'static str) -> Refusal {
        let start = self.at;
        let text = self.skip().unwrap_or(&self.s[start..]);
        refuse(text, wanted)
    }
}

/// Most levels of objects and arrays one row may nest, the row's own object included: the
/// server's default `input_format_json_max_depth` (1000), past which it refuses the row anyway
/// (onestep-clickhouse's Python rows cannot nest so deep either: Python's recursion limit is
/// 1000 frames).
pub const MAX_ROW_DEPTH: usize = 1000;

/// The keys of a JSON object, up to where it stops being JSON (and why it does): the keys
/// read so far include the one whose value is not JSON.
pub fn object_keys_until(row: &[u8]) -> (Vec<Vec<u8>>, Option<Refusal>) {
    let mut c = Cursor::new(row);
    if !c.eat(b'{') {
        return (Vec::new(), Some(refuse(row, "not a JSON object")));
    }
    c.depth = 1;
    let mut keys = Vec::new();
    let read = c.each(b'}', |c| {
        keys.push(c.key()?.0.into_owned());
        c.skip().map(drop)
    });
    let end = if read.is_ok() && !c.at_end() {
        Err(c.malformed())
    } else {
        read
    };
    (keys, end.err())
}

/// An object's key, unescaped (borrowed from the text when it has no escape).
#[cfg(any(test, feature = "command"))]
pub type Key<'a> = Cow<'a, [u8]>;

/// The fields of a JSON object: each key (unescaped) and its value's text, in order; the
/// object must be the whole of `row` (surrounding space aside). One structural pass, no value
/// parsed: for a caller that routes on a few fields (the Singer target's messages). With
/// `inner`, the keys of the field named `inner.0`, when its value is an object, are collected
/// into `inner.1` in the same pass (that object's depth counted from itself, as a row's).
#[cfg(any(test, feature = "command"))]
pub fn object_fields<'a>(
    row: &'a [u8],
    mut inner: Option<(&[u8], &mut Vec<Key<'a>>)>,
) -> Result<Vec<(Key<'a>, &'a [u8])>, Refusal> {
    let mut c = Cursor::new(row);
    if !c.eat(b'{') {
        return Err(refuse(row, "not a JSON object"));
    }
    c.depth = 1;
    let mut fields = Vec::new();
    c.each(b'}', |c| {
        let key = c.key()?.0;
        let value = match &mut inner {
            Some((name, keys)) if key.as_ref() == *name && c.peek() == Some(b'{') => {
                let start = c.at;
                c.at += 1;
                let outer = std::mem::replace(&mut c.depth, 1);
                c.each(b'}', |c| {
                    keys.push(c.key()?.0);
                    c.skip().map(drop)
                })?;
                c.depth = outer;
                &c.s[start..c.at]
            }
            _ => c.skip()?,
        };
        fields.push((key, value));
        Ok(())
    })?;
    if !c.at_end() {
        return Err(c.malformed());
    }
    Ok(fields)
}

/// Where each element of the JSON array `text` holds starts and ends (the array may hold
/// anything; an element is read later, as a row).
pub fn array_elements(text: &[u8]) -> Result<Vec<(usize, usize)>, Refusal> {
    let mut c = Cursor::new(text);
    if !c.eat(b'[') {
        return Err(c.malformed());
    }
    c.depth = 1;
    let mut spans = Vec::new();
    c.each(b']', |c| {
        c.space();
        let start = c.at;
        c.skip()?;
        spans.push((start, c.at));
        Ok(())
    })?;
    if !c.at_end() {
        return Err(c.malformed());
    }
    Ok(spans)
}

/// The text of the one JSON value `text` holds (whitespace around it dropped), or why it
/// is not one.
pub fn json_value(text: &[u8]) -> Result<&[u8], Refusal> {
    let mut c = Cursor::new(text);
    let value = c.skip()?;
    if !c.at_end() {
        return Err(c.malformed());
    }
    Ok(value)
}

/// A JSON string of arbitrary bytes: quotes, backslashes and control characters escaped, every
/// other byte unchanged (ClickHouse reads string bytes verbatim, UTF-8 or not).
/// Runs without an escape are found a word at a time ([`first_string_special`]) and copied
/// whole: the Python binding writes every str of a send through here.
pub fn write_json_string(buf: &mut Vec<u8>, bytes: &[u8]) {
    buf.reserve(bytes.len() + 2);
    buf.push(b'"');
    let (mut start, mut at) = (0, 0);
    loop {
        at = first_string_special::<true>(bytes, at);
        // The scan stops at an escaped byte, or where the last few bytes start.
        let Some(i) =
            (at..bytes.len()).find(|&i| matches!(bytes[i], 0..=0x1f | b'"' | b'\\' | 0x7f))
        else {
            break;
        };
        let b = bytes[i];
        let escape: Option<&[u8]> = match b {
            b'"' => Some(b"\\\""),
            b'\\' => Some(b"\\\\"),
            b'\n' => Some(b"\\n"),
            b'\r' => Some(b"\\r"),
            b'\t' => Some(b"\\t"),
            _ => None,
        };
        buf.extend_from_slice(&bytes[start..i]);
        match escape {
            Some(e) => buf.extend_from_slice(e),
            None => drop(std::io::Write::write_fmt(buf, format_args!("\\u{b:04x}"))),
        }
        (start, at) = (i + 1, i + 1);
    }
    buf.extend_from_slice(&bytes[start..]);
    buf.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_string_scan_finds_exactly_the_first_quote_backslash_or_control() {
        let naive = |s: &[u8], at: usize| {
            at + s[at..]
                .iter()
                .position(|b| *b == b'"' || *b == b'\\' || *b < 0x20)
                .unwrap_or(s.len() - at)
        };
        // Every byte at every place of a 20-byte field, among bytes that borrow in the
        // eight-byte test's subtraction (0x80, 0xff) or lie next to the special ones; then
        // another special byte after it, and scans from every start.
        for fill in [b'a', 0x80, 0xff, 0x21, 0x5d, 0x20] {
            for b in 0..=255u8 {
                for at in 0..20 {
                    let mut bytes = [fill; 20];
                    bytes[at] = b;
                    if at + 3 < 20 {
                        bytes[at + 3] = b'"';
                    }
                    for from in 0..=at {
                        let found = first_string_special_scalar::<false>(&bytes, from);
                        let want = naive(&bytes, from);
                        // The first special byte, or where fewer than eight bytes before it
                        // are left to scan byte by byte.
                        assert!(
                            found == want || (found < want && bytes.len() - found < 8),
                            "{b:#x} at {at} in {fill:#x}, from {from}: {found}, want {want}"
                        );
                    }
                }
            }
            assert_eq!(first_string_special_scalar::<false>(&[fill; 20], 0), 16);
            assert_eq!(first_string_special_scalar::<false>(&[fill; 20], 20), 20);
        }
    }

    /// The writer's word-at-a-time scan against the byte-by-byte writer it replaced: every
    /// byte at every place of a 20-byte field (0x7f included, which only the writer escapes),
    /// with a second escaped byte after it.
    #[test]
    fn json_strings_are_written_as_byte_by_byte() {
        let naive = |bytes: &[u8]| {
            let mut out = vec![b'"'];
            for &b in bytes {
                match b {
                    b'"' => out.extend_from_slice(b"\\\""),
                    b'\\' => out.extend_from_slice(b"\\\\"),
                    b'\n' => out.extend_from_slice(b"\\n"),
                    b'\r' => out.extend_from_slice(b"\\r"),
                    b'\t' => out.extend_from_slice(b"\\t"),
                    0..=0x1f | 0x7f => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
                    _ => out.push(b),
                }
            }
            out.push(b'"');
            out
        };
        for fill in [b'a', 0x80, 0xff, 0x7e, 0x20] {
            for b in 0..=255u8 {
                for at in 0..20 {
                    let mut bytes = [fill; 20];
                    bytes[at] = b;
                    if at + 9 < 20 {
                        bytes[at + 9] = 0x7f;
                    }
                    for len in [at + 1, 20] {
                        let mut out = Vec::new();
                        write_json_string(&mut out, &bytes[..len]);
                        assert_eq!(out, naive(&bytes[..len]), "{b:#x} at {at} in {fill:#x}");
                    }
                }
            }
        }
        let mut out = Vec::new();
        write_json_string(&mut out, b"");
        assert_eq!(out, b"\"\"");
    }
}
