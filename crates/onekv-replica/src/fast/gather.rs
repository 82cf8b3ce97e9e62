//! A new leader's gather of the pending fast writes of a majority, when a fast write is done on
//! fewer than every voter (4 of 5 at R = 5; `onekv_placement::quorum`).
//!
//! A done write is then held by the fast quorum, not by every voter, so the new leader may lack
//! it. On election it asks every voter for the writes it holds pending from older terms ([`ask`]);
//! each answers with them, commands included ([`answer`]). With answers from a majority (itself
//! included) the leader keeps every write at least `fast_recovery_threshold` of them hold
//! ([`recovered`]): that is every done write, and writes of other keys than one another (a voter
//! refuses a fast write of a key it holds pending while the fast quorum is below every voter), so
//! the order it proposes them in changes nothing a client can see. Skyros (§4.6) orders them by a
//! graph of the orders the answers saw; with writes that never completed among them that graph can
//! have cycles through done writes, and ours needs no order at all.
//!
//! The messages travel as Raft messages of type `MsgUnreachable` with a marked context, like the
//! notices (`fast::notice`): raft-rs never sends that type, and the group takes them out before
//! anything reaches raft-rs.
//!
//! This module owns the messages and the choice of writes; the group (`fast::group`) decides when
//! to ask and proposes what was chosen.

use super::FastRecord;
use crate::RequestId;
use raft::eraftpb::{Message, MessageType};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The start of a request's context.
const ASK_MAGIC: &[u8; 8] = b"onekvFG1";

/// The start of an answer's context.
const ANSWER_MAGIC: &[u8; 8] = b"onekvFA1";

/// How long the leader waits for a voter's answer before asking it again (a message may be lost;
/// a voter that has not heard of the new term yet, or is installing a snapshot, ignores the
/// request).
pub(crate) const ASK_AGAIN_AFTER: Duration = Duration::from_millis(300);

/// Most bytes of fast writes a shard holds pending where a new leader gathers them (below
/// `pending::MAX_PENDING_BYTES`): an answer carries them all in one peer message, which must fit
/// the peer transport's queue (64 MiB by default) beside other traffic.
pub(crate) const MAX_GATHERED_PENDING_BYTES: usize = 32 << 20;

/// Most bytes one answer carries: the pending bound, the per-write overhead of the most writes a
/// shard holds, and room to spare. Reached only by a replica that reopened with more pending than
/// the bound (recovery takes every record written since the last flush, and what stays after its
/// replay was within the bound before the crash); such a replica does not answer, and the leader
/// needs the others'.
const MAX_ANSWER_BYTES: usize =
    MAX_GATHERED_PENDING_BYTES + super::pending::MAX_PENDING_RECORDS * PER_WRITE + (4 << 20);

/// Bytes an answer takes per write besides its command: id (16), term (8), digest (4), length (4).
const PER_WRITE: usize = 32;

/// A pending write as a voter reported it (or the leader holds it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Held {
    pub id: RequestId,
    /// The term the voter accepted it in.
    pub term: u64,
    /// CRC-32C of `command`.
    pub digest: u32,
    /// The encoded write command (checked to be a write with this id).
    pub command: Arc<[u8]>,
    /// How many ops it holds (for an ORDER's bound).
    pub ops: usize,
}

impl Held {
    pub fn of(record: &FastRecord) -> Held {
        Held {
            id: record.id,
            term: record.term,
            digest: record.digest,
            command: record.command.clone(),
            ops: record.keys.len(),
        }
    }
}

/// A gather message, decoded.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Gathered {
    /// The leader of the message's term asks for the writes held from older terms, once the voter
    /// applied up to `floor` (what the leader had committed when elected).
    Ask { floor: u64 },
    /// A voter's writes pending from terms below the message's term, in its append order, not yet
    /// parsed ([`parse_answer`]: only a leader gathering in that term needs them).
    Answer(bytes::Bytes),
}

/// The leader `from` of `term` asks `to` for its pending writes, to be answered once `to` applied
/// up to `floor`.
pub(crate) fn ask(from: u64, to: u64, term: u64, floor: u64) -> Message {
    let mut context = ASK_MAGIC.to_vec();
    context.extend_from_slice(&floor.to_le_bytes());
    message(from, to, term, context)
}

