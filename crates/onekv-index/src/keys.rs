//! How user keys and the flush flag share one lsm-tree key space.
//!
//! User keys are stored as `0x01 ++ key` and the flag at `[0x00]`, so no user key (not even the empty
//! one) can collide with the flag, and all user keys sort inside `[0x01], [0x02])`.

/// Bytes put in front of every user key.
pub(crate) const PREFIX_LEN: usize = 1;

const USER_PREFIX: u8 = 0x01;

/// The reserved key holding the flush flag.
pub(crate) const FLAG_KEY: &[u8] = &[0x00];

/// Exclusive upper bound of all stored user keys.
pub(crate) const USER_END: &[u8] = &[USER_PREFIX + 1];

/// The stored form of a user key (or of a user range bound).
pub(crate) fn stored(user_key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(PREFIX_LEN + user_key.len());
    out.push(USER_PREFIX);
    out.extend_from_slice(user_key);
    out
}

/// The user key of a stored user key.
pub(crate) fn user(stored_key: &[u8]) -> &[u8] {
    debug_assert_eq!(stored_key.first(), Some(&USER_PREFIX), "not a user key: {stored_key:?}");
    stored_key.get(PREFIX_LEN..).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_keys_keep_order_and_stay_clear_of_the_flag() {
        let keys: [&[u8]; 5] = [b"", b"\x00", b"a", b"ab", b"\xff\xff"];
        for pair in keys.windows(2) {
            assert!(stored(pair[0]) < stored(pair[1]));
        }
        for key in keys {
            let s = stored(key);
            assert!(s.as_slice() > FLAG_KEY && s.as_slice() < USER_END);
            assert_eq!(user(&s), key);
        }
    }
}
