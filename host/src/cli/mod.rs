//! The command line of the reference host: definitions (clap) and one module per command
//! group. Commands run the component through the host library and return an [`Output`].

pub mod check;
pub mod lock;
pub mod output;
pub mod sink;
pub mod state;

use clap::{Args, Parser, Subcommand};
use clickhouse_component::client::{ConnectionOptions, Error};
use clickhouse_component_host::config::GlobalArgs;
use clickhouse_component_host::{
    AllowList, CallError, Instance, Runtime, StoreHandle, StoreOptions,
};

pub use output::Output;

/// Pipeline state store and acknowledged table sink for ClickHouse, run as a WebAssembly
/// component.
///
/// Exit codes: 0 ok, 1 runner failure, 2 invalid input, 3 misconfigured, 4 disconnected,
/// 5 transient, 6 throttled, 7 permanent, 8 uncertain, 9 locked, 10 not found.
#[derive(Parser, Debug)]
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
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Connect through the component and print the server's version, user, time zone and the
    /// round-trip time.
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
    /// Hold the advisory lock on a state id while a command runs (or for a duration).
    Lock(lock::LockArgs),
    /// Stream NDJSON (or a JSON array) into a table: validated, chunked, each chunk one
    /// acknowledged INSERT.
    Sink(sink::SinkArgs),
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
    /// Lock table (default <state table>_lock).
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
    /// Lease of a lock, in seconds: a crashed holder's lock frees itself after it (default 300).
    #[arg(long, env = "CLICKHOUSE_LOCK_STALE_AFTER_SECONDS")]
    pub stale_after_seconds: Option<f64>,
}

impl StoreArgs {
    /// The WIT store options.
    pub fn options(&self) -> Result<StoreOptions, Error> {
        let ms = |name: &str, v: Option<f64>| -> Result<Option<u32>, Error> {
            match v {
                None => Ok(None),
                Some(s) if s.is_finite() && s >= 0.0 && s * 1000.0 <= u32::MAX as f64 => {
                    Ok(Some((s * 1000.0).round() as u32))
                }
                Some(_) => Err(Error::invalid(format!(
                    "{name} must be a number of seconds from 0 to 4294967"
                ))),
            }
        };
        Ok(StoreOptions {
            database: self.state_database.clone(),
            table: self.state_table.clone(),
            lock_table: self.lock_table.clone(),
            create_schema: Some(!self.no_create_schema),
            lock_timeout_ms: ms("--lock-timeout-seconds", self.lock_timeout_seconds)?,
            lock_retry_ms: ms("--lock-retry-seconds", self.lock_retry_seconds)?,
            stale_after_ms: ms("--stale-after-seconds", self.stale_after_seconds)?,
        })
    }
}

/// A ready instance with its connection.
pub struct Session {
    /// The instance.
    pub instance: Instance,
    /// The connection.
    pub connection: ConnectionOptions,
    /// How loading went.
    pub load: clickhouse_component_host::LoadReport,
    /// Time to get here.
    pub ready: std::time::Duration,
}

/// Loads the component and instantiates it with the configured allow-list.
pub async fn session(global: &GlobalArgs) -> Result<Session, CallError> {
    let started = std::time::Instant::now();
    let connection = global.connection().map_err(CallError::Component)?;
    let allow: AllowList = global
        .allow_list(&connection)
        .map_err(CallError::Component)?;
    let runtime = Runtime::new(&global.component_source(), &global.cache_policy())?;
    let instance = runtime.instantiate(allow).await?;
    Ok(Session {
        instance,
        connection,
        load: runtime.load_report().clone(),
        ready: started.elapsed(),
    })
}

/// A session with an open state store.
pub async fn open_store(
    global: &GlobalArgs,
    store: &StoreArgs,
) -> Result<(Session, StoreHandle), CallError> {
    let options = store.options().map_err(CallError::Component)?;
    let mut session = session(global).await?;
    let handle = session
        .instance
        .open_store(&session.connection, &options)
        .await?;
    Ok((session, handle))
}
