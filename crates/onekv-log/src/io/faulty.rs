//! [`FaultyDir`]: a wrapper that makes I/O fail on command.
//!
//! Faults are armed through a [`FaultHandle`] shared with the test: "the n-th write from now tears
//! (half of it reaches the file) and fails", "the n-th sync from now fails", or "after n more
//! operations every operation fails" (the process is gone; pair it with [`super::MemDir::crash`]).
//! Once a fault fires it stays fired: the wrapped files keep failing, as a disk that has lost data
//! would, so a log that retried anything would be caught. Syncs can also be slowed down, to make
//! group commit observable without a real disk.

use super::{Dir, File};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

/// Shared switches for a [`FaultyDir`] and every file it opened.
#[derive(Debug, Default)]
pub struct FaultHandle {
    /// Writes left before one tears; negative: never.
    writes_left: AtomicI64,
    /// Syncs (file or directory) left before one fails; negative: never.
    syncs_left: AtomicI64,
    /// Operations of any kind left before all fail; negative: never.
    ops_left: AtomicI64,
    write_failed: AtomicBool,
    sync_failed: AtomicBool,
    dead: AtomicBool,
    ops: AtomicU64,
    /// Extra time every sync takes, in microseconds.
    sync_delay_us: AtomicU64,
    /// File syncs report success without making anything durable.
    lying_syncs: AtomicBool,
}

impl FaultHandle {
    fn new() -> Self {
        Self {
            writes_left: AtomicI64::new(-1),
            syncs_left: AtomicI64::new(-1),
            ops_left: AtomicI64::new(-1),
            ..Self::default()
        }
    }

    /// The `n`-th write from now (0 = the next) writes half its bytes and fails, and so does every
    /// write after it.
    pub fn tear_write_after(&self, n: u32) {
        self.writes_left.store(i64::from(n), Ordering::SeqCst);
    }

    /// The `n`-th sync from now (0 = the next) fails, and so does every sync after it.
    pub fn fail_sync_after(&self, n: u32) {
        self.syncs_left.store(i64::from(n), Ordering::SeqCst);
    }

    /// After `n` more operations of any kind, every operation fails.
    pub fn kill_after(&self, n: u32) {
        self.ops_left.store(i64::from(n), Ordering::SeqCst);
    }

    /// Makes every sync take at least `delay` longer (a slow disk), so that concurrent appenders
    /// pile up behind it.
    pub fn slow_syncs(&self, delay: std::time::Duration) {
        self.sync_delay_us.store(u64::try_from(delay.as_micros()).unwrap_or(u64::MAX), Ordering::SeqCst);
    }

    /// From now on every file sync reports success but makes nothing durable: a disk that
    /// acknowledges writes still in its volatile cache. Paired with [`super::MemDir::crash`] this
    /// is the "acknowledged before durable" bug the simulation's broken-variant tests must catch.
    pub fn lie_about_syncs(&self) {
        self.lying_syncs.store(true, Ordering::SeqCst);
    }

    /// Operations attempted so far through this handle.
    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::SeqCst)
    }

    /// Counts one operation; an error if the process is "dead".
    fn op(&self) -> io::Result<()> {
        self.ops.fetch_add(1, Ordering::SeqCst);
        if self.dead.load(Ordering::SeqCst) || fires(&self.ops_left) {
            self.dead.store(true, Ordering::SeqCst);
            return Err(io::Error::other("injected fault: process killed"));
        }
        Ok(())
    }
}

/// Decrements a countdown and reports whether it has reached its fault.
fn fires(left: &AtomicI64) -> bool {
    let before = left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| (v > 0).then(|| v - 1));
    matches!(before, Err(0))
}

/// A directory whose I/O fails when its [`FaultHandle`] says so.
#[derive(Debug, Clone)]
pub struct FaultyDir {
    inner: Arc<dyn Dir>,
    faults: Arc<FaultHandle>,
}

impl FaultyDir {
    /// Wraps `inner`; no fault is armed yet.
    pub fn new(inner: Arc<dyn Dir>) -> Self {
        Self { inner, faults: Arc::new(FaultHandle::new()) }
    }

    /// The switches for this directory and its files.
    pub fn faults(&self) -> Arc<FaultHandle> {
        self.faults.clone()
    }
}

#[derive(Debug)]
struct FaultyFile {
    inner: Arc<dyn File>,
    faults: Arc<FaultHandle>,
}

impl FaultHandle {
    fn sync(&self) -> io::Result<()> {
        self.op()?;
        let delay = self.sync_delay_us.load(Ordering::SeqCst);
        if delay > 0 {
            std::thread::sleep(std::time::Duration::from_micros(delay));
        }
        if self.sync_failed.load(Ordering::SeqCst) || fires(&self.syncs_left) {
            self.sync_failed.store(true, Ordering::SeqCst);
            return Err(io::Error::other("injected fault: sync failed"));
        }
        Ok(())
    }
}

impl Dir for FaultyDir {
    fn list(&self) -> io::Result<Vec<String>> {
        self.faults.op()?;
        self.inner.list()
    }

    fn create(&self, name: &str) -> io::Result<Arc<dyn File>> {
        self.faults.op()?;
        let inner = self.inner.create(name)?;
        Ok(Arc::new(FaultyFile { inner, faults: self.faults.clone() }))
    }

    fn open(&self, name: &str) -> io::Result<Arc<dyn File>> {
        self.faults.op()?;
        let inner = self.inner.open(name)?;
        Ok(Arc::new(FaultyFile { inner, faults: self.faults.clone() }))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        self.faults.op()?;
        self.inner.remove(name)
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.faults.op()?;
        self.inner.rename(from, to)
    }

    fn sync(&self) -> io::Result<()> {
        self.faults.sync()?;
        self.inner.sync()
    }
}

impl File for FaultyFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.faults.op()?;
        self.inner.read_exact_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.faults.op()?;
        if self.faults.write_failed.load(Ordering::SeqCst) || fires(&self.faults.writes_left) {
            self.faults.write_failed.store(true, Ordering::SeqCst);
            let _ = self.inner.write_all_at(&buf[..buf.len() / 2], offset);
            return Err(io::Error::other("injected fault: torn write"));
        }
        self.inner.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.faults.sync()?;
        if self.faults.lying_syncs.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.inner.sync_data()
    }

    fn size(&self) -> io::Result<u64> {
        self.faults.op()?;
        self.inner.size()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.faults.op()?;
        self.inner.set_len(len)
    }
}
