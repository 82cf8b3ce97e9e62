//! Test support for clusters of real `onekv server` processes on 127.0.0.1.
//!
//! Owns: choosing free ports, writing one configuration per node into a temporary directory,
//! spawning, SIGKILLing and restarting the node processes (stdout and stderr to a log file per
//! node), waiting for nodes and a leader, and making sure no process outlives its test: dropping a
//! [`TestCluster`] kills and reaps every child, and on a panic first prints the end of every node's
//! log. Also the small waiting and checking helpers the tests share. Does not own what the tests
//! assert.

// Shared by several test binaries, each of which uses only part of it.
#![allow(dead_code)]

use std::collections::HashSet;
use std::fs::{self, OpenOptions};
use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use onekv_client::{Client, ClientOptions, StatusResponse};
use onekv_server::ServerConfig;
use onekv_server::config::MemberConfig;

/// How long a node may take to answer Status after it was spawned (recovery included).
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long an election may take before a test gives up on finding a leader.
const LEADER_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a node may take to apply up to an index the leader has committed.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);
/// Lines of each node's log printed when a test fails.
const LOG_TAIL_LINES: usize = 40;
/// Between two polls of a node's status.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Runs one test body on its own multi-threaded runtime, failing it if it takes longer than
/// `limit`, so a hang shows up as a failure (and the cluster's drop guard still runs).
pub fn run_bounded(limit: Duration, body: impl Future<Output = ()>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        if tokio::time::timeout(limit, body).await.is_err() {
            panic!("the test did not finish within {limit:?}");
        }
    });
}

/// A port on 127.0.0.1 that was free a moment ago: bind port 0, read the port, drop the listener.
/// Another process may take it meanwhile; that is rare enough for tests.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding an ephemeral port");
    listener.local_addr().expect("the ephemeral port").port()
}

/// Whether 127.0.0.1:`port` can be bound right now.
pub fn port_is_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// The last `count` lines of a file (empty if it cannot be read).
pub fn tail(path: &Path, count: usize) -> String {
    let Ok(bytes) = fs::read(path) else { return String::new() };
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(count)..].join("\n")
}

/// Client options for tests: attempts short enough that a dead node is skipped quickly, and a
/// retry budget (the default's) that rides out an election.
pub fn test_client_options() -> ClientOptions {
    ClientOptions {
        request_timeout: Duration::from_secs(3),
        backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(500),
        connect_timeout: Duration::from_secs(1),
        ..ClientOptions::default()
    }
}

/// One node of a [`TestCluster`].
struct Node {
    id: u64,
    address: String,
    config_path: PathBuf,
    log_path: PathBuf,
    /// `None` while the node is down (killed and not restarted).
    child: Option<Child>,
    /// Extra environment for its next start (e.g. `ONEKV_FAILPOINTS`).
    env: Vec<(String, String)>,
}

/// A cluster of `onekv server` processes with their data, configurations and logs in one temporary
/// directory. Dropping it kills every node and removes the directory.
pub struct TestCluster {
    nodes: Vec<Node>,
    /// Used for Status calls only (one attempt to one named node).
    status_client: Client,
    // Declared last so it is removed after the processes are gone (fields drop in order, after
    // `Drop::drop` has killed the children).
    dir: tempfile::TempDir,
}

impl TestCluster {
    /// Starts `count` nodes with Raft ticking every 30 ms (elections in about a second), then
    /// applies `tweak` to every node's configuration; waits until every node answers Status and
    /// a leader is known to a majority.
    pub async fn start(count: u64, tweak: impl Fn(&mut ServerConfig)) -> TestCluster {
        Self::start_with_env(count, tweak, |_| Vec::new()).await
    }

