//! The reference host's own command line: the FILE of `sink` found by its position (not by its
//! text), the warning for a password given as an argument, and the environment of a command
//! run under `lock ID -- COMMAND` (no credentials unless `--pass-credentials`).

use std::path::{Path, PathBuf};

use clickhouse_component_tests::native::Sql;
use std::process::{Command, Stdio};

use clickhouse_component_tests::{cache_dir, cli, cli_binary, clickhouse, unique_name, Server};

/// The start of the warning for a password on the command line.
const WARNING: &str = "warning: a password given on the command line";

/// A fresh directory for this test.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique_name(name));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The server's URL with its user and password in it.
fn url_with_password(server: &Server) -> String {
    let (scheme, rest) = server.url.split_once("://").unwrap();
    format!("{scheme}://{}:{}@{rest}", server.user, server.password)
}

#[test]
fn sink_finds_its_file_by_position_not_by_name() {
    let server = clickhouse();
    let sql = Sql::new(&server.connection());
    let db = unique_name("host_cli_sink");
    sql.exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    sql.exec(
        "CREATE TABLE {db:Identifier}.data (n UInt32) ENGINE = MergeTree ORDER BY n",
        &[("db", &db)],
    );
    // A file named like the table, in the working directory.
    let dir = temp_dir("host_cli_sink");
    std::fs::write(dir.join("data"), "{\"n\":1}\n{\"n\":2}\n{\"n\":3}\n").unwrap();
    let out = cli(server)
        .env("CLICKHOUSE_DATABASE", &db)
        .current_dir(&dir)
        .args(["--json", "sink", "data", "--table", "data"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}: {stdout} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let receipt: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (receipt["table"].as_str(), receipt["rows"].as_u64()),
        (Some("data"), Some(3))
    );
    // The component reads the file's directory under the name the argument uses; a path
    // through '..' (which the guest would resolve against its own root) is refused.
    let sub = dir.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    let out = cli(server)
        .env("CLICKHOUSE_DATABASE", &db)
        .current_dir(&sub)
        .args(["sink", "--table", "data", "../data"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("'..'"), "{stderr}");
    assert_eq!(
        sql.count("SELECT sum(n) FROM {db:Identifier}.data", &[("db", &db)]),
        6
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_password_in_the_arguments_gets_a_warning_not_one_in_the_environment() {
    let server = clickhouse();
    let password = if server.password.is_empty() {
        "not-the-password".to_string()
    } else {
        server.password.clone()
    };
    let stderr = |cmd: &mut std::process::Command| {
        String::from_utf8_lossy(&cmd.output().unwrap().stderr).into_owned()
    };

    let err = stderr(cli(server).args(["--password", &password, "check"]));
    assert_eq!(err.matches(WARNING).count(), 1, "{err}");
    assert!(err.contains("CLICKHOUSE_PASSWORD"), "{err}");
    assert!(!err.contains(&password), "the password is shown: {err}");

    let err = stderr(cli(server).env_remove("CLICKHOUSE_PASSWORD").args([
        "check",
        "--url",
        &url_with_password(server),
    ]));
    assert_eq!(err.matches(WARNING).count(), 1, "{err}");
    assert!(!err.contains(&password), "the password is shown: {err}");

    // The same credentials in the environment: no warning.
    let err = stderr(
        cli(server)
            .env("CLICKHOUSE_PASSWORD", &password)
            .arg("check"),
    );
    assert!(!err.contains(WARNING), "{err}");
    let err = stderr(
        cli(server)
            .env_remove("CLICKHOUSE_PASSWORD")
            .env("CLICKHOUSE_URL", url_with_password(server))
            .arg("check"),
    );
    assert!(!err.contains(WARNING), "{err}");
}

/// Runs `lock [extra] ID -- sh -c 'env > FILE'` and returns the command's environment lines.
fn env_under_lock(cmd: &mut std::process::Command, extra: &[&str], file: &Path) -> Vec<String> {
    let db = unique_name("host_cli_lock");
    let out = cmd
        .args(["lock", "--state-database", &db])
        .args(extra)
        .args(["job", "--", "sh", "-c", "env > \"$0\""])
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let env = std::fs::read_to_string(file).unwrap();
    let _ = std::fs::remove_file(file);
    env.lines().map(str::to_string).collect()
}

fn var<'a>(env: &'a [String], name: &str) -> Option<&'a str> {
    env.iter()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix('='))
}

