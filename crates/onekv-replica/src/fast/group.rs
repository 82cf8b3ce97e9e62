//! A group's side of the fast path: accepting fast writes, making them durable, telling the leader
//! which this replica holds, and (as leader) ordering them.
//!
//! **Accepting.** A voter accepts a fast write when the fast path is on, the shard is in onelog
//! mode, its configuration is not joint and no membership change is in flight, the write is
//! within limits and the pending set has room (and, where the fast quorum is below every voter,
//! no write of the same key is pending here). A write whose id the window holds is answered
//! "applied at index i" at once: it is done, whatever the other replies say. A leader accepts only
//! once it has ordered everything that may have completed when it was elected
//! ([`FastGroup::ready_at`]). Each accepted write is appended as a DURABILITY record in the node's
//! next group commit and answered once that is durable, with this replica's term, whether it leads,
//! and the voters it knows: the client counts the write done only when a **fast quorum** of those
//! voters answered in the same term, the leader among them ([`FastAck::completes`]; every voter at
//! R = 3, 4 of 5 at R = 5: `onekv_placement::quorum`).
//!
//! Why that quorum: at R = 3 a done write is held by every voter, so by any voter that becomes
//! leader, which recovers every completed fast write from its own pending set, in its own append
//! order (which respects real time: a write that completed before another began was appended
//! before it on every replica). At R = 5 a new leader may lack one; it gathers the pending sets of
//! a majority instead ([`gather`]), and since no voter then holds two pending writes of one key,
//! what it recovers needs no order.
//!
//! **Notices.** After its group commit a follower tells the leader which fast writes it now holds
//! (a small peer message, [`notice`]). The leader orders a write **by reference** (id and digest
//! only: each replica applies its own record, the value's one copy) once every other replica of the
//! shard said it holds it; a write some replica may lack is ordered with its command inline once it
//! has waited [`INLINE_AFTER`], or at once when a read or another proposal needs it ordered.
//!
//! **Ordering** keeps the leader's append order: an ORDER names a prefix of the writes not yet
//! proposed, so a write is never applied before one the leader appended earlier.
//!
//! **Leader change.** A new leader proposes ORDERs of every write that may have completed (every
//! write it holds at R = 3; what a majority's gathered pending sets show at R = 5), inline, the
//! last one marked with its term: applying it drops, on every replica, the pending writes of older
//! terms it did not name (none of them completed). Only once that ORDER is applied here does the
//! leader accept fast writes or answer reads; a Raft-path command meanwhile is refused as during a
//! leadership change (the client retries).

use super::gather::{self, Gathered, Held};
use super::{FastRecord, check_ops, encode_command, notice};
use crate::codec::OrderItem;
use crate::group::Group;
use crate::node::NodeCtx;
use crate::{Done, ReplicaError, RequestId, StorageMode, WriteOp};
use onekv_log::{Locator, RecordKind};
use raft::StateRole;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the leader waits for every replica's notice before ordering a write with its command
/// inline.
pub(crate) const INLINE_AFTER: Duration = Duration::from_millis(20);

/// How long after a follower's notice of a write the leader never got the leader has the replicas
/// forget it (its client gave up on it, or fell back to the Raft path, which took it out): far
/// longer than any client waits for the fast path, and any message lingers.
pub(crate) const FORGET_ORPHANS_AFTER: Duration = Duration::from_secs(5);

/// Most such writes the leader remembers at once (notices beyond are ignored until some are
/// forgotten), and most it remembers having forgotten.
const MAX_ORPHANS: usize = 65_536;

/// Most ops one ORDER applies (well below what one entry's sequence numbers allow).
pub(crate) const MAX_ORDER_OPS: usize = crate::state::MAX_OP / 2;

/// Most bytes of inline commands one ORDER carries (a write larger than this goes alone).
const MAX_INLINE_BYTES: usize = 8 << 20;

/// A replica's answer to a fast write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FastAck {
    /// The write's record is durable here.
    Durable {
        /// This replica's Raft term when it accepted the write.
        term: u64,
        /// Whether it leads the shard (and accepts fast writes as leader).
        leader: bool,
        /// The shard's voters as this replica knows them.
        voters: Vec<u64>,
    },
    /// A write with this id was applied already, at this index: it is done.
    Applied {
        /// The entry that applied it.
        index: u64,
    },
}

impl FastAck {
    /// Whether `acks` (one per node, by node id) make a fast write done: one says it was applied,
    /// or a fast quorum (`onekv_placement::quorum::fast_quorum`: every voter at R = 3, 4 of 5) of
    /// the voters the leader of the newest term among them names answered durable in that term with
    /// the same voters (as sets: compared sorted). The client states the same rule over the wire's
    /// answers (`onekv_client::fast_write_completes`).
    pub fn completes(acks: &BTreeMap<u64, FastAck>) -> bool {
        if acks.values().any(|ack| matches!(ack, FastAck::Applied { .. })) {
            return true;
        }
        let durable = |ack: &FastAck| match ack {
            FastAck::Durable { term, leader, voters } => {
                let mut voters = voters.clone();
                voters.sort_unstable();
                voters.dedup();
                Some((*term, *leader, voters))
            }
            FastAck::Applied { .. } => None,
        };
        let Some((term, _, voters)) =
            acks.values().filter_map(durable).filter(|(_, leader, _)| *leader).max_by_key(|(term, ..)| *term)
        else {
            return false;
        };
        let held = voters
            .iter()
            .filter(|voter| {
                acks.get(voter).and_then(durable).is_some_and(|(t, _, v)| t == term && v == voters)
            })
            .count();
        !voters.is_empty() && held >= onekv_placement::quorum::fast_quorum(voters.len())
    }
}

