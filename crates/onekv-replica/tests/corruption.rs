//! A value damaged on disk below the recovery point (issue 13, finding 11): one byte of a stored
//! value is flipped in a replica's log file after Raft has compacted its entry away, as bit rot or a
//! misdirected write would do.
//!
//! - The read that finds the damage fails with the distinct [`ReplicaError::Corrupt`] naming the key
//!   and the position; the node asks the others for their copy through Raft and takes it, after
//!   which the key is served again; other keys and other nodes keep serving throughout.
//! - With no healthy copy anywhere, that key's reads fail every time, the damage is counted once
//!   however often it is read, nothing stops, and a new write of the key ends it.
//! - A leader holding the damage keeps leading and serving; its snapshot build for a lagging
//!   follower fails with a status naming the damage, and the next succeeds once it is repaired.
//! - The background scrub finds a damaged value nobody read, at a bounded rate, and it is repaired.

use onekv_replica::local::Router;
use onekv_replica::{
    Command, Outcome, Replica, ReplicaConfig, ReplicaError, ReplicaStatus, RequestId, StorageMode, WriteOp,
};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

struct Cluster {
    router: Arc<Router>,
    root: PathBuf,
    ids: Vec<u64>,
    mode: StorageMode,
    scrub_bytes_per_sec: u64,
    /// Log segment size (the default when `None`).
    segment_bytes: Option<u64>,
    /// Whether a node opened from now on fetches snapshots from another follower than the leader.
    snapshot_from_followers: bool,
    next_seq: u64,
}

impl Cluster {
    fn start(root: &Path, nodes: u64, mode: StorageMode, scrub_bytes_per_sec: u64) -> Cluster {
        let mut cluster = Cluster {
            router: Arc::new(Router::default()),
            root: root.to_path_buf(),
            ids: (1..=nodes).collect(),
            mode,
            scrub_bytes_per_sec,
            segment_bytes: None,
            snapshot_from_followers: true,
            next_seq: 1,
        };
        for id in cluster.ids.clone() {
            cluster.open(id);
        }
        cluster
    }

    fn dir(&self, id: u64) -> PathBuf {
        self.root.join(format!("node{id}"))
    }

    fn open(&mut self, id: u64) {
        let mut config = ReplicaConfig::new(id, self.ids.clone(), self.dir(id));
        config.storage = self.mode;
        config.tick = Duration::from_millis(20);
        // Small memtables and a short Raft log: entries are compacted away (the damage is below
        // the recovery point, where nothing but the index refers to it) and a node that was down
        // needs a snapshot.
        config.memtable_bytes = 4 << 10;
        config.raft_log_keep_entries = 5;
        config.snapshot_timeout = Duration::from_secs(1);
        config.scrub_bytes_per_sec = self.scrub_bytes_per_sec;
        config.snapshot_from_followers = self.snapshot_from_followers;
        if let Some(bytes) = self.segment_bytes {
            config.segment_bytes = bytes;
        }
        let replica = Replica::open(config, self.router.clone()).expect("open");
        self.router.add(id, replica);
    }

    fn stop(&mut self, id: u64) {
        self.router.remove(id).expect("running").shutdown();
    }

    fn replica(&self, id: u64) -> Replica {
        self.router.get(id).expect("running")
    }

    fn leader(&self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(id) = self.router.leader() {
                return id;
            }
            assert!(Instant::now() < deadline, "no leader elected");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn propose(&mut self, command: Command) -> Result<Outcome, ReplicaError> {
        let request_id = RequestId { client: 1, seq: self.next_seq };
        self.next_seq += 1;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let replica = self.replica(self.leader());
            let (tx, rx) = mpsc::channel();
            replica.propose(request_id, command.clone(), Box::new(move |r| tx.send(r).unwrap()));
            match rx.recv_timeout(Duration::from_secs(10)).expect("a reply") {
                Err(ReplicaError::NotLeader { .. }) | Err(ReplicaError::Dropped(_))
                    if Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20))
                }
                other => return other,
            }
        }
    }

    fn put(&mut self, key: &str, value: &[u8]) -> u64 {
        self.propose(Command::Write(vec![WriteOp {
            key: key.into(),
            value: Some(value.to_vec()),
            expiry: Default::default(),
        }]))
        .unwrap()
        .index
    }

    /// A linearizable read on node `id` (which must lead).
    fn read_on(&self, id: u64, key: &str) -> Result<Option<Vec<u8>>, ReplicaError> {
        let replica = self.replica(id);
        let (tx, rx) = mpsc::channel();
        replica.read_barrier(Box::new(move |r| tx.send(r).unwrap()));
        rx.recv_timeout(Duration::from_secs(10)).unwrap()?;
        replica.get(key.as_bytes())
    }

    fn wait_applied(&self, id: u64, index: u64) {
        wait_for(&format!("node {id} applies {index}"), || self.replica(id).status().applied_index >= index);
    }

    fn shutdown(mut self) {
        for id in self.ids.clone() {
            if self.router.get(id).is_some() {
                self.stop(id);
            }
        }
    }
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A value that starts with a marker found nowhere else, so its copy on disk can be found.
fn value(name: &str, len: usize) -> Vec<u8> {
    let mut value = format!("<unique value {name}>").into_bytes();
    value.resize(len, b'v');
    value
}

