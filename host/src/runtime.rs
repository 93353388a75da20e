//! The embedding API: a [`Runtime`] (engine + compiled component + linker, loaded once, shared
//! across threads) makes [`Instance`]s (one store each: per call or per session, as the embedder
//! chooses). Outgoing HTTP goes through the allow-list hook.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clickhouse_component::client::request::OPERATION_HEADER;
use clickhouse_component::client::{ConnectionOptions, Endpoint, Error, ErrorKind, ServerError};
use wasmtime::component::{Linker, ResourceTable};
use wasmtime::{Config, Engine, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiBody, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView};

use crate::allow_list::AllowList;
use crate::bindings::{Connection, Connector, ConnectorPre, ServerInfo, WitError, WitErrorKind};
use crate::component::{self, CachePolicy, ComponentSource, LoadReport};

/// Engine, compiled component and linker: load once, share (it is cheap to clone).
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    pre: ConnectorPre<HostState>,
    report: LoadReport,
}

impl Runtime {
    /// Loads the component (from the cache when possible) and links WASI and wasi:http.
    pub fn new(source: &ComponentSource, cache: &CachePolicy) -> anyhow::Result<Runtime> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        let engine = Engine::new(&config)?;
        let (component, report) = component::load(&engine, source, cache)?;
        let mut linker = Linker::<HostState>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        let pre = ConnectorPre::new(linker.instantiate_pre(&component)?)
            .map_err(anyhow::Error::from)
            .context("the component does not implement the clickhouse:connector world")?;
        tracing::debug!(kind = ?report.kind, ms = report.duration.as_secs_f64() * 1e3, "component loaded");
        Ok(Runtime {
            inner: Arc::new(Inner { pre, report }),
        })
    }

    /// How loading went (compiled or cache hit, and how long it took).
    pub fn load_report(&self) -> &LoadReport {
        &self.inner.report
    }

    /// A fresh instance whose outgoing HTTP may reach only `allow`.
    pub async fn instantiate(&self, allow: AllowList) -> anyhow::Result<Instance> {
        let state = HostState {
            table: ResourceTable::new(),
            wasi: WasiCtx::builder().inherit_stderr().build(),
            http: WasiHttpCtx::new(),
            hooks: Hooks {
                allow: Arc::new(allow),
            },
        };
        let mut store = Store::new(self.inner.pre.engine(), state);
        let connector = self.inner.pre.instantiate_async(&mut store).await?;
        Ok(Instance { store, connector })
    }
}

/// One instance of the component with its own store. Calls on it run one at a time.
pub struct Instance {
    store: Store<HostState>,
    connector: Connector,
}

impl Instance {
    /// `server.ping`: connects, authenticates and returns the server's identity.
    ///
    /// The outer error is a failure of the runtime (a trap); the inner one the component's
    /// classified error.
    pub async fn ping(
        &mut self,
        connection: &ConnectionOptions,
    ) -> anyhow::Result<Result<ServerInfo, Error>> {
        let conn = to_wit_connection(connection);
        let result = self
            .connector
            .clickhouse_connector_server()
            .call_ping(&mut self.store, &conn)
            .await?;
        Ok(result.map_err(from_wit_error))
    }
}

/// The default allow-list for a connection: exactly the origin of its URL.
pub fn default_allow_list(connection: &ConnectionOptions) -> Result<AllowList, Error> {
    let endpoint = Endpoint::parse(connection)?;
    AllowList::origin(&endpoint.origin()).map_err(|e| Error::invalid(e.to_string()))
}

/// Converts the core connection options to the WIT record.
pub fn to_wit_connection(c: &ConnectionOptions) -> Connection {
    Connection {
        url: c.url.clone(),
        user: c.user.clone(),
        password: c.password.clone(),
        database: c.database.clone(),
        settings: c.settings.clone(),
        connect_timeout_ms: c.connect_timeout_ms,
        request_timeout_ms: c.request_timeout_ms,
    }
}

/// Converts the component's WIT error to the core error type.
pub fn from_wit_error(e: WitError) -> Error {
    Error {
        kind: match e.kind {
            WitErrorKind::InvalidInput => ErrorKind::InvalidInput,
            WitErrorKind::Misconfigured => ErrorKind::Misconfigured,
            WitErrorKind::Disconnected => ErrorKind::Disconnected,
            WitErrorKind::Transient => ErrorKind::Transient,
            WitErrorKind::Throttled => ErrorKind::Throttled,
            WitErrorKind::Permanent => ErrorKind::Permanent,
            WitErrorKind::Uncertain => ErrorKind::Uncertain,
            WitErrorKind::Locked => ErrorKind::Locked,
            WitErrorKind::NotFound => ErrorKind::NotFound,
        },
        message: e.message,
        server: e.server.map(|s| ServerError {
            code: s.code,
            name: s.name,
            http_status: s.http_status,
        }),
        committed_rows: e.committed_rows,
    }
}

/// Per-store host state.
pub struct HostState {
    table: ResourceTable,
    wasi: WasiCtx,
    http: WasiHttpCtx,
    hooks: Hooks,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// The wasi:http seam: checks the allow-list, logs one line per request, sends.
struct Hooks {
    allow: Arc<AllowList>,
}

type SendFuture = Box<
    dyn std::future::Future<
            Output = wasmtime_wasi_http::Result<(
                http::Response<WasiBody>,
                Box<dyn std::future::Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
            )>,
        > + Send,
>;

impl WasiHttpHooks for Hooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<wasmtime_wasi_http::RequestOptions>,
        _fut: Box<dyn std::future::Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
    ) -> SendFuture {
        let uri = request.uri();
        let scheme = uri.scheme_str().unwrap_or("https").to_string();
        let host = uri.host().unwrap_or_default().to_string();
        let port = uri
            .port_u16()
            .unwrap_or(if scheme == "https" { 443 } else { 80 });
        let operation = request
            .headers()
            .get(OPERATION_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string();
        if !self.allow.allows(&scheme, &host, port) {
            tracing::warn!(
                op = %operation,
                destination = %format!("{scheme}://{host}:{port}"),
                allowed = %self.allow,
                "outgoing request denied by the allow-list"
            );
            return Box::new(async { Err(wasmtime_wasi_http::Error::HttpRequestDenied) });
        }
        let started = Instant::now();
        let bytes = request
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        Box::new(async move {
            use http_body_util::BodyExt;
            let result = wasmtime_wasi_http::default_send_request(request, options).await;
            let ms = started.elapsed().as_secs_f64() * 1e3;
            match &result {
                Ok((response, _)) => tracing::debug!(
                    op = %operation,
                    status = response.status().as_u16(),
                    request_bytes = bytes,
                    ms = format!("{ms:.2}"),
                    "clickhouse request"
                ),
                Err(e) => {
                    tracing::debug!(op = %operation, error = %e, ms = format!("{ms:.2}"), "clickhouse request failed")
                }
            }
            let (response, io) = result?;
            Ok((
                response.map(BodyExt::boxed_unsync),
                Box::new(io) as Box<dyn std::future::Future<Output = _> + Send>,
            ))
        })
    }
}
