//! Running one command: [`RespContext`] holds what every connection of a node shares (the client,
//! the limits, the counters, the per-key locks, the SCAN cursors) and [`RespContext::execute`] turns
//! an argument vector into a [`Reply`].
//!
//! Owns: the meaning of each command in onekv's terms. Data commands go through
//! [`onekv_client::Client`], whose endpoints are every member with this node first, so any node
//! accepts any command and the client routes it to the leader (following redirects, retrying with
//! request ids). Reads are linearizable gets and scans; blind writes (decided by
//! [`commands::is_blind_write`]) are puts and batches; everything that returns or depends on the
//! state it finds is a read followed by compare-and-swap, retried a bounded number of times.
//! Does not own framing (`protocol`) or sockets (`server`).
//!
//! Read-modify-write commands on one key are combined per node: while one compare-and-swap on the
//! key is in flight, the commands that arrive queue up, and the next swap applies all of them in
//! arrival order, from the value it expects to the value after the last one. Every command's reply
//! is the state at its place in that sequence, so each is linearized at the swap, one after
//! another, within its own invocation. Clients of one node thus never make each other's swaps fail,
//! and a hot counter costs one Raft round per batch rather than per INCR. Clients of different
//! nodes may still race; the loser decides again on the value its failed swap returned.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onekv_client::{Client, ClientError, ClientOptions};
use rand::Rng as _;

use crate::commands::{self, CommandSpec, parse_set_options};
use crate::pattern::Pattern;
use crate::protocol::{ParserLimits, Protocol, Reply};

/// Reads one MGET or EXISTS keeps in flight at once.
const GET_MANY_CONCURRENCY: usize = 32;

/// Compare-and-swap attempts of one read-modify-write command before it reports contention.
const RMW_MAX_ATTEMPTS: u32 = 32;
/// Values this short are remembered after a successful swap, so the next read-modify-write of the
/// key (a counter, typically) can try its swap without reading first. A stale memory costs one
/// failed swap, which returns the current value: never a wrong result.
const REMEMBERED_VALUE_BYTES: usize = 32;
/// Most remembered values; the memory is cleared when it is full.
const REMEMBERED_VALUES: usize = 65_536;
/// SCAN cursors kept per node; the oldest is forgotten first.
const MAX_CURSORS: usize = 4096;
/// Largest reply MGET builds, so one request cannot make the node buffer gigabytes.
const MAX_REPLY_BYTES: usize = 64 << 20;
/// How long a connection's reply may wait for the socket to take any byte before the connection is
/// closed: a client that stops reading must not hold its task and its queued replies forever.
/// Generous, so only a client that truly stopped reading (or whose network died) is cut off.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// The Redis version whose behaviour the front end follows (reported by INFO and HELLO,
/// because client libraries gate features on it).
pub const REDIS_COMPATIBLE_VERSION: &str = "7.0.0";

/// What a node's RESP front end needs to know.
#[derive(Debug, Clone)]
pub struct RespSettings {
    /// This node's id.
    pub node_id: u64,
    /// Every member's gRPC address, this node's first.
    pub endpoints: Vec<String>,
    /// The RESP listen address (reported by INFO and CONFIG GET).
    pub resp_address: String,
    /// How the client times out and retries.
    pub client_options: ClientOptions,
    /// Most simultaneous connections; more are answered `-ERR max number of clients reached`.
    pub max_connections: usize,
    /// A connection whose socket accepts no reply byte for this long is closed and logged
    /// ([`DEFAULT_WRITE_TIMEOUT`]; at least 1 ms).
    pub write_timeout: Duration,
    /// The node's `limits.max_key_bytes`.
    pub max_key_bytes: usize,
    /// The node's `limits.max_value_bytes`.
    pub max_value_bytes: usize,
    /// The node's `limits.max_batch_ops` (MSET pairs per call).
    pub max_batch_ops: usize,
    /// The node's `limits.max_batch_bytes`.
    pub max_batch_bytes: usize,
    /// The node's `limits.max_scan_pairs` (SCAN's COUNT is capped to it).
    pub max_scan_pairs: usize,
}

impl RespSettings {
    /// Settings with onekv's default limits and client options.
    pub fn new(node_id: u64, endpoints: Vec<String>, resp_address: String) -> RespSettings {
        RespSettings {
            node_id,
            endpoints,
            resp_address,
            client_options: ClientOptions::default(),
            max_connections: 1024,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            max_key_bytes: 4096,
            max_value_bytes: 1 << 20,
            max_batch_ops: 1024,
            max_batch_bytes: 4 << 20,
            max_scan_pairs: 10_000,
        }
    }

    /// The request bounds that follow from the node's limits: any argument a valid command could
    /// carry fits, with slack so an over-limit value gets the node's own error rather than a
    /// protocol error.
    pub fn parser_limits(&self) -> ParserLimits {
        let slack = 64 << 10;
        let max_bulk_bytes = self.max_value_bytes.max(self.max_key_bytes) + slack;
        ParserLimits {
            // MSET of a full batch: the name and two arguments per pair.
            max_args: (self.max_batch_ops.saturating_mul(2) + 1).max(1024),
            max_bulk_bytes,
            max_inline_bytes: 64 << 10,
            max_request_bytes: self.max_batch_bytes.max(max_bulk_bytes) + slack,
        }
    }
}

/// Counters of the front end, reported by INFO.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) connections_received: AtomicU64,
    pub(crate) connected: AtomicU64,
    pub(crate) rejected: AtomicU64,
    /// Connections closed because their client stopped reading replies (the write timeout).
    pub(crate) write_timeouts: AtomicU64,
    pub(crate) commands_processed: AtomicU64,
}

/// What all connections of one node share. Cheap to clone.
#[derive(Clone)]
pub struct RespContext {
    shared: Arc<Shared>,
}

struct Shared {
    settings: RespSettings,
    client: Client,
    parser_limits: ParserLimits,
    started: Instant,
    stats: Stats,
    next_client_id: AtomicU64,
    /// Keys with a read-modify-write in flight, and the commands queued behind it.
    combining: Mutex<HashMap<Vec<u8>, Vec<Pending>>>,
    remembered: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    cursors: Mutex<Cursors>,
}

impl std::fmt::Debug for RespContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RespContext").field("settings", &self.shared.settings).finish_non_exhaustive()
    }
}

/// One connection's state.
#[derive(Debug, Clone)]
pub struct Session {
    id: u64,
    name: Option<Vec<u8>>,
    protocol: Protocol,
    /// The client's address, for CLIENT INFO.
    peer: Option<std::net::SocketAddr>,
    /// What CLIENT SETINFO said: the library's name and version.
    lib_name: Vec<u8>,
    lib_version: Vec<u8>,
}

impl Session {
    /// The reply encoding this connection chose with `HELLO` (RESP2 until then).
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// This session, for a client at `peer` (reported by CLIENT INFO).
    pub fn with_peer(mut self, peer: std::net::SocketAddr) -> Session {
        self.peer = Some(peer);
        self
    }
}

/// A command's reply, and whether the connection closes after it (QUIT).
#[derive(Debug)]
pub struct Executed {
    /// The reply to send.
    pub reply: Reply,
    /// Close the connection once the reply is written.
    pub close: bool,
}

type Outcome<T = Reply> = Result<T, Reply>;

impl From<ClientError> for Reply {
    fn from(error: ClientError) -> Reply {
        match error {
            ClientError::InvalidArgument(message) => Reply::err(format!("invalid argument: {message}")),
            other => Reply::err(format!("onekv: {other}")),
        }
    }
}

/// What a read-modify-write decides from the value it found.
enum Change {
    /// Swap in this value (`None`: delete) and answer this.
    Write(Option<Vec<u8>>, Reply),
    /// Write nothing and answer this.
    Keep(Reply),
}

