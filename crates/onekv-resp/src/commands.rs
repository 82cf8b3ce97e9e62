//! The command table: every command the front end knows, with Redis's arity convention, flags and
//! a line of documentation (served by `COMMAND`, `COMMAND INFO` and `COMMAND DOCS`), and
//! [`is_blind_write`], the one place that decides which writes externalize nothing.
//!
//! Owns: names, arities, key positions, docs, `SET`'s option syntax, and the blind-write decision.
//! Does not own how a command runs (`exec`).

/// One command of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandSpec {
    /// Lowercase name.
    pub name: &'static str,
    /// Redis's convention: `n > 0` exactly n arguments (the name included), `n < 0` at least -n.
    pub arity: i64,
    /// Redis's command flags (`readonly`, `write`, `fast`, ...), as `COMMAND INFO` reports them.
    pub flags: &'static [&'static str],
    /// Position of the first key argument (0: no keys).
    pub first_key: i64,
    /// Position of the last key argument (-1: the last argument).
    pub last_key: i64,
    /// Distance between key arguments.
    pub step: i64,
    /// Redis's command group (`string`, `generic`, `connection`, `server`).
    pub group: &'static str,
    /// The Redis version that introduced the command.
    pub since: &'static str,
    /// One line about what it does in onekv.
    pub summary: &'static str,
}

impl CommandSpec {
    /// The positions of the key arguments of a call of this command with `argc` arguments (the
    /// name included), by the table's key positions.
    pub fn key_positions(&self, argc: usize) -> impl Iterator<Item = usize> + use<> {
        let first = usize::try_from(self.first_key).unwrap_or(0);
        // Negative: counted from the end (-1 the last argument, -2 the one before: BLPOP's keys
        // end before its timeout).
        let last = match usize::try_from(self.last_key) {
            Ok(last) => last.min(argc.saturating_sub(1)),
            Err(_) => match argc.checked_sub(self.last_key.unsigned_abs() as usize) {
                Some(last) => last,
                None => return (0..0).step_by(1),
            },
        };
        let step = usize::try_from(self.step).unwrap_or(1).max(1);
        let range = if first == 0 || first > last { 0..0 } else { first..last + 1 };
        range.step_by(step)
    }

    /// The key arguments of a call of this command (`args[0]` is its name).
    pub fn key_arguments<'a>(&self, args: &'a [Vec<u8>]) -> impl Iterator<Item = &'a Vec<u8>> + use<'a> {
        self.key_positions(args.len()).map(move |position| &args[position])
    }

    /// Whether `argc` arguments (the name included) fit the command's arity.
    pub fn arity_ok(&self, argc: usize) -> bool {
        let argc = i64::try_from(argc).unwrap_or(i64::MAX);
        if self.arity >= 0 { argc == self.arity } else { argc >= -self.arity }
    }
}

const fn spec(
    name: &'static str,
    arity: i64,
    flags: &'static [&'static str],
    keys: (i64, i64, i64),
    group: &'static str,
    since: &'static str,
    summary: &'static str,
) -> CommandSpec {
    CommandSpec {
        name,
        arity,
        flags,
        first_key: keys.0,
        last_key: keys.1,
        step: keys.2,
        group,
        since,
        summary,
    }
}

const NO_KEYS: (i64, i64, i64) = (0, 0, 0);
const ONE_KEY: (i64, i64, i64) = (1, 1, 1);
const ALL_KEYS: (i64, i64, i64) = (1, -1, 1);

