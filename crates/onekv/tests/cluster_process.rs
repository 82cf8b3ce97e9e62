//! Clusters of real `onekv server` processes: replication, kill -9 of the leader under writes, a
//! restart of every node, a follower catching up through a snapshot, bad input on both services,
//! and `onekv cluster start` driven through the CLI.
//!
//! In-process replication, failover and crash points are tested in `onekv-replica`; these tests
//! add what only real processes show: the binary, its configuration files, gRPC between nodes,
//! SIGKILL at an arbitrary moment, and recovery from the files a killed process left.
//!
//! The tests run one at a time (they share two cores with each other's clusters otherwise, and a
//! starved node misses elections), each bounded by [`run_bounded`].

mod common;

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{
    TestCluster, free_port, onekv_node, port_is_free, read_back, read_back_from, run_bounded, tail,
};
use onekv_client::ClientError;
use onekv_proto::PeerMessages;
use onekv_proto::peer_client::PeerClient;

/// Keeps the tests of this file from running at the same time.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    // A failed test poisons the lock; the next one is still worth running.
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `(key, value)` pairs as bytes.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

#[test]
fn writes_replicate_to_every_node() {
    let _serial = one_at_a_time();
    run_bounded(Duration::from_secs(60), async {
        let mut cluster = TestCluster::start(3, |_| {}).await;
        let client = cluster.client();
        let mut pairs = Pairs::new();
        let mut last_index = 0;
        for i in 0..100 {
            let (key, value) = (format!("replicated-{i:03}").into_bytes(), format!("value-{i}").into_bytes());
            last_index = client.put(&key, &value).await.expect("put");
            pairs.push((key, value));
        }
        for id in cluster.ids() {
            cluster.wait_applied(id, last_index).await;
            let (count, wrong) = read_back_from(&client, cluster.endpoint(id), &pairs).await;
            assert_eq!(count, 0, "node {id}'s stale reads: {wrong:#?}");
        }
    });
}

/// One acknowledged put of the writers in `leader_killed_under_writes_loses_no_acked_write`.
struct Ack {
    key: Vec<u8>,
    value: Vec<u8>,
    started: Instant,
}

#[test]
fn leader_killed_under_writes_loses_no_acked_write() {
    let _serial = one_at_a_time();
    run_bounded(Duration::from_secs(90), async {
        let mut cluster = TestCluster::start(3, |_| {}).await;
        let client = cluster.client();
        let acks = Arc::new(Mutex::new(Vec::<Ack>::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut writers = tokio::task::JoinSet::new();
        for writer in 0..4 {
            let (client, acks, stop) = (client.clone(), Arc::clone(&acks), Arc::clone(&stop));
            writers.spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("writer{writer}-{n:06}").into_bytes();
                    let value = format!("value-{writer}-{n}-{}", rand::random::<u32>()).into_bytes();
                    let started = Instant::now();
                    // An error is no acknowledgement: the write may or may not have been applied,
                    // so there is nothing to check.
                    if client.put(&key, &value).await.is_ok() {
                        acks.lock().unwrap().push(Ack { key, value, started });
                    }
                    n += 1;
                }
            });
        }

        tokio::time::sleep(Duration::from_secs(1)).await;
        let old_leader = cluster.leader().await;
        let acked_before = acks.lock().unwrap().len();
        assert!(acked_before > 0, "no write was acknowledged in the first second");
        let killed_at = Instant::now();
        cluster.kill9(old_leader);

        // Writes resume under a new leader: puts *started* after the kill are acknowledged.
        let deadline = killed_at + Duration::from_secs(10);
        loop {
            let resumed = acks.lock().unwrap().iter().filter(|ack| ack.started > killed_at).count();
            if resumed >= 20 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "only {resumed} puts started after the kill of leader {old_leader} were acknowledged \
                 within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let new_leader = cluster.leader().await;
        assert_ne!(new_leader, old_leader, "the killed node cannot be the leader");

        cluster.restart(old_leader).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, Ordering::Relaxed);
        while let Some(joined) = writers.join_next().await {
            joined.expect("a writer task");
        }
        let acked: Pairs =
            std::mem::take(&mut *acks.lock().unwrap()).into_iter().map(|ack| (ack.key, ack.value)).collect();
        assert!(acked.len() > acked_before, "no write after the kill");
        eprintln!(
            "{} writes acknowledged ({acked_before} before leader {old_leader} was killed), then \
             leader {new_leader}",
            acked.len()
        );

        let (count, wrong) = read_back(&client, &acked).await;
        assert_eq!(count, 0, "{count} of {} acknowledged writes read back wrong: {wrong:#?}", acked.len());

        let leader = cluster.leader().await;
        let commit = cluster.status(leader).await.expect("the leader's status").commit_index;
        for id in cluster.ids() {
            cluster.wait_applied(id, commit).await;
            let (count, wrong) = read_back_from(&client, cluster.endpoint(id), &acked).await;
            assert_eq!(count, 0, "node {id}'s stale reads of {} acked keys: {wrong:#?}", acked.len());
        }
    });
}

