//! ClickHouse column types as `DESCRIBE TABLE` prints them, parsed once into a tree: the one
//! type model of the sink. Where a null may go, how a value is read and how a column is
//! encoded all derive from it; printing a tree gives back the server's own text.
//!
//! The types the sink reads and encodes itself are variants; every other type (JSON, Dynamic,
//! Variant, Object, AggregateFunction, geo types, Time, Interval, ...) is [`Type::Other`],
//! kept as printed.

use std::fmt;

/// A column type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Type {
    /// `Int8` to `Int256`, `UInt8` to `UInt256`.
    Int {
        /// Signed (`Int`) or unsigned (`UInt`).
        signed: bool,
        /// 8, 16, 32, 64, 128 or 256.
        bits: u16,
    },
    /// `Float32`.
    Float32,
    /// `Float64`.
    Float64,
    /// `Bool`.
    Bool,
    /// `Decimal(P, S)` (`Decimal32(S)` and the like are printed so by the server).
    Decimal {
        /// Digits in all, 1 to 76.
        precision: u8,
        /// Digits after the point, at most `precision`.
        scale: u8,
    },
    /// `String`.
    String,
    /// `FixedString(N)`.
    FixedString(u32),
    /// `UUID`.
    Uuid,
    /// `IPv4`.
    Ipv4,
    /// `IPv6`.
    Ipv6,
    /// `Date`: days since 1970-01-01 as 16 bits.
    Date,
    /// `Date32`: days since 1970-01-01 as 32 bits, signed.
    Date32,
    /// `DateTime` or `DateTime('zone')`.
    DateTime(Option<String>),
    /// `DateTime64(precision)` or `DateTime64(precision, 'zone')`.
    DateTime64(u8, Option<String>),
    /// `Enum8(...)` (`wide` false) or `Enum16(...)`: names and values, in the server's order.
    Enum {
        /// 16 bits.
        wide: bool,
        /// Each element's name (bytes: the server allows any) and number.
        values: Vec<(Vec<u8>, i16)>,
    },
    /// `Nullable(T)`.
    Nullable(Box<Type>),
    /// `LowCardinality(T)`.
    LowCardinality(Box<Type>),
    /// `Array(T)`.
    Array(Box<Type>),
    /// `Map(K, V)`.
    Map(Box<Type>, Box<Type>),
    /// `Tuple(...)`: elements with their names, if named.
    Tuple(Vec<(Option<String>, Type)>),
    /// `Nested(name T, ...)` (a column of it when `flatten_nested = 0`): an array of tuples.
    Nested(Vec<(String, Type)>),
    /// `SimpleAggregateFunction(f, T)`: values of T; the function's text as printed.
    SimpleAggregateFunction(String, Box<Type>),
    /// Any other type, as printed.
    Other(String),
}

/// Why a type name could not be read (a server's answer the sink does not understand).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeError(pub String);

impl fmt::Display for TypeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Type {
    /// Parses a type name as `DESCRIBE TABLE` prints it.
    pub fn parse(text: &str) -> Result<Type, TypeError> {
        let mut p = Parser {
            s: text.as_bytes(),
            at: 0,
        };
        p.space();
        let ty = p.ty()?;
        p.space();
        if p.at != p.s.len() {
            return Err(p.error("text after the type"));
        }
        Ok(ty)
    }

    /// The type without `LowCardinality` and `SimpleAggregateFunction` wrappers: what its
    /// values are.
    pub fn values(&self) -> &Type {
        match self {
            Type::LowCardinality(t) | Type::SimpleAggregateFunction(_, t) => t.values(),
            t => t,
        }
    }

    /// Whether `null` is a value of the type (`Nullable`, and the types that hold any JSON:
    /// `JSON`, `Dynamic`, `Variant`, `Object`, `Nothing`).
    pub fn takes_null(&self) -> bool {
        match self.values() {
            Type::Nullable(_) => true,
            Type::Other(name) => {
                let head = name.split('(').next().unwrap_or("");
                matches!(head, "JSON" | "Object" | "Dynamic" | "Variant" | "Nothing")
            }
            _ => false,
        }
    }

    /// Whether the sink reads and encodes every value of the type itself (no [`Type::Other`]
    /// anywhere in it).
    pub fn is_covered(&self) -> bool {
        match self {
            Type::Other(_) => false,
            Type::Nullable(t)
            | Type::LowCardinality(t)
            | Type::Array(t)
            | Type::SimpleAggregateFunction(_, t) => t.is_covered(),
            Type::Map(k, v) => k.is_covered() && v.is_covered(),
            Type::Tuple(elements) => elements.iter().all(|(_, t)| t.is_covered()),
            Type::Nested(elements) => elements.iter().all(|(_, t)| t.is_covered()),
            _ => true,
        }
    }
}