/// `from`'s answer to the leader `to` of `term`: its pending writes of terms below `term`, or
/// `None` if they do not fit one answer.
pub(crate) fn answer<'a>(
    from: u64,
    to: u64,
    term: u64,
    records: impl Iterator<Item = &'a FastRecord>,
) -> Option<Message> {
    let records: Vec<&FastRecord> = records.filter(|record| record.term < term).collect();
    let bytes: usize = records.iter().map(|record| PER_WRITE + record.command.len()).sum();
    if bytes > MAX_ANSWER_BYTES {
        return None;
    }
    let mut context = Vec::with_capacity(ANSWER_MAGIC.len() + 4 + bytes);
    context.extend_from_slice(ANSWER_MAGIC);
    context.extend_from_slice(&(records.len() as u32).to_le_bytes());
    for record in records {
        context.extend_from_slice(&record.id.client.to_le_bytes());
        context.extend_from_slice(&record.id.seq.to_le_bytes());
        context.extend_from_slice(&record.term.to_le_bytes());
        context.extend_from_slice(&record.digest.to_le_bytes());
        context.extend_from_slice(&(record.command.len() as u32).to_le_bytes());
        context.extend_from_slice(&record.command);
    }
    Some(message(from, to, term, context))
}

fn message(from: u64, to: u64, term: u64, context: Vec<u8>) -> Message {
    let mut message = Message { from, to, term, context: context.into(), ..Default::default() };
    message.set_msg_type(MessageType::MsgUnreachable);
    message
}

/// The gather message `message` is (`Some(Err)` for a malformed one), else `None`.
pub(crate) fn decode(message: &Message) -> Option<Result<Gathered, &'static str>> {
    if message.get_msg_type() != MessageType::MsgUnreachable {
        return None;
    }
    if let Some(floor) = message.context.strip_prefix(ASK_MAGIC) {
        return Some(match <[u8; 8]>::try_from(floor) {
            Ok(floor) => Ok(Gathered::Ask { floor: u64::from_le_bytes(floor) }),
            Err(_) => Err("a gather request whose floor is not 8 bytes"),
        });
    }
    if !message.context.starts_with(ANSWER_MAGIC) {
        return None;
    }
    Some(Ok(Gathered::Answer(message.context.slice(ANSWER_MAGIC.len()..))))
}

