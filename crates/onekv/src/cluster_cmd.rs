//! `onekv cluster ...`: a local cluster of `onekv server` child processes.
//!
//! Owns the cluster's directory layout (`DIR/cluster.secret` holds the cluster secret the nodes
//! authenticate each other with, generated once, mode 0600; `DIR/nodeI/` holds node I's
//! `onekv.toml`, its `server.log` and its data in `data/`), writing those configurations on first
//! start and checking them on restart, and
//! the lifetime of the children: they are stopped (SIGTERM, then SIGKILL after 10 s) on every exit
//! path of this process, including errors and panics (a drop guard), and each child also asks the
//! kernel for SIGTERM should this process die without running its guard (`--parent-pid`).
//! Does not own the node itself (`onekv server`) nor talking to it (the client commands).

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use onekv_server::config::{MemberConfig, StorageMode};
use onekv_server::{PeerSecret, ServerConfig};
use tokio::signal::unix::{SignalKind, signal};

/// The name of each node's configuration file inside its directory.
const CONFIG_FILE: &str = "onekv.toml";
/// The name of the cluster secret file inside the cluster directory.
const SECRET_FILE: &str = "cluster.secret";
/// The name of each node's log (its stdout and stderr) inside its directory.
const LOG_FILE: &str = "server.log";
/// The default `--http-base-port` is this far above `--base-port`.
const HTTP_PORT_OFFSET: u16 = 2000;
/// How long a node gets to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `start` waits for every node to accept connections before saying so.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// Node 1's RESP port unless `--resp-base-port` says otherwise: Redis's own default.
const DEFAULT_RESP_BASE_PORT: u16 = 6379;
/// How often children are checked for having exited.
const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// The cluster subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ClusterCommand {
    /// Starts a local cluster (or restarts it on its existing data) and runs it until Ctrl-C.
    Start(StartArgs),
}

/// Flags of `onekv cluster start`.
#[derive(Debug, clap::Args)]
pub struct StartArgs {
    /// Number of nodes (each a voting member).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=99))]
    nodes: u64,
    /// Directory holding one subdirectory per node (`node1`, `node2`, ...).
    #[arg(long, default_value = "./onekv-data")]
    dir: PathBuf,
    /// Node I listens on 127.0.0.1:(BASE_PORT + I).
    #[arg(long, default_value_t = 7000)]
    base_port: u16,
    /// Storage mode of every node (fixed when the cluster is created).
    #[arg(long, default_value = "onelog", value_parser = ["onelog", "separated", "classic"])]
    storage: String,
    /// Shards the key space is split into, each its own Raft group with its leaders spread over
    /// the nodes (fixed when the cluster is created; 1 is a single Raft group) [default: 16].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    shards: Option<u32>,
    /// Replicas of each shard, on distinct nodes (fixed when the cluster is created)
    /// [default: 3, or every node when there are fewer].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=7))]
    replicas: Option<u32>,
    /// Spare nodes to start besides the members: nodes --nodes+1 .. --nodes+SPARES, empty and
    /// outside the cluster until `onekv node add` adds them (they start with `join`). Their
    /// configurations are kept like the others', so give the same --spares on restart.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=16))]
    spares: u64,
    /// Node I serves its metrics and status page on http://127.0.0.1:(HTTP_BASE_PORT + I)/
    /// (unless its onekv.toml sets http_listen); 0 turns HTTP off [default: --base-port + 2000,
    /// so 9000 with the default --base-port, and two clusters on different base ports never clash].
    #[arg(long, value_name = "PORT")]
    http_base_port: Option<u16>,
    /// Node I serves the Redis protocol on 127.0.0.1:(RESP_BASE_PORT + I - 1), so node 1 is on
    /// Redis's default port and `redis-cli` works as is (unless its onekv.toml sets resp_listen);
    /// 0 turns RESP off. Without this flag a busy port (a Redis server running, say) only turns
    /// RESP off for that node, with a note; with it, a busy port is an error [default: 6379].
    #[arg(long, value_name = "PORT")]
    resp_base_port: Option<u16>,
}

/// Runs one cluster subcommand.
pub fn run(command: ClusterCommand) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Start(args) => start(&args),
    }
}

/// One node of the plan: its id, directory and configuration.
struct PlannedNode {
    id: u64,
    dir: PathBuf,
    config_path: PathBuf,
    /// The file's configuration, with `http_flag` applied.
    config: ServerConfig,
    /// `--http-listen` for the child, when the HTTP address comes from `--http-base-port`.
    http_flag: Option<String>,
    /// `--resp-listen` for the child, when the RESP address comes from `--resp-base-port`.
    resp_flag: Option<String>,
    /// `--peer-secret-file` for the child, when its file names none (written before secrets).
    secret_flag: Option<PathBuf>,
}

