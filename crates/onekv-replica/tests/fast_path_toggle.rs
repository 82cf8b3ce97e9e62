//! The fast path turned off and on again across restarts (`ReplicaConfig::fast_path`): a write
//! ordered while it was on is not taken as pending again by a recovery after flushes made while it
//! was off, once the request window has forgotten its id (two minutes of leader time, moved on
//! with the `node-clock-ahead` point).

mod common;

use common::cluster::Cluster;
use common::fast::{complete, put};
use onekv_replica::ReplicaConfig;
use onekv_replica::StorageMode;

fn fast_flushing_often(config: &mut ReplicaConfig) {
    config.fast_path = true;
    config.flush_every_entries = 8;
}

fn slow_flushing_often(config: &mut ReplicaConfig) {
    config.flush_every_entries = 8;
}

/// A write ordered long ago must not come back when the fast path is turned off and on again
/// across restarts: the flushes made while it was off say that nothing was pending then, so
/// recovery does not take the old DURABILITY record (still above the entries Raft keeps) as
/// pending, and a new leader does not order it a second time over a newer value.
#[test]
fn an_ordered_write_is_not_pending_again_after_the_fast_path_was_off() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, StorageMode::OneLog, fast_flushing_often);
    cluster.put("warm-up", b"raft path");
    let mut seq = 0;
    complete(&cluster, 13, &mut seq, put("k", b"old"));
    assert_eq!(cluster.linearizable_get("k"), Some(b"old".to_vec()));
    let ordered = cluster.replica(cluster.leader()).status().applied_index;
    for id in 1..=3 {
        cluster.wait_applied(id, ordered);
    }
    // Off: the newer value goes through Raft, and enough entries follow for several flushes.
    for id in 1..=3 {
        cluster.stop(id);
    }
    cluster.tweak = slow_flushing_often;
    for id in 1..=3 {
        cluster.open(id);
    }
    cluster.put("k", b"new");
    // Leader time moves past the window's retention: the next entries evict the old write's id.
    onekv_replica::failpoints::arm("node-clock-ahead", "return(300000)").unwrap();
    for i in 0..64 {
        cluster.put(&format!("filler{i}"), b"f");
    }
    let applied = cluster.replica(cluster.leader()).status().applied_index;
    for id in 1..=3 {
        cluster.wait_applied(id, applied);
    }
    onekv_replica::failpoints::arm("node-clock-ahead", "off").unwrap();
    // On again, after restarts: the old write is pending nowhere and is not applied again.
    for id in 1..=3 {
        cluster.stop(id);
    }
    cluster.tweak = fast_flushing_often;
    for id in 1..=3 {
        cluster.open(id);
    }
    assert_eq!(cluster.linearizable_get("k"), Some(b"new".to_vec()));
    cluster.put("after", b"a");
    let applied = cluster.replica(cluster.leader()).status().applied_index;
    for id in 1..=3 {
        cluster.wait_applied(id, applied);
        assert_eq!(cluster.replica(id).status().fast_pending, 0, "node {id}");
        assert_eq!(cluster.replica(id).get(b"k").unwrap(), Some(b"new".to_vec()), "node {id}");
    }
}
