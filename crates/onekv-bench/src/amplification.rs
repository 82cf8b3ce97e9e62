//! Write and space amplification per node (each node holds one replica of the one shard).
//!
//! Owns: taking a snapshot of every node's counters (its Status: `bytes_written`, `user_bytes`,
//! `log_bytes`; and when the harness knows the node's process and directory, the kernel's
//! `/proc/<pid>/io` `write_bytes` and the directory's disk usage), and turning two snapshots into
//! ratios. Does not own starting nodes (`local_cluster`) or the workload.
//!
//! Engine WA = Δ`bytes_written` ÷ Δ`user_bytes` (the node's own counters); kernel WA =
//! Δ`write_bytes` ÷ Δ`user_bytes` (includes everything the process wrote: logs, index tables,
//! metadata, and the file system's view of them); space amplification = disk usage ÷ live user
//! bytes (keys + values of the records that exist, one copy).

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use onekv_client::Client;
use serde::{Deserialize, Serialize};

/// What the harness knows about a node beyond its endpoint.
#[derive(Debug, Clone, Default)]
pub struct NodeProbe {
    /// The node's `host:port`, as the client lists it.
    pub endpoint: String,
    /// Its process id, when the harness started it.
    pub pid: Option<u32>,
    /// Its data directory, when known.
    pub data_dir: Option<PathBuf>,
}

/// One node's counters at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeSnapshot {
    /// The node's `host:port`.
    pub endpoint: String,
    /// Its id (0 when Status failed).
    pub node_id: u64,
    /// Its Raft role.
    pub role: String,
    /// Its storage mode.
    pub storage_mode: String,
    /// Bytes the node wrote to disk since it started (its own counter).
    pub bytes_written: u64,
    /// User payload bytes (keys + values) applied since it started.
    pub user_bytes: u64,
    /// Bytes in its log files now.
    pub log_bytes: u64,
    /// `/proc/<pid>/io` `write_bytes`, when the pid is known.
    pub kernel_write_bytes: Option<u64>,
    /// Disk usage of its data directory (allocated blocks), when known.
    pub disk_bytes: Option<u64>,
    /// Bytes its index compactions wrote since it started, into leveled trees and into trees in
    /// the runs layout (`index.layout`).
    #[serde(default)]
    pub index_compaction_bytes: IndexCompactionBytes,
    /// Why the Status call failed, if it did.
    pub error: Option<String>,
}

/// Bytes written by a node's index compactions, by the layout of the trees compacted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexCompactionBytes {
    /// Into leveled trees (shards the node leads or is the primary of; every shard when uniform).
    pub leveled: u64,
    /// Into trees in the runs layout (shards it only follows).
    pub runs: u64,
}

impl IndexCompactionBytes {
    /// `self - earlier`, per layout.
    fn since(self, earlier: IndexCompactionBytes) -> IndexCompactionBytes {
        IndexCompactionBytes {
            leveled: self.leveled.saturating_sub(earlier.leveled),
            runs: self.runs.saturating_sub(earlier.runs),
        }
    }
}

/// Every node's snapshot, in the client's endpoint order (nodes listed in `probes` but unknown to
/// the client are not asked).
pub async fn snapshot(client: &Client, probes: &[NodeProbe]) -> Vec<NodeSnapshot> {
    let mut snapshots = Vec::new();
    for (endpoint, status) in client.status_all().await {
        let probe = probes.iter().find(|probe| probe.endpoint == endpoint);
        let kernel_write_bytes = probe.and_then(|probe| probe.pid).and_then(|pid| proc_write_bytes(pid).ok());
        let disk_bytes =
            probe.and_then(|probe| probe.data_dir.as_deref()).and_then(|dir| disk_usage(dir).ok());
        let snapshot = match status {
            Ok(status) => NodeSnapshot {
                endpoint,
                node_id: status.node_id,
                role: status.role,
                storage_mode: status.storage_mode,
                bytes_written: status.bytes_written,
                user_bytes: status.user_bytes,
                log_bytes: status.log_bytes,
                kernel_write_bytes,
                disk_bytes,
                index_compaction_bytes: IndexCompactionBytes {
                    leveled: status.index_leveled_compaction_bytes,
                    runs: status.index_runs_compaction_bytes,
                },
                error: None,
            },
            Err(error) => NodeSnapshot {
                endpoint,
                node_id: 0,
                role: String::new(),
                storage_mode: String::new(),
                bytes_written: 0,
                user_bytes: 0,
                log_bytes: 0,
                kernel_write_bytes,
                disk_bytes,
                index_compaction_bytes: IndexCompactionBytes::default(),
                error: Some(error.to_string()),
            },
        };
        snapshots.push(snapshot);
    }
    snapshots
}

