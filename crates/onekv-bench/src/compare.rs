//! `onekv bench compare`: the same workload against fresh local clusters in several
//! configurations (onekv's storage modes, and etcd as a peer), alternating their order round by
//! round because these machines are noisy, with every figure side by side and the ratios against
//! the first.
//!
//! Owns: the round/contender schedule, one fresh cluster per run (stopped before the next starts,
//! also on error), and the comparison table. Does not own the runs themselves (`runner`), the
//! figures (`amplification`) or the processes (`local_cluster`, `local_etcd`).

use onekv_server::config::DedupModeName;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use onekv_client::ClientOptions;
use onekv_server::config::StorageMode;
use serde::{Deserialize, Serialize};

use crate::amplification::{self, NodeAmplification, NodeProbe};
use crate::cpu::CpuProbe;
use crate::local_cluster::{ClusterError, LocalCluster};
use crate::local_etcd::LocalEtcd;
use crate::runner::{RunConfig, RunError, RunReport, live_bytes, run_phases};
use crate::target::OnekvTarget;

/// One system in a comparison: onekv in a storage mode with a number of shards, or etcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contender {
    /// A onekv cluster in this storage mode, its keys split into `shards` shards (leaders spread
    /// over the nodes).
    Onekv {
        /// The storage mode.
        mode: StorageMode,
        /// Shards of the cluster.
        shards: u32,
        /// How the nodes run their log garbage collector.
        gc: GcVariant,
        /// How the nodes shape their index trees.
        index: IndexVariant,
        /// How the nodes deduplicate values (`dedup.mode`).
        dedup: DedupModeName,
        /// Whether leaders deduplicating inline put values by reference (`dedup.references`;
        /// `:norefs` turns it off).
        references: bool,
        /// Whether the nodes have the fast path on (`cluster.fast_path`) and the client writes
        /// through it (`Client::put_fast`).
        fast: bool,
        /// Whether the nodes run the baseline executable ([`CompareConfig::baseline_exe`],
        /// `@base`) instead of this one: one build against another in the same run.
        baseline: bool,
    },
    /// An etcd cluster with its default (fsync per commit) durability.
    Etcd,
}

/// The contender name's suffix for a dedup mode (none for off, the default).
fn dedup_suffix(mode: DedupModeName) -> Option<String> {
    (mode != DedupModeName::Off).then(|| format!("dedup-{}", mode.name()))
}

/// The dedup mode a contender name's suffix names.
fn parse_dedup_suffix(suffix: &str) -> Option<DedupModeName> {
    DedupModeName::parse(suffix.strip_prefix("dedup-")?).filter(|mode| *mode != DedupModeName::Off)
}

/// How a onekv contender's nodes run their log garbage collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcVariant {
    /// As configured by default (on, small values compressed when moved).
    On,
    /// Off (`:nogc`): the log grows with every write.
    Off,
    /// On, but moving every value as it is (`:nocompress`, `gc.compress_below_bytes = 0`).
    Uncompressed,
}

impl GcVariant {
    /// The contender name's suffix for this variant (none for the default).
    fn suffix(self) -> Option<&'static str> {
        match self {
            GcVariant::On => None,
            GcVariant::Off => Some("nogc"),
            GcVariant::Uncompressed => Some("nocompress"),
        }
    }
}

/// How a onekv contender's nodes shape their shards' index trees (`index.layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexVariant {
    /// As configured by default (decoupled, the default `S`).
    Default,
    /// `:uniform`: every tree leveled.
    Uniform,
    /// `:sN`: decoupled, followed shards' trees with at most N sorted runs (sharing the followers'
    /// memtable budget, as by default).
    Runs(u8),
    /// `:sNown`: as `:sN`, but each followed shard's tree flushes at `memtable_bytes` on its own
    /// (`index.follower_memtable_bytes = 0`).
    RunsOwnMemtables(u8),
}

impl IndexVariant {
    /// The contender name's suffix for this variant (none for the default).
    fn suffix(self) -> Option<String> {
        match self {
            IndexVariant::Default => None,
            IndexVariant::Uniform => Some("uniform".into()),
            IndexVariant::Runs(runs) => Some(format!("s{runs}")),
            IndexVariant::RunsOwnMemtables(runs) => Some(format!("s{runs}own")),
        }
    }

    fn parse(suffix: &str) -> Option<IndexVariant> {
        if suffix == "uniform" {
            return Some(IndexVariant::Uniform);
        }
        let runs = suffix.strip_prefix('s')?;
        let (runs, own) = match runs.strip_suffix("own") {
            Some(runs) => (runs, true),
            None => (runs, false),
        };
        let runs: u8 = runs.parse().ok()?;
        let (low, high) = onekv_server::config::bounds::FOLLOWER_RUNS;
        if !(low..=high).contains(&u64::from(runs)) {
            return None;
        }
        Some(if own { IndexVariant::RunsOwnMemtables(runs) } else { IndexVariant::Runs(runs) })
    }

