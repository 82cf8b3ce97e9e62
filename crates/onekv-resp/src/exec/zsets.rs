//! Redis sorted sets (ZADD, ZRANGE, ZSCORE, ...).
//!
//! A sorted set is one onekv value, stored as a hash is (`hashes`): the sorted-set marker, then its
//! entries in order of score, then member, each as its score (the eight bytes of the IEEE 754
//! double, little-endian) and its member (`types`' item encoding, two items an entry). So it lives
//! in its key's shard, every read of it is one linearizable read, and every write is a
//! read-modify-write through the combiner that rewrites the whole set (at most
//! `limits.max_value_bytes` encoded).
//!
//! Owns: each sorted-set command's reply and new value as a function of the value found
//! ([`decision`] for writes, [`answer`] for reads), score and range parsing, and rank order. Does
//! not own reading or swapping (`combine`, `reads`), the types (`types`) or the table (`commands`).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use super::combine::{Change, Decide};
use super::types::{self, Kind, ZSET_MARKER};
use super::{Outcome, not_an_integer, parse_integer};
use crate::protocol::Reply;

/// A sorted set: each member's score. Rank order is [`ranked`]'s.
pub(super) type Scores = BTreeMap<Vec<u8>, f64>;

/// Whether `name` is a sorted-set command that writes: decided by [`decision`].
pub(super) fn is_zset_write(name: &str) -> bool {
    matches!(
        name,
        "zadd"
            | "zincrby"
            | "zrem"
            | "zpopmin"
            | "zpopmax"
            | "zremrangebyscore"
            | "zremrangebyrank"
            | "zremrangebylex"
    )
}

/// Whether `name` is a sorted-set command that only reads: answered by [`answer`].
pub(super) fn is_zset_read(name: &str) -> bool {
    matches!(
        name,
        "zscore"
            | "zmscore"
            | "zcard"
            | "zcount"
            | "zlexcount"
            | "zrank"
            | "zrevrank"
            | "zrange"
            | "zrangebyscore"
            | "zrevrangebyscore"
            | "zrevrange"
            | "zrangebylex"
            | "zrevrangebylex"
            | "zscan"
    )
}

/// Members in rank order: by score, then by member bytes.
pub(super) fn ranked(scores: &Scores) -> Vec<(&Vec<u8>, f64)> {
    let mut entries: Vec<(&Vec<u8>, f64)> = scores.iter().map(|(member, score)| (member, *score)).collect();
    entries.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(b.0)));
    entries
}

/// The encoded sorted set of `scores`: the marker, then each entry in rank order.
pub(super) fn encode(scores: &Scores) -> Vec<u8> {
    let entries = ranked(scores);
    let score_bytes: Vec<[u8; 8]> = entries.iter().map(|(_, score)| score.to_le_bytes()).collect();
    let items =
        entries.iter().zip(&score_bytes).flat_map(|((member, _), score)| [&score[..], member.as_slice()]);
    types::encode_items(ZSET_MARKER, entries.len(), items)
}

/// The scores of an encoded sorted set; an error if it does not decode, an entry is out of rank
/// order, a member repeats or a score is not a number.
pub(super) fn decode(value: &[u8]) -> Outcome<Scores> {
    let items = types::decode_items(value, ZSET_MARKER, 2)?;
    let mut scores = Scores::new();
    let mut previous: Option<(f64, &[u8])> = None;
    for pair in items.chunks_exact(2) {
        let bytes: [u8; 8] = pair[0].try_into().map_err(|_| types::damaged("a score is not 8 bytes"))?;
        let (score, member) = (f64::from_le_bytes(bytes), pair[1]);
        let in_order = previous.is_none_or(|(score_before, member_before)| {
            score_before.total_cmp(&score).then_with(|| member_before.cmp(member)) == Ordering::Less
        });
        if score.is_nan() || !in_order || scores.insert(member.to_vec(), score).is_some() {
            return Err(types::damaged("entries out of order"));
        }
        previous = Some((score, member));
    }
    Ok(scores)
}