    /// [`TestCluster::start`], giving node `id` the extra environment `env(id)` (e.g. crash points).
    pub async fn start_with_env(
        count: u64,
        tweak: impl Fn(&mut ServerConfig),
        env: impl Fn(u64) -> Vec<(String, String)>,
    ) -> TestCluster {
        let dir = tempfile::Builder::new().prefix("onekv-cluster-test").tempdir().expect("a temporary dir");
        let mut ports = HashSet::new();
        while (ports.len() as u64) < count {
            ports.insert(free_port());
        }
        let members: Vec<MemberConfig> = ports
            .into_iter()
            .zip(1..=count)
            .map(|(port, id)| MemberConfig { id, address: format!("127.0.0.1:{port}") })
            .collect();
        // One cluster secret, as `onekv cluster start` makes.
        let secret_path = dir.path().join("cluster.secret");
        onekv_server::PeerSecret::generate().write_new(&secret_path).expect("writing the cluster secret");
        let mut nodes = Vec::new();
        for member in &members {
            let node_dir = dir.path().join(format!("node{}", member.id));
            fs::create_dir_all(&node_dir).expect("creating a node directory");
            let mut config = ServerConfig {
                node_id: member.id,
                listen: member.address.clone(),
                data_dir: node_dir.join("data"),
                peer_secret_file: Some(secret_path.clone()),
                members: members.clone(),
                ..ServerConfig::default()
            };
            config.raft.tick_ms = 30;
            // One Raft group unless the test asks for shards: most tests here are about one group.
            config.cluster.shards = 1;
            tweak(&mut config);
            config.validate().expect("the test's configuration is valid");
            let config_path = node_dir.join("onekv.toml");
            fs::write(&config_path, config.to_toml()).expect("writing a configuration");
            nodes.push(Node {
                id: member.id,
                address: member.address.clone(),
                config_path,
                log_path: node_dir.join("server.log"),
                child: None,
                env: env(member.id),
            });
        }
        let endpoints = members.iter().map(|member| member.address.clone()).collect();
        let status_client = Client::new(endpoints, test_client_options()).expect("a status client");
        let mut cluster = TestCluster { nodes, status_client, dir };
        for id in 1..=count {
            cluster.spawn(id);
        }
        for id in 1..=count {
            cluster.wait_ready(id).await;
        }
        cluster.leaders().await;
        cluster
    }

    /// Starts a spare node (the next id) configured to join this cluster (`join`, with every
    /// member's address and its own), outside the member list until `onekv node add` adds it;
    /// waits until it answers Status. Returns its id.
    #[allow(dead_code)]
    pub async fn add_spare(&mut self) -> u64 {
        let id = self.add_spare_with_env(Vec::new());
        self.wait_ready(id).await;
        id
    }

    /// [`TestCluster::add_spare`] with extra environment (crash points, say), not waited for.
    pub fn add_spare_with_env(&mut self, env: Vec<(String, String)>) -> u64 {
        let id = self.nodes.iter().map(|node| node.id).max().unwrap_or(0) + 1;
        let mut config = ServerConfig::load(&self.nodes[0].config_path).expect("node 1's configuration");
        let address = format!("127.0.0.1:{}", free_port());
        let node_dir = self.dir.path().join(format!("node{id}"));
        fs::create_dir_all(&node_dir).expect("creating a node directory");
        config.node_id = id;
        config.listen = address.clone();
        config.data_dir = node_dir.join("data");
        config.members.push(MemberConfig { id, address: address.clone() });
        config.join = true;
        config.validate().expect("the spare's configuration is valid");
        let config_path = node_dir.join("onekv.toml");
        fs::write(&config_path, config.to_toml()).expect("writing a configuration");
        self.nodes.push(Node {
            id,
            address,
            config_path,
            log_path: node_dir.join("server.log"),
            child: None,
            env,
        });
        self.spawn(id);
        id
    }

    /// Sets the extra environment node `id` gets from its next (re)start on.
    pub fn set_env(&mut self, id: u64, env: Vec<(String, String)>) {
        self.node_mut(id).env = env;
    }

    /// Whether node `id` exited on its own since the last look: `Some(exit code)` once, reaping
    /// it; `None` while it runs (or is down already).
    pub fn poll_exit(&mut self, id: u64) -> Option<Option<i32>> {
        let node = self.node_mut(id);
        let status = node.child.as_mut()?.try_wait().expect("polling a node")?;
        node.child = None;
        Some(status.code())
    }

    /// The file holding the cluster secret the nodes share.
    #[allow(dead_code)]
    pub fn peer_secret_file(&self) -> PathBuf {
        self.dir.path().join("cluster.secret")
    }

    /// The cluster secret the nodes share.
    pub fn peer_secret(&self) -> onekv_server::PeerSecret {
        onekv_server::PeerSecret::load(&self.dir.path().join("cluster.secret")).expect("the cluster secret")
    }

