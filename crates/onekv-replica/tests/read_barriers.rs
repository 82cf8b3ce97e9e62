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
