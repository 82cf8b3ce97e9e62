//! The replicated state of one shard as stored on this node: the index tree and the logs its
//! entries point into, per storage mode.
//!
//! This module owns reads (get, scan; `snapshot` and `scrub` build on them) and the byte-level
//! placement of values: which log a locator refers to, and verifying a value when it is read back.
//! A value that does not match its checksum is damage on this node's disk: it is logged once per
//! value with its position, counted ([`Corruption`]), and answered as [`ReplicaError::Corrupt`] so
//! callers can tell it from a failed disk. Writing the state (applying committed entries) is
//! `apply`'s job; this module only offers the primitives.

use crate::codec;
use crate::requests::RequestWindow;
use crate::{ReplicaError, StorageMode};
use onekv_index::{Index, IndexValue, Tree};
use onekv_log::{Locator, Log};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The state of every replica the node hosts now, by shard: replicas are added and removed while
/// the node runs (`hosted`), and the log collector reads this at each round.
pub(crate) type HostedStates = Arc<Mutex<std::collections::BTreeMap<u64, Arc<State>>>>;

/// Sequence numbers come from the Raft index so that replaying an entry reproduces them exactly:
/// the low 20 bits number the operations of one entry (the lower half, up to [`MAX_OP`]) and the
/// log GC's relocations made while the entry is the last applied one (the upper half, see
/// [`relocation_seqno`]).
pub(crate) const SEQNO_OP_BITS: u32 = 20;

/// The highest operation number of an entry; more operations share it.
pub(crate) const MAX_OP: usize = (1 << (SEQNO_OP_BITS - 1)) - 1;

/// The sequence number of operation `op` of the entry at `index`.
pub(crate) fn seqno(index: u64, op: usize) -> u64 {
    (index << SEQNO_OP_BITS) | op.min(MAX_OP) as u64
}

/// The highest sequence number an entry at `index` uses (publishing uses it).
pub(crate) fn last_seqno(index: u64) -> u64 {
    seqno(index, MAX_OP)
}

/// The sequence number for a relocation of values while `applied` is the last applied entry, given
/// the highest seqno the tree has written: above every write so far (the entry's own, earlier
/// relocations, a flush flag) and below the next entry's, so that neither a later write of the
/// same key nor a replay after a crash can be overtaken by it. `None` when the range is used up
/// (relocation waits for the next entry).
pub(crate) fn relocation_seqno(applied: u64, last_written: u64) -> Option<u64> {
    let seqno = (last_seqno(applied) + 1).max(last_written + 1);
    (seqno >> SEQNO_OP_BITS == applied).then_some(seqno)
}

/// The seqno a flush flag at `applied` is written at: at least every seqno written so far.
pub(crate) fn flag_seqno(applied: u64, last_written: u64) -> u64 {
    last_seqno(applied).max(last_written)
}

/// One shard's stored state.
pub(crate) struct State {
    pub mode: StorageMode,
    pub index: Arc<Index>,
    /// `key → IndexValue`, and in its metadata space the request-id window.
    pub tree: Tree,
    /// The log with the Raft entries (in onelog mode also the one locators point into).
    pub raft_log: Arc<Log>,
    /// Separated: the value log locators point into. Classic: the data tree's write-ahead log.
    pub second_log: Option<Arc<Log>>,
    /// Classic: Raft entries as full values, keyed by big-endian index.
    pub entry_tree: Option<Tree>,
    /// Key and value bytes applied since this process started.
    pub user_bytes: AtomicU64,
    /// The window of recent request ids, kept in `tree` (used by the loop thread, and by a
    /// snapshot's install thread while the loop leaves the shard alone: the lock is uncontended).
    pub requests: Mutex<RequestWindow>,
    /// Damaged values found so far.
    pub corruption: Corruption,
    /// The node's read pins: held by every reader from its index lookup to its last value read,
    /// so the log GC never deletes bytes a reader is about to read (`pins`).
    pub pins: Arc<crate::pins::ReadPins>,
    /// The snapshot this replica serves to followers in chunks, while it leads (`snapshot`).
    pub served: Mutex<Option<Arc<crate::snapshot::stream::Served>>>,
    /// The chunks of snapshots this replica fetched or is fetching, not yet installed.
    pub staged: Mutex<crate::snapshot::stream::Stagings>,
    /// Snapshot installs begun plus those ended: odd while one runs ([`InstallGuard`]). An
    /// install points keys into log segments sealed long before (its chunks, or in separated mode
    /// the copies it appends), which the log GC's census assumes never happens; the collector
    /// gives up a pass whose census an install overlapped.
    pub installs: AtomicU64,
    /// The node's clock, which reads judge expiry by (a server), or `None`: only the times of the
    /// entries applied (a simulation, whose time is the leaders' simulated clocks).
    pub clock: Option<crate::node::NodeClock>,
    /// The latest leader time of an entry applied here ([`State::now_ms`] never runs behind it).
    pub applied_time_ms: AtomicU64,
    /// Puts with an expiry applied here since the process started (the expiry sweep's hint that
    /// a pass is worth it: `expiry`).
    pub expiring_writes: AtomicU64,
    /// Expired keys deleted here since the process started (`expiry`).
    pub expired_deleted: AtomicU64,
    /// The node's deduplication (onelog mode, whatever `dedup.mode`): applying asks it where a
    /// large value's bytes already are, and notes puts by reference (`dedup`).
    pub dedup: Option<Arc<crate::dedup::Dedup>>,
    /// The node's bound on what its served snapshot views remember of the copies they sent.
    pub copies_budget: Arc<crate::snapshot::CopiesBudget>,
    /// The broken variant [`crate::Mutation::InstallResolvesReferencesAsPublished`] (a
    /// simulation only).
    pub references_as_published: bool,
}

