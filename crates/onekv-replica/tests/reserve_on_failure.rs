//! A replica that fails on a storage error gives up its disk reserve (it writes nothing more; the
//! room lets a later recovery, and the disk's other writers, go on), and the next open re-creates
//! it. Its own test binary, because failpoints are process-wide. Needs the `failpoints` feature
//! (`scripts/test` turns it on).

use onekv_replica::local::Router;
use onekv_replica::{Command, RESERVE_FILE, Replica, ReplicaConfig, ReplicaError, RequestId, WriteOp};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const RESERVE: u64 = 1 << 20;

fn put(replica: &Replica, key: &str) -> Result<(), ReplicaError> {
    let (tx, rx) = mpsc::channel();
    let command = Command::Write(vec![WriteOp {
        key: key.into(),
        value: Some(b"v".to_vec()),
        expiry: Default::default(),
    }]);
    replica.propose(RequestId::default(), command, Box::new(move |r| drop(tx.send(r))));
    rx.recv_timeout(Duration::from_secs(10)).expect("an answer, not a hang").map(|_| ())
}

fn open_leader(dir: &std::path::Path) -> Replica {
    let mut config = ReplicaConfig::new(1, vec![1], dir);
    config.tick = Duration::from_millis(10);
    config.reserve_bytes = RESERVE;
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
fn a_failed_replica_gives_up_its_reserve_and_the_next_open_takes_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let reserve = dir.path().join(RESERVE_FILE);
    let replica = open_leader(dir.path());
    assert_eq!(std::fs::metadata(&reserve).unwrap().len(), RESERVE);
    assert_eq!(replica.status().disk.reserve_bytes, RESERVE);
    put(&replica, "before").unwrap();

    onekv_replica::failpoints::arm("fail-raft-append", "return").unwrap();
    assert!(matches!(put(&replica, "during"), Err(ReplicaError::Storage(_))));
    onekv_replica::failpoints::arm("fail-raft-append", "off").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while reserve.exists() || replica.status().disk.reserve_bytes != 0 {
        assert!(Instant::now() < deadline, "the failed replica kept its reserve: {:?}", replica.status());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(replica.status().failure.is_some());
    replica.shutdown();

    let replica = open_leader(dir.path());
    assert_eq!(std::fs::metadata(&reserve).unwrap().len(), RESERVE);
    put(&replica, "after").unwrap();
    assert_eq!(replica.get(b"before").unwrap().as_deref(), Some(&b"v"[..]));
    replica.shutdown();
}
