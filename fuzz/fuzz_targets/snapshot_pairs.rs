//! A Raft snapshot's data as a peer sends it (and a SNAP_CHUNK's tail as read back from disk), on
//! arbitrary bytes, parsed the way the replica persists and installs it: iterate the pairs, take
//! each value's span, verify the stored value's checksum. `replica_decode` already iterates the
//! pairs; this target adds what the replica then does with them: every span lies inside the input,
//! every verified value lies inside its span, and the pairs accepted before the first error
//! re-encode to exactly the bytes they were read from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onekv_replica::{codec, records};

fuzz_target!(|data: &[u8]| {
    let mut again = Vec::new();
    for pair in records::SnapshotPairs::new(data) {
        let Ok((key, span, expiry)) = pair else { return };
        assert!(span.offset + span.len <= data.len());
        let stored = &data[span.offset..span.offset + span.len];
        let Ok(value) = codec::verify_stored_value(stored) else { return };
        assert!(value.len() <= stored.len());
        assert_eq!(span.value(data), value);
        records::push_expiring_pair(&mut again, key, expiry, value);
        assert_eq!(&again[..], &data[..again.len()]);
    }
    // Every pair verified: the whole input was consumed and re-encodes to itself.
    assert_eq!(&again[..], data);
});
