//! The background scrub: a thread that reads every stored value of the shard at a bounded rate
//! and verifies its checksum, so damage on disk is found (logged, counted) before a client read or
//! a snapshot build runs into it.
//!
//! A pass walks the shard's keys in order, a page at a time, each page through a consistent view
//! of the tree ([`onekv_index::TreeSnapshot`]). A view is taken per page rather than per pass: a
//! pass over a large shard takes hours at a modest rate, and a view held that long would keep the
//! index from dropping overwritten versions. A key written during a pass is verified at whichever
//! version the page's view saw; every value that was stored before the pass began and is still
//! current when its page is read gets verified.
//!
//! Reads are paced to `bytes_per_sec` (value bytes, plus key bytes and a fixed cost per key, so a
//! shard of many small values is paced too); the next pass starts no sooner than
//! [`MIN_PASS_INTERVAL`] after the previous one started. What a damaged value does is `state`'s
//! job (it logs and counts each one once); this module counts per pass for status.
//!
//! Inline values (classic mode) live in the index, whose own checksums guard them: only values a
//! locator points at are read here.

use crate::ScrubStatus;
use crate::state::State;
use crate::{ReplicaError, StorageMode};
use onekv_index::IndexValue;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Keys read per page (one view of the tree per page).
const PAGE: usize = 256;

/// Bytes charged per key on top of its key and value bytes: the index lookup's cost.
const PER_KEY_COST: u64 = 64;

/// The shortest time between the starts of two passes (a small shard is not re-read in a loop).
pub(crate) const MIN_PASS_INTERVAL: Duration = Duration::from_secs(1);

/// The scrub sleeps only once it is at least this far ahead of its rate, so it reads in bursts of
/// about this much of its budget and wakes a few times a second, rather than sleeping after every
/// key: at 1 KiB values a per-key sleep was hundreds of thread wake-ups per second per shard, which
/// cost the node more CPU than the reads themselves (`docs/benchmarks/profile.md`). The rate is
/// unchanged: what a pass read ahead of it is slept off before the next pass.
const PACING_QUANTUM: Duration = Duration::from_millis(250);

/// What the scrub thread and its handle share.
struct Shared {
    status: Mutex<ScrubStatus>,
    stop: AtomicBool,
    /// Signalled on stop, so a paced wait ends at once.
    wake: Condvar,
    sleeping: Mutex<()>,
}

/// The handle on a replica's scrub thread; stopping or dropping it ends the thread.
pub(crate) struct Scrub {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Scrub {
    /// Starts scrubbing `state` at `bytes_per_sec`; 0 (or `enabled` false) starts nothing and
    /// status says the scrub is off.
    pub fn start(state: Arc<State>, bytes_per_sec: u64, enabled: bool) -> Result<Scrub, String> {
        let run = enabled && bytes_per_sec > 0 && state.mode != StorageMode::Classic;
        let shared = Arc::new(Shared {
            status: Mutex::new(ScrubStatus { enabled: run, ..ScrubStatus::default() }),
            stop: AtomicBool::new(false),
            wake: Condvar::new(),
            sleeping: Mutex::new(()),
        });
        if !run {
            return Ok(Scrub { shared, thread: None });
        }
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("onekv-scrub".into())
            .spawn(move || Scrubber { state, shared: worker, bytes_per_sec }.run())
            .map_err(|e| format!("starting the scrub thread: {e}"))?;
        Ok(Scrub { shared, thread: Some(thread) })
    }

