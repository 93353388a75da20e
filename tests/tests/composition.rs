//! Another component plugs in the library component: the example consumer
//! (examples/state-service, a `wasi:http/proxy` component importing
//! `clickhouse:connector/state-store` and `table-sink`) composed with the library component by
//! `wac plug` (scripts/compose, what `make compose` runs), served by the stock `wasmtime serve`
//! (the version the host embeds) on a loopback port, against the real ClickHouse, driven with
//! real HTTP. Each request is a new instance of the composed component.

use std::time::{Duration, Instant};

use clickhouse_component_host::StoreOptions;
use clickhouse_component_tests::native::Sql;
use clickhouse_component_tests::proxy::{Fault, Proxy, Rule};
use clickhouse_component_tests::serve::{component_wit, composed, world_items, Serve};
use clickhouse_component_tests::{clickhouse, instance_for, runtime, unique_name, Server};
use serde_json::json;

/// `wasmtime serve` of the composed component with its state tables in a database of its own
/// (`CLICKHOUSE_SCHEMA`), and `extra` environment and arguments.
fn serve_in(server: &Server, db: &str, extra: &[(&str, Option<&str>)], args: &[&str]) -> Serve {
    let mut env = vec![("CLICKHOUSE_SCHEMA", Some(db))];
    env.extend_from_slice(extra);
    Serve::start(server, &env, args)
}

#[test]
fn the_consumer_imports_the_library_interfaces_and_the_composition_only_wasi() {
    let files = composed();
    let consumer = component_wit(&files.consumer);
    let imports = world_items(&consumer, "import");
    for needed in [
        "clickhouse:connector/state-store@0.1.0",
        "clickhouse:connector/table-sink@0.1.0",
    ] {
        assert!(
            imports.iter().any(|i| i == needed),
            "the consumer does not import {needed}: {imports:?}"
        );
    }
    // The consumer cannot reach ClickHouse by itself: no outgoing HTTP of its own.
    assert!(
        !imports
            .iter()
            .any(|i| i.starts_with("wasi:http/outgoing-handler")),
        "the consumer imports outgoing HTTP itself: {imports:?}"
    );

    let wit = component_wit(&files.composed);
    let imports = world_items(&wit, "import");
    assert!(
        imports.iter().all(|i| i.starts_with("wasi:")),
        "the composed component imports something other than WASI: {imports:?}"
    );
    assert!(
        !imports.iter().any(|i| i.starts_with("clickhouse:")),
        "{imports:?}"
    );
    assert!(
        imports
            .iter()
            .any(|i| i == "wasi:http/outgoing-handler@0.2.12"),
        "the library's outgoing HTTP is the composition's: {imports:?}"
    );
    assert_eq!(
        world_items(&wit, "export"),
        ["wasi:http/incoming-handler@0.2.12"]
    );

    // The binary WIT package: our package, with both interfaces.
    let package = component_wit(&files.wit_package);
    assert!(
        package.contains("package clickhouse:connector@0.1.0"),
        "{package}"
    );
    for interface in [
        "interface state-store",
        "interface table-sink",
        "world library",
    ] {
        assert!(package.contains(interface), "no {interface} in the package");
    }
}

