//! How user keys, the caller's metadata keys and the flush flag share one lsm-tree key space.
//!
//! User keys are stored as `0x01 ++ key`, metadata keys (the replica's request-id window) as
//! `0x02 ++ key`, and the flag at `[0x00]`, so no key of one space (not even the empty one) can
//! collide with another's: user keys sort inside `[0x01], [0x02])`, metadata keys inside
//! `[0x02], [0x03])`. Keeping metadata in the same tree as the data means one flush, with one flag,
//! makes both durable at once.

/// Bytes put in front of every user key.
pub(crate) const PREFIX_LEN: usize = 1;

const USER_PREFIX: u8 = 0x01;

/// The reserved key holding the flush flag.
pub(crate) const FLAG_KEY: &[u8] = &[0x00];

/// Exclusive upper bound of all stored user keys.
pub(crate) const USER_END: &[u8] = &[USER_PREFIX + 1];

const META_PREFIX: u8 = 0x02;

/// Exclusive upper bound of all stored metadata keys.
pub(crate) const META_END: &[u8] = &[META_PREFIX + 1];

/// One of the two key spaces callers write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Space {
    User,
    Meta,
}

impl Space {
    fn prefix(self) -> u8 {
        match self {
            Space::User => USER_PREFIX,
            Space::Meta => META_PREFIX,
        }
    }

    /// The stored form of a key (or range bound) of this space.
    pub(crate) fn stored(self, key: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(PREFIX_LEN + key.len());
        out.push(self.prefix());
        out.extend_from_slice(key);
        out
    }

    /// Exclusive upper bound of this space's stored keys.
    pub(crate) fn end(self) -> &'static [u8] {
        match self {
            Space::User => USER_END,
            Space::Meta => META_END,
        }
    }
}

/// The caller's key of a stored user or metadata key.
pub(crate) fn user(stored_key: &[u8]) -> &[u8] {
    debug_assert!(
        matches!(stored_key.first(), Some(&USER_PREFIX | &META_PREFIX)),
        "not a user or metadata key: {stored_key:?}"
    );
    stored_key.get(PREFIX_LEN..).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_keys_keep_order_and_stay_clear_of_the_flag() {
        let keys: [&[u8]; 5] = [b"", b"\x00", b"a", b"ab", b"\xff\xff"];
        for pair in keys.windows(2) {
            assert!(Space::User.stored(pair[0]) < Space::User.stored(pair[1]));
        }
        for key in keys {
            let s = Space::User.stored(key);
            assert!(s.as_slice() > FLAG_KEY && s.as_slice() < USER_END);
            assert_eq!(user(&s), key);
            let m = Space::Meta.stored(key);
            assert!(m.as_slice() >= USER_END && m.as_slice() < META_END);
            assert_eq!(user(&m), key);
            assert_eq!(Space::User.stored(key), s);
        }
    }
}
