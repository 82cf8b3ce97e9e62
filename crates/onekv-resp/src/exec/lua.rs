//! One run of a Lua script: the sandboxed Lua 5.1 environment Redis gives scripts (`KEYS`, `ARGV`,
//! the `redis` table, no new global variables, no files, no precompiled chunks), `redis.call`
//! evaluated against a transaction's snapshot, and the conversions between Lua values and replies
//! that Redis defines.
//!
//! Owns: the environment, `redis.call` and the conversions. Does not own reading keys or committing
//! the writes (`scripting`): a run sees only the values it is given. When the script names a key it
//! was not given, the run stops and reports the keys to read before running it again, so a script
//! is a pure function of the values it read, like a queued transaction (`transaction`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use mlua::{ChunkMode, HookTriggers, Lua, LuaOptions, StdLib, Table, Value, Variadic, VmState};
use onekv_client::WriteItem;

use super::transaction::{Found, Snapshot};
use super::{MAX_REPLY_BYTES, RespContext, databases, lua_libs};
use crate::commands;
use crate::protocol::Reply;

/// Memory one script's Lua state may allocate; past it the script fails with an error.
pub(super) const SCRIPT_MEMORY_BYTES: usize = 64 << 20;
/// Lua VM instructions between two checks for SCRIPT KILL.
const KILL_CHECK_INSTRUCTIONS: u32 = 10_000;
/// Deepest nesting of tables converted either way (a script's reply, a reply given to a script).
const MAX_NESTING: usize = 64;
/// The name scripts are compiled under: Lua's messages then say `user_script:LINE:`, as Redis's do.
const CHUNK_NAME: &str = "@user_script";

/// The script's environment, in Lua: the `redis` table (`raw` is the Rust side of
/// `redis.call`/`redis.pcall`; errors come back as `{err = ...}` tables, which `call` raises and
/// `pcall` returns), `KEYS`, `ARGV`, the libraries, and nothing else. As in Redis 7 the globals and
/// the libraries are read-only and reading an absent global is an error; there are no files, no
/// output and no precompiled chunks (Lua 5.1 does not verify bytecode). Returns the environment.
const PRELUDE: &str = r#"
local raw, sha1hex, log, keys, argv, cjson, bit, stopped, random, randomseed = ...
local real_setmetatable, real_getmetatable, setfenv = setmetatable, getmetatable, setfenv
local function readonly_error() error('Attempt to modify a readonly table', 2) end
local function readonly(t)
  return real_setmetatable({}, {__index = t, __newindex = readonly_error, __metatable = false})
end
local redis = {}
redis.call = function(...)
  local reply = raw(true, ...)
  if type(reply) == 'table' and rawget(reply, 'err') ~= nil then error(reply, 0) end
  return reply
end
redis.pcall = function(...) return raw(false, ...) end
redis.error_reply = function(text)
  if type(text) ~= 'string' then error('wrong number or type of arguments', 2) end
  return {err = text}
end
redis.status_reply = function(text)
  if type(text) ~= 'string' then error('wrong number or type of arguments', 2) end
  return {ok = text}
end
redis.sha1hex = sha1hex
redis.log = log
redis.LOG_DEBUG, redis.LOG_VERBOSE, redis.LOG_NOTICE, redis.LOG_WARNING = 0, 1, 2, 3
redis.setresp = function(version)
  if version == 2 then return end
  if version == 3 then error('onekv: scripts get RESP2 replies only (redis.setresp(3) is not supported)', 2) end
  error('RESP version must be 2 or 3.', 2)
end
redis.REPL_NONE, redis.REPL_AOF, redis.REPL_SLAVE, redis.REPL_REPLICA, redis.REPL_ALL = 0, 1, 2, 2, 3
redis.set_repl = function() end
redis.replicate_commands = function() return true end
redis.breakpoint = function() return false end
redis.debug = function() end
redis.REDIS_VERSION = '7.0.0'
redis.REDIS_VERSION_NUM = 0x070000
local visible = {}
for _, name in ipairs({'assert', 'collectgarbage', 'error', 'gcinfo', 'ipairs', 'next', 'pairs',
    'rawequal', 'rawget', 'rawset', 'select', 'tonumber', 'tostring', 'type', 'unpack', '_VERSION'}) do
  visible[name] = _G[name]
end
-- A script told to stop (SCRIPT KILL, its client gone, a key it was not given, a bound passed)
-- cannot go on by catching the error: pcall and xpcall raise it again.
local real_pcall, real_xpcall = pcall, xpcall
local function rethrow_if_stopped(...)
  if stopped() then error('Script killed by user with SCRIPT KILL...', 0) end
  return ...
end
visible.pcall = function(...) return rethrow_if_stopped(real_pcall(...)) end
visible.xpcall = function(...) return rethrow_if_stopped(real_xpcall(...)) end
-- math.random as Redis gives it: the same sequence in every run (a script may run more than once).
local script_math = {}
for name, value in pairs(math) do script_math[name] = value end
script_math.random, script_math.randomseed = random, randomseed
visible.getmetatable = real_getmetatable
visible.setmetatable = function(t, mt)
  if real_getmetatable(t) == false then readonly_error() end
  return real_setmetatable(t, mt)
end
-- No coroutine library: the instruction hook that stops a script does not reach coroutines.
for name, library in pairs({string = string, table = table, math = script_math, redis = redis, cjson = cjson,
    bit = bit}) do
  visible[name] = readonly(library)
end
visible.KEYS, visible.ARGV = keys, argv
local env = real_setmetatable({}, {
  __index = function(_, name)
    local value = visible[name]
    if value == nil then
      error("Script attempted to access nonexistent global variable '" .. tostring(name) .. "'", 2)
    end
    return value
  end,
  __newindex = readonly_error,
  __metatable = false,
})
visible._G = env
local text_only = loadstring
visible.loadstring = function(chunk, name)
  if type(chunk) == 'string' and chunk:byte(1) == 27 then
    return nil, 'onekv: precompiled chunks cannot be loaded'
  end
  local loaded, why = text_only(chunk, name)
  if loaded then setfenv(loaded, env) end
  return loaded, why
