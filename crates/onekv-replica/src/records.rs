//! The replica's record kinds in the node's log, and their payload layouts.
//!
//! The log frames and checksums every record; this module owns what is inside. Every record that
//! belongs to a Raft group starts with the group's shard id, so one log serves many groups. All
//! integers are little-endian with explicit widths:
//!
//! ```text
//! ENTRY       shard:u64 term:u64 index:u64 type:u8 context_len:u32 context data
//! HARD_STATE  shard:u64 term:u64 vote:u64 commit:u64
//! SNAP_CHUNK  shard:u64 index:u64 chunk:u32 pairs            (pairs: see `SnapshotPairs`)
//! SNAP_META   shard:u64 index:u64 term:u64 chunks:u32 members   (members: see `encode_members`)
//! VALUE       shard:u64 stored_value                          (separated mode's value log)
//! APPLIED     shard:u64 index:u64 count:u32 (kind:u8 key [value])*count   (classic mode's data WAL)
//! RELOCATED   shard:u64 pairs                                 (values the log GC moved; `gc`)
//! PACKED      shard:u64 block*                                (small values it moved, compressed;
//!                                                              blocks: see `packed`)
//! DURABILITY  shard:u64 term:u64 command                      (a fast write, `fast`: its encoded
//!                                                              write command, with its request id)
//! ```
//!
//! A snapshot is written as chunk records followed by one meta record; it counts only if the meta
//! record is there and names as many chunks as precede it.

use crate::codec::{CodecError, Reader, ValueSpan};
use onekv_log::RecordKind;
use raft::eraftpb::ConfState;

/// A Raft entry.
pub const ENTRY: RecordKind = kind(1);
/// A Raft hard state (term, vote, commit).
pub const HARD_STATE: RecordKind = kind(2);
/// Part of an installed snapshot's key-value pairs.
pub const SNAP_CHUNK: RecordKind = kind(3);
/// The metadata that completes an installed snapshot.
pub const SNAP_META: RecordKind = kind(4);
/// A value copied into the separated mode's value log.
pub const VALUE: RecordKind = kind(5);
/// Operations applied to the classic mode's data tree (its write-ahead log).
pub const APPLIED: RecordKind = kind(6);
/// Live values the log garbage collector moved out of a segment it reclaims (`gc`).
pub const RELOCATED: RecordKind = kind(7);
/// Small live values the log garbage collector moved, in compressed blocks (`packed`).
pub const PACKED: RecordKind = kind(8);
/// A fast write a replica made durable before it was ordered (`fast`); its values are the
/// replica's one copy once an ORDER command applies it.
pub const DURABILITY: RecordKind = kind(9);

/// Bytes of a DURABILITY payload before its command.
pub const DURABILITY_HEADER: usize = 8 + 8;

const fn kind(n: u8) -> RecordKind {
    match RecordKind::new(n) {
        Some(kind) => kind,
        None => panic!("record kinds are non-zero"),
    }
}

/// Bytes of an ENTRY payload before its context.
const ENTRY_HEADER: usize = 8 + 8 + 8 + 1 + 4;

/// Offset of an entry's data inside its ENTRY payload, for an entry with `context_len` bytes of
/// context.
pub fn entry_data_offset(context_len: usize) -> usize {
    ENTRY_HEADER + context_len
}

/// A decoded ENTRY payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryRecord<'a> {
    /// The Raft group.
    pub shard: u64,
    /// Entry term.
    pub term: u64,
    /// Entry index.
    pub index: u64,
    /// `raft::eraftpb::EntryType` as a number.
    pub entry_type: u8,
    /// Entry context.
    pub context: &'a [u8],
    /// Entry data (an encoded command, or a conf change).
    pub data: &'a [u8],
    /// Offset of `data` from the start of the payload: add a [`ValueSpan`]'s offset to it to locate
    /// a value inside the record.
    pub data_offset: usize,
}

/// Encodes an ENTRY payload.
pub fn encode_entry(shard: u64, entry: &raft::eraftpb::Entry) -> Vec<u8> {
    let mut out = Vec::with_capacity(ENTRY_HEADER + entry.context.len() + entry.data.len());
    out.extend_from_slice(&shard.to_le_bytes());
    out.extend_from_slice(&entry.term.to_le_bytes());
    out.extend_from_slice(&entry.index.to_le_bytes());
    out.push(entry.get_entry_type() as u8);
    out.extend_from_slice(&(entry.context.len() as u32).to_le_bytes());
    out.extend_from_slice(&entry.context);
    out.extend_from_slice(&entry.data);
    out
}

