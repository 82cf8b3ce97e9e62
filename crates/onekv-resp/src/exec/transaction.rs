//! Transactions: MULTI, EXEC, DISCARD, WATCH and UNWATCH, with Redis's semantics, committed
//! atomically as one replicated transaction ([`onekv_client::Client::txn`]).
//!
//! After MULTI a connection's commands are only checked (a name the table does not know, or a
//! wrong number of arguments, dooms the transaction: EXEC then answers `EXECABORT`) and queued,
//! answered `+QUEUED`; nothing queued runs outside its EXEC. The queue is bounded like one request
//! of the parser (count and bytes); past the bound the transaction is doomed and the queue freed.
//!
//! EXEC reads every key whose value the queued commands observe (every key of a command that is
//! not a blind write) and every watched key, with linearizable reads; evaluates the queued
//! commands in order against those values in memory, with the same decisions the commands make
//! outside a transaction (a command's runtime error is its element of the reply; the others
//! still apply, as in Redis); and commits one transaction whose conditions are the values read
//! and whose ops are the net writes. If another client wrote one of those keys in between, the
//! conditions fail, nothing is written, and EXEC reads and evaluates again (bounded). A watched
//! key whose value differs from the one WATCH read makes EXEC answer the null array. A
//! transaction that writes nothing and observes one key needs no commit: its one linearizable
//! read is the transaction. With several keys, a conditions-only transaction validates that the
//! values were current together.
//!
//! Commands that touch no key (PING, ECHO, CLIENT, HELLO, SCAN, DBSIZE, INFO, ...) run after the
//! commit, in their order, on the connection's state; SCAN, DBSIZE and INFO then see the store as
//! it is then, not a snapshot shared with the rest of the transaction.
//!
//! WATCH compares values and expiry times: a key written with the value and expiry it had at WATCH
//! time is not seen as changed (Redis would abort). Once the store is sharded a transaction must keep its keys in one
//! shard ([`same_shard`]).

use onekv_client::{ClientError, Expiry, WriteItem};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng as _;

use super::combine::{Change, Decide, RMW_MAX_ATTEMPTS};
use super::strings::{delete_decision, is_single_key_write};
use super::{MAX_REPLY_BYTES, Outcome, RespContext, Session, unknown_command, wrong_arity};
use super::{blocking, databases, expiry, lists, reads, scripting, sort, types};
use crate::commands::{self, CommandSpec};
use crate::protocol::Reply;

/// The commands a connection inside MULTI runs at once rather than queueing.
const NOT_QUEUED: [&str; 5] = ["exec", "discard", "multi", "watch", "quit"];

/// One connection's transaction state.
#[derive(Debug, Clone, Default)]
pub(super) struct Transaction {
    /// Inside MULTI: the queued commands.
    queued: Option<Vec<Vec<Vec<u8>>>>,
    /// Bytes of the queued commands' arguments.
    queued_bytes: usize,
    /// A command was rejected while queueing: EXEC will answer EXECABORT.
    doomed: bool,
    /// The queue went over its bound and was freed: every later command is refused too.
    overflowed: bool,
    /// Watched keys and the value and expiry each had when watched (`None`: absent), in watch
    /// order.
    watched: Vec<(Vec<u8>, Found)>,
    /// Bytes of the watched keys and values.
    watched_bytes: usize,
    /// The database of the last SELECT queued: the commands queued after it use its keys, as
    /// they will run after it.
    selected: Option<u8>,
}

impl Transaction {
    /// Whether the connection is between MULTI and EXEC/DISCARD.
    pub(super) fn active(&self) -> bool {
        self.queued.is_some()
    }

    /// The database the next queued command's keys belong to, if a queued SELECT chose one.
    pub(super) fn selected(&self) -> Option<u8> {
        self.selected
    }

    /// A command rejected while queueing: EXEC will answer EXECABORT.
    pub(super) fn reject(&mut self) {
        if self.active() {
            self.doomed = true;
        }
    }

    fn reset(&mut self) {
        *self = Transaction::default();
    }
}

/// Whether a transaction's `keys` all live in one shard of `map` (Redis Cluster's hash slot of
/// each key or its `{hash tag}` picks the shard, so users colocate keys with hash tags). EXEC
/// refuses a transaction that spans shards with `-CROSSSLOT`.
pub fn same_shard(map: &onekv_placement::ClusterMap, keys: &[&[u8]]) -> bool {
    let mut shards = keys.iter().map(|key| map.shard_of_key(key));
    let first = shards.next();
    shards.all(|shard| Some(shard) == first)
}

/// What one evaluation of the queue found, before anything is committed.
struct Evaluation {
    /// Each queued command's reply; `None` for the commands that run after the commit.
    replies: Vec<Option<Reply>>,
    /// The net writes, in the order keys were first written.
    ops: Vec<WriteItem>,
}

/// A key as a transaction sees it: its value and expiry time (ms since the Unix epoch), or absent.
pub(super) type Found = Option<(Vec<u8>, Option<u64>)>;

/// The keys a transaction (or a script, `scripting`) sees: the ones read, then its own writes.
pub(super) struct Snapshot {
    values: HashMap<Vec<u8>, Found>,
    /// The expiry each written key's net write carries ([`Expiry::Keep`]: the one it has when the
    /// transaction applies, which its conditions say is the value read).
    expiries: HashMap<Vec<u8>, Expiry>,
    written: Vec<Vec<u8>>,
    written_set: HashSet<Vec<u8>>,
    /// This node's clock when the evaluation began.
    now_ms: u64,
}

impl Snapshot {
    pub(super) fn new(values: HashMap<Vec<u8>, Found>) -> Snapshot {
        let now_ms = expiry::now_ms();
        Snapshot {
            values,
            expiries: HashMap::new(),
            written: Vec::new(),
            written_set: HashSet::new(),
            now_ms,
        }
    }

    /// How many keys the transaction writes, and their keys' and values' bytes.
    pub(super) fn written_size(&self) -> (usize, usize) {
        let bytes = self.written.iter().map(|key| key.len() + self.get(key).map_or(0, <[u8]>::len)).sum();
        (self.written.len(), bytes)
    }

