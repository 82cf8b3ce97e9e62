//! Deleting expired keys: a shard's leader walks its index a bounded page per tick and proposes
//! the deletion of the keys it finds expired, through Raft, so every replica deletes them at the
//! same place in the log and their space is reclaimed like any overwrite's (the log GC).
//!
//! Expiry itself needs none of this: a key whose time has come reads as absent everywhere at once
//! (reads judge by the clock, applying judges by the entry's leader time; `state`, `apply`). The
//! sweep only frees the space. The deletion command ([`crate::codec::DecodedCommand::DeleteExpired`])
//! deletes a key only if it is still expired when the entry applies, so a key written again
//! in between (without an expiry, or with a later one) stays.
//!
//! There is no index of expiry times: a pass reads every key of the shard, [`KEYS_PER_TICK`] per
//! tick (64 in classic mode, whose index holds the values), so a pass over a shard of N keys takes
//! N / `KEYS_PER_TICK` ticks. Passes begin at most every `expiry_sweep_interval` (10 s by default),
//! and only when one may find something: one pass when this node becomes the leader, then again
//! once the earliest expiry time the last pass met has come, or a write with an expiry applied
//! since ([`State::expiring_writes`]). A shard without expiring keys, or whose keys expire in a
//! year, costs nothing between passes.
//!
//! This module owns the walk and when it runs; it does not own the command's encoding (`codec`)
//! or what applying it does (`apply`).

use crate::state::State;
use std::sync::atomic::Ordering;

/// Index entries read per tick while sweeping (about 10 000 per second at the default 100 ms tick).
pub(crate) const KEYS_PER_TICK: usize = 1024;
/// The same in classic mode, whose index holds the values themselves (up to 1 MiB each).
pub(crate) const CLASSIC_KEYS_PER_TICK: usize = 64;
/// At most this many keys in one deletion command.
pub(crate) const KEYS_PER_DELETION: usize = 256;
/// At most this many key bytes in one deletion command.
pub(crate) const KEY_BYTES_PER_DELETION: usize = 256 << 10;
/// Passes over a shard begin at least this far apart by default
/// ([`crate::ReplicaConfig::expiry_sweep_interval`]).
pub(crate) const DEFAULT_PASS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// One shard's sweep.
#[derive(Default)]
pub(crate) struct Sweep {
    /// Where the next page starts (empty: the first key); `None` when idle.
    cursor: Option<Vec<u8>>,
    /// The earliest expiry time the pass under way (or the last one) met.
    earliest: Option<u64>,
    /// [`State::expiring_writes`] when the last pass began.
    writes_at_start: u64,
    /// When the last pass began (leader time); `None` before the first since this node leads.
    began_at_ms: Option<u64>,
}

impl Sweep {
    /// Forgets the pass under way (this node stopped leading): the next leadership starts anew.
    pub fn reset(&mut self) {
        *self = Sweep::default();
    }

    /// Reads the next page of the pass (starting one if due) and returns the keys found expired
    /// at `now_ms`, within the deletion command's bounds. Errors of the index are returned; the
    /// next tick tries again from the same place.
    pub fn next_page(
        &mut self,
        state: &State,
        now_ms: u64,
        interval_ms: u64,
    ) -> Result<Vec<Vec<u8>>, String> {
        let writes = state.expiring_writes.load(Ordering::Relaxed);
        if self.cursor.is_none() {
            let due = match self.began_at_ms {
                None => true,
                // A key the last pass met expires by now, or a write with an expiry applied since.
                Some(began) => {
                    now_ms >= began.saturating_add(interval_ms)
                        && (self.earliest.is_some_and(|at| at <= now_ms) || writes != self.writes_at_start)
                }
            };
            if !due {
                return Ok(Vec::new());
            }
            self.cursor = Some(Vec::new());
            self.earliest = None;
            self.writes_at_start = writes;
            self.began_at_ms = Some(now_ms);
        }
        let start = self.cursor.clone().unwrap_or_default();
        let per_tick =
            if state.mode == crate::StorageMode::Classic { CLASSIC_KEYS_PER_TICK } else { KEYS_PER_TICK };
        let (page, more) =
            state.tree.range(&start, None, per_tick, false).map_err(|e| format!("index scan: {e}"))?;
        let mut expired = Vec::new();
        let mut bytes = 0;
        let mut next = None;
        for (key, stored) in &page {
            let Some(at) = onekv_index::stored_expiry(stored) else { continue };
            // Expired ones count too: should their deletion be lost (a leader change), the next
            // pass finds them again.
            self.earliest = Some(self.earliest.map_or(at, |earliest| earliest.min(at)));
            if at > now_ms {
                continue;
            }
            if expired.len() == KEYS_PER_DELETION || bytes + key.len() > KEY_BYTES_PER_DELETION {
                next = Some(key.clone()); // the rest of the page next tick, from this key
                break;
            }
            bytes += key.len();
            expired.push(key.clone());
        }
        self.cursor = match (next, page.last()) {
            (Some(key), _) => Some(key),
            (None, Some((last, _))) if more => Some(successor(last)),
            _ => None, // the pass is over
        };
        Ok(expired)
    }
}

/// The smallest key after `key`.
fn successor(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}

#[cfg(test)]
mod tests {
    use super::successor;

    #[test]
    fn the_successor_sorts_right_after() {
        assert!(successor(b"a").as_slice() > b"a".as_slice());
        assert!(successor(b"a").as_slice() < b"a\x00\x00".as_slice());
        assert!(successor(b"a").as_slice() < b"b".as_slice());
    }
}
