//! Applying committed entries and installed snapshots to the index.
//!
//! In onelog mode applying writes nothing but index entries: each put's locator points at the value
//! bytes inside the entry's own log record (XLL's single write), or, for a put by reference
//! (`wire_refs`), at the copy its source key points at. Separated mode first copies the
//! values of a batch into its value log (one append, one fsync); classic mode writes the effects of
//! a batch to its data write-ahead log and stores values inline in the tree.
//!
//! Sequence numbers come from the entry's index ([`crate::state::seqno`]), so a replay after a crash
//! writes exactly what the first application wrote. A batch's writes become visible to readers at
//! once, entry by entry (`Tree::publish`).
//!
//! A transaction (`Txn`) checks every condition against the current values, then applies all its
//! ops as one write, at the entry's seqnos, or nothing.
//!
//! A range deletion's page (`DeleteRange`) finds its keys in the tree as published, which is
//! everything applied before the entry, so every replica deletes the same keys whatever batches it
//! applies the log in.
//!
//! A command whose request id is in the window of recent ids (`requests`) is not applied again: it
//! gets the outcome of its first application.
//!
//! Repairs of damaged values go through here too (see `docs/design/replica.md`): a repair request
//! makes every replica whose copy of the key is healthy offer it ([`Applier::take_offers`], which
//! the loop proposes), and a repair replaces the key's value only on a replica whose current copy
//! is damaged, so the logical state, the same on every replica, never changes.

use crate::codec::{self, DecodedCommand, ValueSpan};
use crate::records;
use crate::requests::Effect;
use crate::state::{self, State, storage};
use crate::{CasOutcome, Expiry, Outcome, RangeDeletion, ReplicaError, StorageMode};
use onekv_index::IndexValue;
use onekv_log::Locator;
use raft::eraftpb::{Entry, EntryType};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The result of applying one entry.
pub(crate) struct Applied {
    pub index: u64,
    pub term: u64,
    /// `None` for entries that carry no command (leader no-ops, membership changes).
    pub outcome: Option<Result<Outcome, ReplicaError>>,
}

/// Applies entries of one shard into its state.
pub(crate) struct Applier {
    pub state: Arc<State>,
    shard: u64,
    /// Healthy copies `(key, value)` this replica offers in answer to repair requests it applied.
    offers: Vec<(Vec<u8>, Vec<u8>)>,
    /// The broken variant [`crate::Mutation::DeletesExpiredUnchecked`] (a simulation only).
    pub unchecked_expiry_deletes: bool,
    /// The broken variant [`crate::Mutation::RangePageReadsBatchStart`] (a simulation only).
    pub range_reads_at_batch_start: bool,
    /// Under that variant, the index as the batch being applied found it.
    batch_start: Option<onekv_index::TreeSnapshot>,
    /// The fast writes made durable here and not applied yet (`fast`): an ORDER applies them from
    /// here, and a write of the Raft path under the same id takes one out.
    pub fast: crate::fast::Pending,
    /// Fast writes applied from this replica's own DURABILITY record (the value's one copy), and
    /// from the copy an ORDER carried, since the replica opened.
    pub fast_from_record: u64,
    pub fast_from_inline: u64,
    /// The broken variant [`crate::Mutation::OrderSkipsWindow`] (a simulation only).
    pub order_skips_window: bool,
    /// The ORDER entry this replica cannot apply (it names a fast write this replica holds no
    /// record of and carries no copy of: this replica lost its disk, or joined, after the leader
    /// learnt that every replica held it). Nothing is applied from there on; the group waits for a
    /// snapshot past it (`fast::group`).
    pub stalled_at: Option<u64>,
}

/// Where one put's value will live, decided before the tree is written.
enum Placement {
    Locator(Locator),
    Inline,
}

/// What a put by reference (`wire_refs`) writes, found before the entry writes anything.
struct ResolvedRef {
    /// The key's new index value: the source's copy (onelog), or a copy made here.
    stored: IndexValue,
    /// The value's length.
    value_len: u64,
    /// The value's bytes, for the classic mode's data WAL.
    bytes: Option<Vec<u8>>,
}

/// The puts by reference of one command, resolved.
enum References {
    /// In op order.
    Resolved(Vec<ResolvedRef>),
    /// A source key does not hold a value of the length the leader saw (the leader's premise,
    /// that nothing before the entry changes it, failed): the same on every replica, since every
    /// replica's state is the same there. The command takes no effect and is not remembered as
    /// applied; its client retries.
    Stale(String),
    /// This replica cannot point the key at the source's copy (the copy is in a compressed block,
    /// or, in classic and separated mode, damaged): it waits for a snapshot past the entry.
    CannotApply(String),
}

/// Where the values of one command's puts come from: their places, in op order (puts with a
/// value in the entry), and what its puts by reference resolved to, in op order.
struct Sources<'r> {
    placements: Vec<Placement>,
    references: &'r [ResolvedRef],
}

/// A value a put writes: its place in the entry, or what its reference resolved to.
enum NewValue<'r> {
    Span(ValueSpan, Placement),
    Resolved(&'r ResolvedRef),
}

impl Applier {
    pub fn new(state: Arc<State>, shard: u64) -> Self {
        Applier {
            state,
            shard,
            offers: Vec::new(),
            unchecked_expiry_deletes: false,
            range_reads_at_batch_start: false,
            batch_start: None,
            fast: crate::fast::Pending::default(),
            fast_from_record: 0,
            fast_from_inline: 0,
            order_skips_window: false,
            stalled_at: None,
        }
    }

    /// Takes the healthy copies to propose as repairs (the loop proposes them after applying).
    pub fn take_offers(&mut self) -> Vec<(Vec<u8>, Vec<u8>)> {
        std::mem::take(&mut self.offers)
    }

