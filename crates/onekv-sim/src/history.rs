//! What the simulated clients did: one [`Op`] per client operation, with the logical times of
//! its invocation and response, and how values are made recognisable.
//!
//! Times are positions in one global sequence of events, not milliseconds: two events in the same
//! simulated millisecond still have a real-time order, and the checkers use it.
//!
//! This module owns the record only; judging it is `checker`'s job.

/// A value written by the workload, named by a number unique in the run.
pub type ValueId = u32;

/// What a client asked for on one key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// A linearizable read (ReadIndex barrier, then a read of the replica's state).
    Get,
    /// A blind write.
    Put(ValueId),
    /// A delete.
    Delete,
    /// A blind write of a key that expires: far in the future (the run never reaches it: a put),
    /// or already past when written (`expired`: the key reads as absent at once, and the leader's
    /// expiry sweep deletes it later, racing the workload's next writes of the key).
    PutExpiring {
        /// The value written.
        value: ValueId,
        /// Whether its expiry time is already past.
        expired: bool,
    },
    /// A range deletion of keys `key..=to` in the key's shard, as one page (it holds no more keys
    /// than the page's limit): the other keys of the range that the shard holds are deleted at the
    /// same point. The history checked has one copy of the operation per key it deletes, each a
    /// delete of that key (`Sim::finish`).
    DeleteRange {
        /// The last key of the range.
        to: u32,
    },
    /// Compare-and-swap (`None` = absent).
    Cas {
        /// The value the key must have.
        expected: Option<ValueId>,
        /// The value to set.
        new: Option<ValueId>,
    },
}

impl OpKind {
    /// Whether the operation may change the key.
    pub fn is_write(&self) -> bool {
        !matches!(self, OpKind::Get)
    }

    /// What a blind write (put or delete) leaves the key holding (`Some(None)`: absent); `None`
    /// for the other operations.
    pub fn blind_result(&self) -> Option<Option<ValueId>> {
        match self {
            OpKind::Put(value) | OpKind::PutExpiring { value, expired: false } => Some(Some(*value)),
            OpKind::Delete | OpKind::DeleteRange { .. } | OpKind::PutExpiring { expired: true, .. } => {
                Some(None)
            }
            OpKind::Get | OpKind::Cas { .. } => None,
        }
    }
}

/// What a completed operation returned.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OpResult {
    /// A read's value.
    Get(Option<ValueId>),
    /// A put or delete was applied.
    Written,
    /// A compare-and-swap's result.
    Cas {
        /// Whether it swapped.
        swapped: bool,
        /// The key's value afterwards.
        current: Option<ValueId>,
    },
}

/// One client operation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Op {
    /// The client that issued it (each client has at most one operation open).
    pub client: u32,
    /// The key (a small number; the stored key is derived from it).
    pub key: u32,
    /// What was asked.
    pub kind: OpKind,
    /// When it was invoked.
    pub call: u64,
    /// When its response arrived; `None` if it never did (the operation may or may not have
    /// taken effect, at any time after `call`).
    pub ret: Option<u64>,
    /// The response; `None` for an operation without one.
    pub result: Option<OpResult>,
}

impl Op {
    /// Whether the operation completed with a response.
    pub fn acknowledged(&self) -> bool {
        self.result.is_some()
    }
}

/// The first value id of the few that recur (`SimConfig::dedup`); fresh values count up from 1,
/// far below it.
pub const RECURRING_VALUES: ValueId = 1 << 31;

/// The bytes stored for value `id`: its number, then a filler whose length depends on the number,
/// so values of many sizes travel and any mix-up or damage is recognised when read back.
pub fn encode_value(id: ValueId) -> Vec<u8> {
    let filler = (id.wrapping_mul(2_654_435_761) % 300) as usize;
    let mut bytes = id.to_le_bytes().to_vec();
    bytes.extend(std::iter::repeat_n(id as u8, filler));
    bytes
}

/// The value id of stored bytes, or `None` if they are not exactly what [`encode_value`] makes.
pub fn decode_value(bytes: &[u8]) -> Option<ValueId> {
    let id = ValueId::from_le_bytes(bytes.get(..4)?.try_into().ok()?);
    (encode_value(id) == bytes).then_some(id)
}

/// The stored key of key number `key`.
pub fn encode_key(key: u32) -> Vec<u8> {
    format!("key-{key:03}").into_bytes()
}

/// The key number of a stored key.
pub fn decode_key(bytes: &[u8]) -> Option<u32> {
    std::str::from_utf8(bytes).ok()?.strip_prefix("key-")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_keys_round_trip_and_damage_is_recognised() {
        for id in [0, 1, 255, 256, 70_000, u32::MAX] {
            let bytes = encode_value(id);
            assert_eq!(decode_value(&bytes), Some(id));
            let mut damaged = bytes.clone();
            let last = damaged.len() - 1;
            damaged[last] ^= 1;
            assert_eq!(decode_value(&damaged), None);
            assert_eq!(decode_value(&bytes[..bytes.len().saturating_sub(1)]), None);
        }
        assert_eq!(decode_key(&encode_key(7)), Some(7));
        assert_eq!(decode_key(b"other"), None);
    }
}
