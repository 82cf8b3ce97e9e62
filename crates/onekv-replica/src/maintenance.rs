//! Index maintenance off the node loop: writing sealed memtables to tables, and compacting.
//!
//! A flush writes a whole memtable and a compaction step can rewrite hundreds of MiB: seconds the
//! loop would otherwise spend without sending heartbeats. So the loop only **seals** a tree (writes
//! its flush flag into the memtable and swaps in a new memtable, in memory) and hands the tree to
//! the maintenance thread, which makes the sealed memtable durable and then runs a compaction step.
//! The tree's flush flag moves only when the table is durable, so recovery never relies on a flush
//! that did not finish. One job at a time: the loop seals again only once the previous job is done.
//!
//! Each tree is compacted towards the [`Layout`] the loop names with it (leveled for a shard this
//! node serves, sorted runs for one it only follows: `IndexLayout`). A job may also be compaction
//! alone ([`Maintenance::compact`]): the loop keeps compacting a leader's tree until it is in the
//! leveled form, one step per job, so flushes of other shards are never held behind a long
//! leveling.
//!
//! A failure is kept and reported to the loop, which then fails the replica (the tree refuses
//! further flushes after an I/O error). In a simulation the same steps run inline on the loop, so
//! the outcome stays a function of the seed, and the driver may crash the node between any two of
//! them ([`CrashPoint`]).
//!
//! This module does not decide when to flush or what the flag is (the loop does).

use onekv_index::{Layout, Tree};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Places in an index flush where a simulation may crash the node (driven mode only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CrashPoint {
    /// The loop decided to flush; nothing is sealed yet.
    BeforeSeal,
    /// The memtables are sealed (in memory); no table is written.
    AfterSeal,
    /// One tree's table is durable, the next tree's is not (classic mode's entry tree).
    BetweenTreeFlushes,
    /// Every table is durable; no compaction ran.
    AfterFlush,
    /// Between two durable steps of the log garbage collector (`gc`).
    Gc(GcPoint),
}

pub use crate::gc::GcPoint;

/// Asked at each [`CrashPoint`]; `true` crashes the node there.
pub type CrashHook = Box<dyn FnMut(CrashPoint) -> bool + Send>;

/// Trees to flush and compact, each with the layout to compact it towards.
pub(crate) type Job = Vec<(Tree, Layout)>;

/// What the maintenance thread and the loop share.
#[derive(Default)]
struct Shared {
    busy: AtomicBool,
    failure: Mutex<Option<String>>,
}

/// The loop's handle on index maintenance.
pub(crate) struct Maintenance {
    shared: Arc<Shared>,
    compact: bool,
    /// `None`: steps run inline on the loop (driven mode).
    jobs: Option<SyncSender<Job>>,
    thread: Option<JoinHandle<()>>,
}

/// The node crashed at a [`CrashPoint`] (driven mode): the caller stops at once.
#[derive(Debug)]
pub(crate) struct Crashed;

impl Maintenance {
    /// Maintenance on a thread of its own (`threaded`), or inline; `compact` runs a compaction step
    /// after each flush (off, [`Maintenance::compact`] jobs do nothing either).
    pub fn new(threaded: bool, compact: bool) -> Result<Self, String> {
        let shared = Arc::new(Shared::default());
        if !threaded {
            return Ok(Maintenance { shared, compact, jobs: None, thread: None });
        }
        let (jobs, inbox) = std::sync::mpsc::sync_channel::<Job>(1);
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("onekv-index".into())
            .spawn(move || {
                while let Ok(trees) = inbox.recv() {
                    if let Err(failure) = flush_and_compact(&trees, compact, &mut |_| false) {
                        *worker.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(failure);
                    }
                    worker.busy.store(false, Ordering::SeqCst);
                }
            })
            .map_err(|e| format!("starting the index maintenance thread: {e}"))?;
        Ok(Maintenance { shared, compact, jobs: Some(jobs), thread: Some(thread) })
    }

    /// Whether a job is still running (the loop seals nothing new meanwhile).
    pub fn busy(&self) -> bool {
        self.shared.busy.load(Ordering::SeqCst)
    }

    /// The failure of a past job, if one failed.
    pub fn failure(&self) -> Option<String> {
        self.shared.failure.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Makes the sealed memtables of `trees` durable (in that order) and runs a compaction step on
    /// each towards its layout: on the maintenance thread, or at once when inline, asking `crash`
    /// at each point.
    pub fn flush(&self, trees: Job, crash: &mut dyn FnMut(CrashPoint) -> bool) -> Result<(), Crashed> {
        self.shared.busy.store(true, Ordering::SeqCst);
        match &self.jobs {
            Some(jobs) => {
                if jobs.send(trees).is_err() {
                    *self.shared.failure.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some("the index maintenance thread is gone".into());
                    self.shared.busy.store(false, Ordering::SeqCst);
                }
                Ok(())
            }
            None => {
                let mut crashed = false;
                let result = flush_and_compact(&trees, self.compact, &mut |point| {
                    crashed = crash(point);
                    crashed
                });
                self.shared.busy.store(false, Ordering::SeqCst);
                if crashed {
                    return Err(Crashed);
                }
                if let Err(failure) = result {
                    *self.shared.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(failure);
                }
                Ok(())
            }
        }
    }

    /// One compaction step on each tree, as a job of its own: [`Maintenance::flush`] of trees with
    /// nothing sealed, which flushes nothing.
    pub fn compact(&self, trees: Job, crash: &mut dyn FnMut(CrashPoint) -> bool) -> Result<(), Crashed> {
        self.flush(trees, crash)
    }

    /// Waits for the job in progress and stops the thread.
    pub fn stop(&mut self) {
        self.jobs.take();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the index maintenance thread panicked");
        }
    }
}

impl Drop for Maintenance {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Flushes then compacts; stops at the first error, or where `crash` says so (returning `Ok`:
/// the caller asked for the stop and knows). A job with nothing sealed (compaction alone) has no
/// flush to crash in.
fn flush_and_compact(
    trees: &[(Tree, Layout)],
    compact: bool,
    crash: &mut dyn FnMut(CrashPoint) -> bool,
) -> Result<(), String> {
    if trees.iter().any(|(tree, _)| tree.has_sealed()) {
        for (i, (tree, _)) in trees.iter().enumerate() {
            if i > 0 && crash(CrashPoint::BetweenTreeFlushes) {
                return Ok(());
            }
            crate::failpoint!("during-index-flush");
            if crate::failpoints::hit("fail-index-flush") {
                return Err(format!("flushing {}: injected failure (fail-index-flush)", tree.name()));
            }
            tree.flush_sealed().map_err(|e| format!("flushing the index: {e}"))?;
        }
        if crash(CrashPoint::AfterFlush) {
            return Ok(());
        }
    }
    if compact {
        for (tree, layout) in trees {
            tree.maybe_compact(*layout).map_err(|e| format!("compacting the index: {e}"))?;
        }
    }
    Ok(())
}