/// Puts `count` keys named `prefix-N` through 8 concurrent tasks; returns them with their values.
async fn load(client: &onekv_client::Client, prefix: &str, count: usize, key_padding: usize) -> Pairs {
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..8 {
        let (client, prefix) = (client.clone(), prefix.to_string());
        tasks.spawn(async move {
            let mut pairs = Pairs::new();
            for i in (task..count).step_by(8) {
                let mut key = format!("{prefix}-{i:05}-").into_bytes();
                key.resize(key.len() + key_padding, b'k');
                let value = format!("value of {prefix} {i}").into_bytes();
                client.put(&key, &value).await.unwrap_or_else(|error| panic!("put {prefix}-{i}: {error}"));
                pairs.push((key, value));
            }
            pairs
        });
    }
    let mut pairs = Pairs::new();
    while let Some(part) = tasks.join_next().await {
        pairs.extend(part.expect("a loader task"));
    }
    pairs
}

#[test]
fn every_node_killed_and_restarted_keeps_every_acked_write() {
    let _serial = one_at_a_time();
    run_bounded(Duration::from_secs(90), async {
        let mut cluster = TestCluster::start(3, |_| {}).await;
        let client = cluster.client();
        let pairs = load(&client, "survivor", 200, 0).await;

        for id in cluster.ids() {
            cluster.kill9(id);
        }
        for id in cluster.ids() {
            cluster.restart(id).await;
        }
        cluster.leader().await;

        let (count, wrong) = read_back(&client, &pairs).await;
        assert_eq!(count, 0, "after restarting every node: {wrong:#?}");
        client.put(b"after-restart", b"new").await.expect("a put after the restart");
        assert_eq!(client.get(b"after-restart").await.expect("get"), Some(b"new".to_vec()));
    });
}

#[test]
fn follower_down_for_long_catches_up_through_a_snapshot() {
    let _serial = one_at_a_time();
    run_bounded(Duration::from_secs(90), async {
        let mut cluster = TestCluster::start(3, |config| {
            // Few entries kept, and a memtable small enough (its minimum) that the leader flushes,
            // and so compacts its Raft log, every few dozen of the long keys below.
            config.raft.raft_log_keep_entries = 20;
            config.index.memtable_bytes = 64 << 10;
        })
        .await;
        let client = cluster.client();
        let leader = cluster.leader().await;
        let follower = cluster.ids().into_iter().find(|&id| id != leader).expect("a follower");
        let index = client.put(b"before-the-outage", b"1").await.expect("put");
        let down_at = cluster.wait_applied(follower, index).await.applied_index;
        cluster.kill9(follower);

        // Keys of about 1 KiB fill the index's memtable (which holds keys and locators) quickly.
        let mut written = Pairs::new();
        let mut round = 0;
        let leader_first = loop {
            written.extend(load(&client, &format!("outage{round}"), 100, 1000).await);
            round += 1;
            let status = cluster.status(leader).await.expect("the leader's status");
            if written.len() >= 300 && status.first_index > down_at + 100 {
                break status.first_index;
            }
            assert!(round < 20, "the leader never compacted its Raft log past index {down_at}: {status:?}");
        };

        cluster.restart(follower).await;
        let leader = cluster.leader().await;
        let commit = cluster.status(leader).await.expect("the leader's status").commit_index;
        let caught_up = cluster.wait_applied(follower, commit).await;
        assert!(
            caught_up.first_index > down_at + 1,
            "node {follower} went down at index {down_at} and the leader's log starts at {leader_first}, \
             but its own log starts at {}",
            caught_up.first_index
        );
        eprintln!(
            "node {follower} went down at index {down_at}; {} keys written meanwhile; the leader's log \
             then started at {leader_first}; node {follower} caught up to {} with its log starting at {}",
            written.len(),
            caught_up.applied_index,
            caught_up.first_index
        );
        let log = cluster.log_text(follower);
        assert!(log.contains("installing a snapshot"), "node {follower} never installed a snapshot");

        let (count, wrong) = read_back_from(&client, cluster.endpoint(follower), &written).await;
        assert_eq!(count, 0, "node {follower}'s stale reads after the snapshot: {wrong:#?}");
    });
}

