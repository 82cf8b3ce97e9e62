//! Opening a node (validate, open the logs and the index, recover every shard, start the loop)
//! and the handles callers use: [`Node`] for the node, [`Replica`] for one shard's replica on it.

use crate::disk_space::DiskSpace;
use crate::group::{GroupInput, GroupShared};
use crate::hosting::GroupParts;
use crate::node::{Input, NodeCtx, NodeLoop, SHUTDOWN_WAIT};
use crate::state::State;
use crate::{
    ChunkRequest, Command, Done, IndexLayout, Limits, Outcome, ReplicaConfig, ReplicaError, ReplicaStatus,
    RequestId, SnapshotChunk, StorageMode, Transport,
};
use onekv_index::{Index, IndexConfig};
use onekv_log::{Log, LogConfig, OpenOptions};
use raft::eraftpb::Message;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The wall clock a simulated node starts at (any fixed value keeps runs replayable).
const SIMULATED_UNIX_MS: u64 = 1_600_000_000_000;

/// Inputs queued for the loop before new ones are refused.
const INBOX_CAPACITY: usize = 65_536;

/// The slowest `snapshot_fetch_bytes_per_sec` but 0 (none).
const MIN_FETCH_BYTES_PER_SEC: u64 = 1 << 20;

/// How long a chunk request for any view waits for the loop to make one (well within the
/// transport's call timeout).
const VIEW_WAIT: Duration = Duration::from_secs(10);

/// The loop of a node opened with [`Node::open_driven`]: the caller takes its turns.
/// Dropping it is a crash: nothing is failed or flushed, pending requests are never answered.
pub struct DrivenLoop {
    node_loop: NodeLoop,
    /// The log garbage collector, run between turns (`gc.enabled`).
    gc: Option<crate::gc::InlineGc>,
}

impl DrivenLoop {
    /// Takes one turn at time `now`: handles every queued input (peer messages, proposals, read
    /// barriers), ticks every group's Raft clock once if `tick`, persists, sends, applies and
    /// answers. Returns false once a shutdown was asked for.
    pub fn turn(&mut self, now: Instant, tick: bool) -> bool {
        let going = self.node_loop.drive(now, tick) == crate::node::Turn::Continue;
        if going && let Some(gc) = &mut self.gc {
            gc.after_turn(&mut self.node_loop, now);
        }
        going
    }

    /// [`Node::remove_replica`] for the node this loop drives (`node`): the loop drops the group
    /// at once, on the caller's thread.
    pub fn remove_replica(&mut self, node: &Node, shard: u64) -> Result<(), ReplicaError> {
        node.remove_replica_with(shard, false, || self.node_loop.remove_group(shard))
    }

    /// Whether the crash hook crashed this node; it then does nothing more.
    pub fn crashed(&self) -> bool {
        self.node_loop.ctx.crashed
    }

    /// Holds a group's Ready for `turns` more turns after each snapshot install (which a driven
    /// loop runs inline), as a running node does while its install thread rebuilds the tree:
    /// meanwhile the group drops its messages, is not ticked and persists nothing of its own
    /// (`snapshot::install`). 0, the default, releases it at once.
    pub fn hold_installs(&mut self, turns: u32) {
        self.node_loop.ctx.install_hold_turns = turns;
    }
}

/// A handle to a running node: its loop, and a replica of each of its shards. Cheap to clone;
/// every method may be called from any thread.
#[derive(Clone)]
pub struct Node {
    inner: Arc<NodeInner>,
}

pub(crate) struct NodeInner {
    pub(crate) node_id: u64,
    pub(crate) inbox: SyncSender<Input>,
    /// The replicas the node hosts now, by shard (replicas are added and removed while it runs).
    pub(crate) groups: RwLock<BTreeMap<u64, Arc<GroupShared>>>,
    /// The node's `REPLICAS` file as last written; held while a replica is added or removed.
    pub(crate) hosted: Mutex<crate::hosted::Hosted>,
    /// What building a replica's group needs (`hosting`); taken at shutdown, so a stopped node
    /// holds no files open.
    pub(crate) parts: Mutex<Option<GroupParts>>,
    pub(crate) limits: Limits,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The "disk full" alarm the write path checks.
    disk: Arc<DiskSpace>,
    /// The log garbage collector's thread (none in a simulation, or when it is off).
    gc: Mutex<Option<crate::gc::Gc>>,
    /// Where Raft messages go; snapshot fetches ask peers for chunks through it.
    pub(crate) transport: Arc<dyn Transport>,
    /// `ReplicaConfig::snapshot_chunk_bytes`.
    pub(crate) snapshot_chunk_bytes: usize,
    /// `ReplicaConfig::snapshot_from_followers`.
    pub(crate) snapshot_from_followers: bool,
    /// `ReplicaConfig::snapshot_timeout`: a fetch from a follower shows the leader it is alive
    /// well within it.
    pub(crate) snapshot_timeout: Duration,
    /// The snapshots this node is fetching (`snapshot::fetch`).
    pub(crate) fetches: crate::snapshot::fetch::Fetches,
    /// `ReplicaConfig::snapshot_fetch_bytes_per_sec`, shared by the fetches.
    pub(crate) fetch_rate: crate::snapshot::fetch::Rate,
    /// Where the shards this node removed replicas of went: the voters each last knew (from the
    /// `REPLICAS` file; read on every request for a shard the node does not host).
    pub(crate) retired_hints: RwLock<BTreeMap<u64, Vec<u64>>>,
}