/// Every command the front end accepts, in alphabetical order.
#[rustfmt::skip]
pub static COMMANDS: &[CommandSpec] = &[
    spec("append", 3, &["write", "denyoom", "fast"], ONE_KEY, "string", "2.0.0",
        "Appends to a key's value (creating it); returns the new length. A compare-and-swap loop."),
    spec("bitcount", -2, &["readonly"], ONE_KEY, "bitmap", "2.6.0",
        "Counts the set bits of a value, or of a range of bytes or bits."),
    spec("bitpos", -3, &["readonly"], ONE_KEY, "bitmap", "2.8.7",
        "The first bit set (or clear) in a value, or in a range of bytes or bits."),
    spec("blmove", 6, &["write", "denyoom", "noscript", "blocking"], (1, 2, 1), "list", "6.2.0",
        "LMOVE, waiting up to a timeout for an element (polls the source; see docs/redis.md)."),
    spec("blpop", -3, &["write", "noscript", "blocking"], (1, -2, 1), "list", "2.0.0",
        "LPOP of the first non-empty list, waiting up to a timeout for one (polls; see docs/redis.md)."),
    spec("brpop", -3, &["write", "noscript", "blocking"], (1, -2, 1), "list", "2.0.0",
        "RPOP of the first non-empty list, waiting up to a timeout for one (polls; see docs/redis.md)."),
    spec("brpoplpush", 4, &["write", "denyoom", "noscript", "blocking"], (1, 2, 1), "list", "2.2.0",
        "RPOPLPUSH, waiting up to a timeout for an element (polls the source)."),
    spec("bzpopmax", -3, &["write", "noscript", "fast", "blocking"], (1, -2, 1), "sorted_set", "5.0.0",
        "ZPOPMAX of the first non-empty sorted set, waiting up to a timeout for one (polls)."),
    spec("bzpopmin", -3, &["write", "noscript", "fast", "blocking"], (1, -2, 1), "sorted_set", "5.0.0",
        "ZPOPMIN of the first non-empty sorted set, waiting up to a timeout for one (polls)."),
    spec("client", -2, &["stale"], NO_KEYS, "connection", "2.4.0",
        "CLIENT SETNAME, GETNAME, ID, INFO, SETINFO, LIST: this node's connections, their names and libraries."),
    spec("command", -1, &["loading", "stale"], NO_KEYS, "server", "2.8.13",
        "COMMAND, COMMAND COUNT, COMMAND INFO, COMMAND DOCS, COMMAND LIST: this table."),
    spec("config", -2, &["admin", "noscript", "loading", "stale"], NO_KEYS, "server", "2.0.0",
        "CONFIG GET: a few read-only parameters that describe onekv in Redis's terms."),
    spec("copy", -3, &["write", "denyoom"], (1, 2, 1), "generic", "6.2.0",
        "Copies a key's value to another key (same shard); one replicated transaction."),
    spec("dbsize", 1, &["readonly", "fast"], NO_KEYS, "server", "1.0.0",
        "The number of keys, counted by a linearizable scan of the whole key space."),
    spec("decr", 2, &["write", "denyoom", "fast"], ONE_KEY, "string", "1.0.0",
        "Decrements an integer value by one. A compare-and-swap loop."),
    spec("decrby", 3, &["write", "denyoom", "fast"], ONE_KEY, "string", "1.0.0",
        "Decrements an integer value. A compare-and-swap loop."),
    spec("del", -2, &["write"], ALL_KEYS, "generic", "1.0.0",
        "Deletes keys; returns how many existed. One compare-and-swap per key."),
    spec("discard", 1, &["noscript", "loading", "stale", "fast", "allow_busy"], NO_KEYS, "transactions", "2.0.0",
        "Discards the commands queued since MULTI (and the watches)."),
    spec("echo", 2, &["fast"], NO_KEYS, "connection", "1.0.0", "Returns its argument."),
    spec("eval", -3, &["noscript", "skip_monitor", "may_replicate", "no_mandatory_keys", "stale", "movablekeys"], NO_KEYS, "scripting", "2.6.0",
        "Runs a Lua script as one transaction (its keys read, run in memory, the writes committed with conditions on what it read; retried on conflict)."),
    spec("eval_ro", -3, &["noscript", "skip_monitor", "no_mandatory_keys", "stale", "readonly", "movablekeys"], NO_KEYS, "scripting", "7.0.0",
        "EVAL of a script that may only read."),
    spec("evalsha", -3, &["noscript", "skip_monitor", "may_replicate", "no_mandatory_keys", "stale", "movablekeys"], NO_KEYS, "scripting", "2.6.0",
        "EVAL of a script in this node's cache, by SHA1 (NOSCRIPT if it is not there)."),
    spec("evalsha_ro", -3, &["noscript", "skip_monitor", "no_mandatory_keys", "stale", "readonly", "movablekeys"], NO_KEYS, "scripting", "7.0.0",
        "EVALSHA of a script that may only read."),
    spec("exec", 1, &["noscript", "loading", "stale", "skip_slowlog"], NO_KEYS, "transactions", "1.2.0",
        "Runs the commands queued since MULTI atomically (one replicated transaction); null if a watched key changed."),
    spec("exists", -2, &["readonly", "fast"], ALL_KEYS, "generic", "1.0.1",
        "Counts the given keys that exist (linearizable reads)."),
    spec("expire", -3, &["write", "fast"], ONE_KEY, "generic", "1.0.0",
        "Sets a key's time to live in seconds (NX, XX, GT, LT). A compare-and-swap that writes the value again."),
    spec("expireat", -3, &["write", "fast"], ONE_KEY, "generic", "1.2.0",
        "Sets when a key expires, in Unix seconds (NX, XX, GT, LT). A compare-and-swap that writes the value again."),
    spec("expiretime", 2, &["readonly", "fast"], ONE_KEY, "generic", "7.0.0",
        "When a key expires, in Unix seconds; -1 if it has no expiry, -2 if it does not exist."),
    spec("flushall", -1, &["write"], NO_KEYS, "server", "1.0.0",
        "Deletes every key: a replicated range deletion, a page of keys at a time (not atomic: see docs/redis.md)."),
    spec("flushdb", -1, &["write"], NO_KEYS, "server", "1.0.0",
        "Deletes every key of the connection's database: a replicated range deletion, a page at a time (not atomic)."),
    spec("function", -2, &["noscript"], NO_KEYS, "scripting", "7.0.0",
        "FUNCTION FLUSH and LIST: onekv runs no functions, so there is none to flush or list."),
    spec("get", 2, &["readonly", "fast"], ONE_KEY, "string", "1.0.0",
        "A key's value (linearizable read from the leader)."),
    spec("getbit", 3, &["readonly", "fast"], ONE_KEY, "bitmap", "2.2.0",
        "The bit at an offset of a value."),
    spec("getdel", 2, &["write", "fast"], ONE_KEY, "string", "6.2.0",
        "Returns a key's value and deletes it. A compare-and-swap loop."),
    spec("getex", -2, &["write", "fast"], ONE_KEY, "string", "6.2.0",
        "GET, and sets or removes the key's expiry (EX, PX, EXAT, PXAT, PERSIST): then a compare-and-swap."),
    spec("getrange", 4, &["readonly"], ONE_KEY, "string", "2.4.0",
        "A range of a value's bytes (negative offsets count from the end)."),
    spec("getset", 3, &["write", "denyoom", "fast"], ONE_KEY, "string", "1.0.0",
        "Sets a key and returns its old value. A compare-and-swap loop."),
    spec("hdel", -3, &["write", "fast"], ONE_KEY, "hash", "2.0.0",
        "Deletes fields of a hash (the key with its last field); returns how many existed."),
    spec("hello", -1, &["noscript", "loading", "stale", "fast", "allow_busy"], NO_KEYS, "connection", "6.0.0",
        "The handshake: protocol 2 (RESP2) or 3 (RESP3). AUTH accepts the user default."),
    spec("hexists", 3, &["readonly", "fast"], ONE_KEY, "hash", "2.0.0",
        "1 if the hash has the field, else 0."),
    spec("hget", 3, &["readonly", "fast"], ONE_KEY, "hash", "2.0.0",
        "The value of a hash's field."),
    spec("hgetall", 2, &["readonly"], ONE_KEY, "hash", "2.0.0",
        "Every field and value of a hash, in byte order of the fields (one read)."),
    spec("hincrby", 4, &["write", "denyoom", "fast"], ONE_KEY, "hash", "2.0.0",
        "Increments an integer field of a hash. A compare-and-swap loop."),
    spec("hincrbyfloat", 4, &["write", "denyoom", "fast"], ONE_KEY, "hash", "2.6.0",
        "Increments a float field of a hash. A compare-and-swap loop."),
    spec("hkeys", 2, &["readonly"], ONE_KEY, "hash", "2.0.0",
        "The fields of a hash, in byte order."),
    spec("hlen", 2, &["readonly", "fast"], ONE_KEY, "hash", "2.0.0",
        "The number of fields of a hash."),
    spec("hmget", -3, &["readonly", "fast"], ONE_KEY, "hash", "2.0.0",
        "The values of several fields of a hash."),
    spec("hmset", -4, &["write", "denyoom", "fast"], ONE_KEY, "hash", "2.0.0",
        "HSET, answering OK."),
    spec("hrandfield", -2, &["readonly"], ONE_KEY, "hash", "6.2.0",
        "Random fields of a hash (a negative count allows repeats), optionally with their values."),
    spec("hscan", -3, &["readonly"], ONE_KEY, "hash", "2.8.0",
        "Every matching field of a hash in one page (cursor 0): a hash is one value, read whole."),
    spec("hset", -4, &["write", "denyoom", "fast"], ONE_KEY, "hash", "2.0.0",
        "Sets fields of a hash (a hash is one value: a compare-and-swap loop); returns how many are new."),
    spec("hsetnx", 4, &["write", "denyoom", "fast"], ONE_KEY, "hash", "2.0.0",
        "Sets a field of a hash only if it is absent; 1 if it was set."),
    spec("hstrlen", 3, &["readonly", "fast"], ONE_KEY, "hash", "3.2.0",
        "The length of a hash field's value (0 if absent)."),
    spec("hvals", 2, &["readonly"], ONE_KEY, "hash", "2.0.0",
        "The values of a hash, in byte order of their fields."),
    spec("incr", 2, &["write", "denyoom", "fast"], ONE_KEY, "string", "1.0.0",
        "Increments an integer value by one. A compare-and-swap loop."),
    spec("incrby", 3, &["write", "denyoom", "fast"], ONE_KEY, "string", "1.0.0",
        "Increments an integer value. A compare-and-swap loop."),
    spec("incrbyfloat", 3, &["write", "denyoom", "fast"], ONE_KEY, "string", "2.6.0",
        "Increments a float value (stored as the shortest exact decimal). A compare-and-swap loop."),
    spec("info", -1, &["loading", "stale"], NO_KEYS, "server", "1.0.0",
        "Server, clients, replication, stats and keyspace sections from onekv's state."),
    spec("keys", 2, &["readonly"], NO_KEYS, "generic", "1.0.0",
        "Every key matching a pattern: a full keys-only scan (use SCAN on large data sets)."),
    spec("lcs", -3, &["readonly"], (1, 2, 1), "string", "7.0.0",
        "The longest common subsequence of two values (LEN, IDX, MINMATCHLEN, WITHMATCHLEN)."),
    spec("lindex", 3, &["readonly"], ONE_KEY, "list", "1.0.0",
        "The element at an index of a list (negative: from the end)."),
    spec("linsert", 5, &["write", "denyoom"], ONE_KEY, "list", "2.2.0",
        "Inserts an element before or after a pivot; returns the new length (-1: no pivot)."),
    spec("llen", 2, &["readonly", "fast"], ONE_KEY, "list", "1.0.0",
        "The length of a list."),
    spec("lmove", 5, &["write", "denyoom"], (1, 2, 1), "list", "6.2.0",
        "Pops an element from one end of a list and pushes it to an end of another, atomically (one transaction; both keys in one shard)."),
    spec("lpop", -2, &["write", "fast"], ONE_KEY, "list", "1.0.0",
        "Removes and returns elements from the head of a list. A compare-and-swap loop."),
    spec("lpush", -3, &["write", "denyoom", "fast"], ONE_KEY, "list", "1.0.0",
        "Prepends elements to a list (a list is one value: a compare-and-swap loop); returns its length."),
    spec("lpushx", -3, &["write", "denyoom", "fast"], ONE_KEY, "list", "2.2.0",
        "LPUSH only if the list exists."),
    spec("lrange", 4, &["readonly"], ONE_KEY, "list", "1.0.0",
        "A range of a list's elements (negative indexes count from the end)."),
    spec("lrem", 4, &["write"], ONE_KEY, "list", "1.0.0",
        "Removes occurrences of an element (count > 0 from the head, < 0 from the tail, 0 all)."),
    spec("lset", 4, &["write", "denyoom"], ONE_KEY, "list", "1.0.0",
        "Sets the element at an index of a list."),
    spec("ltrim", 4, &["write"], ONE_KEY, "list", "1.0.0",
        "Keeps only a range of a list's elements."),
    spec("memory", -2, &["readonly"], (2, 2, 1), "server", "4.0.0",
        "MEMORY USAGE (the key's and value's bytes and a fixed overhead per key), HELP."),
    spec("mget", -2, &["readonly", "fast"], ALL_KEYS, "string", "1.0.0",
        "The values of several keys (one linearizable read each, not one snapshot)."),
    // The database argument is taken for the key as stored there (`databases::translate`), so the
    // table names it a key: the transaction reads both.
    spec("move", 3, &["write", "fast"], (1, 2, 1), "generic", "1.0.0",
        "Moves a key to another database if it is not there yet; one replicated transaction."),
    spec("mset", -3, &["write", "denyoom"], (1, -1, 2), "string", "1.0.1",
        "Sets several keys atomically (one batch, one Raft entry). A blind write."),
    spec("msetnx", -3, &["write", "denyoom"], (1, -1, 2), "string", "1.0.1",
        "Sets several keys (same shard) only if none exists; one replicated transaction."),
    spec("multi", 1, &["noscript", "loading", "stale", "fast", "allow_busy"], NO_KEYS, "transactions", "1.2.0",
        "Starts a transaction: later commands are queued until EXEC or DISCARD."),
    spec("object", -2, &["readonly"], (2, 2, 1), "generic", "2.2.3",
        "OBJECT ENCODING (int, embstr or raw, by Redis's rules), REFCOUNT, IDLETIME, HELP."),
    spec("persist", 2, &["write", "fast"], ONE_KEY, "generic", "2.2.0",
        "Removes a key's expiry; 1 if it had one. A compare-and-swap that writes the value again."),
    spec("pexpire", -3, &["write", "fast"], ONE_KEY, "generic", "2.6.0",
        "EXPIRE in milliseconds."),
    spec("pexpireat", -3, &["write", "fast"], ONE_KEY, "generic", "2.6.0",
        "EXPIREAT in Unix milliseconds."),
    spec("pexpiretime", 2, &["readonly", "fast"], ONE_KEY, "generic", "7.0.0",
        "When a key expires, in Unix milliseconds; -1 if it has no expiry, -2 if it does not exist."),
    spec("ping", -1, &["fast", "stale"], NO_KEYS, "connection", "1.0.0",
        "PONG, or its argument; answered by this node without touching the cluster."),
    spec("psetex", 4, &["write", "denyoom"], ONE_KEY, "string", "2.6.0",
        "Sets a key that expires in the given milliseconds. A blind write."),
    spec("pttl", 2, &["readonly", "fast"], ONE_KEY, "generic", "2.6.0",
        "A key's time to live in milliseconds; -1 if it has no expiry, -2 if it does not exist."),
    spec("quit", -1, &["fast", "stale", "loading", "allow_busy"], NO_KEYS, "connection", "1.0.0",
        "Closes the connection after replying OK."),
    spec("randomkey", 1, &["readonly"], NO_KEYS, "generic", "1.0.0",
        "A key found by a keys-only scan from a random position (nil when there is none)."),
    spec("rename", 3, &["write"], (1, 2, 1), "generic", "1.0.0",
        "Moves a key's value to another key (same shard); one replicated transaction."),
    spec("renamenx", 3, &["write", "fast"], (1, 2, 1), "generic", "1.0.0",
        "RENAME only if the new key does not exist; one replicated transaction."),
    spec("rpop", -2, &["write", "fast"], ONE_KEY, "list", "1.0.0",
        "Removes and returns elements from the tail of a list. A compare-and-swap loop."),
    spec("rpoplpush", 3, &["write", "denyoom"], (1, 2, 1), "list", "1.2.0",
        "LMOVE source destination RIGHT LEFT."),
    spec("rpush", -3, &["write", "denyoom", "fast"], ONE_KEY, "list", "1.0.0",
        "Appends elements to a list (a list is one value: a compare-and-swap loop); returns its length."),
    spec("rpushx", -3, &["write", "denyoom", "fast"], ONE_KEY, "list", "2.2.0",
        "RPUSH only if the list exists."),
    spec("sadd", -3, &["write", "denyoom", "fast"], ONE_KEY, "set", "1.0.0",
        "Adds members to a set (a set is one value: a compare-and-swap loop); returns how many are new."),
    spec("save", 1, &["admin", "noscript", "no_async_loading", "no_multi"], NO_KEYS, "server", "1.0.0",
        "OK at once: every write onekv acknowledged is already durable (fsynced); refused inside MULTI, as in Redis."),
    spec("scan", -2, &["readonly"], NO_KEYS, "generic", "2.8.0",
        "Keys in byte order, a page at a time; cursors live on the node that made them."),
    spec("scard", 2, &["readonly", "fast"], ONE_KEY, "set", "1.0.0",
        "The number of members of a set."),
    spec("script", -2, &["noscript"], NO_KEYS, "scripting", "2.6.0",
        "SCRIPT LOAD, EXISTS, FLUSH, KILL: this node's script cache and running scripts."),
    spec("sdiff", -2, &["readonly"], ALL_KEYS, "set", "1.0.0",
        "The members of the first set that are in none of the others (each set one linearizable read)."),
    spec("select", 2, &["loading", "stale", "fast"], NO_KEYS, "connection", "1.0.0",
        "Chooses database 0 to 15 for the connection (databases are ranges of the key space)."),
    spec("set", -3, &["write", "denyoom"], ONE_KEY, "string", "1.0.0",
        "Sets a key (EX, PX, EXAT, PXAT, KEEPTTL). Without NX/XX/GET a blind write, else a compare-and-swap loop."),
    spec("setbit", 4, &["write", "denyoom"], ONE_KEY, "bitmap", "2.2.0",
        "Sets or clears the bit at an offset, returning the old bit. A compare-and-swap loop."),
    spec("setex", 4, &["write", "denyoom"], ONE_KEY, "string", "2.0.0",
        "Sets a key that expires in the given seconds. A blind write."),
    spec("setnx", 3, &["write", "denyoom", "fast"], ONE_KEY, "string", "1.0.0",
        "Sets a key only if it is absent (one compare-and-swap); 1 if it was set."),
    spec("setrange", 4, &["write", "denyoom"], ONE_KEY, "string", "2.2.0",
        "Overwrites part of a value from an offset (zero-padded); returns the new length."),
    spec("shutdown", -1, &["admin", "noscript", "loading", "stale", "no_multi", "allow_busy"], NO_KEYS, "server", "1.0.0",
        "Refused: stop a node by stopping its process (SIGTERM shuts it down cleanly); refused inside MULTI, as in Redis."),
    spec("sinter", -2, &["readonly"], ALL_KEYS, "set", "1.0.0",
        "The members every given set has (each set one linearizable read)."),
    spec("sismember", 3, &["readonly", "fast"], ONE_KEY, "set", "1.0.0",
        "1 if the set has the member, else 0."),
    spec("smembers", 2, &["readonly"], ONE_KEY, "set", "1.0.0",
        "Every member of a set, in byte order (one read)."),
    spec("smismember", -3, &["readonly", "fast"], ONE_KEY, "set", "6.2.0",
        "For each given member, 1 if the set has it, else 0."),
    spec("sort", -2, &["write", "denyoom", "movablekeys"], ONE_KEY, "generic", "1.0.0",
        "Sorts a list, set or sorted set (numbers, or ALPHA), with LIMIT and STORE (a transaction of its own); BY/GET patterns are refused."),
    spec("sort_ro", -2, &["readonly", "movablekeys"], ONE_KEY, "generic", "7.0.0",
        "SORT without STORE."),
    spec("spop", -2, &["write", "fast"], ONE_KEY, "set", "1.0.0",
        "Removes and returns random members of a set. A compare-and-swap loop."),
    spec("srandmember", -2, &["readonly"], ONE_KEY, "set", "1.0.0",
        "Random members of a set (a negative count allows repeats)."),
    spec("srem", -3, &["write", "fast"], ONE_KEY, "set", "1.0.0",
        "Removes members from a set (the key with its last member); returns how many were there."),
    spec("sscan", -3, &["readonly"], ONE_KEY, "set", "2.8.0",
        "Every matching member of a set in one page (cursor 0): a set is one value, read whole."),
    spec("strlen", 2, &["readonly", "fast"], ONE_KEY, "string", "2.2.0",
        "The length of a key's value (0 if absent)."),
    spec("substr", 4, &["readonly"], ONE_KEY, "string", "1.0.0",
        "GETRANGE."),
    spec("sunion", -2, &["readonly"], ALL_KEYS, "set", "1.0.0",
        "The members any given set has (each set one linearizable read)."),
    spec("time", 1, &["loading", "stale", "fast"], NO_KEYS, "server", "2.6.0",
        "This node's clock: Unix seconds and the microseconds within the second."),
    spec("touch", -2, &["readonly", "fast"], ALL_KEYS, "generic", "3.2.1",
        "Counts the given keys that exist (onekv does not track access times)."),
    spec("ttl", 2, &["readonly", "fast"], ONE_KEY, "generic", "1.0.0",
        "A key's time to live in seconds; -1 if it has no expiry, -2 if it does not exist."),
    spec("type", 2, &["readonly", "fast"], ONE_KEY, "generic", "1.0.0",
        "string, hash, set, list, zset, or none if the key does not exist."),
    spec("unlink", -2, &["write", "fast"], ALL_KEYS, "generic", "4.0.0",
        "DEL: deletes keys, returns how many existed (onekv frees space the same way for both)."),
    spec("unwatch", 1, &["noscript", "loading", "stale", "fast", "allow_busy"], NO_KEYS, "transactions", "2.2.0",
        "Forgets every watched key."),
    spec("watch", -2, &["noscript", "loading", "stale", "fast", "allow_busy"], ALL_KEYS, "transactions", "2.2.0",
        "Watches keys: the next EXEC answers null if one's value changed since."),
    spec("zadd", -4, &["write", "denyoom", "fast"], ONE_KEY, "sorted_set", "1.2.0",
        "Adds members with scores (NX, XX, GT, LT, CH, INCR); a sorted set is one value: a compare-and-swap loop."),
    spec("zcard", 2, &["readonly", "fast"], ONE_KEY, "sorted_set", "1.2.0",
        "The number of members of a sorted set."),
    spec("zcount", 4, &["readonly", "fast"], ONE_KEY, "sorted_set", "2.0.0",
        "The number of members with a score in a range."),
    spec("zincrby", 4, &["write", "denyoom", "fast"], ONE_KEY, "sorted_set", "1.2.0",
        "Adds to a member's score; returns the new score."),
    spec("zlexcount", 4, &["readonly", "fast"], ONE_KEY, "sorted_set", "2.8.9",
        "The number of members in a lexicographic range."),
    spec("zmscore", -3, &["readonly", "fast"], ONE_KEY, "sorted_set", "6.2.0",
        "The scores of several members."),
    spec("zpopmax", -2, &["write", "fast"], ONE_KEY, "sorted_set", "5.0.0",
        "Removes and returns the members with the highest scores."),
    spec("zpopmin", -2, &["write", "fast"], ONE_KEY, "sorted_set", "5.0.0",
        "Removes and returns the members with the lowest scores."),
    spec("zrange", -4, &["readonly"], ONE_KEY, "sorted_set", "1.2.0",
        "Members by rank, score (BYSCORE) or member (BYLEX), optionally reversed (REV), limited (LIMIT), with scores."),
    spec("zrangebylex", -4, &["readonly"], ONE_KEY, "sorted_set", "2.8.9",
        "Members in a lexicographic range."),
    spec("zrangebyscore", -4, &["readonly"], ONE_KEY, "sorted_set", "1.0.5",
        "Members with a score in a range."),
    spec("zrank", 3, &["readonly", "fast"], ONE_KEY, "sorted_set", "2.0.0",
        "A member's rank, lowest score first."),
    spec("zrem", -3, &["write", "fast"], ONE_KEY, "sorted_set", "1.2.0",
        "Removes members (the key with its last member); returns how many were there."),
    spec("zremrangebylex", 4, &["write"], ONE_KEY, "sorted_set", "2.8.9",
        "Removes the members in a lexicographic range."),
    spec("zremrangebyrank", 4, &["write"], ONE_KEY, "sorted_set", "2.0.0",
        "Removes the members in a range of ranks."),
    spec("zremrangebyscore", 4, &["write"], ONE_KEY, "sorted_set", "1.2.0",
        "Removes the members with a score in a range."),
    spec("zrevrange", -4, &["readonly"], ONE_KEY, "sorted_set", "1.2.0",
        "Members by rank, highest score first."),
    spec("zrevrangebylex", -4, &["readonly"], ONE_KEY, "sorted_set", "2.8.9",
        "Members in a lexicographic range, in reverse order."),
    spec("zrevrangebyscore", -4, &["readonly"], ONE_KEY, "sorted_set", "2.2.0",
        "Members with a score in a range, highest first."),
    spec("zrevrank", 3, &["readonly", "fast"], ONE_KEY, "sorted_set", "2.0.0",
        "A member's rank, highest score first."),
    spec("zscan", -3, &["readonly"], ONE_KEY, "sorted_set", "2.8.0",
        "Every matching member and score in one page (cursor 0): a sorted set is one value, read whole."),
    spec("zscore", 3, &["readonly", "fast"], ONE_KEY, "sorted_set", "1.2.0",
        "A member's score."),
];

