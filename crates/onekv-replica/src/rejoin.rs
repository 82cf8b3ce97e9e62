//! Replicas that lost their Raft state and are rejoining their group: the guard that keeps a node
//! whose disk was wiped (or replaced) from voting with an empty log until it has caught up.
//!
//! Raft's safety rests on every voter keeping what it acknowledged, its term and its vote. A node
//! whose data directory is new may be a wiped member of a running cluster: the entries it
//! acknowledged are gone, and if it acted like a fresh member it could help elect a candidate that
//! lacks committed entries (they were on it and on the leader only), or help a deposed leader
//! commit over them, losing acknowledged writes. So a replica is *rejoining* from the moment its
//! data directory is created (or its Raft state is found empty) until it holds an entry of its
//! current leader's term at or above every commit index a leader sent it ([`Rejoin::caught_up`]):
//! everything committed before the wipe is then in its log again (a leader's log holds every
//! committed entry before its first entry of its own term). Meanwhile:
//! - **It votes only for a log as up to date as every other voter's.** It grants a vote (or
//!   pre-vote) only to a candidate whose log is at least as up to date as that of every other voter
//!   of the group, as each showed when it last asked for a vote ([`Rejoin::refuses_vote`]), and
//!   counts the votes for its own campaign only under the same rule for its own log (its vote for
//!   itself is a vote too). The leader that committed an entry with this replica's lost
//!   acknowledgement is one of those voters and still holds the entry, so the candidate does too.
//!   A majority is not enough: a wiped replica and a member that never got an entry look exactly
//!   like a new group while the member holding the data is down.
//! - **It follows no leader for a quiet period** ([`QUIET_ELECTION_TIMEOUTS`]) unless every other
//!   voter showed an empty log (a new group). Having forgotten its term, it would accept a leader
//!   deposed while it was down, whose commits could then overwrite entries a newer leader committed
//!   with its lost acknowledgement; with check-quorum, such a leader steps down within two
//!   election timeouts once it hears from no majority, and a silent replica is no majority.
//!
//! The cost is liveness where a replica cannot tell "new" from "wiped": a new group elects its
//! first leader only once all its members are up (each asks for a vote, so after one or two
//! election timeouts); a wiped replica starts catching up only after the quiet period; and a group
//! whose rejoining member is needed for a majority waits until every voter has asked for a vote
//! since, or until a leader has brought the member up to date. The quiet period's protection rests
//! on check-quorum's timing (the nodes' clocks run at about the same rate), as leader leases do.
//!
//! Two more rules let such a replica catch up at all, since raft-rs assumes no voter forgets:
//! - **A follower never commits past its own log on a heartbeat.** A heartbeat's commit index is
//!   at most what the leader knows the follower acknowledged; above the follower's last index it
//!   proves the follower lost entries it acknowledged (raft-rs panics there). The follower takes
//!   the commit only up to its last index, becomes rejoining if it was not, and answers with a
//!   rejection marked [`LOST_ENTRIES`].
//! - **The leader resets a follower that lost what it acknowledged.** On that marked rejection,
//!   if its hint lies below what the follower acknowledged (its `matched` index), the leader
//!   forgets the follower's progress and probes it from the start, so it gets the log or a
//!   snapshot. raft-rs alone ignores such a rejection as stale, and the follower never catches up.
//!   (A marked rejection delivered late or twice resets a follower that has caught up since: one
//!   wasted probe, never a safety issue, as `matched` only goes down.)
//!
//! The set of rejoining shards is kept in the data directory's `REJOINING` file (text with a
//! CRC-32C, written to a temporary name, fsynced, renamed, directory fsynced). It is written before
//! the identity file of a new directory, so no crash leaves a new directory without it; a shard is
//! removed from it once caught up. No file: no shard is rejoining unless its Raft state is empty
//! (term 0, no entries). A data directory restored from an old backup is not detected: it holds a
//! Raft state that looks current; restore onto an empty directory instead.

use crate::ReplicaError;
use crate::group::Group;
use crate::node::NodeCtx;
use raft::StateRole;
use raft::eraftpb::{Message, MessageType};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write as _;
use std::path::Path;

/// The file listing the shards still rejoining.
pub const FILE: &str = "REJOINING";
/// Its temporary name while it is rewritten.
pub const TMP_FILE: &str = "REJOINING.tmp";

