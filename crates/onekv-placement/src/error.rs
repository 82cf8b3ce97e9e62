//! Errors of building, changing and decoding a cluster map.

use crate::{NodeId, ShardId};

/// Why a map could not be built, changed or decoded. Every message names the offending value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlacementError {
    /// The node list is empty.
    #[error("a cluster needs at least one node")]
    NoNodes,
    /// Node id 0 was given (0 is reserved).
    #[error("node id 0 is reserved and cannot be a node")]
    ZeroNodeId,
    /// A node id appears more than once.
    #[error("node {0} is listed more than once")]
    DuplicateNode(NodeId),
    /// The shard count is 0 or above [`crate::MAX_SHARDS`].
    #[error("shard count {0} is outside 1..={max}", max = crate::MAX_SHARDS)]
    InvalidShardCount(u32),
    /// The replication factor is 0, above the node count or above [`crate::MAX_REPLICAS`].
    #[error(
        "replication factor {replicas} is outside 1..=min({nodes} nodes, {max})",
        max = crate::MAX_REPLICAS
    )]
    InvalidReplicaCount {
        /// The replication factor asked for.
        replicas: u32,
        /// The number of nodes.
        nodes: usize,
    },
    /// `with_node_added` was given a node that is already a member.
    #[error("node {0} is already a member of the cluster")]
    AlreadyMember(NodeId),
    /// The encoding ends before the data it announces.
    #[error("encoded map truncated: {needed} bytes needed at offset {offset}, {len} bytes in all")]
    Truncated {
        /// Where the missing data starts.
        offset: usize,
        /// How many bytes were needed there.
        needed: usize,
        /// Length of the input.
        len: usize,
    },
    /// The encoding does not start with [`crate::MAGIC`].
    #[error("not an encoded cluster map: magic {0:02x?}")]
    BadMagic([u8; 4]),
    /// The encoding's version is not one this release reads.
    #[error("unsupported cluster map format version {0} (this release reads {v})", v = crate::FORMAT_VERSION)]
    UnsupportedVersion(u16),
    /// The CRC-32C does not match the bytes.
    #[error("cluster map checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch {
        /// The checksum in the encoding.
        stored: u32,
        /// The checksum of the bytes.
        computed: u32,
    },
    /// Bytes follow the announced data (before the checksum).
    #[error("{0} unexpected bytes after the last shard")]
    TrailingBytes(usize),
    /// Epoch 0 (epochs start at 1).
    #[error("epoch 0 is invalid (epochs start at 1)")]
    ZeroEpoch,
    /// The node list is not strictly ascending.
    #[error("node list not strictly ascending at index {index}: node {node} after {previous}")]
    NodesNotSorted {
        /// Position of the offending node.
        index: usize,
        /// The node before it.
        previous: NodeId,
        /// The offending node.
        node: NodeId,
    },
    /// A shard's id is not its position + 1.
    #[error("shard at position {index} has id {id}, expected {expected}")]
    ShardOutOfOrder {
        /// Position in the shard list.
        index: usize,
        /// The id found.
        id: ShardId,
        /// The id expected there.
        expected: ShardId,
    },
    /// A shard's replica count differs from the map's replication factor.
    #[error("shard {shard} has {count} replicas, expected {expected}")]
    ReplicaCountMismatch {
        /// The shard.
        shard: ShardId,
        /// Its replica count.
        count: usize,
        /// The map's replication factor.
        expected: usize,
    },
    /// A node appears twice in one shard's replica list.
    #[error("shard {shard} lists node {node} as a replica more than once")]
    DuplicateReplica {
        /// The shard.
        shard: ShardId,
        /// The repeated node.
        node: NodeId,
    },
    /// A replica is not one of the map's nodes.
    #[error("shard {shard} has replica {node}, which is not a member node")]
    UnknownReplica {
        /// The shard.
        shard: ShardId,
        /// The unknown node.
        node: NodeId,
    },
}
