//! Prometheus metrics of a node: request counters and latency histograms, and the node's state
//! (Raft, log, index, disk) read from the replica when scraped. Every name is documented in
//! `docs/metrics.md`; a test checks that the two agree.
//!
//! Two recorders, both from `metrics-exporter-prometheus`:
//! - request metrics (`onekv_requests_total`, `onekv_request_duration_seconds`) are events, recorded
//!   through the `metrics` facade by whichever front end served the request (gRPC here, RESP in
//!   `onekv-resp`), into the process-wide recorder [`install_request_recorder`] installs;
//! - node state is a snapshot: [`NodeMetrics::render`] copies a [`ReplicaStatus`] into a recorder of
//!   its own at scrape time (so two nodes in one process, as in tests, never mix their state), and
//!   writes the fsync latency histogram itself, because the log already keeps it bucketed.
//!
//! Does not own the HTTP endpoint (`http`) nor the counters themselves (the log, the index and
//! the replica keep them).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use onekv_log::FSYNC_BUCKETS;
use onekv_replica::ReplicaStatus;

/// Counter of requests served: labels `protocol` (`grpc`, `resp`), `op`, `outcome` (`ok`, `error`).
pub const REQUESTS_TOTAL: &str = "onekv_requests_total";
/// Histogram of request latency in seconds: labels `protocol`, `op`.
pub const REQUEST_DURATION_SECONDS: &str = "onekv_request_duration_seconds";

/// Buckets of [`REQUEST_DURATION_SECONDS`]: 100 µs to 10 s, about three per decade, so both a read
/// served from memory and a write waiting for an fsync and a quorum land in a meaningful bucket.
pub const REQUEST_DURATION_BUCKETS: [f64; 16] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Name of the fsync latency histogram, which [`NodeMetrics`] renders by hand.
const FSYNC_DURATION_SECONDS: &str = "onekv_log_fsync_duration_seconds";

static REQUEST_RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// How often the request recorder's histograms are drained into their buckets. The recorder keeps
/// every recorded latency until then (about 16 bytes per request), so without this a node whose
/// `/metrics` nobody scrapes grew by that much per request for ever (250 MiB per 16 million
/// requests: `tests/metrics_memory.rs`).
pub const UPKEEP_INTERVAL: Duration = Duration::from_millis(200);

/// Installs the process-wide recorder of request metrics, once; later calls return the same
/// handle. `None` when another recorder was installed first (then request metrics go there and
/// `/metrics` shows node state only; a warning says so).
pub fn install_request_recorder() -> Option<PrometheusHandle> {
    REQUEST_RECORDER
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(REQUEST_DURATION_SECONDS.to_string()),
                    &REQUEST_DURATION_BUCKETS,
                )
                .expect("the request duration buckets are not empty");
            match builder.install_recorder() {
                Ok(handle) => {
                    // `install_recorder` leaves the upkeep to its caller (only `install`, which
                    // also starts an HTTP listener of its own, spawns it). The recorder lives as
                    // long as the process, and so does this thread.
                    let upkeep = handle.clone();
                    let started = std::thread::Builder::new().name("onekv-metrics".into()).spawn(move || {
                        loop {
                            std::thread::sleep(UPKEEP_INTERVAL);
                            upkeep.run_upkeep();
                        }
                    });
                    if let Err(error) = started {
                        tracing::warn!(%error, "cannot start the metrics upkeep thread; latencies are kept until /metrics is read");
                    }
                    describe_counter!(
                        REQUESTS_TOTAL,
                        "Requests served, by protocol, operation and outcome (ok or error)."
                    );
                    describe_histogram!(
                        REQUEST_DURATION_SECONDS,
                        metrics::Unit::Seconds,
                        "Request latency from receipt to response, by protocol and operation."
                    );
                    Some(handle)
                }
                Err(error) => {
                    tracing::warn!(%error, "another metrics recorder is installed; /metrics shows node state only");
                    None
                }
            }
        })
        .clone()
}

