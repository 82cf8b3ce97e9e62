//! Redis hashes (HSET, HGET, HGETALL, ...).
//!
//! A hash is one onekv value: the hash marker, then its fields in byte order, each with its value
//! (`types`' item encoding, two items an entry). So a hash lives in its key's shard like any
//! value, `HGETALL` is one linearizable read, a hash expires, is renamed, copied, watched and
//! deleted exactly as a string is, and every write to it is a read-modify-write through the
//! combiner (one compare-and-swap, combined with the other writes to the key on this node),
//! decided by the functions here. The cost: a hash is at most `limits.max_value_bytes` encoded (1
//! MiB by default), and each write rewrites all of it.
//!
//! Owns: each hash command's reply and new value as a function of the value found ([`decision`]
//! for writes, [`answer`] for reads), so a command gives the same answer alone and inside a
//! transaction. Does not own reading or swapping (`combine`, `reads`), the types (`types`) or the
//! table (`commands`).

use std::collections::BTreeMap;

use rand::seq::IteratorRandom as _;

use super::bytes::{self, FloatError};
use super::combine::{Change, Decide};
use super::types::{self, HASH_MARKER, Kind};
use super::{Outcome, not_an_integer, parse_integer, wrong_arity};
use crate::protocol::Reply;

/// A hash's fields and their values, in byte order of the fields.
pub(super) type Fields = BTreeMap<Vec<u8>, Vec<u8>>;

/// Whether `name` is a hash command that writes: decided by [`decision`].
pub(super) fn is_hash_write(name: &str) -> bool {
    matches!(name, "hset" | "hmset" | "hsetnx" | "hdel" | "hincrby" | "hincrbyfloat")
}

/// Whether `name` is a hash command that only reads: answered by [`answer`].
pub(super) fn is_hash_read(name: &str) -> bool {
    matches!(
        name,
        "hget"
            | "hmget"
            | "hgetall"
            | "hlen"
            | "hexists"
            | "hkeys"
            | "hvals"
            | "hstrlen"
            | "hrandfield"
            | "hscan"
    )
}

/// The encoded hash of `fields`: the hash marker, then each field and its value.
pub(super) fn encode(fields: &Fields) -> Vec<u8> {
    let items = fields.iter().flat_map(|(field, value)| [field.as_slice(), value.as_slice()]);
    types::encode_items(HASH_MARKER, fields.len(), items)
}

/// The fields of an encoded hash; an error if it does not decode or its fields are out of order.
pub(super) fn decode(value: &[u8]) -> Outcome<Fields> {
    let items = types::decode_items(value, HASH_MARKER, 2)?;
    let mut fields = Fields::new();
    for pair in items.chunks_exact(2) {
        if fields.last_key_value().is_some_and(|(last, _)| last.as_slice() >= pair[0]) {
            return Err(types::damaged("fields out of order"));
        }
        fields.insert(pair[0].to_vec(), pair[1].to_vec());
    }
    Ok(fields)
}

/// The fields of `value` as a hash command finds them: none for an absent key, [`wrong_type`] for
/// another type.
fn hash_of(value: Option<&[u8]>) -> Outcome<Fields> {
    Ok(types::decode_as(value, Kind::Hash, decode)?.unwrap_or_default())
}

/// The write of `fields` as the key's new value (`types::store`).
fn store(fields: &Fields, max_value_bytes: usize, reply: Reply) -> Outcome<Change> {
    let encoded = (!fields.is_empty()).then(|| encode(fields));
    types::store(encoded, max_value_bytes, "hash", reply)
}

