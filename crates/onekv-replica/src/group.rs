//! One shard's replica on this node: its Raft state machine, applier, request window, pending
//! proposals and read barriers.
//!
//! A group does no log append of its own for what Raft asks to persist: each turn the node asks
//! every group for its Ready ([`Group::prepare`]), appends all their entries and hard states in
//! **one** append (one group commit, one fsync), and hands each group its locators back
//! ([`Group::finish`]). The group then applies committed entries and answers. The records a group
//! needs outside a Ready (a snapshot it installs, the hard state a flush waits for) are appended
//! through the node's log too, never by another thread.
//!
//! A group never acknowledges a write before its entry is durable on this node and committed, and
//! never flushes its index tree past the commit index made durable: a tree's flush flag can never
//! run ahead of what recovery may replay.
//!
//! This module does not own the inbox, the thread, the logs or the index directory (the node's,
//! `node`), nor the wire (the [`Transport`]) or the bytes of records and commands (`records`,
//! `codec`).

use crate::apply::Applier;
use crate::lease::ReadLease;
use crate::membership;
use crate::node::NodeCtx;
use crate::raft_store::RaftStore;
use crate::records::{self, HardStateRecord, SnapshotMeta};
use crate::state::{self, State, storage};
use crate::{Command, Done, Outcome, ReplicaError, ReplicaStatus, RequestId, StorageMode};
use raft::eraftpb::{Entry, Message, MessageType};
use raft::{RawNode, StateRole};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

/// What a group is asked to do, once the node routed the input to it by shard.
pub(crate) enum GroupInput {
    Step(Message),
    Propose {
        request_id: RequestId,
        command: Command,
        done: Done<Outcome>,
    },
    ReadBarrier(Done<()>),
    /// Change the shard's members (leader only): answered once the change is applied here.
    ChangeMembers {
        change: crate::MembershipChange,
        done: Done<crate::Members>,
    },
    /// Hand leadership to voter `to` (leader only): answered once the hand-off has started.
    TransferLeader {
        to: u64,
        done: Done<()>,
    },
    /// Serve follower `asked_by` a view of the shard at `at_least` or later, in the leader's
    /// stead ([`crate::ChunkRequest::any_view`]), unless `deadline` (when the asker stops
    /// waiting) has passed.
    ServeView(ViewRequest),
    /// A fast write (`fast::group`): made durable here and answered, to be ordered by the leader.
    FastWrite {
        id: RequestId,
        ops: Vec<crate::WriteOp>,
        done: Done<crate::fast::FastAck>,
    },
}

/// A follower's request for a view of the shard ([`GroupInput::ServeView`]).
pub(crate) struct ViewRequest {
    pub at_least: u64,
    pub asked_by: u64,
    pub deadline: Instant,
    pub done: Done<Arc<crate::snapshot::stream::Served>>,
}

/// Requests for a view a replica holds while it applies up to their index.
const MAX_WAITING_VIEWS: usize = 8;

impl GroupInput {
    /// Answers the input's caller with `error` (a message has no caller).
    pub fn refuse(self, error: ReplicaError) {
        match self {
            GroupInput::Propose { done, .. } => done(Err(error)),
            GroupInput::ReadBarrier(done) => done(Err(error)),
            GroupInput::ChangeMembers { done, .. } => done(Err(error)),
            GroupInput::TransferLeader { done, .. } => done(Err(error)),
            GroupInput::ServeView(request) => (request.done)(Err(error)),
            GroupInput::FastWrite { done, .. } => done(Err(error)),
            GroupInput::Step(_) => {}
        }
    }
}

/// What a group shares with the handles ([`crate::Replica`]) of its shard.
pub(crate) struct GroupShared {
    pub shard: u64,
    pub status: Mutex<ReplicaStatus>,
    /// Commit index covered by a durable HARD_STATE record.
    pub durable_commit: AtomicU64,
    /// The index of the snapshot being installed off the loop (0: none): a message of that
    /// snapshot needs no fetch (`snapshot::install`).
    pub installing: AtomicU64,
    /// The entry this replica cannot apply (an ORDER naming a fast write it holds no record of,
    /// `fast::group`), while it waits for a snapshot past it (0: none): a streamed snapshot at
    /// or above it is fetched even if this replica committed that far.
    pub stalled_at: AtomicU64,
    /// Log records the recovery at open scanned for this shard.
    pub recovery_records: u64,
    /// Entries the recovery at open replayed into this shard's tree.
    pub recovery_replayed: u64,
    /// Taken away at shutdown, so a stopped node holds no files open even while handles remain.
    pub state: RwLock<Option<Arc<State>>>,
}

/// A group's Ready between [`Group::prepare`] and [`Group::finish`]: what it asked the node to
/// append.
pub(crate) struct Prepared {
    ready: raft::Ready,
    entries: Vec<Entry>,
    /// The records to append, in order: one ENTRY per entry, then the HARD_STATE if it changed.
    pub records: Vec<(onekv_log::RecordKind, Vec<u8>)>,
    new_hs: Option<(HardStateRecord, raft::eraftpb::HardState)>,
}

/// A snapshot whose tree is being rebuilt off the loop, and the Ready that carried it, held until
/// the rebuild ends (`snapshot::install`).
pub(crate) struct Installing {
    job: crate::snapshot::install::Install,
    ready: raft::Ready,
    /// The applied index readers see until the rebuild publishes the snapshot's (Raft's storage
    /// already holds the snapshot).
    applied_before: u64,
}

/// How many memtables' worth (`memtable_bytes`) one followed shard's tree holds at most before it
/// flushes on its own, whatever the followers' budget leaves it.
const FOLLOWER_MEMTABLES: u64 = 4;

/// Repair requests proposed per turn at most (many damaged values are asked for a few at a time,
/// so they cannot crowd out client writes).
const REPAIRS_PER_TURN: usize = 16;

/// One shard's replica state, driven by the node loop.
pub(crate) struct Group {
    pub shard: u64,
    pub raw: RawNode<RaftStore>,
    pub applier: Applier,
    pub state: Arc<State>,
    pub shared: Arc<GroupShared>,
    /// Proposals waiting to be applied: index → (term, reply).
    pub proposals: BTreeMap<u64, (u64, Done<Outcome>)>,
    /// As leader: what puts by reference may refer to (`wire_refs`).
    pub wire_refs: crate::wire_refs::WireRefs,
    /// Membership changes waiting to be applied: index → (term, reply).
    pub member_changes: BTreeMap<u64, (u64, Done<crate::Members>)>,
    /// Read barriers not yet sent to Raft.
    pub reads_unsent: Vec<Done<()>>,
    /// Read barriers sent, by context.
    /// (Ordered maps here and below: the order requests are failed in must not depend on a hash
    /// seed, or the simulation would not replay.)
    pub reads_in_flight: BTreeMap<u64, Vec<Done<()>>>,
    /// Read barriers confirmed, waiting for the applied index to reach theirs.
    pub reads_waiting: VecDeque<(u64, Vec<Done<()>>)>,
    pub next_read_ctx: u64,
    /// With lease reads on ([`crate::ReplicaConfig::lease_reads`]): how long this leader may
    /// answer read barriers without a ReadIndex round.
    pub lease: Option<ReadLease>,
    /// Read barriers answered by the lease, and through a ReadIndex round, since the replica
    /// started.
    pub reads_by_lease: u64,
    pub reads_by_read_index: u64,
    /// Raft ticks since this replica opened (saturating).
    pub ticks_since_open: usize,
    /// The hard state last appended to the log.
    pub persisted_hs: HardStateRecord,
    /// Classic mode: sequence numbers of the entry tree (entries can be overwritten at an index).
    pub entry_tree_seqno: u64,
    /// Followers the leader is sending a snapshot to, and since when.
    pub snapshot_sends: BTreeMap<u64, Instant>,
    /// Requests for a view of the shard waiting until this replica has applied up to their index
    /// (at most [`MAX_WAITING_VIEWS`]).
    pub waiting_views: Vec<ViewRequest>,
    /// When the index tree was last sealed for a flush.
    pub last_flush: Option<Instant>,
    /// The background scrub verifying this shard's stored values.
    pub scrub: crate::scrub::Scrub,
    /// Damaged values of this replica waiting for a healthy copy: key → (damaged position, when
    /// the copy was last asked for, times asked).
    pub repairs: BTreeMap<Vec<u8>, (u64, Option<Instant>, u32)>,
    /// The walk that finds expired keys to delete, while this node leads (`expiry`).
    pub expiry_sweep: crate::expiry::Sweep,
    /// The shard's preferred leader ([`crate::ShardConfig::primary`]).
    pub primary: Option<u64>,
    /// The voter leadership is being handed to on request ([`Group::transfer_leader`]).
    pub requested_transfer: Option<u64>,
    /// Since when this node leads the group without handing it to the primary (reset by each
    /// hand-off attempt, so one is tried at most once per election timeout).
    pub leader_since: Option<Instant>,
    /// Ticks this node has led the group while stalled ([`Group::give_up_stalled_leadership`]).
    pub stalled_leader_ticks: usize,
    /// The log garbage collector needs this tree flushed (values were relocated, or the shard's
    /// recovery point holds back the segment it wants to reclaim).
    pub gc_flush: bool,
    /// Set while this replica is rejoining its group after losing its Raft state (`rejoin`).
    pub rejoin: Option<crate::rejoin::Rejoin>,
    /// `rejoin` changed since the node last wrote the rejoining file.
    pub rejoin_changed: bool,
    /// The layout the tree was last compacted towards ([`Group::index_layout`]).
    pub layout: onekv_index::Layout,
    /// Since when the tree is being brought from the runs layout to the leveled one (this node
    /// started serving the shard), until it is leveled.
    pub leveling_since: Option<Instant>,
    /// How long the last such change took.
    pub last_leveling: Option<std::time::Duration>,
    /// Set while a snapshot's tree is rebuilt off the loop: the group's Ready is held, it is neither
    /// stepped nor ticked, and nothing else writes its tree (`snapshot::install`).
    pub installing: Option<Installing>,
    /// The fast path's state (`fast::group`).
    pub fast: crate::fast::FastGroup,
}

