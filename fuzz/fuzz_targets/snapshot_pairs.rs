//! A Raft snapshot's data as a peer sends it (and a SNAP_CHUNK's tail as read back from disk), on
//! arbitrary bytes, parsed the way the replica persists and installs it: iterate the pairs and
//! references, take each value's span, verify the stored value's checksum. `replica_decode` already
//! iterates the pairs; this target adds what the replica then does with them: every span lies
//! inside the input, every verified value lies inside its span, the items accepted before the first
//! error re-encode to exactly the bytes they were read from, and the values-only reading agrees
//! with them up to the first reference.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onekv_replica::{codec, records};

fuzz_target!(|data: &[u8]| {
    let mut again = Vec::new();
    let mut values_only = records::SnapshotPairs::new(data);
    let mut referred = false;
    for pair in records::SnapshotItems::new(data) {
        let Ok((key, value, expiry)) = pair else { return };
        let from_values = values_only.next();
        let span = match value {
            records::PairValue::Stored(span) => span,
            records::PairValue::SameAs(same_as) => {
                assert!(referred || from_values.is_some_and(|pair| pair.is_err()));
                referred = true;
                records::push_reference_pair(&mut again, key, expiry, same_as);
                assert_eq!(&again[..], &data[..again.len()]);
                continue;
            }
        };
        if !referred {
            assert_eq!(from_values.map(|pair| pair.ok()), Some(Some((key, span, expiry))));
        }
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
