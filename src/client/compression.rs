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
            TransportFailure::NotClickHouse,
            format!(
                "the answer is encoded as '{}', which the component did not ask for and cannot decode",
                crate::text::escaped(&encoding)
            ),
        ));
    }
    // The answer is whole (the transport read it to its end): one that does not decode will
    // not decode the next time either, so it is not ClickHouse's answer as sent (something in
    // between altered it), never retried. The message says which way it is broken.
    let broken = |how: &str| {
        TransportError::new(
            TransportFailure::NotClickHouse,
            format!("the lz4 answer {how}; the answer was whole, so something between the component and ClickHouse altered it (not retried)"),
        )
    };
    if success
        && !answer.body.is_empty()
        && answer.body != [0, 0, 0, 0]
        && !answer.body.starts_with(&LZ4_MAGIC)
    {
        return Err(broken(
            "is not an lz4 frame (it does not start with the lz4 magic number)",
        ));
    }
    match decode_bounded(&answer.body, MAX_DECODED_ANSWER) {
        // A frame that decodes but stops at a block boundary would lose its last rows
        // silently; checked after decoding, so garbage is named as such.
        Ok(_) if success && !ends_with_end_mark(&answer.body) => {
            Err(broken("is cut short (its frame has no end mark)"))
        }
        Ok(decoded) => {
            answer.body = decoded;
            answer
                .headers
                .retain(|(n, _)| !n.eq_ignore_ascii_case("content-encoding"));
            Ok(answer)
        }
        Err(Bounded::Failed(decoded)) if !success => {
            answer.body = if decoded.is_empty() {
                b"(the server's error message was lz4-compressed and does not decode)".to_vec()
            } else {
                decoded
            };
            Ok(answer)
        }
        Err(Bounded::TooLarge(what)) => Err(TransportError::new(TransportFailure::TooLarge, what)),
        // The decoder's own words are its error's `Debug` form (kilobytes in the component):
        // where it stopped says enough.
        Err(Bounded::Failed(decoded)) => Err(broken(&format!(
            "does not decode (its frame is broken after {} decoded bytes)",
            decoded.len()
        ))),
    }
}

/// Why [`decode_bounded`] stopped.
enum Bounded {
    /// Over the cap, or more than the component's memory can hold (the message says which).
    TooLarge(String),
    /// Not a valid frame: what decoded before the fault.
    Failed(Vec<u8>),
}

/// Decodes an LZ4 frame into at most `cap` bytes. Two passes: the first decodes 64 KiB at a
/// time and keeps nothing but the count, so a bomb (a small frame that decodes to more than
/// `cap`) is refused at the cost of the frame's own bytes, not at the cap's; the second
/// decodes into one buffer of exactly the decoded size, reserved fallibly, so a frame that
/// fits never costs more than itself (a growing buffer would peak at one and a half times
/// the size, while it copies), and room that cannot be had is an error, never a trap.
/// Decoding LZ4 twice costs far less than the request did.
fn decode_bounded(frame: &[u8], cap: u64) -> Result<Vec<u8>, Bounded> {
    let cap = usize::try_from(cap).unwrap_or(usize::MAX);
    let (size, whole) = decoded_size(frame, cap).map_err(|()| {
        Bounded::TooLarge(format!(
            "the lz4 answer decodes to more than {} MiB, the most the component decodes from one answer",
            cap >> 20
        ))
    })?;
    let mut decoded: Vec<u8> = Vec::new();
    decoded.try_reserve_exact(size).map_err(|_| {
        Bounded::TooLarge(format!(
            "the lz4 answer decodes to {} MiB, more than this instance's memory holds",
            size >> 20
        ))
    })?;
    // The same bytes as the first pass, up to where it stopped (fewer would be a short answer
    // taken as whole: refused as a broken frame).
    let _ = lz4_flex::frame::FrameDecoder::new(frame)
        .take(size as u64)
        .read_to_end(&mut decoded);
    if whole && decoded.len() == size {
        Ok(decoded)
    } else {
        Err(Bounded::Failed(decoded))
    }
}

/// How many bytes `frame` decodes to (up to where it breaks, and whether it decoded whole);
/// `Err` past `cap`.
fn decoded_size(frame: &[u8], cap: usize) -> Result<(usize, bool), ()> {
    let mut decoder = lz4_flex::frame::FrameDecoder::new(frame);
    let mut chunk = vec![0u8; 64 * 1024];
    let mut size = 0usize;
    loop {
        match decoder.read(&mut chunk) {
            Ok(0) => return Ok((size, true)),
            Ok(n) => {
                size = size.checked_add(n).filter(|&s| s <= cap).ok_or(())?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Ok((size, false)),
        }
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

impl std::str::FromStr for Compression {
    type Err = Error;
    /// [`Compression::parse`].
    fn from_str(s: &str) -> Result<Self, Error> {
        Compression::parse(s)
    }
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
                    crate::text::escaped(text)
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
                // (No `expect`: the errors' `Debug` forms are kilobytes in the component.)
                let written = encoder.write_all(&data).is_ok();
                match encoder.finish() {
                    Ok(out) if written => out,
                    _ => unreachable!("lz4 into memory cannot fail"),
                }
            }
            Compression::Zstd => ruzstd::encoding::compress_to_vec(
                data.as_slice(),
                ruzstd::encoding::CompressionLevel::Fastest,
            ),
            Compression::Gzip => super::gzip::encode(&data),
        }
    }
}

