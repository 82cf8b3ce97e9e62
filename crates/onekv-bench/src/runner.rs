//! The closed-loop runner: N client tasks, each issuing its next operation as soon as the previous
//! one was answered, until the operation count or the time bound is reached.
//!
//! Owns: the loop, the bounds, latency histograms per operation type (µs, HDR), error and
//! not-found counts per type (an error is never dropped: it is counted and its first message
//! kept), the progress bar, and the report (JSON via serde, or a markdown table). Does not own
//! what an operation does (`target`) nor which one comes next (`workload`).

use std::fmt::Write as _;
use std::io::IsTerminal as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};

use crate::cpu::CpuProbe;
use crate::generator::{KEY_BYTES, record_key};
use crate::target::Target;
use crate::values::ValueKind;
use crate::workload::{KeySpace, Op, OpChooser, OpType, WorkloadKind};

/// Highest latency the histograms track exactly; slower operations are recorded as this.
const MAX_TRACKED_MICROS: u64 = 600_000_000;
/// How often the progress bar is refreshed.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(200);

/// What to run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The workload. `Load` inserts records `0..records`; the others assume they exist.
    pub workload: WorkloadKind,
    /// Records in the key space (the Load phase inserts this many).
    pub records: u64,
    /// Operations to issue in a transaction phase (ignored by Load, which issues `records`).
    pub operations: Option<u64>,
    /// Stop issuing operations after this long (operations in flight still complete).
    pub duration: Option<Duration>,
    /// Concurrent client tasks, each with one operation outstanding.
    pub threads: usize,
    /// Bytes of each value written.
    pub value_bytes: usize,
    /// What the values contain.
    pub values: ValueKind,
    /// Seeds every task's RNG (task `i` uses `seed + i`), so the same run issues the same operations.
    pub seed: u64,
    /// Draws a progress bar on stderr when it is a terminal.
    pub progress: bool,
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The configuration cannot describe a bounded run.
    #[error("invalid benchmark configuration: {0}")]
    Invalid(String),
}

/// Figures of one operation type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpReport {
    /// The operation type.
    pub op: OpType,
    /// Operations issued and answered (successful + failed).
    pub count: u64,
    /// Operations that failed (after the client's own retries).
    pub errors: u64,
    /// Successful reads (and read-modify-writes) that found no record; scans that found none.
    pub not_found: u64,
    /// Throughput of this type over the whole run, successful operations per second.
    pub ops_per_sec: f64,
    /// Latencies of the successful operations, in microseconds.
    pub mean_us: f64,
    /// Median latency (µs).
    pub p50_us: u64,
    /// 95th percentile (µs).
    pub p95_us: u64,
    /// 99th percentile (µs).
    pub p99_us: u64,
    /// 99.9th percentile (µs).
    pub p999_us: u64,
    /// Slowest successful operation (µs).
    pub max_us: u64,
    /// The first error's message, if any failed.
    pub first_error: Option<String>,
}

/// The outcome of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// The workload run.
    pub workload: WorkloadKind,
    /// Records in the key space at the start.
    pub records: u64,
    /// Client tasks.
    pub threads: usize,
    /// Bytes per key.
    pub key_bytes: usize,
    /// Bytes per value.
    pub value_bytes: usize,
    /// Operations answered (successful + failed).
    pub operations: u64,
    /// Operations that failed.
    pub errors: u64,
    /// From the first operation issued to the last answered.
    pub elapsed_seconds: f64,
    /// Successful operations per second.
    pub throughput_ops_per_sec: f64,
    /// Whether the time bound ended the run before the operation count was reached.
    pub stopped_by_time: bool,
    /// Keys plus values of every acknowledged write (insert, update, read-modify-write).
    pub payload_bytes_written: u64,
    /// Acknowledged inserts (new records).
    pub records_inserted: u64,
    /// One entry per operation type the workload issued.
    pub ops: Vec<OpReport>,
    /// CPU seconds the servers spent during the phase (user + system, every process), when the
    /// harness knows their processes ([`run_phases`]'s probe).
    #[serde(default)]
    pub server_cpu_seconds: Option<f64>,
    /// CPU seconds the benchmark process itself spent during the phase.
    #[serde(default)]
    pub client_cpu_seconds: Option<f64>,
}

