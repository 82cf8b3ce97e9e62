//! XLL's crash points (Table 4) on a real process: a child process writes keys into a one-node
//! cluster of four shards (each writer into its own shard, so the node's appends carry several
//! groups' entries at once) and reports every acknowledgement; an armed crash point ends it
//! abruptly (before, during or after the Raft append, before apply, after apply, after the reply).
//! The parent then reopens the data directory and checks that every acknowledged key of every shard
//! reads back its value and that no writer's later key is there without its earlier ones.
//!
//! With the fast path, half the writers write by it, and the points include the one right after
//! their DURABILITY records are durable (`after-fast-durable`).
//!
//! The child is this test binary run again with `ONEKV_CRASH_CHILD` set (see [`child_writer`]).
//! Needs the `failpoints` feature (`scripts/test` turns it on).

mod common;

use onekv_replica::{
    Command, FastAck, Node, Replica, ReplicaConfig, ReplicaError, RequestId, ShardConfig, WriteOp,
};
use std::io::Write;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

const WRITERS: usize = 4;
/// Shards of the node; writer `w` writes into shard `w % SHARDS + 1`.
const SHARDS: u64 = 4;
const CHILD_ENV: &str = "ONEKV_CRASH_CHILD";

fn key(writer: usize, n: usize) -> Vec<u8> {
    format!("w{writer}-{n:06}").into_bytes()
}

/// Values of varying size, derived from the key so the parent can check them.
fn value(writer: usize, n: usize) -> Vec<u8> {
    let len = 10 + (n * 37 + writer * 11) % 3000;
    (0..len).map(|i| (i + n * 7 + writer) as u8).collect()
}

/// Set in a child to have the odd writers write by the fast path.
const FAST_ENV: &str = "ONEKV_CRASH_FAST";

/// Whether the writers write (partly) by the fast path, and the node has it on.
#[derive(Clone, Copy, PartialEq)]
enum Writes {
    Raft,
    Mixed,
}

fn config(dir: &Path, writes: Writes) -> ReplicaConfig {
    let mut config = ReplicaConfig::new(1, vec![1], dir);
    config.fast_path = writes == Writes::Mixed;
    config.shards = (1..=SHARDS).map(|id| ShardConfig { id, voters: vec![1], primary: None }).collect();
    config.tick = Duration::from_millis(10);
    // Small memtables: flushes happen during the run, so recovery starts from a flush flag.
    config.memtable_bytes = 8 << 10;
    config.raft_log_keep_entries = 50;
    config
}

fn open(dir: &Path, writes: Writes) -> Node {
    common::open_leading(config(dir, writes))
}

/// The replica writer `writer` writes into.
fn replica_of(node: &Node, writer: usize) -> Replica {
    node.replica(writer as u64 % SHARDS + 1).expect("the node holds every shard")
}

