//! The `Peer` service: only calls carrying the cluster secret are read, at most a bounded number at
//! once; decoding never panics, and only messages for this node from members reach the replica.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::FakeBackend;
use onekv_proto::peer_client::PeerClient;
use onekv_proto::peer_server::PeerServer;
use onekv_proto::{PeerAck, PeerMessages, peer_server::Peer};
use onekv_replica::Message;
use onekv_server::admission::{Admission, Admitted};
use onekv_server::auth::PEER_SECRET_METADATA;
use onekv_server::config::{MemberConfig, ServerConfig};
use onekv_server::{PeerSecret, PeerService};
use proptest::prelude::*;
use protobuf::Message as _;
use raft::eraftpb::{Entry, MessageType};
use tokio::sync::{Semaphore, mpsc};
use tonic::transport::server::TcpIncoming;
use tonic::{Code, Request, Response, Status};

/// A batch of `messages` from node `from`, all of shard 1.
fn batch(from: u64, messages: Vec<Vec<u8>>) -> PeerMessages {
    let shards = vec![1; messages.len()];
    PeerMessages { from, messages, shards }
}

fn service() -> (Arc<FakeBackend>, PeerService<FakeBackend>) {
    let backend = Arc::new(FakeBackend::default());
    let config = common::three_node_config(std::path::Path::new("/unused"));
    (Arc::clone(&backend), PeerService::new(backend, &config))
}

fn message(from: u64, to: u64) -> Message {
    let mut message = Message::default();
    message.set_msg_type(MessageType::MsgAppend);
    message.from = from;
    message.to = to;
    message.term = 5;
    message.entries.push(Entry { index: 9, data: vec![1, 2, 3].into(), ..Entry::default() });
    message
}

fn encoded(message: &Message) -> Vec<u8> {
    message.write_to_bytes().unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn send(service: &PeerService<FakeBackend>, batch: PeerMessages) -> Result<(), tonic::Status> {
    runtime().block_on(service.send(Request::new(batch))).map(|_| ())
}

#[test]
fn valid_messages_are_stepped_in_order() {
    let (backend, service) = service();
    let first = message(2, 1);
    let mut second = message(2, 1);
    second.set_msg_type(MessageType::MsgHeartbeat);
    send(&service, batch(2, vec![encoded(&first), encoded(&second)])).unwrap();
    let stepped = backend.stepped.lock().unwrap();
    assert_eq!(*stepped, vec![first, second]);
}

#[test]
fn garbage_is_invalid_argument_and_nothing_is_stepped() {
    let (backend, service) = service();
    // A valid message followed by garbage: the whole batch is refused.
    let batch = batch(2, vec![encoded(&message(2, 1)), vec![0xff; 7]]);
    let status = send(&service, batch).unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("message 1 from node 2 does not decode"), "{}", status.message());
    assert!(backend.stepped.lock().unwrap().is_empty());
}

#[test]
fn a_message_for_another_node_is_refused() {
    let (backend, service) = service();
    let status = send(&service, batch(2, vec![encoded(&message(2, 3))])).unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("addressed to node 3, but this is node 1"), "{}", status.message());
    assert!(backend.stepped.lock().unwrap().is_empty());
}

#[test]
fn a_sender_that_is_not_a_member_is_refused() {
    let (backend, service) = service();
    let status = send(&service, batch(9, vec![encoded(&message(9, 1))])).unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(status.message().contains("node 9 is not a member"), "{}", status.message());
    // A member's batch carrying a message from a non-member is refused too.
    let status = send(&service, batch(2, vec![encoded(&message(7, 1))])).unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("node 7, which is not a member"), "{}", status.message());
    assert!(backend.stepped.lock().unwrap().is_empty());
    // But a message from another member may travel in a batch from node 2: raft-rs forwards
    // MsgTransferLeader with `from` set to the transferee.
    send(&service, batch(2, vec![encoded(&message(3, 1))])).unwrap();
    assert_eq!(backend.stepped.lock().unwrap().len(), 1);
}

#[test]
fn large_batches_are_decoded_too() {
    // Above the inline-decoding threshold, decoding moves to a blocking thread.
    let (backend, service) = service();
    let mut big = message(2, 1);
    big.entries[0].data = vec![7u8; 2 << 20].into();
    send(&service, batch(2, vec![encoded(&big)])).unwrap();
    assert_eq!(backend.stepped.lock().unwrap()[0].entries[0].data.len(), 2 << 20);
    let status = send(&service, batch(2, vec![vec![0x0a; 3 << 20]])).unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Arbitrary bytes never panic: they are refused or, if they happen to decode into a message for
    /// this node from the sender, stepped.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let (backend, service) = service();
        let result = send(&service, batch(2, vec![bytes]));
        let stepped = backend.stepped.lock().unwrap().len();
        match result {
            Ok(()) => prop_assert_eq!(stepped, 1),
            Err(status) => {
                prop_assert_eq!(status.code(), Code::InvalidArgument);
                prop_assert_eq!(stepped, 0);
            }
        }
    }

    /// Every single-byte change of a valid message is stepped or refused as invalid, never panics.
    #[test]
    fn mutated_messages_never_panic(position in 0usize..64, value in any::<u8>()) {
        let (backend, service) = service();
        let mut bytes = encoded(&message(2, 1));
        let position = position % bytes.len();
        bytes[position] = value;
        let result = send(&service, batch(2, vec![bytes]));
        let stepped = backend.stepped.lock().unwrap().len();
        match result {
            Ok(()) => prop_assert_eq!(stepped, 1),
            Err(status) => {
                prop_assert_eq!(status.code(), Code::InvalidArgument);
                prop_assert_eq!(stepped, 0);
            }
        }
    }
}

