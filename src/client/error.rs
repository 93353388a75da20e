//! The component's one error type: kinds (the retry taxonomy), server errors, classification of
//! HTTP answers and transport failures, and redaction of secrets from messages.

use std::fmt;

/// Longest message an [`Error`] carries (in characters, before the `…` marker).
pub const MAX_MESSAGE_CHARS: usize = 500;

/// What kind of failure happened; decides whether a retry can help. Mirrors the WIT
/// `error-kind` enum one to one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Rejected before any request: bad connection string, row, JSON, identifier, option.
    InvalidInput,
    /// Unknown database/table/column/setting, authentication, access denied, read-only, or a
    /// destination the host does not allow.
    Misconfigured,
    /// Could not connect (refused, DNS, connect timeout, TLS handshake): nothing reached the server.
    Disconnected,
    /// A server error that is safe to retry, or a read that timed out or was cut off.
    Transient,
    /// The server is overloaded: retry later, slower.
    Throttled,
    /// The server rejected the request itself (syntax, parse or type error in the data).
    Permanent,
    /// A write may or may not have committed.
    Uncertain,
    /// A lock was not acquired within its timeout.
    Locked,
    /// The named item does not exist, where that is an error.
    NotFound,
}

impl ErrorKind {
    /// Every kind, in WIT order.
    pub const ALL: [ErrorKind; 9] = [
        ErrorKind::InvalidInput,
        ErrorKind::Misconfigured,
        ErrorKind::Disconnected,
        ErrorKind::Transient,
        ErrorKind::Throttled,
        ErrorKind::Permanent,
        ErrorKind::Uncertain,
        ErrorKind::Locked,
        ErrorKind::NotFound,
    ];

    /// The kind's WIT name, e.g. `invalid-input`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid-input",
            ErrorKind::Misconfigured => "misconfigured",
            ErrorKind::Disconnected => "disconnected",
            ErrorKind::Transient => "transient",
            ErrorKind::Throttled => "throttled",
            ErrorKind::Permanent => "permanent",
            ErrorKind::Uncertain => "uncertain",
            ErrorKind::Locked => "locked",
            ErrorKind::NotFound => "not-found",
        }
    }

    /// Process exit code for this kind, shared by every command-line runner. 0 is success and
    /// 1 an unexpected failure of the runner itself; kinds use 2..=10.
    pub fn exit_code(self) -> i32 {
        match self {
            ErrorKind::InvalidInput => 2,
            ErrorKind::Misconfigured => 3,
            ErrorKind::Disconnected => 4,
            ErrorKind::Transient => 5,
            ErrorKind::Throttled => 6,
            ErrorKind::Permanent => 7,
            ErrorKind::Uncertain => 8,
            ErrorKind::Locked => 9,
            ErrorKind::NotFound => 10,
        }
    }

    /// Whether repeating the same call may succeed without any change.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::Disconnected | ErrorKind::Transient | ErrorKind::Throttled
        )
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The server's own description of an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerError {
    /// ClickHouse error code.
    pub code: i32,
    /// ClickHouse error name, e.g. `UNKNOWN_DATABASE`; empty when the server gave none.
    pub name: String,
    /// HTTP status of the answer.
    pub http_status: u16,
}

/// A failure of any operation of the component.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// The retry class.
    pub kind: ErrorKind,
    /// A message for people, already redacted and capped at [`MAX_MESSAGE_CHARS`].
    pub message: String,
    /// The server's error, when it answered with one.
    pub server: Option<ServerError>,
    /// Rows known to be committed before the failure (writes only).
    pub committed_rows: u64,
}