end
return env
"#;

/// [`PRELUDE`] compiled once per process (our own source, so loading its bytecode is safe; a
/// script's never is).
fn prelude_bytecode() -> &'static [u8] {
    static BYTECODE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTECODE.get_or_init(|| {
        let lua = Lua::new_with(StdLib::NONE, LuaOptions::new()).expect("a Lua state");
        let prelude = lua.load(PRELUDE).set_name("=onekv").into_function().expect("the prelude compiles");
        prelude.dump(false)
    })
}

/// One script to run: its source, its SHA1 (for error messages) and its arguments.
pub(super) struct Script<'a> {
    pub body: &'a [u8],
    pub sha: &'a str,
    /// `KEYS`, as the client named them (without their database's prefix).
    pub keys: &'a [Vec<u8>],
    pub argv: &'a [Vec<u8>],
}

/// How a run ended.
pub(super) enum Ran {
    /// The script returned (or failed: then `reply` is the error): its reply and the net writes
    /// it made (Redis keeps the writes a failing script made before it failed).
    Finished { reply: Reply, ops: Vec<WriteItem> },
    /// The script used keys whose values the run was not given: read them and run again.
    NeedsKeys(Vec<Vec<u8>>),
    /// SCRIPT KILL stopped it; it wrote nothing.
    Killed,
    /// The source does not compile.
    NotCompiled(Reply),
}

/// `redis.call`'s state during a run.
struct Calls<'a> {
    context: &'a RespContext,
    snapshot: Snapshot,
    /// The database the script's keys are in (its connection's, until the script SELECTs).
    db: u8,
    read_only: bool,
    /// Keys the script used that the run was not given.
    missing: Vec<Vec<u8>>,
    /// Set when the script's writes passed what one transaction may carry: the run fails whole.
    too_large: Option<Reply>,
    /// Set once `missing` is not empty: the run is abandoned (checked by the instruction hook too,
    /// in case the script catches the error and goes on).
    abandoned: Arc<AtomicBool>,
}

/// Runs `script` in database `db` against `values` (every key it reads, with its value and expiry
/// time). Any of the `kill` flags stops it (SCRIPT KILL, its client gone). Blocking: call it off the
/// async runtime's workers.
pub(super) fn run(
    context: &RespContext,
    script: &Script<'_>,
    values: HashMap<Vec<u8>, Found>,
    db: u8,
    read_only: bool,
    kill: &[&Arc<AtomicBool>],
) -> Ran {
    let kill = Stop(kill.iter().map(|flag| Arc::clone(flag)).collect());
    let abandoned = Arc::new(AtomicBool::new(false));
    let mut calls = Calls {
        context,
        snapshot: Snapshot::new(values),
        db,
        read_only,
        missing: Vec::new(),
        too_large: None,
        abandoned: abandoned.clone(),
    };
    let outcome = run_in_lua(&mut calls, script, &kill, &abandoned);
    if !calls.missing.is_empty() {
        return Ran::NeedsKeys(calls.missing);
    }
    if kill.is_set() {
        return Ran::Killed;
    }
    if let Some(error) = calls.too_large {
        return Ran::Finished { reply: error, ops: Vec::new() };
    }
    match outcome {
        Ok(reply) => Ran::Finished { reply, ops: calls.snapshot.net_writes() },
        Err(RunError::Compile(message)) => {
            Ran::NotCompiled(Reply::err(format!("Error compiling script (new function): {message}")))
        }
        Err(RunError::Refused(error)) => Ran::NotCompiled(error),
        Err(RunError::Lua(error)) => Ran::Finished {
            reply: Reply::err(format!("onekv: the script's Lua state failed: {error}")),
            ops: calls.snapshot.net_writes(),
        },
    }
}

/// Compiles `body` as a script, for SCRIPT LOAD: `Err` is the error EVAL would answer.
pub(super) fn check_compiles(body: &[u8]) -> Result<(), Reply> {
    let (body, _) = parse_shebang(body)?;
    let lua = Lua::new_with(StdLib::NONE, LuaOptions::new())
        .map_err(|error| Reply::err(format!("onekv: no Lua state: {error}")))?;
    match lua.load(&*body).set_name(CHUNK_NAME).set_mode(ChunkMode::Text).into_function() {
        Ok(_) => Ok(()),
        Err(error) => {
            Err(Reply::err(format!("Error compiling script (new function): {}", compile_message(&error))))
        }
    }
}

enum RunError {
    Compile(String),
    /// Refused before it ran (its shebang line).
    Refused(Reply),
    Lua(mlua::Error),
}

impl From<mlua::Error> for RunError {
    fn from(error: mlua::Error) -> RunError {
        RunError::Lua(error)
    }
}

/// Flags that tell a run to stop (SCRIPT KILL, its client gone).
#[derive(Clone)]
struct Stop(Vec<Arc<AtomicBool>>);

impl Stop {
    fn is_set(&self) -> bool {
        self.0.iter().any(|flag| flag.load(Ordering::Relaxed))
    }
}

