//! Redis hashes (HSET, HGET, HGETALL, ...) and the type of a value.
//!
//! A hash is one onekv value: [`HASH_MARKER`], then its fields in byte order, each with its value
//! ([`encode`]). So a hash lives in its key's shard like any value, `HGETALL` is one linearizable
//! read, a hash expires, is renamed, copied, watched and deleted exactly as a string is, and every
//! write to it is a read-modify-write through the combiner (one compare-and-swap, combined with the
//! other writes to the key on this node), decided by the functions here. The cost: a hash is at most
//! `limits.max_value_bytes` encoded (1 MiB by default), and each write rewrites all of it.
//!
//! A value is a hash if and only if it begins with the marker; every other value is a string. The
//! front end refuses to write a string that begins with it ([`reserved_string`]), so a string never
//! turns into a hash; a value written through the gRPC API that begins with it reads as a hash here.
//!
//! Owns: the encoding, the type of a value ([`type_name`], [`wrong_type`]), and each hash command's
//! reply and new value as a function of the value found ([`decision`] for writes, [`answer`] for
//! reads), so a command gives the same answer alone and inside a transaction. Does not own reading
//! or swapping (`combine`, `reads`) or the table (`commands`).

use std::collections::BTreeMap;

use onekv_client::Expiry;
use rand::Rng as _;
use rand::seq::IteratorRandom as _;

use super::bytes::{self, FloatError};
use super::combine::{Change, Decide};
use super::{Outcome, not_an_integer, parse_integer, wrong_arity};
use crate::pattern::Pattern;
use crate::protocol::Reply;

/// The first bytes of every hash value: a zero byte, `FF`, a name and a format version. No text a
/// client would store as a string begins with them.
pub(super) const HASH_MARKER: &[u8] = b"\x00\xffonekv-hash\x00\x01";

/// Most elements HRANDFIELD returns with a negative count (repeats allowed), so one command cannot
/// make the node build an unbounded reply from a small hash.
const MAX_RANDOM_FIELDS: u64 = 1 << 20;

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

/// Whether `value` is a hash.
pub(super) fn is_hash(value: &[u8]) -> bool {
    value.starts_with(HASH_MARKER)
}

/// `TYPE`'s answer for a value.
pub(super) fn type_name(value: Option<&[u8]>) -> &'static str {
    match value {
        None => "none",
        Some(value) if is_hash(value) => "hash",
        Some(_) => "string",
    }
}

/// Redis's error for a command on a value of another type.
pub(super) fn wrong_type() -> Reply {
    Reply::Error("WRONGTYPE Operation against a key holding the wrong kind of value".into())
}

/// `value`, if it is a string (absent: `None`); [`wrong_type`] if it is a hash. String commands
/// read their value through this.
pub(super) fn string_value(value: Option<&[u8]>) -> Outcome<Option<&[u8]>> {
    match value {
        Some(value) if is_hash(value) => Err(wrong_type()),
        value => Ok(value),
    }
}

/// The error for a string value a client may not write, if `value` is one: it would read as a
/// hash.
pub(super) fn reserved_string(value: &[u8]) -> Option<Reply> {
    is_hash(value).then(|| {
        Reply::err(
            "onekv: string values beginning with the bytes 00 FF 'onekv-hash' 00 01 are reserved \
             (they mark hashes)",
        )
    })
}

/// The encoded hash of `fields`: the marker, the number of fields (u32, little-endian), then each
/// field and its value, each as a u32 little-endian length and the bytes, in the fields' order.
pub(super) fn encode(fields: &Fields) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_len(fields));
    out.extend_from_slice(HASH_MARKER);
    out.extend_from_slice(&(fields.len() as u32).to_le_bytes());
    for (field, value) in fields {
        out.extend_from_slice(&(field.len() as u32).to_le_bytes());
        out.extend_from_slice(field);
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(value);
    }
    out
}

