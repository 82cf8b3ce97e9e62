//! Segment files: their names and the header each one starts with.
//!
//! A segment is one file holding a contiguous stretch of the log's address space. Its name is its base
//! position as 20 decimal digits (so names sort like positions) with the extension `.seg`; byte `o` of
//! the file is log position `base + o`. The file starts with a 32-byte header, then whole records.
//! Records never span segments.
//!
//! ```text
//! offset  size  field
//!      0     4  magic        b"OKSG"
//!      4     2  version      u16, 2 (version 1, read but no longer written, has no salt: 0)
//!      6     2  header_len   u16, 32
//!      8     8  base         u64, the segment's first position (equals the file name)
//!     16     2  salt         u16, never 0 in version 2; every record of the segment carries it
//!     18    10  reserved     zero
//!     28     4  crc          u32, CRC-32C over bytes 0..28
//! ```
//!
//! The salt is what makes recycled files safe: a reclaimed segment's file may be renamed to a
//! *free* name (`<old base>.free`) and later become a new segment, keeping its old bytes after the
//! new header. Records carry their segment's salt, so a record left from the file's earlier use
//! fails the salt check before its checksum is even computed (and its checksum, seeded with its old
//! position, would fail too). The salt is derived from the base, so two uses of one file differ in
//! salt unless two 16-bit hashes collide, and then the position-seeded checksum still tells them
//! apart (the salt's hash is not a CRC, so the two checks fail independently).
//!
//! This module is pure: it encodes and checks headers and names, and does no I/O.

/// First four bytes of every segment file.
pub const SEGMENT_MAGIC: [u8; 4] = *b"OKSG";
/// Bytes before the first record of a segment.
pub const SEGMENT_HEADER_LEN: usize = 32;
/// The format version this code writes; it reads this one and version 1.
pub const FORMAT_VERSION: u16 = 2;
/// The version before salts: its records carry salt 0.
const UNSALTED_VERSION: u16 = 1;
const EXTENSION: &str = ".seg";
/// Extension of a reclaimed segment's file kept for reuse.
const FREE_EXTENSION: &str = ".free";

/// The file name of the segment whose first position is `base`.
pub fn file_name(base: u64) -> String {
    format!("{base:020}{EXTENSION}")
}

/// The base position named by a segment file name, or `None` for any other file.
pub fn parse_file_name(name: &str) -> Option<u64> {
    parse_digits(name.strip_suffix(EXTENSION)?)
}

/// The name a reclaimed segment's file is kept under while it waits for reuse: its old base, so
/// names never collide.
pub fn free_file_name(old_base: u64) -> String {
    format!("{old_base:020}{FREE_EXTENSION}")
}

/// The old base named by a free file's name, or `None` for any other file.
pub fn parse_free_file_name(name: &str) -> Option<u64> {
    parse_digits(name.strip_suffix(FREE_EXTENSION)?)
}

