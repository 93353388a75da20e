//! The command line, defined once: options and subcommands (clap), and their execution against
//! the core. The component runs it from its `wasi:cli/run` export (configured by arguments and
//! environment variables, so the stock wasmtime CLI can run it); the reference host parses the
//! same definitions, adds what only it has (allow-list, component path, cache, running a
//! command under a lock) and runs the component.

pub mod check;
pub mod lock;
pub mod output;
pub mod sink;
pub mod state;
pub mod target;

use std::io::{Read, Write};

use clap::{Args, Parser, Subcommand};

use crate::client::{ConnectionOptions, Error, Transport};
use crate::platform::Platform;

pub use output::Output;

/// Pipeline state store and acknowledged table sink for ClickHouse, run as a WebAssembly
/// component.
///
/// Exit codes: 0 ok, 1 runner failure (or a destructive `state` command not confirmed, as
/// Meltano's), 2 invalid input, 3 misconfigured, 4 disconnected,
/// 5 transient, 6 throttled, 7 permanent, 8 uncertain, 9 locked, 10 not found.
#[derive(Parser, Debug, Clone)]
#[command(name = "clickhouse-component", version)]
pub struct Cli {
    /// Options shared by every command.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Commands.
#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Connect and print the server's version, user, time zone and the round-trip time.
    Check,
    /// Pipeline state (mirrors `meltano state`).
    State {
        /// Where the states live.
        #[command(flatten)]
        store: StoreArgs,
        /// The state command.
        #[command(subcommand)]
        command: state::StateCommand,
    },
    /// Hold the advisory lock on a state id for a duration, or (reference host only) while a
    /// command runs.
    Lock(lock::LockArgs),
    /// Stream NDJSON (or a JSON array) into a table: validated, chunked, each chunk one
    /// acknowledged INSERT.
    Sink(sink::SinkArgs),
    /// Singer target (Meltano's loader): Singer messages on stdin into tables, exactly once;
    /// STATE lines on stdout once the records before them are acknowledged.
    Target(target::TargetArgs),
}

/// Options every command shares (each also read from the environment variable shown).
#[derive(Args, Clone, Debug, Default)]
pub struct GlobalArgs {
    /// ClickHouse connection string: clickhouse:// clickhouses:// http:// https://
    /// [user[:password]@]host[:port][/database][?setting=value...]
    #[arg(long, env = "CLICKHOUSE_URL", global = true, hide_env_values = true)]
    pub url: Option<String>,

    /// Meltano's state backend URI, used when no --url / CLICKHOUSE_URL is given.
    #[arg(
        long = "meltano-state-backend-uri",
        env = "MELTANO_STATE_BACKEND_URI",
        global = true,
        hide = true,
        hide_env_values = true
    )]
    pub meltano_uri: Option<String>,

    /// Host, used only when no URL is given (with CLICKHOUSE_PORT; plain HTTP).
    #[arg(long, env = "CLICKHOUSE_HOST", global = true)]
    pub host: Option<String>,

    /// Port, used only when no URL is given (default 8123).
    #[arg(long, env = "CLICKHOUSE_PORT", global = true)]
    pub port: Option<u16>,

    /// User (overrides the URL's).
    #[arg(long, env = "CLICKHOUSE_USER", global = true)]
    pub user: Option<String>,

    /// Password (overrides the URL's; prefer the environment variable).
    #[arg(
        long,
        env = "CLICKHOUSE_PASSWORD",
        global = true,
        hide_env_values = true
    )]
    pub password: Option<String>,

    /// Database (overrides the URL path).
    #[arg(long, env = "CLICKHOUSE_DATABASE", global = true)]
    pub database: Option<String>,

    /// ClickHouse setting sent with every request, NAME=VALUE (repeatable).
    #[arg(long = "setting", value_name = "NAME=VALUE", global = true)]
    pub settings: Vec<String>,

    /// Connect timeout in milliseconds (default 10000).
    #[arg(long, env = "CLICKHOUSE_CONNECT_TIMEOUT_MS", global = true)]
    pub connect_timeout_ms: Option<u32>,

    /// No byte sent or received for this long ends a request, in ms (default 300000); a small
    /// answer (every read but the store's large ones) must also arrive whole within it.
    #[arg(long, env = "CLICKHOUSE_REQUEST_TIMEOUT_MS", global = true)]
    pub request_timeout_ms: Option<u32>,

    /// Print results (and errors) as JSON on stdout.
    #[arg(long, global = true)]
    pub json: bool,
}

