//! A Singer SCHEMA's properties as ClickHouse columns (types through the sink's one type
//! model, [`Type`]), and the DDL that creates a stream's table or adds a new property to it.
//! The mapping (docs/meltano.md, "Tables"):
//!
//! | JSON Schema | ClickHouse |
//! |---|---|
//! | `integer` | `Int64`; `Int128` or `Int256` when its `minimum`/`maximum` need them |
//! | `number` with `multipleOf` (a power of ten, or any decimal step) | `Decimal(P, S)`: S from the step, P from `maximum`/`minimum` (38 without them) |
//! | `number` with `x-sql-datatype` `decimal(P,S)` / `numeric(P,S)` | `Decimal(P, S)` |
//! | `string` with `format: x-singer.decimal` | `Decimal(precision, scale)`, else `number_type` if a Decimal, else `String` (the text, exact) |
//! | other `number` (or `integer` and `number`) | `number_type`: `Float64` by default |
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
use crate::sink::types::Type;
use crate::text::escaped;

use super::config::{Engine, TargetConfig};
use super::names::Naming;

/// The Singer SDK's record metadata properties, which SDK targets drop from schemas and
/// records unless `add_record_metadata` is on (then every table has them, last, with the
/// SDK's schemas: [`metadata_schema`]).
pub const SDC_METADATA: [&str; 7] = [
    "_sdc_extracted_at",
    "_sdc_received_at",
    "_sdc_batched_at",
    "_sdc_deleted_at",
    "_sdc_sequence",
    "_sdc_table_version",
    "_sdc_sync_started_at",
];

/// The column of `load_method: upsert`'s version (a keyed stream's): when the target read the
/// record, in nanoseconds since 1970, strictly increasing within a run. The table's
/// `ReplacingMergeTree` keeps the row of the highest version per key.
pub const UPSERT_VERSION: &str = "_sdc_upsert_version";

/// The SDK's schema of a metadata property (`_add_sdc_metadata_to_schema`): the first four
/// are nullable date-times, the others nullable integers.
pub fn metadata_schema(property: &str) -> Value {
    if SDC_METADATA[..4].contains(&property) {
        serde_json::json!({"type": ["null", "string"], "format": "date-time"})
    } else {
        serde_json::json!({"type": ["null", "integer"]})
    }
}

/// One property as a column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    /// The property's name, as records give it.
    pub property: String,
    /// The column's name (the property's, conformed unless names are kept).
    pub name: String,
    /// Its ClickHouse type: as created from the SCHEMA, then as the table has it.
    pub ty: Type,
    /// The SCHEMA lets the value be an object, an array or several types: into a column of
    /// strings it goes as its JSON text.
    pub json: bool,
    /// Null is allowed.
    pub nullable: bool,
}

impl Column {
    /// The value goes as its JSON text (a JSON value into a column of strings).
    pub fn as_json_text(&self) -> bool {
        self.json
            && matches!(
                strip_nullable(self.ty.values()).values(),
                Type::String | Type::FixedString(_)
            )
    }

    /// The column holds dates (`Date`, `Date32`, nullable or not).
    pub fn is_date(&self) -> bool {
        matches!(
            strip_nullable(self.ty.values()).values(),
            Type::Date | Type::Date32
        )
    }
}

fn strip_nullable(t: &Type) -> &Type {
    match t {
        Type::Nullable(inner) => inner,
        t => t,
    }
}

/// The properties of a stream's SCHEMA as columns, in the schema's order; `invalid-input`
/// naming the stream and property for a schema that is not one.
pub fn columns(
    stream: &str,
    schema: &Value,
    keys: &[String],
    naming: Naming,
    number_type: &Type,
    metadata: bool,
) -> Result<Vec<Column>, Error> {
    let shown = escaped(stream);
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
                escaped(key)
            )));
        }
    }
    let metadata: Vec<(String, Value)> = match metadata {
        true => SDC_METADATA
            .iter()
            .map(|p| (p.to_string(), metadata_schema(p)))
            .collect(),
        false => Vec::new(),
    };
    let properties: Vec<(&String, &Value)> = properties
        .iter()
        .filter(|(name, _)| !SDC_METADATA.contains(&name.as_str()))
        .chain(metadata.iter().map(|(p, s)| (p, s)))
        .collect();
    let names: Vec<&str> = properties.iter().map(|(name, _)| name.as_str()).collect();
    if names.len() == metadata.len() {
        return Err(Error::invalid(format!(
            "the SCHEMA of stream '{shown}' has only Singer SDK metadata properties (_sdc_...), which are not loaded: a table needs a column"
        )));
    }
    let column_names = naming.columns(stream, &names)?;
    Ok(properties
        .into_iter()
        .zip(column_names)
        .map(|((property, schema), name)| {
            let (base, json, null) = mapped(schema, number_type);
            let nullable = null && !keys.contains(property);
            Column {
                property: property.clone(),
                name,
                ty: if nullable {
                    Type::Nullable(Box::new(base))
                } else {
                    base
                },
                json,
                nullable,
            }
        })
        .collect())
}

