//! The peer transport: carries the node's outgoing Raft messages, of every shard, to other members
//! over gRPC (one queue and one connection per peer, whatever the number of shards).
//!
//! Owns, per peer, a bounded queue and one Tokio task that drains it: queued messages are encoded
//! and sent together as one `PeerMessages` call, the connection is made lazily and remade after a
//! failure with exponential backoff. [`GrpcTransport::send`] is called on the replica's loop thread
//! and never blocks: when a peer's queue is full (by count or by bytes) or the peer is unknown, the
//! message is dropped and counted, because Raft retransmits whatever matters. Does not own
//! receiving (that is [`crate::peer`]) nor any ordering or delivery guarantee beyond "in order, at
//! most once, per peer". Every call carries the cluster secret ([`crate::auth`]) when the node has
//! one.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use onekv_proto::{PeerMessages, peer_client::PeerClient};
use onekv_replica::{ChunkRequest, Message, SnapshotChunk, Transport};
use protobuf::Message as _;
use tokio::sync::{mpsc, watch};
use tonic::transport::{Channel, Endpoint};

use crate::auth::{PEER_SECRET_METADATA, PeerSecret};
use crate::peer::MAX_PEER_MESSAGE_BYTES;

/// Tuning of the transport; [`TransportOptions::default`] suits a cluster on one network.
#[derive(Clone, Debug)]
pub struct TransportOptions {
    /// Most messages queued for one peer.
    pub queue_messages: usize,
    /// Most bytes (estimated from entry and snapshot payloads) queued for one peer. A message larger
    /// than this is still queued when the queue is empty, so one big snapshot can always go.
    pub queue_bytes: usize,
    /// Most messages in one `PeerMessages` call.
    pub batch_messages: usize,
    /// A batch stops growing once it holds this many encoded bytes.
    pub batch_bytes: usize,
    /// How long connecting to a peer may take.
    pub connect_timeout: Duration,
    /// How long one call may take; long enough for a large snapshot.
    pub call_timeout: Duration,
    /// First wait after a failure; doubles per consecutive failure up to `backoff_max`.
    pub backoff_min: Duration,
    /// Longest wait between attempts.
    pub backoff_max: Duration,
    /// The cluster secret sent with every call (`None`: sent without, and refused by any peer).
    pub secret: Option<PeerSecret>,
}

impl Default for TransportOptions {
    fn default() -> Self {
        TransportOptions {
            queue_messages: 4096,
            queue_bytes: 64 << 20,
            batch_messages: 1024,
            batch_bytes: 8 << 20,
            connect_timeout: Duration::from_secs(2),
            call_timeout: Duration::from_secs(30),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
            secret: None,
        }
    }
}

/// Counters of what the transport did with the messages it was given, over all peers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Messages a peer acknowledged.
    pub sent_messages: u64,
    /// Their encoded bytes.
    pub sent_bytes: u64,
    /// `PeerMessages` calls a peer acknowledged.
    pub sent_batches: u64,
    /// Messages dropped because their peer's queue was full.
    pub dropped_queue_full: u64,
    /// Messages dropped because they were addressed to no known peer.
    pub dropped_unknown_peer: u64,
    /// Messages dropped because connecting or the call failed.
    pub dropped_send_failed: u64,
    /// Messages dropped because even alone they exceed the peer message size limit.
    pub dropped_too_large: u64,
}

#[derive(Default)]
struct Counters {
    sent_messages: AtomicU64,
    sent_bytes: AtomicU64,
    sent_batches: AtomicU64,
    dropped_queue_full: AtomicU64,
    dropped_unknown_peer: AtomicU64,
    dropped_send_failed: AtomicU64,
    dropped_too_large: AtomicU64,
}

/// The sending side of one peer's queue.
struct PeerQueue {
    sender: mpsc::Sender<(u64, Message)>,
    /// Where the peer is reached (a changed address gets a new queue).
    address: String,
    /// Estimated bytes queued; added by `send`, subtracted by the peer's task.
    queued_bytes: Arc<AtomicUsize>,
    /// Set when a full queue was reported, so a down peer logs once rather than per message.
    full_reported: Arc<AtomicBool>,
    /// A connection of its own for snapshot chunk calls (made on first use), so a chunk in
    /// flight never holds up the Raft messages.
    chunks: Option<Channel>,
}

/// A [`Transport`] over gRPC: one queue and one task per peer. Create it inside a Tokio runtime.
pub struct GrpcTransport {
    node_id: u64,
    peers: RwLock<HashMap<u64, PeerQueue>>,
    /// Nodes outside the member list that messages were dropped for, each logged once.
    unknown_reported: Mutex<HashSet<u64>>,
    options: TransportOptions,
    counters: Arc<Counters>,
    closed: watch::Sender<bool>,
    /// The runtime the peer tasks run on; snapshot fetch threads block on it for their calls.
    runtime: tokio::runtime::Handle,
}

