//! The checkers, each independent of the others and of how the history was made:
//!
//! - [`check_linearizable`]: every single-key history is linearizable against a register with
//!   get, put, delete and compare-and-swap (Wing & Gong's search with the memoisation Lowe and
//!   porcupine use: a linearized set and a state seen once are never explored again);
//! - [`check_no_lost_writes`]: each replica's final value of every key was written by a write that
//!   could have been the last one, so no acknowledged write was overwritten by an older one or lost;
//! - [`check_converged`]: every replica holds the same pairs.
//!
//! Our own code rather than a crate: the only Rust linearizability checkers are parts of model
//! checking frameworks (stateright) whose histories have another shape; this one is small, and the
//! real-process tests check with porcupine itself.

use crate::history::{Op, OpKind, OpResult, ValueId};
use std::collections::{BTreeMap, HashSet};

/// The register a key is: absent, or one value.
type State = Option<ValueId>;

/// A checker's verdict on one key.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Some order of the operations explains every response.
    Linearizable,
    /// No order does.
    Violation,
    /// The search gave up after its step budget.
    Inconclusive,
}

/// Applies `op` to `state`: `None` if its response is impossible from `state`, else the new state.
fn step(state: State, op: &Op) -> Option<State> {
    match (&op.kind, &op.result) {
        (OpKind::Get, None) => Some(state),
        (OpKind::Get, Some(OpResult::Get(value))) => (*value == state).then_some(state),
        (OpKind::Put(_) | OpKind::Delete | OpKind::DeleteRange { .. } | OpKind::PutExpiring { .. }, _) => {
            op.kind.blind_result()
        }
        (OpKind::Cas { expected, new }, None) => Some(if state == *expected { *new } else { state }),
        (OpKind::Cas { expected, new }, Some(OpResult::Cas { swapped, current })) => {
            if state == *expected {
                (*swapped && current == new).then_some(*new)
            } else {
                (!*swapped && *current == state).then_some(state)
            }
        }
        _ => None,
    }
}

/// One call or return in the doubly linked list the search lifts operations out of.
#[derive(Clone, Copy)]
struct Event {
    op: usize,
    is_call: bool,
    /// The other event of the same operation.
    partner: usize,
    prev: usize,
    next: usize,
}

const NONE: usize = usize::MAX;

/// Checks one key's operations (all on the same key), starting from an absent key. Operations
/// without a response may take effect at any time after their call, or never. At most `budget`
/// search steps are taken.
pub fn check_linearizable(ops: &[&Op], budget: u64) -> Verdict {
    if ops.is_empty() {
        return Verdict::Linearizable;
    }
    // Events sorted by time; a response never yet arrived sorts after everything.
    let mut order: Vec<(u64, bool, usize)> = Vec::with_capacity(ops.len() * 2);
    for (i, op) in ops.iter().enumerate() {
        order.push((op.call, true, i));
        order.push((op.ret.unwrap_or(u64::MAX), false, i));
    }
    // At equal times (only the open-ended ones), returns first: it changes nothing but keeps the
    // list well formed.
    order.sort_by_key(|&(time, is_call, op)| (time, is_call, op));
    // Node 0 is the list's head.
    let mut events = vec![Event { op: NONE, is_call: false, partner: NONE, prev: NONE, next: NONE }];
    let mut call_of = vec![NONE; ops.len()];
    let mut return_of = vec![NONE; ops.len()];
    for &(_, is_call, op) in &order {
        let index = events.len();
        events.push(Event { op, is_call, partner: NONE, prev: index - 1, next: NONE });
        events[index - 1].next = index;
        if is_call {
            call_of[op] = index;
        } else {
            return_of[op] = index;
        }
    }
    for op in 0..ops.len() {
        events[call_of[op]].partner = return_of[op];
        events[return_of[op]].partner = call_of[op];
    }

    let lift = |events: &mut Vec<Event>, call: usize| {
        for e in [call, events[call].partner] {
            let Event { prev, next, .. } = events[e];
            events[prev].next = next;
            if next != NONE {
                events[next].prev = prev;
            }
        }
    };
    let unlift = |events: &mut Vec<Event>, call: usize| {
        for e in [events[call].partner, call] {
            let Event { prev, next, .. } = events[e];
            events[prev].next = e;
            if next != NONE {
                events[next].prev = e;
            }
        }
    };

    let words = ops.len().div_ceil(64);
    let mut linearized = vec![0u64; words];
    let mut seen: HashSet<(Vec<u64>, State)> = HashSet::new();
    let mut stack: Vec<(usize, State)> = Vec::new();
    let mut state: State = None;
    let mut entry = events[0].next;
    let mut steps = 0u64;
    while events[0].next != NONE {
        steps += 1;
        if steps > budget {
            return Verdict::Inconclusive;
        }
        if entry == NONE {
            // Cannot happen: a return event always ends the walk before the list's end.
            return Verdict::Violation;
        }
        let event = events[entry];
        if event.is_call {
            if let Some(next_state) = step(state, ops[event.op]) {
                let mut next_set = linearized.clone();
                next_set[event.op / 64] |= 1 << (event.op % 64);
                if seen.insert((next_set.clone(), next_state)) {
                    stack.push((entry, state));
                    state = next_state;
                    linearized = next_set;
                    lift(&mut events, entry);
                    entry = events[0].next;
                    continue;
                }
            }
            entry = event.next;
        } else {
            // An operation returned before any order could place it: undo the last choice.
            let Some((call, previous)) = stack.pop() else {
                return Verdict::Violation;
            };
            let op = events[call].op;
            linearized[op / 64] &= !(1 << (op % 64));
            state = previous;
            unlift(&mut events, call);
            entry = events[call].next;
        }
    }
    Verdict::Linearizable
}