    /// Whether `key` was read (or written) here: its value is known.
    pub(super) fn knows(&self, key: &[u8]) -> bool {
        self.values.contains_key(key)
    }

    /// The net writes, each key once with its last value and expiry, in the order keys were first
    /// written.
    pub(super) fn net_writes(&self) -> Vec<WriteItem> {
        self.written
            .iter()
            .map(|key| WriteItem {
                key: key.clone(),
                value: self.get(key).map(<[u8]>::to_vec),
                expiry: self.expiries.get(key).copied().unwrap_or(Expiry::Never),
            })
            .collect()
    }

    fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.values.get(key).and_then(|found| found.as_ref()).map(|(value, _)| value.as_slice())
    }

    /// When `key` expires (`None`: never, or absent).
    fn expires_at(&self, key: &[u8]) -> Option<u64> {
        self.values.get(key).and_then(|found| found.as_ref()).and_then(|(_, at)| *at)
    }

    /// The expiry that keeps `key`'s, as a write of another key would copy it (RENAME, COPY).
    fn copied_expiry(&self, key: &[u8]) -> Expiry {
        self.expires_at(key).map_or(Expiry::Never, Expiry::AtUnixMs)
    }

    fn set(&mut self, key: &[u8], value: Option<Vec<u8>>, expiry: Expiry) {
        if self.written_set.insert(key.to_vec()) {
            self.written.push(key.to_vec());
        }
        // A delete drops the expiry; keeping one keeps what an earlier write of this
        // transaction chose, or else the key's own.
        let net = match (&value, expiry) {
            (None, _) => Expiry::Never,
            (Some(_), Expiry::Keep) => self.expiries.get(key).copied().unwrap_or(Expiry::Keep),
            (Some(_), chosen) => chosen,
        };
        let expires_at = match expiry {
            Expiry::Keep => self.expires_at(key),
            chosen => expiry::expires_at(chosen, self.now_ms),
        };
        self.expiries.insert(key.to_vec(), net);
        self.values.insert(key.to_vec(), value.map(|value| (value, expires_at)));
    }

    /// Applies a read-modify-write decision to `key`'s value here.
    fn decide(&mut self, key: &[u8], mut decide: Decide) -> Reply {
        match decide(self.get(key), self.expires_at(key)) {
            Ok(Change::Write(value, expiry, reply)) => {
                self.set(key, value, expiry);
                reply
            }
            Ok(Change::Keep(reply)) => reply,
            Err(error) => error,
        }
    }
}

impl RespContext {
    /// Queues a command of a connection inside MULTI (the caller checked its name and arity).
    pub(super) fn queue(&self, session: &mut Session, spec: &CommandSpec, args: Vec<Vec<u8>>) -> Reply {
        let limits = self.shared.parser_limits;
        let transaction = Arc::make_mut(&mut session.transaction);
        let Some(queued) = &mut transaction.queued else { unreachable!("only inside MULTI") };
        let bytes: usize = args.iter().map(Vec::len).sum();
        if transaction.overflowed
            || queued.len() >= limits.max_args
            || transaction.queued_bytes + bytes > limits.max_request_bytes
        {
            transaction.doomed = true;
            transaction.overflowed = true;
            *queued = Vec::new();
            transaction.queued_bytes = 0;
            return queue_too_long(limits.max_args, limits.max_request_bytes);
        }
        if spec.flags.contains(&"no_multi") {
            // As Redis: SAVE, SHUTDOWN, ... never run as part of a transaction.
            transaction.doomed = true;
            return Reply::err("Command not allowed inside a transaction");
        }
        if commands::is_script(spec.name) {
            // A script is a transaction of its own, run against the values it reads as it goes;
            // it cannot join another's evaluation.
            transaction.doomed = true;
            return Reply::err(
                "onekv: scripts cannot be queued in MULTI: a script is a transaction of its own \
                 (EXEC will answer EXECABORT)",
            );
        }
        if matches!(spec.name, "flushall" | "flushdb") {
            // They delete page by page, not as one step, so they cannot be part of one.
            transaction.doomed = true;
            return Reply::err(
                "onekv: FLUSHALL and FLUSHDB cannot be queued in MULTI: they are not atomic in onekv \
                 (EXEC will answer EXECABORT)",
            );
        }
        transaction.queued_bytes += bytes;
        if spec.name == "select"
            && let Ok(db) = databases::parse_index(&args[1])
        {
            transaction.selected = Some(db);
        }
        queued.push(args);
        Reply::Simple("QUEUED".into())
    }

    /// MULTI, EXEC, DISCARD, WATCH, UNWATCH.
    pub(super) async fn transaction_command(
        &self,
        name: &str,
        session: &mut Session,
        args: &[Vec<u8>],
    ) -> Outcome {
        match name {
            "multi" => {
                if session.transaction.active() {
                    return Err(Reply::err("MULTI calls can not be nested"));
                }
                Arc::make_mut(&mut session.transaction).queued = Some(Vec::new());
                Ok(Reply::ok())
            }
            "discard" => {
                if !session.transaction.active() {
                    return Err(Reply::err("DISCARD without MULTI"));
                }
                Arc::make_mut(&mut session.transaction).reset();
                Ok(Reply::ok())
            }
            "unwatch" => {
                let transaction = Arc::make_mut(&mut session.transaction);
                transaction.watched.clear();
                transaction.watched_bytes = 0;
                Ok(Reply::ok())
            }
            "watch" => {
                if session.transaction.active() {
                    return Err(Reply::err("WATCH inside MULTI is not allowed"));
                }
                self.watch(session, &args[1..]).await
            }
            "exec" => {
                if !session.transaction.active() {
                    return Err(Reply::err("EXEC without MULTI"));
                }
                let transaction = std::mem::take(Arc::make_mut(&mut session.transaction));
                if transaction.doomed {
                    return Err(Reply::Error(
                        "EXECABORT Transaction discarded because of previous errors.".into(),
                    ));
                }
                self.exec(session, transaction).await
            }
            other => Err(Reply::err(format!("'{other}' is not a transaction command"))),
        }
    }

