//! A put by reference applied while the log GC collects the segment its copy is in (a *late
//! reference*: the GC's census did not see the key) keeps its value after the segment is gone,
//! also when the source key is written again before the GC reads the segment, so no move of the
//! copy exists to carry the key along (the segment is read whole, its values found by the keys
//! its records name). Its own test binary: the failpoints it arms are process-wide.

#![cfg(feature = "failpoints")]

mod common;

use onekv_replica::{
    Command, DedupConfig, DedupMode, GcConfig, Node, ReplicaConfig, RequestId, ShardConfig, WriteOp,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

const VALUE_BYTES: usize = 64 << 10;

fn config(dir: &std::path::Path) -> ReplicaConfig {
    let mut config = ReplicaConfig::new(1, vec![1], dir);
    config.shards = vec![ShardConfig { id: 1, voters: vec![1], primary: None }];
    config.tick = Duration::from_millis(10);
    config.segment_bytes = ReplicaConfig::SEGMENT_BYTES_RANGE.0;
    config.raft_log_keep_entries = 20;
    config.gc = GcConfig { interval: Duration::from_millis(50), bytes_per_sec: 0, ..GcConfig::default() };
    // Only values of 64 KiB are remembered as sources (the filler below is smaller).
    config.dedup = DedupConfig {
        mode: DedupMode::Inline,
        min_value_bytes: VALUE_BYTES as u64,
        ..DedupConfig::default()
    };
    config
}

fn value(tag: &str, n: u64, len: usize) -> Vec<u8> {
    let mut value = vec![(n % 251) as u8; len];
    let head = format!("{tag}-{n:012}");
    value[..head.len()].copy_from_slice(head.as_bytes());
    value
}

fn put(replica: &onekv_replica::Replica, seq: &AtomicU64, key: &[u8], value: Vec<u8>) {
    let (tx, rx) = mpsc::channel();
    let id = RequestId { client: 1, seq: seq.fetch_add(1, Ordering::SeqCst) };
    replica.propose(
        id,
        Command::Write(vec![WriteOp::put(key.to_vec(), value)]),
        Box::new(move |r| drop(tx.send(r))),
    );
    rx.recv_timeout(Duration::from_secs(30)).expect("an answer").expect("the write succeeds");
}

#[test]
fn a_late_reference_whose_source_was_written_again_keeps_its_value_after_the_collection() {
    // One after the other: the failpoints are process-wide.
    late_reference_keeps_its_value(false);
    // Past the bound on late references the reference is not recorded: the pass must keep its
    // segments (it fails), and a later one, whose census sees the key, moves it.
    late_reference_keeps_its_value(true);
}

fn late_reference_keeps_its_value(past_the_bound: bool) {
    onekv_replica::failpoints::arm("gc-census-keeps-few-keys", "return(1)").unwrap();
    let bound = if past_the_bound { "return(0)" } else { "off" };
    onekv_replica::failpoints::arm("late-references-bound", bound).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let node: Node = common::open_leading(config(dir.path()));
    let replica = node.replica(1).unwrap();
    let seq = Arc::new(AtomicU64::new(1));
    let shared = value("shared", 1, VALUE_BYTES);
    // The oldest segment: the source, and a key that stays (two live keys, more than the census
    // keeps, so the segment is read whole).
    put(&replica, &seq, b"source", shared.clone());
    put(&replica, &seq, b"stays", value("stays", 2, 60 << 10));

    // Once the GC has raised its fence over the oldest segments and before it reads them: a put
    // of the same value by reference to `source` (a late reference), then `source` written again.
    let acted = Arc::new(AtomicBool::new(false));
    {
        let (replica, seq, acted, shared) = (replica.clone(), seq.clone(), acted.clone(), shared.clone());
        onekv_replica::failpoints::arm_callback("gc-before-collect", move || {
            if acted.swap(true, Ordering::SeqCst) {
                return;
            }
            put(&replica, &seq, b"late", shared.clone());
            put(&replica, &seq, b"source", value("rewritten", 3, VALUE_BYTES));
        })
        .unwrap();
    }
    // Filler that the next writes overwrite: 60 KiB values (not sources), about five segments.
    let mut n = 10;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !acted.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the GC never collected: {:?}", node.statuses()[0].gc);
        for k in 0..8u64 {
            put(&replica, &seq, format!("filler-{k}").as_bytes(), value("filler", n, 60 << 10));
            n += 1;
        }
    }
    // The pass that held the late reference deletes the oldest segment.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = node.statuses()[0].clone();
        if status.gc.segments_reclaimed > 0 && replica.get(b"stays").is_ok() {
            assert!(status.dedup.late_references >= 1, "the put was a late reference: {:?}", status.dedup);
            // The pass that met it moved it and went on (a failed pass would leave it to the next;
            // past the bound, the next one succeeded).
            assert!(status.gc.last_error.is_none(), "{:?}", status.gc);
            break;
        }
        assert!(Instant::now() < deadline, "no segment was reclaimed: {:?}", status.gc);
        std::thread::sleep(Duration::from_millis(20));
    }
    // More collections, then the late key, the source and the other key read their values.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(replica.get(b"late").unwrap().as_deref(), Some(&shared[..]), "the late reference's value");
    assert_eq!(replica.get(b"source").unwrap(), Some(value("rewritten", 3, VALUE_BYTES)));
    assert_eq!(replica.get(b"stays").unwrap(), Some(value("stays", 2, 60 << 10)));
    onekv_replica::failpoints::arm("gc-before-collect", "off").unwrap();
    onekv_replica::failpoints::arm("late-references-bound", "off").unwrap();
    node.shutdown();
    drop(node);
    let node: Node = common::open_leading(config(dir.path()));
    let replica = node.replica(1).unwrap();
    assert_eq!(replica.get(b"late").unwrap().as_deref(), Some(&shared[..]), "after a restart");
    node.shutdown();
}
