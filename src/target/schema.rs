//! A Singer SCHEMA's properties as ClickHouse columns, and the DDL that creates a stream's
//! table or adds a new property to it. The mapping (docs/meltano.md, "Tables"):
//!
//! | JSON Schema | ClickHouse |
//! |---|---|
//! | `integer` | `Int64` |
//! | `number` (or `integer` and `number`) | `Float64` |
//! | `boolean` | `Bool` |
//! | `string` with `format: date-time` | `DateTime64(6, 'UTC')` |
//! | `string` with `format: date` | `Date32` |
//! | `string` (other formats, `time` included) | `String` |
//! | `object`, `array`, several types, or none | `String` holding the value's JSON text |
//!
//! `null` among the types (or an `anyOf` alternative) makes the column `Nullable`, except for a
//! key property: keys order the table and ClickHouse sorts no `Nullable` (a null key is then
//! refused, naming the row).

use serde_json::Value;

use crate::client::sql::quote_identifier;
use crate::client::{Error, Query};

use super::config::{Engine, TargetConfig};

/// One property as a column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    /// The property's name.
    pub name: String,
    /// Its ClickHouse type, as created.
    pub ty: String,
    /// The value is stored as its JSON text (objects, arrays, mixed types).
    pub json_text: bool,
    /// Null is allowed.
    pub nullable: bool,
}

/// The properties of a stream's SCHEMA as columns, in the schema's order; `invalid-input`
/// naming the stream and property for a schema that is not one.
pub fn columns(stream: &str, schema: &Value, keys: &[String]) -> Result<Vec<Column>, Error> {
    let shown = crate::text::escaped(stream);
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            Error::invalid(format!(
                "the SCHEMA of stream '{shown}' has no \"properties\" object"
            ))
        })?;
    if properties.is_empty() {
        return Err(Error::invalid(format!(
            "the SCHEMA of stream '{shown}' has no properties: a table needs a column"
        )));
    }
    for key in keys {
        if !properties.contains_key(key) {
            return Err(Error::invalid(format!(
                "stream '{shown}': key property '{}' is not among its properties",
                crate::text::escaped(key)
            )));
        }
    }
    Ok(properties
        .iter()
        .map(|(name, property)| {
            let is_key = keys.contains(name);
            let (base, json_text, null) = mapped(property);
            let nullable = null && !is_key;
            Column {
                name: name.clone(),
                ty: if nullable {
                    format!("Nullable({base})")
                } else {
                    base.to_string()
                },
                json_text,
                nullable,
            }
        })
        .collect())
}

/// A property's base type, whether it is stored as JSON text, and whether it may be null.
fn mapped(property: &Value) -> (&'static str, bool, bool) {
    fn add<'v>(types: &mut Vec<(&'static str, Option<&'v str>)>, p: &'v Value) {
        let format = p.get("format").and_then(Value::as_str);
        match p.get("type") {
            Some(Value::String(t)) => types.push((t_static(t), format)),
            Some(Value::Array(ts)) => {
                for t in ts.iter().filter_map(Value::as_str) {
                    types.push((t_static(t), format));
                }
            }
            _ => types.push(("", format)),
        }
    }
    let mut types = Vec::new();
    match property.get("anyOf").and_then(Value::as_array) {
        Some(alternatives) => alternatives.iter().for_each(|a| add(&mut types, a)),
        None => add(&mut types, property),
    }
    let null = types.iter().any(|(t, _)| *t == "null");
    types.retain(|(t, _)| *t != "null");
    types.dedup();
    let base = match types.as_slice() {
        [("integer", _)] => "Int64",
        [("number", _)] | [("integer", _), ("number", _)] | [("number", _), ("integer", _)] => {
            "Float64"
        }
        [("boolean", _)] => "Bool",
        [("string", Some("date-time"))] => "DateTime64(6, 'UTC')",
        [("string", Some("date"))] => "Date32",
        [("string", _)] => "String",
        _ => return ("String", true, null),
    };
    (base, false, null)
}

/// The JSON Schema type names this mapping knows, as static text ("" for others).
fn t_static(t: &str) -> &'static str {
    [
        "null", "integer", "number", "boolean", "string", "object", "array",
    ]
    .into_iter()
    .find(|k| *k == t)
    .unwrap_or("other")
}