    /// WATCH: remembers each key's current value and expiry (read linearizably). Bounded: the watched keys
    /// and values must fit in one transaction (`limits.max_batch_bytes`).
    async fn watch(&self, session: &mut Session, keys: &[Vec<u8>]) -> Outcome {
        let max_keys = self.shared.settings.max_batch_ops;
        let max_bytes = self.shared.settings.max_batch_bytes;
        let new: Vec<Vec<u8>> = keys
            .iter()
            .filter(|key| self.storable(key))
            .filter(|key| !session.transaction.watched.iter().any(|(watched, _)| watched == *key))
            .cloned()
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        if session.transaction.watched.len() + new.len() > max_keys {
            return Err(Reply::err(format!(
                "onekv: at most {max_keys} keys can be watched (limits.max_batch_ops)"
            )));
        }
        let values = self.get_many_with_expiry(&new, true).await?;
        let bytes = read_bytes(&new, &values);
        if session.transaction.watched_bytes + bytes > max_bytes {
            return Err(Reply::err(format!(
                "onekv: the watched keys and values would exceed {max_bytes} bytes (limits.max_batch_bytes)"
            )));
        }
        let transaction = Arc::make_mut(&mut session.transaction);
        transaction.watched_bytes += bytes;
        transaction.watched.extend(new.into_iter().zip(values));
        Ok(Reply::ok())
    }

    /// Runs one command as a transaction of its own: a multi-key write (MSETNX, RENAME, COPY)
    /// whose keys must share a shard, applied atomically (one replicated transaction).
    pub(super) async fn atomically(&self, session: &mut Session, args: &[Vec<u8>]) -> Outcome {
        let transaction = Transaction { queued: Some(vec![args.to_vec()]), ..Transaction::default() };
        match self.exec(session, transaction).await? {
            Reply::Array(mut replies) if replies.len() == 1 => Ok(replies.remove(0)),
            other => Err(Reply::err(format!("onekv: unexpected transaction reply {other:?}"))),
        }
    }

    /// EXEC of a transaction that was not doomed.
    async fn exec(&self, session: &mut Session, transaction: Transaction) -> Outcome {
        let queued = transaction.queued.unwrap_or_default();
        let watched = transaction.watched;
        // The keys whose values the transaction observes: watched keys, and every key of a
        // command that is not a blind write. Keys onekv cannot hold are absent and never read.
        let mut read_keys: Vec<Vec<u8>> = Vec::new();
        let mut seen = HashSet::new();
        let mut all_keys: Vec<&[u8]> = Vec::new();
        for (key, _) in &watched {
            if seen.insert(key.as_slice()) {
                read_keys.push(key.clone());
            }
        }
        for args in &queued {
            let Some(spec) = commands::lookup(&args[0]) else { continue };
            if spec.name == "sort"
                && let Ok(options) = sort::parse(args, false)
                && let Some(store) = options.store
            {
                // Written whole, never read; but it must share the shard.
                all_keys.push(&args[store]);
            }
            for key in spec.key_arguments(args) {
                all_keys.push(key);
                if !commands::is_blind_write(args) && self.storable(key) && seen.insert(key.as_slice()) {
                    read_keys.push(key.clone());
                }
            }
        }
        all_keys.extend(watched.iter().map(|(key, _)| key.as_slice()));
        // Several keys must share a shard (the map is fetched once per client, then kept).
        if all_keys.len() > 1 && !same_shard(&*self.shared.client.cluster_map().await?, &all_keys) {
            return Err(Reply::Error("CROSSSLOT Keys in request don't hash to the same slot".into()));
        }
        let mut attempt = 0;
        let evaluation = loop {
            let found = self.get_many_with_expiry(&read_keys, true).await?;
            if watched.iter().zip(&found).any(|((_, then), now)| then != now) {
                return Ok(Reply::NilArray);
            }
            let snapshot: HashMap<Vec<u8>, Found> = read_keys.iter().cloned().zip(found).collect();
            let conditions: Vec<(Vec<u8>, Option<Vec<u8>>)> = read_keys
                .iter()
                .map(|key| (key.clone(), snapshot[key].as_ref().map(|(value, _)| value.clone())))
                .collect();
            let heavy = queued
                .iter()
                .any(|args| commands::lookup(&args[0]).is_some_and(|spec| reads::is_heavy(spec.name)));
            let evaluation = if heavy {
                // Off the runtime's workers (a queue of LCS calls could compute for seconds).
                let (context, commands) = (self.clone(), queued.clone());
                tokio::task::spawn_blocking(move || context.evaluate(&commands, snapshot))
                    .await
                    .map_err(|error| Reply::err(format!("onekv: {error}")))??
            } else {
                self.evaluate(&queued, snapshot)?
            };
            // A blocking pop's attempt that found every key empty needs no proof of it: it waits
            // and tries again.
            let polls =
                queued.iter().all(|args| commands::lookup(&args[0]).is_some_and(blocking::is_blocking));
            if evaluation.ops.is_empty() && (conditions.len() <= 1 || polls) {
                // Nothing to write, at most one key observed: its linearizable read was the
                // transaction.
                break evaluation;
            }
            if self.commit(conditions, evaluation.ops.clone()).await? {
                break evaluation;
            }
            attempt += 1;
            pause_before_retry(attempt).await?;
        };
        // The commands that touch no key run now, in their order.
        let mut replies = Vec::with_capacity(queued.len());
        for (args, reply) in queued.iter().zip(evaluation.replies) {
            let reply = match reply {
                Some(reply) => reply,
                None => {
                    let spec = commands::lookup(&args[0]).expect("checked when queued");
                    Box::pin(self.run(spec, session, args)).await.unwrap_or_else(|error| error)
                }
            };
            replies.push(reply);
        }
        Ok(Reply::Array(replies))
    }