/// Prints the type as the server does.
impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Int { signed, bits } => {
                write!(f, "{}Int{bits}", if *signed { "" } else { "U" })
            }
            Type::Float32 => f.write_str("Float32"),
            Type::Float64 => f.write_str("Float64"),
            Type::Bool => f.write_str("Bool"),
            Type::Decimal { precision, scale } => write!(f, "Decimal({precision}, {scale})"),
            Type::String => f.write_str("String"),
            Type::FixedString(n) => write!(f, "FixedString({n})"),
            Type::Uuid => f.write_str("UUID"),
            Type::Ipv4 => f.write_str("IPv4"),
            Type::Ipv6 => f.write_str("IPv6"),
            Type::Date => f.write_str("Date"),
            Type::Date32 => f.write_str("Date32"),
            Type::DateTime(None) => f.write_str("DateTime"),
            Type::DateTime(Some(zone)) => {
                f.write_str("DateTime(")?;
                write_quoted(f, zone.as_bytes())?;
                f.write_str(")")
            }
            Type::DateTime64(p, None) => write!(f, "DateTime64({p})"),
            Type::DateTime64(p, Some(zone)) => {
                write!(f, "DateTime64({p}, ")?;
                write_quoted(f, zone.as_bytes())?;
                f.write_str(")")
            }
            Type::Enum { wide, values } => {
                write!(f, "Enum{}(", if *wide { 16 } else { 8 })?;
                for (n, (name, value)) in values.iter().enumerate() {
                    if n > 0 {
                        f.write_str(", ")?;
                    }
                    write_quoted(f, name)?;
                    write!(f, " = {value}")?;
                }
                f.write_str(")")
            }
            Type::Nullable(t) => write!(f, "Nullable({t})"),
            Type::LowCardinality(t) => write!(f, "LowCardinality({t})"),
            Type::Array(t) => write!(f, "Array({t})"),
            Type::Map(k, v) => write!(f, "Map({k}, {v})"),
            Type::Tuple(elements) => {
                f.write_str("Tuple(")?;
                for (n, (name, t)) in elements.iter().enumerate() {
                    if n > 0 {
                        f.write_str(", ")?;
                    }
                    if let Some(name) = name {
                        write_name(f, name)?;
                        f.write_str(" ")?;
                    }
                    write!(f, "{t}")?;
                }
                f.write_str(")")
            }
            Type::Nested(elements) => {
                f.write_str("Nested(")?;
                for (n, (name, t)) in elements.iter().enumerate() {
                    if n > 0 {
                        f.write_str(", ")?;
                    }
                    write_name(f, name)?;
                    write!(f, " {t}")?;
                }
                f.write_str(")")
            }
            Type::SimpleAggregateFunction(function, t) => {
                write!(f, "SimpleAggregateFunction({function}, {t})")
            }
            Type::Other(text) => f.write_str(text),
        }
    }
}

/// A string literal as the server prints one: single quotes, backslash escapes.
fn write_quoted(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    f.write_str("'")?;
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\'' => f.write_str("\\'")?,
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                '\t' => f.write_str("\\t")?,
                '\r' => f.write_str("\\r")?,
                '\0' => f.write_str("\\0")?,
                '\x08' => f.write_str("\\b")?,
                '\x0c' => f.write_str("\\f")?,
                '\x07' => f.write_str("\\a")?,
                '\x0b' => f.write_str("\\v")?,
                c => write!(f, "{c}")?,
            }
        }
        for b in chunk.invalid() {
            write!(f, "\\x{b:02X}")?;
        }
    }
    f.write_str("'")
}

/// A tuple element's name as the server prints it: bare when it is a plain identifier,
/// backquoted otherwise.
fn write_name(f: &mut fmt::Formatter<'_>, name: &str) -> fmt::Result {
    let bare = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if bare {
        return f.write_str(name);
    }
    f.write_str("`")?;
    for c in name.chars() {
        match c {
            '`' => f.write_str("\\`")?,
            '\\' => f.write_str("\\\\")?,
            c => write!(f, "{c}")?,
        }
    }
    f.write_str("`")
}

