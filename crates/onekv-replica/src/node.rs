//! The node loop: one thread that drives every shard's Raft group on this node, persists for all
//! of them, applies and answers.
//!
//! Each turn drains the inbox (peer messages, proposals and read barriers, each for one shard),
//! ticks every group's Raft clock, and gathers the Ready of every group that has one: messages
//! that may leave before persistence are sent, then the new entries and hard states of **all**
//! groups are appended to the log in **one** append (one group commit, one fsync), then each group
//! applies what is committed and sends what had to wait for persistence (DESIGN.md §1). A group
//! never appends its Ready to the log; only the node does, once per turn.
//!
//! A failed append (or fsync) stops the whole node: the log refuses every later write, so no group
//! could persist again. A group with nothing to do costs the turn nothing.
//!
//! This module does not own a shard's state ([`crate::group`]), the wire (the [`Transport`]
//! carries messages) or the bytes of records and commands (`records`, `codec`).

use crate::group::{Group, GroupInput, Prepared};
use crate::records;
use crate::state::storage;
use crate::{ReplicaConfig, ReplicaError, Transport};
use onekv_log::Log;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Inputs handled at most per turn before the Readies are processed, so a flood of messages
/// cannot starve persistence.
const MAX_INPUTS_PER_TURN: usize = 4096;

/// Each group's DURABILITY records for one group commit, by shard (`fast`).
type FastRecords = Vec<(u64, Vec<(onekv_log::RecordKind, Vec<u8>)>)>;

/// Whether the loop goes on after a turn.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Turn {
    Continue,
    /// A shutdown was asked for; the caller ends the loop.
    Shutdown,
}

/// What the loop is asked to do.
pub(crate) enum Input {
    /// For the group of `shard`.
    Group(u64, GroupInput),
    /// From the log garbage collector (`gc`).
    Gc(crate::gc::GcInput),
    /// A replica added while the node runs (`hosting`): the loop drives it from now on.
    AddGroup(Box<Group>),
    /// A replica removed while the node runs (`hosting`): the loop drops it and answers with the
    /// voters it last knew.
    RemoveGroup {
        shard: u64,
        done: std::sync::mpsc::SyncSender<Result<Vec<u64>, ReplicaError>>,
    },
    Shutdown,
}

/// What every group of the node shares: the node's resources and settings, passed to each
/// group's methods.
pub(crate) struct NodeCtx {
    pub config: ReplicaConfig,
    /// The log Raft entries and hard states of every group go to.
    pub raft_log: Arc<Log>,
    pub transport: Arc<dyn Transport>,
    /// Set once the disk failed: the loop keeps answering errors but writes nothing more.
    pub failed: Option<String>,
    /// Wait for the hard-state records the loop otherwise submits without waiting (set when a
    /// simulation drives the loop: what is durable after a turn must not depend on thread timing).
    pub wait_for_submits: bool,
    /// A deliberately broken behaviour (simulation only).
    pub mutation: Option<crate::Mutation>,
    /// Writes sealed memtables and compacts, off the loop (inline in a simulation); one job at a
    /// time for the whole node.
    pub maintenance: crate::maintenance::Maintenance,
    /// Where snapshot installs rebuild their trees: on install threads, within these permits, or
    /// inline (`None`) when a simulation drives the loop (`snapshot::install`).
    pub installs: Option<Arc<crate::snapshot::install::Installs>>,
    /// After an inline install, turns the group's Ready is still held, as if a thread were still
    /// rebuilding the tree (a simulation's choice: the held-Ready path then runs under its faults).
    pub install_hold_turns: u32,
    /// Where a simulation may crash this node during a flush (driven mode only).
    pub crash_hook: Option<crate::maintenance::CrashHook>,
    /// Set once `crash_hook` crashed the node: the loop does nothing more.
    pub crashed: bool,
    /// The leaders' time written into proposals.
    pub clock: WallClock,
    /// The "disk full" alarm and the disk reserve (`disk_space`).
    pub disk: Arc<crate::disk_space::DiskSpace>,
    /// Readers' pins on the log, for the log GC (`pins`).
    pub pins: Arc<crate::pins::ReadPins>,
    /// What the log GC reports (shown in every shard's status).
    pub gc_status: Arc<std::sync::Mutex<crate::GcStatus>>,
    /// The node's deduplication (`dedup`; onelog mode, whatever `dedup.mode`).
    pub dedup: Option<Arc<crate::dedup::Dedup>>,
    /// The followed shard whose tree the loop chose this turn to flush because the followed
    /// shards' memtables together hold `ReplicaConfig::follower_memtable_bytes`
    /// ([`Node::choose_budget_flush`]); cleared when its flush starts.
    pub budget_flush: Option<u64>,
    /// Flushes started because of that budget since the node started.
    pub budget_flushes: u64,
    /// Bytes of fast writes pending or being written on this node (`fast`), counted again at the
    /// start of every turn and raised as each is accepted.
    pub fast_pending_bytes: usize,
}