/// The key properties' columns.
pub fn key_columns(columns: &[Column], keys: &[String]) -> Vec<String> {
    keys.iter()
        .filter_map(|k| columns.iter().find(|c| c.property == *k))
        .map(|c| c.name.clone())
        .collect()
}

/// A property's base type, whether it may hold any JSON value, and whether it may be null.
fn mapped(property: &Value, number_type: &Type) -> (Type, bool, bool) {
    let mut alternatives: Vec<&Value> = match property.get("anyOf").and_then(Value::as_array) {
        Some(alternatives) => alternatives.iter().collect(),
        None => vec![property],
    };
    let type_names = |p: &Value| -> Vec<String> {
        match p.get("type") {
            Some(Value::String(t)) => vec![t.clone()],
            Some(Value::Array(ts)) => ts
                .iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect(),
            _ => vec![String::new()],
        }
    };
    let null = alternatives
        .iter()
        .any(|a| type_names(a).iter().any(|t| t == "null"));
    alternatives.retain(|a| type_names(a).iter().any(|t| t != "null"));
    let mut types: Vec<String> = alternatives
        .iter()
        .flat_map(|a| type_names(a))
        .filter(|t| t != "null")
        .collect();
    types.sort();
    types.dedup();
    let one = || *alternatives.first().expect("one alternative when one type");
    let base = match types
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["integer"] => integer(one()),
        ["integer", "number"] | ["number"] => number(one(), number_type),
        ["boolean"] => Type::Bool,
        ["string"] => match one().get("format").and_then(Value::as_str) {
            Some("date-time") => Type::DateTime64(6, Some("UTC".into())),
            Some("date") => Type::Date32,
            Some("x-singer.decimal") => decimal_hint(one())
                .or_else(|| {
                    matches!(number_type, Type::Decimal { .. }).then(|| number_type.clone())
                })
                .unwrap_or(Type::String),
            _ => Type::String,
        },
        _ => return (Type::String, true, null),
    };
    (base, false, null)
}

/// The bounds of a number property and whether each excludes itself.
fn bounds(p: &Value) -> impl Iterator<Item = (&Value, bool)> {
    [
        ("minimum", false),
        ("maximum", false),
        ("exclusiveMinimum", true),
        ("exclusiveMaximum", true),
    ]
    .into_iter()
    .filter_map(move |(k, exclusive)| p.get(k).filter(|v| v.is_number()).map(|v| (v, exclusive)))
}

/// `integer`: `Int64`, or wider when its bounds need it.
fn integer(p: &Value) -> Type {
    let widest = bounds(p)
        .map(|(v, _)| {
            let text = v.to_string();
            match text.parse::<i128>() {
                Ok(n) if i64::try_from(n).is_ok() => 64,
                Ok(_) => 128,
                // Past 128 bits, or written with a fraction or an exponent (`1e30`): by its
                // size, kept clear of each type's edge.
                Err(_) => match text.parse::<f64>().map(f64::abs) {
                    Ok(f) if f < 9.2e18 => 64,
                    Ok(f) if f < 1.7e38 => 128,
                    _ => 256,
                },
            }
        })
        .max()
        .unwrap_or(64);
    Type::Int {
        signed: true,
        bits: widest,
    }
}

