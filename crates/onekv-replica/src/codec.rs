//! The command codec: how a client command is laid out inside a Raft entry's data.
//!
//! The layout exists for targeted reads (XLL §3.4.2): decoding reports where each value sits inside
//! the encoded bytes, so applying an entry writes `key → locator of the value inside the entry` and a
//! later read fetches exactly those bytes with one `pread`, never the whole entry. Each stored value
//! is preceded by its own CRC-32C, and the locator covers `crc || value`, so a targeted read is
//! verified even though it reads only part of a log record.
//!
//! This module owns the byte layout and its bounds checks; it does not know about Raft, the log or
//! the index. All integers are little-endian with explicit widths:
//!
//! ```text
//! command  = version:u8 (=2) tag:u8 client:u64 seq:u64 time_ms:u64 body
//!            (version 1, written before the leader's time was carried, has no time_ms; it
//!            decodes with time 0)
//! tag 1 (write) body = count:u32 op*count
//!     op   = kind:u8 key_len:u32 key [expires_at_ms:u64] [value]
//!            kind 1 put, 2 delete (no value), 3 put that expires (expires_at_ms), 4 put that keeps
//!            the key's expiry
//!     op   = kind:u8 key_len:u32 key [expires_at_ms:u64] source_len:u32 source value_len:u32
//!            kind 5, 6, 7: the same three puts *by reference* (`wire_refs`, write commands only):
//!            the key takes the value `source` holds when the entry applies, which the leader
//!            found equal, byte for byte, to the client's `value_len` bytes
//! tag 2 (cas) body   = key_len:u32 key has_expected:u8 [expected_len:u32 expected]
//!                      new:u8 [expires_at_ms:u64] [value]
//!            new 0 delete, 1 put, 2 put that expires (expires_at_ms), 3 put that keeps the expiry
//! tag 3 (repair request) body = key_len:u32 key            (client and seq are 0)
//! tag 4 (repair) body         = key_len:u32 key value      (client and seq are 0)
//! tag 5 (txn) body   = cond_count:u32 cond*cond_count count:u32 op*count
//!     cond = key_len:u32 key has_expected:u8 [expected_len:u32 expected]
//! tag 6 (delete expired) body = count:u32 (key_len:u32 key)*count   (client and seq are 0)
//! tag 7 (delete range) body = start_len:u32 start has_end:u8 [end_len:u32 end] limit:u32
//!                             spare_len:u32 spare
//! tag 8 (order) body = drop_below:u64 count:u32 item*count      (client and seq are 0)
//!            drop_below: a new leader's term (its recovery order), or 0
//!     item = client:u64 seq:u64 digest:u32 kind:u8 [inline_len:u32 inline]
//!            kind 0: by reference, 1: inline follows, 2: forget (drop it as pending, apply nothing)
//!            inline: the fast write's own encoded write command (tag 1), for replicas that do
//!            not hold its durability record; digest: CRC-32C of that command (`fast`)
//! value    = len:u32 crc32c(bytes):u32 bytes        (the locator covers crc32c and bytes)
//! ```
//!
//! Decoding never panics and never reads past its input: every length is checked before use, so
//! bytes from a damaged or hostile peer produce an error.

use crate::{Command, Expiry, RequestId};
#[cfg(test)]
use crate::{Condition, WriteOp};

const VERSION: u8 = 2;
/// The layout before commands carried their leader's time.
const VERSION_WITHOUT_TIME: u8 = 1;
const TAG_WRITE: u8 = 1;
const TAG_CAS: u8 = 2;
const TAG_REPAIR_REQUEST: u8 = 3;
const TAG_REPAIR: u8 = 4;
const TAG_TXN: u8 = 5;
const TAG_DELETE_EXPIRED: u8 = 6;
const TAG_DELETE_RANGE: u8 = 7;
const TAG_ORDER: u8 = 8;
const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;
const OP_PUT_EXPIRING: u8 = 3;
const OP_PUT_KEEPING_EXPIRY: u8 = 4;
const OP_PUT_REF: u8 = 5;
const OP_PUT_REF_EXPIRING: u8 = 6;
const OP_PUT_REF_KEEPING_EXPIRY: u8 = 7;

/// Bytes in front of a stored value's bytes: its CRC-32C (the length precedes it and is not covered
/// by the locator).
pub const STORED_VALUE_PREFIX: usize = 4;

/// Where a value sits in an encoded command: `offset` is where its CRC starts, and `len` covers the
/// CRC and the bytes, so `data[offset..offset + len]` is what a locator names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueSpan {
    /// Offset of the CRC from the start of the encoded command.
    pub offset: usize,
    /// CRC plus value bytes.
    pub len: usize,
}

impl ValueSpan {
    /// The value bytes inside `data` (without the CRC).
    pub fn value<'a>(&self, data: &'a [u8]) -> &'a [u8] {
        &data[self.offset + STORED_VALUE_PREFIX..self.offset + self.len]
    }

    /// The stored value inside `data`: its CRC and its bytes, as a locator of the span reads them.
    pub fn stored<'a>(&self, data: &'a [u8]) -> &'a [u8] {
        &data[self.offset..self.offset + self.len]
    }
}

