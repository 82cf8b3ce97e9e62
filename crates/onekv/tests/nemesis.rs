//! Linearizability of a real three-node cluster under faults, checked with porcupine.
//!
//! Three `onekv server` processes talk to each other through a fault-injecting TCP proxy per
//! directed link (`common/nemesis.rs`). Six client tasks run random gets, puts of unique values,
//! compare-and-swaps and deletes over eight keys, recording every operation with its call and
//! return time, while a seeded nemesis kills (-9) and restarts nodes, pauses them (SIGSTOP /
//! SIGCONT), isolates the leader, partitions a random minority away and cuts one pair of nodes
//! apart (a "bridge": both still reach the third). At the end every fault is healed, all three
//! nodes must converge to the same values, and the Go checker in `tools/linearizability` must
//! find the history linearizable. A second test shows the harness catches a broken node: reads
//! served stale by an isolated follower are reported as not linearizable. A third runs the
//! checker's own Go tests.
//!
//! Go is required: without it these tests fail, since a checker that did not run would report no
//! violation.
//!
//! `ONEKV_NEMESIS_SECONDS` (default 25) sets how long faults are injected and `ONEKV_NEMESIS_SEED`
//! replays a schedule; `docs/testing/nemesis.md` describes both, the history format and how to
//! replay the checker on a saved history.

mod common;
#[path = "common/nemesis.rs"]
mod nemesis;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{TestCluster, run_bounded};
use nemesis::{Network, Outcome, Recorder, Request, Response};
use onekv_client::Client;
use rand::Rng as _;
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;

/// Keeps the tests of this file from running at the same time (they share two cores).
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The client id the final reads are recorded under (workload clients are 0, 1, ...).
const FINAL_READER: u64 = 1000;
/// How long the checker may take before the test fails with "timed out" (a 25 s history of about
/// 5,000 operations takes it about a second, a 120 s one of 21,000 about as long).
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the nodes may take to agree on every key once every fault is healed.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(20);

/// Where a run's history and visualization are kept (they outlive the test, for replaying).
fn history_paths(name: &str, seed: u64) -> (PathBuf, PathBuf) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nemesis");
    std::fs::create_dir_all(&dir).expect("creating the history directory");
    (dir.join(format!("{name}-{seed}.json")), dir.join(format!("{name}-{seed}.html")))
}

/// The workload: `clients` tasks over `keys`, each with its own client (its own connections).
struct Workload {
    stop: Arc<AtomicBool>,
    tasks: tokio::task::JoinSet<u64>,
}

impl Workload {
    fn start(
        cluster: &TestCluster,
        clients: u64,
        keys: Vec<String>,
        recorder: &Arc<Recorder>,
        seed: u64,
        fast: bool,
    ) -> Self {
        let endpoints: Vec<String> =
            cluster.ids().iter().map(|&id| cluster.endpoint(id).to_string()).collect();
        let keys = Arc::new(keys);
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        for id in 0..clients {
            let client =
                Client::new(endpoints.clone(), nemesis::workload_client_options()).expect("a client");
            tasks.spawn(nemesis::client_task(
                id,
                client,
                Arc::clone(&keys),
                Arc::clone(recorder),
                Arc::clone(&stop),
                seed.wrapping_add(id + 1),
                // Half the clients write by the fast path when the cluster has it on.
                fast && id % 2 == 1,
            ));
        }
        Workload { stop, tasks }
    }

    /// Stops every task after its current operation; returns how many operations they issued.
    async fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let mut issued = 0;
        while let Some(joined) = self.tasks.join_next().await {
            issued += joined.expect("a client task");
        }
        issued
    }
}

/// The faults the nemesis injects.
const FAULTS: [&str; 5] = ["kill", "pause", "isolate-leader", "partition", "bridge"];

