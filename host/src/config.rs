//! The reference host's own command-line options (each also read from the environment
//! variable shown): which hosts the component may reach, where the component comes from, the
//! cache. The options every command shares are the component's
//! ([`clickhouse_component::cli::GlobalArgs`]).

use std::path::PathBuf;

use clap::Args;
use clickhouse_component::client::{ConnectionOptions, Error};

use crate::allow_list::AllowList;
use crate::component::{CachePolicy, ComponentSource};
use crate::runtime::default_allow_list;

/// Options only the reference host has.
#[derive(Args, Clone, Debug, Default)]
pub struct HostArgs {
    /// Extra destination the component may reach, scheme://host:port with * wildcards
    /// (repeatable or comma-separated). Default: only the ClickHouse URL's origin.
    #[arg(
        long = "allow-host",
        env = "CLICKHOUSE_ALLOW_HOSTS",
        value_delimiter = ',',
        global = true
    )]
    pub allow_hosts: Vec<String>,

    /// Run this component file instead of the one embedded in this binary.
    #[arg(long, env = "CLICKHOUSE_COMPONENT", global = true)]
    pub component: Option<PathBuf>,

    /// Directory for the precompiled component ("off" disables the cache).
    #[arg(long, env = "CLICKHOUSE_COMPONENT_CACHE_DIR", global = true)]
    pub cache_dir: Option<String>,
}

/// Host-only flags that take a value (they are removed before the component sees the
/// arguments).
pub const HOST_FLAGS_WITH_VALUE: &[&str] = &["--allow-host", "--component", "--cache-dir"];

impl HostArgs {
    /// The allow-list: the connection's origin plus every `--allow-host`.
    pub fn allow_list(&self, connection: &ConnectionOptions) -> Result<AllowList, Error> {
        let mut list = default_allow_list(connection)?;
        let extra =
            AllowList::parse(&self.allow_hosts).map_err(|e| Error::invalid(e.to_string()))?;
        list.extend(extra);
        Ok(list)
    }

    /// Where the component comes from.
    pub fn component_source(&self) -> ComponentSource {
        match &self.component {
            Some(path) => ComponentSource::File(path.clone()),
            None => ComponentSource::Embedded,
        }
    }

    /// The cache policy.
    pub fn cache_policy(&self) -> CachePolicy {
        match self.cache_dir.as_deref() {
            None | Some("") => CachePolicy::Default,
            Some("off") => CachePolicy::Disabled,
            Some(dir) => CachePolicy::Dir(dir.into()),
        }
    }
}

/// The arguments without the host-only flags (`--flag value` and `--flag=value` forms), up to
/// a `--` (whatever follows it belongs to a command run under a lock).
pub fn strip_host_flags(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == "--" {
            out.push(arg.clone());
            out.extend(iter.cloned());
            break;
        }
        if HOST_FLAGS_WITH_VALUE.contains(&arg.as_str()) {
            iter.next();
            continue;
        }
        if HOST_FLAGS_WITH_VALUE
            .iter()
            .any(|f| arg.starts_with(&format!("{f}=")))
        {
            continue;
        }
        out.push(arg.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_adds_hosts_to_the_connection_origin() {
        let args = HostArgs {
            allow_hosts: vec!["https://*.example.com:443".into()],
            ..Default::default()
        };
        let allow = args
            .allow_list(&ConnectionOptions::from_url("http://127.0.0.1:8123"))
            .unwrap();
        assert!(allow.allows("http", "127.0.0.1", 8123));
        assert!(allow.allows("https", "x.example.com", 443));
        assert!(!allow.allows("http", "127.0.0.1", 8124));
    }

    #[test]
    fn cache_policy_from_option() {
        let mut args = HostArgs::default();
        assert!(matches!(args.cache_policy(), CachePolicy::Default));
        args.cache_dir = Some("off".into());
        assert!(matches!(args.cache_policy(), CachePolicy::Disabled));
        args.cache_dir = Some("/tmp/x".into());
        assert!(matches!(args.cache_policy(), CachePolicy::Dir(_)));
    }

    #[test]
    fn host_flags_are_stripped_in_both_forms() {
        let args: Vec<String> = [
            "prog",
            "--allow-host",
            "http://a:1",
            "--json",
            "--component=x.wasm",
            "state",
            "--cache-dir",
            "off",
            "list",
            "--",
            "cmd",
            "--allow-host",
            "y",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            strip_host_flags(&args),
            [
                "prog",
                "--json",
                "state",
                "list",
                "--",
                "cmd",
                "--allow-host",
                "y"
            ]
        );
    }
}
