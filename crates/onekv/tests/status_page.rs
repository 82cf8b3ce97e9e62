//! The HTTP endpoint of a 3-node cluster of real processes: every node serves Prometheus metrics
//! (every name in docs/metrics.md, and nothing undocumented) with live values, and the status page,
//! rendered by headless Chromium, shows the live cluster: three members, exactly one leader (the
//! real one), and applied indexes that match the nodes'. Also takes a screenshot and checks it is
//! a real PNG of the page.
//!
//! Needs Debian's `chromium` (`scripts/install-chromium`, which `scripts/install-test-deps` runs); without it the
//! test fails, saying how to install it.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::{TestCluster, free_port, run_bounded};

/// The whole test, cluster start included.
const TEST_LIMIT: Duration = Duration::from_secs(40);
/// One Chromium run.
const CHROMIUM_LIMIT: Duration = Duration::from_secs(15);
/// Keys written before looking.
const KEYS: usize = 40;
/// Screenshot size, checked in the PNG header.
const SCREENSHOT_SIZE: (u32, u32) = (1100, 420);

/// GET `path` from `address` over HTTP/1.1; returns the status code, the headers and the body.
fn http_get(address: &str, path: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(address).unwrap_or_else(|e| panic!("connecting to {address}: {e}"));
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap_or_else(|e| panic!("reading {path} from {address}: {e}"));
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no header end: {response}"));
    let code = head.split_whitespace().nth(1).and_then(|code| code.parse().ok()).expect("a status code");
    (code, head.to_ascii_lowercase(), body.to_string())
}

