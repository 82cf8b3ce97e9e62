//! Changing a shard's members: the change a caller asks for, checked against the group's current
//! configuration and turned into one raft-rs conf change (`ConfChangeV2`, joint consensus when it
//! changes more than one voter), and the members a committed conf change leads to.
//!
//! A shard's members change one step at a time, each step one Raft entry: add a learner (it starts
//! from a snapshot, which carries the members, then follows the log; it does not vote), then promote it and remove an old voter in one step
//! (a joint configuration: both the old and the new voters must agree until the leader, on its
//! own, leaves it with a second entry). The members are part of the replicated state: every
//! replica applies the same entries in the same order, so they agree on the members at every
//! index; recovery replays conf changes like any other entry ([`next_members`]).
//!
//! Safety rules kept here, so a caller cannot break them by asking:
//! - one change at a time (none while an earlier one is not applied, or while joint);
//! - a voter is promoted only from a learner that has nearly all of the log, so the group never
//!   waits for a new voter to catch up before it can commit;
//! - the leader never removes itself (leadership is transferred first), and a change never
//!   leaves a shard without voters.
//!
//! It does not own carrying out a whole move (the cluster operations do that, step by step) or
//! creating and dropping a shard's replica on a node.

use crate::ReplicaError;
use raft::eraftpb::{
    ConfChange, ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState, Entry,
    EntryType,
};
use std::collections::BTreeSet;

/// A learner is promoted only once it has the leader's log up to at most this many entries below
/// the commit index: a new voter that is far behind would make the group wait for it (in a group
/// of 2 voters growing to 3, every commit would).
pub const MAX_PROMOTION_LAG: u64 = 1024;

/// The context of the message that hands a shard's leadership to a voter on request
/// (`Replica::transfer_leadership`): the voter takes itself as the shard's preferred leader.
pub(crate) const REQUESTED_TRANSFER: &[u8] = b"onekv:requested-transfer";

/// One step of a change to a shard's members.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MembershipChange {
    /// Nodes that join as learners: they receive the log (or a snapshot) and do not vote.
    pub add_learners: Vec<u64>,
    /// Learners that become voters (each must have caught up, see [`MAX_PROMOTION_LAG`]).
    pub promote: Vec<u64>,
    /// Members (voters or learners) that leave the group. Never the leader itself: transfer
    /// leadership first.
    pub remove: Vec<u64>,
}

/// A shard's members at one index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Members {
    /// Voting members (of the new configuration while joint).
    pub voters: Vec<u64>,
    /// Non-voting members.
    pub learners: Vec<u64>,
    /// While the group is in a joint configuration: the old configuration's voters, who must
    /// agree too until the leader leaves it. Empty otherwise.
    pub outgoing_voters: Vec<u64>,
}

impl Members {
    /// Whether `node` is a member in any role.
    pub fn contains(&self, node: u64) -> bool {
        self.voters.contains(&node) || self.learners.contains(&node) || self.outgoing_voters.contains(&node)
    }

    /// Whether the group is between two configurations.
    pub fn is_joint(&self) -> bool {
        !self.outgoing_voters.is_empty()
    }
}

impl crate::ReplicaStatus {
    /// The shard's members as this replica knows them.
    pub fn members(&self) -> Members {
        Members {
            voters: self.voters.clone(),
            learners: self.learners.clone(),
            outgoing_voters: self.outgoing_voters.clone(),
        }
    }
}

impl From<&ConfState> for Members {
    fn from(state: &ConfState) -> Self {
        let sorted = |ids: &[u64]| {
            let mut ids = ids.to_vec();
            ids.sort_unstable();
            ids
        };
        // Voters demoted on leaving a joint configuration are learners-to-be, still voting on the
        // outgoing side: listed there only.
        Members {
            voters: sorted(&state.voters),
            learners: sorted(&state.learners),
            outgoing_voters: sorted(&state.voters_outgoing),
        }
    }
}

/// Whether `state` has no members at all (a replica that waits to be added to its shard).
pub(crate) fn is_empty(state: &ConfState) -> bool {
    state.voters.is_empty() && state.learners.is_empty() && state.voters_outgoing.is_empty()
}

/// Whether `node` is a member of `state` in any role.
pub(crate) fn is_member(state: &ConfState, node: u64) -> bool {
    state.voters.iter().chain(&state.learners).chain(&state.voters_outgoing).any(|&id| id == node)
}

/// Every voter of `state`, of both halves of a joint configuration, in order.
pub(crate) fn all_voters(state: &ConfState) -> Vec<u64> {
    let all: BTreeSet<u64> = state.voters.iter().chain(&state.voters_outgoing).copied().collect();
    all.into_iter().collect()
}

/// What the leader of a group knows when it is asked for a change.
pub(crate) struct LeaderView<'a> {
    /// This node (the leader).
    pub me: u64,
    pub members: &'a ConfState,
    /// A conf change is appended but not yet applied.
    pub change_pending: bool,
    pub commit: u64,
    /// The highest index each member is known to hold.
    pub matched: &'a dyn Fn(u64) -> Option<u64>,
}

