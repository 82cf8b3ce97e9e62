//! Nodes hosting several shards in one process (each opened with [`onekv_replica::Node::open`] on
//! a shared [`onekv_replica::local::Router`]): writing to a shard through whichever node leads it,
//! and waiting for a node to apply an entry of one shard.

use onekv_replica::local::Router;
use onekv_replica::{Command, Node, ReplicaConfig, ReplicaError, RequestId, ShardConfig, WriteOp};
use std::path::Path;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

/// Node `id` of three, hosting a replica of each of `shards`, with a log small enough that a node
/// left behind needs snapshots: small memtables flush often, and Raft forgets its entries after
/// each flush; snapshots stream in chunks of 64 KiB.
pub fn small_log_config(root: &Path, id: u64, shards: &[u64]) -> ReplicaConfig {
    let mut config = ReplicaConfig::new(id, vec![1, 2, 3], root.join(format!("node{id}")));
    config.shards =
        shards.iter().map(|&shard| ShardConfig { id: shard, voters: vec![1, 2, 3], primary: None }).collect();
    config.tick = Duration::from_millis(20);
    config.memtable_bytes = 4 << 10;
    config.raft_log_keep_entries = 5;
    config.snapshot_chunk_bytes = 64 << 10;
    config
}

/// Opens a node with `config` and adds it to `router`.
pub fn open(router: &Arc<Router>, config: ReplicaConfig) -> Node {
    let id = config.node_id;
    let node = Node::open(config, router.clone()).expect("open");
    router.add(id, node.replicas()[0].clone());
    node
}

/// Proposes `key = value` to `shard` through whichever node leads it, retrying while leadership
/// settles; returns the entry's index.
pub fn put(nodes: &[Option<Node>], shard: u64, seq: u64, key: &[u8], value: Vec<u8>) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let leader = nodes
            .iter()
            .flatten()
            .filter_map(|node| node.replica(shard))
            .find(|replica| replica.status().role == "leader");
        if let Some(leader) = leader {
            let (tx, rx) = mpsc::channel();
            let command = Command::Write(vec![WriteOp {
                key: key.to_vec(),
                value: Some(value.clone()),
                expiry: Default::default(),
            }]);
            leader.propose(RequestId { client: shard, seq }, command, Box::new(move |r| drop(tx.send(r))));
            match rx.recv_timeout(Duration::from_secs(10)).unwrap_or(Err(ReplicaError::Stopping)) {
                Ok(outcome) => return outcome.index,
                Err(error) => assert!(Instant::now() < deadline, "shard {shard}: write failed: {error}"),
            }
        }
        assert!(Instant::now() < deadline, "shard {shard}: no leader");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn wait_applied(node: &Node, shard: u64, index: u64, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let replica = node.replica(shard).expect("hosted");
    while replica.status().applied_index < index {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// Waits up to 30 s for `node` to apply entry `last` of `shard`, and checks it got there by a
/// snapshot (its Raft log starts past the first entries).
pub fn wait_caught_up_by_snapshot(node: &Node, shard: u64, last: u64) {
    assert!(
        wait_applied(node, shard, last, Duration::from_secs(30)),
        "node {} did not catch up on shard {shard} within 30 s: {:?}",
        node.statuses()[0].node_id,
        node.replica(shard).unwrap().status()
    );
    assert!(node.replica(shard).unwrap().status().first_index > 5, "caught up without a snapshot");
}
