//! The snapshots a leader sends to followers that fell behind its Raft log, and the views another
//! replica serves such a follower in the leader's stead (`SnapshotBuilder::serve_for`).
//!
//! raft-rs asks its storage for a snapshot synchronously, on the loop thread, every time it wants
//! to send one (at every heartbeat answer of a follower that needs one). A running node answers at
//! once with a snapshot that holds no data, only a marker: it takes a consistent view of the tree
//! at the applied index ([`onekv_index::TreeSnapshot`], which also holds the request-id window)
//! and serves it in chunks to the followers that fetch it ([`stream`], [`fetch`]), however large
//! the state. The view is kept while raft-rs still asks for it or a follower fetched from it
//! within [`stream::KEEP_WHILE_FETCHED`].
//!
//! In a simulation (driven mode) there is no thread to fetch on: the snapshot is built inline, all
//! its pairs in the message, bounded by `max_snapshot_bytes`, so what happens stays a function of
//! the seed. A build that fails (the state is over the bound, or a value is damaged) is retried
//! only after a backoff that doubles up to [`MAX_BACKOFF`].
//!
//! This module does not send snapshots (raft-rs and the transport do) or turn their pairs into
//! index entries (`apply`); [`install`] runs that rebuild off the loop.

mod copies;
pub(crate) use copies::CopiesBudget;
pub(crate) mod fetch;
pub(crate) mod install;
pub(crate) mod stream;

use crate::records;
use crate::state::State;
use onekv_index::TreeSnapshot;
use raft::StorageError;
use raft::eraftpb::{ConfState, Snapshot};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
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
    /// A streamed snapshot and the view it serves (`failures`: of the views before it).
    Serving {
        snapshot: Snapshot,
        served: Arc<stream::Served>,
        failures: u32,
    },
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
    /// Whether snapshots are streamed (false: built inline, whole, for the simulation).
    streamed: bool,
    slot: Arc<Mutex<Slot>>,
    cancel: Arc<AtomicBool>,
}

impl SnapshotBuilder {
    pub fn new(state: Arc<State>, max_bytes: usize, streamed: bool) -> Self {
        SnapshotBuilder {
            state,
            max_bytes,
            streamed,
            slot: Arc::new(Mutex::new(Slot::Idle)),
            cancel: Arc::new(AtomicBool::new(false)),
        }
    }

