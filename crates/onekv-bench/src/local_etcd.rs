//! A fresh local etcd cluster (three or more `etcd` processes on 127.0.0.1) for one benchmark run.
//!
//! Owns: a directory per cluster (a data directory and a log per member), free client and peer
//! ports, spawning the members, waiting until a linearizable `Range` succeeds, and stopping them:
//! SIGTERM, a bounded wait, then SIGKILL — on `stop` and on drop, so no member outlives the harness
//! on an error or a panic. Does not own the workload or the figures.
//!
//! Every durability setting is etcd's default: each member fsyncs its write-ahead log before it
//! acknowledges a Raft entry (as a onekv node does with its log), and snapshots/compaction are left
//! as shipped. That is what makes throughput and latency comparable with onekv's: both pay one
//! fsync per commit on a majority.

use std::fs::{self, File};
use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::amplification::NodeProbe;
use crate::etcd::EtcdTarget;
use crate::local_cluster::{ClusterError, stop_children, tail};
use crate::target::Target as _;

/// Between two polls while waiting.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

fn io_error(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterError {
    let context = context.into();
    move |source| ClusterError::Io { context, source }
}

struct EtcdMember {
    name: String,
    client_endpoint: String,
    data_dir: PathBuf,
    log_path: PathBuf,
    child: Option<Child>,
}

/// A running local etcd cluster; dropping it stops every member and removes its directory.
pub struct LocalEtcd {
    members: Vec<EtcdMember>,
    // Last, so it is removed after the members are stopped.
    dir: tempfile::TempDir,
}

impl LocalEtcd {
    /// Starts `count` members of `exe` (the `etcd` binary) in a fresh directory under `parent`
    /// (the system's temporary directory if `None`). Returns once they are spawned; see
    /// [`LocalEtcd::wait_ready`].
    pub fn start(exe: &Path, parent: Option<&Path>, count: u64) -> Result<LocalEtcd, ClusterError> {
        let mut builder = tempfile::Builder::new();
        builder.prefix("onekv-bench-etcd-");
        let dir = match parent {
            Some(parent) => {
                fs::create_dir_all(parent).map_err(io_error(format!("creating {}", parent.display())))?;
                builder.tempdir_in(parent)
            }
            None => builder.tempdir(),
        }
        .map_err(io_error("creating the etcd cluster directory"))?;
        // Held until every port is chosen, so the members get distinct ports.
        let mut listeners = Vec::new();
        let mut ports = Vec::new();
        for _ in 0..count * 2 {
            let listener = TcpListener::bind("127.0.0.1:0").map_err(io_error("choosing a free port"))?;
            ports.push(listener.local_addr().map_err(io_error("choosing a free port"))?.port());
            listeners.push(listener);
        }
        drop(listeners);
        let names: Vec<String> = (1..=count).map(|id| format!("e{id}")).collect();
        let client_urls: Vec<String> =
            (0..count as usize).map(|i| format!("http://127.0.0.1:{}", ports[2 * i])).collect();
        let peer_urls: Vec<String> =
            (0..count as usize).map(|i| format!("http://127.0.0.1:{}", ports[2 * i + 1])).collect();
        let initial_cluster: Vec<String> =
            names.iter().zip(&peer_urls).map(|(name, url)| format!("{name}={url}")).collect();
        let initial_cluster = initial_cluster.join(",");
        let mut cluster = LocalEtcd { members: Vec::new(), dir };
        for (index, name) in names.iter().enumerate() {
            let data_dir = cluster.dir.path().join(name);
            let log_path = cluster.dir.path().join(format!("{name}.log"));
            let log = File::create(&log_path).map_err(io_error("creating an etcd log"))?;
            let stderr = log.try_clone().map_err(io_error("duplicating a log handle"))?;
            let child = Command::new(exe)
                .arg("--name")
                .arg(name)
                .arg("--data-dir")
                .arg(&data_dir)
                .arg("--listen-client-urls")
                .arg(&client_urls[index])
                .arg("--advertise-client-urls")
                .arg(&client_urls[index])
                .arg("--listen-peer-urls")
                .arg(&peer_urls[index])
                .arg("--initial-advertise-peer-urls")
                .arg(&peer_urls[index])
                .arg("--initial-cluster")
                .arg(&initial_cluster)
                .arg("--initial-cluster-state")
                .arg("new")
                .arg("--initial-cluster-token")
                .arg(cluster.dir.path().file_name().unwrap_or_default())
                .stdin(Stdio::null())
                .stdout(Stdio::from(log))
                .stderr(Stdio::from(stderr))
                // Its own process group: a Ctrl-C reaches the harness (`onekv bench` drops its
                // work on SIGINT), whose guard stops the members.
                .process_group(0)
                .spawn()
                .map_err(io_error(format!("starting {}", exe.display())))?;
            cluster.members.push(EtcdMember {
                name: name.clone(),
                client_endpoint: client_urls[index].trim_start_matches("http://").to_string(),
                data_dir,
                log_path,
                child: Some(child),
            });
        }
        Ok(cluster)
    }

    /// Every member's client `host:port`.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|member| member.client_endpoint.clone()).collect()
    }

    /// Every member's endpoint, pid and data directory, for kernel write and disk figures.
    pub fn probes(&self) -> Vec<NodeProbe> {
        self.members
            .iter()
            .map(|member| NodeProbe {
                endpoint: member.client_endpoint.clone(),
                pid: member.child.as_ref().map(Child::id),
                data_dir: Some(member.data_dir.clone()),
            })
            .collect()
    }

    /// Every member's pid (for tests: checking none is left running).
    pub fn pids(&self) -> Vec<u32> {
        self.members.iter().filter_map(|member| member.child.as_ref().map(Child::id)).collect()
    }

    /// A target driving this cluster.
    pub fn target(&self) -> EtcdTarget {
        EtcdTarget::new(&self.endpoints()).expect("the cluster's own endpoints are valid")
    }

    /// Waits until a linearizable `Range` succeeds on every member (so a leader exists and each
    /// member knows it); fails if a member exits or `timeout` passes (naming each log's end).
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<(), ClusterError> {
        let deadline = Instant::now() + timeout;
        let targets: Vec<EtcdTarget> = self
            .endpoints()
            .iter()
            .map(|endpoint| EtcdTarget::new(std::slice::from_ref(endpoint)))
            .collect::<Result<_, _>>()
            .map_err(|error| ClusterError::Config(error.to_string()))?;
        loop {
            for member in &mut self.members {
                if let Some(child) = &mut member.child
                    && let Ok(Some(status)) = child.try_wait()
                {
                    member.child = None;
                    return Err(ClusterError::NotReady(format!(
                        "etcd member {} exited ({status}); its log ends with:\n{}",
                        member.name,
                        tail(&member.log_path, 10)
                    )));
                }
            }
            let mut ready = 0;
            for target in &targets {
                let attempt = tokio::time::timeout(Duration::from_secs(1), target.read(b"onekv-bench-probe"));
                if matches!(attempt.await, Ok(Ok(_))) {
                    ready += 1;
                }
            }
            if ready == targets.len() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let logs: Vec<String> = self
                    .members
                    .iter()
                    .map(|member| format!("{}:\n{}", member.name, tail(&member.log_path, 5)))
                    .collect();
                return Err(ClusterError::NotReady(format!(
                    "etcd not ready within {timeout:?}; the members' logs end with:\n{}",
                    logs.join("\n")
                )));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Stops every member: SIGTERM, up to 10 s to exit, then SIGKILL. Idempotent.
    pub fn stop(&mut self) {
        let children = self
            .members
            .iter_mut()
            .map(|member| (format!("etcd member {}", member.name), &mut member.child))
            .collect();
        stop_children(children, rustix::process::Signal::TERM);
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        self.stop();
    }
}
