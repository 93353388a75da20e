//! The outgoing network path of one component instance (the wasi:http `send_request` hook's
//! transport), for `http` and `https` alike: hyper-util's pooled HTTP/1.1 client
//! (`hyper_util::client::legacy::Client`) over a connector of our own.
//!
//! * **Allow-list, by URL then by address.** The host is checked by name
//!   ([`AllowList::allows`]) before anything else; when a new connection is needed the
//!   connector resolves the name once (through a [`Resolve`], the system resolver by default),
//!   checks every address it resolved to ([`AllowList::check_address`]: link-local and cloud
//!   metadata addresses are refused unless listed explicitly), and only then dials the checked
//!   addresses, in order. The name is never resolved again, so a DNS answer that changes
//!   between the check and the connection (DNS rebinding) cannot reach another address. A
//!   refusal fails the request with `HttpRequestDenied` and opens no connection.
//! * **Keep-alive** (hyper-util's pool). Idle connections are reused per scheme and authority
//!   (a reused connection was checked when it was opened); one goes back to the pool only after
//!   its response body was read to the end. Idle connections older than [`MAX_IDLE`] are never
//!   reused, and are dropped in the background, for every destination. A request that a stale
//!   connection hands back unsent (the server closed it while it was idle, and hyper saw so
//!   before writing the request) is sent again, once, on a new connection; a request that had
//!   started on the wire is never sent again.
//! * **TLS** (rustls, ring provider): the system trust store, or the compiled-in web roots when
//!   the system store is empty, plus an optional CA file ([`TlsOptions::ca_file`]); SNI is the
//!   host name, ALPN `http/1.1`. A rejected certificate fails with `TlsCertificateError`, an
//!   alert from the server with `TlsAlertReceived`, any other handshake failure with
//!   `TlsProtocolError` (the detail is logged).
//! * **Limits** (from [`Limits`]): at most `max_response_bytes` read from one response body
//!   (past it the body fails with `HttpResponseBodySize` and the connection is dropped), at most
//!   `max_concurrent_requests` requests in flight per instance (a request holds its slot until
//!   its response body is read or dropped; another one waits for a slot up to its connect
//!   timeout, then fails with `ConnectionLimitReached`).
//! * Per request: `TCP_NODELAY`; the connect timeout bounds resolving, connecting and the TLS
//!   handshake together (it reaches the connector as a task-local, `connector::REQUEST`);
//!   first-byte (from the moment a connection carries the request) and between-bytes timeouts.
//! * **Errors**: an answer that is not HTTP is `HttpProtocolError` (a head past hyper's limit
//!   `HttpResponseHeaderSectionSize`); a connection that ends (closed, reset) before the whole
//!   answer is `HttpResponseIncomplete` once the request had started on the wire, and
//!   `ConnectionTerminated` before.
//!
//! A [`Network`] (TLS roots, resolver) is made once and shared; each instance gets its own
//! [`ConnectionPool`] from [`Network::pool`].

mod body;
mod connector;

use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::capture_connection;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tokio::sync::Semaphore;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody};

use body::{conn_id, request_error, RequestBody, RequestState, ResponseBody, Tracker};
use connector::{ConnId, Connector, RequestContext, REQUEST};

use crate::allow_list::AllowList;
use crate::limits::Limits;

/// Most idle connections kept per destination.
const MAX_IDLE_PER_HOST: usize = 16;
/// An idle connection older than this is not reused (servers close idle keep-alive connections
/// after their own timeout, ClickHouse's default being 10 s or more; reusing one just as the
/// server closes it would fail the request).
pub(crate) const MAX_IDLE: Duration = Duration::from_secs(2);
/// Used when a request has no timeout of its own (wasmtime-wasi-http's default).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// TLS settings of outgoing HTTPS connections.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// A PEM file of CA certificates trusted in addition to the system trust store (e.g. a
    /// private CA signing the ClickHouse server's certificate).
    pub ca_file: Option<PathBuf>,
}

/// A problem with the TLS settings (found by [`Network::new`], before any request).
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// The CA file could not be read.
    #[error("cannot read the CA file {}: {source}", path.display())]
    CaFileUnreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The CA file is not usable: no PEM certificate in it, or one that is not a valid CA.
    #[error("the CA file {}: {reason}", path.display())]
    CaFileInvalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The future of a [`Resolve::lookup`].
pub type LookupFuture = Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>>;

/// Resolves host names to addresses (the system resolver by default; tests inject answers).
pub trait Resolve: Send + Sync + 'static {
    /// The addresses of `host` (a name, never an IP address), in the order to try them.
    fn lookup(&self, host: &str) -> LookupFuture;
}

/// The system resolver (`getaddrinfo`, through [`tokio::net::lookup_host`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn lookup(&self, host: &str) -> LookupFuture {
        let host = host.to_string();
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host.as_str(), 0)).await?;
            Ok(addrs.map(|a| a.ip()).collect())
        })
    }
}

/// How instances connect: TLS roots (loaded once, at the first HTTPS connection) and the
/// resolver. Make it once (per runtime) and share it; it is cheap to clone.
#[derive(Clone)]
pub struct Network {
    inner: Arc<NetworkInner>,
}

