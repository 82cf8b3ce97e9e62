//! The pending set: the fast writes this replica made durable and has not applied yet, in the order
//! it appended them.
//!
//! Each is a DURABILITY record in the node's log. The set keeps what ordering and applying need
//! without reading the log back: the request id, the term it was accepted in, the encoded write
//! command (and where it sits in the log, so the index can point into it), its digest and its keys.
//! It is rebuilt at recovery from the records at or above the shard's recovery point, which never
//! passes the oldest pending record ([`Pending::oldest_position`]).
//!
//! Bounded in records and bytes ([`MAX_PENDING_RECORDS`], [`MAX_PENDING_BYTES`]): over either a
//! replica refuses fast writes, and the client takes the Raft path, which Raft's flow control
//! bounds.

use crate::RequestId;
use onekv_log::Locator;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Most fast writes pending at once in one shard.
pub(crate) const MAX_PENDING_RECORDS: usize = 65_536;

/// Most bytes of encoded commands pending at once in one shard.
pub(crate) const MAX_PENDING_BYTES: usize = 64 << 20;

/// One fast write made durable here and not yet applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FastRecord {
    pub id: RequestId,
    /// The Raft term this replica was in when it accepted the write.
    pub term: u64,
    /// The encoded write command (`codec`), as the DURABILITY record holds it.
    pub command: Arc<[u8]>,
    /// Where `command` is in the log: a value's locator is a slice of it.
    pub at: Locator,
    /// CRC-32C of `command`: an ORDER names the write by id and digest.
    pub digest: u32,
    /// The keys it writes (for reads and other writes that must wait for it to be ordered).
    pub keys: Vec<Vec<u8>>,
}

impl FastRecord {
    /// Log position of the DURABILITY record (its header): a recovery scan from here meets it.
    pub fn record_position(&self) -> u64 {
        self.at.position - crate::records::DURABILITY_HEADER as u64 - onekv_log::RECORD_HEADER_LEN as u64
    }
}

/// Why a fast write was not added.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The set holds [`MAX_PENDING_RECORDS`] or [`MAX_PENDING_BYTES`].
    Full,
}

/// The pending fast writes of one shard.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    /// By the order this replica appended them.
    by_order: BTreeMap<u64, FastRecord>,
    by_id: HashMap<RequestId, u64>,
    /// Pending writes per key.
    keys: HashMap<Vec<u8>, u32>,
    bytes: usize,
    next: u64,
    /// Records below this number were proposed for ordering already (a leader's cursor).
    proposed: u64,
}

impl Pending {
    /// Whether one more write of `bytes` fits.
    pub fn has_room(&self, bytes: usize) -> bool {
        self.by_order.len() < MAX_PENDING_RECORDS && self.bytes.saturating_add(bytes) <= MAX_PENDING_BYTES
    }

    /// Adds `record` after every other (a record whose id is pending already is kept once: the
    /// first).
    pub fn insert(&mut self, record: FastRecord) -> Result<(), Refused> {
        if !self.by_id.contains_key(&record.id) && !self.has_room(record.command.len()) {
            return Err(Refused::Full);
        }
        self.insert_unbounded(record);
        Ok(())
    }

    /// [`Pending::insert`] without the bounds: recovery takes every record written since the last
    /// flush (with its command not yet read, `FastRecord::command` empty), most of which its
    /// replay then finds applied; what stays was within the bounds before the crash.
    pub fn insert_unbounded(&mut self, record: FastRecord) {
        if self.by_id.contains_key(&record.id) {
            return;
        }
        let number = self.next;
        self.next += 1;
        self.bytes += record.command.len();
        for key in &record.keys {
            *self.keys.entry(key.clone()).or_default() += 1;
        }
        self.by_id.insert(record.id, number);
        self.by_order.insert(number, record);
    }

    /// Whether `id` is pending.
    pub fn contains(&self, id: RequestId) -> bool {
        self.by_id.contains_key(&id)
    }