/// The writes of an answer in `term`: each a write command under its id and digest, accepted in
/// a term below `term`, of at most an ORDER's ops.
pub(crate) fn parse_answer(body: &[u8], term: u64) -> Result<Vec<Held>, &'static str> {
    let take = |at: &mut usize, n: usize| -> Result<&[u8], &'static str> {
        let bytes = body.get(*at..*at + n).ok_or("a fast-write answer cut short")?;
        *at += n;
        Ok(bytes)
    };
    let u64_at = |at: &mut usize| take(at, 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    let u32_at = |at: &mut usize| take(at, 4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
    let mut at = 0;
    let count = u32_at(&mut at)? as usize;
    // Each write takes at least PER_WRITE bytes, which bounds the allocation by the input's size.
    if count > body.len() / PER_WRITE {
        return Err("a fast-write answer's count exceeds its size");
    }
    let mut held = Vec::with_capacity(count);
    for _ in 0..count {
        let id = RequestId { client: u64_at(&mut at)?, seq: u64_at(&mut at)? };
        let accepted_in = u64_at(&mut at)?;
        if accepted_in >= term {
            return Err("a fast-write answer names a write of the gathering term or later");
        }
        let digest = u32_at(&mut at)?;
        let len = u32_at(&mut at)? as usize;
        let command = take(&mut at, len)?;
        if crc32c::crc32c(command) != digest {
            return Err("a fast-write answer's command does not match its digest");
        }
        let decoded =
            crate::codec::decode(command).map_err(|_| "a fast-write answer's command is malformed")?;
        let crate::codec::DecodedCommand::Write(ops) = &decoded.command else {
            return Err("a fast-write answer's command is not a write");
        };
        if decoded.request_id != id {
            return Err("a fast-write answer's command has another request id");
        }
        if ops.iter().any(|op| op.reference.is_some()) {
            return Err("a fast-write answer's command puts a value by reference");
        }
        if ops.is_empty() || ops.len() > super::group::MAX_ORDER_OPS {
            return Err("a fast-write answer's command has no ops, or more than an ORDER holds");
        }
        held.push(Held { id, term: accepted_in, digest, command: Arc::from(command), ops: ops.len() });
    }
    if at != body.len() {
        return Err("a fast-write answer has bytes after its writes");
    }
    Ok(held)
}

/// The writes a new leader recovers from `answers` (by voter, `own` among them): those at least
/// `threshold` answers hold (the same id with the same digest), in `own`'s order for those it
/// holds, then in the order of the first answer (by voter id) that holds each.
pub(crate) fn recovered(answers: &BTreeMap<u64, Vec<Held>>, own: u64, threshold: usize) -> Vec<Held> {
    let mut counts: BTreeMap<(RequestId, u32), usize> = BTreeMap::new();
    for held in answers.values() {
        let mut seen = std::collections::BTreeSet::new();
        for write in held {
            // A voter's answer names a write once.
            if seen.insert((write.id, write.digest)) {
                *counts.entry((write.id, write.digest)).or_default() += 1;
            }
        }
    }
    let mut chosen = Vec::new();
    let mut taken = std::collections::BTreeSet::new();
    let first = answers.get(&own).into_iter();
    let rest = answers.iter().filter(|(voter, _)| **voter != own).map(|(_, held)| held);
    for held in first.chain(rest) {
        for write in held {
            let key = (write.id, write.digest);
            if counts[&key] >= threshold && taken.insert(key) {
                chosen.push(write.clone());
            }
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WriteOp;

    fn record(seq: u64, term: u64, key: &[u8]) -> FastRecord {
        let id = RequestId { client: 9, seq };
        let op =
            WriteOp { key: key.to_vec(), value: Some(vec![seq as u8; 40]), expiry: crate::Expiry::Never };
        let (command, _) = super::super::encode_command(id, vec![op]);
        FastRecord {
            id,
            term,
            digest: crc32c::crc32c(&command),
            command: command.into(),
            at: onekv_log::Locator { position: 0, len: 0 },
            keys: vec![key.to_vec()],
        }
    }

    #[test]
    fn an_answer_round_trips_without_the_current_terms_writes_and_asks_are_told_apart() {
        let records = [record(1, 4, b"a"), record(2, 5, b"b"), record(3, 6, b"c")];
        let message = answer(2, 1, 6, records.iter()).expect("fits");
        assert_eq!((message.from, message.to, message.term), (2, 1, 6));
        let Some(Ok(Gathered::Answer(body))) = decode(&message) else { panic!("an answer") };
        let held = parse_answer(&body, 6).expect("well formed");
        assert_eq!(held, records[..2].iter().map(Held::of).collect::<Vec<_>>());
        assert!(parse_answer(&body, 5).is_err(), "a write of the gathering term");
        assert_eq!(decode(&ask(1, 2, 6, 41)), Some(Ok(Gathered::Ask { floor: 41 })));
        let notice = super::super::notice::encode(2, 1, 6, &[records[0].id]);
        assert_eq!(decode(&notice), None, "a notice is not a gather message");
        let mut heartbeat = message.clone();
        heartbeat.set_msg_type(MessageType::MsgHeartbeat);
        assert_eq!(decode(&heartbeat), None);
    }

    #[test]
    fn a_damaged_or_cut_answer_is_refused() {
        let records = [record(1, 4, b"a"), record(2, 5, b"b")];
        let message = answer(2, 1, 6, records.iter()).expect("fits");
        let parse = |message: &Message| match decode(message) {
            Some(Ok(Gathered::Answer(body))) => parse_answer(&body, 6),
            other => panic!("not an answer: {other:?}"),
        };
        assert!(parse(&message).is_ok());
        for cut in [1, 10, 40] {
            let mut short = message.clone();
            short.context = short.context[..short.context.len() - cut].to_vec().into();
            assert!(parse(&short).is_err(), "cut by {cut}");
        }
        let mut flipped = message.clone();
        let mut context = flipped.context.to_vec();
        let last = context.len() - 1;
        context[last] ^= 1;
        flipped.context = context.into();
        assert!(parse(&flipped).is_err(), "a flipped byte of a command");
        let mut huge = message.clone();
        let mut context = huge.context.to_vec();
        context[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        huge.context = context.into();
        assert!(parse(&huge).is_err(), "a count beyond the size");
    }

    #[test]
    fn the_leader_keeps_what_enough_answers_hold_its_own_order_first() {
        let (a, b, c, d) = (record(1, 3, b"a"), record(2, 3, b"b"), record(3, 3, b"c"), record(4, 3, b"d"));
        // Five voters, a majority of three answered (the leader is 1): a write done on four of five
        // is on at least two of them.
        let answers: BTreeMap<u64, Vec<Held>> = [
            (1, vec![Held::of(&c), Held::of(&a)]),
            (3, vec![Held::of(&a), Held::of(&b), Held::of(&d)]),
            (4, vec![Held::of(&b), Held::of(&d)]),
        ]
        .into();
        let ids: Vec<u64> = recovered(&answers, 1, 2).iter().map(|held| held.id.seq).collect();
        assert_eq!(ids, [1, 2, 4], "c is on one answer only; a first (the leader's), then b and d");
        // The same id under another digest is another write.
        let mut other = Held::of(&b);
        other.digest ^= 1;
        let split: BTreeMap<u64, Vec<Held>> = [(1, vec![Held::of(&b)]), (2, vec![other])].into();
        assert!(recovered(&split, 1, 2).is_empty());
    }
}
