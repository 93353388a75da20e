//! The acknowledged table sink (parity with onestep-clickhouse, plus deduplication tokens).
//!
//! Rows are validated before any request, encoded as JSONEachRow (one JSON object per line,
//! keys in column order, numbers as the caller wrote them), split into `batch_size` chunks, and
//! each chunk is one INSERT that is sent and acknowledged before the next. A failure after a
//! committed chunk is `uncertain`.
//!
//! Rooms: [`config`] (options and their rules), [`columns`] (the table's column types: where a
//! null may go), [`exact`] (values a column type would store changed: refused), [`encode`] (rows to JSONEachRow bytes; `row_scan` is its one-pass reader of
//! flat JSON objects), [`driver`] (chunking, acknowledgement, failure semantics).

pub mod columns;
pub mod config;
pub mod driver;
pub mod encode;
pub mod exact;
mod row_scan;

pub use config::{SinkConfig, SinkOptions};
pub use driver::{PreparedSend, Receipt, Sink, StartedSend};
pub use encode::{Row, Value};
