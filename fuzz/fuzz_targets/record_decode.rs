//! The record decoder on arbitrary bytes: never panics, never claims more bytes than it was given,
//! and whatever it accepts re-encodes to exactly the bytes it read.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onekv_log::record::{self, Decoded, Place, RECORD_HEADER_LEN};

fuzz_target!(|input: &[u8]| {
    let Some((head, bytes)) = input.split_first_chunk::<10>() else { return };
    let position = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    let at = Place { position, salt: u16::from_le_bytes([head[8], head[9]]) };
    if let Decoded::Record { kind, batch_offset, payload, total_len } = record::decode(at, bytes, 1 << 20) {
        assert!(total_len <= bytes.len());
        assert_eq!(total_len, RECORD_HEADER_LEN + payload.len());
        let mut again = Vec::new();
        record::encode(&mut again, at, batch_offset, kind, payload);
        assert_eq!(&again[..], &bytes[..total_len]);
    }
});
