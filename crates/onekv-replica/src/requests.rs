//! The window of recent request ids: what makes a retried write take effect once.
//!
//! The window is part of the replicated state: every replica must make the same "already applied"
//! decision for the same entry, or a retried write that committed twice would be applied by some
//! replicas and skipped by others. So it lives **in the shard's own index tree**, in the tree's
//! metadata key space: one flush and one flush flag make the data and the window durable together,
//! so after a crash both are replayed from the same entry and a replay decides exactly what the
//! first application decided. It is rebuilt from the tree at open and carried in snapshots.
//!
//! It stores an **outcome, not a value**: which entry applied the request, when, and what it did
//! ([`Effect`]). A retry of a write answers "done at that index"; a retry of a swapped
//! compare-and-swap answers "swapped", with the new value taken from the retry itself (same
//! request id, same command). A compare-and-swap that did not swap (or a transaction whose
//! conditions failed) changed nothing, but it is remembered too: its retry must never take effect,
//! since the first answer ("not swapped") may be the one the client got. The retry is answered
//! "not swapped" with the value now when that value still differs from the expected one (as a
//! new evaluation would), and with [`crate::ReplicaError::AlreadyEvaluated`] when it matches.
//!
//! Eviction is by **age**, measured on the leaders' clocks carried in the entries (made monotonic
//! at apply, so every replica evicts the same ids at the same entry): an id leaves once it is older
//! than [`RETENTION_MS`], which outlasts every client retry (the client's retry budget is seconds).
//! [`MAX_IDS`] bounds memory whatever the write rate; evictions forced by it are counted.
//!
//! Tree layout (metadata space, explicit widths): key `client:u64 BE seq:u64 BE`; value
//! `index:u64 LE time_ms:u64 LE kind:u8` (0 write, 1 swapped compare-and-swap, 2 no effect). In a snapshot the
//! window travels as pairs with the empty key (user keys are never empty), each
//! `count:u32 (client:u64 seq:u64 index:u64 time_ms:u64 kind:u8)*` with at most
//! [`IDS_PER_SNAPSHOT_PAIR`] ids, so no pair is large.

use crate::codec::{CodecError, Reader};
use crate::state::{self, storage};
use crate::{ReplicaError, RequestId};
use onekv_index::{Tree, TreeSnapshot};
use std::collections::{HashMap, VecDeque};

/// How long an applied request id is remembered, in milliseconds of the leaders' clocks.
pub(crate) const RETENTION_MS: u64 = 120_000;

/// Most request ids remembered at once, whatever their age (about 100 bytes of memory each).
pub(crate) const MAX_IDS: usize = 1_000_000;

/// Most ids in one snapshot pair.
pub(crate) const IDS_PER_SNAPSHOT_PAIR: usize = 65_536;

/// The op number of the window's writes within an entry's sequence numbers: above every data op,
/// so its writes never go below one already made for the entry.
const WINDOW_OP: usize = state::MAX_OP;

/// Bytes of one id in a snapshot pair.
const SNAPSHOT_ID_BYTES: usize = 8 + 8 + 8 + 8 + 1;

/// What an applied request did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Effect {
    /// A write (or delete, or batch).
    Write = 0,
    /// A compare-and-swap that swapped, or a transaction whose conditions held.
    Swapped = 1,
    /// A compare-and-swap that did not swap, or a transaction whose conditions failed.
    Nothing = 2,
}

impl Effect {
    fn decode(kind: u8) -> Result<Effect, CodecError> {
        match kind {
            0 => Ok(Effect::Write),
            1 => Ok(Effect::Swapped),
            2 => Ok(Effect::Nothing),
            _ => Err(CodecError("bad request kind")),
        }
    }
}

/// What the window keeps about one applied request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Remembered {
    /// The entry that applied it.
    pub index: u64,
    /// The (monotonic) leader time of that entry, in ms.
    pub time_ms: u64,
    /// What it did.
    pub effect: Effect,
}

pub(crate) struct RequestWindow {
    tree: Tree,
    remembered: HashMap<RequestId, Remembered>,
    /// Ids in the order they were applied (ascending entry index).
    order: VecDeque<RequestId>,
    /// The highest entry time applied so far: the window's clock.
    clock_ms: u64,
    /// Ids evicted before their age because of [`MAX_IDS`] (since open).
    pub forced_evictions: u64,
}

