//! The log's only door to storage: a directory of files behind two small traits.
//!
//! Everything the log persists goes through [`Dir`] and [`File`], so the same log code runs on
//! - [`FsDir`]: the real file system (positional `pread`/`pwrite`, `fdatasync`, directory fsync);
//! - [`MemDir`]: memory, with a crash model that keeps only what was synced (plus, if asked, a
//!   random torn or reordered part of what was not), so crash tests are fast and deterministic;
//! - [`FaultyDir`]: a wrapper over either that makes writes tear and syncs fail on command.
//!
//! The traits promise no more than POSIX does: a write is durable only after `sync_data` on its
//! file returned `Ok`, and a created or removed name only after `sync` on the directory returned
//! `Ok`; likewise a rename. This module knows nothing of records or segments.

mod faulty;
mod fs;
mod mem;

pub use faulty::{FaultHandle, FaultyDir};
pub use fs::FsDir;
pub use mem::{CrashMode, MemDir};

use std::io;
use std::sync::Arc;

/// A directory of files, named by plain file names (no separators).
pub trait Dir: Send + Sync + std::fmt::Debug {
    /// Names of the files in the directory, in no particular order.
    fn list(&self) -> io::Result<Vec<String>>;
    /// Creates a new, empty file; fails if the name exists. The name is durable only after
    /// [`Dir::sync`].
    fn create(&self, name: &str) -> io::Result<Arc<dyn File>>;
    /// Opens an existing file for reading and writing.
    fn open(&self, name: &str) -> io::Result<Arc<dyn File>>;
    /// Removes a file's name. Durable only after [`Dir::sync`].
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Gives the file named `from` the name `to` instead, keeping its contents and open handles
    /// (the log reuses a reclaimed segment's file this way). `to` must not exist: callers never
    /// rely on a rename replacing a file. Durable only after [`Dir::sync`].
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    /// Makes creations and removals so far durable.
    fn sync(&self) -> io::Result<()>;
}

/// One open file, read and written at explicit offsets (no cursor, so it is shared freely).
pub trait File: Send + Sync + std::fmt::Debug {
    /// Fills `buf` from `offset`; an error if the file ends first.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`, extending the file if needed. Not durable until
    /// [`File::sync_data`].
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes the file's data and length durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
    /// The file's current length.
    fn size(&self) -> io::Result<u64>;
    /// Cuts or extends the file to `len` bytes. Durable only after [`File::sync_data`].
    fn set_len(&self, len: u64) -> io::Result<()>;
}
