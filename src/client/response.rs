//! Reads ClickHouse's HTTP answers: success with its `X-ClickHouse-Summary`, or an error from
//! the status, `X-ClickHouse-Exception-Code` and the `Code: N. DB::Exception: ... (NAME)` body.

use super::error::{classify_server, Error, ErrorKind, Operation, ServerError};
use super::secrets::Redactor;

/// One JSON value read from an answer's bytes as text: one serde_json reader (`str`) in the
/// component, not two. Bytes that are not UTF-8 are refused, in fields `T` ignores too
/// (ClickHouse does not check the bytes it writes by default): a caller that reads free text
/// (DESCRIBE TABLE's comments) passes the body through `String::from_utf8_lossy` first. The
/// error says why, for the caller's message.
pub fn json_text<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
    serde_json::from_str(text).map_err(|e| e.to_string())
}

/// The rows of a `JSONEachRow` answer (blank lines skipped), each a JSON object whose fields
/// the caller takes by name ([`AnswerRow`]); a row of any other shape is `permanent`, naming
/// `what` was asked: never a default. (Rows are read as `serde_json::Value`s, not into
/// derived structs: each derived struct costs the component kilobytes, docs/measurements.md.)
pub fn json_rows<'w>(body: &[u8], what: &'w str) -> Result<Vec<AnswerRow<'w>>, Error> {
    body.split(|b| *b == b'\n')
        .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
        .map(|line| match json_text(line) {
            Ok(serde_json::Value::Object(fields)) => Ok(AnswerRow { fields, what }),
            Ok(_) => Err(unexpected(what, "a row is not a JSON object")),
            Err(e) => Err(unexpected(what, &e)),
        })
        .collect()
}

fn unexpected(what: &str, why: &str) -> Error {
    Error::new(
        ErrorKind::Permanent,
        format!("unexpected answer to {what}: {why}"),
    )
}

/// One row of an answer: its fields, taken out by name.
#[derive(Debug)]
pub struct AnswerRow<'w> {
    fields: serde_json::Map<String, serde_json::Value>,
    what: &'w str,
}

impl AnswerRow<'_> {
    /// Field `name`, a string.
    pub fn text(&mut self, name: &str) -> Result<String, Error> {
        self.optional_text(name)?
            .ok_or_else(|| unexpected(self.what, &format!("field {name} is null")))
    }

    /// Field `name`, a string or null.
    pub fn optional_text(&mut self, name: &str) -> Result<Option<String>, Error> {
        match self.value(name)? {
            serde_json::Value::String(s) => Ok(Some(s)),
            serde_json::Value::Null => Ok(None),
            _ => Err(unexpected(
                self.what,
                &format!("field {name} is not a string"),
            )),
        }
    }

    /// Field `name`, any JSON value.
    pub fn value(&mut self, name: &str) -> Result<serde_json::Value, Error> {
        self.fields
            .remove(name)
            .ok_or_else(|| unexpected(self.what, &format!("field {name} is missing")))
    }

    /// Checks that no field is left untaken (an answer of another shape is an error, never
    /// read past).
    pub fn all_taken(&self) -> Result<(), Error> {
        match self.fields.keys().next() {
            None => Ok(()),
            Some(k) => Err(unexpected(
                self.what,
                &format!("unknown field {}", crate::text::escaped(k)),
            )),
        }
    }
}

/// An HTTP answer as the transport read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Header names (lower case) and raw values.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The whole body.
    pub body: Vec<u8>,
    /// Time from sending the request to reading the whole answer, in microseconds.
    pub elapsed_us: u64,
}

impl HttpResponse {
    /// The first value of a header, as text (lossy).
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }
}

/// Progress counters of a finished query (`X-ClickHouse-Summary`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuerySummary {
    /// Rows read.
    pub read_rows: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Rows written (INSERT).
    pub written_rows: u64,
    /// Bytes written (INSERT).
    pub written_bytes: u64,
    /// Rows in the result.
    pub result_rows: u64,
    /// Server-side time in nanoseconds.
    pub elapsed_ns: u64,
}

