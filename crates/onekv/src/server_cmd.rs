//! `onekv server`: runs one node from a configuration file and flags.

/// Flags of `onekv server`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs the server until it is told to stop.
pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("not built yet")
}