impl RunReport {
    /// The figures of `op`, if the run issued it.
    pub fn op(&self, op: OpType) -> Option<&OpReport> {
        self.ops.iter().find(|report| report.op == op)
    }

    /// Microseconds of server CPU per successful operation, when measured.
    pub fn server_cpu_us_per_op(&self) -> Option<f64> {
        self.per_op_us(self.server_cpu_seconds)
    }

    /// Microseconds of the benchmark client's CPU per successful operation, when measured.
    pub fn client_cpu_us_per_op(&self) -> Option<f64> {
        self.per_op_us(self.client_cpu_seconds)
    }

    fn per_op_us(&self, seconds: Option<f64>) -> Option<f64> {
        let succeeded = self.operations.saturating_sub(self.errors);
        (succeeded > 0).then(|| seconds.map(|seconds| seconds * 1e6 / succeeded as f64)).flatten()
    }

    /// A markdown table: one line per operation type, latencies in µs.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "workload {}: {} operations in {:.2} s = {:.0} ops/s ({} threads, {} records, {} B keys, {} B values, {} errors{})\n",
            self.workload,
            self.operations,
            self.elapsed_seconds,
            self.throughput_ops_per_sec,
            self.threads,
            self.records,
            self.key_bytes,
            self.value_bytes,
            self.errors,
            if self.stopped_by_time { ", stopped by the time bound" } else { "" },
        );
        let cpu = |seconds: Option<f64>, per_op: Option<f64>| match (seconds, per_op) {
            (Some(seconds), Some(per_op)) => format!("{seconds:.1} s = {per_op:.0} µs/op"),
            _ => "not measured".to_string(),
        };
        let _ = writeln!(
            out,
            "CPU: servers {}, client {}\n",
            cpu(self.server_cpu_seconds, self.server_cpu_us_per_op()),
            cpu(self.client_cpu_seconds, self.client_cpu_us_per_op()),
        );
        out.push_str(
            "| op | count | errors | not found | ops/s | mean µs | p50 µs | p95 µs | p99 µs | p99.9 µs | max µs |\n",
        );
        out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for op in &self.ops {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.0} | {:.0} | {} | {} | {} | {} | {} |",
                op.op,
                op.count,
                op.errors,
                op.not_found,
                op.ops_per_sec,
                op.mean_us,
                op.p50_us,
                op.p95_us,
                op.p99_us,
                op.p999_us,
                op.max_us
            );
        }
        for op in self.ops.iter().filter(|op| op.errors > 0) {
            let message = op.first_error.as_deref().unwrap_or("?");
            let _ = writeln!(out, "\nfirst {} error: {message}", op.op);
        }
        out
    }
}

/// Everything one `onekv bench ycsb` invocation measured: each phase, then each node's
/// amplification over all of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// The phases in the order they ran (Load first when it ran).
    pub phases: Vec<RunReport>,
    /// Per node (= per replica of the one shard), over all phases.
    pub nodes: Vec<crate::amplification::NodeAmplification>,
}

/// Runs the Load phase first when `with_load` (and the workload is not Load itself), then
/// `config`'s workload; stops at the first phase that cannot start.
pub async fn run_phases<T: Target>(
    target: Arc<T>,
    config: &RunConfig,
    with_load: bool,
    cpu: &CpuProbe,
) -> Result<Vec<RunReport>, RunError> {
    let mut phases = Vec::new();
    if with_load && config.workload != WorkloadKind::Load {
        let load = RunConfig { workload: WorkloadKind::Load, ..config.clone() };
        phases.push(run_measured(Arc::clone(&target), load, cpu).await?);
    }
    phases.push(run_measured(target, config.clone(), cpu).await?);
    Ok(phases)
}

/// [`run`], with the CPU `cpu`'s processes spent meanwhile.
async fn run_measured<T: Target>(
    target: Arc<T>,
    config: RunConfig,
    cpu: &CpuProbe,
) -> Result<RunReport, RunError> {
    let before = cpu.read();
    let mut report = run(target, config).await?;
    (report.server_cpu_seconds, report.client_cpu_seconds) = cpu.read().since(&before);
    Ok(report)
}

