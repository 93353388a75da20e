//! BATCH messages (the Singer SDK's batch extension): a stream's records in JSON Lines files,
//! gzip-compressed or not, named by `file://` URIs in the message's manifest. The target reads
//! only files under the directories `batch_dirs` names (the host lets it read those, read-only,
//! and nothing else). Each file's records go through the same path as RECORD messages, in
//! order, so chunks, tokens and STATE are as if the tap had sent them as RECORDs: a rerun
//! whose tap writes the same records into new files loads them exactly once.

use miniz_oxide::inflate::stream::{inflate, InflateState};
use miniz_oxide::{DataFormat, MZFlush, MZStatus};

use crate::client::url::decode_component;
use crate::text::escaped;

/// The path of a `file://` URI (`file:///tmp/b/x.json.gz`, `file://localhost/tmp/...`),
/// percent-decoded; it must be absolute and not pass through `..`.
pub fn file_path(uri: &str) -> Result<String, String> {
    let shown = || escaped(uri);
    let rest = uri.strip_prefix("file://").ok_or_else(|| {
        format!(
            "{} is not a file:// URI (only local files are read)",
            shown()
        )
    })?;
    let rest = rest.strip_prefix("localhost").unwrap_or(rest);
    if !rest.starts_with('/') {
        return Err(format!("{} names no absolute path", shown()));
    }
    let path = decode_component(rest, false)
        .map_err(|_| format!("{} is not a well-formed URI", shown()))?;
    if path.split('/').any(|part| part == "..") {
        return Err(format!("{} passes through '..'", shown()));
    }
    if path.contains('\0') {
        return Err(format!("{} names a path with a NUL character", shown()));
    }
    Ok(path)
}

/// Whether `path` is in one of `dirs` (or below one).
pub fn allowed(path: &str, dirs: &[String]) -> bool {
    dirs.iter().any(|dir| {
        let dir = dir.trim_end_matches('/');
        path.strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1)
    })
}

/// A batch file's JSON Lines: read whole, gunzipped when `compression` is `gzip`.
pub fn read(path: &str, compression: Option<&str>) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", escaped(path)))?;
    match compression {
        None | Some("none") if bytes.len() > MAX_TEXT => {
            Err(format!("{}: {}", escaped(path), too_large()))
        }
        None | Some("none") => Ok(bytes),
        Some("gzip") => gunzip(&bytes).map_err(|why| format!("{}: {why}", escaped(path))),
        Some(other) => Err(format!(
            "compression '{}' is not read (gzip or none)",
            escaped(other)
        )),
    }
}

/// The most text a batch file may hold (gunzipped): the whole file is read into the
/// component's memory (1 GiB by default), with the records it holds.
pub const MAX_TEXT: usize = 256 << 20;

/// gzip (RFC 1952) members, one after another, each checked against its CRC-32 and length;
/// refused past [`MAX_TEXT`] of text.
pub fn gunzip(mut input: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity((input.len() * 4).min(MAX_TEXT));
    loop {
        let header = header_length(input)?;
        let start = out.len();
        let mut state = InflateState::new_boxed(DataFormat::Raw);
        let mut at = header;
        loop {
            if out.len() >= MAX_TEXT {
                return Err(too_large());
            }
            if out.len() == out.capacity() {
                out.reserve(out.len().max(64 * 1024).min(MAX_TEXT + 1 - out.len()));
            }
            let len = out.len();
            out.resize(out.capacity(), 0);
            let r = inflate(&mut state, &input[at..], &mut out[len..], MZFlush::None);
            out.truncate(len + r.bytes_written);
            at += r.bytes_consumed;
            match r.status {
                Ok(MZStatus::StreamEnd) => break,
                Ok(_) if r.bytes_consumed > 0 || r.bytes_written > 0 => {}
                _ => return Err("not a whole gzip stream (cut short or corrupt)".into()),
            }
        }
        let trailer = input
            .get(at..at + 8)
            .ok_or("a gzip member without its trailer")?;
        let crc = u32::from_le_bytes(trailer[..4].try_into().expect("four bytes"));
        let size = u32::from_le_bytes(trailer[4..].try_into().expect("four bytes"));
        let member = &out[start..];
        if crate::client::gzip::crc32(member) != crc || member.len() as u32 != size {
            return Err("a gzip member whose CRC-32 or length does not match".into());
        }
        input = &input[at + 8..];
        if input.is_empty() {
            return Ok(out);
        }
    }
}

