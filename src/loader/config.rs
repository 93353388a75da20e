//! The target's settings (Meltano's `config:` for the loader, a JSON file given with
//! `--config`), read through the one table of [`super::settings`]: the connection (a
//! `sqlalchemy_url` as the Hub's target-clickhouse takes it, a `uri` as the state backend takes
//! it, or the separate fields, in any combination the Hub's plugin produces with its defaults),
//! where the tables go, and how they are loaded.

use serde_json::Value;

use crate::client::url::{decode_component, encode_component};
use crate::client::{Compression, ConnectionOptions, Endpoint, Error};
use crate::sink::types::Type;
use crate::text::escaped;

use super::flatten::Flattening;
use super::names::Naming;
use super::settings::Settings;

/// Engines a created table may have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Engine {
    /// `ReplacingMergeTree` ordered by the stream's keys when it has some, else `MergeTree`.
    Auto,
    /// `MergeTree`.
    MergeTree,
    /// `ReplacingMergeTree` (needs keys).
    ReplacingMergeTree,
    /// An engine that would not store what was sent (Summing, Aggregating): refused when a
    /// table is to be created, named as given.
    Refused(String),
}

/// The target's validated settings.
#[derive(Clone, Debug)]
pub struct TargetConfig {
    /// How to reach ClickHouse (no connection database: every statement names its own).
    pub connection: ConnectionOptions,
    /// Where the tables of streams without a schema part go.
    pub database: String,
    /// Where every stream's table goes, when set.
    pub default_target_schema: Option<String>,
    /// One table for every stream (default: each stream's own).
    pub table_name: Option<String>,
    /// How databases, tables and columns are named.
    pub naming: Naming,
    /// The engine of created tables.
    pub engine: Engine,
    /// Created tables are Replicated (`engine_type` names a Replicated engine, or a cluster).
    pub replicated: bool,
    /// ZooKeeper path and replica name of created Replicated tables.
    pub table_path: String,
    /// See `table_path`.
    pub replica_name: String,
    /// Create tables `ON CLUSTER` this cluster, with Replicated engines.
    pub cluster: Option<String>,
    /// The columns that order created tables, instead of the streams' keys.
    pub order_by: Option<Vec<String>>,
    /// The column type of a created plain `number` property.
    pub number_type: Type,
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
    /// At the input's end, send the last partial chunk after the last STATE too.
    pub load_partial_tail: bool,
    /// Add the Singer SDK's `_sdc_` metadata columns (`add_record_metadata`).
    pub add_record_metadata: bool,
    /// `load_method: overwrite`: each table is replaced by the run's records, loaded beside it
    /// and swapped in at the end of the input.
    pub overwrite: bool,
    /// `load_method: upsert`: keyed streams' tables keep the newest record per key.
    pub upsert: bool,
    /// Act on ACTIVATE_VERSION (`process_activate_version_messages`): rows of older versions
    /// are retired at the end of the run.
    pub activate_versions: bool,
    /// Retire them by deleting them (`hard_delete`), else by marking them in `_sdc_deleted_at`.
    pub hard_delete: bool,
    /// Nested properties flattened into columns (`flattening_enabled` with a depth of 1 or more).
    pub flattening: Option<Flattening>,
    /// Directories BATCH files may be read from (absolute paths; the host lets the component
    /// read them, read-only).
    pub batch_dirs: Vec<String>,
    /// What the config earned: settings without effect, unknown keys (one line each).
    pub warnings: Vec<String>,
}

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
        TargetConfig::from_settings(Settings::read(&map)?)
    }

    fn from_settings(mut settings: Settings) -> Result<TargetConfig, Error> {
        let (connection, url_database) = connection(&mut settings)?;
        // An empty name is "not set" (as the SDK reads it); a blank one is an error.
        let name = |setting: &str| -> Result<Option<String>, Error> {
            match settings.text(setting).filter(|n| !n.is_empty()) {
                Some(n) if n.trim().is_empty() => Err(Error::invalid(format!(
                    "setting {setting} must be a name, not blank"
                ))),
                other => Ok(other),
            }
        };
        let database = match url_database {
            Some(db) if !settings.set_apart_from_default("database") => db,
            _ => name("database")?.unwrap_or_else(|| "default".into()),
        };
        let (engine, replicated) = engine(settings.text("engine_type").as_deref());
        let compression = settings
            .text("compression")
            .unwrap_or_default()
            .parse()
            .map_err(|e: Error| Error::invalid(format!("setting compression: {}", e.message)))?;
        Ok(TargetConfig {
            connection,
            database,
            default_target_schema: name("default_target_schema")?,
            table_name: name("table_name")?,
            naming: if settings.flag("conform_names") {
                Naming::Conformed
            } else {
                Naming::Verbatim
            },
            engine,
            replicated,
            table_path: settings.text("table_path").unwrap_or_default(),
            replica_name: settings.text("replica_name").unwrap_or_default(),
            cluster: settings.text("cluster_name").filter(|c| !c.is_empty()),
            order_by: list("order_by_keys", settings.given("order_by_keys"))?
                .filter(|k| !k.is_empty()),
            number_type: number_type(&settings.text("number_type").unwrap_or_default())?,
            batch_size_rows: settings
                .number("batch_size_rows", 1, 10_000_000)?
                .unwrap_or(1) as u32,
            batch_size_bytes: settings
                .number("batch_size_bytes", 1024, 1 << 40)?
                .unwrap_or(1 << 20),
            compression,
            dedup: settings.flag("dedup"),
            create_tables: settings.flag("create_tables"),
            load_partial_tail: settings.flag("load_partial_tail"),
            add_record_metadata: settings.flag("add_record_metadata"),
            overwrite: settings.text("load_method").as_deref() == Some("overwrite"),
            upsert: settings.text("load_method").as_deref() == Some("upsert"),
            activate_versions: settings.flag("process_activate_version_messages"),
            hard_delete: settings.flag("hard_delete"),
            flattening: flattening(&settings)?,
            batch_dirs: batch_dirs(settings.given("batch_dirs"))?,
            allowed_hosts: list("allowed_hosts", settings.given("allowed_hosts"))?
                .unwrap_or_default(),
            ca_file: settings.text("ca_file").filter(|f| !f.is_empty()),
            warnings: std::mem::take(&mut settings.warnings),
        })
        .and_then(load_method_refusal)
    }
}

