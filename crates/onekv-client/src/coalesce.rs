//! Coalescing: the Get, Put, Delete and FastWrite calls that wait for one node at the same time travel to it
//! in one `Multi` call, each still its own call (its own request id, answer and error).
//!
//! Why: on a small machine the cost of a call is per call, not per byte (HTTP/2 headers and
//! trailers, a `writev` per answer, a server task and its wake-ups; `docs/benchmarks/profile.md`).
//! With many concurrent callers, sending what queued up while earlier calls were in flight as one
//! call divides that cost by the batch size, and adds no waiting: a call is sent at once whenever
//! fewer than [`crate::ClientOptions::calls_in_flight_per_node`] calls are in flight to its node.
//!
//! Owns, per node, the queue of waiting calls, the count of calls in flight, and the tasks that
//! send them; also the conversion of a call's error to and from the wire ([`call_error`],
//! [`status_of`]), which the server uses too, and the bounds of one `Multi`
//! ([`MAX_MULTI_CALLS`]). Does not own routing, retries or timeouts: [`crate::Client`] treats a
//! coalesced call like any other attempt at one node, and its retries coalesce again.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use onekv_proto::kv_client::KvClient;
use onekv_proto::multi_call::Call;
use onekv_proto::multi_result::Result as Answer;
use onekv_proto::{CallError, MultiCall, MultiRequest, MultiResult};
use tokio::sync::oneshot;
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::routing::Conn;

/// The most calls in one `Multi`; a node refuses more (INVALID_ARGUMENT).
pub const MAX_MULTI_CALLS: usize = 256;

/// A `Multi` stops growing once its calls carry this many key and value bytes (a call larger on
/// its own goes alone), so that it stays far below any node's request size limit.
pub const MAX_MULTI_BYTES: usize = 1 << 20;

/// `status` as a `Multi` call's error: its code, message and not-leader metadata.
pub fn call_error(status: &Status) -> CallError {
    let metadata = status.metadata();
    let text = |key: &str| metadata.get(key).and_then(|value| value.to_str().ok()).map(str::to_owned);
    CallError {
        code: status.code() as i32,
        message: status.message().to_owned(),
        leader_id: text(onekv_proto::LEADER_ID_METADATA).and_then(|id| id.parse().ok()).unwrap_or(0),
        leader_addr: text(onekv_proto::LEADER_ADDR_METADATA).unwrap_or_default(),
    }
}

/// The status a call ended with, from its `Multi` error ([`call_error`]'s inverse).
pub fn status_of(error: CallError) -> Status {
    let mut status = Status::new(Code::from_i32(error.code), error.message);
    let metadata = status.metadata_mut();
    if error.leader_id != 0 {
        metadata.insert(onekv_proto::LEADER_ID_METADATA, MetadataValue::from(error.leader_id));
    }
    if let Ok(address) = MetadataValue::try_from(error.leader_addr.as_str())
        && !error.leader_addr.is_empty()
    {
        metadata.insert(onekv_proto::LEADER_ADDR_METADATA, address);
    }
    status
}

/// Answers call number `at` of a `Multi` with `service`'s own Get, Put, Delete or FastWrite, as that call
/// would have been answered alone: what a node does for each call of a `Multi` (and test fakes).
pub async fn answer_alone<S: onekv_proto::kv_server::Kv>(
    service: &S,
    at: u32,
    call: MultiCall,
) -> MultiResult {
    use tonic::Request;
    let answer = match call.call {
        Some(Call::Get(get)) => {
            service.get(Request::new(get)).await.map(|found| Answer::Get(found.into_inner()))
        }
        Some(Call::Put(put)) => {
            service.put(Request::new(put)).await.map(|done| Answer::Write(done.into_inner()))
        }
        Some(Call::Delete(delete)) => {
            service.delete(Request::new(delete)).await.map(|done| Answer::Write(done.into_inner()))
        }
        Some(Call::FastWrite(write)) => {
            service.fast_write(Request::new(write)).await.map(|done| Answer::FastWrite(done.into_inner()))
        }
        None => Err(Status::invalid_argument("a call of a Multi names no operation")),
    };
    MultiResult { call: at, result: Some(answer.unwrap_or_else(|status| Answer::Error(call_error(&status)))) }
}

/// The key and value bytes a call carries (what bounds a `Multi`).
fn payload_bytes(call: &MultiCall) -> usize {
    match &call.call {
        Some(Call::Get(get)) => get.key.len(),
        Some(Call::Put(put)) => put.key.len() + put.value.len(),
        Some(Call::Delete(delete)) => delete.key.len(),
        Some(Call::FastWrite(write)) => {
            write.ops.iter().map(|op| op.key.len() + op.value.as_ref().map_or(0, Vec::len)).sum()
        }
        None => 0,
    }
}

