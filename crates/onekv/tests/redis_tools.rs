//! The Redis protocol front end with the real Redis tools, unmodified: `redis-cli` and
//! `redis-benchmark` (Debian's `redis-tools`, installed by `scripts/install-redis`) against a
//! 3-node cluster of `onekv server` processes, each serving RESP on its own port.
//!
//! Checks every reply of a scripted `redis-cli` session on a follower (so every command is routed
//! to the leader), that the leader and the gRPC API see the same data, a paged `--scan`, and that
//! `redis-benchmark -t ping,set,get,incr,mset` finishes without an error against a follower and
//! the leader, with INCR's counter equal to the number of increments it sent. A raw connection
//! checks RESP3 replies after `HELLO 3` (nulls, maps) and RESP2 again after `HELLO 2`.
//!
//! A second test checks that DBSIZE, INFO keyspace and SCAN count and list keys without reading
//! values: with every value damaged on disk they still answer, page after page.
//!
//! A third runs `tests/python/transactions.py` with redis-py against a 3-node cluster: its default
//! (transactional) `pipeline()`, errors inside and before EXEC, WATCH aborting, and two clients on
//! two nodes incrementing one counter 200 times each with WATCH/MULTI/EXEC, ending at exactly 400.
//!
//! A fourth runs the go-redis and ioredis checks in `tests/clients/` (the libraries' default options,
//! so RESP3; a transactional pipeline; an error inside EXEC; WATCH aborting; the same two-node
//! counter ending at 400).
//!
//! If the tools are missing the test fails (it does not skip), naming the package to install.

mod common;

use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{TestCluster, free_port, run_bounded, start_resp_cluster};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Requests per redis-benchmark test; 2000 keeps a debug-build run to a few seconds per test.
const BENCHMARK_REQUESTS: usize = 2000;
/// What `redis-benchmark -t ping,set,get,incr,mset -q` reports, one line each.
const BENCHMARK_TESTS: [&str; 6] = ["PING_INLINE", "PING_MBULK", "SET", "GET", "INCR", "MSET (10 keys)"];

fn require_tool(tool: &str) {
    let found = std::process::Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    assert!(
        found,
        "{tool} is not installed: this test needs Debian's redis-tools (`apt-get install redis-tools`, \
         or run scripts/install-redis)"
    );
}

/// Runs `redis-cli -p PORT ARGS...` and returns its standard output (raw format: one line per
/// reply element; nil is an empty line; errors start with their code).
async fn redis_cli(port: u16, args: &[&str]) -> String {
    let output = tokio::process::Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("running redis-cli");
    assert!(output.status.success(), "redis-cli {args:?} failed: {output:?}");
    String::from_utf8(output.stdout).expect("redis-cli output is UTF-8")
}

/// Reads from `stream` until what arrived ends with `suffix`; returns it all.
async fn read_until(stream: &mut tokio::net::TcpStream, suffix: &[u8]) -> String {
    let mut received = Vec::new();
    while !received.ends_with(suffix) {
        let mut buffer = [0u8; 4096];
        let read = stream.read(&mut buffer).await.unwrap();
        assert!(read > 0, "the connection closed after {}", String::from_utf8_lossy(&received));
        received.extend_from_slice(&buffer[..read]);
    }
    String::from_utf8(received).unwrap()
}

/// Runs every `(command, expected output)` of `script` through redis-cli on `port`.
async fn check_script(port: u16, script: &[(&[&str], &str)]) {
    for (command, expected) in script {
        let output = redis_cli(port, command).await;
        assert_eq!(output.trim_end_matches('\n'), *expected, "redis-cli -p {port} {command:?}");
    }
}

