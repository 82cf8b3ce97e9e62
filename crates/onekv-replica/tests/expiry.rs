//! Keys that expire, on a shard's replicas in one process: an expired key reads as absent (get,
//! scan) and counts as absent for a compare-and-swap or a transaction's condition as soon as its
//! time comes, before any deletion; `Expiry::Keep` keeps the key's time through a new value; the
//! leader's sweep then deletes it on every replica; expiries survive a restart (replayed from the
//! log), a snapshot to a follower that fell behind, and the log GC moving the values.

mod common;

use common::cluster::Cluster;
use onekv_replica::{
    Command, Condition, Expiry, GcConfig, Replica, ReplicaConfig, ReplicaError, StorageMode, WriteOp,
};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn put(key: &str, value: &[u8], expiry: Expiry) -> Command {
    Command::Write(vec![WriteOp { key: key.into(), value: Some(value.to_vec()), expiry }])
}

fn cas(key: &str, expected: Option<&[u8]>, new: &[u8], new_expiry: Expiry) -> Command {
    Command::Cas {
        key: key.into(),
        expected: expected.map(<[u8]>::to_vec),
        new: Some(new.to_vec()),
        new_expiry,
    }
}

fn read(replica: &Replica, key: &str) -> Option<(Vec<u8>, Option<u64>)> {
    replica.get_with_expiry(key.as_bytes()).unwrap()
}

