//! Opening a log: find the segments, check how they fit together, and repair a torn tail.
//!
//! What is checked on open (the rest is checked by every read that verifies a checksum, by the
//! iterator and by `Log::verify`):
//! - every segment header, and that each segment ends exactly where the next one begins
//!   (a sealed segment was fsynced whole before its successor was created, so any gap or overlap is
//!   damage, not a crash);
//! - every record of the last segment, which is the only place a crash can leave a partial write.
//!
//! The tail rule: at the first bad or incomplete record of the last segment, look at every valid
//! record after it. If one of them belongs to a write that *began after* the bad record (its
//! `batch_offset` points past it), the bad record had been fsynced before that later write started,
//! so this is corruption and the log does not open. Otherwise everything from the bad record on is
//! the unfinished last write (possibly with pages written back out of order) and is cut off.

use crate::config::OpenOptions;
use crate::io::{Dir, File};
use crate::record::{self, Decoded, Place, RECORD_HEADER_LEN, RECORD_MAGIC};
use crate::segment::{self, HeaderError, SEGMENT_HEADER_LEN};
use crate::stats::Counters;
use crate::{LogError, Result};
use std::sync::Arc;
use std::time::Instant;

/// One segment file found on open.
pub(crate) struct FoundSegment {
    pub base: u64,
    pub file: Arc<dyn File>,
    /// Bytes of the file that hold valid data (header and whole records).
    pub len: u64,
    /// The salt its records carry.
    pub salt: u16,
}

/// A reclaimed segment's file found kept for reuse (see `recycle`).
pub(crate) struct FoundFree {
    pub old_base: u64,
    pub file: Arc<dyn File>,
}

/// What opening the log found: its segments in order (the last one writable) and the kept files.
pub(crate) struct Found {
    pub segments: Vec<FoundSegment>,
    pub free: Vec<FoundFree>,
}

/// What opening the log found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segment files in the log.
    pub segments: usize,
    /// First position of the log.
    pub first_position: u64,
    /// Position after the last valid record: where the next append goes.
    pub end_position: u64,
    /// If a torn last write was cut off: where, and how many bytes were dropped.
    pub torn_tail: Option<(u64, u64)>,
    /// If the last segment is a recycled file and the bytes of its earlier use were cut off after
    /// its last record: where, and how many bytes. Told from a torn write by what the cut bytes
    /// hold (a record header with another salt); only the report differs, the cut is the same.
    pub stale_tail: Option<(u64, u64)>,
    /// Bytes dropped because `OpenOptions::truncate_at` asked for it.
    pub truncated_bytes: u64,
    /// A segment whose creation was interrupted and whose header was written again.
    pub rewrote_header: bool,
    /// Reclaimed segment files kept for reuse (`LogConfig::recycled_segments`).
    pub free_files: usize,
    /// Files in the directory that are not segments (left alone).
    pub foreign_files: Vec<String>,
}

/// Fsyncs `file`, counting `bytes` newly made durable by it.
fn sync_file(file: &dyn File, name: &str, bytes: u64, counters: &Counters) -> Result<()> {
    let start = Instant::now();
    file.sync_data().map_err(|e| LogError::io(format!("syncing {name}"), e))?;
    counters.synced(bytes, start.elapsed());
    Ok(())
}

pub(crate) fn sync_dir(dir: &dyn Dir, counters: &Counters) -> Result<()> {
    let start = Instant::now();
    dir.sync().map_err(|e| LogError::io("syncing the log directory", e))?;
    counters.fsync(start.elapsed());
    Ok(())
}

/// Creates the segment starting at `base`: header written and fsynced, name fsynced into the
/// directory, before any record goes in (so a header can only be damaged by a crash while the
/// segment holds no records).
pub(crate) fn create_segment(dir: &dyn Dir, base: u64, counters: &Counters) -> Result<Arc<dyn File>> {
    let name = segment::file_name(base);
    let file = dir.create(&name).map_err(|e| LogError::io(format!("creating {name}"), e))?;
    write_header(&*file, base, &name, counters)?;
    sync_dir(dir, counters)?;
    counters.segment_created();
    Ok(file)
}

