//! The `Client` handle: one method per operation of the `Kv` service, each run through the retry
//! loop, which is bounded in time (`ClientOptions::retry_budget`) so that it outlasts an election.
//!
//! Owns: request ids, the retry loop (which node to ask next, when to wait, when to give up), the
//! cluster map cache (which shard a key belongs to), fanning multi-shard operations out per shard
//! and merging scans, and the translation between the wire types and plain Rust values. Does not
//! own: the routing state (`routing`), the placement rules (`onekv-placement`) or the meaning of
//! each status (`retry`).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onekv_placement::ClusterMap;
use onekv_proto::kv_client::KvClient;
use onekv_proto::multi_call::Call;
use onekv_proto::multi_result::Result as Answer;
use onekv_proto::{
    BatchOp, BatchRequest, CasRequest, ChangeMembersRequest, Consistency, DeleteRangeRequest, DeleteRequest,
    GetRequest, GetResponse, Member, MembersResponse, MultiCall, PutRequest, ReplicaRequest, RequestId,
    ScanRequest, ScanResponse, SetMembersRequest, SetMembersResponse, StatusRequest, StatusResponse,
    TransferLeaderRequest, TxnCondition, TxnRequest, WriteResponse,
};
use tonic::Status;

use crate::coalesce::{Coalescer, Submitted};
use crate::error::{ClientError, Result};
use crate::retry::{Failure, backoff_delay, classify, timed_out};
use crate::routing::{ChannelSettings, Conn, Routing, normalize};

mod fast;
pub use fast::{BlindWrite, completes as fast_write_completes};

/// Largest response the client decodes. Scans return many pairs at once; tonic's default of 4 MiB
/// would turn a large page into an error.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// How a `Client` times out and retries.
///
/// A call retries (UNAVAILABLE, DEADLINE_EXCEEDED, a node that cannot be reached, a not-leader
/// answer) until it succeeds or `retry_budget` is spent, whichever comes first; `max_attempts` can
/// cap it further. The budget is a time, not a count, because what it must outlast is an election:
/// after a leader dies, followers name it for up to an election timeout (1–2 s with the server's
/// defaults) before they elect another, and a split vote takes another round.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// How long one attempt may take before the client gives up on it and retries elsewhere.
    pub request_timeout: Duration,
    /// How long one call may take, all its attempts and backoffs together. A retry is started only
    /// if its backoff ends within the budget, and no attempt runs past it. At least one attempt is
    /// always made (with a zero budget it gets the whole `request_timeout`). Default 10 s: a few
    /// election timeouts.
    pub retry_budget: Duration,
    /// Most attempts per call, counting the first and every redirect (at least 1 is always made).
    /// Default `u32::MAX`: no cap, the budget alone bounds the call.
    pub max_attempts: u32,
    /// The first backoff; it doubles after each one, up to `max_backoff`, and each is jittered
    /// (a random point in its upper half) so clients failing together do not retry in lockstep.
    pub backoff: Duration,
    /// The longest single backoff.
    pub max_backoff: Duration,
    /// How long establishing a connection to one node may take.
    pub connect_timeout: Duration,
    /// The cluster secret sent with the administrative calls (moving leadership, changing a
    /// shard's members, adding or removing a replica, changing the member list). Nodes refuse
    /// those calls without it (UNAUTHENTICATED); every other call ignores it. Default `None`.
    pub cluster_secret: Option<ClusterSecret>,
    /// Most `Multi` calls in flight to one node at once. Get, Put and Delete calls that wait for a
    /// node while this many are in flight go to it together in the next one, each still its own
    /// call (`coalesce`): under many concurrent callers that divides the per-call cost of gRPC
    /// on both sides, and a lone call is sent at once. 0 sends every call on its own. Default 4.
    pub calls_in_flight_per_node: usize,
    /// How long a fast write ([`Client::put_fast`]) waits for a fast quorum's answers before the Raft
    /// path with the same request id starts too (whichever finishes first answers). `None` (the
    /// default): adaptive, the recent fast round trips' average plus four times their deviation,
    /// between 5 and 250 ms (20 ms before the first).
    pub fast_path_wait: Option<Duration>,
}

/// The cluster secret (the hex text of a node's `peer_secret_file`) as a client sends it, in
/// `onekv-peer-secret` metadata. `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret(tonic::metadata::AsciiMetadataValue);

impl ClusterSecret {
    /// The secret from its text (surrounding whitespace ignored); the error never shows it. The
    /// header is marked sensitive, so HTTP/2 header compression never puts it in its tables.
    pub fn new(text: &str) -> Result<ClusterSecret> {
        let mut value = tonic::metadata::AsciiMetadataValue::try_from(text.trim()).map_err(|_| {
            ClientError::InvalidArgument("the cluster secret is not valid header text".into())
        })?;
        value.set_sensitive(true);
        Ok(ClusterSecret(value))
    }
}

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            request_timeout: Duration::from_secs(5),
            retry_budget: Duration::from_secs(10),
            max_attempts: u32::MAX,
            backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(2),
            cluster_secret: None,
            calls_in_flight_per_node: 4,
            fast_path_wait: None,
        }
    }
}

/// When a written key expires. Expired keys read as absent on every node at once and are deleted
/// in the background.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Expiry {
    /// Never (a write without an expiry drops any the key had).
    #[default]
    Never,
    /// This long after the shard's leader receives the write (at least 1 ms).
    After(std::time::Duration),
    /// At this Unix time, in ms (a time already past makes the key absent at once).
    AtUnixMs(u64),
    /// Keep the key's expiry as it is when the write applies (none if the key is absent).
    Keep,
}

impl Expiry {
    /// The request's form of it (`None` for [`Expiry::Never`]). A TTL shorter than a millisecond
    /// counts as one.
    fn to_proto(self) -> Option<onekv_proto::Expiry> {
        use onekv_proto::expiry::When;
        let when = match self {
            Expiry::Never => return None,
            Expiry::After(ttl) => When::TtlMs(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)),
            Expiry::AtUnixMs(at) => When::AtUnixMs(at),
            Expiry::Keep => When::Keep(true),
        };
        Some(onekv_proto::Expiry { when: Some(when) })
    }
}