/// A `load_method` where it cannot hold: upsert with `engine_type: MergeTree` (which keeps
/// every row); overwrite without `create_tables` (the records are loaded into a new table),
/// and with Replicated tables whose `table_path` has no `{uuid}` (the table swapped in would
/// keep the path of the one loaded next).
fn load_method_refusal(config: TargetConfig) -> Result<TargetConfig, Error> {
    if config.upsert && config.engine == Engine::MergeTree {
        return Err(Error::invalid(
            "settings load_method = 'upsert' and engine_type = 'MergeTree' disagree: a MergeTree keeps every row; upsert creates ReplacingMergeTree tables (engine_type auto or ReplacingMergeTree)",
        ));
    }
    if !config.overwrite {
        return Ok(config);
    }
    if !config.create_tables {
        return Err(Error::invalid(
            "setting load_method = 'overwrite' needs create_tables: the records are loaded into a new table, swapped in at the end",
        ));
    }
    let replicated = config.replicated || config.cluster.is_some();
    if replicated && !config.table_path.contains("{uuid}") {
        return Err(Error::invalid(
            "setting load_method = 'overwrite' with Replicated tables needs a table_path with {uuid}: the table swapped in keeps the path it was created with, which the next run's new table would take again",
        ));
    }
    Ok(config)
}

/// `batch_dirs`: absolute paths, none through `..`.
fn batch_dirs(value: Option<&Value>) -> Result<Vec<String>, Error> {
    let dirs = list("batch_dirs", value)?.unwrap_or_default();
    for dir in &dirs {
        if !dir.starts_with('/') || dir.split('/').any(|part| part == "..") {
            return Err(Error::invalid(format!(
                "setting batch_dirs: '{}' is not an absolute path without '..'",
                escaped(dir)
            )));
        }
    }
    Ok(dirs)
}

