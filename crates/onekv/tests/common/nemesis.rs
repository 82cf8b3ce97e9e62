//! Support for the nemesis tests: a fault-injecting TCP proxy on every directed link between
//! nodes, a recorder of client operations with their call and return times, a randomized client
//! workload, and running the Go linearizability checker (`tools/linearizability`) on a history.
//!
//! Owns: how links are cut and healed, how each client operation's outcome is classified (ok,
//! fail, unknown) and written as the checker's JSON history, and how the checker is built and run.
//! Does not own: the processes (`common::TestCluster`) or which faults a test injects when.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use onekv_client::{Client, ClientError, ClientOptions};
use onekv_server::ServerConfig;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Client options for the workload: attempts short enough that an operation stuck on a paused or
/// cut-off node gives up (and is recorded as unknown) within a few seconds.
pub fn workload_client_options() -> ClientOptions {
    ClientOptions {
        request_timeout: Duration::from_millis(1000),
        retry_budget: Duration::from_secs(5),
        max_attempts: 5,
        backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(300),
        connect_timeout: Duration::from_millis(500),
        cluster_secret: None,
        ..ClientOptions::default()
    }
}

/// One directed link `from → to`: a listener node `from` dials instead of `to`'s real address.
struct Link {
    address: String,
    /// `true` while the link is cut.
    cut: watch::Sender<bool>,
}

/// A TCP proxy per directed link between the members, so a test can cut and heal links. Node `i`'s
/// configuration names every other member `j` at the proxy of link `i → j`; the proxy forwards to
/// `j`'s real listen address. Cutting a link closes its open connections and closes every new one
/// at once (until healed), so the sender's transport sees errors, not silence. Clients dial the
/// nodes' real addresses and are never cut off (except when following a redirect, whose address
/// comes from the redirecting node's configuration: a proxy).
pub struct Network {
    ids: Vec<u64>,
    links: HashMap<(u64, u64), Link>,
    /// Each node's real listen address, learnt when its configuration is written.
    real: Arc<Mutex<HashMap<u64, String>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Network {
    /// Starts a proxy for every ordered pair of distinct `ids`.
    pub async fn start(ids: &[u64]) -> Network {
        let real = Arc::new(Mutex::new(HashMap::new()));
        let mut links = HashMap::new();
        let mut tasks = Vec::new();
        for &from in ids {
            for &to in ids.iter().filter(|&&to| to != from) {
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding a proxy port");
                let address = listener.local_addr().expect("the proxy's address").to_string();
                let (cut, _) = watch::channel(false);
                tasks.push(tokio::spawn(forward(listener, to, Arc::clone(&real), cut.subscribe())));
                links.insert((from, to), Link { address, cut });
            }
        }
        Network { ids: ids.to_vec(), links, real, tasks }
    }

    /// Rewrites a node's configuration to reach every other member through its proxies, and
    /// remembers the node's real address. Pass it as `TestCluster::start`'s `tweak`.
    pub fn tweak(&self, config: &mut ServerConfig) {
        let id = config.node_id;
        self.real.lock().unwrap().insert(id, config.listen.clone());
        for member in config.members.iter_mut().filter(|member| member.id != id) {
            member.address = self.links[&(id, member.id)].address.clone();
        }
    }

    /// Cuts (`true`) or heals (`false`) the link `from → to`.
    pub fn set_cut(&self, from: u64, to: u64, cut: bool) {
        self.links[&(from, to)].cut.send_replace(cut);
    }

    /// Cuts both directions between `a` and `b`.
    pub fn cut_pair(&self, a: u64, b: u64) {
        self.set_cut(a, b, true);
        self.set_cut(b, a, true);
    }

    /// Cuts every link that crosses from one side to another (both directions).
    pub fn partition(&self, sides: &[Vec<u64>]) {
        for (i, side) in sides.iter().enumerate() {
            for other in &sides[i + 1..] {
                for &a in side {
                    for &b in other {
                        self.cut_pair(a, b);
                    }
                }
            }
        }
    }

    /// Cuts every link to and from `id`.
    pub fn isolate(&self, id: u64) {
        for &other in self.ids.iter().filter(|&&other| other != id) {
            self.cut_pair(id, other);
        }
    }

    /// Heals every link.
    pub fn heal_all(&self) {
        for link in self.links.values() {
            link.cut.send_replace(false);
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The accept loop of one proxy: forwards each connection to node `to` while the link is whole.
async fn forward(
    listener: TcpListener,
    to: u64,
    real: Arc<Mutex<HashMap<u64, String>>>,
    cut: watch::Receiver<bool>,
) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            // Out of file descriptors, say: wait rather than spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let mut cut = cut.clone();
        if *cut.borrow_and_update() {
            continue; // Dropped: closed at once.
        }
        let Some(target) = real.lock().unwrap().get(&to).cloned() else { continue };
        tokio::spawn(async move {
            let Ok(Ok(mut outbound)) =
                tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(&target)).await
            else {
                return; // The node is down: close the inbound side, as a refused connection would.
            };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                // Cut: both ends are dropped, so both nodes see the connection close.
                _ = cut.wait_for(|cut| *cut) => {}
            }
        });
    }
}

