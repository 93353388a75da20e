//! The [`Transport`] of the component: one `wasi:http/outgoing-handler` request per call, with
//! `content-length` set, the body written without a trailing flush, and the response future's
//! error preferred over a secondary body-write error (a host that fails the request also fails
//! the body stream; the request's own error says why).

use wasip2::clocks::monotonic_clock;
use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, FutureIncomingResponse, IncomingBody, Method as WasiMethod, OutgoingBody,
    OutgoingRequest, RequestOptions, Scheme,
};
use wasip2::io::poll::{self, Pollable};
use wasip2::io::streams::StreamError;

use super::error::{tenths, TransportError, TransportFailure};
use super::request::{HttpRequest, Method};
use super::response::{append_within, HttpResponse};
use super::transport::{InFlight, Transport};

/// Largest read asked of the response stream at once.
const READ_CHUNK: u64 = 256 * 1024;
/// Most bytes read of an error answer: its code, name and the start of its text are all a
/// message needs (messages are capped at 500 characters anyway); the rest is not read.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Sends requests through the host's `wasi:http/outgoing-handler`.
#[derive(Clone, Copy, Debug, Default)]
pub struct WasiHttpTransport;

impl Transport for WasiHttpTransport {
    fn send(&self, request: &HttpRequest) -> Result<HttpResponse, TransportError> {
        self.start(request).wait()
    }

    /// Hands the request to the host and writes its whole body; the host sends it while the
    /// guest goes on, and the returned [`InFlight`] waits for the answer.
    fn start(&self, request: &HttpRequest) -> InFlight {
        let started = monotonic_clock::now();
        match begin(request) {
            Ok((future, write_result)) => {
                let limits = AnswerLimits::of(request, started);
                InFlight::pending(move || answer(future, write_result, started, limits))
            }
            Err(e) => InFlight::ready(Err(e)),
        }
    }
}

/// Builds the `wasi:http` request, hands it to the host and writes the body.
fn begin(
    request: &HttpRequest,
) -> Result<(FutureIncomingResponse, Result<(), String>), TransportError> {
    let mut entries: Vec<(String, Vec<u8>)> = request.headers.clone();
    entries.push((
        "content-length".to_string(),
        request.body.len().to_string().into_bytes(),
    ));
    let headers = Fields::from_list(&entries).map_err(|e| {
        TransportError::new(
            TransportFailure::InvalidRequest,
            // (Which of the three header errors it is matters little: every header is the
            // component's own, and a value a user gave is checked before this.)
            format!(
                "a header value cannot be sent (wasi:http header-error {})",
                e as u8
            ),
        )
    })?;
    let outgoing = OutgoingRequest::new(headers);
    let invalid = |what: &str| TransportError::new(TransportFailure::InvalidRequest, what);
    outgoing
        .set_method(&match request.method {
            Method::Post => WasiMethod::Post,
        })
        .map_err(|()| invalid("method rejected"))?;
    outgoing
        .set_scheme(Some(if request.tls {
            &Scheme::Https
        } else {
            &Scheme::Http
        }))
        .map_err(|()| invalid("scheme rejected"))?;
    outgoing
        .set_authority(Some(&request.authority))
        .map_err(|()| invalid("authority rejected"))?;
    outgoing
        .set_path_with_query(Some(&request.path_and_query))
        .map_err(|()| invalid("path rejected"))?;

    let options = RequestOptions::new();
    // Hosts may not support every timeout; an unsupported one is not an error.
    let _ = options.set_connect_timeout(Some(nanos(request.connect_timeout)));
    let _ = options.set_first_byte_timeout(Some(nanos(request.request_timeout)));
    let _ = options.set_between_bytes_timeout(Some(nanos(request.request_timeout)));

    let body = outgoing
        .body()
        .map_err(|()| invalid("request body unavailable"))?;
    let future = outgoing_handler::handle(outgoing, Some(options)).map_err(from_error_code)?;

    // Write the body. A failure here usually means the request itself failed (refused,
    // denied): the response future then carries the real cause.
    let write_result = write_body(body, &request.body, nanos(request.request_timeout));
    Ok((future, write_result))
}

/// How long the guest waits for an answer and how much of it it reads. Enforced here, in the
/// component, whatever the host does with the request options: no progress (no byte) for the
/// request timeout ends the request, so does a small answer not whole by its deadline, and a
/// successful answer longer than its cap is not read further.
#[derive(Clone, Copy, Debug)]
struct AnswerLimits {
    /// Monotonic instant the request started at.
    started: u64,
    /// Nanoseconds without a byte that end the request.
    idle_ns: u64,
    /// Nanoseconds from the start within which the whole answer must have arrived, if any.
    total_ns: Option<u64>,
    /// Most bytes of a successful answer.
    max_bytes: usize,
}