impl RequestWindow {
    /// Loads the window persisted in the shard tree's metadata space.
    pub fn load(tree: Tree) -> Result<Self, ReplicaError> {
        let mut entries = Vec::new();
        let mut start = Vec::new();
        loop {
            let (page, more) = tree.range_meta(&start, 4096).map_err(|e| storage(format!("{e}")))?;
            for (key, value) in &page {
                entries.push(decode_pair(key, value).map_err(|e| storage(format!("request window: {e}")))?);
            }
            match page.last() {
                Some((key, _)) if more => {
                    start = key.clone();
                    start.push(0);
                }
                _ => break,
            }
        }
        let mut window = RequestWindow::empty(tree);
        window.add_sorted(entries);
        Ok(window)
    }

    fn empty(tree: Tree) -> Self {
        RequestWindow {
            tree,
            remembered: HashMap::new(),
            order: VecDeque::new(),
            clock_ms: 0,
            forced_evictions: 0,
        }
    }

    fn add_sorted(&mut self, mut entries: Vec<(RequestId, Remembered)>) {
        entries.sort_by_key(|(_, r)| r.index);
        for (id, remembered) in entries {
            self.clock_ms = self.clock_ms.max(remembered.time_ms);
            if self.remembered.insert(id, remembered).is_none() {
                self.order.push_back(id);
            }
        }
    }

    /// Ids remembered now.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// What the window holds about `id`, if it was applied within the window.
    pub fn lookup(&self, id: RequestId) -> Option<Remembered> {
        if id.seq == 0 {
            return None;
        }
        self.remembered.get(&id).copied()
    }

    /// The latest leader time of the entries this window has seen (restored with it at open and
    /// with a snapshot).
    pub fn clock_ms(&self) -> u64 {
        self.clock_ms
    }

    /// Records that the entry at `index`, proposed at `time_ms` by its leader, was applied; and
    /// remembers `id` (unless it is "no id") with what it did. Then evicts ids that are too old.
    /// Writes to the tree at the entry's sequence numbers; the caller publishes the entry.
    pub fn on_entry(&mut self, index: u64, time_ms: u64, id: Option<(RequestId, Effect)>) {
        let seqno = state::seqno(index, WINDOW_OP);
        self.clock_ms = self.clock_ms.max(time_ms);
        if let Some((id, effect)) = id.filter(|(id, _)| id.seq != 0) {
            let remembered = Remembered { index, time_ms: self.clock_ms, effect };
            self.tree.insert_meta(&encode_key(id), &encode_value(remembered), seqno);
            if self.remembered.insert(id, remembered).is_none() {
                self.order.push_back(id);
            }
        }
        while let Some(oldest) = self.order.front() {
            let age = self.clock_ms.saturating_sub(self.remembered[oldest].time_ms);
            let full = self.order.len() > MAX_IDS;
            if age <= RETENTION_MS && !full {
                break;
            }
            if full && age <= RETENTION_MS {
                self.forced_evictions += 1;
            }
            let old = self.order.pop_front().expect("not empty");
            self.remembered.remove(&old);
            self.tree.remove_meta(&encode_key(old), seqno);
        }
    }

    /// Forgets everything in memory (the tree was cleared for a snapshot install); the snapshot's
    /// pairs follow through [`RequestWindow::install_pair`].
    pub fn reset(&mut self) {
        self.remembered.clear();
        self.order.clear();
        self.clock_ms = 0;
    }

    /// Checks one snapshot pair of the window from a peer the way [`Self::install_pair`] reads it,
    /// before anything of it is stored.
    pub fn check_pair(encoded: &[u8]) -> Result<(), CodecError> {
        let mut r = Reader { data: encoded, at: 0 };
        let count = r.u32()? as usize;
        if count.checked_mul(SNAPSHOT_ID_BYTES) != Some(r.remaining()) {
            return Err(CodecError("count does not match the data"));
        }
        for at in 0..count {
            // The kind byte closes each id; the same decoding as `install_pair`'s.
            Effect::decode(encoded[4 + (at + 1) * SNAPSHOT_ID_BYTES - 1])?;
        }
        Ok(())
    }