impl QuerySummary {
    /// Parses the header's JSON object; ClickHouse sends the numbers as strings. Returns `None`
    /// for anything that is not a JSON object.
    pub fn parse(text: &str) -> Option<QuerySummary> {
        let value: serde_json::Value = serde_json::from_str(text).ok()?;
        let object = value.as_object()?;
        let field = |name: &str| -> u64 {
            match object.get(name) {
                Some(serde_json::Value::String(s)) => s.parse().unwrap_or(0),
                Some(serde_json::Value::Number(n)) => n.as_u64().unwrap_or(0),
                _ => 0,
            }
        };
        Some(QuerySummary {
            read_rows: field("read_rows"),
            read_bytes: field("read_bytes"),
            written_rows: field("written_rows"),
            written_bytes: field("written_bytes"),
            result_rows: field("result_rows"),
            elapsed_ns: field("elapsed_ns"),
        })
    }
}

/// A successful answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Response {
    /// The body (rows in the requested format; empty for statements without a result).
    pub body: Vec<u8>,
    /// `X-ClickHouse-Summary`, when the server sent it.
    pub summary: Option<QuerySummary>,
    /// `X-ClickHouse-Query-Id`.
    pub query_id: Option<String>,
    /// Round trip as measured by the transport, in microseconds.
    pub elapsed_us: u64,
}

/// Parts of a `Code: N. DB::Exception: message (NAME) (version V)` body.
#[derive(Debug, PartialEq, Eq)]
pub struct ExceptionText {
    /// The code, if the body starts with `Code: N.`.
    pub code: Option<i32>,
    /// The error name in parentheses at the end, if any.
    pub name: Option<String>,
    /// The message without the `Code:` prefix, `DB::Exception:` and the version suffix.
    pub message: String,
}

/// Splits a ClickHouse exception body into code, name and message.
pub fn parse_exception(body: &str) -> ExceptionText {
    let text = body.trim();
    let mut code = None;
    let mut rest = text;
    if let Some(after) = text.strip_prefix("Code: ") {
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(n) = digits.parse::<i32>() {
            code = Some(n);
            rest = after[digits.len()..].trim_start_matches('.').trim_start();
        }
    }
    let rest = rest.strip_prefix("DB::Exception: ").unwrap_or(rest);
    // Drop " (version X)" and take "(NAME)" at the end.
    let mut message = rest.trim_end();
    if let Some(i) = message.rfind(" (version ") {
        if message.ends_with(')') {
            message = message[..i].trim_end();
        }
    }
    let mut name = None;
    if let Some(open) = message.rfind(" (") {
        let candidate = &message[open + 2..];
        if let Some(inner) = candidate.strip_suffix(')') {
            if !inner.is_empty()
                && inner
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            {
                name = Some(inner.to_string());
                message = message[..open].trim_end();
            }
        }
    }
    ExceptionText {
        code,
        name,
        message: message.to_string(),
    }
}

/// Why [`append_within`] refused bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overflow {
    /// They would take the buffer past its cap.
    Cap,
    /// The room for them could not be had (the instance's memory limit).
    Memory,
}

/// Appends `bytes` to `out` unless that takes it past `cap` bytes. The buffer doubles as a
/// `Vec` does, but never past `cap`, and its growth is a fallible reservation: a buffer of
/// answer bytes never holds more than its cap, and memory that cannot be had is an error,
/// never a trap.
pub fn append_within(out: &mut Vec<u8>, bytes: &[u8], cap: usize) -> Result<(), Overflow> {
    let needed = out.len().checked_add(bytes.len()).ok_or(Overflow::Cap)?;
    if needed > cap {
        return Err(Overflow::Cap);
    }
    if out.capacity() < needed {
        let target = (out.len() * 2).max(needed).max(64 * 1024).min(cap);
        out.try_reserve_exact(target - out.len())
            .map_err(|_| Overflow::Memory)?;
    }
    out.extend_from_slice(bytes);
    Ok(())
}

