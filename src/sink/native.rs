//! Rows read value by value for their column's type, straight into columns, and the columns
//! written as one block of ClickHouse's Native format (columnar: per column its name, its
//! type and its values, in the server's own binary layout), the cheapest input the server
//! reads.
//!
//! Reading is where every value is checked: a value that is not exactly one value of its
//! column's type ([`super::scalars`]) is refused with the reason, before any request. Each
//! column type has one [`Builder`], made from the [`Type`] tree. A table with a column the
//! sink does not encode ([`Type::is_covered`]) is sent as JSONEachRow; its rows are read the
//! same way (every covered value checked, the others only for where a null may go), and
//! only spellings the server's JSON reader takes as they are pass there.

use std::fmt::Write as _;

use super::json::{object_keys_until, refuse, write_json_string, Cursor, Refusal, Token};
#[cfg(feature = "speed")]
use super::packed::{self, Packed};
use super::scalars::{self, Moment, Why, Wide};
use super::types::Type;

const TUPLE_SIZE: &str = "not as many values as the tuple has elements";

/// The scalar kinds, with what each needs to read a value.
#[derive(Clone, Debug, PartialEq)]
pub enum Scalar {
    /// `Int8` .. `Int256`, `UInt8` .. `UInt256`.
    Int {
        /// Signed (`Int*`) or not (`UInt*`).
        signed: bool,
        /// Width: 8, 16, 32, 64, 128 or 256.
        bits: u16,
    },
    /// `Float32` or `Float64`.
    Float {
        /// `Float64`.
        wide: bool,
    },
    /// `Bool`.
    Bool,
    /// `Decimal(P, S)` (and `Decimal32` .. `Decimal256`).
    Decimal {
        /// Digits in all.
        precision: u8,
        /// Digits after the point.
        scale: u8,
    },
    /// `FixedString(N)`: N bytes.
    FixedString(u32),
    /// `UUID`.
    Uuid,
    /// `IPv4`.
    Ipv4,
    /// `IPv6`.
    Ipv6,
    /// `Date` or `Date32`.
    Date {
        /// `Date32`.
        wide: bool,
    },
    /// `DateTime` or `DateTime64(P)`.
    DateTime {
        /// `DateTime64`'s precision; None: `DateTime`.
        precision: Option<u8>,
        /// How its values travel.
        text: TimeText,
    },
    /// `Enum8` or `Enum16`.
    Enum {
        /// `Enum16`.
        wide: bool,
        /// Each name (as its bytes) with its value.
        values: Vec<(Vec<u8>, i16)>,
    },
}

/// How a date-time column travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeText {
    /// As its number (the column's zone is UTC, or every value is an instant).
    Binary,
    /// As text the server converts in the column's zone (a zone the component has no rules
    /// for): wall-clock times as `YYYY-MM-DD hh:mm:ss[.f]`, instants as Unix times.
    Zoned,
    /// In a JSONEachRow row, as sent: only the spellings the server's JSON reader takes.
    Json,
}

/// One column's values as they are read: the Native layout, built as rows arrive.
#[derive(Clone, Debug)]
pub enum Builder {
    /// Fixed-width values.
    Fixed {
        /// The values' type.
        kind: Scalar,
        /// The values, little-endian, one after another.
        data: Vec<u8>,
    },
    /// `String`: each value's length (LEB128) and bytes. `zoned`: date-time values as text
    /// for the server to convert.
    Strings {
        /// Lengths and bytes.
        data: Vec<u8>,
        /// The date-time type whose values travel as text, if any.
        zoned: Option<Scalar>,
    },
    /// `Nullable(T)`: a byte per row (1: null), then T's values (a default for a null).
    Nullable {
        /// A byte per row.
        nulls: Vec<u8>,
        /// T's column.
        inner: Box<Builder>,
    },
    /// `Array(T)` (and `Nested`): each row's end offset, then every element.
    Array {
        /// Each row's end offset (`UInt64`, little-endian).
        offsets: Vec<u8>,
        /// Elements so far.
        count: u64,
        /// The elements' column.
        inner: Box<Builder>,
    },
    /// `Map(K, V)`: offsets as an array's, then the keys, then the values.
    Map {
        /// Each row's end offset.
        offsets: Vec<u8>,
        /// Entries so far.
        count: u64,
        /// The keys' column.
        keys: Box<Builder>,
        /// The values' column.
        values: Box<Builder>,
    },
    /// `Tuple(...)`: each element's column, by position.
    Tuple {
        /// Each element's name (None: an unnamed tuple's element).
        names: Vec<Option<String>>,
        /// Each element's column.
        elements: Vec<Builder>,
    },
    /// A type the sink does not encode (JSONEachRow tables only): only a null is checked.
    Unchecked {
        /// Whether the column takes a null.
        takes_null: bool,
    },
}

/// What decides how date-time columns travel: whether a zone (the column's, else the
/// server's) is UTC, and whether the block is Native at all.
#[derive(Clone, Copy, Debug)]
pub struct Encoding<'z> {
    /// The server's time zone (`timezone()`), for columns that name none.
    pub server_zone: &'z str,
    /// Rows travel as JSONEachRow (a table with a type the sink does not encode).
    pub json: bool,
}

/// Whether a time zone name is UTC (a zone whose offset is always 0).
pub fn is_utc(zone: &str) -> bool {
    let z = zone.strip_prefix("Etc/").unwrap_or(zone);
    matches!(
        z,
        "UTC" | "UCT" | "GMT" | "GMT0" | "GMT+0" | "GMT-0" | "Greenwich" | "Universal" | "Zulu"
    )
}

impl Builder {
    /// The builder of a column of type `ty`.
    pub fn new(ty: &Type, encoding: Encoding<'_>) -> Builder {
        let fixed = |kind| Builder::Fixed {
            kind,
            data: Vec::new(),
        };
        let time = |precision: Option<u8>, zone: &Option<String>| {
            let text = if encoding.json {
                TimeText::Json
            } else if is_utc(zone.as_deref().unwrap_or(encoding.server_zone)) {
                TimeText::Binary
            } else {
                TimeText::Zoned
            };
            let kind = Scalar::DateTime { precision, text };
            if text == TimeText::Zoned {
                Builder::Strings {
                    data: Vec::new(),
                    zoned: Some(kind),
                }
            } else {
                fixed(kind)
            }
        };
        match ty {
            Type::Int { signed, bits } => fixed(Scalar::Int {
                signed: *signed,
                bits: *bits,
            }),
            Type::Float32 => fixed(Scalar::Float { wide: false }),
            Type::Float64 => fixed(Scalar::Float { wide: true }),
            Type::Bool => fixed(Scalar::Bool),
            Type::Decimal { precision, scale } => fixed(Scalar::Decimal {
                precision: *precision,
                scale: *scale,
            }),
            Type::String => Builder::Strings {
                data: Vec::new(),
                zoned: None,
            },
            Type::FixedString(n) => fixed(Scalar::FixedString(*n)),
            Type::Uuid => fixed(Scalar::Uuid),
            Type::Ipv4 => fixed(Scalar::Ipv4),
            Type::Ipv6 => fixed(Scalar::Ipv6),
            Type::Date => fixed(Scalar::Date { wide: false }),
            Type::Date32 => fixed(Scalar::Date { wide: true }),
            Type::DateTime(zone) => time(None, zone),
            Type::DateTime64(p, zone) => time(Some(*p), zone),
            Type::Enum { wide, values } => fixed(Scalar::Enum {
                wide: *wide,
                values: values.clone(),
            }),
            Type::Nullable(t) => Builder::Nullable {
                nulls: Vec::new(),
                inner: Box::new(Builder::new(t, encoding)),
            },
            Type::LowCardinality(t) | Type::SimpleAggregateFunction(_, t) => {
                Builder::new(t, encoding)
            }
            Type::Array(t) => Builder::Array {
                offsets: Vec::new(),
                count: 0,
                inner: Box::new(Builder::new(t, encoding)),
            },
            Type::Map(k, v) => Builder::Map {
                offsets: Vec::new(),
                count: 0,
                keys: Box::new(Builder::new(k, encoding)),
                values: Box::new(Builder::new(v, encoding)),
            },
            Type::Tuple(elements) => Builder::Tuple {
                names: elements.iter().map(|(n, _)| n.clone()).collect(),
                elements: elements
                    .iter()
                    .map(|(_, t)| Builder::new(t, encoding))
                    .collect(),
            },
            Type::Nested(elements) => Builder::Array {
                offsets: Vec::new(),
                count: 0,
                inner: Box::new(Builder::Tuple {
                    names: elements.iter().map(|(n, _)| Some(n.clone())).collect(),
                    elements: elements
                        .iter()
                        .map(|(_, t)| Builder::new(t, encoding))
                        .collect(),
                }),
            },
            Type::Other(_) => Builder::Unchecked {
                takes_null: ty.takes_null(),
            },
        }
    }

