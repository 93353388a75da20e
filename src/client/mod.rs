//! ClickHouse HTTP client: connection strings ([`dsn`]), requests ([`request`]), answers
//! ([`response`]), INSERT body compression ([`compression`], [`gzip`]), the error taxonomy
//! ([`error`]), repeating what is safe to repeat ([`retry`]), identifiers in SQL text
//! ([`sql`]) and the transport seam ([`transport`]).
//!
//! Everything here except [`wasi_http`] is plain Rust with native unit tests.

pub mod compression;
pub mod dsn;
pub mod error;
pub mod error_codes;
pub mod gzip;
pub mod request;
pub mod response;
pub mod retry;
pub mod secrets;
pub mod settings;
pub mod sql;
pub mod transport;
pub mod url;
#[cfg(target_arch = "wasm32")]
pub mod wasi_http;

pub use compression::Compression;
pub use dsn::{ConnectionOptions, Endpoint};
pub use error::{Error, ErrorKind, ServerError};
pub use request::{escape_param, ExternalTable, HttpRequest, Query};
pub use response::{HttpResponse, Response};
pub use secrets::Redactor;
pub use transport::{InFlight, Transport};

use error::classify_transport;

/// A ClickHouse client bound to one endpoint and one transport.
pub struct Client<T: Transport> {
    endpoint: Endpoint,
    redactor: Redactor,
    transport: T,
}

impl<T: Transport> Client<T> {
    /// Validates the connection (no request is sent).
    pub fn new(options: &ConnectionOptions, transport: T) -> Result<Self, Error> {
        let endpoint = Endpoint::parse(options)?;
        let redactor = Redactor::new(endpoint.secrets());
        Ok(Client {
            endpoint,
            redactor,
            transport,
        })
    }

    /// The resolved endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The same client, sending no connection database: for a caller that names the database
    /// in every statement (the state store). A database the connection names is then never in
    /// its way: the server refuses any request whose `database` does not exist yet
    /// (UNKNOWN_DATABASE), even the `CREATE DATABASE` that would make it.
    pub fn without_database(mut self) -> Self {
        self.endpoint.database = None;
        self
    }

    /// Sends one statement and returns the server's successful answer, or a classified error.
    /// A statement that asked for a compressed answer and was refused the setting that allows
    /// it (a `readonly=1` user: READONLY; a settings constraint: SETTING_CONSTRAINT_VIOLATION)
    /// is sent once more without asking.
    pub fn execute(&self, query: &Query) -> Result<Response, Error> {
        match self.send(&query.to_http(&self.endpoint)?) {
            Err(e) if query.compressed_answer && refuses_the_setting(&e) => self.send(
                &query
                    .clone()
                    .uncompressed_answer()
                    .to_http(&self.endpoint)?,
            ),
            answer => answer,
        }
    }

    /// Builds the HTTP request of a query once (moving its data), for [`Client::send`] to send
    /// as often as needed without copying the body again.
    pub fn prepare(&self, query: Query) -> Result<HttpRequest, Error> {
        query.into_http(&self.endpoint)
    }

    /// Sends a request built by [`Client::prepare`] and returns the server's successful
    /// answer, or a classified error.
    pub fn send(&self, request: &HttpRequest) -> Result<Response, Error> {
        self.interpret(request, self.transport.send(request))
    }

    /// Sends a request built by [`Client::prepare`] without waiting for the answer (where the
    /// transport can overlap; see [`Transport::start`]); [`Client::wait`] reads it.
    pub fn start(&self, request: &HttpRequest) -> InFlight {
        self.transport.start(request)
    }

    /// The answer to a request [`Client::start`]ed, classified as [`Client::send`] does.
    pub fn wait(&self, request: &HttpRequest, in_flight: InFlight) -> Result<Response, Error> {
        self.interpret(request, in_flight.wait())
    }

    fn interpret(
        &self,
        request: &HttpRequest,
        answer: Result<HttpResponse, error::TransportError>,
    ) -> Result<Response, Error> {
        match answer.and_then(compression::decode_answer) {
            Ok(http) => response::interpret(http, request.operation, &self.redactor),
            Err(failure) => {
                let kind = classify_transport(&failure.failure, request.operation);
                let what = describe_failure(&failure.failure);
                let origin = self.endpoint.origin();
                let message = if failure.detail.is_empty() {
                    format!("{what} ({origin})")
                } else {
                    format!("{what} ({origin}): {}", failure.detail)
                };
                Err(self.redactor.error(kind, &message))
            }
        }
    }
}

/// Whether the server refused a statement for changing a setting it may not change.
fn refuses_the_setting(e: &Error) -> bool {
    e.server.as_ref().is_some_and(|s| {
        matches!(
            s.code,
            error_codes::READONLY | error_codes::SETTING_CONSTRAINT_VIOLATION
        )
    })
}