/// Flips one byte inside every copy of `value` in the segment files of the log directory `log`
/// (past its marker, so the marker still finds it); returns the segment file of the last one. There
/// is one copy unless a snapshot was installed meanwhile (a follower slowed down on a loaded
/// machine): separated mode then writes the value into its value log a second time.
fn damage(log: &Path, value: &[u8]) -> PathBuf {
    let marker = &value[..value.iter().position(|&b| b == b'>').unwrap() + 1];
    let mut found = Vec::new();
    for entry in std::fs::read_dir(log).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let mut from = 0;
        while let Some(at) = bytes[from..].windows(marker.len()).position(|w| w == marker) {
            found.push((path.clone(), from + at + marker.len() + 3));
            from += at + marker.len();
        }
    }
    assert!(!found.is_empty(), "no copy of the value on disk");
    let mut damaged = PathBuf::new();
    for (path, position) in found {
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, position as u64).unwrap();
        file.write_at(&[byte[0] ^ 0x5a], position as u64).unwrap();
        damaged = path;
    }
    damaged
}

/// Enough writes that every node flushes its index and Raft compacts the entries before them.
fn fill(cluster: &mut Cluster, prefix: &str, count: usize) -> u64 {
    let mut last = 0;
    for i in 0..count {
        last = cluster.put(&format!("{prefix}{i:04}"), &value(&format!("{prefix}{i}"), 64));
    }
    last
}

fn status(cluster: &Cluster, id: u64) -> ReplicaStatus {
    cluster.replica(id).status()
}

/// Writes a value with a unique marker, then enough more that every node flushes its index and
/// compacts its Raft log past it; returns the value.
fn write_below_the_recovery_point(cluster: &mut Cluster, key: &str, len: usize) -> Vec<u8> {
    let value = value(key, len);
    let written = cluster.put(key, &value);
    let last = fill(cluster, &format!("{key}-filler"), 100);
    for id in cluster.ids.clone() {
        cluster.wait_applied(id, last);
        let status = status(cluster, id);
        assert!(status.first_index > written, "node {id}'s Raft log still holds the entry: {status:?}");
    }
    value
}

#[test]
fn a_damaged_value_on_the_leader_fails_one_read_with_a_distinct_error_and_is_repaired_from_a_follower() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, StorageMode::OneLog, 0);
    cluster.put("healthy", b"fine");
    let damaged_value = value("damaged", 2000);
    // It expires (in an hour): the repaired copy must keep that, as every replica does.
    let expires_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
        as u64
        + 3_600_000;
    cluster
        .propose(Command::Write(vec![WriteOp {
            key: b"damaged".to_vec(),
            value: Some(damaged_value.clone()),
            expiry: onekv_replica::Expiry::At(expires_at),
        }]))
        .unwrap();
    // The smallest segments the log allows (16 MiB and its framing), then more than one of them
    // written: the damaged record ends in a sealed segment, which the log does not read at open,
    // so the leader can restart after the repair.
    for id in 1..=3 {
        cluster.stop(id);
    }
    cluster.segment_bytes = Some((16 << 20) + 52);
    for id in 1..=3 {
        cluster.open(id);
    }
    for i in 0..17 {
        cluster.put(&format!("large{i:02}"), &value(&format!("large{i}"), 1 << 20));
    }
    let last = fill(&mut cluster, "filler", 100);
    for id in 1..=3 {
        cluster.wait_applied(id, last);
    }
    let leader = cluster.leader();
    let damaged = damage(&cluster.dir(leader).join("log"), &damaged_value);
    let newest = std::fs::read_dir(cluster.dir(leader).join("log")).unwrap().map(|e| e.unwrap().path()).max();
    assert_ne!(Some(damaged), newest, "the damaged record is in the segment being written");

    // The read that finds the damage fails with the distinct error, naming the key.
    match cluster.read_on(leader, "damaged") {
        Err(ReplicaError::Corrupt { key, position }) => {
            assert_eq!(key, b"damaged");
            assert!(position > 0);
        }
        other => panic!("expected a corrupt-value error, got {other:?}"),
    }
    // The leader asks the others for their copy through Raft and takes it: the key is served
    // again, from this node's own log, with the value every replica holds.
    wait_for("the leader's copy is repaired", || status(&cluster, leader).repaired_values == 1);
    assert_eq!(cluster.read_on(leader, "damaged").unwrap(), Some(damaged_value.clone()));
    assert_eq!(
        cluster.replica(leader).get_with_expiry(b"damaged").unwrap(),
        Some((damaged_value.clone(), Some(expires_at))),
        "the repair kept the key's expiry"
    );
    // A compare-and-swap over the repaired key is evaluated again (it was refused while damaged).
    let cas = Command::Cas {
        key: b"damaged".to_vec(),
        expected: Some(damaged_value.clone()),
        new: Some(damaged_value.clone()),
        new_expiry: Default::default(),
    };
    assert!(cluster.propose(cas).unwrap().cas.unwrap().swapped);
    let leader_status = status(&cluster, leader);
    assert_eq!(leader_status.corrupt_values, 1, "{leader_status:?}");
    assert!(leader_status.failure.is_none(), "{leader_status:?}");
    assert_eq!(cluster.leader(), leader, "the damage cost the leader its leadership");
    // Everything else was served throughout, and the other replicas' state did not change.
    assert_eq!(cluster.read_on(leader, "healthy").unwrap().as_deref(), Some(&b"fine"[..]));
    let after = cluster.put("after", b"repair");
    for id in (1..=3).filter(|id| *id != leader) {
        cluster.wait_applied(id, after);
        assert_eq!(cluster.replica(id).get(b"damaged").unwrap(), Some(damaged_value.clone()), "node {id}");
        let status = status(&cluster, id);
        assert_eq!((status.corrupt_values, status.repaired_values), (0, 0), "node {id}: {status:?}");
    }
    // The repair is a Raft entry like any write: the repaired copy survives a restart.
    cluster.stop(leader);
    cluster.open(leader);
    cluster.wait_applied(leader, after);
    assert_eq!(cluster.replica(leader).get(b"damaged").unwrap(), Some(damaged_value));
    cluster.shutdown();
}