    /// Empties the builder, keeping its allocations.
    pub fn clear(&mut self) {
        match self {
            Builder::Fixed { data, .. } | Builder::Strings { data, .. } => data.clear(),
            Builder::Nullable { nulls, inner } => {
                nulls.clear();
                inner.clear();
            }
            Builder::Array {
                offsets,
                count,
                inner,
            } => {
                offsets.clear();
                *count = 0;
                inner.clear();
            }
            Builder::Map {
                offsets,
                count,
                keys,
                values,
            } => {
                offsets.clear();
                *count = 0;
                keys.clear();
                values.clear();
            }
            Builder::Tuple { elements, .. } => elements.iter_mut().for_each(Builder::clear),
            Builder::Unchecked { .. } => {}
        }
    }

    /// Reads one value at the cursor into the column.
    pub fn push(&mut self, c: &mut Cursor<'_>) -> Result<(), Refusal> {
        let composite = matches!(
            self,
            Builder::Array { .. } | Builder::Map { .. } | Builder::Tuple { .. }
        );
        if composite && c.peek() == Some(b'n') {
            c.token()?;
            return Err(null_refusal());
        }
        // An array or object of a composite type opens a level (a String's or an unchecked
        // type's is counted by `skip`).
        c.depth += usize::from(composite);
        let read = self.push_value(c);
        c.depth -= usize::from(composite);
        read
    }

    fn push_value(&mut self, c: &mut Cursor<'_>) -> Result<(), Refusal> {
        match self {
            Builder::Unchecked { takes_null, .. } => {
                let text = c.skip()?;
                if text == b"null" && !*takes_null {
                    return Err(null_refusal());
                }
                Ok(())
            }
            Builder::Nullable { nulls, inner } => {
                if c.peek() == Some(b'n') {
                    c.token()?;
                    nulls.push(1);
                    inner.push_default();
                } else {
                    nulls.push(0);
                    inner.push(c)?;
                }
                Ok(())
            }
            Builder::Array { .. } | Builder::Map { .. } | Builder::Tuple { .. } => {
                self.push_container(c)
            }
            #[cfg(feature = "speed")]
            Builder::Strings { data, zoned: None } if c.peek() == Some(b'"') => {
                // The common case, without a token: a string into a String column.
                let (content, _) = c.string()?;
                write_string(data, &content);
                Ok(())
            }
            #[cfg(feature = "speed")]
            Builder::Fixed {
                kind: Scalar::Int { signed, bits },
                data,
            } if *bits <= 64 => {
                // The common case, read as the digits go by: a plain JSON integer that fits.
                if let Some(n) = c.small_integer(*signed, *bits) {
                    data.extend_from_slice(&n.to_le_bytes()[..usize::from(*bits) / 8]);
                    return Ok(());
                }
                self.push_scalar(c)
            }
            #[cfg(feature = "speed")]
            Builder::Fixed { kind, data } if c.peek() == Some(b'"') => {
                // A string into a column of single values, without a token.
                let (content, text) = c.string()?;
                kind.read_text(&content, text, true, data)
            }
            Builder::Fixed { .. } | Builder::Strings { .. } => self.push_scalar(c),
        }
    }

    /// An array, map or tuple value at the cursor.
    fn push_container(&mut self, c: &mut Cursor<'_>) -> Result<(), Refusal> {
        match self {
            Builder::Array {
                offsets,
                count,
                inner,
            } => {
                if !c.eat(b'[') {
                    return Err(c.shape("not an array"));
                }
                c.each(b']', |c| {
                    *count += 1;
                    inner.push(c)
                })?;
                offsets.extend_from_slice(&count.to_le_bytes());
                Ok(())
            }
            Builder::Map {
                offsets,
                count,
                keys,
                values,
            } => {
                if !c.eat(b'{') {
                    return Err(c.shape("not an object"));
                }
                c.each(b'}', |c| {
                    let (key, text) = c.key()?;
                    keys.push_token(Token::Str(key, text))?;
                    *count += 1;
                    values.push(c)
                })?;
                offsets.extend_from_slice(&count.to_le_bytes());
                Ok(())
            }
            Builder::Tuple { names, elements } => push_tuple(names, elements, c),
            _ => unreachable!("containers only"),
        }
    }

    /// A single value (not an array or object, except into a String column) at the cursor.
    fn push_scalar(&mut self, c: &mut Cursor<'_>) -> Result<(), Refusal> {
        if matches!(c.peek(), Some(b'[' | b'{')) {
            let text = c.skip()?;
            if let Builder::Strings { data, zoned: None } = self {
                // A String column keeps an array's or object's text as it is.
                write_string(data, text);
                return Ok(());
            }
            return Err(refuse(
                text,
                "an array or object, for a column of single values",
            ));
        }
        let token = c.token()?;
        self.push_token(token)
    }

    /// A scalar value read as `token`.
    fn push_token(&mut self, token: Token<'_>) -> Result<(), Refusal> {
        match self {
            Builder::Strings { data, zoned: None } => {
                match token {
                    Token::Str(content, _) => write_string(data, &content),
                    Token::Number(text) => write_string(data, text),
                    Token::Bool(b) => write_string(data, if b { b"true" } else { b"false" }),
                    Token::Null => return Err(null_refusal()),
                    Token::Open => unreachable!("arrays and objects are read by push"),
                }
                Ok(())
            }
            Builder::Strings {
                data,
                zoned: Some(kind),
            } => {
                let Scalar::DateTime { precision, .. } = *kind else {
                    unreachable!("zoned strings are date-times")
                };
                let moment = read_moment(&token, precision)?;
                in_range(moment, precision).map_err(|why| refuse(token_text(&token), why))?;
                let mut text = String::new();
                write_moment_text(&mut text, moment, precision.unwrap_or(0));
                write_string(data, text.as_bytes());
                Ok(())
            }
            Builder::Fixed { kind, data } => kind.read(token, data),
            Builder::Unchecked { .. }
            | Builder::Nullable { .. }
            | Builder::Array { .. }
            | Builder::Map { .. }
            | Builder::Tuple { .. } => {
                // Map keys only: a key is a string, which no composite takes.
                match token {
                    Token::Str(_, text) => {
                        Err(refuse(text, "a string, for a column of composite values"))
                    }
                    _ => Err(refuse(b"", "a value of another shape")),
                }
            }
        }
    }