/// The node that says it leads `shard` (highest term), asking each node briefly; `None` if none
/// answers.
async fn current_leader(cluster: &TestCluster, shard: u64) -> Option<u64> {
    let mut best: Option<(u64, u64)> = None;
    for id in cluster.ids() {
        if let Ok(Ok(status)) = tokio::time::timeout(Duration::from_millis(300), cluster.status(id)).await
            && let Some(replica) = status.shards.iter().find(|replica| replica.shard == shard)
            && replica.role == "leader"
            && best.is_none_or(|(term, _)| replica.term > term)
        {
            best = Some((replica.term, id));
        }
    }
    best.map(|(_, id)| id)
}

/// Injects one fault at a time, each lasting 0.5-2 s with 0.2-0.8 s of calm between them, until
/// `length` has passed; heals each fault before the next. Kinds come in shuffled rounds of all five,
/// so even a short run injects every kind. Returns how many of each kind it injected.
async fn run_nemesis(
    cluster: &mut TestCluster,
    network: &Network,
    rng: &mut StdRng,
    length: Duration,
    shards: u32,
) -> BTreeMap<&'static str, u32> {
    let end = Instant::now() + length;
    let mut counts: BTreeMap<&'static str, u32> = FAULTS.iter().map(|&kind| (kind, 0)).collect();
    let started = Instant::now();
    let mut round: Vec<&'static str> = Vec::new();
    while Instant::now() + Duration::from_millis(500) < end {
        if round.is_empty() {
            round = FAULTS.to_vec();
            round.shuffle(rng);
        }
        let kind = round.pop().expect("a fault");
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..=800))).await;
        let duration = Duration::from_millis(rng.random_range(500..=2000));
        let ids = cluster.ids();
        let random_node = ids[rng.random_range(0..ids.len())];
        let leader = current_leader(cluster, rng.random_range(1..=u64::from(shards))).await;
        // Half the faults aimed at one node hit a leader (of a random shard): that is where a lost
        // write or a stale read would come from.
        let target = match leader {
            Some(leader) if kind == "isolate-leader" || rng.random_bool(0.5) => leader,
            _ => random_node,
        };
        eprintln!("nemesis {:>6.2}s: {kind} node {target} for {duration:?}", started.elapsed().as_secs_f64());
        match kind {
            "kill" => {
                cluster.kill9(target);
                tokio::time::sleep(duration).await;
                cluster.restart(target).await;
            }
            "pause" => {
                cluster.pause(target);
                tokio::time::sleep(duration).await;
                cluster.resume(target);
            }
            "isolate-leader" => {
                network.isolate(target);
                tokio::time::sleep(duration).await;
                network.heal_all();
            }
            "partition" => {
                let majority: Vec<u64> = ids.iter().copied().filter(|&id| id != random_node).collect();
                network.partition(&[vec![random_node], majority]);
                tokio::time::sleep(duration).await;
                network.heal_all();
            }
            "bridge" => {
                // `target` keeps both links; the other two cannot reach each other.
                let cut: Vec<u64> = ids.iter().copied().filter(|&id| id != target).collect();
                network.cut_pair(cut[0], cut[1]);
                tokio::time::sleep(duration).await;
                network.heal_all();
            }
            _ => unreachable!("unknown fault {kind}"),
        }
        *counts.get_mut(kind).expect("a known fault") += 1;
    }
    counts
}

