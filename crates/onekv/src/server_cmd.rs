//! `onekv server`: runs one node from a configuration file and flags.
//!
//! Owns the process around a node: logging to stderr, the Tokio runtime, turning SIGINT/SIGTERM
//! into a graceful stop, and merging flags over the file. The node itself is
//! [`onekv_server::serve`].

use std::path::PathBuf;

use anyhow::Context as _;
use onekv_server::ServerConfig;
use onekv_server::config::{LogFormat, StorageMode, parse_members};
use tokio::signal::unix::{SignalKind, signal};

/// Flags of `onekv server`. Flags override the configuration file; without `--config` they must
/// give at least `--node-id`, `--listen`, `--data-dir` and `--members`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Configuration file (TOML; see docs/config-example.toml).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// This node's id (one of --members).
    #[arg(long, value_name = "ID")]
    node_id: Option<u64>,
    /// Address to serve clients and peers on.
    #[arg(long, value_name = "HOST:PORT")]
    listen: Option<String>,
    /// Directory of the node's data.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Storage mode (fixed when the data directory is created).
    #[arg(long, value_parser = ["onelog", "separated", "classic"])]
    storage: Option<String>,
    /// Every voting member, this node included.
    #[arg(long, value_name = "ID=HOST:PORT,...")]
    members: Option<String>,
    /// Join a running cluster: at the first start, copy its map and member list from one of the
    /// other --members (nodes of that cluster), and hold no shard until `onekv node add` adds
    /// this node.
    #[arg(long)]
    join: bool,
    /// File holding the cluster secret (hex, the same on every member), required with other
    /// members: peers prove they belong to the cluster with it.
    #[arg(long, value_name = "FILE")]
    peer_secret_file: Option<PathBuf>,
    /// Address of the HTTP endpoint: metrics at /metrics, the status page at / [default: off].
    #[arg(long, value_name = "HOST:PORT")]
    http_listen: Option<String>,
    /// Address to serve the Redis protocol (RESP2/RESP3) on, for redis-cli and Redis clients.
    #[arg(long, value_name = "HOST:PORT")]
    resp_listen: Option<String>,
    /// Log filter: a level (error, warn, info, debug, trace) or a filter such as
    /// `onekv_server=debug,info` [default: $RUST_LOG, else the file's log_level, else info].
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
    /// Log line format [default: the file's log_format, else text].
    #[arg(long, value_parser = ["text", "json"])]
    log_format: Option<String>,
    /// Stop when the process with this id (the `onekv cluster` that started this node) is gone.
    #[arg(long, value_name = "PID", hide = true)]
    parent_pid: Option<i32>,
}

impl Args {
    /// The configuration: the file (if any) with the flags applied over it.
    fn config(&self) -> anyhow::Result<ServerConfig> {
        let mut config = match &self.config {
            Some(path) => ServerConfig::load(path)?,
            None => ServerConfig::default(),
        };
        if let Some(node_id) = self.node_id {
            config.node_id = node_id;
        }
        if let Some(listen) = &self.listen {
            config.listen = listen.clone();
        }
        if let Some(data_dir) = &self.data_dir {
            config.data_dir = data_dir.clone();
        }
        if let Some(storage) = &self.storage {
            config.storage =
                StorageMode::parse(storage).with_context(|| format!("unknown storage mode {storage:?}"))?;
        }
        if let Some(members) = &self.members {
            config.members = parse_members(members)?;
        }
        if self.join {
            config.join = true;
        }
        if let Some(peer_secret_file) = &self.peer_secret_file {
            config.peer_secret_file = Some(peer_secret_file.clone());
        }
        if let Some(http_listen) = &self.http_listen {
            config.http_listen = Some(http_listen.clone());
        }
        if let Some(resp_listen) = &self.resp_listen {
            config.resp_listen = Some(resp_listen.clone());
        }
        if let Some(format) = &self.log_format {
            config.log_format = if format == "json" { LogFormat::Json } else { LogFormat::Text };
        }
        config.validate().with_context(|| match &self.config {
            Some(path) => format!("in {} with the flags applied", path.display()),
            None => "from the flags (no --config)".to_string(),
        })?;
        Ok(config)
    }
}

/// Runs the server until SIGINT or SIGTERM, then stops it gracefully. A second SIGINT exits at once.
pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(parent) = args.parent_pid {
        exit_with_parent(parent)?;
    }
    // The configuration names the log level and format, so it is read first; its errors are
    // returned (and printed by main), not logged.
    let config = args.config()?;
    init_logging(args.log_level.as_deref(), config.log_level.as_deref(), config.log_format)?;
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all().thread_name("onekv-server");
    if let Some(threads) = config.worker_threads {
        // Validated: 1..=1024.
        runtime.worker_threads(threads as usize);
    }
    let runtime = runtime.build().context("cannot start the async runtime")?;
    runtime.block_on(async {
        let shutdown = shutdown_signal()?;
        onekv_server::serve(config, shutdown).await
    })
}

/// Logs to standard error. The filter is the `--log-level` flag, else `RUST_LOG`, else the file's
/// `log_level`, else `info`.
fn init_logging(flag: Option<&str>, file: Option<&str>, format: LogFormat) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    let filter = match flag {
        Some(level) => EnvFilter::try_new(level).with_context(|| format!("invalid --log-level {level:?}"))?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(file.unwrap_or("info"))),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Json => builder.json().try_init(),
        // No colour codes in log files (`onekv cluster start` sends stderr to server.log).
        LogFormat::Text => builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).try_init(),
    };
    installed.map_err(|error| anyhow::anyhow!("cannot set up logging: {error}"))
}

/// Asks the kernel to send this process SIGTERM (a graceful stop) when its parent dies, so nodes of
/// `onekv cluster start` never outlive it, even if it is killed with SIGKILL.
fn exit_with_parent(parent: i32) -> anyhow::Result<()> {
    use rustix::process::{Signal, getppid, set_parent_process_death_signal};
    set_parent_process_death_signal(Some(Signal::TERM)).context("cannot set the parent-death signal")?;
    // The parent may have died before the call above; then no signal will ever come.
    if getppid().map(|pid| pid.as_raw_pid()) != Some(parent) {
        anyhow::bail!("the parent process {parent} is gone; not starting");
    }
    Ok(())
}

/// Completes on the first SIGINT or SIGTERM. After it, a second SIGINT (a person pressing Ctrl-C
/// again) exits at once; further SIGTERMs are ignored, because supervisors and tools such as
/// `timeout` may deliver one SIGTERM twice (to the process and to its group).
fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()>> {
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    Ok(async move {
        let name = tokio::select! {
            _ = interrupt.recv() => "SIGINT",
            _ = terminate.recv() => "SIGTERM",
        };
        tracing::info!("received {name}; stopping gracefully (press Ctrl-C again to exit at once)");
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = interrupt.recv() => break,
                    _ = terminate.recv() => tracing::info!("received SIGTERM again; still stopping"),
                }
            }
            eprintln!("second SIGINT: exiting without waiting");
            std::process::exit(130);
        });
    })
}