fn too_large() -> String {
    format!(
        "it holds more than {} MiB of text: have the tap write smaller files (its batch_config batch_size)",
        MAX_TEXT >> 20
    )
}

/// The length of a gzip member's header (its optional fields included).
fn header_length(input: &[u8]) -> Result<usize, String> {
    let bad = || "not a gzip file".to_string();
    if input.len() < 10 || input[..3] != [0x1f, 0x8b, 8] {
        return Err(bad());
    }
    let flags = input[3];
    let mut at = 10;
    if flags & 4 != 0 {
        let extra = input.get(at..at + 2).ok_or_else(bad)?;
        at += 2 + usize::from(u16::from_le_bytes([extra[0], extra[1]]));
    }
    for flag in [8, 16] {
        // The file name, the comment: zero-terminated.
        if flags & flag != 0 {
            let end = input
                .get(at..)
                .and_then(|rest| rest.iter().position(|b| *b == 0));
            at += end.ok_or_else(bad)? + 1;
        }
    }
    if flags & 2 != 0 {
        at += 2;
    }
    if at > input.len() {
        return Err(bad());
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn file_uris_are_local_absolute_paths_in_the_given_dirs() {
        assert_eq!(
            file_path("file:///tmp/b/x%20y.json.gz").unwrap(),
            "/tmp/b/x y.json.gz"
        );
        assert_eq!(file_path("file://localhost/tmp/b").unwrap(), "/tmp/b");
        for (uri, says) in [
            ("s3://bucket/x.json.gz", "not a file:// URI"),
            ("file://tmp/x", "no absolute path"),
            ("file:///tmp/b/../../etc/passwd", "'..'"),
            ("file:///tmp/%2e%2e/etc", "'..'"),
            ("file:///tmp/a%00b", "NUL"),
            ("file:///tmp/%zz", "not a well-formed URI"),
        ] {
            let e = file_path(uri).unwrap_err();
            assert!(e.contains(says), "{uri}: {e}");
        }
        let dirs = ["/tmp/b/".to_string()];
        assert!(allowed("/tmp/b/x.json.gz", &dirs));
        assert!(allowed("/tmp/b/sub/x", &dirs));
        assert!(!allowed("/tmp/bb/x", &dirs));
        assert!(!allowed("/tmp/b", &dirs));
    }

    #[test]
    fn gzip_members_are_read_and_checked() {
        let gz = |data: &[u8]| {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(data).unwrap();
            e.finish().unwrap()
        };
        let big: Vec<u8> = (0..300_000u32).flat_map(|i| i.to_le_bytes()).collect();
        assert_eq!(gunzip(&gz(&big)).unwrap(), big);
        // Two members, and a header with a file name (Python's gzip writes one).
        let mut two = gz(b"{\"a\":1}\n");
        let mut named = flate2::GzBuilder::new()
            .filename("x.json")
            .write(Vec::new(), flate2::Compression::fast());
        named.write_all(b"{\"a\":2}\n").unwrap();
        two.extend(named.finish().unwrap());
        assert_eq!(gunzip(&two).unwrap(), b"{\"a\":1}\n{\"a\":2}\n");
        let whole = gz(b"{\"a\":1}\n");
        let cut = &whole[..whole.len() - 3];
        assert!(gunzip(cut).is_err());
        let mut corrupt = whole.clone();
        let n = corrupt.len();
        corrupt[n - 6] ^= 1;
        assert!(gunzip(&corrupt).unwrap_err().contains("CRC-32"));
        assert!(gunzip(b"{\"a\":1}")
            .unwrap_err()
            .contains("not a gzip file"));
        // A bomb: 300 MiB of zeros in a few hundred KiB is refused, not read into memory.
        let mut bomb = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..300 {
            bomb.write_all(&zeros).unwrap();
        }
        let bomb = bomb.finish().unwrap();
        assert!(bomb.len() < 1 << 20);
        assert!(gunzip(&bomb).unwrap_err().contains("more than 256 MiB"));
    }
}
