//! One tree: writes from the apply thread, reads at the published seqno from any thread, flushes
//! that record a flush flag, and compaction into the [`Layout`] the caller asks for.
//!
//! Owns the rules that keep lsm-tree 3.1.10 safe under concurrent reads (see the crate docs):
//! version seqnos pinned to 0, the garbage-collection watermark, and the contract checks on the
//! caller's seqnos. Flush, compaction and clear are serialized by one mutex per tree; writes and
//! reads never take it.

use crate::fsutil::{self, WrittenFiles};
use crate::index::IndexShared;
use crate::keys::{self, FLAG_KEY, META_END, Space};
use crate::layout::Layout;
use crate::reads::ReadTracker;
use crate::{IndexError, MAX_KEY_LEN, MAX_SEQNO, MAX_VALUE_LEN, MIN_SEQNO};
use lsm_tree::{AbstractTree, Guard as _, SequenceNumberCounter};
use std::fmt;
use std::ops::Bound;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The watermark that makes lsm-tree's MVCC garbage collection keep every version: it drops only
/// versions below the watermark, and no entry has a seqno below [`MIN_SEQNO`].
const NO_GC_WATERMARK: u64 = MIN_SEQNO;

/// How many keys [`Tree::clear`] reads before writing their tombstones.
const CLEAR_CHUNK_KEYS: usize = 1024;

/// A handle to one tree of an [`crate::Index`]. Cheap to clone; `Send + Sync`.
///
/// Threads: writes (`insert`, `remove`, `publish`, `flush`, `clear`) come from one apply thread;
/// `maybe_compact` may run on another thread; reads (`get`, `range`) run on any thread.
#[derive(Clone)]
pub struct Tree {
    inner: Arc<TreeInner>,
}

struct TreeInner {
    name: String,
    dir: PathBuf,
    lsm: lsm_tree::Tree,
    /// lsm-tree's counter, which it draws from only to tag new versions (see `pin_version_seqno`).
    version_seqno: SequenceNumberCounter,
    reads: ReadTracker,
    /// Highest seqno written so far (data, tombstones and flags).
    last_seqno: AtomicU64,
    /// Highest seqno of a user write (flags excluded): bounds what a flush or compaction can see.
    max_data_seqno: AtomicU64,
    /// The flag of the last flush that completed.
    /// The last flush's flag and the note stored with it.
    flush_flag: Mutex<Option<(u64, Vec<u8>)>>,
    /// Flags (and notes) of memtables sealed but not yet flushed, oldest first, with the seqno
    /// each flag was written at.
    sealed_flags: Mutex<Vec<(u64, Vec<u8>, u64)>>,
    /// Every write at or below this seqno is durable (in a table): the flag seqno of the last
    /// flush that completed, or the highest seqno on disk at open.
    durable_seqno: AtomicU64,
    /// Serializes flush, compaction and clear; holds what they need.
    maintenance: Mutex<Maintenance>,
    /// Whether a [`Layout::Leveled`] step found nothing to do and nothing changed the tables since
    /// (a flush or a [`Layout::Runs`] step clears it).
    leveled: AtomicBool,
    /// [`Tree::sorted_runs`] and [`Tree::level0_tables`] as of the last flush or compaction (only
    /// they change the tables), so the replica's status, published every turn, reads two atomics
    /// instead of the tree's version seven times.
    sorted_runs: AtomicU64,
    level0_tables: AtomicU64,
    bytes_written: AtomicU64,
    index: Arc<IndexShared>,
}

struct Maintenance {
    written: WrittenFiles,
    /// The first flush or compaction failure; after it the tree refuses both.
    failure: Option<Arc<IndexError>>,
}

