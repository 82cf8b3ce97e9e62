//! The string commands and plain reads: GET, MGET, EXISTS, STRLEN, SET (every option), SETEX,
//! PSETEX, MSET, SETNX, GETSET, INCR/DECR and their BY forms, INCRBYFLOAT, APPEND, SETRANGE and
//! SETBIT. Blind writes are puts and batches; the others decide through the combiner (`combine`).
//! The decisions of the commands that change only a key's expiry are `expiry`'s.

use super::bytes::{self, FloatError};
use super::combine::{Change, Decide};
use super::expiry;
use super::reads::bit_offset;
use super::types::{reserved_string, string_value};
use super::{MAX_REPLY_BYTES, Outcome, RespContext, not_an_integer, parse_integer};
use super::{hashes, lists, sets, zsets};
use crate::commands::parse_set_options;
use crate::protocol::Reply;
use onekv_client::{ClientError, Expiry};

/// Whether `name` is a read-modify-write of one key (`args[1]`) that [`RespContext::decision`]
/// decides: run through the combiner alone, against the snapshot inside a transaction. The hash,
/// set, list and sorted-set writes are among them (`hashes`, `sets`, `lists`, `zsets`).
pub(super) fn is_single_key_write(name: &str) -> bool {
    hashes::is_hash_write(name)
        || sets::is_set_write(name)
        || lists::is_list_write(name)
        || zsets::is_zset_write(name)
        || matches!(
            name,
            "set"
                | "setnx"
                | "getdel"
                | "getset"
                | "incr"
                | "decr"
                | "incrby"
                | "decrby"
                | "incrbyfloat"
                | "append"
                | "setrange"
                | "setbit"
                | "setex"
                | "psetex"
                | "expire"
                | "pexpire"
                | "expireat"
                | "pexpireat"
                | "persist"
                | "getex"
        )
}

/// Reads one MGET or EXISTS keeps in flight at once.
const GET_MANY_CONCURRENCY: usize = 32;

impl RespContext {
    /// SET without NX/XX/GET, SETEX, PSETEX and MSET: no read, no compare-and-swap.
    pub(super) async fn blind_write(&self, args: &[Vec<u8>]) -> Outcome {
        let client = &self.shared.client;
        let name = args[0].to_ascii_lowercase();
        if name == b"set" || name == b"setex" || name == b"psetex" {
            let (value, expiry) = if name == b"set" {
                let options = parse_set_options(&args[3..]).map_err(Reply::err)?;
                let expiry =
                    options.expiry.map_or(Ok(Expiry::Never), |option| expiry::expiry_of(option, "set"))?;
                (&args[2], expiry)
            } else {
                let command = if name == b"setex" { "setex" } else { "psetex" };
                (&args[3], expiry::setex_expiry(command, args)?)
            };
            self.check_string(value)?;
            // The fast path takes no expiry relative to now (each replica would make it absolute
            // at its own time) and cannot keep one.
            match expiry {
                Expiry::Never if self.shared.settings.fast_path => {
                    client.put_fast(&args[1], value).await.map(drop)?
                }
                expiry => client.put_with_expiry(&args[1], value, expiry).await.map(drop)?,
            }
            self.forget(&args[1]);
        } else {
            let pairs: Vec<(Vec<u8>, Option<Vec<u8>>)> =
                args[1..].chunks_exact(2).map(|pair| (pair[0].clone(), Some(pair[1].clone()))).collect();
            for pair in args[1..].chunks_exact(2) {
                self.check_string(&pair[1])?;
            }
            for (key, _) in &pairs {
                self.forget(key);
            }
            // Atomic within each shard; the shards' parts apply independently (docs/redis.md).
            match self.shared.settings.fast_path {
                true => client.batch_per_shard_fast(pairs).await?,
                false => client.batch_per_shard(pairs).await?,
            }
        }
        Ok(Reply::ok())
    }

