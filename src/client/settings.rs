//! ClickHouse settings and the URL parameters of the HTTP interface: the names the client sets
//! itself (one constant each, used by the request builder), and the rules a setting given by a
//! caller (connection string, sink option) must follow.

use super::error::Error;

/// The statement (URL parameter), when the body holds data.
pub const QUERY: &str = "query";
/// The current database.
pub const DATABASE: &str = "database";
/// The output format of a statement that returns rows.
pub const DEFAULT_FORMAT: &str = "default_format";
/// `1`: the server answers after the statement finished (a 200 means it all succeeded).
pub const WAIT_END_OF_QUERY: &str = "wait_end_of_query";
/// The prefix of a typed query parameter's value (`param_<name>`).
pub const PARAM_PREFIX: &str = "param_";
/// The setting that lets the server compress its answer as `Accept-Encoding` asks.
pub const ENABLE_HTTP_COMPRESSION: &str = "enable_http_compression";

/// URL parameters the client controls itself; a connection string may not set them.
const RESERVED_KEYS: &[&str] = &[
    QUERY,
    "query_id",
    DEFAULT_FORMAT,
    DATABASE,
    "user",
    "password",
    "session_id",
    "session_timeout",
    "session_check",
    WAIT_END_OF_QUERY,
    "compress",
    "decompress",
    "buffer_size",
    "quota_key",
];

/// Options other clients accept in their DSNs that mean nothing here, with what to do instead.
const FOREIGN_OPTIONS: &[(&str, &str)] = &[
    (
        "secure",
        "the scheme decides TLS: use clickhouses:// or https://",
    ),
    (
        "ssl",
        "the scheme decides TLS: use clickhouses:// or https://",
    ),
    (
        "tls",
        "the scheme decides TLS: use clickhouses:// or https://",
    ),
    ("verify", "certificate checks are the host's business"),
    (
        "compression",
        "INSERT compression is the sink's option (--compression, CLICKHOUSE_COMPRESSION), not the connection's",
    ),
    ("connect_timeout", "use connect_timeout_ms"),
    ("send_receive_timeout", "use request_timeout_ms"),
];

/// Checks that a setting name is a plain ClickHouse identifier and not reserved by the client.
pub fn check_setting_name(name: &str) -> Result<(), Error> {
    let valid = !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(Error::invalid(format!(
            "unknown option '{}': settings are named with letters, digits and '_'",
            crate::text::escaped(name)
        )));
    }
    if RESERVED_KEYS.contains(&name) || name.starts_with(PARAM_PREFIX) {
        return Err(Error::invalid(format!(
            "'{name}' is set by the client and cannot be given as a setting"
        )));
    }
    if let Some((_, hint)) = FOREIGN_OPTIONS.iter().find(|(key, _)| *key == name) {
        return Err(Error::invalid(format!("unknown option '{name}': {hint}")));
    }
    Ok(())
}
