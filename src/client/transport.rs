//! The one seam between the client and the network: a [`Transport`] sends an [`HttpRequest`]
//! and returns the whole [`HttpResponse`]. In the component it is `wasi:http` (see
//! [`super::wasi_http`]); unit tests use an in-memory one.

use super::error::TransportError;
use super::request::HttpRequest;
use super::response::HttpResponse;

/// A request that has been sent (its body included) and whose answer has not been read yet;
/// [`InFlight::wait`] reads it. Owns what it needs: it borrows neither the transport nor the
/// request, so the caller can keep working (or start building the next request) meanwhile.
pub struct InFlight {
    wait: Box<dyn FnOnce() -> Result<HttpResponse, TransportError>>,
}

impl InFlight {
    /// An answer that is already known (a transport that cannot overlap, or a failure while
    /// sending).
    pub fn ready(answer: Result<HttpResponse, TransportError>) -> InFlight {
        InFlight {
            wait: Box::new(move || answer),
        }
    }

    /// An answer `wait` will read.
    pub fn pending(wait: impl FnOnce() -> Result<HttpResponse, TransportError> + 'static) -> Self {
        InFlight {
            wait: Box::new(wait),
        }
    }

    /// Waits for the whole answer.
    pub fn wait(self) -> Result<HttpResponse, TransportError> {
        (self.wait)()
    }
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InFlight")
    }
}

/// Sends requests. Implementations set `content-length` (never chunked), honour the request's
/// timeouts, and report failures below HTTP as a [`TransportError`].
pub trait Transport {
    /// Sends the request and reads the whole answer.
    fn send(&self, request: &HttpRequest) -> Result<HttpResponse, TransportError>;

    /// Sends the request (body included) and returns before the answer, so the caller can
    /// work while the server does; the default sends it whole now (no overlap).
    fn start(&self, request: &HttpRequest) -> InFlight {
        InFlight::ready(self.send(request))
    }
}

impl<T: Transport + ?Sized> Transport for &T {
    fn send(&self, request: &HttpRequest) -> Result<HttpResponse, TransportError> {
        (**self).send(request)
    }

    fn start(&self, request: &HttpRequest) -> InFlight {
        (**self).start(request)
    }
}