/// A fast write waiting for the node's next group commit.
pub(crate) struct Queued {
    id: RequestId,
    term: u64,
    command: Vec<u8>,
    keys: Vec<Vec<u8>>,
    done: Done<FastAck>,
}

/// The fast path's state in one group.
#[derive(Default)]
pub(crate) struct FastGroup {
    /// Accepted writes for the next group commit.
    queued: Vec<Queued>,
    /// Ids this follower made durable since it last told the leader.
    to_notice: Vec<RequestId>,
    /// As leader: which other replicas said they hold each pending write, and since when the
    /// leader holds it.
    held_by: BTreeMap<RequestId, (Instant, BTreeSet<u64>)>,
    /// As leader: the index of the ORDER that recovers what this leader held when elected, and
    /// its term; fast writes and reads wait until it is applied.
    recovery: Option<(u64, u64)>,
    /// As leader: the term in which the recovery ORDER is applied (fast writes accepted).
    ready_term: Option<u64>,
    /// As leader: the index of the last ORDER proposed (reads wait until it is applied).
    pub last_order: u64,
    /// As leader: writes followers said they hold that this leader does not (its client gave up,
    /// or fell back), and since when; forgotten after [`FORGET_ORPHANS_AFTER`] so they do not hold
    /// the log back for ever.
    orphans: BTreeMap<RequestId, Instant>,
    /// As leader: the writes it had forgotten (it refuses them if they arrive after all), oldest
    /// first.
    forgotten: VecDeque<RequestId>,
    forgotten_ids: std::collections::HashSet<RequestId>,
    /// As leader: read barriers waiting until the ORDER at this index (every fast write pending
    /// when they arrived) is applied, before their ReadIndex round (`None`: until those writes
    /// could be proposed).
    reads: Vec<(Option<u64>, Done<()>)>,
    /// As a new leader whose fast quorum is below every voter: the gather of the voters' pending
    /// writes under way ([`gather`]).
    gathering: Option<Gathering>,
    /// As leader: what it noted when it first saw itself lead ([`Group::note_election`]).
    elected: Option<Elected>,
}

/// What a new leader notes on first seeing itself lead.
#[derive(Clone, Copy)]
struct Elected {
    term: u64,
    /// Its log's last index then (Raft's empty entry of the term, or later).
    last: u64,
    /// Its commit index then: voters answer its gather only once they applied that far, so a
    /// write they still hold pending was not applied before the election (a replica far behind
    /// might hold one applied minutes ago, whose id the window forgot).
    committed: u64,
    /// Whether its log held a membership change it had not applied: the voters it had applied
    /// may then be the wrong ones, and it recovers only once it applied up to `last`.
    change_unapplied: bool,
    /// Whether the fast path was active in the group then ([`Group::fast_active`]). If not, no fast
    /// write of an older term can be waiting to be ordered (this node's fast path off, none
    /// pending here, and fewer than four voters: any write done was held by every voter, this one
    /// included; one done with four or more was ordered before the change that left fewer), and
    /// none completes in this term without this leader's answer, which it does not give: if the
    /// group turns active later in the term (a fourth voter added), there is nothing to recover.
    active: bool,
}

/// A new leader's gather of pending writes ([`gather`]).
struct Gathering {
    term: u64,
    /// When each voter was last asked.
    asked: BTreeMap<u64, Instant>,
    /// The voters' answers so far.
    answers: BTreeMap<u64, Vec<Held>>,
}

impl FastGroup {
    /// Whether a leader of `term` has recovered and accepts fast writes.
    fn ready_at(&self, term: u64) -> bool {
        self.ready_term == Some(term)
    }
}