/// Serves `config` (node 1) over `backend` on a free port with the real server; returns its address
/// and the sender that stops it.
async fn serve(
    config: ServerConfig,
    backend: Arc<FakeBackend>,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        onekv_server::serve_backend(listener, &config, backend, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    (address, stop)
}

/// A one-message batch from node 2 to node 1, carrying `secret` (raw metadata text) if given.
fn call(secret: Option<&str>, payload: usize) -> Request<PeerMessages> {
    let mut big = message(2, 1);
    big.entries[0].data = vec![9u8; payload].into();
    let mut request = Request::new(batch(2, vec![encoded(&big)]));
    if let Some(secret) = secret {
        request.metadata_mut().insert(PEER_SECRET_METADATA, secret.parse().unwrap());
    }
    request
}

fn secret_text(secret: &PeerSecret) -> String {
    secret.metadata_value().to_str().unwrap().to_string()
}

/// Without the cluster secret, or with another one, a call is refused (UNAUTHENTICATED) and nothing
/// reaches the replica, even a well-formed message from a member; with it, the message is stepped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_calls_need_the_cluster_secret() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let dir = tempfile::tempdir().unwrap();
        let mut config = common::three_node_config(&dir.path().join("data"));
        let secret = common::with_secret_file(&mut config, dir.path());
        let backend = Arc::new(FakeBackend::default());
        let (address, _stop) = serve(config, Arc::clone(&backend)).await;
        let mut peer = PeerClient::connect(format!("http://{address}")).await.unwrap();

        let other = secret_text(&PeerSecret::generate());
        let right = secret_text(&secret);
        let truncated = &right[..right.len() - 1];
        for (what, presented) in
            [("no secret", None), ("another secret", Some(other.as_str())), ("a prefix", Some(truncated))]
        {
            let status = peer.send(call(presented, 3)).await.unwrap_err();
            assert_eq!(status.code(), Code::Unauthenticated, "{what}: {status:?}");
            // Refused from the headers: a body over the message limit is not even read.
            let status = peer.send(call(presented, 8 << 20)).await.unwrap_err();
            assert_eq!(status.code(), Code::Unauthenticated, "{what}, large: {status:?}");
        }
        assert!(backend.calls().is_empty(), "nothing reached the replica: {:?}", backend.calls());

        peer.send(call(Some(&right), 3)).await.expect("the right secret is accepted");
        assert_eq!(backend.stepped.lock().unwrap().len(), 1);
        // Upper-case hex is the same secret to the file parser, but the wire form is exact.
        let status = peer.send(call(Some(&right.to_uppercase()), 3)).await.unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated);
    })
    .await
    .unwrap();
}

/// A node without a secret (a single member: validation requires one otherwise) accepts no peer
/// call at all, whatever it carries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_secret_no_peer_call_is_accepted() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let config = ServerConfig {
            node_id: 1,
            listen: "127.0.0.1:7001".into(),
            data_dir: "/unused".into(),
            members: vec![MemberConfig { id: 1, address: "127.0.0.1:7001".into() }],
            ..ServerConfig::default()
        };
        config.validate().expect("a single member needs no secret");
        let backend = Arc::new(FakeBackend::default());
        let (address, _stop) = serve(config, Arc::clone(&backend)).await;
        let mut peer = PeerClient::connect(format!("http://{address}")).await.unwrap();
        // Even a message "from" this node itself, which the member check would let through.
        let mut request = Request::new(batch(1, vec![encoded(&message(1, 1))]));
        request
            .metadata_mut()
            .insert(PEER_SECRET_METADATA, secret_text(&PeerSecret::generate()).parse().unwrap());
        let status = peer.send(request).await.unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
        assert!(status.message().contains("no peer secret"), "{}", status.message());
        assert!(backend.calls().is_empty());
    })
    .await
    .unwrap();
}

#[test]
fn the_peer_message_limit_is_what_a_snapshot_needs() {
    let limit = onekv_server::peer::MAX_PEER_MESSAGE_BYTES;
    assert!(limit > onekv_replica::MAX_SNAPSHOT_BYTES);
    assert!(limit <= onekv_replica::MAX_SNAPSHOT_BYTES + (1 << 20), "was 256 MiB for a 200 MiB snapshot");
}

