//! Raft's storage, served from the log.
//!
//! raft-rs reads its persisted log through the read-only [`raft::Storage`] trait. This module keeps
//! the metadata in memory (hard state, membership, and for every retained index its term and the
//! locator of its ENTRY record) and reads entry bodies back from the log by locator on demand. The
//! metadata is rebuilt by the recovery scan after a restart; the node loop updates it after each
//! fsync. In classic mode entry bodies are read from the Raft entry tree instead, as a layered store
//! would.
//!
//! It does not write anything: the node loop appends records and then tells the store what is
//! durable.

use crate::records;
use crate::snapshot::SnapshotBuilder;
use crate::state::State;
use onekv_log::{Locator, Log};
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};
use std::collections::VecDeque;
use std::sync::Arc;

/// Where one retained entry lives.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EntryMeta {
    pub term: u64,
    /// The payload locator of the entry's ENTRY record.
    pub locator: Locator,
}

/// The raft-rs storage of one group.
pub(crate) struct RaftStore {
    pub shard: u64,
    /// The log holding ENTRY records.
    log: Arc<Log>,
    /// The replicated state, for building snapshots and (classic) reading entries.
    state: Arc<State>,
    pub hard_state: HardState,
    pub conf_state: ConfState,
    /// Index and term just below `entries[0]` (of the last snapshot or compaction).
    pub snapshot_index: u64,
    pub snapshot_term: u64,
    /// Entries `snapshot_index + 1 ..`.
    entries: VecDeque<EntryMeta>,
    /// Highest applied index and its term: snapshots are taken there.
    pub applied_index: u64,
    pub applied_term: u64,
    /// Builds the snapshots this node sends (off the loop thread).
    pub snapshots: std::sync::Mutex<SnapshotBuilder>,
    /// The loop's clock at the start of the current turn (for the builder's backoff).
    pub now: std::time::Instant,
    /// Followers that asked this leader for a snapshot (raft-rs `request_snapshot`) → the index
    /// this leader had counted as theirs (raft-rs's `matched`) when they asked.
    pub asked_with_matched: std::collections::HashMap<u64, u64>,
}

impl RaftStore {
    pub fn new(
        shard: u64,
        log: Arc<Log>,
        state: Arc<State>,
        members: ConfState,
        snapshots: SnapshotBuilder,
        now: std::time::Instant,
    ) -> Self {
        RaftStore {
            shard,
            log,
            state,
            snapshots: std::sync::Mutex::new(snapshots),
            now,
            asked_with_matched: std::collections::HashMap::new(),
            hard_state: HardState::default(),
            conf_state: members,
            snapshot_index: 0,
            snapshot_term: 0,
            entries: VecDeque::new(),
            applied_index: 0,
            applied_term: 0,
        }
    }

    pub fn first(&self) -> u64 {
        self.snapshot_index + 1
    }

    pub fn last(&self) -> u64 {
        self.snapshot_index + self.entries.len() as u64
    }

    /// Records that the entry `index` is durable at `locator`, replacing any entries at or after
    /// `index` (a new leader overwrote them).
    pub fn append(&mut self, index: u64, term: u64, locator: Locator) {
        if index <= self.snapshot_index {
            // Already covered by a snapshot; the recovery scan can meet such records.
            return;
        }
        let keep = (index - self.snapshot_index - 1) as usize;
        if keep > self.entries.len() {
            // A gap: this cannot come from raft-rs (it appends contiguously). Refuse loudly rather
            // than serve a log with a hole.
            panic!("entry {index} appended after last index {}", self.last());
        }
        self.entries.truncate(keep);
        self.entries.push_back(EntryMeta { term, locator });
    }

    pub fn meta(&self, index: u64) -> Option<EntryMeta> {
        if index <= self.snapshot_index {
            return None;
        }
        self.entries.get((index - self.snapshot_index - 1) as usize).copied()
    }