    /// Commits one evaluation: `conditions` (each key read and the value it had, `None`: absent)
    /// and the net writes `ops`, as one replicated transaction. `Ok(false)`: a condition failed
    /// and nothing was written.
    pub(super) async fn commit(
        &self,
        conditions: Vec<(Vec<u8>, Option<Vec<u8>>)>,
        ops: Vec<WriteItem>,
    ) -> Outcome<bool> {
        for op in &ops {
            self.forget(&op.key);
        }
        match self.shared.client.txn_with_expiry(conditions, ops).await {
            Ok(outcome) => Ok(outcome.applied),
            // An attempt's conditions failed and its answer was lost: nothing was written.
            Err(ClientError::NotApplied(_)) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    /// Runs the queued commands in order against `values` (every key they observe), in memory.
    fn evaluate(&self, queued: &[Vec<Vec<u8>>], values: HashMap<Vec<u8>, Found>) -> Outcome<Evaluation> {
        let mut snapshot = Snapshot::new(values);
        let mut replies = Vec::with_capacity(queued.len());
        let mut reply_bytes = 0usize;
        for args in queued {
            let spec = commands::lookup(&args[0]).expect("checked when queued");
            let reply = self.evaluate_one(spec, args, &mut snapshot);
            reply_bytes += reply.as_ref().map_or(0, bulk_bytes);
            if reply_bytes > MAX_REPLY_BYTES {
                return Err(Reply::err(format!(
                    "EXEC's reply would exceed {MAX_REPLY_BYTES} bytes; nothing was applied"
                )));
            }
            replies.push(reply);
        }
        Ok(Evaluation { replies, ops: snapshot.net_writes() })
    }

    /// One queued command against the snapshot; `None` for a command that touches no key (it
    /// runs after the commit).
    pub(super) fn evaluate_one(
        &self,
        spec: &CommandSpec,
        args: &[Vec<u8>],
        snapshot: &mut Snapshot,
    ) -> Option<Reply> {
        let value = |snapshot: &Snapshot, key: &[u8]| snapshot.get(key).map(<[u8]>::to_vec);
        Some(match spec.name {
            "get" => match types::string_value(snapshot.get(&args[1])) {
                Ok(found) => Reply::optional(found.map(<[u8]>::to_vec)),
                Err(error) => error,
            },
            "strlen" => match types::string_value(snapshot.get(&args[1])) {
                Ok(found) => Reply::Integer(found.map_or(0, <[u8]>::len) as i64),
                Err(error) => error,
            },
            "mget" => Reply::Array(
                args[1..]
                    .iter()
                    .map(|key| Reply::optional(value(snapshot, key).filter(|value| types::is_string(value))))
                    .collect(),
            ),
            "exists" => {
                Reply::Integer(args[1..].iter().filter(|key| snapshot.get(key).is_some()).count() as i64)
            }
            "mset" | "msetnx" => {
                let pairs = match self.writable_pairs(spec.name, args) {
                    Ok(pairs) => pairs,
                    Err(error) => return Some(error),
                };
                if spec.name == "msetnx" && pairs.clone().any(|pair| snapshot.get(&pair[0]).is_some()) {
                    return Some(Reply::Integer(0));
                }
                for pair in pairs {
                    snapshot.set(&pair[0], Some(pair[1].clone()), Expiry::Never);
                }
                if spec.name == "msetnx" { Reply::Integer(1) } else { Reply::ok() }
            }
            "del" | "unlink" => {
                let mut deleted = 0;
                for key in &args[1..] {
                    if self.storable(key) {
                        deleted += i64::from(snapshot.decide(key, delete_decision()) == Reply::Integer(1));
                    }
                }
                Reply::Integer(deleted)
            }
            "rename" | "renamenx" => {
                let (source, destination) = (&args[1], &args[2]);
                let only_if_absent = spec.name == "renamenx";
                let Some(value) = value(snapshot, source) else { return Some(Reply::err("no such key")) };
                if source == destination {
                    return Some(if only_if_absent { Reply::Integer(0) } else { Reply::ok() });
                }
                if only_if_absent && snapshot.get(destination).is_some() {
                    return Some(Reply::Integer(0));
                }
                if let Some(error) = self.unwritable(destination, &value) {
                    return Some(error);
                }
                // The key moves with its expiry, as in Redis.
                snapshot.set(destination, Some(value), snapshot.copied_expiry(source));
                snapshot.set(source, None, Expiry::Never);
                if only_if_absent { Reply::Integer(1) } else { Reply::ok() }
            }
            "move" => {
                // The destination is the key as stored in the target database (`databases`).
                let (source, destination) = (&args[1], &args[2]);
                let Some(value) = value(snapshot, source) else { return Some(Reply::Integer(0)) };
                if snapshot.get(destination).is_some() {
                    return Some(Reply::Integer(0));
                }
                if let Some(error) = self.unwritable(destination, &value) {
                    return Some(error);
                }
                snapshot.set(destination, Some(value), snapshot.copied_expiry(source));
                snapshot.set(source, None, Expiry::Never);
                Reply::Integer(1)
            }
            "copy" => {
                let (source, destination) = (&args[1], &args[2]);
                // `DB n` was applied to the destination key when the command came in (`databases`).
                if args[3..].iter().any(|option| !option.eq_ignore_ascii_case(b"REPLACE")) {
                    return Some(Reply::err("syntax error"));
                }
                let replace = args.len() > 3;
                if source == destination {
                    return Some(Reply::err("source and destination objects are the same"));
                }
                let Some(value) = value(snapshot, source) else { return Some(Reply::Integer(0)) };
                if !replace && snapshot.get(destination).is_some() {
                    return Some(Reply::Integer(0));
                }
                if let Some(error) = self.unwritable(destination, &value) {
                    return Some(error);
                }
                snapshot.set(destination, Some(value), snapshot.copied_expiry(source));
                Reply::Integer(1)
            }
            "lmove" | "rpoplpush" | "blmove" | "brpoplpush" => {
                let (source, destination) = (&args[1], &args[2]);
                let ends = if matches!(spec.name, "lmove" | "blmove") {
                    match (lists::parse_end(&args[3]), lists::parse_end(&args[4])) {
                        (Ok(from), Ok(to)) => (from, to),
                        (Err(error), _) | (_, Err(error)) => return Some(error),
                    }
                } else {
                    (false, true)
                };
                if let Some(error) = self.unwritable(destination, &[]) {
                    return Some(error);
                }
                let max_value_bytes = self.shared.settings.max_value_bytes;
                let same_key = source == destination;
                match lists::move_element(
                    snapshot.get(source),
                    snapshot.get(destination),
                    same_key,
                    ends,
                    max_value_bytes,
                ) {
                    Err(error) => error,
                    Ok(None) => Reply::Nil,
                    Ok(Some((element, source_value, destination_value))) => {
                        snapshot.set(source, source_value, Expiry::Keep);
                        if !same_key {
                            snapshot.set(destination, destination_value, Expiry::Keep);
                        }
                        Reply::Bulk(element)
                    }
                }
            }
            "sort" | "sort_ro" => {
                let sorted = sort::parse(args, spec.name == "sort_ro").and_then(|options| {
                    let elements = sort::sorted(snapshot.get(&args[1]), &options)?;
                    Ok((sort::result(elements, &options)?, options))
                });
                let (elements, options) = match sorted {
                    Ok(sorted) => sorted,
                    Err(error) => return Some(error),
                };
                let Some(store) = options.store else {
                    return Some(Reply::Array(elements.into_iter().map(Reply::Bulk).collect()));
                };
                let destination = &args[store];
                if let Some(error) = self.unwritable(destination, &[]) {
                    return Some(error);
                }
                let count = elements.len() as i64;
                let value = (!elements.is_empty()).then(|| lists::encode(&elements));
                if let Some(error) = value.as_ref().and_then(|value| self.check_value(value).err()) {
                    return Some(error);
                }
                // The destination becomes a list (or is deleted), without an expiry, as in Redis.
                snapshot.set(destination, value, Expiry::Never);
                Reply::Integer(count)
            }
            name if blocking::single_pop(name).is_some() => {
                // One attempt: the first key with something to pop, without waiting (inside MULTI
                // too, as in Redis).
                let pop = blocking::single_pop(name).expect("matched");
                for key in spec.key_arguments(args) {
                    if !self.storable(key) {
                        continue;
                    }
                    let decide = match self.decision(pop, &[pop.as_bytes().to_vec(), key.clone()]) {
                        Ok(decide) => decide,
                        Err(error) => return Some(error),
                    };
                    match snapshot.decide(key, decide) {
                        Reply::Nil | Reply::NilArray => {}
                        Reply::Array(items) if items.is_empty() => {}
                        Reply::Error(error) => return Some(Reply::Error(error)),
                        reply => return Some(blocking::popped(key, reply)),
                    }
                }
                Reply::NilArray
            }
            name if expiry::is_expiry_read(name) => {
                let key = &args[1];
                expiry::answer_expiry_read(
                    name,
                    snapshot.get(key).is_some(),
                    snapshot.expires_at(key),
                    snapshot.now_ms,
                )
            }
            name if reads::is_value_read(name) => {
                let keys: Vec<&Vec<u8>> = spec.key_arguments(args).collect();
                let values: Vec<Option<&[u8]>> = keys.iter().map(|key| snapshot.get(key)).collect();
                reads::answer_read(name, args, &values, self.read_bounds())
            }
            name if is_single_key_write(name) => {
                let key = &args[1];
                if let Some(error) = self.unwritable(key, &[]) {
                    // A read of a key onekv cannot hold finds it absent; a write is refused.
                    return Some(error);
                }
                match self.decision(spec.name, args) {
                    Ok(decide) => snapshot.decide(key, decide),
                    Err(error) => error,
                }
            }
            "unwatch" => Reply::ok(),
            _ => return None,
        })
    }

    /// The (key, value) pairs of MSET or MSETNX (`name`), each checked as the node would check its
    /// write.
    fn writable_pairs<'a>(
        &self,
        name: &str,
        args: &'a [Vec<u8>],
    ) -> Outcome<std::slice::ChunksExact<'a, Vec<u8>>> {
        if args.len().is_multiple_of(2) {
            return Err(wrong_arity(name));
        }
        let pairs = args[1..].chunks_exact(2);
        let unwritable = |pair: &[Vec<u8>]| {
            self.unwritable(&pair[0], &pair[1]).or_else(|| types::reserved_string(&pair[1]))
        };
        match pairs.clone().find_map(unwritable) {
            Some(error) => Err(error),
            None => Ok(pairs),
        }
    }