/// Bytes written to the block device holding `dir` since boot (`/sys/dev/block/MAJ:MIN/stat`,
/// sectors written × 512): what reached the disk from every process, unlike `/proc/<pid>/io`'s
/// `write_bytes`, which counts a whole page-cache folio each time a write dirties it. On kernels
/// with large folios (ext4 since Linux 6.16) a small write into a cached 64 KiB folio counts 64 KiB
/// there while only the dirty blocks are written: measured on this VM's 6.18, 10 KB appends into
/// a file read before counted 15× their bytes in `write_bytes` and 1.4× on the device.
pub fn device_write_bytes(dir: &Path) -> io::Result<u64> {
    let dev = fs::metadata(dir)?.dev();
    // Linux's encoding of a dev_t (glibc `gnu_dev_major`/`gnu_dev_minor`).
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let stat = fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/stat"))?;
    parse_sectors_written(&stat).map(|sectors| sectors * 512).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("no sectors written in /sys/dev/block/{major}:{minor}/stat"),
        )
    })
}

/// The seventh field of a block device's `stat` file: sectors written.
fn parse_sectors_written(stat: &str) -> Option<u64> {
    stat.split_whitespace().nth(6)?.parse().ok()
}

/// The `write_bytes` line of `/proc/<pid>/io`: bytes this process caused to be sent to storage.
pub fn proc_write_bytes(pid: u32) -> io::Result<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/io"))?;
    parse_write_bytes(&text).ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidData, format!("no write_bytes in /proc/{pid}/io"))
    })
}

fn parse_write_bytes(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("write_bytes:"))
        .and_then(|value| value.trim().parse().ok())
}

/// A node's disk reserve (`onekv_replica::RESERVE_FILE`): space set aside for a full disk, not data,
/// so it is no part of space amplification.
const RESERVE_FILE: &str = "RESERVED";

/// Bytes allocated on disk under `dir` (as `du` counts them: 512-byte blocks of every file), but for
/// an onekv node's disk reserve.
pub fn disk_usage(dir: &Path) -> io::Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let metadata = match entry.metadata() {
            Ok(metadata) => metadata,
            // Removed meanwhile (compaction, segment reclamation): it no longer uses space.
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(error),
        };
        if metadata.is_dir() {
            total += match disk_usage(&entry.path()) {
                Err(error) if error.kind() == io::ErrorKind::NotFound => 0,
                other => other?,
            };
        } else if entry.file_name() != RESERVE_FILE {
            total += metadata.blocks() * 512;
        }
    }
    Ok(total)
}