    /// Applies `entries` (committed, durable, in index order; `locators[i]` is the payload locator
    /// of `entries[i]`'s ENTRY record).
    pub fn apply(&mut self, entries: &[Entry], locators: &[Locator]) -> Result<Vec<Applied>, ReplicaError> {
        let state = self.state.clone();
        self.batch_start = self.range_reads_at_batch_start.then(|| state.tree.snapshot());
        let decoded: Vec<_> = entries
            .iter()
            .map(|entry| {
                if entry.get_entry_type() != EntryType::EntryNormal || entry.data.is_empty() {
                    return Ok(None);
                }
                codec::decode(&entry.data)
                    .map(Some)
                    .map_err(|e| storage(format!("committed entry {} does not decode: {e}", entry.index)))
            })
            .collect::<Result<_, _>>()?;

        // Separated mode: copy every value of the batch into the value log first, in one append.
        let mut copied = Vec::new().into_iter();
        if state.mode == StorageMode::Separated {
            let mut values = Vec::new();
            for ((entry, decoded), _) in entries.iter().zip(&decoded).zip(locators) {
                if let Some(decoded) = decoded {
                    for span in value_spans(&decoded.command) {
                        values.push((
                            records::VALUE,
                            records::encode_value(self.shard, span.value(&entry.data)),
                        ));
                    }
                }
            }
            let value_log = state.second_log.as_ref().expect("separated mode has a value log");
            let locators = value_log.append_in_parts(
                &values.iter().map(|(kind, payload)| (*kind, payload.as_slice())).collect::<Vec<_>>(),
            );
            let locators = locators.map_err(|e| storage(format!("writing the value log: {e}")))?;
            // Tests widen the window between an append that sealed a segment holding some of its
            // values and their keys' publish (action `sleep(ms)`): the log collector must not take
            // that segment's index for complete meanwhile.
            #[cfg(feature = "failpoints")]
            if value_log
                .segments()
                .last()
                .zip(locators.first())
                .is_some_and(|(active, first)| first.position < active.base)
            {
                let _ = crate::failpoints::hit("value-log-sealed");
            }
            copied = locators
                .into_iter()
                .map(|l| {
                    l.slice(records::VALUE_HEADER as u64, l.len - records::VALUE_HEADER as u64).expect("fits")
                })
                .collect::<Vec<_>>()
                .into_iter();
        }

        let mut wal = Vec::new();
        let mut results = Vec::with_capacity(entries.len());
        for ((entry, decoded), locator) in entries.iter().zip(decoded).zip(locators) {
            let Some(decoded) = decoded else {
                results.push(Applied { index: entry.index, term: entry.term, outcome: None });
                continue;
            };
            let data_offset = records::entry_data_offset(entry.context.len()) as u64;
            let mut place = |span: ValueSpan| match state.mode {
                StorageMode::OneLog => Placement::Locator(
                    locator
                        .slice(data_offset + span.offset as u64, span.len as u64)
                        .expect("span inside entry"),
                ),
                StorageMode::Separated => Placement::Locator(copied.next().expect("one copy per value")),
                StorageMode::Classic => Placement::Inline,
            };
            // Placements are taken for every value in order (separated mode consumed them that way)
            // before deduplication decides whether the command takes effect.
            let placements: Vec<Placement> =
                value_spans(&decoded.command).into_iter().map(&mut place).collect();
            if let DecodedCommand::RepairRequest { .. } | DecodedCommand::Repair { .. } = decoded.command {
                // Replicas' own commands: no request id, no reply.
                state.requests().on_entry(entry.index, decoded.time_ms, None);
                self.apply_repair(entry, &decoded.command, placements)?;
                state.tree.publish(state::last_seqno(entry.index));
                results.push(Applied { index: entry.index, term: entry.term, outcome: None });
                continue;
            }
            // Repairs may be proposed by followers, on their own clocks: only leaders' times count.
            state.observe_time(decoded.time_ms);
            if let DecodedCommand::Order { drop_below, items } = &decoded.command {
                if !self.can_apply_order(items) {
                    self.stalled_at = Some(entry.index);
                    break;
                }
                // The window's writes go at the entry's last sequence number: after the data's.
                let applied = self.apply_order(entry, *locator, decoded.time_ms, items)?;
                state.requests().on_entry(entry.index, decoded.time_ms, None);
                for id in applied {
                    state.requests().on_entry(entry.index, decoded.time_ms, Some((id, Effect::Write)));
                }
                // A new leader's first order named every write that may have completed before it.
                let dropped = self.fast.drop_terms_below(*drop_below);
                if dropped > 0 {
                    tracing::info!(
                        shard = self.shard,
                        index = entry.index,
                        dropped,
                        "dropped fast writes of older terms that never completed"
                    );
                }
                state.tree.publish(state::last_seqno(entry.index));
                results.push(Applied { index: entry.index, term: entry.term, outcome: None });
                continue;
            }
            let request_id = decoded.request_id;
            let previous = state.requests().lookup(request_id);
            let outcome = match previous {
                // Applied before within the window: answer as then, change nothing.
                Some(previous) => {
                    // A fast write that took the Raft path after all (its client fell back with
                    // the same id): applied before, it is no longer pending.
                    self.fast.remove(request_id);
                    state.requests().on_entry(entry.index, decoded.time_ms, None);
                    match previous.effect {
                        Effect::Write | Effect::Swapped => {
                            Ok(repeated_outcome(previous.index, &decoded.command, &entry.data))
                        }
                        Effect::Nothing => reevaluated_without_effect(
                            &state,
                            entry.index,
                            decoded.time_ms,
                            previous.index,
                            &decoded.command,
                        )?,
                    }
                }
                None => {
                    let references =
                        match self.resolve_references(entry.index, decoded.time_ms, &decoded.command)? {
                            References::Resolved(references) => references,
                            References::Stale(why) => {
                                state.requests().on_entry(entry.index, decoded.time_ms, None);
                                state.tree.publish(state::last_seqno(entry.index));
                                let why = format!("entry {}: {why}; retry the write", entry.index);
                                results.push(Applied {
                                    index: entry.index,
                                    term: entry.term,
                                    outcome: Some(Err(ReplicaError::Dropped(why))),
                                });
                                continue;
                            }
                            References::CannotApply(why) => {
                                tracing::warn!(shard = self.shard, index = entry.index, "{why}");
                                self.stalled_at = Some(entry.index);
                                break;
                            }
                        };
                    // A fast write that took the Raft path after all: applied now, no longer
                    // pending.
                    self.fast.remove(request_id);
                    let outcome = self.apply_command(
                        entry,
                        decoded.time_ms,
                        &decoded.command,
                        Sources { placements, references: &references },
                        if state.mode == StorageMode::Classic { Some(&mut wal) } else { None },
                        0,
                    )?;
                    let effect = match &outcome.cas {
                        None => Effect::Write,
                        Some(cas) if cas.swapped => Effect::Swapped,
                        Some(_) => Effect::Nothing,
                    };
                    state.requests().on_entry(entry.index, decoded.time_ms, Some((request_id, effect)));
                    Ok(outcome)
                }
            };
            state.tree.publish(state::last_seqno(entry.index));
            results.push(Applied { index: entry.index, term: entry.term, outcome: Some(outcome) });
        }
        if !wal.is_empty() {
            let data_wal = state.second_log.as_ref().expect("classic mode has a data WAL");
            data_wal
                .append_in_parts(
                    &wal.iter().map(|payload| (records::APPLIED, payload.as_slice())).collect::<Vec<_>>(),
                )
                .map_err(|e| storage(format!("writing the data WAL: {e}")))?;
        }
        self.batch_start = None;
        Ok(results)
    }