    /// Adds the ids of one snapshot pair, writing them to the tree at `seqno` (the install's).
    pub fn install_pair(&mut self, encoded: &[u8], seqno: u64) -> Result<(), ReplicaError> {
        let bad = |e: CodecError| storage(format!("the snapshot's request window: {e}"));
        let mut r = Reader { data: encoded, at: 0 };
        let count = r.u32().map_err(bad)? as usize;
        if count.checked_mul(SNAPSHOT_ID_BYTES) != Some(r.remaining()) {
            return Err(bad(CodecError("count does not match the data")));
        }
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            let id = RequestId { client: r.u64().map_err(bad)?, seq: r.u64().map_err(bad)? };
            let remembered = Remembered {
                index: r.u64().map_err(bad)?,
                time_ms: r.u64().map_err(bad)?,
                effect: Effect::decode(r.u8().map_err(bad)?).map_err(bad)?,
            };
            self.tree.insert_meta(&encode_key(id), &encode_value(remembered), seqno);
            entries.push((id, remembered));
        }
        // Pairs may arrive in any order; the in-memory order is by index.
        let mut all: Vec<_> = self.order.drain(..).map(|id| (id, self.remembered[&id])).collect();
        all.extend(entries);
        self.remembered.clear();
        self.add_sorted(all);
        Ok(())
    }
}

/// Ids in one snapshot pair of at most `chunk_bytes` ([`crate::records::chunk_bytes`]).
pub(crate) fn ids_per_pair(chunk_bytes: usize) -> usize {
    (chunk_bytes.saturating_sub(64) / SNAPSHOT_ID_BYTES).clamp(1, IDS_PER_SNAPSHOT_PAIR)
}

/// The window as of `snapshot`, as snapshot pairs' values (each under the empty key), each with at
/// most `ids_per_pair` ids.
pub(crate) fn snapshot_pairs(
    snapshot: &TreeSnapshot,
    ids_per_pair: usize,
) -> Result<Vec<Vec<u8>>, ReplicaError> {
    let mut pairs = Vec::new();
    let mut current: Vec<u8> = Vec::new();
    let mut count = 0u32;
    let mut start = Vec::new();
    loop {
        let (page, more) = snapshot.range_meta(&start, 4096).map_err(|e| storage(format!("{e}")))?;
        for (key, value) in &page {
            let (id, r) = decode_pair(key, value).map_err(|e| storage(format!("request window: {e}")))?;
            if count as usize == ids_per_pair {
                pairs.push(finish_pair(std::mem::take(&mut current), count));
                count = 0;
            }
            current.extend_from_slice(&id.client.to_le_bytes());
            current.extend_from_slice(&id.seq.to_le_bytes());
            current.extend_from_slice(&r.index.to_le_bytes());
            current.extend_from_slice(&r.time_ms.to_le_bytes());
            current.push(r.effect as u8);
            count += 1;
        }
        match page.last() {
            Some((key, _)) if more => {
                start = key.clone();
                start.push(0);
            }
            _ => break,
        }
    }
    if count > 0 {
        pairs.push(finish_pair(current, count));
    }
    Ok(pairs)
}

fn finish_pair(ids: Vec<u8>, count: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + ids.len());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&ids);
    out
}

fn encode_key(id: RequestId) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&id.client.to_be_bytes());
    key[8..].copy_from_slice(&id.seq.to_be_bytes());
    key
}

fn encode_value(r: Remembered) -> [u8; 17] {
    let mut value = [0u8; 17];
    value[..8].copy_from_slice(&r.index.to_le_bytes());
    value[8..16].copy_from_slice(&r.time_ms.to_le_bytes());
    value[16] = r.effect as u8;
    value
}

fn decode_pair(key: &[u8], value: &[u8]) -> Result<(RequestId, Remembered), CodecError> {
    let key: &[u8; 16] = key.try_into().map_err(|_| CodecError("request key is not 16 bytes"))?;
    let value: &[u8; 17] = value.try_into().map_err(|_| CodecError("request outcome is not 17 bytes"))?;
    let id = RequestId {
        client: u64::from_be_bytes(key[..8].try_into().expect("8 bytes")),
        seq: u64::from_be_bytes(key[8..].try_into().expect("8 bytes")),
    };
    let remembered = Remembered {
        index: u64::from_le_bytes(value[..8].try_into().expect("8 bytes")),
        time_ms: u64::from_le_bytes(value[8..16].try_into().expect("8 bytes")),
        effect: Effect::decode(value[16])?,
    };
    Ok((id, remembered))
}

