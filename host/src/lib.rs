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

pub mod allow_list;
pub mod bindings;
pub mod command_setup;
pub mod component;
pub mod config;
pub mod limits;
pub mod pool;
pub mod runtime;

pub use allow_list::{AllowList, AllowListError};
pub use bindings::{
    Compression, InsertFormat, LockEngine, Receipt, ServerInfo, SinkOptions, State, StoreOptions,
    Value,
};
pub use component::{CachePolicy, ComponentSource, LoadKind, LoadReport};
pub use limits::{CallDeadlineExceeded, Limits, MemoryLimitExceeded};
pub use pool::{Network, NetworkError, Resolve, SystemResolver, TlsOptions};
pub use runtime::{
    default_allow_list, CallError, CapturedOutput, CommandInput, Instance, LockHandle, ReadableDir,
    RequestDeadline, Runtime, SinkHandle, StoreHandle,
};
