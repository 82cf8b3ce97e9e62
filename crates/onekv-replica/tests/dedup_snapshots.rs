//! Dedup-aware snapshots (issue 18, item 6): a lagging node's snapshot carries each copy of a
//! value that several keys share once, the others as references to an earlier key, and the node
//! then keeps one copy too. Its keys read their own values after the install, after a restart,
//! after the key whose pair carried the copy is overwritten and deleted, and after its log GC
//! collected the segment the copy is in.

mod common;

use common::shards::{self, put, wait_applied};
use onekv_replica::local::Router;
use onekv_replica::{DedupConfig, DedupMode, GcConfig, Node, ReplicaConfig};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const KEYS: usize = 240;
const VALUE_BYTES: usize = 8 << 10;
/// The distinct values the keys are given.
const DISTINCT: usize = 4;

fn pooled(i: usize) -> Vec<u8> {
    let mut value = vec![(i % DISTINCT) as u8; VALUE_BYTES];
    value[..8].copy_from_slice(format!("pool-{:03}", i % DISTINCT).as_bytes());
    value
}

fn key(i: usize) -> Vec<u8> {
    format!("k{i:04}").into_bytes()
}

fn config(root: &Path, id: u64, mode: DedupMode) -> ReplicaConfig {
    let mut config = shards::small_log_config(root, id, &[1]);
    config.dedup = DedupConfig { mode, ..DedupConfig::default() };
    config.segment_bytes = ReplicaConfig::SEGMENT_BYTES_RANGE.0;
    config.gc = GcConfig { interval: Duration::from_millis(50), bytes_per_sec: 0, ..GcConfig::default() };
    config
}

/// Node 3 of three misses `KEYS` writes of `DISTINCT` values and catches up by a snapshot; every
/// node runs `mode`. Returns the bytes of pairs the other two sent it, and the nodes.
fn catch_up(root: &Path, router: &Arc<Router>, mode: DedupMode) -> (u64, Vec<Option<Node>>) {
    let open = |id| shards::open(router, config(root, id, mode));
    let mut nodes: Vec<Option<Node>> = (1..=3).map(|id| Some(open(id))).collect();
    put(&nodes, 1, 1, b"first", b"1".to_vec());
    router.remove(3);
    nodes[2].take().unwrap().shutdown();
    for i in 0..KEYS {
        put(&nodes, 1, 2 + i as u64, &key(i), pooled(i));
    }
    let served = |router: &Router| router.chunks_served_by(1).1 + router.chunks_served_by(2).1;
    let before = served(router);
    nodes[2] = Some(open(3));
    let last = put(&nodes, 1, 1_000, b"last", b"2".to_vec());
    let lagging = nodes[2].as_ref().unwrap();
    shards::wait_caught_up_by_snapshot(lagging, 1, last);
    check(lagging, 0..KEYS, "after the install");
    (served(router) - before, nodes)
}

fn check(node: &Node, keys: impl IntoIterator<Item = usize>, when: &str) {
    let replica = node.replica(1).unwrap();
    for i in keys {
        let got = replica.get(&key(i)).unwrap();
        assert!(got == Some(pooled(i)), "{when}: key {i} reads {:?}", got.map(|v| v[..8].to_vec()));
    }
}

#[test]
fn a_snapshot_sends_a_shared_copy_once_and_the_receiver_keeps_one() {
    let dir = tempfile::tempdir().unwrap();
    let router = Arc::new(Router::default());
    let (with_sharing, nodes) = catch_up(&dir.path().join("inline"), &router, DedupMode::Inline);
    for node in nodes.into_iter().flatten() {
        node.shutdown();
    }
    let router = Arc::new(Router::default());
    let (without, nodes) = catch_up(&dir.path().join("off"), &router, DedupMode::Off);
    for node in nodes.into_iter().flatten() {
        node.shutdown();
    }
    let all_values = (KEYS * VALUE_BYTES) as u64;
    assert!(without >= all_values, "without sharing every key's value is sent: {without} bytes");
    // Each distinct value about once (a copy may come twice when the keys sharing it come before
    // the key that wrote it first), and a reference per other key.
    assert!(
        with_sharing < (2 * DISTINCT * VALUE_BYTES + KEYS * 64) as u64,
        "{with_sharing} bytes sent for {DISTINCT} distinct values of {VALUE_BYTES} bytes ({without} without sharing)"
    );
}

#[test]
fn keys_sharing_a_snapshots_copy_read_it_through_overwrites_restarts_and_collection() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let router = Arc::new(Router::default());
    let (_, mut nodes) = catch_up(root, &router, DedupMode::Inline);
    let lagging_log = |nodes: &[Option<Node>]| nodes[2].as_ref().unwrap().statuses()[0].log_bytes;
    assert!(
        lagging_log(&nodes) < (KEYS * VALUE_BYTES / 2) as u64,
        "node 3's log holds about one copy per distinct value: {} bytes",
        lagging_log(&nodes)
    );

    // A restart: the keys' shared locators into the chunk records are in its durable tree.
    router.remove(3);
    nodes[2].take().unwrap().shutdown();
    nodes[2] = Some(shards::open(&router, config(root, 3, DedupMode::Inline)));
    check(nodes[2].as_ref().unwrap(), 0..KEYS, "after a restart");

    // The keys whose pairs carried the copies (the first of each value) are overwritten, then
    // much more is written, so node 3's log moves on and its collector reclaims the segments the
    // snapshot's chunks are in: the keys that share those copies keep reading them.
    let mut seq = 2_000;
    for i in 0..DISTINCT {
        seq += 1;
        put(&nodes, 1, seq, &key(i), b"overwritten".to_vec());
    }
    let started = Instant::now();
    let reclaimed = |nodes: &[Option<Node>]| nodes[2].as_ref().unwrap().statuses()[0].gc.segments_reclaimed;
    let before = reclaimed(&nodes);
    let mut last = 0;
    while reclaimed(&nodes) < before + 4 || started.elapsed() < Duration::from_secs(1) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "node 3's collector reclaimed nothing: {:?}",
            nodes[2].as_ref().unwrap().statuses()[0].gc
        );
        for i in 0..8 {
            seq += 1;
            last = put(&nodes, 1, seq, format!("filler{}", i % 4).as_bytes(), vec![seq as u8; 16 << 10]);
        }
    }
    let lagging = nodes[2].as_ref().unwrap();
    assert!(wait_applied(lagging, 1, last, Duration::from_secs(30)));
    let status = &lagging.statuses()[0];
    assert!(status.gc.last_error.is_none(), "{:?}", status.gc);
    for i in 0..DISTINCT {
        assert_eq!(lagging.replica(1).unwrap().get(&key(i)).unwrap(), Some(b"overwritten".to_vec()));
    }
    check(lagging, DISTINCT..KEYS, "after the copies' first keys were overwritten and the log collected");
    router.remove(3);
    nodes[2].take().unwrap().shutdown();
    nodes[2] = Some(shards::open(&router, config(root, 3, DedupMode::Inline)));
    check(nodes[2].as_ref().unwrap(), DISTINCT..KEYS, "after another restart");
    for node in nodes.into_iter().flatten() {
        node.shutdown();
    }
}