/// Records one request of `protocol` (`grpc`, `resp`) and operation `op` that took `elapsed`.
/// Costs nothing measurable when no recorder is installed (no HTTP endpoint).
pub fn record_request(protocol: &'static str, op: &'static str, ok: bool, elapsed: Duration) {
    let outcome = if ok { "ok" } else { "error" };
    counter!(REQUESTS_TOTAL, "protocol" => protocol, "op" => op, "outcome" => outcome).increment(1);
    histogram!(REQUEST_DURATION_SECONDS, "protocol" => protocol, "op" => op).record(elapsed.as_secs_f64());
}

/// One node's metrics endpoint: renders the request metrics and a snapshot of the node's state.
pub struct NodeMetrics {
    node_id: u64,
    data_dir: PathBuf,
    requests: Option<PrometheusHandle>,
    state: PrometheusRecorder,
}

impl NodeMetrics {
    /// Metrics of node `node_id`, whose data directory is `data_dir` (for disk usage). Installs the
    /// request recorder if no one has yet.
    pub fn new(node_id: u64, data_dir: &Path) -> Self {
        let state = PrometheusBuilder::new().build_recorder();
        metrics::with_local_recorder(&state, describe_state_metrics);
        NodeMetrics { node_id, data_dir: data_dir.to_path_buf(), requests: install_request_recorder(), state }
    }

    /// The Prometheus text exposition (format 0.0.4) of everything, with the node state taken from
    /// `status`. Walks the data directory for disk usage: call it off the async workers.
    pub fn render(&self, statuses: &[ReplicaStatus]) -> String {
        let disk = disk_usage(&self.data_dir);
        let status = &ReplicaStatus::summarize(statuses);
        metrics::with_local_recorder(&self.state, || {
            record_state(self.node_id, status, &disk);
            record_shards(statuses);
        });
        let mut text = String::new();
        if let Some(requests) = &self.requests {
            requests.run_upkeep();
            text.push_str(&requests.render());
        }
        self.state.handle().run_upkeep();
        text.push_str(&self.state.handle().render());
        render_fsync_histograms(&mut text, status);
        text
    }
}