/// The `flattening_*` settings, as the SDK reads them: a depth is required when flattening is
/// enabled, and a depth of 0 flattens nothing.
fn flattening(settings: &Settings) -> Result<Option<Flattening>, Error> {
    if !settings.flag("flattening_enabled") {
        return Ok(None);
    }
    let Some(max_depth) = settings.number("flattening_max_depth", 0, 1000)? else {
        return Err(Error::invalid(
            "setting flattening_enabled = 'true' needs flattening_max_depth (the levels of nesting to flatten), as in the Singer SDK",
        ));
    };
    let separator = settings.text("flattening_separator").unwrap_or_default();
    if separator.is_empty() {
        return Err(Error::invalid(
            "setting flattening_separator must not be empty",
        ));
    }
    let max_key_length = settings
        .number("flattening_max_key_length", 1, 1 << 20)?
        .unwrap_or(255) as usize;
    Ok((max_depth > 0).then_some(Flattening {
        max_depth: max_depth as usize,
        separator,
        max_key_length,
    }))
}

/// `engine_type` as an engine and whether created tables are Replicated.
fn engine(name: Option<&str>) -> (Engine, bool) {
    let name = name.unwrap_or("auto");
    let (replicated, family) = match name.strip_prefix("Replicated") {
        Some(family) => (true, family),
        None => (false, name),
    };
    let engine = match family {
        "auto" => Engine::Auto,
        "MergeTree" => Engine::MergeTree,
        "ReplacingMergeTree" => Engine::ReplacingMergeTree,
        _ => Engine::Refused(name.to_string()),
    };
    (engine, replicated)
}

/// `number_type`: Float64, or a Decimal of the engine's range.
fn number_type(text: &str) -> Result<Type, Error> {
    let refused = || {
        Error::invalid(format!(
            "setting number_type must be Float64 or Decimal(P, S) (P from 1 to 76, S at most P), not '{}'",
            escaped(text)
        ))
    };
    match Type::parse(text.trim()).map_err(|_| refused())? {
        Type::Float64 => Ok(Type::Float64),
        Type::Decimal { precision, scale }
            if (1..=76).contains(&precision) && scale <= precision =>
        {
            Ok(Type::Decimal { precision, scale })
        }
        _ => Err(refused()),
    }
}

/// A list of names: a JSON list of strings, or one string of comma-separated names (as
/// Meltano passes a list from the environment).
fn list(setting: &str, value: Option<&Value>) -> Result<Option<Vec<String>>, Error> {
    let wrong = || Error::invalid(format!("setting {setting} must be a list of names"));
    match value {
        None => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(|h| h.as_str().map(String::from))
            .collect::<Option<_>>()
            .map(Some)
            .ok_or_else(wrong),
        Some(Value::String(s)) => {
            let trimmed = s.trim();
            if trimmed.starts_with('[') {
                let items: Vec<String> = serde_json::from_str(trimmed).map_err(|_| wrong())?;
                return Ok(Some(items));
            }
            Ok(Some(
                s.split(',')
                    .map(|h| h.trim().to_string())
                    .filter(|h| !h.is_empty())
                    .collect(),
            ))
        }
        Some(_) => Err(wrong()),
    }
}

