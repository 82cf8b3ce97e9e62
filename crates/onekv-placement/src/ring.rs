//! The consistent-hash ring: virtual-node points, shard points, and each shard's candidate order.
//!
//! The hash is defined here, not taken from std (whose `DefaultHasher` may change between releases):
//! FNV-1a 64 over a domain tag and little-endian integers, then the SplitMix64 finalizer for avalanche.

use crate::{NodeId, ShardId};

/// Virtual nodes (ring points) per node.
pub const VNODES_PER_NODE: u32 = 64;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// SplitMix64's finalizer.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Ring point of virtual node `vnode` of `node`:
/// `mix64(fnv1a64("onekv/vnode" || node as u64 LE || vnode as u32 LE))`.
pub fn ring_hash_node(node: NodeId, vnode: u32) -> u64 {
    let h = fnv1a(FNV_OFFSET, b"onekv/vnode");
    let h = fnv1a(h, &node.to_le_bytes());
    mix64(fnv1a(h, &vnode.to_le_bytes()))
}

/// Ring point of `shard`: `mix64(fnv1a64("onekv/shard" || shard as u64 LE))`.
pub fn ring_hash_shard(shard: ShardId) -> u64 {
    let h = fnv1a(FNV_OFFSET, b"onekv/shard");
    mix64(fnv1a(h, &shard.to_le_bytes()))
}

/// The ring of a node set: every node's virtual-node points, sorted by `(point, node)`.
pub(crate) struct Ring {
    points: Vec<(u64, NodeId)>,
    nodes: usize,
}

impl Ring {
    pub(crate) fn new(nodes: &[NodeId]) -> Ring {
        let mut points: Vec<(u64, NodeId)> = nodes
            .iter()
            .flat_map(|&n| (0..VNODES_PER_NODE).map(move |v| (ring_hash_node(n, v), n)))
            .collect();
        points.sort_unstable();
        Ring { points, nodes: nodes.len() }
    }

    /// Every node, in the order met walking clockwise from `shard`'s point (the first point at or
    /// after it, wrapping), each node once.
    pub(crate) fn candidates(&self, shard: ShardId) -> Vec<NodeId> {
        let at = ring_hash_shard(shard);
        let start = self.points.partition_point(|&(p, _)| p < at);
        let mut order = Vec::with_capacity(self.nodes);
        for i in 0..self.points.len() {
            let node = self.points[(start + i) % self.points.len()].1;
            if !order.contains(&node) {
                order.push(node);
                if order.len() == self.nodes {
                    break;
                }
            }
        }
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_pinned() {
        // The ring hash is part of the placement rules: changing it moves shards.
        assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c); // FNV-1a 64 test vector
        assert_eq!(mix64(0), 0);
        assert_ne!(ring_hash_node(1, 0), ring_hash_node(1, 1));
        assert_ne!(ring_hash_node(1, 0), ring_hash_node(2, 0));
    }

    #[test]
    fn candidates_are_a_permutation() {
        let nodes = [3, 9, 12, 40, 41];
        let ring = Ring::new(&nodes);
        for shard in 1..=64 {
            let mut c = ring.candidates(shard);
            c.sort_unstable();
            assert_eq!(c, nodes);
        }
    }
}