/// The message of an `InvalidArgument`, or a panic naming what came instead.
fn invalid_argument<T: std::fmt::Debug>(what: &str, result: onekv_client::Result<T>) -> String {
    match result {
        Err(ClientError::InvalidArgument(message)) => message,
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn bad_input_is_rejected_and_the_node_keeps_serving() {
    let _serial = one_at_a_time();
    run_bounded(Duration::from_secs(60), async {
        let mut cluster = TestCluster::start(3, |config| {
            config.limits.max_key_bytes = 64;
            config.limits.max_value_bytes = 1024;
            config.limits.max_batch_ops = 4;
        })
        .await;
        let client = cluster.client();

        let message = invalid_argument("a long key", client.put(&[b'k'; 65], b"v").await);
        assert!(message.contains("limits.max_key_bytes"), "{message}");
        let message = invalid_argument("a long key in a get", client.get(&[b'k'; 65]).await);
        assert!(message.contains("limits.max_key_bytes"), "{message}");
        let message = invalid_argument("a long value", client.put(b"k", &[b'v'; 1025]).await);
        assert!(message.contains("limits.max_value_bytes"), "{message}");
        let message = invalid_argument("an empty key", client.put(b"", b"v").await);
        assert!(message.contains("empty"), "{message}");
        let ops = (0..5).map(|i| (format!("batch-{i}").into_bytes(), Some(b"v".to_vec()))).collect();
        let message = invalid_argument("a batch of 5", client.batch(ops).await);
        assert!(message.contains("limits.max_batch_ops"), "{message}");
        // Exactly at the limits is fine.
        client.put(&[b'k'; 64], &[b'v'; 1024]).await.expect("a put at the limits");
        let ops = (0..4).map(|i| (format!("batch-{i}").into_bytes(), Some(b"v".to_vec()))).collect();
        client.batch(ops).await.expect("a batch at the limit");
        // A value over the largest request the node reads at all (about 4 MiB): still
        // INVALID_ARGUMENT naming the limits (was tonic's OUT_OF_RANGE).
        let message = invalid_argument("a 5 MiB value", client.put(b"k", &vec![b'v'; 5 << 20]).await);
        assert!(message.contains("limits.max_value_bytes = 1024"), "{message}");
        assert!(message.contains("limits.max_batch_bytes"), "{message}");

        // Raw bytes that are not a Raft message, on the Peer service of the leader.
        let leader = cluster.leader().await;
        let follower = cluster.ids().into_iter().find(|&id| id != leader).expect("a follower");
        let mut peer =
            PeerClient::connect(format!("http://{}", cluster.endpoint(leader))).await.expect("connecting");
        // Without the cluster secret, or with another, nothing is even read: a well-formed vote
        // request of a high term from a member would otherwise depose the leader.
        let mut vote = raft::eraftpb::Message::default();
        vote.set_msg_type(raft::eraftpb::MessageType::MsgRequestVote);
        (vote.from, vote.to, vote.term, vote.index, vote.log_term) = (follower, leader, 1_000, 1 << 40, 999);
        let forged = || PeerMessages {
            from: follower,
            messages: vec![protobuf::Message::write_to_bytes(&vote).expect("encoding")],
            shards: vec![1],
        };
        let status = peer.send(forged()).await.expect_err("a call without the secret must be refused");
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
        let mut wrong = tonic::Request::new(forged());
        let other = onekv_server::PeerSecret::generate();
        wrong.metadata_mut().insert(onekv_server::auth::PEER_SECRET_METADATA, other.metadata_value());
        let status = peer.send(wrong).await.expect_err("another secret must be refused");
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
        // With the secret, the service's own checks run.
        let secret = cluster.peer_secret();
        let with_secret = |batch: PeerMessages| {
            let mut request = tonic::Request::new(batch);
            request.metadata_mut().insert(onekv_server::auth::PEER_SECRET_METADATA, secret.metadata_value());
            request
        };
        let garbage = PeerMessages { from: follower, messages: vec![vec![0xff; 16]], shards: vec![1] };
        let status = peer.send(with_secret(garbage)).await.expect_err("garbage must be rejected");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains("does not decode"), "{status:?}");
        let stranger = PeerMessages { from: 99, messages: vec![Vec::new()], shards: vec![1] };
        let status = peer.send(with_secret(stranger)).await.expect_err("a non-member must be rejected");
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");

        // The node still serves, and is still the leader (the garbage changed nothing).
        client.put(b"still", b"serving").await.expect("a put after bad input");
        assert_eq!(client.get(b"still").await.expect("get"), Some(b"serving".to_vec()));
        assert_eq!(cluster.leader().await, leader);
    });
}

/// An `onekv cluster start` process: its stdout lines arrive on a channel; dropping it stops the
/// cluster (SIGINT, then SIGKILL after 15 s; the nodes follow their parent either way).
struct ClusterProcess {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// Every stdout line so far, for failure messages.
    seen: Vec<String>,
}

impl ClusterProcess {
    fn start(dir: &Path, base_port: u16) -> ClusterProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_onekv"))
            .args(["cluster", "start", "--nodes", "3", "--base-port", &base_port.to_string(), "--dir"])
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning onekv cluster start");
        let stdout = child.stdout.take().expect("a piped stdout");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        ClusterProcess { child, lines, seen: Vec::new() }
    }

    /// Waits for the line that lists the endpoints (`onekv status --endpoints E`); returns E.
    fn endpoints(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let endpoints = line.trim().strip_prefix("onekv status --endpoints ").map(str::to_string);
                    self.seen.push(line);
                    if let Some(endpoints) = endpoints {
                        return endpoints;
                    }
                }
                Err(error) => {
                    panic!("no endpoints line ({error:?}); output so far:\n{}", self.seen.join("\n"))
                }
            }
        }
    }

    /// The ids of the processes whose parent is this one.
    fn children(&self) -> Vec<u32> {
        let parent = self.child.id();
        let mut children = Vec::new();
        for entry in std::fs::read_dir("/proc").expect("listing /proc").flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
                continue;
            };
            // `pid (comm) state ppid ...`; comm may hold spaces, so split after its last ')'.
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1));
            if ppid.and_then(|ppid| ppid.parse::<u32>().ok()) == Some(parent) {
                children.push(pid);
            }
        }
        children
    }

    /// Sends SIGINT and waits up to `limit` for the exit; `None` if it did not exit in time.
    fn interrupt(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        use rustix::process::{Pid, Signal, kill_process};
        kill_process(Pid::from_child(&self.child), Signal::INT).expect("sending SIGINT");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for the cluster") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ClusterProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait()
            && self.interrupt(Duration::from_secs(15)).is_none()
        {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `onekv ARGS... --endpoints ENDPOINTS`.
fn cli(args: &[&str], endpoints: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_onekv"))
        .args(args)
        .args(["--endpoints", endpoints])
        .env_remove("ONEKV_ENDPOINTS")
        .stdin(Stdio::null())
        .output()
        .expect("running onekv")
}

/// A base port P such that P+1..=P+3 are free now.
fn free_base_port() -> u16 {
    for _ in 0..100 {
        let first = free_port();
        if first > 1 && first < u16::MAX - 3 && (first..first + 3).all(port_is_free) {
            return first - 1;
        }
    }
    panic!("found no three consecutive free ports");
}

/// Whether process `pid` is still an `onekv server` (a reused pid running something else is not).
fn is_onekv_server(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).split('\0').any(|arg| arg == "server"))
}

