//! Coalescing: the Get, Put and Delete calls that wait for one node at the same time travel to it
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
use std::time::Duration;

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
const MAX_MULTI_BYTES: usize = 1 << 20;

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

/// Answers call number `at` of a `Multi` with `service`'s own Get, Put or Delete, as that call
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
        None => 0,
    }
}

/// The per-node queues of one client.
pub(crate) struct Coalescer {
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
    /// The node answered UNIMPLEMENTED to a `Multi` (a release before it): send it single calls.
    unsupported: bool,
}

struct Waiting {
    call: MultiCall,
    bytes: usize,
    answer: oneshot::Sender<Result<Answer, Status>>,
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
            nodes: Mutex::new(HashMap::new()),
            in_flight_per_node: in_flight_per_node.max(1),
            timeout,
        }
    }

    /// Sends `call` to `endpoint` through `kv`, together with whatever else waits for that node,
    /// and returns its answer.
    pub(crate) async fn submit(&self, endpoint: &str, kv: KvClient<Conn>, call: MultiCall) -> Submitted {
        let queue = Arc::clone(lock(&self.nodes).entry(endpoint.to_owned()).or_default());
        let (answer, answered) = oneshot::channel();
        {
            let mut state = lock(&queue.state);
            if state.unsupported {
                return Submitted::Unsupported(call);
            }
            let bytes = payload_bytes(&call);
            state.waiting.push_back(Waiting { call, bytes, answer });
            if state.in_flight < self.in_flight_per_node {
                state.in_flight += 1;
                let batch = take_batch(&mut state.waiting);
                // Its own task: a caller that gives up (its attempt's timeout) must not take the
                // other callers' answers with it.
                tokio::spawn(send_until_empty(Arc::clone(&queue), kv, batch, self.timeout));
            }
        }
        match answered.await {
            Ok(answer) => Submitted::Answered(answer),
            Err(_) => Submitted::Answered(Err(Status::unavailable(
                "the call was dropped before it was sent (the client is shutting down?); retry",
            ))),
        }
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

/// Sends `batch`, then whatever queued up meanwhile, until the queue is empty; then gives its
/// in-flight slot back.
async fn send_until_empty(
    queue: Arc<NodeQueue>,
    kv: KvClient<Conn>,
    mut batch: Vec<Waiting>,
    timeout: Duration,
) {
    loop {
        let unsupported = send(kv.clone(), batch, timeout).await;
        let mut state = lock(&queue.state);
        state.unsupported |= unsupported;
        if state.unsupported {
            // Every waiting caller learns it and sends alone.
            for waiting in state.waiting.drain(..) {
                let _ = waiting.answer.send(Err(unsupported_status()));
            }
        }
        batch = take_batch(&mut state.waiting);
        if batch.is_empty() {
            state.in_flight -= 1;
            return;
        }
    }
}

/// Sends one `Multi` and hands each caller its answer as it arrives; returns whether the node
/// does not know `Multi`.
async fn send(mut kv: KvClient<Conn>, batch: Vec<Waiting>, timeout: Duration) -> bool {
    if batch.is_empty() {
        return false;
    }
    let (calls, answers): (Vec<MultiCall>, Vec<_>) =
        batch.into_iter().map(|waiting| (waiting.call, waiting.answer)).unzip();
    let mut answers: Vec<Option<_>> = answers.into_iter().map(Some).collect();
    let exchange = async {
        let mut results = kv.multi(MultiRequest { calls }).await?.into_inner();
        while let Some(result) = results.message().await? {
            let answer = answers.get_mut(result.call as usize).and_then(Option::take).ok_or_else(|| {
                Status::internal(format!(
                    "the node answered call {} of a Multi twice or out of range",
                    result.call
                ))
            })?;
            let _ = answer.send(match result.result {
                Some(Answer::Error(error)) => Err(status_of(error)),
                Some(answer) => Ok(answer),
                None => Err(Status::internal("the node answered a call of a Multi with nothing")),
            });
        }
        Ok::<_, Status>(())
    };
    let ended = match tokio::time::timeout(timeout, exchange).await {
        Ok(ended) => ended,
        Err(_) => Err(Status::deadline_exceeded(format!(
            "no answer within {} ms (a write may still commit: retry it with the same request id)",
            timeout.as_millis()
        ))),
    };
    let unsupported = matches!(&ended, Err(status) if status.code() == Code::Unimplemented);
    let status = match ended {
        Err(_) if unsupported => unsupported_status(),
        Err(status) => status,
        Ok(()) => Status::internal("the node ended a Multi without answering every call"),
    };
    for answer in answers.into_iter().flatten() {
        let _ = answer.send(Err(status.clone()));
    }
    unsupported
}

/// What the callers of a `Multi` that the node did not know are told: UNAVAILABLE, which the client
/// retries; the retry, like every later call to that node, goes alone ([`Submitted::Unsupported`]).
fn unsupported_status() -> Status {
    Status::unavailable(UNSUPPORTED)
}

/// The message of [`unsupported_status`].
const UNSUPPORTED: &str = "the node does not know Multi calls (an older release); sending single calls";

#[cfg(test)]
mod tests {
    use super::*;
    use onekv_proto::{GetRequest, PutRequest};

    fn put(bytes: usize) -> (Waiting, oneshot::Receiver<Result<Answer, Status>>) {
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
