//! The peer transport against fake `Peer` servers on 127.0.0.1: batching, dropping when a peer's
//! queue is full, never blocking the caller, reconnecting, and delivery through the real `Peer`
//! service.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use onekv_proto::{
    PeerAck, PeerMessages,
    peer_server::{Peer, PeerServer},
};
use onekv_replica::{Message, Transport};
use onekv_server::{GrpcTransport, PeerService, TransportOptions, TransportStats};
use protobuf::Message as _;
use raft::eraftpb::{Entry, MessageType};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// Every test finishes well within this.
const TEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A `Peer` server that records each call's batch and answers only when the test allows.
struct FakePeer {
    /// One permit per call allowed to complete.
    gate: Arc<Semaphore>,
    /// Each call's decoded messages, sent as the call arrives (before waiting at the gate).
    calls: mpsc::UnboundedSender<(u64, Vec<Message>)>,
}

#[tonic::async_trait]
impl Peer for FakePeer {
    async fn send(&self, request: Request<PeerMessages>) -> Result<Response<PeerAck>, Status> {
        let batch = request.into_inner();
        let messages = batch.messages.iter().map(|bytes| Message::parse_from_bytes(bytes).unwrap()).collect();
        let _ = self.calls.send((batch.from, messages));
        self.gate.acquire().await.unwrap().forget();
        Ok(Response::new(PeerAck {}))
    }

    /// Answers with the request's fields in the pairs, and a cursor after the key "next"; asked
    /// for any view, names one at the next index, of term 3, with voters 1 and 2.
    async fn snapshot_chunk(
        &self,
        request: Request<onekv_proto::SnapshotChunkRequest>,
    ) -> Result<Response<onekv_proto::SnapshotChunkReply>, Status> {
        let r = request.into_inner();
        let view = match r.any_view {
            true => {
                let mut view =
                    raft::eraftpb::SnapshotMetadata { index: r.index + 1, term: 3, ..Default::default() };
                view.mut_conf_state().voters = vec![1, 2];
                view.write_to_bytes().unwrap()
            }
            false => Vec::new(),
        };
        Ok(Response::new(onekv_proto::SnapshotChunkReply {
            pairs: format!(
                "from {} shard {} index {} cursor {} max {} references {}",
                r.from, r.shard, r.index, r.cursor, r.max_bytes, r.references
            )
            .into_bytes(),
            more: true,
            next_cursor: 1,
            next_after_key: b"next".to_vec(),
            next_window_pair: 0,
            view,
        }))
    }
}

struct FakePeerHandle {
    address: String,
    gate: Arc<Semaphore>,
    calls: mpsc::UnboundedReceiver<(u64, Vec<Message>)>,
}

impl FakePeerHandle {
    async fn next_call(&mut self) -> (u64, Vec<Message>) {
        tokio::time::timeout(Duration::from_secs(10), self.calls.recv())
            .await
            .expect("a call arrives in time")
            .expect("the server is running")
    }

    /// Asserts no call arrives for a while.
    async fn assert_no_call(&mut self, wait: Duration) {
        if let Ok(call) = tokio::time::timeout(wait, self.calls.recv()).await {
            panic!("unexpected call: {call:?}");
        }
    }
}

async fn start_fake_peer_on(listener: TcpListener, open: bool) -> FakePeerHandle {
    let address = listener.local_addr().unwrap().to_string();
    let gate = Arc::new(Semaphore::new(if open { Semaphore::MAX_PERMITS } else { 0 }));
    let (calls, receiver) = mpsc::unbounded_channel();
    let service = FakePeer { gate: Arc::clone(&gate), calls };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PeerServer::new(service).max_decoding_message_size(256 << 20))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    FakePeerHandle { address, gate, calls: receiver }
}

async fn start_fake_peer(open: bool) -> FakePeerHandle {
    start_fake_peer_on(TcpListener::bind("127.0.0.1:0").await.unwrap(), open).await
}

fn heartbeat(to: u64, commit: u64) -> Message {
    let mut message = Message::default();
    message.set_msg_type(MessageType::MsgHeartbeat);
    message.from = 1;
    message.to = to;
    message.commit = commit;
    message
}

