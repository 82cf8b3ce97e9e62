//! `onekv bench-recovery`: what a restart after `kill -9` costs with recovery per shard (PASV:
//! each shard replays only what its own index tree lacks), next to a full replay, on the same data.
//!
//! One `onekv server` child process holding `--shards` shards (one replica each, so nothing but
//! the node itself is measured) is loaded in two phases through the client library: first
//! `--uniform-mib` spread over every shard (each shard's tree flushes several times, at
//! `--memtable-kib`), then `--hot-mib` to `--hot-shards` shards only (skewed: their trees hold
//! unflushed writes). The child is then killed with SIGKILL. Its data directory is copied, and
//! each copy is opened in this process, timed:
//! - **per shard** (the product): one scan of the log from the lowest recovery point, then each
//!   shard replays from its own flush flag;
//! - **full replay** (the benchmark-only switch: the copy's index directory is deleted first, so
//!   every tree is empty and every shard replays everything the log holds): what a store that
//!   kept one flush point for all shards would do when any shard is not flushed.
//!
//! Rounds alternate the order of the two opens. Reported: entries replayed per shard and in total,
//! log records scanned, and the open time (recovery included), with the ratios.

use anyhow::{Context, Result, bail};
use onekv_client::{Client, ClientOptions};
use onekv_replica::{Message, Node, Transport};
use onekv_server::ServerConfig;
use onekv_server::config::{ClusterConfig, MemberConfig};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Flags of `onekv bench-recovery`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Shards of the node.
    #[arg(long, default_value_t = 16)]
    shards: u32,
    /// MiB written first, spread over every shard.
    #[arg(long, default_value_t = 128)]
    uniform_mib: u64,
    /// Shards written last, just before the kill.
    #[arg(long, default_value_t = 2)]
    hot_shards: u32,
    /// MiB written last, to the hot shards only.
    #[arg(long, default_value_t = 3)]
    hot_mib: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 1024)]
    value_bytes: usize,
    /// Index memtable size that triggers a flush, in KiB. In onelog mode a tree holds keys and
    /// 16-byte locators, not values: 128 KiB is about 2 000 entries of this load's keys.
    #[arg(long, default_value_t = 128)]
    memtable_kib: u64,
    /// Raft entries each shard keeps below its applied index for lagging followers
    /// (`raft.raft_log_keep_entries`): a restart scans the log from the first entry a shard still
    /// keeps, so this bounds what even a flushed shard reads back.
    #[arg(long, default_value_t = 1000)]
    keep_entries: u64,
    /// Concurrent writers.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Rounds of (per shard, full replay) opens, alternating which goes first.
    #[arg(long, default_value_t = 2)]
    rounds: u32,
    /// Where the node's data and the copies live (a temporary directory by default).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// Carries nothing: the node opened for timing has no peers.
struct NoPeers;

impl Transport for NoPeers {
    fn send(&self, _shard: u64, _messages: Vec<Message>) {}
}

/// One timed open.
struct Opened {
    seconds: f64,
    /// Entries replayed, by shard.
    replayed: Vec<(u64, u64)>,
    /// Log records the one scan read.
    records: u64,
}

/// Runs the benchmark and prints a markdown report.
pub fn run(args: &Args) -> Result<()> {
    if args.shards == 0 || args.hot_shards == 0 || args.hot_shards > args.shards {
        bail!("--hot-shards must be between 1 and --shards");
    }
    if args.value_bytes == 0 || args.clients == 0 || args.rounds == 0 {
        bail!("--value-bytes, --clients and --rounds must be positive");
    }
    let temp;
    let root = match &args.dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::Builder::new().prefix("onekv-bench-recovery").tempdir()?;
            temp.path().to_path_buf()
        }
    };
    std::fs::create_dir_all(&root)?;
    let config = node_config(&root, args)?;
    let config_path = root.join("onekv.toml");
    std::fs::write(&config_path, config.to_toml())?;

    eprintln!(
        "loading {} MiB over {} shards, then {} MiB to {} of them",
        args.uniform_mib, args.shards, args.hot_mib, args.hot_shards
    );
    let mut child = spawn(&config_path, &root)?;
    let loaded =
        tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(load(&config, args));
    // SIGKILL, as `kill -9`: nothing is flushed or closed.
    child.kill().context("killing the node")?;
    child.wait().context("reaping the node")?;
    let written = loaded?;
    eprintln!("wrote {written} values; node killed with SIGKILL");

    let map = config.cluster_map()?;
    let mut partial = Vec::new();
    let mut full = Vec::new();
    for round in 0..args.rounds {
        let order = if round % 2 == 0 { [false, true] } else { [true, false] };
        for full_replay in order {
            let copy = root.join(format!("copy-{round}-{}", if full_replay { "full" } else { "partial" }));
            copy_dir(&config.data_dir, &copy)?;
            if full_replay {
                std::fs::remove_dir_all(copy.join("index")).context("removing the copy's index")?;
            }
            let mut replica_config = config.to_replica_config(&map);
            replica_config.data_dir = copy.clone();
            // No disk alarm or reserve on the copies: they are measured, not served.
            replica_config.min_free_bytes = 0;
            replica_config.reserve_bytes = 0;
            replica_config.scrub_bytes_per_sec = 0;
            let opened = open_timed(replica_config)?;
            eprintln!(
                "round {round}: {} open in {:.3} s, {} entries replayed, {} records scanned",
                if full_replay { "full-replay" } else { "per-shard" },
                opened.seconds,
                opened.replayed.iter().map(|(_, n)| n).sum::<u64>(),
                opened.records
            );
            std::fs::remove_dir_all(&copy).ok();
            if full_replay { full.push(opened) } else { partial.push(opened) }
        }
    }
    print!("{}", report(args, written, &partial, &full));
    Ok(())
}

