//! The texts the sink reads as numbers, dates, times, UUIDs and addresses, with the rules of
//! docs/sink.md: every text either means exactly one value of its column's type or is refused
//! with the reason. Each parser takes the text (a JSON number's token, or a JSON string's
//! content) and gives the value as the column stores it.

use std::borrow::Cow;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Why a text was refused. Mostly fixed text: the message around it names the column's type
/// (and the component's size budget has no room for a formatted message per case).
pub type Why = Cow<'static, str>;

/// An integer of up to 256 bits: two's complement, little-endian 64-bit limbs.
pub type Wide = [u64; 4];

/// Reads `[+-]?[0-9]+` into a magnitude; `None` when it is not that or has over 256 bits.
fn magnitude(digits: &[u8]) -> Option<Wide> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // Up to 19 digits fit 64 bits: the common case, without 128-bit steps per digit.
    if digits.len() <= 19 {
        let n = digits
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
        return Some([n, 0, 0, 0]);
    }
    let mut n: Wide = [0; 4];
    for &d in digits {
        // n = n * 10 + d
        let mut carry = u128::from(d - b'0');
        for limb in n.iter_mut() {
            let v = u128::from(*limb) * 10 + carry;
            *limb = v as u64;
            carry = v >> 64;
        }
        if carry != 0 {
            return None;
        }
    }
    Some(n)
}

fn negate(n: Wide) -> Wide {
    let mut out = [0u64; 4];
    let mut carry = 1u128;
    for (o, limb) in out.iter_mut().zip(n) {
        let v = u128::from(!limb) + carry;
        *o = v as u64;
        carry = v >> 64;
    }
    out
}

/// Whether a magnitude is below 2^`bits`.
fn below_power(n: &Wide, bits: u32) -> bool {
    (0..4).all(|i| {
        let lo = i as u32 * 64;
        if bits >= lo + 64 {
            true
        } else if bits <= lo {
            n[i] == 0
        } else {
            n[i] >> (bits - lo) == 0
        }
    })
}

fn is_zero(n: &Wide) -> bool {
    n.iter().all(|l| *l == 0)
}

/// An integer of a column of `bits` bits: `[+-]?[0-9]+` in range (a `-` never into an
/// unsigned column, `-0` included, as the server refuses it).
pub fn integer(text: &[u8], signed: bool, bits: u16) -> Result<Wide, Why> {
    let (negative, digits) = match text.first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let Some(n) = magnitude(digits) else {
        let numeric = !digits.is_empty()
            && digits
                .iter()
                .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'));
        return Err(if numeric {
            "not a whole number (an integer column takes no fraction or exponent), or too large"
        } else {
            "not an integer"
        }
        .into());
    };
    let bits = u32::from(bits);
    let out_of_range = || Why::from("out of the range of the column's integer type");
    if !signed {
        if negative {
            return Err("negative, for an unsigned column".into());
        }
        return if below_power(&n, bits) {
            Ok(n)
        } else {
            Err(out_of_range())
        };
    }
    // Signed: magnitude below 2^(bits-1), or equal to it when negative.
    let fits = below_power(&n, bits - 1)
        || (negative && {
            let mut limit = [0u64; 4];
            limit[(bits as usize - 1) / 64] = 1 << ((bits - 1) % 64);
            n == limit
        });
    if !fits {
        return Err(out_of_range());
    }
    Ok(if negative && !is_zero(&n) {
        negate(n)
    } else {
        n
    })
}

