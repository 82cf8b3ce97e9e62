//! A node that missed many shards' worth of writes catches up on all of them back to back: it
//! fetches at most two snapshots at once, and the others' snapshot messages wait for a slot
//! instead of being dropped until each leader gives its snapshot up as lost and sends it again.

mod common;

use common::shards::{self, put, wait_applied};
use onekv_replica::Node;
use onekv_replica::local::Router;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Twice the fetches a node runs at once.
const SHARDS: u64 = 4;
const KEYS_PER_SHARD: usize = 60;

fn value(i: usize) -> Vec<u8> {
    (0..8 << 10).map(|j| (i * 11 + j) as u8).collect()
}

fn open(root: &Path, router: &Arc<Router>, id: u64) -> Node {
    let shards: Vec<u64> = (1..=SHARDS).collect();
    let mut config = shards::small_log_config(root, id, &shards);
    // Far longer than the catch-up may take: a dropped snapshot message would not be sent again
    // in time.
    config.snapshot_timeout = Duration::from_secs(120);
    shards::open(router, config)
}

#[test]
fn a_node_behind_on_more_shards_than_it_fetches_at_once_catches_up_on_all_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let router = Arc::new(Router::default());
    let mut nodes: Vec<Option<Node>> = (1..=3).map(|id| Some(open(root, &router, id))).collect();
    for shard in 1..=SHARDS {
        put(&nodes, shard, 1, b"first", b"1".to_vec());
    }
    router.remove(3);
    nodes[2].take().unwrap().shutdown();
    for shard in 1..=SHARDS {
        for i in 0..KEYS_PER_SHARD {
            put(&nodes, shard, 2 + i as u64, format!("k{i:03}").as_bytes(), value(i));
        }
    }
    // Slow senders (about 1 s per snapshot of 8 chunks): the four messages reach node 3 while
    // its two fetch slots are taken.
    router.delay_chunk_calls(Duration::from_millis(120));
    nodes[2] = Some(open(root, &router, 3));
    let last: Vec<u64> =
        (1..=SHARDS).map(|shard| put(&nodes, shard, 1_000, b"last", b"2".to_vec())).collect();
    let started = Instant::now();
    let lagging = nodes[2].as_ref().unwrap();
    for shard in 1..=SHARDS {
        let within = Duration::from_secs(30).saturating_sub(started.elapsed());
        assert!(
            wait_applied(lagging, shard, last[shard as usize - 1], within),
            "shard {shard} did not catch up on node 3 within 30 s: {:?}",
            lagging.replica(shard).unwrap().status()
        );
        let replica = lagging.replica(shard).unwrap();
        assert!(replica.status().first_index > 5, "shard {shard} caught up without a snapshot");
        for i in 0..KEYS_PER_SHARD {
            assert_eq!(replica.get(format!("k{i:03}").as_bytes()).unwrap(), Some(value(i)), "shard {shard}");
        }
    }
    for node in nodes.into_iter().flatten() {
        node.shutdown();
    }
}
