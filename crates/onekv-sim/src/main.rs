//! `onekv-sim`: runs many seeds of the deterministic simulation (a soak), or replays one.
//!
//! ```text
//! cargo run --release -p onekv-sim -- --seeds 1000            # seeds 0..1000
//! cargo run --release -p onekv-sim -- --seed 4242 --verbose   # replay one seed
//! cargo run --release -p onekv-sim -- --nodes 5 --shards 8     # 8 shards, 3 replicas each
//! cargo run --release -p onekv-sim -- --nodes 4 --member-changes # replicas move between nodes
//! ```
//!
//! Exits with 1 if any run found a violation, after printing each failing seed.

use clap::Parser;
use onekv_replica::StorageMode;
use onekv_sim::{Bug, SimConfig};
use std::time::Instant;

#[derive(Parser)]
#[command(about = "Deterministic simulation of a onekv cluster: many seeds, or one replayed")]
struct Args {
    /// Replay exactly this seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Number of seeds to run (from --first).
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Simulated milliseconds of workload and faults per run.
    #[arg(long, default_value_t = 4_000)]
    run_ms: u64,
    /// Nodes in the simulated cluster.
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// Shards (Raft groups) the keys are split into; every node's shards share its one log.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Replicas of each shard (default: 3, or every node when there are fewer).
    #[arg(long)]
    replicas: Option<u32>,
    /// Keys the clients share (few, so operations contend).
    #[arg(long, default_value_t = 8)]
    keys: u32,
    /// Concurrent clients, each with at most one operation open.
    #[arg(long, default_value_t = 4)]
    clients: u32,
    /// The nemesis acts every LOW..HIGH simulated milliseconds (a random time in the range).
    #[arg(long, default_value = "100..500")]
    fault_every_ms: String,
    /// Nodes that may be down at once.
    #[arg(long, default_value_t = 1)]
    max_down: usize,
    /// Storage mode: onelog, separated or classic.
    #[arg(long, default_value = "onelog")]
    storage: String,
    /// Run the broken variant whose disk acknowledges fsyncs without making data durable.
    #[arg(long)]
    bug_ack_before_fsync: bool,
    /// Run the broken variant that serves reads without ReadIndex.
    #[arg(long)]
    bug_reads_without_read_index: bool,
    /// Run the broken variant whose log GC deletes a segment before the moved values' new
    /// locators are durable.
    #[arg(long)]
    bug_gc_reclaims_before_flush: bool,
    /// One in this many crashes also wipes the node's disks (0: none do).
    #[arg(long, default_value_t = 4)]
    wipe_one_in: u32,
    /// Run the broken variant whose replicas vote at once after their disks were wiped.
    #[arg(long)]
    bug_votes_while_rejoining: bool,
    /// The nemesis also changes shards' members (every node holds a replica of every shard).
    #[arg(long)]
    member_changes: bool,
    /// Run the broken variant whose restarted nodes forget every membership change.
    #[arg(long)]
    bug_members_from_config: bool,
    /// Run the broken variant whose replicas, added again to a node that removed them, take up
    /// the removed replica's trees (implies --member-changes).
    #[arg(long)]
    bug_reused_trees: bool,
    /// Run the broken variant whose replicas delete every key the leader's expiry sweep names,
    /// without checking that it is still expired.
    #[arg(long)]
    bug_unchecked_expiry_deletes: bool,
    /// Run the broken variant whose deduplication trusts a fingerprint match without comparing
    /// bytes (implies --dedup).
    #[arg(long)]
    bug_dedup_trusts_fingerprint: bool,
    /// Run the broken variant whose leaders put values by reference to keys that entries they
    /// proposed and have not applied yet write (implies --dedup).
    #[arg(long)]
    bug_references_ignore_unapplied: bool,
    /// Run the broken variant whose log GC ignores deduplicated keys when it reads a segment
    /// whole and fences nothing off (implies --dedup).
    #[arg(long)]
    bug_gc_ignores_shared_values: bool,
    /// Run the broken variant whose range deletions find their keys in the index as the batch
    /// being applied began (implies --range-deletes).
    #[arg(long)]
    bug_range_page_reads_batch_start: bool,
    /// Run the broken variant whose snapshot installs resolve a key sent as a reference to an
    /// earlier key's copy by reading that key as it was before the snapshot (implies --dedup).
    #[arg(long)]
    bug_install_references_as_published: bool,
    /// The odd nodes answer reads they lead by a read lease (raft.lease_reads).
    #[arg(long)]
    lease_reads: bool,
    /// Run the broken variant whose read leases last as long as the node leads, whatever the
    /// time (implies --lease-reads).
    #[arg(long)]
    bug_lease_ignores_time: bool,
    /// Nodes take fast writes and the odd clients send their blind writes that way (one round
    /// trip to every voter, the Raft path with the same id when that does not complete).
    #[arg(long)]
    fast_path: bool,
    /// Run the broken variant whose fast-path clients count a write done on a majority of the
    /// voters instead of a fast quorum (implies --fast-path).
    #[arg(long)]
    bug_fast_counts_majority: bool,
    /// Run the broken variant that applies an ORDER's fast writes even when the window says
    /// they were applied (implies --fast-path).
    #[arg(long)]
    bug_order_skips_window: bool,
    /// Run the broken variant whose new leaders recover fast writes from their own pending set
    /// only, without gathering a majority's (implies --fast-path; caught with --nodes 5
    /// --replicas 5, where a write is done on 4 of 5).
    #[arg(long)]
    bug_fast_recovers_without_gather: bool,
    /// Make half the workload's deletes range deletions of up to 4 consecutive keys.
    #[arg(long)]
    range_deletes: bool,
    /// Leave out the workload's puts of keys that expire.
    #[arg(long)]
    no_expiring_puts: bool,
    /// Release a group's Ready as soon as its snapshot is installed, instead of holding it for
    /// some turns as an install thread would.
    #[arg(long)]
    no_held_installs: bool,
    /// Deduplicate values (a mode per node, short fingerprints on some) with a workload whose
    /// values often recur.
    #[arg(long)]
    dedup: bool,
    /// Run every seed twice and fail if the two runs differ (determinism check).
    #[arg(long)]
    twice: bool,
    /// Print every run's report line, and the history of failing runs.
    #[arg(long)]
    verbose: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.nodes >= 1, "--nodes must be at least 1");
    let storage = StorageMode::parse(&args.storage).ok_or_else(|| {
        anyhow::anyhow!("unknown storage mode {:?} (onelog, separated or classic)", args.storage)
    })?;
    let replicas = args.replicas.unwrap_or(3.min(args.nodes as u32));
    anyhow::ensure!(
        (1..=args.nodes).contains(&u64::from(replicas)),
        "--replicas must be between 1 and --nodes"
    );
    anyhow::ensure!(args.keys >= 1, "--keys must be at least 1");
    // Keys are stored as `key-NNN`: past 1000 their byte order is no longer their numbers' order,
    // which a range of consecutive keys relies on.
    anyhow::ensure!(
        args.keys <= 1000 || !(args.range_deletes || args.bug_range_page_reads_batch_start),
        "--range-deletes needs --keys 1000 or fewer"
    );
    let fault_interval_ms = args
        .fault_every_ms
        .split_once("..")
        .and_then(|(low, high)| Some((low.parse::<u64>().ok()?, high.parse::<u64>().ok()?)))
        .filter(|(low, high)| 0 < *low && low <= high)
        .ok_or_else(|| anyhow::anyhow!("--fault-every-ms must be LOW..HIGH with 0 < LOW <= HIGH"))?;
    let config = SimConfig {
        run_ms: args.run_ms,
        nodes: args.nodes,
        shards: args.shards,
        replicas,
        keys: args.keys,
        clients: args.clients,
        max_down: args.max_down,
        fault_interval_ms,
        wipe_one_in: args.wipe_one_in,
        storage,
        member_changes: args.member_changes || args.bug_members_from_config || args.bug_reused_trees,
        expiring_puts: !args.no_expiring_puts,
        held_installs: !args.no_held_installs,
        lease_reads: args.lease_reads || args.bug_lease_ignores_time,
        fast_path: args.fast_path
            || args.bug_fast_counts_majority
            || args.bug_order_skips_window
            || args.bug_fast_recovers_without_gather,
        dedup: args.dedup
            || args.bug_dedup_trusts_fingerprint
            || args.bug_references_ignore_unapplied
            || args.bug_gc_ignores_shared_values
            || args.bug_install_references_as_published,
        range_deletes: args.range_deletes || args.bug_range_page_reads_batch_start,
        bug: if args.bug_ack_before_fsync {
            Some(Bug::AckBeforeFsync)
        } else if args.bug_reads_without_read_index {
            Some(Bug::ReadsWithoutReadIndex)
        } else if args.bug_gc_reclaims_before_flush {
            Some(Bug::GcReclaimsBeforeFlush)
        } else if args.bug_votes_while_rejoining {
            Some(Bug::VotesWhileRejoining)
        } else if args.bug_members_from_config {
            Some(Bug::MembersFromConfig)
        } else if args.bug_reused_trees {
            Some(Bug::ReplicaReusesRetiredTrees)
        } else if args.bug_unchecked_expiry_deletes {
            Some(Bug::DeletesExpiredUnchecked)
        } else if args.bug_dedup_trusts_fingerprint {
            Some(Bug::DedupTrustsFingerprint)
        } else if args.bug_references_ignore_unapplied {
            Some(Bug::ReferencesIgnoreUnapplied)
        } else if args.bug_gc_ignores_shared_values {
            Some(Bug::GcIgnoresSharedValues)
        } else if args.bug_range_page_reads_batch_start {
            Some(Bug::RangePageReadsBatchStart)
        } else if args.bug_install_references_as_published {
            Some(Bug::InstallResolvesReferencesAsPublished)
        } else if args.bug_lease_ignores_time {
            Some(Bug::LeaseIgnoresTime)
        } else if args.bug_fast_counts_majority {
            Some(Bug::FastCountsMajority)
        } else if args.bug_order_skips_window {
            Some(Bug::OrderSkipsWindow)
        } else if args.bug_fast_recovers_without_gather {
            Some(Bug::FastRecoversWithoutGather)
        } else {
            None
        },
        ..SimConfig::default()
    };
    let seeds: Vec<u64> = match args.seed {
        Some(seed) => vec![seed],
        None => (args.first..args.first + args.seeds).collect(),
    };
    let started = Instant::now();
    let (mut failed, mut ops, mut unknown) = (Vec::new(), 0usize, 0usize);
    let (mut snapshots, mut recoveries) = (0u64, 0u64);
    let mut faults = std::collections::BTreeMap::new();
    for (done, &seed) in seeds.iter().enumerate() {
        let mut report = onekv_sim::run(seed, &config)?;
        if args.twice {
            let again = onekv_sim::run(seed, &config)?;
            if again.digest != report.digest || again.history != report.history {
                report.violations.push(format!(
                    "not deterministic: the replay's digest is {:016x} (history {} the same)",
                    again.digest,
                    if again.history == report.history { "is" } else { "is NOT" }
                ));
            }
        }
        ops += report.ops;
        unknown += report.unknown;
        snapshots += report.snapshots;
        recoveries += report.recoveries;
        for (kind, count) in &report.faults {
            *faults.entry(*kind).or_insert(0u64) += count;
        }
        if !report.violations.is_empty() {
            println!("FAILED {}", report.summary());
            if args.verbose {
                for op in &report.history {
                    println!("  {op:?}");
                }
            }
            failed.push(seed);
        } else if args.verbose {
            println!("{}", report.summary());
        }
        if (done + 1) % 10 == 0 || done + 1 == seeds.len() {
            eprintln!(
                "{}/{} seeds, {} failed, {:.0} s",
                done + 1,
                seeds.len(),
                failed.len(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    let faults: Vec<String> = faults.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!(
        "{} seeds, {ops} operations checked ({unknown} unanswered writes), {recoveries} recoveries, \
         {snapshots} snapshots sent, faults [{}], {} violations{}",
        seeds.len(),
        faults.join(" "),
        failed.len(),
        if failed.is_empty() { String::new() } else { format!(": seeds {failed:?}") }
    );
    if !failed.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}
