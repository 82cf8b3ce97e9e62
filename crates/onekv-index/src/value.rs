//! What a replica stores per key: a locator into the log, a place inside a compressed block of the
//! log (small values the log GC moved), or (classic storage mode) the value itself.
//!
//! Encoding: one tag byte, then the payload (integers little-endian).
//!
//! | tag | payload |
//! |---|---|
//! | `1` | a 16-byte [`Locator`] (`Locator::to_bytes`) |
//! | `2` | the value bytes, any length (including none) |
//! | `3` | the block's 16-byte [`Locator`], then `offset:u32 len:u32` inside the decompressed block |
//! | `4` | `expires_at_ms:u64`, then one of the forms above: a key that expires (ms since the Unix epoch) |
//! | `5` | a 16-byte [`Locator`] of bytes another write put in the log (a deduplicated value) |
//!
//! Decoding accepts exactly these forms (an expiry wraps exactly one of the others, never another
//! expiry) and reports anything else as an error; it never panics. An expiry is metadata beside
//! where the value is: [`IndexValue::decode`] reads through it, [`decode_stored`] returns it too.

use crate::IndexError;
use onekv_log::Locator;

const TAG_LOCATOR: u8 = 1;
const TAG_INLINE: u8 = 2;
const TAG_PACKED: u8 = 3;
const TAG_EXPIRES: u8 = 4;
const TAG_SHARED: u8 = 5;
const EXPIRY_PREFIX: usize = 1 + 8;

/// The value of one key in a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IndexValue {
    /// The value's bytes are in the log, here.
    Locator(Locator),
    /// The value's bytes themselves.
    Inline(Vec<u8>),
    /// The value's bytes are inside a compressed block in the log.
    Packed(Packed),
    /// The value's bytes are in the log, here, in a record some other write put there (an
    /// identical value stored once: the replica's deduplication). Read as [`IndexValue::Locator`];
    /// the tag tells the log GC that the record at this place does not name this key.
    Shared(Locator),
}

/// Where a value is inside a compressed block: the block's bytes in the log, and the value's
/// range in the block once decompressed (what the replica's log GC writes; it owns the block format).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packed {
    /// The block's bytes in the log (header and compressed data).
    pub block: Locator,
    /// Where the value starts in the decompressed block.
    pub offset: u32,
    /// The value's length there.
    pub len: u32,
}

impl Packed {
    const ENCODED_LEN: usize = Locator::ENCODED_LEN + 8;
}