/// A handle to one shard's replica on a running node. Cheap to clone; every method may be called
/// from any thread.
#[derive(Clone)]
pub struct Replica {
    node: Node,
    group: Arc<GroupShared>,
}

impl ReplicaConfig {
    /// Checks the configuration; the error names the field.
    pub fn validate(&self) -> Result<(), ReplicaError> {
        let bad = |m: &str| Err(ReplicaError::Open(format!("invalid configuration: {m}")));
        if self.node_id == 0 {
            return bad("node_id must be non-zero");
        }
        // None: a new node, to which replicas are added while it runs.
        if self.shards.len() > crate::MAX_SHARDS_PER_NODE {
            return bad("a node holds at most MAX_SHARDS_PER_NODE (1024) shards");
        }
        let mut seen = std::collections::BTreeSet::new();
        for shard in &self.shards {
            if shard.id == 0 || !seen.insert(shard.id) {
                return bad(&format!("shard ids must be non-zero and distinct (shard {})", shard.id));
            }
            // No voters: a replica waiting to be added to a running shard (as a learner); the
            // shard's leader sends it the members.
            if !shard.voters.is_empty() && !shard.voters.contains(&self.node_id) {
                return bad(&format!("the voters of shard {} must include node_id (or be empty)", shard.id));
            }
            if shard.voters.contains(&0) {
                return bad(&format!("the voter ids of shard {} must be non-zero", shard.id));
            }
            if shard.primary.is_some_and(|primary| !shard.voters.contains(&primary)) {
                return bad(&format!("the primary of shard {} must be one of its voters", shard.id));
            }
        }
        if self.tick.is_zero() {
            return bad("tick must be positive");
        }
        if self.heartbeat_ticks == 0 || self.election_ticks <= self.heartbeat_ticks {
            return bad("election_ticks must be greater than heartbeat_ticks, which must be at least 1");
        }
        if self.lease_reads && self.election_ticks < crate::MIN_LEASE_ELECTION_TICKS {
            return bad("lease_reads needs election_ticks of at least 3 (a lease of at least one tick)");
        }
        if self.memtable_bytes == 0 {
            return bad("memtable_bytes must be positive");
        }
        if let IndexLayout::Decoupled { follower_runs } = self.index_layout {
            onekv_index::Layout::Runs(follower_runs)
                .validate()
                .map_err(|e| ReplicaError::Open(format!("invalid configuration: index_layout: {e}")))?;
        }
        if self.max_snapshot_bytes == 0 || self.max_snapshot_bytes > crate::MAX_SNAPSHOT_BYTES {
            return bad("max_snapshot_bytes must be between 1 and MAX_SNAPSHOT_BYTES (200 MiB)");
        }
        let (low, high) = crate::SNAPSHOT_CHUNK_BYTES_RANGE;
        if !(low..=high).contains(&self.snapshot_chunk_bytes) {
            return bad("snapshot_chunk_bytes must be between 4 KiB and 64 MiB");
        }
        // A chunk must not wait anywhere near as long as its sender keeps a view unfetched, even
        // with every fetch slot busy.
        let fetches = crate::snapshot::fetch::MAX_FETCHES as u64;
        let slowest = (self.snapshot_chunk_bytes as u64 * fetches / 10).max(MIN_FETCH_BYTES_PER_SEC);
        if self.snapshot_fetch_bytes_per_sec != 0 && self.snapshot_fetch_bytes_per_sec < slowest {
            return Err(ReplicaError::Open(format!(
                "invalid configuration: snapshot_fetch_bytes_per_sec must be 0 (no bound) or at least {slowest} \
                 (1 MiB/s, and snapshot_chunk_bytes x {fetches} fetches per 10 s: a chunk may wait about 10 s at most)"
            )));
        }
        if self.flush_every_entries == 0 || self.flush_every.is_zero() {
            return bad("flush_every_entries and flush_every must be positive");
        }
        self.gc.validate().map_err(|e| ReplicaError::Open(format!("invalid configuration: {e}")))?;
        self.dedup.validate().map_err(|e| ReplicaError::Open(format!("invalid configuration: {e}")))?;
        if self.dedup.mode != crate::DedupMode::Off && self.storage != StorageMode::OneLog {
            return bad("dedup needs storage mode onelog (the other modes keep no value in the Raft log)");
        }
        self.log_config()
            .validate()
            .map_err(|e| ReplicaError::Open(format!("invalid configuration: {e}")))?;
        let l = &self.limits;
        if l.max_key_bytes == 0 || l.max_batch_ops == 0 || l.max_scan_pairs == 0 {
            return bad("limits must be positive");
        }
        // A whole batch must fit in one log record with room for framing.
        let record = self.log_config().max_record_bytes as usize;
        if l.max_batch_bytes + l.max_batch_ops * 16 + 1024 > record || l.max_value_bytes > l.max_batch_bytes {
            return bad(
                "max_batch_bytes (with per-op overhead) must fit a log record and be >= max_value_bytes",
            );
        }
        Ok(())
    }

