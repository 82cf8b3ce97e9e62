//! Redis's own test suite against onekv: the Tcl harness and units of Redis 7.0.15, vendored in
//! `tests/redis-suite` (see its README.md), run by `scripts/redis-suite` in the harness's
//! external-server mode against node 1's RESP port of a 3-node cluster of `onekv server` processes
//! holding the default number of shards (so most keys are routed to another node's leader).
//!
//! Runs only the units `scripts/redis-suite` marks "expected", without the tests Redis tags `slow`
//! (thousands of sequential writes) and those listed in `tests/redis-suite/long.txt` (untagged,
//! but over 30 s each against a debug build): every test of them must pass, less the tests listed with
//! their reasons in `tests/redis-suite/exclusions.txt` (an exclusion that matches no test fails the
//! run too). The script's per-unit table is printed either way.
//!
//! The harness is Tcl: without tclsh 8.5 or newer the test fails (it does not skip), saying to run
//! `scripts/install-test-deps`.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::{run_bounded, start_resp_cluster};

/// The whole test: cluster start, every expected unit without the slow and long ones (about 225 s
/// against a debug build on two cores, 60 s of it type/hash), and the cluster's shutdown.
const TEST_TIME_LIMIT: Duration = Duration::from_secs(540);

/// Kills the script's whole process group (bash, the harness's test server and its client) when
/// dropped, so a test that fails or times out leaves no tclsh behind.
struct ProcessGroupGuard(rustix::process::Pid);

impl Drop for ProcessGroupGuard {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process_group(self.0, rustix::process::Signal::KILL);
    }
}

fn require_tclsh() {
    let found = ["tclsh8.5", "tclsh8.6", "tclsh8.7"].iter().any(|tclsh| {
        std::process::Command::new(tclsh)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .and_then(|mut child| {
                drop(child.stdin.take());
                child.wait()
            })
            .is_ok_and(|status| status.success())
    });
    assert!(
        found,
        "tclsh 8.5 or newer is not installed: Redis's test suite is Tcl. Run scripts/install-test-deps \
         (or `apt-get install tcl`)"
    );
}

#[test]
fn redis_own_test_suite_passes_its_expected_units() {
    require_tclsh();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    run_bounded(TEST_TIME_LIMIT, async {
        let (_cluster, ports) = start_resp_cluster(3, |config| {
            // As `onekv cluster start` makes it: commands on several keys cross shards, and a key
            // has one shard in every database (MOVE, COPY ... DB).
            config.cluster.shards = onekv_server::ServerConfig::default().cluster.shards;
            config.cluster.key_hashing = onekv_server::config::KeyHashingName::DatabaseBlind;
        })
        .await;

        let mut script = tokio::process::Command::new("bash");
        script
            .arg(repo.join("scripts/redis-suite"))
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &ports[0].to_string(),
                "--expected-only",
                "--skip-slow",
                "--skip-long",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let child = script.spawn().expect("running scripts/redis-suite");
        let _group = ProcessGroupGuard(
            rustix::process::Pid::from_raw(child.id().expect("its pid") as i32).expect("a pid"),
        );
        let output = child.wait_with_output().await.expect("waiting for scripts/redis-suite");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        eprintln!("{stdout}\n{stderr}");
        assert!(
            output.status.success(),
            "scripts/redis-suite failed ({}): a test of an expected unit failed on onekv, or an \
             exclusion matched no test; its output is above",
            output.status
        );
        assert!(stdout.contains("unit/type/string"), "no table in the script's output");
    });
}
