//! Redis lists (LPUSH, RPUSH, LPOP, LRANGE, ...).
//!
//! A list is one onekv value, stored as a hash or a set is: the list marker, then its elements in
//! list order (`types`' item encoding, one item an entry). So it lives in its key's shard, every read
//! of it is one linearizable read, and every write is a read-modify-write through the combiner that
//! rewrites the whole list (at most `limits.max_value_bytes` encoded). Blocking pops poll
//! (`blocking`); LMOVE is a transaction of its own (`transaction`, with [`move_element`]).
//!
//! Owns: each list command's reply and new value as a function of the value found ([`decision`]
//! for writes, [`answer`] for reads). Does not own reading or swapping (`combine`, `reads`), the
//! types (`types`) or the table (`commands`).

use super::combine::{Change, Decide};
use super::types::{self, Kind, LIST_MARKER};
use super::{Outcome, not_an_integer, parse_integer};
use crate::protocol::Reply;

/// Whether `name` is a list command that writes: decided by [`decision`].
pub(super) fn is_list_write(name: &str) -> bool {
    matches!(
        name,
        "lpush" | "rpush" | "lpushx" | "rpushx" | "lpop" | "rpop" | "lset" | "lrem" | "ltrim" | "linsert"
    )
}

/// Whether `name` is a list command that only reads: answered by [`answer`].
pub(super) fn is_list_read(name: &str) -> bool {
    matches!(name, "llen" | "lrange" | "lindex")
}

/// The encoded list of `elements`.
pub(super) fn encode(elements: &[Vec<u8>]) -> Vec<u8> {
    types::encode_items(LIST_MARKER, elements.len(), elements.iter().map(Vec::as_slice))
}

/// The elements of an encoded list; an error if it does not decode.
pub(super) fn decode(value: &[u8]) -> Outcome<Vec<Vec<u8>>> {
    Ok(types::decode_items(value, LIST_MARKER, 1)?.into_iter().map(<[u8]>::to_vec).collect())
}

/// The elements of `value` as a list command finds them: `None` for an absent key,
/// [`wrong_type`] for another type.
fn list_of(value: Option<&[u8]>) -> Outcome<Option<Vec<Vec<u8>>>> {
    types::decode_as(value, Kind::List, decode)
}

/// The write of `elements` as the key's new value (`types::store`).
fn store(elements: &[Vec<u8>], max_value_bytes: usize, reply: Reply) -> Outcome<Change> {
    let encoded = (!elements.is_empty()).then(|| encode(elements));
    types::store(encoded, max_value_bytes, "list", reply)
}

/// LMOVE's and RPOPLPUSH's ends: `LEFT` (the head) or `RIGHT` (the tail).
pub(super) fn parse_end(arg: &[u8]) -> Outcome<bool> {
    if arg.eq_ignore_ascii_case(b"LEFT") {
        Ok(true)
    } else if arg.eq_ignore_ascii_case(b"RIGHT") {
        Ok(false)
    } else {
        Err(Reply::err("syntax error"))
    }
}

/// LMOVE from the list `source` to the list `destination` (the same key if `same_key`): the
/// element moved and both keys' new values (`None`: deleted), or `None` if the source is empty.
/// The destination's type is checked before anything moves, as in Redis.
#[allow(clippy::type_complexity)]
pub(super) fn move_element(
    source: Option<&[u8]>,
    destination: Option<&[u8]>,
    same_key: bool,
    (from_head, to_head): (bool, bool),
    max_value_bytes: usize,
) -> Outcome<Option<(Vec<u8>, Option<Vec<u8>>, Option<Vec<u8>>)>> {
    let Some(mut elements) = list_of(source)?.filter(|elements| !elements.is_empty()) else {
        return Ok(None);
    };
    let mut target = if same_key { None } else { Some(list_of(destination)?.unwrap_or_default()) };
    let element = if from_head { elements.remove(0) } else { elements.pop().expect("a list is never empty") };
    let push = |list: &mut Vec<Vec<u8>>| {
        if to_head { list.insert(0, element.clone()) } else { list.push(element.clone()) }
    };
    match &mut target {
        None => push(&mut elements),
        Some(target) => push(target),
    }
    let encoded = |list: &[Vec<u8>]| -> Outcome<Option<Vec<u8>>> {
        match store(list, max_value_bytes, Reply::Nil)? {
            Change::Write(value, _, _) => Ok(value),
            Change::Keep(_) => Ok(None),
        }
    };
    let source_value = encoded(&elements)?;
    let destination_value = match &target {
        None => source_value.clone(),
        Some(target) => encoded(target)?,
    };
    Ok(Some((element, source_value, destination_value)))
}

/// The position `index` names in a list of `len` elements (negative: from the end), if any.
fn position(index: i64, len: usize) -> Option<usize> {
    let len = len as i64;
    let index = if index < 0 { len + index } else { index };
    (0..len).contains(&index).then_some(index as usize)
}