impl Tree {
    /// Wraps an opened lsm tree: restores the flag, the published seqno and the seqno bounds.
    pub(crate) fn open(
        name: &str,
        dir: PathBuf,
        lsm: lsm_tree::Tree,
        version_seqno: SequenceNumberCounter,
        index: Arc<IndexShared>,
    ) -> Result<Tree, IndexError> {
        // Everything on disk was flushed, so it is all visible; nothing else exists after open.
        let persisted = lsm.get_highest_persisted_seqno();
        let highest = persisted.unwrap_or(0);
        let read_seqno = persisted.map_or(0, |seqno| seqno + 1);
        let stored_flag = match persisted {
            None => None,
            Some(_) => lsm
                .get(FLAG_KEY, read_seqno)
                .map_err(|e| IndexError::storage(name, "reading the flush flag", e))?,
        };
        // The flag's value: the applied index (u64 LE), then the caller's note (any bytes).
        let flush_flag = match stored_flag {
            None => None,
            Some(bytes) if bytes.len() < 8 => {
                return Err(IndexError::CorruptFlushFlag { tree: name.to_owned(), len: bytes.len() });
            }
            Some(bytes) => {
                let (index, note) = bytes.split_at(8);
                Some((u64::from_le_bytes(index.try_into().expect("8 bytes")), note.to_vec()))
            }
        };
        let written = WrittenFiles::scan(&dir);
        let tree = Tree {
            inner: Arc::new(TreeInner {
                name: name.to_owned(),
                dir,
                lsm,
                version_seqno,
                reads: ReadTracker::new(read_seqno),
                last_seqno: AtomicU64::new(highest),
                max_data_seqno: AtomicU64::new(highest),
                flush_flag: Mutex::new(flush_flag),
                sealed_flags: Mutex::default(),
                durable_seqno: AtomicU64::new(highest),
                maintenance: Mutex::new(Maintenance { written, failure: None }),
                leveled: AtomicBool::new(false),
                sorted_runs: AtomicU64::new(0),
                level0_tables: AtomicU64::new(0),
                bytes_written: AtomicU64::new(0),
                index,
            }),
        };
        tree.note_shape();
        Ok(tree)
    }

    /// The tree's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Writes `key -> value` at `seqno`, invisible until [`Tree::publish`] covers `seqno`.
    ///
    /// # Panics
    ///
    /// On a broken caller contract, which is a bug: `key` longer than [`MAX_KEY_LEN`], `value`
    /// longer than [`MAX_VALUE_LEN`], `seqno` outside [`MIN_SEQNO`]`..=`[`MAX_SEQNO`], below a
    /// seqno already written, or already published.
    pub fn insert(&self, key: &[u8], value: &[u8], seqno: u64) {
        self.write(Space::User, key, Some(value), seqno);
    }

    /// Removes `key` at `seqno` (a tombstone), invisible until published.
    ///
    /// # Panics
    ///
    /// As [`Tree::insert`].
    pub fn remove(&self, key: &[u8], seqno: u64) {
        self.write(Space::User, key, None, seqno);
    }

    /// Writes `key -> value` in the metadata space: keys that never mix with user keys (user
    /// ranges do not see them) but live in the same memtable, so one flush and its flag make data
    /// and metadata durable together. Same contract as [`Tree::insert`].
    pub fn insert_meta(&self, key: &[u8], value: &[u8], seqno: u64) {
        self.write(Space::Meta, key, Some(value), seqno);
    }

    /// Removes a metadata key at `seqno`. Same contract as [`Tree::insert`].
    pub fn remove_meta(&self, key: &[u8], seqno: u64) {
        self.write(Space::Meta, key, None, seqno);
    }

    fn write(&self, space: Space, key: &[u8], value: Option<&[u8]>, seqno: u64) {
        self.check_write(key, seqno);
        let stored = space.stored(key);
        let _sizes = match value {
            Some(value) => {
                assert!(value.len() as u64 <= MAX_VALUE_LEN, "value of {} bytes is too long", value.len());
                self.inner.lsm.insert(stored, value, seqno)
            }
            None => self.inner.lsm.remove(stored, seqno),
        };
        self.note_data_write(seqno);
    }

    /// Makes every write with seqno `<= seqno` visible to reads at once. Never goes back: a seqno
    /// below the visible one is ignored.
    ///
    /// # Panics
    ///
    /// If `seqno` is above [`MAX_SEQNO`].
    pub fn publish(&self, seqno: u64) {
        assert!(seqno <= MAX_SEQNO, "publish: seqno {seqno} is above MAX_SEQNO");
        self.inner.reads.publish(seqno + 1);
    }

    /// The highest published seqno, 0 if nothing was published. After opening, everything durable
    /// is published (the highest seqno on disk).
    pub fn visible_seqno(&self) -> u64 {
        self.inner.reads.published().saturating_sub(1)
    }

