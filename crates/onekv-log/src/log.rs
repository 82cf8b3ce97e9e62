//! [`Log`]: the handle callers use: open, append, read, iterate, reclaim, counters.
//!
//! The log owns the segment table (which files exist and how much of each is durable) and the
//! writer thread (see `writer`). Reads never wait for the writer: they look up the segment, check
//! the locator against the durable end published by the writer, and `pread` exactly those bytes.

use crate::config::{LogConfig, OpenOptions};
use crate::io::{Dir, File, FsDir};
use crate::iter::LogIter;
use crate::record::{self, Decoded, Place, RECORD_HEADER_LEN, RecordKind};
use crate::recovery::{self, RecoveryReport};
use crate::recycle::FreeFiles;
use crate::segment::{self, SEGMENT_HEADER_LEN};
use crate::stats::{Counters, LogStats};
use crate::writer::{self, Queue, Request};
use crate::{Locator, LogError, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, mpsc};
use std::thread::JoinHandle;

/// One segment file and how much of it is durable.
#[derive(Debug)]
pub(crate) struct Segment {
    pub base: u64,
    pub file: Arc<dyn File>,
    /// The salt its records carry (`segment`).
    pub salt: u16,
    durable_len: AtomicU64,
}

impl Segment {
    pub fn new(base: u64, file: Arc<dyn File>, durable_len: u64, salt: u16) -> Self {
        Self { base, file, salt, durable_len: AtomicU64::new(durable_len) }
    }

    /// Where the record starting at `position` (in this segment) is, as its checksum binds it.
    pub fn place(&self, position: u64) -> Place {
        Place { position, salt: self.salt }
    }

    pub fn durable_len(&self) -> u64 {
        self.durable_len.load(Ordering::Acquire)
    }

    pub fn set_durable_len(&self, len: u64) {
        self.durable_len.store(len, Ordering::Release);
    }

    pub fn durable_end(&self) -> u64 {
        self.base + self.durable_len()
    }

    pub fn name(&self) -> String {
        segment::file_name(self.base)
    }
}

/// State shared by the handle, the writer thread and iterators.
pub(crate) struct Shared {
    pub dir: Arc<dyn Dir>,
    pub config: LogConfig,
    pub counters: Counters,
    /// Reclaimed segment files kept for reuse.
    pub free: FreeFiles,
    segments: RwLock<BTreeMap<u64, Arc<Segment>>>,
    queue: Mutex<Queue>,
    /// Wakes the writer: work queued, or closing.
    pub work: Condvar,
    /// Wakes appenders waiting for queue space.
    pub space: Condvar,
}

impl Shared {
    pub fn lock_queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn segments(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<u64, Arc<Segment>>> {
        self.segments.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn add_segment(&self, segment: Arc<Segment>) {
        let mut segments = self.segments.write().unwrap_or_else(|e| e.into_inner());
        segments.insert(segment.base, segment);
    }

    /// The segment holding `position`, if the position is in the log.
    pub fn segment_at(&self, position: u64) -> Option<Arc<Segment>> {
        let segments = self.segments();
        let (_, seg) = segments.range(..=position).next_back()?;
        (position <= seg.durable_end()).then(|| seg.clone())
    }

    /// The segment starting at `base`, if any.
    pub fn segment_starting_at(&self, base: u64) -> Option<Arc<Segment>> {
        self.segments().get(&base).cloned()
    }

    pub fn first_position(&self) -> u64 {
        self.segments().values().next().map_or(0, |s| s.base)
    }

    pub fn end_position(&self) -> u64 {
        self.segments().values().next_back().map_or(0, |s| s.durable_end())
    }
}

/// One segment as [`Log::segments`] lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// The segment's first position.
    pub base: u64,
    /// Bytes durable in it, its header included.
    pub len: u64,
}

impl SegmentInfo {
    /// One past its last durable byte.
    pub fn end(&self) -> u64 {
        self.base + self.len
    }
}

/// The result of [`Log::reclaim_below`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// Segments taken out of the log (their files deleted, or kept for reuse).
    pub segments: u64,
    /// Bytes of log those segments held.
    pub bytes: u64,
}

/// The node's one log. Share it between threads behind an `Arc`; dropping it waits for queued
/// appends to finish.
pub struct Log {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("dir", &self.shared.dir)
            .field("first_position", &self.first_position())
            .field("end_position", &self.end_position())
            .finish()
    }
}

