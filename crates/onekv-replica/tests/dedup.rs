//! Identical values stored once (issue 18): against a plain map, through overwrites, deletes, the
//! log GC collecting the segments shared copies live in, and restarts, every key of every shard
//! reads exactly its own value; the log holds each distinct value about once; a forced fingerprint
//! collision never makes a key read another value; values written while inline dedup was off are
//! merged by the GC; elastic mode switches itself off and on with the duplicate ratio.

mod common;

use onekv_replica::{
    Command, DedupConfig, DedupMode, GcConfig, Node, ReplicaConfig, RequestId, ShardConfig, WriteOp,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const SHARDS: u64 = 4;
const VALUE_BYTES: usize = 16 << 10;
const OPS_PER_WRITE: usize = 8;

fn config(dir: &Path, dedup: DedupConfig) -> ReplicaConfig {
    let mut config = ReplicaConfig::new(1, vec![1], dir);
    config.shards = (1..=SHARDS).map(|id| ShardConfig { id, voters: vec![1], primary: None }).collect();
    config.tick = Duration::from_millis(10);
    config.segment_bytes = ReplicaConfig::SEGMENT_BYTES_RANGE.0;
    config.memtable_bytes = 256 << 10;
    config.raft_log_keep_entries = 20;
    config.gc = GcConfig { interval: Duration::from_millis(50), bytes_per_sec: 0, ..GcConfig::default() };
    config.dedup = dedup;
    config
}

fn dedup(mode: DedupMode) -> DedupConfig {
    DedupConfig { mode, ..DedupConfig::default() }
}

/// One of `distinct` values (a 16 KiB pattern per number).
fn pooled(number: u64) -> Vec<u8> {
    let mut value = vec![(number % 251) as u8; VALUE_BYTES];
    value[..16].copy_from_slice(format!("pooled-{number:09}").as_bytes());
    value
}

/// A value no other write has.
fn unique(seq: u64) -> Vec<u8> {
    let mut value = vec![(seq % 253) as u8; VALUE_BYTES];
    value[..16].copy_from_slice(format!("unique-{seq:09}").as_bytes());
    value
}

fn key(k: u64) -> Vec<u8> {
    format!("key-{k:05}").into_bytes()
}

fn shard_of(k: u64) -> u64 {
    k % SHARDS + 1
}

/// A small deterministic generator (xorshift), so a failure repeats.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The store under test and the plain map it must agree with.
struct Model {
    node: Node,
    expected: BTreeMap<Vec<u8>, Vec<u8>>,
    seq: u64,
    /// Unique values written so far.
    uniques: u64,
}

impl Model {
    fn write(&mut self, shard: u64, ops: Vec<(Vec<u8>, Option<Vec<u8>>)>) {
        self.seq += 1;
        let (tx, rx) = mpsc::channel();
        let write_ops = ops
            .iter()
            .map(|(key, value)| WriteOp {
                key: key.clone(),
                value: value.clone(),
                expiry: Default::default(),
            })
            .collect();
        self.node.replica(shard).unwrap().propose(
            RequestId { client: shard, seq: self.seq },
            Command::Write(write_ops),
            Box::new(move |r| drop(tx.send(r))),
        );
        rx.recv_timeout(Duration::from_secs(30)).expect("an answer").expect("the write succeeds");
        for (key, value) in ops {
            match value {
                Some(value) => self.expected.insert(key, value),
                None => self.expected.remove(&key),
            };
        }
    }

    /// Writes `writes` batches of random puts (values from a pool of `distinct`, or unique when
    /// `distinct` is 0) and deletes over `keys` keys.
    fn random_writes(&mut self, rng: &mut Rng, writes: usize, keys: u64, distinct: u64) {
        for _ in 0..writes {
            let shard = rng.below(SHARDS) + 1;
            let ops = (0..OPS_PER_WRITE)
                .map(|_| {
                    let k = rng.below(keys / SHARDS) * SHARDS + (shard - 1);
                    debug_assert_eq!(shard_of(k), shard);
                    let value = match rng.below(10) {
                        0 => None,
                        _ if distinct == 0 => {
                            self.uniques += 1;
                            Some(unique(self.uniques))
                        }
                        _ => Some(pooled(rng.below(distinct))),
                    };
                    (key(k), value)
                })
                .collect();
            self.write(shard, ops);
        }
    }

    /// Writes `writes` batches of unique values to 64 keys from `from` (garbage for the collector
    /// once overwritten: puts by reference log little else).
    fn filler(&mut self, rng: &mut Rng, writes: usize, from: u64) {
        for _ in 0..writes {
            let shard = rng.below(SHARDS) + 1;
            let ops = (0..OPS_PER_WRITE)
                .map(|_| {
                    self.uniques += 1;
                    (key(from + rng.below(16) * SHARDS + shard - 1), Some(unique(self.uniques)))
                })
                .collect();
            self.write(shard, ops);
        }
    }

    /// Deletes the keys [`Model::filler`] writes.
    fn delete_filler(&mut self, from: u64) {
        for shard in 1..=SHARDS {
            let ops = (0..16).map(|i| (key(from + i * SHARDS + shard - 1), None)).collect();
            self.write(shard, ops);
        }
    }

    fn check(&self, keys: u64, when: &str) {
        for k in 0..keys {
            let got = self.node.replica(shard_of(k)).unwrap().get(&key(k)).unwrap();
            let want = self.expected.get(&key(k));
            assert!(
                got.as_ref() == want,
                "{when}: key {k} reads {:?}, the model has {:?}",
                got.map(|v| String::from_utf8_lossy(&v[..16]).into_owned()),
                want.map(|v| String::from_utf8_lossy(&v[..16]).into_owned())
            );
        }
    }

    /// Waits until the collector brought the log within `max_log` bytes (and reclaimed at least
    /// `min_reclaimed` segments).
    fn wait_for_collection(&self, max_log: u64, min_reclaimed: u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let status = &self.node.statuses()[0];
            if status.gc.segments_reclaimed >= min_reclaimed && status.log_bytes <= max_log {
                assert!(status.gc.last_error.is_none(), "{:?}", status.gc);
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the log was not collected to {max_log} bytes: {} bytes; gc: {:?}; dedup: {:?}",
                status.log_bytes,
                status.gc,
                status.dedup
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Random puts of six recurring values, overwrites and deletes over 512 keys of four shards,
/// collections and a restart, against the model. With `references`, most puts go by reference to
/// a key holding the value (`dedup.references`), so little is logged and the collector's passes
/// meet late references; without, every put's value is logged and deduplicated at apply.
fn duplicates_are_stored_once(references: bool) {
    let dir = tempfile::tempdir().unwrap();
    let dedup = DedupConfig { references, ..dedup(DedupMode::Inline) };
    let node = common::open_leading(config(dir.path(), dedup.clone()));
    let mut model = Model { node, expected: BTreeMap::new(), seq: 0, uniques: 0 };
    let mut rng = Rng(0x5eed);
    let keys = 512;
    let distinct = 6;
    let segment = ReplicaConfig::SEGMENT_BYTES_RANGE.0;
    // About 12 segments of writes over 512 keys (8 MiB if each had its own copy) of 6 values
    // (without references; with them, next to nothing, and unique values to 64 other keys fill
    // about as many, deleted before the collection is checked).
    for round in 0..8 {
        model.random_writes(&mut rng, 200, keys, distinct);
        if references {
            model.filler(&mut rng, 120, keys);
        }
        model.check(keys, &format!("round {round}"));
    }
    if references {
        model.delete_filler(keys);
    }
    let status = model.node.statuses()[0].clone();
    let shared = status.dedup.inline_hits + status.dedup.references_applied;
    assert!(shared > 8_000, "most puts shared a copy: {:?}", status.dedup);
    if references {
        // The others: a source written by the same write, or the first puts of each value.
        assert!(status.dedup.references_applied > 8_000, "puts went by reference: {:?}", status.dedup);
    } else {
        assert_eq!(status.dedup.references_applied, 0, "{:?}", status.dedup);
    }
    // The live bytes are the distinct values (and a few copies not yet shared), not every key's.
    model.wait_for_collection(4 * segment, if references { 4 } else { 6 });
    let status = model.node.statuses()[0].clone();
    let per_key = model.expected.len() as u64 * VALUE_BYTES as u64;
    assert!(
        status.gc.live_bytes < per_key / 4,
        "live bytes {} against {per_key} without sharing: {:?}",
        status.gc.live_bytes,
        status.gc
    );
    model.check(keys, "after collection");

    // A restart: the content index is empty again, the trees' shared locators still read.
    model.node.shutdown();
    drop(model.node);
    model.node = common::open_leading(config(dir.path(), dedup));
    model.check(keys, "after a restart");
    model.random_writes(&mut rng, 400, keys, distinct);
    if references {
        model.filler(&mut rng, 240, keys);
        model.delete_filler(keys);
    }
    model.check(keys, "after a restart and more writes");
    model.wait_for_collection(4 * segment, 1);
    model.check(keys, "after a restart and a collection");
    let status = model.node.statuses()[0].dedup.clone();
    assert!(status.inline_hits + status.references_applied > 1_000, "{status:?}");
    model.node.shutdown();
}

#[test]
fn duplicates_are_stored_once_and_every_key_reads_its_own_value() {
    duplicates_are_stored_once(false);
}

#[test]
fn duplicates_put_by_reference_read_their_own_values_through_collections_and_restarts() {
    duplicates_are_stored_once(true);
}

#[test]
fn a_fingerprint_collision_never_makes_a_key_read_another_value() {
    let dir = tempfile::tempdir().unwrap();
    // 16 fingerprints for thousands of distinct values: nearly every lookup matches another value.
    let dedup = DedupConfig { fingerprint_bits: 4, ..dedup(DedupMode::Inline) };
    let node = common::open_leading(config(dir.path(), dedup));
    let mut model = Model { node, expected: BTreeMap::new(), seq: 0, uniques: 0 };
    let mut rng = Rng(0xc011);
    let keys = 256;
    model.random_writes(&mut rng, 600, keys, 0);
    model.check(keys, "unique values");
    // And some true duplicates among them still share.
    model.random_writes(&mut rng, 300, keys, 3);
    model.check(keys, "with duplicates");
    let status = model.node.statuses()[0].dedup.clone();
    assert!(status.mismatches > 1_000, "collisions were found and refused: {status:?}");
    assert!(status.inline_hits > 0, "{status:?}");
    model.node.shutdown();
}

/// Every key the offline test writes is below this.
const KEYS_WRITTEN: u64 = 1200;

#[test]
fn the_collector_merges_duplicates_written_while_inline_dedup_was_off() {
    let dir = tempfile::tempdir().unwrap();
    let node = common::open_leading(config(dir.path(), dedup(DedupMode::Offline)));
    let mut model = Model { node, expected: BTreeMap::new(), seq: 0, uniques: 0 };
    let mut rng = Rng(0x0ff1);
    let keys = 512;
    // Cold keys with 4 distinct values, then overwrites of other keys, so the collector moves
    // the cold ones out of the oldest segments.
    for k in (0..keys).step_by(2) {
        model.write(shard_of(k), vec![(key(k), Some(pooled(k % 4)))]);
    }
    let cold_bytes = (keys / 2) * VALUE_BYTES as u64;
    for round in 0..80 {
        let shard = round % SHARDS + 1;
        for chunk in 0..20u64 {
            let ops = (0..OPS_PER_WRITE as u64)
                .map(|i| {
                    (key(keys + (chunk * 8 + i) * SHARDS + shard - 1), Some(unique(rng.below(999_999_999))))
                })
                .collect();
            model.write(shard, ops);
        }
    }
    model.check(KEYS_WRITTEN, "before collection");
    let segment = ReplicaConfig::SEGMENT_BYTES_RANGE.0;
    model.wait_for_collection(6 * segment, 4);
    let status = model.node.statuses()[0].clone();
    assert_eq!(status.dedup.inline_hits, 0, "offline mode does nothing at apply");
    assert!(status.dedup.offline_hits >= keys / 2 - 8, "moved cold values were merged: {:?}", status.dedup);
    assert!(status.dedup.bytes_saved >= cold_bytes / 2, "{:?}", status.dedup);
    model.check(KEYS_WRITTEN, "after collection");
    model.node.shutdown();
    drop(model.node);
    model.node = common::open_leading(config(dir.path(), dedup(DedupMode::Off)));
    model.check(KEYS_WRITTEN, "after a restart with dedup off");
    model.node.shutdown();
}

#[test]
fn elastic_dedup_switches_itself_off_and_on_with_the_duplicate_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let node = common::open_leading(config(
        dir.path(),
        DedupConfig { min_value_bytes: 1024, ..dedup(DedupMode::Elastic) },
    ));
    let mut model = Model { node, expected: BTreeMap::new(), seq: 0, uniques: 0 };
    let mut rng = Rng(0xe1a5);
    let keys = 256;
    assert!(model.node.statuses()[0].dedup.inline_active, "elastic starts on");
    // Unique values: over a window of 4096 candidates no hit, so it switches off.
    model.random_writes(&mut rng, 700, keys, 0);
    let status = model.node.statuses()[0].dedup.clone();
    assert!(!status.inline_active && status.switches == 1, "{status:?}");
    // Duplicates again: the samples see them and it switches back on.
    model.random_writes(&mut rng, 1000, keys, 4);
    let status = model.node.statuses()[0].dedup.clone();
    assert!(status.inline_active && status.switches == 2, "{status:?}");
    assert!(status.inline_hits > 0, "{status:?}");
    model.check(keys, "after the switches");
    model.node.shutdown();
}