/// One decoded operation of a write: the key, and where its value is (`value` and `reference`
/// both `None`: a delete).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedOp<'a> {
    /// The key.
    pub key: &'a [u8],
    /// The value's place in the encoded command, for a put.
    pub value: Option<ValueSpan>,
    /// For a put by reference (write commands only): the key whose value it takes.
    pub reference: Option<ValueRef<'a>>,
    /// When a put's key expires ([`Expiry::Never`] for a delete).
    pub expiry: Expiry,
}

impl DecodedOp<'_> {
    /// Whether the op deletes its key.
    pub fn is_delete(&self) -> bool {
        self.value.is_none() && self.reference.is_none()
    }
}

/// A put's value named by reference (`wire_refs`): the value `source` holds in the shard's state
/// when the entry applies (every replica's state is the same there), which the leader found equal
/// to the client's value, of `value_len` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueRef<'a> {
    /// The key holding the value.
    pub source: &'a [u8],
    /// The value's length in bytes (checked when the entry applies).
    pub value_len: u32,
}

/// A decoded command, borrowing from the encoded bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodedCommand<'a> {
    /// Puts and deletes.
    Write(Vec<DecodedOp<'a>>),
    /// A compare-and-swap.
    Cas {
        /// The key.
        key: &'a [u8],
        /// The value the key must have (`None`: absent).
        expected: Option<&'a [u8]>,
        /// The value to set (`None`: delete), as a span like a put's.
        new: Option<ValueSpan>,
        /// When the new value expires.
        new_expiry: Expiry,
    },
    /// A conditional transaction: when every key has its expected value, the ops apply as one
    /// write.
    Txn {
        /// `(key, expected)` pairs (`None`: the key must be absent).
        conditions: Vec<(&'a [u8], Option<&'a [u8]>)>,
        /// The ops, as a write's.
        ops: Vec<DecodedOp<'a>>,
    },
    /// A replica found its copy of `key`'s value damaged and asks for a healthy one: every replica
    /// whose copy is healthy answers with a [`DecodedCommand::Repair`]. Proposed by replicas, never
    /// by clients.
    RepairRequest {
        /// The key whose value is damaged somewhere.
        key: &'a [u8],
    },
    /// Deletes each key that has expired by the entry's time (a key written again since, without an
    /// expiry or with a later one, stays). Proposed by a shard's leader as it finds expired keys,
    /// never by clients.
    DeleteExpired {
        /// The keys.
        keys: Vec<&'a [u8]>,
    },
    /// One page of a range deletion ([`Command::DeleteRange`]).
    DeleteRange {
        /// The first key (inclusive).
        start: &'a [u8],
        /// The end (exclusive); `None`: no end.
        end: Option<&'a [u8]>,
        /// The most keys the page deletes.
        limit: u32,
        /// Keys with this prefix are left (empty: none).
        spare: &'a [u8],
    },
    /// A healthy copy of `key`'s value: a replica whose current copy is damaged (and of the same
    /// length) takes it; every other replica changes nothing. Proposed by replicas, never by
    /// clients.
    Repair {
        /// The key.
        key: &'a [u8],
        /// The value, as a span like a put's.
        value: ValueSpan,
    },
    /// The fast path's ordering (`fast`): applies, in this order, the fast writes named, each from
    /// the replica's own durability record (or the inline copy, for a replica without one).
    /// Proposed by a shard's leader, never by clients.
    Order {
        /// Not 0 in a new leader's first order (its term): applying it drops every pending fast
        /// write of a lower term it does not name.
        drop_below: u64,
        /// The fast writes, in their order.
        items: Vec<DecodedOrderItem<'a>>,
    },
}

/// One fast write named by a [`DecodedCommand::Order`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedOrderItem<'a> {
    /// The fast write's request id.
    pub id: RequestId,
    /// CRC-32C of its encoded write command, as the leader holds it.
    pub digest: u32,
    /// The encoded write command itself, and its offset in the entry's data (add it to a span of
    /// the inline command to locate a value in the entry), when the leader sent it.
    pub inline: Option<(usize, &'a [u8])>,
    /// Not a write to apply: a write some replicas hold that the leader never got (its client
    /// gave up on it), which they drop.
    pub forget: bool,
}

/// One fast write for [`encode_order`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrderItem {
    /// The fast write's request id.
    pub id: RequestId,
    /// CRC-32C of its encoded write command.
    pub digest: u32,
    /// The encoded write command, for replicas that may not hold the durability record.
    pub inline: Option<Vec<u8>>,
    /// Drop it as pending instead of applying it ([`DecodedOrderItem::forget`]).
    pub forget: bool,
}

/// A command that does not decode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed command: {0}")]
pub struct CodecError(pub &'static str);

/// A decoded command with what travels beside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// The client's request id.
    pub request_id: RequestId,
    /// The proposing leader's wall-clock time, in ms since the Unix epoch (0 if not carried).
    /// Every replica applies the entry with this time, never its own clock.
    pub time_ms: u64,
    /// The command.
    pub command: DecodedCommand<'a>,
}

