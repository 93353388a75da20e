//! Every setting the loader knows, in one table ([`SETTINGS`]) that drives `--about`, the
//! parsing and the defaults: the Meltano Hub's target-clickhouse (the shaped-ai variant,
//! shaped-target-clickhouse 0.2.5), the Singer SDK's built-in target settings (0.36, which it
//! pins, to 0.54), and ours. Each is honoured with the Hub's meaning, accepted with a warning
//! that it has no effect here (and why), or refused when ignoring it would change what is
//! stored. A key that no one defines gets a warning naming it and the nearest known name.

use serde_json::{Map, Value};

use crate::client::Error;
use crate::text::escaped;

/// A setting's JSON type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A string.
    String,
    /// A whole number.
    Integer,
    /// `true` or `false`.
    Boolean,
    /// A JSON object.
    Object,
    /// A list (or a comma-separated string).
    Array,
}

impl Kind {
    /// The JSON Schema type name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::String => "string",
            Kind::Integer => "integer",
            Kind::Boolean => "boolean",
            Kind::Object => "object",
            Kind::Array => "array",
        }
    }
}

/// Where a setting comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The Hub's target-clickhouse (shaped-target-clickhouse 0.2.5).
    Hub,
    /// The Singer SDK's built-in target settings.
    Sdk,
    /// This target's own.
    Ours,
}

/// What the loader does with a setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handling {
    /// Honoured, with the meaning its description gives.
    Honoured,
    /// Accepted without effect: silently for the values in `quiet` (what the loader does
    /// anyway), with a warning saying `why` for any other.
    NoEffect {
        /// Values (as [`shown`] prints them) that need no warning.
        quiet: &'static [&'static str],
        /// Why it has no effect.
        why: &'static str,
    },
    /// Refused unless its value is in `accepted`: what the loader would store otherwise is
    /// not what the setting asks for.
    RefusedUnless {
        /// Values (as [`shown`] prints them) that are accepted.
        accepted: &'static [&'static str],
        /// Why any other is refused.
        why: &'static str,
    },
}

/// One setting.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    /// Its name.
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// Its default as JSON text (`None`: no default).
    pub default: Option<&'static str>,
    /// The values it may take, if a few.
    pub allowed: &'static [&'static str],
    /// Never printed.
    pub secret: bool,
    /// Where it comes from.
    pub origin: Origin,
    /// What the loader does with it.
    pub handling: Handling,
    /// What it means.
    pub description: &'static str,
}

const fn setting(name: &'static str, kind: Kind, origin: Origin) -> Setting {
    Setting {
        name,
        kind,
        default: None,
        allowed: &[],
        secret: false,
        origin,
        handling: Handling::Honoured,
        description: "",
    }
}

impl Setting {
    const fn default(mut self, json: &'static str) -> Setting {
        self.default = Some(json);
        self
    }
    const fn allowed(mut self, values: &'static [&'static str]) -> Setting {
        self.allowed = values;
        self
    }
    const fn secret(mut self) -> Setting {
        self.secret = true;
        self
    }
    const fn handling(mut self, handling: Handling) -> Setting {
        self.handling = handling;
        self
    }
    const fn says(mut self, description: &'static str) -> Setting {
        self.description = description;
        self
    }
}

use Kind::{Array, Boolean, Integer, Object, String as Text};
use Origin::{Hub, Ours, Sdk};