/// The shard a record of any kind belongs to (every kind starts with it), so recovery can split
/// one scan of the log by shard before decoding the rest.
pub fn record_shard(kind: RecordKind, payload: &[u8]) -> Result<u64, CodecError> {
    if !matches!(
        kind,
        ENTRY | HARD_STATE | SNAP_CHUNK | SNAP_META | VALUE | APPLIED | RELOCATED | PACKED | DURABILITY
    ) {
        return Err(CodecError("unknown record kind"));
    }
    Reader { data: payload, at: 0 }.u64()
}

/// Encodes a DURABILITY payload: the fast write's encoded write `command`, accepted in `term`.
pub fn encode_durability(shard: u64, term: u64, command: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(DURABILITY_HEADER + command.len());
    out.extend_from_slice(&shard.to_le_bytes());
    out.extend_from_slice(&term.to_le_bytes());
    out.extend_from_slice(command);
    out
}

/// Decodes a DURABILITY payload: `(shard, term, command)`; the command starts at
/// [`DURABILITY_HEADER`] in the payload.
pub fn decode_durability(payload: &[u8]) -> Result<(u64, u64, &[u8]), CodecError> {
    let mut r = Reader { data: payload, at: 0 };
    let (shard, term) = (r.u64()?, r.u64()?);
    Ok((shard, term, &payload[DURABILITY_HEADER..]))
}

/// Decodes an ENTRY payload.
pub fn decode_entry(payload: &[u8]) -> Result<EntryRecord<'_>, CodecError> {
    let mut r = Reader { data: payload, at: 0 };
    let shard = r.u64()?;
    let term = r.u64()?;
    let index = r.u64()?;
    let entry_type = r.u8()?;
    if entry_type > 2 {
        return Err(CodecError("unknown entry type"));
    }
    let context = r.bytes()?;
    let data_offset = r.at;
    Ok(EntryRecord { shard, term, index, entry_type, context, data: &payload[data_offset..], data_offset })
}

impl EntryRecord<'_> {
    /// The raft-rs entry this record holds.
    pub fn to_entry(&self) -> raft::eraftpb::Entry {
        let mut entry = raft::eraftpb::Entry {
            term: self.term,
            index: self.index,
            context: self.context.to_vec().into(),
            data: self.data.to_vec().into(),
            ..Default::default()
        };
        entry.set_entry_type(match self.entry_type {
            0 => raft::eraftpb::EntryType::EntryNormal,
            1 => raft::eraftpb::EntryType::EntryConfChange,
            _ => raft::eraftpb::EntryType::EntryConfChangeV2,
        });
        entry
    }
}

/// A decoded HARD_STATE payload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HardStateRecord {
    /// The Raft group.
    pub shard: u64,
    /// Current term.
    pub term: u64,
    /// Vote in that term (0: none).
    pub vote: u64,
    /// Commit index.
    pub commit: u64,
}

/// Encodes a HARD_STATE payload.
pub fn encode_hard_state(record: HardStateRecord) -> Vec<u8> {
    [record.shard, record.term, record.vote, record.commit].iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Decodes a HARD_STATE payload.
pub fn decode_hard_state(payload: &[u8]) -> Result<HardStateRecord, CodecError> {
    let mut r = Reader { data: payload, at: 0 };
    let record = HardStateRecord { shard: r.u64()?, term: r.u64()?, vote: r.u64()?, commit: r.u64()? };
    if r.remaining() != 0 {
        return Err(CodecError("trailing bytes after a hard state"));
    }
    Ok(record)
}

/// Snapshot pairs: the format of a Raft snapshot's data on the wire and of a SNAP_CHUNK's tail:
/// `(key_len:u32 key [expires_at_ms:u64] value_len:u32 crc32c:u32 value)*`, whose value part is
/// the command codec's stored value layout, so the index can point into a chunk record exactly as
/// into an entry. Bit 31 of `key_len` ([`PAIR_EXPIRES`]) says the key expires, at the time that
/// follows it (a key's length never comes near 2^31).
///
/// Bit 30 ([`PAIR_SAME_AS`]) makes the pair a reference instead: `(key_len:u32 key
/// [expires_at_ms:u64] same_as_len:u32 same_as)`, "this key's value is the value key `same_as` has
/// in this same snapshot", where `same_as` is an earlier user key of the snapshot (a snapshot
/// sends a copy that several keys share once, `snapshot::copies`). Only snapshots carry
/// references; [`SnapshotPairs`] refuses them, [`SnapshotItems`] yields them.
pub struct SnapshotPairs<'a> {
    items: SnapshotItems<'a>,
}