/// Encodes `command` with its request id and the proposing leader's time.
pub fn encode(request_id: RequestId, time_ms: u64, command: &Command) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + encoded_payload_len(command));
    out.push(VERSION);
    match command {
        Command::Write(ops) => {
            out.push(TAG_WRITE);
            push_request_id(&mut out, request_id);
            out.extend_from_slice(&time_ms.to_le_bytes());
            push_ops(&mut out, ops, time_ms);
        }
        Command::Cas { key, expected, new, new_expiry } => {
            out.push(TAG_CAS);
            push_request_id(&mut out, request_id);
            out.extend_from_slice(&time_ms.to_le_bytes());
            push_bytes(&mut out, key);
            match expected {
                Some(expected) => {
                    out.push(1);
                    push_bytes(&mut out, expected);
                }
                None => out.push(0),
            }
            match new {
                Some(new) => {
                    push_expiry(&mut out, absolute(*new_expiry, time_ms), [1, 2, 3]);
                    push_value(&mut out, new);
                }
                None => out.push(0),
            }
        }
        Command::Txn { conditions, ops } => {
            out.push(TAG_TXN);
            push_request_id(&mut out, request_id);
            out.extend_from_slice(&time_ms.to_le_bytes());
            out.extend_from_slice(&(conditions.len() as u32).to_le_bytes());
            for condition in conditions {
                push_bytes(&mut out, &condition.key);
                match &condition.expected {
                    Some(expected) => {
                        out.push(1);
                        push_bytes(&mut out, expected);
                    }
                    None => out.push(0),
                }
            }
            push_ops(&mut out, ops, time_ms);
        }
        Command::DeleteRange { start, end, limit, spare } => {
            out.push(TAG_DELETE_RANGE);
            push_request_id(&mut out, request_id);
            out.extend_from_slice(&time_ms.to_le_bytes());
            push_bytes(&mut out, start);
            match end {
                Some(end) => {
                    out.push(1);
                    push_bytes(&mut out, end);
                }
                None => out.push(0),
            }
            out.extend_from_slice(&limit.to_le_bytes());
            push_bytes(&mut out, spare);
        }
    }
    out
}

fn push_ops(out: &mut Vec<u8>, ops: &[crate::WriteOp], time_ms: u64) {
    push_ops_with_sources(out, ops, &[], time_ms)
}

/// Encodes `ops`; a put whose `sources` entry is a key goes by reference to that key's value.
fn push_ops_with_sources(out: &mut Vec<u8>, ops: &[crate::WriteOp], sources: &[Option<&[u8]>], time_ms: u64) {
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for (i, op) in ops.iter().enumerate() {
        match &op.value {
            Some(value) => {
                let expiry = absolute(op.expiry, time_ms);
                let source = sources.get(i).copied().flatten();
                let kinds = match source {
                    None => [OP_PUT, OP_PUT_EXPIRING, OP_PUT_KEEPING_EXPIRY],
                    Some(_) => [OP_PUT_REF, OP_PUT_REF_EXPIRING, OP_PUT_REF_KEEPING_EXPIRY],
                };
                let kind = match expiry {
                    Expiry::Never => kinds[0],
                    Expiry::At(_) | Expiry::AfterMs(_) => kinds[1],
                    Expiry::Keep => kinds[2],
                };
                out.push(kind);
                push_bytes(out, &op.key);
                if let Expiry::At(at) = expiry {
                    out.extend_from_slice(&at.to_le_bytes());
                }
                match source {
                    Some(source) => {
                        push_bytes(out, source);
                        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
                    }
                    None => push_value(out, value),
                }
            }
            None => {
                out.push(OP_DELETE);
                push_bytes(out, &op.key);
            }
        }
    }
}

/// A put's flag byte for `expiry` (`flags`: never, at, keep), then the time for [`Expiry::At`].
fn push_expiry(out: &mut Vec<u8>, expiry: Expiry, flags: [u8; 3]) {
    match expiry {
        Expiry::Never => out.push(flags[0]),
        Expiry::At(at) | Expiry::AfterMs(at) => {
            out.push(flags[1]);
            out.extend_from_slice(&at.to_le_bytes());
        }
        Expiry::Keep => out.push(flags[2]),
    }
}

/// `expiry` with a relative time made absolute from the entry's `time_ms` (an entry carries
/// absolute times only).
pub fn absolute(expiry: Expiry, time_ms: u64) -> Expiry {
    match expiry {
        Expiry::AfterMs(ttl) => Expiry::At(time_ms.saturating_add(ttl)),
        other => other,
    }
}

/// Encodes a write command whose puts with a `sources` entry take their value by reference to
/// that key's (`wire_refs`; the caller checked each source holds the same bytes and nothing
/// proposed before applies a change to it).
pub fn encode_write_with_references(
    request_id: RequestId,
    time_ms: u64,
    ops: &[crate::WriteOp],
    sources: &[Option<&[u8]>],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + ops.iter().map(|op| 16 + op.key.len()).sum::<usize>());
    out.push(VERSION);
    out.push(TAG_WRITE);
    push_request_id(&mut out, request_id);
    out.extend_from_slice(&time_ms.to_le_bytes());
    push_ops_with_sources(&mut out, ops, sources, time_ms);
    out
}

