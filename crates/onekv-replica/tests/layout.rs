//! Replica decoupling (DEPART) in a running shard: the leader's index tree is leveled and the
//! followers' trees keep sorted runs; when leadership moves, the new leader levels its tree while
//! it serves reads that stay correct, the old leader's tree goes to runs, and everything survives a
//! restart. With `IndexLayout::Uniform` every tree stays leveled.

mod common;

use common::cluster::Cluster;
use onekv_replica::{Command, IndexLayout, ReplicaConfig, ReplicaStatus, StorageMode, WriteOp};
use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Above the leveled layout's L0 threshold (4), so a followed tree holds more L0 runs than a
/// leader's may.
const FOLLOWER_RUNS: u8 = 8;

/// Small memtables and frequent flushes, so trees get many runs and compactions.
fn decoupled(config: &mut ReplicaConfig) {
    config.memtable_bytes = 64 << 10;
    config.flush_every_entries = 4;
    config.index_layout = IndexLayout::Decoupled { follower_runs: FOLLOWER_RUNS };
}

fn uniform(config: &mut ReplicaConfig) {
    decoupled(config);
    config.index_layout = IndexLayout::Uniform;
}

fn key(i: usize) -> String {
    format!("user{:06}", (i * 7_919) % 10_007)
}

fn value(i: usize, round: usize) -> Vec<u8> {
    (0..120).map(|j| (i * 31 + j * 7 + round) as u8).collect()
}

/// Writes `keys` keys (`round` picks their values) in entries of 50, recording them in `model`.
fn load(cluster: &mut Cluster, keys: usize, round: usize, model: &mut BTreeMap<String, Vec<u8>>) -> u64 {
    let mut last = 0;
    for batch in (0..keys).collect::<Vec<_>>().chunks(50) {
        let ops = batch
            .iter()
            .map(|&i| {
                model.insert(key(i), value(i, round));
                WriteOp { key: key(i).into(), value: Some(value(i, round)), expiry: Default::default() }
            })
            .collect();
        last = cluster.propose(Command::Write(ops)).unwrap().index;
    }
    last
}

fn status(cluster: &Cluster, id: u64) -> ReplicaStatus {
    cluster.replica(id).status()
}

