//! What a command prints: text for people, one JSON value for scripts (`--json`), errors in
//! both forms, and the exit code.

use std::process::ExitCode;

use clickhouse_component_host::CallError;
use serde_json::{json, Value};

/// A command's result.
pub struct Output {
    /// Text for people (printed as is).
    pub text: String,
    /// The same as JSON.
    pub json: Value,
    /// Exit code (0 unless the command passes on a child's status).
    pub code: u8,
}

impl Output {
    /// Output with exit code 0.
    pub fn new(text: impl Into<String>, json: Value) -> Self {
        Output {
            text: text.into(),
            json,
            code: 0,
        }
    }

    /// Prints and returns the exit code.
    pub fn emit(self, as_json: bool) -> ExitCode {
        if as_json {
            println!("{}", self.json);
        } else if !self.text.is_empty() {
            print!("{}", self.text);
            if !self.text.ends_with('\n') {
                println!();
            }
        }
        ExitCode::from(self.code)
    }
}

/// Prints an error (stderr, or JSON on stdout) and returns its exit code.
pub fn error(as_json: bool, error: &CallError) -> ExitCode {
    let code = u8::try_from(error.exit_code()).unwrap_or(1);
    match error {
        CallError::Component(e) => {
            if as_json {
                println!(
                    "{}",
                    json!({"ok": false, "error": {
                        "kind": e.kind.as_str(),
                        "message": e.message,
                        "server": e.server.as_ref().map(|s| json!({
                            "code": s.code, "name": s.name, "http_status": s.http_status,
                        })),
                        "committed_rows": e.committed_rows,
                    }})
                );
            } else {
                eprintln!("error ({}): {}", e.kind, e.message);
                if let Some(s) = &e.server {
                    eprintln!(
                        "  server error {} {} (HTTP {})",
                        s.code, s.name, s.http_status
                    );
                }
                if e.committed_rows > 0 {
                    eprintln!("  committed rows: {}", e.committed_rows);
                }
            }
        }
        CallError::Runner(e) => {
            if as_json {
                println!(
                    "{}",
                    json!({"ok": false, "error": {"kind": "runner", "message": format!("{e:#}")}})
                );
            } else {
                eprintln!("error (runner): {e:#}");
            }
        }
    }
    ExitCode::from(code)
}
