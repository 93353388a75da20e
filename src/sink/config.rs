//! Sink options as the caller gives them, and the validated [`SinkConfig`]: table name,
//! columns, batch size, settings (with the async-insert rule), deduplication.

use crate::client::settings::check_setting_name;
use crate::client::{Compression, Endpoint, Error};

/// Default rows per INSERT.
pub const DEFAULT_BATCH_SIZE: u32 = 1000;

/// Options as given (the WIT `sink-options` record).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SinkOptions {
    /// `table` or `database.table`.
    pub table: String,
    /// Columns, in the order values are written; `None`: the first row's keys.
    pub columns: Option<Vec<String>>,
    /// Rows per INSERT (default 1000).
    pub batch_size: Option<u32>,
    /// ClickHouse settings for the INSERTs (after the connection's).
    pub settings: Vec<(String, String)>,
    /// Send an `insert_deduplication_token` per chunk.
    pub dedup: bool,
    /// How many times a chunk that failed in a way that may pass is resent with the same
    /// token (default 0); needs `dedup`.
    pub retries: u32,
    /// How INSERT bodies are compressed on the wire (default LZ4).
    pub compression: Compression,
}

/// Validated options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkConfig {
    /// Database, when the table was given as `database.table`.
    pub database: Option<String>,
    /// Table.
    pub table: String,
    /// Configured columns.
    pub columns: Option<Vec<String>>,
    /// Rows per INSERT.
    pub batch_size: usize,
    /// Settings sent with every INSERT, in order (the sink's own first, then the caller's).
    pub settings: Vec<(String, String)>,
    /// Deduplication tokens on.
    pub dedup: bool,
    /// Resends of a failed chunk (0 without `dedup`).
    pub retries: u32,
    /// Whether inserts are asynchronous (`async_insert` on); then `written_rows` is not checked.
    pub async_insert: bool,
    /// How INSERT bodies are compressed on the wire.
    pub compression: Compression,
}

/// How ClickHouse reads a boolean setting given as text (a URL parameter): `0`, `1`, or
/// `true`/`false` in any case (`SettingFieldBool`); `None` for anything else, which a server
/// refuses with CANNOT_PARSE_BOOL (`on`, `yes`, `2`, quoted or padded values).
pub fn parse_bool_setting(value: &str) -> Option<bool> {
    match value {
        "1" => Some(true),
        "0" => Some(false),
        v if v.eq_ignore_ascii_case("true") => Some(true),
        v if v.eq_ignore_ascii_case("false") => Some(false),
        _ => None,
    }
}

impl SinkConfig {
    /// Checks every option rule; `invalid-input` naming the problem otherwise.
    pub fn new(options: &SinkOptions, endpoint: &Endpoint) -> Result<SinkConfig, Error> {
        let (database, table) = parse_target(&options.table)?;
        if let Some(columns) = &options.columns {
            check_columns(columns)?;
        }
        let batch_size = options.batch_size.unwrap_or(DEFAULT_BATCH_SIZE);
        if batch_size == 0 {
            return Err(Error::invalid("batch-size must be greater than 0"));
        }
        for (name, _) in &options.settings {
            check_setting_name(name)?;
        }
        let (async_insert, wait) = check_delivery(options, endpoint)?;
        check_exactness(options, endpoint)?;
        // The sink's own defaults come first, so the caller's settings override them: exact
        // delivery (a null never silently becomes a default, an unknown key is never dropped),
        // and never fire-and-forget, whatever the server's profile says.
        let mut settings = vec![
            ("input_format_null_as_default".to_string(), "0".to_string()),
            (
                "input_format_skip_unknown_fields".to_string(),
                "0".to_string(),
            ),
            // A date or time out of its column's range is an error, not clamped or wrapped
            // (in the column's time zone, which only the server knows): see
            // `super::native`'s `in_range`.
            (
                "date_time_overflow_behavior".to_string(),
                "throw".to_string(),
            ),
            // Into a Distributed table (or through a materialized view into one), an
            // acknowledged INSERT has reached every shard, not a queue on this server. Sent
            // always: harmless for other tables, and a view's target is not known here.
            ("distributed_foreground_insert".to_string(), "1".to_string()),
        ];
        if wait.is_none() {
            settings.push(("wait_for_async_insert".to_string(), "1".to_string()));
        }
        settings.extend(options.settings.iter().cloned());
        Ok(SinkConfig {
            database,
            table,
            columns: options.columns.clone(),
            batch_size: batch_size as usize,
            settings,
            dedup: options.dedup,
            retries: options.retries,
            async_insert,
            compression: options.compression,
        })
    }

