//! The node's HTTP endpoint (`http_listen`): Prometheus metrics, a status page of the whole
//! cluster, the JSON it polls, and a health check.
//!
//! Routes:
//! - `GET /metrics` — Prometheus text format 0.0.4 ([`crate::metrics`]);
//! - `GET /` — a self-contained HTML page (inline JS, no external assets) that polls
//!   `/cluster.json` every second and shows every member's role, term, applied index, log size,
//!   write amplification and recent throughput;
//! - `GET /cluster.json` — this node's status and every other member's, gathered over gRPC
//!   (`Kv.Status`) with a short timeout; a member that does not answer is shown as down;
//! - `GET /healthz` — `200 ok` while the replica can serve, `503` with the failure text once
//!   `ReplicaStatus::failure` is set (a failed replica stays up so status and metrics show why,
//!   but takes no part in Raft and sends every client elsewhere: see `docs/failover.md`), so a
//!   load balancer or supervisor takes the node out of rotation.
//!
//! Owns the routes and the JSON shape. Does not own the metrics themselves (`metrics`) nor the
//! node's lifecycle ([`crate::serve`] binds, starts and stops this endpoint with the gRPC server).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use onekv_proto::StatusRequest;
use onekv_proto::kv_client::KvClient;
use onekv_replica::ReplicaStatus;
use serde::Serialize;
use tokio::net::TcpListener;
use tonic::transport::{Channel, Endpoint};

use crate::backend::Backend;
use crate::config::ServerConfig;
use crate::members::Directory;
use crate::metrics::{NodeMetrics, write_amplification};

/// HTTP requests handled at once.
const MAX_CONCURRENT_REQUESTS: usize = 16;

/// How long `/cluster.json` waits to connect to a member, and for its answer: short, because the
/// page polls every second and a down member must not hold up the others.
const MEMBER_CONNECT_TIMEOUT: Duration = Duration::from_millis(300);
/// See [`MEMBER_CONNECT_TIMEOUT`].
const MEMBER_STATUS_TIMEOUT: Duration = Duration::from_millis(700);
/// After shutdown began, how long open HTTP requests get to finish.
const HTTP_DRAIN_TIMEOUT: Duration = Duration::from_secs(3);
/// The Prometheus text format's content type.
const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The status page: one HTML file with its script and style inline.
const STATUS_PAGE: &str = include_str!("status.html");

/// What the routes share.
struct HttpState<B> {
    backend: Arc<B>,
    node_id: u64,
    metrics: NodeMetrics,
    /// The cluster's member list as this node knows it.
    members: Arc<Directory>,
    /// A lazily connected client per member address asked so far.
    clients: Mutex<HashMap<String, KvClient<Channel>>>,
}

impl<B> HttpState<B> {
    /// Every member but this node: id, address and a client (made on first use).
    fn peers(&self) -> Vec<(u64, String, Result<KvClient<Channel>, String>)> {
        let list = self.members.current();
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        list.members()
            .iter()
            .filter(|member| member.id != self.node_id)
            .map(|member| {
                let client = match clients.get(&member.address) {
                    Some(client) => Ok(client.clone()),
                    None => Endpoint::from_shared(format!("http://{}", member.address))
                        .map(|endpoint| {
                            let endpoint = endpoint
                                .connect_timeout(MEMBER_CONNECT_TIMEOUT)
                                .timeout(MEMBER_STATUS_TIMEOUT);
                            let client = KvClient::new(endpoint.connect_lazy());
                            clients.insert(member.address.clone(), client.clone());
                            client
                        })
                        .map_err(|error| format!("invalid address: {error}")),
                };
                (member.id, member.address.clone(), client)
            })
            .collect()
    }
}

