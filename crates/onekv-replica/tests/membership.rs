//! Changing a shard's members while it serves writes: a new node joins as a learner, catches up
//! (through a snapshot when the log was compacted), replaces a voter through a joint
//! configuration, and the members survive restarts, whether recovery finds them in a flush or
//! replays the conf changes.

mod common;

use common::cluster::Cluster;
use onekv_replica::{Members, MembershipChange, ReplicaConfig, ReplicaError, StorageMode};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn value(i: usize) -> Vec<u8> {
    (0..100).map(|j| (i * 7 + j) as u8).collect()
}

/// Compacts the Raft log early, so a node that joins late needs a snapshot.
fn small_log(config: &mut ReplicaConfig) {
    config.memtable_bytes = 4 << 10;
    config.raft_log_keep_entries = 5;
    config.snapshot_timeout = Duration::from_secs(1);
}

/// Flushes the index only when a test asks (never on its own during the test).
fn rare_flushes(config: &mut ReplicaConfig) {
    config.flush_every_entries = 1 << 40;
    config.flush_every = Duration::from_secs(3600);
}

/// Flushes the index after every entry applied.
fn constant_flushes(config: &mut ReplicaConfig) {
    config.flush_every_entries = 1;
}

fn change(cluster: &Cluster, on: u64, change: MembershipChange) -> Result<Members, ReplicaError> {
    let (tx, rx) = mpsc::channel();
    cluster.replica(on).change_members(change, Box::new(move |r| tx.send(r).unwrap()));
    rx.recv_timeout(Duration::from_secs(10)).expect("an answer")
}

/// Asks the leader for `step` until it is applied (it is refused while an earlier change is
/// pending or a learner is still catching up).
fn change_when_ready(cluster: &Cluster, step: MembershipChange) -> Members {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match change(cluster, cluster.leader(), step.clone()) {
            Ok(members) => return members,
            Err(ReplicaError::Dropped(_) | ReplicaError::NotLeader { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(error) => panic!("{step:?} failed: {error}"),
        }
    }
}

/// Waits until every running node reports `voters` and no outgoing voters.
fn wait_members(cluster: &Cluster, nodes: &[u64], voters: &[u64], learners: &[u64]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for &id in nodes {
        loop {
            let status = cluster.replica(id).status();
            if status.voters == voters && status.learners == learners && status.outgoing_voters.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "node {id} never saw voters {voters:?}: {status:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[test]
fn a_new_node_catches_up_as_a_learner_then_replaces_the_leader_and_the_shard_keeps_every_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, StorageMode::OneLog, small_log);
    for i in 0..300 {
        cluster.put(&format!("k{i:04}"), &value(i));
    }
    let status = cluster.replica(cluster.leader()).status();
    assert!(status.first_index > 100, "the log was not compacted: {status:?}");

    // Node 4 starts with no members and waits; the leader adds it as a learner.
    cluster.join(4);
    let members =
        change_when_ready(&cluster, MembershipChange { add_learners: vec![4], ..Default::default() });
    assert_eq!(members, Members { voters: vec![1, 2, 3], learners: vec![4], outgoing_voters: vec![] });
    // Promoting it before it holds the log is refused until it has caught up; writes go on.
    for i in 300..350 {
        cluster.put(&format!("k{i:04}"), &value(i));
    }
    let last = cluster.put_indexed("last-before-promotion", b"x");
    cluster.wait_applied(4, last);
    let learner = cluster.replica(4).status();
    assert!(learner.first_index > 100, "the learner caught up without a snapshot: {learner:?}");
    assert_eq!(learner.learners, vec![4]);

    // The leader may not remove itself: leadership moves first.
    let old_leader = cluster.leader();
    let swap = MembershipChange { promote: vec![4], remove: vec![old_leader], ..Default::default() };
    let refused = change(&cluster, old_leader, swap.clone()).unwrap_err();
    assert!(refused.to_string().contains("transfer leadership"), "{refused}");
    let successor = (1..=3).find(|&id| id != old_leader).unwrap();
    let (tx, rx) = mpsc::channel();
    cluster.replica(old_leader).transfer_leadership(successor, Box::new(move |r| tx.send(r).unwrap()));
    rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while cluster.router.leader() != Some(successor) {
        assert!(Instant::now() < deadline, "leadership never moved to node {successor}");
        std::thread::sleep(Duration::from_millis(10));
    }

    // One step replaces the old leader by node 4, through a joint configuration the new leader
    // leaves on its own.
    let joint = change_when_ready(&cluster, swap);
    assert_eq!(
        joint.voters,
        [&[1, 2, 3][..], &[4]].concat().into_iter().filter(|&v| v != old_leader).collect::<Vec<_>>()
    );
    assert_eq!(joint.outgoing_voters, vec![1, 2, 3]);
    let voters: Vec<u64> = (1..=4).filter(|&v| v != old_leader).collect();
    let remaining: Vec<u64> = voters.clone();
    wait_members(&cluster, &remaining, &voters, &[]);

    // The removed node goes away; with a second node stopped too, the shard still commits only
    // if node 4 votes.
    cluster.stop(old_leader);
    let other = *voters.iter().find(|&&v| v != 4 && Some(v) != cluster.router.leader()).unwrap();
    cluster.stop(other);
    for i in 350..400 {
        cluster.put(&format!("k{i:04}"), &value(i));
    }
    cluster.open(other);

    // Every write reads back from node 4's own copy, and the members survive a full restart.
    let last = cluster.put_indexed("after", b"y");
    for &id in &voters {
        cluster.wait_applied(id, last);
    }
    let copy = cluster.replica(4);
    for i in 0..400 {
        assert_eq!(copy.get(format!("k{i:04}").as_bytes()).unwrap(), Some(value(i)), "k{i:04} on node 4");
    }
    for &id in &voters {
        cluster.stop(id);
    }
    for &id in &voters {
        cluster.open(id);
    }
    wait_members(&cluster, &voters, &voters, &[]);
    assert_eq!(cluster.linearizable_get("after").as_deref(), Some(&b"y"[..]));
    cluster.shutdown();
}

/// A node added while the leader still holds its whole log (nothing compacted) has no members of
/// its own: it must start from a snapshot, which carries them, not from entry 1 (the conf changes
/// in the log build on the founders, which it never had).
#[test]
fn a_learner_added_before_any_compaction_gets_the_members_from_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, StorageMode::OneLog, |_| {});
    for i in 0..20 {
        cluster.put(&format!("k{i:04}"), &value(i));
    }
    let status = cluster.replica(cluster.leader()).status();
    assert_eq!(status.first_index, 1, "the log was compacted: {status:?}");
    cluster.join(4);
    change_when_ready(&cluster, MembershipChange { add_learners: vec![4], ..Default::default() });
    let last = cluster.put_indexed("after-join", b"x");
    cluster.wait_applied(4, last);
    let learner = cluster.replica(4).status();
    assert_eq!(
        learner.members(),
        Members { voters: vec![1, 2, 3], learners: vec![4], outgoing_voters: vec![] }
    );
    assert!(learner.first_index > 1, "the learner took entries from 1 instead of a snapshot: {learner:?}");
    for i in 0..20 {
        assert_eq!(cluster.replica(4).get(format!("k{i:04}").as_bytes()).unwrap(), Some(value(i)));
    }
    // It can be promoted and then votes: with two of the founders stopped after a joint step that
    // also removes one of them, the shard still commits only with node 4.
    let leader = cluster.leader();
    let out = (1..=3).find(|&id| id != leader).unwrap();
    change_when_ready(
        &cluster,
        MembershipChange { promote: vec![4], remove: vec![out], ..Default::default() },
    );
    let voters: Vec<u64> = (1..=4).filter(|&id| id != out).collect();
    wait_members(&cluster, &voters, &voters, &[]);
    let other = *voters.iter().find(|&&id| id != 4 && id != leader).unwrap();
    cluster.stop(out);
    cluster.stop(other);
    cluster.put("with-node-4-voting", b"y");
    cluster.shutdown();
}

