//! Connection strings (`clickhouse://`, `clickhouses://`, `http://`, `https://`) and explicit
//! connection fields, resolved into one validated [`Endpoint`].

use std::fmt;
use std::time::Duration;

use super::error::Error;
use super::secrets::is_secret_setting;
use super::settings::check_setting_name;
use super::url::{decode_component, DecodeError};

/// Default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time allowed for the first response byte and between response bytes.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// Default port of the plain HTTP interface.
pub const DEFAULT_HTTP_PORT: u16 = 8123;
/// Default port of the TLS HTTP interface.
pub const DEFAULT_HTTPS_PORT: u16 = 8443;

/// The connection as the caller gives it (the WIT `connection` record).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ConnectionOptions {
    /// Connection string.
    pub url: String,
    /// Explicit user (overrides the URL's).
    pub user: Option<String>,
    /// Explicit password (overrides the URL's, even when empty).
    pub password: Option<String>,
    /// Explicit database (overrides the URL path).
    pub database: Option<String>,
    /// Explicit settings (added after, and overriding, the URL's).
    pub settings: Vec<(String, String)>,
    /// Connect timeout in milliseconds.
    pub connect_timeout_ms: Option<u32>,
    /// Request timeout in milliseconds: no byte for this long ends a request, and a small
    /// answer must arrive whole within it.
    pub request_timeout_ms: Option<u32>,
}

impl fmt::Debug for ConnectionOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL and settings may hold secrets: show neither.
        f.debug_struct("ConnectionOptions")
            .field("user", &self.user)
            .field("database", &self.database)
            .field("settings", &self.settings.len())
            .finish_non_exhaustive()
    }
}

impl ConnectionOptions {
    /// Options with just a URL.
    pub fn from_url(url: impl Into<String>) -> Self {
        ConnectionOptions {
            url: url.into(),
            ..Default::default()
        }
    }
}

