//! Puts by reference (issue 18's dedup on the wire, beyond DEDUPKV): a leader proposes a put whose
//! value a key of the same shard already holds, byte for byte, as a reference to that key, so the
//! value crosses no network and is written to no replica's log again.
//!
//! **Why it is exact without trusting a hash.** A reference names a *key* (the source), not a
//! fingerprint, and means "the value the source holds when this entry applies". Every replica
//! applies the same log in the same order, so the source's value there is the same on every
//! replica, whatever each stores where: the new key's value is decided by the replicated state,
//! never by a hash. What the leader must make sure of is that this value is the client's. It
//! compares the bytes of the source's copy with the client's value as its own state holds them
//! (the state after its applied entries), and refers only to a source that **no entry between its
//! applied index and the new one writes**: it tracks the keys of every entry it proposed in its term
//! and not yet applied ([`WireRefs::note_proposed`]), refers to nothing until it applied every
//! entry of earlier terms, and refers to nothing while an entry whose keys it cannot name (a range
//! deletion's page, a fast-path ORDER) is unapplied. The applier checks the source still holds a
//! live value of the length the leader saw; if not (a bug in this bookkeeping), the command takes
//! no effect on every replica alike and its client retries (`apply`).
//!
//! **What the replicas do.** In onelog mode the key points at the source's copy (a shared locator:
//! no byte is read or written); replicas in the other modes copy the value. A copy the log GC is
//! collecting is handled by the late references of [`crate::dedup::Dedup::reference_place`].
//!
//! This module owns the leader's bookkeeping and the choice of sources. Not owned here: the entry
//! layout (`codec`), applying a reference (`apply`), the GC's side (`dedup`, `gc`).

use crate::codec::{self, DecodedCommand};
use crate::dedup::Dedup;
use crate::state::State;
use crate::{Command, WriteOp};
use onekv_index::IndexValue;
use std::collections::{BTreeMap, HashMap};

/// Bytes a leader's table of recent values (fingerprint → key) may take per shard it leads, each
/// entry charged its key's length and [`RECENT_ENTRY_OVERHEAD`].
pub const RECENT_BYTES: usize = 512 << 10;
/// Bytes charged per table entry besides its key (fingerprint, the LRU's links and hash slot).
pub const RECENT_ENTRY_OVERHEAD: usize = 64;
/// Keys remembered per value: the last ones proposed with it (one of them may have been written
/// again since; a put refers to the first that still holds the value).
pub const SOURCES_PER_VALUE: usize = 2;
/// A key longer than this is never remembered as a source.
pub const MAX_SOURCE_KEY_BYTES: usize = 1024;

/// What a remembered source key is for a value now.
enum Source {
    /// It holds the value, and will when an entry proposed now applies.
    Holds,
    /// It may hold it once the entries in flight apply (one of them writes it; or this write
    /// does): kept.
    Pending,
    /// It holds something else (or nothing): forgotten.
    Gone,
}

/// A leader's bookkeeping for puts by reference, per shard.
pub(crate) struct WireRefs {
    /// The term it belongs to: a new term starts it afresh.
    term: u64,
    /// No reference until the entry at this index is applied: the last entry of the log when the
    /// term began here (every entry of earlier terms), and the last unapplied entry whose written
    /// keys are not known.
    barrier: u64,
    /// Fingerprint of a value → the keys last proposed with it, the latest first (hints: checked
    /// before each use), bounded by [`RECENT_BYTES`].
    recent: lru::LruCache<u128, Vec<Vec<u8>>>,
    recent_bytes: usize,
    /// Keys written by entries proposed in this term and not applied yet → the highest such index.
    unapplied: HashMap<Vec<u8>, u64>,
    /// The same, by index, to forget them as entries apply.
    by_index: BTreeMap<u64, Vec<Vec<u8>>>,
    /// The broken variant [`crate::Mutation::ReferencesIgnoreUnapplied`] (a simulation only).
    pub ignores_unapplied: bool,
}

impl Default for WireRefs {
    fn default() -> Self {
        WireRefs {
            term: 0,
            barrier: u64::MAX,
            recent: lru::LruCache::unbounded(),
            recent_bytes: 0,
            unapplied: HashMap::new(),
            by_index: BTreeMap::new(),
            ignores_unapplied: false,
        }
    }
}

impl WireRefs {
    /// Starts afresh when `term` is not the one the bookkeeping belongs to: nothing is referred to
    /// until `last_index` (the log's last entry now) is applied.
    pub fn enter_term(&mut self, term: u64, last_index: u64) {
        if term != self.term {
            self.term = term;
            self.barrier = last_index;
            self.unapplied.clear();
            self.by_index.clear();
        }
    }

    /// Forgets everything (the node stopped leading the shard): a later term starts afresh.
    pub fn stop_leading(&mut self) {
        *self = WireRefs { ignores_unapplied: self.ignores_unapplied, ..WireRefs::default() };
    }