/// One write of a transaction or batch that may set an expiry: `value` `None` deletes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteItem {
    /// The key.
    pub key: Vec<u8>,
    /// The new value; `None` deletes.
    pub value: Option<Vec<u8>>,
    /// When a put's key expires.
    pub expiry: Expiry,
}

/// The outcome of a compare-and-swap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CasResult {
    /// Whether the key held the expected value, so the new value was written.
    pub swapped: bool,
    /// The key's value after the operation (`None`: absent): the new value if it swapped, the
    /// unchanged current value if not.
    pub current: Option<Vec<u8>>,
    /// The Raft log index the operation was applied at.
    pub index: u64,
}

/// The outcome of a transaction ([`Client::txn`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnResult {
    /// Whether every condition held, so every op was applied.
    pub applied: bool,
    /// The Raft log index the transaction was committed at (applied or not).
    pub index: u64,
}

/// One page of a scan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanPage {
    /// Key-value pairs in scan order.
    pub pairs: Vec<(Vec<u8>, Vec<u8>)>,
    /// True when the range holds more pairs than were returned. To continue a forward scan, start
    /// at the last key followed by a zero byte; a reverse scan, end at the last key.
    pub more: bool,
}

/// One page of a keys-only scan ([`Client::scan_keys`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyPage {
    /// Keys in scan order.
    pub keys: Vec<Vec<u8>>,
    /// True when the range holds more keys than were returned; continue as with [`ScanPage`].
    pub more: bool,
}

/// A handle on a onekv cluster. Cheap to clone; clones share connections, the cached leader and
/// the request-id sequence, and may be used from many tasks at once.
///
/// Connections are made lazily, on the first request that needs them, so the first call must run
/// inside a tokio runtime, and the client should be used within that one runtime.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Vec<String>,
    options: ClientOptions,
    routing: Routing,
    /// The cluster map, fetched from any node on first need and kept.
    placement: Mutex<Option<Arc<ClusterMap>>>,
    /// Random per client, so two clients' request ids never collide on the server.
    client_id: u64,
    /// The last `seq` handed out; 0 means "no id" on the wire, so ids start at 1.
    last_seq: AtomicU64,
    /// Sends waiting Get, Put and Delete calls to a node together; `None` when
    /// `calls_in_flight_per_node` is 0.
    coalescer: Option<Coalescer>,
    /// The fast path's addresses, voters and waits ([`Client::put_fast`]).
    fast: fast::FastPath,
}

/// The map of a cluster that says nothing of shards (an older server): one shard, held by every
/// node.
fn single_shard_map(nodes: &[u64]) -> ClusterMap {
    let nodes: Vec<u64> = if nodes.is_empty() { vec![1] } else { nodes.to_vec() };
    ClusterMap::build(&nodes, 1, nodes.len().min(onekv_placement::MAX_REPLICAS as usize) as u32)
        .expect("one shard on distinct, non-zero nodes always places")
}

/// Shards whose part of a range deletion [`Client::delete_range`] runs at once. Each runs one page
/// after another, and every replica applies each page on its node's loop: a few at a time leave
/// the nodes room for other writes (all 16 of a default cluster at once tripled a concurrent
/// writer's median latency compared with 2).
const RANGE_DELETION_SHARDS_AT_ONCE: usize = 2;