fn start(args: &StartArgs) -> anyhow::Result<()> {
    let storage = StorageMode::parse(&args.storage).context("unknown storage mode")?;
    fs::create_dir_all(&args.dir).with_context(|| format!("cannot create {}", args.dir.display()))?;
    let shape = Shape { storage, shards: args.shards, replicas: args.replicas };
    let mut nodes = plan_shaped(&args.dir, args.nodes, args.base_port, shape)?;
    let spares = plan_spares(&args.dir, &nodes[0].config, args.nodes, args.spares, args.base_port)?;
    nodes.extend(spares);
    let http_base_port = match args.http_base_port {
        Some(port) => port,
        None => args.base_port.checked_add(HTTP_PORT_OFFSET).with_context(|| {
            format!(
                "--base-port {} + {HTTP_PORT_OFFSET} is past 65535; give --http-base-port",
                args.base_port
            )
        })?,
    };
    set_http_ports(&mut nodes, http_base_port)?;
    set_resp_ports(&mut nodes, args.resp_base_port.unwrap_or(DEFAULT_RESP_BASE_PORT))?;
    if args.resp_base_port.is_none() {
        skip_busy_default_resp_ports(&mut nodes);
    }
    for node in &nodes {
        check_port_free(node, &args.dir)?;
    }

    // Signals are taken over before any child exists, so Ctrl-C always goes through the guard.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start a runtime")?;
    let (mut interrupt, mut terminate) = runtime.block_on(async {
        anyhow::Ok((
            signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
            signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
        ))
    })?;

    let exe = std::env::current_exe().context("cannot find the onekv executable")?;
    let mut children = Children::default();
    for node in &nodes {
        // Spawned from this (the main) thread: the children's parent-death signal fires when the
        // thread that forked them exits, and the main thread lives as long as the process.
        children.spawn(&exe, node)?;
    }

    let endpoints: Vec<&str> =
        nodes.iter().filter(|node| !node.config.join).map(|node| node.config.listen.as_str()).collect();
    let endpoints = endpoints.join(",");
    let cluster = &nodes[0].config;
    println!(
        "onekv cluster of {} nodes, {} shards of {} replicas (storage {}) in {}",
        args.nodes,
        cluster.cluster.shards,
        cluster.replication_factor(),
        storage.name(),
        args.dir.display()
    );
    for node in &nodes {
        let spare = if node.config.join { " (spare: joins with `onekv node add ADDR`)" } else { "" };
        println!(
            "  node {}: {}{spare}   log: {}",
            node.id,
            node.config.listen,
            node.dir.join(LOG_FILE).display()
        );
    }
    let status_pages: Vec<String> = nodes
        .iter()
        .filter_map(|node| node.config.http_listen.as_ref())
        .map(|a| format!("http://{a}/"))
        .collect();

    let outcome = runtime.block_on(async {
        tokio::select! {
            () = wait_until_ready(&nodes, &mut children) => {}
            _ = interrupt.recv() => return Ok("SIGINT"),
            _ = terminate.recv() => return Ok("SIGTERM"),
        }
        println!("Use it with:");
        println!("  onekv status --endpoints {endpoints}");
        println!("  (or: export ONEKV_ENDPOINTS={endpoints})");
        for (node, resp) in nodes.iter().filter_map(|node| Some((node.id, node.config.resp_listen.as_ref()?)))
        {
            let port = resp.rsplit_once(':').map_or("", |(_, port)| port);
            println!("  redis-cli -p {port}   (node {node}, Redis protocol)");
        }
        if let Some(first) = status_pages.first() {
            println!("Status page: {first}   (Prometheus metrics: {first}metrics on every node:");
            println!("  {})", status_pages.join(" "));
        }
        println!("Press Ctrl-C to stop the cluster.");
        loop {
            tokio::select! {
                _ = interrupt.recv() => return Ok("SIGINT"),
                _ = terminate.recv() => return Ok("SIGTERM"),
                () = tokio::time::sleep(POLL_INTERVAL) => {}
            }
            children.report_exits();
            if children.all_exited() {
                bail!("every node has exited; see their logs above");
            }
        }
    });
    if let Ok(signal) = &outcome {
        println!("{signal}: stopping the nodes");
    }
    children.stop_all();
    outcome.map(|_| ())
}

/// The configuration of each node: reused from `DIR/nodeI/onekv.toml` if the cluster was started
/// before (and checked against the flags), written otherwise.
/// [`plan_shaped`] with the default shards and replicas.
#[cfg(test)]
fn plan(dir: &Path, count: u64, base_port: u16, storage: StorageMode) -> anyhow::Result<Vec<PlannedNode>> {
    plan_shaped(dir, count, base_port, Shape { storage, shards: None, replicas: None })
}