/// Encodes a leader's deletion of keys it found expired ([`DecodedCommand::DeleteExpired`]).
pub fn encode_delete_expired(time_ms: u64, keys: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + keys.iter().map(|k| 4 + k.len()).sum::<usize>());
    out.push(VERSION);
    out.push(TAG_DELETE_EXPIRED);
    push_request_id(&mut out, RequestId::default());
    out.extend_from_slice(&time_ms.to_le_bytes());
    out.extend_from_slice(&(keys.len() as u32).to_le_bytes());
    for key in keys {
        push_bytes(&mut out, key);
    }
    out
}

/// Encodes a replica's request for a healthy copy of `key`'s value
/// ([`DecodedCommand::RepairRequest`]).
pub fn encode_repair_request(time_ms: u64, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + key.len());
    out.push(VERSION);
    out.push(TAG_REPAIR_REQUEST);
    push_request_id(&mut out, RequestId::default());
    out.extend_from_slice(&time_ms.to_le_bytes());
    push_bytes(&mut out, key);
    out
}

/// Encodes a leader's ordering of fast writes ([`DecodedCommand::Order`]).
pub fn encode_order(time_ms: u64, drop_below: u64, items: &[OrderItem]) -> Vec<u8> {
    let inline: usize = items.iter().map(|item| item.inline.as_ref().map_or(0, |c| 4 + c.len())).sum();
    let mut out = Vec::with_capacity(32 + items.len() * 21 + inline);
    out.push(VERSION);
    out.push(TAG_ORDER);
    push_request_id(&mut out, RequestId::default());
    out.extend_from_slice(&time_ms.to_le_bytes());
    out.extend_from_slice(&drop_below.to_le_bytes());
    out.extend_from_slice(&(items.len() as u32).to_le_bytes());
    for item in items {
        push_request_id(&mut out, item.id);
        out.extend_from_slice(&item.digest.to_le_bytes());
        match &item.inline {
            _ if item.forget => out.push(2),
            Some(command) => {
                out.push(1);
                push_bytes(&mut out, command);
            }
            None => out.push(0),
        }
    }
    out
}

/// Encodes a healthy copy of `key`'s value offered for repair ([`DecodedCommand::Repair`]).
pub fn encode_repair(time_ms: u64, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(40 + key.len() + value.len());
    out.push(VERSION);
    out.push(TAG_REPAIR);
    push_request_id(&mut out, RequestId::default());
    out.extend_from_slice(&time_ms.to_le_bytes());
    push_bytes(&mut out, key);
    push_value(&mut out, value);
    out
}

/// Key and value bytes a command carries (the user payload, for write amplification).
pub fn encoded_payload_len(command: &Command) -> usize {
    match command {
        Command::Write(ops) => {
            ops.iter().map(|op| op.key.len() + op.value.as_ref().map_or(0, Vec::len)).sum()
        }
        Command::Cas { key, new, .. } => key.len() + new.as_ref().map_or(0, Vec::len),
        Command::Txn { ops, .. } => {
            ops.iter().map(|op| op.key.len() + op.value.as_ref().map_or(0, Vec::len)).sum()
        }
        Command::DeleteRange { .. } => 0,
    }
}