    /// The `[index]` section of a node's configuration for this variant, with `memtable_bytes`
    /// when given (and then a followers' budget of the same multiple of it as the defaults').
    pub fn config(self, memtable_bytes: Option<u64>) -> onekv_server::config::IndexConfig {
        use onekv_server::config::{IndexConfig, IndexLayoutName};
        let mut config = IndexConfig::default();
        if let Some(bytes) = memtable_bytes {
            let defaults = IndexConfig::default();
            config.memtable_bytes = bytes;
            config.follower_memtable_bytes =
                bytes.saturating_mul(defaults.follower_memtable_bytes / defaults.memtable_bytes);
        }
        match self {
            IndexVariant::Default => {}
            IndexVariant::Uniform => config.layout = IndexLayoutName::Uniform,
            IndexVariant::Runs(follower_runs) => {
                config.layout = IndexLayoutName::Decoupled;
                config.follower_runs = follower_runs;
            }
            IndexVariant::RunsOwnMemtables(follower_runs) => {
                config.layout = IndexLayoutName::Decoupled;
                config.follower_runs = follower_runs;
                config.follower_memtable_bytes = 0;
            }
        }
        config
    }
}

impl Contender {
    /// `etcd`, or the storage mode's name, then `:SHARDS` unless the default shard count, then
    /// `:uniform` or `:sN` for an index layout other than the default, then `:dedup-MODE` when the
    /// nodes deduplicate values (`inline`, `offline`, `elastic`), then `:fast` when writes take the
    /// fast path, then `:nogc` when the log
    /// garbage collector is off or `:nocompress` when it compresses nothing, then `@base` when it
    /// runs the baseline executable.
    pub fn name(self) -> String {
        match self {
            Contender::Onekv { mode, shards, gc, index, dedup, references, fast, baseline } => {
                let mut name = mode.name().to_string();
                if shards != onekv_placement::DEFAULT_SHARDS {
                    name.push_str(&format!(":{shards}"));
                }
                let fast = fast.then(|| FAST_SUFFIX.to_string());
                let no_references =
                    (!references && dedup != DedupModeName::Off).then(|| NO_REFERENCES_SUFFIX.to_string());
                for suffix in [index.suffix(), dedup_suffix(dedup), no_references, fast].into_iter().flatten()
                {
                    name.push(':');
                    name.push_str(&suffix);
                }
                if let Some(suffix) = gc.suffix() {
                    name.push(':');
                    name.push_str(suffix);
                }
                if baseline {
                    name.push_str(BASELINE_SUFFIX);
                }
                name
            }
            Contender::Etcd => "etcd".into(),
        }
    }

    /// Parses a name as [`Contender::name`] spells it: `etcd`, `onelog` (16 shards), `onelog:1`,
    /// `onelog:nogc`, `onelog:1:nogc`, `onelog:nocompress`, `onelog:uniform`, `onelog:3:s4:nogc`,
    /// `onelog:dedup-inline`, `onelog:1:fast`, `onelog@base`.
    pub fn parse(name: &str) -> Option<Contender> {
        if name == "etcd" {
            return Some(Contender::Etcd);
        }
        let (name, baseline) = match name.strip_suffix(BASELINE_SUFFIX) {
            Some(name) => (name, true),
            None => (name, false),
        };
        let mut parts = name.split(':');
        let mode = StorageMode::parse(parts.next()?)?;
        let mut shards = onekv_placement::DEFAULT_SHARDS;
        let mut gc = GcVariant::On;
        let mut rest: Vec<&str> = parts.collect();
        for variant in [GcVariant::Off, GcVariant::Uncompressed] {
            if rest.last().copied() == variant.suffix() {
                gc = variant;
                rest.pop();
                break;
            }
        }
        let fast = rest.last() == Some(&FAST_SUFFIX);
        if fast {
            rest.pop();
        }
        let references = rest.last() != Some(&NO_REFERENCES_SUFFIX);
        if !references {
            rest.pop();
        }
        let mut dedup = DedupModeName::Off;
        if let Some(parsed) = rest.last().and_then(|suffix| parse_dedup_suffix(suffix)) {
            dedup = parsed;
            rest.pop();
        } else if !references {
            return None;
        }
        let mut index = IndexVariant::Default;
        if let Some(variant) = rest.last().and_then(|suffix| IndexVariant::parse(suffix)) {
            index = variant;
            rest.pop();
        }
        match rest[..] {
            [] => {}
            [count] => shards = count.parse().ok()?,
            _ => return None,
        }
        if !(1..=onekv_placement::MAX_SHARDS).contains(&shards) {
            return None;
        }
        Some(Contender::Onekv { mode, shards, gc, index, dedup, references, fast, baseline })
    }
}

/// The contender name's suffix for a cluster with the fast path on, written through it.
const FAST_SUFFIX: &str = "fast";

/// The contender name's suffix (after `:dedup-MODE`) for leaders that put no value by reference.
const NO_REFERENCES_SUFFIX: &str = "norefs";

/// The contender name's suffix for one run with the baseline executable.
const BASELINE_SUFFIX: &str = "@base";

