//! `onekv bench ...`: the YCSB-style harness (`ycsb`) against a running cluster (or a running
//! etcd), and side-by-side comparisons of storage modes and etcd on fresh local clusters (`compare`).
//!
//! Owns only the command line: flags, the runtime, printing and the JSON file. The workloads, the
//! runner, the amplification figures and the local clusters are the `onekv-bench` crate's.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use onekv_bench::amplification::{self, NodeProbe};
use onekv_bench::compare::{CompareConfig, Contender, compare};
use onekv_bench::{
    BenchReport, CpuProbe, EtcdTarget, OnekvTarget, RunConfig, ValueKind, WorkloadKind, live_bytes,
    run_phases,
};

/// The benchmark subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// Runs a YCSB core workload against a running cluster and prints latency tables per operation
    /// type and each node's write and space amplification. Workloads a–f assume the records were
    /// loaded before (by `--workload load` with the same --records and --value-bytes, or `--load`).
    Ycsb(YcsbArgs),
    /// Starts a fresh local cluster per storage mode and round (alternating the order), runs the
    /// same workload against each (Load first), and prints every figure with the ratios against
    /// the first mode.
    Compare(CompareArgs),
}

/// Flags shared by both subcommands: the workload and its bounds.
#[derive(Debug, clap::Args)]
pub struct WorkloadArgs {
    /// YCSB core workload: load (insert every record), a (50% read / 50% update, zipfian), b (95/5
    /// read/update), c (read only), d (95% read latest / 5% insert), e (95% scan / 5% insert),
    /// f (50% read / 50% read-modify-write), or w (not YCSB's: 100% update, uniform; endless
    /// overwrites, for the log GC).
    #[arg(long, default_value = "a")]
    workload: WorkloadKind,
    /// Records in the key space (Load inserts this many).
    #[arg(long, default_value_t = 10_000)]
    records: u64,
    /// Operations of a workload a–f or w [default: --records].
    #[arg(long)]
    operations: Option<u64>,
    /// Time bound of each phase, in seconds (operations in flight complete).
    #[arg(long)]
    seconds: Option<f64>,
    /// Concurrent clients (closed loop: each has one operation outstanding).
    #[arg(long, default_value_t = 16)]
    threads: usize,
    /// Bytes per value (keys are 24 bytes, YCSB-style).
    #[arg(long, default_value_t = 1024)]
    value_bytes: usize,
    /// What values contain: random (bytes no compressor shrinks), text (words in `field=...`
    /// runs, compressible about as much as JSON records) or recurring:PERCENT:DISTINCT (that share
    /// of the values repeats one of DISTINCT random values; for deduplication).
    #[arg(long, default_value = "random")]
    values: ValueKind,
    /// Seed of the request generators.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Writes the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// No progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long)]
    quiet: bool,
}

impl WorkloadArgs {
    fn run_config(&self) -> anyhow::Result<RunConfig> {
        let duration = match self.seconds {
            Some(seconds) if seconds.is_finite() && seconds > 0.0 => Some(Duration::from_secs_f64(seconds)),
            Some(seconds) => bail!("--seconds must be a positive number, not {seconds}"),
            None => None,
        };
        Ok(RunConfig {
            workload: self.workload,
            records: self.records,
            operations: Some(self.operations.unwrap_or(self.records)),
            duration,
            threads: self.threads,
            value_bytes: self.value_bytes,
            values: self.values,
            seed: self.seed,
            progress: !self.quiet,
        })
    }
}

/// Flags of `onekv bench ycsb`.
#[derive(Debug, clap::Args)]
pub struct YcsbArgs {
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Runs the Load phase first, in the same invocation.
    #[arg(long)]
    load: bool,
    /// Comma-separated `host:port` addresses of the cluster's nodes [env: ONEKV_ENDPOINTS]
    /// [default: 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003]
    #[arg(long, value_name = "HOST:PORT,...", conflicts_with = "etcd")]
    endpoints: Option<String>,
    /// Runs the workload against the etcd cluster at these comma-separated client `host:port`
    /// addresses instead of onekv (no amplification figures: the process is not ours).
    #[arg(long, value_name = "HOST:PORT,...")]
    etcd: Option<String>,
    /// Comma-separated process ids of the servers (onekv or etcd), to report their CPU time per
    /// operation next to throughput (for a local cluster: `pgrep -d, -f 'onekv server'`).
    #[arg(long, value_name = "PID,...", value_delimiter = ',')]
    server_pids: Vec<u32>,
}