/// Which nodes may serve a call.
#[derive(Debug, Clone, Copy)]
enum Route<'a> {
    /// The leader of a shard: start at its cached leader, follow redirects, cache whoever answers.
    Leader(u64),
    /// Any node, round-robin.
    AnyNode,
    /// This node only, one attempt.
    Exactly(&'a str),
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("endpoints", &self.inner.endpoints)
            .field("leader", &self.cached_leader())
            .field("client_id", &self.inner.client_id)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client for the cluster reachable at `endpoints` (`host:port`, or `http://host:port`).
    /// Connects nothing yet; fails only if the list is empty or an address is malformed.
    pub fn new(endpoints: Vec<String>, options: ClientOptions) -> Result<Client> {
        let mut normalized: Vec<String> = Vec::with_capacity(endpoints.len());
        for endpoint in &endpoints {
            let endpoint = normalize(endpoint)?;
            if !normalized.contains(&endpoint) {
                normalized.push(endpoint);
            }
        }
        if normalized.is_empty() {
            return Err(ClientError::NoEndpoints);
        }
        let settings = ChannelSettings { connect_timeout: options.connect_timeout };
        Ok(Client {
            inner: Arc::new(Inner {
                routing: Routing::new(normalized.clone(), settings),
                placement: Mutex::new(None),
                endpoints: normalized,
                client_id: rand::random::<u64>().max(1),
                last_seq: AtomicU64::new(0),
                coalescer: (options.calls_in_flight_per_node > 0)
                    .then(|| Coalescer::new(options.calls_in_flight_per_node, options.request_timeout)),
                fast: fast::FastPath::default(),
                options,
            }),
        })
    }

    /// Sends every call for `endpoint` to `service`, in this process, instead of over a connection:
    /// a node's own front ends (the Redis protocol) reach the node they run in without a network
    /// round trip, gRPC framing or a trip through the kernel. Everything else (routing, redirects,
    /// retries, request ids) is as for any endpoint.
    pub fn serve_locally(&self, endpoint: &str, service: LocalKv) -> Result<()> {
        self.inner.routing.serve_locally(normalize(endpoint)?, service);
        Ok(())
    }

    /// The endpoints the client was created with (normalized to `host:port`, without duplicates).
    /// Leader addresses learnt from redirects are used too but not listed here.
    pub fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    /// The endpoint that last answered as leader of the lowest shard that has one, if any.
    pub fn cached_leader(&self) -> Option<String> {
        let shards = self.placement_now().map_or(1, |map| map.shard_count());
        (1..=u64::from(shards)).find_map(|shard| self.inner.routing.leader(shard))
    }

    /// The endpoint that last answered as leader of `shard`, if any.
    pub fn cached_leader_of(&self, shard: u64) -> Option<String> {
        self.inner.routing.leader(shard)
    }

    /// The cluster map: which shard each key belongs to and which nodes hold it. Fetched from any
    /// node on first need (retried within the budget), then kept.
    pub async fn cluster_map(&self) -> Result<Arc<ClusterMap>> {
        self.placement().await
    }

    /// The shard `key` belongs to.
    pub async fn shard_of(&self, key: &[u8]) -> Result<u64> {
        Ok(self.placement().await?.shard_of_key(key))
    }

    fn placement_now(&self) -> Option<Arc<ClusterMap>> {
        self.inner.placement.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    async fn placement(&self) -> Result<Arc<ClusterMap>> {
        if let Some(placement) = self.placement_now() {
            return Ok(placement);
        }
        // Each known node once, in order (leaving the round-robin cursor where it is); if none
        // answers, retried within the budget like any call (the cluster may be starting).
        let mut answered = None;
        for endpoint in self.inner.routing.known() {
            if let Ok(status) = self.status(&endpoint).await {
                answered = Some(status);
                break;
            }
        }
        let status = match answered {
            Some(status) => status,
            None => {
                self.call(Route::AnyNode, StatusRequest {}, |_, mut kv, r| async move { kv.status(r).await })
                    .await?
            }
        };
        let placement = match status.cluster_map.is_empty() {
            true => {
                let nodes: Vec<u64> = status.members.iter().map(|member| member.id).collect();
                single_shard_map(&nodes)
            }
            false => ClusterMap::decode(&status.cluster_map)
                .map_err(|error| ClientError::Server(format!("the cluster map does not decode: {error}")))?,
        };
        // Until a request of a shard is served, its primary (preferred leader) is asked first,
        // when the client knows it at the address the node names (a node's view of its peers'
        // addresses may not be the client's: a proxy, another network).
        self.inner.fast.learn_addresses(
            status.members.iter().filter_map(|member| Some((member.id, normalize(&member.address).ok()?))),
        );
        let known = self.inner.routing.known();
        let addresses: HashMap<u64, String> = status
            .members
            .iter()
            .filter_map(|member| normalize(&member.address).ok().map(|address| (member.id, address)))
            .filter(|(_, address)| known.contains(address))
            .collect();
        for shard in &placement.shards {
            if let Some(address) = shard.replicas.first().and_then(|primary| addresses.get(primary)) {
                self.inner.routing.guess_leader(shard.id, address);
            }
        }
        let placement = Arc::new(placement);
        *self.inner.placement.lock().unwrap_or_else(|e| e.into_inner()) = Some(placement.clone());
        Ok(placement)
    }

    /// The leader route of `key`'s shard.
    async fn route_of(&self, key: &[u8]) -> Result<Route<'static>> {
        Ok(Route::Leader(self.shard_of(key).await?))
    }

    /// The value of `key`, read linearizably from its shard's leader (`None`: absent).
    pub async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.get_with_expiry(key).await?.map(|(value, _)| value))
    }

    /// [`Client::get`] with the key's expiry time in ms since the Unix epoch (`None`: it never
    /// expires).
    pub async fn get_with_expiry(&self, key: &[u8]) -> Result<Option<(Vec<u8>, Option<u64>)>> {
        let route = self.route_of(key).await?;
        let request = GetRequest { key: key.to_vec(), consistency: Consistency::Linearizable.into() };
        let response = self.call(route, request, |at, kv, r| self.get_at(at, kv, r)).await?;
        Ok(found_with_expiry(response))
    }

    /// The value of `key` as some node has applied it, possibly stale: from `endpoint` alone (one
    /// attempt, no retry) if given, else from any node, round-robin with retries.
    pub async fn get_stale(&self, key: &[u8], endpoint: Option<&str>) -> Result<Option<Vec<u8>>> {
        Ok(self.get_stale_with_expiry(key, endpoint).await?.map(|(value, _)| value))
    }

    /// [`Client::get_stale`] with the key's expiry time, as [`Client::get_with_expiry`].
    pub async fn get_stale_with_expiry(
        &self,
        key: &[u8],
        endpoint: Option<&str>,
    ) -> Result<Option<(Vec<u8>, Option<u64>)>> {
        let request = GetRequest { key: key.to_vec(), consistency: Consistency::Stale.into() };
        let route = endpoint.map_or(Route::AnyNode, Route::Exactly);
        let response = self.call(route, request, |at, kv, r| self.get_at(at, kv, r)).await?;
        Ok(found_with_expiry(response))
    }

    /// Sets `key` to `value`; returns the Raft log index it was applied at.
    pub async fn put(&self, key: &[u8], value: &[u8]) -> Result<u64> {
        self.put_with_expiry(key, value, Expiry::Never).await
    }

    /// [`Client::put`] with an expiry for the key.
    pub async fn put_with_expiry(&self, key: &[u8], value: &[u8], expiry: Expiry) -> Result<u64> {
        let route = self.route_of(key).await?;
        let request = PutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
            request_id: Some(self.next_id()),
            expiry: expiry.to_proto(),
        };
        let response =
            self.call(route, request, |at, kv, r| self.write_at(at, kv, Call::Put(r.into_inner()))).await?;
        Ok(response.index)
    }

    /// Deletes `key` (deleting an absent key succeeds); returns the Raft log index.
    pub async fn delete(&self, key: &[u8]) -> Result<u64> {
        let route = self.route_of(key).await?;
        let request = DeleteRequest { key: key.to_vec(), request_id: Some(self.next_id()) };
        let response = self
            .call(route, request, |at, kv, r| self.write_at(at, kv, Call::Delete(r.into_inner())))
            .await?;
        Ok(response.index)
    }

    /// Applies all `ops` atomically, in order: `(key, Some(value))` puts, `(key, None)` deletes.
    /// Returns the Raft log index. A batch is atomic within one shard: keys of several shards are
    /// refused ([`ClientError::InvalidArgument`], naming them) before anything is sent. Give keys
    /// that change together a common `{hash tag}`, or use [`Client::batch_per_shard`].
    pub async fn batch(&self, ops: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<u64> {
        let placement = self.placement().await?;
        let mut by_shard = split_by_shard(&placement, ops);
        if by_shard.len() > 1 {
            let shards: Vec<String> = by_shard.keys().map(u64::to_string).collect();
            return Err(ClientError::InvalidArgument(format!(
                "the batch's keys belong to shards {}: a batch is atomic within one shard only; give \
                 related keys a common {{hash tag}} or use batch_per_shard",
                shards.join(", ")
            )));
        }
        let Some((shard, ops)) = by_shard.pop_first() else {
            return Err(ClientError::InvalidArgument("batch has no operations".into()));
        };
        self.batch_in(shard, ops).await
    }

    /// Applies `ops` split by shard: the operations of each shard atomically and in their order,
    /// the shards concurrently and independently (not atomic across shards: if one shard's part
    /// fails, the others may have applied). For multi-key commands whose keys may lie anywhere
    /// (MSET, DEL of many keys).
    pub async fn batch_per_shard(&self, ops: Vec<BatchItem>) -> Result<()> {
        self.per_shard(ops, false).await
    }

    /// [`Client::batch_per_shard`], each shard's part by the fast path when `fast`
    /// ([`Client::batch_fast`]).
    async fn per_shard(&self, ops: Vec<BatchItem>, fast: bool) -> Result<()> {
        let placement = self.placement().await?;
        let parts = split_by_shard(&placement, ops);
        let mut tasks = tokio::task::JoinSet::new();
        for (shard, ops) in parts {
            let client = self.clone();
            tasks.spawn(async move {
                match fast {
                    true => client.write_fast(shard, fast::batch_ops(ops)).await.map(drop),
                    false => client.batch_in(shard, ops).await.map(drop),
                }
            });
        }
        let mut failure = None;
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => failure = failure.or(Some(error)),
                Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
                Err(_) => failure = failure.or(Some(ClientError::Transport("batch task cancelled".into()))),
            }
        }
        failure.map_or(Ok(()), Err)
    }

    async fn batch_in(&self, shard: u64, ops: Vec<BatchItem>) -> Result<u64> {
        let ops = ops.into_iter().map(|(key, value)| BatchOp { key, value, expiry: None }).collect();
        let request = BatchRequest { ops, request_id: Some(self.next_id()) };
        let response =
            self.call(Route::Leader(shard), request, |_, mut kv, r| async move { kv.batch(r).await }).await?;
        Ok(response.index)
    }

    /// If `key` currently holds `expected` (`None`: the key must be absent), sets it to `new`
    /// (`None`: deletes it).
    pub async fn cas(&self, key: &[u8], expected: Option<&[u8]>, new: Option<&[u8]>) -> Result<CasResult> {
        self.cas_with_expiry(key, expected, new, Expiry::Never).await
    }

    /// [`Client::cas`] with an expiry for the new value's key. A key that has expired counts as
    /// absent for `expected`.
    pub async fn cas_with_expiry(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
        new_expiry: Expiry,
    ) -> Result<CasResult> {
        let route = self.route_of(key).await?;
        let request = CasRequest {
            key: key.to_vec(),
            expected: expected.map(<[u8]>::to_vec),
            new_value: new.map(<[u8]>::to_vec),
            request_id: Some(self.next_id()),
            new_expiry: new_expiry.to_proto(),
        };
        let response = self.call(route, request, |_, mut kv, r| async move { kv.cas(r).await }).await?;
        Ok(CasResult {
            swapped: response.swapped,
            current: response.found.then_some(response.current),
            index: response.index,
        })
    }

    /// A conditional transaction, one Raft entry: if every `(key, expected)` condition holds
    /// (`expected` `None`: the key must be absent), applies every op (`(key, Some(value))` puts,
    /// `(key, None)` deletes) atomically; otherwise changes nothing. Whether it applied.
    /// Conditions compare values: a key changed and changed back still matches. Atomic within
    /// one shard: keys of several shards are refused ([`ClientError::InvalidArgument`], naming
    /// them) before anything is sent; give them a common `{hash tag}`.
    pub async fn txn(
        &self,
        conditions: Vec<(Vec<u8>, Option<Vec<u8>>)>,
        ops: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    ) -> Result<TxnResult> {
        let ops =
            ops.into_iter().map(|(key, value)| WriteItem { key, value, expiry: Expiry::Never }).collect();
        self.txn_with_expiry(conditions, ops).await
    }

    /// [`Client::txn`] whose ops may set expiries. A key that has expired counts as absent for the
    /// conditions.
    pub async fn txn_with_expiry(
        &self,
        conditions: Vec<(Vec<u8>, Option<Vec<u8>>)>,
        ops: Vec<WriteItem>,
    ) -> Result<TxnResult> {
        let placement = self.placement().await?;
        let shards: std::collections::BTreeSet<u64> = conditions
            .iter()
            .map(|(key, _)| key)
            .chain(ops.iter().map(|op| &op.key))
            .map(|key| placement.shard_of_key(key))
            .collect();
        if shards.len() > 1 {
            let list: Vec<String> = shards.iter().map(u64::to_string).collect();
            return Err(ClientError::InvalidArgument(format!(
                "the transaction's keys belong to shards {}: a transaction is atomic within one shard \
                 only; give its keys a common {{hash tag}}",
                list.join(", ")
            )));
        }
        let route = Route::Leader(shards.into_iter().next().unwrap_or(1));
        let request = TxnRequest {
            conditions: conditions
                .into_iter()
                .map(|(key, expected)| TxnCondition { key, expected })
                .collect(),
            ops: ops
                .into_iter()
                .map(|op| BatchOp { key: op.key, value: op.value, expiry: op.expiry.to_proto() })
                .collect(),
            request_id: Some(self.next_id()),
        };
        let response = self.call(route, request, |_, mut kv, r| async move { kv.txn(r).await }).await?;
        Ok(TxnResult { applied: response.applied, index: response.index })
    }

    /// Up to `limit` pairs (0: the node's maximum) with `start <= key < end` (`end` `None`: no end),
    /// ascending, or descending from the last key below `end` if `reverse`. Every shard is asked
    /// (its leader, concurrently) and the ordered streams merged: linearizable per shard, not a
    /// snapshot across shards.
    pub async fn scan(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: u32,
        reverse: bool,
    ) -> Result<ScanPage> {
        let response = self.scan_call(start, end, limit, reverse, false).await?;
        Ok(ScanPage {
            pairs: response.pairs.into_iter().map(|pair| (pair.key, pair.value)).collect(),
            more: response.more,
        })
    }

    /// [`Client::scan`] for the keys alone: the node reads no value, so counting or listing keys
    /// costs index lookups, not a read of every value. A page may hold more keys than a full scan's
    /// (only key bytes count against the node's byte bound), never more than `limit`. Linearizable.
    pub async fn scan_keys(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: u32,
        reverse: bool,
    ) -> Result<KeyPage> {
        let response = self.scan_call(start, end, limit, reverse, true).await?;
        // A node that predates `keys_only` sends the values anyway; they are dropped here.
        Ok(KeyPage { keys: response.pairs.into_iter().map(|pair| pair.key).collect(), more: response.more })
    }

    /// One linearizable scan of every shard, merged into one page.
    async fn scan_call(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: u32,
        reverse: bool,
        keys_only: bool,
    ) -> Result<ScanResponse> {
        let placement = self.placement().await?;
        let shards = placement.shard_count();
        let request = ScanRequest {
            start: start.to_vec(),
            end: end.map(<[u8]>::to_vec).unwrap_or_default(),
            limit,
            reverse,
            consistency: Consistency::Linearizable.into(),
            keys_only,
            shard: if shards == 1 { 0 } else { 1 },
        };
        if shards == 1 {
            return self
                .call(Route::Leader(1), request, |_, mut kv, r| async move { kv.scan(r).await })
                .await;
        }
        let mut tasks = tokio::task::JoinSet::new();
        for shard in 1..=u64::from(shards) {
            let client = self.clone();
            let request = ScanRequest { shard, ..request.clone() };
            tasks.spawn(async move {
                client
                    .call(Route::Leader(shard), request, |_, mut kv, r| async move { kv.scan(r).await })
                    .await
            });
        }
        let mut pages = Vec::with_capacity(shards as usize);
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(page) => pages.push(page?),
                Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
                Err(_) => return Err(ClientError::Transport("scan task cancelled".into())),
            }
        }
        Ok(merge_pages(pages, limit, reverse))
    }

    /// Deletes every key with `start <= key < end` (`end` `None`: no end; onekv's own keys under
    /// `"\xffonekv/"` are left), in every shard, and returns how many keys were deleted. Each
    /// shard's leader is asked for pages of at most `limits.max_batch_ops` keys (1024 by default),
    /// one Raft entry each, until its part of the range is empty; the shards go concurrently. No
    /// key travels over the network: every replica finds the page's keys in its own index. Not
    /// atomic: a reader meanwhile sees some keys gone and others not, and a write that races the
    /// deletion may be deleted or kept. Retried calls are safe (a page run twice deletes only what
    /// is there).
    pub async fn delete_range(&self, start: &[u8], end: Option<&[u8]>) -> Result<u64> {
        if end.is_some_and(|end| end <= start) {
            // An empty range (the request's empty `end` would mean "no end": never send one).
            return Ok(0);
        }
        let placement = self.placement().await?;
        let shards = placement.shard_count();
        let mut tasks = tokio::task::JoinSet::new();
        let at_once = Arc::new(tokio::sync::Semaphore::new(RANGE_DELETION_SHARDS_AT_ONCE));
        for shard in 1..=u64::from(shards) {
            let client = self.clone();
            let (start, end) = (start.to_vec(), end.map(<[u8]>::to_vec).unwrap_or_default());
            let at_once = Arc::clone(&at_once);
            tasks.spawn(async move {
                let _turn = at_once.acquire_owned().await.expect("the semaphore is never closed");
                let mut request = DeleteRangeRequest {
                    shard: if shards == 1 { 0 } else { shard },
                    start,
                    end,
                    limit: 0,
                    request_id: None,
                };
                let mut deleted = 0;
                loop {
                    request.request_id = Some(client.next_id());
                    let page = client
                        .call(Route::Leader(shard), request.clone(), |_, mut kv, r| async move {
                            kv.delete_range(r).await
                        })
                        .await?;
                    deleted += page.deleted;
                    if !page.more {
                        return Ok::<u64, ClientError>(deleted);
                    }
                    request.start = page.resume;
                }
            });
        }
        let mut deleted = 0;
        let mut failure = None;
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Ok(count)) => deleted += count,
                Ok(Err(error)) => failure = failure.or(Some(error)),
                Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
                Err(_) => {
                    failure = failure.or(Some(ClientError::Transport("range deletion task cancelled".into())))
                }
            }
        }
        failure.map_or(Ok(deleted), Err)
    }

    /// Asks the leader of `shard` to hand its leadership to `to` (a voter of the shard). Returns
    /// once the hand-off has started; [`Client::status_all`] shows when `to` leads. `to` stays the
    /// shard's preferred leader until its node restarts. Needs the cluster secret
    /// ([`ClientOptions::cluster_secret`]), as every call that changes where data lives does.
    pub async fn transfer_leadership(&self, shard: u64, to: u64) -> Result<()> {
        let request = TransferLeaderRequest { shard, to };
        self.call(Route::Leader(shard), request, |_, mut kv, r| async move {
            kv.transfer_leader(self.with_secret(r)).await
        })
        .await?;
        Ok(())
    }

    /// Asks the leader of `shard` to change its members by one step (see
    /// `onekv_replica::MembershipChange`); returns the members once the step is applied on the
    /// leader. A step refused (one pending, a learner not caught up, the leader removing itself)
    /// comes back as [`ClientError::InvalidArgument`] with the reason. Needs the cluster secret.
    pub async fn change_members(
        &self,
        shard: u64,
        add_learners: Vec<u64>,
        promote: Vec<u64>,
        remove: Vec<u64>,
    ) -> Result<MembersResponse> {
        let request = ChangeMembersRequest { shard, add_learners, promote, remove };
        self.call(Route::Leader(shard), request, |_, mut kv, r| async move {
            kv.change_members(self.with_secret(r)).await
        })
        .await
    }

    /// The members of `shard` as its leader applied them, after it confirmed its leadership with
    /// a quorum (see `Kv.Members`).
    pub async fn members(&self, shard: u64) -> Result<MembersResponse> {
        let request = ReplicaRequest { shard };
        self.call(Route::Leader(shard), request, |_, mut kv, r| async move { kv.members(r).await }).await
    }

    /// Creates a replica of `shard` on the node at `endpoint` (nothing if it has one), empty and
    /// waiting to be added to the shard as a learner; returns the shards that node hosts. Needs the
    /// cluster secret.
    pub async fn add_replica(&self, endpoint: &str, shard: u64) -> Result<Vec<u64>> {
        let request = ReplicaRequest { shard };
        let response = self
            .call(Route::Exactly(endpoint), request, |_, mut kv, r| async move {
                kv.add_replica(self.with_secret(r)).await
            })
            .await?;
        Ok(response.shards)
    }

    /// Removes the replica of `shard` from the node at `endpoint` (nothing if it has none); the
    /// caller has checked with the shard's leader that the node is no longer a member. Returns the
    /// shards that node hosts. Needs the cluster secret.
    pub async fn remove_replica(&self, endpoint: &str, shard: u64) -> Result<Vec<u64>> {
        let request = ReplicaRequest { shard };
        let response = self
            .call(Route::Exactly(endpoint), request, |_, mut kv, r| async move {
                kv.remove_replica(self.with_secret(r)).await
            })
            .await?;
        Ok(response.shards)
    }

    /// Changes the cluster's member list from `expected_epoch` to `members` (at the next epoch)
    /// through the leader of the shard that keeps it (see `Kv.SetMembers`); returns the list then
    /// in force and its epoch. Safe to retry; a list that moved on meanwhile comes back as
    /// [`ClientError::NotApplied`] with the reason (nothing changed).
    ///
    /// Needs the cluster secret ([`ClientOptions::cluster_secret`]): a member list says where the
    /// nodes send their Raft messages, so only those who hold the secret may change it.
    pub async fn set_members(&self, expected_epoch: u64, members: Vec<Member>) -> Result<SetMembersResponse> {
        let route = self.route_of(onekv_placement::MEMBERS_KEY).await?;
        let request = SetMembersRequest { expected_epoch, members, request_id: Some(self.next_id()) };
        self.call(route, request, |_, mut kv, r| async move { kv.set_members(self.with_secret(r)).await })
            .await
    }

    /// `request` with the cluster secret in its metadata, if the client has one.
    fn with_secret<T>(&self, mut request: tonic::Request<T>) -> tonic::Request<T> {
        if let Some(ClusterSecret(secret)) = &self.inner.options.cluster_secret {
            request.metadata_mut().insert(onekv_proto::PEER_SECRET_METADATA, secret.clone());
        }
        request
    }

    /// The status of the node at `endpoint`: one attempt, no retry, no redirect.
    pub async fn status(&self, endpoint: &str) -> Result<StatusResponse> {
        self.call(
            Route::Exactly(endpoint),
            StatusRequest {},
            |_, mut kv, r| async move { kv.status(r).await },
        )
        .await
    }

    /// The status of every endpoint the client knows (the configured ones, then any leader learnt
    /// from a redirect), asked concurrently, in that order.
    pub async fn status_all(&self) -> Vec<(String, Result<StatusResponse>)> {
        let endpoints = self.inner.routing.known();
        let mut tasks = tokio::task::JoinSet::new();
        for (position, endpoint) in endpoints.iter().enumerate() {
            let client = self.clone();
            let endpoint = endpoint.clone();
            tasks.spawn(async move { (position, client.status(&endpoint).await) });
        }
        let mut results: Vec<Option<Result<StatusResponse>>> = endpoints.iter().map(|_| None).collect();
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((position, result)) => results[position] = Some(result),
                Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
                Err(_) => {} // Cancelled: cannot happen, the set is never aborted; reported below.
            }
        }
        endpoints
            .into_iter()
            .zip(results)
            .map(|(endpoint, result)| {
                let result =
                    result.unwrap_or_else(|| Err(ClientError::Transport("status task cancelled".into())));
                (endpoint, result)
            })
            .collect()
    }

    /// A fresh request id. Every retry of one call reuses it: that is what lets the server apply a
    /// retried write at most once.
    fn next_id(&self) -> RequestId {
        RequestId {
            client: self.inner.client_id,
            seq: self.inner.last_seq.fetch_add(1, Ordering::Relaxed) + 1,
        }
    }

    /// One attempt of a Get at `endpoint`, coalesced with the other calls waiting for that node.
    fn get_at<'c>(
        &'c self,
        endpoint: &str,
        kv: KvClient<Conn>,
        request: tonic::Request<GetRequest>,
    ) -> impl Future<Output = std::result::Result<tonic::Response<GetResponse>, Status>> + use<'c> {
        let endpoint = endpoint.to_owned();
        async move {
            match self.coalesced(&endpoint, kv, Call::Get(request.into_inner())).await? {
                Answer::Get(found) => Ok(tonic::Response::new(found)),
                _ => Err(Status::internal("the node answered a Get with another call's result")),
            }
        }
    }

    /// One attempt of a Put or a Delete at `endpoint`, coalesced with the other calls waiting for
    /// that node.
    fn write_at<'c>(
        &'c self,
        endpoint: &str,
        kv: KvClient<Conn>,
        call: Call,
    ) -> impl Future<Output = std::result::Result<tonic::Response<WriteResponse>, Status>> + use<'c> {
        let endpoint = endpoint.to_owned();
        async move {
            match self.coalesced(&endpoint, kv, call).await? {
                Answer::Write(written) => Ok(tonic::Response::new(written)),
                _ => Err(Status::internal("the node answered a write with another call's result")),
            }
        }
    }

    /// Sends `call` to `endpoint` in a `Multi` with whatever else waits for that node, or alone
    /// when coalescing is off, the node predates `Multi`, or it is served in this process (no
    /// per-call network cost to save; coalescing would only make calls wait for each other).
    async fn coalesced(
        &self,
        endpoint: &str,
        mut kv: KvClient<Conn>,
        call: Call,
    ) -> std::result::Result<Answer, Status> {
        let call = match &self.inner.coalescer {
            Some(coalescer) if !self.inner.routing.is_local(endpoint) => {
                match coalescer.submit(endpoint, kv.clone(), MultiCall { call: Some(call) }).await {
                    Submitted::Answered(answer) => return answer,
                    Submitted::Unsupported(MultiCall { call: Some(call) }) => call,
                    Submitted::Unsupported(MultiCall { call: None }) => unreachable!("submitted with a call"),
                }
            }
            _ => call,
        };
        match call {
            Call::Get(get) => Ok(Answer::Get(kv.get(get).await?.into_inner())),
            Call::Put(put) => Ok(Answer::Write(kv.put(put).await?.into_inner())),
            Call::Delete(delete) => Ok(Answer::Write(kv.delete(delete).await?.into_inner())),
            Call::FastWrite(write) => Ok(Answer::FastWrite(kv.fast_write(write).await?.into_inner())),
        }
    }

    /// Runs `rpc` with `request` along `route` until it succeeds, fails in a way retrying cannot
    /// fix, the retry budget is spent or `max_attempts` attempts were made. Every attempt sends the
    /// same `request`, so a write keeps its request id across all of them.
    async fn call<Req, Resp, Rpc, Fut>(&self, route: Route<'_>, request: Req, rpc: Rpc) -> Result<Resp>
    where
        Req: Clone,
        Rpc: Fn(&str, KvClient<Conn>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        let routing = &self.inner.routing;
        let options = &self.inner.options;
        if let Route::Exactly(endpoint) = route {
            let endpoint = normalize(endpoint)?;
            let started = Instant::now();
            return self
                .attempt(&endpoint, &request, &rpc, options.request_timeout)
                .await
                .map_err(|failure| failure.into_single_node_error(started.elapsed()));
        }
        let started = Instant::now();
        let deadline = started.checked_add(options.retry_budget);
        let max_attempts = options.max_attempts.max(1);
        let mut attempts = 0;
        let mut redirect_to: Option<String> = None;
        let mut last_failed: Option<String> = None;
        let mut backoffs = 0;
        let mut previous_was_redirect = false;
        let mut previous_cause: Option<String> = None;
        let last_cause = loop {
            attempts += 1;
            let endpoint = match (redirect_to.take(), route) {
                (Some(leader), _) => leader,
                (None, Route::Leader(shard)) => routing.leader_or_next(shard, last_failed.as_deref()),
                (None, _) => routing.next(last_failed.as_deref()),
            };
            // No attempt runs past the budget; only the first may have the whole request timeout
            // when the budget is zero.
            let left = deadline.map_or(options.request_timeout, |deadline| {
                deadline.saturating_duration_since(Instant::now())
            });
            let timeout = match options.request_timeout.min(left) {
                Duration::ZERO if attempts == 1 => options.request_timeout,
                timeout => timeout,
            };
            let failure = match self.attempt(&endpoint, &request, &rpc, timeout).await {
                Ok(response) => {
                    if let Route::Leader(shard) = route {
                        routing.set_leader(shard, &endpoint);
                    }
                    return Ok(response);
                }
                Err(Failure::Fatal(error)) => return Err(error),
                Err(failure) => failure,
            };
            // Whatever went wrong, this node is not serving as leader for us right now: a failed
            // node, a node shutting down, a follower without a leader, or one that is unreachable.
            if let Route::Leader(shard) = route {
                routing.forget_leader(shard, &endpoint);
            }
            let (cause, wait) = match failure {
                Failure::Redirect { leader, cause } => {
                    routing.learn(&leader);
                    if routing.is_unreachable(&leader) {
                        // The node named as leader refused a connection moments ago: the node
                        // redirecting here has not yet noticed that the leader is gone (it will
                        // once an election timeout passes). Ask the others, after a backoff,
                        // instead of bouncing between the two.
                        previous_was_redirect = false;
                        (format!("{cause} (not followed: {leader} was unreachable moments ago)"), true)
                    } else {
                        redirect_to = Some(leader);
                        // Follow a redirect at once, but two in a row mean the nodes' views of the
                        // leader disagree (an election is settling): wait before asking again.
                        (cause, std::mem::replace(&mut previous_was_redirect, true))
                    }
                }
                Failure::Retry { cause, unreachable, .. } => {
                    if unreachable {
                        routing.mark_unreachable(&endpoint);
                    }
                    previous_was_redirect = false;
                    // An attempt the budget cut short says little on its own ("no answer within
                    // 3ms"): keep the failure before it, which is usually the one that matters.
                    match previous_cause.take() {
                        Some(previous) if timeout < options.request_timeout => (
                            format!("{cause} (cut short by the retry budget); before that: {previous}"),
                            true,
                        ),
                        _ => (cause, true),
                    }
                }
                Failure::Fatal(_) => unreachable!("returned above"),
            };
            last_failed = Some(endpoint);
            if attempts >= max_attempts {
                break cause;
            }
            let delay = if wait {
                backoff_delay(options.backoff, options.max_backoff, backoffs)
            } else {
                Duration::ZERO
            };
            // A retry whose backoff would end past the budget could not run anyway: give up now
            // rather than sleep first.
            if let Some(deadline) = deadline
                && Instant::now() + delay >= deadline
            {
                break cause;
            }
            if wait {
                tokio::time::sleep(delay).await;
                backoffs += 1;
                // A loaded machine may oversleep past the budget: an attempt with no time left
                // would only report its own timeout and hide the cause worth reporting.
                if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                    break cause;
                }
            }
            previous_cause = Some(cause);
        };
        Err(ClientError::Unavailable { attempts, elapsed: started.elapsed(), last: last_cause })
    }

    /// One attempt at `endpoint`, bounded by the per-attempt timeout.
    async fn attempt<Req, Resp, Rpc, Fut>(
        &self,
        endpoint: &str,
        request: &Req,
        rpc: &Rpc,
        timeout: Duration,
    ) -> std::result::Result<Resp, Failure>
    where
        Req: Clone,
        Rpc: Fn(&str, KvClient<Conn>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        let channel = self.inner.routing.channel(endpoint).map_err(Failure::Fatal)?;
        let kv = KvClient::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES);
        let routing = &self.inner.routing;
        match tokio::time::timeout(timeout, rpc(endpoint, kv, tonic::Request::new(request.clone()))).await {
            Ok(Ok(response)) => {
                routing.mark_reachable(endpoint);
                Ok(response.into_inner())
            }
            Ok(Err(status)) => {
                let failure = classify(endpoint, &status);
                if !matches!(failure, Failure::Retry { unreachable: true, .. }) {
                    // The node answered: whatever it said, it is up.
                    routing.mark_reachable(endpoint);
                }
                Err(failure)
            }
            Err(_elapsed) => Err(timed_out(endpoint, timeout)),
        }
    }
}

