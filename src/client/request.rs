//! Turns a [`Query`] into an HTTP request for ClickHouse's HTTP interface: URL (settings, typed
//! `param_*` values), auth headers, body.

use std::time::Duration;

use super::compression::{self, Compression};
use super::dsn::Endpoint;
use super::error::{Error, Operation};
use super::settings;
use super::url::encode_component;

/// Version sent in the `User-Agent` header.
pub const USER_AGENT: &str = concat!("clickhouse-component/", env!("CARGO_PKG_VERSION"));

/// Header naming the component operation that caused a request (for the host's logs).
pub const OPERATION_HEADER: &str = "x-component-operation";

/// HTTP method: every request is a POST (reads too: a GET would make the server read-only,
/// and the body carries the statement).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// POST.
    Post,
}

/// A fully built HTTP request, ready for a [`Transport`](super::transport::Transport).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpRequest {
    /// Method.
    pub method: Method,
    /// HTTPS when true.
    pub tls: bool,
    /// `host:port`.
    pub authority: String,
    /// Path and query string, starting with `/`.
    pub path_and_query: String,
    /// Header names (lower case) and values; `content-length` is the transport's business.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Request body.
    pub body: Vec<u8>,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// First-byte and between-bytes timeout: no byte sent or received for this long ends the
    /// request.
    pub request_timeout: Duration,
    /// Most bytes of a successful answer (as sent, before any decoding); a longer one fails
    /// the request without being read further.
    pub max_answer_bytes: usize,
    /// The whole answer must have arrived within this time from the start (small answers:
    /// one that trickles in cannot hold a call); `None`: as long as it makes progress.
    pub answer_deadline: Option<Duration>,
    /// Whether the request may change data (decides how interruptions are classified).
    pub operation: Operation,
}

/// Most bytes of a small answer (the default): a state (two parts of at most 10 MiB each,
/// escaped), a table's columns, the lock's rows. Larger reads are [`Answer::Large`].
pub const SMALL_ANSWER_BYTES: usize = 64 << 20;

/// What answer a statement expects, which bounds how large it may be and how long it may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A few rows, at most this many bytes, and whole within the request timeout (unless the
    /// statement carries INSERT data, which may take as long as it makes progress).
    Small(usize),
    /// Many rows (ids, get-all): up to
    /// [`MAX_DECODED_ANSWER`](super::compression::MAX_DECODED_ANSWER), as long as it makes
    /// progress.
    Large,
}

/// One ClickHouse statement with its typed parameters, settings and data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    /// Short name of the component operation, e.g. `ping` (logged by the host).
    pub name: &'static str,
    /// SQL text. Values and identifiers never go here: use `{name:Type}` placeholders.
    pub sql: String,
    /// Parameter values by name, already in ClickHouse's text form (unescaped).
    pub params: Vec<(String, String)>,
    /// Settings for this statement only (after the endpoint's).
    pub settings: Vec<(String, String)>,
    /// Output format (`default_format`), if the statement returns rows.
    pub format: Option<String>,
    /// INSERT data: when present the SQL travels in the URL and this is the body.
    pub data: Option<Vec<u8>>,
    /// How the INSERT data is compressed on the wire (`Content-Encoding`); only `data` is.
    pub compression: Compression,
    /// Ask for the answer compressed (large reads): `enable_http_compression=1` and
    /// `Accept-Encoding: lz4`; the client decodes it.
    pub compressed_answer: bool,
    /// External data (a temporary table the statement reads): when present the SQL travels
    /// in the URL and the body is `multipart/form-data` holding the table.
    pub external: Option<ExternalTable>,
    /// How large the answer may be, and whether it has a total deadline.
    pub answer: Answer,
    /// Read or write.
    pub operation: Operation,
}

/// ClickHouse's "external data for query processing" over HTTP: a temporary table `name`,
/// visible to the statement only, made by the server from rows sent as a file part of a
/// `multipart/form-data` body (`name_structure` / `name_format` in the URL). Values too large
/// for the URL (a request target is limited to 64 KiB here, 1 MiB on a server) travel so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalTable {
    /// Table name (an identifier: letters, digits, `_`).
    pub name: String,
    /// Columns, e.g. `p String, c String`.
    pub structure: String,
    /// The rows, in TabSeparated: values escaped with [`escape_param`], a tab between
    /// columns, a newline after each row.
    pub rows: Vec<u8>,
}

