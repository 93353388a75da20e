//! Resumable sends: a sink's progress kept in the state store under an id, so a process that
//! stops (a crash, kill -9, a lost machine) can be followed by another that continues where
//! the committed rows end, without writing any row twice.
//!
//! The caller gives each send its *position*: its own text for where its source stands after
//! the send's rows (a file offset, a bookmark, a Singer STATE). Before a send's first chunk is
//! sent, the checkpoint is written once: the position of the last acknowledged send (every
//! send before this one is acknowledged, the sink being sequential), and the send now in
//! flight (its rows, its position and a digest of its chunks' deduplication tokens). A later
//! sink that resumes under the same id gets the committed position back, and its first send
//! must be the one that was in flight, chunk for chunk: the chunks of it that landed carry the
//! same tokens and the server drops them. A different first send is refused before anything is
//! sent, since rows of the old one may have been committed. So one write per send, and none
//! after it: the last send's acknowledgement is recorded by the next send, or by `close`.
//!
//! This is the one module of the sink that uses the state store (its `get` and `set_own`).

use serde_json::{Map, Value};

use crate::client::{Error, Transport};
use crate::platform::Platform;
use crate::state::{escape_id, State, StateStore};

/// The key of a checkpoint in its state's completed part.
pub const CHECKPOINT_KEY: &str = "clickhouse_sink_checkpoint";

/// A send that was on the wire when the checkpoint was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InFlightSend {
    /// The caller's position after its rows.
    pub position: String,
    /// Its rows.
    pub rows: u64,
    /// SHA-256 (hex) of its chunks' deduplication tokens, in order: the same rows in the same
    /// chunks (same table, columns, batch size and bytes) give the same digest.
    pub digest: String,
}

/// A sink's progress as recorded in the state store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// The target table, `database.table` (an unqualified name is qualified with the
    /// connection's current database, so the same table is recognised however it is named).
    pub table: String,
    /// The columns every send writes, fixed by the first send (empty before it).
    pub columns: Vec<String>,
    /// Rows per chunk (the chunks, and so their tokens, depend on it).
    pub batch_size: u32,
    /// The caller's position after the last acknowledged send; none before the first.
    pub position: Option<String>,
    /// Rows acknowledged, over all runs.
    pub rows: u64,
    /// Sends acknowledged, over all runs.
    pub sends: u64,
    /// The send on the wire when this was written, if any: it may have committed in part.
    pub in_flight: Option<InFlightSend>,
}

impl Checkpoint {
    fn to_json(&self) -> Value {
        let mut map = Map::new();
        map.insert("table".into(), self.table.clone().into());
        map.insert("columns".into(), self.columns.clone().into());
        map.insert("batch_size".into(), self.batch_size.into());
        map.insert("position".into(), self.position.clone().into());
        map.insert("rows".into(), self.rows.into());
        map.insert("sends".into(), self.sends.into());
        if let Some(f) = &self.in_flight {
            let mut inner = Map::new();
            inner.insert("position".into(), f.position.clone().into());
            inner.insert("rows".into(), f.rows.into());
            inner.insert("digest".into(), f.digest.clone().into());
            map.insert("in_flight".into(), inner.into());
        }
        map.into()
    }

    /// The checkpoint in `value`, or `None` when it is not one this version wrote (another
    /// version's, or not a checkpoint at all).
    fn from_json(value: &Value) -> Option<Checkpoint> {
        let map = value.as_object()?;
        let text = |m: &Map<String, Value>, k: &str| m.get(k)?.as_str().map(String::from);
        let number = |m: &Map<String, Value>, k: &str| m.get(k)?.as_u64();
        let known = [
            "table",
            "columns",
            "batch_size",
            "position",
            "rows",
            "sends",
            "in_flight",
        ];
        if map.keys().any(|k| !known.contains(&k.as_str())) {
            return None;
        }
        let in_flight = match map.get("in_flight") {
            None => None,
            Some(f) => {
                let f = f.as_object()?;
                Some(InFlightSend {
                    position: text(f, "position")?,
                    rows: number(f, "rows")?,
                    digest: text(f, "digest")?,
                })
            }
        };
        Some(Checkpoint {
            table: text(map, "table")?,
            columns: map
                .get("columns")?
                .as_array()?
                .iter()
                .map(|c| c.as_str().map(String::from))
                .collect::<Option<_>>()?,
            batch_size: u32::try_from(number(map, "batch_size")?).ok()?,
            position: match map.get("position")? {
                Value::Null => None,
                p => Some(p.as_str()?.to_string()),
            },
            rows: number(map, "rows")?,
            sends: number(map, "sends")?,
            in_flight,
        })
    }
}

/// One checkpoint in the state store, as a sink keeps it while it sends.
pub(crate) struct Checkpoints<T: Transport, P: Platform> {
    store: StateStore<T, P>,
    id: String,
    /// As last written (or read, or advanced by an acknowledged send).
    pub(crate) current: Checkpoint,
    /// An acknowledged send is not yet written down (the next send or `close` does).
    pub(crate) unwritten: bool,
}