impl Group {
    pub fn role(&self) -> StateRole {
        self.raw.raft.state
    }

    fn not_leader(&self, ctx: &NodeCtx) -> ReplicaError {
        let leader = self.raw.raft.leader_id;
        ReplicaError::NotLeader { leader: (leader != 0 && leader != ctx.config.node_id).then_some(leader) }
    }

    pub fn handle(&mut self, input: GroupInput, now: Instant, ctx: &mut NodeCtx) {
        match input {
            // A failed node takes no further part in Raft: its state may be inconsistent.
            GroupInput::Step(_) if ctx.failed.is_some() => {}
            // While a snapshot is rebuilt the group's Ready is held, and raft-rs cannot take
            // messages then (its answers would have to go out with a later Ready, which it
            // refuses for a follower): they are lost, as a network may lose them, and the peers
            // send again (`snapshot::install`).
            GroupInput::Step(_) if self.installing.is_some() => {}
            GroupInput::Step(message) => {
                if let Some(gathered) = crate::fast::gather::decode(&message) {
                    match gathered {
                        Ok(gathered) => self.fast_gather_message(message.from, message.term, gathered, ctx),
                        Err(error) => {
                            tracing::debug!(shard = self.shard, error, "dropped a malformed gather message")
                        }
                    }
                    return;
                }
                if let Some(ids) = crate::fast::notice::decode(&message) {
                    match ids {
                        Ok(ids) if message.term == self.raw.raft.term => {
                            self.fast_noticed(message.from, ids, now)
                        }
                        Ok(_) => {}
                        Err(error) => {
                            tracing::debug!(shard = self.shard, error, "dropped a malformed notice")
                        }
                    }
                    return;
                }
                if self.refuses_votes_after_opening(&message, ctx) {
                    return;
                }
                // A stalled replica's request for a snapshot, made in an earlier term, goes before
                // a message of a later term is stepped: raft-rs keeps it across terms and would
                // answer the new leader's first append with it, taking none of its entries (so the
                // new leader could count none of them), and a snapshot sent against it could be
                // older than entries another leader counted here. Taking this term's entries, the
                // replica asks again (raft-rs asks only once its last entry is of this term). A
                // term the replica starts itself (campaigning) clears the request in raft-rs.
                if self.applier.stalled_at.is_some()
                    && message.term > self.raw.raft.term
                    && !matches!(
                        message.get_msg_type(),
                        MessageType::MsgRequestPreVote | MessageType::MsgRequestPreVoteResponse
                    )
                {
                    self.raw.raft.pending_request_snapshot = raft::INVALID_INDEX;
                }
                // A replica stalled on a fast write it lacks (`fast::group`) must not lead: it
                // could not apply, nor serve. It ignores a hand-off to it.
                if self.applier.stalled_at.is_some() && message.get_msg_type() == MessageType::MsgTimeoutNow {
                    return;
                }
                let Some(message) = self.screen_membership(message, ctx) else { return };
                let Some(message) = self.screen(message, ctx) else { return };
                if message.get_msg_type() == MessageType::MsgSnapshot {
                    let data = message.get_snapshot().data.as_ref();
                    if data == crate::snapshot::stream::STAGED {
                        return self.step_staged(message);
                    }
                    // The node fetches these before they reach the loop, but one this replica
                    // has committed past: Raft refuses it without reading its data, and its
                    // answer tells the leader where this replica is.
                    let index = message.get_snapshot().get_metadata().index;
                    if data == crate::snapshot::stream::STREAMED && index > self.raw.raft.raft_log.committed {
                        return;
                    }
                }
                if let Err(err) = self.raw.step(message) {
                    tracing::debug!(shard = self.shard, %err, "dropped a peer message");
                }
            }
            GroupInput::Propose { request_id, command, done } => {
                if let Some(failed) = &ctx.failed {
                    return done(Err(ReplicaError::Storage(failed.clone())));
                }
                if self.role() != StateRole::Leader {
                    return done(Err(self.not_leader(ctx)));
                }
                // A compare-and-swap over a value known damaged here cannot be evaluated here:
                // applying it would stop this replica. It waits for the repair instead.
                if let Command::Cas { key, .. } = &command
                    && let Some(&(position, ..)) = self.repairs.get(key)
                    && self.still_damaged(key, position)
                {
                    return done(Err(ReplicaError::Corrupt { key: key.clone(), position }));
                }
                if !self.order_before_proposal(command_keys(&command), now, ctx) {
                    return done(Err(ReplicaError::Dropped(
                        "the fast writes it must follow could not be ordered (a leadership change is under way)".into(),
                    )));
                }
                let time_ms = self.entry_time(now, ctx);
                self.wire_refs.ignores_unapplied =
                    ctx.mutation == Some(crate::Mutation::ReferencesIgnoreUnapplied);
                let data = self.encode_command(request_id, time_ms, &command);
                let before = self.raw.raft.raft_log.last_index();
                self.wire_refs.note_proposed(self.raw.raft.term, before + 1, &data);
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
            GroupInput::ReadBarrier(done) => {
                if let Some(failed) = &ctx.failed {
                    return done(Err(ReplicaError::Storage(failed.clone())));
                }
                if ctx.mutation == Some(crate::Mutation::ReadsWithoutReadIndex) {
                    return done(Ok(()));
                }
                if self.role() != StateRole::Leader {
                    return done(Err(self.not_leader(ctx)));
                }
                self.note_election(ctx);
                if self.fast_active(ctx) {
                    return self.fast_read_barrier(done, now, ctx);
                }
                self.reads_unsent.push(done);
            }
            GroupInput::FastWrite { id, ops, done } => self.fast_write(id, ops, done, ctx),
            GroupInput::ChangeMembers { change, done } => {
                if !self.order_before_proposal(None, now, ctx) {
                    return done(Err(ReplicaError::Dropped(
                        "the pending fast writes could not be ordered first (a leadership change is under way)".into(),
                    )));
                }
                self.propose_member_change(change, done, ctx)
            }
            GroupInput::TransferLeader { to, done } => done(self.transfer_leader(to, ctx)),
            GroupInput::ServeView(request) => {
                // A replica a turn or two behind the leader (the usual case under writes: it
                // holds the entries, and the commit reaches it with the next append) waits until
                // it has applied that far; one further behind refuses at once.
                let behind = self.raw.store().applied_index < request.at_least;
                let holds_entries = self.raw.raft.raft_log.last_index() >= request.at_least;
                if behind
                    && holds_entries
                    && ctx.failed.is_none()
                    && self.installing.is_none()
                    && self.waiting_views.len() < MAX_WAITING_VIEWS
                    && now < request.deadline
                {
                    self.waiting_views.push(request);
                } else {
                    let view = self.serve_view(&request, now, ctx);
                    (request.done)(view);
                }
            }
        }
    }

    /// Answers the requests for a view that waited for this replica to apply up to their index,
    /// once it has, or once their asker stopped waiting (the loop calls this every turn).
    pub fn serve_waiting_views(&mut self, now: Instant, ctx: &NodeCtx) {
        if self.waiting_views.is_empty() {
            return;
        }
        let applied = self.raw.store().applied_index;
        let (ready, waiting): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.waiting_views).into_iter().partition(|request| {
                applied >= request.at_least || now >= request.deadline || self.installing.is_some()
            });
        self.waiting_views = waiting;
        for request in ready {
            let view = self.serve_view(&request, now, ctx);
            (request.done)(view);
        }
    }

    /// A view for a follower that asked this replica for a snapshot instead of the leader.
    fn serve_view(
        &mut self,
        request: &ViewRequest,
        now: Instant,
        ctx: &NodeCtx,
    ) -> Result<Arc<crate::snapshot::stream::Served>, ReplicaError> {
        if let Some(failed) = &ctx.failed {
            return Err(ReplicaError::Storage(failed.clone()));
        }
        if self.installing.is_some() {
            return Err(ReplicaError::Dropped("this replica is installing a snapshot".into()));
        }
        // Its asker gave up: a view made now would pin the log for nobody.
        if now >= request.deadline {
            return Err(ReplicaError::Dropped("the request for a view waited too long".into()));
        }
        let leader = self.role() == StateRole::Leader;
        let store = self.raw.store();
        let applied = (store.applied_index, store.applied_term);
        let mut snapshots = store.snapshots.lock().unwrap_or_else(|e| e.into_inner());
        snapshots
            .serve_for(applied, &store.conf_state, request.at_least, request.asked_by, leader, now)
            .map_err(|why| ReplicaError::Dropped(format!("shard {}: {why}", self.shard)))
    }

