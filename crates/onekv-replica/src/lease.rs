//! Lease reads (opt-in, [`crate::ReplicaConfig::lease_reads`]): a leader that a quorum confirmed
//! recently answers read barriers at once, at its commit index, instead of confirming its
//! leadership with a ReadIndex round for every batch of them.
//!
//! Why it is safe. A follower that hears from the leader (a heartbeat, an append) refuses to
//! vote for anyone else for `election_ticks` of its own ticks after that (raft-rs with
//! `check_quorum`), so no other leader can be elected, let alone commit, before then. A node's
//! loop keeps its ticks at least a tick apart (`node::NodeLoop::run`), so those ticks span at least
//! `election_ticks - 1` ticks of real time (the first may come at once). When a ReadIndex round the
//! leader sent at time `t` is confirmed, a quorum heard from it after `t`, so it stays the only
//! leader until at least `t` plus `election_ticks - 1` ticks. The lease ends [`MARGIN_TICKS`]
//! before that, at `t` plus `election_ticks - 1 - MARGIN_TICKS` ticks, and is judged on this node's
//! monotonic clock at the moment a read is answered, so a leader paused (before or during a turn)
//! finds it expired when it resumes.
//!
//! Two ways around the followers' refusal are closed off. A follower that restarts forgets that it
//! heard from the leader, so with lease reads on a replica refuses votes for `election_ticks` ticks
//! after it opens (`group::Group::screen_membership`). A leadership transfer makes the target
//! campaign at once and be voted for whatever the followers heard (and raft-rs acts on the transfer
//! message however late it arrives in the same term), so once this leader starts a hand-off it uses
//! no lease for the rest of its term.
//!
//! What it assumes, and the configuration documents: clocks whose rates differ by far less than
//! the margin (a tick in a lease of eight), and every node configured with the same `tick` and
//! `election_ticks`. One gap is left: raft-rs also forgets the leader when a message of a higher
//! term arrives that is neither a vote request nor from a leader (a late answer to a campaign of
//! the follower's own), after which that follower may vote at once; with pre-vote, such a term
//! exists only if the follower campaigned past a pre-vote, which it cannot do while a quorum hears
//! from the leader.
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
    valid_until: Option<Instant>,
    /// A hand-off started in this term: no lease until leadership ends.
    suspended: bool,
    /// Whether the lease answered a read since the last round was sent (only then is it renewed).
    used: bool,
    /// Judge the lease on the monotonic clock when asked (a running node), or on the turn's time
    /// (a simulation, whose time is simulated).
    real_clock: bool,
    /// The broken variant [`crate::Mutation::LeaseIgnoresTime`].
    ignores_time: bool,
    /// ReadIndex rounds sent and not yet confirmed: context → when sent.
    rounds: BTreeMap<u64, Instant>,
}

impl ReadLease {
    /// The lease of a group whose Raft clock ticks every `tick`, followers campaigning after
    /// `election_ticks` (at least [`MIN_LEASE_ELECTION_TICKS`]). `ignores_time`: the broken variant
    /// [`crate::Mutation::LeaseIgnoresTime`] (a simulation only).
    pub fn new(tick: Duration, election_ticks: usize, real_clock: bool, ignores_time: bool) -> ReadLease {
        let ticks = (election_ticks as u32).saturating_sub(1 + MARGIN_TICKS).max(1);
        ReadLease {
            length: tick * ticks,
            valid_until: None,
            suspended: false,
            used: false,
            real_clock,
            ignores_time,
            rounds: BTreeMap::new(),
        }
    }

    /// The time to judge the lease at: now, or the turn's time `turn` in a simulation.
    pub fn clock(&self, turn: Instant) -> Instant {
        if self.real_clock { Instant::now() } else { turn }
    }

    /// Whether reads may be answered at `now` without a round.
    pub fn usable(&self, now: Instant) -> bool {
        !self.suspended && self.valid_until.is_some_and(|until| now < until || self.ignores_time)
    }

    /// The lease answered a read.
    pub fn answered(&mut self) {
        self.used = true;
    }

    /// Whether a round should renew the lease at `now`: it answered reads since the last round,
    /// is usable but half spent, and no round is in flight. (An unusable lease is renewed by the
    /// round the next read sends anyway.)
    pub fn wants_renewal(&self, now: Instant) -> bool {
        self.used
            && !self.rounds.values().any(|sent| now.saturating_duration_since(*sent) < self.length)
            && self.usable(now)
            && self.valid_until.is_some_and(|until| until.saturating_duration_since(now) < self.length / 2)
    }

