//! The log garbage collector's crash points (issue 16) on a real process: a child process
//! overwrites a few keys per writer in a one-node cluster of four shards (after writing some cold
//! keys once, small values which the collector must move into compressed blocks) with the
//! collector running constantly on the smallest segments, and reports every acknowledgement; an
//! armed point ends it abruptly after the relocated
//! values are durable but before the index points at them, after the index update but before its
//! flush, after the flush but before the old segment is deleted, or right after the deletion. The
//! parent reopens the directory and checks that every key reads its last acknowledged value (or the
//! one write in flight after it) and every cold key its only value; then a second crash on the same
//! directory, and the same checks. In `onelog` mode the collector moves values within the Raft
//! log; in `separated` mode within the value log (both are run). In `onelog` mode values are
//! deduplicated (`elastic`): half the cold keys hold one of three values every writer writes, so
//! the collector moves copies several keys share, at every crash point.
//!
//! The child is this test binary run again with `ONEKV_GC_CRASH_CHILD` set. Needs the
//! `failpoints` feature (`scripts/test` turns it on).

mod common;

use onekv_replica::{
    Command, DedupConfig, DedupMode, GcConfig, Node, ReplicaConfig, ReplicaError, RequestId, ShardConfig,
    StorageMode, WriteOp,
};
use std::io::Write;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

const WRITERS: usize = 4;
const SHARDS: u64 = 4;
/// Keys each writer overwrites in turn.
const SLOTS: usize = 8;
/// Keys each writer writes once, before overwriting.
const COLD: usize = 16;
const CHILD_ENV: &str = "ONEKV_GC_CRASH_CHILD";
/// The storage mode the child runs in (by name).
const STORAGE_ENV: &str = "ONEKV_GC_STORAGE";

fn key(writer: usize, slot: usize) -> Vec<u8> {
    format!("w{writer}-{slot:02}").into_bytes()
}

fn cold_key(writer: usize, i: usize) -> Vec<u8> {
    format!("c{writer}-{i:02}").into_bytes()
}

/// The value of the writer's `n`-th overwrite (16 KiB, so segments fill quickly).
fn value(writer: usize, n: usize) -> Vec<u8> {
    let mut value = vec![(writer * 31 + n) as u8; 16 << 10];
    value[..20].copy_from_slice(format!("{writer:02}-{n:017}").as_bytes());
    value
}

/// A cold key's value: small (below `gc.compress_below_bytes`), so the collector moves cold values
/// into compressed blocks and the crash points cover PACKED records too; every other one is one of
/// three 1 KiB values all writers write (deduplicated in onelog mode, so moved whole and shared).
fn cold_value(writer: usize, i: usize) -> Vec<u8> {
    if i.is_multiple_of(2) {
        let mut value = format!("recurring cold value {}: ", i % 3).into_bytes();
        value.resize(1 << 10, b'r');
        return value;
    }
    let mut value = format!("cold value {i} of writer {writer}: ").into_bytes();
    value.resize(512, b'c');
    value
}

fn config(dir: &Path, storage: StorageMode) -> ReplicaConfig {
    let mut config = ReplicaConfig::new(1, vec![1], dir);
    config.storage = storage;
    config.shards = (1..=SHARDS).map(|id| ShardConfig { id, voters: vec![1], primary: None }).collect();
    config.tick = Duration::from_millis(10);
    config.memtable_bytes = 64 << 10;
    config.raft_log_keep_entries = 50;
    config.segment_bytes = ReplicaConfig::SEGMENT_BYTES_RANGE.0;
    config.gc = GcConfig { interval: Duration::from_millis(20), bytes_per_sec: 0, ..GcConfig::default() };
    if storage == StorageMode::OneLog {
        config.dedup = DedupConfig { mode: DedupMode::Elastic, ..DedupConfig::default() };
    }
    config
}

fn open(dir: &Path, storage: StorageMode) -> Node {
    common::open_leading(config(dir, storage))
}

fn shard(writer: usize) -> u64 {
    writer as u64 % SHARDS + 1
}

fn put(node: &Node, writer: usize, seq: u64, key: Vec<u8>, value: Vec<u8>) -> Result<(), ReplicaError> {
    let (tx, rx) = mpsc::channel();
    let id = RequestId { client: writer as u64 + 1, seq };
    let command = Command::Write(vec![WriteOp { key, value: Some(value), expiry: Default::default() }]);
    node.replica(shard(writer)).unwrap().propose(id, command, Box::new(move |r| drop(tx.send(r))));
    rx.recv_timeout(Duration::from_secs(10)).unwrap_or(Err(ReplicaError::Stopping)).map(|_| ())
}

