//! Glob patterns with exactly the semantics of Python's `fnmatch.fnmatchcase` (what Meltano
//! users expect): `*`, `?`, `[seq]`, `[!seq]`, anchored at both ends, case-sensitive, every
//! other character literal (`_` and `%` too). Matching happens here, not in SQL, so no SQL or
//! regex dialect can change the meaning; [`Glob::literal_prefix`] lets the query narrow rows.

/// A compiled pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glob {
    tokens: Vec<Token>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    /// `*`: any run of characters (newlines included).
    Star,
    /// `?`: any one character.
    Any,
    /// A literal character.
    Char(char),
    /// `[...]` / `[!...]`: inclusive ranges; single characters are ranges of one.
    Set {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Glob {
    /// Compiles a pattern. Every string is a valid pattern (as in fnmatch): an unclosed `[`
    /// is a literal `[`.
    pub fn new(pattern: &str) -> Glob {
        let chars: Vec<char> = pattern.chars().collect();
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            i += 1;
            match c {
                '*' => {
                    if tokens.last() != Some(&Token::Star) {
                        tokens.push(Token::Star);
                    }
                }
                '?' => tokens.push(Token::Any),
                '[' => {
                    // Find the closing ']': a ']' right after '[' or '[!' is literal.
                    let mut j = i;
                    if j < chars.len() && chars[j] == '!' {
                        j += 1;
                    }
                    if j < chars.len() && chars[j] == ']' {
                        j += 1;
                    }
                    while j < chars.len() && chars[j] != ']' {
                        j += 1;
                    }
                    if j >= chars.len() {
                        tokens.push(Token::Char('['));
                        continue;
                    }
                    let mut content = &chars[i..j];
                    let negated = content.first() == Some(&'!');
                    if negated {
                        content = &content[1..];
                    }
                    tokens.push(Token::Set {
                        negated,
                        ranges: parse_set(content),
                    });
                    i = j + 1;
                }
                c => tokens.push(Token::Char(c)),
            }
        }
        Glob { tokens }
    }

    /// Whether `text` matches the whole pattern.
    pub fn matches(&self, text: &str) -> bool {
        let text: Vec<char> = text.chars().collect();
        // Iterative matcher with backtracking to the last star (linear-ish, no recursion).
        let (mut t, mut p) = (0usize, 0usize);
        let mut star: Option<(usize, usize)> = None;
        while t < text.len() {
            if p < self.tokens.len() {
                match &self.tokens[p] {
                    Token::Star => {
                        star = Some((p, t));
                        p += 1;
                        continue;
                    }
                    token if token_matches(token, text[t]) => {
                        p += 1;
                        t += 1;
                        continue;
                    }
                    _ => {}
                }
            }
            match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            }
        }
        self.tokens[p..].iter().all(|tok| *tok == Token::Star)
    }

    /// The literal characters before the first wildcard: every match starts with them.
    pub fn literal_prefix(&self) -> String {
        self.tokens
            .iter()
            .map_while(|t| match t {
                Token::Char(c) => Some(*c),
                _ => None,
            })
            .collect()
    }

    /// Whether the pattern has no wildcard (it matches only itself).
    pub fn is_literal(&self) -> bool {
        self.tokens.iter().all(|t| matches!(t, Token::Char(_)))
    }
}

fn token_matches(token: &Token, c: char) -> bool {
    match token {
        Token::Star => true,
        Token::Any => true,
        Token::Char(x) => *x == c,
        Token::Set { negated, ranges } => {
            ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
        }
    }
}