impl Error {
    /// A new error; the message is capped (callers that may hold secrets use
    /// [`Redactor::error`]).
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: cap(message.into()),
            server: None,
            committed_rows: 0,
        }
    }

    /// An `invalid-input` error.
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidInput, message)
    }

    /// The same failure with another kind and message (capped; build it from the already
    /// redacted message); the server error and the committed rows stay.
    pub fn reclassify(self, kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: cap(message.into()),
            ..self
        }
    }

    /// An `uncertain` failure of a write after `committed_rows` rows were committed: `context`
    /// followed by the cause's kind and message (capped); the cause's server error stays.
    pub fn uncertain_after(committed_rows: u64, context: &str, cause: Error) -> Self {
        let message = format!("{context} ({}: {})", cause.kind, cause.message);
        Error {
            committed_rows,
            ..cause.reclassify(ErrorKind::Uncertain, message)
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl std::error::Error for Error {}

/// Whether a request may have changed data on the server; decides how an interrupted request
/// is classified (a cut-off read is `transient`, a cut-off write `uncertain`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Reads, and writes that are idempotent by construction (DDL with `IF NOT EXISTS`).
    Read,
    /// Anything whose repetition could duplicate data.
    Write,
}

/// Classifies an error answer from the server by its ClickHouse code (when known) and HTTP status.
pub fn classify_server(http_status: u16, code: Option<i32>, op: Operation) -> ErrorKind {
    use super::error_codes::{
        ALL_CONNECTION_TRIES_FAILED, NETWORK_ERROR, SOCKET_TIMEOUT, TIMEOUT_EXCEEDED,
        TOO_FEW_LIVE_REPLICAS,
    };
    // A write the server passed on (a Distributed table's shards, a quorum's replicas) may
    // have landed on some before the others failed: its outcome is unknown, not transient.
    if op == Operation::Write
        && matches!(
            code,
            Some(
                NETWORK_ERROR
                    | ALL_CONNECTION_TRIES_FAILED
                    | SOCKET_TIMEOUT
                    | TIMEOUT_EXCEEDED
                    | TOO_FEW_LIVE_REPLICAS
            )
        )
    {
        return ErrorKind::Uncertain;
    }
    if let Some(code) = code {
        if let Some(kind) = kind_for_code(code) {
            return kind;
        }
    }
    match http_status {
        401 | 403 | 404 | 407 => ErrorKind::Misconfigured,
        408 | 502 | 503 | 504 if op == Operation::Write && code.is_none() => ErrorKind::Uncertain,
        408 | 502 | 503 | 504 => ErrorKind::Transient,
        429 => ErrorKind::Throttled,
        400..=499 | 501 => ErrorKind::Permanent,
        _ if code.is_none() && op == Operation::Write => ErrorKind::Uncertain,
        _ => ErrorKind::Transient,
    }
}

/// The kind for ClickHouse error codes whose meaning is clear; `None` leaves it to the status.
pub fn kind_for_code(code: i32) -> Option<ErrorKind> {
    use super::error_codes::*;
    Some(match code {
        // The server may or may not have committed the insert.
        UNKNOWN_STATUS_OF_INSERT => ErrorKind::Uncertain,
        // Configuration: names, credentials, permissions.
        NO_SUCH_COLUMN_IN_TABLE
        | UNKNOWN_FUNCTION
        | UNKNOWN_IDENTIFIER
        | UNKNOWN_STORAGE
        | UNKNOWN_TABLE
        | UNKNOWN_FORMAT
        | UNKNOWN_DATABASE
        | UNKNOWN_SETTING
        | READONLY
        | UNKNOWN_USER
        | WRONG_PASSWORD
        | REQUIRED_PASSWORD
        | IP_ADDRESS_NOT_ALLOWED
        | DATABASE_ACCESS_DENIED
        | SETTING_CONSTRAINT_VIOLATION
        | ACCESS_DENIED
        | AUTHENTICATION_FAILED => ErrorKind::Misconfigured,
        // Overload.
        CANNOT_ALLOCATE_MEMORY
        | QUOTA_EXCEEDED
        | TOO_MANY_SIMULTANEOUS_QUERIES
        | NO_FREE_CONNECTION
        | MEMORY_LIMIT_EXCEEDED
        | TOO_MANY_PARTS
        | CANNOT_SCHEDULE_TASK => ErrorKind::Throttled,
        // Passing trouble on the server side.
        UNEXPECTED_END_OF_FILE
        | ATTEMPT_TO_READ_AFTER_EOF
        | TIMEOUT_EXCEEDED
        | SOCKET_TIMEOUT
        | NETWORK_ERROR
        | NO_ZOOKEEPER
        | TABLE_IS_READ_ONLY
        | ALL_CONNECTION_TRIES_FAILED
        | TOO_FEW_LIVE_REPLICAS
        | UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE
        | REPLICA_IS_NOT_IN_QUORUM
        | UNFINISHED
        | QUERY_WAS_CANCELLED
        | SYSTEM_ERROR
        | DEADLOCK_AVOIDED
        | KEEPER_EXCEPTION
        | POCO_EXCEPTION => ErrorKind::Transient,
        // The request or its data is wrong: parse and type errors, constraint violations,
        // undecodable bodies. Repeating the same request fails the same way.
        CANNOT_PARSE_TEXT
        | THERE_IS_NO_COLUMN
        | CANNOT_PARSE_ESCAPE_SEQUENCE
        | CANNOT_PARSE_QUOTED_STRING
        | CANNOT_PARSE_INPUT_ASSERTION_FAILED
        | CANNOT_READ_ALL_DATA
        | BAD_ARGUMENTS
        | CANNOT_PARSE_DATE
        | CANNOT_PARSE_DATETIME
        | ILLEGAL_TYPE_OF_ARGUMENT
        | ILLEGAL_COLUMN
        | TYPE_MISMATCH
        | SYNTAX_ERROR
        | ARGUMENT_OUT_OF_BOUND
        | CANNOT_CONVERT_TYPE
        | CANNOT_PARSE_NUMBER
        | INCORRECT_DATA
        | CANNOT_READ_ARRAY_FROM_TEXT
        | TOO_LARGE_STRING_SIZE
        | SIZES_OF_ARRAYS_DONT_MATCH
        | VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE
        | CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
        | ZLIB_INFLATE_FAILED
        | CANNOT_PARSE_UUID
        | CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING
        | UNKNOWN_QUERY_PARAMETER
        | BAD_QUERY_PARAMETER
        | CANNOT_PARSE_BOOL
        | VIOLATED_CONSTRAINT
        | ZSTD_DECODER_FAILED
        | CANNOT_PARSE_IPV4
        | CANNOT_PARSE_IPV6
        | DECIMAL_OVERFLOW
        | UNEXPECTED_DATA_AFTER_PARSED_VALUE
        | UNKNOWN_ELEMENT_OF_ENUM => ErrorKind::Permanent,
        _ => return None,
    })
}

/// Why a request failed below HTTP (mirrors the useful cases of `wasi:http` `error-code`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransportFailure {
    /// The host refused to send the request (not on its allow-list).
    Denied,
    /// Name resolution failed or timed out.
    Dns,
    /// Connection refused, destination unreachable.
    Refused,
    /// No connection within the connect timeout.
    ConnectTimeout,
    /// TLS handshake failed (protocol or alert).
    Tls,
    /// The server's certificate was rejected.
    TlsCertificate,
    /// No answer (first byte, or next bytes) within the request timeout.
    Timeout,
    /// The connection was closed or reset after the request started.
    Reset,
    /// The answer was not valid HTTP (before any response head: a server speaking another
    /// protocol). A body broken after a valid head is [`TransportFailure::Reset`].
    Protocol,
    /// The answer was HTTP but not ClickHouse's: in an encoding never asked for.
    NotClickHouse,
    /// The answer was larger than a bound allows (the detail names which: the host's response
    /// size limit, the statement's answer cap, the lz4 decode cap, or the instance's memory).
    TooLarge,
    /// The request could not be built (an internal error or an unsendable header value).
    InvalidRequest,
    /// Anything else.
    Other,
}

