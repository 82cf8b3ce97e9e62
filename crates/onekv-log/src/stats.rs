//! Counters of what the log wrote and synced, readable at any time without locks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Number of fsync latency buckets: bucket `i` counts fsyncs that took less than `2^i` µs
/// (the last also counts everything slower).
pub const FSYNC_BUCKETS: usize = 24;

#[derive(Debug, Default)]
pub(crate) struct Counters {
    bytes_written: AtomicU64,
    bytes_synced: AtomicU64,
    payload_bytes: AtomicU64,
    records: AtomicU64,
    writes: AtomicU64,
    fsyncs: AtomicU64,
    fsync_us_total: AtomicU64,
    fsync_us_max: AtomicU64,
    fsync_buckets: [AtomicU64; FSYNC_BUCKETS],
    segments_created: AtomicU64,
    segments_reclaimed: AtomicU64,
    segments_reused: AtomicU64,
}

/// A snapshot of a log's counters since it was opened.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Every byte the log wrote to its files: record framing, payloads and segment headers.
    pub bytes_written: u64,
    /// Bytes of `bytes_written` covered by a successful fsync.
    pub bytes_synced: u64,
    /// Payload bytes appended by callers (the "user bytes" of the log's own write amplification).
    pub payload_bytes: u64,
    /// Records appended.
    pub records: u64,
    /// Group commits: write calls that carried appended records.
    pub writes: u64,
    /// Successful fsyncs of files and of the directory.
    pub fsyncs: u64,
    /// Total time spent in those fsyncs, in microseconds.
    pub fsync_us_total: u64,
    /// Slowest fsync, in microseconds.
    pub fsync_us_max: u64,
    /// Histogram of fsync latency: entry `i` counts fsyncs faster than `2^i` µs and not faster
    /// than `2^(i-1)` µs.
    pub fsync_buckets: [u64; FSYNC_BUCKETS],
    /// Segment files created.
    pub segments_created: u64,
    /// Segments taken out of the log by reclamation (files deleted or kept for reuse).
    pub segments_reclaimed: u64,
    /// Segments that reused a reclaimed segment's file instead of creating one.
    pub segments_reused: u64,
}

impl LogStats {
    /// The fsync latency below which `quantile` (0..=1) of fsyncs fell, as a bucket upper bound in
    /// microseconds; 0 if there were none.
    pub fn fsync_us_quantile(&self, quantile: f64) -> u64 {
        let total: u64 = self.fsync_buckets.iter().sum();
        if total == 0 {
            return 0;
        }
        let want = ((total as f64) * quantile.clamp(0.0, 1.0)).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.fsync_buckets.iter().enumerate() {
            seen += n;
            if seen >= want {
                return 1 << i;
            }
        }
        1 << (FSYNC_BUCKETS - 1)
    }
}

impl Counters {
    pub(crate) fn wrote(&self, bytes: u64) {
        self.bytes_written.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn synced(&self, bytes: u64, took: Duration) {
        self.bytes_synced.fetch_add(bytes, Ordering::Relaxed);
        self.fsync(took);
    }

    pub(crate) fn fsync(&self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.fsync_us_total.fetch_add(us, Ordering::Relaxed);
        self.fsync_us_max.fetch_max(us, Ordering::Relaxed);
        let bucket = (u64::BITS - us.leading_zeros()) as usize;
        self.fsync_buckets[bucket.min(FSYNC_BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn appended(&self, records: u64, payload_bytes: u64) {
        self.records.fetch_add(records, Ordering::Relaxed);
        self.payload_bytes.fetch_add(payload_bytes, Ordering::Relaxed);
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn segment_created(&self) {
        self.segments_created.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn segment_reused(&self) {
        self.segments_reused.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn segment_reclaimed(&self) {
        self.segments_reclaimed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> LogStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LogStats {
            bytes_written: get(&self.bytes_written),
            bytes_synced: get(&self.bytes_synced),
            payload_bytes: get(&self.payload_bytes),
            records: get(&self.records),
            writes: get(&self.writes),
            fsyncs: get(&self.fsyncs),
            fsync_us_total: get(&self.fsync_us_total),
            fsync_us_max: get(&self.fsync_us_max),
            fsync_buckets: std::array::from_fn(|i| get(&self.fsync_buckets[i])),
            segments_created: get(&self.segments_created),
            segments_reclaimed: get(&self.segments_reclaimed),
            segments_reused: get(&self.segments_reused),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_lands_in_power_of_two_buckets() {
        let c = Counters::default();
        c.fsync(Duration::from_micros(0));
        c.fsync(Duration::from_micros(3));
        c.fsync(Duration::from_micros(1000));
        let s = c.snapshot();
        assert_eq!(s.fsync_buckets[0], 1);
        assert_eq!(s.fsync_buckets[2], 1);
        assert_eq!(s.fsync_buckets[10], 1);
        assert_eq!(s.fsync_us_max, 1000);
        assert_eq!(s.fsync_us_quantile(0.5), 4);
        assert_eq!(s.fsync_us_quantile(1.0), 1024);
    }
}
