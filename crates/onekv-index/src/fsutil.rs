//! Small file-system helpers: directory sizes, directory fsync, and counting the files lsm-tree wrote.
//!
//! Counting relies on lsm-tree 3.1's layout of a tree directory: tables are `tables/<id>` and
//! manifests (versions) are `v<id>`, both with increasing ids. It is used for statistics only.

use crate::IndexError;
use std::fs;
use std::path::Path;

/// Total size of the regular files under `dir`, recursively. Files that vanish while we look (a
/// compaction deleting its inputs) are skipped.
pub(crate) fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else { return 0 };
    let mut total = 0;
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            total += dir_bytes(&entry.path());
        } else {
            total += meta.len();
        }
    }
    total
}

/// Makes a directory's entries (files created or removed in it) durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), IndexError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| IndexError::io(format!("syncing directory {}", dir.display()), e))
}

/// The newest table and manifest ids of a tree seen so far, to count the bytes of newer ones.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct WrittenFiles {
    table_id: Option<u64>,
    version_id: Option<u64>,
}

impl WrittenFiles {
    /// Remembers what `tree_dir` holds now, without counting it.
    pub(crate) fn scan(tree_dir: &Path) -> Self {
        let mut seen = Self::default();
        let _baseline = seen.count_new(tree_dir);
        seen
    }

    /// Bytes of the tables and manifests newer than the ones seen before; remembers them.
    pub(crate) fn count_new(&mut self, tree_dir: &Path) -> u64 {
        let tables = newer_files(&tree_dir.join("tables"), "", &mut self.table_id);
        let versions = newer_files(tree_dir, "v", &mut self.version_id);
        tables + versions
    }
}

fn newer_files(dir: &Path, prefix: &str, newest: &mut Option<u64>) -> u64 {
    // Statistics only: an unreadable directory counts as nothing new.
    let Ok(entries) = fs::read_dir(dir) else { return 0 };
    let before = *newest;
    let mut bytes = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(|n| n.strip_prefix(prefix)).and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        if before.is_some_and(|b| id <= b) {
            continue;
        }
        if let Ok(meta) = entry.metadata() {
            bytes += meta.len();
        }
        *newest = Some(newest.map_or(id, |n| n.max(id)));
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_files_newer_than_the_last_scan() {
        let dir = tempfile::tempdir().unwrap();
        let tables = dir.path().join("tables");
        fs::create_dir(&tables).unwrap();
        fs::write(tables.join("1"), [0u8; 10]).unwrap();
        fs::write(dir.path().join("v1"), [0u8; 3]).unwrap();
        fs::write(dir.path().join("current"), [0u8; 100]).unwrap();
        let mut seen = WrittenFiles::scan(dir.path());
        assert_eq!(seen.count_new(dir.path()), 0);
        fs::write(tables.join("2"), [0u8; 20]).unwrap();
        fs::write(tables.join("3"), [0u8; 5]).unwrap();
        fs::write(dir.path().join("v2"), [0u8; 4]).unwrap();
        fs::remove_file(tables.join("1")).unwrap();
        assert_eq!(seen.count_new(dir.path()), 29);
        assert_eq!(seen.count_new(dir.path()), 0);
        assert_eq!(dir_bytes(dir.path()), 20 + 5 + 3 + 4 + 100);
    }

    #[test]
    fn files_in_an_empty_tree_are_counted_from_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut seen = WrittenFiles::scan(dir.path());
        fs::create_dir(dir.path().join("tables")).unwrap();
        fs::write(dir.path().join("tables").join("0"), [0u8; 7]).unwrap();
        // A baseline with nothing in it: the first file found afterwards is new.
        assert_eq!(seen.count_new(dir.path()), 7);
    }
}
