//! `Replica::scan_keys` (the keys-only scan behind the RESP front end's DBSIZE, INFO keyspace and
//! SCAN) returns the keys a full scan would, within the same bounds, without reading any value.
//!
//! The evidence that no value is read does not depend on timing: every stored copy of every value
//! is damaged on disk, after which a full scan fails its checksum while the keys-only scan still
//! answers. And with 1 MiB values, one keys-only page holds every key where a full page stops at
//! `max_scan_bytes`.

use onekv_replica::local::Router;
use onekv_replica::{Command, Replica, ReplicaConfig, ReplicaError, RequestId, StorageMode, WriteOp};
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Values of 1 MiB, the default `max_value_bytes`.
const VALUE_BYTES: usize = 1 << 20;
const KEYS: usize = 8;

fn write(replica: &Replica, ops: Vec<WriteOp>) {
    let (tx, rx) = mpsc::channel();
    replica.propose(RequestId::default(), Command::Write(ops), Box::new(move |r| drop(tx.send(r))));
    rx.recv_timeout(Duration::from_secs(20)).expect("an answer, not a hang").expect("the write");
}

/// Opens a one-node replica in `dir` and waits until it leads.
fn open_leader(dir: &Path, mode: StorageMode) -> Replica {
    let mut config = ReplicaConfig::new(1, vec![1], dir);
    config.storage = mode;
    config.tick = Duration::from_millis(10);
    let router = Arc::new(Router::default());
    let replica = Replica::open(config, router.clone()).unwrap();
    router.add(1, replica.clone());
    let deadline = Instant::now() + Duration::from_secs(10);
    while replica.status().role != "leader" {
        assert!(Instant::now() < deadline, "the single node did not become leader");
        std::thread::sleep(Duration::from_millis(5));
    }
    replica
}

fn key(i: usize) -> Vec<u8> {
    format!("key-{i:02}").into_bytes()
}

/// A value that starts with a marker found nowhere else, so its copies on disk can be found.
fn value(i: usize) -> Vec<u8> {
    let mut value = format!("<value {i} starts here>").into_bytes();
    value.resize(VALUE_BYTES, b'a' + i as u8);
    value
}

/// Flips one byte inside every stored copy of every value under `dir` (the Raft entry, and the
/// value log's copy in separated mode); returns how many copies were damaged.
fn damage_every_value(dir: &Path) -> usize {
    let markers: Vec<Vec<u8>> = (0..KEYS).map(|i| value(i)[..24].to_vec()).collect();
    let mut damaged = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        if path.is_dir() {
            pending.extend(std::fs::read_dir(&path).unwrap().map(|entry| entry.unwrap().path()));
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        for marker in &markers {
            let mut from = 0;
            while let Some(at) = bytes[from..].windows(marker.len()).position(|window| window == marker) {
                let position = from + at + 1000;
                file.write_at(&[bytes[position] ^ 0xff], position as u64).unwrap();
                damaged += 1;
                from = position;
            }
        }
    }
    damaged
}

fn keys_only_scans_read_no_value(mode: StorageMode) {
    let dir = tempfile::tempdir().unwrap();
    let replica = open_leader(dir.path(), mode);
    for i in 0..KEYS {
        write(&replica, vec![WriteOp { key: key(i), value: Some(value(i)), expiry: Default::default() }]);
    }
    let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();

    // A full page stops once `max_scan_bytes` (4 MiB) of values were read; a keys-only page
    // counts key bytes only, so it holds every key (and no value byte).
    let (pairs, more) = replica.scan(b"", None, 0, false).unwrap();
    assert!(pairs.len() < KEYS && more, "a full page of {} pairs, more = {more}", pairs.len());
    let (pairs, more) = replica.scan_keys(b"", None, 0, false).unwrap();
    assert_eq!(pairs.iter().map(|(key, _)| key.clone()).collect::<Vec<_>>(), keys);
    assert!(pairs.iter().all(|(_, value)| value.is_empty()), "a keys-only scan returned values");
    assert!(!more);

    // The range, the limit, the order and `more` are a full scan's.
    let (pairs, more) = replica.scan_keys(b"key-02", Some(b"key-06"), 3, true).unwrap();
    assert_eq!(pairs.iter().map(|(key, _)| key.clone()).collect::<Vec<_>>(), vec![key(5), key(4), key(3)]);
    assert!(more);
    let (pairs, more) = replica.scan_keys(b"key-02", Some(b"key-06"), 0, false).unwrap();
    assert_eq!(pairs.len(), 4);
    assert!(!more);

    // With every value damaged on disk, reading any value fails its checksum; the keys-only scan
    // reads none, so it still answers.
    assert!(damage_every_value(dir.path()) >= KEYS, "the values were not found on disk");
    let full = replica.scan(b"", None, 0, false);
    assert!(matches!(&full, Err(ReplicaError::Corrupt { .. })), "{full:?}");
    assert!(matches!(replica.get(&key(0)), Err(ReplicaError::Corrupt { key, .. }) if key == b"key-00"));
    let (pairs, more) = replica.scan_keys(b"", None, 0, false).unwrap();
    assert_eq!(pairs.into_iter().map(|(key, _)| key).collect::<Vec<_>>(), keys);
    assert!(!more);
    replica.shutdown();
}

#[test]
fn keys_only_scans_read_no_value_in_onelog_mode() {
    keys_only_scans_read_no_value(StorageMode::OneLog);
}

#[test]
fn keys_only_scans_read_no_value_in_separated_mode() {
    keys_only_scans_read_no_value(StorageMode::Separated);
}

#[test]
fn keys_only_pages_keep_the_pair_and_byte_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let replica = open_leader(dir.path(), StorageMode::OneLog);
    // 1100 keys of 4 KiB: 4.3 MiB of key bytes, over the 4 MiB `max_scan_bytes`.
    let long_key = |i: usize| {
        let mut key = format!("{i:05}").into_bytes();
        key.resize(4 << 10, b'k');
        key
    };
    for chunk in (0..1100).collect::<Vec<_>>().chunks(550) {
        write(
            &replica,
            chunk
                .iter()
                .map(|&i| WriteOp {
                    key: long_key(i),
                    value: Some(b"v".to_vec()),
                    expiry: Default::default(),
                })
                .collect(),
        );
    }
    let (pairs, more) = replica.scan_keys(b"", None, 0, false).unwrap();
    assert!(more, "4.3 MiB of keys in one page");
    let bytes: usize = pairs.iter().map(|(key, _)| key.len()).sum();
    // It stops at the first key that reaches the bound, as a full scan does.
    assert_eq!(bytes, 4 << 20, "{} keys, {bytes} bytes", pairs.len());
    assert_eq!(pairs.last().unwrap().0, long_key(1023));
    let (pairs, more) = replica.scan_keys(b"", None, 100, false).unwrap();
    assert_eq!(pairs.len(), 100);
    assert!(more);
    replica.shutdown();
}
