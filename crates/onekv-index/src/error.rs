//! The index's one error type.
//!
//! Errors are `Clone` (sources are behind `Arc`) so that a tree that stopped after a failed flush can
//! hand its first failure to every later caller.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// Why an index operation did not succeed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum IndexError {
    /// The configuration is not usable; nothing was touched.
    #[error("invalid index configuration: {0}")]
    Config(String),
    /// A tree name that cannot be used as a directory name.
    #[error("invalid tree name {name:?}: {reason}")]
    InvalidTreeName {
        /// The name asked for.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Another `Index` (in this or another process) holds the directory's lock. Trees keep their
    /// index's lock, so every `Tree` handle of a dropped `Index` must be dropped before reopening.
    #[error("index directory {} is in use by another Index", path.display())]
    Locked {
        /// The index directory.
        path: PathBuf,
    },
    /// A file-system operation of our own failed.
    #[error("I/O error while {context}: {source}")]
    Io {
        /// What the index was doing, with the path.
        context: String,
        /// The operating system's error.
        source: Arc<io::Error>,
    },
    /// lsm-tree reported an error (I/O, checksum mismatch, unreadable manifest, ...).
    #[error("tree {tree}: lsm-tree failed while {op}: {source}")]
    Storage {
        /// The tree's name.
        tree: String,
        /// What the index was doing.
        op: &'static str,
        /// lsm-tree's error.
        source: Arc<lsm_tree::Error>,
    },
    /// An earlier flush or compaction of this tree failed, so it accepts no more of them. Reopen
    /// the index to recover what is durable.
    #[error("tree {tree} stopped after an earlier failure: {cause}")]
    Failed {
        /// The tree's name.
        tree: String,
        /// The first failure.
        cause: Arc<IndexError>,
    },
    /// A key longer than [`crate::MAX_KEY_LEN`] was passed to a read.
    #[error("key of {len} bytes exceeds the maximum of {max}")]
    KeyTooLong {
        /// The key's length.
        len: usize,
        /// [`crate::MAX_KEY_LEN`].
        max: usize,
    },
    /// A sequence number outside `MIN_SEQNO..=MAX_SEQNO`, or one that would go back in time.
    #[error("tree {tree}: seqno {seqno} rejected: {reason}")]
    InvalidSeqno {
        /// The tree's name.
        tree: String,
        /// The seqno passed.
        seqno: u64,
        /// Which rule it breaks.
        reason: String,
    },
    /// A flush asked to record a flag below the one already durable.
    #[error("tree {tree}: flush flag {requested} is below the durable flag {current}")]
    FlushFlagRegressed {
        /// The tree's name.
        tree: String,
        /// The flag already durable.
        current: u64,
        /// The flag asked for.
        requested: u64,
    },
    /// The flush flag stored in a table is not an 8-byte integer.
    #[error("tree {tree}: stored flush flag is {len} bytes, expected 8")]
    CorruptFlushFlag {
        /// The tree's name.
        tree: String,
        /// Length found.
        len: usize,
    },
    /// Bytes that do not decode as an [`crate::IndexValue`].
    #[error("invalid index value: {0}")]
    InvalidValue(String),
}

impl IndexError {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Self::Io { context: context.into(), source: Arc::new(source) }
    }

    pub(crate) fn storage(tree: &str, op: &'static str, source: lsm_tree::Error) -> Self {
        Self::Storage { tree: tree.to_owned(), op, source: Arc::new(source) }
    }
}
