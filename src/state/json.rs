//! State parts: JSON objects only, duplicate keys rejected at any depth, a size limit, and
//! Meltano's deep merge (objects merge recursively, everything else is replaced).

use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::client::Error;

/// Largest accepted state part, in bytes of JSON text.
pub const MAX_PART_BYTES: usize = 10 * 1024 * 1024;

/// How many levels of objects and arrays a state may nest (serde_json's recursion limit: a
/// deeper one is refused, never read by a recursion that could exhaust the stack).
pub const MAX_DEPTH: usize = 127;

/// Parses a state part: a JSON object, no duplicate keys at any depth, at most
/// [`MAX_PART_BYTES`]. Empty text means `{}`. `what` names the part in errors.
pub fn parse_part(text: &str, what: &str) -> Result<Map<String, Value>, Error> {
    if text.len() > MAX_PART_BYTES {
        return Err(Error::invalid(format!(
            "{what} is {} bytes; the limit is {MAX_PART_BYTES} bytes",
            text.len()
        )));
    }
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let value = StrictValue
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| Error::invalid(format!("{what} {}", describe_error(text, &e))))?;
    match value {
        Value::Object(map) => Ok(map),
        other => Err(Error::invalid(format!(
            "{what} must be a JSON object, not {}",
            kind_name(&other)
        ))),
    }
}

/// What is wrong with `text`, from serde_json's error `e`, said plainly where serde's words
/// would puzzle (a predicate, after the subject: "is not valid JSON: ..."): nesting past
/// [`MAX_DEPTH`], and the NaN / Infinity / -Infinity that Python's json writes but JSON has not.
pub fn describe_error(text: &str, e: &serde_json::Error) -> String {
    let (line, column) = (e.line(), e.column());
    if e.to_string().starts_with("recursion limit exceeded") {
        return format!(
            "nests objects and arrays more than {MAX_DEPTH} levels deep (line {line} column {column})"
        );
    }
    // serde's column counts bytes from 1 on its line; the token starts there, or one byte
    // before (after a '-').
    let at = text
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum::<usize>()
        + column.saturating_sub(1);
    let starts_nonfinite = |from: usize| {
        text.get(from..).is_some_and(|rest| {
            ["NaN", "Infinity", "-Infinity"]
                .iter()
                .any(|t| rest.starts_with(t))
        })
    };
    if e.is_syntax() && (starts_nonfinite(at) || (at > 0 && starts_nonfinite(at - 1))) {
        return format!(
            "is not valid JSON: NaN and Infinity are not JSON numbers (line {line} column {column})"
        );
    }
    format!("is not valid JSON: {e}")
}

/// Compact JSON text of a part; `None` for an empty object (stored as NULL, like
/// meltano-state-backend-clickhouse does).
pub fn part_text(part: &Map<String, Value>) -> Option<String> {
    if part.is_empty() {
        None
    } else {
        Some(Value::Object(part.clone()).to_string())
    }
}

/// Compact JSON text, `{}` for an empty object.
pub fn object_text(part: &Map<String, Value>) -> String {
    Value::Object(part.clone()).to_string()
}

/// Deep-merges `update` into `base`: objects merge key by key, recursively; any other value
/// in `update` replaces the one in `base`.
pub fn deep_merge(base: &mut Map<String, Value>, update: &Map<String, Value>) {
    for (key, new) in update {
        match (base.get_mut(key), new) {
            (Some(Value::Object(old)), Value::Object(new)) => deep_merge(old, new),
            _ => {
                base.insert(key.clone(), new.clone());
            }
        }
    }
}

fn kind_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Deserializes a [`Value`] like serde_json does, but fails on a duplicate object key.
struct StrictValue;

