//! The records the collector appends for the values it moves: large values as they are (a
//! RELOCATED record), small ones in compressed blocks (a PACKED record, `packed`), and where each
//! value lands in them, so the index can point there once the record is in the log.

use super::LiveValue;
use crate::{packed, records};
use onekv_index::{IndexValue, Packed};
use onekv_log::Locator;

/// One record's payload and the place of each of its values, in the order they were given.
pub(super) struct Batch {
    pub payload: Vec<u8>,
    pub places: Vec<Place>,
    /// Bytes of the pairs before compression (PACKED only).
    pub raw_bytes: u64,
}

/// Where a value is in its record's payload.
pub(super) enum Place {
    /// Its stored bytes, at `offset..offset + len` of the payload.
    Whole { offset: usize, len: usize },
    /// Inside the block framed at `block` of the payload, at `offset..offset + len` of its raw bytes.
    Packed { block: std::ops::Range<usize>, offset: u32, len: u32 },
}

impl Place {
    /// The index value pointing here, once the record's payload is at `record` in the log.
    pub fn at(&self, record: Locator) -> IndexValue {
        let slice =
            |offset: usize, len: usize| record.slice(offset as u64, len as u64).expect("inside the record");
        match self {
            Place::Whole { offset, len } => IndexValue::Locator(slice(*offset, *len)),
            Place::Packed { block, offset, len } => IndexValue::Packed(Packed {
                block: slice(block.start, block.len()),
                offset: *offset,
                len: *len,
            }),
        }
    }
}

impl Batch {
    /// A RELOCATED record holding `values` as they are (each keeps its checksum).
    pub fn relocated(shard: u64, values: &[&LiveValue]) -> Batch {
        let mut pairs = Vec::new();
        let mut places = Vec::with_capacity(values.len());
        for value in values {
            records::push_stored_pair(&mut pairs, &value.key, &value.stored);
            // The stored value (crc and bytes) ends the pair.
            let offset = records::RELOCATED_HEADER + pairs.len() - value.stored.len();
            places.push(Place::Whole { offset, len: value.stored.len() });
        }
        Batch { payload: records::encode_relocated(shard, &pairs), places, raw_bytes: 0 }
    }

    /// A PACKED record holding `values` in blocks of about [`packed::TARGET_BLOCK_BYTES`] raw bytes.
    pub fn packed(shard: u64, values: &[&LiveValue]) -> Batch {
        let mut blocks = Vec::new();
        let mut places = Vec::with_capacity(values.len());
        let mut raw = Vec::new();
        // Values of the block being gathered: (index in `places`, offset, len) once it is framed.
        let mut pending: Vec<(u32, u32)> = Vec::new();
        let mut raw_bytes = 0u64;
        let mut frame = |raw: &mut Vec<u8>, pending: &mut Vec<(u32, u32)>, places: &mut Vec<Place>| {
            let start = records::PACKED_HEADER + blocks.len();
            packed::push_block(&mut blocks, raw);
            let block = start..records::PACKED_HEADER + blocks.len();
            places.extend(pending.drain(..).map(|(offset, len)| Place::Packed {
                block: block.clone(),
                offset,
                len,
            }));
            raw_bytes += raw.len() as u64;
            raw.clear();
        };
        for value in values {
            records::push_stored_pair(&mut raw, &value.key, &value.stored);
            let offset = raw.len() - value.stored.len();
            pending.push((offset as u32, value.stored.len() as u32));
            if raw.len() >= packed::TARGET_BLOCK_BYTES {
                frame(&mut raw, &mut pending, &mut places);
            }
        }
        if !raw.is_empty() {
            frame(&mut raw, &mut pending, &mut places);
        }
        Batch { payload: records::encode_packed(shard, &blocks), places, raw_bytes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec;
    use crate::gc::values::{packed_values_in_record, values_in_record};

    fn live(key: &str, value: &[u8]) -> LiveValue {
        LiveValue {
            shard: 4,
            key: key.as_bytes().to_vec(),
            at: IndexValue::Locator(Locator::new(0, 1)),
            stored: codec::stored_value(value).into(),
        }
    }

    #[test]
    fn moved_values_are_found_where_the_index_will_point() {
        // Enough values for several blocks.
        let values: Vec<LiveValue> = (0..400)
            .map(|i| live(&format!("key-{i:04}"), format!("value {i} ").repeat(20).as_bytes()))
            .collect();
        let refs: Vec<&LiveValue> = values.iter().collect();
        let batch = Batch::packed(4, &refs);
        assert_eq!(batch.places.len(), values.len());
        assert!(batch.raw_bytes > 2 * packed::TARGET_BLOCK_BYTES as u64, "several blocks");
        assert!((batch.payload.len() as u64) < batch.raw_bytes / 3, "repetitive values compress");
        let record = Locator::new(1_000, batch.payload.len() as u64);
        let found = packed_values_in_record(&batch.payload, record).unwrap();
        assert_eq!(found.len(), values.len());
        for ((value, place), found) in values.iter().zip(&batch.places).zip(found) {
            assert_eq!((found.shard, &found.key, &found.stored), (4, &value.key, &value.stored));
            assert_eq!(found.at, place.at(record), "the scan and the move agree on where the value is");
            let IndexValue::Packed(p) = found.at else { panic!("a packed value") };
            let block = &batch.payload[(p.block.position - 1_000) as usize..][..p.block.len as usize];
            let raw = packed::unpack(block).unwrap();
            assert_eq!(packed::stored_value(&raw, p.offset, p.len).unwrap(), &value.stored[..]);
        }

        let whole = Batch::relocated(4, &refs[..3]);
        let found = values_in_record(records::RELOCATED, &whole.payload).unwrap();
        for (place, found) in whole.places.iter().zip(found) {
            let Place::Whole { offset, len } = place else { panic!("moved whole") };
            assert_eq!((found.span.offset, found.span.len), (*offset, *len));
        }
    }
}
