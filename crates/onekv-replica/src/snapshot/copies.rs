//! Which copies of values a snapshot view has sent already, and under which keys, so that a later
//! key pointing at the same copy (a deduplicated key, [`IndexValue::Shared`]) is sent as a
//! reference to that earlier key ([`records::push_reference_pair`]) instead of the value again: a
//! snapshot sends each copy it holds once, and the receiver's keys share one copy as the sender's
//! do (`apply::install_snapshot` resolves the references).
//!
//! A reference is only ever made to a key that sorts before the key sent as a reference. The
//! receiver then holds it: it holds every key of the view before the cursor it asked from, and
//! every key of the chunk before this one. That holds even when a fetch resumes from another
//! replica: every replica's state at one applied index holds the same keys (expired keys included:
//! they are deleted through the log, `expiry`), and a view is read whole, expired keys included.
//! The referring key keeps its own expiry; the one it names lends only its copy.
//!
//! Bounded per node ([`CopiesBudget`], [`MAX_NODE_BYTES`] for all the views it serves): a copy
//! some key already shares is remembered while the budget lasts, a key's own copy (with
//! deduplication on, one that may be shared by a later key) only while less than half is used;
//! past that, copies not remembered are sent whole (correct, only larger).
//!
//! This module does not read values or build chunks (`stream`, the inline builder in `mod.rs`).

use crate::dedup::Dedup;
use crate::records;
use onekv_index::IndexValue;
use onekv_log::Locator;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Bytes all the views one node serves may use to remember copies.
pub(crate) const MAX_NODE_BYTES: usize = 64 << 20;

/// Bytes per remembered copy besides its key bytes: the place and the key's vector in the map
/// (at up to twice their size while it grows), and the key's allocation.
const ENTRY_OVERHEAD: usize = 112;

/// What the snapshot views of one node use to remember copies, together.
#[derive(Default)]
pub(crate) struct CopiesBudget {
    used: AtomicUsize,
}

impl CopiesBudget {
    /// Takes `bytes` if that leaves the total at most `limit`.
    fn take(&self, bytes: usize, limit: usize) -> bool {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                (used + bytes <= limit).then_some(used + bytes)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::SeqCst);
    }
}

/// Values smaller than this (stored: checksum and bytes) are always sent whole: a reference would
/// save little next to the key it names.
const MIN_STORED_BYTES: u64 = 64;

/// Whether a key sent with a stored value of `stored_len` bytes (checksum and bytes) may be named
/// by a later reference: what a follower remembers to check references against.
pub(crate) fn may_be_referred_to(stored_len: usize) -> bool {
    stored_len as u64 >= MIN_STORED_BYTES
}

/// The copies one view sent, by their place in the sender's log. Shared by the followers reading
/// the view (each lookup holds the lock briefly, never across a read of a value).
pub(crate) struct SentCopies {
    remembered: Mutex<Remembered>,
    budget: Arc<CopiesBudget>,
    /// With deduplication on, a key's own copy may be shared by keys after it, so its place is
    /// remembered too (when the value is large enough to share). Without it, only copies some
    /// key already shares are remembered.
    dedup: Option<Arc<Dedup>>,
}

#[derive(Default)]
struct Remembered {
    by_place: HashMap<Locator, Vec<u8>>,
    bytes: usize,
}

impl SentCopies {
    pub fn new(dedup: Option<Arc<Dedup>>, budget: Arc<CopiesBudget>) -> Self {
        SentCopies { remembered: Mutex::default(), budget, dedup }
    }

    fn remembered(&self) -> MutexGuard<'_, Remembered> {
        self.remembered.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The earlier key whose value `key` (stored in the index as `stored`) should be sent as a
    /// reference to, if the view sent that copy before under such a key.
    pub fn same_as(&self, key: &[u8], stored: &[u8]) -> Option<Vec<u8>> {
        let place = shareable_place(stored)?;
        self.remembered().by_place.get(&place).filter(|earlier| earlier.as_slice() < key).cloned()
    }

    /// Notes that `key` was sent with its value (stored in the index as `stored`).
    pub fn sent(&self, key: &[u8], stored: &[u8]) {
        let Ok(value) = IndexValue::decode(stored) else { return };
        // A copy a key shares already is likely shared by more; a key's own copy may never be.
        let (place, limit) = match value {
            IndexValue::Shared(place) => (place, MAX_NODE_BYTES),
            IndexValue::Locator(place)
                if self.dedup.as_ref().is_some_and(|dedup| dedup.is_candidate(place.len as usize)) =>
            {
                (place, MAX_NODE_BYTES / 2)
            }
            _ => return,
        };
        if !may_be_referred_to(place.len as usize) {
            return;
        }
        let remembered = &mut *self.remembered();
        // Views are read in key order, but several followers may read one view at different
        // points: keep the earliest key, which is usable by the most.
        match remembered.by_place.get_mut(&place) {
            Some(earlier) if earlier.as_slice() <= key => {}
            Some(earlier) => {
                if key.len() > earlier.len() && !self.budget.take(key.len() - earlier.len(), MAX_NODE_BYTES) {
                    return;
                }
                self.budget.give_back(earlier.len().saturating_sub(key.len()));
                remembered.bytes = remembered.bytes - earlier.len() + key.len();
                *earlier = key.to_vec();
            }
            None => {
                let bytes = key.len() + ENTRY_OVERHEAD;
                if self.budget.take(bytes, limit) {
                    remembered.bytes += bytes;
                    remembered.by_place.insert(place, key.to_vec());
                }
            }
        }
    }
}