/// Writes and fsyncs the header of the segment at `base` into `file` (named `name`).
pub(crate) fn write_header(file: &dyn File, base: u64, name: &str, counters: &Counters) -> Result<()> {
    let header = segment::encode_header(base);
    file.write_all_at(&header, 0).map_err(|e| LogError::io(format!("writing header of {name}"), e))?;
    counters.wrote(header.len() as u64);
    sync_file(file, name, header.len() as u64, counters)
}

fn open_file(dir: &dyn Dir, base: u64) -> Result<(Arc<dyn File>, u64)> {
    let name = segment::file_name(base);
    let file = dir.open(&name).map_err(|e| LogError::io(format!("opening {name}"), e))?;
    let len = file.size().map_err(|e| LogError::io(format!("reading the length of {name}"), e))?;
    Ok((file, len))
}

fn read_all(file: &dyn File, len: u64, name: &str) -> Result<Vec<u8>> {
    let len = usize::try_from(len).map_err(|_| LogError::Corruption {
        segment: name.to_string(),
        position: 0,
        reason: format!("segment of {len} bytes is larger than this machine can address"),
    })?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, 0).map_err(|e| LogError::io(format!("reading {name}"), e))?;
    Ok(buf)
}

fn header_error(name: &str, base: u64, err: HeaderError) -> LogError {
    match err {
        HeaderError::UnsupportedVersion(version) => {
            LogError::UnsupportedFormat { segment: name.to_string(), version }
        }
        other => {
            LogError::Corruption { segment: name.to_string(), position: base, reason: other.to_string() }
        }
    }
}

/// Cuts `file` (named `name`) to `len` bytes, durably.
pub(crate) fn truncate(file: &dyn File, name: &str, len: u64, counters: &Counters) -> Result<()> {
    file.set_len(len).map_err(|e| LogError::io(format!("truncating {name}"), e))?;
    sync_file(file, name, 0, counters)
}

/// Opens (or creates) the log in `dir`: its segments in order, the last one writable, and up to
/// `keep_free` kept files (more are deleted).
pub(crate) fn recover(
    dir: &dyn Dir,
    options: &OpenOptions,
    max_record_bytes: u32,
    keep_free: usize,
    counters: &Counters,
) -> Result<(Found, RecoveryReport)> {
    let mut report = RecoveryReport::default();
    let mut bases = Vec::new();
    let mut free_bases = Vec::new();
    for name in dir.list().map_err(|e| LogError::io("listing the log directory", e))? {
        if let Some(base) = segment::parse_file_name(&name) {
            bases.push(base);
        } else if let Some(old_base) = segment::parse_free_file_name(&name) {
            free_bases.push(old_base);
        } else {
            report.foreign_files.push(name);
        }
    }
    bases.sort_unstable();
    free_bases.sort_unstable();
    report.foreign_files.sort();
    let free = open_free_files(dir, free_bases, keep_free, counters)?;
    report.free_files = free.len();
    let (segments, report) = recover_segments(dir, options, max_record_bytes, bases, report, counters)?;
    Ok((Found { segments, free }, report))
}

/// Opens the newest `keep` kept files and deletes the others (the limit may have been lowered).
fn open_free_files(
    dir: &dyn Dir,
    mut old_bases: Vec<u64>,
    keep: usize,
    counters: &Counters,
) -> Result<Vec<FoundFree>> {
    let surplus = old_bases.len().saturating_sub(keep);
    for old_base in old_bases.drain(..surplus) {
        let name = segment::free_file_name(old_base);
        dir.remove(&name).map_err(|e| LogError::io(format!("removing {name}"), e))?;
    }
    if surplus > 0 {
        sync_dir(dir, counters)?;
    }
    old_bases
        .into_iter()
        .map(|old_base| {
            let name = segment::free_file_name(old_base);
            let file = dir.open(&name).map_err(|e| LogError::io(format!("opening {name}"), e))?;
            Ok(FoundFree { old_base, file })
        })
        .collect()
}