impl<'a> SnapshotPairs<'a> {
    /// Iterates over the pairs in `data`.
    pub fn new(data: &'a [u8]) -> Self {
        SnapshotPairs { items: SnapshotItems::new(data) }
    }
}

/// Bit 31 of a snapshot pair's key length: an expiry time follows the key.
pub const PAIR_EXPIRES: u32 = 1 << 31;

/// Bit 30 of a snapshot pair's key length: the pair is a reference to an earlier key's value.
pub const PAIR_SAME_AS: u32 = 1 << 30;

/// What a snapshot pair holds for its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PairValue<'a> {
    /// The value itself: its span in the data (covering the CRC).
    Stored(ValueSpan),
    /// The value an earlier key of the same snapshot has.
    SameAs(&'a [u8]),
}

impl<'a> Iterator for SnapshotPairs<'a> {
    /// A key, its value's span in the data (covering the CRC) and its expiry time, or a decoding
    /// error (a reference is one).
    type Item = Result<(&'a [u8], ValueSpan, Option<u64>), CodecError>;

    fn next(&mut self) -> Option<Self::Item> {
        let item = self.items.next()?;
        Some(item.and_then(|(key, value, expiry)| match value {
            PairValue::Stored(span) => Ok((key, span, expiry)),
            PairValue::SameAs(_) => {
                self.items.reader.at = self.items.reader.data.len();
                Err(CodecError("a value reference where only values may be"))
            }
        }))
    }
}

/// The pairs of snapshot data, references included ([`SnapshotPairs`]).
pub struct SnapshotItems<'a> {
    reader: Reader<'a>,
}

impl<'a> SnapshotItems<'a> {
    /// Iterates over the pairs and references in `data`.
    pub fn new(data: &'a [u8]) -> Self {
        SnapshotItems { reader: Reader { data, at: 0 } }
    }

    /// Bytes of the data read so far: the end of the last pair yielded.
    pub fn position(&self) -> usize {
        self.reader.at
    }
}

impl<'a> Iterator for SnapshotItems<'a> {
    /// A key, its value or reference, and its expiry time, or a decoding error.
    type Item = Result<(&'a [u8], PairValue<'a>, Option<u64>), CodecError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.reader.remaining() == 0 {
            return None;
        }
        let reader = &mut self.reader;
        let pair = reader.u32().and_then(|len| {
            let key = reader.take((len & !(PAIR_EXPIRES | PAIR_SAME_AS)) as usize)?;
            let expiry = if len & PAIR_EXPIRES != 0 { Some(reader.u64()?) } else { None };
            let value = if len & PAIR_SAME_AS != 0 {
                let same_as_len = reader.u32()?;
                PairValue::SameAs(reader.take(same_as_len as usize)?)
            } else {
                PairValue::Stored(reader.value()?)
            };
            Ok((key, value, expiry))
        });
        if pair.is_err() {
            self.reader.at = self.reader.data.len();
        }
        Some(pair)
    }
}

/// Appends a reference to snapshot data: `key` (expiring at `expiry`, if any) has the value the
/// earlier key `same_as` has in the same snapshot.
pub fn push_reference_pair(out: &mut Vec<u8>, key: &[u8], expiry: Option<u64>, same_as: &[u8]) {
    debug_assert!((key.len() as u32) < PAIR_SAME_AS, "a key of 1 GiB");
    let flag = PAIR_SAME_AS | if expiry.is_some() { PAIR_EXPIRES } else { 0 };
    out.extend_from_slice(&(key.len() as u32 | flag).to_le_bytes());
    out.extend_from_slice(key);
    if let Some(at) = expiry {
        out.extend_from_slice(&at.to_le_bytes());
    }
    out.extend_from_slice(&(same_as.len() as u32).to_le_bytes());
    out.extend_from_slice(same_as);
}

/// Appends one pair to snapshot data.
pub fn push_snapshot_pair(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    push_expiring_pair(out, key, None, value);
}