#[cfg(test)]
mod tests {
    use super::*;
    use onekv_index::{Index, IndexConfig};

    fn window() -> (tempfile::TempDir, Tree, RequestWindow) {
        let dir = tempfile::tempdir().unwrap();
        let index = Index::open(dir.path(), IndexConfig::default()).unwrap();
        let tree = index.tree("t").unwrap();
        let window = RequestWindow::load(tree.clone()).unwrap();
        (dir, tree, window)
    }

    fn id(seq: u64) -> RequestId {
        RequestId { client: 7, seq }
    }

    #[test]
    fn pairs_round_trip_and_reject_damage() {
        let r = Remembered { index: 9, time_ms: 1234, effect: Effect::Nothing };
        let (key, value) = (encode_key(id(3)), encode_value(r));
        assert_eq!(decode_pair(&key, &value).unwrap(), (id(3), r));
        assert!(decode_pair(&key[..15], &value).is_err());
        assert!(decode_pair(&key, &value[..16]).is_err());
        let mut bad = value;
        bad[16] = 3;
        assert!(decode_pair(&key, &bad).is_err());
    }

    #[test]
    fn ids_leave_by_age_on_the_entries_clock_and_survive_a_reload() {
        let (_dir, tree, mut w) = window();
        w.on_entry(1, 1_000, Some((id(1), Effect::Write)));
        w.on_entry(2, 2_000, Some((id(2), Effect::Swapped)));
        tree.publish(state::last_seqno(2));
        assert_eq!(w.lookup(id(2)), Some(Remembered { index: 2, time_ms: 2_000, effect: Effect::Swapped }));
        // A leader whose clock is behind does not move the window's clock back.
        w.on_entry(3, 500, None);
        assert_eq!(w.lookup(id(1)).map(|r| r.index), Some(1));
        w.on_entry(4, 1_000 + RETENTION_MS + 1, None);
        tree.publish(state::last_seqno(4));
        assert_eq!(w.lookup(id(1)), None, "older than the retention");
        assert!(w.lookup(id(2)).is_some());
        let reloaded = RequestWindow::load(tree).unwrap();
        assert_eq!(reloaded.lookup(id(1)), None);
        assert_eq!(reloaded.lookup(id(2)).map(|r| r.index), Some(2));
        assert_eq!(reloaded.clock_ms, 2_000);
    }

    #[test]
    fn snapshot_pairs_carry_the_whole_window_in_bounded_pairs() {
        let (_dir, tree, mut w) = window();
        let n = IDS_PER_SNAPSHOT_PAIR + 10;
        for i in 1..=n as u64 {
            w.on_entry(
                i,
                i,
                Some((id(i), [Effect::Write, Effect::Swapped, Effect::Nothing][i as usize % 3])),
            );
        }
        tree.publish(state::last_seqno(n as u64));
        let pairs = snapshot_pairs(&tree.snapshot(), IDS_PER_SNAPSHOT_PAIR).unwrap();
        assert_eq!(ids_per_pair(4 << 20), IDS_PER_SNAPSHOT_PAIR);
        assert_eq!(ids_per_pair(8 << 10), (8192 - 64) / SNAPSHOT_ID_BYTES);
        assert_eq!(snapshot_pairs(&tree.snapshot(), 1000).unwrap().len(), n.div_ceil(1000));
        assert_eq!(pairs.len(), 2);
        let (_dir2, _tree2, mut other) = window();
        for pair in pairs.iter().rev() {
            // The check a fetching replica makes before storing a chunk accepts every effect,
            // a compare-and-swap that did not swap included.
            RequestWindow::check_pair(pair).unwrap();
            other.install_pair(pair, n as u64 + 1).unwrap();
        }
        let mut bad = pairs[0].clone();
        bad[4 + SNAPSHOT_ID_BYTES - 1] = 3;
        assert_eq!(RequestWindow::check_pair(&bad), Err(CodecError("bad request kind")));
        assert_eq!(other.len(), n);
        assert_eq!(other.order.front(), Some(&id(1)), "ordered by index whatever the pair order");
        assert_eq!(other.lookup(id(6)), w.lookup(id(6)));
        assert!(other.install_pair(&pairs[0][..pairs[0].len() - 1], 1).is_err());
    }
}