struct Parser<'s> {
    s: &'s [u8],
    at: usize,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> TypeError {
        let text = String::from_utf8_lossy(self.s);
        let shown: String = text.chars().take(120).collect();
        TypeError(format!(
            "the column type `{shown}` could not be read ({what} at byte {})",
            self.at
        ))
    }

    fn space(&mut self) {
        while self.s.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        self.space();
        if self.s.get(self.at) == Some(&b) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, b: u8) -> Result<(), TypeError> {
        if self.eat(b) {
            Ok(())
        } else {
            Err(self.error(&format!("`{}` expected", b as char)))
        }
    }

    fn word(&mut self) -> &str {
        self.space();
        let start = self.at;
        while self
            .s
            .get(self.at)
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
        {
            self.at += 1;
        }
        // ASCII letters, digits and `_` only.
        std::str::from_utf8(&self.s[start..self.at]).unwrap_or_default()
    }

    /// An integer that fits `N` (one reader for every width: a `FromStr` per width costs
    /// the component more).
    fn number<N: TryFrom<i64>>(&mut self) -> Result<N, TypeError> {
        self.space();
        let negative = self.eat(b'-');
        let start = self.at;
        let mut n: i64 = 0;
        while let Some(d) = self.s.get(self.at).filter(|b| b.is_ascii_digit()) {
            n = n.saturating_mul(10).saturating_add(i64::from(d - b'0'));
            self.at += 1;
        }
        let n = if negative { -n } else { n };
        (self.at > start)
            .then(|| N::try_from(n).ok())
            .flatten()
            .ok_or_else(|| self.error("a number expected"))
    }

    /// A quoted string literal's bytes, escapes undone.
    fn quoted(&mut self) -> Result<Vec<u8>, TypeError> {
        self.expect(b'\'')?;
        let mut out = Vec::new();
        loop {
            let Some(&b) = self.s.get(self.at) else {
                return Err(self.error("an unterminated string"));
            };
            self.at += 1;
            match b {
                b'\'' => return Ok(out),
                b'\\' => {
                    let Some(&e) = self.s.get(self.at) else {
                        return Err(self.error("an unterminated string"));
                    };
                    self.at += 1;
                    match e {
                        b'n' => out.push(b'\n'),
                        b't' => out.push(b'\t'),
                        b'r' => out.push(b'\r'),
                        b'0' => out.push(0),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'a' => out.push(7),
                        b'v' => out.push(11),
                        b'x' => {
                            let hex = self
                                .s
                                .get(self.at..self.at + 2)
                                .and_then(|h| std::str::from_utf8(h).ok())
                                .and_then(|h| u8::from_str_radix(h, 16).ok())
                                .ok_or_else(|| self.error("a bad \\x escape"))?;
                            self.at += 2;
                            out.push(hex);
                        }
                        other => out.push(other),
                    }
                }
                b => out.push(b),
            }
        }
    }

    /// The text of a balanced `( ... )` argument list from its `(` (quotes respected).
    fn balanced(&mut self) -> Result<(), TypeError> {
        let mut depth = 0usize;
        let mut quote: Option<u8> = None;
        while let Some(&b) = self.s.get(self.at) {
            self.at += 1;
            match (quote, b) {
                (Some(_), b'\\') => self.at += 1,
                (Some(q), b) if b == q => quote = None,
                (Some(_), _) => {}
                (None, b'\'' | b'`' | b'"') => quote = Some(b),
                (None, b'(') => depth += 1,
                (None, b')') => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
                _ => {}
            }
        }
        Err(self.error("unbalanced parentheses"))
    }

    fn zone(&mut self) -> Result<String, TypeError> {
        let bytes = self.quoted()?;
        String::from_utf8(bytes).map_err(|_| self.error("a time zone that is not UTF-8"))
    }

    /// A tuple element's name, if the element has one: an identifier (maybe backquoted)
    /// followed by a type (a type alone is followed by `,`, `)` or `(`).
    fn element_name(&mut self) -> Result<Option<String>, TypeError> {
        self.space();
        let start = self.at;
        if self.s.get(self.at) == Some(&b'`') {
            self.at += 1;
            let mut name = Vec::new();
            loop {
                match self.s.get(self.at) {
                    None => return Err(self.error("an unterminated name")),
                    Some(b'\\') => {
                        name.extend(self.s.get(self.at + 1));
                        self.at += 2;
                    }
                    Some(b'`') => {
                        self.at += 1;
                        break;
                    }
                    Some(&b) => {
                        name.push(b);
                        self.at += 1;
                    }
                }
            }
            return String::from_utf8(name)
                .map(Some)
                .map_err(|_| self.error("a name that is not UTF-8"));
        }
        let word = self.word().to_string();
        let next = self.s.get(self.at).copied();
        if !word.is_empty() && next.is_some_and(|b| b.is_ascii_whitespace()) {
            let after = self.at;
            self.space();
            // `name Type`: a type follows the space (a type alone never has a space and then
            // a word inside one element).
            if self
                .s
                .get(self.at)
                .is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_')
            {
                return Ok(Some(word));
            }
            self.at = after;
        }
        self.at = start;
        Ok(None)
    }

    fn elements(&mut self) -> Result<Vec<(Option<String>, Type)>, TypeError> {
        let mut elements = Vec::new();
        loop {
            let name = self.element_name()?;
            elements.push((name, self.ty()?));
            if !self.eat(b',') {
                self.expect(b')')?;
                return Ok(elements);
            }
        }
    }

    fn ty(&mut self) -> Result<Type, TypeError> {
        let start = self.at;
        let name = self.word().to_string();
        if name.is_empty() {
            return Err(self.error("a type name expected"));
        }
        let args = {
            self.space();
            self.s.get(self.at) == Some(&b'(')
        };
        let int = |rest: &str, signed: bool| {
            rest.parse::<u16>()
                .ok()
                .filter(|b| matches!(b, 8 | 16 | 32 | 64 | 128 | 256))
                .map(|bits| Type::Int { signed, bits })
        };
        if !args {
            let simple = match name.as_str() {
                "Float32" => Some(Type::Float32),
                "Float64" => Some(Type::Float64),
                "Bool" => Some(Type::Bool),
                "String" => Some(Type::String),
                "UUID" => Some(Type::Uuid),
                "IPv4" => Some(Type::Ipv4),
                "IPv6" => Some(Type::Ipv6),
                "Date" => Some(Type::Date),
                "Date32" => Some(Type::Date32),
                "DateTime" => Some(Type::DateTime(None)),
                n => n
                    .strip_prefix("UInt")
                    .and_then(|r| int(r, false))
                    .or_else(|| n.strip_prefix("Int").and_then(|r| int(r, true))),
            };
            return Ok(simple.unwrap_or(Type::Other(name)));
        }
        self.expect(b'(')?;
        let ty = match name.as_str() {
            "Nullable" => Type::Nullable(Box::new(self.ty()?)),
            "LowCardinality" => Type::LowCardinality(Box::new(self.ty()?)),
            "Array" => Type::Array(Box::new(self.ty()?)),
            "Map" => {
                let k = self.ty()?;
                self.expect(b',')?;
                Type::Map(Box::new(k), Box::new(self.ty()?))
            }
            "Tuple" => {
                let elements = self.elements()?;
                return Ok(Type::Tuple(elements));
            }
            "Nested" => {
                let elements = self.elements()?;
                let named = elements
                    .into_iter()
                    .map(|(n, t)| n.map(|n| (n, t)))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| self.error("a Nested element without a name"))?;
                return Ok(Type::Nested(named));
            }
            "FixedString" => Type::FixedString(self.number()?),
            "Decimal" => {
                let precision = self.number()?;
                let scale = if self.eat(b',') { self.number()? } else { 0 };
                if !(1..=76).contains(&precision) || scale > precision {
                    return Err(self.error("a Decimal precision or scale out of range"));
                }
                Type::Decimal { precision, scale }
            }
            "Decimal32" | "Decimal64" | "Decimal128" | "Decimal256" => {
                let precision = match name.as_str() {
                    "Decimal32" => 9,
                    "Decimal64" => 18,
                    "Decimal128" => 38,
                    _ => 76,
                };
                let scale = self.number()?;
                if scale > precision {
                    return Err(self.error("a Decimal scale out of range"));
                }
                Type::Decimal { precision, scale }
            }
            "DateTime" => Type::DateTime(Some(self.zone()?)),
            "DateTime64" => {
                let precision = self.number()?;
                if precision > 9 {
                    return Err(self.error("a DateTime64 precision over 9"));
                }
                let zone = if self.eat(b',') {
                    Some(self.zone()?)
                } else {
                    None
                };
                Type::DateTime64(precision, zone)
            }
            "Enum8" | "Enum16" => {
                let wide = name == "Enum16";
                let mut values = Vec::new();
                loop {
                    self.space();
                    let element = self.quoted()?;
                    self.expect(b'=')?;
                    let value: i16 = self.number()?;
                    if !wide && i8::try_from(value).is_err() {
                        return Err(self.error("an Enum8 value out of range"));
                    }
                    values.push((element, value));
                    if !self.eat(b',') {
                        break;
                    }
                }
                Type::Enum { wide, values }
            }
            "SimpleAggregateFunction" => {
                // The function (maybe with parameters), up to the top-level comma.
                self.space();
                let from = self.at;
                self.word();
                self.space();
                if self.s.get(self.at) == Some(&b'(') {
                    self.balanced()?;
                }
                let function = String::from_utf8_lossy(&self.s[from..self.at])
                    .trim()
                    .to_string();
                self.expect(b',')?;
                Type::SimpleAggregateFunction(function, Box::new(self.ty()?))
            }
            _ => {
                // Any other type with arguments: kept as printed.
                self.at = start;
                self.word();
                self.space();
                self.balanced()?;
                let text = String::from_utf8_lossy(&self.s[start..self.at]).to_string();
                return Ok(Type::Other(text));
            }
        };
        self.expect(b')')?;
        Ok(ty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(text: &str) -> Type {
        let ty = Type::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(ty.to_string(), text, "{ty:?}");
        ty
    }

    #[test]
    fn the_servers_text_round_trips() {
        for text in [
            "UInt8",
            "Int256",
            "Float32",
            "Bool",
            "Decimal(18, 2)",
            "Decimal(76, 76)",
            "String",
            "FixedString(16)",
            "UUID",
            "IPv4",
            "IPv6",
            "Date",
            "Date32",
            "DateTime",
            "DateTime('Asia/Tokyo')",
            "DateTime64(3)",
            "DateTime64(9, 'UTC')",
            "Enum8('a' = 1, 'b' = -2)",
            "Enum16('it\\'s' = 1000, 'back\\\\slash' = -1000, 'new\\nline' = 3)",
            "Nullable(UInt32)",
            "LowCardinality(Nullable(String))",
            "Array(Array(Nullable(Int8)))",
            "Map(String, Array(Decimal(9, 3)))",
            "Tuple(UInt8, String)",
            "Tuple(a UInt8, b Tuple(c String, d Array(UInt8)))",
            "Tuple(`a b` UInt8, `1x` String)",
            "Nested(x UInt8, y String)",
            "SimpleAggregateFunction(sum, UInt64)",
            "SimpleAggregateFunction(anyLast, Nullable(String))",
            "AggregateFunction(quantiles(0.5, 0.9), UInt64)",
            "JSON",
            "JSON(max_dynamic_paths = 8, a.b UInt32)",
            "Variant(String, UInt64)",
            "Dynamic",
            "Point",
            "Array(Tuple(x Variant(String, UInt8), y JSON))",
        ] {
            round_trip(text);
        }
    }

    #[test]
    fn the_tree_is_what_the_text_says() {
        assert_eq!(
            round_trip("Tuple(a UInt8, Array(String))"),
            Type::Tuple(vec![
                (
                    Some("a".into()),
                    Type::Int {
                        signed: false,
                        bits: 8
                    }
                ),
                (None, Type::Array(Box::new(Type::String))),
            ])
        );
        assert_eq!(
            Type::parse("Decimal64(4)").unwrap(),
            Type::Decimal {
                precision: 18,
                scale: 4
            }
        );
        assert_eq!(
            round_trip("Enum8('' = 0, 'x\\'y' = 127)"),
            Type::Enum {
                wide: false,
                values: vec![(b"".to_vec(), 0), (b"x'y".to_vec(), 127)]
            }
        );
        assert_eq!(
            round_trip("DateTime64(6, 'Europe/Berlin')"),
            Type::DateTime64(6, Some("Europe/Berlin".into()))
        );
        assert!(round_trip("Array(Nullable(String))").is_covered());
        assert!(!round_trip("Map(String, JSON)").is_covered());
    }

    #[test]
    fn null_is_a_value_of_nullable_and_any_json_types() {
        for (text, takes) in [
            ("Nullable(UInt8)", true),
            ("LowCardinality(Nullable(String))", true),
            ("SimpleAggregateFunction(anyLast, Nullable(UInt8))", true),
            ("JSON", true),
            ("JSON(max_dynamic_paths = 8)", true),
            ("Dynamic", true),
            ("Variant(String, UInt64)", true),
            ("Object('json')", true),
            ("Nothing", true),
            ("UInt8", false),
            ("String", false),
            ("Array(Nullable(UInt8))", false),
            ("Enum8('Nullable(' = 1)", false),
        ] {
            assert_eq!(Type::parse(text).unwrap().takes_null(), takes, "{text}");
        }
    }

    #[test]
    fn malformed_names_are_errors_not_panics() {
        for text in [
            "",
            "(",
            "Array(",
            "Array(UInt8",
            "Map(String)",
            "Decimal(0, 0)",
            "Decimal(5, 6)",
            "DateTime64(10)",
            "Enum8('a' = 128)",
            "Enum8('a)",
            "FixedString(x)",
            "UInt8 junk",
            "Nested(UInt8)",
        ] {
            assert!(Type::parse(text).is_err(), "{text}");
        }
    }
}
