//! A replica whose Raft append fails (as after a failed write or fsync) stops taking part: the
//! pending write and every later write and linearizable read fail with a storage error at once,
//! and its status names the failure. Its own test binary, because failpoints are process-wide.
//! Needs the `failpoints` feature (`scripts/test` turns it on).

use onekv_replica::local::Router;
use onekv_replica::{Command, Replica, ReplicaConfig, ReplicaError, RequestId, WriteOp};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn put(replica: &Replica, key: &str) -> Result<(), ReplicaError> {
    let (tx, rx) = mpsc::channel();
    let command = Command::Write(vec![WriteOp { key: key.into(), value: Some(b"v".to_vec()) }]);
    replica.propose(RequestId::default(), command, Box::new(move |r| drop(tx.send(r))));
    rx.recv_timeout(Duration::from_secs(10)).expect("an answer, not a hang").map(|_| ())
}

/// Opens the one-node replica in `dir` and waits until it leads.
fn open_leader(dir: &std::path::Path) -> Replica {
    let mut config = ReplicaConfig::new(1, vec![1], dir);
    config.tick = Duration::from_millis(10);
    let router = Arc::new(Router::default());
    let replica = Replica::open(config, router.clone()).unwrap();
    router.add(1, replica.clone());
    let deadline = Instant::now() + Duration::from_secs(10);
    while replica.status().role != "leader" {
        assert!(Instant::now() < deadline, "the single node did not become leader");
        std::thread::sleep(Duration::from_millis(5));
    }
    replica
}

#[test]
fn a_failed_raft_append_stops_the_replica_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let replica = open_leader(dir.path());
    put(&replica, "before").unwrap();

    onekv_replica::failpoints::arm("fail-raft-append", "return").unwrap();
    let failed = put(&replica, "during");
    assert!(matches!(&failed, Err(ReplicaError::Storage(m)) if m.contains("injected")), "{failed:?}");
    onekv_replica::failpoints::arm("fail-raft-append", "off").unwrap();

    // Nothing is retried through the failed log: later requests fail at once.
    assert!(matches!(put(&replica, "after"), Err(ReplicaError::Storage(_))));
    let (tx, rx) = mpsc::channel();
    replica.read_barrier(Box::new(move |r| drop(tx.send(r))));
    assert!(matches!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), Err(ReplicaError::Storage(_))));
    let deadline = Instant::now() + Duration::from_secs(5);
    while replica.status().failure.is_none() {
        assert!(Instant::now() < deadline, "status does not report the failure");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(replica.get(b"before").unwrap().as_deref(), Some(&b"v"[..]), "stale reads still work");
    replica.shutdown();

    // A restart recovers what was durable.
    let replica = open_leader(dir.path());
    put(&replica, "restarted").unwrap();
    assert_eq!(replica.get(b"before").unwrap().as_deref(), Some(&b"v"[..]));
    assert_eq!(replica.get(b"during").unwrap(), None);
    replica.shutdown();
}
