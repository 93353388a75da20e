//! WIT glue (wasm32 only): converts WIT records to core types and core errors to the WIT
//! `error` record. No logic lives here.

use std::rc::Rc;
use std::time::Duration;

use crate::client::wasi_http::WasiHttpTransport;
use crate::client::{Client, Compression, ConnectionOptions, Error, ErrorKind};
use crate::platform::wasi::WasiPlatform;
use crate::sink::{self, Sink, SinkOptions};
use crate::state::{self, json, HeldLock, LockEngineChoice, LockOptions, StateStore, StoreOptions};
use std::cell::RefCell;

/// The full component's world (`connector`: the library plus `wasi:cli/run`), or with the
/// `command` feature off, the library world alone (the smaller artifact for embedders).
macro_rules! bindings_for {
    ($world:literal) => {
        wit_bindgen::generate!({
            path: "wit",
            world: $world,
            with: {
                "wasi:http/types@0.2.12": wasip2::http::types,
                "wasi:http/outgoing-handler@0.2.12": wasip2::http::outgoing_handler,
                "wasi:io/error@0.2.12": wasip2::io::error,
                "wasi:io/poll@0.2.12": wasip2::io::poll,
                "wasi:io/streams@0.2.12": wasip2::io::streams,
                "wasi:clocks/monotonic-clock@0.2.12": wasip2::clocks::monotonic_clock,
            },
        });
    };
}

#[cfg(feature = "command")]
mod bindings {
    bindings_for!("connector");
}

#[cfg(not(feature = "command"))]
mod bindings {
    bindings_for!("library");
}

use bindings::exports::clickhouse::connector::server::{Guest as ServerGuest, ServerInfo};
use bindings::exports::clickhouse::connector::types::{
    Connection, Error as WitError, ErrorKind as WitErrorKind, ServerError as WitServerError,
};

use bindings::exports::clickhouse::connector::state_store::{
    self as wit_state, Guest as StateGuest, GuestLock, GuestStore, LockEngine as WitLockEngine,
    State as WitState, StoreOptions as WitStoreOptions,
};

use bindings::exports::clickhouse::connector::table_sink::{
    self as wit_sink, Compression as WitCompression, Guest as SinkGuest, GuestSink,
    InsertFormat as WitInsertFormat, Receipt as WitReceipt, SinkOptions as WitSinkOptions,
    Value as WitValue,
};

struct Component;

#[cfg(feature = "command")]
impl bindings::exports::wasi::cli::run::Guest for Component {
    fn run() -> Result<(), ()> {
        match crate::command::main() {
            0 => Ok(()),
            code => {
                wasip2::cli::exit::exit_with_code(u8::try_from(code).unwrap_or(1));
                Err(())
            }
        }
    }
}

impl SinkGuest for Component {
    type Sink = SinkResource;
}

/// The `sink` resource.
struct SinkResource {
    sink: RefCell<Sink<WasiHttpTransport, WasiPlatform>>,
    /// For the checkpoint's store ([`GuestSink::resume`]).
    connection: Connection,
}

impl GuestSink for SinkResource {
    fn open(connection: Connection, options: WitSinkOptions) -> Result<wit_sink::Sink, WitError> {
        let options = SinkOptions {
            table: options.table,
            columns: options.columns,
            batch_size: options.batch_size,
            settings: options.settings,
            dedup: options.dedup.unwrap_or(false),
            retries: options.retries.unwrap_or(0),
            compression: options
                .compression
                .map(Compression::from)
                .unwrap_or_default(),
        };
        let sink = Sink::open(client(connection.clone())?, WasiPlatform, &options)?;
        Ok(wit_sink::Sink::new(SinkResource {
            sink: RefCell::new(sink),
            connection,
        }))
    }

    fn send(&self, rows: Vec<Vec<(String, WitValue)>>) -> Result<WitReceipt, WitError> {
        let rows = from_wit_rows(rows);
        self.sink
            .borrow()
            .send(&rows)
            .map(to_wit_receipt)
            .map_err(WitError::from)
    }

    fn send_json(&self, data: Vec<u8>) -> Result<WitReceipt, WitError> {
        self.sink
            .borrow()
            .send_json(&data)
            .map(to_wit_receipt)
            .map_err(WitError::from)
    }

    fn resume(
        &self,
        checkpoint: String,
        store: WitStoreOptions,
    ) -> Result<Option<String>, WitError> {
        let sink = self.sink.borrow();
        let store = StateStore::open(
            client(self.connection.clone())?,
            WasiPlatform,
            &store_options(store),
        )?;
        Ok(sink.resume(store, &checkpoint)?)
    }

    fn send_at(
        &self,
        rows: Vec<Vec<(String, WitValue)>>,
        position: String,
    ) -> Result<WitReceipt, WitError> {
        let rows = from_wit_rows(rows);
        let receipt = self.sink.borrow().send_at(&rows, &position)?;
        Ok(to_wit_receipt(receipt))
    }

