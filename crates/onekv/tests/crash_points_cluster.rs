//! XLL's crash points on a replicated cluster of real `onekv server` processes holding four shards
//! (so one append carries several groups' entries, and a crash inside it cuts across groups): each
//! of the three nodes is armed to crash at a different hit of the same point, so the cluster loses
//! a follower or a leader at that exact step while four writers keep going on every shard; every
//! node that crashes is restarted at once, unarmed. Afterwards every acknowledged write reads back
//! its value, both linearizably and from every node's own copy.
//!
//! Needs the binary built with crash points (`--features onekv/failpoints`, as `scripts/test`
//! does).

mod common;

use common::{TestCluster, read_back, read_back_from, run_bounded};
use onekv_replica::failpoints::CRASH_EXIT_CODE;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The tests share two cores; one cluster at a time keeps elections prompt.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// If node `id` has exited, checks it stopped at its crash point (`point` names it in the
/// failure) and restarts it unarmed; whether it had.
async fn restart_if_crashed(cluster: &mut TestCluster, id: u64, point: &str) -> bool {
    let Some(code) = cluster.poll_exit(id) else { return false };
    assert_eq!(code, Some(CRASH_EXIT_CODE), "node {id} exited without reaching {point}");
    cluster.set_env(id, Vec::new());
    cluster.restart(id).await;
    true
}

