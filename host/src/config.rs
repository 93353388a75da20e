//! The reference host's own command-line options (each also read from the environment
//! variable shown): which hosts the component may reach, where the component comes from, the
//! cache. The options every command shares are the component's
//! ([`clickhouse_component::host_api::cli::GlobalArgs`]).

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::LazyLock;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Command};
use clickhouse_component::host_api::{ConnectionOptions, Error};

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

    /// `lock ID -- COMMAND`: let the command see the ClickHouse credentials of this
    /// environment. Without it the command gets the environment minus CLICKHOUSE_PASSWORD, and
    /// CLICKHOUSE_URL / MELTANO_STATE_BACKEND_URI without their password. Give it when the
    /// command itself connects with them, e.g. runs this CLI to write state through the held
    /// lock (CLICKHOUSE_LOCK_ID / CLICKHOUSE_LOCK_TOKEN).
    #[arg(long, global = true)]
    pub pass_credentials: bool,

    /// Most memory the component may use, in MiB (default 1024); past it the call fails.
    #[arg(long, env = "CLICKHOUSE_MAX_MEMORY_MIB", global = true)]
    pub max_memory_mib: Option<u64>,

    /// Longest a call into the component may take, in seconds (default: no limit; for the
    /// CLI the whole command is one call). Past it, requests are cut and the call fails.
    #[arg(long, env = "CLICKHOUSE_CALL_TIMEOUT_SECONDS", global = true)]
    pub call_timeout_seconds: Option<f64>,

    /// Most bytes read from one ClickHouse answer, in MiB (default 256); a longer answer fails
    /// the request.
    #[arg(long, env = "CLICKHOUSE_MAX_RESPONSE_MIB", global = true)]
    pub max_response_mib: Option<u64>,

    /// A PEM file of CA certificates trusted for HTTPS in addition to the system's (a
    /// self-hosted ClickHouse with its own CA).
    #[arg(long, env = "CLICKHOUSE_CA_FILE", global = true)]
    pub ca_file: Option<PathBuf>,
}

/// A host-only flag: removed (with its value, if it takes one) before the component sees the
/// arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostFlag {
    /// `--name` (or an alias).
    pub name: String,
    /// Whether it takes a value (`--name value` or `--name=value`).
    pub takes_value: bool,
}

/// The host-only flags, read from [`HostArgs`]' definitions (so a new option there is never
/// passed on to the component by mistake).
pub static HOST_FLAGS: LazyLock<Vec<HostFlag>> = LazyLock::new(|| {
    let command = HostArgs::augment_args(Command::new("host"));
    let mut flags = Vec::new();
    for arg in command.get_arguments() {
        assert!(
            arg.get_short().is_none() && !arg.is_positional(),
            "host options must be long options only (strip_host_flags handles no other): {}",
            arg.get_id()
        );
        for name in arg.get_long_and_visible_aliases().unwrap_or_default() {
            flags.push(HostFlag {
                name: format!("--{name}"),
                takes_value: arg.get_action().takes_values(),
            });
        }
    }
    flags
});

/// The host-only flags that take a value.
pub fn host_flags_with_value() -> Vec<&'static str> {
    HOST_FLAGS
        .iter()
        .filter(|f| f.takes_value)
        .map(|f| f.name.as_str())
        .collect()
}

impl HostArgs {
    /// How instances connect: the system's trust store plus `--ca-file`; `invalid-input` when
    /// the CA file cannot be read or holds no certificate.
    pub fn network(&self) -> Result<crate::Network, Error> {
        crate::Network::new(&crate::TlsOptions {
            ca_file: self.ca_file.clone(),
        })
        .map_err(|e| Error::invalid(e.to_string()))
    }