/// How an operation ended, in the checker's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Completed; its output is recorded.
    Ok,
    /// Definitely did not take effect.
    Fail,
    /// May or may not have taken effect.
    Unknown,
}

impl Outcome {
    fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Fail => "fail",
            Outcome::Unknown => "unknown",
        }
    }

    /// The outcome of a write that returned `error`. Only an error that proves the request was
    /// rejected before it could be proposed is a failure; a timeout, an unavailable node, a
    /// redirect loop or a server error after proposing may all hide a write that commits later.
    pub fn of_write_error(error: &ClientError) -> Outcome {
        match error {
            ClientError::InvalidArgument(_)
            | ClientError::NoEndpoints
            | ClientError::InvalidEndpoint { .. } => Outcome::Fail,
            _ => Outcome::Unknown,
        }
    }
}

/// Every client operation of a run, with call and return times on one clock.
pub struct Recorder {
    started: Instant,
    operations: Mutex<Vec<Value>>,
}

/// What an operation asked for, for the history.
pub enum Request<'a> {
    /// A read.
    Get,
    /// A write of `value`.
    Put(&'a str),
    /// A delete.
    Delete,
    /// A compare-and-swap (`None`: absent / delete).
    Cas { expected: Option<&'a str>, new: Option<&'a str> },
}

/// What a completed operation returned, for the history.
#[derive(Default)]
pub struct Response {
    /// Get: the value read; cas: the key's value afterwards (`None`: absent).
    pub value: Option<String>,
    /// Cas: whether it swapped.
    pub swapped: bool,
}

impl Recorder {
    /// An empty history whose clock starts now.
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder { started: Instant::now(), operations: Mutex::new(Vec::new()) })
    }

    /// Nanoseconds since the recorder was created.
    pub fn now(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    /// Records one operation of `client` on `key`, called at `call` and answered at `ret`.
    pub fn record(
        &self,
        client: u64,
        key: &str,
        request: Request<'_>,
        (call, ret): (u64, u64),
        outcome: Outcome,
        response: Response,
    ) {
        let mut op = json!({
            "client": client,
            "key": key,
            "call": call,
            "return": ret,
            "status": outcome.name(),
            "output": {
                "found": response.value.is_some(),
                "value": response.value.unwrap_or_default(),
                "swapped": response.swapped,
            },
        });
        let fields = op.as_object_mut().expect("an object");
        match request {
            Request::Get => fields.insert("kind".into(), "get".into()),
            Request::Put(value) => {
                fields.insert("value".into(), value.into());
                fields.insert("kind".into(), "put".into())
            }
            Request::Delete => fields.insert("kind".into(), "delete".into()),
            Request::Cas { expected, new } => {
                fields.insert("expected".into(), expected.into());
                fields.insert("new".into(), new.into());
                fields.insert("kind".into(), "cas".into())
            }
        };
        self.operations.lock().unwrap().push(op);
    }

    /// How many operations ended each way: `(ok, unknown, fail)`.
    pub fn counts(&self) -> (usize, usize, usize) {
        let operations = self.operations.lock().unwrap();
        let count = |status: &str| operations.iter().filter(|op| op["status"] == status).count();
        (count("ok"), count("unknown"), count("fail"))
    }

    /// Writes the history (the checker's JSON format) to `path`, with `seed` for the record.
    pub fn write(&self, path: &Path, seed: u64) {
        let operations = self.operations.lock().unwrap();
        let history = json!({ "seed": seed, "operations": *operations });
        std::fs::write(path, serde_json::to_vec(&history).expect("a history serializes"))
            .unwrap_or_else(|error| panic!("writing the history to {}: {error}", path.display()));
    }
}

