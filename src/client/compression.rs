//! Request-body compression: INSERT data compressed in the component and sent with
//! `Content-Encoding`, which ClickHouse's HTTP interface decodes before parsing the rows
//! (`HTTPHandler` wraps the body in the reader `chooseCompressionMethod` picks from that
//! header; no setting is needed, unlike compressed *answers*). Pure-Rust codecs, so they build
//! for wasm32-wasip2: LZ4 frames (`lz4_flex`), Zstandard (`ruzstd`, its "fastest" level, about
//! zstd's level 1), gzip (`miniz_oxide`'s deflate, level 1, in a gzip member of our own: see
//! [`super::gzip`]).

use std::io::{Read, Write};

use super::error::{Error, TransportError, TransportFailure};
use super::response::HttpResponse;

/// The answer encoding large reads ask for (`Accept-Encoding`, with `enable_http_compression=1`):
/// LZ4 frames, cheap to decode in the component.
pub const ANSWER_ENCODING: &str = "lz4";

/// Most bytes a compressed answer may decode to (the host's default cap on an answer as sent):
/// past it the read fails instead of exhausting the component's memory.
pub const MAX_DECODED_ANSWER: u64 = 256 << 20;

/// Decodes an answer sent with a `Content-Encoding` (a server compresses only when asked, and
/// then with the method asked for: [`ANSWER_ENCODING`]). An error answer that does not decode
/// (a cut one: error bodies are read only in part) keeps what decoded, else says so (its status
/// and `X-ClickHouse-Exception-Code` still classify it).
pub fn decode_answer(mut answer: HttpResponse) -> Result<HttpResponse, TransportError> {
    let Some(encoding) = answer.header("content-encoding") else {
        return Ok(answer);
    };
    let encoding = encoding.trim().to_ascii_lowercase();
    if encoding.is_empty() || encoding == "identity" {
        return Ok(answer);
    }
    let success = (200..300).contains(&answer.status);
    if encoding != ANSWER_ENCODING {
        if !success {
            return Ok(answer);
        }
        return Err(TransportError::new(
            TransportFailure::Protocol,
            format!(
                "the answer is encoded as '{}', which the component did not ask for and cannot decode",
                encoding.escape_debug()
            ),
        ));
    }
    let mut decoded = Vec::new();
    let result = lz4_flex::frame::FrameDecoder::new(answer.body.as_slice())
        .take(MAX_DECODED_ANSWER + 1)
        .read_to_end(&mut decoded);
    match result {
        Ok(_) if decoded.len() as u64 > MAX_DECODED_ANSWER => Err(TransportError::new(
            TransportFailure::TooLarge,
            format!(
                "the lz4 answer decodes to more than {} MiB",
                MAX_DECODED_ANSWER >> 20
            ),
        )),
        // The decoder takes input that stops at a block boundary as the frame's end: an answer
        // cut there would lose its last rows silently. A whole frame ends with its end mark.
        Ok(_) if success && !ends_with_end_mark(&answer.body) => Err(TransportError::new(
            TransportFailure::Protocol,
            "the lz4 answer is cut short (its frame has no end mark)",
        )),
        Ok(_) => {
            answer.body = decoded;
            answer
                .headers
                .retain(|(n, _)| !n.eq_ignore_ascii_case("content-encoding"));
            Ok(answer)
        }
        Err(_) if !success => {
            answer.body = if decoded.is_empty() {
                b"(the server's error message was lz4-compressed and does not decode)".to_vec()
            } else {
                decoded
            };
            Ok(answer)
        }
        Err(e) => Err(TransportError::new(
            TransportFailure::Protocol,
            format!("the lz4 answer does not decode: {e}"),
        )),
    }
}

/// How INSERT bodies are compressed on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    /// Sent as is.
    None,
    /// LZ4 frame format (`Content-Encoding: lz4`): cheap to make, several times smaller on the
    /// wire (11x for the benchmark's rows); the default, as in clickhouse-connect and
    /// clickhouse-rs.
    #[default]
    Lz4,
    /// Zstandard (`Content-Encoding: zstd`): smaller than LZ4, slower to make.
    Zstd,
    /// gzip (`Content-Encoding: gzip`): for proxies that pass nothing else.
    Gzip,
}

