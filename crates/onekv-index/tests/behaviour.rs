//! The API contract of `Index` and `Tree`: reads, visibility, flush flags, reopen, clear, limits.

use onekv_index::{Index, IndexConfig, IndexError, Layout, MAX_KEY_LEN, Tree};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

fn open(dir: &Path) -> Index {
    Index::open(dir, IndexConfig { l0_threshold: 2, ..IndexConfig::default() }).unwrap()
}

fn pairs(items: &[(&[u8], &[u8])]) -> Pairs {
    items.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect()
}

fn get(tree: &Tree, key: &[u8]) -> Option<Vec<u8>> {
    tree.get(key).unwrap()
}

/// Keys chosen to trip up prefix handling: empty, prefixes of each other, 0x00 and 0xFF bytes.
const KEYS: [&[u8]; 7] = [b"", b"\x00", b"a", b"ab", b"abc", b"b", b"\xff\xff"];

fn tree_with_keys(tree: &Tree) {
    for (i, key) in KEYS.iter().enumerate() {
        tree.insert(key, &[i as u8], 1 + i as u64);
    }
    tree.publish(KEYS.len() as u64);
}

#[test]
fn get_and_remove_with_awkward_keys() {
    let dir = tempfile::tempdir().unwrap();
    let index = open(dir.path());
    let tree = index.tree("shard-1").unwrap();
    tree_with_keys(&tree);
    for (i, key) in KEYS.iter().enumerate() {
        assert_eq!(get(&tree, key), Some(vec![i as u8]), "key {key:?}");
    }
    assert_eq!(get(&tree, b"abcd"), None);
    assert_eq!(get(&tree, b"\xff"), None);

    tree.remove(b"ab", 10);
    tree.remove(b"", 10);
    tree.insert(b"a", b"new", 11);
    tree.publish(11);
    assert_eq!(get(&tree, b"ab"), None);
    assert_eq!(get(&tree, b""), None);
    assert_eq!(get(&tree, b"abc"), Some(vec![4]));
    assert_eq!(get(&tree, b"a"), Some(b"new".to_vec()));
}

#[test]
fn range_bounds_limits_and_direction() {
    let dir = tempfile::tempdir().unwrap();
    let index = open(dir.path());
    let tree = index.tree("t").unwrap();
    tree_with_keys(&tree);
    let all: Pairs = KEYS.iter().enumerate().map(|(i, k)| (k.to_vec(), vec![i as u8])).collect();

    assert_eq!(tree.range(b"", None, 100, false).unwrap(), (all.clone(), false));
    let mut reversed = all.clone();
    reversed.reverse();
    assert_eq!(tree.range(b"", None, 100, true).unwrap(), (reversed, false));

    // Exact limit: nothing more remains.
    assert_eq!(tree.range(b"", None, all.len(), false).unwrap(), (all.clone(), false));
    // Limit cuts: `more` is set, and reverse takes from the end.
    assert_eq!(tree.range(b"", None, 2, false).unwrap(), (all[..2].to_vec(), true));
    assert_eq!(tree.range(b"", None, 2, true).unwrap(), (pairs(&[(b"\xff\xff", &[6]), (b"b", &[5])]), true));
    assert_eq!(tree.range(b"", None, 0, false).unwrap(), (vec![], true));

    // Start inclusive, end exclusive; prefixes of each other.
    assert_eq!(
        tree.range(b"a", Some(b"abc"), 10, false).unwrap(),
        (pairs(&[(b"a", &[2]), (b"ab", &[3])]), false)
    );
    assert_eq!(tree.range(b"a", Some(b"abc"), 1, true).unwrap(), (pairs(&[(b"ab", &[3])]), true));
    assert_eq!(
        tree.range(b"ab", Some(b"b"), 10, true).unwrap(),
        (pairs(&[(b"abc", &[4]), (b"ab", &[3])]), false)
    );
    assert_eq!(tree.range(b"\xff", None, 10, false).unwrap(), (pairs(&[(b"\xff\xff", &[6])]), false));
    // Empty and inverted ranges.
    assert_eq!(tree.range(b"b", Some(b"b"), 10, false).unwrap(), (vec![], false));
    assert_eq!(tree.range(b"c", Some(b"a"), 10, false).unwrap(), (vec![], false));
    assert_eq!(tree.range(b"c", Some(b"d"), 10, false).unwrap(), (vec![], false));
    // Tombstones are skipped, also across a flush.
    tree.remove(b"a", 20);
    tree.remove(b"abc", 20);
    tree.publish(20);
    tree.flush(1, 20).unwrap();
    tree.remove(b"b", 21);
    tree.publish(21);
    assert_eq!(
        tree.range(b"", None, 10, false).unwrap(),
        (pairs(&[(b"", &[0]), (b"\x00", &[1]), (b"ab", &[3]), (b"\xff\xff", &[6])]), false)
    );
}

