//! The driver: real nodes ([`onekv_replica::Node::open_driven`]), each holding replicas of several
//! shards on its one log, on one thread, in simulated time, with simulated disks and network,
//! crashed and restarted by a seeded nemesis while seeded clients use them; then the checkers
//! judge what the clients saw. Shards are placed by the real placement (`onekv-placement`), and a
//! client sends each operation to a replica of its key's shard.
//!
//! Everything that varies comes from one [`StdRng`] seeded with the run's seed: message delays,
//! losses and duplicates, the order nodes take their turns in, when each node's clock ticks
//! (Raft's own election jitter is pinned, see `open_driven`), the workload, the faults, and what
//! survives a crash. The same seed therefore replays the same run, and [`Report::digest`] shows it.
//!
//! A run has three phases: the workload with faults (`run_ms`); settling (faults stop, the
//! network heals, crashed nodes restart, open operations finish); final linearizable reads of
//! every key, then each replica's own copy is read for the convergence and lost-write checks.
//!
//! What is simulated and what is real: the logs live in [`MemDir`]s behind [`FaultyDir`]s (power
//! loss keeps only synced bytes, or a torn prefix, or any mix of sectors; fsyncs and writes fail
//! on command). The index trees and the IDENTITY file are real files in a temporary directory
//! (under `/dev/shm` when it exists); a crash loses their unflushed memtables, as a killed process
//! would, but not their files: the index's own crash safety is lsm-tree's and is tested there.

use crate::checker;
use crate::history::{self, Op, OpKind, OpResult, ValueId};
use crate::network::{Network, NetworkFaults};
use onekv_log::io::{CrashMode, Dir, FaultHandle, FaultyDir, MemDir};
use onekv_placement::ClusterMap;
use onekv_replica::{
    Command, DrivenLoop, Expiry, MembershipChange, Mutation, Outcome, ReplicaConfig, ReplicaError, RequestId,
    ShardConfig, StorageMode, Transport, WriteOp,
};
use raft::eraftpb::Message;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One in this many steps of an index flush crashes the node, while the nemesis is on.
const FLUSH_CRASH_ODDS: u32 = 12;

/// A deliberately broken variant of the node, to show the checkers catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// The disk acknowledges fsyncs without making anything durable, so the node acknowledges
    /// writes (and votes) before they are durable; a crash loses everything it wrote, the index's
    /// files included.
    AckBeforeFsync,
    /// Reads skip ReadIndex: a replica answers from whatever it has applied, leader or not.
    ReadsWithoutReadIndex,
    /// The log GC deletes a segment without waiting for the flush that makes the moved values'
    /// new locators durable: a crash in between leaves keys pointing at deleted bytes.
    GcReclaimsBeforeFlush,
    /// A node whose disks were wiped votes at once, as if it still held the log it acknowledged,
    /// instead of waiting until it has caught up with its group.
    VotesWhileRejoining,
    /// A restarted node takes each shard's members from its configuration (the members the shard
    /// was created with), forgetting every membership change since.
    MembersFromConfig,
    /// A replica added again to a node that removed it takes up the removed replica's trees.
    ReplicaReusesRetiredTrees,
    /// Applying the leader's deletion of expired keys deletes each key it names without checking
    /// that it is still expired: a key written again after the sweep found it expired is lost.
    DeletesExpiredUnchecked,
    /// Deduplication takes a fingerprint match (fingerprints are cut to a few bits on some nodes,
    /// so matches of different values are common) as the same value without comparing bytes.
    DedupTrustsFingerprint,
    /// A leader puts a value by reference to a key an entry it proposed and has not applied yet
    /// writes: the put takes that entry's value instead of its own.
    ReferencesIgnoreUnapplied,
    /// The log GC collects a segment that deduplicated keys point into by reading it whole (so it
    /// finds only the keys its records name), and lets new references into segments it collects.
    GcIgnoresSharedValues,
    /// A range deletion's page finds its keys in the index as the batch being applied began, so
    /// replicas that apply different batches delete different keys (implies `range_deletes`).
    RangePageReadsBatchStart,
    /// A snapshot install resolves a key sent as a reference to an earlier key's copy by reading
    /// that key as it was before the snapshot (implies `dedup`).
    InstallResolvesReferencesAsPublished,
    /// A read lease lasts as long as the node leads, whatever the time (implies `lease_reads`).
    LeaseIgnoresTime,
    /// A fast-path client counts a fast write done once a majority of the voters (the leader
    /// among them) made it durable, not a fast quorum (every voter at R = 3, 4 of 5): a new
    /// leader may lack it (implies `fast_path`).
    FastCountsMajority,
    /// A new leader at R = 5 (fast quorum 4 of 5) recovers the fast writes of older terms from its
    /// own pending set only, without gathering a majority's: a write done without it is lost
    /// (implies `fast_path`; run with 5 replicas).
    FastRecoversWithoutGather,
    /// Applying the leader's ORDER applies a fast write whose id the window holds again (its
    /// client fell back to the Raft path, which applied it): a later write of the key is
    /// overwritten by the old value (implies `fast_path`).
    OrderSkipsWindow,
}

/// How many recurring values the workload draws from when `dedup` is on.
const RECURRING_VALUE_COUNT: ValueId = 6;

/// The `n`th recurring value: ids from [`history::RECURRING_VALUES`] on whose bytes are 104 or 204
/// long, so recurring values of one length often differ only in their bytes (a put by reference
/// that takes another recurring value than its own is then not refused for its length, and the
/// checker sees it).
fn recurring_value(n: ValueId) -> ValueId {
    (history::RECURRING_VALUES..)
        .filter(|id| matches!(history::encode_value(*id).len(), 104 | 204))
        .nth(n as usize)
        .expect("ids of both lengths recur")
}

/// What a run simulates.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Nodes.
    pub nodes: u64,
    /// Shards the keys are split into, each a Raft group of its own on `replicas` of the nodes.
    pub shards: u32,
    /// Replicas of each shard (at most `nodes`).
    pub replicas: u32,
    /// Concurrent clients, each with at most one operation open.
    pub clients: u32,
    /// Keys the clients share (few, so operations contend).
    pub keys: u32,
    /// Simulated milliseconds of workload and faults.
    pub run_ms: u64,
    /// Simulated milliseconds allowed afterwards to heal, converge and read back.
    pub settle_ms: u64,
    /// Raft's tick.
    pub tick_ms: u64,
    /// The network while faults are on (it becomes reliable when settling).
    pub network: NetworkFaults,
    /// Whether the nemesis runs.
    pub faults: bool,
    /// The nemesis acts every this many milliseconds (a random time in the range).
    pub fault_interval_ms: (u64, u64),
    /// Nodes that may be down (crashed, or stopped by a disk fault) at once.
    pub max_down: usize,
    /// One in this many crashes also wipes the node's disks (0: none do).
    pub wipe_one_in: u32,
    /// The storage mode of every replica.
    pub storage: StorageMode,
    /// A broken variant to run instead of the real node.
    pub bug: Option<Bug>,
    /// Search steps the linearizability checker may take per key.
    pub search_budget: u64,
    /// Whether the nemesis also changes shards' members (adds a learner, then replaces a voter by
    /// it through a joint configuration). Every node then starts with a replica of every shard:
    /// those of shards it is not a member of wait, with no members, to be added. A node drops its
    /// replica once its shard removed it, and gets a new one when the shard adds it again
    /// (`Node::add_replica`, `DrivenLoop::remove_replica`).
    pub member_changes: bool,
    /// Whether the workload also writes keys that expire: some far in the future, some already
    /// expired (absent at once, deleted later by the leaders' expiry sweeps, which run often).
    /// Off by default here so the broken variants' tests keep their calibrated seeds; the
    /// `onekv-sim` command turns it on, and the simulation tests run it on their own seeds.
    pub expiring_puts: bool,
    /// Whether nodes deduplicate values (each node another mode: off, inline, offline, elastic;
    /// even nodes with fingerprints cut to 2 bits, so different values match constantly and only
    /// the byte comparison keeps them apart) and half the puts write one of a few values that
    /// recur. Off by default, like `expiring_puts`, for the broken variants' calibrated seeds.
    pub dedup: bool,
    /// Whether half the workload's deletes are range deletions of up to 4 consecutive keys (each
    /// one page, in the shard of its first key). Off by default, like `expiring_puts`, for the
    /// broken variants' calibrated seeds. Needs `keys` ≤ 1000 (stored keys `key-NNN` sort by
    /// number only that far).
    pub range_deletes: bool,
    /// Whether a node holds a group's Ready for some turns after installing a snapshot (1 to 40,
    /// varying with the node and the time, drawn from neither generator), as a running node does
    /// while its install thread rebuilds the tree: the group drops its messages, is not ticked and
    /// persists nothing of its own meanwhile, under every fault. Off by default, like
    /// `expiring_puts`, for the broken variants' calibrated seeds.
    pub held_installs: bool,
    /// Whether the odd nodes answer linearizable reads they lead by a read lease
    /// (`ReplicaConfig::lease_reads`; the even nodes confirm every read with a ReadIndex round).
    pub lease_reads: bool,
    /// Whether nodes take fast writes (`ReplicaConfig::fast_path`, onelog only) and the odd
    /// clients send their blind writes (puts, deletes, puts with an absolute expiry) that way:
    /// to every replica of the key's shard at once (at R = 5 one request in four is lost), done
    /// when a fast quorum of the voters answered in the same term with the leader among them
    /// (`FastAck::completes`), else again through the Raft path with the same request id
    /// after [`FAST_WAIT_MS`].
    pub fast_path: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            nodes: 3,
            shards: 4,
            replicas: 3,
            clients: 4,
            keys: 8,
            run_ms: 4_000,
            settle_ms: 15_000,
            tick_ms: 10,
            network: NetworkFaults { drop_per_mille: 20, duplicate_per_mille: 10, max_delay_ms: 15 },
            faults: true,
            fault_interval_ms: (100, 500),
            max_down: 1,
            wipe_one_in: 4,
            storage: StorageMode::OneLog,
            bug: None,
            search_budget: 5_000_000,
            member_changes: false,
            expiring_puts: false,
            dedup: false,
            range_deletes: false,
            held_installs: false,
            lease_reads: false,
            fast_path: false,
        }
    }
}

