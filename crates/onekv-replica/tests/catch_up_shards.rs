//! A node that missed many shards' worth of writes catches up on all of them back to back: it
//! fetches at most two snapshots at once, and the others' snapshot messages wait for a slot
//! instead of being dropped until each leader gives its snapshot up as lost and sends it again.
//! A lagging node fetches from the other follower, not the leader, and from the leader when the
//! other follower cannot serve it.

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

/// How a lagging node's snapshot reached it: bytes of pairs the leader and the other follower
/// sent it.
struct Served {
    by_leader: u64,
    by_other: u64,
}

/// Node 3 misses `KEYS_PER_SHARD` keys of 8 KiB of one shard (about 500 KiB, 8 chunks) and comes
/// back; `setup` prepares the router and its config before it does. Checks that it caught up by
/// a snapshot and holds every key.
fn catch_up_one_shard(
    setup: impl FnOnce(&Router, u64, u64),
    configure: impl Fn(&mut onekv_replica::ReplicaConfig),
) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let router = Arc::new(Router::default());
    let open = |id| {
        let mut config = shards::small_log_config(root, id, &[1]);
        configure(&mut config);
        shards::open(&router, config)
    };
    let mut nodes: Vec<Option<Node>> = (1..=3).map(|id| Some(open(id))).collect();
    put(&nodes, 1, 1, b"first", b"1".to_vec());
    router.remove(3);
    nodes[2].take().unwrap().shutdown();
    for i in 0..KEYS_PER_SHARD {
        put(&nodes, 1, 2 + i as u64, format!("k{i:03}").as_bytes(), value(i));
    }
    let leader = router.leader().expect("a leader");
    let other = 3 - leader;
    let before = (router.chunks_served_by(leader).1, router.chunks_served_by(other).1);
    setup(&router, leader, other);
    nodes[2] = Some(open(3));
    let last = put(&nodes, 1, 1_000, b"last", b"2".to_vec());
    let lagging = nodes[2].as_ref().unwrap();
    shards::wait_caught_up_by_snapshot(lagging, 1, last);
    let replica = lagging.replica(1).unwrap();
    for i in 0..KEYS_PER_SHARD {
        assert_eq!(replica.get(format!("k{i:03}").as_bytes()).unwrap(), Some(value(i)), "k{i:03}");
    }
    assert_eq!(router.leader(), Some(leader), "leadership moved: the test's accounting is off");
    let served = Served {
        by_leader: router.chunks_served_by(leader).1 - before.0,
        by_other: router.chunks_served_by(other).1 - before.1,
    };
    for node in nodes.into_iter().flatten() {
        node.shutdown();
    }
    served
}

/// The state a lagging node misses, in bytes of values.
const MISSED_BYTES: u64 = KEYS_PER_SHARD as u64 * (8 << 10);

#[test]
fn a_lagging_node_fetches_its_snapshot_from_the_other_follower_not_the_leader() {
    let served = catch_up_one_shard(|_, _, _| {}, |_| {});
    assert!(served.by_other >= MISSED_BYTES, "the other follower sent {} bytes", served.by_other);
    // The leader answers only the small requests that keep its own view (and its patience).
    assert!(
        served.by_leader < MISSED_BYTES / 4,
        "the leader sent {} bytes, the other follower {}",
        served.by_leader,
        served.by_other
    );
}

#[test]
fn a_fetch_from_a_follower_that_stops_answering_goes_on_from_the_leader() {
    // The other follower dies after three chunks: the fetch gives up on it and, in the same go,
    // fetches the leader's snapshot (from the start, or after the last key stored when both views
    // are at the same index).
    let served =
        catch_up_one_shard(|router, _, other| router.fail_chunk_calls_to(Some((other, 3, u64::MAX))), |_| {});
    assert!(served.by_other > 0, "the other follower was not asked");
    assert!(served.by_leader >= MISSED_BYTES / 4, "the leader sent {} bytes", served.by_leader);
    assert!(served.by_leader + served.by_other >= MISSED_BYTES);
}

#[test]
fn with_snapshots_from_followers_off_the_leader_sends_them() {
    let served = catch_up_one_shard(|_, _, _| {}, |config| config.snapshot_from_followers = false);
    assert_eq!(served.by_other, 0);
    assert!(served.by_leader >= MISSED_BYTES, "the leader sent {} bytes", served.by_leader);
}
