//! Lease reads (opt-in, [`crate::ReplicaConfig::lease_reads`]): a leader that a quorum confirmed
//! recently answers read barriers at once, at its commit index, instead of confirming its
//! leadership with a ReadIndex round for every batch of them.
//!
//! Why it is safe. A follower that hears from the leader (a heartbeat, an append) refuses to
//! vote for anyone else for `election_ticks` of its own ticks after that (raft-rs with
//! `check_quorum`), so no other leader can be elected, let alone commit, before then. When a
//! ReadIndex round the leader sent at time `t` is confirmed, a quorum heard from it after `t`, so
//! it stays the only leader until at least `t` plus `election_ticks - 1` ticks (a follower's first
//! tick may come at once). The lease ends [`MARGIN_TICKS`] before that: it is `t` plus
//! `election_ticks - 1 - MARGIN_TICKS` ticks, measured on this node's monotonic clock, which keeps
//! running while the process is paused (a paused leader finds its lease expired when it resumes).
//!
//! What it assumes, and the configuration documents: clocks whose rates differ by far less than
//! the margin (a tick in a lease of eight); and that a follower which restarts does not vote
//! within a lease of its last heartbeat (a restarted follower forgets that it heard from the
//! leader; a restart normally takes longer than the lease, but it is not enforced). A leadership
//! transfer bypasses the followers' refusal (the target campaigns at once and is voted for), so
//! once a transfer starts the lease is suspended for two election timeouts, longer than raft-rs
//! pursues a transfer.
//!
//! This module keeps the lease's clock; the group decides when to renew it and serves the reads
//! (`group::Group::send_read_index`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Ticks of margin between the lease's end and the earliest a follower may vote again.
pub(crate) const MARGIN_TICKS: u32 = 1;

/// The fewest election ticks lease reads allow: a lease of at least one tick.
pub const MIN_LEASE_ELECTION_TICKS: usize = 3;

/// ReadIndex rounds in flight remembered at most (raft-rs may drop one silently; the oldest go).
const MAX_ROUNDS: usize = 64;

/// One group's read lease.
#[derive(Debug)]
pub(crate) struct ReadLease {
    length: Duration,
    /// How long after a hand-off starts no lease is used.
    suspension: Duration,
    valid_until: Option<Instant>,
    suspended_until: Option<Instant>,
    /// The broken variant [`crate::Mutation::LeaseIgnoresTime`].
    ignores_time: bool,
    /// ReadIndex rounds sent and not yet confirmed: context → when sent.
    rounds: BTreeMap<u64, Instant>,
}

impl ReadLease {
    /// The lease of a group whose Raft clock ticks every `tick`, followers campaigning after
    /// `election_ticks` (at least [`MIN_LEASE_ELECTION_TICKS`]). `ignores_time`: the broken variant
    /// [`crate::Mutation::LeaseIgnoresTime`] (a simulation only).
    pub fn new(tick: Duration, election_ticks: usize, ignores_time: bool) -> ReadLease {
        let election = tick * election_ticks as u32;
        let ticks = (election_ticks as u32).saturating_sub(1 + MARGIN_TICKS).max(1);
        ReadLease {
            length: tick * ticks,
            suspension: election * 2,
            valid_until: None,
            suspended_until: None,
            ignores_time,
            rounds: BTreeMap::new(),
        }
    }

    /// Whether reads may be answered now without a round.
    pub fn usable(&self, now: Instant) -> bool {
        self.valid_until.is_some_and(|until| now < until || self.ignores_time)
            && self.suspended_until.is_none_or(|until| now >= until)
    }

    /// Whether a round should renew the lease now: it is usable but half spent, and no round is
    /// in flight. (An unusable lease is renewed by the round a read then sends anyway.)
    pub fn wants_renewal(&self, now: Instant) -> bool {
        self.rounds.is_empty()
            && self.usable(now)
            && self.valid_until.is_some_and(|until| until.saturating_duration_since(now) < self.length / 2)
    }

