//! An example consumer of the library component: a `wasi:http/proxy` component serving a small
//! HTTP API over the imported `clickhouse:connector/state-store` and `table-sink` interfaces.
//! `make compose` builds it for `wasm32-wasip2` and plugs the library component into it with
//! `wac plug`; the result runs under stock `wasmtime serve` (docs/composition.md).
//!
//! Natively only the routing (`api`) builds: the service itself is wasm32 only.

pub mod api;

#[cfg(target_arch = "wasm32")]
mod service;
