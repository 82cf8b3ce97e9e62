//! Placement rules: balance, stability on a node join, determinism, errors.

use onekv_placement::{ClusterMap, MAX_REPLICAS, MAX_SHARDS, NodeId, PlacementError};

/// (max replicas on a node, share of replicas, max primaries on a node, share of primaries).
fn loads(map: &ClusterMap) -> (usize, usize, usize, usize, f64, f64) {
    let replicas: Vec<usize> = map.nodes.iter().map(|&n| map.shards_of(n).len()).collect();
    let primaries: Vec<usize> = map.nodes.iter().map(|&n| map.primaries_of(n)).collect();
    let n = map.nodes.len() as f64;
    let r_share = (map.shards.len() * map.replication_factor() as usize) as f64 / n;
    let p_share = map.shards.len() as f64 / n;
    (
        *replicas.iter().min().unwrap(),
        *replicas.iter().max().unwrap(),
        *primaries.iter().min().unwrap(),
        *primaries.iter().max().unwrap(),
        r_share,
        p_share,
    )
}

/// Asserts no node holds more than 1.3× its share of replicas or of primaries; returns the ratios.
fn assert_balanced(map: &ClusterMap, what: &str) -> (f64, f64) {
    map.validate().unwrap();
    let (r_min, r_max, p_min, p_max, r_share, p_share) = loads(map);
    let (r_ratio, p_ratio) = (r_max as f64 / r_share, p_max as f64 / p_share);
    eprintln!(
        "{what}: replicas {r_min}..={r_max} share {r_share:.2} (max/share {r_ratio:.3}); \
         primaries {p_min}..={p_max} share {p_share:.2} (max/share {p_ratio:.3})"
    );
    assert!(r_ratio <= 1.3, "{what}: replica max {r_max} > 1.3 × {r_share}");
    assert!(p_ratio <= 1.3, "{what}: primary max {p_max} > 1.3 × {p_share}");
    (r_ratio, p_ratio)
}

fn nodes(n: u64) -> Vec<NodeId> {
    (1..=n).collect()
}

#[test]
fn balance_5_nodes_64_shards_r3() {
    let map = ClusterMap::build(&nodes(5), 64, 3).unwrap();
    assert_balanced(&map, "5 nodes / 64 shards / R=3");
    // Bounded loads: no node above ceil(64·3/5) = 39 replicas.
    let (_, r_max, _, p_max, _, _) = loads(&map);
    assert!(r_max <= 39, "{r_max}");
    assert!(p_max <= 13, "{p_max}"); // ceil(64/5)
}

#[test]
fn balance_3_nodes_16_shards_r3() {
    let map = ClusterMap::build(&[10, 20, 30], 16, 3).unwrap();
    assert_balanced(&map, "3 nodes / 16 shards / R=3");
    for n in [10, 20, 30] {
        assert_eq!(map.shards_of(n).len(), 16);
        let p = map.primaries_of(n);
        assert!(p == 5 || p == 6, "node {n} has {p} primaries");
    }
}

#[test]
fn balance_7_nodes_1024_shards_r3() {
    let map = ClusterMap::build(&nodes(7), 1024, 3).unwrap();
    assert_balanced(&map, "7 nodes / 1024 shards / R=3");
    let (_, r_max, p_min, p_max, _, _) = loads(&map);
    assert!(r_max <= 439, "{r_max}"); // ceil(3072/7)
    assert!(p_max - p_min <= 1, "primaries {p_min}..={p_max}");
}

#[test]
fn balance_1_node_1_shard_r1() {
    let map = ClusterMap::build(&[42], 1, 1).unwrap();
    assert_balanced(&map, "1 node / 1 shard / R=1");
    assert_eq!(map.shards, vec![onekv_placement::ShardPlacement { id: 1, replicas: vec![42] }]);
    assert_eq!(map.primary(1), Some(42));
    assert_eq!(map.shard_of_key(b"anything"), 1);
}

#[test]
fn balance_many_shapes() {
    // Bounded loads hold for every shape; primaries balance whenever the replica sets allow.
    for n in 1..=9u64 {
        for r in 1..=n.min(5) as u32 {
            for s in [1, 2, 5, 16, 64, 100] {
                let map = ClusterMap::build(&nodes(n), s, r).unwrap();
                map.validate().unwrap();
                let (_, r_max, _, p_max, _, _) = loads(&map);
                assert!(r_max <= (s as usize * r as usize).div_ceil(n as usize), "n={n} r={r} s={s}");
                assert!(p_max <= (s as usize).div_ceil(n as usize), "n={n} r={r} s={s}: {p_max}");
            }
        }
    }
}

/// Asserts `after` is `before` with `node` added: every shard unchanged, or the same list with one
/// old node replaced by `node` (order may differ only in changed shards).
fn assert_only_new_node_moved(before: &ClusterMap, after: &ClusterMap, node: NodeId) -> usize {
    assert_eq!(after.epoch, before.epoch + 1);
    let mut expected_nodes = before.nodes.clone();
    expected_nodes.push(node);
    expected_nodes.sort_unstable();
    assert_eq!(after.nodes, expected_nodes);
    assert_eq!(after.shards.len(), before.shards.len());
    let mut changed = 0;
    for (b, a) in before.shards.iter().zip(&after.shards) {
        assert_eq!(a.id, b.id);
        if a.replicas == b.replicas {
            continue;
        }
        changed += 1;
        let gone: Vec<_> = b.replicas.iter().filter(|r| !a.replicas.contains(r)).collect();
        let added: Vec<_> = a.replicas.iter().filter(|r| !b.replicas.contains(r)).collect();
        assert_eq!(added, vec![&node], "shard {}: {:?} → {:?}", a.id, b.replicas, a.replicas);
        assert_eq!(gone.len(), 1, "shard {}: {:?} → {:?}", a.id, b.replicas, a.replicas);
    }
    changed
}