/// The members after a conf change come back from a restart both when a flush recorded them and
/// when recovery has to replay the conf change (no flush after it).
#[test]
fn members_survive_a_restart_from_a_flush_and_from_a_replay() {
    for (tweak, replayed) in [(rare_flushes as fn(&mut ReplicaConfig), true), (constant_flushes, false)] {
        let dir = tempfile::tempdir().unwrap();
        // One voter: node 2 never runs; adding it as a learner needs no answer from it.
        let mut cluster = Cluster::start(dir.path(), 1, StorageMode::OneLog, tweak);
        cluster.put("a", b"1");
        let members =
            change_when_ready(&cluster, MembershipChange { add_learners: vec![2], ..Default::default() });
        assert_eq!(members.learners, vec![2]);
        let last = cluster.put_indexed("b", b"2");
        cluster.wait_applied(1, last);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !replayed && cluster.replica(1).status().flushed_index < last {
            assert!(Instant::now() < deadline, "no flush: {:?}", cluster.replica(1).status());
            std::thread::sleep(Duration::from_millis(10));
        }
        let status = cluster.replica(1).status();
        assert_eq!(status.flushed_index >= last, !replayed, "{status:?}");
        cluster.stop(1);
        cluster.open(1);
        cluster.leader();
        let status = cluster.replica(1).status();
        assert_eq!(status.learners, vec![2], "replayed: {replayed}: {status:?}");
        assert_eq!(status.voters, vec![1]);
        assert_eq!(status.recovery_replayed > 0, replayed, "{status:?}");
        // And removing it again is remembered the same way.
        change_when_ready(&cluster, MembershipChange { remove: vec![2], ..Default::default() });
        let last = cluster.put_indexed("c", b"3");
        cluster.wait_applied(1, last);
        cluster.stop(1);
        cluster.open(1);
        cluster.leader();
        let status = cluster.replica(1).status();
        assert!(status.learners.is_empty(), "{status:?}");
        assert_eq!(cluster.linearizable_get("b").as_deref(), Some(&b"2"[..]));
        cluster.shutdown();
    }
}