impl Compression {
    /// Every method, in the order the option lists them.
    pub const ALL: [Compression; 4] = [
        Compression::None,
        Compression::Lz4,
        Compression::Zstd,
        Compression::Gzip,
    ];

    /// The option's spelling (and, but for `none`, the `Content-Encoding` value).
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
            Compression::Gzip => "gzip",
        }
    }

    /// Parses `none`, `lz4`, `zstd` or `gzip` (ASCII case ignored); `invalid-input` naming
    /// the choices otherwise.
    pub fn parse(text: &str) -> Result<Compression, Error> {
        Compression::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(text.trim()))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "compression '{}' is not one of none, lz4, zstd, gzip",
                    text.escape_debug()
                ))
            })
    }

    /// The `Content-Encoding` header value, or `None` when the body is sent as is.
    pub fn content_encoding(self) -> Option<&'static str> {
        match self {
            Compression::None => None,
            other => Some(other.name()),
        }
    }

    /// The body as it goes on the wire.
    pub fn encode(self, data: Vec<u8>) -> Vec<u8> {
        match self {
            Compression::None => data,
            Compression::Lz4 => {
                // 64 KiB independent blocks: the encoder's buffers stay small (its default
                // allocates and clears MiBs per body, 3-4x the time of the compression itself),
                // and every LZ4 frame reader takes them.
                let info = lz4_flex::frame::FrameInfo::new()
                    .block_size(lz4_flex::frame::BlockSize::Max64KB)
                    .block_mode(lz4_flex::frame::BlockMode::Independent);
                let mut encoder = lz4_flex::frame::FrameEncoder::with_frame_info(
                    info,
                    Vec::with_capacity(data.len() / 3 + 64),
                );
                // Writing into a Vec cannot fail.
                encoder.write_all(&data).expect("lz4 into memory");
                encoder.finish().expect("lz4 into memory")
            }
            Compression::Zstd => ruzstd::encoding::compress_to_vec(
                data.as_slice(),
                ruzstd::encoding::CompressionLevel::Fastest,
            ),
            Compression::Gzip => super::gzip::encode(&data),
        }
    }
}