#[test]
fn a_command_under_lock_gets_no_credentials_unless_asked() {
    let server = clickhouse();
    let dir = temp_dir("host_cli_env");
    let file = dir.join("env");

    // CLICKHOUSE_PASSWORD: left out; the lock's id and token are there.
    let env = env_under_lock(&mut cli(server), &[], &file);
    assert_eq!(var(&env, "CLICKHOUSE_PASSWORD"), None, "{env:#?}");
    assert_eq!(var(&env, "CLICKHOUSE_LOCK_ID"), Some("job"));
    assert!(var(&env, "CLICKHOUSE_LOCK_TOKEN").is_some_and(|t| !t.is_empty()));
    assert_eq!(var(&env, "CLICKHOUSE_URL"), Some(server.url.as_str()));
    let env = env_under_lock(&mut cli(server), &["--pass-credentials"], &file);
    assert_eq!(
        var(&env, "CLICKHOUSE_PASSWORD"),
        Some(server.password.as_str())
    );

    // Connection strings with a password: the password is left out of them.
    let with_password = url_with_password(server);
    let without_password = {
        let (scheme, rest) = server.url.split_once("://").unwrap();
        format!("{scheme}://{}@{rest}", server.user)
    };
    let in_urls = || {
        let mut cmd = cli(server);
        cmd.env_remove("CLICKHOUSE_PASSWORD")
            .env("CLICKHOUSE_URL", &with_password)
            .env("MELTANO_STATE_BACKEND_URI", &with_password);
        cmd
    };
    let env = env_under_lock(&mut in_urls(), &[], &file);
    assert_eq!(var(&env, "CLICKHOUSE_URL"), Some(without_password.as_str()));
    assert_eq!(
        var(&env, "MELTANO_STATE_BACKEND_URI"),
        Some(without_password.as_str())
    );
    if !server.password.is_empty() {
        assert!(
            !env.iter().any(|line| line.contains(&server.password)),
            "{env:#?}"
        );
    }
    let env = env_under_lock(&mut in_urls(), &["--pass-credentials"], &file);
    assert_eq!(var(&env, "CLICKHOUSE_URL"), Some(with_password.as_str()));
    assert_eq!(
        var(&env, "MELTANO_STATE_BACKEND_URI"),
        Some(with_password.as_str())
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn with_pass_credentials_the_cli_under_lock_writes_through_the_held_lock() {
    let server = clickhouse();
    let db = unique_name("host_cli_held");
    let bin = clickhouse_component_tests::cli_binary();
    let script = format!(
        "'{}' state --state-database '{db}' --lock-timeout-seconds 1 merge --no-validate job '{{\"a\":1}}'",
        bin.display()
    );
    let under_lock = |extra: &[&str]| {
        cli(server)
            .args([
                "lock",
                "--state-database",
                &db,
                "--lock-timeout-seconds",
                "1",
            ])
            .args(extra)
            .args(["job", "--", "sh", "-c", &script])
            .output()
            .unwrap()
    };
    if !server.password.is_empty() {
        // Without the credentials the command cannot connect.
        let out = under_lock(&[]);
        assert!(!out.status.success());
    }
    let out = under_lock(&["--pass-credentials"]);
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(server)
        .args(["--json", "state", "--state-database", &db, "get", "job"])
        .output()
        .unwrap();
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["partial"], serde_json::json!({"a": 1}), "{got}");
}

/// A server that answers every request with `status` and `body` (and ClickHouse's exception
/// code header for an error); returns its URL.
fn fake_server(status: u16, body: &'static str) -> String {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let mut reader = BufReader::new(stream);
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some((name, value)) = line.split_once(':') {
                    if name.eq_ignore_ascii_case("content-length") {
                        length = value.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut request_body = vec![0; length];
            let _ = reader.read_exact(&mut request_body);
            let code = if status == 200 {
                String::new()
            } else {
                "X-ClickHouse-Exception-Code: 60\r\n".to_string()
            };
            let reply = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: text/plain\r\n{code}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = reader.get_mut().write_all(reply.as_bytes());
        }
    });
    url
}

/// The fake server as the CLI's connection.
fn fake(url: &str) -> Server {
    Server {
        url: url.to_string(),
        user: "default".into(),
        password: String::new(),
        local: false,
    }
}

