//! The published read seqno and the read seqnos of reads still in flight.
//!
//! Seqnos here are lsm-tree *read* seqnos: a read at `r` sees entries with seqno `< r`, so publishing
//! seqno `s` stores `s + 1`, and 0 means nothing was published. The garbage-collection watermark of
//! a flush or compaction must never exceed the read seqno of a read that may still look at the tree;
//! [`ReadTracker::oldest`] gives that bound.
//!
//! A read registers its seqno under the same lock under which [`ReadTracker::oldest`] looks, and
//! loads the published seqno inside it. Since the published seqno only grows, every read that
//! registers after `oldest` returned reads at a seqno at least that large.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

#[derive(Debug, Default)]
pub(crate) struct ReadTracker {
    /// Read seqno of newly starting reads.
    published: AtomicU64,
    /// Read seqno -> number of reads in flight at it.
    in_flight: Mutex<BTreeMap<u64, u32>>,
}

impl ReadTracker {
    pub(crate) fn new(published: u64) -> Self {
        Self { published: AtomicU64::new(published), in_flight: Mutex::default() }
    }

    /// The read seqno new reads get.
    pub(crate) fn published(&self) -> u64 {
        self.published.load(Ordering::Acquire)
    }

    /// Raises the read seqno new reads get. Release pairs with the Acquire in [`ReadTracker::begin`]:
    /// a reader that sees the new value also sees every memtable insert made before it.
    pub(crate) fn publish(&self, read_seqno: u64) {
        self.published.fetch_max(read_seqno, Ordering::AcqRel);
    }

    /// Registers a read at the published seqno.
    pub(crate) fn begin(&self) -> ReadGuard<'_> {
        let mut in_flight = self.lock();
        let seqno = self.published();
        *in_flight.entry(seqno).or_insert(0) += 1;
        ReadGuard { tracker: self, seqno }
    }

    /// Registers a read at `seqno`, which must not be below the published seqno (so the watermark
    /// bound still holds for it).
    pub(crate) fn begin_at(&self, seqno: u64) -> ReadGuard<'_> {
        let mut in_flight = self.lock();
        assert!(seqno >= self.published(), "read at {seqno} is below the published seqno");
        *in_flight.entry(seqno).or_insert(0) += 1;
        ReadGuard { tracker: self, seqno }
    }

    /// Registers a long-lived read at the published seqno without a borrow (a snapshot); the
    /// caller must [`ReadTracker::release`] the returned seqno exactly once.
    pub(crate) fn hold(&self) -> u64 {
        let mut in_flight = self.lock();
        let seqno = self.published();
        *in_flight.entry(seqno).or_insert(0) += 1;
        seqno
    }

    /// Ends a read registered by [`ReadTracker::hold`].
    pub(crate) fn release(&self, seqno: u64) {
        let mut in_flight = self.lock();
        if let Some(count) = in_flight.get_mut(&seqno) {
            *count -= 1;
            if *count == 0 {
                in_flight.remove(&seqno);
            }
        }
    }

    /// The smallest read seqno any current or future read can use.
    pub(crate) fn oldest(&self) -> u64 {
        let in_flight = self.lock();
        let published = self.published();
        in_flight.keys().next().map_or(published, |&oldest| oldest.min(published))
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, u32>> {
        // The map is updated in single statements; a panic elsewhere cannot leave it half-changed.
        self.in_flight.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One registered read; unregisters on drop.
#[derive(Debug)]
pub(crate) struct ReadGuard<'a> {
    tracker: &'a ReadTracker,
    seqno: u64,
}

impl ReadGuard<'_> {
    /// The lsm-tree read seqno of this read.
    pub(crate) fn seqno(&self) -> u64 {
        self.seqno
    }
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        self.tracker.release(self.seqno);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oldest_is_the_minimum_of_in_flight_reads_and_published() {
        let tracker = ReadTracker::new(5);
        assert_eq!(tracker.oldest(), 5);
        let first = tracker.begin();
        assert_eq!(first.seqno(), 5);
        tracker.publish(9);
        tracker.publish(7); // never goes back
        assert_eq!(tracker.published(), 9);
        let second = tracker.begin();
        let third = tracker.begin();
        assert_eq!((second.seqno(), third.seqno()), (9, 9));
        assert_eq!(tracker.oldest(), 5);
        drop(first);
        assert_eq!(tracker.oldest(), 9);
        let explicit = tracker.begin_at(20);
        drop(second);
        assert_eq!(tracker.oldest(), 9, "one read at 9 is still in flight");
        drop(third);
        assert_eq!(tracker.oldest(), 9, "published bounds it");
        drop(explicit);
        assert!(tracker.lock().is_empty());
    }
}
