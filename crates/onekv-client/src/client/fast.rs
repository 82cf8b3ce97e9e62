//! The client's side of the fast path (`docs/design/fast-path.md`): a blind write (puts and
//! deletes that answer nothing but "done") sent to every voter of its shard at once, done in one
//! round trip when a fast quorum of the voters (every voter at R = 3, 4 of 5 at R = 5:
//! `onekv_placement::quorum`) answered that it holds the write durably in the same term, the
//! leader among them; otherwise sent again through the Raft path with the **same request id**,
//! which applies it once whatever became of the fast attempt.
//!
//! Owns: which nodes a shard's fast writes go to (the cluster map's replicas, then the voters the
//! shard's leader names in its answers), where to reach each node (the client's own endpoint
//! that answered as that node, else the address in the cluster's member list),
//! the rule that makes a write done ([`completes`]), how long to wait for the answers before
//! falling back (adaptive: a few times the recent round trips, or
//! [`crate::ClientOptions::fast_path_wait`]), and which shards go straight to the Raft path for a
//! while because their last fast attempt failed. Does not own the Raft path's retries
//! ([`Client::call`]) or the node's side (`onekv_replica::fast`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use onekv_proto::kv_client::KvClient;
use onekv_proto::multi_call::Call;
use onekv_proto::multi_result::Result as Answer;
use onekv_proto::{
    BatchOp, BatchRequest, DeleteRequest, FastWriteRequest, FastWriteResponse, PutRequest, RequestId,
};
use tonic::Status;

use super::{Client, MAX_RESPONSE_BYTES, Route};
use crate::error::{ClientError, Result};
use crate::routing::normalize;

/// How a blind write sent with [`Client::put_fast`], [`Client::delete_fast`] or
/// [`Client::batch_fast`] was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlindWrite {
    /// Done by the fast path: durable on a fast quorum of its shard's voters after one round trip, ordered
    /// by the leader in the background (reads see it from now on).
    pub fast: bool,
    /// The Raft log index it was applied at, when known: the Raft path's, or that of an earlier
    /// application of the same write. `None` for a write done fast.
    pub index: Option<u64>,
}

/// The wait before the first fast write has measured anything.
const FIRST_WAIT: Duration = Duration::from_millis(20);
/// Bounds of the adaptive wait.
const MIN_WAIT: Duration = Duration::from_millis(5);
const MAX_WAIT: Duration = Duration::from_millis(250);
/// Fast attempts of one shard that may fail in a row before its writes go straight to the Raft
/// path for a while (a voter slow or down would make every write wait and fall back anyway).
const FAILURES_BEFORE_DIRECT: u32 = 3;
/// How long they do so the first time; each further failure in a row doubles it, up to
/// [`MAX_DIRECT`]. The next fast attempt after it probes again; a success starts over.
const FIRST_DIRECT: Duration = Duration::from_millis(500);
const MAX_DIRECT: Duration = Duration::from_secs(10);
/// As long, at once, when a voter said the fast path is off on its node.
const DIRECT_WHEN_OFF: Duration = Duration::from_secs(30);
/// How long after it is sent a node may take a fast write (`FastWriteRequest::deadline_unix_ms`):
/// far below the nodes' request-id window (120 s), so a write delayed past it is never taken as
/// new after its id was forgotten; far above any wait for it.
const FAST_WRITE_DEADLINE: Duration = Duration::from_secs(30);
/// How often the client asks its endpoints which node each is, and the nodes for their member
/// list (in the background, when an endpoint is not identified or a voter has no address).
const IDENTIFY_AGAIN_AFTER: Duration = Duration::from_secs(10);
/// How long it waits for those answers.
const IDENTIFY_TIMEOUT: Duration = Duration::from_secs(1);

/// The fast path's state shared by every clone of one client.
#[derive(Debug, Default)]
pub(crate) struct FastPath {
    state: Mutex<FastState>,
}

