//! The log's one error type, shared by every operation.
//!
//! Errors are `Clone` because one failed write must be reported to every caller whose records were in
//! it, and to every caller after it (the log refuses to write again once a write or fsync failed).

use crate::Locator;
use std::io;
use std::sync::Arc;

/// Why a log operation did not succeed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum LogError {
    /// The configuration is not usable; nothing was touched.
    #[error("invalid log configuration: {0}")]
    Config(String),
    /// An I/O operation failed.
    #[error("I/O error while {context}: {source}")]
    Io {
        /// What the log was doing, with the file name.
        context: String,
        /// The operating system's error.
        source: Arc<io::Error>,
    },
    /// Bytes on disk are damaged where the log has proof they had been made durable. The log
    /// opens past this only when told to truncate at `position` (see `OpenOptions::truncate_at`).
    #[error("log corrupt at position {position} (segment {segment}): {reason}")]
    Corruption {
        /// The segment file.
        segment: String,
        /// Log position of the first damaged byte or record.
        position: u64,
        /// What was wrong.
        reason: String,
    },
    /// A segment was written by a format version this build does not read.
    #[error("segment {segment} has format version {version}, which this build does not read")]
    UnsupportedFormat {
        /// The segment file.
        segment: String,
        /// The version found.
        version: u16,
    },
    /// An earlier write or fsync failed, so the log accepts no more writes. Reopen it to recover
    /// what is durable.
    #[error("the log stopped accepting writes after an earlier failure: {cause}")]
    Failed {
        /// The first failure.
        cause: Arc<LogError>,
    },
    /// The log was closed before the records were written.
    #[error("the log is closed")]
    Closed,
    /// A record's payload is larger than the configured maximum.
    #[error("record payload of {len} bytes exceeds the maximum of {max}")]
    RecordTooLarge {
        /// Payload length.
        len: u64,
        /// `LogConfig::max_record_bytes`.
        max: u32,
    },
    /// One call's records together exceed what may be queued at once.
    #[error("append of {len} framed bytes exceeds the queue limit of {max}")]
    BatchTooLarge {
        /// Framed bytes of the call.
        len: u64,
        /// `LogConfig::max_queued_bytes`.
        max: u64,
    },
    /// The locator names bytes that are not (or not yet) in the log's readable range.
    #[error("locator {locator} is outside the log's durable range {first}..{end}")]
    OutOfRange {
        /// The locator asked for.
        locator: Locator,
        /// First position still in the log.
        first: u64,
        /// End of the durable log.
        end: u64,
    },
    /// The locator does not name a whole record (for reads that verify the record checksum): the
    /// bytes before it are not a record header claiming exactly this payload.
    #[error("locator {0} does not name a whole record")]
    NotARecord(Locator),
}

impl LogError {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        LogError::Io { context: context.into(), source: Arc::new(source) }
    }
}

/// Shorthand for results of log operations.
pub type Result<T, E = LogError> = std::result::Result<T, E>;