/// Whether an LZ4 frame ends with its end mark (a zero block size), followed by the content
/// checksum when its header says there is one (FLG bit 2). ClickHouse's LZ4 writer answers
/// nothing with the end mark alone (no header): that is a whole (empty) answer too.
fn ends_with_end_mark(frame: &[u8]) -> bool {
    if frame == [0, 0, 0, 0] {
        return true;
    }
    let Some(&flags) = frame.get(4) else {
        return false;
    };
    let tail = if flags & 0x04 != 0 { 8 } else { 4 };
    frame.len() >= 7 + tail && frame[frame.len() - tail..][..4] == [0, 0, 0, 0]
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn decode(method: Compression, wire: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match method {
            Compression::None => out.extend_from_slice(wire),
            Compression::Lz4 => {
                lz4_flex::frame::FrameDecoder::new(wire)
                    .read_to_end(&mut out)
                    .unwrap();
            }
            Compression::Zstd => {
                ruzstd::decoding::StreamingDecoder::new(wire)
                    .unwrap()
                    .read_to_end(&mut out)
                    .unwrap();
            }
            Compression::Gzip => {
                flate2::read::GzDecoder::new(wire)
                    .read_to_end(&mut out)
                    .unwrap();
            }
        }
        out
    }

    #[test]
    fn every_method_round_trips_and_shrinks_repetitive_rows() {
        let rows: Vec<u8> = (0..5000)
            .map(|n| {
                format!(
                    "{{\"id\":\"ev-{n:07}\",\"kind\":\"k{}\",\"payload\":\"{}\"}}\n",
                    n % 7,
                    "p".repeat(64)
                )
            })
            .collect::<String>()
            .into_bytes();
        for method in Compression::ALL {
            let wire = method.encode(rows.clone());
            assert_eq!(decode(method, &wire), rows, "{method:?}");
            if method != Compression::None {
                assert!(
                    wire.len() * 4 < rows.len(),
                    "{method:?}: {} of {}",
                    wire.len(),
                    rows.len()
                );
            }
            for empty in [Vec::new(), b"x".to_vec()] {
                assert_eq!(decode(method, &method.encode(empty.clone())), empty);
            }
        }
        // The frames a server's readers expect: LZ4 frame magic, zstd magic, gzip magic.
        assert_eq!(
            &Compression::Lz4.encode(rows.clone())[..4],
            &[0x04, 0x22, 0x4d, 0x18]
        );
        assert_eq!(
            &Compression::Zstd.encode(rows.clone())[..4],
            &[0x28, 0xb5, 0x2f, 0xfd]
        );
        assert_eq!(&Compression::Gzip.encode(rows)[..2], &[0x1f, 0x8b]);
    }

    fn answer(status: u16, encoding: Option<&str>, body: Vec<u8>) -> HttpResponse {
        HttpResponse {
            status,
            headers: encoding
                .map(|e| vec![("content-encoding".to_string(), e.as_bytes().to_vec())])
                .unwrap_or_default(),
            body,
            elapsed_us: 1,
        }
    }

    #[test]
    fn lz4_answers_are_decoded_and_others_refused_or_kept() {
        let text = b"{\"state_id\":\"a\"}\n".repeat(1000);
        let wire = Compression::Lz4.encode(text.clone());
        let decoded = decode_answer(answer(200, Some("lz4"), wire.clone())).unwrap();
        assert_eq!(decoded.body, text);
        assert_eq!(decoded.header("content-encoding"), None);
        // Not encoded, or identity: as is.
        for encoding in [None, Some("identity")] {
            assert_eq!(
                decode_answer(answer(200, encoding, text.clone()))
                    .unwrap()
                    .body,
                text
            );
        }
        // A successful answer that does not decode, or in a method not asked for, is an error.
        let err =
            decode_answer(answer(200, Some("lz4"), wire[..wire.len() / 2].to_vec())).unwrap_err();
        assert_eq!(err.failure, TransportFailure::Protocol);
        // Cut at a block boundary (here: without its end mark), it is refused, not a prefix.
        let err =
            decode_answer(answer(200, Some("lz4"), wire[..wire.len() - 4].to_vec())).unwrap_err();
        assert!(err.detail.contains("cut short"), "{}", err.detail);
        // The empty answer a server sends for no rows: a header and the end mark.
        let empty = Compression::Lz4.encode(Vec::new());
        assert!(decode_answer(answer(200, Some("lz4"), empty))
            .unwrap()
            .body
            .is_empty());
        // ... and ClickHouse's LZ4 writer's empty answer: the end mark alone.
        let bare = decode_answer(answer(200, Some("lz4"), vec![0, 0, 0, 0])).unwrap();
        assert!(bare.body.is_empty());
        let err = decode_answer(answer(200, Some("gzip"), wire.clone())).unwrap_err();
        assert!(err.detail.contains("'gzip'"), "{}", err.detail);
        // An error answer keeps what decodes (its body is read only in part), or says it does
        // not decode.
        let message = b"Code: 60. DB::Exception: Unknown table".to_vec();
        let cut = Compression::Lz4.encode(message.clone());
        let got = decode_answer(answer(404, Some("lz4"), cut.clone())).unwrap();
        assert_eq!(got.body, message);
        let got = decode_answer(answer(404, Some("lz4"), cut[..cut.len() / 2].to_vec())).unwrap();
        assert!(String::from_utf8_lossy(&got.body).contains("does not decode"));
        // A decoding bomb stops at the cap.
        let bomb = Compression::Lz4.encode(vec![0u8; (MAX_DECODED_ANSWER + 10) as usize]);
        assert!(bomb.len() < 2 << 20);
        let err = decode_answer(answer(200, Some("lz4"), bomb)).unwrap_err();
        assert_eq!(err.failure, TransportFailure::TooLarge);
    }

    #[test]
    fn names_parse_and_bad_names_are_refused() {
        for method in Compression::ALL {
            assert_eq!(Compression::parse(method.name()).unwrap(), method);
            assert_eq!(
                Compression::parse(&method.name().to_uppercase()).unwrap(),
                method
            );
        }
        assert_eq!(Compression::default(), Compression::Lz4);
        assert_eq!(Compression::None.content_encoding(), None);
        assert_eq!(Compression::Zstd.content_encoding(), Some("zstd"));
        let err = Compression::parse("brotli").unwrap_err();
        assert!(
            err.message
                .contains("'brotli' is not one of none, lz4, zstd, gzip"),
            "{}",
            err.message
        );
    }
}
