//! The member list's decoder (`onekv_placement::MemberList::decode`) on arbitrary bytes: a node
//! reads it from its data directory and from the reserved key every few seconds. It may not panic,
//! and whatever it accepts must be a valid list that encodes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onekv_placement::MemberList;

fuzz_target!(|data: &[u8]| {
    if let Ok(list) = MemberList::decode(data) {
        assert_eq!(list.encode(), data);
        assert_eq!(MemberList::new(list.epoch, list.members().to_vec()), Ok(list.clone()));
        for member in list.members() {
            assert_eq!(list.address(member.id), Some(member.address.as_str()));
        }
    }
});