/// How long a `Multi` keeps its node's in-flight slot at most. A slot is given back when the
/// `Multi`'s last answer arrives or after this, whichever comes first, so a `Multi` with a slow call
/// (a shard without a quorum, a value being repaired) delays the calls queued behind it by this
/// much, not by its call's own timeout. Long enough that under load (answers in a few ms) the slot
/// is normally held to the end, which is what makes calls queue up and travel together.
const SLOT_HOLD: Duration = Duration::from_millis(20);

/// After a node answered UNIMPLEMENTED to a `Multi`, how long it gets single calls before it is
/// tried again (it may have been upgraded).
const UNSUPPORTED_RECHECK: Duration = Duration::from_secs(60);

/// Queues longer than this drop their abandoned calls whenever a call is added.
const PRUNE_AT: usize = 1024;

/// The per-node queues of one client.
pub(crate) struct Coalescer {
    shared: Arc<Shared>,
}

struct Shared {
    nodes: Mutex<HashMap<String, Arc<NodeQueue>>>,
    in_flight_per_node: usize,
    timeout: Duration,
}

#[derive(Default)]
struct NodeQueue {
    state: Mutex<QueueState>,
}

#[derive(Default)]
struct QueueState {
    waiting: VecDeque<Waiting>,
    in_flight: usize,
    support: Support,
}

/// Whether a node knows `Multi`.
#[derive(Clone, Copy, Default)]
enum Support {
    /// Not known yet: the first `Multi` keeps a copy of its calls, to give them back if refused.
    #[default]
    Unknown,
    Known,
    /// It answered UNIMPLEMENTED at this time (a release before `Multi`).
    Refused(Instant),
}

struct Waiting {
    call: MultiCall,
    bytes: usize,
    answer: oneshot::Sender<Reply>,
}

/// What a waiting caller is told.
enum Reply {
    /// The node's answer, or the status the call failed with.
    Answered(Result<Answer, Status>),
    /// The node does not know `Multi`: send the call alone (given back).
    Alone(MultiCall),
}

/// What [`Coalescer::submit`] did with a call.
pub(crate) enum Submitted {
    /// The node's answer, or the status the call failed with.
    Answered(Result<Answer, Status>),
    /// The node does not know `Multi`: the caller sends the call on its own (given back).
    Unsupported(MultiCall),
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Coalescer {
    /// Queues with at most `in_flight_per_node` `Multi` calls in flight per node, each bounded by
    /// `timeout` (a caller's own attempt may give up sooner; its call is then skipped if not yet
    /// sent).
    pub(crate) fn new(in_flight_per_node: usize, timeout: Duration) -> Self {
        Coalescer {
            shared: Arc::new(Shared {
                nodes: Mutex::new(HashMap::new()),
                in_flight_per_node: in_flight_per_node.max(1),
                timeout,
            }),
        }
    }

    /// Sends `call` to `endpoint` through `kv`, together with whatever else waits for that node,
    /// and returns its answer.
    pub(crate) async fn submit(&self, endpoint: &str, kv: KvClient<Conn>, call: MultiCall) -> Submitted {
        let queue = Arc::clone(lock(&self.shared.nodes).entry(endpoint.to_owned()).or_default());
        let (answer, answered) = oneshot::channel();
        {
            let mut state = lock(&queue.state);
            if let Support::Refused(at) = state.support {
                if at.elapsed() < UNSUPPORTED_RECHECK {
                    return Submitted::Unsupported(call);
                }
                state.support = Support::Unknown;
            }
            if state.waiting.len() >= PRUNE_AT {
                state.waiting.retain(|waiting| !waiting.answer.is_closed());
            }
            let bytes = payload_bytes(&call);
            state.waiting.push_back(Waiting { call, bytes, answer });
            if state.in_flight < self.shared.in_flight_per_node {
                let slot = Slot::take(&self.shared, &queue, kv, &mut state);
                let batch = take_batch(&mut state.waiting);
                let probe = matches!(state.support, Support::Unknown);
                // Its own task: a caller that gives up (its attempt's timeout) must not take the
                // other callers' answers with it.
                tokio::spawn(send(slot, batch, probe));
            }
        }
        match answered.await {
            Ok(Reply::Answered(answer)) => Submitted::Answered(answer),
            Ok(Reply::Alone(call)) => Submitted::Unsupported(call),
            Err(_) => Submitted::Answered(Err(Status::unavailable(
                "the call was dropped before it was sent (the client is shutting down?); retry",
            ))),
        }
    }
}

/// One of a node's in-flight `Multi` slots, held by the task sending a `Multi`. Giving it back
/// (after [`SLOT_HOLD`], or when dropped: at the `Multi`'s end, a panic, a cancelled task) sends
/// the next batch if calls wait.
struct Slot {
    shared: Arc<Shared>,
    queue: Arc<NodeQueue>,
    kv: KvClient<Conn>,
    held: bool,
}

impl Slot {
    fn take(
        shared: &Arc<Shared>,
        queue: &Arc<NodeQueue>,
        kv: KvClient<Conn>,
        state: &mut QueueState,
    ) -> Slot {
        state.in_flight += 1;
        Slot { shared: Arc::clone(shared), queue: Arc::clone(queue), kv, held: true }
    }

