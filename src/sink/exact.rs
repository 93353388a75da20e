//! Exact or refused: the values ClickHouse's JSON input would store changed, without an error,
//! found before anything is sent (measured on the engine, 26.9):
//!
//! * an integer out of its column's range wraps (`300` into `UInt8` is stored as `44`,
//!   `18446744073709551616` into `UInt64` as `0`), for every width from 8 to 256 bits, a number
//!   given as a string (`"300"`) alike, and inside `Array`, `Map` (keys too), `Tuple`;
//! * a finite number past `Float32`'s (or `Float64`'s) range becomes `inf`;
//! * digits past a `Decimal`'s scale are dropped (`1.234` into `Decimal(5, 2)` is `1.23`);
//! * sub-second digits past a `DateTime64(p)`'s precision are dropped (`.123456` into
//!   `DateTime64(3)` is `.123`), and a `DateTime`'s fraction entirely.
//!
//! Dates and times out of `Date`'s and `DateTime`'s ranges (which ClickHouse clamps to
//! 1970-01-01 or 2149-06-06, or wraps) are not checked here: every sink INSERT carries
//! `date_time_overflow_behavior = 'throw'` ([`super::config`]), under which the server refuses
//! them (code 321), in the column's time zone, which only the server knows.
//!
//! Not changes, so kept (declared coercions, in docs/sink.md): `true`/`false` into an integer
//! (1/0), a number given as a string, an integer into a float column (rounded to the nearest
//! float, as any float is), trailing zeros past a scale or precision (`1.230` into
//! `Decimal(5, 2)`), an `Enum` value by its number, a `UUID` in upper case, a `FixedString(N)`
//! value shorter than N (padded with zero bytes, as the type stores every value). Values whose
//! syntax a column does not take (`1.5` or `1e3` into an integer, `-1` into an unsigned one)
//! are refused by the server, so they are left to it.

use serde_json::Value as Json;

/// What a column type needs checked in a value so that it is stored exactly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exact {
    /// Nothing: every value the server accepts is stored as sent (String, UUID, JSON, ...).
    Any,
    /// An integer of `bits` bits.
    Int { signed: bool, bits: u16 },
    /// A 32- or 64-bit float: a finite number must stay finite.
    Float { bits: u16 },
    /// At most `scale` digits after the point (trailing zeros aside).
    Decimal { scale: u32 },
    /// A date and time: at most `precision` sub-second digits.
    DateTime { precision: u32 },
    /// Every element.
    Array(Box<Exact>),
    /// Every key and value.
    Map(Box<Exact>, Box<Exact>),
    /// Each element, by position (a JSON array) or by name (a JSON object, named tuples).
    Tuple(Vec<(Option<String>, Exact)>),
}

impl Exact {
    /// The rule for a ClickHouse type as `DESCRIBE TABLE` prints it.
    pub fn of(ty: &str) -> Exact {
        let ty = ty.trim();
        for wrapper in ["Nullable(", "LowCardinality("] {
            if let Some(inner) = args(ty, wrapper) {
                return Exact::of(inner);
            }
        }
        if let Some(inner) = args(ty, "SimpleAggregateFunction(") {
            return split_args(inner)
                .get(1)
                .map_or(Exact::Any, |t| Exact::of(t));
        }
        if let Some(inner) = args(ty, "Array(") {
            return wrap(Exact::of(inner), |e| Exact::Array(Box::new(e)));
        }
        if let Some(inner) = args(ty, "Map(") {
            let parts = split_args(inner);
            if let [k, v] = parts.as_slice() {
                let (k, v) = (Exact::of(k), Exact::of(v));
                if k == Exact::Any && v == Exact::Any {
                    return Exact::Any;
                }
                return Exact::Map(Box::new(k), Box::new(v));
            }
            return Exact::Any;
        }
        for composite in ["Tuple(", "Nested("] {
            if let Some(inner) = args(ty, composite) {
                let elements: Vec<(Option<String>, Exact)> =
                    split_args(inner).into_iter().map(element).collect();
                if elements.iter().all(|(_, e)| *e == Exact::Any) {
                    return Exact::Any;
                }
                let tuple = Exact::Tuple(elements);
                return if composite == "Nested(" {
                    Exact::Array(Box::new(tuple))
                } else {
                    tuple
                };
            }
        }
        if let Some(inner) = args(ty, "Decimal(") {
            let parts = split_args(inner);
            return match parts.as_slice() {
                [_, scale] => scale
                    .trim()
                    .parse()
                    .map_or(Exact::Any, |scale| Exact::Decimal { scale }),
                _ => Exact::Decimal { scale: 0 },
            };
        }
        for (prefix, bits) in [
            ("Decimal32(", 32),
            ("Decimal64(", 64),
            ("Decimal128(", 128),
            ("Decimal256(", 256),
        ] {
            let _ = bits;
            if let Some(scale) = args(ty, prefix) {
                return scale
                    .trim()
                    .parse()
                    .map_or(Exact::Any, |scale| Exact::Decimal { scale });
            }
        }
        if let Some(inner) = args(ty, "DateTime64(") {
            let precision = split_args(inner)
                .first()
                .and_then(|p| p.trim().parse().ok())
                .unwrap_or(3);
            return Exact::DateTime { precision };
        }
        if ty == "DateTime" || ty.starts_with("DateTime(") {
            return Exact::DateTime { precision: 0 };
        }
        if let Some(bits) = ty.strip_prefix("UInt").and_then(|b| b.parse().ok()) {
            return Exact::Int {
                signed: false,
                bits,
            };
        }
        if let Some(bits) = ty.strip_prefix("Int").and_then(|b| b.parse().ok()) {
            return Exact::Int { signed: true, bits };
        }
        match ty {
            "Float32" => Exact::Float { bits: 32 },
            "Float64" => Exact::Float { bits: 64 },
            _ => Exact::Any,
        }
    }