/// The arguments of command `name` after its name, in Redis's documentation syntax (the subset
/// `word`, `word...`, `(a b)...`, `[WORD]`, `[A|B]`, `[WORD word]`, `[word...]`); `COMMAND DOCS`
/// turns it into the argument specs redis-cli shows as hints. Empty for commands without
/// arguments and for the containers (CLIENT, COMMAND, CONFIG), whose subcommands are not documented.
pub fn syntax(name: &str) -> &'static str {
    match name {
        "append" | "setnx" => "key value",
        "get" | "getdel" | "incr" | "decr" | "strlen" => "key",
        "incrby" => "key increment",
        "decrby" => "key decrement",
        "del" | "unlink" | "exists" | "mget" | "watch" => "key...",
        "echo" => "message",
        "eval" | "eval_ro" => "script numkeys [key...] [arg...]",
        "evalsha" | "evalsha_ro" => "sha1 numkeys [key...] [arg...]",
        "script" => "LOAD script | EXISTS sha1... | FLUSH [ASYNC|SYNC] | KILL",
        "hello" => "[protover] [SETNAME clientname]",
        "info" => "[section...]",
        "mset" => "(key value)...",
        "ping" => "[message]",
        "scan" => "cursor [MATCH pattern] [COUNT count] [TYPE type]",
        "select" => "index",
        "shutdown" => "[NOSAVE|SAVE] [NOW] [FORCE] [ABORT]",
        "set" => {
            "key value [NX|XX] [GET] [EX seconds|PX milliseconds|EXAT unix-time-seconds|PXAT unix-time-milliseconds|KEEPTTL]"
        }
        "setex" => "key seconds value",
        "psetex" => "key milliseconds value",
        "expire" | "pexpire" | "expireat" | "pexpireat" => "key time [NX|XX|GT|LT]",
        "getset" => "key value",
        "getrange" | "substr" => "key start end",
        "setrange" => "key offset value",
        "incrbyfloat" => "key increment",
        "msetnx" => "(key value)...",
        "rename" | "renamenx" => "key newkey",
        "move" => "key db",
        "copy" => "source destination [DB destination-db] [REPLACE]",
        "keys" => "pattern",
        "type" | "ttl" | "pttl" | "expiretime" | "pexpiretime" | "persist" => "key",
        "touch" => "key...",
        "getbit" => "key offset",
        "setbit" => "key offset value",
        "bitcount" => "key [start] [end] [BYTE|BIT]",
        "bitpos" => "key bit [start] [end] [BYTE|BIT]",
        "lcs" => "key1 key2 [LEN] [IDX] [MINMATCHLEN min-match-len] [WITHMATCHLEN]",
        "getex" => {
            "key [EX seconds|PX milliseconds|EXAT unix-time-seconds|PXAT unix-time-milliseconds|PERSIST]"
        }
        "flushall" | "flushdb" => "[ASYNC|SYNC]",
        "hset" | "hmset" => "key (field value)...",
        "hsetnx" => "key field value",
        "hget" | "hexists" | "hstrlen" => "key field",
        "hmget" | "hdel" => "key field...",
        "hgetall" | "hlen" | "hkeys" | "hvals" => "key",
        "hincrby" | "hincrbyfloat" => "key field increment",
        "hrandfield" => "key [count] [WITHVALUES]",
        "hscan" => "key cursor [MATCH pattern] [COUNT count] [NOVALUES]",
        "sadd" | "srem" | "smismember" => "key member...",
        "sismember" => "key member",
        "smembers" | "scard" => "key",
        "spop" | "srandmember" => "key [count]",
        "sscan" => "key cursor [MATCH pattern] [COUNT count]",
        "sinter" | "sunion" | "sdiff" => "key...",
        "lpush" | "rpush" | "lpushx" | "rpushx" => "key element...",
        "lpop" | "rpop" => "key [count]",
        "blpop" | "brpop" | "bzpopmin" | "bzpopmax" => "key... timeout",
        "lmove" => "source destination LEFT|RIGHT LEFT|RIGHT",
        "blmove" => "source destination LEFT|RIGHT LEFT|RIGHT timeout",
        "rpoplpush" => "source destination",
        "sort" => {
            "key [BY pattern] [LIMIT offset count] [GET pattern...] [ASC|DESC] [ALPHA] [STORE destination]"
        }
        "sort_ro" => "key [BY pattern] [LIMIT offset count] [GET pattern...] [ASC|DESC] [ALPHA]",
        "brpoplpush" => "source destination timeout",
        "llen" => "key",
        "lrange" | "ltrim" => "key start stop",
        "lindex" => "key index",
        "lset" => "key index element",
        "lrem" => "key count element",
        "linsert" => "key BEFORE|AFTER pivot element",
        "zadd" => "key [NX|XX] [GT|LT] [CH] [INCR] (score member)...",
        "zincrby" => "key increment member",
        "zrem" | "zmscore" => "key member...",
        "zscore" | "zrank" | "zrevrank" => "key member",
        "zcard" => "key",
        "zcount" | "zrangebyscore" | "zremrangebyscore" => "key min max",
        "zlexcount" | "zrangebylex" | "zremrangebylex" => "key min max",
        "zrevrangebyscore" | "zrevrangebylex" => "key max min",
        "zrange" => "key start stop [BYSCORE|BYLEX] [REV] [LIMIT offset count] [WITHSCORES]",
        "zrevrange" | "zremrangebyrank" => "key start stop",
        "zpopmin" | "zpopmax" => "key [count]",
        "zscan" => "key cursor [MATCH pattern] [COUNT count]",
        _ => "",
    }
}

