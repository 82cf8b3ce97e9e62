//! What a replica stores per key: a locator into the log, or (classic storage mode) the value itself.
//!
//! Encoding: one tag byte, then the payload.
//!
//! | tag | payload |
//! |---|---|
//! | `1` | a 16-byte [`Locator`] (`Locator::to_bytes`) |
//! | `2` | the value bytes, any length (including none) |
//!
//! Decoding accepts exactly these forms and reports anything else as an error; it never panics.

use crate::IndexError;
use onekv_log::Locator;

const TAG_LOCATOR: u8 = 1;
const TAG_INLINE: u8 = 2;

/// The value of one key in a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IndexValue {
    /// The value's bytes are in the log, here.
    Locator(Locator),
    /// The value's bytes themselves.
    Inline(Vec<u8>),
}

impl IndexValue {
    /// The stored form: tag byte then payload.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            IndexValue::Locator(locator) => {
                let mut out = Vec::with_capacity(1 + Locator::ENCODED_LEN);
                out.push(TAG_LOCATOR);
                out.extend_from_slice(&locator.to_bytes());
                out
            }
            IndexValue::Inline(bytes) => {
                let mut out = Vec::with_capacity(1 + bytes.len());
                out.push(TAG_INLINE);
                out.extend_from_slice(bytes);
                out
            }
        }
    }

    /// Decodes [`IndexValue::encode`]'s output; anything else is [`IndexError::InvalidValue`].
    pub fn decode(bytes: &[u8]) -> Result<IndexValue, IndexError> {
        match bytes.split_first() {
            None => Err(IndexError::InvalidValue("empty".to_owned())),
            Some((&TAG_LOCATOR, payload)) => {
                Locator::from_bytes(payload).map(IndexValue::Locator).ok_or_else(|| {
                    IndexError::InvalidValue(format!(
                        "locator payload of {} bytes (expected {}) or a range that overflows",
                        payload.len(),
                        Locator::ENCODED_LEN
                    ))
                })
            }
            Some((&TAG_INLINE, payload)) => Ok(IndexValue::Inline(payload.to_vec())),
            Some((tag, _)) => Err(IndexError::InvalidValue(format!("unknown tag {tag}"))),
        }
    }
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
    }

    #[test]
    fn malformed_encodings_are_rejected() {
        for bad in [&[][..], &[0], &[3, 1], &[255], &[1], &[1; 16], &[1; 18]] {
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
            proptest::collection::vec(any::<u8>(), 0..64).prop_map(IndexValue::Inline),
        ]
    }

    proptest! {
        #[test]
        fn round_trips(value in any_value()) {
            prop_assert_eq!(IndexValue::decode(&value.encode()).unwrap(), value);
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_reencode_exactly(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            // Whatever decodes must be the unique encoding of its value.
            if let Ok(value) = IndexValue::decode(&bytes) {
                prop_assert_eq!(value.encode(), bytes);
            }
        }
    }
}