    /// Checks one value, given as its JSON text; why it would not be stored as sent.
    pub fn check_text(&self, text: &str) -> Result<(), String> {
        let text = text.trim();
        match self {
            Exact::Any => Ok(()),
            Exact::Array(_) | Exact::Map(..) | Exact::Tuple(_) => {
                match text.as_bytes().first() {
                    Some(b'[' | b'{') => match serde_json::from_str::<Json>(text) {
                        Ok(value) => self.check_value(&value),
                        // Not JSON: the reader that words the error has refused it already.
                        Err(_) => Ok(()),
                    },
                    _ => Ok(()),
                }
            }
            scalar => match text.as_bytes().first() {
                Some(b'"') if !text[1..].contains('\\') => {
                    scalar.check_scalar(text.trim_matches('"'), true)
                }
                Some(b'"') => match serde_json::from_str::<String>(text) {
                    Ok(s) => scalar.check_scalar(&s, true),
                    Err(_) => Ok(()),
                },
                Some(b'-' | b'0'..=b'9') => scalar.check_scalar(text, false),
                _ => Ok(()),
            },
        }
    }

    /// Checks a parsed JSON value.
    fn check_value(&self, value: &Json) -> Result<(), String> {
        match (self, value) {
            (Exact::Any, _) | (_, Json::Null | Json::Bool(_)) => Ok(()),
            (Exact::Array(element), Json::Array(items)) => {
                items.iter().try_for_each(|item| element.check_value(item))
            }
            (Exact::Map(key, element), Json::Object(map)) => map.iter().try_for_each(|(k, v)| {
                key.check_scalar(k, true)?;
                element.check_value(v)
            }),
            (Exact::Tuple(elements), Json::Array(items)) => elements
                .iter()
                .zip(items)
                .try_for_each(|((_, e), item)| e.check_value(item)),
            (Exact::Tuple(elements), Json::Object(map)) => {
                elements.iter().try_for_each(|(name, e)| {
                    match name.as_deref().and_then(|n| map.get(n)) {
                        Some(item) => e.check_value(item),
                        None => Ok(()),
                    }
                })
            }
            // A shape the type does not take: the server refuses it.
            (Exact::Array(_) | Exact::Map(..) | Exact::Tuple(_), _) => Ok(()),
            (scalar, Json::Number(n)) => scalar.check_scalar(&n.to_string(), false),
            (scalar, Json::String(s)) => scalar.check_scalar(s, true),
            (_, Json::Array(_) | Json::Object(_)) => Ok(()),
        }
    }

