//! The cluster map's binary encoding (layout in `docs/design/placement.md`).
//!
//! ```text
//! offset  size  field
//!      0     4  magic "OKVM"
//!      4     2  format version (u16): 1 or 2, the same layout; it names the map's key hashing
//!               (1: whole keys, 2: database-blind, see `KeyHashing`)
//!      6     2  replication factor R (u16)
//!      8     8  epoch (u64)
//!     16     4  node count N (u32)
//!     20     4  shard count S (u32)
//!     24   8·N  node ids (u64 each), strictly ascending
//!      …        S shards: id (u64), replica count (u16, = R), replica node ids (u64 each), primary first
//!    end−4   4  CRC-32C of every byte before it (u32)
//! ```
//! All integers little endian.

use crate::{ClusterMap, KeyHashing, MAX_REPLICAS, MAX_SHARDS, PlacementError, ShardPlacement};

/// First four bytes of an encoded map.
pub const MAGIC: [u8; 4] = *b"OKVM";
/// The encoding's newest format version (a new cluster's maps); this release reads 1 and 2.
pub const FORMAT_VERSION: u16 = 2;

/// The format version that records `hashing` (the layouts are the same).
fn version_of(hashing: KeyHashing) -> u16 {
    match hashing {
        KeyHashing::WholeKey => 1,
        KeyHashing::DatabaseBlind => 2,
    }
}

const HEADER: usize = 24;
const CHECKSUM: usize = 4;

impl ClusterMap {
    /// The map's binary encoding: versioned, CRC-32C-checksummed, every integer little endian with an
    /// explicit width. A map that fails [`Self::validate`] is written as it is and will not decode.
    pub fn encode(&self) -> Vec<u8> {
        let r = self.replication_factor();
        let mut out = Vec::with_capacity(
            HEADER + 8 * self.nodes.len() + self.shards.len() * (10 + 8 * r as usize) + CHECKSUM,
        );
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&version_of(self.key_hashing).to_le_bytes());
        out.extend_from_slice(&saturate_u16(r as usize).to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&saturate_u32(self.nodes.len()).to_le_bytes());
        out.extend_from_slice(&saturate_u32(self.shards.len()).to_le_bytes());
        for node in &self.nodes {
            out.extend_from_slice(&node.to_le_bytes());
        }
        for shard in &self.shards {
            out.extend_from_slice(&shard.id.to_le_bytes());
            out.extend_from_slice(&saturate_u16(shard.replicas.len()).to_le_bytes());
            for node in &shard.replicas {
                out.extend_from_slice(&node.to_le_bytes());
            }
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes an encoded map and checks it (see [`Self::validate`]). Never panics, and allocates no
    /// more than the input's length justifies.
    pub fn decode(bytes: &[u8]) -> Result<ClusterMap, PlacementError> {
        let len = bytes.len();
        if len < HEADER + CHECKSUM {
            return Err(PlacementError::Truncated { offset: 0, needed: HEADER + CHECKSUM, len });
        }
        let mut magic = [0u8; 4];
        magic.copy_from_slice(&bytes[..4]);
        if magic != MAGIC {
            return Err(PlacementError::BadMagic(magic));
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        let key_hashing = match version {
            1 => KeyHashing::WholeKey,
            2 => KeyHashing::DatabaseBlind,
            _ => return Err(PlacementError::UnsupportedVersion(version)),
        };
        let (body, tail) = bytes.split_at(len - CHECKSUM);
        let stored = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
        let computed = crc32c::crc32c(body);
        if stored != computed {
            return Err(PlacementError::ChecksumMismatch { stored, computed });
        }
        let mut c = Cursor { bytes: body, at: 6, len };
        let replicas = c.u16()?;
        let epoch = c.u64()?;
        let node_count = c.u32()? as usize;
        let shard_count = c.u32()?;
        if epoch == 0 {
            return Err(PlacementError::ZeroEpoch);
        }
        if shard_count == 0 || shard_count > MAX_SHARDS {
            return Err(PlacementError::InvalidShardCount(shard_count));
        }
        if replicas == 0 || u32::from(replicas) > MAX_REPLICAS || usize::from(replicas) > node_count {
            return Err(PlacementError::InvalidReplicaCount {
                replicas: u32::from(replicas),
                nodes: node_count,
            });
        }
        c.need(node_count.saturating_mul(8))?;
        let nodes = (0..node_count).map(|_| c.u64()).collect::<Result<Vec<_>, _>>()?;
        let mut shards = Vec::with_capacity(shard_count as usize);
        for _ in 0..shard_count {
            let id = c.u64()?;
            let count = usize::from(c.u16()?);
            if count != usize::from(replicas) {
                return Err(PlacementError::ReplicaCountMismatch {
                    shard: id,
                    count,
                    expected: usize::from(replicas),
                });
            }
            let list = (0..count).map(|_| c.u64()).collect::<Result<Vec<_>, _>>()?;
            shards.push(ShardPlacement { id, replicas: list });
        }
        if c.at != body.len() {
            return Err(PlacementError::TrailingBytes(body.len() - c.at));
        }
        let map = ClusterMap { epoch, nodes, shards, key_hashing };
        map.validate()?;
        Ok(map)
    }
}

fn saturate_u16(n: usize) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

fn saturate_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Reads little-endian integers from the checksummed body.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
    /// Length of the whole input (for error messages).
    len: usize,
}

impl Cursor<'_> {
    fn need(&self, needed: usize) -> Result<(), PlacementError> {
        if self.bytes.len() - self.at < needed {
            return Err(PlacementError::Truncated { offset: self.at, needed, len: self.len });
        }
        Ok(())
    }

    fn take<const W: usize>(&mut self) -> Result<[u8; W], PlacementError> {
        self.need(W)?;
        let mut out = [0u8; W];
        out.copy_from_slice(&self.bytes[self.at..self.at + W]);
        self.at += W;
        Ok(out)
    }

    fn u16(&mut self) -> Result<u16, PlacementError> {
        self.take().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, PlacementError> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, PlacementError> {
        self.take().map(u64::from_le_bytes)
    }
}
