//! Building a replica's group from its trees and the node's logs, when the node opens and when a
//! replica is added while it runs; and removing one.
//!
//! A replica added at runtime ([`Node::add_replica`]) starts empty and without members, waiting
//! for its shard's leader to add it as a learner (`membership`): its trees are created (a new
//! generation, `hosted`), its creation is recorded in its tree (a recovery point at the log's end,
//! so recovery never reads the log below it for this replica), the log collector protects it, it
//! is listed in the node's `REPLICAS` file, and only then does the loop start driving it (writing
//! the rejoining file with it first). A crash at any step leaves either no replica (an unlisted
//! tree is deleted at the next open) or a listed, recorded, rejoining one.
//!
//! A replica removed ([`Node::remove_replica`]) leaves the loop first (it never takes part in
//! Raft again), then is retired in the file, and only then stops being listed among the node's
//! shards, protected by the collector and held by the index; its trees are deleted at the next
//! open. A failed write leaves it listed, protected and shown; asking again finishes it. Whether removing it is safe (its
//! group no longer counts on it) is the caller's check: a replica cannot always tell that its
//! group removed it.
//!
//! Does not own the loop's handling of groups (`node`), recovery (`recovery`) or membership
//! changes (`membership`).

use crate::apply::Applier;
use crate::group::{Group, GroupShared};
use crate::lease::ReadLease;
use crate::node::Input;
use crate::raft_store::RaftStore;
use crate::recovery::Recovering;
use crate::state::{HostedStates, State};
use crate::{Node, Replica, ReplicaConfig, ReplicaError, ReplicaStatus, StorageMode};
use onekv_index::{Index, Tree};
use onekv_log::Log;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Append messages (each up to `max_size_per_msg`, 1 MiB) in flight to one follower.
const MAX_INFLIGHT_APPENDS: usize = 32;

/// Raft entry bytes a leader holds uncommitted before it refuses new proposals (they fail as
/// dropped and the client retries): bounds the leader's memory and each turn under overload.
const MAX_UNCOMMITTED_BYTES: u64 = 64 << 20;

/// Committed entry bytes handed to one apply batch.
const MAX_COMMITTED_BYTES_PER_READY: u64 = 16 << 20;

/// How long adding or removing a replica waits for the loop to take it.
const LOOP_WAIT: Duration = Duration::from_secs(30);

/// What building a replica's group needs from its node; kept by the node for replicas added while
/// it runs.
pub(crate) struct GroupParts {
    /// The node's settings (its `shards` are the configured ones, used at creation only).
    pub config: ReplicaConfig,
    /// The node's deduplication (every onelog node keeps one, also with the mode `off`).
    pub dedup: Option<Arc<crate::dedup::Dedup>>,
    pub index: Arc<Index>,
    pub raft_log: Arc<Log>,
    pub second_log: Option<Arc<Log>>,
    pub pins: Arc<crate::pins::ReadPins>,
    /// A simulation drives the node (no threads of its own).
    pub driven: bool,
    /// The clock a server node's reads judge expiry by (the loop's own); `None` in a simulation,
    /// whose reads judge by the entries' times alone.
    pub clock: Option<crate::node::NodeClock>,
    /// Each replica's share of the node's scrub budget.
    pub scrub_rate: u64,
    /// The states of the hosted replicas, as the log collector sees them.
    pub hosted_states: HostedStates,
    /// What the snapshot views this node serves may remember of the copies they sent.
    pub copies_budget: Arc<crate::snapshot::CopiesBudget>,
    /// A deliberately broken behaviour (simulation only).
    pub mutation: Option<crate::Mutation>,
}

/// A group built for the loop, and the handle callers share with it.
pub(crate) struct Built {
    pub group: Group,
    pub shared: Arc<GroupShared>,
}

/// The node's storage mode and logs, and its hosted replicas' states: what the log collector reads.
pub(crate) type GcInputs =
    ((StorageMode, Arc<Log>, Option<Arc<Log>>), HostedStates, Option<Arc<crate::dedup::Dedup>>);

impl crate::replica::NodeInner {
    pub(crate) fn gc_inputs(&self) -> Result<GcInputs, ReplicaError> {
        let parts = self.parts.lock().unwrap_or_else(|e| e.into_inner());
        let parts = parts.as_ref().ok_or(ReplicaError::Stopping)?;
        Ok((
            (parts.config.storage, parts.raft_log.clone(), parts.second_log.clone()),
            parts.hosted_states.clone(),
            parts.dedup.clone(),
        ))
    }
}

