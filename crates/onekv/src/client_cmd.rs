//! Data and admin subcommands (`put`, `get`, `delete`, `scan`, `cas`, `status`) over the client library.

/// The client subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ClientCommand {}

/// Runs one client subcommand.
pub fn run(command: ClientCommand) -> anyhow::Result<()> {
    match command {}
}