/// The metric names in the first column of docs/metrics.md's tables.
fn documented_metrics() -> BTreeSet<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/metrics.md");
    let text = std::fs::read_to_string(&path).expect("docs/metrics.md");
    text.lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`').map(|(name, _)| name.to_string()))
        .collect()
}

/// The value of the unlabelled sample `name` in a Prometheus text exposition.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in\n{text}"))
}

/// Runs headless Chromium on `url` with `args`; returns its standard output. Fails the test if
/// Chromium is not installed.
async fn chromium(profile: &Path, url: &str, args: &[String]) -> String {
    let mut command = tokio::process::Command::new("chromium");
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=4000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = match command.spawn() {
        Ok(child) => child,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => panic!(
            "chromium is not installed: run `apt-get install chromium` (or scripts/install-chromium); \
             this test needs it to render the status page"
        ),
        Err(error) => panic!("cannot start chromium: {error}"),
    };
    let output = tokio::time::timeout(CHROMIUM_LIMIT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("chromium did not finish within {CHROMIUM_LIMIT:?}"))
        .expect("waiting for chromium");
    assert!(
        output.status.success(),
        "chromium failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The value of attribute `name` in an HTML start tag.
fn attribute<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let start = tag.find(&format!("{name}=\""))? + name.len() + 2;
    tag[start..].split('"').next()
}

/// The rows of the status page's member table: for each, its attributes and its cells' values by
/// class (`applied`, `term`, ...).
fn member_rows(dom: &str) -> Vec<(HashMap<String, String>, HashMap<String, String>)> {
    let mut rows = Vec::new();
    for row in dom.split("<tr ").skip(1).filter(|row| row.contains("data-member=")) {
        let row = row.split("</tr>").next().unwrap_or(row);
        let tag = row.split('>').next().unwrap_or("");
        let attributes = ["data-member", "data-up", "data-leader"]
            .iter()
            .filter_map(|name| Some((name.to_string(), attribute(tag, name)?.to_string())))
            .collect();
        let mut cells = HashMap::new();
        for cell in row.split("<td ").skip(1) {
            let tag = cell.split('>').next().unwrap_or("");
            if let (Some(class), Some(value)) = (attribute(tag, "class"), attribute(tag, "data-value")) {
                let class = class.rsplit(' ').next().unwrap_or(class);
                cells.insert(class.to_string(), value.to_string());
            }
        }
        rows.push((attributes, cells));
    }
    rows
}

#[test]
fn metrics_on_every_node_and_a_live_status_page() {
    run_bounded(TEST_LIMIT, async {
        let mut http_ports: Vec<u16> = Vec::new();
        while http_ports.len() < 3 {
            let port = free_port();
            if !http_ports.contains(&port) {
                http_ports.push(port);
            }
        }
        let http = |id: u64| format!("127.0.0.1:{}", http_ports[id as usize - 1]);
        let mut cluster =
            TestCluster::start(3, |config| config.http_listen = Some(http(config.node_id))).await;
        let client = cluster.client();
        let mut last_index = 0;
        for i in 0..KEYS {
            last_index = client.put(format!("key{i}").as_bytes(), b"value").await.expect("a put");
        }
        for id in cluster.ids() {
            cluster.wait_applied(id, last_index).await;
        }
        let leader = cluster.leader().await;

        let documented = documented_metrics();
        assert!(documented.len() > 20, "docs/metrics.md lists only {documented:?}");
        for id in cluster.ids() {
            let (code, headers, text) = http_get(&http(id), "/metrics");
            assert_eq!(code, 200, "node {id} /metrics: {text}");
            assert!(headers.contains("content-type: text/plain; version=0.0.4"), "{headers}");
            let served: BTreeSet<String> = text
                .lines()
                .filter_map(|line| line.strip_prefix("# TYPE "))
                .filter_map(|rest| rest.split_whitespace().next().map(str::to_string))
                .collect();
            let missing: Vec<_> = documented.difference(&served).collect();
            let undocumented: Vec<_> = served.difference(&documented).collect();
            assert!(missing.is_empty(), "node {id} does not serve {missing:?}");
            assert!(undocumented.is_empty(), "node {id} serves undocumented {undocumented:?}");
            assert!(sample(&text, "onekv_raft_applied_index") >= last_index as f64, "node {id}:\n{text}");
            assert!(sample(&text, "onekv_raft_term") >= 1.0);
            assert_eq!(sample(&text, "onekv_raft_is_leader"), if id == leader { 1.0 } else { 0.0 });
            assert!(sample(&text, "onekv_user_bytes_total") > 0.0);
            assert!(sample(&text, "onekv_raft_leader_changes_total") >= 1.0, "{text}");
            let fsyncs = sample(&text, "onekv_log_fsyncs_total{log=\"log\"}");
            assert!(fsyncs >= 1.0, "{text}");
            // Every fsync is in the latency histogram (give or take one that ran while the two
            // counters were read).
            let histogram = sample(&text, "onekv_log_fsync_duration_seconds_count{log=\"log\"}");
            assert!(
                (histogram - fsyncs).abs() <= 1.0,
                "{histogram} fsyncs in the histogram, {fsyncs} counted"
            );
            if id == leader {
                let puts =
                    format!("onekv_requests_total{{protocol=\"grpc\",op=\"put\",outcome=\"ok\"}} {KEYS}");
                assert!(text.lines().any(|line| line == puts), "the leader served {KEYS} puts:\n{text}");
            }
            let (code, _, body) = http_get(&http(id), "/healthz");
            assert_eq!((code, body.as_str()), (200, "ok\n"));
        }

        // The page of a follower, so the cluster view is gathered over gRPC, not read locally.
        let follower = cluster.ids().into_iter().find(|&id| id != leader).expect("a follower");
        let url = format!("http://{}/", http(follower));
        let profile = tempfile::tempdir().expect("a Chromium profile directory");
        let dom = chromium(profile.path(), &url, &["--dump-dom".to_string()]).await;
        let rows = member_rows(&dom);
        assert_eq!(rows.len(), 3, "three members on the page:\n{dom}");
        let leaders: Vec<&String> = rows
            .iter()
            .filter(|(attributes, _)| attributes.get("data-leader").map(String::as_str) == Some("true"))
            .map(|(attributes, _)| &attributes["data-member"])
            .collect();
        assert_eq!(leaders, vec![&leader.to_string()], "exactly one leader, the real one:\n{dom}");
        assert!(dom.contains(&format!("<span id=\"leader-id\">{leader}</span>")), "{dom}");
        assert!(dom.contains("<span id=\"up-count\">3</span>"), "{dom}");
        for (attributes, cells) in &rows {
            let id: u64 = attributes["data-member"].parse().expect("a member id");
            assert_eq!(attributes["data-up"], "true", "member {id} shown down:\n{dom}");
            let applied: u64 = cells["applied"].parse().expect("an applied index");
            let now = cluster.status(id).await.expect("a status").applied_index;
            assert!(
                (last_index..=now).contains(&applied),
                "member {id}: the page shows applied index {applied}, the node {now}, last write {last_index}"
            );
            assert!(cells["log-bytes"].parse::<u64>().expect("a log size") > 0);
            assert!(cells["write-amp"].parse::<f64>().expect("a write amplification") > 1.0);
            // Two polls at least, so the throughput column has a number.
            assert!(cells.get("throughput").is_some_and(|rate| rate.parse::<f64>().is_ok()), "{dom}");
        }

        let screenshot = profile.path().join("status.png");
        let (width, height) = SCREENSHOT_SIZE;
        chromium(
            profile.path(),
            &url,
            &[format!("--screenshot={}", screenshot.display()), format!("--window-size={width},{height}")],
        )
        .await;
        let png = std::fs::read(&screenshot).expect("chromium wrote the screenshot");
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        assert_eq!(&png[12..16], b"IHDR");
        let size = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().expect("4 bytes"));
        assert_eq!((size(16), size(20)), SCREENSHOT_SIZE, "the screenshot's size");
        // A blank page of this size compresses to a few KiB; the rendered table is far more.
        assert!(png.len() > 12_000, "the screenshot is only {} bytes: a blank page?", png.len());
    });
}