/// The workload's keys.
pub fn keys(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("k{i}")).collect()
}

/// Runs one client task until `stop`: random gets, puts of unique values, compare-and-swaps and
/// deletes over `keys`, each recorded; the puts and deletes by the fast path when `fast`
/// (`Client::put_fast`, its fallback included). Returns how many operations it issued.
#[allow(clippy::too_many_arguments)]
pub async fn client_task(
    id: u64,
    client: Client,
    keys: Arc<Vec<String>>,
    recorder: Arc<Recorder>,
    stop: Arc<AtomicBool>,
    seed: u64,
    fast: bool,
) -> u64 {
    // A fast write that failed may still be applied later (its records are durable on some
    // replicas, and a later leader that holds one orders it): never a definite failure.
    let write_outcome =
        |error: &ClientError| if fast { Outcome::Unknown } else { Outcome::of_write_error(error) };
    let mut rng = StdRng::seed_from_u64(seed);
    // The last value this task saw for each key: what its compare-and-swaps expect, so that
    // some of them swap.
    let mut last_seen: HashMap<String, Option<String>> = HashMap::new();
    let mut issued = 0;
    let mut done_fast = 0;
    while !stop.load(Ordering::Relaxed) {
        let key = keys[rng.random_range(0..keys.len())].clone();
        let unique = format!("c{id}-{issued}");
        let choice = rng.random_range(0..100);
        let call = recorder.now();
        issued += 1;
        if choice < 40 {
            let result = client.get(key.as_bytes()).await;
            let ret = recorder.now();
            // A read that failed tells nothing and changes nothing: it is not recorded.
            if let Ok(value) = result {
                let value = value.map(|value| String::from_utf8(value).expect("values are UTF-8"));
                last_seen.insert(key.clone(), value.clone());
                recorder.record(
                    id,
                    &key,
                    Request::Get,
                    (call, ret),
                    Outcome::Ok,
                    Response { value, swapped: false },
                );
            }
        } else if choice < 70 {
            let result = match fast {
                true => client
                    .put_fast(key.as_bytes(), unique.as_bytes())
                    .await
                    .map(|done| done_fast += u64::from(done.fast)),
                false => client.put(key.as_bytes(), unique.as_bytes()).await.map(drop),
            };
            let ret = recorder.now();
            let outcome = result.as_ref().map_or_else(write_outcome, |_| Outcome::Ok);
            if outcome == Outcome::Ok {
                last_seen.insert(key.clone(), Some(unique.clone()));
            }
            recorder.record(id, &key, Request::Put(&unique), (call, ret), outcome, Response::default());
        } else if choice < 90 {
            let expected = last_seen.get(&key).cloned().flatten();
            let new = (rng.random_range(0..10) > 0).then_some(unique);
            let result = client
                .cas(
                    key.as_bytes(),
                    expected.as_deref().map(str::as_bytes),
                    new.as_deref().map(str::as_bytes),
                )
                .await;
            let ret = recorder.now();
            let request = Request::Cas { expected: expected.as_deref(), new: new.as_deref() };
            match result {
                Ok(cas) => {
                    let value = cas.current.map(|value| String::from_utf8(value).expect("values are UTF-8"));
                    last_seen.insert(key.clone(), value.clone());
                    recorder.record(
                        id,
                        &key,
                        request,
                        (call, ret),
                        Outcome::Ok,
                        Response { value, swapped: cas.swapped },
                    );
                }
                Err(error) => {
                    recorder.record(
                        id,
                        &key,
                        request,
                        (call, ret),
                        Outcome::of_write_error(&error),
                        Response::default(),
                    );
                }
            }
        } else {
            let result = match fast {
                true => {
                    client.delete_fast(key.as_bytes()).await.map(|done| done_fast += u64::from(done.fast))
                }
                false => client.delete(key.as_bytes()).await.map(drop),
            };
            let ret = recorder.now();
            let outcome = result.as_ref().map_or_else(write_outcome, |_| Outcome::Ok);
            if outcome == Outcome::Ok {
                last_seen.insert(key.clone(), None);
            }
            recorder.record(id, &key, Request::Delete, (call, ret), outcome, Response::default());
        }
    }
    if fast {
        eprintln!("client {id}: {done_fast} writes done by the fast path, of {issued} operations");
    }
    issued
}

