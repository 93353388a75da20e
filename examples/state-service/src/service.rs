//! The `wasi:http/incoming-handler` export (wasm32 only). It reaches ClickHouse only through
//! the imported `clickhouse:connector` interfaces: no SQL is built here, no HTTP request is
//! sent from here.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use wasip2::http::types::{
    ErrorCode, Fields, IncomingBody, IncomingRequest, Method, OutgoingBody, OutgoingResponse,
    ResponseOutparam,
};
use wasip2::io::streams::StreamError;

use crate::api::{self, Refusal, Route};

// Bindings for our WIT package itself (`wit/` of the repository, not a copy): the world this
// component has besides WASI, which comes from the wasip2 crate.
wit_bindgen::generate!({
    path: "../../wit",
    inline: "
        package clickhouse-examples:state-service;

        world state-service {
            import clickhouse:connector/state-store@0.1.0;
            import clickhouse:connector/table-sink@0.1.0;
        }
    ",
    world: "clickhouse-examples:state-service/state-service",
    generate_all,
});

use clickhouse::connector::state_store::{State, Store, StoreOptions};
use clickhouse::connector::table_sink::{InsertFormat, Sink, SinkOptions};
use clickhouse::connector::types::{Connection, Error, ErrorKind};

/// Largest request body read (a sink's NDJSON included); larger is 413.
const MAX_BODY: usize = 64 << 20;
/// The lock's lease unless `STATE_LEASE_MS` says otherwise: short, because an instance that
/// dies while holding the lock (the host's request timeout, a trap, a crash) runs no
/// destructor, and its lock stays held until the lease ends.
const DEFAULT_LEASE_MS: u32 = 10_000;
/// How long a merge waits for the lock unless `STATE_LOCK_TIMEOUT_MS` says otherwise: longer
/// than the lease, so a merge outwaits a dead holder.
const DEFAULT_LOCK_TIMEOUT_MS: u32 = 30_000;

struct Service;

wasip2::http::proxy::export!(Service);

impl wasip2::exports::http::incoming_handler::Guest for Service {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let (status, body, allow) = match serve(&request) {
            Ok((status, body)) => (status, body, None),
            Err(failure) => (failure.status, failure.body.to_string(), failure.allow),
        };
        drop(request);
        respond(out, status, body.as_bytes(), allow);
    }
}

/// A failed request: its status, the error object, and for 405 the `allow` header.
struct Failure {
    status: u16,
    body: Value,
    allow: Option<&'static str>,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        let kind = kind_name(e.kind);
        Failure {
            status: api::status_of(kind),
            body: json!({
                "kind": kind,
                "message": e.message,
                "server": e.server.map(|s| json!({
                    "code": s.code, "name": s.name, "http-status": s.http_status,
                })),
                "committed-rows": e.committed_rows,
            }),
            allow: None,
        }
    }
}

/// An error the service itself finds (not the library): same JSON shape as the WIT error.
fn failure(status: u16, kind: &str, message: impl Into<String>) -> Failure {
    Failure {
        status,
        body: json!({"kind": kind, "message": message.into(), "server": null, "committed-rows": 0}),
        allow: None,
    }
}

fn kind_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidInput => "invalid-input",
        ErrorKind::Misconfigured => "misconfigured",
        ErrorKind::Disconnected => "disconnected",
        ErrorKind::Transient => "transient",
        ErrorKind::Throttled => "throttled",
        ErrorKind::Permanent => "permanent",
        ErrorKind::Uncertain => "uncertain",
        ErrorKind::Locked => "locked",
        ErrorKind::NotFound => "not-found",
    }
}

