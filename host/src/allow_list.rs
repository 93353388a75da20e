//! Which destinations the component may send HTTP requests to.
//!
//! Syntax (after Spin's `allowed_outbound_hosts`): `scheme://host:port`, where scheme is
//! `http`, `https` or `*`, host is a name, an IP address (IPv6 in brackets), `*` or
//! `*.suffix`, and port is a number, a range `a..b` (inclusive start, exclusive end, like
//! Spin), or `*`. The port may be left out when the scheme is `http` (80) or `https` (443).
//! The default allow-list is the one origin of the configured ClickHouse URL.

use std::fmt;

/// A parse error in an allow-list entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid allowed host '{entry}': {reason}")]
pub struct AllowListError {
    /// The entry as given.
    pub entry: String,
    /// What is wrong.
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum SchemePattern {
    Any,
    Exact(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum HostPattern {
    Any,
    Suffix(String),
    Exact(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum PortPattern {
    Any,
    Range(u16, u32),
}

/// One allowed destination pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowedHost {
    scheme: SchemePattern,
    host: HostPattern,
    port: PortPattern,
    text: String,
}

impl AllowedHost {
    /// Parses one entry.
    pub fn parse(entry: &str) -> Result<AllowedHost, AllowListError> {
        let fail = |reason: &str| AllowListError {
            entry: entry.to_string(),
            reason: reason.to_string(),
        };
        let Some((scheme, rest)) = entry.split_once("://") else {
            return Err(fail("expected scheme://host:port"));
        };
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "*" => SchemePattern::Any,
            s @ ("http" | "https") => SchemePattern::Exact(s.to_string()),
            _ => return Err(fail("scheme must be http, https or *")),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('/') || rest.contains('?') || rest.contains('@') {
            return Err(fail("only scheme, host and port may be given"));
        }
        let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
            let (host, after) = inner
                .split_once(']')
                .ok_or_else(|| fail("IPv6 host is missing its closing ']'"))?;
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| fail("unexpected text after the IPv6 host"))?,
                ),
            };
            (host.to_ascii_lowercase(), port)
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h.to_ascii_lowercase(), Some(p)),
                None => (rest.to_ascii_lowercase(), None),
            }
        };
        if host.is_empty() {
            return Err(fail("host is empty"));
        }
        let host = if host == "*" {
            HostPattern::Any
        } else if let Some(suffix) = host.strip_prefix("*.") {
            if suffix.is_empty() || suffix.contains('*') {
                return Err(fail("a wildcard host is '*' or '*.domain'"));
            }
            HostPattern::Suffix(format!(".{suffix}"))
        } else if host.contains('*') {
            return Err(fail("a wildcard host is '*' or '*.domain'"));
        } else {
            HostPattern::Exact(host)
        };
        let port = match port {
            Some("*") => PortPattern::Any,
            Some(p) => match p.split_once("..") {
                Some((start, end)) => {
                    let start: u16 = start.parse().map_err(|_| fail("bad port range"))?;
                    let end: u32 = end.parse().map_err(|_| fail("bad port range"))?;
                    if u32::from(start) >= end || end > 65536 {
                        return Err(fail("bad port range"));
                    }
                    PortPattern::Range(start, end)
                }
                None => {
                    let port: u16 = p
                        .parse()
                        .map_err(|_| fail("port must be a number, a range a..b, or *"))?;
                    PortPattern::Range(port, u32::from(port) + 1)
                }
            },
            None => match &scheme {
                SchemePattern::Exact(s) if s == "http" => PortPattern::Range(80, 81),
                SchemePattern::Exact(s) if s == "https" => PortPattern::Range(443, 444),
                _ => return Err(fail("a port is required with scheme '*'")),
            },
        };
        Ok(AllowedHost {
            scheme,
            host,
            port,
            text: entry.to_string(),
        })
    }

    fn allows(&self, scheme: &str, host: &str, port: u16) -> bool {
        let scheme_ok = match &self.scheme {
            SchemePattern::Any => true,
            SchemePattern::Exact(s) => s.eq_ignore_ascii_case(scheme),
        };
        let host = host.to_ascii_lowercase();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let host_ok = match &self.host {
            HostPattern::Any => true,
            HostPattern::Suffix(suffix) => host.ends_with(suffix.as_str()),
            HostPattern::Exact(h) => h == host,
        };
        let port_ok = match self.port {
            PortPattern::Any => true,
            PortPattern::Range(start, end) => port >= start && u32::from(port) < end,
        };
        scheme_ok && host_ok && port_ok
    }
}

