//! A leader that cannot apply (stalled: an ORDER naming a fast write it lacks, a put by reference
//! to a value its GC compressed) gives the shard up, also while a client pinned to it keeps
//! sending it writes (whose appends would otherwise keep the followers from ever campaigning),
//! and, once another node leads, catches up from that node's snapshot. Its own test binary: the
//! failpoint it arms is process-wide.

#![cfg(feature = "failpoints")]

mod common;

use common::cluster::Cluster;
use onekv_replica::{Command, RequestId, StorageMode, WriteOp};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn put(key: &str, value: &[u8]) -> Command {
    Command::Write(vec![WriteOp::put(key.as_bytes().to_vec(), value.to_vec())])
}

#[test]
fn a_stalled_leader_hands_the_shard_on_while_a_client_keeps_writing_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, StorageMode::OneLog, |_| {});
    cluster.put("before", b"v0");
    let stalled = cluster.leader();
    onekv_replica::failpoints::arm("apply-stalls-node", &format!("return({stalled})")).unwrap();

    // A client pinned to the stalled leader, sending a write every 20 ms whatever the answers.
    let stop = Arc::new(AtomicBool::new(false));
    let pinned = {
        let (replica, stop) = (cluster.replica(stalled), stop.clone());
        std::thread::spawn(move || {
            let mut seq = 1_000;
            while !stop.load(Ordering::SeqCst) {
                let id = RequestId { client: 7, seq };
                replica.propose(id, put(&format!("pinned-{seq}"), b"x"), Box::new(|_| {}));
                seq += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    // Another node leads, and the stalled one no longer does.
    let deadline = Instant::now() + Duration::from_secs(20);
    let role = |id: u64| cluster.replica(id).status().role;
    loop {
        let others_lead = (1..=3).any(|id| id != stalled && role(id) == "leader");
        if others_lead && role(stalled) != "leader" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node {stalled}, stalled, still leads the shard: {:?}",
            cluster.replica(stalled).status()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    cluster.put("after", b"v1");
    stop.store(true, Ordering::SeqCst);
    pinned.join().unwrap();

    // Once it can apply again, the snapshot it asked the new leader for brings it up to date.
    onekv_replica::failpoints::arm("apply-stalls-node", "off").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.replica(stalled).get(b"after").unwrap().as_deref() != Some(&b"v1"[..]) {
        assert!(
            Instant::now() < deadline,
            "node {stalled} never caught up: {:?}",
            cluster.replica(stalled).status()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(cluster.replica(stalled).get(b"before").unwrap().as_deref(), Some(&b"v0"[..]));
    cluster.shutdown();
}