impl AnswerLimits {
    fn of(request: &HttpRequest, started: u64) -> AnswerLimits {
        AnswerLimits {
            started,
            idle_ns: nanos(request.request_timeout),
            total_ns: request.answer_deadline.map(nanos),
            max_bytes: request.max_answer_bytes,
        }
    }

    /// The instant the next wait ends at, counted from the last progress.
    fn wait_until(&self, last_progress: u64) -> (u64, Waited) {
        let idle_end = last_progress.saturating_add(self.idle_ns);
        match self.total_ns.map(|t| self.started.saturating_add(t)) {
            Some(deadline) if deadline < idle_end => (deadline, Waited::PastDeadline),
            _ => (idle_end, Waited::Idle),
        }
    }

    fn timeout(&self, waited: Waited) -> TransportError {
        let secs = |ns: u64| tenths(std::time::Duration::from_nanos(ns));
        TransportError::new(
            TransportFailure::Timeout,
            match waited {
                Waited::Idle => format!(
                    "nothing arrived for {} s (the request timeout)",
                    secs(self.idle_ns)
                ),
                Waited::PastDeadline => format!(
                    "the answer was not whole within {} s (the request timeout; a small answer must arrive whole within it)",
                    secs(self.total_ns.unwrap_or(self.idle_ns))
                ),
            },
        )
    }
}

/// Which limit a wait ran into.
#[derive(Clone, Copy, Debug)]
enum Waited {
    Idle,
    PastDeadline,
}

/// A duration in nanoseconds, as wasi:clocks counts (saturating).
fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Blocks until `pollable` is ready (true) or the monotonic clock reaches `until` (false).
fn ready_by(pollable: &Pollable, until: u64) -> bool {
    let timer = monotonic_clock::subscribe_instant(until);
    poll::poll(&[pollable, &timer]).contains(&0)
}

/// Waits for the answer to a request [`begin`] sent and reads it whole.
fn answer(
    future: FutureIncomingResponse,
    write_result: Result<(), String>,
    started: u64,
    limits: AnswerLimits,
) -> Result<HttpResponse, TransportError> {
    let incoming = loop {
        match future.get() {
            Some(Ok(Ok(response))) => break response,
            Some(Ok(Err(code))) => return Err(from_error_code(code)),
            Some(Err(())) => {
                return Err(TransportError::new(
                    TransportFailure::Other,
                    "response already taken",
                ))
            }
            None => {
                // The host's first-byte timeout (set in the request options) bounds this too;
                // the guest does not rely on it.
                let (until, waited) = limits.wait_until(started);
                if !ready_by(&future.subscribe(), until) {
                    return Err(limits.timeout(waited));
                }
            }
        }
    };
    if let Err(detail) = write_result {
        return Err(TransportError::new(TransportFailure::Reset, detail));
    }

    let status = incoming.status();
    let headers = incoming
        .headers()
        .entries()
        .into_iter()
        .map(|(name, value)| (name.to_ascii_lowercase(), value))
        .collect();
    let body_resource = incoming
        .consume()
        .map_err(|()| TransportError::new(TransportFailure::Other, "response body unavailable"))?;
    let body = read_body(&body_resource, (200..300).contains(&status), &limits)?;
    let _trailers = IncomingBody::finish(body_resource);
    let elapsed_ns = monotonic_clock::now().saturating_sub(started);
    Ok(HttpResponse {
        status,
        headers,
        body,
        elapsed_us: elapsed_ns / 1_000,
    })
}

/// Writes all of `data` and finishes the body; never flushes after the last write. The host
/// taking no byte for `idle_ns` (a server that does not read) ends the write.
fn write_body(body: OutgoingBody, data: &[u8], idle_ns: u64) -> Result<(), String> {
    let stream = body
        .write()
        .map_err(|()| "request body stream unavailable".to_string())?;
    let mut rest = data;
    while !rest.is_empty() {
        let permitted = match stream.check_write() {
            Ok(0) => {
                let until = monotonic_clock::now().saturating_add(idle_ns);
                if !ready_by(&stream.subscribe(), until) {
                    return Err(format!(
                        "writing the request body: no byte taken for {} s (the request timeout)",
                        tenths(std::time::Duration::from_nanos(idle_ns))
                    ));
                }
                continue;
            }
            Ok(n) => usize::try_from(n).unwrap_or(usize::MAX).min(rest.len()),
            Err(e) => return Err(stream_error("writing the request body", e)),
        };
        stream
            .write(&rest[..permitted])
            .map_err(|e| stream_error("writing the request body", e))?;
        rest = &rest[permitted..];
    }
    drop(stream);
    OutgoingBody::finish(body, None).map_err(|code| {
        format!(
            "finishing the request body: {}",
            from_error_code(code).detail
        )
    })
}

