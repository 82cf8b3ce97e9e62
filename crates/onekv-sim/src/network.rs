//! The simulated network: Raft messages in flight with their delivery times, lost, delayed (and
//! so reordered) and duplicated at the rates the run chose, and links cut by partitions.
//!
//! Owns nothing of the nodes: [`Network::due`] hands messages back to the driver, which decides
//! whether their target is up.

use raft::eraftpb::Message;
use rand::Rng;
use rand::rngs::StdRng;
use std::collections::{BTreeMap, BTreeSet};

/// How the network misbehaves while faults are on.
#[derive(Clone, Debug)]
pub struct NetworkFaults {
    /// Messages lost, per thousand.
    pub drop_per_mille: u32,
    /// Messages delivered twice, per thousand.
    pub duplicate_per_mille: u32,
    /// Delivery takes 1 to this many milliseconds (so messages overtake each other).
    pub max_delay_ms: u64,
}

impl NetworkFaults {
    /// A network that delivers everything in one millisecond.
    pub fn reliable() -> Self {
        NetworkFaults { drop_per_mille: 0, duplicate_per_mille: 0, max_delay_ms: 1 }
    }
}

/// Messages in flight and the links that are cut.
pub struct Network {
    /// (delivery time, sequence) → (from, shard, message).
    in_flight: BTreeMap<(u64, u64), (u64, u64, Message)>,
    next_seq: u64,
    /// Directed links (from, to) that lose everything.
    cut: BTreeSet<(u64, u64)>,
    /// Messages sent, lost (by chance or a cut link) and duplicated.
    pub sent: u64,
    /// See `sent`.
    pub lost: u64,
    /// See `sent`.
    pub duplicated: u64,
    /// Snapshots sent (a follower that fell behind the leader's compacted log).
    pub snapshots: u64,
}

impl Network {
    /// An empty network with every link up.
    pub fn new() -> Self {
        Network {
            in_flight: BTreeMap::new(),
            next_seq: 0,
            cut: BTreeSet::new(),
            sent: 0,
            lost: 0,
            duplicated: 0,
            snapshots: 0,
        }
    }

    /// Sends `message` of `shard`'s group from `from` at time `now`.
    pub fn send(
        &mut self,
        now: u64,
        from: u64,
        (shard, message): (u64, Message),
        faults: &NetworkFaults,
        rng: &mut StdRng,
    ) {
        self.sent += 1;
        if message.get_msg_type() == raft::eraftpb::MessageType::MsgSnapshot {
            self.snapshots += 1;
        }
        if self.cut.contains(&(from, message.to)) || rng.random_range(0..1000) < faults.drop_per_mille {
            self.lost += 1;
            return;
        }
        if rng.random_range(0..1000) < faults.duplicate_per_mille {
            self.duplicated += 1;
            let at = now + rng.random_range(1..=faults.max_delay_ms.max(1));
            self.push(at, from, shard, message.clone());
        }
        let at = now + rng.random_range(1..=faults.max_delay_ms.max(1));
        self.push(at, from, shard, message);
    }

    fn push(&mut self, at: u64, from: u64, shard: u64, message: Message) {
        self.in_flight.insert((at, self.next_seq), (from, shard, message));
        self.next_seq += 1;
    }

    /// Removes and returns the messages due by `now`, in delivery order; those on a link cut
    /// meanwhile are lost.
    pub fn due(&mut self, now: u64) -> Vec<(u64, Message)> {
        let mut out = Vec::new();
        while let Some(entry) = self.in_flight.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let (from, shard, message) = entry.remove();
            if self.cut.contains(&(from, message.to)) {
                self.lost += 1;
            } else {
                out.push((shard, message));
            }
        }
        out
    }

    /// Cuts the link from `from` to `to` (one direction).
    pub fn cut(&mut self, from: u64, to: u64) {
        self.cut.insert((from, to));
    }

    /// Restores every link.
    pub fn heal(&mut self) {
        self.cut.clear();
    }

    /// Whether any link is cut.
    pub fn partitioned(&self) -> bool {
        !self.cut.is_empty()
    }
}

impl Default for Network {
    fn default() -> Self {
        Self::new()
    }
}
