//! gzip (RFC 1952) at level 1 on `miniz_oxide`'s deflate: byte for byte what
//! `flate2::write::GzEncoder` with `Compression::fast()` writes (tested), without flate2 and
//! crc32fast's 16 KiB static CRC table in the component (the same slice-by-16 table is
//! computed once, on first use).

use std::sync::OnceLock;

use miniz_oxide::deflate::core::CompressorOxide;
use miniz_oxide::deflate::stream::deflate;
use miniz_oxide::{DataFormat, MZFlush, MZStatus};

static TABLE: OnceLock<Box<[[u32; 256]; 16]>> = OnceLock::new();

fn table() -> &'static [[u32; 256]; 16] {
    TABLE.get_or_init(|| {
        let mut t = Box::new([[0u32; 256]; 16]);
        for i in 0..256u32 {
            let mut c = i;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            t[0][i as usize] = c;
        }
        for i in 0..256 {
            let mut c = t[0][i];
            for j in 1..16 {
                c = t[0][(c & 0xff) as usize] ^ (c >> 8);
                t[j][i] = c;
            }
        }
        t
    })
}

/// CRC-32 (IEEE) of `buf`.
pub fn crc32(buf: &[u8]) -> u32 {
    let t = table();
    let mut crc = !0u32;
    let mut chunks = buf.chunks_exact(16);
    for b in &mut chunks {
        let w = crc ^ u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        crc = t[15][(w & 0xff) as usize]
            ^ t[14][((w >> 8) & 0xff) as usize]
            ^ t[13][((w >> 16) & 0xff) as usize]
            ^ t[12][(w >> 24) as usize]
            ^ t[11][b[4] as usize]
            ^ t[10][b[5] as usize]
            ^ t[9][b[6] as usize]
            ^ t[8][b[7] as usize]
            ^ t[7][b[8] as usize]
            ^ t[6][b[9] as usize]
            ^ t[5][b[10] as usize]
            ^ t[4][b[11] as usize]
            ^ t[3][b[12] as usize]
            ^ t[2][b[13] as usize]
            ^ t[1][b[14] as usize]
            ^ t[0][b[15] as usize];
    }
    for &b in chunks.remainder() {
        crc = t[0][((crc as u8) ^ b) as usize] ^ (crc >> 8);
    }
    !crc
}

/// `data` as a gzip member: level 1, no name, mtime 0, XFL 4 (fastest), OS 255 (unknown).
pub fn encode(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() / 3 + 64);
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 255]);
    // The calls flate2's `GzEncoder` makes (raw deflate, level 1, 32 KiB output chunks, then
    // `Finish`), so that the stream is the same, block for block.
    let mut compressor: Box<CompressorOxide> = Box::default();
    compressor.set_format_and_level(DataFormat::Raw, 1);
    let mut chunk = vec![0u8; 32 * 1024];
    let mut input = data;
    // Deflating into memory fails only on a misuse of the compressor (a bug, not bad input):
    // stop with its status rather than loop on it.
    while !input.is_empty() {
        let res = deflate(&mut compressor, input, &mut chunk, MZFlush::None);
        if let Err(status) = res.status {
            panic!("deflate into memory failed: status {}", status as i32);
        }
        out.extend_from_slice(&chunk[..res.bytes_written]);
        input = &input[res.bytes_consumed..];
    }
    loop {
        let res = deflate(&mut compressor, &[], &mut chunk, MZFlush::Finish);
        out.extend_from_slice(&chunk[..res.bytes_written]);
        match res.status {
            Ok(MZStatus::StreamEnd) => break,
            Ok(_) => {}
            Err(status) => panic!("deflate into memory failed: status {}", status as i32),
        }
    }
    out.extend_from_slice(&crc32(data).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    /// The same bytes as flate2's gzip writer at level 1, on empty, tiny, random, repetitive
    /// and row-like inputs (one over 1 MiB).
    #[test]
    fn same_bytes_as_flate2() {
        let mut inputs: Vec<Vec<u8>> = vec![Vec::new(), b"a".to_vec(), b"hello world".to_vec()];
        let mut x = 12345u64;
        let mut big = Vec::new();
        for i in 0..300_000u32 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            big.push(if i % 7 == 0 {
                (x >> 33) as u8
            } else {
                b"abcdefgh,\"{}:0123"[(x >> 60) as usize]
            });
        }
        inputs.push(big);
        inputs.push(vec![0u8; 1 << 20]);
        inputs.push(
            (0..200_000u32)
                .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
                .collect(),
        );
        inputs.push(b"{\"id\":1,\"name\":\"x\"}\n".repeat(50_000));
        for input in inputs {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&input).unwrap();
            assert_eq!(
                e.finish().unwrap(),
                super::encode(&input),
                "len {}",
                input.len()
            );
        }
    }
}
