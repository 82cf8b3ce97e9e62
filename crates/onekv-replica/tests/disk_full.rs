//! The "disk full" alarm on replicas in one process: a leader whose disk is below the threshold
//! refuses writes at once with a clear error, keeps serving reads, and hands leadership to a
//! follower so the cluster keeps taking writes. The threshold stands in for a full disk here (no
//! real disk is below `u64::MAX` free bytes); the real-process test in `crates/onekv/tests/disk_full.rs`
//! fills a real file system.

use onekv_replica::local::Router;
use onekv_replica::{Command, Outcome, Replica, ReplicaConfig, ReplicaError, RequestId, WriteOp};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn put(replica: &Replica, seq: u64, key: &str) -> Result<Outcome, ReplicaError> {
    let (tx, rx) = mpsc::channel();
    let command = Command::Write(vec![WriteOp {
        key: key.into(),
        value: Some(key.as_bytes().to_vec()),
        expiry: Default::default(),
    }]);
    replica.propose(RequestId { client: 7, seq }, command, Box::new(move |r| tx.send(r).unwrap()));
    rx.recv_timeout(Duration::from_secs(10)).expect("a reply")
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_leader_in_alarm_refuses_writes_and_keeps_serving_reads() {
    let dir = tempfile::tempdir().unwrap();
    let router = Arc::new(Router::default());
    let mut config = ReplicaConfig::new(1, vec![1], dir.path().join("node1"));
    config.tick = Duration::from_millis(20);
    let replica = Replica::open(config.clone(), router.clone()).unwrap();
    router.add(1, replica.clone());
    wait_for("a leader", || replica.status().role == "leader");
    put(&replica, 1, "before").unwrap();
    replica.shutdown();
    router.remove(1);

    // The same node again, now with more free space required than any disk has.
    config.min_free_bytes = u64::MAX;
    let replica = Replica::open(config, router.clone()).unwrap();
    router.add(1, replica.clone());
    wait_for("a leader", || replica.status().role == "leader");
    let status = replica.status();
    let alarm = status.disk.alarm.clone().expect("the alarm is raised");
    assert!(alarm.contains("min_free_bytes"), "{alarm}");
    assert!(status.disk.free_bytes > 0 && status.disk.total_bytes >= status.disk.free_bytes, "{status:?}");
    // Not enough room for the reserve either: it is not created.
    assert_eq!(status.disk.reserve_bytes, 0);
    assert!(!dir.path().join("node1").join(onekv_replica::RESERVE_FILE).exists());
    match put(&replica, 2, "after") {
        Err(error @ ReplicaError::DiskFull(_)) => assert!(error.to_string().starts_with("disk full: ")),
        other => panic!("expected a disk-full refusal, got {other:?}"),
    }
    // Reads go on, linearizable ones included.
    assert_eq!(replica.get(b"before").unwrap(), Some(b"before".to_vec()));
    let (tx, rx) = mpsc::channel();
    replica.read_barrier(Box::new(move |r| tx.send(r).unwrap()));
    rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(replica.get(b"after").unwrap(), None);
    replica.shutdown();
}

/// Creates a cluster of `ids` under `dir`, lets it elect a leader and bring every replica up to
/// date (so none is rejoining, as in a brand-new cluster), and stops it.
fn create_cluster(dir: &std::path::Path, ids: &[u64]) {
    let router = Arc::new(Router::default());
    for &id in ids {
        let mut config = ReplicaConfig::new(id, ids.to_vec(), dir.join(format!("node{id}")));
        config.tick = Duration::from_millis(20);
        router.add(id, Replica::open(config, router.clone()).unwrap());
    }
    wait_for("every replica caught up", || {
        ids.iter().all(|&id| {
            let status = router.get(id).unwrap().status();
            !status.rejoining && status.leader_id.is_some()
        })
    });
    for &id in ids {
        router.get(id).unwrap().shutdown();
        router.remove(id);
    }
}

#[test]
fn a_leader_in_alarm_hands_leadership_to_a_follower() {
    let dir = tempfile::tempdir().unwrap();
    let ids = vec![1, 2, 3];
    // An existing cluster: in a new one, no replica votes before every member asked for a vote
    // (it cannot tell a new cluster from a member whose disk was wiped), so node 1 would not be
    // elected first.
    create_cluster(dir.path(), &ids);
    let router = Arc::new(Router::default());
    for id in ids.clone() {
        let mut config = ReplicaConfig::new(id, ids.clone(), dir.path().join(format!("node{id}")));
        config.tick = Duration::from_millis(20);
        if id == 1 {
            // Node 1's disk is "full", and it campaigns long before the others: it is elected
            // first, and must give leadership away.
            config.min_free_bytes = u64::MAX;
            config.election_ticks = 5;
        } else {
            config.election_ticks = 40;
            config.reserve_bytes = 1 << 20;
        }
        let replica = Replica::open(config, router.clone()).unwrap();
        router.add(id, replica);
    }
    let replica = |id: u64| router.get(id).unwrap();
    // Within about an election timeout of node 1's election another node leads (without the
    // hand-off node 1 would lead for good: the others hear its heartbeats), and takes writes.
    let started = Instant::now();
    wait_for("another leader", || {
        [2, 3].iter().any(|id| {
            let status = replica(*id).status();
            status.role == "leader" && replica(1).status().leader_id == Some(*id)
        })
    });
    let handed_off = started.elapsed();
    assert!(handed_off < Duration::from_secs(5), "the hand-off took {handed_off:?}");
    let status = replica(1).status();
    assert!(status.disk.alarm.is_some(), "{status:?}");
    // Node 1 saw two leaders: itself first, then the one it handed over to.
    assert!(status.leader_changes >= 2, "node 1 was never the leader: {status:?}");
    let leader = [2, 3].into_iter().find(|id| replica(*id).status().role == "leader").unwrap();
    let mut last = 0;
    for seq in 1..=20 {
        last = put(&replica(leader), seq, &format!("key{seq}")).unwrap().index;
    }
    // Node 1 is a follower in alarm: it keeps replicating (and redirects clients to the leader).
    wait_for("node 1 to catch up", || replica(1).status().applied_index >= last);
    assert_eq!(replica(1).get(b"key20").unwrap(), Some(b"key20".to_vec()));
    match put(&replica(1), 100, "via-node-1") {
        Err(ReplicaError::NotLeader { leader: Some(id) }) => assert_eq!(id, leader),
        other => panic!("expected a redirect, got {other:?}"),
    }
    // The healthy nodes hold their reserve.
    for id in [2, 3] {
        assert_eq!(replica(id).status().disk.reserve_bytes, 1 << 20);
        assert_eq!(replica(id).status().disk.alarm, None);
    }
    for id in ids {
        router.remove(id).unwrap().shutdown();
    }
}