struct NetworkInner {
    ca_file: Option<PathBuf>,
    /// The CA file's certificates (already validated).
    extra_roots: Vec<CertificateDer<'static>>,
    tls: OnceLock<Arc<rustls::ClientConfig>>,
    resolver: Arc<dyn Resolve>,
}

impl Default for Network {
    /// The system trust store and the system resolver.
    fn default() -> Self {
        Network {
            inner: Arc::new(NetworkInner {
                ca_file: None,
                extra_roots: Vec::new(),
                tls: OnceLock::new(),
                resolver: Arc::new(SystemResolver),
            }),
        }
    }
}

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Network")
            .field("ca_file", &self.inner.ca_file)
            .field("ca_certificates", &self.inner.extra_roots.len())
            .finish_non_exhaustive()
    }
}

impl Network {
    /// With these TLS settings: the CA file, if any, is read and checked now.
    pub fn new(tls: &TlsOptions) -> Result<Network, NetworkError> {
        let extra_roots = match &tls.ca_file {
            Some(path) => read_ca_file(path)?,
            None => Vec::new(),
        };
        Ok(Network {
            inner: Arc::new(NetworkInner {
                ca_file: tls.ca_file.clone(),
                extra_roots,
                tls: OnceLock::new(),
                resolver: Arc::new(SystemResolver),
            }),
        })
    }

    /// The same, resolving host names with `resolver`.
    pub fn with_resolver(self, resolver: Arc<dyn Resolve>) -> Network {
        Network {
            inner: Arc::new(NetworkInner {
                ca_file: self.inner.ca_file.clone(),
                extra_roots: self.inner.extra_roots.clone(),
                tls: self.inner.tls.clone(),
                resolver,
            }),
        }
    }

    /// The CA file given, if any.
    pub fn ca_file(&self) -> Option<&std::path::Path> {
        self.inner.ca_file.as_deref()
    }

