//! The replicated state of one shard as stored on this node: the index tree and the logs its
//! entries point into, per storage mode.
//!
//! This module owns reads (get, scan; `snapshot` builds on them) and the byte-level placement of values:
//! which log a locator refers to, and verifying a value when it is read back. Writing the state
//! (applying committed entries) is `apply`'s job; this module only offers the primitives.

use crate::codec;
use crate::requests::RequestWindow;
use crate::{ReplicaError, StorageMode};
use onekv_index::{Index, IndexValue, Tree};
use onekv_log::{Locator, Log};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Name of the index tree of a shard.
pub(crate) fn shard_tree_name(shard: u64) -> String {
    format!("shard-{shard}")
}

/// Name of the classic mode's Raft entry tree of a shard.
pub(crate) fn entry_tree_name(shard: u64) -> String {
    format!("raft-entries-{shard}")
}

/// Sequence numbers come from the Raft index so that replaying an entry reproduces them exactly:
/// the low 20 bits number the operations of one entry.
pub(crate) const SEQNO_OP_BITS: u32 = 20;

/// The sequence number of operation `op` of the entry at `index`.
pub(crate) fn seqno(index: u64, op: usize) -> u64 {
    (index << SEQNO_OP_BITS) | (op as u64).min((1 << SEQNO_OP_BITS) - 2)
}

/// The highest sequence number an entry at `index` uses (flush flags and publishing use it).
pub(crate) fn last_seqno(index: u64) -> u64 {
    (index << SEQNO_OP_BITS) | ((1 << SEQNO_OP_BITS) - 1)
}

/// One shard's stored state.
pub(crate) struct State {
    pub mode: StorageMode,
    pub index: Index,
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
    /// The window of recent request ids, kept in `tree` (used by the loop thread only; the lock is
    /// uncontended).
    pub requests: Mutex<RequestWindow>,
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

    /// Resolves an index value to the value bytes, verifying them.
    pub fn resolve(&self, stored: &[u8]) -> Result<Vec<u8>, ReplicaError> {
        match IndexValue::decode(stored).map_err(|e| storage(format!("index value: {e}")))? {
            IndexValue::Inline(bytes) => Ok(bytes),
            IndexValue::Locator(locator) => self.read_value(locator),
        }
    }

    /// Reads a stored value (`crc || bytes`) by locator: one positional read of exactly its bytes.
    pub fn read_value(&self, locator: Locator) -> Result<Vec<u8>, ReplicaError> {
        let mut stored = self
            .value_log()
            .read(locator)
            .map_err(|e| storage(format!("reading value at {locator}: {e}")))?;
        codec::verify_stored_value(&stored).map_err(|e| storage(format!("value at {locator}: {e}")))?;
        stored.drain(..codec::STORED_VALUE_PREFIX);
        Ok(stored)
    }

    /// The current value of `key` as applied here.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ReplicaError> {
        match self.tree.get(key).map_err(|e| storage(format!("index lookup: {e}")))? {
            Some(stored) => self.resolve(&stored).map(Some),
            None => Ok(None),
        }
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
        let (found, mut more) =
            self.tree.range(start, end, limit, reverse).map_err(|e| storage(format!("index scan: {e}")))?;
        let mut out = Vec::with_capacity(found.len());
        let mut bytes = 0usize;
        let total = found.len();
        for (i, (key, stored)) in found.into_iter().enumerate() {
            let value = if keys_only { Vec::new() } else { self.resolve(&stored)? };
            bytes += key.len() + value.len();
            out.push((key, value));
            if bytes >= max_bytes && i + 1 < total {
                more = true;
                break;
            }
        }
        Ok((out, more))
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