    /// Applies a repair request (offer this replica's copy if healthy) or a repair (take the copy
    /// if this replica's is damaged).
    fn apply_repair(
        &mut self,
        entry: &Entry,
        command: &DecodedCommand<'_>,
        placements: Vec<Placement>,
    ) -> Result<(), ReplicaError> {
        let state = self.state.clone();
        let (key, repair) = match command {
            DecodedCommand::RepairRequest { key } => (*key, None),
            DecodedCommand::Repair { key, value } => (*key, Some(*value)),
            _ => unreachable!("only repairs come here"),
        };
        let current = state.tree.get(key).map_err(|e| storage(format!("index lookup: {e}")))?;
        let Some(current) = current else {
            return Ok(()); // deleted since: nothing to offer or repair
        };
        // A repaired copy keeps the key's expiry (the repair replaces the bytes, nothing else).
        let expiry = onekv_index::stored_expiry(&current);
        // The damaged bytes' place (a packed value's: its block) and the stored value's length.
        let (locator, stored_len) =
            match IndexValue::decode(&current).map_err(|e| storage(format!("index value: {e}")))? {
                IndexValue::Locator(locator) | IndexValue::Shared(locator) => (locator, locator.len),
                IndexValue::Packed(packed) => (packed.block, u64::from(packed.len)),
                // Inline values (classic mode) are never reported damaged here.
                IndexValue::Inline(_) => return Ok(()),
            };
        let read = state.resolve(key, &current);
        match (repair, read) {
            (None, Ok(value)) => self.offers.push((key.to_vec(), value)),
            // Damaged here too: this replica asks for a copy itself (reading reported it).
            (None, Err(ReplicaError::Corrupt { .. })) => {}
            // Healthy: the same value (nothing to do), or the key changed since the copy was
            // read (the repair is stale). Either way this replica changes nothing.
            (Some(_), Ok(_)) => {}
            // Damaged, and the copy has the damaged value's length: the copy was read from the
            // same version (a later write of the key would have replaced the damaged locator
            // here, as everywhere), so taking it keeps this replica's state the others'.
            (Some(span), Err(ReplicaError::Corrupt { .. })) if span.len as u64 == stored_len => {
                let stored = match placements.into_iter().next() {
                    Some(Placement::Locator(new)) => IndexValue::Locator(new),
                    Some(Placement::Inline) => IndexValue::Inline(span.value(&entry.data).to_vec()),
                    None => unreachable!("a repair carries one value"),
                };
                state.tree.insert(key, &stored.encode_expiring(expiry), state::seqno(entry.index, 0));
                state.corruption.repaired(key, locator, entry.index);
            }
            // Damaged, but a copy of another version: not this one's to take.
            (Some(_), Err(ReplicaError::Corrupt { .. })) => {}
            (_, Err(error)) => return Err(error),
        }
        Ok(())
    }

    /// Applies a client's command (or a leader's deletion of expired keys) at the entry's time
    /// `time_ms`: keys expired by then count as absent, whatever this machine's clock says.
    /// Takes out of the pending set the fast writes the request window says were applied (after a
    /// snapshot install, or a recovery's replay, which saw their effects without their ORDERs).
    pub fn drop_applied_fast_writes(&mut self) {
        let requests = self.state.requests();
        let applied: Vec<crate::RequestId> =
            self.fast.iter().map(|record| record.id).filter(|id| requests.lookup(*id).is_some()).collect();
        drop(requests);
        for id in applied {
            self.fast.remove(id);
        }
    }