/// Flags of `onekv bench compare`.
#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Storage modes to compare, the first being the baseline of the ratios, each with 16 shards or
    /// `MODE:SHARDS` (`onelog:1` is a single Raft group), and `:nogc` to run it with its log
    /// garbage collector off (`onelog:nogc`, `onelog:1:nogc`) or `:nocompress` with a collector
    /// that moves small values uncompressed, `:uniform` to keep every index tree leveled or `:sN`
    /// to keep followed shards' trees in at most N sorted runs (`index.layout`; before any `:nogc`;
    /// `:sNown` has each of them flush at its own memtable size instead of sharing the budget),
    /// `:dedup-inline`, `:dedup-offline` or `:dedup-elastic` to deduplicate values (`dedup.mode`;
    /// after the layout, before any `:nogc`; followed by `:norefs`, leaders put no value by
    /// reference: `dedup.references = false`),
    /// then `@base` to run it with --baseline-exe; `etcd` adds a local etcd cluster (same number
    /// of members, default durability) as one more contender.
    #[arg(long, default_value = "onelog,classic", value_delimiter = ',')]
    modes: Vec<String>,
    /// Another `onekv` executable (an earlier build, say) that contenders named with `@base` run
    /// (`--modes onelog@base,onelog`): two builds compared in one run, on the same machine.
    #[arg(long, value_name = "PATH")]
    baseline_exe: Option<PathBuf>,
    /// The etcd executable used when --modes names etcd (scripts/install-etcd installs one).
    #[arg(long, default_value = "etcd")]
    etcd_exe: PathBuf,
    /// Rounds; each runs every mode once, odd rounds in reverse order.
    #[arg(long, default_value_t = 2)]
    rounds: u32,
    /// Nodes per cluster.
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// Replicas of each shard (at most --nodes; default 3, or every node when there are fewer).
    #[arg(long)]
    replicas: Option<u32>,
    /// Directory for the clusters' data (each run's is removed after it) [default: the system's
    /// temporary directory].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Sample every node's data-directory size this often, in milliseconds, into the JSON report
    /// (`disk_samples`, for `scripts/plot-gc.py`); 0: no samples.
    #[arg(long, default_value_t = 0)]
    sample_disk_ms: u64,
    /// `index.memtable_bytes` of every onekv node, in KiB (at least 64) [default: the node's
    /// default, 16 MiB]: a small memtable makes a short run flush and compact its index as a long
    /// one with the default would. `index.follower_memtable_bytes` is scaled with it (16 ×, as the defaults).
    #[arg(long, value_name = "KIB")]
    index_memtable_kib: Option<u64>,
    /// Seconds to leave each onekv cluster idle after its last phase before its disk use and write
    /// amplification are taken, so the log GC (and deduplication's merging) catches up: the
    /// steady state rather than the moment the writes stop. Its writes count.
    #[arg(long, default_value_t = 0)]
    settle_secs: u64,
    /// One-way delay in microseconds added to every link of each onekv cluster, node to node and
    /// this client to each node, by a proxy per link in this process (a network's round trips on
    /// one machine; etcd contenders run without it) [default: none].
    #[arg(long, value_name = "MICROSECONDS")]
    link_delay_us: Option<u64>,
    /// Kill onekv node ID (SIGKILL) after the Load phase, and run the workload once every shard has
    /// a leader again: one replica of each of its shards down (etcd contenders run without it).
    #[arg(long, value_name = "ID")]
    down_after_load: Option<u64>,
}

/// Runs one bench subcommand. SIGINT or SIGTERM abandons it: dropping its future stops the local
/// clusters and etcd members it started (their guards), which would otherwise outlive it.
pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start a runtime")?;
    runtime.block_on(async {
        let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
        let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
        let work = async {
            match &command {
                BenchCommand::Ycsb(args) => ycsb(args).await,
                BenchCommand::Compare(args) => compare_modes(args).await,
            }
        };
        tokio::select! {
            result = work => result,
            _ = interrupt.recv() => bail!("interrupted: stopped the local clusters it started"),
            _ = terminate.recv() => bail!("terminated: stopped the local clusters it started"),
        }
    })
}