impl Group {
    /// Accepts a fast write for the next group commit, or refuses it (see the module).
    pub(crate) fn fast_write(
        &mut self,
        id: RequestId,
        ops: Vec<WriteOp>,
        done: Done<FastAck>,
        ctx: &mut NodeCtx,
    ) {
        if let Some(failed) = &ctx.failed {
            return done(Err(ReplicaError::Storage(failed.clone())));
        }
        if !ctx.config.fast_path || self.state.mode != StorageMode::OneLog {
            return done(Err(ReplicaError::InvalidArgument("the fast path is off on this node".into())));
        }
        if let Err(error) = check_ops(&ops) {
            return done(Err(error));
        }
        if let Some(previous) = self.state.requests().lookup(id) {
            return done(Ok(FastAck::Applied { index: previous.index }));
        }
        let members = &self.raw.store().conf_state;
        let me = ctx.config.node_id;
        let refuse =
            |why: &str| Err(ReplicaError::Dropped(format!("fast write refused: {why}; use the Raft path")));
        if !members.voters.contains(&me) {
            return done(refuse("this node is not a voter of the shard"));
        }
        if !members.voters_outgoing.is_empty() || self.raw.raft.has_pending_conf() {
            return done(refuse("the shard's membership is changing"));
        }
        let term = self.raw.raft.term;
        if self.role() == StateRole::Leader && !self.fast.ready_at(term) {
            return done(refuse("the new leader is still ordering what it held"));
        }
        if self.fast.forgotten_ids.contains(&id) {
            return done(refuse("the replicas forgot this write, which reached the leader too late"));
        }
        // Below every voter, a new leader recovers from a majority's pending sets and cannot tell
        // their orders apart; it need not, as long as no voter holds two pending writes of a key
        // (`onekv_placement::quorum`). A write of a key pending here takes the Raft path, which
        // orders it after the pending one.
        let gathered = onekv_placement::quorum::fast_needs_gather(members.voters.len());
        if gathered
            && ops.iter().any(|op| {
                self.applier.fast.writes(&op.key) || self.fast.queued.iter().any(|q| q.keys.contains(&op.key))
            })
        {
            // The client recognises these words (`onekv_client`'s `PENDING_KEY_REFUSAL`).
            return done(refuse("a fast write of the same key is pending here"));
        }
        let (command, ops) = encode_command(id, ops);
        let queued_bytes: usize = self.fast.queued.iter().map(|q| q.command.len()).sum();
        // Where a new leader gathers pending writes, one peer message carries them all.
        let over_gathered = gathered
            && self.applier.fast.bytes() + queued_bytes + command.len() > gather::MAX_GATHERED_PENDING_BYTES;
        if over_gathered
            || !self.applier.fast.has_room(queued_bytes + command.len())
            || self.fast.queued.len() + self.applier.fast.len() >= super::pending::MAX_PENDING_RECORDS
            || ctx.fast_pending_bytes + command.len() > super::MAX_NODE_PENDING_BYTES
        {
            return done(refuse("too many fast writes are pending"));
        }
        ctx.fast_pending_bytes += command.len();
        let keys = ops.into_iter().map(|op| op.key).collect();
        self.fast.queued.push(Queued { id, term, command, keys, done });
    }

    /// Whether this group orders fast writes: the fast path is on, or writes made durable while it
    /// was (found again at recovery) are still pending, and must be ordered all the same; or the
    /// shard's fast quorum is below every voter (onelog mode): then other voters may hold writes
    /// done without this one (their fast path on, this node's off or never asked), and as leader
    /// it must gather them whatever its own setting.
    ///
    /// A new leader whose log holds a membership change it has not applied does not know its
    /// voters yet: it counts as active (and so recovers) until it has applied up to its election.
    pub(crate) fn fast_active(&self, ctx: &NodeCtx) -> bool {
        let unsure = self.role() == StateRole::Leader
            && self.fast.elected.is_some_and(|elected| {
                elected.term == self.raw.raft.term
                    && elected.change_unapplied
                    && self.raw.store().applied_index < elected.last
            });
        ctx.config.fast_path
            || !self.applier.fast.is_empty()
            || (self.state.mode == StorageMode::OneLog
                && (unsure
                    || onekv_placement::quorum::fast_needs_gather(self.raw.store().conf_state.voters.len())))
    }

    /// As leader, before anything asks [`Group::fast_active`] in a term: notes the term's start
    /// ([`Elected`]) once.
    pub(crate) fn note_election(&mut self, ctx: &NodeCtx) {
        let term = self.raw.raft.term;
        if self.role() != StateRole::Leader || self.fast.elected.is_some_and(|elected| elected.term == term) {
            return;
        }
        let log = &self.raw.raft.raft_log;
        let (applied, last) = (self.raw.store().applied_index, log.last_index());
        // Read in bounded slices (the tail a new leader has not applied is usually a few entries);
        // an entry it cannot read counts as a change, which only makes it wait.
        let mut change_unapplied = false;
        let mut next = applied + 1;
        while next <= last && !change_unapplied {
            match log.entries(next, 4 << 20, raft::GetEntriesContext::empty(false)) {
                Ok(entries) if !entries.is_empty() => {
                    next += entries.len() as u64;
                    change_unapplied = entries
                        .iter()
                        .any(|entry| entry.get_entry_type() != raft::eraftpb::EntryType::EntryNormal);
                }
                _ => change_unapplied = true,
            }
        }
        self.fast.elected =
            Some(Elected { term, last, committed: log.committed, change_unapplied, active: false });
        let active = self.fast_active(ctx);
        if let Some(elected) = &mut self.fast.elected {
            elected.active = active;
        }
    }

    /// What a flush's recovery point says of the fast path: the writes pending now, and `end` (the
    /// log's end at the seal) as where recovery takes every DURABILITY record from.
    pub(crate) fn fast_point(&self, end: u64) -> crate::records::FastPoint {
        crate::records::FastPoint {
            from: self.applier.fast.oldest_position().unwrap_or(end),
            sealed_at: end,
            pending: self.applier.fast.iter().map(|record| record.id).collect(),
        }
    }

    /// Bytes of fast writes pending here or waiting for the group commit.
    pub(crate) fn fast_bytes(&self) -> usize {
        self.applier.fast.bytes() + self.fast.queued.iter().map(|q| q.command.len()).sum::<usize>()
    }

    /// The DURABILITY records to append in this turn's group commit.
    pub(crate) fn fast_records(&self) -> Vec<(RecordKind, Vec<u8>)> {
        self.fast
            .queued
            .iter()
            .map(|q| {
                (
                    crate::records::DURABILITY,
                    crate::records::encode_durability(self.shard, q.term, &q.command),
                )
            })
            .collect()
    }