/// Election timeouts a rejoining replica ignores leaders for after it starts (unless its group is
/// new): long enough for a deposed leader that still reaches it to step down (check-quorum makes a
/// leader that heard from no majority for an election timeout step down within two).
pub const QUIET_ELECTION_TIMEOUTS: u32 = 3;

/// A rejoining replica's progress: the highest commit index a leader sent it, how far the other
/// voters' logs reach, and how long it has been up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Rejoin {
    /// Highest commit index a leader's append or heartbeat carried since the replica started.
    pub target: u64,
    /// Each voter's log position, (last term, last index), as it last asked for a vote since the
    /// replica started, and the tick (of `ticks`) it was recorded at. A log's position only grows
    /// unless its disks are wiped, so requests within an election timeout of each other (the
    /// network may reorder them) keep the furthest, and a later one replaces it: a voter whose
    /// disks were wiped since must not hold the group to a log nobody has any more.
    pub positions: BTreeMap<u64, ((u64, u64), u32)>,
    /// Raft ticks since the replica started rejoining.
    pub ticks: u32,
}

impl Rejoin {
    /// Whether a vote (or pre-vote) request from `candidate`, whose log ends at `position`
    /// ((last term, last index)), must go unanswered by replica `me` of a group of `voters`. The
    /// vote may go only to a candidate whose log is at least as up to date as every other voter's
    /// was when it last asked for a vote: any entry committed with this replica's lost
    /// acknowledgement is in the log of the leader that committed it, a voter, and Raft's own
    /// argument then puts it in the candidate's log too.
    pub fn refuses_vote(
        &mut self,
        candidate: u64,
        position: (u64, u64),
        me: u64,
        voters: &[u64],
        election_ticks: usize,
    ) -> bool {
        let now = self.ticks;
        if !voters.contains(&candidate) {
            // Not a voter of this group: its vote request counts for nothing, and remembering it
            // would let any sender grow the map.
            return true;
        }
        let seen = self.positions.entry(candidate).or_insert((position, now));
        let recent = (now.saturating_sub(seen.1) as usize) < election_ticks;
        *seen = if recent { (seen.0.max(position), seen.1) } else { (position, now) };
        !self.up_to_date(position, me, voters)
    }

    /// Whether a log ending at `position` is at least as up to date as every voter's but `me`'s.
    /// Also the rule for this replica's own campaign: its vote for itself is a vote too.
    pub fn up_to_date(&self, position: (u64, u64), me: u64, voters: &[u64]) -> bool {
        voters
            .iter()
            .all(|voter| *voter == me || self.positions.get(voter).is_some_and(|(seen, _)| *seen <= position))
    }

    /// Whether replica `me` may follow a leader yet: after the quiet period
    /// ([`QUIET_ELECTION_TIMEOUTS`] of `election_ticks`), or at once in a new group (every other
    /// voter asked for a vote with an empty log: nothing was ever committed). Before, a leader
    /// deposed while this replica was down could still reach it; having forgotten the term it
    /// knew, the replica would help that leader commit over entries a newer leader committed.
    /// A replica that knows no voters (one added to a running group, perhaps again) follows at
    /// once: it waits for a snapshot, and votes for nobody. A deposed leader whose configuration
    /// still counts it as a voter was refused by its removed replica (which had voted in a newer
    /// term) for the whole removal, so check-quorum has made it step down by then.
    pub fn may_follow(&self, me: u64, voters: &[u64], election_ticks: usize) -> bool {
        let quiet = (QUIET_ELECTION_TIMEOUTS as usize).saturating_mul(election_ticks);
        self.ticks as usize >= quiet || self.up_to_date((0, 0), me, voters)
    }

    /// Notes the commit index carried by an append from the leader.
    pub fn saw_leader_commit(&mut self, commit: u64) {
        self.target = self.target.max(commit);
    }

    /// Whether the replica has caught up: its durable, committed prefix reaches `target` and ends
    /// in an entry of its current term (`committed_term == term`), written by a leader it follows.
    pub fn caught_up(&self, durable_commit: u64, committed_term: u64, term: u64) -> bool {
        self.target > 0 && durable_commit >= self.target && committed_term == term && term > 0
    }
}