impl GroupParts {
    /// Opens (or creates) the trees of `shard`'s replica of `generation`.
    pub fn trees(&self, shard: u64, generation: u32) -> Result<(Tree, Option<Tree>), ReplicaError> {
        let tree = self
            .index
            .tree(&crate::hosted::shard_tree_name(shard, generation))
            .map_err(|e| ReplicaError::Open(format!("opening the index tree of shard {shard}: {e}")))?;
        let entry_tree = match self.config.storage {
            StorageMode::Classic => {
                Some(self.index.tree(&crate::hosted::entry_tree_name(shard, generation)).map_err(|e| {
                    ReplicaError::Open(format!("opening the entry tree of shard {shard}: {e}"))
                })?)
            }
            _ => None,
        };
        Ok((tree, entry_tree))
    }

    /// A replica of `shard` about to be recovered, over its trees, with `voters` as its members
    /// if its tree records none.
    pub fn recovering(
        &self,
        shard: u64,
        (tree, entry_tree): (Tree, Option<Tree>),
        requests: crate::requests::RequestWindow,
        voters: Vec<u64>,
    ) -> Recovering {
        let clock_ms = requests.clock_ms();
        let state = Arc::new(State {
            mode: self.config.storage,
            index: self.index.clone(),
            tree,
            raft_log: self.raft_log.clone(),
            second_log: self.second_log.clone(),
            entry_tree,
            user_bytes: AtomicU64::new(0),
            requests: Mutex::new(requests),
            corruption: Default::default(),
            pins: self.pins.clone(),
            served: Mutex::new(None),
            staged: Mutex::new(Default::default()),
            installs: AtomicU64::new(0),
            clock: self.clock,
            // The window's clock until entries apply: a restarted replica judges expiry by its
            // last leader time, not by none.
            applied_time_ms: AtomicU64::new(clock_ms),
            expiring_writes: AtomicU64::new(0),
            expired_deleted: AtomicU64::new(0),
            dedup: self.dedup.clone(),
            copies_budget: self.copies_budget.clone(),
            references_as_published: self.mutation
                == Some(crate::Mutation::InstallResolvesReferencesAsPublished),
        });
        let snapshots = crate::snapshot::SnapshotBuilder::new(
            state.clone(),
            self.config.max_snapshot_bytes,
            !self.driven,
        );
        let store = RaftStore::new(
            shard,
            self.raft_log.clone(),
            state.clone(),
            raft::eraftpb::ConfState { voters, ..Default::default() },
            snapshots,
            Instant::now(),
        );
        let mut applier = Applier::new(state, shard);
        applier.unchecked_expiry_deletes = self.mutation == Some(crate::Mutation::DeletesExpiredUnchecked);
        applier.range_reads_at_batch_start = self.mutation == Some(crate::Mutation::RangePageReadsBatchStart);
        applier.order_skips_window = self.mutation == Some(crate::Mutation::OrderSkipsWindow);
        Recovering::new(shard, store, applier)
    }