/// Marks a snapshot install in [`State::installs`] from its creation to its drop, whatever way
/// the install ends.
pub(crate) struct InstallGuard<'a>(&'a AtomicU64);

impl<'a> InstallGuard<'a> {
    /// An install of `state` begins (before it changes the tree).
    pub fn begin(state: &'a State) -> InstallGuard<'a> {
        state.installs.fetch_add(1, Ordering::SeqCst);
        InstallGuard(&state.installs)
    }
}

impl Drop for InstallGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Damaged values remembered per position, so a hot damaged key logs one error and counts once
/// rather than once per read. Past this many the set stops growing (its memory stays bounded);
/// further new positions are still logged and counted, and then a re-read of one of them may be
/// counted again.
const MAX_REMEMBERED_CORRUPT: usize = 100_000;

/// The damaged values this node's reads have found since it started.
#[derive(Default)]
pub(crate) struct Corruption {
    /// Distinct damaged values found.
    found: AtomicU64,
    /// Damaged values replaced by a healthy copy from another replica.
    repaired: AtomicU64,
    /// Their places in the value log: position, and the offset inside a compressed block (0 for
    /// a value stored whole), so each value of a damaged block is reported and repaired; and a
    /// hash of the key, since deduplicated keys share a place and each needs its own repair.
    seen: Mutex<BTreeSet<(u64, u32, u64)>>,
    /// Newly found damaged values, `(key, position)`, for the loop to ask a repair of.
    found_keys: Mutex<Vec<(Vec<u8>, u64)>>,
}

impl Corruption {
    /// Distinct damaged values found since the replica started.
    pub fn count(&self) -> u64 {
        self.found.load(Ordering::Relaxed)
    }

    /// Damaged values repaired since the replica started.
    pub fn repaired_count(&self) -> u64 {
        self.repaired.load(Ordering::Relaxed)
    }

    /// Takes the damaged values found since the last call.
    pub fn take_found(&self) -> Vec<(Vec<u8>, u64)> {
        std::mem::take(&mut *self.found_keys.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Records that `key`'s damaged value at `damaged` was replaced by a healthy copy.
    pub fn repaired(&self, key: &[u8], damaged: Locator, index: u64) {
        self.repaired.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            position = damaged.position,
            key = %String::from_utf8_lossy(key),
            index,
            "a damaged stored value was repaired with another replica's copy"
        );
    }

    /// Records that the value of `key` at `locator` in the log `log` (at `within` of the
    /// decompressed block there, for a packed value) is damaged: logs and counts it the first time
    /// this place is seen for this key (a shared copy is each of its keys' value).
    pub(crate) fn report(&self, log: &str, key: &[u8], locator: Locator, within: u32, why: &str) {
        let place = (locator.position, within, xxhash_rust::xxh3::xxh3_64(key));
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(&place) {
            return;
        }
        if seen.len() < MAX_REMEMBERED_CORRUPT {
            seen.insert(place);
        }
        drop(seen);
        let mut found_keys = self.found_keys.lock().unwrap_or_else(|e| e.into_inner());
        if found_keys.len() < MAX_REMEMBERED_CORRUPT {
            found_keys.push((key.to_vec(), locator.position));
        }
        drop(found_keys);
        let found = self.found.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::error!(
            log,
            position = locator.position,
            len = locator.len,
            key = %String::from_utf8_lossy(key),
            found,
            "a stored value is damaged: {why}; reads of this key fail on this node until another replica's copy repairs it"
        );
    }
}

impl State {
    /// The request-id window.
    pub fn requests(&self) -> MutexGuard<'_, RequestWindow> {
        self.requests.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The log a locator stored in the index refers to.
    pub fn value_log(&self) -> &Log {
        match self.mode {
            StorageMode::Separated => self.second_log.as_deref().expect("separated mode has a value log"),
            _ => &self.raft_log,
        }
    }