    /// Every node id, down or not.
    pub fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|node| node.id).collect()
    }

    /// The `host:port` of node `id`.
    pub fn endpoint(&self, id: u64) -> &str {
        &self.node(id).address
    }

    /// A data client over every node's endpoint.
    pub fn client(&self) -> Client {
        let endpoints = self.nodes.iter().map(|node| node.address.clone()).collect();
        Client::new(endpoints, test_client_options()).expect("a client")
    }

    /// A client like [`TestCluster::client`] whose administrative calls carry the cluster secret
    /// in the file `secret` (as `onekv` commands read `--peer-secret-file`).
    #[allow(dead_code)]
    pub fn admin_client(&self, secret: &Path) -> Client {
        let text = fs::read_to_string(secret).expect("reading the secret file");
        let secret = onekv_client::ClusterSecret::new(&text).expect("a secret");
        let options = ClientOptions { cluster_secret: Some(secret), ..test_client_options() };
        let endpoints = self.nodes.iter().map(|node| node.address.clone()).collect();
        Client::new(endpoints, options).expect("a client")
    }

    /// Node `id`'s data directory.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.node(id).config_path.parent().expect("a node directory").join("data")
    }

    /// The text of node `id`'s log so far (every run of it: restarts append).
    pub fn log_text(&self, id: u64) -> String {
        String::from_utf8_lossy(&fs::read(&self.node(id).log_path).unwrap_or_default()).into_owned()
    }

    /// The Status of node `id` (one attempt).
    pub async fn status(&self, id: u64) -> onekv_client::Result<StatusResponse> {
        self.status_client.status(self.endpoint(id)).await
    }

    /// SIGKILLs node `id` and reaps it.
    pub fn kill9(&mut self, id: u64) {
        let node = self.node_mut(id);
        let mut child = node.child.take().unwrap_or_else(|| panic!("node {id} is not running"));
        child.kill().expect("SIGKILL");
        child.wait().expect("reaping a killed node");
    }

    /// SIGSTOPs node `id`: the process stays alive, its sockets stay open, and it does nothing
    /// (no ticks, no answers) until [`TestCluster::resume`]. A paused node can still be killed.
    pub fn pause(&self, id: u64) {
        self.signal(id, rustix::process::Signal::STOP);
    }

    /// SIGCONTs node `id` after [`TestCluster::pause`].
    pub fn resume(&self, id: u64) {
        self.signal(id, rustix::process::Signal::CONT);
    }

    fn signal(&self, id: u64, signal: rustix::process::Signal) {
        let child = self.node(id).child.as_ref().unwrap_or_else(|| panic!("node {id} is not running"));
        rustix::process::kill_process(rustix::process::Pid::from_child(child), signal)
            .unwrap_or_else(|error| panic!("sending {signal:?} to node {id}: {error}"));
    }

    /// Starts node `id` again on its data and waits until it answers Status.
    pub async fn restart(&mut self, id: u64) {
        assert!(self.node(id).child.is_none(), "node {id} is still running");
        self.spawn(id);
        self.wait_ready(id).await;
    }

    /// The id of the leader of shard 1 (the only one of a cluster of one shard): see
    /// [`TestCluster::leader_of`].
    pub async fn leader(&mut self) -> u64 {
        self.leader_of(1).await
    }

    /// The id of the leader of `shard`: a node that says it leads it and that a majority of the
    /// shard's replicas name as its leader in its term. Waits for an election if needed.
    pub async fn leader_of(&mut self, shard: u64) -> u64 {
        let deadline = Instant::now() + LEADER_TIMEOUT;
        loop {
            self.check_running();
            let mut statuses = Vec::new();
            for id in self.running_ids() {
                if let Ok(status) = self.status(id).await
                    && let Some(replica) = status.shards.iter().find(|replica| replica.shard == shard)
                {
                    statuses.push((status.node_id, replica.clone()));
                }
            }
            let leader =
                statuses.iter().filter(|(_, replica)| replica.role == "leader").max_by_key(|(_, r)| r.term);
            if let Some((leader, replica)) = leader {
                let majority = replica.voters.len() / 2 + 1;
                let followers = statuses
                    .iter()
                    .filter(|(_, other)| other.leader_id == *leader && other.term == replica.term)
                    .count();
                if followers >= majority {
                    return *leader;
                }
            }
            assert!(
                Instant::now() < deadline,
                "shard {shard} has no leader within {LEADER_TIMEOUT:?}; replicas: {statuses:?}"
            );
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Waits until every shard is led by its primary (the placement's preferred leader, which
    /// leadership moves back to after any election; see [`TestCluster::leader_of`]), so a test
    /// starts from settled leaders; returns them by shard.
    pub async fn leaders(&mut self) -> Vec<(u64, u64)> {
        let status = self.status(self.ids()[0]).await.expect("a node's status");
        let map = onekv_placement::ClusterMap::decode(&status.cluster_map).expect("the cluster map");
        let deadline = Instant::now() + LEADER_TIMEOUT;
        let mut leaders = Vec::new();
        for shard in &map.shards {
            let primary = shard.replicas[0];
            loop {
                let leader = self.leader_of(shard.id).await;
                if leader == primary {
                    leaders.push((shard.id, leader));
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "shard {} is led by node {leader}, not its primary {primary}, after {LEADER_TIMEOUT:?}",
                    shard.id
                );
                tokio::time::sleep(POLL_INTERVAL).await;
            }
        }
        leaders
    }

    /// Waits until node `id` has applied, in every shard it holds, everything that shard's leader
    /// had committed when asked.
    pub async fn wait_caught_up(&mut self, id: u64) {
        let status = self.status(id).await.expect("the node's status");
        for shard in status.shards.iter().map(|replica| replica.shard) {
            let leader = self.leader_of(shard).await;
            let leader_status = self.status(leader).await.expect("the leader's status");
            let commit = leader_status.shards.iter().find(|r| r.shard == shard).map_or(0, |r| r.commit_index);
            let deadline = Instant::now() + CATCH_UP_TIMEOUT;
            loop {
                self.check_running();
                let applied = self.status(id).await.ok().and_then(|status| {
                    status.shards.iter().find(|r| r.shard == shard).map(|r| r.applied_index)
                });
                if applied.is_some_and(|applied| applied >= commit) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "node {id} did not apply shard {shard} up to {commit} within {CATCH_UP_TIMEOUT:?}"
                );
                tokio::time::sleep(POLL_INTERVAL).await;
            }
        }
    }

    /// Waits until node `id` has applied at least `index`; returns its status then.
    pub async fn wait_applied(&mut self, id: u64, index: u64) -> StatusResponse {
        let deadline = Instant::now() + CATCH_UP_TIMEOUT;
        loop {
            self.check_running();
            let status = self.status(id).await;
            if let Ok(status) = &status
                && status.applied_index >= index
            {
                return status.clone();
            }
            assert!(
                Instant::now() < deadline,
                "node {id} did not apply index {index} within {CATCH_UP_TIMEOUT:?}; last status: {status:?}"
            );
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    fn node(&self, id: u64) -> &Node {
        self.nodes.iter().find(|node| node.id == id).unwrap_or_else(|| panic!("no node {id}"))
    }

    fn node_mut(&mut self, id: u64) -> &mut Node {
        self.nodes.iter_mut().find(|node| node.id == id).unwrap_or_else(|| panic!("no node {id}"))
    }

    fn running_ids(&self) -> Vec<u64> {
        self.nodes.iter().filter(|node| node.child.is_some()).map(|node| node.id).collect()
    }

    fn spawn(&mut self, id: u64) {
        let node = self.node_mut(id);
        let mut log = OpenOptions::new().create(true).append(true).open(&node.log_path).expect("a log file");
        use std::io::Write as _;
        writeln!(log, "--- test: starting node {id} ---").expect("writing the log");
        let stderr = log.try_clone().expect("duplicating the log handle");
        let child = Command::new(env!("CARGO_BIN_EXE_onekv"))
            .arg("server")
            .arg("--config")
            .arg(&node.config_path)
            .args(["--log-level", "info"])
            // Should this test process be killed outright (no drop guard runs), the kernel sends
            // each node SIGTERM. Spawned from the thread running the test body, which outlives the
            // node (the guard kills it first).
            .arg("--parent-pid")
            .arg(std::process::id().to_string())
            .envs(node.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("spawning onekv server");
        node.child = Some(child);
    }

    /// Waits until node `id` answers Status, failing at once if it exits. Only node `id` is
    /// checked: another node may stop meanwhile on purpose (a crash point), and its caller polls it.
    async fn wait_ready(&mut self, id: u64) {
        let deadline = Instant::now() + NODE_READY_TIMEOUT;
        loop {
            let node = self.node_mut(id);
            if let Some(child) = &mut node.child
                && let Ok(Some(status)) = child.try_wait()
            {
                node.child = None;
                panic!("node {id} exited while starting ({status})");
            }
            if self.status(id).await.is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} did not answer Status within {NODE_READY_TIMEOUT:?}"
            );
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Fails the test if a node that should be running has exited.
    fn check_running(&mut self) {
        for node in &mut self.nodes {
            if let Some(child) = &mut node.child
                && let Ok(Some(status)) = child.try_wait()
            {
                node.child = None;
                panic!("node {} exited unexpectedly ({status})", node.id);
            }
        }
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- the test failed; cluster directory {} ---", self.dir.path().display());
            for node in &self.nodes {
                eprintln!("--- last {LOG_TAIL_LINES} lines of node {}'s log ---", node.id);
                eprintln!("{}", tail(&node.log_path, LOG_TAIL_LINES));
            }
        }
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Writes `count` keys `prefix-N` with 1 KiB values, in batches of 50; returns the pairs.
pub async fn write_keys(client: &Client, prefix: &str, count: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..count)
        .map(|n| (format!("{prefix}-{n:06}").into_bytes(), format!("{prefix}:{n}:").repeat(100).into_bytes()))
        .collect();
    for batch in pairs.chunks(50) {
        let ops = batch.iter().map(|(key, value)| (key.clone(), Some(value.clone()))).collect();
        client.batch(ops).await.expect("a batch of puts");
    }
    pairs
}

/// [`mismatches`] of `pairs` read linearizably through `client`.
#[allow(dead_code)]
pub async fn read_back(client: &Client, pairs: &[(Vec<u8>, Vec<u8>)]) -> (usize, Vec<String>) {
    let client = client.clone();
    mismatches(pairs, move |key| {
        let client = client.clone();
        async move { client.get(&key).await }
    })
    .await
}

/// [`mismatches`] of `pairs` read from the own copy of the node at `endpoint` (stale reads).
#[allow(dead_code)]
pub async fn read_back_from(
    client: &Client,
    endpoint: &str,
    pairs: &[(Vec<u8>, Vec<u8>)],
) -> (usize, Vec<String>) {
    let (client, endpoint) = (client.clone(), endpoint.to_string());
    mismatches(pairs, move |key| {
        let (client, endpoint) = (client.clone(), endpoint.clone());
        async move { client.get_stale(&key, Some(&endpoint)).await }
    })
    .await
}

/// Reads every `(key, value)` through `read` from 8 concurrent tasks; returns a description of
/// each key that did not read back its value (at most the first 10) and the number of them.
pub async fn mismatches<F, Fut>(pairs: &[(Vec<u8>, Vec<u8>)], read: F) -> (usize, Vec<String>)
where
    F: Fn(Vec<u8>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = onekv_client::Result<Option<Vec<u8>>>> + Send,
{
    const TASKS: usize = 8;
    let mut tasks = tokio::task::JoinSet::new();
    let chunk = pairs.len().div_ceil(TASKS).max(1);
    for part in pairs.chunks(chunk) {
        let part = part.to_vec();
        let read = read.clone();
        tasks.spawn(async move {
            let mut wrong = Vec::new();
            for (key, value) in part {
                let got = read(key.clone()).await;
                if !matches!(&got, Ok(Some(got)) if *got == value) {
                    let got = got.map(|got| got.map(|got| String::from_utf8_lossy(&got).into_owned()));
                    wrong.push(format!("{}: got {got:?}", String::from_utf8_lossy(&key)));
                }
            }
            wrong
        });
    }
    let mut all = Vec::new();
    while let Some(wrong) = tasks.join_next().await {
        all.extend(wrong.expect("a reader task"));
    }
    let count = all.len();
    all.truncate(10);
    (count, all)
}

/// A cluster of `count` nodes with the Redis front end on every node (the rest of each node's
/// configuration changed by `tweak`): node I's RESP port is `ports[I - 1]`.
pub async fn start_resp_cluster(
    count: u64,
    tweak: impl Fn(&mut ServerConfig) + Send + Sync + 'static,
) -> (TestCluster, Vec<u16>) {
    let mut ports = HashSet::new();
    while ports.len() < count as usize {
        ports.insert(free_port());
    }
    let ports: Vec<u16> = ports.into_iter().collect();
    let resp_ports = ports.clone();
    let cluster = TestCluster::start(count, move |config| {
        config.resp_listen = Some(format!("127.0.0.1:{}", resp_ports[config.node_id as usize - 1]));
        tweak(config);
    })
    .await;
    (cluster, ports)
}

/// Runs `onekv node ARGS... --timeout-secs 120 --endpoints ENDPOINTS` on a blocking thread, with
/// the cluster secret at `secret` (`ONEKV_PEER_SECRET_FILE`); returns whether it succeeded and its
/// output.
#[allow(dead_code)]
pub async fn onekv_node(args: Vec<String>, endpoints: &[String], secret: &Path) -> (bool, String) {
    let endpoints = endpoints.join(",");
    let secret = secret.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_onekv"))
            .arg("node")
            .args(&args)
            .args(["--timeout-secs", "120", "--endpoints", &endpoints])
            .env("ONEKV_PEER_SECRET_FILE", secret)
            .output()
            .expect("running onekv node");
        let text =
            String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr);
        (output.status.success(), text)
    })
    .await
    .unwrap()
}
