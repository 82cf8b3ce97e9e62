//! What a replica does about a filling disk: the free-space monitor behind the "disk full" alarm
//! (etcd's NOSPACE alarm), the reserve file given up when the disk is nearly full (TiKV's space
//! placeholder), and handing leadership away while the alarm is raised.
//!
//! - **Monitor.** The free space of the data directory's file system (`statvfs`, the bytes an
//!   unprivileged writer may still use) is read at most every [`CHECK_INTERVAL`], from the node
//!   loop's ticks, never per request. The configured reserve counts as used even while it is not
//!   held, so giving it up (or failing to re-create it) never clears the alarm by itself: *usable*
//!   = available − (reserve configured − reserve held). Below `min_free_bytes` usable bytes the
//!   alarm is raised: the leader refuses new writes at once ([`crate::ReplicaError::DiskFull`]),
//!   and reads go on. The alarm clears by itself once space is freed; no restart is needed.
//! - **Reserve.** `DATA_DIR/RESERVED` holds `reserve_bytes` of allocated space (fallocate, or real
//!   bytes where the file system cannot allocate), created at open when usable space would stay at
//!   or above the threshold, fsynced with its directory. It is deleted when usable space falls below
//!   half of `min_free_bytes` (the hard floor) and whenever the replica fails, so that the index
//!   flush, the final hard state and a later recovery still find room; it comes back at the next
//!   open when space allows.
//! - **Kept log files.** The logs keep a few reclaimed segment files to reuse (cheaper fsyncs,
//!   `onekv_log::LogConfig::recycled_segments`). While the alarm is raised they keep none: the kept
//!   files are deleted when it is raised (one a reader still holds, at a later check), since the
//!   space they hold is what the alarm waits for, and keeping resumes when it clears.
//! - **Leadership.** A leader in alarm hands leadership to its most caught-up, recently active
//!   follower (raft-rs `transfer_leader`), at most once per election timeout, so the cluster keeps
//!   taking writes through a node that has room. A follower in alarm keeps appending what the
//!   leader sends for as long as it can; if an append then fails (ENOSPC), the replica fails as on
//!   any storage failure and the others carry on.
//!
//! Replicas driven by the simulation ([`crate::Replica::open_driven`]) run without a monitor or
//! reserve: their logs live on simulated disks, and the host's free space must not change a
//! replayed run.
//!
//! This module does not own the loop (`node` calls [`on_tick`]), the refusal of proposals (the
//! handle in `replica` asks [`DiskSpace::alarm`]) nor what a storage failure does (`node`).

use crate::DiskStatus;
use crate::group::Group;
use crate::node::NodeCtx;
use raft::StateRole;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The reserve file, in the data directory.
pub const RESERVE_FILE: &str = "RESERVED";
/// Where the reserve is built before it is renamed into place, so a crash while creating it never
/// leaves a short reserve that looks complete.
const RESERVE_TMP: &str = "RESERVED.tmp";
/// How often at most the free space is read: a disk written at 400 MB/s loses 100 MB between two
/// readings, well inside the default threshold of 256 MiB; and a `statvfs` four times a second
/// costs nothing.
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_millis(250);
/// Bytes written at a time where the reserve is filled with real bytes.
const FILL_CHUNK: usize = 1 << 20;

/// Space of the file system holding the data directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Space {
    /// Bytes an unprivileged writer may still allocate.
    pub available: u64,
    /// Size of the file system.
    pub total: u64,
}

/// Reads the space of the file system holding a directory.
pub(crate) type Probe = Box<dyn Fn(&Path) -> io::Result<Space> + Send + Sync>;

/// The real probe: `statvfs(2)`. `f_bavail` rather than `f_bfree`: blocks kept for root do not
/// count, so the alarm trips before an unprivileged node would see ENOSPC.
pub(crate) fn statvfs(dir: &Path) -> io::Result<Space> {
    let stat = rustix::fs::statvfs(dir).map_err(io::Error::from)?;
    Ok(Space {
        available: stat.f_bavail.saturating_mul(stat.f_frsize),
        total: stat.f_blocks.saturating_mul(stat.f_frsize),
    })
}

