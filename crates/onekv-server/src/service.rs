//! The `Kv` gRPC service: the client API over a replica.
//!
//! Owns the translation between the wire and the replica: checking every request against the
//! configured limits (so nothing oversized reaches Raft, and the error names the limit), turning
//! writes into proposals and linearizable reads into a read barrier followed by a local read,
//! bounding each by the request timeout, and mapping [`ReplicaError`]s to the gRPC statuses that
//! `onekv.proto` promises. Does not own consensus, storage or retries (clients retry with their
//! request ids).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use onekv_client::coalesce::MAX_MULTI_CALLS;
use onekv_placement::{ClusterMap, Member as ListedMember, MemberList};
use onekv_proto::{
    BatchRequest, CasRequest, CasResponse, ChangeMembersRequest, Consistency, DeleteRangeRequest,
    DeleteRangeResponse, DeleteRequest, FastWriteRequest, FastWriteResponse, GetRequest, GetResponse,
    KeyValue, Member, MembersResponse, MultiRequest, MultiResult, PutRequest, ReplicaRequest,
    ReplicaResponse, ScanRequest, ScanResponse, SetMembersRequest, SetMembersResponse, StatusRequest,
    StatusResponse, TransferLeaderRequest, TransferLeaderResponse, TxnRequest, TxnResponse, WriteResponse,
    kv_server::{Kv, KvServer},
};
use onekv_replica::{
    Command, Condition, Expiry, FastAck, Limits, Outcome, RANGE_DELETE_PAGE_KEYS, ReplicaError, RequestId,
    WriteOp,
};
use tokio::sync::oneshot;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status};

use crate::admission::{Admission, Admitted};
use crate::backend::Backend;
use crate::config::ServerConfig;
use crate::members::{Directory, MEMBERS_KEY, is_system_key};

/// The `protocol` label of this service's request metrics.
const PROTOCOL: &str = "grpc";
/// Per-item framing a protobuf message adds around keys and values (tags and varint lengths), with
/// room to spare; used to size gRPC message limits from the configured payload limits.
const FRAMING_PER_ITEM: usize = 32;
/// Fixed slack on gRPC message limits for request ids, flags and headers.
const FRAMING_FIXED: usize = 64 << 10;
/// The longest a read that met a value damaged on this node waits for the replica to repair it
/// from another replica's copy (a few Raft round trips) before answering DATA_LOSS.
const REPAIR_WAIT_MAX: Duration = Duration::from_secs(2);
/// How often such a read looks again.
const REPAIR_POLL: Duration = Duration::from_millis(20);

/// The client API over a [`Backend`] (in production, a `Node`).
pub struct KvService<B> {
    backend: Arc<B>,
    /// Which shard each key belongs to and which nodes hold it.
    map: Arc<ClusterMap>,
    node_id: u64,
    /// The cluster's member list as this node knows it (addresses in redirects, `Status`).
    members: Arc<Directory>,
    limits: Limits,
    request_timeout: Duration,
    drain: Drain,
    max_concurrent: usize,
    /// The cluster secret the administrative calls must carry (`TransferLeader`, `ChangeMembers`,
    /// `AddReplica`, `RemoveReplica`, `SetMembers`; `None`: none is accepted).
    secret: Option<crate::auth::PeerSecret>,
}

/// Lets a stopping node refuse new client requests while those in flight finish, without stopping
/// the gRPC server: the `Peer` service on the same port must keep carrying Raft messages, or a
/// draining leader could never commit what it is finishing. Clones share the same state.
#[derive(Clone, Default)]
pub struct Drain {
    inner: Arc<DrainState>,
}

#[derive(Default)]
struct DrainState {
    stopping: AtomicBool,
    in_flight: AtomicUsize,
    idle: tokio::sync::Notify,
}

