//! Knobs of the log, with documented defaults, checked before any file is touched.

use crate::LogError;
use crate::record::RECORD_HEADER_LEN;
use crate::segment::SEGMENT_HEADER_LEN;

/// Sizes and limits of one log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogConfig {
    /// A segment is closed and a new one started when the next record would not fit. Default
    /// 64 MiB; at least 4 KiB, at most 1 GiB (so that offsets within a segment fit in `u32`).
    pub segment_size_bytes: u64,
    /// Largest payload of one record. Default 16 MiB; it and its framing must fit in a segment.
    pub max_record_bytes: u32,
    /// Group commit: at most this many bytes are taken into one write and fsync (one request is
    /// always taken whole, however large). Default 8 MiB.
    pub max_write_bytes: u64,
    /// Appenders wait while this many bytes are queued and not yet written. Default 64 MiB; must
    /// hold the largest record.
    pub max_queued_bytes: u64,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_size_bytes: 64 << 20,
            max_record_bytes: 16 << 20,
            max_write_bytes: 8 << 20,
            max_queued_bytes: 64 << 20,
        }
    }
}

impl LogConfig {
    /// Checks the values against each other; an error names the first one that is off.
    pub fn validate(&self) -> Result<(), LogError> {
        let bad = |msg: String| Err(LogError::Config(msg));
        if !(4096..=1 << 30).contains(&self.segment_size_bytes) {
            return bad(format!(
                "segment_size_bytes = {} is outside 4096..=1073741824",
                self.segment_size_bytes
            ));
        }
        let largest = (SEGMENT_HEADER_LEN + RECORD_HEADER_LEN) as u64 + u64::from(self.max_record_bytes);
        if self.max_record_bytes == 0 || largest > self.segment_size_bytes {
            return bad(format!(
                "max_record_bytes = {} must be at least 1 and, with {} bytes of framing, fit in a \
                 segment of {} bytes",
                self.max_record_bytes,
                SEGMENT_HEADER_LEN + RECORD_HEADER_LEN,
                self.segment_size_bytes
            ));
        }
        if self.max_write_bytes == 0 {
            return bad("max_write_bytes must be at least 1".into());
        }
        if self.max_queued_bytes < largest {
            return bad(format!(
                "max_queued_bytes = {} must hold the largest framed record ({largest} bytes)",
                self.max_queued_bytes
            ));
        }
        Ok(())
    }
}

/// Choices made when opening a log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Drop everything at and after this position before opening: the way out of a
    /// [`LogError::Corruption`] once an operator has decided the records after it are lost. Later
    /// segments are deleted and the segment holding the position is cut there.
    pub truncate_at: Option<u64>,
}