/// The connection and the database its URL names: from `uri` or `sqlalchemy_url` (both
/// given: they must name one connection), checked against the separate settings (one given
/// with another value than its default and than the URL's is refused, naming both), or from
/// the separate settings alone.
fn connection(settings: &mut Settings) -> Result<(ConnectionOptions, Option<String>), Error> {
    let uri = settings.text("uri").filter(|u| !u.is_empty());
    let alchemy = settings.text("sqlalchemy_url").filter(|u| !u.is_empty());
    let from = |name: &str, text: String, warnings: &mut Vec<String>| -> Result<_, Error> {
        let url = url_of(name, &text, warnings)?;
        let endpoint = Endpoint::parse(&ConnectionOptions::from_url(url.clone()))
            .map_err(|e| Error::invalid(format!("setting {name}: {}", e.message)))?;
        Ok((name.to_string(), url, endpoint, userinfo(&text)))
    };
    let urls = [("uri", uri), ("sqlalchemy_url", alchemy)]
        .into_iter()
        .filter_map(|(name, text)| text.map(|t| (name, t)))
        .map(|(name, text)| from(name, text, &mut settings.warnings))
        .collect::<Result<Vec<_>, Error>>()?;
    if let [a, b] = urls.as_slice() {
        if let Some(part) = differing_part(&a.2, &b.2) {
            return Err(Error::invalid(format!(
                "settings uri and sqlalchemy_url name different connections (their {part} differ): give one"
            )));
        }
    }
    let Some((name, url, endpoint, (has_user, has_password))) = urls.into_iter().next() else {
        return fields_alone(settings).map(|c| (c, None));
    };
    check_fields_agree(settings, &name, &endpoint, has_user)?;
    let text = |s: &str| settings.given(s).map(super::settings::shown);
    let options = ConnectionOptions {
        url,
        user: if has_user { None } else { text("username") },
        password: if has_password { None } else { text("password") },
        ..Default::default()
    };
    Ok((options, endpoint.database))
}

fn fields_alone(settings: &Settings) -> Result<ConnectionOptions, Error> {
    let host = settings.text("host").unwrap_or_default();
    if host.trim().is_empty() || host.contains(['/', '@', '?', '#']) {
        return Err(Error::invalid(
            "setting host must be a host name or address, without a scheme or path (or give sqlalchemy_url or uri)",
        ));
    }
    let secure = settings.flag("secure");
    let port = match settings.given("port") {
        Some(_) => settings.number("port", 1, 65535)?.unwrap_or(8123),
        None if secure => 8443,
        None => 8123,
    };
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    let scheme = if secure { "https" } else { "http" };
    Ok(ConnectionOptions {
        url: format!("{scheme}://{host}:{port}"),
        user: settings.text("username"),
        password: settings.given("password").map(super::settings::shown),
        ..Default::default()
    })
}

/// A separate setting given with another value than its default and than the URL's.
fn check_fields_agree(
    settings: &Settings,
    url_setting: &str,
    url: &Endpoint,
    url_has_user: bool,
) -> Result<(), Error> {
    let given = |s: &str| {
        settings
            .given(s)
            .filter(|_| settings.set_apart_from_default(s))
    };
    let shown = |s: &str| given(s).map(super::settings::shown);
    let mut clash: Option<(&str, String)> = None;
    if let Some(host) = shown("host").filter(|h| !h.eq_ignore_ascii_case(&url.host)) {
        clash = Some((
            "host",
            format!("'{}' against '{}'", escaped(&host), escaped(&url.host)),
        ));
    } else if let Some(port) =
        given("port").and_then(|_| settings.number("port", 1, 65535).ok().flatten())
    {
        if port != u64::from(url.port) {
            clash = Some(("port", format!("{port} against {}", url.port)));
        }
    }
    if clash.is_none() && settings.flag("secure") && !url.tls {
        clash = Some(("secure", "true against a URL without TLS".into()));
    }
    if clash.is_none() {
        if let Some(user) = shown("username").filter(|u| url_has_user && *u != url.user) {
            clash = Some((
                "username",
                format!("'{}' against '{}'", escaped(&user), escaped(&url.user)),
            ));
        }
    }
    if clash.is_none()
        && !url.password.is_empty()
        && shown("password").is_some_and(|p| p != url.password)
    {
        clash = Some(("password", "two different passwords".into()));
    }
    if clash.is_none() {
        if let (Some(db), Some(url_db)) = (shown("database"), &url.database) {
            if db != *url_db {
                clash = Some((
                    "database",
                    format!("'{}' against '{}'", escaped(&db), escaped(url_db)),
                ));
            }
        }
    }
    match clash {
        None => Ok(()),
        Some((setting, what)) => Err(Error::invalid(format!(
            "settings {setting} and {url_setting} disagree ({what}): give one, or the same in both"
        ))),
    }
}

