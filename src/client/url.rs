//! Percent-encoding and decoding (RFC 3986) for connection strings and request URLs.

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Everything but RFC 3986's unreserved characters (`A-Z a-z 0-9 - . _ ~`).
const NOT_UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes everything except RFC 3986 unreserved characters (`A-Z a-z 0-9 - . _ ~`),
/// with upper-case hex digits.
pub fn encode_component(text: &str) -> String {
    utf8_percent_encode(text, NOT_UNRESERVED).to_string()
}

/// Why percent-decoding failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// `%` not followed by two hex digits.
    BadEscape,
    /// The decoded bytes are not UTF-8.
    NotUtf8,
}

/// Percent-decodes `text`; with `plus_as_space` (query strings), `+` decodes to a space.
/// Strict where the crate is lenient: a `%` not followed by two hex digits is an error.
pub fn decode_component(text: &str, plus_as_space: bool) -> Result<String, DecodeError> {
    let bytes = text.as_bytes();
    let well_formed = bytes.iter().enumerate().all(|(i, b)| {
        *b != b'%'
            || (bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    });
    if !well_formed {
        return Err(DecodeError::BadEscape);
    }
    let spaced;
    let text = if plus_as_space && text.contains('+') {
        spaced = text.replace('+', " ");
        &spaced
    } else {
        text
    };
    percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| DecodeError::NotUtf8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_keeps_unreserved_only() {
        assert_eq!(encode_component("aZ09-._~"), "aZ09-._~");
        assert_eq!(encode_component("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        assert_eq!(encode_component("{t:Identifier}"), "%7Bt%3AIdentifier%7D");
    }

    #[test]
    fn decode_round_trips_and_rejects_bad_escapes() {
        for s in ["", "plain", "a b&c=d/é", "100%", "\t\n\\"] {
            assert_eq!(decode_component(&encode_component(s), false).unwrap(), s);
        }
        assert_eq!(decode_component("a+b", true).unwrap(), "a b");
        assert_eq!(decode_component("a+b", false).unwrap(), "a+b");
        assert_eq!(decode_component("%4", false), Err(DecodeError::BadEscape));
        assert_eq!(decode_component("%zz", false), Err(DecodeError::BadEscape));
        assert_eq!(decode_component("%ff", false), Err(DecodeError::NotUtf8));
    }
}