#[test]
fn server_text_cannot_drive_the_terminal() {
    let url = fake_server(
        200,
        r#"{"version":"25.8\u001b]0;pwned\u0007\u001b[31m","timezone":"UTC\u001b[2J","user":"me\r\u009b31m","database":"db"}"#,
    );
    let run = |args: &[&str]| cli(&fake(&url)).args(args).output().unwrap();
    let out = run(&["check"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.starts_with("ClickHouse 25.8 at "), "{stdout:?}");
    assert!(stdout.contains("user        me\n"), "{stdout:?}");
    assert!(stdout.contains("timezone    UTC\n"), "{stdout:?}");
    assert!(
        !stdout.contains(|c: char| c.is_control() && c != '\n'),
        "{stdout:?}"
    );
    // JSON keeps the server's strings exactly.
    let out = run(&["--json", "check"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["version"], "25.8\u{1b}]0;pwned\u{7}\u{1b}[31m");
    assert_eq!(v["user"], "me\r\u{9b}31m");

    // An exception message.
    let url = fake_server(
        404,
        "Code: 60. DB::Exception: Table \u{1b}]0;pwned\u{7}\u{1b}[8mx does not exist. (UNKNOWN_TABLE)",
    );
    let out = cli(&fake(&url)).arg("check").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("Table x does not exist"), "{stderr:?}");
    assert!(
        !stderr.contains(|c: char| c.is_control() && c != '\n'),
        "{stderr:?}"
    );
}

/// Runs `state --state-database DB ARGS` with `stdin`; (exit code, stdout, stderr).
fn state(
    server: &Server,
    db: &str,
    args: &[&str],
    env: &[(&str, &str)],
    stdin: &str,
) -> (i32, String, String) {
    use std::io::Write;
    let mut cmd = cli(server);
    cmd.args(["state", "--state-database", db])
        .args(args)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn input_file_is_read_by_the_component_and_set_asks_first() {
    let server = clickhouse();
    let db = unique_name("host_cli_input_file");
    let dir = temp_dir("host_cli_input_file");
    let file = dir.join("state.json");
    std::fs::write(&file, r#"{"singer_state":{"a":1}}"#).unwrap();
    let file = file.to_str().unwrap();
    // set without --force: the component asks on stdin (it reads the file itself); "n" stops.
    let (code, _, err) = state(server, &db, &["set", "--input-file", file, "x"], &[], "n\n");
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("This will overwrite the state's current value. Continue? [y/N]: "),
        "{err}"
    );
    assert_eq!(state(server, &db, &["get", "x"], &[], "").1, "{}\n");
    // "y" goes on; the file, not the answer, is the state.
    let (code, _, err) = state(server, &db, &["set", "--input-file", file, "x"], &[], "y\n");
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        state(server, &db, &["get", "x"], &[], "").1,
        "{\"singer_state\":{\"a\":1}}\n"
    );
    // merge (inline form), and set --force: no question.
    std::fs::write(dir.join("b.json"), r#"{"singer_state":{"b":2}}"#).unwrap();
    let b = format!("--input-file={}", dir.join("b.json").display());
    let (code, _, err) = state(server, &db, &["merge", &b, "x"], &[], "");
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        state(server, &db, &["get", "x"], &[], "").1,
        "{\"singer_state\":{\"a\":1,\"b\":2}}\n"
    );
    // A file named like the id: the option's value is the file, the positional the id.
    std::fs::write(dir.join("x"), r#"{"singer_state":{"c":3}}"#).unwrap();
    let out = cli(server)
        .current_dir(&dir)
        .args([
            "state",
            "--state-database",
            &db,
            "set",
            "--force",
            "x",
            "--input-file",
            "x",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        state(server, &db, &["get", "x"], &[], "").1,
        "{\"singer_state\":{\"c\":3}}\n"
    );
    // A missing file: a clear error, nothing written.
    let (code, _, err) = state(
        server,
        &db,
        &["set", "--force", "--input-file", "/nonexistent/f.json", "y"],
        &[],
        "",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot open /nonexistent/f.json"), "{err}");
}

#[test]
fn edit_runs_the_editor_and_writes_only_a_changed_valid_state() {
    let server = clickhouse();
    let db = unique_name("host_cli_edit");
    let dir = temp_dir("host_cli_edit");
    let (code, _, err) = state(
        server,
        &db,
        &["set", "--force", "x", r#"{"singer_state":{"a":1}}"#],
        &[],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let get = |id: &str| state(server, &db, &["get", id], &[], "").1;
    // The editor sees Meltano's pretty text (with a final newline) and writes a new state.
    let editor = dir.join("editor.sh");
    std::fs::write(
        &editor,
        format!(
            "#!/bin/sh\ncp \"$1\" {seen}\nprintf '%s' \"$NEW\" > \"$1\"\n",
            seen = dir.join("seen.json").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &editor,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
    )
    .unwrap();
    let editor = editor.to_str().unwrap();
    let with = |new: &'static str| vec![("EDITOR", editor), ("NEW", new)];
    let (code, _, err) = state(
        server,
        &db,
        &["edit", "--force", "x"],
        &with(r#"{"singer_state":{"a":2}}"#),
        "",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.join("seen.json")).unwrap(),
        "{\n  \"singer_state\": {\n    \"a\": 1\n  }\n}\n"
    );
    assert_eq!(get("x"), "{\"singer_state\":{\"a\":2}}\n");
    // Declined: nothing runs.
    let (code, _, err) = state(
        server,
        &db,
        &["edit", "x"],
        &with(r#"{"singer_state":{"a":3}}"#),
        "n\n",
    );
    assert_eq!(code, 1, "{err}");
    assert_eq!(get("x"), "{\"singer_state\":{\"a\":2}}\n");
    // Not saved, empty, the same JSON, an editor that fails: exit 0/0/0/1, nothing written.
    for (env_editor, new, code_wanted, says) in [
        ("true", "", 0, "Edit cancelled - no changes made"),
        (
            editor,
            "  \n",
            0,
            "Empty content provided - no changes made",
        ),
        (
            editor,
            r#"{ "singer_state" : { "a" : 2 } }"#,
            0,
            "No changes detected",
        ),
        ("false", "", 1, "false: Editing failed"),
    ] {
        let (code, _, err) = state(
            server,
            &db,
            &["edit", "--force", "x"],
            &[("EDITOR", env_editor), ("NEW", new)],
            "",
        );
        assert_eq!(
            (code, err.contains(says)),
            (code_wanted, true),
            "{env_editor} {new:?}: {err}"
        );
        assert_eq!(get("x"), "{\"singer_state\":{\"a\":2}}\n");
    }
    // Invalid JSON and a state without singer_state are refused by set (exit 1, Meltano's).
    // The edit is not lost: the file stays, and the message says where.
    for new in ["{not json", r#"{"a":1}"#] {
        let (code, _, err) = state(server, &db, &["edit", "--yes", "x"], &with(new), "");
        assert_eq!(code, 1, "{new}: {err}");
        assert_eq!(get("x"), "{\"singer_state\":{\"a\":2}}\n");
        let kept = err
            .lines()
            .find_map(|l| l.strip_prefix("the edited state is kept in "))
            .unwrap_or_else(|| panic!("{err}"));
        assert_eq!(std::fs::read_to_string(kept).unwrap(), new);
        std::fs::remove_dir_all(std::path::Path::new(kept).parent().unwrap()).unwrap();
    }
    // With --json a failure is the component's error object; nothing runs the editor.
    let (code, out, err) = state(
        server,
        &db,
        &["--json", "edit", "--force", ""],
        &with("{}"),
        "",
    );
    assert_eq!(code, 2, "{err}");
    let answer: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(answer["error"]["kind"], "invalid-input", "{out}");
    // An id `set` would refuse (a control character) is refused before the editor runs.
    std::fs::remove_file(dir.join("seen.json")).unwrap();
    let (code, out, err) = state(
        server,
        &db,
        &["edit", "--force", "esc\u{1b}[2J"],
        &with(r#"{"singer_state":{}}"#),
        "",
    );
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (2, "", "error (invalid-input): state id contains the control character U+001B at byte 3; ids are job names and may not hold control characters\n")
    );
    assert!(!dir.join("seen.json").exists(), "the editor ran");
    // A missing id starts from {}; --json prints the set's result.
    let (code, out, err) = state(
        server,
        &db,
        &["--json", "edit", "--force", "new"],
        &with(r#"{"singer_state":{}}"#),
        "",
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"ok\":true"), "{out}");
    assert_eq!(
        std::fs::read_to_string(dir.join("seen.json")).unwrap(),
        "{}\n"
    );
    assert_eq!(get("new"), "{\"singer_state\":{}}\n");
}

/// `make run`'s quick start runs to the end with standard input closed (no terminal to answer a
/// prompt): every command of it that would ask passes `--force` / `--yes`.
#[test]
fn quick_start_runs_unattended() {
    let server = clickhouse();
    let mut cmd = Command::new("bash");
    server
        .export_to(&mut cmd)
        .arg(clickhouse_component_tests::repo_root().join("scripts/quickstart"))
        .env("CLICKHOUSE_COMPONENT_CLI", cli_binary())
        .env("CLICKHOUSE_COMPONENT_CACHE_DIR", cache_dir())
        .stdin(Stdio::null());
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{:?}\n{stdout}\n{stderr}", out.status);
    assert!(!stderr.contains("Aborted"), "{stderr}");
    for expected in [
        "running under the lock",
        "tap-gitlab--target-jsonl",
        "sent 10001 rows in 11 chunks",
        "(exit code 2: refused before anything was sent, naming its row and column)",
    ] {
        assert!(
            stdout.contains(expected),
            "{expected:?} missing:\n{stdout}\n{stderr}"
        );
    }
    // The bad row's refusal names it, its column and its type.
    assert!(
        stderr.contains("line 1, column 'occurred_at': \"yesterday\" is not a date and time")
            && stderr.contains("DateTime64(3)"),
        "{stderr}"
    );
}