/// Whether a URL's text names a user and a password.
fn userinfo(url: &str) -> (bool, bool) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    match authority.rfind('@') {
        None => (false, false),
        Some(i) => {
            let info = &authority[..i];
            let user = info.split(':').next().unwrap_or("");
            (!user.is_empty(), info.contains(':'))
        }
    }
}

/// Which part of two connections differs, if any (never their values: one may be secret).
fn differing_part(a: &Endpoint, b: &Endpoint) -> Option<&'static str> {
    [
        ("TLS", a.tls == b.tls),
        ("hosts", a.host == b.host),
        ("ports", a.port == b.port),
        ("users", a.user == b.user),
        ("passwords", a.password == b.password),
        ("databases", a.database == b.database),
    ]
    .into_iter()
    .find(|(_, same)| !same)
    .map(|(part, _)| part)
}

/// A connection URL for the client from a setting's text: the state backend's forms as they
/// are, and a SQLAlchemy URL (`clickhouse+http://`, `clickhouse+https://`, `clickhouse://`
/// in `sqlalchemy_url`) turned into one. Its query is the driver's options, not ClickHouse
/// settings: `protocol=https` means TLS; `verify` and any other option have no effect here
/// (a warning each).
fn url_of(setting: &str, text: &str, warnings: &mut Vec<String>) -> Result<String, Error> {
    let Some((scheme, rest)) = text.split_once("://") else {
        return Ok(text.to_string());
    };
    let scheme = scheme.to_ascii_lowercase();
    let alchemy = scheme.contains('+') || setting == "sqlalchemy_url";
    if !alchemy {
        return Ok(text.to_string());
    }
    let mut tls = match scheme.as_str() {
        "clickhouse" | "clickhouse+http" | "http" => false,
        "clickhouse+https" | "https" | "clickhouses" => true,
        "clickhouse+native" | "clickhouse+asynch" => {
            return Err(Error::invalid(format!(
                "setting {setting}: {scheme}:// is ClickHouse's native protocol; this target speaks its HTTP interface: give clickhouse+http://host:8123/database (protocol=https and port 8443 for TLS)"
            )))
        }
        other => {
            let shown: String = other.chars().take(20).collect();
            return Err(Error::invalid(format!(
                "setting {setting}: unknown scheme '{}': expected clickhouse+http://, clickhouse+https:// or clickhouse://",
                escaped(&shown)
            )));
        }
    };
    let (userinfo, rest) = sqlalchemy_userinfo(rest);
    let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match (key, value.to_ascii_lowercase().as_str()) {
            ("protocol", "https") => tls = true,
            ("protocol", "http") => tls = false,
            ("verify", "true" | "1") => {}
            ("verify", _) => warnings.push(format!(
                "option verify of setting {setting} has no effect: TLS certificates are always verified (trust a private CA with ca_file)"
            )),
            _ => warnings.push(format!(
                "option '{}' of setting {setting} has no effect here",
                escaped(key)
            )),
        }
    }
    // clickhouse-sqlalchemy's HTTP driver connects to `url.port or 8123`, whatever the
    // protocol; `clickhouse+https://` (no such driver there) to 8443.
    let (hostport, path) = base.split_at(base.find('/').unwrap_or(base.len()));
    let has_port = match hostport.rfind(']') {
        Some(bracket) => hostport[bracket..].contains(':'),
        None => hostport.contains(':'),
    };
    let port = match (has_port, scheme.as_str()) {
        (true, _) => "",
        (false, "clickhouse+https" | "https" | "clickhouses") => ":8443",
        (false, _) => ":8123",
    };
    Ok(format!(
        "{}://{userinfo}{hostport}{port}{path}",
        if tls { "https" } else { "http" }
    ))
}