    /// The error of writing `value` under `key`, as the node would word it, if it cannot be
    /// written.
    pub(super) fn unwritable(&self, key: &[u8], value: &[u8]) -> Option<Reply> {
        let settings = &self.shared.settings;
        if key.is_empty() {
            return Some(Reply::err("invalid argument: empty key"));
        }
        if key.len() > settings.max_key_bytes {
            return Some(Reply::err(format!(
                "invalid argument: key of {} bytes exceeds max_key_bytes = {}",
                key.len(),
                settings.max_key_bytes
            )));
        }
        self.check_value(value).err()
    }
}

/// Before the `attempt`th retry of a transaction whose conditions failed: an error after
/// [`RMW_MAX_ATTEMPTS`] attempts, and from the second retry on a random pause, since other clients
/// are writing these keys too.
pub(super) async fn pause_before_retry(attempt: u32) -> Outcome<()> {
    if attempt >= RMW_MAX_ATTEMPTS {
        return Err(Reply::err(format!(
            "onekv: the transaction's keys changed under {RMW_MAX_ATTEMPTS} attempts in a row; try again"
        )));
    }
    if attempt >= 2 {
        let millis = rand::rng().random_range(1..=2u64 << attempt.min(5));
        tokio::time::sleep(Duration::from_millis(millis)).await;
    }
    Ok(())
}

/// The bytes of `keys` and the values read for them (`found`, in the same order): what the
/// conditions of a transaction that read them carry, bounded by `limits.max_batch_bytes`.
pub(super) fn read_bytes(keys: &[Vec<u8>], found: &[Found]) -> usize {
    keys.iter()
        .zip(found)
        .map(|(key, found)| key.len() + found.as_ref().map_or(0, |(value, _)| value.len()))
        .sum()
}