/// A read-modify-write's decision: a pure function of the value found (it may run several times).
type Decide = Box<dyn FnMut(Option<&[u8]>) -> Outcome<Change> + Send>;

/// Should a key's driver panic, takes the key out of the map (answering its queue with an error, as
/// the dropped senders do), so later commands on the key start a new driver instead of queueing
/// behind a dead one forever.
struct UnwedgeOnPanic<'a> {
    context: &'a RespContext,
    key: &'a [u8],
}

impl Drop for UnwedgeOnPanic<'_> {
    fn drop(&mut self) {
        // Only on a panic: after a normal return the key may already belong to a new driver.
        if std::thread::panicking() {
            let shared = &self.context.shared;
            shared.combining.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(self.key);
        }
    }
}

/// A read-modify-write waiting for its key's next compare-and-swap.
struct Pending {
    decide: Decide,
    answer: tokio::sync::oneshot::Sender<Outcome>,
}

impl RespContext {
    /// The shared state of a node's front end. Connects nothing yet.
    pub fn new(settings: RespSettings) -> Result<RespContext, ClientError> {
        let client = Client::new(settings.endpoints.clone(), settings.client_options.clone())?;
        let mut random = rand::rng();
        Ok(RespContext {
            shared: Arc::new(Shared {
                parser_limits: settings.parser_limits(),
                settings,
                client,
                started: Instant::now(),
                stats: Stats::default(),
                next_client_id: AtomicU64::new(1),
                combining: Mutex::new(HashMap::new()),
                remembered: Mutex::new(HashMap::new()),
                // Random first ids, so a cursor from another node or an earlier run is unlikely to
                // name a live one; below 2^53 so clients that keep cursors as doubles are exact.
                cursors: Mutex::new(Cursors::new(random.random_range(1..1u64 << 52))),
            }),
        })
    }

    /// The settings it was made with.
    pub fn settings(&self) -> &RespSettings {
        &self.shared.settings
    }

    /// The request bounds for each connection's parser.
    pub fn parser_limits(&self) -> ParserLimits {
        self.shared.parser_limits
    }

    pub(crate) fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// A new connection's state, with a fresh client id.
    pub fn new_session(&self) -> Session {
        Session {
            id: self.shared.next_client_id.fetch_add(1, Ordering::Relaxed),
            name: None,
            protocol: Protocol::Resp2,
            peer: None,
            lib_name: Vec::new(),
            lib_version: Vec::new(),
        }
    }

    /// Runs one command (`args` is never empty: the parser skips empty requests) and records its
    /// metrics.
    pub async fn execute(&self, session: &mut Session, args: Vec<Vec<u8>>) -> Executed {
        let started = Instant::now();
        let spec = args.first().and_then(|name| commands::lookup(name));
        let op = spec.map_or("unknown", |spec| spec.name);
        let mut close = false;
        let reply = match spec {
            None => unknown_command(&args),
            Some(spec) if !spec.arity_ok(args.len()) => wrong_arity(spec.name),
            Some(spec) => {
                close = spec.name == "quit";
                self.run(spec, session, &args).await.unwrap_or_else(|error| error)
            }
        };
        self.shared.stats.commands_processed.fetch_add(1, Ordering::Relaxed);
        let outcome = if reply.is_error() { "error" } else { "ok" };
        metrics::counter!("onekv_requests_total", "protocol" => "resp", "op" => op, "outcome" => outcome)
            .increment(1);
        metrics::histogram!("onekv_request_duration_seconds", "protocol" => "resp", "op" => op)
            .record(started.elapsed().as_secs_f64());
        Executed { reply, close }
    }

    async fn run(&self, spec: &CommandSpec, session: &mut Session, args: &[Vec<u8>]) -> Outcome {
        if commands::is_blind_write(args) {
            return self.blind_write(args).await;
        }
        match spec.name {
            "ping" => match args {
                [_] => Ok(Reply::Simple("PONG".into())),
                [_, message] => Ok(Reply::Bulk(message.clone())),
                _ => Err(wrong_arity("ping")),
            },
            "echo" => Ok(Reply::Bulk(args[1].clone())),
            "quit" => Ok(Reply::ok()),
            "select" => match parse_integer(&args[1]) {
                Some(0) => Ok(Reply::ok()),
                Some(_) => Err(Reply::err("DB index is out of range")),
                None => Err(not_an_integer()),
            },
            "hello" => self.hello(session, args),
            "client" => client_command(session, args),
            "command" => command_command(args),
            "config" => self.config(args),
            "info" => self.info(args).await,
            "dbsize" => Ok(Reply::Integer(i64::try_from(self.count_keys().await?).unwrap_or(i64::MAX))),
            "get" => Ok(Reply::optional(self.get(&args[1]).await?)),
            "mget" => {
                let values = self.get_many(&args[1..], true).await?;
                Ok(Reply::Array(values.into_iter().map(Reply::optional).collect()))
            }
            "exists" => {
                let values = self.get_many(&args[1..], false).await?;
                Ok(Reply::Integer(values.iter().filter(|value| value.is_some()).count() as i64))
            }
            "strlen" => Ok(Reply::Integer(self.get(&args[1]).await?.map_or(0, |value| value.len()) as i64)),
            "set" => self.set(args).await,
            "mset" => Err(wrong_arity("mset")), // every well-formed MSET is a blind write
            "setnx" => {
                let swapped = self.insert_if_absent(&args[1], &args[2]).await?;
                Ok(Reply::Integer(i64::from(swapped)))
            }
            "del" | "unlink" => {
                let mut deleted = 0;
                for key in &args[1..] {
                    let reply = self
                        .read_modify_write(key, |current| {
                            Ok(if current.is_some() {
                                Change::Write(None, Reply::Integer(1))
                            } else {
                                Change::Keep(Reply::Integer(0))
                            })
                        })
                        .await?;
                    deleted += i64::from(reply == Reply::Integer(1));
                }
                Ok(Reply::Integer(deleted))
            }
            "getdel" => {
                self.read_modify_write(&args[1], |current| {
                    Ok(match current {
                        Some(value) => Change::Write(None, Reply::Bulk(value.to_vec())),
                        None => Change::Keep(Reply::Nil),
                    })
                })
                .await
            }
            "incr" => self.increment(&args[1], 1).await,
            "decr" => self.increment(&args[1], -1).await,
            "incrby" => self.increment(&args[1], parse_integer(&args[2]).ok_or_else(not_an_integer)?).await,
            "decrby" => {
                let by = parse_integer(&args[2]).ok_or_else(not_an_integer)?;
                let by = by.checked_neg().ok_or_else(|| Reply::err("decrement would overflow"))?;
                self.increment(&args[1], by).await
            }
            "append" => {
                let max = self.shared.settings.max_value_bytes;
                let suffix = args[2].clone();
                self.read_modify_write(&args[1], move |current| {
                    let mut value = current.unwrap_or_default().to_vec();
                    if value.len() + suffix.len() > max {
                        return Err(Reply::err(format!(
                            "string exceeds maximum allowed size (onekv's limits.max_value_bytes = {max})"
                        )));
                    }
                    value.extend_from_slice(&suffix);
                    let len = value.len() as i64;
                    Ok(Change::Write(Some(value), Reply::Integer(len)))
                })
                .await
            }
            "scan" => self.scan(args).await,
            other => Err(Reply::err(format!("command '{other}' is in the table but not implemented"))),
        }
    }