    /// The group of a recovered replica. `primary` is its preferred leader, `rejoin_listed`
    /// whether the node's rejoining file names it.
    pub fn group(
        &self,
        mut recovered: Recovering,
        primary: Option<u64>,
        rejoin_listed: bool,
    ) -> Result<Built, ReplicaError> {
        let mutation = self.mutation;
        let config = &self.config;
        let shard = recovered.shard;
        let state = recovered.applier.state.clone();
        // Counting starts after recovery: replayed entries are not new user bytes.
        state.user_bytes.store(0, Ordering::Relaxed);
        // Replayed repair requests were answered when first applied; offering copies again
        // would only propose repairs nobody needs.
        recovered.applier.take_offers();
        let report = &recovered.recovered;
        tracing::debug!(
            shard,
            scan_from = report.scan_from,
            records = report.records,
            flush_flag = report.flush_flag,
            replayed = report.replayed,
            commit = report.hard_state.commit,
            first = recovered.store.first(),
            last = recovered.store.last(),
            "shard recovered"
        );
        let raft_config = raft::Config {
            id: config.node_id,
            election_tick: config.election_ticks,
            heartbeat_tick: config.heartbeat_ticks,
            applied: recovered.store.applied_index,
            max_size_per_msg: 1 << 20,
            // At most this many append messages of up to 1 MiB in flight to one follower: bounds
            // what a leader reads from its log and holds in memory for a follower catching up.
            max_inflight_msgs: MAX_INFLIGHT_APPENDS,
            max_uncommitted_size: MAX_UNCOMMITTED_BYTES,
            max_committed_size_per_ready: MAX_COMMITTED_BYTES_PER_READY,
            check_quorum: true,
            pre_vote: true,
            read_only_option: raft::ReadOnlyOption::Safe,
            // 0 means raft-rs's defaults: [election_tick, 2 * election_tick).
            min_election_tick: if self.driven { config.election_ticks } else { 0 },
            max_election_tick: if self.driven { config.election_ticks + 1 } else { 0 },
            ..Default::default()
        };
        raft_config.validate().map_err(|e| ReplicaError::Open(format!("raft configuration: {e}")))?;
        // A replica with no Raft state at all (term 0, no entries) is rejoining even if the
        // REJOINING file does not say so: its log was lost after the file was removed.
        let stateless = recovered.recovered.hard_state.term == 0 && recovered.store.last() == 0;
        if stateless && recovered.store.snapshot_index == 0 {
            recovered.record_creation(recovered.store.conf_state.clone(), &self.raft_log)?;
        }
        let hard_state = recovered.recovered.hard_state;
        let shared = Arc::new(GroupShared {
            shard,
            // Until the loop's first turn publishes the rest, status says what recovery did.
            status: Mutex::new(ReplicaStatus {
                node_id: config.node_id,
                shard,
                recovery_records: recovered.recovered.records,
                recovery_replayed: recovered.recovered.replayed,
                rejoining: rejoin_listed || stateless,
                ..Default::default()
            }),
            durable_commit: AtomicU64::new(hard_state.commit),
            installing: AtomicU64::new(0),
            stalled_at: AtomicU64::new(recovered.applier.stalled_at.unwrap_or(0)),
            recovery_records: recovered.recovered.records,
            recovery_replayed: recovered.recovered.replayed,
            state: RwLock::new(Some(state.clone())),
        });
        if mutation == Some(crate::Mutation::MembersFromConfig) {
            let voters =
                config.shards.iter().find(|s| s.id == shard).map(|s| s.voters.clone()).unwrap_or_default();
            recovered.store.conf_state = raft::eraftpb::ConfState { voters, ..Default::default() };
        }
        let logger = crate::slog_bridge::logger(config.node_id, shard);
        let raw = raft::RawNode::new(&raft_config, recovered.store, &logger)
            .map_err(|e| ReplicaError::Open(format!("starting raft for shard {shard}: {e}")))?;
        let scrub = crate::scrub::Scrub::start(state.clone(), self.scrub_rate, !self.driven)
            .map_err(ReplicaError::Open)?;
        let group = Group {
            shard,
            raw,
            applier: recovered.applier,
            state,
            shared: shared.clone(),
            proposals: Default::default(),
            wire_refs: Default::default(),
            member_changes: Default::default(),
            reads_unsent: Vec::new(),
            reads_in_flight: Default::default(),
            reads_waiting: Default::default(),
            next_read_ctx: 1,
            lease: config.lease_reads.then(|| {
                ReadLease::new(
                    config.tick,
                    config.election_ticks,
                    !self.driven,
                    self.mutation == Some(crate::Mutation::LeaseIgnoresTime),
                )
            }),
            reads_by_lease: 0,
            reads_by_read_index: 0,
            ticks_since_open: 0,
            persisted_hs: hard_state,
            entry_tree_seqno: recovered.entry_tree_seqno,
            snapshot_sends: BTreeMap::new(),
            waiting_views: Vec::new(),
            last_flush: None,
            scrub,
            repairs: BTreeMap::new(),
            expiry_sweep: Default::default(),
            primary,
            leader_since: None,
            stalled_leader_ticks: 0,
            layout: config.index_layout.for_role(primary == Some(config.node_id)),
            leveling_since: None,
            last_leveling: None,
            installing: None,
            fast: Default::default(),
            requested_transfer: None,
            gc_flush: false,
            rejoin: (rejoin_listed || stateless).then(crate::rejoin::Rejoin::default),
            rejoin_changed: stateless && !rejoin_listed,
        };
        Ok(Built { group, shared })
    }
}

/// Recovers a new replica (nothing to read: its trees are new), records its creation (a recovery
/// point at the log's end, no members, so no later open reads the log below it for this shard,
/// where records of an earlier replica of the shard on this node may remain) and lists it.
fn add_listed(
    parts: &GroupParts,
    hosted: &mut crate::hosted::Hosted,
    mut recovering: Recovering,
    generation: u32,
) -> Result<Built, ReplicaError> {
    let shard = recovering.shard;
    crate::recovery::recover_new(&parts.raft_log, &mut recovering)?;
    let mut built = parts.group(recovering, None, false)?;
    let mut listed = hosted.clone();
    listed.host(shard, generation);
    crate::failpoint!("hosting-before-listing");
    if let Err(e) = crate::hosted::store(&parts.config.data_dir, &listed) {
        // Its scrub thread and snapshot builder end with it.
        built.group.stop();
        let path = parts.config.data_dir.join(crate::hosted::FILE);
        return Err(ReplicaError::Storage(format!("writing {}: {e}", path.display())));
    }
    *hosted = listed;
    Ok(built)
}