    pub fn is_empty(&self) -> bool {
        self.by_order.is_empty()
    }

    /// Gives each pending record whose command was not read yet (recovery's) its command, from
    /// `read`.
    pub fn load_commands(
        &mut self,
        mut read: impl FnMut(&FastRecord) -> Result<Vec<u8>, crate::ReplicaError>,
    ) -> Result<(), crate::ReplicaError> {
        for record in self.by_order.values_mut().filter(|record| record.command.is_empty()) {
            let command = read(record)?;
            self.bytes += command.len();
            record.command = command.into();
        }
        Ok(())
    }

    /// Takes the write out (it was applied: ordered, or by the Raft path under the same id).
    pub fn remove(&mut self, id: RequestId) -> Option<FastRecord> {
        let number = self.by_id.remove(&id)?;
        let record = self.by_order.remove(&number).expect("indexed");
        self.bytes -= record.command.len();
        for key in &record.keys {
            if let Some(count) = self.keys.get_mut(key) {
                *count -= 1;
                if *count == 0 {
                    self.keys.remove(key);
                }
            }
        }
        Some(record)
    }

    /// The digest of the pending write `id`.
    pub fn digest_of(&self, id: RequestId) -> Option<u32> {
        self.by_id.get(&id).map(|number| self.by_order[number].digest)
    }

