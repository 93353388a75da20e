//! Shared fixtures for the integration tests: one ClickHouse per test process (the server named
//! by `CLICKHOUSE_URL`, else the local ClickHouse started on a free loopback port), one
//! component runtime, and the path of the CLI binary.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use clickhouse_component::client::ConnectionOptions;
use clickhouse_component_host::{CachePolicy, ComponentSource, Runtime};

/// A ClickHouse server the tests may use.
#[derive(Clone, Debug)]
pub struct Server {
    /// `http://host:port` (no credentials).
    pub url: String,
    /// User.
    pub user: String,
    /// Password.
    pub password: String,
    /// Whether this is the local ClickHouse this process started.
    pub local: bool,
}

impl Server {
    /// Connection options with this server's credentials.
    pub fn connection(&self) -> ConnectionOptions {
        ConnectionOptions {
            url: self.url.clone(),
            user: Some(self.user.clone()),
            password: Some(self.password.clone()),
            ..Default::default()
        }
    }

    /// Puts this server's URL and credentials in a command's environment, as the CLI and
    /// clickhouse-connect read them (`CLICKHOUSE_URL`, `CLICKHOUSE_USER`, `CLICKHOUSE_PASSWORD`).
    pub fn export_to<'c>(&self, cmd: &'c mut Command) -> &'c mut Command {
        cmd.env("CLICKHOUSE_URL", &self.url)
            .env("CLICKHOUSE_USER", &self.user)
            .env("CLICKHOUSE_PASSWORD", &self.password)
    }
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The ClickHouse for this test process.
pub fn clickhouse() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| match std::env::var("CLICKHOUSE_URL") {
        Ok(url) if !url.is_empty() => Server {
            url,
            user: std::env::var("CLICKHOUSE_USER").unwrap_or_else(|_| "default".into()),
            password: std::env::var("CLICKHOUSE_PASSWORD").unwrap_or_default(),
            local: false,
        },
        _ => start_local(),
    })
}

/// Starts the local ClickHouse (tests/local_clickhouse/server.py) with a random password and
/// the Keeper named by `LOCAL_CLICKHOUSE_ZOOKEEPER` (default `start`: a private ZooKeeper, so
/// KeeperMap tables work). It exits by itself when this process ends.
fn start_local() -> Server {
    let zookeeper =
        std::env::var("LOCAL_CLICKHOUSE_ZOOKEEPER").unwrap_or_else(|_| "start".to_string());
    start_local_clickhouse(&zookeeper)
}

/// Starts another local ClickHouse for this process, with its own data directory. `zookeeper`
/// is `start` (a private ZooKeeper: KeeperMap tables work), `HOST:PORT` (that ZooKeeper) or
/// `none` (no Keeper configured: KeeperMap tables fail as on a server without one). It and its
/// ZooKeeper exit by themselves when this process ends.
pub fn start_local_clickhouse(zookeeper: &str) -> Server {
    let password = new_password();
    let data_dir = new_data_dir();
    let (child, url) = spawn_local_clickhouse(0, zookeeper, &password, &data_dir)
        .unwrap_or_else(|e| panic!("local ClickHouse did not start: {e}"));
    // The child is reaped by nobody on purpose: it watches its parent and exits with it.
    std::mem::forget(child);
    Server {
        url,
        user: "default".into(),
        password,
        local: true,
    }
}

fn new_password() -> String {
    format!("pw-{}-{}", std::process::id(), nanos())
}

fn new_data_dir() -> PathBuf {
    data_dir_in(&std::env::temp_dir())
}

fn data_dir_in(parent: &Path) -> PathBuf {
    parent.join(format!(
        "local-clickhouse-test-{}-{}",
        unique_name("data"),
        nanos()
    ))
}