impl GrpcTransport {
    /// Starts a task per peer (`(id, "host:port")`; this node's own entry, if present, is skipped).
    /// Nothing connects until there is something to send.
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn start(
        node_id: u64,
        peers: impl IntoIterator<Item = (u64, String)>,
        options: TransportOptions,
    ) -> GrpcTransport {
        let (closed, _) = watch::channel(false);
        let transport = GrpcTransport {
            node_id,
            peers: RwLock::new(HashMap::new()),
            unknown_reported: Mutex::new(HashSet::new()),
            options,
            counters: Arc::new(Counters::default()),
            closed,
            runtime: tokio::runtime::Handle::current(),
        };
        transport.set_peers(peers);
        transport
    }

    /// Makes `peers` the node's peers (the member list changed): a new peer, or one whose address
    /// changed, gets a fresh queue and task; a peer no longer listed has its queue dropped (its
    /// task ends, and messages queued for it are lost, as on any failure); the others keep theirs.
    pub fn set_peers(&self, peers: impl IntoIterator<Item = (u64, String)>) {
        let mut queues = self.peers.write().unwrap_or_else(|e| e.into_inner());
        let mut unknown_reported = self.unknown_reported.lock().unwrap_or_else(|e| e.into_inner());
        let mut kept = HashMap::new();
        for (peer_id, address) in peers {
            if peer_id == self.node_id {
                continue;
            }
            // Should it leave the list again, that is worth a line again.
            unknown_reported.remove(&peer_id);
            let queue = match queues.remove(&peer_id) {
                Some(queue) if queue.address == address => queue,
                _ => self.spawn_peer(peer_id, address),
            };
            kept.insert(peer_id, queue);
        }
        *queues = kept;
    }

    /// A queue for `peer_id` at `address`, and the task that drains it.
    fn spawn_peer(&self, peer_id: u64, address: String) -> PeerQueue {
        let options = &self.options;
        let (sender, receiver) = mpsc::channel(options.queue_messages.max(1));
        let chunks = Endpoint::from_shared(format!("http://{address}")).ok().map(|endpoint| {
            endpoint
                .connect_timeout(options.connect_timeout)
                .timeout(options.call_timeout)
                .tcp_nodelay(true)
                .connect_lazy()
        });
        let queue = PeerQueue {
            sender,
            address: address.clone(),
            queued_bytes: Arc::new(AtomicUsize::new(0)),
            full_reported: Arc::new(AtomicBool::new(false)),
            chunks,
        };
        let task = PeerTask {
            node_id: self.node_id,
            peer_id,
            address,
            receiver,
            queued_bytes: Arc::clone(&queue.queued_bytes),
            full_reported: Arc::clone(&queue.full_reported),
            options: options.clone(),
            counters: Arc::clone(&self.counters),
            closed: self.closed.subscribe(),
        };
        self.runtime.spawn(task.run());
        queue
    }

    /// What the transport has done so far.
    pub fn stats(&self) -> TransportStats {
        let c = &self.counters;
        TransportStats {
            sent_messages: c.sent_messages.load(Ordering::Relaxed),
            sent_bytes: c.sent_bytes.load(Ordering::Relaxed),
            sent_batches: c.sent_batches.load(Ordering::Relaxed),
            dropped_queue_full: c.dropped_queue_full.load(Ordering::Relaxed),
            dropped_unknown_peer: c.dropped_unknown_peer.load(Ordering::Relaxed),
            dropped_send_failed: c.dropped_send_failed.load(Ordering::Relaxed),
            dropped_too_large: c.dropped_too_large.load(Ordering::Relaxed),
        }
    }

    /// Stops every peer task; later messages are dropped. Queued messages are not delivered.
    pub fn close(&self) {
        self.closed.send_replace(true);
    }
}

impl Transport for GrpcTransport {
    fn bytes_sent(&self) -> u64 {
        self.counters.sent_bytes.load(Ordering::Relaxed)
    }

    fn fetch_snapshot_chunk(&self, to: u64, request: &ChunkRequest) -> Result<SnapshotChunk, String> {
        if *self.closed.borrow() {
            return Err("the transport is closed".into());
        }
        self.runtime.block_on(self.snapshot_chunk(to, request))
    }

