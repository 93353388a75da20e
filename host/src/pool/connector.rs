//! The connector of an instance's pooled client (a tower `Service<Uri>`, as hyper-util's
//! `Client` wants): resolves the name once, checks every address against the allow-list, dials
//! the checked addresses in order, `TCP_NODELAY`, TLS. hyper-util calls it only when no idle
//! connection can carry a request.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use wasmtime_wasi_http::Error;

use super::{Destination, Network, Tracker, DEFAULT_TIMEOUT};
use crate::allow_list::AllowList;

tokio::task_local! {
    /// The request being sent, for the connector: hyper-util hands a connector only the
    /// destination `Uri`, so the request's own connect timeout (and its operation, for logs)
    /// travel as a task-local around `Client::request`. hyper-util calls the connector inside
    /// the first poll of that future (a lazy connect), so [`Connector::call`] reads it there and
    /// the connect future keeps its copy, even if hyper-util later finishes it in the
    /// background.
    pub(super) static REQUEST: RequestContext;
}

/// What the connector needs to know of the request that asked for a connection.
#[derive(Clone, Debug)]
pub(super) struct RequestContext {
    /// Bounds resolving, connecting and the TLS handshake together.
    pub connect_timeout: Duration,
    /// The operation header, for logs.
    pub op: String,
}

/// Dials destinations for one instance's client. Cheap to clone (clones share everything).
#[derive(Clone)]
pub(super) struct Connector {
    pub network: Network,
    pub allow: Arc<AllowList>,
    /// TCP connections tried (each address counts).
    pub connects: Arc<AtomicU64>,
    pub tracker: Arc<Tracker>,
}

/// A failed connect, as the wasi:http error to give the guest. hyper-util boxes a connector's
/// error as a `dyn Error`, which can only be borrowed back: the error is taken out of its cell
/// once ([`Failure::take`]).
#[derive(Debug)]
pub(super) struct Failure {
    error: Mutex<Option<Error>>,
    text: String,
}

impl Failure {
    /// Carries `error`.
    pub fn of(error: Error) -> Failure {
        Failure {
            text: error.to_string(),
            error: Mutex::new(Some(error)),
        }
    }

    /// Only names `error` (kept elsewhere).
    pub fn mention(error: &Error) -> Failure {
        Failure {
            text: error.to_string(),
            error: Mutex::new(None),
        }
    }

    /// The error (once; later a copy of its text as an internal error).
    pub fn take(&self) -> Error {
        self.error
            .lock()
            .ok()
            .and_then(|mut e| e.take())
            .unwrap_or_else(|| Error::InternalError(Some(self.text.clone())))
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for Failure {}

type ConnectFuture = Pin<Box<dyn Future<Output = Result<TokioIo<Conn>, Failure>> + Send>>;

impl tower_service::Service<http::Uri> for Connector {
    type Response = TokioIo<Conn>;
    type Error = Failure;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> ConnectFuture {
        let context = REQUEST.try_with(Clone::clone).unwrap_or(RequestContext {
            connect_timeout: DEFAULT_TIMEOUT,
            op: "-".into(),
        });
        let this = self.clone();
        Box::pin(async move {
            let dest = Destination::of(&uri).map_err(Failure::of)?;
            this.connect(&dest, &context)
                .await
                .map(TokioIo::new)
                .map_err(Failure::of)
        })
    }
}

impl Connector {
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

    /// Opens a connection to `dest` (resolving, checking, connecting, TLS), all within the
    /// request's connect timeout.
    async fn connect(&self, dest: &Destination, context: &RequestContext) -> Result<Conn, Error> {
        let op = context.op.as_str();
        let deadline = tokio::time::Instant::now() + context.connect_timeout;
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
                    last_error = Some(io::Error::from(io::ErrorKind::TimedOut));
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
                Some(e) if e.kind() == io::ErrorKind::ConnectionRefused => Error::ConnectionRefused,
                Some(e) => Error::Connect(e),
                None => Error::ConnectionRefused,
            });
        };
        let _ = stream.set_nodelay(true);
        if !dest.tls {
            return Ok(self.tracker.open(Box::new(stream)));
        }
        let name = match dest.ip {
            Some(ip) => ServerName::IpAddress(ip.into()),
            None => {
                ServerName::try_from(dest.host.clone()).map_err(|_| Error::HttpRequestUriInvalid)?
            }
        };
        let connector = tokio_rustls::TlsConnector::from(self.network.tls_config());
        match tokio::time::timeout_at(deadline, connector.connect(name, stream)).await {
            Err(_) => Err(Error::ConnectionTimeout),
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
                Err(error)
            }
            Ok(Ok(tls)) => Ok(self.tracker.open(Box::new(tls))),
        }
    }
}

/// The wasi:http error for a failed TLS handshake.
fn tls_error(e: &io::Error) -> Error {
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

/// A plain or TLS connection.
pub(super) trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// Which connection a response came over (the connector's `Connected::extra`, which hyper-util
/// copies into each response's extensions and into a captured connection's metadata).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct ConnId(pub u64);

/// One open connection: counted by the pool's [`Tracker`] until hyper drops it.
pub(super) struct Conn {
    pub stream: Box<dyn Stream>,
    pub id: ConnId,
    pub tracker: Arc<Tracker>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.tracker.closed(self.id);
    }
}

impl Connection for Conn {
    fn connected(&self) -> Connected {
        Connected::new().extra(self.id)
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.stream).poll_shutdown(cx)
    }
}