/// What a run did and found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The seed that replays this run.
    pub seed: u64,
    /// Operations in the checked history.
    pub ops: usize,
    /// Operations answered.
    pub acknowledged: usize,
    /// Writes never answered (they may or may not have happened).
    pub unknown: usize,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Raft messages sent, lost and duplicated by the network.
    pub messages: (u64, u64, u64),
    /// Snapshots the leaders sent.
    pub snapshots: u64,
    /// Times a node was opened again after a crash (each one a recovery).
    pub recoveries: u64,
    /// Everything a checker (or the run itself) found wrong; empty means none.
    pub violations: Vec<String>,
    /// A hash of everything observable in the run; equal digests for equal seeds show determinism.
    pub digest: u64,
    /// Simulated milliseconds the run took.
    pub simulated_ms: u64,
    /// The applied index every replica reached.
    pub applied_index: u64,
    /// The checked history.
    pub history: Vec<Op>,
}

impl Report {
    /// One line for logs and test output.
    pub fn summary(&self) -> String {
        let faults: Vec<String> = self.faults.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!(
            "seed {}: {} ops ({} acknowledged, {} unknown), applied index {}, {} simulated ms, \
             messages sent/lost/duplicated {}/{}/{}, {} snapshots, {} recoveries, faults [{}], \
             digest {:016x}: {}",
            self.seed,
            self.ops,
            self.acknowledged,
            self.unknown,
            self.applied_index,
            self.simulated_ms,
            self.messages.0,
            self.messages.1,
            self.messages.2,
            self.snapshots,
            self.recoveries,
            faults.join(" "),
            self.digest,
            if self.violations.is_empty() {
                "no violations".to_string()
            } else {
                format!("{} VIOLATIONS: {}", self.violations.len(), self.violations.join("; "))
            }
        )
    }
}

/// Runs one simulation. Violations are reported, never panicked on; the run cannot fail otherwise
/// except for its temporary directory.
pub fn run(seed: u64, config: &SimConfig) -> std::io::Result<Report> {
    quiet_node_panics();
    let root = match std::path::Path::new("/dev/shm").is_dir() {
        true => tempfile::Builder::new().prefix("onekv-sim").tempdir_in("/dev/shm")?,
        false => tempfile::Builder::new().prefix("onekv-sim").tempdir()?,
    };
    let nodes: Vec<u64> = (1..=config.nodes).collect();
    let map = ClusterMap::build(&nodes, config.shards, config.replicas)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    let mut sim = Sim::new(seed, config.clone(), root.path().to_path_buf(), map);
    sim.run();
    Ok(sim.finish())
}

thread_local! {
    /// Set while a node takes its turn: a panic there is caught by the node loop and reported as
    /// the node's failure, so the default hook's message and backtrace are only noise.
    static IN_NODE_TURN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Installs (once) a panic hook that stays silent for panics the node loop catches.
fn quiet_node_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_NODE_TURN.with(|flag| flag.get()) {
                default(info);
            }
        }));
    });
}

/// The transport of a simulated node: messages (with their shard) wait in its outbox until the
/// driver sends them.
struct Outbox(Arc<Mutex<Vec<(u64, Message)>>>);

impl Transport for Outbox {
    fn send(&self, shard: u64, messages: Vec<Message>) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend(messages.into_iter().map(|m| (shard, m)));
    }
}

/// A running incarnation of a node.
struct Up {
    node: onekv_replica::Node,
    driven: DrivenLoop,
    /// Fault switches of its logs; the first is the Raft log's.
    faults: Vec<Arc<FaultHandle>>,
    /// A disk fault is armed and may not have fired yet.
    armed: bool,
}

struct Node {
    id: u64,
    data_dir: PathBuf,
    /// One simulated disk per log; they outlive incarnations.
    disks: BTreeMap<&'static str, MemDir>,
    up: Option<Up>,
    outbox: Arc<Mutex<Vec<(u64, Message)>>>,
    next_tick: u64,
    /// When a crashed node comes back.
    restart_at: Option<u64>,
    /// A paused node takes no turns until then (its inbox still fills).
    paused_until: u64,
    /// A stalled node takes turns but its Raft clock does not tick until then (a starved timer).
    stalled_until: u64,
    /// Some replica of it may lack its shard's log and it has not caught up since: its disks were
    /// wiped, or (with membership changes) it was rejoining a group it is a member of when last
    /// seen up (see `Sim::refresh_behind`).
    behind: bool,
}

/// An answer from a replica to a client's attempt.
enum Answer {
    Write(Result<Outcome, ReplicaError>),
    Barrier(Result<(), ReplicaError>),
    Fast(Result<onekv_replica::FastAck, ReplicaError>),
}

struct Completion {
    client: u32,
    serial: u64,
    node: u64,
    shard: u64,
    answer: Answer,
}

/// A client's open operation.
struct Open {
    op: usize,
    serial: u64,
    request: RequestId,
    attempts: u32,
    /// An attempt is outstanding until then.
    attempt_deadline: Option<u64>,
    /// When to try again (no attempt outstanding).
    retry_at: u64,
    give_up_at: u64,
    /// Some attempt may have been applied (it reached a replica and did not come back "not the
    /// leader").
    maybe_applied: bool,
    /// A fast write was sent for this operation (it then goes through the Raft path).
    fast_tried: bool,
    /// The fast write under way: the answers so far, and how many replicas it was sent to.
    fast: Option<(FastAnswers, usize)>,
}

/// The answers to a fast write so far, by node.
type FastAnswers = BTreeMap<u64, Result<onekv_replica::FastAck, ReplicaError>>;

struct Client {
    id: u32,
    request_client: u64,
    next_seq: u64,
    open: Option<Open>,
    next_start: u64,
    target: u64,
    /// Final readers run a fixed list of operations instead of random ones.
    script: Option<VecDeque<(u32, OpKind)>>,
    /// The last value this client saw per key (compare-and-swap expects it).
    last_seen: BTreeMap<u32, Option<ValueId>>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Workload,
    Settle,
    FinalReads,
}

/// An attempt that does not answer within this long is abandoned and retried elsewhere.
const ATTEMPT_TIMEOUT_MS: u64 = 600;
/// An operation is given up after this long.
const OPERATION_TIMEOUT_MS: u64 = 5_000;
/// How long a fast-path client waits for a fast quorum before it sends the write through the Raft
/// path.
pub const FAST_WAIT_MS: u64 = 40;

