//! The `Peer` gRPC service: Raft messages arriving from other members.
//!
//! Owns decoding each message (rust-protobuf bytes, see `onekv.proto`) and checking it was meant
//! for this node and comes from a member, before handing it to the replica. A whole batch is checked
//! before any of it is stepped, so a malformed batch changes nothing. Does not own sending (that is
//! [`crate::transport`]) nor what Raft does with the messages.

use std::collections::HashSet;
use std::sync::Arc;

use onekv_proto::{
    PeerAck, PeerMessages,
    peer_server::{Peer, PeerServer},
};
use onekv_replica::Message;
use protobuf::Message as _;
use tonic::{Request, Response, Status};

use crate::backend::Backend;
use crate::config::ServerConfig;

/// Largest `PeerMessages` the peer service accepts and the transport sends: snapshots may be tens
/// of MiB, and the bound keeps one peer from making this node allocate without limit.
pub const MAX_PEER_MESSAGE_BYTES: usize = 256 << 20;

/// Batches above this many bytes are decoded on a blocking thread rather than an async worker.
const DECODE_INLINE_BYTES: usize = 1 << 20;

/// The peer service over a [`Backend`] (in production, a `Replica`).
pub struct PeerService<B> {
    backend: Arc<B>,
    node_id: u64,
    members: Arc<HashSet<u64>>,
}

impl<B: Backend> PeerService<B> {
    /// A service for the node `config` describes, over `backend`.
    pub fn new(backend: Arc<B>, config: &ServerConfig) -> Self {
        PeerService {
            backend,
            node_id: config.node_id,
            members: Arc::new(config.members.iter().map(|member| member.id).collect()),
        }
    }

    /// The tonic server for this service, admitting messages up to [`MAX_PEER_MESSAGE_BYTES`].
    pub fn into_server(self) -> PeerServer<Self> {
        PeerServer::new(self).max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
    }
}

/// Decodes and checks a batch exactly as the service does before stepping any of it: the sending
/// node is a member (else PERMISSION_DENIED), and every message decodes, is addressed to `node_id`
/// and comes from a member (else INVALID_ARGUMENT). A message's `from` need not be the sending
/// node: raft-rs forwards some messages with another origin (a follower forwards
/// `MsgTransferLeader` with `from` set to the transferee). Public so the `peer_message` fuzz target
/// runs this very code on arbitrary bytes.
pub fn decode_batch(
    batch: &PeerMessages,
    node_id: u64,
    members: &HashSet<u64>,
) -> Result<Vec<Message>, Status> {
    let from = batch.from;
    if !members.contains(&from) {
        return Err(Status::permission_denied(format!(
            "node {from} is not a member of this cluster (this is node {node_id})"
        )));
    }
    let mut messages = Vec::with_capacity(batch.messages.len());
    for (i, bytes) in batch.messages.iter().enumerate() {
        let message = Message::parse_from_bytes(bytes).map_err(|error| {
            Status::invalid_argument(format!("message {i} from node {from} does not decode: {error}"))
        })?;
        if message.to != node_id {
            return Err(Status::invalid_argument(format!(
                "message {i} from node {from} is addressed to node {}, but this is node {node_id} \
                 (do the members lists agree?)",
                message.to
            )));
        }
        if !members.contains(&message.from) {
            return Err(Status::invalid_argument(format!(
                "message {i} from node {from} claims to come from node {}, which is not a member",
                message.from
            )));
        }
        messages.push(message);
    }
    Ok(messages)
}

#[tonic::async_trait]
impl<B: Backend> Peer for PeerService<B> {
    async fn send(&self, request: Request<PeerMessages>) -> Result<Response<PeerAck>, Status> {
        let batch = request.into_inner();
        let bytes: usize = batch.messages.iter().map(Vec::len).sum();
        let node_id = self.node_id;
        let messages = if bytes <= DECODE_INLINE_BYTES {
            decode_batch(&batch, node_id, &self.members)?
        } else {
            // A snapshot can take a while to decode; do not hold an async worker meanwhile.
            let members = Arc::clone(&self.members);
            tokio::task::spawn_blocking(move || decode_batch(&batch, node_id, &members))
                .await
                .map_err(|error| Status::internal(format!("decoding failed: {error}")))??
        };
        for message in messages {
            self.backend.step(message);
        }
        Ok(Response::new(PeerAck {}))
    }
}
