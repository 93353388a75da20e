//! The target's settings (Meltano's `config:` for the loader, a JSON file given with
//! `--config`): the connection as the state backend takes it (`uri` in its URI forms, or
//! separate fields), MeltanoLabs/target-clickhouse's names where the meaning is the same
//! (`username`, `database`, `table_name`, `engine_type`, `cluster_name`), and the sink's own
//! (`batch_size_rows`, `batch_size_bytes`, `compression`, `dedup`, `create_tables`). Unknown
//! keys are refused, so a misspelt setting is not silently ignored.

use serde_json::{Map, Value};

use crate::client::{Compression, ConnectionOptions, Error};

/// Engines a created table may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// `ReplacingMergeTree` ordered by the stream's keys when it has some, else `MergeTree`.
    Auto,
    /// `MergeTree`.
    MergeTree,
    /// `ReplacingMergeTree` (needs keys).
    ReplacingMergeTree,
}

/// The target's validated settings.
#[derive(Clone, Debug)]
pub struct TargetConfig {
    /// How to reach ClickHouse (no connection database: every statement names its own).
    pub connection: ConnectionOptions,
    /// Where the tables go.
    pub database: String,
    /// One table for every stream (default: each stream's own, named as the stream).
    pub table_name: Option<String>,
    /// The engine of created tables.
    pub engine: Engine,
    /// Create tables `ON CLUSTER` this cluster, with Replicated engines.
    pub cluster: Option<String>,
    /// Rows per INSERT chunk, and the pending rows at which a STATE flushes.
    pub batch_size_rows: u32,
    /// Pending bytes (all streams) at which the target flushes even without a STATE.
    pub batch_size_bytes: u64,
    /// How INSERT bodies are compressed.
    pub compression: Compression,
    /// Deduplication tokens (exactly once); off: at least once.
    pub dedup: bool,
    /// Create missing databases and tables, and add new properties as columns.
    pub create_tables: bool,
    /// Hosts the reference host lets the target reach besides the connection's (host only).
    pub allowed_hosts: Vec<String>,
    /// A PEM file of CA certificates the host trusts for HTTPS besides the system's (host only:
    /// the host reads it before the component starts).
    pub ca_file: Option<String>,
}

/// Settings, for `--about`: name, type, default, description.
pub const SETTINGS: &[(&str, &str, &str, &str)] = &[
    ("uri", "string", "", "Connection URI as the state backend takes it: clickhouse://user:password@host:8123/database, clickhouses:// for TLS (http:// and https:// too). Instead of host, port, ..."),
    ("host", "string", "", "Host (without uri)."),
    ("port", "integer", "8123 (8443 with secure)", "HTTP port (without uri)."),
    ("username", "string", "default", "User (overrides the uri's)."),
    ("password", "string", "", "Password (overrides the uri's). Secret: never printed."),
    ("secure", "boolean", "false", "HTTPS (without uri)."),
    ("database", "string", "the uri's database, else default", "Database of the tables, created if missing (with create_tables)."),
    ("table_name", "string", "the stream's name", "One table for every stream."),
    ("engine_type", "string", "auto", "Engine of created tables: auto (ReplacingMergeTree ordered by key_properties when a stream has keys, else MergeTree), MergeTree or ReplacingMergeTree."),
    ("cluster_name", "string", "", "Create databases and tables ON CLUSTER, with Replicated engines."),
    ("batch_size_rows", "integer", "10000", "Rows per INSERT chunk; pending rows at which a STATE message flushes."),
    ("batch_size_bytes", "integer", "67108864", "Pending bytes at which the target flushes without waiting for a STATE message."),
    ("compression", "string", "lz4", "INSERT body compression: none, lz4, zstd or gzip."),
    ("dedup", "boolean", "true", "Deduplication tokens on every chunk: exactly once across crashes and retries. Off: at least once."),
    ("create_tables", "boolean", "true", "Create missing databases and tables from SCHEMA messages, and add new properties as columns."),
    ("ca_file", "string", "", "PEM file of CA certificates trusted for HTTPS besides the system's (a self-hosted ClickHouse with its own CA). Read by the reference host and the wheel, not by stock wasmtime."),
    ("allowed_hosts", "array", "", "Hosts the reference host may reach besides the connection's."),
];

