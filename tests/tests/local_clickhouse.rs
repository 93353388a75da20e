//! The local ClickHouse's conformance with a real server.
//!
//! The local ClickHouse (tests/local_clickhouse/server.py) is the real ClickHouse engine behind a
//! small HTTP front; the rest of the suite trusts it to answer as a ClickHouse server does. Each
//! case here is something a real ClickHouse server (26.x) does over its HTTP interface
//! (<https://clickhouse.com/docs/interfaces/http>), checked over raw HTTP so that statuses, headers
//! and bodies are seen exactly as sent. The same file passes against a real server named by
//! `CLICKHOUSE_URL` (plain `http://` only: the test crate's ureq is built without TLS).
//!
//! Where a case depends on a detail of the server, its comment names the ClickHouse source that
//! decides it (paths in the ClickHouse/ClickHouse repository).

use std::io::{Read, Write};
use std::sync::OnceLock;
use std::time::Duration;

use clickhouse_component_tests::{clickhouse, unique_name};
use serde_json::{json, Map, Value};

// ---------------------------------------------------------------------------------------------
// Raw HTTP.

/// One HTTP answer as received.
struct Answer {
    status: u16,
    /// Header names lower-cased.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// `X-ClickHouse-Exception-Code`, parsed.
    fn exception_code(&self) -> Option<i64> {
        self.header("X-ClickHouse-Exception-Code")
            .map(|c| c.trim().parse().expect("a numeric exception code"))
    }

    /// The `N` of a body that starts `Code: N.`.
    fn body_code(&self) -> Option<i64> {
        let text = self.text();
        let rest = text.strip_prefix("Code: ")?;
        rest[..rest.find('.')?].parse().ok()
    }

    /// `X-ClickHouse-Summary`, parsed.
    fn summary(&self) -> Map<String, Value> {
        let raw = self
            .header("X-ClickHouse-Summary")
            .unwrap_or_else(|| panic!("no X-ClickHouse-Summary: {self:?}"));
        match serde_json::from_str(raw) {
            Ok(Value::Object(map)) => map,
            other => panic!("X-ClickHouse-Summary is not a JSON object: {raw:?} ({other:?})"),
        }
    }

    /// Asserts a 200 answer.
    fn ok(self) -> Answer {
        assert_eq!(self.status, 200, "{self:?}");
        assert_eq!(self.header("X-ClickHouse-Exception-Code"), None, "{self:?}");
        self
    }

    /// Asserts an exception answer as a server sends it: this HTTP status, this code in
    /// `X-ClickHouse-Exception-Code`, and a body that starts `Code: <code>.`.
    fn error(self, status: u16, code: i64) -> Answer {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.exception_code(), Some(code), "{self:?}");
        assert_eq!(self.body_code(), Some(code), "{self:?}");
        self
    }
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HTTP {} {:?} {:?}",
            self.status,
            self.headers,
            self.text()
        )
    }
}

fn agent() -> &'static ureq::Agent {
    static AGENT: OnceLock<ureq::Agent> = OnceLock::new();
    AGENT.get_or_init(|| {
        ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .build()
    })
}