/// A linearizable read at the leader, retried while leadership moves.
fn read(cluster: &Cluster, key: &str) -> Option<Vec<u8>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let replica = cluster.replica(cluster.leader());
        let (tx, rx) = mpsc::channel();
        replica.read_barrier(Box::new(move |r| tx.send(r).unwrap()));
        match rx.recv_timeout(Duration::from_secs(10)).unwrap() {
            Ok(()) => return replica.get(key.as_bytes()).unwrap(),
            Err(error) => assert!(Instant::now() < deadline, "reading {key}: {error}"),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn check_reads(cluster: &Cluster, model: &BTreeMap<String, Vec<u8>>) {
    for (key, value) in model.iter().step_by(17) {
        assert_eq!(read(cluster, key).as_deref(), Some(&value[..]), "{key}");
    }
}

#[test]
fn followers_keep_runs_and_a_new_leader_levels_its_tree_while_serving() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, StorageMode::OneLog, decoupled);
    let mut model = BTreeMap::new();
    let mut last = load(&mut cluster, 3_000, 0, &mut model);
    last = last.max(load(&mut cluster, 3_000, 1, &mut model));
    for id in 1..=3 {
        cluster.wait_applied(id, last);
    }
    let leader = cluster.leader();
    let followers: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    assert_eq!(status(&cluster, leader).index_layout, "leveled");
    for &id in &followers {
        let follower = status(&cluster, id);
        assert_eq!(follower.index_layout, "runs", "node {id}");
        // Merged at S flushed runs: the runs layout wrote compactions, the leveled one none here.
        assert!(follower.index_runs_compaction_bytes > 0, "node {id}: {follower:?}");
        assert_eq!(follower.index_leveled_compaction_bytes, 0, "node {id}");
        // At most S flushed runs beside the merged one (one more while a flush waits for its
        // compaction step).
        assert!(follower.index_sorted_runs <= u64::from(FOLLOWER_RUNS) + 2, "node {id}: {follower:?}");
    }
    assert!(status(&cluster, leader).index_leveled_compaction_bytes > 0);
    check_reads(&cluster, &model);

    // Leadership moves to a follower whose tree holds as many flushed runs as make a leveled tree
    // compact (its L0 threshold, 4, beside the merged run; written until it does): it levels the
    // tree while it serves, and reads meanwhile are correct.
    let successor = followers[0];
    let mut round = 10;
    let mut write_a_round = |cluster: &mut Cluster, model: &mut BTreeMap<String, Vec<u8>>| {
        round += 1;
        assert!(round < 400, "node {successor} never got there: {:?}", status(cluster, successor));
        let last = load(cluster, 200, round, model);
        cluster.wait_applied(successor, last);
    };
    // From just after a merge (written until one happens, if the tree is already past 4 flushed
    // runs), so the next merge is as far as it can be.
    let runs = status(&cluster, successor).index_sorted_runs;
    if runs >= 5 {
        while status(&cluster, successor).index_sorted_runs >= runs {
            write_a_round(&mut cluster, &mut model);
        }
    }
    while status(&cluster, successor).index_sorted_runs < 5 {
        write_a_round(&mut cluster, &mut model);
    }
    // A follower-time merge (at FOLLOWER_RUNS flushed runs) racing the transfer would leave the
    // new leader nothing to level: noted, so the check below knows which happened.
    let runs_bytes_before = status(&cluster, successor).index_runs_compaction_bytes;
    let (tx, rx) = mpsc::channel();
    cluster.replica(leader).transfer_leadership(successor, Box::new(move |r| tx.send(r).unwrap()));
    rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        check_reads(&cluster, &model);
        let now = status(&cluster, successor);
        if now.role == "leader" && now.index_leveled && now.last_leveling_ms.is_some() {
            assert_eq!(now.index_layout, "leveled");
            break;
        }
        assert!(Instant::now() < deadline, "node {successor} never leveled its tree: {now:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let now = status(&cluster, successor);
    if now.index_runs_compaction_bytes == runs_bytes_before {
        assert!(now.index_leveled_compaction_bytes > 0, "leveling compacted nothing: {now:?}");
    }
    // Otherwise a follower-time merge got there first and left the leader nothing to level.
    // The old leader now follows: its tree goes to the runs layout with its next flush.
    let last = load(&mut cluster, 1_000, 2, &mut model);
    cluster.wait_applied(leader, last);
    let deadline = Instant::now() + Duration::from_secs(20);
    while status(&cluster, leader).index_layout != "runs" {
        assert!(Instant::now() < deadline, "node {leader} kept a leveled tree as a follower");
        std::thread::sleep(Duration::from_millis(20));
    }
    check_reads(&cluster, &model);

    // Everything survives restarting every node.
    for id in 1..=3 {
        cluster.stop(id);
    }
    for id in 1..=3 {
        cluster.open(id);
    }
    check_reads(&cluster, &model);
    cluster.shutdown();
}

#[test]
fn uniform_keeps_every_tree_leveled() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, StorageMode::OneLog, uniform);
    let mut model = BTreeMap::new();
    let last = load(&mut cluster, 3_000, 0, &mut model);
    for id in 1..=3 {
        cluster.wait_applied(id, last);
    }
    for id in 1..=3 {
        let node = status(&cluster, id);
        assert_eq!(node.index_layout, "leveled", "node {id}");
        assert_eq!(node.index_runs_compaction_bytes, 0, "node {id}");
        assert!(node.index_leveled_compaction_bytes > 0, "node {id}: {node:?}");
    }
    check_reads(&cluster, &model);
    cluster.shutdown();
}