/// Where [`LocalClickHouse`] keeps its (throwaway, removed on drop) data, as
/// scripts/with-clickhouse does: `LOCAL_CLICKHOUSE_TMP`, else tmpfs (`/dev/shm`) when writable
/// (a small insert costs a third of what it does on disk), else the temporary directory.
fn local_tmp_parent() -> PathBuf {
    if let Some(dir) = std::env::var_os("LOCAL_CLICKHOUSE_TMP").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir() && tempfile_probe(shm) {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

fn tempfile_probe(dir: &Path) -> bool {
    let probe = dir.join(format!(".local-clickhouse-probe-{}", unique_name("probe")));
    let ok = std::fs::write(&probe, b"").is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

/// Runs the local ClickHouse (scripts/local-clickhouse) on `port` (0: a free one) with
/// `data_dir`, exiting with this process; returns the child and the URL it printed once it listens, or why it did
/// not start (e.g. the port is taken).
fn spawn_local_clickhouse(
    port: u16,
    zookeeper: &str,
    password: &str,
    data_dir: &Path,
) -> Result<(Child, String), String> {
    // scripts/local-clickhouse: the one launcher (the Python with chdb-core, server.py, exit
    // with this process), shared with scripts/with-clickhouse.
    let launcher = repo_root().join("scripts/local-clickhouse");
    let mut child = Command::new(&launcher)
        .args(["--port", &port.to_string()])
        .args([
            "--zookeeper",
            zookeeper,
            "--password",
            password,
            "--data-dir",
        ])
        .arg(data_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", launcher.display()))?;
    let mut line = String::new();
    let read = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
    let url = line.trim().to_string();
    if read.is_err() || !url.starts_with("http://") {
        let _ = child.kill();
        let status = child.wait();
        return Err(format!(
            "it printed {url:?} instead of its URL ({read:?}; exit status {status:?})"
        ));
    }
    Ok((child, url))
}

/// A private local ClickHouse (tests/local_clickhouse/server.py) that a test can stop and start
/// again on the same port and data directory, e.g. to restart the server under a running
/// client, and then check what survived. Dropping it stops it and removes its data directory.
///
/// With `zookeeper` `start`, each start runs a new, empty private ZooKeeper (KeeperMap contents
/// do not survive a restart); with `none` or `HOST:PORT` everything the engine stores does.
pub struct LocalClickHouse {
    child: Option<Child>,
    url: String,
    port: u16,
    data_dir: PathBuf,
    zookeeper: String,
    password: String,
}

impl LocalClickHouse {
    /// Starts one on a free loopback port with a new data directory (on tmpfs when there is
    /// one, see `LOCAL_CLICKHOUSE_TMP`) and a random password.
    pub fn start(zookeeper: &str) -> Self {
        let password = new_password();
        let data_dir = data_dir_in(&local_tmp_parent());
        let (child, url) = spawn_local_clickhouse(0, zookeeper, &password, &data_dir)
            .unwrap_or_else(|e| panic!("local ClickHouse did not start: {e}"));
        let port = url
            .rsplit(':')
            .next()
            .and_then(|p| p.trim_end_matches('/').parse().ok())
            .unwrap_or_else(|| panic!("local ClickHouse printed a URL without a port: {url}"));
        LocalClickHouse {
            child: Some(child),
            url,
            port,
            data_dir,
            zookeeper: zookeeper.to_string(),
            password,
        }
    }

    /// The server (the same URL and credentials across restarts).
    pub fn server(&self) -> Server {
        Server {
            url: self.url.clone(),
            user: "default".into(),
            password: self.password.clone(),
            local: true,
        }
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Whether it is running (started and not stopped).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills it (SIGKILL: no orderly shutdown, as a crash) and waits until it has exited and
    /// its port no longer accepts connections. Does nothing if it is stopped.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = child.kill();
        let _ = child.wait();
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(200))
            .is_ok()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "port {} still accepts connections 10 s after the local ClickHouse was killed",
                self.port
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Starts it again on the same port with the same data directory and password (stopping
    /// it first if it runs). Retries for up to 15 s while the port cannot be bound (another
    /// socket may hold it for a moment); panics after that.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        loop {
            match spawn_local_clickhouse(self.port, &self.zookeeper, &self.password, &self.data_dir)
            {
                Ok((child, url)) => {
                    assert_eq!(url, self.url, "the restarted local ClickHouse moved");
                    self.child = Some(child);
                    return;
                }
                Err(e) => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "local ClickHouse did not restart on port {}: {e}",
                        self.port
                    );
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            }
        }
    }
}

impl Drop for LocalClickHouse {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// A name unique to this process and call, for databases and tables.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{prefix}_{}_{n}", std::process::id())
}

/// The component runtime, loaded once per process (precompiled copy cached under target/).
pub fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        Runtime::new(&ComponentSource::Embedded, &CachePolicy::Dir(cache_dir()))
            .expect("loading the component")
    })
}

