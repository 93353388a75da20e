//! The composed example (examples/state-service plugged with the library component by
//! `wac plug`, scripts/compose) under the stock `wasmtime serve`: building it, starting the
//! server on a loopback port, and plain HTTP calls to it. Used by tests/tests/composition.rs
//! (and the wasmtime CLI for tests/tests/runtimes.rs) and the bench's `serve` section.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{repo_root, Server};

/// The files scripts/compose makes.
pub struct Composed {
    /// The example consumer before composition (imports `clickhouse:connector/...`).
    pub consumer: PathBuf,
    /// The composed component (imports only WASI).
    pub composed: PathBuf,
    /// The WIT package as a binary WIT package.
    pub wit_package: PathBuf,
}

/// Runs scripts/compose once per process (what `make compose` runs) with the library component
/// the host's build made, and returns its files. Panics with the script's output if it fails
/// (wac and wasm-tools missing: `make compose` or `make test` installs them).
pub fn composed() -> &'static Composed {
    static COMPOSED: OnceLock<Composed> = OnceLock::new();
    COMPOSED.get_or_init(|| {
        let library = clickhouse_component_host::LIBRARY_COMPONENT_PATH
            .expect("the host was built with a prebuilt component: no library component");
        let out = Command::new(repo_root().join("scripts/compose"))
            .env("COMPOSE_LIBRARY", library)
            .output()
            .expect("running scripts/compose");
        assert!(
            out.status.success(),
            "scripts/compose failed (wac and wasm-tools: `make compose` installs them)\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let dir = PathBuf::from(library).parent().unwrap().to_path_buf();
        Composed {
            consumer: dir.join("wasm32-wasip2/release/clickhouse_state_service.wasm"),
            composed: dir.join("state_service_composed.wasm"),
            wit_package: dir.join("clickhouse-connector.wasm"),
        }
    })
}

/// The wasmtime version the host embeds, from the workspace's Cargo.toml (its one place): the
/// stock CLI of the same version is what `make test` installs.
pub fn wasmtime_version() -> &'static str {
    include_str!("../../Cargo.toml")
        .lines()
        .find_map(|l| l.strip_prefix("wasmtime = { version = \"="))
        .and_then(|rest| rest.split('"').next())
        .expect("the workspace's Cargo.toml pins wasmtime = { version = \"=X.Y.Z\" ... }")
}

/// The wasmtime CLI the test command installed (`cargo install wasmtime-cli@VERSION --locked`),
/// the first on PATH, checked to be that version.
pub fn wasmtime_cli() -> PathBuf {
    let want = wasmtime_version();
    let path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("wasmtime"))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("no wasmtime on PATH: `make test` installs wasmtime-cli {want}"));
    let version = Command::new(&path).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(
        version.trim() == format!("wasmtime {want}")
            || version.contains(&format!("wasmtime {want} ")),
        "need wasmtime {want}, found {version}"
    );
    path
}

/// `wasm-tools component wit FILE`: the WIT text of a component or a binary WIT package.
pub fn component_wit(file: &std::path::Path) -> String {
    let out = Command::new("wasm-tools")
        .args(["component", "wit"])
        .arg(file)
        .output()
        .expect("running wasm-tools (`make compose` installs it)");
    assert!(
        out.status.success(),
        "wasm-tools component wit {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The interfaces a component's world imports (`import NAME;` lines of its WIT), and its exports.
pub fn world_items(wit: &str, keyword: &str) -> Vec<String> {
    let prefix = format!("{keyword} ");
    wit.lines()
        .map(str::trim)
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|l| l.trim_end_matches(';').trim().to_string())
        .collect()
}

/// One `wasmtime serve` of the composed component, on a free loopback port; killed on drop.
pub struct Serve {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    stderr: Arc<Mutex<String>>,
    agent: ureq::Agent,
}

impl Serve {
    /// `wasmtime serve -S cli --addr 127.0.0.1:0 [ARGS] composed.wasm` with the server's URL
    /// and user in `--env NAME=VALUE`, the password inherited (`--env CLICKHOUSE_PASSWORD`:
    /// not on the command line), and `env` added (`None` leaves a variable out).
    pub fn start(server: &Server, env: &[(&str, Option<&str>)], args: &[&str]) -> Serve {
        let composed = &composed().composed;
        let mut cmd = Command::new(wasmtime_cli());
        // -S cli: all of WASI p2 besides the proxy world (the example reads its configuration
        // from wasi:cli/environment). Outgoing HTTP is always on under `serve`.
        cmd.args(["serve", "-S", "cli", "--addr", "127.0.0.1:0"]);
        let mut vars: Vec<(String, Option<String>)> = vec![
            ("CLICKHOUSE_URL".into(), Some(server.url.clone())),
            ("CLICKHOUSE_USER".into(), Some(server.user.clone())),
        ];
        for (k, v) in env {
            vars.retain(|(name, _)| name != k);
            vars.push((k.to_string(), v.map(str::to_string)));
        }
        for (k, v) in &vars {
            if let Some(v) = v {
                cmd.arg("--env").arg(format!("{k}={v}"));
            }
        }
        cmd.args(["--env", "CLICKHOUSE_PASSWORD"])
            .env("CLICKHOUSE_PASSWORD", &server.password);
        cmd.args(args).arg(composed);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("starting wasmtime serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = BufReader::new(child.stderr.take().unwrap());
        let log = stderr.clone();
        std::thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("Serving HTTP on ") {
                    let _ = tx.send(rest.trim_end_matches('/').to_string());
                }
                let mut log = log.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("wasmtime serve did not start: {}", stderr.lock().unwrap());
            }
        };
        Serve {
            child,
            url,
            stderr,
            agent: ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(120))
                .build(),
        }
    }

    /// What `wasmtime serve` wrote to its stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// `METHOD path` with `body`: the status and the body as JSON (`Value::String` with the
    /// text if it is not JSON). A connection failure is status 0.
    pub fn call(&self, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
        let (status, text) = self.call_raw(method, path, body);
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    /// As [`Serve::call`], with the body as text, and the time the call took.
    pub fn call_raw(&self, method: &str, path: &str, body: &[u8]) -> (u16, String) {
        let request = self.agent.request(method, &format!("{}{path}", self.url));
        let result = if body.is_empty() && method == "GET" {
            request.call()
        } else {
            request.send_bytes(body)
        };
        match result {
            Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
            Err(e) => (0, e.to_string()),
        }
    }

    /// A [`Serve::call`] that must answer 200.
    pub fn ok(&self, method: &str, path: &str, body: &[u8]) -> Value {
        let (status, value) = self.call(method, path, body);
        assert_eq!(
            status,
            200,
            "{method} {path}: {value}\nwasmtime serve: {}",
            self.stderr()
        );
        value
    }

    /// Times `n` calls in a row: the durations.
    pub fn timed(&self, method: &str, path: &str, n: usize) -> Vec<Duration> {
        (0..n)
            .map(|_| {
                let t = Instant::now();
                let (status, text) = self.call_raw(method, path, b"");
                assert_eq!(status, 200, "{method} {path}: {text}");
                t.elapsed()
            })
            .collect()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