/// Keys plus values of the records that exist after `phases`, one copy: the records the Load
/// phase inserted (or `records`, assumed loaded before, when no Load phase ran) plus every later
/// acknowledged insert.
pub fn live_bytes(records: u64, phases: &[RunReport]) -> u64 {
    let loaded = phases
        .iter()
        .find(|phase| phase.workload == WorkloadKind::Load)
        .map_or(records, |load| load.records_inserted);
    let inserted: u64 = phases
        .iter()
        .filter(|phase| phase.workload != WorkloadKind::Load)
        .map(|phase| phase.records_inserted)
        .sum();
    let record_bytes = phases.first().map_or(0, |phase| (phase.key_bytes + phase.value_bytes) as u64);
    (loaded + inserted) * record_bytes
}

/// What one task observed, merged into the report at the end.
struct TaskStats {
    latencies: Vec<Histogram<u64>>,
    errors: [u64; 5],
    not_found: [u64; 5],
    first_error: [Option<String>; 5],
    payload_bytes_written: u64,
    records_inserted: u64,
}

impl TaskStats {
    fn new() -> TaskStats {
        TaskStats {
            latencies: OpType::ALL.iter().map(|_| new_histogram()).collect(),
            errors: [0; 5],
            not_found: [0; 5],
            first_error: Default::default(),
            payload_bytes_written: 0,
            records_inserted: 0,
        }
    }

    fn merge(&mut self, other: TaskStats) {
        for (mine, theirs) in self.latencies.iter_mut().zip(&other.latencies) {
            mine.add(theirs).expect("histograms with the same bounds always merge");
        }
        for index in 0..5 {
            self.errors[index] += other.errors[index];
            self.not_found[index] += other.not_found[index];
            if self.first_error[index].is_none() {
                self.first_error[index].clone_from(&other.first_error[index]);
            }
        }
        self.payload_bytes_written += other.payload_bytes_written;
        self.records_inserted += other.records_inserted;
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_TRACKED_MICROS, 3).expect("valid histogram bounds")
}

/// State every task shares.
struct Shared<T> {
    target: Arc<T>,
    config: RunConfig,
    keys: KeySpace,
    /// Operations handed out (Load: the next ordinal to insert).
    issued: AtomicU64,
    /// Operations answered, for the progress bar.
    answered: AtomicU64,
    limit: u64,
    deadline: Option<Instant>,
}

/// Runs `config` against `target` on the current tokio runtime and reports what happened.
/// Fails only on a configuration that does not bound the run; operation failures are counted.
pub async fn run<T: Target>(target: Arc<T>, config: RunConfig) -> Result<RunReport, RunError> {
    if config.threads == 0 {
        return Err(RunError::Invalid("threads must be at least 1".into()));
    }
    let load = config.workload == WorkloadKind::Load;
    if !load && config.records == 0 {
        return Err(RunError::Invalid(format!("workload {} needs at least one record", config.workload)));
    }
    let limit = if load { config.records } else { config.operations.unwrap_or(u64::MAX) };
    if !load && config.operations.is_none() && config.duration.is_none() {
        return Err(RunError::Invalid("give an operation count or a time bound".into()));
    }
    let start = Instant::now();
    let shared = Arc::new(Shared {
        target,
        keys: KeySpace::new(config.records),
        issued: AtomicU64::new(0),
        answered: AtomicU64::new(0),
        limit,
        deadline: config.duration.map(|duration| start + duration),
        config,
    });

    let bar = progress_bar(&shared.config, limit);
    let ticker = {
        let shared = Arc::clone(&shared);
        let bar = bar.clone();
        tokio::spawn(async move {
            loop {
                update_bar(&bar, &shared, start);
                tokio::time::sleep(PROGRESS_INTERVAL).await;
            }
        })
    };

    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..shared.config.threads {
        let shared = Arc::clone(&shared);
        tasks.spawn(async move { client_task(&shared, task as u64).await });
    }
    let mut stats = TaskStats::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(task_stats) => stats.merge(task_stats),
            Err(error) if error.is_panic() => {
                ticker.abort();
                std::panic::resume_unwind(error.into_panic())
            }
            Err(error) => panic!("a client task was cancelled: {error}"),
        }
    }
    let elapsed = start.elapsed();
    ticker.abort();
    update_bar(&bar, &shared, start);
    bar.finish_and_clear();

    let issued = shared.issued.load(Ordering::Relaxed).min(limit);
    let stopped_by_time =
        shared.deadline.is_some_and(|deadline| Instant::now() >= deadline) && issued < limit;
    Ok(report(&shared.config, stats, elapsed, stopped_by_time))
}

