//! The `onekv` command: one binary for the server, local clusters, data and admin commands, and
//! benchmarks. This file only parses the command line and hands each subcommand to its module.

mod bench_log;

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
    /// Measures group-committed log appends against plain write+fdatasync baselines on the same
    /// file system, and prints a markdown table.
    BenchLog(bench_log::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::BenchLog(args) => bench_log::run(&args),
    }
}