/// Reads the body to its end, within `limits`' idle time and deadline. An error answer is read
/// up to [`MAX_ERROR_BODY`] (the rest is dropped with the stream); a successful one longer than
/// its cap is refused ([`TransportFailure::TooLarge`]), never taken in part. The buffer grows
/// with a fallible reservation: an answer the instance's memory cannot hold is an error too.
fn read_body(
    body: &IncomingBody,
    success: bool,
    limits: &AnswerLimits,
) -> Result<Vec<u8>, TransportError> {
    let stream = body.stream().map_err(|()| {
        TransportError::new(TransportFailure::Other, "response stream unavailable")
    })?;
    let limit = if success {
        limits.max_bytes
    } else {
        MAX_ERROR_BODY
    };
    // One byte past a successful answer's cap tells an answer over it from one at it.
    let cap = limit.saturating_add(usize::from(success));
    let mut out = Vec::new();
    let mut last_progress = monotonic_clock::now();
    loop {
        let room = cap - out.len();
        if room == 0 {
            if success {
                return Err(TransportError::new(
                    TransportFailure::TooLarge,
                    format!(
                        "the answer is over {} bytes, the most this statement's answer may be",
                        limit
                    ),
                ));
            }
            break;
        }
        match stream.read(READ_CHUNK.min(room as u64)) {
            Ok(chunk) if chunk.is_empty() => {
                let (until, waited) = limits.wait_until(last_progress);
                if !ready_by(&stream.subscribe(), until) {
                    return Err(limits.timeout(waited));
                }
            }
            Ok(chunk) => {
                last_progress = monotonic_clock::now();
                // The read asked for at most `room` bytes: only memory can refuse them.
                if append_within(&mut out, &chunk, cap).is_err() {
                    return Err(TransportError::new(
                        TransportFailure::TooLarge,
                        format!(
                            "the answer is larger than this instance's memory holds ({} MiB read)",
                            out.len() >> 20
                        ),
                    ));
                }
            }
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(e)) => {
                return Err(match wasip2::http::types::http_error_code(&e) {
                    // The head was HTTP: a body broken after it is a cut (hosts such as stock
                    // wasmtime report any failure of the connection as a protocol error).
                    Some(code) => match from_error_code(code) {
                        TransportError {
                            failure: TransportFailure::Protocol,
                            detail,
                        } => TransportError::new(TransportFailure::Reset, detail),
                        other => other,
                    },
                    // A host's own body error reaches the guest as text only.
                    // Its first line: wasmtime's `Debug` form adds a Rust backtrace under
                    // RUST_BACKTRACE, which would push what follows past the message's cap.
                    None => {
                        let mut detail = e.to_debug_string();
                        detail.truncate(detail.find('\n').unwrap_or(detail.len()));
                        if detail.contains("body size exceeds limit") {
                            detail.push_str(HOST_RESPONSE_LIMIT);
                            TransportError::new(TransportFailure::TooLarge, detail)
                        } else {
                            TransportError::new(TransportFailure::Reset, detail)
                        }
                    }
                });
            }
        }
    }
    Ok(out)
}

fn stream_error(context: &str, e: StreamError) -> String {
    match e {
        StreamError::Closed => format!("{context}: stream closed"),
        StreamError::LastOperationFailed(e) => format!("{context}: {}", e.to_debug_string()),
    }
}

/// What a too-large answer the host refused names: the bound, and the option that sets it.
const HOST_RESPONSE_LIMIT: &str = " (the host's response size limit, --max-response-mib)";

/// Maps a `wasi:http` error code to the client's transport failures.
fn from_error_code(code: ErrorCode) -> TransportError {
    use TransportFailure as F;
    let failure = match &code {
        ErrorCode::HttpRequestDenied => F::Denied,
        ErrorCode::DnsTimeout | ErrorCode::DnsError(_) => F::Dns,
        ErrorCode::DestinationNotFound
        | ErrorCode::DestinationUnavailable
        | ErrorCode::DestinationIpProhibited
        | ErrorCode::DestinationIpUnroutable
        | ErrorCode::ConnectionRefused
        | ErrorCode::ConnectionLimitReached => F::Refused,
        ErrorCode::ConnectionTimeout => F::ConnectTimeout,
        ErrorCode::TlsProtocolError | ErrorCode::TlsAlertReceived(_) => F::Tls,
        ErrorCode::TlsCertificateError => F::TlsCertificate,
        ErrorCode::ConnectionReadTimeout
        | ErrorCode::ConnectionWriteTimeout
        | ErrorCode::HttpResponseTimeout => F::Timeout,
        ErrorCode::ConnectionTerminated | ErrorCode::HttpResponseIncomplete => F::Reset,
        ErrorCode::HttpResponseBodySize(_) => F::TooLarge,
        ErrorCode::HttpProtocolError
        | ErrorCode::HttpResponseHeaderSectionSize(_)
        | ErrorCode::HttpResponseHeaderSize(_)
        | ErrorCode::HttpResponseTrailerSectionSize(_)
        | ErrorCode::HttpResponseTrailerSize(_)
        | ErrorCode::HttpResponseTransferCoding(_)
        | ErrorCode::HttpResponseContentCoding(_)
        | ErrorCode::HttpUpgradeFailed => F::Protocol,
        ErrorCode::HttpRequestMethodInvalid
        | ErrorCode::HttpRequestUriInvalid
        | ErrorCode::HttpRequestUriTooLong
        | ErrorCode::HttpRequestLengthRequired
        | ErrorCode::HttpRequestBodySize(_)
        | ErrorCode::HttpRequestHeaderSectionSize(_)
        | ErrorCode::HttpRequestHeaderSize(_)
        | ErrorCode::HttpRequestTrailerSectionSize(_)
        | ErrorCode::HttpRequestTrailerSize(_) => F::InvalidRequest,
        _ => F::Other,
    };
    let detail = match &code {
        ErrorCode::InternalError(Some(msg)) => format!("wasi:http internal-error: {msg}"),
        ErrorCode::HttpResponseBodySize(_) => {
            format!("wasi:http error-code HTTP-response-body-size{HOST_RESPONSE_LIMIT}")
        }
        other => format!("wasi:http error-code {}", error_code_name(other)),
    };
    TransportError::new(failure, detail)
}