fn serve(request: &IncomingRequest) -> Result<(u16, String), Failure> {
    let method = match request.method() {
        Method::Get => "GET".to_string(),
        Method::Put => "PUT".to_string(),
        Method::Post => "POST".to_string(),
        Method::Delete => "DELETE".to_string(),
        Method::Head => "HEAD".to_string(),
        Method::Patch => "PATCH".to_string(),
        Method::Options => "OPTIONS".to_string(),
        Method::Connect => "CONNECT".to_string(),
        Method::Trace => "TRACE".to_string(),
        Method::Other(m) => m,
    };
    let path = request.path_with_query().unwrap_or_else(|| "/".into());
    let route = api::route(&method, &path).map_err(|refusal| match refusal {
        Refusal::NoRoute => failure(404, "not-found", format!("no route {method} {path}")),
        Refusal::Method { allow } => Failure {
            allow: Some(allow),
            ..failure(
                405,
                "invalid-input",
                format!("{method} is not allowed here; use {allow}"),
            )
        },
        Refusal::Malformed(message) => failure(400, "invalid-input", message),
    })?;
    // The body is read before anything is sent to ClickHouse: a request cut short changes
    // nothing.
    let body = read_body(request)?;
    let config = Config::from_environment()?;
    match route {
        Route::GetState(id) => {
            let store = config.store()?;
            match store.get(&id)? {
                Some(state) => ok(state_json(&state)?),
                None => Err(failure(404, "not-found", format!("no state for {id:?}"))),
            }
        }
        Route::PutState(id) => {
            let state = parts(id, &body)?;
            let store = config.store()?;
            store.set(&state)?;
            ok(state_json(&state)?)
        }
        Route::MergeState(id) => {
            let state = parts(id, &body)?;
            let store = config.store()?;
            // One library call: lock, read, merge, fenced write, release. The library releases
            // the lock on every error it returns; only a dead instance leaves it to its lease.
            let stored = store.update(&state)?;
            ok(state_json(&stored)?)
        }
        Route::ListStates(pattern) => {
            let store = config.store()?;
            let ids = store.ids(pattern.as_deref())?;
            ok(json!({ "ids": ids }).to_string())
        }
        Route::Sink { table, batch_size } => {
            let sink = Sink::open(
                &config.connection,
                &SinkOptions {
                    table,
                    columns: None,
                    batch_size,
                    settings: Vec::new(),
                    dedup: None,
                    retries: None,
                    compression: None,
                },
            )?;
            let receipt = sink.send_json(&body);
            sink.close();
            let r = receipt?;
            ok(json!({
                "rows": r.rows,
                "chunks": r.chunks,
                "written-rows": r.written_rows,
                "deduplicated-chunks": r.deduplicated_chunks,
                "unverified-chunks": r.unverified_chunks,
                "retries": r.retries,
                "format": match r.format {
                    InsertFormat::Native => "native",
                    InsertFormat::JsonEachRow => "json-each-row",
                },
            })
            .to_string())
        }
    }
}

fn ok(body: String) -> Result<(u16, String), Failure> {
    Ok((200, body))
}

/// The body of PUT and merge: `{"partial": {...}, "completed": {...}}`, either part optional.
/// The parts are passed to the library as their exact text (it checks they are objects,
/// refuses duplicate keys and keeps numbers exact).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Parts {
    partial: Option<Box<RawValue>>,
    completed: Option<Box<RawValue>>,
}

fn parts(id: String, body: &[u8]) -> Result<State, Failure> {
    let parts: Parts = serde_json::from_slice(body).map_err(|e| {
        failure(
            400,
            "invalid-input",
            format!(
                "the body must be a JSON object {{\"partial\": {{...}}, \"completed\": {{...}}}}: {e}"
            ),
        )
    })?;
    let text = |p: Option<Box<RawValue>>| p.map(|p| p.get().to_string()).unwrap_or_default();
    Ok(State {
        id,
        partial: text(parts.partial),
        completed: text(parts.completed),
    })
}

/// A state as JSON, its parts as the library returned their text (exact numbers: no re-encoding).
fn state_json(state: &State) -> Result<String, Failure> {
    #[derive(Serialize)]
    struct Out<'a> {
        id: &'a str,
        partial: Box<RawValue>,
        completed: Box<RawValue>,
    }
    let raw = |text: &str| {
        let text = if text.is_empty() { "{}" } else { text };
        RawValue::from_string(text.to_string()).map_err(|e| {
            failure(
                500,
                "permanent",
                format!("the library returned a part that is not JSON: {e}"),
            )
        })
    };
    let out = Out {
        id: &state.id,
        partial: raw(&state.partial)?,
        completed: raw(&state.completed)?,
    };
    serde_json::to_string(&out).map_err(|e| {
        failure(
            500,
            "permanent",
            format!("the state could not be encoded: {e}"),
        )
    })
}

/// The service's configuration, from its environment (`wasmtime serve --env`, Spin's
/// `environment`): never from the request.
struct Config {
    connection: Connection,
    store: StoreOptions,
}