impl NodeCtx {
    /// Asks the simulation's crash hook whether to crash at `point`; if so, the loop stops here.
    pub fn crash_at(&mut self, point: crate::maintenance::CrashPoint) -> bool {
        if self.crash_hook.as_mut().is_some_and(|hook| hook(point)) {
            self.crashed = true;
        }
        self.crashed
    }
}

/// The loop's own state: the node's resources and its groups, by shard.
pub(crate) struct NodeLoop {
    pub ctx: NodeCtx,
    pub groups: BTreeMap<u64, Group>,
    pub inbox: Receiver<Input>,
}

/// Wall-clock milliseconds for proposals (the time every replica applies an entry at: request-id
/// ages, expiry), read from the turn's `now` (never a clock of the loop's own, so a simulation
/// stays a function of its seed): the Unix time at the anchor plus the monotonic time since, so a
/// step of the system clock (NTP, a VM resumed) moves neither entry times nor the request window's
/// ages. A server anchors it when the node opens ([`NodeClock`], which its reads share); a
/// simulation at its first turn.
pub(crate) struct WallClock {
    /// The Unix time in ms at the anchor; a fixed value in a simulation.
    pub unix_ms_at_start: u64,
    pub anchor: Option<Instant>,
}

impl WallClock {
    /// A server's clock: `clock`'s anchor.
    pub fn system(clock: NodeClock) -> Self {
        WallClock { unix_ms_at_start: clock.unix_ms_at_start, anchor: Some(clock.anchor) }
    }

    /// A clock that starts at `unix_ms` on the first turn and follows the turns' `now`.
    pub fn simulated(unix_ms: u64) -> Self {
        WallClock { unix_ms_at_start: unix_ms, anchor: None }
    }

    pub fn ms(&mut self, now: Instant) -> u64 {
        let anchor = *self.anchor.get_or_insert(now);
        self.unix_ms_at_start
            + now.saturating_duration_since(anchor).as_millis() as u64
            + crate::failpoints::clock_ahead_ms()
    }
}

/// A server node's clock, anchored when it opens: the one its loop stamps entries with and its
/// reads judge expiry by, so a key expires for both at the same moment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NodeClock {
    unix_ms_at_start: u64,
    anchor: Instant,
}

impl NodeClock {
    /// Anchored now, at the system's wall clock.
    pub fn system() -> Self {
        let unix_ms_at_start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        NodeClock { unix_ms_at_start, anchor: Instant::now() }
    }

    /// The time now, in ms since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        self.unix_ms_at_start + self.anchor.elapsed().as_millis() as u64 + crate::failpoints::clock_ahead_ms()
    }
}

/// What a caught panic said.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