fn describe_failure(failure: &error::TransportFailure) -> &'static str {
    use error::TransportFailure as F;
    match failure {
        F::Denied => "the host's allow-list does not permit requests to this destination",
        F::Dns => "could not resolve the server's host name",
        F::Refused => "could not connect to the server (connection refused or unreachable)",
        F::ConnectTimeout => "could not connect to the server within the connect timeout",
        F::Tls => "TLS handshake with the server failed",
        F::TlsCertificate => "the server's TLS certificate was rejected",
        F::Timeout => "no answer from the server within the request timeout",
        F::Reset => "the connection to the server was closed before the answer was complete",
        F::Protocol => "the server's answer was not HTTP (is the URL's port the HTTP interface's, 8123 or 8443, and not the native protocol's 9000?)",
        F::NotClickHouse => "the server's answer is not ClickHouse's",
        F::TooLarge => "the server's answer is too large",
        F::InvalidRequest => "the request could not be built",
        F::Other => "the request failed",
    }
}

#[cfg(any(test, feature = "test-util"))]
pub mod testing {
    //! An in-memory transport for unit tests of request flow (never a stand-in for ClickHouse
    //! in integration tests).
    use super::*;
    use std::cell::RefCell;

    /// Replays canned answers and records requests.
    #[derive(Default)]
    pub struct Scripted {
        /// The answers left, the next one last.
        pub answers: RefCell<Vec<Result<HttpResponse, error::TransportError>>>,
        /// The requests sent so far.
        pub sent: RefCell<Vec<HttpRequest>>,
    }

    impl Scripted {
        /// Answers `answers` in order.
        pub fn new(answers: Vec<Result<HttpResponse, error::TransportError>>) -> Self {
            let mut answers = answers;
            answers.reverse();
            Scripted {
                answers: RefCell::new(answers),
                sent: RefCell::default(),
            }
        }
    }

    impl Transport for Scripted {
        fn send(&self, request: &HttpRequest) -> Result<HttpResponse, error::TransportError> {
            self.sent.borrow_mut().push(request.clone());
            self.answers
                .borrow_mut()
                .pop()
                .expect("no scripted answer left")
        }
    }

    /// Answers each request with a function of it and of how many came before; records them.
    pub struct Answering<F> {
        /// The answer to a request, given it and how many came before.
        pub answer: F,
        /// The requests sent so far.
        pub sent: RefCell<Vec<HttpRequest>>,
    }

    impl<F> Answering<F>
    where
        F: Fn(&HttpRequest, usize) -> Result<HttpResponse, error::TransportError>,
    {
        /// Answers with `answer`.
        pub fn new(answer: F) -> Self {
            Answering {
                answer,
                sent: RefCell::default(),
            }
        }

        /// The operation names of the requests sent so far.
        pub fn operations(&self) -> Vec<String> {
            self.sent.borrow().iter().map(operation).collect()
        }
    }

    impl<F> Transport for Answering<F>
    where
        F: Fn(&HttpRequest, usize) -> Result<HttpResponse, error::TransportError>,
    {
        fn send(&self, request: &HttpRequest) -> Result<HttpResponse, error::TransportError> {
            let before = self.sent.borrow().len();
            self.sent.borrow_mut().push(request.clone());
            (self.answer)(request, before)
        }
    }

    /// A request's operation name (`x-component-operation`).
    pub fn operation(request: &HttpRequest) -> String {
        request
            .headers
            .iter()
            .find(|(n, _)| n == request::OPERATION_HEADER)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default()
    }

    /// The value of the query parameter `{name:...}` of a request (its `param_<name>`).
    pub fn param(request: &HttpRequest, name: &str) -> Option<String> {
        let key = format!("param_{name}=");
        request
            .path_and_query
            .trim_start_matches("/?")
            .split('&')
            .find_map(|pair| pair.strip_prefix(key.as_str()))
            .map(|v| url::decode_component(v, true).unwrap())
    }