/// A float's text: a number (`1.5`, `-2e-3`, `.5`, `+7`) or `inf`, `-inf`, `nan` (any case,
/// `infinity` too). A finite number that would become infinite, or a non-zero one that would
/// become zero, in the column's width is refused.
pub fn float(text: &[u8], wide: bool) -> Result<f64, Why> {
    let not = || Why::from("not a number");
    let t = std::str::from_utf8(text).map_err(|_| not())?;
    let body = t.strip_prefix(['+', '-']).unwrap_or(t);
    let word = body.eq_ignore_ascii_case("inf")
        || body.eq_ignore_ascii_case("infinity")
        || body.eq_ignore_ascii_case("nan");
    let numeric = !body.is_empty()
        && body
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
        && body.bytes().any(|b| b.is_ascii_digit());
    if !word && !numeric {
        return Err(not());
    }
    let value: f64 = t.parse().map_err(|_| not())?;
    if word {
        return Ok(value);
    }
    // A Float32 is rounded from the text itself, not from the f64 (no double rounding).
    let value = if wide {
        value
    } else {
        f64::from(t.parse::<f32>().map_err(|_| not())?)
    };
    let (finite, zero) = (value.is_finite(), value == 0.0);
    if !finite {
        return Err(
            "out of the range of the column's float type (it would be stored as infinity)".into(),
        );
    }
    if zero && body.bytes().any(|b| (b'1'..=b'9').contains(&b)) && !has_zero_mantissa(body) {
        return Err("too small for the column's float type (it would be stored as 0)".into());
    }
    Ok(value)
}

/// Whether a number's digits before its exponent are all zeros.
fn has_zero_mantissa(body: &str) -> bool {
    let mantissa = body.split(['e', 'E']).next().unwrap_or("");
    mantissa.bytes().all(|b| b == b'0' || b == b'.')
}

/// A decimal's text (`[+-]?digits[.digits][e[+-]digits]`, `1.` and `.5` too) as the scaled
/// integer a `Decimal(precision, scale)` stores: refused when digits past the scale are not
/// zeros (the server drops them) or the number has more digits than the precision allows.
pub fn decimal(text: &[u8], precision: u8, scale: u8) -> Result<Wide, Why> {
    let (negative, t) = match text.first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let signed = |n: Wide| {
        if negative && !is_zero(&n) {
            negate(n)
        } else {
            n
        }
    };
    #[cfg(feature = "speed")]
    if let Some(n) = plain_decimal(t, precision, scale) {
        return Ok(signed([n, 0, 0, 0]));
    }
    decimal_digits(t, precision, scale).map(signed)
}

/// [`decimal`]'s general reading of an unsigned text: any exponent, any number of digits.
fn decimal_digits(t: &[u8], precision: u8, scale: u8) -> Result<Wide, Why> {
    let not = || Why::from("not a decimal number");
    let too_many =
        || Why::from("has more digits than the column's precision allows before the point");
    let (mantissa, exponent) = match t.iter().position(|b| matches!(b, b'e' | b'E')) {
        Some(i) => {
            let e = std::str::from_utf8(&t[i + 1..])
                .ok()
                .filter(|e| {
                    !e.is_empty()
                        && e.trim_start_matches(['+', '-'])
                            .bytes()
                            .all(|b| b.is_ascii_digit())
                })
                .and_then(|e| e.parse::<i64>().ok())
                .ok_or_else(not)?;
            (&t[..i], e)
        }
        None => (t, 0),
    };
    let (int, frac) = match mantissa.iter().position(|b| *b == b'.') {
        Some(i) => (&mantissa[..i], &mantissa[i + 1..]),
        None => (mantissa, &mantissa[mantissa.len()..]),
    };
    if (int.is_empty() && frac.is_empty()) || !int.iter().chain(frac).all(u8::is_ascii_digit) {
        return Err(not());
    }
    // All digits as one integer, and where the point is: value = digits * 10^-(places).
    let digits: Vec<u8> = int.iter().chain(frac).copied().collect();
    let places = frac.len() as i64 - exponent;
    // Scale to the column's: drop trailing zeros past it, refuse other digits there.
    let shift = i64::from(scale) - places;
    let mut scaled: Vec<u8> = if shift >= 0 {
        if shift > 80 {
            if digits.iter().all(|d| *d == b'0') {
                vec![b'0']
            } else {
                return Err(too_many());
            }
        } else {
            let mut d = digits.clone();
            d.extend(std::iter::repeat_n(b'0', shift as usize));
            d
        }
    } else {
        let drop = (-shift) as usize;
        let keep = digits.len().saturating_sub(drop);
        if digits[keep..].iter().any(|d| *d != b'0') {
            return Err("has more digits after the point than the column's scale (the server would drop them)".into());
        }
        digits[..keep].to_vec()
    };
    let first = scaled
        .iter()
        .position(|d| *d != b'0')
        .unwrap_or(scaled.len());
    scaled.drain(..first);
    if scaled.len() > usize::from(precision) {
        return Err(too_many());
    }
    let n = if scaled.is_empty() {
        [0; 4]
    } else {
        magnitude(&scaled).ok_or_else(not)?
    };
    Ok(n)
}