struct Sim {
    seed: u64,
    config: SimConfig,
    /// Where the shards live.
    map: ClusterMap,
    rng: StdRng,
    base: Instant,
    now: u64,
    nodes: Vec<Node>,
    network: Network,
    network_faults: NetworkFaults,
    clients: Vec<Client>,
    completions: Arc<Mutex<Vec<Completion>>>,
    history: Vec<Op>,
    /// History entries that turned out not to have happened (never applied, or failed reads).
    discarded: Vec<bool>,
    events: u64,
    next_serial: u64,
    next_value: ValueId,
    phase: Phase,
    next_fault: u64,
    heal_at: Option<u64>,
    faults: BTreeMap<&'static str, u64>,
    violations: Vec<String>,
    /// Each replica's own copy at the end, by (shard, node).
    finals: BTreeMap<(u64, u64), BTreeMap<u32, ValueId>>,
    final_applied: u64,
    recoveries: u64,
    stopped: bool,
    /// Whether the node taking its turn may crash inside an index flush now (the nemesis is on
    /// and another node may go down).
    flush_crashes_allowed: Arc<AtomicBool>,
    /// Shards whose members the nemesis asked to change: a wiped node restarts their replicas
    /// with no members (the ones they were created with may be gone) and waits for the leader.
    changed_shards: std::collections::BTreeSet<u64>,
    /// Answers to the nemesis's membership changes: applied or refused.
    member_answers: Arc<Mutex<Vec<bool>>>,
    /// Replicas whose removal from their shard was applied, by (shard, node): their nodes drop
    /// them (`DrivenLoop::remove_replica`) once the shard's leader confirms they are not members.
    removals: Arc<Mutex<std::collections::BTreeSet<(u64, u64)>>>,
}

impl Sim {
    fn new(seed: u64, config: SimConfig, root: PathBuf, map: ClusterMap) -> Sim {
        let mut rng = StdRng::seed_from_u64(seed);
        let nodes = (1..=config.nodes)
            .map(|id| Node {
                id,
                data_dir: root.join(format!("node{id}")),
                disks: config.storage.log_names().iter().map(|name| (*name, MemDir::new())).collect(),
                up: None,
                outbox: Arc::new(Mutex::new(Vec::new())),
                next_tick: rng.random_range(0..config.tick_ms),
                restart_at: Some(0),
                paused_until: 0,
                stalled_until: 0,
                behind: config.member_changes,
            })
            .collect();
        let clients = (0..config.clients)
            .map(|id| Client {
                id,
                request_client: rng.random(),
                next_seq: 1,
                open: None,
                next_start: rng.random_range(0..50),
                target: rng.random_range(1..=config.nodes),
                script: None,
                last_seen: BTreeMap::new(),
            })
            .collect();
        let network_faults = if config.faults { config.network.clone() } else { NetworkFaults::reliable() };
        let next_fault = rng.random_range(config.fault_interval_ms.0..=config.fault_interval_ms.1);
        Sim {
            seed,
            config,
            map,
            rng,
            base: Instant::now(),
            now: 0,
            nodes,
            network: Network::new(),
            network_faults,
            clients,
            completions: Arc::new(Mutex::new(Vec::new())),
            history: Vec::new(),
            discarded: Vec::new(),
            events: 0,
            next_serial: 1,
            next_value: 1,
            phase: Phase::Workload,
            next_fault,
            heal_at: None,
            faults: BTreeMap::new(),
            violations: Vec::new(),
            finals: BTreeMap::new(),
            final_applied: 0,
            recoveries: 0,
            stopped: false,
            flush_crashes_allowed: Arc::new(AtomicBool::new(false)),
            changed_shards: Default::default(),
            member_answers: Default::default(),
            removals: Default::default(),
        }
    }

    fn run(&mut self) {
        let end = self.config.run_ms + self.config.settle_ms;
        while !self.stopped {
            if self.now >= end {
                let statuses: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|n| match &n.up {
                        Some(up) => {
                            let shards: Vec<String> = up
                                .node
                                .statuses()
                                .iter()
                                .map(|s| {
                                    format!(
                                        "shard {} {} term {} commit {} applied {} members {:?}{}",
                                        s.shard,
                                        s.role,
                                        s.term,
                                        s.commit_index,
                                        s.applied_index,
                                        s.members(),
                                        if s.rejoining { " rejoining" } else { "" }
                                    )
                                })
                                .collect();
                            let failure = up.node.statuses().first().and_then(|s| s.failure.clone());
                            format!("node {} [{}] failure {failure:?}", n.id, shards.join("; "))
                        }
                        None => format!("node {} down", n.id),
                    })
                    .collect();
                let open = self.clients.iter().filter(|c| c.open.is_some()).count();
                self.violations.push(format!(
                    "no progress: {:?} not finished after {end} simulated ms ({open} operations open; {})",
                    self.phase,
                    statuses.join(", ")
                ));
                break;
            }
            self.step();
            self.now += 1;
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.base + Duration::from_millis(ms)
    }

    fn next_event(&mut self) -> u64 {
        self.events += 1;
        self.events
    }

    fn step(&mut self) {
        self.advance_phase();
        if self.phase == Phase::Workload && self.config.faults {
            self.nemesis();
        }
        if self.heal_at.is_some_and(|t| t <= self.now) {
            self.network.heal();
            self.heal_at = None;
        }
        for index in 0..self.nodes.len() {
            if self.nodes[index].restart_at.is_some_and(|t| t <= self.now) {
                self.restart(index);
                if self.stopped {
                    return;
                }
            }
        }
        for (shard, message) in self.network.due(self.now) {
            if let Some(up) =
                self.nodes.get((message.to as usize).wrapping_sub(1)).and_then(|n| n.up.as_ref())
            {
                up.node.step(shard, message);
            }
        }
        for client in 0..self.clients.len() {
            self.drive_client(client);
        }
        let mut order: Vec<usize> = (0..self.nodes.len()).collect();
        order.shuffle(&mut self.rng);
        for index in order {
            let allowed = self.phase == Phase::Workload
                && self.config.faults
                && self.down_count() < self.config.max_down;
            self.flush_crashes_allowed.store(allowed, Ordering::Relaxed);
            self.turn(index);
        }
    }

    fn advance_phase(&mut self) {
        match self.phase {
            Phase::Workload if self.now >= self.config.run_ms => {
                self.phase = Phase::Settle;
                self.network.heal();
                self.heal_at = None;
                self.network_faults = NetworkFaults::reliable();
                for index in 0..self.nodes.len() {
                    // A disk fault still armed would fire during the checks: that node crashes now.
                    if self.nodes[index].up.as_ref().is_some_and(|up| up.armed) {
                        self.crash(index, 0);
                    }
                    let node = &mut self.nodes[index];
                    node.paused_until = 0;
                    node.stalled_until = 0;
                    if node.up.is_none() {
                        node.restart_at = Some(self.now);
                    }
                }
            }
            Phase::Settle if self.clients.iter().all(|c| c.open.is_none()) && self.converged().is_some() => {
                self.phase = Phase::FinalReads;
                let script = (0..self.config.keys).map(|key| (key, OpKind::Get)).collect();
                let id = self.clients.len() as u32;
                let request_client = self.rng.random();
                let target = self.rng.random_range(1..=self.config.nodes);
                self.clients.push(Client {
                    id,
                    request_client,
                    next_seq: 1,
                    open: None,
                    next_start: self.now,
                    target,
                    script: Some(script),
                    last_seen: BTreeMap::new(),
                });
            }
            Phase::FinalReads => {
                let reader = self.clients.last().expect("the final reader");
                if reader.open.is_none()
                    && reader.script.as_ref().is_some_and(|s| s.is_empty())
                    && let Some((applied, members)) = self.converged()
                {
                    self.collect_finals(applied, &members);
                    self.stopped = true;
                }
            }
            _ => {}
        }
    }

    /// The sum over shards of their applied index, and each shard's members as its leader sees
    /// them (voters and learners), if every member of every shard is up and healthy, agrees on
    /// the leader, has applied everything committed and is not rejoining its group after a wipe,
    /// and no shard is between two configurations. Replicas of nodes that are not members (never
    /// added, or removed) do not count.
    fn converged(&self) -> Option<(u64, BTreeMap<u64, Vec<u64>>)> {
        let mut by_shard: BTreeMap<u64, BTreeMap<u64, onekv_replica::ReplicaStatus>> = BTreeMap::new();
        for node in &self.nodes {
            let Some(up) = node.up.as_ref() else { continue };
            for status in up.node.statuses() {
                by_shard.entry(status.shard).or_default().insert(node.id, status);
            }
        }
        let mut applied = 0;
        let mut members = BTreeMap::new();
        for shard in &self.map.shards {
            let statuses = by_shard.get(&shard.id)?;
            let (&leader, view) =
                statuses.iter().filter(|(_, s)| s.role == "leader").max_by_key(|(_, s)| s.term)?;
            if !view.outgoing_voters.is_empty() {
                return None;
            }
            let shard_members: Vec<u64> = view.voters.iter().chain(&view.learners).copied().collect();
            for member in &shard_members {
                let status = statuses.get(member)?;
                if status.failure.is_some()
                    || status.applied_index != status.commit_index
                    || status.applied_index != view.applied_index
                    || status.leader_id != Some(leader)
                    || status.rejoining
                {
                    return None;
                }
            }
            applied += view.applied_index;
            members.insert(shard.id, shard_members);
        }
        Some((applied, members))
    }

