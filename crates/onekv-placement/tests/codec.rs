//! The map's encoding: round trip, refusals, and no panics on any input.

use onekv_placement::{ClusterMap, FORMAT_VERSION, KeyHashing, PlacementError};

/// SplitMix64: a small seeded generator for the property-style tests.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Re-encodes a (possibly invalid) map, so a test can check decode's semantic checks behind a
/// valid checksum.
fn reencoded(map: &ClusterMap) -> Vec<u8> {
    map.encode()
}

fn sample() -> ClusterMap {
    ClusterMap::build(&[4, 8, 15, 16, 23], 64, 3).unwrap().with_node_added(42).unwrap()
}

#[test]
fn round_trip() {
    for map in [
        sample(),
        ClusterMap::build(&[1], 1, 1).unwrap(),
        ClusterMap::build(&(1..=7).collect::<Vec<_>>(), 1024, 7).unwrap(),
        ClusterMap::build(&[u64::MAX, 1], 3, 2).unwrap(),
    ] {
        let bytes = map.encode();
        assert_eq!(ClusterMap::decode(&bytes), Ok(map.clone()));
        assert_eq!(ClusterMap::decode(&bytes).unwrap().encode(), bytes);
    }
}

/// A map written before key hashing was recorded (format version 1) still reads, hashes whole keys
/// as it always did, keeps that rule through a membership change, and is written as version 1
/// again: an existing cluster's keys never move.
#[test]
fn a_version_1_map_keeps_hashing_whole_keys() {
    let mut map = sample();
    map.key_hashing = KeyHashing::WholeKey;
    let bytes = map.encode();
    assert_eq!(&bytes[4..6], &1u16.to_le_bytes());
    let read = ClusterMap::decode(&bytes).unwrap();
    assert_eq!(read.key_hashing, KeyHashing::WholeKey);
    let db3_foo = [0xFF, 0xFF, 3, b'f', b'o', b'o'];
    assert_eq!(
        read.shard_of_key(&db3_foo),
        onekv_placement::shard_of_key(&db3_foo, 64, KeyHashing::WholeKey)
    );
    let grown = read.with_node_added(99).unwrap();
    assert_eq!(grown.key_hashing, KeyHashing::WholeKey);
    assert_eq!(&grown.encode()[4..6], &1u16.to_le_bytes());
    // A new map puts the key where database 0's "foo" is.
    let new = sample();
    assert_eq!(new.key_hashing, KeyHashing::DatabaseBlind);
    assert_eq!(new.shard_of_key(&db3_foo), new.shard_of_key(b"foo"));
}