/// `number`: a Decimal when the schema says how (a hint, or `multipleOf`), else `number_type`.
fn number(p: &Value, number_type: &Type) -> Type {
    if let Some(hint) = decimal_hint(p) {
        return hint;
    }
    let Some(step) = p.get("multipleOf").filter(|v| v.is_number()) else {
        return number_type.clone();
    };
    let Some(scale) = places(&step.to_string()) else {
        return number_type.clone();
    };
    let digits = bounds(p)
        .filter_map(|(v, exclusive)| v.as_f64().map(|b| whole_digits(b.abs(), exclusive)))
        .max();
    let precision = match digits {
        Some(d) => (d + scale).clamp(1, 76),
        None => 38u32.max(scale + 1).min(76),
    };
    if scale > precision {
        return number_type.clone();
    }
    Type::Decimal {
        precision: precision as u8,
        scale: scale as u8,
    }
}

/// Digits after the point of a decimal step written as JSON (`0.01` → 2, `1e-3` → 3, `5` → 0);
/// `None` past 76.
fn places(step: &str) -> Option<u32> {
    let (mantissa, exponent) = match step.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i64>().ok()?),
        None => (step, 0),
    };
    let decimals = mantissa
        .split_once('.')
        .map_or(0, |(_, f)| f.trim_end_matches('0').len()) as i64;
    u32::try_from((decimals - exponent).max(0))
        .ok()
        .filter(|s| *s <= 76)
}

/// How many whole digits the values up to a bound need (an exclusive power of ten, 10^k,
/// needs k; an inclusive one k + 1).
fn whole_digits(bound: f64, exclusive: bool) -> u32 {
    if bound < 1.0 {
        return 1;
    }
    let log = bound.log10();
    if log.fract() == 0.0 && exclusive {
        log as u32
    } else {
        log.floor() as u32 + 1
    }
}

/// A Decimal the schema names: `x-sql-datatype` `decimal(P,S)` / `numeric(P,S)`, or the SDK's
/// `x-singer.decimal` with `precision` and `scale`.
fn decimal_hint(p: &Value) -> Option<Type> {
    let valid = |precision: u64, scale: u64| {
        ((1..=76).contains(&precision) && scale <= precision).then_some(Type::Decimal {
            precision: precision as u8,
            scale: scale as u8,
        })
    };
    if let Some(hint) = p.get("x-sql-datatype").and_then(Value::as_str) {
        let hint = hint.trim().to_ascii_lowercase();
        let args = hint
            .strip_prefix("decimal(")
            .or_else(|| hint.strip_prefix("numeric("))
            .and_then(|rest| rest.strip_suffix(')'));
        if let Some((precision, scale)) = args.and_then(|a| a.split_once(',')) {
            return valid(precision.trim().parse().ok()?, scale.trim().parse().ok()?);
        }
    }
    let precision = p.get("precision").and_then(Value::as_u64)?;
    valid(
        precision,
        p.get("scale").and_then(Value::as_u64).unwrap_or(0),
    )
}

/// The ENGINE clause of a created table, and the deduplication window it needs.
fn engine(
    config: &TargetConfig,
    database: &str,
    table: &str,
    keys: &[String],
    versioned: bool,
) -> Result<(String, &'static str), Error> {
    let order_by = config.order_by.as_deref().unwrap_or(keys);
    // A ReplacingMergeTree keeps one row per ORDER BY value: only right when that value is
    // the record's key (every key column in the ORDER BY).
    let keyed = !keys.is_empty() && keys.iter().all(|k| order_by.contains(k));
    if versioned && (!keyed || order_by.iter().any(|c| !keys.contains(c))) {
        return Err(Error::invalid(format!(
            "load_method upsert: table {}.{} would be ordered by order_by_keys other than the key properties, and a ReplacingMergeTree keeps one row per ORDER BY value (an update would add a row, or rows of two keys would collapse)",
            escaped(database),
            escaped(table)
        )));
    }
    let replacing = match &config.engine {
        Engine::Auto => keyed,
        Engine::MergeTree => false,
        Engine::ReplacingMergeTree if order_by.is_empty() => {
            return Err(Error::invalid(format!(
                "setting engine_type = 'ReplacingMergeTree': table {}.{} has no key_properties or order_by_keys to order it by, and a ReplacingMergeTree ordered by nothing keeps one row of all",
                escaped(database),
                escaped(table)
            )))
        }
        Engine::ReplacingMergeTree => true,
        Engine::Refused(name) => {
            return Err(Error::invalid(format!(
                "setting engine_type = '{}': this engine adds rows up, so what is stored would not be what was sent; create table {}.{} yourself to use it (the target loads into an existing table as it is)",
                escaped(name),
                escaped(database),
                escaped(table)
            )))
        }
    };
    let family = if replacing {
        "ReplacingMergeTree"
    } else {
        "MergeTree"
    };
    // The newest record per key wins: the version column.
    let version = match versioned {
        true => quote_identifier(UPSERT_VERSION),
        false => String::new(),
    };
    // A deduplication window, so that a chunk sent again (same token) is dropped: the
    // replicated engines keep one by default; a plain MergeTree does not.
    Ok(if config.replicated || config.cluster.is_some() {
        let version = match versioned {
            true => format!(", {version}"),
            false => version,
        };
        (
            format!("Replicated{family}({{path:String}}, {{replica:String}}{version})"),
            "",
        )
    } else {
        (
            format!("{family}({version})"),
            " SETTINGS non_replicated_deduplication_window = 1000",
        )
    })
}