    /// Whether a pending write writes `key`.
    pub fn writes(&self, key: &[u8]) -> bool {
        self.keys.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.by_order.len()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Log position of the oldest pending record: the shard's recovery point must not pass it.
    pub fn oldest_position(&self) -> Option<u64> {
        self.by_order.values().map(FastRecord::record_position).min()
    }

    /// Every pending write, in this replica's append order.
    pub fn iter(&self) -> impl Iterator<Item = &FastRecord> {
        self.by_order.values()
    }

    /// The writes not yet proposed for ordering, in append order.
    pub fn iter_unproposed(&self) -> impl Iterator<Item = &FastRecord> {
        self.by_order.range(self.proposed..).map(|(_, record)| record)
    }

    /// The writes not yet proposed for ordering, in append order, and marks them proposed (a
    /// leader's ORDER names them; if that entry never commits, [`Pending::propose_again`]).
    pub fn take_unproposed(&mut self, most: usize) -> Vec<FastRecord> {
        let taken: Vec<FastRecord> =
            self.by_order.range(self.proposed..).take(most).map(|(_, r)| r.clone()).collect();
        if let Some(last) = self.by_order.range(self.proposed..).take(most).map(|(n, _)| *n).last() {
            self.proposed = last + 1;
        }
        taken
    }

    /// Whether some pending write was not yet proposed for ordering.
    pub fn has_unproposed(&self) -> bool {
        self.by_order.range(self.proposed..).next().is_some()
    }

    /// Every pending write counts as not proposed again (leadership changed: what an earlier
    /// ORDER named may never commit).
    pub fn propose_again(&mut self) {
        self.proposed = 0;
    }

    /// Drops every pending write accepted in a term below `term` and returns how many.
    pub fn drop_terms_below(&mut self, term: u64) -> usize {
        let ids: Vec<RequestId> = self.by_order.values().filter(|r| r.term < term).map(|r| r.id).collect();
        for id in &ids {
            self.remove(*id);
        }
        ids.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn record(client: u64, seq: u64, term: u64, keys: &[&str], position: u64) -> FastRecord {
        let command: Arc<[u8]> = vec![0u8; 10 + seq as usize % 7].into();
        FastRecord {
            id: RequestId { client, seq },
            term,
            digest: crc32c::crc32c(&command),
            at: Locator::new(
                position + crate::records::DURABILITY_HEADER as u64 + onekv_log::RECORD_HEADER_LEN as u64,
                command.len() as u64,
            ),
            command,
            keys: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
        }
    }

    #[test]
    fn keeps_append_order_and_counts_keys() {
        let mut pending = Pending::default();
        pending.insert(record(1, 1, 5, &["a", "b"], 100)).unwrap();
        pending.insert(record(1, 2, 5, &["a"], 200)).unwrap();
        pending.insert(record(2, 1, 6, &["c"], 300)).unwrap();
        assert_eq!(pending.oldest_position(), Some(100));
        assert!(pending.writes(b"a") && pending.writes(b"c") && !pending.writes(b"z"));
        let order: Vec<_> = pending.iter().map(|r| r.id.seq + 10 * r.id.client).collect();
        assert_eq!(order, vec![11, 12, 21]);
        pending.remove(RequestId { client: 1, seq: 1 }).unwrap();
        assert!(pending.writes(b"a") && !pending.writes(b"b"));
        assert_eq!(pending.oldest_position(), Some(200));
        assert_eq!(pending.drop_terms_below(6), 1);
        assert!(!pending.writes(b"a"));
        assert_eq!(pending.len(), 1);
    }

    #[test]
    fn proposing_walks_the_append_order_once_until_asked_again() {
        let mut pending = Pending::default();
        for seq in 1..=5 {
            pending.insert(record(1, seq, 1, &["k"], seq * 100)).unwrap();
        }
        let first: Vec<u64> = pending.take_unproposed(3).iter().map(|r| r.id.seq).collect();
        assert_eq!(first, vec![1, 2, 3]);
        pending.insert(record(1, 6, 1, &["k"], 600)).unwrap();
        let next: Vec<u64> = pending.take_unproposed(10).iter().map(|r| r.id.seq).collect();
        assert_eq!(next, vec![4, 5, 6]);
        assert!(!pending.has_unproposed());
        pending.remove(RequestId { client: 1, seq: 2 });
        pending.propose_again();
        let again: Vec<u64> = pending.take_unproposed(10).iter().map(|r| r.id.seq).collect();
        assert_eq!(again, vec![1, 3, 4, 5, 6]);
    }

    #[test]
    fn refuses_beyond_its_bound_in_records() {
        let mut pending = Pending::default();
        for seq in 0..MAX_PENDING_RECORDS as u64 {
            pending.insert(record(1, seq, 1, &[], seq)).unwrap();
        }
        assert_eq!(pending.insert(record(2, 1, 1, &[], 0)), Err(Refused::Full));
        // A duplicate id is not a new write.
        assert_eq!(pending.insert(record(1, 5, 1, &[], 5)), Ok(()));
    }

    proptest! {
        /// Against a plain list: order, keys and positions agree through inserts and removals.
        #[test]
        fn agrees_with_a_list(ops in proptest::collection::vec((0u8..3, 0u64..20, 0usize..4), 1..200)) {
            let mut pending = Pending::default();
            let mut model: Vec<FastRecord> = Vec::new();
            let names = ["a", "b", "c", "d"];
            for (step, (op, seq, key)) in ops.into_iter().enumerate() {
                let id = RequestId { client: 9, seq };
                match op {
                    0 | 1 => {
                        let r = record(9, seq, 1, &names[key..=key], 1_000 + step as u64);
                        if !model.iter().any(|m| m.id == id) {
                            model.push(r.clone());
                        }
                        pending.insert(r).unwrap();
                    }
                    _ => {
                        let expected = model.iter().position(|m| m.id == id).map(|i| model.remove(i));
                        prop_assert_eq!(pending.remove(id), expected);
                    }
                }
                prop_assert_eq!(pending.iter().cloned().collect::<Vec<_>>(), model.clone());
                prop_assert_eq!(pending.oldest_position(), model.iter().map(FastRecord::record_position).min());
                let keys: BTreeSet<&[u8]> = model.iter().flat_map(|m| m.keys.iter().map(Vec::as_slice)).collect();
                for name in names {
                    prop_assert_eq!(pending.writes(name.as_bytes()), keys.contains(name.as_bytes()));
                }
                prop_assert_eq!(pending.bytes(), model.iter().map(|m| m.command.len()).sum::<usize>());
            }
        }
    }
}