/// The scores of `value` as a sorted-set command finds them: none for an absent key,
/// [`wrong_type`] for another type.
fn zset_of(value: Option<&[u8]>) -> Outcome<Scores> {
    Ok(types::decode_as(value, Kind::Zset, decode)?.unwrap_or_default())
}

/// The write of `scores` as the key's new value (`types::store`).
fn store(scores: &Scores, max_value_bytes: usize, reply: Reply) -> Outcome<Change> {
    let encoded = (!scores.is_empty()).then(|| encode(scores));
    types::store(encoded, max_value_bytes, "sorted set", reply)
}

/// A score as Redis parses one: a decimal or exponent number, `inf`, `+inf` or `-inf`; never NaN.
pub(super) fn parse_score(text: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(text).ok()?;
    if text.is_empty() || text.bytes().any(|byte| byte.is_ascii_whitespace()) {
        return None;
    }
    let lower = text.to_ascii_lowercase();
    let score = match lower.as_str() {
        "inf" | "+inf" | "infinity" | "+infinity" => f64::INFINITY,
        "-inf" | "-infinity" => f64::NEG_INFINITY,
        _ if lower.contains("inf") || lower.contains("nan") => return None,
        _ => lower.parse::<f64>().ok()?,
    };
    // -0 and 0 are one score.
    (!score.is_nan()).then_some(if score == 0.0 { 0.0 } else { score })
}

fn not_a_float() -> Reply {
    Reply::err("value is not a valid float")
}

/// One end of a score range (`ZRANGEBYSCORE`'s min and max): a score, `(` before it for an
/// exclusive end.
#[derive(Debug, Clone, Copy)]
struct ScoreBound {
    score: f64,
    exclusive: bool,
}

impl ScoreBound {
    fn parse(text: &[u8]) -> Outcome<ScoreBound> {
        let (text, exclusive) = match text.strip_prefix(b"(") {
            Some(rest) => (rest, true),
            None => (text, false),
        };
        let score = parse_score(text).ok_or_else(|| Reply::err("min or max is not a float"))?;
        Ok(ScoreBound { score, exclusive })
    }

    fn above_min(self, score: f64) -> bool {
        if self.exclusive { score > self.score } else { score >= self.score }
    }

    fn below_max(self, score: f64) -> bool {
        if self.exclusive { score < self.score } else { score <= self.score }
    }
}

/// One end of a lexicographic range: `-`, `+`, or a member after `[` (inclusive) or `(`.
#[derive(Debug, Clone)]
enum LexBound {
    Least,
    Greatest,
    Member(Vec<u8>, bool),
}

impl LexBound {
    fn parse(text: &[u8]) -> Outcome<LexBound> {
        match text {
            b"-" => Ok(LexBound::Least),
            b"+" => Ok(LexBound::Greatest),
            [b'[', rest @ ..] => Ok(LexBound::Member(rest.to_vec(), false)),
            [b'(', rest @ ..] => Ok(LexBound::Member(rest.to_vec(), true)),
            _ => Err(Reply::err("min or max not valid string range item")),
        }
    }

    fn above_min(&self, member: &[u8]) -> bool {
        match self {
            LexBound::Least => true,
            LexBound::Greatest => false,
            LexBound::Member(bound, exclusive) => {
                member > bound.as_slice() || (!exclusive && member == bound.as_slice())
            }
        }
    }

    fn below_max(&self, member: &[u8]) -> bool {
        match self {
            LexBound::Least => false,
            LexBound::Greatest => true,
            LexBound::Member(bound, exclusive) => {
                member < bound.as_slice() || (!exclusive && member == bound.as_slice())
            }
        }
    }
}

/// What a range selects entries by.
enum RangeBy {
    Rank(i64, i64),
    Score(ScoreBound, ScoreBound),
    Lex(LexBound, LexBound),
}

