//! Recovery directed by consensus (XLL §3.4.3), per shard (PASV §5.4): rebuild each group's Raft
//! state from the node's one log and replay into each shard's tree only what its own flush flag
//! says is missing.
//!
//! 1. Each shard's recovery point is stored with its tree's flush flag (the record of the first
//!    entry Raft still served at that flush; the whole log if there is none). The log is scanned
//!    **once**, from the lowest of them (the node's global persistence point), and each record goes
//!    to the shard it names, counted only at or above that shard's own point: ENTRY records rebuild
//!    the index → locator map (a later record at an index replaces that index and everything after
//!    it, as a new leader's append did), HARD_STATE records give the latest term, vote and commit,
//!    and a complete snapshot (chunks then metadata) resets the Raft log to its index.
//! 2. Then every shard, on its own and in parallel with the others (at most
//!    [`MAX_REPLAY_THREADS`]): if its newest snapshot is above its tree's flush flag, install it
//!    into the tree again from its chunk records; replay committed entries from its flush flag + 1
//!    up to its persisted commit index, never further (an entry above it may not be committed). A
//!    shard whose tree was flushed up to its commit index replays nothing.
//!
//! Sequence numbers in the trees are derived from Raft indexes (`state::seqno`), so a replay
//! writes exactly what the first application wrote.
//!
//! The log itself already cut a torn tail and refuses to open on corruption, so every record seen
//! here was durable.

use crate::apply::Applier;
use crate::raft_store::RaftStore;
use crate::records::{self, HardStateRecord};
use crate::state::storage;
use crate::{ReplicaError, StorageMode};
use onekv_log::{Locator, Log};
use raft::eraftpb::ConfState;
use std::collections::BTreeMap;

/// Entries replayed per batch.
const REPLAY_BATCH: usize = 256;

/// Shards replayed at once at most.
pub(crate) const MAX_REPLAY_THREADS: usize = 8;

/// What recovery found for one shard, for the loop's start and for logs.
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    pub hard_state: HardStateRecord,
    /// Records of this shard scanned (at or above its recovery point).
    pub records: u64,
    /// The tree's flush flag at open.
    pub flush_flag: u64,
    /// Entries replayed into the index.
    pub replayed: u64,
    /// Log position this shard's recovery point names: its records count from here.
    pub scan_from: u64,
    /// Where its SNAP_CHUNK records count from (at most `scan_from`).
    pub chunks_from: u64,
    /// Highest index whose ENTRY record was seen (classic mode re-inserts entries above the entry
    /// tree's flag).
    pub entries_seen: u64,
}

/// One shard being recovered: its Raft storage and applier (moved into its group afterwards).
pub(crate) struct Recovering {
    pub shard: u64,
    pub store: RaftStore,
    pub applier: Applier,
    pub entry_tree_seqno: u64,
    pub recovered: Recovered,
    /// Snapshot chunks seen since the last complete snapshot, by (snapshot index, chunk number).
    chunks: BTreeMap<(u64, u32), Locator>,
    /// The newest complete snapshot: its index and chunk locators.
    snapshot: Option<(records::SnapshotMeta, Vec<Locator>)>,
    /// The fast writes pending at the last flush (`records::FastPoint`): where the log ended then,
    /// and their ids. `None`: every DURABILITY record scanned is taken as pending.
    fast_point: Option<(u64, std::collections::HashSet<crate::RequestId>)>,
    /// The recovery point's fast writes as stored, for a re-install's new note.
    fast_note: Option<records::FastPoint>,
}

impl Recovering {
    pub fn new(shard: u64, store: RaftStore, applier: Applier) -> Self {
        Recovering {
            shard,
            store,
            applier,
            entry_tree_seqno: 0,
            recovered: Recovered::default(),
            chunks: BTreeMap::new(),
            snapshot: None,
            fast_point: None,
            fast_note: None,
        }
    }
}