/// What to compare.
#[derive(Debug, Clone)]
pub struct CompareConfig {
    /// The `onekv` executable the nodes run.
    pub exe: PathBuf,
    /// The `onekv` executable of contenders named `...@base` (another build, to compare against
    /// this one in the same run).
    pub baseline_exe: Option<PathBuf>,
    /// The `etcd` executable, used when `modes` names etcd.
    pub etcd_exe: PathBuf,
    /// Storage modes (or etcd), the first being the baseline of the ratios.
    pub modes: Vec<Contender>,
    /// Rounds; odd rounds run the modes in reverse order.
    pub rounds: u32,
    /// Nodes per cluster.
    pub nodes: u64,
    /// Replicas of each shard (`cluster.replicas`; `None`: the server's default, 3).
    pub replicas: Option<u32>,
    /// The workload and its bounds; a workload other than Load runs after a Load phase.
    pub run: RunConfig,
    /// Where the clusters' directories go (the system's temporary directory if `None`).
    pub dir: Option<PathBuf>,
    /// How long a fresh cluster may take to elect a leader.
    pub leader_timeout: Duration,
    /// Sample every node's data-directory size this often during each run (`None`: never).
    pub sample_disk: Option<Duration>,
    /// `index.memtable_bytes` of every onekv node (`None`: the default).
    pub index_memtable_bytes: Option<u64>,
    /// How long each onekv cluster stays idle after its last phase before its disk use and
    /// amplification are taken (the log GC catches up meanwhile; its writes count).
    pub settle: Duration,
    /// One-way delay added to every link of a onekv cluster, node to node and client to node
    /// ([`crate::delay`]; `None`: none). etcd contenders run without it.
    pub link_delay: Option<Duration>,
    /// A onekv node to kill once the Load phase is done (`None`: none): the other phase runs with
    /// one replica of each of its shards down, once every shard has a leader again.
    pub down_after_load: Option<u64>,
}

/// Why a comparison stopped.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// A cluster could not be started.
    #[error("{mode}, round {round}: {source}")]
    Cluster {
        /// The mode being run.
        mode: String,
        /// The round.
        round: u32,
        /// The cause.
        source: ClusterError,
    },
    /// A run could not start.
    #[error(transparent)]
    Run(#[from] RunError),
}

/// One run: one mode in one round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareRun {
    /// The storage mode.
    pub mode: String,
    /// The round (from 0).
    pub round: u32,
    /// The phases, Load first.
    pub phases: Vec<RunReport>,
    /// Every node's amplification over the phases.
    pub nodes: Vec<NodeAmplification>,
    /// Data-directory sizes over the run, when sampled ([`CompareConfig::sample_disk`]).
    #[serde(default)]
    pub disk_samples: Vec<DiskSample>,
    /// What the nodes' log garbage collectors did, summed over the nodes (onekv only).
    #[serde(default)]
    pub gc: Option<GcTotals>,
    /// Bytes written to the block device holding the cluster's directories over the same window
    /// as the nodes' amplification, by every process ([`amplification::device_write_bytes`]).
    #[serde(default)]
    pub device_write_bytes: Option<u64>,
    /// With the fast path: writes done fast, and writes that fell back to the Raft path.
    #[serde(default)]
    pub fast_writes: Option<(u64, u64)>,
}

/// The log garbage collectors' counters at the end of a run, summed over the nodes that answered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GcTotals {
    /// Nodes whose status was read.
    pub nodes: u64,
    /// Live values moved to the log's head.
    pub values_relocated: u64,
    /// Bytes of those values (as stored, before any compression).
    pub bytes_relocated: u64,
    /// Values moved into compressed blocks.
    pub values_packed: u64,
    /// Bytes of the pairs put into compressed blocks, before compression.
    pub packed_raw_bytes: u64,
    /// Bytes those blocks took in the log.
    pub packed_bytes: u64,
    /// Segment files deleted.
    pub segments_reclaimed: u64,
    /// Bytes of the segment files deleted.
    pub bytes_reclaimed: u64,
    /// Values pointed at an existing identical copy as they applied.
    #[serde(default)]
    pub dedup_inline_hits: u64,
    /// Values the collector pointed at an existing identical copy instead of moving them.
    #[serde(default)]
    pub dedup_offline_hits: u64,
    /// Value bytes deduplication did not store or move again.
    #[serde(default)]
    pub dedup_bytes_saved: u64,
    /// Puts applied by reference to another key's value, over all replicas.
    #[serde(default)]
    pub dedup_references: u64,
    /// Bytes of Raft messages the nodes delivered to each other.
    #[serde(default)]
    pub peer_bytes_sent: u64,
    /// The collectors' last estimates of the live bytes in their logs.
    #[serde(default)]
    pub live_bytes: u64,
    /// The logs' bytes at the collectors' last rounds.
    #[serde(default)]
    pub log_bytes: u64,
}

/// Sums the log GC counters of every node `client` reaches.
async fn gc_totals(client: &onekv_client::Client) -> GcTotals {
    let mut totals = GcTotals::default();
    for (_, status) in client.status_all().await {
        let Ok(status) = status else { continue };
        totals.peer_bytes_sent += status.peer_bytes_sent;
        if let Some(dedup) = &status.dedup {
            totals.dedup_inline_hits += dedup.inline_hits;
            totals.dedup_offline_hits += dedup.offline_hits;
            totals.dedup_bytes_saved += dedup.bytes_saved;
            totals.dedup_references += dedup.references_applied;
        }
        let Some(gc) = status.gc else { continue };
        totals.nodes += 1;
        totals.values_relocated += gc.values_relocated;
        totals.bytes_relocated += gc.bytes_relocated;
        totals.values_packed += gc.values_packed;
        totals.packed_raw_bytes += gc.packed_raw_bytes;
        totals.packed_bytes += gc.packed_bytes;
        totals.segments_reclaimed += gc.segments_reclaimed;
        totals.bytes_reclaimed += gc.bytes_reclaimed;
        totals.live_bytes += gc.live_bytes;
        totals.log_bytes += gc.log_bytes;
    }
    totals
}