/// One node's amplification over a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeAmplification {
    /// The node's `host:port`.
    pub endpoint: String,
    /// Its id.
    pub node_id: u64,
    /// Its role at the end.
    pub role: String,
    /// Its storage mode.
    pub storage_mode: String,
    /// User payload bytes the node applied during the run.
    pub user_bytes: u64,
    /// Bytes the node's engine wrote during the run (its own counter).
    pub engine_bytes_written: u64,
    /// `engine_bytes_written / user_bytes`.
    pub engine_wa: Option<f64>,
    /// Bytes the kernel counted for the process during the run.
    pub kernel_write_bytes: Option<u64>,
    /// `kernel_write_bytes / user_bytes`.
    pub kernel_wa: Option<f64>,
    /// Bytes in the node's log files at the end.
    pub log_bytes: u64,
    /// Disk usage of its data directory at the end.
    pub disk_bytes: Option<u64>,
    /// Live user data: keys + values of the records that exist, one copy.
    pub live_bytes: u64,
    /// `disk_bytes / live_bytes`.
    pub space_amplification: Option<f64>,
    /// `log_bytes / live_bytes`.
    pub log_space_amplification: Option<f64>,
    /// Bytes the node's index compactions wrote during the run (`None`: not onekv).
    #[serde(default)]
    pub index_compaction_bytes: Option<IndexCompactionBytes>,
    /// A Status failure before or after the run.
    pub error: Option<String>,
}

/// Pairs `before` and `after` by endpoint; `live_bytes` is the user data that exists at the end.
pub fn amplification(
    before: &[NodeSnapshot],
    after: &[NodeSnapshot],
    live_bytes: u64,
) -> Vec<NodeAmplification> {
    let ratio =
        |numerator: u64, denominator: u64| (denominator > 0).then(|| numerator as f64 / denominator as f64);
    after
        .iter()
        .map(|end| {
            let start = before.iter().find(|start| start.endpoint == end.endpoint);
            let user_bytes = end.user_bytes.saturating_sub(start.map_or(0, |s| s.user_bytes));
            let engine_bytes_written = end.bytes_written.saturating_sub(start.map_or(0, |s| s.bytes_written));
            let kernel_write_bytes = match (start.and_then(|s| s.kernel_write_bytes), end.kernel_write_bytes)
            {
                (Some(start), Some(end)) => Some(end.saturating_sub(start)),
                _ => None,
            };
            let error = start.and_then(|s| s.error.clone()).or_else(|| end.error.clone());
            NodeAmplification {
                endpoint: end.endpoint.clone(),
                node_id: end.node_id,
                role: end.role.clone(),
                storage_mode: end.storage_mode.clone(),
                user_bytes,
                engine_bytes_written,
                engine_wa: ratio(engine_bytes_written, user_bytes),
                kernel_write_bytes,
                kernel_wa: kernel_write_bytes.and_then(|bytes| ratio(bytes, user_bytes)),
                log_bytes: end.log_bytes,
                disk_bytes: end.disk_bytes,
                live_bytes,
                space_amplification: end.disk_bytes.and_then(|bytes| ratio(bytes, live_bytes)),
                log_space_amplification: ratio(end.log_bytes, live_bytes),
                index_compaction_bytes: Some(
                    end.index_compaction_bytes.since(
                        start.map_or_else(IndexCompactionBytes::default, |s| s.index_compaction_bytes),
                    ),
                ),
                error,
            }
        })
        .collect()
}