/// The table entry for `name` (any case).
pub fn lookup(name: &[u8]) -> Option<&'static CommandSpec> {
    COMMANDS.iter().find(|spec| spec.name.as_bytes().eq_ignore_ascii_case(name))
}

/// Where `spec` (an entry of [`COMMANDS`]) is in the table.
pub fn position(spec: &CommandSpec) -> usize {
    COMMANDS.iter().position(|entry| entry.name == spec.name).unwrap_or(usize::MAX)
}

/// `SET`'s options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetOptions {
    /// Only set if the key is absent.
    pub nx: bool,
    /// Only set if the key is present.
    pub xx: bool,
    /// Return the old value.
    pub get: bool,
    /// The expiry option, if one was given.
    pub expiry: Option<ExpiryOption>,
}

/// An expiry option of `SET` or `GETEX`, as given (checked: a positive number of its unit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpiryOption {
    /// `EX seconds`.
    Seconds(i64),
    /// `PX milliseconds`.
    Milliseconds(i64),
    /// `EXAT unix-seconds`.
    AtSeconds(i64),
    /// `PXAT unix-milliseconds`.
    AtMilliseconds(i64),
    /// `KEEPTTL` (SET) : keep the key's expiry.
    KeepTtl,
    /// `PERSIST` (GETEX): remove the key's expiry.
    Persist,
}