/// The length of [`encode`]'s result.
fn encoded_len(fields: &Fields) -> usize {
    HASH_MARKER.len() + 4 + fields.iter().map(|(field, value)| 8 + field.len() + value.len()).sum::<usize>()
}

/// The fields of an encoded hash (`value` begins with the marker). A value that does not decode
/// (truncated, trailing bytes, fields out of order) is an error naming the damage: it was not
/// written by this front end.
pub(super) fn decode(value: &[u8]) -> Outcome<Fields> {
    let damaged = |what: &str| Reply::err(format!("onekv: the key holds a damaged hash ({what})"));
    let mut rest = value.strip_prefix(HASH_MARKER).ok_or_else(|| damaged("no marker"))?;
    let mut take = |len: usize| -> Outcome<&[u8]> {
        if rest.len() < len {
            return Err(damaged("truncated"));
        }
        let (taken, after) = rest.split_at(len);
        rest = after;
        Ok(taken)
    };
    let length = |bytes: &[u8]| u32::from_le_bytes(bytes.try_into().expect("four bytes")) as usize;
    let count = length(take(4)?);
    let mut fields = Fields::new();
    let mut previous: Option<&[u8]> = None;
    for _ in 0..count {
        let field = take(4).map(length).and_then(&mut take)?;
        let value = take(4).map(length).and_then(&mut take)?;
        if previous.is_some_and(|previous| previous >= field) {
            return Err(damaged("fields out of order"));
        }
        previous = Some(field);
        fields.insert(field.to_vec(), value.to_vec());
    }
    if !rest_is_empty(value, &fields) {
        return Err(damaged("trailing bytes"));
    }
    Ok(fields)
}

/// Whether `fields` account for every byte of `value` (nothing trails the last field).
fn rest_is_empty(value: &[u8], fields: &Fields) -> bool {
    value.len() == encoded_len(fields)
}

/// The fields of `value` as a hash command finds them: none for an absent key, [`wrong_type`] for a
/// string.
fn hash_of(value: Option<&[u8]>) -> Outcome<Fields> {
    match value {
        None => Ok(Fields::new()),
        Some(value) if is_hash(value) => decode(value),
        Some(_) => Err(wrong_type()),
    }
}

