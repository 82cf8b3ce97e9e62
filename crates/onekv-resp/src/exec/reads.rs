//! Commands that only read their keys' values, beyond the plain GET family: GETRANGE (SUBSTR),
//! GETBIT, BITCOUNT, BITPOS, LCS, TYPE, TOUCH, OBJECT and MEMORY, and the collections' reads
//! (answered by `hashes`, `sets`, `lists` and `zsets`). (GETEX and the TTL family are `expiry`'s.)
//!
//! Owns: each command's reply as a function of the values of its keys ([`answer_read`]), so a
//! command gives the same answer alone (its keys read linearizably, [`RespContext::read_command`])
//! and inside a transaction (against the transaction's snapshot).

use super::bytes::{self, BitRange};
use super::types::{self, Kind, kind_of, string_value};
use super::{Outcome, RespContext, not_an_integer, parse_integer, unknown_subcommand, wrong_arity};
use super::{hashes, lists, sets, zsets};
use crate::commands::CommandSpec;
use crate::protocol::Reply;

/// Most cells of LCS's table (four bytes each): two strings whose lengths multiply to more are
/// refused rather than costing the node gigabytes.
const MAX_LCS_CELLS: usize = 1 << 24;

/// Whether `name` is one of the commands [`answer_read`] answers.
pub(super) fn is_value_read(name: &str) -> bool {
    hashes::is_hash_read(name)
        || sets::is_set_read(name)
        || lists::is_list_read(name)
        || zsets::is_zset_read(name)
        || matches!(
            name,
            "getrange"
                | "substr"
                | "getbit"
                | "bitcount"
                | "bitpos"
                | "lcs"
                | "type"
                | "touch"
                | "object"
                | "memory"
        )
}

impl RespContext {
    /// Runs a command of [`is_value_read`]: reads its keys (linearizably), then answers.
    pub(super) async fn read_command(&self, spec: &CommandSpec, args: &[Vec<u8>]) -> Outcome {
        let keys: Vec<Vec<u8>> = spec.key_arguments(args).cloned().collect();
        let values = self.get_many(&keys, true).await?;
        let bounds = self.read_bounds();
        if is_heavy(spec.name) {
            // Off the runtime's workers, so other connections are not held up meanwhile.
            let (name, args) = (spec.name, args.to_vec());
            return tokio::task::spawn_blocking(move || {
                let values: Vec<Option<&[u8]>> = values.iter().map(Option::as_deref).collect();
                answer_read(name, &args, &values, bounds)
            })
            .await
            .map_err(|error| Reply::err(format!("onekv: {error}")));
        }
        let values: Vec<Option<&[u8]>> = values.iter().map(Option::as_deref).collect();
        Ok(answer_read(spec.name, args, &values, bounds))
    }

    /// What [`answer_read`] needs of the node's settings.
    pub(super) fn read_bounds(&self) -> ReadBounds {
        ReadBounds {
            max_value_bytes: self.shared.settings.max_value_bytes,
            encodings: *self.shared.encodings.lock().unwrap_or_else(|poisoned| poisoned.into_inner()),
        }
    }
}

/// The node's settings a read's answer depends on.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReadBounds {
    /// `limits.max_value_bytes`: bit offsets are bounded as values are.
    pub max_value_bytes: usize,
    /// What OBJECT ENCODING calls a collection (CONFIG SET hash-max-listpack-*, ...).
    pub encodings: types::Encodings,
}

/// Whether command `name` may compute for long (LCS: up to [`MAX_LCS_CELLS`] table cells, tens of
/// milliseconds), so it runs on a blocking thread rather than a runtime worker.
pub(super) fn is_heavy(name: &str) -> bool {
    name == "lcs"
}

/// The reply of read command `name` (one of [`is_value_read`]) given `values`, the values of its
/// key arguments in order (`None`: absent).
pub(super) fn answer_read(
    name: &str,
    args: &[Vec<u8>],
    values: &[Option<&[u8]>],
    bounds: ReadBounds,
) -> Reply {
    answer(name, args, values, bounds).unwrap_or_else(|error| error)
}