/// What a cluster is made of beyond its nodes: fixed when it is created.
#[derive(Clone, Copy, Debug)]
struct Shape {
    storage: StorageMode,
    /// `None`: the configuration's default when created, whatever it was when restarted.
    shards: Option<u32>,
    /// As `shards`.
    replicas: Option<u32>,
}

fn plan_shaped(dir: &Path, count: u64, base_port: u16, shape: Shape) -> anyhow::Result<Vec<PlannedNode>> {
    let storage = shape.storage;
    if let Some(replicas) = shape.replicas
        && u64::from(replicas) > count
    {
        bail!(
            "--replicas {replicas} is more than --nodes {count}: each replica of a shard needs its own node"
        );
    }
    if u64::from(base_port) + count > u64::from(u16::MAX) {
        bail!("--base-port {base_port} + --nodes {count} is past the last port 65535");
    }
    let node_dir = |id: u64| dir.join(format!("node{id}"));
    let existing: Vec<u64> = (1..=count).filter(|&id| node_dir(id).join(CONFIG_FILE).exists()).collect();
    if existing.is_empty() {
        cluster_secret(dir)?;
        let members: Vec<MemberConfig> = (1..=count)
            .map(|id| MemberConfig { id, address: format!("127.0.0.1:{}", u64::from(base_port) + id) })
            .collect();
        let mut nodes = Vec::new();
        for member in &members {
            let config = ServerConfig {
                node_id: member.id,
                listen: member.address.clone(),
                // Relative to the file, so the cluster directory can be moved or renamed. A
                // subdirectory, because the replica refuses a non-empty directory it did not create
                // (this one holds the configuration and the log).
                data_dir: PathBuf::from("data"),
                // Relative to the file too: the one secret of the cluster directory.
                peer_secret_file: Some(Path::new("..").join(SECRET_FILE)),
                storage,
                members: members.clone(),
                cluster: onekv_server::config::ClusterConfig {
                    shards: shape.shards.unwrap_or(onekv_placement::DEFAULT_SHARDS),
                    replicas: shape.replicas,
                    // A new cluster: a key has one shard in every Redis database.
                    key_hashing: onekv_server::config::KeyHashingName::DatabaseBlind,
                    ..onekv_server::config::ClusterConfig::default()
                },
                // The nodes share this machine's cores.
                worker_threads: Some(onekv_server::config::worker_threads_sharing_cores(count)),
                ..ServerConfig::default()
            };
            let dir = node_dir(member.id);
            fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
            let config_path = dir.join(CONFIG_FILE);
            write_config(&config_path, &config)?;
            let config = ServerConfig::load(&config_path)?;
            nodes.push(PlannedNode {
                id: member.id,
                dir,
                config_path,
                config,
                http_flag: None,
                resp_flag: None,
                secret_flag: None,
            });
        }
        return Ok(nodes);
    }
    if existing.len() as u64 != count {
        let missing: Vec<String> =
            (1..=count).filter(|id| !existing.contains(id)).map(|id| format!("node{id}")).collect();
        bail!(
            "{} holds configurations for some nodes but not for {}; a cluster cannot be partly \
             recreated. Use the --nodes it was created with, or a fresh --dir",
            dir.display(),
            missing.join(", ")
        );
    }
    let mut nodes = Vec::new();
    for id in 1..=count {
        let dir = node_dir(id);
        let config_path = dir.join(CONFIG_FILE);
        let mut config = ServerConfig::load(&config_path)?;
        // A cluster created before nodes authenticated each other: give it a secret now, through
        // the flag, so its files (and any edits in them) stay as they are.
        let mut secret_flag = None;
        if config.peer_secret_file.is_none() && config.members.len() > 1 {
            let path = cluster_secret(dir.parent().unwrap_or(Path::new(".")))?;
            config.peer_secret_file = Some(path.clone());
            secret_flag = Some(path);
        }
        config.validate().with_context(|| format!("in {}", config_path.display()))?;
        check_existing(&config_path, &config, id, count, storage)?;
        check_shape(&config_path, &config, shape)?;
        if let Some(first) = nodes.first().map(|node: &PlannedNode| &node.config)
            && first.members != config.members
        {
            bail!(
                "{} and {} list different members; fix them or use a fresh --dir",
                node_dir(1).join(CONFIG_FILE).display(),
                config_path.display()
            );
        }
        nodes.push(PlannedNode {
            id,
            dir,
            config_path,
            config,
            http_flag: None,
            resp_flag: None,
            secret_flag,
        });
    }
    if nodes.iter().any(|node| node.secret_flag.is_some()) {
        println!(
            "note: the configurations in {} name no peer_secret_file; the nodes use {} (add \
             peer_secret_file = \"../{SECRET_FILE}\" to each onekv.toml to make it permanent)",
            dir.display(),
            dir.join(SECRET_FILE).display()
        );
    }
    let expected_port = u64::from(base_port) + 1;
    if !nodes[0].config.listen.ends_with(&format!(":{expected_port}")) {
        println!(
            "note: reusing the existing configurations in {}; their addresses win over --base-port",
            dir.display()
        );
    }
    Ok(nodes)
}