    /// Checks a number's text (or a string's content, `quoted`) against a scalar rule.
    fn check_scalar(&self, text: &str, quoted: bool) -> Result<(), String> {
        let shown = || {
            let t: String = text.chars().take(80).collect();
            if quoted {
                format!("\"{t}\"")
            } else {
                t
            }
        };
        match self {
            Exact::Int { signed, bits } => {
                if integer_fits(text, *signed, *bits) {
                    Ok(())
                } else {
                    Err(format!(
                        "{} is out of the range of {}Int{bits} (ClickHouse would store another number)",
                        shown(),
                        if *signed { "" } else { "U" }
                    ))
                }
            }
            Exact::Float { bits } => {
                let t = text.trim();
                if !looks_numeric(t) {
                    // "inf", "nan" and other words: meant as they are, or refused.
                    return Ok(());
                }
                let infinite = if *bits == 32 {
                    t.parse::<f32>().is_ok_and(f32::is_infinite)
                } else {
                    t.parse::<f64>().is_ok_and(f64::is_infinite)
                };
                if infinite {
                    Err(format!(
                        "{} is out of the range of Float{bits} (ClickHouse would store inf)",
                        shown()
                    ))
                } else {
                    Ok(())
                }
            }
            Exact::Decimal { scale } => match decimal_places(text) {
                Some(places) if places > i64::from(*scale) => Err(format!(
                    "{} has more digits after the point than the column's scale, {scale} (ClickHouse would drop them)",
                    shown()
                )),
                _ => Ok(()),
            },
            Exact::DateTime { precision } => match sub_second_digits(text, quoted) {
                Some(digits) if digits > *precision => Err(format!(
                    "{} has more sub-second digits than the column keeps, {precision} (ClickHouse would drop them)",
                    shown()
                )),
                _ => Ok(()),
            },
            Exact::Any | Exact::Array(_) | Exact::Map(..) | Exact::Tuple(_) => Ok(()),
        }
    }
}

/// `Array(Any)` and the like need no check.
fn wrap(inner: Exact, make: impl FnOnce(Exact) -> Exact) -> Exact {
    if inner == Exact::Any {
        Exact::Any
    } else {
        make(inner)
    }
}

/// A tuple element: `name Type` or `Type`.
fn element(part: &str) -> (Option<String>, Exact) {
    let part = part.trim();
    // A named element is an identifier (maybe backquoted), a space, then the type; a type
    // alone starts with its name, which may be followed by `(` but not by a space.
    if let Some(rest) = part.strip_prefix('`') {
        if let Some(end) = rest.find('`') {
            return (Some(rest[..end].to_string()), Exact::of(&rest[end + 1..]));
        }
    }
    match part.split_once(' ') {
        Some((name, ty)) if !name.contains('(') => (Some(name.to_string()), Exact::of(ty)),
        _ => (None, Exact::of(part)),
    }
}

/// The text between `prefix` and the final `)`.
fn args<'t>(ty: &'t str, prefix: &str) -> Option<&'t str> {
    ty.strip_prefix(prefix)?.strip_suffix(')')
}

