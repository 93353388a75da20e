//! Flattening (`flattening_enabled`, `flattening_max_depth`, `flattening_separator`,
//! `flattening_max_key_length`), as the Singer SDK's `helpers/_flattening.py` (singer-sdk
//! 0.54) does it in its mapper, before a target's sink sees the stream:
//!
//! - **The SCHEMA** ([`flatten_schema`]): an object property with `properties` above the
//!   depth becomes one property per nested property, named by the path joined with the
//!   separator (`address__city`); arrays, and objects at the depth, become JSON-text strings;
//!   a `oneOf`/`anyOf` property takes its first choice, made nullable; a property without a
//!   type is a nullable string. Two paths that name one column are refused. One difference:
//!   the properties of a nullable object are nullable here (a record whose object is null
//!   has none of them; SDK targets create every column nullable anyway).
//! - **A RECORD** ([`flatten_record`]): a nested object whose flattened name is not a
//!   property of the flattened SCHEMA is flattened likewise (up to the depth); any other
//!   object or array value becomes its JSON text as the SDK writes it (`serialize_json`:
//!   compact, non-ASCII escaped, numbers as Python's `Decimal` prints them).
//!
//! Byte-level over the record (values copied as written), so numbers and strings reach their
//! columns exactly as the tap sent them.

use serde_json::Value;

use crate::client::Error;
use crate::sink::json::object_fields;
use crate::text::escaped;

/// How records are flattened (`flattening_*` settings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flattening {
    /// Levels of nesting flattened (`flattening_max_depth`, at least 1).
    pub max_depth: usize,
    /// Joins a path's names (`flattening_separator`, `__`).
    pub separator: String,
    /// Names this long or longer are shortened (`flattening_max_key_length`, 255).
    pub max_key_length: usize,
}

/// The SDK's `flatten_key`: the path joined with the separator; while the name is
/// `max_key_length` long or longer, each part in turn (from the first) is shortened to the
/// capitals of its camel-cased form (`first_name` -> `fn`), or its first three characters
/// when that leaves one or none.
pub fn flatten_key(key: &str, parents: &[&str], f: &Flattening) -> String {
    let mut parts: Vec<String> = parents.iter().map(|p| p.to_string()).collect();
    parts.push(key.to_string());
    let mut reduced = 0;
    while parts.join(&f.separator).chars().count() >= f.max_key_length && reduced < parts.len() {
        let capitals: String = camelize(&parts[reduced])
            .chars()
            .filter(|c| !c.is_ascii_lowercase())
            .collect();
        parts[reduced] = if capitals.chars().count() > 1 {
            capitals
        } else {
            parts[reduced].chars().take(3).collect()
        }
        .to_lowercase();
        reduced += 1;
    }
    parts.join(&f.separator)
}

/// `inflection.camelize` (`re.sub(r"(?:^|_)(.)", upper, word)`): the first character, and
/// each after an underscore (which goes), in upper case; an underscore with no character after
/// it, or a newline (which `.` does not match), stays.
fn camelize(word: &str) -> String {
    let mut out = String::with_capacity(word.len());
    let mut chars = word.chars().peekable();
    let mut first = true;
    while let Some(c) = chars.next() {
        if first && c != '\n' {
            out.extend(c.to_uppercase());
        } else if c == '_' && chars.peek().is_some_and(|n| *n != '\n') {
            let next = chars.next().expect("peeked");
            out.extend(next.to_uppercase());
        } else {
            out.push(c);
        }
        first = false;
    }
    out
}

/// Whether a JSON Schema `type` (a name or a list of names) names `kind` (Python's `in`,
/// which for a name is a substring test).
fn has_type(ty: &Value, kind: &str) -> bool {
    match ty {
        Value::String(s) => s.contains(kind),
        Value::Array(a) => a.iter().any(|t| t.as_str() == Some(kind)),
        _ => false,
    }
}

