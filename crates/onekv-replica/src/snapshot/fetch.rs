//! The follower's side of a streamed snapshot: fetching its chunks from the sender and storing
//! them, off the node loop.
//!
//! A snapshot message marked [`STREAMED`](super::stream::STREAMED) does not go to the loop. A
//! fetch thread asks the sender for one chunk at a time ([`crate::Transport::fetch_snapshot_chunk`]),
//! checks every pair (each value against its checksum), appends the chunk to the node's log as
//! SNAP_CHUNK records (durable before the next is asked for: memory stays one chunk) and records
//! it in the shard's [`Stagings`](super::stream::Stagings), with where the next chunk starts, so a
//! fetch of the leader's view that failed resumes there at the next snapshot message of the same
//! index (from any sender: every replica's state at one index is the same). The sender is, when
//! it can, another replica than the leader, serving a view of its own at the message's index or
//! later ([`crate::ChunkRequest::any_view`]); the message then goes to Raft with that view's
//! metadata, and the leader is asked for a small chunk every few seconds, so it keeps its view,
//! the entries after it and its patience (`Fetch::fetch_from_another_replica`; if that other
//! replica fails part of the way, the leader's view is fetched at once). Once the last chunk is durable the
//! message goes to the loop marked [`STAGED`](super::stream::STAGED), and the group installs the
//! stored chunks, on an install thread (`super::install`). A broken stream or a crash
//! leaves chunks nobody installs: the shard's state is unchanged, and recovery ignores chunks with
//! no SNAP_META after them (after a crash the fetch starts over: stagings live in memory).
//!
//! One fetch per shard at a time and [`MAX_FETCHES`] per node. A repeated message for the snapshot
//! being fetched, or an older leader's, is dropped; a newer leader's snapshot (or a newer one of the
//! same leader) cancels the fetch under way (whose sender may be dead) and starts once it stopped.
//! A message that finds every fetch slot taken waits (the latest per shard, for at most
//! [`WAIT_FOR_SLOT`]) and starts as soon as a fetch ends: a node catching up many shards fetches
//! them back to back, instead of waiting for each leader to give its snapshot up as lost and send
//! it again (`snapshot_timeout`, 30 s by default).

use super::stream::{Resume, STAGED};
use crate::records;
use crate::state::State;
use crate::{ChunkCursor, ChunkRequest, Message, Node, SnapshotChunk};
use onekv_log::Locator;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Snapshots a node fetches at once (each holds one chunk in memory and a view on its sender).
pub(crate) const MAX_FETCHES: usize = 2;

/// Consecutive failed chunk requests before a fetch is abandoned.
const MAX_FAILURES: u32 = 5;

/// The first wait after a failed chunk request; doubles per failure.
const FIRST_RETRY: Duration = Duration::from_millis(200);

/// How often a fetch from another replica than the leader asks the leader for a small chunk of
/// its view, at most and at least (a third of `snapshot_timeout` in between).
const KEEP_ALIVE_MAX: Duration = Duration::from_secs(5);
const KEEP_ALIVE_MIN: Duration = Duration::from_millis(100);

/// A fetch logs its progress this often.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// How long a snapshot message waits for a fetch slot: well within the time a sender keeps an
/// unfetched view ([`super::stream::KEEP_WHILE_FETCHED`]); a later message of the same leader
/// replaces it anyway.
pub(crate) const WAIT_FOR_SLOT: Duration = Duration::from_secs(30);

/// The pace of a node's snapshot fetches: at most `bytes_per_sec` stored, all fetches together
/// (0: no bound), with a burst of one chunk.
pub(crate) struct Rate {
    bytes_per_sec: u64,
    /// When the chunks let through so far are paid for at that rate.
    paid_until: Mutex<Instant>,
}

impl Rate {
    pub fn new(bytes_per_sec: u64) -> Rate {
        Rate { bytes_per_sec, paid_until: Mutex::new(Instant::now()) }
    }

    /// Waits until a chunk of `bytes` may go: once the chunks before it are paid for. False if
    /// `stopped` turned true meanwhile.
    pub fn take(&self, bytes: u64, stopped: impl Fn() -> bool) -> bool {
        if self.bytes_per_sec == 0 {
            return true;
        }
        let cost = Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec as f64);
        let go_at = {
            let mut paid_until = self.paid_until.lock().unwrap_or_else(|e| e.into_inner());
            let go_at = (*paid_until).max(Instant::now());
            *paid_until = go_at + cost;
            go_at
        };
        loop {
            let now = Instant::now();
            if now >= go_at {
                return true;
            }
            if stopped() {
                // Not taken: the next fetch does not pay for it.
                let mut paid_until = self.paid_until.lock().unwrap_or_else(|e| e.into_inner());
                *paid_until = paid_until.checked_sub(cost).unwrap_or(*paid_until);
                return false;
            }
            std::thread::sleep((go_at - now).min(Duration::from_millis(20)));
        }
    }
}

