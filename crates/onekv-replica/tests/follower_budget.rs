//! The memtable budget shared by the shards a node only follows (DEPART's shared memtable,
//! `ReplicaConfig::follower_memtable_bytes`): three nodes host eight shards that node 1 leads
//! (its primary). On the followers the memtables of all eight trees together stay near the budget
//! although each alone is far below `memtable_bytes`; the busy shard flushes more runs than the
//! idle ones; the leader's trees are not counted; and everything reads back after a follower
//! restarts from trees flushed that way.

mod common;

use common::shards::{open, wait_applied};
use onekv_replica::local::Router;
use onekv_replica::{
    Command, IndexLayout, Node, ReplicaConfig, ReplicaError, ReplicaStatus, RequestId, ShardConfig, WriteOp,
};
use std::path::Path;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

const SHARDS: u64 = 8;
/// The followers' shared budget: a small fraction of what the run writes into the index.
const BUDGET: u64 = 64 << 10;
/// Keys written per entry.
const OPS_PER_WRITE: usize = 50;

fn config(root: &Path, id: u64) -> ReplicaConfig {
    let mut config = ReplicaConfig::new(id, vec![1, 2, 3], root.join(format!("node{id}")));
    config.shards = (1..=SHARDS)
        .map(|shard| ShardConfig { id: shard, voters: vec![1, 2, 3], primary: Some(1) })
        .collect();
    config.tick = Duration::from_millis(20);
    // Each tree alone would flush only at 4 MiB, and never because of entries or age in this run.
    config.memtable_bytes = 4 << 20;
    config.flush_every_entries = 1_000_000;
    config.flush_every = Duration::from_secs(3_600);
    // As many runs as a tree may keep, so none is merged here: the runs count the flushes.
    config.index_layout = IndexLayout::Decoupled { follower_runs: IndexLayout::MAX_FOLLOWER_RUNS };
    config.follower_memtable_bytes = BUDGET;
    config
}

fn key(shard: u64, k: usize) -> Vec<u8> {
    format!("s{shard}-key-{k:06}").into_bytes()
}

fn value(shard: u64, k: usize) -> Vec<u8> {
    format!("value of {k} in shard {shard}").into_bytes()
}

/// Writes keys `from..to` of `shard` through node 1 (its leader) in entries of
/// [`OPS_PER_WRITE`]; returns the last entry's index.
fn write(leader: &Node, shard: u64, seq: &mut u64, from: usize, to: usize) -> u64 {
    let replica = leader.replica(shard).expect("hosted");
    let mut last = 0;
    for start in (from..to).step_by(OPS_PER_WRITE) {
        *seq += 1;
        let ops = (start..(start + OPS_PER_WRITE).min(to))
            .map(|k| WriteOp { key: key(shard, k), value: Some(value(shard, k)), expiry: Default::default() })
            .collect();
        let (tx, rx) = mpsc::channel();
        replica.propose(
            RequestId { client: 7, seq: *seq },
            Command::Write(ops),
            Box::new(move |r| drop(tx.send(r))),
        );
        let outcome = rx.recv_timeout(Duration::from_secs(10)).unwrap_or(Err(ReplicaError::Stopping));
        last = outcome.unwrap_or_else(|e| panic!("shard {shard}: write failed: {e}")).index;
    }
    last
}

fn statuses(node: &Node) -> Vec<ReplicaStatus> {
    node.statuses()
}

fn followers_memtables(node: &Node) -> u64 {
    statuses(node).iter().map(|s| s.memtable_bytes).sum()
}

fn runs_of(node: &Node, shard: u64) -> u64 {
    node.replica(shard).unwrap().status().index_sorted_runs
}

#[test]
fn followed_shards_share_one_memtable_budget() {
    let dir = tempfile::tempdir().unwrap();
    let router = Arc::new(Router::default());
    let mut nodes: Vec<Option<Node>> =
        (1..=3).map(|id| Some(open(&router, config(dir.path(), id)))).collect();
    // Node 1 is every shard's primary: wait until it leads them all.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !statuses(nodes[0].as_ref().unwrap()).iter().all(|s| s.role == "leader") {
        assert!(
            Instant::now() < deadline,
            "node 1 does not lead every shard: {:?}",
            statuses(nodes[0].as_ref().unwrap())
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let leader = nodes[0].as_ref().unwrap();
    let mut seq = 0;
    let mut last = vec![0u64; SHARDS as usize + 1];
    // Shard 1 is busy (6 000 keys, in steps), the other shards get 400 keys each.
    let busy_keys = 6_000;
    let idle_keys = 400;
    let mut most = 0u64;
    for step in 0..10 {
        let (from, to) = (busy_keys * step / 10, busy_keys * (step + 1) / 10);
        last[1] = write(leader, 1, &mut seq, from, to);
        let shard = 2 + (step as u64 % (SHARDS - 1));
        if step < 7 {
            last[shard as usize] = write(leader, shard, &mut seq, 0, idle_keys);
        }
        for id in [2, 3] {
            let node = nodes[id - 1].as_ref().unwrap();
            for shard in 1..=SHARDS {
                assert!(wait_applied(node, shard, last[shard as usize], Duration::from_secs(20)));
            }
            most = most.max(followers_memtables(node));
        }
    }
    let written_keys = busy_keys + idle_keys * (SHARDS as usize - 1);
    // Without the budget the followers' memtables would hold every key written (each tree is far
    // below its own 4 MiB); with it they stay near the budget (plus what arrives while a flush
    // runs).
    let unflushed_on_leader = followers_memtables(leader);
    assert!(
        unflushed_on_leader > 3 * BUDGET,
        "the leader's trees are not counted: {unflushed_on_leader} bytes unflushed for {written_keys} keys"
    );
    assert!(most <= 2 * BUDGET, "followers' memtables reached {most} bytes (budget {BUDGET})");
    for id in [2, 3] {
        let node = nodes[id - 1].as_ref().unwrap();
        let status = &statuses(node)[0];
        assert!(status.index_budget_flushes >= 3, "node {id}: {status:?}");
        // The busy shard's tree got most of the flushes.
        for shard in 2..=SHARDS {
            assert!(runs_of(node, 1) > runs_of(node, shard), "node {id}: shard 1 against shard {shard}");
        }
    }
    assert_eq!(statuses(leader)[0].index_budget_flushes, 0, "the leader follows no shard");

    // A follower restarts from trees flushed by the budget (and replays what was not flushed):
    // every key reads back.
    nodes[1].take().unwrap().shutdown();
    router.remove(2);
    let node2 = open(&router, config(dir.path(), 2));
    for shard in 1..=SHARDS {
        assert!(wait_applied(&node2, shard, last[shard as usize], Duration::from_secs(30)));
    }
    let replica = |shard| node2.replica(shard).unwrap();
    for k in 0..busy_keys {
        assert_eq!(replica(1).get(&key(1, k)).unwrap(), Some(value(1, k)), "shard 1 key {k}");
    }
    for shard in 2..=SHARDS {
        if last[shard as usize] > 0 {
            for k in 0..idle_keys {
                assert_eq!(
                    replica(shard).get(&key(shard, k)).unwrap(),
                    Some(value(shard, k)),
                    "shard {shard}"
                );
            }
        }
    }
}
