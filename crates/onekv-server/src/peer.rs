//! The `Peer` gRPC service: Raft messages arriving from other members.
//!
//! Owns decoding each message (rust-protobuf bytes, see `onekv.proto`) and checking it was meant
//! for this node and comes from a member, before handing it to the replica. A whole batch is checked
//! before any of it is stepped, so a malformed batch changes nothing. [`PeerService::into_server`]
//! puts the cluster-secret check ([`crate::auth::PeerAuth`]) and the service's own bounds
//! ([`crate::admission`]: calls at once, message size) in front, so an unauthenticated call is
//! refused before its body is read. Does not own sending (that is [`crate::transport`]) nor what
//! Raft does with the messages.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};

use onekv_proto::{
    PeerAck, PeerMessages, SnapshotChunkReply, SnapshotChunkRequest,
    peer_server::{Peer, PeerServer},
};
use onekv_replica::{ChunkCursor, ChunkRequest, Message, SnapshotChunk};
use protobuf::Message as _;
use raft::eraftpb::SnapshotMetadata;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use crate::admission::{Admission, Admitted};
use crate::auth::{PeerAuth, PeerSecret};
use crate::backend::Backend;
use crate::config::ServerConfig;
use crate::members::Directory;

/// Room in a peer message beyond a snapshot's data: the snapshot's metadata, the Raft message's
/// other fields and the call's framing.
const PEER_MESSAGE_FRAMING: usize = 1 << 20;

/// Largest `PeerMessages` the peer service reads and the transport sends: room for a whole snapshot
/// ([`onekv_replica::MAX_SNAPSHOT_BYTES`]) with its framing, as when snapshots travelled whole.
/// Snapshots now stream in chunks of at most 64 MiB (`SnapshotChunk` calls), so the largest
/// legitimate message is an append: one write is at most `limits.max_batch_bytes`, at most 128 MiB,
/// and an append carries at most 1 MiB of entries beyond its first. Lowering this to that is left
/// for later.
pub const MAX_PEER_MESSAGE_BYTES: usize = onekv_replica::MAX_SNAPSHOT_BYTES + PEER_MESSAGE_FRAMING;

/// Bytes of peer messages read and handled at once: two whole snapshots, so one snapshot never
/// keeps the small messages (heartbeats, appends) out.
pub const PEER_BYTES_IN_FLIGHT: usize = 2 * MAX_PEER_MESSAGE_BYTES;

/// Batches above this many bytes are decoded on a blocking thread rather than an async worker.
const DECODE_INLINE_BYTES: usize = 1 << 20;

/// The peer service over a [`Backend`] (in production, a `Replica`).
pub struct PeerService<B> {
    backend: Arc<B>,
    node_id: u64,
    /// The cluster's member list as this node knows it: only members are heard.
    directory: Arc<Directory>,
    /// The ids of `directory`'s list, by its epoch, made again when the list changes.
    members: RwLock<(u64, Arc<HashSet<u64>>)>,
    secret: Option<PeerSecret>,
    max_concurrent_calls: usize,
}

/// The `Peer` service as served: the secret check, then the bounds, then the service.
pub type PeerServerStack<B> = InterceptedService<Admitted<PeerServer<PeerService<B>>>, PeerAuth>;

impl<B: Backend> PeerService<B> {
    /// A service for the node `config` describes, over `backend`. It accepts no call until given
    /// the cluster secret ([`PeerService::with_secret`]).
    pub fn new(backend: Arc<B>, config: &ServerConfig) -> Self {
        PeerService {
            backend,
            node_id: config.node_id,
            directory: Arc::new(Directory::from_config(config).expect("a validated configuration's members")),
            members: RwLock::new((0, Arc::new(HashSet::new()))),
            secret: None,
            max_concurrent_calls: config.limits.max_concurrent_peer_calls,
        }
    }

    /// Hears the members of `directory` (the node's member list, changing as the cluster does)
    /// instead of the configuration's.
    pub fn with_members(mut self, directory: Arc<Directory>) -> Self {
        self.directory = directory;
        self
    }

    /// The ids of the current member list.
    fn member_ids(&self) -> Arc<HashSet<u64>> {
        let list = self.directory.current();
        {
            let cached = self.members.read().unwrap_or_else(|e| e.into_inner());
            if cached.0 == list.epoch {
                return Arc::clone(&cached.1);
            }
        }
        let ids: Arc<HashSet<u64>> = Arc::new(list.members().iter().map(|member| member.id).collect());
        *self.members.write().unwrap_or_else(|e| e.into_inner()) = (list.epoch, Arc::clone(&ids));
        ids
    }

    /// Accepts calls that carry `secret` (`None`: accepts none).
    pub fn with_secret(mut self, secret: Option<PeerSecret>) -> Self {
        self.secret = secret;
        self
    }

