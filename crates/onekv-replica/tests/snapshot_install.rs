//! A snapshot's tree is rebuilt off the node loop (issue 15): while a node installs one shard's
//! snapshot, its other shards keep replicating and applying, and a node stopped part-way through
//! the rebuild installs the snapshot again when it comes back.
//!
//! The install is slowed down by a callback on the `snapshot-install-chunk` point, so this test
//! has its own binary (failpoints are global to a process). Needs the `failpoints` feature
//! (`scripts/test` turns it on).

mod common;

use common::shards::{self, put, wait_applied};
use onekv_replica::Node;
use onekv_replica::local::Router;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The shard the lagging node gets a snapshot of.
const BIG: u64 = 1;
/// The shard it only needs a few entries of.
const SMALL: u64 = 2;
const KEYS: usize = 200;
/// How long the install waits before each chunk.
const CHUNK_DELAY: Duration = Duration::from_millis(100);

fn value(i: usize) -> Vec<u8> {
    (0..16 << 10).map(|j| (i * 7 + j) as u8).collect()
}

fn open(root: &Path, router: &Arc<Router>, id: u64) -> Node {
    let mut config = shards::small_log_config(root, id, &[BIG, SMALL]);
    config.snapshot_timeout = Duration::from_secs(1);
    shards::open(router, config)
}

/// The lagging node (3) installs a snapshot of `BIG` slowly (`CHUNK_DELAY` per chunk); meanwhile
/// it applies a new write of `SMALL`, which its loop could not do while it rebuilt the tree
/// itself. Stopped part-way through that rebuild, it installs the snapshot again when reopened and
/// serves every key from its own copy.
#[test]
fn other_shards_go_on_while_a_snapshot_is_installed_and_a_stop_part_way_installs_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let router = Arc::new(Router::default());
    let mut nodes: Vec<Option<Node>> = (1..=3).map(|id| Some(open(root, &router, id))).collect();
    put(&nodes, SMALL, 1, b"small-0", b"0".to_vec());
    put(&nodes, BIG, 1, b"big-first", b"1".to_vec());
    // Node 3 may lead either shard: stop it, and the others elect new leaders.
    router.remove(3);
    nodes[2].take().unwrap().shutdown();
    // 3.2 MiB: about 50 chunks of 64 KiB, far past the 5 entries the leader keeps.
    for i in 0..KEYS {
        put(&nodes, BIG, 2 + i as u64, format!("k{i:03}").as_bytes(), value(i));
    }

    let installed_chunks = Arc::new(AtomicU64::new(0));
    let counter = installed_chunks.clone();
    onekv_replica::failpoints::arm_callback("snapshot-install-chunk", move || {
        counter.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(CHUNK_DELAY);
    })
    .unwrap();
    nodes[2] = Some(open(root, &router, 3));
    let lagging = nodes[2].as_ref().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while installed_chunks.load(Ordering::SeqCst) < 2 {
        assert!(Instant::now() < deadline, "no install began: {:?}", lagging.replica(BIG).unwrap().status());
        std::thread::sleep(Duration::from_millis(5));
    }
    // The install has begun; a write of the other shard reaches node 3 and is applied there.
    let index = put(&nodes, SMALL, 2, b"small-1", b"1".to_vec());
    let lagging = nodes[2].as_ref().unwrap();
    assert!(
        wait_applied(lagging, SMALL, index, Duration::from_secs(3)),
        "node 3 did not apply shard {SMALL}'s entry {index} while installing shard {BIG}: {:?}",
        lagging.replica(SMALL).unwrap().status()
    );
    let during = installed_chunks.load(Ordering::SeqCst);
    let status = lagging.replica(BIG).unwrap().status();
    assert!(during < 40, "the install had all but ended ({during} chunks) before shard {SMALL} applied");
    assert!(
        status.snapshot.as_deref().is_some_and(|s| s.contains("installing the snapshot")),
        "the status does not show the install: {status:?}"
    );
    assert!(status.failure.is_none(), "{status:?}");

    // Stopped part-way through the rebuild: the install is cancelled, the metadata is durable.
    router.remove(3);
    nodes[2].take().unwrap().shutdown();
    let stopped_at = installed_chunks.load(Ordering::SeqCst);
    assert!(stopped_at < 50, "the install ended before the stop ({stopped_at} chunks)");
    onekv_replica::failpoints::arm("snapshot-install-chunk", "off").unwrap();
    nodes[2] = Some(open(root, &router, 3));
    let last = put(&nodes, BIG, 10_000, b"big-last", b"2".to_vec());
    let lagging = nodes[2].as_ref().unwrap();
    assert!(
        wait_applied(lagging, BIG, last, Duration::from_secs(60)),
        "node 3 did not catch up: {:?}",
        lagging.replica(BIG).unwrap().status()
    );
    let replica = lagging.replica(BIG).unwrap();
    for i in 0..KEYS {
        assert_eq!(replica.get(format!("k{i:03}").as_bytes()).unwrap(), Some(value(i)), "k{i:03}");
    }
    assert_eq!(replica.get(b"big-first").unwrap().as_deref(), Some(&b"1"[..]));
    assert!(replica.status().failure.is_none(), "{:?}", replica.status());
    for node in nodes.into_iter().flatten() {
        node.shutdown();
    }
}