/// A failure of the transport, before any HTTP answer was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportError {
    /// What went wrong.
    pub failure: TransportFailure,
    /// Details from the transport (may be empty).
    pub detail: String,
}

impl TransportError {
    /// A transport error with details.
    pub fn new(failure: TransportFailure, detail: impl Into<String>) -> Self {
        TransportError {
            failure,
            detail: detail.into(),
        }
    }
}

/// Classifies a transport failure. Failures before a connection existed cannot have changed
/// anything; failures after it can have, for writes.
pub fn classify_transport(failure: &TransportFailure, op: Operation) -> ErrorKind {
    match failure {
        TransportFailure::Denied | TransportFailure::TlsCertificate => ErrorKind::Misconfigured,
        TransportFailure::Dns
        | TransportFailure::Refused
        | TransportFailure::ConnectTimeout
        | TransportFailure::Tls => ErrorKind::Disconnected,
        TransportFailure::InvalidRequest => ErrorKind::InvalidInput,
        // The same question gets the same oversized answer; a write was executed, though.
        TransportFailure::TooLarge => match op {
            Operation::Read => ErrorKind::Permanent,
            Operation::Write => ErrorKind::Uncertain,
        },
        // Not ClickHouse's answer (an encoding never asked for, or not HTTP at all): the same
        // request meets the same thing; a write may still have run. (A host that reports a
        // reply cut before its head as a protocol error, as stock wasmtime does, makes such a
        // cut read as this too: see docs/security.md.)
        TransportFailure::NotClickHouse | TransportFailure::Protocol => match op {
            Operation::Read => ErrorKind::Misconfigured,
            Operation::Write => ErrorKind::Uncertain,
        },
        TransportFailure::Timeout | TransportFailure::Reset | TransportFailure::Other => match op {
            Operation::Read => ErrorKind::Transient,
            Operation::Write => ErrorKind::Uncertain,
        },
    }
}