impl GlobalArgs {
    /// The connection the options describe; `invalid-input` when none or malformed.
    pub fn connection(&self) -> Result<ConnectionOptions, Error> {
        let url = match (self.url.as_ref().or(self.meltano_uri.as_ref()), &self.host) {
            (Some(url), _) if !url.is_empty() => url.clone(),
            (_, Some(host)) if !host.is_empty() => {
                format!("http://{host}:{}", self.port.unwrap_or(8123))
            }
            _ => {
                return Err(Error::invalid(
                    "no ClickHouse to talk to: set --url or CLICKHOUSE_URL (or MELTANO_STATE_BACKEND_URI, or CLICKHOUSE_HOST)",
                ))
            }
        };
        let mut settings = Vec::with_capacity(self.settings.len());
        for setting in &self.settings {
            let Some((name, value)) = setting.split_once('=') else {
                return Err(Error::invalid(format!(
                    "--setting expects NAME=VALUE, got '{}'",
                    setting.split('=').next().unwrap_or_default()
                )));
            };
            settings.push((name.trim().to_string(), value.to_string()));
        }
        Ok(ConnectionOptions {
            url,
            user: self.user.clone(),
            password: self.password.clone(),
            database: self.database.clone(),
            settings,
            connect_timeout_ms: self.connect_timeout_ms,
            request_timeout_ms: self.request_timeout_ms,
        })
    }
}

/// Where the state store lives and how its lock behaves.
#[derive(Args, Debug, Clone, Default)]
pub struct StoreArgs {
    /// Database of the state tables (default meltano).
    #[arg(long = "state-database", env = "CLICKHOUSE_SCHEMA")]
    pub state_database: Option<String>,
    /// State table (default state).
    #[arg(long = "state-table", env = "CLICKHOUSE_TABLE")]
    pub state_table: Option<String>,
    /// Lock table (default <state table>_component_lock).
    #[arg(long = "lock-table", env = "CLICKHOUSE_LOCK_TABLE")]
    pub lock_table: Option<String>,
    /// Never create the database or tables; fail if they are missing.
    #[arg(long = "no-create-schema")]
    pub no_create_schema: bool,
    /// How long to wait for a held lock, in seconds (default 30).
    #[arg(long, env = "MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS")]
    pub lock_timeout_seconds: Option<f64>,
    /// Pause between lock attempts, in seconds (default 0.1).
    #[arg(long, env = "MELTANO_STATE_BACKEND_LOCK_RETRY_SECONDS")]
    pub lock_retry_seconds: Option<f64>,
    /// Lease of a lock, in seconds: a crashed holder's lock frees itself after it (default
    /// 300, at most 43200).
    #[arg(long, env = "CLICKHOUSE_LOCK_STALE_AFTER_SECONDS")]
    pub stale_after_seconds: Option<f64>,
    /// Lock engine: keeper-map (KeeperMap table: clusters and ClickHouse Cloud), merge-tree
    /// (commit order: one server, plain MergeTree), or auto (an existing lock table's engine,
    /// else keeper-map when the server allows it, else merge-tree).
    #[arg(long = "lock-engine", env = "CLICKHOUSE_LOCK_ENGINE")]
    pub lock_engine: Option<String>,
    /// Create the schema ON CLUSTER this cluster (remote_servers): the state table as a
    /// ReplicatedReplacingMergeTree, the lock table as KeeperMap (merge-tree is refused).
    #[arg(long, env = "CLICKHOUSE_CLUSTER")]
    pub cluster: Option<String>,
    /// How many times a request that failed in a way that may pass (connection, timeout,
    /// lost answer, overload) is repeated, with backoff from 0.1 s doubling to 2 s (default 5;
    /// 0 never repeats). Releasing a lock is repeated until its lease ends regardless.
    #[arg(long, env = "CLICKHOUSE_RETRIES")]
    pub retries: Option<u32>,
    /// The lock already held on a state id by `lock ID -- COMMAND` (set by it for the command,
    /// with CLICKHOUSE_LOCK_TOKEN): `state set`, `merge`, `clear`, `copy`/`move` on that id
    /// write fenced by it instead of waiting for the lock.
    #[arg(long = "held-lock-id", env = "CLICKHOUSE_LOCK_ID", hide = true)]
    pub held_lock_id: Option<String>,
    /// The token of the held lock (see --held-lock-id).
    #[arg(long = "held-lock-token", env = "CLICKHOUSE_LOCK_TOKEN", hide = true)]
    pub held_lock_token: Option<String>,
}