#[test]
fn cluster_start_serves_the_cli_stops_on_sigint_and_restarts_on_its_data() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().expect("a temporary dir");
    let cluster_dir = dir.path().join("cluster");
    let node_logs = || {
        (1..=3)
            .map(|id| {
                format!("--- node {id} ---\n{}", tail(&cluster_dir.join(format!("node{id}/server.log")), 30))
            })
            .collect::<Vec<_>>()
            .join("\n")
    };

    let mut cluster = ClusterProcess::start(&cluster_dir, free_base_port());
    let endpoints = cluster.endpoints();
    assert_eq!(endpoints.split(',').count(), 3, "{endpoints}");
    let put = cli(&["put", "greeting", "hello world"], &endpoints);
    assert!(put.status.success(), "onekv put failed: {put:?}\n{}", node_logs());
    assert!(String::from_utf8_lossy(&put.stdout).starts_with("OK (index "), "{put:?}");
    let get = cli(&["get", "greeting"], &endpoints);
    assert!(get.status.success(), "onekv get failed: {get:?}");
    assert_eq!(String::from_utf8_lossy(&get.stdout), "hello world\n");
    let missing = cli(&["get", "no-such-key"], &endpoints);
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");

    let nodes = cluster.children();
    assert_eq!(nodes.len(), 3, "expected 3 node processes, found {nodes:?}");
    let status = cluster.interrupt(Duration::from_secs(15)).expect("the cluster did not stop within 15 s");
    assert!(status.success(), "onekv cluster start exited with {status}\n{}", node_logs());
    let left: Vec<u32> = nodes.into_iter().filter(|&pid| is_onekv_server(pid)).collect();
    assert!(left.is_empty(), "node processes outlived the cluster: {left:?}");

    // Started again on the same directory (its configurations name the ports), it has the value.
    let mut cluster = ClusterProcess::start(&cluster_dir, free_base_port());
    let again = cluster.endpoints();
    assert_eq!(again, endpoints, "a restart reuses the addresses in the configurations");
    let get = cli(&["get", "greeting"], &endpoints);
    assert!(get.status.success(), "onekv get after the restart failed: {get:?}\n{}", node_logs());
    assert_eq!(String::from_utf8_lossy(&get.stdout), "hello world\n");
    let status = cluster.interrupt(Duration::from_secs(15)).expect("the restarted cluster did not stop");
    assert!(status.success(), "the restarted cluster exited with {status}");
}

/// `onekv lead SHARD NODE` moves a shard's leadership away from its primary, and it stays there
/// (the new leader does not hand it back to the configured primary); running it again is a no-op;
/// a node that is not a voter is refused with a reason.
#[test]
fn the_lead_command_moves_a_shards_leadership_and_it_stays() {
    let _serial = one_at_a_time();
    run_bounded(Duration::from_secs(90), async {
        let mut cluster = TestCluster::start(3, |_| {}).await;
        let leaders = cluster.leaders().await;
        let (shard, primary) = leaders[0];
        let target = cluster.ids().into_iter().find(|&id| id != primary).expect("another node");
        let endpoints: Vec<String> =
            cluster.ids().iter().map(|&id| cluster.endpoint(id).to_string()).collect();
        // Without the cluster secret (or with another) no administrative call is served, not even
        // redirected: whoever reaches the client port must not move leaderships or replicas.
        let other_secret = cluster.peer_secret_file().with_file_name("other.secret");
        onekv_server::PeerSecret::generate().write_new(&other_secret).expect("writing a secret");
        let strangers = [
            ("without a secret", cluster.client()),
            ("with another secret", cluster.admin_client(&other_secret)),
        ];
        for (how, stranger) in &strangers {
            let refusals = [
                ("lead", stranger.transfer_leadership(shard, target).await.err()),
                (
                    "change members",
                    stranger.change_members(shard, Vec::new(), Vec::new(), vec![target]).await.err(),
                ),
                ("add a replica", stranger.add_replica(cluster.endpoint(target), shard).await.err()),
                ("remove a replica", stranger.remove_replica(cluster.endpoint(target), shard).await.err()),
            ];
            for (what, refusal) in refusals {
                let text = format!("{refusal:?}");
                assert!(
                    text.contains("cluster secret"),
                    "{what} {how} must be refused for the secret: {text}"
                );
            }
        }
        assert_eq!(cluster.leader_of(shard).await, primary, "a refused transfer moved the leadership");
        assert_eq!(
            cluster.status(target).await.expect("status").shards.len(),
            1,
            "a refused call changed replicas"
        );
        let lead_with = |node: u64, secret: &Path| {
            let output = Command::new(env!("CARGO_BIN_EXE_onekv"))
                .args(["lead", &shard.to_string(), &node.to_string(), "--timeout-secs", "20"])
                .args(["--endpoints", &endpoints.join(",")])
                .env("ONEKV_PEER_SECRET_FILE", secret)
                .output()
                .expect("running onekv lead");
            (
                output.status.success(),
                String::from_utf8_lossy(&output.stdout).to_string()
                    + &String::from_utf8_lossy(&output.stderr),
            )
        };
        let (ok, text) = lead_with(target, &other_secret);
        assert!(!ok && text.contains("wrong cluster secret"), "onekv lead with another secret: {text}");
        let secret = cluster.peer_secret_file();
        let lead = |node: u64| lead_with(node, &secret);
        let (ok, text) = lead(target);
        assert!(ok, "onekv lead failed: {text}");
        assert!(text.contains(&format!("node {target} leads shard {shard}")), "{text}");
        // Several election timeouts later (30 ms ticks), the primary has not taken it back.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(cluster.leader_of(shard).await, target, "leadership went back to the primary");
        let (ok, text) = lead(target);
        assert!(ok && text.contains("leads shard"), "running it again: {text}");
        let (ok, text) = lead(99);
        assert!(!ok && text.contains("not a voter"), "a node that is not a voter: {text}");
        let client = cluster.client();
        client.put(b"after-the-move", b"v").await.expect("a write after the move");
        assert_eq!(client.get(b"after-the-move").await.expect("a read").as_deref(), Some(&b"v"[..]));
    });
}

