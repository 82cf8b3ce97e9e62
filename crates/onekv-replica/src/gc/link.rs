//! How the collector reaches the node loop: from a thread of its own through the loop's inbox (a
//! server), or directly between two turns when a simulation drives the node on one thread (so a
//! simulated run stays a function of its seed, and its crash hook may stop the node between the
//! collector's durable steps).

use super::{Collector, GcConfig, GcInput, GcPoint, GcStatus, Move, Relocated, RoundError, WAIT_LIMIT};
use crate::node::{Input, NodeLoop};
use crate::pins::ReadPins;
use onekv_log::Log;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a round needs from the node loop.
pub(crate) trait Link {
    /// Has the loop point keys at relocated copies ([`crate::group::Group::relocate`]).
    fn relocate(&mut self, shard: u64, moves: Vec<Move>) -> Result<Relocated, RoundError>;
    /// Asks the loop to flush these shards' trees soon.
    fn flush(&mut self, shards: Vec<u64>) -> Result<(), RoundError>;
    /// Waits (at most [`WAIT_LIMIT`]) until `done` holds, while the loop flushes.
    fn wait_until(&mut self, done: &dyn Fn() -> bool) -> Result<(), RoundError>;
    /// Accounts `bytes` of the collector's I/O against `rate` bytes per second (0: unlimited),
    /// pausing as long as the limit says.
    fn throttle(&mut self, bytes: u64, rate: u64) -> Result<(), RoundError>;
    /// A point between durable steps where a crash may be injected.
    fn crash_point(&mut self, point: GcPoint) -> Result<(), RoundError>;
    /// Returns once the loop has finished every turn begun before the call (so what it applied
    /// in them is published).
    fn barrier(&mut self) -> Result<(), RoundError>;
    /// Takes the late references into `range` on the loop, between two turns: every one made so
    /// far, each published ([`crate::dedup::Dedup::take_late_references_within`]).
    fn take_late_references(&mut self, range: std::ops::Range<u64>) -> Result<LateReferences, RoundError>;
}

/// Late references taken: `(shard, place, keys)`; `None` if more were made than held (the pass
/// must keep its segments).
pub(crate) type LateReferences = Option<crate::dedup::LateKeys>;

/// Takes the late references into `range` from the node's deduplication (none without one); on
/// the loop, between two turns.
pub(crate) fn take_late_references(
    dedup: Option<&Arc<crate::dedup::Dedup>>,
    range: std::ops::Range<u64>,
) -> LateReferences {
    dedup.map_or(Some(Vec::new()), |dedup| dedup.take_late_references_within(range))
}

/// The running collector of a server; stops when dropped.
pub(crate) struct Gc {
    stop: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Gc {
    /// Starts the collector on a thread of its own, talking to the loop through `inbox`.
    pub fn start(
        config: GcConfig,
        logs: (crate::StorageMode, Arc<Log>, Option<Arc<Log>>),
        hosted: (crate::state::HostedStates, Option<Arc<crate::dedup::Dedup>>),
        inbox: SyncSender<Input>,
        pins: Arc<ReadPins>,
        status: Arc<Mutex<GcStatus>>,
    ) -> Result<Gc, String> {
        let (stop, stopped) = std::sync::mpsc::sync_channel(1);
        let mut collector = Collector::new(config, logs, hosted, pins, status);
        // Tests make the census keep few keys (action `return(N)`), so segments are read whole
        // and their values found by the keys their records name, as past 2^20 live keys.
        #[cfg(feature = "failpoints")]
        if let Some(keys) =
            fail::eval("gc-census-keeps-few-keys", |arg| arg.and_then(|n| n.parse().ok())).flatten()
        {
            collector.max_kept_keys = keys;
        }
        let mut link = ThreadLink { inbox, stopped, window_start: Instant::now(), window_bytes: 0 };
        let thread = std::thread::Builder::new()
            .name("onekv-gc".into())
            .spawn(move || {
                while link.sleep(collector.interval()).is_ok() {
                    if !collector.run_round(&mut link) {
                        return;
                    }
                }
            })
            .map_err(|e| format!("starting the log garbage collector: {e}"))?;
        Ok(Gc { stop: Some(stop), thread: Some(thread) })
    }

    /// Stops the collector and waits for its thread (a round in progress ends at its next wait).
    pub fn stop(&mut self) {
        self.stop.take();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the log garbage collector panicked");
        }
    }
}