impl StoreArgs {
    /// The lock held on `id` by an enclosing `lock ID -- COMMAND`, if any.
    pub fn held_lock(&self, id: &str) -> Option<crate::state::LockHandle> {
        match (&self.held_lock_id, &self.held_lock_token) {
            (Some(held), Some(token)) if held == id && !token.is_empty() => {
                Some(crate::state::LockHandle::held_elsewhere(id, token.clone()))
            }
            _ => None,
        }
    }
}

impl StoreArgs {
    /// The store options these arguments describe.
    pub fn options(&self) -> Result<crate::state::StoreOptions, Error> {
        use std::time::Duration;
        let seconds = |name: &str, v: Option<f64>, default: Duration| -> Result<Duration, Error> {
            match v {
                None => Ok(default),
                Some(s) if s.is_finite() && (0.0..=4_294_967.0).contains(&s) => {
                    Ok(Duration::from_millis((s * 1000.0).round() as u64))
                }
                Some(_) => Err(Error::invalid(format!(
                    "{name} must be a number of seconds from 0 to 4294967"
                ))),
            }
        };
        let d = crate::state::StoreOptions::default();
        Ok(crate::state::StoreOptions {
            database: self.state_database.clone().unwrap_or(d.database),
            table: self.state_table.clone().unwrap_or(d.table),
            lock_table: self.lock_table.clone(),
            create_schema: !self.no_create_schema,
            lock_engine: match &self.lock_engine {
                None => crate::state::LockEngineChoice::Auto,
                Some(name) => name.parse()?,
            },
            cluster: self.cluster.clone(),
            retries: self.retries.unwrap_or(d.retries),
            lock: crate::state::LockOptions {
                timeout: seconds(
                    "--lock-timeout-seconds",
                    self.lock_timeout_seconds,
                    d.lock.timeout,
                )?,
                retry: seconds(
                    "--lock-retry-seconds",
                    self.lock_retry_seconds,
                    d.lock.retry,
                )?,
                stale_after: seconds(
                    "--stale-after-seconds",
                    self.stale_after_seconds,
                    d.lock.stale_after,
                )?,
            },
        })
    }
}

/// What a command may use of its runner: the network, a clock, and standard streams.
pub struct Runner<'a, T, P> {
    /// HTTP to ClickHouse.
    pub transport: T,
    /// Clock, sleep, randomness.
    pub platform: P,
    /// Standard input (sink, state import).
    pub stdin: Box<dyn Read + 'a>,
    /// Standard error (progress, lock messages).
    pub stderr: &'a mut dyn Write,
    /// Whether to show progress on stderr (a terminal).
    pub progress: bool,
    /// The most memory the component may use, in bytes, as its host says
    /// (`CLICKHOUSE_MAX_MEMORY_MIB`); `None` when not said ([`DEFAULT_MEMORY_LIMIT`] is
    /// assumed). What `sink` keeps of its first pass over a file is a quarter of it.
    pub memory_limit: Option<u64>,
}

/// The memory limit assumed when the host names none: the reference host's default.
pub const DEFAULT_MEMORY_LIMIT: u64 = 1 << 30;

/// Runs a parsed command line: prints the result (or the error) and returns the exit code.
pub fn run<T, P>(cli: &Cli, runner: &mut Runner<'_, T, P>, stdout: &mut dyn Write) -> i32
where
    T: Transport + Clone,
    P: Platform + Clone,
{
    if let Command::Target(args) = &cli.command {
        // Its stdout is STATE lines only; its notes and errors go to stderr.
        return target::run(args, runner, stdout);
    }
    let result = match &cli.command {
        Command::Target(_) => unreachable!("run above"),
        Command::Check => check::run(&cli.global, runner),
        Command::State { store, command } => state::run(&cli.global, store, command, runner),
        Command::Lock(args) => lock::run(&cli.global, args, runner),
        Command::Sink(args) => sink::run(&cli.global, args, runner),
    };
    match result {
        Ok(output) => output.emit(cli.global.json, stdout),
        Err(error) => output::error(cli.global.json, &error, stdout, runner.stderr),
    }
}

/// Reports a command line clap refused: help and version as clap prints them (exit 0); a
/// usage error as clap prints it, or, when the arguments ask for `--json` (before any `--`),
/// as the JSON error object every other error prints (kind `invalid-input`); exit 2 either way.
pub fn usage_error(
    e: &clap::Error,
    args: &[String],
    stdout: &mut dyn std::io::Write,
    stderr: &mut dyn std::io::Write,
) -> i32 {
    if !e.use_stderr() {
        let _ = write!(stdout, "{}", e.render());
        return 0;
    }
    let json = args
        .iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .any(|a| a == "--json");
    if json {
        let text = e.render().to_string();
        let first = text.lines().next().unwrap_or("invalid arguments");
        let message = match e.kind() {
            // Its text is the help.
            clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                "a subcommand or argument is missing (see --help)"
            }
            _ => first.strip_prefix("error: ").unwrap_or(first),
        };
        return output::error(true, &Error::invalid(message), stdout, stderr);
    }
    // As clap words it (without colours: `stderr` may be any writer).
    let _ = write!(stderr, "{}", e.render());
    let _ = stderr.flush();
    crate::client::ErrorKind::InvalidInput.exit_code()
}