async fn ycsb(args: &YcsbArgs) -> anyhow::Result<()> {
    let config = args.workload.run_config()?;
    if let Some(list) = &args.etcd {
        return ycsb_etcd(args, &config, list).await;
    }
    let client = crate::client_cmd::connect_to(args.endpoints.as_deref())?;
    // Pids and directories are unknown for a cluster this process did not start: engine figures only.
    let probes: Vec<NodeProbe> = Vec::new();
    let before = amplification::snapshot(&client, &probes).await;
    let target = Arc::new(OnekvTarget::new(client.clone()));
    let cpu = CpuProbe { server_pids: args.server_pids.clone() };
    let phases = run_phases(target, &config, args.load, &cpu).await?;
    let after = amplification::snapshot(&client, &probes).await;
    let nodes = amplification::amplification(&before, &after, live_bytes(config.records, &phases));
    for phase in &phases {
        println!("{}", phase.markdown());
    }
    println!("{}", amplification::markdown(&nodes));
    let report = BenchReport { phases, nodes };
    if let Some(path) = &args.workload.json {
        let json = serde_json::to_string_pretty(&report).context("cannot encode the report")?;
        std::fs::write(path, json).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let errors: u64 = report.phases.iter().map(|phase| phase.errors).sum();
    if errors > 0 {
        eprintln!("{errors} operations failed (see the tables above)");
    }
    Ok(())
}

async fn ycsb_etcd(args: &YcsbArgs, config: &RunConfig, list: &str) -> anyhow::Result<()> {
    let endpoints = crate::client_cmd::split_endpoints(list);
    let target =
        EtcdTarget::new(&endpoints).map_err(|error| anyhow::anyhow!("bad --etcd {list:?}: {error}"))?;
    let cpu = CpuProbe { server_pids: args.server_pids.clone() };
    let phases = run_phases(Arc::new(target), config, args.load, &cpu).await?;
    for phase in &phases {
        println!("{}", phase.markdown());
    }
    let report = BenchReport { phases, nodes: Vec::new() };
    if let Some(path) = &args.workload.json {
        let json = serde_json::to_string_pretty(&report).context("cannot encode the report")?;
        std::fs::write(path, json).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let errors: u64 = report.phases.iter().map(|phase| phase.errors).sum();
    if errors > 0 {
        eprintln!("{errors} operations failed (see the tables above)");
    }
    Ok(())
}

async fn compare_modes(args: &CompareArgs) -> anyhow::Result<()> {
    let mut modes = Vec::new();
    for name in &args.modes {
        let mode = Contender::parse(name.trim()).with_context(|| {
            format!(
                "unknown storage mode {name:?}; expected onelog, separated, classic (each optionally \
                 :SHARDS, 1..=1024, e.g. onelog:1; default 16 shards; optionally :nogc or :nocompress; \
                 and optionally @base) or etcd"
            )
        })?;
        if modes.contains(&mode) {
            bail!("--modes names {name} twice");
        }
        if matches!(mode, Contender::Onekv { baseline: true, .. }) && args.baseline_exe.is_none() {
            bail!("--modes names {name}, which runs the baseline executable: give --baseline-exe");
        }
        modes.push(mode);
    }
    if modes.is_empty() || args.rounds == 0 {
        bail!("give at least one mode and one round");
    }
    if let Some(exe) = &args.baseline_exe {
        if !modes.iter().any(|mode| matches!(mode, Contender::Onekv { baseline: true, .. })) {
            bail!("--baseline-exe is given but no mode runs it: name one MODE@base in --modes");
        }
        // Found now rather than when its first run starts, maybe after long runs of the others.
        if !exe.is_file() {
            bail!("--baseline-exe {}: no such file", exe.display());
        }
    }
    let config = CompareConfig {
        exe: std::env::current_exe().context("cannot find the onekv executable")?,
        baseline_exe: args.baseline_exe.clone(),
        etcd_exe: args.etcd_exe.clone(),
        modes,
        rounds: args.rounds,
        nodes: args.nodes,
        replicas: args.replicas,
        run: args.workload.run_config()?,
        dir: args.dir.clone(),
        leader_timeout: Duration::from_secs(30),
        sample_disk: (args.sample_disk_ms > 0).then(|| Duration::from_millis(args.sample_disk_ms)),
        index_memtable_bytes: args.index_memtable_kib.map(|kib| kib << 10),
        settle: Duration::from_secs(args.settle_secs),
        link_delay: args.link_delay_us.map(Duration::from_micros),
        down_after_load: args.down_after_load,
    };
    let report = compare(&config, |run| {
        eprintln!("{} round {}:", run.mode, run.round);
        for phase in &run.phases {
            eprintln!("{}", phase.markdown());
        }
        eprintln!("{}", amplification::markdown(&run.nodes));
    })
    .await?;
    println!("{}", report.markdown());
    if let Some(path) = &args.workload.json {
        let json = serde_json::to_string_pretty(&report).context("cannot encode the report")?;
        std::fs::write(path, json).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