/// Runs `redis-benchmark -p PORT -q ARGS...` and checks it reported each of `tests` without an
/// error; returns its result lines.
async fn benchmark(port: u16, args: &[&str], tests: &[&str]) -> String {
    let output = tokio::process::Command::new("redis-benchmark")
        .args(["-p", &port.to_string(), "-q"])
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("running redis-benchmark");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    // redis-benchmark exits at the first error reply ("Error from server: ...").
    assert!(output.status.success(), "redis-benchmark failed: {stdout}\n{stderr}");
    for text in [&stdout, &stderr] {
        assert!(!text.contains("Error") && !text.contains("WARNING"), "redis-benchmark: {stdout}\n{stderr}");
    }
    // Progress lines end in '\r'; the final line of each test ends in '\n'.
    let results: Vec<&str> = stdout
        .split(['\r', '\n'])
        .map(str::trim)
        .filter(|line| line.contains("requests per second"))
        .collect();
    for test in tests {
        let line = results
            .iter()
            .find(|line| line.starts_with(&format!("{test}: ")))
            .unwrap_or_else(|| panic!("redis-benchmark reported no {test}: {stdout}"));
        let rate: f64 = line[test.len() + 2..]
            .split_whitespace()
            .next()
            .and_then(|rate| rate.parse().ok())
            .unwrap_or_else(|| panic!("no rate in {line:?}"));
        assert!(rate > 0.0, "{line}");
    }
    results.join("\n")
}