/// The spare nodes `first + 1 ..= first + count`: configured to join the cluster `member` (a
/// member's configuration) belongs to, reused from their files if they exist.
fn plan_spares(
    dir: &Path,
    member: &ServerConfig,
    first: u64,
    count: u64,
    base_port: u16,
) -> anyhow::Result<Vec<PlannedNode>> {
    let mut spares = Vec::new();
    for id in first + 1..=first + count {
        let node_dir = dir.join(format!("node{id}"));
        let config_path = node_dir.join(CONFIG_FILE);
        let config = if config_path.exists() {
            let config = ServerConfig::load(&config_path)?;
            if config.node_id != id {
                bail!(
                    "{} is for node {} but lives in the directory of node {id}",
                    config_path.display(),
                    config.node_id
                );
            }
            config
        } else {
            let port = u64::from(base_port) + id;
            if port > u64::from(u16::MAX) {
                bail!("--base-port {base_port} + node id {id} is past the last port 65535");
            }
            let address = format!("127.0.0.1:{port}");
            let mut members = member.members.clone();
            members.push(MemberConfig { id, address: address.clone() });
            let config = ServerConfig {
                node_id: id,
                listen: address,
                data_dir: PathBuf::from("data"),
                peer_secret_file: Some(Path::new("..").join(SECRET_FILE)),
                storage: member.storage,
                members,
                join: true,
                cluster: member.cluster.clone(),
                // Members and spares share this machine's cores.
                worker_threads: member
                    .worker_threads
                    .map(|_| onekv_server::config::worker_threads_sharing_cores(first + count)),
                ..ServerConfig::default()
            };
            fs::create_dir_all(&node_dir).with_context(|| format!("cannot create {}", node_dir.display()))?;
            write_config(&config_path, &config)?;
            ServerConfig::load(&config_path)?
        };
        spares.push(PlannedNode {
            id,
            dir: node_dir,
            config_path,
            config,
            http_flag: None,
            resp_flag: None,
            secret_flag: None,
        });
    }
    Ok(spares)
}

/// The cluster secret file `DIR/cluster.secret`: made (32 random bytes as hex, mode 0600) unless it
/// exists, checked if it does. Returns its path.
fn cluster_secret(dir: &Path) -> anyhow::Result<PathBuf> {
    let path = dir.join(SECRET_FILE);
    if path.exists() {
        PeerSecret::load(&path)?;
    } else {
        PeerSecret::generate().write_new(&path)?;
    }
    Ok(path)
}

/// Gives node I the HTTP address 127.0.0.1:(`base` + I) unless its file sets one; `base` 0: none
/// (beyond what the files set). Passed as `--http-listen` at spawn, not written to the files, so
/// a restart with another `--http-base-port` (or 0) takes effect.
fn set_http_ports(nodes: &mut [PlannedNode], base: u16) -> anyhow::Result<()> {
    if base == 0 {
        return Ok(());
    }
    for node in nodes.iter_mut().filter(|node| node.config.http_listen.is_none()) {
        let port = u64::from(base) + node.id;
        if port > u64::from(u16::MAX) {
            bail!("--http-base-port {base} + node id {} is past the last port 65535", node.id);
        }
        node.http_flag = Some(format!("127.0.0.1:{port}"));
        node.config.http_listen = node.http_flag.clone();
    }
    Ok(())
}

/// Gives node I the RESP address 127.0.0.1:(`base` + I - 1) unless its file sets one; `base` 0:
/// none (beyond what the files set). Passed as `--resp-listen` at spawn, like the HTTP address.
fn set_resp_ports(nodes: &mut [PlannedNode], base: u16) -> anyhow::Result<()> {
    if base == 0 {
        return Ok(());
    }
    for node in nodes.iter_mut().filter(|node| node.config.resp_listen.is_none()) {
        let port = u64::from(base) + node.id - 1;
        if port > u64::from(u16::MAX) {
            bail!("--resp-base-port {base} + node id {} - 1 is past the last port 65535", node.id);
        }
        node.resp_flag = Some(format!("127.0.0.1:{port}"));
        node.config.resp_listen = node.resp_flag.clone();
    }
    Ok(())
}