/// Seconds to one decimal (`1.5`), without float formatting (which costs the component
/// kilobytes: docs/measurements.md).
pub fn tenths(d: std::time::Duration) -> String {
    let tenths = (d.as_millis() + 50) / 100;
    format!("{}.{}", tenths / 10, tenths % 10)
}

/// Caps a message at [`MAX_MESSAGE_CHARS`] characters, on a character boundary.
pub fn cap(message: String) -> String {
    match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => {
            let mut capped = message[..cut].to_string();
            capped.push('…');
            capped
        }
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ErrorKind::*;
    use Operation::{Read, Write};

    #[test]
    fn server_codes_decide_before_status() {
        let cases: &[(u16, Option<i32>, Operation, ErrorKind)] = &[
            (403, Some(516), Read, Misconfigured),  // AUTHENTICATION_FAILED
            (401, Some(194), Read, Misconfigured),  // REQUIRED_PASSWORD
            (404, Some(81), Read, Misconfigured),   // UNKNOWN_DATABASE
            (404, Some(60), Write, Misconfigured),  // UNKNOWN_TABLE
            (404, Some(115), Read, Misconfigured),  // UNKNOWN_SETTING
            (500, Some(497), Read, Misconfigured),  // ACCESS_DENIED
            (500, Some(164), Write, Misconfigured), // READONLY
            (500, Some(252), Write, Throttled),     // TOO_MANY_PARTS
            (500, Some(241), Read, Throttled),      // MEMORY_LIMIT_EXCEEDED
            (500, Some(202), Read, Throttled),      // TOO_MANY_SIMULTANEOUS_QUERIES
            (400, Some(62), Read, Permanent),       // SYNTAX_ERROR
            (400, Some(27), Write, Permanent),      // CANNOT_PARSE_INPUT_ASSERTION_FAILED
            (400, Some(53), Write, Permanent),      // TYPE_MISMATCH
            (500, Some(130), Write, Permanent),     // CANNOT_READ_ARRAY_FROM_TEXT
            (500, Some(467), Write, Permanent),     // CANNOT_PARSE_BOOL
            (500, Some(691), Write, Permanent),     // UNKNOWN_ELEMENT_OF_ENUM, not transient
            (500, Some(469), Write, Permanent),     // VIOLATED_CONSTRAINT
            (500, Some(561), Write, Permanent),     // ZSTD_DECODER_FAILED
            (500, Some(319), Write, Uncertain),     // UNKNOWN_STATUS_OF_INSERT
            (500, Some(319), Read, Uncertain),
            (408, Some(159), Read, Transient),  // TIMEOUT_EXCEEDED
            (500, Some(242), Write, Transient), // TABLE_IS_READ_ONLY (keeper)
            (500, Some(999), Write, Transient), // KEEPER_EXCEPTION
            (503, Some(209), Read, Transient),  // SOCKET_TIMEOUT
            // Passed on to shards or replicas, a write may have landed on some.
            (500, Some(210), Write, Uncertain), // NETWORK_ERROR
            (500, Some(210), Read, Transient),
            (500, Some(279), Write, Uncertain), // ALL_CONNECTION_TRIES_FAILED
            (500, Some(285), Write, Uncertain), // TOO_FEW_LIVE_REPLICAS
            (408, Some(159), Write, Uncertain), // TIMEOUT_EXCEEDED
            // Replicated state tables: a quorum insert refused before it wrote, a read
            // refused by a replica behind the quorum, a delete unfinished on some replica.
            (500, Some(286), Write, Transient), // UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE
            (500, Some(289), Read, Transient),  // REPLICA_IS_NOT_IN_QUORUM
            (500, Some(341), Write, Transient), // UNFINISHED (the delete reclassifies it)
        ];
        for &(status, code, op, want) in cases {
            assert_eq!(
                classify_server(status, code, op),
                want,
                "status {status} code {code:?} {op:?}"
            );
        }
    }

    #[test]
    fn unknown_codes_fall_back_to_status() {
        let cases: &[(u16, Option<i32>, Operation, ErrorKind)] = &[
            (401, None, Read, Misconfigured),
            (403, Some(12345), Read, Misconfigured),
            (404, None, Write, Misconfigured),
            (400, Some(12345), Read, Permanent),
            (413, None, Write, Permanent),
            (429, None, Write, Throttled),
            (408, None, Read, Transient),
            (408, None, Write, Uncertain), // a proxy timed out: the insert may have run
            (502, None, Read, Transient),
            (502, None, Write, Uncertain),
            (503, None, Read, Transient),
            (504, None, Write, Uncertain),
            (500, Some(12345), Write, Transient), // the server said it failed
            (500, None, Write, Uncertain),        // something without a code: unknown outcome
            (500, None, Read, Transient),
        ];
        for &(status, code, op, want) in cases {
            assert_eq!(
                classify_server(status, code, op),
                want,
                "status {status} code {code:?} {op:?}"
            );
        }
    }

    #[test]
    fn transport_failures_before_and_after_connecting() {
        use TransportFailure as F;
        let before = [F::Dns, F::Refused, F::ConnectTimeout, F::Tls];
        for f in &before {
            assert_eq!(classify_transport(f, Read), Disconnected, "{f:?}");
            assert_eq!(classify_transport(f, Write), Disconnected, "{f:?}");
        }
        for f in [F::Timeout, F::Reset, F::Other] {
            assert_eq!(classify_transport(&f, Read), Transient, "{f:?}");
            assert_eq!(classify_transport(&f, Write), Uncertain, "{f:?}");
        }
        // Not ClickHouse's answer: repeating a read meets the same thing.
        for f in [F::NotClickHouse, F::Protocol] {
            assert_eq!(classify_transport(&f, Read), Misconfigured, "{f:?}");
            assert_eq!(classify_transport(&f, Write), Uncertain, "{f:?}");
        }
        assert_eq!(classify_transport(&F::Denied, Write), Misconfigured);
        assert_eq!(classify_transport(&F::TlsCertificate, Read), Misconfigured);
        assert_eq!(classify_transport(&F::InvalidRequest, Read), InvalidInput);
        assert_eq!(classify_transport(&F::TooLarge, Read), Permanent);
        assert_eq!(classify_transport(&F::TooLarge, Write), Uncertain);
    }

    #[test]
    fn exit_codes_are_distinct_and_documented_range() {
        let mut seen = std::collections::HashSet::new();
        for kind in ErrorKind::ALL {
            let code = kind.exit_code();
            assert!((2..=10).contains(&code), "{kind}");
            assert!(seen.insert(code), "{kind} reuses {code}");
        }
        assert_eq!(InvalidInput.exit_code(), 2);
    }

    #[test]
    fn only_connection_and_load_failures_are_retryable() {
        let retryable: Vec<_> = ErrorKind::ALL
            .into_iter()
            .filter(|k| k.is_retryable())
            .collect();
        assert_eq!(retryable, vec![Disconnected, Transient, Throttled]);
    }

    #[test]
    fn messages_are_capped_on_a_char_boundary() {
        let long = "é".repeat(2000);
        let e = Error::invalid(long);
        assert_eq!(e.message.chars().count(), MAX_MESSAGE_CHARS + 1);
        assert!(e.message.ends_with('…'));
        let short = Error::invalid("short");
        assert_eq!(short.message, "short");
    }

    #[test]
    fn reclassified_errors_keep_the_server_error_and_are_capped() {
        let cause = Error {
            server: Some(ServerError {
                code: 27,
                name: "CANNOT_PARSE_INPUT_ASSERTION_FAILED".into(),
                http_status: 400,
            }),
            ..Error::new(Permanent, "bad row")
        };
        let e = Error::uncertain_after(40, "chunk 3 failed after 40 rows", cause.clone());
        assert_eq!((e.kind, e.committed_rows), (Uncertain, 40));
        assert_eq!(
            e.message,
            "chunk 3 failed after 40 rows (permanent: bad row)"
        );
        assert_eq!(e.server, cause.server);
        let long = cause.reclassify(Transient, "x".repeat(2 * MAX_MESSAGE_CHARS));
        assert_eq!(long.message.chars().count(), MAX_MESSAGE_CHARS + 1);
        assert_eq!(long.server.unwrap().code, 27);
    }
}