/// What the one scan of the log did, for logs and benchmarks.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ScanReport {
    /// Where the scan started: the lowest recovery point of all shards.
    pub scan_from: u64,
    /// Records read.
    pub records: u64,
}

/// Recovers a replica added while the node runs ([`crate::Node::add_replica`]): its trees are new
/// and its creation is recorded ([`Recovering::record_creation`]), so no record in the log is its
/// own and nothing is scanned.
pub(crate) fn recover_new(log: &Log, shard: &mut Recovering) -> Result<(), ReplicaError> {
    shard.recovery_point(log)?;
    shard.replay(log)
}

/// Recovers every shard in `shards` from `log`: one scan, then each shard's replay, in parallel.
pub(crate) fn recover(log: &Log, shards: &mut [Recovering]) -> Result<ScanReport, ReplicaError> {
    let mut scan_from = log.end_position();
    for shard in shards.iter_mut() {
        shard.recovery_point(log)?;
        scan_from = scan_from.min(shard.recovered.chunks_from).min(shard.fast_from());
    }
    let by_shard: BTreeMap<u64, usize> = shards.iter().enumerate().map(|(i, s)| (s.shard, i)).collect();
    let mut report = ScanReport { scan_from, records: 0 };
    for record in log.iter_from(scan_from) {
        let record = record.map_err(|e| storage(format!("scanning the log: {e}")))?;
        report.records += 1;
        let shard = records::record_shard(record.kind, &record.payload).map_err(|e| {
            storage(format!("record at log position {} does not decode: {e}", record.position))
        })?;
        // A record of a shard this node does not hold (any more) is skipped.
        let Some(&i) = by_shard.get(&shard) else { continue };
        let recovering = &mut shards[i];
        // Below its recovery point a shard takes only the chunks of a snapshot it was fetching:
        // older entries and snapshot metadata are already in its index, or overwritten.
        let from = match record.kind {
            records::SNAP_CHUNK => recovering.recovered.chunks_from,
            records::DURABILITY => recovering.fast_from(),
            _ => recovering.recovered.scan_from,
        };
        if record.position < from {
            continue;
        }
        recovering.take(&record)?;
    }
    in_parallel(shards, |shard| shard.replay(log))?;
    Ok(report)
}

impl Recovering {
    /// Where this shard's DURABILITY records count from: the oldest one pending at the last flush
    /// (`records::FastPoint::from`), else where its entries do.
    fn fast_from(&self) -> u64 {
        self.fast_note.as_ref().map_or(self.recovered.scan_from, |fast| fast.from)
    }

    /// Makes the members of a replica with no Raft state at all durable before it takes part in
    /// Raft: its tree is flushed with a recovery point at the log's end holding `members` (the
    /// founders it was configured with, or none for a replica waiting to be added). Later opens
    /// take the members from there and from what is replicated, never again from the
    /// configuration; and a replica that has no flush yet does not hold the log GC back.
    pub fn record_creation(&mut self, members: ConfState, log: &Log) -> Result<(), ReplicaError> {
        let tree = &self.applier.state.tree;
        if tree.flush_note().is_some_and(|note| !note.is_empty()) {
            return Ok(());
        }
        let note = records::encode_recovery_point(&records::RecoveryPoint {
            scan_from: log.end_position(),
            chunks_from: log.end_position(),
            snapshot_index: 0,
            snapshot_term: 0,
            hard_state: self.recovered.hard_state,
            members,
            fast: Some(records::FastPoint {
                from: log.end_position(),
                sealed_at: log.end_position(),
                pending: Vec::new(),
            }),
        });
        tree.flush_with_note(0, crate::state::flag_seqno(0, tree.last_written_seqno()), &note)
            .map_err(|e| storage(format!("shard {}: flushing the index: {e}", self.shard)))
    }