/// The error for a transaction whose queue went over its bound.
fn queue_too_long(max_commands: usize, max_bytes: usize) -> Reply {
    Reply::err(format!(
        "onekv: a transaction queues at most {max_commands} commands and {max_bytes} bytes; \
         this one is discarded (EXEC will answer EXECABORT)"
    ))
}

/// The bytes of bulk data in a reply.
fn bulk_bytes(reply: &Reply) -> usize {
    match reply {
        Reply::Bulk(bytes) => bytes.len(),
        Reply::Array(items) => items.iter().map(bulk_bytes).sum(),
        Reply::Simple(text) | Reply::Error(text) | Reply::Verbatim(text) | Reply::Double(text) => text.len(),
        Reply::Map(pairs) | Reply::Pairs(pairs) => {
            pairs.iter().map(|(key, value)| bulk_bytes(key) + bulk_bytes(value)).sum()
        }
        Reply::Integer(_) | Reply::Nil | Reply::NilArray => 0,
    }
}

/// The reply to a command a connection inside MULTI sends, when it is refused rather than queued
/// (its name is unknown or its arity wrong): the transaction is doomed.
pub(super) fn refuse_queueing(session: &mut Session, spec: Option<&CommandSpec>, args: &[Vec<u8>]) -> Reply {
    let error = match spec {
        None => unknown_command(args),
        Some(spec) => wrong_arity(spec.name),
    };
    refuse_queueing_with(session, error)
}

/// The reply to a command refused before it runs for a reason other than its name or arity (a
/// key its database cannot hold): inside MULTI the transaction is doomed, as Redis dooms it for
/// any command refused while queueing.
pub(super) fn refuse_queueing_with(session: &mut Session, error: Reply) -> Reply {
    if session.transaction.active() {
        Arc::make_mut(&mut session.transaction).reject();
    }
    error
}

/// The reply to a command refused because a script has run past `busy-reply-threshold`: `-BUSY`,
/// dooming a transaction being queued; EXEC itself discards the transaction, as Redis does.
pub(super) fn refuse_while_busy(session: &mut Session, spec: &CommandSpec) -> Reply {
    if spec.name == "exec" {
        Arc::make_mut(&mut session.transaction).reset();
        return Reply::Error(format!("EXECABORT Transaction discarded because of: {}", scripting::BUSY));
    }
    refuse_queueing_with(session, Reply::Error(scripting::BUSY.into()))
}