/// What to add to a file error inside a component: it sees only the directories its runner
/// gives it.
pub(crate) fn no_files_hint() -> &'static str {
    if cfg!(target_arch = "wasm32") {
        " (a WebAssembly component reads only the directories its runner gives it: the reference host gives the FILE's, `wasmtime run` needs --dir; or give - and the file on stdin)"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_under_json_print_the_json_error_object() {
        let argv = |a: &[&str]| -> Vec<String> { a.iter().map(|s| s.to_string()).collect() };
        let args = argv(&[
            "clickhouse-component",
            "--json",
            "sink",
            "--table",
            "t",
            "--batch-size",
            "-5",
        ]);
        let e = Cli::try_parse_from(&args).unwrap_err();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(usage_error(&e, &args, &mut out, &mut err), 2);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["ok"], false);
        assert_eq!(v["error"]["kind"], "invalid-input");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("-5"),
            "{v}"
        );
        // `--json` after `--` is not the option.
        let args = argv(&["clickhouse-component", "state", "--", "--json"]);
        let e = Cli::try_parse_from(&args).unwrap_err();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(usage_error(&e, &args, &mut out, &mut err), 2);
        assert!(out.is_empty());
        // The text goes to the writer given, as clap words it.
        let text = String::from_utf8(err).unwrap();
        assert!(
            text.starts_with("error: unrecognized subcommand '--json'"),
            "{text}"
        );
    }

    #[test]
    fn url_wins_over_host_and_meltano_uri() {
        let args = GlobalArgs {
            url: Some("https://a:9440".into()),
            host: Some("b".into()),
            port: Some(1),
            meltano_uri: Some("clickhouse://m:1/db".into()),
            ..Default::default()
        };
        assert_eq!(args.connection().unwrap().url, "https://a:9440");
        let args = GlobalArgs {
            meltano_uri: Some("clickhouse://m:1/db".into()),
            host: Some("b".into()),
            ..Default::default()
        };
        assert_eq!(args.connection().unwrap().url, "clickhouse://m:1/db");
        let args = GlobalArgs {
            host: Some("b".into()),
            ..Default::default()
        };
        assert_eq!(args.connection().unwrap().url, "http://b:8123");
        let err = GlobalArgs::default().connection().unwrap_err();
        assert!(err.message.contains("CLICKHOUSE_URL"));
    }

    #[test]
    fn settings_parse_as_name_value() {
        let args = GlobalArgs {
            url: Some("http://h".into()),
            settings: vec!["max_threads=2".into(), "log_comment=a=b".into()],
            ..Default::default()
        };
        assert_eq!(
            args.connection().unwrap().settings,
            vec![
                ("max_threads".to_string(), "2".to_string()),
                ("log_comment".to_string(), "a=b".to_string())
            ]
        );
        let bad = GlobalArgs {
            settings: vec!["novalue".into()],
            ..args
        };
        assert!(bad.connection().unwrap_err().message.contains("NAME=VALUE"));
    }

    #[test]
    fn store_args_map_meltano_seconds() {
        let s = StoreArgs {
            lock_timeout_seconds: Some(1.5),
            stale_after_seconds: Some(2.0),
            ..Default::default()
        };
        let o = s.options().unwrap();
        assert_eq!(o.lock.timeout, std::time::Duration::from_millis(1500));
        assert_eq!(o.lock.stale_after, std::time::Duration::from_secs(2));
        assert_eq!(o.database, "meltano");
        let bad = StoreArgs {
            lock_retry_seconds: Some(-1.0),
            ..Default::default()
        };
        assert!(bad.options().is_err());
    }

    #[test]
    fn the_command_line_parses() {
        let cli = Cli::try_parse_from([
            "clickhouse-component",
            "--json",
            "state",
            "--state-database",
            "d",
            "set",
            "id",
            "{}",
        ])
        .unwrap();
        assert!(cli.global.json);
        assert!(matches!(cli.command, Command::State { .. }));
        assert!(Cli::try_parse_from(["clickhouse-component", "nope"]).is_err());
    }
}