/// Parses set contents like fnmatch: `a-z` is a range, a leading or trailing `-` is literal,
/// and a range whose end is below its start matches nothing (fnmatch drops it).
fn parse_set(content: &[char]) -> Vec<(char, char)> {
    let mut ranges = Vec::new();
    let mut k = 0;
    while k < content.len() {
        let lo = content[k];
        if k + 2 < content.len() && content[k + 1] == '-' {
            let hi = content[k + 2];
            if lo <= hi {
                ranges.push((lo, hi));
            }
            k += 3;
        } else {
            ranges.push((lo, lo));
            k += 1;
        }
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::Glob;

    /// (pattern, text, expected) — expectations checked against CPython 3.11
    /// `fnmatch.fnmatchcase`.
    const CASES: &[(&str, &str, bool)] = &[
        ("*", "", true),
        ("*", "anything at all", true),
        ("*", "multi\nline", true),
        ("?", "", false),
        ("?", "a", true),
        ("?", "é", true),
        ("?", "ab", false),
        ("a*", "abc", true),
        ("a*", "bac", false),
        ("*c", "abc", true),
        ("a*c", "ac", true),
        ("a*c", "abbbc", true),
        ("a*c", "abcd", false),
        ("a**c", "abc", true),
        ("*a*b*", "xxaxxbxx", true),
        ("*a*b*", "xxbxxaxx", false),
        ("tap-*--target-*", "tap-gitlab--target-jsonl", true),
        ("dev:tap-*", "dev:tap-github--target-x", true),
        ("dev:tap-*", "prod:tap-github--target-x", false),
        // SQL LIKE characters are literal.
        ("a_c", "abc", false),
        ("a_c", "a_c", true),
        ("100%", "1000", false),
        ("100%", "100%", true),
        ("%", "x", false),
        // Case-sensitive.
        ("ABC", "abc", false),
        ("[a-z]", "Q", false),
        // Sets.
        ("[abc]", "b", true),
        ("[abc]", "d", false),
        ("[!abc]", "d", true),
        ("[!abc]", "a", false),
        ("[a-c]x", "bx", true),
        ("[]]", "]", true),
        ("[!]]", "]", false),
        ("[!]]", "a", true),
        ("[]-a]", "^", true), // range ']'..'a' includes '^'
        ("[-a]", "-", true),
        ("[a-]", "-", true),
        ("[z-a]", "m", false), // empty range matches nothing
        ("[!z-a]", "m", true), // negated empty matches anything
        ("[a-c-e]", "-", true),
        ("[a-c-e]", "d", false),
        ("[[]", "[", true),
        ("[", "[", true), // unclosed: literal
        ("[abc", "[abc", true),
        ("[!", "[!", true),
        ("a[", "a[", true),
        ("[*]", "*", true),
        ("[*]", "x", false),
        ("[?]", "?", true),
        ("\\*", "\\x", true), // backslash is not an escape in fnmatch
        ("\\*", "*", false),
        ("[\\]", "\\", true),
        ("é*", "étoile", true),
        ("*\u{1F600}", "smile\u{1F600}", true),
        ("quote'\"`", "quote'\"`", true),
        ("", "", true),
        ("", "a", false),
    ];

    #[test]
    fn matches_like_python_fnmatchcase() {
        for &(pattern, text, want) in CASES {
            assert_eq!(
                Glob::new(pattern).matches(text),
                want,
                "fnmatchcase({text:?}, {pattern:?})"
            );
        }
    }

    #[test]
    fn literal_prefix_and_literal_patterns() {
        assert_eq!(Glob::new("dev:tap-*x").literal_prefix(), "dev:tap-");
        assert_eq!(Glob::new("a_%[b]").literal_prefix(), "a_%");
        assert_eq!(Glob::new("*").literal_prefix(), "");
        assert!(Glob::new("exact_id%").is_literal());
        assert!(!Glob::new("a?").is_literal());
        assert!(Glob::new("[").is_literal());
    }

    #[test]
    fn pathological_patterns_stay_fast() {
        let pattern = "*a*a*a*a*a*a*a*a*b";
        let text = "a".repeat(5000);
        let started = std::time::Instant::now();
        assert!(!Glob::new(pattern).matches(&text));
        // Correctness is asserted above; this bound only catches exponential backtracking.
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
}
