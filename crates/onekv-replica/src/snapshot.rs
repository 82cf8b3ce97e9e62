//! Building the snapshots a leader sends to followers that fell behind its Raft log: off the node
//! loop, bounded in size, and with a backoff after a failure.
//!
//! raft-rs asks its storage for a snapshot synchronously, on the loop thread, every time it wants
//! to send one (at every heartbeat answer of a follower that needs one). Building means reading
//! every key and value, so it must not happen there: the first request starts a build on a thread
//! of its own over a consistent view of the tree ([`onekv_index::TreeSnapshot`], taken on the loop
//! at the applied index, which also holds the request-id window), and answers "temporarily
//! unavailable"; raft-rs asks again later and gets the finished snapshot. A build that fails (the
//! state is over `max_snapshot_bytes`, or a value is damaged) is retried only after a backoff that
//! doubles up to [`MAX_BACKOFF`], so a node that cannot build one does not spend its time trying.
//!
//! In a simulation (driven mode) the build runs inline, so what happens stays a function of the
//! seed.
//!
//! This module does not send snapshots (raft-rs and the transport do) or install them (`apply`).

use crate::records;
use crate::state::State;
use onekv_index::TreeSnapshot;
use raft::StorageError;
use raft::eraftpb::{ConfState, Snapshot};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The first wait after a failed build.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// The longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Keys read per page while building.
const PAGE: usize = 1024;

/// Where the snapshot a leader serves stands.
enum Slot {
    Idle,
    Building {
        index: u64,
    },
    Ready(Snapshot),
    Failed {
        index: u64,
        error: String,
        failures: u32,
        /// Set by the first request after the failure was seen (the loop's clock).
        retry_at: Option<Instant>,
    },
}