/// Every setting: the Hub's first, in its order, then the SDK's, then ours.
pub const SETTINGS: &[Setting] = &[
    setting("sqlalchemy_url", Text, Hub).secret().says("The SQLAlchemy connection string: clickhouse+http://user:password@host:8123/database (protocol=https in its query, or clickhouse+https://, for TLS), or clickhouse://. Used if set, otherwise the separate settings are used; a separate setting given with another value than the URL's and than its default is refused, naming both."),
    setting("driver", Text, Hub).default("\"http\"").allowed(&["http", "native", "asynch"]).handling(Handling::NoEffect { quiet: &["http"], why: "this target speaks ClickHouse's HTTP interface only (give its HTTP port: 8123, or 8443 with TLS)" }).says("Driver type (the Hub's); this target speaks HTTP."),
    setting("username", Text, Hub).default("\"default\"").says("Database user."),
    setting("password", Text, Hub).secret().says("The user's password. Secret: never printed."),
    setting("host", Text, Hub).default("\"localhost\"").says("Database host."),
    setting("port", Integer, Hub).default("8123").says("ClickHouse's HTTP port."),
    setting("database", Text, Hub).default("\"default\"").says("Database of the tables whose stream names no schema (created if missing, with create_tables); with a URL, the URL's database unless this is set to another name than its default."),
    setting("secure", Boolean, Hub).default("false").says("HTTPS."),
    setting("verify", Boolean, Hub).default("true").handling(Handling::NoEffect { quiet: &["true"], why: "TLS certificates are always verified (trust a private CA with ca_file)" }).says("Verify TLS certificates (always: see ca_file)."),
    setting("engine_type", Text, Hub).allowed(&["auto", "MergeTree", "ReplacingMergeTree", "ReplicatedMergeTree", "ReplicatedReplacingMergeTree", "SummingMergeTree", "AggregatingMergeTree", "ReplicatedSummingMergeTree", "ReplicatedAggregatingMergeTree"]).default("\"auto\"").says("Engine of created tables: auto (ReplacingMergeTree ordered by key_properties when a stream has keys, else MergeTree), MergeTree, ReplacingMergeTree, or their Replicated forms (with table_path and replica_name, or cluster_name). Summing and Aggregating engines are refused when a table is to be created: they add rows up, so what is stored is not what was sent. Existing tables are used as they are."),
    setting("table_name", Text, Hub).says("One table for every stream (default: each stream's own)."),
    setting("table_path", Text, Hub).default("\"/clickhouse/tables/{uuid}/{shard}\"").says("ZooKeeper path of created Replicated tables; $table_name stands for the table's name."),
    setting("replica_name", Text, Hub).default("\"{replica}\"").says("Replica name of created Replicated tables."),
    setting("order_by_keys", Array, Hub).says("Columns that order created tables (default: the stream's key_properties; none: tuple())."),
    setting("cluster_name", Text, Hub).says("Create databases and tables ON CLUSTER, with Replicated engines."),
    setting("default_target_schema", Text, Hub).says("The database of every stream's table (by default a stream named schema-table goes to the database schema, any other to database)."),
    setting("optimize_after", Boolean, Hub).default("false").handling(Handling::NoEffect { quiet: &["false"], why: "OPTIMIZE TABLE after every insert is not run: it rewrites the table's parts each time; read ReplacingMergeTree tables with FINAL instead" }).says("Run OPTIMIZE TABLE after each insert (not run here: read with FINAL)."),
    setting("hard_delete", Boolean, Sdk).default("false").says("At the end of a run, for each stream that sent ACTIVATE_VERSION (full-table replication; needs add_record_metadata, whose _sdc_table_version holds each row's version): true deletes the rows of older versions, false marks them in _sdc_deleted_at (as SDK targets do). Done after the stream's records are acknowledged, so readers never see the table emptied; skipped, with a warning, for a stream whose last records wait for the tap's next run."),
    setting("add_record_metadata", Boolean, Sdk).default("false").says("Add the Singer SDK's metadata columns to every table and fill them as SDK targets do: _sdc_extracted_at (the RECORD's time_extracted), _sdc_received_at and _sdc_batched_at (when the target read the record and started its batch), _sdc_deleted_at (the record's own), _sdc_sequence (milliseconds since 1970 when read), _sdc_table_version (the RECORD's version) and _sdc_sync_started_at (milliseconds since 1970 when the target started). Deduplication tokens cover the records as read, not these clocks (_sdc_table_version is in them while process_activate_version_messages is on: a full-table rerun's new version is loaded, and the older one retired), so a rerun is still loaded exactly once."),
    setting("load_method", Text, Sdk).default("\"append-only\"").allowed(&["append-only", "upsert", "overwrite"]).says("append-only (rows are added; with key_properties the created table is a ReplacingMergeTree, which keeps the last row inserted per key under FINAL); upsert (a keyed stream's created table is a ReplacingMergeTree versioned by _sdc_upsert_version, the time the target read each record: the newest record per key wins under FINAL; keyless streams are appended); or overwrite (each stream's table is replaced by the run's records: they are loaded into a new table, TABLE__loading, swapped in with EXCHANGE TABLES at the end of the input, so readers see the old table until then and the new one after; STATE is emitted after the swap)."),
    setting("batch_size_rows", Integer, Sdk).default("10000").says("Rows per INSERT chunk; pending rows at which a STATE message flushes."),
    setting("validate_records", Boolean, Sdk).default("true").says("Every value is parsed for its column's type before any request, whatever this says; no JSON Schema keyword beyond the types (pattern, enum, maxLength, ...) is checked."),
    setting("process_activate_version_messages", Boolean, Sdk).default("true").says("Act on ACTIVATE_VERSION messages (see hard_delete). Then _sdc_table_version is part of each chunk's deduplication token: a full-table rerun, whose tap sends a new version, is loaded again and the older version retired. false: they are read and ignored."),
    setting("stream_maps", Object, Sdk).handling(Handling::RefusedUnless { accepted: &["null", "{}"], why: "is not built: put meltano-map-transformer between the tap and this target (docs/meltano.md)" }).says("Stream maps (not built: refused unless empty; use meltano-map-transformer)."),
    setting("stream_map_config", Object, Sdk).handling(Handling::NoEffect { quiet: &["null", "{}"], why: "there are no stream maps here" }).says("Values for stream map expressions (no effect: no stream maps)."),
    setting("faker_config", Object, Sdk).handling(Handling::NoEffect { quiet: &["null", "{}"], why: "there are no stream maps here" }).says("Faker for stream map expressions (no effect: no stream maps)."),
    setting("flattening_enabled", Boolean, Sdk).default("false").says("Flatten nested properties into columns as Singer SDK targets do (needs flattening_max_depth of 1 or more): an object property with properties becomes one column per nested property, named by the path joined with flattening_separator (address__city); arrays, and objects at the depth, are stored as their JSON text."),
    setting("flattening_max_depth", Integer, Sdk).says("Levels of nesting flattened (required with flattening_enabled; 0 flattens nothing)."),
    setting("flattening_max_key_length", Integer, Sdk).default("255").says("Flattened names this long or longer are shortened as the SDK shortens them (each part in turn to the capitals of its camel-cased form)."),
    setting("flattening_separator", Text, Sdk).default("\"__\"").says("Joins the names of a flattened property's path."),
    setting("batch_config", Object, Sdk).handling(Handling::NoEffect { quiet: &["null", "{}"], why: "this target writes no batch files (it reads a tap's BATCH files from batch_dirs)" }).says("Batch files a target writes (no effect: this target writes none; see batch_dirs for a tap's)."),
    setting("batch_dirs", Array, Ours).says("Directories the target may read BATCH files from (absolute paths: the tap's batch_config storage root). The host lets the target read these, read-only, and no other file; a BATCH naming a file elsewhere is refused. Each file's records are loaded as RECORD messages would be, exactly once."),
    setting("uri", Text, Ours).secret().says("Connection URI as the state backend takes it: clickhouse://user:password@host:8123/database, clickhouses:// for TLS, http:// or https:// (a sqlalchemy_url's forms are read too). Instead of the separate settings."),
    setting("conform_names", Boolean, Ours).default("true").says("Name databases, tables and columns as Singer SDK targets do (stream public-users: table users in database public; names lowercased, other characters than letters, digits and _ dropped). false: the table is the stream's name, in database (or default_target_schema), and the columns the properties' names, as given."),
    setting("number_type", Text, Ours).default("\"Float64\"").says("Column type of created columns for a plain number property (one without multipleOf or a decimal hint): Float64 (rounded to the nearest double), or Decimal(P, S) (exact: a value with more places or digits is refused, naming the record)."),
    setting("load_partial_tail", Boolean, Ours).default("false").says("At the end of the input, records after the last STATE are loaded in whole chunks of batch_size_rows (a rerun from that STATE makes the same chunks: exactly once); the rest of each stream waits for the tap's next run, which sends them again. true: loads them now too, at least once (a rerun that reads further may store them twice)."),
    setting("batch_size_bytes", Integer, Ours).default("67108864").says("Pending bytes at which the target flushes without waiting for a STATE message."),
    setting("compression", Text, Ours).default("\"lz4\"").allowed(&["none", "lz4", "zstd", "gzip"]).says("INSERT body compression."),
    setting("dedup", Boolean, Ours).default("true").says("Deduplication tokens on every chunk: exactly once across crashes and retries. Off: at least once."),
    setting("create_tables", Boolean, Ours).default("true").says("Create missing databases and tables from SCHEMA messages, and add new properties as columns."),
    setting("ca_file", Text, Ours).says("PEM file of CA certificates trusted for HTTPS besides the system's. Read by the reference host and the wheel, not by stock wasmtime."),
    setting("allowed_hosts", Array, Ours).says("Hosts the reference host may reach besides the connection's."),
];