    /// `database.table` or `table`, for messages and tokens.
    pub fn qualified_table(&self) -> String {
        match &self.database {
            Some(db) => format!("{db}.{}", self.table),
            None => self.table.clone(),
        }
    }
}

/// `table` or `database.table`, both parts non-blank.
fn parse_target(table: &str) -> Result<(Option<String>, String), Error> {
    let table = table.trim();
    if table.is_empty() {
        return Err(Error::invalid("table must not be blank"));
    }
    match table.split_once('.') {
        Some((db, t)) if db.trim().is_empty() || t.trim().is_empty() => {
            Err(Error::invalid(format!(
                "table '{}' must be 'table' or 'database.table' with both parts non-blank",
                crate::text::escaped(table)
            )))
        }
        Some((db, t)) => Ok((Some(db.to_string()), t.to_string())),
        None => Ok((None, table.to_string())),
    }
}

/// A column list names at least one column, none blank, none twice.
fn check_columns(columns: &[String]) -> Result<(), Error> {
    if columns.is_empty() {
        return Err(Error::invalid(
            "columns, when given, must name at least one column",
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for c in columns {
        if c.trim().is_empty() {
            return Err(Error::invalid("column names must not be blank"));
        }
        if !seen.insert(c.as_str()) {
            return Err(Error::invalid(format!(
                "column '{}' is listed twice",
                crate::text::escaped(c)
            )));
        }
    }
    Ok(())
}

/// Settings that would let the server change values silently are refused: a
/// `date_time_overflow_behavior` other than `throw` (the sink's or the connection's).
fn check_exactness(options: &SinkOptions, endpoint: &Endpoint) -> Result<(), Error> {
    let name = "date_time_overflow_behavior";
    for (source, value) in options
        .settings
        .iter()
        .map(|s| ("the sink's settings", s))
        .chain(
            endpoint
                .settings
                .iter()
                .map(|s| ("the connection's settings", s)),
        )
        .filter(|(_, (n, _))| n == name)
        .map(|(source, (_, v))| (source, v))
    {
        if value != "throw" {
            return Err(Error::invalid(format!(
                "{name} = '{}' in {source}: the sink stores values exactly or refuses them, and '{}' lets ClickHouse store another date than the one sent (leave it out, or set it to throw)",
                crate::text::escaped(value),
                crate::text::escaped(value)
            )));
        }
    }
    Ok(())
}

/// The delivery rules: dedup needs insert_deduplicate, retries need dedup, and an async insert
/// must wait for its flush (never fire-and-forget). Returns whether inserts are async and the
/// effective wait_for_async_insert (the sink's setting, else the connection's).
fn check_delivery(
    options: &SinkOptions,
    endpoint: &Endpoint,
) -> Result<(bool, Option<bool>), Error> {
    // The effective value of a setting: the sink's, else the connection's.
    let effective = |name: &str| -> Option<&str> {
        options
            .settings
            .iter()
            .rev()
            .chain(endpoint.settings.iter().rev())
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let bool_setting = |name: &str| -> Result<Option<bool>, Error> {
        match effective(name) {
            None => Ok(None),
            Some(v) => parse_bool_setting(v).map(Some).ok_or_else(|| {
                Error::invalid(format!(
                    "{name} must be 0, 1, true or false (ClickHouse accepts no other spelling)"
                ))
            }),
        }
    };
    let own_dedup_off = options
        .settings
        .iter()
        .rev()
        .find(|(n, _)| n == "insert_deduplicate")
        .and_then(|(_, v)| parse_bool_setting(v))
        == Some(false);
    if options.dedup && own_dedup_off {
        return Err(Error::invalid(
            "dedup needs insert_deduplicate: it is set to 0 (remove that setting, or turn dedup off)",
        ));
    }
    if options.retries > 0 && !options.dedup {
        return Err(Error::invalid(
            "retries need dedup: a chunk resent without its deduplication token could be written twice (turn dedup on, or set retries to 0)",
        ));
    }
    for name in ["distributed_foreground_insert", "insert_distributed_sync"] {
        if bool_setting(name)? == Some(false) {
            return Err(Error::invalid(format!(
                "{name} is off: a Distributed table would queue the rows on this server and acknowledge them before any shard has them, fire-and-forget (remove that setting, or set it to 1)"
            )));
        }
    }
    let async_insert = bool_setting("async_insert")?.unwrap_or(false);
    let wait = bool_setting("wait_for_async_insert")?;
    if async_insert && wait != Some(true) {
        return Err(Error::invalid(
            "async_insert is enabled but wait_for_async_insert is not: fire-and-forget inserts are refused (set wait_for_async_insert=1, or turn async_insert off)",
        ));
    }
    Ok((async_insert, wait))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{ConnectionOptions, ErrorKind};

    fn endpoint(url: &str) -> Endpoint {
        Endpoint::parse(&ConnectionOptions::from_url(url)).unwrap()
    }

    fn opts(table: &str) -> SinkOptions {
        SinkOptions {
            table: table.into(),
            ..Default::default()
        }
    }

    /// Sink options for table `t` with these settings.
    fn with(settings: &[(&str, &str)]) -> SinkOptions {
        SinkOptions {
            settings: settings
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            ..opts("t")
        }
    }

    fn err(options: SinkOptions, url: &str) -> String {
        let e = SinkConfig::new(&options, &endpoint(url)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput);
        e.message
    }

    #[test]
    fn table_forms() {
        let c = SinkConfig::new(&opts("events"), &endpoint("http://h")).unwrap();
        assert_eq!((c.database, c.table.as_str()), (None, "events"));
        let c = SinkConfig::new(&opts("db.events"), &endpoint("http://h")).unwrap();
        assert_eq!(
            (c.database.as_deref(), c.table.as_str()),
            (Some("db"), "events")
        );
        assert_eq!(c.qualified_table(), "db.events");
        assert!(err(opts(""), "http://h").contains("blank"));
        assert!(err(opts("   "), "http://h").contains("blank"));
        assert!(err(opts(".t"), "http://h").contains("both parts"));
        assert!(err(opts("db."), "http://h").contains("both parts"));
    }

    #[test]
    fn columns_and_batch_size() {
        let with = |columns: Vec<&str>| SinkOptions {
            columns: Some(columns.into_iter().map(String::from).collect()),
            ..opts("t")
        };
        assert!(err(with(vec![]), "http://h").contains("at least one column"));
        assert!(err(with(vec!["a", " "]), "http://h").contains("blank"));
        assert!(err(with(vec!["a", "b", "a"]), "http://h").contains("listed twice"));
        assert!(SinkConfig::new(&with(vec!["a", "b"]), &endpoint("http://h")).is_ok());
        let zero = SinkOptions {
            batch_size: Some(0),
            ..opts("t")
        };
        assert!(err(zero, "http://h").contains("batch-size"));
        let c = SinkConfig::new(&opts("t"), &endpoint("http://h")).unwrap();
        assert_eq!(c.batch_size, 1000);
    }

    #[test]
    fn background_distributed_inserts_are_refused_in_both_spellings() {
        let ok = SinkConfig::new(&opts("t"), &endpoint("http://h")).unwrap();
        assert!(ok
            .settings
            .contains(&("distributed_foreground_insert".into(), "1".into())));
        for name in ["distributed_foreground_insert", "insert_distributed_sync"] {
            for off in ["0", "false", "False"] {
                let msg = err(with(&[(name, off)]), "http://h");
                assert!(
                    msg.contains("fire-and-forget") && msg.contains(name),
                    "{msg}"
                );
            }
            let msg = err(opts("t"), &format!("http://h?{name}=0"));
            assert!(msg.contains(name), "{msg}");
            assert!(SinkConfig::new(&with(&[(name, "1")]), &endpoint("http://h")).is_ok());
        }
    }

    #[test]
    fn dates_out_of_range_are_errors_and_no_setting_makes_them_silent() {
        let ok = SinkConfig::new(&opts("t"), &endpoint("http://h")).unwrap();
        assert!(ok
            .settings
            .contains(&("date_time_overflow_behavior".into(), "throw".into())));
        for value in ["ignore", "saturate", "THROW", ""] {
            let msg = err(with(&[("date_time_overflow_behavior", value)]), "http://h");
            assert!(msg.contains("date_time_overflow_behavior"), "{msg}");
        }
        let msg = err(opts("t"), "http://h?date_time_overflow_behavior=saturate");
        assert!(msg.contains("the connection's settings"), "{msg}");
        assert!(SinkConfig::new(
            &with(&[("date_time_overflow_behavior", "throw")]),
            &endpoint("http://h")
        )
        .is_ok());
    }

    #[test]
    fn async_insert_needs_wait_in_every_spelling() {
        for on in ["1", "true", "TRUE", "True"] {
            let msg = err(with(&[("async_insert", on)]), "http://h");
            assert!(msg.contains("fire-and-forget"), "{on}: {msg}");
            let msg = err(
                with(&[("async_insert", on), ("wait_for_async_insert", "0")]),
                "http://h",
            );
            assert!(msg.contains("fire-and-forget"), "{on}: {msg}");
            let ok = SinkConfig::new(
                &with(&[("async_insert", on), ("wait_for_async_insert", "true")]),
                &endpoint("http://h"),
            )
            .unwrap();
            assert!(ok.async_insert);
        }
        // From the connection string too, and overridden by the sink's settings.
        assert!(err(opts("t"), "http://h?async_insert=1").contains("fire-and-forget"));
        assert!(SinkConfig::new(
            &with(&[("async_insert", "0")]),
            &endpoint("http://h?async_insert=1")
        )
        .is_ok());
        assert!(SinkConfig::new(
            &with(&[("wait_for_async_insert", "1")]),
            &endpoint("http://h?async_insert=1")
        )
        .is_ok());
        for off in ["0", "false", "FALSE"] {
            assert!(
                SinkConfig::new(&with(&[("async_insert", off)]), &endpoint("http://h")).is_ok()
            );
        }
        // Spellings a server refuses (CANNOT_PARSE_BOOL) are refused before any request.
        for bad in ["maybe", "on", "off", "yes", "2", "'1'", " 1 ", ""] {
            let msg = err(
                with(&[("async_insert", bad), ("wait_for_async_insert", "1")]),
                "http://h",
            );
            assert!(
                msg.contains("must be 0, 1, true or false"),
                "{bad:?}: {msg}"
            );
        }
        let dedup_off = SinkOptions {
            dedup: true,
            ..with(&[("insert_deduplicate", "0")])
        };
        assert!(err(dedup_off, "http://h").contains("dedup needs insert_deduplicate"));
        let retries_without_dedup = SinkOptions {
            retries: 3,
            ..opts("t")
        };
        assert!(err(retries_without_dedup, "http://h").starts_with("retries need dedup"));
        let retries_with_dedup = SinkOptions {
            retries: 3,
            dedup: true,
            ..opts("t")
        };
        assert_eq!(
            SinkConfig::new(&retries_with_dedup, &endpoint("http://h"))
                .unwrap()
                .retries,
            3
        );
    }

    #[test]
    fn sink_settings_force_exact_delivery_but_let_the_caller_override() {
        let c = SinkConfig::new(&opts("t"), &endpoint("http://h")).unwrap();
        assert!(c
            .settings
            .contains(&("input_format_null_as_default".into(), "0".into())));
        assert!(c
            .settings
            .contains(&("input_format_skip_unknown_fields".into(), "0".into())));
        assert!(c
            .settings
            .contains(&("wait_for_async_insert".into(), "1".into())));
        let o = SinkOptions {
            settings: vec![("input_format_null_as_default".into(), "1".into())],
            ..opts("t")
        };
        let c = SinkConfig::new(&o, &endpoint("http://h")).unwrap();
        assert_eq!(
            c.settings.last().unwrap(),
            &("input_format_null_as_default".to_string(), "1".to_string())
        );
        let bad = SinkOptions {
            settings: vec![("query".into(), "x".into())],
            ..opts("t")
        };
        assert!(err(bad, "http://h").contains("set by the client"));
    }
}