/// A fresh component instance allowed to reach the test server.
pub async fn instance() -> clickhouse_component_host::Instance {
    instance_for(runtime(), &clickhouse().connection()).await
}

/// A fresh instance of `runtime` allowed to reach `conn`'s host (the test server, or a proxy
/// in front of it).
pub async fn instance_for(
    runtime: &Runtime,
    conn: &ConnectionOptions,
) -> clickhouse_component_host::Instance {
    runtime
        .instantiate(clickhouse_component_host::default_allow_list(conn).unwrap())
        .await
        .unwrap()
}

/// A sink's options for `table`, every other option the sink's default.
pub fn sink_options(table: &str) -> clickhouse_component_host::SinkOptions {
    clickhouse_component_host::SinkOptions {
        table: table.into(),
        columns: None,
        batch_size: None,
        settings: vec![],
        dedup: None,
        retries: None,
        compression: None,
    }
}

/// A fresh instance of `runtime` for `conn`, with a state store (default options) open in
/// database `db`; the first store opened there creates the schema.
pub async fn store_in(
    runtime: &Runtime,
    conn: &ConnectionOptions,
    db: &str,
) -> (
    clickhouse_component_host::Instance,
    clickhouse_component_host::StoreHandle,
) {
    let mut instance = instance_for(runtime, conn).await;
    let options = clickhouse_component_host::StoreOptions {
        database: Some(db.to_string()),
        ..Default::default()
    };
    let store = instance.open_store(conn, &options).await.unwrap();
    (instance, store)
}

/// The test cache directory for precompiled components.
pub fn cache_dir() -> PathBuf {
    repo_root().join("target/test-component-cache")
}

/// The `clickhouse-component` binary built with the tests.
pub fn cli_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test> -> target/<profile>/clickhouse-component
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir.join("clickhouse-component");
    assert!(
        bin.exists(),
        "{} not built: run `make test` (or `cargo build --workspace --bins` first)",
        bin.display()
    );
    bin
}

/// Runs a command with `stdin` as its standard input and waits for it.
pub fn output_with_stdin(cmd: &mut Command, stdin: &[u8]) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning the command");
    // A command may exit before it reads its input (a usage error): a closed pipe is fine.
    if let Err(e) = std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin) {
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe,
            "writing the command's stdin: {e}"
        );
    }
    child.wait_with_output().unwrap()
}