/// What list write `name` (one of [`is_list_write`]) decides from the value it finds; its
/// arguments are checked here, before anything is read.
pub(super) fn decision(name: &str, args: &[Vec<u8>], max_value_bytes: usize) -> Outcome<Decide> {
    let integer = |arg: &[u8]| parse_integer(arg).ok_or_else(not_an_integer);
    Ok(match name {
        "lpush" | "rpush" | "lpushx" | "rpushx" => {
            let pushed = args[2..].to_vec();
            let (head, only_if_present) = (name.starts_with('l'), name.ends_with('x'));
            Box::new(move |current, _| {
                let Some(mut elements) = list_of(current)?.or_else(|| (!only_if_present).then(Vec::new))
                else {
                    return Ok(Change::Keep(Reply::Integer(0)));
                };
                if head {
                    // Each element goes to the head in turn: the last given ends first.
                    elements.splice(0..0, pushed.iter().rev().cloned());
                } else {
                    elements.extend(pushed.iter().cloned());
                }
                let len = elements.len() as i64;
                store(&elements, max_value_bytes, Reply::Integer(len))
            })
        }
        "lpop" | "rpop" => {
            let count = match args.get(2) {
                None => None,
                Some(count) => {
                    let count = integer(count)?;
                    Some(
                        usize::try_from(count)
                            .map_err(|_| Reply::err("value is out of range, must be positive"))?,
                    )
                }
            };
            if args.len() > 3 {
                return Err(Reply::err("syntax error"));
            }
            let head = name == "lpop";
            Box::new(move |current, _| {
                let Some(mut elements) = list_of(current)? else {
                    return Ok(Change::Keep(if count.is_some() { Reply::NilArray } else { Reply::Nil }));
                };
                let taken = count.unwrap_or(1).min(elements.len());
                let popped: Vec<Vec<u8>> = if head {
                    elements.drain(..taken).collect()
                } else {
                    elements.drain(elements.len() - taken..).rev().collect()
                };
                let reply = match count {
                    None => Reply::optional(popped.into_iter().next()),
                    Some(_) => Reply::Array(popped.into_iter().map(Reply::Bulk).collect()),
                };
                if taken == 0 {
                    return Ok(Change::Keep(reply));
                }
                store(&elements, max_value_bytes, reply)
            })
        }
        "lset" => {
            let index = integer(&args[2])?;
            let element = args[3].clone();
            Box::new(move |current, _| {
                let Some(mut elements) = list_of(current)? else { return Err(Reply::err("no such key")) };
                let at = position(index, elements.len()).ok_or_else(|| Reply::err("index out of range"))?;
                elements[at] = element.clone();
                store(&elements, max_value_bytes, Reply::ok())
            })
        }
        "lrem" => {
            let count = integer(&args[2])?;
            let element = args[3].clone();
            Box::new(move |current, _| {
                let Some(mut elements) = list_of(current)? else {
                    return Ok(Change::Keep(Reply::Integer(0)));
                };
                let limit = if count == 0 {
                    usize::MAX
                } else {
                    usize::try_from(count.unsigned_abs()).unwrap_or(usize::MAX)
                };
                let mut matching: Vec<usize> =
                    elements.iter().enumerate().filter(|(_, e)| **e == element).map(|(i, _)| i).collect();
                if count < 0 {
                    matching.reverse();
                }
                matching.truncate(limit);
                if matching.is_empty() {
                    return Ok(Change::Keep(Reply::Integer(0)));
                }
                let removed = matching.len() as i64;
                matching.sort_unstable();
                for at in matching.into_iter().rev() {
                    elements.remove(at);
                }
                store(&elements, max_value_bytes, Reply::Integer(removed))
            })
        }
        "ltrim" => {
            let (start, stop) = (integer(&args[2])?, integer(&args[3])?);
            Box::new(move |current, _| {
                let Some(elements) = list_of(current)? else { return Ok(Change::Keep(Reply::ok())) };
                let kept = elements[types::rank_range(start, stop, elements.len())].to_vec();
                if kept.len() == elements.len() {
                    return Ok(Change::Keep(Reply::ok()));
                }
                store(&kept, max_value_bytes, Reply::ok())
            })
        }
        "linsert" => {
            let after = match args[2].to_ascii_uppercase().as_slice() {
                b"BEFORE" => false,
                b"AFTER" => true,
                _ => return Err(Reply::err("syntax error")),
            };
            let (pivot, element) = (args[3].clone(), args[4].clone());
            Box::new(move |current, _| {
                let Some(mut elements) = list_of(current)? else {
                    return Ok(Change::Keep(Reply::Integer(0)));
                };
                let Some(at) = elements.iter().position(|e| *e == pivot) else {
                    return Ok(Change::Keep(Reply::Integer(-1)));
                };
                elements.insert(at + usize::from(after), element.clone());
                let len = elements.len() as i64;
                store(&elements, max_value_bytes, Reply::Integer(len))
            })
        }
        other => return Err(Reply::err(format!("'{other}' is not a list write"))),
    })
}