    /// SET without NX/XX/GET and MSET: no read, no compare-and-swap.
    async fn blind_write(&self, args: &[Vec<u8>]) -> Outcome {
        let client = &self.shared.client;
        if args[0].eq_ignore_ascii_case(b"set") {
            client.put(&args[1], &args[2]).await?;
            self.forget(&args[1]);
        } else {
            let pairs: Vec<(Vec<u8>, Option<Vec<u8>>)> =
                args[1..].chunks_exact(2).map(|pair| (pair[0].clone(), Some(pair[1].clone()))).collect();
            for (key, _) in &pairs {
                self.forget(key);
            }
            // Atomic within each shard; the shards' parts apply independently (docs/redis.md).
            client.batch_per_shard(pairs).await?;
        }
        Ok(Reply::ok())
    }

    async fn set(&self, args: &[Vec<u8>]) -> Outcome {
        let options = parse_set_options(&args[3..]).map_err(Reply::err)?;
        let (key, value) = (&args[1], args[2].clone());
        // Checked here, not left to the node: this SET may be combined with other commands on the
        // key into one compare-and-swap, and its error must be its own.
        let max = self.shared.settings.max_value_bytes;
        if value.len() > max {
            return Err(Reply::err(format!(
                "string exceeds maximum allowed size (onekv's limits.max_value_bytes = {max})"
            )));
        }
        if options.nx && !options.get {
            let swapped = self.insert_if_absent(key, &value).await?;
            return Ok(if swapped { Reply::ok() } else { Reply::Nil });
        }
        self.read_modify_write(key, move |current| {
            let applies = if options.nx {
                current.is_none()
            } else if options.xx {
                current.is_some()
            } else {
                true
            };
            let old = Reply::optional(current.map(<[u8]>::to_vec));
            Ok(match (applies, options.get) {
                (true, true) => Change::Write(Some(value.clone()), old),
                (true, false) => Change::Write(Some(value.clone()), Reply::ok()),
                (false, true) => Change::Keep(old),
                (false, false) => Change::Keep(Reply::Nil),
            })
        })
        .await
    }

    /// One compare-and-swap from absent to `value`; whether it was set.
    async fn insert_if_absent(&self, key: &[u8], value: &[u8]) -> Outcome<bool> {
        let outcome = self.shared.client.cas(key, None, Some(value)).await?;
        if outcome.swapped {
            self.remember(key, Some(value));
        }
        Ok(outcome.swapped)
    }

    async fn increment(&self, key: &[u8], by: i64) -> Outcome {
        self.read_modify_write(key, move |current| {
            let old = match current {
                None => 0,
                Some(value) => parse_integer(value).ok_or_else(not_an_integer)?,
            };
            let new =
                old.checked_add(by).ok_or_else(|| Reply::err("increment or decrement would overflow"))?;
            Ok(Change::Write(Some(new.to_string().into_bytes()), Reply::Integer(new)))
        })
        .await
    }

    /// Runs `decide` on `key`'s value and swaps in its choice, combined with the other
    /// read-modify-writes of the key that this node has in flight (see the module docs).
    async fn read_modify_write(
        &self,
        key: &[u8],
        decide: impl FnMut(Option<&[u8]>) -> Outcome<Change> + Send + 'static,
    ) -> Outcome {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let pending = Pending { decide: Box::new(decide), answer };
        let start_driver = {
            let mut combining = self.shared.combining.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            match combining.get_mut(key) {
                Some(queue) => {
                    queue.push(pending);
                    false
                }
                None => {
                    combining.insert(key.to_vec(), vec![pending]);
                    true
                }
            }
        };
        if start_driver {
            // Its own task, so the key's queue keeps moving whatever happens to this connection.
            let context = self.clone();
            let key = key.to_vec();
            tokio::spawn(async move { context.drive(key).await });
        }
        answered.await.unwrap_or_else(|_| Err(Reply::err("onekv: the read-modify-write was dropped")))
    }

    /// Runs the queued read-modify-writes of `key`, one batch per compare-and-swap, until none is
    /// left; then the key leaves the map, and the next command starts a new driver.
    async fn drive(&self, key: Vec<u8>) {
        let _unwedge = UnwedgeOnPanic { context: self, key: &key };
        loop {
            let batch = {
                let mut combining =
                    self.shared.combining.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                let queue = combining.get_mut(&key).map(std::mem::take).unwrap_or_default();
                if queue.is_empty() {
                    combining.remove(&key);
                    return;
                }
                queue
            };
            self.run_batch(&key, batch).await;
        }
    }

    /// One batch: decide every command in order from the value found, swap the first value for the
    /// last, answer each. On a failed swap, decide again from the value it returned.
    async fn run_batch(&self, key: &[u8], mut batch: Vec<Pending>) {
        let answers = self.combined_swap(key, &mut batch).await;
        match answers {
            Ok(answers) => {
                for (pending, answer) in batch.into_iter().zip(answers) {
                    let _ = pending.answer.send(answer);
                }
            }
            Err(error) => {
                for pending in batch {
                    let _ = pending.answer.send(Err(error.clone()));
                }
            }
        }
    }

    async fn combined_swap(&self, key: &[u8], batch: &mut [Pending]) -> Outcome<Vec<Outcome>> {
        let client = &self.shared.client;
        // A remembered value is a guess: only a successful swap confirms it. Answers that write
        // nothing are only given from a value really read.
        let mut guessed = true;
        let mut current = self.remembered(key);
        if current.is_none() {
            current = client.get(key).await?;
            guessed = false;
        }
        for attempt in 0..RMW_MAX_ATTEMPTS {
            let mut value = current.clone();
            let mut writes = false;
            let mut answers = Vec::with_capacity(batch.len());
            for pending in batch.iter_mut() {
                answers.push(match (pending.decide)(value.as_deref()) {
                    Ok(Change::Write(new, answer)) => {
                        value = new;
                        writes = true;
                        Ok(answer)
                    }
                    Ok(Change::Keep(answer)) => Ok(answer),
                    Err(error) => Err(error),
                });
            }
            if !writes {
                if !guessed {
                    return Ok(answers);
                }
                self.forget(key);
                current = client.get(key).await?;
                guessed = false;
                continue;
            }
            let outcome = client.cas(key, current.as_deref(), value.as_deref()).await?;
            if outcome.swapped {
                self.remember(key, value.as_deref());
                return Ok(answers);
            }
            current = outcome.current;
            guessed = false;
            self.forget(key);
            if attempt >= 2 {
                // Another node's clients are changing the key too: spread the retries out.
                let millis = rand::rng().random_range(1..=2u64 << attempt.min(5));
                tokio::time::sleep(Duration::from_millis(millis)).await;
            }
        }
        Err(Reply::err(format!(
            "onekv: the key changed under {RMW_MAX_ATTEMPTS} compare-and-swap attempts in a row; try again"
        )))
    }

    fn remembered(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.shared.remembered.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(key).cloned()
    }

    fn remember(&self, key: &[u8], value: Option<&[u8]>) {
        let mut remembered = self.shared.remembered.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match value {
            Some(value) if value.len() <= REMEMBERED_VALUE_BYTES => {
                if remembered.len() >= REMEMBERED_VALUES {
                    remembered.clear();
                }
                remembered.insert(key.to_vec(), value.to_vec());
            }
            _ => {
                remembered.remove(key);
            }
        }
    }

    fn forget(&self, key: &[u8]) {
        self.shared.remembered.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(key);
    }

    /// Whether onekv could hold `key` at all: keys are non-empty and at most `max_key_bytes` long.
    /// Redis allows any key, so a read of one onekv cannot hold answers "absent" rather than
    /// failing; a write of one is refused by the node.
    fn storable(&self, key: &[u8]) -> bool {
        !key.is_empty() && key.len() <= self.shared.settings.max_key_bytes
    }