impl Drop for Gc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The collector's thread's link: the loop's inbox, and the stop signal every wait watches.
struct ThreadLink {
    inbox: SyncSender<Input>,
    stopped: Receiver<()>,
    /// The rate limit's current one-second window.
    window_start: Instant,
    window_bytes: u64,
}

impl ThreadLink {
    /// Sleeps, or returns at once when asked to stop.
    fn sleep(&self, duration: Duration) -> Result<(), RoundError> {
        match self.stopped.recv_timeout(duration) {
            Err(RecvTimeoutError::Timeout) => Ok(()),
            Ok(()) | Err(RecvTimeoutError::Disconnected) => Err(RoundError::Stopped),
        }
    }

    /// Queues `input` for the loop, waiting while its inbox is full.
    fn send(&self, mut input: Input) -> Result<(), RoundError> {
        loop {
            match self.inbox.try_send(input) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Full(back)) => {
                    input = back;
                    self.sleep(Duration::from_millis(5))?;
                }
                Err(TrySendError::Disconnected(_)) => return Err(RoundError::Stopped),
            }
        }
    }

    /// Waits (at most [`WAIT_LIMIT`]) for the loop's answer to a request.
    fn answer<T>(&self, answer: Receiver<T>) -> Result<T, RoundError> {
        let deadline = Instant::now() + WAIT_LIMIT;
        loop {
            match answer.recv_timeout(Duration::from_millis(100)) {
                Ok(result) => return Ok(result),
                Err(RecvTimeoutError::Timeout) if Instant::now() < deadline => self.sleep(Duration::ZERO)?,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(RoundError::Failed(format!(
                        "the node loop did not answer within {WAIT_LIMIT:?}"
                    )));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(RoundError::Failed("the node loop stopped".into()));
                }
            }
        }
    }
}

impl Link for ThreadLink {
    fn barrier(&mut self) -> Result<(), RoundError> {
        let (done, answer) = std::sync::mpsc::sync_channel(1);
        self.send(Input::Gc(GcInput::Barrier { done }))?;
        self.answer(answer)
    }

    fn relocate(&mut self, shard: u64, moves: Vec<Move>) -> Result<Relocated, RoundError> {
        let (done, answer) = std::sync::mpsc::sync_channel(1);
        self.send(Input::Gc(GcInput::Relocate { shard, moves, done }))?;
        self.answer(answer)?.map_err(RoundError::Failed)
    }

    fn take_late_references(&mut self, range: std::ops::Range<u64>) -> Result<LateReferences, RoundError> {
        let (done, answer) = std::sync::mpsc::sync_channel(1);
        self.send(Input::Gc(GcInput::TakeLateReferences { range, done }))?;
        self.answer(answer)
    }

    fn flush(&mut self, shards: Vec<u64>) -> Result<(), RoundError> {
        self.send(Input::Gc(GcInput::Flush { shards }))
    }

    fn wait_until(&mut self, done: &dyn Fn() -> bool) -> Result<(), RoundError> {
        let deadline = Instant::now() + WAIT_LIMIT;
        while !done() {
            if Instant::now() >= deadline {
                return Err(RoundError::Failed(format!("not within {WAIT_LIMIT:?}")));
            }
            self.sleep(Duration::from_millis(10))?;
        }
        Ok(())
    }

    fn throttle(&mut self, bytes: u64, rate: u64) -> Result<(), RoundError> {
        if rate == 0 {
            return Ok(());
        }
        if self.window_start.elapsed() >= Duration::from_secs(1) {
            self.window_start = Instant::now();
            self.window_bytes = 0;
        }
        self.window_bytes += bytes;
        let due = Duration::from_secs_f64(self.window_bytes as f64 / rate as f64);
        let elapsed = self.window_start.elapsed();
        if due > elapsed {
            self.sleep(due - elapsed)?;
        }
        Ok(())
    }