impl<T: Transport, P: Platform> Checkpoints<T, P> {
    /// Reads the checkpoint under `id` (for a sink into `table` with `batch_size` rows a
    /// chunk and, when configured, `columns`), or starts a new one. A state under the id that
    /// is not a checkpoint is refused, never overwritten; one written for another table,
    /// batch size or columns is refused, naming the difference.
    pub(crate) fn open(
        store: StateStore<T, P>,
        id: &str,
        table: String,
        batch_size: u32,
        columns: Option<&[String]>,
    ) -> Result<Self, Error> {
        crate::state::check_new_id(id)?;
        let escaped = escape_id(id);
        let current = match store.get(id)? {
            None => Checkpoint {
                table,
                columns: columns.map(<[String]>::to_vec).unwrap_or_default(),
                batch_size,
                position: None,
                rows: 0,
                sends: 0,
                in_flight: None,
            },
            Some(state) => {
                let value = (state.partial.is_empty() && state.completed.len() == 1)
                    .then(|| state.completed.get(CHECKPOINT_KEY))
                    .flatten()
                    .ok_or_else(|| {
                        Error::invalid(format!(
                            "state '{escaped}' exists and is not a sink checkpoint: choose another checkpoint id"
                        ))
                    })?;
                let saved = Checkpoint::from_json(value).ok_or_else(|| {
                    Error::invalid(format!(
                        "state '{escaped}' is a sink checkpoint this version cannot read (an earlier version's: finish that send with the version that began it, or choose another checkpoint id)"
                    ))
                })?;
                let differs = |what: &str, saved: String, now: String| {
                    Err(Error::invalid(format!(
                        "checkpoint '{escaped}' was written for {what} {saved}, not {now}: use another checkpoint id (or the same {what})"
                    )))
                };
                if saved.table != table {
                    return differs("table", saved.table, table);
                }
                if saved.batch_size != batch_size {
                    return differs(
                        "batch size",
                        saved.batch_size.to_string(),
                        batch_size.to_string(),
                    );
                }
                if let Some(columns) = columns {
                    if !saved.columns.is_empty() && saved.columns != columns {
                        return differs("columns", saved.columns.join(","), columns.join(","));
                    }
                }
                saved
            }
        };
        Ok(Checkpoints {
            store,
            id: id.to_string(),
            current,
            unwritten: false,
        })
    }

    /// Records `send` as in flight (and every send before it as acknowledged), before its
    /// first chunk goes out. A send that was in flight when the checkpoint was written must
    /// be sent again first, chunk for chunk: another is refused.
    pub(crate) fn begin(&mut self, send: InFlightSend) -> Result<(), Error> {
        if let Some(before) = &self.current.in_flight {
            if before.digest != send.digest {
                return Err(Error::invalid(format!(
                    "checkpoint '{}': a send of {} rows (ending at position {}) was in flight when it was written and may have committed in part; send exactly those rows again first (the same rows in the same order, so that the chunks that landed carry the same tokens and are dropped)",
                    escape_id(&self.id),
                    before.rows,
                    crate::text::escaped(&before.position)
                )));
            }
        }
        let mut next = self.current.clone();
        next.in_flight = Some(send);
        self.save(&next)?;
        self.current = next;
        self.unwritten = false;
        Ok(())
    }

    /// The send in flight was acknowledged: its position is the committed one (written by
    /// the next [`Self::begin`] or by [`Self::close`]).
    pub(crate) fn acknowledged(&mut self, rows: u64) {
        if let Some(sent) = self.current.in_flight.take() {
            self.current.position = Some(sent.position);
            self.current.rows += rows;
            self.current.sends += 1;
            self.unwritten = true;
        }
    }

    /// The send in flight was refused with nothing of it committed: forgotten, and written
    /// down at once (best effort), so no later send, in this process or one that resumes,
    /// must repeat it.
    pub(crate) fn abandon_in_flight(&mut self) {
        if self.current.in_flight.take().is_some() {
            let _ = self.save(&self.current.clone());
            self.unwritten = false;
        }
    }

    /// Writes the last acknowledged send down, if it is not yet.
    pub(crate) fn close(&mut self) -> Result<(), Error> {
        if self.unwritten {
            self.save(&self.current.clone())?;
            self.unwritten = false;
        }
        Ok(())
    }

    fn save(&self, checkpoint: &Checkpoint) -> Result<(), Error> {
        let mut completed = Map::new();
        completed.insert(CHECKPOINT_KEY.to_string(), checkpoint.to_json());
        // This sink is the checkpoint's only writer, and writes it forward.
        self.store.set_own(&State {
            id: self.id.clone(),
            partial: Map::new(),
            completed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_reads_back_as_written_and_another_shape_is_not_one() {
        let mut c = Checkpoint {
            table: "db.t".into(),
            columns: vec!["a".into(), "b".into()],
            batch_size: 10,
            position: None,
            rows: 0,
            sends: 0,
            in_flight: None,
        };
        assert_eq!(Checkpoint::from_json(&c.to_json()), Some(c.clone()));
        c.position = Some("{\"offset\":3}".into());
        c.in_flight = Some(InFlightSend {
            position: "p".into(),
            rows: 7,
            digest: "ab".into(),
        });
        assert_eq!(Checkpoint::from_json(&c.to_json()), Some(c.clone()));
        // The CLI's checkpoint of an earlier version, and other shapes, are not read as one.
        let old = serde_json::json!({"table": "db.t", "columns": [], "batch_size": 1,
            "input_bytes": 0, "input_sha256": "", "rows": 0, "batches": 0});
        assert_eq!(Checkpoint::from_json(&old), None);
        let mut wrong = c.to_json();
        wrong["rows"] = (-1).into();
        assert_eq!(Checkpoint::from_json(&wrong), None);
        assert_eq!(Checkpoint::from_json(&Value::Null), None);
    }
}