    /// A linearizable read of `key`.
    async fn get(&self, key: &[u8]) -> Outcome<Option<Vec<u8>>> {
        if !self.storable(key) {
            return Ok(None);
        }
        Ok(self.shared.client.get(key).await?)
    }

    /// Linearizable reads of every key, concurrently, in the keys' order.
    /// The values of `keys`, read [`GET_MANY_CONCURRENCY`] at a time, so one command never holds
    /// more than that many values beyond those it returns. With `keep_values` false (EXISTS) each
    /// value is dropped as soon as it arrives and only its presence is kept.
    async fn get_many(&self, keys: &[Vec<u8>], keep_values: bool) -> Outcome<Vec<Option<Vec<u8>>>> {
        let mut tasks = tokio::task::JoinSet::new();
        let mut pending = keys.iter().enumerate().filter(|(_, key)| self.storable(key));
        let mut values = vec![None; keys.len()];
        let mut total = 0usize;
        loop {
            while tasks.len() < GET_MANY_CONCURRENCY {
                let Some((position, key)) = pending.next() else { break };
                let client = self.shared.client.clone();
                let key = key.clone();
                tasks.spawn(async move {
                    let value = client.get(&key).await;
                    let value = match keep_values {
                        true => value,
                        false => value.map(|value| value.map(|_| Vec::new())),
                    };
                    (position, value)
                });
            }
            let Some(joined) = tasks.join_next().await else { break };
            let (position, value) =
                joined.map_err(|error| Reply::err(format!("onekv: read task failed: {error}")))?;
            let value = value?;
            total += value.as_ref().map_or(0, Vec::len);
            if total > MAX_REPLY_BYTES {
                return Err(Reply::err(format!(
                    "reply would exceed {MAX_REPLY_BYTES} bytes; ask for fewer keys"
                )));
            }
            values[position] = value;
        }
        Ok(values)
    }

    /// Every key, counted by paging through a linearizable keys-only scan: the node reads no value
    /// (INFO is many clients' ready check, and 1 MiB values would otherwise all be read to count).
    async fn count_keys(&self) -> Outcome<u64> {
        let page_size = u32::try_from(self.shared.settings.max_scan_pairs).unwrap_or(u32::MAX);
        let (mut start, mut skip) = (Vec::new(), None);
        let mut count = 0u64;
        loop {
            let page = self.shared.client.scan_keys(&start, None, page_size, false).await?;
            count += page.keys.iter().filter(|key| skip.as_ref() != Some(*key)).count() as u64;
            match page.keys.last() {
                Some(last) if page.more && skip.as_ref() != Some(last) => {
                    (start, skip) = start_after(last, self.shared.settings.max_key_bytes);
                }
                _ => return Ok(count),
            }
        }
    }

    /// `SCAN cursor [MATCH pattern] [COUNT n] [TYPE type]`.
    async fn scan(&self, args: &[Vec<u8>]) -> Outcome {
        let cursor = std::str::from_utf8(&args[1])
            .ok()
            .and_then(|text| text.parse::<u64>().ok())
            .ok_or_else(|| Reply::err("invalid cursor"))?;
        let mut pattern: Option<Pattern> = None;
        let mut count: usize = 10;
        let mut only_strings = true;
        let mut options = args[2..].iter();
        while let Some(option) = options.next() {
            let value = options.next().ok_or_else(|| Reply::err("syntax error"))?;
            match option.to_ascii_uppercase().as_slice() {
                b"MATCH" => pattern = Some(Pattern::parse(value)),
                b"COUNT" => {
                    count = parse_integer(value)
                        .ok_or_else(not_an_integer)?
                        .try_into()
                        .ok()
                        .filter(|&count: &usize| count >= 1)
                        .ok_or_else(|| Reply::err("syntax error"))?;
                }
                b"TYPE" => only_strings = value.eq_ignore_ascii_case(b"string"),
                _ => return Err(Reply::err("syntax error")),
            }
        }
        let resume = if cursor == 0 {
            None
        } else {
            let cursors = self.shared.cursors.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            Some(cursors.get(cursor).ok_or_else(|| {
                Reply::err("invalid cursor (unknown to this node, or forgotten: cursors live on the node that made them)")
            })?)
        };
        let prefix = pattern.as_ref().map(Pattern::literal_prefix).unwrap_or_default();
        let end = successor_of_prefix(&prefix);
        let (mut start, skip) = match &resume {
            Some(resume) => start_after(resume, self.shared.settings.max_key_bytes),
            None => (Vec::new(), None),
        };
        if start < prefix {
            start = prefix.clone();
        }
        let done = Reply::Array(vec![Reply::text("0"), Reply::Array(Vec::new())]);
        // A prefix longer than any key onekv can hold matches nothing (and the node would refuse
        // it as a scan bound).
        if prefix.len() > self.shared.settings.max_key_bytes || end.as_ref().is_some_and(|end| start >= *end)
        {
            return Ok(done);
        }
        let limit = (count + usize::from(skip.is_some())).min(self.shared.settings.max_scan_pairs);
        // Keys only: SCAN never returns values, so the node need not read them.
        let page = self.shared.client.scan_keys(&start, end.as_deref(), limit as u32, false).await?;
        let last = page.keys.last().cloned();
        let keys: Vec<Reply> = page
            .keys
            .into_iter()
            .filter(|key| skip.as_ref() != Some(key))
            .filter(|key| only_strings && pattern.as_ref().is_none_or(|pattern| pattern.matches(key)))
            .map(Reply::Bulk)
            .collect();
        let next = match last {
            Some(last) if page.more && skip.as_ref() != Some(&last) => {
                let mut cursors = self.shared.cursors.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                cursors.insert(last)
            }
            _ => 0,
        };
        Ok(Reply::Array(vec![Reply::text(next.to_string()), Reply::Array(keys)]))
    }

    /// `HELLO [protover [AUTH username password] [SETNAME clientname]]`. Like Redis, every option is
    /// checked before anything changes, and the reply is in the protocol just chosen. onekv has no
    /// users or passwords, which is Redis's default user without a password: `AUTH default <any
    /// password>` succeeds, any other user name is refused with Redis's `WRONGPASS` error.
    fn hello(&self, session: &mut Session, args: &[Vec<u8>]) -> Outcome {
        let mut protocol = session.protocol;
        if let Some(version) = args.get(1) {
            protocol = match parse_integer(version) {
                Some(2) => Protocol::Resp2,
                Some(3) => Protocol::Resp3,
                Some(_) => {
                    return Err(Reply::Error("NOPROTO sorry, this protocol version is not supported".into()));
                }
                None => return Err(Reply::err("Protocol version is not an integer or out of range")),
            };
        }
        let mut name = None;
        let mut options = args.iter().skip(2);
        while let Some(option) = options.next() {
            match option.to_ascii_uppercase().as_slice() {
                b"SETNAME" => {
                    let value = options.next().ok_or_else(|| Reply::err("syntax error"))?;
                    name = Some(check_client_name(value)?);
                }
                b"AUTH" => {
                    let (Some(user), Some(_password)) = (options.next(), options.next()) else {
                        return Err(Reply::err("syntax error"));
                    };
                    if user.as_slice() != b"default" {
                        return Err(Reply::Error(
                            "WRONGPASS invalid username-password pair or user is disabled.".into(),
                        ));
                    }
                }
                _ => {
                    return Err(Reply::err(format!(
                        "Syntax error in HELLO option '{}'",
                        String::from_utf8_lossy(option)
                    )));
                }
            }
        }
        if let Some(name) = name {
            session.name = Some(name).filter(|name| !name.is_empty());
        }
        session.protocol = protocol;
        Ok(Reply::map([
            ("server", Reply::text("onekv")),
            ("version", Reply::text(REDIS_COMPATIBLE_VERSION)),
            ("proto", Reply::Integer(protocol.version())),
            ("id", Reply::Integer(i64::try_from(session.id).unwrap_or(i64::MAX))),
            ("mode", Reply::text("standalone")),
            ("role", Reply::text("master")),
            ("modules", Reply::Array(Vec::new())),
        ]))
    }