/// The common decimal, read without allocating: `digits[.digits]` (no sign, no exponent) with
/// no more places than `scale`, whose scaled value fits 64 bits, as [`decimal`] reads it;
/// `None` for any other text (then [`decimal`]'s general reading decides, refusals included).
///
/// At most 18 digits once scaled, so no product overflows and none is checked: wasm32 has no
/// multiply with overflow, and a checked 64-bit multiply compiles to a 128-bit one
/// (`__multi3`), which was 5% of the guest's first pass over a `Decimal(18, 2)` column.
#[cfg(any(test, feature = "speed"))]
fn plain_decimal(t: &[u8], precision: u8, scale: u8) -> Option<u64> {
    let (int, frac) = t.split_at(t.iter().position(|b| *b == b'.').unwrap_or(t.len()));
    let frac = frac.get(1..).unwrap_or_default();
    let places = usize::from(scale).checked_sub(frac.len())?;
    if int.is_empty() || int.len() + frac.len() + places > 18 {
        return None;
    }
    let mut n = 0u64;
    for d in int.iter().chain(frac) {
        let digit = d.checked_sub(b'0').filter(|d| *d < 10)?;
        n = n * 10 + u64::from(digit);
    }
    let n = n * POW10[places];
    // Digits past the precision: the general reading names the refusal.
    POW10
        .get(usize::from(precision))
        .is_none_or(|limit| n < *limit)
        .then_some(n)
}

