//! Recovery directed by consensus (XLL §3.4.3): rebuild Raft's state from the log and replay into
//! the index only what its flush flag says is missing.
//!
//! 1. Scan the Raft log from the recovery point stored with the tree's flush flag (the record of the
//!    first entry Raft still served at that flush; the whole log if there is none): ENTRY records
//!    rebuild the index → locator map (a later
//!    record at an index replaces that index and everything after it, as a new leader's append
//!    did), HARD_STATE records give the latest term, vote and commit, and a complete snapshot
//!    (chunks then metadata) resets the Raft log to its index.
//! 2. If the newest snapshot is above the tree's flush flag, install it into the tree again from
//!    its chunk records.
//! 3. Replay committed entries from the flush flag + 1 up to the persisted commit index, never
//!    further: an entry above it may not be committed.
//!
//! The log itself already cut a torn tail and refuses to open on corruption, so every record seen
//! here was durable.

use crate::apply::Applier;
use crate::node::SHARD;
use crate::raft_store::RaftStore;
use crate::records::{self, HardStateRecord};
use crate::state::storage;
use crate::{ReplicaError, StorageMode};
use onekv_log::{Locator, Log};

/// Entries replayed per batch.
const REPLAY_BATCH: usize = 256;

/// What recovery found, for the loop's start and for logs.
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    pub hard_state: HardStateRecord,
    /// Records scanned.
    pub records: u64,
    /// The tree's flush flag at open.
    pub flush_flag: u64,
    /// Entries replayed into the index.
    pub replayed: u64,
    /// Log position the scan started at.
    pub scan_from: u64,
    /// Highest index whose ENTRY record was seen (classic mode re-inserts entries above the entry
    /// tree's flag).
    pub entries_seen: u64,
}

pub(crate) fn recover(
    log: &Log,
    store: &mut RaftStore,
    applier: &mut Applier,
    entry_tree_seqno: &mut u64,
) -> Result<Recovered, ReplicaError> {
    let mut recovered = Recovered::default();
    let mut chunks: Vec<(u64, Locator)> = Vec::new();
    let mut snapshot: Option<(u64, Vec<Locator>)> = None;
    let mut scan_from = log.first_position();
    let note = applier.state.tree.flush_note().unwrap_or_default();
    if !note.is_empty() {
        let point = records::decode_recovery_point(&note, SHARD)
            .map_err(|e| storage(format!("the index's recovery point: {e}")))?;
        store.snapshot_index = point.snapshot_index;
        store.snapshot_term = point.snapshot_term;
        store.conf_state.voters = point.voters;
        recovered.hard_state = point.hard_state;
        scan_from = point.scan_from;
        if scan_from < log.first_position() {
            return Err(storage(format!(
                "the index's recovery point is at log position {scan_from}, before the log's first position {}",
                log.first_position()
            )));
        }
    }
    recovered.scan_from = scan_from;
    for record in log.iter_from(scan_from) {
        let record = record.map_err(|e| storage(format!("scanning the log: {e}")))?;
        recovered.records += 1;
        let bad = |e: crate::codec::CodecError| {
            storage(format!("record at log position {} does not decode: {e}", record.position))
        };
        match record.kind {
            records::ENTRY => {
                let entry = records::decode_entry(&record.payload).map_err(bad)?;
                if entry.shard != SHARD {
                    continue;
                }
                if entry.index > store.last() + 1 {
                    return Err(storage(format!(
                        "entry {} at log position {} follows entry {}: the log has a hole",
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
                if hs.shard == SHARD && (hs.term, hs.commit) >= (current.term, current.commit) {
                    recovered.hard_state = hs;
                }
            }
            records::SNAP_CHUNK => {
                let (shard, index, number) = records::decode_snapshot_chunk(&record.payload).map_err(bad)?;
                if shard != SHARD {
                    continue;
                }
                if number == 0 {
                    chunks.clear();
                }
                chunks.push((index, record.locator));
            }
            records::SNAP_META => {
                let meta = records::decode_snapshot_meta(&record.payload).map_err(bad)?;
                if meta.shard != SHARD {
                    continue;
                }
                let mine: Vec<Locator> =
                    chunks.iter().filter(|(index, _)| *index == meta.index).map(|(_, l)| *l).collect();
                if mine.len() != meta.chunks as usize {
                    return Err(storage(format!(
                        "snapshot at index {} names {} chunks but {} precede it",
                        meta.index,
                        meta.chunks,
                        mine.len()
                    )));
                }
                chunks.clear();
                store.apply_snapshot(meta.index, meta.term, meta.voters.clone());
                snapshot = Some((meta.index, mine));
            }
            _ => {
                return Err(storage(format!(
                    "unknown record kind {} at log position {}",
                    record.kind.get(),
                    record.position
                )));
            }
        }
    }

    // The snapshot raised the commit index in the store; the hard state record may be older.
    let hs = &mut recovered.hard_state;
    hs.shard = SHARD;
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
            "the index is flushed up to entry {applied} but the log commits only up to {commit}"
        )));
    }
    if let Some((index, locators)) = snapshot
        && index > applied
    {
        tracing::info!(index, "re-installing the snapshot into the index");
        applier.install_snapshot(index, &locators)?;
        applied = index;
    }
    if applied + 1 < store.first() {
        return Err(storage(format!(
            "the index is flushed up to entry {applied} but the log starts at entry {}",
            store.first()
        )));
    }
    if commit > store.last() {
        return Err(storage(format!(
            "the log commits entry {commit} but holds entries up to {}",
            store.last()
        )));
    }

    // Classic mode keeps entries in a tree too: put back those its flush did not cover.
    if applier.state.mode == StorageMode::Classic {
        let entry_tree = applier.state.entry_tree.clone().expect("classic mode has an entry tree");
        *entry_tree_seqno = entry_tree.visible_seqno().max(*entry_tree_seqno);
        let from = entry_tree.flush_flag().unwrap_or(0) + 1;
        for index in from.max(store.first())..=store.last() {
            let meta = store.meta(index).expect("within first..=last");
            let (_, payload) =
                log.read_record(meta.locator).map_err(|e| storage(format!("reading entry {index}: {e}")))?;
            *entry_tree_seqno += 1;
            entry_tree.insert(&index.to_be_bytes(), &payload, *entry_tree_seqno);
        }
        entry_tree.publish(*entry_tree_seqno);
    }

    let mut next = applied + 1;
    while next <= commit {
        let end = (next + REPLAY_BATCH as u64 - 1).min(commit);
        let mut entries = Vec::with_capacity((end - next + 1) as usize);
        let mut locators = Vec::with_capacity(entries.capacity());
        for index in next..=end {
            let entry =
                store.read_entry(index).map_err(|e| storage(format!("replaying entry {index}: {e}")))?;
            locators.push(store.meta(index).expect("read above").locator);
            entries.push(entry);
        }
        let results = applier.apply(&entries, &locators)?;
        recovered.replayed += results.len() as u64;
        next = end + 1;
    }
    store.applied_index = commit.max(applied);
    store.applied_term = raft::Storage::term(store, store.applied_index)
        .map_err(|e| storage(format!("term of applied: {e}")))?;
    Ok(recovered)
}
