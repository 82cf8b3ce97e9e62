//! Rebuilding a shard's index from a snapshot off the node loop.
//!
//! Installing a snapshot rebuilds the shard's tree from every pair the snapshot holds (about 7 s
//! per GiB of 1 KiB values on a 2-core machine). On the loop thread that paused every shard of the
//! node, those it leads included. The group now writes the snapshot's metadata on the loop (from
//! then on a recovery installs the snapshot), hands the rebuild to an install thread and holds its
//! Ready until the thread is done; the node's other groups go on meanwhile.
//!
//! While its tree is rebuilt, a group takes no part in Raft: raft-rs cannot step messages while a
//! follower's Ready is held (their answers would go out with a later Ready, which it refuses), so
//! messages for the group are lost, as a network may lose them, and its peers send again; the group
//! is not ticked (it cannot campaign), persists no hard state of its own, and nothing else writes
//! its tree (flushes, leveling, log GC relocations, expiry, repairs): the group's code checks
//! [`crate::group::Group::installing`]. That is no less than before, when the whole loop waited
//! for the rebuild. Readers of the tree, and the status's applied index, show the state before the
//! snapshot until the rebuild publishes the new one at its end.
//!
//! At most [`MAX_INSTALLS`] rebuilds run at once per node (each holds up to a memtable and a chunk
//! in memory); more wait for a permit. A stopping node cancels its rebuilds between chunks: the
//! snapshot's metadata is durable, so the node's next recovery installs the snapshot again.
//!
//! This module does not decide when to install (the group, from raft-rs's Ready) or how a
//! snapshot's pairs become index entries ([`crate::apply::install_snapshot`]).

use crate::ReplicaError;
use crate::state::{State, storage};
use onekv_log::Locator;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Rebuilds running at once on one node.
pub(crate) const MAX_INSTALLS: usize = 2;

/// How often a rebuild waiting for a permit checks whether it was cancelled.
const PERMIT_POLL: Duration = Duration::from_millis(100);

/// The node's install permits ([`MAX_INSTALLS`]).
#[derive(Default)]
pub(crate) struct Installs {
    running: Mutex<usize>,
    freed: Condvar,
}

impl Installs {
    /// Waits for a permit; `None` if `cancel` is set first.
    fn acquire<'a>(&'a self, cancel: &AtomicBool) -> Option<Permit<'a>> {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        while *running >= MAX_INSTALLS {
            if cancel.load(Ordering::Relaxed) {
                return None;
            }
            running = self.freed.wait_timeout(running, PERMIT_POLL).unwrap_or_else(|e| e.into_inner()).0;
        }
        *running += 1;
        Some(Permit(self))
    }
}

/// A running rebuild's permit, given back when dropped.
struct Permit<'a>(&'a Installs);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        *self.0.running.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        self.0.freed.notify_one();
    }
}

/// One rebuild running (or waiting for a permit) on its own thread. Dropping it cancels the
/// rebuild and waits for its thread.
pub(crate) struct Install {
    pub index: u64,
    pub chunks: usize,
    pub started: Instant,
    cancel: Arc<AtomicBool>,
    done: Receiver<Result<(), ReplicaError>>,
    thread: Option<JoinHandle<()>>,
    /// A driven loop's rebuild, run inline once this many more polls answered "running".
    held: Mutex<Option<(u32, HeldRebuild)>>,
}

/// The inline rebuild of [`Install::inline_after`].
type HeldRebuild = Box<dyn FnOnce() + Send>;

impl Install {
    /// Starts rebuilding `state`'s tree from the snapshot at `index` whose pairs are in the chunk
    /// records at `chunks` (durable, as is the snapshot's metadata), then flushing it with `note`
    /// ([`crate::apply::install_snapshot`]).
    pub fn start(
        installs: Arc<Installs>,
        state: Arc<State>,
        shard: u64,
        index: u64,
        chunks: Vec<Locator>,
        note: Vec<u8>,
    ) -> Result<Install, ReplicaError> {
        let cancel = Arc::new(AtomicBool::new(false));
        let (answer, done) = mpsc::sync_channel(1);
        let chunk_count = chunks.len();
        let thread = std::thread::Builder::new()
            .name(format!("install-{shard}"))
            .spawn({
                let cancel = cancel.clone();
                move || {
                    let result = match installs.acquire(&cancel) {
                        None => Err(ReplicaError::Stopping),
                        Some(_permit) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            crate::apply::install_snapshot(&state, shard, index, &chunks, &note, &cancel)
                        }))
                        .unwrap_or_else(|panic| {
                            let what = crate::node::panic_message(panic.as_ref());
                            Err(storage(format!("installing a snapshot panicked: {what}")))
                        }),
                    };
                    let _ = answer.send(result);
                }
            })
            .map_err(|e| storage(format!("starting a thread to install a snapshot: {e}")))?;
        Ok(Install {
            index,
            chunks: chunk_count,
            started: Instant::now(),
            cancel,
            done,
            thread: Some(thread),
            held: Mutex::new(None),
        })
    }

    /// A rebuild a driven loop runs inline, on the poll after `polls` more polls (one per turn of
    /// the loop) reported it running: a simulation holds the group's Ready, and the state before
    /// the snapshot, as a thread would, the same turns for the same seed.
    pub fn inline_after(
        state: Arc<State>,
        shard: u64,
        index: u64,
        chunks: Vec<Locator>,
        note: Vec<u8>,
        polls: u32,
    ) -> Install {
        let (answer, done) = mpsc::sync_channel(1);
        let chunk_count = chunks.len();
        let rebuild: HeldRebuild = Box::new(move || {
            let result =
                crate::apply::install_snapshot(&state, shard, index, &chunks, &note, &AtomicBool::new(false));
            let _ = answer.send(result);
        });
        Install {
            index,
            chunks: chunk_count,
            started: Instant::now(),
            cancel: Arc::new(AtomicBool::new(false)),
            done,
            thread: None,
            held: Mutex::new(Some((polls, rebuild))),
        }
    }

    /// The rebuild's outcome once it has ended (`None` while it runs).
    pub fn poll(&self) -> Option<Result<(), ReplicaError>> {
        {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            match held.take() {
                Some((0, rebuild)) => rebuild(),
                Some((polls, rebuild)) => {
                    *held = Some((polls - 1, rebuild));
                    return None;
                }
                None => {}
            }
        }
        match self.done.try_recv() {
            Ok(result) => Some(result),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => {
                Some(Err(storage("the thread installing a snapshot ended without an answer".into())))
            }
        }
    }

    /// For the shard's status.
    pub fn describe(&self) -> String {
        format!(
            "installing the snapshot at index {} ({} chunks) for {:.1} s",
            self.index,
            self.chunks,
            self.started.elapsed().as_secs_f64()
        )
    }
}

impl Drop for Install {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_bound_running_installs_and_a_cancelled_wait_gives_up() {
        let installs = Installs::default();
        let never = AtomicBool::new(false);
        let held: Vec<_> = (0..MAX_INSTALLS).map(|_| installs.acquire(&never).expect("free")).collect();
        let cancelled = AtomicBool::new(true);
        assert!(installs.acquire(&cancelled).is_none(), "no permit is free: a cancelled wait ends");
        drop(held);
        assert_eq!(*installs.running.lock().unwrap(), 0);
        let _again = installs.acquire(&never).expect("permits given back on drop");
    }
}
