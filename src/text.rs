//! Text as messages show it.

use std::borrow::Cow;
use std::fmt::Write;

/// `s` with backslashes, quotes, control characters and the invisible characters that change
/// how a line reads (bidirectional overrides, zero-width and line separators, a BOM) escaped
/// as Rust writes them (`\\`, `\'`, `\"`, `\t`, `\n`, `\r`, `\0`, `\u{1b}`,
/// `\u{202e}`), every other character kept: what
/// `str::escape_debug` shows for names and values in messages, without its Unicode tables
/// (printable and grapheme-extend), which cost the library component kilobytes
/// (docs/measurements.md).
pub fn escaped(s: &str) -> Cow<'_, str> {
    let plain = |c: char| !matches!(c, '\\' | '\'' | '"') && !c.is_control() && !invisible(c);
    if s.chars().all(plain) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        let _ = match c {
            '\\' | '\'' | '"' => write!(out, "\\{c}"),
            '\t' => out.write_str("\\t"),
            '\n' => out.write_str("\\n"),
            '\r' => out.write_str("\\r"),
            '\0' => out.write_str("\\0"),
            c if c.is_control() || invisible(c) => write!(out, "\\u{{{:x}}}", u32::from(c)),
            c => out.write_char(c),
        };
    }
    Cow::Owned(out)
}

/// The format characters (Unicode Cf) and separators that reorder, hide or break what a
/// terminal shows.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{61c}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_as_escape_debug_does_for_quotes_backslashes_and_controls() {
        for s in [
            "plain",
            "é and ü",
            "a'b\"c\\d",
            "tab\tnl\nret\r nul\0 esc\u{1b} del\u{7f} c1\u{85}",
            "rtl\u{202e}override zw\u{200b}space ls\u{2028} bom\u{feff}",
            "",
        ] {
            assert_eq!(escaped(s), s.escape_debug().to_string(), "{s:?}");
        }
        assert!(matches!(escaped("plain"), Cow::Borrowed(_)));
    }
}