fn report(config: &RunConfig, stats: TaskStats, elapsed: Duration, stopped_by_time: bool) -> RunReport {
    let seconds = elapsed.as_secs_f64().max(1e-9);
    let mut ops = Vec::new();
    let mut operations = 0;
    let mut errors = 0;
    let mut succeeded = 0;
    for op in OpType::ALL {
        let index = op.index();
        let latencies = &stats.latencies[index];
        let ok = latencies.len();
        let count = ok + stats.errors[index];
        if count == 0 {
            continue;
        }
        operations += count;
        errors += stats.errors[index];
        succeeded += ok;
        let quantile = |q: f64| if ok == 0 { 0 } else { latencies.value_at_quantile(q) };
        ops.push(OpReport {
            op,
            count,
            errors: stats.errors[index],
            not_found: stats.not_found[index],
            ops_per_sec: ok as f64 / seconds,
            mean_us: if ok == 0 { 0.0 } else { latencies.mean() },
            p50_us: quantile(0.5),
            p95_us: quantile(0.95),
            p99_us: quantile(0.99),
            p999_us: quantile(0.999),
            max_us: if ok == 0 { 0 } else { latencies.max() },
            first_error: stats.first_error[index].clone(),
        });
    }
    RunReport {
        workload: config.workload,
        records: config.records,
        threads: config.threads,
        key_bytes: KEY_BYTES,
        value_bytes: config.value_bytes,
        operations,
        errors,
        elapsed_seconds: seconds,
        throughput_ops_per_sec: succeeded as f64 / seconds,
        stopped_by_time,
        payload_bytes_written: stats.payload_bytes_written,
        records_inserted: stats.records_inserted,
        ops,
        server_cpu_seconds: None,
        client_cpu_seconds: None,
    }
}

/// One closed-loop client: next operation, wait for its answer, record, repeat.
async fn client_task<T: Target>(shared: &Shared<T>, task: u64) -> TaskStats {
    let config = &shared.config;
    let load = config.workload == WorkloadKind::Load;
    let mut rng = StdRng::seed_from_u64(config.seed.wrapping_add(task));
    let mut chooser = OpChooser::new(config.workload.spec(), config.records);
    let mut value = vec![0u8; config.value_bytes];
    let mut stats = TaskStats::new();
    loop {
        if shared.deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            break;
        }
        let number = shared.issued.fetch_add(1, Ordering::Relaxed);
        if number >= shared.limit {
            break;
        }
        let op = if load {
            Op { op: OpType::Insert, ordinal: number, scan_length: 0 }
        } else {
            chooser.next(&mut rng, &shared.keys)
        };
        crate::values::fill(config.values, &mut rng, &mut value);
        execute(shared, op, &value, &mut stats).await;
        shared.answered.fetch_add(1, Ordering::Relaxed);
    }
    stats
}

/// Issues `op`, times it and records the outcome in `stats`.
async fn execute<T: Target>(shared: &Shared<T>, op: Op, value: &[u8], stats: &mut TaskStats) {
    let key = record_key(op.ordinal);
    let key = key.as_bytes();
    let target = &*shared.target;
    let started = Instant::now();
    // Ok(found): whether the operation found what it looked for (writes always do).
    let outcome = match op.op {
        OpType::Read => target.read(key).await,
        OpType::Update => target.update(key, value).await.map(|()| true),
        OpType::Insert => target.insert(key, value).await.map(|()| true),
        OpType::Scan => target.scan(key, op.scan_length).await.map(|read| read > 0),
        OpType::ReadModifyWrite => target.read_modify_write(key, value).await,
    };
    let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX).max(1);
    let index = op.op.index();
    match outcome {
        Ok(found) => {
            stats.latencies[index].saturating_record(micros);
            if !found {
                stats.not_found[index] += 1;
            }
            if matches!(op.op, OpType::Update | OpType::Insert | OpType::ReadModifyWrite) {
                stats.payload_bytes_written += (key.len() + value.len()) as u64;
            }
            if op.op == OpType::Insert {
                stats.records_inserted += 1;
                if shared.config.workload != WorkloadKind::Load {
                    shared.keys.acknowledge(op.ordinal);
                }
            }
        }
        Err(error) => {
            stats.errors[index] += 1;
            if stats.first_error[index].is_none() {
                stats.first_error[index] = Some(error.to_string());
            }
        }
    }
}

