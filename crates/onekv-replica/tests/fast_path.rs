//! The fast path (`Replica::fast_write`) on a shard of three replicas in one process: a fast write
//! sent to every voter is durable on all three and done; the leader orders it by reference, so
//! every replica applies its own record (the value written once); linearizable reads see it;
//! it survives a leader change and restarts; a write that did not complete (not sent to the
//! leader) stays pending across a restart until its client falls back to the Raft path with the
//! same id, which applies it once.

mod common;

use common::cluster::Cluster;
use common::fast::{complete, fast_write, put, wait_for};
use onekv_replica::{Command, FastAck, ReplicaConfig, ReplicaError, RequestId, StorageMode, WriteOp};
use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn fast(config: &mut ReplicaConfig) {
    config.fast_path = true;
}

#[test]
fn fast_writes_complete_in_one_round_are_applied_from_each_replicas_own_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, StorageMode::OneLog, fast);
    cluster.put("warm-up", b"raft path");
    let mut seq = 0;
    for i in 0..50 {
        complete(&cluster, 7, &mut seq, put(&format!("k{i}"), format!("fast value {i}").as_bytes()));
    }
    // Reads at the leader see every completed write.
    for i in 0..50 {
        assert_eq!(cluster.linearizable_get(&format!("k{i}")), Some(format!("fast value {i}").into_bytes()));
    }
    // Every replica applies them, from its own record: the leader had every replica's notice.
    let leader_applied = cluster.replica(cluster.leader()).status().applied_index;
    for id in 1..=3 {
        cluster.wait_applied(id, leader_applied);
        let status = cluster.replica(id).status();
        assert_eq!(status.fast_pending, 0, "node {id}: {status:?}");
        assert!(status.fast_from_record >= 45, "node {id} applied its own records: {status:?}");
        for i in 0..50 {
            let got = cluster.replica(id).get(format!("k{i}").as_bytes()).unwrap();
            assert_eq!(got, Some(format!("fast value {i}").into_bytes()), "node {id} k{i}");
        }
    }
    // A retry of a completed write is answered "applied".
    let answers =
        fast_write(&cluster, &[1, 2, 3], RequestId { client: 7, seq: 1 }, put("k0", b"fast value 0"));
    assert!(answers.values().all(|r| matches!(r, Ok(FastAck::Applied { .. }))), "{answers:?}");

    // Leadership moves: completed writes stay, and the new leader takes fast writes once it has
    // ordered what it held.
    let old = cluster.leader();
    cluster.stop(old);
    wait_for("a new leader", || cluster.router.leader().is_some_and(|id| id != old));
    for i in 0..50 {
        assert_eq!(cluster.linearizable_get(&format!("k{i}")), Some(format!("fast value {i}").into_bytes()));
    }
    cluster.open(old);
    for i in 50..60 {
        complete(&cluster, 7, &mut seq, put(&format!("k{i}"), format!("fast value {i}").as_bytes()));
    }
    // Everything survives a restart of every node.
    for id in 1..=3 {
        cluster.stop(id);
    }
    for id in 1..=3 {
        cluster.open(id);
    }
    for i in 0..60 {
        assert_eq!(cluster.linearizable_get(&format!("k{i}")), Some(format!("fast value {i}").into_bytes()));
    }
}

#[test]
fn a_write_that_did_not_complete_stays_pending_until_its_client_falls_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, StorageMode::OneLog, fast);
    cluster.put("warm-up", b"raft path");
    let leader = cluster.leader();
    let followers: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    // Sent to the followers only (the leader never got it): durable there, not done.
    let id = RequestId { client: 9, seq: 1 };
    let answers = fast_write(&cluster, &followers, id, put("orphan", b"v1"));
    let acks: BTreeMap<u64, FastAck> = answers.into_iter().map(|(node, r)| (node, r.unwrap())).collect();
    assert!(!FastAck::completes(&acks), "{acks:?}");
    for &f in &followers {
        wait_for("the record pending", || cluster.replica(f).status().fast_pending == 1);
    }
    // It stays pending through a restart (its record is above the recovery point, also after a
    // flush).
    let follower = followers[0];
    cluster.stop(follower);
    cluster.open(follower);
    wait_for("the record pending again", || cluster.replica(follower).status().fast_pending == 1);
    assert_eq!(cluster.linearizable_get("orphan"), None, "not applied: the leader never ordered it");
    // The client falls back to the Raft path with the same id: applied once, pending nowhere.
    let (tx, rx) = mpsc::channel();
    cluster.replica(cluster.leader()).propose(
        id,
        Command::Write(put("orphan", b"v1")),
        Box::new(move |r| tx.send(r).unwrap()),
    );
    let outcome = rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    for node in 1..=3 {
        cluster.wait_applied(node, outcome.index);
        assert_eq!(cluster.replica(node).status().fast_pending, 0, "node {node}");
    }
    assert_eq!(cluster.linearizable_get("orphan"), Some(b"v1".to_vec()));
    // A fast write refused for its expiry relative to now.
    let relative = vec![WriteOp {
        key: b"ttl".to_vec(),
        value: Some(b"v".to_vec()),
        expiry: onekv_replica::Expiry::AfterMs(1_000),
    }];
    let answers = fast_write(&cluster, &[leader], RequestId { client: 9, seq: 2 }, relative);
    assert!(matches!(answers[&leader], Err(ReplicaError::InvalidArgument(_))), "{answers:?}");
}

#[test]
fn the_fast_path_is_refused_when_off() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 3, StorageMode::OneLog, |_| {});
    let leader = cluster.leader();
    let answers = fast_write(&cluster, &[leader], RequestId { client: 1, seq: 1 }, put("k", b"v"));
    assert!(matches!(answers[&leader], Err(ReplicaError::InvalidArgument(_))), "{answers:?}");
}

#[test]
fn a_write_its_client_gave_up_on_is_forgotten_and_then_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, StorageMode::OneLog, fast);
    cluster.put("warm-up", b"raft path");
    let leader = cluster.leader();
    let followers: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    // Sent to the followers only, and its client never falls back: the leader has them forget it
    // (else it would hold the log back for ever), and refuses it if it arrives after all.
    let id = RequestId { client: 11, seq: 1 };
    let answers = fast_write(&cluster, &followers, id, put("orphan", b"v1"));
    assert!(answers.values().all(Result::is_ok), "{answers:?}");
    for &f in &followers {
        wait_for("the record pending", || cluster.replica(f).status().fast_pending == 1);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while followers.iter().any(|&f| cluster.replica(f).status().fast_pending != 0) {
        assert!(Instant::now() < deadline, "the orphan was never forgotten");
        // Writes keep the leader's turns going (a real cluster's ticks do too).
        cluster.put("tick", b"t");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(cluster.linearizable_get("orphan"), None);
    let late = fast_write(&cluster, &[leader], id, put("orphan", b"v1"));
    assert!(matches!(late[&leader], Err(ReplicaError::Dropped(_))), "{late:?}");
}
