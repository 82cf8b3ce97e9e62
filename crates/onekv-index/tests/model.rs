//! Model-based: random writes, publishes, flushes, compactions into either layout (and layout
//! switches brought to the leveled form), clears and reopens (a crash: no WAL, so everything after
//! the last flush is lost) against `BTreeMap` models of what is written, visible and durable. After
//! every step, point and range reads must match the visible model.

use onekv_index::{Index, IndexConfig, Layout, Tree};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

#[derive(Clone, Debug)]
enum Op {
    Put(Vec<u8>, Vec<u8>),
    Remove(Vec<u8>),
    Publish,
    Flush,
    Compact(Layout),
    /// Leveled steps until one finds nothing to do (a follower's tree becoming a leader's).
    Level,
    Clear,
    Reopen,
}

/// Short keys over three bytes, so that keys are often prefixes of each other or empty.
fn any_key() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(prop_oneof![Just(0x00u8), Just(b'a'), Just(0xff)], 0..4)
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any_key(), proptest::collection::vec(any::<u8>(), 0..8)).prop_map(|(k, v)| Op::Put(k, v)),
        3 => any_key().prop_map(Op::Remove),
        3 => Just(Op::Publish),
        2 => Just(Op::Flush),
        1 => prop_oneof![Just(Layout::Leveled), (1u8..4).prop_map(Layout::Runs)].prop_map(Op::Compact),
        1 => Just(Op::Level),
        1 => Just(Op::Clear),
        1 => Just(Op::Reopen),
    ]
}

struct Model {
    written: Map,
    visible: Map,
    durable: Map,
    seqno: u64,
    flag: Option<u64>,
}

fn open(dir: &Path) -> (Index, Tree) {
    let index = Index::open(dir, IndexConfig { l0_threshold: 2, ..IndexConfig::default() }).unwrap();
    let tree = index.tree("t").unwrap();
    (index, tree)
}

fn check_reads(tree: &Tree, model: &Model, limit: usize) -> Result<(), TestCaseError> {
    let expected: Vec<_> = model.visible.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    prop_assert_eq!(tree.range(b"", None, usize::MAX, false).unwrap(), (expected.clone(), false));
    let forward = tree.range(b"", None, limit, false).unwrap();
    let n = limit.min(expected.len());
    prop_assert_eq!(forward, (expected[..n].to_vec(), expected.len() > limit));
    let mut reversed = expected.clone();
    reversed.reverse();
    let backward = tree.range(b"", None, limit, true).unwrap();
    prop_assert_eq!(backward, (reversed[..n].to_vec(), expected.len() > limit));
    // Bounded ranges starting and ending at every key of the model and a few others.
    for start in [&b""[..], b"a", b"a\xff", b"\xff"] {
        for end in [&b"a"[..], b"aa", b"\xff\xff\xff\xff"] {
            let want: Vec<_> = model
                .visible
                .range(start.to_vec()..)
                .take_while(|(k, _)| k.as_slice() < end)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let got = tree.range(start, Some(end), usize::MAX, false).unwrap();
            prop_assert_eq!(got, (want, false), "range {:?}..{:?}", start, end);
        }
    }
    for key in [&b""[..], b"a", b"aa", b"\x00", b"\xff"] {
        prop_assert_eq!(tree.get(key).unwrap(), model.visible.get(key).cloned());
    }
    prop_assert_eq!(tree.flush_flag(), model.flag);
    Ok(())
}

fn run(ops: Vec<Op>, limit: usize) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let (mut index, mut tree) = open(dir.path());
    let mut model =
        Model { written: Map::new(), visible: Map::new(), durable: Map::new(), seqno: 0, flag: None };
    let mut next_flag = 1;
    for op in ops {
        match op {
            Op::Put(k, v) => {
                model.seqno += 1;
                tree.insert(&k, &v, model.seqno);
                model.written.insert(k, v);
            }
            Op::Remove(k) => {
                model.seqno += 1;
                tree.remove(&k, model.seqno);
                model.written.remove(&k);
            }
            Op::Publish => {
                tree.publish(model.seqno);
                model.visible = model.written.clone();
            }
            Op::Flush => {
                // Seqno 0 is never valid: a flush before any write puts its flag at 1, and later
                // writes must go above it (after a reopen it is the visible seqno).
                let flag_seqno = model.seqno.max(1);
                tree.flush(next_flag, flag_seqno).unwrap();
                model.seqno = flag_seqno;
                model.flag = Some(next_flag);
                next_flag += 1;
                model.durable = model.written.clone();
            }
            Op::Compact(layout) => {
                let mut steps = 0;
                while tree.maybe_compact(layout).unwrap() {
                    steps += 1;
                    prop_assert!(steps < 50, "compacting does not end");
                }
                if let Layout::Runs(most) = layout {
                    // Settled: fewer flushed runs than S wait in L0.
                    prop_assert!(
                        tree.level0_tables() < usize::from(most),
                        "{} L0 tables",
                        tree.level0_tables()
                    );
                }
            }
            Op::Level => {
                let mut steps = 0;
                while tree.maybe_compact(Layout::Leveled).unwrap() {
                    steps += 1;
                    prop_assert!(steps < 50, "leveling does not end");
                }
                prop_assert!(tree.is_leveled());
                // l0_threshold is 2: at most one L0 table is left, and one run per deeper level.
                prop_assert!(tree.level0_tables() < 2, "{} L0 tables", tree.level0_tables());
            }
            Op::Clear => {
                model.seqno += 1;
                tree.clear(model.seqno).unwrap();
                model.written.clear();
            }
            Op::Reopen => {
                drop(tree);
                drop(index);
                (index, tree) = open(dir.path());
                model.written = model.durable.clone();
                model.visible = model.durable.clone();
            }
        }
        check_reads(&tree, &model, limit)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn matches_the_model(ops in proptest::collection::vec(any_op(), 1..40), limit in 0usize..5) {
        run(ops, limit)?;
    }
}
