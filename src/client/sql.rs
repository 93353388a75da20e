//! SQL text the grammar gives no parameter for: backquoted identifiers (an INSERT column list).
//!
//! Values and table or database names always travel as typed query parameters (`{v:String}`,
//! `{t:Identifier}`). ClickHouse's parser takes no parameter in an INSERT column list, so the
//! column names there are written by [`quote_identifier`], the one function that puts a name
//! into SQL text.

/// `name` as a backquoted ClickHouse identifier, escaped the way ClickHouse writes one
/// (`writeBackQuotedString`): a backquote and a backslash get a backslash, and control
/// characters their C escapes (`\n`, `\t`, ...), so any string (unicode, spaces, dots, quotes,
/// reserved words, text that looks like a `{x:String}` placeholder) reads back as itself.
pub fn quote_identifier(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('`');
    for c in name.chars() {
        match c {
            '`' => out.push_str("\\`"),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\0' => out.push_str("\\0"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if c.is_ascii_control() => out.push_str(&format!("\\x{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('`');
    out
}

#[cfg(test)]
mod tests {
    use super::quote_identifier as q;

    #[test]
    fn plain_names_are_only_quoted() {
        assert_eq!(q("id"), "`id`");
        assert_eq!(q("select"), "`select`");
        assert_eq!(q("x.y"), "`x.y`");
        assert_eq!(q("weird col"), "`weird col`");
        assert_eq!(q("ünï"), "`ünï`");
        assert_eq!(q(""), "``");
    }

    #[test]
    fn quotes_and_backslashes_are_escaped() {
        assert_eq!(q("a`b"), "`a\\`b`");
        assert_eq!(q("a\\b"), "`a\\\\b`");
        assert_eq!(q("\\`"), "`\\\\\\``");
        assert_eq!(q("`"), "`\\``");
        assert_eq!(q("it's \"x\""), "`it's \"x\"`");
    }

    #[test]
    fn control_characters_get_escapes() {
        assert_eq!(q("a\nb\tc\rd\0"), "`a\\nb\\tc\\rd\\0`");
        assert_eq!(q("\u{1}\u{7f}"), "`\\x01\\x7F`");
        assert_eq!(q("\u{8}\u{c}"), "`\\b\\f`");
    }

    #[test]
    fn placeholders_are_just_text() {
        assert_eq!(q("{x:String}"), "`{x:String}`");
        assert_eq!(q("{c0:Identifier}"), "`{c0:Identifier}`");
    }

    /// Reads a backquoted identifier back the way ClickHouse's lexer does, to check that every
    /// quoted name is one token that decodes to the original.
    fn unquote(text: &str) -> Option<String> {
        let inner = text.strip_prefix('`')?.strip_suffix('`')?;
        let mut out = String::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            match c {
                '`' => return None, // an unescaped quote would end the token early
                '\\' => match chars.next()? {
                    'n' => out.push('\n'),
                    'r' => out.push('\r'),
                    't' => out.push('\t'),
                    '0' => out.push('\0'),
                    'b' => out.push('\u{8}'),
                    'f' => out.push('\u{c}'),
                    'x' => {
                        let hex: String = chars.by_ref().take(2).collect();
                        out.push(char::from(u8::from_str_radix(&hex, 16).ok()?));
                    }
                    other => out.push(other),
                },
                c => out.push(c),
            }
        }
        Some(out)
    }

    #[test]
    fn every_name_round_trips() {
        for name in [
            "id",
            "a`b",
            "a\\b",
            "``",
            "\\\\`",
            "x\ny",
            "\u{1}",
            "ünï",
            "{x:String}",
            "a\\`b\\",
            "` OR 1=1 --",
        ] {
            assert_eq!(unquote(&q(name)).as_deref(), Some(name), "{name:?}");
        }
    }
}
