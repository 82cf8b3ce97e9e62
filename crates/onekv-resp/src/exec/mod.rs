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
//! The parts, by concern: this module dispatches ([`RespContext::execute`]) and holds the shared
//! state and the per-connection [`Session`]; `strings` the string commands that write and the
//! plain reads; `reads` the other commands that only read values (ranges, bits, LCS, TYPE, the
//! TTL family); `bytes` their arithmetic on values; `combine` the per-key compare-and-swap combiner
//! and the value cache; `types` the type of a value and the encoding the collections share (a
//! collection is one value behind a marker); `hashes`, `sets`, `lists` and `zsets` those types'
//! commands;
//! `sort` SORT; `blocking` BLPOP and the other blocking pops (attempts that wait between them);
//! `databases` SELECT's databases as ranges of the key space; `keyspace` SCAN,
//! its cursors, the commands that page through every key of a database (DBSIZE, KEYS,
//! RANDOMKEY) and FLUSHDB/FLUSHALL (a replicated range deletion); `transaction` MULTI/EXEC and the
//! multi-key writes run as transactions of their own (MSETNX, RENAME, COPY, MOVE); `scripting`
//! EVAL and SCRIPT, scripts run as transactions, in the Lua environment of `lua`; `admin` the node's own answers (HELLO,
//! CLIENT, COMMAND, CONFIG, INFO).
//!
//! Read-modify-write commands on one key are combined per node: while one compare-and-swap on the
//! key is in flight, the commands that arrive queue up, and the next swap applies all of them in
//! arrival order, from the value it expects to the value after the last one. Every command's reply
//! is the state at its place in that sequence, so each is linearized at the swap, one after
//! another, within its own invocation. Clients of one node thus never make each other's swaps fail,
//! and a hot counter costs one Raft round per batch rather than per INCR. Clients of different
//! nodes may still race; the loser decides again on the value its failed swap returned.

mod admin;
mod blocking;
mod bytes;
mod clients;
mod combine;
mod databases;
mod expiry;
mod hashes;
mod keyspace;
mod lists;
mod lua;
mod lua_libs;
mod reads;
mod scripting;
mod sets;
mod sort;
mod strings;
mod transaction;
mod types;
mod zsets;

pub use self::clients::Registration;
pub use self::databases::DATABASES;
pub use self::transaction::same_shard;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onekv_client::{Client, ClientError, ClientOptions};
use rand::Rng as _;

use crate::commands::{self, CommandSpec};
use crate::protocol::{ParserLimits, Protocol, Reply};

use self::admin::{command_command, function_command};
use self::clients::ClientEntry;
use self::combine::Pending;
use self::keyspace::Cursors;

/// How long a connection's reply may wait for the socket to take any byte before the connection is
/// closed: a client that stops reading must not hold its task and its queued replies forever.
/// Generous, so only a client that truly stopped reading (or whose network died) is cut off.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest reply a command builds from values (MGET, EXEC, HRANDFIELD and SRANDMEMBER with
/// repeats), so one request cannot make the node buffer gigabytes.
const MAX_REPLY_BYTES: usize = 64 << 20;
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
    /// The cluster's `cluster.fast_path`: blind writes without an expiry (SET without options,
    /// MSET) go by the fast path (`Client::put_fast`, `Client::batch_per_shard_fast`).
    pub fast_path: bool,
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
            fast_path: false,
        }
    }

    /// The request bounds that follow from the node's limits: any argument a valid command could
    /// carry fits, with slack so an over-limit value gets the node's own error rather than a
    /// protocol error.
    pub fn parser_limits(&self) -> ParserLimits {
        let slack = 64 << 10;
        let max_bulk_bytes = self.max_value_bytes.max(self.max_key_bytes) + slack;
        ParserLimits {
            // MSET of a full batch (the name and two arguments per pair), or HSET of as many fields
            // (one argument more: the key).
            max_args: (self.max_batch_ops.saturating_mul(2) + 2).max(1024),
            max_bulk_bytes,
            max_inline_bytes: 64 << 10,
            max_request_bytes: self.max_batch_bytes.max(max_bulk_bytes) + slack,
        }
    }
}

/// One command's counters, reported by INFO commandstats.
#[derive(Debug, Default)]
pub(crate) struct CommandCounters {
    /// Calls that ran (or were queued inside MULTI).
    pub(crate) calls: AtomicU64,
    /// Microseconds spent in them.
    pub(crate) micros: AtomicU64,
    /// Calls refused before running (a wrong number of arguments, or `-BUSY`).
    pub(crate) rejected: AtomicU64,
    /// Calls that ran and answered an error.
    pub(crate) failed: AtomicU64,
}