    /// The parameters CONFIG GET answers, describing onekv in Redis's terms.
    fn config_parameters(&self) -> Vec<(&'static str, String)> {
        let settings = &self.shared.settings;
        let (host, port) = settings.resp_address.rsplit_once(':').unwrap_or(("", &settings.resp_address));
        vec![
            ("appendfsync", "always".into()),
            ("appendonly", "yes".into()),
            ("bind", host.trim_start_matches('[').trim_end_matches(']').to_string()),
            ("cluster-enabled", "no".into()),
            ("databases", "1".into()),
            ("maxclients", settings.max_connections.to_string()),
            ("maxmemory", "0".into()),
            ("maxmemory-policy", "noeviction".into()),
            ("port", port.to_string()),
            ("proto-max-bulk-len", self.shared.parser_limits.max_bulk_bytes.to_string()),
            ("save", String::new()),
            ("timeout", "0".into()),
        ]
    }

    fn config(&self, args: &[Vec<u8>]) -> Outcome {
        let subcommand = args[1].to_ascii_uppercase();
        match subcommand.as_slice() {
            b"GET" if args.len() >= 3 => {
                let patterns: Vec<Pattern> =
                    args[2..].iter().map(|pattern| Pattern::parse(&pattern.to_ascii_lowercase())).collect();
                let mut reply = Vec::new();
                for (name, value) in self.config_parameters() {
                    if patterns.iter().any(|pattern| pattern.matches(name.as_bytes())) {
                        reply.push((name, Reply::text(value)));
                    }
                }
                Ok(Reply::map(reply))
            }
            b"GET" => Err(wrong_arity("config|get")),
            b"SET" => Err(Reply::err("CONFIG SET is not supported: configure onekv in the node's TOML file")),
            b"RESETSTAT" => Ok(Reply::ok()),
            _ => Err(unknown_subcommand(&args[1], "CONFIG")),
        }
    }

    async fn info(&self, args: &[Vec<u8>]) -> Outcome {
        const SECTIONS: [&str; 5] = ["server", "clients", "replication", "stats", "keyspace"];
        let requested: Vec<String> =
            args[1..].iter().map(|section| String::from_utf8_lossy(section).to_ascii_lowercase()).collect();
        let all = requested.is_empty()
            || requested.iter().any(|section| matches!(section.as_str(), "default" | "all" | "everything"));
        let wanted = |section: &str| all || requested.iter().any(|requested| requested == section);
        let settings = &self.shared.settings;
        let stats = &self.shared.stats;
        let mut text = String::new();
        for section in SECTIONS.into_iter().filter(|section| wanted(section)) {
            if !text.is_empty() {
                text.push_str("\r\n");
            }
            let mut title = section.to_string();
            title[..1].make_ascii_uppercase();
            text.push_str(&format!("# {title}\r\n"));
            let mut field = |name: &str, value: String| text.push_str(&format!("{name}:{value}\r\n"));
            match section {
                "server" => {
                    let port = settings.resp_address.rsplit_once(':').map_or("", |(_, port)| port);
                    field("redis_version", REDIS_COMPATIBLE_VERSION.into());
                    field("onekv_version", env!("CARGO_PKG_VERSION").into());
                    field("redis_mode", "standalone".into());
                    field("os", std::env::consts::OS.into());
                    field("arch_bits", (usize::BITS).to_string());
                    field("process_id", std::process::id().to_string());
                    field("tcp_port", port.into());
                    field("uptime_in_seconds", self.shared.started.elapsed().as_secs().to_string());
                    field("onekv_node_id", settings.node_id.to_string());
                }
                "clients" => {
                    field("connected_clients", stats.connected.load(Ordering::Relaxed).to_string());
                    field("maxclients", settings.max_connections.to_string());
                }
                "replication" => {
                    // Every node accepts writes (it forwards them to the leader), so to a Redis
                    // client each one is a master; the Raft role is reported beside it.
                    field("role", "master".into());
                    field("connected_slaves", "0".into());
                    match self.shared.client.status(&settings.endpoints[0]).await {
                        Ok(status) => {
                            let leader = status.members.iter().find(|member| member.id == status.leader_id);
                            field("master_repl_offset", status.applied_index.to_string());
                            field("onekv_raft_role", status.role.clone());
                            field("onekv_leader_id", status.leader_id.to_string());
                            field(
                                "onekv_leader_address",
                                leader.map(|member| member.address.clone()).unwrap_or_default(),
                            );
                            field("onekv_term", status.term.to_string());
                            field("onekv_commit_index", status.commit_index.to_string());
                            field("onekv_applied_index", status.applied_index.to_string());
                            field("onekv_members", status.members.len().to_string());
                            field("onekv_storage", status.storage_mode.clone());
                            field("onekv_log_bytes", status.log_bytes.to_string());
                            field("onekv_write_amplification", format!("{:.2}", status.write_amplification));
                        }
                        Err(error) => field("onekv_status_error", error.to_string()),
                    }
                }
                "stats" => {
                    let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed).to_string();
                    field("total_connections_received", load(&stats.connections_received));
                    field("total_commands_processed", load(&stats.commands_processed));
                    field("rejected_connections", load(&stats.rejected));
                    field("onekv_write_timeout_disconnections", load(&stats.write_timeouts));
                }
                _ => {
                    let keys = self.count_keys().await?;
                    if keys > 0 {
                        field("db0", format!("keys={keys},expires=0,avg_ttl=0"));
                    }
                }
            }
        }
        // Plain text, which Redis sends as a verbatim string in RESP3 (a bulk string in RESP2).
        Ok(Reply::Verbatim(text))
    }
}

fn client_command(session: &mut Session, args: &[Vec<u8>]) -> Outcome {
    let subcommand = args[1].to_ascii_uppercase();
    match (subcommand.as_slice(), args.len()) {
        (b"SETNAME", 3) => {
            session.name = Some(check_client_name(&args[2])?).filter(|name| !name.is_empty());
            Ok(Reply::ok())
        }
        (b"GETNAME", 2) => Ok(Reply::optional(session.name.clone())),
        (b"ID", 2) => Ok(Reply::Integer(i64::try_from(session.id).unwrap_or(i64::MAX))),
        (b"SETINFO", 4) => {
            let value = &args[3];
            if value.iter().any(|&byte| !(b'!'..=b'~').contains(&byte)) {
                return Err(Reply::err(format!(
                    "{} cannot contain spaces, newlines or special characters.",
                    String::from_utf8_lossy(&args[2])
                )));
            }
            match args[2].to_ascii_lowercase().as_slice() {
                b"lib-name" => session.lib_name = value.clone(),
                b"lib-ver" => session.lib_version = value.clone(),
                _ => {
                    return Err(Reply::err(format!(
                        "Unrecognized option '{}'",
                        String::from_utf8_lossy(&args[2])
                    )));
                }
            }
            Ok(Reply::ok())
        }
        (b"INFO", 2) => {
            let peer = session.peer.map(|peer| peer.to_string()).unwrap_or_default();
            Ok(Reply::Verbatim(format!(
                "id={} addr={peer} name={} resp={} lib-name={} lib-ver={}\n",
                session.id,
                String::from_utf8_lossy(session.name.as_deref().unwrap_or_default()),
                session.protocol.version(),
                String::from_utf8_lossy(&session.lib_name),
                String::from_utf8_lossy(&session.lib_version),
            )))
        }
        (b"SETNAME" | b"GETNAME" | b"ID" | b"SETINFO" | b"INFO", _) => {
            Err(wrong_arity(&format!("client|{}", String::from_utf8_lossy(&args[1]).to_ascii_lowercase())))
        }
        _ => Err(unknown_subcommand(&args[1], "CLIENT")),
    }
}