    /// Reads every replica's own copy of every key.
    fn collect_finals(&mut self, applied: u64, members: &BTreeMap<u64, Vec<u64>>) {
        for node in &self.nodes {
            let Some(up) = node.up.as_ref() else { continue };
            for replica in up.node.replicas() {
                let shard = replica.shard();
                if !members.get(&shard).is_some_and(|members| members.contains(&node.id)) {
                    continue;
                }
                let mut values = BTreeMap::new();
                match replica.scan(b"", None, 0, false) {
                    Ok((pairs, _)) => {
                        for (key, value) in pairs {
                            match (history::decode_key(&key), history::decode_value(&value)) {
                                (Some(key), Some(value)) => {
                                    values.insert(key, value);
                                }
                                _ => self.violations.push(format!(
                                    "node {}: stored pair {:?} = {} bytes is not one the workload wrote",
                                    node.id,
                                    String::from_utf8_lossy(&key),
                                    value.len()
                                )),
                            }
                        }
                    }
                    Err(e) => self
                        .violations
                        .push(format!("node {} shard {shard}: reading its copy failed: {e}", node.id)),
                }
                for key in values.keys() {
                    if self.map.shard_of_key(&history::encode_key(*key)) != shard {
                        self.violations.push(format!(
                            "node {}: key {key} is stored in shard {shard}, not its own",
                            node.id
                        ));
                    }
                }
                self.finals.insert((shard, node.id), values);
            }
        }
        self.final_applied = applied;
    }

    // ----- the nemesis -----

    fn down_count(&self) -> usize {
        self.nodes.iter().filter(|n| n.up.is_none()).count()
    }

    fn count(&mut self, kind: &'static str) {
        *self.faults.entry(kind).or_default() += 1;
    }

    fn nemesis(&mut self) {
        if self.now < self.next_fault {
            return;
        }
        let (low, high) = self.config.fault_interval_ms;
        self.next_fault = self.now + self.rng.random_range(low..=high);
        // A stalled node stays cut off, and the others connected, until the stall ends.
        if self.nodes.iter().any(|node| node.stalled_until > self.now) {
            return;
        }
        if self.config.member_changes {
            self.drop_removed_replicas();
        }
        let up: Vec<usize> = (0..self.nodes.len()).filter(|&i| self.nodes[i].up.is_some()).collect();
        if up.is_empty() {
            return;
        }
        let victim = up[self.rng.random_range(0..up.len())];
        let may_go_down = self.down_count() < self.config.max_down;
        // Fault kinds that only some configurations use come last, so the others' seeds replay.
        let kinds = 9 + u32::from(self.config.member_changes) + 3 * u32::from(self.config.lease_reads);
        match self.rng.random_range(0..kinds) {
            0 | 1 if may_go_down => {
                let downtime = self.rng.random_range(20..1_000);
                // What the victim holds is judged while it is still up.
                self.refresh_behind();
                self.crash(victim, downtime);
                if self.config.wipe_one_in > 0
                    && !self.copies_missing()
                    && self.rng.random_ratio(1, self.config.wipe_one_in)
                {
                    // The disk is replaced: the node comes back with an empty data directory and
                    // must rejoin its groups without voting for a stale candidate.
                    self.count("wipe");
                    self.wipe(victim);
                } else {
                    self.count("crash");
                }
            }
            2 if may_go_down => {
                self.count("io-kill");
                let after = self.rng.random_range(0..40);
                self.raft_log_faults(victim).kill_after(after);
            }
            3 if may_go_down => {
                self.count("fsync-fail");
                let after = self.rng.random_range(0..4);
                self.raft_log_faults(victim).fail_sync_after(after);
            }
            4 if may_go_down => {
                self.count("torn-write");
                let after = self.rng.random_range(0..4);
                self.raft_log_faults(victim).tear_write_after(after);
            }
            5 => {
                self.count("isolate");
                let id = self.nodes[victim].id;
                for other in 1..=self.config.nodes {
                    if other != id {
                        self.network.cut(id, other);
                        self.network.cut(other, id);
                    }
                }
                self.heal_at = Some(self.now + self.rng.random_range(100..1_500));
            }
            6 => {
                self.count("one-way-cut");
                let from = self.nodes[victim].id;
                let to = (from % self.config.nodes) + 1;
                self.network.cut(from, to);
                self.heal_at = Some(self.now + self.rng.random_range(100..1_500));
            }
            7 => {
                self.count("pause");
                self.nodes[victim].paused_until = self.now + self.rng.random_range(50..1_500);
            }
            8 | 9 if self.config.member_changes => self.change_members(),
            kind if self.config.lease_reads && kind + 3 >= kinds => {
                // A node cut off whose Raft clock stops meanwhile (its timer starved): as a leader
                // it never notices it lost its quorum, and keeps taking reads; only a lease that
                // runs on real time stops answering them before the others elect a new leader.
                self.count("stall-isolated");
                // The lease-reading node leading the most shards (a leader is what a stall can
                // mislead, and only a lease answers reads without its followers).
                let leads = |node: &Node| {
                    node.up
                        .as_ref()
                        .map_or(0, |up| up.node.statuses().iter().filter(|s| s.role == "leader").count())
                };
                let victim = up
                    .iter()
                    .copied()
                    .max_by_key(|&i| (self.nodes[i].id % 2 == 1, leads(&self.nodes[i]), i == victim))
                    .unwrap_or(victim);
                // Only this node is cut off: the others can elect a new leader meanwhile.
                self.network.heal();
                let id = self.nodes[victim].id;
                for other in 1..=self.config.nodes {
                    if other != id {
                        self.network.cut(id, other);
                        self.network.cut(other, id);
                    }
                }
                let until = self.now + self.rng.random_range(500..2_500);
                self.nodes[victim].stalled_until = until;
                self.heal_at = Some(until);
            }
            _ => {
                if self.network.partitioned() {
                    self.count("heal");
                    self.network.heal();
                    self.heal_at = None;
                }
            }
        }
    }

    /// Asks the leader of a random shard for the next step of moving a replica: add a node that
    /// is not a member as a learner (creating its replica first if its node hosts none), or, once
    /// there is one, promote it and remove a voter other than the leader (one joint step). Refused
    /// steps (a learner still catching up, an earlier change not applied yet) are counted, not
    /// retried. (Before each nemesis action, nodes drop the replicas their shards removed.)
    fn change_members(&mut self) {
        let shard = self.rng.random_range(1..=self.config.shards as u64);
        let leader = self.nodes.iter().find_map(|node| {
            let replica = node.up.as_ref()?.node.replica(shard)?;
            let status = replica.status();
            (status.role == "leader").then_some((node.id, replica, status))
        });
        let Some((leader, replica, status)) = leader else { return };
        let (change, out) = match status.learners.first() {
            Some(&learner) => {
                let others: Vec<u64> = status.voters.iter().copied().filter(|&v| v != leader).collect();
                if others.is_empty() {
                    return;
                }
                let out = others[self.rng.random_range(0..others.len())];
                (
                    MembershipChange { promote: vec![learner], remove: vec![out], ..Default::default() },
                    Some(out),
                )
            }
            None => {
                let members = status.members();
                // Only a node that is up can get a replica.
                let outsiders: Vec<usize> = (0..self.nodes.len())
                    .filter(|&i| self.nodes[i].up.is_some() && !members.contains(self.nodes[i].id))
                    .collect();
                if outsiders.is_empty() {
                    return;
                }
                let joining = &self.nodes[outsiders[self.rng.random_range(0..outsiders.len())]];
                let (id, node) =
                    (joining.id, joining.up.as_ref().expect("chosen among up nodes").node.clone());
                if node.replica(shard).is_none() {
                    match node.add_replica(shard) {
                        Ok(_) => self.count("replica-added"),
                        Err(error) => {
                            self.violations
                                .push(format!("node {id} could not add a replica of shard {shard}: {error}"));
                            return;
                        }
                    }
                }
                (MembershipChange { add_learners: vec![id], ..Default::default() }, None)
            }
        };
        self.count("member-change");
        self.changed_shards.insert(shard);
        let answers = self.member_answers.clone();
        let removals = self.removals.clone();
        replica.change_members(
            change,
            Box::new(move |result| {
                // A joint step still counts the removed voter among the outgoing ones until the
                // leader leaves the joint configuration; the node drops its replica after that.
                if let (Ok(members), Some(out)) = (&result, out)
                    && !members.voters.contains(&out)
                    && !members.learners.contains(&out)
                {
                    removals.lock().unwrap_or_else(|e| e.into_inner()).insert((shard, out));
                }
                answers.lock().unwrap_or_else(|e| e.into_inner()).push(result.is_ok())
            }),
        );
    }

