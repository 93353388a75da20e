//! Keep-alive connections for plain-HTTP requests of one component instance (the wasi:http
//! `send_request` hook's transport): `TCP_NODELAY`, connect / first-byte / between-bytes
//! timeouts per request, idle connections reused per `host:port`. A connection goes back to the
//! pool only after its response body was read to the end; one whose body was not is dropped.
//! HTTPS requests use wasmtime-wasi-http's default path (a new TLS connection each time).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::client::conn::http1::SendRequest;
use tokio::net::TcpStream;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody};

/// Most idle connections kept per destination.
const MAX_IDLE_PER_HOST: usize = 16;
/// An idle connection older than this is not reused (servers close idle keep-alive connections
/// after their own timeout, ClickHouse's default being 10 s or more; reusing one just as the
/// server closes it would fail the request).
const MAX_IDLE: Duration = Duration::from_secs(2);
/// Used when a request has no timeout of its own (wasmtime-wasi-http's default).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// Idle connections by `host:port`.
#[derive(Clone, Default)]
pub struct ConnectionPool {
    idle: Arc<Mutex<HashMap<String, Vec<IdleConnection>>>>,
}

/// A connection ready for another request, and since when it has been idle.
type IdleConnection = (SendRequest<WasiBody>, Instant);

impl std::fmt::Debug for ConnectionPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let idle: usize = self
            .idle
            .lock()
            .map(|m| m.values().map(Vec::len).sum())
            .unwrap_or(0);
        write!(f, "ConnectionPool({idle} idle)")
    }
}

impl ConnectionPool {
    /// An idle, ready connection to `authority`, if any.
    fn take(&self, authority: &str) -> Option<SendRequest<WasiBody>> {
        let mut idle = self.idle.lock().ok()?;
        let list = idle.get_mut(authority)?;
        while let Some((sender, since)) = list.pop() {
            if sender.is_ready() && since.elapsed() < MAX_IDLE {
                return Some(sender);
            }
        }
        None
    }

    fn put(&self, authority: String, sender: SendRequest<WasiBody>) {
        if let Ok(mut idle) = self.idle.lock() {
            let list = idle.entry(authority).or_default();
            if list.len() < MAX_IDLE_PER_HOST {
                list.push((sender, Instant::now()));
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

    async fn connect(
        &self,
        authority: &str,
        connect_timeout: Duration,
    ) -> Result<SendRequest<WasiBody>, Error> {
        let stream =
            match tokio::time::timeout(connect_timeout, TcpStream::connect(authority)).await {
                Ok(stream) => stream.map_err(|e| match e.kind() {
                    std::io::ErrorKind::ConnectionRefused => Error::ConnectionRefused,
                    _ => Error::Connect(e),
                })?,
                Err(_) => return Err(Error::ConnectionTimeout),
            };
        let _ = stream.set_nodelay(true);
        let (sender, connection) = tokio::time::timeout(
            connect_timeout,
            hyper::client::conn::http1::Builder::new().handshake(TokioIo::new(stream)),
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

    /// Sends a plain-HTTP request over a pooled (or new) connection.
    pub async fn send(
        &self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
    ) -> Result<http::Response<WasiBody>, Error> {
        let uri = request.uri();
        let host = uri.host().ok_or(Error::HttpRequestUriInvalid)?.to_string();
        let port = uri.port_u16().unwrap_or(80);
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
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
        let mut sender = match self.take(&authority) {
            Some(sender) => sender,
            None => self.connect(&authority, connect_timeout).await?,
        };
        let response = tokio::time::timeout(first_byte_timeout, sender.send_request(request))
            .await
            .map_err(|_| Error::ConnectionReadTimeout)?
            .map_err(Error::from)?;
        let mut timeout = tokio::time::interval(between_bytes_timeout);
        timeout.reset();
        let pool = self.clone();
        Ok(response.map(|incoming| {
            PooledBody {
                incoming,
                timeout,
                release: Some((pool, authority, sender)),
            }
            .boxed_unsync()
        }))
    }
}

/// A response body that enforces the between-bytes timeout and gives its connection back to the
/// pool once it has been read to the end.
struct PooledBody {
    incoming: hyper::body::Incoming,
    timeout: tokio::time::Interval,
    release: Option<(ConnectionPool, String, SendRequest<WasiBody>)>,
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        match Pin::new(&mut self.incoming).poll_frame(cx) {
            Poll::Ready(None) => {
                if let Some((pool, authority, sender)) = self.release.take() {
                    pool.put(authority, sender);
                }
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                self.release = None;
                Poll::Ready(Some(Err(if e.is_timeout() {
                    Error::HttpResponseTimeout
                } else {
                    Error::from(e)
                })))
            }
            Poll::Ready(Some(Ok(frame))) => {
                self.timeout.reset();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                ready!(self.timeout.poll_tick(cx));
                self.release = None;
                Poll::Ready(Some(Err(Error::ConnectionReadTimeout)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.incoming.size_hint()
    }
}
