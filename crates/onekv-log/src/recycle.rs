//! Recycled segment files: a reclaimed segment's file kept to become a later segment.
//!
//! Why: appending to a file that grows makes every group commit's `fdatasync` also write the
//! file's metadata (its new size and freshly allocated blocks; through the journal on a
//! journalling file system). Overwriting blocks a file already has changes no metadata: measured
//! with `onekv bench-log --recycled` (`docs/benchmarks/log.md`), fsyncs take about half as long
//! and appends go 1.4–1.9× faster. `fallocate` does not help: writing into its unwritten extents
//! changes metadata like growth (`docs/benchmarks/profile.md`). So the log keeps up to `LogConfig::recycled_segments` reclaimed files
//! under a free name (`segment::free_file_name`) and gives the next segment one of them.
//!
//! What keeps it safe:
//! - A free file is reused only when nobody still holds its old segment (a reader that looked the
//!   segment up before it was reclaimed, or an iterator parked on it): the pool keeps the old
//!   [`Segment`] handle and takes a file only while it holds the last reference, so a late read
//!   never sees bytes of the new segment.
//! - Reuse writes and fsyncs the new header under the free name first, then renames the file into
//!   place and fsyncs the directory: a file named as a segment always starts with its own header.
//! - The old records left after the new ones carry another salt (`segment`), so recovery never
//!   takes them for records of the new segment, and cuts them off like a torn tail.
//! - A segment is cut to its data when it is sealed (`seal`), before its successor exists, so
//!   every sealed segment still ends exactly where the next begins.
//! - While the node's disk is nearly full, recycling stops and the pool is emptied
//!   ([`FreeFiles::set_enabled`]): kept files would hold space the alarm waits for.
//!
//! This module does not decide what is reclaimed (callers of `Log::reclaim_below` do) and does not
//! write records.

use crate::io::{Dir, File};
use crate::log::Segment;
use crate::recovery::{sync_dir, truncate, write_header};
use crate::segment;
use crate::stats::Counters;
use crate::{LogError, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The reclaimed files waiting for reuse.
pub(crate) struct FreeFiles {
    limit: usize,
    enabled: AtomicBool,
    /// Old segments whose files are kept, oldest first.
    kept: Mutex<Vec<Arc<Segment>>>,
}

impl FreeFiles {
    /// A pool of at most `limit` files, holding `found` (free files recovery found, as handles of
    /// their old segments).
    pub fn new(limit: usize, found: Vec<Arc<Segment>>) -> Self {
        Self { limit, enabled: AtomicBool::new(limit > 0), kept: Mutex::new(found) }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Arc<Segment>>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many files are kept now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether a reclaimed segment's file should be kept rather than deleted.
    pub fn wants_more(&self) -> bool {
        self.enabled.load(Ordering::Acquire) && self.lock().len() < self.limit
    }

    /// Keeps the file of `reclaimed`, whose name has been changed to its free name.
    pub fn keep(&self, reclaimed: Arc<Segment>) {
        self.lock().push(reclaimed);
    }

    /// Takes a kept file nobody reads any more, if there is one.
    fn take_unread(&self) -> Option<Arc<Segment>> {
        let mut kept = self.lock();
        // The pool's own reference is the only one left: no reader can reach the segment again,
        // since it left the segment table when it was reclaimed.
        let i = kept.iter().position(|old| Arc::strong_count(old) == 1)?;
        // Pairs with the release of the last reader's drop: its reads happened before the reuse.
        std::sync::atomic::fence(Ordering::Acquire);
        Some(kept.remove(i))
    }

    /// Turns recycling on or off. Off, every kept file nobody reads is deleted at once (the rest
    /// as soon as a later call finds them unread) and reclaimed files are deleted again. Returns
    /// the bytes of the files deleted; on an error the caller stops the log (a file may be gone
    /// from the pool but not from the directory, and the directory is not synced).
    pub fn set_enabled(&self, on: bool, dir: &dyn Dir, counters: &Counters) -> Result<u64> {
        self.enabled.store(on && self.limit > 0, Ordering::Release);
        if on {
            return Ok(0);
        }
        let mut freed = 0;
        while let Some(old) = self.take_unread() {
            let name = segment::free_file_name(old.base);
            let len =
                old.file.size().map_err(|e| LogError::io(format!("reading the length of {name}"), e))?;
            dir.remove(&name).map_err(|e| LogError::io(format!("removing {name}"), e))?;
            freed += len;
        }
        if freed > 0 {
            sync_dir(dir, counters)?;
        }
        Ok(freed)
    }

    /// A file for the new segment at `base`: a kept one, its header rewritten and renamed into
    /// place, or `None` if none can be reused now (the caller creates one).
    pub fn reuse(&self, dir: &dyn Dir, base: u64, counters: &Counters) -> Result<Option<Arc<dyn File>>> {
        if !self.enabled.load(Ordering::Acquire) {
            return Ok(None);
        }
        let Some(old) = self.take_unread() else {
            return Ok(None);
        };
        let from = segment::free_file_name(old.base);
        let to = segment::file_name(base);
        write_header(&*old.file, base, &from, counters)?;
        dir.rename(&from, &to).map_err(|e| LogError::io(format!("renaming {from} to {to}"), e))?;
        sync_dir(dir, counters)?;
        counters.segment_reused();
        Ok(Some(old.file.clone()))
    }
}

/// Cuts `sealed`'s file to the data it holds, durably, if it is longer (a recycled file keeps its
/// old bytes after the new ones). Called before the next segment is created.
pub(crate) fn seal(sealed: &Segment, counters: &Counters) -> Result<()> {
    let name = sealed.name();
    let len = sealed.durable_len();
    let size = sealed.file.size().map_err(|e| LogError::io(format!("reading the length of {name}"), e))?;
    if size > len {
        truncate(&*sealed.file, &name, len, counters)?;
    }
    Ok(())
}