/// The context of the rejection a follower sends when a heartbeat shows it lost entries it
/// acknowledged. Only such a rejection resets the follower's progress: raft-rs's own rejections
/// can arrive late or twice (the network may duplicate them) with a hint that is stale.
const LOST_ENTRIES: &[u8] = b"onekv:lost-acknowledged-entries";

impl Group {
    /// Applies the rules above to a message from a peer before Raft steps it; `None` drops it.
    pub(crate) fn screen(&mut self, mut message: Message, ctx: &NodeCtx) -> Option<Message> {
        match message.get_msg_type() {
            MessageType::MsgRequestVote | MessageType::MsgRequestPreVote => {
                let me = ctx.config.node_id;
                let voters = &crate::membership::all_voters(&self.raw.store().conf_state);
                let refuse = self.rejoin.as_mut().is_some_and(|rejoin| {
                    let position = (message.log_term, message.index);
                    rejoin.refuses_vote(message.from, position, me, voters, ctx.config.election_ticks)
                });
                if refuse && ctx.mutation != Some(crate::Mutation::VotesWhileRejoining) {
                    tracing::debug!(
                        shard = self.shard,
                        candidate = message.from,
                        "rejoining after losing the Raft log: no vote for a candidate behind another voter"
                    );
                    return None;
                }
            }
            MessageType::MsgRequestVoteResponse | MessageType::MsgRequestPreVoteResponse
                if !message.reject =>
            {
                let raft = &self.raw.raft;
                let own = (raft.raft_log.last_term(), raft.raft_log.last_index());
                let me = ctx.config.node_id;
                let voters = &crate::membership::all_voters(&self.raw.store().conf_state);
                if self.rejoin.as_ref().is_some_and(|rejoin| !rejoin.up_to_date(own, me, voters))
                    && ctx.mutation != Some(crate::Mutation::VotesWhileRejoining)
                {
                    return None;
                }
            }
            MessageType::MsgAppend | MessageType::MsgSnapshot | MessageType::MsgHeartbeat
                if !self.may_follow(ctx) =>
            {
                return None;
            }
            MessageType::MsgAppend | MessageType::MsgSnapshot => {
                if let Some(rejoin) = &mut self.rejoin {
                    let snapshot = message.get_snapshot().get_metadata().index;
                    rejoin.saw_leader_commit(message.commit.max(snapshot));
                }
            }
            MessageType::MsgHeartbeat => {
                if let Some(rejoin) = &mut self.rejoin
                    && message.term >= self.raw.raft.term
                {
                    rejoin.saw_leader_commit(message.commit);
                }
                let last = self.raw.raft.raft_log.last_index();
                // (Raft ignores a heartbeat of an older term.)
                if message.commit > last && message.term >= self.raw.raft.term {
                    tracing::warn!(
                        shard = self.shard,
                        leader = message.from,
                        leader_thinks_we_have = message.commit,
                        last_index = last,
                        "this replica lost Raft entries it acknowledged (its data was wiped or \
                         replaced): asking the leader to send them again, and voting only for \
                         a candidate as up to date as every other voter until caught up"
                    );
                    let reset = Message {
                        msg_type: MessageType::MsgAppendResponse,
                        to: message.from,
                        from: ctx.config.node_id,
                        term: message.term,
                        index: message.commit,
                        reject: true,
                        reject_hint: last,
                        context: LOST_ENTRIES.to_vec().into(),
                        ..Default::default()
                    };
                    ctx.transport.send(self.shard, vec![reset]);
                    message.commit = last;
                    if self.rejoin.is_none() {
                        self.rejoin = Some(Rejoin::default());
                        self.rejoin_changed = true;
                    }
                }
            }
            // Of this term only: one of a newer term must reach Raft, which steps down.
            MessageType::MsgAppendResponse
                if message.reject
                    && message.context[..] == *LOST_ENTRIES
                    && self.role() == StateRole::Leader
                    && message.term == self.raw.raft.term =>
            {
                let raft = &mut self.raw.raft;
                let last = raft.raft_log.last_index();
                let Some(progress) = raft.mut_prs().get_mut(message.from) else { return Some(message) };
                if message.reject_hint < progress.matched {
                    tracing::warn!(
                        shard = self.shard,
                        follower = message.from,
                        acknowledged = progress.matched,
                        has = message.reject_hint,
                        leader_last_index = last,
                        "a follower lost Raft entries it acknowledged (its data was wiped or \
                         replaced): sending it the log again from the start"
                    );
                    progress.matched = 0;
                    progress.become_probe();
                    progress.next_idx = 1;
                    raft.send_append(message.from);
                    return None;
                }
            }
            _ => {}
        }
        Some(message)
    }