fn describe_state_metrics() {
    use metrics::Unit::{Bytes, Count, Seconds};
    describe_gauge!("onekv_node_info", "Always 1; labels name this node's id and storage mode.");
    describe_gauge!("onekv_shard_term", Count, "Current Raft term of the shard's group.");
    describe_gauge!("onekv_shard_commit_index", Count, "Commit index of the shard's group known here.");
    describe_gauge!("onekv_shard_applied_index", Count, "Highest index of the shard applied here.");
    describe_gauge!("onekv_shard_flushed_index", Count, "The shard tree's flush flag.");
    describe_gauge!("onekv_shard_index_sorted_runs", Count, "Sorted runs of the shard's index tree on disk.");
    describe_gauge!(
        "onekv_shard_index_leveled",
        "1 while the shard's index tree is in the leveled form, else 0."
    );
    describe_gauge!("onekv_shard_is_leader", "1 while this node leads the shard, else 0.");
    describe_gauge!("onekv_shard_has_leader", "1 while this node knows the shard's leader, else 0.");
    describe_gauge!(
        "onekv_shard_recovery_replayed",
        Count,
        "Entries the last start replayed into the shard's tree."
    );
    describe_gauge!("onekv_raft_term", Count, "Current Raft term.");
    describe_gauge!("onekv_raft_commit_index", Count, "Raft commit index known to this node.");
    describe_gauge!("onekv_raft_applied_index", Count, "Highest Raft index applied to the index here.");
    describe_gauge!("onekv_raft_first_index", Count, "First Raft index still in this node's Raft log.");
    describe_gauge!("onekv_raft_last_index", Count, "Last Raft index in this node's Raft log.");
    describe_gauge!("onekv_raft_is_leader", "1 while this node is the leader, else 0.");
    describe_gauge!("onekv_raft_has_leader", "1 while this node knows a leader, else 0.");
    describe_counter!("onekv_raft_leader_changes_total", Count, "Times this node learned of a new leader.");
    describe_gauge!("onekv_replica_failed", "1 once a storage failure stopped this replica's writes.");
    describe_counter!("onekv_log_bytes_appended_total", Bytes, "Bytes written to the log's files.");
    describe_counter!(
        "onekv_log_bytes_synced_total",
        Bytes,
        "Bytes of the log covered by a successful fsync."
    );
    describe_counter!("onekv_log_payload_bytes_total", Bytes, "Payload bytes appended by the replica.");
    describe_counter!("onekv_log_records_total", Count, "Records appended to the log.");
    describe_counter!("onekv_log_writes_total", Count, "Group commits: writes carrying appended records.");
    describe_counter!("onekv_log_fsyncs_total", Count, "Successful fsyncs of log files and directories.");
    describe_gauge!("onekv_log_fsync_max_seconds", Seconds, "Slowest fsync since the node started.");
    describe_counter!("onekv_log_segments_created_total", Count, "Log segment files created.");
    describe_counter!(
        "onekv_log_segments_reclaimed_total",
        Count,
        "Log segments reclaimed (files deleted or kept for reuse)."
    );
    describe_counter!(
        "onekv_log_segments_reused_total",
        Count,
        "Log segments that reused a reclaimed segment's file."
    );
    describe_gauge!(
        "onekv_log_size_bytes",
        Bytes,
        "Bytes between the log's first retained and end position."
    );
    describe_counter!("onekv_index_flushes_total", Count, "Index memtable flushes.");
    describe_counter!(
        "onekv_index_budget_flushes_total",
        Count,
        "Flushes of followed shards' memtables because together they held index.follower_memtable_bytes."
    );
    describe_counter!("onekv_index_compactions_total", Count, "Index compaction steps that changed a tree.");
    describe_counter!(
        "onekv_index_bytes_written_total",
        Bytes,
        "Bytes of index tables and manifests written."
    );
    describe_counter!(
        "onekv_index_compaction_bytes_total",
        Bytes,
        "Bytes written by index compactions, by the layout of the tree compacted (leveled, runs)."
    );
    describe_gauge!("onekv_index_memtable_bytes", Bytes, "Bytes in the shard index's active memtable.");
    describe_gauge!("onekv_index_flushed_index", Count, "Raft index up to which the index is persisted.");
    describe_counter!("onekv_bytes_written_total", Bytes, "Bytes this node wrote to disk: logs and index.");
    describe_counter!("onekv_user_bytes_total", Bytes, "Key and value bytes applied on this node.");
    describe_gauge!("onekv_write_amplification", "Engine write amplification: bytes written per user byte.");
    describe_gauge!("onekv_disk_bytes", Bytes, "Bytes on disk per component of the data directory.");
    describe_gauge!("onekv_disk_free_bytes", Bytes, "Free bytes on the data directory's file system.");
    describe_gauge!(
        "onekv_disk_full_alarm",
        "1 while the disk-full alarm is raised (writes refused), else 0."
    );
    describe_gauge!("onekv_disk_reserve_bytes", Bytes, "Bytes of disk reserve held (0 once given up).");
    describe_counter!(
        "onekv_corrupt_values_total",
        Count,
        "Distinct stored values found damaged (checksum mismatch) by reads, snapshot builds and the scrub."
    );
    describe_counter!(
        "onekv_repaired_values_total",
        Count,
        "Damaged values replaced by another replica's healthy copy."
    );
    describe_counter!(
        "onekv_expired_keys_deleted_total",
        Count,
        "Expired keys deleted (each shard leader's expiry sweep, applied by every replica)."
    );
    describe_counter!("onekv_scrub_passes_total", Count, "Full passes of the background scrub.");
    describe_gauge!("onekv_gc_log_bytes", Bytes, "Bytes in the log's segment files (log GC's view).");
    describe_counter!(
        "onekv_dedup_candidates_total",
        Count,
        "Values at or above dedup.min_value_bytes applied (deduplication on)."
    );
    describe_counter!(
        "onekv_dedup_hits_total",
        Count,
        "Values pointed at an existing identical copy: at apply (path=\"inline\") or by the log GC \
         (path=\"offline\")."
    );
    describe_counter!(
        "onekv_dedup_mismatches_total",
        Count,
        "Fingerprint matches whose bytes differed (never shared)."
    );
    describe_counter!("onekv_dedup_bytes_saved_total", Bytes, "Value bytes not stored or moved again.");
    describe_counter!(
        "onekv_dedup_references_total",
        "Puts applied by reference to another key's value (dedup.references on the leader)."
    );
    describe_counter!(
        "onekv_dedup_late_references_total",
        "Puts by reference applied while the log GC was collecting their copy (moved with it)."
    );
    describe_counter!("onekv_peer_bytes_sent_total", Bytes, "Bytes of Raft messages delivered to peers.");
    describe_gauge!("onekv_dedup_entries", Count, "Entries in the content index (fingerprint to copy).");
    describe_gauge!(
        "onekv_dedup_inline_active",
        "1 while values are deduplicated at apply (elastic mode switches it), else 0."
    );
    describe_counter!("onekv_dedup_switches_total", Count, "Times elastic dedup switched inline dedup.");
    describe_gauge!(
        "onekv_gc_live_bytes",
        Bytes,
        "The log GC's estimate of the live bytes in the log (values some key still points at)."
    );
    describe_gauge!(
        "onekv_gc_space_amplification",
        "Log bytes divided by live bytes, as the log GC estimates."
    );
    describe_counter!(
        "onekv_gc_values_relocated_total",
        Count,
        "Live values the log GC moved to the log's head."
    );
    describe_counter!("onekv_gc_bytes_relocated_total", Bytes, "Bytes of values the log GC moved.");
    describe_counter!("onekv_gc_segments_reclaimed_total", Count, "Log segment files the log GC deleted.");
    describe_counter!(
        "onekv_gc_bytes_reclaimed_total",
        Bytes,
        "Bytes of the segment files the log GC deleted."
    );
    describe_counter!("onekv_gc_bytes_scanned_total", Bytes, "Bytes of log segments the log GC read.");
    describe_counter!(
        "onekv_gc_values_packed_total",
        Count,
        "Small values the log GC moved into compressed blocks."
    );
    describe_counter!(
        "onekv_gc_packed_raw_bytes_total",
        Bytes,
        "Bytes of the pairs the log GC compressed, before compression."
    );
    describe_counter!(
        "onekv_gc_packed_bytes_total",
        Bytes,
        "Bytes of the compressed blocks the log GC wrote."
    );
    describe_counter!("onekv_gc_busy_seconds_total", Seconds, "Seconds the log GC spent in its rounds.");
    describe_counter!("onekv_scrub_values_checked_total", Count, "Values the background scrub verified.");
    describe_gauge!(
        "onekv_scrub_last_pass_timestamp_seconds",
        Seconds,
        "Unix time the scrub's last full pass finished (0: none yet)."
    );
}