/// A `wasi:http` error code's name as the WIT spells it (its `Debug` form costs the
/// component more than this table: docs/measurements.md).
fn error_code_name(code: &ErrorCode) -> &'static str {
    match code {
        ErrorCode::DnsTimeout => "dns-timeout",
        ErrorCode::DnsError(_) => "dns-error",
        ErrorCode::DestinationNotFound => "destination-not-found",
        ErrorCode::DestinationUnavailable => "destination-unavailable",
        ErrorCode::DestinationIpProhibited => "destination-IP-prohibited",
        ErrorCode::DestinationIpUnroutable => "destination-IP-unroutable",
        ErrorCode::ConnectionRefused => "connection-refused",
        ErrorCode::ConnectionTerminated => "connection-terminated",
        ErrorCode::ConnectionTimeout => "connection-timeout",
        ErrorCode::ConnectionReadTimeout => "connection-read-timeout",
        ErrorCode::ConnectionWriteTimeout => "connection-write-timeout",
        ErrorCode::ConnectionLimitReached => "connection-limit-reached",
        ErrorCode::TlsProtocolError => "TLS-protocol-error",
        ErrorCode::TlsCertificateError => "TLS-certificate-error",
        ErrorCode::TlsAlertReceived(_) => "TLS-alert-received",
        ErrorCode::HttpRequestDenied => "HTTP-request-denied",
        ErrorCode::HttpRequestLengthRequired => "HTTP-request-length-required",
        ErrorCode::HttpRequestBodySize(_) => "HTTP-request-body-size",
        ErrorCode::HttpRequestMethodInvalid => "HTTP-request-method-invalid",
        ErrorCode::HttpRequestUriInvalid => "HTTP-request-URI-invalid",
        ErrorCode::HttpRequestUriTooLong => "HTTP-request-URI-too-long",
        ErrorCode::HttpRequestHeaderSectionSize(_) => "HTTP-request-header-section-size",
        ErrorCode::HttpRequestHeaderSize(_) => "HTTP-request-header-size",
        ErrorCode::HttpRequestTrailerSectionSize(_) => "HTTP-request-trailer-section-size",
        ErrorCode::HttpRequestTrailerSize(_) => "HTTP-request-trailer-size",
        ErrorCode::HttpResponseIncomplete => "HTTP-response-incomplete",
        ErrorCode::HttpResponseHeaderSectionSize(_) => "HTTP-response-header-section-size",
        ErrorCode::HttpResponseHeaderSize(_) => "HTTP-response-header-size",
        ErrorCode::HttpResponseBodySize(_) => "HTTP-response-body-size",
        ErrorCode::HttpResponseTrailerSectionSize(_) => "HTTP-response-trailer-section-size",
        ErrorCode::HttpResponseTrailerSize(_) => "HTTP-response-trailer-size",
        ErrorCode::HttpResponseTransferCoding(_) => "HTTP-response-transfer-coding",
        ErrorCode::HttpResponseContentCoding(_) => "HTTP-response-content-coding",
        ErrorCode::HttpResponseTimeout => "HTTP-response-timeout",
        ErrorCode::HttpUpgradeFailed => "HTTP-upgrade-failed",
        ErrorCode::HttpProtocolError => "HTTP-protocol-error",
        ErrorCode::LoopDetected => "loop-detected",
        ErrorCode::ConfigurationError => "configuration-error",
        ErrorCode::InternalError(_) => "internal-error",
    }
}