    /// Whether this replica follows leaders (always, unless rejoining: [`Rejoin::may_follow`]).
    fn may_follow(&self, ctx: &NodeCtx) -> bool {
        let voters = &crate::membership::all_voters(&self.raw.store().conf_state);
        self.rejoin.as_ref().is_none_or(|rejoin| {
            ctx.mutation == Some(crate::Mutation::VotesWhileRejoining)
                || rejoin.may_follow(ctx.config.node_id, voters, ctx.config.election_ticks)
        })
    }

    /// Ends this replica's rejoining once it has caught up; returns whether `rejoin` changed
    /// since the node last wrote the rejoining file.
    pub(crate) fn update_rejoin(&mut self) -> bool {
        if let Some(rejoin) = &mut self.rejoin {
            let raft = &self.raw.raft;
            if raft.state == StateRole::Leader {
                // Elected by voters that found its log up to date: it holds what they hold.
                rejoin.saw_leader_commit(raft.raft_log.committed);
            }
            let durable_commit = raft.raft_log.committed.min(raft.raft_log.persisted);
            let committed_term = raft.raft_log.term(durable_commit).unwrap_or(0);
            if rejoin.caught_up(durable_commit, committed_term, raft.term) {
                tracing::info!(
                    shard = self.shard,
                    commit = durable_commit,
                    term = raft.term,
                    "caught up with the group: this replica votes again"
                );
                self.rejoin = None;
                self.rejoin_changed = true;
            }
        }
        std::mem::take(&mut self.rejoin_changed)
    }
}

/// The shards listed in `dir`'s rejoining file (none if there is no file).
pub(crate) fn load(dir: &Path) -> Result<BTreeSet<u64>, ReplicaError> {
    let path = dir.join(FILE);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
        Err(e) => return Err(ReplicaError::Open(format!("reading {}: {e}", path.display()))),
    };
    parse(&text).map_err(|reason| {
        ReplicaError::Open(format!("{} is damaged or not an onekv rejoining file: {reason}", path.display()))
    })
}

/// Makes `shards` the rejoining set of `dir`, durably (an empty set removes the file).
pub(crate) fn store(dir: &Path, shards: &BTreeSet<u64>) -> std::io::Result<()> {
    let path = dir.join(FILE);
    if shards.is_empty() {
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
    } else {
        let tmp = dir.join(TMP_FILE);
        let mut file = fs::File::create(&tmp)?;
        file.write_all(render(shards).as_bytes())?;
        file.sync_all()?;
        fs::rename(&tmp, &path)?;
    }
    fs::File::open(dir)?.sync_all()
}

fn render(shards: &BTreeSet<u64>) -> String {
    let list: Vec<String> = shards.iter().map(u64::to_string).collect();
    crate::identity::with_checksum(format!("onekv-rejoining=1\nshards={}\n", list.join(",")))
}