impl ExpiryOption {
    /// Parses `EX n`, `PX n`, `EXAT n` or `PXAT n` at the start of `options`, with Redis's checks
    /// (a positive integer; the error names `command`); `None` if `options` does not start with
    /// one of them.
    fn parse_timed(options: &[Vec<u8>], command: &str) -> Option<Result<ExpiryOption, String>> {
        let option = options.first()?.to_ascii_uppercase();
        let make: fn(i64) -> ExpiryOption = match option.as_slice() {
            b"EX" => ExpiryOption::Seconds,
            b"PX" => ExpiryOption::Milliseconds,
            b"EXAT" => ExpiryOption::AtSeconds,
            b"PXAT" => ExpiryOption::AtMilliseconds,
            _ => return None,
        };
        let Some(number) = options.get(1) else { return Some(Err("syntax error".into())) };
        let Some(number) = crate::exec::parse_integer(number) else {
            return Some(Err("value is not an integer or out of range".into()));
        };
        if number <= 0 {
            return Some(Err(format!("invalid expire time in '{command}' command")));
        }
        Some(Ok(make(number)))
    }
}

impl SetOptions {
    /// Whether the options make `SET` return or depend on the key's current state.
    pub fn reads_state(&self) -> bool {
        self.nx || self.xx || self.get
    }
}