/// A SQLAlchemy URL's user and password, split off as SQLAlchemy splits them (a user up to
/// the first `:`, `/` or `@`; a password up to the next `@`, so it may hold `/`, `?` or `:`)
/// and percent-encoded again for the client's URL, and the rest (host, port, path, query).
fn sqlalchemy_userinfo(rest: &str) -> (String, &str) {
    let Some(end) = rest.find([':', '/', '@']) else {
        return (String::new(), rest);
    };
    let (user, password, after) = match rest.as_bytes()[end] {
        b'@' => (&rest[..end], None, &rest[end + 1..]),
        b':' => match rest[end + 1..].find('@') {
            Some(at) => (
                &rest[..end],
                Some(&rest[end + 1..end + 1 + at]),
                &rest[end + 2 + at..],
            ),
            None => return (String::new(), rest),
        },
        _ => return (String::new(), rest),
    };
    // SQLAlchemy unquotes both; a text that is not valid percent-encoding is taken as is.
    let again = |part: &str| {
        let plain = decode_component(part, false).unwrap_or_else(|_| part.to_string());
        encode_component(&plain)
    };
    let mut info = again(user);
    if let Some(password) = password {
        info.push(':');
        info.push_str(&again(password));
    }
    info.push('@');
    (info, after)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(json: serde_json::Value) -> Result<TargetConfig, Error> {
        TargetConfig::parse(&json.to_string())
    }

    fn endpoint(c: &TargetConfig) -> Endpoint {
        Endpoint::parse(&c.connection).unwrap()
    }

    #[test]
    fn uri_or_fields_and_the_tables_database() {
        let c = parse(json!({"uri": "clickhouse://u:secret@h:8123/meltano"})).unwrap();
        assert_eq!(c.database, "meltano");
        assert!(c.dedup && c.create_tables && c.warnings.is_empty());
        assert_eq!((c.batch_size_rows, &c.engine), (10_000, &Engine::Auto));
        let c = parse(json!({"host": "h", "secure": true, "username": "u",
            "password": "p", "dedup": "false", "batch_size_rows": "500"}))
        .unwrap();
        assert_eq!(c.connection.url, "https://h:8443");
        assert_eq!(
            (c.database.as_str(), c.dedup, c.batch_size_rows),
            ("default", false, 500)
        );
        let with_ca = parse(json!({"host": "h", "ca_file": "/etc/ca.pem"})).unwrap();
        assert_eq!(with_ca.ca_file.as_deref(), Some("/etc/ca.pem"));
        // The Hub's defaults: localhost:8123 as default, database default.
        let c = parse(json!({})).unwrap();
        assert_eq!(
            (c.connection.url.as_str(), c.database.as_str()),
            ("http://localhost:8123", "default")
        );
        assert_eq!(c.naming, Naming::Conformed);
    }

    #[test]
    fn sqlalchemy_urls_in_either_setting() {
        for (url, origin, db) in [
            (
                "clickhouse+http://u:pw@ch.example:8123/raw",
                "http://ch.example:8123",
                "raw",
            ),
            (
                "clickhouse+http://u:pw@ch.example:8443/raw?protocol=https",
                "https://ch.example:8443",
                "raw",
            ),
            (
                "clickhouse+https://u:pw@ch.example/raw",
                "https://ch.example:8443",
                "raw",
            ),
            (
                "clickhouse://ch.example/raw",
                "http://ch.example:8123",
                "raw",
            ),
        ] {
            for setting in ["sqlalchemy_url", "uri"] {
                let c = parse(json!({setting: url})).unwrap();
                assert_eq!(
                    (endpoint(&c).origin().as_str(), c.database.as_str()),
                    (origin, db),
                    "{setting} {url}"
                );
            }
        }
        let c =
            parse(json!({"sqlalchemy_url": "clickhouse+http://u:pw@h/db?verify=False&timeout=3"}))
                .unwrap();
        let warnings = c.warnings.join("\n");
        assert!(
            warnings.contains("option verify of setting sqlalchemy_url has no effect"),
            "{warnings}"
        );
        assert!(warnings.contains("option 'timeout'"), "{warnings}");
        // A password as SQLAlchemy reads it: up to the next '@', '/', '?' and ':' included.
        let c = parse(
            json!({"sqlalchemy_url": "clickhouse+http://u:a/b?c:d%40e@h:8124/db?protocol=http"}),
        )
        .unwrap();
        let e = endpoint(&c);
        assert_eq!(
            (e.user.as_str(), e.password.as_str(), e.port),
            ("u", "a/b?c:d@e", 8124)
        );
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        let e = parse(json!({"sqlalchemy_url": "clickhouse+native://u:pw@h:9000/db"})).unwrap_err();
        assert!(
            e.message.contains("native protocol") && !e.message.contains("pw"),
            "{}",
            e.message
        );
    }

    #[test]
    fn the_hubs_defaults_beside_a_url_yield_to_it_and_other_values_must_agree() {
        let hub = json!({"sqlalchemy_url": "clickhouse+http://bob:pw@ch.example:8124/raw",
            "driver": "http", "username": "default", "host": "localhost", "port": 8123,
            "database": "default", "secure": false, "verify": true, "optimize_after": false,
            "load_method": "append-only", "hard_delete": false, "validate_records": true});
        let c = parse(hub.clone()).unwrap();
        let e = endpoint(&c);
        assert_eq!(
            (e.origin().as_str(), e.user.as_str(), c.database.as_str()),
            ("http://ch.example:8124", "bob", "raw")
        );
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        for (field, value, says) in [
            (
                "host",
                json!("other"),
                "settings host and sqlalchemy_url disagree ('other' against 'ch.example')",
            ),
            (
                "port",
                json!(9000),
                "settings port and sqlalchemy_url disagree (9000 against 8124)",
            ),
            (
                "username",
                json!("alice"),
                "settings username and sqlalchemy_url disagree",
            ),
            (
                "password",
                json!("other"),
                "settings password and sqlalchemy_url disagree (two different passwords)",
            ),
            (
                "database",
                json!("analytics"),
                "settings database and sqlalchemy_url disagree ('analytics' against 'raw')",
            ),
            (
                "secure",
                json!(true),
                "settings secure and sqlalchemy_url disagree",
            ),
        ] {
            let mut config = hub.clone();
            config[field] = value;
            let e = parse(config).unwrap_err();
            assert!(e.message.contains(says), "{field}: {}", e.message);
            assert!(!e.message.contains("pw"), "{}", e.message);
        }
        // A URL without user or password takes the separate ones.
        let c = parse(
            json!({"sqlalchemy_url": "clickhouse://h/db", "username": "alice", "password": "s"}),
        )
        .unwrap();
        assert_eq!(
            (endpoint(&c).user.as_str(), endpoint(&c).password.as_str()),
            ("alice", "s")
        );
        let e = parse(
            json!({"uri": "clickhouse://u:a@h/db", "sqlalchemy_url": "clickhouse+http://u:b@h/db"}),
        )
        .unwrap_err();
        assert!(
            e.message.contains("passwords differ") && !e.message.contains(":a@"),
            "{}",
            e.message
        );
        parse(json!({"uri": "clickhouse://u:a@h/db", "sqlalchemy_url": "clickhouse+http://u:a@h:8123/db"})).unwrap();
    }

    #[test]
    fn flattening_is_read_as_the_sdk_reads_it() {
        assert_eq!(parse(json!({"host": "h"})).unwrap().flattening, None);
        let on = |more: Value| {
            let mut c = json!({"host": "h", "flattening_enabled": true});
            c.as_object_mut()
                .unwrap()
                .extend(more.as_object().unwrap().clone());
            parse(c)
        };
        let f = on(json!({"flattening_max_depth": 2}))
            .unwrap()
            .flattening
            .unwrap();
        assert_eq!(
            (f.max_depth, f.separator.as_str(), f.max_key_length),
            (2, "__", 255)
        );
        // Depth 0 flattens nothing, as in the SDK.
        assert_eq!(
            on(json!({"flattening_max_depth": 0})).unwrap().flattening,
            None
        );
        let e = on(json!({})).unwrap_err();
        assert!(
            e.message.contains("needs flattening_max_depth"),
            "{}",
            e.message
        );
        let e = on(json!({"flattening_max_depth": 1, "flattening_separator": ""})).unwrap_err();
        assert!(e.message.contains("must not be empty"), "{}", e.message);
    }

    #[test]
    fn an_overwrite_or_upsert_is_refused_where_it_cannot_hold() {
        let c = parse(json!({"host": "h", "load_method": "overwrite"})).unwrap();
        assert!(c.overwrite);
        assert!(!parse(json!({"host": "h"})).unwrap().overwrite);
        // With the default table_path ({uuid}), Replicated tables are fine.
        assert!(
            parse(json!({"host": "h", "load_method": "overwrite", "engine_type": "ReplicatedMergeTree"}))
                .unwrap()
                .overwrite
        );
        let e = parse(json!({"host": "h", "load_method": "upsert", "engine_type": "MergeTree"}))
            .unwrap_err();
        assert!(
            e.message.contains("a MergeTree keeps every row"),
            "{}",
            e.message
        );
        assert!(
            parse(json!({"host": "h", "load_method": "upsert"}))
                .unwrap()
                .upsert
        );
        for (more, says) in [
            (json!({"create_tables": false}), "needs create_tables"),
            (
                json!({"engine_type": "ReplicatedMergeTree", "table_path": "/t/$table_name"}),
                "needs a table_path with {uuid}",
            ),
            (
                json!({"cluster_name": "c", "table_path": "/t/{shard}/$table_name"}),
                "needs a table_path with {uuid}",
            ),
        ] {
            let mut config = json!({"host": "h", "load_method": "overwrite"});
            config
                .as_object_mut()
                .unwrap()
                .extend(more.as_object().unwrap().clone());
            let e = parse(config).unwrap_err();
            assert!(e.message.contains(says), "{}", e.message);
        }
    }

    #[test]
    fn bad_settings_are_named_and_secrets_never_shown() {
        for (json, says) in [
            (json!({"host": " "}), "setting host must be a host name"),
            (
                json!({"host": "h", "batch_size_rows": 0}),
                "batch_size_rows must be",
            ),
            (
                json!({"host": "h", "dedup": "yes"}),
                "dedup must be true or false",
            ),
            (
                json!({"host": "h", "compression": "brotli"}),
                "compression must be one of",
            ),
            (
                json!({"host": "h", "number_type": "Decimal(80, 2)"}),
                "number_type must be Float64 or Decimal",
            ),
            (json!({"host": "h", "number_type": "String"}), "number_type"),
            (
                json!({"host": "h", "table_name": " "}),
                "table_name must be a name",
            ),
            (json!({"uri": "ftp://u:hunter2@h"}), ""),
            (
                json!({"sqlalchemy_url": "postgresql://u:hunter2@h"}),
                "unknown scheme 'postgresql'",
            ),
            (json!([1]), "JSON object"),
        ] {
            let e = parse(json.clone()).unwrap_err();
            assert!(e.message.contains(says), "{json}: {}", e.message);
            assert!(!e.message.contains("hunter2"), "{}", e.message);
        }
        let e = TargetConfig::parse("{\"password\": \"hunter2\",").unwrap_err();
        assert!(e.message.contains("not JSON") && !e.message.contains("hunter2"));
        let c = parse(json!({"host": "h", "number_type": "Decimal(38, 9)", "engine_type": "ReplicatedReplacingMergeTree"})).unwrap();
        assert_eq!(
            c.number_type,
            Type::Decimal {
                precision: 38,
                scale: 9
            }
        );
        assert_eq!((c.engine, c.replicated), (Engine::ReplacingMergeTree, true));
    }
}