/// Appends one pair whose key expires at `expiry` (if any) to snapshot data.
pub fn push_expiring_pair(out: &mut Vec<u8>, key: &[u8], expiry: Option<u64>, value: &[u8]) {
    debug_assert!((key.len() as u32) < PAIR_SAME_AS, "a key of 1 GiB");
    let flag = if expiry.is_some() { PAIR_EXPIRES } else { 0 };
    out.extend_from_slice(&(key.len() as u32 | flag).to_le_bytes());
    out.extend_from_slice(key);
    if let Some(at) = expiry {
        out.extend_from_slice(&at.to_le_bytes());
    }
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(value).to_le_bytes());
    out.extend_from_slice(value);
}

/// Largest part of anything the replica cuts into records of its own (snapshot chunks, relocated
/// batches, request-window pairs): 4 MiB, or half the log's record limit if that is smaller. One
/// pair larger than this still goes in a record of its own (every pair fits a record: a value fits
/// a Raft entry).
pub fn chunk_bytes(max_record_bytes: u32) -> usize {
    (max_record_bytes as usize / 2).min(4 << 20)
}

/// The hard state a snapshot implies on top of `durable`: it commits at least up to its index, in
/// at least its term (a recovery point stored with a snapshot's flush carries it).
pub fn snapshot_hard_state(durable: HardStateRecord, meta: &SnapshotMeta) -> HardStateRecord {
    HardStateRecord { commit: durable.commit.max(meta.index), term: durable.term.max(meta.term), ..durable }
}

/// Bytes of a RELOCATED payload before its pairs.
pub const RELOCATED_HEADER: usize = 8;

/// Encodes a RELOCATED payload holding `pairs` (whole pairs in the snapshot-pairs format).
pub fn encode_relocated(shard: u64, pairs: &[u8]) -> Vec<u8> {
    shard_then(shard, pairs)
}

/// Bytes of a PACKED payload before its blocks.
pub const PACKED_HEADER: usize = 8;

/// Encodes a PACKED payload: the shard, then `blocks` (whole framed blocks, `packed::push_block`).
pub fn encode_packed(shard: u64, blocks: &[u8]) -> Vec<u8> {
    shard_then(shard, blocks)
}

/// A payload that is the shard (8 bytes) followed by `body` as it is.
fn shard_then(shard: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(&shard.to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// Appends one pair whose value is already stored (`crc32c || value`, as read through a
/// locator) to snapshot-pairs data, keeping its checksum as it is: a damaged value stays
/// detectably damaged wherever it is moved.
pub fn push_stored_pair(out: &mut Vec<u8>, key: &[u8], stored: &[u8]) {
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&((stored.len() - crate::codec::STORED_VALUE_PREFIX) as u32).to_le_bytes());
    out.extend_from_slice(stored);
}

/// Bytes of a SNAP_CHUNK payload before its pairs.
pub const SNAP_CHUNK_HEADER: usize = 8 + 8 + 4;

/// Encodes a SNAP_CHUNK payload holding `pairs` (whole pairs in the snapshot-pairs format).
pub fn encode_snapshot_chunk(shard: u64, index: u64, chunk: u32, pairs: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(SNAP_CHUNK_HEADER + pairs.len());
    out.extend_from_slice(&shard.to_le_bytes());
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(&chunk.to_le_bytes());
    out.extend_from_slice(pairs);
    out
}

/// Decodes a SNAP_CHUNK payload: shard, snapshot index, chunk number (the pairs start at
/// [`SNAP_CHUNK_HEADER`]).
pub fn decode_snapshot_chunk(payload: &[u8]) -> Result<(u64, u64, u32), CodecError> {
    let mut r = Reader { data: payload, at: 0 };
    Ok((r.u64()?, r.u64()?, r.u32()?))
}

/// A decoded SNAP_META payload.
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotMeta {
    /// The Raft group.
    pub shard: u64,
    /// Last index the snapshot covers.
    pub index: u64,
    /// Term of that index.
    pub term: u64,
    /// Number of SNAP_CHUNK records written before this one.
    pub chunks: u32,
    /// The group's members at that index.
    pub members: ConfState,
}

/// Encodes a SNAP_META payload.
pub fn encode_snapshot_meta(meta: &SnapshotMeta) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + 8 * meta.members.voters.len());
    out.extend_from_slice(&meta.shard.to_le_bytes());
    out.extend_from_slice(&meta.index.to_le_bytes());
    out.extend_from_slice(&meta.term.to_le_bytes());
    out.extend_from_slice(&meta.chunks.to_le_bytes());
    encode_members(&meta.members, &mut out);
    out
}