    /// The scrub's progress so far.
    pub fn status(&self) -> ScrubStatus {
        self.shared.status.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Ends the thread (within one value's read) and waits for it.
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _guard = self.shared.sleeping.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the scrub thread panicked");
        }
    }
}

impl Drop for Scrub {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The scrub thread's own state.
struct Scrubber {
    state: Arc<State>,
    shared: Arc<Shared>,
    bytes_per_sec: u64,
}

/// Why a pass ended early.
struct Stopped;

impl Scrubber {
    fn run(self) {
        loop {
            let started = Instant::now();
            let mut next = started + MIN_PASS_INTERVAL;
            match self.pass() {
                Ok((values, corrupt, due)) => {
                    // What the pass read ahead of its rate (less than a quantum) is slept off too.
                    next = next.max(due);
                    let finished_ms = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64);
                    let mut status = self.shared.status.lock().unwrap_or_else(|e| e.into_inner());
                    status.passes += 1;
                    status.last_pass_finished_unix_ms = finished_ms;
                    status.last_pass_values = values;
                    status.last_pass_corrupt = corrupt;
                    drop(status);
                    if corrupt > 0 {
                        tracing::error!(values, corrupt, "scrub pass finished: damaged values found");
                    } else {
                        tracing::debug!(values, "scrub pass finished");
                    }
                }
                Err(Stopped) => return,
            }
            if self.sleep_until(next).is_err() {
                return;
            }
        }
    }

    /// One pass over every key; returns the values verified, how many were damaged, and when the
    /// rate allows the next read.
    fn pass(&self) -> Result<(u64, u64, Instant), Stopped> {
        let started = Instant::now();
        let mut charged = 0u64;
        let (mut values, mut corrupt) = (0u64, 0u64);
        let mut start: Vec<u8> = Vec::new();
        let mut first = true;
        let due =
            |charged: u64| started + Duration::from_secs_f64(charged as f64 / self.bytes_per_sec as f64);
        loop {
            self.check_stop()?;
            // A short-lived view per page (see the module documentation), pinned until the page's
            // values are read so the log GC keeps them.
            let _pin = self.state.pins.pin();
            let view = self.state.tree.snapshot();
            let (page, more) = match view.range(&start, None, PAGE + 1, false) {
                Ok(found) => found,
                Err(error) => {
                    // The index failing is the loop's to report; the scrub tries again next pass.
                    tracing::warn!(%error, "the scrub cannot read the index; pass abandoned");
                    return Ok((values, corrupt, due(charged)));
                }
            };
            drop(view);
            let mut last_key = None;
            // Pages after the first start at the previous page's last key, already verified.
            for (key, stored) in page.iter().skip(usize::from(!first)).take(PAGE) {
                self.check_stop()?;
                charged += PER_KEY_COST + key.len() as u64;
                // Values in the log (by locator, or in a compressed block): read and checked.
                if let Some(at) = IndexValue::decode(stored).ok().and_then(|value| value.log_bytes()) {
                    charged += at.len;
                    values += 1;
                    match self.state.resolve(key, stored) {
                        Ok(_) => {}
                        Err(ReplicaError::Corrupt { .. }) => corrupt += 1,
                        // Not damage: e.g. the key was overwritten and its old bytes reclaimed
                        // since the view was taken.
                        Err(error) => tracing::debug!(%error, "the scrub skipped a value it could not read"),
                    }
                    self.shared.status.lock().unwrap_or_else(|e| e.into_inner()).values_checked += 1;
                }
                last_key = Some(key);
                // Pace: `charged` bytes may take no less than charged / rate seconds.
                let allowed = due(charged);
                if allowed >= Instant::now() + PACING_QUANTUM {
                    self.sleep_until(allowed)?;
                }
            }
            match last_key {
                Some(key) if more || page.len() > PAGE => {
                    start = key.clone();
                    first = false;
                }
                _ => return Ok((values, corrupt, due(charged))),
            }
        }
    }

    fn check_stop(&self) -> Result<(), Stopped> {
        if self.shared.stop.load(Ordering::SeqCst) { Err(Stopped) } else { Ok(()) }
    }

    /// Waits until `at`, or until stopped.
    fn sleep_until(&self, at: Instant) -> Result<(), Stopped> {
        let mut guard = self.shared.sleeping.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            self.check_stop()?;
            let now = Instant::now();
            if now >= at {
                return Ok(());
            }
            guard = self.shared.wake.wait_timeout(guard, at - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}