    /// The records of [`Group::fast_records`] are durable at `locators` (payload locators): they
    /// become pending, and their writers are answered.
    pub(crate) fn fast_persisted(&mut self, locators: &[Locator], now: Instant, ctx: &NodeCtx) {
        if !self.fast.queued.is_empty() {
            // The records are durable, no writer answered yet.
            crate::failpoint!("after-fast-durable");
        }
        let queued = std::mem::take(&mut self.fast.queued);
        let leading = self.role() == StateRole::Leader;
        // Sorted: raft-rs lists a configuration's voters in no fixed order, and every replica's
        // answer must name the same list.
        let mut voters = self.raw.store().conf_state.voters.clone();
        voters.sort_unstable();
        for (q, locator) in queued.into_iter().zip(locators) {
            // Applied while its record was being written (an ORDER carrying it inline, or the
            // Raft path): done, and not pending.
            if let Some(previous) = self.state.requests().lookup(q.id) {
                (q.done)(Ok(FastAck::Applied { index: previous.index }));
                continue;
            }
            // A new term began since it was accepted (this node may even lead it now, with its
            // recovery ORDER proposed without this write), or a membership change was proposed
            // (a voter added by it would not hold the write): it is not taken, so it cannot
            // complete. (Its record is in the log: after a restart it is pending again, which is
            // harmless: it may be applied late, as a write that never completed may.)
            let members = &self.raw.store().conf_state;
            if q.term != self.raw.raft.term
                || self.raw.raft.has_pending_conf()
                || !members.voters_outgoing.is_empty()
            {
                (q.done)(Err(ReplicaError::Dropped(
                    "fast write refused: the term changed while it was being written; use the Raft path"
                        .into(),
                )));
                continue;
            }
            let header = crate::records::DURABILITY_HEADER as u64;
            let at = locator.slice(header, locator.len - header).expect("the command follows the header");
            let digest = crc32c::crc32c(&q.command);
            let record = FastRecord {
                id: q.id,
                term: q.term,
                command: Arc::from(q.command),
                at,
                digest,
                keys: q.keys,
            };
            if self.applier.fast.insert(record).is_err() {
                (q.done)(Err(ReplicaError::Dropped(
                    "fast write refused: too many pending; use the Raft path".into(),
                )));
                continue;
            }
            if leading {
                self.fast.held_by.insert(q.id, (now, BTreeSet::new()));
            } else {
                self.fast.to_notice.push(q.id);
            }
            // "Leader" only for a leader that accepted it as one (it may have been elected since).
            let leader = leading && self.fast.ready_at(q.term);
            (q.done)(Ok(FastAck::Durable { term: q.term, leader, voters: voters.clone() }));
        }
        self.send_notices(ctx);
    }

    /// As follower: tells the leader which fast writes this replica made durable since it last did.
    fn send_notices(&mut self, ctx: &NodeCtx) {
        let leader = self.raw.raft.leader_id;
        if self.fast.to_notice.is_empty() || leader == raft::INVALID_ID || leader == ctx.config.node_id {
            return;
        }
        let ids = std::mem::take(&mut self.fast.to_notice);
        ctx.transport
            .send(self.shard, vec![notice::encode(ctx.config.node_id, leader, self.raw.raft.term, &ids)]);
    }

    /// As leader: replica `from` holds the fast writes `ids`.
    pub(crate) fn fast_noticed(&mut self, from: u64, ids: Vec<RequestId>, now: Instant) {
        if self.role() != StateRole::Leader {
            return;
        }
        for id in ids {
            if let Some((_, holders)) = self.fast.held_by.get_mut(&id) {
                holders.insert(from);
            } else if !self.applier.fast.contains(id)
                && self.state.requests().lookup(id).is_none()
                && self.fast.orphans.len() < MAX_ORPHANS
            {
                self.fast.orphans.entry(id).or_insert(now);
            }
        }
    }

    /// As leader: has the replicas forget the writes some of them hold and this leader never got,
    /// once they are [`FORGET_ORPHANS_AFTER`] old (none of them completed: this leader did not
    /// answer them). From then on it refuses them if they arrive after all.
    fn forget_orphans(&mut self, now: Instant, ctx: &mut NodeCtx) {
        let pending = &self.applier.fast;
        let state = &self.state;
        self.fast.orphans.retain(|id, _| !pending.contains(*id) && state.requests().lookup(*id).is_none());
        let due: Vec<RequestId> = self
            .fast
            .orphans
            .iter()
            .filter(|(_, since)| now.saturating_duration_since(**since) >= FORGET_ORPHANS_AFTER)
            .map(|(id, _)| *id)
            .take(super::MAX_ORDER_ITEMS)
            .collect();
        if due.is_empty() {
            return;
        }
        let items: Vec<OrderItem> =
            due.iter().map(|id| OrderItem { id: *id, digest: 0, inline: None, forget: true }).collect();
        if self.propose_order_entry(0, &items, now, ctx).is_none() {
            return;
        }
        for id in due {
            self.fast.orphans.remove(&id);
            if self.fast.forgotten_ids.insert(id) {
                self.fast.forgotten.push_back(id);
            }
            if self.fast.forgotten.len() > MAX_ORPHANS
                && let Some(oldest) = self.fast.forgotten.pop_front()
            {
                self.fast.forgotten_ids.remove(&oldest);
            }
        }
    }