#[test]
fn redis_cli_and_redis_benchmark_work_against_a_three_node_cluster() {
    require_tool("redis-cli");
    require_tool("redis-benchmark");
    run_bounded(Duration::from_secs(150), async {
        let (mut cluster, ports) = start_resp_cluster(3, |_| {}).await;
        let port_of = |id: u64| ports[id as usize - 1];
        let (follower, leader) = follower_and_leader(&mut cluster).await;
        for id in cluster.ids() {
            assert!(
                cluster.log_text(id).contains(&format!("onekv node {id} resp on 127.0.0.1:{}", port_of(id))),
                "node {id} did not print its RESP line"
            );
        }

        // Every command through a follower, which routes it to the leader.
        check_script(
            port_of(follower),
            &[
                (&["PING"], "PONG"),
                (&["ECHO", "a b"], "a b"),
                (&["SELECT", "0"], "OK"),
                (&["SELECT", "16"], "ERR DB index is out of range"),
                (&["SET", "greeting", "hello"], "OK"),
                (&["GET", "greeting"], "hello"),
                (&["APPEND", "greeting", " world"], "11"),
                (&["STRLEN", "greeting"], "11"),
                (&["STRLEN", "absent"], "0"),
                (&["SETNX", "greeting", "x"], "0"),
                (&["SETNX", "fresh", "x"], "1"),
                (&["SET", "greeting", "hi", "GET"], "hello world"),
                (&["SET", "greeting", "no", "NX"], ""),
                (&["SET", "absent", "no", "XX"], ""),
                (&["SET", "greeting", "hey", "XX", "GET"], "hi"),
                (&["SET", "greeting", "x", "EX", "0"], "ERR invalid expire time in 'set' command"),
                (&["GET", "greeting"], "hey"),
                (&["TTL", "greeting"], "-1"),
                (&["SET", "session", "s", "EX", "100"], "OK"),
                (&["EXPIRETIME", "absent"], "-2"),
                (&["EXPIRE", "session", "50", "GT"], "0"),
                (&["PERSIST", "session"], "1"),
                (&["TTL", "session"], "-1"),
                (&["PEXPIRE", "session", "1"], "1"),
                (&["PSETEX", "{s}a", "1", "v"], "OK"),
                (&["GET", "absent"], ""),
                (&["INCR", "counter"], "1"),
                (&["INCRBY", "counter", "41"], "42"),
                (&["DECR", "counter"], "41"),
                (&["DECRBY", "counter", "-9"], "50"),
                (&["INCR", "greeting"], "ERR value is not an integer or out of range"),
                (&["INCRBY", "counter", "9223372036854775807"], "ERR increment or decrement would overflow"),
                (&["MSET", "a", "1", "b", "2", "c", "3"], "OK"),
                (&["MSET", "a", "1", "b"], "ERR wrong number of arguments for 'mset' command"),
                (&["MGET", "a", "b", "absent", "c"], "1\n2\n\n3"),
                (&["EXISTS", "a", "b", "absent", "a"], "3"),
                (&["DEL", "a", "absent", "b"], "2"),
                (&["UNLINK", "c", "c"], "1"),
                (&["GETDEL", "fresh"], "x"),
                (&["GETDEL", "fresh"], ""),
                (&["SCAN", "0", "MATCH", "c*", "COUNT", "100"], "0\ncounter"),
                // `session` and `{s}a` expired meanwhile (after 1 ms).
                (&["GET", "session"], ""),
                (&["DBSIZE"], "2"),
                (&["CONFIG", "GET", "appendonly"], "appendonly\nyes"),
                (&["CLIENT", "GETNAME"], ""),
                (&["XADD"], "ERR unknown command 'XADD', with args beginning with: "),
                (&["HSET", "h", "f", "v"], "1"),
                (&["HGETALL", "h"], "f\nv"),
                (&["GET", "h"], "WRONGTYPE Operation against a key holding the wrong kind of value"),
                (&["TYPE", "h"], "hash"),
                (&["SET", "{t}x", "hello"], "OK"),
                (&["RENAME", "{t}x", "{t}y"], "OK"),
                (&["GETRANGE", "{t}y", "1", "-2"], "ell"),
                (&["COPY", "{t}y", "{t}z"], "1"),
                (&["MSETNX", "{t}z", "1", "{t}w", "2"], "0"),
                (&["KEYS", "{t}*"], "{t}y\n{t}z"),
                (&["INCRBYFLOAT", "{t}f", "1.5"], "1.5"),
                (&["DEL", "{t}y", "{t}z", "{t}f"], "3"),
                (&["GET"], "ERR wrong number of arguments for 'get' command"),
            ],
        )
        .await;

        // Keys over onekv's limits: reads answer "absent", writes name the limit.
        let long_key = "k".repeat(5000);
        check_script(
            port_of(follower),
            &[(&["GET", ""], ""), (&["MGET", "", &long_key, "counter"], "\n\n50")],
        )
        .await;
        for (command, error) in [
            (vec!["SET", "", "v"], "ERR invalid argument: key is empty"),
            (
                vec!["SET", &long_key, "v"],
                "ERR invalid argument: key is 5000 bytes, over limits.max_key_bytes",
            ),
            (vec!["INCR", &long_key], "ERR invalid argument: key is 5000 bytes, over limits.max_key_bytes"),
        ] {
            let output = redis_cli(port_of(follower), &command).await;
            assert!(output.starts_with(error), "{}: {output}", command[0]);
        }

        // A pipeline mixing writes and reads, in one write over a raw connection: replies come in
        // order and each read sees every write before it (runs of reads execute concurrently).
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port_of(follower))).await.unwrap();
        let pipeline = "SET pipe:a 1\r\nGET pipe:a\r\nGET pipe:b\r\nSTRLEN pipe:a\r\nSET pipe:a 22\r\n\
            GET pipe:a\r\nEXISTS pipe:a pipe:b\r\nINCR pipe:c\r\nINCR pipe:c\r\nGET pipe:c\r\nGET pipe:a\r\n\
            MGET pipe:a pipe:c\r\n";
        stream.write_all(pipeline.as_bytes()).await.unwrap();
        let expected = "+OK\r\n$1\r\n1\r\n$-1\r\n:1\r\n+OK\r\n$2\r\n22\r\n:1\r\n:1\r\n:2\r\n$1\r\n2\r\n$2\r\n22\r\n\
            *2\r\n$2\r\n22\r\n$1\r\n2\r\n";
        let mut received = vec![0u8; expected.len()];
        stream.read_exact(&mut received).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&received), expected);

        // RESP3 after HELLO 3 (what redis-py 8 sends first): maps, and nulls as `_`; HELLO 2
        // switches back.
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port_of(follower))).await.unwrap();
        stream.write_all(b"HELLO 3\r\n").await.unwrap();
        let hello = read_until(&mut stream, b"$7\r\nmodules\r\n*0\r\n").await;
        assert!(
            hello.starts_with("%7\r\n$6\r\nserver\r\n$5\r\nonekv\r\n") && hello.contains("proto\r\n:3\r\n")
        );
        let pipeline = "GET r3:missing\r\nSET r3:k v\r\nGET r3:k\r\nMGET r3:k r3:missing\r\nSET r3:k w NX\r\n\
            SET r3:k x GET\r\nSET r3:missing y XX GET\r\nGETDEL r3:missing\r\nCONFIG GET appendonly\r\nHELLO 2\r\n";
        stream.write_all(pipeline.as_bytes()).await.unwrap();
        let expected = "_\r\n+OK\r\n$1\r\nv\r\n*2\r\n$1\r\nv\r\n_\r\n_\r\n$1\r\nv\r\n_\r\n_\r\n\
            %1\r\n$10\r\nappendonly\r\n$3\r\nyes\r\n*14\r\n";
        let received = read_until(&mut stream, b"$7\r\nmodules\r\n*0\r\n").await;
        assert!(received.starts_with(expected), "{received}");
        stream.write_all(b"GET r3:missing\r\nGET r3:k\r\nCONFIG GET appendonly\r\n").await.unwrap();
        let expected = "$-1\r\n$1\r\nx\r\n*2\r\n$10\r\nappendonly\r\n$3\r\nyes\r\n";
        let mut received = vec![0u8; expected.len()];
        stream.read_exact(&mut received).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&received), expected);

        // The leader's front end and the gRPC API see the same keys.
        check_script(port_of(leader), &[(&["GET", "greeting"], "hey"), (&["GET", "counter"], "50")]).await;
        let client = cluster.client();
        assert_eq!(client.get(b"greeting").await.unwrap(), Some(b"hey".to_vec()));
        client.put(b"from-grpc", b"yes").await.unwrap();
        check_script(port_of(follower), &[(&["GET", "from-grpc"], "yes")]).await;

        // redis-cli --scan pages through SCAN cursors (COUNT 10: three pages for 25 keys).
        let mut mset = vec!["MSET".to_string()];
        for i in 0..25 {
            mset.extend([format!("page:{i:02}"), i.to_string()]);
        }
        let mset: Vec<&str> = mset.iter().map(String::as_str).collect();
        check_script(port_of(follower), &[(&mset, "OK")]).await;
        let scanned = redis_cli(port_of(follower), &["--scan", "--pattern", "page:*"]).await;
        let scanned: Vec<&str> = scanned.lines().collect();
        let expected: Vec<String> = (0..25).map(|i| format!("page:{i:02}")).collect();
        assert_eq!(scanned, expected);

        let info = redis_cli(port_of(follower), &["INFO", "replication"]).await;
        assert!(info.contains("onekv_raft_role:follower"), "{info}");
        assert!(info.contains(&format!("onekv_leader_id:{leader}")), "{info}");

        // redis-benchmark through a follower, then the leader. Its INCR test increments one key,
        // `counter:__rand_int__` (no -r), once per request.
        let requests = BENCHMARK_REQUESTS.to_string();
        for id in [follower, leader] {
            let args = ["-t", "ping,set,get,incr,mset", "-n", &requests];
            let results = benchmark(port_of(id), &args, &BENCHMARK_TESTS).await;
            eprintln!("redis-benchmark against node {id}:\n{results}");
        }
        let expected = (2 * BENCHMARK_REQUESTS).to_string();
        check_script(port_of(leader), &[(&["GET", "counter:__rand_int__"], expected.as_str())]).await;

        // Two nodes incrementing the counter at once: their compare-and-swaps race, and the
        // losers retry on the value they lost to. No increment may be lost or doubled.
        let concurrent = 500;
        let args = ["-t", "incr", "-n", &concurrent.to_string(), "-c", "20"];
        let (left, right) = tokio::join!(
            benchmark(port_of(follower), &args, &["INCR"]),
            benchmark(port_of(leader), &args, &["INCR"])
        );
        eprintln!("concurrent INCR through nodes {follower} and {leader}:\n{left}\n{right}");
        let expected = (2 * BENCHMARK_REQUESTS + 2 * concurrent).to_string();
        check_script(port_of(follower), &[(&["GET", "counter:__rand_int__"], expected.as_str())]).await;

        // Pipelined requests (16 in flight per connection) are answered in order.
        let args = ["-t", "set,get", "-n", "800", "-P", "16"];
        benchmark(port_of(follower), &args, &["SET", "GET"]).await;
    });
}