    /// Reads one packed value into the column by the rules its JSON is read by
    /// ([`Packed::write_json`] read by [`Builder::push`]), the common cases straight in: a
    /// null into a `Nullable`, a string into a `String`, an integer into an integer column of
    /// up to 64 bits that holds it. Python's own values (a date-time, a `Decimal`, ...) are
    /// refused by `String` and `FixedString` columns, as clickhouse-connect refuses them there.
    /// `scratch`: a buffer for the other cases' JSON text.
    #[cfg(feature = "speed")]
    // (The integer case writes into its column: a match guard may not.)
    #[allow(clippy::collapsible_match)]
    pub fn push_packed(&mut self, v: Packed<'_>, scratch: &mut Vec<u8>) -> Result<(), Refusal> {
        match (&mut *self, v) {
            (Builder::Nullable { nulls, inner }, Packed::Null) => {
                nulls.push(1);
                inner.push_default();
                return Ok(());
            }
            (Builder::Nullable { .. }, Packed::Json(t)) if t.trim_ascii() == b"null" => {
                // A nested value that is JSON's null is NULL, as in a JSON row.
                return self.push_packed(Packed::Null, scratch);
            }
            (Builder::Nullable { nulls, inner }, v) => {
                nulls.push(0);
                return inner.push_packed(v, scratch);
            }
            (Builder::Strings { data, zoned: None }, Packed::Str(s) | Packed::Bytes(s)) => {
                write_string(data, s);
                return Ok(());
            }
            (Builder::Fixed { kind, data }, Packed::Str(s)) => {
                // A string into a column of single values, as the JSON reader's fast path
                // reads one; a refusal is read again below, for the JSON's own message.
                let len = data.len();
                if kind.read_text(s, s, true, data).is_ok() {
                    return Ok(());
                }
                data.truncate(len);
            }
            (
                Builder::Strings { zoned: None, .. }
                | Builder::Fixed {
                    kind: Scalar::FixedString(_),
                    ..
                },
                Packed::Std(tag, text),
            ) => {
                let why = format!(
                    "{}, for a column of strings (give its text, a str)",
                    tag.name()
                );
                return Err(refuse(text, why));
            }
            (
                Builder::Fixed {
                    kind: Scalar::Int { signed, bits },
                    data,
                },
                Packed::Int(_) | Packed::Uint(_),
            ) if *bits <= 64 => {
                if push_fitting_integer(*signed, *bits, v, data) {
                    return Ok(());
                }
            }
            (_, Packed::Float(f)) if !f.is_finite() => {
                let text = if f.is_nan() { "NaN" } else { "an infinity" };
                let why =
                    "NaN or an infinity, which the sink does not send (JSON has no text for it)";
                return Err(refuse(text.as_bytes(), why));
            }
            _ => {}
        }
        scratch.clear();
        v.write_json(scratch);
        let mut c = Cursor::new(scratch);
        // Inside a row's object, as a JSON row's values are.
        c.depth = 1;
        self.push(&mut c)?;
        if !c.at_end() {
            return Err(c.malformed());
        }
        Ok(())
    }

    /// A default value (under a null of a Nullable column).
    fn push_default(&mut self) {
        match self {
            Builder::Fixed { kind, data } => {
                data.resize(data.len() + kind.width(), 0);
            }
            Builder::Strings { data, .. } => data.push(0),
            Builder::Nullable { nulls, inner } => {
                nulls.push(1);
                inner.push_default();
            }
            Builder::Array { offsets, count, .. } | Builder::Map { offsets, count, .. } => {
                offsets.extend_from_slice(&count.to_le_bytes());
            }
            Builder::Tuple { elements, .. } => elements.iter_mut().for_each(Builder::push_default),
            Builder::Unchecked { .. } => {}
        }
    }

    /// Writes the column's values in the Native layout.
    pub fn write(&self, out: &mut Vec<u8>) {
        match self {
            Builder::Fixed { data, .. } | Builder::Strings { data, .. } => {
                out.extend_from_slice(data)
            }
            Builder::Nullable { nulls, inner } => {
                out.extend_from_slice(nulls);
                inner.write(out);
            }
            Builder::Array { offsets, inner, .. } => {
                out.extend_from_slice(offsets);
                inner.write(out);
            }
            Builder::Map {
                offsets,
                keys,
                values,
                ..
            } => {
                out.extend_from_slice(offsets);
                keys.write(out);
                values.write(out);
            }
            Builder::Tuple { elements, .. } => elements.iter().for_each(|e| e.write(out)),
            Builder::Unchecked { .. } => {}
        }
    }

    /// Bytes held.
    pub fn size(&self) -> usize {
        match self {
            Builder::Fixed { data, .. } | Builder::Strings { data, .. } => data.len(),
            Builder::Nullable { nulls, inner } => nulls.len() + inner.size(),
            Builder::Array { offsets, inner, .. } => offsets.len() + inner.size(),
            Builder::Map {
                offsets,
                keys,
                values,
                ..
            } => offsets.len() + keys.size() + values.size(),
            Builder::Tuple { elements, .. } => elements.iter().map(Builder::size).sum(),
            Builder::Unchecked { .. } => 0,
        }
    }
}

/// A packed integer into an integer column of `bits` (at most 64), if the column holds it;
/// `false`: it does not (the general reading refuses it, saying why).
#[cfg(feature = "speed")]
fn push_fitting_integer(signed: bool, bits: u16, v: Packed<'_>, data: &mut Vec<u8>) -> bool {
    // (Shifts of 64 bits, not 128: wasm32 has no 128-bit arithmetic.)
    let fits = match (v, signed) {
        // The bits past the column's are copies of its sign bit.
        (Packed::Int(i), true) => bits == 64 || (i >> (bits - 1)) == (i >> 63),
        (Packed::Int(i), false) => i >= 0 && (bits == 64 || (i as u64) >> bits == 0),
        (Packed::Uint(u), false) => bits == 64 || u >> bits == 0,
        // (A `Uint` is above i64::MAX, past every signed column of 64 bits or fewer.)
        _ => false,
    };
    let n = match v {
        Packed::Int(i) => i as u64,
        Packed::Uint(u) => u,
        _ => return false,
    };
    if fits {
        data.extend_from_slice(&n.to_le_bytes()[..usize::from(bits) / 8]);
    }
    fits
}

/// A tuple's value: an array of its elements in order, or (its elements named) an object of
/// every element by name.
fn push_tuple(
    names: &[Option<String>],
    elements: &mut [Builder],
    c: &mut Cursor<'_>,
) -> Result<(), Refusal> {
    let start = c.at;
    if c.eat(b'[') {
        for (n, element) in elements.iter_mut().enumerate() {
            if n > 0 && !c.eat(b',') {
                return Err(refuse(&c.s[start..], TUPLE_SIZE));
            }
            element.push(c)?;
        }
        if !c.eat(b']') {
            return Err(refuse(&c.s[start..], TUPLE_SIZE));
        }
        return Ok(());
    }
    if !c.eat(b'{') || names.iter().any(Option::is_none) {
        return Err(c.shape("not an array (or, for a tuple whose elements are named, an object)"));
    }
    let mut seen = vec![false; names.len()];
    c.each(b'}', |c| {
        let (key, _) = c.key()?;
        let Some(n) = names
            .iter()
            .position(|name| name.as_deref().map(str::as_bytes) == Some(&key[..]))
        else {
            return Err(refuse(
                &c.s[start..],
                "a key that names no element of the tuple",
            ));
        };
        if std::mem::replace(&mut seen[n], true) {
            return Err(refuse(&c.s[start..], "an element named twice"));
        }
        elements[n].push(c)
    })?;
    if seen.contains(&false) {
        return Err(refuse(
            &c.s[start..c.at],
            "missing an element of the tuple (the server would store its default)",
        ));
    }
    Ok(())
}