/// One node's data-directory size at one moment of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiskSample {
    /// Milliseconds since the run's first phase started.
    pub elapsed_ms: u64,
    /// The node (1..=nodes).
    pub node_id: u64,
    /// Bytes under its data directory.
    pub disk_bytes: u64,
}

/// All runs of a comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareReport {
    /// The modes in baseline-first order.
    pub modes: Vec<String>,
    /// Every run, in the order they ran.
    pub runs: Vec<CompareRun>,
}

/// The order of the modes in `round`: as given in even rounds, reversed in odd ones.
pub fn schedule<T: Clone>(modes: &[T], round: u32) -> Vec<T> {
    let mut order = modes.to_vec();
    if round % 2 == 1 {
        order.reverse();
    }
    order
}

/// Runs the comparison; `on_run` sees each run as it finishes (e.g. to print it).
pub async fn compare(
    config: &CompareConfig,
    mut on_run: impl FnMut(&CompareRun),
) -> Result<CompareReport, CompareError> {
    let mut runs = Vec::new();
    for round in 0..config.rounds {
        for mode in schedule(&config.modes, round) {
            let run = run_one(config, mode, round).await?;
            on_run(&run);
            runs.push(run);
        }
    }
    Ok(CompareReport { modes: config.modes.iter().map(|mode| mode.name()).collect(), runs })
}

async fn run_one(config: &CompareConfig, mode: Contender, round: u32) -> Result<CompareRun, CompareError> {
    match mode {
        Contender::Onekv { .. } => run_onekv(config, mode, round).await,
        Contender::Etcd => run_etcd(config, round).await,
    }
}

async fn run_onekv(
    config: &CompareConfig,
    contender: Contender,
    round: u32,
) -> Result<CompareRun, CompareError> {
    let Contender::Onekv { mode, shards, gc, index, dedup, references, fast, baseline } = contender else {
        unreachable!("run_onekv runs onekv contenders only")
    };
    let name = contender.name();
    let cluster_error = |source| CompareError::Cluster { mode: name.clone(), round, source };
    let exe = match (baseline, &config.baseline_exe) {
        (false, _) => &config.exe,
        (true, Some(exe)) => exe,
        (true, None) => {
            return Err(cluster_error(ClusterError::Config(
                "a contender named ...@base needs a baseline executable (--baseline-exe)".into(),
            )));
        }
    };
    // Dropped (nodes stopped, directory removed) on every path out of this function.
    let mut cluster = LocalCluster::start(
        exe,
        config.dir.as_deref(),
        config.nodes,
        mode,
        shards,
        gc,
        (
            index.config(config.index_memtable_bytes),
            onekv_server::config::DedupConfig { mode: dedup, references, ..Default::default() },
            fast,
            config.replicas,
        ),
        config.link_delay,
    )
    .map_err(cluster_error)?;
    cluster.wait_for_leader(config.leader_timeout).await.map_err(cluster_error)?;
    let client = cluster.client(ClientOptions::default());
    let probes = cluster.probes();
    let before = amplification::snapshot(&client, &probes).await;
    let target = Arc::new(OnekvTarget::new(client.clone()).with_fast_path(fast));
    let samples = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sampler =
        config.sample_disk.map(|every| tokio::spawn(sample_disk(probes.clone(), every, samples.clone())));
    let device_before = device_write_bytes(&probes);
    let cpu = CpuProbe { server_pids: probes.iter().filter_map(|probe| probe.pid).collect() };
    let phases = match config.down_after_load {
        None => run_phases(target.clone(), &config.run, true, &cpu).await,
        Some(node) => {
            let load = RunConfig { workload: crate::workload::WorkloadKind::Load, ..config.run.clone() };
            let mut phases = run_phases(target.clone(), &load, false, &cpu).await?;
            cluster.kill(node);
            cluster.wait_for_leader(config.leader_timeout).await.map_err(cluster_error)?;
            if config.run.workload != crate::workload::WorkloadKind::Load {
                phases.extend(run_phases(target.clone(), &config.run, false, &cpu).await?);
            }
            Ok(phases)
        }
    };
    if let Some(sampler) = sampler {
        sampler.abort();
    }
    let disk_samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|e| e.into_inner()));
    let phases = phases?;
    tokio::time::sleep(config.settle).await;
    let after = amplification::snapshot(&client, &probes).await;
    let device_written = written_since(device_before, device_write_bytes(&probes));
    let nodes = amplification::amplification(&before, &after, live_bytes(config.run.records, &phases));
    let gc = Some(gc_totals(&client).await);
    cluster.stop();
    let fast_writes = fast.then(|| target.fast_writes());
    Ok(CompareRun {
        mode: name,
        round,
        phases,
        nodes,
        disk_samples,
        gc,
        device_write_bytes: device_written,
        fast_writes,
    })
}

