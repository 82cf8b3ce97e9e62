//! The replica's decoders on arbitrary bytes: commands (from Raft entries, which peers send) and
//! every record kind the replica writes to the log, and the log GC's compressed blocks. None may
//! panic or read out of bounds.

#![no_main]

use libfuzzer_sys::fuzz_target;
use onekv_replica::{codec, packed, records};

fuzz_target!(|data: &[u8]| {
    if let Ok(decoded) = codec::decode(data) {
        // Every span a successful decode reports lies inside the input.
        let spans = match decoded.command {
            codec::DecodedCommand::Write(ops) => ops.iter().filter_map(|op| op.value).collect::<Vec<_>>(),
            codec::DecodedCommand::Cas { new, .. } => new.into_iter().collect(),
            codec::DecodedCommand::Txn { ops, .. } => ops.iter().filter_map(|op| op.value).collect(),
            codec::DecodedCommand::RepairRequest { .. }
            | codec::DecodedCommand::DeleteExpired { .. }
            | codec::DecodedCommand::DeleteRange { .. } => Vec::new(),
            codec::DecodedCommand::Repair { value, .. } => vec![value],
            // The fast path's ORDER: each inline command lies inside the input, and its value
            // spans, moved by the command's offset, do too.
            codec::DecodedCommand::Order { items, .. } => {
                let mut spans = Vec::new();
                for (offset, bytes) in items.iter().filter_map(|item| item.inline) {
                    assert!(offset + bytes.len() <= data.len());
                    assert_eq!(&data[offset..offset + bytes.len()], bytes);
                    if let Ok(inner) = codec::decode(bytes)
                        && let codec::DecodedCommand::Write(ops) = inner.command
                    {
                        spans.extend(ops.iter().filter_map(|op| op.value).map(|span| codec::ValueSpan {
                            offset: offset + span.offset,
                            len: span.len,
                        }));
                    }
                }
                spans
            }
        };
        for span in spans {
            assert!(span.offset + span.len <= data.len());
            let _ = codec::verify_stored_value(&data[span.offset..span.offset + span.len]);
        }
    }
    let _ = codec::verify_stored_value(data);
    if let Ok(entry) = records::decode_entry(data) {
        assert_eq!(entry.data_offset + entry.data.len(), data.len());
        let _ = codec::decode(entry.data);
    }
    for kind in 1..=u8::MAX {
        if let Some(kind) = onekv_log::RecordKind::new(kind) {
            let _ = records::record_shard(kind, data);
        }
    }
    let _ = records::decode_hard_state(data);
    if let Ok((_, _, command)) = records::decode_durability(data) {
        assert_eq!(records::DURABILITY_HEADER + command.len(), data.len());
        let _ = codec::decode(command);
    }
    let _ = records::decode_recovery_point(data, 1);
    let _ = records::decode_snapshot_chunk(data);
    let _ = records::decode_snapshot_meta(data);
    for pair in records::SnapshotPairs::new(data) {
        if pair.is_err() {
            break;
        }
    }
    // A block's claimed length is bounded before anything is allocated for it.
    if let Ok(raw) = packed::unpack(data) {
        assert!(raw.len() <= packed::MAX_BLOCK_BYTES);
        let _ = packed::stored_value(&raw, 0, raw.len() as u32);
    }
    if let Ok(spans) = packed::blocks(data) {
        assert!(spans.iter().all(|span| span.end <= data.len()));
    }
});
