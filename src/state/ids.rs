//! State ids: the checks an id passes (any readable id; no control characters in one a write
//! creates) and the form ids are printed in (listings, messages), escaped and unambiguous.
//! Uses no other module of the store.

use crate::client::Error;

/// Longest accepted state id, in bytes.
pub const MAX_ID_BYTES: usize = 1024;

/// Checks a state id that is read, listed, locked for a delete or deleted: non-empty UTF-8,
/// at most [`MAX_ID_BYTES`] bytes. Any character passes, so that an id Meltano or another
/// backend wrote (with control characters in it) stays readable and deletable; a write that
/// creates or overwrites an id checks it with [`check_new_id`].
pub fn check_id(id: &str) -> Result<(), Error> {
    if id.is_empty() {
        return Err(Error::invalid("state id must not be empty"));
    }
    if id.len() > MAX_ID_BYTES {
        return Err(Error::invalid(format!(
            "state id is {} bytes; the limit is {MAX_ID_BYTES}",
            id.len()
        )));
    }
    Ok(())
}

/// Checks an id that a write creates or overwrites (set, update, set-all, the destination of a
/// copy, an import, a lock): as [`check_id`], and without control characters (Unicode Cc: C0,
/// DEL, C1), which ids, being job names, never need and which would reach a terminal or split
/// a listing. The message names the character by code point, never printing the id raw.
pub fn check_new_id(id: &str) -> Result<(), Error> {
    check_id(id)?;
    match id.char_indices().find(|(_, c)| c.is_control()) {
        Some((at, c)) => Err(Error::invalid(format!(
            "state id contains the control character U+{:04X} at byte {at}; ids are job names and may not hold control characters",
            u32::from(c)
        ))),
        None => Ok(()),
    }
}

/// An id as text for people (listings, messages): a control character (Unicode Cc) escaped
/// visibly (`\t`, `\n`, `\r`; `\x1b`-style for the other C0 ones and DEL; `\u{85}`-style
/// for C1) and a backslash doubled, so the form is unambiguous (two ids never print the same)
/// and nothing in it drives a terminal. Every other character is kept; an id without
/// backslashes or control characters prints as it is. JSON output keeps the exact id.
pub fn escape_id(id: &str) -> std::borrow::Cow<'_, str> {
    use std::fmt::Write;
    if !id.chars().any(|c| c == '\\' || c.is_control()) {
        return std::borrow::Cow::Borrowed(id);
    }
    let mut out = String::with_capacity(id.len() + 8);
    for c in id.chars() {
        let _ = match c {
            '\\' => out.write_str("\\\\"),
            '\t' => out.write_str("\\t"),
            '\n' => out.write_str("\\n"),
            '\r' => out.write_str("\\r"),
            '\u{0}'..='\u{7f}' if c.is_control() => write!(out, "\\x{:02x}", u32::from(c)),
            c if c.is_control() => write!(out, "\\u{{{:x}}}", u32::from(c)),
            c => out.write_char(c),
        };
    }
    std::borrow::Cow::Owned(out)
}

/// An id short enough for a message, escaped as ids are printed ([`escape_id`]).
pub(crate) fn shorten(id: &str) -> String {
    let s: String = id.chars().take(100).collect();
    let mut s = escape_id(&s).into_owned();
    if id.chars().nth(100).is_some() {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::ErrorKind;

    #[test]
    fn ids_are_checked() {
        assert!(check_id("x").is_ok());
        assert!(check_id("with\nnewline 'quotes' `ticks` ünï").is_ok());
        assert_eq!(check_id("").unwrap_err().kind, ErrorKind::InvalidInput);
        assert!(check_id(&"x".repeat(MAX_ID_BYTES)).is_ok());
        assert!(check_id(&"x".repeat(MAX_ID_BYTES + 1))
            .unwrap_err()
            .message
            .contains("limit"));
    }

    #[test]
    fn new_ids_hold_no_control_characters() {
        for (id, named) in [
            ("esc\x1b[31mRED", "U+001B at byte 3"),
            ("nul\0", "U+0000 at byte 3"),
            ("bel\x07", "U+0007 at byte 3"),
            ("id\nnl", "U+000A at byte 2"),
            ("tab\there", "U+0009 at byte 3"),
            ("del\x7f", "U+007F at byte 3"),
            ("é\u{85}", "U+0085 at byte 2"),
            ("\u{9b}31m", "U+009B at byte 0"),
        ] {
            // Still an id to read, list and delete (another backend may have written it)...
            assert!(check_id(id).is_ok(), "{id:?}");
            // ... but not one to write.
            let e = check_new_id(id).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidInput);
            assert_eq!(
                e.message,
                format!("state id contains the control character {named}; ids are job names and may not hold control characters")
            );
        }
        for id in [
            "dev:tap-a-to-target-b",
            "it's \"quoted\"",
            "back\\slash",
            "ünï 🎉 日本",
            "e\u{301}",
            "\u{2028}sep",
            " spaced ",
        ] {
            assert!(check_new_id(id).is_ok(), "{id:?}");
        }
        assert_eq!(check_new_id("").unwrap_err().kind, ErrorKind::InvalidInput);
        assert!(check_new_id(&"x".repeat(MAX_ID_BYTES + 1))
            .unwrap_err()
            .message
            .contains("limit"));
    }

    #[test]
    fn ids_print_escaped_and_unambiguously() {
        let plain = "dev:tap-a ünï 🎉 it's \"q\" \u{2028}";
        assert!(matches!(escape_id(plain), std::borrow::Cow::Borrowed(p) if p == plain));
        for (id, shown) in [
            ("esc\x1b[31mRED", "esc\\x1b[31mRED"),
            ("id\nnl", "id\\nnl"),
            ("a\tb\rc\0d\x07e\x7f", "a\\tb\\rc\\x00d\\x07e\\x7f"),
            ("c1\u{85}\u{9b}\u{9f}", "c1\\u{85}\\u{9b}\\u{9f}"),
            ("back\\slash", "back\\\\slash"),
        ] {
            assert_eq!(escape_id(id), shown);
        }
        // Two ids never print the same: every id of up to 4 characters from an alphabet of
        // controls and of what their escapes are spelled with.
        let alphabet = [
            'a', '\\', 'x', '1', 'b', 'n', 'u', '{', '8', '5', '}', '\x1b', '\n', '\u{85}',
        ];
        let mut ids = vec![String::new()];
        for _ in 0..4 {
            let longer: Vec<String> = ids
                .iter()
                .flat_map(|id| alphabet.iter().map(move |c| format!("{id}{c}")))
                .collect();
            ids.extend(longer);
            ids.sort();
            ids.dedup();
        }
        let shown: std::collections::HashSet<String> =
            ids.iter().map(|id| escape_id(id).into_owned()).collect();
        assert_eq!(shown.len(), ids.len());
        assert!(shown.iter().all(|s| !s.chars().any(char::is_control)));
        // Messages name ids in the same form, shortened.
        assert_eq!(shorten("a\x1bb"), "a\\x1bb");
        assert_eq!(
            shorten(&"\n".repeat(150)),
            format!("{}…", "\\n".repeat(100))
        );
    }
}
