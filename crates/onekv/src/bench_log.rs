//! `onekv bench-log`: how fast the log makes appends durable, next to what the same file system
//! does without it.
//!
//! What it measures, for every record size × appender count asked for:
//! - **log**: `appenders` threads each call [`Log::append`] with one record of the given size in a
//!   closed loop (next append as soon as the previous one is durable) for a fixed time, on a log
//!   freshly opened with the default [`LogConfig`] in a new directory. Reported: payload records/s
//!   and MB/s (10^6 bytes of payload, framing not counted), fsyncs/s and records per fsync (from the
//!   log's own counters, so segment-roll fsyncs are included), and p50/p99 latency of one `append`
//!   call (recorded per call with an HDR histogram, in µs).
//! - **plain_sync_each**: one thread appends one record-sized buffer to a new file with `write` and
//!   calls `fdatasync` after each: what a lone appender without group commit pays per record.
//! - **plain_bandwidth**: one thread appends the same bytes to a new file in 1 MiB `write`s (flag
//!   `--bandwidth-chunk`) with an `fdatasync` after each: a practical ceiling for durable
//!   sequential bandwidth on this file system. Not a hard one: the log, whose writes are not
//!   page-aligned, can beat it where aligned 1 MiB writes are slow (see `docs/benchmarks/log.md`).
//! - **plain_grouped**: one thread appends `appenders` records per `write` (capped at the bandwidth
//!   chunk) with an `fdatasync` after each: perfect group commit, where every fsync carries one
//!   record of every appender and nothing is spent on threads. With closed-loop appenders no log
//!   can put more bytes behind one fsync, so this is the ceiling for the cell's concurrency.
//!
//! Each baseline runs once before and once after the log run of the same cell (the second time in
//! reverse order), and the mean of the two is reported (their spread is printed too), so slow drift
//! on a shared machine hits both sides alike. Everything runs in one temporary directory, deleted at the end.
//!
//! With `--recycled`, every cell also runs the log twice more in a steady state of reclamation: a
//! thread reclaims every sealed segment as soon as it is sealed (as a log GC keeping up would), once
//! with the reclaimed files deleted (`recycled_segments = 0`: every new segment is a growing file)
//! and once with them kept and reused (`recycled_segments = 2`, the pool filled before the timed
//! run), in alternating order. Reported side by side with the process's CPU per record.
//!
//! What it does **not** measure: reads, recovery, batches of several records
//! per `append`, the asynchronous [`Log::submit`] path, or anything beyond one file system and one
//! process. It does not drop the page cache or pin threads; on a busy machine expect noise of
//! several percent and run it more than once.

use anyhow::{Context, Result, bail, ensure};
use hdrhistogram::Histogram;
use onekv_log::{FSYNC_BUCKETS, Log, LogConfig, LogStats, MAX_SEGMENT_BYTES, OpenOptions, RecordKind};
use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Largest record size accepted: the log's default `max_record_bytes`.
const MAX_SIZE: usize = 16 << 20;
/// Most appender threads accepted.
const MAX_APPENDERS: usize = 1024;
/// Longest run accepted, in seconds (each cell makes seven runs).
const MAX_SECONDS: f64 = 600.0;
/// Slowest append the latency histograms can tell apart from slower ones, in µs (one hour).
const MAX_LATENCY_US: u64 = 3_600_000_000;
/// The kind every benchmark record gets (the log does not interpret it).
const KIND: RecordKind = match RecordKind::new(1) {
    Some(kind) => kind,
    None => panic!("1 is a valid record kind"),
};