impl Log {
    /// Opens the log in the directory at `path` (created if missing) on the real file system.
    pub fn open_path(
        path: impl AsRef<Path>,
        config: LogConfig,
        options: OpenOptions,
    ) -> Result<(Log, RecoveryReport)> {
        // Checked here too so that a bad configuration does not even create the directory.
        config.validate()?;
        let path = path.as_ref();
        let dir = FsDir::create_all(path)
            .map_err(|e| LogError::io(format!("creating the log directory {}", path.display()), e))?;
        Self::open(Arc::new(dir), config, options)
    }

    /// Opens the log in `dir`, creating it if the directory holds no segment. Recovers from a crash
    /// as `docs/design/log-format.md` describes: a torn last write is cut off; damage the log can
    /// prove was durable is a [`LogError::Corruption`] unless `options.truncate_at` says where to
    /// cut.
    pub fn open(dir: Arc<dyn Dir>, config: LogConfig, options: OpenOptions) -> Result<(Log, RecoveryReport)> {
        config.validate()?;
        let counters = Counters::default();
        let keep_free = config.recycled_segments as usize;
        let (found, report) =
            recovery::recover(&*dir, &options, config.max_record_bytes, keep_free, &counters)?;
        let segments: BTreeMap<u64, Arc<Segment>> = found
            .segments
            .into_iter()
            .map(|s| (s.base, Arc::new(Segment::new(s.base, s.file, s.len, s.salt))))
            .collect();
        let active = segments.values().next_back().expect("recovery returns at least one segment").clone();
        // A kept file is held by a handle of its old segment, as a reclaimed one is (`recycle`).
        let free = found.free.into_iter().map(|f| Arc::new(Segment::new(f.old_base, f.file, 0, 0))).collect();
        let shared = Arc::new(Shared {
            dir,
            config,
            counters,
            free: FreeFiles::new(keep_free, free),
            segments: RwLock::new(segments),
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            space: Condvar::new(),
        });
        let writer_shared = shared.clone();
        let writer = std::thread::Builder::new()
            .name("onekv-log-writer".into())
            .spawn(move || writer::run(writer_shared, active))
            .map_err(|e| LogError::io("starting the log writer thread", e))?;
        Ok((Log { shared, writer: Some(writer) }, report))
    }

    /// Queues `records` to be appended as one unit and returns at once; `done` runs on the writer
    /// thread when they are durable (with one locator per record, naming its payload) or have
    /// failed. Records of one call are contiguous and in order; calls are appended in the order they
    /// were queued. `done` must not block: it holds up every later append.
    ///
    /// Blocks only while the queue is full (`LogConfig::max_queued_bytes`). An `Err` return means
    /// nothing was queued and `done` will not run. An empty `records` completes at once, on the
    /// calling thread.
    pub fn submit<F>(&self, records: Vec<(RecordKind, Vec<u8>)>, done: F) -> Result<()>
    where
        F: FnOnce(Result<Vec<Locator>>) + Send + 'static,
    {
        let config = &self.shared.config;
        let mut framed_len = 0u64;
        for (_, payload) in &records {
            if payload.len() as u64 > u64::from(config.max_record_bytes) {
                return Err(LogError::RecordTooLarge {
                    len: payload.len() as u64,
                    max: config.max_record_bytes,
                });
            }
            framed_len += (RECORD_HEADER_LEN + payload.len()) as u64;
        }
        if framed_len > config.max_queued_bytes {
            return Err(LogError::BatchTooLarge { len: framed_len, max: config.max_queued_bytes });
        }
        if records.is_empty() {
            done(Ok(Vec::new()));
            return Ok(());
        }
        let mut queue = self.shared.lock_queue();
        loop {
            if let Some(cause) = &queue.failed {
                return Err(LogError::Failed { cause: cause.clone() });
            }
            if queue.closing {
                return Err(LogError::Closed);
            }
            if queue.queued_bytes + framed_len <= config.max_queued_bytes {
                break;
            }
            queue = self.shared.space.wait(queue).unwrap_or_else(|e| e.into_inner());
        }
        queue.queued_bytes += framed_len;
        queue.requests.push_back(Request { records, framed_len, done: Box::new(done) });
        drop(queue);
        self.shared.work.notify_one();
        Ok(())
    }

    /// Appends `records` and waits until they are durable; returns one locator per record, naming
    /// its payload. Concurrent callers share writes and fsyncs.
    pub fn append(&self, records: &[(RecordKind, &[u8])]) -> Result<Vec<Locator>> {
        let owned = records.iter().map(|(kind, payload)| (*kind, payload.to_vec())).collect();
        let (tx, rx) = mpsc::sync_channel(1);
        self.submit(owned, move |result| {
            let _ = tx.send(result);
        })?;
        rx.recv().unwrap_or(Err(LogError::Closed))
    }

