//! Knobs of the log, with documented defaults, checked before any file is touched.

use crate::LogError;
use crate::record::RECORD_HEADER_LEN;
use crate::segment::SEGMENT_HEADER_LEN;

/// Largest segment: offsets within a segment are `u32`.
pub const MAX_SEGMENT_BYTES: u64 = 1 << 30;
/// Smallest segment at all, whatever the record limit.
pub const MIN_SEGMENT_BYTES: u64 = 4096;
/// Most reclaimed segment files [`LogConfig::recycled_segments`] may keep.
pub const MAX_RECYCLED_SEGMENTS: u32 = 64;
/// The default [`LogConfig::max_record_bytes`].
pub const DEFAULT_MAX_RECORD_BYTES: u32 = 16 << 20;

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
    /// Reclaimed segment files kept to become later segments instead of being deleted, at most
    /// [`MAX_RECYCLED_SEGMENTS`]; 0 deletes them. Overwriting a file's existing blocks makes each
    /// group commit's fsync cheaper than growing a file (`recycle`), at the price of up to this
    /// many segments of disk held while the log is not growing. Default 1: while reclamation keeps
    /// up, each roll takes the file the previous reclamation gave back.
    pub recycled_segments: u32,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_size_bytes: 64 << 20,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            max_write_bytes: 8 << 20,
            max_queued_bytes: 64 << 20,
            recycled_segments: 1,
        }
    }
}

impl LogConfig {
    /// The smallest segment that holds a record of `max_record_bytes`: its payload and framing
    /// after the segment's header (and at least [`MIN_SEGMENT_BYTES`]). The one definition of the
    /// minimum that [`LogConfig::validate`] enforces and configuration layers above report.
    pub const fn min_segment_bytes(max_record_bytes: u32) -> u64 {
        let largest = (SEGMENT_HEADER_LEN + RECORD_HEADER_LEN) as u64 + max_record_bytes as u64;
        if largest > MIN_SEGMENT_BYTES { largest } else { MIN_SEGMENT_BYTES }
    }

    /// Checks the values against each other; an error names the first one that is off.
    pub fn validate(&self) -> Result<(), LogError> {
        let bad = |msg: String| Err(LogError::Config(msg));
        if !(MIN_SEGMENT_BYTES..=MAX_SEGMENT_BYTES).contains(&self.segment_size_bytes) {
            return bad(format!(
                "segment_size_bytes = {} is outside {MIN_SEGMENT_BYTES}..={MAX_SEGMENT_BYTES}",
                self.segment_size_bytes
            ));
        }
        let largest = (SEGMENT_HEADER_LEN + RECORD_HEADER_LEN) as u64 + u64::from(self.max_record_bytes);
        if self.max_record_bytes == 0
            || Self::min_segment_bytes(self.max_record_bytes) > self.segment_size_bytes
        {
            return bad(format!(
                "max_record_bytes = {} must be at least 1 and, with {} bytes of framing, fit in a \
                 segment of {} bytes",
                self.max_record_bytes,
                SEGMENT_HEADER_LEN + RECORD_HEADER_LEN,
                self.segment_size_bytes
            ));
        }
        if self.recycled_segments > MAX_RECYCLED_SEGMENTS {
            return bad(format!(
                "recycled_segments = {} is above {MAX_RECYCLED_SEGMENTS}",
                self.recycled_segments
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
