//! The target table's column types, read once per sink (`DESCRIBE TABLE`), and the one rule
//! the sink needs from them: where a JSON `null` may go.
//!
//! ClickHouse's JSON input stores a `null` sent to a non-Nullable number as 0 (and to a
//! non-Nullable element of an array or map as its default) whatever
//! `input_format_null_as_default` says: the number reader takes `null` as zero. An
//! acknowledged, exact sink cannot let that happen silently, so nulls are checked against the
//! column types before any INSERT.

use std::collections::HashMap;

use serde_json::Value as Json;

pub use super::exact::may_be_inexact;
use super::exact::Exact;

/// What a column's type does with a JSON `null`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NullRule {
    /// `null` is a value of the type (`Nullable(T)`, `LowCardinality(Nullable(T))`, `JSON`,
    /// `Dynamic`, `Variant(...)`, `Object(...)`, `Nothing`).
    Accepts,
    /// No `null` at the top level; anything inside is left alone: scalars (`UInt32`, and
    /// `String`, which keeps a JSON object's text as it is) and composites with a Nullable,
    /// JSON, Dynamic or Variant part inside (`Array(Nullable(UInt32))`).
    RefusesTopLevel,
    /// No `null` anywhere in the value: an `Array`, `Map`, `Tuple` or `Nested` with no part
    /// that holds a null (`Array(UInt32)`, `Map(String, Int64)`).
    Refuses,
}

/// The rule for a ClickHouse type name as `DESCRIBE TABLE` prints it.
///
/// Conservative for composites: a nested `null` is allowed only where the elements of an
/// `Array` or the values of a `Map` are directly `Nullable` scalars; in a `Tuple`, or anything
/// deeper, every nested `null` is refused (even one whose element type is Nullable), so a null
/// can never reach a non-Nullable part and become its default.
pub fn null_rule(ty: &str) -> NullRule {
    let inner = unwrap_type(ty.trim());
    if accepts_null(inner) {
        return NullRule::Accepts;
    }
    let composite = ["Array(", "Map(", "Tuple(", "Nested("]
        .iter()
        .any(|c| inner.starts_with(c));
    if !composite {
        return NullRule::RefusesTopLevel;
    }
    let element = if let Some(args) = arguments(inner, "Array(") {
        Some(args)
    } else {
        arguments(inner, "Map(").and_then(|args| split_top_level(args).map(|(_, value)| value))
    };
    match element.map(|e| unwrap_type(e.trim())) {
        Some(e) if e.starts_with("Nullable(") && is_scalar(e) => NullRule::RefusesTopLevel,
        _ => NullRule::Refuses,
    }
}

/// A type with `LowCardinality(...)` and `SimpleAggregateFunction(f, ...)` wrappers removed.
fn unwrap_type(ty: &str) -> &str {
    if let Some(args) = arguments(ty, "LowCardinality(") {
        return unwrap_type(args.trim());
    }
    if let Some(args) = arguments(ty, "SimpleAggregateFunction(") {
        if let Some((_, t)) = split_top_level(args) {
            return unwrap_type(t.trim());
        }
    }
    ty
}

fn accepts_null(t: &str) -> bool {
    t.starts_with("Nullable(")
        || t == "JSON"
        || t.starts_with("JSON(")
        || t.starts_with("Object(")
        || t == "Dynamic"
        || t.starts_with("Dynamic(")
        || t.starts_with("Variant(")
        || t == "Nothing"
}

/// Whether a type has no composite or null-holding part inside.
fn is_scalar(t: &str) -> bool {
    let inside = t.strip_prefix("Nullable(").unwrap_or(t);
    ![
        "Array(", "Map(", "Tuple(", "Nested(", "JSON", "Object(", "Dynamic", "Variant(",
    ]
    .iter()
    .any(|part| inside.contains(part))
}

/// The text between `prefix` and the type's final `)`.
fn arguments<'t>(ty: &'t str, prefix: &str) -> Option<&'t str> {
    ty.strip_prefix(prefix)?.strip_suffix(')')
}