    /// Leadership changed here: what this node held as leader no longer counts, and the barriers
    /// waiting for ORDERs fail with `error`.
    pub(crate) fn fast_lost_leadership(&mut self, error: &ReplicaError) {
        self.fast.held_by.clear();
        self.fast.orphans.clear();
        self.fast.recovery = None;
        self.fast.ready_term = None;
        self.fast.gathering = None;
        self.fast.elected = None;
        self.applier.fast.propose_again();
        for (_, done) in self.fast.reads.drain(..) {
            done(Err(error.clone()));
        }
    }

    /// As leader, every turn: proposes the recovery ORDER once elected, then orders the writes
    /// every replica holds (and those that waited [`INLINE_AFTER`], or all of them with
    /// `everything`, inline where a replica may lack them), in append order. Returns whether it
    /// proposed.
    pub(crate) fn propose_order(&mut self, now: Instant, everything: bool, ctx: &mut NodeCtx) -> bool {
        self.note_election(ctx);
        if !self.fast_active(ctx) {
            // Reads that waited for a recovery this leader turned out not to need (its voters,
            // once applied, need no gather) go on to their ReadIndex round.
            if !self.fast.reads.is_empty() {
                let reads = std::mem::take(&mut self.fast.reads);
                self.reads_unsent.extend(reads.into_iter().map(|(_, done)| done));
            }
            return false;
        }
        if self.role() != StateRole::Leader || ctx.failed.is_some() {
            return false;
        }
        let term = self.raw.raft.term;
        // Writes that left the pending set another way (the Raft path applied them) leave no
        // trace behind.
        if self.fast.held_by.len() > self.applier.fast.len() {
            let pending = &self.applier.fast;
            self.fast.held_by.retain(|id, _| pending.contains(*id));
        }
        match self.fast.recovery {
            Some((index, recovery_term)) if recovery_term == term => {
                if self.fast.ready_term != Some(term) && self.raw.store().applied_index >= index {
                    self.fast.ready_term = Some(term);
                    self.release_fast_reads();
                }
            }
            _ => {
                // Just elected: order everything that may have completed, inline (in ORDERs of
                // bounded size), the last one dropping older terms' leftovers. With every voter in
                // the fast quorum that is everything this leader holds; below it, what a majority's
                // pending sets show once they are gathered (and whatever this leader holds of its
                // own term, accepted before it was elected: harmless, as it never completed).
                //
                // If its log holds a membership change it has not applied, the voters are counted
                // once it applied its log up to its election: before, a change committed without
                // its knowledge could make it count the wrong ones (and gather from the wrong
                // majority, or not at all). It asks for the others' pending writes meanwhile
                // (their answers hold whatever the voters turn out to be).
                let elected = self.fast.elected.expect("noted above");
                if !elected.active {
                    // Turned active in the middle of its term: nothing to recover (`Elected::active`).
                    self.fast.recovery = Some((self.raw.store().applied_index, term));
                    return false;
                }
                let gather = ctx.mutation != Some(crate::Mutation::FastRecoversWithoutGather)
                    && onekv_placement::quorum::fast_needs_gather(self.raw.store().conf_state.voters.len());
                let applied = !elected.change_unapplied || self.raw.store().applied_index >= elected.last;
                let records: Vec<Held> = match (gather, applied) {
                    (_, false) => {
                        if gather {
                            self.gather_pending(term, false, now, ctx);
                        }
                        return false;
                    }
                    (true, true) => {
                        let Some(mut recovered) = self.gather_pending(term, true, now, ctx) else {
                            return false;
                        };
                        recovered.extend(self.applier.fast.iter().filter(|r| r.term >= term).map(Held::of));
                        recovered
                    }
                    (false, true) => self.applier.fast.iter().map(Held::of).collect(),
                };
                self.applier.fast.propose_again();
                self.fast.held_by.clear();
                self.applier.fast.take_unproposed(usize::MAX);
                let chunks = order_chunks(&records);
                let last = chunks.len() - 1;
                for (i, chunk) in chunks.into_iter().enumerate() {
                    let items = chunk
                        .iter()
                        .map(|held| OrderItem {
                            id: held.id,
                            digest: held.digest,
                            inline: Some(held.command.to_vec()),
                            forget: false,
                        })
                        .collect::<Vec<_>>();
                    let drop_below = if i == last { term } else { 0 };
                    match self.propose_order_entry(drop_below, &items, now, ctx) {
                        Some(index) => self.fast.last_order = index,
                        // Refused: everything counts as unproposed again, and the next turn
                        // proposes the recovery again (a write in an ORDER already appended is
                        // then named twice: the window skips the second).
                        None => {
                            self.applier.fast.propose_again();
                            return true;
                        }
                    }
                }
                self.fast.recovery = Some((self.fast.last_order, term));
                return true;
            }
        }
        self.forget_orphans(now, ctx);
        if !self.applier.fast.has_unproposed() {
            return false;
        }
        let others: BTreeSet<u64> = {
            let members = &self.raw.store().conf_state;
            members
                .voters
                .iter()
                .chain(&members.learners)
                .copied()
                .filter(|id| *id != ctx.config.node_id)
                .collect()
        };
        // The longest prefix that may be ordered now.
        let mut items = Vec::new();
        let (mut ops, mut bytes) = (0, 0);
        for record in self.applier.fast.iter_unproposed() {
            // A write this leader holds no notices of (it held it before it was elected, or an
            // ORDER naming it was refused) waits for none.
            let (since, holders) = self
                .fast
                .held_by
                .get(&record.id)
                .cloned()
                .unwrap_or((now.checked_sub(INLINE_AFTER).unwrap_or(now), BTreeSet::new()));
            let held = holders.is_superset(&others);
            let inline = if held { 0 } else { record.command.len() };
            if !(held || everything || now.saturating_duration_since(since) >= INLINE_AFTER)
                || items.len() >= super::MAX_ORDER_ITEMS
                || ops + record.keys.len() > MAX_ORDER_OPS
                || (!items.is_empty() && bytes + inline > MAX_INLINE_BYTES)
            {
                break;
            }
            ops += record.keys.len();
            bytes += inline;
            items.push(item(record, !held));
        }
        if items.is_empty() {
            return false;
        }
        // Marked proposed only once Raft took the ORDER: a refused one (a leadership transfer under
        // way, too much uncommitted) is tried again next turn, as it was.
        let Some(index) = self.propose_order_entry(0, &items, now, ctx) else { return false };
        self.fast.last_order = index;
        self.applier.fast.take_unproposed(items.len());
        for item in &items {
            self.fast.held_by.remove(&item.id);
        }
        true
    }