/// The SCHEMA's properties flattened (the SDK's `flatten_schema`), in their order.
pub fn flatten_schema(schema: &Value, stream: &str, f: &Flattening) -> Result<Value, Error> {
    let mut items = Vec::new();
    flatten_properties(schema, &[], 0, f, false, &mut items);
    let mut properties = serde_json::Map::new();
    for (name, property) in items {
        if properties.insert(name.clone(), property).is_some() {
            return Err(Error::invalid(format!(
                "stream '{}': flattening names two properties '{}' (the SDK refuses it too: \"Duplicate column name produced in schema\")",
                escaped(stream),
                escaped(&name)
            )));
        }
    }
    let mut flat = schema.clone();
    if let Some(object) = flat.as_object_mut() {
        object.insert("properties".into(), Value::Object(properties));
    }
    Ok(flat)
}

/// Python's truth of a JSON value (`{}`, `[]`, `""`, `0`, `false` and `null` are false).
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// The SDK's `_flatten_schema` of one node, its items appended to `items` (nullable when
/// `in_nullable`: an object above may be null).
fn flatten_properties(
    node: &Value,
    parents: &[&str],
    level: usize,
    f: &Flattening,
    in_nullable: bool,
    items: &mut Vec<(String, Value)>,
) {
    let Some(properties) = node.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, property) in properties {
        let key = flatten_key(name, parents, f);
        if let Some(ty) = property.get("type") {
            let object = has_type(ty, "object");
            let nullable = in_nullable || has_type(ty, "null");
            if object && property.get("properties").is_some() && level < f.max_depth {
                let mut path = parents.to_vec();
                path.push(name);
                flatten_properties(property, &path, level + 1, f, nullable, items);
            } else if has_type(ty, "array") || object {
                // (`max_level > 0`: always, flattening being on.)
                let types = match nullable {
                    true => serde_json::json!(["string", "null"]),
                    false => serde_json::json!("string"),
                };
                items.push((key, serde_json::json!({ "type": types })));
            } else if in_nullable && !has_type(ty, "null") {
                let mut property = property.clone();
                property["type"] = match ty {
                    Value::Array(types) => {
                        Value::Array([types.clone(), vec![serde_json::json!("null")]].concat())
                    }
                    one => serde_json::json!([one, "null"]),
                };
                items.push((key, property));
            } else {
                items.push((key, property.clone()));
            }
        } else if let Some(first) = property
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_array)
            .and_then(|choices| choices.first())
            .filter(|first| truthy(first))
        {
            // oneOf, anyOf, ...: the first choice, nullable, when it is one of these kinds;
            // a choice of another kind is dropped (as the SDK drops it).
            let kind = first.get("type").and_then(Value::as_str).unwrap_or("");
            if matches!(kind, "string" | "array" | "object") {
                let mut choice = first.clone();
                choice["type"] = serde_json::json!(["null", kind]);
                items.push((key, choice));
            }
        } else {
            items.push((key, serde_json::json!({"type": ["null", "string"]})));
        }
    }
}

/// A record flattened for its stream's flattened SCHEMA, whose property names `declared`
/// says (the SDK's `flatten_record`), written to `out` as a JSON object.
pub fn flatten_record(
    record: &[u8],
    declared: &dyn Fn(&str) -> bool,
    f: &Flattening,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    out.push(b'{');
    let mut first = true;
    flatten_into(record, &[], 0, declared, f, out, &mut first)?;
    out.push(b'}');
    Ok(())
}

fn flatten_into(
    object: &[u8],
    parents: &[&str],
    level: usize,
    declared: &dyn Fn(&str) -> bool,
    f: &Flattening,
    out: &mut Vec<u8>,
    first: &mut bool,
) -> Result<(), String> {
    let fields =
        object_fields(object, None).map_err(|_| "the record is not a JSON object".to_string())?;
    for (name, value) in fields {
        let name = std::str::from_utf8(&name).map_err(|_| "a property name is not UTF-8")?;
        let key = flatten_key(name, parents, f);
        let nested = value.first() == Some(&b'{');
        if !declared(&key) && level < f.max_depth && value == b"null" {
            // A null object whose properties are columns: they are left out (null), rather
            // than warned about as a property the SCHEMA does not declare.
            continue;
        }
        if nested && !declared(&key) && level < f.max_depth {
            let mut path = parents.to_vec();
            path.push(name);
            flatten_into(value, &path, level + 1, declared, f, out, first)?;
            continue;
        }
        if !std::mem::take(first) {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, &key).expect("a string writes");
        out.push(b':');
        if nested || value.first() == Some(&b'[') {
            let parsed: Value = serde_json::from_slice(value).map_err(|e| {
                format!(
                    "property '{}' cannot be written as JSON text ({e}; flattening reads it up to 128 levels deep)",
                    escaped(&key)
                )
            })?;
            let mut text = String::new();
            python_json(&parsed, &mut text)
                .map_err(|why| format!("property '{}': {why}", escaped(&key)))?;
            serde_json::to_writer(&mut *out, &text).expect("a string writes");
        } else {
            out.extend_from_slice(value);
        }
    }
    Ok(())
}