impl TargetConfig {
    /// Reads the settings from the config file's text; `invalid-input` naming the setting for
    /// anything wrong (never showing a password).
    pub fn parse(text: &str) -> Result<TargetConfig, Error> {
        let value: Value = serde_json::from_str(text).map_err(|e| {
            Error::invalid(format!(
                "the config is not JSON: line {} column {}",
                e.line(),
                e.column()
            ))
        })?;
        let Value::Object(map) = value else {
            return Err(Error::invalid(
                "the config must be a JSON object of settings",
            ));
        };
        TargetConfig::from_map(&map)
    }

    fn from_map(map: &Map<String, Value>) -> Result<TargetConfig, Error> {
        if let Some(unknown) = map
            .keys()
            .find(|k| !SETTINGS.iter().any(|(name, ..)| name == k))
        {
            return Err(Error::invalid(format!(
                "unknown setting '{}' (the settings are: {})",
                crate::text::escaped(unknown),
                SETTINGS.iter().map(|s| s.0).collect::<Vec<_>>().join(", ")
            )));
        }
        let wrong =
            |name: &str, what: &str| Error::invalid(format!("setting {name} must be {what}"));
        let text = |name: &str| -> Result<Option<String>, Error> {
            match map.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(wrong(name, "a string")),
            }
        };
        let flag = |name: &str, default: bool| -> Result<bool, Error> {
            match map.get(name) {
                None | Some(Value::Null) => Ok(default),
                Some(Value::Bool(b)) => Ok(*b),
                // Meltano passes booleans from the environment as strings.
                Some(Value::String(s)) if s == "true" || s == "false" => Ok(s == "true"),
                Some(_) => Err(wrong(name, "true or false")),
            }
        };
        let number = |name: &str, low: u64, high: u64| -> Result<Option<u64>, Error> {
            let n = match map.get(name) {
                None | Some(Value::Null) => return Ok(None),
                Some(Value::Number(n)) => n.as_u64(),
                Some(Value::String(s)) => s.parse().ok(),
                Some(_) => None,
            };
            match n {
                Some(n) if (low..=high).contains(&n) => Ok(Some(n)),
                _ => Err(wrong(name, &format!("a whole number from {low} to {high}"))),
            }
        };
        let secure = flag("secure", false)?;
        let url = match (text("uri")?, text("host")?) {
            (Some(uri), None) => uri,
            (None, Some(host)) if !host.trim().is_empty() => {
                let port = number("port", 1, 65535)?.unwrap_or(if secure { 8443 } else { 8123 });
                let scheme = if secure { "https" } else { "http" };
                if host.contains(['/', '@', '?', '#']) {
                    return Err(wrong("host", "a host name or address, without a scheme or path"));
                }
                format!("{scheme}://{host}:{port}")
            }
            (Some(_), Some(_)) => {
                return Err(Error::invalid(
                    "give either uri or host (with port, secure), not both",
                ))
            }
            _ => {
                return Err(Error::invalid(
                    "no ClickHouse to load into: set uri (clickhouse://user@host:8123/database) or host",
                ))
            }
        };
        if map.contains_key("uri") && (map.contains_key("port") || map.contains_key("secure")) {
            return Err(Error::invalid(
                "port and secure go with host; with uri, put them in it (clickhouses://host:8443)",
            ));
        }
        let connection = ConnectionOptions {
            url,
            user: text("username")?,
            password: text("password")?,
            ..Default::default()
        };
        // The uri's database is where the tables go unless `database` says otherwise; the
        // connection itself names none (it may not exist yet).
        let endpoint = crate::client::Endpoint::parse(&connection)?;
        let database = match text("database")? {
            Some(db) => db,
            None => endpoint
                .database
                .clone()
                .unwrap_or_else(|| "default".into()),
        };
        if database.is_empty() {
            return Err(wrong("database", "a name, not empty"));
        }
        let engine = match text("engine_type")?.as_deref() {
            None | Some("auto") => Engine::Auto,
            Some("MergeTree") => Engine::MergeTree,
            Some("ReplacingMergeTree") => Engine::ReplacingMergeTree,
            Some(_) => {
                return Err(wrong(
                    "engine_type",
                    "auto, MergeTree or ReplacingMergeTree",
                ))
            }
        };
        let compression = match text("compression")? {
            None => Compression::Lz4,
            Some(c) => c.parse().map_err(|e: Error| {
                Error::invalid(format!("setting compression: {}", e.message))
            })?,
        };
        let allowed_hosts = match map.get("allowed_hosts") {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(hosts)) => hosts
                .iter()
                .map(|h| h.as_str().map(String::from))
                .collect::<Option<_>>()
                .ok_or_else(|| wrong("allowed_hosts", "a list of host names"))?,
            Some(Value::String(s)) => s.split(',').map(|h| h.trim().to_string()).collect(),
            Some(_) => return Err(wrong("allowed_hosts", "a list of host names")),
        };
        let table_name = text("table_name")?;
        if table_name.as_deref().is_some_and(|t| t.trim().is_empty()) {
            return Err(wrong("table_name", "a name, not blank"));
        }
        Ok(TargetConfig {
            connection,
            database,
            table_name,
            engine,
            cluster: text("cluster_name")?.filter(|c| !c.is_empty()),
            batch_size_rows: number("batch_size_rows", 1, 10_000_000)?.unwrap_or(10_000) as u32,
            batch_size_bytes: number("batch_size_bytes", 1024, 1 << 40)?.unwrap_or(64 << 20),
            compression,
            dedup: flag("dedup", true)?,
            create_tables: flag("create_tables", true)?,
            allowed_hosts,
            ca_file: text("ca_file")?.filter(|f| !f.is_empty()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: serde_json::Value) -> Result<TargetConfig, Error> {
        TargetConfig::parse(&json.to_string())
    }

    #[test]
    fn uri_or_fields_and_the_tables_database() {
        let c = parse(serde_json::json!({"uri": "clickhouse://u:secret@h:8123/meltano"})).unwrap();
        assert_eq!(c.database, "meltano");
        assert!(c.dedup && c.create_tables);
        assert_eq!((c.batch_size_rows, c.engine), (10_000, Engine::Auto));
        let c =
            parse(serde_json::json!({"uri": "clickhouse://h/meltano", "database": "raw"})).unwrap();
        assert_eq!(c.database, "raw");
        let c = parse(
            serde_json::json!({"host": "h", "secure": true, "username": "u",
            "password": "p", "dedup": "false", "batch_size_rows": "500"}),
        )
        .unwrap();
        assert_eq!(c.connection.url, "https://h:8443");
        assert_eq!(c.ca_file, None);
        let with_ca = parse(serde_json::json!({"host": "h", "ca_file": "/etc/ca.pem"})).unwrap();
        assert_eq!(with_ca.ca_file.as_deref(), Some("/etc/ca.pem"));
        assert_eq!(
            (c.database.as_str(), c.dedup, c.batch_size_rows),
            ("default", false, 500)
        );
    }

    #[test]
    fn bad_settings_are_named_and_secrets_never_shown() {
        for (json, says) in [
            (serde_json::json!({}), "no ClickHouse"),
            (
                serde_json::json!({"uri": "clickhouse://h", "host": "h"}),
                "either uri or host",
            ),
            (
                serde_json::json!({"host": "h", "prot": 1}),
                "unknown setting 'prot'",
            ),
            (
                serde_json::json!({"host": "h", "batch_size_rows": 0}),
                "batch_size_rows must be",
            ),
            (
                serde_json::json!({"host": "h", "dedup": "yes"}),
                "dedup must be true or false",
            ),
            (
                serde_json::json!({"host": "h", "engine_type": "Log"}),
                "engine_type must be",
            ),
            (
                serde_json::json!({"host": "h", "compression": "brotli"}),
                "compression",
            ),
            (
                serde_json::json!({"uri": "clickhouse://h", "port": 9000}),
                "port and secure go with host",
            ),
            (serde_json::json!({"uri": "ftp://u:hunter2@h"}), ""),
            (serde_json::json!([1]), "JSON object"),
        ] {
            let e = parse(json.clone()).unwrap_err();
            assert!(e.message.contains(says), "{json}: {}", e.message);
            assert!(!e.message.contains("hunter2"), "{}", e.message);
        }
        let e = TargetConfig::parse("{\"password\": \"hunter2\",").unwrap_err();
        assert!(e.message.contains("not JSON") && !e.message.contains("hunter2"));
    }
}
