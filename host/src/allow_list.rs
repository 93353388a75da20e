//! Which destinations the component may send HTTP requests to.
//!
//! Syntax (after Spin's `allowed_outbound_hosts`): `scheme://host:port`, where
//!
//! * scheme is `http`, `https` or `*`;
//! * host is a name, `*`, `*.suffix`, an IP address (IPv6 in brackets: `[::1]`; an IPv6
//!   address without brackets, such as `http://fe80::1:8123`, is rejected rather than misread),
//!   or a network in CIDR form: `10.0.0.0/8`, `[fd00::]/8` (the address must have no bits set
//!   past the prefix length);
//! * port is a number, a range `a..b` (inclusive start, exclusive end, like Spin), or `*`. The
//!   port may be left out when the scheme is `http` (80) or `https` (443).
//!
//! Examples: `https://ch.example.com:8443`, `https://*.clickhouse.cloud:8443`,
//! `http://10.0.0.0/8:8123`, `http://[fd00::]/8:*`, `*://localhost:8000..8200`.
//!
//! A request is checked twice:
//!
//! 1. By its URL ([`AllowList::allows`]): a host name must match a name entry (`name`, `*`,
//!    `*.suffix`); an IP-address host must lie in an IP/CIDR entry, or match `*`.
//! 2. Each address the host resolves to, before any connection is made
//!    ([`AllowList::check_address`]): an address is allowed when an IP/CIDR entry contains it,
//!    or when the host matched a name entry (including `*`). Link-local addresses
//!    (`169.254.0.0/16`, `fe80::/10`) and cloud metadata addresses (`169.254.169.254`,
//!    `fd00:ec2::254`, `100.100.100.200`) are refused even then, unless an IP/CIDR entry lists
//!    them explicitly: an entry within the link-local range for a link-local address, the very
//!    address for a metadata one (`http://169.254.169.254:80`; `*` or `0.0.0.0/0` do not count).
//!    IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) are checked as the IPv4 address.
//!
//! The default allow-list is the one origin of the configured ClickHouse URL.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// A parse error in an allow-list entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid allowed host '{entry}': {reason}")]
pub struct AllowListError {
    /// The entry as given.
    pub entry: String,
    /// What is wrong.
    pub reason: String,
}

/// Why a resolved address was refused ([`AllowList::check_address`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressDenied {
    /// No entry allows it: the host matched no name entry and no IP/CIDR entry contains the
    /// address.
    NotListed,
    /// It is a link-local or cloud metadata address (named here) that no entry lists
    /// explicitly.
    Restricted(&'static str),
}

impl fmt::Display for AddressDenied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddressDenied::NotListed => f.write_str("no allow-list entry contains this address"),
            AddressDenied::Restricted(what) => write!(
                f,
                "{what} address: allowed only when an entry lists it explicitly (an IP or CIDR \
                 entry within that range)"
            ),
        }
    }
}

/// A network from an address and a prefix length, refusing host bits past the prefix. An
/// IPv4-mapped IPv6 network (`::ffff:0:0/96` or longer) becomes the IPv4 network.
fn network(addr: IpAddr, len: u8) -> Result<IpNet, String> {
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let net =
        IpNet::new(addr, len).map_err(|_| format!("prefix length /{len} is longer than {max}"))?;
    if net.trunc() != net {
        return Err(format!(
            "{addr}/{len} has bits set past the prefix length (did you mean {}/{len}?)",
            net.network()
        ));
    }
    if let IpAddr::V6(v6) = addr {
        if let (Some(v4), true) = (v6.to_ipv4_mapped(), len >= 96) {
            let v4 = Ipv4Net::new(v4, len - 96).map_err(|e| e.to_string())?;
            return Ok(IpNet::V4(v4));
        }
    }
    Ok(net)
}

const fn v4(a: [u8; 4], len: u8) -> IpNet {
    IpNet::V4(Ipv4Net::new_assert(
        Ipv4Addr::new(a[0], a[1], a[2], a[3]),
        len,
    ))
}

const fn v6(segments: [u16; 8], len: u8) -> IpNet {
    let [a, b, c, d, e, f, g, h] = segments;
    IpNet::V6(Ipv6Net::new_assert(
        Ipv6Addr::new(a, b, c, d, e, f, g, h),
        len,
    ))
}

/// Addresses refused unless an entry lists them explicitly, most specific first.
const RESTRICTED: [(IpNet, &str); 5] = [
    // AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle...
    (v4([169, 254, 169, 254], 32), "cloud metadata"),
    // AWS's IPv6 instance metadata endpoint.
    (
        v6([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254], 128),
        "cloud metadata",
    ),
    // Alibaba Cloud.
    (v4([100, 100, 100, 200], 32), "cloud metadata"),
    (v4([169, 254, 0, 0], 16), "link-local"),
    (v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), "link-local"),
];

