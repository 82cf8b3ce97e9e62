//! Index configuration: one struct, documented defaults, checked once by [`IndexConfig::validate`]
//! before anything is opened.
//!
//! Settings that lsm-tree persists per tree (the level count) are not exposed; everything here may
//! change between opens.

use crate::IndexError;

/// How an [`crate::Index`] and its trees are tuned.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexConfig {
    /// Memtable size at which callers should flush a tree ([`crate::Tree::memtable_full`]). The
    /// index flushes on its own only inside [`crate::Tree::clear`] (without moving the flag); every
    /// other flush is the caller's, because it carries the caller's flush flag. Default 16 MiB.
    pub memtable_bytes: u64,
    /// Number of L0 tables that triggers a leveled compaction into L1. Default 4.
    pub l0_threshold: u8,
    /// Target size of one table on disk; compaction output is cut into tables of about this size.
    /// Default 64 MiB.
    pub table_target_bytes: u64,
    /// Size ratio between consecutive levels (leveled compaction fan-out). Default 10.
    pub level_ratio: f32,
    /// Block cache shared by all trees of the index, in bytes. Default 64 MiB.
    pub cache_bytes: u64,
    /// Table file descriptors kept open, shared by all trees. Default 512.
    pub max_open_files: usize,
}

impl Default for IndexConfig {
    fn default() -> Self {
        Self {
            memtable_bytes: 16 << 20,
            l0_threshold: 4,
            table_target_bytes: 64 << 20,
            level_ratio: 10.0,
            cache_bytes: 64 << 20,
            max_open_files: 512,
        }
    }
}

impl IndexConfig {
    /// Checks that every setting is usable.
    pub fn validate(&self) -> Result<(), IndexError> {
        let fail = |what: &str| Err(IndexError::Config(what.to_owned()));
        if self.memtable_bytes == 0 {
            return fail("memtable_bytes must be positive");
        }
        if self.l0_threshold == 0 {
            return fail("l0_threshold must be at least 1");
        }
        if self.table_target_bytes == 0 {
            return fail("table_target_bytes must be positive");
        }
        // NaN fails this comparison too.
        if !(self.level_ratio > 1.0 && self.level_ratio.is_finite()) {
            return fail("level_ratio must be a finite number above 1");
        }
        if self.max_open_files == 0 {
            return fail("max_open_files must be positive");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_bad_settings_are_rejected() {
        assert!(IndexConfig::default().validate().is_ok());
        let bad = [
            IndexConfig { memtable_bytes: 0, ..IndexConfig::default() },
            IndexConfig { l0_threshold: 0, ..IndexConfig::default() },
            IndexConfig { table_target_bytes: 0, ..IndexConfig::default() },
            IndexConfig { level_ratio: 1.0, ..IndexConfig::default() },
            IndexConfig { level_ratio: f32::NAN, ..IndexConfig::default() },
            IndexConfig { level_ratio: f32::INFINITY, ..IndexConfig::default() },
            IndexConfig { max_open_files: 0, ..IndexConfig::default() },
        ];
        for config in bad {
            assert!(matches!(config.validate(), Err(IndexError::Config(_))), "accepted {config:?}");
        }
    }
}
