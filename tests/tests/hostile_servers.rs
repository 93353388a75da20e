//! Hostile servers and inputs, through the CLI (the real component in the real host): a
//! password never leaks in any form it is sent in, a decoding bomb and an answer that never
//! ends are clean errors in bounded memory, a trickling answer cannot hold a call, answers that
//! are not ClickHouse's HTTP are not retried, and a row too long for memory is refused. Each
//! run reports its peak RSS and time (`--nocapture` shows them).

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clickhouse_component_tests::native::Sql;
use clickhouse_component_tests::proxy::{Fault, Proxy, Rule};
use clickhouse_component_tests::{
    cli, clickhouse, lz4_reply, raw_http_server, raw_http_server_with_head, split_peak_rss,
    trickling_server, unique_name, with_peak_rss, Server,
};

/// What a measured run printed and took.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    /// Peak resident set size of the process, in MiB.
    peak_rss_mib: f64,
    took: Duration,
}

impl Run {
    fn output(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    /// Prints what the run cost (shown with `--nocapture`; docs/security.md has the numbers).
    fn report(&self, what: &str) {
        eprintln!(
            "{what}: exit {}, peak RSS {:.0} MiB, {:.2} s",
            self.code,
            self.peak_rss_mib,
            self.took.as_secs_f64()
        );
    }

    /// No stack frames, whatever `RUST_BACKTRACE` says (the runs set it to 1).
    fn assert_no_frames(&self) {
        let out = self.output().to_lowercase();
        for frame in [
            "wasm backtrace",
            "stack backtrace",
            "0x",
            "<unknown>!",
            "panicked",
        ] {
            assert!(!out.contains(frame), "{frame:?} in:\n{out}");
        }
    }
}

/// Runs `cmd` (stdin from `stdin`, if any) and measures its peak RSS.
fn measured(
    mut cmd: Command,
    stdin: Option<Box<dyn FnOnce(std::process::ChildStdin) + Send>>,
) -> Run {
    cmd.env("RUST_BACKTRACE", "1");
    let mut cmd = with_peak_rss(&cmd);
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().expect("starting the CLI");
    let feeder = stdin.map(|feed| {
        let pipe = child.stdin.take().unwrap();
        std::thread::spawn(move || feed(pipe))
    });
    let output = child.wait_with_output().expect("waiting for the CLI");
    let took = started.elapsed();
    if let Some(feeder) = feeder {
        let _ = feeder.join();
    }
    let (stderr, peak_bytes) = split_peak_rss(&output.stderr);
    let peak_kib = peak_bytes as f64 / 1024.0;
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: stderr.to_string(),
        peak_rss_mib: peak_kib / 1024.0,
        took,
    }
}

/// A server that is no ClickHouse, at `url`, with this password.
fn fake(url: String, password: &str) -> Server {
    Server {
        url,
        user: "default".into(),
        password: password.into(),
        local: false,
    }
}

/// Every log of the request path at trace level (wasmtime's WASI calls with their arguments
/// among them), but not the compiler's: compiling the component on a cold cache traces
/// gigabytes.
const TRACE_REQUESTS: &str =
    "trace,cranelift_codegen=warn,cranelift_frontend=warn,wasmtime_cranelift=warn,regalloc2=warn,wasmtime::runtime=warn";

/// Exit codes by kind (README, Errors and exit codes).
const MISCONFIGURED: i32 = 3;
const TRANSIENT: i32 = 5;
const PERMANENT: i32 = 7;
const INVALID_INPUT: i32 = 2;

