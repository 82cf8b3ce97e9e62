//! The log garbage collector (issue 16): under endless overwrites a onelog node's log (and a
//! separated node's value log) stays a few segments long instead of growing with every write, every key keeps reading its latest value
//! (while the collector runs, and after a restart from the collected log), and a shard that
//! nobody writes does not pin the log (the collector has it flush and forget its old entries).

mod common;

use onekv_replica::{
    Command, GcConfig, Node, ReplicaConfig, ReplicaError, RequestId, ShardConfig, StorageMode, WriteOp,
};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const SHARDS: u64 = 4;
/// Keys overwritten, in shards 1..=3 (shard 4 stays idle after its election).
const KEYS: usize = 192;
/// Keys written once, first: cold data the collector must move out of the oldest segments.
const COLD: usize = 48;
const VALUE_BYTES: usize = 16 << 10;
const OPS_PER_WRITE: usize = 8;

fn config(dir: &Path, storage: StorageMode) -> ReplicaConfig {
    let mut config = ReplicaConfig::new(1, vec![1], dir);
    config.storage = storage;
    config.shards = (1..=SHARDS).map(|id| ShardConfig { id, voters: vec![1], primary: None }).collect();
    config.tick = Duration::from_millis(10);
    // The smallest segment the record limit allows (about 16 MiB), so the run rolls many.
    config.segment_bytes = ReplicaConfig::SEGMENT_BYTES_RANGE.0;
    config.memtable_bytes = 256 << 10;
    config.raft_log_keep_entries = 20;
    config.gc = GcConfig { interval: Duration::from_millis(50), bytes_per_sec: 0, ..GcConfig::default() };
    config
}

fn open(dir: &Path, storage: StorageMode) -> Node {
    common::open_leading(config(dir, storage))
}

fn key(k: usize) -> Vec<u8> {
    format!("key-{k:04}").into_bytes()
}

/// Keys `k` with `k % 3 + 1 == shard`.
fn cold_key(k: usize) -> Vec<u8> {
    format!("cold-{k:04}").into_bytes()
}

fn shard_of(k: usize) -> u64 {
    (k % 3) as u64 + 1
}

fn value(k: usize, round: usize) -> Vec<u8> {
    let mut value = vec![(k + round) as u8; VALUE_BYTES];
    value[..16].copy_from_slice(format!("{k:06}-{round:09}").as_bytes());
    value
}

fn write(node: &Node, shard: u64, seq: u64, ops: Vec<WriteOp>) {
    let (tx, rx) = mpsc::channel();
    node.replica(shard).unwrap().propose(
        RequestId { client: shard, seq },
        Command::Write(ops),
        Box::new(move |r| drop(tx.send(r))),
    );
    rx.recv_timeout(Duration::from_secs(30)).expect("an answer").expect("the write succeeds");
}

fn check_latest(node: &Node, round_of: &[usize], when: &str) {
    for (k, round) in round_of.iter().enumerate() {
        let got = node.replica(shard_of(k)).unwrap().get(&key(k)).unwrap();
        assert!(got == Some(value(k, *round)), "{when}: key {k} does not read its value of round {round}");
    }
    for k in 0..COLD {
        let got = node.replica(shard_of(k)).unwrap().get(&cold_key(k)).unwrap();
        assert!(got == Some(value(k, 0)), "{when}: cold key {k} lost its value");
    }
}

#[test]
fn overwrites_keep_the_log_bounded_and_every_value_reads_back() {
    overwrite_and_collect(StorageMode::OneLog);
}

#[test]
fn overwrites_keep_the_value_log_of_separated_mode_bounded() {
    overwrite_and_collect(StorageMode::Separated);
}

