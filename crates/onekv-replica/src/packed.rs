//! Compressed blocks of small values: the form the log GC gives values below its threshold when it
//! moves them (a PACKED record, `records`), and how a read gets one value back out.
//!
//! A block is the key-value pairs of several moved values in the snapshot-pairs format (each value
//! keeps its own `crc32c || bytes`, so damage stays detectable after a move), LZ4-compressed as one
//! unit. In the log it is framed as
//!
//! ```text
//! block = raw_len:u32 packed_len:u32 crc32c(packed):u32 packed
//! ```
//!
//! where `packed` is the LZ4 block of the `raw_len` raw bytes, or the raw bytes themselves when
//! compressing did not make them smaller (`packed_len == raw_len`). The index points at a value
//! with [`onekv_index::Packed`]: the block's bytes in the log and the value's range in the raw
//! block. A read preads the whole block, checks its CRC, decompresses it and checks the value's.
//!
//! What this module does not own: which values are packed and when (the collector, `gc`), the
//! record around the blocks (`records`).

use crate::codec::{CodecError, STORED_VALUE_PREFIX};
use crate::records;

/// Bytes of a block's frame before its data.
pub const BLOCK_HEADER: usize = 12;

/// Raw bytes the collector gathers into one block before starting the next: a read of one value
/// reads and decompresses its whole block, so blocks stay small.
pub const TARGET_BLOCK_BYTES: usize = 16 << 10;

/// Most raw bytes a block may claim. Every block the collector writes is far smaller (values below
/// the threshold, whose maximum is [`MAX_COMPRESS_BELOW`], plus one key); a larger claim is damage,
/// and is refused before anything is allocated for it.
pub const MAX_BLOCK_BYTES: usize = 1 << 20;

/// The largest value-size threshold below which the collector packs values.
pub const MAX_COMPRESS_BELOW: u64 = 64 << 10;