/// A `Peer` server whose calls each wait at a gate, reporting when they start (after decoding).
struct GatedPeer {
    gate: Arc<Semaphore>,
    started: mpsc::UnboundedSender<()>,
}

#[tonic::async_trait]
impl Peer for GatedPeer {
    async fn send(&self, _request: Request<PeerMessages>) -> Result<Response<PeerAck>, Status> {
        let _ = self.started.send(());
        self.gate.acquire().await.unwrap().forget();
        Ok(Response::new(PeerAck {}))
    }

    async fn snapshot_chunk(
        &self,
        _request: Request<onekv_proto::SnapshotChunkRequest>,
    ) -> Result<Response<onekv_proto::SnapshotChunkReply>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

/// Serves a gated `Peer` server behind `admission`; returns a client, the gate and the starts.
async fn gated(
    admission: Admission,
) -> (PeerClient<tonic::transport::Channel>, Arc<Semaphore>, mpsc::UnboundedReceiver<()>, Arc<Admission>) {
    let gate = Arc::new(Semaphore::new(0));
    let (started, starts) = mpsc::unbounded_channel();
    let served = Admitted::new(PeerServer::new(GatedPeer { gate: Arc::clone(&gate), started }), admission);
    let counts = Arc::clone(served.admission());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(served)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let peer = PeerClient::connect(format!("http://{address}")).await.unwrap();
    (peer, gate, starts, counts)
}

fn too_large(length: usize) -> Status {
    Status::invalid_argument(format!("{length} bytes"))
}

/// The admission the `Peer` service is served behind: with a bound of 2, of five concurrent calls
/// two are decoded and handled, and the others are refused at once (UNAVAILABLE, naming the bound)
/// without being read, rather than queued behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_calls_beyond_the_bound_are_refused_not_decoded() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let admission = Admission::new(
            2,
            "limits.max_concurrent_peer_calls",
            onekv_server::peer::MAX_PEER_MESSAGE_BYTES,
            too_large,
        );
        let (peer, gate, mut starts, counts) = gated(admission).await;
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..5 {
            let mut peer = peer.clone();
            calls.spawn(async move { peer.send(call(None, 1 << 20)).await });
        }
        for _ in 0..2 {
            tokio::time::timeout(Duration::from_secs(5), starts.recv())
                .await
                .expect("a call starts")
                .unwrap();
        }
        // While those two wait in the handler, the other three are answered: refused at once.
        for _ in 0..3 {
            let refused = tokio::time::timeout(Duration::from_secs(10), calls.join_next())
                .await
                .expect("a call beyond the bound is answered while two are in flight")
                .expect("a call")
                .unwrap();
            let status = refused.expect_err("beyond the bound");
            assert_eq!(status.code(), Code::Unavailable, "{status:?}");
            let message = status.message();
            assert!(message.contains("limits.max_concurrent_peer_calls = 2"), "{message}");
        }
        assert_eq!(counts.max_concurrent(), 2);
        assert_eq!(counts.in_flight(), 2);
        gate.add_permits(2);
        while let Some(handled) = calls.join_next().await {
            handled.unwrap().expect("an admitted call is handled");
        }
        assert!(starts.try_recv().is_err(), "no refused call reached the handler");
        assert_eq!(counts.in_flight(), 0);
        // Once the permits are back, calls get in again.
        gate.add_permits(1);
        peer.clone().send(call(None, 10)).await.expect("a call after the others finished");
    })
    .await
    .unwrap();
}

/// With a bytes budget, a large message in flight leaves room for small ones, but not for another
/// message that would overflow the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_message_bytes_in_flight_are_bounded() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let admission = Admission::new(16, "limits.max_concurrent_peer_calls", 3 << 20, too_large)
            .with_bytes_budget(5 << 20);
        let (peer, gate, mut starts, counts) = gated(admission).await;
        let big = tokio::spawn({
            let mut peer = peer.clone();
            async move { peer.send(call(None, 5 << 19)).await }
        });
        tokio::time::timeout(Duration::from_secs(5), starts.recv())
            .await
            .expect("the big call starts")
            .unwrap();
        assert!(counts.bytes_in_flight() >= 5 << 19);
        let status = peer.clone().send(call(None, 5 << 19)).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "a second big one does not fit: {status:?}");
        let status = peer.clone().send(call(None, 7 << 19)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "over the largest message: {status:?}");
        let small = tokio::spawn({
            let mut peer = peer.clone();
            async move { peer.send(call(None, 100)).await }
        });
        tokio::time::timeout(Duration::from_secs(5), starts.recv()).await.expect("a small one fits").unwrap();
        gate.add_permits(2);
        big.await.unwrap().unwrap();
        small.await.unwrap().unwrap();
        assert_eq!(counts.bytes_in_flight(), 0);
    })
    .await
    .unwrap();
}