fn run_in_lua(
    calls: &mut Calls<'_>,
    script: &Script<'_>,
    kill: &Stop,
    abandoned: &Arc<AtomicBool>,
) -> Result<Reply, RunError> {
    let (body, flags) = parse_shebang(script.body).map_err(RunError::Refused)?;
    calls.read_only |= flags.no_writes;
    let lua = Lua::new_with(StdLib::TABLE | StdLib::STRING | StdLib::MATH, LuaOptions::new())?;
    lua.set_memory_limit(SCRIPT_MEMORY_BYTES)?;
    // Setting the state up allocates a known, bounded amount: no collection until the script runs.
    lua.gc_stop();
    let sha1hex = lua.create_function(|_, args: Variadic<mlua::String>| match args.as_slice() {
        [text] => Ok(sha1_hex(&text.as_bytes())),
        _ => Err(mlua::Error::runtime("wrong number of arguments")),
    })?;
    let log = lua.create_function(|_, (level, message): (i64, Variadic<Value>)| {
        let text: Vec<String> = message.iter().map(|value| value.to_string().unwrap_or_default()).collect();
        let text = text.join(" ");
        let text = &text[..text.floor_char_boundary(1024)];
        match level {
            0 | 1 => tracing::debug!(target: "onekv::script", "{text}"),
            2 => tracing::info!(target: "onekv::script", "{text}"),
            _ => tracing::warn!(target: "onekv::script", "{text}"),
        }
        Ok(())
    })?;
    let (killed, gave_up) = (kill.clone(), abandoned.clone());
    let stopped = lua.create_function(move |_, ()| Ok(killed.is_set() || gave_up.load(Ordering::Relaxed)))?;
    let (random, randomseed) = lua_libs::random(&lua)?;
    let (kill, stop) = (kill.clone(), abandoned.clone());
    lua.set_hook(HookTriggers::new().every_nth_instruction(KILL_CHECK_INSTRUCTIONS), move |_, _| {
        if kill.is_set() || stop.load(Ordering::Relaxed) {
            return Err(mlua::Error::runtime("Script killed by user with SCRIPT KILL..."));
        }
        Ok(VmState::Continue)
    })?;
    let strings = |items: &[Vec<u8>]| -> mlua::Result<Table> {
        let table = lua.create_table_with_capacity(items.len(), 0)?;
        for item in items {
            table.raw_push(lua.create_string(item)?)?;
        }
        Ok(table)
    };
    let (keys, argv) = (strings(script.keys)?, strings(script.argv)?);
    let (cjson, bit) = (lua_libs::cjson(&lua)?, lua_libs::bit(&lua)?);
    let ran: Result<(bool, Value), String> = lua.scope(|scope| {
        let raw = scope.create_function_mut(|lua, (raise, args): (bool, Variadic<Value>)| {
            calls.call_from_lua(lua, raise, &args, script.sha)
        })?;
        let prelude = lua.load(prelude_bytecode()).set_name("=onekv").set_mode(ChunkMode::Binary);
        let env: Table =
            prelude.call((raw, sha1hex, log, keys, argv, cjson, bit, stopped, random, randomseed))?;
        let chunk = lua.load(&*body).set_name(CHUNK_NAME).set_mode(ChunkMode::Text).set_environment(env);
        let function = match chunk.into_function() {
            Ok(function) => function,
            Err(error) => return Ok(Err(compile_message(&error))),
        };
        lua.gc_restart();
        // Lua's own pcall, so an error raised as a table (`redis.call`'s) reaches us whole.
        let pcall: mlua::Function = lua.globals().raw_get("pcall")?;
        Ok(Ok(pcall.call((function,))?))
    })?;
    let (succeeded, result) = ran.map_err(RunError::Compile)?;
    if succeeded {
        let mut budget = MAX_REPLY_BYTES;
        return Ok(reply_of(result, 0, &mut budget).unwrap_or_else(|error| error));
    }
    Ok(match result {
        // `redis.call`'s error, or `error({err = ...})`: the text as it is.
        Value::Table(table) => match table.raw_get::<Value>("err")? {
            Value::String(text) => Reply::Error(text.to_string_lossy()),
            _ => Reply::err(format!("onekv: the script raised a table without 'err' script: {}", script.sha)),
        },
        Value::String(text) => {
            let text = text.to_string_lossy();
            if text.contains("not enough memory") {
                Reply::err(format!(
                    "onekv: the script used more than {} MiB of memory script: {}",
                    SCRIPT_MEMORY_BYTES >> 20,
                    script.sha
                ))
            } else {
                Reply::err(format!("{text} script: {}", script.sha))
            }
        }
        Value::Error(error) => Reply::err(format!("{} script: {}", error_text(&error), script.sha)),
        other => Reply::err(format!("{} script: {}", other.to_string().unwrap_or_default(), script.sha)),
    })
}

/// What a script's first line (`#!lua flags=...`, Redis 7) asks for.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct ScriptFlags {
    /// `no-writes`: the script runs as under EVAL_RO.
    pub no_writes: bool,
}

/// The script without its shebang line (kept as an empty line, so line numbers stay right) and
/// the flags it names. Redis's flags are accepted; `no-writes` is the one that changes anything
/// in onekv, and `no-cluster` is refused since onekv is a cluster.
pub(super) fn parse_shebang(body: &[u8]) -> Result<(std::borrow::Cow<'_, [u8]>, ScriptFlags), Reply> {
    let mut flags = ScriptFlags::default();
    let Some(rest) = body.strip_prefix(b"#!") else { return Ok((body.into(), flags)) };
    let end = rest.iter().position(|&byte| byte == b'\n').unwrap_or(rest.len());
    let line = String::from_utf8_lossy(&rest[..end]);
    let mut words = line.split_whitespace();
    if words.next() != Some("lua") {
        return Err(Reply::err("Unexpected engine in script shebang"));
    }
    for word in words {
        let Some(list) = word.strip_prefix("flags=") else {
            return Err(Reply::err(format!("Unknown lua shebang option: {word}")));
        };
        for flag in list.split(',').filter(|flag| !flag.is_empty()) {
            match flag {
                "no-writes" => flags.no_writes = true,
                "allow-oom" | "allow-stale" | "allow-cross-slot-keys" => {}
                "no-cluster" => {
                    return Err(Reply::err("Can not run script on cluster, 'no-cluster' flag is set."));
                }
                other => return Err(Reply::err(format!("Unexpected flag in script shebang: {other}"))),
            }
        }
    }
    let mut stripped = Vec::with_capacity(body.len());
    stripped.extend_from_slice(&body[2 + end..]);
    Ok((stripped.into(), flags))
}

