//! The onekv node process, as a library: configuration, the gRPC services for clients and peers,
//! the peer transport, and [`serve`], which runs a node until told to stop.
//!
//! Owns:
//! - [`config`]: the TOML configuration file, its defaults and validation;
//! - [`service`]: the client API (`Kv`), request limits and the error-to-status mapping;
//! - [`peer`]: the `Peer` service that feeds Raft messages from other members to the replica;
//! - [`auth`]: the cluster secret that peers prove membership with;
//! - [`admission`]: per-service bounds on calls at once and message size, checked before a
//!   call's body is decoded;
//! - [`transport`]: the [`onekv_replica::Transport`] that sends this node's Raft messages;
//! - [`backend`]: the trait through which the services use the node (a fake in tests);
//! - [`cluster_map`]: the node's copy of the cluster map (which nodes hold each shard), kept so
//!   a restart keeps its placement;
//! - [`metrics`]: Prometheus metrics (requests, Raft, log, index, disk), documented in
//!   `docs/metrics.md`;
//! - [`http`]: the optional HTTP endpoint (`http_listen`): `/metrics`, the status page, `/healthz`.
//!
//! The optional Redis-protocol front end (`resp_listen`) is the `onekv-resp` crate; [`serve`] runs it.
//!
//! Does not own consensus, storage or recovery (the `onekv-replica` crate), the wire schema
//! (`onekv-proto`), process concerns such as signals and logging setup (the `onekv` binary), or
//! retries and leader discovery (the client).

pub mod admission;
pub mod auth;
pub mod backend;
pub mod cluster_map;
pub mod config;
pub mod http;
pub mod members;
pub mod metrics;
pub mod peer;
pub mod service;
pub mod transport;

use std::future::Future;
use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use onekv_placement::ClusterMap;
use onekv_replica::{Node, Transport};
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

pub use auth::PeerSecret;
pub use backend::Backend;
pub use config::ServerConfig;
pub use peer::PeerService;
pub use service::{KvService, local_kv_service};
pub use transport::{GrpcTransport, TransportOptions, TransportStats};