/// Flips one byte inside every stored copy of each value starting with one of `markers` under
/// `dir`; returns how many copies were damaged.
fn damage_values(dir: &Path, markers: &[Vec<u8>]) -> usize {
    let mut damaged = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        if path.is_dir() {
            pending.extend(std::fs::read_dir(&path).unwrap().map(|entry| entry.unwrap().path()));
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        for marker in markers {
            let mut from = 0;
            while let Some(at) = bytes[from..].windows(marker.len()).position(|window| window == marker) {
                let position = from + at + 1000;
                file.write_at(&[bytes[position] ^ 0xff], position as u64).unwrap();
                damaged += 1;
                from = position;
            }
        }
    }
    damaged
}

/// DBSIZE, INFO keyspace and `redis-cli --scan` on `port` report exactly `keys`.
async fn check_key_counts(port: u16, keys: &[String]) {
    check_script(port, &[(&["DBSIZE"], keys.len().to_string().as_str())]).await;
    let info = redis_cli(port, &["INFO", "keyspace"]).await;
    assert!(info.contains(&format!("db0:keys={},expires=0,avg_ttl=0", keys.len())), "{info}");
    let scanned = redis_cli(port, &["--scan"]).await;
    assert_eq!(scanned.lines().collect::<Vec<_>>(), keys);
}

