//! The outgoing network path of one component instance (the wasi:http `send_request` hook's
//! transport), for `http` and `https` alike:
//!
//! * **Allow-list, by URL then by address.** The host is checked by name
//!   ([`AllowList::allows`]), resolved once (through a [`Resolve`], the system resolver by
//!   default), every address it resolved to is checked ([`AllowList::check_address`]: link-local
//!   and cloud metadata addresses are refused unless listed explicitly), and only then are the
//!   checked addresses dialled, in order. The name is never resolved again, so a DNS answer that
//!   changes between the check and the connection (DNS rebinding) cannot reach another address.
//!   A refusal fails the request with `HttpRequestDenied` and opens no connection.
//! * **Keep-alive.** Idle connections are reused per `scheme://host:port` (a reused connection
//!   was checked when it was opened); one goes back to the pool only after its response body was
//!   read to the end. Idle connections older than [`MAX_IDLE`] are dropped, for every
//!   destination, whenever a request is made.
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
//!   and HTTP handshakes together; first-byte and between-bytes timeouts.
//!
//! A [`Network`] (TLS roots, resolver) is made once and shared; each instance gets its own
//! [`ConnectionPool`] from [`Network::pool`].

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::client::conn::http1::SendRequest;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody};

use crate::allow_list::AllowList;
use crate::limits::Limits;

/// Most idle connections kept per destination.
const MAX_IDLE_PER_HOST: usize = 16;
/// An idle connection older than this is not reused (servers close idle keep-alive connections
/// after their own timeout, ClickHouse's default being 10 s or more; reusing one just as the
/// server closes it would fail the request).
pub const MAX_IDLE: Duration = Duration::from_secs(2);
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
        ConnectionPool {
            network: self.clone(),
            allow,
            idle: Arc::default(),
            slots: Arc::new(Semaphore::new(limits.max_concurrent_requests.max(1))),
            max_response_bytes: limits.max_response_bytes,
            connects: Arc::default(),
        }
    }

    fn tls_config(&self) -> Arc<rustls::ClientConfig> {
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

/// The wasi:http error for a failed TLS handshake.
fn tls_error(e: &std::io::Error) -> Error {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(_)) => Error::TlsCertificateError,
        Some(rustls::Error::AlertReceived(alert)) => Error::TlsAlertReceived {
            alert_id: Some(alert.to_array()[0]),
            alert_message: Some(format!("{alert:?}")),
        },
        _ => Error::TlsProtocolError,
    }
}

/// A connection ready for another request, and since when it has been idle.
type IdleConnection = (SendRequest<WasiBody>, Instant);

/// The connections of one instance: idle ones by `scheme://host:port`, the allow-list, the
/// limits. Cheap to clone (clones share everything).
#[derive(Clone)]
pub struct ConnectionPool {
    network: Network,
    allow: Arc<AllowList>,
    idle: Arc<Mutex<HashMap<String, Vec<IdleConnection>>>>,
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
    /// The pool key: `scheme://host:port` (IPv6 in brackets).
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
        .get(clickhouse_component::client::request::OPERATION_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string()
}

impl ConnectionPool {
    /// An idle, ready connection to `key`, if any; drops every stale idle connection (of any
    /// destination) on the way.
    fn take(&self, key: &str) -> Option<SendRequest<WasiBody>> {
        let mut idle = self.idle.lock().ok()?;
        idle.retain(|_, list| {
            list.retain(|(sender, since)| since.elapsed() < MAX_IDLE && !sender.is_closed());
            !list.is_empty()
        });
        let list = idle.get_mut(key)?;
        while let Some((sender, _)) = list.pop() {
            if sender.is_ready() {
                return Some(sender);
            }
        }
        None
    }

    fn put(&self, key: String, sender: SendRequest<WasiBody>) {
        self.put_since(key, sender, Instant::now());
    }

    fn put_since(&self, key: String, sender: SendRequest<WasiBody>, since: Instant) {
        if let Ok(mut idle) = self.idle.lock() {
            let list = idle.entry(key).or_default();
            if list.len() < MAX_IDLE_PER_HOST {
                list.push((sender, since));
            }
        }
    }

    /// How many idle connections are kept (all destinations).
    pub fn idle(&self) -> usize {
        self.idle
            .lock()
            .map(|m| m.values().map(Vec::len).sum())
            .unwrap_or(0)
    }

    /// How many TCP connections this pool has tried to open (each address tried counts).
    pub fn connect_attempts(&self) -> u64 {
        self.connects.load(Ordering::Relaxed)
    }