/// After the shutdown signal, how long in-flight requests get to finish beyond the request timeout
/// before the node stops anyway.
const SHUTDOWN_GRACE_BEYOND_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Once no request is in flight, how long connections get to close.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Runs one node until `shutdown` completes: validates `config` (before touching any data), binds
/// the listen address (and `http_listen`, if set), opens the replica, serves the `Kv` and `Peer`
/// services on that one port (and the HTTP endpoint on its own). On `shutdown` it stops the HTTP
/// and RESP listeners, refuses new client requests while the Raft messages keep flowing until the
/// in-flight ones finish, then stops accepting and shuts the replica down.
///
/// Nothing is flushed at shutdown: every acknowledged write is already fsynced in the node's
/// log(s); the index is rebuilt from the Raft log on the next open.
///
/// With `resp_listen` set it also serves the Redis protocol there (`onekv_resp::serve_resp`, bound
/// with the others before the replica opens, stopped with them) and prints `onekv node N resp on
/// ADDR`.
///
/// Prints one line to standard output once it is ready:
/// `onekv node N serving on ADDR (storage MODE, data DIR)`.
pub async fn serve(config: ServerConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    config.validate()?;
    // Read before anything is bound or opened, so a missing or bad secret file stops the start.
    let secret = config.peer_secret()?;
    // Binding before opening the replica reports a busy port at once, not after recovery.
    let listener = TcpListener::bind(&config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let http_listener = match &config.http_listen {
        Some(address) => Some(
            TcpListener::bind(address)
                .await
                .with_context(|| format!("cannot listen on {address} (http_listen)"))?,
        ),
        None => None,
    };
    let resp = match &config.resp_listen {
        Some(address) => {
            let listener = TcpListener::bind(address)
                .await
                .with_context(|| format!("cannot listen on {address} (resp_listen)"))?;
            let bound = listener.local_addr().context("cannot read the RESP listening address")?;
            Some((listener, bound, resp_context(&config, address)?))
        }
        None => None,
    };

    // Crash points (test builds only) cover the server's own files too, from the join on.
    onekv_replica::failpoints::arm_from_env().map_err(|e| anyhow::anyhow!("ONEKV_FAILPOINTS: {e}"))?;
    // A node joining a running cluster copies its map and member list first.
    members::join(&config).await?;
    // Before the node's data directory is used: a restart must keep the placement it was made with,
    // and the member list it last knew.
    let (map, directory) = {
        let config = config.clone();
        tokio::task::spawn_blocking(move || {
            anyhow::Ok((cluster_map::load_or_create(&config)?, members::Directory::load_or_create(&config)?))
        })
        .await
        .context("reading the cluster map panicked")??
    };
    let map = Arc::new(map);
    let directory = Arc::new(directory);
    let peers = directory
        .current()
        .members()
        .iter()
        .map(|member| (member.id, member.address.clone()))
        .collect::<Vec<_>>();
    let options = TransportOptions { secret: secret.clone(), ..TransportOptions::default() };
    let transport = Arc::new(GrpcTransport::start(config.node_id, peers, options));
    let replica_config = config.to_replica_config(&map);
    let replica_transport: Arc<dyn Transport> = Arc::clone(&transport) as Arc<dyn Transport>;
    // Opening recovers the log and the index: blocking work of unbounded length.
    let replica = tokio::task::spawn_blocking(move || Node::open(replica_config, replica_transport))
        .await
        .context("opening the node panicked")?
        .with_context(|| format!("cannot open the node in {}", config.data_dir.display()));
    let replica = match replica {
        Ok(replica) => Arc::new(replica),
        Err(error) => {
            transport.close();
            return Err(error);
        }
    };
    // The transport follows the member list; the list follows the agreed one. Both tasks stop
    // when `member_tasks` is dropped: once the server stopped, or on any way out before.
    let mut changes = directory.subscribe();
    let follower_transport = Arc::clone(&transport);
    let follow_members = tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            let list = changes.borrow_and_update().clone();
            follower_transport
                .set_peers(list.members().iter().map(|member| (member.id, member.address.clone())));
        }
    });
    let refresh_members = tokio::spawn(members::refresh_forever(Arc::clone(&directory), config.node_id));
    let member_tasks = AbortOnDrop(vec![follow_members, refresh_members]);

    // The HTTP endpoint stops accepting when the node starts draining.
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let http = match http_listener {
        Some(http_listener) => {
            let stopped = async move {
                // An error means the sender is gone: the gRPC server stopped; stop too.
                let _ = http_stopped.await;
            };
            match http::http_server(
                http_listener,
                &config,
                Arc::clone(&replica),
                Arc::clone(&directory),
                stopped,
            ) {
                Ok(server) => Some(tokio::spawn(server)),
                Err(error) => {
                    transport.close();
                    let stopping = Arc::clone(&replica);
                    let _ = tokio::task::spawn_blocking(move || stopping.shutdown()).await;
                    return Err(error);
                }
            }
        }
        None => None,
    };
    // So does the RESP front end. It reaches this node's own `Kv` service in process (the very
    // service the gRPC server runs: its admission and drain), not through a connection to itself.
    let services = Services {
        map: Arc::clone(&map),
        directory: Arc::clone(&directory),
        secret: secret.clone(),
        drain: service::Drain::default(),
    };
    let kv = services.kv(Arc::clone(&replica), &config).into_server();
    let (stop_resp, resp_stopped) = tokio::sync::oneshot::channel::<()>();
    let resp = match resp {
        Some((resp_listener, address, context)) => {
            let own = config.member_address(config.node_id).unwrap_or(&config.listen);
            if let Err(error) = context.serve_locally(own, local_kv_service(kv.clone())) {
                // Validated addresses always parse; should one not, calls to this node go over a
                // connection, as to any other.
                tracing::warn!(%error, "the RESP front end reaches this node over gRPC");
            }
            let stopped = async move {
                let _ = resp_stopped.await;
            };
            let task = tokio::spawn(onekv_resp::serve_resp(resp_listener, context, stopped));
            let ready = format!("onekv node {} resp on {address}", config.node_id);
            tracing::info!("{ready}");
            println!("{ready}");
            Some(task)
        }
        None => None,
    };
    let shutdown = async move {
        shutdown.await;
        let _ = stop_http.send(());
        let _ = stop_resp.send(());
    };
    let served = serve_services(listener, &config, Arc::clone(&replica), services, kv, shutdown).await;
    drop(member_tasks);
    let http_served = match http {
        Some(task) => task.await.context("the HTTP server panicked").and_then(|result| result),
        None => Ok(()),
    };
    let resp_served = match resp {
        Some(task) => task
            .await
            .context("the RESP front end panicked")
            .and_then(|result| result.context("the RESP front end failed")),
        None => Ok(()),
    };

    let stopping = Arc::clone(&replica);
    let stopped = tokio::task::spawn_blocking(move || stopping.shutdown()).await;
    transport.close();
    served?;
    http_served?;
    resp_served?;
    stopped.context("shutting the replica down panicked")?;
    tracing::info!(node = config.node_id, "stopped");
    Ok(())
}

/// Tasks aborted when this is dropped.
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// The RESP front end's shared state: its client reaches every member, this node first, so a
/// command goes to the leader directly once it is known; its limits are the node's.
fn resp_context(config: &ServerConfig, resp_address: &str) -> anyhow::Result<onekv_resp::RespContext> {
    let own = config.member_address(config.node_id).unwrap_or(&config.listen).to_string();
    let mut endpoints = vec![own.clone()];
    endpoints
        .extend(config.members.iter().map(|member| member.address.clone()).filter(|address| *address != own));
    let mut settings = onekv_resp::RespSettings::new(config.node_id, endpoints, resp_address.to_string());
    // A little longer than the node's own budget, so the node's DEADLINE_EXCEEDED (which names
    // the cause) arrives before the client gives up on the attempt.
    settings.client_options.request_timeout = config.request_timeout() + Duration::from_secs(1);
    let limits = &config.limits;
    settings.max_key_bytes = limits.max_key_bytes;
    settings.max_value_bytes = limits.max_value_bytes;
    settings.max_batch_ops = limits.max_batch_ops;
    settings.max_batch_bytes = limits.max_batch_bytes;
    settings.max_scan_pairs = limits.max_scan_pairs;
    settings.fast_path = config.cluster.fast_path;
    onekv_resp::RespContext::new(settings).context("cannot set up the RESP front end")
}