/// A parsed range query: ZRANGE's forms and the older ZRANGEBYSCORE, ZREVRANGE, ... commands.
struct RangeQuery {
    by: RangeBy,
    reverse: bool,
    /// `LIMIT offset count` (a negative count: all).
    limit: Option<(i64, i64)>,
    with_scores: bool,
}

impl RangeQuery {
    /// Parses `name`'s arguments after the key (`args[2..]`).
    fn parse(name: &str, args: &[Vec<u8>]) -> Outcome<RangeQuery> {
        let syntax = || Reply::err("syntax error");
        let (mut by_score, mut by_lex, mut reverse) = match name {
            "zrangebyscore" => (true, false, false),
            "zrevrangebyscore" => (true, false, true),
            "zrangebylex" => (false, true, false),
            "zrevrangebylex" => (false, true, true),
            "zrevrange" => (false, false, true),
            _ => (false, false, false),
        };
        let (mut limit, mut with_scores) = (None, false);
        let mut options = args[4..].iter();
        while let Some(option) = options.next() {
            match option.to_ascii_uppercase().as_slice() {
                b"WITHSCORES" if !matches!(name, "zrangebylex" | "zrevrangebylex") => with_scores = true,
                b"BYSCORE" if name == "zrange" => by_score = true,
                b"BYLEX" if name == "zrange" => by_lex = true,
                b"REV" if name == "zrange" => reverse = true,
                b"LIMIT" if name != "zrevrange" => {
                    let offset = options.next().ok_or_else(syntax)?;
                    let count = options.next().ok_or_else(syntax)?;
                    let integer = |arg: &[u8]| parse_integer(arg).ok_or_else(not_an_integer);
                    limit = Some((integer(offset)?, integer(count)?));
                }
                _ => return Err(syntax()),
            }
        }
        if by_score && by_lex {
            return Err(syntax());
        }
        if limit.is_some() && !by_score && !by_lex {
            return Err(Reply::err(
                "syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX",
            ));
        }
        if with_scores && by_lex {
            return Err(Reply::err("syntax error, WITHSCORES not supported in combination with BYLEX"));
        }
        // The reversed forms name the larger end first.
        let (low, high) =
            if reverse && (by_score || by_lex) { (&args[3], &args[2]) } else { (&args[2], &args[3]) };
        let by = if by_score {
            RangeBy::Score(ScoreBound::parse(low)?, ScoreBound::parse(high)?)
        } else if by_lex {
            RangeBy::Lex(LexBound::parse(low)?, LexBound::parse(high)?)
        } else {
            let integer = |arg: &[u8]| parse_integer(arg).ok_or_else(not_an_integer);
            RangeBy::Rank(integer(&args[2])?, integer(&args[3])?)
        };
        Ok(RangeQuery { by, reverse, limit, with_scores })
    }

    /// The entries the query selects, in reply order.
    fn select<'a>(&self, scores: &'a Scores) -> Vec<(&'a Vec<u8>, f64)> {
        let mut entries = ranked(scores);
        if self.reverse {
            entries.reverse();
        }
        let selected: Vec<(&Vec<u8>, f64)> = match &self.by {
            RangeBy::Rank(start, stop) => {
                let range = types::rank_range(*start, *stop, entries.len());
                entries[range].to_vec()
            }
            RangeBy::Score(min, max) => entries
                .into_iter()
                .filter(|(_, score)| min.above_min(*score) && max.below_max(*score))
                .collect(),
            RangeBy::Lex(min, max) => entries
                .into_iter()
                .filter(|(member, _)| min.above_min(member) && max.below_max(member))
                .collect(),
        };
        match self.limit {
            None => selected,
            Some((offset, _)) if offset < 0 => Vec::new(),
            Some((offset, count)) => {
                let taken = usize::try_from(count).unwrap_or(usize::MAX);
                selected.into_iter().skip(offset as usize).take(taken).collect()
            }
        }
    }
}

