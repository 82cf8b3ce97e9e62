//! The onekv node process, as a library: configuration, the gRPC services for clients and peers,
//! the peer transport, and [`serve`], which runs a node until told to stop.
//!
//! Owns:
//! - [`config`]: the TOML configuration file, its defaults and validation;
//! - [`service`]: the client API (`Kv`), request limits and the error-to-status mapping;
//! - [`peer`]: the `Peer` service that feeds Raft messages from other members to the replica;
//! - [`transport`]: the [`onekv_replica::Transport`] that sends this node's Raft messages;
//! - [`backend`]: the trait through which the services use the replica (a fake in tests).
//!
//! Does not own consensus, storage or recovery (the `onekv-replica` crate), the wire schema
//! (`onekv-proto`), process concerns such as signals and logging setup (the `onekv` binary), or
//! retries and leader discovery (the client).

pub mod backend;
pub mod config;
pub mod peer;
pub mod service;
pub mod transport;

use std::future::Future;
use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use onekv_replica::{Replica, Transport};
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

pub use backend::Backend;
pub use config::ServerConfig;
pub use peer::PeerService;
pub use service::KvService;
pub use transport::{GrpcTransport, TransportOptions, TransportStats};

/// After the shutdown signal, how long in-flight requests get to finish beyond the request timeout
/// before the node stops anyway.
const SHUTDOWN_GRACE_BEYOND_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs one node until `shutdown` completes: validates `config` (before touching any data), binds
/// the listen address, opens the replica, serves the `Kv` and `Peer` services on that one port,
/// then stops accepting, lets in-flight requests finish, and shuts the replica down.
///
/// Prints one line to standard output once it is ready:
/// `onekv node N serving on ADDR (storage MODE, data DIR)`.
pub async fn serve(config: ServerConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    config.validate()?;
    // Binding before opening the replica reports a busy port at once, not after recovery.
    let listener = TcpListener::bind(&config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;

    let peers = config.members.iter().map(|member| (member.id, member.address.clone()));
    let transport = Arc::new(GrpcTransport::start(config.node_id, peers, TransportOptions::default()));
    let replica_config = config.to_replica_config();
    let replica_transport: Arc<dyn Transport> = Arc::clone(&transport) as Arc<dyn Transport>;
    // Opening recovers the log and the index: blocking work of unbounded length.
    let replica = tokio::task::spawn_blocking(move || Replica::open(replica_config, replica_transport))
        .await
        .context("opening the replica panicked")?
        .with_context(|| format!("cannot open the replica in {}", config.data_dir.display()));
    let replica = match replica {
        Ok(replica) => Arc::new(replica),
        Err(error) => {
            transport.close();
            return Err(error);
        }
    };

    let served = serve_backend(listener, &config, Arc::clone(&replica), shutdown).await;

    let stopping = Arc::clone(&replica);
    let stopped = tokio::task::spawn_blocking(move || stopping.shutdown()).await;
    transport.close();
    served?;
    stopped.context("shutting the replica down panicked")?;
    tracing::info!(node = config.node_id, "stopped");
    Ok(())
}

/// Serves the `Kv` and `Peer` services over `backend` on `listener` until `shutdown` completes,
/// then stops accepting and waits (bounded by the request timeout plus a grace period) for
/// in-flight requests. Prints the ready line. [`serve`] calls this with the replica; tests and
/// tools may call it with another [`Backend`].
pub async fn serve_backend<B: Backend>(
    listener: TcpListener,
    config: &ServerConfig,
    backend: Arc<B>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let address = listener.local_addr().context("cannot read the listening address")?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = Server::builder()
        .tcp_nodelay(true)
        .add_service(KvService::new(Arc::clone(&backend), config).into_server())
        .add_service(PeerService::new(backend, config).into_server())
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
    tracing::info!(node = config.node_id, "shutting down: no new connections; finishing in-flight requests");
    let _ = stop.send(());
    let grace = config.request_timeout() + SHUTDOWN_GRACE_BEYOND_REQUEST_TIMEOUT;
    match tokio::time::timeout(grace, &mut server).await {
        Ok(result) => result.context("the gRPC server failed while shutting down"),
        Err(_) => {
            tracing::warn!(?grace, "connections still open after the grace period; stopping anyway");
            Ok(())
        }
    }
}