/// Decodes a SNAP_META payload.
pub fn decode_snapshot_meta(payload: &[u8]) -> Result<SnapshotMeta, CodecError> {
    let mut r = Reader { data: payload, at: 0 };
    let (shard, index, term, chunks) = (r.u64()?, r.u64()?, r.u64()?, r.u32()?);
    let members = decode_members(&mut r, true)?;
    if r.remaining() != 0 {
        return Err(CodecError("trailing bytes after snapshot metadata"));
    }
    Ok(SnapshotMeta { shard, index, term, chunks, members })
}

/// Appends a group's members (a Raft configuration, possibly joint):
/// `voters:u32 voter:u64*voters learners:u32 learner:u64*learners outgoing:u32 voter:u64*outgoing
/// learners_next:u32 learner:u64*learners_next auto_leave:u8`. `outgoing` is the old half of a
/// joint configuration (empty outside one); `learners_next` the voters it demotes to learners on
/// leaving it; `auto_leave` whether the leader leaves it on its own once it is applied.
pub fn encode_members(members: &ConfState, out: &mut Vec<u8>) {
    for list in [&members.voters, &members.learners, &members.voters_outgoing, &members.learners_next] {
        out.extend_from_slice(&(list.len() as u32).to_le_bytes());
        for id in list {
            out.extend_from_slice(&id.to_le_bytes());
        }
    }
    out.push(u8::from(members.auto_leave));
}

/// Decodes what [`encode_members`] wrote. With `may_end_after_voters`, the encoding may stop after
/// the voters (records written before membership could change held only those) when nothing
/// follows in the payload.
fn decode_members(r: &mut Reader<'_>, may_end_after_voters: bool) -> Result<ConfState, CodecError> {
    let voters = decode_ids(r)?;
    if may_end_after_voters && r.remaining() == 0 {
        return Ok(ConfState { voters, ..Default::default() });
    }
    let (learners, voters_outgoing, learners_next) = (decode_ids(r)?, decode_ids(r)?, decode_ids(r)?);
    let auto_leave = match r.u8()? {
        0 => false,
        1 => true,
        _ => return Err(CodecError("auto_leave is neither 0 nor 1")),
    };
    Ok(ConfState { voters, learners, voters_outgoing, learners_next, auto_leave, ..Default::default() })
}

/// `count:u32 id:u64*count`.
fn decode_ids(r: &mut Reader<'_>) -> Result<Vec<u64>, CodecError> {
    let count = r.u32()? as usize;
    if count > r.remaining() / 8 {
        return Err(CodecError("member count exceeds the record"));
    }
    (0..count).map(|_| r.u64()).collect()
}

/// Where recovery may start, stored with an index tree's flush flag (not a log record: it rides in
/// the tree's flag, so it is exactly as durable as the flush it describes):
/// `version:u8=4 scan_from:u64 chunks_from:u64 snapshot_index:u64 snapshot_term:u64 term:u64
/// vote:u64 commit:u64 members from:u64 sealed_at:u64 count:u32 (client:u64 seq:u64)*count`
/// (members: see [`encode_members`]; the rest is the fast path's [`FastPoint`], written by every
/// flush). Older versions still read: version 3 has no fast point (recovery then takes every
/// DURABILITY record it scans as pending), version 2 has only `voters:u32 voter:u64*voters` for
/// its members, version 1 also has no `chunks_from` (it equals `scan_from`).
#[derive(Clone, Debug, PartialEq)]
pub struct RecoveryPoint {
    /// Log position of the ENTRY record of the first Raft entry still served after the flush:
    /// recovery takes this shard's entries, hard states and snapshot metadata from here.
    pub scan_from: u64,
    /// Where the chunks of a snapshot this shard was fetching at the flush begin (at most
    /// `scan_from`): recovery takes this shard's SNAP_CHUNK records from here, so a snapshot
    /// whose metadata follows finds them all. Nothing below the lower of the two is read.
    pub chunks_from: u64,
    /// The Raft log's compaction point (index and term just below that entry).
    pub snapshot_index: u64,
    /// Term at `snapshot_index`.
    pub snapshot_term: u64,
    /// The durable hard state at the flush.
    pub hard_state: HardStateRecord,
    /// The group's members at the flush flag's applied index.
    pub members: ConfState,
    /// The fast writes pending at the flush (`fast`); `None` only in version 3 points, read from
    /// older releases.
    pub fast: Option<FastPoint>,
}