fn node_config(root: &Path, args: &Args) -> Result<ServerConfig> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut config = ServerConfig {
        node_id: 1,
        listen: format!("127.0.0.1:{port}"),
        data_dir: root.join("data"),
        members: vec![MemberConfig { id: 1, address: format!("127.0.0.1:{port}") }],
        cluster: ClusterConfig { shards: args.shards, replicas: Some(1), ..ClusterConfig::default() },
        log_level: Some("warn".into()),
        ..ServerConfig::default()
    };
    config.index.memtable_bytes = args.memtable_kib << 10;
    config.raft.raft_log_keep_entries = args.keep_entries;
    config.validate().context("the benchmark's node configuration")?;
    Ok(config)
}

fn spawn(config_path: &Path, root: &Path) -> Result<Child> {
    let exe = std::env::current_exe().context("finding the onekv executable")?;
    let log = std::fs::File::create(root.join("server.log"))?;
    Command::new(exe)
        .arg("server")
        .arg("--config")
        .arg(config_path)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting the node")
}

/// Writes the two phases; returns how many values were written.
async fn load(config: &ServerConfig, args: &Args) -> Result<u64> {
    let client = Client::new(vec![config.listen.clone()], ClientOptions::default())?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while client
        .status(&config.listen)
        .await
        .map(|s| s.shards.iter().any(|r| r.role != "leader"))
        .unwrap_or(true)
    {
        if Instant::now() > deadline {
            bail!("the node did not lead all its shards within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let per_value = args.value_bytes as u64;
    let uniform: Vec<Vec<u8>> =
        (0..(args.uniform_mib << 20) / per_value).map(|i| format!("u{i:012}").into_bytes()).collect();
    let hot_shards: Vec<u64> = (1..=u64::from(args.hot_shards)).collect();
    let hot: Vec<Vec<u8>> = (0u64..)
        .map(|i| format!("h{i:012}").into_bytes())
        .filter(|key| {
            hot_shards.contains(&onekv_placement::shard_of_key(
                key,
                args.shards,
                ClusterConfig::default().key_hashing.rule(),
            ))
        })
        .take(((args.hot_mib << 20) / per_value) as usize)
        .collect();
    let value = Arc::new(vec![0x5a; args.value_bytes]);
    let mut written = 0;
    for keys in [uniform, hot] {
        let keys = Arc::new(keys);
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..args.clients {
            let (client, keys, next, value) = (client.clone(), keys.clone(), next.clone(), value.clone());
            tasks.spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(key) = keys.get(i) else { return anyhow::Ok(()) };
                    client.put(key, &value).await?;
                }
            });
        }
        while let Some(joined) = tasks.join_next().await {
            joined??;
        }
        written += keys.len() as u64;
    }
    Ok(written)
}

fn open_timed(config: onekv_replica::ReplicaConfig) -> Result<Opened> {
    let started = Instant::now();
    let node = Node::open(config, Arc::new(NoPeers)).context("opening the copy")?;
    let seconds = started.elapsed().as_secs_f64();
    let statuses = node.statuses();
    node.shutdown();
    Ok(Opened {
        seconds,
        replayed: statuses.iter().map(|s| (s.shard, s.recovery_replayed)).collect(),
        records: statuses.iter().map(|s| s.recovery_records).sum(),
    })
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)
                .with_context(|| format!("copying {}", entry.path().display()))?;
        }
    }
    Ok(())
}

fn report(args: &Args, written: u64, partial: &[Opened], full: &[Opened]) -> String {
    let median = |opens: &[Opened]| {
        let mut seconds: Vec<f64> = opens.iter().map(|o| o.seconds).collect();
        seconds.sort_by(f64::total_cmp);
        seconds[seconds.len() / 2]
    };
    let total = |open: &Opened| open.replayed.iter().map(|(_, n)| n).sum::<u64>();
    let (p, f) = (&partial[0], &full[0]);
    let mut out = format!(
        "{} values of {} B: {} MiB over {} shards, then {} MiB to shards 1..={}; memtable {} KiB, \
         {} Raft entries kept per shard; killed with SIGKILL\n\n",
        written,
        args.value_bytes,
        args.uniform_mib,
        args.shards,
        args.hot_mib,
        args.hot_shards,
        args.memtable_kib,
        args.keep_entries
    );
    out.push_str("| shard | replayed, per shard | replayed, full replay |\n|---|---|---|\n");
    for ((shard, mine), (_, all)) in p.replayed.iter().zip(&f.replayed) {
        out.push_str(&format!("| {shard} | {mine} | {all} |\n"));
    }
    let (pt, ft) = (total(p), total(f));
    let (ps, fs) = (median(partial), median(full));
    out.push_str(&format!(
        "| **total** | **{pt}** | **{ft}** ({:.1}× more) |\n\n",
        ft as f64 / pt.max(1) as f64
    ));
    out.push_str("| | per shard | full replay | ratio |\n|---|---|---|---|\n");
    out.push_str(&format!(
        "| log records scanned | {} | {} | {:.1}× |\n",
        p.records,
        f.records,
        f.records as f64 / p.records.max(1) as f64
    ));
    out.push_str(&format!(
        "| restart (open + recovery), median of {} | {:.3} s | {:.3} s | {:.1}× faster |\n",
        partial.len(),
        ps,
        fs,
        fs / ps.max(1e-9)
    ));
    out
}