    /// As a new leader of `term` whose fast quorum is below every voter: asks the voters that have
    /// not answered (again after [`gather::ASK_AGAIN_AFTER`]) for their pending writes, and, with
    /// `decide`, once a majority answered (this leader and the first others to answer) returns what
    /// to recover ([`gather::recovered`], less what this leader's window says was applied).
    fn gather_pending(
        &mut self,
        term: u64,
        decide: bool,
        now: Instant,
        ctx: &mut NodeCtx,
    ) -> Option<Vec<Held>> {
        let me = ctx.config.node_id;
        let mut voters = self.raw.store().conf_state.voters.clone();
        voters.sort_unstable();
        let gathering = match &mut self.fast.gathering {
            Some(gathering) if gathering.term == term => gathering,
            slot => slot.insert(Gathering { term, asked: BTreeMap::new(), answers: BTreeMap::new() }),
        };
        let majority = onekv_placement::quorum::majority(voters.len());
        let others: Vec<u64> = voters
            .iter()
            .copied()
            .filter(|voter| *voter != me && gathering.answers.contains_key(voter))
            .take(majority.saturating_sub(1))
            .collect();
        if decide && others.len() + 1 >= majority {
            // Exactly a majority: with more answers a write held by the threshold's count of them
            // could miss another such write (`onekv_placement::quorum`).
            let mut answers: BTreeMap<u64, Vec<Held>> = others
                .iter()
                .map(|voter| (*voter, gathering.answers.remove(voter).expect("answered")))
                .collect();
            answers.insert(me, self.applier.fast.iter().filter(|r| r.term < term).map(Held::of).collect());
            self.fast.gathering = None;
            let threshold = onekv_placement::quorum::fast_recovery_threshold(voters.len());
            // A write this leader applied already (a lagging voter still holds it pending) is not
            // ordered again: the window would skip it, unless it forgot the id, and then it would
            // apply it a second time over newer values.
            let mut recovered = gather::recovered(&answers, me, threshold);
            recovered.retain(|held| self.state.requests().lookup(held.id).is_none());
            tracing::info!(
                shard = self.shard,
                term,
                from = ?answers.keys().collect::<Vec<_>>(),
                recovered = recovered.len(),
                "gathered the pending fast writes of a majority"
            );
            return Some(recovered);
        }
        let due: Vec<u64> = voters
            .iter()
            .copied()
            .filter(|voter| *voter != me && !gathering.answers.contains_key(voter))
            .filter(|voter| {
                gathering
                    .asked
                    .get(voter)
                    .is_none_or(|at| now.saturating_duration_since(*at) >= gather::ASK_AGAIN_AFTER)
            })
            .collect();
        for voter in &due {
            gathering.asked.insert(*voter, now);
        }
        if !due.is_empty() {
            let floor = self.fast.elected.map_or(0, |elected| elected.committed);
            ctx.transport
                .send(self.shard, due.into_iter().map(|voter| gather::ask(me, voter, term, floor)).collect());
        }
        None
    }