/// Copies `status` into the current (local) recorder.
fn record_state(node_id: u64, status: &ReplicaStatus, disk: &[(String, u64)]) {
    let count = |n: u64| n as f64;
    gauge!("onekv_node_info", "node_id" => node_id.to_string(), "storage" => status.storage.name()).set(1.0);
    gauge!("onekv_raft_term").set(count(status.term));
    gauge!("onekv_raft_commit_index").set(count(status.commit_index));
    gauge!("onekv_raft_applied_index").set(count(status.applied_index));
    gauge!("onekv_raft_first_index").set(count(status.first_index));
    gauge!("onekv_raft_last_index").set(count(status.last_index));
    gauge!("onekv_raft_is_leader").set(if status.role == "leader" { 1.0 } else { 0.0 });
    gauge!("onekv_raft_has_leader").set(if status.leader_id.is_some() { 1.0 } else { 0.0 });
    counter!("onekv_raft_leader_changes_total").absolute(status.leader_changes);
    gauge!("onekv_replica_failed").set(if status.failure.is_some() { 1.0 } else { 0.0 });
    for log in &status.logs {
        let stats = &log.stats;
        let name = log.name.clone();
        counter!("onekv_log_bytes_appended_total", "log" => name.clone()).absolute(stats.bytes_written);
        counter!("onekv_log_bytes_synced_total", "log" => name.clone()).absolute(stats.bytes_synced);
        counter!("onekv_log_payload_bytes_total", "log" => name.clone()).absolute(stats.payload_bytes);
        counter!("onekv_log_records_total", "log" => name.clone()).absolute(stats.records);
        counter!("onekv_log_writes_total", "log" => name.clone()).absolute(stats.writes);
        counter!("onekv_log_fsyncs_total", "log" => name.clone()).absolute(stats.fsyncs);
        gauge!("onekv_log_fsync_max_seconds", "log" => name.clone()).set(stats.fsync_us_max as f64 / 1e6);
        counter!("onekv_log_segments_created_total", "log" => name.clone()).absolute(stats.segments_created);
        counter!("onekv_log_segments_reclaimed_total", "log" => name.clone())
            .absolute(stats.segments_reclaimed);
        counter!("onekv_log_segments_reused_total", "log" => name.clone()).absolute(stats.segments_reused);
        gauge!("onekv_log_size_bytes", "log" => name).set(count(log.bytes));
    }
    counter!("onekv_index_flushes_total").absolute(status.index_flushes);
    counter!("onekv_index_budget_flushes_total").absolute(status.index_budget_flushes);
    counter!("onekv_index_compactions_total").absolute(status.index_compactions);
    counter!("onekv_index_bytes_written_total").absolute(status.index_bytes_written);
    counter!("onekv_index_compaction_bytes_total", "layout" => "leveled")
        .absolute(status.index_leveled_compaction_bytes);
    counter!("onekv_index_compaction_bytes_total", "layout" => "runs")
        .absolute(status.index_runs_compaction_bytes);
    gauge!("onekv_index_memtable_bytes").set(count(status.memtable_bytes));
    gauge!("onekv_index_flushed_index").set(count(status.flushed_index));
    counter!("onekv_bytes_written_total").absolute(status.bytes_written);
    counter!("onekv_user_bytes_total").absolute(status.user_bytes);
    gauge!("onekv_write_amplification").set(write_amplification(status));
    gauge!("onekv_disk_free_bytes").set(count(status.disk.free_bytes));
    gauge!("onekv_disk_full_alarm").set(if status.disk.alarm.is_some() { 1.0 } else { 0.0 });
    gauge!("onekv_disk_reserve_bytes").set(count(status.disk.reserve_bytes));
    for (component, bytes) in disk {
        gauge!("onekv_disk_bytes", "component" => component.clone()).set(count(*bytes));
    }
    counter!("onekv_corrupt_values_total").absolute(status.corrupt_values);
    counter!("onekv_repaired_values_total").absolute(status.repaired_values);
    counter!("onekv_expired_keys_deleted_total").absolute(status.expired_keys_deleted);
    counter!("onekv_read_barriers_total", "by" => "lease").absolute(status.reads_by_lease);
    counter!("onekv_read_barriers_total", "by" => "read_index").absolute(status.reads_by_read_index);
    counter!("onekv_scrub_passes_total").absolute(status.scrub.passes);
    counter!("onekv_scrub_values_checked_total").absolute(status.scrub.values_checked);
    gauge!("onekv_scrub_last_pass_timestamp_seconds")
        .set(status.scrub.last_pass_finished_unix_ms as f64 / 1e3);
    // Served whatever the mode (zeros when deduplication is off), so dashboards need no case.
    let dedup = &status.dedup;
    counter!("onekv_dedup_candidates_total").absolute(dedup.candidates);
    counter!("onekv_dedup_hits_total", "path" => "inline").absolute(dedup.inline_hits);
    counter!("onekv_dedup_hits_total", "path" => "offline").absolute(dedup.offline_hits);
    counter!("onekv_dedup_hits_total", "path" => "snapshot").absolute(dedup.snapshot_hits);
    counter!("onekv_dedup_mismatches_total").absolute(dedup.mismatches);
    counter!("onekv_dedup_bytes_saved_total").absolute(dedup.bytes_saved);
    gauge!("onekv_dedup_entries").set(count(dedup.entries));
    gauge!("onekv_dedup_inline_active").set(f64::from(u8::from(dedup.inline_active)));
    counter!("onekv_dedup_switches_total").absolute(dedup.switches);
    counter!("onekv_dedup_references_total").absolute(dedup.references_applied);
    counter!("onekv_dedup_late_references_total").absolute(dedup.late_references);
    counter!("onekv_peer_bytes_sent_total").absolute(status.peer_bytes_sent);
    let gc = &status.gc;
    gauge!("onekv_gc_log_bytes").set(count(gc.log_bytes));
    gauge!("onekv_gc_live_bytes").set(count(gc.live_bytes));
    gauge!("onekv_gc_space_amplification").set(gc.space_amp);
    counter!("onekv_gc_values_relocated_total").absolute(gc.values_relocated);
    counter!("onekv_gc_bytes_relocated_total").absolute(gc.bytes_relocated);
    counter!("onekv_gc_segments_reclaimed_total").absolute(gc.segments_reclaimed);
    counter!("onekv_gc_bytes_reclaimed_total").absolute(gc.bytes_reclaimed);
    counter!("onekv_gc_bytes_scanned_total").absolute(gc.bytes_scanned);
    counter!("onekv_gc_values_packed_total").absolute(gc.values_packed);
    counter!("onekv_gc_packed_raw_bytes_total").absolute(gc.packed_raw_bytes);
    counter!("onekv_gc_packed_bytes_total").absolute(gc.packed_bytes);
    counter!("onekv_gc_busy_seconds_total").absolute(gc.busy_ms / 1000);
}