/// A validated, fully resolved connection.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// TLS (`clickhouses://`, `https://`).
    pub tls: bool,
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// User name.
    pub user: String,
    /// Password (possibly empty).
    pub password: String,
    /// Database for unqualified names, if any.
    pub database: Option<String>,
    /// Settings sent with every request, in order, names unique.
    pub settings: Vec<(String, String)>,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Request timeout (see [`ConnectionOptions::request_timeout_ms`]).
    pub request_timeout: Duration,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("origin", &self.origin())
            .field("user", &self.user)
            .field("password", &"***")
            .field("database", &self.database)
            .field(
                "settings",
                &self
                    .settings
                    .iter()
                    .map(|(k, _)| k.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Endpoint {
    /// Parses and validates a connection; every failure is `invalid-input` and never quotes the
    /// password or a setting value.
    pub fn parse(options: &ConnectionOptions) -> Result<Endpoint, Error> {
        let parsed = ParsedUrl::parse(&options.url)?;
        let user = match &options.user {
            Some(user) if user.is_empty() => return Err(Error::invalid("user must not be empty")),
            Some(user) => user.clone(),
            None => parsed.user.unwrap_or_else(|| "default".to_string()),
        };
        let password = options
            .password
            .clone()
            .or(parsed.password)
            .unwrap_or_default();
        let database = match &options.database {
            Some(db) if db.is_empty() => return Err(Error::invalid("database must not be empty")),
            Some(db) => Some(db.clone()),
            None => parsed.database,
        };
        if let Some(db) = &database {
            if db.chars().any(char::is_control) {
                return Err(Error::invalid(
                    "database name must not contain control characters",
                ));
            }
        }
        let mut settings = parsed.settings;
        for (name, value) in &options.settings {
            check_setting_name(name)?;
            match settings.iter_mut().find(|(n, _)| n == name) {
                Some(slot) => slot.1 = value.clone(),
                None => settings.push((name.clone(), value.clone())),
            }
        }
        let connect_timeout = timeout(
            "connect-timeout-ms",
            options.connect_timeout_ms.or(parsed.connect_timeout_ms),
            DEFAULT_CONNECT_TIMEOUT,
        )?;
        let request_timeout = timeout(
            "request-timeout-ms",
            options.request_timeout_ms.or(parsed.request_timeout_ms),
            DEFAULT_REQUEST_TIMEOUT,
        )?;
        Ok(Endpoint {
            tls: parsed.tls,
            host: parsed.host,
            port: parsed.port,
            user,
            password,
            database,
            settings,
            connect_timeout,
            request_timeout,
        })
    }

    /// `scheme://host:port` with `http`/`https` as the scheme (IPv6 hosts in brackets).
    pub fn origin(&self) -> String {
        format!(
            "{}://{}",
            if self.tls { "https" } else { "http" },
            self.authority()
        )
    }

    /// `host:port` (IPv6 hosts in brackets).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Values that must never appear in a message: the password and secret-looking settings.
    pub fn secrets(&self) -> Vec<String> {
        let mut secrets = vec![self.password.clone()];
        if !self.password.is_empty() {
            // The form HTTP Basic sends it in (when a credential holds a control character).
            secrets.push(super::request::basic_credentials(
                &self.user,
                &self.password,
            ));
        }
        secrets.extend(
            self.settings
                .iter()
                .filter(|(name, _)| is_secret_setting(name))
                .map(|(_, value)| value.clone()),
        );
        secrets
    }
}

fn timeout(name: &str, ms: Option<u32>, default: Duration) -> Result<Duration, Error> {
    match ms {
        None => Ok(default),
        Some(0) => Err(Error::invalid(format!("{name} must be greater than 0"))),
        Some(ms) => Ok(Duration::from_millis(u64::from(ms))),
    }
}

/// The parts of a connection string.
#[derive(Debug, PartialEq, Eq)]
struct ParsedUrl {
    tls: bool,
    host: String,
    port: u16,
    user: Option<String>,
    password: Option<String>,
    database: Option<String>,
    settings: Vec<(String, String)>,
    connect_timeout_ms: Option<u32>,
    request_timeout_ms: Option<u32>,
}

impl ParsedUrl {
    fn parse(url: &str) -> Result<ParsedUrl, Error> {
        if url.is_empty() {
            return Err(Error::invalid("connection string is empty"));
        }
        if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(Error::invalid(
                "connection string must not contain spaces or control characters (percent-encode them)",
            ));
        }
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(Error::invalid(
                "connection string has no scheme: expected clickhouse://, clickhouses://, http:// or https://",
            ));
        };
        let tls = match scheme.to_ascii_lowercase().as_str() {
            "clickhouse" | "http" => false,
            "clickhouses" | "https" => true,
            other => {
                let shown: String = other.chars().take(20).collect();
                return Err(Error::invalid(format!(
                    "unknown scheme '{}': expected clickhouse, clickhouses, http or https",
                    crate::text::escaped(&shown)
                )));
            }
        };
        if rest.contains('#') {
            return Err(Error::invalid(
                "connection string must not have a #fragment",
            ));
        }
        let (before_query, query) = match rest.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match before_query.find('/') {
            Some(i) => (&before_query[..i], &before_query[i..]),
            None => (before_query, ""),
        };
        let (userinfo, hostport) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (user, password) = match info.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (info, None),
                };
                let user = decode_part("user name", user)?;
                let password = match password {
                    Some(p) => Some(decode_part("password", p)?),
                    None => None,
                };
                ((!user.is_empty()).then_some(user), password)
            }
        };
        let (host, port) = parse_host_port(hostport, tls)?;
        let database = parse_path(path)?;
        let mut parsed = ParsedUrl {
            tls,
            host,
            port,
            user,
            password,
            database,
            settings: Vec::new(),
            connect_timeout_ms: None,
            request_timeout_ms: None,
        };
        if let Some(query) = query {
            parsed.parse_query(query)?;
        }
        Ok(parsed)
    }

    fn parse_query(&mut self, query: &str) -> Result<(), Error> {
        let mut seen: Vec<String> = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (raw_key, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = decode_component(raw_key, true)
                .map_err(|_| Error::invalid("an option name has invalid percent-encoding"))?;
            if seen.contains(&key) {
                return Err(Error::invalid(format!(
                    "option '{}' is given twice",
                    crate::text::escaped(&key)
                )));
            }
            if !pair.contains('=') {
                return Err(Error::invalid(format!(
                    "option '{}' has no value (write {}=value)",
                    crate::text::escaped(&key),
                    crate::text::escaped(&key)
                )));
            }
            let value = decode_component(raw_value, true).map_err(|_| {
                Error::invalid(format!(
                    "the value of option '{}' has invalid percent-encoding",
                    crate::text::escaped(&key)
                ))
            })?;
            match key.as_str() {
                "connect_timeout_ms" => self.connect_timeout_ms = Some(parse_ms(&key, &value)?),
                "request_timeout_ms" => self.request_timeout_ms = Some(parse_ms(&key, &value)?),
                _ => {
                    check_setting_name(&key)?;
                    self.settings.push((key.clone(), value));
                }
            }
            seen.push(key);
        }
        Ok(())
    }
}

fn parse_ms(key: &str, value: &str) -> Result<u32, Error> {
    value.parse::<u32>().map_err(|_| {
        Error::invalid(format!(
            "option '{key}' must be a whole number of milliseconds"
        ))
    })
}