fn recover_segments(
    dir: &dyn Dir,
    options: &OpenOptions,
    max_record_bytes: u32,
    mut bases: Vec<u64>,
    mut report: RecoveryReport,
    counters: &Counters,
) -> Result<(Vec<FoundSegment>, RecoveryReport)> {
    if let Some(cut) = options.truncate_at {
        report.truncated_bytes = truncate_at(dir, &mut bases, cut, counters)?;
    }

    let Some(&last_base) = bases.last() else {
        let file = create_segment(dir, 0, counters)?;
        let fresh =
            FoundSegment { base: 0, file, len: SEGMENT_HEADER_LEN as u64, salt: segment::salt_for(0) };
        return Ok(finish(vec![fresh], report));
    };

    let mut segments = Vec::with_capacity(bases.len());
    for (i, &base) in bases[..bases.len() - 1].iter().enumerate() {
        let name = segment::file_name(base);
        let (file, len) = open_file(dir, base)?;
        let mut header = [0u8; SEGMENT_HEADER_LEN];
        if len >= SEGMENT_HEADER_LEN as u64 {
            file.read_exact_at(&mut header, 0).map_err(|e| LogError::io(format!("reading {name}"), e))?;
        }
        let salt = segment::check_header(&header[..len.min(SEGMENT_HEADER_LEN as u64) as usize], base)
            .map_err(|e| header_error(&name, base, e))?;
        let next = bases[i + 1];
        if base.checked_add(len) != Some(next) {
            return Err(LogError::Corruption {
                segment: name,
                position: base.saturating_add(len).min(next),
                reason: format!(
                    "sealed segment ends at {} but the next segment starts at {next}",
                    base.saturating_add(len)
                ),
            });
        }
        segments.push(FoundSegment { base, file, len, salt });
    }

    let name = segment::file_name(last_base);
    let (file, len) = open_file(dir, last_base)?;
    let data = read_all(&*file, len, &name)?;
    let salt = match segment::check_header(&data, last_base) {
        Ok(salt) => salt,
        // The segment was being created when the process stopped: it can hold no records yet.
        Err(HeaderError::Incomplete | HeaderError::Damaged) if data.len() <= SEGMENT_HEADER_LEN => {
            truncate(&*file, &name, 0, counters)?;
            write_header(&*file, last_base, &name, counters)?;
            report.rewrote_header = true;
            sync_dir(dir, counters)?;
            let salt = segment::salt_for(last_base);
            segments.push(FoundSegment { base: last_base, file, len: SEGMENT_HEADER_LEN as u64, salt });
            return Ok(finish(segments, report));
        }
        Err(e) => return Err(header_error(&name, last_base, e)),
    };

    // A recycled file still holds its earlier use's records after the last valid one: they never
    // verify (another salt), so they are cut off here like a torn tail.
    let valid_len = scan_tail(&data, last_base, salt, max_record_bytes, &name)?;
    if valid_len < data.len() {
        let cut = Some((last_base + valid_len as u64, (data.len() - valid_len) as u64));
        if holds_other_salts(&data[valid_len..], salt) {
            report.stale_tail = cut;
        } else {
            report.torn_tail = cut;
        }
        truncate(&*file, &name, valid_len as u64, counters)?;
    } else {
        // What a crashed process wrote may still be only in the page cache: make it durable before
        // anyone is told it is part of the log.
        sync_file(&*file, &name, 0, counters)?;
    }
    sync_dir(dir, counters)?;
    segments.push(FoundSegment { base: last_base, file, len: valid_len as u64, salt });
    Ok(finish(segments, report))
}

fn finish(segments: Vec<FoundSegment>, mut report: RecoveryReport) -> (Vec<FoundSegment>, RecoveryReport) {
    report.segments = segments.len();
    report.first_position = segments.first().map_or(0, |s| s.base);
    report.end_position = segments.last().map_or(0, |s| s.base + s.len);
    (segments, report)
}