/// Each replica's Raft state, labelled by shard (at most one series per shard the node holds).
fn record_shards(statuses: &[ReplicaStatus]) {
    for status in statuses {
        let shard = status.shard.to_string();
        let count = |n: u64| n as f64;
        gauge!("onekv_shard_term", "shard" => shard.clone()).set(count(status.term));
        gauge!("onekv_shard_commit_index", "shard" => shard.clone()).set(count(status.commit_index));
        gauge!("onekv_shard_applied_index", "shard" => shard.clone()).set(count(status.applied_index));
        gauge!("onekv_shard_flushed_index", "shard" => shard.clone()).set(count(status.flushed_index));
        gauge!("onekv_shard_is_leader", "shard" => shard.clone()).set(if status.role == "leader" {
            1.0
        } else {
            0.0
        });
        gauge!("onekv_shard_has_leader", "shard" => shard.clone()).set(if status.leader_id.is_some() {
            1.0
        } else {
            0.0
        });
        gauge!("onekv_shard_index_sorted_runs", "shard" => shard.clone())
            .set(count(status.index_sorted_runs));
        gauge!("onekv_shard_index_leveled", "shard" => shard.clone()).set(if status.index_leveled {
            1.0
        } else {
            0.0
        });
        gauge!("onekv_shard_recovery_replayed", "shard" => shard).set(count(status.recovery_replayed));
    }
}