/// Frames `raw` (whole pairs) as one block, compressed when that makes it smaller, onto `out`.
pub fn push_block(out: &mut Vec<u8>, raw: &[u8]) {
    debug_assert!(raw.len() <= MAX_BLOCK_BYTES, "blocks are built far below the limit");
    let compressed = lz4_flex::block::compress(raw);
    let packed = if compressed.len() < raw.len() { &compressed[..] } else { raw };
    out.extend_from_slice(&(raw.len() as u32).to_le_bytes());
    out.extend_from_slice(&(packed.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(packed).to_le_bytes());
    out.extend_from_slice(packed);
}

/// The raw bytes of one framed block (exactly its frame, as a block locator reads it): its CRC is
/// checked before it is decompressed, and the output must have the length the frame claims.
pub fn unpack(block: &[u8]) -> Result<Vec<u8>, CodecError> {
    let (raw_len, packed) = split_frame(block)?;
    if packed.len() != block.len() - BLOCK_HEADER {
        return Err(CodecError("a block has bytes after its data"));
    }
    if packed.len() == raw_len {
        return Ok(packed.to_vec());
    }
    let raw = lz4_flex::block::decompress(packed, raw_len)
        .map_err(|_| CodecError("a block does not decompress"))?;
    if raw.len() != raw_len {
        return Err(CodecError("a block decompressed to another length than its frame says"));
    }
    Ok(raw)
}

/// The stored value (`crc32c || bytes`, checked) at `offset..offset + len` of a raw block.
pub fn stored_value(raw: &[u8], offset: u32, len: u32) -> Result<&[u8], CodecError> {
    let (offset, len) = (offset as usize, len as usize);
    let stored = raw.get(offset..offset + len).ok_or(CodecError("a packed value lies outside its block"))?;
    if stored.len() < STORED_VALUE_PREFIX {
        return Err(CodecError("a packed value is shorter than its checksum"));
    }
    Ok(stored)
}

/// Checks a frame's header and CRC; returns the raw length and the packed data.
fn split_frame(block: &[u8]) -> Result<(usize, &[u8]), CodecError> {
    if block.len() < BLOCK_HEADER {
        return Err(CodecError("a block is shorter than its frame"));
    }
    let word = |at: usize| u32::from_le_bytes(block[at..at + 4].try_into().expect("4 bytes")) as usize;
    let (raw_len, packed_len, crc) = (word(0), word(4), word(8) as u32);
    if raw_len > MAX_BLOCK_BYTES || packed_len > raw_len {
        return Err(CodecError("a block claims more bytes than a block may hold"));
    }
    let packed =
        block.get(BLOCK_HEADER..BLOCK_HEADER + packed_len).ok_or(CodecError("a block is cut short"))?;
    if crc32c::crc32c(packed) != crc {
        return Err(CodecError("a block does not match its checksum"));
    }
    Ok((raw_len, packed))
}

/// The blocks of a PACKED payload, in order: each one's span in the payload (its whole frame).
pub fn blocks(payload: &[u8]) -> Result<Vec<std::ops::Range<usize>>, CodecError> {
    let mut at = records::PACKED_HEADER;
    let mut spans = Vec::new();
    while at < payload.len() {
        let (_, packed) = split_frame(&payload[at..])?;
        let end = at + BLOCK_HEADER + packed.len();
        spans.push(at..end);
        at = end;
    }
    if at != payload.len() || spans.is_empty() {
        return Err(CodecError("a packed record is not a sequence of blocks"));
    }
    Ok(spans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec;

    fn pairs(values: &[(&[u8], Vec<u8>)]) -> Vec<u8> {
        let mut raw = Vec::new();
        for (key, value) in values {
            records::push_stored_pair(&mut raw, key, &codec::stored_value(value));
        }
        raw
    }

    #[test]
    fn blocks_round_trip_compressed_or_raw() {
        let compressible = pairs(&[(b"a", vec![7; 300]), (b"b", b"x".repeat(200))]);
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let random: Vec<u8> = (0..4096)
            .map(|_| {
                // xorshift64: bytes LZ4 cannot shrink.
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 32) as u8
            })
            .collect();
        let incompressible = pairs(&[(b"r", random)]);
        let mut payload = 9u64.to_le_bytes().to_vec();
        push_block(&mut payload, &compressible);
        push_block(&mut payload, &incompressible);
        let spans = blocks(&payload).unwrap();
        assert_eq!(spans.len(), 2);
        assert!(spans[0].len() < compressible.len() / 4, "runs of one byte compress");
        assert_eq!(spans[1].len(), BLOCK_HEADER + incompressible.len(), "no gain: stored raw");
        assert_eq!(unpack(&payload[spans[0].clone()]).unwrap(), compressible);
        assert_eq!(unpack(&payload[spans[1].clone()]).unwrap(), incompressible);

        // A value is found in the raw block by its span, checksum included.
        let raw = unpack(&payload[spans[0].clone()]).unwrap();
        let (key, span, _) = records::SnapshotPairs::new(&raw).nth(1).unwrap().unwrap();
        assert_eq!(key, b"b");
        let stored = stored_value(&raw, span.offset as u32, span.len as u32).unwrap();
        assert_eq!(codec::verify_stored_value(stored).unwrap(), &b"x".repeat(200)[..]);
        assert!(stored_value(&raw, span.offset as u32, raw.len() as u32).is_err());
    }

    #[test]
    fn damaged_blocks_are_refused_never_panic() {
        let raw = pairs(&[(b"k", vec![1; 1000])]);
        let mut framed = Vec::new();
        push_block(&mut framed, &raw);
        for at in 0..framed.len() {
            let mut bad = framed.clone();
            bad[at] ^= 0x40;
            // Any change to the frame or data is refused, or (a flipped length claim that still
            // frames the same bytes cannot exist) decodes to something else than the original.
            assert!(unpack(&bad).map_or(true, |out| out != raw), "a flip at {at} went unnoticed");
        }
        assert!(unpack(&framed[..framed.len() - 1]).is_err());
        assert!(unpack(&framed[..5]).is_err());
        let mut huge = framed.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(unpack(&huge).is_err(), "a claim beyond the block limit");
        let mut payload = 1u64.to_le_bytes().to_vec();
        assert!(blocks(&payload).is_err(), "a record without blocks");
        payload.extend_from_slice(&framed);
        payload.push(0);
        assert!(blocks(&payload).is_err(), "trailing bytes");
    }
}