impl IndexValue {
    /// The stored form: tag byte then payload.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            IndexValue::Locator(locator) | IndexValue::Shared(locator) => {
                let mut out = Vec::with_capacity(1 + Locator::ENCODED_LEN);
                out.push(if matches!(self, IndexValue::Shared(_)) { TAG_SHARED } else { TAG_LOCATOR });
                out.extend_from_slice(&locator.to_bytes());
                out
            }
            IndexValue::Inline(bytes) => {
                let mut out = Vec::with_capacity(1 + bytes.len());
                out.push(TAG_INLINE);
                out.extend_from_slice(bytes);
                out
            }
            IndexValue::Packed(packed) => {
                let mut out = Vec::with_capacity(1 + Packed::ENCODED_LEN);
                out.push(TAG_PACKED);
                out.extend_from_slice(&packed.block.to_bytes());
                out.extend_from_slice(&packed.offset.to_le_bytes());
                out.extend_from_slice(&packed.len.to_le_bytes());
                out
            }
        }
    }

    /// The log bytes this value occupies, if it is in the log: its own locator, or its block's
    /// (which it shares with other values).
    pub fn log_bytes(&self) -> Option<Locator> {
        match self {
            IndexValue::Locator(locator) | IndexValue::Shared(locator) => Some(*locator),
            IndexValue::Packed(packed) => Some(packed.block),
            IndexValue::Inline(_) => None,
        }
    }

    /// The place of the value's bytes when they are whole in the log (not in a compressed block),
    /// whichever write put them there.
    pub fn whole_locator(&self) -> Option<Locator> {
        match self {
            IndexValue::Locator(locator) | IndexValue::Shared(locator) => Some(*locator),
            IndexValue::Packed(_) | IndexValue::Inline(_) => None,
        }
    }

    /// The stored form with an expiry time (ms since the Unix epoch) in front, if any.
    pub fn encode_expiring(&self, expires_at_ms: Option<u64>) -> Vec<u8> {
        let Some(at) = expires_at_ms else { return self.encode() };
        let inner = self.encode();
        let mut out = Vec::with_capacity(EXPIRY_PREFIX + inner.len());
        out.push(TAG_EXPIRES);
        out.extend_from_slice(&at.to_le_bytes());
        out.extend_from_slice(&inner);
        out
    }

    /// Decodes a stored value ([`IndexValue::encode`] or [`IndexValue::encode_expiring`]), ignoring
    /// any expiry; anything else is [`IndexError::InvalidValue`].
    pub fn decode(bytes: &[u8]) -> Result<IndexValue, IndexError> {
        decode_stored(bytes).map(|(value, _)| value)
    }

    fn decode_plain(bytes: &[u8]) -> Result<IndexValue, IndexError> {
        match bytes.split_first() {
            None => Err(IndexError::InvalidValue("empty".to_owned())),
            Some((tag @ (&TAG_LOCATOR | &TAG_SHARED), payload)) => {
                let form = if *tag == TAG_SHARED { IndexValue::Shared } else { IndexValue::Locator };
                Locator::from_bytes(payload).map(form).ok_or_else(|| {
                    IndexError::InvalidValue(format!(
                        "locator payload of {} bytes (expected {}) or a range that overflows",
                        payload.len(),
                        Locator::ENCODED_LEN
                    ))
                })
            }
            Some((&TAG_INLINE, payload)) => Ok(IndexValue::Inline(payload.to_vec())),
            Some((&TAG_PACKED, payload)) => {
                let invalid = || {
                    IndexError::InvalidValue(format!(
                        "packed payload of {} bytes (expected {}) or a range that overflows",
                        payload.len(),
                        Packed::ENCODED_LEN
                    ))
                };
                if payload.len() != Packed::ENCODED_LEN {
                    return Err(invalid());
                }
                let (block, place) = payload.split_at(Locator::ENCODED_LEN);
                let block = Locator::from_bytes(block).ok_or_else(invalid)?;
                let offset = u32::from_le_bytes(place[..4].try_into().expect("4 bytes"));
                let len = u32::from_le_bytes(place[4..].try_into().expect("4 bytes"));
                offset.checked_add(len).ok_or_else(invalid)?;
                Ok(IndexValue::Packed(Packed { block, offset, len }))
            }
            Some((&TAG_EXPIRES, _)) => Err(IndexError::InvalidValue("an expiry inside an expiry".to_owned())),
            Some((tag, _)) => Err(IndexError::InvalidValue(format!("unknown tag {tag}"))),
        }
    }
}

/// Decodes a stored value and its expiry time (`None`: it never expires).
pub fn decode_stored(bytes: &[u8]) -> Result<(IndexValue, Option<u64>), IndexError> {
    match bytes.split_first() {
        Some((&TAG_EXPIRES, rest)) => {
            let (at, inner) = rest
                .split_at_checked(8)
                .ok_or_else(|| IndexError::InvalidValue(format!("expiry payload of {} bytes", rest.len())))?;
            let at = u64::from_le_bytes(at.try_into().expect("8 bytes"));
            Ok((IndexValue::decode_plain(inner)?, Some(at)))
        }
        _ => Ok((IndexValue::decode_plain(bytes)?, None)),
    }
}

/// The expiry time of a stored value, if it has one, without decoding the rest (a cheap test on
/// every read). Malformed bytes report no expiry here; decoding them fails where they are used.
pub fn stored_expiry(bytes: &[u8]) -> Option<u64> {
    match bytes.split_first() {
        Some((&TAG_EXPIRES, rest)) => {
            rest.get(..8).map(|at| u64::from_le_bytes(at.try_into().expect("8 bytes")))
        }
        _ => None,
    }
}