impl Node {
    /// Adds a replica of `shard` to this node while it runs: empty, without members, waiting for
    /// the shard's leader to add this node as a learner ([`Replica::change_members`]), which sends
    /// it the shard's members and data (a snapshot or the log). Durable when it returns: the node
    /// reopens it after a restart. Adding a replica the node already hosts returns it.
    pub fn add_replica(&self, shard: u64) -> Result<Replica, ReplicaError> {
        if shard == 0 {
            return Err(ReplicaError::InvalidArgument("shard ids are non-zero".into()));
        }
        let inner = self.inner();
        let mut hosted = inner.hosted.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(replica) = self.replica(shard) {
            return Ok(replica);
        }
        if hosted.hosted.len() >= crate::MAX_SHARDS_PER_NODE {
            return Err(ReplicaError::InvalidArgument(format!(
                "node {} already hosts {} replicas, the most a node may (MAX_SHARDS_PER_NODE)",
                inner.node_id,
                hosted.hosted.len()
            )));
        }
        let parts = inner.parts.lock().unwrap_or_else(|e| e.into_inner());
        let parts = parts.as_ref().ok_or(ReplicaError::Stopping)?;
        let generation = match parts.mutation {
            Some(crate::Mutation::ReplicaReusesRetiredTrees) => {
                hosted.retired.get(&shard).map_or(0, |r| r.generation)
            }
            _ => hosted.next_generation(shard),
        };
        let trees = parts.trees(shard, generation)?;
        let requests = crate::requests::RequestWindow::load(trees.0.clone())?;
        let recovering = parts.recovering(shard, trees, requests, Vec::new());
        // The log collector protects it from before its creation is recorded (a tree without a
        // recovery point holds the whole log) until it is removed: a listed replica's recovery
        // point must never be reclaimed, and the collector's passes rely on this order.
        let state = recovering.applier.state.clone();
        parts.hosted_states.lock().unwrap_or_else(|e| e.into_inner()).insert(shard, state);
        let built = add_listed(parts, &mut hosted, recovering, generation).inspect_err(|_| {
            // Not listed: nothing to protect, and its trees are deleted at the next open.
            parts.hosted_states.lock().unwrap_or_else(|e| e.into_inner()).remove(&shard);
            parts.index.forget_tree(&crate::hosted::shard_tree_name(shard, generation));
            parts.index.forget_tree(&crate::hosted::entry_tree_name(shard, generation));
        })?;
        inner.retired_hints.write().unwrap_or_else(|e| e.into_inner()).remove(&shard);
        crate::failpoint!("hosting-before-driving");
        let shared = built.shared.clone();
        // The loop takes the group (and records it as rejoining) before any message for it can
        // arrive: the inbox is in order. It always drains its inbox, so this waits for room; it
        // fails only once the loop has ended (the replica, listed, is driven after the next start).
        inner.inbox.send(Input::AddGroup(Box::new(built.group))).map_err(|_| ReplicaError::Stopping)?;
        inner.groups.write().unwrap_or_else(|e| e.into_inner()).insert(shard, shared.clone());
        tracing::info!(
            node = inner.node_id,
            shard,
            generation,
            "added a replica, waiting to be added to its group"
        );
        Ok(Replica::from_parts(self.clone(), shared))
    }

    /// Removes this node's replica of `shard`: it leaves the node's loop at once (pending requests
    /// fail as not the leader) and never takes part in its group again; its trees are deleted at
    /// the node's next open. The caller must have checked with the shard's leader that this node
    /// is no longer one of its members (a removed replica may not know it was removed): removing
    /// a member's replica costs its group a copy. Refused while this replica leads. Removing a
    /// replica the node does not host does nothing.
    pub fn remove_replica(&self, shard: u64) -> Result<(), ReplicaError> {
        self.remove_replica_with(shard, true, || {
            let (done, removed) = std::sync::mpsc::sync_channel(1);
            self.send_blocking(Input::RemoveGroup { shard, done })?;
            match removed.recv_timeout(LOOP_WAIT) {
                Ok(result) => result,
                Err(_) => Err(ReplicaError::Stopping),
            }
        })
    }

