//! Foundation: the real component in the real host against a real ClickHouse engine.

use std::io::Read;
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clickhouse_component::client::{ConnectionOptions, ErrorKind};
use clickhouse_component_host::{
    default_allow_list, AllowList, CachePolicy, ComponentSource, LoadKind, Runtime,
};
use clickhouse_component_tests::{cli, clickhouse, runtime, store_in, unique_name};
use serde_json::Value;

async fn ping(
    connection: &ConnectionOptions,
    allow: AllowList,
) -> Result<clickhouse_component_host::ServerInfo, clickhouse_component::client::Error> {
    let mut instance = runtime().instantiate(allow).await.unwrap();
    instance
        .ping(connection)
        .await
        .map_err(|e| e.into_component())
}

#[tokio::test]
async fn ping_reports_the_server() {
    let server = clickhouse();
    let conn = server.connection();
    let info = ping(&conn, default_allow_list(&conn).unwrap())
        .await
        .unwrap();
    assert!(
        info.version.chars().next().unwrap().is_ascii_digit(),
        "{}",
        info.version
    );
    assert_eq!(info.user, server.user);
    assert!(!info.timezone.is_empty());
    assert_eq!(info.database, "default");
    assert!(info.round_trip_us > 0);
}

#[tokio::test]
async fn database_and_settings_reach_the_server() {
    let server = clickhouse();
    let conn = ConnectionOptions {
        database: Some("system".into()),
        settings: vec![("max_threads".into(), "1".into())],
        ..server.connection()
    };
    let info = ping(&conn, default_allow_list(&conn).unwrap())
        .await
        .unwrap();
    assert_eq!(info.database, "system");

    // An unknown setting is rejected by the server itself: proof that settings are sent.
    let conn = ConnectionOptions {
        settings: vec![("no_such_setting_xyz".into(), "1".into())],
        ..server.connection()
    };
    let err = ping(&conn, default_allow_list(&conn).unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Misconfigured, "{err}");
    assert_eq!(err.server.unwrap().code, 115); // UNKNOWN_SETTING
}

#[tokio::test]
async fn wrong_password_is_misconfigured_with_the_servers_code() {
    let server = clickhouse();
    let conn = ConnectionOptions {
        password: Some("definitely-Wrong-pw".into()),
        ..server.connection()
    };
    let err = ping(&conn, default_allow_list(&conn).unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Misconfigured, "{err}");
    let code = err.server.as_ref().expect("server error").code;
    assert!([516, 193, 194, 192].contains(&code), "code {code}");
    assert!([401, 403].contains(&err.server.as_ref().unwrap().http_status));
    assert!(
        !err.message.contains("definitely-Wrong-pw"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn unknown_database_is_misconfigured() {
    let server = clickhouse();
    let conn = ConnectionOptions {
        database: Some("no_such_db_for_tests".into()),
        ..server.connection()
    };
    let err = ping(&conn, default_allow_list(&conn).unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Misconfigured, "{err}");
    let server_error = err.server.unwrap();
    assert_eq!(server_error.code, 81);
    assert_eq!(server_error.name, "UNKNOWN_DATABASE");
}

#[tokio::test]
async fn closed_port_is_disconnected() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }; // closed again here
    let conn = ConnectionOptions::from_url(format!("http://127.0.0.1:{port}"));
    let err = ping(&conn, default_allow_list(&conn).unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Disconnected, "{err}");
    assert!(
        err.message.contains(&format!("127.0.0.1:{port}")),
        "{}",
        err.message
    );
}

/// A loopback listener that counts the connections it accepts and hands each to `handle` on a
/// thread of its own.
fn counting_listener(
    handle: impl Fn(std::net::TcpStream) + Send + Sync + 'static,
) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    let handle = Arc::new(handle);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            seen.fetch_add(1, Ordering::SeqCst);
            let (stream, handle) = (stream.unwrap(), handle.clone());
            std::thread::spawn(move || handle(stream));
        }
    });
    (port, count)
}

/// A TCP listener that counts connections and never answers.
fn black_hole() -> (u16, Arc<AtomicUsize>) {
    counting_listener(|mut stream| {
        let mut buf = [0u8; 4096];
        while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
    })
}