    /// A gather message from `from` in `term` ([`gather`]): a follower answers its leader's
    /// request with its pending writes of older terms; the leader keeps an answer of its gather.
    pub(crate) fn fast_gather_message(&mut self, from: u64, term: u64, message: Gathered, ctx: &NodeCtx) {
        if term != self.raw.raft.term {
            return;
        }
        match message {
            Gathered::Ask { floor } => {
                let leader = self.raw.raft.leader_id;
                // Not before it applied what the leader had committed when elected (asked again).
                if self.role() == StateRole::Leader
                    || (leader != raft::INVALID_ID && leader != from)
                    || self.raw.store().applied_index < floor
                {
                    return;
                }
                match gather::answer(ctx.config.node_id, from, term, self.applier.fast.iter()) {
                    Some(answer) => ctx.transport.send(self.shard, vec![answer]),
                    None => tracing::warn!(
                        shard = self.shard,
                        pending = self.applier.fast.len(),
                        "too many pending fast writes to answer a new leader's gather: it needs the others'"
                    ),
                }
            }
            Gathered::Answer(body) => {
                if self.role() != StateRole::Leader || !self.raw.store().conf_state.voters.contains(&from) {
                    return;
                }
                let voters = &self.raw.store().conf_state.voters;
                let majority = onekv_placement::quorum::majority(voters.len());
                // Only a gather of this term under way needs it, once per voter, and no more
                // answers than a majority's (with this leader's own).
                let Some(gathering) = self.fast.gathering.as_mut().filter(|gathering| {
                    let answered = gathering.answers.keys().filter(|voter| voters.contains(voter)).count();
                    gathering.term == term
                        && !gathering.answers.contains_key(&from)
                        && answered + 1 < majority
                }) else {
                    return;
                };
                match gather::parse_answer(&body, term) {
                    Ok(held) => {
                        gathering.answers.insert(from, held);
                    }
                    Err(error) => {
                        tracing::warn!(shard = self.shard, from, error, "dropped a malformed gather answer")
                    }
                }
            }
        }
    }

    /// Proposes one ORDER entry; returns its index when Raft appended it.
    fn propose_order_entry(
        &mut self,
        drop_below: u64,
        items: &[OrderItem],
        now: Instant,
        ctx: &mut NodeCtx,
    ) -> Option<u64> {
        let data = crate::codec::encode_order(self.entry_time(now, ctx), drop_below, items);
        let before = self.raw.raft.raft_log.last_index();
        // Noted before the data moves: an ORDER holds the leader off puts by reference until it
        // applies (`wire_refs`); noting one that is then not appended only delays them.
        self.wire_refs.note_proposed(self.raw.raft.term, before + 1, &data);
        match self.raw.propose(Vec::new(), data) {
            Ok(()) if self.raw.raft.raft_log.last_index() > before => {
                Some(self.raw.raft.raft_log.last_index())
            }
            _ => None,
        }
    }

    /// As leader, before proposing a command of the Raft path that reads or writes `keys` (`None`:
    /// any key): a new leader first proposes its recovery ORDER, and fast writes pending on those
    /// keys are ordered now, so the command lands after every fast write that completed before it
    /// arrived. (Linearizability is per key, so writes to other keys need not wait.) Returns
    /// false if that could not be proposed (Raft refused a proposal: a leadership transfer is
    /// under way): the command must not be proposed either.
    pub(crate) fn order_before_proposal(
        &mut self,
        keys: Option<Vec<&[u8]>>,
        now: Instant,
        ctx: &mut NodeCtx,
    ) -> bool {
        self.note_election(ctx);
        if !self.fast_active(ctx) || self.role() != StateRole::Leader {
            return true;
        }
        let term = self.raw.raft.term;
        if !matches!(self.fast.recovery, Some((_, recovery_term)) if recovery_term == term) {
            self.propose_order(now, false, ctx);
        }
        let touches = match keys {
            None => true,
            Some(keys) => keys.iter().any(|key| self.applier.fast.writes(key)),
        };
        if touches {
            self.order_everything(now, ctx);
        }
        matches!(self.fast.recovery, Some((_, recovery_term)) if recovery_term == term)
            && !(touches && self.applier.fast.has_unproposed())
    }

    /// Proposes ORDERs until nothing pending is left unproposed (an ORDER holds at most
    /// [`super::MAX_ORDER_ITEMS`]), or Raft refuses one.
    fn order_everything(&mut self, now: Instant, ctx: &mut NodeCtx) {
        while self.applier.fast.has_unproposed() {
            let before = self.fast.last_order;
            self.propose_order(now, true, ctx);
            if self.fast.last_order == before {
                break;
            }
        }
    }

    /// A read barrier at the leader with the fast path on: every fast write pending now is ordered
    /// (at once, or in the next turns while Raft refuses proposals), and the barrier goes on to
    /// its ReadIndex round once those ORDERs, and the leader's recovery ORDER, are applied here.
    /// Every fast write that completed before the barrier arrived was pending here (the leader
    /// answers a fast write only once it is pending), so the read sees it.
    pub(crate) fn fast_read_barrier(&mut self, done: Done<()>, now: Instant, ctx: &mut NodeCtx) {
        let floor = self.order_before_proposal(None, now, ctx).then(|| self.order_floor());
        self.fast.reads.push((floor, done));
        self.release_fast_reads();
    }

    /// The index every ORDER proposed so far in this term is at or below.
    fn order_floor(&self) -> u64 {
        match self.fast.recovery {
            Some((index, _)) => self.fast.last_order.max(index),
            None => self.fast.last_order,
        }
    }

    /// As leader, every turn: barriers that could not have everything ordered when they arrived
    /// try again.
    pub(crate) fn order_for_waiting_reads(&mut self, now: Instant, ctx: &mut NodeCtx) {
        if !self.fast.reads.iter().any(|(floor, _)| floor.is_none()) {
            return;
        }
        if self.order_before_proposal(None, now, ctx) {
            let floor = self.order_floor();
            for (waiting, _) in self.fast.reads.iter_mut().filter(|(floor, _)| floor.is_none()) {
                *waiting = Some(floor);
            }
        }
    }