fn on_cluster(config: &TargetConfig) -> String {
    match &config.cluster {
        Some(c) => format!(" ON CLUSTER {}", quote_identifier(c)),
        None => String::new(),
    }
}

/// `CREATE TABLE IF NOT EXISTS` for a stream's table: names as `Identifier` parameters and
/// through [`quote_identifier`], types printed from [`Type`] (none of the SCHEMA's text), a
/// Replicated engine's path and replica as `String` parameters.
/// `path_uuid`: what `{uuid}` in `table_path` stands for when the statement is not
/// `ON CLUSTER` (ClickHouse expands it only there, in a Replicated database, or with the
/// table's UUID given in the statement, which takes no parameter): a UUID the target drew, so
/// each table it creates gets a ZooKeeper path of its own.
pub fn create_table(
    config: &TargetConfig,
    (database, table): (&str, &str),
    (columns, keys): (&[Column], &[String]),
    path_uuid: Option<&str>,
) -> Result<Query, Error> {
    let definitions: Vec<String> = columns
        .iter()
        .map(|c| format!("{} {}", quote_identifier(&c.name), c.ty))
        .collect();
    let versioned = columns.iter().any(|c| c.property == UPSERT_VERSION);
    let (engine, window) = engine(config, database, table, keys, versioned)?;
    let order_by = config.order_by.as_deref().unwrap_or(keys);
    let order = if order_by.is_empty() {
        "tuple()".to_string()
    } else {
        let columns: Vec<String> = order_by.iter().map(|k| quote_identifier(k)).collect();
        format!("({})", columns.join(", "))
    };
    let query = Query::write(
        "target-create-table",
        format!(
            "CREATE TABLE IF NOT EXISTS {{db:Identifier}}.{{t:Identifier}}{} ({}) ENGINE = {engine} ORDER BY {order}{window}",
            on_cluster(config),
            definitions.join(", ")
        ),
    )
    .param("db", database)
    .param("t", table);
    Ok(if config.replicated || config.cluster.is_some() {
        query
            .param(
                "path",
                config
                    .table_path
                    .replace("${table_name}", table)
                    .replace("$table_name", table)
                    .replace(
                        "{uuid}",
                        path_uuid
                            .filter(|_| config.cluster.is_none())
                            .unwrap_or("{uuid}"),
                    ),
            )
            .param("replica", &config.replica_name)
    } else {
        query
    })
}

/// `DROP TABLE IF EXISTS ... SYNC` (an overwrite's table left by an earlier run, or the old
/// table once swapped out).
pub fn drop_table(config: &TargetConfig, database: &str, table: &str) -> Query {
    Query::write(
        "target-drop-table",
        format!(
            "DROP TABLE IF EXISTS {{db:Identifier}}.{{t:Identifier}}{} SYNC",
            on_cluster(config)
        ),
    )
    .param("db", database)
    .param("t", table)
}

/// An overwrite's swap: `EXCHANGE TABLES` (atomic: a reader sees one table or the other) when
/// the table exists, else `RENAME TABLE` of the loaded one to its name.
pub fn swap_in(
    config: &TargetConfig,
    database: &str,
    (loaded, table): (&str, &str),
    exists: bool,
) -> Query {
    let statement = if exists {
        "EXCHANGE TABLES {db:Identifier}.{a:Identifier} AND {db:Identifier}.{b:Identifier}"
    } else {
        "RENAME TABLE {db:Identifier}.{a:Identifier} TO {db:Identifier}.{b:Identifier}"
    };
    Query::write(
        "target-swap-in",
        format!("{statement}{}", on_cluster(config)),
    )
    .param("db", database)
    .param("a", loaded)
    .param("b", table)
}