    fn log_config(&self) -> LogConfig {
        LogConfig {
            segment_size_bytes: self.segment_bytes,
            max_record_bytes: self.max_record_bytes,
            recycled_segments: self.recycled_segments,
            ..LogConfig::default()
        }
    }
}

impl Node {
    /// Opens (or creates) the node in `config.data_dir` with a replica of every shard in
    /// `config.shards`, recovers them (one scan of the log, then each shard's replay), and starts
    /// the loop thread.
    pub fn open(config: ReplicaConfig, transport: Arc<dyn Transport>) -> Result<Node, ReplicaError> {
        config.validate()?;
        crate::failpoints::arm_from_env()
            .map_err(|e| ReplicaError::Open(format!("ONEKV_FAILPOINTS: {e}")))?;
        let dir = config.data_dir.clone();
        let log_config = config.log_config();
        let open_log = move |name: &str| -> Result<Arc<Log>, ReplicaError> {
            let (log, report) = Log::open_path(dir.join(name), log_config.clone(), OpenOptions::default())
                .map_err(|e| ReplicaError::Open(format!("opening the log {name}: {e}")))?;
            tracing::info!(log = name, ?report, "log opened");
            Ok(Arc::new(log))
        };
        let gc_config = config.gc.clone();
        let (node, node_loop) = Self::open_parts(config, transport, &open_log, false, None)?;
        if gc_config.enabled {
            let (logs, hosted_states, dedup) = node.inner.gc_inputs()?;
            let gc = crate::gc::Gc::start(
                gc_config,
                logs,
                (hosted_states, dedup),
                node.inner.inbox.clone(),
                node_loop.ctx.pins.clone(),
                node_loop.ctx.gc_status.clone(),
            )
            .map_err(ReplicaError::Open)?;
            *node.inner.gc.lock().unwrap_or_else(|e| e.into_inner()) = Some(gc);
        }
        let thread = std::thread::Builder::new()
            .name("onekv-node".into())
            .spawn(move || node_loop.run())
            .map_err(|e| ReplicaError::Open(format!("starting the node thread: {e}")))?;
        *node.inner.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(thread);
        Ok(node)
    }

    /// Opens (or creates) a node whose loop the caller drives, one [`DrivenLoop::turn`] at a
    /// time on the caller's thread, with its logs in the directories `log_dir(name)` returns
    /// (the index and the identity file stay in `config.data_dir`). This is how the deterministic
    /// simulation runs several nodes on one thread with simulated disks and time.
    ///
    /// Raft's randomized election timeout is pinned to `election_ticks` (raft-rs draws it from a
    /// generator nobody can seed); the driver varies when each node ticks instead.
    ///
    /// `mutation` runs a deliberately broken variant, to show the simulation's checkers catch it;
    /// only this entry point accepts one. `crash_hook` is asked at each step of an index flush
    /// whether the node crashes there ([`crate::CrashPoint`]); after it said yes the loop does
    /// nothing more and [`DrivenLoop::crashed`] is true: the driver then drops it, as a crash.
    pub fn open_driven(
        config: ReplicaConfig,
        transport: Arc<dyn Transport>,
        log_dir: &dyn Fn(&str) -> Arc<dyn onekv_log::io::Dir>,
        mutation: Option<crate::Mutation>,
        crash_hook: Option<crate::CrashHook>,
    ) -> Result<(Node, DrivenLoop), ReplicaError> {
        config.validate()?;
        let log_config = config.log_config();
        let open_log = |name: &str| -> Result<Arc<Log>, ReplicaError> {
            let (log, _) = Log::open(log_dir(name), log_config.clone(), OpenOptions::default())
                .map_err(|e| ReplicaError::Open(format!("opening the log {name}: {e}")))?;
            Ok(Arc::new(log))
        };
        let gc_config = config.gc.clone();
        let storage = config.storage;
        let (node, mut node_loop) = Self::open_parts(config, transport, &open_log, true, mutation)?;
        // The collector runs between turns, on the driving thread.
        let (logs, hosted_states, dedup) = node.inner.gc_inputs()?;
        let gc = gc_config.enabled.then(|| {
            let mut collector = crate::gc::Collector::new(
                gc_config,
                logs,
                (hosted_states, dedup),
                node_loop.ctx.pins.clone(),
                node_loop.ctx.gc_status.clone(),
            );
            collector.reclaim_before_flush = mutation == Some(crate::Mutation::GcReclaimsBeforeFlush);
            collector.ignores_shared_values = mutation == Some(crate::Mutation::GcIgnoresSharedValues);
            if storage == StorageMode::OneLog {
                // Few kept keys, so segments holding more live values than that are read whole and
                // their values looked up (the path a real node takes past 2^20 live keys). Not in
                // separated mode, which collects only segments whose keys were kept.
                collector.max_kept_keys = 16;
            }
            crate::gc::InlineGc::new(collector)
        });
        node_loop.ctx.mutation = mutation;
        node_loop.ctx.crash_hook = crash_hook;
        node_loop.ctx.clock = crate::node::WallClock::simulated(SIMULATED_UNIX_MS);
        Ok((node, DrivenLoop { node_loop, gc }))
    }