    /// Notes the entry this leader just appended at `index` (`data`: its command), in its
    /// current term.
    pub fn note_proposed(&mut self, term: u64, index: u64, data: &[u8]) {
        if term != self.term {
            // Not started in this term: the first proposal that may refer starts it, with a
            // barrier above this entry.
            return;
        }
        let Ok(decoded) = codec::decode(data) else {
            self.barrier = self.barrier.max(index);
            return;
        };
        let keys: Vec<&[u8]> = match &decoded.command {
            DecodedCommand::Write(ops) => ops.iter().map(|op| op.key).collect(),
            DecodedCommand::Txn { ops, .. } => ops.iter().map(|op| op.key).collect(),
            DecodedCommand::Cas { key, .. } => vec![key],
            DecodedCommand::DeleteExpired { keys } => keys.clone(),
            // Changes no value (a repair writes the same value again).
            DecodedCommand::RepairRequest { .. } | DecodedCommand::Repair { .. } => Vec::new(),
            // Keys not named here.
            DecodedCommand::DeleteRange { .. } | DecodedCommand::Order { .. } => {
                self.barrier = self.barrier.max(index);
                return;
            }
        };
        for key in &keys {
            self.unapplied.insert(key.to_vec(), index);
        }
        if !keys.is_empty() {
            self.by_index.entry(index).or_default().extend(keys.iter().map(|key| key.to_vec()));
        }
    }

    /// Forgets the entries up to `applied` (applied here now).
    pub fn note_applied(&mut self, applied: u64) {
        while let Some(entry) = self.by_index.first_entry() {
            if *entry.key() > applied {
                break;
            }
            for key in entry.remove() {
                if self.unapplied.get(&key).is_some_and(|&at| at <= applied) {
                    self.unapplied.remove(&key);
                }
            }
        }
    }

    /// For each op of a write the leader is about to propose at `time_ms`: the key it may refer
    /// to for the op's value, or `None` (`None` overall: no op refers). Remembers each large value's
    /// key as a source for later writes. `applied` is the leader's applied index.
    pub fn sources(
        &mut self,
        command: &Command,
        time_ms: u64,
        applied: u64,
        dedup: &Dedup,
        state: &State,
    ) -> Option<Vec<Option<Vec<u8>>>> {
        let Command::Write(ops) = command else { return None };
        let may_refer = applied >= self.barrier && dedup.proposes_references();
        let mut sources: Vec<Option<Vec<u8>>> = vec![None; ops.len()];
        let mut any = false;
        for (i, op) in ops.iter().enumerate() {
            let Some(value) = &op.value else { continue };
            if !dedup.may_refer(value.len()) {
                continue;
            }
            let fingerprint = dedup.fingerprint_of(value);
            let candidates = self.recent.get(&fingerprint).cloned().unwrap_or_default();
            let mut gone = Vec::new();
            for candidate in candidates.iter().filter(|_| may_refer) {
                match self.holds(candidate, ops, value, time_ms, state) {
                    Source::Holds => {
                        sources[i] = Some(candidate.clone());
                        any = true;
                        break;
                    }
                    // It may hold the value once the entries in flight apply: kept.
                    Source::Pending => {}
                    Source::Gone => gone.push(candidate.clone()),
                }
            }
            self.forget(fingerprint, &gone);
            // This key holds the value too once applied (by reference or not): another source
            // for later writes, which refer to the first that holds it then.
            if op.key.len() <= MAX_SOURCE_KEY_BYTES {
                self.remember(fingerprint, op.key.clone());
            }
        }
        any.then_some(sources)
    }

    /// Forgets `gone` as sources of the value of `fingerprint` (they hold other values now).
    fn forget(&mut self, fingerprint: u128, gone: &[Vec<u8>]) {
        if gone.is_empty() {
            return;
        }
        let Some(keys) = self.recent.peek_mut(&fingerprint) else { return };
        let before: usize = keys.iter().map(|key| key.len() + RECENT_ENTRY_OVERHEAD).sum();
        keys.retain(|key| !gone.contains(key));
        let after: usize = keys.iter().map(|key| key.len() + RECENT_ENTRY_OVERHEAD).sum();
        self.recent_bytes -= before - after;
        if keys.is_empty() {
            self.recent.pop(&fingerprint);
        }
    }

    /// Remembers `key` as the latest key proposed with the value of `fingerprint` (the value's
    /// last [`SOURCES_PER_VALUE`] keys are kept), forgetting the least recently used values past
    /// [`RECENT_BYTES`].
    fn remember(&mut self, fingerprint: u128, key: Vec<u8>) {
        let cost = |key: &Vec<u8>| key.len() + RECENT_ENTRY_OVERHEAD;
        let keys = self.recent.get_or_insert_mut(fingerprint, Vec::new);
        if let Some(at) = keys.iter().position(|known| *known == key) {
            let known = keys.remove(at);
            keys.insert(0, known);
            return;
        }
        self.recent_bytes += cost(&key);
        keys.insert(0, key);
        if keys.len() > SOURCES_PER_VALUE {
            let oldest = keys.pop().expect("more than one");
            self.recent_bytes -= cost(&oldest);
        }
        while self.recent_bytes > RECENT_BYTES {
            let Some((_, keys)) = self.recent.pop_lru() else { break };
            self.recent_bytes -= keys.iter().map(cost).sum::<usize>();
        }
    }