#[test]
fn writes_stay_invisible_until_published() {
    let dir = tempfile::tempdir().unwrap();
    let index = open(dir.path());
    let tree = index.tree("t").unwrap();
    assert_eq!(tree.visible_seqno(), 0);
    tree.insert(b"a", b"1", 5);
    tree.insert(b"b", b"1", 6);
    assert_eq!(get(&tree, b"a"), None);
    assert_eq!(tree.range(b"", None, 10, false).unwrap(), (vec![], false));
    tree.publish(5);
    assert_eq!(tree.visible_seqno(), 5);
    assert_eq!(get(&tree, b"a"), Some(b"1".to_vec()));
    assert_eq!(get(&tree, b"b"), None, "seqno 6 is above the published 5");
    tree.insert(b"a", b"2", 7);
    tree.remove(b"b", 7);
    assert_eq!(get(&tree, b"a"), Some(b"1".to_vec()));
    // A flush does not publish.
    tree.flush(3, 7).unwrap();
    assert_eq!(get(&tree, b"a"), Some(b"1".to_vec()));
    tree.publish(6);
    assert_eq!(get(&tree, b"b"), Some(b"1".to_vec()));
    tree.publish(7);
    assert_eq!(tree.range(b"", None, 10, false).unwrap(), (pairs(&[(b"a", b"2")]), false));
    tree.publish(2);
    assert_eq!(tree.visible_seqno(), 7, "publish never goes back");
}

#[test]
fn flush_flag_survives_reopen_and_unflushed_writes_do_not() {
    let dir = tempfile::tempdir().unwrap();
    {
        let index = open(dir.path());
        let tree = index.tree("shard-1").unwrap();
        assert_eq!(tree.flush_flag(), None);
        tree.insert(b"kept", b"v", 10);
        tree.publish(10);
        tree.flush(7, 10).unwrap();
        assert_eq!(tree.flush_flag(), Some(7));
        tree.insert(b"lost", b"v", 11);
        tree.remove(b"kept", 12);
        tree.publish(12);
        assert_eq!(get(&tree, b"kept"), None);
        // Dropped without a flush: a crash as far as the tree knows (it has no WAL).
    }
    let index = open(dir.path());
    let tree = index.tree("shard-1").unwrap();
    assert_eq!(tree.flush_flag(), Some(7));
    assert_eq!(tree.visible_seqno(), 10, "everything durable is visible after open");
    assert_eq!(get(&tree, b"kept"), Some(b"v".to_vec()));
    assert_eq!(get(&tree, b"lost"), None);

    // Replay continues from the flag's seqno; new writes are visible once published.
    tree.insert(b"lost", b"replayed", 11);
    tree.remove(b"kept", 12);
    tree.publish(12);
    assert_eq!(get(&tree, b"lost"), Some(b"replayed".to_vec()));
    assert_eq!(get(&tree, b"kept"), None);
    tree.flush(9, 12).unwrap();
    drop(tree);
    drop(index);

    let index = open(dir.path());
    let tree = index.tree("shard-1").unwrap();
    assert_eq!(tree.flush_flag(), Some(9));
    assert_eq!(tree.range(b"", None, 10, false).unwrap(), (pairs(&[(b"lost", b"replayed")]), false));
    assert_eq!(index.tree("never-flushed").unwrap().flush_flag(), None);
}

#[test]
fn a_note_flushed_with_the_flag_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let index = open(dir.path());
        let tree = index.tree("shard-1").unwrap();
        assert_eq!(tree.flush_note(), None);
        tree.insert(b"k", b"v", 10);
        tree.publish(10);
        tree.flush_with_note(4, 10, b"scan from here").unwrap();
        assert_eq!(tree.flush_note().as_deref(), Some(&b"scan from here"[..]));
    }
    {
        let index = open(dir.path());
        let tree = index.tree("shard-1").unwrap();
        assert_eq!(tree.flush_flag(), Some(4));
        assert_eq!(tree.flush_note().as_deref(), Some(&b"scan from here"[..]));
        tree.flush(5, 10).unwrap();
    }
    let index = open(dir.path());
    let tree = index.tree("shard-1").unwrap();
    assert_eq!((tree.flush_flag(), tree.flush_note()), (Some(5), Some(Vec::new())));
}

