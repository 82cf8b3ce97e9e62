//! The node's one log: everything a onekv node persists, in one append-only, segmented,
//! checksummed log.
//!
//! The log stores opaque records (a caller-chosen [`RecordKind`] and a payload) and hands back a
//! [`Locator`] for each: a position and a length that a later [`Log::read`] turns into exactly those
//! bytes with one positional read. Appends from many threads share one write and one fsync (group
//! commit); a caller learns its locators only once its records are durable. On open, a torn last
//! write left by a crash is cut off, and damage to data that had been made durable is reported as
//! corruption instead of being silently dropped.
//!
//! What this crate does **not** do: it does not know what records mean (Raft entries, durability
//! records and relocated values are all just kinds to it), it keeps no index of keys, and it never
//! decides on its own what may be reclaimed: callers say up to which position segments may go.
//!
//! Byte layouts and the crash analysis are in `docs/design/log-format.md`.

mod config;
mod error;
pub mod io;
mod iter;
mod locator;
mod log;
pub mod record;
mod recovery;
mod recycle;
pub mod segment;
mod stats;
mod writer;

pub use config::{
    DEFAULT_MAX_RECORD_BYTES, LogConfig, MAX_RECYCLED_SEGMENTS, MAX_SEGMENT_BYTES, MIN_SEGMENT_BYTES,
    OpenOptions,
};
pub use error::{LogError, Result};
pub use iter::{LogEntry, LogIter};
pub use locator::Locator;
pub use log::{Log, Reclaimed, SegmentInfo};
pub use record::{RECORD_HEADER_LEN, RecordKind};
pub use recovery::RecoveryReport;
pub use segment::SEGMENT_HEADER_LEN;
pub use stats::{FSYNC_BUCKETS, LogStats};