/// Checks `change` against the group's current members and turns it into one conf change: a
/// simple one when it changes at most one voter, else a joint one the leader leaves on its own.
pub(crate) fn conf_change(
    change: &MembershipChange,
    view: &LeaderView<'_>,
) -> Result<ConfChangeV2, ReplicaError> {
    let bad = |reason: String| Err(ReplicaError::InvalidArgument(reason));
    let members = Members::from(view.members);
    if view.change_pending {
        return Err(ReplicaError::Dropped(
            "an earlier membership change is not applied yet: try again once it is".into(),
        ));
    }
    if members.is_joint() {
        return Err(ReplicaError::Dropped(
            "the shard is between two configurations (joint): try again once the leader has left it".into(),
        ));
    }
    let named: Vec<u64> =
        change.add_learners.iter().chain(&change.promote).chain(&change.remove).copied().collect();
    if named.is_empty() {
        return bad("the membership change names no node".into());
    }
    if named.contains(&0) {
        return bad("node id 0 is not a node".into());
    }
    if named.iter().collect::<BTreeSet<_>>().len() != named.len() {
        return bad("a node may appear only once in a membership change".into());
    }
    for &node in &change.add_learners {
        if members.contains(node) {
            return bad(format!("node {node} is already a member of the shard"));
        }
    }
    for &node in &change.promote {
        if !members.learners.contains(&node) {
            return bad(format!("node {node} is not a learner of the shard: add it as a learner first"));
        }
        let matched = (view.matched)(node).unwrap_or(0);
        if matched + MAX_PROMOTION_LAG < view.commit {
            return Err(ReplicaError::Dropped(format!(
                "node {node} is still catching up (it holds entries up to {matched}, the shard has committed {}): \
                 try again once it has caught up",
                view.commit
            )));
        }
    }
    for &node in &change.remove {
        if !members.contains(node) {
            return bad(format!("node {node} is not a member of the shard"));
        }
        if node == view.me {
            return bad(format!("node {node} leads the shard: transfer leadership to another voter first"));
        }
    }
    let voters_after =
        members.voters.iter().filter(|v| !change.remove.contains(v)).count() + change.promote.len();
    if voters_after == 0 {
        return bad("the change would leave the shard without voters".into());
    }
    let single = |id: u64, kind: ConfChangeType| ConfChangeSingle {
        change_type: kind,
        node_id: id,
        ..Default::default()
    };
    let changes: Vec<ConfChangeSingle> = change
        .add_learners
        .iter()
        .map(|&id| single(id, ConfChangeType::AddLearnerNode))
        .chain(change.promote.iter().map(|&id| single(id, ConfChangeType::AddNode)))
        .chain(change.remove.iter().map(|&id| single(id, ConfChangeType::RemoveNode)))
        .collect();
    // One change: a simple one is safe (any majorities of the old and new voters overlap). More:
    // raft-rs makes them one joint configuration under `Auto`, which the leader leaves on its own
    // once it is applied.
    let mut cc = ConfChangeV2 { changes: changes.into(), ..Default::default() };
    cc.set_transition(ConfChangeTransition::Auto);
    Ok(cc)
}

/// The conf change a committed entry carries, if it is one (a conf change with no data is the
/// leader leaving a joint configuration).
pub(crate) fn decoded_conf_change(entry: &Entry) -> Result<Option<ConfChangeV2>, ReplicaError> {
    use protobuf::Message as _;
    let bad = |e: protobuf::ProtobufError| {
        ReplicaError::Storage(format!(
            "committed entry {} holds a conf change that does not decode: {e}",
            entry.index
        ))
    };
    match entry.get_entry_type() {
        EntryType::EntryNormal => Ok(None),
        EntryType::EntryConfChange => {
            let mut cc = ConfChange::default();
            cc.merge_from_bytes(&entry.data).map_err(bad)?;
            // onekv proposes only V2 changes; a V1 change is one simple change.
            let single = ConfChangeSingle {
                change_type: cc.get_change_type(),
                node_id: cc.node_id,
                ..Default::default()
            };
            Ok(Some(ConfChangeV2 { changes: vec![single].into(), context: cc.context, ..Default::default() }))
        }
        EntryType::EntryConfChangeV2 => {
            let mut cc = ConfChangeV2::default();
            cc.merge_from_bytes(&entry.data).map_err(bad)?;
            Ok(Some(cc))
        }
    }
}