    /// The per-instance limits these options ask for; `invalid-input` for out-of-range values.
    pub fn limits(&self) -> Result<crate::Limits, Error> {
        let defaults = crate::Limits::default();
        let mib = |name: &str, v: Option<u64>, default: u64| -> Result<u64, Error> {
            match v.unwrap_or(default) {
                m if (1..=1 << 20).contains(&m) => Ok(m << 20),
                _ => Err(Error::invalid(format!(
                    "{name} must be from 1 to 1048576 (MiB)"
                ))),
            }
        };
        let call_timeout = match self.call_timeout_seconds {
            None => None,
            Some(s) if s.is_finite() && s > 0.0 && s <= 1e7 => {
                Some(std::time::Duration::from_secs_f64(s))
            }
            Some(_) => {
                return Err(Error::invalid(
                    "--call-timeout-seconds must be a number of seconds above 0",
                ))
            }
        };
        Ok(crate::Limits {
            max_memory_bytes: usize::try_from(mib(
                "--max-memory-mib",
                self.max_memory_mib,
                defaults.max_memory_bytes as u64 >> 20,
            )?)
            .unwrap_or(usize::MAX),
            call_timeout,
            max_response_bytes: mib(
                "--max-response-mib",
                self.max_response_mib,
                defaults.max_response_bytes >> 20,
            )?,
            ..defaults
        })
    }

    /// The allow-list: the connection's origin plus every `--allow-host`.
    pub fn allow_list(&self, connection: &ConnectionOptions) -> Result<AllowList, Error> {
        let mut list = default_allow_list(connection)?;
        list.extend(self.extra_allow_list()?);
        Ok(list)
    }