/// Waits until `check` holds, for at most `limit`.
fn wait_for(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn small_log(config: &mut ReplicaConfig) {
    config.memtable_bytes = 4 << 10;
    config.raft_log_keep_entries = 5;
    config.snapshot_timeout = Duration::from_secs(1);
}

#[test]
fn an_expired_key_is_absent_at_once_and_then_deleted_on_every_replica() {
    for mode in [StorageMode::OneLog, StorageMode::Separated, StorageMode::Classic] {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = Cluster::start(dir.path(), 3, mode, |_| {});
        let soon = now_ms() + 1_500;
        let later = now_ms() + 3_600_000;
        for (key, expiry) in
            [("soon", Expiry::At(soon)), ("swapped", Expiry::At(soon)), ("guarded", Expiry::At(soon))]
        {
            cluster.propose(put(key, b"v", expiry)).unwrap();
        }
        cluster.propose(put("later", b"1", Expiry::At(later))).unwrap();
        cluster.propose(put("plain", b"p", Expiry::Never)).unwrap();
        // A new value that keeps the key's expiry, and one that drops it.
        let kept = cluster.propose(cas("later", Some(b"1"), b"2", Expiry::Keep)).unwrap();
        assert!(kept.cas.unwrap().swapped);
        cluster.propose(put("dropped", b"d", Expiry::At(later))).unwrap();
        cluster.propose(put("dropped", b"d2", Expiry::Never)).unwrap();
        let leader = cluster.replica(cluster.leader());
        assert_eq!(read(&leader, "soon"), Some((b"v".to_vec(), Some(soon))));
        assert_eq!(read(&leader, "later"), Some((b"2".to_vec(), Some(later))));
        assert_eq!(read(&leader, "dropped"), Some((b"d2".to_vec(), None)));
        assert_eq!(read(&leader, "plain"), Some((b"p".to_vec(), None)));

        // Its time comes: absent for reads, scans, swaps and conditions, though not deleted yet
        // (the sweep's next pass is seconds away).
        while now_ms() <= soon {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(cluster.linearizable_get("soon"), None, "{mode:?}");
        let (pairs, _) = leader.scan(b"", None, 0, false).unwrap();
        let keys: Vec<&[u8]> = pairs.iter().map(|(key, _)| key.as_slice()).collect();
        assert_eq!(keys, vec![&b"dropped"[..], b"later", b"plain"], "{mode:?}");
        let swapped = cluster.propose(cas("swapped", None, b"new", Expiry::Never)).unwrap();
        assert!(swapped.cas.unwrap().swapped, "an expired key is absent for a swap ({mode:?})");
        let check = Command::Txn {
            conditions: vec![Condition { key: b"guarded".to_vec(), expected: None }],
            ops: vec![WriteOp::put(b"guarded".to_vec(), b"again".to_vec())],
        };
        assert!(cluster.propose(check).unwrap().cas.unwrap().swapped, "{mode:?}");

        // The leader's sweep deletes what is still expired, on every replica.
        wait_for(Duration::from_secs(30), "the expired key deleted on every replica", || {
            cluster.ids.iter().all(|&id| cluster.replica(id).status().expired_keys_deleted >= 1)
        });
        for &id in &cluster.ids {
            let replica = cluster.replica(id);
            wait_for(Duration::from_secs(10), "every replica applied the same", || {
                read(&replica, "swapped").is_some()
            });
            assert_eq!(replica.status().expired_keys_deleted, 1, "only `soon` expired ({mode:?})");
            assert_eq!(read(&replica, "swapped"), Some((b"new".to_vec(), None)));
            assert_eq!(read(&replica, "guarded"), Some((b"again".to_vec(), None)));
            assert_eq!(read(&replica, "later"), Some((b"2".to_vec(), Some(later))));
        }

        // Expiries are replayed from the log after a restart of every node.
        for id in cluster.ids.clone() {
            cluster.stop(id);
        }
        for id in cluster.ids.clone() {
            cluster.open(id);
        }
        assert_eq!(cluster.linearizable_get("later").as_deref(), Some(&b"2"[..]));
        let leader = cluster.replica(cluster.leader());
        assert_eq!(read(&leader, "later"), Some((b"2".to_vec(), Some(later))), "{mode:?}");
        assert_eq!(read(&leader, "soon"), None, "{mode:?}");
        cluster.shutdown();
    }
}

/// Ops of one entry see each other's expiry: a put keeping the expiry after a delete of the key
/// keeps none, after a put with an expiry keeps that one (the tree shows an entry's writes only
/// once the whole entry applied).
#[test]
fn a_put_keeping_the_expiry_sees_the_earlier_ops_of_its_own_entry() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 1, StorageMode::OneLog, |_| {});
    let later = now_ms() + 3_600_000;
    cluster.propose(put("a", b"1", Expiry::At(later))).unwrap();
    let keep = |key: &str, value: &[u8]| WriteOp {
        key: key.into(),
        value: Some(value.to_vec()),
        expiry: Expiry::Keep,
    };
    cluster.propose(Command::Write(vec![WriteOp::delete(b"a".to_vec()), keep("a", b"2")])).unwrap();
    let set_then_keep =
        WriteOp { key: b"b".to_vec(), value: Some(b"1".to_vec()), expiry: Expiry::At(later + 1) };
    cluster.propose(Command::Write(vec![set_then_keep, keep("b", b"2")])).unwrap();
    let relative =
        WriteOp { key: b"c".to_vec(), value: Some(b"1".to_vec()), expiry: Expiry::AfterMs(60_000) };
    let before = now_ms();
    cluster.propose(Command::Write(vec![relative])).unwrap();
    let leader = cluster.replica(1);
    assert_eq!(read(&leader, "a"), Some((b"2".to_vec(), None)));
    assert_eq!(read(&leader, "b"), Some((b"2".to_vec(), Some(later + 1))));
    let (_, at) = read(&leader, "c").unwrap();
    let at = at.expect("a relative expiry became a time");
    // (The node's clock is its wall clock at open plus the monotonic time since: a millisecond or
    // two apart from the system's now.)
    let after = now_ms();
    assert!(
        (before + 59_990..=after + 60_010).contains(&at),
        "{at} is not a minute after the write at {before}"
    );
    cluster.shutdown();
}

/// A page never ends at a run of expired keys: the scan reads on past them, so `more` always
/// comes with a key to continue from (SCAN's cursor, FLUSHALL's and DBSIZE's paging), forward and
/// reverse, full and keys-only.
#[test]
fn scans_read_past_runs_of_expired_keys() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 1, StorageMode::OneLog, |_| {});
    let mut ops = Vec::new();
    for i in 0..100 {
        ops.push(WriteOp {
            key: format!("a{i:03}").into_bytes(),
            value: Some(b"gone".to_vec()),
            expiry: Expiry::At(1),
        });
    }
    ops.push(WriteOp::put(b"b".to_vec(), b"live".to_vec()));
    for i in 0..100 {
        ops.push(WriteOp {
            key: format!("c{i:03}").into_bytes(),
            value: Some(b"gone".to_vec()),
            expiry: Expiry::At(1),
        });
    }
    ops.push(WriteOp::put(b"d".to_vec(), b"live".to_vec()));
    for chunk in ops.chunks(50) {
        cluster.propose(Command::Write(chunk.to_vec())).unwrap();
    }
    let replica = cluster.replica(1);
    for reverse in [false, true] {
        let (pairs, more) = replica.scan(b"", None, 1, reverse).unwrap();
        let first: &[u8] = if reverse { b"d" } else { b"b" };
        assert_eq!((pairs.len(), pairs[0].0.as_slice(), more), (1, first, true), "reverse {reverse}");
        let (pairs, more) = replica.scan(b"", None, 10, reverse).unwrap();
        let keys: Vec<&[u8]> = pairs.iter().map(|(key, _)| key.as_slice()).collect();
        let expected: Vec<&[u8]> = if reverse { vec![b"d", b"b"] } else { vec![b"b", b"d"] };
        assert_eq!((keys, more), (expected, false), "reverse {reverse}");
        let (keys, more) = replica.scan_keys(b"b\0", None, 10, reverse).unwrap();
        assert_eq!((keys.len(), more), (1, false), "reverse {reverse}");
    }
    let (pairs, more) = replica.scan(b"c", Some(b"c999"), 10, false).unwrap();
    assert_eq!((pairs.len(), more), (0, false), "a range of expired keys alone is empty and complete");
    cluster.shutdown();
}