/// Deletes every segment after the one holding `cut`, and cuts that one at `cut`.
fn truncate_at(dir: &dyn Dir, bases: &mut Vec<u64>, cut: u64, counters: &Counters) -> Result<u64> {
    let Some(keep) = bases.iter().rposition(|&b| b <= cut) else {
        return Err(LogError::Config(format!("truncate_at = {cut} is before the log's first position")));
    };
    let base = bases[keep];
    if cut < base + SEGMENT_HEADER_LEN as u64 {
        return Err(LogError::Config(format!(
            "truncate_at = {cut} falls inside the header of the segment at {base}"
        )));
    }
    let mut dropped = 0;
    // Highest first, one directory sync each, so a crash never leaves a hole in the middle.
    while bases.len() > keep + 1 {
        let doomed = bases.pop().expect("len checked");
        let name = segment::file_name(doomed);
        let (_, len) = open_file(dir, doomed)?;
        dir.remove(&name).map_err(|e| LogError::io(format!("removing {name}"), e))?;
        sync_dir(dir, counters)?;
        dropped += len;
    }
    let name = segment::file_name(base);
    let (file, len) = open_file(dir, base)?;
    let new_len = cut - base;
    if new_len < len {
        truncate(&*file, &name, new_len, counters)?;
        dropped += len - new_len;
    }
    Ok(dropped)
}

/// Whether `cut` (bytes cut off a segment whose records carry `salt`) holds a record header of
/// another salt: what a recycled file's earlier use left. For the report only.
fn holds_other_salts(cut: &[u8], salt: u16) -> bool {
    let mut from = 0;
    while let Some(found) = find_magic(&cut[from..]) {
        let at = from + found;
        if let Some(header) = cut.get(at..at + RECORD_HEADER_LEN) {
            let other = u16::from_le_bytes([header[14], header[15]]);
            if other != salt && other != 0 {
                return true;
            }
        }
        from = at + 1;
    }
    false
}

/// Returns how many bytes of the last segment (header included) are valid, or the corruption.
pub(crate) fn scan_tail(
    data: &[u8],
    base: u64,
    salt: u16,
    max_record_bytes: u32,
    name: &str,
) -> Result<usize> {
    let mut offset = SEGMENT_HEADER_LEN;
    let (bad_offset, why) = loop {
        if offset == data.len() {
            return Ok(offset);
        }
        let at = Place { position: base + offset as u64, salt };
        match record::decode(at, &data[offset..], max_record_bytes) {
            Decoded::Record { total_len, .. } => offset += total_len,
            Decoded::Incomplete => break (offset, "record cut short".to_string()),
            Decoded::Invalid(why) => break (offset, why.to_string()),
        }
    };
    if let Some(later) = later_write_after(data, base, salt, bad_offset, max_record_bytes) {
        return Err(LogError::Corruption {
            segment: name.to_string(),
            position: base + bad_offset as u64,
            reason: format!(
                "{why}, but a record written after it was synced (at position {})",
                base + later as u64
            ),
        });
    }
    Ok(bad_offset)
}

/// Finds a valid record after `bad_offset` whose write began after `bad_offset`, if there is one.
fn later_write_after(
    data: &[u8],
    base: u64,
    salt: u16,
    bad_offset: usize,
    max_record_bytes: u32,
) -> Option<usize> {
    let mut from = bad_offset + 1;
    while let Some(found) = find_magic(&data[from.min(data.len())..]) {
        let offset = from + found;
        if let Decoded::Record { batch_offset, .. } =
            record::decode(Place { position: base + offset as u64, salt }, &data[offset..], max_record_bytes)
        {
            // A write cannot begin before its segment; a record claiming so is not evidence.
            let write_start = (offset as u64).saturating_sub(u64::from(batch_offset));
            if write_start > bad_offset as u64 {
                return Some(offset);
            }
        }
        from = offset + 1;
    }
    None
}

fn find_magic(haystack: &[u8]) -> Option<usize> {
    haystack.windows(RECORD_MAGIC.len()).position(|w| w == RECORD_MAGIC)
}