/// Counters of the front end, reported by INFO.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    /// Per command, in the order of [`commands::COMMANDS`].
    pub(crate) per_command: Box<[CommandCounters]>,
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
    /// Every connection's entry for CLIENT LIST (see `clients`).
    clients: Mutex<HashMap<u64, ClientEntry>>,
    /// What OBJECT ENCODING calls a collection: Redis's thresholds, which CONFIG SET may change
    /// (they change nothing else in onekv).
    encodings: Mutex<types::Encodings>,
    /// Woken after a command that may have written, when `blocked` commands wait (see `blocking`).
    written: tokio::sync::Notify,
    /// Blocking commands waiting on `written` now.
    blocked: std::sync::atomic::AtomicUsize,
    /// Lua scripts: the cache EVALSHA looks in and the scripts running (see `scripting`).
    scripts: Arc<scripting::Scripts>,
    /// INFO keyspace's per-database counts and when they were taken (see `keyspace`).
    key_counts: tokio::sync::Mutex<Option<(Instant, Outcome<[u64; DATABASES as usize]>)>>,
}

impl std::fmt::Debug for RespContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RespContext").field("settings", &self.shared.settings).finish_non_exhaustive()
    }
}

/// A connection's "its client left" signal, for the commands that may run long (blocking pops,
/// scripts): they stop at their next chance rather than being dropped mid-way (a pop half done
/// would lose its element).
#[derive(Debug, Default)]
pub struct Cancel {
    flag: Arc<std::sync::atomic::AtomicBool>,
    notify: tokio::sync::Notify,
}

impl Cancel {
    /// Signals every command of the connection to stop.
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::Relaxed);
        self.notify.notify_waiters();
    }

    /// Whether [`Cancel::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }

    /// Returns once [`Cancel::cancel`] is called.
    pub async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }

    /// The flag, for a script's instruction hook.
    pub(crate) fn flag(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.flag.clone()
    }
}

/// One connection's state.
#[derive(Debug, Clone)]
pub struct Session {
    id: u64,
    name: Option<Vec<u8>>,
    protocol: Protocol,
    /// The database SELECT chose (0 to [`DATABASES`] - 1).
    db: u8,
    /// When the connection was accepted (CLIENT LIST's `age`).
    connected: Instant,
    /// The client's address, for CLIENT INFO.
    peer: Option<std::net::SocketAddr>,
    /// What CLIENT SETINFO said: the library's name and version.
    lib_name: Vec<u8>,
    lib_version: Vec<u8>,
    /// MULTI's queue and the watched keys (shared, so the copies the listener makes for a run of
    /// concurrent reads cost nothing; written through `Arc::make_mut`).
    transaction: Arc<transaction::Transaction>,
    /// Set when the connection's client leaves during a long command.
    cancel: Arc<Cancel>,
}

impl Session {
    /// The connection's cancel signal (the server sets it when the client leaves during a blocking
    /// command or a script).
    pub fn cancel_handle(&self) -> Arc<Cancel> {
        self.cancel.clone()
    }

    fn cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// The reply encoding this connection chose with `HELLO` (RESP2 until then).
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Whether the connection is inside MULTI (its commands are queued, not run).
    pub fn in_transaction(&self) -> bool {
        self.transaction.active()
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

impl RespContext {
    /// Sends the commands whose shard `endpoint` (this node's gRPC address) leads to `service`, the
    /// node's own `Kv` service, in this process rather than over a connection to itself.
    pub fn serve_locally(&self, endpoint: &str, service: onekv_client::LocalKv) -> Result<(), ClientError> {
        self.shared.client.serve_locally(endpoint, service)
    }

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
                stats: Stats {
                    per_command: commands::COMMANDS.iter().map(|_| CommandCounters::default()).collect(),
                    ..Stats::default()
                },
                next_client_id: AtomicU64::new(1),
                combining: Mutex::new(HashMap::new()),
                remembered: Mutex::new(HashMap::new()),
                // Random first ids, so a cursor from another node or an earlier run is unlikely to
                // name a live one; below 2^53 so clients that keep cursors as doubles are exact.
                cursors: Mutex::new(Cursors::new(random.random_range(1..1u64 << 52))),
                key_counts: tokio::sync::Mutex::new(None),
                scripts: Arc::default(),
                written: tokio::sync::Notify::new(),
                blocked: std::sync::atomic::AtomicUsize::new(0),
                encodings: Mutex::default(),
                clients: Mutex::new(HashMap::new()),
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
            db: 0,
            connected: Instant::now(),
            protocol: Protocol::Resp2,
            peer: None,
            lib_name: Vec::new(),
            lib_version: Vec::new(),
            transaction: Arc::default(),
            cancel: Arc::default(),
        }
    }