    /// The addresses to dial for `dest`: its IP address, or its name resolved once; every one
    /// checked against the allow-list (any refused one fails the request, before any
    /// connection).
    async fn addresses(
        &self,
        dest: &Destination,
        op: &str,
        deadline: tokio::time::Instant,
    ) -> Result<Vec<SocketAddr>, Error> {
        let ips = match dest.ip {
            Some(ip) => vec![ip],
            None => {
                let lookup = self.network.inner.resolver.lookup(&dest.host);
                match tokio::time::timeout_at(deadline, lookup).await {
                    Err(_) => return Err(Error::DnsTimeout),
                    Ok(Err(e)) => {
                        return Err(Error::DnsError {
                            rcode: Some(e.to_string()),
                            info_code: None,
                        })
                    }
                    Ok(Ok(ips)) if ips.is_empty() => {
                        return Err(Error::DnsError {
                            rcode: Some("no address".into()),
                            info_code: None,
                        })
                    }
                    Ok(Ok(ips)) => ips,
                }
            }
        };
        for ip in &ips {
            if let Err(reason) = self
                .allow
                .check_address(dest.scheme, &dest.host, dest.port, *ip)
            {
                tracing::warn!(
                    op = %op,
                    destination = %dest.key,
                    address = %ip,
                    reason = %reason,
                    allowed = %self.allow,
                    "outgoing request denied by the allow-list: the host resolved to a refused address"
                );
                return Err(Error::HttpRequestDenied);
            }
        }
        Ok(ips
            .into_iter()
            .map(|ip| SocketAddr::new(ip, dest.port))
            .collect())
    }

    /// Opens a connection to `dest` (resolving, checking, connecting, TLS and HTTP
    /// handshakes), all within `connect_timeout`.
    async fn connect(
        &self,
        dest: &Destination,
        op: &str,
        connect_timeout: Duration,
    ) -> Result<SendRequest<WasiBody>, Error> {
        let deadline = tokio::time::Instant::now() + connect_timeout;
        let addrs = self.addresses(dest, op, deadline).await?;
        let mut last_error = None;
        let mut stream = None;
        let count = addrs.len();
        for (i, addr) in addrs.into_iter().enumerate() {
            self.connects.fetch_add(1, Ordering::Relaxed);
            // Each address gets an equal share of the time left, the last one all of it (so an
            // address that drops packets does not starve the next ones).
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let shares = u32::try_from(count - i).unwrap_or(u32::MAX);
            let attempt_deadline = tokio::time::Instant::now() + left / shares;
            match tokio::time::timeout_at(attempt_deadline, TcpStream::connect(addr)).await {
                Err(_) if i + 1 == count => return Err(Error::ConnectionTimeout),
                Err(_) => {
                    tracing::debug!(destination = %dest.key, address = %addr, "connect timed out, trying the next address");
                    last_error = Some(std::io::Error::from(std::io::ErrorKind::TimedOut));
                }
                Ok(Ok(s)) => {
                    stream = Some(s);
                    break;
                }
                Ok(Err(e)) => {
                    tracing::debug!(destination = %dest.key, address = %addr, error = %e, "connect failed");
                    last_error = Some(e);
                }
            }
        }
        let Some(stream) = stream else {
            return Err(match last_error {
                Some(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    Error::ConnectionRefused
                }
                Some(e) => Error::Connect(e),
                None => Error::ConnectionRefused,
            });
        };
        let _ = stream.set_nodelay(true);
        if !dest.tls {
            return handshake(stream, deadline).await;
        }
        let name = match dest.ip {
            Some(ip) => ServerName::IpAddress(ip.into()),
            None => {
                ServerName::try_from(dest.host.clone()).map_err(|_| Error::HttpRequestUriInvalid)?
            }
        };
        let connector = tokio_rustls::TlsConnector::from(self.network.tls_config());
        let tls = match tokio::time::timeout_at(deadline, connector.connect(name, stream)).await {
            Err(_) => return Err(Error::ConnectionTimeout),
            Ok(Err(e)) => {
                let error = tls_error(&e);
                tracing::warn!(
                    op = %op,
                    destination = %dest.key,
                    error = %e,
                    code = %error,
                    ca_file = ?self.network.ca_file(),
                    "TLS handshake failed"
                );
                return Err(error);
            }
            Ok(Ok(tls)) => tls,
        };
        handshake(tls, deadline).await
    }

