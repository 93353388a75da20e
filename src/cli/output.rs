//! What a command prints: text for people, one JSON value for scripts (`--json`), errors in
//! both forms, and the exit code (the error kind's).

use std::io::Write;

use serde_json::{json, Value};

use crate::client::Error;

/// A command's result.
pub struct Output {
    /// Text for people (printed as is).
    pub text: String,
    /// The same as JSON.
    pub json: Value,
    /// Exit code (0 unless the command passes on a child's status).
    pub code: i32,
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

    /// Output that is already machine-readable (NDJSON): printed as is, with or without `--json`.
    pub fn raw(text: impl Into<String>) -> Self {
        Output::new(text, Value::Null)
    }

    /// Prints and returns the exit code.
    pub fn emit(self, as_json: bool, stdout: &mut dyn Write) -> i32 {
        let _ = if as_json && !self.json.is_null() {
            writeln!(stdout, "{}", self.json)
        } else if self.text.is_empty() {
            Ok(())
        } else if self.text.ends_with('\n') {
            write!(stdout, "{}", self.text)
        } else {
            writeln!(stdout, "{}", self.text)
        };
        let _ = stdout.flush();
        self.code
    }
}

/// The JSON form of an error.
pub fn error_json(e: &Error) -> Value {
    json!({"ok": false, "error": {
        "kind": e.kind.as_str(),
        "message": e.message,
        "server": e.server.as_ref().map(|s| json!({
            "code": s.code, "name": s.name, "http_status": s.http_status,
        })),
        "committed_rows": e.committed_rows,
    }})
}

/// Prints an error (stderr, or JSON on stdout) and returns its exit code.
pub fn error(as_json: bool, e: &Error, stdout: &mut dyn Write, stderr: &mut dyn Write) -> i32 {
    if as_json {
        let _ = writeln!(stdout, "{}", error_json(e));
        let _ = stdout.flush();
    } else {
        let _ = writeln!(stderr, "error ({}): {}", e.kind, e.message);
        if let Some(s) = &e.server {
            let _ = writeln!(
                stderr,
                "  server error {} {} (HTTP {})",
                s.code, s.name, s.http_status
            );
        }
        if e.committed_rows > 0 {
            let _ = writeln!(stderr, "  committed rows: {}", e.committed_rows);
        }
        let _ = stderr.flush();
    }
    e.kind.exit_code()
}
