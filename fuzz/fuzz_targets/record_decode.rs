//! The record decoder on arbitrary bytes: never panics, never claims more bytes than it was given,
//! and whatever it accepts re-encodes to exactly the bytes it read.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onekv_log::record::{self, Decoded, RECORD_HEADER_LEN};

fuzz_target!(|input: &[u8]| {
    let Some((pos, bytes)) = input.split_first_chunk::<8>() else { return };
    let position = u64::from_le_bytes(*pos);
    if let Decoded::Record { kind, batch_offset, payload, total_len } = record::decode(position, bytes, 1 << 20) {
        assert!(total_len <= bytes.len());
        assert_eq!(total_len, RECORD_HEADER_LEN + payload.len());
        let mut again = Vec::new();
        record::encode(&mut again, position, batch_offset, kind, payload);
        assert_eq!(&again[..], &bytes[..total_len]);
    }
});