fn parse_digits(digits: &str) -> Option<u64> {
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The salt of the segment starting at `base`: 16 bits of the base mixed with splitmix64's
/// finalizer, never 0. Not a CRC: the record checksum is CRC-32C, linear in the position, and a
/// salt from the same family could collide exactly where the checksums also agree.
pub fn salt_for(base: u64) -> u16 {
    let mut z = base.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    match (z ^ (z >> 16) ^ (z >> 32) ^ (z >> 48)) as u16 {
        0 => 1,
        salt => salt,
    }
}

/// The header of the segment starting at `base`, with its salt.
pub fn encode_header(base: u64) -> [u8; SEGMENT_HEADER_LEN] {
    let mut h = [0u8; SEGMENT_HEADER_LEN];
    h[0..4].copy_from_slice(&SEGMENT_MAGIC);
    h[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[6..8].copy_from_slice(&(SEGMENT_HEADER_LEN as u16).to_le_bytes());
    h[8..16].copy_from_slice(&base.to_le_bytes());
    h[16..18].copy_from_slice(&salt_for(base).to_le_bytes());
    let crc = crc32c::crc32c(&h[..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Why a segment header was rejected.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum HeaderError {
    /// Fewer bytes than a header: the file was cut short while being created.
    #[error("segment header is incomplete")]
    Incomplete,
    /// Magic or checksum wrong.
    #[error("segment header is damaged")]
    Damaged,
    /// A well-formed header from a format this code does not know.
    #[error(
        "segment format version {0} is not supported (this build reads {UNSALTED_VERSION} and {FORMAT_VERSION})"
    )]
    UnsupportedVersion(u16),
    /// The header names a different base than the file name.
    #[error("segment header says base {found}, file name says {expected}")]
    BaseMismatch {
        /// Base from the file name.
        expected: u64,
        /// Base from the header.
        found: u64,
    },
}

/// Checks that `bytes` start with the header of the segment at `expected_base`; returns the salt its
/// records carry.
pub fn check_header(bytes: &[u8], expected_base: u64) -> Result<u16, HeaderError> {
    let Some(h) = bytes.get(..SEGMENT_HEADER_LEN) else {
        return Err(HeaderError::Incomplete);
    };
    let stored = u32::from_le_bytes([h[28], h[29], h[30], h[31]]);
    if h[0..4] != SEGMENT_MAGIC || crc32c::crc32c(&h[..28]) != stored {
        return Err(HeaderError::Damaged);
    }
    let version = u16::from_le_bytes([h[4], h[5]]);
    let header_len = u16::from_le_bytes([h[6], h[7]]);
    if !(version == FORMAT_VERSION || version == UNSALTED_VERSION)
        || usize::from(header_len) != SEGMENT_HEADER_LEN
    {
        return Err(HeaderError::UnsupportedVersion(version));
    }
    let found = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
    if found != expected_base {
        return Err(HeaderError::BaseMismatch { expected: expected_base, found });
    }
    let salt = u16::from_le_bytes([h[16], h[17]]);
    match (version, salt) {
        (FORMAT_VERSION, 0) => Err(HeaderError::Damaged),
        (FORMAT_VERSION, salt) => Ok(salt),
        _ if h[16..28].iter().any(|&b| b != 0) => Err(HeaderError::Damaged),
        _ => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_like_positions() {
        assert_eq!(file_name(42), "00000000000000000042.seg");
        assert_eq!(parse_file_name(&file_name(u64::MAX)), Some(u64::MAX));
        assert!(file_name(9) < file_name(10));
        assert_eq!(parse_file_name("42.seg"), None);
        assert_eq!(parse_file_name("0000000000000000004x.seg"), None);
        assert_eq!(parse_file_name("00000000000000000042.tmp"), None);
        assert_eq!(parse_free_file_name(&free_file_name(42)), Some(42));
        assert_eq!(parse_free_file_name(&file_name(42)), None);
        assert_eq!(parse_file_name(&free_file_name(42)), None);
    }

    #[test]
    fn salts_are_never_zero_and_spread() {
        let salts: std::collections::HashSet<u16> = (0..1000u64).map(|i| salt_for(i << 26)).collect();
        assert!(!salts.contains(&0));
        assert!(salts.len() > 980, "{} distinct salts of 1000", salts.len());
    }

    #[test]
    fn version_one_headers_still_read_with_salt_zero() {
        let mut h = encode_header(4096);
        h[4..6].copy_from_slice(&1u16.to_le_bytes());
        h[16..18].fill(0);
        let crc = crc32c::crc32c(&h[..28]);
        h[28..32].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(check_header(&h, 4096), Ok(0));
        assert_eq!(check_header(&encode_header(4096), 4096), Ok(salt_for(4096)));
    }

    #[test]
    fn header_round_trip_and_every_flip_detected() {
        let h = encode_header(1 << 40);
        assert_eq!(check_header(&h, 1 << 40), Ok(salt_for(1 << 40)));
        assert_eq!(check_header(&h, 7), Err(HeaderError::BaseMismatch { expected: 7, found: 1 << 40 }));
        assert_eq!(check_header(&h[..31], 1 << 40), Err(HeaderError::Incomplete));
        for i in 0..SEGMENT_HEADER_LEN {
            let mut bad = h;
            bad[i] ^= 0x20;
            assert_eq!(check_header(&bad, 1 << 40), Err(HeaderError::Damaged), "byte {i}");
        }
    }
}