fn answer(name: &str, args: &[Vec<u8>], values: &[Option<&[u8]>], bounds: ReadBounds) -> Outcome {
    let max_value_bytes = bounds.max_value_bytes;
    let found = values.first().copied().flatten();
    match name {
        name if hashes::is_hash_read(name) => return hashes::answer(name, args, found),
        name if sets::is_set_read(name) => return sets::answer(name, args, values),
        name if lists::is_list_read(name) => return lists::answer(name, args, found),
        name if zsets::is_zset_read(name) => return zsets::answer(name, args, found),
        "type" => return Ok(Reply::Simple(types::type_name(found).into())),
        "touch" => return Ok(Reply::Integer(values.iter().filter(|value| value.is_some()).count() as i64)),
        "object" => return object(args, found, bounds.encodings),
        "memory" => return memory(args, found),
        _ => {}
    }
    // The rest read strings: a collection is the wrong type.
    for value in values {
        string_value(*value)?;
    }
    let value = found;
    let integer = |arg: &[u8]| parse_integer(arg).ok_or_else(not_an_integer);
    Ok(match name {
        "getrange" | "substr" => {
            let (start, end) = (integer(&args[2])?, integer(&args[3])?);
            Reply::Bulk(bytes::get_range(value.unwrap_or_default(), start, end))
        }
        "getbit" => {
            let offset = bit_offset(&args[2], max_value_bytes)?;
            Reply::Integer(i64::from(bytes::get_bit(value.unwrap_or_default(), offset)))
        }
        "bitcount" => {
            let range = match &args[2..] {
                [] => None,
                [start, end, unit @ ..] => Some(bit_range(start, end, unit)?),
                _ => return Err(Reply::err("syntax error")),
            };
            Reply::Integer(bytes::bit_count(value.unwrap_or_default(), range) as i64)
        }
        "bitpos" => {
            let bit = match args[2].as_slice() {
                b"0" => false,
                b"1" => true,
                _ if parse_integer(&args[2]).is_none() => return Err(not_an_integer()),
                _ => return Err(Reply::err("The bit argument must be 1 or 0.")),
            };
            let (range, end_given) = match &args[3..] {
                [] => (None, false),
                [start] => (Some(BitRange { start: integer(start)?, end: -1, in_bits: false }), false),
                [start, end, unit @ ..] if unit.len() <= 1 => (Some(bit_range(start, end, unit)?), true),
                _ => return Err(Reply::err("syntax error")),
            };
            match value {
                None => Reply::Integer(if bit { -1 } else { 0 }),
                Some(value) => Reply::Integer(bytes::bit_position(value, bit, range, end_given)),
            }
        }
        "lcs" => lcs(args, value.unwrap_or_default(), values.get(1).copied().flatten().unwrap_or_default())?,
        other => return Err(Reply::err(format!("'{other}' is not a read"))),
    })
}

/// A bit offset as GETBIT and SETBIT accept it: an integer from 0 to the last bit of the largest
/// value the node stores.
pub(super) fn bit_offset(arg: &[u8], max_value_bytes: usize) -> Outcome<usize> {
    parse_integer(arg)
        .and_then(|offset| usize::try_from(offset).ok())
        .filter(|&offset| offset / 8 < max_value_bytes)
        .ok_or_else(|| Reply::err("bit offset is not an integer or out of range"))
}

/// BITCOUNT's and BITPOS's `start end [BYTE|BIT]`.
fn bit_range(start: &[u8], end: &[u8], unit: &[Vec<u8>]) -> Outcome<BitRange> {
    let (start, end) =
        (parse_integer(start).ok_or_else(not_an_integer)?, parse_integer(end).ok_or_else(not_an_integer)?);
    let in_bits = match unit {
        [] => false,
        [unit] if unit.eq_ignore_ascii_case(b"BYTE") => false,
        [unit] if unit.eq_ignore_ascii_case(b"BIT") => true,
        _ => return Err(Reply::err("syntax error")),
    };
    Ok(BitRange { start, end, in_bits })
}