/// Which DURABILITY records recovery takes as pending: those appended after `sealed_at` (the log's
/// end when the tree was sealed), and below it only those whose ids are in `pending` (every other
/// one was applied before the flush, whatever the window still remembers).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FastPoint {
    /// The log position of the oldest record pending at the flush (`sealed_at` if none):
    /// recovery takes this shard's DURABILITY records from here (its other records count from
    /// `scan_from` as ever).
    pub from: u64,
    /// The log's end position when the tree was sealed.
    pub sealed_at: u64,
    /// The fast writes pending then.
    pub pending: Vec<crate::RequestId>,
}

/// Encodes a recovery point.
pub fn encode_recovery_point(point: &RecoveryPoint) -> Vec<u8> {
    let mut out = vec![if point.fast.is_some() { 4u8 } else { 3u8 }];
    let hs = &point.hard_state;
    let fields = [point.scan_from, point.chunks_from, point.snapshot_index, point.snapshot_term];
    for v in fields.into_iter().chain([hs.term, hs.vote, hs.commit]) {
        out.extend_from_slice(&v.to_le_bytes());
    }
    encode_members(&point.members, &mut out);
    if let Some(fast) = &point.fast {
        out.extend_from_slice(&fast.from.to_le_bytes());
        out.extend_from_slice(&fast.sealed_at.to_le_bytes());
        out.extend_from_slice(&(fast.pending.len() as u32).to_le_bytes());
        for id in &fast.pending {
            out.extend_from_slice(&id.client.to_le_bytes());
            out.extend_from_slice(&id.seq.to_le_bytes());
        }
    }
    out
}

/// Decodes a recovery point.
pub fn decode_recovery_point(bytes: &[u8], shard: u64) -> Result<RecoveryPoint, CodecError> {
    let mut r = Reader { data: bytes, at: 0 };
    let version = r.u8()?;
    if !(1..=4).contains(&version) {
        return Err(CodecError("unknown recovery point version"));
    }
    let scan_from = r.u64()?;
    let chunks_from = if version >= 2 { r.u64()?.min(scan_from) } else { scan_from };
    let (snapshot_index, snapshot_term) = (r.u64()?, r.u64()?);
    let hard_state = HardStateRecord { shard, term: r.u64()?, vote: r.u64()?, commit: r.u64()? };
    let members = match version {
        3 | 4 => decode_members(&mut r, false)?,
        _ => ConfState { voters: decode_ids(&mut r)?, ..Default::default() },
    };
    let fast = if version == 4 {
        let from = r.u64()?;
        let sealed_at = r.u64()?;
        let count = r.u32()? as usize;
        if count > r.remaining() / 16 {
            return Err(CodecError("pending fast write count exceeds the recovery point"));
        }
        let pending = (0..count)
            .map(|_| Ok(crate::RequestId { client: r.u64()?, seq: r.u64()? }))
            .collect::<Result<_, CodecError>>()?;
        Some(FastPoint { from, sealed_at, pending })
    } else {
        None
    };
    if r.remaining() != 0 {
        return Err(CodecError("trailing bytes after a recovery point"));
    }
    Ok(RecoveryPoint { scan_from, chunks_from, snapshot_index, snapshot_term, hard_state, members, fast })
}

impl RecoveryPoint {
    /// The lowest log position recovery reads for this shard.
    pub fn lowest(&self) -> u64 {
        self.scan_from.min(self.chunks_from).min(self.fast.as_ref().map_or(u64::MAX, |fast| fast.from))
    }
}

/// Bytes of a VALUE payload before the stored value.
pub const VALUE_HEADER: usize = 8;

/// Encodes a VALUE payload: the shard, then `crc || value`.
pub fn encode_value(shard: u64, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(VALUE_HEADER + 4 + value.len());
    out.extend_from_slice(&shard.to_le_bytes());
    out.extend_from_slice(&crate::codec::stored_value(value));
    out
}

/// Encodes an APPLIED payload: the classic mode's data-tree WAL record for one entry.
pub fn encode_applied(shard: u64, index: u64, ops: &[(&[u8], Option<&[u8]>)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&shard.to_le_bytes());
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for (key, value) in ops {
        out.push(u8::from(value.is_some()));
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        out.extend_from_slice(key);
        if let Some(value) = value {
            out.extend_from_slice(&(value.len() as u32).to_le_bytes());
            out.extend_from_slice(value);
        }
    }
    out
}