    fn send_json_at(&self, data: Vec<u8>, position: String) -> Result<WitReceipt, WitError> {
        let receipt = self.sink.borrow().send_json_at(&data, &position)?;
        Ok(to_wit_receipt(receipt))
    }

    #[cfg_attr(not(feature = "speed"), allow(unused_variables))]
    fn send_packed(&self, data: Vec<u8>, at: Option<String>) -> Result<WitReceipt, WitError> {
        // The library component, built for its size budget, leaves packed rows out (their
        // reader is about 10 KB): its callers are components and hosts that send JSON.
        #[cfg(not(feature = "speed"))]
        return Err(Error::invalid("send-packed: use send-json (not in this build)").into());
        #[cfg(feature = "speed")]
        {
            let sink = self.sink.borrow();
            let receipt = match at {
                None => sink.send_packed(&data)?,
                Some(at) => sink.send_packed_at(&data, &at)?,
            };
            Ok(to_wit_receipt(receipt))
        }
    }

    fn close(&self) {
        // Best effort (see the WIT): a failed last write costs a resend, which tokens absorb.
        let _ = self.sink.borrow_mut().close();
    }
}

fn from_wit_rows(rows: Vec<Vec<(String, WitValue)>>) -> Vec<sink::Row> {
    rows.into_iter()
        .map(|row| {
            row.into_iter()
                .map(|(k, v)| (k, from_wit_value(v)))
                .collect()
        })
        .collect()
}

fn from_wit_value(v: WitValue) -> sink::Value {
    match v {
        WitValue::Null => sink::Value::Null,
        WitValue::Boolean(b) => sink::Value::Bool(b),
        WitValue::Int(i) => sink::Value::Int(i),
        WitValue::Uint(u) => sink::Value::Uint(u),
        WitValue::Float(f) => sink::Value::Float(f),
        WitValue::Text(s) => sink::Value::Text(s),
        WitValue::Json(s) => sink::Value::Json(s),
        WitValue::Bytes(b) => sink::Value::Bytes(b),
    }
}

fn to_wit_receipt(r: sink::Receipt) -> WitReceipt {
    WitReceipt {
        rows: r.rows,
        chunks: r.chunks,
        written_rows: r.written_rows,
        deduplicated_chunks: r.deduplicated_chunks,
        unverified_chunks: r.unverified_chunks,
        retries: r.retries,
        format: match r.format {
            Some(sink::Format::JsonEachRow) => WitInsertFormat::JsonEachRow,
            Some(sink::Format::Native) | None => WitInsertFormat::Native,
        },
    }
}

/// The core's store options for the WIT's (defaults for what is left out).
fn store_options(options: WitStoreOptions) -> StoreOptions {
    let defaults = StoreOptions::default();
    let ms =
        |v: Option<u32>, d: Duration| v.map(|ms| Duration::from_millis(ms.into())).unwrap_or(d);
    StoreOptions {
        database: options.database.unwrap_or(defaults.database),
        table: options.table.unwrap_or(defaults.table),
        lock_table: options.lock_table,
        create_schema: options.create_schema.unwrap_or(defaults.create_schema),
        lock_engine: match options.lock_engine {
            None | Some(WitLockEngine::Auto) => LockEngineChoice::Auto,
            Some(WitLockEngine::KeeperMap) => LockEngineChoice::KeeperMap,
            Some(WitLockEngine::MergeTree) => LockEngineChoice::MergeTree,
        },
        lock: LockOptions {
            timeout: ms(options.lock_timeout_ms, defaults.lock.timeout),
            retry: ms(options.lock_retry_ms, defaults.lock.retry),
            stale_after: ms(options.stale_after_ms, defaults.lock.stale_after),
        },
        cluster: options.cluster,
        retries: options.retries.unwrap_or(defaults.retries),
    }
}

type CoreStore = StateStore<WasiHttpTransport, WasiPlatform>;

impl StateGuest for Component {
    type Store = StoreResource;
    type Lock = LockResource;
}

/// The `store` resource: a core state store shared with the locks it hands out.
struct StoreResource {
    store: Rc<CoreStore>,
}

impl GuestStore for StoreResource {
    fn open(
        connection: Connection,
        options: WitStoreOptions,
    ) -> Result<wit_state::Store, WitError> {
        let options = store_options(options);
        let store = StateStore::open(client(connection)?, WasiPlatform, &options)?;
        Ok(wit_state::Store::new(StoreResource {
            store: Rc::new(store),
        }))
    }

    fn get(&self, id: String) -> Result<Option<WitState>, WitError> {
        Ok(self.store.get(&id)?.map(to_wit_state))
    }

    fn set(&self, state: WitState) -> Result<(), WitError> {
        Ok(self.store.set(&from_wit_state(state)?)?)
    }