#[test]
fn flushing_an_empty_memtable_records_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    {
        let index = open(dir.path());
        let tree = index.tree("t").unwrap();
        tree.flush(3, 1).unwrap();
        assert_eq!(tree.flush_flag(), Some(3));
        tree.flush(4, 1).unwrap();
        assert_eq!(tree.memtable_bytes(), 0);
    }
    let index = open(dir.path());
    let tree = index.tree("t").unwrap();
    assert_eq!(tree.flush_flag(), Some(4));
    assert_eq!(tree.range(b"", None, 10, false).unwrap(), (vec![], false), "the flag is no user key");
}

#[test]
fn flush_rejects_going_back() {
    let dir = tempfile::tempdir().unwrap();
    let index = open(dir.path());
    let tree = index.tree("t").unwrap();
    tree.insert(b"a", b"1", 10);
    assert!(matches!(tree.flush(1, 9), Err(IndexError::InvalidSeqno { seqno: 9, .. })));
    assert!(matches!(tree.flush(1, 0), Err(IndexError::InvalidSeqno { .. })));
    assert!(matches!(tree.flush(1, 1 << 63), Err(IndexError::InvalidSeqno { .. })));
    tree.flush(5, 10).unwrap();
    assert!(matches!(
        tree.flush(4, 10),
        Err(IndexError::FlushFlagRegressed { current: 5, requested: 4, .. })
    ));
    assert_eq!(tree.flush_flag(), Some(5));
    // Rejections did not stop the tree.
    tree.flush(6, 10).unwrap();
    assert_eq!(tree.flush_flag(), Some(6));
}

#[test]
fn broken_write_contracts_panic_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let index = open(dir.path());
    let tree = index.tree("t").unwrap();
    tree.insert(b"a", b"1", 10);
    tree.publish(10);
    let message = |f: &dyn Fn()| {
        let payload = catch_unwind(AssertUnwindSafe(f)).expect_err("should panic");
        payload.downcast_ref::<String>().cloned().unwrap_or_default()
    };
    assert!(message(&|| tree.insert(b"b", b"1", 9)).contains("below seqno 10"));
    assert!(message(&|| tree.insert(b"b", b"1", 10)).contains("not above the visible seqno 10"));
    assert!(message(&|| tree.remove(b"b", 0)).contains("outside"));
    assert!(message(&|| tree.insert(&vec![0; MAX_KEY_LEN + 1], b"", 11)).contains("MAX_KEY_LEN"));
    // The tree still works, and the longest key fits.
    tree.insert(&vec![7; MAX_KEY_LEN], b"long", 11);
    tree.publish(11);
    assert_eq!(get(&tree, &vec![7; MAX_KEY_LEN]), Some(b"long".to_vec()));
    tree.flush(1, 11).unwrap();
    assert_eq!(get(&tree, &vec![7; MAX_KEY_LEN]), Some(b"long".to_vec()));
}

#[test]
fn reads_of_impossible_keys_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let index = open(dir.path());
    let tree = index.tree("t").unwrap();
    let long = vec![1; MAX_KEY_LEN + 1];
    assert!(matches!(tree.get(&long), Err(IndexError::KeyTooLong { .. })));
    assert!(matches!(tree.range(&long, None, 1, false), Err(IndexError::KeyTooLong { .. })));
    assert!(matches!(tree.range(b"", Some(&long), 1, false), Err(IndexError::KeyTooLong { .. })));
}

#[test]
fn clear_removes_every_key_at_its_seqno() {
    let dir = tempfile::tempdir().unwrap();
    let n = 2500u32; // more than one chunk of the clear loop
    {
        let index = open(dir.path());
        let tree = index.tree("t").unwrap();
        for i in 0..n {
            tree.insert(&i.to_be_bytes(), b"v", 1 + u64::from(i));
            if i == n / 2 {
                tree.publish(u64::from(i) + 1);
                tree.flush(1, u64::from(i) + 1).unwrap();
            }
        }
        let last = u64::from(n);
        assert!(matches!(tree.clear(last - 1), Err(IndexError::InvalidSeqno { .. })));
        // Unpublished writes are cleared too.
        tree.clear(last + 1).unwrap();
        assert_eq!(
            get(&tree, &0u32.to_be_bytes()),
            Some(b"v".to_vec()),
            "clear is invisible until published"
        );
        assert_eq!(tree.range(b"", None, 5, false).unwrap().0.len(), 5);
        tree.publish(last + 1);
        assert_eq!(tree.range(b"", None, 5, false).unwrap(), (vec![], false));
        tree.insert(b"after", b"snapshot", last + 2);
        tree.publish(last + 2);
        tree.flush(2, last + 2).unwrap();
        tree.maybe_compact(Layout::Leveled).unwrap();
    }
    let index = open(dir.path());
    let tree = index.tree("t").unwrap();
    assert_eq!(tree.range(b"", None, 10, false).unwrap(), (pairs(&[(b"after", b"snapshot")]), false));
}