impl Drop for SentCopies {
    fn drop(&mut self) {
        self.budget.give_back(self.remembered().bytes);
    }
}

/// The place of the copy a stored index value points at, if it is one keys may share.
fn shareable_place(stored: &[u8]) -> Option<Locator> {
    match IndexValue::decode(stored).ok()? {
        IndexValue::Shared(place) | IndexValue::Locator(place) if may_be_referred_to(place.len as usize) => {
            Some(place)
        }
        _ => None,
    }
}

/// Appends `key` to snapshot pairs `out`: as a reference if `copies` sent its copy before, else
/// with its value (read by `value`), noting it in `copies`.
pub(crate) fn push_pair<E>(
    out: &mut Vec<u8>,
    copies: &SentCopies,
    key: &[u8],
    stored: &[u8],
    value: impl FnOnce() -> Result<Vec<u8>, E>,
) -> Result<(), E> {
    let expiry = onekv_index::stored_expiry(stored);
    if let Some(same_as) = copies.same_as(key, stored) {
        records::push_reference_pair(out, key, expiry, &same_as);
        return Ok(());
    }
    records::push_expiring_pair(out, key, expiry, &value()?);
    copies.sent(key, stored);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(position: u64) -> Vec<u8> {
        IndexValue::Shared(Locator { position, len: 100 }).encode()
    }

    fn own(position: u64) -> Vec<u8> {
        IndexValue::Locator(Locator { position, len: 100 }).encode()
    }

    #[test]
    fn a_shared_copy_is_sent_once_and_referred_to_by_later_keys_only() {
        let copies = SentCopies::new(None, Arc::default());
        assert_eq!(copies.same_as(b"b", &shared(1)), None);
        copies.sent(b"b", &shared(1));
        assert_eq!(copies.same_as(b"c", &shared(1)), Some(b"b".to_vec()));
        assert_eq!(copies.same_as(b"c", &own(1)), Some(b"b".to_vec()), "the owner of the copy too");
        assert_eq!(copies.same_as(b"a", &shared(1)), None, "a key before it: the receiver may lack b");
        assert_eq!(copies.same_as(b"c", &shared(2)), None);
        // Without deduplication, a key's own copy is not remembered: nothing shares it yet.
        copies.sent(b"d", &own(3));
        assert_eq!(copies.same_as(b"e", &shared(3)), None);
        // A key with an expiry lends its copy like any other (the referring key keeps its own).
        let expiring = IndexValue::Shared(Locator { position: 4, len: 100 }).encode_expiring(Some(1));
        copies.sent(b"f", &expiring);
        assert_eq!(copies.same_as(b"g", &shared(4)), Some(b"f".to_vec()));
        // A follower reading the view from an earlier point: the earliest key is kept.
        copies.sent(b"a", &shared(1));
        assert_eq!(copies.same_as(b"c", &shared(1)), Some(b"a".to_vec()));
        // Small values are always sent whole.
        let small = IndexValue::Shared(Locator { position: 9, len: 10 }).encode();
        copies.sent(b"h", &small);
        assert_eq!(copies.same_as(b"i", &small), None);
    }

    #[test]
    fn remembered_copies_are_bounded_per_node_and_given_back() {
        let budget = Arc::new(CopiesBudget::default());
        let key = |n: u64| {
            let mut key = vec![7u8; 1 << 10];
            key.extend_from_slice(&n.to_be_bytes());
            key
        };
        let per_entry = key(0).len() + ENTRY_OVERHEAD;
        let fit = MAX_NODE_BYTES / per_entry;
        // Two views of one node share the budget.
        let (one, two) = (SentCopies::new(None, budget.clone()), SentCopies::new(None, budget.clone()));
        for n in 0..fit as u64 / 2 + 10 {
            one.sent(&key(n), &shared(n));
            two.sent(&key(n), &shared(1 << 40 | n));
        }
        assert!(budget.used.load(Ordering::SeqCst) <= MAX_NODE_BYTES);
        let remembered = one.remembered().by_place.len() + two.remembered().by_place.len();
        assert!(remembered <= fit && remembered + 2 >= fit, "{remembered} of {fit}");
        let last = fit as u64 / 2 + 5;
        assert!(
            one.same_as(&[0xff], &shared(last)).is_none()
                || two.same_as(&[0xff], &shared(1 << 40 | last)).is_none(),
            "past the bound, not remembered"
        );
        assert!(one.same_as(&[0xff], &shared(0)).is_some());
        drop(one);
        drop(two);
        assert_eq!(budget.used.load(Ordering::SeqCst), 0, "a view gives its bytes back when it ends");

        // With deduplication on, own copies are remembered only while half the budget is free.
        let dedup = Arc::new(Dedup::new(
            crate::DedupConfig { mode: crate::DedupMode::Inline, min_value_bytes: 64, ..Default::default() },
            false,
        ));
        let view = SentCopies::new(Some(dedup), budget.clone());
        for n in 0..fit as u64 {
            view.sent(&key(n), &own(n));
        }
        let used = budget.used.load(Ordering::SeqCst);
        assert!(used <= MAX_NODE_BYTES / 2 && used + per_entry > MAX_NODE_BYTES / 2, "{used}");
        view.sent(&key(u64::MAX), &shared(u64::MAX >> 2));
        assert!(view.same_as(&[0xff], &shared(u64::MAX >> 2)).is_some(), "shared copies take the other half");
    }
}
