//! Puts by reference (issue 18, dedup on the wire): a leader deduplicating inline proposes a put of
//! a value another key of the shard holds as a reference to that key. Every replica, whatever its
//! own `dedup.mode` or storage mode, then holds the value without it crossing the network or being
//! written to its log again, and reads it back, also after the source key changed and after a
//! restart that replays the references from the log.

mod common;

use common::cluster::Cluster;
use onekv_replica::{DedupConfig, DedupMode, ReplicaConfig, StorageMode};
use std::collections::BTreeMap;
use std::time::Duration;

const VALUE_BYTES: usize = 64 << 10;
const DISTINCT: u64 = 5;
const KEYS: u64 = 200;

fn value(n: u64, generation: u64) -> Vec<u8> {
    let mut value = vec![(n * 7 + generation) as u8; VALUE_BYTES];
    value[..23].copy_from_slice(format!("value-{n:04}-gen-{generation:08}").as_bytes());
    value
}

fn key(k: u64) -> String {
    format!("key-{k:05}")
}

/// Nodes 1 and 2 deduplicate inline (and so propose references when they lead); node 3 runs with
/// deduplication off.
fn onelog_nodes(config: &mut ReplicaConfig) {
    let mode = if config.node_id == 3 { DedupMode::Off } else { DedupMode::Inline };
    config.dedup = DedupConfig { mode, ..DedupConfig::default() };
}

/// Node 3 keeps its values in the classic layout (no dedup: it copies values put by reference).
fn node3_classic(config: &mut ReplicaConfig) {
    if config.node_id == 3 {
        config.storage = StorageMode::Classic;
    } else {
        config.dedup = DedupConfig { mode: DedupMode::Inline, ..DedupConfig::default() };
    }
}

/// Node 3 keeps its values in the separated layout.
fn node3_separated(config: &mut ReplicaConfig) {
    if config.node_id == 3 {
        config.storage = StorageMode::Separated;
    } else {
        config.dedup = DedupConfig { mode: DedupMode::Inline, ..DedupConfig::default() };
    }
}

/// Makes node 1 or 2 lead (node 3 proposes no references).
fn lead_from_a_deduplicating_node(cluster: &mut Cluster) {
    if cluster.leader() == 3 {
        cluster.stop(3);
        while cluster.router.leader().is_none_or(|id| id == 3) {
            std::thread::sleep(Duration::from_millis(20));
        }
        cluster.open(3);
    }
}

/// Every replica reads every key of `expected` as expected, once it applied `index`.
fn check_everywhere(cluster: &Cluster, expected: &BTreeMap<String, Vec<u8>>, index: u64, when: &str) {
    for id in 1..=3 {
        cluster.wait_applied(id, index);
        let replica = cluster.replica(id);
        for (key, want) in expected {
            let got = replica.get(key.as_bytes()).unwrap();
            assert!(
                got.as_ref() == Some(want),
                "{when}: node {id} reads {key} as {:?}",
                got.map(|v| String::from_utf8_lossy(&v[..23]).into_owned())
            );
        }
    }
}

/// Payload bytes node `id` appended to its (Raft) log since it opened.
fn log_payload_bytes(cluster: &Cluster, id: u64) -> u64 {
    // A node just opened publishes its status at the end of its first turn.
    for _ in 0..500 {
        if let Some(log) = cluster.replica(id).status().logs.first() {
            return log.stats.payload_bytes;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("node {id} published no status")
}

/// Writes `KEYS` keys, each one of `DISTINCT` values of this generation, one put per entry.
fn write_round(cluster: &mut Cluster, expected: &mut BTreeMap<String, Vec<u8>>, generation: u64) -> u64 {
    let mut index = 0;
    for k in 0..KEYS {
        let v = value(k % DISTINCT, generation);
        index = cluster.put_indexed(&key(k), &v);
        expected.insert(key(k), v);
    }
    index
}

#[test]
fn a_value_another_key_holds_crosses_no_network_and_is_logged_nowhere_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, StorageMode::OneLog, onelog_nodes);
    lead_from_a_deduplicating_node(&mut cluster);
    let before: Vec<u64> = (1..=3).map(|id| log_payload_bytes(&cluster, id)).collect();
    let mut expected = BTreeMap::new();
    let index = write_round(&mut cluster, &mut expected, 1);
    check_everywhere(&cluster, &expected, index, "after the first round");
    let values_bytes = KEYS * VALUE_BYTES as u64;
    for id in 1..=3 {
        let logged = log_payload_bytes(&cluster, id) - before[id as usize - 1];
        // Each distinct value once (and then some, for a put whose source was not applied yet),
        // not each key's: 12.5 MiB of values.
        assert!(
            logged < values_bytes / 8,
            "node {id} logged {logged} bytes for {values_bytes} bytes of values"
        );
        let dedup = cluster.replica(id).status().dedup;
        assert!(dedup.references_applied >= KEYS / 2, "node {id}: {dedup:?}");
    }
    // The sources change: keys put by reference keep their own values.
    for k in 0..DISTINCT {
        let v = value(k, 99);
        cluster.put(&key(k), &v);
        expected.insert(key(k), v);
    }
    let index = cluster.put_indexed("last", b"x");
    expected.insert("last".into(), b"x".to_vec());
    check_everywhere(&cluster, &expected, index, "after the sources changed");
    // A restart of every node replays the references from the log (and reads what the trees
    // flushed).
    for id in 1..=3 {
        cluster.stop(id);
    }
    for id in 1..=3 {
        cluster.open(id);
    }
    lead_from_a_deduplicating_node(&mut cluster);
    let index = cluster.put_indexed("after-restart", b"y");
    expected.insert("after-restart".into(), b"y".to_vec());
    check_everywhere(&cluster, &expected, index, "after a restart");
    cluster.shutdown();
}

fn a_replica_in_another_storage_mode_copies_values_put_by_reference(tweak: fn(&mut ReplicaConfig)) {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, StorageMode::OneLog, tweak);
    lead_from_a_deduplicating_node(&mut cluster);
    let mut expected = BTreeMap::new();
    let index = write_round(&mut cluster, &mut expected, 1);
    check_everywhere(&cluster, &expected, index, "after the first round");
    let leader = cluster.leader();
    let references = cluster.replica(leader).status().dedup.references_applied;
    assert!(references >= KEYS / 2, "the leader put values by reference: {references}");
    cluster.stop(3);
    cluster.open(3);
    check_everywhere(&cluster, &expected, index, "after node 3 restarted");
    cluster.shutdown();
}

#[test]
fn a_classic_replica_copies_values_put_by_reference() {
    a_replica_in_another_storage_mode_copies_values_put_by_reference(node3_classic);
}

#[test]
fn a_separated_replica_copies_values_put_by_reference() {
    a_replica_in_another_storage_mode_copies_values_put_by_reference(node3_separated);
}