#[test]
fn expiries_travel_in_a_snapshot_to_a_follower_that_fell_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, StorageMode::OneLog, small_log);
    cluster.put("first", b"1");
    let leader = cluster.leader();
    let lagging = (1..=3).find(|id| *id != leader).unwrap();
    cluster.stop(lagging);
    let later = now_ms() + 3_600_000;
    for i in 0..300 {
        let expiry = if i % 2 == 0 { Expiry::At(later + i) } else { Expiry::Never };
        cluster.propose(put(&format!("k{i:04}"), b"value", expiry)).unwrap();
    }
    let status = cluster.replica(cluster.leader()).status();
    assert!(status.first_index > 100, "the Raft log was not compacted: {status:?}");
    cluster.open(lagging);
    let last = cluster.propose(put("after", b"a", Expiry::Never)).unwrap();
    cluster.wait_applied(lagging, last.index);
    let replica = cluster.replica(lagging);
    assert!(replica.status().first_index > 100, "no snapshot was installed: {:?}", replica.status());
    for i in 0..300 {
        let expiry = (i % 2 == 0).then_some(later + i);
        assert_eq!(read(&replica, &format!("k{i:04}")), Some((b"value".to_vec(), expiry)), "k{i:04}");
    }
    cluster.shutdown();
}

#[test]
fn the_log_gc_keeps_a_key_s_expiry_when_it_moves_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let tweak = |config: &mut ReplicaConfig| {
        config.segment_bytes = ReplicaConfig::SEGMENT_BYTES_RANGE.0;
        config.memtable_bytes = 256 << 10;
        config.raft_log_keep_entries = 20;
        config.gc = GcConfig { interval: Duration::from_millis(50), bytes_per_sec: 0, ..GcConfig::default() };
    };
    let mut cluster = Cluster::start(dir.path(), 1, StorageMode::OneLog, tweak);
    let later = now_ms() + 3_600_000;
    for i in 0..20 {
        cluster.propose(put(&format!("keep{i:02}"), &[i as u8; 512], Expiry::At(later + i))).unwrap();
    }
    // Overwrites fill segments (16 MiB, the smallest) with garbage, so the collector relocates
    // the kept values out of the oldest.
    for round in 0..100u8 {
        let ops =
            (0..8).map(|i| WriteOp::put(format!("churn{i}").into_bytes(), vec![round; 64 << 10])).collect();
        cluster.propose(Command::Write(ops)).unwrap();
    }
    let replica = cluster.replica(1);
    wait_for(Duration::from_secs(30), "the collector relocated values", || {
        replica.status().gc.values_relocated >= 20
    });
    for i in 0..20u64 {
        let key = format!("keep{i:02}");
        assert_eq!(read(&replica, &key), Some((vec![i as u8; 512], Some(later + i))), "{key}");
    }
    // And after a restart (the moved locators with their expiries were flushed).
    cluster.stop(1);
    cluster.open(1);
    let replica = cluster.replica(1);
    for i in 0..20u64 {
        let key = format!("keep{i:02}");
        assert_eq!(
            read(&replica, &key),
            Some((vec![i as u8; 512], Some(later + i))),
            "{key} after a restart"
        );
    }
    assert!(
        !matches!(replica.get_with_expiry(b""), Ok(Some(_))),
        "the empty key is refused, not read: {:?}",
        replica.get_with_expiry(b"").map_err(|e| matches!(e, ReplicaError::InvalidArgument(_)))
    );
    cluster.shutdown();
}