#[test]
fn adding_a_node_moves_only_what_it_takes() {
    let before = ClusterMap::build(&nodes(5), 64, 3).unwrap();
    let after = before.with_node_added(6).unwrap();
    let changed = assert_only_new_node_moved(&before, &after, 6);
    let taken = after.shards_of(6).len();
    assert_eq!(changed, taken);
    // The new node ends with about its share (64·3/6 = 32) and the map stays balanced.
    assert!((31..=32).contains(&taken), "new node took {taken}");
    let p = after.primaries_of(6);
    assert!((10..=11).contains(&p), "new node has {p} primaries (share 10.67)");
    assert_balanced(&after, "5+1 nodes / 64 shards / R=3");

    // And again, with an id that sorts first.
    let again = after.with_node_added(0xFFFF_FFFF_FFFF).unwrap();
    assert_only_new_node_moved(&after, &again, 0xFFFF_FFFF_FFFF);
    assert_balanced(&again, "5+2 nodes / 64 shards / R=3");
}

#[test]
fn adding_nodes_one_by_one_stays_balanced() {
    let mut map = ClusterMap::build(&[1, 2, 3], 16, 3).unwrap();
    for node in 4..=12 {
        let next = map.with_node_added(node * 7).unwrap();
        assert_only_new_node_moved(&map, &next, node * 7);
        let (_, r_max, _, _, _, _) = loads(&next);
        assert!(r_max <= (16 * 3usize).div_ceil(next.nodes.len()) + 1, "{node}: {r_max}");
        map = next;
    }
    assert_balanced(
        &ClusterMap::build(&nodes(7), 1024, 3).unwrap().with_node_added(100).unwrap(),
        "7+1/1024/3",
    );
}

#[test]
fn add_node_errors() {
    let map = ClusterMap::build(&[1, 2, 3], 16, 3).unwrap();
    assert_eq!(map.with_node_added(2), Err(PlacementError::AlreadyMember(2)));
    assert_eq!(map.with_node_added(0), Err(PlacementError::ZeroNodeId));
}

#[test]
fn build_is_deterministic_and_pinned() {
    let a = ClusterMap::build(&[3, 1, 2], 16, 3).unwrap();
    let b = ClusterMap::build(&[1, 2, 3], 16, 3).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.epoch, 1);
    assert_eq!(a.nodes, vec![1, 2, 3]);
    let primaries: Vec<NodeId> = (1..=16).map(|s| a.primary(s).unwrap()).collect();
    // Pinned: a change here is a change of the placement rules (ring hash, bounded loads, primaries).
    assert_eq!(primaries, PINNED_PRIMARIES_3_16_3);
    let big = ClusterMap::build(&nodes(7), 1024, 3).unwrap();
    assert_eq!(big, ClusterMap::build(&nodes(7), 1024, 3).unwrap());
    assert_eq!(big.shards[0].replicas, PINNED_7_1024_3_SHARD_1);
}

const PINNED_PRIMARIES_3_16_3: [NodeId; 16] = [2, 2, 2, 2, 3, 1, 1, 1, 1, 1, 3, 3, 3, 1, 3, 2];
const PINNED_7_1024_3_SHARD_1: [NodeId; 3] = [5, 1, 6];

#[test]
fn build_errors_name_the_bad_value() {
    use PlacementError::*;
    assert_eq!(ClusterMap::build(&[], 16, 1), Err(NoNodes));
    assert_eq!(ClusterMap::build(&[1, 0], 16, 1), Err(ZeroNodeId));
    assert_eq!(ClusterMap::build(&[1, 5, 5], 16, 1), Err(DuplicateNode(5)));
    assert_eq!(ClusterMap::build(&[1], 0, 1), Err(InvalidShardCount(0)));
    assert_eq!(ClusterMap::build(&[1], MAX_SHARDS + 1, 1), Err(InvalidShardCount(1025)));
    assert!(ClusterMap::build(&[1], MAX_SHARDS, 1).is_ok());
    assert_eq!(ClusterMap::build(&[1, 2], 16, 0), Err(InvalidReplicaCount { replicas: 0, nodes: 2 }));
    assert_eq!(ClusterMap::build(&[1, 2], 16, 3), Err(InvalidReplicaCount { replicas: 3, nodes: 2 }));
    assert_eq!(
        ClusterMap::build(&nodes(9), 16, MAX_REPLICAS + 1),
        Err(InvalidReplicaCount { replicas: 8, nodes: 9 })
    );
    let msg = ClusterMap::build(&[1, 5, 5], 16, 1).unwrap_err().to_string();
    assert!(msg.contains('5'), "{msg}");
    let msg = ClusterMap::build(&[1], 2000, 1).unwrap_err().to_string();
    assert!(msg.contains("2000"), "{msg}");
}

#[test]
fn lookups() {
    let map = ClusterMap::build(&[1, 2, 3, 4], 16, 2).unwrap();
    assert_eq!(map.shard_count(), 16);
    assert_eq!(map.shard(0), None);
    assert_eq!(map.shard(17), None);
    assert_eq!(map.shard(5).unwrap().id, 5);
    assert_eq!(map.primary(99), None);
    assert_eq!(map.shard_of_key(b"foo"), onekv_placement::shard_of_key(b"foo", 16, Default::default()));
    let total: usize = map.nodes.iter().map(|&n| map.shards_of(n).len()).sum();
    assert_eq!(total, 32);
    assert!(map.shards_of(77).is_empty());
}