    /// Whether every fast write an ORDER names can be applied here: applied already, or held here
    /// with the leader's digest, or carried inline.
    fn can_apply_order(&self, items: &[codec::DecodedOrderItem<'_>]) -> bool {
        items.iter().all(|item| {
            item.forget
                || item.inline.is_some()
                || self.fast.digest_of(item.id) == Some(item.digest)
                || (!self.order_skips_window && self.state.requests().lookup(item.id).is_some())
        })
    }

    /// Applies the fast writes an ORDER at `entry` names, in its order, at the entry's sequence
    /// numbers (each write's ops after the previous write's). Each takes its values from this
    /// replica's own DURABILITY record when it holds one with the digest the leader named (the
    /// value's one copy here), else from the copy the ORDER carries. A write already in the window
    /// (the Raft path applied it under the same id, or an earlier ORDER did) is skipped. A write
    /// this replica holds no matching record of and the ORDER carries no copy of cannot be
    /// applied: that stops the replica (the leader sends a copy of every write it does not know
    /// all replicas hold).
    fn apply_order(
        &mut self,
        entry: &Entry,
        locator: Locator,
        time_ms: u64,
        items: &[codec::DecodedOrderItem<'_>],
    ) -> Result<Vec<crate::RequestId>, ReplicaError> {
        let state = self.state.clone();
        let mut applied = Vec::with_capacity(items.len());
        if state.mode != StorageMode::OneLog {
            return Err(storage(format!(
                "entry {} orders fast writes, which only onelog mode takes",
                entry.index
            )));
        }
        let data_offset = records::entry_data_offset(entry.context.len()) as u64;
        let mut op_base = 0usize;
        for item in items {
            let local = self.fast.remove(item.id);
            if item.forget {
                continue;
            }
            let in_window = !self.order_skips_window && state.requests().lookup(item.id).is_some();
            if in_window || applied.contains(&item.id) {
                continue;
            }
            let (command, at): (Vec<u8>, Locator) = match (local, item.inline) {
                (Some(record), _) if record.digest == item.digest => {
                    self.fast_from_record += 1;
                    // Recovery reads a record's command only once its replay is done.
                    let command = match record.command.is_empty() {
                        true => state.raft_log.read(record.at).map_err(|e| {
                            storage(format!("entry {}: reading fast write {:?}: {e}", entry.index, item.id))
                        })?,
                        false => record.command.to_vec(),
                    };
                    (command, record.at)
                }
                (_, Some((offset, bytes))) => {
                    self.fast_from_inline += 1;
                    let at =
                        locator.slice(data_offset + offset as u64, bytes.len() as u64).ok_or_else(|| {
                            storage(format!(
                                "entry {}: an inline fast write lies outside the entry",
                                entry.index
                            ))
                        })?;
                    (bytes.to_vec(), at)
                }
                (local, None) => {
                    return Err(storage(format!(
                        "entry {} orders fast write {:?} (digest {:08x}), which this replica {}",
                        entry.index,
                        item.id,
                        item.digest,
                        match local {
                            Some(record) => format!("holds with another digest ({:08x})", record.digest),
                            None => "does not hold".to_string(),
                        }
                    )));
                }
            };
            let decoded = codec::decode(&command).map_err(|e| {
                storage(format!("entry {}: fast write {:?} does not decode: {e}", entry.index, item.id))
            })?;
            let DecodedCommand::Write(ops) = &decoded.command else {
                return Err(storage(format!(
                    "entry {}: fast write {:?} is not a write",
                    entry.index, item.id
                )));
            };
            if ops.iter().any(|op| op.reference.is_some()) {
                return Err(storage(format!(
                    "entry {}: fast write {:?} puts a value by reference (only a leader's own entries may)",
                    entry.index, item.id
                )));
            }
            if decoded.request_id != item.id || op_base + ops.len() > state::MAX_OP {
                return Err(storage(format!(
                    "entry {}: fast write {:?} holds id {:?}, or the order holds more than {} ops",
                    entry.index,
                    item.id,
                    decoded.request_id,
                    state::MAX_OP
                )));
            }
            let placements = value_spans(&decoded.command)
                .into_iter()
                .map(|span| {
                    Placement::Locator(at.slice(span.offset as u64, span.len as u64).expect("span inside"))
                })
                .collect();
            let written = Entry {
                index: entry.index,
                term: entry.term,
                data: command.clone().into(),
                ..Default::default()
            };
            let sources = Sources { placements, references: &[] };
            self.apply_command(&written, time_ms, &decoded.command, sources, None, op_base)?;
            op_base += ops.len();
            applied.push(item.id);
        }
        Ok(applied)
    }

    /// Resolves the puts by reference of `command` (`wire_refs`), at entry `index` applied at
    /// `time_ms`, against the state the entries before it left, which is the same on every
    /// replica: each takes the value its source key holds there, if that is a live value of the
    /// length the leader saw. In onelog mode the key will point at the source's copy (no byte is
    /// read or written); the other modes copy the value (a replica in them may follow a onelog
    /// leader).
    fn resolve_references(
        &mut self,
        index: u64,
        time_ms: u64,
        command: &DecodedCommand<'_>,
    ) -> Result<References, ReplicaError> {
        let DecodedCommand::Write(ops) = command else { return Ok(References::Resolved(Vec::new())) };
        let state = self.state.clone();
        let mut resolved = Vec::new();
        for op in ops {
            let Some(reference) = op.reference else { continue };
            let source = String::from_utf8_lossy(reference.source);
            let stored =
                state.tree.get(reference.source).map_err(|e| storage(format!("index lookup: {e}")))?;
            let Some(stored) = stored.filter(|stored| !onekv_index::expired_at(stored, time_ms)) else {
                return Ok(References::Stale(format!("the key {source:?} a put referred to holds no value")));
            };
            let value = IndexValue::decode(&stored)
                .map_err(|e| storage(format!("the index value of {source:?}: {e}")))?;
            let value_len = u64::from(reference.value_len);
            let stale = || {
                References::Stale(format!(
                    "the key {source:?} a put referred to holds a value of another length than {value_len} bytes"
                ))
            };
            let stored_len = value_len + codec::STORED_VALUE_PREFIX as u64;
            resolved.push(match (state.mode, value) {
                (StorageMode::OneLog, IndexValue::Locator(at) | IndexValue::Shared(at)) => {
                    if at.len != stored_len {
                        return Ok(stale());
                    }
                    let dedup = state.dedup.as_ref().expect("onelog mode keeps a dedup");
                    dedup.reference_place(self.shard, op.key, at);
                    ResolvedRef { stored: IndexValue::Shared(at), value_len, bytes: None }
                }
                // No length judged here: the block's layout is this replica's own, and a verdict
                // that differed from the other replicas' would part their states (a snapshot brings
                // the replicated one whichever it is).
                (StorageMode::OneLog, IndexValue::Packed(_)) => {
                    // From now on this node's GC moves values this long whole (the snapshot
                    // brings them whole).
                    state.dedup.as_ref().expect("onelog mode keeps a dedup").note_references_seen(stored_len);
                    return Ok(References::CannotApply(format!(
                        "entry {index} puts a value by reference to {source:?}, whose value this replica's \
                         log GC compressed (before this node met a put by reference, or because the \
                         leader's dedup.min_value_bytes is below this node's): waiting for a snapshot past it"
                    )));
                }
                (StorageMode::OneLog, IndexValue::Inline(_)) => {
                    return Err(storage(format!("the key {source:?} holds an inline value in onelog mode")));
                }
                (StorageMode::Classic | StorageMode::Separated, _) => {
                    let bytes = match state.get_at(reference.source, time_ms) {
                        Ok(Some((bytes, _))) => bytes,
                        Ok(None) => {
                            return Ok(References::Stale(format!(
                                "the key {source:?} a put referred to holds no value"
                            )));
                        }
                        // The copy here is damaged (the other replicas' are not): this replica
                        // cannot copy the value, and a snapshot brings it.
                        Err(ReplicaError::Corrupt { .. }) => {
                            return Ok(References::CannotApply(format!(
                                "entry {index} puts a value by reference to {source:?}, whose copy is damaged \
                                 here: waiting for a snapshot past it"
                            )));
                        }
                        Err(error) => return Err(error),
                    };
                    if bytes.len() as u64 != value_len {
                        return Ok(stale());
                    }
                    let stored = match state.mode {
                        StorageMode::Separated => {
                            let value_log = state.second_log.as_ref().expect("separated mode has a value log");
                            let payload = records::encode_value(self.shard, &bytes);
                            let at = value_log
                                .append_in_parts(&[(records::VALUE, payload.as_slice())])
                                .map_err(|e| storage(format!("writing the value log: {e}")))?;
                            let at = at.first().expect("one record");
                            IndexValue::Locator(
                                at.slice(records::VALUE_HEADER as u64, at.len - records::VALUE_HEADER as u64)
                                    .expect("fits"),
                            )
                        }
                        _ => IndexValue::Inline(bytes.clone()),
                    };
                    ResolvedRef { stored, value_len, bytes: Some(bytes) }
                }
            });
        }
        Ok(References::Resolved(resolved))
    }

    /// Applies one command at `entry`'s sequence numbers, its ops numbered from `op_base`.
    fn apply_command(
        &mut self,
        entry: &Entry,
        time_ms: u64,
        command: &DecodedCommand<'_>,
        sources: Sources<'_>,
        wal: Option<&mut Vec<Vec<u8>>>,
        op_base: usize,
    ) -> Result<Outcome, ReplicaError> {
        let Sources { placements, references } = sources;
        let state = self.state.clone();
        let data = &entry.data[..];
        let mut placements = placements.into_iter();
        // A range deletion's page: the keys it deletes, found before anything is written.
        let range_page = match command {
            DecodedCommand::DeleteRange { start, end, limit, spare } => {
                Some(range_page(&state, self.batch_start.as_ref(), start, *end, *limit as usize, spare)?)
            }
            _ => None,
        };
        let mut effects: Vec<(&[u8], Option<&[u8]>)> = Vec::new();
        let mut user_bytes = 0u64;
        // The expiry each key written so far by this entry got: the tree shows the entry's writes
        // only once the whole entry is published, so a later op keeping a key's expiry looks here
        // first (a delete, then a put keeping the expiry, keeps none).
        let mut written: HashMap<Vec<u8>, Option<u64>> = HashMap::new();
        let mut write = |op: usize, key: &[u8], value: Option<NewValue<'_>>, expiry: Expiry| {
            let seqno = state::seqno(entry.index, op_base + op);
            match value {
                Some(value) => {
                    let (stored, value_len) = match value {
                        NewValue::Span(span, placement) => {
                            let stored = match placement {
                                // With deduplication on, a value already in the log byte for byte
                                // is pointed at there, and this entry's copy is garbage from now on.
                                Placement::Locator(locator) => match state.dedup.as_ref().and_then(|dedup| {
                                    dedup.inline_place(&state.raft_log, span.stored(data), locator)
                                }) {
                                    Some(copy) => IndexValue::Shared(copy),
                                    None => IndexValue::Locator(locator),
                                },
                                Placement::Inline => IndexValue::Inline(span.value(data).to_vec()),
                            };
                            (stored, (span.len - codec::STORED_VALUE_PREFIX) as u64)
                        }
                        NewValue::Resolved(resolved) => (resolved.stored.clone(), resolved.value_len),
                    };
                    let expires_at = match codec::absolute(expiry, time_ms) {
                        Expiry::Never => None,
                        Expiry::At(at) | Expiry::AfterMs(at) => Some(at),
                        Expiry::Keep => match written.get(key) {
                            Some(earlier) => earlier.filter(|&at| at > time_ms),
                            None => state.live_expiry(key, time_ms)?,
                        },
                    };
                    if expires_at.is_some() {
                        state.expiring_writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    state.tree.insert(key, &stored.encode_expiring(expires_at), seqno);
                    written.insert(key.to_vec(), expires_at);
                    user_bytes += key.len() as u64 + value_len;
                }
                None => {
                    state.tree.remove(key, seqno);
                    written.insert(key.to_vec(), None);
                    user_bytes += key.len() as u64;
                }
            }
            Ok::<_, ReplicaError>(())
        };
        let outcome = match command {
            DecodedCommand::Write(ops) => {
                let mut references = references.iter();
                for (op, decoded) in ops.iter().enumerate() {
                    if decoded.reference.is_some() {
                        let resolved =
                            references.next().expect("one resolved reference per put by reference");
                        write(op, decoded.key, Some(NewValue::Resolved(resolved)), decoded.expiry)?;
                        effects.push((decoded.key, Some(resolved.bytes.as_deref().unwrap_or_default())));
                        continue;
                    }
                    let value =
                        decoded.value.map(|span| NewValue::Span(span, placements.next().expect("placement")));
                    write(op, decoded.key, value, decoded.expiry)?;
                    effects.push((decoded.key, decoded.value.map(|span| span.value(data))));
                }
                Outcome::at(entry.index)
            }
            DecodedCommand::DeleteExpired { keys } => {
                for (op, key) in keys.iter().enumerate() {
                    let stored = state.tree.get(key).map_err(|e| storage(format!("index lookup: {e}")))?;
                    let expired = stored.is_some_and(|stored| onekv_index::expired_at(&stored, time_ms));
                    if expired || (self.unchecked_expiry_deletes && stored_is_some(&state, key)?) {
                        write(op, key, None, Expiry::Never)?;
                        state.expired_deleted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        effects.push((key, None));
                    }
                }
                Outcome::at(entry.index)
            }
            DecodedCommand::DeleteRange { .. } => {
                let (keys, resume) = range_page.as_ref().expect("found above");
                for (op, key) in keys.iter().enumerate() {
                    write(op, key, None, Expiry::Never)?;
                    effects.push((key, None));
                }
                Outcome {
                    index: entry.index,
                    cas: None,
                    range: Some(RangeDeletion { deleted: keys.len() as u64, resume: resume.clone() }),
                }
            }
            DecodedCommand::RepairRequest { .. } | DecodedCommand::Repair { .. } => {
                unreachable!("repairs are applied by apply_repair")
            }
            DecodedCommand::Order { .. } => unreachable!("orders are applied by apply_order"),
            DecodedCommand::Cas { key, expected, new, new_expiry } => {
                let current = state.get_at(key, time_ms)?.map(|(value, _)| value);
                let new_placement =
                    new.map(|span| NewValue::Span(span, placements.next().expect("placement")));
                if current.as_deref() == *expected {
                    write(0, key, new_placement, *new_expiry)?;
                    effects.push((key, new.map(|span| span.value(data))));
                    let current = new.map(|span| span.value(data).to_vec());
                    Outcome::swap(entry.index, CasOutcome { swapped: true, current })
                } else {
                    Outcome::swap(entry.index, CasOutcome { swapped: false, current })
                }
            }
            DecodedCommand::Txn { conditions, ops } => {
                // Every condition is checked before anything is written: all of the ops or none.
                let mut holds = true;
                for (key, expected) in conditions {
                    if state.get_at(key, time_ms)?.map(|(value, _)| value).as_deref() != *expected {
                        holds = false;
                        break;
                    }
                }
                if holds {
                    for (op, decoded) in ops.iter().enumerate() {
                        let value = decoded
                            .value
                            .map(|span| NewValue::Span(span, placements.next().expect("placement")));
                        write(op, decoded.key, value, decoded.expiry)?;
                        effects.push((decoded.key, decoded.value.map(|span| span.value(data))));
                    }
                }
                Outcome::swap(entry.index, CasOutcome { swapped: holds, current: None })
            }
        };
        state.add_user_bytes(user_bytes);
        if let Some(wal) = wal
            && !effects.is_empty()
        {
            wal.push(records::encode_applied(self.shard, entry.index, &effects));
        }
        Ok(outcome)
    }

    /// Writes a received snapshot's pairs to the log as chunk records followed by its metadata, and
    /// fsyncs them; returns the payload locators of the chunks.
    pub fn persist_snapshot(
        &self,
        meta: &records::SnapshotMeta,
        data: &[u8],
    ) -> Result<Vec<Locator>, ReplicaError> {
        let chunk_bytes = records::chunk_bytes(self.state.raft_log.config().max_record_bytes);
        let mut chunks: Vec<Vec<u8>> = Vec::new();
        let mut current = Vec::new();
        for pair in records::SnapshotItems::new(data) {
            let (key, value, expiry) = pair.map_err(|e| storage(format!("snapshot data: {e}")))?;
            let len = match value {
                records::PairValue::Stored(span) => span.len,
                records::PairValue::SameAs(same_as) => same_as.len(),
            };
            if !current.is_empty() && current.len() + key.len() + len + 16 > chunk_bytes {
                chunks.push(std::mem::take(&mut current));
            }
            match value {
                records::PairValue::Stored(span) => {
                    let value = codec::verify_stored_value(&data[span.offset..span.offset + span.len])
                        .map_err(|e| storage(format!("snapshot data: {e}")))?;
                    records::push_expiring_pair(&mut current, key, expiry, value);
                }
                records::PairValue::SameAs(same_as) => {
                    records::push_reference_pair(&mut current, key, expiry, same_as)
                }
            }
        }
        if !current.is_empty() {
            chunks.push(current);
        }
        let mut payloads: Vec<Vec<u8>> = chunks
            .iter()
            .enumerate()
            .map(|(i, pairs)| records::encode_snapshot_chunk(self.shard, meta.index, i as u32, pairs))
            .collect();
        let meta = records::SnapshotMeta { chunks: payloads.len() as u32, ..meta.clone() };
        payloads.push(records::encode_snapshot_meta(&meta));
        let mut kinds = vec![records::SNAP_CHUNK; payloads.len() - 1];
        kinds.push(records::SNAP_META);
        // In order, in as many group commits as the size needs: the snapshot counts at recovery
        // only once its metadata record, which comes last, is durable after all its chunks.
        let locators = self
            .state
            .raft_log
            .append_in_parts(
                &kinds.iter().zip(&payloads).map(|(k, p)| (*k, p.as_slice())).collect::<Vec<_>>(),
            )
            .map_err(|e| storage(format!("writing a snapshot: {e}")))?;
        Ok(locators[..locators.len() - 1].to_vec())
    }

    /// Writes the metadata of a snapshot whose `chunks` chunk records a fetch already stored
    /// (durable, in order, before this), and fsyncs it: from here on a recovery installs it.
    pub fn persist_snapshot_meta(
        &self,
        meta: &records::SnapshotMeta,
        chunks: usize,
    ) -> Result<(), ReplicaError> {
        let meta = records::SnapshotMeta { chunks: chunks as u32, ..meta.clone() };
        self.state
            .raft_log
            .append(&[(records::SNAP_META, &records::encode_snapshot_meta(&meta))])
            .map_err(|e| storage(format!("writing a snapshot's metadata: {e}")))?;
        Ok(())
    }

    /// Installs a snapshot inline ([`install_snapshot`]): recovery at open does, before the loop
    /// starts, and so does a simulation.
    pub fn install_snapshot(
        &mut self,
        index: u64,
        chunk_locators: &[Locator],
        note: &[u8],
    ) -> Result<(), ReplicaError> {
        install_snapshot(&self.state, self.shard, index, chunk_locators, note, &AtomicBool::new(false))
    }
}

/// Replaces the tree's contents with a snapshot's pairs (read from its durable chunk records)
/// and flushes the tree with the snapshot's index as its flag and `note` (the shard's recovery
/// point: never empty, since the log GC may have reclaimed the log's start) beside it.
///
/// Memory stays bounded whatever the snapshot's size: whenever the memtable fills, it is
/// flushed without moving the flag (`Tree::flush_keeping_flag`). A crash part-way leaves those
/// writes on disk under the old flag and recovery point, and the snapshot's metadata is durable
/// before this runs, so recovery installs the snapshot again, above them. `stop`, checked
/// between chunks of the old keys' removal and of the snapshot's pairs, ends the install early
/// with [`ReplicaError::Stopping`] (the node is stopping or the replica leaves it; a recovery
/// installs the snapshot again). The final flush is not cut short.
pub(crate) fn install_snapshot(
    state: &State,
    shard: u64,
    index: u64,
    chunk_locators: &[Locator],
    note: &[u8],
    stop: &AtomicBool,
) -> Result<(), ReplicaError> {
    // Until its flagged flush ends, the log GC collects nothing for a census it overlapped.
    let _installing = state::InstallGuard::begin(state);
    let (clear_at, write_at) = install_seqnos(index, state.tree.last_written_seqno())?;
    let flushed = |e| storage(format!("flushing part of a snapshot's install: {e}"));
    let stopped = || stop.load(Ordering::Relaxed);
    // The metadata is durable: a stop anywhere here leaves the next recovery to install again.
    if stopped() {
        return Err(ReplicaError::Stopping);
    }
    let cleared = state
        .tree
        .clear_until(clear_at, &stopped)
        .map_err(|e| storage(format!("clearing the index: {e}")))?;
    if !cleared {
        return Err(ReplicaError::Stopping);
    }
    state.requests().reset();
    for chunk in chunk_locators {
        if stopped() {
            return Err(ReplicaError::Stopping);
        }
        // Only ever delays (a test's callback): slows an install down to watch the node meanwhile.
        let _ = crate::failpoints::hit("snapshot-install-chunk");
        let (_, payload) = state
            .raft_log
            .read_record(*chunk)
            .map_err(|e| storage(format!("reading a snapshot chunk: {e}")))?;
        let pairs = &payload[records::SNAP_CHUNK_HEADER..];
        let mut values = Vec::new();
        let mut keys = Vec::new();
        for pair in records::SnapshotItems::new(pairs) {
            let (key, value, expiry) = pair.map_err(|e| storage(format!("snapshot chunk: {e}")))?;
            let span = match value {
                records::PairValue::Stored(span) => span,
                // Resolved below, in order: the key it names is written by then.
                records::PairValue::SameAs(_) if state.mode == StorageMode::OneLog && !key.is_empty() => {
                    keys.push((key, value, expiry));
                    continue;
                }
                records::PairValue::SameAs(_) => {
                    return Err(storage(format!(
                        "a snapshot chunk holds a reference to another key's value where a {} replica \
                         cannot take one (only one-log replicas ask for references, for user keys)",
                        state.mode.name()
                    )));
                }
            };
            if key.is_empty() {
                // Not a user key (those are never empty): part of the request-id window.
                state.requests().install_pair(span.value(pairs), write_at)?;
                continue;
            }
            keys.push((key, value, expiry));
            if state.mode == StorageMode::Separated {
                values.push(records::encode_value(shard, span.value(pairs)));
            }
        }
        let copied = if values.is_empty() {
            Vec::new()
        } else {
            let value_log = state.second_log.as_ref().expect("separated mode has a value log");
            value_log
                .append_in_parts(&values.iter().map(|v| (records::VALUE, v.as_slice())).collect::<Vec<_>>())
                .map_err(|e| storage(format!("writing the value log: {e}")))?
        };
        let mut copied = copied.into_iter();
        for (key, value, expiry) in keys {
            let span = match value {
                records::PairValue::Stored(span) => span,
                records::PairValue::SameAs(same_as) => {
                    let shared = copy_written_under(state, same_as, write_at)?;
                    if let Some(dedup) = &state.dedup {
                        dedup.count_snapshot_hit(shared.len);
                    }
                    state.tree.insert(key, &IndexValue::Shared(shared).encode_expiring(expiry), write_at);
                    continue;
                }
            };
            let stored = match state.mode {
                StorageMode::OneLog => IndexValue::Locator(
                    chunk
                        .slice((records::SNAP_CHUNK_HEADER + span.offset) as u64, span.len as u64)
                        .expect("span inside chunk"),
                ),
                StorageMode::Separated => {
                    let l = copied.next().expect("a copy per value");
                    IndexValue::Locator(
                        l.slice(records::VALUE_HEADER as u64, l.len - records::VALUE_HEADER as u64)
                            .expect("fits"),
                    )
                }
                StorageMode::Classic => IndexValue::Inline(span.value(pairs).to_vec()),
            };
            state.tree.insert(key, &stored.encode_expiring(expiry), write_at);
        }
        if state.tree.memtable_full() {
            state.tree.flush_keeping_flag().map_err(flushed)?;
            crate::failpoint!("during-snapshot-install");
        }
    }
    state.observe_time(state.requests().clock_ms());
    state.tree.publish(state::last_seqno(index));
    state
        .tree
        .flush_with_note(index, state::last_seqno(index), note)
        .map_err(|e| storage(format!("flushing the index after a snapshot: {e}")))?;
    Ok(())
}

/// The copy of its value the install of a snapshot at seqno `write_at` pointed `key` at: what a
/// later key of the snapshot referring to it ([`records::PairValue::SameAs`]) shares. The sender
/// names only keys it sent before with a value, and the fetch checked that (`snapshot::fetch::
/// check_pairs`), so a key missing here means a damaged or wrong snapshot. The install has the tree
/// to itself, so reading past the published seqno sees only its own writes.
fn copy_written_under(state: &State, key: &[u8], write_at: u64) -> Result<Locator, ReplicaError> {
    let stored = match state.references_as_published {
        true => state.tree.get(key),
        false => state.tree.get_written(key, write_at),
    }
    .map_err(|e| storage(format!("index lookup during a snapshot install: {e}")))?;
    let value = stored.as_deref().map(IndexValue::decode).transpose().map_err(|e| {
        storage(format!(
            "a snapshot's key {} has an unreadable index value: {e}",
            String::from_utf8_lossy(key)
        ))
    })?;
    match value {
        Some(IndexValue::Locator(copy) | IndexValue::Shared(copy)) => Ok(copy),
        _ => Err(storage(format!(
            "a snapshot refers to the value of key {}, which it did not hold before",
            String::from_utf8_lossy(key)
        ))),
    }
}

/// Whether `key` is present in the tree at all (expired or not).
fn stored_is_some(state: &State, key: &[u8]) -> Result<bool, ReplicaError> {
    Ok(state.tree.get(key).map_err(|e| storage(format!("index lookup: {e}")))?.is_some())
}

/// The seqnos a snapshot's install at `index` clears the tree at and writes its pairs at, given
/// the highest seqno the tree has written: normally the entry's first two, but above what an
/// earlier install of the same snapshot flushed before a crash cut it short (its writes are on
/// disk, and a tree never takes a write below one it has).
fn install_seqnos(index: u64, last_written: u64) -> Result<(u64, u64), ReplicaError> {
    let clear_at = state::seqno(index, 0).max(last_written + 1);
    let write_at = clear_at + 1;
    if write_at > state::seqno(index, state::MAX_OP) {
        return Err(storage(format!(
            "the index has written seqno {last_written}, at or past those of the snapshot at entry {index}"
        )));
    }
    Ok((clear_at, write_at))
}

/// The answer to a retry, at entry `index`, of a compare-and-swap (or transaction) that took no
/// effect when first evaluated at `first_index`: "not swapped" with the value now, if it still
/// differs from the expected one (what a new evaluation at `index` would answer, and the first had
/// no effect to order); otherwise [`ReplicaError::AlreadyEvaluated`]: swapping now could
/// contradict the first answer, and "not swapped" with a matching value would contradict itself.
fn reevaluated_without_effect(
    state: &State,
    index: u64,
    time_ms: u64,
    first_index: u64,
    command: &DecodedCommand<'_>,
) -> Result<Result<Outcome, ReplicaError>, ReplicaError> {
    let already = Err(ReplicaError::AlreadyEvaluated { index: first_index });
    let current = |key| Ok::<_, ReplicaError>(state.get_at(key, time_ms)?.map(|(value, _)| value));
    Ok(match command {
        DecodedCommand::Cas { key, expected, .. } => {
            let current = current(key)?;
            if current.as_deref() == *expected {
                already
            } else {
                Ok(Outcome::swap(index, CasOutcome { swapped: false, current }))
            }
        }
        DecodedCommand::Txn { conditions, .. } => {
            for (key, expected) in conditions {
                if current(key)?.as_deref() != *expected {
                    return Ok(Ok(Outcome::swap(index, CasOutcome { swapped: false, current: None })));
                }
            }
            already
        }
        // Only compare-and-swaps and transactions can take no effect.
        _ => already,
    })
}

/// The answer to a command whose request id the window says was applied at `first_index`: the
/// same as then. A swapped compare-and-swap's value then is the new value, which the retry carries
/// too (same request id, same command).
fn repeated_outcome(first_index: u64, command: &DecodedCommand<'_>, data: &[u8]) -> Outcome {
    match command {
        DecodedCommand::Write(_)
        | DecodedCommand::DeleteExpired { .. }
        | DecodedCommand::RepairRequest { .. }
        | DecodedCommand::Repair { .. }
        | DecodedCommand::Order { .. } => Outcome::at(first_index),
        DecodedCommand::Cas { new, .. } => Outcome::swap(
            first_index,
            CasOutcome { swapped: true, current: new.map(|span| span.value(data).to_vec()) },
        ),
        DecodedCommand::Txn { .. } => Outcome::swap(first_index, CasOutcome { swapped: true, current: None }),
        // What the first application deleted is not kept: the page is to be run again from its start
        // (harmless: it deletes only what is there now).
        DecodedCommand::DeleteRange { start, .. } => Outcome {
            index: first_index,
            cas: None,
            range: Some(RangeDeletion { deleted: 0, resume: Some(start.to_vec()) }),
        },
    }
}

/// The keys one page of a range deletion deletes (the first `limit` of `start..end` in the index
/// as published, which is everything applied before this entry, less those beginning with
/// `spare`, and no more than [`crate::RANGE_DELETE_PAGE_KEY_BYTES`] of keys), and where the next
/// page starts (`None`: the range holds no more keys). The index is the same on every replica at
/// this point of the log, so every replica finds the same keys. The tree is read a few pairs at a
/// time: in classic mode its values are the values themselves.
#[expect(clippy::type_complexity, reason = "keys and a resume point, used once")]
fn range_page(
    state: &State,
    stale: Option<&onekv_index::TreeSnapshot>,
    start: &[u8],
    end: Option<&[u8]>,
    limit: usize,
    spare: &[u8],
) -> Result<(Vec<Vec<u8>>, Option<Vec<u8>>), ReplicaError> {
    /// Pairs read from the tree at a time.
    const READ: usize = 64;
    let mut keys: Vec<Vec<u8>> = Vec::new();
    let mut key_bytes = 0;
    let mut cursor = start.to_vec();
    loop {
        // One key beyond the page, to tell a full page from the range's end.
        let wanted = (limit - keys.len() + 1).min(READ);
        let (pairs, more) = match stale {
            Some(snapshot) => snapshot.range(&cursor, end, wanted, false),
            None => state.tree.range(&cursor, end, wanted, false),
        }
        .map_err(|e| storage(format!("index range read: {e}")))?;
        let Some((last, _)) = pairs.last() else { return Ok((keys, None)) };
        // The key after the last one read: where the next read starts if this one ends early.
        let mut after = last.clone();
        after.push(0);
        for (key, _) in pairs {
            if !spare.is_empty() && key.starts_with(spare) {
                continue;
            }
            if keys.len() == limit
                || (!keys.is_empty() && key_bytes + key.len() > crate::RANGE_DELETE_PAGE_KEY_BYTES)
            {
                return Ok((keys, Some(key)));
            }
            key_bytes += key.len();
            keys.push(key);
        }
        if !more {
            return Ok((keys, None));
        }
        cursor = after;
    }
}

/// The spans of every value a command may store, in order.
fn value_spans(command: &DecodedCommand<'_>) -> Vec<ValueSpan> {
    match command {
        DecodedCommand::Write(ops) | DecodedCommand::Txn { ops, .. } => {
            ops.iter().filter_map(|op| op.value).collect()
        }
        DecodedCommand::Cas { new, .. } => new.iter().copied().collect(),
        // An order's values are placed write by write (`apply_order`).
        DecodedCommand::RepairRequest { .. }
        | DecodedCommand::DeleteExpired { .. }
        | DecodedCommand::DeleteRange { .. }
        | DecodedCommand::Order { .. } => Vec::new(),
        DecodedCommand::Repair { value, .. } => vec![*value],
    }
}