/// The restricted ranges containing `ip` (canonical form).
fn restricted(ip: IpAddr) -> impl Iterator<Item = &'static (IpNet, &'static str)> {
    RESTRICTED.iter().filter(move |(net, _)| net.contains(&ip))
}

/// An IP address in a URL host (IPv6 with or without its brackets), in canonical form.
fn host_ip(host: &str) -> Option<IpAddr> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
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
    Net(IpNet),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum PortPattern {
    Any,
    Range(u16, u32),
}

/// One allowed destination pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AllowedHost {
    scheme: SchemePattern,
    host: HostPattern,
    port: PortPattern,
    text: String,
}

/// Splits `text` into its leading ASCII digits and the rest.
fn split_digits(text: &str) -> (&str, &str) {
    let end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    text.split_at(end)
}

/// What an entry may hold past its host.
const ONLY: &str = "only scheme, host and port may be given";

/// The scheme of an entry: `http`, `https` or `*`.
fn parse_scheme(scheme: &str) -> Result<SchemePattern, String> {
    match scheme.to_ascii_lowercase().as_str() {
        "*" => Ok(SchemePattern::Any),
        s @ ("http" | "https") => Ok(SchemePattern::Exact(s.to_string())),
        _ => Err("scheme must be http, https or *".into()),
    }
}

/// A prefix length (the digits after a `/`).
fn prefix_len(len: &str) -> Result<u8, String> {
    len.parse::<u8>()
        .map_err(|_| format!("bad prefix length /{len}"))
}

/// The host of an entry (what follows `scheme://`, a trailing `/` removed) and the port text
/// after it, if any.
fn parse_host(rest: &str) -> Result<(HostPattern, Option<&str>), String> {
    if let Some(inner) = rest.strip_prefix('[') {
        let (host, after) = inner
            .split_once(']')
            .ok_or("IPv6 host is missing its closing ']'")?;
        let (prefix, after) = match after.strip_prefix('/') {
            Some(after) => match split_digits(after) {
                ("", _) => return Err(ONLY.into()),
                (len, after) => (Some(prefix_len(len)?), after),
            },
            None => (None, after),
        };
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or("unexpected text after the IPv6 host")?,
            ),
        };
        let ip: Ipv6Addr = host.parse().map_err(|_| {
            format!("'{host}' in brackets is not an IPv6 address (a network is written [addr]/len)")
        })?;
        let net = network(IpAddr::V6(ip), prefix.unwrap_or(128))?;
        return Ok((HostPattern::Net(net), port));
    }
    let (before_port, port) = match rest.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (rest, None),
    };
    if port.is_some_and(|p| p.contains('/')) {
        return Err(ONLY.into());
    }
    let (host, prefix) = match before_port.split_once('/') {
        Some((h, len)) if !len.is_empty() && split_digits(len).1.is_empty() => {
            (h, Some(prefix_len(len)?))
        }
        Some(_) => return Err(ONLY.into()),
        None => (before_port, None),
    };
    if host.contains(':') {
        return Err(
            "an IPv6 address must be written in brackets, e.g. http://[fe80::1]:8123 \
                    or http://[fd00::]/8:8123"
                .into(),
        );
    }
    if host.is_empty() {
        return Err("host is empty".into());
    }
    let host = host.to_ascii_lowercase();
    let wildcard = "a wildcard host is '*' or '*.domain'";
    let pattern = if let Some(len) = prefix {
        let ip: Ipv4Addr = host.parse().map_err(|_| {
            "a network is an IPv4 address and a prefix length (10.0.0.0/8) or [IPv6]/len"
                .to_string()
        })?;
        HostPattern::Net(network(IpAddr::V4(ip), len)?)
    } else if let Ok(ip) = host.parse::<Ipv4Addr>() {
        HostPattern::Net(IpNet::V4(Ipv4Net::from(ip)))
    } else if host == "*" {
        HostPattern::Any
    } else if let Some(suffix) = host.strip_prefix("*.") {
        if suffix.is_empty() || suffix.contains('*') {
            return Err(wildcard.into());
        }
        HostPattern::Suffix(format!(".{suffix}"))
    } else if host.contains('*') {
        return Err(wildcard.into());
    } else {
        HostPattern::Exact(host)
    };
    Ok((pattern, port))
}