/// Turns RESP off, with a note, for each node whose default RESP port is taken: the Redis protocol
/// is an extra, and a Redis server already on 6379 should not stop a local cluster from starting.
fn skip_busy_default_resp_ports(nodes: &mut [PlannedNode]) {
    for node in nodes {
        let Some(address) = &node.resp_flag else { continue };
        if let Err(error) = TcpListener::bind(address) {
            println!(
                "note: node {}'s default RESP address {address} is not available ({error}); node {} runs \
                 without the Redis protocol (choose ports with --resp-base-port)",
                node.id, node.id
            );
            node.resp_flag = None;
            node.config.resp_listen = None;
        }
    }
}

/// Refuses an existing configuration whose shards or replicas disagree with flags given.
fn check_shape(path: &Path, config: &ServerConfig, shape: Shape) -> anyhow::Result<()> {
    let path = path.display();
    if let Some(shards) = shape.shards
        && shards != config.cluster.shards
    {
        bail!(
            "{path} describes a cluster of {} shards but --shards is {shards}; restart without --shards \
             or use a fresh --dir (a cluster's shards are fixed when it is created)",
            config.cluster.shards
        );
    }
    if let Some(replicas) = shape.replicas
        && replicas != config.replication_factor()
    {
        bail!(
            "{path} describes {} replicas per shard but --replicas is {replicas}; restart without \
             --replicas or use a fresh --dir",
            config.replication_factor()
        );
    }
    Ok(())
}

/// Refuses an existing configuration that disagrees with the flags.
fn check_existing(
    path: &Path,
    config: &ServerConfig,
    id: u64,
    count: u64,
    storage: StorageMode,
) -> anyhow::Result<()> {
    let path = path.display();
    if config.members.len() as u64 != count {
        bail!(
            "{path} describes a cluster of {} nodes but --nodes is {count}; restart with --nodes {} \
             or use a fresh --dir",
            config.members.len(),
            config.members.len()
        );
    }
    if config.storage != storage {
        bail!(
            "{path} uses storage {} but --storage is {}; restart with --storage {} or use a fresh --dir \
             (a data directory's storage mode is fixed)",
            config.storage.name(),
            storage.name(),
            config.storage.name()
        );
    }
    if config.node_id != id {
        bail!("{path} is for node {} but lives in the directory of node {id}", config.node_id);
    }
    Ok(())
}

