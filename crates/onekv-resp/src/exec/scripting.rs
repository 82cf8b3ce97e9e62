//! Lua scripts: EVAL, EVALSHA, EVAL_RO, EVALSHA_RO and SCRIPT LOAD|EXISTS|FLUSH|KILL, run as
//! transactions.
//!
//! A script is atomic as in Redis, but not by stopping the node while it runs: like EXEC
//! (`transaction`), a run reads the keys it uses with linearizable reads, runs in memory against
//! those values (`lua`), and commits one replicated transaction whose conditions are the values
//! read and whose ops are the script's net writes. If another client wrote one of those keys in
//! between, nothing is written and the script runs again from the start (bounded). Keys the script
//! declares (`KEYS`) are read before it starts; a key it uses without declaring it stops the run,
//! is read, and the script runs again, so undeclared keys work but cost a run each. Every key must
//! lie in one shard (`-CROSSSLOT` otherwise; `{hash tags}` colocate keys).
//!
//! Other clients are never blocked by a script while it runs normally; one that has been in Lua
//! longer than `busy-reply-threshold` (Redis's `lua-time-limit`, 5 s unless CONFIG SET; 0 turns it
//! off) is taken for a runaway, as Redis takes it: until it ends or SCRIPT KILL stops it, the
//! node's other commands answer `-BUSY` (the check is in `RespContext::execute`; the commands
//! still allowed are `commands::allowed_while_busy`). Per node: the other nodes serve on.
//! Differences from Redis that follow from running as a transaction: a script may run more than
//! once before its writes commit (what it returns is from the run that committed), and SCRIPT KILL
//! always succeeds: a killed script has written nothing. The script
//! cache is per node and bounded ([`MAX_CACHED_SCRIPT_BYTES`]); an EVALSHA the node does not know
//! answers `NOSCRIPT`, which client libraries answer by sending the script again.
//!
//! Owns: the commands, the script cache and the running scripts. Does not own the Lua
//! environment (`lua`) or a transaction's evaluation (`transaction`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::lua::{self, Ran, Script};
use super::transaction::{Found, pause_before_retry, read_bytes, same_shard};
use super::{Outcome, RespContext, Session, databases, not_an_integer, parse_integer, unknown_subcommand};
use crate::protocol::Reply;

/// Bytes of script source a node keeps for EVALSHA; past it the least recently used are dropped.
pub(super) const MAX_CACHED_SCRIPT_BYTES: usize = 64 << 20;
/// Scripts a node runs in Lua at once (each holds a thread and up to `lua::SCRIPT_MEMORY_BYTES`);
/// more wait for one to end. Reading a script's keys and committing its writes need no slot.
pub(super) const MAX_RUNNING_SCRIPTS: usize = 8;
/// How long a script may run in Lua before the node answers `-BUSY` to other commands: Redis's
/// default `busy-reply-threshold`, in milliseconds.
const DEFAULT_BUSY_REPLY_THRESHOLD_MS: u64 = 5000;
/// The reply to a command refused while a script is past the threshold, in Redis's words (clients
/// and tests match on them).
pub(super) const BUSY: &str =
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.";

/// A node's scripts: the cache EVALSHA looks in and the scripts running now.
pub(super) struct Scripts {
    cache: Mutex<Cache>,
    /// The scripts running now, by run number.
    running: Mutex<HashMap<u64, Run>>,
    next_run: AtomicU64,
    slots: tokio::sync::Semaphore,
    /// `busy-reply-threshold` in milliseconds (0: never busy).
    busy_threshold_ms: AtomicU64,
    /// When the run in Lua longest began, in microseconds after `epoch` plus one (0: none in
    /// Lua), kept with `running` so `busy` costs every command an atomic load, not the lock.
    oldest_in_lua: AtomicU64,
    epoch: Instant,
}

/// A running script: its kill flag, and since when it has been in Lua (None while its keys are
/// read, it waits for a slot, or its writes commit).
struct Run {
    kill: Arc<AtomicBool>,
    in_lua_since: Option<Instant>,
}

/// Script sources by SHA1, bounded in bytes.
struct Cache {
    scripts: lru::LruCache<String, Arc<[u8]>>,
    bytes: usize,
}

