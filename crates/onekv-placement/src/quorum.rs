//! How many of a shard's voters the fast path needs (`docs/design/fast-path.md`): the one statement
//! of the rule, shared by the replicas (which answer and recover by it) and the client (which counts
//! a fast write done by it).
//!
//! A fast write is done once a *supermajority* of the `n` voters made it durable in one term, the
//! leader among them. A new leader gathers the pending writes of a Raft majority (`m` voters, itself
//! included) and keeps every write at least `k` of them hold. Two things must hold for that to find
//! every write that completed and nothing contradictory:
//!
//! - a done write is on at least `k` of any majority: `q + m - n >= k`;
//! - two writes held by `k` each of the same majority share a voter: `2k > m` (a voter never holds
//!   two pending writes of one key when `q < n`, so the writes a new leader keeps never conflict, and
//!   any order of them is linearizable).
//!
//! The smallest `q` for which both hold is `n - ceil(m / 2) + 1`, with `k = floor(m / 2) + 1`:
//! 3 of 3, 3 of 4, 4 of 5 (Skyros's `ceil(3f/2) + 1` for `n = 2f + 1`), 5 of 6, 6 of 7. When `q = n`
//! every voter holds every done write, so the new leader's own pending writes are all of them, and
//! in an order that respects real time: no gather is needed.

/// A Raft majority of `voters`.
pub fn majority(voters: usize) -> usize {
    voters / 2 + 1
}

/// How many of `voters` must hold a fast write, in one term and the leader among them, for it to be
/// done (0 for none: a replica that knows no voters yet).
pub fn fast_quorum(voters: usize) -> usize {
    (voters + 1).saturating_sub(majority(voters).div_ceil(2)).min(voters)
}

/// How many of a majority's gathered pending sets must hold a write for a new leader to keep it.
pub fn fast_recovery_threshold(voters: usize) -> usize {
    majority(voters) / 2 + 1
}

/// Whether a new leader must gather pending writes from a majority (some done write may be missing
/// from its own set): when the fast quorum is not every voter.
pub fn fast_needs_gather(voters: usize) -> bool {
    fast_quorum(voters) < voters
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quorums_are_skyros_supermajorities_and_meet_both_conditions() {
        let q: Vec<usize> = (1..=9).map(fast_quorum).collect();
        assert_eq!(q, [1, 2, 3, 3, 4, 5, 6, 6, 7]);
        for n in 1..=64 {
            let (m, q, k) = (majority(n), fast_quorum(n), fast_recovery_threshold(n));
            assert!(q <= n && k <= m, "n = {n}");
            assert!(q + m - n >= k, "a done write is on k of any majority (n = {n})");
            assert!(2 * k > m, "two kept writes share a voter (n = {n})");
            // The smallest such q: one fewer breaks the first condition.
            assert!(q == 1 || (q - 1) + m - n < k, "n = {n}");
            if n % 2 == 1 && n > 1 {
                let f = (n - 1) / 2;
                assert!(q <= (3 * f).div_ceil(2) + 1, "no more than Skyros's (n = {n})");
            }
        }
        assert!(!fast_needs_gather(3) && fast_needs_gather(4) && fast_needs_gather(5));
        // A replica that knows no voters yet (added, not caught up) asks without panicking.
        assert_eq!(fast_quorum(0), 0);
        assert!(!fast_needs_gather(0));
    }
}