fn check_client_name(name: &[u8]) -> Outcome<Vec<u8>> {
    if name.iter().any(|&byte| !(b'!'..=b'~').contains(&byte)) {
        return Err(Reply::err("Client names cannot contain spaces, newlines or special characters."));
    }
    Ok(name.to_vec())
}

fn command_command(args: &[Vec<u8>]) -> Outcome {
    let Some(subcommand) = args.get(1) else {
        return Ok(Reply::Array(commands::COMMANDS.iter().map(command_info).collect()));
    };
    let names = &args[2..];
    match subcommand.to_ascii_uppercase().as_slice() {
        b"COUNT" => Ok(Reply::Integer(commands::COMMANDS.len() as i64)),
        b"LIST" => Ok(Reply::Array(commands::COMMANDS.iter().map(|spec| Reply::text(spec.name)).collect())),
        b"INFO" => {
            let specs: Vec<Reply> = if names.is_empty() {
                commands::COMMANDS.iter().map(command_info).collect()
            } else {
                names
                    .iter()
                    .map(|name| commands::lookup(name).map_or(Reply::NilArray, command_info))
                    .collect()
            };
            Ok(Reply::Array(specs))
        }
        b"DOCS" => {
            let specs: Vec<&CommandSpec> = if names.is_empty() {
                commands::COMMANDS.iter().collect()
            } else {
                names.iter().filter_map(|name| commands::lookup(name)).collect()
            };
            let mut reply = Vec::new();
            for spec in specs {
                let mut doc = vec![
                    ("summary", Reply::text(spec.summary)),
                    ("since", Reply::text(spec.since)),
                    ("group", Reply::text(spec.group)),
                ];
                let arguments = argument_docs(commands::syntax(spec.name));
                if !arguments.is_empty() {
                    doc.push(("arguments", Reply::Array(arguments)));
                }
                reply.push((spec.name, Reply::map(doc)));
            }
            Ok(Reply::map(reply))
        }
        _ => Err(unknown_subcommand(subcommand, "COMMAND")),
    }
}

/// `COMMAND DOCS`'s argument specs for a [`commands::syntax`] string: one map (a flat array in
/// RESP2) per argument with its `name`, `type`, and `token`, `flags` and nested `arguments` where
/// they apply, as Redis 7 documents its own commands.
fn argument_docs(syntax: &str) -> Vec<Reply> {
    let mut docs = Vec::new();
    let mut rest = syntax.trim();
    while !rest.is_empty() {
        let end = match rest.as_bytes()[0] {
            b'[' => rest.find(']').map_or(rest.len(), |close| close + 1),
            // A block runs to its `)` and any `...` after it.
            b'(' => rest.find(')').map_or(rest.len(), |close| {
                rest[close..].find(' ').map_or(rest.len(), |space| close + space)
            }),
            _ => rest.find(' ').unwrap_or(rest.len()),
        };
        let (item, after) = rest.split_at(end);
        docs.push(argument_doc(item));
        rest = after.trim_start();
    }
    docs
}

fn argument_doc(item: &str) -> Reply {
    let (item, optional) = match item.strip_prefix('[').and_then(|inner| inner.strip_suffix(']')) {
        Some(inner) => (inner, true),
        None => (item, false),
    };
    let (item, multiple) = match item.strip_suffix("...") {
        Some(inner) => (inner, true),
        None => (item, false),
    };
    let mut fields = Vec::new();
    let mut field = |name: &'static str, value: Reply| fields.push((name, value));
    let is_token = |word: &str| word.chars().all(|c| c.is_ascii_uppercase());
    if let Some(block) = item.strip_prefix('(').and_then(|inner| inner.strip_suffix(')')) {
        field("name", Reply::text(block.replace(' ', "_")));
        field("type", Reply::text("block"));
        field("arguments", Reply::Array(argument_docs(block)));
    } else if item.contains('|') {
        field("name", Reply::text(item.to_ascii_lowercase().replace('|', "_")));
        field("type", Reply::text("oneof"));
        field("arguments", Reply::Array(argument_docs(&item.replace('|', " "))));
    } else if let Some((token, name)) = item.split_once(' ') {
        field("name", Reply::text(name));
        field("type", Reply::text("string"));
        field("token", Reply::text(token));
    } else if is_token(item) {
        field("name", Reply::text(item.to_ascii_lowercase()));
        field("type", Reply::text("pure-token"));
        field("token", Reply::text(item));
    } else {
        field("name", Reply::text(item));
        field("type", Reply::text(if item.starts_with("key") { "key" } else { "string" }));
    }
    let flags: Vec<Reply> = [("optional", optional), ("multiple", multiple)]
        .into_iter()
        .filter(|(_, set)| *set)
        .map(|(flag, _)| Reply::Simple(flag.into()))
        .collect();
    if !flags.is_empty() {
        field("flags", Reply::Array(flags));
    }
    Reply::map(fields)
}

/// `COMMAND INFO`'s ten-element description of a command (Redis 7's layout).
fn command_info(spec: &CommandSpec) -> Reply {
    let mut categories = Vec::new();
    for flag in spec.flags {
        match *flag {
            "readonly" => categories.push("@read"),
            "write" => categories.push("@write"),
            "fast" => categories.push("@fast"),
            _ => {}
        }
    }
    categories.push(match spec.group {
        "string" => "@string",
        "generic" => "@keyspace",
        "connection" => "@connection",
        _ => "@admin",
    });
    let simple =
        |items: &[&str]| Reply::Array(items.iter().map(|item| Reply::Simple((*item).into())).collect());
    Reply::Array(vec![
        Reply::text(spec.name),
        Reply::Integer(spec.arity),
        simple(spec.flags),
        Reply::Integer(spec.first_key),
        Reply::Integer(spec.last_key),
        Reply::Integer(spec.step),
        simple(&categories),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
    ])
}

fn unknown_command(args: &[Vec<u8>]) -> Reply {
    let mut message = format!(
        "unknown command '{}', with args beginning with: ",
        String::from_utf8_lossy(args.first().map_or(&[][..], Vec::as_slice))
    );
    for arg in args.iter().skip(1).take(16) {
        message.push_str(&format!("'{}' ", String::from_utf8_lossy(&arg[..arg.len().min(128)])));
    }
    Reply::err(message)
}

fn unknown_subcommand(subcommand: &[u8], command: &str) -> Reply {
    Reply::err(format!(
        "unknown subcommand '{}'. Try {command} HELP.",
        String::from_utf8_lossy(&subcommand[..subcommand.len().min(128)])
    ))
}

fn wrong_arity(name: &str) -> Reply {
    Reply::err(format!("wrong number of arguments for '{name}' command"))
}

fn not_an_integer() -> Reply {
    Reply::err("value is not an integer or out of range")
}

