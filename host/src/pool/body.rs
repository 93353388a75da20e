//! The bodies around a pooled request and its response, the accounting of open connections,
//! and the mapping of hyper's errors to wasi:http's.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{LengthLimitError, Limited};
use tokio::sync::OwnedSemaphorePermit;
use wasmtime_wasi_http::{Error, WasiBody};

use super::connector::{Conn, ConnId, Failure, Stream};
use super::MAX_IDLE;

/// What the pool knows of its open connections (hyper-util's pool does not say): each one is
/// idle (since when) or carrying a request. A connection leaves the table when hyper drops it,
/// or as soon as it is known to be closing (its request failed, or its response body failed or
/// was dropped before its end: hyper closes such a connection).
#[derive(Default)]
pub(super) struct Tracker {
    next: AtomicU64,
    conns: Mutex<HashMap<ConnId, ConnState>>,
}

#[derive(Clone, Copy)]
enum ConnState {
    Idle(Instant),
    Busy,
}

impl Tracker {
    /// A new connection, idle until a request takes it.
    pub fn open(self: &Arc<Self>, stream: Box<dyn Stream>) -> Conn {
        let id = ConnId(self.next.fetch_add(1, Ordering::Relaxed));
        self.with(|conns| conns.insert(id, ConnState::Idle(Instant::now())));
        Conn {
            stream,
            id,
            tracker: self.clone(),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<ConnId, ConnState>) -> T) -> Option<T> {
        self.conns.lock().ok().map(|mut conns| f(&mut conns))
    }

    fn set(&self, id: ConnId, state: ConnState) {
        self.with(|conns| conns.get_mut(&id).map(|s| *s = state));
    }

    /// A request took the connection.
    pub fn busy(&self, id: ConnId) {
        self.set(id, ConnState::Busy);
    }

    /// Its response was read to the end: idle again (hyper-util pools it).
    pub fn released(&self, id: ConnId) {
        self.set(id, ConnState::Idle(Instant::now()));
    }

    /// It is closing (or closed).
    pub fn closed(&self, id: ConnId) {
        self.with(|conns| conns.remove(&id));
    }

    /// Open connections idle for less than [`MAX_IDLE`] (older ones are never reused: hyper-util
    /// checks their age at checkout, and drops them in the background).
    pub fn idle(&self) -> usize {
        self.with(|conns| {
            conns
                .values()
                .filter(|s| matches!(s, ConnState::Idle(since) if since.elapsed() < MAX_IDLE))
                .count()
        })
        .unwrap_or(0)
    }
}

/// Whether hyper began writing a request, and its body's own error.
#[derive(Default)]
pub(super) struct RequestState {
    written: AtomicBool,
    error: Mutex<Option<Error>>,
}

impl RequestState {
    /// Whether hyper took the request to write it. hyper asks a body `is_end_stream` (and
    /// `size_hint`) when it starts writing the request head, never before: a request that
    /// hyper hands back unsent (a stale keep-alive connection) never asked.
    pub fn written(&self) -> bool {
        self.written.load(Ordering::Relaxed)
    }

    fn write(&self) {
        self.written.store(true, Ordering::Relaxed);
    }
}

/// The request body as hyper sees it: notes when hyper starts on it; keeps the body's own error
/// (given to the guest as it is, hyper only carries a copy of its text).
pub(super) struct RequestBody {
    inner: WasiBody,
    state: Arc<RequestState>,
}

impl RequestBody {
    pub fn new(inner: WasiBody, state: Arc<RequestState>) -> RequestBody {
        RequestBody { inner, state }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = Failure;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Failure>>> {
        self.state.write();
        match ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
            Some(Err(e)) => {
                let failure = Failure::mention(&e);
                if let Ok(mut slot) = self.state.error.lock() {
                    *slot = Some(e);
                }
                Poll::Ready(Some(Err(failure)))
            }
            Some(Ok(frame)) => Poll::Ready(Some(Ok(frame))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.state.write();
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.state.write();
        self.inner.size_hint()
    }
}

/// An error's sources, from `first` down.
fn sources<'a>(
    first: Option<&'a (dyn StdError + 'static)>,
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(first, |s| (*s).source())
}

/// The wasi:http error for a request hyper-util could not send or get an answer to.
pub(super) fn request_error(e: &hyper_util::client::legacy::Error, state: &RequestState) -> Error {
    let chain = || sources(e.source());
    // Ours first: a connector's failure, or the request body's own error.
    if chain().any(|s| s.is::<Failure>()) {
        if let Some(error) = state.error.lock().ok().and_then(|mut slot| slot.take()) {
            return error;
        }
        if let Some(failure) = chain().find_map(|s| s.downcast_ref::<Failure>()) {
            return failure.take();
        }
    }
    if let Some(h) = chain().find_map(|s| s.downcast_ref::<hyper::Error>()) {
        return hyper_error(h, state.written(), false);
    }
    tracing::warn!(error = ?e, "outgoing request failed");
    Error::HttpProtocolError
}

