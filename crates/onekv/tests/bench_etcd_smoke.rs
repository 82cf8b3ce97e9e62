//! Smoke test of etcd as a peer in `onekv bench compare`: a tiny comparison of onelog and a local
//! 3-member etcd cluster (Load then workload a), checking both ran every operation with non-zero
//! throughput and no errors, and that the etcd members' directories are gone afterwards.
//!
//! Needs `etcd` on PATH: without it the test fails (it must not pass silently); CI installs it
//! with scripts/install-etcd.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The whole comparison's time bound; the test kills onekv (which stops its clusters) past it.
const LIMIT: Duration = Duration::from_secs(55);

#[test]
fn compare_onelog_with_etcd() {
    let found = Command::new("etcd").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    assert!(
        matches!(found, Ok(status) if status.success()),
        "`etcd` is not on PATH: run `bash scripts/install-etcd` (CI does) to install it"
    );
    let dir = tempfile::tempdir().expect("a temporary dir");
    let json = dir.path().join("compare.json");
    let data = dir.path().join("clusters");
    let args = [
        "bench",
        "compare",
        "--modes",
        "onelog,etcd",
        "--rounds",
        "1",
        "--workload",
        "a",
        "--records",
        "200",
        "--operations",
        "200",
        "--threads",
        "4",
        "--value-bytes",
        "100",
        "--quiet",
        "--dir",
        data.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ];
    let mut child = Command::new(env!("CARGO_BIN_EXE_onekv"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning onekv");
    let deadline = Instant::now() + LIMIT;
    while child.try_wait().expect("polling onekv").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            // etcd members do not follow their parent's death (onekv nodes do, via --parent-pid):
            // kill the ones this run started, found by their data directory on the command line.
            kill_processes_mentioning(data.to_str().unwrap());
            let output = child.wait_with_output().expect("collecting onekv's output");
            panic!(
                "onekv {args:?} did not finish within {LIMIT:?}; stderr:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().expect("collecting onekv's output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "onekv {args:?} failed:\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("| a: ops/s |") && stdout.contains("etcd ÷ onelog"), "{stdout}");

    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the JSON report")).expect("valid JSON");
    let runs = report["runs"].as_array().expect("runs");
    let modes: Vec<&str> = runs.iter().map(|run| run["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["onelog", "etcd"], "{report:#}");
    for run in runs {
        let phases = run["phases"].as_array().expect("phases");
        let workloads: Vec<&str> = phases.iter().map(|phase| phase["workload"].as_str().unwrap()).collect();
        assert_eq!(workloads, ["load", "a"], "{run:#}");
        for phase in phases {
            assert!(phase["throughput_ops_per_sec"].as_f64().unwrap() > 0.0, "{phase:#}");
            assert_eq!(phase["errors"], 0, "{phase:#}");
        }
        // Every record Load wrote is read back: reads are linearizable on both stores.
        let read = phases[1]["ops"].as_array().unwrap().iter().find(|op| op["op"] == "read").expect("reads");
        assert_eq!(read["not_found"], 0, "{run:#}");
        let nodes = run["nodes"].as_array().expect("nodes");
        assert_eq!(nodes.len(), 3, "{run:#}");
    }
    let etcd_nodes = runs[1]["nodes"].as_array().unwrap();
    for node in etcd_nodes {
        // Started by the harness: its kernel writes and directory are known; it has no engine counter.
        assert!(node["kernel_write_bytes"].as_u64().unwrap() > 0, "{node:#}");
        assert!(node["disk_bytes"].as_u64().unwrap() > 0, "{node:#}");
        assert!(node["engine_wa"].is_null(), "{node:#}");
    }
    // Each run's cluster directory was removed after it (so its processes were stopped first).
    let left: Vec<_> = std::fs::read_dir(&data).expect("the data dir").collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Sends SIGKILL to every process whose command line contains `needle` (a directory only this
/// test's processes use).
fn kill_processes_mentioning(needle: &str) {
    let Ok(entries) = std::fs::read_dir("/proc") else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            let _ = Command::new("kill").arg("-KILL").arg(pid.to_string()).status();
        }
    }
}