/// ACTIVATE_VERSION's end: the table's rows of versions before `version` deleted, or (with
/// `marked_at`, a `YYYY-MM-DD hh:mm:ss.ffffff` UTC instant) marked deleted in `_sdc_deleted_at`
/// where they are not yet. Mutations (`ALTER TABLE ... DELETE` / `UPDATE`, `ON CLUSTER` on a
/// cluster), waited for on every replica; each is safe to repeat. Rows without a version
/// (loaded without `add_record_metadata`) are kept, as SDK targets keep them.
pub fn retire_versions(
    config: &TargetConfig,
    (database, table): (&str, &str),
    (version_column, deleted_column): (&str, &str),
    version: i64,
    marked_at: Option<&str>,
) -> Query {
    // An UPDATE's assignment takes no parameter for its column: the name goes through the
    // one escaping function, as INSERT column lists do.
    let action = match marked_at {
        None => "DELETE WHERE {v:Identifier} < {version:Int64}".to_string(),
        Some(_) => format!(
            "UPDATE {} = {{at:DateTime64(6, 'UTC')}} WHERE {{v:Identifier}} < {{version:Int64}} AND {{d:Identifier}} IS NULL",
            quote_identifier(deleted_column)
        ),
    };
    let query = Query::write(
        "target-retire-versions",
        format!(
            "ALTER TABLE {{db:Identifier}}.{{t:Identifier}}{} {action}",
            on_cluster(config)
        ),
    )
    .param("db", database)
    .param("t", table)
    .param("v", version_column)
    .param("version", version.to_string())
    .setting("mutations_sync", "2");
    match marked_at {
        Some(at) => query.param("d", deleted_column).param("at", at),
        None => query,
    }
}

/// `ALTER TABLE ... ADD COLUMN IF NOT EXISTS` for a property new in a later SCHEMA.
pub fn add_column(config: &TargetConfig, database: &str, table: &str, column: &Column) -> Query {
    // A column added to rows already stored must be able to hold nothing for them.
    let ty = match &column.ty {
        t @ Type::Nullable(_) => t.clone(),
        t => Type::Nullable(Box::new(t.clone())),
    };
    Query::write(
        "target-add-column",
        format!(
            "ALTER TABLE {{db:Identifier}}.{{t:Identifier}}{} ADD COLUMN IF NOT EXISTS {} {ty}",
            on_cluster(config),
            quote_identifier(&column.name)
        ),
    )
    .param("db", database)
    .param("t", table)
}

/// `ALTER TABLE ... MODIFY COLUMN` to a wider type ([`super::tables::widened`]).
pub fn modify_column(
    config: &TargetConfig,
    database: &str,
    table: &str,
    column: &str,
    ty: &Type,
) -> Query {
    Query::write(
        "target-modify-column",
        format!(
            "ALTER TABLE {{db:Identifier}}.{{t:Identifier}}{} MODIFY COLUMN {} {ty}",
            on_cluster(config),
            quote_identifier(column)
        ),
    )
    .param("db", database)
    .param("t", table)
}