/// A rewrite larger than the memtable budget (a snapshot's install: clear, then write everything)
/// is flushed as it goes without moving the flag; after a "crash" (a reopen without the flagged
/// flush) the partial rewrite is on disk above the flag, the flag and note are the old ones, and a
/// second rewrite above the highest seqno replaces it.
#[test]
fn a_rewrite_flushes_as_it_goes_and_keeps_the_flag_until_its_own_flush() {
    let dir = tempfile::tempdir().unwrap();
    let config = IndexConfig { l0_threshold: 2, memtable_bytes: 64 << 10, ..IndexConfig::default() };
    let n = 20_000u32;
    let value = [7u8; 40];
    let last;
    {
        let index = Index::open(dir.path(), config.clone()).unwrap();
        let tree = index.tree("t").unwrap();
        for i in 0..n {
            tree.insert(&i.to_be_bytes(), b"old", 1);
            if tree.memtable_full() {
                tree.flush_keeping_flag().unwrap();
            }
        }
        tree.publish(1);
        tree.flush_with_note(1, 1, b"note one").unwrap();
        let flushes = index.flushes();
        // Clearing writes a tombstone per key: the memtable never holds all of them.
        tree.clear(2).unwrap();
        assert!(tree.memtable_bytes() < 2 * config.memtable_bytes, "{} bytes", tree.memtable_bytes());
        for i in 0..n {
            tree.insert(&i.to_be_bytes(), &value, 3);
            if tree.memtable_full() {
                tree.flush_keeping_flag().unwrap();
            }
            assert!(tree.memtable_bytes() < 2 * config.memtable_bytes, "{} bytes", tree.memtable_bytes());
        }
        assert!(index.flushes() >= flushes + 10, "{} flushes", index.flushes() - flushes);
        assert_eq!(tree.flush_flag(), Some(1));
        assert_eq!(get(&tree, &5u32.to_be_bytes()).as_deref(), Some(&b"old"[..]), "unpublished");
        last = tree.last_written_seqno();
        assert_eq!(last, 3);
    }
    // Reopened without the rewrite's own flush: the old flag and note, the partial rewrite visible.
    let index = Index::open(dir.path(), config).unwrap();
    let tree = index.tree("t").unwrap();
    assert_eq!(tree.flush_flag(), Some(1));
    assert_eq!(tree.flush_note().as_deref(), Some(&b"note one"[..]));
    assert!(tree.last_written_seqno() >= last);
    assert!(matches!(tree.clear(2), Err(IndexError::InvalidSeqno { .. })), "below what is on disk");
    let again = tree.last_written_seqno() + 1;
    tree.clear(again).unwrap();
    for i in (0..n).step_by(2) {
        tree.insert(&i.to_be_bytes(), b"new", again + 1);
    }
    tree.publish(again + 1);
    tree.flush_with_note(2, again + 1, b"note two").unwrap();
    assert_eq!(get(&tree, &4u32.to_be_bytes()).as_deref(), Some(&b"new"[..]));
    assert_eq!(get(&tree, &5u32.to_be_bytes()), None, "the first rewrite's pairs are cleared");
    assert_eq!(tree.range(b"", None, u32::MAX as usize, false).unwrap().0.len(), n as usize / 2);
}

/// lsm-tree serves a read at `r` from the newest tree version tagged below `r`. If version tags ran
/// ahead of the data seqnos (one per flush here, with dense seqnos), a read would be served from an
/// old version that lacks the newest memtable.
#[test]
fn reads_see_the_newest_memtable_after_many_flushes_with_dense_seqnos() {
    let dir = tempfile::tempdir().unwrap();
    let index = open(dir.path());
    let tree = index.tree("t").unwrap();
    for applied in 1..=12 {
        tree.flush(applied, 1).unwrap();
        tree.maybe_compact(Layout::Leveled).unwrap();
    }
    tree.insert(b"k", b"v", 2);
    tree.publish(2);
    assert_eq!(get(&tree, b"k"), Some(b"v".to_vec()));
    assert_eq!(tree.range(b"", None, 10, false).unwrap(), (pairs(&[(b"k", b"v")]), false));
}