impl Query {
    /// A read-only statement.
    pub fn read(name: &'static str, sql: impl Into<String>) -> Self {
        Query {
            name,
            sql: sql.into(),
            params: Vec::new(),
            settings: Vec::new(),
            format: None,
            data: None,
            compression: Compression::None,
            compressed_answer: false,
            external: None,
            answer: Answer::Small(SMALL_ANSWER_BYTES),
            operation: Operation::Read,
        }
    }

    /// A statement that may change data.
    pub fn write(name: &'static str, sql: impl Into<String>) -> Self {
        Query {
            operation: Operation::Write,
            ..Query::read(name, sql)
        }
    }

    /// Binds `{name:Type}` to a value (its text form, e.g. `42`, `it's`, an identifier).
    pub fn param(mut self, name: &str, value: impl Into<String>) -> Self {
        self.params.push((name.to_string(), value.into()));
        self
    }

    /// Adds a setting for this statement.
    pub fn setting(mut self, name: &str, value: impl Into<String>) -> Self {
        self.settings.push((name.to_string(), value.into()));
        self
    }

    /// Asks for rows in this format.
    pub fn format(mut self, format: &str) -> Self {
        self.format = Some(format.to_string());
        self
    }

    /// Attaches INSERT data (the SQL must end in `FORMAT <name>`).
    pub fn data(mut self, data: Vec<u8>) -> Self {
        self.data = Some(data);
        self
    }

    /// Compresses the INSERT data with `method` (see [`Compression`]).
    pub fn compress(mut self, method: Compression) -> Self {
        self.compression = method;
        self
    }

    /// A large read: asks for the answer compressed (see
    /// [`Query::compressed_answer`](Query#structfield.compressed_answer)) and expects
    /// [`Answer::Large`].
    pub fn compressed_answer(mut self) -> Self {
        self.compressed_answer = true;
        self.answer = Answer::Large;
        self.setting(settings::ENABLE_HTTP_COMPRESSION, "1")
    }

    /// Expects an answer of at most `max_bytes` ([`Answer::Small`]).
    pub fn small_answer(mut self, max_bytes: usize) -> Self {
        self.answer = Answer::Small(max_bytes);
        self
    }

    /// The same statement without asking for a compressed answer.
    pub fn uncompressed_answer(mut self) -> Self {
        self.compressed_answer = false;
        self.settings
            .retain(|(name, _)| name != settings::ENABLE_HTTP_COMPRESSION);
        self
    }

    /// Sends `table` with the statement (see [`ExternalTable`]).
    pub fn external(mut self, table: ExternalTable) -> Self {
        self.external = Some(table);
        self
    }

    /// Builds the HTTP request for `endpoint`.
    ///
    /// The statement goes in the body, or in the `query` URL parameter when the body holds
    /// INSERT data. Every request waits for the end of the query on the server
    /// (`wait_end_of_query=1`), so a 200 status means the whole statement succeeded.
    pub fn to_http(&self, endpoint: &Endpoint) -> Result<HttpRequest, Error> {
        self.clone().into_http(endpoint)
    }