/// The node's snapshot fetches.
#[derive(Default)]
pub(crate) struct Fetches {
    /// Fetches under way, and messages waiting for a slot (both by shard).
    slots: Mutex<Slots>,
    stop: Arc<AtomicBool>,
}

#[derive(Default)]
struct Slots {
    active: HashMap<u64, Active>,
    waiting: HashMap<u64, Waiting>,
}

/// A snapshot message that found every fetch slot taken.
struct Waiting {
    message: Message,
    since: Instant,
}

/// A shard's fetch under way.
struct Active {
    /// The sender, its term and the snapshot's index.
    from: u64,
    term: u64,
    index: u64,
    cancel: Arc<AtomicBool>,
    /// Set by the fetch's thread as it ends (before it starts a waiting message in its place).
    ended: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Active {
    fn running(&self) -> bool {
        !self.ended.load(Ordering::SeqCst) && !self.thread.is_finished()
    }
}

impl Fetches {
    /// Starts fetching the snapshot `message` announces for `shard`. A message for the snapshot
    /// this shard is fetching already is dropped; one from another sender or of another index (a
    /// new leader's) cancels that fetch and starts once it has stopped. Beyond [`MAX_FETCHES`]
    /// shards at once, the message waits for a slot ([`WAIT_FOR_SLOT`] at most).
    pub fn offer(&self, node: &Node, shard: u64, message: Message, state: Arc<State>) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.active.retain(|_, fetch| fetch.running());
        if self.stop.load(Ordering::SeqCst) {
            return;
        }
        self.start(&mut slots, node, shard, message, state);
    }

    /// Hands the oldest message waiting for a slot to the node again, if a slot is free: it is
    /// checked as when it arrived (the shard may have caught up meanwhile) and offered again.
    /// Messages that waited too long are dropped (their sender sends again).
    fn start_waiting(&self, node: &Node) {
        let next = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.active.retain(|_, fetch| fetch.running());
            let now = Instant::now();
            slots.waiting.retain(|_, waiting| now.duration_since(waiting.since) < WAIT_FOR_SLOT);
            if self.stop.load(Ordering::SeqCst) || slots.active.len() >= MAX_FETCHES {
                return;
            }
            let oldest =
                slots.waiting.iter().min_by_key(|(_, waiting)| waiting.since).map(|(shard, _)| *shard);
            oldest.and_then(|shard| Some((shard, slots.waiting.remove(&shard)?)))
        };
        if let Some((shard, waiting)) = next {
            node.step(shard, waiting.message);
        }
    }

    fn start(&self, slots: &mut Slots, node: &Node, shard: u64, message: Message, state: Arc<State>) {
        let active = &mut slots.active;
        let (from, term, index) = (message.from, message.term, message.get_snapshot().get_metadata().index);
        let previous = match active.remove(&shard) {
            // The same snapshot again, or an older leader's (a delayed message): the fetch goes on.
            Some(fetch)
                if (fetch.from, fetch.index) == (from, index)
                    || (term, index) <= (fetch.term, fetch.index) =>
            {
                active.insert(shard, fetch);
                return;
            }
            Some(fetch) => {
                tracing::info!(
                    shard,
                    from,
                    index,
                    was_from = fetch.from,
                    was_index = fetch.index,
                    "a newer snapshot replaces the one being fetched"
                );
                fetch.cancel.store(true, Ordering::SeqCst);
                Some(fetch.thread)
            }
            None if active.len() >= MAX_FETCHES => {
                // The latest leader's message waits (a delayed older one does not replace it).
                let newer_waits = slots.waiting.get(&shard).is_some_and(|waiting| {
                    let meta = waiting.message.get_snapshot().get_metadata();
                    (waiting.message.term, meta.index) > (term, index)
                });
                if !newer_waits {
                    tracing::debug!(
                        shard,
                        from,
                        index,
                        "the node fetches its most snapshots; this one waits"
                    );
                    slots.waiting.insert(shard, Waiting { message, since: Instant::now() });
                }
                return;
            }
            None => None,
        };
        slots.waiting.remove(&shard);
        let cancel = Arc::new(AtomicBool::new(false));
        let ended = Arc::new(AtomicBool::new(false));
        let fetch = Fetch {
            node: node.clone(),
            shard,
            message,
            state,
            stop: self.stop.clone(),
            cancel: cancel.clone(),
        };
        let run = {
            let ended = ended.clone();
            move || {
                if let Some(previous) = previous {
                    let _ = previous.join();
                }
                let node = fetch.node.clone();
                // A panic ends this fetch (its chunks stay for a resume), not the queue behind it.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fetch.run()));
                ended.store(true, Ordering::SeqCst);
                node.inner().fetches.start_waiting(&node);
            }
        };
        match std::thread::Builder::new().name("onekv-fetch".into()).spawn(run) {
            Ok(thread) => {
                active.insert(shard, Active { from, term, index, cancel, ended, thread });
            }
            Err(error) => tracing::warn!(shard, %error, "cannot start a snapshot fetch"),
        }
    }

    /// Cancels `shard`'s fetch, if one runs (its replica leaves the node), without waiting: the
    /// fetch ends at its next chunk and its result is never installed.
    pub fn cancel(&self, shard: u64) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.waiting.remove(&shard);
        if let Some(fetch) = slots.active.remove(&shard) {
            fetch.cancel.store(true, Ordering::SeqCst);
        }
    }

    /// Stops every fetch and waits for their threads.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let threads: Vec<_> = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.waiting.clear();
            slots.active.drain().map(|(_, fetch)| fetch.thread).collect()
        };
        for thread in threads {
            let _ = thread.join();
        }
    }
}