/// A `Kv` service in this process (a node's own, built by `onekv-server`), for
/// [`Client::serve_locally`]. Its error type is a connection's, which it never returns.
pub type LocalKv = tower::util::BoxCloneService<
    tonic::codegen::http::Request<tonic::body::Body>,
    tonic::codegen::http::Response<tonic::body::Body>,
    tonic::transport::Error,
>;

/// A get's answer: the value and its expiry time, if found.
fn found_with_expiry(response: onekv_proto::GetResponse) -> Option<(Vec<u8>, Option<u64>)> {
    let expiry = (response.expires_at_unix_ms != 0).then_some(response.expires_at_unix_ms);
    response.found.then_some((response.value, expiry))
}

/// One operation of a batch: `(key, Some(value))` puts, `(key, None)` deletes.
pub type BatchItem = (Vec<u8>, Option<Vec<u8>>);

/// `ops` grouped by the shard of their keys, each group in its original order.
fn split_by_shard(map: &ClusterMap, ops: Vec<BatchItem>) -> BTreeMap<u64, Vec<BatchItem>> {
    let mut by_shard: BTreeMap<u64, Vec<_>> = BTreeMap::new();
    for (key, value) in ops {
        by_shard.entry(map.shard_of_key(&key)).or_default().push((key, value));
    }
    by_shard
}