/// The setting called `name`.
pub fn find(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.name == name)
}

/// A value as the table's `quiet` and `accepted` lists write it: a string's text, `true`,
/// `false`, `null`, `{}` for an empty object, else its JSON text.
pub fn shown(value: &Value) -> std::string::String {
    match value {
        Value::String(s) => s.clone(),
        Value::Object(o) if o.is_empty() => "{}".into(),
        other => other.to_string(),
    }
}

/// The config's settings, read through the table: typed getters with the table's defaults,
/// and the warnings the config earns.
pub struct Settings<'m> {
    map: &'m Map<std::string::String, Value>,
    /// One line each, for stderr.
    pub warnings: Vec<std::string::String>,
}

impl<'m> Settings<'m> {
    /// Checks every key against the table: unknown keys and settings without effect are
    /// warned about, refused values are an error.
    pub fn read(map: &'m Map<std::string::String, Value>) -> Result<Settings<'m>, Error> {
        let mut warnings = Vec::new();
        for (key, value) in map {
            let Some(setting) = find(key) else {
                warnings.push(unknown(key));
                continue;
            };
            if value.is_null() {
                continue;
            }
            check_kind(setting, value)?;
            let value = shown(value);
            if !setting.allowed.is_empty() && !setting.allowed.contains(&value.as_str()) {
                return Err(Error::invalid(format!(
                    "setting {key} must be one of {}, not '{}'",
                    setting.allowed.join(", "),
                    escaped(&value)
                )));
            }
            match setting.handling {
                Handling::Honoured => {}
                Handling::NoEffect { quiet, why } => {
                    if !quiet.contains(&value.as_str()) {
                        warnings.push(format!(
                            "setting {key} = {} has no effect: {why}",
                            shown_safely(setting, &value)
                        ));
                    }
                }
                Handling::RefusedUnless { accepted, why } => {
                    if !accepted.contains(&value.as_str()) {
                        return Err(Error::invalid(format!(
                            "setting {key} = {}: {why}",
                            shown_safely(setting, &value)
                        )));
                    }
                }
            }
        }
        Ok(Settings { map, warnings })
    }

    /// The value given (not null), if any.
    pub fn given(&self, name: &str) -> Option<&'m Value> {
        debug_assert!(find(name).is_some(), "{name} is in the table");
        self.map.get(name).filter(|v| !v.is_null())
    }

