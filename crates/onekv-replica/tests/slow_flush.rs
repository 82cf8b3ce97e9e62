//! Finding 9 of issue 13: index flushes (and compactions) run off the node loop. A flush made to
//! take 3 s (the `during-index-flush` point armed with a sleep) neither stalls writes nor costs the
//! leader its leadership; before, the loop itself wrote the table and sent no heartbeat meanwhile.
//! Its own test binary, because failpoints are process-wide. Needs the `failpoints` feature.

use onekv_replica::local::Router;
use onekv_replica::{Command, Replica, ReplicaConfig, RequestId, WriteOp};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[test]
fn a_slow_index_flush_stalls_neither_writes_nor_heartbeats() {
    let dir = tempfile::tempdir().unwrap();
    let router = Arc::new(Router::default());
    for id in 1..=3 {
        let mut config = ReplicaConfig::new(id, vec![1, 2, 3], dir.path().join(format!("node{id}")));
        config.tick = Duration::from_millis(100);
        config.memtable_bytes = 16 << 10;
        router.add(id, Replica::open(config, router.clone()).unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let leader = loop {
        if let Some(id) = router.leader() {
            break id;
        }
        assert!(Instant::now() < deadline, "no leader");
        std::thread::sleep(Duration::from_millis(10));
    };
    let replica = router.get(leader).unwrap();
    let changes_before = replica.status().leader_changes;
    onekv_replica::failpoints::arm("during-index-flush", "sleep(3000)").unwrap();
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut n = 0u64;
    while started.elapsed() < Duration::from_secs(6) {
        let (tx, rx) = mpsc::channel();
        let command = Command::Write(vec![WriteOp {
            key: format!("k{n:06}").into(),
            value: Some(vec![b'v'; 1024]),
            expiry: Default::default(),
        }]);
        let put = Instant::now();
        replica.propose(RequestId { client: 3, seq: n + 1 }, command, Box::new(move |r| drop(tx.send(r))));
        rx.recv_timeout(Duration::from_secs(10)).expect("an answer").expect("the write succeeds");
        slowest = slowest.max(put.elapsed());
        n += 1;
    }
    onekv_replica::failpoints::arm("during-index-flush", "off").unwrap();
    let status = replica.status();
    assert!(status.index_flushes >= 1, "a flush completed during the run: {status:?}");
    assert!(n > 100, "only {n} writes in 6 s");
    assert!(slowest < Duration::from_millis(1500), "a write waited {slowest:?} for a slow flush");
    assert_eq!(status.role, "leader");
    assert_eq!(status.leader_changes, changes_before, "leadership changed during a slow flush");
    for id in 1..=3 {
        router.remove(id).unwrap().shutdown();
    }
}