impl Calls<'_> {
    /// `redis.call` (`raise`) or `redis.pcall` with `args` from Lua: the reply as a Lua value, an
    /// error as an `{err = ...}` table (`redis.call`'s naming the script and line).
    fn call_from_lua(&mut self, lua: &Lua, raise: bool, args: &[Value], sha: &str) -> mlua::Result<Value> {
        let reply = match command_arguments(args) {
            Ok(args) => self.call(args)?,
            Err(error) => error,
        };
        match reply {
            Reply::Error(text) if raise => {
                let line =
                    script_line(lua).map_or(String::new(), |line| format!(", on {CHUNK_NAME}:{line}."));
                lua_of(lua, Reply::Error(format!("{text} script: {sha}{line}")), 0)
            }
            reply => lua_of(lua, reply, 0),
        }
    }

    /// One command of the script, against the snapshot. `Err` abandons the run (a key it was not
    /// given).
    fn call(&mut self, args: Vec<Vec<u8>>) -> mlua::Result<Reply> {
        if self.abandoned.load(Ordering::Relaxed) {
            return Err(abandon());
        }
        let Some(spec) = commands::lookup(&args[0]) else {
            return Ok(Reply::err("Unknown Redis command called from script"));
        };
        if !spec.arity_ok(args.len()) {
            return Ok(Reply::err("Wrong number of args calling Redis command from script"));
        }
        if spec.flags.contains(&"noscript") || matches!(spec.name, "flushall" | "flushdb") {
            return Ok(Reply::err("This Redis command is not allowed from script"));
        }
        if self.read_only && spec.flags.contains(&"write") {
            return Ok(Reply::err("Write commands are not allowed from read-only scripts."));
        }
        if spec.name == "select" {
            // The script's database only: the connection's stays (as in Redis 7).
            return Ok(match databases::parse_index(&args[1]) {
                Ok(db) => {
                    self.db = db;
                    Reply::ok()
                }
                Err(error) => error,
            });
        }
        let args = match databases::translate(self.db, spec, args) {
            Ok(args) => args,
            Err(error) => return Ok(error),
        };
        if !commands::is_blind_write(&args) {
            let context = self.context;
            let missing: Vec<Vec<u8>> = spec
                .key_arguments(&args)
                .filter(|key| context.storable(key) && !self.snapshot.knows(key))
                .cloned()
                .collect();
            if !missing.is_empty() {
                self.missing.extend(missing);
                self.abandoned.store(true, Ordering::Relaxed);
                return Err(abandon());
            }
        }
        let reply = match self.context.evaluate_one(spec, &args, &mut self.snapshot) {
            Some(reply) => reply,
            None => keyless(spec.name, &args),
        };
        let settings = &self.context.shared.settings;
        let (keys, bytes) = self.snapshot.written_size();
        if keys > settings.max_batch_ops || bytes > settings.max_batch_bytes {
            // One transaction carries at most this much; the writes so far stay in memory only.
            self.too_large = Some(Reply::err(format!(
                "onekv: a script writes at most {} keys and {} bytes (limits.max_batch_ops, \
                 limits.max_batch_bytes); nothing was written",
                settings.max_batch_ops, settings.max_batch_bytes
            )));
            self.abandoned.store(true, Ordering::Relaxed);
            return Err(abandon());
        }
        Ok(reply)
    }
}

/// A command without keys, inside a script: the few that need nothing but their arguments.
fn keyless(name: &str, args: &[Vec<u8>]) -> Reply {
    match (name, args) {
        ("ping", [_]) => Reply::Simple("PONG".into()),
        ("ping", [_, message]) | ("echo", [_, message]) => Reply::Bulk(message.clone()),
        ("time", _) => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            Reply::Array(vec![
                Reply::Bulk(now.as_secs().to_string().into_bytes()),
                Reply::Bulk(now.subsec_micros().to_string().into_bytes()),
            ])
        }
        (other, _) => Reply::err(format!(
            "onekv: {} cannot be called from a script (only commands on keys, PING, ECHO and TIME)",
            other.to_ascii_uppercase()
        )),
    }
}

fn abandon() -> mlua::Error {
    mlua::Error::runtime("onekv: the script used a key it was not given; it runs again once it is read")
}

/// `redis.call`'s arguments as Redis takes them: strings, and numbers written as Redis writes them.
fn command_arguments(args: &[Value]) -> Result<Vec<Vec<u8>>, Reply> {
    if args.is_empty() {
        return Err(Reply::err("Please specify at least one argument for this redis lib call"));
    }
    args.iter()
        .map(|arg| match arg {
            Value::String(text) => Ok(text.as_bytes().to_vec()),
            Value::Integer(number) => Ok(number.to_string().into_bytes()),
            Value::Number(number) => Ok(number_text(*number).into_bytes()),
            _ => Err(Reply::err("Lua redis lib command arguments must be strings or integers")),
        })
        .collect()
}

/// A Lua number as an argument: integral values without a fraction, others in the shortest form
/// that reads back the same (Redis uses `%.17g`; both read back the same double).
fn number_text(number: f64) -> String {
    if number.fract() == 0.0 && number.abs() < 1e17 {
        format!("{}", number as i64)
    } else {
        format!("{number}")
    }
}

