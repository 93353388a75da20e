//! clickhouse-component: a WebAssembly component (wasm32-wasip2) that gives data pipelines a
//! ClickHouse state store and an acknowledged table sink, talking to ClickHouse over
//! `wasi:http`.
//!
//! The core ([`client`], [`server`], [`state`], [`sink`], [`platform`]) is plain Rust that compiles natively for unit tests; the
//! WIT glue ([`glue`], wasm32 only) only converts between WIT types and core types.

// Natively, without `test-util`, the crate is what a host links: `host_api`, and the component's
// core behind it unreached (the component's own entry points are the wasm32 glue, so what is
// dead code is decided by the wasm32 builds).
#![cfg_attr(
    not(any(target_arch = "wasm32", feature = "test-util")),
    allow(dead_code, unused_imports)
)]

pub mod host_api;

// The component's core: private, and public only under the feature `test-util`, for the
// workspace's integration tests and benchmarks (never enabled by a host's or the component's
// build): a host reaches the crate only through [`host_api`]. Each module is declared twice,
// not by a macro: rustfmt formats only the modules it sees declared.
#[cfg(feature = "command")]
#[cfg(feature = "test-util")]
pub mod cli;
#[cfg(feature = "command")]
#[cfg(not(feature = "test-util"))]
mod cli;
#[cfg(feature = "test-util")]
pub mod client;
#[cfg(not(feature = "test-util"))]
mod client;
#[cfg(feature = "command")]
#[cfg(feature = "test-util")]
pub mod loader;
#[cfg(feature = "command")]
#[cfg(not(feature = "test-util"))]
mod loader;
#[cfg(feature = "test-util")]
pub mod platform;
#[cfg(not(feature = "test-util"))]
mod platform;
#[cfg(feature = "test-util")]
pub mod sink;
#[cfg(not(feature = "test-util"))]
mod sink;
#[cfg(feature = "test-util")]
pub mod state;
#[cfg(not(feature = "test-util"))]
mod state;

mod hex;
mod server;
mod text;

#[cfg(all(target_arch = "wasm32", feature = "command"))]
mod command;
#[cfg(target_arch = "wasm32")]
mod glue;