    /// As [`Query::to_http`], moving the data into the request instead of copying it.
    pub fn into_http(mut self, endpoint: &Endpoint) -> Result<HttpRequest, Error> {
        let mut url = String::from("/?");
        // The longest part of the URL so far, for the message when the URL is too long.
        let mut longest: (usize, String) = (0, String::new());
        let mut push = |key: &str, value: &str| {
            if url.len() > 2 {
                url.push('&');
            }
            let before = url.len();
            url.push_str(&encode_component(key));
            url.push('=');
            url.push_str(&encode_component(value));
            if url.len() - before > longest.0 {
                longest = (url.len() - before, key.to_string());
            }
        };
        if let Some(db) = &endpoint.database {
            push(settings::DATABASE, db);
        }
        if let Some(format) = &self.format {
            push(settings::DEFAULT_FORMAT, format);
        }
        push(settings::WAIT_END_OF_QUERY, "1");
        // A statement's own setting replaces the connection's of the same name.
        let overridden = |name: &str| self.settings.iter().any(|(n, _)| n == name);
        for (name, value) in endpoint.settings.iter().filter(|(n, _)| !overridden(n)) {
            push(name, value);
        }
        for (name, value) in &self.settings {
            push(name, value);
        }

        for (name, value) in &self.params {
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(Error::invalid(format!(
                    "query parameter name '{}' is not an identifier",
                    crate::text::escaped(name)
                )));
            }
            push(
                &format!("{}{name}", settings::PARAM_PREFIX),
                &escape_param(value),
            );
        }
        let mut headers = headers(endpoint, self.name);
        if self.compressed_answer {
            headers.push((
                "accept-encoding".into(),
                compression::ANSWER_ENCODING.as_bytes().to_vec(),
            ));
        }
        let inserts = self.data.is_some();
        let body = match (self.data.take(), self.external.take()) {
            (Some(_), Some(_)) => {
                return Err(Error::invalid(
                    "a statement cannot carry both INSERT data and an external table",
                ))
            }
            (Some(data), None) => {
                push(settings::QUERY, &self.sql);
                if let Some(encoding) = self.compression.content_encoding() {
                    headers.push(("content-encoding".into(), encoding.as_bytes().to_vec()));
                }
                self.compression.encode(data)
            }
            (None, Some(table)) => {
                if table.name.is_empty()
                    || !table
                        .name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_')
                {
                    return Err(Error::invalid(format!(
                        "external table name '{}' is not an identifier",
                        crate::text::escaped(&table.name)
                    )));
                }
                push(&format!("{}_structure", table.name), &table.structure);
                push(&format!("{}_format", table.name), "TabSeparated");
                push(settings::QUERY, &self.sql);
                let (content_type, body) = multipart_file(&table.name, &table.rows);
                headers.push(("content-type".into(), content_type.into_bytes()));
                body
            }
            (None, None) => self.sql.clone().into_bytes(),
        };
        if url.len() > MAX_REQUEST_TARGET_BYTES {
            return Err(too_long(url.len(), &longest));
        }
        Ok(HttpRequest {
            method: Method::Post,
            tls: endpoint.tls,
            authority: endpoint.authority(),
            path_and_query: url,
            headers,
            body,
            connect_timeout: endpoint.connect_timeout,
            request_timeout: endpoint.request_timeout,
            max_answer_bytes: match self.answer {
                Answer::Small(max) => max,
                Answer::Large => {
                    usize::try_from(compression::MAX_DECODED_ANSWER).unwrap_or(usize::MAX)
                }
            },
            answer_deadline: match self.answer {
                Answer::Small(_) if !inserts => Some(endpoint.request_timeout),
                _ => None,
            },
            operation: self.operation,
        })
    }
}

/// The longest request target (path and query) a request may have: the URL as a whole is
/// limited to 65,534 bytes by the HTTP stack wasi:http hosts use (the `http` crate's `Uri`; a
/// server's `http_max_uri_size` is 1 MiB), with room left for the scheme and authority.
pub const MAX_REQUEST_TARGET_BYTES: usize = 65_000;

/// The error for a URL of `bytes` that is too long, naming its longest part (`key`, with its
/// encoded length): which input to shorten.
fn too_long(bytes: usize, (part_bytes, key): &(usize, String)) -> Error {
    let part = if key == settings::QUERY {
        "the statement (an INSERT's column list, or a state id, travels in it)".to_string()
    } else if key == settings::DATABASE {
        "the database name".to_string()
    } else if let Some(param) = key.strip_prefix(settings::PARAM_PREFIX) {
        format!("the value of query parameter '{param}' (a database, table or id name)")
    } else {
        format!("the setting '{}'", shorten(key))
    };
    Error::invalid(format!(
        "the request's URL would be {bytes} bytes, over the {MAX_REQUEST_TARGET_BYTES} it may be: its longest part is {part}, {part_bytes} bytes URL-encoded; shorten it"
    ))
}