/// The set of destinations the component may reach. Empty denies everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<AllowedHost>,
}

impl AllowList {
    /// Parses entries; each may itself be a comma-separated list.
    pub fn parse<I, S>(entries: I) -> Result<AllowList, AllowListError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut list = AllowList::default();
        for entry in entries {
            for part in entry
                .as_ref()
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
            {
                list.entries.push(AllowedHost::parse(part)?);
            }
        }
        Ok(list)
    }

    /// An allow-list of exactly one origin (`http(s)://host:port`).
    pub fn origin(origin: &str) -> Result<AllowList, AllowListError> {
        AllowList::parse([origin])
    }

    /// Adds the entries of another list.
    pub fn extend(&mut self, other: AllowList) {
        self.entries.extend(other.entries);
    }

    /// Whether a request to `scheme://host:port` is allowed.
    pub fn allows(&self, scheme: &str, host: &str, port: u16) -> bool {
        self.entries.iter().any(|e| e.allows(scheme, host, port))
    }

    /// Whether the list allows nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl fmt::Display for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let texts: Vec<&str> = self.entries.iter().map(|e| e.text.as_str()).collect();
        if texts.is_empty() {
            f.write_str("(nothing)")
        } else {
            f.write_str(&texts.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::parse(entries).unwrap()
    }

    #[test]
    fn exact_origin() {
        let l = list(&["http://127.0.0.1:8123"]);
        assert!(l.allows("http", "127.0.0.1", 8123));
        assert!(!l.allows("https", "127.0.0.1", 8123));
        assert!(!l.allows("http", "127.0.0.1", 8124));
        assert!(!l.allows("http", "127.0.0.2", 8123));
        assert!(!l.allows("http", "evil.example", 8123));
    }

    #[test]
    fn default_ports_per_scheme() {
        let l = list(&["https://ch.example.com", "http://plain.example"]);
        assert!(l.allows("https", "ch.example.com", 443));
        assert!(!l.allows("https", "ch.example.com", 8443));
        assert!(l.allows("http", "plain.example", 80));
    }

    #[test]
    fn wildcards_and_ranges() {
        let l = list(&[
            "https://*.clickhouse.cloud:8443",
            "*://localhost:8000..8200",
        ]);
        assert!(l.allows("https", "abc.eu.clickhouse.cloud", 8443));
        assert!(
            !l.allows("https", "clickhouse.cloud", 8443),
            "suffix needs a dot"
        );
        assert!(!l.allows("https", "evilclickhouse.cloud", 8443));
        assert!(l.allows("http", "localhost", 8000));
        assert!(l.allows("https", "localhost", 8199));
        assert!(
            !l.allows("http", "localhost", 8200),
            "range end is exclusive"
        );
        let any = list(&["*://*:*"]);
        assert!(any.allows("http", "anything", 1));
    }

    #[test]
    fn case_and_ipv6() {
        let l = list(&["HTTP://LocalHost:1", "http://[::1]:2"]);
        assert!(l.allows("http", "localhost", 1));
        assert!(l.allows("http", "::1", 2));
        assert!(l.allows("http", "[::1]", 2));
    }

    #[test]
    fn comma_separated_and_empty() {
        let l = list(&["http://a:1, http://b:2"]);
        assert!(l.allows("http", "a", 1) && l.allows("http", "b", 2));
        let empty = AllowList::default();
        assert!(empty.is_empty());
        assert!(!empty.allows("http", "a", 1));
        assert_eq!(empty.to_string(), "(nothing)");
    }

    #[test]
    fn malformed_entries() {
        for (entry, want) in [
            ("localhost:8123", "expected scheme://host:port"),
            ("ftp://h:1", "scheme must be"),
            ("http://:1", "host is empty"),
            ("http://h:x", "port must be"),
            ("http://h:5..5", "bad port range"),
            ("http://h:1..70000", "bad port range"),
            ("http://a*b:1", "wildcard"),
            ("*://h", "port is required"),
            ("http://h:1/path", "only scheme, host and port"),
            ("http://u@h:1", "only scheme, host and port"),
            ("http://[::1:1", "closing"),
        ] {
            let e = AllowList::parse([entry]).unwrap_err();
            assert!(e.to_string().contains(want), "{entry}: {e}");
        }
    }
}
