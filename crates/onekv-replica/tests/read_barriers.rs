//! Read barriers at a leader that was just elected: raft-rs drops a ReadIndex request until the
//! leader has committed an entry of its term, so a barrier sent in that window must wait for the
//! commit (one round), not hang until its caller gives up.

mod common;

use common::cluster::Cluster;
use onekv_replica::{ReplicaError, StorageMode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

#[test]
fn barriers_sent_as_leadership_arrives_are_answered_promptly() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, StorageMode::OneLog, |_| {});
    cluster.put("k", b"v");
    for round in 0..6 {
        let leader = cluster.leader();
        let target = (1..=3).find(|&id| id != leader).unwrap();
        let replica = cluster.replica(target);
        // Barriers sent back to back at the target while leadership moves to it: those that reach
        // it as a follower are refused at once; the first ones it takes as a leader may arrive
        // before its first commit.
        let stop = Arc::new(AtomicBool::new(false));
        let hammer = {
            let (replica, stop) = (replica.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut answered_as_leader = 0;
                while !stop.load(Ordering::SeqCst) && answered_as_leader < 50 {
                    let (tx, rx) = mpsc::channel();
                    let sent = Instant::now();
                    replica.read_barrier(Box::new(move |r| {
                        let _ = tx.send(r);
                    }));
                    match rx.recv_timeout(Duration::from_secs(3)) {
                        Ok(Ok(())) => answered_as_leader += 1,
                        Ok(Err(ReplicaError::NotLeader { .. })) => {}
                        Ok(Err(other)) => panic!("barrier failed: {other}"),
                        Err(_) => {
                            panic!("round {round}: a barrier at node {target} hung for {:?}", sent.elapsed())
                        }
                    }
                }
                answered_as_leader
            })
        };
        let (tx, rx) = mpsc::channel();
        cluster.replica(leader).transfer_leadership(target, Box::new(move |r| tx.send(r).unwrap()));
        rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while cluster.router.leader() != Some(target) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, Ordering::SeqCst);
        let answered = hammer.join().expect("no barrier hung");
        assert!(answered > 0, "round {round}: node {target} never answered a barrier as the leader");
    }
    cluster.shutdown();
}

/// Sends one barrier to `replica` and waits up to `within` for its answer (`None`: none came).
fn barrier(replica: &onekv_replica::Replica, within: Duration) -> Option<Result<(), ReplicaError>> {
    let (tx, rx) = mpsc::channel();
    replica.read_barrier(Box::new(move |r| {
        let _ = tx.send(r);
    }));
    rx.recv_timeout(within).ok()
}

/// With lease reads, a leader answers most barriers without a ReadIndex round; cut off from the
/// others, it stops answering once the lease of its last confirmed round runs out, and never
/// answers one after the others elected a new leader and took a write.
#[test]
fn a_lease_answers_reads_at_once_and_ends_before_another_leader_can_take_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, StorageMode::OneLog, |config| config.lease_reads = true);
    cluster.put("k", b"v1");
    let leader = cluster.leader();
    let old = cluster.replica(leader);
    for _ in 0..300 {
        assert!(matches!(barrier(&old, Duration::from_secs(3)), Some(Ok(()))));
    }
    let status = old.status();
    assert!(
        status.reads_by_lease > 10 * status.reads_by_read_index,
        "most barriers were answered by the lease: {} by lease, {} by rounds",
        status.reads_by_lease,
        status.reads_by_read_index
    );

    // Cut the leader off. The last round it sent was confirmed at most now: its lease ends within
    // election_ticks - 2 = 8 ticks of 20 ms from here.
    cluster.router.set_drop_filter(Some(Box::new(move |m| m.from == leader || m.to == leader)));
    let cut = Instant::now();
    let lease = Duration::from_millis(8 * 20);
    // A read answered just inside the lease is seen a little later here.
    let slack = Duration::from_millis(20);
    let mut last_answered = None;
    while cut.elapsed() < lease * 3 {
        if let Some(Ok(())) = barrier(&old, Duration::from_millis(20)) {
            last_answered = Some(cut.elapsed());
        }
    }
    assert!(
        last_answered.is_none_or(|at| at < lease + slack),
        "the cut-off leader answered a read {last_answered:?} after it was cut off, past its lease of {lease:?}"
    );
    // The others elect a new leader and take a write; the old one answers no read meanwhile.
    let others: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let new_leader = loop {
        if let Some(&id) = others.iter().find(|&&id| cluster.replica(id).status().role == "leader") {
            break id;
        }
        assert!(Instant::now() < deadline, "no new leader among {others:?}");
        std::thread::sleep(Duration::from_millis(10));
    };
    let (tx, rx) = mpsc::channel();
    let command = onekv_replica::Command::Write(vec![onekv_replica::WriteOp {
        key: b"k".to_vec(),
        value: Some(b"v2".to_vec()),
        expiry: Default::default(),
    }]);
    let id = onekv_replica::RequestId { client: 9, seq: 1 };
    cluster.replica(new_leader).propose(id, command, Box::new(move |r| drop(tx.send(r))));
    rx.recv_timeout(Duration::from_secs(10)).unwrap().expect("the new leader takes the write");
    for _ in 0..5 {
        if let Some(Ok(())) = barrier(&old, Duration::from_millis(50)) {
            panic!("the old leader answered a read after a new leader took a write: it would read v1");
        }
    }
    cluster.router.set_drop_filter(None);
    cluster.shutdown();
}