/// Turns an HTTP answer into a [`Response`] or a classified, redacted [`Error`].
pub fn interpret(
    http: HttpResponse,
    operation: Operation,
    redactor: &Redactor,
) -> Result<Response, Error> {
    let header_code = http
        .header("x-clickhouse-exception-code")
        .and_then(|c| c.trim().parse::<i32>().ok());
    if http.status == 200 && header_code.is_none() {
        return Ok(Response {
            summary: http
                .header("x-clickhouse-summary")
                .and_then(|s| QuerySummary::parse(&s)),
            query_id: http.header("x-clickhouse-query-id"),
            elapsed_us: http.elapsed_us,
            body: http.body,
        });
    }
    if (300..400).contains(&http.status) && header_code.is_none() {
        // ClickHouse never redirects: something else answers at this URL (a proxy, a login
        // page). Not followed (the credentials would go along); repeating it cannot help.
        let to = http
            .header("location")
            .map(|l| format!(" to '{}'", crate::text::escaped(&l)))
            .unwrap_or_default();
        return Err(redactor.error(
            ErrorKind::Misconfigured,
            &format!(
                "HTTP {} from the server: a redirect{to}, which the client does not follow (ClickHouse does not redirect): set the URL to the ClickHouse server itself",
                http.status
            ),
        ));
    }
    let text = String::from_utf8_lossy(&http.body);
    let parsed = parse_exception(&text);
    let code = header_code.or(parsed.code);
    let kind = classify_server(http.status, code, operation);
    let name = parsed.name.unwrap_or_default();
    let detail = if parsed.message.is_empty() {
        "(no message)".to_string()
    } else {
        parsed.message
    };
    let message = match code {
        Some(code) if !name.is_empty() => {
            format!(
                "ClickHouse error {code} {name} (HTTP {}): {detail}",
                http.status
            )
        }
        Some(code) => format!("ClickHouse error {code} (HTTP {}): {detail}", http.status),
        None => format!("HTTP {} from the server: {detail}", http.status),
    };
    let mut error = redactor.error(kind, &message);
    error.server = code.map(|code| ServerError {
        code,
        name,
        http_status: http.status,
    });
    Err(error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::error::ErrorKind;

    /// Rows are read as text: blank lines skipped, a row that is not UTF-8 refused as
    /// `permanent`, naming what was asked.
    #[test]
    fn json_rows_read_text() {
        let body = b"{\"name\":\"n\",\"comment\":\"x\"}\n\n{\"name\":\"m\",\"c\":null}\n";
        let mut rows = json_rows(body, "DESCRIBE TABLE").unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].text("name").unwrap(), "n");
        assert!(rows[0].all_taken().is_err());
        assert_eq!(rows[1].text("name").unwrap(), "m");
        assert_eq!(rows[1].optional_text("c").unwrap(), None);
        rows[1].all_taken().unwrap();
        let e = rows[1].text("name").unwrap_err();
        assert_eq!(
            e.message,
            "unexpected answer to DESCRIBE TABLE: field name is missing"
        );
        let bad =
            json_rows(b"{\"name\":\"x\",\"comment\":\"\xff\"}", "DESCRIBE TABLE").unwrap_err();
        assert_eq!(bad.kind, ErrorKind::Permanent);
        assert!(bad.message.contains("DESCRIBE TABLE"), "{}", bad.message);
        let e = json_rows(b"[1]", "x").unwrap_err();
        assert_eq!(
            e.message,
            "unexpected answer to x: a row is not a JSON object"
        );
        let mut row = json_rows(b"{\"n\":1}", "x").unwrap().remove(0);
        assert_eq!(
            row.text("n").unwrap_err().message,
            "unexpected answer to x: field n is not a string"
        );
    }

    #[test]
    fn appends_stay_within_the_cap() {
        let mut out = Vec::new();
        for _ in 0..10 {
            append_within(&mut out, &[1u8; 100_000], 1_000_000).unwrap();
        }
        assert_eq!(out.len(), 1_000_000);
        assert!(out.capacity() <= 1_000_000, "{}", out.capacity());
        assert_eq!(append_within(&mut out, &[1], 1_000_000), Err(Overflow::Cap));
        assert_eq!(out.len(), 1_000_000);
    }

    fn answer(status: u16, headers: &[(&str, &str)], body: &str) -> HttpResponse {
        HttpResponse {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
            body: body.as_bytes().to_vec(),
            elapsed_us: 7,
        }
    }

    #[test]
    fn parses_exception_bodies() {
        let p = parse_exception(
            "Code: 81. DB::Exception: Database nope does not exist. (UNKNOWN_DATABASE) (version 25.8.1.1)\n",
        );
        assert_eq!(p.code, Some(81));
        assert_eq!(p.name.as_deref(), Some("UNKNOWN_DATABASE"));
        assert_eq!(p.message, "Database nope does not exist.");
        let p = parse_exception("Code: 62. DB::Exception: Syntax error (at x). (SYNTAX_ERROR)");
        assert_eq!(
            (p.code, p.name.as_deref()),
            (Some(62), Some("SYNTAX_ERROR"))
        );
        assert_eq!(p.message, "Syntax error (at x).");
        let p = parse_exception("Bad Gateway");
        assert_eq!(
            (p.code, p.name, p.message.as_str()),
            (None, None, "Bad Gateway")
        );
        let p = parse_exception("Code: 999999999999. x");
        assert_eq!(p.code, None);
    }

    #[test]
    fn success_carries_summary_and_query_id() {
        let r = interpret(
            answer(
                200,
                &[
                    ("X-ClickHouse-Summary", r#"{"read_rows":"1","written_rows":"10","written_bytes":"99","elapsed_ns":"5"}"#),
                    ("x-clickhouse-query-id", "q1"),
                ],
                "1\n",
            ),
            Operation::Read,
            &Redactor::default(),
        )
        .unwrap();
        assert_eq!(r.body, b"1\n");
        let s = r.summary.unwrap();
        assert_eq!(
            (s.read_rows, s.written_rows, s.written_bytes, s.elapsed_ns),
            (1, 10, 99, 5)
        );
        assert_eq!(r.query_id.as_deref(), Some("q1"));
        assert_eq!(r.elapsed_us, 7);
    }

    #[test]
    fn summary_accepts_numbers_and_rejects_garbage() {
        let s = QuerySummary::parse(r#"{"written_rows":3}"#).unwrap();
        assert_eq!(s.written_rows, 3);
        assert_eq!(QuerySummary::parse("not json"), None);
        assert_eq!(QuerySummary::parse("[1]"), None);
    }

    #[test]
    fn errors_use_the_header_code_then_the_body() {
        let e = interpret(
            answer(
                403,
                &[("X-ClickHouse-Exception-Code", "516")],
                "Code: 516. DB::Exception: default: Authentication failed: password is incorrect. (AUTHENTICATION_FAILED) (version 1)",
            ),
            Operation::Read,
            &Redactor::default(),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Misconfigured);
        let server = e.server.unwrap();
        assert_eq!(
            (server.code, server.name.as_str(), server.http_status),
            (516, "AUTHENTICATION_FAILED", 403)
        );
        assert!(e.message.starts_with("ClickHouse error 516 AUTHENTICATION_FAILED (HTTP 403): default: Authentication failed"), "{}", e.message);

        // No header: the body's code decides.
        let e = interpret(
            answer(
                500,
                &[],
                "Code: 252. DB::Exception: Too many parts. (TOO_MANY_PARTS)",
            ),
            Operation::Write,
            &Redactor::default(),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Throttled);
        assert_eq!(e.server.unwrap().code, 252);

        // A 200 carrying an exception code is still an error.
        let e = interpret(
            answer(
                200,
                &[("x-clickhouse-exception-code", "319")],
                "Code: 319. DB::Exception: Unknown status",
            ),
            Operation::Write,
            &Redactor::default(),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Uncertain);

        // A proxy's answer without any code.
        let e = interpret(
            answer(502, &[], "Bad Gateway"),
            Operation::Write,
            &Redactor::default(),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Uncertain);
        assert_eq!(e.server, None);
        assert_eq!(e.message, "HTTP 502 from the server: Bad Gateway");
    }

    #[test]
    fn error_messages_are_redacted_and_capped() {
        let redactor = Redactor::new(["topsecret"]);
        let body = format!(
            "Code: 36. DB::Exception: bad value topsecret {} (BAD_ARGUMENTS)",
            "x".repeat(3000)
        );
        let e = interpret(answer(400, &[], &body), Operation::Read, &redactor).unwrap_err();
        assert!(!e.message.contains("topsecret"));
        assert!(e.message.chars().count() <= crate::client::error::MAX_MESSAGE_CHARS + 1);
        assert_eq!(e.kind, ErrorKind::Permanent);
    }
}