/// What hash write `name` (one of [`is_hash_write`]) decides from the value it finds; its arguments
/// are checked here, before anything is read.
pub(super) fn decision(name: &str, args: &[Vec<u8>], max_value_bytes: usize) -> Outcome<Decide> {
    Ok(match name {
        "hset" | "hmset" => {
            if args.len() < 4 || !args.len().is_multiple_of(2) {
                return Err(wrong_arity(name));
            }
            let pairs: Vec<(Vec<u8>, Vec<u8>)> =
                args[2..].chunks_exact(2).map(|pair| (pair[0].clone(), pair[1].clone())).collect();
            let count_new = name == "hset";
            Box::new(move |current, _| {
                let mut fields = hash_of(current)?;
                let mut added = 0;
                for (field, value) in &pairs {
                    added += i64::from(fields.insert(field.clone(), value.clone()).is_none());
                }
                store(&fields, max_value_bytes, if count_new { Reply::Integer(added) } else { Reply::ok() })
            })
        }
        "hsetnx" => {
            let (field, value) = (args[2].clone(), args[3].clone());
            Box::new(move |current, _| {
                let mut fields = hash_of(current)?;
                if fields.contains_key(&field) {
                    return Ok(Change::Keep(Reply::Integer(0)));
                }
                fields.insert(field.clone(), value.clone());
                store(&fields, max_value_bytes, Reply::Integer(1))
            })
        }
        "hdel" => {
            let doomed = args[2..].to_vec();
            Box::new(move |current, _| {
                let mut fields = hash_of(current)?;
                let removed = doomed.iter().filter(|field| fields.remove(*field).is_some()).count() as i64;
                if removed == 0 {
                    return Ok(Change::Keep(Reply::Integer(0)));
                }
                store(&fields, max_value_bytes, Reply::Integer(removed))
            })
        }
        "hincrby" => {
            let field = args[2].clone();
            let by = parse_integer(&args[3]).ok_or_else(not_an_integer)?;
            Box::new(move |current, _| {
                let mut fields = hash_of(current)?;
                let old = match fields.get(&field) {
                    None => 0,
                    Some(value) => {
                        parse_integer(value).ok_or_else(|| Reply::err("hash value is not an integer"))?
                    }
                };
                let new =
                    old.checked_add(by).ok_or_else(|| Reply::err("increment or decrement would overflow"))?;
                fields.insert(field.clone(), new.to_string().into_bytes());
                store(&fields, max_value_bytes, Reply::Integer(new))
            })
        }
        "hincrbyfloat" => {
            let field = args[2].clone();
            let by = bytes::parse_float(&args[3]).ok_or_else(|| Reply::err("value is not a valid float"))?;
            if !by.is_finite() {
                return Err(Reply::err("value is NaN or Infinity"));
            }
            let increment = args[3].clone();
            Box::new(move |current, _| {
                let mut fields = hash_of(current)?;
                let sum = match bytes::add_floats(fields.get(&field).map(Vec::as_slice), &increment) {
                    Ok(sum) => sum,
                    Err(FloatError::NotAFloat) => return Err(Reply::err("hash value is not a float")),
                    Err(FloatError::NotFinite) => {
                        return Err(Reply::err("increment would produce NaN or Infinity"));
                    }
                };
                fields.insert(field.clone(), sum.clone());
                store(&fields, max_value_bytes, Reply::Bulk(sum))
            })
        }
        other => return Err(Reply::err(format!("'{other}' is not a hash write"))),
    })
}

/// The reply of hash read `name` (one of [`is_hash_read`]) given its key's value (`None`: absent).
pub(super) fn answer(name: &str, args: &[Vec<u8>], value: Option<&[u8]>) -> Outcome {
    let fields = hash_of(value)?;
    Ok(match name {
        "hget" => Reply::optional(fields.get(&args[2]).cloned()),
        "hmget" => {
            Reply::Array(args[2..].iter().map(|field| Reply::optional(fields.get(field).cloned())).collect())
        }
        "hgetall" => Reply::Map(
            fields.into_iter().map(|(field, value)| (Reply::Bulk(field), Reply::Bulk(value))).collect(),
        ),
        "hlen" => Reply::Integer(fields.len() as i64),
        "hexists" => Reply::Integer(i64::from(fields.contains_key(&args[2]))),
        "hkeys" => Reply::Array(fields.into_keys().map(Reply::Bulk).collect()),
        "hvals" => Reply::Array(fields.into_values().map(Reply::Bulk).collect()),
        "hstrlen" => Reply::Integer(fields.get(&args[2]).map_or(0, Vec::len) as i64),
        "hrandfield" => random_fields(args, &fields)?,
        "hscan" => scan(args, fields)?,
        other => return Err(Reply::err(format!("'{other}' is not a hash read"))),
    })
}