/// Flags of `onekv bench-log`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Record sizes to measure, comma-separated; a number of bytes, optionally with a suffix
    /// B, K/KiB or M/MiB (1 B ..= 16 MiB).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "128,1KiB,16KiB")]
    pub sizes: Vec<usize>,
    /// Numbers of concurrent appender threads to measure, comma-separated (1 ..= 1024).
    #[arg(long, value_delimiter = ',', value_parser = parse_appenders, default_value = "1,8,64")]
    pub appenders: Vec<usize>,
    /// Length of each measured run in seconds; fractions allowed (each cell makes seven runs:
    /// two of each baseline and one of the log).
    #[arg(long, value_parser = parse_seconds, default_value = "3")]
    pub seconds: f64,
    /// Bytes the plain_bandwidth baseline writes between two fdatasyncs (same syntax as --sizes).
    #[arg(long, value_parser = parse_size, default_value = "1MiB")]
    pub bandwidth_chunk: usize,
    /// Also measure the log on recycled segment files against growing ones, both while every
    /// sealed segment is reclaimed at once (see the module docs).
    #[arg(long)]
    pub recycled: bool,
    /// Size of the log's segments in MiB for every log run (1 ..= 1024); it must hold the largest
    /// record size with its framing. Smaller segments roll (and recycle) more often.
    #[arg(long, value_parser = parse_segment_mib, default_value = "64")]
    pub segment_mib: u64,
    /// Existing directory in which to create the temporary benchmark directory [default:
    /// ./target if it exists, else the system temporary directory].
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    let unit: usize = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        other => return Err(format!("unknown size suffix {other:?} (use B, K, KiB, M or MiB)")),
    };
    let n: usize = digits.parse().map_err(|_| format!("{s:?} is not a size such as 128, 1KiB or 16KiB"))?;
    let size = n.checked_mul(unit).filter(|&b| (1..=MAX_SIZE).contains(&b));
    size.ok_or_else(|| format!("record size {s:?} is outside 1 B ..= 16 MiB"))
}

fn parse_segment_mib(s: &str) -> Result<u64, String> {
    let n: u64 = s.trim().parse().map_err(|_| format!("{s:?} is not a whole number of MiB"))?;
    if !(1..=MAX_SEGMENT_BYTES >> 20).contains(&n) {
        return Err(format!("segment size {n} MiB is outside 1 ..= {}", MAX_SEGMENT_BYTES >> 20));
    }
    Ok(n)
}

fn parse_appenders(s: &str) -> Result<usize, String> {
    let n: usize = s.trim().parse().map_err(|_| format!("{s:?} is not a whole number of appenders"))?;
    if !(1..=MAX_APPENDERS).contains(&n) {
        return Err(format!("appenders = {n} is outside 1 ..= {MAX_APPENDERS}"));
    }
    Ok(n)
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    let secs: f64 = s.trim().parse().map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(secs.is_finite() && secs > 0.0 && secs <= MAX_SECONDS) {
        return Err(format!("seconds = {s} must be more than 0 and at most {MAX_SECONDS}"));
    }
    Ok(secs)
}

/// Bytes moved in a measured time.
#[derive(Clone, Copy, Debug)]
struct Rate {
    bytes: u64,
    elapsed: Duration,
}

impl Rate {
    fn mb_per_s(self) -> f64 {
        self.bytes as f64 / 1e6 / self.elapsed.as_secs_f64()
    }
}

/// One log run.
struct LogRun {
    rate: Rate,
    records: u64,
    latency_us: Histogram<u64>,
    /// The log's counters accumulated during the run.
    stats: LogStats,
    /// CPU seconds this process spent in the run (appenders, writer, reclaimer), if readable.
    cpu_s: Option<f64>,
}

impl LogRun {
    fn records_per_s(&self) -> f64 {
        self.records as f64 / self.rate.elapsed.as_secs_f64()
    }

    fn mean_fsync_us(&self) -> f64 {
        self.stats.fsync_us_total as f64 / self.stats.fsyncs.max(1) as f64
    }

    fn cpu_us_per_record(&self) -> Option<f64> {
        Some(self.cpu_s? * 1e6 / self.records.max(1) as f64)
    }
}

/// How a log run treats segments.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Segments {
    /// A fresh log; nothing reclaimed.
    Fresh,
    /// Every sealed segment reclaimed at once, its file deleted: each new segment grows a file.
    ReclaimedDeleted,
    /// Every sealed segment reclaimed at once, its file kept and reused.
    ReclaimedReused,
}

/// Files the recycled runs keep (the log's default).
const KEPT_FILES: u32 = 2;

/// One cell of the table: a record size and appender count, with its baselines.
struct Cell {
    size: usize,
    appenders: usize,
    log: LogRun,
    sync_each: [Rate; 2],
    bandwidth: [Rate; 2],
    grouped: [Rate; 2],
    /// With `--recycled`: two runs each of growing and of recycled files, in alternating order.
    recycled: Option<RecycledRuns>,
}