    fn release(&mut self) {
        if !std::mem::take(&mut self.held) {
            return;
        }
        let mut state = lock(&self.queue.state);
        state.in_flight -= 1;
        if let Support::Refused(_) = state.support {
            // The node does not know `Multi`: whoever waits sends alone.
            for waiting in state.waiting.drain(..) {
                let _ = waiting.answer.send(Reply::Alone(waiting.call));
            }
            return;
        }
        if state.waiting.is_empty() || state.in_flight >= self.shared.in_flight_per_node {
            return;
        }
        let batch = take_batch(&mut state.waiting);
        if batch.is_empty() {
            return;
        }
        let probe = matches!(state.support, Support::Unknown);
        let next = Slot::take(&self.shared, &self.queue, self.kv.clone(), &mut state);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(send(next, batch, probe));
            }
            // No runtime to send from (it is shutting down): the callers are told, not left
            // waiting. Dropping `next` gives its slot back (and finds nothing left to send).
            Err(_) => {
                drop(state);
                for waiting in batch {
                    let _ = waiting.answer.send(Reply::Answered(Err(Status::unavailable(
                        "the client's runtime is shutting down; the call was not sent",
                    ))));
                }
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.release();
    }
}

/// The next `Multi`'s calls, oldest first: at least one, at most [`MAX_MULTI_CALLS`], and no more
/// than [`MAX_MULTI_BYTES`] unless one call alone is larger. Calls whose caller has given up are
/// dropped unsent.
fn take_batch(waiting: &mut VecDeque<Waiting>) -> Vec<Waiting> {
    let mut batch = Vec::new();
    let mut bytes = 0;
    while let Some(next) = waiting.front() {
        if next.answer.is_closed() {
            waiting.pop_front();
            continue;
        }
        if batch.len() == MAX_MULTI_CALLS || (!batch.is_empty() && bytes + next.bytes > MAX_MULTI_BYTES) {
            break;
        }
        bytes += next.bytes;
        batch.extend(waiting.pop_front());
    }
    batch
}

/// Sends one `Multi` through `slot`'s node and hands each caller its answer as it arrives. The
/// slot is given back after the last answer or after [`SLOT_HOLD`]. If `probe` (the node's support
/// is not known yet), the calls are copied first, so that a node answering UNIMPLEMENTED gives
/// them back to their callers to send alone.
async fn send(mut slot: Slot, batch: Vec<Waiting>, probe: bool) {
    if batch.is_empty() {
        return;
    }
    let (calls, answers): (Vec<MultiCall>, Vec<_>) =
        batch.into_iter().map(|waiting| (waiting.call, waiting.answer)).unzip();
    let spare = probe.then(|| calls.clone());
    let mut answers: Vec<Option<_>> = answers.into_iter().map(Some).collect();
    let mut kv = slot.kv.clone();
    let (timeout, queue) = (slot.shared.timeout, Arc::clone(&slot.queue));
    let hold = tokio::time::sleep(SLOT_HOLD);
    tokio::pin!(hold);
    let exchange = async {
        let mut results = kv.multi(MultiRequest { calls }).await?.into_inner();
        mark(&queue, Support::Known);
        loop {
            let result = tokio::select! {
                result = results.message() => result?,
                () = &mut hold, if slot.held => {
                    slot.release();
                    continue;
                }
            };
            let Some(result) = result else { return Ok(()) };
            let answer = answers.get_mut(result.call as usize).and_then(Option::take).ok_or_else(|| {
                Status::internal(format!(
                    "the node answered call {} of a Multi twice or out of range",
                    result.call
                ))
            })?;
            let _ = answer.send(Reply::Answered(match result.result {
                Some(Answer::Error(error)) => Err(status_of(error)),
                Some(answer) => Ok(answer),
                None => Err(Status::internal("the node answered a call of a Multi with nothing")),
            }));
        }
    };
    let ended = match tokio::time::timeout(timeout, exchange).await {
        Ok(ended) => ended,
        Err(_) => Err(Status::deadline_exceeded(format!(
            "no answer within {} ms (a write may still commit: retry it with the same request id)",
            timeout.as_millis()
        ))),
    };
    if let Err(status) = &ended
        && status.code() == Code::Unimplemented
    {
        mark(&queue, Support::Refused(Instant::now()));
        if let Some(spare) = spare {
            for (answer, call) in answers.into_iter().zip(spare) {
                if let Some(answer) = answer {
                    let _ = answer.send(Reply::Alone(call));
                }
            }
            return;
        }
    }
    let status = match ended {
        Err(status) if status.code() == Code::Unimplemented => unsupported_status(),
        Err(status) => status,
        Ok(()) => Status::internal("the node ended a Multi without answering every call"),
    };
    for answer in answers.into_iter().flatten() {
        let _ = answer.send(Reply::Answered(Err(status.clone())));
    }
}

/// Records what the node said of `Multi` (a refusal is kept until rechecked).
fn mark(queue: &NodeQueue, support: Support) {
    lock(&queue.state).support = support;
}

/// What the callers of a `Multi` are told when the node did not know it and their calls could not
/// be given back (its support was thought known): UNAVAILABLE, which the client retries; the retry
/// goes alone ([`Submitted::Unsupported`]).
fn unsupported_status() -> Status {
    Status::unavailable("the node does not know Multi calls (an older release); sending single calls")
}

#[cfg(test)]
mod tests {
    use super::*;
    use onekv_proto::{GetRequest, PutRequest};

