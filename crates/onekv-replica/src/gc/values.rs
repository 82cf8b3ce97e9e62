//! Which values a log record holds: the bytes an index may point at, with their keys and shards.
//! The collector reads segments it cannot collect by key through this; it knows every record kind
//! that carries values (ENTRY commands, ORDER copies inside them, DURABILITY records, SNAP_CHUNK,
//! RELOCATED and PACKED pairs).

use super::LiveValue;
use crate::codec::{self, DecodedCommand, ValueSpan};
use crate::{packed, records};
use onekv_index::{IndexValue, Packed};
use onekv_log::{Locator, RecordKind};

/// A value inside a record: its shard and key, and its span in the record's payload (covering
/// the value's checksum and bytes, as a locator does).
#[derive(Clone, Copy)]
pub(crate) struct ValueInRecord<'a> {
    pub shard: u64,
    pub key: &'a [u8],
    pub span: ValueSpan,
}

/// Every value a record holds that an index may point at.
pub(crate) fn values_in_record(
    kind: RecordKind,
    payload: &[u8],
) -> Result<Vec<ValueInRecord<'_>>, codec::CodecError> {
    let pairs_at =
        |shard: u64, start: usize, may_refer: bool| -> Result<Vec<ValueInRecord<'_>>, codec::CodecError> {
            let pairs = payload.get(start..).ok_or(codec::CodecError("record too short"))?;
            // A snapshot chunk's references hold no value: the keys they name point at an earlier
            // pair's copy (shared, as a deduplicated key does).
            records::SnapshotItems::new(pairs)
                .filter_map(|pair| match pair {
                    Ok(([], _, _)) => None,
                    Ok((_, records::PairValue::SameAs(_), _)) if may_refer => None,
                    Ok((_, records::PairValue::SameAs(_), _)) => {
                        Some(Err(codec::CodecError("a value reference outside a snapshot chunk")))
                    }
                    Ok((key, records::PairValue::Stored(span), _)) => Some(Ok(ValueInRecord {
                        shard,
                        key,
                        span: ValueSpan { offset: start + span.offset, len: span.len },
                    })),
                    Err(error) => Some(Err(error)),
                })
                .collect()
        };
    match kind {
        records::ENTRY => {
            let entry = records::decode_entry(payload)?;
            // Only normal entries carry commands (type 0); no-ops carry nothing.
            if entry.entry_type != 0 || entry.data.is_empty() {
                return Ok(Vec::new());
            }
            let decoded = codec::decode(entry.data)?;
            let shard = entry.shard;
            let value = |key, span: ValueSpan| ValueInRecord {
                shard,
                key,
                span: ValueSpan { offset: entry.data_offset + span.offset, len: span.len },
            };
            Ok(match decoded.command {
                DecodedCommand::Write(ops) | DecodedCommand::Txn { ops, .. } => {
                    ops.into_iter().filter_map(|op| op.value.map(|span| value(op.key, span))).collect()
                }
                // The copies an order carries for replicas without the durability record.
                DecodedCommand::Order { items, .. } => {
                    let mut values = Vec::new();
                    for (offset, bytes) in items.into_iter().filter_map(|item| item.inline) {
                        if let DecodedCommand::Write(ops) = codec::decode(bytes)?.command {
                            values.extend(ops.into_iter().filter_map(|op| {
                                op.value.map(|span| {
                                    value(op.key, ValueSpan { offset: offset + span.offset, len: span.len })
                                })
                            }));
                        }
                    }
                    values
                }
                DecodedCommand::Cas { key, new, .. } => {
                    new.map(|span| value(key, span)).into_iter().collect()
                }
                DecodedCommand::Repair { key, value: span } => vec![value(key, span)],
                DecodedCommand::RepairRequest { .. }
                | DecodedCommand::DeleteExpired { .. }
                | DecodedCommand::DeleteRange { .. } => Vec::new(),
            })
        }
        records::SNAP_CHUNK => {
            let (shard, ..) = records::decode_snapshot_chunk(payload)?;
            pairs_at(shard, records::SNAP_CHUNK_HEADER, true)
        }
        records::RELOCATED => {
            let shard = records::record_shard(kind, payload)?;
            pairs_at(shard, records::RELOCATED_HEADER, false)
        }
        // A fast write's own values (`fast`), which the index points at once it is ordered.
        records::DURABILITY => {
            let (shard, _, command) = records::decode_durability(payload)?;
            let DecodedCommand::Write(ops) = codec::decode(command)?.command else {
                return Err(codec::CodecError("a durability record holds no write"));
            };
            Ok(ops
                .into_iter()
                .filter_map(|op| {
                    op.value.map(|span| ValueInRecord {
                        shard,
                        key: op.key,
                        span: ValueSpan { offset: records::DURABILITY_HEADER + span.offset, len: span.len },
                    })
                })
                .collect())
        }
        _ => Ok(Vec::new()),
    }
}

