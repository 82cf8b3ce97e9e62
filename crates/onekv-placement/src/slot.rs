//! Key → hash slot → shard.

use std::ops::Range;

use crate::{HASH_SLOTS, MAX_SHARDS, ShardId};

const CRC16: crc::Crc<u16> = crc::Crc::<u16>::new(&crc::CRC_16_XMODEM);

/// Redis Cluster's key hash: CRC16 (XMODEM) of the key, or of its `{hash tag}` when the key has a
/// non-empty one (the bytes between the first `{` and the first `}` after it), mod 16384. Equals
/// Redis's `CLUSTER KEYSLOT`.
pub fn hash_slot(key: &[u8]) -> u16 {
    let hashed = hash_tag(key).unwrap_or(key);
    CRC16.checksum(hashed) % HASH_SLOTS
}

/// The non-empty hash tag of `key`, if it has one.
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let rest = &key[open + 1..];
    let close = rest.iter().position(|&b| b == b'}')?;
    (close > 0).then(|| &rest[..close])
}

/// How a cluster map hashes keys to slots. Recorded in the map (its format version), because
/// changing it would move keys between shards on a live cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KeyHashing {
    /// [`hash_slot`] of the whole key: maps of format version 1 (clusters created before
    /// databases hashed alike).
    WholeKey,
    /// [`hash_slot`] of the key without its Redis database prefix ([`DATABASE_PREFIX`] and a
    /// database number `1..DATABASES`), so a key lies in the same slot in every database and
    /// `MOVE`, `COPY ... DB` or a transaction over several databases stays in one shard. Other keys
    /// hash whole. Maps of format version 2; what [`crate::ClusterMap::build`] makes (a server
    /// sets its map's rule from its `cluster.key_hashing`; `onekv cluster start` chooses this one).
    #[default]
    DatabaseBlind,
}

/// The first bytes of every key of Redis databases 1 to 15 (database 0 is the plain key space):
/// database n's key `k` is stored as `FF FF n k`.
pub const DATABASE_PREFIX: [u8; 2] = [0xFF, 0xFF];
/// The Redis databases a connection can SELECT: 0 to 15, as Redis's default `databases 16`.
pub const DATABASES: u8 = 16;

impl KeyHashing {
    /// The slot of `key` under this rule.
    pub fn slot(self, key: &[u8]) -> u16 {
        match self {
            KeyHashing::WholeKey => hash_slot(key),
            KeyHashing::DatabaseBlind => hash_slot(without_database(key)),
        }
    }
}

/// `key` without its database prefix, when it has one (`FF FF n` with n in `1..DATABASES`).
fn without_database(key: &[u8]) -> &[u8] {
    match key.strip_prefix(&DATABASE_PREFIX[..]) {
        Some([db, rest @ ..]) if (1..DATABASES).contains(db) => rest,
        _ => key,
    }
}

/// Clamps a shard count into `1..=MAX_SHARDS` (the routing functions do not fail).
fn clamp_shards(shards: u32) -> u32 {
    shards.clamp(1, MAX_SHARDS)
}

/// The shard that owns `slot` when the slots are split into `shards` contiguous, near-equal ranges:
/// `1 + slot * shards / 16384`. `slot` is taken mod 16384 and `shards` is clamped into
/// `1..=MAX_SHARDS` (a valid map never passes anything else).
pub fn shard_of_slot(slot: u16, shards: u32) -> ShardId {
    let slot = u64::from(slot % HASH_SLOTS);
    1 + slot * u64::from(clamp_shards(shards)) / u64::from(HASH_SLOTS)
}

/// The shard that owns `key` among `shards` under `hashing`: [`shard_of_slot`] of its slot.
pub fn shard_of_key(key: &[u8], shards: u32, hashing: KeyHashing) -> ShardId {
    shard_of_slot(hashing.slot(key), shards)
}