async fn run_etcd(config: &CompareConfig, round: u32) -> Result<CompareRun, CompareError> {
    let cluster_error = |source| CompareError::Cluster { mode: "etcd".into(), round, source };
    // Dropped (members stopped, directory removed) on every path out of this function.
    let mut cluster =
        LocalEtcd::start(&config.etcd_exe, config.dir.as_deref(), config.nodes).map_err(cluster_error)?;
    cluster.wait_ready(config.leader_timeout).await.map_err(cluster_error)?;
    let probes = cluster.probes();
    let before = process_snapshots(&probes);
    let device_before = device_write_bytes(&probes);
    let target = Arc::new(cluster.target());
    let cpu = CpuProbe { server_pids: probes.iter().filter_map(|probe| probe.pid).collect() };
    let phases = run_phases(target, &config.run, true, &cpu).await?;
    let after = process_snapshots(&probes);
    let device_written = written_since(device_before, device_write_bytes(&probes));
    // etcd reports no applied-bytes counter: every member applies every acknowledged write, so
    // the user bytes are what the harness wrote.
    let user_bytes = phases.iter().map(|phase| phase.payload_bytes_written).sum();
    let nodes = etcd_amplification(&before, &after, user_bytes, live_bytes(config.run.records, &phases));
    cluster.stop();
    Ok(CompareRun {
        mode: "etcd".into(),
        round,
        phases,
        nodes,
        disk_samples: Vec::new(),
        gc: None,
        device_write_bytes: device_written,
        fast_writes: None,
    })
}

/// Bytes written so far to the device holding the first node's directory (every node's is on it
/// in the local clusters), if it can be read.
fn device_write_bytes(probes: &[NodeProbe]) -> Option<u64> {
    let dir = probes.iter().find_map(|probe| probe.data_dir.as_deref())?;
    amplification::device_write_bytes(dir).ok()
}

fn written_since(before: Option<u64>, after: Option<u64>) -> Option<u64> {
    Some(after?.saturating_sub(before?))
}

/// Adds every node's data-directory size to `samples` every `every`, until aborted.
async fn sample_disk(
    probes: Vec<NodeProbe>,
    every: Duration,
    samples: Arc<std::sync::Mutex<Vec<DiskSample>>>,
) {
    let started = std::time::Instant::now();
    let mut ticks = tokio::time::interval(every);
    loop {
        ticks.tick().await;
        let elapsed_ms = started.elapsed().as_millis() as u64;
        for (index, probe) in probes.iter().enumerate() {
            let Some(dir) = probe.data_dir.as_deref() else { continue };
            if let Ok(disk_bytes) = amplification::disk_usage(dir) {
                let sample = DiskSample { elapsed_ms, node_id: index as u64 + 1, disk_bytes };
                samples.lock().unwrap_or_else(|e| e.into_inner()).push(sample);
            }
        }
    }
}

/// What the kernel and the file system say about processes the harness started, without asking
/// them: `(endpoint, write_bytes, disk bytes)`.
fn process_snapshots(probes: &[NodeProbe]) -> Vec<(String, Option<u64>, Option<u64>)> {
    probes
        .iter()
        .map(|probe| {
            let written = probe.pid.and_then(|pid| amplification::proc_write_bytes(pid).ok());
            let disk = probe.data_dir.as_deref().and_then(|dir| amplification::disk_usage(dir).ok());
            (probe.endpoint.clone(), written, disk)
        })
        .collect()
}

/// Amplification of processes known only from outside (etcd): kernel WA and disk ÷ live; no
/// engine figures (`None`, shown as "-").
fn etcd_amplification(
    before: &[(String, Option<u64>, Option<u64>)],
    after: &[(String, Option<u64>, Option<u64>)],
    user_bytes: u64,
    live_bytes: u64,
) -> Vec<NodeAmplification> {
    let ratio =
        |numerator: u64, denominator: u64| (denominator > 0).then(|| numerator as f64 / denominator as f64);
    after
        .iter()
        .enumerate()
        .map(|(index, (endpoint, written, disk))| {
            let start =
                before.iter().find(|(start, _, _)| start == endpoint).and_then(|(_, written, _)| *written);
            let kernel_write_bytes = match (start, written) {
                (Some(start), Some(end)) => Some(end.saturating_sub(start)),
                _ => None,
            };
            NodeAmplification {
                endpoint: endpoint.clone(),
                node_id: index as u64 + 1,
                role: String::new(),
                storage_mode: "etcd".into(),
                user_bytes,
                engine_bytes_written: 0,
                engine_wa: None,
                kernel_write_bytes,
                kernel_wa: kernel_write_bytes.and_then(|bytes| ratio(bytes, user_bytes)),
                log_bytes: 0,
                disk_bytes: *disk,
                live_bytes,
                space_amplification: disk.and_then(|bytes| ratio(bytes, live_bytes)),
                log_space_amplification: None,
                index_compaction_bytes: None,
                error: None,
            }
        })
        .collect()
}