/// A value as the SDK's `serialize_json` writes it (simplejson: `separators=(",", ":")`,
/// `ensure_ascii`, numbers read as `int` or `Decimal` and printed back).
fn python_json(value: &Value, out: &mut String) -> Result<(), String> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&python_number(&n.to_string())?),
        Value::String(s) => ascii_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                python_json(item, out)?;
            }
            out.push(']');
        }
        Value::Object(fields) => {
            out.push('{');
            for (i, (k, v)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ascii_string(k, out);
                out.push(':');
                python_json(v, out)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

/// A JSON string with every character outside space..`~` escaped (`ensure_ascii`).
fn ascii_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
}

/// A JSON number's text as Python prints what `json.loads(..., parse_float=Decimal)` reads:
/// an integer as `int` (`-0` is `0`), anything else as `Decimal.__str__`. An exponent past
/// what Python's `Decimal` takes is refused (the SDK fails on it too).
fn python_number(text: &str) -> Result<String, String> {
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let too_large = || format!("the number {text} has an exponent Python's Decimal does not take");
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(at) => match body[at + 1..].parse::<i64>() {
            Ok(e) if e.unsigned_abs() <= 999_999_999_999_999_999 => (&body[..at], e),
            _ => return Err(too_large()),
        },
        None => (body, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if fraction.is_empty() && !mantissa.contains('.') && !body.contains(['e', 'E']) {
        let digits = whole.trim_start_matches('0');
        return Ok(match (negative && !digits.is_empty(), digits.is_empty()) {
            (_, true) => "0".into(),
            (true, false) => format!("-{digits}"),
            (false, false) => digits.to_string(),
        });
    }
    let all = format!("{whole}{fraction}");
    let coefficient = match all.trim_start_matches('0') {
        "" => "0",
        digits => digits,
    };
    // |exponent| <= 10^18 and a line's length: no overflow.
    let exp = exponent - fraction.len() as i64;
    let len = coefficient.len() as i64;
    let left = exp + len;
    let dot = if exp <= 0 && left > -6 { left } else { 1 };
    let (int_part, frac_part) = if dot <= 0 {
        (
            "0".to_string(),
            format!(".{}{coefficient}", "0".repeat((-dot) as usize)),
        )
    } else if dot >= len {
        (
            format!("{coefficient}{}", "0".repeat((dot - len) as usize)),
            String::new(),
        )
    } else {
        (
            coefficient[..dot as usize].to_string(),
            format!(".{}", &coefficient[dot as usize..]),
        )
    };
    let exp_part = match left == dot {
        true => String::new(),
        false => format!("E{:+}", left - dot),
    };
    let sign = if negative { "-" } else { "" };
    Ok(format!("{sign}{int_part}{frac_part}{exp_part}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn options(depth: usize) -> Flattening {
        Flattening {
            max_depth: depth,
            separator: "__".into(),
            max_key_length: 255,
        }
    }

    #[test]
    fn numbers_print_as_python_decimal_and_int() {
        for (text, want) in [
            ("0", "0"),
            ("-0", "0"),
            ("12", "12"),
            ("-12", "-12"),
            ("1.50", "1.50"),
            ("-0.0", "-0.0"),
            ("0.00", "0.00"),
            ("1e5", "1E+5"),
            ("1.0e-7", "1.0E-7"),
            ("0.0000001", "1E-7"),
            ("0.000001", "0.000001"),
            ("123.456e2", "12345.6"),
            ("1E+2", "1E+2"),
            ("0e3", "0E+3"),
            ("100", "100"),
        ] {
            assert_eq!(python_number(text).unwrap(), want, "{text}");
        }
        for text in [
            "1e99999999999999999999",
            "1e9223372036854775807",
            "-1e-9223372036854775808",
        ] {
            assert!(
                python_number(text).unwrap_err().contains("exponent"),
                "{text}"
            );
        }
    }

    #[test]
    fn keys_are_joined_and_shortened_as_the_sdk_does() {
        let f = options(3);
        assert_eq!(flatten_key("foo", &["bar", "baz"], &f), "bar__baz__foo");
        let short = Flattening {
            max_key_length: 20,
            ..options(3)
        };
        // 'first_name' -> 'FirstName' -> 'fn'; 'x' -> 'x' (one capital: its first three
        // characters); still too long: 'street_address' -> 'sa'. Checked against singer-sdk.
        assert_eq!(
            flatten_key("street_address", &["first_name", "x"], &short),
            "fn__x__sa"
        );
        let shorter = Flattening {
            max_key_length: 8,
            ..options(3)
        };
        assert_eq!(
            flatten_key("éa_b", &["Über_straße", "x"], &shorter),
            "üsß__x__éb"
        );
        // An underscore with nothing after it stays (inflection's pattern needs a character).
        assert_eq!(
            flatten_key("type_", &["longparentname"], &shorter),
            "lon__t_"
        );
        assert_eq!(flatten_key("ab_", &["longparentname"], &shorter), "lon__a_");
    }

    #[test]
    fn schemas_and_records_flatten_as_the_sdk_flattens_them() {
        let schema = json!({"properties": {
            "id": {"type": "integer"},
            "address": {"type": ["object", "null"], "properties": {
                "city": {"type": "string"},
                "zip": {"type": ["integer"]},
                "geo": {"type": "object", "properties": {"lat": {"type": "number"}}}}},
            "tags": {"type": ["array", "null"], "items": {"type": "string"}},
            "free": {"type": "object"},
            "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            "empty_first": {"anyOf": [{}, {"type": "integer"}]},
            "int_first": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            "untyped": {}
        }});
        let flat = flatten_schema(&schema, "s", &options(1)).unwrap();
        assert_eq!(
            flat["properties"],
            json!({
                "id": {"type": "integer"},
                "address__city": {"type": ["string", "null"]},
                "address__zip": {"type": ["integer", "null"]},
                "address__geo": {"type": ["string", "null"]},
                "tags": {"type": ["string", "null"]},
                "free": {"type": "string"},
                "either": {"type": ["null", "string"]},
                "empty_first": {"type": ["null", "string"]},
                "untyped": {"type": ["null", "string"]}
            })
        );
        let names: Vec<String> = flat["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        let declared = |k: &str| names.iter().any(|n| n == k);
        let record = br#"{"id": 1, "address": {"city": "K\u00f6ln", "geo": {"lat": 50.94, "x": "\u00e9"}}, "tags": ["a", 1e5], "free": {"k": -0}, "either": "s"}"#;
        let mut out = Vec::new();
        flatten_record(record, &declared, &options(1), &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"id":1,"address__city":"K\u00f6ln","address__geo":"{\"lat\":50.94,\"x\":\"\\u00e9\"}","tags":"[\"a\",1E+5]","free":"{\"k\":0}","either":"s"}"#
        );
        // A null object is left out, its columns null.
        let mut out = Vec::new();
        flatten_record(
            br#"{"id":2,"address":null}"#,
            &declared,
            &options(1),
            &mut out,
        )
        .unwrap();
        assert_eq!(out, br#"{"id":2}"#);
        // Two paths naming one column are refused.
        let clash = json!({"properties": {"a__b": {"type": "string"},
            "a": {"type": "object", "properties": {"b": {"type": "string"}}}}});
        let e = flatten_schema(&clash, "s", &options(1)).unwrap_err();
        assert!(e.message.contains("'a__b'"), "{}", e.message);
    }
}