    fn put(bytes: usize) -> (Waiting, oneshot::Receiver<Reply>) {
        let (answer, answered) = oneshot::channel();
        let call = MultiCall {
            call: Some(Call::Put(PutRequest {
                key: b"k".to_vec(),
                value: vec![0; bytes],
                ..Default::default()
            })),
        };
        (Waiting { bytes: payload_bytes(&call), call, answer }, answered)
    }

    #[test]
    fn a_batch_is_bounded_in_calls_and_bytes_but_a_large_call_goes_alone() {
        let mut receivers = Vec::new();
        let mut waiting = VecDeque::new();
        for _ in 0..MAX_MULTI_CALLS + 10 {
            let (w, r) = put(10);
            waiting.push_back(w);
            receivers.push(r);
        }
        assert_eq!(take_batch(&mut waiting).len(), MAX_MULTI_CALLS);
        assert_eq!(take_batch(&mut waiting).len(), 10);
        assert!(take_batch(&mut waiting).is_empty());

        // Sizes with the one-byte key: just over a half and a half do not fit together.
        for bytes in [MAX_MULTI_BYTES / 2 + 1, MAX_MULTI_BYTES / 2, 1, 2 * MAX_MULTI_BYTES, 1] {
            let (w, r) = put(bytes - 1);
            waiting.push_back(w);
            receivers.push(r);
        }
        assert_eq!(take_batch(&mut waiting).len(), 1);
        assert_eq!(take_batch(&mut waiting).len(), 2);
        assert_eq!(take_batch(&mut waiting).len(), 1, "a call over the bound goes alone");
        assert_eq!(take_batch(&mut waiting).len(), 1);
    }

    #[test]
    fn calls_whose_caller_gave_up_are_not_sent() {
        let mut waiting = VecDeque::new();
        let (first, gone) = put(1);
        let (second, _kept) = put(1);
        waiting.extend([first, second]);
        drop(gone);
        let batch = take_batch(&mut waiting);
        assert_eq!(batch.len(), 1);
        assert!(!batch[0].answer.is_closed());
    }

    #[test]
    fn a_status_survives_the_trip_through_a_call_error() {
        let mut status = Status::failed_precondition("not the leader");
        status.metadata_mut().insert(onekv_proto::LEADER_ID_METADATA, MetadataValue::from(3u64));
        status.metadata_mut().insert(onekv_proto::LEADER_ADDR_METADATA, MetadataValue::from_static("h:1"));
        let back = status_of(call_error(&status));
        assert_eq!(back.code(), Code::FailedPrecondition);
        assert_eq!(back.message(), "not the leader");
        assert_eq!(back.metadata().get(onekv_proto::LEADER_ID_METADATA).unwrap(), "3");
        assert_eq!(back.metadata().get(onekv_proto::LEADER_ADDR_METADATA).unwrap(), "h:1");

        let plain = status_of(call_error(&Status::unavailable("no leader")));
        assert_eq!(plain.code(), Code::Unavailable);
        assert!(plain.metadata().get(onekv_proto::LEADER_ID_METADATA).is_none());
        assert!(plain.metadata().get(onekv_proto::LEADER_ADDR_METADATA).is_none());

        let get = MultiCall { call: Some(Call::Get(GetRequest { key: b"abc".to_vec(), consistency: 0 })) };
        assert_eq!(payload_bytes(&get), 3);
    }
}