fn parse(text: &str) -> Result<BTreeSet<u64>, String> {
    let body = crate::identity::checked_body(text)?;
    let mut shards = None;
    for line in body.lines() {
        match line.split_once('=') {
            Some(("onekv-rejoining", "1")) => {}
            Some(("onekv-rejoining", v)) => return Err(format!("unsupported version {v}")),
            Some(("shards", list)) => {
                let parsed = list
                    .split(',')
                    .filter(|id| !id.is_empty())
                    .map(|id| id.parse::<u64>().map_err(|e| format!("shard id {id:?}: {e}")))
                    .collect::<Result<BTreeSet<u64>, String>>()?;
                shards = Some(parsed);
            }
            _ => return Err(format!("unexpected line {line:?}")),
        }
    }
    shards.ok_or_else(|| "no shards line".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rejoining_set_round_trips_and_an_empty_set_removes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).unwrap().is_empty());
        let shards: BTreeSet<u64> = [1, 7, 1024].into();
        store(dir.path(), &shards).unwrap();
        assert_eq!(load(dir.path()).unwrap(), shards);
        assert!(!dir.path().join(TMP_FILE).exists());
        store(dir.path(), &BTreeSet::new()).unwrap();
        assert!(!dir.path().join(FILE).exists());
        assert!(load(dir.path()).unwrap().is_empty());
        store(dir.path(), &BTreeSet::new()).unwrap();
    }

    #[test]
    fn a_damaged_rejoining_file_is_refused_not_ignored() {
        // Ignoring it would let a wiped replica vote as if it held its log.
        let dir = tempfile::tempdir().unwrap();
        store(dir.path(), &[3].into()).unwrap();
        let path = dir.path().join(FILE);
        fs::write(&path, fs::read_to_string(&path).unwrap().replace("shards=3", "shards=4")).unwrap();
        let error = load(dir.path()).unwrap_err();
        assert!(error.to_string().contains("damaged"), "{error}");
    }

    #[test]
    fn a_rejoining_replica_votes_only_for_a_log_as_up_to_date_as_every_other_voter_s() {
        let voters = [1, 2, 3];
        let mut rejoin = Rejoin::default();
        // Replica 2 rejoins; voter 3 (which may hold what 2 acknowledged) has not been heard from.
        assert!(rejoin.refuses_vote(1, (0, 0), 2, &voters, 10), "voter 3 may hold entries");
        assert!(rejoin.refuses_vote(1, (4, 90), 2, &voters, 10));
        // Voter 3 asks with a longer log of the same term: it is ahead of voter 1, so it may have
        // the vote, and voter 1 may not.
        assert!(!rejoin.refuses_vote(3, (4, 100), 2, &voters, 10));
        assert!(rejoin.refuses_vote(1, (4, 95), 2, &voters, 10), "behind voter 3");
        // A new group, whose first leader appended an entry and died before committing it: once
        // every other voter asked, the furthest of them can have the vote.
        let mut new_group = Rejoin::default();
        assert!(new_group.refuses_vote(1, (0, 0), 2, &voters, 10));
        assert!(!new_group.refuses_vote(3, (1, 1), 2, &voters, 10));
        assert!(new_group.refuses_vote(1, (0, 0), 2, &voters, 10), "behind voter 3");
        // A later last term is more up to date than a longer log.
        let mut rejoin = Rejoin::default();
        rejoin.refuses_vote(3, (4, 100), 2, &voters, 10);
        assert!(!rejoin.refuses_vote(1, (5, 10), 2, &voters, 10));
        assert!(rejoin.refuses_vote(3, (4, 100), 2, &voters, 10), "3 is now behind 1");
        // Within an election timeout a request showing less is taken as a late one: the furthest
        // stays. Later, it replaces the furthest (the voter's disks were wiped).
        rejoin.ticks += 9;
        assert!(rejoin.refuses_vote(1, (0, 0), 2, &voters, 10));
        assert_eq!(rejoin.positions[&1].0, (5, 10));
        rejoin.ticks += 1;
        assert!(rejoin.refuses_vote(1, (0, 0), 2, &voters, 10));
        assert_eq!(rejoin.positions[&1].0, (0, 0));
        assert!(!rejoin.refuses_vote(3, (4, 100), 2, &voters, 10), "voter 1 lost its log");
        // A node that is not a voter gets no vote and is not remembered.
        assert!(rejoin.refuses_vote(9, (99, 999), 2, &voters, 10));
        assert!(!rejoin.positions.contains_key(&9));
    }

    #[test]
    fn a_rejoining_replica_is_caught_up_at_a_commit_of_its_leader_s_term() {
        let mut rejoin = Rejoin::default();
        // No leader heard from yet: not caught up, whatever the log holds.
        assert!(!rejoin.caught_up(50, 3, 3));
        rejoin.saw_leader_commit(40);
        rejoin.saw_leader_commit(30);
        assert_eq!(rejoin.target, 40);
        assert!(!rejoin.caught_up(39, 3, 3), "below the leader's commit index");
        assert!(!rejoin.caught_up(45, 2, 3), "the commit point is not of the leader's term");
        assert!(rejoin.caught_up(40, 3, 3));
    }
}
