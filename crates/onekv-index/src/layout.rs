//! The two shapes a tree's tables are kept in: leveled for the copies that serve reads, at most
//! `S` sorted runs for the redundant copies (DEPART's replica decoupling, §4.2–4.4).
//!
//! Both are lsm-tree's leveled compaction with different settings, because lsm-tree 3.1 does not
//! let another crate write a compaction strategy (its `Version` is private) and has no tiered one.
//! A [`Layout::Runs`] tree lets flushed tables pile up in L0 untouched, each a sorted run, until
//! there are `S` of them; then one compaction merges them all with the rest of the tree into a
//! single run (its table size is unbounded, so the merged level never spills into a deeper one).
//! That is DEPART's tunable ordering: a range group (here: a shard's tree) holds at most `S` runs
//! besides the merged one, and reaching `S` merge-sorts them. `S = 1` keeps the tree fully sorted
//! at every flush; a large `S` merges rarely and reads more runs.
//!
//! A tree may change layout at any time (the replica changes it when it starts or stops leading a
//! shard): reads are correct in either shape, and compacting with [`Layout::Leveled`] until a step
//! finds nothing to do brings a runs-shaped tree to the leveled form.
//!
//! Owns: the layouts and the lsm-tree strategy each one is. Does not own which layout a tree
//! should have (the replica decides from its role).

use crate::IndexConfig;

/// The largest `S` of [`Layout::Runs`]: more L0 runs than this would make every point read probe
/// too many tables (and lsm-tree keeps L0's count in a `u8`).
pub const MAX_RUNS: u8 = 64;

/// Table size of a [`Layout::Runs`] tree: one merged run is one table, however large. Not
/// `u64::MAX`, because lsm-tree multiplies it by the L0 threshold.
const UNBOUNDED_TABLE_BYTES: u64 = 1 << 40;

/// How a tree's tables are compacted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Leveled compaction as [`IndexConfig`] tunes it (`l0_threshold`, `level_ratio`,
    /// `table_target_bytes`): few runs, for the trees that serve reads.
    Leveled,
    /// At most this many flushed runs (1 to [`MAX_RUNS`]) wait in L0 before all are merged into
    /// one: less compaction, more runs per read.
    Runs(u8),
}

impl Layout {
    /// Checks `S` of a [`Layout::Runs`].
    pub fn validate(self) -> Result<(), String> {
        match self {
            Layout::Runs(runs) if runs == 0 || runs > MAX_RUNS => {
                Err(format!("the number of sorted runs must be 1 to {MAX_RUNS}, not {runs}"))
            }
            _ => Ok(()),
        }
    }

    /// A short name for logs and metrics: `leveled` or `runs`.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Leveled => "leveled",
            Layout::Runs(_) => "runs",
        }
    }

    /// The lsm-tree strategy that keeps a tree in this layout.
    pub(crate) fn strategy(self, config: &IndexConfig) -> lsm_tree::compaction::Leveled {
        let strategy =
            lsm_tree::compaction::Leveled::default().with_level_ratio_policy(vec![config.level_ratio]);
        match self {
            Layout::Leveled => strategy
                .with_l0_threshold(config.l0_threshold)
                .with_table_target_size(config.table_target_bytes),
            Layout::Runs(runs) => strategy
                .with_l0_threshold(runs.clamp(1, MAX_RUNS))
                .with_table_target_size(UNBOUNDED_TABLE_BYTES),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_bounded() {
        assert!(Layout::Leveled.validate().is_ok());
        assert!(Layout::Runs(1).validate().is_ok());
        assert!(Layout::Runs(MAX_RUNS).validate().is_ok());
        assert!(Layout::Runs(0).validate().is_err());
        assert!(Layout::Runs(MAX_RUNS + 1).validate().is_err());
    }
}