/// Parses the options of `SET key value [options...]` (`options` is what follows the value), with
/// Redis's rules: at most one of NX and XX, at most one expiry option (EX, PX, EXAT, PXAT,
/// KEEPTTL), each timed one followed by a positive integer. The error is the message without its
/// `ERR ` code.
pub fn parse_set_options(options: &[Vec<u8>]) -> Result<SetOptions, String> {
    let mut parsed = SetOptions::default();
    let mut at = 0;
    while at < options.len() {
        let option = options[at].to_ascii_uppercase();
        let expiry = match option.as_slice() {
            b"NX" if !parsed.xx => {
                parsed.nx = true;
                None
            }
            b"XX" if !parsed.nx => {
                parsed.xx = true;
                None
            }
            b"GET" => {
                parsed.get = true;
                None
            }
            b"KEEPTTL" => Some(ExpiryOption::KeepTtl),
            _ => match ExpiryOption::parse_timed(&options[at..], "set") {
                Some(Err(error)) if error == "syntax error" || parsed.expiry.is_some() => {
                    return Err("syntax error".into());
                }
                Some(timed) => {
                    at += 1;
                    Some(timed?)
                }
                None => return Err("syntax error".into()),
            },
        };
        if let Some(expiry) = expiry {
            if parsed.expiry.is_some() {
                return Err("syntax error".into());
            }
            parsed.expiry = Some(expiry);
        }
        at += 1;
    }
    Ok(parsed)
}