    /// Forgets entries below `to` (they stay in the log file; only Raft stops serving them, so a
    /// follower that needs them gets a snapshot).
    pub fn compact(&mut self, to: u64) {
        while self.snapshot_index + 1 < to && !self.entries.is_empty() {
            let meta = self.entries.pop_front().expect("not empty");
            self.snapshot_index += 1;
            self.snapshot_term = meta.term;
        }
    }

    /// Resets to a snapshot at `index`/`term`: every entry is dropped.
    pub fn apply_snapshot(&mut self, index: u64, term: u64, members: ConfState) {
        self.entries.clear();
        self.snapshot_index = index;
        self.snapshot_term = term;
        self.conf_state = members;
        if self.hard_state.commit < index {
            self.hard_state.commit = index;
        }
        if self.hard_state.term < term {
            self.hard_state.term = term;
        }
        self.applied_index = index;
        self.applied_term = term;
    }

    /// Reads the entry `index` back from disk.
    pub fn read_entry(&self, index: u64) -> raft::Result<Entry> {
        let meta = self.meta(index).ok_or(raft::Error::Store(StorageError::Unavailable))?;
        let payload = match self.state.read_entry_body(index) {
            Some(result) => result.map_err(|e| other(format!("reading entry {index}: {e}")))?,
            None => {
                let (_, payload) = self
                    .log
                    .read_record(meta.locator)
                    .map_err(|e| other(format!("reading entry {index} at {}: {e}", meta.locator)))?;
                payload
            }
        };
        let record = records::decode_entry(&payload).map_err(|e| other(format!("entry {index}: {e}")))?;
        if record.index != index || record.term != meta.term || record.shard != self.shard {
            return Err(other(format!("entry {index}: the record holds another entry")));
        }
        Ok(record.to_entry())
    }
}

fn other(message: String) -> raft::Error {
    raft::Error::Store(StorageError::Other(message.into()))
}

impl raft::Storage for RaftStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(self.hard_state.clone(), self.conf_state.clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low <= self.snapshot_index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let max_size = max_size.into();
        let mut out = Vec::with_capacity((high - low) as usize);
        let mut size = 0u64;
        for index in low..high {
            let entry = self.read_entry(index)?;
            size += protobuf::Message::compute_size(&entry) as u64;
            // raft-rs wants at least one entry even when it is over the limit.
            if !out.is_empty() && max_size.is_some_and(|max| size > max) {
                break;
            }
            out.push(entry);
        }
        Ok(out)
    }

    fn term(&self, index: u64) -> raft::Result<u64> {
        if index == self.snapshot_index {
            return Ok(self.snapshot_term);
        }
        if index < self.snapshot_index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        self.meta(index).map(|m| m.term).ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        // A follower that asked for a snapshot (raft-rs `request_snapshot`: a stalled replica)
        // asked for its log's end. A snapshot before that drops the follower's later entries, so
        // it must not be before any entry a commit counted on that follower: asked in this term,
        // those are the ones this leader counted (`matched` when it asked; an acknowledgement
        // lost on the way leaves it lower, and this leader may need the follower to commit
        // further); asked in an earlier term (the follower drops such a request once it sees
        // this term: `Group::handle`), another leader may have counted them all. None is served
        // until this leader has applied that far; never a cached older one (served again and
        // again, it would stall the follower for good when the shard needs its vote).
        let at_least = match request_index {
            raft::INVALID_INDEX => raft::INVALID_INDEX,
            asked if self.term(asked).is_ok_and(|term| term == self.hard_state.term) => {
                asked.min(self.asked_with_matched.get(&to).copied().unwrap_or(asked))
            }
            asked => asked,
        };
        // A full copy of the applied state, built off the loop thread (see `snapshot`).
        self.snapshots.lock().unwrap_or_else(|e| e.into_inner()).request(
            (self.applied_index, self.applied_term),
            &self.conf_state,
            self.first(),
            to,
            self.now,
            at_least,
        )
    }
}
