//! Redis sets (SADD, SMEMBERS, SISMEMBER, SINTER, ...).
//!
//! A set is one onekv value, stored as a hash is (`hashes`): the set marker, then its members in
//! byte order (`types`' item encoding, one item an entry). So it lives in its key's shard, every
//! read of it is one linearizable read, and every write is a read-modify-write through the
//! combiner that rewrites the whole set (at most `limits.max_value_bytes` encoded).
//!
//! Owns: each set command's reply and new value as a function of the values found ([`decision`]
//! for writes, [`answer`] for reads, SINTER/SUNION/SDIFF given every key's value). Does not own
//! reading or swapping (`combine`, `reads`), the types (`types`) or the table (`commands`).

use std::collections::BTreeSet;

use rand::seq::IteratorRandom as _;

use super::combine::{Change, Decide};
use super::types::{self, Kind, SET_MARKER};
use super::{Outcome, not_an_integer, parse_integer};
use crate::pattern::Pattern;
use crate::protocol::Reply;

/// A set's members, in byte order.
pub(super) type Members = BTreeSet<Vec<u8>>;

/// Whether `name` is a set command that writes: decided by [`decision`].
pub(super) fn is_set_write(name: &str) -> bool {
    matches!(name, "sadd" | "srem" | "spop")
}

/// Whether `name` is a set command that only reads: answered by [`answer`].
pub(super) fn is_set_read(name: &str) -> bool {
    matches!(
        name,
        "smembers"
            | "sismember"
            | "smismember"
            | "scard"
            | "srandmember"
            | "sscan"
            | "sinter"
            | "sunion"
            | "sdiff"
    )
}

/// The encoded set of `members`.
pub(super) fn encode(members: &Members) -> Vec<u8> {
    types::encode_items(SET_MARKER, members.len(), members.iter().map(Vec::as_slice))
}

/// The members of an encoded set; an error if it does not decode or its members are out of order.
pub(super) fn decode(value: &[u8]) -> Outcome<Members> {
    let items = types::decode_items(value, SET_MARKER, 1)?;
    let mut members = Members::new();
    for member in items {
        if members.last().is_some_and(|last| last.as_slice() >= member) {
            return Err(types::damaged("members out of order"));
        }
        members.insert(member.to_vec());
    }
    Ok(members)
}

/// The members of `value` as a set command finds them: none for an absent key, [`wrong_type`] for
/// another type.
fn set_of(value: Option<&[u8]>) -> Outcome<Members> {
    Ok(types::decode_as(value, Kind::Set, decode)?.unwrap_or_default())
}

/// The write of `members` as the key's new value (`types::store`).
fn store(members: &Members, max_value_bytes: usize, reply: Reply) -> Outcome<Change> {
    let encoded = (!members.is_empty()).then(|| encode(members));
    types::store(encoded, max_value_bytes, "set", reply)
}

/// What set write `name` (one of [`is_set_write`]) decides from the value it finds; its arguments
/// are checked here, before anything is read.
pub(super) fn decision(name: &str, args: &[Vec<u8>], max_value_bytes: usize) -> Outcome<Decide> {
    Ok(match name {
        "sadd" => {
            let added_members = args[2..].to_vec();
            Box::new(move |current, _| {
                let mut members = set_of(current)?;
                let added =
                    added_members.iter().filter(|member| members.insert(member.to_vec())).count() as i64;
                if added == 0 {
                    return Ok(Change::Keep(Reply::Integer(0)));
                }
                store(&members, max_value_bytes, Reply::Integer(added))
            })
        }
        "srem" => {
            let removed_members = args[2..].to_vec();
            Box::new(move |current, _| {
                let mut members = set_of(current)?;
                let removed = removed_members.iter().filter(|member| members.remove(*member)).count() as i64;
                if removed == 0 {
                    return Ok(Change::Keep(Reply::Integer(0)));
                }
                store(&members, max_value_bytes, Reply::Integer(removed))
            })
        }
        "spop" => {
            let count = match args.get(2) {
                None => None,
                Some(count) => {
                    let count = parse_integer(count).ok_or_else(not_an_integer)?;
                    Some(
                        usize::try_from(count)
                            .map_err(|_| Reply::err("value is out of range, must be positive"))?,
                    )
                }
            };
            if args.len() > 3 {
                return Err(Reply::err("syntax error"));
            }
            Box::new(move |current, _| {
                let mut members = set_of(current)?;
                let popped: Vec<Vec<u8>> = members
                    .iter()
                    .choose_multiple(&mut rand::rng(), count.unwrap_or(1).min(members.len()))
                    .into_iter()
                    .cloned()
                    .collect();
                let reply = match count {
                    None => Reply::optional(popped.first().cloned()),
                    Some(_) => Reply::Array(popped.iter().cloned().map(Reply::Bulk).collect()),
                };
                if popped.is_empty() {
                    return Ok(Change::Keep(reply));
                }
                for member in &popped {
                    members.remove(member);
                }
                store(&members, max_value_bytes, reply)
            })
        }
        other => return Err(Reply::err(format!("'{other}' is not a set write"))),
    })
}