    /// Whether `name` was given with another value than its default.
    pub fn set_apart_from_default(&self, name: &str) -> bool {
        let default = find(name).and_then(|s| s.default);
        match self.given(name) {
            None => false,
            Some(v) => default
                .and_then(|d| serde_json::from_str::<Value>(d).ok())
                .is_none_or(|d| shown(&d) != shown(v)),
        }
    }

    fn value(&self, name: &str) -> Option<Value> {
        self.given(name).cloned().or_else(|| {
            find(name)
                .and_then(|s| s.default)
                .map(|d| serde_json::from_str(d).expect("the table's defaults are JSON"))
        })
    }

    /// A string setting, or its default.
    pub fn text(&self, name: &str) -> Option<std::string::String> {
        self.value(name).map(|v| shown(&v))
    }

    /// A boolean setting, or its default (false without one).
    pub fn flag(&self, name: &str) -> bool {
        self.value(name).is_some_and(|v| shown(&v) == "true")
    }

    /// A whole-number setting from `low` to `high`, or its default.
    pub fn number(&self, name: &str, low: u64, high: u64) -> Result<Option<u64>, Error> {
        let Some(value) = self.value(name) else {
            return Ok(None);
        };
        match number_of(&value) {
            Some(n) if (low..=high).contains(&n) => Ok(Some(n)),
            _ => Err(Error::invalid(format!(
                "setting {name} must be a whole number from {low} to {high}"
            ))),
        }
    }
}

