//! Reference wasmtime host for the clickhouse-component WebAssembly component.
//!
//! * [`Runtime`] loads the component once (embedded bytes, a file, or bytes; precompiled copy
//!   cached on disk) and links WASI p2 and wasi:http; it is cheap to clone and `Send + Sync`.
//! * [`Instance`] is one store: make one per call or keep one per session.
//! * Outgoing HTTP is denied except to an [`AllowList`] (by default the configured
//!   ClickHouse origin).
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use clickhouse_component_host::{Runtime, ComponentSource, CachePolicy, default_allow_list};
//! use clickhouse_component::host_api::ConnectionOptions;
//!
//! let runtime = Runtime::new(&ComponentSource::Embedded, &CachePolicy::Default)?;
//! let connection = ConnectionOptions::from_url("http://127.0.0.1:8123");
//! let mut instance = runtime.instantiate(default_allow_list(&connection)?).await?;
//! match instance.ping(&connection).await {
//!     Ok(info) => println!("ClickHouse {}", info.version),
//!     Err(e) => eprintln!("{e} (exit code {})", e.exit_code()),
//! }
//! # Ok(()) }
//! ```
//!
//! # One path per item
//!
//! The crate root is the embedding API: each item an embedder names is re-exported here from
//! a private module (`mod runtime;`), so it has one path (`clickhouse_component_host::Runtime`,
//! never `...::runtime::Runtime`). The command line's plumbing, used only by this crate's
//! binary, the Python wheel's console script and the tests, lives in the two public modules
//! [`config`] (the host's flags) and [`command_setup`] (what the host prepares before a
//! command runs) and is never re-exported at the root. A private module's item that is not
//! re-exported is `pub(crate)` (the generated bindings aside).
//! `tests/tests/docs.rs::the_host_has_one_path_per_item` holds the rule.

mod allow_list;
mod bindings;
pub mod command_setup;
mod component;
pub mod config;
mod limits;
mod pool;
mod runtime;

pub use allow_list::{AddressDenied, AllowList, AllowListError};
pub use bindings::{
    Compression, InsertFormat, LockEngine, Receipt, ServerInfo, SinkOptions, State, StoreOptions,
    Value,
};
pub use component::{
    CachePolicy, ComponentSource, LoadKind, LoadReport, EMBEDDED_COMPONENT_PATH,
    LIBRARY_COMPONENT_PATH, WASMTIME_VERSION,
};
pub use limits::{CallDeadlineExceeded, Limits, MemoryLimitExceeded};
pub use pool::{
    ConnectionPool, LookupFuture, Network, NetworkError, Resolve, SystemResolver, TlsOptions,
};
pub use runtime::{
    default_allow_list, runner_message, CallError, CapturedOutput, CommandInput, Instance,
    LockHandle, ReadableDir, RequestDeadline, Runtime, SinkHandle, StoreHandle,
};