/// The reply of selected entries, with their scores when asked: flat in RESP2, pairs in RESP3.
fn entries_reply(entries: Vec<(&Vec<u8>, f64)>, with_scores: bool) -> Reply {
    if with_scores {
        Reply::Pairs(
            entries
                .into_iter()
                .map(|(member, score)| (Reply::Bulk(member.clone()), Reply::double(score)))
                .collect(),
        )
    } else {
        Reply::Array(entries.into_iter().map(|(member, _)| Reply::Bulk(member.clone())).collect())
    }
}

/// A score and a member, as ZADD gives them.
type ScoredMember = (f64, Vec<u8>);

/// ZADD's options.
#[derive(Default)]
struct AddOptions {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
    ch: bool,
    incr: bool,
}

/// What sorted-set write `name` (one of [`is_zset_write`]) decides from the value it finds; its
/// arguments are checked here, before anything is read.
pub(super) fn decision(name: &str, args: &[Vec<u8>], max_value_bytes: usize) -> Outcome<Decide> {
    Ok(match name {
        "zadd" | "zincrby" => {
            let (options, pairs) = if name == "zincrby" {
                if args.len() != 4 {
                    return Err(super::wrong_arity(name));
                }
                let options = AddOptions { incr: true, ..AddOptions::default() };
                (options, vec![(parse_score(&args[2]).ok_or_else(not_a_float)?, args[3].clone())])
            } else {
                parse_add(args)?
            };
            Box::new(move |current, _| {
                let mut scores = zset_of(current)?;
                let (mut added, mut changed) = (0, 0);
                let mut incremented = None;
                for (score, member) in &pairs {
                    let old = scores.get(member).copied();
                    if (options.nx && old.is_some()) || (options.xx && old.is_none()) {
                        continue;
                    }
                    let mut new = *score;
                    if options.incr {
                        new += old.unwrap_or(0.0);
                        if new.is_nan() {
                            return Err(Reply::err("resulting score is not a number (NaN)"));
                        }
                    }
                    if let Some(old) = old
                        && ((options.gt && new <= old) || (options.lt && new >= old))
                    {
                        continue;
                    }
                    match old {
                        None => added += 1,
                        Some(old) if old != new => changed += 1,
                        Some(_) => {}
                    }
                    scores.insert(member.clone(), if new == 0.0 { 0.0 } else { new });
                    incremented = Some(new);
                }
                let reply = match (options.incr, incremented) {
                    (true, Some(score)) => Reply::double(score),
                    (true, None) => Reply::Nil,
                    (false, _) => Reply::Integer(if options.ch { added + changed } else { added }),
                };
                if added + changed == 0 {
                    return Ok(Change::Keep(reply));
                }
                store(&scores, max_value_bytes, reply)
            })
        }
        "zrem" => {
            let doomed = args[2..].to_vec();
            Box::new(move |current, _| {
                let mut scores = zset_of(current)?;
                let removed = doomed.iter().filter(|member| scores.remove(*member).is_some()).count() as i64;
                if removed == 0 {
                    return Ok(Change::Keep(Reply::Integer(0)));
                }
                store(&scores, max_value_bytes, Reply::Integer(removed))
            })
        }
        "zpopmin" | "zpopmax" => {
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
            let highest = name == "zpopmax";
            Box::new(move |current, _| {
                let mut scores = zset_of(current)?;
                let mut entries = ranked(&scores);
                if highest {
                    entries.reverse();
                }
                let popped: Vec<(Vec<u8>, f64)> = entries
                    .into_iter()
                    .take(count.unwrap_or(1))
                    .map(|(member, score)| (member.clone(), score))
                    .collect();
                for (member, _) in &popped {
                    scores.remove(member);
                }
                let reply = if count.is_some() {
                    Reply::Pairs(
                        popped.iter().map(|(m, s)| (Reply::Bulk(m.clone()), Reply::double(*s))).collect(),
                    )
                } else {
                    Reply::Array(
                        popped
                            .iter()
                            .flat_map(|(m, s)| [Reply::Bulk(m.clone()), Reply::double(*s)])
                            .collect(),
                    )
                };
                if popped.is_empty() {
                    return Ok(Change::Keep(reply));
                }
                store(&scores, max_value_bytes, reply)
            })
        }
        "zremrangebyscore" | "zremrangebyrank" | "zremrangebylex" => {
            let by = match name {
                "zremrangebyscore" => {
                    RangeBy::Score(ScoreBound::parse(&args[2])?, ScoreBound::parse(&args[3])?)
                }
                "zremrangebylex" => RangeBy::Lex(LexBound::parse(&args[2])?, LexBound::parse(&args[3])?),
                _ => {
                    let integer = |arg: &[u8]| parse_integer(arg).ok_or_else(not_an_integer);
                    RangeBy::Rank(integer(&args[2])?, integer(&args[3])?)
                }
            };
            let query = RangeQuery { by, reverse: false, limit: None, with_scores: false };
            Box::new(move |current, _| {
                let mut scores = zset_of(current)?;
                let doomed: Vec<Vec<u8>> =
                    query.select(&scores).into_iter().map(|(member, _)| member.clone()).collect();
                if doomed.is_empty() {
                    return Ok(Change::Keep(Reply::Integer(0)));
                }
                for member in &doomed {
                    scores.remove(member);
                }
                store(&scores, max_value_bytes, Reply::Integer(doomed.len() as i64))
            })
        }
        other => return Err(Reply::err(format!("'{other}' is not a sorted-set write"))),
    })
}