#[test]
fn a_value_damaged_on_every_replica_fails_its_key_everywhere_counted_once_until_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, StorageMode::OneLog, 0);
    cluster.put("healthy", b"fine");
    let damaged_value = write_below_the_recovery_point(&mut cluster, "everywhere", 2000);
    for id in 1..=3 {
        damage(&cluster.dir(id).join("log"), &damaged_value);
    }
    let leader = cluster.leader();
    // No replica holds a healthy copy: every read fails, every time, with the distinct error.
    for _ in 0..5 {
        let read = cluster.read_on(leader, "everywhere");
        assert!(matches!(&read, Err(ReplicaError::Corrupt { key, .. }) if key == b"everywhere"), "{read:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let message = cluster.read_on(leader, "everywhere").unwrap_err().to_string();
    assert!(message.contains("damaged") && message.contains("checksum"), "{message}");
    // A scan over it fails the same way; one that does not touch it is served.
    assert!(matches!(
        cluster.replica(leader).scan(b"ev", Some(b"ew"), 0, false),
        Err(ReplicaError::Corrupt { .. })
    ));
    assert_eq!(cluster.replica(leader).scan(b"h", Some(b"i"), 0, false).unwrap().0.len(), 1);
    // A compare-and-swap over it is refused on the leader instead of stopping it.
    let cas = Command::Cas {
        key: b"everywhere".to_vec(),
        expected: Some(damaged_value.clone()),
        new: Some(b"swapped".to_vec()),
        new_expiry: Default::default(),
    };
    assert!(matches!(cluster.propose(cas), Err(ReplicaError::Corrupt { .. })));
    // The followers find their damage too (they answered the repair requests with nothing).
    for id in (1..=3).filter(|id| *id != leader) {
        assert!(matches!(cluster.replica(id).get(b"everywhere"), Err(ReplicaError::Corrupt { .. })));
    }
    for id in 1..=3 {
        let status = status(&cluster, id);
        // Counted once per damaged value however often it was read.
        assert_eq!((status.corrupt_values, status.repaired_values), (1, 0), "node {id}: {status:?}");
        assert!(status.failure.is_none(), "node {id}: {status:?}");
    }
    assert_eq!(cluster.leader(), leader);
    // A new write of the key replaces the damaged value everywhere.
    let rewritten = cluster.put("everywhere", b"rewritten");
    for id in 1..=3 {
        cluster.wait_applied(id, rewritten);
        assert_eq!(cluster.replica(id).get(b"everywhere").unwrap().as_deref(), Some(&b"rewritten"[..]));
    }
    cluster.shutdown();
}

#[test]
fn a_leader_with_a_damaged_value_keeps_serving_and_builds_snapshots_once_it_is_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, StorageMode::OneLog, 0);
    let damaged_value = write_below_the_recovery_point(&mut cluster, "snapshotted", 3000);
    let leader = cluster.leader();
    let lagging = (1..=3).find(|id| *id != leader).unwrap();
    cluster.stop(lagging);
    damage(&cluster.dir(leader).join("log"), &damaged_value);
    // The lagging node falls behind the leader's Raft log: it can only catch up by a snapshot,
    // the leader's (the other follower's copy is whole and would serve it instead).
    fill(&mut cluster, "more", 100);
    cluster.snapshot_from_followers = false;
    cluster.open(lagging);

    // The first build meets the damaged value and fails, saying why; the leader keeps leading
    // and serving.
    wait_for("the leader reports the failed snapshot build", || {
        status(&cluster, leader).snapshot.is_some_and(|s| s.contains("failed") && s.contains("snapshotted"))
    });
    let leader_status = status(&cluster, leader);
    assert!(leader_status.failure.is_none(), "{leader_status:?}");
    assert_eq!(leader_status.corrupt_values, 1, "{leader_status:?}");
    let served = cluster.put("still", b"serving");
    assert_eq!(cluster.read_on(leader, "still").unwrap().as_deref(), Some(&b"serving"[..]));

    // The build reported the damage, the third node's copy repairs it, the next build succeeds
    // and the lagging node catches up, with the original value.
    cluster.wait_applied(lagging, served);
    assert_eq!(cluster.leader(), leader);
    assert_eq!(status(&cluster, leader).repaired_values, 1);
    assert_eq!(cluster.replica(lagging).get(b"snapshotted").unwrap(), Some(damaged_value.clone()));
    assert_eq!(cluster.replica(lagging).get(b"more0050").unwrap(), Some(value("more50", 64)));
    assert_eq!(cluster.read_on(leader, "snapshotted").unwrap(), Some(damaged_value));
    cluster.shutdown();
}