/// Merges one page of each shard (each ordered, forward or `reverse`) into one ordered page of at
/// most `limit` pairs (0: at most as many as the fullest shard page, which the node's maximum
/// bounds). A shard that has more beyond its page bounds what may be returned: no pair past its
/// last one, or a pair of that shard not yet read could belong before it. The next page starts
/// after the last pair returned, as with one shard.
fn merge_pages(pages: Vec<ScanResponse>, limit: u32, reverse: bool) -> ScanResponse {
    let past = |a: &[u8], b: &[u8]| if reverse { a < b } else { a > b };
    // The earliest "last pair" among pages that stopped early: nothing past it is known complete.
    let mut bound: Option<Vec<u8>> = None;
    let mut fullest = 0;
    let mut more = false;
    for page in &pages {
        fullest = fullest.max(page.pairs.len());
        if page.more {
            more = true;
            if let Some(last) = page.pairs.last()
                && bound.as_ref().is_none_or(|bound| past(bound, &last.key))
            {
                bound = Some(last.key.clone());
            }
        }
    }
    let mut pairs: Vec<onekv_proto::KeyValue> = pages.into_iter().flat_map(|page| page.pairs).collect();
    pairs.sort_by(|a, b| if reverse { b.key.cmp(&a.key) } else { a.key.cmp(&b.key) });
    if let Some(bound) = &bound {
        let keep = pairs.iter().take_while(|pair| !past(&pair.key, bound)).count();
        pairs.truncate(keep);
    }
    let cap = if limit == 0 { fullest } else { limit as usize };
    if pairs.len() > cap {
        pairs.truncate(cap);
        more = true;
    }
    ScanResponse { pairs, more }
}