    /// A ReadIndex round with context `ctx` was sent at `now`. Rounds older than a lease are
    /// forgotten (raft-rs may drop one; it could no longer extend the lease anyway).
    pub fn sent(&mut self, ctx: u64, now: Instant) {
        let length = self.length;
        self.rounds.retain(|_, sent| now.saturating_duration_since(*sent) < length);
        self.rounds.insert(ctx, now);
        while self.rounds.len() > MAX_ROUNDS {
            self.rounds.pop_first();
        }
        self.used = false;
    }

    /// A quorum confirmed round `ctx`: the lease runs from when it was sent.
    pub fn confirmed(&mut self, ctx: u64) {
        if let Some(sent) = self.rounds.remove(&ctx) {
            let until = sent + self.length;
            self.valid_until = Some(self.valid_until.map_or(until, |valid| valid.max(until)));
        }
    }

    /// A leadership hand-off starts: the lease ends, and no new one is taken in this term.
    pub fn suspend(&mut self) {
        self.valid_until = None;
        self.rounds.clear();
        self.suspended = true;
    }

    /// Leadership is lost: nothing carries over to a later term.
    pub fn end(&mut self) {
        self.valid_until = None;
        self.rounds.clear();
        self.suspended = false;
        self.used = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(100);

    #[test]
    fn a_confirmed_round_leases_from_when_it_was_sent_until_before_a_follower_may_vote() {
        let start = Instant::now();
        let mut lease = ReadLease::new(TICK, 10, false, false);
        assert!(!lease.usable(start), "no lease before a round");
        lease.sent(1, start);
        lease.confirmed(1);
        assert!(lease.usable(start + Duration::from_millis(30)));
        // 10 election ticks: a follower may vote 9 ticks after its heartbeat at the earliest.
        assert!(lease.usable(start + Duration::from_millis(799)));
        assert!(!lease.usable(start + Duration::from_millis(800)));
        // Renewed only once half spent, and only if it answered reads since the last round.
        assert!(!lease.wants_renewal(start + Duration::from_millis(500)), "no read answered");
        lease.answered();
        assert!(!lease.wants_renewal(start + Duration::from_millis(300)));
        assert!(lease.wants_renewal(start + Duration::from_millis(500)));
        // A round confirmed twice, or an unknown one, extends nothing.
        lease.confirmed(1);
        lease.confirmed(7);
        assert!(!lease.usable(start + Duration::from_millis(800)));
        // A later round extends it; an earlier one confirmed late does not shorten it.
        lease.sent(2, start + Duration::from_millis(500));
        lease.answered();
        lease.sent(3, start + Duration::from_millis(510));
        lease.answered();
        assert!(!lease.wants_renewal(start + Duration::from_millis(600)), "a round is in flight");
        lease.confirmed(3);
        lease.confirmed(2);
        assert!(lease.usable(start + Duration::from_millis(1_309)));
        lease.end();
        assert!(!lease.usable(start + Duration::from_millis(600)));
    }

    #[test]
    fn a_hand_off_ends_the_lease_for_the_rest_of_the_term() {
        let start = Instant::now();
        let mut lease = ReadLease::new(TICK, 10, false, false);
        lease.sent(1, start);
        lease.suspend();
        lease.confirmed(1);
        assert!(!lease.usable(start), "a round sent before does not count");
        lease.sent(2, start + Duration::from_secs(5));
        lease.confirmed(2);
        assert!(!lease.usable(start + Duration::from_secs(5)), "not in this term");
        lease.end();
        lease.sent(3, start + Duration::from_secs(6));
        lease.confirmed(3);
        assert!(lease.usable(start + Duration::from_secs(6)), "a later term leases again");
    }

    #[test]
    fn a_round_raft_rs_dropped_does_not_hold_renewals_back() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut lease = ReadLease::new(TICK, 10, false, false);
        lease.sent(1, start);
        lease.confirmed(1);
        lease.sent(2, at(100)); // never comes back
        lease.sent(3, at(200));
        lease.confirmed(3);
        lease.answered();
        assert!(lease.usable(at(950)));
        assert!(!lease.wants_renewal(at(850)), "round 2 may still come back");
        assert!(lease.wants_renewal(at(950)), "round 2 is older than a lease: it no longer counts");
    }

    #[test]
    fn the_shortest_election_timeout_leaves_a_lease_of_one_tick() {
        let start = Instant::now();
        let mut lease = ReadLease::new(TICK, MIN_LEASE_ELECTION_TICKS, false, false);
        lease.sent(1, start);
        lease.confirmed(1);
        assert!(lease.usable(start + TICK - Duration::from_millis(1)));
        assert!(!lease.usable(start + TICK));
    }

    #[test]
    fn a_running_node_judges_the_lease_at_the_moment_it_answers() {
        let turn = Instant::now() - Duration::from_secs(1);
        assert!(ReadLease::new(TICK, 10, true, false).clock(turn) > turn + Duration::from_millis(999));
        assert_eq!(ReadLease::new(TICK, 10, false, false).clock(turn), turn);
    }
}