impl NodeLoop {
    /// Runs the loop on the current thread until shutdown: waits for inputs until the next tick is
    /// due, then takes a turn.
    pub fn run(mut self) {
        let tick = self.ctx.config.tick;
        let mut next_tick = Instant::now() + tick;
        loop {
            let wait = next_tick.saturating_duration_since(Instant::now());
            let first = match self.inbox.recv_timeout(wait) {
                Ok(input) => Some(input),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let now = Instant::now();
            let tick_due = now >= next_tick;
            if tick_due {
                // Ticks stay at least a tick apart however late one comes (no catching up), so a
                // follower never counts its election timeout down faster than real time: what
                // a leader's read lease counts on (`lease`). A busy loop's Raft clock runs a
                // little slow instead, which only delays elections.
                next_tick = now + tick;
            }
            if self.turn(first, now, tick_due) == Turn::Shutdown {
                break;
            }
        }
        self.stop();
    }

    /// Fails whatever is pending and marks every group stopped.
    fn stop(&mut self) {
        self.fail_everything(&|| ReplicaError::Stopping);
        // Nothing may hold the index open once the loop has ended.
        self.ctx.maintenance.stop();
        for group in self.groups.values_mut() {
            group.stop();
        }
        self.publish_status();
    }

    /// One turn: handles `first` and whatever else is queued (bounded), ticks every group's Raft
    /// clock once if `tick`, and handles every group's Ready. `now` is the time the turn happens
    /// at (the simulation's own clock when it drives the loop); the loop reads no clock of its own.
    pub fn turn(&mut self, first: Option<Input>, now: Instant, tick: bool) -> Turn {
        // raft-rs panics when its storage fails to read an entry (a failed pread of the log). The
        // Raft state may then be half-updated, so the node stops as after a failed append: it
        // answers errors and takes no further part until it is restarted.
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.turn_inner(first, now, tick)));
        let turn = match outcome {
            Ok(turn) => turn,
            Err(panic) => {
                self.fail(format!("the node loop panicked: {}", panic_message(panic.as_ref())));
                Turn::Continue
            }
        };
        self.publish_status();
        turn
    }

    fn turn_inner(&mut self, first: Option<Input>, now: Instant, tick: bool) -> Turn {
        if self.ctx.crashed {
            return Turn::Continue;
        }
        for group in self.groups.values_mut() {
            group.raw.mut_store().now = now;
        }
        if self.ctx.failed.is_none()
            && let Some(failure) = self.ctx.maintenance.failure()
        {
            self.fail(failure);
        }
        if self.ctx.config.fast_path {
            self.ctx.fast_pending_bytes = self.groups.values().map(|group| group.fast_bytes()).sum();
        }
        let mut handled = 0;
        let mut next = first;
        while let Some(input) = next {
            match input {
                Input::Shutdown => return Turn::Shutdown,
                Input::Group(shard, input) => match self.groups.get_mut(&shard) {
                    Some(group) => group.handle(input, now, &mut self.ctx),
                    // Not (or no longer, or not yet) hosted here: another node may serve it.
                    None => input.refuse(ReplicaError::NotLeader { leader: None }),
                },
                Input::Gc(input) => self.handle_gc(input),
                Input::AddGroup(group) => self.add_group(*group),
                Input::RemoveGroup { shard, done } => {
                    let _ = done.try_send(self.remove_group(shard));
                }
            }
            handled += 1;
            if handled >= MAX_INPUTS_PER_TURN {
                break;
            }
            next = self.inbox.try_recv().ok();
        }
        if tick {
            // Free space, the reserve, and handing leadership away while the disk is full.
            crate::disk_space::on_tick(&mut self.ctx, self.groups.values_mut(), now);
        }
        if self.ctx.failed.is_some() {
            return Turn::Continue;
        }
        // A group whose snapshot is being installed off the loop is neither ticked nor stepped
        // meanwhile; only `prepare` polls its install (`snapshot::install`).
        for group in self.groups.values_mut().filter(|group| group.installing.is_none()) {
            if tick {
                group.tick(now, &self.ctx);
                group.sweep_expired(now, &mut self.ctx);
            }
            group.propose_repairs(now, &mut self.ctx);
            group.propose_order(now, false, &mut self.ctx);
            group.order_for_waiting_reads(now, &mut self.ctx);
            group.release_fast_reads();
            group.send_read_index();
        }
        if let Err(err) = self.on_ready(now) {
            self.fail(err.to_string());
            return Turn::Continue;
        }
        // With the fast path on, what this turn made durable or applied may call for another
        // round at once (an ORDER of the writes just made durable, a read barrier released by an
        // applied ORDER), which would otherwise wait for the next input or tick.
        if self.ctx.config.fast_path && !self.ctx.crashed {
            let mut again = false;
            for group in self.groups.values_mut().filter(|group| group.installing.is_none()) {
                again |= group.propose_order(now, false, &mut self.ctx);
                group.release_fast_reads();
                group.send_read_index();
                again |= group.raw.has_ready();
            }
            if again && let Err(err) = self.on_ready(now) {
                self.fail(err.to_string());
            }
        }
        Turn::Continue
    }

    /// A request of the log garbage collector: moves to apply in a shard's tree, or shards whose
    /// trees it needs flushed.
    fn handle_gc(&mut self, input: crate::gc::GcInput) {
        use crate::gc::GcInput;
        match input {
            GcInput::Relocate { shard, moves, done } => {
                let result = match (&self.ctx.failed, self.groups.get_mut(&shard)) {
                    (Some(failure), _) => Err(format!("the node failed: {failure}")),
                    (None, None) => Err(format!(
                        "shard {shard} has no replica here (removed during this round; the next round skips it)"
                    )),
                    (None, Some(group)) => group.relocate(moves),
                };
                let _ = done.try_send(result);
            }
            // Every turn before this one has applied and published what it decided.
            GcInput::Barrier { done } => {
                let _ = done.try_send(());
            }
            GcInput::TakeLateReferences { range, done } => {
                let _ = done.try_send(crate::gc::take_late_references(self.ctx.dedup.as_ref(), range));
            }
            GcInput::Flush { shards } => {
                for shard in shards {
                    if let Some(group) = self.groups.get_mut(&shard) {
                        group.gc_flush = true;
                    }
                }
            }
        }
    }

    /// Starts driving a replica added while the node runs. A new replica is rejoining (it has no
    /// Raft state); the rejoining file says so before it handles any message, so a crash after
    /// its first hard state cannot bring it back as a replica free to vote.
    fn add_group(&mut self, group: Group) {
        group.publish_status(&self.ctx);
        let shard = group.shard;
        let rejoining = group.rejoin.is_some();
        self.groups.insert(shard, group);
        if rejoining && let Err(error) = self.persist_rejoining() {
            self.fail(error.to_string());
        }
    }

    /// Drops the group of `shard`: it stops (its scrub and snapshot builds end) and what it had
    /// pending fails as not the leader. Refused while it leads. Returns the voters it knew. The
    /// rejoining file may keep naming it: a shard the node does not host is ignored there.
    pub(crate) fn remove_group(&mut self, shard: u64) -> Result<Vec<u64>, ReplicaError> {
        if self.groups.get(&shard).is_some_and(|group| group.raw.raft.state == raft::StateRole::Leader) {
            return Err(ReplicaError::InvalidArgument(format!(
                "node {} leads shard {shard}: hand its leadership to another member and remove it from \
                 the group first",
                self.ctx.config.node_id
            )));
        }
        let Some(mut group) = self.groups.remove(&shard) else { return Ok(Vec::new()) };
        let voters = group.raw.store().conf_state.voters.clone();
        group.fail_pending(&|| ReplicaError::NotLeader { leader: None });
        group.stop();
        Ok(voters)
    }

    /// Stops the node for good (until restarted): every pending request fails with `failure`,
    /// later ones are refused, and the loop writes nothing more. The first failure is kept.
    fn fail(&mut self, failure: String) {
        tracing::error!(%failure, "the node stops serving");
        let failure = self.ctx.failed.get_or_insert(failure).clone();
        for group in self.groups.values_mut() {
            group.fail_pending(&|| ReplicaError::Storage(failure.clone()));
        }
    }

    /// Takes one turn for a caller that drives the loop (no thread): handles every queued input.
    pub fn drive(&mut self, now: Instant, tick: bool) -> Turn {
        let first = self.inbox.try_recv().ok();
        self.turn(first, now, tick)
    }

    /// Every group's Ready in one append; then each group applies and answers, the commit
    /// advances go in one more (unawaited) append, and flushes that are due start.
    fn on_ready(&mut self, now: Instant) -> Result<(), ReplicaError> {
        let mut prepared: Vec<(u64, Prepared)> = Vec::new();
        for (shard, group) in self.groups.iter_mut() {
            if let Some(ready) = group.prepare(&mut self.ctx)? {
                prepared.push((*shard, ready));
            }
        }
        // Fast writes' DURABILITY records ride in the same group commit (`fast::group`).
        let fast: FastRecords = self
            .groups
            .iter()
            .map(|(shard, group)| (*shard, group.fast_records()))
            .filter(|(_, records)| !records.is_empty())
            .collect();
        let locators = self.persist(&prepared, &fast)?;
        let mut at = 0;
        for (shard, ready) in prepared {
            let count = ready.records.len();
            let group = self.groups.get_mut(&shard).expect("prepared above");
            group.finish(ready, &locators[at..at + count], &mut self.ctx)?;
            at += count;
        }
        for (shard, records) in fast {
            let group = self.groups.get_mut(&shard).expect("listed above");
            group.fast_persisted(&locators[at..at + records.len()], now, &self.ctx);
            at += records.len();
        }
        self.persist_commits()?;
        self.persist_rejoining()?;
        self.choose_budget_flush();
        for group in self.groups.values_mut() {
            group.maybe_flush(now, &mut self.ctx)?;
            if self.ctx.crashed {
                return Ok(());
            }
            group.serve_waiting_views(now, &self.ctx);
        }
        // Leveling waits for flushes: it runs only when no group took the maintenance thread.
        for group in self.groups.values_mut() {
            group.maybe_level(now, &mut self.ctx);
            if self.ctx.crashed {
                break;
            }
        }
        Ok(())
    }

    /// DEPART's memtable shared by the redundant copies: once the memtables of the shards this
    /// node only follows hold `follower_memtable_bytes` together, the largest one that can flush
    /// is chosen to flush (one at a time: the node runs one flush at a time anyway). So those
    /// memtables' memory is bounded whatever the number of shards, and a busy followed shard
    /// flushes fewer, larger runs than an idle one would. Leaders' trees are not counted: each
    /// flushes at `memtable_bytes` (it serves reads, and its flushes are not deferred).
    fn choose_budget_flush(&mut self) {
        let budget = self.ctx.config.follower_memtable_bytes;
        if budget == 0 || self.ctx.maintenance.busy() {
            return;
        }
        let mut total = 0u64;
        let mut largest: Option<(u64, u64)> = None;
        for (shard, group) in &self.groups {
            if !group.shares_follower_budget(&self.ctx) {
                continue;
            }
            let (bytes, may_flush) = group.memtable_for_budget();
            total = total.saturating_add(bytes);
            if may_flush && largest.is_none_or(|(_, most)| bytes > most) {
                largest = Some((*shard, bytes));
            }
        }
        self.ctx.budget_flush = if total >= budget { largest.map(|(shard, _)| shard) } else { None };
    }

    /// Rewrites the data directory's rejoining file if a replica started or ended rejoining its
    /// group (`rejoin`). A failure to write it stops the node, as a failed log write does.
    pub(crate) fn persist_rejoining(&mut self) -> Result<(), ReplicaError> {
        let mut changed = false;
        for group in self.groups.values_mut() {
            changed |= group.update_rejoin();
        }
        if !changed {
            return Ok(());
        }
        let rejoining =
            self.groups.values().filter(|group| group.rejoin.is_some()).map(|group| group.shard).collect();
        crate::rejoin::store(&self.ctx.config.data_dir, &rejoining)
            .map_err(|e| ReplicaError::Storage(format!("writing the rejoining file: {e}")))
    }

    /// Appends every prepared group's records in one append and waits for the fsync; returns the
    /// locators, in the order of the records.
    fn persist(
        &mut self,
        prepared: &[(u64, Prepared)],
        fast: &FastRecords,
    ) -> Result<Vec<onekv_log::Locator>, ReplicaError> {
        let records: Vec<_> = prepared
            .iter()
            .flat_map(|(_, ready)| ready.records.iter().map(|(kind, payload)| (*kind, payload.as_slice())))
            .chain(
                fast.iter().flat_map(|(_, records)| {
                    records.iter().map(|(kind, payload)| (*kind, payload.as_slice()))
                }),
            )
            .collect();
        if records.is_empty() {
            return Ok(Vec::new());
        }
        crate::failpoint!("before-raft-append");
        if crate::failpoints::hit("fail-raft-append") {
            return Err(storage("appending Raft entries: injected failure (fail-raft-append)".into()));
        }
        if records.len() > 1 && crate::failpoints::hit("during-raft-append") {
            // Half of the records become durable, the rest never reach the disk.
            let _ = self.ctx.raft_log.append(&records[..records.len() / 2]);
            crate::failpoints::crash("during-raft-append");
        }
        // A turn may carry more than the log queues at once (a follower catching up, many large
        // proposals): it goes in as many group commits as it needs, never refused for its size.
        let locators = self
            .ctx
            .raft_log
            .append_in_parts(&records)
            .map_err(|e| storage(format!("appending Raft entries: {e}")))?;
        crate::failpoint!("after-raft-append");
        Ok(locators)
    }

    /// Appends, in one submit and without waiting, a hard state for every group whose commit
    /// index moved past the last one appended, so a later flush may record that far.
    fn persist_commits(&mut self) -> Result<(), ReplicaError> {
        let mut records = Vec::new();
        let mut covered = Vec::new();
        for group in self.groups.values_mut() {
            if let Some(record) = group.commit_to_persist() {
                records.push((records::HARD_STATE, records::encode_hard_state(record)));
                covered.push((group.shared.clone(), record.commit));
                group.commit_appended(record);
            }
        }
        if records.is_empty() {
            return Ok(());
        }
        let (written_tx, written) = match self.ctx.wait_for_submits {
            true => {
                let (tx, rx) = std::sync::mpsc::sync_channel(1);
                (Some(tx), Some(rx))
            }
            false => (None, None),
        };
        self.ctx
            .raft_log
            .submit(records, move |result| {
                if result.is_ok() {
                    for (shared, commit) in covered {
                        shared.durable_commit.fetch_max(commit, Ordering::SeqCst);
                    }
                }
                if let Some(tx) = written_tx {
                    let _ = tx.send(());
                }
            })
            .map_err(|e| storage(format!("appending the hard state: {e}")))?;
        if let Some(written) = written {
            // The completion runs whether the write succeeded or not; a failure shows on the next
            // append, which is refused.
            let _ = written.recv();
        }
        Ok(())
    }

    /// Fails every queued input and every pending request (the loop is ending).
    fn fail_everything(&mut self, error: &dyn Fn() -> ReplicaError) {
        for group in self.groups.values_mut() {
            group.fail_pending(error);
        }
        while let Ok(input) = self.inbox.try_recv() {
            if let Input::Group(_, input) = input {
                input.refuse(error());
            }
        }
    }

    fn publish_status(&self) {
        for group in self.groups.values() {
            group.publish_status(&self.ctx);
        }
    }
}

/// How long [`crate::Node::shutdown`] waits for the loop to finish.
pub(crate) const SHUTDOWN_WAIT: Duration = Duration::from_secs(30);