/// `onekv shard move SHARD FROM TO` moves the replica of a shard on its leader to the one node of
/// four that holds none, while writers keep writing: every acknowledged write reads back, also
/// from the new node's own copy; the old node hosts nothing afterwards, not even after a restart,
/// and still sends clients on to the shard; running the command again changes nothing.
#[test]
fn the_shard_move_command_moves_a_replica_under_writes_and_loses_nothing() {
    let _serial = one_at_a_time();
    run_bounded(Duration::from_secs(150), async {
        let mut cluster = TestCluster::start(4, |config| {
            config.cluster.replicas = Some(3);
            // The newcomer catches up through a streamed snapshot of several chunks.
            config.raft.raft_log_keep_entries = 50;
            config.raft.snapshot_chunk_bytes = 64 << 10;
            config.index.memtable_bytes = 64 << 10;
        })
        .await;
        let shard = 1;
        let from = cluster.leader_of(shard).await;
        let mut to = 0;
        for id in cluster.ids() {
            if cluster.status(id).await.expect("status").shards.is_empty() {
                to = id;
            }
        }
        assert_ne!(to, 0, "one node of four holds no replica");
        let client = cluster.client();
        let before = common::write_keys(&client, "before", 2000).await;

        // Writers run through the whole move; only acknowledged writes are checked.
        let stop = Arc::new(AtomicBool::new(false));
        let acked: Acked = Arc::new(Mutex::new(Vec::new()));
        let writers: Vec<_> =
            (0..4).map(|writer| spawn_writer(&client, &stop, &acked, &format!("{writer}-"))).collect();
        let endpoints: Vec<String> =
            cluster.ids().iter().map(|&id| cluster.endpoint(id).to_string()).collect();
        let secret = cluster.peer_secret_file();
        let shard_move = move || {
            let output = Command::new(env!("CARGO_BIN_EXE_onekv"))
                .args(["shard", "move", &shard.to_string(), &from.to_string(), &to.to_string()])
                .args(["--timeout-secs", "90", "--endpoints", &endpoints.join(",")])
                .env("ONEKV_PEER_SECRET_FILE", &secret)
                .output()
                .expect("running onekv shard move");
            let text = String::from_utf8_lossy(&output.stdout).to_string()
                + &String::from_utf8_lossy(&output.stderr);
            (output.status.success(), text)
        };
        let (ok, text) = tokio::task::spawn_blocking(shard_move.clone()).await.unwrap();
        assert!(ok, "onekv shard move failed: {text}");
        assert!(
            cluster.log_text(to).contains("fetching a snapshot"),
            "node {to} caught up without a snapshot"
        );
        assert!(text.contains(&format!("moved shard {shard} from node {from} to node {to}")), "{text}");
        assert!(text.contains("catching up") || text.contains("promoting"), "{text}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, Ordering::SeqCst);
        for writer in writers {
            writer.await.unwrap();
        }
        let acked = acked.lock().unwrap().clone();
        assert!(acked.len() > 20, "the writers made little progress: {}", acked.len());
        let all: Vec<_> = before.into_iter().chain(acked).collect();

        let status = cluster.status(to).await.expect("the new node's status");
        let replica = status.shards.iter().find(|replica| replica.shard == shard).expect("a replica on TO");
        assert!(replica.voters.contains(&to) && !replica.voters.contains(&from), "{replica:?}");
        assert!(cluster.status(from).await.expect("status").shards.is_empty(), "FROM still hosts a replica");
        let (wrong, examples) = read_back(&client, &all).await;
        assert_eq!(wrong, 0, "acknowledged writes lost: {examples:?}");
        // The new node's own copy, once it has applied everything.
        let last = client.put(b"after-the-move", b"v").await.expect("a write after the move");
        cluster.wait_applied(to, last).await;
        let (wrong, examples) = read_back_from(&client, cluster.endpoint(to), &all).await;
        assert_eq!(wrong, 0, "keys missing from node {to}'s own copy: {examples:?}");

        // The old node, killed and restarted, hosts nothing, and a client that knows only it finds
        // the shard.
        cluster.kill9(from);
        cluster.restart(from).await;
        assert!(cluster.status(from).await.expect("status").shards.is_empty(), "the replica came back");
        let only_from = onekv_client::Client::new(
            vec![cluster.endpoint(from).to_string()],
            common::test_client_options(),
        )
        .expect("a client");
        only_from.put(b"through-the-old-node", b"w").await.expect("a write through the old node");
        assert_eq!(only_from.get(b"through-the-old-node").await.unwrap().as_deref(), Some(&b"w"[..]));

        let (ok, text) = tokio::task::spawn_blocking(shard_move).await.unwrap();
        assert!(ok && text.contains("moved shard"), "running it again: {text}");
        assert!(
            !text.contains("promoting") && !text.contains("creating"),
            "running it again did something: {text}"
        );
    });
}

/// `onekv node drain ID` moves every replica off a node of four (4 shards of 3 replicas) while a
/// writer writes; with that node down, draining another is refused (its shards would be left a
/// replica short); and
/// `onekv node fill ID` gives the drained node its share of replicas and leaderships back; no
/// acknowledged write is lost.
#[test]
fn node_drain_and_fill_move_replicas_off_and_back_onto_a_node() {
    let _serial = one_at_a_time();
    run_bounded(Duration::from_secs(200), async {
        let mut cluster = TestCluster::start(4, |config| {
            config.cluster.shards = 4;
            config.cluster.replicas = Some(3);
        })
        .await;
        let client = cluster.client();
        let mut before = Vec::new();
        for n in 0..200 {
            let (key, value) = (format!("before-{n:04}").into_bytes(), vec![b'x'; 1000]);
            client.put(&key, &value).await.expect("a put");
            before.push((key, value));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let acked: Acked = Arc::new(Mutex::new(Vec::new()));
        let writer = spawn_writer(&client, &stop, &acked, "");
        let endpoints: Vec<String> =
            cluster.ids().iter().map(|&id| cluster.endpoint(id).to_string()).collect();
        let secret = cluster.peer_secret_file();
        let node_command =
            |verb: &str, id: u64| onekv_node(vec![verb.into(), id.to_string()], &endpoints, &secret);
        let replicas_of = |status: &onekv_client::StatusResponse| status.shards.len();

        let (ok, text) = node_command("drain", 2).await;
        assert!(ok, "onekv node drain failed: {text}");
        assert!(text.contains("node 2 holds no replica (3 moved)"), "{text}");
        assert_eq!(replicas_of(&cluster.status(2).await.unwrap()), 0, "{text}");
        for id in [1, 3, 4] {
            assert_eq!(replicas_of(&cluster.status(id).await.unwrap()), 4, "node {id}: {text}");
        }
        // With the drained node down, the other three hold every shard: none can give one up.
        cluster.kill9(2);
        let (ok, text) = node_command("drain", 3).await;
        assert!(!ok && text.contains("a replica short"), "draining a second node: {text}");
        cluster.restart(2).await;

        let (ok, text) = node_command("fill", 2).await;
        assert!(ok, "onekv node fill failed: {text}");
        assert!(text.contains("node 2 holds 3 replicas, its share of 12 on 4 nodes (3 moved)"), "{text}");
        // And its share of the leaderships (4 shards on 4 nodes): it led none of the moved shards.
        assert!(text.contains("node 2 leads 1 shard(s)"), "{text}");
        let leads = cluster.status(2).await.unwrap().shards.iter().filter(|s| s.role == "leader").count();
        assert_eq!(leads, 1, "{text}");
        let (ok, text) = node_command("fill", 2).await;
        assert!(ok && text.contains("(0 moved)"), "filling it again: {text}");

        stop.store(true, Ordering::SeqCst);
        writer.await.unwrap();
        let all: Vec<_> = before.into_iter().chain(acked.lock().unwrap().clone()).collect();
        let (wrong, examples) = read_back(&client, &all).await;
        assert_eq!(wrong, 0, "acknowledged writes lost: {examples:?}");
    });
}

/// Key-value pairs a writer had acknowledged.
type Acked = Arc<Mutex<Vec<(Vec<u8>, Vec<u8>)>>>;

/// A writer of unique keys (`during-{name}N`) through `client` until `stop`; what was acknowledged
/// lands in `acked`.
fn spawn_writer(
    client: &onekv_client::Client,
    stop: &Arc<AtomicBool>,
    acked: &Acked,
    name: &str,
) -> tokio::task::JoinHandle<()> {
    let (client, stop, acked, name) = (client.clone(), stop.clone(), acked.clone(), name.to_string());
    tokio::spawn(async move {
        let mut n = 0;
        while !stop.load(Ordering::SeqCst) {
            let key = format!("during-{name}{n:06}").into_bytes();
            let value = format!("value-{name}{n}").repeat(30).into_bytes();
            if client.put(&key, &value).await.is_ok() {
                acked.lock().unwrap().push((key, value));
            }
            n += 1;
        }
    })
}

/// A cluster of three nodes (4 shards of 3 replicas) holding `keys` keys of 1000 bytes.
struct Loaded {
    cluster: TestCluster,
    /// A client of the three nodes.
    client: onekv_client::Client,
    /// The three nodes' endpoints.
    endpoints: Vec<String>,
    /// The cluster secret's file.
    secret: std::path::PathBuf,
    /// The keys written, with their values.
    before: Vec<(Vec<u8>, Vec<u8>)>,
}

async fn three_nodes_of_four_shards(keys: usize) -> Loaded {
    let cluster = TestCluster::start(3, |config| {
        config.cluster.shards = 4;
        config.cluster.replicas = Some(3);
    })
    .await;
    let client = cluster.client();
    let endpoints = cluster.ids().iter().map(|&id| cluster.endpoint(id).to_string()).collect();
    let secret = cluster.peer_secret_file();
    let mut before = Vec::new();
    for n in 0..keys {
        let (key, value) = (format!("before-{n:04}").into_bytes(), vec![b'x'; 1000]);
        client.put(&key, &value).await.expect("a put");
        before.push((key, value));
    }
    Loaded { cluster, client, endpoints, secret, before }
}

/// Grows a cluster from 3 nodes to 5 and shrinks it back with `onekv node add ADDR` and `onekv
/// node remove ID` while a writer writes through a client that knows only the first three nodes
/// (4 shards of 3 replicas): the newcomers get their share of replicas, every member adopts each
/// member list (kept across a restart), a member the replication factor needs cannot be removed,
/// onekv's own key cannot be written, and no acknowledged write is lost.
#[test]
fn nodes_join_and_leave_the_cluster_under_writes_and_lose_nothing() {
    let _serial = one_at_a_time();
    run_bounded(Duration::from_secs(300), async {
        let Loaded { mut cluster, client, endpoints, secret, before } = three_nodes_of_four_shards(200).await;
        let refused = client.put(onekv_placement::MEMBERS_KEY, b"forged").await;
        assert!(matches!(refused, Err(ClientError::InvalidArgument(_))), "{refused:?}");
        // The member list changes only with the cluster secret, and one member at a time.
        let status = cluster.status(1).await.unwrap();
        let mut forged = status.members.clone();
        forged.push(onekv_client::Member { id: 9, address: "10.9.9.9:1".into() });
        let refused = client.set_members(1, forged.clone()).await;
        assert!(format!("{refused:?}").contains("must carry the cluster secret"), "{refused:?}");
        let other_secret = cluster.peer_secret_file().with_file_name("other.secret");
        onekv_server::PeerSecret::generate().write_new(&other_secret).expect("writing a secret");
        let refused = cluster.admin_client(&other_secret).set_members(1, forged.clone()).await;
        assert!(format!("{refused:?}").contains("wrong cluster secret"), "{refused:?}");
        forged.push(onekv_client::Member { id: 10, address: "10.9.9.9:2".into() });
        let refused = cluster.admin_client(&secret).set_members(1, forged).await;
        assert!(format!("{refused:?}").contains("adds or removes one member"), "{refused:?}");
        assert_eq!(cluster.status(1).await.unwrap().members_epoch, 1, "nothing changed");
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let writer = spawn_writer(&client, &stop, &acked, "");

        let four = cluster.add_spare().await;
        let five = cluster.add_spare().await;
        assert!(cluster.status(four).await.unwrap().shards.is_empty(), "a spare holds no replica");
        let (ok, text) =
            onekv_node(vec!["add".into(), cluster.endpoint(four).into()], &endpoints, &secret).await;
        assert!(ok, "onekv node add failed: {text}");
        assert!(text.contains("(member list epoch 2)"), "{text}");
        assert!(text.contains("node 4 holds 3 replicas, its share of 12 on 4 nodes (3 moved)"), "{text}");
        let (ok, text) =
            onekv_node(vec!["add".into(), cluster.endpoint(five).into()], &endpoints, &secret).await;
        assert!(ok, "onekv node add failed: {text}");
        assert!(text.contains("node 5 holds 2 replicas, its share of 12 on 5 nodes (2 moved)"), "{text}");
        let (ok, again) =
            onekv_node(vec!["add".into(), cluster.endpoint(five).into()], &endpoints, &secret).await;
        assert!(
            ok && again.contains("(0 moved)") && !again.contains("epoch 3 ->"),
            "adding it again: {again}"
        );
        for id in 1..=5 {
            let status = cluster.status(id).await.unwrap();
            assert_eq!((status.members_epoch, status.members.len()), (3, 5), "node {id}");
        }
        // A restarted member keeps the list it adopted (its configuration names three).
        cluster.kill9(1);
        cluster.restart(1).await;
        let status = cluster.status(1).await.unwrap();
        assert_eq!((status.members_epoch, status.members.len()), (3, 5), "node 1 after a restart");

        let (ok, text) = onekv_node(vec!["remove".into(), five.to_string()], &endpoints, &secret).await;
        assert!(ok, "onekv node remove failed: {text}");
        assert!(text.contains("node 5 left the cluster"), "{text}");
        let (ok, text) = onekv_node(vec!["remove".into(), four.to_string()], &endpoints, &secret).await;
        assert!(ok, "onekv node remove failed: {text}");
        let (ok, text) = onekv_node(vec!["remove".into(), "3".into()], &endpoints, &secret).await;
        assert!(!ok && text.contains("would leave 2 node(s) for shards of 3 replicas"), "{text}");
        let (ok, text) = onekv_node(vec!["remove".into(), four.to_string()], &endpoints, &secret).await;
        assert!(ok && text.contains("not a member"), "removing it again: {text}");
        for id in [four, five] {
            let status = cluster.status(id).await.unwrap();
            assert!(status.shards.is_empty(), "node {id} still hosts {:?}", status.shards);
        }
        for id in 1..=3 {
            let status = cluster.status(id).await.unwrap();
            assert_eq!((status.members_epoch, status.members.len()), (5, 3), "node {id}");
            assert_eq!(status.shards.len(), 4, "node {id} holds every shard again");
        }

        stop.store(true, Ordering::SeqCst);
        writer.await.unwrap();
        let acked = acked.lock().unwrap().clone();
        assert!(acked.len() > 20, "the writer made little progress: {}", acked.len());
        let all: Vec<_> = before.into_iter().chain(acked).collect();
        let (wrong, examples) = read_back(&client, &all).await;
        assert_eq!(wrong, 0, "acknowledged writes lost: {examples:?}");
    });
}

/// `onekv node replace ID ADDR` rebuilds the replicas of a node that is gone for good (killed,
/// its disk as good as lost) on a new node started with `--join`, while a writer writes: the new
/// node holds every shard the lost one held, the lost one leaves the member list, and no
/// acknowledged write is lost.
#[test]
fn node_replace_rebuilds_a_lost_nodes_replicas_on_a_new_node() {
    let _serial = one_at_a_time();
    run_bounded(Duration::from_secs(200), async {
        let Loaded { mut cluster, client, endpoints, secret, before } = three_nodes_of_four_shards(300).await;
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let writer = spawn_writer(&client, &stop, &acked, "");
        cluster.kill9(2);
        let new = cluster.add_spare().await;
        let (ok, text) =
            onekv_node(vec!["replace".into(), "2".into(), cluster.endpoint(new).into()], &endpoints, &secret)
                .await;
        assert!(ok, "onekv node replace failed: {text}");
        assert!(text.contains(&format!("node {new} replaced node 2")), "{text}");
        let status = cluster.status(new).await.unwrap();
        assert_eq!(status.shards.len(), 4, "the new node holds every shard: {:?}", status.shards);
        let ids: Vec<u64> = status.members.iter().map(|member| member.id).collect();
        assert_eq!(ids, vec![1, 3, new], "{text}");
        for replica in &status.shards {
            assert!(!replica.voters.contains(&2) && replica.voters.contains(&new), "{replica:?}");
        }
        let (ok, again) =
            onekv_node(vec!["replace".into(), "2".into(), cluster.endpoint(new).into()], &endpoints, &secret)
                .await;
        assert!(ok && !again.contains("moving shard"), "replacing it again: {again}");

        stop.store(true, Ordering::SeqCst);
        writer.await.unwrap();
        let all: Vec<_> = before.into_iter().chain(acked.lock().unwrap().clone()).collect();
        // Every key from the new node's own copy, once it has applied everything.
        cluster.wait_caught_up(new).await;
        let (wrong, examples) = read_back_from(&client, cluster.endpoint(new), &all).await;
        assert_eq!(wrong, 0, "keys missing from the new node's copy: {examples:?}");
    });
}

/// A range deletion over 4 shards of 3 real nodes: 6 000 keys in the range go in pages (several
/// per shard), the keys around the range stay, writes to other keys go on meanwhile without an
/// error, and every node's own copy ends with the same keys.
#[test]
fn a_range_deletion_empties_its_range_in_every_shard_while_writes_go_on() {
    let _serial = one_at_a_time();
    run_bounded(Duration::from_secs(120), async {
        let cluster = TestCluster::start(3, |config| {
            config.cluster.shards = 4;
            config.cluster.replicas = Some(3);
        })
        .await;
        let client = cluster.client();
        let keys: Vec<Vec<u8>> = (0..6000).map(|n| format!("doomed-{n:05}").into_bytes()).collect();
        for chunk in keys.chunks(500) {
            client
                .batch_per_shard(chunk.iter().map(|key| (key.clone(), Some(vec![b'v'; 100]))).collect())
                .await
                .expect("a batch of puts");
        }
        for key in ["doomed", "doomed.", "kept-a"] {
            client.put(key.as_bytes(), b"stays").await.expect("a put");
        }
        // A writer of other keys runs through the deletion.
        let stop = Arc::new(AtomicBool::new(false));
        let writer = tokio::spawn({
            let (client, stop) = (client.clone(), stop.clone());
            async move {
                let mut written = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("other-{:05}", written.len()).into_bytes();
                    client.put(&key, b"w").await.expect("a write during the range deletion");
                    written.push(key);
                }
                written
            }
        });
        let deleted = client.delete_range(b"doomed-", Some(b"doomed.")).await.expect("delete_range");
        stop.store(true, Ordering::Relaxed);
        let written = writer.await.expect("the writer");
        assert_eq!(deleted, 6000);
        let left = client.scan_keys(b"doomed", Some(b"doomed/"), 100, false).await.expect("a scan");
        assert_eq!(left.keys, [b"doomed".to_vec(), b"doomed.".to_vec()]);
        // Nothing left to delete: a second deletion finds none.
        assert_eq!(client.delete_range(b"doomed-", Some(b"doomed.")).await.expect("delete_range"), 0);
        // Empty ranges delete nothing (an empty end is not "no end").
        assert_eq!(client.delete_range(b"", Some(b"")).await.expect("delete_range"), 0);
        assert_eq!(client.delete_range(b"z", Some(b"a")).await.expect("delete_range"), 0);
        for key in &written {
            assert_eq!(client.get(key).await.expect("a read").as_deref(), Some(&b"w"[..]));
        }
        // Every node's own copy agrees (stale reads, once each has applied the last pages).
        for id in cluster.ids() {
            let endpoint = Some(cluster.endpoint(id));
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let mut found = 0;
                for key in keys.iter().step_by(97) {
                    found += client.get_stale(key, endpoint).await.expect("a stale read").is_some() as usize;
                }
                if found == 0 {
                    break;
                }
                assert!(Instant::now() < deadline, "node {id} still holds {found} sampled keys of the range");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let kept = client.get_stale(b"kept-a", endpoint).await.expect("a stale read");
            assert_eq!(kept.as_deref(), Some(&b"stays"[..]), "node {id}");
        }
    });
}