#[test]
fn a_password_sent_in_http_basic_is_never_echoed() {
    // A control character makes the client use HTTP Basic (a header value cannot carry it).
    let password = "S3cretXYZ\u{1}";
    let basic = "ZGVmYXVsdDpTM2NyZXRYWVoB"; // base64("default:S3cretXYZ\x01")
    let url = raw_http_server_with_head(|mut stream, head| {
        let body = format!("Code: 516. DB::Exception: you sent: {head} (AUTHENTICATION_FAILED)");
        let _ = write!(
            stream,
            "HTTP/1.1 403 Forbidden\r\nX-ClickHouse-Exception-Code: 516\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    });
    let server = fake(url, password);
    for args in [&["check"][..], &["--json", "check"]] {
        let mut cmd = cli(&server);
        cmd.args(args).env("RUST_LOG", TRACE_REQUESTS);
        let run = measured(cmd, None);
        let out = run.output();
        assert_eq!(run.code, MISCONFIGURED, "{out}");
        // The echo came back (the test sees the header), redacted.
        assert!(
            out.to_ascii_lowercase()
                .contains("authorization: basic ***"),
            "{out}"
        );
        assert!(!out.contains(basic), "the Basic credentials leaked:\n{out}");
        assert!(!out.contains("S3cretXYZ"), "the password leaked:\n{out}");
    }
}

#[test]
fn a_secret_setting_is_not_in_the_trace() {
    let url = raw_http_server(|mut stream| {
        let _ = stream.write_all(
            b"HTTP/1.1 500 Internal Server Error\r\nX-ClickHouse-Exception-Code: 999\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnope",
        );
    });
    let server = fake(format!("{url}/?s3_secret_access_key=T0pS3cretKey"), "pw");
    let mut cmd = cli(&server);
    cmd.arg("check").env("RUST_LOG", TRACE_REQUESTS);
    let run = measured(cmd, None);
    // The call that carries the request target is traced (with the secret redacted).
    assert!(
        run.stderr.contains("set-path-with-query")
            && run.stderr.contains("s3_secret_access_key=***"),
        "no trace of the request target:\n{}",
        run.stderr
    );
    assert!(!run.output().contains("T0pS3cretKey"), "{}", run.output());
}

/// `state list` through a proxy to the local ClickHouse that answers the ids read with `reply`.
fn list_answered_with(reply: Vec<u8>, extra: &[&str]) -> (Run, usize) {
    let server = clickhouse();
    let proxy = Proxy::start(&server.url);
    let rule = proxy.add(Rule::head_contains(
        "x-component-operation: ids",
        Fault::Respond(Arc::new(reply)),
    ));
    let mut cmd = cli(&proxy.server(server));
    cmd.env("CLICKHOUSE_RETRIES", "0")
        .env("CLICKHOUSE_SCHEMA", unique_name("bomb"))
        .args(extra)
        .args(["state", "list"]);
    let run = measured(cmd, None);
    (run, proxy.hits(rule))
}

#[test]
fn an_lz4_bomb_is_a_clean_permanent_error_at_any_memory_limit() {
    // 1.2 MB on the wire, 300 MiB decoded: past the 256 MiB cap. It is refused at the cost of
    // its own bytes (the decoder counts before it keeps anything): a decoder whose buffer
    // doubled toward the cap peaked at 543 MiB here. The 200 MiB one fits the cap but not a
    // 64 MiB instance: refused before its buffer is had. With `--max-response-mib 1` the host
    // refuses its 1.2 MB as sent. Each error names the bound that refused it, and only that one
    // (the host's error reaches the component as text, which under RUST_BACKTRACE carries a
    // backtrace: only its first line is kept).
    let bomb = lz4_reply(300 << 20, false);
    assert!(
        bomb.len() > 1 << 20 && bomb.len() < 2 << 20,
        "{}",
        bomb.len()
    );
    for (reply, extra, want, unwanted, most_mib) in [
        (
            bomb.clone(),
            &[][..],
            "decodes to more than 256 MiB",
            "--max-response-mib",
            150.0,
        ),
        (
            lz4_reply(200 << 20, false),
            &["--max-memory-mib", "64"][..],
            "memory holds",
            "--max-response-mib",
            150.0,
        ),
        (
            bomb,
            &["--max-response-mib", "1"][..],
            "body size exceeds limit: 1048576 bytes (the host's response size limit, --max-response-mib)",
            "decodes",
            150.0,
        ),
    ] {
        let (run, hits) = list_answered_with(reply, extra);
        run.report(&format!("lz4 bomb {extra:?}"));
        assert_eq!(run.code, PERMANENT, "{}", run.output());
        assert!(run.stderr.contains(want), "{}", run.output());
        assert!(!run.stderr.contains(unwanted), "{}", run.output());
        assert!(
            run.peak_rss_mib < most_mib,
            "peak RSS {:.0} MiB (most {most_mib:.0})",
            run.peak_rss_mib
        );
        assert_eq!(hits, 1, "a permanent error is not retried");
        run.assert_no_frames();
    }
}

#[test]
fn an_lz4_frame_without_its_end_mark_is_refused_not_taken_in_part() {
    // A whole answer that is cut short fails the same way every time: misconfigured (not
    // ClickHouse's answer as sent), one request, not retried.
    let (run, hits) = list_answered_with(lz4_reply(8 << 20, true), &[]);
    assert_eq!(run.code, MISCONFIGURED, "{}", run.output());
    assert!(run.stderr.contains("cut short"), "{}", run.output());
    assert_eq!(hits, 1, "not retried");
    run.assert_no_frames();
}

#[test]
fn a_whole_lz4_answer_that_does_not_decode_is_named_and_not_retried() {
    let reply = |body: &[u8]| {
        let mut reply = format!(
            "HTTP/1.1 200 OK\r\nContent-Encoding: lz4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        reply.extend_from_slice(body);
        reply
    };
    // The lz4 magic number, then garbage; and no lz4 at all.
    let mut garbage = vec![0x04, 0x22, 0x4d, 0x18];
    garbage.extend(std::iter::repeat_n(0xa5u8, 4096));
    for (body, want) in [
        (garbage, "does not decode"),
        (b"plain text, labelled lz4".to_vec(), "not an lz4 frame"),
    ] {
        let (run, hits) = list_answered_with(reply(&body), &[]);
        assert_eq!(run.code, MISCONFIGURED, "{}", run.output());
        assert!(run.stderr.contains(want), "{}", run.output());
        assert!(!run.stderr.contains("cut short"), "{}", run.output());
        assert_eq!(hits, 1, "not retried");
        run.assert_no_frames();
    }
}

#[test]
fn a_trickling_answer_ends_at_the_request_timeout() {
    let server = fake(trickling_server(), "pw");
    let mut cmd = cli(&server);
    cmd.args(["--request-timeout-ms", "2000", "check"]);
    let run = measured(cmd, None);
    run.report("trickle");
    assert_eq!(run.code, TRANSIENT, "{}", run.output());
    assert!(
        run.stderr.contains("not whole within 2.0 s"),
        "{}",
        run.output()
    );
    // It bytes kept coming: only the total deadline ends it (well before 30 s of trickle).
    assert!(run.took < Duration::from_secs(30), "{:?}", run.took);
    run.assert_no_frames();
}

#[test]
fn the_call_deadline_is_a_clean_error() {
    let server = fake(trickling_server(), "pw");
    let mut cmd = cli(&server);
    cmd.args([
        "--call-timeout-seconds",
        "1",
        "--request-timeout-ms",
        "60000",
        "check",
    ]);
    let run = measured(cmd, None);
    assert_eq!(run.code, 1, "{}", run.output());
    assert!(
        run.stderr
            .contains("did not finish within its deadline of 1.0 s"),
        "{}",
        run.output()
    );
    run.assert_no_frames();
}

#[test]
fn an_answer_that_never_ends_is_refused_in_bounded_memory() {
    let url = raw_http_server(|mut stream| {
        let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        let mut chunk = format!("{:x}\r\n", 64 * 1024).into_bytes();
        chunk.extend_from_slice(&[b'x'; 64 * 1024]);
        chunk.extend_from_slice(b"\r\n");
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(120) && stream.write_all(&chunk).is_ok() {}
    });
    let check = || {
        let mut cmd = cli(&fake(url.clone(), "pw"));
        cmd.arg("check");
        measured(cmd, None)
    };
    // The first run may compile the component (a cold cache), which takes memory of its own:
    // the second one measures what the answer costs.
    check();
    let run = check();
    run.report("endless 200");
    assert_eq!(run.code, PERMANENT, "{}", run.output());
    assert!(
        run.stderr
            .contains("the most this statement's answer may be"),
        "{}",
        run.output()
    );
    assert!(
        run.peak_rss_mib < 150.0,
        "peak RSS {:.0} MiB",
        run.peak_rss_mib
    );
}

/// A server answering every request with `reply`, counting them.
fn counting_server(reply: &'static [u8]) -> (String, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    let url = raw_http_server(move |mut stream| {
        seen.fetch_add(1, Ordering::SeqCst);
        let _ = stream.write_all(reply);
    });
    (url, count)
}

#[test]
fn answers_that_are_not_clickhouse_are_misconfigured_and_not_retried() {
    let cases: [(&str, &'static [u8]); 3] = [
        // Another protocol on the port (the host reports a parse error as a protocol error; a
        // reply cut inside its head is an incomplete answer, retried: the fault tests).
        ("not HTTP at all", b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n"),
        (
            "a redirect",
            b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://elsewhere.test/\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        ),
        (
            "an encoding not asked for",
            b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\nConnection: close\r\n\r\nabcd",
        ),
    ];
    for (what, reply) in cases {
        let (url, count) = counting_server(reply);
        let mut cmd = cli(&fake(url, "pw"));
        // Retries allowed: a misconfiguration is not retried anyway.
        cmd.env("CLICKHOUSE_RETRIES", "3").args(["state", "list"]);
        let run = measured(cmd, None);
        assert_eq!(run.code, MISCONFIGURED, "{what}: {}", run.output());
        assert!(
            run.stderr.contains("misconfigured"),
            "{what}: {}",
            run.output()
        );
        assert_eq!(count.load(Ordering::SeqCst), 1, "{what}: retried");
    }
}

#[test]
fn a_row_over_the_limit_is_refused_before_it_is_sent_in_bounded_memory() {
    let server = clickhouse();
    let sql = Sql::new(&server.connection());
    let db = unique_name("long_line");
    sql.exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    sql.exec(
        "CREATE TABLE {db:Identifier}.t (s String) ENGINE = MergeTree ORDER BY s",
        &[("db", &db)],
    );
    // One good row, then a line that never ends (400 MB of it, or until the CLI stops reading).
    let mut cmd = cli(server);
    cmd.env("CLICKHOUSE_DATABASE", &db)
        .args(["sink", "--table", "t"]);
    let run = measured(
        cmd,
        Some(Box::new(|mut pipe| {
            let _ = pipe.write_all(b"{\"s\":\"fine\"}\n{\"s\":\"");
            let chunk = vec![b'x'; 1 << 20];
            for _ in 0..400 {
                if pipe.write_all(&chunk).is_err() {
                    return;
                }
            }
        })),
    );
    run.report("long line");
    assert_eq!(run.code, INVALID_INPUT, "{}", run.output());
    assert!(
        run.stderr.contains("line 2 is over 64 MiB"),
        "{}",
        run.output()
    );
    // Both rows were one batch: nothing was sent.
    assert_eq!(
        sql.count("SELECT count() FROM {db:Identifier}.t", &[("db", &db)]),
        0
    );
    assert!(
        run.peak_rss_mib < 400.0,
        "peak RSS {:.0} MiB",
        run.peak_rss_mib
    );
    run.assert_no_frames();
}