#[test]
fn trees_are_named_cached_and_listed() {
    let dir = tempfile::tempdir().unwrap();
    let index = open(dir.path());
    let a = index.tree("shard-1").unwrap();
    let again = index.tree("shard-1").unwrap();
    a.insert(b"k", b"v", 1);
    a.publish(1);
    assert_eq!(get(&again, b"k"), Some(b"v".to_vec()), "same name, same tree");
    let b = index.tree("raft-entries").unwrap();
    assert_eq!(get(&b, b"k"), None, "trees are separate");
    assert_eq!(index.tree_names().unwrap(), vec!["raft-entries".to_owned(), "shard-1".to_owned()]);
    assert!(matches!(index.tree("../x"), Err(IndexError::InvalidTreeName { .. })));
    assert_eq!(a.name(), "shard-1");
}

#[test]
fn one_directory_is_opened_once() {
    let dir = tempfile::tempdir().unwrap();
    let index = open(dir.path());
    assert!(matches!(Index::open(dir.path(), IndexConfig::default()), Err(IndexError::Locked { .. })));
    let tree = index.tree("t").unwrap();
    drop(index);
    // A live tree keeps the directory locked.
    assert!(matches!(Index::open(dir.path(), IndexConfig::default()), Err(IndexError::Locked { .. })));
    drop(tree);
    let _index = open(dir.path());
}

#[test]
fn open_creates_the_directory_and_checks_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("a").join("index");
    let index = open(&nested);
    assert!(nested.is_dir());
    assert_eq!(index.path(), nested);
    let bad = IndexConfig { l0_threshold: 0, ..IndexConfig::default() };
    assert!(matches!(Index::open(&dir.path().join("other"), bad), Err(IndexError::Config(_))));
    assert!(!dir.path().join("other").exists(), "nothing touched on a bad config");
}

#[test]
fn disk_and_written_bytes_grow_with_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let index = open(dir.path());
    let tree = index.tree("t").unwrap();
    assert_eq!(index.bytes_written(), 0);
    let value = vec![0x5a; 1000];
    for i in 0..200u64 {
        tree.insert(&i.to_be_bytes(), &value, i + 1);
    }
    assert!(tree.memtable_bytes() >= 200 * 1000);
    tree.publish(200);
    tree.flush(1, 200).unwrap();
    assert_eq!(tree.memtable_bytes(), 0);
    let after_flush = index.bytes_written();
    assert!(after_flush > 0 && after_flush == tree.bytes_written());
    assert!(tree.disk_bytes() > 0 && index.disk_bytes() >= tree.disk_bytes());
    for i in 0..200u64 {
        tree.insert(&i.to_be_bytes(), &value, 201 + i);
    }
    tree.publish(400);
    tree.flush(2, 400).unwrap();
    tree.maybe_compact(Layout::Leveled).unwrap();
    assert!(index.bytes_written() > after_flush, "the second flush and the compaction wrote tables");
}

#[test]
fn trees_are_send_and_sync() {
    fn check<T: Send + Sync + Clone>() {}
    check::<Tree>();
    fn check_index<T: Send + Sync>() {}
    check_index::<Index>();
    fn check_error<T: Send + Sync + Clone + std::error::Error>() {}
    check_error::<IndexError>();
}

#[test]
fn flushes_and_compactions_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let config = IndexConfig { l0_threshold: 2, ..IndexConfig::default() };
    let index = Index::open(dir.path(), config).unwrap();
    let tree = index.tree("t").unwrap();
    tree.maybe_compact(Layout::Leveled).unwrap();
    assert_eq!((index.flushes(), index.compactions()), (0, 0), "nothing to compact is not a compaction");
    let value = vec![0x5a; 100];
    let mut seqno = 0;
    for flush in 1..=4u64 {
        for i in 0..50u64 {
            seqno += 1;
            tree.insert(&i.to_be_bytes(), &value, seqno);
        }
        tree.publish(seqno);
        tree.flush(flush, seqno).unwrap();
    }
    assert_eq!(index.flushes(), 4);
    tree.maybe_compact(Layout::Leveled).unwrap();
    assert!(index.compactions() >= 1, "four tables over an L0 threshold of 2 need a compaction");
}