    /// Runs one command (`args` is never empty: the parser skips empty requests) and records its
    /// metrics.
    pub async fn execute(&self, session: &mut Session, args: Vec<Vec<u8>>) -> Executed {
        let started = Instant::now();
        let spec = args.first().and_then(|name| commands::lookup(name));
        let args_len = args.len();
        let op = spec.map_or("unknown", |spec| spec.name);
        let mut close = false;
        // Refused before running for what the node is doing (a busy script), as Redis counts it.
        let mut rejected = false;
        let reply = match spec {
            // Inside MULTI a command refused before running dooms the transaction.
            None => transaction::refuse_queueing(session, None, &args),
            Some(spec) if !spec.arity_ok(args.len()) => {
                transaction::refuse_queueing(session, Some(spec), &args)
            }
            // A script past busy-reply-threshold: most commands are refused, as in Redis (see
            // `scripting`); refused inside MULTI, they doom the transaction.
            Some(spec) if self.shared.scripts.busy() && !commands::allowed_while_busy(spec, &args) => {
                rejected = true;
                transaction::refuse_while_busy(session, spec)
            }
            Some(spec) => {
                match databases::translate(session.transaction.selected().unwrap_or(session.db), spec, args) {
                    // A key the connection's database cannot hold: refused like a malformed command.
                    Err(error) => transaction::refuse_queueing_with(session, error),
                    Ok(args) if session.in_transaction() && transaction::queues(spec) => {
                        self.queue(session, spec, args)
                    }
                    Ok(args) => {
                        close = spec.name == "quit";
                        self.run(spec, session, &args).await.unwrap_or_else(|error| error)
                    }
                }
            }
        };
        if spec.is_some_and(|spec| blocking::may_fill(spec.name)) {
            self.wake_blocked();
        }
        if spec.is_some_and(|spec| matches!(spec.name, "hello" | "client" | "select" | "exec")) {
            // The command may have changed what CLIENT LIST shows of this connection.
            self.publish(session);
        }
        self.shared.stats.commands_processed.fetch_add(1, Ordering::Relaxed);
        let counters =
            spec.and_then(|spec| Some((spec, self.shared.stats.per_command.get(commands::position(spec))?)));
        if let Some((spec, counters)) = counters {
            if rejected || !spec.arity_ok(args_len) {
                counters.rejected.fetch_add(1, Ordering::Relaxed);
            } else {
                counters.calls.fetch_add(1, Ordering::Relaxed);
                let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                counters.micros.fetch_add(micros, Ordering::Relaxed);
                if reply.is_error() {
                    counters.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
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
            "time" => {
                let now =
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                let seconds = now.as_secs().to_string().into_bytes();
                let micros = now.subsec_micros().to_string().into_bytes();
                Ok(Reply::Array(vec![Reply::Bulk(seconds), Reply::Bulk(micros)]))
            }
            "quit" => Ok(Reply::ok()),
            "select" => {
                session.db = databases::parse_index(&args[1])?;
                Ok(Reply::ok())
            }
            "hello" => self.hello(session, args),
            "client" => self.client_command(session, args),
            "command" => command_command(args),
            "config" => self.config(args),
            "function" => function_command(args),
            "info" => self.info(args).await,
            "dbsize" => {
                let count = self.count_keys(session.db).await?;
                Ok(Reply::Integer(i64::try_from(count).unwrap_or(i64::MAX)))
            }
            "get" => {
                let value = self.get(&args[1]).await?;
                types::string_value(value.as_deref())?;
                Ok(Reply::optional(value))
            }
            "mget" => {
                let values = self.get_many(&args[1..], true).await?;
                // As in Redis, a key of another type reads as nil.
                let strings = values.into_iter().map(|value| value.filter(|value| types::is_string(value)));
                Ok(Reply::Array(strings.map(Reply::optional).collect()))
            }
            "exists" => {
                let values = self.get_many(&args[1..], false).await?;
                Ok(Reply::Integer(values.iter().filter(|value| value.is_some()).count() as i64))
            }
            "strlen" => {
                let value = self.get(&args[1]).await?;
                Ok(Reply::Integer(types::string_value(value.as_deref())?.map_or(0, <[u8]>::len) as i64))
            }
            "set" => self.set(args).await,
            "mset" => Err(wrong_arity("mset")), // every well-formed MSET is a blind write
            "setnx" => {
                self.check_string(&args[2])?;
                let swapped = self.insert_if_absent(&args[1], &args[2], onekv_client::Expiry::Never).await?;
                Ok(Reply::Integer(i64::from(swapped)))
            }
            "del" | "unlink" => self.delete(&args[1..]).await,
            "setex" | "psetex" => {
                // Every well-formed one is a blind write: this one's time is not a positive integer.
                expiry::setex_expiry(spec.name, args).map(|_| Reply::ok())
            }
            name if strings::is_single_key_write(name) => {
                let decide = self.decision(spec.name, args)?;
                self.read_modify_write(&args[1], expiry::needs_expiry(name), decide).await
            }
            name if expiry::is_expiry_read(name) => {
                let found = if self.storable(&args[1]) {
                    self.shared.client.get_with_expiry(&args[1]).await?
                } else {
                    None
                };
                let expires_at = found.as_ref().and_then(|(_, at)| *at);
                Ok(expiry::answer_expiry_read(name, found.is_some(), expires_at, expiry::now_ms()))
            }
            name if reads::is_value_read(name) => self.read_command(spec, args).await,
            // A key without its value is refused before anything is read.
            "msetnx" if args.len().is_multiple_of(2) => Err(wrong_arity("msetnx")),
            "msetnx" | "rename" | "renamenx" | "copy" | "move" => self.atomically(session, args).await,
            "scan" => self.scan(session.db, args).await,
            "keys" => self.keys(session.db, &args[1]).await,
            "randomkey" => self.random_key(session.db).await,
            // Every acknowledged write is durable already; there is nothing to save.
            "save" => Ok(Reply::ok()),
            "shutdown" => Err(Reply::err(
                "onekv: SHUTDOWN is not supported: stop the node's process (SIGTERM or Ctrl-C shuts it \
                 down cleanly)",
            )),
            "flushall" => self.flush(None, args).await,
            "flushdb" => self.flush(Some(session.db), args).await,
            name if commands::is_script(name) => self.eval(session, name, args).await,
            "lmove" | "rpoplpush" => self.atomically(session, args).await,
            "sort" | "sort_ro" => {
                let options = sort::parse(args, spec.name == "sort_ro")?;
                if let Some(store) = options.store {
                    let keys = [args[1].as_slice(), args[store].as_slice()];
                    if same_shard(&*self.shared.client.cluster_map().await?, &keys) {
                        return self.atomically(session, args).await;
                    }
                }
                let value = if self.storable(&args[1]) { self.get(&args[1]).await? } else { None };
                let elements = sort::sorted(value.as_deref(), &options)?;
                match options.store {
                    None => sort::reply(elements, &options),
                    // The destination in another shard: the sort as read, then written (not one
                    // transaction; as a client would do it).
                    Some(store) => self.store_list(&args[store], sort::result(elements, &options)?).await,
                }
            }
            _ if blocking::is_blocking(spec) => self.block(session, spec, args).await,
            "script" => self.script_command(args),
            "multi" | "exec" | "discard" | "watch" | "unwatch" => {
                self.transaction_command(spec.name, session, args).await
            }
            other => Err(Reply::err(format!("command '{other}' is in the table but not implemented"))),
        }
    }
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
        assert_eq!(run(&context, s, &["SELECT", "16"]), Reply::err("DB index is out of range"));
        assert_eq!(run(&context, s, &["SELECT", "15"]), Reply::ok());
        assert_eq!(run(&context, s, &["SELECT", "0"]), Reply::ok());
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
    fn a_failed_key_count_is_reused_briefly_rather_than_retried_by_every_info() {
        // Nothing listens on the endpoint: counting fails once the client's short budget is spent.
        let mut settings = RespSettings::new(1, vec!["127.0.0.1:1".into()], "127.0.0.1:6379".into());
        settings.client_options.retry_budget = Duration::from_millis(300);
        let context = RespContext::new(settings).unwrap();
        let mut session = context.new_session();
        let started = Instant::now();
        assert!(run(&context, &mut session, &["INFO", "keyspace"]).is_error());
        let first = started.elapsed();
        let started = Instant::now();
        assert!(run(&context, &mut session, &["INFO", "keyspace"]).is_error());
        let second = started.elapsed();
        assert!(second < first / 2, "the second INFO retried the count: {first:?}, then {second:?}");
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
        let line = format!(
            "id={} addr= laddr=127.0.0.1:6379 name=x age=0 idle=0 flags=N db=0 sub=0 psub=0 ssub=0 \
             user=default resp=2 lib-name=redis-py lib-ver=8.0.0\n",
            s.id
        );
        assert_eq!(run(&context, s, &["CLIENT", "INFO"]), Reply::Verbatim(line.clone()));
        // Only registered connections (the listener registers each) are listed.
        assert_eq!(run(&context, s, &["CLIENT", "LIST"]), Reply::Verbatim(String::new()));
        let registration = context.register(s);
        assert_eq!(run(&context, s, &["CLIENT", "LIST"]), Reply::Verbatim(line.clone()));
        let mut other = context.new_session();
        let _other = context.register(&other);
        assert_eq!(run(&context, &mut other, &["SELECT", "7"]), Reply::ok());
        let Reply::Verbatim(both) = run(&context, s, &["CLIENT", "LIST"]) else { panic!() };
        assert_eq!(both.lines().count(), 2);
        assert!(both.contains(&format!("id={} ", other.id)) && both.contains(" db=7 "), "{both}");
        let only = format!("{}", s.id);
        assert_eq!(run(&context, s, &["CLIENT", "LIST", "ID", &only]), Reply::Verbatim(line.clone()));
        assert_eq!(run(&context, s, &["CLIENT", "LIST", "TYPE", "pubsub"]), Reply::Verbatim(String::new()));
        assert_eq!(
            run(&context, s, &["CLIENT", "LIST", "TYPE", "normal", "ID", &only]),
            Reply::Verbatim(line)
        );
        assert!(run(&context, s, &["CLIENT", "LIST", "ID", "x"]).is_error());
        assert!(run(&context, s, &["CLIENT", "LIST", "TYPE", "bogus"]).is_error());
        drop(registration);
        let Reply::Verbatim(left) = run(&context, s, &["CLIENT", "LIST"]) else { panic!() };
        assert_eq!(left.lines().count(), 1, "{left}");
    }

    #[test]
    fn malformed_commands_get_redis_errors() {
        let context = context();
        let mut session = context.new_session();
        let s = &mut session;
        assert_eq!(
            run(&context, s, &["XADD", "x", "*", "b"]),
            Reply::err("unknown command 'XADD', with args beginning with: 'x' '*' 'b' ")
        );
        assert_eq!(run(&context, s, &["HSET", "h", "f"]), wrong_arity("hset"));
        assert_eq!(run(&context, s, &["HSET", "h", "f", "v", "g"]), wrong_arity("hset"));
        assert_eq!(run(&context, s, &["FLUSHALL", "x"]), Reply::err("syntax error"));
        assert_eq!(run(&context, s, &["MSETNX", "a", "1", "b"]), wrong_arity("msetnx"));
        assert_eq!(run(&context, s, &["SETRANGE", "k", "-1", "v"]), Reply::err("offset is out of range"));
        assert_eq!(
            run(&context, s, &["SETRANGE", "k", "1048576", "v"]),
            Reply::err("string exceeds maximum allowed size (onekv's limits.max_value_bytes = 1048576)")
        );
        assert_eq!(
            run(&context, s, &["SETBIT", "k", "0", "2"]),
            Reply::err("bit is not an integer or out of range")
        );
        assert_eq!(
            run(&context, s, &["SETBIT", "k", "8388608", "1"]),
            Reply::err("bit offset is not an integer or out of range")
        );
        assert_eq!(run(&context, s, &["INCRBYFLOAT", "k", "1 "]), Reply::err("value is not a valid float"));
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
        assert_eq!(
            run(&context, s, &["SET", "k", "v", "EX", "0"]),
            Reply::err("invalid expire time in 'set' command")
        );
        assert_eq!(
            run(&context, s, &["SETEX", "k", "-1", "v"]),
            Reply::err("invalid expire time in 'setex' command")
        );
        assert_eq!(run(&context, s, &["PSETEX", "k", "x", "v"]), not_an_integer());
        assert_eq!(
            run(&context, s, &["EXPIRE", "k", "1", "NX", "GT"]),
            Reply::err("NX and XX, GT or LT options at the same time are not compatible")
        );
        assert_eq!(run(&context, s, &["GETEX", "k", "EX"]), Reply::err("syntax error"));
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
