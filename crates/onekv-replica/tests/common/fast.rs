//! Helpers for the fast path's tests: fast writes sent to a [`Cluster`]'s replicas, retried until
//! one completes.

use super::cluster::Cluster;
use onekv_replica::{FastAck, ReplicaError, RequestId, WriteOp};
use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub fn put(key: &str, value: &[u8]) -> Vec<WriteOp> {
    vec![WriteOp { key: key.into(), value: Some(value.to_vec()), expiry: Default::default() }]
}

/// Sends a fast write to each of `to` and gathers the answers.
pub fn fast_write(
    cluster: &Cluster,
    to: &[u64],
    id: RequestId,
    ops: Vec<WriteOp>,
) -> BTreeMap<u64, Result<FastAck, ReplicaError>> {
    let (tx, rx) = mpsc::channel();
    for &node in to {
        let tx = tx.clone();
        cluster.replica(node).fast_write(id, ops.clone(), Box::new(move |r| tx.send((node, r)).unwrap()));
    }
    (0..to.len()).map(|_| rx.recv_timeout(Duration::from_secs(10)).expect("an answer")).collect()
}

/// A fast write sent to all three, retried (new id each time) while a new leader is still
/// ordering what it held; returns the id that completed.
pub fn complete(cluster: &Cluster, client: u64, seq: &mut u64, ops: Vec<WriteOp>) -> RequestId {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        *seq += 1;
        let id = RequestId { client, seq: *seq };
        let answers = fast_write(cluster, &[1, 2, 3], id, ops.clone());
        let acks: BTreeMap<u64, FastAck> =
            answers.into_iter().filter_map(|(node, r)| r.ok().map(|ack| (node, ack))).collect();
        if FastAck::completes(&acks) {
            return id;
        }
        assert!(Instant::now() < deadline, "no fast write completed: {acks:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
