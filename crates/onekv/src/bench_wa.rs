//! `onekv bench-wa`: write amplification of the three storage modes, measured side by side in one
//! invocation.
//!
//! For each mode it starts a cluster of replicas in this process (wired by the in-memory router,
//! so everything but the network is the real node: the log, group commit, Raft, the index and
//! its flushes), loads `--total-mib` of fresh keys with `--value-bytes` values (random, so
//! incompressible) from `--clients` closed-loop writers at the leader, waits until every replica
//! has applied everything, and reports:
//! - **engine WA per replica**: bytes the replica's logs and index tables wrote ÷ key and value
//!   bytes it applied (its own counters), as min–max over replicas;
//! - **kernel WA**: growth of this process's `/proc/self/io` `write_bytes` during the load ÷
//!   (replicas × user bytes): the operating system's count of bytes sent to storage, per replica;
//! - load throughput (user MB/s) and write latency percentiles at the leader.
//!
//! Index flushes during the load are counted, and so are the compactions they trigger unless
//! `--no-compaction` asks for the figure "before any compaction" (as the issue and the papers state
//! it). The memtable left unflushed at the end is not counted (it would be flushed later), which is
//! why the load should be several times `--memtable-mib`.
//!
//! Not measured: the network, reads, or anything after the load.

use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use onekv_replica::local::Router;
use onekv_replica::{Command, Replica, ReplicaConfig, ReplicaError, RequestId, StorageMode, WriteOp};
use rand::RngCore;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Flags of `onekv bench-wa`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Storage modes to compare, in the order they run.
    #[arg(long, value_delimiter = ',', default_value = "onelog,separated,classic")]
    modes: Vec<String>,
    /// Replicas per cluster.
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 16 << 10)]
    value_bytes: usize,
    /// User data to load per mode, in MiB.
    #[arg(long, default_value_t = 256)]
    total_mib: u64,
    /// Concurrent writers.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Index memtable size that triggers a flush, in MiB.
    #[arg(long, default_value_t = 16)]
    memtable_mib: u64,
    /// Do not compact index trees during the load: write amplification "before any compaction",
    /// as the issue and the papers state it.
    #[arg(long)]
    no_compaction: bool,
    /// Directory for the clusters' data (a temporary directory by default, deleted at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// One mode's figures.
struct Figures {
    mode: StorageMode,
    user_bytes: u64,
    engine_wa: Vec<f64>,
    kernel_wa: f64,
    seconds: f64,
    latency_us: Histogram<u64>,
}

/// Runs the comparison and prints a markdown table.
pub fn run(args: &Args) -> Result<()> {
    let modes = args
        .modes
        .iter()
        .map(|m| StorageMode::parse(m).with_context(|| format!("unknown storage mode {m:?}")))
        .collect::<Result<Vec<_>>>()?;
    if args.nodes == 0 || args.clients == 0 || args.value_bytes == 0 || args.total_mib == 0 {
        bail!("--nodes, --clients, --value-bytes and --total-mib must be positive");
    }
    let temp;
    let root = match &args.dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::tempdir().context("creating a temporary directory")?;
            temp.path().to_path_buf()
        }
    };
    let mut all = Vec::new();
    for mode in modes {
        eprintln!(
            "bench-wa: loading {} MiB into {} ({} replicas)...",
            args.total_mib,
            mode.name(),
            args.nodes
        );
        let figures = run_mode(args, mode, &root.join(mode.name()))?;
        eprintln!("bench-wa: {} done in {:.1} s", mode.name(), figures.seconds);
        all.push(figures);
    }
    print_table(args, &all);
    Ok(())
}