/// 10^0 to 10^19: every power of ten a `u64` holds.
#[cfg(any(test, feature = "speed"))]
const POW10: [u64; 20] = {
    let mut p = [1u64; 20];
    let mut i = 1;
    while i < 20 {
        p[i] = p[i - 1] * 10;
        i += 1;
    }
    p
};

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar.
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The calendar date of a day count from 1970-01-01.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn month_days(year: i64, month: u32) -> u32 {
    match month {
        2 if leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

#[inline]
fn digits_at(t: &[u8], from: usize, n: usize) -> Option<u32> {
    let part = t.get(from..from + n)?;
    part.iter()
        .all(u8::is_ascii_digit)
        .then(|| part.iter().fold(0u32, |a, d| a * 10 + u32::from(d - b'0')))
}

/// `YYYY-MM-DD`, a real day of the calendar: days since 1970-01-01.
pub fn date(t: &[u8]) -> Result<i64, Why> {
    let shape = "not a date (YYYY-MM-DD)";
    if t.len() != 10 || t[4] != b'-' || t[7] != b'-' {
        return Err(shape.into());
    }
    let (Some(year), Some(month), Some(day)) =
        (digits_at(t, 0, 4), digits_at(t, 5, 2), digits_at(t, 8, 2))
    else {
        return Err(shape.into());
    };
    let year = i64::from(year);
    if !(1..=12).contains(&month) {
        return Err("not a date: there is no such month".into());
    }
    let last = month_days(year, month);
    if day == 0 || day > last {
        return Err(format!(
            "not a date: {} {year} has {last} days",
            MONTHS[month as usize - 1]
        )
        .into());
    }
    Ok(days_from_civil(year, month, day))
}

/// A date and time as read: a wall-clock time (meant in the column's time zone) or an
/// instant (a Unix time, or a text with `Z` or an offset), in units of 10^-precision s.
/// 64 bits, as `DateTime64` stores them: an instant whose ticks do not fit is out of every
/// date-time type's range ([`moment`] refuses it). (Ticks were 128-bit, and multiplying them
/// showed in profiles of the guest's typed read.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moment {
    /// Ticks since 1970-01-01 00:00:00 of the wall clock.
    Local(i64),
    /// Ticks since the Unix epoch.
    Instant(i64),
}

/// The refusal of a date-time whose ticks at `precision` do not fit in 64 bits: only
/// `DateTime64` columns have so many ticks per second.
fn beyond_ticks(precision: u8) -> Why {
    if precision == 9 {
        "out of the range of DateTime64(9) (1900-01-01 00:00:00 to 2262-04-11 23:47:16.854775807 UTC)".into()
    } else {
        DATETIME64_RANGE_TEXT.into()
    }
}

/// The refusal of a date-time out of `DateTime64`'s range.
pub const DATETIME64_RANGE_TEXT: &str =
    "out of the range of DateTime64 (1900-01-01 00:00:00 to 2299-12-31 23:59:59)";

/// A date-time text or a Unix time for a column that keeps `precision` sub-second digits:
/// `YYYY-MM-DD hh:mm:ss[.f]` (or a `T` between), `YYYY-MM-DD` (midnight), either followed
/// by `Z` or `±hh:mm` (an instant: RFC 3339), or a Unix time (`[-]seconds[.f]`, as a number
/// or a text of at least five digits; `number`: the value was a JSON number, which is only
/// ever a Unix time). Fractions longer than `precision` are refused unless the extra digits are
/// zeros; the time of day must exist (no hour 24, no second 60).
pub fn moment(t: &[u8], precision: u8, number: bool) -> Result<Moment, Why> {
    let ticks = |secs: i64, fraction: i64| ticks(secs, fraction, precision);
    let keeps = |digits: &[u8]| fraction_ticks(digits, precision);
    // A date's fifth byte is its dash: no Unix time has one there (most texts are dates).
    let dated = t.get(4) == Some(&b'-');
    if !dated {
        if let Some((negative, secs, frac)) = unix_shape(t) {
            // A Unix time: a JSON number, or a text of five digits or more (as the server
            // reads one; a shorter text is no date either).
            if !number && secs.len() < 5 {
                return Err(MOMENT_SHAPE.into());
            }
            if secs.len() > 12 {
                return Err(MOMENT_SHAPE.into());
            }
            // At most 12 digits.
            let s = secs.iter().fold(0i64, |a, d| a * 10 + i64::from(d - b'0'));
            let ticks = ticks(s, keeps(frac)?)?;
            return Ok(Moment::Instant(if negative { -ticks } else { ticks }));
        }
    }
    if number {
        return Err(MOMENT_SHAPE.into());
    }
    let days = date(t.get(..10).ok_or(MOMENT_SHAPE)?).map_err(|e| {
        if e.starts_with("not a date:") {
            e
        } else {
            MOMENT_SHAPE.into()
        }
    })?;
    let mut rest = &t[10..];
    // Whole seconds first (days of years 0000-9999: at most 12 digits, whatever the offset),
    // scaled once at the end: a wall-clock time past the last tick whose offset brings it
    // back in is an instant the column holds.
    let mut secs = days * 86_400;
    let mut fraction = 0;
    if let Some((b' ' | b'T', time)) = rest.split_first() {
        let (of_day, f, after) = time_of_day(time, precision)?;
        (secs, fraction, rest) = (secs + of_day, f, after);
    }
    match rest {
        [] => Ok(Moment::Local(ticks(secs, fraction)?)),
        [b'Z' | b'z'] => Ok(Moment::Instant(ticks(secs, fraction)?)),
        [sign @ (b'+' | b'-'), ..] if rest.len() == 6 && rest[3] == b':' => {
            let (Some(h), Some(m)) = (digits_at(rest, 1, 2), digits_at(rest, 4, 2)) else {
                return Err(MOMENT_SHAPE.into());
            };
            if h > 23 || m > 59 {
                return Err(MOMENT_SHAPE.into());
            }
            let offset = i64::from(h * 3600 + m * 60);
            let utc = if *sign == b'+' {
                secs - offset
            } else {
                secs + offset
            };
            Ok(Moment::Instant(ticks(utc, fraction)?))
        }
        _ => Err(MOMENT_SHAPE.into()),
    }
}

/// `hh:mm:ss[.f]` at the start of `time`: its seconds since midnight, its fraction in ticks of
/// 10^-precision s, and the text after it.
fn time_of_day(time: &[u8], precision: u8) -> Result<(i64, i64, &[u8]), Why> {
    if time.len() < 8 || time[2] != b':' || time[5] != b':' {
        return Err(MOMENT_SHAPE.into());
    }
    let (Some(h), Some(m), Some(s)) = (
        digits_at(time, 0, 2),
        digits_at(time, 3, 2),
        digits_at(time, 6, 2),
    ) else {
        return Err(MOMENT_SHAPE.into());
    };
    if h > 23 || m > 59 || s > 59 {
        return Err(
            "not a time of day (hours 00-23, minutes and seconds 00-59: no hour 24, no leap second)"
                .into(),
        );
    }
    let secs = i64::from(h * 3600 + m * 60 + s);
    let rest = &time[8..];
    let Some((b'.', frac)) = rest.split_first() else {
        return Ok((secs, 0, rest));
    };
    let n = frac.iter().take_while(|b| b.is_ascii_digit()).count();
    if n == 0 {
        return Err(MOMENT_SHAPE.into());
    }
    Ok((secs, fraction_ticks(&frac[..n], precision)?, &frac[n..]))
}

/// Seconds and a fraction (in ticks of 10^-precision s, below one second) as ticks, if 64
/// bits hold them (the product bounded by a division, not checked: see `plain_decimal`).
fn ticks(secs: i64, fraction: i64, precision: u8) -> Result<i64, Why> {
    // At most 10^9 (a precision is at most 9).
    let scale = 10i64.pow(u32::from(precision));
    (secs.unsigned_abs() <= (i64::MAX / scale).unsigned_abs())
        .then(|| secs * scale)
        .and_then(|t| t.checked_add(fraction))
        .ok_or_else(|| beyond_ticks(precision))
}

/// A fraction's digits as ticks of 10^-precision s; digits past the precision must be zeros.
fn fraction_ticks(digits: &[u8], precision: u8) -> Result<i64, Why> {
    let (kept, rest) = digits.split_at(digits.len().min(usize::from(precision)));
    if rest.iter().any(|d| *d != b'0') {
        return Err(if precision == 0 {
            "has a fraction of a second, which the column does not keep (the server would drop it)"
                .into()
        } else {
            "has more sub-second digits than the column keeps (the server would drop them)".into()
        });
    }
    // At most 9 digits.
    let mut v = kept.iter().fold(0i64, |a, d| a * 10 + i64::from(d - b'0'));
    for _ in kept.len()..usize::from(precision) {
        v *= 10;
    }
    Ok(v)
}

/// `-?[0-9]+(.[0-9]+)?`: the sign, the seconds' digits and the fraction's.
fn unix_shape(t: &[u8]) -> Option<(bool, &[u8], &[u8])> {
    let (negative, body) = match t.first() {
        Some(b'-') => (true, &t[1..]),
        _ => (false, t),
    };
    let (secs, frac) = match body.iter().position(|b| *b == b'.') {
        Some(i) => (&body[..i], &body[i + 1..]),
        None => (body, &body[body.len()..]),
    };
    // A point needs digits after it.
    let fraction_ok = secs.len() == body.len() || !frac.is_empty();
    (!secs.is_empty() && fraction_ok && secs.iter().chain(frac).all(u8::is_ascii_digit))
        .then_some((negative, secs, frac))
}

/// What a date-time text may look like.
pub const MOMENT_SHAPE: &str = "not a date and time (YYYY-MM-DD hh:mm:ss, with a fraction where the column keeps one; a T for the space and a Z or ±hh:mm after it, as RFC 3339 writes it; or a Unix time)";

/// A UUID's 16 bytes as the column stores them (two little-endian 64-bit halves, the first
/// half first): 32 hex digits, with or without the dashes of the 8-4-4-4-12 form.
pub fn uuid(t: &[u8]) -> Result<[u8; 16], Why> {
    let hex: Vec<u8> = match t.len() {
        36 if [8, 13, 18, 23].iter().all(|&i| t[i] == b'-') => t
            .iter()
            .enumerate()
            .filter(|(i, _)| ![8, 13, 18, 23].contains(i))
            .map(|(_, b)| *b)
            .collect(),
        32 => t.to_vec(),
        _ => {
            return Err(
                "not a UUID (32 hexadecimal digits, with or without the dashes of 8-4-4-4-12)"
                    .into(),
            )
        }
    };
    let mut value: u128 = 0;
    for b in hex {
        let d = (b as char).to_digit(16).ok_or(
            "not a UUID (32 hexadecimal digits, with or without the dashes of 8-4-4-4-12)",
        )?;
        value = value << 4 | u128::from(d);
    }
    let high = (value >> 64) as u64;
    let low = value as u64;
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&high.to_le_bytes());
    out[8..].copy_from_slice(&low.to_le_bytes());
    Ok(out)
}

