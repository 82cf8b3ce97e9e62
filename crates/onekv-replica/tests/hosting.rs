//! Adding and removing a shard's replica on a running node: a node with no replicas gets one,
//! which joins the shard and replaces a founder; the founder's replica is removed, stays removed
//! across restarts with its trees deleted, and can be added again later with fresh trees.

mod common;

use common::cluster::Cluster;
use onekv_replica::{Members, MembershipChange, Node, ReplicaError, StorageMode};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const SHARD: u64 = 1;

fn value(i: usize) -> Vec<u8> {
    (0..200).map(|j| (i * 13 + j) as u8).collect()
}

fn change(cluster: &Cluster, step: MembershipChange) -> Members {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (tx, rx) = mpsc::channel();
        cluster
            .replica(cluster.leader())
            .change_members(step.clone(), Box::new(move |r| tx.send(r).unwrap()));
        match rx.recv_timeout(Duration::from_secs(10)).expect("an answer") {
            Ok(members) => return members,
            Err(ReplicaError::Dropped(_) | ReplicaError::NotLeader { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(error) => panic!("{step:?} failed: {error}"),
        }
    }
}

fn wait_voters(cluster: &Cluster, nodes: &[u64], voters: &[u64]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for &id in nodes {
        while cluster.replica(id).status().voters != voters
            || !cluster.replica(id).status().outgoing_voters.is_empty()
        {
            assert!(Instant::now() < deadline, "node {id}: {:?}", cluster.replica(id).status());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Opens node `id` as a node configured with no shard (a newcomer), or with the founders'
/// configuration; either way it hosts what its data directory lists.
fn open_node(cluster: &Cluster, id: u64, newcomer: bool) -> Node {
    let mut config = cluster.config(id);
    if newcomer {
        config.shards.clear();
    }
    let node = Node::open(config, cluster.router.clone()).expect("open");
    if let Some(replica) = node.replica(SHARD) {
        cluster.router.add(id, replica);
    }
    node
}

fn trees(cluster: &Cluster, id: u64) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(cluster.root.join(format!("node{id}/index")))
        .unwrap()
        .filter_map(|e| e.ok().filter(|e| e.path().is_dir()).and_then(|e| e.file_name().into_string().ok()))
        .collect();
    names.sort();
    names
}

#[test]
fn a_replica_added_at_runtime_replaces_a_founder_whose_replica_is_removed_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, StorageMode::OneLog, |config| {
        config.memtable_bytes = 16 << 10;
        config.raft_log_keep_entries = 20;
    });
    for i in 0..200 {
        cluster.put(&format!("k{i:04}"), &value(i));
    }

    // Node 4 starts with no replica at all, then gets one of the shard while it runs.
    cluster.ids.push(4);
    let node4 = open_node(&cluster, 4, true);
    assert!(node4.shards().is_empty());
    let replica = node4.add_replica(SHARD).unwrap();
    assert_eq!(node4.add_replica(SHARD).unwrap().shard(), SHARD, "adding it again returns it");
    assert!(replica.status().voters.is_empty(), "it waits for the leader: {:?}", replica.status());
    cluster.router.add(4, replica);
    change(&cluster, MembershipChange { add_learners: vec![4], ..Default::default() });
    let last = cluster.put_indexed("after-join", b"x");
    cluster.wait_applied(4, last);

    // It replaces a founder that does not lead, whose replica is then removed from its node.
    let leader = cluster.leader();
    let out = (1..=3).find(|&id| id != leader).unwrap();
    change(&cluster, MembershipChange { promote: vec![4], remove: vec![out], ..Default::default() });
    let voters: Vec<u64> = (1..=4).filter(|&id| id != out).collect();
    wait_voters(&cluster, &voters, &voters);
    let removed = cluster.router.remove(out).unwrap();
    let node_out = removed.node().clone();
    let refused = cluster.replica(leader).node().remove_replica(SHARD).unwrap_err();
    assert!(refused.to_string().contains("leads shard 1"), "{refused}");
    node_out.remove_replica(SHARD).unwrap();
    assert!(node_out.shards().is_empty());
    assert!(node_out.replica(SHARD).is_none());
    assert!(removed.get(b"k0001").is_err(), "a removed replica serves nothing");
    let last_voters = node_out.last_voters_of_removed(SHARD).unwrap();
    assert!(last_voters.contains(&out) || last_voters.contains(&4), "{last_voters:?}");
    node_out.remove_replica(SHARD).unwrap();
    node_out.shutdown();

    // Writes go on; node 4's own copy holds every key, also after its node restarts.
    for i in 200..300 {
        cluster.put(&format!("k{i:04}"), &value(i));
    }
    cluster.router.remove(4).unwrap();
    node4.shutdown();
    let node4 = open_node(&cluster, 4, true);
    assert_eq!(node4.shards(), vec![SHARD]);
    let last = cluster.put_indexed("after-restart", b"y");
    cluster.wait_applied(4, last);
    for i in 0..300 {
        assert_eq!(node4.replica(SHARD).unwrap().get(format!("k{i:04}").as_bytes()).unwrap(), Some(value(i)));
    }

    // The removed founder, restarted with the configuration that lists the shard, hosts nothing,
    // and the removed replica's tree is gone.
    let node_out = open_node(&cluster, out, false);
    assert!(node_out.shards().is_empty(), "{:?}", node_out.shards());
    assert!(
        !trees(&cluster, out).iter().any(|name| name.starts_with("shard-")),
        "{:?}",
        trees(&cluster, out)
    );

    // Added again, it gets fresh trees, skips its old records in the log and catches up.
    let again = node_out.add_replica(SHARD).unwrap();
    cluster.router.add(out, again);
    assert!(trees(&cluster, out).contains(&"shard-1.1".to_string()), "{:?}", trees(&cluster, out));
    change(&cluster, MembershipChange { add_learners: vec![out], ..Default::default() });
    let last = cluster.put_indexed("after-re-add", b"z");
    cluster.wait_applied(out, last);
    cluster.router.remove(out).unwrap();
    node_out.shutdown();
    let node_out = open_node(&cluster, out, false);
    assert_eq!(node_out.shards(), vec![SHARD]);
    let copy = node_out.replica(SHARD).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while copy.status().applied_index < last {
        assert!(Instant::now() < deadline, "{:?}", copy.status());
        std::thread::sleep(Duration::from_millis(10));
    }
    for i in 0..300 {
        assert_eq!(copy.get(format!("k{i:04}").as_bytes()).unwrap(), Some(value(i)), "k{i:04}");
    }
    assert_eq!(copy.status().learners, vec![out]);
    cluster.router.remove(out);
    node_out.shutdown();
    cluster.router.remove(4);
    node4.shutdown();
    cluster.shutdown();
}