/// The figures of one run, by name, in table order.
pub fn figures(run: &CompareRun) -> Vec<(String, f64)> {
    let mut figures = Vec::new();
    for phase in &run.phases {
        let name = phase.workload;
        figures.push((format!("{name}: ops/s"), phase.throughput_ops_per_sec));
        figures.push((format!("{name}: errors"), phase.errors as f64));
        figures
            .push((format!("{name}: servers' CPU µs/op"), phase.server_cpu_us_per_op().unwrap_or(f64::NAN)));
        figures.push((format!("{name}: client CPU µs/op"), phase.client_cpu_us_per_op().unwrap_or(f64::NAN)));
        for op in &phase.ops {
            figures.push((format!("{name}: {} p50 µs", op.op), op.p50_us as f64));
            figures.push((format!("{name}: {} p99 µs", op.op), op.p99_us as f64));
            figures.push((format!("{name}: {} p99.9 µs", op.op), op.p999_us as f64));
        }
    }
    for node in &run.nodes {
        // Node ids are stable across runs (1..=n); roles are not, so they are not in the name.
        let id = node.node_id;
        figures.push((format!("node {id}: engine WA"), node.engine_wa.unwrap_or(f64::NAN)));
        figures.push((format!("node {id}: kernel WA"), node.kernel_wa.unwrap_or(f64::NAN)));
        figures.push((format!("node {id}: disk ÷ live"), node.space_amplification.unwrap_or(f64::NAN)));
    }
    let mean = |values: Vec<f64>| {
        let values: Vec<f64> = values.into_iter().filter(|value| value.is_finite()).collect();
        if values.is_empty() { f64::NAN } else { values.iter().sum::<f64>() / values.len() as f64 }
    };
    figures.push((
        "mean engine WA".into(),
        mean(run.nodes.iter().map(|n| n.engine_wa.unwrap_or(f64::NAN)).collect()),
    ));
    figures.push((
        "mean kernel WA".into(),
        mean(run.nodes.iter().map(|n| n.kernel_wa.unwrap_or(f64::NAN)).collect()),
    ));
    // What reached the disk, over what every node applied (etcd: each member applies all): the
    // figure `write_bytes` overstates where the kernel dirties whole large folios.
    let user_bytes: u64 = run.nodes.iter().map(|n| n.user_bytes).sum();
    figures.push((
        "device WA (whole disk)".into(),
        match run.device_write_bytes {
            Some(written) if user_bytes > 0 => written as f64 / user_bytes as f64,
            _ => f64::NAN,
        },
    ));
    figures.push((
        "mean disk ÷ live".into(),
        mean(run.nodes.iter().map(|n| n.space_amplification.unwrap_or(f64::NAN)).collect()),
    ));
    if let Some(gc) = run.gc.as_ref().filter(|gc| gc.nodes > 0 && gc.live_bytes > 0) {
        let per_node = |bytes: u64| bytes as f64 / gc.nodes as f64 / (1u64 << 20) as f64;
        figures.push(("log GC: live MiB per node".into(), per_node(gc.live_bytes)));
        figures.push(("log GC: log MiB per node".into(), per_node(gc.log_bytes)));
    }
    if let Some(gc) = run.gc.as_ref().filter(|gc| gc.peer_bytes_sent > 0) {
        figures.push(("MiB sent between nodes".into(), gc.peer_bytes_sent as f64 / (1u64 << 20) as f64));
    }
    if let Some(gc) = &run.gc
        && gc.dedup_inline_hits + gc.dedup_offline_hits + gc.dedup_references > 0
    {
        figures.push(("dedup: values shared as written".into(), gc.dedup_inline_hits as f64));
        figures.push(("dedup: values shared when moved".into(), gc.dedup_offline_hits as f64));
        figures.push(("dedup: puts applied by reference".into(), gc.dedup_references as f64));
        figures
            .push(("dedup: MiB not stored again".into(), gc.dedup_bytes_saved as f64 / (1u64 << 20) as f64));
    }
    if let Some((fast, fell_back)) = run.fast_writes {
        figures.push((
            "fast path: writes fallen back %".into(),
            fell_back as f64 * 100.0 / (fast + fell_back).max(1) as f64,
        ));
    }
    // Index compaction over all nodes, by the layout of the trees compacted (onekv only).
    let compactions: Vec<_> = run.nodes.iter().filter_map(|n| n.index_compaction_bytes).collect();
    if !compactions.is_empty() {
        let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
        let leveled: u64 = compactions.iter().map(|c| c.leveled).sum();
        let runs: u64 = compactions.iter().map(|c| c.runs).sum();
        figures.push(("index compaction MiB, leveled trees".into(), mib(leveled)));
        figures.push(("index compaction MiB, runs trees".into(), mib(runs)));
        figures.push(("index compaction MiB, all".into(), mib(leveled + runs)));
    }
    figures
}

