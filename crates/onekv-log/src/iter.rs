//! [`LogIter`]: reading the log front to back, for recovery and garbage collection.
//!
//! The iterator reads each segment in large chunks (not record by record), checks every record's
//! checksum, and moves to the next segment at the end of one. It stops at the durable end of the
//! log as it finds it. Anything that does not verify inside the durable range is reported as
//! [`LogError::Corruption`] and ends the iteration.

use crate::log::{Segment, Shared};
use crate::record::{self, Decoded, RECORD_HEADER_LEN, RecordKind};
use crate::segment::SEGMENT_HEADER_LEN;
use crate::{Locator, LogError, Result};
use std::sync::Arc;

/// Bytes read from a segment at a time (more when one record is larger).
const CHUNK_BYTES: u64 = 1 << 20;

/// One record read back by the iterator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// Where the record's header starts; pass it to `Log::iter_from` to resume here.
    pub position: u64,
    /// The caller's record kind.
    pub kind: RecordKind,
    /// The locator of the payload, as the append returned it.
    pub locator: Locator,
    /// The payload bytes.
    pub payload: Vec<u8>,
}

/// Iterator over durable records; see `Log::iter_from`.
pub struct LogIter {
    shared: Arc<Shared>,
    position: u64,
    segment: Option<Arc<Segment>>,
    buf: Vec<u8>,
    /// Log position of `buf[0]`.
    buf_start: u64,
    done: bool,
}

impl LogIter {
    pub(crate) fn new(shared: Arc<Shared>, position: u64) -> Self {
        Self { shared, position, segment: None, buf: Vec::new(), buf_start: position, done: false }
    }

    /// Where the next record is expected.
    pub fn position(&self) -> u64 {
        self.position
    }

    fn corruption(&self, segment: &Segment, reason: String) -> LogError {
        LogError::Corruption { segment: segment.name(), position: self.position, reason }
    }

    /// Makes sure `buf` holds `[position, position + need)`, reading ahead up to `limit`.
    fn fill(&mut self, segment: &Segment, need: u64, limit: u64) -> Result<()> {
        let have_end = self.buf_start + self.buf.len() as u64;
        if self.position >= self.buf_start && self.position + need <= have_end {
            return Ok(());
        }
        let len = need.max(CHUNK_BYTES).min(limit - self.position);
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(len as usize, 0);
        segment
            .file
            .read_exact_at(&mut buf, self.position - segment.base)
            .map_err(|e| LogError::io(format!("reading {} at {}", segment.name(), self.position), e))?;
        self.buf = buf;
        self.buf_start = self.position;
        Ok(())
    }

    fn step(&mut self) -> Result<Option<LogEntry>> {
        loop {
            let segment = match &self.segment {
                Some(s) => s.clone(),
                None => {
                    let Some(s) = self.shared.segment_at(self.position) else {
                        let first = self.shared.first_position();
                        if self.position < first {
                            return Err(LogError::OutOfRange {
                                locator: Locator::new(self.position, 0),
                                first,
                                end: self.shared.end_position(),
                            });
                        }
                        return Ok(None);
                    };
                    if self.position < s.base + SEGMENT_HEADER_LEN as u64 {
                        self.position = s.base + SEGMENT_HEADER_LEN as u64;
                    }
                    self.segment = Some(s.clone());
                    s
                }
            };
            let end = segment.durable_end();
            if self.position >= end {
                // Sealed segments end exactly where the next begins; the last one ends the log.
                match self.shared.segment_starting_at(end) {
                    Some(_) => {
                        self.segment = None;
                        continue;
                    }
                    None => return Ok(None),
                }
            }
            let header = RECORD_HEADER_LEN as u64;
            if self.position + header > end {
                return Err(self.corruption(&segment, "record header runs past the segment's end".into()));
            }
            self.fill(&segment, header, end)?;
            let at = (self.position - self.buf_start) as usize;
            let payload_len = u32::from_le_bytes(self.buf[at + 4..at + 8].try_into().expect("4 bytes"));
            let framed = header + u64::from(payload_len.min(self.shared.config.max_record_bytes));
            if self.position + framed > end {
                return Err(self.corruption(&segment, "record runs past the segment's end".into()));
            }
            self.fill(&segment, framed, end)?;
            let at = (self.position - self.buf_start) as usize;
            match record::decode(
                segment.place(self.position),
                &self.buf[at..],
                self.shared.config.max_record_bytes,
            ) {
                Decoded::Record { kind, payload, total_len, .. } => {
                    let entry = LogEntry {
                        position: self.position,
                        kind,
                        locator: Locator::new(self.position + header, payload.len() as u64),
                        payload: payload.to_vec(),
                    };
                    self.position += total_len as u64;
                    return Ok(Some(entry));
                }
                Decoded::Incomplete => {
                    return Err(self.corruption(&segment, "record cut short".into()));
                }
                Decoded::Invalid(why) => return Err(self.corruption(&segment, why.to_string())),
            }
        }
    }
}

impl Iterator for LogIter {
    type Item = Result<LogEntry>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.step() {
            Ok(Some(entry)) => Some(Ok(entry)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}