fn decode_part(what: &str, raw: &str) -> Result<String, Error> {
    decode_component(raw, false).map_err(|e| match e {
        DecodeError::BadEscape => Error::invalid(format!(
            "the {what} in the connection string has invalid percent-encoding ('%' must be followed by two hex digits)"
        )),
        DecodeError::NotUtf8 => Error::invalid(format!(
            "the {what} in the connection string is not valid UTF-8 after percent-decoding"
        )),
    })
}

fn parse_host_port(hostport: &str, tls: bool) -> Result<(String, u16), Error> {
    let default_port = if tls {
        DEFAULT_HTTPS_PORT
    } else {
        DEFAULT_HTTP_PORT
    };
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let Some((host, after)) = rest.split_once(']') else {
            return Err(Error::invalid("IPv6 host is missing its closing ']'"));
        };
        // The standard library's parser: every form RFC 4291 allows, nothing else.
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(Error::invalid("invalid IPv6 host in brackets"));
        }
        let port = match after {
            "" => None,
            p => match p.strip_prefix(':') {
                Some(p) => Some(p),
                None => return Err(Error::invalid("unexpected text after the IPv6 host")),
            },
        };
        (host.to_string(), port)
    } else {
        let (host, port) = match hostport.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        };
        if host.is_empty() {
            return Err(Error::invalid("connection string has no host"));
        }
        if !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
            || host.starts_with('.')
            || host.starts_with('-')
        {
            return Err(Error::invalid(format!(
                "invalid host '{}': use a DNS name or an IP address",
                crate::text::escaped(host)
            )));
        }
        (host.to_ascii_lowercase(), port)
    };
    let port = match port {
        None => default_port,
        Some(p) => match p.parse::<u16>() {
            Ok(port) if port > 0 && p.bytes().all(|b| b.is_ascii_digit()) => port,
            _ => {
                let shown: String = p.chars().take(20).collect();
                return Err(Error::invalid(format!(
                    "invalid port '{}': expected a number from 1 to 65535",
                    crate::text::escaped(&shown)
                )));
            }
        },
    };
    Ok((host, port))
}