/// `HRANDFIELD key [count [WITHVALUES]]`, as Redis 7 (`types::random_picks`): without a count
/// one field (nil for no hash).
fn random_fields(args: &[Vec<u8>], fields: &Fields) -> Outcome {
    let Some(count) = args.get(2) else {
        return Ok(Reply::optional(fields.keys().choose(&mut rand::rng()).cloned()));
    };
    let count = parse_integer(count).ok_or_else(not_an_integer)?;
    let with_values = match &args[3..] {
        [] => false,
        [option] if option.eq_ignore_ascii_case(b"WITHVALUES") => true,
        _ => return Err(Reply::err("syntax error")),
    };
    // Redis's bound: the count's magnitude, doubled with values, must fit a signed 64-bit integer.
    let limit = if with_values { i64::MAX / 2 } else { i64::MAX };
    let all: Vec<(&Vec<u8>, &Vec<u8>)> = fields.iter().collect();
    let size =
        |(field, value): &(&Vec<u8>, &Vec<u8>)| field.len() + if with_values { value.len() } else { 0 };
    let picked = types::random_picks(&all, count, limit, size)?;
    let bulk = |bytes: &Vec<u8>| Reply::Bulk(bytes.clone());
    Ok(match with_values {
        true => Reply::Pairs(picked.into_iter().map(|(field, value)| (bulk(field), bulk(value))).collect()),
        false => Reply::Array(picked.into_iter().map(|(field, _)| bulk(field)).collect()),
    })
}

/// `HSCAN key cursor [MATCH pattern] [COUNT count] [NOVALUES]`: every matching field in one page
/// and cursor 0, as Redis answers for a hash it keeps compact (`types::parse_scan_options`).
fn scan(args: &[Vec<u8>], fields: Fields) -> Outcome {
    let options = types::parse_scan_options(&args[2], &args[3..], true)?;
    let mut items = Vec::new();
    for (field, value) in fields {
        if options.pattern.as_ref().is_some_and(|pattern| !pattern.matches(&field)) {
            continue;
        }
        items.push(Reply::Bulk(field));
        if options.with_values {
            items.push(Reply::Bulk(value));
        }
    }
    Ok(Reply::Array(vec![Reply::text("0"), Reply::Array(items)]))
}

