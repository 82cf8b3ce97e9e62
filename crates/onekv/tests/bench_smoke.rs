//! Smoke tests of `onekv bench`: `ycsb --load --workload a` against a real 3-node cluster, and a
//! tiny `compare` of two storage modes on clusters it starts itself. Both check the JSON report:
//! every expected operation type with a non-zero count, no errors, amplification for every node.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{TestCluster, run_bounded};

/// Runs `onekv ARGS`, killing it if it takes longer than `limit`.
fn onekv(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_onekv"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning onekv");
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("polling onekv").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("collecting onekv's output");
            panic!(
                "onekv {args:?} did not finish within {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().expect("collecting onekv's output");
    assert!(
        output.status.success(),
        "onekv {args:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("the JSON report")).expect("valid JSON")
}

/// The `(op, count, errors)` of every operation type of a phase.
fn ops(phase: &serde_json::Value) -> Vec<(String, u64, u64)> {
    phase["ops"]
        .as_array()
        .expect("ops")
        .iter()
        .map(|op| {
            (
                op["op"].as_str().expect("op name").to_string(),
                op["count"].as_u64().expect("count"),
                op["errors"].as_u64().expect("errors"),
            )
        })
        .collect()
}

#[test]
fn ycsb_load_then_workload_a_against_a_real_cluster() {
    run_bounded(Duration::from_secs(120), async {
        let cluster = TestCluster::start(3, |_| {}).await;
        let endpoints: Vec<&str> = cluster.ids().into_iter().map(|id| cluster.endpoint(id)).collect();
        let endpoints = endpoints.join(",");
        let dir = tempfile::tempdir().expect("a temporary dir");
        let json = dir.path().join("report.json");
        let json_arg = json.to_str().expect("a UTF-8 path");
        let output = tokio::task::block_in_place(|| {
            onekv(
                &[
                    "bench",
                    "ycsb",
                    "--load",
                    "--workload",
                    "a",
                    "--records",
                    "200",
                    "--operations",
                    "400",
                    "--threads",
                    "4",
                    "--value-bytes",
                    "100",
                    "--quiet",
                    "--endpoints",
                    &endpoints,
                    "--json",
                    json_arg,
                ],
                Duration::from_secs(90),
            )
        });
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.contains("| read |") && stdout.contains("| update |"), "{stdout}");

        let report = read_json(&json);
        let phases = report["phases"].as_array().expect("phases");
        assert_eq!(phases.len(), 2, "{report:#}");
        assert_eq!(phases[0]["workload"], "load");
        assert_eq!(ops(&phases[0]), [("insert".to_string(), 200, 0)]);
        assert_eq!(phases[0]["records_inserted"], 200);
        assert_eq!(phases[1]["workload"], "a");
        let run_ops = ops(&phases[1]);
        let names: Vec<&str> = run_ops.iter().map(|(name, _, _)| name.as_str()).collect();
        assert_eq!(names, ["read", "update"], "{report:#}");
        assert!(run_ops.iter().all(|(_, count, errors)| *count > 0 && *errors == 0), "{run_ops:?}");
        assert_eq!(run_ops.iter().map(|(_, count, _)| count).sum::<u64>(), 400);
        // Every loaded record is found again.
        assert_eq!(phases[1]["ops"][0]["not_found"], 0, "{report:#}");

        // Every node applied at least the Load phase's payload and wrote at least that much.
        let nodes = report["nodes"].as_array().expect("nodes");
        assert_eq!(nodes.len(), 3, "{report:#}");
        for node in nodes {
            assert!(node["user_bytes"].as_u64().unwrap() >= 200 * 124, "{node:#}");
            assert!(node["engine_wa"].as_f64().unwrap() >= 1.0, "{node:#}");
        }
    });
}

#[test]
fn compare_two_storage_modes_on_fresh_clusters() {
    let dir = tempfile::tempdir().expect("a temporary dir");
    let json = dir.path().join("compare.json");
    let data = dir.path().join("clusters");
    let output = onekv(
        &[
            "bench",
            "compare",
            "--modes",
            "onelog,classic",
            "--rounds",
            "1",
            "--workload",
            "load",
            "--records",
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
        ],
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("| load: ops/s |") && stdout.contains("classic ÷ onelog"), "{stdout}");

    let report = read_json(&json);
    let runs = report["runs"].as_array().expect("runs");
    let modes: Vec<&str> = runs.iter().map(|run| run["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["onelog", "classic"]);
    for run in runs {
        assert_eq!(ops(&run["phases"][0]), [("insert".to_string(), 200, 0)], "{run:#}");
        let nodes = run["nodes"].as_array().expect("nodes");
        assert_eq!(nodes.len(), 3);
        for node in nodes {
            assert_eq!(node["storage_mode"], run["mode"]);
            // The harness started the nodes, so it knows their pids and directories.
            assert!(node["kernel_write_bytes"].is_u64(), "{node:#}");
            assert!(node["disk_bytes"].as_u64().unwrap() > 0, "{node:#}");
            assert!(node["engine_wa"].as_f64().unwrap() >= 1.0, "{node:#}");
        }
    }
    // Each run's cluster directory was removed after it.
    let left: Vec<_> = std::fs::read_dir(&data).expect("the data dir").collect();
    assert!(left.is_empty(), "{left:?}");
}