/// A row whose keys are not the block's columns: every key of the row, or why it stops being
/// JSON.
fn keys_refusal(row: &[u8]) -> RowRefusal {
    match object_keys_until(row) {
        (keys, None) => RowRefusal::Keys(keys),
        (_, Some(refusal)) => RowRefusal::Shape(refusal),
    }
}

/// A null where the type takes none (the type is named by the caller's message).
fn null_refusal() -> Refusal {
    refuse(
        b"null",
        "not allowed: the column is not Nullable (the server would store a default such as 0 or '')",
    )
}

fn write_varuint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn write_string(out: &mut Vec<u8>, bytes: &[u8]) {
    write_varuint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A date-time column's value from its token.
fn read_moment(token: &Token<'_>, precision: Option<u8>) -> Result<Moment, Refusal> {
    let p = precision.unwrap_or(0);
    match token {
        Token::Number(text) => scalars::moment(text, p, true).map_err(|why| refuse(text, why)),
        Token::Str(content, text) => {
            scalars::moment(content, p, false).map_err(|why| refuse(text, why))
        }
        Token::Bool(_) => Err(refuse(b"true/false", scalars::MOMENT_SHAPE)),
        Token::Null => Err(null_refusal()),
        Token::Open => Err(refuse(b"", scalars::MOMENT_SHAPE)),
    }
}

/// A moment's ticks, if its type holds it: `DateTime` (precision `None`) from 1970-01-01
/// 00:00:00 to 2106-02-07 06:28:15 UTC, `DateTime64` from 1900-01-01 00:00:00 to 2299-12-31
/// 23:59:59.9... A wall-clock time (of a zone the sink has no rules for, sent as text) must be
/// a day inside those bounds: which instant it is depends on the zone's offset, and the
/// server's conversion clamps one past the range without an error (measured: `1970-01-01
/// 08:59:59` into `DateTime('Asia/Tokyo')` is stored as 09:00:00).
fn in_range(moment: Moment, precision: Option<u8>) -> Result<i64, Why> {
    let (ticks, margin) = match moment {
        Moment::Instant(ticks) => (ticks, 0),
        Moment::Local(ticks) => (ticks, 86_400),
    };
    let near = || -> Why {
        "too near the edge of the type's range for a column whose zone the sink has no rules for (within a day: the server would clamp it)".into()
    };
    match precision {
        None if (0..=i64::from(u32::MAX)).contains(&ticks) => {
            if (margin..=i64::from(u32::MAX) - margin).contains(&ticks) {
                Ok(ticks)
            } else {
                Err(near())
            }
        }
        None => Err(
            "out of the range of DateTime (1970-01-01 00:00:00 to 2106-02-07 06:28:15 UTC)".into(),
        ),
        Some(p) => {
            let scale = 10i64.pow(u32::from(p));
            let secs = ticks.div_euclid(scale);
            if !(DATETIME64_RANGE.0..=DATETIME64_RANGE.1).contains(&secs) {
                Err(scalars::DATETIME64_RANGE_TEXT.into())
            } else if !(DATETIME64_RANGE.0 + margin..=DATETIME64_RANGE.1 - margin).contains(&secs)
                // DateTime64(9)'s range ends at its last 64-bit tick, before 2299.
                || ticks.checked_add(margin * scale).is_none()
            {
                Err(near())
            } else {
                Ok(ticks)
            }
        }
    }
}

/// The text a scalar token was written as, for a message.
fn token_text<'t>(token: &'t Token<'_>) -> &'t [u8] {
    match token {
        Token::Number(t) | Token::Str(_, t) => t,
        Token::Null => b"null",
        Token::Bool(true) => b"true",
        Token::Bool(false) => b"false",
        Token::Open => b"",
    }
}

/// A moment as the text a zoned column is sent as: a wall-clock time as
/// `YYYY-MM-DD hh:mm:ss[.f]`, an instant as a Unix time `[-]s[.f]`.
fn write_moment_text(out: &mut String, moment: Moment, precision: u8) {
    let scale = 10i64.pow(u32::from(precision));
    match moment {
        Moment::Instant(ticks) => {
            let sign = if ticks < 0 { "-" } else { "" };
            let t = ticks.unsigned_abs();
            let scale = scale.unsigned_abs();
            let _ = write!(out, "{sign}{}", t / scale);
            if precision > 0 {
                let _ = write!(
                    out,
                    ".{:0width$}",
                    t % scale,
                    width = usize::from(precision)
                );
            }
        }
        Moment::Local(ticks) => {
            let secs = ticks.div_euclid(scale);
            let frac = ticks.rem_euclid(scale);
            let days = secs.div_euclid(86_400);
            let of_day = secs.rem_euclid(86_400);
            let (y, m, d) = scalars::civil_from_days(days);
            let _ = write!(
                out,
                "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
                of_day / 3600,
                of_day / 60 % 60,
                of_day % 60
            );
            if precision > 0 {
                let _ = write!(out, ".{frac:0width$}", width = usize::from(precision));
            }
        }
    }
}

/// Days of the first and last dates `Date` and `Date32` hold (1970-01-01 to 2149-06-06;
/// 1900-01-01 to 2299-12-31).
const DATE_RANGE: (i64, i64) = (0, 65_535);
const DATE32_RANGE: (i64, i64) = (-25_567, 120_529);
/// Seconds of the first and last instants `DateTime64` holds (1900-01-01 00:00:00 to
/// 2299-12-31 23:59:59).
const DATETIME64_RANGE: (i64, i64) = (-2_208_988_800, 10_413_791_999);

impl Scalar {
    fn width(&self) -> usize {
        match self {
            Scalar::Int { bits, .. } => usize::from(*bits) / 8,
            Scalar::Float { wide } => {
                if *wide {
                    8
                } else {
                    4
                }
            }
            Scalar::Bool => 1,
            Scalar::Decimal { precision, .. } => decimal_width(*precision),
            Scalar::FixedString(n) => *n as usize,
            Scalar::Uuid | Scalar::Ipv6 => 16,
            Scalar::Ipv4 => 4,
            Scalar::Date { wide } => {
                if *wide {
                    4
                } else {
                    2
                }
            }
            Scalar::DateTime { precision, .. } => {
                if precision.is_some() {
                    8
                } else {
                    4
                }
            }
            Scalar::Enum { wide, .. } => {
                if *wide {
                    2
                } else {
                    1
                }
            }
        }
    }

    /// Reads `token` as this kind's value into `data`.
    fn read(&self, token: Token<'_>, data: &mut Vec<u8>) -> Result<(), Refusal> {
        // The text a scalar is read from: a number's, or a string's content; `text` is the
        // value as written, for the message.
        let (content, text, quoted): (&[u8], &[u8], bool) = match &token {
            Token::Number(t) => (t, t, false),
            Token::Str(c, t) => (c, t, true),
            Token::Bool(b) => {
                let word: &[u8] = if *b { b"true" } else { b"false" };
                return match self {
                    Scalar::Int { .. } | Scalar::Float { .. } | Scalar::Bool => {
                        let one = u8::from(*b);
                        match self {
                            Scalar::Float { wide: true } => {
                                data.extend_from_slice(&f64::from(one).to_le_bytes())
                            }
                            Scalar::Float { wide: false } => {
                                data.extend_from_slice(&f32::from(one).to_le_bytes())
                            }
                            _ => {
                                data.push(one);
                                data.resize(data.len() + self.width() - 1, 0);
                            }
                        }
                        Ok(())
                    }
                    _ => Err(refuse(word, "true or false, for a column of another type")),
                };
            }
            Token::Null => return Err(null_refusal()),
            Token::Open => unreachable!("arrays and objects are read by push"),
        };
        self.read_text(content, text, quoted, data)
    }

    /// Reads a value's text (`quoted`: a string's content; `text`: the value as written, for
    /// the message) as this kind's value into `data`, by the kind's family.
    fn read_text(
        &self,
        content: &[u8],
        text: &[u8],
        quoted: bool,
        data: &mut Vec<u8>,
    ) -> Result<(), Refusal> {
        match self {
            Scalar::Int { .. } | Scalar::Float { .. } | Scalar::Bool | Scalar::Decimal { .. } => {
                self.read_number(content, quoted, data)
            }
            Scalar::Date { .. } | Scalar::DateTime { .. } => self.read_time(content, quoted, data),
            Scalar::FixedString(_)
            | Scalar::Uuid
            | Scalar::Ipv4
            | Scalar::Ipv6
            | Scalar::Enum { .. } => self.read_text_kind(content, quoted, data),
        }
        .map_err(|why| refuse(text, why))
    }

    /// Integers, floats, booleans and decimals.
    fn read_number(&self, content: &[u8], quoted: bool, data: &mut Vec<u8>) -> Result<(), Why> {
        match self {
            Scalar::Int { signed, bits } => {
                let n = scalars::integer(content, *signed, *bits)?;
                write_wide(data, &n, usize::from(*bits) / 8);
            }
            Scalar::Float { wide } => {
                let v = scalars::float(content, *wide)?;
                if *wide {
                    data.extend_from_slice(&v.to_le_bytes());
                } else {
                    data.extend_from_slice(&(v as f32).to_le_bytes());
                }
            }
            Scalar::Bool => {
                // The server takes true/false and the numbers 0 and 1, not strings.
                match (quoted, content) {
                    (false, b"0") => data.push(0),
                    (false, b"1") => data.push(1),
                    _ => return Err("not a boolean (true, false, 0 or 1)".into()),
                }
            }
            Scalar::Decimal { precision, scale } => {
                let n = scalars::decimal(content, *precision, *scale)?;
                write_wide(data, &n, decimal_width(*precision));
            }
            _ => unreachable!("numbers only"),
        }
        Ok(())
    }

    /// Dates and date-times.
    fn read_time(&self, content: &[u8], quoted: bool, data: &mut Vec<u8>) -> Result<(), Why> {
        match self {
            Scalar::Date { wide } => {
                if !quoted {
                    return Err("not a date (a string YYYY-MM-DD)".into());
                }
                let days = scalars::date(content)?;
                let (lo, hi) = if *wide { DATE32_RANGE } else { DATE_RANGE };
                if days < lo || days > hi {
                    return Err(if *wide {
                        "out of the range of Date32 (1900-01-01 to 2299-12-31)".into()
                    } else {
                        "out of the range of Date (1970-01-01 to 2149-06-06)".into()
                    });
                }
                if *wide {
                    data.extend_from_slice(&(days as i32).to_le_bytes());
                } else {
                    data.extend_from_slice(&(days as u16).to_le_bytes());
                }
            }
            Scalar::DateTime {
                precision,
                text: how,
            } => {
                let moment = scalars::moment(content, precision.unwrap_or(0), !quoted)?;
                if let (Moment::Instant(_), TimeText::Json, true) = (moment, how, quoted) {
                    return Err("a date and time with a zone or offset, which the server's JSON reader does not take as it is (this table is sent as JSONEachRow): send it as a Unix time or without the zone".into());
                }
                // A wall-clock time in UTC is its instant.
                let instant = match moment {
                    Moment::Local(t) if *how == TimeText::Binary => Moment::Instant(t),
                    m => m,
                };
                let ticks = in_range(instant, *precision)?;
                if precision.is_some() {
                    data.extend_from_slice(&ticks.to_le_bytes());
                } else {
                    data.extend_from_slice(&(ticks as u32).to_le_bytes());
                }
            }
            _ => unreachable!("dates and times only"),
        }
        Ok(())
    }

    /// Fixed strings, UUIDs, addresses and Enum elements: values written as strings.
    fn read_text_kind(&self, content: &[u8], quoted: bool, data: &mut Vec<u8>) -> Result<(), Why> {
        let string = |what: &'static str| if quoted { Ok(()) } else { Err(Why::from(what)) };
        match self {
            Scalar::FixedString(n) => {
                string("not a string")?;
                if content.len() > *n as usize {
                    return Err("longer than the FixedString holds".into());
                }
                data.extend_from_slice(content);
                data.resize(data.len() + *n as usize - content.len(), 0);
            }
            Scalar::Uuid => {
                string("not a UUID (a string)")?;
                data.extend_from_slice(&scalars::uuid(content)?);
            }
            Scalar::Ipv4 => {
                string("not an IPv4 address (a string a.b.c.d)")?;
                data.extend_from_slice(&scalars::ipv4(content)?.to_le_bytes());
            }
            Scalar::Ipv6 => {
                string("not an IPv6 address (a string)")?;
                data.extend_from_slice(&scalars::ipv6(content)?);
            }
            Scalar::Enum { wide, values } => {
                let by_name = quoted
                    .then(|| values.iter().find(|(n, _)| n[..] == *content))
                    .flatten();
                let value = match by_name {
                    Some((_, v)) => *v,
                    None => {
                        let number = std::str::from_utf8(content)
                            .ok()
                            .and_then(|t| t.parse::<i16>().ok());
                        match number.filter(|n| values.iter().any(|(_, v)| v == n)) {
                            Some(n) => n,
                            None => return Err("not an element of the Enum".into()),
                        }
                    }
                };
                if *wide {
                    data.extend_from_slice(&value.to_le_bytes());
                } else {
                    data.push(value as i8 as u8);
                }
            }
            _ => unreachable!("values written as strings only"),
        }
        Ok(())
    }
}

fn decimal_width(precision: u8) -> usize {
    match precision {
        0..=9 => 4,
        10..=18 => 8,
        19..=38 => 16,
        _ => 32,
    }
}

fn write_wide(data: &mut Vec<u8>, n: &Wide, bytes: usize) {
    for (i, limb) in n.iter().enumerate() {
        let from = i * 8;
        if from >= bytes {
            break;
        }
        let le = limb.to_le_bytes();
        data.extend_from_slice(&le[..(bytes - from).min(8)]);
    }
}

/// The type a column is sent as in a Native block: the table's, except that
/// `LowCardinality(T)` goes as T (the server converts it) and a date-time column whose zone
/// is not UTC goes as `String` (the server reads the text in the column's zone).
pub fn wire_type(ty: &Type, encoding: Encoding<'_>) -> Type {
    let zoned = |zone: &Option<String>| !is_utc(zone.as_deref().unwrap_or(encoding.server_zone));
    match ty {
        Type::LowCardinality(t) => wire_type(t, encoding),
        Type::DateTime(zone) | Type::DateTime64(_, zone) if zoned(zone) => Type::String,
        Type::Nullable(t) => Type::Nullable(Box::new(wire_type(t, encoding))),
        Type::Array(t) => Type::Array(Box::new(wire_type(t, encoding))),
        Type::Map(k, v) => Type::Map(
            Box::new(wire_type(k, encoding)),
            Box::new(wire_type(v, encoding)),
        ),
        Type::Tuple(e) => Type::Tuple(
            e.iter()
                .map(|(n, t)| (n.clone(), wire_type(t, encoding)))
                .collect(),
        ),
        Type::Nested(e) => Type::Nested(
            e.iter()
                .map(|(n, t)| (n.clone(), wire_type(t, encoding)))
                .collect(),
        ),
        Type::SimpleAggregateFunction(f, t) => {
            Type::SimpleAggregateFunction(f.clone(), Box::new(wire_type(t, encoding)))
        }
        t => t.clone(),
    }
}

/// A block of rows being read: a builder per column.
#[derive(Clone, Debug)]
pub struct Block {
    columns: Vec<BlockColumn>,
    rows: u64,
    /// Which columns a row that left the guessed order has named so far.
    seen: Vec<bool>,
    /// The column each key of the last whole row that left the guessed order named, by
    /// place: the guess for the next rows (empty: the columns' own order).
    order: Vec<usize>,
    /// The columns the row being read has named, once it left the guessed order.
    named: Vec<usize>,
}

#[derive(Clone, Debug)]
struct BlockColumn {
    name: String,
    /// Its key as a compact row writes it (`"name"`), for a quick compare.
    key: Vec<u8>,
    wire: String,
    builder: Builder,
}

/// Why a row was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowRefusal {
    /// A value refused: its column's index in the block, and why.
    Value {
        /// The column's index in the block.
        column: usize,
        /// Why.
        refusal: Refusal,
    },
    /// The row's keys are not the block's columns: every key of the row, in its order.
    Keys(Vec<Vec<u8>>),
    /// The row is not one JSON object.
    Shape(Refusal),
}