/// Splits `a, b` at its first comma outside parentheses and quotes.
fn split_top_level(args: &str) -> Option<(&str, &str)> {
    let mut depth = 0i32;
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in args.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '\'' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => return Some((&args[..i], &args[i + 1..])),
            _ => {}
        }
    }
    None
}

/// Where column types come from when a value might hold a null: a sink asks the server once,
/// on the first such value (null-free data costs no request).
pub trait ColumnTypeSource {
    /// The table's column types.
    fn column_types(&self) -> Result<&ColumnTypes, crate::client::Error>;
}

impl ColumnTypeSource for ColumnTypes {
    fn column_types(&self) -> Result<&ColumnTypes, crate::client::Error> {
        Ok(self)
    }
}

/// Whether a value's JSON text needs the column types to be checked: it could be or hold a
/// `null`, or a number, date-time or composite its column might not hold exactly (cheap tests
/// before the types are asked for).
pub fn needs_types(value: &str) -> bool {
    may_be_inexact(value)
        || (matches!(value.as_bytes().first(), Some(b'n' | b'[' | b'{')) && may_hold_null(value))
}

/// Whether a value's JSON text could be or contain a `null` (a cheap test before a real check).
pub fn may_hold_null(value: &str) -> bool {
    let value = value.trim();
    match value.as_bytes().first() {
        Some(b'n') => value == "null",
        Some(b'[' | b'{') => value.contains("null"),
        _ => false,
    }
}

/// Column name to null rule, for one table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ColumnTypes {
    rules: HashMap<String, ColumnRule>,
}

/// What one column takes: where a null may go, what its type holds exactly, and the type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColumnRule {
    null: NullRule,
    exact: Exact,
    ty: String,
}

impl ColumnRule {
    /// Checks one value, given as JSON text; the reason when ClickHouse would store
    /// something else: a null turned into a default, or a value the type cannot hold exactly
    /// ([`Exact`]).
    pub fn check(&self, value: &str) -> Result<(), String> {
        if self.exact != Exact::Any {
            self.exact.check_text(value).map_err(|why| {
                let ty: String = self.ty.chars().take(80).collect();
                format!("{why}; the column's type is {ty}")
            })?;
        }
        let value = value.trim();
        let refused = match self.null {
            NullRule::Accepts => false,
            NullRule::RefusesTopLevel => value == "null",
            NullRule::Refuses => {
                value == "null"
                    || ((value.starts_with('[') || value.starts_with('{'))
                        && value.contains("null")
                        && serde_json::from_str::<Json>(value).is_ok_and(|v| has_null(&v)))
            }
        };
        if refused {
            Err(refusal(&self.ty, value == "null"))
        } else {
            Ok(())
        }
    }
}

impl ColumnTypes {
    /// From `(name, type)` pairs.
    pub fn new<I: IntoIterator<Item = (String, String)>>(columns: I) -> Self {
        ColumnTypes {
            rules: columns
                .into_iter()
                .map(|(name, ty)| {
                    let rule = ColumnRule {
                        null: null_rule(&ty),
                        exact: Exact::of(&ty),
                        ty,
                    };
                    (name, rule)
                })
                .collect(),
        }
    }

    /// Checks one value, given as JSON text, against its column ([`ColumnRule::check`]).
    /// Unknown columns pass (the server names them).
    pub fn check_json(&self, column: &str, value: &str) -> Result<(), String> {
        self.rules
            .get(column)
            .map_or(Ok(()), |rule| rule.check(value))
    }

    /// The rule of `column`, if the table has it.
    pub fn rule(&self, column: &str) -> Option<&ColumnRule> {
        self.rules.get(column)
    }

    /// Whether `column` takes a top-level null.
    pub fn check_null(&self, column: &str) -> Result<(), String> {
        match self.rules.get(column) {
            Some(ColumnRule {
                null: NullRule::Accepts,
                ..
            })
            | None => Ok(()),
            Some(rule) => Err(refusal(&rule.ty, true)),
        }
    }
}

fn refusal(ty: &str, top_level: bool) -> String {
    let ty: String = ty.chars().take(80).collect();
    if top_level {
        format!("null for a column of type {ty}, which is not Nullable (ClickHouse would store a default such as 0 or '')")
    } else {
        format!("a null inside a value for a column of type {ty}, whose elements are not Nullable (ClickHouse would store a default such as 0)")
    }
}