/// Parses GETEX's options (what follows the key): at most one of EX, PX, EXAT, PXAT and PERSIST;
/// none leaves the expiry as it is.
pub fn parse_getex_options(options: &[Vec<u8>]) -> Result<Option<ExpiryOption>, String> {
    match options {
        [] => Ok(None),
        [persist] if persist.eq_ignore_ascii_case(b"PERSIST") => Ok(Some(ExpiryOption::Persist)),
        [_, _] => match ExpiryOption::parse_timed(options, "getex") {
            Some(timed) => timed.map(Some),
            None => Err("syntax error".into()),
        },
        _ => Err("syntax error".into()),
    }
}

/// Whether the command in `args` is a blind write: it changes state and its reply says nothing
/// about the state it found (`SET key value` without NX/XX/GET, `MSET`), so it needs no read and
/// no compare-and-swap, and a fast path may commit it without ordering it against reads of the
/// previous value. Everything else is a read, a read-modify-write, or no write at all. This is
/// the one place that decides it.
pub fn is_blind_write(args: &[Vec<u8>]) -> bool {
    let Some(name) = args.first() else { return false };
    if name.eq_ignore_ascii_case(b"mset") {
        return args.len() >= 3 && args.len() % 2 == 1;
    }
    if name.eq_ignore_ascii_case(b"set") && args.len() >= 3 {
        return parse_set_options(&args[3..]).is_ok_and(|options| !options.reads_state());
    }
    if (name.eq_ignore_ascii_case(b"setex") || name.eq_ignore_ascii_case(b"psetex")) && args.len() == 4 {
        return crate::exec::parse_integer(&args[2]).is_some_and(|ttl| ttl > 0);
    }
    false
}

/// Whether the command in `args` may run long: it may wait (BLPOP and the other blocking pops,
/// flagged `blocking` in the table) or is a script. The server then watches its connection while it
/// runs, and tells it to stop if the client leaves.
pub fn may_run_long(args: &[Vec<u8>]) -> bool {
    args.first()
        .and_then(|name| lookup(name))
        .is_some_and(|spec| spec.flags.contains(&"blocking") || is_script(spec.name))
}

/// Whether the command in `args` runs while a script is past `busy-reply-threshold` (every other
/// answers `-BUSY`): those flagged `allow_busy` in the table (MULTI, DISCARD, WATCH, UNWATCH, HELLO,
/// QUIT, SHUTDOWN) and, as in Redis 7, the subcommands SCRIPT KILL, FUNCTION KILL and FUNCTION STATS.
pub fn allowed_while_busy(spec: &CommandSpec, args: &[Vec<u8>]) -> bool {
    let subcommand = || args.get(1).map(|subcommand| subcommand.to_ascii_uppercase());
    spec.flags.contains(&"allow_busy")
        || (spec.name == "script" && subcommand().as_deref() == Some(b"KILL".as_slice()))
        || (spec.name == "function" && matches!(subcommand().as_deref(), Some(b"KILL" | b"STATS")))
}

/// Whether command `name` runs a Lua script (EVAL and its forms).
pub fn is_script(name: &str) -> bool {
    matches!(name, "eval" | "evalsha" | "eval_ro" | "evalsha_ro")
}

