//! Where shards live: the placement rules of an onekv cluster, as pure functions of their inputs.
//!
//! Owns:
//! - the key hash ([`hash_slot`]): Redis Cluster's CRC16 of the key or of its `{hash tag}`, so a key
//!   lands on the same slot as in Redis (`CLUSTER KEYSLOT`); a map's [`KeyHashing`] says whether a
//!   Redis database's prefix is hashed too;
//! - slot → shard: the 16384 slots split into contiguous, near-equal ranges ([`shard_of_slot`],
//!   [`slots_of_shard`]);
//! - the placement of each shard's replicas on nodes: a consistent-hash ring with virtual nodes and a
//!   stable, documented hash gives each shard its order of candidate nodes, bounded loads keep every
//!   node at or under its share, and primaries (preferred leaders) are balanced separately
//!   ([`ClusterMap::build`], [`ClusterMap::with_node_added`]);
//! - the cluster map ([`ClusterMap`]) and its versioned, checksummed binary encoding
//!   ([`ClusterMap::encode`], [`ClusterMap::decode`]);
//! - the member list ([`MemberList`]: node ids and addresses at an epoch) and its encoding;
//! - how many voters the fast path needs ([`quorum`]), stated once for replicas and clients.
//!
//! Does not own: where the map is stored or how it is agreed on (the metadata Raft group), moving data
//! between nodes, networking, or anything with I/O, threads or async. Everything here is deterministic:
//! the same inputs give the same outputs on every machine and in every release (a change to a rule is a
//! change of format, caught by the golden tests).
//!
//! The rules and the byte layout are in `docs/design/placement.md`.

mod codec;
mod error;
mod map;
mod members;
pub mod quorum;
mod ring;
mod slot;

pub use codec::{FORMAT_VERSION, MAGIC};
pub use error::PlacementError;
pub use map::{ClusterMap, ShardPlacement};
pub use members::{
    MAX_ADDRESS_BYTES, MAX_MEMBERS, MEMBERS_KEY, Member, MemberList, MemberListError, SYSTEM_PREFIX,
};
pub use ring::{VNODES_PER_NODE, ring_hash_node, ring_hash_shard};
pub use slot::{
    DATABASE_PREFIX, DATABASES, KeyHashing, hash_slot, shard_of_key, shard_of_slot, slots_of_shard,
};

/// A node's id: any non-zero `u64` (0 is reserved and never a node).
pub type NodeId = u64;
/// A shard's id: shards are numbered `1..=count` (0 is never a shard).
pub type ShardId = u64;

/// Number of hash slots, as in Redis Cluster.
pub const HASH_SLOTS: u16 = 16384;
/// Largest number of shards a cluster may have.
pub const MAX_SHARDS: u32 = 1024;
/// Shard count used when none is configured.
pub const DEFAULT_SHARDS: u32 = 16;
/// Largest replication factor.
pub const MAX_REPLICAS: u32 = 7;