    /// A ReadIndex round with context `ctx` was sent at `now`.
    pub fn sent(&mut self, ctx: u64, now: Instant) {
        self.rounds.insert(ctx, now);
        while self.rounds.len() > MAX_ROUNDS {
            self.rounds.pop_first();
        }
    }

    /// A quorum confirmed round `ctx`: the lease runs from when it was sent.
    pub fn confirmed(&mut self, ctx: u64) {
        if let Some(sent) = self.rounds.remove(&ctx) {
            let until = sent + self.length;
            self.valid_until = Some(self.valid_until.map_or(until, |valid| valid.max(until)));
        }
    }

    /// A leadership hand-off starts at `now`: no lease is used for two election timeouts, and the
    /// current one ends.
    pub fn suspend(&mut self, now: Instant) {
        self.valid_until = None;
        self.rounds.clear();
        let until = now + self.suspension;
        self.suspended_until = Some(self.suspended_until.map_or(until, |at| at.max(until)));
    }

    /// Leadership is lost (or not yet confirmed in a new term): nothing carries over.
    pub fn end(&mut self) {
        self.valid_until = None;
        self.rounds.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(100);

    #[test]
    fn a_confirmed_round_leases_from_when_it_was_sent_until_before_a_follower_may_vote() {
        let start = Instant::now();
        let mut lease = ReadLease::new(TICK, 10, false);
        assert!(!lease.usable(start), "no lease before a round");
        lease.sent(1, start);
        assert!(!lease.wants_renewal(start));
        let answered = start + Duration::from_millis(30);
        lease.confirmed(1);
        assert!(lease.usable(answered));
        // 10 election ticks: a follower may vote 9 ticks after its heartbeat at the earliest.
        assert!(lease.usable(start + Duration::from_millis(799)));
        assert!(!lease.usable(start + Duration::from_millis(800)));
        assert!(!lease.wants_renewal(start + Duration::from_millis(300)));
        assert!(lease.wants_renewal(start + Duration::from_millis(500)));
        // A round confirmed twice, or an unknown one, extends nothing.
        lease.confirmed(1);
        lease.confirmed(7);
        assert!(!lease.usable(start + Duration::from_millis(800)));
        // A later round extends it; an earlier one confirmed late does not shorten it.
        lease.sent(2, start + Duration::from_millis(500));
        lease.sent(3, start + Duration::from_millis(100));
        assert!(!lease.wants_renewal(start + Duration::from_millis(600)), "a round is in flight");
        lease.confirmed(2);
        lease.confirmed(3);
        assert!(lease.usable(start + Duration::from_millis(1_299)));
        lease.end();
        assert!(!lease.usable(start + Duration::from_millis(600)));
    }

    #[test]
    fn a_hand_off_suspends_the_lease_for_two_election_timeouts() {
        let start = Instant::now();
        let mut lease = ReadLease::new(TICK, 10, false);
        lease.sent(1, start);
        lease.suspend(start + Duration::from_millis(10));
        lease.confirmed(1);
        assert!(!lease.usable(start + Duration::from_millis(20)), "a round sent before does not count");
        let after = start + Duration::from_millis(10) + 2 * TICK * 10;
        lease.sent(2, after - Duration::from_millis(100));
        lease.confirmed(2);
        assert!(!lease.usable(after - Duration::from_millis(1)), "still suspended");
        assert!(lease.usable(after));
    }

    #[test]
    fn the_shortest_election_timeout_leaves_a_lease_of_one_tick() {
        let start = Instant::now();
        let mut lease = ReadLease::new(TICK, MIN_LEASE_ELECTION_TICKS, false);
        lease.sent(1, start);
        lease.confirmed(1);
        assert!(lease.usable(start + TICK - Duration::from_millis(1)));
        assert!(!lease.usable(start + TICK));
    }
}