    /// [`Log::append`] for a batch of any total size: records are appended in as many group commits
    /// as needed to keep each under half of `max_queued_bytes` (each record must still fit
    /// `max_record_bytes`), so a large batch slows its caller instead of being refused. Records
    /// become durable in order; after an error a prefix of them may be durable.
    pub fn append_in_parts(&self, records: &[(RecordKind, &[u8])]) -> Result<Vec<Locator>> {
        let part_bytes = (self.shared.config.max_queued_bytes / 2).max(1);
        let mut locators = Vec::with_capacity(records.len());
        let mut start = 0;
        while start < records.len() {
            let mut end = start;
            let mut bytes = 0u64;
            while end < records.len() {
                let framed = (RECORD_HEADER_LEN + records[end].1.len()) as u64;
                if end > start && bytes + framed > part_bytes {
                    break;
                }
                bytes += framed;
                end += 1;
            }
            locators.extend(self.append(&records[start..end])?);
            start = end;
        }
        Ok(locators)
    }

    /// Reads exactly the bytes `locator` names (one positional read, no checksum: the locator may
    /// name part of a record). Use [`Log::read_record`] for a whole record.
    pub fn read(&self, locator: Locator) -> Result<Vec<u8>> {
        let len = usize::try_from(locator.len).map_err(|_| self.out_of_range(locator))?;
        let segment = self.readable_segment(locator)?;
        let mut buf = vec![0u8; len];
        segment
            .file
            .read_exact_at(&mut buf, locator.position - segment.base)
            .map_err(|e| LogError::io(format!("reading {locator} from {}", segment.name()), e))?;
        Ok(buf)
    }

    /// Reads the whole record whose payload `locator` names (as returned by an append), verifying
    /// its checksum; returns its kind and payload.
    pub fn read_record(&self, locator: Locator) -> Result<(RecordKind, Vec<u8>)> {
        let start =
            locator.position.checked_sub(RECORD_HEADER_LEN as u64).ok_or(LogError::NotARecord(locator))?;
        let framed = Locator::new(start, locator.len + RECORD_HEADER_LEN as u64);
        let segment = self.readable_segment(framed)?;
        let bytes = self.read(framed)?;
        // A header that does not even claim this payload (wrong magic or length) means the locator
        // is not a whole record; a header that claims it but does not verify is damage.
        let claimed_len = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
        if bytes[..4] != record::RECORD_MAGIC || u64::from(claimed_len) != locator.len {
            return Err(LogError::NotARecord(locator));
        }
        match record::decode(segment.place(start), &bytes, self.shared.config.max_record_bytes) {
            Decoded::Record { kind, .. } => Ok((kind, bytes[RECORD_HEADER_LEN..].to_vec())),
            Decoded::Incomplete | Decoded::Invalid(_) => Err(LogError::Corruption {
                segment: segment.name(),
                position: start,
                reason: "record does not verify".into(),
            }),
        }
    }

    /// Iterates over the durable records from `position`, which must be where a record starts (a
    /// payload locator's position minus [`crate::RECORD_HEADER_LEN`]) or the base of a segment
    /// ([`Log::first_position`] starts at the beginning). Records appended while iterating are
    /// seen if they are durable by the time the iterator gets there.
    pub fn iter_from(&self, position: u64) -> LogIter {
        LogIter::new(self.shared.clone(), position)
    }

    /// Reads every record of the log and checks its checksum; returns the number of records, or the
    /// first damage found.
    pub fn verify(&self) -> Result<u64> {
        let mut records = 0;
        for entry in self.iter_from(self.first_position()) {
            entry?;
            records += 1;
        }
        Ok(records)
    }