/// A markdown table of `nodes`, one line per node.
pub fn markdown(nodes: &[NodeAmplification]) -> String {
    let mut out = String::from(
        "| node | role | storage | user MiB | engine MiB | engine WA | kernel MiB | kernel WA | log MiB | disk MiB | live MiB | disk ÷ live |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mib = |bytes: u64| format!("{:.1}", bytes as f64 / (1024.0 * 1024.0));
    let opt_mib = |bytes: Option<u64>| bytes.map_or("-".into(), mib);
    let opt_ratio = |ratio: Option<f64>| ratio.map_or("-".into(), |ratio| format!("{ratio:.2}"));
    for node in nodes {
        let _ = writeln!(
            out,
            "| {} ({}) | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            node.node_id,
            node.endpoint,
            node.role,
            node.storage_mode,
            mib(node.user_bytes),
            mib(node.engine_bytes_written),
            opt_ratio(node.engine_wa),
            opt_mib(node.kernel_write_bytes),
            opt_ratio(node.kernel_wa),
            mib(node.log_bytes),
            opt_mib(node.disk_bytes),
            mib(node.live_bytes),
            opt_ratio(node.space_amplification),
        );
    }
    for node in nodes.iter().filter(|node| node.error.is_some()) {
        let _ =
            writeln!(out, "\nnode {}: status failed: {}", node.endpoint, node.error.as_deref().unwrap_or(""));
    }
    out
}

#[cfg(test)]
mod device_tests {
    use super::*;

    #[test]
    fn sectors_written_is_the_seventh_field() {
        let stat = "  1411280    70815 137397882  3810944 29567002  2831183 1993681192  3496295        0";
        assert_eq!(parse_sectors_written(stat), Some(1_993_681_192));
        assert_eq!(parse_sectors_written("1 2 3"), None);
    }

    #[test]
    fn the_device_of_a_directory_counts_what_reaches_it() {
        let dir = tempfile::tempdir_in(".").unwrap();
        // Containers may hide /sys/dev/block: nothing to check there.
        let Ok(before) = device_write_bytes(dir.path()) else { return };
        let path = dir.path().join("data");
        let mut file = fs::File::create(&path).unwrap();
        std::io::Write::write_all(&mut file, &vec![7u8; 4 << 20]).unwrap();
        file.sync_all().unwrap();
        let after = device_write_bytes(dir.path()).unwrap();
        assert!(after - before >= 4 << 20, "{before} -> {after}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(endpoint: &str, written: u64, user: u64, kernel: Option<u64>) -> NodeSnapshot {
        NodeSnapshot {
            endpoint: endpoint.into(),
            node_id: 1,
            role: "leader".into(),
            storage_mode: "onelog".into(),
            bytes_written: written,
            user_bytes: user,
            log_bytes: 5000,
            kernel_write_bytes: kernel,
            disk_bytes: Some(8192),
            index_compaction_bytes: IndexCompactionBytes::default(),
            error: None,
        }
    }

    #[test]
    fn ratios_are_over_the_run_only() {
        let before = [snapshot("a", 1000, 100, Some(4096))];
        let after = [snapshot("a", 3000, 1100, Some(8192)), snapshot("b", 10, 0, None)];
        let nodes = amplification(&before, &after, 2048);
        assert_eq!(nodes[0].user_bytes, 1000);
        assert_eq!(nodes[0].engine_bytes_written, 2000);
        assert_eq!(nodes[0].engine_wa, Some(2.0));
        assert_eq!(nodes[0].kernel_write_bytes, Some(4096));
        assert_eq!(nodes[0].kernel_wa, Some(4.096));
        assert_eq!(nodes[0].space_amplification, Some(4.0));
        // A node with no user bytes has no ratio rather than infinity; no pid, no kernel figure.
        assert_eq!((nodes[1].engine_wa, nodes[1].kernel_wa), (None, None));
        let table = markdown(&nodes);
        assert_eq!(table.lines().count(), 4, "{table}");
        assert!(table.contains("| 2.00 |"), "{table}");
    }

    #[test]
    fn proc_io_is_parsed_and_read_for_this_process() {
        let text = "rchar: 1\nwchar: 2\nsyscr: 3\nsyscw: 4\nread_bytes: 5\nwrite_bytes: 4096\ncancelled_write_bytes: 0\n";
        assert_eq!(parse_write_bytes(text), Some(4096));
        assert_eq!(parse_write_bytes("rchar: 1\n"), None);
        assert!(proc_write_bytes(std::process::id()).is_ok());
    }

    #[test]
    fn disk_usage_counts_nested_files() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::write(dir.path().join("a"), vec![1u8; 10_000]).unwrap();
        fs::write(dir.path().join("sub/b"), vec![1u8; 10_000]).unwrap();
        // A node's disk reserve is not data.
        fs::write(dir.path().join(RESERVE_FILE), vec![1u8; 100_000]).unwrap();
        let usage = disk_usage(dir.path()).unwrap();
        // Allocated blocks: at least the bytes written, at most a few blocks more.
        assert!((20_000..=20_000 + 4 * 8192).contains(&usage), "{usage}");
    }
}