/// The write of `fields` as the key's new value, keeping its expiry (an empty hash deletes the key,
/// as in Redis), answering `reply`; refused when the encoded hash would be over `max_value_bytes`.
fn store(fields: &Fields, max_value_bytes: usize, reply: Reply) -> Outcome<Change> {
    if fields.is_empty() {
        return Ok(Change::Write(None, Expiry::Never, reply));
    }
    let len = encoded_len(fields);
    if len > max_value_bytes {
        return Err(Reply::err(format!(
            "onekv: a hash is stored as one value of at most limits.max_value_bytes = {max_value_bytes} \
             bytes; this write would make it {len}"
        )));
    }
    Ok(Change::Write(Some(encode(fields)), Expiry::Keep, reply))
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

/// `HRANDFIELD key [count [WITHVALUES]]`, as Redis 7: without a count one field (nil for no hash);
/// a positive count that many distinct fields (at most all); a negative one that many fields drawn
/// with repeats.
fn random_fields(args: &[Vec<u8>], fields: &Fields) -> Outcome {
    let mut rng = rand::rng();
    let Some(count) = args.get(2) else {
        return Ok(Reply::optional(fields.keys().choose(&mut rng).cloned()));
    };
    let count = parse_integer(count).ok_or_else(not_an_integer)?;
    let with_values = match &args[3..] {
        [] => false,
        [option] if option.eq_ignore_ascii_case(b"WITHVALUES") => true,
        _ => return Err(Reply::err("syntax error")),
    };
    // Redis's bounds: the count's magnitude, doubled with values, must fit a signed 64-bit integer.
    let limit = if with_values { i64::MAX / 2 } else { i64::MAX };
    if count < -limit {
        return Err(Reply::err("value is out of range"));
    }
    let element = |(field, value): (&Vec<u8>, &Vec<u8>)| match with_values {
        true => Element::Pair(field.clone(), value.clone()),
        false => Element::Field(field.clone()),
    };
    let elements: Vec<Element> = if fields.is_empty() {
        Vec::new()
    } else if count >= 0 {
        let mut chosen = fields.iter().choose_multiple(&mut rng, count.min(fields.len() as i64) as usize);
        // `choose_multiple` keeps the fields' order for small counts; Redis's order is random.
        for i in (1..chosen.len()).rev() {
            chosen.swap(i, rng.random_range(0..=i));
        }
        chosen.into_iter().map(element).collect()
    } else {
        let wanted = count.unsigned_abs();
        if wanted > MAX_RANDOM_FIELDS {
            return Err(Reply::err(format!(
                "onekv: HRANDFIELD with a negative count returns at most {MAX_RANDOM_FIELDS} fields"
            )));
        }
        let all: Vec<(&Vec<u8>, &Vec<u8>)> = fields.iter().collect();
        (0..wanted).map(|_| element(all[rng.random_range(0..all.len())])).collect()
    };
    Ok(if with_values {
        Reply::Pairs(
            elements
                .into_iter()
                .map(|element| match element {
                    Element::Pair(field, value) => (Reply::Bulk(field), Reply::Bulk(value)),
                    Element::Field(field) => (Reply::Bulk(field), Reply::Nil),
                })
                .collect(),
        )
    } else {
        Reply::Array(
            elements
                .into_iter()
                .map(|element| match element {
                    Element::Pair(field, _) | Element::Field(field) => Reply::Bulk(field),
                })
                .collect(),
        )
    })
}

/// One element of HRANDFIELD's reply.
enum Element {
    Field(Vec<u8>),
    Pair(Vec<u8>, Vec<u8>),
}

/// `HSCAN key cursor [MATCH pattern] [COUNT count] [NOVALUES]`: every matching field in one page
/// and cursor 0, as Redis answers for a hash it keeps compact (a hash is one value here, read
/// whole). COUNT is checked and otherwise ignored.
fn scan(args: &[Vec<u8>], fields: Fields) -> Outcome {
    std::str::from_utf8(&args[2])
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
        .ok_or_else(|| Reply::err("invalid cursor"))?;
    let mut pattern = None;
    let mut with_values = true;
    let mut options = args[3..].iter();
    while let Some(option) = options.next() {
        match option.to_ascii_uppercase().as_slice() {
            b"NOVALUES" => with_values = false,
            b"MATCH" => {
                pattern = Some(Pattern::parse(options.next().ok_or_else(|| Reply::err("syntax error"))?))
            }
            b"COUNT" => {
                let count = options.next().ok_or_else(|| Reply::err("syntax error"))?;
                let count = parse_integer(count).ok_or_else(not_an_integer)?;
                if count < 1 {
                    return Err(Reply::err("syntax error"));
                }
            }
            _ => return Err(Reply::err("syntax error")),
        }
    }
    let mut items = Vec::new();
    for (field, value) in fields {
        if pattern.as_ref().is_some_and(|pattern: &Pattern| !pattern.matches(&field)) {
            continue;
        }
        items.push(Reply::Bulk(field));
        if with_values {
            items.push(Reply::Bulk(value));
        }
    }
    Ok(Reply::Array(vec![Reply::text("0"), Reply::Array(items)]))
}

/// Redis's thresholds for keeping a hash compact, which decide what OBJECT ENCODING calls it:
/// `hash-max-listpack-entries` (128) and `hash-max-listpack-value` (64) (`-ziplist-` before Redis
/// 7). CONFIG SET changes them on a node; onekv stores every hash the same way whatever they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Listpack {
    /// Most fields of a `listpack` hash.
    pub entries: u64,
    /// Longest field or value of a `listpack` hash.
    pub value: u64,
}

