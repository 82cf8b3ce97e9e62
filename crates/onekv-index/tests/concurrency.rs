//! Readers on other threads while the writer inserts, publishes, flushes and compacts: no panic, and
//! every read sees whole batches only.
//!
//! Batch `b` writes all `KEYS` keys with value `b` (or, every third batch, removes them all), each key
//! at its own seqno, then publishes once. A reader must therefore see either no key or every key,
//! all with one value, and never a value older than one it saw before.

use onekv_index::{Index, IndexConfig, Tree};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

const KEYS: u64 = 32;
const BATCHES: u64 = 300;

fn key(i: u64) -> Vec<u8> {
    format!("key-{i:03}").into_bytes()
}

fn batch_is_removal(batch: u64) -> bool {
    batch % 3 == 2
}

/// Checks one range result; returns the batch it shows (`None`: a removal batch or nothing yet).
fn check_range(pairs: &[(Vec<u8>, Vec<u8>)]) -> Option<u64> {
    if pairs.is_empty() {
        return None;
    }
    assert_eq!(pairs.len() as u64, KEYS, "half a batch visible: {} keys", pairs.len());
    let batch = u64::from_le_bytes(pairs[0].1.as_slice().try_into().unwrap());
    for (i, (k, v)) in pairs.iter().enumerate() {
        assert_eq!(k, &key(i as u64));
        assert_eq!(u64::from_le_bytes(v.as_slice().try_into().unwrap()), batch, "mixed batches");
    }
    assert!(!batch_is_removal(batch));
    Some(batch)
}

fn reader(tree: Tree, stop: Arc<AtomicBool>, reverse: bool) -> u64 {
    let mut newest_seen = 0;
    let mut reads = 0;
    while !stop.load(Ordering::Relaxed) {
        let (mut pairs, more) = tree.range(b"key-", Some(b"key.."), 1000, reverse).unwrap();
        assert!(!more);
        if reverse {
            pairs.reverse();
        }
        if let Some(batch) = check_range(&pairs) {
            assert!(batch >= newest_seen, "went back from batch {newest_seen} to {batch}");
            newest_seen = batch;
        }
        // A point read of a key from the other end must not go back either.
        if let Some(v) = tree.get(&key(KEYS - 1)).unwrap() {
            let batch = u64::from_le_bytes(v.as_slice().try_into().unwrap());
            assert!(batch >= newest_seen, "get went back from batch {newest_seen} to {batch}");
            newest_seen = batch;
        }
        reads += 1;
    }
    reads
}

#[test]
fn readers_see_whole_batches_while_the_writer_flushes_and_compacts() {
    let dir = tempfile::tempdir().unwrap();
    let index = Index::open(dir.path(), IndexConfig { l0_threshold: 2, ..IndexConfig::default() }).unwrap();
    let tree = index.tree("shard-1").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = [false, true]
        .into_iter()
        .map(|reverse| {
            let (tree, stop) = (tree.clone(), stop.clone());
            thread::spawn(move || reader(tree, stop, reverse))
        })
        .collect();
    // A compaction thread besides the writer, as a replica may run one.
    let compactor = {
        let (tree, stop) = (tree.clone(), stop.clone());
        thread::spawn(move || {
            let mut steps = 0;
            while !stop.load(Ordering::Relaxed) {
                tree.maybe_compact(onekv_index::Layout::Leveled).unwrap();
                steps += 1;
                thread::sleep(Duration::from_millis(1));
            }
            steps
        })
    };

    let started = Instant::now();
    let mut seqno = 0;
    for batch in 1..=BATCHES {
        for i in 0..KEYS {
            seqno += 1;
            if batch_is_removal(batch) {
                tree.remove(&key(i), seqno);
            } else {
                tree.insert(&key(i), &batch.to_le_bytes(), seqno);
            }
        }
        // Sometimes flush before publishing, so flushes carry unpublished writes.
        if batch % 7 == 0 {
            tree.flush(batch, seqno).unwrap();
        }
        tree.publish(seqno);
        if batch % 11 == 0 {
            tree.flush(batch, seqno).unwrap();
            tree.maybe_compact(onekv_index::Layout::Leveled).unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let reads: Vec<u64> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let compactions = compactor.join().unwrap();
    assert!(reads.iter().all(|&r| r > 0), "every reader ran: {reads:?}");
    assert!(compactions > 0);
    assert!(started.elapsed() < Duration::from_secs(60));

    let (pairs, _) = tree.range(b"", None, 1000, false).unwrap();
    let last_batch = if batch_is_removal(BATCHES) { None } else { Some(BATCHES) };
    assert_eq!(check_range(&pairs), last_batch);
}