/// Decodes the request id, time and command of `data`, reporting each value's span.
pub fn decode(data: &[u8]) -> Result<Decoded<'_>, CodecError> {
    let mut r = Reader { data, at: 0 };
    let version = r.u8()?;
    if version != VERSION && version != VERSION_WITHOUT_TIME {
        return Err(CodecError("unknown command version"));
    }
    let tag = r.u8()?;
    let request_id = RequestId { client: r.u64()?, seq: r.u64()? };
    let time_ms = if version == VERSION { r.u64()? } else { 0 };
    let command = match tag {
        TAG_WRITE => DecodedCommand::Write(decode_ops(&mut r, true)?),
        TAG_TXN => {
            let count = r.u32()? as usize;
            // Each condition takes at least 5 bytes, which bounds the allocation by the input size.
            if count > r.remaining() / 5 {
                return Err(CodecError("condition count exceeds the command's size"));
            }
            let mut conditions = Vec::with_capacity(count);
            for _ in 0..count {
                let key = r.bytes()?;
                let expected = match r.u8()? {
                    0 => None,
                    1 => Some(r.bytes()?),
                    _ => return Err(CodecError("bad expected-value flag")),
                };
                conditions.push((key, expected));
            }
            DecodedCommand::Txn { conditions, ops: decode_ops(&mut r, false)? }
        }
        TAG_CAS => {
            let key = r.bytes()?;
            let expected = match r.u8()? {
                0 => None,
                1 => Some(r.bytes()?),
                _ => return Err(CodecError("bad expected-value flag")),
            };
            let (new, new_expiry) = match r.u8()? {
                0 => (None, Expiry::Never),
                1 => (Some(r.value()?), Expiry::Never),
                2 => {
                    let at = r.u64()?;
                    (Some(r.value()?), Expiry::At(at))
                }
                3 => (Some(r.value()?), Expiry::Keep),
                _ => return Err(CodecError("bad new-value flag")),
            };
            DecodedCommand::Cas { key, expected, new, new_expiry }
        }
        TAG_DELETE_EXPIRED => {
            let count = r.u32()? as usize;
            // Each key takes at least 4 bytes, which bounds the allocation by the input size.
            if count > r.remaining() / 4 {
                return Err(CodecError("key count exceeds the command's size"));
            }
            let mut keys = Vec::with_capacity(count);
            for _ in 0..count {
                keys.push(r.bytes()?);
            }
            DecodedCommand::DeleteExpired { keys }
        }
        TAG_DELETE_RANGE => {
            let start = r.bytes()?;
            let end = match r.u8()? {
                0 => None,
                1 => Some(r.bytes()?),
                _ => return Err(CodecError("bad range-end flag")),
            };
            let limit = r.u32()?;
            DecodedCommand::DeleteRange { start, end, limit, spare: r.bytes()? }
        }
        TAG_ORDER => {
            let drop_below = r.u64()?;
            let count = r.u32()? as usize;
            // Each item takes at least 21 bytes, which bounds the allocation by the input size.
            if count > r.remaining() / 21 {
                return Err(CodecError("item count exceeds the command's size"));
            }
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                let id = RequestId { client: r.u64()?, seq: r.u64()? };
                let digest = r.u32()?;
                let (inline, forget) = match r.u8()? {
                    0 => (None, false),
                    1 => {
                        let bytes = r.bytes()?;
                        (Some((r.at - bytes.len(), bytes)), false)
                    }
                    2 => (None, true),
                    _ => return Err(CodecError("bad order item kind")),
                };
                items.push(DecodedOrderItem { id, digest, inline, forget });
            }
            DecodedCommand::Order { drop_below, items }
        }
        TAG_REPAIR_REQUEST => DecodedCommand::RepairRequest { key: r.bytes()? },
        TAG_REPAIR => {
            let key = r.bytes()?;
            DecodedCommand::Repair { key, value: r.value()? }
        }
        _ => return Err(CodecError("unknown command tag")),
    };
    if r.remaining() != 0 {
        return Err(CodecError("trailing bytes after the command"));
    }
    Ok(Decoded { request_id, time_ms, command })
}

/// A write's ops: `count:u32 op*count`.
/// The ops of a write or transaction; puts by reference only where `references` allows them.
fn decode_ops<'a>(r: &mut Reader<'a>, references: bool) -> Result<Vec<DecodedOp<'a>>, CodecError> {
    let count = r.u32()? as usize;
    // Each op takes at least 5 bytes, which bounds the allocation by the input size.
    if count > r.remaining() / 5 {
        return Err(CodecError("op count exceeds the command's size"));
    }
    let mut ops = Vec::with_capacity(count);
    for _ in 0..count {
        let kind = r.u8()?;
        let key = r.bytes()?;
        let (value, expiry) = match kind {
            OP_PUT => (Some(r.value()?), Expiry::Never),
            OP_DELETE => (None, Expiry::Never),
            OP_PUT_EXPIRING => {
                let at = r.u64()?;
                (Some(r.value()?), Expiry::At(at))
            }
            OP_PUT_KEEPING_EXPIRY => (Some(r.value()?), Expiry::Keep),
            OP_PUT_REF..=OP_PUT_REF_KEEPING_EXPIRY => {
                if !references {
                    return Err(CodecError("a put by reference outside a write command"));
                }
                let expiry = match kind {
                    OP_PUT_REF => Expiry::Never,
                    OP_PUT_REF_EXPIRING => Expiry::At(r.u64()?),
                    _ => Expiry::Keep,
                };
                let source = r.bytes()?;
                let value_len = r.u32()?;
                ops.push(DecodedOp {
                    key,
                    value: None,
                    reference: Some(ValueRef { source, value_len }),
                    expiry,
                });
                continue;
            }
            _ => return Err(CodecError("unknown op kind")),
        };
        ops.push(DecodedOp { key, value, reference: None, expiry });
    }
    Ok(ops)
}

/// Checks a stored value read back through a locator (`crc || bytes`) and returns the bytes.
pub fn verify_stored_value(stored: &[u8]) -> Result<&[u8], CodecError> {
    if stored.len() < STORED_VALUE_PREFIX {
        return Err(CodecError("stored value shorter than its checksum"));
    }
    let (crc, bytes) = stored.split_at(STORED_VALUE_PREFIX);
    if u32::from_le_bytes(crc.try_into().expect("4 bytes")) != crc32c::crc32c(bytes) {
        return Err(CodecError("stored value does not match its checksum"));
    }
    Ok(bytes)
}

