//! The window of recent request ids: what makes a retried write take effect once.
//!
//! The window is part of the replicated state: every replica must make the same "already applied"
//! decision for the same entry, or a retried write that committed twice would be applied by some
//! replicas and skipped by others. So it is persisted like the data (its own index tree, flushed with
//! the same flag, **before** the data tree so its flag is never behind the data's), rebuilt from that
//! tree at open, replayed like the data, and carried in snapshots. In memory it is a map plus the
//! order ids arrived in; the oldest id leaves once the window is full.
//!
//! Tree layout (explicit widths): key `client:u64 BE seq:u64 BE`; value `index:u64 LE cas:u8
//! [swapped:u8 has_current:u8 [len:u32 LE current]]`. In a snapshot the whole window travels as one
//! pair with the empty key (user keys are never empty): `count:u32 (client:u64 seq:u64 len:u32
//! value)*`.

use crate::codec::{CodecError, Reader};
use crate::state::{self, storage};
use crate::{CasOutcome, Outcome, ReplicaError, RequestId};
use onekv_index::Tree;
use std::collections::{HashMap, VecDeque};

/// Request ids remembered.
pub(crate) const WINDOW: usize = 100_000;

/// Name of a shard's request-id tree.
pub(crate) fn tree_name(shard: u64) -> String {
    format!("requests-{shard}")
}

pub(crate) struct RequestWindow {
    tree: Tree,
    /// The tree's flush flag: entries at or below it are in the tree already (a replay must not
    /// write them again).
    persisted_to: u64,
    outcomes: HashMap<RequestId, Outcome>,
    order: VecDeque<RequestId>,
}

impl RequestWindow {
    /// Loads the window persisted in `tree`.
    pub fn load(tree: Tree) -> Result<Self, ReplicaError> {
        let persisted_to = tree.flush_flag().unwrap_or(0);
        let mut entries = Vec::new();
        let mut start = Vec::new();
        loop {
            let (page, more) = tree.range(&start, None, 4096, false).map_err(|e| storage(format!("{e}")))?;
            for (key, value) in &page {
                let id = decode_key(key).map_err(|e| storage(format!("request window: {e}")))?;
                let outcome = decode_outcome(value).map_err(|e| storage(format!("request window: {e}")))?;
                entries.push((id, outcome));
            }
            match page.last() {
                Some((key, _)) if more => {
                    start = key.clone();
                    start.push(0);
                }
                _ => break,
            }
        }
        entries.sort_by_key(|(_, outcome)| outcome.index);
        let mut window =
            RequestWindow { tree, persisted_to, outcomes: HashMap::new(), order: VecDeque::new() };
        for (id, outcome) in entries {
            window.order.push_back(id);
            window.outcomes.insert(id, outcome);
        }
        Ok(window)
    }

    /// The outcome of `id` if it was applied within the window.
    pub fn lookup(&self, id: RequestId) -> Option<Outcome> {
        if id.seq == 0 {
            return None;
        }
        self.outcomes.get(&id).cloned()
    }

    /// Records that `id` was applied by the entry at `outcome.index`.
    pub fn remember(&mut self, id: RequestId, outcome: Outcome) {
        if id.seq == 0 {
            return;
        }
        let index = outcome.index;
        let write = index > self.persisted_to;
        if write {
            self.tree.insert(&encode_key(id), &encode_outcome(&outcome), state::seqno(index, 0));
        }
        if self.outcomes.insert(id, outcome).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > WINDOW {
            let old = self.order.pop_front().expect("not empty");
            self.outcomes.remove(&old);
            if write {
                self.tree.remove(&encode_key(old), state::seqno(index, 1));
            }
        }
        if write {
            self.tree.publish(state::last_seqno(index));
        }
    }

    /// Persists the window as of `applied`.
    pub fn flush(&mut self, applied: u64) -> Result<(), ReplicaError> {
        self.tree
            .flush(applied, state::last_seqno(applied))
            .map_err(|e| storage(format!("flushing the request window: {e}")))?;
        self.persisted_to = applied;
        Ok(())
    }

