//! A fresh local cluster of `onekv server` processes for one benchmark run.
//!
//! Owns: a directory per cluster (one config, log and data directory per node), free ports on
//! 127.0.0.1, spawning the nodes, waiting for a leader, and stopping them: SIGINT, a bounded wait,
//! then SIGKILL for stragglers — on `stop` and on drop, so no node outlives the harness on an error
//! or a panic (each node also gets `--parent-pid`, so the kernel signals it should the harness die
//! without unwinding). Does not own the workload or the figures.

use std::fs::{self, File};
use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use onekv_client::{Client, ClientOptions};
use onekv_server::ServerConfig;
use onekv_server::config::{MemberConfig, StorageMode};

use crate::amplification::NodeProbe;
use crate::compare::GcVariant;
use crate::delay::{DelayedLinks, From};

/// How long a node gets to exit after SIGINT before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Between two polls while waiting.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Why a cluster could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Creating the directory, a configuration or a log file failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
    /// The configuration the harness wrote is invalid (a bug).
    #[error("invalid node configuration: {0}")]
    Config(String),
    /// A node exited or no leader emerged in time.
    #[error("{0}")]
    NotReady(String),
}

fn io_error(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterError {
    let context = context.into();
    move |source| ClusterError::Io { context, source }
}

struct LocalNode {
    id: u64,
    endpoint: String,
    data_dir: PathBuf,
    log_path: PathBuf,
    child: Option<Child>,
}

/// A running local cluster; dropping it stops every node and removes its directory.
pub struct LocalCluster {
    nodes: Vec<LocalNode>,
    /// The delaying proxies every link goes through, if asked for (after the nodes: closed once
    /// they are stopped).
    links: Option<DelayedLinks>,
    // Last, so it is removed after the nodes are stopped.
    dir: tempfile::TempDir,
}

impl LocalCluster {
    /// Starts `count` nodes of `exe server` in storage mode `storage` (log GC as `gc` says; `[index]`,
    /// `[dedup]`, `cluster.fast_path` and `cluster.replicas` as given), in a fresh directory under
    /// `parent` (the system's temporary directory if `None`), with every link between nodes and from
    /// the client delayed by `link_delay` one way ([`crate::delay`]) if given. Returns once they are
    /// spawned; see [`LocalCluster::wait_for_leader`].
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        exe: &Path,
        parent: Option<&Path>,
        count: u64,
        storage: StorageMode,
        shards: u32,
        gc: GcVariant,
        (index, dedup, fast_path, replicas): (
            onekv_server::config::IndexConfig,
            onekv_server::config::DedupConfig,
            bool,
            Option<u32>,
        ),
        link_delay: Option<Duration>,
    ) -> Result<LocalCluster, ClusterError> {
        let prefix = format!("onekv-bench-{}-", storage.name());
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix);
        let dir = match parent {
            Some(parent) => {
                fs::create_dir_all(parent).map_err(io_error(format!("creating {}", parent.display())))?;
                builder.tempdir_in(parent)
            }
            None => builder.tempdir(),
        }
        .map_err(io_error("creating the cluster directory"))?;
        let mut listeners = Vec::new();
        let mut members = Vec::new();
        for id in 1..=count {
            // Held until every port is chosen, so the nodes get distinct ports.
            let listener = TcpListener::bind("127.0.0.1:0").map_err(io_error("choosing a free port"))?;
            let port = listener.local_addr().map_err(io_error("choosing a free port"))?.port();
            listeners.push(listener);
            members.push(MemberConfig { id, address: format!("127.0.0.1:{port}") });
        }
        // Started while the nodes' ports are still held, so no proxy takes one of them.
        let links = match link_delay {
            Some(delay) => {
                let real: Vec<(u64, String)> =
                    members.iter().map(|member| (member.id, member.address.clone())).collect();
                Some(DelayedLinks::start(&real, delay).map_err(io_error("starting the delaying proxies"))?)
            }
            None => None,
        };
        drop(listeners);
        let mut cluster = LocalCluster { nodes: Vec::new(), links, dir };
        // The nodes authenticate each other with one secret, as `onekv cluster start` sets up.
        let secret_path = cluster.dir.path().join("cluster.secret");
        onekv_server::PeerSecret::generate()
            .write_new(&secret_path)
            .map_err(|error| ClusterError::Config(format!("{error:#}")))?;
        for member in &members {
            let node_dir = cluster.dir.path().join(format!("node{}", member.id));
            fs::create_dir_all(&node_dir).map_err(io_error(format!("creating {}", node_dir.display())))?;
            let config = ServerConfig {
                node_id: member.id,
                listen: member.address.clone(),
                data_dir: node_dir.join("data"),
                storage,
                peer_secret_file: Some(secret_path.clone()),
                // Through the proxy of each link when links are delayed.
                members: members
                    .iter()
                    .map(|other| match &cluster.links {
                        Some(links) if other.id != member.id => MemberConfig {
                            id: other.id,
                            address: links.address(From::Node(member.id), other.id).to_owned(),
                        },
                        _ => other.clone(),
                    })
                    .collect(),
                cluster: onekv_server::config::ClusterConfig {
                    shards,
                    fast_path,
                    replicas,
                    ..Default::default()
                },
                gc: match gc {
                    GcVariant::On => Default::default(),
                    GcVariant::Off => onekv_server::config::GcConfig { enabled: false, ..Default::default() },
                    GcVariant::Uncompressed => {
                        onekv_server::config::GcConfig { compress_below_bytes: 0, ..Default::default() }
                    }
                },
                index: index.clone(),
                dedup: dedup.clone(),
                ..ServerConfig::default()
            };
            config.validate().map_err(|error| ClusterError::Config(error.to_string()))?;
            let config_path = node_dir.join("onekv.toml");
            fs::write(&config_path, config.to_toml()).map_err(io_error("writing a node configuration"))?;
            let log_path = node_dir.join("server.log");
            let log = File::create(&log_path).map_err(io_error("creating a node log"))?;
            let stderr = log.try_clone().map_err(io_error("duplicating a log handle"))?;
            let child = Command::new(exe)
                .arg("server")
                .arg("--config")
                .arg(&config_path)
                .arg("--parent-pid")
                .arg(std::process::id().to_string())
                // The nodes share this machine's cores, as `onekv cluster start` sets them up
                // (`worker_threads`). Through tokio's variable rather than the file, so that a
                // baseline build from before that key (`bench compare --baseline-exe`) runs the same.
                .env(
                    "TOKIO_WORKER_THREADS",
                    onekv_server::config::worker_threads_sharing_cores(count).to_string(),
                )
                .stdin(Stdio::null())
                .stdout(Stdio::from(log))
                .stderr(Stdio::from(stderr))
                // Its own process group: a Ctrl-C in the terminal reaches the harness, which then
                // stops the nodes itself (after reporting), not every node at once.
                .process_group(0)
                .spawn()
                .map_err(io_error(format!("starting {} server", exe.display())))?;
            let endpoint = match &cluster.links {
                Some(links) => links.address(From::Client, member.id).to_owned(),
                None => member.address.clone(),
            };
            cluster.nodes.push(LocalNode {
                id: member.id,
                endpoint,
                data_dir: config.data_dir.clone(),
                log_path,
                child: Some(child),
            });
        }
        Ok(cluster)
    }

    /// Every node's `host:port`.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(|node| node.endpoint.clone()).collect()
    }

    /// Every node's endpoint, pid and data directory, for amplification snapshots.
    pub fn probes(&self) -> Vec<NodeProbe> {
        self.nodes
            .iter()
            .map(|node| NodeProbe {
                endpoint: node.endpoint.clone(),
                pid: node.child.as_ref().map(Child::id),
                data_dir: Some(node.data_dir.clone()),
            })
            .collect()
    }

    /// A client for this cluster with `options`.
    pub fn client(&self, options: ClientOptions) -> Client {
        Client::new(self.endpoints(), options).expect("the cluster's own endpoints are valid")
    }

    /// Waits until every shard has a leader that a majority of its replicas name in its term; fails
    /// if a node exits or `timeout` passes (naming the end of each node's log).
    pub async fn wait_for_leader(&mut self, timeout: Duration) -> Result<(), ClusterError> {
        let options = ClientOptions {
            request_timeout: Duration::from_secs(1),
            max_attempts: 1,
            connect_timeout: Duration::from_millis(500),
            ..ClientOptions::default()
        };
        let client = self.client(options);
        let deadline = Instant::now() + timeout;
        loop {
            for node in &mut self.nodes {
                if let Some(child) = &mut node.child
                    && let Ok(Some(status)) = child.try_wait()
                {
                    node.child = None;
                    return Err(ClusterError::NotReady(format!(
                        "node {} exited ({status}); its log ends with:\n{}",
                        node.id,
                        tail(&node.log_path, 10)
                    )));
                }
            }
            let statuses: Vec<_> =
                client.status_all().await.into_iter().filter_map(|(_, status)| status.ok()).collect();
            // Every shard has a leader that a majority of its replicas follow (with one shard: the
            // cluster's leader).
            let shards = statuses.first().map_or(0, |s| s.shard_count.max(1));
            let led = (1..=u64::from(shards)).all(|shard| {
                let replicas: Vec<_> = statuses
                    .iter()
                    .filter_map(|s| s.shards.iter().find(|r| r.shard == shard).map(|r| (s.node_id, r)))
                    .collect();
                let Some((leader, replica)) =
                    replicas.iter().filter(|(_, r)| r.role == "leader").max_by_key(|(_, r)| r.term)
                else {
                    return false;
                };
                let majority = replica.voters.len() / 2 + 1;
                replicas.iter().filter(|(_, r)| r.leader_id == *leader && r.term == replica.term).count()
                    >= majority
            });
            if shards > 0 && led {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let logs: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|node| format!("node {}:\n{}", node.id, tail(&node.log_path, 5)))
                    .collect();
                return Err(ClusterError::NotReady(format!(
                    "no leader within {timeout:?}; the nodes' logs end with:\n{}",
                    logs.join("\n")
                )));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Kills node `id` (SIGKILL, as a crash would) and reaps it; it stays down.
    pub fn kill(&mut self, id: u64) {
        if let Some(node) = self.nodes.iter_mut().find(|node| node.id == id)
            && let Some(mut child) = node.child.take()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops every node: SIGINT, up to 10 s to exit, then SIGKILL. Idempotent.
    pub fn stop(&mut self) {
        let children =
            self.nodes.iter_mut().map(|node| (format!("node {}", node.id), &mut node.child)).collect();
        stop_children(children, rustix::process::Signal::INT);
    }
}

/// Stops child processes (also used for etcd members): `signal` to each still running, up to
/// [`STOP_TIMEOUT`] for all to exit, then SIGKILL for the rest; every child is reaped and its slot
/// emptied. Idempotent.
pub(crate) fn stop_children(
    mut children: Vec<(String, &mut Option<Child>)>,
    signal: rustix::process::Signal,
) {
    use rustix::process::{Pid, kill_process};
    for (_, slot) in &mut children {
        if let Some(child) = slot.as_mut() {
            if let Ok(Some(_)) = child.try_wait() {
                **slot = None;
            } else {
                // Failure means it is gone already; the wait below reaps it.
                let _ = kill_process(Pid::from_child(child), signal);
            }
        }
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    while Instant::now() < deadline {
        for (_, slot) in &mut children {
            if let Some(child) = slot.as_mut()
                && !matches!(child.try_wait(), Ok(None))
            {
                **slot = None;
            }
        }
        if children.iter().all(|(_, slot)| slot.is_none()) {
            return;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
    for (label, slot) in &mut children {
        if let Some(mut child) = slot.take() {
            eprintln!("{label} did not stop within {STOP_TIMEOUT:?}; killing it");
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `count` lines of a file (empty if unreadable), read from at most its last 64 KiB so a
/// large log costs nothing.
pub fn tail(path: &Path, count: usize) -> String {
    use std::io::{Read as _, Seek as _, SeekFrom};
    const WINDOW: u64 = 64 << 10;
    let Ok(mut file) = File::open(path) else { return String::new() };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(len.saturating_sub(WINDOW))).is_err()
        || file.read_to_end(&mut bytes).is_err()
    {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let mut lines: Vec<&str> = text.lines().collect();
    if len > WINDOW && !lines.is_empty() {
        lines.remove(0); // probably cut in the middle
    }
    lines[lines.len().saturating_sub(count)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_returns_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        fs::write(&path, "a\nb\nc\n").unwrap();
        assert_eq!(tail(&path, 2), "b\nc");
        assert_eq!(tail(&path, 9), "a\nb\nc");
        assert!(tail(&dir.path().join("missing"), 2).is_empty());
        // A long file is read only at its end.
        let long: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
        fs::write(&path, long).unwrap();
        assert_eq!(tail(&path, 2), "line 19998\nline 19999");
    }
}