    fn update(&self, state: WitState) -> Result<WitState, WitError> {
        let stored = self.store.update(&from_wit_state(state)?)?;
        Ok(to_wit_state(stored))
    }

    fn delete(&self, id: String) -> Result<u64, WitError> {
        Ok(self.store.delete(&id)?)
    }

    fn ids(&self, pattern: Option<String>) -> Result<Vec<String>, WitError> {
        Ok(self.store.ids(pattern.as_deref())?)
    }

    fn get_all(&self, pattern: Option<String>) -> Result<Vec<WitState>, WitError> {
        let states = self.store.get_all(pattern.as_deref())?;
        Ok(states.into_iter().map(to_wit_state).collect())
    }

    fn set_all(&self, states: Vec<WitState>) -> Result<(), WitError> {
        let states = states
            .into_iter()
            .map(from_wit_state)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(self.store.set_all(&states)?)
    }

    fn clear_all(&self) -> Result<u64, WitError> {
        Ok(self.store.clear_all()?)
    }

    fn lock(&self, id: String) -> Result<wit_state::Lock, WitError> {
        let held = HeldLock::acquire(self.store.clone(), &id)?;
        Ok(wit_state::Lock::new(LockResource(held)))
    }
}

/// The `lock` resource: the core's [`HeldLock`] (released on `release` or, best effort, when
/// dropped).
struct LockResource(HeldLock<WasiHttpTransport, WasiPlatform>);

impl GuestLock for LockResource {
    fn id(&self) -> String {
        self.0.handle().id.clone()
    }

    fn token(&self) -> String {
        self.0.handle().token.clone()
    }

    fn renew(&self) -> Result<(), WitError> {
        Ok(self.0.renew()?)
    }

    fn release(&self) -> Result<(), WitError> {
        Ok(self.0.release()?)
    }

    fn set(&self, state: WitState) -> Result<(), WitError> {
        Ok(self.0.set(&from_wit_state(state)?)?)
    }

    fn update(&self, state: WitState) -> Result<WitState, WitError> {
        Ok(to_wit_state(self.0.update(&from_wit_state(state)?)?))
    }

    fn delete(&self) -> Result<u64, WitError> {
        Ok(self.0.delete()?)
    }
}

fn from_wit_state(state: WitState) -> Result<state::State, WitError> {
    Ok(state::State::from_json(
        &state.id,
        &state.partial,
        &state.completed,
    )?)
}

fn to_wit_state(state: state::State) -> WitState {
    WitState {
        partial: json::object_text(&state.partial),
        completed: json::object_text(&state.completed),
        id: state.id,
    }
}

impl ServerGuest for Component {
    fn ping(connection: Connection) -> Result<ServerInfo, WitError> {
        let client = client(connection)?;
        let info = crate::server::ping(&client)?;
        Ok(ServerInfo {
            version: info.version,
            timezone: info.timezone,
            user: info.user,
            database: info.database,
            round_trip_us: info.round_trip_us,
        })
    }
}

/// A client over wasi:http for a WIT connection record.
fn client(connection: Connection) -> Result<Client<WasiHttpTransport>, WitError> {
    let options = ConnectionOptions {
        url: connection.url,
        user: connection.user,
        password: connection.password,
        database: connection.database,
        settings: connection.settings,
        connect_timeout_ms: connection.connect_timeout_ms,
        request_timeout_ms: connection.request_timeout_ms,
    };
    Ok(Client::new(&options, WasiHttpTransport)?)
}

impl From<WitCompression> for Compression {
    fn from(method: WitCompression) -> Self {
        match method {
            WitCompression::None => Compression::None,
            WitCompression::Lz4 => Compression::Lz4,
            WitCompression::Zstd => Compression::Zstd,
            WitCompression::Gzip => Compression::Gzip,
        }
    }
}

impl From<Error> for WitError {
    fn from(error: Error) -> WitError {
        WitError {
            kind: match error.kind {
                ErrorKind::InvalidInput => WitErrorKind::InvalidInput,
                ErrorKind::Misconfigured => WitErrorKind::Misconfigured,
                ErrorKind::Disconnected => WitErrorKind::Disconnected,
                ErrorKind::Transient => WitErrorKind::Transient,
                ErrorKind::Throttled => WitErrorKind::Throttled,
                ErrorKind::Permanent => WitErrorKind::Permanent,
                ErrorKind::Uncertain => WitErrorKind::Uncertain,
                ErrorKind::Locked => WitErrorKind::Locked,
                ErrorKind::NotFound => WitErrorKind::NotFound,
            },
            message: error.message,
            server: error.server.map(|s| WitServerError {
                code: s.code,
                name: s.name,
                http_status: s.http_status,
            }),
            committed_rows: error.committed_rows,
        }
    }
}

bindings::export!(Component with_types_in bindings);