/// At most 64 characters of a name, for a message.
fn shorten(name: &str) -> String {
    match name.char_indices().nth(64) {
        Some((cut, _)) => format!("{}…", &name[..cut]),
        None => name.to_string(),
    }
}

/// A `multipart/form-data` body with one file part named `name` holding `content`, and its
/// Content-Type. The boundary is derived from the content (the same content always makes the
/// same bytes: a repeated request is byte-identical) and never occurs in it.
fn multipart_file(name: &str, content: &[u8]) -> (String, Vec<u8>) {
    // FNV-1a of the content, then a counter until the boundary is absent from it.
    let hash = content.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    let mut boundary = String::new();
    for n in 0u32.. {
        boundary = format!("clickhouse-component-{hash:016x}-{n}");
        let delimiter = format!("--{boundary}");
        if !content
            .windows(delimiter.len())
            .any(|w| w == delimiter.as_bytes())
        {
            break;
        }
    }
    let mut body = Vec::with_capacity(content.len() + 256);
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// Escapes a parameter value the way the server unescapes it (TabSeparated escaping).
pub fn escape_param(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            c => out.push(c),
        }
    }
    out
}

/// Auth, user agent and operation headers. Credentials go in `X-ClickHouse-User`/`-Key`, or
/// in HTTP Basic when they hold characters a header value cannot carry.
fn headers(endpoint: &Endpoint, operation: &str) -> Vec<(String, Vec<u8>)> {
    let header_safe = |s: &str| !s.chars().any(|c| c.is_control());
    let mut headers = Vec::with_capacity(4);
    if header_safe(&endpoint.user) && header_safe(&endpoint.password) {
        headers.push((
            "x-clickhouse-user".into(),
            endpoint.user.clone().into_bytes(),
        ));
        headers.push((
            "x-clickhouse-key".into(),
            endpoint.password.clone().into_bytes(),
        ));
    } else {
        let mut value = b"Basic ".to_vec();
        value.extend(basic_credentials(&endpoint.user, &endpoint.password).into_bytes());
        headers.push(("authorization".into(), value));
    }
    headers.push(("user-agent".into(), USER_AGENT.as_bytes().to_vec()));
    headers.push((OPERATION_HEADER.into(), operation.as_bytes().to_vec()));
    headers
}

/// HTTP Basic's credentials: the base64 of `user:password` (also a form of the password the
/// [`Redactor`](super::secrets::Redactor) removes from messages: a server may echo the header).
pub fn basic_credentials(user: &str, password: &str) -> String {
    base64(format!("{user}:{password}").as_bytes())
}