/// Serves the `Kv` and `Peer` services over `backend` on `listener` until `shutdown` completes,
/// then refuses new `Kv` requests (UNAVAILABLE) while `Peer` keeps serving, waits (bounded by the
/// request timeout plus a grace period) for the `Kv` requests in flight, and stops accepting.
/// Prints the ready line. The `Peer` service accepts calls carrying the secret in
/// `peer_secret_file` (read here) and no others; without one, none. [`serve`] does this with the
/// replica; tests and tools may call it with another [`Backend`].
pub async fn serve_backend<B: Backend>(
    listener: TcpListener,
    config: &ServerConfig,
    backend: Arc<B>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let services = Services {
        secret: config.peer_secret()?,
        map: Arc::new(config.cluster_map().context("cannot place the shards")?),
        directory: Arc::new(members::Directory::from_config(config)?),
        drain: service::Drain::default(),
    };
    let kv = services.kv(Arc::clone(&backend), config).into_server();
    serve_services(listener, config, backend, services, kv, shutdown).await
}

/// What the node's `Kv` service and its `Peer` service are made of: the map, the member list, the
/// secret, and the drain that stops `Kv` requests (over gRPC and in process alike) at shutdown.
struct Services {
    map: Arc<ClusterMap>,
    directory: Arc<members::Directory>,
    secret: Option<PeerSecret>,
    drain: service::Drain,
}

impl Services {
    fn kv<B: Backend>(&self, backend: Arc<B>, config: &ServerConfig) -> KvService<B> {
        KvService::new(backend, config, Arc::clone(&self.map))
            .with_members(Arc::clone(&self.directory))
            .with_secret(self.secret.clone())
            .with_drain(self.drain.clone())
    }
}

/// Serves `kv` (built from `services`, [`Services::kv`]) and the `Peer` service on `listener`.
async fn serve_services<B: Backend>(
    listener: TcpListener,
    config: &ServerConfig,
    backend: Arc<B>,
    services: Services,
    kv: admission::Admitted<onekv_proto::kv_server::KvServer<KvService<B>>>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let address = listener.local_addr().context("cannot read the listening address")?;
    let Services { directory, secret, drain, .. } = &services;
    if secret.is_none() {
        if config.members.iter().any(|member| member.id != config.node_id) {
            // Validation refuses this; only a caller that skipped it gets here.
            tracing::warn!("no peer_secret_file: the Peer service refuses every call, so no peer is heard");
        } else {
            tracing::info!("no peer_secret_file (a single member): the Peer service refuses every call");
        }
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = Server::builder()
        .tcp_nodelay(true)
        .add_service(kv)
        .add_service(
            PeerService::new(backend, config)
                .with_members(Arc::clone(directory))
                .with_secret(secret.clone())
                .into_server(),
        )
        .serve_with_incoming_shutdown(TcpIncoming::from(listener).with_nodelay(Some(true)), async {
            let _ = stopped.await;
        });

    let ready = format!(
        "onekv node {} serving on {address} (storage {}, data {})",
        config.node_id,
        config.storage.name(),
        config.data_dir.display()
    );
    tracing::info!("{ready}");
    println!("{ready}");
    let _ = std::io::stdout().flush();

    tokio::pin!(server, shutdown);
    tokio::select! {
        result = &mut server => return result.context("the gRPC server failed"),
        () = &mut shutdown => {}
    }
    // Client requests stop first; Raft messages keep flowing until those in flight have their
    // answers (a draining leader still needs its followers to commit them).
    tracing::info!(node = config.node_id, "shutting down: refusing new requests; finishing in-flight ones");
    let grace = config.request_timeout() + SHUTDOWN_GRACE_BEYOND_REQUEST_TIMEOUT;
    let deadline = tokio::time::Instant::now() + grace;
    tokio::select! {
        result = &mut server => return result.context("the gRPC server failed while draining"),
        drained = tokio::time::timeout_at(deadline, drain.stop_and_wait()) => {
            if drained.is_err() {
                tracing::warn!(?grace, "requests still in flight after the grace period; stopping anyway");
            }
        }
    }
    let _ = stop.send(());
    match tokio::time::timeout_at(deadline.max(tokio::time::Instant::now() + CLOSE_WAIT), &mut server).await {
        Ok(result) => result.context("the gRPC server failed while shutting down"),
        Err(_) => {
            tracing::warn!("connections still open after the grace period; stopping anyway");
            Ok(())
        }
    }
}