#[test]
fn set_get_merge_and_list_over_http() {
    let server = clickhouse();
    let db = unique_name("compose_state");
    let serve = serve_in(server, &db, &[], &[]);

    // Exact number text survives the whole path (the library keeps it; the service passes the
    // parts through as text).
    let put =
        br#"{"completed": {"singer_state": {"big": 123456789012345678901234567890, "x": 2.50}}}"#;
    let stored = serve.ok("PUT", "/state/tap-a%2Fb--target", put);
    assert_eq!(stored["id"], "tap-a/b--target");
    let (_, text) = serve.call_raw("GET", "/state/tap-a%2Fb--target", b"");
    assert_eq!(
        text,
        r#"{"id":"tap-a/b--target","partial":{},"completed":{"singer_state":{"big":123456789012345678901234567890,"x":2.50}}}"#
    );

    serve.ok("PUT", "/state/tap-c", br#"{"partial": {"p": {"a": 1}}}"#);
    let merged = serve.ok(
        "POST",
        "/state/tap-c/merge",
        br#"{"partial": {"p": {"b": 2}}}"#,
    );
    assert_eq!(merged["partial"], json!({"p": {"a": 1, "b": 2}}));
    assert_eq!(
        serve.ok("GET", "/state/tap-c", b"")["partial"],
        merged["partial"]
    );
    // A completed part replaces the row and clears the partial (Meltano's update).
    let merged = serve.ok(
        "POST",
        "/state/tap-c/merge",
        br#"{"completed": {"singer_state": {"done": true}}}"#,
    );
    assert_eq!(merged["partial"], json!({}));
    assert_eq!(merged["completed"], json!({"singer_state": {"done": true}}));

    serve.ok("PUT", "/state/other", br#"{"completed": {"a": 1}}"#);
    assert_eq!(
        serve.ok("GET", "/states?pattern=tap-%2A", b"")["ids"],
        json!(["tap-a/b--target", "tap-c"])
    );
    assert_eq!(
        serve.ok("GET", "/states", b"")["ids"],
        json!(["other", "tap-a/b--target", "tap-c"])
    );

    let (status, error) = serve.call("GET", "/state/missing", b"");
    assert_eq!((status, error["kind"].as_str()), (404, Some("not-found")));
}

#[test]
fn a_sink_of_10000_rows() {
    let server = clickhouse();
    let db = unique_name("compose_sink");
    let sql = Sql::new(&server.connection());
    sql.exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    sql.exec(
        "CREATE TABLE {db:Identifier}.events (id UInt64, kind String, v Float64) ENGINE = MergeTree ORDER BY id",
        &[("db", &db)],
    );
    let serve = serve_in(server, &db, &[("CLICKHOUSE_DATABASE", Some(&db))], &[]);
    let mut body = String::new();
    for i in 0..10_000u64 {
        body.push_str(
            &json!({"id": i, "kind": format!("k{}", i % 7), "v": i as f64 / 4.0}).to_string(),
        );
        body.push('\n');
    }
    let receipt = serve.ok("POST", "/sink/events?batch-size=2500", body.as_bytes());
    assert_eq!(receipt["rows"], 10_000);
    assert_eq!(receipt["chunks"], 4);
    assert_eq!(receipt["written-rows"], 10_000);
    assert_eq!(
        sql.count("SELECT count() FROM {db:Identifier}.events", &[("db", &db)]),
        10_000
    );
    assert_eq!(
        sql.count(
            "SELECT sum(id) FROM {db:Identifier}.events WHERE kind = 'k3'",
            &[("db", &db)]
        ),
        (0..10_000u64).filter(|i| i % 7 == 3).sum::<u64>()
    );
}

#[test]
fn bad_input_gets_its_status_and_writes_nothing() {
    let server = clickhouse();
    let db = unique_name("compose_bad");
    let sql = Sql::new(&server.connection());
    sql.exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    sql.exec(
        "CREATE TABLE {db:Identifier}.events (id UInt64, kind String) ENGINE = MergeTree ORDER BY id",
        &[("db", &db)],
    );
    let serve = serve_in(server, &db, &[("CLICKHOUSE_DATABASE", Some(&db))], &[]);
    let expect = |method: &str, path: &str, body: &[u8], status: u16, kind: &str| {
        let (got, error) = serve.call(method, path, body);
        assert_eq!(
            (got, error["kind"].as_str()),
            (status, Some(kind)),
            "{method} {path}: {error}"
        );
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
        error
    };

    // Malformed JSON, a part that is not an object, an unknown key, a duplicate key: 400.
    expect(
        "PUT",
        "/state/s",
        br#"{"completed": "#,
        400,
        "invalid-input",
    );
    expect(
        "PUT",
        "/state/s",
        br#"{"partial": [1]}"#,
        400,
        "invalid-input",
    );
    expect("PUT", "/state/s", br#"{"state": {}}"#, 400, "invalid-input");
    expect(
        "PUT",
        "/state/s",
        br#"{"partial": {"a": 1, "a": 2}}"#,
        400,
        "invalid-input",
    );
    expect("GET", "/state/s", b"", 404, "not-found");
    // A malformed merge leaves the stored state as it was.
    serve.ok("PUT", "/state/kept", br#"{"partial": {"a": 1}}"#);
    expect(
        "POST",
        "/state/kept/merge",
        b"{\"partial\": {\"b\": ",
        400,
        "invalid-input",
    );
    expect(
        "POST",
        "/state/kept/merge",
        b"not json",
        400,
        "invalid-input",
    );
    assert_eq!(
        serve.ok("GET", "/state/kept", b"")["partial"],
        json!({"a": 1})
    );
    assert_eq!(serve.ok("GET", "/states", b"")["ids"], json!(["kept"]));

    // A malformed NDJSON line, even after good ones: nothing is sent.
    expect(
        "POST",
        "/sink/events",
        b"{\"id\": 1, \"kind\": \"a\"}\n{\"id\": 2, \"kind\": \n",
        400,
        "invalid-input",
    );
    expect("POST", "/sink/events", b"", 400, "invalid-input");
    // An unknown table: the server's UNKNOWN_TABLE, misconfigured, 422.
    let error = expect(
        "POST",
        "/sink/no_such_table",
        b"{\"id\": 1, \"kind\": \"a\"}\n",
        422,
        "misconfigured",
    );
    assert_eq!(error["server"]["name"], "UNKNOWN_TABLE");
    assert_eq!(error["committed-rows"], 0);
    assert_eq!(
        sql.count("SELECT count() FROM {db:Identifier}.events", &[("db", &db)]),
        0
    );

    // The router's own refusals.
    expect("GET", "/nothing/here", b"", 404, "not-found");
    expect("DELETE", "/state/kept", b"", 405, "invalid-input");
    expect("GET", "/state/%zz", b"", 400, "invalid-input");
    expect(
        "POST",
        "/sink/events?batch-size=x",
        b"{}",
        400,
        "invalid-input",
    );

    // The configuration comes from the environment only: without CLICKHOUSE_URL the service
    // answers 500 misconfigured and sends nothing.
    let unconfigured = serve_in(server, &db, &[("CLICKHOUSE_URL", None)], &[]);
    let (status, error) = unconfigured.call("GET", "/state/kept", b"");
    assert_eq!(
        (status, error["kind"].as_str()),
        (500, Some("misconfigured"))
    );
    assert!(error["message"]
        .as_str()
        .unwrap()
        .contains("CLICKHOUSE_URL"));
    let bad_option = serve_in(server, &db, &[("STATE_CREATE_SCHEMA", Some("maybe"))], &[]);
    let (status, error) = bad_option.call("GET", "/state/kept", b"");
    assert_eq!(
        (status, error["kind"].as_str()),
        (500, Some("misconfigured"))
    );
    // STATE_CREATE_SCHEMA=false never creates the tables: a missing schema is misconfigured.
    let fresh = unique_name("compose_no_schema");
    let no_ddl = serve_in(
        server,
        &fresh,
        &[("STATE_CREATE_SCHEMA", Some("false"))],
        &[],
    );
    let (status, error) = no_ddl.call("GET", "/state/kept", b"");
    assert_eq!(
        (status, error["kind"].as_str()),
        (422, Some("misconfigured")),
        "{error}"
    );
    assert_eq!(
        sql.count(
            "SELECT count() FROM system.databases WHERE name = {db:String}",
            &[("db", &fresh)]
        ),
        0
    );
}

#[test]
fn eight_concurrent_merges_on_one_id_lose_no_key() {
    let server = clickhouse();
    let db = unique_name("compose_merge");
    let serve = serve_in(server, &db, &[], &[]);
    serve.ok(
        "PUT",
        "/state/job",
        br#"{"partial": {"keys": {"seed": 0}}}"#,
    );
    const CLIENTS: usize = 8;
    const MERGES: usize = 4;
    std::thread::scope(|s| {
        for c in 0..CLIENTS {
            let serve = &serve;
            s.spawn(move || {
                for m in 0..MERGES {
                    let body = json!({"partial": {"keys": {format!("c{c}m{m}"): m}}});
                    serve.ok("POST", "/state/job/merge", body.to_string().as_bytes());
                }
            });
        }
    });
    let state = serve.ok("GET", "/state/job", b"");
    let keys = state["partial"]["keys"].as_object().unwrap();
    assert_eq!(keys.len(), CLIENTS * MERGES + 1, "lost keys: {state}");
    for c in 0..CLIENTS {
        for m in 0..MERGES {
            assert_eq!(keys[&format!("c{c}m{m}")], json!(m));
        }
    }
}

/// Dropping an instance runs no guest destructor: a handler killed while it holds the lock
/// (here by `wasmtime serve`'s request timeout, while its fenced write is held at a proxy)
/// leaves the lock held until its lease ends; then the next merge goes through, and the killed
/// merge wrote nothing.
#[test]
fn a_handler_killed_mid_merge_leaves_the_lock_held_until_its_lease_ends() {
    let server = clickhouse();
    let db = unique_name("compose_killed");
    let proxy = Proxy::start(&server.url);
    let via_proxy = proxy.server(server);
    const LEASE_MS: u64 = 6_000;
    let lease = LEASE_MS.to_string();
    // The request timeout (1.5 s) kills the handler long before its lease (6 s) ends.
    let serve = serve_in(
        &via_proxy,
        &db,
        &[("STATE_LEASE_MS", Some(&lease))],
        &["-W", "timeout=1500ms"],
    );
    serve.ok("PUT", "/state/job", br#"{"partial": {"before": 1}}"#);

    // Hold the merge's fenced write (the `set` under the lock) before it reaches the server.
    proxy.add(Rule::head_contains("x-component-operation: set", Fault::Pause).times(1));
    let started = Instant::now();
    let killed = std::thread::scope(|s| {
        let merge =
            s.spawn(|| serve.call("POST", "/state/job/merge", br#"{"partial": {"killed": 1}}"#));
        proxy.wait_held(1, Duration::from_secs(10));
        merge.join().unwrap()
    });
    let killed_after = started.elapsed();
    // The handler never answered: the host's own 500 (not the service's JSON), or a dropped
    // connection.
    assert!(
        killed.0 == 500 || killed.0 == 0,
        "the killed merge answered {killed:?}"
    );
    assert!(killed.1.get("kind").is_none(), "{killed:?}");

    // Another client (the host embedding, same tables, waiting up to 30 s) gets the lock only
    // once the dead handler's lease has ended.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let free_after = rt.block_on(async {
        let conn = server.connection();
        let mut instance = instance_for(runtime(), &conn).await;
        let options = StoreOptions {
            database: Some(db.clone()),
            lock_timeout_ms: Some(30_000),
            ..Default::default()
        };
        let store = instance.open_store(&conn, &options).await.unwrap();
        let lock = instance.lock(store, "job").await.unwrap();
        let free_after = started.elapsed();
        instance.lock_release(lock).await.unwrap();
        free_after
    });
    // The lock was taken after `started`, so its lease ends after started + lease.
    let lease = Duration::from_millis(LEASE_MS);
    assert!(
        free_after >= lease,
        "the lock was free {free_after:?} after the merge started (killed after \
         {killed_after:?}); the lease is {lease:?}"
    );
    assert!(
        free_after < lease + Duration::from_secs(3),
        "the lock was free only {free_after:?} after the merge started"
    );

    // The service goes on: the next merge (a new instance) goes through, and the killed merge
    // wrote nothing.
    let merged = serve.ok("POST", "/state/job/merge", br#"{"partial": {"after": 1}}"#);
    assert_eq!(merged["partial"], json!({"before": 1, "after": 1}));
    proxy.release_all();
    drop(proxy);
}

/// examples/state-service/spin.toml names the files scripts/compose builds (Spin itself is not
/// run: it installs from no registry this machine reaches; docs/composition.md).
#[test]
fn the_spin_manifest_names_the_built_components() {
    let files = composed();
    let manifest = std::fs::read_to_string(
        clickhouse_component_tests::repo_root().join("examples/state-service/spin.toml"),
    )
    .unwrap();
    let dir = clickhouse_component_tests::repo_root().join("examples/state-service");
    // `source = "..."` and the dependency's `{ path = "..." }`, in that order.
    let paths: Vec<String> = manifest
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let at = l.find("source = \"").or_else(|| l.find("path = \""))?;
            let value = &l[at..];
            let value = &value[value.find('"')? + 1..];
            Some(value[..value.find('"')?].to_string())
        })
        .collect();
    assert_eq!(paths.len(), 2, "{paths:?}");
    let resolved: Vec<_> = paths
        .iter()
        .map(|p| std::fs::canonicalize(dir.join(p)).unwrap())
        .collect();
    assert_eq!(resolved[0], std::fs::canonicalize(&files.consumer).unwrap());
    assert_eq!(
        resolved[1],
        std::fs::canonicalize(clickhouse_component_host::LIBRARY_COMPONENT_PATH.unwrap()).unwrap()
    );
    assert!(manifest.contains("\"clickhouse:connector@0.1.0\" = { path = "));
    assert!(manifest.contains("dependencies_inherit_configuration = true"));
    assert!(manifest.contains("allowed_outbound_hosts"));
}