/// The line of the script that is running, if the stack shows it (`return redis.call(...)` is a
/// tail call, which leaves no frame of the script).
fn script_line(lua: &Lua) -> Option<usize> {
    (0..8).find_map(|level| {
        lua.inspect_stack(level, |debug| {
            (debug.source().source.as_deref() == Some(CHUNK_NAME)).then(|| debug.current_line()).flatten()
        })
        .flatten()
    })
}

/// A reply given to a script, as Redis converts it (RESP2): integers to numbers, bulk strings to
/// strings, nil to false, arrays (and maps, flattened) to tables, a status to `{ok = ...}` and an
/// error to `{err = ...}`.
fn lua_of(lua: &Lua, reply: Reply, depth: usize) -> mlua::Result<Value> {
    if depth > MAX_NESTING {
        return Err(mlua::Error::runtime("reached lua stack limit"));
    }
    let field = |name: &str, text: String| -> mlua::Result<Value> {
        let table = lua.create_table()?;
        table.raw_set(name, lua.create_string(text)?)?;
        Ok(Value::Table(table))
    };
    Ok(match reply {
        Reply::Simple(text) => field("ok", text)?,
        Reply::Error(text) => field("err", text)?,
        // Lua 5.1 numbers are doubles, as in Redis.
        Reply::Integer(number) => Value::Number(number as f64),
        Reply::Bulk(bytes) => Value::String(lua.create_string(bytes)?),
        Reply::Verbatim(text) | Reply::Double(text) => Value::String(lua.create_string(text)?),
        Reply::Nil | Reply::NilArray => Value::Boolean(false),
        Reply::Array(items) => {
            let table = lua.create_table_with_capacity(items.len(), 0)?;
            for item in items {
                table.raw_push(lua_of(lua, item, depth + 1)?)?;
            }
            Value::Table(table)
        }
        Reply::Map(pairs) | Reply::Pairs(pairs) => {
            let table = lua.create_table_with_capacity(pairs.len() * 2, 0)?;
            for (key, value) in pairs {
                table.raw_push(lua_of(lua, key, depth + 1)?)?;
                table.raw_push(lua_of(lua, value, depth + 1)?)?;
            }
            Value::Table(table)
        }
    })
}

/// A script's return value as Redis converts it: strings to bulk strings, numbers to integers
/// (truncated), true to 1, false and nil to nil, `{err = ...}` to an error, `{ok = ...}` to a
/// status, other tables to arrays (up to their first nil). At most `budget` bytes of strings.
fn reply_of(value: Value, depth: usize, budget: &mut usize) -> Result<Reply, Reply> {
    if depth > MAX_NESTING {
        return Err(Reply::err("reached lua stack limit"));
    }
    fn spend(budget: &mut usize, bytes: usize) -> Result<(), Reply> {
        *budget = budget.checked_sub(bytes).ok_or_else(|| {
            Reply::err(format!("onekv: the script's reply would exceed {MAX_REPLY_BYTES} bytes"))
        })?;
        Ok(())
    }
    Ok(match value {
        Value::String(text) => {
            let bytes = text.as_bytes().to_vec();
            spend(budget, bytes.len())?;
            Reply::Bulk(bytes)
        }
        Value::Integer(number) => Reply::Integer(number),
        // A saturating truncation (Redis casts to long long).
        Value::Number(number) => Reply::Integer(number as i64),
        Value::Boolean(true) => Reply::Integer(1),
        Value::Table(table) => {
            let lua_error = |error: mlua::Error| Reply::err(format!("onekv: {error}"));
            if let Value::String(text) = table.raw_get::<Value>("err").map_err(lua_error)? {
                return Ok(Reply::Error(text.to_string_lossy()));
            }
            if let Value::String(text) = table.raw_get::<Value>("ok").map_err(lua_error)? {
                return Ok(Reply::Simple(text.to_string_lossy()));
            }
            let mut items = Vec::new();
            for index in 1.. {
                let item = table.raw_get::<Value>(index).map_err(lua_error)?;
                if item.is_nil() {
                    break;
                }
                spend(budget, 16)?;
                items.push(reply_of(item, depth + 1, budget)?);
            }
            Reply::Array(items)
        }
        Value::Error(error) => Reply::err(error_text(&error)),
        _ => Reply::Nil,
    })
}