/// The reply of set read `name` (one of [`is_set_read`]) given the values of its keys, in order
/// (`None`: absent).
pub(super) fn answer(name: &str, args: &[Vec<u8>], values: &[Option<&[u8]>]) -> Outcome {
    let members = set_of(values.first().copied().flatten())?;
    Ok(match name {
        "smembers" => Reply::Array(members.into_iter().map(Reply::Bulk).collect()),
        "sismember" => Reply::Integer(i64::from(members.contains(&args[2]))),
        "smismember" => {
            Reply::Array(args[2..].iter().map(|m| Reply::Integer(i64::from(members.contains(m)))).collect())
        }
        "scard" => Reply::Integer(members.len() as i64),
        "srandmember" => match args.get(2) {
            None => Reply::optional(members.iter().choose(&mut rand::rng()).cloned()),
            Some(count) => {
                let count = parse_integer(count).ok_or_else(not_an_integer)?;
                let all: Vec<&Vec<u8>> = members.iter().collect();
                let picked = types::random_picks(&all, count, i64::MAX, |member| member.len())?;
                Reply::Array(picked.into_iter().map(|member| Reply::Bulk(member.to_vec())).collect())
            }
        },
        "sscan" => scan(args, members)?,
        "sinter" | "sunion" | "sdiff" => {
            let mut result = members;
            for value in &values[1..] {
                let other = set_of(*value)?;
                result = match name {
                    "sinter" => result.intersection(&other).cloned().collect(),
                    "sunion" => result.union(&other).cloned().collect(),
                    _ => result.difference(&other).cloned().collect(),
                };
            }
            Reply::Array(result.into_iter().map(Reply::Bulk).collect())
        }
        other => return Err(Reply::err(format!("'{other}' is not a set read"))),
    })
}

/// `SSCAN key cursor [MATCH pattern] [COUNT count]`: every matching member in one page and cursor
/// 0, as Redis answers for a set it keeps compact.
fn scan(args: &[Vec<u8>], members: Members) -> Outcome {
    let pattern = types::parse_scan_options(&args[2], &args[3..], false)?.pattern;
    let matching =
        members.into_iter().filter(|member| pattern.as_ref().is_none_or(|p: &Pattern| p.matches(member)));
    Ok(Reply::Array(vec![Reply::text("0"), Reply::Array(matching.map(Reply::Bulk).collect())]))
}

