//! The `onekv` command: one binary for the server, local clusters, data and admin commands, and
//! benchmarks. This file only parses the command line and hands each subcommand to its module.

mod bench_cmd;
mod bench_log;
mod bench_recovery;
mod bench_wa;
mod client_cmd;
mod cluster_cmd;
mod node_cmd;
mod server_cmd;
mod shard_cmd;

use clap::{Parser, Subcommand};

/// onekv: a replicated key-value store.
#[derive(Debug, Parser)]
#[command(name = "onekv", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Runs one node.
    Server(server_cmd::Args),
    /// Runs a local cluster of nodes on 127.0.0.1 (child processes), with its data under one directory.
    #[command(subcommand)]
    Cluster(cluster_cmd::ClusterCommand),
    /// Adds, removes or replaces a node of the cluster; moves replicas off a node or onto one.
    #[command(subcommand)]
    Node(node_cmd::NodeCommand),
    /// Moves a shard's replicas between the nodes of a running cluster.
    #[command(subcommand)]
    Shard(shard_cmd::ShardCommand),
    /// Data and admin commands against a running cluster.
    #[command(flatten)]
    Client(client_cmd::ClientCommand),
    /// Measures group-committed log appends against plain write+fdatasync baselines on the same
    /// file system, and prints a markdown table.
    BenchLog(bench_log::Args),
    /// Measures write amplification (bytes written to disk per user byte, per replica) of the
    /// storage modes side by side, with in-process replicas, and prints a markdown table.
    BenchWa(bench_wa::Args),
    /// Measures the restart of a node holding many shards after SIGKILL under a skewed load:
    /// recovery per shard (each replays what its own index lacks) against a full replay, on copies
    /// of the same data, and prints a markdown report.
    BenchRecovery(bench_recovery::Args),
    /// YCSB-style benchmarks: `ycsb` against a running cluster, `compare` of storage modes on
    /// fresh local clusters.
    #[command(subcommand)]
    Bench(bench_cmd::BenchCommand),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Server(args) => server_cmd::run(args),
        Command::Cluster(command) => cluster_cmd::run(command),
        Command::Node(command) => node_cmd::run(command),
        Command::Shard(command) => shard_cmd::run(command),
        Command::Client(command) => client_cmd::run(command),
        Command::BenchLog(args) => bench_log::run(&args),
        Command::BenchWa(args) => bench_wa::run(&args),
        Command::BenchRecovery(args) => bench_recovery::run(&args),
        Command::Bench(command) => bench_cmd::run(command),
    }
}