fn overwrite_and_collect(storage: StorageMode) {
    let dir = tempfile::tempdir().unwrap();
    let node = open(dir.path(), storage);
    let segment = ReplicaConfig::SEGMENT_BYTES_RANGE.0;
    let mut round_of = vec![0usize; KEYS];
    let mut seq = 0u64;
    let mut written = 0u64;
    let mut largest_log = 0u64;
    for k in 0..COLD {
        seq += 1;
        write(
            &node,
            shard_of(k),
            seq,
            vec![WriteOp { key: cold_key(k), value: Some(value(k, 0)), expiry: Default::default() }],
        );
    }
    // About 22 × 16 MiB segments of overwrites of 3 MiB of live data.
    let rounds = 120;
    for round in 1..=rounds {
        for shard in 1..=3u64 {
            let keys: Vec<usize> = (0..KEYS).filter(|k| shard_of(*k) == shard).collect();
            for chunk in keys.chunks(OPS_PER_WRITE) {
                seq += 1;
                let ops = chunk
                    .iter()
                    .map(|k| WriteOp {
                        key: key(*k),
                        value: Some(value(*k, round)),
                        expiry: Default::default(),
                    })
                    .collect();
                write(&node, shard, seq, ops);
                for k in chunk {
                    round_of[*k] = round;
                }
                written += (chunk.len() * VALUE_BYTES) as u64;
            }
        }
        let status = &node.statuses()[0];
        largest_log = largest_log.max(status.log_bytes);
        if round % 10 == 0 {
            check_latest(&node, &round_of, &format!("round {round}"));
        }
    }
    assert!(written > 20 * segment, "the run wrote {written} bytes, fewer than twenty segments");
    // Let the collector catch up with the last writes.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = &node.statuses()[0];
        if status.gc.segments_reclaimed >= 12 && status.log_bytes <= 4 * segment {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the log was not collected: {} bytes after {written} written; gc: {:?}",
            status.log_bytes,
            status.gc
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = node.statuses()[0].clone();
    assert!(status.gc.values_relocated > 0, "live values were moved: {:?}", status.gc);
    assert!(status.gc.last_error.is_none(), "{:?}", status.gc);
    // The collector may lag behind writes this fast (a debug build, other tests beside it), but
    // the log must not grow with what was written.
    assert!(
        largest_log <= written / 2,
        "the log grew to {largest_log} bytes ({} segments) of {written} written while the collector ran",
        largest_log / segment
    );
    check_latest(&node, &round_of, "after collection");
    node.shutdown();
    drop(node);

    // The collected log recovers: every key still reads its latest value, and the node writes on.
    let node = open(dir.path(), storage);
    check_latest(&node, &round_of, "after a restart");
    seq += 1;
    write(
        &node,
        1,
        seq,
        vec![WriteOp { key: key(0), value: Some(value(0, rounds + 1)), expiry: Default::default() }],
    );
    round_of[0] = rounds + 1;
    check_latest(&node, &round_of, "after a restart and a write");
    node.shutdown();
}

/// Overwrites every key with its value of `round`, one write each.
fn overwrite_all(node: &Node, seq: &mut u64, round: usize) {
    for k in 0..KEYS {
        *seq += 1;
        write(
            node,
            shard_of(k),
            *seq,
            vec![WriteOp { key: key(k), value: Some(value(k, round)), expiry: Default::default() }],
        );
    }
}

/// A small value that compresses as real records do (text with repeated field names).
fn small_value(k: usize) -> Vec<u8> {
    format!(
        "{{\"user\":\"user{k:08}\",\"field0\":\"{}\",\"field1\":\"{}\"}}",
        "abcdefgh".repeat(12),
        k * 7919
    )
    .into_bytes()
}

#[test]
fn small_values_are_compressed_when_moved_and_read_back() {
    const SMALL: usize = 40_000;
    let dir = tempfile::tempdir().unwrap();
    let node = open(dir.path(), StorageMode::OneLog);
    let mut seq = 0u64;
    // One value whose marker LZ4 keeps as it is (letters that occur nowhere else), so its copy
    // inside a compressed block can be found and damaged at the end.
    seq += 1;
    write(
        &node,
        1,
        seq,
        vec![WriteOp { key: b"marked".to_vec(), value: Some(marked_value()), expiry: Default::default() }],
    );
    // 40 000 small values (about 7 MiB of pairs), written once: cold data the collector must move.
    for start in (0..SMALL).step_by(500) {
        for shard in 1..=3u64 {
            seq += 1;
            let ops = (start..start + 500)
                .filter(|k| shard_of(*k) == shard)
                .map(|k| WriteOp {
                    key: format!("small-{k:06}").into_bytes(),
                    value: Some(small_value(k)),
                    expiry: Default::default(),
                })
                .collect();
            write(&node, shard, seq, ops);
        }
    }
    let check_small = |node: &Node, when: &str| {
        for k in (0..SMALL).step_by(7) {
            let got = node.replica(shard_of(k)).unwrap().get(format!("small-{k:06}").as_bytes()).unwrap();
            assert!(got == Some(small_value(k)), "{when}: small key {k} does not read its value");
        }
    };
    // Overwrites of large values roll segments until the small values have been moved, twice (the
    // second time out of their compressed blocks).
    let mut round_of = vec![0usize; KEYS];
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut round = 0;
    loop {
        round += 1;
        overwrite_all(&node, &mut seq, round);
        round_of.fill(round);
        let gc = node.statuses()[0].gc.clone();
        if gc.values_packed >= 2 * SMALL as u64 {
            break;
        }
        assert!(Instant::now() < deadline, "the small values were not moved twice: {gc:?}");
    }
    let gc = node.statuses()[0].gc.clone();
    assert!(gc.last_error.is_none(), "{gc:?}");
    assert!(
        gc.packed_bytes * 3 < gc.packed_raw_bytes,
        "compressible small values should shrink to under a third: {gc:?}"
    );
    check_small(&node, "after moving");
    for (k, round) in round_of.iter().enumerate() {
        let got = node.replica(shard_of(k)).unwrap().get(&key(k)).unwrap();
        assert!(got == Some(value(k, *round)), "key {k} does not read its value of round {round}");
    }
    node.shutdown();
    drop(node);
    let node = open(dir.path(), StorageMode::OneLog);
    check_small(&node, "after a restart");
    assert_eq!(node.replica(1).unwrap().get(b"marked").unwrap(), Some(marked_value()));

    // A byte flipped inside the compressed block, as bit rot would (with the node stopped, so the
    // collector deletes nothing meanwhile; in a sealed segment, which the log does not read at
    // open): the read fails as damage (a single node has no copy to repair from), never with
    // wrong bytes.
    let log = dir.path().join("log");
    let newest = || segment_files(&log).into_iter().max().unwrap();
    let mut node = node;
    loop {
        node.shutdown();
        drop(node);
        // Checked with the node stopped: while it runs, its collector may move the marked block
        // into the newest segment at any moment.
        if !marker_copies(&log).iter().any(|(path, _)| *path == newest()) {
            break;
        }
        node = open(dir.path(), StorageMode::OneLog);
        round += 1;
        overwrite_all(&node, &mut seq, round);
    }
    let damaged = damage_marker(&log);
    assert!(damaged > 0, "the marked value is on disk");
    let node = open(dir.path(), StorageMode::OneLog);
    let expect_corrupt = |node: &Node, when: &str| match node.replica(1).unwrap().get(b"marked") {
        Err(ReplicaError::Corrupt { key, .. }) => assert_eq!(key, b"marked"),
        other => panic!("{when}: a damaged block must read as corrupt, not {other:?}"),
    };
    expect_corrupt(&node, "damaged");

    // The collector does not stop at the damaged block: its values move as damaged stand-ins (the
    // marker's bytes are gone from the log once its segment is reclaimed) and still read as damage.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !marker_copies(&log).is_empty() {
        round += 1;
        overwrite_all(&node, &mut seq, round);
        let gc = node.statuses()[0].gc.clone();
        assert!(Instant::now() < deadline, "the damaged block was never collected: {gc:?}");
    }
    expect_corrupt(&node, "after the damaged block moved");
    node.shutdown();
}