/// Bytes written to disk per user byte applied (0 before any user byte).
pub fn write_amplification(status: &ReplicaStatus) -> f64 {
    if status.user_bytes == 0 { 0.0 } else { status.bytes_written as f64 / status.user_bytes as f64 }
}

/// The log's fsync histogram in Prometheus form: its bucket `i` counts fsyncs faster than `2^i`
/// µs, so bucket `i`'s cumulative count is `le = 2^i µs`; its last bucket also holds everything
/// slower and so appears only in `+Inf`.
fn render_fsync_histograms(text: &mut String, status: &ReplicaStatus) {
    if status.logs.is_empty() {
        return;
    }
    let name = FSYNC_DURATION_SECONDS;
    let _ = writeln!(text, "# HELP {name} Latency of the log's fsyncs (power-of-two buckets).");
    let _ = writeln!(text, "# TYPE {name} histogram");
    for log in &status.logs {
        let label = &log.name;
        let buckets = &log.stats.fsync_buckets;
        let mut cumulative = 0;
        for (i, n) in buckets.iter().enumerate().take(FSYNC_BUCKETS - 1) {
            cumulative += n;
            let le = (1u64 << i) as f64 / 1e6;
            let _ = writeln!(text, "{name}_bucket{{log=\"{label}\",le=\"{le}\"}} {cumulative}");
        }
        let total: u64 = buckets.iter().sum();
        let _ = writeln!(text, "{name}_bucket{{log=\"{label}\",le=\"+Inf\"}} {total}");
        let _ = writeln!(text, "{name}_sum{{log=\"{label}\"}} {}", log.stats.fsync_us_total as f64 / 1e6);
        let _ = writeln!(text, "{name}_count{{log=\"{label}\"}} {total}");
    }
    text.push('\n');
}