impl CompareReport {
    /// One markdown table: a row per figure; a column per run, then per mode the mean over its
    /// rounds, then each mode's mean as a ratio of the first mode's.
    pub fn markdown(&self) -> String {
        let per_run: Vec<Vec<(String, f64)>> = self.runs.iter().map(figures).collect();
        // Figure names in first-seen order, so a figure missing from some run still gets a row.
        let mut names: Vec<String> = Vec::new();
        for figures in &per_run {
            for (name, _) in figures {
                if !names.contains(name) {
                    names.push(name.clone());
                }
            }
        }
        let value = |run: usize, name: &str| {
            per_run[run].iter().find(|(figure, _)| figure == name).map_or(f64::NAN, |(_, value)| *value)
        };
        let mode_mean = |mode: &str, name: &str| {
            let values: Vec<f64> = (0..self.runs.len())
                .filter(|&run| self.runs[run].mode == mode)
                .map(|run| value(run, name))
                .filter(|value| value.is_finite())
                .collect();
            if values.is_empty() { f64::NAN } else { values.iter().sum::<f64>() / values.len() as f64 }
        };
        let mut out = String::from("| figure |");
        for run in &self.runs {
            let _ = write!(out, " {} r{} |", run.mode, run.round);
        }
        for mode in &self.modes {
            let _ = write!(out, " {mode} mean |");
        }
        for mode in self.modes.iter().skip(1) {
            let _ = write!(out, " {mode} ÷ {} |", self.modes[0]);
        }
        out.push_str("\n|---|");
        let columns = self.runs.len() + self.modes.len() + self.modes.len().saturating_sub(1);
        out.push_str(&"---:|".repeat(columns));
        out.push('\n');
        for name in &names {
            let _ = write!(out, "| {name} |");
            for run in 0..self.runs.len() {
                let _ = write!(out, " {} |", format_figure(value(run, name)));
            }
            for mode in &self.modes {
                let _ = write!(out, " {} |", format_figure(mode_mean(mode, name)));
            }
            let base = mode_mean(&self.modes[0], name);
            for mode in self.modes.iter().skip(1) {
                let ratio = mode_mean(mode, name) / base;
                let ratio = if ratio.is_finite() { format!("{ratio:.2}") } else { "-".into() };
                let _ = write!(out, " {ratio} |");
            }
            out.push('\n');
        }
        out
    }
}