    /// SET with NX, XX or GET (without, it is a blind write).
    pub(super) async fn set(&self, args: &[Vec<u8>]) -> Outcome {
        let options = parse_set_options(&args[3..]).map_err(Reply::err)?;
        // Checked before anything is sent: this SET may be combined with other commands on the
        // key into one compare-and-swap, and its error must be its own.
        self.check_string(&args[2])?;
        if options.nx && !options.get {
            // `SET lock token NX PX 30000`, the common lock: one swap from absent, with its expiry.
            let expiry =
                options.expiry.map_or(Ok(Expiry::Never), |option| expiry::expiry_of(option, "set"))?;
            let swapped = self.insert_if_absent(&args[1], &args[2], expiry).await?;
            return Ok(if swapped { Reply::ok() } else { Reply::Nil });
        }
        let decide = self.decision("set", args)?;
        self.read_modify_write(&args[1], false, decide).await
    }

    /// One compare-and-swap from absent to `value`; whether it was set.
    pub(super) async fn insert_if_absent(&self, key: &[u8], value: &[u8], expiry: Expiry) -> Outcome<bool> {
        let outcome = match self.shared.client.cas_with_expiry(key, None, Some(value), expiry).await {
            // An attempt found the key present and set nothing.
            Err(ClientError::NotApplied(_)) => return Ok(false),
            outcome => outcome?,
        };
        if outcome.swapped {
            self.remember(key, Some(value));
        }
        Ok(outcome.swapped)
    }

    /// DEL and UNLINK: each key is its own compare-and-swap.
    pub(super) async fn delete(&self, keys: &[Vec<u8>]) -> Outcome {
        let mut deleted = 0;
        for key in keys {
            let reply = self.read_modify_write(key, false, delete_decision()).await?;
            deleted += i64::from(reply == Reply::Integer(1));
        }
        Ok(Reply::Integer(deleted))
    }

    /// Refuses a value over the node's limit, as Redis words it.
    pub(super) fn check_value(&self, value: &[u8]) -> Outcome<()> {
        self.check_length(value.len())
    }

    /// Refuses a string value the front end may not write: over the node's limit, or one that
    /// would read as a collection (`types::reserved_string`).
    pub(super) fn check_string(&self, value: &[u8]) -> Outcome<()> {
        self.check_value(value)?;
        reserved_string(value).map_or(Ok(()), Err)
    }

    /// Refuses a value length over the node's limit, as Redis words it.
    pub(super) fn check_length(&self, len: usize) -> Outcome<()> {
        let max = self.shared.settings.max_value_bytes;
        if len > max {
            return Err(value_too_long(max));
        }
        Ok(())
    }

    /// What a single-key read-modify-write string command (`args[1]` is the key) decides from
    /// the value it finds: the commands of [`is_single_key_write`]. Its arguments are checked here, before anything is read. The combiner runs it
    /// against the value it reads; a transaction runs it against its snapshot.
    pub(super) fn decision(&self, name: &str, args: &[Vec<u8>]) -> Outcome<Decide> {
        let max_value_bytes = self.shared.settings.max_value_bytes;
        if hashes::is_hash_write(name) {
            return hashes::decision(name, args, max_value_bytes);
        }
        if sets::is_set_write(name) {
            return sets::decision(name, args, max_value_bytes);
        }
        if lists::is_list_write(name) {
            return lists::decision(name, args, max_value_bytes);
        }
        if zsets::is_zset_write(name) {
            return zsets::decision(name, args, max_value_bytes);
        }
        let mut decide = self.string_decision(name, args)?;
        // Which types the command accepts: commands that replace the value whatever it was (SET
        // without GET, SETNX, SETEX) and those that change only the expiry take any; the others
        // read a string, and a collection is the wrong type, as in Redis.
        let any_type = match name {
            "setnx" | "setex" | "psetex" | "expire" | "pexpire" | "expireat" | "pexpireat" | "persist" => {
                true
            }
            "set" => !parse_set_options(&args[3..]).map_err(Reply::err)?.get,
            _ => false,
        };
        // Commands that change only the expiry write the value found back, a hash included.
        let writes_a_string = !matches!(name, "expire" | "pexpire" | "expireat" | "pexpireat" | "persist");
        Ok(Box::new(move |current, expires_at| {
            if !any_type {
                string_value(current)?;
            }
            let change = decide(current, expires_at)?;
            if writes_a_string
                && let Change::Write(Some(value), _, _) = &change
                && let Some(error) = reserved_string(value)
            {
                return Err(error);
            }
            Ok(change)
        }))
    }