/// A compile error as Lua words it (`user_script:1: ...`), without mlua's decoration.
fn compile_message(error: &mlua::Error) -> String {
    match error {
        mlua::Error::SyntaxError { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// A Rust-side error's own message (mlua wraps runtime errors with a traceback and context).
fn error_text(error: &mlua::Error) -> String {
    match error {
        mlua::Error::RuntimeError(message) => message.clone(),
        mlua::Error::CallbackError { cause, .. } => error_text(cause),
        mlua::Error::MemoryError(_) => "not enough memory".into(),
        other => other.to_string(),
    }
}

/// The lowercase hex SHA1 of `bytes`: a script's name for EVALSHA.
pub(super) fn sha1_hex(bytes: &[u8]) -> String {
    use sha1::Digest as _;
    sha1::Sha1::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::RespSettings;
    use onekv_client::Expiry;

    fn context() -> RespContext {
        // Nothing listens: a run only sees the values it is given.
        RespContext::new(RespSettings::new(1, vec!["127.0.0.1:1".into()], "127.0.0.1:6379".into())).unwrap()
    }

    fn strings(items: &[&str]) -> Vec<Vec<u8>> {
        items.iter().map(|item| item.as_bytes().to_vec()).collect()
    }

    fn values(pairs: &[(&str, Option<&str>)]) -> HashMap<Vec<u8>, Found> {
        pairs
            .iter()
            .map(|(key, value)| {
                (key.as_bytes().to_vec(), value.map(|value| (value.as_bytes().to_vec(), None)))
            })
            .collect()
    }

    fn run_with(
        body: &str,
        keys: &[&str],
        argv: &[&str],
        given: &[(&str, Option<&str>)],
        read_only: bool,
    ) -> Ran {
        let (keys, argv) = (strings(keys), strings(argv));
        let sha = sha1_hex(body.as_bytes());
        let script = Script { body: body.as_bytes(), sha: &sha, keys: &keys, argv: &argv };
        run(&context(), &script, values(given), 0, read_only, &[&Arc::new(AtomicBool::new(false))])
    }

    /// The reply and writes of a run that finished.
    fn finished(ran: Ran) -> (Reply, Vec<WriteItem>) {
        match ran {
            Ran::Finished { reply, ops } => (reply, ops),
            Ran::NeedsKeys(keys) => panic!("needs keys {keys:?}"),
            Ran::Killed => panic!("killed"),
            Ran::NotCompiled(error) => panic!("not compiled: {error:?}"),
        }
    }

    fn error_text(reply: &Reply) -> &str {
        match reply {
            Reply::Error(text) => text,
            other => panic!("not an error: {other:?}"),
        }
    }

    #[test]
    fn a_script_reads_and_writes_its_snapshot_and_reports_the_net_writes() {
        let body = "local n = redis.call('INCRBY', KEYS[1], ARGV[1]) \
                    redis.call('SET', KEYS[2], 'x' .. n) \
                    redis.call('INCR', KEYS[1]) \
                    return {n, redis.call('GET', KEYS[2]), redis.call('GET', KEYS[1])}";
        let (reply, ops) = finished(run_with(body, &["n", "s"], &["5"], &[("n", Some("10"))], false));
        assert_eq!(reply, Reply::Array(vec![Reply::Integer(15), Reply::text("x15"), Reply::text("16")]));
        let write = |key: &str, value: &str| WriteItem {
            key: key.as_bytes().to_vec(),
            value: Some(value.as_bytes().to_vec()),
            expiry: if key == "n" { Expiry::Keep } else { Expiry::Never },
        };
        assert_eq!(ops, vec![write("n", "16"), write("s", "x15")], "each key once, its last value");
    }

    #[test]
    fn a_key_the_run_was_not_given_stops_it_even_if_the_script_catches_the_error() {
        match run_with("return redis.call('GET', 'other')", &[], &[], &[], false) {
            Ran::NeedsKeys(keys) => assert_eq!(keys, strings(&["other"])),
            _ => panic!("an undeclared key must be read first"),
        }
        // Caught by pcall, and then an endless loop: the hook stops it all the same.
        let body = "pcall(redis.call, 'GET', 'other') while true do end";
        assert!(matches!(run_with(body, &[], &[], &[], false), Ran::NeedsKeys(_)));
        // A blind write needs no read; SELECT changes the database of later keys.
        let (reply, ops) = finished(run_with("return redis.call('SET', 'w', 1)", &[], &[], &[], false));
        assert_eq!((reply, ops.len()), (Reply::ok(), 1));
        match run_with("redis.call('SELECT', 3) return redis.call('GET', 'k')", &[], &[], &[], false) {
            Ran::NeedsKeys(keys) => assert_eq!(keys, vec![databases::stored_key(3, b"k")]),
            _ => panic!("the key of database 3 must be read"),
        }
    }

    #[test]
    fn replies_convert_as_redis_converts_them() {
        let body =
            "return {1, 'a', {ok = 'fine'}, 3.99, -2.5, true, false, {'nested', {}}, nil, 'after nil'}";
        let (reply, _) = finished(run_with(body, &[], &[], &[], false));
        assert_eq!(
            reply,
            Reply::Array(vec![
                Reply::Integer(1),
                Reply::text("a"),
                Reply::Simple("fine".into()),
                Reply::Integer(3),
                Reply::Integer(-2),
                Reply::Integer(1),
                Reply::Nil,
                Reply::Array(vec![Reply::text("nested"), Reply::Array(vec![])]),
            ])
        );
        assert_eq!(
            finished(run_with("return redis.status_reply('DONE')", &[], &[], &[], false)).0,
            Reply::Simple("DONE".into())
        );
        assert_eq!(
            finished(run_with("return redis.error_reply('MY err')", &[], &[], &[], false)).0,
            Reply::Error("MY err".into())
        );
        assert_eq!(finished(run_with("return nil", &[], &[], &[], false)).0, Reply::Nil);
        // Replies given to the script: nil is false, a status a table, integers numbers.
        let body = "local missing = redis.call('GET', KEYS[1]) \
                    local status = redis.call('SET', KEYS[2], 'v') \
                    return {tostring(missing), status.ok, type(redis.call('INCR', KEYS[3])), redis.call('PING').ok}";
        let given = [("absent", None), ("n", Some("1"))];
        let (reply, _) = finished(run_with(body, &["absent", "s", "n"], &[], &given, false));
        assert_eq!(
            reply,
            Reply::Array(vec![
                Reply::text("false"),
                Reply::text("OK"),
                Reply::text("number"),
                Reply::text("PONG")
            ])
        );
        // Numbers as arguments are written as Redis writes them.
        let (reply, _) =
            finished(run_with("return redis.call('INCRBY', KEYS[1], 2 * 3)", &["n"], &[], &given, false));
        assert_eq!(reply, Reply::Integer(7));
    }

    #[test]
    fn errors_name_the_script_and_pcall_returns_them() {
        let given = [("s", Some("text"))];
        let body = "\nlocal n = redis.call('INCR', KEYS[1]) return n";
        let (reply, _) = finished(run_with(body, &["s"], &[], &given, false));
        let sha = sha1_hex(body.as_bytes());
        assert_eq!(
            error_text(&reply),
            format!("ERR value is not an integer or out of range script: {sha}, on @user_script:2.")
        );
        let body = "local reply = redis.pcall('INCR', KEYS[1]) return reply.err";
        assert_eq!(
            finished(run_with(body, &["s"], &[], &given, false)).0,
            Reply::text("ERR value is not an integer or out of range")
        );
        let (reply, _) = finished(run_with("return redis.call('NOSUCH')", &[], &[], &[], false));
        assert!(error_text(&reply).starts_with("ERR Unknown Redis command called from script"), "{reply:?}");
        let (reply, _) = finished(run_with("return redis.call('GET')", &[], &[], &[], false));
        assert!(error_text(&reply).contains("Wrong number of args"), "{reply:?}");
        let (reply, _) = finished(run_with("return redis.call('EVAL', 'return 1', 0)", &[], &[], &[], false));
        assert!(error_text(&reply).contains("not allowed from script"), "{reply:?}");
        let (reply, _) = finished(run_with("return redis.call('GET', {})", &[], &[], &[], false));
        assert!(error_text(&reply).contains("must be strings or integers"), "{reply:?}");
        // A failing script keeps the writes it made before it failed, as in Redis.
        let body = "redis.call('SET', 'w', 'v') return redis.call('INCR', KEYS[1])";
        let (reply, ops) = finished(run_with(body, &["s"], &[], &given, false));
        assert!(reply.is_error());
        assert_eq!(ops.len(), 1);
    }

    #[test]
    fn the_sandbox_has_no_new_globals_no_files_and_no_bytecode() {
        let (reply, ops) = finished(run_with("x = 1 redis.call('SET', 'w', 1)", &[], &[], &[], false));
        assert!(error_text(&reply).contains("Attempt to modify a readonly table"), "{reply:?}");
        assert!(ops.is_empty(), "it failed before writing");
        let (reply, _) = finished(run_with("return undefined_name", &[], &[], &[], false));
        assert!(error_text(&reply).contains("nonexistent global variable 'undefined_name'"), "{reply:?}");
        for name in ["dofile", "loadfile", "print", "os", "io", "require"] {
            let (reply, _) = finished(run_with(&format!("return type({name})"), &[], &[], &[], false));
            assert!(reply.is_error(), "{name} must not exist: {reply:?}");
        }
        let body = "local chunk, why = loadstring(string.dump(function() return 1 end)) return {tostring(chunk), why}";
        let (reply, _) = finished(run_with(body, &[], &[], &[], false));
        assert_eq!(
            reply,
            Reply::Array(vec![Reply::text("nil"), Reply::text("onekv: precompiled chunks cannot be loaded")])
        );
        assert_eq!(
            finished(run_with("return loadstring('return 7')()", &[], &[], &[], false)).0,
            Reply::Integer(7)
        );
        assert_eq!(
            finished(run_with("return redis.sha1hex('')", &[], &[], &[], false)).0,
            Reply::text("da39a3ee5e6b4b0d3255bfef95601890afd80709")
        );
        for body in ["redis = 1", "redis.call = nil", "_G = {}", "setmetatable(_G, {})", "string.len = nil"] {
            let (reply, _) = finished(run_with(body, &[], &[], &[], false));
            assert!(error_text(&reply).contains("Attempt to modify a readonly table"), "{body}: {reply:?}");
        }
        assert!(matches!(run_with("return (", &[], &[], &[], false), Ran::NotCompiled(_)));
        assert!(check_compiles(b"return (").is_err() && check_compiles(b"return 1").is_ok());
        assert!(check_compiles(b"\x1bLua").is_err(), "bytecode is refused");
    }

    #[test]
    fn the_shebang_line_names_the_engine_and_flags() {
        let (reply, _) = finished(run_with("#!lua\nreturn 1", &[], &[], &[], false));
        assert_eq!(reply, Reply::Integer(1));
        let (reply, _) = finished(run_with(
            "#!lua flags=no-writes\nreturn redis.call('SET', 'k', 1)",
            &[],
            &[],
            &[],
            false,
        ));
        assert!(error_text(&reply).contains("read-only scripts"), "{reply:?}");
        for (body, error) in [
            ("#!not-lua\nreturn 1", "Unexpected engine"),
            ("#!lua badger=data\nreturn 1", "Unknown lua shebang option"),
            ("#!lua flags=allow-oom,what?\nreturn 1", "Unexpected flag"),
        ] {
            match run_with(body, &[], &[], &[], false) {
                Ran::NotCompiled(reply) => assert!(error_text(&reply).contains(error), "{reply:?}"),
                _ => panic!("{body} ran"),
            }
        }
        // Line numbers count the shebang line.
        let (reply, _) = finished(run_with("#!lua\nerror('here')", &[], &[], &[], false));
        assert!(error_text(&reply).contains("user_script:2: here"), "{reply:?}");
    }

    #[test]
    fn cjson_and_bit_behave_as_redis_libraries() {
        let body = "local decoded = cjson.decode('{\"a\": [1, 2.5, null, \"x\"], \"b\": true}') \
                    return {decoded.a[1], tostring(decoded.a[2]), decoded.a[3] == cjson.null, decoded.a[4], \
                            tostring(decoded.b), cjson.encode({1, 2, 'three'}), cjson.encode({k = {}}), \
                            cjson.encode(0.1 + 0.2)}";
        let (reply, _) = finished(run_with(body, &[], &[], &[], false));
        assert_eq!(
            reply,
            Reply::Array(vec![
                Reply::Integer(1),
                Reply::text("2.5"),
                Reply::Integer(1),
                Reply::text("x"),
                Reply::text("true"),
                Reply::text("[1,2,\"three\"]"),
                Reply::text("{\"k\":{}}"),
                Reply::text("0.3"),
            ])
        );
        let (reply, _) =
            finished(run_with("return cjson.encode({f = function() end})", &[], &[], &[], false));
        assert!(error_text(&reply).contains("Cannot serialise function"), "{reply:?}");
        let (reply, _) = finished(run_with("return cjson.decode('{not json')", &[], &[], &[], false));
        assert!(reply.is_error());
        let body = "cjson.encode_max_depth(1) cjson.decode_max_depth(1) \
                    return {pcall(cjson.encode, {{}}), pcall(cjson.decode, '[[1]]'), cjson.encode({1})}";
        let (reply, _) = finished(run_with(body, &[], &[], &[], false));
        // Each pcall gives false (a nil element; only nil ends an array).
        assert_eq!(reply, Reply::Array(vec![Reply::Nil, Reply::Nil, Reply::text("[1]")]));
        let body = "return {bit.band(0xff, 0x0f), bit.bor(1, 2, 4), bit.bxor(1, 3), bit.bnot(0), \
                    bit.lshift(1, 31), bit.rshift(-1, 28), bit.arshift(-16, 2), bit.tohex(255), bit.tohex(255, -2)}";
        let (reply, _) = finished(run_with(body, &[], &[], &[], false));
        assert_eq!(
            reply,
            Reply::Array(vec![
                Reply::Integer(15),
                Reply::Integer(7),
                Reply::Integer(2),
                Reply::Integer(-1),
                Reply::Integer(i64::from(i32::MIN)),
                Reply::Integer(15),
                Reply::Integer(-4),
                Reply::text("000000ff"),
                Reply::text("FF"),
            ])
        );
    }

    #[test]
    fn read_only_scripts_cannot_write_and_limits_hold() {
        let (reply, ops) = finished(run_with("return redis.call('SET', 'k', 'v')", &[], &[], &[], true));
        assert!(error_text(&reply).contains("Write commands are not allowed from read-only scripts"));
        assert!(ops.is_empty());
        // Memory: a table far past the bound fails the script, not the node.
        let body = "local t = {} for i = 1, 1e9 do t[i] = string.rep('x', 1048576) .. i end return #t";
        let (reply, _) = finished(run_with(body, &[], &[], &[], false));
        assert!(error_text(&reply).contains("more than 64 MiB"), "{reply:?}");
        // SCRIPT KILL: the flag stops an endless loop.
        let kill = Arc::new(AtomicBool::new(false));
        let flag = kill.clone();
        let killer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            flag.store(true, Ordering::Relaxed);
        });
        let script = Script { body: b"while true do end", sha: "x", keys: &[], argv: &[] };
        assert!(matches!(run(&context(), &script, HashMap::new(), 0, false, &[&kill]), Ran::Killed));
        killer.join().unwrap();
    }

    #[test]
    fn a_stopped_script_cannot_go_on_by_catching_the_error() {
        // pcall around an endless loop, in an endless loop: the kill still ends it.
        for body in [
            &b"while true do pcall(function() while true do end end) end"[..],
            b"while true do xpcall(function() while true do end end, function(e) return e end) end",
        ] {
            let kill = Arc::new(AtomicBool::new(false));
            let flag = kill.clone();
            let killer = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                flag.store(true, Ordering::Relaxed);
            });
            let script = Script { body, sha: "x", keys: &[], argv: &[] };
            assert!(matches!(run(&context(), &script, HashMap::new(), 0, false, &[&kill]), Ran::Killed));
            killer.join().unwrap();
        }
        // No coroutines (the hook would not reach them).
        let (reply, _) = finished(run_with("return coroutine.wrap(function() end)", &[], &[], &[], false));
        assert!(error_text(&reply).contains("nonexistent global variable 'coroutine'"), "{reply:?}");
    }

    #[test]
    fn writes_past_one_transaction_fail_the_script_and_json_nesting_is_bounded() {
        // 2000 keys written, more than limits.max_batch_ops (1024): nothing is written.
        let body = "for i = 1, 2000 do redis.call('SET', 'k' .. i, 'v') end return 1";
        let (reply, ops) = finished(run_with(body, &[], &[], &[], false));
        assert!(error_text(&reply).contains("a script writes at most 1024 keys"), "{reply:?}");
        assert!(ops.is_empty());
        // 5 × 1 MiB values: more than limits.max_batch_bytes (4 MiB).
        let body = "local v = string.rep('x', 1048000) for i = 1, 5 do redis.call('SET', 'k' .. i, v) end";
        let (reply, ops) = finished(run_with(body, &[], &[], &[], false));
        assert!(error_text(&reply).contains("bytes"), "{reply:?}");
        assert!(ops.is_empty());
        // A deep table is an error, not a stack overflow, whatever depth the script asks for.
        let body = "local t = {} local c = t for i = 1, 20000 do local n = {} c[1] = n c = n end \
                    local ok = pcall(cjson.encode_max_depth, 1e9) return {tostring(ok), pcall(cjson.encode, t)}";
        let (reply, _) = finished(run_with(body, &[], &[], &[], false));
        let Reply::Array(items) = &reply else { panic!("{reply:?}") };
        assert_eq!(&items[..2], &[Reply::text("false"), Reply::Nil], "both refused");
        assert!(error_text(&items[2]).contains("excessive nesting"), "{reply:?}");
    }

    #[test]
    fn math_random_gives_every_run_the_same_numbers() {
        let body = "math.randomseed(42) local a = math.random(1, 1000000) return {a, math.random(10)}";
        let first = finished(run_with(body, &[], &[], &[], false)).0;
        assert_eq!(first, finished(run_with(body, &[], &[], &[], false)).0);
        let Reply::Array(numbers) = &first else { panic!("{first:?}") };
        assert!(matches!(numbers[1], Reply::Integer(n) if (1..=10).contains(&n)));
        let unseeded = "return tostring(math.random())";
        assert_eq!(
            finished(run_with(unseeded, &[], &[], &[], false)).0,
            finished(run_with(unseeded, &[], &[], &[], false)).0
        );
        let (reply, _) = finished(run_with("return math.random(5, 1)", &[], &[], &[], false));
        assert!(reply.is_error());
    }
}