/// The `--recycled` runs of one cell.
struct RecycledRuns {
    growing: [LogRun; 2],
    reused: [LogRun; 2],
}

/// Runs the benchmark and prints its tables on stdout (progress goes to stderr).
pub fn run(args: &Args) -> Result<()> {
    ensure!(!args.sizes.is_empty(), "--sizes needs at least one size");
    ensure!(!args.appenders.is_empty(), "--appenders needs at least one count");
    let max_record = run_config(args, Segments::Fresh).max_record_bytes as usize;
    if let Some(&size) = args.sizes.iter().find(|&&size| size > max_record) {
        bail!(
            "record size {} does not fit a segment of {} MiB with its framing (--segment-mib)",
            fmt_size(size),
            args.segment_mib
        );
    }
    let duration = Duration::from_secs_f64(args.seconds);
    let parent = match &args.dir {
        Some(dir) => {
            ensure!(dir.is_dir(), "--dir {} is not an existing directory", dir.display());
            dir.clone()
        }
        None => match Path::new("target") {
            t if t.is_dir() => t.to_path_buf(),
            _ => std::env::temp_dir(),
        },
    };
    let root = tempfile::Builder::new()
        .prefix("onekv-bench-log-")
        .tempdir_in(&parent)
        .with_context(|| format!("creating a temporary directory in {}", parent.display()))?;

    let total = args.sizes.len() * args.appenders.len();
    let mut cells = Vec::with_capacity(total);
    for &size in &args.sizes {
        let payload = payload(size);
        for &appenders in &args.appenders {
            let label = format!("[{}/{total}] {} x {appenders} appender(s)", cells.len() + 1, fmt_size(size));
            progress(&format!("{label}: baselines (1/2)"));
            let [sync_each_a, bandwidth_a, grouped_a] =
                baselines(root.path(), &payload, appenders, args, duration, false)?;
            progress(&format!("{label}: log"));
            let log_dir = root.path().join(format!("log-{size}-{appenders}"));
            let log = log_run(&log_dir, &payload, appenders, duration, args, Segments::Fresh)?;
            fs::remove_dir_all(&log_dir).with_context(|| format!("removing {}", log_dir.display()))?;
            let recycled = match args.recycled {
                false => None,
                true => {
                    progress(&format!("{label}: log on growing and on recycled segment files"));
                    Some(recycled_runs(&log_dir, &payload, appenders, duration, args)?)
                }
            };
            progress(&format!("{label}: baselines (2/2)"));
            let [sync_each_b, bandwidth_b, grouped_b] =
                baselines(root.path(), &payload, appenders, args, duration, true)?;
            progress(&format!(
                "{label}: log {:.1} MB/s, plain_sync_each {:.1} MB/s, plain_bandwidth {:.1} MB/s, \
                 plain_grouped {:.1} MB/s",
                log.rate.mb_per_s(),
                mean_mb_per_s([sync_each_a, sync_each_b]),
                mean_mb_per_s([bandwidth_a, bandwidth_b]),
                mean_mb_per_s([grouped_a, grouped_b]),
            ));
            cells.push(Cell {
                size,
                appenders,
                log,
                sync_each: [sync_each_a, sync_each_b],
                bandwidth: [bandwidth_a, bandwidth_b],
                grouped: [grouped_a, grouped_b],
                recycled,
            });
        }
    }
    let root_path = root.path().display().to_string();
    root.close().with_context(|| format!("removing {root_path}"))?;

    let report = render(args, &root_path, &cells);
    std::io::stdout().write_all(report.as_bytes()).context("writing the report")?;
    Ok(())
}

fn progress(line: &str) {
    eprintln!("bench-log: {line}");
}