    /// Everything [`Node::open`] does but starting the thread.
    fn open_parts(
        config: ReplicaConfig,
        transport: Arc<dyn Transport>,
        open_log: &dyn Fn(&str) -> Result<Arc<Log>, ReplicaError>,
        driven: bool,
        mutation: Option<crate::Mutation>,
    ) -> Result<(Node, NodeLoop), ReplicaError> {
        let dir = &config.data_dir;
        crate::identity::create_dir_all_synced(dir)
            .map_err(|e| ReplicaError::Open(format!("creating {}: {e}", dir.display())))?;
        // A new directory may be a wiped member's: every shard starts out rejoining.
        let all_shards = config.shards.iter().map(|shard| shard.id).collect();
        crate::identity::check_or_create(dir, config.node_id, config.storage, || {
            crate::rejoin::store(dir, &all_shards).map_err(|e| {
                ReplicaError::Open(format!("writing {}: {e}", dir.join(crate::rejoin::FILE).display()))
            })
        })?;
        let rejoining = crate::rejoin::load(dir)?;
        // Before anything else writes: the reserve must be taken while there is room for it.
        let disk = Arc::new(match driven {
            true => DiskSpace::disabled(dir),
            false => DiskSpace::open(
                dir,
                config.min_free_bytes,
                config.reserve_bytes,
                crate::disk_space::CHECK_INTERVAL,
                Box::new(crate::disk_space::statvfs),
            ),
        });
        let started = Instant::now();
        let pins = Arc::new(crate::pins::ReadPins::default());

        let names = config.storage.log_names();
        let raft_log = open_log(names[0])?;
        let second_log = names.get(1).map(|name| open_log(name)).transpose()?;
        disk.govern_recycling(std::iter::once(&raft_log).chain(&second_log).cloned().collect());
        let index_dir = dir.join("index");
        let index = Arc::new(
            // Every tree's flush threshold (`Tree::memtable_full`) is the replica's.
            Index::open(
                &index_dir,
                IndexConfig { memtable_bytes: config.memtable_bytes, ..IndexConfig::default() },
            )
            .map_err(|e| ReplicaError::Open(format!("opening the index: {e}")))?,
        );
        let hosted = crate::hosted::load(dir)?.map_or_else(
            || {
                // The first open (or one of a directory from before replicas were listed): the
                // configured shards, whose trees have generation 0.
                let mut seeded = crate::hosted::Hosted::default();
                for shard in &config.shards {
                    seeded.host(shard.id, 0);
                }
                crate::hosted::store(dir, &seeded).map_err(|e| {
                    ReplicaError::Open(format!("writing {}: {e}", dir.join(crate::hosted::FILE).display()))
                })?;
                Ok::<_, ReplicaError>(seeded)
            },
            Ok,
        )?;
        for shard in config.shards.iter().filter(|shard| !hosted.hosted.contains_key(&shard.id)) {
            tracing::info!(
                shard = shard.id,
                "not opening the configured shard: its replica was removed from this node"
            );
        }
        // Before any tree is opened: nothing holds them.
        crate::hosted::delete_unused_trees(&index_dir, &hosted)?;
        let scrub_rate = match config.scrub_bytes_per_sec {
            0 => 0,
            rate => (rate / hosted.hosted.len().max(1) as u64).max(1),
        };
        // The node's clock, for its entries and its reads alike (a simulation's is the turns').
        let clock = crate::node::NodeClock::system();
        // Deduplication is the node's, shared by its replicas and its log GC (onelog mode only).
        // With the mode `off` it still applies puts by reference a leader sends (`wire_refs`), and
        // keeps the GC's fence for them.
        let dedup = (config.storage == StorageMode::OneLog).then(|| {
            let trusts_fingerprint = mutation == Some(crate::Mutation::DedupTrustsFingerprint);
            Arc::new(crate::dedup::Dedup::new(config.dedup.clone(), trusts_fingerprint))
        });
        let parts = GroupParts {
            config: config.clone(),
            dedup: dedup.clone(),
            index,
            raft_log: raft_log.clone(),
            second_log,
            pins: pins.clone(),
            driven,
            clock: (!driven).then_some(clock),
            scrub_rate,
            hosted_states: Default::default(),
            copies_budget: Default::default(),
            mutation,
        };
        let mut trees = hosted
            .hosted
            .iter()
            .map(|(shard, generation)| parts.trees(*shard, *generation))
            .collect::<Result<Vec<_>, _>>()?;
        // Each shard's request-id window (up to the last 120 s of writes) is read from its tree;
        // the shards' windows are independent, so they load in parallel.
        let windows = crate::recovery::in_parallel(&mut trees, |(tree, _)| {
            crate::requests::RequestWindow::load(tree.clone())
        })?;
        let configured = |shard: u64| config.shards.iter().find(|s| s.id == shard);
        let mut recovering = Vec::with_capacity(hosted.hosted.len());
        for ((shard, trees), requests) in hosted.hosted.keys().zip(trees).zip(windows) {
            let voters = configured(*shard).map(|s| s.voters.clone()).unwrap_or_default();
            recovering.push(parts.recovering(*shard, trees, requests, voters));
        }
        let scan = crate::recovery::recover(&raft_log, &mut recovering)?;
        tracing::info!(
            node = config.node_id,
            shards = recovering.len(),
            scan_from = scan.scan_from,
            records = scan.records,
            replayed = recovering.iter().map(|r| r.recovered.replayed).sum::<u64>(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "recovered"
        );

        let maintenance = crate::maintenance::Maintenance::new(!driven, config.index_compaction)
            .map_err(ReplicaError::Open)?;
        let mut groups = BTreeMap::new();
        let mut shared_groups = BTreeMap::new();
        for recovered in recovering {
            let shard = recovered.shard;
            let primary = configured(shard).and_then(|s| s.primary);
            let built = parts.group(recovered, primary, rejoining.contains(&shard))?;
            parts
                .hosted_states
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(shard, built.group.state.clone());
            shared_groups.insert(shard, built.shared);
            groups.insert(shard, built.group);
        }

        let (inbox_tx, inbox) = std::sync::mpsc::sync_channel(INBOX_CAPACITY);
        let node_id = config.node_id;
        let limits = config.limits.clone();
        let snapshot_chunk_bytes = config.snapshot_chunk_bytes;
        let (snapshot_from_followers, snapshot_timeout) =
            (config.snapshot_from_followers, config.snapshot_timeout);
        let fetch_rate = crate::snapshot::fetch::Rate::new(config.snapshot_fetch_bytes_per_sec);
        let node_transport = transport.clone();
        let node_loop = NodeLoop {
            ctx: NodeCtx {
                config,
                raft_log,
                transport,
                failed: None,
                wait_for_submits: driven,
                installs: (!driven).then(Default::default),
                install_hold_turns: 0,
                mutation: None,
                maintenance,
                crash_hook: None,
                crashed: false,
                clock: crate::node::WallClock::system(clock),
                disk: disk.clone(),
                pins,
                gc_status: Default::default(),
                dedup,
                budget_flush: None,
                budget_flushes: 0,
                fast_pending_bytes: 0,
            },
            groups,
            inbox,
        };
        let node = Node {
            inner: Arc::new(NodeInner {
                node_id,
                inbox: inbox_tx,
                groups: RwLock::new(shared_groups),
                retired_hints: RwLock::new(
                    hosted
                        .retired
                        .iter()
                        .map(|(shard, retired)| (*shard, retired.last_voters.clone()))
                        .collect(),
                ),
                hosted: Mutex::new(hosted),
                parts: Mutex::new(Some(parts)),
                limits,
                thread: Mutex::new(None),
                disk,
                gc: Mutex::new(None),
                transport: node_transport,
                snapshot_chunk_bytes,
                snapshot_from_followers,
                snapshot_timeout,
                fetches: Default::default(),
                fetch_rate,
            }),
        };
        // A replica found without Raft state is rejoining: say so on disk before it handles any
        // message, so a crash after its first hard state cannot bring it back free to vote.
        let mut node_loop = node_loop;
        node_loop.persist_rejoining().map_err(|e| ReplicaError::Open(e.to_string()))?;
        Ok((node, node_loop))
    }

    /// This node's id.
    pub fn id(&self) -> u64 {
        self.inner.node_id
    }

    /// The shards this node holds a replica of, in order.
    pub fn shards(&self) -> Vec<u64> {
        self.groups().keys().copied().collect()
    }

    /// The replica of `shard` on this node, if it holds one.
    pub fn replica(&self, shard: u64) -> Option<Replica> {
        let group = self.groups().get(&shard)?.clone();
        Some(Replica { node: self.clone(), group })
    }

    /// Every replica of this node, by shard.
    pub fn replicas(&self) -> Vec<Replica> {
        self.groups().values().map(|group| Replica { node: self.clone(), group: group.clone() }).collect()
    }

    fn groups(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<u64, Arc<GroupShared>>> {
        self.inner.groups.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The status of each of the node's replicas, by shard (as of the loop's last turn).
    pub fn statuses(&self) -> Vec<ReplicaStatus> {
        self.groups()
            .values()
            .map(|group| group.status.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .collect()
    }

    /// The request bounds this node enforces.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// Delivers a Raft message of `shard`'s group from a peer. Never blocks; messages are dropped
    /// if the node's inbox is full, or the node holds no replica of `shard`. A snapshot whose state
    /// is streamed starts a fetch of its chunks instead (`snapshot::fetch`), which delivers the
    /// message once they are stored.
    pub fn step(&self, shard: u64, message: Message) {
        if message.get_msg_type() == raft::eraftpb::MessageType::MsgSnapshot {
            let data = message.get_snapshot().data.as_ref();
            if data == crate::snapshot::stream::STAGED {
                // Only this node's fetcher marks a snapshot staged (through `deliver`).
                tracing::warn!(shard, from = message.from, "dropped a peer's snapshot marked as staged here");
                return;
            }
            if data == crate::snapshot::stream::STREAMED {
                let Some(group) = self.groups().get(&shard).cloned() else { return };
                // A snapshot no newer than what this replica committed durably: Raft refuses it
                // (and answers the leader) without anything to fetch. One being installed: the
                // group drops the message until the install ends.
                let index = message.get_snapshot().get_metadata().index;
                let have =
                    group.durable_commit.load(Ordering::SeqCst).max(group.installing.load(Ordering::SeqCst));
                // A stalled replica (`fast::group`) asked for this snapshot whatever it committed.
                let stalled = group.stalled_at.load(Ordering::SeqCst);
                if index <= have && !(stalled != 0 && index >= stalled) {
                    return self.deliver(shard, message);
                }
                if let Some(state) = self.state(shard) {
                    self.inner.fetches.offer(self, shard, message, state);
                }
                return;
            }
        }
        self.deliver(shard, message);
    }

    /// Queues a Raft message for the loop as it is.
    pub(crate) fn deliver(&self, shard: u64, message: Message) {
        self.send(Input::Group(shard, GroupInput::Step(message)));
    }

    pub(crate) fn inner(&self) -> &NodeInner {
        &self.inner
    }

    fn state(&self, shard: u64) -> Option<Arc<State>> {
        let group = self.groups().get(&shard)?.clone();
        group.state.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A chunk of the snapshot this node serves for `request.shard`: as its leader, the one it
    /// sent the follower asking (a snapshot whose state is streamed); as another replica, a view
    /// of its own it makes for that follower ([`ChunkRequest::any_view`]). Called by the peer
    /// service, on any thread but the loop's; reads the view and the log, as a scan does.
    pub fn snapshot_chunk(&self, request: &ChunkRequest) -> Result<SnapshotChunk, ReplicaError> {
        let state = self.state(request.shard).ok_or_else(|| {
            ReplicaError::InvalidArgument(format!("this node holds no replica of shard {}", request.shard))
        })?;
        if request.any_view {
            return self.serve_in_leaders_stead(request);
        }
        let served = state.served.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match served {
            Some(served) if served.index == request.index => served.chunk(request),
            _ => Err(ReplicaError::Dropped(format!(
                "shard {}: no snapshot at index {} is served here (any more)",
                request.shard, request.index
            ))),
        }
    }

    /// The first chunk of a view this replica serves a follower in its leader's stead: the loop
    /// makes (or finds) the view, this thread reads the chunk.
    fn serve_in_leaders_stead(&self, request: &ChunkRequest) -> Result<SnapshotChunk, ReplicaError> {
        if request.cursor != crate::ChunkCursor::Start {
            return Err(ReplicaError::InvalidArgument(
                "a request for any view starts at the first key".into(),
            ));
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let done: Done<_> = Box::new(move |result| {
            let _ = tx.send(result);
        });
        // The loop answers by then (a replica behind `index` waits to apply up to it until then).
        let deadline = Instant::now() + VIEW_WAIT / 2;
        let view =
            crate::group::ViewRequest { at_least: request.index, asked_by: request.from, deadline, done };
        self.send(Input::Group(request.shard, GroupInput::ServeView(view)));
        let served = rx.recv_timeout(VIEW_WAIT).map_err(|error| match error {
            std::sync::mpsc::RecvTimeoutError::Timeout => ReplicaError::Dropped(format!(
                "shard {}: the loop made no view within {VIEW_WAIT:?}",
                request.shard
            )),
            // Dropped unanswered: the replica left the node, or the node stopped.
            std::sync::mpsc::RecvTimeoutError::Disconnected => ReplicaError::Stopping,
        })??;
        let mut chunk =
            served.chunk(&ChunkRequest { index: served.index, any_view: false, ..request.clone() })?;
        chunk.view = Some(served.metadata.clone());
        Ok(chunk)
    }

    /// Queues `input` for the loop; if it cannot be queued, fails its reply (if it has one).
    fn send(&self, input: Input) {
        let (input, error) = match self.inner.inbox.try_send(input) {
            Ok(()) => return,
            Err(TrySendError::Full(input)) => {
                (input, ReplicaError::Dropped("the replica is overloaded".into()))
            }
            Err(TrySendError::Disconnected(input)) => (input, ReplicaError::Stopping),
        };
        if let Input::Group(_, input) = input {
            input.refuse(error);
        }
    }

    /// Stops the loop thread. Pending requests fail with [`ReplicaError::Stopping`]. Nothing is
    /// flushed: the index has no WAL and the next open replays what it needs from the log.
    pub fn shutdown(&self) {
        // Fetches write to the log; they end at their next chunk.
        self.inner.fetches.stop();
        // The collector first: it may be waiting for the loop.
        if let Some(mut gc) = self.inner.gc.lock().unwrap_or_else(|e| e.into_inner()).take() {
            gc.stop();
        }
        let Some(thread) = self.inner.thread.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let deadline = Instant::now() + SHUTDOWN_WAIT;
        let mut input = Input::Shutdown;
        loop {
            match self.inner.inbox.try_send(input) {
                Ok(()) | Err(TrySendError::Disconnected(_)) => break,
                Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                    input = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(TrySendError::Full(_)) => {
                    tracing::error!("the node's inbox stayed full; not waiting for the loop");
                    return;
                }
            }
        }
        if thread.join().is_err() {
            tracing::error!("the node's loop thread panicked");
        }
        self.inner.parts.lock().unwrap_or_else(|e| e.into_inner()).take();
        for group in self.groups().values() {
            group.state.write().unwrap_or_else(|e| e.into_inner()).take();
        }
    }
}

impl Replica {
    pub(crate) fn from_parts(node: Node, group: Arc<GroupShared>) -> Replica {
        Replica { node, group }
    }

    pub(crate) fn group(&self) -> &Arc<GroupShared> {
        &self.group
    }

    /// Opens (or creates) a node holding exactly one shard (as [`ReplicaConfig::new`] makes) and
    /// returns that shard's replica; [`Replica::node`] reaches the node.
    pub fn open(config: ReplicaConfig, transport: Arc<dyn Transport>) -> Result<Replica, ReplicaError> {
        if config.shards.len() != 1 {
            return Err(ReplicaError::Open(format!(
                "Replica::open takes a configuration of one shard, not {}: use Node::open",
                config.shards.len()
            )));
        }
        let node = Node::open(config, transport)?;
        Ok(node.replicas().remove(0))
    }

    /// The node this replica runs on.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The shard this replica belongs to.
    pub fn shard(&self) -> u64 {
        self.group.shard
    }

    fn send(&self, input: GroupInput) {
        self.node.send(Input::Group(self.group.shard, input));
    }

    /// Delivers a Raft message of this shard from a peer. Never blocks; messages are dropped if
    /// the node's inbox is full.
    pub fn step(&self, message: Message) {
        self.node.step(self.group.shard, message);
    }

    /// Proposes `command` (leader only); `done` runs once it is applied here, or fails. While the
    /// disk is nearly full it fails at once with [`ReplicaError::DiskFull`].
    pub fn propose(&self, request_id: RequestId, command: Command, done: Done<Outcome>) {
        if let Err(err) = self.node.inner.limits.check(&command) {
            return done(Err(err));
        }
        // A leader in "disk full" alarm refuses writes at once; a follower still redirects, so
        // clients find the leader that took over.
        if let Some(alarm) = self.node.inner.disk.alarm()
            && self.group.status.lock().unwrap_or_else(|e| e.into_inner()).role == "leader"
        {
            return done(Err(ReplicaError::DiskFull(alarm)));
        }
        self.send(GroupInput::Propose { request_id, command, done });
    }

    /// Sends a fast write (`docs/design/fast-path.md`): this replica makes it durable and answers
    /// with its term, whether it leads and the voters it knows ([`crate::FastAck`]); the leader
    /// orders it afterwards. A client sends it to every voter and counts it done when
    /// [`crate::FastAck::completes`] says so, else it sends the same id through [`Replica::propose`].
    /// Refused (use the Raft path) while the fast path is off, the membership changes, a new
    /// leader is still recovering what may have completed, too many fast writes are pending, or
    /// (at R = 5) a fast write of one of its keys is pending here.
    pub fn fast_write(&self, request_id: RequestId, ops: Vec<crate::WriteOp>, done: Done<crate::FastAck>) {
        // Checked as the command it becomes, without copying the values to build it.
        let write = Command::Write(ops);
        if let Err(err) = self.node.inner.limits.check(&write) {
            return done(Err(err));
        }
        let Command::Write(ops) = write else { unreachable!("built as a write just above") };
        self.send(GroupInput::FastWrite { id: request_id, ops, done });
    }

    /// Changes the shard's members by one step (leader only; see [`crate::MembershipChange`]):
    /// `done` gets the members once the change is applied here. A change that enters a joint
    /// configuration is answered on entering it; the leader then leaves it on its own, which
    /// [`ReplicaStatus::outgoing_voters`] (empty again) shows.
    pub fn change_members(&self, change: crate::MembershipChange, done: Done<crate::Members>) {
        self.send(GroupInput::ChangeMembers { change, done });
    }

    /// Hands the shard's leadership to voter `to` (leader only), which takes itself as the shard's
    /// preferred leader (so leadership is not handed back to the configured primary) until its
    /// node restarts. `done` answers once the hand-off has started; the status shows when `to`
    /// leads.
    pub fn transfer_leadership(&self, to: u64, done: Done<()>) {
        self.send(GroupInput::TransferLeader { to, done });
    }

    /// Confirms leadership with a quorum (ReadIndex) and waits until this replica has applied
    /// everything committed before the call; after `done(Ok(()))`, [`Replica::get`] and
    /// [`Replica::scan`] are linearizable.
    pub fn read_barrier(&self, done: Done<()>) {
        self.send(GroupInput::ReadBarrier(done));
    }
    /// Reads `key` from what this replica has applied (stale unless preceded by a read barrier).
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ReplicaError> {
        self.check_key(key)?;
        self.state()?.get(key)
    }

    /// [`Replica::get`] with the key's expiry time (ms since the Unix epoch; `None`: it never
    /// expires). A key whose time has come is absent.
    pub fn get_with_expiry(&self, key: &[u8]) -> Result<Option<crate::ValueWithExpiry>, ReplicaError> {
        self.check_key(key)?;
        let state = self.state()?;
        state.get_at(key, state.now_ms())
    }

    /// Reads up to `limit` pairs with `start <= key < end` (no end when `None`) from what this
    /// replica has applied, in key order or reversed; returns the pairs and whether more remain.
    /// `limit` 0 or above the configured maximum means the maximum.
    pub fn scan(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        reverse: bool,
    ) -> Result<crate::ScanResult, ReplicaError> {
        self.scan_range(start, end, limit, reverse, false)
    }

    /// [`Replica::scan`] without reading any value: every pair's value is empty. Costs index lookups
    /// only (counting or listing keys must not read gigabytes of values); `max_scan_bytes` then
    /// bounds the key bytes, so a page may hold more pairs, up to the same `limit`.
    pub fn scan_keys(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        reverse: bool,
    ) -> Result<crate::ScanResult, ReplicaError> {
        self.scan_range(start, end, limit, reverse, true)
    }

    fn scan_range(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        reverse: bool,
        keys_only: bool,
    ) -> Result<crate::ScanResult, ReplicaError> {
        let limits = &self.node.inner.limits;
        for bound in [Some(start), end].into_iter().flatten() {
            if bound.len() > limits.max_key_bytes {
                return Err(ReplicaError::InvalidArgument(format!(
                    "scan bound of {} bytes exceeds max_key_bytes = {}",
                    bound.len(),
                    limits.max_key_bytes
                )));
            }
        }
        let limit = if limit == 0 { limits.max_scan_pairs } else { limit.min(limits.max_scan_pairs) };
        self.state()?.scan(start, end, limit, reverse, limits.max_scan_bytes, keys_only)
    }

    fn state(&self) -> Result<Arc<State>, ReplicaError> {
        self.group.state.read().unwrap_or_else(|e| e.into_inner()).clone().ok_or(ReplicaError::Stopping)
    }

    fn check_key(&self, key: &[u8]) -> Result<(), ReplicaError> {
        let max = self.node.inner.limits.max_key_bytes;
        if key.is_empty() {
            return Err(ReplicaError::InvalidArgument("empty key".into()));
        }
        if key.len() > max {
            return Err(ReplicaError::InvalidArgument(format!(
                "key of {} bytes exceeds max_key_bytes = {max}",
                key.len()
            )));
        }
        Ok(())
    }

    /// The replica's current state (as of the loop's last turn).
    pub fn status(&self) -> ReplicaStatus {
        self.group.status.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The request bounds this replica enforces.
    pub fn limits(&self) -> &Limits {
        &self.node.inner.limits
    }

    /// Stops the node this replica runs on (every shard of it): see [`Node::shutdown`].
    pub fn shutdown(&self) {
        self.node.shutdown();
    }
}