    /// Sends a request (`http` or `https`) over a pooled (or new) connection.
    pub async fn send(
        &self,
        mut request: http::Request<WasiBody>,
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
        // Origin-form request target: the scheme and authority are the connection's business.
        *request.uri_mut() = http::Uri::builder()
            .path_and_query(
                request
                    .uri()
                    .path_and_query()
                    .map(|p| p.as_str())
                    .unwrap_or("/"),
            )
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
        let mut sender = match self.take(&dest.key) {
            Some(sender) => sender,
            None => self.connect(&dest, &op, connect_timeout).await?,
        };
        let response = tokio::time::timeout(first_byte_timeout, sender.send_request(request))
            .await
            .map_err(|_| Error::ConnectionReadTimeout)?
            .map_err(Error::from)?;
        let mut timeout = tokio::time::interval(between_bytes_timeout);
        timeout.reset();
        let pool = self.clone();
        let max = self.max_response_bytes;
        Ok(response.map(|incoming| {
            PooledBody {
                incoming: Some(incoming),
                timeout,
                read: 0,
                max,
                release: Some((pool, dest.key, sender)),
                permit: Some(permit),
            }
            .boxed_unsync()
        }))
    }
}

/// The HTTP/1.1 handshake on an open connection, whose driver then runs as its own task.
async fn handshake<T>(io: T, deadline: tokio::time::Instant) -> Result<SendRequest<WasiBody>, Error>
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (sender, connection) = tokio::time::timeout_at(
        deadline,
        hyper::client::conn::http1::Builder::new().handshake(TokioIo::new(io)),
    )
    .await
    .map_err(|_| Error::ConnectionTimeout)??;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "pooled connection closed");
        }
    });
    Ok(sender)
}

/// A response body that enforces the between-bytes timeout and the size cap, holds its request's
/// slot, and gives its connection back to the pool once it has been read to the end.
struct PooledBody {
    /// `None` once failed (the connection is dropped with it).
    incoming: Option<hyper::body::Incoming>,
    timeout: tokio::time::Interval,
    read: u64,
    max: u64,
    release: Option<(ConnectionPool, String, SendRequest<WasiBody>)>,
    permit: Option<OwnedSemaphorePermit>,
}

impl PooledBody {
    /// Ends the body with an error: the connection is dropped, not pooled.
    fn fail(&mut self, error: Error) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        self.incoming = None;
        self.release = None;
        self.permit = None;
        Poll::Ready(Some(Err(error)))
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = &mut *self;
        let Some(incoming) = this.incoming.as_mut() else {
            return Poll::Ready(None);
        };
        if this.read == 0 && incoming.size_hint().lower() > this.max {
            return this.fail(Error::HttpResponseBodySize(Some(this.max)));
        }
        match Pin::new(incoming).poll_frame(cx) {
            Poll::Ready(None) => {
                this.incoming = None;
                this.permit = None;
                if let Some((pool, key, sender)) = this.release.take() {
                    pool.put(key, sender);
                }
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => this.fail(if e.is_timeout() {
                Error::HttpResponseTimeout
            } else {
                Error::from(e)
            }),
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.read = this.read.saturating_add(data.len() as u64);
                    if this.read > this.max {
                        tracing::warn!(
                            destination = this.release.as_ref().map_or("-", |(_, key, _)| key.as_str()),
                            limit = this.max,
                            "response body exceeds the instance's limit (max_response_bytes): connection dropped"
                        );
                        return this.fail(Error::HttpResponseBodySize(Some(this.max)));
                    }
                }
                this.timeout.reset();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                ready!(this.timeout.poll_tick(cx));
                this.fail(Error::ConnectionReadTimeout)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.as_ref().is_none_or(|i| i.is_end_stream())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.incoming
            .as_ref()
            .map_or_else(|| http_body::SizeHint::with_exact(0), |i| i.size_hint())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Empty;
    use std::sync::atomic::AtomicUsize;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

    #[tokio::test]
    async fn stale_idle_connections_of_every_destination_are_dropped() {
        let any = AllowList::parse(["*://*:*"]).unwrap();
        let pool = Network::default().pool(Arc::new(any), &Limits::default());
        for key in ["http://a:1", "http://b:2"] {
            let (client, server) = tokio::io::duplex(1024);
            tokio::spawn(serve(
                server,
                b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            ));
            let sender = handshake(client, tokio::time::Instant::now() + Duration::from_secs(5))
                .await
                .unwrap();
            let long_ago = Instant::now()
                .checked_sub(MAX_IDLE * 2)
                .expect("the clock runs long enough");
            pool.put_since(key.to_string(), sender, long_ago);
        }
        assert_eq!(pool.idle(), 2);
        // A request to a third destination drops both.
        assert!(pool.take("http://c:3").is_none());
        assert_eq!(pool.idle(), 0);
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