/// The wasi:http error for a hyper error: `written` tells whether the request had started on
/// the wire, `in_body` whether the response head had been read.
pub(super) fn hyper_error(h: &hyper::Error, written: bool, in_body: bool) -> Error {
    if h.is_timeout() {
        return if in_body {
            Error::HttpResponseTimeout
        } else {
            Error::ConnectionReadTimeout
        };
    }
    if h.is_parse_too_large() {
        return Error::HttpResponseHeaderSectionSize(None);
    }
    if h.is_parse() || h.is_parse_status() {
        tracing::debug!(error = %h, "the server's answer is not HTTP/1.1");
        return Error::HttpProtocolError;
    }
    let cut = h.is_incomplete_message()
        || h.is_closed()
        || h.is_canceled()
        || sources(h.source())
            .filter_map(|s| s.downcast_ref::<std::io::Error>())
            .any(|io| {
                matches!(
                    io.kind(),
                    std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::BrokenPipe
                        | std::io::ErrorKind::UnexpectedEof
                )
            });
    if cut {
        tracing::debug!(error = %h, written, "the connection ended before the whole answer");
        return if written || in_body {
            Error::HttpResponseIncomplete
        } else {
            Error::ConnectionTerminated
        };
    }
    tracing::warn!(error = ?h, "hyper error");
    Error::HttpProtocolError
}

/// A response body that enforces the between-bytes timeout and the size cap (declared or
/// read), holds its request's slot, and tells the tracker when its connection is idle again
/// (read to the end) or closing (failed or dropped before its end).
pub(super) struct ResponseBody {
    /// `None` once ended or failed (the connection is dropped with it on failure).
    inner: Option<Limited<hyper::body::Incoming>>,
    /// The declared length is past the cap: fail at the first read.
    declared_too_large: bool,
    timeout: tokio::time::Interval,
    max: u64,
    conn: Option<(Arc<Tracker>, ConnId)>,
    permit: Option<OwnedSemaphorePermit>,
    /// `scheme://host:port`, for logs.
    destination: String,
}

impl ResponseBody {
    pub fn new(
        incoming: hyper::body::Incoming,
        max: u64,
        between_bytes: std::time::Duration,
        conn: Option<(Arc<Tracker>, ConnId)>,
        permit: OwnedSemaphorePermit,
        destination: String,
    ) -> ResponseBody {
        let declared_too_large = incoming.size_hint().lower() > max;
        let mut timeout = tokio::time::interval(between_bytes);
        timeout.reset();
        ResponseBody {
            inner: Some(Limited::new(
                incoming,
                usize::try_from(max).unwrap_or(usize::MAX),
            )),
            declared_too_large,
            timeout,
            max,
            conn,
            permit: Some(permit),
            destination,
        }
    }

    /// Ends the body with an error: the connection is dropped, not pooled.
    fn fail(&mut self, error: Error) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        if matches!(error, Error::HttpResponseBodySize(_)) {
            tracing::warn!(
                destination = %self.destination,
                limit = self.max,
                "response body exceeds the instance's limit (max_response_bytes): connection dropped"
            );
        }
        self.inner = None;
        self.permit = None;
        if let Some((tracker, id)) = self.conn.take() {
            tracker.closed(id);
        }
        Poll::Ready(Some(Err(error)))
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        // Dropped before its end: hyper closes the connection.
        if let Some((tracker, id)) = self.conn.take() {
            tracker.closed(id);
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        if this.declared_too_large {
            return this.fail(Error::HttpResponseBodySize(Some(this.max)));
        }
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(None) => {
                this.inner = None;
                this.permit = None;
                if let Some((tracker, id)) = this.conn.take() {
                    tracker.released(id);
                }
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                let error = if e.is::<LengthLimitError>() {
                    Error::HttpResponseBodySize(Some(this.max))
                } else if let Some(h) = e.downcast_ref::<hyper::Error>() {
                    hyper_error(h, true, true)
                } else {
                    tracing::warn!(error = %e, "response body error");
                    Error::HttpProtocolError
                };
                this.fail(error)
            }
            Poll::Ready(Some(Ok(frame))) => {
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
        self.inner.as_ref().is_none_or(|i| i.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |i| i.size_hint())
    }
}

/// The connection a captured connection's metadata names, if any.
pub(super) fn conn_id(
    connected: Option<&hyper_util::client::legacy::connect::Connected>,
) -> Option<ConnId> {
    let mut extensions = http::Extensions::new();
    connected?.get_extras(&mut extensions);
    extensions.get::<ConnId>().copied()
}