/// Standard base64 with padding (RFC 4648). Written here, not taken from the base64 crate:
/// its engine costs the library component about 3 KB for one short header
/// (docs/measurements.md); a test compares the two on random inputs.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let n = group
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= group.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::dsn::ConnectionOptions;

    fn endpoint(url: &str) -> Endpoint {
        Endpoint::parse(&ConnectionOptions::from_url(url)).unwrap()
    }

    fn header<'a>(req: &'a HttpRequest, name: &str) -> Option<&'a [u8]> {
        req.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    #[test]
    fn select_goes_in_the_body_with_typed_params() {
        let ep = endpoint("clickhouse://alice:pw@h:9/db?max_threads=2");
        let q = Query::read("get", "SELECT * FROM {t:Identifier} WHERE id = {id:String}")
            .param("t", "state")
            .param("id", "a\tb\\c'd&e")
            .format("JSONEachRow");
        let req = q.to_http(&ep).unwrap();
        assert_eq!(req.method, Method::Post);
        assert_eq!(req.authority, "h:9");
        assert_eq!(
            req.path_and_query,
            "/?database=db&default_format=JSONEachRow&wait_end_of_query=1&max_threads=2&param_t=state&param_id=a%5Ctb%5C%5Cc%27d%26e"
        );
        assert_eq!(req.body, q.sql.as_bytes());
        assert_eq!(header(&req, "x-clickhouse-user"), Some(&b"alice"[..]));
        assert_eq!(header(&req, "x-clickhouse-key"), Some(&b"pw"[..]));
        assert_eq!(header(&req, OPERATION_HEADER), Some(&b"get"[..]));
        assert_eq!(req.operation, Operation::Read);
    }

    #[test]
    fn an_external_table_goes_in_a_multipart_body_and_the_sql_in_the_url() {
        let ep = endpoint("clickhouse://h:9/db");
        let rows = b"a\tb\n--clickhouse-component-x\n".to_vec();
        let q = Query::write("set", "INSERT INTO t SELECT p FROM parts").external(ExternalTable {
            name: "parts".into(),
            structure: "p String, c String".into(),
            rows: rows.clone(),
        });
        let req = q.to_http(&ep).unwrap();
        assert!(req.path_and_query.contains("&parts_structure=p%20String%2C%20c%20String&parts_format=TabSeparated&query=INSERT%20INTO"), "{}", req.path_and_query);
        let content_type =
            String::from_utf8(header(&req, "content-type").unwrap().to_vec()).unwrap();
        let boundary = content_type
            .strip_prefix("multipart/form-data; boundary=")
            .unwrap();
        let body = String::from_utf8(req.body.clone()).unwrap();
        assert_eq!(
            body,
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"parts\"; filename=\"parts\"\r\nContent-Type: application/octet-stream\r\n\r\na\tb\n--clickhouse-component-x\n\r\n--{boundary}--\r\n")
        );
        // The same rows make the same bytes (a repeated request is identical); the boundary
        // never occurs in the rows, even rows made to contain the first one tried.
        assert_eq!(q.to_http(&ep).unwrap().body, req.body);
        let (first, _) = multipart_file("parts", b"");
        let first = first
            .strip_prefix("multipart/form-data; boundary=")
            .unwrap()
            .to_string();
        let (_, collide) = multipart_file("parts", format!("x--{first}").as_bytes());
        assert!(!collide.is_empty());
        let hostile = format!("--{first}");
        for n in 0..3 {
            let rows = format!("{hostile}-{n}").repeat(2).into_bytes();
            let (ct, body) = multipart_file("parts", &rows);
            let b = ct.strip_prefix("multipart/form-data; boundary=").unwrap();
            let inner = &body[..body.len() - b.len() - 8];
            assert_eq!(
                String::from_utf8_lossy(inner)
                    .matches(&format!("--{b}"))
                    .count(),
                1
            );
        }
        // Not both kinds of body; the table's name is an identifier.
        assert!(Query::write("x", "INSERT INTO t FORMAT TSV")
            .data(vec![])
            .external(ExternalTable {
                name: "p".into(),
                structure: "p String".into(),
                rows: vec![]
            })
            .to_http(&ep)
            .is_err());
        assert!(Query::read("x", "SELECT 1")
            .external(ExternalTable {
                name: "a&b".into(),
                structure: "p String".into(),
                rows: vec![]
            })
            .to_http(&ep)
            .is_err());
    }

    #[test]
    fn insert_sql_goes_in_the_url_and_data_in_the_body() {
        let ep = endpoint("http://h");
        let q = Query::write("send", "INSERT INTO {t:Identifier} FORMAT JSONEachRow")
            .param("t", "events")
            .setting("insert_deduplication_token", "abc")
            .data(b"{\"a\":1}\n".to_vec());
        let req = q.to_http(&ep).unwrap();
        assert!(req
            .path_and_query
            .contains("&query=INSERT%20INTO%20%7Bt%3AIdentifier%7D%20FORMAT%20JSONEachRow"));
        assert!(req
            .path_and_query
            .contains("insert_deduplication_token=abc"));
        assert_eq!(req.body, b"{\"a\":1}\n");
        assert_eq!(req.operation, Operation::Write);
    }

    #[test]
    fn a_compressed_answer_is_asked_for_with_the_setting_and_accept_encoding() {
        // The connection's own value of the setting gives way to the statement's.
        let ep = endpoint("http://h/?enable_http_compression=0");
        let plain = Query::read("get-all", "SELECT 1").to_http(&ep).unwrap();
        assert_eq!(header(&plain, "accept-encoding"), None);
        let req = Query::read("get-all", "SELECT 1")
            .compressed_answer()
            .to_http(&ep)
            .unwrap();
        assert_eq!(header(&req, "accept-encoding"), Some(&b"lz4"[..]));
        assert_eq!(
            req.path_and_query
                .matches("enable_http_compression")
                .count(),
            1,
            "{}",
            req.path_and_query
        );
        assert!(req.path_and_query.contains("enable_http_compression=1"));
    }

    #[test]
    fn compressed_insert_data_carries_its_content_encoding() {
        let ep = endpoint("http://h");
        let data = b"{\"a\":1}\n".repeat(100);
        let plain = Query::write("send", "INSERT INTO t FORMAT JSONEachRow").data(data.clone());
        assert_eq!(
            header(&plain.to_http(&ep).unwrap(), "content-encoding"),
            None
        );
        let req = plain
            .clone()
            .compress(Compression::Lz4)
            .to_http(&ep)
            .unwrap();
        assert_eq!(header(&req, "content-encoding"), Some(&b"lz4"[..]));
        assert_eq!(req.body, Compression::Lz4.encode(data));
        // Only INSERT data is compressed: a statement in the body never is.
        let select = Query::read("x", "SELECT 1").compress(Compression::Gzip);
        let req = select.to_http(&ep).unwrap();
        assert_eq!(header(&req, "content-encoding"), None);
        assert_eq!(req.body, b"SELECT 1");
    }

    #[test]
    fn param_escaping_matches_server_unescaping() {
        assert_eq!(escape_param("plain"), "plain");
        assert_eq!(escape_param("a\tb\nc\\d\re\0"), "a\\tb\\nc\\\\d\\re\\0");
        assert_eq!(escape_param("quote'`\"ok"), "quote'`\"ok");
    }

    #[test]
    fn bad_param_names_are_rejected() {
        let ep = endpoint("http://h");
        let err = Query::read("x", "SELECT 1")
            .param("a b", "1")
            .to_http(&ep)
            .unwrap_err();
        assert!(err.message.contains("not an identifier"));
    }

    #[test]
    fn a_url_too_long_names_its_longest_part() {
        let e = endpoint("http://h:8123");
        let columns: Vec<String> = (0..8000).map(|i| format!("`column_{i}`")).collect();
        let insert = format!("INSERT INTO t ({}) FORMAT JSONEachRow", columns.join(", "));
        let err = Query::write("insert", insert)
            .data(b"{}".to_vec())
            .to_http(&e)
            .unwrap_err();
        assert_eq!(err.kind, crate::client::ErrorKind::InvalidInput);
        assert!(
            err.message.contains("its longest part is the statement"),
            "{}",
            err.message
        );
        assert!(err.message.contains("over the 65000"), "{}", err.message);
        let err = Query::read("get", "SELECT 1")
            .param("id", "x".repeat(70_000))
            .to_http(&e)
            .unwrap_err();
        assert!(
            err.message.contains("query parameter 'id'"),
            "{}",
            err.message
        );
        // At the limit it is built.
        assert!(Query::read("get", "SELECT 1")
            .param("id", "x".repeat(50_000))
            .to_http(&e)
            .is_ok());
    }

    #[test]
    fn control_characters_in_credentials_use_basic_auth() {
        let ep = Endpoint::parse(&ConnectionOptions {
            url: "http://h".into(),
            password: Some("line\nbreak".into()),
            ..Default::default()
        })
        .unwrap();
        let req = Query::read("x", "SELECT 1").to_http(&ep).unwrap();
        assert_eq!(header(&req, "x-clickhouse-key"), None);
        let auth = header(&req, "authorization").unwrap();
        assert_eq!(
            auth,
            format!("Basic {}", base64(b"default:line\nbreak")).as_bytes()
        );
    }

    #[test]
    fn base64_matches_the_base64_crate_on_random_inputs() {
        use base64::Engine;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for len in 0..300 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            assert_eq!(
                base64(&bytes),
                base64::engine::general_purpose::STANDARD.encode(&bytes)
            );
        }
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (input, want) in cases {
            assert_eq!(base64(input.as_bytes()), want);
        }
    }
}
