//! Secrets: which settings hold one, and the [`Redactor`] that keeps them (and the password)
//! out of every message.

use std::fmt;

use super::error::{cap, Error, ErrorKind};

/// Whether a setting's value is treated as a secret (never logged, redacted from messages).
pub fn is_secret_setting(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["password", "secret", "key", "token", "credential"]
        .iter()
        .any(|word| name.contains(word))
}

/// Removes secrets (password, secret settings) from messages and caps their length.
#[derive(Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}

impl Redactor {
    /// A redactor for these secret values (empty values are ignored). Each secret is also
    /// redacted in its percent-encoded forms, as it may appear in a URL.
    pub fn new<I, S>(secrets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut all: Vec<String> = Vec::new();
        for secret in secrets.into_iter().map(Into::into) {
            if secret.is_empty() {
                continue;
            }
            let encoded = crate::client::url::encode_component(&secret);
            let form_encoded = encoded.replace("%20", "+");
            for s in [secret, encoded, form_encoded] {
                if !all.contains(&s) {
                    all.push(s);
                }
            }
        }
        // Longest first, so a secret that contains another is removed whole.
        all.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Redactor { secrets: all }
    }

    /// The text with every secret replaced by `***`, capped at [`MAX_MESSAGE_CHARS`].
    pub fn redact(&self, text: &str) -> String {
        cap(self.redact_whole(text))
    }

    /// The text with every secret replaced by `***`, whatever its length (a log line).
    pub fn redact_whole(&self, text: &str) -> String {
        let mut out = text.to_string();
        for secret in &self.secrets {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), "***");
            }
        }
        out
    }

    /// A new error with a redacted message.
    pub fn error(&self, kind: ErrorKind, message: &str) -> Error {
        Error::new(kind, self.redact(message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::ErrorKind::Misconfigured;

    #[test]
    fn redaction_removes_plain_and_encoded_secrets() {
        let r = Redactor::new(["p@ss word/1", "", "tok3n"]);
        let msg =
            "auth failed for p@ss word/1 at http://u:p%40ss%20word%2F1@h/?x=p%40ss+word%2F1 tok3n";
        let out = r.redact(msg);
        assert!(!out.contains("p@ss word/1"), "{out}");
        assert!(!out.contains("p%40ss"), "{out}");
        assert!(!out.contains("tok3n"), "{out}");
        assert_eq!(out.matches("***").count(), 4, "{out}");
    }

    #[test]
    fn redaction_prefers_the_longest_secret() {
        let r = Redactor::new(["abc", "abcdef"]);
        assert_eq!(r.redact("x abcdef y abc"), "x *** y ***");
    }

    #[test]
    fn redacted_error_carries_kind_and_no_secret() {
        let r = Redactor::new(["hunter2"]);
        let e = r.error(Misconfigured, "password hunter2 rejected");
        assert_eq!(e.kind, Misconfigured);
        assert_eq!(e.message, "password *** rejected");
        assert_eq!(e.to_string(), "misconfigured: password *** rejected");
    }

    #[test]
    fn secret_settings_are_recognised_by_name() {
        for name in [
            "password",
            "s3_secret_access_key",
            "Token",
            "api_KEY",
            "credentials",
        ] {
            assert!(is_secret_setting(name), "{name}");
        }
        for name in ["max_threads", "database", "async_insert"] {
            assert!(!is_secret_setting(name), "{name}");
        }
    }
}