/// One member as `/cluster.json` shows it.
#[derive(Debug, Default, Serialize)]
pub struct MemberView {
    /// Node id.
    pub id: u64,
    /// Its `listen` address.
    pub address: String,
    /// Whether it answered.
    pub up: bool,
    /// Why it is shown as down (empty when up).
    pub error: String,
    /// Its role: `leader`, `follower`, `candidate`, `pre-candidate` (empty when down).
    pub role: String,
    /// The leader it knows (0: none).
    pub leader_id: u64,
    /// Its Raft term.
    pub term: u64,
    /// Its commit index.
    pub commit_index: u64,
    /// Its applied index.
    pub applied_index: u64,
    /// Bytes in its logs now.
    pub log_bytes: u64,
    /// Bytes it wrote to disk since it started.
    pub bytes_written: u64,
    /// User bytes it applied since it started.
    pub user_bytes: u64,
    /// `bytes_written / user_bytes` (0 before any user byte).
    pub write_amplification: f64,
    /// Its storage mode.
    pub storage: String,
    /// The storage failure that stopped its writes, if any.
    pub failure: String,
    /// Why its "disk full" alarm is raised, if it is.
    pub disk_alarm: String,
    /// Free bytes on its data directory's file system.
    pub disk_free_bytes: u64,
}

/// The body of `/cluster.json`.
#[derive(Debug, Serialize)]
pub struct ClusterView {
    /// The node that answered.
    pub node_id: u64,
    /// When, in milliseconds since the Unix epoch (the page computes throughput from it).
    pub time_ms: u64,
    /// The leader: the up member that says it leads, in the highest term (0: none).
    pub leader_id: u64,
    /// Every member, in configuration order.
    pub members: Vec<MemberView>,
}

/// The HTTP endpoint on `listener` as a task to spawn: it serves until `shutdown` completes, then
/// stops accepting and gives open requests [`HTTP_DRAIN_TIMEOUT`] to finish. Fails at once (before
/// serving) on a member address that is not a valid URI authority.
pub fn http_server<B: Backend>(
    listener: TcpListener,
    config: &ServerConfig,
    backend: Arc<B>,
    members: Arc<Directory>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<impl Future<Output = anyhow::Result<()>> + Send + 'static> {
    let address = listener.local_addr().context("cannot read the HTTP address")?;
    let app = router(config, backend, members)?;
    tracing::info!(node = config.node_id, "HTTP (metrics, status page) on http://{address}/");
    Ok(async move {
        let (stopping, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                shutdown.await;
                let _ = stopping.send(());
            })
            .into_future();
        tokio::pin!(server);
        tokio::select! {
            result = &mut server => return result.context("the HTTP server failed"),
            _ = stopped => {}
        }
        match tokio::time::timeout(HTTP_DRAIN_TIMEOUT, server).await {
            Ok(result) => result.context("the HTTP server failed while stopping"),
            Err(_) => {
                tracing::warn!("HTTP requests still open after {HTTP_DRAIN_TIMEOUT:?}; stopping anyway");
                Ok(())
            }
        }
    })
}

/// The routes over `backend` for the node `config` describes, whose member list is `members`.
pub fn router<B: Backend>(
    config: &ServerConfig,
    backend: Arc<B>,
    members: Arc<Directory>,
) -> anyhow::Result<axum::Router> {
    let state = Arc::new(HttpState {
        backend,
        node_id: config.node_id,
        metrics: NodeMetrics::new(config.node_id, &config.data_dir),
        members,
        clients: Mutex::new(HashMap::new()),
    });
    Ok(axum::Router::new()
        .route("/", get(status_page))
        .route("/metrics", get(metrics_text::<B>))
        .route("/cluster.json", get(cluster_json::<B>))
        .route("/healthz", get(healthz::<B>))
        .with_state(state)
        // Each /cluster.json asks every member and each /metrics walks the data directory: at most
        // this many run at once, the rest wait their turn.
        .layer(tower::limit::GlobalConcurrencyLimitLayer::new(MAX_CONCURRENT_REQUESTS)))
}

async fn status_page() -> Html<&'static str> {
    Html(STATUS_PAGE)
}

async fn metrics_text<B: Backend>(State(state): State<Arc<HttpState<B>>>) -> Response {
    // Rendering walks the data directory for disk usage: blocking work.
    let rendered = tokio::task::spawn_blocking(move || state.metrics.render(&state.backend.statuses())).await;
    match rendered {
        Ok(text) => ([(header::CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE)], text).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, format!("rendering metrics failed: {error}\n"))
            .into_response(),
    }
}