    /// The value of `key` at the published seqno.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
        let read = self.inner.reads.begin();
        self.get_at(Space::User, key, read.seqno())
    }

    /// The value of `key` as written at or below `seqno`, published or not: a writer reading back
    /// what it wrote before publishing it (a snapshot install pointing a key at the copy an earlier
    /// key of the snapshot got).
    pub fn get_written(&self, key: &[u8], seqno: u64) -> Result<Option<Vec<u8>>, IndexError> {
        self.get_at(Space::User, key, seqno + 1)
    }

    /// Up to `limit` pairs with `start <= key < end` (`end` `None`: no upper bound) at the published
    /// seqno, ascending, or descending when `reverse` (then the pairs nearest `end` come first).
    /// The flag says whether more pairs remain in the range beyond those returned.
    #[expect(clippy::type_complexity, reason = "the signature the replica codes against")]
    pub fn range(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        reverse: bool,
    ) -> Result<(Vec<(Vec<u8>, Vec<u8>)>, bool), IndexError> {
        let read = self.inner.reads.begin();
        self.range_at(Space::User, start, end, limit, reverse, read.seqno())
    }

    /// Up to `limit` metadata pairs with keys `>= start`, ascending, at the published seqno; and
    /// whether more remain.
    #[expect(clippy::type_complexity, reason = "as Tree::range")]
    pub fn range_meta(
        &self,
        start: &[u8],
        limit: usize,
    ) -> Result<(Vec<(Vec<u8>, Vec<u8>)>, bool), IndexError> {
        let read = self.inner.reads.begin();
        self.range_at(Space::Meta, start, None, limit, false, read.seqno())
    }

    /// A consistent view of the tree as published now, which stays readable while the writer goes
    /// on (for building a snapshot on another thread). While it lives, flushes and compactions
    /// keep every version it can see.
    pub fn snapshot(&self) -> TreeSnapshot {
        let seqno = self.inner.reads.hold();
        TreeSnapshot { tree: self.clone(), seqno }
    }

    fn get_at(&self, space: Space, key: &[u8], read_seqno: u64) -> Result<Option<Vec<u8>>, IndexError> {
        check_read_key(key)?;
        if read_seqno == 0 {
            return Ok(None);
        }
        self.inner
            .lsm
            .get(space.stored(key), read_seqno)
            .map(|value| value.map(|v| v.to_vec()))
            .map_err(|e| IndexError::storage(&self.inner.name, "reading a key", e))
    }

    #[expect(clippy::type_complexity, reason = "as Tree::range")]
    fn range_at(
        &self,
        space: Space,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        reverse: bool,
        read_seqno: u64,
    ) -> Result<(Vec<(Vec<u8>, Vec<u8>)>, bool), IndexError> {
        check_read_key(start)?;
        if let Some(end) = end {
            check_read_key(end)?;
        }
        let lo = space.stored(start);
        let hi = end.map_or_else(|| space.end().to_vec(), |end| space.stored(end));
        if lo >= hi || read_seqno == 0 {
            return Ok((Vec::new(), false));
        }
        let iter = self.inner.lsm.range(lo..hi, read_seqno, None);
        let iter: Box<dyn Iterator<Item = _>> = if reverse { Box::new(iter.rev()) } else { iter };
        let mut pairs = Vec::with_capacity(limit.min(1024));
        for item in iter {
            if pairs.len() == limit {
                return Ok((pairs, true));
            }
            let (key, value) =
                item.into_inner().map_err(|e| IndexError::storage(&self.inner.name, "reading a range", e))?;
            pairs.push((keys::user(&key).to_vec(), value.to_vec()));
        }
        Ok((pairs, false))
    }

    /// The flag of the last flush that completed (`None` for a tree never flushed). After a crash
    /// this is the flag of the last flush whose table reached the disk.
    pub fn flush_flag(&self) -> Option<u64> {
        lock(&self.inner.flush_flag).as_ref().map(|(index, _)| *index)
    }

    /// The note stored with the last completed flush's flag ([`Tree::flush_with_note`]); empty when
    /// the flush had none, `None` for a tree never flushed.
    pub fn flush_note(&self) -> Option<Vec<u8>> {
        lock(&self.inner.flush_flag).as_ref().map(|(_, note)| note.clone())
    }

    /// Writes the flag `applied_index` at `flag_seqno`, then rotates the memtable and flushes it to a
    /// table, durably (lsm-tree fsyncs the table, the manifest and their directories). On return
    /// [`Tree::flush_flag`] is `Some(applied_index)`. An empty memtable still gets its flag flushed.
    ///
    /// `flag_seqno` must be at least every seqno written so far (later writes may not go below it).
    /// Call it between batches: all writes so far should belong to entries up to `applied_index`.
    ///
    /// After an I/O error the tree refuses further flushes and compactions ([`IndexError::Failed`]);
    /// what was durable before stays durable, and reopening recovers it.
    pub fn flush(&self, applied_index: u64, flag_seqno: u64) -> Result<(), IndexError> {
        self.flush_with_note(applied_index, flag_seqno, &[])
    }

    /// [`Tree::flush`], storing `note` with the flag in the same table: whatever the caller needs
    /// to know about the state the flag describes (the replica keeps where its recovery scan may
    /// start). [`Tree::flush_note`] returns it after a reopen.
    pub fn flush_with_note(
        &self,
        applied_index: u64,
        flag_seqno: u64,
        note: &[u8],
    ) -> Result<(), IndexError> {
        self.seal(applied_index, flag_seqno, note)?;
        self.flush_sealed()
    }

    /// The first half of [`Tree::flush_with_note`], in memory only and quick, for the writer's
    /// thread: writes the flag and rotates the memtable, so later writes go to a new one. The
    /// sealed memtable (and its flag) becomes durable with the next [`Tree::flush_sealed`], which
    /// may run on another thread while writes go on; until then [`Tree::flush_flag`] is the old
    /// flag. Same rules for `flag_seqno` as [`Tree::flush`].
    pub fn seal(&self, applied_index: u64, flag_seqno: u64, note: &[u8]) -> Result<(), IndexError> {
        let inner = &*self.inner;
        if let Some(failure) = &lock(&inner.maintenance).failure {
            return Err(IndexError::Failed { tree: inner.name.clone(), cause: failure.clone() });
        }
        // The flag is no user write, so it may sit at a published seqno.
        self.check_seqno(flag_seqno, false)?;
        let mut sealed = lock(&inner.sealed_flags);
        let current = sealed.last().map(|(index, ..)| *index).or_else(|| self.flush_flag());
        if let Some(current) = current
            && applied_index < current
        {
            return Err(IndexError::FlushFlagRegressed {
                tree: inner.name.clone(),
                current,
                requested: applied_index,
            });
        }
        let mut flag = Vec::with_capacity(8 + note.len());
        flag.extend_from_slice(&applied_index.to_le_bytes());
        flag.extend_from_slice(note);
        let _sizes = inner.lsm.insert(FLAG_KEY, flag, flag_seqno);
        inner.last_seqno.fetch_max(flag_seqno, Ordering::AcqRel);
        // Never empty: it holds the flag. Rotating before recording the flag means a flush that
        // sees the flag recorded also sees its memtable sealed.
        let _memtable = inner.lsm.rotate_memtable();
        sealed.push((applied_index, note.to_vec(), flag_seqno));
        Ok(())
    }

    /// Whether a sealed memtable waits for [`Tree::flush_sealed`].
    pub fn has_sealed(&self) -> bool {
        !lock(&self.inner.sealed_flags).is_empty()
    }

    /// Writes every memtable sealed so far to tables, durably (lsm-tree fsyncs the tables, the
    /// manifest and their directories); on return [`Tree::flush_flag`] is the flag of the last
    /// seal before the call. May run on any thread, concurrently with writes and seals.
    ///
    /// After an I/O error the tree refuses further flushes, seals and compactions
    /// ([`IndexError::Failed`]); what was durable before stays durable, and reopening recovers it.
    pub fn flush_sealed(&self) -> Result<(), IndexError> {
        let inner = &*self.inner;
        let mut maintenance = self.maintenance()?;
        // Every flag taken here had its memtable sealed before it was recorded, so the flush
        // below (which takes the sealed memtables when it starts) writes all of them.
        let flags: Vec<(u64, Vec<u8>, u64)> = std::mem::take(&mut *lock(&inner.sealed_flags));
        let Some((last_index, last_note, last_seqno)) = flags.last().cloned() else {
            return Ok(());
        };
        let flush_lock = inner.lsm.get_flush_lock();
        let watermark = self.gc_watermark();
        self.pin_version_seqno();
        let result = inner.lsm.flush(&flush_lock, watermark);
        drop(flush_lock);
        self.account_written(&mut maintenance);
        if let Err(e) = result {
            return Err(fail(&mut maintenance, IndexError::storage(&inner.name, "flushing the memtable", e)));
        }
        *lock(&inner.flush_flag) = Some((last_index, last_note));
        inner.durable_seqno.fetch_max(last_seqno, Ordering::AcqRel);
        inner.leveled.store(false, Ordering::Release);
        inner.index.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Writes the memtable to a table, durably, **without** moving the flush flag: the flag and
    /// note on disk stay those of the last seal. For a rewrite too large to wait in memory for its
    /// flagged flush (installing a snapshot): the memtable stays within the index's
    /// `memtable_bytes` ([`Tree::memtable_full`]) however much is written.
    ///
    /// What this flushes is on disk *above* the flag's state: after a crash, a reopened tree reads
    /// it as visible and [`Tree::last_written_seqno`] is above it, so the caller must redo the
    /// rewrite at seqnos above that (the replica re-installs the snapshot from its log, which the
    /// flag's note still covers). Memtables sealed with a flag are flushed first, as
    /// [`Tree::flush_sealed`] would.
    pub fn flush_keeping_flag(&self) -> Result<(), IndexError> {
        self.flush_sealed()?;
        let mut maintenance = self.maintenance()?;
        self.flush_unflagged(&mut maintenance)
    }

    /// Whether the active memtable holds the index's `memtable_bytes` or more.
    pub fn memtable_full(&self) -> bool {
        self.memtable_bytes() >= self.inner.index.config.memtable_bytes
    }

    /// [`Tree::flush_keeping_flag`]'s flush, with the maintenance lock held.
    fn flush_unflagged(&self, maintenance: &mut Maintenance) -> Result<(), IndexError> {
        let inner = &*self.inner;
        let _memtable = inner.lsm.rotate_memtable();
        let flush_lock = inner.lsm.get_flush_lock();
        let watermark = self.gc_watermark();
        self.pin_version_seqno();
        let result = inner.lsm.flush(&flush_lock, watermark);
        drop(flush_lock);
        self.account_written(maintenance);
        if let Err(e) = result {
            return Err(fail(maintenance, IndexError::storage(&inner.name, "flushing the memtable", e)));
        }
        inner.leveled.store(false, Ordering::Release);
        inner.index.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Every write at or below this seqno is durable: the flag seqno of the last flush that
    /// completed (the highest seqno on disk right after open).
    pub fn durable_seqno(&self) -> u64 {
        self.inner.durable_seqno.load(Ordering::Acquire)
    }

    /// The highest seqno written so far (data, tombstones and flags): a later write must not go
    /// below it.
    pub fn last_written_seqno(&self) -> u64 {
        self.inner.last_seqno.load(Ordering::Acquire)
    }

    /// Bytes in the active memtable, to decide when to flush.
    pub fn memtable_bytes(&self) -> u64 {
        self.inner.lsm.active_memtable().size()
    }

    /// Runs one compaction step towards `layout` if the tree needs one (nothing otherwise);
    /// returns whether the step changed the tree. Compacting with [`Layout::Leveled`] until this
    /// returns `false` brings a tree of any shape to the leveled form ([`Tree::is_leveled`]).
    pub fn maybe_compact(&self, layout: Layout) -> Result<bool, IndexError> {
        let inner = &*self.inner;
        let mut maintenance = self.maintenance()?;
        let watermark = self.gc_watermark();
        self.pin_version_seqno();
        let strategy = Arc::new(layout.strategy(&inner.index.config));
        let result = inner.lsm.compact(strategy, watermark);
        // A step that changed the tree wrote at least a new version file; one with nothing to do
        // wrote nothing.
        let written = self.account_written(&mut maintenance);
        result.map_err(|e| fail(&mut maintenance, IndexError::storage(&inner.name, "compacting", e)))?;
        let changed = written > 0;
        if changed {
            inner.index.compactions.fetch_add(1, Ordering::Relaxed);
            inner.index.compaction_bytes(layout).fetch_add(written, Ordering::Relaxed);
        }
        match layout {
            Layout::Leveled => inner.leveled.store(!changed, Ordering::Release),
            Layout::Runs(_) if changed => inner.leveled.store(false, Ordering::Release),
            Layout::Runs(_) => {}
        }
        Ok(changed)
    }

    /// Whether the tree is in the leveled form: the last [`Layout::Leveled`] step found nothing
    /// to do, and no flush or other compaction changed the tables since. `false` for a tree just
    /// opened, until a step has looked.
    pub fn is_leveled(&self) -> bool {
        self.inner.leveled.load(Ordering::Acquire)
    }

    /// The tree's sorted runs on disk: each L0 table is one, each deeper level that holds tables
    /// one more. A point read may probe each (through its filter); a range read merges them all.
    pub fn sorted_runs(&self) -> usize {
        self.inner.sorted_runs.load(Ordering::Relaxed) as usize
    }

    /// Tables in L0, where flushes put them: each its own sorted run until a compaction merges it.
    pub fn level0_tables(&self) -> usize {
        self.inner.level0_tables.load(Ordering::Relaxed) as usize
    }

    /// Records the tree's shape for [`Tree::sorted_runs`] and [`Tree::level0_tables`].
    fn note_shape(&self) {
        let lsm = &self.inner.lsm;
        let level0 = lsm.level_table_count(0).unwrap_or(0);
        let deeper = (1..7).filter(|&level| lsm.level_table_count(level).unwrap_or(0) > 0).count();
        self.inner.level0_tables.store(level0 as u64, Ordering::Relaxed);
        self.inner.sorted_runs.store((level0 + deeper) as u64, Ordering::Relaxed);
    }

    /// Removes every user and metadata key with tombstones at `seqno`, for installing a snapshot:
    /// writes at `seqno` or below are all removed. Like other writes, invisible until published; durable
    /// after the next flush. The flush flag is unchanged.
    ///
    /// Costs one tombstone per key in the tree; whenever the memtable fills
    /// ([`Tree::memtable_full`]) they are flushed as [`Tree::flush_keeping_flag`] does, with the
    /// same consequence after a crash.
    pub fn clear(&self, seqno: u64) -> Result<(), IndexError> {
        self.clear_until(seqno, &|| false).map(|_| ())
    }

    /// [`Tree::clear`], which gives up between two chunks of keys once `stop` returns true
    /// (returns `false` then): the keys removed so far stay removed, as after a crash part-way.
    pub fn clear_until(&self, seqno: u64, stop: &dyn Fn() -> bool) -> Result<bool, IndexError> {
        let inner = &*self.inner;
        self.check_seqno(seqno, true)?;
        self.flush_sealed()?;
        let mut maintenance = self.maintenance()?;
        let mut after: Option<Vec<u8>> = None;
        loop {
            if stop() {
                return Ok(false);
            }
            let chunk = {
                // Register the read so that a concurrent compaction keeps what it sees.
                let read = inner.reads.begin_at(seqno + 1);
                let lo =
                    after.take().map_or_else(|| Bound::Included(Space::User.stored(b"")), Bound::Excluded);
                let mut chunk = Vec::with_capacity(CLEAR_CHUNK_KEYS);
                for item in inner.lsm.range((lo, Bound::Excluded(META_END.to_vec())), read.seqno(), None) {
                    let key = item.key().map_err(|e| IndexError::storage(&inner.name, "clearing", e))?;
                    chunk.push(key);
                    if chunk.len() == CLEAR_CHUNK_KEYS {
                        break;
                    }
                }
                chunk
            };
            for key in &chunk {
                let _sizes = inner.lsm.remove(key.clone(), seqno);
            }
            self.note_data_write(seqno);
            if self.memtable_full() {
                self.flush_unflagged(&mut maintenance)?;
            }
            match chunk.last() {
                Some(last) if chunk.len() == CLEAR_CHUNK_KEYS => after = Some(last.to_vec()),
                _ => return Ok(true),
            }
        }
    }

    /// Bytes of this tree's files now.
    pub fn disk_bytes(&self) -> u64 {
        fsutil::dir_bytes(&self.inner.dir)
    }

    /// Bytes of tables and manifests this tree wrote since it was opened.
    pub fn bytes_written(&self) -> u64 {
        self.inner.bytes_written.load(Ordering::Relaxed)
    }

    /// The garbage-collection watermark for a flush or compaction starting now.
    ///
    /// lsm-tree 3.1.10 drops every version below the watermark that has *any* newer version, even
    /// one that some read cannot see yet (fjall-rs/lsm-tree#321). So a watermark `w` is safe only
    /// if every read that may use the result reads above every version it could keep, which holds
    /// when all user writes are below the oldest read seqno in use: then every reader sees the
    /// newest version of every key and nothing older is needed. Otherwise nothing is collected
    /// this time. A flush or compaction sees only writes made before this call (the flush rotated
    /// its memtable already; tables come from earlier flushes, which are serialized with it).
    fn gc_watermark(&self) -> u64 {
        let oldest_read = self.inner.reads.oldest();
        let newest_write = self.inner.max_data_seqno.load(Ordering::Acquire);
        if oldest_read > newest_write { oldest_read } else { NO_GC_WATERMARK }
    }

    /// Tags the version the next flush or compaction creates with seqno 0 (see the crate docs).
    ///
    /// lsm-tree serves a read at `r` from the newest version tagged below `r`; with every tag 0 and
    /// every read at `r >= 1`, that is always the newest version, which holds every write. Called
    /// under the maintenance lock, and each flush or compaction creates exactly one version, so no
    /// tag ever exceeds 0.
    fn pin_version_seqno(&self) {
        self.inner.version_seqno.set(0);
    }

    fn maintenance(&self) -> Result<MutexGuard<'_, Maintenance>, IndexError> {
        let maintenance = lock(&self.inner.maintenance);
        match &maintenance.failure {
            Some(cause) => Err(IndexError::Failed { tree: self.inner.name.clone(), cause: cause.clone() }),
            None => Ok(maintenance),
        }
    }

    /// Counts the bytes of new tables and manifests, and records the tree's shape (called after
    /// every flush and compaction step); returns the bytes.
    fn account_written(&self, maintenance: &mut Maintenance) -> u64 {
        self.note_shape();
        let bytes = maintenance.written.count_new(&self.inner.dir);
        self.inner.bytes_written.fetch_add(bytes, Ordering::Relaxed);
        self.inner.index.bytes_written.fetch_add(bytes, Ordering::Relaxed);
        bytes
    }

    /// The seqno rules of [`Tree::insert`]; the last one (not yet visible) only for user writes.
    fn check_seqno(&self, seqno: u64, user_write: bool) -> Result<(), IndexError> {
        let last = self.inner.last_seqno.load(Ordering::Acquire);
        let reason = if !(MIN_SEQNO..=MAX_SEQNO).contains(&seqno) {
            format!("outside {MIN_SEQNO}..={MAX_SEQNO}")
        } else if seqno < last {
            format!("below seqno {last} already written")
        } else if user_write && seqno < self.inner.reads.published() {
            format!("not above the visible seqno {}", self.visible_seqno())
        } else {
            return Ok(());
        };
        Err(IndexError::InvalidSeqno { tree: self.inner.name.clone(), seqno, reason })
    }

    fn check_write(&self, key: &[u8], seqno: u64) {
        assert!(key.len() <= MAX_KEY_LEN, "key of {} bytes is longer than MAX_KEY_LEN", key.len());
        if let Err(e) = self.check_seqno(seqno, true) {
            panic!("write contract broken: {e}");
        }
    }

    fn note_data_write(&self, seqno: u64) {
        self.inner.last_seqno.fetch_max(seqno, Ordering::AcqRel);
        self.inner.max_data_seqno.fetch_max(seqno, Ordering::AcqRel);
    }

    /// A read at an explicit lsm read seqno, registered like any read (tests of the watermark).
    #[cfg(test)]
    fn get_with(&self, key: &[u8], read: &crate::reads::ReadGuard<'_>) -> Option<Vec<u8>> {
        self.inner.lsm.get(Space::User.stored(key), read.seqno()).unwrap().map(|v| v.to_vec())
    }
}