/// The port of an entry (`None`: not given, the scheme's default).
fn parse_port(port: Option<&str>, scheme: &SchemePattern) -> Result<PortPattern, String> {
    match port {
        Some("*") => Ok(PortPattern::Any),
        Some(p) => match p.split_once("..") {
            Some((start, end)) => {
                let bad = || "bad port range".to_string();
                let start: u16 = start.parse().map_err(|_| bad())?;
                let end: u32 = end.parse().map_err(|_| bad())?;
                if u32::from(start) >= end || end > 65536 {
                    return Err(bad());
                }
                Ok(PortPattern::Range(start, end))
            }
            None => {
                let port: u16 = p
                    .parse()
                    .map_err(|_| "port must be a number, a range a..b, or *".to_string())?;
                Ok(PortPattern::Range(port, u32::from(port) + 1))
            }
        },
        None => match scheme {
            SchemePattern::Exact(s) if s == "http" => Ok(PortPattern::Range(80, 81)),
            SchemePattern::Exact(s) if s == "https" => Ok(PortPattern::Range(443, 444)),
            _ => Err("a port is required with scheme '*'".into()),
        },
    }
}

impl AllowedHost {
    /// Parses one entry: `scheme://host:port`.
    pub fn parse(entry: &str) -> Result<AllowedHost, AllowListError> {
        let fail = |reason: String| AllowListError {
            entry: entry.to_string(),
            reason,
        };
        let Some((scheme, rest)) = entry.split_once("://") else {
            return Err(fail("expected scheme://host:port".into()));
        };
        let scheme = parse_scheme(scheme).map_err(fail)?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('?') || rest.contains('@') || rest.contains('#') {
            return Err(fail(ONLY.into()));
        }
        let (host, port) = parse_host(rest).map_err(fail)?;
        let port = parse_port(port, &scheme).map_err(fail)?;
        Ok(AllowedHost {
            scheme,
            host,
            port,
            text: entry.to_string(),
        })
    }

    fn scheme_and_port_match(&self, scheme: &str, port: u16) -> bool {
        let scheme_ok = match &self.scheme {
            SchemePattern::Any => true,
            SchemePattern::Exact(s) => s.eq_ignore_ascii_case(scheme),
        };
        let port_ok = match self.port {
            PortPattern::Any => true,
            PortPattern::Range(start, end) => port >= start && u32::from(port) < end,
        };
        scheme_ok && port_ok
    }

    /// Whether the host (a name, or an IP address in canonical form) matches a name pattern
    /// (`*` matches both; the others only names).
    fn name_matches(&self, host: &str, ip: Option<IpAddr>) -> bool {
        match &self.host {
            HostPattern::Any => true,
            HostPattern::Suffix(suffix) => ip.is_none() && host.ends_with(suffix.as_str()),
            HostPattern::Exact(h) => ip.is_none() && h == host,
            HostPattern::Net(_) => false,
        }
    }