fn fast_options() -> TransportOptions {
    TransportOptions {
        connect_timeout: Duration::from_millis(500),
        call_timeout: Duration::from_secs(20),
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(100),
        ..TransportOptions::default()
    }
}

async fn wait_for(
    transport: &GrpcTransport,
    what: &str,
    done: impl Fn(&TransportStats) -> bool,
) -> TransportStats {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = transport.stats();
        if done(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {stats:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn commits(messages: &[Message]) -> Vec<u64> {
    messages.iter().map(|message| message.commit).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_messages_go_out_in_one_batch_in_order() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let mut peer = start_fake_peer(false).await;
        let transport = GrpcTransport::start(1, [(2, peer.address.clone())], fast_options());

        transport.send(1, vec![heartbeat(2, 0)]);
        // The first call is held at the server, so the next messages queue behind it.
        let (from, first) = peer.next_call().await;
        assert_eq!((from, commits(&first)), (1, vec![0]));
        transport.send(1, (1..=5).map(|commit| heartbeat(2, commit)).collect());
        transport.send(1, (6..=9).map(|commit| heartbeat(2, commit)).collect());
        peer.gate.add_permits(1);

        let (_, second) = peer.next_call().await;
        assert_eq!(commits(&second), (1..=9).collect::<Vec<_>>(), "one batch, in order");
        peer.gate.add_permits(1);
        let stats = wait_for(&transport, "two batches", |s| s.sent_batches == 2).await;
        assert_eq!(stats.sent_messages, 10);
        assert_eq!(stats.dropped_queue_full + stats.dropped_send_failed, 0);
        transport.close();
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_bounded_by_the_message_limit() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let mut peer = start_fake_peer(false).await;
        let options = TransportOptions { batch_messages: 4, ..fast_options() };
        let transport = GrpcTransport::start(1, [(2, peer.address.clone())], options);
        transport.send(1, vec![heartbeat(2, 0)]);
        peer.next_call().await;
        transport.send(1, (1..=10).map(|commit| heartbeat(2, commit)).collect());
        peer.gate.add_permits(100);
        let mut seen = Vec::new();
        while seen.len() < 10 {
            let (_, batch) = peer.next_call().await;
            assert!(batch.len() <= 4, "batch of {}", batch.len());
            seen.extend(commits(&batch));
        }
        assert_eq!(seen, (1..=10).collect::<Vec<_>>());
        transport.close();
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_drops_without_blocking() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let mut peer = start_fake_peer(false).await;
        let options = TransportOptions { queue_messages: 4, ..fast_options() };
        let transport = GrpcTransport::start(1, [(2, peer.address.clone())], options);
        transport.send(1, vec![heartbeat(2, 0)]);
        peer.next_call().await; // in flight, held: the queue is now empty

        let started = Instant::now();
        transport.send(1, (1..=100).map(|commit| heartbeat(2, commit)).collect());
        assert!(started.elapsed() < Duration::from_millis(500), "send blocked for {:?}", started.elapsed());
        let stats = transport.stats();
        assert_eq!(stats.dropped_queue_full, 96, "4 fit in the queue: {stats:?}");

        peer.gate.add_permits(100);
        let (_, batch) = peer.next_call().await;
        assert_eq!(commits(&batch), vec![1, 2, 3, 4], "the oldest queued messages survive");
        wait_for(&transport, "both calls acknowledged", |s| s.sent_messages == 5).await;

        // Once the queue drains, messages flow again.
        transport.send(1, vec![heartbeat(2, 200)]);
        let (_, batch) = peer.next_call().await;
        assert_eq!(commits(&batch), vec![200]);
        transport.close();
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_is_bounded_by_bytes_too() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let mut peer = start_fake_peer(false).await;
        let options = TransportOptions { queue_bytes: 1 << 20, ..fast_options() };
        let transport = GrpcTransport::start(1, [(2, peer.address.clone())], options);
        transport.send(1, vec![heartbeat(2, 0)]);
        peer.next_call().await;
        let big = |commit| {
            let mut message = heartbeat(2, commit);
            message.entries.push(Entry { data: vec![0u8; 400 << 10].into(), ..Entry::default() });
            message
        };
        // 400 KiB each into a 1 MiB budget: two fit, the rest are dropped. A message alone larger
        // than the budget still goes when the queue is empty (checked below).
        transport.send(1, (1..=5).map(big).collect());
        assert_eq!(transport.stats().dropped_queue_full, 3);
        peer.gate.add_permits(100);
        let (_, batch) = peer.next_call().await;
        assert_eq!(commits(&batch), vec![1, 2]);
        wait_for(&transport, "delivered", |s| s.sent_messages == 3).await;

        // Many messages dequeued as soon as they are queued: the byte count must come back to zero
        // (a send racing with the task once leaked its count and later refused the large message).
        for commit in 100..300 {
            transport.send(1, vec![heartbeat(2, commit)]);
            if commit % 10 == 0 {
                tokio::task::yield_now().await;
            }
        }
        wait_for(&transport, "small ones delivered", |s| s.sent_messages == 203).await;
        while peer.calls.try_recv().is_ok() {}

        let mut huge = heartbeat(2, 99);
        huge.entries.push(Entry { data: vec![0u8; 3 << 20].into(), ..Entry::default() });
        transport.send(1, vec![huge]);
        let (_, batch) = peer.next_call().await;
        assert_eq!(batch[0].entries[0].data.len(), 3 << 20);
        transport.close();
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_peers_are_dropped_and_peers_are_independent() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let mut two = start_fake_peer(true).await;
        let mut three = start_fake_peer(true).await;
        let peers = [(1, "127.0.0.1:1".to_string()), (2, two.address.clone()), (3, three.address.clone())];
        let transport = GrpcTransport::start(1, peers, fast_options());
        transport.send(1, vec![heartbeat(2, 1), heartbeat(9, 1), heartbeat(3, 2), heartbeat(1, 3)]);
        assert_eq!(transport.stats().dropped_unknown_peer, 2, "node 9, and this node itself");
        assert_eq!(commits(&two.next_call().await.1), vec![1]);
        assert_eq!(commits(&three.next_call().await.1), vec![2]);
        transport.close();
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_peer_is_retried_until_it_comes_up() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        // Reserve a port, then free it: nothing listens there for now.
        let reserved = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = reserved.local_addr().unwrap();
        drop(reserved);
        let transport = GrpcTransport::start(1, [(2, address.to_string())], fast_options());

        let started = Instant::now();
        transport.send(1, vec![heartbeat(2, 1)]);
        assert!(started.elapsed() < Duration::from_millis(100), "send must not wait for a connection");
        wait_for(&transport, "a failed attempt", |s| s.dropped_send_failed >= 1).await;

        // The peer comes up; keep sending (as Raft's heartbeats would) until one gets through.
        let mut peer = start_fake_peer_on(TcpListener::bind(address).await.unwrap(), true).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut commit = 2;
        let delivered = loop {
            transport.send(1, vec![heartbeat(2, commit)]);
            if let Ok(Some((_, batch))) =
                tokio::time::timeout(Duration::from_millis(100), peer.calls.recv()).await
            {
                break batch;
            }
            assert!(Instant::now() < deadline, "never reconnected: {:?}", transport.stats());
            commit += 1;
        };
        assert!(delivered.iter().all(|message| message.commit >= 2), "the dropped message is not resent");
        transport.close();
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_stops_delivery() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let mut peer = start_fake_peer(true).await;
        let transport = GrpcTransport::start(1, [(2, peer.address.clone())], fast_options());
        transport.send(1, vec![heartbeat(2, 1)]);
        peer.next_call().await;
        transport.close();
        tokio::time::sleep(Duration::from_millis(50)).await;
        transport.send(1, vec![heartbeat(2, 2)]);
        peer.assert_no_call(Duration::from_millis(300)).await;
    })
    .await
    .unwrap();
}

/// The transport and the real `Peer` service agree: messages arrive decoded and checked, carrying
/// the cluster secret; a transport with another secret (or none) gets nothing through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_reach_the_peer_service() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let backend = Arc::new(common::FakeBackend::default());
        // The receiving side is node 2 of a three-node cluster.
        let mut config = common::three_node_config(std::path::Path::new("/unused"));
        config.node_id = 2;
        config.members[1].address = address.to_string();
        let secret = onekv_server::PeerSecret::generate();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(
                    PeerService::new(Arc::clone(&backend), &config)
                        .with_secret(Some(secret.clone()))
                        .into_server(),
                )
                .serve_with_incoming(TcpIncoming::from(listener)),
        );
        for wrong in [None, Some(onekv_server::PeerSecret::generate())] {
            let options = TransportOptions { secret: wrong, ..fast_options() };
            let outsider = GrpcTransport::start(1, [(2, address.to_string())], options);
            outsider.send(1, vec![heartbeat(2, 0)]);
            wait_for(&outsider, "refusal", |s| s.dropped_send_failed == 1).await;
            outsider.close();
        }
        assert!(backend.stepped.lock().unwrap().is_empty(), "no message without the secret got through");
        let with_secret = || TransportOptions { secret: Some(secret.clone()), ..fast_options() };
        let transport = GrpcTransport::start(1, [(2, address.to_string())], with_secret());
        let mut snapshot = heartbeat(2, 1);
        snapshot.set_msg_type(MessageType::MsgSnapshot);
        snapshot.mut_snapshot().data = vec![5u8; 20 << 20].into();
        transport.send(1, vec![heartbeat(2, 0), snapshot]);
        wait_for(&transport, "delivery", |s| s.sent_messages == 2).await;
        {
            let stepped = backend.stepped.lock().unwrap();
            assert_eq!(stepped.len(), 2);
            assert_eq!(stepped[1].get_snapshot().data.len(), 20 << 20, "a 20 MiB snapshot fits");
        }

        // A message the service refuses (addressed to node 3) is counted as failed, not retried.
        let mut wrong = heartbeat(2, 7);
        wrong.to = 3;
        let misrouted = GrpcTransport::start(1, [(3, address.to_string())], with_secret());
        misrouted.send(1, vec![wrong]);
        wait_for(&misrouted, "refusal", |s| s.dropped_send_failed == 1).await;
        assert_eq!(backend.stepped.lock().unwrap().len(), 2);
        transport.close();
        misrouted.close();
    })
    .await
    .unwrap();
}