/// How a fetch from another replica than the leader went.
enum Elsewhere {
    /// The feature is off, or the leader's view was being fetched already.
    NotTried,
    /// Every chunk of this view is stored.
    Fetched(raft::eraftpb::SnapshotMetadata),
    /// No other replica served a whole view (behind, down, a leader itself, answering one this
    /// replica cannot use, or failing part of the way).
    Unavailable,
    /// The fetch was stopped (the node stops, or a newer snapshot message replaces it).
    Stopped,
}

/// Asks the leader for a small chunk of its view (its first pair: about 4 KiB, or one value)
/// every few seconds while another replica serves this follower, on a thread of its own that is
/// never waited for (a call to an unreachable leader may block for the transport's timeout); it
/// ends once the guard is dropped (also by a panic) or the fetch is stopped.
struct KeepAlive {
    done: Arc<AtomicBool>,
}

impl KeepAlive {
    fn start(fetch: &Fetch, index: u64) -> KeepAlive {
        let done = Arc::new(AtomicBool::new(false));
        let every = (fetch.node.inner().snapshot_timeout / 3).clamp(KEEP_ALIVE_MIN, KEEP_ALIVE_MAX);
        let (low, _) = crate::SNAPSHOT_CHUNK_BYTES_RANGE;
        let request =
            ChunkRequest { max_bytes: low as u32, ..fetch.chunk_request(index, &ChunkCursor::Start) };
        let (node, leader, shard) = (fetch.node.clone(), fetch.message.from, fetch.shard);
        let ended = {
            let (done, stop, cancel) = (done.clone(), fetch.stop.clone(), fetch.cancel.clone());
            move || [&done, &stop, &cancel].iter().any(|flag| flag.load(Ordering::SeqCst))
        };
        let run = move || {
            while !ended() {
                if let Err(error) = node.inner().transport.fetch_snapshot_chunk(leader, &request) {
                    tracing::debug!(shard, index, %error, "the leader's view could not be kept");
                }
                let until = Instant::now() + every;
                while Instant::now() < until && !ended() {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        };
        if let Err(error) = std::thread::Builder::new().name("onekv-keepalive".into()).spawn(run) {
            tracing::warn!(shard, %error, "cannot start keeping the leader's snapshot view");
        }
        KeepAlive { done }
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
    }
}

struct Fetch {
    node: Node,
    shard: u64,
    message: Message,
    state: Arc<State>,
    /// The node is stopping.
    stop: Arc<AtomicBool>,
    /// A newer snapshot replaces this one.
    cancel: Arc<AtomicBool>,
}

impl Fetch {
    fn run(mut self) {
        let shard = self.shard;
        let index = self.message.get_snapshot().get_metadata().index;
        let sender = self.message.from;
        let stagings = || self.state.staged.lock().unwrap_or_else(|e| e.into_inner());
        if self.stopped().is_some() {
            // Replaced before it began: the newer fetch owns the stagings.
            return;
        }
        if !stagings().is_complete(index) {
            // A fetch of the leader's view that got somewhere goes on from there.
            let elsewhere = match self.node.inner().snapshot_from_followers && !stagings().has_progress(index)
            {
                true => self.fetch_from_another_replica(index),
                false => Elsewhere::NotTried,
            };
            match elsewhere {
                // Raft takes it as the leader's: a state at a later index of the same log.
                Elsewhere::Fetched(view) => self.message.mut_snapshot().set_metadata(view),
                // The fetch was stopped or replaced: what it stored stays for the one after it.
                Elsewhere::Stopped => return,
                // The leader's view, then. What another replica sent of its own is dropped, so
                // at most one such attempt per snapshot index is wasted: once the leader's view
                // has chunks, later messages resume it.
                Elsewhere::NotTried | Elsewhere::Unavailable => {
                    if self.stopped().is_some() {
                        return;
                    }
                    if let Err(error) = self.fetch_staged(index, sender, None, None) {
                        // The chunks stored so far stay: the next snapshot message of this index
                        // resumes after them.
                        tracing::warn!(shard, index, from = sender, %error, "a snapshot fetch failed; the next snapshot message of this index resumes it");
                        return;
                    }
                }
            }
        }
        self.message.mut_snapshot().data = STAGED.to_vec().into();
        self.node.deliver(shard, self.message);
    }

    /// Fetches the view at `index` from `sender` into a staging (resumed where an earlier fetch
    /// of it stopped; nothing to do if one is complete); `first` is the view's first chunk when
    /// the caller has it already, `view` its metadata when another replica than the leader
    /// serves it.
    fn fetch_staged(
        &self,
        index: u64,
        sender: u64,
        first: Option<SnapshotChunk>,
        view: Option<raft::eraftpb::SnapshotMetadata>,
    ) -> Result<(), String> {
        let stagings = || self.state.staged.lock().unwrap_or_else(|e| e.into_inner());
        let first_position = self.state.raft_log.end_position();
        let Some(resume) = stagings().begin(index, sender, first_position, Instant::now(), view) else {
            return Ok(());
        };
        // Resumed after what an earlier fetch stored: the first chunk is not needed.
        let first = first.filter(|_| resume.0 == ChunkCursor::Start);
        let started = Instant::now();
        let shard = self.shard;
        tracing::info!(shard, index, from = sender, resume_at_chunk = resume.1, "fetching a snapshot");
        let (chunks, bytes) = self.fetch(index, sender, resume, first)?;
        stagings().complete(index, Instant::now());
        let seconds = started.elapsed().as_secs_f64();
        tracing::info!(
            shard,
            index,
            from = sender,
            chunks,
            bytes,
            elapsed_ms = (seconds * 1000.0) as u64,
            mib_per_sec = bytes as f64 / (1 << 20) as f64 / seconds.max(1e-3),
            "fetched a snapshot"
        );
        Ok(())
    }

    /// Fetches a view at `index` or later from a replica of the shard other than the leader, so
    /// the leader, which serves the clients, neither reads nor sends the state: first the one an
    /// earlier fetch staged from (used as it is if complete, else resumed: a fetch stopped by a
    /// newer snapshot message of the same leader), then the first other member that serves one
    /// (a voter, else a learner). Meanwhile a small chunk of the leader's
    /// view is asked for every few seconds ([`KeepAlive`]): the leader keeps that view, the Raft
    /// entries after it (which this replica takes next, after the later index) and its patience
    /// with this follower (`snapshot_timeout`).
    fn fetch_from_another_replica(&self, index: u64) -> Elsewhere {
        let leader = self.message.from;
        let me = self.node.inner().node_id;
        let staged = self.state.staged.lock().unwrap_or_else(|e| e.into_inner()).with_view_at_least(index);
        let staged = staged.filter(|(view, _, _)| self.usable(view, index));
        if let Some((view, _, true)) = &staged {
            return Elsewhere::Fetched(view.clone());
        }
        let members = self.message.get_snapshot().get_metadata().get_conf_state();
        let others: Vec<u64> = members.voters.iter().chain(&members.learners).copied().collect();
        if staged.is_none() && others.iter().all(|id| *id == leader || *id == me) {
            return Elsewhere::Unavailable;
        }
        let _keep_alive = KeepAlive::start(self, index);
        let mut tried = Vec::new();
        if let Some((view, sender, _)) = staged {
            tried.push(sender);
            match self.fetch_staged(view.index, sender, None, Some(view.clone())) {
                Ok(()) => return Elsewhere::Fetched(view),
                Err(error) => {
                    tracing::info!(shard = self.shard, index = view.index, from = sender, %error, "resuming a snapshot fetch from another replica failed; trying elsewhere");
                }
            }
        }
        for candidate in others.into_iter().filter(|id| *id != leader && *id != me && !tried.contains(id)) {
            if self.stopped().is_some() {
                return Elsewhere::Stopped;
            }
            if let Some(view) = self.fetch_from(candidate, index) {
                return Elsewhere::Fetched(view);
            }
        }
        match self.stopped() {
            Some(_) => Elsewhere::Stopped,
            None => Elsewhere::Unavailable,
        }
    }

    /// Fetches from `candidate` the view at `index` or later it serves in the leader's stead.
    fn fetch_from(&self, candidate: u64, index: u64) -> Option<raft::eraftpb::SnapshotMetadata> {
        let shard = self.shard;
        let request = ChunkRequest { any_view: true, ..self.chunk_request(index, &ChunkCursor::Start) };
        let first = match self.node.inner().transport.fetch_snapshot_chunk(candidate, &request) {
            Ok(first) => first,
            Err(error) => {
                tracing::debug!(shard, index, candidate, %error, "another replica cannot serve the snapshot");
                return None;
            }
        };
        let view = match first.view.clone() {
            Some(view) if self.usable(&view, index) => view,
            view => {
                tracing::warn!(
                    shard,
                    index,
                    candidate,
                    ?view,
                    "another replica answered with a view this replica cannot use"
                );
                return None;
            }
        };
        match self.fetch_staged(view.index, candidate, Some(first), Some(view.clone())) {
            Ok(()) => Some(view),
            Err(error) => {
                tracing::warn!(shard, index = view.index, from = candidate, %error, "a snapshot fetch from another replica failed; trying elsewhere");
                None
            }
        }
    }

    /// Whether another replica's view may stand in for the leader's snapshot at `index`: at it
    /// or later, naming this replica a member, and of no later term than the leader's message
    /// (this replica would take a term it has not seen from a message that does not carry it).
    fn usable(&self, view: &raft::eraftpb::SnapshotMetadata, index: u64) -> bool {
        view.index >= index
            && view.term <= self.message.term
            && crate::membership::is_member(view.get_conf_state(), self.node.inner().node_id)
    }

    fn stopped(&self) -> Option<&'static str> {
        if self.stop.load(Ordering::SeqCst) {
            Some("the node is stopping")
        } else if self.cancel.load(Ordering::SeqCst) {
            Some("a newer snapshot replaces it")
        } else {
            None
        }
    }

    /// Fetches and stores every chunk from `resume` on; returns how many chunk records and bytes
    /// this fetch stored. Each chunk is stored while the next is asked for, so the sender's reads
    /// and the network overlap this node's fsyncs (two chunks in memory at most).
    fn fetch(
        &self,
        index: u64,
        sender: u64,
        resume: Resume,
        first: Option<SnapshotChunk>,
    ) -> Result<(u32, u64), String> {
        let (mut cursor, mut number) = resume;
        let first_number = number;
        let mut bytes = 0u64;
        let mut reported = Instant::now();
        let mut chunk = match first {
            Some(chunk) => chunk,
            None => self.request(index, sender, &cursor)?,
        };
        loop {
            let sent_before = |key: &[u8]| {
                self.state.staged.lock().unwrap_or_else(|e| e.into_inner()).holds_value_of(index, key)
            };
            let check = ChunkCheck {
                limits: &self.node.inner().limits,
                cursor: &cursor,
                next: chunk.next.as_ref(),
                references: self.takes_references().then_some(&sent_before as &SentBefore<'_>),
            };
            let referable = check_pairs(&chunk.pairs, &check)?;
            // Paced before the chunk is stored and the next one asked for.
            if !self.node.inner().fetch_rate.take(chunk.pairs.len() as u64, || self.stopped().is_some()) {
                return Err(self.stopped().unwrap_or("stopped").into());
            }
            if let Some(next) = &chunk.next
                && (!advances(&cursor, next) || chunk.pairs.is_empty())
            {
                // Either would let a sender keep a fetch going for ever.
                return Err(format!(
                    "the sender's next chunk ({next:?}) does not follow {cursor:?} with pairs"
                ));
            }
            let (stored, following) = std::thread::scope(|scope| {
                let storing = scope.spawn(|| self.store(index, number, &chunk.pairs));
                let following = chunk.next.as_ref().map(|next| self.request(index, sender, next));
                (storing.join().unwrap_or_else(|_| Err("storing a chunk panicked".into())), following)
            });
            let stored = stored?;
            number += stored.len() as u32;
            bytes += chunk.pairs.len() as u64;
            let next = chunk.next.clone().unwrap_or(ChunkCursor::Start);
            let recorded = self.state.staged.lock().unwrap_or_else(|e| e.into_inner()).push(
                index,
                &stored,
                next.clone(),
                Instant::now(),
                &referable,
            );
            if !recorded {
                return Err("superseded by another fetch".into());
            }
            if reported.elapsed() >= PROGRESS_EVERY {
                reported = Instant::now();
                tracing::info!(shard = self.shard, index, chunks = number, bytes, "fetching a snapshot");
            }
            match following {
                None => return Ok((number - first_number, bytes)),
                Some(following) => {
                    chunk = following?;
                    cursor = next;
                }
            }
        }
    }

    /// Asks `sender` for the chunk at `cursor`, retrying a failed call after a doubling wait.
    fn request(&self, index: u64, sender: u64, cursor: &ChunkCursor) -> Result<SnapshotChunk, String> {
        let inner = self.node.inner();
        let mut request = self.chunk_request(index, cursor);
        // Past the keys a staging remembers for checking references, the rest comes whole.
        request.references &=
            self.state.staged.lock().unwrap_or_else(|e| e.into_inner()).takes_references(index);
        let mut failures = 0;
        loop {
            if let Some(why) = self.stopped() {
                return Err(why.into());
            }
            match inner.transport.fetch_snapshot_chunk(sender, &request) {
                Ok(chunk) => return Ok(chunk),
                Err(error) => {
                    failures += 1;
                    if failures >= MAX_FAILURES {
                        return Err(format!("{failures} chunk requests in a row failed, the last: {error}"));
                    }
                    let until = Instant::now() + FIRST_RETRY * (1 << failures.min(5));
                    while Instant::now() < until && self.stopped().is_none() {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            }
        }
    }

    /// Whether chunks may send a copy several keys share once (references to earlier keys): only
    /// the one log can point several keys at one copy.
    fn takes_references(&self) -> bool {
        self.state.mode == crate::StorageMode::OneLog
    }

    /// A request for the chunk at `cursor` of the view at `index`, of the configured size.
    fn chunk_request(&self, index: u64, cursor: &ChunkCursor) -> ChunkRequest {
        let inner = self.node.inner();
        let record_bytes = records::chunk_bytes(self.state.raft_log.config().max_record_bytes);
        ChunkRequest {
            from: inner.node_id,
            shard: self.shard,
            index,
            any_view: false,
            references: self.takes_references(),
            cursor: cursor.clone(),
            max_bytes: inner.snapshot_chunk_bytes.min(record_bytes) as u32,
        }
    }

    /// Appends a chunk's pairs as SNAP_CHUNK records numbered from `number` (durable on return).
    fn store(&self, index: u64, mut number: u32, pairs: &[u8]) -> Result<Vec<Locator>, String> {
        let record_bytes = records::chunk_bytes(self.state.raft_log.config().max_record_bytes);
        let mut stored = Vec::new();
        for part in split_pairs(pairs, record_bytes)? {
            let payload = records::encode_snapshot_chunk(self.shard, index, number, part);
            let locator = self
                .state
                .raft_log
                .append(&[(records::SNAP_CHUNK, &payload)])
                .map_err(|e| format!("storing a snapshot chunk: {e}"))?[0];
            stored.push(locator);
            number += 1;
            crate::failpoint!("during-snapshot-fetch");
        }
        Ok(stored)
    }
}

/// Whether `next` comes after `cursor` (a sender that repeats itself would loop for ever).
fn advances(cursor: &ChunkCursor, next: &ChunkCursor) -> bool {
    match (cursor, next) {
        (ChunkCursor::Start, ChunkCursor::AfterKey(_) | ChunkCursor::Window(_)) => true,
        (ChunkCursor::AfterKey(a), ChunkCursor::AfterKey(b)) => b > a,
        (ChunkCursor::AfterKey(_), ChunkCursor::Window(_)) => true,
        (ChunkCursor::Window(a), ChunkCursor::Window(b)) => b > a,
        _ => false,
    }
}

/// What a chunk from a peer is checked against ([`check_pairs`]).
pub(crate) struct ChunkCheck<'a> {
    pub limits: &'a crate::Limits,
    /// Where the chunk was asked from, and where the sender says the next one starts.
    pub cursor: &'a ChunkCursor,
    pub next: Option<&'a ChunkCursor>,
    /// `None`: references were not asked for. Otherwise whether a key before the chunk came with
    /// a value a reference may name (the staging's [`super::stream::Stagings::holds_value_of`]).
    pub references: Option<&'a SentBefore<'a>>,
}

/// Whether a key before a chunk came with a value a reference may name.
pub(crate) type SentBefore<'a> = dyn Fn(&[u8]) -> bool + 'a;

/// Checks a chunk from a peer before any of it is stored (a stored chunk that cannot be installed
/// would fail the install, and every recovery after it): whole pairs, every value matching its
/// checksum, user keys and values within the limits and ascending after the cursor, the next
/// chunk starting right after the last key, the request-id window's pairs (the empty key) well
/// formed and after every user key, and references (only if asked for) naming a user key that
/// came with a value, earlier in this chunk or before it. Returns the keys of this chunk a later
/// reference may name (those whose values are large enough to be shared).
pub(crate) fn check_pairs<'p>(pairs: &'p [u8], check: &ChunkCheck<'_>) -> Result<Vec<&'p [u8]>, String> {
    let mut previous = match check.cursor {
        ChunkCursor::AfterKey(key) => Some(key.as_slice()),
        ChunkCursor::Start | ChunkCursor::Window(_) => None,
    };
    let mut in_window = matches!(check.cursor, ChunkCursor::Window(_));
    let mut referable = Vec::new();
    let mut referable_here = std::collections::HashSet::new();
    for pair in records::SnapshotItems::new(pairs) {
        let (key, value, _) = pair.map_err(|e| format!("a snapshot chunk does not decode: {e}"))?;
        if key.is_empty() {
            in_window = true;
        } else {
            if in_window {
                return Err("a snapshot chunk holds a key after the request window".into());
            }
            if previous.is_some_and(|previous| key <= previous) {
                return Err("a snapshot chunk's keys are not in ascending order after its cursor".into());
            }
            previous = Some(key);
            if key.len() > check.limits.max_key_bytes {
                return Err(format!("a snapshot chunk holds a key of {} bytes, over the limit", key.len()));
            }
        }
        let span = match value {
            records::PairValue::Stored(span) => span,
            records::PairValue::SameAs(same_as) => {
                let Some(sent_before) = check.references else {
                    return Err("a snapshot chunk holds a reference nobody asked for".into());
                };
                if key.is_empty() || !(referable_here.contains(same_as) || sent_before(same_as)) {
                    return Err(
                        "a snapshot chunk's reference names no earlier key that came with a value".into()
                    );
                }
                continue;
            }
        };
        let value = crate::codec::verify_stored_value(&pairs[span.offset..span.offset + span.len])
            .map_err(|e| format!("a snapshot chunk's value: {e}"))?;
        if key.is_empty() {
            crate::requests::RequestWindow::check_pair(value)
                .map_err(|e| format!("a snapshot chunk's request window: {e}"))?;
            continue;
        }
        if value.len() > check.limits.max_value_bytes {
            return Err(format!(
                "a snapshot chunk holds a key of {} bytes with a value of {} bytes, over the limits",
                key.len(),
                value.len()
            ));
        }
        if super::copies::may_be_referred_to(span.len) {
            referable_here.insert(key);
            referable.push(key);
        }
    }
    if let Some(ChunkCursor::AfterKey(next)) = check.next
        && previous != Some(next.as_slice())
    {
        return Err("a snapshot chunk's next cursor is not its last key".into());
    }
    Ok(referable)
}

/// Cuts whole pairs into parts of at most `limit` bytes each (a pair larger than that alone).
pub(crate) fn split_pairs(pairs: &[u8], limit: usize) -> Result<Vec<&[u8]>, String> {
    let mut parts = Vec::new();
    let (mut start, mut end) = (0, 0);
    let mut items = records::SnapshotItems::new(pairs);
    while let Some(pair) = items.next() {
        pair.map_err(|e| format!("a snapshot chunk does not decode: {e}"))?;
        let pair_end = items.position();
        if end > start && pair_end - start > limit {
            parts.push(&pairs[start..end]);
            start = end;
        }
        end = pair_end;
    }
    if end > start {
        parts.push(&pairs[start..end]);
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(values: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (key, value) in values {
            records::push_snapshot_pair(&mut out, key, value);
        }
        out
    }

    #[test]
    fn pairs_are_cut_whole_and_a_large_one_goes_alone() {
        let data = pairs(&[(b"a", &[1; 10]), (b"b", &[2; 10]), (b"c", &[3; 100]), (b"d", &[4; 10])]);
        let parts = split_pairs(&data, 50).unwrap();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts.concat(), data);
        for part in parts {
            assert!(records::SnapshotPairs::new(part).all(|p| p.is_ok()));
        }
        assert!(split_pairs(&[], 50).unwrap().is_empty());
        // A reference is a pair like any other: cut before or after it, never inside.
        let mut data = pairs(&[(b"a", &[1; 40])]);
        records::push_reference_pair(&mut data, b"b", None, b"a");
        data.extend_from_slice(&pairs(&[(b"c", &[3; 20])]));
        let parts = split_pairs(&data, 60).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts.concat(), data);
        assert!(parts.iter().all(|part| records::SnapshotItems::new(part).all(|p| p.is_ok())));
    }

    #[test]
    fn damaged_oversized_or_misplaced_pairs_are_refused() {
        let limits = |max_key_bytes| crate::Limits { max_key_bytes, ..Default::default() };
        let (l16, l2) = (limits(16), limits(2));
        let start = ChunkCursor::Start;
        let plain = |limits| ChunkCheck { limits, cursor: &start, next: None, references: None };
        let mut data = pairs(&[(b"key", b"value")]);
        check_pairs(&data, &plain(&l16)).unwrap();
        assert!(check_pairs(&data, &plain(&l2)).unwrap_err().contains("key of 3 bytes"));
        *data.last_mut().unwrap() ^= 1;
        assert!(check_pairs(&data, &plain(&l16)).unwrap_err().contains("checksum"));
        assert!(check_pairs(&data[..5], &plain(&l16)).is_err());
        // The request window: well-formed pairs under the empty key, after every user key, and
        // nothing but the window from a cursor inside it.
        let window = 0u32.to_le_bytes();
        check_pairs(&pairs(&[(b"key", b"v"), (b"", &window)]), &plain(&l16)).unwrap();
        let misplaced = pairs(&[(b"", &window), (b"key", b"v")]);
        assert!(check_pairs(&misplaced, &plain(&l16)).unwrap_err().contains("after"));
        assert!(check_pairs(&pairs(&[(b"", b"junk")]), &plain(&l16)).unwrap_err().contains("window"));
        let in_window = ChunkCursor::Window(3);
        let from_window = ChunkCheck { cursor: &in_window, ..plain(&l16) };
        check_pairs(&pairs(&[(b"", &window)]), &from_window).unwrap();
        assert!(check_pairs(&pairs(&[(b"key", b"v")]), &from_window).unwrap_err().contains("after"));
        // Keys ascend after the cursor, and the next chunk starts right after the last one.
        let two = pairs(&[(b"a", b"v"), (b"b", b"v")]);
        let (zero, a, b) = (
            ChunkCursor::AfterKey(b"0".to_vec()),
            ChunkCursor::AfterKey(b"a".to_vec()),
            ChunkCursor::AfterKey(b"b".to_vec()),
        );
        check_pairs(&two, &ChunkCheck { cursor: &zero, next: Some(&b), ..plain(&l16) }).unwrap();
        let after_a = ChunkCheck { cursor: &a, ..plain(&l16) };
        assert!(check_pairs(&two, &after_a).unwrap_err().contains("ascending"));
        let swapped = pairs(&[(b"b", b"v"), (b"a", b"v")]);
        assert!(check_pairs(&swapped, &plain(&l16)).unwrap_err().contains("ascending"));
        let skipping = ChunkCheck { next: Some(&a), ..plain(&l16) };
        assert!(check_pairs(&two, &skipping).unwrap_err().contains("next cursor"));
        // References: only when asked for, and only to a key that came with a value, earlier in
        // the chunk or before it.
        let shared = [7u8; 100];
        let sent_before = |key: &[u8]| key == b"0";
        let taking = ChunkCheck { references: Some(&sent_before), ..plain(&l16) };
        let mut referring = pairs(&[(b"a", &shared)]);
        records::push_reference_pair(&mut referring, b"b", None, b"a");
        records::push_reference_pair(&mut referring, b"c", None, b"0");
        assert_eq!(check_pairs(&referring, &taking).unwrap(), vec![&b"a"[..]], "a may be referred to");
        assert!(check_pairs(&referring, &plain(&l16)).unwrap_err().contains("nobody asked"));
        for (key, same_as) in [(&b"b"[..], &b"c"[..]), (b"b", b"b"), (b"b", b""), (b"", b"a"), (b"b", b"1")] {
            let mut bad = pairs(&[(b"a", &shared)]);
            records::push_reference_pair(&mut bad, key, None, same_as);
            assert!(check_pairs(&bad, &taking).is_err(), "{key:?} -> {same_as:?}");
        }
        // A small value is never referred to (the sender sends it whole).
        let mut small = pairs(&[(b"a", b"v")]);
        records::push_reference_pair(&mut small, b"b", None, b"a");
        assert!(check_pairs(&small, &taking).is_err());
        // Nor a reference after the window.
        let mut after_window = pairs(&[(b"a", &shared), (b"", &window)]);
        records::push_reference_pair(&mut after_window, b"b", None, b"a");
        assert!(check_pairs(&after_window, &taking).unwrap_err().contains("after the request window"));
        let mut long = pairs(&[(b"a", &shared)]);
        records::push_reference_pair(&mut long, &[b'z'; 17], None, b"a");
        assert!(check_pairs(&long, &taking).unwrap_err().contains("over the limit"));
    }

    #[test]
    fn the_rate_spaces_chunks_by_their_size_and_a_stop_ends_the_wait() {
        let rate = Rate::new(1 << 20);
        let started = Instant::now();
        for _ in 0..4 {
            assert!(rate.take(128 << 10, || false));
        }
        // Three chunks of 128 KiB paid for at 1 MiB/s before the fourth goes: 375 ms.
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(370) && took < Duration::from_secs(2), "{took:?}");
        assert!(!rate.take(1 << 20, || true), "a stop ends the wait");
        assert!(Rate::new(0).take(u64::MAX, || false), "0: no bound");
    }

    #[test]
    fn cursors_must_move_forward() {
        let key = |k: &[u8]| ChunkCursor::AfterKey(k.to_vec());
        assert!(advances(&ChunkCursor::Start, &key(b"a")));
        assert!(advances(&key(b"a"), &key(b"b")));
        assert!(!advances(&key(b"b"), &key(b"b")));
        assert!(advances(&key(b"b"), &ChunkCursor::Window(0)));
        assert!(!advances(&ChunkCursor::Window(1), &ChunkCursor::Window(1)));
        assert!(!advances(&ChunkCursor::Window(1), &ChunkCursor::Start));
    }
}