/// The lz4 frame format's magic number, as the frame starts.
const LZ4_MAGIC: [u8; 4] = [0x04, 0x22, 0x4d, 0x18];

/// Whether the answer is whole LZ4 frames: walked block by block (each block's size read from
/// its header, never its data), every frame ends with its end mark (a zero block size) and its
/// content checksum when its header says there is one, and nothing follows the last. Looking
/// only at the last bytes is not enough: a block's data may end in zeros, so a frame cut after
/// such a block would pass. ClickHouse's LZ4 writer answers nothing with the end mark alone (no
/// header): that is a whole (empty) answer too.
fn ends_with_end_mark(answer: &[u8]) -> bool {
    if answer == [0, 0, 0, 0] {
        return true;
    }
    let u32_at = |at: usize| -> Option<usize> {
        let b = answer.get(at..at.checked_add(4)?)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let mut at = 0;
    while at < answer.len() {
        if answer.get(at..at + 4) != Some(&LZ4_MAGIC[..]) {
            return false;
        }
        let Some(&flags) = answer.get(at + 4) else {
            return false;
        };
        let block_checksums = flags & 0x10 != 0;
        let content_checksum = flags & 0x04 != 0;
        // Magic, FLG, BD, an optional content size and dictionary id, the header checksum.
        at += 4
            + 2
            + if flags & 0x08 != 0 { 8 } else { 0 }
            + if flags & 0x01 != 0 { 4 } else { 0 }
            + 1;
        loop {
            let Some(size) = u32_at(at) else {
                return false;
            };
            at += 4;
            if size == 0 {
                break;
            }
            at = match at.checked_add((size & 0x7fff_ffff) + if block_checksums { 4 } else { 0 }) {
                Some(next) => next,
                None => return false,
            };
        }
        if content_checksum {
            at += 4;
        }
        if at > answer.len() {
            return false;
        }
    }
    at == answer.len()
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
        // A successful answer that does not decode, or in a method not asked for, is an error:
        // not ClickHouse's answer as sent (never retried), saying how it is broken.
        let err =
            decode_answer(answer(200, Some("lz4"), wire[..wire.len() / 2].to_vec())).unwrap_err();
        assert_eq!(err.failure, TransportFailure::NotClickHouse);
        let mut garbage = wire[..4].to_vec();
        garbage.extend_from_slice(b"not lz4 at all, but whole");
        garbage.extend_from_slice(&[0, 0, 0, 0]);
        let err = decode_answer(answer(200, Some("lz4"), garbage)).unwrap_err();
        assert_eq!(err.failure, TransportFailure::NotClickHouse);
        assert!(err.detail.contains("does not decode"), "{}", err.detail);
        let err = decode_answer(answer(200, Some("lz4"), b"plain text".to_vec())).unwrap_err();
        assert_eq!(err.failure, TransportFailure::NotClickHouse);
        assert!(err.detail.contains("not an lz4 frame"), "{}", err.detail);
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
        // ... and no body at all.
        let none = decode_answer(answer(200, Some("lz4"), Vec::new())).unwrap();
        assert!(none.body.is_empty());
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
    fn decoding_never_grows_past_the_cap() {
        let frame = Compression::Lz4.encode(vec![7u8; 3 << 20]);
        let decoded = decode_bounded(&frame, 4 << 20).ok().unwrap();
        assert_eq!(decoded.len(), 3 << 20);
        // Exactly its size: no buffer grown by doubling.
        assert_eq!(decoded.capacity(), 3 << 20);
        // One byte over: refused, having held one 64 KiB piece at a time.
        let Err(Bounded::TooLarge(message)) = decode_bounded(&frame, (3 << 20) - 1) else {
            panic!("not refused");
        };
        assert!(message.contains("more than 2 MiB"), "{message}");
        // A frame without its end mark is refused before decoding (no prefix taken as whole),
        // also when its last block's data ends in zeros (as compressed zeros do).
        let cut = &frame[..frame.len() - 4];
        let err = decode_answer(answer(200, Some("lz4"), cut.to_vec())).unwrap_err();
        assert!(err.detail.contains("cut short"), "{}", err.detail);
        // The frame's header, one stored block of eight zero bytes, no end mark.
        assert_eq!(frame[4] & 0x09, 0, "no content size, no dictionary id");
        let mut zeros_last = frame[..7].to_vec();
        zeros_last.extend_from_slice(&(8u32 | 0x8000_0000).to_le_bytes());
        zeros_last.extend_from_slice(&[0; 8]);
        assert!(!ends_with_end_mark(&zeros_last));
        zeros_last.extend_from_slice(&[0; 4]);
        assert!(ends_with_end_mark(&zeros_last));
        // Two whole frames are whole; a frame with a content checksum is whole only with it.
        let mut two = frame.clone();
        two.extend_from_slice(&frame);
        assert!(ends_with_end_mark(&two));
        let mut info = lz4_flex::frame::FrameInfo::new();
        info.content_checksum = true;
        let mut encoder = lz4_flex::frame::FrameEncoder::with_frame_info(info, Vec::new());
        std::io::Write::write_all(&mut encoder, &[7u8; 100_000]).unwrap();
        let checked = encoder.finish().unwrap();
        assert!(ends_with_end_mark(&checked));
        assert!(!ends_with_end_mark(&checked[..checked.len() - 4]));
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