    /// [`Node::remove_replica`] with `drop_group` taking the group out of the loop and returning
    /// the voters it knew; `threaded` when the loop runs on its own thread.
    ///
    /// The order keeps the node's list, the log collector and the loop consistent through a crash
    /// or a failed write: the loop drops the group first (it takes no part in Raft any more), then
    /// the file retires the replica, and only then does the collector stop protecting its
    /// recovery point. A failed write leaves the replica listed and protected; asking again
    /// finishes the removal.
    pub(crate) fn remove_replica_with(
        &self,
        shard: u64,
        threaded: bool,
        drop_group: impl FnOnce() -> Result<Vec<u64>, ReplicaError>,
    ) -> Result<(), ReplicaError> {
        let inner = self.inner();
        let mut hosted = inner.hosted.lock().unwrap_or_else(|e| e.into_inner());
        let replica = self.replica(shard);
        if replica.is_none() && !hosted.hosted.contains_key(&shard) {
            return Ok(());
        }
        let parts = inner.parts.lock().unwrap_or_else(|e| e.into_inner());
        let parts = parts.as_ref().ok_or(ReplicaError::Stopping)?;
        if parts.driven == threaded {
            // A driven loop waits for its caller, who removes replicas with `DrivenLoop`.
            return Err(ReplicaError::InvalidArgument(
                "a driven node removes replicas through its DrivenLoop".into(),
            ));
        }
        if let Some(replica) = &replica {
            // Refused there while it leads. Asked again after a failed write below, the loop no
            // longer has the group and knows no voters: the first answer is kept as the hint.
            let voters = drop_group()?;
            if !voters.is_empty() {
                inner.retired_hints.write().unwrap_or_else(|e| e.into_inner()).insert(shard, voters);
            }
            replica.group().state.write().unwrap_or_else(|e| e.into_inner()).take();
            inner.fetches.cancel(shard);
        }
        let last_voters = inner
            .retired_hints
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&shard)
            .cloned()
            .unwrap_or_default();
        let generation = hosted.hosted.get(&shard).copied();
        let mut listed = hosted.clone();
        listed.retire(shard, last_voters.clone());
        let dir = &parts.config.data_dir;
        crate::failpoint!("hosting-before-retiring");
        // Until this is written the replica stays listed, protected from the collector, and shown
        // among the node's shards (so whoever removes it sees it is not gone, and asks again).
        crate::hosted::store(dir, &listed).map_err(|e| {
            ReplicaError::Storage(format!("writing {}: {e}", dir.join(crate::hosted::FILE).display()))
        })?;
        *hosted = listed;
        crate::failpoint!("hosting-after-retiring");
        inner.groups.write().unwrap_or_else(|e| e.into_inner()).remove(&shard);
        parts.hosted_states.lock().unwrap_or_else(|e| e.into_inner()).remove(&shard);
        if let Some(generation) = generation {
            // Their memory and files go once the last handles (a flush job's) are dropped.
            parts.index.forget_tree(&crate::hosted::shard_tree_name(shard, generation));
            parts.index.forget_tree(&crate::hosted::entry_tree_name(shard, generation));
        }
        tracing::info!(node = inner.node_id, shard, "removed a replica; its trees go at the next start");
        Ok(())
    }

    /// The voters a replica of `shard` this node removed last knew (where clients may find the
    /// shard now), if it removed one and hosts none again. Never waits for an addition or a
    /// removal under way.
    pub fn last_voters_of_removed(&self, shard: u64) -> Option<Vec<u64>> {
        self.inner().retired_hints.read().unwrap_or_else(|e| e.into_inner()).get(&shard).cloned()
    }

    /// Queues `input` for the loop, waiting while the inbox is full (bounded by [`LOOP_WAIT`]).
    fn send_blocking(&self, input: Input) -> Result<(), ReplicaError> {
        let deadline = Instant::now() + LOOP_WAIT;
        let mut input = input;
        loop {
            match self.inner().inbox.try_send(input) {
                Ok(()) => return Ok(()),
                Err(std::sync::mpsc::TrySendError::Disconnected(_)) => return Err(ReplicaError::Stopping),
                Err(std::sync::mpsc::TrySendError::Full(back)) if Instant::now() < deadline => {
                    input = back;
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(std::sync::mpsc::TrySendError::Full(_)) => {
                    return Err(ReplicaError::Dropped("the node's inbox stayed full".into()));
                }
            }
        }
    }
}