/// `CREATE DATABASE IF NOT EXISTS`.
pub fn create_database(config: &TargetConfig, database: &str) -> Query {
    Query::write(
        "target-create-database",
        format!(
            "CREATE DATABASE IF NOT EXISTS {{db:Identifier}}{}",
            on_cluster(config)
        ),
    )
    .param("db", database)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mapped_types(schema: Value, number_type: &str) -> Vec<(String, String, bool)> {
        let number_type = Type::parse(number_type).unwrap();
        columns(
            "s",
            &schema,
            &["id".into()],
            Naming::Conformed,
            &number_type,
            false,
        )
        .unwrap()
        .into_iter()
        .map(|c| (c.name, c.ty.to_string(), c.json))
        .collect()
    }

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
            "Name": {"type": "string"},
            "meta": {"type": ["null", "object"], "properties": {}},
            "tags": {"type": "array", "items": {"type": "string"}},
            "any": {},
            "mixed": {"type": ["string", "integer"]}
        }});
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
        assert_eq!(mapped_types(schema, "Float64"), want);
        for (schema, says) in [
            (json!({}), "no \"properties\""),
            (json!({"properties": {}}), "no properties"),
        ] {
            let e =
                columns("s", &schema, &[], Naming::Conformed, &Type::Float64, false).unwrap_err();
            assert!(e.message.contains(says), "{}", e.message);
        }
        let e = columns(
            "s",
            &json!({"properties": {"a": {}}}),
            &["b".into()],
            Naming::Conformed,
            &Type::Float64,
            false,
        )
        .unwrap_err();
        assert!(e.message.contains("key property 'b'"), "{}", e.message);
    }

    #[test]
    fn numbers_keep_their_digits_where_the_schema_says_how() {
        let schema = json!({"properties": {
            "id": {"type": "integer"},
            "big": {"type": "integer", "maximum": 170141183460469231731687303715884105727u128, "minimum": -1},
            "huge": {"type": ["integer", "null"], "maximum": 1e40},
            "money": {"type": "number", "multipleOf": 0.01, "exclusiveMaximum": 1e16, "exclusiveMinimum": -1e16},
            "step": {"type": "number", "multipleOf": 1e-4},
            "whole": {"type": "number", "multipleOf": 1},
            "hinted": {"type": "number", "x-sql-datatype": "NUMERIC(38, 0)"},
            "text_dec": {"type": "string", "format": "x-singer.decimal", "precision": 20, "scale": 5},
            "loose_dec": {"type": "string", "format": "x-singer.decimal"},
            "plain": {"type": "number"},
            "upto": {"type": "number", "multipleOf": 0.01, "maximum": 100, "minimum": 0},
            "_sdc_batched_at": {"type": "string", "format": "date-time"}
        }});
        let got = mapped_types(schema.clone(), "Float64");
        let types: Vec<&str> = got.iter().map(|(_, t, _)| t.as_str()).collect();
        assert_eq!(
            types,
            [
                "Int64",
                "Int128",
                "Nullable(Int256)",
                "Decimal(18, 2)",
                "Decimal(38, 4)",
                "Decimal(38, 0)",
                "Decimal(38, 0)",
                "Decimal(20, 5)",
                "String",
                "Float64",
                "Decimal(5, 2)"
            ]
        );
        let got = mapped_types(schema, "Decimal(76, 20)");
        assert_eq!(
            (got[8].1.as_str(), got[9].1.as_str()),
            ("Decimal(76, 20)", "Decimal(76, 20)")
        );
        assert_eq!(whole_digits(100.0, false), 3);
        assert_eq!(whole_digits(100.0, true), 2);
        assert_eq!(whole_digits(99.5, false), 2);
        assert_eq!(places("0.01"), Some(2));
        assert_eq!(places("5e-1"), Some(1));
        assert_eq!(places("2.50"), Some(1));
        assert_eq!(places("1e-90"), None);
    }

    #[test]
    fn a_replacing_engine_only_where_its_order_is_the_records_key() {
        let config = |extra: Value| {
            let mut c = json!({"host": "h"});
            c.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            TargetConfig::parse(&c.to_string()).unwrap()
        };
        let ddl = |c: &TargetConfig, keys: &[&str]| {
            let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
            let columns = columns(
                "s",
                &json!({"properties": {"id": {"type": "integer"}, "at": {"type": "integer"}}}),
                &keys,
                Naming::Conformed,
                &Type::Float64,
                false,
            )
            .unwrap();
            create_table(c, ("db", "t"), (&columns, &keys), None).map(|q| q.sql)
        };
        let auto = config(json!({}));
        assert!(ddl(&auto, &["id"])
            .unwrap()
            .contains("ENGINE = ReplacingMergeTree() ORDER BY (`id`)"));
        assert!(ddl(&auto, &[])
            .unwrap()
            .contains("ENGINE = MergeTree() ORDER BY tuple()"));
        // Ordered by another column than the key: rows with one `at` must not collapse.
        let by_at = config(json!({"order_by_keys": ["at"]}));
        assert!(ddl(&by_at, &["id"])
            .unwrap()
            .contains("ENGINE = MergeTree() ORDER BY (`at`)"));
        let by_both = config(json!({"order_by_keys": "at,id"}));
        assert!(ddl(&by_both, &["id"])
            .unwrap()
            .contains("ReplacingMergeTree() ORDER BY (`at`, `id`)"));
        let replacing = config(json!({"engine_type": "ReplacingMergeTree"}));
        let e = ddl(&replacing, &[]).unwrap_err();
        assert!(e.message.contains("ordered by nothing"), "{}", e.message);
        let summing = config(json!({"engine_type": "SummingMergeTree"}));
        let e = ddl(&summing, &["id"]).unwrap_err();
        assert!(e.message.contains("adds rows up"), "{}", e.message);
        let replicated =
            config(json!({"engine_type": "ReplicatedMergeTree", "table_path": "/t/${table_name}"}));
        // `{uuid}` in the default table_path: a drawn UUID, but ON CLUSTER (which expands it).
        let default_path = config(json!({"engine_type": "ReplicatedMergeTree"}));
        let q = create_table(&default_path, ("db", "t"), (&[], &[]), Some("u-1")).unwrap();
        assert!(
            format!("{q:?}").contains("/clickhouse/tables/u-1/{shard}"),
            "{q:?}"
        );
        let on_cluster = config(json!({"cluster_name": "c"}));
        let q = create_table(&on_cluster, ("db", "t"), (&[], &[]), Some("u-1")).unwrap();
        assert!(
            format!("{q:?}").contains("/clickhouse/tables/{uuid}/{shard}"),
            "{q:?}"
        );
        let q = create_table(&replicated, ("db", "t"), (&[], &[]), None).unwrap();
        assert!(
            q.sql
                .contains("ReplicatedMergeTree({path:String}, {replica:String})"),
            "{}",
            q.sql
        );
        // load_method upsert: versioned by the target's column, keyed or refused.
        let version = Column {
            property: UPSERT_VERSION.into(),
            name: UPSERT_VERSION.into(),
            ty: Type::parse("UInt64").unwrap(),
            json: false,
            nullable: false,
        };
        let keys = ["id".to_string()];
        let q = create_table(
            &auto,
            ("db", "t"),
            (std::slice::from_ref(&version), &keys),
            None,
        )
        .unwrap();
        assert!(
            q.sql
                .contains("ENGINE = ReplacingMergeTree(`_sdc_upsert_version`) ORDER BY (`id`)"),
            "{}",
            q.sql
        );
        let cluster = config(json!({"cluster_name": "c"}));
        let q = create_table(
            &cluster,
            ("db", "t"),
            (std::slice::from_ref(&version), &keys),
            None,
        )
        .unwrap();
        assert!(
            q.sql.contains(
                "ReplicatedReplacingMergeTree({path:String}, {replica:String}, `_sdc_upsert_version`)"
            ),
            "{}",
            q.sql
        );
        let e = create_table(
            &by_at,
            ("db", "t"),
            (std::slice::from_ref(&version), &keys),
            None,
        )
        .unwrap_err();
        assert!(
            e.message.contains("other than the key properties"),
            "{}",
            e.message
        );
        let e = create_table(
            &by_both,
            ("db", "t"),
            (std::slice::from_ref(&version), &keys),
            None,
        )
        .unwrap_err();
        assert!(
            e.message.contains("other than the key properties"),
            "{}",
            e.message
        );
    }

    #[test]
    fn older_versions_are_retired_by_a_mutation_on_every_replica() {
        let plain = TargetConfig::parse(r#"{"host": "h"}"#).unwrap();
        let cluster = TargetConfig::parse(r#"{"host": "h", "cluster_name": "c`1"}"#).unwrap();
        let names = ("_sdc_table_version", "_sdc_deleted_at");
        let q = retire_versions(&plain, ("db", "t"), names, 7, None);
        assert_eq!(
            q.sql,
            "ALTER TABLE {db:Identifier}.{t:Identifier} DELETE WHERE {v:Identifier} < {version:Int64}"
        );
        let at = "2026-12-05 12:00:00.000001";
        let q = retire_versions(&cluster, ("db", "t"), ("v`x", "d`y"), -3, Some(at));
        assert_eq!(
            q.sql,
            "ALTER TABLE {db:Identifier}.{t:Identifier} ON CLUSTER `c\\`1` UPDATE `d\\`y` = {at:DateTime64(6, 'UTC')} WHERE {v:Identifier} < {version:Int64} AND {d:Identifier} IS NULL"
        );
        let shown = format!("{q:?}");
        for part in ["v`x", "-3", at, "mutations_sync"] {
            assert!(shown.contains(part), "{part}: {shown}");
        }
    }
}