#[test]
fn the_scrub_finds_a_damaged_value_nobody_read_and_it_is_repaired() {
    for mode in [StorageMode::OneLog, StorageMode::Separated] {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = Cluster::start(dir.path(), 3, mode, 8 << 20);
        let unread = write_below_the_recovery_point(&mut cluster, "unread", 5000);
        let leader = cluster.leader();
        let follower = (1..=3).find(|id| *id != leader).unwrap();
        let before = status(&cluster, follower).scrub;
        assert!(before.enabled);
        // In separated mode the value log's copy is the one reads verify; damage that one.
        let log = if mode == StorageMode::Separated { "values" } else { "log" };
        damage(&cluster.dir(follower).join(log), &unread);
        // Nobody reads it: the follower's scrub finds it, and a healthy copy repairs it.
        wait_for("the scrub finds the damage", || {
            let status = status(&cluster, follower);
            status.scrub.last_pass_corrupt >= 1 && status.scrub.passes > before.passes
        });
        wait_for("the repair", || status(&cluster, follower).repaired_values == 1);
        let status = status(&cluster, follower);
        assert_eq!(status.corrupt_values, 1, "{mode:?}: {status:?}");
        assert!(status.scrub.last_pass_values >= 101, "{mode:?}: {status:?}");
        assert!(status.scrub.last_pass_finished_unix_ms > 1_600_000_000_000, "{mode:?}: {status:?}");
        assert!(status.failure.is_none());
        assert_eq!(cluster.replica(follower).get(b"unread").unwrap(), Some(unread), "{mode:?}");
        // The next full pass finds nothing.
        let passes = status.scrub.passes;
        wait_for("a clean pass", || {
            let scrub = self::status(&cluster, follower).scrub;
            scrub.passes > passes && scrub.last_pass_corrupt == 0
        });
        cluster.shutdown();
    }
}

#[test]
fn the_scrub_keeps_to_its_rate_and_can_be_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    // 8 values of 200 KiB: 1.6 MiB, at 512 KiB/s a pass takes more than three seconds (unpaced,
    // two passes would take one: the pause between pass starts).
    let mut cluster = Cluster::start(dir.path(), 1, StorageMode::OneLog, 512 << 10);
    for i in 0..8 {
        cluster.put(&format!("big{i}"), &value(&format!("big{i}"), 200 << 10));
    }
    let start = status(&cluster, 1).scrub;
    let started = Instant::now();
    wait_for("two passes after the writes", || status(&cluster, 1).scrub.passes >= start.passes + 2);
    // The second pass read everything at the bounded rate.
    assert!(started.elapsed() >= Duration::from_secs(3), "{:?}", started.elapsed());
    cluster.shutdown();

    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 1, StorageMode::OneLog, 0);
    cluster.leader();
    std::thread::sleep(Duration::from_millis(1500));
    let off = status(&cluster, 1).scrub;
    assert!(!off.enabled && off.passes == 0 && off.values_checked == 0, "{off:?}");
    cluster.shutdown();
}