/// Checks every key's history; returns one message per key that is not shown linearizable.
pub fn check_history(ops: &[Op], budget: u64) -> Vec<String> {
    let mut by_key: BTreeMap<u32, Vec<&Op>> = BTreeMap::new();
    for op in ops {
        by_key.entry(op.key).or_default().push(op);
    }
    let mut problems = Vec::new();
    for (key, ops) in by_key {
        match check_linearizable(&ops, budget) {
            Verdict::Linearizable => {}
            Verdict::Violation => {
                problems.push(format!("key {key}: history of {} operations is NOT linearizable", ops.len()))
            }
            Verdict::Inconclusive => problems.push(format!(
                "key {key}: linearizability undecided after {budget} steps ({} operations)",
                ops.len()
            )),
        }
    }
    problems
}

/// The value a write leaves if it takes effect (`None` = absent), or `None` for an operation
/// that writes nothing (a read, a compare-and-swap that did not swap).
fn written(op: &Op) -> Option<State> {
    match (&op.kind, &op.result) {
        (OpKind::Put(_) | OpKind::Delete | OpKind::DeleteRange { .. } | OpKind::PutExpiring { .. }, _) => {
            op.kind.blind_result()
        }
        (OpKind::Cas { new, .. }, None) => Some(*new),
        (OpKind::Cas { new, .. }, Some(OpResult::Cas { swapped: true, .. })) => Some(*new),
        _ => None,
    }
}

/// `finals[replica][key]` is each replica's final value of every key written. A replica's value
/// must be one a write could have left last: the acknowledged write invoked last (call time `t`)
/// must not be followed by anything older, so the value comes from a write whose response came at
/// or after `t` (or never came). With no acknowledged write the key may also be absent.
pub fn check_no_lost_writes(
    ops: &[Op],
    finals: &BTreeMap<(u64, u64), BTreeMap<u32, ValueId>>,
    shard_of: &dyn Fn(u32) -> u64,
) -> Vec<String> {
    let mut by_key: BTreeMap<u32, Vec<&Op>> = BTreeMap::new();
    for op in ops.iter().filter(|op| written(op).is_some()) {
        by_key.entry(op.key).or_default().push(op);
    }
    let mut problems = Vec::new();
    for (key, writes) in by_key {
        let last_acked_call = writes.iter().filter(|op| op.acknowledged()).map(|op| op.call).max();
        let mut allowed: HashSet<State> = writes
            .iter()
            .filter(|op| last_acked_call.is_none_or(|t| op.ret.is_none_or(|ret| ret >= t)))
            .filter_map(|op| written(op))
            .collect();
        if last_acked_call.is_none() {
            allowed.insert(None);
        }
        let shard = shard_of(key);
        for ((_, node), values) in finals.range((shard, 0)..=(shard, u64::MAX)) {
            let value = values.get(&key).copied();
            if !allowed.contains(&value) {
                problems.push(format!(
                    "key {key}: the replica of shard {shard} on node {node} ends with {value:?}, which no \
                     write that could be last left (an acknowledged write was lost or overtaken by an older one)"
                ));
            }
        }
    }
    problems
}