/// The child: writes keys from several threads until a crash point ends the process, printing
/// `ack WRITER N` after each acknowledged write. Does nothing when run as an ordinary test.
#[test]
#[ignore = "the child process of the crash-point tests; runs only with ONEKV_CRASH_CHILD set"]
fn child_writer() {
    let Ok(dir) = std::env::var(CHILD_ENV) else { return };
    let writes = if std::env::var_os(FAST_ENV).is_some() { Writes::Mixed } else { Writes::Raft };
    let node = open(Path::new(&dir), writes);
    let threads: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let replica = replica_of(&node, writer);
            std::thread::spawn(move || {
                for n in 0.. {
                    let command = Command::Write(vec![WriteOp {
                        key: key(writer, n),
                        value: Some(value(writer, n)),
                        expiry: Default::default(),
                    }]);
                    let id = RequestId { client: writer as u64 + 1, seq: n as u64 + 1 };
                    if writer % 2 == 1 && writes == Writes::Mixed && fast_write(&replica, id, &command) {
                        let mut out = std::io::stdout().lock();
                        writeln!(out, "ack {writer} {n}").unwrap();
                        out.flush().unwrap();
                        continue;
                    }
                    // The Raft path (for a fast write that did not complete: its fallback, with
                    // the same id, as a client's).
                    let (tx, rx) = mpsc::channel();
                    replica.propose(id, command, Box::new(move |r| drop(tx.send(r))));
                    match rx.recv_timeout(Duration::from_secs(10)) {
                        Ok(Ok(_)) => {
                            let mut out = std::io::stdout().lock();
                            writeln!(out, "ack {writer} {n}").unwrap();
                            out.flush().unwrap();
                        }
                        Ok(Err(ReplicaError::Stopping)) | Err(_) => return,
                        Ok(Err(err)) => panic!("write failed: {err}"),
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        let _ = thread.join();
    }
}

/// A fast write of `command` with `id` to the only voter: whether it completed.
fn fast_write(replica: &Replica, id: RequestId, command: &Command) -> bool {
    let Command::Write(ops) = command else { unreachable!("the writers write") };
    let (tx, rx) = mpsc::channel();
    replica.fast_write(id, ops.clone(), Box::new(move |r| drop(tx.send(r))));
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Ok(ack)) => FastAck::completes(&[(1, ack)].into_iter().collect()),
        _ => false,
    }
}

/// Runs the child with `point` armed to fire at its `skip + 1`-th hit; returns the highest
/// acknowledged n per writer (`None`: nothing acknowledged).
fn crash_run(dir: &Path, point: &str, skip: usize, writes: Writes) -> Vec<Option<usize>> {
    let mut env = vec![(CHILD_ENV, dir.display().to_string())];
    if writes == Writes::Mixed {
        env.push((FAST_ENV, "1".into()));
    }
    common::crash_child("child_writer", &env, point, skip, WRITERS, Duration::from_secs(60))
}

/// Reopens `dir` and checks it against what was acknowledged; returns how many keys survived.
fn check_recovered(dir: &Path, point: &str, acked: &[Option<usize>], writes: Writes) -> usize {
    let node = open(dir, writes);
    let mut survivors = 0;
    for (writer, acked) in acked.iter().enumerate() {
        let replica = replica_of(&node, writer);
        let mut present = 0;
        while replica.get(&key(writer, present)).unwrap().is_some() {
            assert_eq!(
                replica.get(&key(writer, present)).unwrap(),
                Some(value(writer, present)),
                "{point}: key {present} of writer {writer} has a wrong value"
            );
            present += 1;
        }
        if let Some(acked) = acked {
            assert!(
                present > *acked,
                "{point}: writer {writer} acked up to {acked} but only {present} keys survived"
            );
        }
        // No later key without the earlier ones: each writer waited for every ack before the next.
        let (after, more) =
            replica.scan(&key(writer, present), Some(format!("w{writer}.").as_bytes()), 1, false).unwrap();
        assert!(after.is_empty() && !more, "{point}: writer {writer} has a key after a gap at {present}");
        survivors += present;
    }
    // The recovered node keeps working.
    let replica = replica_of(&node, 0);
    let (tx, rx) = mpsc::channel();
    let command = Command::Write(vec![WriteOp {
        key: b"after-recovery".to_vec(),
        value: Some(b"ok".to_vec()),
        expiry: Default::default(),
    }]);
    replica.propose(RequestId::default(), command, Box::new(move |r| drop(tx.send(r))));
    rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    replica.shutdown();
    survivors
}

fn crash_point(point: &str) {
    // Electing the four shards' leaders takes about a dozen hits of most points before any write.
    crash_point_at(point, [3, 60, 200], Writes::Raft);
}

/// [`crash_point`] at the given hits of the point (index flushes are rarer than appends).
fn crash_point_at(point: &str, skips: [usize; 3], writes: Writes) {
    // Different key counts per run: the point fires at a different hit each time. The second
    // crash hits a directory that already recovered once.
    for (run, skip) in skips.into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let acked = crash_run(dir.path(), point, skip, writes);
        let survivors = check_recovered(dir.path(), point, &acked, writes);
        if run == 2 {
            let acked_again = crash_run(dir.path(), point, 40, writes);
            let merged: Vec<_> = acked.iter().zip(&acked_again).map(|(a, b)| (*a).max(*b)).collect();
            check_recovered(dir.path(), point, &merged, writes);
        }
        assert!(survivors > 0 || skip < 20, "{point}: nothing was written before the crash at hit {skip}");
    }
}

#[test]
fn crash_before_the_raft_append() {
    crash_point("before-raft-append");
}

#[test]
fn crash_during_the_raft_append() {
    crash_point("during-raft-append");
}

#[test]
fn crash_after_the_raft_append() {
    crash_point("after-raft-append");
}

#[test]
fn crash_before_apply() {
    crash_point("before-apply");
}

#[test]
fn crash_after_apply_before_the_reply() {
    crash_point("after-apply");
}

#[test]
fn crash_after_the_reply() {
    crash_point("after-reply");
}

/// The index flush: the data and the request-id window share one tree and one flag, so a crash
/// before or while the table is written loses neither an acknowledged write nor a request id
/// (before, the window was flushed first, and a crash before the data's flush made recovery skip
/// the entries in between: acknowledged writes vanished).
#[test]
fn crash_before_an_index_flush() {
    crash_point_at("before-index-flush", [0, 2, 6], Writes::Raft);
}

#[test]
fn crash_during_an_index_flush() {
    crash_point_at("during-index-flush", [0, 2, 6], Writes::Raft);
}

/// Half the writers write by the fast path (a one-voter shard: done once its own record is
/// durable; a write that did not complete falls back to the Raft path with its id): crashes once
/// the DURABILITY records are durable and before their writers hear of it, in a torn group commit
/// that carries them, and after an ORDER applied them.
#[test]
fn fast_writes_survive_a_crash_after_their_records_are_durable() {
    crash_point_at("after-fast-durable", [3, 60, 200], Writes::Mixed);
}

#[test]
fn fast_writes_survive_a_crash_during_the_group_commit() {
    crash_point_at("during-raft-append", [3, 60, 200], Writes::Mixed);
}

#[test]
fn fast_writes_survive_a_crash_after_their_order_applied() {
    crash_point_at("after-apply", [3, 60, 200], Writes::Mixed);
}
