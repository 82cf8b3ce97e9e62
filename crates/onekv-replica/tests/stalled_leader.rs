//! A leader that cannot apply (stalled: an ORDER naming a fast write it lacks, a put by reference
//! to a value its GC compressed) gives the shard up, also while a client pinned to it keeps
//! sending it writes (whose appends would otherwise keep the followers from ever campaigning),
//! and, once another node leads, catches up from that node's snapshot; a stalled follower still
//! votes, so a shard whose leader is lost elects another. Its own test binary: the failpoint it
//! arms is process-wide (its tests take turns).

#![cfg(feature = "failpoints")]

mod common;

use common::cluster::Cluster;
use onekv_replica::{Command, RequestId, StorageMode, WriteOp};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn put(key: &str, value: &[u8]) -> Command {
    Command::Write(vec![WriteOp::put(key.as_bytes().to_vec(), value.to_vec())])
}

/// Held by each test: the failpoint is the process's.
static FAILPOINT: Mutex<()> = Mutex::new(());

/// Waits until `key` reads `value` on `node` (once it can apply again).
fn wait_for_value(cluster: &Cluster, node: u64, key: &[u8], value: &[u8]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.replica(node).get(key).unwrap().as_deref() != Some(value) {
        assert!(
            Instant::now() < deadline,
            "node {node} never caught up: {:?}",
            cluster.replica(node).status()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Three replicas, and a follower of the leader's (returned: leader, stalled, other) that
/// stalls at the next entry it applies.
fn with_a_stalled_follower(dir: &std::path::Path) -> (Cluster, u64, u64, u64) {
    let cluster = Cluster::start(dir, 3, StorageMode::OneLog, |_| {});
    let leader = cluster.leader();
    let stalled = (1..=3).find(|&id| id != leader).unwrap();
    let other = (1..=3).find(|&id| id != leader && id != stalled).unwrap();
    onekv_replica::failpoints::arm("apply-stalls-node", &format!("return({stalled})")).unwrap();
    (cluster, leader, stalled, other)
}

/// Waits until `node` leads, within `within`; `why` names what failed.
fn wait_until_it_leads(cluster: &Cluster, node: u64, within: Duration, why: &str) {
    let deadline = Instant::now() + within;
    while cluster.replica(node).status().role != "leader" {
        let others: Vec<_> =
            cluster.ids.iter().filter(|&&id| id != node).filter_map(|&id| cluster.router.get(id)).collect();
        assert!(
            Instant::now() < deadline,
            "{why}: {:?}",
            others.iter().map(|r| r.status()).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_stalled_leader_hands_the_shard_on_while_a_client_keeps_writing_to_it() {
    let _turn = FAILPOINT.lock().unwrap_or_else(|e| e.into_inner());
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
    wait_for_value(&cluster, stalled, b"after", b"v1");
    assert_eq!(cluster.replica(stalled).get(b"before").unwrap().as_deref(), Some(&b"v0"[..]));
    cluster.shutdown();
}

#[test]
fn a_stalled_follower_still_votes_when_the_leader_is_lost() {
    let _turn = FAILPOINT.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (mut cluster, leader, stalled, other) = with_a_stalled_follower(dir.path());
    cluster.put("before", b"v0");
    cluster.wait_applied(other, cluster.replica(leader).status().applied_index);
    // The leader goes: the remaining two are a quorum only if the stalled one votes.
    cluster.stop(leader);
    let why = format!("no leader without node {leader}: node {stalled}, stalled, never voted");
    wait_until_it_leads(&cluster, other, Duration::from_secs(20), &why);
    cluster.put("after", b"v1");
    onekv_replica::failpoints::arm("apply-stalls-node", "off").unwrap();
    // The new leader's snapshot brings it up to date (not an older one the leader had cached:
    // the shard, with a voter down, commits nothing without this replica).
    wait_for_value(&cluster, stalled, b"after", b"v1");
    // Caught up, it takes entries again at once (the shard, a voter down, commits nothing
    // without it): the leader learns the snapshot was installed.
    let started = Instant::now();
    cluster.put("later", b"v2");
    assert!(started.elapsed() < Duration::from_secs(5), "a write took {:?}", started.elapsed());
    cluster.open(leader);
    cluster.shutdown();
}

#[test]
fn a_stalled_follower_with_the_longest_log_campaigns_when_no_leader_shows_up() {
    let _turn = FAILPOINT.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (mut cluster, leader, stalled, behind) = with_a_stalled_follower(dir.path());
    // `behind` misses the write, committed by the leader and the stalled replica; then the
    // leader goes. `behind` cannot win a vote (its log is shorter), so only the stalled replica
    // can be elected, and then hand the shard on.
    cluster.router.set_drop_filter(Some(Box::new(move |message| message.to == behind)));
    cluster.put("committed", b"v1");
    cluster.stop(leader);
    cluster.router.set_drop_filter(None);
    let why = format!("no leader: node {stalled}, stalled and holding the longest log, never campaigned");
    wait_until_it_leads(&cluster, behind, Duration::from_secs(30), &why);
    assert_eq!(cluster.linearizable_get("committed").as_deref(), Some(&b"v1"[..]));
    onekv_replica::failpoints::arm("apply-stalls-node", "off").unwrap();
    wait_for_value(&cluster, stalled, b"committed", b"v1");
    cluster.open(leader);
    cluster.shutdown();
}
