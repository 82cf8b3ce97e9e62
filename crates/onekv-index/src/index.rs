//! The index directory: named trees, each in its own subdirectory, sharing a block cache, a file
//! descriptor table and write statistics.
//!
//! Layout: `<dir>/LOCK` (held with an exclusive file lock while any `Index` or `Tree` handle of this
//! directory lives, so one directory is never opened twice) and `<dir>/<tree name>/` for each tree,
//! in lsm-tree's own layout.

use crate::fsutil;
use crate::{IndexConfig, IndexError, Layout, Tree};
use lsm_tree::{AnyTree, Cache, DescriptorTable, SequenceNumberCounter};
use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

const LOCK_FILE: &str = "LOCK";
const MAX_TREE_NAME_LEN: usize = 64;

/// A directory holding named trees.
pub struct Index {
    shared: Arc<IndexShared>,
    trees: Mutex<HashMap<String, Tree>>,
}

/// What the index and all its trees share; trees keep it (and so the directory lock) alive.
pub(crate) struct IndexShared {
    pub(crate) dir: PathBuf,
    pub(crate) config: IndexConfig,
    cache: Arc<Cache>,
    descriptors: Arc<DescriptorTable>,
    pub(crate) bytes_written: AtomicU64,
    /// Flushes of all trees since open.
    pub(crate) flushes: AtomicU64,
    /// Compaction steps that changed a tree, of all trees since open.
    pub(crate) compactions: AtomicU64,
    /// Bytes written by compaction steps into [`Layout::Leveled`] trees, since open.
    leveled_compaction_bytes: AtomicU64,
    /// Bytes written by compaction steps into [`Layout::Runs`] trees, since open.
    runs_compaction_bytes: AtomicU64,
    _lock: fs::File,
}