/// Counts one request in flight until dropped.
struct InFlight(Arc<DrainState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Drain {
    /// From now on new requests are refused (UNAVAILABLE); returns once none is in flight.
    pub async fn stop_and_wait(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        loop {
            let idle = self.inner.idle.notified();
            if self.inner.in_flight.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Admits one request, or refuses it if the node is stopping.
    fn admit(&self) -> Result<InFlight, Status> {
        self.inner.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight(Arc::clone(&self.inner));
        if self.inner.stopping.load(Ordering::SeqCst) {
            return Err(Status::unavailable("the node is shutting down; retry on another member"));
        }
        Ok(guard)
    }
}

impl<B: Backend> KvService<B> {
    /// A service for the node `config` describes, over `backend`, routing keys by `map`.
    pub fn new(backend: Arc<B>, config: &ServerConfig, map: Arc<ClusterMap>) -> Self {
        KvService {
            backend,
            map,
            node_id: config.node_id,
            members: Arc::new(Directory::from_config(config).expect("a validated configuration's members")),
            limits: config.limits.to_limits(),
            request_timeout: config.request_timeout(),
            drain: Drain::default(),
            max_concurrent: config.limits.max_concurrent_requests,
            secret: None,
        }
    }

    /// Uses `members` (the node's member list, changing as the cluster does) instead of the
    /// configuration's.
    pub fn with_members(mut self, members: Arc<Directory>) -> Self {
        self.members = members;
        self
    }

    /// Accepts the administrative calls that carry `secret` (see the field); without one, none.
    pub fn with_secret(mut self, secret: Option<crate::auth::PeerSecret>) -> Self {
        self.secret = secret;
        self
    }

    /// Uses `drain` to stop admitting requests when the node shuts down.
    pub fn with_drain(mut self, drain: Drain) -> Self {
        self.drain = drain;
        self
    }

    /// The tonic server for this service, with message size limits that admit every request and
    /// response the configured limits allow (tonic's 4 MiB default would not), and no more, behind
    /// its admission ([`crate::admission`]): at most `limits.max_concurrent_requests` calls at once
    /// (more are refused, UNAVAILABLE, which clients retry with backoff), and a request over
    /// [`max_request_bytes`] refused before it is read with INVALID_ARGUMENT naming the limits (not
    /// tonic's OUT_OF_RANGE).
    pub fn into_server(self) -> Admitted<KvServer<Self>> {
        let decoding = max_request_bytes(&self.limits);
        let encoding = max_response_bytes(&self.limits);
        let limits = self.limits.clone();
        let admission =
            Admission::new(self.max_concurrent, "limits.max_concurrent_requests", decoding, move |length| {
                request_too_large(&limits, length)
            });
        let server =
            KvServer::new(self).max_decoding_message_size(decoding).max_encoding_message_size(encoding);
        Admitted::new(server, admission)
    }

    /// Runs one request's handling and records it in the request metrics (protocol `grpc`).
    async fn observed<T>(
        &self,
        op: &'static str,
        handling: impl Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        let started = Instant::now();
        // Status stays answered while the node drains: operators and peers' status pages ask it.
        let result = match op {
            "status" => handling.await,
            _ => match self.drain.admit() {
                Ok(_in_flight) => handling.await,
                Err(refused) => Err(refused),
            },
        };
        crate::metrics::record_request(PROTOCOL, op, result.is_ok(), started.elapsed());
        result
    }

    /// The shard of `key`, if this node holds a replica of it; else the not-leader answer naming
    /// a node that does (its primary when that is not this node), which clients follow.
    fn shard_of(&self, key: &[u8]) -> Result<u64, Status> {
        self.held(self.map.shard_of_key(key))
    }

    /// `shard` if this node holds a replica of it now; else the not-leader answer naming a node
    /// that may: one of the voters this node's replica knew when it was removed from here, or the
    /// shard's primary in the cluster's first placement (replicas move while nodes run, so that
    /// node may redirect further).
    fn held(&self, shard: u64) -> Result<u64, Status> {
        let Some(placement) = self.map.shard(shard) else {
            return Err(Status::invalid_argument(format!(
                "shard {shard} does not exist: the cluster has shards 1..={}",
                self.map.shard_count()
            )));
        };
        if self.backend.hosts(shard) {
            return Ok(shard);
        }
        Err(self.status_of(ReplicaError::NotLeader { leader: self.elsewhere(shard, &placement.replicas) }))
    }

    /// A node other than this one that may hold `shard`: one of the voters this node's replica
    /// knew when it was removed from here, else one of `placed` (the first placement's replicas).
    fn elsewhere(&self, shard: u64, placed: &[u64]) -> Option<u64> {
        let other = |nodes: &[u64]| nodes.iter().copied().find(|&node| node != self.node_id);
        self.backend.last_voters_of_removed(shard).and_then(|voters| other(&voters)).or_else(|| other(placed))
    }

    /// Refuses a stale read that this node's replica of `shard` cannot serve: a failed node's, or
    /// one waiting to be added to its shard (no members: it holds nothing yet). The client is
    /// sent to the leader, if known.
    fn refuse_stale(&self, shard: u64) -> Result<(), Status> {
        self.refuse_if_failed()?;
        match self.backend.status(shard) {
            Some(status) if status.voters.is_empty() && status.learners.is_empty() => {
                let placed = self.map.shard(shard).map(|p| p.replicas.clone()).unwrap_or_default();
                let leader = status.leader_id.filter(|&leader| leader != self.node_id);
                Err(self.status_of(ReplicaError::NotLeader {
                    leader: leader.or_else(|| self.elsewhere(shard, &placed)),
                }))
            }
            _ => Ok(()),
        }
    }

    /// The shard a request that names one (a scan, a range deletion) is for, if this node holds it:
    /// 0 stands for the only shard of a cluster of one; otherwise a request over several shards
    /// goes to each (`what`, `each`: how the refusal names the request and the remedy).
    fn named_shard(&self, shard: u64, what: &str, each: &str) -> Result<u64, Status> {
        match shard {
            0 if self.map.shard_count() == 1 => Ok(1),
            0 => Err(Status::invalid_argument(format!(
                "{what}: the cluster has {} shards; {each} (1..={}) and merge (the onekv client does)",
                self.map.shard_count(),
                self.map.shard_count()
            ))),
            shard => self.held(shard),
        }
    }

    /// The one shard all of `keys` belong to (held here), or why not: a batch is atomic within
    /// one shard, and keys of several shards are refused rather than split.
    fn one_shard<'a>(&self, keys: impl Iterator<Item = &'a [u8]>) -> Result<u64, Status> {
        let mut shards = std::collections::BTreeSet::new();
        for key in keys {
            shards.insert(self.map.shard_of_key(key));
        }
        if shards.len() > 1 {
            let list: Vec<String> = shards.iter().map(u64::to_string).collect();
            return Err(Status::invalid_argument(format!(
                "the batch's keys belong to shards {}: a batch is atomic within one shard only; give \
                 related keys a common {{hash tag}} (only the part inside {{}} is hashed) or send one \
                 batch per shard (the onekv client's batch_per_shard does)",
                list.join(", ")
            )));
        }
        self.held(shards.into_iter().next().unwrap_or(1))
    }

    /// Proposes `command` to `shard` and waits for it to be applied, within the request timeout.
    async fn commit(&self, shard: u64, request_id: RequestId, command: Command) -> Result<Outcome, Status> {
        let (sender, receiver) = oneshot::channel();
        self.backend.propose(
            shard,
            request_id,
            command,
            Box::new(move |result| {
                // The client may have gone away; then nobody needs the answer.
                let _ = sender.send(result);
            }),
        );
        self.await_done(receiver, "committed").await
    }

    /// Confirms `shard`'s leadership and waits until this replica has applied everything
    /// committed before.
    async fn read_barrier(&self, shard: u64) -> Result<(), Status> {
        let (sender, receiver) = oneshot::channel();
        self.backend.read_barrier(
            shard,
            Box::new(move |result| {
                let _ = sender.send(result);
            }),
        );
        self.await_done(receiver, "confirmed by a quorum").await
    }

    async fn await_done<T>(
        &self,
        receiver: oneshot::Receiver<Result<T, ReplicaError>>,
        what: &str,
    ) -> Result<T, Status> {
        match tokio::time::timeout(self.request_timeout, receiver).await {
            Err(_elapsed) => Err(Status::deadline_exceeded(format!(
                "not {what} within {} ms; a write may still commit: retry it with the same request id",
                self.request_timeout.as_millis()
            ))),
            Ok(Err(_dropped)) => {
                Err(Status::unavailable("the replica dropped the request without an answer; retry"))
            }
            Ok(Ok(result)) => result.map_err(|error| self.status_of(error)),
        }
    }

    /// The gRPC status for a replica error, as `onekv.proto`'s header comment specifies.
    /// Reads `key`. A value damaged on this node is repaired from another replica's copy, so
    /// rather than fail at once the read looks again until it is (up to half the request timeout,
    /// at most [`REPAIR_WAIT_MAX`]): the client is then served the healthy replicas' value. A
    /// later read than the first attempt is still linearizable: it happens after the barrier and
    /// before the answer.
    async fn get_repaired(
        &self,
        shard: u64,
        key: &[u8],
    ) -> Result<Option<onekv_replica::ValueWithExpiry>, Status> {
        let deadline = Instant::now() + (self.request_timeout / 2).min(REPAIR_WAIT_MAX);
        loop {
            // One index lookup and one pread of the value: short enough to run here.
            match self.backend.get(shard, key) {
                Err(ReplicaError::Corrupt { .. }) if Instant::now() < deadline => {
                    tokio::time::sleep(REPAIR_POLL).await
                }
                other => return other.map_err(|error| self.status_of_read(error)),
            }
        }
    }

    fn status_of(&self, error: ReplicaError) -> Status {
        replica_error_status(error, &self.members.current())
    }

    /// Refuses a stale read on a failed replica. Its copy stopped at the failure and falls further
    /// behind for as long as it stays up, so it is no longer a copy worth reading, even stale. (A
    /// linearizable read needs no check: the failed replica refuses its read barrier.)
    fn refuse_if_failed(&self) -> Result<(), Status> {
        match self.backend.failure() {
            Some(failure) => Err(failed_node_status(&failure)),
            None => Ok(()),
        }
    }

    /// The gRPC status for an error of a local read (`get`, `scan`). Unlike a proposal, a read can
    /// fail on one bad value while the replica as a whole still serves: that is INTERNAL (asking
    /// another member would only be redirected back here). Only once the replica has failed is it
    /// the failed-node answer that sends the client elsewhere.
    fn status_of_read(&self, error: ReplicaError) -> Status {
        match error {
            ReplicaError::Storage(message) => match self.backend.failure() {
                Some(failure) => failed_node_status(&failure),
                None => Status::internal(ReplicaError::Storage(message).to_string()),
            },
            error => self.status_of(error),
        }
    }

    fn read_key(&self, key: &[u8], consistency: i32) -> Result<Consistency, Status> {
        let consistency = Consistency::try_from(consistency)
            .map_err(|_| Status::invalid_argument(format!("unknown consistency {consistency}")))?;
        check_key(&self.limits, "key", key)?;
        Ok(consistency)
    }
}

/// Records a `Multi` in the request metrics when its answer ends: "ok" if every call was answered,
/// else "error" (refused, or the client went away first).
struct MultiCounted {
    started: Instant,
    /// Calls not answered yet (`usize::MAX` until the request is accepted).
    left: usize,
}

impl Drop for MultiCounted {
    fn drop(&mut self) {
        crate::metrics::record_request(PROTOCOL, "multi", self.left == 0, self.started.elapsed());
    }
}

// By hand: a derive would ask `B: Clone`, and only the `Arc` is cloned.
impl<B> Clone for KvService<B> {
    fn clone(&self) -> Self {
        KvService {
            backend: Arc::clone(&self.backend),
            map: Arc::clone(&self.map),
            node_id: self.node_id,
            members: Arc::clone(&self.members),
            limits: self.limits.clone(),
            request_timeout: self.request_timeout,
            drain: self.drain.clone(),
            max_concurrent: self.max_concurrent,
            secret: self.secret.clone(),
        }
    }
}

/// `server` (a clone of the one served over gRPC, [`KvService::into_server`]) for calls made in
/// this process ([`onekv_client::Client::serve_locally`]): the same service, sharing its admission
/// (one `limits.max_concurrent_requests` for both), without a connection.
pub fn local_kv_service<B: Backend>(server: Admitted<KvServer<KvService<B>>>) -> onekv_client::LocalKv {
    use tower::ServiceExt as _;
    tower::util::BoxCloneService::new(server.map_err(|never| match never {}))
}

/// Maps a [`ReplicaError`] to its gRPC status. A not-leader error names the leader in metadata
/// (`onekv-leader-id`, `onekv-leader-addr`) when it is known, and is UNAVAILABLE when it is not.
pub fn replica_error_status(error: ReplicaError, members: &MemberList) -> Status {
    match error {
        ReplicaError::NotLeader { leader: Some(leader) } => {
            let address = members.address(leader);
            let message = match address {
                Some(address) => format!("not the leader; the leader is node {leader} at {address}"),
                None => format!("not the leader; the leader is node {leader} (address unknown)"),
            };
            let mut status = Status::failed_precondition(message);
            let metadata = status.metadata_mut();
            metadata.insert(onekv_proto::LEADER_ID_METADATA, MetadataValue::from(leader));
            // A member address is validated host:port text, so it is always a valid header value;
            // if it somehow were not, the id alone still lets the client find the leader.
            if let Some(value) = address.and_then(|address| MetadataValue::try_from(address).ok()) {
                metadata.insert(onekv_proto::LEADER_ADDR_METADATA, value);
            }
            status
        }
        ReplicaError::NotLeader { leader: None } => Status::unavailable(
            "not the leader, and no leader is known yet (an election may be under way); retry",
        ),
        ReplicaError::InvalidArgument(message) => Status::invalid_argument(message),
        ReplicaError::Dropped(message) => Status::unavailable(format!(
            "dropped before commit ({message}); retrying with the same request id is safe"
        )),
        ReplicaError::Stopping => Status::unavailable("the node is shutting down"),
        // Not retried by clients: the caller must read again and decide anew.
        error @ ReplicaError::AlreadyEvaluated { .. } => Status::aborted(error.to_string()),
        // Only a replica that has failed answers a proposal or a read barrier with a storage
        // error. It no longer takes part in Raft (the others elect a leader without it), so the
        // client must stop treating it as the leader and ask another member: UNAVAILABLE, with
        // the failure for the operator and deliberately no leader hint (this node's idea of the
        // leader is frozen at the moment it failed, possibly itself).
        ReplicaError::Storage(failure) => failed_node_status(&failure),
        error @ ReplicaError::Open(_) => Status::internal(error.to_string()),
        // The message starts "disk full: " and says why; the leader is handing leadership away.
        error @ ReplicaError::DiskFull(_) => Status::resource_exhausted(error.to_string()),
        // This node's copy of one value is damaged; the node and its other keys are fine.
        error @ ReplicaError::Corrupt { .. } => Status::data_loss(error.to_string()),
    }
}

/// The answer of a node whose replica has failed: UNAVAILABLE naming the failure, no leader hint.
pub fn failed_node_status(failure: &str) -> Status {
    Status::unavailable(format!(
        "this node failed and no longer serves (storage failure: {failure}); retry on another member"
    ))
}

/// The largest request the limits admit, as a gRPC message (a transaction: a batch of ops and as
/// many conditions, or a compare-and-swap carrying a key and two values).
pub fn max_request_bytes(limits: &Limits) -> usize {
    let batch = limits.max_batch_bytes + 2 * limits.max_batch_ops * FRAMING_PER_ITEM;
    let cas = limits.max_key_bytes + 2 * limits.max_value_bytes + 3 * FRAMING_PER_ITEM;
    // What a client coalesces into one `Multi`, whatever the limits (each call is checked alone).
    let multi = onekv_client::coalesce::MAX_MULTI_BYTES + 2 * MAX_MULTI_CALLS * FRAMING_PER_ITEM;
    batch.max(cas).max(multi) + FRAMING_FIXED
}

/// The refusal of a request of `length` bytes, over [`max_request_bytes`]: no field of it can be
/// within the limits, and the message names them.
fn request_too_large(limits: &Limits, length: usize) -> Status {
    Status::invalid_argument(format!(
        "request is {length} bytes, over the largest the limits allow ({} bytes): values are at most \
         limits.max_value_bytes = {}, a write's keys and values at most limits.max_batch_bytes = {}",
        max_request_bytes(limits),
        limits.max_value_bytes,
        limits.max_batch_bytes
    ))
}

/// The largest response the limits allow, as a gRPC message (a full scan, or one value).
pub fn max_response_bytes(limits: &Limits) -> usize {
    let scan = limits.max_scan_bytes + limits.max_scan_pairs * FRAMING_PER_ITEM;
    let value = limits.max_key_bytes + limits.max_value_bytes + FRAMING_PER_ITEM;
    scan.max(value) + FRAMING_FIXED
}

fn check_key(limits: &Limits, field: &str, key: &[u8]) -> Result<(), Status> {
    if key.is_empty() {
        return Err(Status::invalid_argument(format!("{field} is empty; keys must be non-empty")));
    }
    check_len(field, key.len(), "limits.max_key_bytes", limits.max_key_bytes)
}

/// Checks a key a client writes: as [`check_key`], and not one of onekv's own.
fn check_written_key(limits: &Limits, field: &str, key: &[u8]) -> Result<(), Status> {
    check_key(limits, field, key)?;
    refuse_system_key(field, key)
}

fn refuse_system_key(field: &str, key: &[u8]) -> Result<(), Status> {
    if is_system_key(key) {
        return Err(Status::invalid_argument(format!(
            "{field} starts with {:?}, which onekv reserves for itself; such keys are read-only",
            String::from_utf8_lossy(crate::members::SYSTEM_PREFIX)
        )));
    }
    Ok(())
}

fn check_value(limits: &Limits, field: &str, value: &[u8]) -> Result<(), Status> {
    check_len(field, value.len(), "limits.max_value_bytes", limits.max_value_bytes)
}

fn check_len(field: &str, len: usize, limit_name: &str, limit: usize) -> Result<(), Status> {
    if len > limit {
        return Err(Status::invalid_argument(format!("{field} is {len} bytes, over {limit_name} = {limit}")));
    }
    Ok(())
}

fn check_write_bytes(limits: &Limits, what: &str, bytes: usize) -> Result<(), Status> {
    check_len(&format!("{what} (keys and values)"), bytes, "limits.max_batch_bytes", limits.max_batch_bytes)
}

/// Refuses a member list change other than one member added or removed, the others kept at their
/// addresses: the commands that change the list make one such step at a time, and a bigger jump
/// (or a moved address) from a mistaken or forged call could cut nodes that still vote off.
fn one_member_changed(current: &MemberList, wanted: &MemberList) -> Result<(), Status> {
    let added: Vec<u64> = wanted.members().iter().filter(|m| !current.contains(m.id)).map(|m| m.id).collect();
    let removed: Vec<u64> =
        current.members().iter().filter(|m| !wanted.contains(m.id)).map(|m| m.id).collect();
    let moved: Vec<u64> = current
        .members()
        .iter()
        .filter(|m| wanted.address(m.id).is_some_and(|address| address != m.address))
        .map(|m| m.id)
        .collect();
    if !moved.is_empty() || added.len() + removed.len() != 1 {
        return Err(Status::invalid_argument(format!(
            "a member list change adds or removes one member and keeps the others' addresses; this one \
             adds {added:?}, removes {removed:?} and changes the address of {moved:?}"
        )));
    }
    Ok(())
}

/// A request's expiry as the replica takes it. A TTL stays relative: the shard's leader makes it
/// absolute from the time it stamps the entry with, so every replica applies the same time.
fn expiry_of(field: &str, expiry: Option<onekv_proto::Expiry>) -> Result<Expiry, Status> {
    use onekv_proto::expiry::When;
    let invalid = |what: &str| Err(Status::invalid_argument(format!("{field}: {what}")));
    match expiry.and_then(|expiry| expiry.when) {
        None => Ok(Expiry::Never),
        Some(When::TtlMs(0)) => invalid("ttl_ms must be at least 1"),
        Some(When::TtlMs(ttl)) => Ok(Expiry::AfterMs(ttl)),
        Some(When::AtUnixMs(0)) => invalid("at_unix_ms must be at least 1"),
        Some(When::AtUnixMs(at)) => Ok(Expiry::At(at)),
        Some(When::Keep(true)) => Ok(Expiry::Keep),
        Some(When::Keep(false)) => invalid("keep must be true when given"),
    }
}

/// Checks a batch's (or fast write's) ops against the limits: some, not too many, each key and
/// value within its own, and all their bytes together within `limits.max_batch_bytes`.
fn check_batch_ops(limits: &Limits, ops: &[onekv_proto::BatchOp]) -> Result<(), Status> {
    if ops.is_empty() {
        return Err(Status::invalid_argument("batch has no operations"));
    }
    if ops.len() > limits.max_batch_ops {
        return Err(Status::invalid_argument(format!(
            "batch has {} operations, over limits.max_batch_ops = {}",
            ops.len(),
            limits.max_batch_ops
        )));
    }
    let mut bytes = 0;
    for (i, op) in ops.iter().enumerate() {
        check_written_key(limits, &format!("ops[{i}].key"), &op.key)?;
        if let Some(value) = &op.value {
            check_value(limits, &format!("ops[{i}].value"), value)?;
        }
        bytes += op.key.len() + op.value.as_ref().map_or(0, Vec::len);
    }
    check_write_bytes(limits, "batch", bytes)
}

/// A batch's or transaction's ops as the replica applies them.
fn write_ops(ops: Vec<onekv_proto::BatchOp>) -> Result<Vec<WriteOp>, Status> {
    ops.into_iter()
        .enumerate()
        .map(|(i, op)| {
            let expiry = expiry_of(&format!("ops[{i}].expiry"), op.expiry)?;
            Ok(WriteOp { key: op.key, value: op.value, expiry })
        })
        .collect()
}

/// The replica's check of `command` against `limits`, as the gRPC status a refusal gets.
fn check_command(limits: &Limits, command: &Command) -> Result<(), Status> {
    limits.check(command).map_err(|error| match error {
        ReplicaError::InvalidArgument(message) => Status::invalid_argument(message),
        other => Status::internal(other.to_string()),
    })
}

fn request_id(id: Option<onekv_proto::RequestId>) -> RequestId {
    id.map(|id| RequestId { client: id.client, seq: id.seq }).unwrap_or_default()
}

#[tonic::async_trait]
impl<B: Backend> Kv for KvService<B> {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        self.observed("get", async move {
            let request = request.into_inner();
            let consistency = self.read_key(&request.key, request.consistency)?;
            let shard = self.shard_of(&request.key)?;
            match consistency {
                Consistency::Linearizable => self.read_barrier(shard).await?,
                Consistency::Stale => self.refuse_stale(shard)?,
            }
            let value = self.get_repaired(shard, &request.key).await?;
            Ok(Response::new(match value {
                Some((value, expiry)) => {
                    GetResponse { found: true, value, expires_at_unix_ms: expiry.unwrap_or(0) }
                }
                None => GetResponse { found: false, value: Vec::new(), expires_at_unix_ms: 0 },
            }))
        })
        .await
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<WriteResponse>, Status> {
        self.observed("put", async move {
            let request = request.into_inner();
            check_written_key(&self.limits, "key", &request.key)?;
            check_value(&self.limits, "value", &request.value)?;
            check_write_bytes(&self.limits, "put", request.key.len() + request.value.len())?;
            let shard = self.shard_of(&request.key)?;
            let expiry = expiry_of("expiry", request.expiry)?;
            let op = WriteOp { key: request.key, value: Some(request.value), expiry };
            let outcome =
                self.commit(shard, request_id(request.request_id), Command::Write(vec![op])).await?;
            Ok(Response::new(WriteResponse { index: outcome.index }))
        })
        .await
    }

    async fn delete(&self, request: Request<DeleteRequest>) -> Result<Response<WriteResponse>, Status> {
        self.observed("delete", async move {
            let request = request.into_inner();
            check_written_key(&self.limits, "key", &request.key)?;
            let shard = self.shard_of(&request.key)?;
            let op = WriteOp::delete(request.key);
            let outcome =
                self.commit(shard, request_id(request.request_id), Command::Write(vec![op])).await?;
            Ok(Response::new(WriteResponse { index: outcome.index }))
        })
        .await
    }

    type MultiStream = futures_util::stream::BoxStream<'static, Result<MultiResult, Status>>;

    async fn multi(&self, request: Request<MultiRequest>) -> Result<Response<Self::MultiStream>, Status> {
        use futures_util::StreamExt as _;
        // Counted as a request of its own ("multi") besides each of its calls (under their ops):
        // the two counts say how much clients coalesce. Recorded when its answer ends.
        let mut counted = MultiCounted { started: Instant::now(), left: usize::MAX };
        let calls = request.into_inner().calls;
        if calls.len() > MAX_MULTI_CALLS {
            return Err(Status::invalid_argument(format!(
                "a Multi of {} calls; at most {MAX_MULTI_CALLS}",
                calls.len()
            )));
        }
        counted.left = calls.len();
        // Each call as if it came alone (its own checks, metrics and drain admission), all at
        // once, each answered as soon as it is done.
        let service = Arc::new(self.clone());
        let answers: futures_util::stream::FuturesUnordered<_> = (0u32..)
            .zip(calls)
            .map(|(at, call)| {
                let service = Arc::clone(&service);
                async move { onekv_client::coalesce::answer_alone(&*service, at, call).await }
            })
            .collect();
        let answers = answers.map(move |answer| {
            // The whole guard moves into the stream (not a copy of its field): it is dropped, and
            // records the call, when the answer ends.
            let counted = &mut counted;
            counted.left -= 1;
            Ok(answer)
        });
        Ok(Response::new(answers.boxed()))
    }

    async fn batch(&self, request: Request<BatchRequest>) -> Result<Response<WriteResponse>, Status> {
        self.observed("batch", async move {
            let request = request.into_inner();
            check_batch_ops(&self.limits, &request.ops)?;
            let shard = self.one_shard(request.ops.iter().map(|op| op.key.as_slice()))?;
            let ops = write_ops(request.ops)?;
            let outcome = self.commit(shard, request_id(request.request_id), Command::Write(ops)).await?;
            Ok(Response::new(WriteResponse { index: outcome.index }))
        })
        .await
    }

    async fn fast_write(
        &self,
        request: Request<FastWriteRequest>,
    ) -> Result<Response<FastWriteResponse>, Status> {
        self.observed("fast_write", async move {
            let request = request.into_inner();
            check_batch_ops(&self.limits, &request.ops)?;
            let id = request_id(request.request_id);
            if id.seq == 0 {
                return Err(Status::invalid_argument(
                    "a fast write needs a request id (seq != 0): every voter and the Raft path's retry \
                     must name the same write",
                ));
            }
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_millis() as u64);
            if request.deadline_unix_ms != 0 && now > request.deadline_unix_ms {
                return Err(Status::deadline_exceeded(format!(
                    "the fast write's deadline passed {} ms ago; it is not taken (its client has moved on)",
                    now - request.deadline_unix_ms
                )));
            }
            let shard = self.one_shard(request.ops.iter().map(|op| op.key.as_slice()))?;
            let ops = write_ops(request.ops)?;
            let (sender, receiver) = oneshot::channel();
            self.backend.fast_write(
                shard,
                id,
                ops,
                Box::new(move |result| {
                    let _ = sender.send(result);
                }),
            );
            let node_id = self.node_id;
            Ok(Response::new(match self.await_done(receiver, "made durable").await? {
                FastAck::Applied { index } => {
                    FastWriteResponse { node_id, applied_index: index, ..Default::default() }
                }
                FastAck::Durable { term, leader, voters } => {
                    FastWriteResponse { node_id, applied_index: 0, term, leader, voters }
                }
            }))
        })
        .await
    }

    async fn cas(&self, request: Request<CasRequest>) -> Result<Response<CasResponse>, Status> {
        self.observed("cas", async move {
            let request = request.into_inner();
            let limits = &self.limits;
            check_written_key(limits, "key", &request.key)?;
            let mut bytes = request.key.len();
            for (field, value) in [("expected", &request.expected), ("new_value", &request.new_value)] {
                if let Some(value) = value {
                    check_value(limits, field, value)?;
                    bytes += value.len();
                }
            }
            check_write_bytes(limits, "cas", bytes)?;
            let shard = self.shard_of(&request.key)?;
            let new_expiry = expiry_of("new_expiry", request.new_expiry)?;
            let command = Command::Cas {
                key: request.key,
                expected: request.expected,
                new: request.new_value,
                new_expiry,
            };
            let outcome = self.commit(shard, request_id(request.request_id), command).await?;
            let Some(cas) = outcome.cas else {
                return Err(Status::internal(
                    "the replica applied a compare-and-swap without reporting its outcome",
                ));
            };
            Ok(Response::new(CasResponse {
                swapped: cas.swapped,
                found: cas.current.is_some(),
                current: cas.current.unwrap_or_default(),
                index: outcome.index,
            }))
        })
        .await
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        self.observed("txn", async move {
            let request = request.into_inner();
            for (i, op) in request.ops.iter().enumerate() {
                refuse_system_key(&format!("ops[{i}].key"), &op.key)?;
            }
            // Atomic within one shard only: keys of several are refused, naming them.
            let keys = request.conditions.iter().map(|c| c.key.as_slice());
            let shard = self.one_shard(keys.chain(request.ops.iter().map(|op| op.key.as_slice())))?;
            let conditions = request
                .conditions
                .into_iter()
                .map(|condition| Condition { key: condition.key, expected: condition.expected })
                .collect();
            let ops = write_ops(request.ops)?;
            let command = Command::Txn { conditions, ops };
            // The replica's own check (the one place transactions' limits are defined), before
            // proposing, so the refusal is INVALID_ARGUMENT like every other over-limit request.
            check_command(&self.limits, &command)?;
            let outcome = self.commit(shard, request_id(request.request_id), command).await?;
            let Some(applied) = outcome.cas else {
                return Err(Status::internal(
                    "the replica applied a transaction without reporting its outcome",
                ));
            };
            Ok(Response::new(TxnResponse { applied: applied.swapped, index: outcome.index }))
        })
        .await
    }

    async fn scan(&self, request: Request<ScanRequest>) -> Result<Response<ScanResponse>, Status> {
        self.observed("scan", async move {
            let request = request.into_inner();
            let limits = &self.limits;
            let consistency = Consistency::try_from(request.consistency).map_err(|_| {
                Status::invalid_argument(format!("unknown consistency {}", request.consistency))
            })?;
            check_len("start", request.start.len(), "limits.max_key_bytes", limits.max_key_bytes)?;
            check_len("end", request.end.len(), "limits.max_key_bytes", limits.max_key_bytes)?;
            if !request.end.is_empty() && request.start > request.end {
                return Err(Status::invalid_argument(
                    "start is after end; for newest-first order set reverse",
                ));
            }
            let limit = match request.limit as usize {
                0 => limits.max_scan_pairs,
                limit if limit > limits.max_scan_pairs => {
                    return Err(Status::invalid_argument(format!(
                        "limit is {limit}, over limits.max_scan_pairs = {}",
                        limits.max_scan_pairs
                    )));
                }
                limit => limit,
            };
            let shard = self.named_shard(request.shard, "scan needs a shard", "scan each")?;
            match consistency {
                Consistency::Linearizable => self.read_barrier(shard).await?,
                Consistency::Stale => self.refuse_stale(shard)?,
            }
            // A scan may read megabytes through many preads: keep it off the async workers.
            let backend = Arc::clone(&self.backend);
            // One pair more than asked: onekv's own key (the member list, at most one per shard)
            // is left out, and a full page must still be full without it.
            let (mut pairs, mut more) = tokio::task::spawn_blocking(move || {
                let end = (!request.end.is_empty()).then_some(request.end.as_slice());
                if request.keys_only {
                    backend.scan_keys(shard, &request.start, end, limit + 1, request.reverse)
                } else {
                    backend.scan(shard, &request.start, end, limit + 1, request.reverse)
                }
            })
            .await
            .map_err(|error| Status::internal(format!("scan failed: {error}")))?
            .map_err(|error| self.status_of_read(error))?;
            pairs.retain(|(key, _)| !is_system_key(key));
            if pairs.len() > limit {
                pairs.truncate(limit);
                more = true;
            }
            let pairs = pairs.into_iter().map(|(key, value)| KeyValue { key, value }).collect();
            Ok(Response::new(ScanResponse { pairs, more }))
        })
        .await
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        self.observed("delete_range", async move {
            let request = request.into_inner();
            let shard = self.named_shard(
                request.shard,
                "a range deletion needs a shard",
                "delete the range in each",
            )?;
            let limit = match request.limit {
                0 => RANGE_DELETE_PAGE_KEYS.min(u32::try_from(self.limits.max_batch_ops).unwrap_or(u32::MAX)),
                limit => limit,
            };
            let command = Command::DeleteRange {
                start: request.start,
                end: (!request.end.is_empty()).then_some(request.end),
                limit,
                spare: crate::members::SYSTEM_PREFIX.to_vec(),
            };
            // The replica's own check (bounds, order, page size), as for transactions.
            check_command(&self.limits, &command)?;
            let outcome = self.commit(shard, request_id(request.request_id), command).await?;
            let Some(page) = outcome.range else {
                return Err(Status::internal("the replica applied a range deletion without reporting it"));
            };
            Ok(Response::new(DeleteRangeResponse {
                deleted: page.deleted,
                more: page.resume.is_some(),
                resume: page.resume.unwrap_or_default(),
                index: outcome.index,
            }))
        })
        .await
    }

    async fn transfer_leader(
        &self,
        request: Request<TransferLeaderRequest>,
    ) -> Result<Response<TransferLeaderResponse>, Status> {
        self.observed("transfer_leader", async move {
            crate::auth::check_secret(self.secret.as_ref(), &request, "moving a shard's leadership")?;
            let request = request.into_inner();
            let shard = self.held(request.shard)?;
            let (sender, receiver) = oneshot::channel();
            self.backend.transfer_leadership(
                shard,
                request.to,
                Box::new(move |result| {
                    let _ = sender.send(result);
                }),
            );
            self.await_done(receiver, "started").await?;
            Ok(Response::new(TransferLeaderResponse {}))
        })
        .await
    }

    async fn change_members(
        &self,
        request: Request<ChangeMembersRequest>,
    ) -> Result<Response<MembersResponse>, Status> {
        self.observed("change_members", async move {
            crate::auth::check_secret(self.secret.as_ref(), &request, "changing a shard's members")?;
            let request = request.into_inner();
            let shard = self.held(request.shard)?;
            let change = onekv_replica::MembershipChange {
                add_learners: request.add_learners,
                promote: request.promote,
                remove: request.remove,
            };
            let (sender, receiver) = oneshot::channel();
            self.backend.change_members(
                shard,
                change,
                Box::new(move |result| {
                    let _ = sender.send(result);
                }),
            );
            let members = self.await_done(receiver, "applied").await?;
            Ok(Response::new(MembersResponse {
                voters: members.voters,
                learners: members.learners,
                outgoing_voters: members.outgoing_voters,
            }))
        })
        .await
    }

    async fn members(&self, request: Request<ReplicaRequest>) -> Result<Response<MembersResponse>, Status> {
        self.observed("members", async move {
            let shard = self.held(request.into_inner().shard)?;
            let (sender, receiver) = oneshot::channel();
            self.backend.read_barrier(
                shard,
                Box::new(move |result| {
                    let _ = sender.send(result);
                }),
            );
            self.await_done(receiver, "confirmed").await?;
            // After the barrier this replica led at the call and applied every change committed
            // before it. Its status is published at the end of each turn, so it may be the turn
            // before the one that answered: a change applied in that very turn may not show yet.
            let status = self.backend.status(shard).ok_or_else(|| {
                Status::unavailable(format!("shard {shard}'s replica left this node; retry"))
            })?;
            let members = status.members();
            Ok(Response::new(MembersResponse {
                voters: members.voters,
                learners: members.learners,
                outgoing_voters: members.outgoing_voters,
            }))
        })
        .await
    }

    async fn add_replica(
        &self,
        request: Request<ReplicaRequest>,
    ) -> Result<Response<ReplicaResponse>, Status> {
        self.observed("add_replica", async move {
            crate::auth::check_secret(self.secret.as_ref(), &request, "adding a replica")?;
            let shard = request.into_inner().shard;
            if self.map.shard(shard).is_none() {
                return Err(Status::invalid_argument(format!(
                    "shard {shard} does not exist: the cluster has shards 1..={}",
                    self.map.shard_count()
                )));
            }
            let backend = Arc::clone(&self.backend);
            // Creating the replica's trees and listing it writes and fsyncs.
            tokio::task::spawn_blocking(move || backend.add_replica(shard))
                .await
                .map_err(|e| Status::internal(format!("adding the replica panicked: {e}")))?
                .map_err(|error| self.status_of(error))?;
            Ok(Response::new(ReplicaResponse { shards: self.backend.shards() }))
        })
        .await
    }

    async fn remove_replica(
        &self,
        request: Request<ReplicaRequest>,
    ) -> Result<Response<ReplicaResponse>, Status> {
        self.observed("remove_replica", async move {
            crate::auth::check_secret(self.secret.as_ref(), &request, "removing a replica")?;
            let shard = request.into_inner().shard;
            let backend = Arc::clone(&self.backend);
            tokio::task::spawn_blocking(move || backend.remove_replica(shard))
                .await
                .map_err(|e| Status::internal(format!("removing the replica panicked: {e}")))?
                .map_err(|error| self.status_of(error))?;
            Ok(Response::new(ReplicaResponse { shards: self.backend.shards() }))
        })
        .await
    }

    async fn set_members(
        &self,
        request: Request<SetMembersRequest>,
    ) -> Result<Response<SetMembersResponse>, Status> {
        self.observed("set_members", async move {
            crate::auth::check_secret(self.secret.as_ref(), &request, "changing the member list")?;
            let request = request.into_inner();
            let members: Vec<ListedMember> = request
                .members
                .into_iter()
                .map(|member| ListedMember { id: member.id, address: member.address })
                .collect();
            for member in &members {
                crate::config::check_address(&member.address).map_err(|reason| {
                    Status::invalid_argument(format!(
                        "node {}'s address {:?} {reason}",
                        member.id, member.address
                    ))
                })?;
            }
            let wanted = MemberList::new(request.expected_epoch.saturating_add(1), members)
                .map_err(|error| Status::invalid_argument(format!("not a valid member list: {error}")))?;
            let shard = self.shard_of(MEMBERS_KEY)?;
            self.read_barrier(shard).await?;
            let stored = self.get_repaired(shard, MEMBERS_KEY).await?.map(|(value, _)| value);
            let current = match &stored {
                Some(bytes) => MemberList::decode(bytes).map_err(|error| {
                    Status::data_loss(format!("the stored member list does not decode: {error}"))
                })?,
                None => self.members.current().as_ref().clone(),
            };
            let answer = |list: &MemberList| SetMembersResponse {
                epoch: list.epoch,
                members: list
                    .members()
                    .iter()
                    .map(|member| Member { id: member.id, address: member.address.clone() })
                    .collect(),
            };
            if current == wanted {
                // Asked again after it succeeded: nothing to do.
                return Ok(Response::new(answer(&current)));
            }
            if stored.is_none() && current.epoch != 1 {
                // Only the first list (the configuration's) is not stored; a node that knows a
                // later one while the key is absent means the key was lost: refuse to guess.
                return Err(Status::aborted(format!(
                    "the member list is not stored although this node knows epoch {}; no change made",
                    current.epoch
                )));
            }
            if current.epoch != request.expected_epoch {
                return Err(Status::aborted(format!(
                    "the member list is at epoch {}, not {}: read it again (onekv status) and decide anew",
                    current.epoch, request.expected_epoch
                )));
            }
            one_member_changed(&current, &wanted)?;
            let command = Command::Cas {
                key: MEMBERS_KEY.to_vec(),
                expected: stored,
                new: Some(wanted.encode()),
                new_expiry: Expiry::Never,
            };
            let outcome = self.commit(shard, request_id(request.request_id), command).await?;
            if !outcome.cas.is_some_and(|cas| cas.swapped) {
                return Err(Status::aborted(
                    "the member list changed while this change was made; read it again and decide anew",
                ));
            }
            let directory = Arc::clone(&self.members);
            let adopted = wanted.clone();
            tokio::task::spawn_blocking(move || directory.adopt(adopted))
                .await
                .map_err(|error| Status::internal(format!("keeping the member list panicked: {error}")))?
                .map_err(|error| {
                    Status::internal(format!(
                        "the member list changed but this node cannot keep it: {error:#}"
                    ))
                })?;
            Ok(Response::new(answer(&wanted)))
        })
        .await
    }

    async fn status(&self, _request: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        self.observed("status", async move {
            let statuses = self.backend.statuses();
            let listed = self.members.current();
            // Node-wide figures summed over the replicas (user bytes, damaged values, ...); the Raft
            // fields, for older clients, are the replica of the lowest shard's; every replica is
            // listed in `shards`.
            let status = onekv_replica::ReplicaStatus::summarize(&statuses);
            let write_amplification = crate::metrics::write_amplification(&status);
            let shards = statuses
                .iter()
                .map(|s| onekv_proto::ShardStatus {
                    shard: s.shard,
                    leader_id: s.leader_id.unwrap_or(0),
                    term: s.term,
                    role: s.role.clone(),
                    commit_index: s.commit_index,
                    applied_index: s.applied_index,
                    flushed_index: s.flushed_index,
                    voters: s.voters.clone(),
                    learners: s.learners.clone(),
                    outgoing_voters: s.outgoing_voters.clone(),
                    recovery_replayed: s.recovery_replayed,
                    rejoining: s.rejoining,
                    last_index: s.last_index,
                    index_layout: s.index_layout.clone(),
                    index_sorted_runs: s.index_sorted_runs,
                    index_leveled: s.index_leveled,
                    last_leveling_ms: s.last_leveling_ms.unwrap_or(0),
                    fast_pending: s.fast_pending,
                    fast_from_record: s.fast_from_record,
                    fast_from_inline: s.fast_from_inline,
                })
                .collect();
            Ok(Response::new(StatusResponse {
                shard_count: self.map.shard_count(),
                cluster_map: self.map.encode(),
                shards,
                node_id: self.node_id,
                members: listed
                    .members()
                    .iter()
                    .map(|member| Member { id: member.id, address: member.address.clone() })
                    .collect(),
                members_epoch: listed.epoch,
                leader_id: status.leader_id.unwrap_or(0),
                term: status.term,
                role: status.role,
                commit_index: status.commit_index,
                applied_index: status.applied_index,
                first_index: status.first_index,
                last_index: status.last_index,
                storage_mode: status.storage.name().to_string(),
                log_bytes: status.log_bytes,
                bytes_written: status.bytes_written,
                user_bytes: status.user_bytes,
                write_amplification,
                flushed_index: status.flushed_index,
                failure: status.failure.unwrap_or_default(),
                followers: status
                    .followers
                    .iter()
                    .map(|f| onekv_proto::FollowerProgress {
                        id: f.id,
                        matched: f.matched,
                        state: f.state.clone(),
                        active: f.active,
                    })
                    .collect(),
                snapshot: status.snapshot.unwrap_or_default(),
                disk_free_bytes: status.disk.free_bytes,
                disk_alarm: status.disk.alarm.unwrap_or_default(),
                corrupt_values: status.corrupt_values,
                repaired_values: status.repaired_values,
                expired_keys_deleted: status.expired_keys_deleted,
                index_leveled_compaction_bytes: status.index_leveled_compaction_bytes,
                index_runs_compaction_bytes: status.index_runs_compaction_bytes,
                scrub: Some(onekv_proto::ScrubProgress {
                    enabled: status.scrub.enabled,
                    passes: status.scrub.passes,
                    values_checked: status.scrub.values_checked,
                    last_pass_finished_unix_ms: status.scrub.last_pass_finished_unix_ms,
                    last_pass_values: status.scrub.last_pass_values,
                    last_pass_corrupt: status.scrub.last_pass_corrupt,
                }),
                gc: Some(onekv_proto::GcProgress {
                    enabled: status.gc.enabled,
                    log_bytes: status.gc.log_bytes,
                    live_bytes: status.gc.live_bytes,
                    space_amp: status.gc.space_amp,
                    values_relocated: status.gc.values_relocated,
                    bytes_relocated: status.gc.bytes_relocated,
                    segments_reclaimed: status.gc.segments_reclaimed,
                    bytes_reclaimed: status.gc.bytes_reclaimed,
                    bytes_scanned: status.gc.bytes_scanned,
                    waiting: status.gc.waiting.clone().unwrap_or_default(),
                    last_error: status.gc.last_error.clone().unwrap_or_default(),
                    values_packed: status.gc.values_packed,
                    packed_raw_bytes: status.gc.packed_raw_bytes,
                    packed_bytes: status.gc.packed_bytes,
                }),
                peer_bytes_sent: status.peer_bytes_sent,
                dedup: (!status.dedup.mode.is_empty()
                    && (status.dedup.mode != "off" || status.dedup.references_applied > 0))
                    .then(|| onekv_proto::DedupProgress {
                        mode: status.dedup.mode.clone(),
                        inline_active: status.dedup.inline_active,
                        candidates: status.dedup.candidates,
                        inline_hits: status.dedup.inline_hits,
                        offline_hits: status.dedup.offline_hits,
                        snapshot_hits: status.dedup.snapshot_hits,
                        mismatches: status.dedup.mismatches,
                        bytes_saved: status.dedup.bytes_saved,
                        entries: status.dedup.entries,
                        switches: status.dedup.switches,
                        references_applied: status.dedup.references_applied,
                        late_references: status.dedup.late_references,
                    }),
            }))
        })
        .await
    }
}