    /// With lease reads, a replica that just opened may have heard from a leader before it
    /// stopped, and that leader's lease counts on it refusing votes for an election timeout after
    /// (which raft-rs, having forgotten the leader, would not): it votes for no one but a
    /// transfer's target until `election_ticks` ticks have passed (`lease`).
    fn refuses_votes_after_opening(&self, message: &Message, ctx: &NodeCtx) -> bool {
        matches!(message.get_msg_type(), MessageType::MsgRequestVote | MessageType::MsgRequestPreVote)
            && ctx.config.lease_reads
            && self.ticks_since_open < ctx.config.election_ticks
            && message.context[..] != *raft::CAMPAIGN_TRANSFER
    }

    /// What membership changes add before Raft steps a message from a peer (`None` drops it): a
    /// replica with no members asks for a snapshot instead of taking entries, and the voter a
    /// leader hands leadership to on request takes itself as the preferred leader.
    fn screen_membership(&mut self, message: Message, ctx: &NodeCtx) -> Option<Message> {
        match message.get_msg_type() {
            // Leadership handed over on request: this node is the shard's preferred leader now.
            MessageType::MsgTimeoutNow if message.context[..] == *crate::membership::REQUESTED_TRANSFER => {
                tracing::info!(shard = self.shard, from = message.from, "taking leadership over on request");
                self.primary = Some(ctx.config.node_id);
            }
            // A follower asks for a snapshot: what this leader counted as its entries then bounds
            // the snapshot it may be sent (`RaftStore::snapshot`).
            MessageType::MsgAppendResponse
                if message.reject
                    && message.request_snapshot != raft::INVALID_INDEX
                    && self.role() == StateRole::Leader =>
            {
                let matched = self.raw.raft.prs().get(message.from).map(|progress| progress.matched);
                if let Some(matched) = matched {
                    self.raw.mut_store().asked_with_matched.insert(message.from, matched);
                }
            }
            // The follower that asked for a snapshot (above; a stalled one) has installed one:
            // raft-rs keeps the request, and the follower in its snapshot state, until the
            // application reports the snapshot's fate. Until then it would send another snapshot
            // in place of every append and, when the snapshot is no newer than what the follower
            // had acknowledged, send it nothing at all (the snapshot timeout, a minute later, was
            // the way out, and a shard needing that follower's vote committed nothing meanwhile).
            MessageType::MsgAppendResponse if !message.reject && self.role() == StateRole::Leader => {
                let installed = self.raw.raft.prs().get(message.from).is_some_and(|progress| {
                    progress.pending_request_snapshot != raft::INVALID_INDEX
                        && progress.state == raft::ProgressState::Snapshot
                        && message.index >= progress.pending_snapshot
                });
                if installed {
                    self.raw.report_snapshot(message.from, raft::SnapshotStatus::Finish);
                }
            }
            // A replica with no members (waiting to be added, or restarted with none) cannot
            // interpret entries: the conf changes in them build on members it never had. It asks
            // the leader for a snapshot instead (raft-rs's own request needs a log with an entry
            // of the current term), which carries the members.
            MessageType::MsgAppend if crate::membership::is_empty(&self.raw.store().conf_state) => {
                let ask = Message {
                    msg_type: MessageType::MsgAppendResponse,
                    to: message.from,
                    from: ctx.config.node_id,
                    term: message.term,
                    index: message.index,
                    reject: true,
                    reject_hint: 0,
                    request_snapshot: message.index.max(1),
                    ..Default::default()
                };
                ctx.transport.send(self.shard, vec![ask]);
                return None;
            }
            _ => {}
        }
        Some(message)
    }

    /// Proposes one step of a membership change (`membership`), checked against the members
    /// now; `done` answers once it is applied here.
    fn propose_member_change(
        &mut self,
        change: crate::MembershipChange,
        done: Done<crate::Members>,
        ctx: &NodeCtx,
    ) {
        if let Some(failed) = &ctx.failed {
            return done(Err(ReplicaError::Storage(failed.clone())));
        }
        if self.role() != StateRole::Leader {
            return done(Err(self.not_leader(ctx)));
        }
        let raft = &self.raw.raft;
        let matched = |node: u64| raft.prs().get(node).map(|progress| progress.matched);
        let view = membership::LeaderView {
            me: ctx.config.node_id,
            members: &self.raw.store().conf_state,
            change_pending: raft.has_pending_conf(),
            commit: raft.raft_log.committed,
            matched: &matched,
        };
        let cc = match membership::conf_change(&change, &view) {
            Ok(cc) => cc,
            Err(error) => return done(Err(error)),
        };
        let before = self.raw.raft.raft_log.last_index();
        match self.raw.propose_conf_change(Vec::new(), cc) {
            Ok(()) if self.raw.raft.raft_log.last_index() > before => {
                let index = self.raw.raft.raft_log.last_index();
                tracing::info!(shard = self.shard, index, ?change, "proposed a membership change");
                if let Some((term, old)) = self.member_changes.insert(index, (self.raw.raft.term, done)) {
                    old(Err(ReplicaError::Dropped(format!(
                        "entry {index} of term {term} was replaced by another leader's"
                    ))));
                }
            }
            Ok(()) => done(Err(ReplicaError::Dropped("the membership change was not appended".into()))),
            Err(err) => done(Err(ReplicaError::Dropped(err.to_string()))),
        }
    }

    /// Starts handing leadership to voter `to`, which also becomes the shard's preferred leader
    /// here (so it is not handed back to the primary). The caller watches the status for the new
    /// leader: a hand-off that does not finish within an election timeout is abandoned by raft-rs.
    fn transfer_leader(&mut self, to: u64, ctx: &NodeCtx) -> Result<(), ReplicaError> {
        if let Some(failed) = &ctx.failed {
            return Err(ReplicaError::Storage(failed.clone()));
        }
        if self.role() != StateRole::Leader {
            return Err(self.not_leader(ctx));
        }
        if to == ctx.config.node_id {
            return Ok(());
        }
        let members = &self.raw.store().conf_state;
        if !members.voters.contains(&to) {
            return Err(ReplicaError::InvalidArgument(format!(
                "node {to} is not a voter of shard {}: leadership goes only to a voter",
                self.shard
            )));
        }
        tracing::info!(shard = self.shard, to, "handing leadership over on request");
        self.primary = Some(to);
        self.requested_transfer = Some(to);
        self.leader_since = None;
        self.hand_leadership_to(to);
        Ok(())
    }

    /// Marks the message that hands leadership to the voter named by a requested transfer, so that
    /// voter takes itself as the shard's preferred leader and does not hand leadership back to the
    /// configured primary (which a caller may be moving away).
    fn mark_requested_transfer(&mut self, mut messages: Vec<Message>) -> Vec<Message> {
        if self.role() != StateRole::Leader {
            self.requested_transfer = None;
        }
        if let Some(to) = self.requested_transfer {
            for message in &mut messages {
                if message.get_msg_type() == MessageType::MsgTimeoutNow && message.to == to {
                    message.context = membership::REQUESTED_TRANSFER.to_vec().into();
                    self.requested_transfer = None;
                }
            }
        }
        messages
    }

    /// Ticks Raft's clock once, re-sends snapshots nobody answered, and hands leadership to the
    /// shard's primary when it is due.
    pub fn tick(&mut self, now: Instant, ctx: &NodeCtx) {
        // A stalled replica does not campaign (it could not serve) unless no leader shows up for
        // long, and asks again for the snapshot it waits for; leading, it gives the leadership up.
        if self.applier.stalled_at.is_none() {
            self.stalled_leader_ticks = 0;
            self.raw.tick();
        } else if self.role() == StateRole::Leader {
            self.give_up_stalled_leadership(ctx);
        } else {
            self.stalled_leader_ticks = 0;
            // Its log may be the only up-to-date one left (the others' votes need it): after
            // three election timeouts without a leader it campaigns after all, and, elected,
            // hands the shard to a voter it brings up to date (`give_up_stalled_leadership`).
            if self.raw.raft.election_elapsed >= 3 * self.raw.raft.election_timeout() {
                self.raw.tick();
            }
            self.ask_for_snapshot();
        }
        if self.applier.stalled_at.is_some() {
            // Its election clock still runs (raft-rs's check-quorum ignores votes while a node
            // heard from a leader within an election timeout: a clock that never moved would
            // have it refuse every vote, and a shard that lost its leader could lack a quorum).
            let raft = &mut self.raw.raft;
            raft.election_elapsed = raft.election_elapsed.saturating_add(1);
        }
        self.ticks_since_open = self.ticks_since_open.saturating_add(1);
        if let Some(rejoin) = &mut self.rejoin {
            rejoin.ticks = rejoin.ticks.saturating_add(1);
        }
        self.retry_lost_snapshots(now, ctx);
        self.prefer_primary(now, ctx);
        self.leave_joint_if_stuck();
        // Fetched snapshots whose message never reached Raft (dropped on the way, or refused while
        // rejoining) stop holding the recovery point back; a later message fetches again.
        let pending = self.raw.raft.raft_log.unstable.snapshot.as_ref().map(|s| s.get_metadata().index);
        let mut staged = self.state.staged.lock().unwrap_or_else(|e| e.into_inner());
        staged.expire(Instant::now(), crate::snapshot::stream::KEEP_STAGED, pending);
    }