impl Index {
    /// Opens the index in `path`, creating the directory if missing. Trees are opened on demand by
    /// [`Index::tree`].
    pub fn open(path: &Path, config: IndexConfig) -> Result<Index, IndexError> {
        config.validate()?;
        if !path.is_dir() {
            fs::create_dir_all(path)
                .map_err(|e| IndexError::io(format!("creating index directory {}", path.display()), e))?;
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                fsutil::sync_dir(parent)?;
            }
        }
        let lock_path = path.join(LOCK_FILE);
        let lock = fs::File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| IndexError::io(format!("opening {}", lock_path.display()), e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => return Err(IndexError::Locked { path: path.to_owned() }),
            Err(fs::TryLockError::Error(e)) => {
                return Err(IndexError::io(format!("locking {}", lock_path.display()), e));
            }
        }
        let shared = IndexShared {
            dir: path.to_owned(),
            cache: Arc::new(Cache::with_capacity_bytes(config.cache_bytes)),
            descriptors: Arc::new(DescriptorTable::new(config.max_open_files)),
            config,
            bytes_written: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            compactions: AtomicU64::new(0),
            leveled_compaction_bytes: AtomicU64::new(0),
            runs_compaction_bytes: AtomicU64::new(0),
            _lock: lock,
        };
        Ok(Index { shared: Arc::new(shared), trees: Mutex::default() })
    }

    /// Opens or creates the tree `name` (`shard-1`, `raft-entries`, ...): 1 to 64 ASCII letters,
    /// digits, `-`, `_` or `.`, not starting with `.`. The same name gives the same tree.
    pub fn tree(&self, name: &str) -> Result<Tree, IndexError> {
        check_tree_name(name)?;
        // Held while opening, so two callers cannot open the same lsm tree twice.
        let mut trees = self.trees.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(tree) = trees.get(name) {
            return Ok(tree.clone());
        }
        let dir = self.shared.dir.join(name);
        let existed = dir.is_dir();
        let version_seqno = SequenceNumberCounter::default();
        // lsm-tree's visible-seqno counter is unused: visibility is ours (see `reads`).
        let config = lsm_tree::Config::new(&dir, version_seqno.clone(), SequenceNumberCounter::default())
            .use_cache(self.shared.cache.clone())
            .use_descriptor_table(Some(self.shared.descriptors.clone()));
        let lsm = match config.open() {
            Ok(AnyTree::Standard(lsm)) => lsm,
            Ok(AnyTree::Blob(_)) => {
                return Err(IndexError::storage(name, "opening", lsm_tree::Error::Unrecoverable));
            }
            Err(e) => return Err(IndexError::storage(name, "opening", e)),
        };
        if !existed {
            // lsm-tree syncs the tree directory's contents, not its entry in ours.
            fsutil::sync_dir(&self.shared.dir)?;
        }
        let tree = Tree::open(name, dir, lsm, version_seqno, self.shared.clone())?;
        trees.insert(name.to_owned(), tree.clone());
        Ok(tree)
    }

    /// Forgets the open tree `name`: the index keeps no handle to it any more, so its memory and
    /// files are released once the last handle elsewhere is dropped (its files stay on disk).
    /// Opening it again opens it anew.
    pub fn forget_tree(&self, name: &str) {
        self.trees.lock().unwrap_or_else(PoisonError::into_inner).remove(name);
    }

    /// Names of the trees present on disk, sorted (whether or not opened yet).
    pub fn tree_names(&self) -> Result<Vec<String>, IndexError> {
        let context = || format!("listing {}", self.shared.dir.display());
        let mut names = Vec::new();
        for entry in fs::read_dir(&self.shared.dir).map_err(|e| IndexError::io(context(), e))? {
            let entry = entry.map_err(|e| IndexError::io(context(), e))?;
            let is_dir = entry.file_type().map_err(|e| IndexError::io(context(), e))?.is_dir();
            if let (true, Some(name)) = (is_dir, entry.file_name().to_str())
                && check_tree_name(name).is_ok()
            {
                names.push(name.to_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    /// The index directory.
    pub fn path(&self) -> &Path {
        &self.shared.dir
    }

    /// Bytes of all files in the index directory now.
    pub fn disk_bytes(&self) -> u64 {
        fsutil::dir_bytes(&self.shared.dir)
    }

    /// Bytes of tables and manifests written by flushes and compactions of all trees since open.
    pub fn bytes_written(&self) -> u64 {
        self.shared.bytes_written.load(Ordering::Relaxed)
    }

    /// Memtable flushes of all trees since open.
    pub fn flushes(&self) -> u64 {
        self.shared.flushes.load(Ordering::Relaxed)
    }

    /// Compaction steps that changed a tree, over all trees since open.
    pub fn compactions(&self) -> u64 {
        self.shared.compactions.load(Ordering::Relaxed)
    }

    /// Bytes written by compaction steps towards `layout` (any `S` for [`Layout::Runs`]), over all
    /// trees since open (flushes not included).
    pub fn compaction_bytes(&self, layout: Layout) -> u64 {
        self.shared.compaction_bytes(layout).load(Ordering::Relaxed)
    }
}

impl IndexShared {
    /// The counter of compaction bytes for `layout`.
    pub(crate) fn compaction_bytes(&self, layout: Layout) -> &AtomicU64 {
        match layout {
            Layout::Leveled => &self.leveled_compaction_bytes,
            Layout::Runs(_) => &self.runs_compaction_bytes,
        }
    }
}

impl fmt::Debug for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Index").field("dir", &self.shared.dir).finish_non_exhaustive()
    }
}

fn check_tree_name(name: &str) -> Result<(), IndexError> {
    let reason = if name.is_empty() || name.len() > MAX_TREE_NAME_LEN {
        "must be 1 to 64 bytes"
    } else if name.starts_with('.') {
        "must not start with '.'"
    } else if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')) {
        "may hold only ASCII letters, digits, '-', '_' and '.'"
    } else {
        return Ok(());
    };
    Err(IndexError::InvalidTreeName { name: name.to_owned(), reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_names_are_checked() {
        for good in ["shard-1", "raft-entries", "a", "A.b_c-9", &"x".repeat(64)] {
            assert!(check_tree_name(good).is_ok(), "rejected {good}");
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "a b", "ü", &"x".repeat(65), "LOCK\0"] {
            assert!(check_tree_name(bad).is_err(), "accepted {bad:?}");
        }
    }
}