    fn send(&self, shard: u64, messages: Vec<Message>) {
        let peers = self.peers.read().unwrap_or_else(|e| e.into_inner());
        for message in messages {
            let Some(queue) = peers.get(&message.to) else {
                self.counters.dropped_unknown_peer.fetch_add(1, Ordering::Relaxed);
                // Once per node: a replica that still knows a removed member would log per message.
                if self.unknown_reported.lock().unwrap_or_else(|e| e.into_inner()).insert(message.to) {
                    tracing::warn!(
                        from = self.node_id,
                        to = message.to,
                        "dropping Raft messages to a node that is not in the member list"
                    );
                }
                continue;
            };
            let size = estimated_size(&message);
            // Counted before the message is queued, so the task's subtraction (after it dequeues
            // the message) can never come first and leave the count too high for good.
            let queued = queue.queued_bytes.fetch_add(size, Ordering::Relaxed);
            let over_bytes = queued > 0 && queued.saturating_add(size) > self.options.queue_bytes;
            let accepted = !over_bytes && queue.sender.try_send((shard, message)).is_ok();
            if !accepted {
                queue.queued_bytes.fetch_sub(size, Ordering::Relaxed);
                self.counters.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
                if !queue.full_reported.swap(true, Ordering::Relaxed) {
                    tracing::debug!(from = self.node_id, "a peer's send queue is full; dropping messages");
                }
            }
        }
    }
}

impl GrpcTransport {
    /// One `SnapshotChunk` call to `to`, bounded by the call timeout.
    async fn snapshot_chunk(&self, to: u64, request: &ChunkRequest) -> Result<SnapshotChunk, String> {
        let channel = self
            .peers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&to)
            .and_then(|peer| peer.chunks.clone())
            .ok_or_else(|| format!("node {to} is not a peer with a valid address"))?;
        let mut client = PeerClient::new(channel)
            .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES)
            .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES);
        let mut call = tonic::Request::new(crate::peer::chunk_request_to_wire(request));
        if let Some(secret) = &self.options.secret {
            call.metadata_mut().insert(PEER_SECRET_METADATA, secret.metadata_value());
        }
        let reply = tokio::time::timeout(self.options.call_timeout, client.snapshot_chunk(call))
            .await
            .map_err(|_| {
                format!(
                    "node {to} did not answer a snapshot chunk call within {:?}",
                    self.options.call_timeout
                )
            })?
            .map_err(|status| format!("node {to}: {status}"))?;
        crate::peer::chunk_from_wire(reply.into_inner())
    }
}

/// A cheap estimate of a message's encoded size: its payloads plus a fixed allowance, so `send`
/// need not walk or encode the message on the replica's loop thread.
fn estimated_size(message: &Message) -> usize {
    const FIXED: usize = 64;
    let entries: usize =
        message.entries.iter().map(|entry| FIXED + entry.data.len() + entry.context.len()).sum();
    let snapshot = if message.has_snapshot() { message.get_snapshot().data.len() } else { 0 };
    FIXED + entries + snapshot + message.context.len()
}

/// The task that drains one peer's queue.
struct PeerTask {
    node_id: u64,
    peer_id: u64,
    address: String,
    receiver: mpsc::Receiver<(u64, Message)>,
    queued_bytes: Arc<AtomicUsize>,
    full_reported: Arc<AtomicBool>,
    options: TransportOptions,
    counters: Arc<Counters>,
    closed: watch::Receiver<bool>,
}

/// Room left in a `PeerMessages` call for its framing.
const BATCH_FRAMING_BYTES: usize = 64 << 10;