/// `CREATE TABLE IF NOT EXISTS` for a stream's table: names as `Identifier` parameters and
/// through [`quote_identifier`], types from [`columns`] (none of the SCHEMA's text).
pub fn create_table(
    config: &TargetConfig,
    table: &str,
    columns: &[Column],
    keys: &[String],
) -> Query {
    let on_cluster = match &config.cluster {
        Some(c) => format!(" ON CLUSTER {}", quote_identifier(c)),
        None => String::new(),
    };
    let definitions: Vec<String> = columns
        .iter()
        .map(|c| format!("{} {}", quote_identifier(&c.name), c.ty))
        .collect();
    let replacing = match config.engine {
        Engine::Auto => !keys.is_empty(),
        Engine::MergeTree => false,
        Engine::ReplacingMergeTree => true,
    };
    let family = if replacing {
        "ReplacingMergeTree"
    } else {
        "MergeTree"
    };
    // A deduplication window, so that a chunk sent again (same token) is dropped: the
    // replicated engines keep one by default; a plain MergeTree does not.
    let (engine, window) = match &config.cluster {
        Some(_) => (
            format!("Replicated{family}('/clickhouse/tables/{{uuid}}/{{shard}}', '{{replica}}')"),
            "",
        ),
        None => (
            format!("{family}()"),
            " SETTINGS non_replicated_deduplication_window = 1000",
        ),
    };
    let order = if keys.is_empty() {
        "tuple()".to_string()
    } else {
        let keys: Vec<String> = keys.iter().map(|k| quote_identifier(k)).collect();
        format!("({})", keys.join(", "))
    };
    Query::write(
        "target-create-table",
        format!(
            "CREATE TABLE IF NOT EXISTS {{db:Identifier}}.{{t:Identifier}}{on_cluster} ({}) ENGINE = {engine} ORDER BY {order}{window}",
            definitions.join(", ")
        ),
    )
    .param("db", &config.database)
    .param("t", table)
}

/// `ALTER TABLE ... ADD COLUMN IF NOT EXISTS` for a property new in a later SCHEMA.
pub fn add_column(config: &TargetConfig, table: &str, column: &Column) -> Query {
    let on_cluster = match &config.cluster {
        Some(c) => format!(" ON CLUSTER {}", quote_identifier(c)),
        None => String::new(),
    };
    // A column added to rows already stored must be able to hold nothing for them.
    let ty = if column.nullable || column.ty.starts_with("Nullable(") {
        column.ty.clone()
    } else {
        format!("Nullable({})", column.ty)
    };
    Query::write(
        "target-add-column",
        format!(
            "ALTER TABLE {{db:Identifier}}.{{t:Identifier}}{on_cluster} ADD COLUMN IF NOT EXISTS {} {ty}",
            quote_identifier(&column.name)
        ),
    )
    .param("db", &config.database)
    .param("t", table)
}

/// `CREATE DATABASE IF NOT EXISTS` for the tables' database.
pub fn create_database(config: &TargetConfig) -> Query {
    let on_cluster = match &config.cluster {
        Some(c) => format!(" ON CLUSTER {}", quote_identifier(c)),
        None => String::new(),
    };
    Query::write(
        "target-create-database",
        format!("CREATE DATABASE IF NOT EXISTS {{db:Identifier}}{on_cluster}"),
    )
    .param("db", &config.database)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_schema_types_map_to_columns() {
        let schema = json!({"properties": {
            "id": {"type": ["null", "integer"]},
            "price": {"type": ["number", "null"]},
            "n": {"type": ["integer", "number"]},
            "ok": {"type": "boolean"},
            "at": {"type": ["null", "string"], "format": "date-time"},
            "on": {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]},
            "t": {"type": "string", "format": "time"},
            "name": {"type": "string"},
            "meta": {"type": ["null", "object"], "properties": {}},
            "tags": {"type": "array", "items": {"type": "string"}},
            "any": {},
            "mixed": {"type": ["string", "integer"]}
        }});
        let got: Vec<(String, String, bool)> = columns("s", &schema, &["id".into()])
            .unwrap()
            .into_iter()
            .map(|c| (c.name, c.ty, c.json_text))
            .collect();
        let want = [
            ("id", "Int64", false),
            ("price", "Nullable(Float64)", false),
            ("n", "Float64", false),
            ("ok", "Bool", false),
            ("at", "Nullable(DateTime64(6, 'UTC'))", false),
            ("on", "Nullable(Date32)", false),
            ("t", "String", false),
            ("name", "String", false),
            ("meta", "Nullable(String)", true),
            ("tags", "String", true),
            ("any", "String", true),
            ("mixed", "String", true),
        ];
        let want: Vec<(String, String, bool)> = want
            .iter()
            .map(|(n, t, j)| (n.to_string(), t.to_string(), *j))
            .collect();
        assert_eq!(got, want);
        for (schema, says) in [
            (json!({}), "no \"properties\""),
            (json!({"properties": {}}), "no properties"),
        ] {
            let e = columns("s", &schema, &[]).unwrap_err();
            assert!(e.message.contains(says), "{}", e.message);
        }
        let e = columns("s", &json!({"properties": {"a": {}}}), &["b".into()]).unwrap_err();
        assert!(e.message.contains("key property 'b'"), "{}", e.message);
    }
}