    /// The `--allow-host` entries alone.
    pub fn extra_allow_list(&self) -> Result<AllowList, Error> {
        AllowList::parse(&self.allow_hosts).map_err(|e| Error::invalid(e.to_string()))
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

/// The arguments without the host-only flags ([`HOST_FLAGS`]: `--flag`, `--flag value` and
/// `--flag=value` forms), up to a `--` (whatever follows it belongs to a command run under a
/// lock, or is a FILE).
pub fn strip_host_flags(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == "--" {
            out.push(arg.clone());
            out.extend(iter.cloned());
            break;
        }
        if let Some(flag) = HOST_FLAGS.iter().find(|f| f.name == *arg) {
            if flag.takes_value {
                iter.next();
            }
            continue;
        }
        if let Some((name, _)) = arg.split_once('=') {
            if HOST_FLAGS.iter().any(|f| f.name == name) {
                continue;
            }
        }
        out.push(arg.clone());
    }
    out
}

/// Where in `args` the subcommand reached through `path` (e.g. `["state", "edit"]`) is named:
/// the index of its name's argument. `None` when the walk meets a form it does not follow
/// (short options) or another subcommand.
pub fn subcommand_position(command: &Command, args: &[String], path: &[&str]) -> Option<usize> {
    let mut command = command.clone();
    command.build();
    let mut command = &command;
    let mut level = 0;
    let mut pending = false;
    for (position, arg) in args.iter().enumerate().skip(1) {
        if std::mem::take(&mut pending) {
            continue;
        }
        if arg == "--" {
            return None;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let option = command.get_arguments().find(|a| {
                a.get_all_aliases()
                    .unwrap_or_default()
                    .into_iter()
                    .chain(a.get_long())
                    .any(|n| n == long.split_once('=').map_or(long, |(n, _)| n))
            })?;
            pending = option.get_action().takes_values() && !long.contains('=');
            continue;
        }
        if arg.starts_with('-') && arg != "-" {
            return None;
        }
        let sub = command.find_subcommand(arg)?;
        if sub.get_name() != path[level] {
            return None;
        }
        level += 1;
        if level == path.len() {
            return Some(position);
        }
        command = sub;
    }
    None
}

/// Whether a ClickHouse password was given as a command-line argument (`--password`, or a
/// `--url` / `--meltano-state-backend-uri` with one), where other users of the machine can
/// read it (`ps`, /proc). The environment does not count.
pub fn password_on_command_line(matches: &ArgMatches) -> bool {
    let given = |m: &ArgMatches, id: &str| {
        m.value_source(id) == Some(ValueSource::CommandLine)
            && m.get_one::<String>(id).is_some_and(|v| match id {
                "password" => !v.is_empty(),
                _ => url_password(v).is_some_and(|r| !r.is_empty()),
            })
    };
    let mut level = Some(matches);
    while let Some(m) = level {
        if ["password", "url", "meltano_uri"]
            .iter()
            .any(|id| m.try_contains_id(id).unwrap_or(false) && given(m, id))
        {
            return true;
        }
        level = m.subcommand().map(|(_, sub)| sub);
    }
    false
}

/// The one-line warning for [`password_on_command_line`] (it never shows the password).
pub const PASSWORD_ON_COMMAND_LINE_WARNING: &str = "warning: a password given on the command line \
    (--password, or in --url) is visible to other users of this machine; set CLICKHOUSE_PASSWORD \
    (or put the URL in CLICKHOUSE_URL) instead";

/// Where the password of a connection string is (`scheme://user:PASSWORD@host...`), as the
/// component's parser finds it: after the first `:` of what precedes the last `@` of the
/// authority.
fn url_password(url: &str) -> Option<std::ops::Range<usize>> {
    let start = url.find("://")? + 3;
    let rest = &url[start..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let userinfo = &authority[..authority.rfind('@')?];
    let colon = userinfo.find(':')?;
    Some(start + colon + 1..start + userinfo.len())
}

/// A connection string without its password (`scheme://user@host...`), or `None` when it
/// has none.
pub fn url_without_password(url: &str) -> Option<String> {
    let password = url_password(url)?;
    Some(format!(
        "{}{}",
        &url[..password.start - 1],
        &url[password.end..]
    ))
}

/// Environment variables that hold ClickHouse connection strings (and so may hold a password).
pub const CONNECTION_URL_VARS: &[&str] = &["CLICKHOUSE_URL", "MELTANO_STATE_BACKEND_URI"];

/// What `lock ID -- COMMAND` changes in the command's environment unless `--pass-credentials`:
/// CLICKHOUSE_PASSWORD removed, the connection strings ([`CONNECTION_URL_VARS`]) without their
/// password (removed when they are not UTF-8, as they cannot be checked). `(name, None)`
/// removes, `(name, Some(value))` sets; `var` reads the environment.
pub fn withheld_credentials(
    var: impl Fn(&str) -> Option<OsString>,
) -> Vec<(&'static str, Option<String>)> {
    let mut changes = vec![("CLICKHOUSE_PASSWORD", None)];
    for &name in CONNECTION_URL_VARS {
        let Some(value) = var(name) else { continue };
        match value.to_str() {
            Some(url) => {
                if let Some(clean) = url_without_password(url) {
                    changes.push((name, Some(clean)));
                }
            }
            None => changes.push((name, None)),
        }
    }
    changes
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
    fn limits_from_options() {
        let args = HostArgs {
            max_memory_mib: Some(64),
            call_timeout_seconds: Some(2.5),
            max_response_mib: Some(8),
            ..Default::default()
        };
        let limits = args.limits().unwrap();
        assert_eq!(limits.max_memory_bytes, 64 << 20);
        assert_eq!(
            limits.call_timeout,
            Some(std::time::Duration::from_millis(2500))
        );
        assert_eq!(limits.max_response_bytes, 8 << 20);
        assert_eq!(
            HostArgs::default().limits().unwrap(),
            crate::Limits::default()
        );
        for bad in [
            HostArgs {
                max_memory_mib: Some(0),
                ..Default::default()
            },
            HostArgs {
                call_timeout_seconds: Some(-1.0),
                ..Default::default()
            },
            HostArgs {
                call_timeout_seconds: Some(f64::NAN),
                ..Default::default()
            },
        ] {
            assert_eq!(
                bad.limits().unwrap_err().kind,
                clickhouse_component::host_api::ErrorKind::InvalidInput
            );
        }
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
    fn host_flags_come_from_the_host_options() {
        assert_eq!(
            host_flags_with_value(),
            [
                "--allow-host",
                "--component",
                "--cache-dir",
                "--max-memory-mib",
                "--call-timeout-seconds",
                "--max-response-mib",
                "--ca-file"
            ]
        );
        assert!(HOST_FLAGS.contains(&HostFlag {
            name: "--pass-credentials".into(),
            takes_value: false
        }));
        assert_eq!(HOST_FLAGS.len(), 8);
    }

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_without_a_value_are_stripped_alone() {
        assert_eq!(
            strip_host_flags(&strings(&[
                "prog",
                "--pass-credentials",
                "lock",
                "id",
                "--hold",
                "1s"
            ])),
            ["prog", "lock", "id", "--hold", "1s"]
        );
    }

    /// The reference host's command line, as `HostCli` declares it.
    fn host_cli() -> Command {
        use clap::CommandFactory;
        HostArgs::augment_args(clickhouse_component::host_api::cli::Cli::command())
    }

    /// The position of the FILE of `sink` (or of `state import`) in `args`.

    #[test]
    fn the_subcommand_is_found_past_options_named_like_it() {
        let at =
            |args: &[&str]| subcommand_position(&host_cli(), &strings(args), &["state", "edit"]);
        assert_eq!(at(&["p", "state", "edit", "x"]), Some(2));
        assert_eq!(
            at(&[
                "p",
                "--database",
                "edit",
                "state",
                "--state-table",
                "edit",
                "edit",
                "edit"
            ]),
            Some(6)
        );
        assert_eq!(at(&["p", "state", "get", "edit"]), None);
        assert_eq!(
            at(&[
                "p",
                "state",
                "--state-database",
                "x",
                "--json",
                "edit",
                "new"
            ]),
            Some(5)
        );
    }

    #[test]
    fn a_password_in_the_arguments_is_noticed_not_in_the_environment_or_the_command() {
        let on_command_line = |args: &[&str]| {
            let matches = host_cli().try_get_matches_from(args).unwrap();
            password_on_command_line(&matches)
        };
        assert!(on_command_line(&["p", "--password", "x", "check"]));
        assert!(on_command_line(&["p", "check", "--password=x"]));
        assert!(on_command_line(&["p", "--url", "http://u:pw@h", "check"]));
        assert!(on_command_line(&[
            "p",
            "state",
            "--url=clickhouse://u:pw@h/db",
            "list"
        ]));
        assert!(on_command_line(&[
            "p",
            "--meltano-state-backend-uri",
            "clickhouse://u:pw@h",
            "check"
        ]));
        assert!(!on_command_line(&[
            "p",
            "--url",
            "http://u@h/a:b@c",
            "check"
        ]));
        assert!(!on_command_line(&["p", "--password", "", "check"]));
        assert!(!on_command_line(&[
            "p",
            "lock",
            "id",
            "--",
            "cmd",
            "--password",
            "x"
        ]));
        assert!(!PASSWORD_ON_COMMAND_LINE_WARNING.contains('\n'));
    }

    #[test]
    fn passwords_come_out_of_connection_strings() {
        let cases = [
            ("http://u:p@h:1/db?x=1", Some("http://u@h:1/db?x=1")),
            ("clickhouse://u:p%40ss@h", Some("clickhouse://u@h")),
            ("http://u:a:b@c@h", Some("http://u@h")),
            ("https://:pw@h", Some("https://@h")),
            ("http://u@h", None),
            ("http://h/db:x@y", None),
            ("http://h?a=b:c@d", None),
            ("not a url", None),
        ];
        for (url, want) in cases {
            assert_eq!(url_without_password(url).as_deref(), want, "{url}");
        }
    }

    #[test]
    fn the_command_under_a_lock_gets_no_credentials() {
        let env = |name: &str| match name {
            "CLICKHOUSE_URL" => Some(OsString::from("http://u:secret@h:8123")),
            "MELTANO_STATE_BACKEND_URI" => Some(OsString::from("clickhouse://h/db")),
            _ => None,
        };
        assert_eq!(
            withheld_credentials(env),
            [
                ("CLICKHOUSE_PASSWORD", None),
                ("CLICKHOUSE_URL", Some("http://u@h:8123".to_string()))
            ]
        );
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStringExt;
            let env = |name: &str| {
                (name == "MELTANO_STATE_BACKEND_URI")
                    .then(|| OsString::from_vec(b"http://u:\xff@h".to_vec()))
            };
            assert_eq!(
                withheld_credentials(env),
                [
                    ("CLICKHOUSE_PASSWORD", None),
                    ("MELTANO_STATE_BACKEND_URI", None)
                ]
            );
        }
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