    /// The tonic server for this service: calls without the cluster secret are refused
    /// (UNAUTHENTICATED) before their body is read; at most `limits.max_concurrent_peer_calls`
    /// are decoded and handled at once, holding at most [`PEER_BYTES_IN_FLIGHT`] bytes of messages
    /// (more are refused, UNAVAILABLE: the transport backs off and Raft retransmits what matters);
    /// messages over [`MAX_PEER_MESSAGE_BYTES`] are refused.
    pub fn into_server(self) -> PeerServerStack<B> {
        let auth = PeerAuth::new(self.secret.clone());
        let admission = Admission::new(
            self.max_concurrent_calls,
            "limits.max_concurrent_peer_calls",
            MAX_PEER_MESSAGE_BYTES,
            |length| {
                Status::invalid_argument(format!(
                    "a peer message of {length} bytes is over the largest a peer sends                      ({MAX_PEER_MESSAGE_BYTES} bytes)"
                ))
            },
        )
        .with_bytes_budget(PEER_BYTES_IN_FLIGHT);
        let server = PeerServer::new(self).max_decoding_message_size(MAX_PEER_MESSAGE_BYTES);
        InterceptedService::new(Admitted::new(server, admission), auth)
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
) -> Result<Vec<(u64, Message)>, Status> {
    let from = batch.from;
    if !members.contains(&from) {
        return Err(Status::permission_denied(format!(
            "node {from} is not a member of this cluster (this is node {node_id})"
        )));
    }
    if batch.shards.len() != batch.messages.len() {
        return Err(Status::invalid_argument(format!(
            "node {from} sent {} messages but {} shard ids; each message names its shard",
            batch.messages.len(),
            batch.shards.len()
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
        messages.push((batch.shards[i], message));
    }
    Ok(messages)
}

#[tonic::async_trait]
impl<B: Backend> Peer for PeerService<B> {
    async fn send(&self, request: Request<PeerMessages>) -> Result<Response<PeerAck>, Status> {
        let batch = request.into_inner();
        let bytes: usize = batch.messages.iter().map(Vec::len).sum();
        let node_id = self.node_id;
        let members = self.member_ids();
        let messages = if bytes <= DECODE_INLINE_BYTES {
            decode_batch(&batch, node_id, &members)?
        } else {
            // A snapshot can take a while to decode; do not hold an async worker meanwhile.
            tokio::task::spawn_blocking(move || decode_batch(&batch, node_id, &members))
                .await
                .map_err(|error| Status::internal(format!("decoding failed: {error}")))??
        };
        for (shard, message) in messages {
            self.backend.step(shard, message);
        }
        Ok(Response::new(PeerAck {}))
    }

    async fn snapshot_chunk(
        &self,
        request: Request<SnapshotChunkRequest>,
    ) -> Result<Response<SnapshotChunkReply>, Status> {
        let wire = request.into_inner();
        if !self.member_ids().contains(&wire.from) {
            return Err(Status::permission_denied(format!(
                "node {} is not a member of this cluster (this is node {})",
                wire.from, self.node_id
            )));
        }
        let request = chunk_request_from_wire(wire)?;
        // Reads up to a chunk of values from disk: not on an async worker.
        let backend = Arc::clone(&self.backend);
        let chunk = tokio::task::spawn_blocking(move || backend.snapshot_chunk(&request))
            .await
            .map_err(|error| Status::internal(format!("serving a snapshot chunk failed: {error}")))?
            .map_err(|error| Status::unavailable(error.to_string()))?;
        Ok(Response::new(chunk_to_wire(chunk)))
    }
}

/// A chunk request as the replica takes it; INVALID_ARGUMENT for an unknown cursor kind.
pub fn chunk_request_from_wire(wire: SnapshotChunkRequest) -> Result<ChunkRequest, Status> {
    let cursor = cursor_from_wire(wire.cursor, wire.after_key, wire.window_pair)?;
    Ok(ChunkRequest {
        from: wire.from,
        shard: wire.shard,
        index: wire.index,
        any_view: wire.any_view,
        references: wire.references,
        cursor,
        max_bytes: wire.max_bytes,
    })
}

/// The wire form of a chunk request.
pub fn chunk_request_to_wire(request: &ChunkRequest) -> SnapshotChunkRequest {
    let (cursor, after_key, window_pair) = cursor_to_wire(&request.cursor);
    SnapshotChunkRequest {
        from: request.from,
        shard: request.shard,
        index: request.index,
        cursor,
        after_key,
        window_pair,
        max_bytes: request.max_bytes,
        any_view: request.any_view,
        references: request.references,
    }
}

/// The wire form of a chunk.
pub fn chunk_to_wire(chunk: SnapshotChunk) -> SnapshotChunkReply {
    let (next_cursor, next_after_key, next_window_pair) =
        chunk.next.as_ref().map(cursor_to_wire).unwrap_or_default();
    let view = chunk.view.map(|view| view.write_to_bytes().unwrap_or_default()).unwrap_or_default();
    SnapshotChunkReply {
        pairs: chunk.pairs,
        more: chunk.next.is_some(),
        next_cursor,
        next_after_key,
        next_window_pair,
        view,
    }
}

/// A chunk as the replica takes it; an error for an unknown cursor kind.
pub fn chunk_from_wire(wire: SnapshotChunkReply) -> Result<SnapshotChunk, String> {
    let next = match wire.more {
        true => Some(
            cursor_from_wire(wire.next_cursor, wire.next_after_key, wire.next_window_pair)
                .map_err(|status| status.message().to_string())?,
        ),
        false => None,
    };
    let view = match wire.view.is_empty() {
        true => None,
        false => Some(
            SnapshotMetadata::parse_from_bytes(&wire.view)
                .map_err(|error| format!("a snapshot chunk's view does not decode: {error}"))?,
        ),
    };
    Ok(SnapshotChunk { pairs: wire.pairs, next, view })
}

fn cursor_from_wire(kind: u32, after_key: Vec<u8>, window_pair: u32) -> Result<ChunkCursor, Status> {
    match kind {
        0 => Ok(ChunkCursor::Start),
        1 => Ok(ChunkCursor::AfterKey(after_key)),
        2 => Ok(ChunkCursor::Window(window_pair)),
        other => Err(Status::invalid_argument(format!("unknown snapshot chunk cursor kind {other}"))),
    }
}

fn cursor_to_wire(cursor: &ChunkCursor) -> (u32, Vec<u8>, u32) {
    match cursor {
        ChunkCursor::Start => (0, Vec::new(), 0),
        ChunkCursor::AfterKey(key) => (1, key.clone(), 0),
        ChunkCursor::Window(at) => (2, Vec::new(), *at),
    }
}
