//! A follower's notice to its leader: "I hold these fast writes" (`fast::group`).
//!
//! It travels as a Raft message of type `MsgUnreachable`, which raft-rs only ever uses inside a
//! node (to report a peer unreachable) and never sends, with a context that starts with
//! [`MAGIC`] and lists the ids. So every transport carries it as it carries Raft's own messages,
//! and the receiving group takes it out before anything reaches raft-rs ([`decode`]).

use crate::RequestId;
use raft::eraftpb::{Message, MessageType};

/// The start of a notice's context.
const MAGIC: &[u8; 8] = b"onekvFN1";

/// Most ids one notice carries (a notice of more is cut: the leader then orders the rest inline).
const MAX_IDS: usize = 65_536;

/// A notice from `from` to `to`, in `term`, naming `ids`.
pub(crate) fn encode(from: u64, to: u64, term: u64, ids: &[RequestId]) -> Message {
    let ids = &ids[..ids.len().min(MAX_IDS)];
    let mut context = Vec::with_capacity(MAGIC.len() + 4 + ids.len() * 16);
    context.extend_from_slice(MAGIC);
    context.extend_from_slice(&(ids.len() as u32).to_le_bytes());
    for id in ids {
        context.extend_from_slice(&id.client.to_le_bytes());
        context.extend_from_slice(&id.seq.to_le_bytes());
    }
    let mut message = Message { from, to, term, context: context.into(), ..Default::default() };
    message.set_msg_type(MessageType::MsgUnreachable);
    message
}

/// The ids of `message` if it is a notice (`Some(Err)` for a malformed one), else `None`.
pub(crate) fn decode(message: &Message) -> Option<Result<Vec<RequestId>, &'static str>> {
    if message.get_msg_type() != MessageType::MsgUnreachable || !message.context.starts_with(MAGIC) {
        return None;
    }
    let body = &message.context[MAGIC.len()..];
    let Some(count) = body.get(..4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
    else {
        return Some(Err("a fast-write notice without its count"));
    };
    let ids = &body[4..];
    if count > MAX_IDS || ids.len() != count * 16 {
        return Some(Err("a fast-write notice whose count does not match its length"));
    }
    Some(Ok(ids
        .chunks_exact(16)
        .map(|id| RequestId {
            client: u64::from_le_bytes(id[..8].try_into().expect("8 bytes")),
            seq: u64::from_le_bytes(id[8..].try_into().expect("8 bytes")),
        })
        .collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_round_trips_and_other_messages_are_not_notices() {
        let ids = vec![RequestId { client: 1, seq: 2 }, RequestId { client: u64::MAX, seq: 7 }];
        let message = encode(2, 1, 9, &ids);
        assert_eq!((message.from, message.to, message.term), (2, 1, 9));
        assert_eq!(decode(&message), Some(Ok(ids)));
        let mut heartbeat = message.clone();
        heartbeat.set_msg_type(MessageType::MsgHeartbeat);
        assert_eq!(decode(&heartbeat), None);
        let mut cut = message.clone();
        cut.context = cut.context[..cut.context.len() - 1].to_vec().into();
        assert!(matches!(decode(&cut), Some(Err(_))));
    }
}
