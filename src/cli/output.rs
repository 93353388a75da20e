//! What a command prints: text for people, one JSON value for scripts (`--json`), errors in
//! both forms, and the exit code (the error kind's). Text for people goes through [`sanitize`]:
//! whatever a server sent (its version, user, time zone, exception messages, stored states)
//! cannot drive the terminal. JSON is printed exactly as serialized.

use std::borrow::Cow;
use std::io::Write;

use serde_json::{json, Value};

use crate::client::Error;

/// A command's result.
pub struct Output {
    /// Text for people (printed through [`sanitize`], unless the output is [`Output::raw`]).
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

    /// Output that is already machine-readable (NDJSON, serialized by serde_json): printed as
    /// is, with or without `--json` (it is what a `null` JSON form means).
    pub fn raw(text: impl Into<String>) -> Self {
        Output::new(text, Value::Null)
    }

    /// Prints and returns the exit code.
    pub fn emit(self, as_json: bool, stdout: &mut dyn Write) -> i32 {
        let raw = self.json.is_null();
        let text = if raw {
            Cow::Borrowed(self.text.as_str())
        } else {
            sanitize(&self.text)
        };
        let _ = if as_json && !raw {
            writeln!(stdout, "{}", self.json)
        } else if text.is_empty() {
            Ok(())
        } else if text.ends_with('\n') {
            write!(stdout, "{text}")
        } else {
            writeln!(stdout, "{text}")
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
        let _ = writeln!(stderr, "error ({}): {}", e.kind, sanitize(&e.message));
        if let Some(s) = &e.server {
            let _ = writeln!(
                stderr,
                "  server error {} {} (HTTP {})",
                s.code,
                sanitize(&s.name),
                s.http_status
            );
        }
        if e.committed_rows > 0 {
            let _ = writeln!(stderr, "  committed rows: {}", e.committed_rows);
        }
        let _ = stderr.flush();
    }
    e.kind.exit_code()
}

/// `text` made safe to print on a terminal: escape sequences removed whole (CSI `ESC [ ...`,
/// OSC `ESC ] ... BEL|ST`, DCS / SOS / PM / APC strings up to their terminator, the other `ESC`
/// sequences, and the 8-bit C1 forms of all of these), and every other control character (C0,
/// DEL, C1) dropped, except newline and tab. For text printed for people: server-provided
/// strings (version, user, time zone, exception messages, stored states) could otherwise set
/// the window title, rewrite the screen or hide what is printed.
pub fn sanitize(text: &str) -> Cow<'_, str> {
    if !text
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\n' | '\t' => out.push(c),
            '\u{1b}' => match chars.peek().copied() {
                Some('[') => {
                    chars.next();
                    skip_control_sequence(&mut chars);
                }
                Some(']' | 'P' | 'X' | '^' | '_') => {
                    chars.next();
                    skip_control_string(&mut chars);
                }
                // nF: intermediate bytes, then a final byte.
                Some('\u{20}'..='\u{2f}') => {
                    while chars
                        .next_if(|c| matches!(c, '\u{20}'..='\u{2f}'))
                        .is_some()
                    {}
                    chars.next_if(|c| matches!(c, '\u{30}'..='\u{7e}'));
                }
                // Fp, Fe, Fs: one byte.
                Some('\u{30}'..='\u{7e}') => {
                    chars.next();
                }
                _ => {}
            },
            // CSI
            '\u{9b}' => skip_control_sequence(&mut chars),
            // OSC, DCS, SOS, PM, APC
            '\u{9d}' | '\u{90}' | '\u{98}' | '\u{9e}' | '\u{9f}' => skip_control_string(&mut chars),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Skips the rest of a control sequence (after `ESC [` or CSI): parameter bytes, intermediate
/// bytes, the final byte.
fn skip_control_sequence(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    while chars
        .next_if(|c| matches!(c, '\u{30}'..='\u{3f}'))
        .is_some()
    {}
    while chars
        .next_if(|c| matches!(c, '\u{20}'..='\u{2f}'))
        .is_some()
    {}
    chars.next_if(|c| matches!(c, '\u{40}'..='\u{7e}'));
}

/// Skips the rest of a control string (after `ESC ]`, `ESC P`, ... or their C1 forms) through
/// its terminator: BEL, ST (`ESC \\` or C1 ST). Another `ESC` ends it (and starts a sequence of
/// its own); so does a newline, kept, so that an unterminated string hides one line at most.
fn skip_control_string(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    while let Some(&c) = chars.peek() {
        match c {
            '\u{07}' | '\u{9c}' => {
                chars.next();
                return;
            }
            '\u{1b}' => {
                chars.next();
                chars.next_if_eq(&'\\');
                return;
            }
            '\n' => return,
            _ => {
                chars.next();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{ErrorKind, ServerError};

    #[test]
    fn sanitize_removes_escape_sequences_and_control_characters() {
        assert_eq!(
            sanitize("\x1b]0;pwned\x07\x1b[31mred\x1b[0m\rX\u{9b}31m"),
            "redX"
        );
        // Newlines and tabs stay; other C0, DEL and C1 controls go.
        assert_eq!(sanitize("a\tb\nc\x00d\x08e\x7ff\u{85}g"), "a\tb\ncdefg");
        // OSC ended by ST, DCS, APC, C1 OSC, charset designation, a lone ESC at the end.
        assert_eq!(
            sanitize("1\x1b]8;;http://x\x1b\\2\x1bPq#0\x1b\\3\x1b_app\x1b\\4\u{9d}t\u{9c}5\x1b(B6\x1bc7\x1b"),
            "1234567"
        );
        // CSI with private parameters and intermediates; an unterminated OSC hides one line.
        assert_eq!(sanitize("\x1b[?1049h\x1b[2 qa\x1b]0;t\nb"), "a\nb");
        // Text without controls is borrowed, untouched.
        let plain = "ClickHouse 25.8 \u{e9}\u{2713}\n  user  default\n";
        assert!(matches!(sanitize(plain), Cow::Borrowed(p) if p == plain));
    }

    #[test]
    fn text_output_and_errors_are_sanitized_json_is_exact() {
        let evil = "25.8\x1b]0;pwned\x07\x1b[2J";
        let mut out = Vec::new();
        Output::new(format!("ClickHouse {evil}\n"), json!({"version": evil})).emit(false, &mut out);
        assert_eq!(String::from_utf8(out).unwrap(), "ClickHouse 25.8\n");
        let mut out = Vec::new();
        Output::new(format!("ClickHouse {evil}\n"), json!({"version": evil})).emit(true, &mut out);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["version"], evil);
        // Raw (NDJSON) output is printed as serialized.
        let line = format!("{}\n", json!({"id": "a\u{9b}31m"}));
        let mut out = Vec::new();
        Output::raw(line.clone()).emit(false, &mut out);
        assert_eq!(String::from_utf8(out).unwrap(), line);

        let mut e = Error::new(
            ErrorKind::Permanent,
            "Code: 60. \x1b[31mUnknown\x1b[0m table\r",
        );
        e.server = Some(ServerError {
            code: 60,
            name: "UNKNOWN\x1b]0;x\x07_TABLE".into(),
            http_status: 404,
        });
        let (mut out, mut err) = (Vec::new(), Vec::new());
        error(false, &e, &mut out, &mut err);
        assert_eq!(
            String::from_utf8(err).unwrap(),
            "error (permanent): Code: 60. Unknown table\n  server error 60 UNKNOWN_TABLE (HTTP 404)\n"
        );
        let (mut out, mut err) = (Vec::new(), Vec::new());
        error(true, &e, &mut out, &mut err);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["error"]["message"], e.message);
    }
}