impl Default for Listpack {
    fn default() -> Self {
        Listpack { entries: 128, value: 64 }
    }
}

/// OBJECT ENCODING of a hash: `listpack` while it is within `listpack`'s thresholds, else
/// `hashtable`. (Redis never converts a hash back; onekv classifies the hash as it is now.)
pub(super) fn encoding(value: &[u8], listpack: Listpack) -> &'static str {
    let short = |bytes: &[u8]| bytes.len() as u64 <= listpack.value;
    match decode(value) {
        Ok(fields)
            if fields.len() as u64 <= listpack.entries
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

    fn args(items: &[&str]) -> Vec<Vec<u8>> {
        items.iter().map(|item| item.as_bytes().to_vec()).collect()
    }

    /// Runs write `command` against `value`; the new value (or the old one, if nothing was
    /// written) and the reply.
    fn write(command: &[&str], value: Option<Vec<u8>>) -> (Option<Vec<u8>>, Reply) {
        let args = args(command);
        let mut decide = match decision(command[0], &args, 1 << 20) {
            Ok(decide) => decide,
            Err(error) => return (value, error),
        };
        match decide(value.as_deref(), None) {
            Ok(Change::Write(new, _, reply)) => (new, reply),
            Ok(Change::Keep(reply)) => (value, reply),
            Err(error) => (value, error),
        }
    }

    fn read(command: &[&str], value: &Option<Vec<u8>>) -> Reply {
        answer(command[0], &args(command), value.as_deref()).unwrap_or_else(|error| error)
    }

    fn bulk(text: &str) -> Reply {
        Reply::text(text)
    }

    #[test]
    fn the_encoding_round_trips_and_damage_is_an_error() {
        let mut fields = Fields::new();
        fields.insert(b"b".to_vec(), b"2".to_vec());
        fields.insert(b"a".to_vec(), Vec::new());
        fields.insert(Vec::new(), b"empty field".to_vec());
        let encoded = encode(&fields);
        assert!(is_hash(&encoded));
        assert_eq!(encoded.len(), encoded_len(&fields));
        assert_eq!(decode(&encoded).unwrap(), fields);
        for cut in HASH_MARKER.len()..encoded.len() {
            assert!(decode(&encoded[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = encoded.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());
        // Two fields swapped: out of order.
        let mut swapped = HASH_MARKER.to_vec();
        swapped.extend_from_slice(&2u32.to_le_bytes());
        for field in [b"b", b"a"] {
            swapped.extend_from_slice(&1u32.to_le_bytes());
            swapped.extend_from_slice(field);
            swapped.extend_from_slice(&0u32.to_le_bytes());
        }
        assert!(decode(&swapped).is_err());
        assert!(!is_hash(b"plain"));
        assert_eq!(
            (type_name(None), type_name(Some(b"x")), type_name(Some(&encoded))),
            ("none", "string", "hash")
        );
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
        let Ok(Change::Write(_, Expiry::Keep, _)) = decide(hash.as_deref(), Some(5)) else { panic!() };
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
        assert_eq!(string_value(Some(&encode(&Fields::new()))), Err(wrong_type()));
        assert!(reserved_string(&encode(&Fields::new())).is_some() && reserved_string(b"text").is_none());
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
        assert_eq!(encoding(hash.as_deref().unwrap(), Listpack::default()), "listpack");
        assert_eq!(encoding(hash.as_deref().unwrap(), Listpack { entries: 2, value: 64 }), "hashtable");
        let (big, _) = write(&["hset", "h", "f", &"v".repeat(65)], None);
        assert_eq!(encoding(big.as_deref().unwrap(), Listpack::default()), "hashtable");
    }

    fn text(reply: &Reply) -> String {
        let Reply::Bulk(bytes) = reply else { panic!("{reply:?}") };
        String::from_utf8(bytes.clone()).unwrap()
    }
}