    /// A success whose summary says `rows` rows were written.
    pub fn written(rows: u64) -> Result<HttpResponse, error::TransportError> {
        Ok(HttpResponse {
            status: 200,
            headers: vec![(
                "x-clickhouse-summary".into(),
                format!(r#"{{"written_rows":"{rows}"}}"#).into_bytes(),
            )],
            body: vec![],
            elapsed_us: 1,
        })
    }

    /// A transport failure.
    pub fn fail(failure: error::TransportFailure) -> Result<HttpResponse, error::TransportError> {
        Err(error::TransportError::new(failure, ""))
    }

    /// ClickHouse's error `code` with `message` (status 500, the code in its header).
    pub fn server_error(code: i32, message: &str) -> Result<HttpResponse, error::TransportError> {
        Ok(HttpResponse {
            status: 500,
            headers: vec![(
                "x-clickhouse-exception-code".into(),
                code.to_string().into_bytes(),
            )],
            body: format!("Code: {code}. DB::Exception: {message}").into_bytes(),
            elapsed_us: 1,
        })
    }

    /// A success with `body`.
    pub fn ok(body: &str) -> Result<HttpResponse, error::TransportError> {
        Ok(HttpResponse {
            status: 200,
            headers: vec![],
            body: body.as_bytes().to_vec(),
            elapsed_us: 1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::error::{TransportError, TransportFailure};
    use super::testing::*;
    use super::*;

    #[test]
    fn transport_failures_name_the_origin_not_the_password() {
        let t = Scripted::new(vec![Err(TransportError::new(
            TransportFailure::Refused,
            "connect to http://u:hunter2@h failed",
        ))]);
        let c = Client::new(&ConnectionOptions::from_url("http://u:hunter2@h:1"), &t).unwrap();
        let e = c.execute(&Query::read("ping", "SELECT 1")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Disconnected);
        assert!(e.message.contains("http://h:1"), "{}", e.message);
        assert!(!e.message.contains("hunter2"), "{}", e.message);
    }

    #[test]
    fn timeouts_of_writes_are_uncertain() {
        let t = Scripted::new(vec![
            Err(TransportError::new(TransportFailure::Timeout, "")),
            Err(TransportError::new(TransportFailure::Timeout, "")),
        ]);
        let c = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        let read = c.execute(&Query::read("x", "SELECT 1")).unwrap_err();
        let write = c
            .execute(&Query::write("x", "INSERT INTO t FORMAT JSONEachRow").data(vec![]))
            .unwrap_err();
        assert_eq!(read.kind, ErrorKind::Transient);
        assert_eq!(write.kind, ErrorKind::Uncertain);
    }

    #[test]
    fn server_errors_are_redacted_with_secret_settings() {
        let t = Scripted::new(vec![Ok(HttpResponse {
            status: 500,
            headers: vec![],
            body: b"Code: 36. DB::Exception: bad key AKIAXYZ (BAD_ARGUMENTS)".to_vec(),
            elapsed_us: 1,
        })]);
        let c = Client::new(
            &ConnectionOptions::from_url("http://h?s3_access_key_id=AKIAXYZ"),
            &t,
        )
        .unwrap();
        let e = c.execute(&Query::read("x", "SELECT 1")).unwrap_err();
        assert!(!e.message.contains("AKIAXYZ"), "{}", e.message);
        assert_eq!(e.kind, ErrorKind::Permanent);
    }

    #[test]
    fn success_passes_the_body_through() {
        let t = Scripted::new(vec![ok("hello")]);
        let c = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        assert_eq!(
            c.execute(&Query::read("x", "SELECT 1")).unwrap().body,
            b"hello"
        );
        assert_eq!(t.sent.borrow().len(), 1);
    }

    #[test]
    fn a_refused_compressed_answer_setting_is_asked_once_more_without_it() {
        let refused = |code: i32| {
            testing::server_error(
                code,
                "Cannot modify 'enable_http_compression' setting in readonly mode. (READONLY)",
            )
        };
        for code in [
            error_codes::READONLY,
            error_codes::SETTING_CONSTRAINT_VIOLATION,
        ] {
            let t = testing::Scripted::new(vec![refused(code), testing::ok("a\n")]);
            let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
            let query = Query::read("ids", "SELECT 1").compressed_answer();
            assert_eq!(client.execute(&query).unwrap().body, b"a\n");
            let sent = t.sent.borrow();
            assert_eq!(sent.len(), 2);
            let asks = |r: &HttpRequest| {
                r.path_and_query.contains("enable_http_compression")
                    || r.headers.iter().any(|(n, _)| n == "accept-encoding")
            };
            assert!(asks(&sent[0]) && !asks(&sent[1]));
        }
        // Another error, or a statement that did not ask: no second request.
        let t = testing::Scripted::new(vec![refused(error_codes::UNKNOWN_TABLE)]);
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        assert!(client
            .execute(&Query::read("ids", "SELECT 1").compressed_answer())
            .is_err());
        let t = testing::Scripted::new(vec![refused(error_codes::READONLY)]);
        let client = Client::new(&ConnectionOptions::from_url("http://h"), &t).unwrap();
        assert!(client.execute(&Query::read("get", "SELECT 1")).is_err());
        assert_eq!(t.sent.borrow().len(), 1);
    }
}