#[tokio::test]
async fn destinations_outside_the_allow_list_are_denied_without_connecting() {
    let (port, connections) = black_hole();
    let conn = ConnectionOptions::from_url(format!("http://127.0.0.1:{port}"));
    // Allow only the real ClickHouse, not the listener.
    let allow = default_allow_list(&clickhouse().connection()).unwrap();
    let err = ping(&conn, allow).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Misconfigured, "{err}");
    assert!(err.message.contains("allow-list"), "{}", err.message);
    assert!(
        err.message.contains(&format!("127.0.0.1:{port}")),
        "{}",
        err.message
    );
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "a connection was attempted"
    );

    // An empty allow-list denies even the configured server.
    let server = clickhouse().connection();
    let err = ping(&server, AllowList::default()).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Misconfigured);
}

#[tokio::test]
async fn request_timeout_of_a_read_is_transient() {
    let (port, connections) = black_hole();
    let conn = ConnectionOptions {
        request_timeout_ms: Some(300),
        ..ConnectionOptions::from_url(format!("http://127.0.0.1:{port}"))
    };
    let started = Instant::now();
    let err = ping(&conn, default_allow_list(&conn).unwrap())
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    assert_eq!(err.kind, ErrorKind::Transient, "{err}");
    assert!(err.message.contains("timeout"), "{}", err.message);
    assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    assert_eq!(connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn malformed_connection_is_invalid_input_before_any_request() {
    let conn = ConnectionOptions::from_url("clickhouse://user:S3cret@host:99999");
    let mut instance = runtime()
        .instantiate(AllowList::parse(["*://*:*"]).unwrap())
        .await
        .unwrap();
    let err = instance.ping(&conn).await.unwrap_err().into_component();
    assert_eq!(err.kind, ErrorKind::InvalidInput);
    assert!(err.message.contains("invalid port"), "{}", err.message);
    assert!(!err.message.contains("S3cret"));
}

#[tokio::test]
async fn one_instance_serves_many_calls() {
    let conn = clickhouse().connection();
    let mut instance = runtime()
        .instantiate(default_allow_list(&conn).unwrap())
        .await
        .unwrap();
    for _ in 0..20 {
        instance.ping(&conn).await.unwrap();
    }
}

#[test]
fn precompiled_component_is_cached_by_hash() {
    let dir = std::env::temp_dir().join(format!("chc-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let first = Runtime::new(&ComponentSource::Embedded, &CachePolicy::Dir(dir.clone())).unwrap();
    assert_eq!(first.load_report().kind, LoadKind::CompiledAndCached);
    let second = Runtime::new(&ComponentSource::Embedded, &CachePolicy::Dir(dir.clone())).unwrap();
    assert_eq!(second.load_report().kind, LoadKind::CacheHit);
    assert_eq!(
        first.load_report().cache_file,
        second.load_report().cache_file
    );
    // A damaged cache file is recompiled, not trusted.
    let file = second.load_report().cache_file.clone().unwrap();
    std::fs::write(&file, b"garbage").unwrap();
    let third = Runtime::new(&ComponentSource::Embedded, &CachePolicy::Dir(dir.clone())).unwrap();
    assert_eq!(third.load_report().kind, LoadKind::CompiledAndCached);
    let disabled = Runtime::new(&ComponentSource::Embedded, &CachePolicy::Disabled).unwrap();
    assert_eq!(disabled.load_report().kind, LoadKind::Compiled);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cli_check_prints_the_server_and_exits_zero() {
    let server = clickhouse();
    let out = cli(server).args(["check", "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["user"], server.user.as_str());
    assert!(v["round_trip_ms"].as_f64().unwrap() > 0.0);

    let out = cli(server).arg("check").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("ClickHouse "), "{text}");
    assert!(text.contains("round trip"), "{text}");
}

#[test]
fn cli_exit_codes_follow_the_error_kind() {
    let server = clickhouse();
    let wrong = cli(server)
        .args(["check", "--json"])
        .env("CLICKHOUSE_PASSWORD", "Not-The-Password")
        .output()
        .unwrap();
    assert_eq!(wrong.status.code(), Some(3));
    let v: Value = serde_json::from_slice(&wrong.stdout).unwrap();
    assert_eq!(v["error"]["kind"], "misconfigured");
    assert!(v["error"]["server"]["code"].as_i64().is_some());
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&wrong.stdout),
        String::from_utf8_lossy(&wrong.stderr)
    );
    assert!(!all.contains("Not-The-Password"), "{all}");

    let bad_url = cli(server)
        .args(["check", "--url", "clickhouse://h:0"])
        .output()
        .unwrap();
    assert_eq!(bad_url.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad_url.stderr).contains("invalid port"));

    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let refused = cli(server)
        .args(["check", "--url", &format!("http://127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(4));

    let (hole, _) = black_hole();
    let timeout = cli(server)
        .args([
            "check",
            "--request-timeout-ms",
            "200",
            "--url",
            &format!("http://127.0.0.1:{hole}"),
        ])
        .output()
        .unwrap();
    assert_eq!(timeout.status.code(), Some(5));

    let no_url = cli(server)
        .env_remove("CLICKHOUSE_URL")
        .arg("check")
        .output()
        .unwrap();
    assert_eq!(no_url.status.code(), Some(2));

    let usage = cli(server)
        .args(["check", "--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(usage.status.code(), Some(2));
}

/// A pass-through TCP proxy to the real server that counts the connections it accepts.
fn counting_proxy(target: &str) -> (u16, Arc<AtomicUsize>) {
    let target = target.trim_start_matches("http://").to_string();
    counting_listener(move |client| {
        let server = std::net::TcpStream::connect(&target).unwrap();
        let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        let (mut c1, mut s1) = (client, server);
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut c1, &mut s1);
            let _ = s1.shutdown(std::net::Shutdown::Write);
        });
        let _ = std::io::copy(&mut s2, &mut c2);
        let _ = c2.shutdown(std::net::Shutdown::Write);
    })
}

#[tokio::test]
async fn an_instance_reuses_its_connections() {
    let server = clickhouse();
    if !server.url.starts_with("http://") {
        eprintln!(
            "skipped: the keep-alive pool serves plain HTTP only, this server is {}",
            server.url
        );
        return;
    }
    let (port, connections) = counting_proxy(&server.url);
    let conn = ConnectionOptions {
        url: format!("http://127.0.0.1:{port}"),
        ..server.connection()
    };
    let mut instance = runtime()
        .instantiate(default_allow_list(&conn).unwrap())
        .await
        .unwrap();
    for _ in 0..20 {
        instance.ping(&conn).await.unwrap();
    }
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "20 requests, one keep-alive connection"
    );
    // A second instance has its own connections.
    let mut other = runtime()
        .instantiate(default_allow_list(&conn).unwrap())
        .await
        .unwrap();
    other.ping(&conn).await.unwrap();
    assert_eq!(connections.load(Ordering::SeqCst), 2);
}

#[test]
fn the_embedding_example_runs() {
    let server = clickhouse();
    let exe = clickhouse_component_tests::cli_binary()
        .with_file_name("examples")
        .join("embed");
    assert!(
        exe.exists(),
        "{} not built: run `make test` (it runs `cargo build --workspace --bins --examples`)",
        exe.display()
    );
    let db = clickhouse_component_tests::unique_name("embed_sink");
    let sql = clickhouse_component_tests::native::Sql::new(&server.connection());
    sql.exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    sql.exec(
        "CREATE TABLE {db:Identifier}.events (task UInt64, n UInt64) ENGINE = MergeTree ORDER BY tuple()",
        &[("db", &db)],
    );
    let out = std::process::Command::new(exe)
        .env("CLICKHOUSE_URL", &server.url)
        .env("CLICKHOUSE_USER", &server.user)
        .env("CLICKHOUSE_PASSWORD", &server.password)
        .env(
            "CLICKHOUSE_COMPONENT_CACHE_DIR",
            clickhouse_component_tests::cache_dir(),
        )
        .env("EXAMPLE_SINK_TABLE", format!("{db}.events"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for task in 0..4 {
        assert!(
            stdout.contains(&format!(
                "task {task}: state task-{task} = {{\"bookmark\":{task}}}, sent 5 rows in 3 chunks"
            )),
            "{stdout}"
        );
    }
    let rows = sql.count("SELECT count() FROM {db:Identifier}.events", &[("db", &db)]);
    assert_eq!(rows, 20);
}

/// The library component (built beside the full one, without `wasi:cli/run` and the command
/// line, for size and shrunk by wasm-opt) is well under the full size, runs every library
/// interface in the same host (the lock, compressed reads, every codec of the sink), and
/// refuses command mode with a clear runner error.
#[tokio::test]
async fn the_library_component_serves_the_library_and_has_no_command_mode() {
    use clickhouse_component_host::{
        default_allow_list, CachePolicy, ComponentSource, Compression, Runtime, SinkOptions, State,
        EMBEDDED_COMPONENT_PATH, LIBRARY_COMPONENT_PATH,
    };

    let library = std::path::PathBuf::from(LIBRARY_COMPONENT_PATH.expect("built by host/build.rs"));
    let library_size = std::fs::metadata(&library).unwrap().len();
    let full_size = std::fs::metadata(EMBEDDED_COMPONENT_PATH).unwrap().len();
    eprintln!("library component {library_size} bytes, full component {full_size} bytes");
    // Well under the full one, shrunk or not (without binaryen the build leaves it unshrunk).
    assert!(
        library_size * 10 < full_size * 6,
        "library {library_size} bytes is not well under the full {full_size}"
    );
    let runtime = Runtime::new(&ComponentSource::File(library), &CachePolicy::Disabled).unwrap();
    let conn = clickhouse().connection();
    let db = unique_name("library");
    let (mut i, s) = store_in(&runtime, &conn, &db).await;
    assert!(!i.ping(&conn).await.unwrap().version.is_empty());
    let state = State {
        id: "tap--target".into(),
        partial: String::new(),
        completed: r#"{"bookmarks":{"s":1}}"#.into(),
    };
    i.state_set(s, &state).await.unwrap();
    assert_eq!(
        i.state_get(s, "tap--target")
            .await
            .unwrap()
            .unwrap()
            .completed,
        state.completed
    );
    // A write under the lock, and the reads that ask for lz4 answers.
    let merged = State {
        completed: r#"{"bookmarks":{"t":2}}"#.into(),
        ..state.clone()
    };
    let after = i.state_update(s, &merged).await.unwrap();
    assert_eq!(after.completed, merged.completed);
    assert_eq!(i.state_ids(s, None).await.unwrap(), vec!["tap--target"]);
    let all = i.state_get_all(s, Some("tap-*")).await.unwrap();
    let all: Vec<(&str, &str)> = all.iter().map(|s| (&*s.id, &*s.completed)).collect();
    assert_eq!(all, [("tap--target", &*after.completed)]);
    let sql = clickhouse_component_tests::native::sql();
    sql.exec(
        "CREATE TABLE {db:Identifier}.t (n UInt32) ENGINE = MergeTree ORDER BY n",
        &[("db", &db)],
    );
    // Every codec: the server decodes what the shrunk component encoded.
    let methods = [
        Compression::None,
        Compression::Lz4,
        Compression::Zstd,
        Compression::Gzip,
    ];
    for (n, method) in methods.into_iter().enumerate() {
        let sink = i
            .open_sink(
                &conn,
                &SinkOptions {
                    table: format!("{db}.t"),
                    columns: None,
                    batch_size: Some(2),
                    settings: vec![],
                    dedup: None,
                    retries: None,
                    compression: Some(method),
                },
            )
            .await
            .unwrap();
        let rows: String = (0..3)
            .map(|k| format!("{{\"n\":{}}}\n", n * 3 + k))
            .collect();
        let r = i.sink_send_json(sink, rows.as_bytes()).await.unwrap();
        assert_eq!((r.rows, r.chunks, r.written_rows), (3, 2, 3), "{method:?}");
    }
    let stored = sql.count("SELECT sum(n) FROM {db:Identifier}.t", &[("db", &db)]);
    assert_eq!(stored, (0..12).sum::<u64>());
    // No command mode: a runner error that says so, not a trap or a hang.
    let mut command = runtime
        .instantiate_command(
            default_allow_list(&conn).unwrap(),
            &["clickhouse-component".to_string(), "check".to_string()],
            &[],
            clickhouse_component_host::CommandInput::Bytes(Vec::new()),
            None,
            &[],
        )
        .await
        .unwrap();
    let err = command.run_command().await.unwrap_err().to_string();
    assert!(err.contains("no command mode"), "{err}");
}