/// A bar over the operation count, or over the time bound when only that bounds the run; hidden
/// unless asked for and stderr is a terminal.
fn progress_bar(config: &RunConfig, limit: u64) -> ProgressBar {
    if !config.progress || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let (length, template) = if limit == u64::MAX {
        let millis = config.duration.map_or(0, |duration| duration.as_millis() as u64);
        (millis, "{prefix} [{elapsed_precise}] {wide_bar} {msg}")
    } else {
        (limit, "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} ops, {msg}")
    };
    let bar = ProgressBar::new(length);
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.set_prefix(format!("workload {}", config.workload));
    bar
}

fn update_bar<T>(bar: &ProgressBar, shared: &Shared<T>, start: Instant) {
    let answered = shared.answered.load(Ordering::Relaxed);
    let seconds = start.elapsed().as_secs_f64().max(1e-9);
    if shared.limit == u64::MAX {
        bar.set_position(start.elapsed().as_millis() as u64);
        bar.set_message(format!("{answered} ops, {:.0} ops/s", answered as f64 / seconds));
    } else {
        bar.set_position(answered);
        bar.set_message(format!("{:.0} ops/s", answered as f64 / seconds));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use super::*;
    use crate::target::{TargetError, TargetResult};

    /// An in-memory store that fails every `fail_every`-th write (0: never) and may sleep per call.
    #[derive(Default)]
    struct MemoryTarget {
        data: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
        writes: AtomicU64,
        fail_every: u64,
        delay: Duration,
    }

    impl MemoryTarget {
        async fn pause(&self) {
            if !self.delay.is_zero() {
                tokio::time::sleep(self.delay).await;
            }
        }

        async fn write(&self, key: &[u8], value: &[u8]) -> TargetResult<()> {
            self.pause().await;
            let number = self.writes.fetch_add(1, Ordering::Relaxed) + 1;
            if self.fail_every > 0 && number.is_multiple_of(self.fail_every) {
                return Err(TargetError(format!("injected failure of write {number}")));
            }
            self.data.lock().unwrap().insert(key.to_vec(), value.to_vec());
            Ok(())
        }
    }

    impl Target for MemoryTarget {
        async fn read(&self, key: &[u8]) -> TargetResult<bool> {
            self.pause().await;
            Ok(self.data.lock().unwrap().contains_key(key))
        }
        async fn update(&self, key: &[u8], value: &[u8]) -> TargetResult<()> {
            self.write(key, value).await
        }
        async fn insert(&self, key: &[u8], value: &[u8]) -> TargetResult<()> {
            self.write(key, value).await
        }
        async fn scan(&self, start: &[u8], count: u32) -> TargetResult<usize> {
            Ok(self.data.lock().unwrap().range(start.to_vec()..).take(count as usize).count())
        }
        async fn read_modify_write(&self, key: &[u8], value: &[u8]) -> TargetResult<bool> {
            let found = self.read(key).await?;
            self.write(key, value).await?;
            Ok(found)
        }
    }

    fn config(workload: WorkloadKind, records: u64, operations: u64) -> RunConfig {
        RunConfig {
            workload,
            records,
            operations: Some(operations),
            duration: None,
            threads: 4,
            value_bytes: 16,
            values: ValueKind::Random,
            seed: 1,
            progress: false,
        }
    }

    async fn loaded(records: u64) -> Arc<MemoryTarget> {
        let target = Arc::new(MemoryTarget::default());
        let report = run(Arc::clone(&target), config(WorkloadKind::Load, records, 0)).await.unwrap();
        assert_eq!(report.records_inserted, records);
        target
    }

    #[tokio::test]
    async fn load_inserts_every_record_once() {
        let target = loaded(500).await;
        let data = target.data.lock().unwrap();
        assert_eq!(data.len(), 500);
        assert!((0..500).all(|ordinal| data.contains_key(record_key(ordinal).as_bytes())));
        assert!(data.values().all(|value| value.len() == 16));
    }

    #[tokio::test]
    async fn every_workload_runs_its_operation_count_and_finds_loaded_records() {
        for kind in WorkloadKind::ALL.into_iter().skip(1) {
            let target = loaded(300).await;
            let report = run(Arc::clone(&target), config(kind, 300, 1000)).await.unwrap();
            assert_eq!(report.operations, 1000, "{kind}");
            assert_eq!(report.errors, 0, "{kind}");
            let total: u64 = report.ops.iter().map(|op| op.count).sum();
            assert_eq!(total, 1000);
            for op in &report.ops {
                assert!(op.count > 0 && op.max_us >= op.p50_us, "{kind}: {op:?}");
                if matches!(op.op, OpType::Read | OpType::ReadModifyWrite | OpType::Scan) {
                    // Inserted records may be read before their insert is acknowledged, rarely.
                    assert!(op.not_found * 100 <= op.count, "{kind}: {op:?}");
                }
            }
            let issued: Vec<OpType> = report.ops.iter().map(|op| op.op).collect();
            let expected: Vec<OpType> =
                OpType::ALL.into_iter().filter(|&op| kind.spec().mix.share(op) > 0.0).collect();
            assert_eq!(issued, expected, "{kind}");
            // JSON round trip (floats may differ in the last digit, so compare the counts).
            let json = serde_json::to_string(&report).unwrap();
            let parsed: RunReport = serde_json::from_str(&json).unwrap();
            assert_eq!(
                parsed.ops.iter().map(|op| (op.op, op.count)).collect::<Vec<_>>(),
                report.ops.iter().map(|op| (op.op, op.count)).collect::<Vec<_>>()
            );
        }
    }

    #[tokio::test]
    async fn failures_are_counted_with_their_first_message() {
        let target = Arc::new(MemoryTarget { fail_every: 10, ..MemoryTarget::default() });
        let report = run(target, config(WorkloadKind::Load, 200, 0)).await.unwrap();
        let insert = report.op(OpType::Insert).unwrap();
        assert_eq!((insert.count, insert.errors), (200, 20));
        assert_eq!(report.records_inserted, 180);
        assert!(insert.first_error.as_deref().unwrap().contains("injected failure"));
        assert_eq!(report.payload_bytes_written, 180 * (KEY_BYTES as u64 + 16));
        let table = report.markdown();
        assert!(table.contains("| insert | 200 | 20 |"), "{table}");
        assert!(table.contains("first insert error: injected failure"), "{table}");
    }

    #[tokio::test]
    async fn the_time_bound_stops_a_run() {
        let target = Arc::new(MemoryTarget { delay: Duration::from_millis(5), ..MemoryTarget::default() });
        let mut config = config(WorkloadKind::A, 100, 0);
        config.operations = None;
        config.duration = Some(Duration::from_millis(300));
        let report = run(target, config).await.unwrap();
        assert!(report.stopped_by_time);
        assert!(report.elapsed_seconds < 2.0, "{}", report.elapsed_seconds);
        // 4 tasks, ~5 ms per op, 300 ms: far more than a few and far fewer than unbounded.
        assert!((20..=400).contains(&report.operations), "{}", report.operations);
    }

    #[tokio::test]
    async fn an_unbounded_run_is_refused() {
        let mut config = config(WorkloadKind::B, 10, 0);
        config.operations = None;
        assert!(run(Arc::new(MemoryTarget::default()), config).await.is_err());
        let mut config = self::config(WorkloadKind::B, 10, 10);
        config.threads = 0;
        assert!(run(Arc::new(MemoryTarget::default()), config).await.is_err());
    }
}