/// The slots `shard` owns (the inverse of [`shard_of_slot`]): an empty range when `shard` is not in
/// `1..=shards`. `shards` is clamped as in [`shard_of_slot`].
pub fn slots_of_shard(shard: ShardId, shards: u32) -> Range<u16> {
    let shards = u64::from(clamp_shards(shards));
    if shard == 0 || shard > shards {
        return 0..0;
    }
    // The first slot s with s * shards / 16384 >= k is ceil(k * 16384 / shards).
    let first = |k: u64| (k * u64::from(HASH_SLOTS)).div_ceil(shards) as u16;
    first(shard - 1)..first(shard)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_slots_match_redis() {
        // Values from Redis's CLUSTER KEYSLOT.
        assert_eq!(hash_slot(b"foo"), 12182);
        assert_eq!(hash_slot(b"bar"), 5061);
        assert_eq!(hash_slot(b"123456789"), 12739); // CRC-16/XMODEM check value 0x31C3
        assert_eq!(hash_slot(b""), 0);
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"{user1000}.followers"));
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
        // An empty tag does not count: the whole key is hashed.
        assert_eq!(hash_slot(b"foo{}{bar}"), CRC16.checksum(b"foo{}{bar}") % 16384);
        assert_ne!(hash_slot(b"foo{}{bar}"), hash_slot(b"bar"));
        // The tag ends at the first '}' after the first '{'.
        assert_eq!(hash_slot(b"foo{{bar}}zap"), hash_slot(b"{bar"));
        assert_eq!(hash_slot(b"foo{bar}{zap}"), hash_slot(b"bar"));
        // No closing brace: the whole key.
        assert_eq!(hash_slot(b"foo{bar"), CRC16.checksum(b"foo{bar") % 16384);
    }

    #[test]
    fn slot_ranges_are_contiguous_and_near_equal() {
        for shards in [1, 2, 3, 5, 7, 16, 100, 1000, 1024] {
            let mut next = 0u16;
            let mut sizes = Vec::new();
            for shard in 1..=u64::from(shards) {
                let range = slots_of_shard(shard, shards);
                assert_eq!(range.start, next, "shards={shards} shard={shard}");
                for slot in [range.start, range.end - 1] {
                    assert_eq!(shard_of_slot(slot, shards), shard);
                }
                sizes.push(range.len());
                next = range.end;
            }
            assert_eq!(next, HASH_SLOTS);
            let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(max - min <= 1, "shards={shards}: sizes {min}..={max}");
        }
        assert_eq!(shard_of_slot(0, 16), 1);
        assert_eq!(shard_of_slot(16383, 16), 16);
        assert_eq!(shard_of_slot(1023, 16), 1);
        assert_eq!(shard_of_slot(1024, 16), 2);
        assert_eq!(slots_of_shard(0, 16), 0..0);
        assert_eq!(slots_of_shard(17, 16), 0..0);
        assert_eq!(shard_of_key(b"foo", 16, KeyHashing::WholeKey), 1 + 12182 * 16 / 16384);
    }

    #[test]
    fn database_blind_hashing_puts_a_key_in_the_same_slot_in_every_database() {
        let blind = KeyHashing::DatabaseBlind;
        for db in 1..DATABASES {
            let stored = [&DATABASE_PREFIX[..], &[db], b"foo"].concat();
            assert_eq!(blind.slot(&stored), 12182, "database {db}");
            assert_ne!(KeyHashing::WholeKey.slot(&stored), 12182, "database {db} hashed whole");
        }
        assert_eq!(blind.slot(b"foo"), 12182);
        // Not a database: FF FF 0, FF FF 16 and a lone FF FF hash whole.
        for key in [&[0xFF, 0xFF, 0, b'f'][..], &[0xFF, 0xFF, 16, b'f'], &[0xFF, 0xFF], b"\xffonekv/members"]
        {
            assert_eq!(blind.slot(key), hash_slot(key), "{key:?}");
        }
        // The hash tag counts after the prefix, as in database 0.
        let tagged = [&DATABASE_PREFIX[..], &[3], b"{user1000}.following"].concat();
        assert_eq!(blind.slot(&tagged), hash_slot(b"user1000"));
    }
}