/// ZADD's options and its score/member pairs (`args[2..]`), checked as Redis checks them.
fn parse_add(args: &[Vec<u8>]) -> Outcome<(AddOptions, Vec<ScoredMember>)> {
    let mut options = AddOptions::default();
    let mut at = 2;
    while let Some(option) = args.get(at) {
        match option.to_ascii_uppercase().as_slice() {
            b"NX" => options.nx = true,
            b"XX" => options.xx = true,
            b"GT" => options.gt = true,
            b"LT" => options.lt = true,
            b"CH" => options.ch = true,
            b"INCR" => options.incr = true,
            _ => break,
        }
        at += 1;
    }
    let rest = &args[at..];
    if rest.is_empty() || !rest.len().is_multiple_of(2) {
        return Err(Reply::err("syntax error"));
    }
    if options.nx && options.xx {
        return Err(Reply::err("XX and NX options at the same time are not compatible"));
    }
    if [options.gt, options.lt, options.nx].iter().filter(|set| **set).count() > 1 {
        return Err(Reply::err("GT, LT, and/or NX options at the same time are not compatible"));
    }
    if options.incr && rest.len() > 2 {
        return Err(Reply::err("INCR option supports a single increment-element pair"));
    }
    let pairs = rest
        .chunks_exact(2)
        .map(|pair| Ok((parse_score(&pair[0]).ok_or_else(not_a_float)?, pair[1].clone())))
        .collect::<Outcome<Vec<_>>>()?;
    Ok((options, pairs))
}