/// OBJECT ENCODING of a hash: `listpack` while it has at most `max_entries` fields and every field
/// and value is at most `max_len` bytes (the node's `hash-max-listpack-entries` and `-value`,
/// `types::Encodings`), else `hashtable`. (Redis never converts a hash back; onekv classifies the
/// hash as it is now.)
pub(super) fn encoding(value: &[u8], max_entries: u64, max_len: u64) -> &'static str {
    let short = |bytes: &[u8]| bytes.len() as u64 <= max_len;
    match decode(value) {
        Ok(fields)
            if fields.len() as u64 <= max_entries
                && fields.iter().all(|(field, value)| short(field) && short(value)) =>
        {
            "listpack"
        }
        _ => "hashtable",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::types::{kind_of, wrong_type};

    use crate::exec::types::test_support::args;

    fn write(command: &[&str], value: Option<Vec<u8>>) -> (Option<Vec<u8>>, Reply) {
        crate::exec::types::test_support::write(decision, command, value)
    }

    fn read(command: &[&str], value: &Option<Vec<u8>>) -> Reply {
        crate::exec::types::test_support::read(answer, command, value)
    }

    fn bulk(text: &str) -> Reply {
        Reply::text(text)
    }

    #[test]
    fn the_encoding_round_trips_and_fields_out_of_order_are_damage() {
        let mut fields = Fields::new();
        fields.insert(b"b".to_vec(), b"2".to_vec());
        fields.insert(b"a".to_vec(), Vec::new());
        fields.insert(Vec::new(), b"empty field".to_vec());
        let encoded = encode(&fields);
        assert_eq!(kind_of(&encoded), Kind::Hash);
        assert_eq!(decode(&encoded).unwrap(), fields);
        let swapped = types::encode_items(HASH_MARKER, 2, [&b"b"[..], b"", b"a", b""]);
        assert!(decode(&swapped).is_err());
        let repeated = types::encode_items(HASH_MARKER, 2, [&b"a"[..], b"", b"a", b""]);
        assert!(decode(&repeated).is_err());
    }

    #[test]
    fn writes_change_fields_keep_the_expiry_and_delete_an_emptied_hash() {
        let (hash, reply) = write(&["hset", "h", "f", "1", "g", "2", "f", "3"], None);
        assert_eq!(reply, Reply::Integer(2), "f counts once");
        assert_eq!(read(&["hget", "h", "f"], &hash), bulk("3"));
        let (hash, reply) = write(&["hset", "h", "f", "4", "x", "5"], hash);
        assert_eq!(reply, Reply::Integer(1));
        let (hash, reply) = write(&["hsetnx", "h", "f", "9"], hash);
        assert_eq!(reply, Reply::Integer(0));
        let (hash, reply) = write(&["hincrby", "h", "n", "-5"], hash);
        assert_eq!(reply, Reply::Integer(-5));
        let (hash, reply) = write(&["hincrbyfloat", "h", "n", "0.5"], hash);
        assert_eq!(reply, bulk("-4.5"));
        assert_eq!(
            write(&["hincrby", "h", "n", "1"], hash.clone()).1,
            Reply::err("hash value is not an integer")
        );
        assert_eq!(
            write(&["hincrbyfloat", "h", "f", "x"], hash.clone()).1,
            Reply::err("value is not a valid float")
        );
        let (hash, reply) = write(&["hmset", "h", "big", "9223372036854775807"], hash);
        assert_eq!(reply, Reply::ok());
        assert_eq!(
            write(&["hincrby", "h", "big", "1"], hash.clone()).1,
            Reply::err("increment or decrement would overflow")
        );
        assert_eq!(
            read(&["hgetall", "h"], &hash),
            Reply::Map(vec![
                (bulk("big"), bulk("9223372036854775807")),
                (bulk("f"), bulk("4")),
                (bulk("g"), bulk("2")),
                (bulk("n"), bulk("-4.5")),
                (bulk("x"), bulk("5")),
            ])
        );
        // Every write keeps the key's expiry.
        let mut decide = decision("hset", &args(&["hset", "h", "a", "b"]), 1 << 20).unwrap();
        let Ok(Change::Write(_, onekv_client::Expiry::Keep, _)) = decide(hash.as_deref(), Some(5)) else {
            panic!()
        };
        let (hash, reply) = write(&["hdel", "h", "big", "f", "g", "n", "nothing"], hash);
        assert_eq!(reply, Reply::Integer(4));
        let (hash, reply) = write(&["hdel", "h", "x"], hash);
        assert_eq!((hash, reply), (None, Reply::Integer(1)), "the last field's deletion deletes the key");
        assert_eq!(write(&["hdel", "h", "x"], None), (None, Reply::Integer(0)));
    }

    #[test]
    fn strings_are_the_wrong_type_and_a_hash_is_bounded() {
        let string = Some(b"text".to_vec());
        for command in [&["hset", "k", "f", "v"][..], &["hdel", "k", "f"], &["hincrby", "k", "f", "1"]] {
            assert_eq!(write(command, string.clone()).1, wrong_type(), "{command:?}");
        }
        for command in [&["hget", "k", "f"][..], &["hgetall", "k"], &["hlen", "k"], &["hscan", "k", "0"]] {
            assert_eq!(read(command, &string), wrong_type(), "{command:?}");
        }
        let args = args(&["hset", "k", "f", &"v".repeat(100)]);
        let mut decide = decision("hset", &args, 100).unwrap();
        let Err(Reply::Error(error)) = decide(None, None) else { panic!() };
        assert!(error.contains("max_value_bytes = 100"), "{error}");
        assert_eq!(decision("hset", &args[..3], 100).err(), Some(wrong_arity("hset")));
    }

    #[test]
    fn reads_answer_from_the_fields() {
        let (hash, _) = write(&["hset", "h", "a", "1", "b", "22", "c", "333"], None);
        assert_eq!(
            read(&["hmget", "h", "a", "zz", "c"], &hash),
            Reply::Array(vec![bulk("1"), Reply::Nil, bulk("333")])
        );
        assert_eq!(read(&["hlen", "h"], &hash), Reply::Integer(3));
        assert_eq!(read(&["hexists", "h", "b"], &hash), Reply::Integer(1));
        assert_eq!(read(&["hstrlen", "h", "c"], &hash), Reply::Integer(3));
        assert_eq!(read(&["hkeys", "h"], &hash), Reply::Array(vec![bulk("a"), bulk("b"), bulk("c")]));
        assert_eq!(read(&["hvals", "h"], &hash), Reply::Array(vec![bulk("1"), bulk("22"), bulk("333")]));
        assert_eq!(read(&["hget", "h", "a"], &None), Reply::Nil);
        assert_eq!(read(&["hgetall", "h"], &None), Reply::Map(Vec::new()));
        assert_eq!(
            read(&["hscan", "h", "0", "MATCH", "[ab]", "COUNT", "1"], &hash),
            Reply::Array(vec![bulk("0"), Reply::Array(vec![bulk("a"), bulk("1"), bulk("b"), bulk("22")])])
        );
        assert_eq!(
            read(&["hscan", "h", "0", "NOVALUES"], &hash),
            Reply::Array(vec![bulk("0"), Reply::Array(vec![bulk("a"), bulk("b"), bulk("c")])])
        );
        assert_eq!(read(&["hscan", "h", "x"], &hash), Reply::err("invalid cursor"));
        // HRANDFIELD: distinct fields up to all of them; with repeats for a negative count.
        let Reply::Array(some) = read(&["hrandfield", "h", "5"], &hash) else { panic!() };
        let mut some: Vec<Reply> = some;
        some.sort_by_key(|reply| format!("{reply:?}"));
        assert_eq!(some, vec![bulk("a"), bulk("b"), bulk("c")]);
        let Reply::Array(repeated) = read(&["hrandfield", "h", "-7"], &hash) else { panic!() };
        assert_eq!(repeated.len(), 7);
        let Reply::Pairs(pairs) = read(&["hrandfield", "h", "2", "WITHVALUES"], &hash) else { panic!() };
        assert_eq!(pairs.len(), 2);
        assert!(pairs.iter().all(|(field, value)| read(&["hget", "h", &text(field)], &hash) == *value));
        assert_eq!(read(&["hrandfield", "h", "0"], &hash), Reply::Array(Vec::new()));
        assert_eq!(read(&["hrandfield", "h"], &None), Reply::Nil);
        assert_eq!(
            read(&["hrandfield", "h", "-9223372036854775808"], &hash),
            Reply::err("value is out of range")
        );
        assert_eq!(
            read(&["hrandfield", "h", "-9223372036854770000", "withvalues"], &hash),
            Reply::err("value is out of range")
        );
        assert_eq!(encoding(hash.as_deref().unwrap(), 128, 64), "listpack");
        assert_eq!(encoding(hash.as_deref().unwrap(), 2, 64), "hashtable");
        let (big, _) = write(&["hset", "h", "f", &"v".repeat(65)], None);
        assert_eq!(encoding(big.as_deref().unwrap(), 128, 64), "hashtable");
    }

    fn text(reply: &Reply) -> String {
        let Reply::Bulk(bytes) = reply else { panic!("{reply:?}") };
        String::from_utf8(bytes.clone()).unwrap()
    }
}