/// Splits type arguments at commas outside parentheses and quotes.
fn split_args(args: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut quoted = false;
    let mut escaped = false;
    let mut start = 0;
    for (i, c) in args.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '\'' | '`' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                parts.push(args[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(args[start..].trim());
    parts
}

fn looks_numeric(t: &str) -> bool {
    let t = t.strip_prefix(['-', '+']).unwrap_or(t);
    t.as_bytes()
        .first()
        .is_some_and(|b| b.is_ascii_digit() || *b == b'.')
}

/// Largest magnitudes by width: signed maximum, signed minimum's magnitude, unsigned maximum.
const BOUNDS: [(u16, &str, &str, &str); 6] = [
    (8, "127", "128", "255"),
    (16, "32767", "32768", "65535"),
    (32, "2147483647", "2147483648", "4294967295"),
    (
        64,
        "9223372036854775807",
        "9223372036854775808",
        "18446744073709551615",
    ),
    (
        128,
        "170141183460469231731687303715884105727",
        "170141183460469231731687303715884105728",
        "340282366920938463463374607431768211455",
    ),
    (
        256,
        "57896044618658097711785492504343953926634992332820282019728792003956564819967",
        "57896044618658097711785492504343953926634992332820282019728792003956564819968",
        "115792089237316195423570985008687907853269984665640564039457584007913129639935",
    ),
];

/// Whether an integer text fits; text that is not a plain integer passes (the server refuses
/// what it cannot read as one).
fn integer_fits(text: &str, signed: bool, bits: u16) -> bool {
    let t = text.trim();
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    let digits = digits.trim_start_matches('0');
    let Some(&(_, max, min, umax)) = BOUNDS.iter().find(|(b, ..)| *b == bits) else {
        return true;
    };
    let bound = match (signed, negative) {
        (true, false) => max,
        (true, true) => min,
        // A negative number into an unsigned column is refused by the server ('-' symbol),
        // -0 included.
        (false, true) => return true,
        (false, false) => umax,
    };
    digits.len() < bound.len() || (digits.len() == bound.len() && digits <= bound)
}

/// Digits after the point that are not trailing zeros, less the exponent (`1.5e-3`: 4); `None`
/// when the text is not a decimal number.
fn decimal_places(text: &str) -> Option<i64> {
    let t = text.trim();
    let t = t.strip_prefix(['-', '+']).unwrap_or(t);
    let (mantissa, exponent) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], t[i + 1..].parse::<i64>().ok()?),
        None => (t, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if !(int.bytes().chain(frac.bytes())).all(|b| b.is_ascii_digit())
        || (int.is_empty() && frac.is_empty())
    {
        return None;
    }
    let places = frac.trim_end_matches('0').len() as i64;
    Some(places.saturating_sub(exponent))
}

/// Sub-second digits that are not trailing zeros: after the seconds' `.` of a date-time text
/// (`2026-01-01 00:00:00.123`), or after the point of a number of seconds (`1767225600.5`).
fn sub_second_digits(text: &str, quoted: bool) -> Option<u32> {
    let t = text.trim();
    let fraction = if quoted && t.contains(':') {
        // The digits after the last ':' field's '.'.
        let after = &t[t.rfind(':')? + 1..];
        let dot = after.find('.')?;
        let digits = &after[dot + 1..];
        let end = digits
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(digits.len());
        &digits[..end]
    } else {
        let (int, frac) = t.split_once('.')?;
        if !int
            .trim_start_matches('-')
            .bytes()
            .all(|b| b.is_ascii_digit())
            || !frac.bytes().all(|b| b.is_ascii_digit())
        {
            return None;
        }
        frac
    };
    Some(fraction.trim_end_matches('0').len() as u32)
}

/// Whether a value's JSON text could be one [`Exact`] refuses (a cheap test before the column
/// types are asked for): a number of three or more characters or with a point or an exponent,
/// a string starting with a digit, sign or point (a number or a date-time as text) of three or
/// more characters, or an array or object holding a digit. Small numbers such as `0` to `99`
/// fit every numeric column.
pub fn may_be_inexact(text: &str) -> bool {
    may_be_inexact_bytes(text.as_bytes())
}

/// [`may_be_inexact`] of a value's JSON text as bytes.
pub fn may_be_inexact_bytes(b: &[u8]) -> bool {
    match b.first() {
        Some(b'-' | b'0'..=b'9') => b.len() >= 3 || b.contains(&b'.'),
        Some(b'"') => b.len() >= 5 && matches!(b.get(1), Some(b'-' | b'+' | b'.' | b'0'..=b'9')),
        Some(b'[' | b'{') => b.iter().any(u8::is_ascii_digit),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(ty: &str, value: &str) -> bool {
        Exact::of(ty).check_text(value).is_err()
    }

    #[test]
    fn integers_of_every_width_are_checked_at_their_bounds() {
        for &(bits, max, min, umax) in &BOUNDS {
            let int = format!("Int{bits}");
            let uint = format!("UInt{bits}");
            assert!(!refused(&int, max), "{int} {max}");
            assert!(!refused(&int, &format!("-{min}")), "{int} -{min}");
            assert!(!refused(&uint, umax), "{uint} {umax}");
            assert!(!refused(&uint, "0"));
            let over = |s: &str| {
                // s + 1, in decimal.
                let mut digits: Vec<u8> = s.bytes().collect();
                let mut i = digits.len();
                loop {
                    if i == 0 {
                        digits.insert(0, b'1');
                        break;
                    }
                    i -= 1;
                    if digits[i] == b'9' {
                        digits[i] = b'0';
                    } else {
                        digits[i] += 1;
                        break;
                    }
                }
                String::from_utf8(digits).unwrap()
            };
            assert!(refused(&int, &over(max)), "{int} {max}+1");
            assert!(
                refused(&int, &format!("-{}", over(min))),
                "{int} -({min}+1)"
            );
            assert!(refused(&uint, &over(umax)), "{uint} {umax}+1");
            // As strings, inside wrappers and composites.
            assert!(refused(&uint, &format!("\"{}\"", over(umax))));
            assert!(refused(&format!("Nullable({uint})"), &over(umax)));
            assert!(refused(
                &format!("LowCardinality(Nullable({uint}))"),
                &over(umax)
            ));
            assert!(refused(
                &format!("Array({uint})"),
                &format!("[1, {}]", over(umax))
            ));
            assert!(!refused(&format!("Array({uint})"), &format!("[1, {umax}]")));
        }
        assert!(!refused("UInt8", "007"), "leading zeros");
        assert!(!refused("UInt8", "true"));
        // Syntax the server refuses itself.
        assert!(!refused("UInt8", "1.5"));
        assert!(!refused("UInt8", "-1"));
    }

    #[test]
    fn composites_are_checked_where_their_parts_are_numbers() {
        let m = "Map(UInt8, Array(Int8))";
        assert!(!refused(m, r#"{"1": [127, -128]}"#));
        assert!(refused(m, r#"{"256": [1]}"#), "a key");
        assert!(refused(m, r#"{"1": [128]}"#), "a value");
        let t = "Tuple(a UInt8, b String, c Array(Int16))";
        assert!(!refused(t, r#"[255, "x", [32767]]"#));
        assert!(refused(t, r#"[256, "x", []]"#));
        assert!(refused(t, r#"{"a": 1, "b": "x", "c": [32768]}"#));
        assert!(refused("Tuple(UInt8, UInt8)", "[1, 300]"));
        assert!(refused(
            "Nested(x UInt8, y String)",
            r#"[{"x": 1, "y": "a"}, {"x": 999, "y": "b"}]"#
        ));
        assert_eq!(Exact::of("Array(String)"), Exact::Any);
        assert_eq!(Exact::of("Map(String, UUID)"), Exact::Any);
        assert_eq!(Exact::of("Tuple(a String, b IPv4)"), Exact::Any);
    }

    #[test]
    fn floats_decimals_and_sub_seconds() {
        assert!(refused("Float32", "1e40"));
        assert!(refused("Float32", "\"1e40\""));
        assert!(!refused("Float32", "3.4e38"));
        assert!(!refused("Float32", "16777217"), "rounded, not changed");
        assert!(!refused("Float32", "\"inf\""));
        assert!(refused("Float64", "1e400"));
        assert!(!refused("Float64", "1e300"));
        assert!(refused("Decimal(5, 2)", "1.234"));
        assert!(!refused("Decimal(5, 2)", "1.230"));
        assert!(!refused("Decimal(5, 2)", "1.23"));
        assert!(refused("Decimal(9, 0)", "1.5"));
        assert!(refused("Decimal(5, 2)", "1.5e-3"));
        assert!(!refused("Decimal(5, 2)", "15e-1"));
        assert!(refused("Decimal64(2)", "\"0.001\""));
        let dt = "DateTime64(3)";
        assert!(refused(dt, "\"2026-01-01 00:00:00.123456\""));
        assert!(!refused(dt, "\"2026-01-01 00:00:00.123\""));
        assert!(!refused(dt, "\"2026-01-01 00:00:00.123000\""));
        assert!(!refused(dt, "\"2026-01-01 00:00:00\""));
        assert!(refused(dt, "1767225600.1234"));
        assert!(!refused(dt, "1767225600.123"));
        assert!(refused(
            "DateTime64(6, 'UTC')",
            "\"2026-01-01 00:00:00.1234567\""
        ));
        assert!(refused("DateTime", "\"2026-01-01 00:00:00.5\""));
        assert!(!refused(
            "DateTime('Asia/Tokyo')",
            "\"2026-01-01 00:00:00\""
        ));
        assert!(!refused("Date", "\"2026-01-01\""));
    }

    #[test]
    fn only_values_that_may_change_need_the_types() {
        for v in [
            "0", "99", "-1", "true", "null", "\"abc\"", "\"7\"", "\"99\"",
        ] {
            assert!(!may_be_inexact(v), "{v}");
        }
        for v in [
            "100",
            "1.5",
            "1e9",
            "\"300\"",
            "\"2026-01-01\"",
            "[300]",
            "{\"a\":1}",
        ] {
            assert!(may_be_inexact(v), "{v}");
        }
    }
}