    /// Resolves `key`'s index value to the value bytes, verifying them.
    pub fn resolve(&self, key: &[u8], stored: &[u8]) -> Result<Vec<u8>, ReplicaError> {
        match IndexValue::decode(stored).map_err(|e| storage(format!("index value: {e}")))? {
            IndexValue::Inline(bytes) => Ok(bytes),
            IndexValue::Locator(locator) | IndexValue::Shared(locator) => self.read_value(key, locator),
            IndexValue::Packed(packed) => self.read_packed(key, packed),
        }
    }

    /// The name of the log values live in, for reports.
    pub fn value_log_name(&self) -> &'static str {
        self.mode.log_names().last().copied().unwrap_or("log")
    }

    /// Reads `key`'s value from its compressed block (`packed`): one positional read of the whole
    /// block, whose CRC and then the value's are checked. Damage to either is reported and
    /// answered as [`ReplicaError::Corrupt`], as in [`State::read_value`].
    pub fn read_packed(&self, key: &[u8], packed: onekv_index::Packed) -> Result<Vec<u8>, ReplicaError> {
        let block = self
            .value_log()
            .read(packed.block)
            .map_err(|e| storage(format!("reading a packed block at {}: {e}", packed.block)))?;
        let value = crate::packed::unpack(&block).and_then(|raw| {
            let stored = crate::packed::stored_value(&raw, packed.offset, packed.len)?;
            codec::verify_stored_value(stored).map(<[u8]>::to_vec)
        });
        value.map_err(|e| {
            self.corruption.report(self.value_log_name(), key, packed.block, packed.offset, e.0);
            ReplicaError::Corrupt { key: key.to_vec(), position: packed.block.position }
        })
    }

    /// Reads `key`'s stored value (`crc || bytes`) by locator: one positional read of exactly its
    /// bytes. Bytes that do not match their checksum are reported and answered as
    /// [`ReplicaError::Corrupt`]; a failed read stays a storage failure.
    pub fn read_value(&self, key: &[u8], locator: Locator) -> Result<Vec<u8>, ReplicaError> {
        let mut stored = self
            .value_log()
            .read(locator)
            .map_err(|e| storage(format!("reading value at {locator}: {e}")))?;
        if let Err(e) = codec::verify_stored_value(&stored) {
            self.corruption.report(self.value_log_name(), key, locator, 0, e.0);
            return Err(ReplicaError::Corrupt { key: key.to_vec(), position: locator.position });
        }
        stored.drain(..codec::STORED_VALUE_PREFIX);
        Ok(stored)
    }

    /// Whether `key` points at `value` now (the log GC's test of whether a copy is still the live
    /// one: a write, delete or earlier move since makes it not).
    pub fn points_at(&self, key: &[u8], value: &IndexValue) -> Result<bool, String> {
        Ok(self.pointing_at(key, value)?.is_some())
    }

    /// [`State::points_at`], with the key's expiry when it does (`Some(None)`: it never expires),
    /// which a copy moved elsewhere keeps.
    pub fn pointing_at(&self, key: &[u8], value: &IndexValue) -> Result<Option<Option<u64>>, String> {
        let current = self.tree.get(key).map_err(|e| format!("index lookup: {e}"))?;
        Ok(current.and_then(|stored| match onekv_index::decode_stored(&stored) {
            Ok((current, expiry)) if current == *value => Some(expiry),
            _ => None,
        }))
    }

    /// The time reads judge expiry by, in ms since the Unix epoch: the node's clock (the one its
    /// loop stamps entries with), but never behind the latest leader time applied here (so a key
    /// the leader's entries treat as expired never reads as live here because this clock is
    /// behind theirs).
    pub fn now_ms(&self) -> u64 {
        let applied = self.applied_time_ms.load(Ordering::Relaxed);
        self.clock.map_or(applied, |clock| clock.now_ms().max(applied))
    }

    /// Records that an entry a leader proposed at `time_ms` was applied (not a follower's repair
    /// request, whose time is that follower's clock).
    pub fn observe_time(&self, time_ms: u64) {
        self.applied_time_ms.fetch_max(time_ms, Ordering::Relaxed);
    }

    /// The current value of `key` as applied here, absent if it expired by now.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ReplicaError> {
        Ok(self.get_at(key, self.now_ms())?.map(|(value, _)| value))
    }