/// Encodes `value` as a stored value (`crc || bytes`), for records other than commands that hold
/// values the index points at (snapshots, the separated mode's value log).
pub fn stored_value(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(STORED_VALUE_PREFIX + value.len());
    out.extend_from_slice(&crc32c::crc32c(value).to_le_bytes());
    out.extend_from_slice(value);
    out
}

fn push_request_id(out: &mut Vec<u8>, id: RequestId) {
    out.extend_from_slice(&id.client.to_le_bytes());
    out.extend_from_slice(&id.seq.to_le_bytes());
}

fn push_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn push_value(out: &mut Vec<u8>, value: &[u8]) {
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(value).to_le_bytes());
    out.extend_from_slice(value);
}

/// A bounds-checked cursor over encoded bytes.
pub(crate) struct Reader<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn remaining(&self) -> usize {
        self.data.len() - self.at
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        if n > self.remaining() {
            return Err(CodecError("truncated"));
        }
        let out = &self.data[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, CodecError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, CodecError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], CodecError> {
        let len = self.u32()? as usize;
        self.take(len)
    }

    /// A stored value (`len crc bytes`): returns its span (covering crc and bytes).
    pub(crate) fn value(&mut self) -> Result<ValueSpan, CodecError> {
        let len = self.u32()? as usize;
        let offset = self.at;
        self.take(STORED_VALUE_PREFIX)?;
        self.take(len)?;
        Ok(ValueSpan { offset, len: STORED_VALUE_PREFIX + len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id() -> RequestId {
        RequestId { client: 7, seq: 9 }
    }

    #[test]
    fn a_write_decodes_with_value_spans_that_name_the_values() {
        let command = Command::Write(vec![
            WriteOp { key: b"a".to_vec(), value: Some(b"hello".to_vec()), expiry: Default::default() },
            WriteOp { key: b"b".to_vec(), value: None, expiry: Default::default() },
            WriteOp { key: b"c".to_vec(), value: Some(Vec::new()), expiry: Default::default() },
        ]);
        let data = encode(id(), 1_700_000_000_123, &command);
        let decoded = decode(&data).unwrap();
        assert_eq!((decoded.request_id, decoded.time_ms), (id(), 1_700_000_000_123));
        let DecodedCommand::Write(ops) = decoded.command else { panic!("not a write") };
        assert_eq!(ops.len(), 3);
        let span = ops[0].value.unwrap();
        assert_eq!(span.value(&data), b"hello");
        assert_eq!(verify_stored_value(&data[span.offset..span.offset + span.len]).unwrap(), b"hello");
        assert_eq!(ops[1], DecodedOp { key: b"b", value: None, reference: None, expiry: Expiry::Never });
        assert_eq!(ops[2].value.unwrap().value(&data), b"");
    }

    #[test]
    fn an_order_round_trips_and_its_inline_commands_locate_their_values() {
        let write = Command::Write(vec![WriteOp {
            key: b"k".to_vec(),
            value: Some(b"fast value".to_vec()),
            expiry: Default::default(),
        }]);
        let inline = encode(RequestId { client: 3, seq: 4 }, 0, &write);
        let items = vec![
            OrderItem { id: RequestId { client: 1, seq: 2 }, digest: 77, inline: None, forget: false },
            OrderItem { id: RequestId { client: 5, seq: 6 }, digest: 0, inline: None, forget: true },
            OrderItem {
                id: RequestId { client: 3, seq: 4 },
                digest: crc32c::crc32c(&inline),
                inline: Some(inline),
                forget: false,
            },
        ];
        let data = encode_order(1_234, 5, &items);
        let decoded = decode(&data).unwrap();
        assert_eq!((decoded.request_id, decoded.time_ms), (RequestId::default(), 1_234));
        let DecodedCommand::Order { drop_below, items: decoded_items } = decoded.command else {
            panic!("not an order")
        };
        assert_eq!(drop_below, 5);
        assert_eq!(decoded_items.len(), 3);
        assert_eq!(
            (decoded_items[0].id, decoded_items[0].digest, decoded_items[0].inline, decoded_items[0].forget),
            (items[0].id, 77, None, false)
        );
        assert!(decoded_items[1].forget && decoded_items[1].inline.is_none());
        let (offset, bytes) = decoded_items[2].inline.unwrap();
        assert_eq!(crc32c::crc32c(bytes), items[2].digest);
        let DecodedCommand::Write(ops) = decode(bytes).unwrap().command else { panic!("not a write") };
        let span = ops[0].value.unwrap();
        let in_entry = ValueSpan { offset: offset + span.offset, len: span.len };
        assert_eq!(in_entry.value(&data), b"fast value");
        // Every cut of the order is refused, never read past.
        for cut in 0..data.len() {
            assert!(decode(&data[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn repair_commands_round_trip() {
        let data = encode_repair_request(7, b"k");
        let decoded = decode(&data).unwrap();
        assert_eq!(decoded.command, DecodedCommand::RepairRequest { key: b"k" });
        assert_eq!((decoded.request_id, decoded.time_ms), (RequestId::default(), 7));
        let data = encode_repair(8, b"key", b"value");
        let DecodedCommand::Repair { key, value } = decode(&data).unwrap().command else { panic!() };
        assert_eq!(key, b"key");
        assert_eq!(verify_stored_value(&data[value.offset..value.offset + value.len]).unwrap(), b"value");
        for cut in 0..data.len() {
            assert!(decode(&data[..cut]).is_err(), "a repair cut at {cut} decoded");
        }
    }

    #[test]
    fn a_cas_round_trips() {
        let command = Command::Cas {
            key: b"k".to_vec(),
            expected: None,
            new: Some(b"v".to_vec()),
            new_expiry: Default::default(),
        };
        let data = encode(id(), 5, &command);
        let DecodedCommand::Cas { key, expected, new, new_expiry } = decode(&data).unwrap().command else {
            panic!()
        };
        assert_eq!((key, expected), (&b"k"[..], None));
        assert_eq!(new.unwrap().value(&data), b"v");
        assert_eq!(new_expiry, Expiry::Never);
    }

    #[test]
    fn expiries_round_trip_in_writes_swaps_and_transactions_and_truncations_fail() {
        let expiries = [Expiry::Never, Expiry::At(0x0102_0304_0506_0708), Expiry::Keep, Expiry::AfterMs(95)];
        for given in expiries {
            // A relative time is carried as the entry's time (5) plus it.
            let expiry = if given == Expiry::AfterMs(95) { Expiry::At(100) } else { given };
            let op = WriteOp { key: b"key".to_vec(), value: Some(b"val".to_vec()), expiry: given };
            for command in [
                Command::Write(vec![op.clone(), WriteOp::delete(b"gone".to_vec())]),
                Command::Txn { conditions: vec![], ops: vec![op.clone()] },
            ] {
                let data = encode(id(), 5, &command);
                let (DecodedCommand::Write(ops) | DecodedCommand::Txn { ops, .. }) =
                    decode(&data).unwrap().command
                else {
                    panic!("not a write")
                };
                assert_eq!((ops[0].key, ops[0].expiry), (&b"key"[..], expiry));
                assert_eq!(ops[0].value.unwrap().value(&data), b"val");
                for cut in 0..data.len() {
                    assert!(decode(&data[..cut]).is_err(), "{expiry:?} cut at {cut} decoded");
                }
            }
            let cas = Command::Cas {
                key: b"k".to_vec(),
                expected: None,
                new: Some(b"v".to_vec()),
                new_expiry: given,
            };
            let data = encode(id(), 5, &cas);
            let DecodedCommand::Cas { new, new_expiry, .. } = decode(&data).unwrap().command else {
                panic!()
            };
            assert_eq!((new.unwrap().value(&data), new_expiry), (&b"v"[..], expiry));
        }
    }

    #[test]
    fn a_range_deletion_round_trips_and_every_truncation_is_an_error() {
        for (end, spare) in [(None, &b""[..]), (Some(b"m".to_vec()), &b"\xffonekv/"[..])] {
            let command = Command::DeleteRange {
                start: b"a".to_vec(),
                end: end.clone(),
                limit: 1024,
                spare: spare.to_vec(),
            };
            let data = encode(id(), 7, &command);
            let decoded = decode(&data).unwrap();
            assert_eq!((decoded.request_id, decoded.time_ms), (id(), 7));
            assert_eq!(
                decoded.command,
                DecodedCommand::DeleteRange { start: b"a", end: end.as_deref(), limit: 1024, spare }
            );
            for cut in 0..data.len() {
                assert!(decode(&data[..cut]).is_err(), "cut at {cut} decoded");
            }
        }
    }

    #[test]
    fn a_deletion_of_expired_keys_round_trips() {
        let keys = vec![b"a".to_vec(), b"bb".to_vec()];
        let data = encode_delete_expired(42, &keys);
        let decoded = decode(&data).unwrap();
        assert_eq!((decoded.request_id, decoded.time_ms), (RequestId::default(), 42));
        assert_eq!(decoded.command, DecodedCommand::DeleteExpired { keys: vec![&b"a"[..], &b"bb"[..]] });
        for cut in 0..data.len() {
            assert!(decode(&data[..cut]).is_err(), "cut at {cut} decoded");
        }
        // A count larger than the bytes could hold is refused before allocating.
        let mut huge = data.clone();
        huge[26..30].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&huge).is_err());
    }

    #[test]
    fn a_txn_round_trips_and_every_truncation_is_an_error() {
        let command = Command::Txn {
            conditions: vec![
                Condition { key: b"a".to_vec(), expected: Some(b"1".to_vec()) },
                Condition { key: b"b".to_vec(), expected: None },
            ],
            ops: vec![
                WriteOp { key: b"a".to_vec(), value: Some(b"2".to_vec()), expiry: Default::default() },
                WriteOp { key: b"c".to_vec(), value: None, expiry: Default::default() },
            ],
        };
        let data = encode(id(), 5, &command);
        let decoded = decode(&data).unwrap();
        assert_eq!((decoded.request_id, decoded.time_ms), (id(), 5));
        let DecodedCommand::Txn { conditions, ops } = decoded.command else { panic!("not a txn") };
        assert_eq!(conditions, vec![(&b"a"[..], Some(&b"1"[..])), (&b"b"[..], None)]);
        assert_eq!(ops.len(), 2);
        let span = ops[0].value.unwrap();
        assert_eq!((ops[0].key, span.value(&data)), (&b"a"[..], &b"2"[..]));
        assert_eq!(verify_stored_value(&data[span.offset..span.offset + span.len]).unwrap(), b"2");
        assert_eq!(ops[1], DecodedOp { key: b"c", value: None, reference: None, expiry: Expiry::Never });
        assert_eq!(encoded_payload_len(&command), 3);
        for len in 0..data.len() {
            assert!(decode(&data[..len]).is_err(), "prefix of {len} bytes decoded");
        }
        // A conditions-only transaction is a valid command.
        let check =
            Command::Txn { conditions: vec![Condition { key: b"k".to_vec(), expected: None }], ops: vec![] };
        let data = encode(id(), 5, &check);
        let DecodedCommand::Txn { conditions, ops } = decode(&data).unwrap().command else { panic!() };
        assert_eq!((conditions.len(), ops.len()), (1, 0));
    }

    #[test]
    fn version_1_commands_still_decode_with_time_0() {
        let command =
            Command::Cas { key: b"k".to_vec(), expected: None, new: None, new_expiry: Default::default() };
        let mut data = encode(id(), 5, &command);
        // Version 1 had no time: drop its 8 bytes after the request id.
        data[0] = VERSION_WITHOUT_TIME;
        data.drain(18..26);
        let decoded = decode(&data).unwrap();
        assert_eq!((decoded.request_id, decoded.time_ms), (id(), 0));
        data[0] = 3;
        assert!(decode(&data).is_err());
    }

    #[test]
    fn a_damaged_stored_value_is_detected() {
        let mut stored = stored_value(b"value");
        assert_eq!(verify_stored_value(&stored).unwrap(), b"value");
        stored[6] ^= 1;
        assert!(verify_stored_value(&stored).is_err());
        assert!(verify_stored_value(&[1, 2]).is_err());
    }

    #[test]
    fn every_truncation_of_a_command_is_an_error() {
        let command = Command::Write(vec![WriteOp {
            key: b"key".to_vec(),
            value: Some(b"val".to_vec()),
            expiry: Default::default(),
        }]);
        let data = encode(id(), 5, &command);
        for len in 0..data.len() {
            assert!(decode(&data[..len]).is_err(), "prefix of {len} bytes decoded");
        }
        let mut longer = data.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn txns_round_trip(
            conditions in proptest::collection::vec(
                (proptest::collection::vec(any::<u8>(), 0..16), proptest::option::of(proptest::collection::vec(any::<u8>(), 0..32))),
                0..8,
            ),
            ops in proptest::collection::vec(
                (proptest::collection::vec(any::<u8>(), 0..16), proptest::option::of(proptest::collection::vec(any::<u8>(), 0..32))),
                0..8,
            ),
        ) {
            let conditions: Vec<Condition> =
                conditions.into_iter().map(|(key, expected)| Condition { key, expected }).collect();
            let ops: Vec<WriteOp> = ops.into_iter().map(|(key, value)| WriteOp { key, value, expiry: Default::default() }).collect();
            let data = encode(id(), 5, &Command::Txn { conditions: conditions.clone(), ops: ops.clone() });
            let DecodedCommand::Txn { conditions: decoded_conditions, ops: decoded_ops } = decode(&data).unwrap().command
            else {
                panic!()
            };
            prop_assert_eq!(decoded_conditions.len(), conditions.len());
            for (condition, (key, expected)) in conditions.iter().zip(&decoded_conditions) {
                prop_assert_eq!(&condition.key[..], *key);
                prop_assert_eq!(condition.expected.as_deref(), *expected);
            }
            prop_assert_eq!(decoded_ops.len(), ops.len());
            for (op, d) in ops.iter().zip(&decoded_ops) {
                prop_assert_eq!(&op.key[..], d.key);
                prop_assert_eq!(op.value.as_deref(), d.value.map(|s| s.value(&data)));
            }
        }

        #[test]
        fn writes_round_trip(ops in proptest::collection::vec(
            (proptest::collection::vec(any::<u8>(), 0..16), proptest::option::of(proptest::collection::vec(any::<u8>(), 0..32))),
            0..8,
        )) {
            let ops: Vec<WriteOp> = ops.into_iter().map(|(key, value)| WriteOp { key, value, expiry: Default::default() }).collect();
            let data = encode(id(), 5, &Command::Write(ops.clone()));
            let DecodedCommand::Write(decoded) = decode(&data).unwrap().command else { panic!() };
            prop_assert_eq!(decoded.len(), ops.len());
            for (op, d) in ops.iter().zip(&decoded) {
                prop_assert_eq!(&op.key[..], d.key);
                prop_assert_eq!(op.value.as_deref(), d.value.map(|s| s.value(&data)));
            }
        }
    }
}
