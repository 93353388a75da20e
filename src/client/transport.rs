//! The one seam between the client and the network: a [`Transport`] sends an [`HttpRequest`]
//! and returns the whole [`HttpResponse`]. In the component it is `wasi:http` (see
//! [`super::wasi_http`]); unit tests use an in-memory one.

use super::error::TransportError;
use super::request::HttpRequest;
use super::response::HttpResponse;

/// Sends requests. Implementations set `content-length` (never chunked), honour the request's
/// timeouts, and report failures below HTTP as a [`TransportError`].
pub trait Transport {
    /// Sends the request and reads the whole answer.
    fn send(&self, request: &HttpRequest) -> Result<HttpResponse, TransportError>;
}

impl<T: Transport + ?Sized> Transport for &T {
    fn send(&self, request: &HttpRequest) -> Result<HttpResponse, TransportError> {
        (**self).send(request)
    }
}