/// A decoded APPLIED payload (recovery replays Raft entries, not this WAL; tests read it back): shard, index and the operations (value `None` deletes).
#[cfg(test)]
pub type AppliedRecord<'a> = (u64, u64, Vec<(&'a [u8], Option<&'a [u8]>)>);

/// Decodes an APPLIED payload.
#[cfg(test)]
pub fn decode_applied(payload: &[u8]) -> Result<AppliedRecord<'_>, CodecError> {
    let mut r = Reader { data: payload, at: 0 };
    let (shard, index) = (r.u64()?, r.u64()?);
    let count = r.u32()? as usize;
    if count > r.remaining() / 5 {
        return Err(CodecError("op count exceeds the record"));
    }
    let mut ops = Vec::with_capacity(count);
    for _ in 0..count {
        let is_put = match r.u8()? {
            0 => false,
            1 => true,
            _ => return Err(CodecError("bad op flag")),
        };
        let key = r.bytes()?;
        let value = if is_put { Some(r.bytes()?) } else { None };
        ops.push((key, value));
    }
    if r.remaining() != 0 {
        return Err(CodecError("trailing bytes after applied ops"));
    }
    Ok((shard, index, ops))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_record_round_trips_and_locates_its_data() {
        let entry = raft::eraftpb::Entry {
            term: 3,
            index: 42,
            context: b"ctx".to_vec().into(),
            data: b"data!".to_vec().into(),
            ..Default::default()
        };
        let payload = encode_entry(1, &entry);
        let record = decode_entry(&payload).unwrap();
        assert_eq!((record.shard, record.term, record.index), (1, 3, 42));
        assert_eq!(&payload[record.data_offset..], b"data!");
        assert_eq!(record.to_entry(), entry);
        for len in 0..ENTRY_HEADER + 3 {
            assert!(decode_entry(&payload[..len]).is_err());
        }
    }

    #[test]
    fn snapshot_pairs_and_metadata_round_trip() {
        let mut data = Vec::new();
        push_snapshot_pair(&mut data, b"a", b"1");
        push_snapshot_pair(&mut data, b"bb", b"");
        push_expiring_pair(&mut data, b"ccc", Some(0x0102_0304), b"3");
        let pairs: Vec<_> = SnapshotPairs::new(&data).collect::<Result<_, _>>().unwrap();
        assert_eq!(pairs.len(), 3);
        assert_eq!(pairs[0].0, b"a");
        assert_eq!(pairs[0].1.value(&data), b"1");
        assert_eq!((pairs[0].2, pairs[1].2), (None, None));
        assert_eq!(
            (pairs[2].0, pairs[2].1.value(&data), pairs[2].2),
            (&b"ccc"[..], &b"3"[..], Some(0x0102_0304))
        );
        for cut in 0..data.len() {
            let whole = SnapshotPairs::new(&data[..cut]).all(|p| p.is_ok());
            assert!(!whole || [0, 14, 28].contains(&cut), "cut at {cut} decoded");
        }
        let meta = SnapshotMeta { shard: 1, index: 9, term: 2, chunks: 3, members: joint_members() };
        let payload = encode_snapshot_meta(&meta);
        assert_eq!(decode_snapshot_meta(&payload).unwrap(), meta);
        for len in 0..payload.len() {
            assert!(decode_snapshot_meta(&payload[..len]).is_err() || len == 28 + 4 + 8 * 3, "{len}");
        }
        // Written before membership could change: the voters end the record.
        let old = &payload[..28 + 4 + 8 * 3];
        let read = decode_snapshot_meta(old).unwrap();
        assert_eq!(read.members, ConfState { voters: vec![1, 2, 4], ..Default::default() });
        let mut bad = payload.clone();
        *bad.last_mut().unwrap() = 2;
        assert!(decode_snapshot_meta(&bad).is_err(), "auto_leave must be 0 or 1");
    }

    /// A joint configuration: 3 leaves, 4 joins, 5 is learning.
    fn joint_members() -> ConfState {
        ConfState {
            voters: vec![1, 2, 4],
            learners: vec![5],
            voters_outgoing: vec![1, 2, 3],
            learners_next: vec![],
            auto_leave: true,
            ..Default::default()
        }
    }

    #[test]
    fn a_recovery_point_round_trips_and_rejects_truncation() {
        let point = RecoveryPoint {
            scan_from: 4096,
            chunks_from: 1024,
            snapshot_index: 10,
            snapshot_term: 2,
            hard_state: HardStateRecord { shard: 1, term: 3, vote: 1, commit: 40 },
            members: joint_members(),
            fast: None,
        };
        let bytes = encode_recovery_point(&point);
        assert_eq!(decode_recovery_point(&bytes, 1).unwrap(), point);
        for len in 0..bytes.len() {
            assert!(decode_recovery_point(&bytes[..len], 1).is_err());
        }
        // Version 4: the fast writes pending at the flush.
        let fast = RecoveryPoint {
            fast: Some(FastPoint {
                from: 2_000,
                sealed_at: 9_000,
                pending: vec![crate::RequestId { client: 5, seq: 6 }, crate::RequestId { client: 7, seq: 8 }],
            }),
            ..point.clone()
        };
        let fast_bytes = encode_recovery_point(&fast);
        assert_eq!(fast_bytes[0], 4);
        assert_eq!(decode_recovery_point(&fast_bytes, 1).unwrap(), fast);
        for len in 0..fast_bytes.len() {
            assert!(decode_recovery_point(&fast_bytes[..len], 1).is_err());
        }
        // Versions 1 and 2 held only the voters; version 1 had no chunks_from either (its chunks
        // start at its scan start).
        let voters_only = 1 + 7 * 8 + 4 + 8 * 3;
        let mut v2 = bytes[..voters_only].to_vec();
        v2[0] = 2;
        let old_members = ConfState { voters: vec![1, 2, 4], ..Default::default() };
        let read = decode_recovery_point(&v2, 1).unwrap();
        assert_eq!(read, RecoveryPoint { members: old_members.clone(), ..point.clone() });
        v2.push(0);
        assert!(decode_recovery_point(&v2, 1).is_err(), "a version 2 point ends after its voters");
        let mut v1 = vec![1u8];
        v1.extend_from_slice(&bytes[1..9]);
        v1.extend_from_slice(&bytes[17..voters_only]);
        let read = decode_recovery_point(&v1, 1).unwrap();
        assert_eq!(read, RecoveryPoint { chunks_from: 4096, members: old_members, ..point });
    }

    #[test]
    fn hard_state_and_applied_round_trip() {
        let hs = HardStateRecord { shard: 1, term: 2, vote: 3, commit: 4 };
        assert_eq!(decode_hard_state(&encode_hard_state(hs)).unwrap(), hs);
        let payload = encode_applied(1, 5, &[(b"k", Some(b"v")), (b"d", None)]);
        let (shard, index, ops) = decode_applied(&payload).unwrap();
        assert_eq!((shard, index), (1, 5));
        assert_eq!(ops, vec![(&b"k"[..], Some(&b"v"[..])), (&b"d"[..], None)]);
    }
    #[test]
    fn references_are_items_and_not_values() {
        let mut data = Vec::new();
        push_snapshot_pair(&mut data, b"a", b"shared");
        push_reference_pair(&mut data, b"b", None, b"a");
        push_reference_pair(&mut data, b"c", Some(7), b"a");
        push_snapshot_pair(&mut data, b"d", b"own");
        let mut items = SnapshotItems::new(&data);
        let mut ends = Vec::new();
        let mut read = Vec::new();
        while let Some(item) = items.next() {
            read.push(item.unwrap());
            ends.push(items.position());
        }
        assert_eq!(read.len(), 4);
        assert!(matches!(read[0], (b"a", PairValue::Stored(span), None) if span.value(&data) == b"shared"));
        assert_eq!(read[1], (&b"b"[..], PairValue::SameAs(b"a"), None));
        assert_eq!(read[2], (&b"c"[..], PairValue::SameAs(b"a"), Some(7)));
        assert!(matches!(read[3], (b"d", PairValue::Stored(span), None) if span.value(&data) == b"own"));
        assert_eq!(*ends.last().unwrap(), data.len());
        // Cut anywhere but between items, the data does not decode.
        for cut in 0..data.len() {
            let whole = SnapshotItems::new(&data[..cut]).all(|p| p.is_ok());
            assert!(!whole || cut == 0 || ends.contains(&cut), "cut at {cut} decoded");
        }
        // Where only values may be (the log GC's records), a reference is an error, and ends it.
        let values: Vec<_> = SnapshotPairs::new(&data).collect();
        assert_eq!(values.len(), 2);
        assert!(values[0].is_ok() && values[1].is_err());
    }
}