fn kernel_write_bytes() -> Result<u64> {
    let io = std::fs::read_to_string("/proc/self/io").context("reading /proc/self/io")?;
    io.lines()
        .find_map(|line| line.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .context("no write_bytes in /proc/self/io")
}

fn run_mode(args: &Args, mode: StorageMode, dir: &Path) -> Result<Figures> {
    let router = Arc::new(Router::default());
    let ids: Vec<u64> = (1..=args.nodes).collect();
    for &id in &ids {
        let mut config = ReplicaConfig::new(id, ids.clone(), dir.join(format!("node{id}")));
        config.storage = mode;
        config.tick = Duration::from_millis(50);
        config.memtable_bytes = args.memtable_mib << 20;
        config.index_compaction = !args.no_compaction;
        config.limits.max_value_bytes = config.limits.max_value_bytes.max(args.value_bytes);
        let replica =
            Replica::open(config, router.clone()).with_context(|| format!("opening replica {id}"))?;
        router.add(id, replica);
    }
    let stop = |router: &Router| {
        for &id in &ids {
            if let Some(replica) = router.remove(id) {
                replica.shutdown();
            }
        }
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let leader = loop {
        if let Some(leader) = router.leader() {
            break leader;
        }
        if Instant::now() > deadline {
            stop(&router);
            bail!("no leader elected within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let count = (args.total_mib << 20) / args.value_bytes as u64;
    let next = Arc::new(AtomicU64::new(0));
    let last_index = Arc::new(AtomicU64::new(0));
    let kernel_before = kernel_write_bytes()?;
    let started = Instant::now();
    let workers: Vec<_> = (0..args.clients)
        .map(|client| {
            let (router, next, last_index) = (router.clone(), next.clone(), last_index.clone());
            let value_bytes = args.value_bytes;
            std::thread::spawn(move || -> Result<Histogram<u64>> {
                let mut rng = rand::rng();
                let mut histogram = Histogram::<u64>::new(3).expect("valid histogram");
                let mut seq = 0;
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= count {
                        return Ok(histogram);
                    }
                    let mut value = vec![0u8; value_bytes];
                    rng.fill_bytes(&mut value);
                    let command = Command::Write(vec![WriteOp {
                        key: format!("key{n:010}").into_bytes(),
                        value: Some(value),
                        expiry: Default::default(),
                    }]);
                    seq += 1;
                    let id = RequestId { client: client as u64 + 1, seq };
                    let began = Instant::now();
                    let outcome = loop {
                        let replica = router.get(router.leader().unwrap_or(leader)).context("leader gone")?;
                        let (tx, rx) = mpsc::channel();
                        replica.propose(id, command.clone(), Box::new(move |r| drop(tx.send(r))));
                        match rx.recv_timeout(Duration::from_secs(30)).context("no reply within 30 s")? {
                            Ok(outcome) => break outcome,
                            Err(ReplicaError::NotLeader { .. } | ReplicaError::Dropped(_)) => {
                                std::thread::sleep(Duration::from_millis(10))
                            }
                            Err(err) => bail!("write failed: {err}"),
                        }
                    };
                    let _ = histogram.record(began.elapsed().as_micros() as u64);
                    last_index.fetch_max(outcome.index, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut latency_us = Histogram::<u64>::new(3).expect("valid histogram");
    let mut failure = None;
    for worker in workers {
        match worker.join().expect("writer thread panicked") {
            Ok(h) => latency_us.add(h).expect("same histogram bounds"),
            Err(err) => failure = Some(err),
        }
    }
    if let Some(err) = failure {
        stop(&router);
        return Err(err);
    }
    let seconds = started.elapsed().as_secs_f64();
    let target = last_index.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(60);
    while ids.iter().any(|&id| router.get(id).is_some_and(|r| r.status().applied_index < target)) {
        if Instant::now() > deadline {
            stop(&router);
            bail!("replicas did not apply index {target} within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let kernel_written = kernel_write_bytes()? - kernel_before;
    let statuses: Vec<_> = ids.iter().filter_map(|&id| router.get(id)).map(|r| r.status()).collect();
    stop(&router);
    let user_bytes = statuses.iter().map(|s| s.user_bytes).max().unwrap_or(0);
    let engine_wa = statuses.iter().map(|s| s.bytes_written as f64 / s.user_bytes.max(1) as f64).collect();
    let kernel_wa = kernel_written as f64 / (args.nodes as f64 * user_bytes.max(1) as f64);
    Ok(Figures { mode, user_bytes, engine_wa, kernel_wa, seconds, latency_us })
}

fn print_table(args: &Args, all: &[Figures]) {
    println!(
        "\n{} replicas, {} B values, {} MiB per mode, {} writers, memtable {} MiB, index compaction {}\n",
        args.nodes,
        args.value_bytes,
        args.total_mib,
        args.clients,
        args.memtable_mib,
        if args.no_compaction { "off" } else { "on" }
    );
    println!(
        "| mode | engine WA per replica (min–max) | kernel WA per replica | user MB/s | p50 ms | p99 ms | vs onelog kernel WA |"
    );
    println!("|---|---|---|---|---|---|---|");
    let onelog = all.iter().find(|f| f.mode == StorageMode::OneLog).map(|f| f.kernel_wa);
    for f in all {
        let min = f.engine_wa.iter().copied().fold(f64::INFINITY, f64::min);
        let max = f.engine_wa.iter().copied().fold(0.0, f64::max);
        let ratio = onelog.map_or("-".to_string(), |o| format!("{:.2}×", f.kernel_wa / o));
        println!(
            "| {} | {:.3}–{:.3} | {:.3} | {:.1} | {:.1} | {:.1} | {} |",
            f.mode.name(),
            min,
            max,
            f.kernel_wa,
            f.user_bytes as f64 / f.seconds / 1e6,
            f.latency_us.value_at_quantile(0.5) as f64 / 1000.0,
            f.latency_us.value_at_quantile(0.99) as f64 / 1000.0,
            ratio
        );
    }
}
