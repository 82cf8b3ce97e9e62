//! The log collector's census against writes not yet indexed. A census keeps the keys pointing
//! into the oldest sealed segments and collects those segments from them alone, so a key that
//! gains a locator into a sealed segment after the walk passed it would be left behind, and read
//! "locator outside the log's durable range" once the segment is deleted. In separated mode a
//! batch's values are appended to the value log, possibly sealing a segment, and indexed only
//! afterwards in the same loop turn; the census must wait for that turn. The failpoint
//! `value-log-sealed` holds such an apply, with the collector running every few milliseconds, so
//! a census starts in the window each time a segment seals. Every key must keep reading its
//! latest value throughout.

mod common;

use onekv_replica::{
    Command, GcConfig, Node, ReplicaConfig, ReplicaError, RequestId, ShardConfig, StorageMode, WriteOp,
    failpoints,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

/// Keys overwritten round after round: little live data, so each sealed segment is nearly all
/// garbage and the collector wants it, the newest sealed one included.
const KEYS: usize = 16;
const VALUE_BYTES: usize = 64 << 10;
/// Rounds of overwrites: about ten value-log segments of the smallest size.
const ROUNDS: usize = 160;

fn value(k: usize, round: usize) -> Vec<u8> {
    let mut value = vec![(k + round) as u8; VALUE_BYTES];
    value[..16].copy_from_slice(format!("{k:06}-{round:09}").as_bytes());
    value
}

fn key(k: usize) -> Vec<u8> {
    format!("key-{k:04}").into_bytes()
}

/// A key written once, first in its batch: when the batch's append seals a segment, its value is
/// in that segment (a hot key's would be overwritten before anyone noticed it gone).
fn once_key(seq: u64) -> Vec<u8> {
    format!("once-{seq:06}").into_bytes()
}

fn once_value(seq: u64) -> Vec<u8> {
    format!("written once by write {seq}").repeat(64).into_bytes()
}

/// Proposes a write; its answer comes on the receiver.
fn propose(
    node: &Node,
    seq: u64,
    ops: Vec<WriteOp>,
) -> mpsc::Receiver<Result<onekv_replica::Outcome, ReplicaError>> {
    let (tx, rx) = mpsc::channel();
    node.replica(1).unwrap().propose(
        RequestId { client: 1, seq },
        Command::Write(ops),
        Box::new(move |r| drop(tx.send(r))),
    );
    rx
}

fn check(node: &Node, round: usize, seq: u64, when: &str) {
    let replica = node.replica(1).unwrap();
    for k in 0..KEYS {
        let got = replica.get(&key(k));
        assert!(
            matches!(&got, Ok(Some(v)) if *v == value(k, round)),
            "{when}: key {k} does not read its value of round {round}: {:?}",
            got.map(|v| v.map(|v| v.len()))
        );
    }
    for written in 1..=seq {
        let got = replica.get(&once_key(written));
        assert!(
            matches!(&got, Ok(Some(v)) if *v == once_value(written)),
            "{when}: the key written once by write {written} lost its value: {:?}",
            got.map(|v| v.map(|v| v.len()))
        );
    }
}

#[test]
fn a_value_log_segment_sealed_before_its_values_are_indexed_keeps_them() {
    let sealed = Arc::new(AtomicUsize::new(0));
    let hits = sealed.clone();
    failpoints::arm_callback("value-log-sealed", move || {
        hits.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(200));
    })
    .unwrap();
    overwrite_and_check();
    assert!(sealed.load(Ordering::Relaxed) >= 3, "applies that sealed a segment were held");
}

/// A separated node's value log filled with overwrites, every key checked after each round.
fn overwrite_and_check() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ReplicaConfig::new(1, vec![1], dir.path());
    config.storage = StorageMode::Separated;
    config.shards = vec![ShardConfig { id: 1, voters: vec![1], primary: None }];
    config.tick = Duration::from_millis(10);
    config.segment_bytes = ReplicaConfig::SEGMENT_BYTES_RANGE.0;
    config.memtable_bytes = 256 << 10;
    config.raft_log_keep_entries = 20;
    config.gc = GcConfig { interval: Duration::from_millis(5), bytes_per_sec: 0, ..GcConfig::default() };
    let node = common::open_leading(config);
    let mut seq = 0;
    for round in 1..=ROUNDS {
        // Half the hot keys per write, so a segment fills in the middle of a batch; both halves
        // proposed at once, so one append of the Raft log may hold both entries and seal a
        // segment between them.
        let mut answers = Vec::new();
        for half in [0..KEYS / 2, KEYS / 2..KEYS] {
            seq += 1;
            let once =
                WriteOp { key: once_key(seq), value: Some(once_value(seq)), expiry: Default::default() };
            let hot = half.map(|k| WriteOp {
                key: key(k),
                value: Some(value(k, round)),
                expiry: Default::default(),
            });
            answers.push(propose(&node, seq, std::iter::once(once).chain(hot).collect()));
        }
        for answer in answers {
            answer.recv_timeout(Duration::from_secs(30)).expect("an answer").expect("the write succeeds");
        }
        check(&node, round, seq, &format!("round {round}"));
    }
    let reclaimed = node.statuses()[0].gc.segments_reclaimed;
    assert!(reclaimed >= 5, "the collector ran: {:?}", node.statuses()[0].gc);
    // The last collection may end after the last check.
    std::thread::sleep(Duration::from_millis(1000));
    check(&node, ROUNDS, seq, "at the end");
    node.shutdown();
}