/// The members after `cc` is applied to a group whose members are `current`, computed the way a
/// running replica's raft-rs computes them (recovery replays conf changes with this). An error
/// is a change raft-rs refuses to apply: every replica refuses it alike and keeps its members.
pub(crate) fn next_members(current: &ConfState, cc: &ConfChangeV2) -> raft::Result<ConfState> {
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let storage = raft::storage::MemStorage::new_with_conf_state(current.clone());
    // Any id: the node's own role plays no part in computing the configuration.
    let mut raft = raft::Raft::new(&raft::Config::new(u64::MAX), storage, &logger)?;
    raft.apply_conf_change(cc)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(voters: &[u64], learners: &[u64]) -> ConfState {
        ConfState { voters: voters.to_vec(), learners: learners.to_vec(), ..Default::default() }
    }

    fn check(
        change: MembershipChange,
        state: &ConfState,
        matched: u64,
    ) -> Result<ConfChangeV2, ReplicaError> {
        let matched = move |_| Some(matched);
        conf_change(
            &change,
            &LeaderView { me: 1, members: state, change_pending: false, commit: 5000, matched: &matched },
        )
    }

    #[test]
    fn a_learner_joins_then_replaces_a_voter_through_a_joint_configuration_that_is_left() {
        let start = members(&[1, 2, 3], &[]);
        let add = check(MembershipChange { add_learners: vec![4], ..Default::default() }, &start, 0).unwrap();
        let learning = next_members(&start, &add).unwrap();
        assert_eq!(
            Members::from(&learning),
            Members { voters: vec![1, 2, 3], learners: vec![4], outgoing_voters: vec![] }
        );

        let swap = MembershipChange { promote: vec![4], remove: vec![3], ..Default::default() };
        let cc = check(swap, &learning, 5000).unwrap();
        let joint = next_members(&learning, &cc).unwrap();
        let joint_members = Members::from(&joint);
        assert_eq!(joint_members.voters, vec![1, 2, 4]);
        assert_eq!(joint_members.outgoing_voters, vec![1, 2, 3]);
        assert!(joint.auto_leave, "the leader leaves the joint configuration on its own");
        assert_eq!(all_voters(&joint), vec![1, 2, 3, 4]);
        // No further change while joint.
        let more = check(MembershipChange { add_learners: vec![5], ..Default::default() }, &joint, 0);
        assert!(matches!(more, Err(ReplicaError::Dropped(_))), "{more:?}");

        let left = next_members(&joint, &ConfChangeV2::default()).unwrap();
        assert_eq!(
            Members::from(&left),
            Members { voters: vec![1, 2, 4], learners: vec![], outgoing_voters: vec![] }
        );
    }

    #[test]
    fn changes_that_would_break_the_group_are_refused_with_a_reason() {
        let start = members(&[1, 2, 3], &[4]);
        let refused = |change: MembershipChange, matched: u64| {
            let error = check(change, &start, matched).unwrap_err().to_string();
            assert!(!error.is_empty());
            error
        };
        assert!(refused(MembershipChange::default(), 0).contains("names no node"));
        assert!(
            refused(MembershipChange { add_learners: vec![2], ..Default::default() }, 0)
                .contains("already a member")
        );
        assert!(
            refused(MembershipChange { promote: vec![5], ..Default::default() }, 9999)
                .contains("not a learner")
        );
        assert!(
            refused(MembershipChange { promote: vec![4], ..Default::default() }, 10).contains("catching up")
        );
        assert!(
            refused(MembershipChange { remove: vec![1], ..Default::default() }, 0)
                .contains("transfer leadership")
        );
        assert!(
            refused(MembershipChange { remove: vec![9], ..Default::default() }, 0).contains("not a member")
        );
        assert!(
            refused(MembershipChange { promote: vec![4], remove: vec![4], ..Default::default() }, 9999)
                .contains("only once")
        );
        assert!(
            refused(MembershipChange { add_learners: vec![0], ..Default::default() }, 0).contains("id 0")
        );
        let lone = members(&[1, 2], &[]);
        let matched = |_| Some(0);
        let view = LeaderView { me: 1, members: &lone, change_pending: true, commit: 1, matched: &matched };
        let pending = conf_change(&MembershipChange { remove: vec![2], ..Default::default() }, &view);
        assert!(pending.unwrap_err().to_string().contains("not applied yet"));
    }

    #[test]
    fn a_removed_learner_and_a_removed_voter_leave_simply() {
        let start = members(&[1, 2, 3], &[4]);
        let cc = check(MembershipChange { remove: vec![4], ..Default::default() }, &start, 0).unwrap();
        assert_eq!(cc.enter_joint(), None, "one change, no voter: simple");
        assert_eq!(Members::from(&next_members(&start, &cc).unwrap()).learners, Vec::<u64>::new());
        let cc = check(MembershipChange { remove: vec![3], ..Default::default() }, &start, 0).unwrap();
        assert_eq!(cc.enter_joint(), None, "one voter: simple");
        assert_eq!(next_members(&start, &cc).unwrap().voters.len(), 2);
    }

    #[test]
    fn conf_change_entries_decode_and_other_entries_are_not_conf_changes() {
        use protobuf::Message as _;
        let cc =
            check(MembershipChange { add_learners: vec![7], ..Default::default() }, &members(&[1], &[]), 0)
                .unwrap();
        let mut entry = Entry { index: 3, data: cc.write_to_bytes().unwrap().into(), ..Default::default() };
        entry.set_entry_type(EntryType::EntryConfChangeV2);
        assert_eq!(decoded_conf_change(&entry).unwrap(), Some(cc));
        entry.data = vec![0xff, 0xff, 0xff].into();
        assert!(decoded_conf_change(&entry).is_err());
        entry.set_entry_type(EntryType::EntryNormal);
        assert_eq!(decoded_conf_change(&entry).unwrap(), None);
    }
}