    /// Reads the recovery point stored with the tree's flush flag.
    fn recovery_point(&mut self, log: &Log) -> Result<(), ReplicaError> {
        let store = &mut self.store;
        let recovered = &mut self.recovered;
        recovered.scan_from = log.first_position();
        recovered.chunks_from = log.first_position();
        let note = self.applier.state.tree.flush_note().unwrap_or_default();
        if note.is_empty() {
            return Ok(());
        }
        let point = records::decode_recovery_point(&note, self.shard)
            .map_err(|e| storage(format!("shard {}: the index's recovery point: {e}", self.shard)))?;
        store.snapshot_index = point.snapshot_index;
        store.snapshot_term = point.snapshot_term;
        store.conf_state = point.members.clone();
        recovered.hard_state = point.hard_state;
        recovered.scan_from = point.scan_from;
        recovered.chunks_from = point.chunks_from;
        self.fast_point =
            point.fast.as_ref().map(|fast| (fast.sealed_at, fast.pending.iter().copied().collect()));
        self.fast_note = point.fast.clone();
        if point.lowest() < log.first_position() {
            return Err(storage(format!(
                "shard {}: the index's recovery point is at log position {}, before the log's first position {}",
                self.shard,
                point.lowest(),
                log.first_position()
            )));
        }
        Ok(())
    }

    /// Takes one record of this shard from the scan.
    fn take(&mut self, record: &onekv_log::LogEntry) -> Result<(), ReplicaError> {
        let store = &mut self.store;
        let recovered = &mut self.recovered;
        recovered.records += 1;
        let bad = |e: crate::codec::CodecError| {
            storage(format!("record at log position {} does not decode: {e}", record.position))
        };
        match record.kind {
            records::ENTRY => {
                let entry = records::decode_entry(&record.payload).map_err(bad)?;
                if entry.index > store.last() + 1 {
                    return Err(storage(format!(
                        "shard {}: entry {} at log position {} follows entry {}: the log has a hole",
                        self.shard,
                        entry.index,
                        record.position,
                        store.last()
                    )));
                }
                store.append(entry.index, entry.term, record.locator);
                recovered.entries_seen = recovered.entries_seen.max(entry.index);
            }
            records::HARD_STATE => {
                let hs = records::decode_hard_state(&record.payload).map_err(bad)?;
                // Terms and commit indexes only grow; the recovery point's hard state may be newer
                // than a record that follows it in the log.
                let current = &recovered.hard_state;
                if (hs.term, hs.commit) >= (current.term, current.commit) {
                    recovered.hard_state = hs;
                }
            }
            records::SNAP_CHUNK => {
                let (_, index, number) = records::decode_snapshot_chunk(&record.payload).map_err(bad)?;
                // A snapshot's chunks start at 0: earlier chunks of the same index belong to a
                // fetch that was cut off and started over. A chunk stored again under the same
                // number (a resumed fetch after a failed append) replaces the first. Chunks of
                // other snapshots may be interleaved (a fetch of the next one began before this
                // one was installed).
                if number == 0 {
                    self.chunks.retain(|(at, _), _| *at != index);
                }
                self.chunks.insert((index, number), record.locator);
            }
            records::SNAP_META => {
                let meta = records::decode_snapshot_meta(&record.payload).map_err(bad)?;
                let mine: Vec<Locator> =
                    self.chunks.range((meta.index, 0)..=(meta.index, u32::MAX)).map(|(_, l)| *l).collect();
                let numbered =
                    self.chunks.range((meta.index, 0)..=(meta.index, u32::MAX)).map(|((_, n), _)| *n);
                if mine.len() != meta.chunks as usize || !numbered.eq(0..meta.chunks) {
                    return Err(storage(format!(
                        "shard {}: snapshot at index {} names {} chunks but {} precede it",
                        self.shard,
                        meta.index,
                        meta.chunks,
                        mine.len()
                    )));
                }
                // Older snapshots' chunks are never installed after this one.
                self.chunks.retain(|(at, _), _| *at > meta.index);
                store.apply_snapshot(meta.index, meta.term, meta.members.clone());
                self.snapshot = Some((meta, mine));
            }
            // Values the log GC moved: the index points at them once a flush made that durable;
            // recovery has nothing to rebuild from them.
            records::RELOCATED | records::PACKED => {}
            // A fast write made durable here: pending again, unless the last flush says it was
            // applied before it (written before the flush and not named pending by it). Those the
            // replay applies, or the window holds, leave the set after the replay.
            records::DURABILITY => {
                let (_, term, command) = records::decode_durability(&record.payload).map_err(bad)?;
                let decoded = crate::codec::decode(command).map_err(bad)?;
                let crate::codec::DecodedCommand::Write(ops) = &decoded.command else {
                    return Err(storage(format!(
                        "the fast write at log position {} is not a write",
                        record.position
                    )));
                };
                let id = decoded.request_id;
                let pending = match &self.fast_point {
                    Some((sealed_at, ids)) => record.position >= *sealed_at || ids.contains(&id),
                    None => true,
                };
                if pending {
                    let header = records::DURABILITY_HEADER as u64;
                    let at =
                        record.locator.slice(header, record.locator.len - header).expect("after the header");
                    let keys = ops.iter().map(|op| op.key.to_vec()).collect();
                    // The command is read back only for the records still pending after the
                    // replay: most of those written since the flush were ordered since.
                    let fast = crate::fast::FastRecord {
                        id,
                        term,
                        digest: crc32c::crc32c(command),
                        command: Vec::new().into(),
                        at,
                        keys,
                    };
                    self.applier.fast.insert_unbounded(fast);
                }
            }
            kind => {
                return Err(storage(format!(
                    "unknown record kind {} at log position {}",
                    kind.get(),
                    record.position
                )));
            }
        }
        Ok(())
    }