/// Sends one request to the test server (no credentials unless `headers` carry them). POST always
/// sends a body (`Content-Length: 0` when there is none), as a server requires.
fn try_http(
    method: &str,
    path: &str,
    params: &[(String, String)],
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Result<Answer, String> {
    let url = format!("{}{path}", clickhouse().url.trim_end_matches('/'));
    let mut request = agent().request(method, &url);
    for (name, value) in params {
        request = request.query(name, value);
    }
    for (name, value) in headers {
        request = request.set(name, value);
    }
    let result = if method == "POST" {
        request.send_bytes(body.unwrap_or_default())
    } else {
        assert!(body.is_none(), "{method} with a body");
        request.call()
    };
    let response = match result {
        Ok(response) | Err(ureq::Error::Status(_, response)) => response,
        Err(e) => return Err(format!("{method} {url}: {e}")),
    };
    let status = response.status();
    let headers = response
        .headers_names()
        .into_iter()
        .filter_map(|n| {
            let v = response.header(&n)?.to_string();
            Some((n.to_ascii_lowercase(), v))
        })
        .collect();
    let mut body = Vec::new();
    response
        .into_reader()
        .take(64 << 20)
        .read_to_end(&mut body)
        .map_err(|e| format!("{method} {url}: reading the body: {e}"))?;
    Ok(Answer {
        status,
        headers,
        body,
    })
}

fn http(
    method: &str,
    path: &str,
    params: &[(String, String)],
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Answer {
    try_http(method, path, params, headers, body).unwrap_or_else(|e| panic!("{e}"))
}

/// `X-ClickHouse-User` / `X-ClickHouse-Key` headers for the test server, followed by `extra`.
fn with_auth<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let server = clickhouse();
    let mut headers = vec![
        ("X-ClickHouse-User", server.user.as_str()),
        ("X-ClickHouse-Key", server.password.as_str()),
    ];
    headers.extend_from_slice(extra);
    headers
}

/// URL parameters: `query` and a `param_<name>` per binding.
fn query(sql: &str, binds: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut params = vec![("query".to_string(), sql.to_string())];
    params.extend(
        binds
            .iter()
            .map(|(name, value)| (format!("param_{name}"), value.to_string())),
    );
    params
}

/// `params` plus more URL parameters (settings, `database`, `query_id`, ...).
fn and(mut params: Vec<(String, String)>, more: &[(&str, &str)]) -> Vec<(String, String)> {
    params.extend(more.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    params
}

/// An authenticated POST.
fn post(params: &[(String, String)], body: &[u8]) -> Answer {
    http("POST", "/", params, &with_auth(&[]), Some(body))
}

/// An authenticated GET.
fn get(params: &[(String, String)]) -> Answer {
    http("GET", "/", params, &with_auth(&[]), None)
}

/// NDJSON (JSONEachRow) of these rows.
fn ndjson(rows: &[Value]) -> Vec<u8> {
    let mut body = Vec::new();
    for row in rows {
        body.extend_from_slice(row.to_string().as_bytes());
        body.push(b'\n');
    }
    body
}

// ---------------------------------------------------------------------------------------------
// A scratch database per test, dropped at the end.

struct Scratch {
    db: String,
}

impl Scratch {
    fn new(prefix: &str) -> Scratch {
        let db = unique_name(prefix);
        post(
            &query("CREATE DATABASE {db:Identifier}", &[("db", &db)]),
            b"",
        )
        .ok();
        Scratch { db }
    }

    /// Creates a MergeTree table with these columns and returns its name.
    fn table(&self, columns: &str) -> String {
        let table = unique_name("t");
        let sql = format!(
            "CREATE TABLE {{db:Identifier}}.{{t:Identifier}} ({columns}) \
             ENGINE = MergeTree ORDER BY tuple()"
        );
        post(&query(&sql, &[("db", &self.db), ("t", &table)]), b"").ok();
        table
    }

    /// Runs a SELECT (with `{db:Identifier}` bound to this database) and returns its rows.
    fn rows(&self, sql: &str, binds: &[(&str, &str)]) -> Vec<Value> {
        let mut all = vec![("db", self.db.as_str())];
        all.extend_from_slice(binds);
        let answer = post(&query(&format!("{sql} FORMAT JSONEachRow"), &all), b"").ok();
        answer
            .text()
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The number of rows in one of this database's tables.
    fn count(&self, table: &str) -> u64 {
        let answer = post(
            &query(
                "SELECT count() FROM {db:Identifier}.{t:Identifier}",
                &[("db", &self.db), ("t", table)],
            ),
            b"",
        )
        .ok();
        answer.text().trim().parse().unwrap()
    }

    /// Whether this database has a table of that name.
    fn has_table(&self, table: &str) -> bool {
        let answer = post(
            &query(
                "SELECT count() FROM system.tables WHERE database = {db:String} AND name = {t:String}",
                &[("db", &self.db), ("t", table)],
            ),
            b"",
        )
        .ok();
        answer.text().trim() != "0"
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Best effort, and never a panic (this may run while a failed test unwinds).
        let _ = try_http(
            "POST",
            "/",
            &query(
                "DROP DATABASE IF EXISTS {db:Identifier} SYNC",
                &[("db", &self.db)],
            ),
            &with_auth(&[]),
            Some(b""),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Query parameters in INSERT statements.

/// ClickHouse's parser takes a query parameter for the table of an INSERT but not in its column
/// list (ParserInsertQuery parses the columns as plain identifiers): the statement is a syntax
/// error before any data is read, so nothing is written.
#[test]
fn a_parameterised_insert_column_list_is_a_syntax_error() {
    let s = Scratch::new("lc_cols");
    let t = s.table("id String, n UInt32 DEFAULT 7");

    let refused = post(
        &and(
            query(
                "INSERT INTO {t:Identifier} ({c0:Identifier}) FORMAT JSONEachRow",
                &[("t", &t), ("c0", "id")],
            ),
            &[("database", &s.db)],
        ),
        &ndjson(&[json!({"id": "a"})]),
    )
    .error(400, 62);
    assert!(refused.text().contains("SYNTAX_ERROR"), "{refused:?}");
    assert_eq!(s.count(&t), 0);

    // The column list written as backquoted identifiers, the table bound by a parameter.
    let written = post(
        &and(
            query(
                "INSERT INTO {t:Identifier} (`id`) FORMAT JSONEachRow",
                &[("t", &t)],
            ),
            &[("database", &s.db)],
        ),
        &ndjson(&[json!({"id": "a"}), json!({"id": "b"})]),
    )
    .ok();
    assert_eq!(written.summary()["written_rows"], "2", "{written:?}");

    // Database and table both bound.
    post(
        &query(
            "INSERT INTO {db:Identifier}.{t:Identifier} (`id`, `n`) FORMAT JSONEachRow",
            &[("db", &s.db), ("t", &t)],
        ),
        &ndjson(&[json!({"id": "c", "n": 3})]),
    )
    .ok();

    assert_eq!(
        s.rows(
            "SELECT id, n FROM {db:Identifier}.{t:Identifier} ORDER BY id",
            &[("t", &t)]
        ),
        [
            json!({"id": "a", "n": 7}),
            json!({"id": "b", "n": 7}),
            json!({"id": "c", "n": 3}),
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Typed query parameters are bound by the engine.

/// Values of typed parameters are TSV-escaped text (tab `\t`, newline `\n`, backslash `\\`),
/// parsed with the type's escaped-text deserialisation (ReplaceQueryParameterVisitor::
/// resolveParameterValueAsField, src/Interpreters/ReplaceQueryParameterVisitor.cpp).
#[test]
fn typed_query_parameters_round_trip_escaped_values() {
    let s = Scratch::new("lc_params");
    let t = s.table("id String, n UInt32");
    let tricky = "a\tb\\c\nd 'q' \"dq\" {x:String}";
    let escaped = "a\\tb\\\\c\\nd 'q' \"dq\" {x:String}";

    // Streamed INSERT ... FORMAT with the table bound.
    post(
        &and(
            query(
                "INSERT INTO {t:Identifier} FORMAT JSONEachRow",
                &[("t", &t)],
            ),
            &[("database", &s.db)],
        ),
        &ndjson(&[
            json!({"id": tricky, "n": 42}),
            json!({"id": "plain", "n": 1}),
        ]),
    )
    .ok();

    // INSERT ... SELECT with typed values bound.
    post(
        &query(
            "INSERT INTO {db:Identifier}.{t:Identifier} SELECT {id:String}, {n:UInt32}",
            &[("db", &s.db), ("t", &t), ("id", "x\\ty"), ("n", "5")],
        ),
        b"",
    )
    .ok();

    let found = |id: &str, n: &str| {
        s.rows(
            "SELECT id, n FROM {db:Identifier}.{t:Identifier} WHERE id = {id:String} AND n = {n:UInt64}",
            &[("t", &t), ("id", id), ("n", n)],
        )
    };
    assert_eq!(found(escaped, "42"), [json!({"id": tricky, "n": 42})]);
    assert_eq!(found("x\\ty", "5"), [json!({"id": "x\ty", "n": 5})]);
    assert_eq!(found(escaped, "41"), Vec::<Value>::new());

    // The bound value itself, read back.
    assert_eq!(
        s.rows("SELECT {v:String} AS v", &[("v", escaped)]),
        [json!({ "v": tricky })]
    );
    assert_eq!(s.count(&t), 3);
}

/// A String parameter is read as TSV-escaped text, which stops at a raw tab; a value not read to
/// its end is BAD_QUERY_PARAMETER (ReplaceQueryParameterVisitor.cpp), and a placeholder without
/// a value is UNKNOWN_QUERY_PARAMETER. Neither code is in exceptionCodeToHTTPStatus
/// (src/Server/HTTP/exceptionCodeToHTTPStatus.cpp), so a server answers 500.
#[test]
fn bad_and_missing_query_parameters_are_500() {
    let raw_tab = get(&query("SELECT {v:String}", &[("v", "a\tb")])).error(500, 457);
    assert!(
        raw_tab.text().contains("BAD_QUERY_PARAMETER"),
        "{raw_tab:?}"
    );
    let not_a_number = get(&query("SELECT {n:UInt64}", &[("n", "12abc")])).error(500, 457);
    assert!(
        not_a_number.text().contains("BAD_QUERY_PARAMETER"),
        "{not_a_number:?}"
    );
    // Another parameter is given, so substitution runs and finds `v` unset.
    let missing = get(&query("SELECT {v:String}", &[("other", "1")])).error(500, 456);
    assert!(
        missing.text().contains("UNKNOWN_QUERY_PARAMETER"),
        "{missing:?}"
    );
}

/// An Identifier parameter's value is used as the name verbatim, with no TSV unescaping
/// (ReplaceQueryParameterVisitor::visitIdentifier takes the raw value), in a streamed INSERT as
/// anywhere else.
#[test]
fn identifier_parameters_are_taken_verbatim() {
    let s = Scratch::new("lc_ident");
    let name = "back\\tslash"; // a backslash and a `t`, not a tab
    post(
        &query(
            "CREATE TABLE {db:Identifier}.{t:Identifier} (id String) ENGINE = MergeTree ORDER BY id",
            &[("db", &s.db), ("t", name)],
        ),
        b"",
    )
    .ok();
    assert_eq!(
        s.rows(
            "SELECT name FROM system.tables WHERE database = {db:String}",
            &[]
        ),
        [json!({ "name": name })]
    );
    post(
        &query(
            "INSERT INTO {db:Identifier}.{t:Identifier} FORMAT JSONEachRow",
            &[("db", &s.db), ("t", name)],
        ),
        &ndjson(&[json!({"id": "a"})]),
    )
    .ok();
    assert_eq!(s.count(name), 1);
}

// ---------------------------------------------------------------------------------------------
// 3. Settings in the URL.

/// Every URL parameter that is not one of the handler's own is a setting
/// (HTTPHandler::processQuery, src/Server/HTTPHandler.cpp): an unknown one is UNKNOWN_SETTING,
/// which exceptionCodeToHTTPStatus maps to 404.
#[test]
fn an_unknown_setting_is_404_unknown_setting() {
    let answer = get(&and(
        query("SELECT 1", &[]),
        &[("definitely_not_a_setting", "1")],
    ))
    .error(404, 115);
    assert!(answer.text().contains("UNKNOWN_SETTING"), "{answer:?}");

    // A known one applies to the query.
    let answer = get(&and(
        query("SELECT getSetting('max_block_size')", &[]),
        &[("max_block_size", "1234")],
    ))
    .ok();
    assert_eq!(answer.text(), "1234\n");
}

// ---------------------------------------------------------------------------------------------
// 4. Authentication.

/// A wrong password is AUTHENTICATION_FAILED, 403 (exceptionCodeToHTTPStatus), and the answer
/// never repeats the password.
#[test]
fn a_wrong_password_is_403_authentication_failed() {
    let server = clickhouse();
    let password = "Definitely-Not-The-Password-7f3a";
    let answer = http(
        "POST",
        "/",
        &query("SELECT 1", &[]),
        &[
            ("X-ClickHouse-User", server.user.as_str()),
            ("X-ClickHouse-Key", password),
        ],
        Some(b""),
    )
    .error(403, 516);
    assert!(
        answer.text().contains("AUTHENTICATION_FAILED"),
        "{answer:?}"
    );
    assert!(!answer.text().contains(password), "{answer:?}");
    assert!(answer.headers.iter().all(|(_, v)| !v.contains(password)));
}

/// Credentials may come as `user`/`password` URL parameters, but mixing them with the
/// X-ClickHouse headers is refused (authenticateUserByHTTP, src/Server/HTTP/
/// authenticateUserByHTTP.cpp: "it is not allowed to use X-ClickHouse HTTP headers and
/// authentication via parameters simultaneously").
#[test]
fn credentials_come_from_one_place_only() {
    let server = clickhouse();
    let in_url = and(
        query("SELECT 1", &[]),
        &[("user", &server.user), ("password", &server.password)],
    );
    let answer = http("GET", "/", &in_url, &[], None).ok();
    assert_eq!(answer.text(), "1\n");

    let mixed = get(&and(query("SELECT 1", &[]), &[("user", &server.user)])).error(403, 516);
    assert!(mixed.text().contains("simultaneously"), "{mixed:?}");
}

// ---------------------------------------------------------------------------------------------
// 5. Summary and query id.

/// Every successful query answer carries `X-ClickHouse-Summary` (numbers as JSON strings, written
/// by WriteBufferFromHTTPServerResponse) and `X-ClickHouse-Query-Id` (the `query_id` parameter when
/// given); an INSERT's `written_rows` is its row count.
#[test]
fn answers_carry_a_summary_and_the_query_id() {
    let s = Scratch::new("lc_summary");

    let select = get(&query("SELECT number FROM system.numbers LIMIT 3", &[])).ok();
    assert_eq!(select.text(), "0\n1\n2\n");
    assert_eq!(select.header("X-ClickHouse-Format"), Some("TabSeparated"));
    let summary = select.summary();
    assert!(summary.values().all(Value::is_string), "{summary:?}");
    assert_eq!(summary["written_rows"], "0");
    assert!(
        !select
            .header("X-ClickHouse-Query-Id")
            .unwrap_or("")
            .is_empty(),
        "{select:?}"
    );

    let table = unique_name("t");
    let create = post(
        &query(
            "CREATE TABLE {db:Identifier}.{t:Identifier} (n UInt32) ENGINE = MergeTree ORDER BY n",
            &[("db", &s.db), ("t", &table)],
        ),
        b"",
    )
    .ok();
    assert!(create.summary().values().all(Value::is_string));

    let query_id = unique_name("lc_query_id");
    let insert = post(
        &and(
            query(
                "INSERT INTO {db:Identifier}.{t:Identifier} FORMAT JSONEachRow",
                &[("db", &s.db), ("t", &table)],
            ),
            &[("query_id", &query_id)],
        ),
        &ndjson(&[json!({"n": 1}), json!({"n": 2}), json!({"n": 3})]),
    )
    .ok();
    let summary = insert.summary();
    assert_eq!(summary["written_rows"], "3", "{summary:?}");
    assert!(summary.values().all(Value::is_string), "{summary:?}");
    assert_eq!(
        insert.header("X-ClickHouse-Query-Id"),
        Some(query_id.as_str())
    );
    assert_eq!(s.count(&table), 3);
}

/// The summary has every field a server writes (ProgressValues::writeJSON, src/IO/Progress.cpp).
#[test]
fn the_summary_has_every_field_a_server_sends() {
    let answer = get(&query("SELECT 1", &[])).ok();
    let summary = answer.summary();
    for key in [
        "read_rows",
        "read_bytes",
        "written_rows",
        "written_bytes",
        "total_rows_to_read",
        "result_rows",
        "result_bytes",
        "elapsed_ns",
    ] {
        let value = summary
            .get(key)
            .unwrap_or_else(|| panic!("no {key}: {summary:?}"));
        let text = value
            .as_str()
            .unwrap_or_else(|| panic!("{key} not a string"));
        text.parse::<u64>()
            .unwrap_or_else(|_| panic!("{key} = {text:?}"));
    }
}

// ---------------------------------------------------------------------------------------------
// 6. Exception answers.

/// The code in `X-ClickHouse-Exception-Code` is the `Code: N.` of the body, and the status is
/// exceptionCodeToHTTPStatus's (src/Server/HTTP/exceptionCodeToHTTPStatus.cpp).
#[test]
fn exceptions_carry_their_code_in_header_and_body() {
    let s = Scratch::new("lc_errors");
    let unknown_table = get(&query(
        "SELECT * FROM {db:Identifier}.{t:Identifier}",
        &[("db", &s.db), ("t", "no_such_table")],
    ))
    .error(404, 60);
    assert!(
        unknown_table.text().contains("(UNKNOWN_TABLE)"),
        "{unknown_table:?}"
    );

    let unknown_database = get(&and(
        query("SELECT 1", &[]),
        &[("database", &unique_name("lc_no_such_db"))],
    ))
    .error(404, 81);
    assert!(
        unknown_database.text().contains("(UNKNOWN_DATABASE)"),
        "{unknown_database:?}"
    );

    let syntax = get(&query("SELEC 1", &[])).error(400, 62);
    assert!(syntax.text().contains("(SYNTAX_ERROR)"), "{syntax:?}");

    let unknown_function = get(&query("SELECT no_such_function_xyz(1)", &[])).error(404, 46);
    assert!(
        unknown_function.text().contains("(UNKNOWN_FUNCTION)"),
        "{unknown_function:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 7. Content-Encoding of request bodies.

/// A request-body encoder.
type Encoder = fn(&[u8]) -> Vec<u8>;

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn deflate(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn zstd(data: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
}

/// LZ4 *frame* format, which ClickHouse's Lz4InflatingReadBuffer (LZ4F) reads.
fn lz4(data: &[u8]) -> Vec<u8> {
    let mut e = lz4_flex::frame::FrameEncoder::new(Vec::new());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A body compressed as its `Content-Encoding` says is decoded before it is read
/// (HTTPHandler::processQuery wraps the body with chooseCompressionMethod(Content-Encoding),
/// src/IO/CompressionMethod.cpp: `deflate` is zlib, `lz4` the LZ4 frame format).
#[test]
fn compressed_request_bodies_land_exactly() {
    let s = Scratch::new("lc_encoding");
    let t = s.table("enc String, n UInt32, s String");
    let encoders: [(&str, Encoder); 4] = [
        ("gzip", gzip),
        ("deflate", deflate),
        ("zstd", zstd),
        ("lz4", lz4),
    ];
    let mut expected = Vec::new();
    for (encoding, encode) in encoders {
        let rows: Vec<Value> = (0..200u32)
            .map(|n| {
                let s = format!("{encoding} row {n}: {}\t\\", "abc".repeat(n as usize % 7));
                json!({"enc": encoding, "n": n, "s": s})
            })
            .collect();
        let plain = ndjson(&rows);
        let body = encode(&plain);
        assert_ne!(body, plain);
        let answer = http(
            "POST",
            "/",
            &query(
                "INSERT INTO {db:Identifier}.{t:Identifier} FORMAT JSONEachRow",
                &[("db", &s.db), ("t", &t)],
            ),
            &with_auth(&[("Content-Encoding", encoding)]),
            Some(&body),
        );
        assert_eq!(answer.status, 200, "{encoding}: {answer:?}");
        assert_eq!(answer.summary()["written_rows"], "200", "{encoding}");
        expected.extend(rows);
    }
    expected.sort_by_key(|r| (r["enc"].as_str().unwrap().to_string(), r["n"].as_u64()));
    assert_eq!(
        s.rows(
            "SELECT enc, n, s FROM {db:Identifier}.{t:Identifier} ORDER BY enc, n",
            &[("t", &t)]
        ),
        expected
    );
}

/// With `enable_http_compression=1` an answer is compressed in the first method of the server's
/// preference (zstd, br, lz4, snappy, gzip, deflate, xz, bz2: chooseHTTPCompressionMethod,
/// src/IO/CompressionMethod.cpp, a substring match on Accept-Encoding) and says so in
/// Content-Encoding; without the setting, Accept-Encoding changes nothing.
#[test]
fn answers_are_compressed_as_the_server_chooses_only_when_asked() {
    let sql = "SELECT number, repeat('payload ', 8) FROM numbers(3000)";
    let answer = |params: &[(String, String)], accept: &str| {
        http(
            "POST",
            "/",
            params,
            &with_auth(&[("Accept-Encoding", accept)]),
            None,
        )
    };
    let params = query(sql, &[]);
    let expected = answer(&params, "lz4");
    assert_eq!(expected.status, 200, "{expected:?}");
    assert_eq!(expected.header("Content-Encoding"), None);
    assert!(expected.text().starts_with("0\tpayload payload "));
    let compressed = and(params.clone(), &[("enable_http_compression", "1")]);
    for (accept, chosen) in [
        ("lz4", "lz4"),
        ("gzip, lz4", "lz4"),
        ("gzip, zstd, lz4", "zstd"),
        ("deflate, gzip", "gzip"),
    ] {
        let got = answer(&compressed, accept);
        assert_eq!(got.status, 200, "{accept}: {got:?}");
        assert_eq!(got.header("Content-Encoding"), Some(chosen), "{accept}");
        let mut decoded = Vec::new();
        match chosen {
            "lz4" => lz4_flex::frame::FrameDecoder::new(got.body.as_slice())
                .read_to_end(&mut decoded)
                .map(|_| ()),
            "zstd" => ruzstd::decoding::StreamingDecoder::new(got.body.as_slice())
                .unwrap()
                .read_to_end(&mut decoded)
                .map(|_| ()),
            _ => flate2::read::GzDecoder::new(got.body.as_slice())
                .read_to_end(&mut decoded)
                .map(|_| ()),
        }
        .unwrap();
        assert_eq!(decoded, expected.body, "{accept}");
        assert!(got.body.len() < expected.body.len() / 2, "{accept}");
    }
    // Nothing the server knows: as is.
    let got = answer(&compressed, "identity");
    assert_eq!(got.header("Content-Encoding"), None);
    assert_eq!(got.body, expected.body);
}

/// A body that does not decode as its label says fails and writes nothing: the decoders throw
/// ZSTD_DECODER_FAILED (ZstdInflatingReadBuffer.cpp) or ZLIB_INFLATE_FAILED
/// (ZlibInflatingReadBuffer.cpp), codes exceptionCodeToHTTPStatus leaves at 500; an unknown label
/// is NOT_IMPLEMENTED (chooseCompressionMethod), 501.
#[test]
fn a_wrongly_labelled_body_fails_and_writes_nothing() {
    let s = Scratch::new("lc_badenc");
    let t = s.table("id String");
    let plain = ndjson(&[json!({"id": "a"}), json!({"id": "b"})]);
    let insert = query(
        "INSERT INTO {db:Identifier}.{t:Identifier} FORMAT JSONEachRow",
        &[("db", &s.db), ("t", &t)],
    );
    let send = |encoding: &str, body: &[u8]| {
        http(
            "POST",
            "/",
            &insert,
            &with_auth(&[("Content-Encoding", encoding)]),
            Some(body),
        )
    };

    let answer = send("zstd", &gzip(&plain)).error(500, 561);
    assert!(answer.text().contains("ZSTD_DECODER_FAILED"), "{answer:?}");
    let answer = send("gzip", &plain).error(500, 354);
    assert!(answer.text().contains("ZLIB_INFLATE_FAILED"), "{answer:?}");
    let answer = send("x-no-such-encoding", &plain).error(501, 48);
    assert!(answer.text().contains("NOT_IMPLEMENTED"), "{answer:?}");
    assert_eq!(s.count(&t), 0);

    // The same rows, labelled right, land.
    send("gzip", &gzip(&plain)).ok();
    assert_eq!(s.count(&t), 2);
}

// ---------------------------------------------------------------------------------------------
// 8. Ping and GET.

/// `/ping` (and `/` without a query) answer `Ok.` with no credentials needed.
#[test]
fn ping_answers_ok() {
    for path in ["/ping", "/"] {
        let answer = http("GET", path, &[], &[], None).ok();
        assert_eq!(answer.text(), "Ok.\n", "{path}");
    }
}

/// A GET runs with `readonly = 2` (setReadOnlyIfHTTPMethodIdempotent,
/// src/Server/HTTP/setReadOnlyIfHTTPMethodIdempotent.cpp): reads work, writes are READONLY,
/// which exceptionCodeToHTTPStatus leaves at 500.
#[test]
fn get_is_read_only() {
    let s = Scratch::new("lc_get");
    assert_eq!(get(&query("SELECT 1", &[])).ok().text(), "1\n");

    let table = unique_name("t");
    let create = get(&query(
        "CREATE TABLE {db:Identifier}.{t:Identifier} (n UInt32) ENGINE = MergeTree ORDER BY n",
        &[("db", &s.db), ("t", &table)],
    ))
    .error(500, 164);
    assert!(create.text().contains("READONLY"), "{create:?}");
    assert!(!s.has_table(&table));

    let t = s.table("n UInt32");
    get(&query(
        "INSERT INTO {db:Identifier}.{t:Identifier} SELECT 1",
        &[("db", &s.db), ("t", &t)],
    ))
    .error(500, 164);
    assert_eq!(s.count(&t), 0);
}

// ---------------------------------------------------------------------------------------------
// 9. INSERT data is data, not SQL text.

/// A server streams INSERT data to the format's reader: a blank line between JSONEachRow rows is
/// whitespace there, whether the statement is in the URL or at the start of the body, and
/// `VALUES` data follows the statement the same way.
#[test]
fn insert_data_is_streamed_not_parsed_as_sql() {
    let s = Scratch::new("lc_stream");
    let t = s.table("id String, n UInt32");

    // Statement in the URL, blank lines around and between rows.
    let body =
        b"\n{\"id\":\"a\",\"n\":1}\n\n{\"id\":\"b\",\"n\":2}\n\n\n{\"id\":\"c\",\"n\":3}\n\n";
    let answer = post(
        &query(
            "INSERT INTO {db:Identifier}.{t:Identifier} FORMAT JSONEachRow",
            &[("db", &s.db), ("t", &t)],
        ),
        body,
    )
    .ok();
    assert_eq!(answer.summary()["written_rows"], "3");

    // Statement at the start of the body, the data after it.
    let body = format!(
        "INSERT INTO `{}`.`{t}` FORMAT JSONEachRow\n{{\"id\":\"d\",\"n\":4}}\n\n{{\"id\":\"e\",\"n\":5}}\n",
        s.db
    );
    post(&[], body.as_bytes()).ok();

    // VALUES data after the statement in the URL.
    post(
        &query(
            "INSERT INTO {db:Identifier}.{t:Identifier} VALUES",
            &[("db", &s.db), ("t", &t)],
        ),
        b"('f', 6),\n\n('g', 7)",
    )
    .ok();

    let ids: Vec<Value> = s
        .rows(
            "SELECT id, n FROM {db:Identifier}.{t:Identifier} ORDER BY n",
            &[("t", &t)],
        )
        .into_iter()
        .map(|r| r["id"].clone())
        .collect();
    assert_eq!(ids, ["a", "b", "c", "d", "e", "f", "g"]);
}

// ---------------------------------------------------------------------------------------------
// Database and format from headers.

/// The current database and the default format may also come as `X-ClickHouse-Database` and
/// `X-ClickHouse-Format` headers (HTTPHandler::processQuery); the answer names its format in
/// `X-ClickHouse-Format`.
#[test]
fn database_and_format_come_from_parameters_or_headers() {
    let s = Scratch::new("lc_headers");
    let answer = get(&and(
        query("SELECT currentDatabase() AS db", &[]),
        &[("database", &s.db), ("default_format", "JSONEachRow")],
    ))
    .ok();
    assert_eq!(answer.header("X-ClickHouse-Format"), Some("JSONEachRow"));
    assert_eq!(
        serde_json::from_slice::<Value>(&answer.body).unwrap(),
        json!({"db": s.db})
    );

    let answer = http(
        "GET",
        "/",
        &query("SELECT currentDatabase()", &[]),
        &with_auth(&[("X-ClickHouse-Database", s.db.as_str())]),
        None,
    )
    .ok();
    assert_eq!(
        answer.text(),
        format!("{}\n", s.db),
        "X-ClickHouse-Database"
    );

    let answer = http(
        "GET",
        "/",
        &query("SELECT 'x' AS v", &[]),
        &with_auth(&[("X-ClickHouse-Format", "JSONEachRow")]),
        None,
    )
    .ok();
    assert_eq!(
        answer.header("X-ClickHouse-Format"),
        Some("JSONEachRow"),
        "X-ClickHouse-Format: {answer:?}"
    );
    assert_eq!(answer.text(), "{\"v\":\"x\"}\n");
}

/// A streamed INSERT checks the table's CHECK constraints like any insert: 469
/// VIOLATED_CONSTRAINT (HTTP 500) and nothing of that insert written. (chdb's own streaming
/// insert API answers success and silently writes nothing, so the front must not use it.)
#[test]
fn a_streamed_insert_checks_constraints() {
    let s = Scratch::new("lc_check");
    let t = s.table("n UInt32, CONSTRAINT small CHECK n < 10");
    let insert = query(
        "INSERT INTO {db:Identifier}.{t:Identifier} FORMAT JSONEachRow",
        &[("db", &s.db), ("t", &t)],
    );
    let answer = post(&insert, b"{\"n\":1}\n{\"n\":50}\n").error(500, 469);
    assert!(answer.text().contains("VIOLATED_CONSTRAINT"), "{answer:?}");
    assert_eq!(s.count(&t), 0);
    let answer = post(&insert, b"{\"n\":1}\n{\"n\":2}\n").ok();
    assert_eq!(answer.summary()["written_rows"], "2");
    assert_eq!(s.count(&t), 2);
}

// ---------------------------------------------------------------------------------------------
// 9. A request cut short is not run.

/// Sends a POST whose `Content-Length` promises more than the body holds, then closes the
/// sending side: the server must not run what it got. ClickHouse reads a request body through
/// a `LimitReadBuffer` with an exact limit (src/Server/HTTP/HTTPServerRequest.cpp), which throws
/// CANNOT_READ_ALL_DATA ("Unexpected EOF, got N of M bytes") instead of handing a short body on.
fn post_cut_short(params: &[(String, String)], body: &[u8]) {
    let server = clickhouse();
    let authority = server
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let mut target = String::from("/?");
    for (i, (k, v)) in params.iter().enumerate() {
        if i > 0 {
            target.push('&');
        }
        target.push_str(&format!(
            "{}={}",
            clickhouse_component::client::url::encode_component(k),
            clickhouse_component::client::url::encode_component(v)
        ));
    }
    let head = format!(
        "POST {target} HTTP/1.1\r\nHost: {authority}\r\nX-ClickHouse-User: {}\r\nX-ClickHouse-Key: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        server.user,
        server.password,
        body.len() + 100
    );
    let mut stream = std::net::TcpStream::connect(&authority).unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    assert!(
        !answer.starts_with(b"HTTP/1.1 200"),
        "a request cut short was answered 200: {}",
        String::from_utf8_lossy(&answer)
    );
}

#[test]
fn a_request_cut_short_is_not_run() {
    let s = Scratch::new("lc_cut");
    let t = s.table("n UInt32");
    // The statement in the body: what arrived is a complete INSERT, but not the whole request.
    let sql = format!("INSERT INTO `{}`.`{t}` VALUES (1)", s.db);
    post_cut_short(&[], sql.as_bytes());
    // Insert data in the body, the statement in the URL.
    let insert = query(
        "INSERT INTO {db:Identifier}.{t:Identifier} FORMAT JSONEachRow",
        &[("db", &s.db), ("t", &t)],
    );
    post_cut_short(&insert, b"{\"n\":2}\n{\"n\":3}\n");
    assert_eq!(s.count(&t), 0);
}

/// A multipart body: one file part per (name, rows), then the fields.
fn multipart(files: &[(&str, &[u8])], fields: &[(&str, &str)]) -> (String, Vec<u8>) {
    let boundary = "conformance-boundary-7f3a";
    let mut body = Vec::new();
    for (name, rows) in files {
        body.extend(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}.tsv\"\r\n\r\n").into_bytes());
        body.extend_from_slice(rows);
        body.extend(b"\r\n");
    }
    for (name, value) in fields {
        body.extend(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").into_bytes());
    }
    body.extend(format!("--{boundary}--\r\n").into_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// External data (https://clickhouse.com/docs/engines/table-engines/special/external-data):
/// each file part of a multipart body is a temporary table named by its field, typed by
/// `NAME_structure` or `NAME_types`, read in `NAME_format` (TabSeparated by default, escapes
/// unescaped); an INSERT ... SELECT reads it; other fields are parameters; a table without a
/// structure is BAD_ARGUMENTS and runs nothing.
#[test]
fn external_data_is_a_temporary_table_of_the_request() {
    let s = Scratch::new("lc_external");
    let t = s.table("id String, v String");
    let rows: &[u8] = b"a\tone\\ttab\\nline\nb\t\\\\\n";
    let (content_type, body) = multipart(&[("ext", rows)], &[("param_suffix", "!")]);
    let insert = and(
        query(
            "INSERT INTO {db:Identifier}.{t:Identifier} SELECT k, concat(v, {suffix:String}) FROM ext",
            &[("db", &s.db), ("t", &t)],
        ),
        &[("ext_structure", "k String, v String")],
    );
    let answer = http(
        "POST",
        "/",
        &insert,
        &with_auth(&[("Content-Type", &content_type)]),
        Some(&body),
    );
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let got = post(
        &query(
            "SELECT id, v FROM {db:Identifier}.{t:Identifier} ORDER BY id FORMAT JSONEachRow",
            &[("db", &s.db), ("t", &t)],
        ),
        b"",
    );
    assert_eq!(
        String::from_utf8_lossy(&got.body),
        "{\"id\":\"a\",\"v\":\"one\\ttab\\nline!\"}\n{\"id\":\"b\",\"v\":\"\\\\!\"}\n"
    );
    // `_types` names the columns _1, _2; a format of the part's own.
    let (content_type, body) = multipart(&[("nums", b"{\"_1\":2}\n{\"_1\":40}\n")], &[]);
    let sum = and(
        query("SELECT sum(_1) FROM nums", &[]),
        &[("nums_types", "UInt32"), ("nums_format", "JSONEachRow")],
    );
    let answer = http(
        "POST",
        "/",
        &sum,
        &with_auth(&[("Content-Type", &content_type)]),
        Some(&body),
    );
    assert_eq!(
        (answer.status, String::from_utf8_lossy(&answer.body).trim()),
        (200, "42")
    );
    // No structure: BAD_ARGUMENTS, nothing written.
    let (content_type, body) = multipart(&[("ext", b"c\tx\n")], &[("param_suffix", "?")]);
    let bare = query(
        "INSERT INTO {db:Identifier}.{t:Identifier} SELECT k, v FROM ext",
        &[("db", &s.db), ("t", &t)],
    );
    let answer = http(
        "POST",
        "/",
        &bare,
        &with_auth(&[("Content-Type", &content_type)]),
        Some(&body),
    );
    assert_eq!(
        answer.status,
        400,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert!(String::from_utf8_lossy(&answer.body).contains("(BAD_ARGUMENTS)"));
    assert_eq!(s.count(&t), 2);
}