fn format_figure(value: f64) -> String {
    if !value.is_finite() {
        "-".into()
    } else if value.abs() >= 100.0 || value == value.trunc() {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::OpReport;
    use crate::workload::{OpType, WorkloadKind};

    /// A onekv contender with the default index layout.
    fn onekv(mode: StorageMode, shards: u32, gc: GcVariant, baseline: bool) -> Contender {
        Contender::Onekv {
            mode,
            shards,
            gc,
            index: IndexVariant::Default,
            dedup: DedupModeName::Off,
            references: true,
            fast: false,
            baseline,
        }
    }

    #[test]
    fn contenders_parse_as_they_are_named() {
        for contender in [
            Contender::Etcd,
            onekv(StorageMode::OneLog, 16, GcVariant::On, false),
            onekv(StorageMode::Classic, 16, GcVariant::On, false),
            onekv(StorageMode::OneLog, 1, GcVariant::On, false),
            onekv(StorageMode::OneLog, 16, GcVariant::Off, false),
            onekv(StorageMode::OneLog, 4, GcVariant::Off, false),
            onekv(StorageMode::OneLog, 4, GcVariant::Off, true),
        ] {
            assert_eq!(Contender::parse(&contender.name()), Some(contender));
        }
        for name in ["onelog:1:fast", "onelog:3:s4:dedup-inline:fast:nogc", "onelog:fast@base"] {
            let contender = Contender::parse(name).unwrap_or_else(|| panic!("{name}"));
            assert!(matches!(contender, Contender::Onekv { fast: true, .. }), "{name}");
            assert_eq!(contender.name(), name);
        }
        assert!(Contender::parse("onelog:fast:uniform").is_none());
        assert_eq!(Contender::parse("etcd3"), None);
        assert_eq!(Contender::parse("onelog:1"), Some(onekv(StorageMode::OneLog, 1, GcVariant::On, false)));
        assert_eq!(Contender::parse("onelog"), Some(onekv(StorageMode::OneLog, 16, GcVariant::On, false)));
        assert_eq!(
            Contender::parse("onelog:nogc"),
            Some(onekv(StorageMode::OneLog, 16, GcVariant::Off, false))
        );
        assert_eq!(
            Contender::parse("onelog:4:nocompress"),
            Some(onekv(StorageMode::OneLog, 4, GcVariant::Uncompressed, false))
        );
        assert_eq!(
            Contender::parse("onelog:1@base"),
            Some(onekv(StorageMode::OneLog, 1, GcVariant::On, true))
        );
        assert_eq!(Contender::parse("onelog@base").unwrap().name(), "onelog@base");
        assert_eq!(Contender::parse("etcd@base"), None);
        assert_eq!(Contender::parse("onelog@base:1"), None);
        assert_eq!(Contender::parse("onelog:nogc:1"), None);
        for (name, index) in [
            ("onelog:uniform", IndexVariant::Uniform),
            ("onelog:3:s4:nogc", IndexVariant::Runs(4)),
            ("onelog:s64", IndexVariant::Runs(64)),
            ("onelog:s8own", IndexVariant::RunsOwnMemtables(8)),
        ] {
            let contender = Contender::parse(name).unwrap();
            assert!(matches!(contender, Contender::Onekv { index: parsed, .. } if parsed == index), "{name}");
            assert_eq!(contender.name(), name);
        }
        for bad in ["onelog:s0", "onelog:s65", "onelog:nogc:uniform", "onelog:s4:1", "onelog:sx"] {
            assert_eq!(Contender::parse(bad), None, "{bad}");
        }
        assert_eq!(Contender::parse("onelog:nogc:nocompress"), None);
        for (name, mode) in [
            ("onelog:dedup-inline", DedupModeName::Inline),
            ("onelog:1:uniform:dedup-elastic:nogc", DedupModeName::Elastic),
            ("onelog:s4:dedup-offline", DedupModeName::Offline),
            ("onelog:dedup-inline:norefs", DedupModeName::Inline),
        ] {
            let contender = Contender::parse(name).unwrap();
            assert!(matches!(contender, Contender::Onekv { dedup: parsed, .. } if parsed == mode), "{name}");
            assert_eq!(contender.name(), name);
        }
        for bad in [
            "onelog:dedup-off",
            "onelog:dedup-",
            "onelog:dedup-inline:uniform",
            "onelog:dedup",
            "onelog:norefs",
        ] {
            assert_eq!(Contender::parse(bad), None, "{bad}");
        }
        assert_eq!(Contender::parse("onelog:1:2"), None);
        assert_eq!(Contender::parse("onelog:0"), None);
        assert_eq!(Contender::parse("onelog:1025"), None);
    }

    #[test]
    fn etcd_figures_come_from_the_kernel_and_the_disk_only() {
        let before = [("a".to_string(), Some(1000), Some(0)), ("b".to_string(), None, None)];
        let after = [("a".to_string(), Some(5000), Some(800)), ("b".to_string(), Some(9000), None)];
        let nodes = etcd_amplification(&before, &after, 2000, 400);
        assert_eq!(nodes.len(), 2);
        assert_eq!(
            (nodes[0].node_id, nodes[0].kernel_write_bytes, nodes[0].kernel_wa),
            (1, Some(4000), Some(2.0))
        );
        assert_eq!(nodes[0].space_amplification, Some(2.0));
        assert_eq!(nodes[0].engine_wa, None);
        // No starting figure: no kernel delta rather than a made-up one.
        assert_eq!(
            (nodes[1].kernel_write_bytes, nodes[1].kernel_wa, nodes[1].disk_bytes),
            (None, None, None)
        );
    }

    #[test]
    fn rounds_alternate_the_order() {
        let modes = [StorageMode::OneLog, StorageMode::Classic, StorageMode::Separated];
        assert_eq!(schedule(&modes, 0), modes);
        assert_eq!(schedule(&modes, 1), [StorageMode::Separated, StorageMode::Classic, StorageMode::OneLog]);
        assert_eq!(schedule(&modes, 2), modes);
    }

    fn run(mode: &str, round: u32, throughput: f64, wa: f64) -> CompareRun {
        let op = OpReport {
            op: OpType::Insert,
            count: 10,
            errors: 0,
            not_found: 0,
            ops_per_sec: throughput,
            mean_us: 1.0,
            p50_us: 100,
            p95_us: 200,
            p99_us: 300,
            p999_us: 400,
            max_us: 500,
            first_error: None,
        };
        let phase = RunReport {
            workload: WorkloadKind::Load,
            records: 10,
            threads: 1,
            key_bytes: 24,
            value_bytes: 100,
            operations: 10,
            errors: 0,
            elapsed_seconds: 1.0,
            throughput_ops_per_sec: throughput,
            stopped_by_time: false,
            payload_bytes_written: 1240,
            records_inserted: 10,
            ops: vec![op],
            server_cpu_seconds: Some(0.5),
            client_cpu_seconds: None,
        };
        let node = NodeAmplification {
            endpoint: "127.0.0.1:1".into(),
            node_id: 1,
            role: "leader".into(),
            storage_mode: mode.into(),
            user_bytes: 1240,
            engine_bytes_written: 0,
            engine_wa: Some(wa),
            kernel_write_bytes: None,
            kernel_wa: None,
            log_bytes: 0,
            disk_bytes: None,
            live_bytes: 1240,
            space_amplification: None,
            log_space_amplification: None,
            index_compaction_bytes: None,
            error: None,
        };
        CompareRun {
            mode: mode.into(),
            round,
            phases: vec![phase],
            nodes: vec![node],
            disk_samples: Vec::new(),
            gc: None,
            device_write_bytes: Some(3720),
            fast_writes: None,
        }
    }

    #[test]
    fn the_table_has_means_and_ratios_against_the_first_mode() {
        let report = CompareReport {
            modes: vec!["onelog".into(), "classic".into()],
            runs: vec![
                run("onelog", 0, 1000.0, 1.0),
                run("classic", 0, 400.0, 4.0),
                run("classic", 1, 600.0, 4.0),
                run("onelog", 1, 1000.0, 1.0),
            ],
        };
        let table = report.markdown();
        let row = |name: &str| table.lines().find(|line| line.starts_with(&format!("| {name} |"))).unwrap();
        assert_eq!(
            row("load: ops/s"),
            "| load: ops/s | 1000 | 400 | 600 | 1000 | 1000 | 500 | 0.50 |",
            "{table}"
        );
        assert_eq!(row("node 1: engine WA"), "| node 1: engine WA | 1 | 4 | 4 | 1 | 1 | 4 | 4.00 |");
        assert_eq!(
            row("load: servers' CPU µs/op"),
            "| load: servers' CPU µs/op | 50000 | 50000 | 50000 | 50000 | 50000 | 50000 | 1.00 |"
        );
        // No kernel figure anywhere: dashes, not NaN.
        assert_eq!(row("node 1: kernel WA"), "| node 1: kernel WA | - | - | - | - | - | - | - |");
        // 3 720 bytes reached the disk for 1 240 user bytes applied.
        assert_eq!(
            row("device WA (whole disk)"),
            "| device WA (whole disk) | 3 | 3 | 3 | 3 | 3 | 3 | 1.00 |"
        );
    }
}