/// One replica's view of its disk, shared by the loop (which refreshes it) and the handle (which
/// refuses writes while the alarm is raised).
pub(crate) struct DiskSpace {
    dir: PathBuf,
    min_free_bytes: u64,
    reserve_bytes: u64,
    interval: Duration,
    /// `None`: no monitor (a simulated replica).
    probe: Option<Probe>,
    /// Mirrors `watch.alarm.is_some()`, so the write path reads one atomic while all is well.
    alarmed: AtomicBool,
    watch: Mutex<Watch>,
    /// The node's logs, told to stop keeping reclaimed files while the alarm is raised.
    logs: Mutex<Vec<Arc<onekv_log::Log>>>,
}

#[derive(Default)]
struct Watch {
    checked_at: Option<Instant>,
    space: Option<Space>,
    reserve_held: u64,
    alarm: Option<String>,
    /// The last probe error, logged once rather than every check.
    probe_error: Option<String>,
    /// When leadership was last handed away.
    handed_off_at: Option<Instant>,
}

impl DiskSpace {
    /// The monitor of `dir`, with the reserve set up: kept if it is whole, created (or completed)
    /// when usable space would stay at or above `min_free_bytes`, removed if `reserve_bytes` is 0.
    /// Never fails: a node whose disk is full must still start (to serve reads and to recover once
    /// space is freed), so trouble with the reserve is logged and shown in status instead.
    pub fn open(
        dir: &Path,
        min_free_bytes: u64,
        reserve_bytes: u64,
        interval: Duration,
        probe: Probe,
    ) -> Self {
        let disk = DiskSpace {
            dir: dir.to_path_buf(),
            min_free_bytes,
            reserve_bytes,
            interval,
            probe: Some(probe),
            alarmed: AtomicBool::new(false),
            watch: Mutex::new(Watch::default()),
            logs: Mutex::default(),
        };
        let held = disk.set_up_reserve();
        disk.lock().reserve_held = held;
        disk.check(&mut disk.lock(), None);
        disk
    }

    /// No monitor and no reserve: never alarms.
    pub fn disabled(dir: &Path) -> Self {
        DiskSpace {
            dir: dir.to_path_buf(),
            min_free_bytes: 0,
            reserve_bytes: 0,
            interval: CHECK_INTERVAL,
            probe: None,
            alarmed: AtomicBool::new(false),
            watch: Mutex::new(Watch::default()),
            logs: Mutex::default(),
        }
    }

    /// Makes the alarm also govern whether `logs` keep reclaimed segment files (see the module
    /// docs); applies the alarm's current state at once.
    pub fn govern_recycling(&self, logs: Vec<Arc<onekv_log::Log>>) {
        let alarmed = self.alarmed.load(Ordering::SeqCst);
        *self.logs.lock().unwrap_or_else(|e| e.into_inner()) = logs;
        if alarmed {
            self.set_recycling(false);
        }
    }