impl<'de> DeserializeSeed<'de> for StrictValue {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("number out of range"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(StrictValue)? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        // With serde_json's `arbitrary_precision`, numbers arrive as a one-entry map with a
        // private key; hand those back to serde_json untouched.
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if key == "$serde_json::private::Number" {
                let raw: String = map.next_value()?;
                let number: serde_json::Number = raw.parse().map_err(de::Error::custom)?;
                return Ok(Value::Number(number));
            }
            let value = map.next_value_seed(StrictValue)?;
            if out.contains_key(&key) {
                return Err(de::Error::custom(format!(
                    "duplicate key \"{}\"",
                    crate::text::escaped(&key.chars().take(100).collect::<String>())
                )));
            }
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn accepts_objects_and_empty_text() {
        assert_eq!(parse_part("", "p").unwrap(), Map::new());
        assert_eq!(parse_part("  ", "p").unwrap(), Map::new());
        assert_eq!(parse_part("{}", "p").unwrap(), Map::new());
        let m = parse_part(r#"{"a":{"b":[1,2,{"c":null}]}}"#, "p").unwrap();
        assert_eq!(Value::Object(m), json!({"a":{"b":[1,2,{"c":null}]}}));
    }

    #[test]
    fn rejects_non_objects_invalid_json_and_duplicates() {
        for (text, want) in [
            ("[1]", "must be a JSON object, not an array"),
            ("3", "not a number"),
            ("\"x\"", "not a string"),
            ("null", "not null"),
            ("true", "not a boolean"),
            ("{", "not valid JSON"),
            ("{} {}", "not valid JSON"),
            ("{'a':1}", "not valid JSON"),
            (r#"{"a":1,"a":2}"#, "duplicate key \"a\""),
            (r#"{"x":{"b":1,"b":1}}"#, "duplicate key \"b\""),
            (r#"{"x":[{"c":1,"c":2}]}"#, "duplicate key \"c\""),
        ] {
            let e = parse_part(text, "partial state").unwrap_err();
            assert_eq!(e.kind, crate::client::ErrorKind::InvalidInput);
            assert!(e.message.contains(want), "{text}: {}", e.message);
            assert!(e.message.starts_with("partial state"), "{}", e.message);
        }
    }

    #[test]
    fn nan_and_infinity_are_named() {
        for text in [
            r#"{"a":NaN}"#,
            r#"{"a":Infinity}"#,
            r#"{"a":-Infinity}"#,
            "{\n \"a\": [1,\n  NaN]}",
        ] {
            let e = parse_part(text, "p").unwrap_err();
            assert!(
                e.message
                    .starts_with("p is not valid JSON: NaN and Infinity are not JSON numbers"),
                "{text}: {}",
                e.message
            );
        }
        let e = parse_part(r#"{"a":Nope}"#, "p").unwrap_err();
        assert!(!e.message.contains("NaN"), "{}", e.message);
    }

    #[test]
    fn depth_limit() {
        let nested = |depth: usize| format!("{}1{}", "{\"d\":".repeat(depth), "}".repeat(depth));
        assert!(parse_part(&nested(MAX_DEPTH), "p").is_ok());
        let e = parse_part(&nested(MAX_DEPTH + 1), "p").unwrap_err();
        assert!(
            e.message
                .starts_with("p nests objects and arrays more than 127 levels deep"),
            "{}",
            e.message
        );
    }

    #[test]
    fn size_limit() {
        let big = format!("{{\"a\":\"{}\"}}", "x".repeat(MAX_PART_BYTES));
        let e = parse_part(&big, "completed state").unwrap_err();
        assert!(e.message.contains("limit"), "{}", e.message);
    }

    #[test]
    fn numbers_keep_their_exact_text() {
        let text = r#"{"big":123456789012345678901234567890,"f":0.1000000000000000055511151231257827,"neg":-9223372036854775808,"u":18446744073709551615}"#;
        let m = parse_part(text, "p").unwrap();
        assert_eq!(object_text(&m), text);
    }

    #[test]
    fn empty_parts_are_stored_as_null() {
        assert_eq!(part_text(&Map::new()), None);
        assert_eq!(
            part_text(&obj(json!({"a":1}))).as_deref(),
            Some(r#"{"a":1}"#)
        );
        assert_eq!(object_text(&Map::new()), "{}");
    }

    #[test]
    fn deep_merge_merges_objects_and_replaces_the_rest() {
        let mut base = obj(json!({
            "bookmarks": {"s1": {"v": 1, "keep": true}, "s2": {"v": 1}},
            "list": [1, 2, 3],
            "scalar": "old",
            "obj_to_scalar": {"x": 1}
        }));
        let update = obj(json!({
            "bookmarks": {"s1": {"v": 2}, "s3": {"v": 3}},
            "list": [9],
            "scalar": {"now": "object"},
            "obj_to_scalar": 5,
            "new": null
        }));
        deep_merge(&mut base, &update);
        assert_eq!(
            Value::Object(base),
            json!({
                "bookmarks": {"s1": {"v": 2, "keep": true}, "s2": {"v": 1}, "s3": {"v": 3}},
                "list": [9],
                "scalar": {"now": "object"},
                "obj_to_scalar": 5,
                "new": null
            })
        );
    }
}