#[cfg(test)]
mod tests {
    use super::*;
    use onekv_proto::KeyValue;

    fn page(keys: &[&str], more: bool) -> ScanResponse {
        ScanResponse {
            pairs: keys.iter().map(|k| KeyValue { key: k.as_bytes().to_vec(), value: Vec::new() }).collect(),
            more,
        }
    }

    fn keys(page: &ScanResponse) -> Vec<String> {
        page.pairs.iter().map(|p| String::from_utf8(p.key.clone()).unwrap()).collect()
    }

    #[test]
    fn merged_pages_stop_where_a_shard_with_more_stopped() {
        // Shard 1 stopped at "c" with more to come ("d" may be its next): nothing past "c".
        let merged = merge_pages(vec![page(&["a", "c"], true), page(&["b", "e", "f"], false)], 10, false);
        assert_eq!(keys(&merged), ["a", "b", "c"]);
        assert!(merged.more);
        // Complete pages merge whole, in order.
        let merged = merge_pages(vec![page(&["a", "c"], false), page(&["b", "e"], false)], 10, false);
        assert_eq!(keys(&merged), ["a", "b", "c", "e"]);
        assert!(!merged.more);
        // The limit cuts and says there is more.
        let merged = merge_pages(vec![page(&["a", "c"], false), page(&["b", "e"], false)], 3, false);
        assert_eq!(keys(&merged), ["a", "b", "c"]);
        assert!(merged.more);
    }

    #[test]
    fn reverse_pages_merge_newest_first() {
        let merged = merge_pages(vec![page(&["e", "c"], true), page(&["d", "b", "a"], false)], 0, true);
        assert_eq!(keys(&merged), ["e", "d", "c"]);
        assert!(merged.more);
        // Limit 0: no more than the fullest shard page.
        let merged = merge_pages(vec![page(&["e", "c"], false), page(&["d", "b", "a"], false)], 0, true);
        assert_eq!(keys(&merged), ["e", "d", "c"]);
        assert!(merged.more);
    }
}