    fn set_recycling(&self, on: bool) {
        for log in self.logs.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            match log.set_recycling(on) {
                Ok(0) => {}
                Ok(freed) => tracing::warn!(freed, "disk full: deleted the log's kept segment files"),
                // The log stops taking appends after a failed directory sync; the replica fails
                // at its next write, as on any storage failure.
                Err(error) => tracing::error!(%error, "disk full: deleting the log's kept segment files"),
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Watch> {
        self.watch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the free space again if the last reading is at least the check interval old (as of
    /// `now`); returns whether it did.
    pub fn refresh(&self, now: Instant) -> bool {
        if self.probe.is_none() {
            return false;
        }
        let mut watch = self.lock();
        if watch.checked_at.is_some_and(|at| now.saturating_duration_since(at) < self.interval) {
            return false;
        }
        self.check(&mut watch, Some(now));
        true
    }

    /// Reads the free space, gives up the reserve below the hard floor, and raises or clears the
    /// alarm.
    fn check(&self, watch: &mut Watch, now: Option<Instant>) {
        let Some(probe) = &self.probe else { return };
        watch.checked_at = now.or(watch.checked_at);
        let space = match probe(&self.dir) {
            Ok(space) => {
                watch.probe_error = None;
                space
            }
            Err(error) => {
                // Keep the last reading (and the alarm as it was): a failing statvfs says nothing
                // about the space.
                let error = error.to_string();
                if watch.probe_error.as_ref() != Some(&error) {
                    tracing::warn!(dir = %self.dir.display(), %error, "cannot read the free disk space");
                    watch.probe_error = Some(error);
                }
                return;
            }
        };
        watch.space = Some(space);
        let usable = self.usable(space, watch.reserve_held);
        if watch.reserve_held > 0 && usable < self.min_free_bytes / 2 {
            self.release(watch, &format!("{usable} usable bytes left, below half of min_free_bytes"));
        }
        let alarm = (self.min_free_bytes > 0 && usable < self.min_free_bytes).then(|| {
            format!(
                "{} has {usable} bytes free (the reserve aside), below min_free_bytes = {}; new writes \
                 are refused until space is freed",
                self.dir.display(),
                self.min_free_bytes
            )
        });
        match (&watch.alarm, &alarm) {
            (None, Some(alarm)) => {
                tracing::error!(%alarm, "disk full: alarm raised");
                self.set_recycling(false);
            }
            (Some(_), None) => {
                tracing::warn!(usable, "disk space freed: alarm cleared");
                self.set_recycling(true);
            }
            // Kept files a reader held when the alarm was raised go once it lets them go.
            (Some(_), Some(_)) => self.set_recycling(false),
            (None, None) => {}
        }
        self.alarmed.store(alarm.is_some(), Ordering::SeqCst);
        watch.alarm = alarm;
    }

    /// Available bytes minus the part of the reserve not held: what the node may use before it
    /// eats into the space the reserve stands for.
    fn usable(&self, space: Space, reserve_held: u64) -> u64 {
        space.available.saturating_sub(self.reserve_bytes.saturating_sub(reserve_held))
    }

    /// The alarm, while it is raised.
    pub fn alarm(&self) -> Option<String> {
        if !self.alarmed.load(Ordering::SeqCst) {
            return None;
        }
        self.lock().alarm.clone()
    }

    /// Deletes the reserve, if held, logging `why`.
    pub fn release_reserve(&self, why: &str) {
        let mut watch = self.lock();
        self.release(&mut watch, why);
    }

    fn release(&self, watch: &mut Watch, why: &str) {
        if watch.reserve_held == 0 {
            return;
        }
        let path = self.dir.join(RESERVE_FILE);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::error!(path = %path.display(), %error, "cannot delete the disk reserve");
                return;
            }
        }
        // The space is free once the file is unlinked; the directory sync only makes that survive
        // a crash, so its failure is no reason to keep counting the reserve as held.
        let _ = sync_dir(&self.dir);
        tracing::warn!(bytes = watch.reserve_held, why, "released the disk reserve");
        watch.reserve_held = 0;
    }

    /// What status shows.
    pub fn status(&self) -> DiskStatus {
        let watch = self.lock();
        let space = watch.space.unwrap_or(Space { available: 0, total: 0 });
        DiskStatus {
            free_bytes: space.available,
            total_bytes: space.total,
            min_free_bytes: self.min_free_bytes,
            reserve_bytes: watch.reserve_held,
            alarm: watch.alarm.clone(),
        }
    }

    /// Whether leadership may be handed away at `now`: not within `wait` of the last hand-off (the
    /// time raft-rs gives one transfer before aborting it), so a transfer is never cut short and a
    /// cluster whose disks are all full does not pass leadership around every tick.
    fn may_hand_off(&self, now: Instant, wait: Duration) -> bool {
        let mut watch = self.lock();
        if watch.handed_off_at.is_some_and(|at| now.saturating_duration_since(at) < wait) {
            return false;
        }
        watch.handed_off_at = Some(now);
        true
    }

    /// Makes the reserve whole if space allows; returns the bytes held.
    fn set_up_reserve(&self) -> u64 {
        let path = self.dir.join(RESERVE_FILE);
        let tmp = self.dir.join(RESERVE_TMP);
        if let Err(error) = fs::remove_file(&tmp)
            && error.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %tmp.display(), %error, "cannot delete a half-built disk reserve");
        }
        let existing = fs::metadata(&path).ok().map(|meta| meta.len());
        if existing == Some(self.reserve_bytes) && self.reserve_bytes > 0 {
            return self.reserve_bytes;
        }
        if existing.is_some() {
            // Of another size (the setting changed, or it is 0 now): start again.
            if let Err(error) = fs::remove_file(&path).and_then(|()| sync_dir(&self.dir)) {
                tracing::warn!(path = %path.display(), %error, "cannot delete the old disk reserve");
                return 0;
            }
        }
        if self.reserve_bytes == 0 {
            return 0;
        }
        let Some(probe) = &self.probe else { return 0 };
        let available = match probe(&self.dir) {
            Ok(space) => space.available,
            Err(error) => {
                tracing::warn!(%error, "cannot read the free disk space; no disk reserve this time");
                return 0;
            }
        };
        if available < self.reserve_bytes.saturating_add(self.min_free_bytes) {
            tracing::warn!(
                available,
                reserve_bytes = self.reserve_bytes,
                min_free_bytes = self.min_free_bytes,
                "not enough free space for the disk reserve; it is created at a later start"
            );
            return 0;
        }
        match create_reserve(&tmp, self.reserve_bytes).and_then(|()| {
            fs::rename(&tmp, &path)?;
            sync_dir(&self.dir)
        }) {
            Ok(()) => {
                tracing::info!(bytes = self.reserve_bytes, path = %path.display(), "disk reserve created");
                self.reserve_bytes
            }
            Err(error) => {
                let _ = fs::remove_file(&tmp);
                tracing::warn!(%error, "cannot create the disk reserve; running without one");
                0
            }
        }
    }
}