    /// Has each node that is up drop its replica of a shard that removed it, once the shard's
    /// leader (the one of the highest term among the nodes that are up) does not count it as a
    /// member; a removal whose node is down waits, one whose node is a member again is forgotten.
    fn drop_removed_replicas(&mut self) {
        let pending: Vec<(u64, u64)> =
            self.removals.lock().unwrap_or_else(|e| e.into_inner()).iter().copied().collect();
        for (shard, id) in pending {
            let leader = self
                .nodes
                .iter()
                .filter_map(|node| node.up.as_ref()?.node.replica(shard).map(|replica| replica.status()))
                .filter(|status| status.role == "leader")
                .max_by_key(|status| status.term);
            let Some(leader) = leader else { continue };
            let members = leader.members();
            if members.outgoing_voters.contains(&id) && !members.voters.contains(&id) {
                // Still counted until the leader leaves the joint configuration.
                continue;
            }
            let forget = members.contains(id);
            let index = self.nodes.iter().position(|node| node.id == id).expect("a node of the simulation");
            let node = &mut self.nodes[index];
            if !forget {
                let Some(up) = node.up.as_mut() else { continue };
                if up.node.replica(shard).is_some() {
                    match up.driven.remove_replica(&up.node, shard) {
                        Ok(()) => *self.faults.entry("replica-removed").or_default() += 1,
                        // It leads (a stale leader of an older term): later.
                        Err(_) => continue,
                    }
                }
            }
            self.removals.lock().unwrap_or_else(|e| e.into_inner()).remove(&(shard, id));
        }
    }

    fn raft_log_faults(&mut self, index: usize) -> Arc<FaultHandle> {
        let up = self.nodes[index].up.as_mut().expect("the victim is up");
        up.armed = true;
        up.faults[0].clone()
    }

    /// Power loss on node `index`: its process is gone (pending requests are never answered) and
    /// its disks keep only what the crash mode lets survive.
    fn crash(&mut self, index: usize, downtime: u64) {
        let node = &mut self.nodes[index];
        if let Some(up) = node.up.take() {
            count_gc(&mut self.faults, &up.node);
            drop(up.driven);
            drop(up.node);
        }
        node.outbox.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let mode = match self.rng.random_range(0..3) {
            _ if self.config.bug == Some(Bug::AckBeforeFsync) => CrashMode::LoseUnsynced,
            0 => CrashMode::LoseUnsynced,
            1 => CrashMode::TornPrefix,
            _ => CrashMode::ScrambleSectors,
        };
        for disk in node.disks.values() {
            disk.crash(mode, self.rng.random());
        }
        if self.config.bug == Some(Bug::AckBeforeFsync) {
            // The lying disk loses the index's tables as well: the node comes back as it was
            // before its first write, having forgotten its votes and every entry it acknowledged.
            let _ = std::fs::remove_dir_all(node.data_dir.join("index"));
        }
        node.restart_at = Some(self.now + downtime);
    }

    /// Whether some replica does not hold its shard's log yet (see [`Node::behind`]). Wiping
    /// another node then could destroy the last copy of committed entries, which no replication
    /// factor of 3 survives, or leave a group in which no candidate can show it holds what every
    /// voter held.
    fn copies_missing(&mut self) -> bool {
        self.refresh_behind();
        self.nodes.iter().any(|node| node.behind)
    }

    /// Updates [`Node::behind`] of every node that is up; a node that is down keeps what was last
    /// seen. Without membership changes, only a wiped node is behind, until none of its replicas
    /// is rejoining. With them, any replica that some node counts as a member of its shard and
    /// that is rejoining its group (wiped, or new and not caught up since) is: a wiped replica
    /// restarts with no members and never asks for votes, so a rejoining one could never learn
    /// that its log is empty, and the group would wait for ever. A replica no node counts as a
    /// member (one waiting to be added) holds nothing to lose.
    fn refresh_behind(&mut self) {
        let mut members: BTreeMap<u64, std::collections::BTreeSet<u64>> = BTreeMap::new();
        for up in self.nodes.iter().filter_map(|node| node.up.as_ref()) {
            for status in up.node.statuses() {
                let known = status.members();
                let ids = known.voters.iter().chain(&known.learners).chain(&known.outgoing_voters);
                members.entry(status.shard).or_default().extend(ids);
            }
        }
        let member_changes = self.config.member_changes;
        for node in &mut self.nodes {
            let id = node.id;
            let Some(up) = &node.up else { continue };
            if !member_changes && !node.behind {
                continue;
            }
            node.behind = up.node.statuses().iter().any(|status| {
                status.rejoining && members.get(&status.shard).is_some_and(|m| m.contains(&id))
            });
        }
    }

    /// Node `index` (crashed) loses everything it stored: its logs, its index trees, its identity.
    fn wipe(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        node.behind = true;
        for disk in node.disks.values_mut() {
            *disk = MemDir::new();
        }
        if let Err(e) = std::fs::remove_dir_all(&node.data_dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            self.violations.push(format!("wiping node {}'s directory: {e}", node.id));
        }
    }

