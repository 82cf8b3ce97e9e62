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
//! Bounded: at most [`MAX_KEY_BYTES`] of keys are remembered per view; past that, copies not yet
//! remembered are sent whole (correct, only larger).
//!
//! This module does not read values or build chunks (`stream`, the inline builder in `mod.rs`).

use crate::dedup::Dedup;
use crate::records;
use onekv_index::IndexValue;
use onekv_log::Locator;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Bytes of remembered keys (and their places) per view.
pub(crate) const MAX_KEY_BYTES: usize = 16 << 20;

/// Bookkeeping bytes per remembered copy besides its key (the place and the map's overhead).
const ENTRY_OVERHEAD: usize = 64;

/// Values smaller than this (stored: checksum and bytes) are always sent whole: a reference would
/// save little next to the key it names.
const MIN_STORED_BYTES: u64 = 64;

/// The copies one view sent, by their place in the sender's log. Shared by the followers reading
/// the view (each lookup holds the lock briefly, never across a read of a value).
pub(crate) struct SentCopies {
    remembered: Mutex<Remembered>,
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
    pub fn new(dedup: Option<Arc<Dedup>>) -> Self {
        SentCopies { remembered: Mutex::default(), dedup }
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
        let place = match value {
            IndexValue::Shared(place) => place,
            IndexValue::Locator(place)
                if self.dedup.as_ref().is_some_and(|dedup| dedup.is_candidate(place.len as usize)) =>
            {
                place
            }
            _ => return,
        };
        let remembered = &mut *self.remembered();
        if place.len < MIN_STORED_BYTES || remembered.bytes + key.len() + ENTRY_OVERHEAD > MAX_KEY_BYTES {
            return;
        }
        // Views are read in key order, but several followers may read one view at different
        // points: keep the earliest key, which is usable by the most.
        match remembered.by_place.get_mut(&place) {
            Some(earlier) if earlier.as_slice() <= key => {}
            Some(earlier) => {
                remembered.bytes = remembered.bytes - earlier.len() + key.len();
                *earlier = key.to_vec();
            }
            None => {
                remembered.bytes += key.len() + ENTRY_OVERHEAD;
                remembered.by_place.insert(place, key.to_vec());
            }
        }
    }
}

/// The place of the copy a stored index value points at, if it is one keys may share.
fn shareable_place(stored: &[u8]) -> Option<Locator> {
    match IndexValue::decode(stored).ok()? {
        IndexValue::Shared(place) | IndexValue::Locator(place) if place.len >= MIN_STORED_BYTES => {
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
        let copies = SentCopies::new(None);
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
    fn remembered_keys_are_bounded_in_bytes() {
        let copies = SentCopies::new(None);
        let key = vec![7u8; 1 << 10];
        let fit = MAX_KEY_BYTES / (key.len() + ENTRY_OVERHEAD);
        for position in 0..fit as u64 + 10 {
            let mut key = key.clone();
            key.extend_from_slice(&position.to_be_bytes());
            copies.sent(&key, &shared(position));
        }
        let remembered = copies.remembered().by_place.len();
        assert!(copies.remembered().bytes <= MAX_KEY_BYTES);
        assert!(remembered < fit, "{remembered}");
        let last = fit as u64 + 5;
        assert_eq!(copies.same_as(&[0xff], &shared(last)), None, "past the bound, not remembered");
        assert!(copies.same_as(&[0xff], &shared(0)).is_some());
    }
}