#[test]
fn dbsize_info_keyspace_and_scan_read_no_values() {
    require_tool("redis-cli");
    run_bounded(Duration::from_secs(120), async {
        let port = free_port();
        let data_dirs: Arc<Mutex<Vec<PathBuf>>> = Arc::default();
        let dirs = Arc::clone(&data_dirs);
        // Pages of at most 5 keys, so counting takes several pages (a full scan of these values
        // would stop at 4 pairs, on the 4 MiB max_scan_bytes).
        let cluster = TestCluster::start(1, move |config| {
            config.resp_listen = Some(format!("127.0.0.1:{port}"));
            config.limits.max_scan_pairs = 5;
            dirs.lock().unwrap().push(config.data_dir.clone());
        })
        .await;
        let data_dir = data_dirs.lock().unwrap()[0].clone();
        let client = cluster.client();
        let keys = 12;
        let mut markers = Vec::new();
        for i in 0..keys {
            let mut value = format!("<value {i:02} starts here>").into_bytes();
            markers.push(value.clone());
            value.resize(1 << 20, b'v');
            client.put(format!("big:{i:02}").as_bytes(), &value).await.unwrap();
        }
        let expected_keys: Vec<String> = (0..keys).map(|i| format!("big:{i:02}")).collect();
        check_key_counts(port, &expected_keys).await;

        // Every value damaged on disk: reading one fails its checksum, counting and listing the
        // keys read none, so they answer as before.
        assert!(damage_values(&data_dir, &markers) >= keys, "the values were not found on disk");
        check_key_counts(port, &expected_keys).await;
        let get = redis_cli(port, &["GET", "big:00"]).await;
        assert!(get.starts_with("ERR "), "GET of a damaged value: {get}");
    });
}

