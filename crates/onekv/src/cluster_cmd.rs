//! `onekv cluster ...`: a local cluster of `onekv server` child processes.

/// The cluster subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ClusterCommand {}

/// Runs one cluster subcommand.
pub fn run(command: ClusterCommand) -> anyhow::Result<()> {
    match command {}
}