    fn restart(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        node.restart_at = None;
        let mut config = ReplicaConfig::new(node.id, Vec::new(), node.data_dir.clone());
        let member_changes = self.config.member_changes;
        let changed = &self.changed_shards;
        config.shards = self
            .map
            .shards
            .iter()
            .filter(|shard| member_changes || shard.replicas.contains(&node.id))
            .map(|shard| {
                // The members a shard was created with, for its first replicas; no members for
                // one that waits to be added, or a wiped one whose shard changed members since.
                let founder = shard.replicas.contains(&node.id) && !changed.contains(&shard.id);
                ShardConfig {
                    id: shard.id,
                    voters: if founder { shard.replicas.clone() } else { Vec::new() },
                    primary: founder.then(|| shard.replicas[0]),
                }
            })
            .collect();
        config.storage = self.config.storage;
        config.tick = Duration::from_millis(self.config.tick_ms);
        config.election_ticks = 10;
        config.heartbeat_ticks = 2;
        config.lease_reads = self.config.lease_reads && node.id % 2 == 1;
        config.fast_path = self.config.fast_path && self.config.storage == StorageMode::OneLog;
        // Small enough that index flushes, Raft log compaction and snapshots all happen.
        config.memtable_bytes = 4 << 10;
        config.raft_log_keep_entries = 8;
        config.flush_every_entries = 16;
        config.snapshot_timeout = Duration::from_millis(2_000);
        // Expired keys are deleted within the run, racing the workload's writes.
        config.expiry_sweep_interval = Duration::from_millis(100);
        // Small records and segments, so the log GC (run between turns, on simulated time)
        // relocates and reclaims constantly; the limits shrink to fit a record.
        config.max_record_bytes = 8 << 10;
        config.segment_bytes = 12 << 10;
        config.limits.max_batch_ops = 64;
        config.limits.max_batch_bytes = 4 << 10;
        config.limits.max_value_bytes = 2 << 10;
        config.limits.max_key_bytes = 256;
        config.gc = onekv_replica::GcConfig {
            interval: Duration::from_millis(50),
            bytes_per_sec: 0,
            // Odd nodes move small values into compressed blocks, even ones move every value as
            // it is: both forms are in every run.
            compress_below: if node.id % 2 == 1 {
                onekv_replica::GcConfig::default().compress_below
            } else {
                0
            },
            ..onekv_replica::GcConfig::default()
        };
        // Index layouts: nodes 1 and 4 keep every tree leveled, the others decouple followed
        // shards' trees into 2 or 3 sorted runs (merged often at these flush rates), so leader
        // changes keep switching trees between layouts while the workload and faults run.
        config.index_layout = match node.id % 3 {
            1 => onekv_replica::IndexLayout::Uniform,
            2 => onekv_replica::IndexLayout::Decoupled { follower_runs: 2 },
            _ => onekv_replica::IndexLayout::Decoupled { follower_runs: 3 },
        };
        // Nodes 2 and 5 flush their followed shards' trees by a shared budget of less than two
        // memtables (the largest first); node 3 flushes each at its own memtable size.
        config.follower_memtable_bytes = if node.id % 3 == 2 { 6 << 10 } else { 0 };
        // Deduplication is onelog's (the other modes keep no value in the Raft log).
        if self.config.dedup && self.config.storage == StorageMode::OneLog {
            config.dedup = onekv_replica::DedupConfig {
                mode: match node.id % 4 {
                    0 => onekv_replica::DedupMode::Off,
                    1 => onekv_replica::DedupMode::Inline,
                    2 => onekv_replica::DedupMode::Elastic,
                    _ => onekv_replica::DedupMode::Offline,
                },
                min_value_bytes: onekv_replica::DedupConfig::MIN_VALUE_BYTES,
                memory_bytes: onekv_replica::DedupConfig::MIN_MEMORY_BYTES,
                fingerprint_bits: if node.id.is_multiple_of(2) { 2 } else { 128 },
                references: true,
            };
        }
        // The node may crash at any step of an index flush (between sealing and writing the table,
        // between two trees' flushes, before compacting); its own generator keeps runs replayable.
        let allowed = self.flush_crashes_allowed.clone();
        let mut flush_rng = StdRng::seed_from_u64(self.rng.random());
        let crash_hook: onekv_replica::CrashHook = Box::new(move |_point| {
            allowed.load(Ordering::Relaxed) && flush_rng.random_ratio(1, FLUSH_CRASH_ODDS)
        });
        let handles = RefCell::new(Vec::new());
        let disks = &node.disks;
        let log_dir = |name: &str| -> Arc<dyn Dir> {
            let disk = disks.get(name).cloned().unwrap_or_default();
            let faulty = FaultyDir::new(Arc::new(disk));
            handles.borrow_mut().push(faulty.faults());
            Arc::new(faulty)
        };
        let transport: Arc<dyn Transport> = Arc::new(Outbox(node.outbox.clone()));
        let mutation = match self.config.bug {
            Some(Bug::ReadsWithoutReadIndex) => Some(Mutation::ReadsWithoutReadIndex),
            Some(Bug::GcReclaimsBeforeFlush) => Some(Mutation::GcReclaimsBeforeFlush),
            Some(Bug::VotesWhileRejoining) => Some(Mutation::VotesWhileRejoining),
            Some(Bug::MembersFromConfig) => Some(Mutation::MembersFromConfig),
            Some(Bug::ReplicaReusesRetiredTrees) => Some(Mutation::ReplicaReusesRetiredTrees),
            Some(Bug::DeletesExpiredUnchecked) => Some(Mutation::DeletesExpiredUnchecked),
            Some(Bug::DedupTrustsFingerprint) => Some(Mutation::DedupTrustsFingerprint),
            Some(Bug::ReferencesIgnoreUnapplied) => Some(Mutation::ReferencesIgnoreUnapplied),
            Some(Bug::GcIgnoresSharedValues) => Some(Mutation::GcIgnoresSharedValues),
            Some(Bug::RangePageReadsBatchStart) => Some(Mutation::RangePageReadsBatchStart),
            Some(Bug::InstallResolvesReferencesAsPublished) => {
                Some(Mutation::InstallResolvesReferencesAsPublished)
            }
            Some(Bug::LeaseIgnoresTime) => Some(Mutation::LeaseIgnoresTime),
            Some(Bug::OrderSkipsWindow) => Some(Mutation::OrderSkipsWindow),
            Some(Bug::FastRecoversWithoutGather) => Some(Mutation::FastRecoversWithoutGather),
            _ => None,
        };
        match onekv_replica::Node::open_driven(config, transport, &log_dir, mutation, Some(crash_hook)) {
            Ok((replica, mut driven)) => {
                if self.config.held_installs {
                    driven
                        .hold_installs(1 + ((self.now / 7 + node.id * 13 + self.recoveries * 5) % 40) as u32);
                }
                let faults = handles.into_inner();
                if self.config.bug == Some(Bug::AckBeforeFsync) {
                    for handle in &faults {
                        handle.lie_about_syncs();
                    }
                }
                node.up = Some(Up { node: replica, driven, faults, armed: false });
                if self.now > 0 {
                    self.recoveries += 1;
                }
                node.next_tick = self.now + self.config.tick_ms;
            }
            Err(e) => {
                self.violations.push(format!("node {} cannot reopen at {} ms: {e}", node.id, self.now));
                self.stopped = true;
            }
        }
    }

    /// One turn of node `index`, then what it sent goes to the network and what it answered to
    /// the clients.
    fn turn(&mut self, index: usize) {
        let now = self.now;
        let at = self.at(now);
        let node = &mut self.nodes[index];
        let Some(up) = node.up.as_mut() else { return };
        if node.paused_until > now {
            return;
        }
        let tick = now >= node.next_tick && now >= node.stalled_until;
        if tick {
            let jitter = self.rng.random_range(0..=self.config.tick_ms / 2);
            node.next_tick = now + self.config.tick_ms + jitter;
        }
        IN_NODE_TURN.with(|flag| flag.set(true));
        up.driven.turn(at, tick);
        IN_NODE_TURN.with(|flag| flag.set(false));
        let crashed_in_flush = up.driven.crashed();
        let statuses = up.node.statuses();
        let failed = statuses.iter().any(|s| s.failure.is_some()) || crashed_in_flush;
        let held_installs = statuses
            .iter()
            .filter(|s| s.snapshot.as_deref().is_some_and(|s| s.contains("installing the snapshot")))
            .count();
        let sent: Vec<(u64, Message)> =
            std::mem::take(&mut *node.outbox.lock().unwrap_or_else(|e| e.into_inner()));
        let from = node.id;
        for message in sent {
            self.network.send(now, from, message, &self.network_faults, &mut self.rng);
        }
        self.handle_completions();
        if crashed_in_flush {
            self.count("crash-in-flush");
        }
        for _ in 0..held_installs {
            self.count("held-install-turn");
        }
        if failed {
            // A disk fault stopped the node: it is restarted as a crashed process would be.
            let downtime = self.rng.random_range(20..500);
            self.crash(index, downtime);
        }
    }

    // ----- the clients -----

    fn new_op(&mut self, client: usize) -> Option<(u32, OpKind)> {
        if let Some(script) = self.clients[client].script.as_mut() {
            return script.pop_front();
        }
        if self.phase != Phase::Workload {
            return None;
        }
        let key = self.rng.random_range(0..self.config.keys);
        let kind = match self.rng.random_range(0..10) {
            0..=3 => OpKind::Get,
            4..=6 if self.config.expiring_puts && self.rng.random_range(0..3) == 0 => {
                OpKind::PutExpiring { value: self.fresh_value(), expired: self.rng.random_bool(0.5) }
            }
            4..=6 => OpKind::Put(self.fresh_value()),
            7 if self.config.range_deletes && self.rng.random_bool(0.5) => {
                self.count("range-deletion");
                OpKind::DeleteRange { to: (key + self.rng.random_range(1..4)).min(self.config.keys - 1) }
            }
            7 => OpKind::Delete,
            _ => {
                let expected = match self.rng.random_range(0..3) {
                    0 => None,
                    _ => self.clients[client].last_seen.get(&key).copied().flatten(),
                };
                let new = if self.rng.random_range(0..5) == 0 { None } else { Some(self.fresh_value()) };
                OpKind::Cas { expected, new }
            }
        };
        Some((key, kind))
    }

    fn fresh_value(&mut self) -> ValueId {
        if self.config.dedup && self.rng.random_bool(0.5) {
            // One of a few values that recur: what deduplication stores once.
            return recurring_value(self.rng.random_range(0..RECURRING_VALUE_COUNT));
        }
        self.next_value += 1;
        if self.config.dedup {
            // Fresh values of four lengths only, so that values matching another's (short)
            // fingerprint often have its length too and only their bytes differ.
            while !history::encode_value(self.next_value).len().is_multiple_of(50) {
                self.next_value += 1;
            }
        }
        self.next_value
    }

    fn drive_client(&mut self, client: usize) {
        let now = self.now;
        if self.clients[client].open.is_none() {
            if now < self.clients[client].next_start {
                return;
            }
            let Some((key, kind)) = self.new_op(client) else { return };
            let call = self.next_event();
            let c = &mut self.clients[client];
            let request = if kind.is_write() {
                c.next_seq += 1;
                RequestId { client: c.request_client, seq: c.next_seq }
            } else {
                RequestId::default()
            };
            self.history.push(Op { client: c.id, key, kind, call, ret: None, result: None });
            self.discarded.push(false);
            c.open = Some(Open {
                op: self.history.len() - 1,
                serial: self.next_serial,
                request,
                attempts: 0,
                attempt_deadline: None,
                retry_at: now,
                give_up_at: now + OPERATION_TIMEOUT_MS,
                maybe_applied: false,
                fast_tried: false,
                fast: None,
            });
            self.next_serial += 1;
        }
        let open = self.clients[client].open.as_ref().expect("opened above");
        if open.attempt_deadline.is_some_and(|deadline| now >= deadline) {
            // No answer: the attempt may still be applied later.
            let open = self.clients[client].open.as_mut().expect("open");
            open.attempt_deadline = None;
            open.maybe_applied = true;
            open.retry_at = now;
            // A fast write not done in time goes through the Raft path, to the same replica.
            if open.fast.take().is_none() {
                self.clients[client].target = self.rng.random_range(1..=self.config.nodes);
            }
        }
        let open = self.clients[client].open.as_ref().expect("open");
        if open.attempt_deadline.is_none() && now >= open.give_up_at {
            self.give_up(client);
            return;
        }
        if open.attempt_deadline.is_some() || now < open.retry_at {
            return;
        }
        self.attempt(client);
    }