/// With every fault healed: reads every key linearizably (recorded), waits until every node has
/// applied what the leader committed (one shard; with several, retries until they agree), and
/// checks that each replica of a key's shard returns the same value to a stale read. Retries while
/// a late write (one whose client gave up but which still commits) changes a key.
async fn check_convergence(cluster: &mut TestCluster, recorder: &Recorder, keys: &[String]) {
    let client = cluster.client();
    let map = client.cluster_map().await.expect("the cluster map");
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let leader = cluster.leader().await;
        let mut finals = Vec::new();
        for key in keys {
            let call = recorder.now();
            let value = client.get(key.as_bytes()).await.expect("a final read with every fault healed");
            let value = value.map(|value| String::from_utf8(value).expect("values are UTF-8"));
            let response = Response { value: value.clone(), swapped: false };
            recorder.record(FINAL_READER, key, Request::Get, (call, recorder.now()), Outcome::Ok, response);
            finals.push((key, value));
        }
        let commit = cluster.status(leader).await.expect("the leader's status").commit_index;
        let mut differences = Vec::new();
        for id in cluster.ids() {
            if map.shard_count() == 1 {
                cluster.wait_applied(id, commit).await;
            }
            for (key, value) in &finals {
                let shard = map.shard_of_key(key.as_bytes());
                if !map.shard(shard).expect("every shard is placed").replicas.contains(&id) {
                    continue;
                }
                let got = client.get_stale(key.as_bytes(), Some(cluster.endpoint(id))).await;
                let got = got.expect("a stale read").map(|got| String::from_utf8(got).expect("UTF-8"));
                if got != *value {
                    differences.push(format!("node {id} has {key} = {got:?}, the leader read {value:?}"));
                }
            }
        }
        if differences.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            // Every replica's view, to tell a replica left behind from one that diverged.
            let mut replicas = Vec::new();
            for id in cluster.ids() {
                match cluster.status(id).await {
                    Ok(status) => replicas.extend(status.shards.iter().map(|r| {
                        format!(
                            "node {id} shard {}: {} leader {} term {} commit {} applied {} rejoining {}",
                            r.shard,
                            r.role,
                            r.leader_id,
                            r.term,
                            r.commit_index,
                            r.applied_index,
                            r.rejoining
                        )
                    })),
                    Err(error) => replicas.push(format!("node {id}: no status: {error}")),
                }
            }
            panic!("the nodes did not converge: {differences:#?}\nreplicas: {replicas:#?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn linearizable_under_kills_pauses_and_partitions() {
    linearizable_under_faults("history", 3, 1, false);
}

/// The same with the fast path on (`cluster.fast_path`) on 4 shards, half the clients writing by
/// it: fast writes mixed with Raft-path writes, compare-and-swaps and reads.
#[test]
fn linearizable_with_the_fast_path_under_kills_pauses_and_partitions() {
    linearizable_under_faults("fast", 3, 4, true);
}

/// The same on a sharded cluster: 5 nodes, 8 shards of 3 replicas, leaders spread; a kill of any
/// one node leaves every shard a majority.
#[test]
fn linearizable_on_a_sharded_cluster_under_kills_pauses_and_partitions() {
    linearizable_under_faults("sharded", 5, 8, false);
}

/// Runs the workload against `nodes` nodes holding `shards` shards (3 replicas each) while the
/// nemesis injects faults, then checks convergence and linearizability; with the fast path on and
/// half the clients using it when `fast`.
fn linearizable_under_faults(name: &str, nodes: u64, shards: u32, fast: bool) {
    let _serial = one_at_a_time();
    let seconds = nemesis::env_number("ONEKV_NEMESIS_SECONDS", 25);
    let seed = nemesis::env_number("ONEKV_NEMESIS_SEED", rand::random::<u32>().into());
    eprintln!(
        "nemesis ({name}): seed {seed} (replay with ONEKV_NEMESIS_SEED={seed}), {seconds} s of faults, \
         {nodes} nodes, {shards} shards"
    );
    nemesis::build_checker();
    let name = name.to_string();
    run_bounded(Duration::from_secs(seconds + 90), async move {
        let ids: Vec<u64> = (1..=nodes).collect();
        let network = Network::start(&ids).await;
        let mut cluster = TestCluster::start(nodes, |config| {
            network.tweak(config);
            config.cluster.shards = shards;
            config.cluster.replicas = Some(3.min(nodes as u32));
            config.cluster.fast_path = fast;
        })
        .await;
        let recorder = Recorder::new();
        let keys = nemesis::keys(8);
        let workload = Workload::start(&cluster, 6, keys.clone(), &recorder, seed, fast);

        let mut rng = nemesis::rng(seed);
        let faults =
            run_nemesis(&mut cluster, &network, &mut rng, Duration::from_secs(seconds), shards).await;
        network.heal_all();
        let issued = workload.stop().await;
        check_convergence(&mut cluster, &recorder, &keys).await;

        let (history, html) = history_paths(&name, seed);
        recorder.write(&history, seed);
        let verdict = nemesis::check_history(&history, &html, CHECK_TIMEOUT);
        let (ok, unknown, fail) = recorder.counts();
        let injected: u32 = faults.values().sum();
        let by_kind: Vec<String> = faults.iter().map(|(kind, count)| format!("{kind}={count}")).collect();
        eprintln!(
            "nemesis summary: seed {seed}, {seconds} s: {issued} ops issued, recorded {} (ok {ok}, unknown \
             {unknown}, fail {fail}); faults {injected} ({}); checker: {}; history {}",
            ok + unknown + fail,
            by_kind.join(" "),
            verdict.summary,
            history.display()
        );
        assert_eq!(
            verdict.code,
            0,
            "the checker did not find the history linearizable: {} {} (history {}, visualization {})",
            verdict.summary,
            verdict.stderr,
            history.display(),
            html.display()
        );
        assert!(verdict.summary.starts_with("linearizable: "), "{verdict:?}");
        // A run that injected nothing or served almost nothing would pass vacuously.
        assert!(injected as u64 >= seconds / 4, "only {injected} faults in {seconds} s");
        if seconds >= 15 {
            assert!(
                faults.values().all(|&count| count > 0),
                "a kind of fault was never injected: {faults:?}"
            );
        }
        assert!(ok >= 200, "only {ok} operations completed");
    });
}

/// Linearizability while the cluster's member list changes (4 shards of 3 replicas): four
/// checked client tasks that know only nodes 1-3 run while `onekv node add` brings in a fifth...
/// a fourth node (replicas and a leadership move onto it), `onekv node remove 1` takes an
/// original member out (its replicas and leaderships move off it; clients that ask it are sent
/// on), and node 2 is killed and restarted in between. The history must be linearizable.
#[test]
fn linearizable_while_nodes_join_and_leave() {
    let _serial = one_at_a_time();
    let seed = nemesis::env_number("ONEKV_NEMESIS_SEED", rand::random::<u32>().into());
    eprintln!("member changes: seed {seed} (replay with ONEKV_NEMESIS_SEED={seed})");
    nemesis::build_checker();
    run_bounded(Duration::from_secs(240), async move {
        let mut cluster = TestCluster::start(3, |config| {
            config.cluster.shards = 4;
            config.cluster.replicas = Some(3);
        })
        .await;
        let endpoints: Vec<String> =
            cluster.ids().iter().map(|&id| cluster.endpoint(id).to_string()).collect();
        let secret = cluster.peer_secret_file();
        let recorder = Recorder::new();
        let keys = nemesis::keys(8);
        let workload = Workload::start(&cluster, 4, keys.clone(), &recorder, seed, false);
        let spare = cluster.add_spare().await;
        let (ok, text) =
            common::onekv_node(vec!["add".into(), cluster.endpoint(spare).into()], &endpoints, &secret).await;
        assert!(ok, "onekv node add failed: {text}");
        cluster.kill9(2);
        tokio::time::sleep(Duration::from_millis(500)).await;
        cluster.restart(2).await;
        let (ok, text) = common::onekv_node(vec!["remove".into(), "1".into()], &endpoints, &secret).await;
        assert!(ok, "onekv node remove failed: {text}");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let issued = workload.stop().await;
        // Final reads through a client that knows only the removed node.
        let client = Client::new(vec![cluster.endpoint(1).to_string()], nemesis::workload_client_options())
            .expect("a client");
        for key in &keys {
            let call = recorder.now();
            let value = client.get(key.as_bytes()).await.expect("a final read through the removed node");
            let value = value.map(|value| String::from_utf8(value).expect("values are UTF-8"));
            let response = Response { value, swapped: false };
            recorder.record(FINAL_READER, key, Request::Get, (call, recorder.now()), Outcome::Ok, response);
        }
        let (history, html) = history_paths("members", seed);
        recorder.write(&history, seed);
        let verdict = nemesis::check_history(&history, &html, CHECK_TIMEOUT);
        let (ok, unknown, fail) = recorder.counts();
        eprintln!(
            "member changes: {issued} ops issued, recorded ok {ok}, unknown {unknown}, fail {fail}; checker: {}",
            verdict.summary
        );
        assert_eq!(
            verdict.code,
            0,
            "not linearizable: {} {} (history {})",
            verdict.summary,
            verdict.stderr,
            history.display()
        );
        assert!(ok > 200, "the workload made little progress: {ok} operations succeeded");
    });
}

#[test]
fn stale_reads_from_an_isolated_follower_are_caught() {
    let _serial = one_at_a_time();
    let seed: u64 = rand::random::<u32>().into();
    nemesis::build_checker();
    run_bounded(Duration::from_secs(60), async move {
        let network = Network::start(&[1, 2, 3]).await;
        let mut cluster = TestCluster::start(3, |config| network.tweak(config)).await;
        let recorder = Recorder::new();
        // Linearizable traffic on other keys all along: the checker must blame only the stale key.
        let workload = Workload::start(&cluster, 2, nemesis::keys(4), &recorder, seed, false);
        let (writer, stale_reader) = (100, 101);
        let key = "stale";

        let leader = cluster.leader().await;
        let follower = cluster.ids().into_iter().find(|&id| id != leader).expect("a follower");
        let client = cluster.client();
        let call = recorder.now();
        let index = client.put(key.as_bytes(), b"before").await.expect("a put with no fault");
        recorder.record(
            writer,
            key,
            Request::Put("before"),
            (call, recorder.now()),
            Outcome::Ok,
            Response::default(),
        );
        cluster.wait_applied(follower, index).await;

        // The broken variant: a "linearizable" read served from the local state of a node the
        // nemesis cut off, while the majority goes on writing.
        network.isolate(follower);
        for round in 0..3 {
            let value = format!("after-{round}");
            let call = recorder.now();
            client.put(key.as_bytes(), value.as_bytes()).await.expect("a put through the majority");
            recorder.record(
                writer,
                key,
                Request::Put(&value),
                (call, recorder.now()),
                Outcome::Ok,
                Response::default(),
            );

            let call = recorder.now();
            let read = client.get_stale(key.as_bytes(), Some(cluster.endpoint(follower))).await;
            let ret = recorder.now();
            let read = read.expect("the isolated follower answers stale reads");
            assert_eq!(
                read.as_deref(),
                Some(&b"before"[..]),
                "the isolated follower cannot have seen {value}"
            );
            let response = Response { value: Some("before".into()), swapped: false };
            recorder.record(stale_reader, key, Request::Get, (call, ret), Outcome::Ok, response);
        }
        network.heal_all();
        workload.stop().await;

        let (history, html) = history_paths("broken", seed);
        recorder.write(&history, seed);
        let verdict = nemesis::check_history(&history, &html, CHECK_TIMEOUT);
        eprintln!("broken variant: checker: {}; history {}", verdict.summary, history.display());
        assert_eq!(verdict.code, 1, "the checker missed the stale reads: {verdict:?}");
        assert!(
            verdict.summary.starts_with(r#"NOT linearizable: key "stale" ("#),
            "the checker should blame the stale key alone: {verdict:?}"
        );
        assert!(html.exists(), "no visualization at {}", html.display());
    });
}

/// The checker's own Go tests: hand-written linearizable and non-linearizable histories, unknown
/// writes, exit codes and the visualization. Run from here so that `cargo test` covers them.
#[test]
fn checker_passes_its_own_tests() {
    let _serial = one_at_a_time();
    let output = nemesis::output_within(
        std::process::Command::new(nemesis::find_go())
            .args(["test", "-count=1", "."])
            .current_dir(nemesis::checker_source()),
        nemesis::GO_TIMEOUT,
    );
    assert!(
        output.status.success(),
        "go test in tools/linearizability failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