/// Writes a reserve file of `len` bytes at `path`, fsynced. Allocation is enough (the blocks are
/// taken and count as used); where the file system cannot allocate, real bytes are written, and
/// not zeros, which a compressing file system would store in nothing.
fn create_reserve(path: &Path, len: u64) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).create_new(true).open(path)?;
    match rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, len) {
        Ok(()) => {}
        Err(error) if error == rustix::io::Errno::NOSPC => return Err(error.into()),
        Err(_) => fill(&mut file, len)?,
    }
    file.sync_all()
}

/// Writes `len` pseudo-random bytes.
fn fill(file: &mut File, len: u64) -> io::Result<()> {
    let mut chunk = vec![0u8; FILL_CHUNK];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for word in chunk.chunks_mut(8) {
        // xorshift64: cheap, and incompressible enough.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        word.copy_from_slice(&state.to_le_bytes()[..word.len()]);
    }
    let mut left = len;
    while left > 0 {
        let n = left.min(FILL_CHUNK as u64) as usize;
        file.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The loop's hook, on each tick: refreshes the free space, gives up the reserve once the node has
/// failed (it writes nothing more; the space lets the disk's other writers and a later recovery go
/// on), and hands leadership of every group this node leads away while the alarm is raised.
pub(crate) fn on_tick<'a>(ctx: &mut NodeCtx, groups: impl Iterator<Item = &'a mut Group>, now: Instant) {
    let disk = ctx.disk.clone();
    disk.refresh(now);
    if ctx.failed.is_some() {
        disk.release_reserve("the replica failed");
        return;
    }
    if disk.alarm().is_none() {
        return;
    }
    let me = ctx.config.node_id;
    let wait = ctx.config.tick.saturating_mul(ctx.config.election_ticks as u32);
    let mut handing_off = false;
    for group in groups {
        if group.raw.raft.state != StateRole::Leader || group.raw.raft.lead_transferee.is_some() {
            continue;
        }
        // The most caught-up follower takes over soonest.
        let Some(target) = group.successor(me) else { continue };
        // One hand-off round per election timeout for all groups.
        if !handing_off {
            if !disk.may_hand_off(now, wait) {
                return;
            }
            handing_off = true;
        }
        tracing::warn!(shard = group.shard, to = target, "disk full: handing leadership to another node");
        group.hand_leadership_to(target);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::AtomicU64;

    const MIB: u64 = 1 << 20;

    /// A probe reporting `available` bytes (changed by the test) and counting its calls.
    fn fake(available: Arc<AtomicU64>, calls: Arc<AtomicU64>) -> Probe {
        Box::new(move |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok(Space { available: available.load(Ordering::SeqCst), total: 1000 * MIB })
        })
    }

    #[test]
    fn the_alarm_follows_the_threshold_and_clears_by_itself() {
        let dir = tempfile::tempdir().unwrap();
        let available = Arc::new(AtomicU64::new(500 * MIB));
        let calls = Arc::new(AtomicU64::new(0));
        // No reserve: usable = available.
        let disk = DiskSpace::open(dir.path(), 100 * MIB, 0, Duration::ZERO, fake(available.clone(), calls));
        let start = Instant::now();
        assert_eq!(disk.alarm(), None);
        available.store(100 * MIB, Ordering::SeqCst);
        disk.refresh(start);
        assert_eq!(disk.alarm(), None, "exactly the threshold is not below it");
        available.store(100 * MIB - 1, Ordering::SeqCst);
        disk.refresh(start);
        let alarm = disk.alarm().expect("below the threshold");
        assert!(alarm.contains("min_free_bytes = 104857600"), "{alarm}");
        assert_eq!(disk.status().alarm, Some(alarm));
        assert_eq!(disk.status().free_bytes, 100 * MIB - 1);
        available.store(300 * MIB, Ordering::SeqCst);
        disk.refresh(start);
        assert_eq!(disk.alarm(), None);
        assert_eq!(disk.status().alarm, None);
    }

    #[test]
    fn the_logs_keep_no_reclaimed_files_while_the_alarm_is_raised() {
        let dir = tempfile::tempdir().unwrap();
        let config = onekv_log::LogConfig {
            segment_size_bytes: 64 << 10,
            max_record_bytes: 8 << 10,
            recycled_segments: 2,
            ..onekv_log::LogConfig::default()
        };
        let (log, _) = onekv_log::Log::open_path(dir.path().join("log"), config, Default::default()).unwrap();
        let log = Arc::new(log);
        let record = [(onekv_log::RecordKind::new(1).unwrap(), &[7u8; 4096][..])];
        let fill_and_reclaim = |log: &onekv_log::Log| {
            for _ in 0..64 {
                log.append(&record).unwrap();
            }
            log.reclaim_below(log.segments().last().unwrap().base).unwrap();
        };
        fill_and_reclaim(&log);
        assert_eq!(log.free_files(), 2);
        let available = Arc::new(AtomicU64::new(500 * MIB));
        let calls = Arc::new(AtomicU64::new(0));
        let disk = DiskSpace::open(dir.path(), 100 * MIB, 0, Duration::ZERO, fake(available.clone(), calls));
        disk.govern_recycling(vec![log.clone()]);
        available.store(MIB, Ordering::SeqCst);
        disk.refresh(Instant::now());
        assert!(disk.alarm().is_some());
        assert_eq!(log.free_files(), 0, "kept files deleted when the alarm is raised");
        fill_and_reclaim(&log);
        assert_eq!(log.free_files(), 0, "none kept while it is raised");
        available.store(500 * MIB, Ordering::SeqCst);
        disk.refresh(Instant::now());
        assert_eq!(disk.alarm(), None);
        fill_and_reclaim(&log);
        assert_eq!(log.free_files(), 2, "kept again once it clears");
    }

    #[test]
    fn zero_disables_the_alarm() {
        let dir = tempfile::tempdir().unwrap();
        let available = Arc::new(AtomicU64::new(0));
        let disk =
            DiskSpace::open(dir.path(), 0, 0, Duration::ZERO, fake(available, Arc::new(AtomicU64::new(0))));
        disk.refresh(Instant::now());
        assert_eq!(disk.alarm(), None);
        assert_eq!(DiskSpace::disabled(dir.path()).alarm(), None);
        assert!(!DiskSpace::disabled(dir.path()).refresh(Instant::now()));
    }

    #[test]
    fn the_free_space_is_read_at_most_once_per_interval() {
        let dir = tempfile::tempdir().unwrap();
        let available = Arc::new(AtomicU64::new(500 * MIB));
        let calls = Arc::new(AtomicU64::new(0));
        let interval = Duration::from_millis(250);
        let disk =
            DiskSpace::open(dir.path(), 100 * MIB, 0, interval, fake(available.clone(), calls.clone()));
        let opened = calls.load(Ordering::SeqCst);
        let start = Instant::now();
        assert!(disk.refresh(start));
        // Every 10 ms for a second: four more reads, not a hundred.
        let mut reads = 0;
        for step in 1..=100 {
            reads += u64::from(disk.refresh(start + Duration::from_millis(10 * step)));
        }
        assert_eq!(reads, 4);
        assert_eq!(calls.load(Ordering::SeqCst), opened + 5);
        // A reading is as old as the interval at most: the alarm trips at the next due check.
        available.store(MIB, Ordering::SeqCst);
        assert!(!disk.refresh(start + Duration::from_millis(1010)));
        assert_eq!(disk.alarm(), None);
        assert!(disk.refresh(start + Duration::from_millis(1250)));
        assert!(disk.alarm().is_some());
    }

    #[test]
    fn the_reserve_is_created_kept_and_released() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(RESERVE_FILE);
        let available = Arc::new(AtomicU64::new(500 * MIB));
        let calls = Arc::new(AtomicU64::new(0));
        let open = || {
            DiskSpace::open(
                dir.path(),
                100 * MIB,
                2 * MIB,
                Duration::ZERO,
                fake(available.clone(), calls.clone()),
            )
        };
        let disk = open();
        assert_eq!(fs::metadata(&path).unwrap().len(), 2 * MIB);
        assert_eq!(disk.status().reserve_bytes, 2 * MIB);
        assert!(!dir.path().join(RESERVE_TMP).exists());
        // Kept as it is by the next open.
        drop(disk);
        let disk = open();
        assert_eq!(disk.status().reserve_bytes, 2 * MIB);

        // Between the threshold and the floor: the alarm, but the reserve stays.
        available.store(60 * MIB, Ordering::SeqCst);
        disk.refresh(Instant::now());
        assert!(disk.alarm().is_some());
        assert!(path.exists());
        // Below the floor (half the threshold): the reserve goes, and the alarm stays although
        // the file system now reports its bytes as free.
        available.store(40 * MIB, Ordering::SeqCst);
        disk.refresh(Instant::now());
        assert!(!path.exists());
        assert_eq!(disk.status().reserve_bytes, 0);
        available.store(42 * MIB, Ordering::SeqCst);
        disk.refresh(Instant::now());
        let alarm = disk.alarm().expect("still below the threshold");
        assert!(alarm.contains(&format!("has {} bytes free", 40 * MIB)), "{alarm}");

        // Not re-created while space is short...
        drop(disk);
        let disk = open();
        assert!(!path.exists());
        assert!(disk.alarm().is_some());
        // ...and re-created at the next open once it is back.
        drop(disk);
        available.store(500 * MIB, Ordering::SeqCst);
        let disk = open();
        assert_eq!(fs::metadata(&path).unwrap().len(), 2 * MIB);
        assert_eq!(disk.alarm(), None);

        // Released on demand (a failed replica), once.
        disk.release_reserve("a test");
        assert!(!path.exists());
        disk.release_reserve("a test");
        assert_eq!(disk.status().reserve_bytes, 0);
    }

    #[test]
    fn a_reserve_of_another_size_is_replaced_or_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(RESERVE_FILE);
        fs::write(&path, [7u8; 100]).unwrap();
        fs::write(dir.path().join(RESERVE_TMP), [7u8; 10]).unwrap();
        let disk = DiskSpace::open(dir.path(), 0, MIB, Duration::ZERO, Box::new(statvfs));
        assert_eq!(fs::metadata(&path).unwrap().len(), MIB);
        assert!(!dir.path().join(RESERVE_TMP).exists());
        assert_eq!(disk.status().reserve_bytes, MIB);
        assert!(disk.status().total_bytes > 0);
        drop(disk);
        let disk = DiskSpace::open(dir.path(), 0, 0, Duration::ZERO, Box::new(statvfs));
        assert!(!path.exists());
        assert_eq!(disk.status().reserve_bytes, 0);
    }

    #[test]
    fn a_real_reserve_takes_space() {
        let dir = tempfile::tempdir().unwrap();
        let disk = DiskSpace::open(dir.path(), 0, 8 * MIB, Duration::ZERO, Box::new(statvfs));
        assert_eq!(disk.status().reserve_bytes, 8 * MIB);
        let meta = fs::metadata(dir.path().join(RESERVE_FILE)).unwrap();
        use std::os::unix::fs::MetadataExt as _;
        assert!(meta.blocks() * 512 >= 8 * MIB, "the reserve's blocks are allocated");
    }
}