/// Bytes on disk under each top-level entry of the data directory (`log`, `index`, ...); the disk
/// reserve counts as `reserve`, other files at the top level (the identity file) as `other`.
/// Statistics only: unreadable entries count as nothing.
pub fn disk_usage(data_dir: &Path) -> Vec<(String, u64)> {
    let mut usage: Vec<(String, u64)> = Vec::new();
    let mut other = 0;
    let Ok(entries) = std::fs::read_dir(data_dir) else { return usage };
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            usage.push((entry.file_name().to_string_lossy().into_owned(), dir_bytes(&entry.path())));
        } else if kind.is_file() {
            let bytes = entry.metadata().map_or(0, |meta| meta.len());
            match entry.file_name() == onekv_replica::RESERVE_FILE {
                true => usage.push(("reserve".to_string(), bytes)),
                false => other += bytes,
            }
        }
    }
    usage.sort();
    usage.push(("other".to_string(), other));
    usage
}

fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => dir_bytes(&entry.path()),
            Ok(kind) if kind.is_file() => entry.metadata().map_or(0, |meta| meta.len()),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use onekv_log::LogStats;
    use onekv_replica::LogStatus;

    #[test]
    fn the_disk_full_alarm_and_the_free_space_are_gauges() {
        let dir = tempfile::tempdir().unwrap();
        let node = NodeMetrics::new(1, dir.path());
        let mut status = ReplicaStatus::default();
        status.disk.free_bytes = 12345;
        status.disk.reserve_bytes = 678;
        let text = node.render(std::slice::from_ref(&status));
        for line in ["onekv_disk_full_alarm 0", "onekv_disk_free_bytes 12345", "onekv_disk_reserve_bytes 678"]
        {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        status.disk.alarm = Some("below min_free_bytes".into());
        status.disk.reserve_bytes = 0;
        let text = node.render(std::slice::from_ref(&status));
        for line in ["onekv_disk_full_alarm 1", "onekv_disk_reserve_bytes 0"] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn fsync_buckets_become_a_cumulative_histogram() {
        let mut stats = LogStats { fsyncs: 3, fsync_us_total: 1_000_005, ..LogStats::default() };
        stats.fsync_buckets[0] = 1;
        stats.fsync_buckets[3] = 1;
        stats.fsync_buckets[FSYNC_BUCKETS - 1] = 1;
        let status = ReplicaStatus {
            logs: vec![LogStatus { name: "log".into(), bytes: 10, stats }],
            ..ReplicaStatus::default()
        };
        let mut text = String::new();
        render_fsync_histograms(&mut text, &status);
        let line = |le: &str| format!("{FSYNC_DURATION_SECONDS}_bucket{{log=\"log\",le=\"{le}\"}} ");
        assert!(text.contains(&format!("{}1\n", line("0.000001"))), "{text}");
        assert!(text.contains(&format!("{}1\n", line("0.000004"))), "{text}");
        assert!(text.contains(&format!("{}2\n", line("0.000008"))), "{text}");
        assert!(text.contains(&format!("{}3\n", line("+Inf"))), "{text}");
        assert!(text.contains(&format!("{FSYNC_DURATION_SECONDS}_count{{log=\"log\"}} 3\n")), "{text}");
        assert!(text.contains(&format!("{FSYNC_DURATION_SECONDS}_sum{{log=\"log\"}} 1.000005\n")), "{text}");
    }

    #[test]
    fn disk_usage_sums_each_component() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("log/sub")).unwrap();
        std::fs::create_dir_all(dir.path().join("index")).unwrap();
        std::fs::write(dir.path().join("log/a"), [0u8; 10]).unwrap();
        std::fs::write(dir.path().join("log/sub/b"), [0u8; 5]).unwrap();
        std::fs::write(dir.path().join("index/t"), [0u8; 7]).unwrap();
        std::fs::write(dir.path().join("IDENTITY"), [0u8; 3]).unwrap();
        std::fs::write(dir.path().join(onekv_replica::RESERVE_FILE), [0u8; 4]).unwrap();
        let usage = disk_usage(dir.path());
        assert_eq!(
            usage,
            vec![
                ("index".to_string(), 7),
                ("log".to_string(), 15),
                ("reserve".to_string(), 4),
                ("other".to_string(), 3)
            ]
        );
    }
}