/// A view of a [`Tree`] at one published seqno ([`Tree::snapshot`]); reads see exactly what was
/// published when it was taken. `Send`, so it can be read on another thread.
pub struct TreeSnapshot {
    tree: Tree,
    /// The lsm-tree read seqno, registered with the tree's read tracker until drop.
    seqno: u64,
}

impl TreeSnapshot {
    /// The value of `key` in this view.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
        self.tree.get_at(Space::User, key, self.seqno)
    }

    /// As [`Tree::range`], in this view.
    #[expect(clippy::type_complexity, reason = "as Tree::range")]
    pub fn range(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        reverse: bool,
    ) -> Result<(Vec<(Vec<u8>, Vec<u8>)>, bool), IndexError> {
        self.tree.range_at(Space::User, start, end, limit, reverse, self.seqno)
    }

    /// As [`Tree::range_meta`], in this view.
    #[expect(clippy::type_complexity, reason = "as Tree::range")]
    pub fn range_meta(
        &self,
        start: &[u8],
        limit: usize,
    ) -> Result<(Vec<(Vec<u8>, Vec<u8>)>, bool), IndexError> {
        self.tree.range_at(Space::Meta, start, None, limit, false, self.seqno)
    }

    /// The highest seqno this view sees.
    pub fn seqno(&self) -> u64 {
        self.seqno.saturating_sub(1)
    }
}