impl Config {
    fn from_environment() -> Result<Config, Failure> {
        let env = wasip2::cli::environment::get_environment();
        let var = |name: &str| {
            env.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .filter(|v| !v.is_empty())
        };
        let number = |name: &str, default: u32| match var(name) {
            None => Ok(default),
            Some(v) => v.parse::<u32>().map_err(|_| {
                failure(
                    500,
                    "misconfigured",
                    format!("{name} must be a number of milliseconds, not {v:?}"),
                )
            }),
        };
        let url = var("CLICKHOUSE_URL").ok_or_else(|| {
            failure(
                500,
                "misconfigured",
                "CLICKHOUSE_URL is not set in the service's environment",
            )
        })?;
        Ok(Config {
            connection: Connection {
                url,
                user: var("CLICKHOUSE_USER"),
                password: var("CLICKHOUSE_PASSWORD"),
                database: var("CLICKHOUSE_DATABASE"),
                settings: Vec::new(),
                connect_timeout_ms: None,
                request_timeout_ms: None,
            },
            store: StoreOptions {
                database: var("CLICKHOUSE_SCHEMA"),
                table: var("CLICKHOUSE_TABLE"),
                lock_table: None,
                // Each request is a new instance that opens the store: with the schema made
                // once, `STATE_CREATE_SCHEMA=false` saves the CREATE ... IF NOT EXISTS round
                // trips of every request (open then only checks the tables).
                create_schema: match var("STATE_CREATE_SCHEMA").as_deref() {
                    None => None,
                    Some("true") => Some(true),
                    Some("false") => Some(false),
                    Some(other) => {
                        return Err(failure(
                            500,
                            "misconfigured",
                            format!("STATE_CREATE_SCHEMA must be true or false, not {other:?}"),
                        ))
                    }
                },
                lock_timeout_ms: Some(number("STATE_LOCK_TIMEOUT_MS", DEFAULT_LOCK_TIMEOUT_MS)?),
                lock_retry_ms: None,
                stale_after_ms: Some(number("STATE_LEASE_MS", DEFAULT_LEASE_MS)?),
                lock_engine: None,
                retries: None,
                cluster: var("CLICKHOUSE_CLUSTER"),
            },
        })
    }

    fn store(&self) -> Result<Store, Failure> {
        Ok(Store::open(&self.connection, &self.store)?)
    }
}

fn read_body(request: &IncomingRequest) -> Result<Vec<u8>, Failure> {
    let unreadable = || failure(400, "invalid-input", "the request body could not be read");
    let body = request.consume().map_err(|_| unreadable())?;
    let stream = body.stream().map_err(|_| unreadable())?;
    let mut data = Vec::new();
    loop {
        match stream.blocking_read(1 << 16) {
            Ok(chunk) => {
                if data.len() + chunk.len() > MAX_BODY {
                    return Err(failure(
                        413,
                        "invalid-input",
                        format!("the request body is over {MAX_BODY} bytes"),
                    ));
                }
                data.extend_from_slice(&chunk);
            }
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(e)) => {
                return Err(failure(
                    400,
                    "invalid-input",
                    format!(
                        "the request body could not be read: {}",
                        e.to_debug_string()
                    ),
                ))
            }
        }
    }
    drop(stream);
    let _ = IncomingBody::finish(body);
    Ok(data)
}

fn respond(out: ResponseOutparam, status: u16, body: &[u8], allow: Option<&str>) {
    let mut headers = vec![
        ("content-type".to_string(), b"application/json".to_vec()),
        (
            "content-length".to_string(),
            body.len().to_string().into_bytes(),
        ),
    ];
    if let Some(allow) = allow {
        headers.push(("allow".to_string(), allow.as_bytes().to_vec()));
    }
    let Ok(fields) = Fields::from_list(&headers) else {
        ResponseOutparam::set(out, Err(ErrorCode::InternalError(None)));
        return;
    };
    let response = OutgoingResponse::new(fields);
    let _ = response.set_status_code(status);
    let Ok(outgoing) = response.body() else {
        ResponseOutparam::set(out, Err(ErrorCode::InternalError(None)));
        return;
    };
    ResponseOutparam::set(out, Ok(response));
    if let Ok(stream) = outgoing.write() {
        // At most 4096 bytes per blocking write (the WASI limit).
        for chunk in body.chunks(4096) {
            if stream.blocking_write_and_flush(chunk).is_err() {
                // The client went away: nothing more to do.
                return;
            }
        }
        drop(stream);
    }
    let _ = OutgoingBody::finish(outgoing, None);
}