/// OBJECT ENCODING of a set, by Redis 7.0's rules: `intset` while every member is an integer and
/// there are at most `intset_entries` (`set-max-intset-entries`, 512) of them, else `hashtable`.
pub(super) fn encoding(value: &[u8], intset_entries: u64) -> &'static str {
    match decode(value) {
        Ok(members)
            if members.len() as u64 <= intset_entries
                && members.iter().all(|member| parse_integer(member).is_some()) =>
        {
            "intset"
        }
        _ => "hashtable",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::types::wrong_type;

    use crate::exec::types::test_support::{args, bulks};

    fn write(command: &[&str], value: Option<Vec<u8>>) -> (Option<Vec<u8>>, Reply) {
        crate::exec::types::test_support::write(decision, command, value)
    }

    fn read(command: &[&str], values: &[&Option<Vec<u8>>]) -> Reply {
        let values: Vec<Option<&[u8]>> = values.iter().map(|value| value.as_deref()).collect();
        answer(command[0], &args(command), &values).unwrap_or_else(|error| error)
    }

    #[test]
    fn writes_add_remove_and_pop_members_and_an_emptied_set_is_deleted() {
        let (set, reply) = write(&["sadd", "s", "b", "a", "b", "c"], None);
        assert_eq!(reply, Reply::Integer(3));
        assert_eq!(read(&["smembers", "s"], &[&set]), bulks(&["a", "b", "c"]));
        let (set, reply) = write(&["sadd", "s", "a"], set);
        assert_eq!(reply, Reply::Integer(0));
        let (set, reply) = write(&["srem", "s", "a", "zz"], set);
        assert_eq!(reply, Reply::Integer(1));
        assert_eq!(
            read(&["smismember", "s", "a", "b"], &[&set]),
            Reply::Array(vec![Reply::Integer(0), Reply::Integer(1)])
        );
        let (set, Reply::Bulk(popped)) = write(&["spop", "s"], set) else { panic!() };
        assert!(popped == b"b" || popped == b"c");
        let (set, reply) = write(&["spop", "s", "5"], set);
        assert_eq!((set, reply.clone()), (None, reply), "the last member's removal deletes the key");
        assert_eq!(write(&["spop", "s"], None).1, Reply::Nil);
        assert_eq!(
            write(&["spop", "s", "-1"], None).1,
            Reply::err("value is out of range, must be positive")
        );
        assert_eq!(write(&["sadd", "s", "x"], Some(b"string".to_vec())).1, wrong_type());
    }

    #[test]
    fn reads_answer_from_the_members_and_combine_sets() {
        let (a, _) = write(&["sadd", "a", "1", "2", "3"], None);
        let (b, _) = write(&["sadd", "b", "2", "3", "4"], None);
        let none = None;
        assert_eq!(read(&["sinter", "a", "b"], &[&a, &b]), bulks(&["2", "3"]));
        assert_eq!(read(&["sunion", "a", "b", "c"], &[&a, &b, &none]), bulks(&["1", "2", "3", "4"]));
        assert_eq!(read(&["sdiff", "a", "b"], &[&a, &b]), bulks(&["1"]));
        assert_eq!(read(&["sinter", "a", "c"], &[&a, &none]), bulks(&[]));
        assert_eq!(read(&["sinter", "a", "s"], &[&a, &Some(b"x".to_vec())]), wrong_type());
        assert_eq!(read(&["scard", "a"], &[&a]), Reply::Integer(3));
        assert_eq!(read(&["sismember", "a", "2"], &[&a]), Reply::Integer(1));
        assert_eq!(
            read(&["sscan", "a", "0", "MATCH", "[12]"], &[&a]),
            Reply::Array(vec![Reply::text("0"), bulks(&["1", "2"])])
        );
        let Reply::Array(picked) = read(&["srandmember", "a", "-5"], &[&a]) else { panic!() };
        assert_eq!(picked.len(), 5);
        let Reply::Array(picked) = read(&["srandmember", "a", "10"], &[&a]) else { panic!() };
        assert_eq!(picked.len(), 3);
        assert_eq!(
            read(&["srandmember", "a", "-9223372036854775808"], &[&a]),
            Reply::err("value is out of range")
        );
        assert_eq!(encoding(a.as_deref().unwrap(), 512), "intset");
        assert_eq!(encoding(a.as_deref().unwrap(), 2), "hashtable");
        let (words, _) = write(&["sadd", "w", "x"], None);
        assert_eq!(encoding(words.as_deref().unwrap(), 512), "hashtable");
    }
}