/// `LCS key1 key2 [LEN] [IDX] [MINMATCHLEN len] [WITHMATCHLEN]` on the two values.
fn lcs(args: &[Vec<u8>], a: &[u8], b: &[u8]) -> Outcome {
    let (mut len_only, mut indexes, mut with_match_len, mut min_match_len) = (false, false, false, 0usize);
    let mut options = args[3..].iter();
    while let Some(option) = options.next() {
        match option.to_ascii_uppercase().as_slice() {
            b"LEN" => len_only = true,
            b"IDX" => indexes = true,
            b"WITHMATCHLEN" => with_match_len = true,
            b"MINMATCHLEN" => {
                let value = options.next().ok_or_else(|| Reply::err("syntax error"))?;
                let value = parse_integer(value).ok_or_else(not_an_integer)?;
                min_match_len = usize::try_from(value).unwrap_or(0);
            }
            _ => return Err(Reply::err("syntax error")),
        }
    }
    if len_only && indexes {
        return Err(Reply::err("If you want both the length and indexes, please just use IDX."));
    }
    if (a.len() + 1).saturating_mul(b.len() + 1) > MAX_LCS_CELLS {
        return Err(Reply::err(format!(
            "onekv: LCS of values of {} and {} bytes would need a table of more than {MAX_LCS_CELLS} cells",
            a.len(),
            b.len()
        )));
    }
    let (common, matches) = bytes::longest_common_subsequence(a, b);
    if len_only {
        return Ok(Reply::Integer(common.len() as i64));
    }
    if !indexes {
        return Ok(Reply::Bulk(common));
    }
    let pair = |(start, end): (usize, usize)| {
        Reply::Array(vec![Reply::Integer(start as i64), Reply::Integer(end as i64)])
    };
    let matches = matches
        .into_iter()
        .filter(|run| run.len() >= min_match_len)
        .map(|run| {
            let mut item = vec![pair(run.a), pair(run.b)];
            if with_match_len {
                item.push(Reply::Integer(run.len() as i64));
            }
            Reply::Array(item)
        })
        .collect();
    Ok(Reply::map([("matches", Reply::Array(matches)), ("len", Reply::Integer(common.len() as i64))]))
}

/// `OBJECT ENCODING|REFCOUNT|IDLETIME|FREQ|HELP`.
fn object(args: &[Vec<u8>], value: Option<&[u8]>, encodings: types::Encodings) -> Outcome {
    let subcommand = args[1].to_ascii_uppercase();
    match (subcommand.as_slice(), args.len()) {
        (b"HELP", 2) => Ok(Reply::Array(
            [
                "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "ENCODING <key>",
                "    Return the kind of internal representation used in order to store the value",
                "    associated with a <key>.",
                "REFCOUNT <key>",
                "    Return the number of references of the value associated with the specified",
                "    <key>.",
                "IDLETIME <key>",
                "    Onekv does not track access times: always 0.",
                "HELP",
                "    Print this help.",
            ]
            .into_iter()
            .map(|line| Reply::Simple(line.into()))
            .collect(),
        )),
        (b"ENCODING" | b"REFCOUNT" | b"IDLETIME", 3) => Ok(match (subcommand.as_slice(), value) {
            (_, None) => Reply::Nil,
            (b"ENCODING", Some(value)) => Reply::text(match kind_of(value) {
                Kind::Hash => hashes::encoding(value, encodings.hash_entries, encodings.hash_value),
                Kind::Set => sets::encoding(value, encodings.set_intset_entries),
                // Redis 7.0 keeps every list as a quicklist.
                Kind::List => "quicklist",
                Kind::Zset => zsets::encoding(value, encodings.zset_entries, encodings.zset_value),
                Kind::String => bytes::encoding(value),
            }),
            (b"REFCOUNT", Some(value)) => Reply::Integer(bytes::reference_count(value)),
            _ => Reply::Integer(0),
        }),
        (b"FREQ", 3) => Err(Reply::err(
            "An LFU maxmemory policy is not selected, access frequency not tracked. \
             Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust.",
        )),
        (b"ENCODING" | b"REFCOUNT" | b"IDLETIME" | b"FREQ", _) => Err(wrong_arity("object|encoding")),
        _ => Err(unknown_subcommand(&args[1], "OBJECT")),
    }
}

/// Bytes MEMORY USAGE counts per key beyond its key and value: about what Redis spends on a key's
/// dictionary entry, object header and string headers.
const MEMORY_OVERHEAD_PER_KEY: usize = 56;