/// The reply of list read `name` (one of [`is_list_read`]) given its key's value (`None`: absent).
pub(super) fn answer(name: &str, args: &[Vec<u8>], value: Option<&[u8]>) -> Outcome {
    let integer = |arg: &[u8]| parse_integer(arg).ok_or_else(not_an_integer);
    let elements = list_of(value)?.unwrap_or_default();
    Ok(match name {
        "llen" => Reply::Integer(elements.len() as i64),
        "lrange" => {
            let range = types::rank_range(integer(&args[2])?, integer(&args[3])?, elements.len());
            Reply::Array(elements[range].iter().cloned().map(Reply::Bulk).collect())
        }
        "lindex" => {
            let index = integer(&args[2])?;
            Reply::optional(position(index, elements.len()).map(|at| elements[at].clone()))
        }
        other => return Err(Reply::err(format!("'{other}' is not a list read"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::types::test_support::bulks;
    use crate::exec::types::wrong_type;

    fn write(command: &[&str], value: Option<Vec<u8>>) -> (Option<Vec<u8>>, Reply) {
        crate::exec::types::test_support::write(decision, command, value)
    }

    fn read(command: &[&str], value: &Option<Vec<u8>>) -> Reply {
        crate::exec::types::test_support::read(answer, command, value)
    }

    #[test]
    fn pushes_pops_and_edits_keep_list_order() {
        let (list, reply) = write(&["rpush", "l", "a", "b"], None);
        assert_eq!(reply, Reply::Integer(2));
        let (list, reply) = write(&["lpush", "l", "y", "z"], list);
        assert_eq!(reply, Reply::Integer(4));
        assert_eq!(read(&["lrange", "l", "0", "-1"], &list), bulks(&["z", "y", "a", "b"]));
        assert_eq!(read(&["lrange", "l", "-2", "100"], &list), bulks(&["a", "b"]));
        assert_eq!(read(&["lrange", "l", "3", "1"], &list), bulks(&[]));
        assert_eq!(read(&["lindex", "l", "-1"], &list), Reply::text("b"));
        assert_eq!(read(&["lindex", "l", "9"], &list), Reply::Nil);
        let (list, reply) = write(&["linsert", "l", "AFTER", "y", "x"], list);
        assert_eq!(reply, Reply::Integer(5));
        assert_eq!(write(&["linsert", "l", "before", "nope", "x"], list.clone()).1, Reply::Integer(-1));
        let (list, reply) = write(&["lset", "l", "0", "first"], list);
        assert_eq!(reply, Reply::ok());
        assert_eq!(write(&["lset", "l", "10", "v"], list.clone()).1, Reply::err("index out of range"));
        assert_eq!(write(&["lset", "l", "0", "v"], None).1, Reply::err("no such key"));
        assert_eq!(read(&["lrange", "l", "0", "-1"], &list), bulks(&["first", "y", "x", "a", "b"]));
        let (list, reply) = write(&["rpop", "l", "2"], list);
        assert_eq!(reply, bulks(&["b", "a"]));
        let (list, reply) = write(&["lpop", "l"], list);
        assert_eq!(reply, Reply::text("first"));
        let (list, reply) = write(&["rpush", "l", "y", "q", "y"], list);
        assert_eq!(reply, Reply::Integer(5));
        let (list, reply) = write(&["lrem", "l", "-2", "y"], list);
        assert_eq!(reply, Reply::Integer(2));
        assert_eq!(read(&["lrange", "l", "0", "-1"], &list), bulks(&["y", "x", "q"]));
        let (list, _) = write(&["ltrim", "l", "1", "-1"], list);
        assert_eq!(read(&["llen", "l"], &list), Reply::Integer(2));
        let (list, _) = write(&["ltrim", "l", "5", "10"], list);
        assert_eq!(list, None, "trimming everything deletes the key");
        assert_eq!(write(&["lpushx", "l", "a"], None), (None, Reply::Integer(0)));
        assert_eq!(write(&["lpop", "l", "2"], None).1, Reply::NilArray);
        assert_eq!(write(&["lpop", "l"], None).1, Reply::Nil);
        assert_eq!(
            write(&["lpop", "l", "-1"], None).1,
            Reply::err("value is out of range, must be positive")
        );
        assert_eq!(write(&["rpush", "l", "a"], Some(b"string".to_vec())).1, wrong_type());
        assert_eq!(read(&["llen", "l"], &Some(b"string".to_vec())), wrong_type());
    }
}