/// Whether a stored value has expired at `now_ms`: its expiry time is at or before `now_ms` (Redis's
/// rule: a key whose time has come is gone).
pub fn expired_at(bytes: &[u8], now_ms: u64) -> bool {
    stored_expiry(bytes).is_some_and(|at| at <= now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_encodings() {
        let locator = IndexValue::Locator(Locator::new(0x0102, 7));
        let bytes = locator.encode();
        assert_eq!(bytes.len(), 17);
        assert_eq!(bytes[0], 1);
        assert_eq!(&bytes[1..3], &[0x02, 0x01]);
        assert_eq!(IndexValue::decode(&bytes).unwrap(), locator);

        assert_eq!(IndexValue::Inline(vec![]).encode(), vec![2]);
        assert_eq!(IndexValue::decode(&[2]).unwrap(), IndexValue::Inline(vec![]));
        assert_eq!(IndexValue::decode(&[2, 9, 8]).unwrap(), IndexValue::Inline(vec![9, 8]));

        let expiring = locator.encode_expiring(Some(0x0a0b));
        assert_eq!(expiring.len(), 26);
        assert_eq!(&expiring[..3], &[4, 0x0b, 0x0a]);
        assert_eq!(decode_stored(&expiring).unwrap(), (locator.clone(), Some(0x0a0b)));
        assert_eq!(IndexValue::decode(&expiring).unwrap(), locator);
        assert_eq!(stored_expiry(&expiring), Some(0x0a0b));
        assert!(expired_at(&expiring, 0x0a0b) && !expired_at(&expiring, 0x0a0a));
        assert_eq!(locator.encode_expiring(None), locator.encode());
        assert!(!expired_at(&locator.encode(), u64::MAX));

        let shared = IndexValue::Shared(Locator::new(0x0102, 7));
        let bytes = shared.encode();
        assert_eq!(bytes[0], 5);
        assert_eq!(bytes[1..], locator.encode()[1..]);
        assert_eq!(IndexValue::decode(&bytes).unwrap(), shared);
        assert_eq!(shared.whole_locator(), locator.whole_locator());
    }

    #[test]
    fn malformed_encodings_are_rejected() {
        let nested = IndexValue::Inline(vec![]).encode_expiring(Some(1));
        let mut twice = vec![4, 0, 0, 0, 0, 0, 0, 0, 0];
        twice.extend_from_slice(&nested);
        for bad in [
            &[][..],
            &[0],
            &[3, 1],
            &[255],
            &[1],
            &[1; 16],
            &[1; 18],
            &[3; 24],
            &[3; 26],
            &[4],
            &[4; 8],
            &[4; 9],
            &twice,
        ] {
            assert!(matches!(IndexValue::decode(bad), Err(IndexError::InvalidValue(_))), "accepted {bad:?}");
        }
        let mut overflowing = vec![1];
        overflowing.extend_from_slice(&[0xff; 16]);
        assert!(IndexValue::decode(&overflowing).is_err(), "overflowing locator range accepted");
    }

    fn any_value() -> impl Strategy<Value = IndexValue> {
        prop_oneof![
            (any::<u64>(), any::<u64>())
                .prop_filter("range fits", |(p, l)| p.checked_add(*l).is_some())
                .prop_map(|(p, l)| IndexValue::Locator(Locator::new(p, l))),
            (any::<u64>(), any::<u64>())
                .prop_filter("range fits", |(p, l)| p.checked_add(*l).is_some())
                .prop_map(|(p, l)| IndexValue::Shared(Locator::new(p, l))),
            proptest::collection::vec(any::<u8>(), 0..64).prop_map(IndexValue::Inline),
            (any::<u64>(), any::<u64>(), any::<u32>(), any::<u32>())
                .prop_filter("ranges fit", |(p, l, o, n)| p.checked_add(*l).is_some()
                    && o.checked_add(*n).is_some())
                .prop_map(|(p, l, offset, len)| IndexValue::Packed(Packed {
                    block: Locator::new(p, l),
                    offset,
                    len
                })),
        ]
    }

    proptest! {
        #[test]
        fn round_trips(value in any_value(), expiry in proptest::option::of(any::<u64>())) {
            prop_assert_eq!(IndexValue::decode(&value.encode()).unwrap(), value.clone());
            prop_assert_eq!(decode_stored(&value.encode_expiring(expiry)).unwrap(), (value, expiry));
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_reencode_exactly(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            // Whatever decodes must be the unique encoding of its value.
            if let Ok((value, expiry)) = decode_stored(&bytes) {
                prop_assert_eq!(value.encode_expiring(expiry), bytes);
            }
        }
    }
}