impl Block {
    /// A block for these columns (name and table type), in the order rows write them.
    pub fn new<'t>(
        columns: impl IntoIterator<Item = (&'t str, &'t Type)>,
        encoding: Encoding<'_>,
    ) -> Block {
        Block {
            columns: columns
                .into_iter()
                .map(|(name, ty)| {
                    // The key as JSON writes it (escaped), so the quick compare of a row's
                    // key text never takes a quote or backslash of the name as the key's end.
                    let mut key = Vec::new();
                    write_json_string(&mut key, name.as_bytes());
                    BlockColumn {
                        name: name.to_string(),
                        key,
                        wire: wire_type(ty, encoding).to_string(),
                        builder: Builder::new(ty, encoding),
                    }
                })
                .collect(),
            rows: 0,
            seen: Vec::new(),
            order: Vec::new(),
            named: Vec::new(),
        }
    }

    /// Rows read.
    #[cfg(test)]
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Bytes held.
    pub fn size(&self) -> usize {
        self.columns.iter().map(|c| c.builder.size()).sum()
    }

    /// Empties the block, keeping its allocations.
    pub fn clear(&mut self) {
        self.rows = 0;
        self.columns.iter_mut().for_each(|c| c.builder.clear());
    }

    /// Reads one row, a JSON object whose keys are the block's columns (in any order; in the
    /// columns' order is the quick case), each value into its column. On a refusal the block
    /// is left part-read: clear it.
    pub fn push_row(&mut self, row: &[u8]) -> Result<(), RowRefusal> {
        let mut c = Cursor::new(row);
        if !c.eat(b'{') {
            return Err(RowRefusal::Shape(refuse(row, "not a JSON object")));
        }
        c.depth = 1;
        // Keys read so far, and whether they follow the guessed order ([`Block::key_column`]).
        let mut read = 0;
        let mut guessing = true;
        let shape = RowRefusal::Shape;
        if !c.eat(b'}') {
            loop {
                let n = self.key_column(&mut c, row, read, &mut guessing)?;
                read += 1;
                self.columns[n]
                    .builder
                    .push(&mut c)
                    .map_err(|refusal| RowRefusal::Value { column: n, refusal })?;
                if c.eat(b'}') {
                    break;
                }
                if !c.eat(b',') {
                    return Err(shape(c.malformed()));
                }
            }
        }
        if !c.at_end() {
            return Err(shape(c.malformed()));
        }
        if read != self.columns.len() {
            return Err(keys_refusal(row));
        }
        if !guessing {
            // The next row's guess: this row's order.
            std::mem::swap(&mut self.order, &mut self.named);
        }
        self.rows += 1;
        Ok(())
    }

    /// Reads one packed row ([`super::packed`]) whose keys are the block's columns, in any
    /// order: `columns` maps each of the send's keys to its column. On a refusal the block is
    /// left part-read: clear it.
    #[cfg(feature = "speed")]
    pub fn push_packed_row(
        &mut self,
        row: &[u8],
        keys: &[Vec<u8>],
        columns: &[Option<usize>],
        scratch: &mut Vec<u8>,
    ) -> Result<(), RowRefusal> {
        let keys_refusal = || match packed::row_keys(row, keys) {
            (_, Some(malformed)) => RowRefusal::Shape(malformed),
            (keys, None) => RowRefusal::Keys(keys),
        };
        let mut r = packed::Reader::new(row);
        let count = r.varuint().map_err(RowRefusal::Shape)?;
        if count != self.columns.len() {
            return Err(keys_refusal());
        }
        self.seen.clear();
        self.seen.resize(count, false);
        for _ in 0..count {
            let key = r.varuint().map_err(RowRefusal::Shape)?;
            let n = match columns.get(key) {
                Some(&Some(n)) if !self.seen[n] => n,
                Some(_) => return Err(keys_refusal()),
                None => {
                    return Err(RowRefusal::Shape(packed::malformed(
                        "a key index past the keys",
                    )))
                }
            };
            self.seen[n] = true;
            let value =
                r.value()
                    .map_err(|refusal| match refusal.reason.starts_with("packed") {
                        true => RowRefusal::Shape(refusal),
                        false => RowRefusal::Value { column: n, refusal },
                    })?;
            self.columns[n]
                .builder
                .push_packed(value, scratch)
                .map_err(|refusal| RowRefusal::Value { column: n, refusal })?;
        }
        if !r.at_end() {
            return Err(RowRefusal::Shape(packed::malformed(
                "bytes after its values",
            )));
        }
        self.rows += 1;
        Ok(())
    }

    /// The column named `key`, if the block has it.
    #[cfg(feature = "speed")]
    pub fn column_index(&self, key: &[u8]) -> Option<usize> {
        self.columns.iter().position(|c| c.name.as_bytes() == key)
    }

    /// The column the key at the cursor names (its colon read), `read` keys into `row`. The
    /// key is first guessed to name the column the same place named in the last whole row
    /// (`order`; empty: the columns' own order), and compared with that column's key text
    /// alone. While the keys follow the guess (`guessing`), `seen` is not kept: that row named
    /// every column once, so following it names none twice. Once a key leaves it, keys are
    /// looked up, and a column named twice is refused.
    fn key_column(
        &mut self,
        c: &mut Cursor<'_>,
        row: &[u8],
        read: usize,
        guessing: &mut bool,
    ) -> Result<usize, RowRefusal> {
        c.space();
        let rest = c.rest();
        let guess = self.order.get(read).copied().unwrap_or(read);
        // (An inline compare: a call to the guest's `memcmp` per key costs more.)
        let quick = *guessing
            && self.columns.get(guess).is_some_and(|column| {
                rest.len() >= column.key.len() && column.key.iter().zip(rest).all(|(a, b)| a == b)
            });
        if quick {
            c.at += self.columns[guess].key.len();
            if !c.eat(b':') {
                return Err(RowRefusal::Shape(c.malformed()));
            }
            return Ok(guess);
        }
        let (key, _) = c.key().map_err(RowRefusal::Shape)?;
        let n = self
            .columns
            .iter()
            .position(|column| column.name.as_bytes() == &key[..])
            .ok_or_else(|| keys_refusal(row))?;
        if std::mem::replace(guessing, false) {
            self.seen.clear();
            self.seen.resize(self.columns.len(), false);
            self.named.clear();
            for k in 0..read {
                let named = self.order.get(k).copied().unwrap_or(k);
                self.seen[named] = true;
                self.named.push(named);
            }
        }
        if std::mem::replace(&mut self.seen[n], true) {
            return Err(keys_refusal(row));
        }
        self.named.push(n);
        Ok(n)
    }

    /// The block in the Native format: the column and row counts, then each column's name,
    /// type and values.
    pub fn write(&self, out: &mut Vec<u8>) {
        write_varuint(out, self.columns.len() as u64);
        write_varuint(out, self.rows);
        for column in &self.columns {
            write_string(out, column.name.as_bytes());
            write_string(out, column.wire.as_bytes());
            column.builder.write(out);
        }
    }

    /// Whether the block's columns are `names`, in this order.
    pub fn has_columns(&self, names: &[String]) -> bool {
        self.columns.len() == names.len()
            && self.columns.iter().zip(names).all(|(c, n)| c.name == *n)
    }

    /// A column's name.
    pub fn column_name(&self, n: usize) -> &str {
        &self.columns[n].name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UTC: Encoding<'static> = Encoding {
        server_zone: "UTC",
        json: false,
    };

    fn block(columns: &[(&str, &str)]) -> Block {
        let types: Vec<(String, Type)> = columns
            .iter()
            .map(|(n, t)| (n.to_string(), Type::parse(t).unwrap()))
            .collect();
        Block::new(types.iter().map(|(n, t)| (n.as_str(), t)), UTC)
    }

    fn native(columns: &[(&str, &str)], rows: &[&str]) -> Vec<u8> {
        let mut b = block(columns);
        for row in rows {
            b.push_row(row.as_bytes())
                .unwrap_or_else(|e| panic!("{row}: {e:?}"));
        }
        let mut out = Vec::new();
        b.write(&mut out);
        out
    }

    #[test]
    fn a_number_running_on_into_a_sign_is_refused_as_one_text_on_every_path() {
        // A small integer column's quick reading stops where the general one does.
        for ty in ["Int32", "UInt8", "Int128"] {
            for value in ["1-2", "1+", "1+2", "1-", "-0-"] {
                let why = refusal(ty, value);
                assert!(why.contains("not a JSON number"), "{ty} {value}: {why}");
            }
        }
    }

    fn refusal(ty: &str, value: &str) -> String {
        let mut b = block(&[("v", ty)]);
        let row = format!("{{\"v\":{value}}}");
        match b.push_row(row.as_bytes()) {
            Ok(()) => panic!("{ty} accepted {value}"),
            Err(RowRefusal::Value { refusal, .. }) => refusal.reason.into_owned(),
            Err(e) => panic!("{ty}: {value} refused as a row: {e:?}"),
        }
    }

    fn accepts(ty: &str, value: &str) -> Vec<u8> {
        let mut b = block(&[("v", ty)]);
        let row = format!("{{\"v\":{value}}}");
        b.push_row(row.as_bytes())
            .unwrap_or_else(|e| panic!("{ty} refused {value}: {e:?}"));
        let mut out = Vec::new();
        b.columns[0].builder.write(&mut out);
        out
    }

    #[test]
    fn blocks_match_the_servers_own_bytes() {
        // The server's `SELECT ... FORMAT Native` of the same values.
        assert_eq!(
            crate::hex::hex(&native(
                &[("v", "UUID")],
                &[r#"{"v":"61f0c404-5cb3-11e7-907b-a6006ad3dba0"}"#]
            )),
            "010101760455554944e711b35c04c4f061a0dbd36a00a67b90"
        );
        assert_eq!(
            crate::hex::hex(&native(
                &[("v", "Map(String, UInt8)")],
                &[r#"{"v":{"a":1,"b":2}}"#]
            )),
            "01010176124d617028537472696e672c2055496e7438290200000000000000016101620102"
        );
        assert_eq!(
            crate::hex::hex(&native(&[("v", "Nullable(UInt8)")], &[r#"{"v":null}"#])),
            "010101760f4e756c6c61626c652855496e7438290100"
        );
        assert_eq!(
            crate::hex::hex(&native(&[("v", "Decimal(38, 2)")], &[r#"{"v":1.5}"#])),
            "010101760e446563696d616c2833382c20322996000000000000000000000000000000"
        );
        assert_eq!(
            crate::hex::hex(&native(&[("v", "IPv6")], &[r#"{"v":"2001:db8::1"}"#])),
            "01010176044950763620010db8000000000000000000000001"
        );
    }

    #[test]
    fn values_are_read_for_their_type() {
        assert_eq!(accepts("UInt16", "\"300\""), 300u16.to_le_bytes());
        assert_eq!(accepts("Int8", "true"), [1]);
        assert_eq!(accepts("Int128", "-1"), [0xff; 16]);
        assert_eq!(accepts("Float32", "0.1"), 0.1f32.to_le_bytes());
        assert_eq!(accepts("Bool", "1"), [1]);
        assert_eq!(accepts("FixedString(3)", "\"a\""), *b"a\0\0");
        assert_eq!(accepts("Date", "\"1970-01-02\""), [1, 0]);
        assert_eq!(accepts("Date32", "\"1969-12-31\""), (-1i32).to_le_bytes());
        assert_eq!(
            accepts("DateTime", "\"1970-01-01T00:00:01Z\""),
            1u32.to_le_bytes()
        );
        assert_eq!(
            accepts("DateTime", "\"1970-01-01T09:00:01+09:00\""),
            1u32.to_le_bytes()
        );
        assert_eq!(accepts("DateTime64(3)", "1.5"), 1500i64.to_le_bytes());
        assert_eq!(accepts("Enum8('a' = 1, 'b' = -2)", "\"b\""), [0xfe]);
        assert_eq!(accepts("Enum8('a' = 1, 'b' = -2)", "1"), [1]);
        assert_eq!(accepts("String", "{\"a\": [1, 2]}"), b"\x0d{\"a\": [1, 2]}");
        assert_eq!(accepts("String", "\"\\u00e9\\n\""), b"\x03\xc3\xa9\n");
        assert_eq!(accepts("String", "12.50"), b"\x0512.50");
        assert_eq!(
            accepts("Array(Nullable(UInt8))", "[1, null]"),
            [2, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0]
        );
        assert_eq!(
            accepts("Tuple(a UInt8, b String)", "{\"b\":\"x\",\"a\":7}"),
            [7, 1, b'x']
        );
        assert_eq!(accepts("Tuple(UInt8, String)", "[7, \"x\"]"), [7, 1, b'x']);
        assert_eq!(accepts("LowCardinality(String)", "\"x\""), [1, b'x']);
    }

    #[test]
    fn values_the_server_would_change_or_refuse_are_refused() {
        assert!(refusal("DateTime64(3)", "\"yesterday\"").starts_with("not a date and time"));
        assert!(refusal("Date", "\"2026-02-30\"").contains("February 2026 has 28 days"));
        assert!(refusal("DateTime", "\"2026-11-01 24:00:00\"").contains("time of day"));
        assert!(refusal("DateTime64(3)", "\"2026-01-01 10:00:61.000\"").contains("time of day"));
        assert!(refusal("Enum8('a' = 1)", "\"c\"").contains("not an element"));
        assert!(refusal("UInt8", "300").contains("range"));
        assert!(refusal("UInt8", "\"\"").contains("not an integer"));
        assert!(refusal("UInt8", "null").contains("not Nullable"));
        assert!(refusal("Array(UInt8)", "[1, null]").contains("not Nullable"));
        assert!(refusal("Array(UInt8)", "null").contains("not Nullable"));
        assert!(refusal("Map(String, UInt8)", "null").contains("not Nullable"));
        assert!(refusal("Float32", "1e-50").contains("stored as 0"));
        assert!(refusal("Decimal(5, 2)", "1.234").contains("scale"));
        assert!(refusal("Bool", "\"true\"").contains("boolean"));
        assert!(refusal("Tuple(a UInt8, b UInt8)", "{\"a\":1}").contains("missing"));
        assert!(refusal("Tuple(UInt8, UInt8)", "[1]").contains("as many values as the tuple"));
        assert!(refusal("Date", "\"1969-12-31\"").contains("range"));
        assert!(refusal("DateTime", "-1").contains("range"));
        assert!(refusal("DateTime", "1767225600.5").contains("fraction"));
        assert!(refusal("FixedString(2)", "\"abc\"").contains("longer"));
        assert!(refusal("UInt8", "[1]").contains("single values"));
        assert!(refusal("Map(UInt8, UInt8)", "{\"256\": 1}").contains("range"));
        assert!(refusal("String", "\"a\u{1}\"").contains("control"));
    }

    #[test]
    fn zoned_date_times_go_as_text_and_json_tables_keep_what_the_server_reads() {
        let berlin = Encoding {
            server_zone: "Europe/Berlin",
            json: false,
        };
        let ty = Type::parse("DateTime64(3)").unwrap();
        assert_eq!(wire_type(&ty, berlin).to_string(), "String");
        assert_eq!(wire_type(&ty, UTC).to_string(), "DateTime64(3)");
        let mut b = Builder::new(&ty, berlin);
        for v in [
            "\"2026-01-01T10:00:00.5\"",
            "\"1970-01-01T00:00:01Z\"",
            "-1.5",
            "\"2026-01-01\"",
        ] {
            b.push(&mut Cursor::new(v.as_bytes())).unwrap();
        }
        let mut out = Vec::new();
        b.write(&mut out);
        assert_eq!(
            out,
            b"\x172026-01-01 10:00:00.500\x051.000\x06-1.500\x172026-01-01 00:00:00.000"
        );
        let json = Encoding {
            server_zone: "UTC",
            json: true,
        };
        let mut b = Builder::new(&Type::parse("DateTime").unwrap(), json);
        assert!(b
            .push(&mut Cursor::new(b"\"2026-01-01T10:00:00Z\""))
            .is_err());
        assert!(b.push(&mut Cursor::new(b"\"2026-01-01 10:00:00\"")).is_ok());
        // DateTime64(9) ends at its last 64-bit tick: a wall-clock time within a day of it,
        // in a zone the sink has no rules for, is refused (its instant may be past it).
        let nine = Type::parse("DateTime64(9)").unwrap();
        let mut b = Builder::new(&nine, berlin);
        for v in ["\"2262-04-11 00:00:00\"", "\"2262-04-11 23:00:00\""] {
            let refused = b.push(&mut Cursor::new(v.as_bytes())).unwrap_err();
            assert!(
                refused.reason.contains("too near the edge"),
                "{}",
                refused.reason
            );
        }
        assert!(b.push(&mut Cursor::new(b"\"2262-04-09 23:00:00\"")).is_ok());
        let mut other = Builder::new(&Type::parse("JSON").unwrap(), json);
        assert!(other.push(&mut Cursor::new(b"null")).is_ok());
        let mut variant = Builder::new(&Type::parse("Point").unwrap(), json);
        assert!(variant.push(&mut Cursor::new(b"null")).is_err());
        assert!(variant
            .push(&mut Cursor::new(b"[1, [2, {\"a\": []}]]"))
            .is_ok());
    }

    #[test]
    fn keys_and_escapes_are_read_as_json_writes_them() {
        // A column name with a quote or a backslash: its key matches only as JSON escapes it.
        let mut b = block(&[("a\"b", "UInt8"), ("c\\", "UInt8")]);
        b.push_row(br#"{"a\"b":1,"c\\":2}"#).unwrap();
        b.push_row(br#"{"c\\":2,"a\u0022b":1}"#).unwrap();
        for bad in [&br#"{"a"b":1,"c\\":2}"#[..], br#"{"a\"b":1,"c\":2}"#] {
            assert!(b.push_row(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        // \u takes four hex digits, no sign.
        let mut b = block(&[("s", "String")]);
        assert!(b.push_row(br#"{"s":"\u0041"}"#).is_ok());
        for bad in [
            r#"{"s":"\u+041"}"#,
            r#"{"s":"\u-041"}"#,
            r#"{"s":"\u 041"}"#,
        ] {
            assert!(b.push_row(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn rows_name_the_columns_in_any_order() {
        let mut b = block(&[("a", "UInt8"), ("b", "String")]);
        b.push_row(br#"{"a":1,"b":"x"}"#).unwrap();
        b.push_row(b" { \"a\" : 2 , \"b\" : \"y\" } ").unwrap();
        b.push_row(br#"{"b":"z","a":3}"#).unwrap();
        let mut out = Vec::new();
        b.columns[0].builder.write(&mut out);
        assert_eq!(out, [1, 2, 3]);
        let e = b.push_row(br#"{"a":1,"b":5"#).unwrap_err();
        assert!(matches!(e, RowRefusal::Shape(_)), "{e:?}");
        let e = b.push_row(br#"{"a":1,"b":"x","c":2}"#).unwrap_err();
        assert_eq!(
            e,
            RowRefusal::Keys(vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()])
        );
        let e = b.push_row(br#"{"b":"x","a":300}"#).unwrap_err();
        assert!(matches!(e, RowRefusal::Value { column: 0, .. }), "{e:?}");
        assert_eq!(b.rows(), 3);
    }

    #[test]
    fn a_rows_order_of_keys_is_the_next_rows_guess_and_never_trusted() {
        let columns = [("a", "UInt8"), ("b", "UInt8"), ("c", "UInt8")];
        let mut b = block(&columns);
        for row in [
            r#"{"a":1,"b":2,"c":3}"#,
            r#"{"c":6,"b":5,"a":4}"#,
            r#"{"c":9,"b":8,"a":7}"#,
            r#"{"a":10,"c":12,"b":11}"#,
            r#"{"a":13,"c":15,"b":14}"#,
            r#"{"c":18,"a":16,"b":17}"#,
        ] {
            b.push_row(row.as_bytes()).unwrap();
        }
        for (n, want) in [
            [1, 4, 7, 10, 13, 16],
            [2, 5, 8, 11, 14, 17],
            [3, 6, 9, 12, 15, 18],
        ]
        .iter()
        .enumerate()
        {
            let mut out = Vec::new();
            b.columns[n].builder.write(&mut out);
            assert_eq!(out, want, "column {n}");
        }
        // Rows that follow a learned order (c, a, b), then name a column twice, leave one out
        // or name another: refused as keys, as in the columns' own order.
        for bad in [
            r#"{"c":1,"a":2,"c":3}"#,
            r#"{"c":1,"a":2}"#,
            r#"{"c":1,"a":2,"b":3,"b":4}"#,
            r#"{"c":1,"a":2,"d":3}"#,
            r#"{"c":1,"c":2,"b":3}"#,
        ] {
            let mut b = block(&columns);
            b.push_row(br#"{"c":0,"a":0,"b":0}"#).unwrap();
            let e = b.push_row(bad.as_bytes()).unwrap_err();
            assert!(matches!(e, RowRefusal::Keys(_)), "{bad}: {e:?}");
        }
    }

    #[test]
    fn civil_dates_round_trip() {
        for days in [-25_567, -1, 0, 1, 19_782, 65_535, 120_529] {
            let (y, m, d) = scalars::civil_from_days(days);
            assert_eq!(scalars::days_from_civil(y, m, d), days);
        }
    }
}