async fn healthz<B: Backend>(State(state): State<Arc<HttpState<B>>>) -> Response {
    match state.backend.failure() {
        None => (StatusCode::OK, "ok\n").into_response(),
        Some(failure) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "failed: storage failure: {failure}; this node takes no part in Raft and serves no \
                 client until it is restarted\n"
            ),
        )
            .into_response(),
    }
}

async fn cluster_json<B: Backend>(State(state): State<Arc<HttpState<B>>>) -> Response {
    let view = cluster_view(&state).await;
    match serde_json::to_string(&view) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")).into_response(),
    }
}

async fn cluster_view<B: Backend>(state: &HttpState<B>) -> ClusterView {
    let mut asks = tokio::task::JoinSet::new();
    for (id, address, client) in state.peers() {
        let mut client = match client {
            Ok(client) => client,
            Err(error) => {
                asks.spawn(async move { down(id, address, error) });
                continue;
            }
        };
        asks.spawn(async move {
            let answer = tokio::time::timeout(MEMBER_STATUS_TIMEOUT, client.status(StatusRequest {})).await;
            match answer {
                Ok(Ok(response)) => remote_view(id, address, response.into_inner()),
                Ok(Err(status)) => down(id, address, status.message().to_string()),
                Err(_) => down(id, address, format!("no answer within {MEMBER_STATUS_TIMEOUT:?}")),
            }
        });
    }
    let mut views = vec![local_view(state, &state.backend.summary())];
    while let Some(view) = asks.join_next().await {
        // A panicked ask loses only its own member, which then shows as missing from the answers.
        if let Ok(view) = view {
            views.push(view);
        }
    }
    let list = state.members.current();
    let mut members: Vec<MemberView> = list
        .members()
        .iter()
        .map(|member| match views.iter().position(|view| view.id == member.id) {
            Some(at) => views.swap_remove(at),
            None => down(member.id, member.address.clone(), "not asked".into()),
        })
        .collect();
    members.sort_by_key(|member| member.id);
    let leader_id = members
        .iter()
        .filter(|member| member.up && member.role == "leader")
        .max_by_key(|member| member.term)
        .map_or(0, |member| member.id);
    ClusterView { node_id: state.node_id, time_ms: now_ms(), leader_id, members }
}

fn local_view<B>(state: &HttpState<B>, status: &ReplicaStatus) -> MemberView {
    let address = state.members.current().address(state.node_id).map(str::to_string);
    MemberView {
        id: state.node_id,
        address: address.unwrap_or_default(),
        up: true,
        error: String::new(),
        role: status.role.clone(),
        leader_id: status.leader_id.unwrap_or(0),
        term: status.term,
        commit_index: status.commit_index,
        applied_index: status.applied_index,
        log_bytes: status.log_bytes,
        bytes_written: status.bytes_written,
        user_bytes: status.user_bytes,
        write_amplification: write_amplification(status),
        storage: status.storage.name().to_string(),
        failure: status.failure.clone().unwrap_or_default(),
        disk_alarm: status.disk.alarm.clone().unwrap_or_default(),
        disk_free_bytes: status.disk.free_bytes,
    }
}

fn remote_view(id: u64, address: String, status: onekv_proto::StatusResponse) -> MemberView {
    MemberView {
        id,
        address,
        up: true,
        error: String::new(),
        role: status.role,
        leader_id: status.leader_id,
        term: status.term,
        commit_index: status.commit_index,
        applied_index: status.applied_index,
        log_bytes: status.log_bytes,
        bytes_written: status.bytes_written,
        user_bytes: status.user_bytes,
        write_amplification: status.write_amplification,
        storage: status.storage_mode,
        failure: status.failure,
        disk_alarm: status.disk_alarm,
        disk_free_bytes: status.disk_free_bytes,
    }
}

fn down(id: u64, address: String, error: String) -> MemberView {
    MemberView { id, address, up: false, error, ..MemberView::default() }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64)
}