impl PeerTask {
    async fn run(mut self) {
        let endpoint = match Endpoint::from_shared(format!("http://{}", self.address)) {
            Ok(endpoint) => endpoint
                .connect_timeout(self.options.connect_timeout)
                .timeout(self.options.call_timeout)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(10)),
            Err(error) => {
                // Configuration validation makes this unreachable; if not, drain so `send` stays
                // cheap, and say why nothing reaches the peer.
                tracing::error!(peer = self.peer_id, address = %self.address, %error, "invalid peer address");
                while let Some(batch) = self.next_batch(&mut None).await {
                    self.counters.dropped_send_failed.fetch_add(batch.len() as u64, Ordering::Relaxed);
                }
                return;
            }
        };
        let mut client: Option<PeerClient<Channel>> = None;
        let mut carried: Option<(u64, Vec<u8>)> = None;
        let mut backoff = self.options.backoff_min;
        let mut failing = false;
        while let Some(batch) = self.next_batch(&mut carried).await {
            let count = batch.len() as u64;
            let bytes: u64 = batch.iter().map(|(_, encoded)| encoded.len() as u64).sum();
            let Err(error) = self.deliver(&endpoint, &mut client, batch).await else {
                self.counters.sent_messages.fetch_add(count, Ordering::Relaxed);
                self.counters.sent_bytes.fetch_add(bytes, Ordering::Relaxed);
                self.counters.sent_batches.fetch_add(1, Ordering::Relaxed);
                self.full_reported.store(false, Ordering::Relaxed);
                if failing {
                    tracing::info!(peer = self.peer_id, address = %self.address, "reached peer again");
                    failing = false;
                }
                backoff = self.options.backoff_min;
                continue;
            };
            self.counters.dropped_send_failed.fetch_add(count, Ordering::Relaxed);
            if failing {
                tracing::debug!(peer = self.peer_id, address = %self.address, %error, "peer still unreachable");
            } else {
                tracing::warn!(
                    peer = self.peer_id,
                    address = %self.address,
                    %error,
                    "cannot send Raft messages to peer; retrying with backoff"
                );
                failing = true;
            }
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                _ = self.closed.changed() => return,
            }
            backoff = (backoff * 2).min(self.options.backoff_max);
        }
    }

    /// Sends one batch, connecting first if there is no connection. On failure, forgets the
    /// connection when it may be broken.
    async fn deliver(
        &self,
        endpoint: &Endpoint,
        client: &mut Option<PeerClient<Channel>>,
        batch: Vec<(u64, Vec<u8>)>,
    ) -> Result<(), String> {
        let connected = match client {
            Some(connected) => connected,
            None => {
                let channel = endpoint.connect().await.map_err(|error| format!("cannot connect: {error}"))?;
                client.insert(
                    PeerClient::new(channel)
                        .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES)
                        .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES),
                )
            }
        };
        let (shards, messages) = batch.into_iter().unzip();
        let mut request = tonic::Request::new(PeerMessages { from: self.node_id, messages, shards });
        if let Some(secret) = &self.options.secret {
            request.metadata_mut().insert(PEER_SECRET_METADATA, secret.metadata_value());
        }
        match connected.send(request).await {
            Ok(_) => Ok(()),
            Err(status) => {
                if matches!(
                    status.code(),
                    tonic::Code::Unavailable
                        | tonic::Code::Unknown
                        | tonic::Code::Cancelled
                        | tonic::Code::DeadlineExceeded
                ) {
                    // The connection may be broken: make a fresh one next time.
                    *client = None;
                }
                Err(format!("call failed: {status}"))
            }
        }
    }

    /// Waits for at least one message, then takes whatever else is queued, up to the batch limits,
    /// encoded. Returns `None` once the transport is closed or dropped. A message that would push
    /// the batch over the size limit is left in `carried` to start the next one.
    async fn next_batch(&mut self, carried: &mut Option<(u64, Vec<u8>)>) -> Option<Vec<(u64, Vec<u8>)>> {
        let limit = MAX_PEER_MESSAGE_BYTES - BATCH_FRAMING_BYTES;
        let first = loop {
            if let Some(encoded) = carried.take() {
                break encoded;
            }
            let (shard, message) = tokio::select! {
                message = self.receiver.recv() => message?,
                _ = self.closed.changed() => return None,
            };
            if let Some(encoded) = self.encode(message, limit) {
                break (shard, encoded);
            }
        };
        let mut bytes = first.1.len();
        let mut batch = vec![first];
        while batch.len() < self.options.batch_messages && bytes < self.options.batch_bytes {
            let Ok((shard, message)) = self.receiver.try_recv() else { break };
            let Some(encoded) = self.encode(message, limit) else { continue };
            if bytes + encoded.len() > limit {
                *carried = Some((shard, encoded));
                break;
            }
            bytes += encoded.len();
            batch.push((shard, encoded));
        }
        Some(batch)
    }

    /// Encodes a dequeued message, or drops it (counted) if it can never be sent.
    fn encode(&self, message: Message, limit: usize) -> Option<Vec<u8>> {
        let size = estimated_size(&message);
        // `send` added exactly this estimate before queueing the message.
        let _ = self
            .queued_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |queued| Some(queued.saturating_sub(size)));
        match message.write_to_bytes() {
            Ok(encoded) if encoded.len() <= limit => Some(encoded),
            Ok(encoded) => {
                self.counters.dropped_too_large.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    peer = self.peer_id,
                    bytes = encoded.len(),
                    limit,
                    "dropping a Raft message larger than the peer message limit"
                );
                None
            }
            Err(error) => {
                self.counters.dropped_too_large.fetch_add(1, Ordering::Relaxed);
                tracing::error!(peer = self.peer_id, %error, "cannot encode a Raft message");
                None
            }
        }
    }
}