    /// The value of `key` and when it expires, as seen at `now_ms`: absent if it expired by then.
    /// Applying an entry asks at the entry's time, so every replica decides alike.
    pub fn get_at(&self, key: &[u8], now_ms: u64) -> Result<Option<crate::ValueWithExpiry>, ReplicaError> {
        let _pin = self.pins.pin();
        match self.tree.get(key).map_err(|e| storage(format!("index lookup: {e}")))? {
            Some(stored) if onekv_index::expired_at(&stored, now_ms) => Ok(None),
            Some(stored) => {
                let expiry = onekv_index::stored_expiry(&stored);
                self.resolve(key, &stored).map(|value| Some((value, expiry)))
            }
            None => Ok(None),
        }
    }

    /// When `key` expires, if it is live at `now_ms` and has an expiry (no value is read).
    pub fn live_expiry(&self, key: &[u8], now_ms: u64) -> Result<Option<u64>, ReplicaError> {
        let stored = self.tree.get(key).map_err(|e| storage(format!("index lookup: {e}")))?;
        Ok(stored.and_then(|stored| onekv_index::stored_expiry(&stored)).filter(|&at| at > now_ms))
    }

    /// Up to `limit` pairs in `[start, end)`, stopping early past `max_bytes`; and whether more remain.
    /// With `keys_only` no value is resolved (no pread, no checksum): each pair's value is empty and
    /// only key bytes count against `max_bytes`.
    pub fn scan(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        reverse: bool,
        max_bytes: usize,
        keys_only: bool,
    ) -> Result<crate::ScanResult, ReplicaError> {
        let _pin = self.pins.pin();
        let now_ms = self.now_ms();
        let mut out = Vec::new();
        let mut bytes = 0usize;
        // The part of the range not read yet: expired keys are left out of the page and the tree
        // is read on past them, so a page with `more` always holds a key to continue from (its
        // callers' cursor), however many expired keys lie in a row (the expiry sweep deletes them).
        let (mut from, mut to) = (start.to_vec(), end.map(<[u8]>::to_vec));
        loop {
            let wanted = limit - out.len();
            let (found, more) = self
                .tree
                .range(&from, to.as_deref(), wanted, reverse)
                .map_err(|e| storage(format!("index scan: {e}")))?;
            let total = found.len();
            if total == 0 {
                return Ok((out, false));
            }
            for (i, (key, stored)) in found.into_iter().enumerate() {
                if reverse {
                    to = Some(key.clone());
                } else {
                    from = key.clone();
                    from.push(0);
                }
                if onekv_index::expired_at(&stored, now_ms) {
                    continue;
                }
                let value = if keys_only { Vec::new() } else { self.resolve(&key, &stored)? };
                bytes += key.len() + value.len();
                out.push((key, value));
                if bytes >= max_bytes && (i + 1 < total || more) {
                    return Ok((out, true));
                }
            }
            if out.len() >= limit || !more {
                return Ok((out, more));
            }
        }
    }

    /// Classic mode reads entry bodies from the entry tree; other modes return `None` and the
    /// caller reads the log.
    pub fn read_entry_body(&self, index: u64) -> Option<Result<Vec<u8>, ReplicaError>> {
        let tree = self.entry_tree.as_ref()?;
        Some(match tree.get(&index.to_be_bytes()) {
            Ok(Some(bytes)) => Ok(bytes),
            Ok(None) => Err(storage(format!("entry {index} missing from the entry tree"))),
            Err(e) => Err(storage(format!("entry tree: {e}"))),
        })
    }

    /// Bytes in the node's log files now.
    pub fn log_bytes(&self) -> u64 {
        let span = |log: &Log| log.end_position() - log.first_position();
        span(&self.raft_log) + self.second_log.as_deref().map_or(0, span)
    }

    /// Bytes written to disk since open: logs and index tables.
    pub fn bytes_written(&self) -> u64 {
        self.raft_log.stats().bytes_written
            + self.second_log.as_ref().map_or(0, |log| log.stats().bytes_written)
            + self.index.bytes_written()
    }

    pub fn add_user_bytes(&self, bytes: u64) {
        self.user_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

pub(crate) fn storage(message: String) -> ReplicaError {
    ReplicaError::Storage(message)
}

#[cfg(test)]
mod tests {
    use super::Corruption;
    use onekv_log::Locator;

    #[test]
    fn a_damaged_copy_keys_share_is_reported_for_each_key_once() {
        let corruption = Corruption::default();
        let place = Locator::new(4096, 1028);
        for _ in 0..3 {
            corruption.report("log", b"first", place, 0, "checksum mismatch");
            corruption.report("log", b"second", place, 0, "checksum mismatch");
        }
        let mut found = corruption.take_found();
        found.sort();
        assert_eq!(found, vec![(b"first".to_vec(), 4096), (b"second".to_vec(), 4096)], "each key once");
        assert_eq!(corruption.count(), 2);
        corruption.report("log", b"first", place, 0, "checksum mismatch");
        assert!(corruption.take_found().is_empty(), "a key already reported is not queued again");
    }
}