/// Starts a command through a small Python process that reports the command's own peak RSS
/// (its `ru_maxrss` as a waited child) on a last stderr line. Linux keeps a process's peak RSS
/// across fork and exec, so a command forked straight from this test process would count the
/// test's own memory (a bomb built in another test's thread, say).
const PEAK_RSS: &str = "import resource, subprocess, sys
code = subprocess.call(sys.argv[2:])
sys.stderr.write('\\n%s%d\\n' % (sys.argv[1], resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(code if code >= 0 else 128 - code)";

/// The marker of the peak RSS line (the first argument of [`PEAK_RSS`]).
const PEAK_MARK: &str = "peak-rss-kib: ";

/// `cmd`, run through [`PEAK_RSS`].
pub fn with_peak_rss(cmd: &Command) -> Command {
    let mut wrapped = Command::new("python3");
    wrapped
        .args(["-c", PEAK_RSS, PEAK_MARK])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (name, value) in cmd.get_envs() {
        match value {
            Some(value) => wrapped.env(name, value),
            None => wrapped.env_remove(name),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        wrapped.current_dir(dir);
    }
    wrapped
}

/// A [`with_peak_rss`] command's stderr without the peak line, and the peak in bytes.
pub fn split_peak_rss(stderr: &[u8]) -> (String, u64) {
    let stderr = String::from_utf8_lossy(stderr);
    let (rest, peak) = stderr
        .rsplit_once(&format!("\n{PEAK_MARK}"))
        .expect("the peak RSS line");
    let kib: u64 = peak.trim().parse().expect("a peak RSS in KiB");
    (rest.to_string(), kib * 1024)
}

/// The CLI with the server's connection in its environment (and nothing inherited that could
/// point it elsewhere).
pub fn cli(server: &Server) -> Command {
    let mut cmd = Command::new(cli_binary());
    for var in [
        "CLICKHOUSE_URL",
        "CLICKHOUSE_HOST",
        "CLICKHOUSE_PORT",
        "CLICKHOUSE_USER",
        "CLICKHOUSE_PASSWORD",
        "CLICKHOUSE_DATABASE",
        "CLICKHOUSE_ALLOW_HOSTS",
        "CLICKHOUSE_RETRIES",
        "CLICKHOUSE_COMPRESSION",
        "CLICKHOUSE_SCHEMA",
        "CLICKHOUSE_TABLE",
        "CLICKHOUSE_LOCK_TABLE",
        "CLICKHOUSE_LOCK_ENGINE",
        "CLICKHOUSE_LOCK_STALE_AFTER_SECONDS",
        "MELTANO_STATE_BACKEND_URI",
        "MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS",
        "MELTANO_STATE_BACKEND_LOCK_RETRY_SECONDS",
        "CLICKHOUSE_CALL_TIMEOUT_SECONDS",
        "CLICKHOUSE_MAX_MEMORY_MIB",
        "CLICKHOUSE_MAX_RESPONSE_MIB",
        "CLICKHOUSE_CA_FILE",
    ] {
        cmd.env_remove(var);
    }
    server
        .export_to(&mut cmd)
        .env("CLICKHOUSE_COMPONENT_CACHE_DIR", cache_dir());
    cmd
}

pub mod checker;
pub mod ensemble;
pub mod history;
pub mod native;
pub mod proxy;
pub mod serve;
pub mod values;
pub mod workload;

/// A lock engine's name on the command line (`--lock-engine`).
pub fn engine_name(engine: clickhouse_component_host::LockEngine) -> &'static str {
    use clickhouse_component_host::LockEngine;
    match engine {
        LockEngine::MergeTree => "merge-tree",
        LockEngine::KeeperMap => "keeper-map",
        LockEngine::Auto => "auto",
    }
}

/// A misbehaving HTTP server for host tests (never a stand-in for ClickHouse): on a free
/// loopback port, for each connection it reads the request head, then hands the stream to
/// `answer` on a thread of its own. Returns its URL.
pub fn raw_http_server(
    answer: impl Fn(std::net::TcpStream) + Send + Sync + Clone + 'static,
) -> String {
    raw_http_server_with_head(move |stream, _head| answer(stream))
}

/// [`raw_http_server`], handing `answer` the request head too (request line and headers). The
/// request's body (by its `Content-Length`) is read before `answer` runs, as a server does.
pub fn raw_http_server_with_head(
    answer: impl Fn(std::net::TcpStream, String) + Send + Sync + Clone + 'static,
) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let answer = answer.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut head = String::new();
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    head.push_str(&line);
                    line.clear();
                }
                let length = head
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse::<u64>().ok())?
                    })
                    .unwrap_or(0);
                let _ = std::io::copy(&mut reader.by_ref().take(length), &mut std::io::sink());
                answer(stream, head);
            });
        }
    });
    url
}