fn has_null(value: &Json) -> bool {
    match value {
        Json::Null => true,
        Json::Array(items) => items.iter().any(has_null),
        Json::Object(map) => map.values().any(has_null),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use NullRule::*;

    #[test]
    fn rules_by_type() {
        for (ty, want) in [
            ("UInt32", RefusesTopLevel),
            ("String", RefusesTopLevel),
            ("DateTime64(3)", RefusesTopLevel),
            ("Array(UInt32)", Refuses),
            ("Map(String, Int64)", Refuses),
            ("Tuple(x String, y UInt8)", Refuses),
            ("LowCardinality(String)", RefusesTopLevel),
            ("Array(Array(UInt8))", Refuses),
            ("Nullable(UInt32)", Accepts),
            ("LowCardinality(Nullable(String))", Accepts),
            ("JSON", Accepts),
            ("JSON(max_dynamic_paths = 8)", Accepts),
            ("Dynamic", Accepts),
            ("Variant(String, UInt64)", Accepts),
            ("Array(Nullable(UInt32))", RefusesTopLevel),
            ("Array(LowCardinality(Nullable(String)))", RefusesTopLevel),
            ("Map(String, Nullable(String))", RefusesTopLevel),
            (
                "Map(LowCardinality(String), Nullable(Decimal(10, 2)))",
                RefusesTopLevel,
            ),
            ("SimpleAggregateFunction(anyLast, Nullable(UInt8))", Accepts),
            ("SimpleAggregateFunction(sum, UInt64)", RefusesTopLevel),
            // Conservative: nested nulls are refused wherever a non-Nullable part could take one.
            ("Tuple(a JSON)", Refuses),
            ("Tuple(a Nullable(UInt8), b UInt8)", Refuses),
            ("Tuple(JSONx UInt8)", Refuses),
            ("Array(Tuple(n Nullable(UInt8), m UInt32))", Refuses),
            ("Map(String, Tuple(Nullable(UInt8), UInt8))", Refuses),
            ("Array(Array(Nullable(UInt8)))", Refuses),
            ("Map(String, Array(Nullable(UInt8)))", Refuses),
            ("Enum8('Nullable(' = 1, 'x' = 2)", RefusesTopLevel),
        ] {
            assert_eq!(null_rule(ty), want, "{ty}");
        }
    }

    #[test]
    fn values_are_checked_against_their_column() {
        let types = ColumnTypes::new(
            [
                ("n", "UInt32"),
                ("s", "String"),
                ("ns", "Nullable(String)"),
                ("a", "Array(UInt32)"),
                ("an", "Array(Nullable(UInt32))"),
                ("m", "Map(String, UInt8)"),
                ("j", "JSON"),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string())),
        );
        assert!(types.check_json("n", "1").is_ok());
        assert!(types
            .check_json("n", " null ")
            .unwrap_err()
            .contains("UInt32"));
        assert!(types.check_json("s", "null").is_err());
        assert!(types.check_json("s", "\"null\"").is_ok());
        // A String keeps a JSON value's text, nulls and all.
        assert!(types.check_json("s", "{\"k\":null}").is_ok());
        assert!(types.check_json("ns", "null").is_ok());
        assert!(types
            .check_json("a", "[1,null]")
            .unwrap_err()
            .contains("inside"));
        assert!(types.check_json("a", "[1,2]").is_ok());
        assert!(types.check_json("a", "[\"null\"]").is_ok());
        assert!(types.check_json("an", "[1,null]").is_ok());
        assert!(types.check_json("an", "null").is_err());
        assert!(types.check_json("m", "{\"k\":null}").is_err());
        assert!(types.check_json("j", "null").is_ok());
        assert!(types.check_json("j", "{\"k\":null}").is_ok());
        assert!(types.check_json("unknown", "null").is_ok());
        assert!(types.check_null("n").is_err());
        assert!(types.check_null("ns").is_ok());
        assert!(types.check_null("unknown").is_ok());
    }
}
