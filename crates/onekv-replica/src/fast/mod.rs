//! The fast path (Skyros; `docs/design/fast-path.md`): blind writes made durable on a fast quorum
//! of a shard's voters (every voter at R = 3, 4 of 5 at R = 5) in one round trip, and ordered by the
//! leader afterwards.
//!
//! A client sends a fast write (puts and deletes, no result but "done") to every voter of its
//! shard at once. Each voter appends a DURABILITY record (`records`) in its loop's next group
//! commit and answers, once it is durable, with its term and whether it leads. The record's
//! values are the replica's one copy: when the leader's ORDER command (`codec`) naming the
//! write's id is applied, the index points into the record, as it points into an ENTRY for a
//! write that took the Raft path. A replica that does not hold a record applies the copy the ORDER
//! carries inline.
//!
//! This module owns the pending set ([`pending`]), a new leader's gather of a majority's pending
//! writes ([`gather`]) and the rules for what a fast write may hold ([`check_ops`]); the group
//! decides when to accept, order and apply (`group`, `apply`), and the
//! log holds the records.

pub(crate) mod gather;
pub(crate) mod group;
pub(crate) mod notice;
pub(crate) mod pending;

use crate::{Expiry, ReplicaError, RequestId, WriteOp};

pub use group::FastAck;
pub(crate) use group::FastGroup;
pub(crate) use pending::{FastRecord, Pending};

/// Most fast writes one ORDER names.
pub(crate) const MAX_ORDER_ITEMS: usize = 1024;

/// Most bytes of fast writes pending (or being written) at once on one node, all shards together
/// (each shard also holds at most [`pending::MAX_PENDING_BYTES`]).
pub(crate) const MAX_NODE_PENDING_BYTES: usize = 256 << 20;

/// Checks what a fast write may hold: at least one op, no expiry relative to a clock (every
/// replica encodes the same bytes for the same write, so the command's digest names it; a time
/// taken from each replica's own clock would differ), and none that keeps the key's expiry (an
/// ORDER applies its writes one after another within one entry, and such a put would read the
/// expiry the key had before the entry).
pub(crate) fn check_ops(ops: &[WriteOp]) -> Result<(), ReplicaError> {
    if ops.is_empty() {
        return Err(ReplicaError::InvalidArgument("a fast write needs at least one op".into()));
    }
    if ops.iter().any(|op| op.value.is_some() && matches!(op.expiry, Expiry::AfterMs(_) | Expiry::Keep)) {
        return Err(ReplicaError::InvalidArgument(
            "a fast write cannot carry an expiry relative to now or keep the key's expiry (use an \
             absolute time, or the Raft path)"
                .into(),
        ));
    }
    Ok(())
}

/// The encoded write command a fast write's DURABILITY record holds: the same bytes on every
/// replica for the same id and ops (time 0: it is applied at its ORDER's time); the ops come back
/// unchanged (no copy of their values is made).
pub(crate) fn encode_command(id: RequestId, ops: Vec<WriteOp>) -> (Vec<u8>, Vec<WriteOp>) {
    let write = crate::Command::Write(ops);
    let command = crate::codec::encode(id, 0, &write);
    let crate::Command::Write(ops) = write else { unreachable!("built as a write just above") };
    (command, ops)
}
