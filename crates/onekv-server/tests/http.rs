//! The HTTP endpoint over fake backends: `/cluster.json` gathers every member's status over gRPC
//! and shows an unreachable member as down, `/healthz` reports a storage failure, `/` is the
//! self-contained page, `/metrics` is Prometheus text, and the endpoint stops when told to.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::FakeBackend;
use onekv_replica::ReplicaStatus;
use onekv_server::config::{MemberConfig, ServerConfig};
use onekv_server::http::http_server;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// GET `path`; returns the status code, the lower-cased headers and the body.
async fn get(address: &str, path: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(address).await.expect("connecting");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("a header end");
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, head.to_ascii_lowercase(), body.to_string())
}

fn status(node_id: u64, role: &str, term: u64, applied: u64) -> ReplicaStatus {
    ReplicaStatus {
        node_id,
        role: role.into(),
        term,
        leader_id: Some(2),
        commit_index: applied,
        applied_index: applied,
        log_bytes: 1000,
        bytes_written: 300,
        user_bytes: 100,
        ..ReplicaStatus::default()
    }
}

#[tokio::test]
async fn cluster_json_health_page_and_metrics() {
    let data_dir = tempfile::tempdir().unwrap();
    let grpc2 = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address2 = grpc2.local_addr().unwrap().to_string();
    // A port nobody listens on: bound, read, released.
    let address3 = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().to_string();
    let members = vec![
        MemberConfig { id: 1, address: "127.0.0.1:1".into() },
        MemberConfig { id: 2, address: address2.clone() },
        MemberConfig { id: 3, address: address3 },
    ];
    let config = |node_id: u64| ServerConfig {
        node_id,
        listen: members[node_id as usize - 1].address.clone(),
        data_dir: data_dir.path().to_path_buf(),
        members: members.clone(),
        ..ServerConfig::default()
    };

    // Member 2 is a real gRPC server over a fake replica that leads.
    let backend2 = Arc::new(FakeBackend::default());
    *backend2.status.lock().unwrap() = status(2, "leader", 5, 9);
    let (stop2, stopped2) = tokio::sync::oneshot::channel::<()>();
    let config2 = config(2);
    let server2 = tokio::spawn(async move {
        onekv_server::serve_backend(grpc2, &config2, backend2, async {
            let _ = stopped2.await;
        })
        .await
    });

    // Member 1 serves the HTTP endpoint.
    let backend1 = Arc::new(FakeBackend::default());
    *backend1.status.lock().unwrap() = status(1, "follower", 5, 8);
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_address = http.local_addr().unwrap().to_string();
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let members = Arc::new(onekv_server::members::Directory::from_config(&config(1)).unwrap());
    let server = http_server(http, &config(1), Arc::clone(&backend1), members, async {
        let _ = http_stopped.await;
    })
    .expect("an HTTP server");
    let http_task = tokio::spawn(server);

    let (code, headers, body) = get(&http_address, "/cluster.json").await;
    assert_eq!(code, 200, "{body}");
    assert!(headers.contains("content-type: application/json"), "{headers}");
    let view: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(view["node_id"], 1);
    assert_eq!(view["leader_id"], 2, "{view}");
    let members = view["members"].as_array().expect("members");
    assert_eq!(members.len(), 3);
    assert_eq!((members[0]["id"].as_u64(), members[0]["up"].as_bool()), (Some(1), Some(true)));
    assert_eq!(members[0]["applied_index"], 8, "this node's own status, read locally");
    assert_eq!(members[1]["role"], "leader", "{view}");
    assert_eq!(members[1]["applied_index"], 9, "member 2's status, asked over gRPC");
    assert_eq!(members[1]["write_amplification"], 3.0);
    assert_eq!((members[2]["id"].as_u64(), members[2]["up"].as_bool()), (Some(3), Some(false)));
    assert!(!members[2]["error"].as_str().unwrap().is_empty(), "a down member says why: {view}");

    let (code, _, body) = get(&http_address, "/healthz").await;
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    backend1.status.lock().unwrap().failure = Some("fsync failed".into());
    let (code, _, body) = get(&http_address, "/healthz").await;
    assert_eq!(code, 503);
    assert!(body.contains("fsync failed"), "{body}");

    let (code, headers, page) = get(&http_address, "/").await;
    assert_eq!(code, 200);
    assert!(headers.contains("content-type: text/html"), "{headers}");
    assert!(
        page.contains("fetch(\"cluster.json\"") && page.contains("<table"),
        "the page polls cluster.json"
    );
    assert!(!page.contains("src=\"http") && !page.contains("href=\"http"), "no external assets");

    let (code, headers, text) = get(&http_address, "/metrics").await;
    assert_eq!(code, 200);
    assert!(headers.contains("content-type: text/plain; version=0.0.4"), "{headers}");
    assert!(text.lines().any(|line| line == "onekv_replica_failed 1"), "{text}");

    let (code, _, _) = get(&http_address, "/nothing-here").await;
    assert_eq!(code, 404);

    stop_http.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), http_task)
        .await
        .expect("the HTTP server stops when told")
        .unwrap()
        .unwrap();
    assert!(TcpStream::connect(&http_address).await.is_err(), "no longer accepting");
    stop2.send(()).unwrap();
    server2.await.unwrap().unwrap();
}
