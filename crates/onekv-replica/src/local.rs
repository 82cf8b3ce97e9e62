//! Replicas of one cluster inside one process, wired by an in-memory [`Transport`].
//!
//! For tests, the write-amplification benchmark and (later) the deterministic simulation: it
//! exercises everything but the network. Delivery calls [`crate::Node::step`] on the receiving
//! node, which never blocks, so the sending loop is never held up by the receiving one. A node is
//! added by any one of its replicas; messages of every shard reach it.

use crate::{ChunkRequest, Message, Replica, SnapshotChunk, Transport};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

/// Delivers Raft messages between the replicas added to it; messages to or from a node that is
/// not (or no longer) added are dropped, as a network drops them to a dead node.
#[derive(Default)]
pub struct Router {
    replicas: RwLock<HashMap<u64, Replica>>,
    drop_if: RwLock<Option<MessageFilter>>,
    /// Snapshot chunk calls answered so far.
    chunk_calls: AtomicU64,
    /// One more than the number of chunk calls after which every call fails (0: none fail).
    fail_chunks_after: AtomicU64,
    /// Microseconds each chunk call waits before it is answered, as a slow sender would.
    chunk_delay_us: AtomicU64,
    /// Per node asked: chunk calls it answered and bytes of pairs it sent.
    served: Mutex<HashMap<u64, (u64, u64)>>,
    /// A node whose chunk calls fail once it answered some (as a sender that dies or is cut
    /// off for a while): the node, the calls it answers first, and how many fail then.
    failing_sender: Mutex<Option<(u64, u64, u64)>>,
}

/// Decides whether the router loses a message (`true`: dropped).
pub type MessageFilter = Box<dyn Fn(&Message) -> bool + Send + Sync>;

impl Router {
    /// Starts delivering to and from `id`.
    pub fn add(&self, id: u64, replica: Replica) {
        self.replicas.write().unwrap_or_else(|e| e.into_inner()).insert(id, replica);
    }

    /// Stops delivering to and from `id`, and returns its replica (for shutting it down).
    pub fn remove(&self, id: u64) -> Option<Replica> {
        self.replicas.write().unwrap_or_else(|e| e.into_inner()).remove(&id)
    }

    /// The replica `id`, if added.
    pub fn get(&self, id: u64) -> Option<Replica> {
        self.replicas.read().unwrap_or_else(|e| e.into_inner()).get(&id).cloned()
    }

    /// Loses every message `filter` returns true for (until replaced; `None` delivers everything),
    /// as an unreliable network would.
    pub fn set_drop_filter(&self, filter: Option<MessageFilter>) {
        *self.drop_if.write().unwrap_or_else(|e| e.into_inner()) = filter;
    }

    /// Snapshot chunk calls answered so far (failed ones included).
    pub fn chunk_calls(&self) -> u64 {
        self.chunk_calls.load(Ordering::SeqCst)
    }

    /// Fails every snapshot chunk call once `calls` have been made in all, as a sender that went
    /// away mid-stream would (`None`: none fail).
    pub fn fail_chunk_calls_after(&self, calls: Option<u64>) {
        self.fail_chunks_after.store(calls.map_or(0, |calls| calls + 1), Ordering::SeqCst);
    }

    /// `Some((to, answered, failing))`: once node `to` answered `answered` snapshot chunk calls,
    /// the next `failing` calls to it fail (`u64::MAX`: all of them); `None`: none fail.
    pub fn fail_chunk_calls_to(&self, failing: Option<(u64, u64, u64)>) {
        *self.failing_sender.lock().unwrap_or_else(|e| e.into_inner()) = failing;
    }

    /// Snapshot chunk calls node `to` answered, and the bytes of pairs it sent in them.
    pub fn chunks_served_by(&self, to: u64) -> (u64, u64) {
        self.served.lock().unwrap_or_else(|e| e.into_inner()).get(&to).copied().unwrap_or_default()
    }

    /// Makes every snapshot chunk call wait `delay` before it is answered.
    pub fn delay_chunk_calls(&self, delay: std::time::Duration) {
        self.chunk_delay_us.store(delay.as_micros() as u64, Ordering::SeqCst);
    }

    /// A node that currently believes it is the leader of the added replicas' shard, if any.
    pub fn leader(&self) -> Option<u64> {
        let replicas = self.replicas.read().unwrap_or_else(|e| e.into_inner());
        replicas.iter().find(|(_, r)| r.status().role == "leader").map(|(id, _)| *id)
    }
}

impl Transport for Router {
    fn send(&self, shard: u64, messages: Vec<Message>) {
        let replicas = self.replicas.read().unwrap_or_else(|e| e.into_inner());
        if !replicas.contains_key(&messages.first().map_or(0, |m| m.from)) {
            return;
        }
        let drop_if = self.drop_if.read().unwrap_or_else(|e| e.into_inner());
        for message in messages {
            if drop_if.as_ref().is_some_and(|drop| drop(&message)) {
                continue;
            }
            if let Some(replica) = replicas.get(&message.to) {
                replica.node().step(shard, message);
            }
        }
    }

    fn fetch_snapshot_chunk(&self, to: u64, request: &ChunkRequest) -> Result<SnapshotChunk, String> {
        let call = self.chunk_calls.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_micros(self.chunk_delay_us.load(Ordering::SeqCst)));
        let after = self.fail_chunks_after.load(Ordering::SeqCst);
        if after != 0 && call + 1 >= after {
            return Err(format!("chunk call {call} fails (the test's injected failure)"));
        }
        let replicas = self.replicas.read().unwrap_or_else(|e| e.into_inner());
        if !replicas.contains_key(&request.from) {
            return Err(format!("node {} is not added", request.from));
        }
        let replica = replicas.get(&to).ok_or_else(|| format!("node {to} is not added"))?.clone();
        drop(replicas);
        let answered = self.chunks_served_by(to).0;
        if let Some((failing, calls, left)) =
            &mut *self.failing_sender.lock().unwrap_or_else(|e| e.into_inner())
            && *failing == to
            && answered >= *calls
            && *left > 0
        {
            *left -= 1;
            return Err(format!("node {to} answered {answered} chunk calls and fails this one (injected)"));
        }
        let chunk = replica.node().snapshot_chunk(request).map_err(|e| e.to_string())?;
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        let entry = served.entry(to).or_default();
        entry.0 += 1;
        entry.1 += chunk.pairs.len() as u64;
        Ok(chunk)
    }
}
