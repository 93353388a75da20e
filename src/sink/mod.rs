//! The acknowledged table sink (parity with onestep-clickhouse, plus deduplication tokens).
//!
//! Every value of a send is read for its column's type before any request (a value the server
//! would refuse or store changed is refused), and each `batch_size` chunk is encoded as one
//! block of ClickHouse's Native format (JSONEachRow for a table with a type the sink does not
//! encode), sent as one INSERT and acknowledged before the next. A failure after a committed
//! chunk is `uncertain`.
//!
//! Rooms: [`config`] (options and their rules), [`types`] (the one model of column types),
//! [`columns`] (the table's columns, read once), [`scalars`] (the texts read as numbers,
//! dates, times, UUIDs, addresses), [`json`] (the JSON reader rows are read with, and the JSON
//! string writer), [`native`] (values read into columns by type; the Native block),
//! [`encode`] (a send's rows found in its input: lines, array elements, typed rows),
//! [`driver`] (chunking, acknowledgement, failure semantics), [`statements`] (every request
//! the sink sends, its repeat rule, and the one send), [`resume`] (checkpoints in the state
//! store, so a later process continues a stopped one's sends).

pub mod columns;
pub mod config;
pub mod driver;
pub mod encode;
pub mod json;
pub mod native;
// Packed rows: the full component's (feature `speed`); the library component leaves them
// out for its size budget.
#[cfg(feature = "speed")]
pub mod packed;
pub mod resume;
pub mod scalars;
pub mod statements;
pub mod types;

pub use columns::Format;
pub use config::SinkOptions;
#[cfg(any(test, feature = "command"))]
pub use driver::{PreparedSend, StartedSend};
pub use driver::{Receipt, Sink};
pub use encode::{Row, Value};