#[derive(Debug, Default)]
struct FastState {
    /// Each node's client address, from the member list the cluster map came with.
    addresses: HashMap<u64, String>,
    /// The client's own endpoints, by the node that answered there: preferred to `addresses`,
    /// which are the nodes' view of each other (a proxy or another network may stand between
    /// the client and a node).
    endpoints: HashMap<u64, String>,
    /// When the client last asked its endpoints which node each is (`None`: never).
    identified_at: Option<Instant>,
    /// Whether an identification runs in the background now.
    identifying: bool,
    /// Per shard, the voters its leader named last (until then, the cluster map's replicas).
    voters: HashMap<u64, Vec<u64>>,
    /// Per shard, its fast attempts that failed in a row, and until when its writes take the Raft
    /// path without trying the fast one.
    failures: HashMap<u64, (u32, Option<Instant>)>,
    /// Moving average and mean deviation of the round trips of fast writes that completed (as
    /// TCP estimates its retransmission timeout).
    round_trip: Option<(Duration, Duration)>,
}

impl FastPath {
    fn state(&self) -> std::sync::MutexGuard<'_, FastState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Learns the members' addresses (what a node's Status lists).
    pub(crate) fn learn_addresses(&self, addresses: impl IntoIterator<Item = (u64, String)>) {
        self.state().addresses.extend(addresses);
    }

    /// Learns that the client's `endpoint` is node `node` (and no other node).
    pub(crate) fn learn_endpoint(&self, node: u64, endpoint: &str) {
        let mut state = self.state();
        state.endpoints.retain(|_, known| known != endpoint);
        state.endpoints.insert(node, endpoint.to_owned());
    }

    /// `endpoint` answered as another node than `node`: neither address is trusted for `node`
    /// until the next identification.
    fn forget_endpoint(&self, node: u64, endpoint: &str) {
        let mut state = self.state();
        state.endpoints.retain(|_, known| known != endpoint);
        if state.addresses.get(&node).is_some_and(|known| known == endpoint) {
            state.addresses.remove(&node);
        }
        state.identified_at = None;
    }

    /// Where the client reaches `node`: its own endpoint for it, else the member list's address.
    fn endpoint_of(state: &FastState, node: u64) -> Option<&String> {
        state.endpoints.get(&node).or_else(|| state.addresses.get(&node))
    }

    /// How long to wait for a fast quorum's answers before the Raft path starts too: the recent round
    /// trips' average plus four times their deviation, bounded.
    fn adaptive_wait(&self) -> Duration {
        match self.state().round_trip {
            None => FIRST_WAIT,
            Some((average, deviation)) => (average + deviation * 4).clamp(MIN_WAIT, MAX_WAIT),
        }
    }

    /// A fast write of `shard` completed after `elapsed`.
    fn completed(&self, shard: u64, elapsed: Duration) {
        let mut state = self.state();
        state.failures.remove(&shard);
        state.round_trip = Some(match state.round_trip {
            None => (elapsed, elapsed / 2),
            Some((average, deviation)) => {
                let error = average.abs_diff(elapsed);
                ((average * 7 + elapsed) / 8, (deviation * 3 + error) / 4)
            }
        });
    }

    /// A fast write of `shard` did not complete; `off`: a voter has the fast path off.
    fn failed(&self, shard: u64, off: bool) {
        let mut state = self.state();
        let (count, until) = state.failures.entry(shard).or_insert((0, None));
        *count += 1;
        if off {
            *until = Some(Instant::now() + DIRECT_WHEN_OFF);
        } else if *count >= FAILURES_BEFORE_DIRECT {
            let doublings = (*count - FAILURES_BEFORE_DIRECT).min(16);
            *until = Some(Instant::now() + (FIRST_DIRECT * (1 << doublings)).min(MAX_DIRECT));
        }
    }

    /// Whether `shard`'s writes take the Raft path without trying the fast one now.
    fn direct_now(&self, shard: u64) -> bool {
        let state = self.state();
        state.failures.get(&shard).and_then(|(_, until)| *until).is_some_and(|until| Instant::now() < until)
    }
}

/// Whether `acks` (by the node that answered) make a fast write done: one says it was applied
/// already, or a fast quorum (`onekv_placement::quorum::fast_quorum`: every voter at R = 3, 4 of
/// 5) of the voters the leader's answer names answered durable in the leader's term with the same
/// voters. (The node's side states the same rule as `onekv_replica::FastAck::completes`,
/// which its tests and the simulation use.)
pub fn completes(acks: &BTreeMap<u64, FastWriteResponse>) -> bool {
    if acks.values().any(|ack| ack.applied_index != 0) {
        return true;
    }
    let Some(leader) = leader_ack(acks) else {
        return false;
    };
    let voters = sorted(&leader.voters);
    let held = voters
        .iter()
        .filter(|voter| {
            acks.get(voter).is_some_and(|ack| ack.term == leader.term && sorted(&ack.voters) == voters)
        })
        .count();
    !voters.is_empty() && held >= onekv_placement::quorum::fast_quorum(voters.len())
}

/// The answer of the node that leads in the newest term among `acks`, if one does.
fn leader_ack(acks: &BTreeMap<u64, FastWriteResponse>) -> Option<&FastWriteResponse> {
    acks.values().filter(|ack| ack.leader).max_by_key(|ack| ack.term)
}

/// The voters a replica named, in order (replicas list the same set in different orders).
fn sorted(voters: &[u64]) -> Vec<u64> {
    let mut voters = voters.to_vec();
    voters.sort_unstable();
    voters.dedup();
    voters
}

/// A batch's items as the wire's ops (no expiry).
pub(super) fn batch_ops(ops: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Vec<BatchOp> {
    ops.into_iter().map(|(key, value)| BatchOp { key, value, expiry: None }).collect()
}

/// What the fast attempt's answers made of a write.
enum Gathered {
    /// Done by the fast path (`Some(index)`: applied already, at that index).
    Done(Option<u64>),
    /// It cannot complete (`off`: a voter has the fast path off).
    Failed { off: bool },
    /// A node refused it as bad input, or (at R = 5) because a fast write of one of its keys is
    /// pending there: the Raft path answers the caller (with the same error, if it is bad input),
    /// and the shard's fast path is not held to blame.
    Invalid,
}

/// What a node's refusal of a fast write says when a write of one of its keys is pending there
/// (`onekv_replica`'s accept rule at R = 5): the write takes the Raft path, which orders it after
/// the pending one, and the shard's fast path is not to blame.
const PENDING_KEY_REFUSAL: &str = "a fast write of the same key is pending here";

impl Client {
    /// Sets `key` to `value` by the fast path when the cluster has it on: in one round trip to
    /// every voter of the key's shard, else (a voter slow, down or refusing; the fast path off)
    /// through the shard's leader with the same request id, as [`Client::put`]. Reads that follow
    /// see the write either way.
    pub async fn put_fast(&self, key: &[u8], value: &[u8]) -> Result<BlindWrite> {
        let shard = self.shard_of(key).await?;
        self.write_fast(shard, vec![BatchOp { key: key.to_vec(), value: Some(value.to_vec()), expiry: None }])
            .await
    }

    /// Deletes `key` by the fast path, as [`Client::put_fast`] (deleting an absent key succeeds).
    pub async fn delete_fast(&self, key: &[u8]) -> Result<BlindWrite> {
        let shard = self.shard_of(key).await?;
        self.write_fast(shard, vec![BatchOp { key: key.to_vec(), value: None, expiry: None }]).await
    }

    /// Applies `ops` atomically (`(key, Some(value))` puts, `(key, None)` deletes) by the fast
    /// path, as [`Client::put_fast`]; the keys must be of one shard, as for [`Client::batch`].
    pub async fn batch_fast(&self, ops: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<BlindWrite> {
        let placement = self.placement().await?;
        let mut by_shard = super::split_by_shard(&placement, ops);
        if by_shard.len() > 1 {
            let shards: Vec<String> = by_shard.keys().map(u64::to_string).collect();
            return Err(ClientError::InvalidArgument(format!(
                "the batch's keys belong to shards {}: a batch is atomic within one shard only",
                shards.join(", ")
            )));
        }
        let Some((shard, ops)) = by_shard.pop_first() else {
            return Err(ClientError::InvalidArgument("batch has no operations".into()));
        };
        self.write_fast(shard, batch_ops(ops)).await
    }

    /// [`Client::batch_per_shard`] by the fast path: each shard's part atomically, as
    /// [`Client::batch_fast`], the shards concurrently and independently (for MSET).
    pub async fn batch_per_shard_fast(&self, ops: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<()> {
        self.per_shard(ops, true).await
    }

    /// The fast attempt; if it does not complete within the fast path's wait, the Raft path with
    /// the same request id too, and whichever finishes first answers (the other is dropped: the
    /// request id makes sure the write applies once); if it cannot complete, the Raft path alone.
    pub(super) async fn write_fast(&self, shard: u64, ops: Vec<BatchOp>) -> Result<BlindWrite> {
        let id = self.next_id();
        let fast = &self.inner.fast;
        let targets = match fast.direct_now(shard) {
            true => None,
            false => self.fast_targets(shard).await,
        };
        let Some(targets) = targets else {
            return self.raft_path(shard, ops, id).await;
        };
        let wait = self.inner.options.fast_path_wait.unwrap_or_else(|| fast.adaptive_wait());
        let started = Instant::now();
        let deadline_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| (since + FAST_WRITE_DEADLINE).as_millis() as u64);
        let request = FastWriteRequest { ops: ops.clone(), request_id: Some(id), deadline_unix_ms };
        let gather = self.gather(shard, targets, request);
        tokio::pin!(gather);
        match tokio::time::timeout(wait, &mut gather).await {
            Ok(Gathered::Done(index)) => return Ok(self.done_fast(shard, started, index)),
            Ok(Gathered::Failed { off }) => {
                fast.failed(shard, off);
                return self.raft_path(shard, ops, id).await;
            }
            Ok(Gathered::Invalid) => return self.raft_path(shard, ops, id).await,
            Err(_waited) => {}
        }
        let raft_path = self.raft_path(shard, ops, id);
        tokio::pin!(raft_path);
        let mut gathering = true;
        loop {
            tokio::select! {
                gathered = &mut gather, if gathering => match gathered {
                    Gathered::Done(index) => return Ok(self.done_fast(shard, started, index)),
                    Gathered::Failed { off } => {
                        fast.failed(shard, off);
                        gathering = false;
                    }
                    Gathered::Invalid => gathering = false,
                },
                written = &mut raft_path => {
                    if !gathering {
                        return written;
                    }
                    // The Raft path gave up (its retry budget spent) while the fast attempt may
                    // still complete: it gets one more wait.
                    if written.is_err()
                        && let Ok(Gathered::Done(index)) = tokio::time::timeout(wait, &mut gather).await
                    {
                        return Ok(self.done_fast(shard, started, index));
                    }
                    fast.failed(shard, false);
                    return written;
                }
            }
        }
    }

    fn done_fast(&self, shard: u64, started: Instant, index: Option<u64>) -> BlindWrite {
        if index.is_none() {
            self.inner.fast.completed(shard, started.elapsed());
        }
        BlindWrite { fast: index.is_none(), index }
    }

    /// The write through the shard's leader (Put, Delete or Batch) with request id `id`.
    async fn raft_path(&self, shard: u64, ops: Vec<BatchOp>, id: RequestId) -> Result<BlindWrite> {
        let route = Route::Leader(shard);
        let index = match <[BatchOp; 1]>::try_from(ops) {
            Ok([BatchOp { key, value: Some(value), .. }]) => {
                let request = PutRequest { key, value, request_id: Some(id), expiry: None };
                let call = |at: &str, kv, r: tonic::Request<PutRequest>| {
                    self.write_at(at, kv, Call::Put(r.into_inner()))
                };
                self.call(route, request, call).await?.index
            }
            Ok([BatchOp { key, value: None, .. }]) => {
                let request = DeleteRequest { key, request_id: Some(id) };
                let call = |at: &str, kv, r: tonic::Request<DeleteRequest>| {
                    self.write_at(at, kv, Call::Delete(r.into_inner()))
                };
                self.call(route, request, call).await?.index
            }
            Err(ops) => {
                let request = BatchRequest { ops, request_id: Some(id) };
                self.call(route, request, |_, mut kv, r| async move { kv.batch(r).await }).await?.index
            }
        };
        Ok(BlindWrite { fast: false, index: Some(index) })
    }

    /// Sends the write to every one of `targets` at once and gathers their answers until they make
    /// it done, or cannot: more voters the leader names refused it or were never asked than the
    /// fast quorum spares, or every target answered without making it done. An answer from another node than the one asked (an
    /// address that moved) counts as that node's refusal, and the address is dropped.
    async fn gather(&self, shard: u64, targets: Vec<(u64, String)>, request: FastWriteRequest) -> Gathered {
        let fast = &self.inner.fast;
        let asked: Vec<u64> = targets.iter().map(|(node, _)| *node).collect();
        let mut answers: FuturesUnordered<_> = targets
            .into_iter()
            .map(|(node, endpoint)| {
                let request = request.clone();
                async move {
                    let answer = self.fast_write_at(&endpoint, request).await;
                    (node, endpoint, answer)
                }
            })
            .collect();
        let mut acks = BTreeMap::new();
        let mut refused = Vec::new();
        // Whether every refusal was for a pending write of a key (the shard's fast path is then
        // not to blame).
        let (mut key_refusals, mut other_refusals) = (0, 0);
        while let Some((node, endpoint, answer)) = answers.next().await {
            match answer {
                Ok(ack) if ack.node_id == node => {
                    if ack.leader && !ack.voters.is_empty() {
                        fast.state().voters.insert(shard, sorted(&ack.voters));
                    }
                    acks.insert(node, ack);
                    if completes(&acks) {
                        let applied = acks.values().map(|ack| ack.applied_index).find(|&index| index != 0);
                        return Gathered::Done(applied);
                    }
                }
                Ok(_) => {
                    fast.forget_endpoint(node, &endpoint);
                    other_refusals += 1;
                    refused.push(node);
                }
                Err(status) => {
                    if status.code() == tonic::Code::InvalidArgument {
                        return match status.message().contains("fast path is off") {
                            true => Gathered::Failed { off: true },
                            false => Gathered::Invalid,
                        };
                    }
                    match status.message().contains(PENDING_KEY_REFUSAL) {
                        true => key_refusals += 1,
                        false => other_refusals += 1,
                    }
                    refused.push(node);
                }
            }
            // Once the leader named the voters: more of them refused or never asked than the fast
            // quorum can spare (at R = 3, any one) rules it out (a refusal from a node that is no
            // voter, say a replica moved away, does not count).
            if let Some(leader) = leader_ack(&acks) {
                let voters = sorted(&leader.voters);
                let out =
                    voters.iter().filter(|voter| refused.contains(voter) || !asked.contains(voter)).count();
                if out > voters.len() - onekv_placement::quorum::fast_quorum(voters.len()) {
                    return match key_refusals > 0 && other_refusals == 0 {
                        true => Gathered::Invalid,
                        false => Gathered::Failed { off: false },
                    };
                }
            }
        }
        // Every target answered, and the answers do not make it done: no leader among them, or
        // terms or voters that differ (an election, a membership change). The voters learned for
        // the shard may be what is wrong.
        // (Unless only pending keys were refused: the leader may be one that refused.)
        let only_pending_keys = key_refusals > 0 && other_refusals == 0;
        if leader_ack(&acks).is_none() && !only_pending_keys {
            fast.state().voters.remove(&shard);
        }
        match only_pending_keys {
            true => Gathered::Invalid,
            false => Gathered::Failed { off: false },
        }
    }

    /// The voters of `shard` with their addresses (and the node the client last found leading it,
    /// if not among them), leaving out those that could not be reached moments ago; `None` if one
    /// has no known address, or more could not be reached than the fast quorum spares (their
    /// answers would never come: take the Raft path at once).
    async fn fast_targets(&self, shard: u64) -> Option<Vec<(u64, String)>> {
        let placement = self.placement().await.ok()?;
        let routing = &self.inner.routing;
        let targets = {
            let state = self.inner.fast.state();
            let mut voters = match state.voters.get(&shard) {
                Some(voters) => voters.clone(),
                None => placement.shard(shard)?.replicas.clone(),
            };
            let leader = routing.leader(shard).and_then(|address| {
                state.endpoints.iter().find(|(_, endpoint)| **endpoint == address).map(|(node, _)| *node)
            });
            let count = voters.len();
            if let Some(leader) = leader.filter(|leader| !voters.contains(leader)) {
                voters.push(leader);
            }
            voters
                .into_iter()
                .map(|node| FastPath::endpoint_of(&state, node).map(|endpoint| (node, endpoint.clone())))
                .collect::<Option<Vec<_>>>()
                .map(|targets| (count, leader, targets))
        };
        let unidentified = {
            let state = self.inner.fast.state();
            routing.known().iter().any(|endpoint| !state.endpoints.values().any(|known| known == endpoint))
        };
        if targets.is_none() || unidentified {
            self.identify_soon();
        }
        let (voters, leader, targets) = targets?;
        // A node found unreachable is not asked; the write can still be done without as many of
        // them as the fast quorum spares (none at R = 3, one at R = 5), but never without the
        // leader it knows of: else straight to Raft.
        let asked = targets.len();
        let reachable: Vec<(u64, String)> =
            targets.into_iter().filter(|(_, endpoint)| !routing.is_unreachable(endpoint)).collect();
        let spare = voters - onekv_placement::quorum::fast_quorum(voters);
        let leader_left_out = leader.is_some_and(|leader| !reachable.iter().any(|(node, _)| *node == leader));
        (!reachable.is_empty() && !leader_left_out && asked - reachable.len() <= spare).then_some(reachable)
    }

    /// Has a background task ask every endpoint of the client which node it is, and learn the
    /// member list's addresses from their answers, unless one did within
    /// [`IDENTIFY_AGAIN_AFTER`] or runs now.
    fn identify_soon(&self) {
        {
            let mut state = self.inner.fast.state();
            if state.identifying || state.identified_at.is_some_and(|at| at.elapsed() < IDENTIFY_AGAIN_AFTER)
            {
                return;
            }
            state.identifying = true;
            state.identified_at = Some(Instant::now());
        }
        let client = self.clone();
        tokio::spawn(async move {
            let routing = &client.inner.routing;
            let endpoints: Vec<String> =
                routing.known().into_iter().filter(|endpoint| !routing.is_unreachable(endpoint)).collect();
            let mut answers: FuturesUnordered<_> = endpoints
                .iter()
                .map(|endpoint| {
                    let client = &client;
                    async move {
                        (endpoint, tokio::time::timeout(IDENTIFY_TIMEOUT, client.status(endpoint)).await)
                    }
                })
                .collect();
            while let Some((endpoint, status)) = answers.next().await {
                if let Ok(Ok(status)) = status {
                    let fast = &client.inner.fast;
                    fast.learn_endpoint(status.node_id, endpoint);
                    fast.learn_addresses(
                        status.members.iter().filter_map(|m| Some((m.id, normalize(&m.address).ok()?))),
                    );
                }
            }
            client.inner.fast.state().identifying = false;
        });
    }

    /// One FastWrite at `endpoint`, coalesced with the other calls waiting for that node.
    async fn fast_write_at(
        &self,
        endpoint: &str,
        request: FastWriteRequest,
    ) -> std::result::Result<FastWriteResponse, Status> {
        let channel =
            self.inner.routing.channel(endpoint).map_err(|error| Status::unavailable(error.to_string()))?;
        let kv = KvClient::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES);
        let answer = self.coalesced(endpoint, kv, Call::FastWrite(request)).await;
        let routing = &self.inner.routing;
        match answer {
            Ok(Answer::FastWrite(ack)) => {
                routing.mark_reachable(endpoint);
                Ok(ack)
            }
            Ok(_) => Err(Status::internal("the node answered a FastWrite with another call's result")),
            Err(status) => {
                if let crate::retry::Failure::Retry { unreachable: true, .. } =
                    crate::retry::classify(endpoint, &status)
                {
                    routing.mark_unreachable(endpoint);
                }
                Err(status)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn durable(node: u64, term: u64, leader: bool, voters: &[u64]) -> (u64, FastWriteResponse) {
        (node, FastWriteResponse { node_id: node, applied_index: 0, term, leader, voters: voters.to_vec() })
    }

    #[test]
    fn a_write_is_done_when_a_fast_quorum_of_the_voters_the_leader_names_holds_it_in_its_term() {
        let all = [1, 2, 3];
        let mut acks: BTreeMap<u64, FastWriteResponse> =
            [durable(1, 5, true, &all), durable(2, 5, false, &all)].into_iter().collect();
        assert!(!completes(&acks), "a majority is not enough");
        acks.extend([durable(3, 4, false, &all)]);
        assert!(!completes(&acks), "a voter in another term");
        acks.extend([durable(3, 5, false, &[1, 2, 3, 4])]);
        assert!(!completes(&acks), "a voter that knows other voters");
        acks.extend([durable(3, 5, false, &all)]);
        assert!(completes(&acks));
        let no_leader: BTreeMap<_, _> =
            [durable(1, 5, false, &all), durable(2, 5, false, &all), durable(3, 5, false, &all)]
                .into_iter()
                .collect();
        assert!(!completes(&no_leader), "no leader among them");
        let reordered: BTreeMap<_, _> =
            [durable(1, 5, true, &[3, 1, 2]), durable(2, 5, false, &all), durable(3, 5, false, &[2, 3, 1])]
                .into_iter()
                .collect();
        assert!(completes(&reordered), "replicas list the same voters in different orders");
        let two_leaders: BTreeMap<_, _> =
            [durable(1, 4, true, &[1, 2]), durable(2, 4, false, &[1, 2]), durable(3, 5, true, &all)]
                .into_iter()
                .collect();
        assert!(!completes(&two_leaders), "the newest term's leader decides: node 3 in term 5");
        let applied: BTreeMap<_, _> =
            [(2, FastWriteResponse { node_id: 2, applied_index: 9, ..Default::default() })]
                .into_iter()
                .collect();
        assert!(completes(&applied), "applied already");
        let five = [1, 2, 3, 4, 5];
        let mut r5: BTreeMap<_, _> =
            [durable(1, 7, true, &five), durable(2, 7, false, &five), durable(3, 7, false, &five)]
                .into_iter()
                .collect();
        assert!(!completes(&r5), "a majority of five is not enough");
        r5.extend([durable(4, 6, false, &five)]);
        assert!(!completes(&r5), "the fourth in another term");
        r5.extend([durable(5, 7, false, &five)]);
        assert!(completes(&r5), "four of five in the leader's term");
        let without_leader: BTreeMap<_, _> = (2..=5).map(|node| durable(node, 7, false, &five)).collect();
        assert!(!completes(&without_leader), "four of five, the leader not among them");
    }
}