    fn crash_point(&mut self, point: GcPoint) -> Result<(), RoundError> {
        let name = point.failpoint();
        if crate::failpoints::hit(name) {
            crate::failpoints::crash(name);
        }
        Ok(())
    }
}

/// The collector of a node a simulation drives: a round between two turns, every
/// `gc.interval` of simulated time.
pub(crate) struct InlineGc {
    collector: Collector,
    next_round: Option<Instant>,
}

impl InlineGc {
    pub fn new(collector: Collector) -> Self {
        InlineGc { collector, next_round: None }
    }

    /// Runs a round if one is due at `now` (and the node neither crashed nor failed).
    pub fn after_turn(&mut self, node_loop: &mut NodeLoop, now: Instant) {
        if node_loop.ctx.crashed || node_loop.ctx.failed.is_some() {
            return;
        }
        let next = *self.next_round.get_or_insert(now + self.collector.interval());
        if now < next {
            return;
        }
        self.next_round = Some(now + self.collector.interval());
        self.collector.run_round(&mut InlineLink { node_loop, now });
    }
}

/// A link that calls the loop's groups directly, on the thread that drives the node.
struct InlineLink<'a> {
    node_loop: &'a mut NodeLoop,
    now: Instant,
}

impl InlineLink<'_> {
    /// Lets every group the collector asked to flush do so now (index maintenance is inline when a
    /// simulation drives the node, so the flush is durable on return unless the node crashed).
    fn run_flushes(&mut self) -> Result<(), RoundError> {
        let NodeLoop { ctx, groups, .. } = &mut *self.node_loop;
        for group in groups.values_mut().filter(|group| group.gc_flush) {
            group.maybe_flush(self.now, ctx).map_err(|e| RoundError::Failed(e.to_string()))?;
            if ctx.crashed {
                return Err(RoundError::Stopped);
            }
        }
        Ok(())
    }
}

impl Link for InlineLink<'_> {
    fn barrier(&mut self) -> Result<(), RoundError> {
        // The collector runs between two turns on the loop's own thread: none is under way.
        Ok(())
    }

    fn take_late_references(&mut self, range: std::ops::Range<u64>) -> Result<LateReferences, RoundError> {
        // Between two turns already.
        Ok(take_late_references(self.node_loop.ctx.dedup.as_ref(), range))
    }

    fn relocate(&mut self, shard: u64, moves: Vec<Move>) -> Result<Relocated, RoundError> {
        let NodeLoop { ctx, groups, .. } = &mut *self.node_loop;
        if ctx.crashed {
            return Err(RoundError::Stopped);
        }
        if let Some(failure) = &ctx.failed {
            return Err(RoundError::Failed(format!("the node failed: {failure}")));
        }
        let group = groups.get_mut(&shard).ok_or_else(|| {
            RoundError::Failed(format!(
                "shard {shard} has no replica here (removed during this round; the next round skips it)"
            ))
        })?;
        group.relocate(moves).map_err(RoundError::Failed)
    }

    fn flush(&mut self, shards: Vec<u64>) -> Result<(), RoundError> {
        for shard in shards {
            if let Some(group) = self.node_loop.groups.get_mut(&shard) {
                group.gc_flush = true;
            }
        }
        self.run_flushes()
    }

    fn wait_until(&mut self, done: &dyn Fn() -> bool) -> Result<(), RoundError> {
        // A flush may first have to make a hard state durable, and one waits for another group's;
        // a few passes settle it, or the next round tries again.
        for _ in 0..4 {
            if done() {
                return Ok(());
            }
            self.run_flushes()?;
        }
        if done() { Ok(()) } else { Err(RoundError::Failed("not flushed yet".into())) }
    }

    fn throttle(&mut self, _bytes: u64, _rate: u64) -> Result<(), RoundError> {
        // Simulated time does not pass inside a turn.
        Ok(())
    }

    fn crash_point(&mut self, point: GcPoint) -> Result<(), RoundError> {
        if self.node_loop.ctx.crash_at(crate::maintenance::CrashPoint::Gc(point)) {
            return Err(RoundError::Stopped);
        }
        Ok(())
    }
}