#[test]
fn layout_is_pinned() {
    let map = ClusterMap::build(&[1, 2], 1, 2).unwrap();
    let bytes = map.encode();
    assert_eq!(&bytes[..4], b"OKVM");
    assert_eq!(&bytes[4..6], &2u16.to_le_bytes()); // a new map hashes keys database-blind
    assert_eq!(&bytes[6..8], &2u16.to_le_bytes()); // R
    assert_eq!(&bytes[8..16], &1u64.to_le_bytes()); // epoch
    assert_eq!(&bytes[16..20], &2u32.to_le_bytes()); // nodes
    assert_eq!(&bytes[20..24], &1u32.to_le_bytes()); // shards
    assert_eq!(&bytes[24..40], &[1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&bytes[40..48], &1u64.to_le_bytes()); // shard id
    assert_eq!(&bytes[48..50], &2u16.to_le_bytes()); // replica count
    assert_eq!(bytes.len(), 50 + 16 + 4);
    let crc = crc32c::crc32c(&bytes[..bytes.len() - 4]);
    assert_eq!(&bytes[bytes.len() - 4..], &crc.to_le_bytes());
}

#[test]
fn refuses_truncation() {
    let bytes = sample().encode();
    for len in 0..bytes.len() {
        assert!(ClusterMap::decode(&bytes[..len]).is_err(), "decoded a {len}-byte prefix");
    }
    assert!(matches!(ClusterMap::decode(&bytes[..10]), Err(PlacementError::Truncated { .. })));
}

#[test]
fn refuses_any_flipped_byte() {
    let bytes = sample().encode();
    for i in 0..bytes.len() {
        for bit in [0x01, 0x80] {
            let mut bad = bytes.clone();
            bad[i] ^= bit;
            assert!(ClusterMap::decode(&bad).is_err(), "flipped byte {i} bit {bit:#x} decoded");
        }
    }
    let mut bad = bytes.clone();
    bad[30] ^= 1; // a node id byte, so the checksum is the first check to fail
    assert!(matches!(ClusterMap::decode(&bad), Err(PlacementError::ChecksumMismatch { .. })));
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(ClusterMap::decode(&longer).is_err());
}

#[test]
fn refuses_wrong_version_and_magic() {
    let mut bytes = sample().encode();
    bytes[4..6].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    assert_eq!(ClusterMap::decode(&bytes), Err(PlacementError::UnsupportedVersion(3)));
    let mut bytes = sample().encode();
    bytes[4..6].copy_from_slice(&0u16.to_le_bytes());
    assert!(matches!(ClusterMap::decode(&bytes), Err(PlacementError::UnsupportedVersion(0))));
    let mut bytes = sample().encode();
    bytes[0] = b'X';
    assert!(matches!(ClusterMap::decode(&bytes), Err(PlacementError::BadMagic(_))));
}

#[test]
fn refuses_invalid_maps_behind_a_valid_checksum() {
    use PlacementError::*;
    let good = sample();

    let mut m = good.clone();
    m.shards.swap(3, 4);
    assert_eq!(ClusterMap::decode(&reencoded(&m)), Err(ShardOutOfOrder { index: 3, id: 5, expected: 4 }));

    let mut m = good.clone();
    m.shards[7].replicas[2] = m.shards[7].replicas[0];
    let node = m.shards[7].replicas[0];
    assert_eq!(ClusterMap::decode(&reencoded(&m)), Err(DuplicateReplica { shard: 8, node }));

    let mut m = good.clone();
    m.shards[9].replicas[1] = 99;
    assert_eq!(ClusterMap::decode(&reencoded(&m)), Err(UnknownReplica { shard: 10, node: 99 }));

    let mut m = good.clone();
    m.shards[2].replicas.pop();
    assert_eq!(
        ClusterMap::decode(&reencoded(&m)),
        Err(ReplicaCountMismatch { shard: 3, count: 2, expected: 3 })
    );

    let mut m = good.clone();
    m.nodes.swap(0, 1);
    assert!(matches!(ClusterMap::decode(&reencoded(&m)), Err(NodesNotSorted { index: 1, .. })));

    let mut m = good.clone();
    m.nodes.insert(0, 0);
    assert_eq!(ClusterMap::decode(&reencoded(&m)), Err(ZeroNodeId));

    let mut m = good.clone();
    m.epoch = 0;
    assert_eq!(ClusterMap::decode(&reencoded(&m)), Err(ZeroEpoch));

    let mut m = good.clone();
    m.shards.clear();
    assert_eq!(ClusterMap::decode(&reencoded(&m)), Err(InvalidShardCount(0)));

    let mut m = ClusterMap::build(&[1, 2], 4, 2).unwrap();
    m.nodes.pop();
    assert_eq!(ClusterMap::decode(&reencoded(&m)), Err(InvalidReplicaCount { replicas: 2, nodes: 1 }));
}

/// Seals `body` with a valid checksum.
fn sealed(mut body: Vec<u8>) -> Vec<u8> {
    let crc = crc32c::crc32c(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    body
}

#[test]
fn huge_counts_do_not_allocate_or_panic() {
    // A header announcing u32::MAX nodes, with a valid checksum: refused as truncated.
    let mut body = Vec::new();
    body.extend_from_slice(b"OKVM");
    body.extend_from_slice(&1u16.to_le_bytes());
    body.extend_from_slice(&3u16.to_le_bytes());
    body.extend_from_slice(&1u64.to_le_bytes());
    body.extend_from_slice(&u32::MAX.to_le_bytes());
    body.extend_from_slice(&16u32.to_le_bytes());
    assert!(matches!(ClusterMap::decode(&sealed(body)), Err(PlacementError::Truncated { .. })));
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(0x5eed);
    let valid = sample().encode();
    for i in 0..20_000 {
        let bytes: Vec<u8> = match i % 4 {
            // Pure noise.
            0 => (0..rng.below(200)).map(|_| rng.next() as u8).collect(),
            // A valid header and checksum around noise, so decode gets past the first checks.
            1 => {
                let mut b = valid[..24].to_vec();
                b.extend((0..rng.below(300)).map(|_| rng.next() as u8));
                sealed(b)
            }
            // A valid map with a few bytes changed, resealed.
            2 => {
                let mut b = valid[..valid.len() - 4].to_vec();
                for _ in 0..1 + rng.below(4) {
                    let at = rng.below(b.len() as u64) as usize;
                    b[at] = rng.next() as u8;
                }
                sealed(b)
            }
            // A valid map cut or extended, resealed.
            _ => {
                let mut b = valid[..valid.len() - 4].to_vec();
                let cut = rng.below(b.len() as u64) as usize;
                b.truncate(cut);
                b.extend((0..rng.below(20)).map(|_| rng.next() as u8));
                sealed(b)
            }
        };
        if let Ok(map) = ClusterMap::decode(&bytes) {
            map.validate().unwrap();
            assert_eq!(map.encode(), bytes);
        }
    }
}