    fn attempt(&mut self, client: usize) {
        let now = self.now;
        let key = self.history[self.clients[client].open.as_ref().expect("open").op].key;
        let shard = self.map.shard_of_key(&history::encode_key(key));
        let replicas = &self.map.shard(shard).expect("the map places every shard").replicas;
        // A client that knows no better asks some replica of the key's shard (any node, when every
        // node holds one).
        if !self.config.member_changes && !replicas.contains(&self.clients[client].target) {
            self.clients[client].target = replicas[self.rng.random_range(0..replicas.len())];
        }
        let target = self.clients[client].target;
        let c = &mut self.clients[client];
        let open = c.open.as_mut().expect("open");
        open.attempts += 1;
        let Some(up) = self.nodes[(target - 1) as usize].up.as_ref() else {
            // Connection refused: nothing was sent.
            open.retry_at = now + 10;
            c.target = self.rng.random_range(1..=self.config.nodes);
            return;
        };
        let Some(replica) = up.node.replica(shard) else {
            // The node no longer hosts the shard (its replica moved away): a server answers "not
            // the leader" at once, naming another node.
            open.retry_at = now + 1;
            c.target = self.rng.random_range(1..=self.config.nodes);
            return;
        };
        open.attempt_deadline = Some(now + ATTEMPT_TIMEOUT_MS);
        let (serial, id, request) = (open.serial, c.id, open.request);
        let op = &self.history[open.op];
        let completions = self.completions.clone();
        let reply = move |answer| {
            completions.lock().unwrap_or_else(|e| e.into_inner()).push(Completion {
                client: id,
                serial,
                node: target,
                shard,
                answer,
            })
        };
        let key = history::encode_key(op.key);
        let blind = matches!(op.kind, OpKind::Put(_) | OpKind::Delete | OpKind::PutExpiring { .. });
        if self.config.fast_path && id % 2 == 1 && blind && !open.fast_tried {
            return self.attempt_fast(client, shard);
        }
        let command = match &op.kind {
            OpKind::Get => {
                replica.read_barrier(Box::new(move |result| reply(Answer::Barrier(result))));
                return;
            }
            OpKind::Put(value) => Command::Write(vec![WriteOp {
                key,
                value: Some(history::encode_value(*value)),
                expiry: Default::default(),
            }]),
            OpKind::Delete => Command::Write(vec![WriteOp::delete(key)]),
            &OpKind::DeleteRange { to } => Command::DeleteRange {
                start: key,
                end: Some(history::encode_key(to + 1)),
                // Room for every key of the range: one page deletes them all.
                limit: to - op.key + 1,
                spare: Vec::new(),
            },
            OpKind::PutExpiring { value, expired } => Command::Write(vec![WriteOp {
                key,
                value: Some(history::encode_value(*value)),
                // Far past (the simulated clock starts in 2023) or far future.
                expiry: Expiry::At(if *expired { 1 } else { u64::MAX / 2 }),
            }]),
            OpKind::Cas { expected, new } => Command::Cas {
                key,
                expected: expected.map(history::encode_value),
                new: new.map(history::encode_value),
                new_expiry: Default::default(),
            },
        };
        replica.propose(request, command, Box::new(move |result| reply(Answer::Write(result))));
    }

    /// Sends the open operation (a blind write) as a fast write to every replica of `shard` that
    /// is up; the answers gather in the operation until they make it done
    /// (`FastAck::completes`) or all came, or [`FAST_WAIT_MS`] passed: then the Raft path.
    fn attempt_fast(&mut self, client: usize, shard: u64) {
        let now = self.now;
        let replicas = self.map.shard(shard).expect("the map places every shard").replicas.clone();
        let c = &mut self.clients[client];
        let open = c.open.as_mut().expect("open");
        open.fast_tried = true;
        open.maybe_applied = true;
        open.attempt_deadline = Some(now + FAST_WAIT_MS);
        let op = &self.history[open.op];
        let key = history::encode_key(op.key);
        let ops = vec![match &op.kind {
            OpKind::Put(value) => {
                WriteOp { key, value: Some(history::encode_value(*value)), expiry: Default::default() }
            }
            OpKind::PutExpiring { value, expired } => WriteOp {
                key,
                value: Some(history::encode_value(*value)),
                expiry: Expiry::At(if *expired { 1 } else { u64::MAX / 2 }),
            },
            _ => WriteOp::delete(key),
        }];
        let (serial, id, request) = (open.serial, c.id, open.request);
        // Where a write is done on fewer than every voter (R = 5), a client's request to one of
        // them is lost now and then (a broken connection), so writes are done without some voter,
        // which may lead next: its recovery must gather them from the others
        // (`Bug::FastRecoversWithoutGather`). At R = 3 a loss would only send the write to the
        // Raft path.
        let lost = (onekv_placement::quorum::fast_needs_gather(replicas.len())
            && self.rng.random_ratio(1, 4))
        .then(|| replicas[self.rng.random_range(0..replicas.len())]);
        let mut sent = 0;
        for node in replicas {
            if Some(node) == lost {
                continue;
            }
            let Some(replica) =
                self.nodes[(node - 1) as usize].up.as_ref().and_then(|up| up.node.replica(shard))
            else {
                continue;
            };
            sent += 1;
            let completions = self.completions.clone();
            replica.fast_write(
                request,
                ops.clone(),
                Box::new(move |result| {
                    completions.lock().unwrap_or_else(|e| e.into_inner()).push(Completion {
                        client: id,
                        serial,
                        node,
                        shard,
                        answer: Answer::Fast(result),
                    })
                }),
            );
        }
        let open = self.clients[client].open.as_mut().expect("open");
        open.fast = Some((BTreeMap::new(), sent));
    }

    /// Takes one answer to the open operation's fast write: `Some(true)` once the write is done,
    /// `Some(false)` once every replica answered and it is not (the Raft path next), `None` while
    /// answers are missing.
    fn take_fast_answer(
        &mut self,
        client: usize,
        node: u64,
        answer: Result<onekv_replica::FastAck, ReplicaError>,
    ) -> Option<bool> {
        let majority_bug = self.config.bug == Some(Bug::FastCountsMajority);
        let open = self.clients[client].open.as_mut()?;
        let (answers, sent) = open.fast.as_mut()?;
        answers.insert(node, answer);
        let acks: BTreeMap<u64, onekv_replica::FastAck> =
            answers.iter().filter_map(|(node, answer)| answer.clone().ok().map(|ack| (*node, ack))).collect();
        let done = if majority_bug {
            acks.values().any(|ack| matches!(ack, onekv_replica::FastAck::Applied { .. }))
                || acks.iter().find_map(|(_, ack)| match ack {
                    onekv_replica::FastAck::Durable { term, leader: true, voters } => Some((*term, voters.clone())),
                    _ => None,
                })
                .is_some_and(|(term, voters)| {
                    let same = acks
                        .values()
                        .filter(|ack| matches!(ack, onekv_replica::FastAck::Durable { term: t, .. } if *t == term))
                        .count();
                    same * 2 > voters.len()
                })
        } else {
            onekv_replica::FastAck::completes(&acks)
        };
        if done {
            return Some(true);
        }
        (answers.len() >= *sent).then_some(false)
    }

    fn give_up(&mut self, client: usize) {
        let open = self.clients[client].open.take().expect("open");
        let op = &self.history[open.op];
        if !(op.kind.is_write() && open.maybe_applied) {
            self.discarded[open.op] = true;
        }
        self.clients[client].next_start = self.now + self.rng.random_range(0..20);
    }