/// An integer as Redis's `string2ll` accepts it: optional `-`, digits without leading zeros (`0`
/// itself excepted), no `+`, no spaces, within `i64`.
pub fn parse_integer(text: &[u8]) -> Option<i64> {
    let digits = text.strip_prefix(b"-").unwrap_or(text);
    let valid = match digits {
        [b'0'] => text.len() == 1,
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if !valid || text.len() > 20 {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// Where a scan continues after `last`: at its successor `last ++ 0x00`, or, when that would be over
/// the key limit (the node refuses such a start), at `last` itself, which is then skipped (the
/// second value).
fn start_after(last: &[u8], max_key_bytes: usize) -> (Vec<u8>, Option<Vec<u8>>) {
    if last.len() < max_key_bytes {
        let mut start = last.to_vec();
        start.push(0);
        (start, None)
    } else {
        (last.to_vec(), Some(last.to_vec()))
    }
}

/// The smallest key above every key that starts with `prefix` (`None`: no such bound, the scan
/// runs to the end).
fn successor_of_prefix(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// SCAN cursors of one node: cursor number → the last key of the page it continues.
struct Cursors {
    next: u64,
    keys: HashMap<u64, Vec<u8>>,
    order: VecDeque<u64>,
}

impl Cursors {
    fn new(first: u64) -> Cursors {
        Cursors { next: first, keys: HashMap::new(), order: VecDeque::new() }
    }

    fn get(&self, cursor: u64) -> Option<Vec<u8>> {
        self.keys.get(&cursor).cloned()
    }

    fn insert(&mut self, key: Vec<u8>) -> u64 {
        let cursor = self.next;
        self.next = if self.next >= (1 << 53) - 1 { 1 } else { self.next + 1 };
        self.keys.insert(cursor, key);
        self.order.push_back(cursor);
        while self.order.len() > MAX_CURSORS {
            if let Some(oldest) = self.order.pop_front() {
                self.keys.remove(&oldest);
            }
        }
        cursor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_parse_as_redis_does() {
        for (text, value) in [("0", 0), ("-1", -1), ("42", 42), ("9223372036854775807", i64::MAX)] {
            assert_eq!(parse_integer(text.as_bytes()), Some(value), "{text}");
        }
        assert_eq!(parse_integer(b"-9223372036854775808"), Some(i64::MIN));
        for bad in ["", "-", "+1", "01", "-0", " 1", "1 ", "1.5", "9223372036854775808", "abc"] {
            assert_eq!(parse_integer(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn argument_docs_follow_redis_layout() {
        let text = |s: &str| Reply::text(s);
        assert_eq!(argument_docs("key"), vec![Reply::map([("name", text("key")), ("type", text("key"))])]);
        let set = argument_docs(commands::syntax("set"));
        assert_eq!(set.len(), 5);
        let token = |name: &str, token: &str| {
            Reply::map([("name", text(name)), ("type", text("pure-token")), ("token", text(token))])
        };
        assert_eq!(
            set[2],
            Reply::map([
                ("name", text("nx_xx")),
                ("type", text("oneof")),
                ("arguments", Reply::Array(vec![token("nx", "NX"), token("xx", "XX")])),
                ("flags", Reply::Array(vec![Reply::Simple("optional".into())])),
            ])
        );
        // In RESP2 the maps are flat arrays, as Redis sends them.
        assert_eq!(
            set[2].to_bytes(Protocol::Resp2),
            Reply::Array(vec![
                text("name"),
                text("nx_xx"),
                text("type"),
                text("oneof"),
                text("arguments"),
                Reply::Array(vec![
                    Reply::Array(vec![
                        text("name"),
                        text("nx"),
                        text("type"),
                        text("pure-token"),
                        text("token"),
                        text("NX")
                    ]),
                    Reply::Array(vec![
                        text("name"),
                        text("xx"),
                        text("type"),
                        text("pure-token"),
                        text("token"),
                        text("XX")
                    ]),
                ]),
                text("flags"),
                Reply::Array(vec![Reply::Simple("optional".into())]),
            ])
            .to_bytes(Protocol::Resp2)
        );
        let scan = argument_docs(commands::syntax("scan"));
        assert_eq!(
            scan[1],
            Reply::map([
                ("name", text("pattern")),
                ("type", text("string")),
                ("token", text("MATCH")),
                ("flags", Reply::Array(vec![Reply::Simple("optional".into())])),
            ])
        );
        let mset = argument_docs(commands::syntax("mset"));
        let Reply::Map(fields) = &mset[0] else { panic!() };
        assert_eq!(fields[..2], [(text("name"), text("key_value")), (text("type"), text("block"))]);
        assert_eq!(fields[3], (text("flags"), Reply::Array(vec![Reply::Simple("multiple".into())])));
        // Every documented command's syntax parses into named, typed arguments.
        for spec in commands::COMMANDS {
            for doc in argument_docs(commands::syntax(spec.name)) {
                let Reply::Map(fields) = doc else { panic!() };
                assert_eq!(fields[0].0, text("name"), "{}", spec.name);
                assert_eq!(fields[1].0, text("type"), "{}", spec.name);
            }
        }
    }

    #[test]
    fn a_panicking_driver_does_not_wedge_its_key() {
        let mut settings = RespSettings::new(1, vec!["127.0.0.1:1".into()], "127.0.0.1:6379".into());
        settings.client_options.max_attempts = 1;
        let context = RespContext::new(settings).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            // A remembered value lets the decision run before any network call.
            context.remember(b"k", Some(b"1"));
            let panicked = context.read_modify_write(b"k", |_| panic!("a decision that panics")).await;
            assert!(panicked.is_err());
            // The next command on the key gets a driver of its own and an answer (here an error:
            // nothing listens at the endpoint), instead of queueing forever.
            let next = tokio::time::timeout(
                Duration::from_secs(10),
                context.read_modify_write(b"k", |_| Ok(Change::Keep(Reply::ok()))),
            )
            .await
            .expect("the key is not wedged");
            assert!(next.is_err());
            assert!(context.shared.combining.lock().unwrap().is_empty());
        });
    }

    #[test]
    fn scans_continue_just_past_the_last_key() {
        assert_eq!(start_after(b"ab", 4), (b"ab\0".to_vec(), None));
        assert_eq!(start_after(b"abcd", 4), (b"abcd".to_vec(), Some(b"abcd".to_vec())));
    }

    #[test]
    fn prefix_successors() {
        assert_eq!(successor_of_prefix(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(successor_of_prefix(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(successor_of_prefix(b"\xff\xff"), None);
        assert_eq!(successor_of_prefix(b""), None);
    }

    #[test]
    fn cursors_are_bounded_and_forget_the_oldest() {
        let mut cursors = Cursors::new(7);
        let first = cursors.insert(b"a".to_vec());
        assert_eq!(first, 7);
        assert_eq!(cursors.get(first), Some(b"a".to_vec()));
        for i in 0..MAX_CURSORS {
            cursors.insert(i.to_string().into_bytes());
        }
        assert_eq!(cursors.get(first), None);
        assert_eq!(cursors.keys.len(), MAX_CURSORS);
        let mut wrapping = Cursors::new((1 << 53) - 1);
        wrapping.insert(Vec::new());
        assert_eq!(wrapping.insert(Vec::new()), 1);
    }

    #[test]
    fn parser_limits_fit_the_node_limits() {
        let settings = RespSettings::new(1, vec!["127.0.0.1:1".into()], "127.0.0.1:6379".into());
        let limits = settings.parser_limits();
        assert!(limits.max_bulk_bytes > settings.max_value_bytes);
        assert!(limits.max_args > 2 * settings.max_batch_ops);
        assert!(limits.max_request_bytes > settings.max_batch_bytes);
    }

    fn context() -> RespContext {
        // An address nothing listens on: the commands tested here never reach the cluster.
        RespContext::new(RespSettings::new(1, vec!["127.0.0.1:1".into()], "127.0.0.1:6379".into())).unwrap()
    }

    fn run(context: &RespContext, session: &mut Session, command: &[&str]) -> Reply {
        let args = command.iter().map(|arg| arg.as_bytes().to_vec()).collect();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(context.execute(session, args)).reply
    }

    #[test]
    fn connection_commands_answer_locally() {
        let context = context();
        let mut session = context.new_session();
        let s = &mut session;
        assert_eq!(run(&context, s, &["PING"]), Reply::Simple("PONG".into()));
        assert_eq!(run(&context, s, &["ping", "hi"]), Reply::text("hi"));
        assert_eq!(run(&context, s, &["ECHO", ""]), Reply::text(""));
        assert_eq!(run(&context, s, &["SELECT", "0"]), Reply::ok());
        assert_eq!(run(&context, s, &["SELECT", "1"]), Reply::err("DB index is out of range"));
        assert_eq!(run(&context, s, &["CLIENT", "GETNAME"]), Reply::Nil);
        assert_eq!(run(&context, s, &["CLIENT", "SETNAME", "bench"]), Reply::ok());
        assert_eq!(run(&context, s, &["CLIENT", "GETNAME"]), Reply::text("bench"));
        assert!(run(&context, s, &["CLIENT", "SETNAME", "a b"]).is_error());
        assert_eq!(
            run(&context, s, &["CONFIG", "GET", "save", "APPENDONLY"]),
            Reply::map([("appendonly", Reply::text("yes")), ("save", Reply::text(""))])
        );
        assert_eq!(run(&context, s, &["CONFIG", "GET", "nothing*"]), Reply::Map(Vec::new()));
        assert_eq!(run(&context, s, &["COMMAND", "COUNT"]), Reply::Integer(commands::COMMANDS.len() as i64));
        let Reply::Array(info) = run(&context, s, &["COMMAND", "INFO", "get", "nope"]) else { panic!() };
        assert_eq!(info[1], Reply::NilArray);
        let Reply::Array(get) = &info[0] else { panic!() };
        assert_eq!(get.len(), 10);
        assert_eq!(get[..2], [Reply::text("get"), Reply::Integer(2)]);
        // Keys onekv cannot hold read as absent, without asking the cluster.
        let too_long = "k".repeat(5000);
        assert_eq!(run(&context, s, &["GET", ""]), Reply::Nil);
        assert_eq!(run(&context, s, &["STRLEN", &too_long]), Reply::Integer(0));
        assert_eq!(run(&context, s, &["EXISTS", "", &too_long]), Reply::Integer(0));
        assert_eq!(run(&context, s, &["MGET", ""]), Reply::Array(vec![Reply::Nil]));
        let Reply::Map(docs) = run(&context, s, &["COMMAND", "DOCS"]) else { panic!() };
        assert_eq!(docs.len(), commands::COMMANDS.len());
    }

    #[test]
    fn hello_chooses_the_protocol() {
        let context = context();
        let mut session = context.new_session();
        let s = &mut session;
        let id = Reply::Integer(i64::try_from(s.id).unwrap());
        let hello = |proto: i64| {
            Reply::map([
                ("server", Reply::text("onekv")),
                ("version", Reply::text(REDIS_COMPATIBLE_VERSION)),
                ("proto", Reply::Integer(proto)),
                ("id", id.clone()),
                ("mode", Reply::text("standalone")),
                ("role", Reply::text("master")),
                ("modules", Reply::Array(Vec::new())),
            ])
        };
        assert_eq!(s.protocol(), Protocol::Resp2);
        assert_eq!(run(&context, s, &["HELLO"]), hello(2));
        assert_eq!(run(&context, s, &["HELLO", "3"]), hello(3));
        assert_eq!(s.protocol(), Protocol::Resp3);
        assert_eq!(run(&context, s, &["HELLO"]), hello(3));
        for bad in ["1", "4", "-1"] {
            assert_eq!(
                run(&context, s, &["HELLO", bad]),
                Reply::Error("NOPROTO sorry, this protocol version is not supported".into())
            );
        }
        assert!(run(&context, s, &["HELLO", "x"]).is_error());
        assert_eq!(s.protocol(), Protocol::Resp3);
        // A failing option changes nothing.
        assert_eq!(
            run(&context, s, &["HELLO", "2", "SETNAME", "y", "AUTH", "alice", "pw"]),
            Reply::Error("WRONGPASS invalid username-password pair or user is disabled.".into())
        );
        assert!(run(&context, s, &["HELLO", "2", "AUTH", "default"]).is_error());
        assert!(run(&context, s, &["HELLO", "2", "SETNAME"]).is_error());
        assert!(run(&context, s, &["HELLO", "2", "BOGUS"]).is_error());
        assert_eq!(s.protocol(), Protocol::Resp3);
        assert_eq!(run(&context, s, &["CLIENT", "GETNAME"]), Reply::Nil);
        // The default user has no password: any password is accepted.
        assert_eq!(
            run(&context, s, &["HELLO", "2", "AUTH", "default", "anything", "SETNAME", "x"]),
            hello(2)
        );
        assert_eq!(s.protocol(), Protocol::Resp2);
        assert_eq!(run(&context, s, &["CLIENT", "GETNAME"]), Reply::text("x"));
        assert_eq!(run(&context, s, &["CLIENT", "SETINFO", "lib-name", "redis-py"]), Reply::ok());
        assert_eq!(run(&context, s, &["CLIENT", "SETINFO", "LIB-VER", "8.0.0"]), Reply::ok());
        assert!(run(&context, s, &["CLIENT", "SETINFO", "lib-name", "a b"]).is_error());
        assert!(run(&context, s, &["CLIENT", "SETINFO", "other", "x"]).is_error());
        assert!(run(&context, s, &["CLIENT", "SETINFO", "lib-name"]).is_error());
        assert_eq!(run(&context, s, &["CLIENT", "ID"]), id);
        assert_eq!(
            run(&context, s, &["CLIENT", "INFO"]),
            Reply::Verbatim(format!("id={} addr= name=x resp=2 lib-name=redis-py lib-ver=8.0.0\n", s.id))
        );
    }

    #[test]
    fn malformed_commands_get_redis_errors() {
        let context = context();
        let mut session = context.new_session();
        let s = &mut session;
        assert_eq!(
            run(&context, s, &["FLUSHALL", "x"]),
            Reply::err("unknown command 'FLUSHALL', with args beginning with: 'x' ")
        );
        assert_eq!(run(&context, s, &["GET"]), Reply::err("wrong number of arguments for 'get' command"));
        assert_eq!(
            run(&context, s, &["MSET", "a", "1", "b"]),
            Reply::err("wrong number of arguments for 'mset' command")
        );
        assert_eq!(
            run(&context, s, &["INCRBY", "k", "x"]),
            Reply::err("value is not an integer or out of range")
        );
        assert_eq!(
            run(&context, s, &["DECRBY", "k", "-9223372036854775808"]),
            Reply::err("decrement would overflow")
        );
        assert!(run(&context, s, &["SET", "k", "v", "EX", "10"]).is_error());
        assert_eq!(run(&context, s, &["SET", "k", "v", "NX", "XX"]), Reply::err("syntax error"));
        assert_eq!(run(&context, s, &["SCAN", "x"]), Reply::err("invalid cursor"));
        assert_eq!(run(&context, s, &["SCAN", "0", "COUNT", "0"]), Reply::err("syntax error"));
        assert_eq!(run(&context, s, &["SCAN", "0", "MATCH"]), Reply::err("syntax error"));
        assert!(run(&context, s, &["SCAN", "12345"]).is_error());
        assert!(run(&context, s, &["CONFIG", "SET", "save", ""]).is_error());
        assert!(run(&context, s, &["COMMAND", "BOGUS"]).is_error());
        let executed = {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(context.execute(s, vec![b"QUIT".to_vec()]))
        };
        assert_eq!(executed.reply, Reply::ok());
        assert!(executed.close);
    }
}