    /// Takes every whole segment that ends at or below `position` out of the log (never the segment
    /// being appended to): its file is deleted, or kept to become a later segment
    /// (`LogConfig::recycled_segments`). Positions are never renumbered: locators into the
    /// remaining segments stay valid; reads below the new first position fail with
    /// [`LogError::OutOfRange`]. If the directory sync fails, the log stops taking appends, as after
    /// a failed write.
    pub fn reclaim_below(&self, position: u64) -> Result<Reclaimed> {
        let mut reclaimed = Reclaimed::default();
        loop {
            let doomed = {
                let mut segments = self.shared.segments.write().unwrap_or_else(|e| e.into_inner());
                let mut it = segments.values();
                let (Some(first), Some(_)) = (it.next(), it.next_back()) else {
                    return Ok(reclaimed);
                };
                if first.durable_end() > position {
                    return Ok(reclaimed);
                }
                let base = first.base;
                segments.remove(&base).expect("first exists")
            };
            let name = doomed.name();
            let keep = self.shared.free.wants_more();
            // Oldest first, one directory sync each, so a crash leaves a prefix removed, never a hole.
            let unnamed = if keep {
                let free_name = segment::free_file_name(doomed.base);
                self.shared
                    .dir
                    .rename(&name, &free_name)
                    .map_err(|e| LogError::io(format!("renaming {name} to {free_name}"), e))
            } else {
                self.shared.dir.remove(&name).map_err(|e| LogError::io(format!("removing {name}"), e))
            };
            if let Err(err) = unnamed {
                // The file is still there under its name (a rename or unlink fails whole): it goes
                // back into the log, or a later reclamation would leave a hole before it.
                self.shared.add_segment(doomed);
                return Err(err);
            }
            if let Err(err) = recovery::sync_dir(&*self.shared.dir, &self.shared.counters) {
                return Err(self.stop_appends(err));
            }
            self.shared.counters.segment_reclaimed();
            reclaimed.segments += 1;
            reclaimed.bytes += doomed.durable_len();
            if keep {
                self.shared.free.keep(doomed);
            }
        }
    }

    /// Turns the reuse of reclaimed segment files on or off (it is on when
    /// `LogConfig::recycled_segments` is above 0). Off, the kept files are deleted (any a reader
    /// still holds, at a later call) and reclaimed files are deleted again; returns the bytes
    /// deleted. For a node whose disk is nearly full: kept files hold space.
    /// If deleting fails, the log stops taking appends, as after a failed write (the directory's
    /// state is unknown).
    pub fn set_recycling(&self, on: bool) -> Result<u64> {
        self.shared
            .free
            .set_enabled(on, &*self.shared.dir, &self.shared.counters)
            .map_err(|err| self.stop_appends(err))
    }

    /// Records `err` as the log's failure after a failed directory operation: the directory's state
    /// is unknown and a later sync (a segment roll) must not pass for a retry, so the log stops
    /// taking appends, as after a failed write. Returns `err`.
    fn stop_appends(&self, err: LogError) -> LogError {
        self.shared.lock_queue().failed.get_or_insert_with(|| Arc::new(err.clone()));
        self.shared.work.notify_all();
        self.shared.space.notify_all();
        err
    }

    /// Reclaimed segment files kept for reuse now.
    pub fn free_files(&self) -> usize {
        self.shared.free.len()
    }

    /// Every segment now in the log, oldest first: its base position and durable length. The last
    /// one is the segment being appended to.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.shared.segments().values().map(|s| SegmentInfo { base: s.base, len: s.durable_len() }).collect()
    }

    /// First position still in the log.
    pub fn first_position(&self) -> u64 {
        self.shared.first_position()
    }

    /// Position after the last durable record: where the next append will go (unless it rolls to
    /// a new segment).
    pub fn end_position(&self) -> u64 {
        self.shared.end_position()
    }

    /// The counters since this log was opened.
    pub fn stats(&self) -> LogStats {
        self.shared.counters.snapshot()
    }

    /// The configuration the log runs with.
    pub fn config(&self) -> &LogConfig {
        &self.shared.config
    }

    /// Finishes queued appends, stops the writer, and reports the failure that stopped the log,
    /// if one did.
    pub fn close(mut self) -> Result<()> {
        self.stop_writer();
        match &self.shared.lock_queue().failed {
            Some(cause) => Err(LogError::Failed { cause: cause.clone() }),
            None => Ok(()),
        }
    }

    fn stop_writer(&mut self) {
        self.shared.lock_queue().closing = true;
        self.shared.work.notify_all();
        self.shared.space.notify_all();
        if let Some(writer) = self.writer.take() {
            // A panic in the writer is a bug; it has already been reported on stderr.
            let _ = writer.join();
        }
    }

    fn out_of_range(&self, locator: Locator) -> LogError {
        LogError::OutOfRange { locator, first: self.first_position(), end: self.end_position() }
    }

    /// The segment that holds all of `locator`'s bytes, durably.
    fn readable_segment(&self, locator: Locator) -> Result<Arc<Segment>> {
        let segment = self.shared.segment_at(locator.position).ok_or_else(|| self.out_of_range(locator))?;
        let inside = locator.position >= segment.base + SEGMENT_HEADER_LEN as u64
            && locator.position.checked_add(locator.len).is_some_and(|end| end <= segment.durable_end());
        if !inside {
            return Err(self.out_of_range(locator));
        }
        Ok(segment)
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        self.stop_writer();
    }
}