/// An IPv4 address in dotted decimal (no leading zeros, which readers take differently).
pub fn ipv4(t: &[u8]) -> Result<u32, Why> {
    let text = std::str::from_utf8(t).map_err(|_| "not an IPv4 address")?;
    let canonical = text
        .split('.')
        .all(|part| part == "0" || !part.starts_with('0'));
    match text.parse::<Ipv4Addr>() {
        Ok(a) if canonical => Ok(u32::from(a)),
        _ => Err("not an IPv4 address (a.b.c.d, each 0-255 without leading zeros)".into()),
    }
}

/// An IPv6 address (any text form without a zone or brackets), or an IPv4 address in dotted
/// decimal, stored as IPv4-mapped (`::ffff:a.b.c.d`), as the server stores it.
pub fn ipv6(t: &[u8]) -> Result<[u8; 16], Why> {
    let text = std::str::from_utf8(t).map_err(|_| "not an IPv6 address")?;
    if let Ok(a) = text.parse::<Ipv6Addr>() {
        return Ok(a.octets());
    }
    if text.contains('.') && !text.contains(':') {
        return ipv4(t).map(|v| Ipv4Addr::from(v).to_ipv6_mapped().octets());
    }
    Err("not an IPv6 address".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(w: Wide) -> i128 {
        i128::from(w[0]) | (i128::from(w[1]) << 64)
    }

    #[test]
    fn integers_at_their_bounds() {
        assert_eq!(small(integer(b"255", false, 8).unwrap()), 255);
        assert!(integer(b"256", false, 8).is_err());
        assert_eq!(integer(b"-128", true, 8).unwrap(), negate([128, 0, 0, 0]));
        assert!(integer(b"-129", true, 8).is_err());
        assert!(integer(b"128", true, 8).is_err());
        assert!(integer(b"-0", false, 8).is_err());
        assert_eq!(integer(b"-0", true, 8).unwrap(), [0; 4]);
        assert_eq!(small(integer(b"+007", false, 8).unwrap()), 7);
        for bad in [&b""[..], b"-", b"1.0", b"1e2", b" 1", b"0x10", b"one"] {
            assert!(integer(bad, true, 64).is_err(), "{bad:?}");
        }
        let max256 =
            "57896044618658097711785492504343953926634992332820282019728792003956564819967";
        assert_eq!(
            integer(max256.as_bytes(), true, 256).unwrap(),
            [u64::MAX, u64::MAX, u64::MAX, u64::MAX >> 1]
        );
        assert!(integer(
            b"57896044618658097711785492504343953926634992332820282019728792003956564819968",
            true,
            256
        )
        .is_err());
        assert_eq!(
            integer(
                b"-57896044618658097711785492504343953926634992332820282019728792003956564819968",
                true,
                256
            )
            .unwrap(),
            [0, 0, 0, 1 << 63]
        );
        assert_eq!(
            integer(b"18446744073709551615", false, 64).unwrap(),
            [u64::MAX, 0, 0, 0]
        );
        assert!(integer(b"18446744073709551616", false, 64).is_err());
    }

    #[test]
    fn floats_keep_their_magnitude() {
        assert_eq!(float(b"1.5", false).unwrap(), 1.5);
        assert!(float(b"1e40", false).is_err());
        assert!(float(b"1e40", true).is_ok());
        assert!(float(b"1e-50", false).is_err());
        assert!(float(b"1e-400", true).is_err());
        assert_eq!(float(b"0e-400", true).unwrap(), 0.0);
        assert_eq!(float(b"-0.0", true).unwrap().to_bits(), (-0.0f64).to_bits());
        assert!(float(b"inf", false).unwrap().is_infinite());
        assert!(float(b"NaN", true).unwrap().is_nan());
        for bad in [&b""[..], b"x", b"0x1p3", b" 1", b"1.5.5", b"e5"] {
            assert!(float(bad, true).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn decimals_keep_every_digit_or_are_refused() {
        assert_eq!(decimal(b"1.5", 5, 2).unwrap(), [150, 0, 0, 0]);
        assert_eq!(decimal(b"15e-1", 5, 2).unwrap(), [150, 0, 0, 0]);
        assert_eq!(decimal(b"1.230", 5, 2).unwrap(), [123, 0, 0, 0]);
        assert_eq!(decimal(b"-999.99", 5, 2).unwrap(), negate([99999, 0, 0, 0]));
        assert_eq!(decimal(b".5", 5, 2).unwrap(), [50, 0, 0, 0]);
        assert_eq!(decimal(b"1.", 5, 2).unwrap(), [100, 0, 0, 0]);
        assert_eq!(decimal(b"1e2", 5, 2).unwrap(), [10000, 0, 0, 0]);
        assert!(decimal(b"1.234", 5, 2).is_err());
        assert!(decimal(b"1000", 5, 2).is_err());
        assert!(decimal(b"1.5e-3", 5, 2).is_err());
        assert_eq!(decimal(b"0.000", 5, 2).unwrap(), [0; 4]);
        for bad in [&b""[..], b".", b"1e", b"1.5x", b"true", b"--1"] {
            assert!(decimal(bad, 10, 2).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_quick_decimal_reading_agrees_with_the_general_one() {
        let mut taken = 0;
        for int in [
            "0",
            "00",
            "7",
            "007",
            "12",
            "99999",
            "123456789012345678",
            "1234567890123456789",
        ] {
            for frac in ["", ".", ".0", ".5", ".05", ".50", ".123", ".000", "e1"] {
                let text = format!("{int}{frac}");
                for (precision, scale) in [
                    (1, 0),
                    (5, 2),
                    (9, 3),
                    (18, 2),
                    (18, 18),
                    (19, 1),
                    (38, 10),
                    (76, 0),
                ] {
                    let general = decimal_digits(text.as_bytes(), precision, scale);
                    match plain_decimal(text.as_bytes(), precision, scale) {
                        Some(n) => {
                            taken += 1;
                            assert_eq!(general, Ok([n, 0, 0, 0]), "{text} ({precision}, {scale})");
                        }
                        None => assert!(
                            general.is_err()
                                || text.contains('e')
                                || frac.len() > usize::from(scale) + 1
                                || int.len() + usize::from(scale) > 18,
                            "{text} ({precision}, {scale}) left to the general reading: {general:?}"
                        ),
                    }
                }
            }
        }
        assert!(taken > 100, "{taken}");
    }

    #[test]
    fn dates_are_days_of_the_calendar() {
        assert_eq!(date(b"1970-01-01").unwrap(), 0);
        assert_eq!(date(b"2149-06-06").unwrap(), 65535);
        assert_eq!(date(b"1900-01-01").unwrap(), -25567);
        assert_eq!(date(b"2024-02-29").unwrap(), 19782);
        assert!(date(b"2026-02-29")
            .unwrap_err()
            .contains("February 2026 has 28 days"));
        assert!(date(b"2026-02-30").is_err());
        assert!(date(b"2026-13-01").is_err());
        assert!(date(b"2026-2-3").is_err());
        assert!(date(b"20260203").is_err());
    }

    #[test]
    fn moments_local_and_instant() {
        assert_eq!(
            moment(b"1970-01-01 00:00:01", 0, false).unwrap(),
            Moment::Local(1)
        );
        assert_eq!(
            moment(b"1970-01-01T00:00:01.5", 3, false).unwrap(),
            Moment::Local(1500)
        );
        assert_eq!(
            moment(b"1970-01-02", 0, false).unwrap(),
            Moment::Local(86400)
        );
        assert_eq!(
            moment(b"1970-01-01T01:00:00+01:00", 0, false).unwrap(),
            Moment::Instant(0)
        );
        assert_eq!(
            moment(b"1970-01-01T00:00:00Z", 0, false).unwrap(),
            Moment::Instant(0)
        );
        assert_eq!(
            moment(b"1767225600", 0, false).unwrap(),
            Moment::Instant(1_767_225_600)
        );
        assert_eq!(moment(b"-1.5", 3, true).unwrap(), Moment::Instant(-1500));
        assert!(moment(b"1.000", 0, true).is_ok());
        assert!(moment(b"1.5", 0, true).unwrap_err().contains("fraction"));
        assert!(moment(b"2026", 0, false).is_err());
        assert!(moment(b"2026-01-01", 0, true).is_err());
        assert_eq!(moment(b"12345", 0, false).unwrap(), Moment::Instant(12345));
        assert!(moment(b"2026-11-01 24:00:00", 0, false).is_err());
        assert!(moment(b"2026-11-01 23:59:60", 0, false).is_err());
        assert!(moment(b"2026-01-01 10:00:00.1234", 3, false).is_err());
        assert!(moment(b"2026-01-01 10:00:00.1230", 3, false).is_ok());
        assert!(moment(b"2026-01-01 10:00:00.5", 0, false).is_err());
        assert!(moment(b"2026-02-30 10:00:00", 0, false)
            .unwrap_err()
            .contains("February"));
        for bad in [
            &b"yesterday"[..],
            b"10:00:61.000",
            b"2026-01-01 10:00",
            b"2026-01-01 10:00:00 ",
            b"",
            b"2026-01-01T10:00:00+5:00",
        ] {
            assert!(moment(bad, 3, false).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ticks_beyond_64_bits_are_out_of_range() {
        // The last instant DateTime64(9) holds (measured on the engine: the next nanosecond
        // is "Decimal math overflow"); a date-time's ticks are 64 bits, as the column's.
        assert_eq!(
            moment(b"2262-04-11 23:47:16.854775807", 9, false).unwrap(),
            Moment::Local(i64::MAX)
        );
        for late in [
            &b"2262-04-11 23:47:16.854775808"[..],
            b"2262-04-12",
            b"2262-04-11T23:47:16.854775807-00:01",
        ] {
            let why = moment(late, 9, false).unwrap_err();
            assert!(
                why.contains("DateTime64(9)") && why.contains("2262-04-11"),
                "{why}"
            );
        }
        assert!(moment(b"9223372036.854775808", 9, true)
            .unwrap_err()
            .contains("2262-04-11"));
        assert_eq!(
            moment(b"-9223372036.854775807", 9, true).unwrap(),
            Moment::Instant(-i64::MAX)
        );
        // An offset that brings a time past the last tick back before it: that instant.
        assert_eq!(
            moment(b"2262-04-12T05:00:00+06:00", 9, false).unwrap(),
            moment(b"2262-04-11T23:00:00Z", 9, false).unwrap()
        );
        assert!(moment(b"2262-04-11T23:50:00+01:00", 9, false).is_ok());
        assert!(moment(b"2262-04-11T23:47:16.854775807-00:01", 9, false).is_err());
        // Other precisions overflow only far beyond DateTime64's range.
        assert!(moment(b"9999-12-31 23:59:59", 8, false)
            .unwrap_err()
            .contains("2299-12-31"));
        assert!(moment(b"999999999999.5", 8, true)
            .unwrap_err()
            .contains("2299-12-31"));
        // A refused fraction is named as such, even on a number that would overflow.
        assert!(moment(b"999999999999.5", 0, true)
            .unwrap_err()
            .contains("fraction"));
    }

    #[test]
    fn uuids_and_addresses() {
        let u = uuid(b"61f0c404-5cb3-11e7-907b-a6006ad3dba0").unwrap();
        assert_eq!(crate::hex::hex(&u), "e711b35c04c4f061a0dbd36a00a67b90");
        assert_eq!(uuid(b"61F0C4045CB311E7907BA6006AD3DBA0").unwrap(), u);
        assert!(uuid(b"{61f0c404-5cb3-11e7-907b-a6006ad3dba0}").is_err());
        assert!(uuid(b"61f0c404-5cb3-11e7-907b-a6006ad3dbaz").is_err());
        assert_eq!(ipv4(b"1.2.3.4").unwrap(), 0x01020304);
        assert!(ipv4(b"01.2.3.4").is_err());
        assert!(ipv4(b"256.1.1.1").is_err());
        assert_eq!(
            ipv6(b"1.2.3.4").unwrap(),
            "::ffff:1.2.3.4".parse::<Ipv6Addr>().unwrap().octets()
        );
        assert!(ipv6(b"[::1]").is_err());
        assert!(ipv6(b"fe80::1%eth0").is_err());
    }
}