    fn handle_completions(&mut self) {
        let completions = std::mem::take(&mut *self.completions.lock().unwrap_or_else(|e| e.into_inner()));
        for completion in completions {
            let client = completion.client as usize;
            let Some(open) = self.clients[client].open.as_ref() else { continue };
            if open.serial != completion.serial {
                continue; // a late answer to an operation already closed
            }
            let op_index = open.op;
            let key = self.history[op_index].key;
            if let Answer::Fast(answer) = completion.answer {
                match self.take_fast_answer(client, completion.node, answer) {
                    None => continue,
                    Some(true) => {
                        *self.faults.entry("fast-writes-done").or_default() += 1;
                        self.complete(client, op_index, key, OpResult::Written);
                    }
                    Some(false) => {
                        // Not done by the fast path: the same request id through the Raft path.
                        let open = self.clients[client].open.as_mut().expect("open");
                        open.fast = None;
                        open.attempt_deadline = None;
                        open.retry_at = self.now;
                    }
                }
                continue;
            }
            let result = match completion.answer {
                Answer::Write(Ok(outcome)) => match (&self.history[op_index].kind, outcome.cas) {
                    (OpKind::Cas { .. }, Some(cas)) => {
                        let current = cas.current.as_deref().map(history::decode_value);
                        if current.is_some_and(|v| v.is_none()) {
                            self.violations
                                .push(format!("a compare-and-swap on key {key} returned a corrupt value"));
                        }
                        Ok(OpResult::Cas { swapped: cas.swapped, current: current.flatten() })
                    }
                    (OpKind::Cas { .. }, None) => {
                        self.violations.push(format!("a compare-and-swap on key {key} returned no outcome"));
                        Err(false)
                    }
                    _ => Ok(OpResult::Written),
                },
                Answer::Barrier(Ok(())) => {
                    let up =
                        self.nodes[(completion.node - 1) as usize].up.as_ref().expect("it just answered");
                    let replica = up.node.replica(completion.shard).expect("it just answered");
                    match replica.get(&history::encode_key(key)) {
                        Ok(None) => Ok(OpResult::Get(None)),
                        Ok(Some(bytes)) => match history::decode_value(&bytes) {
                            Some(value) => Ok(OpResult::Get(Some(value))),
                            None => {
                                self.violations.push(format!(
                                    "node {} returned a corrupt value ({} bytes) for key {key}",
                                    completion.node,
                                    bytes.len()
                                ));
                                Err(false)
                            }
                        },
                        Err(_) => Err(false),
                    }
                }
                // Its one evaluation took no effect, and no retry will take any: it happened like
                // a read whose answer was lost.
                Answer::Write(Err(ReplicaError::AlreadyEvaluated { .. })) => {
                    self.discarded[op_index] = true;
                    let c = &mut self.clients[client];
                    c.open = None;
                    c.next_start = self.now + self.rng.random_range(0..20);
                    continue;
                }
                Answer::Write(Err(ReplicaError::NotLeader { leader }))
                | Answer::Barrier(Err(ReplicaError::NotLeader { leader })) => {
                    if let Some(leader) = leader {
                        self.clients[client].target = leader;
                    } else {
                        self.clients[client].target = self.rng.random_range(1..=self.config.nodes);
                    }
                    Err(false)
                }
                Answer::Write(Err(_)) | Answer::Barrier(Err(_)) => {
                    self.clients[client].target = self.rng.random_range(1..=self.config.nodes);
                    Err(true)
                }
                Answer::Fast(_) => unreachable!("taken above"),
            };
            match result {
                Ok(result) => self.complete(client, op_index, key, result),
                Err(maybe_applied) => {
                    let backoff = self.rng.random_range(5..30);
                    let open = self.clients[client].open.as_mut().expect("open");
                    open.maybe_applied |= maybe_applied;
                    open.attempt_deadline = None;
                    open.retry_at = self.now + backoff;
                }
            }
        }
    }

    /// Closes client `client`'s open operation with `result`.
    fn complete(&mut self, client: usize, op_index: usize, key: u32, result: OpResult) {
        let ret = self.next_event();
        let op = &mut self.history[op_index];
        op.ret = Some(ret);
        let seen = match &result {
            OpResult::Get(value) => Some(*value),
            OpResult::Cas { current, .. } => Some(*current),
            OpResult::Written => op.kind.blind_result(),
        };
        op.result = Some(result);
        let c = &mut self.clients[client];
        if let Some(seen) = seen {
            c.last_seen.insert(key, seen);
        }
        c.open = None;
        c.next_start = self.now + self.rng.random_range(0..20);
    }

    // ----- the verdict -----

    fn finish(mut self) -> Report {
        // Operations still open at the end are unanswered.
        for client in 0..self.clients.len() {
            if let Some(open) = self.clients[client].open.take() {
                let op = &self.history[open.op];
                if !(op.kind.is_write() && (open.maybe_applied || open.attempt_deadline.is_some())) {
                    self.discarded[open.op] = true;
                }
            }
        }
        let mut history: Vec<Op> = self
            .history
            .iter()
            .zip(&self.discarded)
            .filter(|(_, discarded)| !**discarded)
            .map(|(op, _)| op.clone())
            .collect();
        // A range deletion deletes, at its one point, every key of its range in its shard: a copy
        // per further key, so the per-key checks see each of those deletes.
        let map = &self.map;
        let shard_of = |key: u32| map.shard_of_key(&history::encode_key(key));
        let copies: Vec<Op> = history
            .iter()
            .filter_map(|op| match op.kind {
                OpKind::DeleteRange { to } => Some((op, to)),
                _ => None,
            })
            .flat_map(|(op, to)| {
                (op.key + 1..=to)
                    .filter(move |&key| shard_of(key) == shard_of(op.key))
                    .map(move |key| Op { key, ..op.clone() })
            })
            .collect();
        history.extend(copies);
        let answers = std::mem::take(&mut *self.member_answers.lock().unwrap_or_else(|e| e.into_inner()));
        for applied in answers {
            self.count(if applied { "member-change-applied" } else { "member-change-refused" });
        }
        let mut violations = std::mem::take(&mut self.violations);
        violations.extend(checker::check_history(&history, self.config.search_budget));
        if !self.finals.is_empty() {
            let map = &self.map;
            let shard_of = |key: u32| map.shard_of_key(&history::encode_key(key));
            violations.extend(checker::check_no_lost_writes(&history, &self.finals, &shard_of));
            violations.extend(checker::check_converged(&self.finals));
        }
        // Segments the nodes' log GC deleted since their last restart (those before were counted
        // when they crashed).
        for up in self.nodes.iter().filter_map(|node| node.up.as_ref()) {
            count_gc(&mut self.faults, &up.node);
        }
        let mut hasher = DefaultHasher::new();
        history.hash(&mut hasher);
        self.finals.hash(&mut hasher);
        self.faults.hash(&mut hasher);
        (self.network.sent, self.network.lost, self.network.duplicated).hash(&mut hasher);
        self.now.hash(&mut hasher);
        for node in &self.nodes {
            if let Some(up) = &node.up {
                for status in up.node.statuses() {
                    status.applied_index.hash(&mut hasher);
                }
            }
        }
        Report {
            seed: self.seed,
            ops: history.len(),
            acknowledged: history.iter().filter(|op| op.acknowledged()).count(),
            unknown: history.iter().filter(|op| !op.acknowledged()).count(),
            faults: self.faults.clone(),
            messages: (self.network.sent, self.network.lost, self.network.duplicated),
            snapshots: self.network.snapshots,
            recoveries: self.recoveries,
            violations,
            digest: hasher.finish(),
            simulated_ms: self.now,
            applied_index: self.final_applied,
            history,
        }
    }
}

/// Adds what `node`'s log GC did since it started (segments deleted, values moved, values moved
/// into compressed blocks) and what its deduplication did to `faults`.
fn count_gc(faults: &mut BTreeMap<&'static str, u64>, node: &onekv_replica::Node) {
    let statuses = node.statuses();
    let lease_reads: u64 = statuses.iter().map(|status| status.reads_by_lease).sum();
    if lease_reads > 0 {
        *faults.entry("reads-by-lease").or_default() += lease_reads;
    }
    let Some(status) = statuses.first().cloned() else { return };
    let (gc, dedup) = (status.gc, status.dedup);
    *faults.entry("gc-segments-reclaimed").or_default() += gc.segments_reclaimed;
    *faults.entry("gc-values-relocated").or_default() += gc.values_relocated;
    *faults.entry("gc-values-packed").or_default() += gc.values_packed;
    if !dedup.mode.is_empty() {
        *faults.entry("dedup-inline-hits").or_default() += dedup.inline_hits;
        *faults.entry("dedup-offline-hits").or_default() += dedup.offline_hits;
        *faults.entry("dedup-snapshot-hits").or_default() += dedup.snapshot_hits;
        *faults.entry("dedup-mismatches").or_default() += dedup.mismatches;
        *faults.entry("dedup-references").or_default() += dedup.references_applied;
        *faults.entry("dedup-late-references").or_default() += dedup.late_references;
    }
}
