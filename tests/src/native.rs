//! A native [`Transport`] (ureq over std networking) for the component's own core client, so
//! tests and benchmarks can run plain SQL against the same ClickHouse: setup, verification,
//! interop rows, and the raw round trips the benchmarks compare with.

use std::io::Read;
use std::time::{Duration, Instant};

use clickhouse_component::client::error::{TransportError, TransportFailure};
use clickhouse_component::client::{
    Client, ConnectionOptions, HttpRequest, HttpResponse, Query, Transport,
};
use serde_json::Value;

/// ureq-based transport (plain HTTP; keep-alive connection pool per agent).
#[derive(Clone)]
pub struct NativeTransport {
    agent: ureq::Agent,
}

impl Default for NativeTransport {
    fn default() -> Self {
        NativeTransport {
            agent: ureq::AgentBuilder::new()
                .timeout_connect(Duration::from_secs(10))
                .timeout_read(Duration::from_secs(300))
                .build(),
        }
    }
}

impl Transport for NativeTransport {
    fn send(&self, request: &HttpRequest) -> Result<HttpResponse, TransportError> {
        let started = Instant::now();
        let scheme = if request.tls { "https" } else { "http" };
        let url = format!("{scheme}://{}{}", request.authority, request.path_and_query);
        let mut req = self.agent.post(&url).timeout(request.request_timeout);
        for (name, value) in &request.headers {
            req = req.set(name, &String::from_utf8_lossy(value));
        }
        let response = match req.send_bytes(&request.body) {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(ureq::Error::Transport(t)) => {
                let failure = match t.kind() {
                    ureq::ErrorKind::ConnectionFailed => TransportFailure::Refused,
                    ureq::ErrorKind::Dns => TransportFailure::Dns,
                    _ => TransportFailure::Other,
                };
                return Err(TransportError::new(failure, t.to_string()));
            }
        };
        let status = response.status();
        let headers = response
            .headers_names()
            .into_iter()
            .filter_map(|n| {
                let v = response.header(&n)?.as_bytes().to_vec();
                Some((n.to_ascii_lowercase(), v))
            })
            .collect();
        let mut body = Vec::new();
        response
            .into_reader()
            .take(1 << 30)
            .read_to_end(&mut body)
            .map_err(|e| TransportError::new(TransportFailure::Reset, e.to_string()))?;
        Ok(HttpResponse {
            status,
            headers,
            body,
            elapsed_us: started.elapsed().as_micros() as u64,
        })
    }
}

/// Plain SQL against the test server ([`crate::clickhouse`]).
pub fn sql() -> Sql {
    Sql::new(&crate::clickhouse().connection())
}

/// Plain SQL against a server, for tests.
pub struct Sql {
    client: Client<NativeTransport>,
}

impl Sql {
    /// A client for these connection options.
    pub fn new(options: &ConnectionOptions) -> Sql {
        Sql {
            client: Client::new(options, NativeTransport::default()).expect("valid connection"),
        }
    }

    /// The underlying client.
    pub fn client(&self) -> &Client<NativeTransport> {
        &self.client
    }

    /// Runs a statement with `(name, value)` parameters; panics on error.
    pub fn exec(&self, sql: &str, params: &[(&str, &str)]) {
        let mut q = Query::write("test", sql);
        for (k, v) in params {
            q = q.param(k, *v);
        }
        self.client
            .execute(&q)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Inserts NDJSON rows (`INSERT INTO ... FORMAT JSONEachRow`).
    pub fn insert_json(&self, sql: &str, params: &[(&str, &str)], rows: &[Value]) {
        let mut body = Vec::new();
        for row in rows {
            body.extend_from_slice(row.to_string().as_bytes());
            body.push(b'\n');
        }
        let mut q = Query::write("test", sql).data(body);
        for (k, v) in params {
            q = q.param(k, *v);
        }
        self.client
            .execute(&q)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Runs a query and returns its rows as JSON objects.
    pub fn rows(&self, sql: &str, params: &[(&str, &str)]) -> Vec<Value> {
        let mut q = Query::read("test", sql).format("JSONEachRow");
        for (k, v) in params {
            q = q.param(k, *v);
        }
        let response = self
            .client
            .execute(&q)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        String::from_utf8(response.body)
            .unwrap()
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// A single number (first column of the first row).
    pub fn count(&self, sql: &str, params: &[(&str, &str)]) -> u64 {
        let rows = self.rows(sql, params);
        let value = rows[0]
            .as_object()
            .unwrap()
            .values()
            .next()
            .unwrap()
            .clone();
        match value {
            Value::Number(n) => n.as_u64().unwrap(),
            Value::String(s) => s.parse().unwrap(),
            other => panic!("not a count: {other}"),
        }
    }
}

/// A [`NativeTransport`] that can hold one chosen request before sending it, so a test can
/// interleave two clients at an exact point (e.g. hold a holder's renewal until its lease has
/// ended and someone else took the lock). Clones share the gate.
#[derive(Clone, Default)]
pub struct PausingTransport {
    inner: NativeTransport,
    gate: std::sync::Arc<Gate>,
}

#[derive(Default)]
struct Gate {
    state: std::sync::Mutex<GateState>,
    changed: std::sync::Condvar,
}

#[derive(Default)]
struct GateState {
    /// Operation names (the `x-component-operation` header) whose next request is held.
    armed: Vec<String>,
    /// A request is being held.
    holding: bool,
    /// The held request may go.
    released: bool,
    /// Requests held so far.
    holds: u64,
}

impl PausingTransport {
    /// Holds the next request whose operation is one of `operations`.
    pub fn pause_next(&self, operations: &[&str]) {
        let mut state = self.gate.state.lock().unwrap();
        state.armed = operations.iter().map(|o| o.to_string()).collect();
        state.released = false;
    }

    /// Waits until a request is held; false after `timeout`.
    pub fn wait_held(&self, timeout: Duration) -> bool {
        let state = self.gate.state.lock().unwrap();
        let (state, _) = self
            .gate
            .changed
            .wait_timeout_while(state, timeout, |s| !s.holding)
            .unwrap();
        state.holding
    }

    /// Waits until `n` requests in all have been held; false after `timeout`.
    pub fn wait_holds(&self, n: u64, timeout: Duration) -> bool {
        let state = self.gate.state.lock().unwrap();
        let (state, _) = self
            .gate
            .changed
            .wait_timeout_while(state, timeout, |s| s.holds < n)
            .unwrap();
        state.holds >= n
    }

    /// Lets the held request go.
    pub fn release(&self) {
        let mut state = self.gate.state.lock().unwrap();
        state.released = true;
        self.gate.changed.notify_all();
    }
}

impl Transport for PausingTransport {
    fn send(&self, request: &HttpRequest) -> Result<HttpResponse, TransportError> {
        let operation = request
            .headers
            .iter()
            .find(|(n, _)| n == clickhouse_component::client::request::OPERATION_HEADER)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default();
        {
            let mut state = self.gate.state.lock().unwrap();
            if state.armed.contains(&operation) {
                state.armed.clear();
                state.holding = true;
                state.holds += 1;
                self.gate.changed.notify_all();
                let mut state = self
                    .gate
                    .changed
                    .wait_while(state, |s| !s.released)
                    .unwrap();
                state.holding = false;
                // One release lets one held request go: a request held next waits for its own.
                state.released = false;
            }
        }
        self.inner.send(request)
    }
}
