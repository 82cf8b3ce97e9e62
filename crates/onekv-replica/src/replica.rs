//! Opening a replica (validate, open the logs and the index, recover, start the loop) and the
//! handle callers use.

use crate::apply::Applier;
use crate::disk_space::DiskSpace;
use crate::node::{Input, NodeLoop, SHARD, SHUTDOWN_WAIT, Shared};
use crate::raft_store::RaftStore;
use crate::state::{self, State};
use crate::{
    Command, Done, Limits, Outcome, ReplicaConfig, ReplicaError, ReplicaStatus, RequestId, StorageMode,
    Transport,
};
use onekv_index::{Index, IndexConfig};
use onekv_log::{Log, LogConfig, OpenOptions};
use raft::eraftpb::Message;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The wall clock a simulated node starts at (any fixed value keeps runs replayable).
const SIMULATED_UNIX_MS: u64 = 1_600_000_000_000;

/// Raft entry bytes a leader holds uncommitted before it refuses new proposals (they fail as
/// dropped and the client retries): bounds the leader's memory and each turn under overload.
const MAX_UNCOMMITTED_BYTES: u64 = 64 << 20;

/// Append messages (each up to `max_size_per_msg`, 1 MiB) in flight to one follower.
const MAX_INFLIGHT_APPENDS: usize = 32;

/// Committed entry bytes handed to one apply batch.
const MAX_COMMITTED_BYTES_PER_READY: u64 = 16 << 20;

/// Inputs queued for the loop before new ones are refused.
const INBOX_CAPACITY: usize = 65_536;

/// The loop of a replica opened with [`Replica::open_driven`]: the caller takes its turns.
/// Dropping it is a crash: nothing is failed or flushed, pending requests are never answered.
pub struct DrivenLoop {
    node_loop: NodeLoop,
}

impl DrivenLoop {
    /// Takes one turn at time `now`: handles every queued input (peer messages, proposals, read
    /// barriers), ticks Raft's clock once if `tick`, persists, sends, applies and answers.
    /// Returns false once a shutdown was asked for.
    pub fn turn(&mut self, now: Instant, tick: bool) -> bool {
        self.node_loop.drive(now, tick) == crate::node::Turn::Continue
    }

    /// Whether the crash hook crashed this node; it then does nothing more.
    pub fn crashed(&self) -> bool {
        self.node_loop.crashed
    }
}

/// A handle to a running replica. Cheap to clone; every method may be called from any thread.
#[derive(Clone)]
pub struct Replica {
    inner: Arc<Inner>,
}

struct Inner {
    inbox: SyncSender<Input>,
    shared: Arc<Shared>,
    /// Taken away at shutdown, so a stopped replica holds no files open even while handles remain.
    state: std::sync::RwLock<Option<Arc<State>>>,
    limits: Limits,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The "disk full" alarm the write path checks.
    disk: Arc<DiskSpace>,
}

impl ReplicaConfig {
    /// Checks the configuration; the error names the field.
    pub fn validate(&self) -> Result<(), ReplicaError> {
        let bad = |m: &str| Err(ReplicaError::Open(format!("invalid configuration: {m}")));
        if self.node_id == 0 {
            return bad("node_id must be non-zero");
        }
        if !self.voters.contains(&self.node_id) {
            return bad("voters must include node_id");
        }
        if self.voters.contains(&0) {
            return bad("voter ids must be non-zero");
        }
        if self.tick.is_zero() {
            return bad("tick must be positive");
        }
        if self.heartbeat_ticks == 0 || self.election_ticks <= self.heartbeat_ticks {
            return bad("election_ticks must be greater than heartbeat_ticks, which must be at least 1");
        }
        if self.memtable_bytes == 0 {
            return bad("memtable_bytes must be positive");
        }
        if self.max_snapshot_bytes == 0 || self.max_snapshot_bytes > crate::MAX_SNAPSHOT_BYTES {
            return bad("max_snapshot_bytes must be between 1 and MAX_SNAPSHOT_BYTES (200 MiB)");
        }
        if self.flush_every_entries == 0 || self.flush_every.is_zero() {
            return bad("flush_every_entries and flush_every must be positive");
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
        // The record limit is the default one, which `SEGMENT_BYTES_RANGE` is computed from.
        LogConfig {
            segment_size_bytes: self.segment_bytes,
            max_record_bytes: onekv_log::DEFAULT_MAX_RECORD_BYTES,
            ..LogConfig::default()
        }
    }
}

impl Replica {
    /// Opens (or creates) the replica in `config.data_dir`, recovers it, and starts its loop
    /// thread.
    pub fn open(config: ReplicaConfig, transport: Arc<dyn Transport>) -> Result<Replica, ReplicaError> {
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
        let (mut replica, node_loop) = Self::open_parts(config, transport, &open_log, false)?;
        let thread = std::thread::Builder::new()
            .name("onekv-node".into())
            .spawn(move || node_loop.run())
            .map_err(|e| ReplicaError::Open(format!("starting the node thread: {e}")))?;
        *Arc::get_mut(&mut replica.inner)
            .expect("no other handle yet")
            .thread
            .get_mut()
            .unwrap_or_else(|e| e.into_inner()) = Some(thread);
        Ok(replica)
    }