/// The child: each writer writes its cold keys (unless they are there), then overwrites its slots
/// until a crash point ends the process, printing `ack WRITER N` after each acknowledged overwrite
/// (continuing from `ONEKV_GC_START`).
#[test]
#[ignore = "the child process of the GC crash-point tests; runs only with ONEKV_GC_CRASH_CHILD set"]
fn child_overwriter() {
    let Ok(dir) = std::env::var(CHILD_ENV) else { return };
    let start: usize = std::env::var("ONEKV_GC_START").unwrap().parse().unwrap();
    let storage = StorageMode::parse(&std::env::var(STORAGE_ENV).unwrap()).unwrap();
    let node = open(Path::new(&dir), storage);
    let threads: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let node = node.clone();
            std::thread::spawn(move || {
                let seq_base = (start as u64 + 1) * 1_000_000;
                if start == 0 {
                    for i in 0..COLD {
                        if put(&node, writer, 1 + i as u64, cold_key(writer, i), cold_value(writer, i))
                            .is_err()
                        {
                            return;
                        }
                    }
                }
                for n in start.. {
                    match put(&node, writer, seq_base + n as u64, key(writer, n % SLOTS), value(writer, n)) {
                        Ok(()) => {
                            let mut out = std::io::stdout().lock();
                            writeln!(out, "ack {writer} {n}").unwrap();
                            out.flush().unwrap();
                        }
                        Err(ReplicaError::Stopping) => return,
                        Err(err) => panic!("write failed: {err}"),
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        let _ = thread.join();
    }
}

/// Runs the child with `point` armed at its `skip + 1`-th hit, overwriting from `start`; returns
/// the highest acknowledged overwrite per writer.
fn crash_run(dir: &Path, storage: StorageMode, point: &str, skip: usize, start: usize) -> Vec<Option<usize>> {
    let env = [
        (CHILD_ENV, dir.display().to_string()),
        ("ONEKV_GC_START", start.to_string()),
        (STORAGE_ENV, storage.name().to_string()),
    ];
    common::crash_child("child_overwriter", &env, point, skip, WRITERS, Duration::from_secs(90))
}

/// Reopens `dir` and checks every key against what was acknowledged (overwrites from `start`);
/// returns the node's collector status from before the check's own writes.
fn check_recovered(dir: &Path, storage: StorageMode, point: &str, start: usize, acked: &[Option<usize>]) {
    let node = open(dir, storage);
    for (writer, acked) in acked.iter().enumerate() {
        let replica = node.replica(shard(writer)).unwrap();
        for i in 0..COLD {
            assert_eq!(
                replica.get(&cold_key(writer, i)).unwrap(),
                Some(cold_value(writer, i)),
                "{point}: cold key {i} of writer {writer} lost its value"
            );
        }
        let Some(acked) = *acked else { continue };
        assert!(acked >= start, "{point}: writer {writer} acknowledged nothing in this run");
        for slot in 0..SLOTS {
            // The last acknowledged overwrite of the slot, or the one in flight after it.
            let last = (start..=acked).rev().find(|n| n % SLOTS == slot);
            let in_flight = Some(acked + 1).filter(|n| n % SLOTS == slot);
            let got = replica.get(&key(writer, slot)).unwrap();
            let allowed: Vec<Option<Vec<u8>>> =
                [last, in_flight].into_iter().flatten().map(|n| Some(value(writer, n))).collect();
            if last.is_some() {
                assert!(
                    allowed.contains(&got),
                    "{point}: slot {slot} of writer {writer} (acked up to {acked}) reads {:?}",
                    got.map(|v| String::from_utf8_lossy(&v[..20]).into_owned())
                );
            }
        }
    }
    node.shutdown();
}

fn crash_point(point: &str, skips: [usize; 2]) {
    for storage in [StorageMode::OneLog, StorageMode::Separated] {
        let dir = tempfile::tempdir().unwrap();
        let point_in = format!("{point} ({})", storage.name());
        let acked = crash_run(dir.path(), storage, point, skips[0], 0);
        check_recovered(dir.path(), storage, &point_in, 0, &acked);
        // Again on the recovered directory, overwriting further.
        let start = acked.iter().flatten().max().map_or(0, |n| n + 2);
        let acked = crash_run(dir.path(), storage, point, skips[1], start);
        check_recovered(dir.path(), storage, &point_in, start, &acked);
    }
}

#[test]
fn crash_after_relocated_values_are_durable_before_the_index_points_at_them() {
    crash_point("gc-after-relocate-append", [0, 2]);
}

#[test]
fn crash_after_the_index_points_at_relocated_values_before_the_flush() {
    crash_point("gc-after-index-update", [0, 1]);
}

#[test]
fn crash_after_the_flush_before_the_old_segment_is_deleted() {
    crash_point("gc-before-reclaim", [0, 1]);
}

#[test]
fn crash_right_after_the_old_segment_is_deleted() {
    crash_point("gc-after-reclaim", [0, 2]);
}