    /// What raft-rs gets when it asks for a snapshot for follower `to`: one still usable (the
    /// leader still serves the entries that follow it, and `to` is among its members: raft-rs on
    /// the follower refuses a snapshot from before it was added), or "temporarily unavailable"
    /// while a failed inline build waits out its backoff or until this replica has applied
    /// `at_least` (for a follower that asked for a snapshot: `RaftStore::snapshot`; 0 otherwise).
    pub fn request(
        &mut self,
        applied: (u64, u64),
        conf_state: &ConfState,
        first_index: u64,
        to: u64,
        now: Instant,
        at_least: u64,
    ) -> raft::Result<Snapshot> {
        let unavailable = Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        if applied.0 < at_least {
            return unavailable;
        }
        let mut failures = 0;
        let mut slot = lock(&self.slot);
        // A view replaced since by one made for a follower in the leader's stead (`serve_for`,
        // while this replica did not lead) is not served any more.
        if let Slot::Serving { served, .. } = &*slot
            && !lock_served(&self.state).as_ref().is_some_and(|current| Arc::ptr_eq(current, served))
        {
            *slot = Slot::Idle;
        }
        // A view that met a damaged value is dropped; a new one is served after a backoff (by
        // then the damage is usually repaired from another replica).
        if let Slot::Serving { served, failures, .. } = &*slot
            && let Some(error) = served.failure()
        {
            *slot = Slot::Failed { index: served.index, error, failures: failures + 1, retry_at: None };
            *lock_served(&self.state) = None;
        }
        match &mut *slot {
            // A follower that installs it catches up from the entry after it.
            Slot::Ready(snapshot) | Slot::Serving { snapshot, .. }
                if snapshot.get_metadata().index + 1 >= first_index
                    && snapshot.get_metadata().index >= at_least
                    && crate::membership::is_member(snapshot.get_metadata().get_conf_state(), to) =>
            {
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
            Slot::Ready(_) | Slot::Serving { .. } | Slot::Idle => {}
        }
        let (pin, view, metadata) = self.view_at(applied, conf_state);
        if self.streamed {
            let served = Arc::new(stream::Served::new(self.state.clone(), pin, view, metadata.clone(), None));
            *lock_served(&self.state) = Some(served.clone());
            let mut snapshot = Snapshot { data: stream::STREAMED.to_vec().into(), ..Default::default() };
            snapshot.set_metadata(metadata);
            tracing::info!(index = applied.0, "serving a snapshot to stream");
            *slot = Slot::Serving { snapshot: snapshot.clone(), served, failures };
            return Ok(snapshot);
        }
        *slot = Slot::Building { index: applied.0 };
        drop(slot);
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
        job.run();
        match &*lock(&self.slot) {
            Slot::Ready(snapshot) => Ok(snapshot.clone()),
            _ => unavailable,
        }
    }

    /// The view this replica serves follower `asked_by`, which asked it rather than the leader
    /// for a snapshot at `at_least` or later ([`crate::ChunkRequest::any_view`]): the view it
    /// serves already if that is recent enough, otherwise a new one at `applied` (the loop calls
    /// this between turns, when the tree holds exactly what is applied). A leader answers only
    /// with the view it serves already (the one its snapshot messages name); refused by a replica
    /// behind `at_least`, and while another follower still fetches an older view here.
    pub fn serve_for(
        &mut self,
        applied: (u64, u64),
        conf_state: &ConfState,
        at_least: u64,
        asked_by: u64,
        leader: bool,
        now: Instant,
    ) -> Result<Arc<stream::Served>, String> {
        let serving = lock_served(&self.state).clone();
        if let Some(served) = serving.filter(|served| served.failure().is_none()) {
            if served.index >= at_least {
                return Ok(served);
            }
            // One view per shard: an older one goes only once no other follower fetches from it.
            let in_use = now
                .checked_sub(stream::KEEP_WHILE_FETCHED)
                .is_some_and(|since| served.fetched_by_others_since(asked_by, since));
            if leader || in_use {
                return Err(format!("this replica serves a snapshot at index {} already", served.index));
            }
        }
        if leader {
            return Err("the leader serves only the snapshots it sends".into());
        }
        if applied.0 < at_least {
            return Err(format!("this replica has applied up to {}, not {at_least}", applied.0));
        }
        if !crate::membership::is_member(conf_state, asked_by) {
            return Err(format!("node {asked_by} is not a member as of index {}", applied.0));
        }
        let (pin, view, metadata) = self.view_at(applied, conf_state);
        let served = Arc::new(stream::Served::new(self.state.clone(), pin, view, metadata, Some(asked_by)));
        *lock_served(&self.state) = Some(served.clone());
        // A view this replica served as leader is gone with it (`request` starts afresh).
        *lock(&self.slot) = Slot::Idle;
        tracing::info!(index = applied.0, for_node = asked_by, "serving a snapshot in the leader's stead");
        Ok(served)
    }

    /// A consistent view of the tree at `applied` (the loop's caller is between turns) and its
    /// snapshot metadata, under a read pin taken first and held as long as the view is used: the
    /// log GC keeps every value the view points at.
    fn view_at(
        &self,
        applied: (u64, u64),
        conf_state: &ConfState,
    ) -> (crate::pins::Pin, TreeSnapshot, raft::eraftpb::SnapshotMetadata) {
        let pin = self.state.pins.pin();
        let view = self.state.tree.snapshot();
        let mut metadata =
            raft::eraftpb::SnapshotMetadata { index: applied.0, term: applied.1, ..Default::default() };
        metadata.set_conf_state(conf_state.clone());
        (pin, view, metadata)
    }

    /// Drops a snapshot nobody needs any more (an inline one's bytes are held in memory, a
    /// streamed one's view pins the log), unless a follower fetched from it within
    /// [`stream::KEEP_WHILE_FETCHED`] before `now`.
    pub fn release(&mut self, now: Instant) {
        if self.fetch_floor(now).is_some() {
            return;
        }
        let mut slot = lock(&self.slot);
        if matches!(*slot, Slot::Ready(_) | Slot::Serving { .. }) {
            *slot = Slot::Idle;
        }
        *lock_served(&self.state) = None;
    }

    /// On a leader: drops a served view nobody fetched from for [`stream::KEEP_WHILE_FETCHED`],
    /// even while raft-rs still wants to send a snapshot (a follower that is down): the view's pin
    /// would hold the log GC back for as long. The next request serves a new view. (On other
    /// replicas `release` drops the views they made, once unfetched as long.)
    pub fn drop_idle(&mut self, now: Instant) {
        let mut slot = lock(&self.slot);
        if let Slot::Serving { served, .. } = &*slot
            && served.idle(now)
        {
            *slot = Slot::Idle;
            *lock_served(&self.state) = None;
        }
    }

    /// The index of the snapshot a follower fetched from within [`stream::KEEP_WHILE_FETCHED`]
    /// before `now`: the Raft log keeps the entries after it, so that follower can go on from it.
    pub fn fetch_floor(&self, now: Instant) -> Option<u64> {
        let since = now.checked_sub(stream::KEEP_WHILE_FETCHED)?;
        lock_served(&self.state)
            .as_ref()
            .filter(|served| served.failure().is_none() && served.fetched_since(None, since))
            .map(|served| served.index)
    }

    /// Whether `follower` fetched a chunk of the served snapshot at or after `since`.
    pub fn fetched_by(&self, follower: u64, since: Instant) -> bool {
        lock_served(&self.state).as_ref().is_some_and(|served| served.fetched_since(Some(follower), since))
    }

    /// What the builder is doing, for status: `None` when idle.
    pub fn describe(&self) -> Option<String> {
        match &*lock(&self.slot) {
            // A view made for a follower that asked this replica instead of the leader.
            Slot::Idle => lock_served(&self.state).as_ref().map(|served| match served.failure() {
                Some(error) => format!("serving a snapshot at index {} failed: {error}", served.index),
                None => {
                    format!("serving a snapshot at index {} in chunks, in the leader's stead", served.index)
                }
            }),
            Slot::Building { index } => Some(format!("building a snapshot at index {index}")),
            Slot::Serving { served, .. } => Some(match served.failure() {
                Some(error) => format!("serving a snapshot at index {} failed: {error}", served.index),
                None => format!("serving a snapshot at index {} in chunks", served.index),
            }),
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

    /// Stops a build in progress and stops serving.
    pub fn stop(&mut self) {
        self.cancel.store(true, Ordering::SeqCst);
        *lock_served(&self.state) = None;
    }
}

impl Drop for SnapshotBuilder {
    fn drop(&mut self) {
        self.stop();
    }
}

fn lock_served(state: &State) -> MutexGuard<'_, Option<Arc<stream::Served>>> {
    state.served.lock().unwrap_or_else(|e| e.into_inner())
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
    /// A copy several keys share is sent once (the others refer to the first key), as a streamed
    /// snapshot's chunks do for a follower that asks, when this replica (so, in a simulation,
    /// every replica) keeps its values in the one log.
    fn pairs(&self) -> Result<Vec<u8>, String> {
        let copies = (self.state.mode == crate::StorageMode::OneLog)
            .then(|| copies::SentCopies::new(self.state.dedup.clone(), self.state.copies_budget.clone()));
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
                let value = || self.state.resolve(key, stored).map_err(|e| e.to_string());
                match &copies {
                    Some(copies) => copies::push_pair(&mut out, copies, key, stored, value)?,
                    None => records::push_expiring_pair(
                        &mut out,
                        key,
                        onekv_index::stored_expiry(stored),
                        &value()?,
                    ),
                }
                if out.len() > self.max_bytes {
                    return Err(format!(
                        "the state exceeds max_snapshot_bytes = {} (a simulation sends snapshots whole)",
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
