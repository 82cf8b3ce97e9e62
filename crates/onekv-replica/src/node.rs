//! The node loop: one thread that drives Raft, persists, applies and answers.
//!
//! Each turn drains the inbox (peer messages, proposals, read barriers), ticks Raft's clock, and
//! handles one `Ready`: messages that may leave before persistence are sent, new entries and the
//! hard state are appended to the log in **one** append (one group commit, one fsync), then
//! committed entries are applied and messages that must wait for persistence are sent. With many
//! groups the same turn would gather every group's Ready into that one append (DESIGN.md §1).
//!
//! The loop never acknowledges a write before the entry is durable on this node and committed,
//! and never flushes an index tree past the commit index it has made durable: a tree's flush flag
//! can never run ahead of what recovery may replay.
//!
//! This module does not own the wire (the [`Transport`] carries messages) or the bytes of records
//! and commands (`records`, `codec`).

use crate::apply::Applier;
use crate::raft_store::RaftStore;
use crate::records::{self, HardStateRecord, SnapshotMeta};
use crate::state::{self, State, storage};
use crate::{
    Command, Done, Outcome, ReplicaConfig, ReplicaError, ReplicaStatus, RequestId, StorageMode, Transport,
};
use onekv_log::Log;
use raft::eraftpb::{Entry, Message};
use raft::{RawNode, StateRole};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The only shard of this release; every record carries it so one log can serve many groups.
pub(crate) const SHARD: u64 = 1;

/// Inputs handled at most per turn before a Ready is processed, so a flood of messages cannot
/// starve persistence.
const MAX_INPUTS_PER_TURN: usize = 4096;

/// Whether the loop goes on after a turn.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Turn {
    Continue,
    /// A shutdown was asked for; the caller ends the loop.
    Shutdown,
}

/// What the loop is asked to do.
pub(crate) enum Input {
    Step(Message),
    Propose { request_id: RequestId, command: Command, done: Done<Outcome> },
    ReadBarrier(Done<()>),
    Shutdown,
}

/// State shared between the loop and the handles.
pub(crate) struct Shared {
    pub status: Mutex<ReplicaStatus>,
    pub stopped: AtomicBool,
    /// Commit index covered by a durable HARD_STATE record.
    pub durable_commit: AtomicU64,
    /// Log records the recovery at open scanned.
    pub recovery_records: u64,
}

/// The loop's own state.
pub(crate) struct NodeLoop {
    pub config: ReplicaConfig,
    pub raw: RawNode<RaftStore>,
    pub applier: Applier,
    pub state: Arc<State>,
    pub raft_log: Arc<Log>,
    pub transport: Arc<dyn Transport>,
    pub inbox: Receiver<Input>,
    pub shared: Arc<Shared>,
    /// Proposals waiting to be applied: index → (term, reply).
    pub proposals: BTreeMap<u64, (u64, Done<Outcome>)>,
    /// Read barriers not yet sent to Raft.
    pub reads_unsent: Vec<Done<()>>,
    /// Read barriers sent, by context.
    /// (Ordered maps here and below: the order requests are failed in must not depend on a hash
    /// seed, or the simulation would not replay.)
    pub reads_in_flight: BTreeMap<u64, Vec<Done<()>>>,
    /// Read barriers confirmed, waiting for the applied index to reach theirs.
    pub reads_waiting: VecDeque<(u64, Vec<Done<()>>)>,
    pub next_read_ctx: u64,
    /// The hard state last appended to the log.
    pub persisted_hs: HardStateRecord,
    /// Classic mode: sequence numbers of the entry tree (entries can be overwritten at an index).
    pub entry_tree_seqno: u64,
    /// Set once the disk failed: the loop keeps answering errors but writes nothing more.
    pub failed: Option<String>,
    /// Followers the leader is sending a snapshot to, and since when.
    pub snapshot_sends: BTreeMap<u64, Instant>,
    /// Wait for the hard-state records the loop otherwise submits without waiting (set when a
    /// simulation drives the loop: what is durable after a turn must not depend on thread timing).
    pub wait_for_submits: bool,
    /// A deliberately broken behaviour (simulation only).
    pub mutation: Option<crate::Mutation>,
    /// Writes sealed memtables and compacts, off the loop (inline in a simulation).
    pub maintenance: crate::maintenance::Maintenance,
    /// Where a simulation may crash this node during a flush (driven mode only).
    pub crash_hook: Option<crate::maintenance::CrashHook>,
    /// Set once `crash_hook` crashed the node: the loop does nothing more.
    pub crashed: bool,
    /// The leaders' time written into proposals.
    pub clock: WallClock,
    /// When the index was last sealed for a flush.
    pub last_flush: Option<Instant>,
    /// The "disk full" alarm and the disk reserve (`disk_space`).
    pub disk: Arc<crate::disk_space::DiskSpace>,
    /// The background scrub verifying stored values.
    pub scrub: crate::scrub::Scrub,
    /// Damaged values of this replica waiting for a healthy copy: key → (damaged position, when
    /// the copy was last asked for, times asked).
    pub repairs: BTreeMap<Vec<u8>, (u64, Option<Instant>, u32)>,
}