/// Every replica of a shard must hold exactly the same pairs. `finals` is keyed by (shard, node).
pub fn check_converged(finals: &BTreeMap<(u64, u64), BTreeMap<u32, ValueId>>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut first_of_shard: BTreeMap<u64, (u64, &BTreeMap<u32, ValueId>)> = BTreeMap::new();
    for (&(shard, node), values) in finals {
        let (first_node, first) = *first_of_shard.entry(shard).or_insert((node, values));
        if values != first {
            problems.push(format!(
                "the replicas of shard {shard} on nodes {first_node} and {node} differ: {first:?} vs {values:?}"
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(client: u32, kind: OpKind, call: u64, ret: Option<u64>, result: Option<OpResult>) -> Op {
        Op { client, key: 0, kind, call, ret, result }
    }

    fn check(ops: &[Op]) -> Verdict {
        check_linearizable(&ops.iter().collect::<Vec<_>>(), 1_000_000)
    }

    #[test]
    fn sequential_history_is_linearizable_and_a_stale_read_is_not() {
        let good = [
            op(1, OpKind::Put(1), 1, Some(2), Some(OpResult::Written)),
            op(2, OpKind::Get, 3, Some(4), Some(OpResult::Get(Some(1)))),
            op(1, OpKind::Put(2), 5, Some(6), Some(OpResult::Written)),
            op(2, OpKind::Get, 7, Some(8), Some(OpResult::Get(Some(2)))),
        ];
        assert_eq!(check(&good), Verdict::Linearizable);
        let mut stale = good.clone();
        stale[3].result = Some(OpResult::Get(Some(1)));
        assert_eq!(check(&stale), Verdict::Violation);
    }

    #[test]
    fn concurrent_operations_may_take_effect_in_either_order() {
        // Two overlapping puts; reads afterwards see one of them consistently.
        let ops = [
            op(1, OpKind::Put(1), 1, Some(4), Some(OpResult::Written)),
            op(2, OpKind::Put(2), 2, Some(3), Some(OpResult::Written)),
            op(3, OpKind::Get, 5, Some(6), Some(OpResult::Get(Some(1)))),
            op(3, OpKind::Get, 7, Some(8), Some(OpResult::Get(Some(1)))),
        ];
        assert_eq!(check(&ops), Verdict::Linearizable);
        // But not flip back.
        let mut flip = ops.clone();
        flip[3].result = Some(OpResult::Get(Some(2)));
        assert_eq!(check(&flip), Verdict::Violation);
    }

    #[test]
    fn an_unanswered_write_may_happen_late_or_never() {
        let never =
            [op(1, OpKind::Put(1), 1, None, None), op(2, OpKind::Get, 2, Some(3), Some(OpResult::Get(None)))];
        assert_eq!(check(&never), Verdict::Linearizable);
        let late = [
            op(1, OpKind::Put(1), 1, None, None),
            op(2, OpKind::Get, 2, Some(3), Some(OpResult::Get(None))),
            op(2, OpKind::Get, 4, Some(5), Some(OpResult::Get(Some(1)))),
        ];
        assert_eq!(check(&late), Verdict::Linearizable);
        // Once seen it cannot be unseen.
        let mut undone = late.to_vec();
        undone.push(op(2, OpKind::Get, 6, Some(7), Some(OpResult::Get(None))));
        assert_eq!(check(&undone), Verdict::Violation);
    }

    #[test]
    fn compare_and_swap_results_are_checked() {
        let ops = [
            op(1, OpKind::Put(1), 1, Some(2), Some(OpResult::Written)),
            op(
                2,
                OpKind::Cas { expected: Some(1), new: Some(2) },
                3,
                Some(4),
                Some(OpResult::Cas { swapped: true, current: Some(2) }),
            ),
            op(
                3,
                OpKind::Cas { expected: Some(1), new: Some(3) },
                5,
                Some(6),
                Some(OpResult::Cas { swapped: false, current: Some(2) }),
            ),
        ];
        assert_eq!(check(&ops), Verdict::Linearizable);
        let mut both_swapped = ops.clone();
        both_swapped[2].result = Some(OpResult::Cas { swapped: true, current: Some(3) });
        assert_eq!(check(&both_swapped), Verdict::Violation);
    }

    #[test]
    fn lost_writes_and_divergence_are_reported() {
        let ops = vec![
            op(1, OpKind::Put(1), 1, Some(2), Some(OpResult::Written)),
            op(1, OpKind::Put(2), 3, Some(4), Some(OpResult::Written)),
            op(2, OpKind::Put(3), 5, None, None),
        ];
        // Key 0 lives in shard 7, on node 1.
        let finals = |v: Option<u32>| {
            let mut map = BTreeMap::new();
            map.insert((7, 1), v.map(|v| BTreeMap::from([(0, v)])).unwrap_or_default());
            map
        };
        let shard_of = |_key: u32| 7;
        assert!(check_no_lost_writes(&ops, &finals(Some(2)), &shard_of).is_empty());
        assert!(
            check_no_lost_writes(&ops, &finals(Some(3)), &shard_of).is_empty(),
            "the unanswered put may win"
        );
        assert_eq!(check_no_lost_writes(&ops, &finals(Some(1)), &shard_of).len(), 1, "put 2 was lost");
        assert_eq!(check_no_lost_writes(&ops, &finals(None), &shard_of).len(), 1, "everything was lost");
        // A replica of another shard does not hold the key: it is not judged on it.
        let mut other = finals(Some(2));
        other.insert((8, 2), BTreeMap::new());
        assert!(check_no_lost_writes(&ops, &other, &shard_of).is_empty());

        let mut two = finals(Some(2));
        two.insert((7, 2), BTreeMap::from([(0, 3)]));
        assert_eq!(check_converged(&two).len(), 1);
        // Replicas of different shards hold different keys and are not compared.
        let mut apart = finals(Some(2));
        apart.insert((8, 2), BTreeMap::from([(5, 3)]));
        assert!(check_converged(&apart).is_empty());
    }
}