fn parse_path(path: &str) -> Result<Option<String>, Error> {
    let trimmed = path.strip_prefix('/').unwrap_or(path);
    let trimmed = trimmed.strip_suffix('/').unwrap_or(trimmed);
    if trimmed.is_empty() {
        return Ok(None);
    }
    if trimmed.contains('/') {
        return Err(Error::invalid(
            "the path of the connection string is the database: one segment, as in /analytics",
        ));
    }
    decode_part("database", trimmed).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::error::ErrorKind;

    fn parse(url: &str) -> Result<Endpoint, Error> {
        Endpoint::parse(&ConnectionOptions::from_url(url))
    }

    fn ok(url: &str) -> Endpoint {
        parse(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    fn err(url: &str) -> String {
        let e = parse(url).expect_err(url);
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{url}");
        e.message
    }

    #[test]
    fn schemes_decide_tls_and_default_ports() {
        let cases = [
            ("clickhouse://h", false, 8123),
            ("http://h", false, 8123),
            ("clickhouses://h", true, 8443),
            ("https://h", true, 8443),
            ("HTTPS://h", true, 8443),
            ("clickhouse://h:9000", false, 9000),
            ("https://h:443", true, 443),
        ];
        for (url, tls, port) in cases {
            let e = ok(url);
            assert_eq!((e.tls, e.port), (tls, port), "{url}");
        }
    }

    #[test]
    fn defaults() {
        let e = ok("clickhouse://localhost");
        assert_eq!(e.host, "localhost");
        assert_eq!(e.user, "default");
        assert_eq!(e.password, "");
        assert_eq!(e.database, None);
        assert!(e.settings.is_empty());
        assert_eq!(e.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(e.request_timeout, DEFAULT_REQUEST_TIMEOUT);
        assert_eq!(e.origin(), "http://localhost:8123");
    }

    #[test]
    fn userinfo_is_percent_decoded() {
        let e = ok("clickhouse://al%20ice:p%40ss%3Aw%2Fd@db.example.com:8124/my%20db");
        assert_eq!(e.user, "al ice");
        assert_eq!(e.password, "p@ss:w/d");
        assert_eq!(e.host, "db.example.com");
        assert_eq!(e.port, 8124);
        assert_eq!(e.database.as_deref(), Some("my db"));
        // A password may hold ':' unencoded after the first one, and '@' before the last one.
        let e = ok("http://u:a:b@c@h");
        assert_eq!((e.user.as_str(), e.password.as_str()), ("u", "a:b@c"));
        let e = ok("http://u@h");
        assert_eq!((e.user.as_str(), e.password.as_str()), ("u", ""));
        let e = ok("http://:pw@h");
        assert_eq!((e.user.as_str(), e.password.as_str()), ("default", "pw"));
    }

    #[test]
    fn ipv6_hosts() {
        let e = ok("http://[::1]:9999");
        assert_eq!((e.host.as_str(), e.port), ("::1", 9999));
        assert_eq!(e.origin(), "http://[::1]:9999");
        let e = ok("https://[fe80::1]");
        assert_eq!((e.host.as_str(), e.port), ("fe80::1", 8443));
        let e = ok("http://[::ffff:192.0.2.1]:8123");
        assert_eq!(e.host, "::ffff:192.0.2.1");
    }

    #[test]
    fn database_path_forms() {
        assert_eq!(ok("http://h/").database, None);
        assert_eq!(ok("http://h/db").database.as_deref(), Some("db"));
        assert_eq!(ok("http://h/db/").database.as_deref(), Some("db"));
        assert_eq!(ok("http://h:1/db?x=1").database.as_deref(), Some("db"));
    }

    #[test]
    fn query_string_settings_and_options() {
        let e = ok("clickhouse://h/db?max_threads=4&async_insert=1&wait_for_async_insert=1&connect_timeout_ms=250&request_timeout_ms=1500&log_comment=a+b%26c");
        assert_eq!(
            e.settings,
            vec![
                ("max_threads".to_string(), "4".to_string()),
                ("async_insert".to_string(), "1".to_string()),
                ("wait_for_async_insert".to_string(), "1".to_string()),
                ("log_comment".to_string(), "a b&c".to_string()),
            ]
        );
        assert_eq!(e.connect_timeout, Duration::from_millis(250));
        assert_eq!(e.request_timeout, Duration::from_millis(1500));
        // empty pairs are ignored
        assert_eq!(ok("http://h?&&max_threads=2&").settings.len(), 1);
    }

    #[test]
    fn explicit_fields_override_url_parts() {
        let opts = ConnectionOptions {
            url: "clickhouse://u:secret@h/db1?max_threads=4&connect_timeout_ms=5".into(),
            user: Some("bob".into()),
            password: Some(String::new()),
            database: Some("db2".into()),
            settings: vec![
                ("max_threads".into(), "8".into()),
                ("readonly".into(), "1".into()),
            ],
            connect_timeout_ms: Some(7),
            request_timeout_ms: None,
        };
        let e = Endpoint::parse(&opts).unwrap();
        assert_eq!(e.user, "bob");
        assert_eq!(
            e.password, "",
            "an explicit empty password overrides the URL's"
        );
        assert_eq!(e.database.as_deref(), Some("db2"));
        assert_eq!(
            e.settings,
            vec![
                ("max_threads".to_string(), "8".to_string()),
                ("readonly".to_string(), "1".to_string())
            ]
        );
        assert_eq!(e.connect_timeout, Duration::from_millis(7));
        // Without explicit fields the URL's parts stay.
        let e = Endpoint::parse(&ConnectionOptions::from_url(opts.url.clone())).unwrap();
        assert_eq!((e.user.as_str(), e.password.as_str()), ("u", "secret"));
    }

    #[test]
    fn malformed_connection_strings() {
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("localhost:8123", "no scheme"),
            ("ftp://h", "unknown scheme 'ftp'"),
            ("tcp://h:9000", "unknown scheme 'tcp'"),
            ("clickhouse://", "no host"),
            ("clickhouse://:8123", "no host"),
            ("clickhouse://u:p@", "no host"),
            ("clickhouse://h:", "invalid port ''"),
            ("clickhouse://h:0", "invalid port '0'"),
            ("clickhouse://h:65536", "invalid port '65536'"),
            ("clickhouse://h:-1", "invalid port '-1'"),
            ("clickhouse://h:+80", "invalid port '+80'"),
            ("clickhouse://h:80x", "invalid port '80x'"),
            ("clickhouse://h:1:2", "invalid port '1:2'"),
            ("clickhouse://[::1", "closing ']'"),
            ("clickhouse://[zz]:1", "invalid IPv6"),
            ("clickhouse://[:::::]:1", "invalid IPv6"),
            ("clickhouse://[1.2.3.4]:1", "invalid IPv6"),
            ("clickhouse://[]:1", "invalid IPv6"),
            ("clickhouse://[::1]x", "after the IPv6"),
            ("clickhouse://ho st", "spaces"),
            ("clickhouse://h\n", "control"),
            ("clickhouse://h$x", "invalid host"),
            ("clickhouse://-h", "invalid host"),
            (
                "clickhouse://u:p%zz@h",
                "password in the connection string has invalid percent-encoding",
            ),
            (
                "clickhouse://u%4@h",
                "user name in the connection string has invalid percent-encoding",
            ),
            (
                "clickhouse://u:%ff@h",
                "password in the connection string is not valid UTF-8",
            ),
            ("clickhouse://h/a/b", "one segment"),
            (
                "clickhouse://h/%zz",
                "database in the connection string has invalid percent-encoding",
            ),
            ("clickhouse://h#frag", "fragment"),
            ("clickhouse://h?max_threads", "has no value"),
            ("clickhouse://h?secure=true", "the scheme decides TLS"),
            ("clickhouse://h?bad-name=1", "unknown option 'bad-name'"),
            ("clickhouse://h?a=1&a=2", "given twice"),
            (
                "clickhouse://h?x=%zz",
                "value of option 'x' has invalid percent-encoding",
            ),
            ("clickhouse://h?query=SELECT", "set by the client"),
            ("clickhouse://h?param_x=1", "set by the client"),
            ("clickhouse://h?database=x", "set by the client"),
            ("clickhouse://h?connect_timeout_ms=abc", "whole number"),
            ("clickhouse://h?connect_timeout_ms=0", "greater than 0"),
            ("clickhouse://h?request_timeout_ms=-5", "whole number"),
            ("clickhouse://h?connect_timeout=5", "use connect_timeout_ms"),
        ];
        assert!(cases.len() >= 25);
        for (url, want) in cases {
            let msg = err(url);
            assert!(msg.contains(want), "{url:?}: got {msg:?}, want {want:?}");
        }
    }

    #[test]
    fn invalid_explicit_fields() {
        let base = ConnectionOptions::from_url("http://h");
        let cases = [
            (
                ConnectionOptions {
                    user: Some(String::new()),
                    ..base.clone()
                },
                "user must not be empty",
            ),
            (
                ConnectionOptions {
                    database: Some(String::new()),
                    ..base.clone()
                },
                "database must not be empty",
            ),
            (
                ConnectionOptions {
                    database: Some("a\nb".into()),
                    ..base.clone()
                },
                "control characters",
            ),
            (
                ConnectionOptions {
                    settings: vec![("".into(), "1".into())],
                    ..base.clone()
                },
                "unknown option",
            ),
            (
                ConnectionOptions {
                    settings: vec![("query_id".into(), "1".into())],
                    ..base.clone()
                },
                "set by the client",
            ),
            (
                ConnectionOptions {
                    request_timeout_ms: Some(0),
                    ..base.clone()
                },
                "request-timeout-ms must be greater than 0",
            ),
        ];
        for (opts, want) in cases {
            let e = Endpoint::parse(&opts).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidInput);
            assert!(e.message.contains(want), "{:?} vs {want}", e.message);
        }
    }

    #[test]
    fn errors_never_show_the_password() {
        let urls = [
            "clickhouse://u:S3cr3tPw@h:bad",
            "clickhouse://u:S3cr3tPw@h/a/b",
            "clickhouse://u:S3cr3tPw@h?max_threads",
            "clickhouse://u:S3cr3tPw@h?secure=1",
            "clickhouse://u:S3cr3tPw@h#f",
            "ftp://u:S3cr3tPw@h",
            "clickhouse://u:S3cr3tPw%zz@h",
            "clickhouse://u:S3cr3tPw@",
        ];
        for url in urls {
            let e = parse(url).expect_err(url);
            assert!(!e.message.contains("S3cr3tPw"), "{url}: {}", e.message);
        }
        let e = ok("clickhouse://u:S3cr3tPw@h");
        assert!(!format!("{e:?}").contains("S3cr3tPw"));
        let opts = ConnectionOptions::from_url("clickhouse://u:S3cr3tPw@h");
        assert!(!format!("{opts:?}").contains("S3cr3tPw"));
    }

    #[test]
    fn secrets_include_password_and_secret_settings() {
        let e = ok("clickhouse://u:pw@h?s3_secret_access_key=abc&max_threads=4&x_token=t");
        let secrets = e.secrets();
        assert!(secrets.contains(&"pw".to_string()));
        assert!(secrets.contains(&"abc".to_string()));
        assert!(secrets.contains(&"t".to_string()));
        assert!(!secrets.contains(&"4".to_string()));
        // HTTP Basic's form of `u:pw`.
        assert!(secrets.contains(&"dTpwdw==".to_string()));
    }
}