#[test]
fn redis_py_transactions_are_atomic_against_a_three_node_cluster() {
    let redis_py = std::process::Command::new("python3")
        .args(["-c", "import redis"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    assert!(
        redis_py,
        "redis-py is not installed: `python3 -m pip install redis` (or run scripts/install-redis)"
    );
    run_bounded(Duration::from_secs(240), async {
        let (mut cluster, ports) = start_resp_cluster(3, |_| {}).await;
        let [follower_port, leader_port] = follower_and_leader_ports(&mut cluster, &ports).await;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/transactions.py");
        // One client through a follower (every command routed to the leader), one through the leader.
        let output = tokio::process::Command::new("python3")
            .arg(&script)
            .args([follower_port.to_string(), leader_port.to_string()])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .expect("running python3");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{} failed:\n{stdout}\n{stderr}", script.display());
        eprintln!("{stdout}");
        assert!(stdout.contains("transactions ok: counter 400"), "{stdout}");
        // The gRPC API sees the same counter.
        assert_eq!(cluster.client().get(b"tx:counter").await.unwrap().as_deref(), Some(&b"400"[..]));
    });
}

/// The id of a follower and of the leader.
async fn follower_and_leader(cluster: &mut TestCluster) -> (u64, u64) {
    let leader = cluster.leader().await;
    let follower = cluster.ids().into_iter().find(|&id| id != leader).expect("a follower");
    (follower, leader)
}

/// The RESP ports of a follower and of the leader of a [`start_resp_cluster`] cluster.
async fn follower_and_leader_ports(cluster: &mut TestCluster, ports: &[u16]) -> [u16; 2] {
    let (follower, leader) = follower_and_leader(cluster).await;
    [ports[follower as usize - 1], ports[leader as usize - 1]]
}

/// Runs `command` (a client library's check program, given the RESP addresses of a follower and
/// the leader) to completion and checks it printed its success line.
async fn run_client_check(mut command: tokio::process::Command, name: &str, success: &str) {
    let output = command.stdin(Stdio::null()).kill_on_drop(true).output().await;
    let output = output.unwrap_or_else(|error| panic!("running the {name} check: {error}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the {name} check failed:\n{stdout}\n{stderr}");
    eprintln!("{stdout}");
    assert!(stdout.contains(success), "{stdout}");
}

/// The first of `candidates` that runs (`--version` succeeds), or a panic naming what to install.
fn tool(candidates: &[&str], install: &str) -> String {
    let found = candidates.iter().find(|tool| {
        std::process::Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    });
    found
        .map(|tool| tool.to_string())
        .unwrap_or_else(|| panic!("{} is not installed: {install}", candidates[0]))
}

#[test]
fn go_redis_and_ioredis_work_with_their_defaults_against_a_three_node_cluster() {
    // `go version` rather than `--version`: check for Go separately.
    let go = ["go", "/usr/local/go/bin/go"]
        .into_iter()
        .find(|go| {
            std::process::Command::new(go).arg("version").output().is_ok_and(|out| out.status.success())
        })
        .expect("Go is not installed: run scripts/install-test-deps (Debian's golang-go, or go.dev)");
    let node = tool(&["node"], "run scripts/install-test-deps (Debian's nodejs and npm)");
    let npm = tool(&["npm"], "run scripts/install-test-deps (Debian's npm)");
    let clients = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients");
    // ioredis is installed into a scratch copy, so the test writes nothing into the source tree.
    let scratch = tempfile::Builder::new().prefix("onekv-ioredis").tempdir().expect("a temporary dir");
    for file in ["index.js", "package.json", "package-lock.json"] {
        std::fs::copy(clients.join("node").join(file), scratch.path().join(file))
            .expect("copying the ioredis check");
    }
    run_bounded(Duration::from_secs(420), async {
        let installed = tokio::process::Command::new(&npm)
            .args(["ci", "--no-audit", "--no-fund", "--prefer-offline"])
            .current_dir(scratch.path())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .expect("running npm ci");
        assert!(installed.status.success(), "npm ci failed: {}", String::from_utf8_lossy(&installed.stderr));
        let (mut cluster, ports) = start_resp_cluster(3, |_| {}).await;
        // One client through a follower (every command routed to the leader), one through the leader.
        let addresses =
            follower_and_leader_ports(&mut cluster, &ports).await.map(|port| format!("127.0.0.1:{port}"));

        let mut go_check = tokio::process::Command::new(go);
        go_check.arg("run").arg(".").args(&addresses).current_dir(clients.join("go"));
        run_client_check(go_check, "go-redis", "WATCH counter 400").await;

        let mut node_check = tokio::process::Command::new(&node);
        node_check.arg("index.js").args(&addresses).current_dir(scratch.path());
        run_client_check(node_check, "ioredis", "WATCH counter 400").await;
    });
}