/// A server that answers every request with a 200 whose body arrives one byte every 200 ms,
/// forever (so neither a first-byte nor a between-bytes timeout ever fires). Returns its URL.
pub fn trickling_server() -> String {
    raw_http_server(|mut stream| {
        let _ = stream.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000000\r\n\r\n",
        );
        while stream.write_all(b"x").is_ok() {
            std::thread::sleep(Duration::from_millis(200));
        }
    })
}

/// A whole HTTP reply (200, `Content-Encoding: lz4`) whose LZ4 frame decodes to `decoded` zero
/// bytes (the component's own encoder), without its end mark when `cut_end_mark`: a decoding
/// bomb, or a frame cut at a block boundary.
pub fn lz4_reply(decoded: usize, cut_end_mark: bool) -> Vec<u8> {
    let mut frame = clickhouse_component::client::Compression::Lz4.encode(vec![0u8; decoded]);
    if cut_end_mark {
        frame.truncate(frame.len() - 4);
    }
    let mut reply = format!(
        "HTTP/1.1 200 OK\r\nContent-Encoding: lz4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        frame.len()
    )
    .into_bytes();
    reply.extend_from_slice(&frame);
    reply
}

/// Creates the table critical sections record into.
pub fn create_section_log(sql: &native::Sql, db: &str, table: &str) {
    sql.exec(
        "CREATE DATABASE IF NOT EXISTS {db:Identifier}",
        &[("db", db)],
    );
    sql.exec(
        "CREATE TABLE IF NOT EXISTS {db:Identifier}.{t:Identifier} (
            worker String, seq UInt32, phase Enum8('enter' = 1, 'exit' = 2),
            ts DateTime64(6) DEFAULT now64(6)
        ) ENGINE = MergeTree ORDER BY (worker, seq)",
        &[("db", db), ("t", table)],
    );
}

/// One critical section: record `enter` (server time), pause briefly, record `exit`.
pub fn record_section(sql: &native::Sql, db: &str, table: &str, worker: &str, seq: u32) {
    let insert =
        "INSERT INTO {db:Identifier}.{t:Identifier} (worker, seq, phase) FORMAT JSONEachRow";
    let params = [("db", db), ("t", table)];
    sql.insert_json(
        insert,
        &params,
        &[serde_json::json!({"worker": worker, "seq": seq, "phase": "enter"})],
    );
    std::thread::sleep(std::time::Duration::from_millis(2));
    sql.insert_json(
        insert,
        &params,
        &[serde_json::json!({"worker": worker, "seq": seq, "phase": "exit"})],
    );
}

/// Reads the recorded sections and returns (completed sections, overlapping pairs).
pub fn check_sections(sql: &native::Sql, db: &str, table: &str) -> (usize, Vec<String>) {
    let rows = sql.rows(
        "SELECT worker, seq,
                toUnixTimestamp64Micro(minIf(ts, phase = 'enter')) AS enter,
                toUnixTimestamp64Micro(maxIf(ts, phase = 'exit')) AS exit,
                countIf(phase = 'enter') AS enters, countIf(phase = 'exit') AS exits
         FROM {db:Identifier}.{t:Identifier} GROUP BY worker, seq ORDER BY enter",
        &[("db", db), ("t", table)],
    );
    let num = |v: &serde_json::Value| -> i64 {
        v.as_i64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .unwrap()
    };
    let mut complete = 0;
    let mut overlaps = Vec::new();
    let mut previous: Option<(String, i64)> = None;
    for row in &rows {
        let name = format!("{}#{}", row["worker"].as_str().unwrap(), row["seq"]);
        if num(&row["enters"]) == 1 && num(&row["exits"]) == 1 {
            complete += 1;
        }
        let (enter, exit) = (num(&row["enter"]), num(&row["exit"]));
        if let Some((prev, prev_exit)) = &previous {
            if enter <= *prev_exit {
                overlaps.push(format!(
                    "{name} entered at {enter} before {prev} exited at {prev_exit}"
                ));
            }
        }
        if previous.as_ref().is_none_or(|(_, e)| exit > *e) {
            previous = Some((name, exit));
        }
    }
    (complete, overlaps)
}