    /// A leader that cannot apply (stalled: an ORDER naming a fast write it lacks, a put by
    /// reference to a value its GC compressed) could not answer anything, and would hold the shard
    /// for good: it does not tick (so never steps down), and the appends of the proposals clients
    /// keep sending it keep the followers from campaigning. It hands the leadership to the most
    /// caught-up active voter at once, and steps down after an election timeout if it still leads
    /// (no such voter answered, or the transfer did not complete): the others then elect a leader,
    /// and this replica asks that one for its snapshot. A shard's only voter keeps leading (no
    /// other could take over or send it a snapshot).
    fn give_up_stalled_leadership(&mut self, ctx: &NodeCtx) {
        let me = ctx.config.node_id;
        let voters = &self.raw.store().conf_state.voters;
        if voters.iter().all(|&id| id == me) {
            return;
        }
        self.stalled_leader_ticks += 1;
        if self.stalled_leader_ticks == 1 {
            if let Some(target) = self.successor(me) {
                tracing::warn!(
                    shard = self.shard,
                    to = target,
                    "stalled: handing leadership to another node"
                );
                self.hand_leadership_to(target);
            }
        } else if self.stalled_leader_ticks > ctx.config.election_ticks {
            tracing::warn!(shard = self.shard, "stalled: stepping down so another node is elected");
            let term = self.raw.raft.term;
            self.raw.raft.become_follower(term, raft::INVALID_ID);
            self.stalled_leader_ticks = 0;
        }
    }

    /// The voter a leader hands its leadership to when it must give it up: the most caught-up one
    /// among those that answered lately and are not waiting for a snapshot (a stalled replica
    /// refuses a hand-off); ties go to the lowest id.
    pub(crate) fn successor(&self, me: u64) -> Option<u64> {
        let voters = &self.raw.store().conf_state.voters;
        self.raw
            .raft
            .prs()
            .iter()
            .filter(|(id, progress)| {
                **id != me && voters.contains(id) && progress.recent_active && !awaits_snapshot(progress)
            })
            .max_by_key(|(id, progress)| (progress.matched, std::cmp::Reverse(**id)))
            .map(|(id, _)| *id)
    }

    /// A leader that is not the shard's primary hands leadership to it once this node has led for
    /// an election timeout (so a primary that just came back is not handed a group at once, and
    /// leadership does not bounce) and the primary is active and has every entry; at most one
    /// attempt per election timeout. Not while this node's disk is full: the disk-full hand-off
    /// (`disk_space`) decides then.
    fn prefer_primary(&mut self, now: Instant, ctx: &NodeCtx) {
        let me = ctx.config.node_id;
        if self.role() != StateRole::Leader {
            self.leader_since = None;
            return;
        }
        let Some(primary) = self.primary.filter(|&primary| primary != me) else { return };
        let since = *self.leader_since.get_or_insert(now);
        let election = ctx.config.tick * ctx.config.election_ticks as u32;
        if now.saturating_duration_since(since) < election
            || self.raw.raft.lead_transferee.is_some()
            || ctx.disk.alarm().is_some()
            || !self.raw.store().conf_state.voters.contains(&primary)
        {
            return;
        }
        let last = self.raw.raft.raft_log.last_index();
        // Not to a primary waiting for a snapshot (a stalled replica refuses the hand-off, and
        // Raft refuses proposals while one is under way).
        let caught_up = self
            .raw
            .raft
            .prs()
            .get(primary)
            .is_some_and(|p| p.recent_active && p.matched >= last && !awaits_snapshot(p));
        if !caught_up {
            return;
        }
        tracing::info!(shard = self.shard, to = primary, "handing leadership to the shard's primary");
        self.hand_leadership_to(primary);
        self.leader_since = Some(now);
    }