/// Every value in the compressed blocks of a PACKED record at `record` (its payload's locator),
/// with where an index pointing at it points. A block that does not match its checksum or does not
/// decompress is an error (nothing in it can be judged dead).
pub(crate) fn packed_values_in_record(
    payload: &[u8],
    record: Locator,
) -> Result<Vec<LiveValue>, codec::CodecError> {
    let shard = records::record_shard(records::PACKED, payload)?;
    let mut found = Vec::new();
    for span in packed::blocks(payload)? {
        let block = record
            .slice(span.start as u64, span.len() as u64)
            .ok_or(codec::CodecError("a block leaves its record"))?;
        let raw = packed::unpack(&payload[span])?;
        for pair in records::SnapshotPairs::new(&raw) {
            let (key, value, _) = pair?;
            found.push(LiveValue {
                shard,
                key: key.to_vec(),
                at: IndexValue::Packed(Packed { block, offset: value.offset as u32, len: value.len as u32 }),
                stored: raw[value.offset..value.offset + value.len].into(),
            });
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Command, RequestId, WriteOp};

    #[test]
    fn a_record_names_every_value_an_index_may_point_at() {
        let command = Command::Write(vec![
            WriteOp { key: b"a".to_vec(), value: Some(b"one".to_vec()), expiry: Default::default() },
            WriteOp { key: b"b".to_vec(), value: None, expiry: Default::default() },
            WriteOp { key: b"c".to_vec(), value: Some(b"three".to_vec()), expiry: Default::default() },
        ]);
        let entry = raft::eraftpb::Entry {
            term: 2,
            index: 9,
            data: codec::encode(RequestId { client: 1, seq: 1 }, 0, &command).into(),
            ..Default::default()
        };
        let payload = records::encode_entry(7, &entry);
        let found = values_in_record(records::ENTRY, &payload).unwrap();
        let values: Vec<(u64, &[u8], &[u8])> = found
            .iter()
            .map(|v| (v.shard, v.key, &payload[v.span.offset + 4..v.span.offset + v.span.len]))
            .collect();
        assert_eq!(values, vec![(7, &b"a"[..], &b"one"[..]), (7, &b"c"[..], &b"three"[..])]);

        let mut pairs = Vec::new();
        records::push_snapshot_pair(&mut pairs, b"k", b"value");
        records::push_snapshot_pair(&mut pairs, b"", b"window ids");
        let stored = codec::stored_value(b"moved");
        records::push_stored_pair(&mut pairs, b"m", &stored);
        let payload = records::encode_relocated(3, &pairs);
        let found = values_in_record(records::RELOCATED, &payload).unwrap();
        assert_eq!(found.len(), 2, "the request-window pair (empty key) is no value");
        let ValueInRecord { shard, key, span } = found[1];
        assert_eq!((shard, key), (3, &b"m"[..]));
        assert_eq!(&payload[span.offset..span.offset + span.len], &stored[..]);
        codec::verify_stored_value(&payload[span.offset..span.offset + span.len]).unwrap();

        // A snapshot chunk's reference names a key but holds no value of it.
        records::push_reference_pair(&mut pairs, b"n", None, b"m");
        let chunk = records::encode_snapshot_chunk(5, 40, 0, &pairs);
        let found = values_in_record(records::SNAP_CHUNK, &chunk).unwrap();
        assert_eq!(
            found.iter().map(|v| (v.shard, v.key)).collect::<Vec<_>>(),
            vec![(5, &b"k"[..]), (5, &b"m"[..])]
        );
        let relocated = records::encode_relocated(3, &pairs);
        assert!(values_in_record(records::RELOCATED, &relocated).is_err(), "no reference is relocated");
        assert!(values_in_record(records::HARD_STATE, &[0; 32]).unwrap().is_empty());
        assert!(values_in_record(records::ENTRY, &payload[..3]).is_err());
    }
}