const MARKER: &[u8] = b"<QZXJVKWQPMRTYHNGLSDBWKZQXJ>";

fn marked_value() -> Vec<u8> {
    let mut value = MARKER.to_vec();
    value.resize(300, b'm');
    value
}

/// Every copy of [`MARKER`] in the log's segment files: file and offset.
/// The log's segment files (not the reclaimed files it keeps for reuse, `*.free`).
fn segment_files(log: &Path) -> Vec<std::path::PathBuf> {
    let paths = std::fs::read_dir(log).unwrap().map(|entry| entry.unwrap().path());
    paths.filter(|path| path.extension().is_some_and(|ext| ext == "seg")).collect()
}

fn marker_copies(log: &Path) -> Vec<(std::path::PathBuf, usize)> {
    let mut copies = Vec::new();
    for path in segment_files(log) {
        let Ok(bytes) = std::fs::read(&path) else { continue }; // deleted meanwhile
        for (at, _) in bytes.windows(MARKER.len()).enumerate().filter(|(_, w)| *w == MARKER) {
            copies.push((path.clone(), at));
        }
    }
    copies
}

/// Flips the byte just before every copy of [`MARKER`] in the log's segment files (the value's
/// checksum, inside a block: its data), leaving the marker findable; returns how many.
fn damage_marker(log: &Path) -> usize {
    use std::os::unix::fs::FileExt;
    let copies = marker_copies(log);
    for (path, at) in &copies {
        let file = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, (at - 1) as u64).unwrap();
        file.write_at(&[byte[0] ^ 0x20], (at - 1) as u64).unwrap();
    }
    copies.len()
}
