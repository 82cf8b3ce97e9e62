//! The reference documents against the code: every configuration key is in `docs/config.md` and
//! every key documented there exists; every metric `/metrics` serves is in `docs/metrics.md` and
//! every metric documented there is served.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use common::FakeBackend;
use onekv_log::LogStats;
use onekv_proto::kv_server::Kv as _;
use onekv_proto::{GetRequest, PutRequest, StatusRequest};
use onekv_replica::{LogStatus, ReplicaStatus, StorageMode};
use onekv_server::config::{MemberConfig, ServerConfig};
use onekv_server::{KvService, metrics};
use tonic::Request;

fn doc(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The backticked names in the first column of the document's tables.
fn documented_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`').map(|(name, _)| name.to_string()))
        .collect()
}

/// The fields the struct at `path` (`""`, `"raft"`, `"members"`) accepts, read from the parser's
/// own "unknown field, expected one of ..." message, so that optional fields (absent when
/// serialized) count too.
fn fields_at(path: &str) -> Vec<String> {
    let bogus = "no_such_key_in_onekv";
    let text = match path {
        "" => format!("{bogus} = 1"),
        "members" => format!("[[members]]\n{bogus} = 1"),
        table => format!("[{table}]\n{bogus} = 1"),
    };
    let error = ServerConfig::parse(&text).expect_err("a bogus key is rejected");
    let expected = error.split_once("expected").unwrap_or_else(|| panic!("unexpected message: {error}")).1;
    let fields: Vec<String> = expected.split('`').skip(1).step_by(2).map(str::to_string).collect();
    assert!(!fields.is_empty(), "no field names in {error:?}");
    fields
}

/// Every key of the configuration as documented: `node_id`, `raft.tick_ms`, `members[].id`, ...
fn config_keys() -> BTreeSet<String> {
    // A value with every table present, to tell which keys are tables (and arrays of tables).
    let sample = ServerConfig {
        members: vec![MemberConfig { id: 1, address: "127.0.0.1:7001".into() }],
        ..ServerConfig::default()
    };
    let table = toml::Table::try_from(&sample).expect("the configuration serializes to a table");
    let mut keys = BTreeSet::new();
    for field in fields_at("") {
        match table.get(&field) {
            Some(toml::Value::Table(_)) => {
                keys.extend(fields_at(&field).into_iter().map(|inner| format!("{field}.{inner}")));
            }
            Some(toml::Value::Array(items)) if items.iter().all(toml::Value::is_table) => {
                keys.extend(fields_at(&field).into_iter().map(|inner| format!("{field}[].{inner}")));
            }
            _ => {
                keys.insert(field);
            }
        }
    }
    keys
}

#[test]
fn every_configuration_key_is_documented_and_nothing_else() {
    let keys = config_keys();
    for expected in ["node_id", "http_listen", "raft.tick_ms", "members[].address", "log.segment_bytes"] {
        assert!(keys.contains(expected), "the key walk missed {expected}: {keys:?}");
    }
    let documented = documented_names(&doc("config.md"));
    let missing: Vec<_> = keys.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&keys).collect();
    assert!(missing.is_empty(), "keys missing from docs/config.md: {missing:?}");
    assert!(unknown.is_empty(), "docs/config.md documents keys the configuration does not have: {unknown:?}");
}

#[test]
fn the_documented_segment_size_range_is_the_enforced_one() {
    let (min, max) = onekv_replica::ReplicaConfig::SEGMENT_BYTES_RANGE;
    let range = format!("{min}..={max}");
    let config = doc("config.md");
    let row = config.lines().find(|line| line.starts_with("| `log.segment_bytes`")).expect("a row");
    assert!(row.contains(&range), "docs/config.md should give the range {range}: {row}");
    let example = doc("config-example.toml");
    for bound in [min, max] {
        assert!(example.contains(&bound.to_string()), "docs/config-example.toml should name {bound}");
    }
}

/// The metric names a Prometheus text exposition declares (`# TYPE name kind`).
fn served_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_whitespace().next().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn every_metric_is_documented_and_every_documented_metric_is_served() {
    let backend = Arc::new(FakeBackend::default());
    let mut fsyncs = LogStats { fsyncs: 2, fsync_us_total: 300, fsync_us_max: 200, ..LogStats::default() };
    fsyncs.fsync_buckets[7] = 1;
    fsyncs.fsync_buckets[8] = 1;
    *backend.status.lock().unwrap() = ReplicaStatus {
        node_id: 1,
        leader_id: Some(1),
        term: 3,
        role: "leader".into(),
        commit_index: 12,
        applied_index: 11,
        storage: StorageMode::OneLog,
        user_bytes: 100,
        bytes_written: 250,
        logs: vec![LogStatus { name: "log".into(), bytes: 4096, stats: fsyncs }],
        leader_changes: 1,
        dedup: onekv_replica::DedupStatus { mode: "elastic".into(), inline_hits: 3, ..Default::default() },
        ..ReplicaStatus::default()
    };
    let data_dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(data_dir.path().join("log")).unwrap();
    std::fs::write(data_dir.path().join("log").join("segment"), [0u8; 123]).unwrap();
    let config = ServerConfig {
        node_id: 1,
        data_dir: data_dir.path().to_path_buf(),
        members: vec![MemberConfig { id: 1, address: "127.0.0.1:7001".into() }],
        ..ServerConfig::default()
    };
    let node = metrics::NodeMetrics::new(1, data_dir.path());
    // Requests through the gRPC service record the request metrics, errors included.
    let service = KvService::new(Arc::clone(&backend), &config, Arc::new(config.cluster_map().unwrap()));
    let put = PutRequest { key: b"k".to_vec(), value: b"v".to_vec(), request_id: None, expiry: None };
    service.put(Request::new(put)).await.unwrap();
    let bad = GetRequest { key: Vec::new(), ..GetRequest::default() };
    service.get(Request::new(bad)).await.unwrap_err();
    service.status(Request::new(StatusRequest {})).await.unwrap();

    let mut status = backend.status.lock().unwrap().clone();
    status.shard = 1;
    let text = node.render(&[status]);
    let served = served_names(&text);
    let documented = documented_names(&doc("metrics.md"));
    let missing: Vec<_> = served.difference(&documented).collect();
    let unserved: Vec<_> = documented.difference(&served).collect();
    assert!(missing.is_empty(), "metrics missing from docs/metrics.md: {missing:?}\n{text}");
    assert!(unserved.is_empty(), "documented metrics not served: {unserved:?}\n{text}");

    // Spot checks of values and labels.
    for line in [
        "onekv_raft_applied_index 11",
        "onekv_raft_is_leader 1",
        "onekv_raft_leader_changes_total 1",
        "onekv_write_amplification 2.5",
        "onekv_log_size_bytes{log=\"log\"} 4096",
        "onekv_disk_bytes{component=\"log\"} 123",
        "onekv_log_fsync_duration_seconds_count{log=\"log\"} 2",
        "onekv_requests_total{protocol=\"grpc\",op=\"put\",outcome=\"ok\"} 1",
        "onekv_requests_total{protocol=\"grpc\",op=\"get\",outcome=\"error\"} 1",
        "onekv_request_duration_seconds_bucket{protocol=\"grpc\",op=\"put\",le=\"10\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing line {line:?} in\n{text}");
    }
}