/// Meltano passes settings from the environment as strings: "true", "8123".
fn number_of(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn check_kind(setting: &Setting, value: &Value) -> Result<(), Error> {
    let fits = match (setting.kind, value) {
        (_, Value::Null) => true,
        (Kind::String, Value::String(_)) => true,
        (Kind::Integer, v) => number_of(v).is_some(),
        (Kind::Boolean, Value::Bool(_)) => true,
        (Kind::Boolean, Value::String(s)) => s == "true" || s == "false",
        (Kind::Object, Value::Object(_)) => true,
        (Kind::Array, Value::Array(_) | Value::String(_)) => true,
        _ => false,
    };
    if fits {
        return Ok(());
    }
    let what = match setting.kind {
        Kind::String => "a string",
        Kind::Integer => "a whole number",
        Kind::Boolean => "true or false",
        Kind::Object => "an object",
        Kind::Array => "a list",
    };
    Err(Error::invalid(format!(
        "setting {} must be {what}",
        setting.name
    )))
}

fn shown_safely(setting: &Setting, value: &str) -> std::string::String {
    // Objects (stream map configs, batch configs) may hold keys and salts.
    if setting.secret || setting.kind == Kind::Object {
        "(secret)".into()
    } else {
        format!("'{}'", escaped(value))
    }
}

/// The warning for a key no one defines, naming the nearest known one when it is close.
fn unknown(key: &str) -> std::string::String {
    let nearest = SETTINGS
        .iter()
        .map(|s| (distance(key, s.name), s.name))
        .min()
        .filter(|(d, name)| *d <= (name.len() / 3).max(2));
    match nearest {
        Some((_, name)) => format!(
            "unknown setting '{}' is ignored (did you mean {name}?)",
            escaped(key)
        ),
        None => format!(
            "unknown setting '{}' is ignored (`--about` lists the settings)",
            escaped(key)
        ),
    }
}

/// Levenshtein distance, by characters.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(config: Value) -> Result<Vec<std::string::String>, Error> {
        let Value::Object(map) = config else { panic!() };
        Settings::read(&map).map(|s| s.warnings)
    }

    #[test]
    fn the_table_is_whole() {
        for s in SETTINGS {
            assert!(!s.description.is_empty(), "{}", s.name);
            assert_eq!(
                SETTINGS.iter().filter(|t| t.name == s.name).count(),
                1,
                "{}",
                s.name
            );
            if let Some(d) = s.default {
                let v: Value = serde_json::from_str(d).expect(s.name);
                check_kind(s, &v).expect(s.name);
                assert!(
                    s.allowed.is_empty() || s.allowed.contains(&shown(&v).as_str()),
                    "{}",
                    s.name
                );
                match s.handling {
                    Handling::NoEffect { quiet, .. } => {
                        assert!(quiet.contains(&shown(&v).as_str()), "{}", s.name)
                    }
                    Handling::RefusedUnless { accepted, .. } => {
                        assert!(accepted.contains(&shown(&v).as_str()), "{}", s.name)
                    }
                    Handling::Honoured => {}
                }
            }
        }
    }

    #[test]
    fn the_hubs_defaults_pass_quietly() {
        // What Meltano passes for the Hub's plugin with nothing set: every default.
        let mut hub = Map::new();
        for s in SETTINGS.iter().filter(|s| s.origin != Origin::Ours) {
            if let Some(d) = s.default {
                hub.insert(s.name.into(), serde_json::from_str(d).unwrap());
            }
        }
        assert!(hub.len() >= 12, "{hub:?}");
        assert_eq!(
            read(Value::Object(hub)).unwrap(),
            Vec::<std::string::String>::new()
        );
    }

    #[test]
    fn settings_without_effect_warn_refused_ones_fail_unknown_ones_warn_with_the_nearest() {
        let warnings = read(
            json!({"driver": "native", "verify": "false", "optimize_after": true,
            "hard_delete": true, "stream_map_config": {"a": 1}, "batch_size_row": 5, "zzzz": 1,
            "process_activate_version_messages": false}),
        )
        .unwrap();
        let all = warnings.join("\n");
        for says in [
            "setting driver = 'native' has no effect: this target speaks ClickHouse's HTTP",
            "setting verify = 'false' has no effect",
            "setting optimize_after = 'true' has no effect",
            "setting stream_map_config",
            "unknown setting 'batch_size_row' is ignored (did you mean batch_size_rows?)",
            "unknown setting 'zzzz' is ignored (`--about`",
        ] {
            assert!(all.contains(says), "{says}\n{all}");
        }
        assert!(
            !all.contains("hard_delete") && !all.contains("activate"),
            "{all}"
        );
        assert_eq!(warnings.len(), 6, "{all}");
        // Null is "not set", whatever the setting takes.
        assert_eq!(
            read(json!({"engine_type": null, "load_method": null, "port": null}))
                .unwrap()
                .len(),
            0
        );
        for (config, says) in [
            (
                json!({"stream_maps": {"s": {"x": "1"}}}),
                "meltano-map-transformer",
            ),
            (
                json!({"load_method": "merge"}),
                "must be one of append-only",
            ),
            (json!({"port": "eighty"}), "port must be a whole number"),
            (json!({"secure": "yes"}), "secure must be true or false"),
            (json!({"stream_maps": 3}), "stream_maps must be an object"),
        ] {
            let e = read(config.clone()).unwrap_err();
            assert!(e.message.contains(says), "{config}: {}", e.message);
        }
    }

    #[test]
    fn secrets_are_never_shown() {
        let e = read(json!({"sqlalchemy_url": 5})).unwrap_err();
        assert!(!e.message.contains('5') || e.message.contains("must be a string"));
        let mut hub = Map::new();
        hub.insert("password".into(), json!("hunter2"));
        hub.insert("pasword".into(), json!("hunter2"));
        let s = Settings::read(&hub).unwrap();
        assert!(
            s.warnings.iter().all(|w| !w.contains("hunter2")),
            "{:?}",
            s.warnings
        );
        assert!(
            s.warnings[0].contains("did you mean password?"),
            "{:?}",
            s.warnings
        );
    }
}