/// Writes a configuration through a temporary file and a rename, so a crash never leaves half a
/// file that would block the next start.
fn write_config(path: &Path, config: &ServerConfig) -> anyhow::Result<()> {
    let text = format!(
        "# Written by `onekv cluster start`; edit it to tune this node (see docs/config-example.toml).\n\
         # A relative data_dir is resolved against this file's directory.\n\n{}",
        config.to_toml()
    );
    let temporary = path.with_extension("toml.tmp");
    fs::write(&temporary, text).with_context(|| format!("cannot write {}", temporary.display()))?;
    fs::rename(&temporary, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Fails clearly when a node's port is taken (usually: the cluster is already running).
fn check_port_free(node: &PlannedNode, dir: &Path) -> anyhow::Result<()> {
    if let Err(error) = TcpListener::bind(&node.config.listen) {
        bail!(
            "node {}'s address {} is not available ({error}); is a cluster already running in {}? \
             Stop it, or choose another --base-port with a fresh --dir",
            node.id,
            node.config.listen,
            dir.display()
        );
    }
    if let Some(http) = &node.config.http_listen
        && let Err(error) = TcpListener::bind(http)
    {
        bail!(
            "node {}'s HTTP address {http} is not available ({error}); choose another --http-base-port \
             (0 turns HTTP off)",
            node.id
        );
    }
    if let Some(resp) = &node.config.resp_listen
        && let Err(error) = TcpListener::bind(resp)
    {
        bail!(
            "node {}'s RESP address {resp} is not available ({error}); is a Redis server running? Choose \
             another --resp-base-port (0 turns RESP off)",
            node.id
        );
    }
    Ok(())
}

/// Waits until every node accepts connections, reporting nodes that exit meanwhile.
async fn wait_until_ready(nodes: &[PlannedNode], children: &mut Children) {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut waiting: Vec<&PlannedNode> = nodes.iter().collect();
    while !waiting.is_empty() && Instant::now() < deadline {
        children.report_exits();
        waiting.retain(|node| {
            children.is_running(node.id)
                && !node.config.listen.parse().is_ok_and(|address| {
                    TcpStream::connect_timeout(&address, Duration::from_millis(100)).is_ok()
                })
        });
        if !waiting.is_empty() {
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
    for node in waiting {
        println!(
            "note: node {} is not accepting connections after {} s; see {}",
            node.id,
            READY_TIMEOUT.as_secs(),
            node.dir.join(LOG_FILE).display()
        );
    }
}

/// A running (or exited) node process.
struct NodeProcess {
    id: u64,
    child: Child,
    log: PathBuf,
    exited: Option<ExitStatus>,
}

/// The children; dropping this stops every one still running, so none outlives this process on
/// any exit path that unwinds.
#[derive(Default)]
struct Children {
    nodes: Vec<NodeProcess>,
}

impl Children {
    /// Starts node `node` with its stdout and stderr appended to its log.
    fn spawn(&mut self, exe: &Path, node: &PlannedNode) -> anyhow::Result<()> {
        let log_path = node.dir.join(LOG_FILE);
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("cannot open {}", log_path.display()))?;
        writeln!(log, "--- onekv cluster start: starting node {} ---", node.id)?;
        let stderr = log.try_clone().context("cannot duplicate the log file handle")?;
        let child = Command::new(exe)
            .arg("server")
            .arg("--config")
            .arg(&node.config_path)
            .arg("--parent-pid")
            .arg(std::process::id().to_string())
            .args(node.http_flag.iter().flat_map(|address| ["--http-listen", address.as_str()]))
            .args(node.resp_flag.iter().flat_map(|address| ["--resp-listen", address.as_str()]))
            .args(
                node.secret_flag
                    .iter()
                    .flat_map(|path| [Path::new("--peer-secret-file").as_os_str(), path.as_os_str()]),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(stderr))
            // Its own process group: a Ctrl-C in the terminal reaches only this process, which
            // then stops the nodes in order, rather than every node at once and twice.
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start node {} ({} server)", node.id, exe.display()))?;
        self.nodes.push(NodeProcess { id: node.id, child, log: log_path, exited: None });
        Ok(())
    }

    fn is_running(&self, id: u64) -> bool {
        self.nodes.iter().any(|node| node.id == id && node.exited.is_none())
    }

    fn all_exited(&self) -> bool {
        self.nodes.iter().all(|node| node.exited.is_some())
    }

    /// Notices children that exited on their own and says which, with the end of their log.
    fn report_exits(&mut self) {
        for node in &mut self.nodes {
            if node.exited.is_some() {
                continue;
            }
            if let Ok(Some(status)) = node.child.try_wait() {
                node.exited = Some(status);
                eprintln!("node {} exited ({status}); its log is {}", node.id, node.log.display());
                for line in onekv_bench::local_cluster::tail(&node.log, 5).lines() {
                    eprintln!("  | {line}");
                }
                eprintln!("the other nodes keep running");
            }
        }
    }

    /// SIGTERMs every running child, waits up to [`STOP_TIMEOUT`] for them, SIGKILLs the rest.
    fn stop_all(&mut self) {
        use rustix::process::{Pid, Signal, kill_process};
        for node in &mut self.nodes {
            if node.exited.is_none() {
                if let Ok(Some(status)) = node.child.try_wait() {
                    node.exited = Some(status);
                } else {
                    // Failure means it is already gone; the wait below collects it.
                    let _ = kill_process(Pid::from_child(&node.child), Signal::TERM);
                }
            }
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            let mut running = 0;
            for node in &mut self.nodes {
                if node.exited.is_none() {
                    match node.child.try_wait() {
                        Ok(Some(status)) => node.exited = Some(status),
                        _ => running += 1,
                    }
                }
            }
            if running == 0 || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for node in &mut self.nodes {
            if node.exited.is_none() {
                eprintln!("node {} did not stop within {} s; killing it", node.id, STOP_TIMEOUT.as_secs());
                let _ = node.child.kill();
                node.exited = node.child.wait().ok();
            }
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        self.stop_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_start_writes_configs_that_restart_reuses() {
        let dir = tempfile::tempdir().unwrap();
        let nodes = plan(dir.path(), 3, 17000, StorageMode::OneLog).unwrap();
        assert_eq!(nodes.len(), 3);
        for (i, node) in nodes.iter().enumerate() {
            let id = i as u64 + 1;
            assert_eq!(node.config.node_id, id);
            assert_eq!(node.config.listen, format!("127.0.0.1:{}", 17000 + id));
            assert_eq!(node.config.data_dir, dir.path().join(format!("node{id}/data")));
            assert_eq!(node.config.members.len(), 3);
            // The nodes divide the machine's cores between them.
            assert_eq!(
                node.config.worker_threads,
                Some(onekv_server::config::worker_threads_sharing_cores(3))
            );
            node.config.validate().unwrap();
        }
        // A restart with other ports reuses the files (their addresses win).
        let again = plan(dir.path(), 3, 18000, StorageMode::OneLog).unwrap();
        assert_eq!(again[2].config.listen, "127.0.0.1:17003");
    }

    #[test]
    fn spares_join_the_cluster_their_members_describe_and_keep_their_files() {
        let dir = tempfile::tempdir().unwrap();
        let nodes = plan(dir.path(), 3, 17000, StorageMode::OneLog).unwrap();
        let spares = plan_spares(dir.path(), &nodes[0].config, 3, 2, 17000).unwrap();
        assert_eq!(spares.iter().map(|spare| spare.id).collect::<Vec<_>>(), vec![4, 5]);
        for spare in &spares {
            let config = &spare.config;
            assert!(config.join, "node {} joins", spare.id);
            assert_eq!(config.listen, format!("127.0.0.1:{}", 17000 + spare.id));
            // The cluster's members to ask, and itself.
            let ids: Vec<u64> = config.members.iter().map(|member| member.id).collect();
            assert_eq!(ids, vec![1, 2, 3, spare.id]);
            assert_eq!(config.cluster, nodes[0].config.cluster);
            assert_eq!(config.worker_threads, Some(onekv_server::config::worker_threads_sharing_cores(5)));
            config.validate().unwrap();
        }
        // A restart reuses their files, whatever the base port.
        let again = plan_spares(dir.path(), &nodes[0].config, 3, 2, 18000).unwrap();
        assert_eq!(again[1].config.listen, "127.0.0.1:17005");
    }

    #[test]
    fn shards_and_replicas_are_fixed_at_creation() {
        let dir = tempfile::tempdir().unwrap();
        let shape = |shards, replicas| Shape { storage: StorageMode::OneLog, shards, replicas };
        let error = plan_shaped(dir.path(), 3, 17000, shape(None, Some(4))).err().unwrap().to_string();
        assert!(error.contains("--replicas 4 is more than --nodes 3"), "{error}");
        let nodes = plan_shaped(dir.path(), 3, 17000, shape(None, None)).unwrap();
        assert_eq!(nodes[0].config.cluster.shards, 16, "16 shards by default");
        assert_eq!(
            nodes[0].config.cluster.key_hashing,
            onekv_server::config::KeyHashingName::DatabaseBlind,
            "a new cluster hashes a key alike in every database"
        );
        assert_eq!(nodes[0].config.replication_factor(), 3);
        // A restart without the flags keeps them; with other values it is refused.
        plan_shaped(dir.path(), 3, 17000, shape(None, None)).unwrap();
        plan_shaped(dir.path(), 3, 17000, shape(Some(16), Some(3))).unwrap();
        let error = plan_shaped(dir.path(), 3, 17000, shape(Some(8), None)).err().unwrap().to_string();
        assert!(error.contains("a cluster of 16 shards but --shards is 8"), "{error}");
        let error = plan_shaped(dir.path(), 3, 17000, shape(None, Some(1))).err().unwrap().to_string();
        assert!(error.contains("3 replicas per shard but --replicas is 1"), "{error}");
        // One shard, as before shards existed.
        let single = tempfile::tempdir().unwrap();
        let nodes = plan_shaped(single.path(), 5, 17000, shape(Some(1), Some(3))).unwrap();
        assert_eq!(nodes[4].config.cluster.shards, 1);
        assert_eq!(nodes[4].config.cluster_map().unwrap().shards[0].replicas.len(), 3);
    }

    #[test]
    fn first_start_makes_one_secret_every_node_uses_and_restart_keeps_it() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let nodes = plan(dir.path(), 3, 17000, StorageMode::OneLog).unwrap();
        let path = dir.path().join(SECRET_FILE);
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let secret = PeerSecret::load(&path).unwrap();
        for node in &nodes {
            assert_eq!(node.config.peer_secret_file, Some(node.dir.join("..").join(SECRET_FILE)));
            assert_eq!(node.config.peer_secret().unwrap(), Some(secret.clone()));
            assert!(node.secret_flag.is_none());
        }
        let again = plan(dir.path(), 3, 17000, StorageMode::OneLog).unwrap();
        assert_eq!(again[1].config.peer_secret().unwrap(), Some(secret.clone()));
        assert_eq!(PeerSecret::load(&path).unwrap(), secret, "the secret is made once");
        // Another cluster directory, another secret.
        let other = tempfile::tempdir().unwrap();
        plan(other.path(), 3, 17000, StorageMode::OneLog).unwrap();
        assert_ne!(PeerSecret::load(&other.path().join(SECRET_FILE)).unwrap(), secret);
    }

    #[test]
    fn a_cluster_made_before_secrets_gets_one_through_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        plan(dir.path(), 3, 17000, StorageMode::OneLog).unwrap();
        fs::remove_file(dir.path().join(SECRET_FILE)).unwrap();
        for id in 1..=3 {
            let path = dir.path().join(format!("node{id}")).join(CONFIG_FILE);
            let text = fs::read_to_string(&path).unwrap();
            let old: String = text
                .lines()
                .filter(|line| !line.starts_with("peer_secret_file"))
                .map(|line| format!("{line}\n"))
                .collect();
            fs::write(&path, old).unwrap();
        }
        let nodes = plan(dir.path(), 3, 17000, StorageMode::OneLog).unwrap();
        let path = dir.path().join(SECRET_FILE);
        for node in &nodes {
            assert_eq!(node.secret_flag.as_deref(), Some(path.as_path()));
            node.config.validate().unwrap();
        }
        assert!(PeerSecret::load(&path).is_ok());
    }

    #[test]
    fn restart_refuses_other_node_count_or_storage() {
        let dir = tempfile::tempdir().unwrap();
        plan(dir.path(), 3, 17000, StorageMode::OneLog).unwrap();
        let error = plan(dir.path(), 5, 17000, StorageMode::OneLog).err().unwrap().to_string();
        assert!(error.contains("node4, node5"), "{error}");
        let error = plan(dir.path(), 2, 17000, StorageMode::OneLog).err().unwrap().to_string();
        assert!(error.contains("cluster of 3 nodes but --nodes is 2"), "{error}");
        let error = plan(dir.path(), 3, 17000, StorageMode::Classic).err().unwrap().to_string();
        assert!(error.contains("uses storage onelog but --storage is classic"), "{error}");
    }

    #[test]
    fn http_ports_follow_the_base_unless_the_file_sets_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut nodes = plan(dir.path(), 3, 17000, StorageMode::OneLog).unwrap();
        nodes[1].config.http_listen = Some("127.0.0.1:8123".into());
        set_http_ports(&mut nodes, 19000).unwrap();
        assert_eq!(nodes[0].http_flag.as_deref(), Some("127.0.0.1:19001"));
        assert_eq!(nodes[0].config.http_listen.as_deref(), Some("127.0.0.1:19001"));
        assert_eq!(nodes[1].http_flag, None, "the file's address wins");
        assert_eq!(nodes[2].http_flag.as_deref(), Some("127.0.0.1:19003"));
        let mut off = plan(dir.path(), 3, 17000, StorageMode::OneLog).unwrap();
        set_http_ports(&mut off, 0).unwrap();
        assert!(off.iter().all(|node| node.http_flag.is_none() && node.config.http_listen.is_none()));
        let mut high = plan(dir.path(), 3, 17000, StorageMode::OneLog).unwrap();
        assert!(set_http_ports(&mut high, 65534).is_err());
    }

    #[test]
    fn resp_ports_start_at_the_base_unless_the_file_sets_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut nodes = plan(dir.path(), 3, 17000, StorageMode::OneLog).unwrap();
        nodes[2].config.resp_listen = Some("127.0.0.1:7777".into());
        set_resp_ports(&mut nodes, 6379).unwrap();
        assert_eq!(nodes[0].resp_flag.as_deref(), Some("127.0.0.1:6379"));
        assert_eq!(nodes[1].config.resp_listen.as_deref(), Some("127.0.0.1:6380"));
        assert_eq!(nodes[2].resp_flag, None, "the file's address wins");
        let mut off = plan(dir.path(), 3, 17000, StorageMode::OneLog).unwrap();
        set_resp_ports(&mut off, 0).unwrap();
        assert!(off.iter().all(|node| node.resp_flag.is_none() && node.config.resp_listen.is_none()));
        let mut high = plan(dir.path(), 3, 17000, StorageMode::OneLog).unwrap();
        assert!(set_resp_ports(&mut high, 65534).is_err());
        // A busy default port turns RESP off for that node only.
        let busy = TcpListener::bind("127.0.0.1:0").unwrap();
        let busy_port = busy.local_addr().unwrap().port();
        let single = tempfile::tempdir().unwrap();
        let mut nodes = plan(single.path(), 1, 17000, StorageMode::OneLog).unwrap();
        set_resp_ports(&mut nodes, busy_port).unwrap();
        skip_busy_default_resp_ports(&mut nodes);
        assert_eq!(nodes[0].resp_flag, None);
        assert_eq!(nodes[0].config.resp_listen, None);
    }

    #[test]
    fn ports_past_the_end_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(plan(dir.path(), 3, 65534, StorageMode::OneLog).is_err());
        assert!(!dir.path().join("node1").exists());
    }
}
