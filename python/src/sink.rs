//! `NativeSink`: the table sink, and its receipts.

use std::sync::Arc;

use crate::connection::*;
use crate::errors::*;
use crate::rows::*;
use crate::runtime::*;
use clickhouse_component::host_api::Compression as CoreCompression;
use clickhouse_component::host_api::Redactor;
use clickhouse_component_host::{
    Compression, InsertFormat, Receipt, SinkHandle, SinkOptions, StoreOptions,
};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

/// A receipt as it crosses into Python, by name (`_by_name` in Python reads every field of
/// the Python dataclass by its name: a field missing here fails loudly, none is mislabelled).
#[pyclass(frozen, get_all, module = "clickhouse_component._native")]
pub(crate) struct NativeReceipt {
    pub(crate) rows: u64,
    pub(crate) chunks: u32,
    pub(crate) written_rows: u64,
    pub(crate) deduplicated_chunks: u32,
    pub(crate) unverified_chunks: u32,
    pub(crate) retries: u32,
    pub(crate) format: &'static str,
}

pub(crate) fn receipt(r: Receipt) -> NativeReceipt {
    NativeReceipt {
        rows: r.rows,
        chunks: r.chunks,
        written_rows: r.written_rows,
        deduplicated_chunks: r.deduplicated_chunks,
        unverified_chunks: r.unverified_chunks,
        retries: r.retries,
        format: match r.format {
            InsertFormat::Native => "Native",
            InsertFormat::JsonEachRow => "JSONEachRow",
        },
    }
}

/// An open table sink (`sink` resource) in an instance of its own.
#[pyclass(frozen, module = "clickhouse_component._native")]
pub(crate) struct NativeSink {
    pub(crate) session: Session,
    pub(crate) sink: SinkHandle,
    pub(crate) redactor: Arc<Redactor>,
}

#[pymethods]
impl NativeSink {
    #[new]
    #[pyo3(signature = (connection, table, columns=None, batch_size=None, settings=Vec::new(), dedup=None, retries=None, compression=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        connection: &Connection,
        table: String,
        columns: Option<Vec<String>>,
        batch_size: Option<u32>,
        settings: Vec<(String, String)>,
        dedup: Option<bool>,
        retries: Option<u32>,
        compression: Option<String>,
    ) -> PyResult<NativeSink> {
        let compression = compression
            .map(|c| c.parse::<CoreCompression>().map(Compression::from))
            .transpose()
            .map_err(|e| invalid(py, format!("compression: {}", e.message)))?;
        let options = SinkOptions {
            table,
            columns,
            batch_size,
            settings,
            dedup,
            retries,
            compression,
        };
        let session = new_session(py, connection)?;
        let conn = connection.options.clone();
        let sink = on_instance!(py, &session, &connection.redactor, |i| i
            .open_sink(&conn, &options)
            .await)?;
        Ok(NativeSink {
            session,
            sink,
            redactor: connection.redactor.clone(),
        })
    }

    /// Makes the sink resumable (WIT `resume`): its checkpoint under `checkpoint` in the
    /// state store at `database`.`table` (the store's defaults otherwise); returns the
    /// position of the last acknowledged send.
    #[pyo3(signature = (checkpoint, database=None, table=None, cluster=None))]
    fn resume(
        &self,
        py: Python<'_>,
        checkpoint: String,
        database: Option<String>,
        table: Option<String>,
        cluster: Option<String>,
    ) -> PyResult<Option<String>> {
        let s = self.sink;
        let store = StoreOptions {
            database,
            table,
            cluster,
            ..Default::default()
        };
        on_instance!(py, self, |i| i.sink_resume(s, &checkpoint, &store).await)
    }

    /// Sends rows (a list of dicts) as packed rows: validated, chunked, each chunk
    /// acknowledged; with a position, through the checkpoint (`send-packed`).
    #[pyo3(signature = (rows, position=None))]
    fn send(
        &self,
        py: Python<'_>,
        rows: &Bound<'_, PyAny>,
        position: Option<String>,
    ) -> PyResult<NativeReceipt> {
        let rows = match rows.cast::<PreparedRows>() {
            Ok(prepared) => Arc::clone(&prepared.get().rows),
            Err(_) => Arc::new(to_rows(py, rows).map_err(|m| invalid(py, m))?.0),
        };
        let s = self.sink;
        on_instance!(py, self, |i| Ok(receipt(
            i.sink_send_packed(s, &rows, position.as_deref()).await?
        )))
    }

    /// Sends NDJSON or a JSON array of objects, as bytes; with a position, through the
    /// checkpoint (`send-json-at`).
    #[pyo3(signature = (data, position=None))]
    fn send_json(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        position: Option<String>,
    ) -> PyResult<NativeReceipt> {
        let s = self.sink;
        if let Ok(bytes) = data.cast::<PyBytes>() {
            // Immutable and kept alive by the caller for the whole call: no copy.
            let data: &[u8] = bytes.as_bytes();
            return call_with(py, &self.session, &self.redactor, data, move |i, data| {
                Box::pin(async move {
                    Ok(receipt(match position.as_deref() {
                        None => i.sink_send_json(s, data).await?,
                        Some(at) => i.sink_send_json_at(s, data, at).await?,
                    }))
                })
            });
        }
        let data: Vec<u8> = if let Ok(b) = data.cast::<PyByteArray>() {
            b.to_vec()
        } else if let Ok(m) = data.extract::<Vec<u8>>() {
            m
        } else {
            return Err(invalid(
                py,
                "send_json takes bytes (UTF-8 NDJSON or a JSON array)",
            ));
        };
        on_instance!(py, self, |i| {
            Ok(receipt(match position.as_deref() {
                None => i.sink_send_json(s, &data).await?,
                Some(at) => i.sink_send_json_at(s, &data, at).await?,
            }))
        })
    }

    /// Closes the sink (later sends fail with invalid-input); idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let alive = self
            .session
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        if !alive {
            return Ok(());
        }
        let s = self.sink;
        on_instance!(py, self, |i| i.sink_close(s).await)
    }
}