/// The reply of sorted-set read `name` (one of [`is_zset_read`]) given its key's value (`None`:
/// absent).
pub(super) fn answer(name: &str, args: &[Vec<u8>], value: Option<&[u8]>) -> Outcome {
    // Arguments are checked before the type, as Redis does for the range commands.
    let query = match name {
        "zrange" | "zrangebyscore" | "zrevrangebyscore" | "zrevrange" | "zrangebylex" | "zrevrangebylex" => {
            Some(RangeQuery::parse(name, args)?)
        }
        _ => None,
    };
    let scores = zset_of(value)?;
    Ok(match name {
        "zscore" => scores.get(&args[2]).map_or(Reply::Nil, |score| Reply::double(*score)),
        "zmscore" => Reply::Array(
            args[2..]
                .iter()
                .map(|member| scores.get(member).map_or(Reply::Nil, |score| Reply::double(*score)))
                .collect(),
        ),
        "zcard" => Reply::Integer(scores.len() as i64),
        "zcount" => {
            let (min, max) = (ScoreBound::parse(&args[2])?, ScoreBound::parse(&args[3])?);
            Reply::Integer(
                scores.values().filter(|score| min.above_min(**score) && max.below_max(**score)).count()
                    as i64,
            )
        }
        "zlexcount" => {
            let (min, max) = (LexBound::parse(&args[2])?, LexBound::parse(&args[3])?);
            Reply::Integer(
                scores.keys().filter(|member| min.above_min(member) && max.below_max(member)).count() as i64,
            )
        }
        "zrank" | "zrevrank" => {
            let entries = ranked(&scores);
            match entries.iter().position(|(member, _)| **member == args[2]) {
                None => Reply::Nil,
                Some(rank) if name == "zrank" => Reply::Integer(rank as i64),
                Some(rank) => Reply::Integer((entries.len() - 1 - rank) as i64),
            }
        }
        "zscan" => {
            let options = types::parse_scan_options(&args[2], &args[3..], false)?;
            let mut items = Vec::new();
            for (member, score) in ranked(&scores) {
                if options.pattern.as_ref().is_none_or(|pattern| pattern.matches(member)) {
                    // Scores are bulk strings in a scan's reply, in both protocols.
                    items.push(Reply::Bulk(member.clone()));
                    items.push(Reply::text(crate::protocol::format_double(score)));
                }
            }
            Reply::Array(vec![Reply::text("0"), Reply::Array(items)])
        }
        _ => {
            let query = query.expect("a range command");
            entries_reply(query.select(&scores), query.with_scores)
        }
    })
}