    /// The whole window, for a snapshot.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(self.order.len() as u32).to_le_bytes());
        for id in &self.order {
            let value = encode_outcome(&self.outcomes[id]);
            out.extend_from_slice(&id.client.to_le_bytes());
            out.extend_from_slice(&id.seq.to_le_bytes());
            out.extend_from_slice(&(value.len() as u32).to_le_bytes());
            out.extend_from_slice(&value);
        }
        out
    }

    /// Replaces the window with a snapshot's (taken at `index`) and persists it.
    pub fn install(&mut self, encoded: &[u8], index: u64) -> Result<(), ReplicaError> {
        if index <= self.persisted_to {
            // Recovery re-installing a snapshot this window already holds (it is flushed before
            // the data tree, so it can be ahead of it).
            return Ok(());
        }
        let bad = |e: CodecError| storage(format!("the snapshot's request window: {e}"));
        let mut r = Reader { data: encoded, at: 0 };
        let count = r.u32().map_err(bad)? as usize;
        if count > r.remaining() / 20 {
            return Err(bad(CodecError("count exceeds the data")));
        }
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            let id = RequestId { client: r.u64().map_err(bad)?, seq: r.u64().map_err(bad)? };
            let outcome = decode_outcome(r.bytes().map_err(bad)?).map_err(bad)?;
            entries.push((id, outcome));
        }
        self.tree
            .clear(state::seqno(index, 0))
            .map_err(|e| storage(format!("clearing the request window: {e}")))?;
        self.outcomes.clear();
        self.order.clear();
        for (id, outcome) in entries {
            self.tree.insert(&encode_key(id), &encode_outcome(&outcome), state::seqno(index, 1));
            self.order.push_back(id);
            self.outcomes.insert(id, outcome);
        }
        self.tree.publish(state::last_seqno(index));
        self.flush(index)
    }
}

fn encode_key(id: RequestId) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&id.client.to_be_bytes());
    key[8..].copy_from_slice(&id.seq.to_be_bytes());
    key
}

fn decode_key(key: &[u8]) -> Result<RequestId, CodecError> {
    let key: &[u8; 16] = key.try_into().map_err(|_| CodecError("request key is not 16 bytes"))?;
    Ok(RequestId {
        client: u64::from_be_bytes(key[..8].try_into().expect("8 bytes")),
        seq: u64::from_be_bytes(key[8..].try_into().expect("8 bytes")),
    })
}

fn encode_outcome(outcome: &Outcome) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    out.extend_from_slice(&outcome.index.to_le_bytes());
    match &outcome.cas {
        None => out.push(0),
        Some(cas) => {
            out.push(1);
            out.push(u8::from(cas.swapped));
            match &cas.current {
                None => out.push(0),
                Some(current) => {
                    out.push(1);
                    out.extend_from_slice(&(current.len() as u32).to_le_bytes());
                    out.extend_from_slice(current);
                }
            }
        }
    }
    out
}

fn decode_outcome(bytes: &[u8]) -> Result<Outcome, CodecError> {
    let mut r = Reader { data: bytes, at: 0 };
    let index = r.u64()?;
    let flag = |v: u8| match v {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(CodecError("bad flag in a request outcome")),
    };
    let cas = if flag(r.u8()?)? {
        let swapped = flag(r.u8()?)?;
        let current = if flag(r.u8()?)? { Some(r.bytes()?.to_vec()) } else { None };
        Some(CasOutcome { swapped, current })
    } else {
        None
    };
    if r.remaining() != 0 {
        return Err(CodecError("trailing bytes after a request outcome"));
    }
    Ok(Outcome { index, cas })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_and_keys_round_trip() {
        for outcome in [
            Outcome { index: 7, cas: None },
            Outcome { index: 8, cas: Some(CasOutcome { swapped: true, current: Some(b"v".to_vec()) }) },
            Outcome { index: 9, cas: Some(CasOutcome { swapped: false, current: None }) },
        ] {
            let bytes = encode_outcome(&outcome);
            assert_eq!(decode_outcome(&bytes).unwrap(), outcome);
            for len in 0..bytes.len() {
                assert!(decode_outcome(&bytes[..len]).is_err());
            }
        }
        let id = RequestId { client: u64::MAX - 1, seq: 3 };
        assert_eq!(decode_key(&encode_key(id)).unwrap(), id);
        assert!(decode_key(&[0; 15]).is_err());
    }
}