    /// [`RespContext::decision`] of a string command, before its type checks.
    fn string_decision(&self, name: &str, args: &[Vec<u8>]) -> Outcome<Decide> {
        let increment = |by: i64| -> Decide {
            Box::new(move |current, _| {
                let old = match current {
                    None => 0,
                    Some(value) => parse_integer(value).ok_or_else(not_an_integer)?,
                };
                let new =
                    old.checked_add(by).ok_or_else(|| Reply::err("increment or decrement would overflow"))?;
                Ok(Change::Write(Some(new.to_string().into_bytes()), Expiry::Keep, Reply::Integer(new)))
            })
        };
        Ok(match name {
            "incr" => increment(1),
            "decr" => increment(-1),
            "incrby" => increment(parse_integer(&args[2]).ok_or_else(not_an_integer)?),
            "decrby" => {
                let by = parse_integer(&args[2]).ok_or_else(not_an_integer)?;
                increment(by.checked_neg().ok_or_else(|| Reply::err("decrement would overflow"))?)
            }
            "append" => {
                let max = self.shared.settings.max_value_bytes;
                let suffix = args[2].clone();
                Box::new(move |current, _| {
                    let mut value = current.unwrap_or_default().to_vec();
                    if value.len() + suffix.len() > max {
                        return Err(value_too_long(max));
                    }
                    value.extend_from_slice(&suffix);
                    let len = value.len() as i64;
                    Ok(Change::Write(Some(value), Expiry::Keep, Reply::Integer(len)))
                })
            }
            "getdel" => Box::new(|current, _| {
                Ok(match current {
                    Some(value) => Change::Write(None, Expiry::Never, Reply::Bulk(value.to_vec())),
                    None => Change::Keep(Reply::Nil),
                })
            }),
            "setnx" => {
                self.check_string(&args[2])?;
                let value = args[2].clone();
                Box::new(move |current, _| {
                    Ok(match current {
                        None => Change::Write(Some(value.clone()), Expiry::Never, Reply::Integer(1)),
                        Some(_) => Change::Keep(Reply::Integer(0)),
                    })
                })
            }
            "set" => {
                let options = parse_set_options(&args[3..]).map_err(Reply::err)?;
                self.check_string(&args[2])?;
                let expiry =
                    options.expiry.map_or(Ok(Expiry::Never), |option| expiry::expiry_of(option, "set"))?;
                let value = args[2].clone();
                Box::new(move |current, _| {
                    let applies = if options.nx {
                        current.is_none()
                    } else if options.xx {
                        current.is_some()
                    } else {
                        true
                    };
                    let old = Reply::optional(current.map(<[u8]>::to_vec));
                    Ok(match (applies, options.get) {
                        (true, true) => Change::Write(Some(value.clone()), expiry, old),
                        (true, false) => Change::Write(Some(value.clone()), expiry, Reply::ok()),
                        (false, true) => Change::Keep(old),
                        (false, false) => Change::Keep(Reply::Nil),
                    })
                })
            }
            "getset" => {
                self.check_string(&args[2])?;
                let value = args[2].clone();
                Box::new(move |current, _| {
                    Ok(Change::Write(
                        Some(value.clone()),
                        Expiry::Never,
                        Reply::optional(current.map(<[u8]>::to_vec)),
                    ))
                })
            }
            "setrange" => {
                let offset = parse_integer(&args[2]).ok_or_else(not_an_integer)?;
                let offset = usize::try_from(offset).map_err(|_| Reply::err("offset is out of range"))?;
                let patch = args[3].clone();
                if !patch.is_empty() {
                    self.check_length(offset.saturating_add(patch.len()))?;
                }
                Box::new(move |current, _| {
                    Ok(match bytes::set_range(current, offset, &patch) {
                        Some(value) => {
                            let len = value.len() as i64;
                            Change::Write(Some(value), Expiry::Keep, Reply::Integer(len))
                        }
                        None => Change::Keep(Reply::Integer(current.map_or(0, <[u8]>::len) as i64)),
                    })
                })
            }
            "setbit" => {
                let offset = bit_offset(&args[2], self.shared.settings.max_value_bytes)?;
                let bit = match args[3].as_slice() {
                    b"0" => false,
                    b"1" => true,
                    _ => return Err(Reply::err("bit is not an integer or out of range")),
                };
                Box::new(move |current, _| {
                    let (value, old) = bytes::set_bit(current, offset, bit);
                    Ok(Change::Write(Some(value), Expiry::Keep, Reply::Integer(i64::from(old))))
                })
            }
            "incrbyfloat" => {
                let not_a_float = || Reply::err("value is not a valid float");
                bytes::parse_float(&args[2]).ok_or_else(not_a_float)?;
                let increment = args[2].clone();
                Box::new(move |current, _| match bytes::add_floats(current, &increment) {
                    Ok(sum) => Ok(Change::Write(Some(sum.clone()), Expiry::Keep, Reply::Bulk(sum))),
                    Err(FloatError::NotAFloat) => Err(not_a_float()),
                    Err(FloatError::NotFinite) => Err(Reply::err("increment would produce NaN or Infinity")),
                })
            }
            // Inside a transaction (alone they are blind writes).
            "setex" | "psetex" => {
                let expiry = expiry::setex_expiry(name, args)?;
                self.check_string(&args[3])?;
                let value = args[3].clone();
                Box::new(move |_, _| Ok(Change::Write(Some(value.clone()), expiry, Reply::ok())))
            }
            "expire" | "pexpire" | "expireat" | "pexpireat" => expiry::expire_decision(name, args)?,
            "persist" => expiry::persist_decision(),
            "getex" => expiry::getex_decision(args)?,
            other => return Err(Reply::err(format!("'{other}' is not a read-modify-write"))),
        })
    }