fn crash_point(point: &'static str, skips: [u32; 3]) {
    let _serial = one_at_a_time();
    run_bounded(Duration::from_secs(120), async move {
        // Every node armed, each at a different hit of the point (hits counted from the start:
        // electing and settling four shards' leaders takes a few dozen appends before the writes).
        let armed = |id: u64| {
            vec![("ONEKV_FAILPOINTS".into(), format!("{point}={}*off->return", skips[id as usize - 1]))]
        };
        let mut cluster = TestCluster::start_with_env(3, |config| config.cluster.shards = 4, armed).await;
        let client = cluster.client();
        let acks = Arc::new(Mutex::new(Pairs::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut writers = tokio::task::JoinSet::new();
        for writer in 0..4 {
            let (client, acks, stop) = (client.clone(), acks.clone(), stop.clone());
            writers.spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("w{writer}-{n:06}").into_bytes();
                    let value = format!("{point}-{writer}-{n}").repeat(1 + (n % 7) as usize).into_bytes();
                    // An error is no acknowledgement: the write may or may not have happened.
                    if client.put(&key, &value).await.is_ok() {
                        acks.lock().unwrap().push((key, value));
                    }
                    n += 1;
                }
            });
        }

        // Restart each node that stops at its crash point, unarmed, until all three have crashed.
        let mut crashed = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while crashed.len() < 3 && Instant::now() < deadline {
            for id in 1..=3 {
                if restart_if_crashed(&mut cluster, id, point).await {
                    crashed.push(id);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!crashed.is_empty(), "{point}: no node reached the crash point within 60 s");
        // Writes must go on after the crashes (a restarted node may first need an election).
        let before_stop = acks.lock().unwrap().len();
        let continued_by = Instant::now() + Duration::from_secs(15);
        tokio::time::sleep(Duration::from_millis(500)).await;
        while acks.lock().unwrap().len() <= before_stop && Instant::now() < continued_by {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.store(true, Ordering::Relaxed);
        while let Some(joined) = writers.join_next().await {
            joined.expect("a writer task");
        }
        let acked = std::mem::take(&mut *acks.lock().unwrap());
        assert!(acked.len() > before_stop, "{point}: no write was acknowledged after the crashes");

        // Disarm any node that never reached its point, so checking cannot crash it.
        for id in (1..=3).filter(|id| !crashed.contains(id)) {
            cluster.kill9(id);
            cluster.set_env(id, Vec::new());
            cluster.restart(id).await;
        }
        let (bad, examples) = read_back(&client, &acked).await;
        assert_eq!(bad, 0, "{point}: acknowledged writes lost or wrong: {examples:?}");
        for id in 1..=3 {
            cluster.wait_caught_up(id).await;
            let endpoint = cluster.endpoint(id).to_string();
            let (bad, examples) = read_back_from(&client, &endpoint, &acked).await;
            assert_eq!(bad, 0, "{point}: node {id} lacks acknowledged writes: {examples:?}");
        }
        eprintln!("{point}: {} acked writes, nodes {crashed:?} crashed and recovered", acked.len());
    });
}

#[test]
fn crash_before_the_raft_append() {
    crash_point("before-raft-append", [80, 240, 440]);
}

#[test]
fn crash_during_the_raft_append() {
    crash_point("during-raft-append", [12, 40, 80]);
}

#[test]
fn crash_after_the_raft_append() {
    crash_point("after-raft-append", [100, 280, 480]);
}

#[test]
fn crash_before_apply() {
    crash_point("before-apply", [80, 240, 440]);
}

#[test]
fn crash_after_apply_before_the_reply() {
    crash_point("after-apply", [100, 280, 480]);
}

#[test]
fn crash_after_the_reply() {
    crash_point("after-reply", [80, 240, 440]);
}

/// The member list's files cross crash points too. A node started with `--join` crashes after
/// writing the cluster's member list but before its map (`join-before-map`); restarted unarmed, it
/// joins again. Then `onekv node add` adds it while two members crash adopting the new list, one
/// before its `MEMBERS` file is replaced and one after (`before-member-list-write`,
/// `after-member-list-write`), and are restarted unarmed. The addition completes, every node ends
/// at the new list (a restarted node reads it back or fetches it again), and no acknowledged write
/// is lost.
#[test]
fn crash_while_the_member_list_changes() {
    let _serial = one_at_a_time();
    run_bounded(Duration::from_secs(240), async {
        let arm = |point: &str| vec![("ONEKV_FAILPOINTS".to_string(), format!("{point}=return"))];
        let armed = |id: u64| match id {
            2 => arm("before-member-list-write"),
            3 => arm("after-member-list-write"),
            _ => Vec::new(),
        };
        let mut cluster = TestCluster::start_with_env(3, |config| config.cluster.shards = 4, armed).await;
        let client = cluster.client();
        let acks = Arc::new(Mutex::new(Pairs::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (client, acks, stop) = (client.clone(), acks.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let (key, value) = (format!("m-{n:06}").into_bytes(), format!("v{n}").into_bytes());
                    if client.put(&key, &value).await.is_ok() {
                        acks.lock().unwrap().push((key, value));
                    }
                    n += 1;
                }
            })
        };

        let four = cluster.add_spare_with_env(arm("join-before-map"));
        let deadline = Instant::now() + Duration::from_secs(60);
        while !restart_if_crashed(&mut cluster, four, "join-before-map").await {
            assert!(Instant::now() < deadline, "the joining node did not reach join-before-map");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        let endpoints: Vec<String> = (1..=3).map(|id| cluster.endpoint(id).to_string()).collect();
        let (address, secret) = (cluster.endpoint(four).to_string(), cluster.peer_secret_file());
        let add = tokio::spawn(async move {
            common::onekv_node(vec!["add".into(), address], &endpoints, &secret).await
        });
        let mut crashed = Vec::new();
        while !add.is_finished() {
            for id in [2, 3] {
                if restart_if_crashed(&mut cluster, id, "its member-list point").await {
                    crashed.push(id);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (ok, text) = add.await.expect("the node add task");
        assert!(ok, "onekv node add failed: {text}");
        crashed.sort_unstable();
        assert_eq!(crashed, [2, 3], "both members crash adopting the new list: {text}");
        let deadline = Instant::now() + Duration::from_secs(20);
        for id in 1..=4 {
            loop {
                let status = cluster.status(id).await.expect("status");
                if (status.members_epoch, status.members.len()) == (2, 4) {
                    break;
                }
                assert!(Instant::now() < deadline, "node {id} is at {status:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        assert!(!cluster.status(four).await.expect("status").shards.is_empty(), "{text}");

        stop.store(true, Ordering::Relaxed);
        writer.await.expect("the writer");
        let acked = std::mem::take(&mut *acks.lock().unwrap());
        assert!(acked.len() > 20, "the writer made little progress: {}", acked.len());
        let (bad, examples) = read_back(&client, &acked).await;
        assert_eq!(bad, 0, "acknowledged writes lost or wrong: {examples:?}");
    });
}