    /// A new, empty pool for one instance: its requests may reach only `allow`, within
    /// `limits` (`max_response_bytes`, `max_concurrent_requests`).
    pub fn pool(&self, allow: Arc<AllowList>, limits: &Limits) -> ConnectionPool {
        let tracker = Arc::new(Tracker::default());
        let connects = Arc::new(AtomicU64::new(0));
        let connector = Connector {
            network: self.clone(),
            allow: allow.clone(),
            connects: connects.clone(),
            tracker: tracker.clone(),
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(MAX_IDLE)
            .pool_max_idle_per_host(MAX_IDLE_PER_HOST)
            // Drops expired idle connections of every destination in the background.
            .pool_timer(TokioTimer::new())
            // A request a stale keep-alive connection handed back unsent (the server closed it
            // while it was idle) is sent again on a new connection.
            .retry_canceled_requests(true)
            .build(connector);
        ConnectionPool {
            client,
            allow,
            tracker,
            slots: Arc::new(Semaphore::new(limits.max_concurrent_requests.max(1))),
            max_response_bytes: limits.max_response_bytes,
            connects,
        }
    }

    pub(super) fn tls_config(&self) -> Arc<rustls::ClientConfig> {
        self.inner
            .tls
            .get_or_init(|| Arc::new(client_config(&self.inner.extra_roots)))
            .clone()
    }
}

/// The PEM certificates of a CA file, each checked to be usable as a trust anchor.
fn read_ca_file(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, NetworkError> {
    let invalid = |reason: String| NetworkError::CaFileInvalid {
        path: path.to_path_buf(),
        reason,
    };
    let pem = std::fs::read(path).map_err(|source| NetworkError::CaFileUnreadable {
        path: path.to_path_buf(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("not a PEM file of certificates: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(
            "no PEM certificate (BEGIN CERTIFICATE) in it".into(),
        ));
    }
    let mut check = rustls::RootCertStore::empty();
    for (i, cert) in certs.iter().enumerate() {
        check
            .add(cert.clone())
            .map_err(|e| invalid(format!("certificate #{}: {e}", i + 1)))?;
    }
    Ok(certs)
}

/// The client TLS configuration: system roots (the compiled-in web roots if there are none),
/// plus `extra` (a CA file's certificates); ring; ALPN http/1.1.
fn client_config(extra: &[CertificateDer<'static>]) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::debug!(error = %e, "loading the system CA certificates");
    }
    let (added, ignored) = roots.add_parsable_certificates(native.certs);
    if roots.is_empty() {
        tracing::info!(
            "no system CA certificates found: trusting the compiled-in web roots (webpki-roots)"
        );
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    } else {
        tracing::debug!(added, ignored, "system CA certificates loaded");
    }
    for cert in extra {
        // Checked when the file was read.
        if let Err(e) = roots.add(cert.clone()) {
            tracing::warn!(error = %e, "a CA file certificate was not added");
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

/// The connections of one instance: hyper-util's pooled client over the instance's
/// connector, the allow-list, the limits. Cheap to clone (clones share everything).
#[derive(Clone)]
pub struct ConnectionPool {
    client: Client<Connector, RequestBody>,
    allow: Arc<AllowList>,
    tracker: Arc<Tracker>,
    slots: Arc<Semaphore>,
    max_response_bytes: u64,
    connects: Arc<AtomicU64>,
}

impl std::fmt::Debug for ConnectionPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ConnectionPool({} idle)", self.idle())
    }
}

/// `http` or `https`, and the destination of a request.
struct Destination {
    tls: bool,
    scheme: &'static str,
    /// The host without brackets (a name, or an IP address).
    host: String,
    /// The host as an IP address, if it is one.
    ip: Option<IpAddr>,
    port: u16,
    /// `scheme://host:port` (IPv6 in brackets), for logs.
    key: String,
}

impl Destination {
    fn of(uri: &http::Uri) -> Result<Destination, Error> {
        let (tls, scheme) = match uri.scheme_str() {
            Some(s) if s.eq_ignore_ascii_case("http") => (false, "http"),
            Some(s) if s.eq_ignore_ascii_case("https") => (true, "https"),
            None => (true, "https"),
            Some(_) => return Err(Error::HttpRequestUriInvalid),
        };
        let host = uri.host().ok_or(Error::HttpRequestUriInvalid)?;
        // `Uri::host` keeps the brackets of an IPv6 address.
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
            .to_ascii_lowercase();
        let ip = host.parse::<IpAddr>().ok();
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let key = match ip {
            Some(IpAddr::V6(_)) => format!("{scheme}://[{host}]:{port}"),
            _ => format!("{scheme}://{host}:{port}"),
        };
        Ok(Destination {
            tls,
            scheme,
            host,
            ip,
            port,
            key,
        })
    }
}

/// The operation header of a request, for logs.
fn operation(request: &http::Request<WasiBody>) -> String {
    request
        .headers()
        .get(clickhouse_component::host_api::OPERATION_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string()
}

/// How much longer than its connect timeout a request waits for a connection before giving up
/// by itself: the connector's own bound (with its more precise error: DNS, connect, TLS) comes
/// first; this one is only a backstop.
const CONNECT_MARGIN: Duration = Duration::from_millis(100);

impl ConnectionPool {
    /// How many idle connections are kept (all destinations): open, carrying no request, idle
    /// for less than 2 s (an older one is never reused).
    pub fn idle(&self) -> usize {
        self.tracker.idle()
    }

    /// How many TCP connections this pool has tried to open (each address tried counts).
    pub fn connect_attempts(&self) -> u64 {
        self.connects.load(Ordering::Relaxed)
    }

    /// Sends a request (`http` or `https`) over a pooled (or new) connection.
    pub async fn send(
        &self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
    ) -> Result<http::Response<WasiBody>, Error> {
        let dest = Destination::of(request.uri())?;
        let op = operation(&request);
        if !self.allow.allows(dest.scheme, &dest.host, dest.port) {
            tracing::warn!(
                op = %op,
                destination = %dest.key,
                allowed = %self.allow,
                "outgoing request denied by the allow-list"
            );
            return Err(Error::HttpRequestDenied);
        }
        let connect_timeout = options
            .and_then(|o| o.connect_timeout)
            .unwrap_or(DEFAULT_TIMEOUT);
        let first_byte_timeout = options
            .and_then(|o| o.first_byte_timeout)
            .unwrap_or(DEFAULT_TIMEOUT);
        let between_bytes_timeout = options
            .and_then(|o| o.between_bytes_timeout)
            .unwrap_or(DEFAULT_TIMEOUT)
            .max(Duration::from_nanos(1));
        // Absolute form with the scheme spelt out: hyper-util keys its pool by scheme and
        // authority, and writes the origin form on the wire itself.
        let (mut parts, body) = request.into_parts();
        let authority = parts
            .uri
            .authority()
            .cloned()
            .ok_or(Error::HttpRequestUriInvalid)?;
        parts.uri = http::Uri::builder()
            .scheme(dest.scheme)
            .authority(authority)
            .path_and_query(parts.uri.path_and_query().map_or("/", |p| p.as_str()))
            .build()
            .map_err(|_| Error::HttpRequestUriInvalid)?;
        let permit = match tokio::time::timeout(connect_timeout, self.slots.clone().acquire_owned())
            .await
        {
            Ok(Ok(permit)) => permit,
            _ => {
                tracing::warn!(
                    op = %op,
                    destination = %dest.key,
                    "outgoing request not sent: the instance's concurrent request limit stayed reached for the connect timeout"
                );
                return Err(Error::ConnectionLimitReached);
            }
        };
        let state = Arc::new(RequestState::default());
        let mut request = http::Request::from_parts(parts, RequestBody::new(body, state.clone()));
        let mut capture = capture_connection(&mut request);
        let context = RequestContext {
            connect_timeout,
            op,
        };
        let response = self.client.request(request);
        // Two phases: until a connection (pooled or new) carries the request, bounded by the
        // connect timeout (the connector bounds its own work by it; see `CONNECT_MARGIN`); then
        // the first-byte timeout, until the response head. (If hyper-util retries a request a
        // stale connection handed back unsent, the new connection's connect time counts in the
        // second phase, still bounded by the connector's own connect timeout.)
        let result = REQUEST
            .scope(context, async {
                tokio::pin!(response);
                tokio::select! {
                    biased;
                    result = &mut response => return result.map_err(|e| request_error(&e, &state)),
                    _ = capture.wait_for_connection_metadata() => {}
                    _ = tokio::time::sleep(connect_timeout + CONNECT_MARGIN) => {
                        return Err(Error::ConnectionTimeout);
                    }
                }
                if let Some(id) = conn_id(capture.connection_metadata().as_ref()) {
                    self.tracker.busy(id);
                }
                match tokio::time::timeout(first_byte_timeout, response).await {
                    Ok(result) => result.map_err(|e| request_error(&e, &state)),
                    Err(_) => Err(Error::ConnectionReadTimeout),
                }
            })
            .await;
        let response = match result {
            Ok(response) => response,
            Err(error) => {
                // The connection that carried it (if any) is closing.
                if let Some(id) = conn_id(capture.connection_metadata().as_ref()) {
                    self.tracker.closed(id);
                }
                return Err(error);
            }
        };
        let conn = response.extensions().get::<ConnId>().copied();
        if let Some(id) = conn {
            self.tracker.busy(id);
        }
        let tracker = self.tracker.clone();
        let max = self.max_response_bytes;
        Ok(response.map(|incoming| {
            ResponseBody::new(
                incoming,
                max,
                between_bytes_timeout,
                conn.map(|id| (tracker, id)),
                permit,
                dest.key,
            )
            .boxed_unsync()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::Empty;
    use std::collections::HashMap;
    use std::sync::atomic::AtomicUsize;
    use std::time::Instant;
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// Answers injected for names; counts lookups.
    #[derive(Default)]
    struct FakeResolver {
        answers: HashMap<String, Vec<IpAddr>>,
        lookups: AtomicUsize,
    }

    impl FakeResolver {
        fn new(answers: &[(&str, &[&str])]) -> Arc<FakeResolver> {
            Arc::new(FakeResolver {
                answers: answers
                    .iter()
                    .map(|(name, ips)| {
                        (
                            name.to_string(),
                            ips.iter().map(|ip| ip.parse().unwrap()).collect(),
                        )
                    })
                    .collect(),
                lookups: AtomicUsize::new(0),
            })
        }
    }

    impl Resolve for FakeResolver {
        fn lookup(&self, host: &str) -> LookupFuture {
            self.lookups.fetch_add(1, Ordering::SeqCst);
            let answer = self.answers.get(host).cloned();
            Box::pin(async move {
                answer.ok_or_else(|| std::io::Error::other("no such host (fake resolver)"))
            })
        }
    }

    fn pool_with(network: Network, allow: &[&str], limits: Limits) -> ConnectionPool {
        network.pool(Arc::new(AllowList::parse(allow).unwrap()), &limits)
    }

    fn get(url: &str) -> http::Request<WasiBody> {
        let uri: http::Uri = url.parse().unwrap();
        http::Request::builder()
            .uri(&uri)
            .header(http::header::HOST, uri.authority().unwrap().as_str())
            .body(Empty::<Bytes>::new().map_err(|e| match e {}).boxed_unsync())
            .unwrap()
    }

    fn timeouts(connect_ms: u64) -> Option<RequestOptions> {
        Some(RequestOptions {
            connect_timeout: Some(Duration::from_millis(connect_ms)),
            first_byte_timeout: Some(Duration::from_secs(10)),
            between_bytes_timeout: Some(Duration::from_secs(10)),
        })
    }

    async fn body_text(response: http::Response<WasiBody>) -> Result<String, Error> {
        let bytes = response.into_body().collect().await?.to_bytes();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Serves `stream`: reads each request head and answers `response`, until the peer closes.
    async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, response: &'static [u8]) {
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
            while let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                head.drain(..end + 4);
                if stream.write_all(response).await.is_err() {
                    return;
                }
            }
        }
    }

    /// A keep-alive HTTP server on `listener` answering `ok` to everything; counts accepted
    /// connections.
    fn ok_server(listener: TcpListener) -> Arc<AtomicUsize> {
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(
                    stream,
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                ));
            }
        });
        accepted
    }

    #[tokio::test]
    async fn a_name_resolving_to_a_metadata_address_is_denied_without_connecting() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let resolver = FakeResolver::new(&[
            ("metadata.test", &["169.254.169.254"]),
            // Rebinding: one good address, one metadata address.
            ("rebound.test", &["127.0.0.1", "169.254.169.254"]),
            ("linklocal.test", &["fe80::1"]),
        ]);
        let network = Network::default().with_resolver(resolver.clone());
        let pool = pool_with(
            network,
            &[&format!("http://*.test:{port}")],
            Limits::default(),
        );
        for name in ["metadata.test", "rebound.test", "linklocal.test"] {
            let e = pool
                .send(get(&format!("http://{name}:{port}/")), timeouts(2_000))
                .await
                .unwrap_err();
            assert!(matches!(e, Error::HttpRequestDenied), "{name}: {e}");
        }
        assert_eq!(resolver.lookups.load(Ordering::SeqCst), 3);
        assert_eq!(pool.connect_attempts(), 0, "no connection may be attempted");
        // Not even to the good address of the rebound name.
        let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
        assert!(accepted.is_err(), "a connection reached the server");

        // An IP-address URL of the metadata service, allowed by `*`, is denied too.
        let any = pool_with(Network::default(), &["*://*:*"], Limits::default());
        let e = any
            .send(
                get("http://169.254.169.254/latest/meta-data/"),
                timeouts(2_000),
            )
            .await
            .unwrap_err();
        assert!(matches!(e, Error::HttpRequestDenied), "{e}");
        assert_eq!(any.connect_attempts(), 0);
    }

    #[tokio::test]
    async fn a_name_resolving_to_an_allowed_address_connects_to_that_address() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = ok_server(listener);
        let resolver = FakeResolver::new(&[("clickhouse.test", &["127.0.0.1"])]);
        let pool = pool_with(
            Network::default().with_resolver(resolver.clone()),
            &[&format!("http://clickhouse.test:{port}")],
            Limits::default(),
        );
        let url = format!("http://clickhouse.test:{port}/?query=SELECT+1");
        for _ in 0..2 {
            let response = pool.send(get(&url), timeouts(2_000)).await.unwrap();
            assert_eq!(response.status(), 200);
            assert_eq!(body_text(response).await.unwrap(), "ok");
        }
        // Resolved once, one connection, reused.
        assert_eq!(resolver.lookups.load(Ordering::SeqCst), 1);
        assert_eq!(pool.connect_attempts(), 1);
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle(), 1);
        // Another port of the same name is not allowed.
        let e = pool
            .send(get("http://clickhouse.test:1/"), timeouts(2_000))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::HttpRequestDenied), "{e}");
        // A name that does not resolve is a DNS error.
        let other = pool_with(
            Network::default().with_resolver(resolver),
            &["http://*:*"],
            Limits::default(),
        );
        let e = other
            .send(get("http://nowhere.test:1/"), timeouts(2_000))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::DnsError { .. }), "{e}");
    }

    #[tokio::test]
    async fn addresses_are_tried_in_order() {
        let Ok(listener) = TcpListener::bind("127.0.0.2:0").await else {
            return; // no 127.0.0.2 here
        };
        let port = listener.local_addr().unwrap().port();
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return; // the same port happens to be open on 127.0.0.1
        }
        let accepted = ok_server(listener);
        // 127.0.0.1:port refuses; 127.0.0.2:port serves.
        let resolver = FakeResolver::new(&[("two.test", &["127.0.0.1", "127.0.0.2"])]);
        let pool = pool_with(
            Network::default().with_resolver(resolver),
            &[&format!("http://two.test:{port}")],
            Limits::default(),
        );
        let response = pool
            .send(get(&format!("http://two.test:{port}/")), timeouts(2_000))
            .await
            .unwrap();
        assert_eq!(body_text(response).await.unwrap(), "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.connect_attempts(), 2);
    }

    #[tokio::test]
    async fn ipv6_hosts_are_dialled_without_double_brackets() {
        let Ok(listener) = TcpListener::bind("[::1]:0").await else {
            return; // no IPv6 loopback here
        };
        let port = listener.local_addr().unwrap().port();
        let accepted = ok_server(listener);
        let pool = pool_with(
            Network::default(),
            &[&format!("http://[::1]:{port}")],
            Limits::default(),
        );
        let response = pool
            .send(get(&format!("http://[::1]:{port}/")), timeouts(2_000))
            .await
            .unwrap();
        assert_eq!(body_text(response).await.unwrap(), "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        // The same through a CIDR entry.
        let pool = pool_with(
            Network::default(),
            &["http://[::]/0:*", "http://127.0.0.0/8:*"],
            Limits::default(),
        );
        let response = pool
            .send(get(&format!("http://[::1]:{port}/")), timeouts(2_000))
            .await
            .unwrap();
        assert_eq!(body_text(response).await.unwrap(), "ok");
    }

    /// A keep-alive HTTP server answering `ok` to everything; counts the connections it
    /// accepted and those the client closed.
    async fn closing_count_server() -> (u16, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicUsize::new(0));
        let (a, c) = (accepted.clone(), closed.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                let c = c.clone();
                tokio::spawn(async move {
                    serve(stream, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
                    c.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        (port, accepted, closed)
    }

    #[tokio::test]
    async fn stale_idle_connections_of_every_destination_are_dropped() {
        let (one, _, closed_one) = closing_count_server().await;
        let (two, _, closed_two) = closing_count_server().await;
        let pool = pool_with(
            Network::default(),
            &["http://127.0.0.1:*"],
            Limits::default(),
        );
        for port in [one, two] {
            let response = pool
                .send(get(&format!("http://127.0.0.1:{port}/")), timeouts(2_000))
                .await
                .unwrap();
            assert_eq!(body_text(response).await.unwrap(), "ok");
        }
        assert_eq!(pool.idle(), 2);
        assert_eq!(pool.connect_attempts(), 2);
        // Past MAX_IDLE neither is reused, and both are closed without any request made.
        tokio::time::sleep(MAX_IDLE + Duration::from_millis(100)).await;
        assert_eq!(pool.idle(), 0);
        let started = Instant::now();
        while closed_one.load(Ordering::SeqCst) + closed_two.load(Ordering::SeqCst) < 2 {
            assert!(
                started.elapsed() < MAX_IDLE * 2,
                "stale idle connections are still open"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let response = pool
            .send(get(&format!("http://127.0.0.1:{one}/")), timeouts(2_000))
            .await
            .unwrap();
        assert_eq!(body_text(response).await.unwrap(), "ok");
        assert_eq!(pool.connect_attempts(), 3, "a stale connection was reused");
    }

    /// A plain-thread HTTP server (it runs while the test's runtime is blocked): on each
    /// connection it answers one request `ok` (keep-alive: no `Connection: close`), then, once
    /// the test says so (`close`), writes a byte to `trigger` and, 20 ms later, closes the
    /// connection.
    fn close_after_first_answer_server(
        close: std::sync::mpsc::Receiver<()>,
        mut trigger: std::os::unix::net::UnixStream,
    ) -> (u16, Arc<AtomicUsize>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().take(2) {
                let Ok(mut stream) = stream else { return };
                count.fetch_add(1, Ordering::SeqCst);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
                if close.recv_timeout(Duration::from_secs(10)).is_err() {
                    return;
                }
                let _ = trigger.write_all(b"!");
                std::thread::sleep(Duration::from_millis(20));
                drop(stream);
            }
        });
        (port, accepted)
    }

    #[tokio::test]
    async fn a_request_on_a_connection_the_server_closed_while_idle_is_retried_on_a_new_one() {
        let (trigger, server_end) = std::os::unix::net::UnixStream::pair().unwrap();
        trigger.set_nonblocking(true).unwrap();
        let trigger = tokio::net::UnixStream::from_std(trigger).unwrap();
        let (close, close_rx) = std::sync::mpsc::channel();
        let (port, accepted) = close_after_first_answer_server(close_rx, server_end);
        let pool = pool_with(
            Network::default(),
            &["http://127.0.0.1:*"],
            Limits::default(),
        );
        let url = format!("http://127.0.0.1:{port}/");
        let response = pool.send(get(&url), timeouts(2_000)).await.unwrap();
        assert_eq!(body_text(response).await.unwrap(), "ok");
        // Let the connection go back to the pool, idle.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(pool.idle(), 1);
        // The server closes the connection just as the next request goes out: while the
        // runtime is blocked, the trigger becomes readable and then the connection's end
        // arrives, so the runtime wakes this task (which sends) before the connection's task
        // (which would have seen the end first).
        close.send(()).unwrap();
        tokio::spawn(async { std::thread::sleep(Duration::from_millis(300)) });
        trigger.readable().await.unwrap();
        let response = pool.send(get(&url), timeouts(2_000)).await.unwrap();
        assert_eq!(body_text(response).await.unwrap(), "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        assert_eq!(pool.connect_attempts(), 2);
        let _ = close.send(());
    }

    /// Never answers.
    struct HangingResolver;

    impl Resolve for HangingResolver {
        fn lookup(&self, _: &str) -> LookupFuture {
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test]
    async fn each_request_brings_its_own_connect_and_first_byte_timeouts() {
        // The connect timeout reaches the connector: a lookup that never ends is a DNS timeout
        // after the request's 300 ms.
        let pool = pool_with(
            Network::default().with_resolver(Arc::new(HangingResolver)),
            &["http://*:*"],
            Limits::default(),
        );
        let started = Instant::now();
        let e = pool
            .send(get("http://slow.test:1/"), timeouts(300))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::DnsTimeout), "{e:?}");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(290) && took < Duration::from_secs(2),
            "{took:?}"
        );
        // A TLS handshake that never ends: a connect timeout.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let pool = pool_with(
            Network::default(),
            &["https://127.0.0.1:*"],
            Limits::default(),
        );
        let started = Instant::now();
        let e = pool
            .send(get(&format!("https://127.0.0.1:{port}/")), timeouts(300))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::ConnectionTimeout), "{e:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
        // An answer that never starts: the first-byte timeout.
        let silent = raw_server(|stream| async move {
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(stream);
        })
        .await;
        let pool = pool_with(
            Network::default(),
            &["http://127.0.0.1:*"],
            Limits::default(),
        );
        let options = Some(RequestOptions {
            connect_timeout: Some(Duration::from_secs(5)),
            first_byte_timeout: Some(Duration::from_millis(300)),
            between_bytes_timeout: Some(Duration::from_secs(5)),
        });
        let started = Instant::now();
        let e = pool
            .send(get(&format!("http://127.0.0.1:{silent}/")), options)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::ConnectionReadTimeout), "{e:?}");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(290) && took < Duration::from_secs(2),
            "{took:?}"
        );
        assert_eq!(pool.idle(), 0);
    }

    /// A server that reads a request's head and then does `answer` with the connection.
    async fn raw_server<F, Fut>(answer: F) -> u16
    where
        F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let answer = Arc::new(answer);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    answer(stream).await;
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn hyper_errors_tell_not_http_from_a_cut_answer() {
        let pool = pool_with(
            Network::default(),
            &["http://127.0.0.1:*"],
            Limits::default(),
        );
        let send = |port: u16| {
            let pool = pool.clone();
            async move {
                pool.send(get(&format!("http://127.0.0.1:{port}/")), timeouts(2_000))
                    .await
                    .map(|_| ())
                    .unwrap_err()
            }
        };
        // Not HTTP at all.
        let ssh = raw_server(|mut stream| async move {
            let _ = stream.write_all(b"SSH-2.0-OpenSSH_9.6\r\n").await;
        })
        .await;
        let e = send(ssh).await;
        assert!(matches!(e, Error::HttpProtocolError), "{e:?}");
        // The request read, the connection closed without an answer.
        let silent = raw_server(|stream| async move { drop(stream) }).await;
        let e = send(silent).await;
        assert!(matches!(e, Error::HttpResponseIncomplete), "{e:?}");
        // Half a status line, then closed.
        let half = raw_server(|mut stream| async move {
            let _ = stream.write_all(b"HTTP/1.1 20").await;
        })
        .await;
        let e = send(half).await;
        assert!(matches!(e, Error::HttpResponseIncomplete), "{e:?}");
        // A head cut inside its header fields.
        let cut_head = raw_server(|mut stream| async move {
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/pl")
                .await;
        })
        .await;
        let e = send(cut_head).await;
        assert!(matches!(e, Error::HttpResponseIncomplete), "{e:?}");
        // Reset (RST) after the request was read.
        let reset = raw_server(|stream| async move {
            let _ = stream.set_zero_linger();
            drop(stream);
        })
        .await;
        let e = send(reset).await;
        assert!(matches!(e, Error::HttpResponseIncomplete), "{e:?}");
        // A head past hyper's limit.
        let huge = raw_server(|mut stream| async move {
            let head = format!("HTTP/1.1 200 OK\r\nX-Big: {}\r\n", "x".repeat(1 << 20));
            let _ = stream.write_all(head.as_bytes()).await;
        })
        .await;
        let e = send(huge).await;
        assert!(
            matches!(e, Error::HttpResponseHeaderSectionSize(_)),
            "{e:?}"
        );
        // A body cut before its declared length.
        let cut = raw_server(|mut stream| async move {
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
                .await;
        })
        .await;
        let response = pool
            .send(get(&format!("http://127.0.0.1:{cut}/")), timeouts(2_000))
            .await
            .unwrap();
        let e = body_text(response).await.unwrap_err();
        assert!(matches!(e, Error::HttpResponseIncomplete), "{e:?}");
        // Accepted and closed before the request was written: nothing was sent.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                drop(stream);
            }
        });
        let e = send(port).await;
        assert!(
            matches!(
                e,
                Error::ConnectionTerminated | Error::HttpResponseIncomplete
            ),
            "{e:?}"
        );
    }

    /// A server answering every request with a 200 and a chunked body that never ends (stops
    /// by itself after 60 s or 1 GiB).
    async fn endless_server() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = stream.read(&mut buf).await;
                    let head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
                    if stream.write_all(head).await.is_err() {
                        return;
                    }
                    let chunk = format!("10000\r\n{}\r\n", "x".repeat(0x10000));
                    let started = Instant::now();
                    for _ in 0..(1 << 14) {
                        if started.elapsed() > Duration::from_secs(60)
                            || stream.write_all(chunk.as_bytes()).await.is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn a_response_body_past_the_cap_fails_and_its_connection_is_dropped() {
        let port = endless_server().await;
        let limits = Limits {
            max_response_bytes: 1 << 20,
            ..Limits::default()
        };
        let pool = pool_with(Network::default(), &["http://127.0.0.1:*"], limits);
        let response = pool
            .send(get(&format!("http://127.0.0.1:{port}/")), timeouts(2_000))
            .await
            .unwrap();
        let mut body = response.into_body();
        let mut read = 0u64;
        let error = loop {
            match body.frame().await {
                Some(Ok(frame)) => read += frame.data_ref().map_or(0, |d| d.len() as u64),
                Some(Err(e)) => break e,
                None => panic!("an endless body ended"),
            }
        };
        assert!(
            matches!(error, Error::HttpResponseBodySize(Some(n)) if n == 1 << 20),
            "{error}"
        );
        assert!(read <= 1 << 20, "{read} bytes passed the cap");
        assert!(
            body.frame().await.is_none(),
            "the body ends after its error"
        );
        assert_eq!(pool.idle(), 0, "the connection must not be pooled");
        // A declared length past the cap fails at the first read.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(
                    stream,
                    b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\nxx",
                ));
            }
        });
        let response = pool
            .send(get(&format!("http://127.0.0.1:{port}/")), timeouts(2_000))
            .await
            .unwrap();
        let e = body_text(response).await.unwrap_err();
        assert!(matches!(e, Error::HttpResponseBodySize(_)), "{e}");
    }

    #[tokio::test]
    async fn requests_beyond_the_concurrency_limit_wait_for_a_slot() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        ok_server(listener);
        let limits = Limits {
            max_concurrent_requests: 1,
            ..Limits::default()
        };
        let pool = pool_with(Network::default(), &["http://127.0.0.1:*"], limits);
        let url = format!("http://127.0.0.1:{port}/");
        // The first response's body is not read: it holds the only slot.
        let first = pool.send(get(&url), timeouts(300)).await.unwrap();
        let started = Instant::now();
        let e = pool.send(get(&url), timeouts(300)).await.unwrap_err();
        assert!(matches!(e, Error::ConnectionLimitReached), "{e}");
        assert!(started.elapsed() >= Duration::from_millis(250));
        // A waiting request goes on once the slot is free.
        let waiting = tokio::spawn({
            let pool = pool.clone();
            let url = url.clone();
            async move { body_text(pool.send(get(&url), timeouts(5_000)).await?).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished());
        assert_eq!(body_text(first).await.unwrap(), "ok");
        assert_eq!(waiting.await.unwrap().unwrap(), "ok");
    }

    /// A CA, and a TLS server configuration for `name` signed by it.
    fn test_pki(name: &str) -> (String, Arc<rustls::ServerConfig>) {
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "pool test CA");
        ca.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let ca =
            rcgen::CertifiedIssuer::self_signed(ca, rcgen::KeyPair::generate().unwrap()).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut leaf = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let leaf = leaf.signed_by(&key, &ca).unwrap();
        let mut server = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        (ca.pem(), Arc::new(server))
    }

    #[tokio::test]
    async fn tls_connections_are_verified_pooled_and_their_errors_classified() {
        let (ca_pem, server) = test_pki("localhost");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            let acceptor = tokio_rustls::TlsAcceptor::from(server);
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(stream).await {
                        serve(tls, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
                    }
                });
            }
        });
        let resolver = FakeResolver::new(&[("localhost", &["127.0.0.1"])]);
        let url = format!("https://localhost:{port}/");
        let allow = [format!("https://localhost:{port}")];
        let allow = [allow[0].as_str()];

        // Without the CA: the certificate is rejected.
        let untrusting = pool_with(
            Network::default().with_resolver(resolver.clone()),
            &allow,
            Limits::default(),
        );
        let e = untrusting
            .send(get(&url), timeouts(5_000))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::TlsCertificateError), "{e}");

        // With it: two requests over one TLS connection.
        let dir = std::env::temp_dir().join(format!("pool-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, &ca_pem).unwrap();
        let network = Network::new(&TlsOptions {
            ca_file: Some(ca_file.clone()),
        })
        .unwrap()
        .with_resolver(resolver.clone());
        let before = accepted.load(Ordering::SeqCst);
        let pool = pool_with(network.clone(), &allow, Limits::default());
        for _ in 0..2 {
            let response = pool.send(get(&url), timeouts(5_000)).await.unwrap();
            assert_eq!(body_text(response).await.unwrap(), "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst) - before, 1);

        // A name the certificate does not cover: rejected too.
        let resolver = FakeResolver::new(&[("other.test", &["127.0.0.1"])]);
        let pool = pool_with(
            network.clone().with_resolver(resolver),
            &["https://other.test:*"],
            Limits::default(),
        );
        let e = pool
            .send(get(&format!("https://other.test:{port}/")), timeouts(5_000))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::TlsCertificateError), "{e}");

        // A plain-HTTP server on an https URL: a protocol error.
        let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let plain_port = plain.local_addr().unwrap().port();
        tokio::spawn(async move {
            // Answers whatever comes first (a ClientHello here) as a web server would.
            while let Ok((mut stream, _)) = plain.accept().await {
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf).await;
                let _ = stream
                    .write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
                    .await;
            }
        });
        let pool = pool_with(network, &["https://127.0.0.1:*"], Limits::default());
        let e = pool
            .send(
                get(&format!("https://127.0.0.1:{plain_port}/")),
                timeouts(5_000),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::TlsProtocolError | Error::TlsAlertReceived { .. }),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_ca_files_are_refused_up_front() {
        let dir = std::env::temp_dir().join(format!("pool-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.pem");
        let e = Network::new(&TlsOptions {
            ca_file: Some(missing),
        })
        .unwrap_err();
        assert!(matches!(e, NetworkError::CaFileUnreadable { .. }), "{e}");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = Network::new(&TlsOptions {
            ca_file: Some(empty),
        })
        .unwrap_err();
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
        let garbage = dir.join("garbage.pem");
        std::fs::write(
            &garbage,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let e = Network::new(&TlsOptions {
            ca_file: Some(garbage),
        })
        .unwrap_err();
        assert!(matches!(e, NetworkError::CaFileInvalid { .. }), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