    /// After the scan: re-installs a snapshot the tree lacks and replays committed entries above
    /// the tree's flush flag.
    fn replay(&mut self, log: &Log) -> Result<(), ReplicaError> {
        let shard = self.shard;
        let store = &mut self.store;
        let applier = &mut self.applier;
        let recovered = &mut self.recovered;
        // The snapshot raised the commit index in the store; the hard state record may be older.
        let hs = &mut recovered.hard_state;
        hs.shard = shard;
        hs.commit = hs.commit.max(store.hard_state.commit);
        hs.term = hs.term.max(store.hard_state.term);
        store.hard_state.term = hs.term;
        store.hard_state.vote = hs.vote;
        store.hard_state.commit = hs.commit;
        let commit = hs.commit;

        let tree = applier.state.tree.clone();
        let mut applied = tree.flush_flag().unwrap_or(0);
        recovered.flush_flag = applied;
        if applied > commit {
            return Err(storage(format!(
                "shard {shard}: the index is flushed up to entry {applied} but the log commits only up to {commit}"
            )));
        }
        if let Some((meta, locators)) = self.snapshot.take()
            && meta.index > applied
        {
            tracing::info!(shard, index = meta.index, "re-installing the snapshot into the index");
            // This recovery's own start stays valid for the next one: the snapshot's records are
            // above it.
            let note = records::encode_recovery_point(&records::RecoveryPoint {
                scan_from: recovered.scan_from,
                chunks_from: recovered.chunks_from,
                snapshot_index: meta.index,
                snapshot_term: meta.term,
                hard_state: records::snapshot_hard_state(*hs, &meta),
                members: meta.members.clone(),
                fast: self.fast_note.clone(),
            });
            applier.install_snapshot(meta.index, &locators, &note)?;
            applied = meta.index;
        }
        if applied + 1 < store.first() {
            return Err(storage(format!(
                "shard {shard}: the index is flushed up to entry {applied} but the log starts at entry {}",
                store.first()
            )));
        }
        if commit > store.last() {
            return Err(storage(format!(
                "shard {shard}: the log commits entry {commit} but holds entries up to {}",
                store.last()
            )));
        }

        // Classic mode keeps entries in a tree too: put back those its flush did not cover.
        if applier.state.mode == StorageMode::Classic {
            let entry_tree = applier.state.entry_tree.clone().expect("classic mode has an entry tree");
            self.entry_tree_seqno = entry_tree.visible_seqno().max(self.entry_tree_seqno);
            let from = entry_tree.flush_flag().unwrap_or(0) + 1;
            for index in from.max(store.first())..=store.last() {
                let meta = store.meta(index).expect("within first..=last");
                let (_, payload) = log
                    .read_record(meta.locator)
                    .map_err(|e| storage(format!("reading entry {index}: {e}")))?;
                self.entry_tree_seqno += 1;
                entry_tree.insert(&index.to_be_bytes(), &payload, self.entry_tree_seqno);
            }
            entry_tree.publish(self.entry_tree_seqno);
        }

        let mut next = applied + 1;
        while next <= commit {
            let end = (next + REPLAY_BATCH as u64 - 1).min(commit);
            let mut entries = Vec::with_capacity((end - next + 1) as usize);
            let mut locators = Vec::with_capacity(entries.capacity());
            for index in next..=end {
                let entry = store
                    .read_entry(index)
                    .map_err(|e| storage(format!("shard {shard}: replaying entry {index}: {e}")))?;
                locators.push(store.meta(index).expect("read above").locator);
                entries.push(entry);
            }
            let results = applier.apply(&entries, &locators)?;
            // The members the flush recorded are those at its flag; conf changes above it are
            // replayed like the running replica applied them.
            for entry in &entries[..results.len()] {
                if let Some(cc) = crate::membership::decoded_conf_change(entry)? {
                    match crate::membership::next_members(&store.conf_state, &cc) {
                        Ok(members) => store.conf_state = members,
                        Err(err) => {
                            tracing::warn!(shard, index = entry.index, %err, "a committed membership change was refused")
                        }
                    }
                }
            }
            recovered.replayed += results.len() as u64;
            next = end + 1;
            // An ORDER naming a fast write this replica lost (its disk was wiped, or it joined
            // since): it opens stalled there and asks for a snapshot (`fast::group`).
            if let Some(at) = applier.stalled_at {
                applied = at - 1;
                tracing::warn!(shard, index = at, "recovery stops at an ORDER this replica cannot apply");
                break;
            }
            applied = end;
        }
        store.applied_index = if applier.stalled_at.is_some() { applied } else { commit.max(applied) };
        store.applied_term = raft::Storage::term(store, store.applied_index)
            .map_err(|e| storage(format!("term of applied: {e}")))?;
        // Fast writes applied within the window (by the Raft path, or by an ORDER the flush
        // covered) are not pending.
        applier.drop_applied_fast_writes();
        let log = applier.state.raft_log.clone();
        applier.fast.load_commands(|record| {
            log.read(record.at)
                .map_err(|e| storage(format!("shard {shard}: reading the fast write {:?}: {e}", record.id)))
        })?;
        Ok(())
    }
}

/// `work` on every item, on at most [`MAX_REPLAY_THREADS`] threads (the shards of a node are
/// independent at recovery); the results in the items' order, or the first error.
pub(crate) fn in_parallel<T: Send, R: Send>(
    items: &mut [T],
    work: impl Fn(&mut T) -> Result<R, ReplicaError> + Sync,
) -> Result<Vec<R>, ReplicaError> {
    let threads = items.len().clamp(1, MAX_REPLAY_THREADS);
    let per_thread = items.len().div_ceil(threads).max(1);
    let work = &work;
    let count = items.len();
    std::thread::scope(|scope| {
        let workers: Vec<_> = items
            .chunks_mut(per_thread)
            .map(|chunk| scope.spawn(move || chunk.iter_mut().map(work).collect::<Result<Vec<R>, _>>()))
            .collect();
        let mut results = Vec::with_capacity(count);
        for worker in workers {
            results
                .extend(worker.join().unwrap_or_else(|_| Err(storage("a recovery thread panicked".into())))?);
        }
        Ok(results)
    })
}