/// Whether a connection inside MULTI queues this command rather than running it.
pub(super) fn queues(spec: &CommandSpec) -> bool {
    !NOT_QUEUED.contains(&spec.name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::RespSettings;
    use crate::protocol::Protocol;

    fn context() -> RespContext {
        // Nothing listens at the endpoint: the commands tested here never reach the cluster
        // (every data command stays queued, or the transaction holds none).
        RespContext::new(RespSettings::new(1, vec!["127.0.0.1:1".into()], "127.0.0.1:6379".into())).unwrap()
    }

    fn run(context: &RespContext, session: &mut Session, command: &[&str]) -> Reply {
        let args = command.iter().map(|arg| arg.as_bytes().to_vec()).collect();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(context.execute(session, args)).reply
    }

    fn queued() -> Reply {
        Reply::Simple("QUEUED".into())
    }

    fn execabort() -> Reply {
        Reply::Error("EXECABORT Transaction discarded because of previous errors.".into())
    }

    #[test]
    fn commands_after_multi_are_queued_not_run() {
        let context = context();
        let mut session = context.new_session();
        let s = &mut session;
        assert_eq!(run(&context, s, &["MULTI"]), Reply::ok());
        assert!(s.in_transaction());
        // Data commands would fail at once (nothing listens): they are only queued.
        for command in [&["SET", "k", "v"][..], &["INCR", "n"], &["GET", "k"], &["DEL", "a", "b"], &["PING"]]
        {
            assert_eq!(run(&context, s, command), queued(), "{command:?}");
        }
        assert_eq!(s.transaction.queued.as_ref().map(Vec::len), Some(5));
        assert_eq!(run(&context, s, &["DISCARD"]), Reply::ok());
        assert!(!s.in_transaction());
        assert_eq!(run(&context, s, &["DISCARD"]), Reply::err("DISCARD without MULTI"));
        assert_eq!(run(&context, s, &["EXEC"]), Reply::err("EXEC without MULTI"));
    }

    #[test]
    fn exec_runs_the_queue_in_order_and_ends_the_transaction() {
        let context = context();
        let mut session = context.new_session();
        let s = &mut session;
        assert_eq!(run(&context, s, &["MULTI"]), Reply::ok());
        assert_eq!(run(&context, s, &["PING"]), queued());
        assert_eq!(run(&context, s, &["ECHO", "x"]), queued());
        assert_eq!(run(&context, s, &["CLIENT", "SETNAME", "t"]), queued());
        // Queued, not yet applied.
        assert_eq!(s.name, None);
        assert_eq!(
            run(&context, s, &["EXEC"]),
            Reply::Array(vec![Reply::Simple("PONG".into()), Reply::text("x"), Reply::ok()])
        );
        assert_eq!(s.name.as_deref(), Some(&b"t"[..]));
        assert!(!s.in_transaction());
        // An empty transaction answers an empty array.
        assert_eq!(run(&context, s, &["MULTI"]), Reply::ok());
        assert_eq!(run(&context, s, &["EXEC"]), Reply::Array(Vec::new()));
    }

    #[test]
    fn an_error_while_queueing_aborts_exec() {
        let context = context();
        let mut session = context.new_session();
        let s = &mut session;
        for refused in [&["NOSUCH", "x"][..], &["GET"], &["SET", "k"]] {
            assert_eq!(run(&context, s, &["MULTI"]), Reply::ok());
            assert_eq!(run(&context, s, &["PING"]), queued());
            assert!(run(&context, s, refused).is_error(), "{refused:?}");
            // Later commands are still queued, but EXEC discards everything.
            assert_eq!(run(&context, s, &["CLIENT", "SETNAME", "never"]), queued());
            assert_eq!(run(&context, s, &["EXEC"]), execabort());
            assert!(!s.in_transaction());
            assert_eq!(s.name, None);
        }
        // Outside MULTI the same errors doom nothing.
        assert!(run(&context, s, &["NOSUCH"]).is_error());
        assert_eq!(run(&context, s, &["MULTI"]), Reply::ok());
        assert_eq!(run(&context, s, &["EXEC"]), Reply::Array(Vec::new()));
    }

    #[test]
    fn nested_multi_and_watch_inside_multi_are_errors_that_keep_the_transaction() {
        let context = context();
        let mut session = context.new_session();
        let s = &mut session;
        assert_eq!(run(&context, s, &["MULTI"]), Reply::ok());
        assert_eq!(run(&context, s, &["MULTI"]), Reply::err("MULTI calls can not be nested"));
        assert_eq!(run(&context, s, &["WATCH", "k"]), Reply::err("WATCH inside MULTI is not allowed"));
        assert!(s.in_transaction());
        assert_eq!(run(&context, s, &["PING"]), queued());
        assert_eq!(run(&context, s, &["UNWATCH"]), queued());
        assert_eq!(
            run(&context, s, &["EXEC"]),
            Reply::Array(vec![Reply::Simple("PONG".into()), Reply::ok()])
        );
    }

    #[test]
    fn save_and_shutdown_doom_a_transaction_and_config_errors_run_inside_it() {
        let context = context();
        let mut session = context.new_session();
        let s = &mut session;
        // Outside MULTI: SAVE has nothing to do (every acknowledged write is durable), SHUTDOWN is
        // refused with what to do instead.
        assert_eq!(run(&context, s, &["SAVE"]), Reply::ok());
        assert!(matches!(run(&context, s, &["SHUTDOWN"]), Reply::Error(e) if e.contains("SIGTERM")));
        for command in ["SAVE", "shutdown"] {
            assert_eq!(run(&context, s, &["MULTI"]), Reply::ok());
            assert_eq!(run(&context, s, &["PING"]), queued());
            assert_eq!(run(&context, s, &[command]), Reply::err("Command not allowed inside a transaction"));
            assert_eq!(run(&context, s, &["EXEC"]), execabort());
        }
        // A CONFIG SET onekv refuses is queued, and fails at EXEC with Redis's wording.
        assert_eq!(run(&context, s, &["MULTI"]), Reply::ok());
        assert_eq!(run(&context, s, &["PING"]), queued());
        assert_eq!(run(&context, s, &["CONFIG", "SET", "maxmemory", "bla"]), queued());
        let Reply::Array(replies) = run(&context, s, &["EXEC"]) else { panic!("EXEC answers an array") };
        assert_eq!(replies[0], Reply::Simple("PONG".into()));
        assert!(
            matches!(&replies[1], Reply::Error(e) if e.contains("CONFIG SET failed")),
            "{:?}",
            replies[1]
        );
    }

    #[test]
    fn watch_remembers_values_and_unwatch_exec_discard_forget_them() {
        let context = context();
        let mut session = context.new_session();
        let s = &mut session;
        // Keys onekv cannot hold are absent for ever: watching them reads nothing.
        let too_long = "k".repeat(5000);
        assert_eq!(run(&context, s, &["WATCH", "", &too_long]), Reply::ok());
        assert!(s.transaction.watched.is_empty());
        Arc::make_mut(&mut s.transaction).watched.push((b"k".to_vec(), None));
        assert_eq!(run(&context, s, &["UNWATCH"]), Reply::ok());
        assert!(s.transaction.watched.is_empty());
        Arc::make_mut(&mut s.transaction).watched.push((b"k".to_vec(), None));
        assert_eq!(run(&context, s, &["MULTI"]), Reply::ok());
        assert_eq!(run(&context, s, &["DISCARD"]), Reply::ok());
        assert!(s.transaction.watched.is_empty());
        Arc::make_mut(&mut s.transaction).watched.push((b"k".to_vec(), None));
        assert_eq!(run(&context, s, &["MULTI"]), Reply::ok());
        assert_eq!(run(&context, s, &["EXECABORTME"]), unknown_command(&[b"EXECABORTME".to_vec()]));
        assert_eq!(run(&context, s, &["EXEC"]), execabort());
        assert!(s.transaction.watched.is_empty());
    }

    #[test]
    fn the_queue_is_bounded_in_commands_and_bytes() {
        let mut settings = RespSettings::new(1, vec!["127.0.0.1:1".into()], "127.0.0.1:6379".into());
        settings.max_batch_ops = 4; // at most 1024 queued commands (the parser's max_args)
        let context = RespContext::new(settings).unwrap();
        let limits = context.parser_limits();
        let mut session = context.new_session();
        let s = &mut session;
        assert_eq!(run(&context, s, &["MULTI"]), Reply::ok());
        for _ in 0..limits.max_args {
            assert_eq!(run(&context, s, &["PING"]), queued());
        }
        let refused = run(&context, s, &["PING"]);
        assert!(
            matches!(&refused, Reply::Error(text) if text.contains("at most 1024 commands")),
            "{refused:?}"
        );
        // The queue is freed, and every later command is refused the same way.
        assert_eq!(s.transaction.queued.as_ref().map(Vec::capacity), Some(0));
        assert_eq!(run(&context, s, &["PING"]), refused);
        assert_eq!(run(&context, s, &["EXEC"]), execabort());
        // Bytes: a few large arguments reach the byte bound first.
        assert_eq!(run(&context, s, &["MULTI"]), Reply::ok());
        let big = "v".repeat(limits.max_bulk_bytes - 1);
        let mut answers = Vec::new();
        for _ in 0..limits.max_request_bytes / big.len() + 1 {
            answers.push(run(&context, s, &["ECHO", &big]));
        }
        assert_eq!(answers[0], queued());
        assert!(answers.last().unwrap().is_error());
        assert!(s.transaction.queued_bytes <= limits.max_request_bytes);
        assert_eq!(run(&context, s, &["EXEC"]), execabort());
    }

    #[test]
    fn queued_reads_are_not_run_concurrently_by_the_listener() {
        let context = context();
        let mut session = context.new_session();
        assert!(!session.in_transaction());
        assert_eq!(run(&context, &mut session, &["MULTI"]), Reply::ok());
        // The listener asks this before running a run of pipelined reads on copies of the session.
        assert!(session.in_transaction());
    }

    #[test]
    fn exec_replies_are_null_arrays_in_both_protocols() {
        assert_eq!(Reply::NilArray.to_bytes(Protocol::Resp2), b"*-1\r\n");
        assert_eq!(Reply::NilArray.to_bytes(Protocol::Resp3), b"_\r\n");
    }

    #[test]
    fn key_arguments_follow_the_table() {
        let args = |items: &[&str]| items.iter().map(|item| item.as_bytes().to_vec()).collect::<Vec<_>>();
        let keys = |command: &[&str]| {
            let command = args(command);
            let spec = commands::lookup(&command[0]).unwrap();
            spec.key_arguments(&command).cloned().collect::<Vec<_>>()
        };
        assert_eq!(keys(&["SET", "k", "v", "NX"]), args(&["k"]));
        assert_eq!(keys(&["MSET", "a", "1", "b", "2"]), args(&["a", "b"]));
        assert_eq!(keys(&["DEL", "a", "b", "c"]), args(&["a", "b", "c"]));
        assert_eq!(keys(&["PING"]), Vec::<Vec<u8>>::new());
        assert_eq!(keys(&["COPY", "a", "b", "REPLACE"]), args(&["a", "b"]));
        assert_eq!(keys(&["MSETNX", "a", "1", "b", "2"]), args(&["a", "b"]));
        assert_eq!(keys(&["OBJECT", "ENCODING", "k"]), args(&["k"]));
        assert_eq!(keys(&["OBJECT", "HELP"]), Vec::<Vec<u8>>::new());
        // Counted from the end: BLPOP's keys stop before its timeout.
        assert_eq!(keys(&["BLPOP", "a", "b", "0"]), args(&["a", "b"]));
        assert_eq!(keys(&["BLMOVE", "a", "b", "LEFT", "RIGHT", "0"]), args(&["a", "b"]));
        let map = onekv_placement::ClusterMap::build(&[1, 2, 3], 16, 3).unwrap();
        assert!(same_shard(&map, &[b"{user1}.a", b"{user1}.b"]), "one hash tag, one shard");
        let apart = (0..100)
            .map(|i| format!("k{i}"))
            .find(|key| map.shard_of_key(key.as_bytes()) != map.shard_of_key(b"k0"));
        let apart = apart.expect("some key lands in another of 16 shards");
        assert!(!same_shard(&map, &[b"k0", apart.as_bytes()]));
        let single = onekv_placement::ClusterMap::build(&[1, 2, 3], 1, 3).unwrap();
        assert!(same_shard(&single, &[b"k0", apart.as_bytes()]), "one shard holds every key");
    }

    #[test]
    fn evaluation_applies_commands_in_order_against_the_snapshot() {
        let context = context();
        let queue: Vec<Vec<Vec<u8>>> = [
            &["INCR", "n"][..],
            &["INCRBY", "n", "10"],
            &["GET", "n"],
            &["APPEND", "s", "x"],
            &["INCR", "s"],
            &["SET", "k", "v", "NX"],
            &["SETNX", "k", "w"],
            &["MSET", "a", "1", "b", "2"],
            &["MGET", "a", "k", "missing"],
            &["DEL", "a", "missing"],
            &["EXISTS", "a", "b"],
            &["GETDEL", "b"],
            &["SET", "", "v"],
            &["STRLEN", "s"],
            &["EXPIRETIME", "t"],
            &["INCR", "t"],
            &["EXPIRE", "n", "100"],
            &["PERSIST", "t"],
            &["PTTL", "k"],
            &["PING"],
        ]
        .iter()
        .map(|command| command.iter().map(|arg| arg.as_bytes().to_vec()).collect())
        .collect();
        let t_expires = 4_000_000_000_400;
        let values: HashMap<Vec<u8>, Found> = [
            (b"n".to_vec(), Some((b"5".to_vec(), None))),
            (b"s".to_vec(), Some((b"ab".to_vec(), Some(t_expires)))),
            (b"k".to_vec(), None),
            (b"a".to_vec(), Some((b"0".to_vec(), None))),
            (b"b".to_vec(), None),
            (b"missing".to_vec(), None),
            (b"t".to_vec(), Some((b"7".to_vec(), Some(t_expires)))),
        ]
        .into_iter()
        .collect();
        let evaluation = context.evaluate(&queue, values).unwrap();
        assert_eq!(
            evaluation.replies,
            vec![
                Some(Reply::Integer(6)),
                Some(Reply::Integer(16)),
                Some(Reply::text("16")),
                Some(Reply::Integer(3)),
                Some(Reply::err("value is not an integer or out of range")),
                Some(Reply::ok()),
                Some(Reply::Integer(0)),
                Some(Reply::ok()),
                Some(Reply::Array(vec![Reply::text("1"), Reply::text("v"), Reply::Nil])),
                Some(Reply::Integer(1)),
                Some(Reply::Integer(1)),
                Some(Reply::text("2")),
                Some(Reply::err("invalid argument: empty key")),
                Some(Reply::Integer(3)),
                Some(Reply::Integer(4_000_000_000)),
                Some(Reply::Integer(8)),
                Some(Reply::Integer(1)),
                Some(Reply::Integer(1)),
                Some(Reply::Integer(-1)),
                None,
            ]
        );
        // The net writes, each key once with its last value and the expiry its last write chose
        // (APPEND and INCR keep the key's), in first-write order.
        let write = |key: &str, value: Option<&str>, expiry| WriteItem {
            key: key.as_bytes().to_vec(),
            value: value.map(|value| value.as_bytes().to_vec()),
            expiry,
        };
        assert_eq!(
            evaluation.ops,
            vec![
                write("n", Some("16"), Expiry::After(Duration::from_secs(100))),
                write("s", Some("abx"), Expiry::Keep),
                write("k", Some("v"), Expiry::Never),
                write("a", None, Expiry::Never),
                write("b", None, Expiry::Never),
                write("t", Some("8"), Expiry::Never),
            ]
        );
    }
}