/// What the checker said about a history.
#[derive(Debug)]
pub struct Verdict {
    /// Its exit code: 0 linearizable, 1 not, 2 timed out, 3 unreadable history.
    pub code: i32,
    /// Its one-line summary.
    pub summary: String,
    /// Anything it printed to standard error.
    pub stderr: String,
}

/// Checks the history at `history` with the Go checker, giving it `timeout`, writing porcupine's
/// visualization to `html` if the history is not linearizable.
pub fn check_history(history: &Path, html: &Path, timeout: Duration) -> Verdict {
    let output = output_within(
        Command::new(checker_binary())
            .arg("-html")
            .arg(html)
            .arg("-timeout")
            .arg(format!("{}ms", timeout.as_millis()))
            .arg(history),
        timeout + Duration::from_secs(10),
    );
    Verdict {
        code: output.status.code().unwrap_or(-1),
        summary: String::from_utf8_lossy(&output.stdout).trim().to_string(),
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
    }
}

/// How long `go build` or `go test` of the checker may take (a first build downloads porcupine).
pub const GO_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs `command` to completion with its output captured; kills it and fails the test if it takes
/// longer than `limit` (a blocking wait inside a test's future would keep its time bound from
/// firing).
pub fn output_within(command: &mut Command, limit: Duration) -> std::process::Output {
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("starting {command:?}: {error}"));
    let pid = rustix::process::Pid::from_child(&child);
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match finished.recv_timeout(limit) {
        Ok(output) => output.unwrap_or_else(|error| panic!("waiting for {command:?}: {error}")),
        Err(_) => {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            panic!("{command:?} did not finish within {limit:?}");
        }
    }
}

/// Builds the checker now (once per test binary), so a slow or failing `go build` shows before a
/// cluster is started, not inside a test's time bound.
pub fn build_checker() {
    checker_binary();
}

/// The checker, built once per test binary into the target directory.
fn checker_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let go = find_go();
        let source = checker_source();
        let binary = Path::new(env!("CARGO_TARGET_TMPDIR")).join("onekv-linearizability");
        // The first build may fetch porcupine through the Go module proxy.
        let output = output_within(
            Command::new(&go).args(["build", "-o"]).arg(&binary).arg(".").current_dir(&source),
            GO_TIMEOUT,
        );
        assert!(
            output.status.success(),
            "building the linearizability checker in {} failed:\n{}",
            source.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        binary
    })
}

/// The checker's Go module, `tools/linearizability`.
pub fn checker_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/linearizability")
}

/// The `go` command: `$ONEKV_GO`, else `go` on the PATH, else `/usr/local/go/bin/go`. The nemesis
/// tests fail (never skip) without it: a skipped checker would report nothing as "no violations".
pub fn find_go() -> PathBuf {
    let candidates = std::env::var_os("ONEKV_GO")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("go"), PathBuf::from("/usr/local/go/bin/go")]);
    for candidate in candidates {
        if Command::new(&candidate).arg("version").output().is_ok_and(|output| output.status.success()) {
            return candidate;
        }
    }
    panic!(
        "the nemesis tests need Go (1.19 or later) to build the linearizability checker in \
         tools/linearizability: install it (https://go.dev/dl/) or point ONEKV_GO at the go command"
    );
}

/// A seeded random number generator for a nemesis schedule.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `name` from the environment as a number, or `default`.
pub fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(text) => text.trim().parse().unwrap_or_else(|_| panic!("{name}={text:?} is not a number")),
        Err(_) => default,
    }
}