impl Drop for TreeSnapshot {
    fn drop(&mut self) {
        self.tree.inner.reads.release(self.seqno);
    }
}

impl fmt::Debug for Tree {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tree")
            .field("name", &self.inner.name)
            .field("visible_seqno", &self.visible_seqno())
            .field("flush_flag", &self.flush_flag())
            .finish_non_exhaustive()
    }
}

fn check_read_key(key: &[u8]) -> Result<(), IndexError> {
    if key.len() > MAX_KEY_LEN {
        return Err(IndexError::KeyTooLong { len: key.len(), max: MAX_KEY_LEN });
    }
    Ok(())
}

/// Records the first failure and returns it.
fn fail(maintenance: &mut Maintenance, error: IndexError) -> IndexError {
    maintenance.failure.get_or_insert_with(|| Arc::new(error.clone()));
    error
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every value behind these mutexes is replaced in single statements, never left half-changed.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use crate::{Index, IndexConfig, Layout};

    fn small() -> IndexConfig {
        IndexConfig { l0_threshold: 2, ..IndexConfig::default() }
    }

    /// The case of fjall-rs/lsm-tree#321: a read registered before a newer version was published
    /// must still find the older version after flushes and compactions collected garbage.
    #[test]
    fn a_read_in_flight_keeps_the_version_it_needs() {
        let dir = tempfile::tempdir().unwrap();
        let index = Index::open(dir.path(), small()).unwrap();
        let tree = index.tree("t").unwrap();
        tree.insert(b"k", b"old", 1);
        tree.insert(b"other", b"x", 2);
        tree.publish(2);
        tree.flush(1, 2).unwrap();

        let stale = tree.inner.reads.begin();
        assert_eq!(stale.seqno(), 3);
        tree.insert(b"k", b"new", 5);
        tree.publish(5);
        assert_eq!(tree.gc_watermark(), super::NO_GC_WATERMARK, "a read at 3 is older than write 5");
        for i in 0..4 {
            tree.flush(2 + i, 5).unwrap();
            tree.maybe_compact(Layout::Leveled).unwrap();
        }
        assert_eq!(tree.get_with(b"k", &stale).as_deref(), Some(&b"old"[..]));
        assert_eq!(tree.get(b"k").unwrap().as_deref(), Some(&b"new"[..]));
        drop(stale);
        assert_eq!(tree.gc_watermark(), 6, "all writes visible to every read: collect");
    }

    #[test]
    fn unpublished_writes_hold_back_garbage_collection() {
        let dir = tempfile::tempdir().unwrap();
        let index = Index::open(dir.path(), small()).unwrap();
        let tree = index.tree("t").unwrap();
        assert_eq!(tree.gc_watermark(), super::NO_GC_WATERMARK, "nothing published");
        tree.insert(b"k", b"v1", 1);
        tree.publish(1);
        assert_eq!(tree.gc_watermark(), 2);
        tree.insert(b"k", b"v2", 2);
        assert_eq!(tree.gc_watermark(), super::NO_GC_WATERMARK);
        tree.flush(2, 2).unwrap();
        for i in 0..3 {
            tree.flush(3 + i, 2).unwrap();
            tree.maybe_compact(Layout::Leveled).unwrap();
        }
        assert_eq!(tree.get(b"k").unwrap().as_deref(), Some(&b"v1"[..]));
        tree.publish(2);
        assert_eq!(tree.get(b"k").unwrap().as_deref(), Some(&b"v2"[..]));
    }
}