    /// raft-rs waits for the application to report a snapshot's fate; our transport does not know
    /// it. A follower still waiting after `snapshot_timeout` is reported failed, so the leader
    /// probes it again and sends a new snapshot if it still needs one.
    fn retry_lost_snapshots(&mut self, now: Instant, ctx: &NodeCtx) {
        if self.role() != StateRole::Leader {
            self.snapshot_sends.clear();
            self.raw.store().snapshots.lock().unwrap_or_else(|e| e.into_inner()).release(now);
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
            *id != ctx.config.node_id
                && (progress.state == raft::ProgressState::Snapshot || progress.next_idx < first)
        });
        let mut snapshots = self.raw.store().snapshots.lock().unwrap_or_else(|e| e.into_inner());
        if needed {
            snapshots.drop_idle(Instant::now());
        } else {
            snapshots.release(now);
        }
        drop(snapshots);
        for id in waiting {
            let since = *self.snapshot_sends.entry(id).or_insert(now);
            // A follower still fetching a streamed snapshot has not lost it.
            let fetching = now.checked_sub(ctx.config.snapshot_timeout).is_some_and(|recent| {
                self.raw.store().snapshots.lock().unwrap_or_else(|e| e.into_inner()).fetched_by(id, recent)
            });
            if fetching {
                self.snapshot_sends.insert(id, now);
            } else if now.duration_since(since) >= ctx.config.snapshot_timeout {
                tracing::warn!(
                    shard = self.shard,
                    follower = id,
                    "no answer to a snapshot; sending it again"
                );
                self.raw.report_snapshot(id, raft::SnapshotStatus::Failure);
                self.snapshot_sends.remove(&id);
            }
        }
    }

    /// Proposes repairs (through Raft, so every replica sees them in the same order): this
    /// replica's healthy copies offered in answer to repair requests it applied, and requests for
    /// a healthy copy of each value found damaged here. On a follower raft-rs forwards the proposal
    /// to the leader; a proposal lost on the way (or refused: no leader yet) is asked again after
    /// an election timeout while the damaged value is still the key's current one.
    pub fn propose_repairs(&mut self, now: Instant, ctx: &mut NodeCtx) {
        for (key, value) in self.applier.take_offers() {
            let data = crate::codec::encode_repair(ctx.clock.ms(now), &key, &value);
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
        let election = ctx.config.tick * ctx.config.election_ticks as u32;
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
            let data = crate::codec::encode_repair_request(ctx.clock.ms(now), &key);
            if let Err(err) = self.raw.propose(Vec::new(), data) {
                tracing::debug!(%err, "asking for a copy of a damaged value was refused; asking again later");
            }
            self.repairs.insert(key, (position, Some(now), times.saturating_add(1)));
            asked += 1;
        }
    }

    /// The entry of a client's command, proposed now at `time_ms` by this leader: a write whose
    /// values keys of the shard hold already puts them by reference to those keys when this node
    /// deduplicates inline (`wire_refs`).
    fn encode_command(&mut self, request_id: crate::RequestId, time_ms: u64, command: &Command) -> Vec<u8> {
        let sources = match (&self.state.dedup, command) {
            (Some(dedup), Command::Write(ops)) if dedup.proposes_references() => {
                let store = self.raw.store();
                let (term, last, applied) =
                    (self.raw.raft.term, self.raw.raft.raft_log.last_index(), store.applied_index);
                self.wire_refs.enter_term(term, last);
                self.wire_refs
                    .sources(command, time_ms, applied, dedup, &self.state)
                    .map(|sources| (ops, sources))
            }
            _ => None,
        };
        match sources {
            Some((ops, sources)) => {
                let sources: Vec<Option<&[u8]>> = sources.iter().map(|source| source.as_deref()).collect();
                crate::codec::encode_write_with_references(request_id, time_ms, ops, &sources)
            }
            None => crate::codec::encode(request_id, time_ms, command),
        }
    }

    /// The time to stamp a leader's entry with: the node's clock, but never behind the latest
    /// leader time applied here, so the times in a shard's log do not go back when leadership
    /// moves to a node whose clock is behind (expiry is judged by them).
    pub(crate) fn entry_time(&self, now: Instant, ctx: &mut NodeCtx) -> u64 {
        let applied = self.state.applied_time_ms.load(std::sync::atomic::Ordering::Relaxed);
        ctx.clock.ms(now).max(applied)
    }

    /// While this node leads, reads the next page of the expiry sweep and proposes the deletion
    /// of the keys it found expired (`expiry`). Called once per tick.
    pub fn sweep_expired(&mut self, now: Instant, ctx: &mut NodeCtx) {
        if self.role() != StateRole::Leader || self.raw.raft.lead_transferee.is_some() {
            self.expiry_sweep.reset();
            return;
        }
        let now_ms = self.entry_time(now, ctx);
        let interval_ms = ctx.config.expiry_sweep_interval.as_millis() as u64;
        match self.expiry_sweep.next_page(&self.state, now_ms, interval_ms) {
            Ok(keys) if keys.is_empty() => {}
            Ok(keys) => {
                let data = crate::codec::encode_delete_expired(now_ms, &keys);
                let next = self.raw.raft.raft_log.last_index() + 1;
                self.wire_refs.note_proposed(self.raw.raft.term, next, &data);
                if let Err(err) = self.raw.propose(Vec::new(), data) {
                    tracing::debug!(shard = self.shard, %err, "deleting expired keys was refused; the next pass finds them");
                }
            }
            Err(err) => {
                tracing::warn!(shard = self.shard, %err, "the expiry sweep failed; trying again next tick")
            }
        }
    }

    /// Whether `key` still points at the damaged value at `position` (not repaired, rewritten or
    /// deleted since).
    fn still_damaged(&self, key: &[u8], position: u64) -> bool {
        match self.state.tree.get(key) {
            Ok(Some(stored)) => onekv_index::IndexValue::decode(&stored)
                .is_ok_and(|value| value.log_bytes().is_some_and(|at| at.position == position)),
            Ok(None) => false,
            // The index failing is not the repair's to report: assume the damage is still there.
            Err(_) => true,
        }
    }

    /// Sends one ReadIndex request for every barrier that arrived this turn, once this leader has
    /// committed an entry of its term. raft-rs 0.7 silently drops a ReadIndex request before that
    /// (etcd queues it instead), which left the barrier waiting until its caller gave up (a 5 s
    /// client timeout after each leader change); so barriers wait here, unsent, for the new
    /// leader's first commit (its empty entry, one round), or fail if leadership is lost.
    ///
    /// With a usable read lease ([`crate::lease`]) the barriers are answered at the commit index
    /// instead, without a round; a round without barriers renews a lease half spent.
    pub fn send_read_index(&mut self) {
        let turn = self.raw.store().now;
        // The lease is judged at this moment, not at the turn's start: a turn may take a while.
        let now = self.lease.as_ref().map_or(turn, |lease| lease.clock(turn));
        let leader = self.role() == StateRole::Leader;
        let renew = leader && self.lease.as_ref().is_some_and(|lease| lease.wants_renewal(now));
        if self.reads_unsent.is_empty() && !renew {
            return;
        }
        if leader && !self.raw.raft.commit_to_current_term() {
            return;
        }
        if leader && let Some(lease) = &mut self.lease {
            // A hand-off started outside `hand_leadership_to` still ends the lease.
            if self.raw.raft.lead_transferee.is_some() {
                lease.suspend();
            }
            if lease.usable(now) && !self.reads_unsent.is_empty() {
                // No other leader can have committed anything: the commit index is the read index.
                lease.answered();
                let barriers = std::mem::take(&mut self.reads_unsent);
                self.reads_by_lease += barriers.len() as u64;
                self.reads_waiting.push_back((self.raw.raft.raft_log.committed, barriers));
                self.resolve_reads();
                if !renew {
                    return;
                }
            }
        }
        let ctx = self.next_read_ctx;
        self.next_read_ctx += 1;
        self.reads_by_read_index += self.reads_unsent.len() as u64;
        self.reads_in_flight.insert(ctx, std::mem::take(&mut self.reads_unsent));
        if leader && let Some(lease) = &mut self.lease {
            // The turn's start: no later than the round leaves.
            lease.sent(ctx, turn);
        }
        self.raw.read_index(read_context(ctx, self.raw.raft.id));
    }

    /// Starts handing this shard's leadership to voter `to`; no read lease is used for the rest of
    /// this term (the target campaigns at once, and the followers vote for it whatever they heard
    /// from this leader).
    pub fn hand_leadership_to(&mut self, to: u64) {
        if let Some(lease) = &mut self.lease {
            lease.suspend();
        }
        self.raw.transfer_leader(to);
    }

    /// The first half of handling a Ready: sends what may leave before persistence, installs a
    /// snapshot, and returns the records the node must append for this group (`None`: no Ready).
    ///
    /// A snapshot whose tree is rebuilt off the loop holds the Ready: until the rebuild ends this
    /// returns `None`, then the Ready goes on as if the install had been inline.
    pub fn prepare(&mut self, ctx: &mut NodeCtx) -> Result<Option<Prepared>, ReplicaError> {
        let mut ready = match self.installing.take() {
            Some(installing) => match installing.job.poll() {
                None => {
                    self.installing = Some(installing);
                    return Ok(None);
                }
                Some(result) => {
                    result?;
                    self.installed(installing.job.index, installing.job.chunks, installing.job.started);
                    installing.ready
                }
            },
            None => {
                if !self.raw.has_ready() {
                    return Ok(None);
                }
                let mut ready = self.raw.ready();
                if let Some(ss) = ready.ss()
                    && ss.raft_state != StateRole::Leader
                {
                    self.lost_leadership(ctx);
                }
                let messages = self.mark_requested_transfer(ready.take_messages());
                ctx.transport.send(self.shard, messages);
                let applied_before = self.raw.store().applied_index;
                if !ready.snapshot().is_empty()
                    && let Some(job) = self.install_snapshot(ready.snapshot().clone(), ctx)?
                {
                    self.shared.installing.store(job.index, Ordering::SeqCst);
                    self.installing = Some(Installing { job, ready, applied_before });
                    return Ok(None);
                }
                ready
            }
        };
        let entries = ready.take_entries();
        let mut records: Vec<(onekv_log::RecordKind, Vec<u8>)> =
            entries.iter().map(|e| (records::ENTRY, records::encode_entry(self.shard, e))).collect();
        let mut new_hs = None;
        if let Some(hs) = ready.hs() {
            let record =
                HardStateRecord { shard: self.shard, term: hs.term, vote: hs.vote, commit: hs.commit };
            if record != self.persisted_hs {
                records.push((records::HARD_STATE, records::encode_hard_state(record)));
                new_hs = Some((record, hs.clone()));
            }
        }
        Ok(Some(Prepared { ready, entries, records, new_hs }))
    }

    /// The second half: `locators` are where the node appended `prepared.records` (durable now).
    /// Records them in Raft's storage, applies what is committed, sends what had to wait for
    /// persistence and answers.
    pub fn finish(
        &mut self,
        prepared: Prepared,
        locators: &[onekv_log::Locator],
        ctx: &mut NodeCtx,
    ) -> Result<(), ReplicaError> {
        let Prepared { mut ready, entries, records, new_hs } = prepared;
        let store = self.raw.mut_store();
        for (entry, locator) in entries.iter().zip(locators) {
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
            for (entry, (_, payload)) in entries.iter().zip(&records) {
                self.entry_tree_seqno += 1;
                tree.insert(&entry.index.to_be_bytes(), payload, self.entry_tree_seqno);
            }
            tree.publish(self.entry_tree_seqno);
        }
        let committed = ready.take_committed_entries();
        self.apply(committed)?;
        ctx.transport.send(self.shard, ready.take_persisted_messages());
        for read in ready.take_read_states() {
            let Some(id) = read_context_id(&read.request_ctx, self.raw.raft.id) else { continue };
            if let Some(lease) = &mut self.lease {
                lease.confirmed(id);
            }
            if let Some(dones) = self.reads_in_flight.remove(&id) {
                self.reads_waiting.push_back((read.index, dones));
            }
        }
        let mut light = self.raw.advance(ready);
        let messages = self.mark_requested_transfer(light.take_messages());
        ctx.transport.send(self.shard, messages);
        self.apply(light.take_committed_entries())?;
        self.raw.advance_apply();
        self.release_fast_reads();
        self.resolve_reads();
        Ok(())
    }

    /// A hard state whose commit covers everything committed, when it is ahead of the last one
    /// appended (raft-rs reports some commit advances only after the Ready that carried the hard
    /// state), so a later flush may record that far. The node appends it without waiting and
    /// calls [`Group::commit_appended`].
    pub fn commit_to_persist(&self) -> Option<HardStateRecord> {
        // The held Ready's hard state goes first, once the install ends: a newer one appended
        // before it would be followed by an older term or vote.
        if self.installing.is_some() {
            return None;
        }
        let commit = self.raw.raft.raft_log.committed;
        if commit <= self.persisted_hs.commit {
            return None;
        }
        Some(HardStateRecord {
            commit,
            term: self.raw.raft.term,
            vote: self.raw.raft.vote,
            ..self.persisted_hs
        })
    }

    /// `record` (from [`Group::commit_to_persist`]) was submitted to the log.
    pub fn commit_appended(&mut self, record: HardStateRecord) {
        self.persisted_hs = record;
        let store = self.raw.mut_store();
        store.hard_state.commit = record.commit;
        store.hard_state.term = record.term;
        store.hard_state.vote = record.vote;
    }

    fn apply(&mut self, committed: Vec<Entry>) -> Result<(), ReplicaError> {
        // A stalled replica applies nothing until a snapshot replaces its state (`fast::group`).
        if committed.is_empty() || self.applier.stalled_at.is_some() {
            return Ok(());
        }
        crate::failpoint!("before-apply");
        if crate::failpoints::stalled_node() == Some(self.raw.raft.id) {
            self.applier.stalled_at = Some(committed[0].index);
            self.stall(committed[0].index);
            return Ok(());
        }
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
        self.apply_member_changes(&committed[..applied.len()])?;
        if let Some(at) = self.applier.stalled_at {
            self.stall(at);
        }
        crate::failpoint!("after-apply");
        let store = self.raw.mut_store();
        if let Some(last) = applied.last() {
            store.applied_index = last.index;
            store.applied_term = last.term;
            self.wire_refs.note_applied(last.index);
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

    /// Applies the conf changes among `committed` (already applied by the applier, which skips
    /// them) to raft-rs and to the members Raft's storage reports and flushes record, and answers
    /// the callers that proposed them.
    fn apply_member_changes(&mut self, committed: &[Entry]) -> Result<(), ReplicaError> {
        for entry in committed {
            let cc = membership::decoded_conf_change(entry)?;
            if cc.is_none()
                && self.member_changes.first_key_value().is_none_or(|(index, _)| *index > entry.index)
            {
                continue;
            }
            let outcome = match cc {
                Some(cc) => match self.raw.apply_conf_change(&cc) {
                    Ok(members) => {
                        let shown = crate::Members::from(&members);
                        tracing::info!(shard = self.shard, index = entry.index, members = ?shown, "membership changed");
                        self.raw.mut_store().conf_state = members;
                        Ok(shown)
                    }
                    // Every replica refuses the same change alike (they hold the same members).
                    Err(err) => {
                        tracing::warn!(shard = self.shard, index = entry.index, %err, "a committed membership change was refused");
                        Err(ReplicaError::InvalidArgument(format!(
                            "the membership change was refused: {err}"
                        )))
                    }
                },
                // raft-rs replaces a conf change it will not take with an empty entry.
                None => {
                    Err(ReplicaError::Dropped("Raft did not take the membership change: ask again".into()))
                }
            };
            while let Some(waiting) = self.member_changes.first_entry() {
                if *waiting.key() > entry.index {
                    break;
                }
                let (index, (term, done)) = waiting.remove_entry();
                if (index, term) == (entry.index, entry.term) {
                    done(outcome.clone());
                } else {
                    done(Err(ReplicaError::Dropped(format!(
                        "entry {index} of term {term} was replaced by another leader's"
                    ))));
                }
            }
        }
        Ok(())
    }

    /// A leader in a joint configuration it should leave on its own, with no conf change pending,
    /// proposes leaving it. raft-rs proposes the leave itself when it applies the entry that
    /// entered the joint configuration (a new leader too, once it applies its log's tail); this is
    /// a backstop (its own TODO notes a leader may step down before that), never a second leave
    /// (both wait for no pending change).
    fn leave_joint_if_stuck(&mut self) {
        let members = &self.raw.store().conf_state;
        if self.role() != StateRole::Leader
            || members.voters_outgoing.is_empty()
            || !members.auto_leave
            || self.raw.raft.has_pending_conf()
        {
            return;
        }
        tracing::info!(shard = self.shard, "leaving the joint configuration an earlier leader entered");
        if let Err(err) = self.raw.propose_conf_change(Vec::new(), raft::eraftpb::ConfChangeV2::default()) {
            tracing::debug!(shard = self.shard, %err, "leaving the joint configuration was refused; trying again");
        }
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

    fn lost_leadership(&mut self, ctx: &NodeCtx) {
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
        for (index, (term, done)) in std::mem::take(&mut self.member_changes) {
            done(Err(ReplicaError::Dropped(format!(
                "leadership lost while the membership change at entry {index} of term {term} was pending; \
                 it may still commit: read the shard's members before asking again"
            ))));
        }
        if let Some(lease) = &mut self.lease {
            lease.end();
        }
        // A follower refers to nothing: its table goes (it would hold memory per shard ever led).
        self.wire_refs.stop_leading();
        let leader = self.not_leader(ctx);
        self.fast_lost_leadership(&leader);
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

    /// Flushes the tree once its memtable is large, or holds many entries, or is old (so the
    /// replay after a crash, Raft's metadata and the request window stay bounded even when few
    /// bytes are written), but only up to a durably committed index; then lets Raft forget entries
    /// far enough below it. One flush at a time per node: a group whose flush is due waits while
    /// another group's runs.
    pub fn maybe_flush(&mut self, now: Instant, ctx: &mut NodeCtx) -> Result<(), ReplicaError> {
        let applied = self.raw.store().applied_index;
        let flagged = self.state.tree.flush_flag().unwrap_or(0);
        // The collector's flush goes even with nothing newly applied (an idle shard's recovery
        // point, or relocated locators); otherwise a flag never repeats. Nothing is flushed
        // before the first entry is applied, except the recovery point of a replica with no
        // entries at all (one waiting to be added), which the collector may need moved forward.
        let waiting = applied == 0 && self.raw.store().last() == 0 && self.gc_flush;
        if (applied == 0 && !waiting)
            || self.installing.is_some()
            || (applied <= flagged && !self.gc_flush)
            || ctx.maintenance.busy()
            || ctx.failed.is_some()
        {
            return Ok(());
        }
        let last_flush = *self.last_flush.get_or_insert(now);
        let due = self.gc_flush
            || self.memtable_due(ctx)
            || applied - flagged >= ctx.config.flush_every_entries
            || now.saturating_duration_since(last_flush) >= ctx.config.flush_every;
        if !due {
            return Ok(());
        }
        if self.shared.durable_commit.load(Ordering::SeqCst) < applied {
            // The hard state covering `applied` was submitted without waiting. Appending it again
            // and waiting makes it (and everything queued before it) durable: the flag may not run
            // ahead of the commit index recovery will see.
            let record = self.persisted_hs;
            ctx.raft_log
                .append(&[(records::HARD_STATE, &records::encode_hard_state(record))])
                .map_err(|e| storage(format!("appending the hard state: {e}")))?;
            self.shared.durable_commit.fetch_max(record.commit, Ordering::SeqCst);
            if record.commit < applied {
                return Ok(());
            }
        }
        self.last_flush = Some(now);
        self.flush_index(applied, ctx)
    }

    /// Seals the tree with `applied` as its flag and has the maintenance thread make it durable,
    /// after letting Raft forget entries more than `raft_log_keep_entries` below it; the flag
    /// carries where the next recovery's scan may start for this shard (the record of the first
    /// entry Raft still serves), so a restart reads only that far back. The caller has made the
    /// hard state covering `applied` durable.
    ///
    /// Forgetting entries before the flush is durable is safe: Raft forgets only its in-memory
    /// map, the records stay in the log, and the previous flag's recovery point still scans them.
    fn flush_index(&mut self, applied: u64, ctx: &mut NodeCtx) -> Result<(), ReplicaError> {
        if ctx.crash_at(crate::maintenance::CrashPoint::BeforeSeal) {
            return Ok(());
        }
        let keep = ctx.config.raft_log_keep_entries;
        let mut compact_to = applied.saturating_sub(keep);
        if self.gc_flush {
            // The collector waits for this shard's recovery point to move: Raft forgets every
            // applied entry no active follower still needs (an idle shard would otherwise keep
            // its last entries, and the log below them, for ever).
            compact_to = compact_to.max(self.fully_replicated(applied, ctx) + 1);
        }
        // A follower fetching a streamed snapshot goes on from the entry after it.
        let fetched =
            self.raw.store().snapshots.lock().unwrap_or_else(|e| e.into_inner()).fetch_floor(Instant::now());
        if let Some(index) = fetched {
            compact_to = compact_to.min(index + 1);
        }
        if compact_to > 0 {
            self.raw.mut_store().compact(compact_to);
        }
        let store = self.raw.store();
        // The fast writes pending at this flush (`fast`): recovery must meet their records, and
        // takes as pending below the log's end now only those named here. Written also with the
        // fast path off and nothing pending: a record ordered earlier may lie above the entries
        // Raft keeps, and must not be taken as pending again once the fast path is back on.
        let fast = Some(self.fast_point(ctx.raft_log.end_position()));
        let scan_from = match store.meta(store.first()) {
            Some(first) => first.locator.position - onekv_log::RECORD_HEADER_LEN as u64,
            // No entry retained (after a snapshot, or everything applied was forgotten): every
            // record of this shard that recovery needs is appended after the log's end now.
            None => ctx.raft_log.end_position(),
        };
        let note = records::encode_recovery_point(&records::RecoveryPoint {
            scan_from,
            chunks_from: self.held_back(scan_from),
            snapshot_index: store.snapshot_index,
            snapshot_term: store.snapshot_term,
            hard_state: self.persisted_hs,
            members: store.conf_state.clone(),
            fast,
        });
        self.gc_flush = false;
        if ctx.budget_flush == Some(self.shard) {
            ctx.budget_flush = None;
            ctx.budget_flushes += 1;
        }
        crate::failpoint!("before-index-flush");
        // The data and the request-id window share the tree, so one flag covers both.
        self.state
            .tree
            .seal(applied, state::flag_seqno(applied, self.state.tree.last_written_seqno()), &note)
            .map_err(|e| storage(format!("flushing the index: {e}")))?;
        let layout = self.index_layout(ctx);
        let mut trees = vec![(self.state.tree.clone(), layout)];
        // (Classic mode's entry tree has nothing to flush before the first entry, and refuses a
        // flag at seqno 0.) It is read only to serve entries, so it is kept in the same layout.
        if let Some(tree) = self.state.entry_tree.as_ref().filter(|_| applied > 0) {
            tree.seal(applied, self.entry_tree_seqno, &[])
                .map_err(|e| storage(format!("flushing entries: {e}")))?;
            trees.push((tree.clone(), layout));
        }
        if ctx.crash_at(crate::maintenance::CrashPoint::AfterSeal) {
            return Ok(());
        }
        let hook = &mut ctx.crash_hook;
        let outcome =
            ctx.maintenance.flush(trees, &mut |point| hook.as_mut().is_some_and(|hook| hook(point)));
        if outcome.is_err() {
            ctx.crashed = true;
            return Ok(());
        }
        if let Some(failure) = ctx.maintenance.failure() {
            return Err(storage(failure));
        }
        Ok(())
    }

    /// Whether the memtable holds enough to flush: a tree that shares the followers' budget
    /// (`ReplicaConfig::follower_memtable_bytes`) when the node chose it ([`NodeCtx::budget_flush`]),
    /// or once it alone holds [`FOLLOWER_MEMTABLES`] memtables' worth (or the whole budget, if
    /// less: one busy followed shard stays within a few memtables, like a leader's); any other
    /// tree at `memtable_bytes`.
    fn memtable_due(&self, ctx: &NodeCtx) -> bool {
        if self.shares_follower_budget(ctx) {
            let alone = ctx
                .config
                .memtable_bytes
                .saturating_mul(FOLLOWER_MEMTABLES)
                .min(ctx.config.follower_memtable_bytes);
            ctx.budget_flush == Some(self.shard) || self.state.tree.memtable_bytes() >= alone
        } else {
            self.state.tree.memtable_full()
        }
    }

    /// Whether this shard's memtable counts against the budget the node's followed shards share:
    /// its tree is kept as runs (this node only follows the shard) and the budget is on.
    pub fn shares_follower_budget(&self, ctx: &NodeCtx) -> bool {
        ctx.config.follower_memtable_bytes > 0
            && matches!(self.index_layout(ctx), onekv_index::Layout::Runs(_))
    }

    /// Bytes in the active memtable of this shard's tree, and whether a flush could start now if
    /// it were due (no snapshot install holds the tree, and something applied is unflushed).
    pub fn memtable_for_budget(&self) -> (u64, bool) {
        let applied = self.raw.store().applied_index;
        let flagged = self.state.tree.flush_flag().unwrap_or(0);
        (self.state.tree.memtable_bytes(), self.installing.is_none() && applied > flagged)
    }

    /// The layout this shard's tree should have now: leveled while this node leads the shard or is
    /// its primary (it serves, or is about to serve, the shard's reads), else as configured for
    /// followers ([`crate::IndexLayout`]).
    pub fn index_layout(&self, ctx: &NodeCtx) -> onekv_index::Layout {
        let serves = self.role() == StateRole::Leader || self.primary == Some(ctx.config.node_id);
        ctx.config.index_layout.for_role(serves)
    }

    /// Keeps a served shard's tree leveled: when the tree should be leveled and a leveled step may
    /// still find work (after a flush, or once this node starts serving a tree it kept as runs), a
    /// job of one compaction step, when the maintenance thread is idle (the loop calls this after
    /// every group had its chance to flush). Reads stay correct meanwhile, only slower. The
    /// change from runs to leveled is timed and logged.
    pub fn maybe_level(&mut self, now: Instant, ctx: &mut NodeCtx) {
        if self.installing.is_some() {
            return;
        }
        let layout = self.index_layout(ctx);
        if layout != self.layout {
            tracing::info!(
                shard = self.shard,
                from = self.layout.name(),
                to = layout.name(),
                "index layout changes"
            );
            self.leveling_since = (layout == onekv_index::Layout::Leveled).then_some(now);
            self.layout = layout;
        }
        if layout != onekv_index::Layout::Leveled {
            return;
        }
        let trees: Vec<_> = std::iter::once(&self.state.tree)
            .chain(self.state.entry_tree.as_ref())
            .filter(|tree| !tree.is_leveled())
            .map(|tree| (tree.clone(), layout))
            .collect();
        if trees.is_empty() {
            if let Some(since) = self.leveling_since.take() {
                let took = now.saturating_duration_since(since);
                self.last_leveling = Some(took);
                tracing::info!(shard = self.shard, took_ms = took.as_millis() as u64, "index tree leveled");
            }
            return;
        }
        if !ctx.config.index_compaction || ctx.maintenance.busy() || ctx.failed.is_some() {
            return;
        }
        let hook = &mut ctx.crash_hook;
        if ctx.maintenance.compact(trees, &mut |point| hook.as_mut().is_some_and(|hook| hook(point))).is_err()
        {
            ctx.crashed = true;
        }
    }

    /// The highest applied index every recently active member has (on a follower: `applied`, as
    /// it serves no entries).
    fn fully_replicated(&self, applied: u64, ctx: &NodeCtx) -> u64 {
        if self.role() != StateRole::Leader {
            return applied;
        }
        self.raw
            .raft
            .prs()
            .iter()
            .filter(|(id, progress)| **id != ctx.config.node_id && progress.recent_active)
            .map(|(_, progress)| progress.matched)
            .fold(applied, u64::min)
    }

    /// Points each key of `moves` at its relocated copy if it still points at the old one (the
    /// log garbage collector appended the copies durably first), at one sequence number above
    /// every write so far and below the next entry's (`state::relocation_seqno`), published at
    /// once; the tree is flushed soon after, so the collector may delete the old copies.
    pub fn relocate(&mut self, moves: Vec<crate::gc::Move>) -> Result<crate::gc::Relocated, String> {
        if let Some(installing) = &self.installing {
            return Err(format!(
                "shard {} is installing the snapshot at index {} (a later round moves its values)",
                self.shard, installing.job.index
            ));
        }
        let tree = &self.state.tree;
        let still_there = |m: &crate::gc::Move| self.state.points_at(&m.key, &m.from);
        let pointing_at = |m: &crate::gc::Move| self.state.pointing_at(&m.key, &m.from);
        let applied = self.raw.store().applied_index;
        let Some(seqno) = state::relocation_seqno(applied, tree.last_written_seqno()) else {
            let mut left = 0;
            for m in &moves {
                left += usize::from(still_there(m)?);
            }
            return Ok(crate::gc::Relocated { moved: 0, left });
        };
        let mut moved = 0;
        let mut left = 0;
        for m in &moves {
            // The moved copy keeps the key's expiry: the move changes where the value is, nothing
            // else.
            if let Some(expiry) = pointing_at(m)? {
                tree.insert(&m.key, &m.to.encode_expiring(expiry), seqno);
                moved += 1;
            }
            // Keys a put by reference pointed at the old copy after the census (`wire_refs`) go
            // where it goes; a copy moving into a compressed block cannot be shared, so they
            // stay, and so does the segment (the next census sees them).
            let late = match (&self.state.dedup, m.from.whole_locator()) {
                (Some(dedup), Some(from)) => dedup.take_late_references(self.shard, from),
                _ => Vec::new(),
            };
            for key in late {
                let late_move = crate::gc::Move {
                    key,
                    from: onekv_index::IndexValue::Shared(m.from.whole_locator().expect("whole")),
                    to: m.to.clone(),
                };
                let Some(expiry) = pointing_at(&late_move)? else { continue };
                match m.to.whole_locator() {
                    Some(to) => {
                        tree.insert(
                            &late_move.key,
                            &onekv_index::IndexValue::Shared(to).encode_expiring(expiry),
                            seqno,
                        );
                        moved += 1;
                    }
                    None => left += 1,
                }
            }
        }
        if moved == 0 {
            return Ok(crate::gc::Relocated { moved, left });
        }
        tree.publish(seqno);
        self.gc_flush = true;
        Ok(crate::gc::Relocated { moved, left })
    }

    /// `scan_from`, or the first position of a snapshot this shard is fetching if that is lower:
    /// the recovery point's `chunks_from`, so a recovery finds every stored chunk of it and the
    /// log GC keeps them (its entries still count only from `scan_from`).
    fn held_back(&self, scan_from: u64) -> u64 {
        let staged = self.state.staged.lock().unwrap_or_else(|e| e.into_inner()).hold_back();
        staged.map_or(scan_from, |position| position.min(scan_from))
    }

    /// Steps a snapshot message whose chunks this node's fetcher stored: only if they are still
    /// there (anything else marked so is not ours to trust), and drops them if Raft does not take
    /// the snapshot (it is behind what this replica has).
    fn step_staged(&mut self, message: Message) {
        let index = message.get_snapshot().get_metadata().index;
        if !self.state.staged.lock().unwrap_or_else(|e| e.into_inner()).is_complete(index) {
            tracing::warn!(
                shard = self.shard,
                index,
                from = message.from,
                "dropped a staged snapshot with no stored chunks"
            );
            return;
        }
        let stale_term = message.term < self.raw.raft.term;
        if let Err(err) = self.raw.step(message) {
            tracing::debug!(shard = self.shard, %err, "dropped a staged snapshot");
        }
        let taken = self
            .raw
            .raft
            .raft_log
            .unstable
            .snapshot
            .as_ref()
            .is_some_and(|s| s.get_metadata().index == index);
        // A message of an older term is ignored by Raft whatever it carries: the chunks stay for
        // the current leader's message of the same index (or expire).
        if !taken && !stale_term {
            tracing::info!(
                shard = self.shard,
                index,
                "a fetched snapshot is behind this replica; dropping it"
            );
            self.state.staged.lock().unwrap_or_else(|e| e.into_inner()).drop_complete(index);
        }
    }

    /// Writes a snapshot's metadata (and, for one sent whole, its chunks), hands it to Raft's
    /// storage, and rebuilds the tree from it: inline in a simulation (`None`), otherwise on an
    /// install thread whose job is returned ([`crate::snapshot::install`]).
    fn install_snapshot(
        &mut self,
        snapshot: raft::eraftpb::Snapshot,
        ctx: &NodeCtx,
    ) -> Result<Option<crate::snapshot::install::Install>, ReplicaError> {
        let meta = snapshot.get_metadata();
        let meta = SnapshotMeta {
            shard: self.shard,
            index: meta.index,
            term: meta.term,
            chunks: 0,
            members: meta.get_conf_state().clone(),
        };
        let started = Instant::now();
        tracing::info!(
            shard = self.shard,
            index = meta.index,
            term = meta.term,
            streamed = snapshot.data.as_ref() == crate::snapshot::stream::STAGED,
            "installing a snapshot"
        );
        let chunks = if snapshot.data.as_ref() == crate::snapshot::stream::STAGED {
            // Only `step_staged` lets one through, and only the loop takes stagings.
            let chunks =
                self.state.staged.lock().unwrap_or_else(|e| e.into_inner()).take_complete(meta.index);
            let chunks = chunks.ok_or_else(|| {
                storage(format!(
                    "shard {}: the chunks of the snapshot at {} are gone",
                    self.shard, meta.index
                ))
            })?;
            self.applier.persist_snapshot_meta(&meta, chunks.len())?;
            crate::failpoint!("after-snapshot-meta");
            chunks
        } else {
            self.applier.persist_snapshot(&meta, &snapshot.data)?
        };
        self.raw.mut_store().apply_snapshot(meta.index, meta.term, meta.members.clone());
        // The snapshot's metadata is in the note: a recovery from this flush starts after the
        // chunks just appended (what comes later of this shard is appended after them).
        // Fast writes pending here stay pending (those the snapshot applied leave once the
        // install is done, `Group::installed`), so recovery still takes their records.
        let scan_from = self.state.raft_log.end_position();
        let note = records::encode_recovery_point(&records::RecoveryPoint {
            scan_from,
            chunks_from: self.held_back(scan_from),
            fast: Some(self.fast_point(scan_from)),
            snapshot_index: meta.index,
            snapshot_term: meta.term,
            hard_state: records::snapshot_hard_state(self.persisted_hs, &meta),
            members: meta.members.clone(),
        });
        let Some(installs) = ctx.installs.clone() else {
            if ctx.install_hold_turns > 0 {
                // As a thread would: the tree is rebuilt once the hold ends.
                let job = crate::snapshot::install::Install::inline_after(
                    self.state.clone(),
                    self.shard,
                    meta.index,
                    chunks,
                    note,
                    ctx.install_hold_turns,
                );
                return Ok(Some(job));
            }
            self.applier.install_snapshot(meta.index, &chunks, &note)?;
            self.installed(meta.index, chunks.len(), started);
            return Ok(None);
        };
        let job = crate::snapshot::install::Install::start(
            installs,
            self.state.clone(),
            self.shard,
            meta.index,
            chunks,
            note,
        )?;
        Ok(Some(job))
    }

    /// The tree holds the snapshot at `index` (flushed with it as its flag): what was waiting for
    /// entries at or below it can no longer be answered from them.
    fn installed(&mut self, index: u64, chunks: usize, started: Instant) {
        tracing::info!(
            shard = self.shard,
            index,
            chunks,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "installed a snapshot"
        );
        self.shared.durable_commit.fetch_max(index, Ordering::SeqCst);
        self.shared.installing.store(0, Ordering::SeqCst);
        if self.applier.stalled_at.is_some_and(|at| at <= index) {
            tracing::info!(
                shard = self.shard,
                index,
                "a snapshot replaced the state this replica could not apply"
            );
            self.applier.stalled_at = None;
            self.shared.stalled_at.store(0, Ordering::SeqCst);
        }
        // Fast writes the snapshot's state applied are no longer pending.
        self.applier.drop_applied_fast_writes();
        // Proposals at or below the snapshot can no longer be matched to their entries.
        while let Some(entry) = self.proposals.first_entry() {
            if *entry.key() > index {
                break;
            }
            let (_, (_, done)) = entry.remove_entry();
            done(Err(ReplicaError::Dropped("superseded by a snapshot".into())));
        }
        while let Some(entry) = self.member_changes.first_entry() {
            if *entry.key() > index {
                break;
            }
            let (_, (_, done)) = entry.remove_entry();
            done(Err(ReplicaError::Dropped("superseded by a snapshot: read the shard's members".into())));
        }
    }

    /// Fails every proposal and read barrier the group holds.
    pub fn fail_pending(&mut self, error: &dyn Fn() -> ReplicaError) {
        for (_, (_, done)) in std::mem::take(&mut self.proposals) {
            done(Err(error()));
        }
        for (_, (_, done)) in std::mem::take(&mut self.member_changes) {
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
        for request in self.waiting_views.drain(..) {
            (request.done)(Err(error()));
        }
        self.fail_fast(error);
    }

    /// Stops the group's threads (the node is ending).
    pub fn stop(&mut self) {
        // Cancels a rebuild and waits for its thread: the next recovery installs the snapshot.
        self.installing = None;
        self.scrub.stop();
        self.raw.store().snapshots.lock().unwrap_or_else(|e| e.into_inner()).stop();
    }

    /// Each other member's progress, on a leader (empty otherwise).
    fn follower_status(&self, ctx: &NodeCtx) -> Vec<crate::FollowerStatus> {
        if self.role() != StateRole::Leader {
            return Vec::new();
        }
        self.raw
            .raft
            .prs()
            .iter()
            .filter(|(id, _)| **id != ctx.config.node_id)
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

    pub fn publish_status(&self, ctx: &NodeCtx) {
        let raft = &self.raw.raft;
        let store = self.raw.store();
        let members = crate::Members::from(&store.conf_state);
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
            node_id: ctx.config.node_id,
            shard: self.shard,
            voters: members.voters,
            learners: members.learners,
            outgoing_voters: members.outgoing_voters,
            leader_id,
            term: raft.term,
            role: role.to_string(),
            commit_index: raft.raft_log.committed,
            // What readers see: while a snapshot is rebuilt, the state before it.
            applied_index: self.installing.as_ref().map_or(store.applied_index, |i| i.applied_before),
            first_index: store.first(),
            last_index: raft.raft_log.last_index(),
            flushed_index: self.state.tree.flush_flag().unwrap_or(0),
            storage: self.state.mode,
            log_bytes: self.state.log_bytes(),
            bytes_written: self.state.bytes_written(),
            user_bytes: self.state.user_bytes.load(Ordering::Relaxed),
            recovery_records: self.shared.recovery_records,
            recovery_replayed: self.shared.recovery_replayed,
            failure: ctx.failed.clone(),
            rejoining: self.rejoin.is_some(),
            leader_changes,
            logs,
            index_flushes: self.state.index.flushes(),
            index_compactions: self.state.index.compactions(),
            index_bytes_written: self.state.index.bytes_written(),
            memtable_bytes: self.state.tree.memtable_bytes(),
            index_layout: self.layout.name().to_string(),
            index_sorted_runs: self.state.tree.sorted_runs() as u64,
            index_leveled: self.state.tree.is_leveled(),
            last_leveling_ms: self.last_leveling.map(|took| took.as_millis() as u64),
            index_leveled_compaction_bytes: self.state.index.compaction_bytes(onekv_index::Layout::Leveled),
            index_budget_flushes: ctx.budget_flushes,
            fast_pending: self.applier.fast.len() as u64,
            fast_from_record: self.applier.fast_from_record,
            fast_from_inline: self.applier.fast_from_inline,
            index_runs_compaction_bytes: self.state.index.compaction_bytes(onekv_index::Layout::Runs(1)),
            followers: self.follower_status(ctx),
            snapshot: {
                let serving = store.snapshots.lock().unwrap_or_else(|e| e.into_inner()).describe();
                let fetching = self.state.staged.lock().unwrap_or_else(|e| e.into_inner()).describe();
                let installing = self.installing.as_ref().map(|installing| installing.job.describe());
                let parts: Vec<String> = [serving, fetching, installing].into_iter().flatten().collect();
                (!parts.is_empty()).then(|| parts.join("; "))
            },
            request_ids: self.state.requests().len() as u64,
            disk: ctx.disk.status(),
            corrupt_values: self.state.corruption.count(),
            repaired_values: self.state.corruption.repaired_count(),
            expired_keys_deleted: self.state.expired_deleted.load(std::sync::atomic::Ordering::Relaxed),
            scrub: self.scrub.status(),
            gc: ctx.gc_status.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            dedup: ctx.dedup.as_ref().map(|dedup| dedup.status()).unwrap_or_default(),
            peer_bytes_sent: ctx.transport.bytes_sent(),
            reads_by_lease: self.reads_by_lease,
            reads_by_read_index: self.reads_by_read_index,
        };
        *self.shared.status.lock().unwrap_or_else(|e| e.into_inner()) = status;
    }
}

/// The context of a ReadIndex request: its number and this node's id, so that a request a
/// follower forwards to the leader never shares a context with one of the leader's own (raft-rs
/// keeps one pending request per context).
fn read_context(id: u64, node: u64) -> Vec<u8> {
    [id.to_le_bytes(), node.to_le_bytes()].concat()
}

/// The number of a ReadIndex request this node made ([`read_context`]), if it is one.
fn read_context_id(context: &[u8], node: u64) -> Option<u64> {
    let (id, from) = context.split_at_checked(8)?;
    (from == node.to_le_bytes()).then(|| u64::from_le_bytes(id.try_into().expect("8 bytes")))
}

/// The keys a command of the Raft path reads or writes (`None`: it may touch any key), for the
/// fast path's ordering before it ([`Group::order_before_proposal`]).
fn command_keys(command: &Command) -> Option<Vec<&[u8]>> {
    match command {
        Command::Write(ops) => Some(ops.iter().map(|op| op.key.as_slice()).collect()),
        Command::Cas { key, .. } => Some(vec![key.as_slice()]),
        Command::Txn { conditions, ops } => Some(
            conditions
                .iter()
                .map(|c| c.key.as_slice())
                .chain(ops.iter().map(|op| op.key.as_slice()))
                .collect(),
        ),
        Command::DeleteRange { .. } => None,
    }
}

/// Whether the leader is sending this follower a snapshot, or the follower asked for one (a
/// stalled replica does): it could not take over. A follower caught up by a snapshot may stay in
/// raft-rs's probe state on an idle shard, so "replicating" would be too strict.
fn awaits_snapshot(progress: &raft::Progress) -> bool {
    progress.state == raft::ProgressState::Snapshot
        || progress.pending_request_snapshot != raft::INVALID_INDEX
}