/// Writes `flushes` memtables of 2 000 overwrites of random keys (of 20 000) into `tree`, each
/// flush followed by compaction steps towards `layout` until one finds nothing to do.
fn load_in_layout(tree: &Tree, layout: Layout, flushes: u64) {
    let mut seqno = 0;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for flush in 1..=flushes {
        for _ in 0..2_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            seqno += 1;
            tree.insert(format!("user{:08}", state % 20_000).as_bytes(), &state.to_le_bytes(), seqno);
        }
        tree.publish(seqno);
        tree.flush(flush, seqno).unwrap();
        while tree.maybe_compact(layout).unwrap() {}
    }
}

#[test]
fn the_runs_layout_compacts_less_and_leveling_it_gives_the_leveled_form() {
    let config = IndexConfig { l0_threshold: 4, ..IndexConfig::default() };
    let (leveled_dir, runs_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let leveled = Index::open(leveled_dir.path(), config.clone()).unwrap();
    let runs = Index::open(runs_dir.path(), config).unwrap();
    let (leveled_tree, runs_tree) = (leveled.tree("t").unwrap(), runs.tree("t").unwrap());
    load_in_layout(&leveled_tree, Layout::Leveled, 48);
    load_in_layout(&runs_tree, Layout::Runs(8), 48);

    // S = 8: flushed runs wait until there are 8 (never more than 7 between flushes), then merge
    // into one; leveled compaction merges at 4, so it writes about twice the bytes.
    assert!(runs_tree.level0_tables() < 8, "{} L0 tables", runs_tree.level0_tables());
    let (leveled_bytes, runs_bytes) =
        (leveled.compaction_bytes(Layout::Leveled), runs.compaction_bytes(Layout::Runs(8)));
    assert_eq!((leveled.compaction_bytes(Layout::Runs(1)), runs.compaction_bytes(Layout::Leveled)), (0, 0));
    assert!(
        runs_bytes * 3 < leveled_bytes * 2,
        "runs layout wrote {runs_bytes} compaction bytes, leveled {leveled_bytes}"
    );

    // The runs tree becomes a leader's: leveled steps until nothing is left to do.
    let expected = leveled_tree.range(b"", None, usize::MAX, false).unwrap();
    assert_eq!(runs_tree.range(b"", None, usize::MAX, false).unwrap(), expected);
    assert!(!runs_tree.is_leveled());
    let mut steps = 0;
    while runs_tree.maybe_compact(Layout::Leveled).unwrap() {
        steps += 1;
        assert!(steps < 20, "leveling does not end");
    }
    assert!(runs_tree.is_leveled());
    assert!(runs_tree.level0_tables() < 4, "{} L0 tables", runs_tree.level0_tables());
    assert_eq!(runs_tree.range(b"", None, usize::MAX, false).unwrap(), expected);
    // A flush makes the shape unknown again until a leveled step looks.
    runs_tree.insert(b"late", b"v", 1_000_000);
    runs_tree.publish(1_000_000);
    runs_tree.flush(1_000, 1_000_000).unwrap();
    assert!(!runs_tree.is_leveled());
}

/// A clear told to stop gives up between two chunks of keys: it reports so, the keys it reached
/// are removed, the others are still there, and a clear asked again at a higher seqno finishes.
#[test]
fn a_clear_told_to_stop_gives_up_part_way_and_can_be_done_again() {
    let dir = tempfile::tempdir().unwrap();
    let index = open(dir.path());
    let tree = index.tree("t").unwrap();
    let n = 5_000u32;
    for i in 0..n {
        tree.insert(&i.to_be_bytes(), b"v", 1);
    }
    tree.publish(1);
    let chunks = std::cell::Cell::new(0);
    let stop_after_one = || {
        chunks.set(chunks.get() + 1);
        chunks.get() > 1
    };
    assert!(!tree.clear_until(2, &stop_after_one).unwrap(), "the clear did not stop");
    tree.publish(2);
    let left = (0..n).filter(|i| get(&tree, &i.to_be_bytes()).is_some()).count();
    assert!(left > 0 && left < n as usize, "{left} of {n} keys left after one chunk");
    assert!(tree.clear_until(3, &|| false).unwrap());
    tree.publish(3);
    assert!((0..n).all(|i| get(&tree, &i.to_be_bytes()).is_none()));
}
