//! Nodes hosting several shards in one process (each opened with [`onekv_replica::Node::open`] on
//! a shared [`onekv_replica::local::Router`]): writing to a shard through whichever node leads it,
//! and waiting for a node to apply an entry of one shard.

use onekv_replica::{Command, Node, ReplicaError, RequestId, WriteOp};
use std::sync::mpsc;
use std::time::{Duration, Instant};

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