    /// Whether onekv could hold `key` at all: keys are non-empty and at most `max_key_bytes` long.
    /// Redis allows any key, so a read of one onekv cannot hold answers "absent" rather than
    /// failing; a write of one is refused by the node.
    pub(super) fn storable(&self, key: &[u8]) -> bool {
        !key.is_empty() && key.len() <= self.shared.settings.max_key_bytes
    }

    /// A linearizable read of `key`.
    pub(super) async fn get(&self, key: &[u8]) -> Outcome<Option<Vec<u8>>> {
        if !self.storable(key) {
            return Ok(None);
        }
        Ok(self.shared.client.get(key).await?)
    }

    /// Linearizable reads of every key, concurrently, in the keys' order.
    /// The values of `keys`, read [`GET_MANY_CONCURRENCY`] at a time, so one command never holds
    /// more than that many values beyond those it returns. With `keep_values` false (EXISTS) each
    /// value is dropped as soon as it arrives and only its presence is kept.
    pub(super) async fn get_many(
        &self,
        keys: &[Vec<u8>],
        keep_values: bool,
    ) -> Outcome<Vec<Option<Vec<u8>>>> {
        let found = self.get_many_with_expiry(keys, keep_values).await?;
        Ok(found.into_iter().map(|found| found.map(|(value, _)| value)).collect())
    }

    /// [`RespContext::get_many`] with each key's expiry time (ms since the Unix epoch).
    pub(super) async fn get_many_with_expiry(
        &self,
        keys: &[Vec<u8>],
        keep_values: bool,
    ) -> Outcome<Vec<Option<(Vec<u8>, Option<u64>)>>> {
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
                    let found = client.get_with_expiry(&key).await;
                    let found = match keep_values {
                        true => found,
                        false => found.map(|found| found.map(|(_, expiry)| (Vec::new(), expiry))),
                    };
                    (position, found)
                });
            }
            let Some(joined) = tasks.join_next().await else { break };
            let (position, value) =
                joined.map_err(|error| Reply::err(format!("onekv: read task failed: {error}")))?;
            let value = value?;
            total += value.as_ref().map_or(0, |(value, _)| value.len());
            if total > MAX_REPLY_BYTES {
                return Err(Reply::err(format!(
                    "reply would exceed {MAX_REPLY_BYTES} bytes; ask for fewer keys"
                )));
            }
            values[position] = value;
        }
        Ok(values)
    }
}

/// The error for a value longer than the node's `max` bytes, as Redis words it.
fn value_too_long(max: usize) -> Reply {
    Reply::err(format!("string exceeds maximum allowed size (onekv's limits.max_value_bytes = {max})"))
}

/// DEL's decision for one key: delete it if present; 1 if it was.
pub(super) fn delete_decision() -> Decide {
    Box::new(|current, _| {
        Ok(if current.is_some() {
            Change::Write(None, Expiry::Never, Reply::Integer(1))
        } else {
            Change::Keep(Reply::Integer(0))
        })
    })
}