    /// Opens (or creates) a replica whose loop the caller drives, one [`DrivenLoop::turn`] at a
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
    ) -> Result<(Replica, DrivenLoop), ReplicaError> {
        config.validate()?;
        let log_config = config.log_config();
        let open_log = |name: &str| -> Result<Arc<Log>, ReplicaError> {
            let (log, _) = Log::open(log_dir(name), log_config.clone(), OpenOptions::default())
                .map_err(|e| ReplicaError::Open(format!("opening the log {name}: {e}")))?;
            Ok(Arc::new(log))
        };
        let (replica, mut node_loop) = Self::open_parts(config, transport, &open_log, true)?;
        node_loop.mutation = mutation;
        node_loop.crash_hook = crash_hook;
        node_loop.clock.unix_ms_at_start = SIMULATED_UNIX_MS;
        Ok((replica, DrivenLoop { node_loop }))
    }

    /// Everything [`Replica::open`] does but starting the thread.
    fn open_parts(
        config: ReplicaConfig,
        transport: Arc<dyn Transport>,
        open_log: &dyn Fn(&str) -> Result<Arc<Log>, ReplicaError>,
        driven: bool,
    ) -> Result<(Replica, NodeLoop), ReplicaError> {
        let dir = &config.data_dir;
        crate::identity::create_dir_all_synced(dir)
            .map_err(|e| ReplicaError::Open(format!("creating {}: {e}", dir.display())))?;
        crate::identity::check_or_create(dir, config.node_id, config.storage)?;
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

        let names = config.storage.log_names();
        let raft_log = open_log(names[0])?;
        let second_log = names.get(1).map(|name| open_log(name)).transpose()?;
        let index = Index::open(&dir.join("index"), IndexConfig::default())
            .map_err(|e| ReplicaError::Open(format!("opening the index: {e}")))?;
        let tree = index
            .tree(&state::shard_tree_name(SHARD))
            .map_err(|e| ReplicaError::Open(format!("opening the index tree: {e}")))?;
        let entry_tree = match config.storage {
            StorageMode::Classic => Some(
                index
                    .tree(&state::entry_tree_name(SHARD))
                    .map_err(|e| ReplicaError::Open(format!("opening the entry tree: {e}")))?,
            ),
            _ => None,
        };
        let requests = crate::requests::RequestWindow::load(tree.clone())?;
        let state = Arc::new(State {
            mode: config.storage,
            index,
            tree,
            raft_log: raft_log.clone(),
            second_log,
            entry_tree,
            user_bytes: AtomicU64::new(0),
            requests: Mutex::new(requests),
            corruption: Default::default(),
        });
        let snapshots =
            crate::snapshot::SnapshotBuilder::new(state.clone(), config.max_snapshot_bytes, !driven);
        let mut store =
            RaftStore::new(SHARD, raft_log.clone(), state.clone(), &config.voters, snapshots, Instant::now());
        let mut applier = Applier::new(state.clone(), SHARD);
        let mut entry_tree_seqno = 0;
        let recovered = crate::recovery::recover(&raft_log, &mut store, &mut applier, &mut entry_tree_seqno)?;
        // Counting starts after recovery: replayed entries are not new user bytes.
        state.user_bytes.store(0, Ordering::Relaxed);
        // Replayed repair requests were answered when first applied; offering copies again would
        // only propose repairs nobody needs.
        applier.take_offers();
        tracing::info!(
            node = config.node_id,
            scan_from = recovered.scan_from,
            records = recovered.records,
            flush_flag = recovered.flush_flag,
            replayed = recovered.replayed,
            commit = recovered.hard_state.commit,
            first = store.first(),
            last = store.last(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "recovered"
        );

        let raft_config = raft::Config {
            id: config.node_id,
            election_tick: config.election_ticks,
            heartbeat_tick: config.heartbeat_ticks,
            applied: store.applied_index,
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
            min_election_tick: if driven { config.election_ticks } else { 0 },
            max_election_tick: if driven { config.election_ticks + 1 } else { 0 },
            ..Default::default()
        };
        raft_config.validate().map_err(|e| ReplicaError::Open(format!("raft configuration: {e}")))?;
        let durable_commit = recovered.hard_state.commit;
        let raw = raft::RawNode::new(&raft_config, store, &crate::slog_bridge::logger(config.node_id))
            .map_err(|e| ReplicaError::Open(format!("starting raft: {e}")))?;

        let (inbox_tx, inbox) = std::sync::mpsc::sync_channel(INBOX_CAPACITY);
        let shared = Arc::new(Shared {
            status: Mutex::new(ReplicaStatus::default()),
            recovery_records: recovered.records,
            stopped: Default::default(),
            durable_commit: AtomicU64::new(durable_commit),
        });
        let limits = config.limits.clone();
        let maintenance = crate::maintenance::Maintenance::new(!driven, config.index_compaction)
            .map_err(ReplicaError::Open)?;
        let scrub = crate::scrub::Scrub::start(state.clone(), config.scrub_bytes_per_sec, !driven)
            .map_err(ReplicaError::Open)?;
        let node_loop = NodeLoop {
            config,
            raw,
            applier,
            state: state.clone(),
            raft_log,
            transport,
            inbox,
            shared: shared.clone(),
            proposals: Default::default(),
            reads_unsent: Vec::new(),
            reads_in_flight: Default::default(),
            reads_waiting: Default::default(),
            next_read_ctx: 1,
            persisted_hs: recovered.hard_state,
            entry_tree_seqno,
            failed: None,
            snapshot_sends: BTreeMap::new(),
            wait_for_submits: driven,
            mutation: None,
            maintenance,
            crash_hook: None,
            crashed: false,
            clock: crate::node::WallClock::system(),
            last_flush: None,
            disk: disk.clone(),
            scrub,
            repairs: BTreeMap::new(),
        };
        let replica = Replica {
            inner: Arc::new(Inner {
                inbox: inbox_tx,
                shared,
                state: std::sync::RwLock::new(Some(state)),
                limits,
                thread: Mutex::new(None),
                disk,
            }),
        };
        Ok((replica, node_loop))
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
        match input {
            Input::Propose { done, .. } => done(Err(error)),
            Input::ReadBarrier(done) => done(Err(error)),
            Input::Step(_) | Input::Shutdown => {}
        }
    }

    /// Delivers a Raft message from a peer. Never blocks; messages are dropped if the replica's
    /// inbox is full.
    pub fn step(&self, message: Message) {
        self.send(Input::Step(message));
    }

    /// Proposes `command` (leader only); `done` runs once it is applied here, or fails. While the
    /// disk is nearly full it fails at once with [`ReplicaError::DiskFull`].
    pub fn propose(&self, request_id: RequestId, command: Command, done: Done<Outcome>) {
        if let Err(err) = self.inner.limits.check(&command) {
            return done(Err(err));
        }
        // A leader in "disk full" alarm refuses writes at once; a follower still redirects, so
        // clients find the leader that took over.
        if let Some(alarm) = self.inner.disk.alarm()
            && self.inner.shared.status.lock().unwrap_or_else(|e| e.into_inner()).role == "leader"
        {
            return done(Err(ReplicaError::DiskFull(alarm)));
        }
        self.send(Input::Propose { request_id, command, done });
    }

    /// Confirms leadership with a quorum (ReadIndex) and waits until this replica has applied
    /// everything committed before the call; after `done(Ok(()))`, [`Replica::get`] and
    /// [`Replica::scan`] are linearizable.
    pub fn read_barrier(&self, done: Done<()>) {
        self.send(Input::ReadBarrier(done));
    }

    /// Reads `key` from what this replica has applied (stale unless preceded by a read barrier).
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ReplicaError> {
        self.check_key(key)?;
        self.state()?.get(key)
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
        let limits = &self.inner.limits;
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
        self.inner.state.read().unwrap_or_else(|e| e.into_inner()).clone().ok_or(ReplicaError::Stopping)
    }

    fn check_key(&self, key: &[u8]) -> Result<(), ReplicaError> {
        let max = self.inner.limits.max_key_bytes;
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
        self.inner.shared.status.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The request bounds this replica enforces.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// Stops the loop thread. Pending requests fail with [`ReplicaError::Stopping`]. Nothing is
    /// flushed: the index has no WAL and the next open replays what it needs from the log.
    pub fn shutdown(&self) {
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
                    tracing::error!("the replica's inbox stayed full; not waiting for the loop");
                    return;
                }
            }
        }
        if thread.join().is_err() {
            tracing::error!("the replica's loop thread panicked");
        }
        self.inner.state.write().unwrap_or_else(|e| e.into_inner()).take();
    }
}