/// OBJECT ENCODING of a sorted set: `listpack` while it has at most `max_entries` members and each
/// is at most `max_len` bytes (the node's `zset-max-listpack-entries` and `-value`,
/// `types::Encodings`), else `skiplist`.
pub(super) fn encoding(value: &[u8], max_entries: u64, max_len: u64) -> &'static str {
    match decode(value) {
        Ok(scores)
            if scores.len() as u64 <= max_entries
                && scores.keys().all(|member| member.len() as u64 <= max_len) =>
        {
            "listpack"
        }
        _ => "skiplist",
    }
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
    fn entries_keep_rank_order_through_the_encoding() {
        let (z, reply) = write(&["zadd", "z", "2", "b", "1", "c", "2", "a", "-inf", "low"], None);
        assert_eq!(reply, Reply::Integer(4));
        assert_eq!(read(&["zrange", "z", "0", "-1"], &z), bulks(&["low", "c", "a", "b"]));
        assert_eq!(
            read(&["zrange", "z", "0", "1", "WITHSCORES"], &z),
            Reply::Pairs(vec![
                (Reply::text("low"), Reply::double(f64::NEG_INFINITY)),
                (Reply::text("c"), Reply::double(1.0))
            ])
        );
        let swapped = types::encode_items(
            ZSET_MARKER,
            2,
            [&2f64.to_le_bytes()[..], b"a", &1f64.to_le_bytes()[..], b"b"],
        );
        assert!(decode(&swapped).is_err());
        assert_eq!(read(&["zcard", "z"], &Some(b"string".to_vec())), wrong_type());
        assert_eq!(encoding(z.as_deref().unwrap(), 128, 64), "listpack");
        assert_eq!(encoding(z.as_deref().unwrap(), 2, 64), "skiplist");
    }

    #[test]
    fn zadd_options_and_increments() {
        let (z, _) = write(&["zadd", "z", "1", "a", "2", "b"], None);
        assert_eq!(write(&["zadd", "z", "NX", "5", "a", "3", "c"], z.clone()).1, Reply::Integer(1));
        assert_eq!(write(&["zadd", "z", "XX", "CH", "5", "a", "3", "c"], z.clone()).1, Reply::Integer(1));
        assert_eq!(write(&["zadd", "z", "GT", "CH", "0", "a", "9", "b"], z.clone()).1, Reply::Integer(1));
        let (z, reply) = write(&["zadd", "z", "INCR", "2.5", "a"], z);
        assert_eq!(reply, Reply::double(3.5));
        let (z, reply) = write(&["zincrby", "z", "-1", "a"], z);
        assert_eq!(reply, Reply::double(2.5));
        assert_eq!(write(&["zadd", "z", "NX", "INCR", "1", "a"], z.clone()).1, Reply::Nil);
        assert_eq!(
            write(&["zadd", "z", "NX", "XX", "1", "a"], z.clone()).1,
            Reply::err("XX and NX options at the same time are not compatible")
        );
        assert_eq!(
            write(&["zadd", "z", "GT", "LT", "1", "a"], z.clone()).1,
            Reply::err("GT, LT, and/or NX options at the same time are not compatible")
        );
        assert_eq!(write(&["zadd", "z", "1", "a", "2"], z.clone()).1, Reply::err("syntax error"));
        assert_eq!(write(&["zadd", "z", "nan", "a"], z.clone()).1, not_a_float());
        let (z, _) = write(&["zadd", "z", "+inf", "top"], z);
        assert_eq!(
            write(&["zincrby", "z", "-inf", "top"], z.clone()).1,
            Reply::err("resulting score is not a number (NaN)")
        );
        assert_eq!(read(&["zscore", "z", "a"], &z), Reply::double(2.5));
        assert_eq!(
            read(&["zmscore", "z", "a", "nope"], &z),
            Reply::Array(vec![Reply::double(2.5), Reply::Nil])
        );
    }

    #[test]
    fn ranges_by_rank_score_and_lex() {
        let (z, _) = write(&["zadd", "z", "1", "a", "2", "b", "3", "c", "4", "d"], None);
        assert_eq!(read(&["zrangebyscore", "z", "(1", "3"], &z), bulks(&["b", "c"]));
        assert_eq!(read(&["zrevrangebyscore", "z", "+inf", "2", "LIMIT", "1", "5"], &z), bulks(&["c", "b"]));
        assert_eq!(read(&["zrange", "z", "3", "(1", "BYSCORE", "REV"], &z), bulks(&["c", "b"]));
        assert_eq!(read(&["zrevrange", "z", "0", "1"], &z), bulks(&["d", "c"]));
        assert_eq!(read(&["zrangebylex", "z", "[b", "(d"], &z), bulks(&["b", "c"]));
        assert_eq!(
            read(&["zrange", "z", "+", "-", "BYLEX", "REV", "LIMIT", "0", "2"], &z),
            bulks(&["d", "c"])
        );
        assert_eq!(read(&["zcount", "z", "-inf", "(3"], &z), Reply::Integer(2));
        assert_eq!(read(&["zlexcount", "z", "-", "+"], &z), Reply::Integer(4));
        assert_eq!(read(&["zrank", "z", "c"], &z), Reply::Integer(2));
        assert_eq!(read(&["zrevrank", "z", "c"], &z), Reply::Integer(1));
        assert!(read(&["zrange", "z", "0", "1", "LIMIT", "0", "1"], &z).is_error());
        assert_eq!(read(&["zrangebyscore", "z", "x", "1"], &z), Reply::err("min or max is not a float"));
        let (z, reply) = write(&["zremrangebyscore", "z", "2", "3"], z);
        assert_eq!(reply, Reply::Integer(2));
        let (z, reply) = write(&["zpopmax", "z"], z);
        assert_eq!(reply, Reply::Array(vec![Reply::text("d"), Reply::double(4.0)]));
        let (z, reply) = write(&["zpopmin", "z", "5"], z);
        assert_eq!((z, reply), (None, Reply::Pairs(vec![(Reply::text("a"), Reply::double(1.0))])));
        assert_eq!(
            read(&["zscan", "z", "0"], &write(&["zadd", "z", "1.5", "m"], None).0),
            Reply::Array(vec![Reply::text("0"), bulks(&["m", "1.5"])])
        );
    }
}