/// Whether the command in `args` only reads the store and its connection's state is untouched
/// (`GET`, `EXISTS`, `STRLEN`), so consecutive ones in a pipeline may run concurrently: each still
/// starts after every earlier command of the connection was answered, and none changes what another
/// sees. (`MGET` is left out: its reply can be large, and a run's replies are held together.)
pub fn is_pipelinable_read(args: &[Vec<u8>]) -> bool {
    let Some(spec) = args.first().and_then(|name| lookup(name)) else { return false };
    matches!(spec.name, "get" | "exists" | "strlen") && spec.arity_ok(args.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(items: &[&str]) -> Vec<Vec<u8>> {
        items.iter().map(|item| item.as_bytes().to_vec()).collect()
    }

    #[test]
    fn the_table_is_sorted_unique_and_lowercase() {
        for pair in COMMANDS.windows(2) {
            assert!(pair[0].name < pair[1].name, "{} before {}", pair[0].name, pair[1].name);
        }
        for spec in COMMANDS {
            assert_eq!(spec.name, spec.name.to_ascii_lowercase());
            assert!(spec.arity != 0, "{}", spec.name);
            assert!(!spec.summary.is_empty());
        }
        for required in [
            "ping", "echo", "quit", "select", "hello", "client", "command", "config", "info", "dbsize",
            "get", "mget", "exists", "set", "mset", "setnx", "del", "unlink", "incr", "incrby", "decr",
            "decrby", "append", "strlen", "getdel", "scan",
        ] {
            assert!(lookup(required.as_bytes()).is_some(), "{required}");
        }
    }

    #[test]
    fn lookup_ignores_case_and_arity_follows_redis() {
        let get = lookup(b"GeT").unwrap();
        assert_eq!(get.name, "get");
        assert!(get.arity_ok(2));
        assert!(!get.arity_ok(1) && !get.arity_ok(3));
        let del = lookup(b"DEL").unwrap();
        assert!(!del.arity_ok(1) && del.arity_ok(2) && del.arity_ok(9));
        assert!(lookup(b"xadd").is_none());
    }

    #[test]
    fn only_plain_reads_run_concurrently_in_a_pipeline() {
        for read in [&["GET", "k"][..], &["exists", "a", "b"], &["STRLEN", "k"]] {
            assert!(is_pipelinable_read(&args(read)), "{read:?}");
        }
        for other in [
            &["GET"][..],
            &["MGET", "a"],
            &["SET", "k", "v"],
            &["GETDEL", "k"],
            &["SCAN", "0"],
            &["PING"],
            &["NOPE"],
            &[],
        ] {
            assert!(!is_pipelinable_read(&args(other)), "{other:?}");
        }
    }

    #[test]
    fn set_options() {
        assert_eq!(parse_set_options(&[]).unwrap(), SetOptions::default());
        let options = parse_set_options(&args(&["nx", "GET", "keepttl"])).unwrap();
        assert_eq!(
            options,
            SetOptions { nx: true, xx: false, get: true, expiry: Some(ExpiryOption::KeepTtl) }
        );
        assert_eq!(parse_set_options(&args(&["NX", "XX"])).unwrap_err(), "syntax error");
        assert_eq!(parse_set_options(&args(&["FOO"])).unwrap_err(), "syntax error");
        let timed = [
            (["ex", "10"], ExpiryOption::Seconds(10)),
            (["PX", "5"], ExpiryOption::Milliseconds(5)),
            (["exat", "1700000000"], ExpiryOption::AtSeconds(1_700_000_000)),
            (["PXAT", "1700000000000"], ExpiryOption::AtMilliseconds(1_700_000_000_000)),
        ];
        for (given, expected) in timed {
            assert_eq!(parse_set_options(&args(&given)).unwrap().expiry, Some(expected), "{given:?}");
        }
        let xx_ex = parse_set_options(&args(&["XX", "EX", "3", "GET"])).unwrap();
        assert_eq!(
            xx_ex,
            SetOptions { nx: false, xx: true, get: true, expiry: Some(ExpiryOption::Seconds(3)) }
        );
        for (bad, error) in [
            (&["EX"][..], "syntax error"),
            (&["EX", "10", "PX", "10"], "syntax error"),
            (&["EX", "10", "KEEPTTL"], "syntax error"),
            (&["KEEPTTL", "EX", "10"], "syntax error"),
            (&["EX", "0"], "invalid expire time in 'set' command"),
            (&["PX", "-5"], "invalid expire time in 'set' command"),
            (&["EX", "ten"], "value is not an integer or out of range"),
            (&["EX", "010"], "value is not an integer or out of range"),
        ] {
            assert_eq!(parse_set_options(&args(bad)).unwrap_err(), error, "{bad:?}");
        }
        assert_eq!(parse_getex_options(&[]).unwrap(), None);
        assert_eq!(parse_getex_options(&args(&["persist"])).unwrap(), Some(ExpiryOption::Persist));
        assert_eq!(parse_getex_options(&args(&["PX", "7"])).unwrap(), Some(ExpiryOption::Milliseconds(7)));
        assert_eq!(parse_getex_options(&args(&["EX", "1", "PERSIST"])).unwrap_err(), "syntax error");
        assert_eq!(parse_getex_options(&args(&["KEEPTTL"])).unwrap_err(), "syntax error");
        assert_eq!(
            parse_getex_options(&args(&["EX", "0"])).unwrap_err(),
            "invalid expire time in 'getex' command"
        );
    }

    #[test]
    fn only_set_without_state_options_and_mset_are_blind() {
        assert!(is_blind_write(&args(&["SET", "k", "v"])));
        assert!(is_blind_write(&args(&["set", "k", "v", "KEEPTTL"])));
        assert!(is_blind_write(&args(&["SET", "k", "v", "EX", "1"])));
        assert!(is_blind_write(&args(&["SETEX", "k", "10", "v"])));
        assert!(is_blind_write(&args(&["psetex", "k", "10", "v"])));
        assert!(is_blind_write(&args(&["MSET", "a", "1", "b", "2"])));
        for not_blind in [
            &["SET", "k", "v", "NX"][..],
            &["SET", "k", "v", "XX"],
            &["SET", "k", "v", "GET"],
            &["SET", "k", "v", "EX", "0"],
            &["SETEX", "k", "0", "v"],
            &["SETEX", "k", "v"],
            &["EXPIRE", "k", "10"],
            &["SET", "k"],
            &["MSET", "a", "1", "b"],
            &["SETNX", "k", "v"],
            &["DEL", "k"],
            &["INCR", "k"],
            &["APPEND", "k", "v"],
            &["GET", "k"],
            &[],
        ] {
            assert!(!is_blind_write(&args(not_blind)), "{not_blind:?}");
        }
    }
}