/// Repair requests proposed per turn at most (many damaged values are asked for a few at a time,
/// so they cannot crowd out client writes).
const REPAIRS_PER_TURN: usize = 16;

/// Wall-clock milliseconds for proposals, read from the turn's `now` (never a clock of the
/// loop's own, so a simulation stays a function of its seed): anchored at the first turn.
pub(crate) struct WallClock {
    /// The Unix time in ms at the anchor; a fixed value in a simulation.
    pub unix_ms_at_start: u64,
    pub anchor: Option<Instant>,
}

impl WallClock {
    /// The wall clock now, for a server.
    pub fn system() -> Self {
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        WallClock { unix_ms_at_start: unix_ms, anchor: None }
    }

    fn ms(&mut self, now: Instant) -> u64 {
        let anchor = *self.anchor.get_or_insert(now);
        self.unix_ms_at_start + now.saturating_duration_since(anchor).as_millis() as u64
    }
}

impl NodeLoop {
    /// Runs the loop on the current thread until shutdown: waits for inputs until the next tick is
    /// due, then takes a turn.
    pub fn run(mut self) {
        let tick = self.config.tick;
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
                next_tick += tick;
                if next_tick < now {
                    next_tick = now + tick;
                }
            }
            if self.turn(first, now, tick_due) == Turn::Shutdown {
                break;
            }
        }
        self.stop();
    }

    /// Fails whatever is pending and marks the replica stopped.
    fn stop(&mut self) {
        self.fail_everything(|| ReplicaError::Stopping);
        // Nothing may hold the index open once the loop has ended.
        self.maintenance.stop();
        self.scrub.stop();
        self.raw.store().snapshots.lock().unwrap_or_else(|e| e.into_inner()).stop();
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.publish_status();
    }

    /// One turn: handles `first` and whatever else is queued (bounded), ticks Raft's clock once if
    /// `tick`, and handles one Ready. `now` is the time the turn happens at (the simulation's own
    /// clock when it drives the loop); the loop reads no clock of its own.
    pub fn turn(&mut self, first: Option<Input>, now: Instant, tick: bool) -> Turn {
        // raft-rs panics when its storage fails to read an entry (a failed pread of the log). The
        // Raft state may then be half-updated, so the replica stops as after a failed append:
        // it answers errors and takes no further part until it is restarted.
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.turn_inner(first, now, tick)));
        let turn = match outcome {
            Ok(turn) => turn,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".into());
                self.fail(format!("the node loop panicked: {what}"));
                Turn::Continue
            }
        };
        self.publish_status();
        turn
    }

    fn turn_inner(&mut self, first: Option<Input>, now: Instant, tick: bool) -> Turn {
        if self.crashed {
            return Turn::Continue;
        }
        self.raw.mut_store().now = now;
        if self.failed.is_none()
            && let Some(failure) = self.maintenance.failure()
        {
            self.fail(failure);
        }
        let mut handled = 0;
        let mut next = first;
        while let Some(input) = next {
            if matches!(input, Input::Shutdown) {
                return Turn::Shutdown;
            }
            self.handle(input, now);
            handled += 1;
            if handled >= MAX_INPUTS_PER_TURN {
                break;
            }
            next = self.inbox.try_recv().ok();
        }
        if tick {
            crate::disk_space::on_tick(self, now); // free space, reserve, leadership hand-off
        }
        if self.failed.is_some() {
            return Turn::Continue;
        }
        if tick {
            self.raw.tick();
            self.retry_lost_snapshots(now);
        }
        self.propose_repairs(now);
        self.send_read_index();
        if let Err(err) = self.on_ready(now) {
            self.fail(err.to_string());
        }
        Turn::Continue
    }

    /// Stops the replica for good (until restarted): every pending request fails with `failure`,
    /// later ones are refused, and the loop writes nothing more. The first failure is kept.
    fn fail(&mut self, failure: String) {
        tracing::error!(%failure, "the replica stops serving");
        let failure = self.failed.get_or_insert(failure).clone();
        self.fail_pending(|| ReplicaError::Storage(failure.clone()));
    }

    /// Takes one turn for a caller that drives the loop (no thread): handles every queued input.
    pub fn drive(&mut self, now: Instant, tick: bool) -> Turn {
        let first = self.inbox.try_recv().ok();
        self.turn(first, now, tick)
    }

    /// raft-rs waits for the application to report a snapshot's fate; our transport does not know
    /// it. A follower still waiting after `snapshot_timeout` is reported failed, so the leader
    /// probes it again and sends a new snapshot if it still needs one.
    fn retry_lost_snapshots(&mut self, now: Instant) {
        if self.role() != StateRole::Leader {
            self.snapshot_sends.clear();
            self.raw.store().snapshots.lock().unwrap_or_else(|e| e.into_inner()).release();
            return;
        }
        let waiting: Vec<u64> = self
            .raw
            .raft
            .prs()
            .iter()
            .filter(|(_, progress)| progress.state == raft::ProgressState::Snapshot)
            .map(|(id, _)| *id)
            .collect();
        self.snapshot_sends.retain(|id, _| waiting.contains(id));
        // A built snapshot is kept while some follower is behind the Raft log (it is asked for
        // again until sent), and dropped once nobody needs it.
        let first = self.raw.store().first();
        let needed = self.raw.raft.prs().iter().any(|(id, progress)| {
            *id != self.config.node_id
                && (progress.state == raft::ProgressState::Snapshot || progress.next_idx < first)
        });
        if !needed {
            self.raw.store().snapshots.lock().unwrap_or_else(|e| e.into_inner()).release();
        }
        for id in waiting {
            let since = *self.snapshot_sends.entry(id).or_insert(now);
            if now.duration_since(since) >= self.config.snapshot_timeout {
                tracing::warn!(follower = id, "no answer to a snapshot; sending it again");
                self.raw.report_snapshot(id, raft::SnapshotStatus::Failure);
                self.snapshot_sends.remove(&id);
            }
        }
    }

    fn role(&self) -> StateRole {
        self.raw.raft.state
    }

    fn not_leader(&self) -> ReplicaError {
        let leader = self.raw.raft.leader_id;
        ReplicaError::NotLeader { leader: (leader != 0 && leader != self.config.node_id).then_some(leader) }
    }

    fn handle(&mut self, input: Input, now: Instant) {
        match input {
            // A failed replica takes no further part in Raft: its state may be inconsistent.
            Input::Step(_) if self.failed.is_some() => {}
            Input::Step(message) => {
                if let Err(err) = self.raw.step(message) {
                    tracing::debug!(%err, "dropped a peer message");
                }
            }
            Input::Propose { request_id, command, done } => {
                if let Some(failed) = &self.failed {
                    return done(Err(ReplicaError::Storage(failed.clone())));
                }
                if self.role() != StateRole::Leader {
                    return done(Err(self.not_leader()));
                }
                // A compare-and-swap over a value known damaged here cannot be evaluated here:
                // applying it would stop this replica. It waits for the repair instead.
                if let Command::Cas { key, .. } = &command
                    && let Some(&(position, ..)) = self.repairs.get(key)
                    && self.still_damaged(key, position)
                {
                    return done(Err(ReplicaError::Corrupt { key: key.clone(), position }));
                }
                let data = crate::codec::encode(request_id, self.clock.ms(now), &command);
                let before = self.raw.raft.raft_log.last_index();
                match self.raw.propose(Vec::new(), data) {
                    Ok(()) if self.raw.raft.raft_log.last_index() > before => {
                        let index = self.raw.raft.raft_log.last_index();
                        // An older proposal still waiting at this index was overwritten by a leader
                        // change and can no longer commit.
                        if let Some((term, old)) = self.proposals.insert(index, (self.raw.raft.term, done)) {
                            old(Err(ReplicaError::Dropped(format!(
                                "entry {index} of term {term} was replaced by another leader's"
                            ))));
                        }
                    }
                    Ok(()) => done(Err(ReplicaError::Dropped("the proposal was not appended".into()))),
                    Err(err) => done(Err(ReplicaError::Dropped(err.to_string()))),
                }
            }
            Input::ReadBarrier(done) => {
                if let Some(failed) = &self.failed {
                    return done(Err(ReplicaError::Storage(failed.clone())));
                }
                if self.mutation == Some(crate::Mutation::ReadsWithoutReadIndex) {
                    return done(Ok(()));
                }
                if self.role() != StateRole::Leader {
                    return done(Err(self.not_leader()));
                }
                self.reads_unsent.push(done);
            }
            Input::Shutdown => unreachable!("handled by the loop"),
        }
    }

    /// Proposes repairs (through Raft, so every replica sees them in the same order): this
    /// replica's healthy copies offered in answer to repair requests it applied, and requests for
    /// a healthy copy of each value found damaged here. On a follower raft-rs forwards the proposal
    /// to the leader; a proposal lost on the way (or refused: no leader yet) is asked again after
    /// an election timeout while the damaged value is still the key's current one.
    fn propose_repairs(&mut self, now: Instant) {
        for (key, value) in self.applier.take_offers() {
            let data = crate::codec::encode_repair(self.clock.ms(now), &key, &value);
            if let Err(err) = self.raw.propose(Vec::new(), data) {
                tracing::debug!(%err, "offering a copy for repair was refused");
            }
        }
        for (key, position) in self.state.corruption.take_found() {
            self.repairs.insert(key, (position, None, 0));
        }
        if self.repairs.is_empty() {
            return;
        }
        let election = self.config.tick * self.config.election_ticks as u32;
        let mut asked = 0;
        let keys: Vec<Vec<u8>> = self.repairs.keys().cloned().collect();
        for key in keys {
            if asked >= REPAIRS_PER_TURN {
                break;
            }
            let (position, last, times) = self.repairs[&key];
            // One election timeout, doubling up to 64 of them: no replica may hold a healthy copy.
            let retry = election * (1u32 << times.saturating_sub(1).min(6));
            if last.is_some_and(|at| now.saturating_duration_since(at) < retry) {
                continue;
            }
            // Repaired, rewritten or deleted since: the damaged bytes are no longer read.
            if !self.still_damaged(&key, position) {
                self.repairs.remove(&key);
                continue;
            }
            let data = crate::codec::encode_repair_request(self.clock.ms(now), &key);
            if let Err(err) = self.raw.propose(Vec::new(), data) {
                tracing::debug!(%err, "asking for a copy of a damaged value was refused; asking again later");
            }
            self.repairs.insert(key, (position, Some(now), times.saturating_add(1)));
            asked += 1;
        }
    }

    /// Whether `key` still points at the damaged value at `position` (not repaired, rewritten or
    /// deleted since).
    fn still_damaged(&self, key: &[u8], position: u64) -> bool {
        match self.state.tree.get(key) {
            Ok(Some(stored)) => matches!(
                onekv_index::IndexValue::decode(&stored),
                Ok(onekv_index::IndexValue::Locator(locator)) if locator.position == position
            ),
            Ok(None) => false,
            // The index failing is not the repair's to report: assume the damage is still there.
            Err(_) => true,
        }
    }

    /// Sends one ReadIndex request for every barrier that arrived this turn.
    fn send_read_index(&mut self) {
        if self.reads_unsent.is_empty() {
            return;
        }
        let ctx = self.next_read_ctx;
        self.next_read_ctx += 1;
        self.reads_in_flight.insert(ctx, std::mem::take(&mut self.reads_unsent));
        self.raw.read_index(ctx.to_le_bytes().to_vec());
    }

    fn on_ready(&mut self, now: Instant) -> Result<(), ReplicaError> {
        if !self.raw.has_ready() {
            self.maybe_persist_commit()?;
            return self.maybe_flush(now);
        }
        let mut ready = self.raw.ready();
        if let Some(ss) = ready.ss()
            && ss.raft_state != StateRole::Leader
        {
            self.lost_leadership();
        }
        self.transport.send(ready.take_messages());
        if !ready.snapshot().is_empty() {
            self.install_snapshot(ready.snapshot().clone())?;
        }
        let entries = ready.take_entries();
        let hs = ready.hs().cloned();
        self.persist(&entries, hs)?;
        let committed = ready.take_committed_entries();
        self.apply(committed)?;
        self.transport.send(ready.take_persisted_messages());
        for read in ready.take_read_states() {
            let ctx = u64::from_le_bytes(read.request_ctx.as_slice().try_into().unwrap_or_default());
            if let Some(dones) = self.reads_in_flight.remove(&ctx) {
                self.reads_waiting.push_back((read.index, dones));
            }
        }
        let mut light = self.raw.advance(ready);
        self.transport.send(light.take_messages());
        self.apply(light.take_committed_entries())?;
        self.raw.advance_apply();
        self.resolve_reads();
        self.maybe_persist_commit()?;
        self.maybe_flush(now)
    }

    /// Appends `entries` and the hard state (if it changed) in one append, and waits for the fsync.
    fn persist(
        &mut self,
        entries: &[Entry],
        hs: Option<raft::eraftpb::HardState>,
    ) -> Result<(), ReplicaError> {
        let mut payloads: Vec<(onekv_log::RecordKind, Vec<u8>)> =
            entries.iter().map(|e| (records::ENTRY, records::encode_entry(SHARD, e))).collect();
        let mut new_hs = None;
        if let Some(hs) = hs {
            let record = HardStateRecord { shard: SHARD, term: hs.term, vote: hs.vote, commit: hs.commit };
            if record != self.persisted_hs {
                payloads.push((records::HARD_STATE, records::encode_hard_state(record)));
                new_hs = Some((record, hs));
            }
        }
        if payloads.is_empty() {
            return Ok(());
        }
        crate::failpoint!("before-raft-append");
        if crate::failpoints::hit("fail-raft-append") {
            return Err(storage("appending Raft entries: injected failure (fail-raft-append)".into()));
        }
        let records: Vec<_> = payloads.iter().map(|(k, p)| (*k, p.as_slice())).collect();
        if entries.len() > 1 && crate::failpoints::hit("during-raft-append") {
            // Half of the entries become durable, the rest never reach the disk.
            let _ = self.raft_log.append(&records[..records.len() / 2]);
            crate::failpoints::crash("during-raft-append");
        }
        // A turn may carry more than the log queues at once (a follower catching up, many large
        // proposals): it goes in as many group commits as it needs, never refused for its size.
        let locators = self
            .raft_log
            .append_in_parts(&records)
            .map_err(|e| storage(format!("appending Raft entries: {e}")))?;
        crate::failpoint!("after-raft-append");
        let store = self.raw.mut_store();
        for (entry, locator) in entries.iter().zip(&locators) {
            store.append(entry.index, entry.term, *locator);
        }
        if let Some((record, hs)) = new_hs {
            store.hard_state = hs;
            self.persisted_hs = record;
            self.shared.durable_commit.fetch_max(record.commit, Ordering::SeqCst);
        }
        if self.state.mode == StorageMode::Classic && !entries.is_empty() {
            // A layered store keeps Raft entries as full values in a tree of their own.
            let tree = self.state.entry_tree.as_ref().expect("classic mode has an entry tree");
            for (entry, (_, payload)) in entries.iter().zip(&payloads) {
                self.entry_tree_seqno += 1;
                tree.insert(&entry.index.to_be_bytes(), payload, self.entry_tree_seqno);
            }
            tree.publish(self.entry_tree_seqno);
        }
        Ok(())
    }

    /// Appends (without waiting) a hard state whose commit covers everything applied, so a later
    /// flush may record that far. raft-rs reports some commit advances only after the Ready that
    /// carried the hard state.
    fn maybe_persist_commit(&mut self) -> Result<(), ReplicaError> {
        let commit = self.raw.raft.raft_log.committed;
        if commit <= self.persisted_hs.commit || self.failed.is_some() {
            return Ok(());
        }
        let record = HardStateRecord { commit, ..self.persisted_hs };
        let record = HardStateRecord { term: self.raw.raft.term, vote: self.raw.raft.vote, ..record };
        let shared = self.shared.clone();
        let (written_tx, written) = match self.wait_for_submits {
            true => {
                let (tx, rx) = std::sync::mpsc::sync_channel(1);
                (Some(tx), Some(rx))
            }
            false => (None, None),
        };
        self.raft_log
            .submit(vec![(records::HARD_STATE, records::encode_hard_state(record))], move |result| {
                if result.is_ok() {
                    shared.durable_commit.fetch_max(commit, Ordering::SeqCst);
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
        self.persisted_hs = record;
        let store = self.raw.mut_store();
        store.hard_state.commit = commit;
        store.hard_state.term = record.term;
        store.hard_state.vote = record.vote;
        Ok(())
    }

    fn apply(&mut self, committed: Vec<Entry>) -> Result<(), ReplicaError> {
        if committed.is_empty() {
            return Ok(());
        }
        crate::failpoint!("before-apply");
        let locators = committed
            .iter()
            .map(|e| {
                self.raw
                    .store()
                    .meta(e.index)
                    .map(|m| m.locator)
                    .ok_or_else(|| storage(format!("committed entry {} is not in the log", e.index)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let applied = self.applier.apply(&committed, &locators)?;
        crate::failpoint!("after-apply");
        let store = self.raw.mut_store();
        if let Some(last) = applied.last() {
            store.applied_index = last.index;
            store.applied_term = last.term;
        }
        for result in applied {
            // Entries up to this one are applied; older proposals that never showed up at their
            // index were overwritten by another leader.
            while let Some(entry) = self.proposals.first_entry() {
                if *entry.key() > result.index {
                    break;
                }
                let (index, (term, done)) = entry.remove_entry();
                if index == result.index && term == result.term {
                    match result.outcome.clone() {
                        Some(outcome) => done(outcome),
                        None => done(Err(ReplicaError::Dropped("the entry carried no command".into()))),
                    }
                } else {
                    done(Err(ReplicaError::Dropped(format!(
                        "entry {index} of term {term} was replaced by another leader's"
                    ))));
                }
            }
        }
        crate::failpoint!("after-reply");
        Ok(())
    }

    fn resolve_reads(&mut self) {
        let applied = self.raw.store().applied_index;
        while let Some((index, _)) = self.reads_waiting.front() {
            if *index > applied {
                break;
            }
            let (_, dones) = self.reads_waiting.pop_front().expect("not empty");
            for done in dones {
                done(Ok(()));
            }
        }
    }

    fn lost_leadership(&mut self) {
        // Proposals still waiting may commit under the new leader, or be replaced; this node will
        // not learn which until entries at their indexes are applied, which may be never if no
        // write follows. Their callers retry with the same request id, which the window makes
        // safe, and the new leader answers them.
        for (index, (term, done)) in std::mem::take(&mut self.proposals) {
            done(Err(ReplicaError::Dropped(format!(
                "leadership lost while entry {index} of term {term} was pending; it may still commit: \
                 retry with the same request id"
            ))));
        }
        let leader = self.not_leader();
        for done in self.reads_unsent.drain(..) {
            done(Err(leader.clone()));
        }
        for (_, dones) in std::mem::take(&mut self.reads_in_flight) {
            for done in dones {
                done(Err(leader.clone()));
            }
        }
        for (_, dones) in self.reads_waiting.drain(..) {
            for done in dones {
                done(Err(leader.clone()));
            }
        }
    }

    /// Flushes the index once its memtable is large, or holds many entries, or is old (so the
    /// replay after a crash, Raft's metadata and the request window stay bounded even when few
    /// bytes are written), but only up to a durably committed index; then lets Raft forget entries
    /// far enough below it.
    fn maybe_flush(&mut self, now: Instant) -> Result<(), ReplicaError> {
        let applied = self.raw.store().applied_index;
        let flagged = self.state.tree.flush_flag().unwrap_or(0);
        if applied <= flagged || self.maintenance.busy() || self.failed.is_some() {
            return Ok(());
        }
        let last_flush = *self.last_flush.get_or_insert(now);
        let due = self.state.tree.memtable_bytes() >= self.config.memtable_bytes
            || applied - flagged >= self.config.flush_every_entries
            || now.saturating_duration_since(last_flush) >= self.config.flush_every;
        if !due {
            return Ok(());
        }
        if self.shared.durable_commit.load(Ordering::SeqCst) < applied {
            // The hard state covering `applied` was submitted without waiting. Appending it again
            // and waiting makes it (and everything queued before it) durable: the flag may not run
            // ahead of the commit index recovery will see.
            let record = self.persisted_hs;
            self.raft_log
                .append(&[(records::HARD_STATE, &records::encode_hard_state(record))])
                .map_err(|e| storage(format!("appending the hard state: {e}")))?;
            self.shared.durable_commit.fetch_max(record.commit, Ordering::SeqCst);
            if record.commit < applied {
                return Ok(());
            }
        }
        self.last_flush = Some(now);
        self.flush_index(applied)
    }

    /// Seals the index with `applied` as its flag and has the maintenance thread make it durable,
    /// after letting Raft forget entries more than `raft_log_keep_entries` below it; the flag
    /// carries where the next recovery's scan may start (the record of the first entry Raft still
    /// serves), so a restart reads only that far back. The caller has made the hard state covering
    /// `applied` durable.
    ///
    /// Forgetting entries before the flush is durable is safe: Raft forgets only its in-memory
    /// map, the records stay in the log, and the previous flag's recovery point still scans them.
    pub(crate) fn flush_index(&mut self, applied: u64) -> Result<(), ReplicaError> {
        if self.crash_at(crate::maintenance::CrashPoint::BeforeSeal) {
            return Ok(());
        }
        let keep = self.config.raft_log_keep_entries;
        if applied > keep {
            self.raw.mut_store().compact(applied - keep);
        }
        let store = self.raw.store();
        let note = match store.meta(store.first()) {
            Some(first) => records::encode_recovery_point(&records::RecoveryPoint {
                scan_from: first.locator.position - onekv_log::RECORD_HEADER_LEN as u64,
                snapshot_index: store.snapshot_index,
                snapshot_term: store.snapshot_term,
                hard_state: self.persisted_hs,
                voters: store.conf_state.voters.clone(),
            }),
            // No entry retained (just after a snapshot): the next recovery scans the whole log.
            None => Vec::new(),
        };
        crate::failpoint!("before-index-flush");
        // The data and the request-id window share the tree, so one flag covers both.
        self.state
            .tree
            .seal(applied, state::last_seqno(applied), &note)
            .map_err(|e| storage(format!("flushing the index: {e}")))?;
        let mut trees = vec![self.state.tree.clone()];
        if let Some(tree) = &self.state.entry_tree {
            tree.seal(applied, self.entry_tree_seqno, &[])
                .map_err(|e| storage(format!("flushing entries: {e}")))?;
            trees.push(tree.clone());
        }
        if self.crash_at(crate::maintenance::CrashPoint::AfterSeal) {
            return Ok(());
        }
        let hook = &mut self.crash_hook;
        let outcome =
            self.maintenance.flush(trees, &mut |point| hook.as_mut().is_some_and(|hook| hook(point)));
        if outcome.is_err() {
            self.crashed = true;
            return Ok(());
        }
        if let Some(failure) = self.maintenance.failure() {
            return Err(storage(failure));
        }
        Ok(())
    }

    /// Asks the simulation's crash hook whether to crash at `point`; if so, the loop stops here.
    fn crash_at(&mut self, point: crate::maintenance::CrashPoint) -> bool {
        if self.crash_hook.as_mut().is_some_and(|hook| hook(point)) {
            self.crashed = true;
        }
        self.crashed
    }

    fn install_snapshot(&mut self, snapshot: raft::eraftpb::Snapshot) -> Result<(), ReplicaError> {
        let meta = snapshot.get_metadata();
        let meta = SnapshotMeta {
            shard: SHARD,
            index: meta.index,
            term: meta.term,
            chunks: 0,
            voters: meta.get_conf_state().voters.clone(),
        };
        tracing::info!(
            index = meta.index,
            term = meta.term,
            bytes = snapshot.data.len(),
            "installing a snapshot"
        );
        let chunks = self.applier.persist_snapshot(&meta, &snapshot.data)?;
        self.raw.mut_store().apply_snapshot(meta.index, meta.term, meta.voters.clone());
        self.applier.install_snapshot(meta.index, &chunks)?;
        self.shared.durable_commit.fetch_max(meta.index, Ordering::SeqCst);
        // Proposals at or below the snapshot can no longer be matched to their entries.
        while let Some(entry) = self.proposals.first_entry() {
            if *entry.key() > meta.index {
                break;
            }
            let (_, (_, done)) = entry.remove_entry();
            done(Err(ReplicaError::Dropped("superseded by a snapshot".into())));
        }
        Ok(())
    }

    /// Fails every queued input and every pending request (the loop is ending).
    fn fail_everything(&mut self, error: impl Fn() -> ReplicaError) {
        self.fail_pending(&error);
        while let Ok(input) = self.inbox.try_recv() {
            match input {
                Input::Propose { done, .. } => done(Err(error())),
                Input::ReadBarrier(done) => done(Err(error())),
                Input::Step(_) | Input::Shutdown => {}
            }
        }
    }

    /// Fails every proposal and read barrier the loop holds.
    fn fail_pending(&mut self, error: impl Fn() -> ReplicaError) {
        for (_, (_, done)) in std::mem::take(&mut self.proposals) {
            done(Err(error()));
        }
        for done in self.reads_unsent.drain(..) {
            done(Err(error()));
        }
        for (_, dones) in std::mem::take(&mut self.reads_in_flight) {
            for done in dones {
                done(Err(error()));
            }
        }
        for (_, dones) in self.reads_waiting.drain(..) {
            for done in dones {
                done(Err(error()));
            }
        }
    }

    /// Each other member's progress, on a leader (empty otherwise).
    fn follower_status(&self) -> Vec<crate::FollowerStatus> {
        if self.role() != StateRole::Leader {
            return Vec::new();
        }
        self.raw
            .raft
            .prs()
            .iter()
            .filter(|(id, _)| **id != self.config.node_id)
            .map(|(id, progress)| crate::FollowerStatus {
                id: *id,
                matched: progress.matched,
                state: match progress.state {
                    raft::ProgressState::Probe => "probe",
                    raft::ProgressState::Replicate => "replicate",
                    raft::ProgressState::Snapshot => "snapshot",
                }
                .to_string(),
                active: progress.recent_active,
            })
            .collect()
    }

    fn publish_status(&self) {
        let raft = &self.raw.raft;
        let store = self.raw.store();
        let role = match raft.state {
            StateRole::Leader => "leader",
            StateRole::Follower => "follower",
            StateRole::Candidate => "candidate",
            StateRole::PreCandidate => "pre-candidate",
        };
        let leader_id = (raft.leader_id != 0).then_some(raft.leader_id);
        let leader_changes = {
            let previous = self.shared.status.lock().unwrap_or_else(|e| e.into_inner());
            let changed =
                leader_id.is_some() && (leader_id, raft.term) != (previous.leader_id, previous.term);
            previous.leader_changes + u64::from(changed)
        };
        let logs = std::iter::once(&self.state.raft_log)
            .chain(self.state.second_log.as_ref())
            .zip(self.state.mode.log_names())
            .map(|(log, name)| crate::LogStatus {
                name: (*name).to_string(),
                bytes: log.end_position() - log.first_position(),
                stats: log.stats(),
            })
            .collect();
        let status = ReplicaStatus {
            node_id: self.config.node_id,
            voters: store.conf_state.voters.clone(),
            leader_id,
            term: raft.term,
            role: role.to_string(),
            commit_index: raft.raft_log.committed,
            applied_index: store.applied_index,
            first_index: store.first(),
            last_index: raft.raft_log.last_index(),
            flushed_index: self.state.tree.flush_flag().unwrap_or(0),
            storage: self.state.mode,
            log_bytes: self.state.log_bytes(),
            bytes_written: self.state.bytes_written(),
            user_bytes: self.state.user_bytes.load(Ordering::Relaxed),
            recovery_records: self.shared.recovery_records,
            failure: self.failed.clone(),
            leader_changes,
            logs,
            index_flushes: self.state.index.flushes(),
            index_compactions: self.state.index.compactions(),
            index_bytes_written: self.state.index.bytes_written(),
            memtable_bytes: self.state.tree.memtable_bytes(),
            followers: self.follower_status(),
            snapshot: store.snapshots.lock().unwrap_or_else(|e| e.into_inner()).describe(),
            request_ids: self.state.requests().len() as u64,
            disk: self.disk.status(),
            corrupt_values: self.state.corruption.count(),
            repaired_values: self.state.corruption.repaired_count(),
            scrub: self.scrub.status(),
        };
        *self.shared.status.lock().unwrap_or_else(|e| e.into_inner()) = status;
    }
}

/// How long [`crate::Replica::shutdown`] waits for the loop to finish.
pub(crate) const SHUTDOWN_WAIT: Duration = Duration::from_secs(30);