/// `MEMORY USAGE key [SAMPLES count]` and `MEMORY HELP`. onekv keeps a key's value on disk, not in
/// memory, so USAGE reports what the key would take in a store that holds it: its key, its value
/// and a fixed overhead.
fn memory(args: &[Vec<u8>], value: Option<&[u8]>) -> Outcome {
    let subcommand = args[1].to_ascii_uppercase();
    match subcommand.as_slice() {
        b"HELP" if args.len() == 2 => Ok(Reply::Array(
            [
                "MEMORY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "USAGE <key> [SAMPLES <count>]",
                "    Return the bytes the key and its value take (key, value and a fixed overhead).",
                "HELP",
                "    Print this help.",
            ]
            .into_iter()
            .map(|line| Reply::Simple(line.into()))
            .collect(),
        )),
        b"USAGE" if args.len() == 3 || args.len() == 5 => {
            if args.len() == 5 {
                if !args[3].eq_ignore_ascii_case(b"SAMPLES") {
                    return Err(Reply::err("syntax error"));
                }
                parse_integer(&args[4]).filter(|&samples| samples >= 0).ok_or_else(not_an_integer)?;
            }
            Ok(value.map_or(Reply::Nil, |value| {
                Reply::Integer((args[2].len() + value.len() + MEMORY_OVERHEAD_PER_KEY) as i64)
            }))
        }
        b"USAGE" => Err(Reply::err("syntax error")),
        _ => Err(unknown_subcommand(&args[1], "MEMORY")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(items: &[&str]) -> Vec<Vec<u8>> {
        items.iter().map(|item| item.as_bytes().to_vec()).collect()
    }

    fn read(command: &[&str], values: &[Option<&str>]) -> Reply {
        let values: Vec<Option<&[u8]>> = values.iter().map(|value| value.map(str::as_bytes)).collect();
        let bounds = ReadBounds { max_value_bytes: 1 << 20, encodings: types::Encodings::default() };
        answer_read(&command[0].to_ascii_lowercase(), &args(command), &values, bounds)
    }

    #[test]
    fn reads_answer_from_the_values() {
        assert_eq!(read(&["GETRANGE", "k", "0", "3"], &[Some("This is a string")]), Reply::text("This"));
        assert_eq!(read(&["GETRANGE", "k", "0", "3"], &[None]), Reply::text(""));
        assert_eq!(read(&["GETRANGE", "k", "x", "3"], &[None]), not_an_integer());
        assert_eq!(read(&["GETBIT", "k", "1"], &[Some("@")]), Reply::Integer(1));
        assert_eq!(
            read(&["GETBIT", "k", "-1"], &[None]),
            Reply::err("bit offset is not an integer or out of range")
        );
        assert_eq!(read(&["BITCOUNT", "k"], &[Some("foobar")]), Reply::Integer(26));
        assert_eq!(read(&["BITCOUNT", "k", "5", "30", "BIT"], &[Some("foobar")]), Reply::Integer(17));
        assert_eq!(read(&["BITCOUNT", "k", "1"], &[Some("foobar")]), Reply::err("syntax error"));
        assert_eq!(read(&["BITPOS", "k", "0"], &[None]), Reply::Integer(0));
        assert_eq!(read(&["BITPOS", "k", "1"], &[None]), Reply::Integer(-1));
        assert_eq!(read(&["BITPOS", "k", "2"], &[None]), Reply::err("The bit argument must be 1 or 0."));
        assert_eq!(read(&["TYPE", "k"], &[Some("v")]), Reply::Simple("string".into()));
        assert_eq!(read(&["TYPE", "k"], &[None]), Reply::Simple("none".into()));
        assert_eq!(read(&["TOUCH", "a", "b", "c"], &[Some("1"), None, Some("")]), Reply::Integer(2));
        assert_eq!(read(&["OBJECT", "ENCODING", "k"], &[Some("123")]), Reply::text("int"));
        assert_eq!(read(&["OBJECT", "ENCODING", "k"], &[None]), Reply::Nil);
        assert!(read(&["OBJECT", "NOPE", "k"], &[None]).is_error());
    }

    #[test]
    fn lcs_replies() {
        let values = [Some("ohmytext"), Some("mynewtext")];
        assert_eq!(read(&["LCS", "a", "b"], &values), Reply::text("mytext"));
        assert_eq!(read(&["LCS", "a", "b", "LEN"], &values), Reply::Integer(6));
        let range = |start, end| Reply::Array(vec![Reply::Integer(start), Reply::Integer(end)]);
        assert_eq!(
            read(&["LCS", "a", "b", "IDX", "MINMATCHLEN", "4", "WITHMATCHLEN"], &values),
            Reply::map([
                (
                    "matches",
                    Reply::Array(vec![Reply::Array(vec![range(4, 7), range(5, 8), Reply::Integer(4)])])
                ),
                ("len", Reply::Integer(6)),
            ])
        );
        assert!(read(&["LCS", "a", "b", "LEN", "IDX"], &values).is_error());
        let long = "x".repeat(5000);
        assert!(read(&["LCS", "a", "b"], &[Some(&long), Some(&long)]).is_error());
    }
}
