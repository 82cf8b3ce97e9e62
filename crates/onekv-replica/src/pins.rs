//! Read pins: how the log garbage collector learns that no reader still holds a locator into a
//! segment it is about to delete.
//!
//! A reader looks a key up in the index and then reads the value's bytes by locator; between the
//! two the collector may move the value and point the key elsewhere. So every reader that resolves
//! locators pins the current epoch **before** its index lookup and unpins after its last read of
//! value bytes (a get, a scan page, a scrub page, a whole snapshot build). The collector, once the
//! moved values' new locators are published, starts a new epoch and waits until no pin of an
//! older epoch remains: every reader left saw the new locators.
//!
//! This module does not know about segments or the index; it is a counter of readers per epoch.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The node's read pins (one per node: the collector works across shards).
#[derive(Default)]
pub(crate) struct ReadPins {
    inner: Mutex<Epochs>,
    released: Condvar,
}

#[derive(Default)]
struct Epochs {
    current: u64,
    /// Epoch -> readers pinned in it.
    active: BTreeMap<u64, usize>,
}

/// A reader's pin; unpins on drop.
pub(crate) struct Pin {
    pins: Arc<ReadPins>,
    epoch: u64,
}

impl ReadPins {
    fn lock(&self) -> MutexGuard<'_, Epochs> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pins the current epoch; hold the pin from before the index lookup until the last value read.
    pub fn pin(self: &Arc<Self>) -> Pin {
        let mut inner = self.lock();
        let epoch = inner.current;
        *inner.active.entry(epoch).or_insert(0) += 1;
        Pin { pins: self.clone(), epoch }
    }

    /// Starts a new epoch and waits until every pin taken before it is released; `false` if some
    /// are still held after `timeout` (a long snapshot build: the caller tries again later).
    pub fn wait_for_earlier_readers(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut inner = self.lock();
        inner.current += 1;
        let barrier = inner.current;
        loop {
            if inner.active.range(..barrier).next().is_none() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            inner = self.released.wait_timeout(inner, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut inner = self.pins.lock();
        if let Some(count) = inner.active.get_mut(&self.epoch) {
            *count -= 1;
            if *count == 0 {
                inner.active.remove(&self.epoch);
                self.pins.released.notify_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_readers_pinned_before_and_not_after() {
        let pins = Arc::new(ReadPins::default());
        let before = pins.pin();
        assert!(!pins.wait_for_earlier_readers(Duration::from_millis(20)), "a pin from before is held");
        let after = pins.pin();
        let waiter = {
            let pins = pins.clone();
            std::thread::spawn(move || pins.wait_for_earlier_readers(Duration::from_secs(10)))
        };
        std::thread::sleep(Duration::from_millis(20));
        drop(before);
        // `after` was pinned in the first waiter's epoch, which is before the second waiter's.
        drop(after);
        assert!(waiter.join().unwrap());
        let late = pins.pin();
        // A pin taken after the barrier does not hold up a wait that started before it... but a
        // new wait starts a new epoch, which this pin is older than.
        assert!(!pins.wait_for_earlier_readers(Duration::from_millis(10)));
        drop(late);
        assert!(pins.wait_for_earlier_readers(Duration::from_millis(10)));
    }
}
