//! Percent-encoding and decoding (RFC 3986) for connection strings and request URLs.

/// Percent-encodes everything except RFC 3986 unreserved characters (`A-Z a-z 0-9 - . _ ~`).
pub fn encode_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push('%');
            out.push(hex_digit(byte >> 4));
            out.push(hex_digit(byte & 0xf));
        }
    }
    out
}

fn hex_digit(nibble: u8) -> char {
    char::from_digit(u32::from(nibble), 16)
        .expect("a nibble is a hex digit")
        .to_ascii_uppercase()
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
pub fn decode_component(text: &str, plus_as_space: bool) -> Result<String, DecodeError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hi = bytes.get(i + 1).and_then(|b| (*b as char).to_digit(16));
                let lo = bytes.get(i + 2).and_then(|b| (*b as char).to_digit(16));
                match (hi, lo) {
                    (Some(hi), Some(lo)) => out.push((hi * 16 + lo) as u8),
                    _ => return Err(DecodeError::BadEscape),
                }
                i += 3;
            }
            b'+' if plus_as_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| DecodeError::NotUtf8)
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