impl Default for Scripts {
    fn default() -> Scripts {
        Scripts {
            cache: Mutex::new(Cache { scripts: lru::LruCache::unbounded(), bytes: 0 }),
            running: Mutex::default(),
            next_run: AtomicU64::new(1),
            slots: tokio::sync::Semaphore::new(MAX_RUNNING_SCRIPTS),
            busy_threshold_ms: AtomicU64::new(DEFAULT_BUSY_REPLY_THRESHOLD_MS),
            oldest_in_lua: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl Scripts {
    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keeps `body` under its SHA1 `sha`, dropping the least recently used past the bound.
    fn remember(&self, sha: &str, body: Arc<[u8]>) {
        let mut cache = self.cache();
        if cache.scripts.get(sha).is_none() {
            cache.bytes += body.len();
            cache.scripts.put(sha.to_string(), body);
            while cache.bytes > MAX_CACHED_SCRIPT_BYTES {
                let Some((_, dropped)) = cache.scripts.pop_lru() else { break };
                cache.bytes -= dropped.len();
            }
        }
    }

    fn find(&self, sha: &[u8]) -> Option<Arc<[u8]>> {
        let sha = std::str::from_utf8(sha).ok()?.to_ascii_lowercase();
        self.cache().scripts.get(&sha).cloned()
    }

    fn contains(&self, sha: &[u8]) -> bool {
        std::str::from_utf8(sha).is_ok_and(|sha| self.cache().scripts.contains(&sha.to_ascii_lowercase()))
    }

    fn flush(&self) {
        let mut cache = self.cache();
        cache.scripts.clear();
        cache.bytes = 0;
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Run>> {
        self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a run; its kill flag is set by SCRIPT KILL until the guard is dropped.
    fn start(self: &Arc<Scripts>) -> Running {
        let number = self.next_run.fetch_add(1, Ordering::Relaxed);
        let kill = Arc::new(AtomicBool::new(false));
        self.running().insert(number, Run { kill: kill.clone(), in_lua_since: None });
        Running { scripts: self.clone(), number, kill }
    }

    /// SCRIPT KILL: asks the scripts past `busy-reply-threshold` to stop, those that make the node
    /// busy, or, when none is, every running script; `false` if none runs.
    fn kill(&self) -> bool {
        let running = self.running();
        let runaway = |run: &Run| run.in_lua_since.is_some_and(|since| self.past_threshold(since));
        let any_runaway = running.values().any(runaway);
        for run in running.values().filter(|run| !any_runaway || runaway(run)) {
            run.kill.store(true, Ordering::Relaxed);
        }
        !running.is_empty()
    }

    /// Whether a script has been in Lua for `busy-reply-threshold` or longer: the node then answers
    /// `-BUSY` to most commands, as Redis does. One atomic load when no script is in Lua.
    pub(super) fn busy(&self) -> bool {
        match self.oldest_in_lua.load(Ordering::Acquire) {
            0 => false,
            oldest => self.past_threshold(self.epoch + Duration::from_micros(oldest - 1)),
        }
    }

    /// Whether a run in Lua since `since` is past `busy-reply-threshold` (never when it is 0).
    fn past_threshold(&self, since: Instant) -> bool {
        let threshold = self.busy_threshold();
        !threshold.is_zero() && since.elapsed() >= threshold
    }

    /// Recomputes `oldest_in_lua` from `running` (the caller holds its lock and just changed it).
    fn note_oldest_in_lua(&self, running: &HashMap<u64, Run>) {
        let oldest = running.values().filter_map(|run| run.in_lua_since).min();
        let micros = oldest.map_or(0, |since| {
            u64::try_from(since.saturating_duration_since(self.epoch).as_micros()).unwrap_or(u64::MAX - 1) + 1
        });
        self.oldest_in_lua.store(micros, Ordering::Release);
    }

    /// `busy-reply-threshold` (zero: a script never makes the node busy).
    pub(super) fn busy_threshold(&self) -> Duration {
        Duration::from_millis(self.busy_threshold_ms.load(Ordering::Relaxed))
    }

    /// CONFIG SET busy-reply-threshold (or lua-time-limit), in milliseconds.
    pub(super) fn set_busy_threshold(&self, milliseconds: u64) {
        self.busy_threshold_ms.store(milliseconds, Ordering::Relaxed);
    }
}

/// A running script's registration.
struct Running {
    scripts: Arc<Scripts>,
    number: u64,
    kill: Arc<AtomicBool>,
}

impl Running {
    /// Marks the run as in Lua until the guard is dropped (what `Scripts::busy` measures).
    fn in_lua(&self) -> InLua<'_> {
        let mut running = self.scripts.running();
        if let Some(run) = running.get_mut(&self.number) {
            run.in_lua_since = Some(Instant::now());
        }
        self.scripts.note_oldest_in_lua(&running);
        InLua { running: self }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Its EVAL is over, or its future was dropped: a run still going on its thread
        // stops at the next check rather than holding the thread for ever.
        self.kill.store(true, Ordering::Relaxed);
        let mut running = self.scripts.running();
        running.remove(&self.number);
        self.scripts.note_oldest_in_lua(&running);
    }
}

/// A run's time in Lua; dropped when its thread returns.
struct InLua<'a> {
    running: &'a Running,
}

impl Drop for InLua<'_> {
    fn drop(&mut self) {
        let scripts = &self.running.scripts;
        let mut running = scripts.running();
        if let Some(run) = running.get_mut(&self.running.number) {
            run.in_lua_since = None;
        }
        scripts.note_oldest_in_lua(&running);
    }
}

impl RespContext {
    /// EVAL, EVALSHA, EVAL_RO, EVALSHA_RO (`name`).
    pub(super) async fn eval(&self, session: &Session, name: &str, args: &[Vec<u8>]) -> Outcome {
        let scripts = &self.shared.scripts;
        let numkeys = parse_integer(&args[2]).ok_or_else(not_an_integer)?;
        let numkeys = usize::try_from(numkeys).map_err(|_| Reply::err("Number of keys can't be negative"))?;
        if numkeys > args.len() - 3 {
            return Err(Reply::err("Number of keys can't be greater than number of args"));
        }
        let (keys, argv) = args[3..].split_at(numkeys);
        let body: Arc<[u8]> = if name.starts_with("evalsha") {
            scripts
                .find(&args[1])
                .ok_or_else(|| Reply::Error("NOSCRIPT No matching script. Please use EVAL.".into()))?
        } else {
            Arc::from(args[1].as_slice())
        };
        let sha = lua::sha1_hex(&body);
        let read_only = name.ends_with("_ro");
        let max_keys = self.shared.settings.max_batch_ops;
        // The declared keys, as stored in the connection's database; keys onekv cannot hold are
        // absent and never read.
        let mut read_keys: Vec<Vec<u8>> = Vec::new();
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        for key in keys {
            let stored = databases::stored_key(session.db, key);
            if self.storable(&stored) && seen.insert(stored.clone()) {
                read_keys.push(stored);
            }
        }
        let running = scripts.start();
        // Its client leaving stops the run as SCRIPT KILL would.
        let gone = session.cancel.flag();
        let mut attempt = 0;
        loop {
            if read_keys.len() > max_keys {
                return Err(Reply::err(format!(
                    "onekv: a script may use at most {max_keys} keys (limits.max_batch_ops)"
                )));
            }
            if session.cancelled() {
                return Err(Reply::err("onekv: the client left"));
            }
            self.check_one_shard(read_keys.iter()).await?;
            let found = self.get_many_with_expiry(&read_keys, true).await?;
            let max_bytes = self.shared.settings.max_batch_bytes;
            if read_bytes(&read_keys, &found) > max_bytes {
                // Its conditions would carry these values: one transaction could not.
                return Err(Reply::err(format!(
                    "onekv: a script's keys and the values it reads exceed {max_bytes} bytes (limits.max_batch_bytes)"
                )));
            }
            let conditions: Vec<(Vec<u8>, Option<Vec<u8>>)> = read_keys
                .iter()
                .zip(&found)
                .map(|(key, found)| (key.clone(), found.as_ref().map(|(value, _)| value.clone())))
                .collect();
            let values: HashMap<Vec<u8>, Found> = read_keys.iter().cloned().zip(found).collect();
            let (context, source, kill) = (self.clone(), body.clone(), running.kill.clone());
            let gone = gone.clone();
            let (keys, argv, name_of_script, db) = (keys.to_vec(), argv.to_vec(), sha.clone(), session.db);
            // A slot only while Lua runs (a thread and a Lua state), not while reading or committing.
            let slot =
                scripts.slots.acquire().await.map_err(|_| Reply::err("onekv: the node is stopping"))?;
            let in_lua = running.in_lua();
            let ran = tokio::task::spawn_blocking(move || {
                let script = Script { body: &source, sha: &name_of_script, keys: &keys, argv: &argv };
                lua::run(&context, &script, values, db, read_only, &[&kill, &gone])
            })
            .await
            .map_err(|error| Reply::err(format!("onekv: the script's task failed: {error}")))?;
            drop((in_lua, slot));
            match ran {
                Ran::NeedsKeys(keys) => {
                    let before = read_keys.len();
                    read_keys.extend(keys.into_iter().filter(|key| seen.insert(key.clone())));
                    if read_keys.len() == before {
                        return Err(Reply::err("onekv: the script asked again for keys it was given"));
                    }
                }
                Ran::Killed => {
                    return Err(Reply::err(format!(
                        "Script killed by user with SCRIPT KILL... script: {sha}; it wrote nothing"
                    )));
                }
                Ran::NotCompiled(error) => return Err(error),
                Ran::Finished { reply, ops } => {
                    if matches!(name, "eval" | "eval_ro") {
                        scripts.remember(&sha, body.clone());
                    }
                    if ops.is_empty() && conditions.len() <= 1 {
                        // Nothing written, at most one key read: its linearizable read was enough.
                        return Ok(reply);
                    }
                    self.check_one_shard(read_keys.iter().chain(ops.iter().map(|op| &op.key))).await?;
                    if self.commit(conditions, ops).await? {
                        return Ok(reply);
                    }
                    attempt += 1;
                    pause_before_retry(attempt).await?;
                }
            }
        }
    }

    /// How many scripts this node keeps for EVALSHA, and their bytes (INFO memory).
    pub(super) fn cached_scripts(&self) -> (usize, usize) {
        let cache = self.shared.scripts.cache();
        (cache.scripts.len(), cache.bytes)
    }

    /// `-CROSSSLOT` unless every key lies in one shard.
    async fn check_one_shard(&self, keys: impl Iterator<Item = &Vec<u8>>) -> Outcome<()> {
        let keys: Vec<&[u8]> = keys.map(Vec::as_slice).collect();
        if keys.len() > 1 && !same_shard(&*self.shared.client.cluster_map().await?, &keys) {
            return Err(Reply::Error("CROSSSLOT Keys in request don't hash to the same slot".into()));
        }
        Ok(())
    }

    /// `SCRIPT LOAD|EXISTS|FLUSH|KILL|HELP`.
    pub(super) fn script_command(&self, args: &[Vec<u8>]) -> Outcome {
        let scripts = &self.shared.scripts;
        let subcommand = args[1].to_ascii_uppercase();
        match (subcommand.as_slice(), &args[2..]) {
            (b"LOAD", [body]) => {
                lua::check_compiles(body)?;
                let sha = lua::sha1_hex(body);
                scripts.remember(&sha, Arc::from(body.as_slice()));
                Ok(Reply::text(sha))
            }
            (b"EXISTS", shas) if !shas.is_empty() => Ok(Reply::Array(
                shas.iter().map(|sha| Reply::Integer(i64::from(scripts.contains(sha)))).collect(),
            )),
            (b"FLUSH", []) => {
                scripts.flush();
                Ok(Reply::ok())
            }
            (b"FLUSH", [mode])
                if mode.eq_ignore_ascii_case(b"ASYNC") || mode.eq_ignore_ascii_case(b"SYNC") =>
            {
                scripts.flush();
                Ok(Reply::ok())
            }
            (b"KILL", []) => {
                if scripts.kill() {
                    Ok(Reply::ok())
                } else {
                    Err(Reply::Error("NOTBUSY No scripts in execution right now.".into()))
                }
            }
            (b"HELP", []) => Ok(Reply::Array(
                [
                    "SCRIPT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                    "EXISTS <sha1> [<sha1> ...]",
                    "    Return information about the existence of the scripts in this node's cache.",
                    "FLUSH [ASYNC|SYNC]",
                    "    Flush this node's Lua scripts cache.",
                    "KILL",
                    "    Stop the scripts on this node that make it busy, else all running (a killed script has written nothing).",
                    "LOAD <script>",
                    "    Load a script into this node's cache without running it.",
                    "HELP",
                    "    Print this help.",
                ]
                .iter()
                .map(|line| Reply::Simple((*line).into()))
                .collect(),
            )),
            (b"DEBUG", _) => Err(Reply::err("onekv: SCRIPT DEBUG is not supported")),
            (b"LOAD" | b"EXISTS" | b"FLUSH" | b"KILL" | b"HELP", _) => Err(Reply::err(format!(
                "unknown subcommand or wrong number of arguments for '{}'. Try SCRIPT HELP.",
                String::from_utf8_lossy(&subcommand)
            ))),
            _ => Err(unknown_subcommand(&args[1], "SCRIPT")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_bounded_in_bytes_and_drops_the_least_recently_used() {
        let scripts = Scripts::default();
        let body = |fill: u8| -> Arc<[u8]> { Arc::from(vec![fill; 1 << 20]) };
        let sha = |fill: u8| lua::sha1_hex(&body(fill));
        for fill in 0..64u8 {
            scripts.remember(&sha(fill), body(fill));
        }
        assert!(scripts.find(sha(0).as_bytes()).is_some(), "64 MiB fit");
        // Script 0 was just used; 1 is now the least recently used, and goes first.
        scripts.remember(&sha(64), body(64));
        assert!(scripts.contains(sha(0).to_uppercase().as_bytes()), "SHA1s are matched in any case");
        assert!(!scripts.contains(sha(1).as_bytes()));
        assert!(scripts.cache().bytes <= MAX_CACHED_SCRIPT_BYTES);
        scripts.flush();
        let cache = scripts.cache();
        assert_eq!((cache.scripts.len(), cache.bytes), (0, 0));
    }

    #[test]
    fn a_run_whose_eval_is_dropped_is_told_to_stop_and_kill_reaches_every_run() {
        let scripts = Arc::new(Scripts::default());
        assert!(!scripts.kill(), "nothing runs");
        let (first, second) = (scripts.start(), scripts.start());
        let first_kill = first.kill.clone();
        drop(first);
        assert!(first_kill.load(Ordering::Relaxed), "a dropped EVAL stops its run");
        assert!(!second.kill.load(Ordering::Relaxed));
        assert!(scripts.kill());
        assert!(second.kill.load(Ordering::Relaxed));
        drop(second);
        assert!(!scripts.kill());
    }

    /// Generous against a loaded machine: only "at least this long" is timed.
    const THRESHOLD_MS: u64 = 300;
    const PAST: Duration = Duration::from_millis(THRESHOLD_MS + 100);

    #[test]
    fn only_time_in_lua_past_the_threshold_makes_the_node_busy() {
        let scripts = Arc::new(Scripts::default());
        scripts.set_busy_threshold(THRESHOLD_MS);
        let running = scripts.start();
        std::thread::sleep(PAST);
        assert!(!scripts.busy(), "reading keys or waiting for a slot is not running");
        let in_lua = running.in_lua();
        std::thread::sleep(PAST);
        assert!(scripts.busy());
        scripts.set_busy_threshold(0);
        assert!(!scripts.busy(), "0 turns it off");
        scripts.set_busy_threshold(THRESHOLD_MS);
        drop(in_lua);
        assert!(!scripts.busy(), "out of Lua again");
        let in_lua = running.in_lua();
        std::thread::sleep(PAST);
        assert!(scripts.busy());
        drop(in_lua);
        drop(running);
        assert!(!scripts.busy());
    }

    #[test]
    fn script_kill_stops_the_runaways_only_while_there_are_some() {
        let scripts = Arc::new(Scripts::default());
        scripts.set_busy_threshold(THRESHOLD_MS);
        let (runaway, short) = (scripts.start(), scripts.start());
        let in_lua = runaway.in_lua();
        std::thread::sleep(PAST);
        let short_in_lua = short.in_lua();
        assert!(scripts.busy());
        assert!(scripts.kill());
        assert!(runaway.kill.load(Ordering::Relaxed));
        assert!(!short.kill.load(Ordering::Relaxed), "a script under the threshold runs on");
        drop(in_lua);
        drop(runaway);
        assert!(!scripts.busy(), "the one left in Lua began after the threshold's start");
        assert!(scripts.kill(), "no runaway: every script is stopped");
        assert!(short.kill.load(Ordering::Relaxed));
        drop(short_in_lua);
    }
}