/// A snapshot fetch thread asks a peer for a chunk through the transport: the request and the
/// answer's cursor survive the wire, and an unknown peer is an error, not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_chunks_are_fetched_from_a_thread_outside_the_runtime() {
    use onekv_replica::{ChunkCursor, ChunkRequest};
    let peer = start_fake_peer(true).await;
    let transport = Arc::new(GrpcTransport::start(1, [(2, peer.address.clone())], fast_options()));
    let request = ChunkRequest {
        from: 1,
        shard: 7,
        index: 42,
        any_view: false,
        references: true,
        cursor: ChunkCursor::AfterKey(b"k".to_vec()),
        max_bytes: 4096,
    };
    let any_view = ChunkRequest { any_view: true, cursor: ChunkCursor::Start, ..request.clone() };
    let fetched = {
        let transport = Arc::clone(&transport);
        let request = request.clone();
        std::thread::spawn(move || {
            (
                transport.fetch_snapshot_chunk(2, &request),
                transport.fetch_snapshot_chunk(9, &request),
                transport.fetch_snapshot_chunk(2, &any_view),
            )
        })
    };
    let (chunk, unknown, viewed) =
        tokio::task::spawn_blocking(move || fetched.join().unwrap()).await.unwrap();
    let chunk = chunk.unwrap();
    assert_eq!(chunk.pairs, b"from 1 shard 7 index 42 cursor 1 max 4096 references true");
    assert_eq!(chunk.next, Some(ChunkCursor::AfterKey(b"next".to_vec())));
    assert_eq!(chunk.view, None);
    assert!(unknown.unwrap_err().contains("node 9"));
    // A request for any view says so, and the view named in the answer arrives whole.
    let view = viewed.unwrap().view.expect("a view");
    assert_eq!((view.index, view.term, view.get_conf_state().voters.clone()), (43, 3, vec![1, 2]));
}