    /// Moves the barriers whose ORDERs are applied on to their ReadIndex round.
    pub(crate) fn release_fast_reads(&mut self) {
        if self.fast.reads.is_empty() || !self.fast.ready_at(self.raw.raft.term) {
            return;
        }
        let applied = self.raw.store().applied_index;
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.fast.reads)
            .into_iter()
            .partition(|(floor, _)| floor.is_some_and(|floor| floor <= applied));
        self.fast.reads = waiting;
        self.reads_unsent.extend(ready.into_iter().map(|(_, done)| done));
    }

    /// This replica cannot apply the entry at `at` (`apply::Applier::stalled_at`: an ORDER naming
    /// a fast write it does not hold, or a put by reference it cannot point at its copy): it
    /// applied everything before it and asks the leader for a snapshot past it.
    pub(crate) fn stall(&mut self, at: u64) {
        tracing::warn!(
            shard = self.shard,
            index = at,
            "this replica cannot apply the entry here: waiting for a snapshot past it"
        );
        self.shared.stalled_at.store(at, std::sync::atomic::Ordering::SeqCst);
        // The snapshot is asked for at the next tick (`Group::tick`), not here: this runs while a
        // Ready is being handled, and raft-rs aborts when a follower's message appears between
        // a Ready and its advance.
    }

    /// Asks the leader for a snapshot of at least this replica's last entry (raft-rs refuses while
    /// it knows no leader, or already asked: the next tick asks again).
    pub(crate) fn ask_for_snapshot(&mut self) {
        if self.installing.is_none() && self.raw.raft.pending_request_snapshot == raft::INVALID_INDEX {
            let _ = self.raw.request_snapshot();
        }
    }

    /// Forgets the fast writes the node was asked for but could not make durable (the node
    /// failed or stops).
    pub(crate) fn fail_fast(&mut self, error: &dyn Fn() -> ReplicaError) {
        for q in self.fast.queued.drain(..) {
            (q.done)(Err(error()));
        }
        for (_, done) in self.fast.reads.drain(..) {
            done(Err(error()));
        }
    }
}

/// `records` cut into the contents of ORDERs of at most [`super::MAX_ORDER_ITEMS`] writes,
/// [`MAX_ORDER_OPS`] ops and [`MAX_INLINE_BYTES`] of inline commands (at least one write each, and
/// one empty ORDER for none).
fn order_chunks(records: &[Held]) -> Vec<&[Held]> {
    let mut chunks = Vec::new();
    let (mut start, mut ops, mut bytes) = (0, 0, 0);
    for (i, record) in records.iter().enumerate() {
        let full = i - start >= super::MAX_ORDER_ITEMS
            || ops + record.ops > MAX_ORDER_OPS
            || bytes + record.command.len() > MAX_INLINE_BYTES;
        if full && i > start {
            chunks.push(&records[start..i]);
            (start, ops, bytes) = (i, 0, 0);
        }
        ops += record.ops;
        bytes += record.command.len();
    }
    chunks.push(&records[start..]);
    chunks
}

/// An ORDER's item for `record`, with its command inline or not.
fn item(record: &FastRecord, inline: bool) -> OrderItem {
    OrderItem {
        id: record.id,
        digest: record.digest,
        inline: inline.then(|| record.command.to_vec()),
        forget: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn durable(node: u64, term: u64, leader: bool, voters: &[u64]) -> (u64, FastAck) {
        (node, FastAck::Durable { term, leader, voters: voters.to_vec() })
    }

    /// The same cases as the client's rule (`onekv_client::fast_write_completes`).
    #[test]
    fn a_write_is_done_when_a_fast_quorum_of_the_voters_the_newest_leader_names_holds_it_in_its_term() {
        let all = [1, 2, 3];
        let mut acks: BTreeMap<u64, FastAck> = [durable(1, 5, true, &all), durable(2, 5, false, &all)].into();
        assert!(!FastAck::completes(&acks), "a majority is not enough");
        acks.extend([durable(3, 4, false, &all)]);
        assert!(!FastAck::completes(&acks), "a voter in another term");
        acks.extend([durable(3, 5, false, &[2, 3, 1])]);
        assert!(FastAck::completes(&acks), "the same voters in another order");
        let two_leaders: BTreeMap<u64, FastAck> =
            [durable(1, 4, true, &[1, 2]), durable(2, 4, false, &[1, 2]), durable(3, 5, true, &all)].into();
        assert!(!FastAck::completes(&two_leaders), "the newest term's leader decides");
        let applied: BTreeMap<u64, FastAck> = [(2, FastAck::Applied { index: 9 })].into();
        assert!(FastAck::completes(&applied));
        let five = [1, 2, 3, 4, 5];
        let mut r5: BTreeMap<u64, FastAck> =
            [durable(1, 7, true, &five), durable(2, 7, false, &five), durable(3, 7, false, &five)].into();
        assert!(!FastAck::completes(&r5), "a majority of five is not enough");
        r5.extend([durable(4, 7, false, &[5, 4, 3, 2, 1])]);
        assert!(FastAck::completes(&r5), "four of five in the leader's term");
        let without_leader: BTreeMap<u64, FastAck> =
            (2..=5).map(|node| durable(node, 7, false, &five)).collect();
        assert!(!FastAck::completes(&without_leader), "four of five, the leader not among them");
    }
}
