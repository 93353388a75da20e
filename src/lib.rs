//! clickhouse-component: a WebAssembly component (wasm32-wasip2) that gives data pipelines a
//! ClickHouse state store and an acknowledged table sink, talking to ClickHouse over
//! `wasi:http`.
//!
//! The core ([`client`], [`server`], [`state`], [`sink`], [`platform`]) is plain Rust that compiles natively for unit tests; the
//! WIT glue ([`glue`], wasm32 only) only converts between WIT types and core types.

#[cfg(feature = "command")]
pub mod cli;
pub mod client;
pub mod hex;
pub mod host_api;
pub mod platform;
pub mod server;
pub mod sink;
pub mod state;
#[cfg(feature = "command")]
pub mod target;
pub mod text;

#[cfg(all(target_arch = "wasm32", feature = "command"))]
mod command;
#[cfg(target_arch = "wasm32")]
mod glue;