    /// Whether `source` will hold exactly `value` when an entry proposed now applies: no op of
    /// the same write and no unapplied entry writes it, and as applied here it holds a live copy
    /// of `value` in the log, compared byte for byte.
    fn holds(&self, source: &[u8], ops: &[WriteOp], value: &[u8], time_ms: u64, state: &State) -> Source {
        if (self.unapplied.contains_key(source) && !self.ignores_unapplied)
            || ops.iter().any(|op| op.key == source)
        {
            return Source::Pending;
        }
        let Ok(Some(stored)) = state.tree.get(source) else { return Source::Gone };
        if onekv_index::expired_at(&stored, time_ms) {
            return Source::Gone;
        }
        let Ok(IndexValue::Locator(at) | IndexValue::Shared(at)) = IndexValue::decode(&stored) else {
            return Source::Gone;
        };
        if at.len != (codec::STORED_VALUE_PREFIX + value.len()) as u64 {
            return Source::Gone;
        }
        let same = state
            .raft_log
            .read(at)
            .is_ok_and(|bytes| codec::verify_stored_value(&bytes).is_ok_and(|bytes| bytes == value));
        if same { Source::Holds } else { Source::Gone }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(key: &[u8]) -> Vec<u8> {
        codec::encode(
            crate::RequestId { client: 1, seq: 1 },
            0,
            &Command::Write(vec![WriteOp::put(key.to_vec(), b"v".to_vec())]),
        )
    }

    #[test]
    fn keys_of_unapplied_entries_are_tracked_until_applied() {
        let mut refs = WireRefs::default();
        refs.enter_term(3, 10);
        assert_eq!(refs.barrier, 10);
        refs.note_proposed(3, 11, &write(b"a"));
        refs.note_proposed(3, 12, &write(b"b"));
        refs.note_proposed(3, 13, &write(b"a"));
        refs.note_applied(11);
        assert!(refs.unapplied.contains_key(&b"a"[..]), "written again at 13");
        assert!(refs.unapplied.contains_key(&b"b"[..]));
        refs.note_applied(13);
        assert!(refs.unapplied.is_empty());
        assert!(refs.by_index.is_empty());
    }

    #[test]
    fn the_table_of_recent_values_stays_within_its_bytes() {
        let mut refs = WireRefs::default();
        let key_bytes = 200;
        for n in 0..10_000u128 {
            refs.remember(n, vec![b'k'; key_bytes]);
            assert!(refs.recent_bytes <= RECENT_BYTES);
        }
        assert_eq!(refs.recent.len(), RECENT_BYTES / (key_bytes + RECENT_ENTRY_OVERHEAD));
        // The latest values are kept, and a key proposed again with its value costs nothing more.
        assert!(refs.recent.contains(&9_999));
        let before = refs.recent_bytes;
        refs.remember(9_999, vec![b'k'; key_bytes]);
        assert_eq!(refs.recent_bytes, before);
        // A value keeps its last few keys; a key found holding another value is forgotten.
        for k in 0..6u8 {
            refs.remember(7, vec![k; 10]);
        }
        let keys = refs.recent.peek(&7).unwrap().clone();
        let last = (6 - SOURCES_PER_VALUE as u8..6).rev().map(|k| vec![k; 10]).collect::<Vec<_>>();
        assert_eq!(keys, last);
        refs.forget(7, &[vec![5; 10]]);
        assert_eq!(refs.recent.peek(&7).unwrap(), &last[1..].to_vec());
        let total: usize =
            refs.recent.iter().flat_map(|(_, keys)| keys).map(|k| k.len() + RECENT_ENTRY_OVERHEAD).sum();
        assert_eq!(refs.recent_bytes, total, "the bytes charged are the keys held");
    }

    #[test]
    fn an_entry_whose_keys_are_unknown_raises_the_barrier_and_a_new_term_starts_afresh() {
        let mut refs = WireRefs::default();
        refs.enter_term(3, 10);
        let range = codec::encode(
            crate::RequestId { client: 1, seq: 2 },
            0,
            &Command::DeleteRange { start: b"a".to_vec(), end: None, limit: 10, spare: Vec::new() },
        );
        refs.note_proposed(3, 11, &range);
        assert_eq!(refs.barrier, 11);
        refs.note_proposed(3, 12, &write(b"a"));
        refs.enter_term(4, 20);
        assert_eq!(refs.barrier, 20);
        assert!(refs.unapplied.is_empty());
        // A proposal of another term than the bookkeeping's is not noted.
        refs.note_proposed(3, 21, &write(b"z"));
        assert!(refs.unapplied.is_empty());
    }
}