    fn allows(&self, scheme: &str, host: &str, port: u16) -> bool {
        if !self.scheme_and_port_match(scheme, port) {
            return false;
        }
        let ip = host_ip(host);
        let host = host.to_ascii_lowercase();
        match (&self.host, ip) {
            (HostPattern::Net(net), Some(ip)) => net.contains(&ip),
            _ => self.name_matches(&host, ip),
        }
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

    /// Whether a request to `scheme://host:port` is allowed by its URL (step 1 in the module
    /// doc): `host` is a name or an IP address (IPv6 with or without brackets).
    pub fn allows(&self, scheme: &str, host: &str, port: u16) -> bool {
        self.entries.iter().any(|e| e.allows(scheme, host, port))
    }

    /// Whether a request to `scheme://host:port` may connect to `addr`, one of the addresses
    /// `host` resolved to (step 2 in the module doc).
    pub fn check_address(
        &self,
        scheme: &str,
        host: &str,
        port: u16,
        addr: IpAddr,
    ) -> Result<(), AddressDenied> {
        let addr = addr.to_canonical();
        let host_ip = host_ip(host);
        let host = host.to_ascii_lowercase();
        let entries = || {
            self.entries
                .iter()
                .filter(|e| e.scheme_and_port_match(scheme, port))
        };
        // Listed explicitly: an IP/CIDR entry containing it, within every restricted range
        // that contains it.
        let listed_explicitly = entries().any(|e| match &e.host {
            HostPattern::Net(net) => {
                net.contains(&addr) && restricted(addr).all(|(range, _)| range.contains(net))
            }
            _ => false,
        });
        if listed_explicitly {
            return Ok(());
        }
        if let Some((_, what)) = restricted(addr).next() {
            return Err(AddressDenied::Restricted(what));
        }
        let allowed = entries().any(|e| match &e.host {
            HostPattern::Net(net) => net.contains(&addr),
            _ => e.name_matches(&host, host_ip),
        });
        if allowed {
            Ok(())
        } else {
            Err(AddressDenied::NotListed)
        }
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

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn ip_and_cidr_entries() {
        let l = list(&[
            "http://10.0.0.0/8:8123",
            "http://[fd00::]/8:*",
            "https://192.168.1.7",
        ]);
        // By URL: IP-address hosts in the networks.
        assert!(l.allows("http", "10.1.2.3", 8123));
        assert!(!l.allows("http", "11.1.2.3", 8123));
        assert!(!l.allows("http", "10.1.2.3", 8124));
        assert!(!l.allows("https", "10.1.2.3", 8123));
        assert!(l.allows("http", "[fd12:3456::1]", 9000));
        assert!(l.allows("http", "fd12:3456::1", 1));
        assert!(!l.allows("http", "[fe80::1]", 9000));
        assert!(l.allows("https", "192.168.1.7", 443));
        assert!(!l.allows("https", "192.168.1.8", 443));
        // A name is not an address: network entries do not match names by URL.
        assert!(!l.allows("http", "ten.example", 8123));
        // By resolved address: the network entries allow addresses of any host.
        assert_eq!(
            l.check_address("http", "db.internal", 8123, ip("10.9.9.9")),
            Ok(())
        );
        assert_eq!(
            l.check_address("http", "db.internal", 8123, ip("11.9.9.9")),
            Err(AddressDenied::NotListed)
        );
        assert_eq!(
            l.check_address("http", "[fd00::5]", 1, ip("fd00::5")),
            Ok(())
        );
        // An IPv4-mapped IPv6 address is the IPv4 address.
        assert_eq!(
            l.check_address("http", "x", 8123, ip("::ffff:10.0.0.1")),
            Ok(())
        );
        assert!(l.allows("http", "[::ffff:10.0.0.1]", 8123));
        let mapped = list(&["http://[::ffff:10.0.0.0]/104:1"]);
        assert!(mapped.allows("http", "10.3.4.5", 1));
        // IPv6 addresses compare as addresses, not text.
        let v6 = list(&["http://[::1]:2"]);
        assert!(v6.allows("http", "[0:0::1]", 2));
    }

    #[test]
    fn name_entries_allow_the_names_addresses() {
        let l = list(&["http://localhost:8123", "https://*.example.com:8443"]);
        assert_eq!(
            l.check_address("http", "localhost", 8123, ip("127.0.0.1")),
            Ok(())
        );
        assert_eq!(
            l.check_address("http", "localhost", 8123, ip("::1")),
            Ok(())
        );
        assert_eq!(
            l.check_address("https", "a.example.com", 8443, ip("203.0.113.5")),
            Ok(())
        );
        // Another name, or another port: not allowed, whatever the address.
        assert_eq!(
            l.check_address("http", "other", 8123, ip("127.0.0.1")),
            Err(AddressDenied::NotListed)
        );
        assert_eq!(
            l.check_address("http", "localhost", 9000, ip("127.0.0.1")),
            Err(AddressDenied::NotListed)
        );
    }

    #[test]
    fn metadata_and_link_local_addresses_are_refused_unless_listed_explicitly() {
        let names = list(&["http://ch.example:80", "*://*:*"]);
        for (addr, what) in [
            ("169.254.169.254", "cloud metadata"),
            ("fd00:ec2::254", "cloud metadata"),
            ("100.100.100.200", "cloud metadata"),
            ("169.254.10.20", "link-local"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("::ffff:169.254.169.254", "cloud metadata"),
        ] {
            assert_eq!(
                names.check_address("http", "ch.example", 80, ip(addr)),
                Err(AddressDenied::Restricted(what)),
                "{addr}"
            );
            // `*` allows any host by URL, but not these addresses once resolved, nor as
            // IP-address hosts.
            let host = if addr.contains(':') {
                format!("[{addr}]")
            } else {
                addr.to_string()
            };
            assert!(names.allows("http", &host, 80));
            assert!(names.check_address("http", &host, 80, ip(addr)).is_err());
        }
        // Neighbours of the restricted addresses are fine.
        for addr in [
            "169.253.255.255",
            "169.255.0.0",
            "fec0::1",
            "100.100.100.201",
        ] {
            assert_eq!(
                names.check_address("http", "ch.example", 80, ip(addr)),
                Ok(()),
                "{addr}"
            );
        }
        // Broad networks do not list them explicitly.
        let broad = list(&["http://0.0.0.0/0:80", "http://[::]/0:80"]);
        assert_eq!(broad.check_address("http", "x", 80, ip("10.1.1.1")), Ok(()));
        for addr in ["169.254.169.254", "169.254.1.1", "fe80::1", "fd00:ec2::254"] {
            assert!(
                broad.check_address("http", "x", 80, ip(addr)).is_err(),
                "{addr}"
            );
        }
        // The link-local range listed: link-local addresses are allowed, the metadata address
        // (which needs its own entry) is not.
        let link_local = list(&["http://169.254.0.0/16:80", "http://[fe80::]/10:80"]);
        assert_eq!(
            link_local.check_address("http", "x", 80, ip("169.254.3.4")),
            Ok(())
        );
        assert_eq!(
            link_local.check_address("http", "x", 80, ip("fe80::1234")),
            Ok(())
        );
        assert_eq!(
            link_local.check_address("http", "x", 80, ip("169.254.169.254")),
            Err(AddressDenied::Restricted("cloud metadata"))
        );
        // The metadata address listed, for its scheme and port only.
        let metadata = list(&["http://169.254.169.254:80", "http://[fd00:ec2::254]:80"]);
        assert!(metadata.allows("http", "169.254.169.254", 80));
        assert_eq!(
            metadata.check_address("http", "169.254.169.254", 80, ip("169.254.169.254")),
            Ok(())
        );
        assert_eq!(
            metadata.check_address("http", "metadata.internal", 80, ip("169.254.169.254")),
            Ok(())
        );
        assert_eq!(
            metadata.check_address("http", "x", 80, ip("fd00:ec2::254")),
            Ok(())
        );
        assert!(metadata
            .check_address("http", "x", 8080, ip("169.254.169.254"))
            .is_err());
        assert!(metadata
            .check_address("http", "x", 80, ip("169.254.169.253"))
            .is_err());
    }

    #[test]
    fn unbracketed_ipv6_and_bad_networks_are_rejected() {
        for (entry, want) in [
            ("http://fe80::1:8123", "must be written in brackets"),
            ("http://fe80::1", "must be written in brackets"),
            ("http://::1", "must be written in brackets"),
            ("http://2001:db8::/32:80", "must be written in brackets"),
            ("http://[fd00::/8]:1", "is not an IPv6 address"),
            ("http://[localhost]:1", "is not an IPv6 address"),
            ("http://10.0.0.1/8:1", "bits set past the prefix length"),
            ("http://10.0.0.0/33:1", "longer than 32"),
            ("http://[fd00::]/129:1", "longer than 128"),
            ("http://10.0.0.0/300:1", "bad prefix length"),
            ("http://example.com/8:1", "a network is an IPv4 address"),
            ("http://10.0.0.0/:1", "only scheme, host and port"),
            ("http://10.0.0.0/8x:1", "only scheme, host and port"),
            ("http://[fd00::]/x:1", "only scheme, host and port"),
        ] {
            let e = AllowList::parse([entry]).unwrap_err();
            assert!(e.to_string().contains(want), "{entry}: {e}");
        }
        // Without a port the scheme's default applies to networks too.
        let l = list(&["http://10.0.0.0/8", "https://[fd00::]/8"]);
        assert!(l.allows("http", "10.0.0.1", 80));
        assert!(l.allows("https", "[fd00::1]", 443));
    }

    #[test]
    fn an_entry_parses_as_scheme_host_and_port() {
        assert_eq!(
            parse_scheme("HTTPS"),
            Ok(SchemePattern::Exact("https".into()))
        );
        assert_eq!(parse_scheme("*"), Ok(SchemePattern::Any));
        let (host, port) = parse_host("[fd00::]/8:9000").unwrap();
        assert_eq!(host, HostPattern::Net("fd00::/8".parse().unwrap()));
        assert_eq!(port, Some("9000"));
        let (host, port) = parse_host("*.example.com").unwrap();
        assert_eq!(host, HostPattern::Suffix(".example.com".into()));
        assert_eq!(port, None);
        // An IPv4-mapped network is the IPv4 network.
        let (host, _) = parse_host("[::ffff:10.0.0.0]/104").unwrap();
        assert_eq!(host, HostPattern::Net("10.0.0.0/8".parse().unwrap()));
        let http = SchemePattern::Exact("http".into());
        assert_eq!(parse_port(None, &http), Ok(PortPattern::Range(80, 81)));
        assert_eq!(
            parse_port(Some("8000..8200"), &http),
            Ok(PortPattern::Range(8000, 8200))
        );
        assert_eq!(
            parse_port(Some("65535..65536"), &http),
            Ok(PortPattern::Range(65535, 65536))
        );
        assert!(parse_port(None, &SchemePattern::Any).is_err());
    }
}
