//! Helpers the replica's process-level tests share: a cluster of one shard in one process
//! (`cluster`) and fast writes to it (`fast`), nodes of several shards in one process (`shards`), a node of one member opened until it leads every
//! shard, and a child process (the test binary run again) driven until an armed crash point ends
//! it. Each test crate uses part of it.
#![allow(dead_code)]

pub mod cluster;
pub mod fast;
pub mod shards;

use onekv_replica::failpoints::CRASH_EXIT_CODE;
use onekv_replica::local::Router;
use onekv_replica::{Node, ReplicaConfig};
use std::io::{BufRead, BufReader};
use std::process::{Command as Process, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Opens a node whose only member is itself and waits until it leads every shard it holds.
pub fn open_leading(config: ReplicaConfig) -> Node {
    let router = Arc::new(Router::default());
    let node = Node::open(config, router.clone()).expect("open");
    router.add(1, node.replicas()[0].clone());
    let deadline = Instant::now() + Duration::from_secs(10);
    while node.statuses().iter().any(|status| status.role != "leader") {
        assert!(Instant::now() < deadline, "the single node did not lead every shard");
        std::thread::sleep(Duration::from_millis(5));
    }
    node
}

/// Runs the ignored test `child` of this test binary with `env` set and the failpoint `point`
/// armed to crash at its `skip + 1`-th hit, until it crashes there (at most `limit`). The child
/// prints `ack WRITER N` after each acknowledged write; returns the highest N per writer (of
/// `writers`), `None` for a writer with none.
pub fn crash_child(
    child: &str,
    env: &[(&str, String)],
    point: &str,
    skip: usize,
    writers: usize,
    limit: Duration,
) -> Vec<Option<usize>> {
    let mut command = Process::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", child, "--ignored", "--nocapture", "--test-threads=1"])
        .env("ONEKV_FAILPOINTS", format!("{point}={skip}*off->return"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("spawn the child");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{point}: the child did not reach the crash point within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(CRASH_EXIT_CODE), "{point}: the child did not stop at the crash point");
    // The reader thread ends when the pipe closes; give it a moment to drain.
    let mut acked = vec![None; writers];
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(2)) {
        // The crash can cut the last line short: an ack that did not get out whole was not seen.
        let parts: Vec<&str> = line.split_whitespace().collect();
        if let ["ack", writer, n] = parts[..]
            && let (Ok(writer), Ok(n)) = (writer.parse::<usize>(), n.parse::<usize>())
            && writer < writers
        {
            acked[writer] = acked[writer].max(Some(n));
        }
    }
    acked
}