/// The snapshot builder of one group.
pub(crate) struct SnapshotBuilder {
    state: Arc<State>,
    max_bytes: usize,
    /// Whether builds run on a thread of their own (false: inline, for the simulation).
    threaded: bool,
    slot: Arc<Mutex<Slot>>,
    cancel: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl SnapshotBuilder {
    pub fn new(state: Arc<State>, max_bytes: usize, threaded: bool) -> Self {
        SnapshotBuilder {
            state,
            max_bytes,
            threaded,
            slot: Arc::new(Mutex::new(Slot::Idle)),
            cancel: Arc::new(AtomicBool::new(false)),
            thread: None,
        }
    }

    /// What raft-rs gets when it asks for a snapshot: a finished one that is still usable (the
    /// leader still serves the entries that follow it), or "temporarily unavailable" while one is
    /// built or while a failed build waits out its backoff.
    pub fn request(
        &mut self,
        applied: (u64, u64),
        conf_state: &ConfState,
        first_index: u64,
        now: Instant,
    ) -> raft::Result<Snapshot> {
        let unavailable = Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        let mut failures = 0;
        {
            let mut slot = lock(&self.slot);
            match &mut *slot {
                // A follower that installs it catches up from the entry after it.
                Slot::Ready(snapshot) if snapshot.get_metadata().index + 1 >= first_index => {
                    return Ok(snapshot.clone());
                }
                Slot::Building { .. } => return unavailable,
                Slot::Failed { failures: f, retry_at, .. } => {
                    let at = *retry_at.get_or_insert_with(|| now + backoff(*f));
                    if now < at {
                        return unavailable;
                    }
                    failures = *f;
                }
                Slot::Ready(_) | Slot::Idle => {}
            }
            *slot = Slot::Building { index: applied.0 };
        }
        if let Some(thread) = self.thread.take() {
            // The previous build is over (its slot was not Building); collect its thread.
            let _ = thread.join();
        }
        // Pinned before the view is taken, for the whole build: the log GC keeps every value the
        // view points at until the build ends.
        let pin = self.state.pins.pin();
        let view = self.state.tree.snapshot();
        let mut metadata =
            raft::eraftpb::SnapshotMetadata { index: applied.0, term: applied.1, ..Default::default() };
        metadata.set_conf_state(conf_state.clone());
        let job = Build {
            state: self.state.clone(),
            _pin: pin,
            view,
            metadata,
            max_bytes: self.max_bytes,
            failures,
            slot: self.slot.clone(),
            cancel: self.cancel.clone(),
        };
        if !self.threaded {
            job.run();
            return match &*lock(&self.slot) {
                Slot::Ready(snapshot) => Ok(snapshot.clone()),
                _ => unavailable,
            };
        }
        match std::thread::Builder::new().name("onekv-snapshot".into()).spawn(move || job.run()) {
            Ok(thread) => self.thread = Some(thread),
            Err(e) => {
                *lock(&self.slot) = Slot::Failed {
                    index: applied.0,
                    error: format!("starting the snapshot thread: {e}"),
                    failures: failures + 1,
                    retry_at: None,
                };
            }
        }
        unavailable
    }

    /// Drops a finished snapshot nobody waits for any more (its bytes are held in memory).
    pub fn release(&mut self) {
        let mut slot = lock(&self.slot);
        if matches!(*slot, Slot::Ready(_)) {
            *slot = Slot::Idle;
        }
    }

    /// What the builder is doing, for status: `None` when idle.
    pub fn describe(&self) -> Option<String> {
        match &*lock(&self.slot) {
            Slot::Idle => None,
            Slot::Building { index } => Some(format!("building a snapshot at index {index}")),
            Slot::Ready(snapshot) => Some(format!(
                "snapshot at index {} ready ({} bytes)",
                snapshot.get_metadata().index,
                snapshot.data.len()
            )),
            Slot::Failed { index, error, failures, .. } => Some(format!(
                "building a snapshot at index {index} failed {failures} time(s): {error}; retrying after a backoff"
            )),
        }
    }

    /// Stops a build in progress and waits for its thread.
    pub fn stop(&mut self) {
        self.cancel.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for SnapshotBuilder {
    fn drop(&mut self) {
        self.stop();
    }
}

fn backoff(failures: u32) -> Duration {
    FIRST_BACKOFF.saturating_mul(1 << failures.saturating_sub(1).min(6)).min(MAX_BACKOFF)
}

fn lock(slot: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    slot.lock().unwrap_or_else(|e| e.into_inner())
}

/// One build, owned by the thread that runs it.
struct Build {
    state: Arc<State>,
    /// Held for the whole build (see `pins`).
    _pin: crate::pins::Pin,
    view: TreeSnapshot,
    metadata: raft::eraftpb::SnapshotMetadata,
    max_bytes: usize,
    failures: u32,
    slot: Arc<Mutex<Slot>>,
    cancel: Arc<AtomicBool>,
}

impl Build {
    fn run(self) {
        let index = self.metadata.index;
        let started = Instant::now();
        let result = self.pairs();
        let next = match result {
            Ok(data) => {
                tracing::info!(
                    index,
                    bytes = data.len(),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "built a snapshot"
                );
                let mut snapshot = Snapshot { data: data.into(), ..Default::default() };
                snapshot.set_metadata(self.metadata);
                Slot::Ready(snapshot)
            }
            Err(error) => {
                tracing::warn!(index, %error, failures = self.failures + 1, "cannot build a snapshot");
                Slot::Failed { index, error, failures: self.failures + 1, retry_at: None }
            }
        };
        *lock(&self.slot) = next;
    }

    /// Every key and value of the view, then the request-id window, in the snapshot-pairs format.
    fn pairs(&self) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        let mut start: Vec<u8> = Vec::new();
        let mut first = true;
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                return Err("the replica is stopping".into());
            }
            let (page, more) =
                self.view.range(&start, None, PAGE + 1, false).map_err(|e| format!("index scan: {e}"))?;
            let mut last_key = None;
            for (key, stored) in page.iter().skip(usize::from(!first)).take(PAGE) {
                let value = self.state.resolve(key, stored).map_err(|e| e.to_string())?;
                records::push_snapshot_pair(&mut out, key, &value);
                if out.len() > self.max_bytes {
                    return Err(format!(
                        "the state exceeds max_snapshot_bytes = {} (streaming snapshots are not built yet)",
                        self.max_bytes
                    ));
                }
                last_key = Some(key.clone());
            }
            match last_key {
                Some(key) if more || page.len() > PAGE => {
                    start = key;
                    first = false;
                }
                _ => break,
            }
        }
        // The request-id window travels as pairs with the empty key (user keys are never empty).
        let ids = crate::requests::ids_per_pair(crate::records::chunk_bytes(
            self.state.raft_log.config().max_record_bytes,
        ));
        for pair in crate::requests::snapshot_pairs(&self.view, ids).map_err(|e| e.to_string())? {
            records::push_snapshot_pair(&mut out, b"", &pair);
        }
        if out.len() > self.max_bytes {
            return Err(format!("the state exceeds max_snapshot_bytes = {}", self.max_bytes));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_a_minute() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(4), Duration::from_secs(8));
        assert_eq!(backoff(30), MAX_BACKOFF);
    }
}