/// A record-sized payload of pseudo-random bytes (xorshift; no file system here compresses, but
/// there is no reason to hand it zeros).
fn payload(size: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Runs the three baselines once and returns them as [sync-each, bandwidth, grouped]. They run in
/// that order, or `reversed`: on this project's machines a run is measurably slowed by the run
/// just before it (the file system is still discarding the file that run deleted), so the second
/// pass of a cell reverses the order and no baseline always follows the same one.
fn baselines(
    dir: &Path,
    payload: &[u8],
    appenders: usize,
    args: &Args,
    duration: Duration,
    reversed: bool,
) -> Result<[Rate; 3]> {
    let group_len = (payload.len() * appenders).min(args.bandwidth_chunk.max(payload.len()));
    let mut order = [0, 1, 2];
    if reversed {
        order.reverse();
    }
    let mut rates = [Rate { bytes: 0, elapsed: Duration::ZERO }; 3];
    for which in order {
        rates[which] = match which {
            0 => plain_sync_each(dir, payload, duration)?,
            1 => plain_bandwidth(dir, payload, args.bandwidth_chunk, duration)?,
            _ => plain_bandwidth(dir, payload, group_len, duration)?,
        };
    }
    Ok(rates)
}

/// Creates `name` in `dir`, runs `body` on it, and deletes it again.
fn with_new_file<T>(dir: &Path, name: &str, body: impl FnOnce(&mut fs::File) -> Result<T>) -> Result<T> {
    let path = dir.join(name);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    let result = body(&mut file).with_context(|| format!("writing {}", path.display()));
    drop(file);
    fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    result
}

/// One thread: `write` one record, `fdatasync`, repeat until `duration` is over.
fn plain_sync_each(dir: &Path, payload: &[u8], duration: Duration) -> Result<Rate> {
    with_new_file(dir, "plain_sync_each", |file| {
        let start = Instant::now();
        let mut records = 0u64;
        while start.elapsed() < duration {
            file.write_all(payload)?;
            file.sync_data()?;
            records += 1;
        }
        Ok(Rate { bytes: records * payload.len() as u64, elapsed: start.elapsed() })
    })
}

/// One thread: `write` `chunk_len` bytes of back-to-back copies of the record, `fdatasync`, repeat
/// until `duration` is over.
fn plain_bandwidth(dir: &Path, payload: &[u8], chunk_len: usize, duration: Duration) -> Result<Rate> {
    let chunk: Vec<u8> = payload.iter().copied().cycle().take(chunk_len).collect();
    with_new_file(dir, "plain_bandwidth", |file| {
        let start = Instant::now();
        let mut chunks = 0u64;
        while start.elapsed() < duration {
            file.write_all(&chunk)?;
            file.sync_data()?;
            chunks += 1;
        }
        Ok(Rate { bytes: chunks * chunk.len() as u64, elapsed: start.elapsed() })
    })
}

/// Growing against recycled segment files, twice each in alternating order (a run is slowed by
/// the file deletions of the run before it, so neither always goes first).
fn recycled_runs(
    dir: &Path,
    payload: &[u8],
    appenders: usize,
    duration: Duration,
    args: &Args,
) -> Result<RecycledRuns> {
    let one = |segments| -> Result<LogRun> {
        let run = log_run(dir, payload, appenders, duration, args, segments)?;
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
        Ok(run)
    };
    let growing_a = one(Segments::ReclaimedDeleted)?;
    let reused_a = one(Segments::ReclaimedReused)?;
    let reused_b = one(Segments::ReclaimedReused)?;
    let growing_b = one(Segments::ReclaimedDeleted)?;
    Ok(RecycledRuns { growing: [growing_a, growing_b], reused: [reused_a, reused_b] })
}

/// The log configuration of every run: the defaults but for the segment size (and a record limit
/// that fits it) and the files kept.
fn run_config(args: &Args, segments: Segments) -> LogConfig {
    let segment_size_bytes = args.segment_mib << 20;
    let framing = (onekv_log::SEGMENT_HEADER_LEN + onekv_log::RECORD_HEADER_LEN) as u64;
    LogConfig {
        segment_size_bytes,
        max_record_bytes: u32::try_from((segment_size_bytes - framing).min(MAX_SIZE as u64))
            .expect("<= 16 MiB"),
        recycled_segments: if segments == Segments::ReclaimedReused { KEPT_FILES } else { 0 },
        ..LogConfig::default()
    }
}

/// Fills and reclaims segments until the segment being appended to reuses a file and the log
/// keeps another for the next roll: the steady state of a log whose reclamation keeps up (each
/// roll takes the file the reclamation after the previous roll gave back).
fn fill_kept_files(log: &Log) -> Result<()> {
    let filler = vec![0x5a; (1 << 20).min(log.config().max_record_bytes as usize)];
    while log.stats().segments_reused == 0 || log.free_files() == 0 {
        log.append(&[(KIND, &filler)])?;
        let active = log.segments().last().map_or(0, |s| s.base);
        log.reclaim_below(active)?;
    }
    Ok(())
}

/// `appenders` threads appending one record per call to a fresh log in `dir` until `duration` is
/// over. The run is timed from the moment all threads are released until the last one returns.
fn log_run(
    dir: &Path,
    payload: &[u8],
    appenders: usize,
    duration: Duration,
    args: &Args,
    segments: Segments,
) -> Result<LogRun> {
    let (log, _) = Log::open_path(dir, run_config(args, segments), OpenOptions::default())
        .with_context(|| format!("opening a log in {}", dir.display()))?;
    if segments == Segments::ReclaimedReused {
        fill_kept_files(&log).context("filling the kept files before the run")?;
    }
    let before = log.stats();
    let cpu_before = onekv_bench::CpuProbe::default().read();
    let barrier = Barrier::new(appenders + 1);
    let stop = AtomicBool::new(false);
    let (results, elapsed, reclaimed) = std::thread::scope(|scope| {
        // Reclaims each sealed segment as soon as it is sealed, as a log GC keeping up would.
        let reclaimer = (segments != Segments::Fresh).then(|| {
            scope.spawn(|| -> Result<()> {
                while !stop.load(Ordering::Relaxed) {
                    let active = log.segments().last().map_or(0, |s| s.base);
                    log.reclaim_below(active)?;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(())
            })
        });
        let threads: Vec<_> = (0..appenders)
            .map(|_| {
                scope.spawn(|| -> Result<(u64, Histogram<u64>)> {
                    let mut latency = latency_histogram();
                    let mut records = 0u64;
                    barrier.wait();
                    let start = Instant::now();
                    while start.elapsed() < duration {
                        let t = Instant::now();
                        log.append(&[(KIND, payload)])?;
                        latency.saturating_record(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
                        records += 1;
                    }
                    Ok((records, latency))
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let results: Vec<_> =
            threads.into_iter().map(|t| t.join().expect("appender thread panicked")).collect();
        let elapsed = start.elapsed();
        stop.store(true, Ordering::Relaxed);
        let reclaimed = reclaimer.map_or(Ok(()), |t| t.join().expect("reclaimer thread panicked"));
        (results, elapsed, reclaimed)
    });
    let after = log.stats();
    let (_, cpu_s) = onekv_bench::CpuProbe::default().read().since(&cpu_before);
    log.close().context("closing the log")?;
    reclaimed.context("reclaiming")?;

    let mut records = 0;
    let mut latency_us = latency_histogram();
    for result in results {
        let (n, hist) = result.context("appending")?;
        records += n;
        latency_us.add(&hist).context("merging latency histograms")?;
    }
    let stats = stats_delta(&before, &after);
    if stats.records != records {
        bail!("the log counted {} records, the appenders {records}", stats.records);
    }
    Ok(LogRun {
        rate: Rate { bytes: records * payload.len() as u64, elapsed },
        records,
        latency_us,
        stats,
        cpu_s,
    })
}

/// A histogram of append latencies in µs, 1 µs ..= one hour, three significant digits. Fixed
/// bounds: an auto-resizing histogram would clamp `saturating_record` to its initial tiny range.
fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds")
}

/// The counters accumulated between two snapshots (maxima are taken as they are at `after`).
fn stats_delta(before: &LogStats, after: &LogStats) -> LogStats {
    LogStats {
        bytes_written: after.bytes_written - before.bytes_written,
        bytes_synced: after.bytes_synced - before.bytes_synced,
        payload_bytes: after.payload_bytes - before.payload_bytes,
        records: after.records - before.records,
        writes: after.writes - before.writes,
        fsyncs: after.fsyncs - before.fsyncs,
        fsync_us_total: after.fsync_us_total - before.fsync_us_total,
        fsync_us_max: after.fsync_us_max,
        fsync_buckets: std::array::from_fn::<_, FSYNC_BUCKETS, _>(|i| {
            after.fsync_buckets[i] - before.fsync_buckets[i]
        }),
        segments_created: after.segments_created - before.segments_created,
        segments_reclaimed: after.segments_reclaimed - before.segments_reclaimed,
        segments_reused: after.segments_reused - before.segments_reused,
    }
}

fn mean_mb_per_s(runs: [Rate; 2]) -> f64 {
    (runs[0].mb_per_s() + runs[1].mb_per_s()) / 2.0
}

fn fmt_size(size: usize) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

/// A ratio with two decimals, or three significant digits when it is below 0.1.
fn fmt_ratio(r: f64) -> String {
    if r >= 0.1 || r == 0.0 || !r.is_finite() {
        format!("{r:.2}")
    } else {
        let decimals = (2 - r.log10().floor() as i32).clamp(2, 9) as usize;
        format!("{r:.decimals$}")
    }
}

/// The report: a short header and two markdown tables (results, then the log's internals).
fn render(args: &Args, root: &str, cells: &[Cell]) -> String {
    let mut out = String::new();
    let w = &mut out;
    let config = run_config(args, Segments::Fresh);
    let _ = writeln!(w, "## onekv bench-log\n");
    let _ = writeln!(
        w,
        "{} s per run; directory {root} (deleted); log defaults: {} MiB segments, {} MiB max write \
         per group commit. MB = 10^6 bytes of payload. plain_bandwidth writes {} per fdatasync. \
         Baselines: mean of one run before and one after the log run.\n",
        args.seconds,
        config.segment_size_bytes >> 20,
        config.max_write_bytes >> 20,
        fmt_size(args.bandwidth_chunk),
    );
    let _ = writeln!(
        w,
        "| size | appenders | log records/s | log MB/s | fsyncs/s | records/fsync | p50/p99 µs \
         | plain_sync_each MB/s | plain_bandwidth MB/s | plain_grouped MB/s | log/plain_sync_each \
         | log/plain_bandwidth | log/plain_grouped |"
    );
    let _ = writeln!(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for c in cells {
        let secs = c.log.rate.elapsed.as_secs_f64();
        let log_mb = c.log.rate.mb_per_s();
        let (sync_each, bandwidth) = (mean_mb_per_s(c.sync_each), mean_mb_per_s(c.bandwidth));
        let grouped = mean_mb_per_s(c.grouped);
        let _ = writeln!(
            w,
            "| {} | {} | {:.0} | {:.2} | {:.0} | {:.2} | {} / {} | {:.2} | {:.2} | {:.2} | {} | {} | {} |",
            fmt_size(c.size),
            c.appenders,
            c.log.records as f64 / secs,
            log_mb,
            c.log.stats.fsyncs as f64 / secs,
            c.log.records as f64 / c.log.stats.fsyncs.max(1) as f64,
            c.log.latency_us.value_at_quantile(0.5),
            c.log.latency_us.value_at_quantile(0.99),
            sync_each,
            bandwidth,
            grouped,
            fmt_ratio(log_mb / sync_each),
            fmt_ratio(log_mb / bandwidth),
            fmt_ratio(log_mb / grouped),
        );
    }
    let _ = writeln!(w, "\nLog internals and baseline spread:\n");
    let _ = writeln!(
        w,
        "| size | appenders | group commits | fsyncs | KiB written/fsync | mean fsync µs \
         | fsync p50/p99 µs (≤) | plain_sync_each runs MB/s | plain_bandwidth runs MB/s \
         | plain_grouped runs MB/s |"
    );
    let _ = writeln!(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for c in cells {
        let s = &c.log.stats;
        let fsyncs = s.fsyncs.max(1) as f64;
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {:.1} | {:.0} | {} / {} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} / {:.2} |",
            fmt_size(c.size),
            c.appenders,
            s.writes,
            s.fsyncs,
            s.bytes_written as f64 / 1024.0 / fsyncs,
            s.fsync_us_total as f64 / fsyncs,
            s.fsync_us_quantile(0.5),
            s.fsync_us_quantile(0.99),
            c.sync_each[0].mb_per_s(),
            c.sync_each[1].mb_per_s(),
            c.bandwidth[0].mb_per_s(),
            c.bandwidth[1].mb_per_s(),
            c.grouped[0].mb_per_s(),
            c.grouped[1].mb_per_s(),
        );
    }
    if cells.iter().any(|c| c.recycled.is_some()) {
        render_recycled(w, cells);
    }
    out
}

/// The `--recycled` table: means of two runs each, ratios recycled ÷ growing.
fn render_recycled(w: &mut String, cells: &[Cell]) {
    let _ = writeln!(
        w,
        "\nEvery sealed segment reclaimed at once; growing: its file deleted (each new segment grows \
         a new file); recycled: its file kept and reused ({KEPT_FILES} kept). Means of two runs each, \
         alternating; CPU is this process's (appenders, writer, reclaimer) per record:\n"
    );
    let _ = writeln!(
        w,
        "| size | appenders | growing records/s | recycled records/s | ratio | mean fsync µs growing / \
         recycled | p99 µs growing / recycled | CPU µs/record growing / recycled | ratio | segments \
         reused |"
    );
    let _ = writeln!(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mean = |runs: &[LogRun; 2], f: &dyn Fn(&LogRun) -> f64| (f(&runs[0]) + f(&runs[1])) / 2.0;
    for c in cells {
        let Some(r) = &c.recycled else { continue };
        let rate = |runs| mean(runs, &|run: &LogRun| run.records_per_s());
        let fsync = |runs| mean(runs, &|run: &LogRun| run.mean_fsync_us());
        let p99 = |runs| mean(runs, &|run: &LogRun| run.latency_us.value_at_quantile(0.99) as f64);
        let cpu = |runs| mean(runs, &|run: &LogRun| run.cpu_us_per_record().unwrap_or(f64::NAN));
        let _ = writeln!(
            w,
            "| {} | {} | {:.0} | {:.0} | {} | {:.0} / {:.0} | {:.0} / {:.0} | {:.1} / {:.1} | {} | {} |",
            fmt_size(c.size),
            c.appenders,
            rate(&r.growing),
            rate(&r.reused),
            fmt_ratio(rate(&r.reused) / rate(&r.growing)),
            fsync(&r.growing),
            fsync(&r.reused),
            p99(&r.growing),
            p99(&r.reused),
            cpu(&r.growing),
            cpu(&r.reused),
            fmt_ratio(cpu(&r.reused) / cpu(&r.growing)),
            r.reused[0].stats.segments_reused + r.reused[1].stats.segments_reused,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes_and_reject_nonsense() {
        assert_eq!(parse_size("128"), Ok(128));
        assert_eq!(parse_size("128B"), Ok(128));
        assert_eq!(parse_size("1KiB"), Ok(1024));
        assert_eq!(parse_size("16k"), Ok(16 << 10));
        assert_eq!(parse_size("16 MiB"), Ok(16 << 20));
        assert!(parse_size("0").is_err());
        assert!(parse_size("17MiB").is_err());
        assert!(parse_size("1GiB").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("1TiB").is_err());
        assert!(parse_size("KiB").is_err());
        assert!(parse_size("99999999999999999999").is_err());
    }

    #[test]
    fn appenders_and_seconds_are_bounded() {
        assert_eq!(parse_appenders("8"), Ok(8));
        assert!(parse_appenders("0").is_err());
        assert!(parse_appenders("100000").is_err());
        assert_eq!(parse_seconds("0.2"), Ok(0.2));
        assert!(parse_seconds("0").is_err());
        assert!(parse_seconds("-1").is_err());
        assert!(parse_seconds("NaN").is_err());
        assert!(parse_seconds("inf").is_err());
        assert!(parse_seconds("100000").is_err());
    }

    #[test]
    fn sizes_print_in_their_largest_whole_unit() {
        assert_eq!(fmt_size(128), "128 B");
        assert_eq!(fmt_size(1024), "1 KiB");
        assert_eq!(fmt_size(1536), "1536 B");
        assert_eq!(fmt_size(16 << 20), "16 MiB");
    }

    #[test]
    fn small_ratios_keep_three_significant_digits() {
        assert_eq!(fmt_ratio(1.234), "1.23");
        assert_eq!(fmt_ratio(0.5), "0.50");
        assert_eq!(fmt_ratio(0.0123), "0.0123");
        assert_eq!(fmt_ratio(0.000_987_6), "0.000988");
        assert_eq!(fmt_ratio(0.0), "0.00");
    }
}
