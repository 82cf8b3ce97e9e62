//! The client's retry, redirect and request-id behaviour against tiny fake `Kv` servers on
//! 127.0.0.1 (no real onekv node): each fake answers from a script of statuses, then succeeds, and
//! records every request id and consistency level it saw. Elections are played by switching what
//! the fakes answer after a delay.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onekv_client::coalesce::answer_alone;
use onekv_client::{Client, ClientError, ClientOptions};
use onekv_proto::kv_server::{Kv, KvServer};
use onekv_proto::{
    BatchRequest, CasRequest, CasResponse, DeleteRequest, GetRequest, GetResponse, KeyValue, MultiRequest,
    MultiResult, PutRequest, RequestId, ScanRequest, ScanResponse, StatusRequest, StatusResponse, TxnRequest,
    TxnResponse, WriteResponse,
};
use tonic::metadata::MetadataValue;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// Every test finishes well within this; a hang fails instead of blocking CI.
const TEST_BOUND: Duration = Duration::from_secs(30);

/// One scripted answer.
#[derive(Clone)]
enum Step {
    Fail(fn() -> Status),
    NotLeader(Option<String>),
    /// Sleeps this long before answering OK (to trip the client's per-attempt timeout).
    Stall(Duration),
}

#[derive(Default)]
struct Fake {
    node_id: u64,
    /// Answers to give before answering OK; an empty script means always OK.
    script: Mutex<VecDeque<Step>>,
    /// When set, every call answers this after the script runs out.
    always: Mutex<Option<Step>>,
    seen_ids: Mutex<Vec<Option<RequestId>>>,
    seen_consistency: Mutex<Vec<i32>>,
    calls: Mutex<u32>,
    /// The value scans return, one pair of it.
    scan_value: Mutex<Vec<u8>>,
    /// Status calls (not scripted, not in `calls`).
    status_calls: Mutex<u32>,
    /// `Multi` calls, and the most calls one carried.
    multi_calls: Mutex<(u32, usize)>,
    /// Answers `Multi` UNIMPLEMENTED, as a node of an older release.
    no_multi: bool,
    /// How long each `Multi` takes before it is answered.
    multi_delay: Duration,
    /// What a FastWrite is answered (`None`: "the fast path is off"), and how many came.
    fast_answer: Mutex<Option<onekv_proto::FastWriteResponse>>,
    fast_calls: Mutex<u32>,
    /// What Status lists besides the node id: the members and the cluster map.
    members: Vec<onekv_proto::Member>,
    cluster_map: Vec<u8>,
}

impl Fake {
    fn new(node_id: u64, script: Vec<Step>) -> Arc<Fake> {
        Arc::new(Fake { node_id, script: Mutex::new(script.into()), ..Fake::default() })
    }

    fn calls(&self) -> u32 {
        *self.calls.lock().unwrap()
    }

    fn ids(&self) -> Vec<Option<RequestId>> {
        self.seen_ids.lock().unwrap().clone()
    }

    /// Records the call and plays the next scripted step.
    async fn answer(&self, id: Option<RequestId>) -> Result<(), Status> {
        *self.calls.lock().unwrap() += 1;
        self.seen_ids.lock().unwrap().push(id);
        let step = self.script.lock().unwrap().pop_front().or_else(|| self.always.lock().unwrap().clone());
        match step {
            None => Ok(()),
            Some(Step::Fail(status)) => Err(status()),
            Some(Step::NotLeader(address)) => {
                let mut status = Status::failed_precondition("not the leader");
                if let Some(address) = address {
                    status.metadata_mut().insert(
                        onekv_proto::LEADER_ADDR_METADATA,
                        MetadataValue::try_from(address.as_str()).unwrap(),
                    );
                }
                Err(status)
            }
            Some(Step::Stall(duration)) => {
                tokio::time::sleep(duration).await;
                Ok(())
            }
        }
    }
}

#[tonic::async_trait]
impl Kv for Fake {
    /// Each call as if it came alone, one after the other (their scripted steps in order).
    type MultiStream = futures_util::stream::BoxStream<'static, Result<MultiResult, Status>>;

    async fn multi(&self, request: Request<MultiRequest>) -> Result<Response<Self::MultiStream>, Status> {
        if self.no_multi {
            return Err(Status::unimplemented("unknown method Multi"));
        }
        let calls = request.into_inner().calls;
        {
            let mut seen = self.multi_calls.lock().unwrap();
            seen.0 += 1;
            seen.1 = seen.1.max(calls.len());
        }
        tokio::time::sleep(self.multi_delay).await;
        let mut results = Vec::new();
        for (at, call) in (0u32..).zip(calls) {
            results.push(Ok(answer_alone(self, at, call).await));
        }
        Ok(Response::new(Box::pin(futures_util::stream::iter(results))))
    }

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let request = request.into_inner();
        self.seen_consistency.lock().unwrap().push(request.consistency);
        self.answer(None).await?;
        let found = request.key != b"missing";
        Ok(Response::new(GetResponse {
            found,
            value: format!("value@{}", self.node_id).into_bytes(),
            expires_at_unix_ms: 0,
        }))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<WriteResponse>, Status> {
        self.answer(request.into_inner().request_id).await?;
        Ok(Response::new(WriteResponse { index: 42 }))
    }

    async fn delete(&self, request: Request<DeleteRequest>) -> Result<Response<WriteResponse>, Status> {
        self.answer(request.into_inner().request_id).await?;
        Ok(Response::new(WriteResponse { index: 43 }))
    }

    async fn batch(&self, request: Request<BatchRequest>) -> Result<Response<WriteResponse>, Status> {
        self.answer(request.into_inner().request_id).await?;
        Ok(Response::new(WriteResponse { index: 44 }))
    }

    async fn cas(&self, request: Request<CasRequest>) -> Result<Response<CasResponse>, Status> {
        let request = request.into_inner();
        self.answer(request.request_id).await?;
        // Swaps only when the key is expected absent; otherwise reports a current value.
        let swapped = request.expected.is_none();
        let (found, current) = if swapped {
            (request.new_value.is_some(), request.new_value.unwrap_or_default())
        } else {
            (true, b"other".to_vec())
        };
        Ok(Response::new(CasResponse { swapped, found, current, index: 45 }))
    }

    async fn fast_write(
        &self,
        _: Request<onekv_proto::FastWriteRequest>,
    ) -> Result<Response<onekv_proto::FastWriteResponse>, Status> {
        *self.fast_calls.lock().unwrap() += 1;
        match self.fast_answer.lock().unwrap().clone() {
            Some(answer) => Ok(Response::new(answer)),
            None => Err(Status::invalid_argument("the fast path is off on this node")),
        }
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let request = request.into_inner();
        self.answer(request.request_id).await?;
        // Applies only when every condition expects its key absent.
        let applied = request.conditions.iter().all(|condition| condition.expected.is_none());
        Ok(Response::new(TxnResponse { applied, index: 46 }))
    }

    async fn scan(&self, request: Request<ScanRequest>) -> Result<Response<ScanResponse>, Status> {
        self.answer(None).await?;
        let request = request.into_inner();
        let pairs = vec![KeyValue { key: request.start, value: self.scan_value.lock().unwrap().clone() }];
        Ok(Response::new(ScanResponse { pairs, more: true }))
    }

    async fn delete_range(
        &self,
        request: Request<onekv_proto::DeleteRangeRequest>,
    ) -> Result<Response<onekv_proto::DeleteRangeResponse>, Status> {
        self.answer(request.into_inner().request_id).await?;
        Ok(Response::new(onekv_proto::DeleteRangeResponse {
            deleted: 3,
            more: false,
            resume: vec![],
            index: 46,
        }))
    }

    /// Answers at once, outside the script: the client asks a node's status to learn the cluster
    /// map (here: none, so one shard) before its first keyed call.
    async fn transfer_leader(
        &self,
        _: Request<onekv_proto::TransferLeaderRequest>,
    ) -> Result<Response<onekv_proto::TransferLeaderResponse>, Status> {
        Err(Status::unimplemented("a fake has one node"))
    }

    async fn change_members(
        &self,
        _: Request<onekv_proto::ChangeMembersRequest>,
    ) -> Result<Response<onekv_proto::MembersResponse>, Status> {
        Err(Status::unimplemented("a fake has one node"))
    }

    async fn members(
        &self,
        _: Request<onekv_proto::ReplicaRequest>,
    ) -> Result<Response<onekv_proto::MembersResponse>, Status> {
        Err(Status::unimplemented("a fake has one node"))
    }

    async fn add_replica(
        &self,
        _: Request<onekv_proto::ReplicaRequest>,
    ) -> Result<Response<onekv_proto::ReplicaResponse>, Status> {
        Err(Status::unimplemented("a fake has one node"))
    }

    async fn remove_replica(
        &self,
        _: Request<onekv_proto::ReplicaRequest>,
    ) -> Result<Response<onekv_proto::ReplicaResponse>, Status> {
        Err(Status::unimplemented("a fake has one node"))
    }

    async fn set_members(
        &self,
        _: Request<onekv_proto::SetMembersRequest>,
    ) -> Result<Response<onekv_proto::SetMembersResponse>, Status> {
        Err(Status::unimplemented("a fake has one node"))
    }

    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        *self.status_calls.lock().unwrap() += 1;
        Ok(Response::new(StatusResponse {
            node_id: self.node_id,
            role: "leader".into(),
            members: self.members.clone(),
            cluster_map: self.cluster_map.clone(),
            ..Default::default()
        }))
    }
}

/// Serves `fake` on a fresh port of 127.0.0.1; returns `host:port`.
async fn serve(fake: &Arc<Fake>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let service = KvServer::from_arc(Arc::clone(fake)).max_encoding_message_size(usize::MAX);
    tokio::spawn(Server::builder().add_service(service).serve_with_incoming(TcpIncoming::from(listener)));
    address.to_string()
}

/// An address that accepts connections and drops each at once, as a node dying under its clients
/// would; returns `host:port` and the count of connections it took.
async fn dropping_address() -> (String, Arc<AtomicU32>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicU32::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    (address, accepted)
}

/// After `delay`, sets what `fake` answers from then on (`None`: OK), as an election's outcome.
fn after(delay: Duration, fake: &Arc<Fake>, step: Option<Step>) {
    let fake = Arc::clone(fake);
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        *fake.always.lock().unwrap() = step;
    });
}

/// What a node whose replica failed answers (the server's `failed_node_status`).
fn failed_node() -> Status {
    Status::unavailable(
        "this node failed and no longer serves (storage failure: appending Raft entries: No space left \
         on device (os error 28)); retry on another member",
    )
}

/// An address nothing listens on: bound, then released.
async fn dead_address() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address: SocketAddr = listener.local_addr().unwrap();
    drop(listener);
    address.to_string()
}

fn fast_options() -> ClientOptions {
    ClientOptions {
        request_timeout: Duration::from_secs(2),
        retry_budget: Duration::from_secs(5),
        max_attempts: 8,
        backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
        connect_timeout: Duration::from_secs(1),
        cluster_secret: None,
        ..ClientOptions::default()
    }
}

fn client(endpoints: &[&String], options: ClientOptions) -> Client {
    Client::new(endpoints.iter().map(|e| e.to_string()).collect(), options).unwrap()
}

async fn bounded<F: Future>(test: F) -> F::Output {
    tokio::time::timeout(TEST_BOUND, test).await.expect("test exceeded its time bound")
}

#[tokio::test]
async fn not_leader_redirects_to_the_named_leader_with_the_same_request_id() {
    bounded(async {
        let leader = Fake::new(2, vec![]);
        let leader_address = serve(&leader).await;
        let follower = Fake::new(1, vec![]);
        *follower.always.lock().unwrap() = Some(Step::NotLeader(Some(leader_address.clone())));
        let follower_address = serve(&follower).await;

        // Only the follower is configured: the leader is learnt from the redirect.
        let client =
            client(&[&follower_address], ClientOptions { backoff: Duration::from_secs(5), ..fast_options() });
        let started = Instant::now();
        assert_eq!(client.put(b"k", b"v").await.unwrap(), 42);
        assert!(started.elapsed() < Duration::from_secs(2), "a redirect is followed without backing off");
        assert_eq!((follower.calls(), leader.calls()), (1, 1));
        assert_eq!(follower.ids(), leader.ids(), "the retry reuses the request id");
        assert_eq!(client.cached_leader().as_deref(), Some(leader_address.as_str()));

        // The leader is cached: the next calls go straight to it, with a new request id.
        assert_eq!(client.delete(b"k").await.unwrap(), 43);
        assert_eq!(client.get(b"k").await.unwrap(), Some(b"value@2".to_vec()));
        assert_eq!((follower.calls(), leader.calls()), (1, 3));
        let ids = leader.ids();
        assert_ne!(ids[0], ids[1]);
        assert_eq!(ids[0].unwrap().client, ids[1].unwrap().client);
        assert_eq!(ids[1].unwrap().seq, ids[0].unwrap().seq + 1);

        // The learnt leader is a known endpoint now, so status_all asks it too.
        let statuses = client.status_all().await;
        let asked: Vec<&str> = statuses.iter().map(|(endpoint, _)| endpoint.as_str()).collect();
        assert_eq!(asked, [follower_address.as_str(), leader_address.as_str()]);
    })
    .await;
}

#[tokio::test]
async fn unavailable_is_retried_with_backoff_and_the_same_request_id() {
    bounded(async {
        let unavailable = Step::Fail(|| Status::unavailable("no leader yet"));
        let node = Fake::new(1, vec![unavailable.clone(), unavailable]);
        let address = serve(&node).await;
        let client = client(&[&address], fast_options());

        assert_eq!(client.put(b"k", b"v").await.unwrap(), 42);
        assert_eq!(node.calls(), 3);
        let ids = node.ids();
        assert!(ids[0].is_some_and(|id| id.seq != 0 && id.client != 0), "writes carry an id: {ids:?}");
        assert!(ids.iter().all(|id| *id == ids[0]), "every retry reuses the id: {ids:?}");

        assert_eq!(
            client.batch(vec![(b"a".to_vec(), Some(b"1".to_vec())), (b"b".to_vec(), None)]).await.unwrap(),
            44
        );
        assert_ne!(node.ids()[3], ids[0], "a new call gets a new id");
    })
    .await;
}

#[tokio::test]
async fn deadline_exceeded_and_a_stalled_attempt_retry_a_write_with_the_same_id() {
    bounded(async {
        let node = Fake::new(
            1,
            vec![
                Step::Fail(|| Status::deadline_exceeded("not committed in time")),
                Step::Stall(Duration::from_secs(5)),
            ],
        );
        let address = serve(&node).await;
        let options = ClientOptions { request_timeout: Duration::from_millis(300), ..fast_options() };
        let client = client(&[&address], options);

        let result = client.cas(b"k", None, Some(b"new")).await.unwrap();
        assert!(result.swapped);
        assert_eq!(result.current, Some(b"new".to_vec()));
        assert_eq!(result.index, 45);
        assert_eq!(node.calls(), 3);
        let ids = node.ids();
        assert!(ids.iter().all(|id| *id == ids[0] && id.is_some()), "{ids:?}");

        let refused = client.cas(b"k", Some(b"old"), None).await.unwrap();
        assert!(!refused.swapped);
        assert_eq!(refused.current, Some(b"other".to_vec()));
    })
    .await;
}

#[tokio::test]
async fn a_transaction_is_retried_with_one_request_id_and_reports_whether_it_applied() {
    bounded(async {
        let node = Fake::new(1, vec![Step::Fail(|| Status::deadline_exceeded("not committed in time"))]);
        let address = serve(&node).await;
        let client = client(&[&address], fast_options());

        let ops = vec![(b"a".to_vec(), Some(b"1".to_vec())), (b"b".to_vec(), None)];
        let applied = client.txn(vec![(b"a".to_vec(), None)], ops.clone()).await.unwrap();
        assert_eq!((applied.applied, applied.index), (true, 46));
        assert_eq!(node.calls(), 2);
        let ids = node.ids();
        assert!(ids.iter().all(|id| *id == ids[0] && id.is_some()), "{ids:?}");

        let refused = client.txn(vec![(b"a".to_vec(), Some(b"0".to_vec()))], ops).await.unwrap();
        assert!(!refused.applied);
        assert_ne!(node.ids()[2], ids[0], "a new transaction gets a new request id");
    })
    .await;
}

#[tokio::test]
async fn invalid_argument_is_returned_at_once_without_retry() {
    bounded(async {
        let node = Fake::new(1, vec![Step::Fail(|| Status::invalid_argument("empty key"))]);
        let address = serve(&node).await;
        let client = client(&[&address], fast_options());

        match client.put(b"", b"v").await {
            Err(ClientError::InvalidArgument(message)) => assert_eq!(message, "empty key"),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
        assert_eq!(node.calls(), 1);
    })
    .await;
}

#[tokio::test]
async fn internal_is_returned_at_once_as_a_server_error() {
    bounded(async {
        let node = Fake::new(1, vec![Step::Fail(|| Status::internal("storage failed"))]);
        let address = serve(&node).await;
        let client = client(&[&address], fast_options());

        match client.get(b"k").await {
            Err(ClientError::Server(message)) => assert!(message.contains("storage failed"), "{message}"),
            other => panic!("expected Server, got {other:?}"),
        }
        assert_eq!(node.calls(), 1);
    })
    .await;
}

#[tokio::test]
async fn a_dead_endpoint_is_skipped() {
    bounded(async {
        let dead = dead_address().await;
        let node = Fake::new(7, vec![]);
        let address = serve(&node).await;
        let client = client(&[&dead, &address], fast_options());

        // Round-robin starts at the dead endpoint, whose connection is refused; the next one answers.
        assert_eq!(client.get(b"k").await.unwrap(), Some(b"value@7".to_vec()));
        assert_eq!(client.get(b"missing").await.unwrap(), None);
        assert_eq!(node.calls(), 2);
        assert_eq!(client.cached_leader().as_deref(), Some(address.as_str()));
    })
    .await;
}

#[tokio::test]
async fn not_leader_without_an_address_moves_on_round_robin() {
    bounded(async {
        let follower = Fake::new(1, vec![]);
        *follower.always.lock().unwrap() = Some(Step::NotLeader(None));
        let follower_address = serve(&follower).await;
        let leader = Fake::new(2, vec![]);
        let leader_address = serve(&leader).await;
        let client = client(&[&follower_address, &leader_address], fast_options());

        assert_eq!(client.put(b"k", b"v").await.unwrap(), 42);
        assert_eq!((follower.calls(), leader.calls()), (1, 1));
        assert_eq!(follower.ids(), leader.ids());
    })
    .await;
}

#[tokio::test]
async fn giving_up_reports_the_attempts_and_the_last_cause() {
    bounded(async {
        let node = Fake::new(1, vec![]);
        *node.always.lock().unwrap() = Some(Step::Fail(|| Status::unavailable("stopping")));
        let address = serve(&node).await;
        let client = client(&[&address], ClientOptions { max_attempts: 3, ..fast_options() });

        match client.put(b"k", b"v").await {
            Err(ClientError::Unavailable { attempts, last, .. }) => {
                assert_eq!(attempts, 3);
                assert!(last.contains("stopping") && last.contains(&address), "{last}");
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert_eq!(node.calls(), 3);

        // Only dead endpoints: the cause names the connection failure.
        let dead = dead_address().await;
        let client = self::client(&[&dead], ClientOptions { max_attempts: 2, ..fast_options() });
        match client.get(b"k").await {
            Err(ClientError::Unavailable { attempts: 2, last, .. }) => {
                assert!(last.contains(&dead), "{last}")
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn redirect_loops_are_bounded_by_max_attempts() {
    bounded(async {
        let a = Fake::new(1, vec![]);
        let b = Fake::new(2, vec![]);
        let a_address = serve(&a).await;
        let b_address = serve(&b).await;
        *a.always.lock().unwrap() = Some(Step::NotLeader(Some(b_address.clone())));
        *b.always.lock().unwrap() = Some(Step::NotLeader(Some(a_address.clone())));
        let client = client(&[&a_address], ClientOptions { max_attempts: 5, ..fast_options() });

        assert!(matches!(client.put(b"k", b"v").await, Err(ClientError::Unavailable { attempts: 5, .. })));
        assert_eq!(a.calls() + b.calls(), 5);
    })
    .await;
}

#[tokio::test]
async fn stale_reads_go_to_the_named_node_or_any_node() {
    bounded(async {
        let one = Fake::new(1, vec![]);
        let two = Fake::new(2, vec![]);
        let one_address = serve(&one).await;
        let two_address = serve(&two).await;
        let client = client(&[&one_address], fast_options());

        assert_eq!(client.get_stale(b"k", Some(&two_address)).await.unwrap(), Some(b"value@2".to_vec()));
        assert_eq!(client.get_stale(b"k", None).await.unwrap(), Some(b"value@1".to_vec()));
        assert_eq!(client.get(b"k").await.unwrap(), Some(b"value@1".to_vec()));
        let stale = onekv_proto::Consistency::Stale as i32;
        let linearizable = onekv_proto::Consistency::Linearizable as i32;
        assert_eq!(*two.seen_consistency.lock().unwrap(), [stale]);
        assert_eq!(*one.seen_consistency.lock().unwrap(), [stale, linearizable]);

        // An explicit endpoint gets exactly one attempt.
        let dead = dead_address().await;
        assert!(matches!(client.get_stale(b"k", Some(&dead)).await, Err(ClientError::Transport(_))));
    })
    .await;
}

#[tokio::test]
async fn status_asks_one_node_and_status_all_reports_every_endpoint() {
    bounded(async {
        let node = Fake::new(9, vec![]);
        let address = serve(&node).await;
        let dead = dead_address().await;
        let client = client(&[&address, &dead], fast_options());

        assert_eq!(client.status(&address).await.unwrap().node_id, 9);
        assert!(matches!(client.status(&dead).await, Err(ClientError::Transport(_))));

        let all = client.status_all().await;
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].0, address);
        assert_eq!(all[0].1.as_ref().unwrap().node_id, 9);
        assert_eq!(all[1].0, dead);
        assert!(all[1].1.is_err());
        assert_eq!(*node.status_calls.lock().unwrap(), 2);
    })
    .await;
}

#[tokio::test]
async fn scans_decode_responses_larger_than_the_grpc_default() {
    bounded(async {
        let node = Fake::new(1, vec![]);
        *node.scan_value.lock().unwrap() = vec![7; 6 * 1024 * 1024];
        let address = serve(&node).await;
        let client = client(&[&address], fast_options());

        let page = client.scan(b"a", None, 10, false).await.unwrap();
        assert!(page.more);
        assert_eq!(page.pairs.len(), 1);
        assert_eq!(page.pairs[0].0, b"a");
        assert_eq!(page.pairs[0].1.len(), 6 * 1024 * 1024);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_serves_many_tasks_with_distinct_request_ids() {
    bounded(async {
        let node = Fake::new(1, vec![]);
        let address = serve(&node).await;
        let client = client(&[&address], fast_options());

        let mut tasks = tokio::task::JoinSet::new();
        for task in 0..16u8 {
            let client = client.clone();
            tasks.spawn(async move { client.put(&[task], b"v").await });
        }
        while let Some(result) = tasks.join_next().await {
            assert_eq!(result.unwrap().unwrap(), 42);
        }
        let mut seqs: Vec<u64> = node.ids().iter().map(|id| id.unwrap().seq).collect();
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=16).collect::<Vec<u64>>());
    })
    .await;
}

/// Calls that wait for a node while others are in flight go to it together, each keeping its own
/// request id and answer; with coalescing off, or against a node that does not know `Multi`, each
/// goes alone and still succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_to_one_node_travel_together_each_with_its_own_answer() {
    bounded(async {
        async fn run(client: &Client) {
            let mut tasks = tokio::task::JoinSet::new();
            for task in 0..64u8 {
                let client = client.clone();
                tasks.spawn(async move {
                    match task % 3 {
                        0 => assert_eq!(client.put(&[task], b"v").await.unwrap(), 42),
                        1 => assert_eq!(client.delete(&[task]).await.unwrap(), 43),
                        _ => assert_eq!(client.get(b"missing").await.unwrap(), None),
                    }
                });
            }
            while let Some(result) = tasks.join_next().await {
                result.unwrap();
            }
        }
        let writes = 64 - 64 / 3;
        let slow = Duration::from_millis(30);

        let node = Arc::new(Fake { node_id: 1, multi_delay: slow, ..Fake::default() });
        let address = serve(&node).await;
        run(&client(&[&address], fast_options())).await;
        let (multis, largest) = *node.multi_calls.lock().unwrap();
        assert!(multis <= 20 && largest >= 4, "{multis} Multi calls, the largest of {largest}");
        assert_eq!(node.calls(), 64);
        let mut seqs: Vec<u64> = node.ids().iter().flatten().map(|id| id.seq).collect();
        seqs.sort_unstable();
        seqs.dedup();
        assert_eq!(seqs.len(), writes, "every write keeps its own request id");

        let alone = Fake::new(2, vec![]);
        let address = serve(&alone).await;
        run(&client(&[&address], ClientOptions { calls_in_flight_per_node: 0, ..fast_options() })).await;
        assert_eq!(alone.multi_calls.lock().unwrap().0, 0);
        assert_eq!(alone.calls(), 64);

        // One attempt each: the calls of the refused first `Multi` come back to their callers,
        // which send them alone within the same attempt.
        let older = Arc::new(Fake { node_id: 3, no_multi: true, ..Fake::default() });
        let address = serve(&older).await;
        run(&client(&[&address], ClientOptions { max_attempts: 1, ..fast_options() })).await;
        assert_eq!(older.calls(), 64, "every call answered by a node without Multi");
    })
    .await;
}

/// A call's error inside a `Multi` is that call's alone, and means what it would on its own: a
/// not-leader answer redirects it, keeping its request id.
#[tokio::test]
async fn an_error_inside_a_multi_redirects_that_call_alone() {
    bounded(async {
        let leader = Fake::new(2, vec![]);
        let leader_address = serve(&leader).await;
        let follower = Fake::new(1, vec![Step::NotLeader(Some(leader_address.clone()))]);
        let follower_address = serve(&follower).await;
        let client = client(&[&follower_address], fast_options());
        assert_eq!(client.put(b"k", b"v").await.unwrap(), 42);
        assert_eq!(follower.multi_calls.lock().unwrap().0, 1);
        assert_eq!(leader.multi_calls.lock().unwrap().0, 1);
        assert_eq!(follower.ids(), leader.ids());
    })
    .await;
}

#[test]
fn new_rejects_empty_and_malformed_endpoint_lists() {
    assert!(matches!(Client::new(vec![], ClientOptions::default()), Err(ClientError::NoEndpoints)));
    assert!(matches!(
        Client::new(vec!["https://a:1".into()], ClientOptions::default()),
        Err(ClientError::InvalidEndpoint { .. })
    ));
    let client = Client::new(vec!["http://a:1".into(), "a:1".into(), "b:2".into()], ClientOptions::default());
    assert_eq!(client.unwrap().endpoints(), ["a:1", "b:2"]);
}

/// Issue 13, finding 4: the cached leader's storage fails. It answers UNAVAILABLE with the failure
/// and no leader hint, and the followers keep naming it until they elect another leader (1–2 s with
/// the default election timeout). The default client forgets it, rides out the election, succeeds
/// on the new leader with the same request id, and sends the failed node nothing more.
#[tokio::test]
async fn a_leader_whose_storage_failed_is_left_for_the_new_leader() {
    bounded(async {
        let old = Fake::new(1, vec![]);
        let follower = Fake::new(2, vec![]);
        let new = Fake::new(3, vec![]);
        let old_address = serve(&old).await;
        let follower_address = serve(&follower).await;
        let new_address = serve(&new).await;
        let client = client(&[&old_address, &follower_address, &new_address], ClientOptions::default());
        assert_eq!(client.put(b"k", b"v").await.unwrap(), 42);
        assert_eq!(client.cached_leader().as_deref(), Some(old_address.as_str()));

        *old.always.lock().unwrap() = Some(Step::Fail(failed_node));
        *follower.always.lock().unwrap() = Some(Step::NotLeader(Some(old_address.clone())));
        *new.always.lock().unwrap() = Some(Step::NotLeader(Some(old_address.clone())));
        let election = Duration::from_millis(1500);
        after(election, &follower, Some(Step::NotLeader(Some(new_address.clone()))));
        after(election, &new, None);
        let old_calls = old.calls();
        let started = Instant::now();
        assert_eq!(client.put(b"k", b"v2").await.unwrap(), 42);
        let took = started.elapsed();
        assert!(took >= election && took < Duration::from_secs(6), "{took:?}");
        assert_eq!(client.cached_leader().as_deref(), Some(new_address.as_str()));
        let id = *new.ids().last().unwrap();
        let mut ids = old.ids()[old_calls as usize..].to_vec();
        ids.extend(follower.ids());
        assert!(ids.iter().all(|seen| *seen == id), "every retry reuses the request id: {ids:?} vs {id:?}");

        let old_calls = old.calls();
        client.put(b"k", b"v3").await.unwrap();
        client.get(b"k").await.unwrap();
        assert_eq!(old.calls(), old_calls, "the failed node gets no more traffic");
    })
    .await;
}

/// Issue 13, finding 5: the leader was killed and both followers still name it until they elect a
/// new one. The default client (8 attempts over 0.3-0.6 s before) keeps trying for its retry budget,
/// so an election of 1.5 s costs no error.
#[tokio::test]
async fn the_default_client_rides_out_an_election() {
    bounded(async {
        let dead = dead_address().await;
        let one = Fake::new(1, vec![]);
        let two = Fake::new(2, vec![]);
        let one_address = serve(&one).await;
        let two_address = serve(&two).await;
        *one.always.lock().unwrap() = Some(Step::NotLeader(Some(dead.clone())));
        *two.always.lock().unwrap() = Some(Step::NotLeader(Some(dead.clone())));
        let election = Duration::from_millis(1500);
        after(election, &one, Some(Step::NotLeader(Some(two_address.clone()))));
        after(election, &two, None);
        let client = client(&[&dead, &one_address, &two_address], ClientOptions::default());

        let started = Instant::now();
        assert_eq!(client.put(b"k", b"v").await.unwrap(), 42);
        let took = started.elapsed();
        assert!(took >= election && took < Duration::from_secs(6), "{took:?}");
        let mut ids = one.ids();
        ids.extend(two.ids());
        assert!(ids.iter().all(|id| *id == ids[0] && id.is_some()), "{ids:?}");
        assert_eq!(client.cached_leader().as_deref(), Some(two_address.as_str()));
    })
    .await;
}

/// A follower that names a dead leader is not believed over and over: once the named node's
/// connection failed, redirects to it are not followed for a while and the other nodes are asked.
#[tokio::test]
async fn redirects_to_a_node_that_refused_are_not_followed_again_and_again() {
    bounded(async {
        let (dying, accepted) = dropping_address().await;
        let one = Fake::new(1, vec![]);
        let two = Fake::new(2, vec![]);
        let one_address = serve(&one).await;
        let two_address = serve(&two).await;
        *one.always.lock().unwrap() = Some(Step::NotLeader(Some(dying.clone())));
        *two.always.lock().unwrap() = Some(Step::NotLeader(Some(dying.clone())));
        let election = Duration::from_millis(800);
        after(election, &one, Some(Step::NotLeader(Some(two_address.clone()))));
        after(election, &two, None);
        let options = ClientOptions { max_attempts: u32::MAX, ..fast_options() };
        let client = client(&[&one_address, &two_address], options);

        assert_eq!(client.put(b"k", b"v").await.unwrap(), 42);
        // Dozens of attempts were made (5-20 ms apart); the dying node was dialled once, not once
        // every other attempt.
        assert!(one.calls() + two.calls() > 10, "{} + {}", one.calls(), two.calls());
        let dials = accepted.load(Ordering::SeqCst);
        assert!((1..=2).contains(&dials), "the dying node was dialled {dials} times");
    })
    .await;
}

/// The retry budget is a time: many more attempts than the old count of 8 fit in it, the call
/// gives up when it is spent (not much before, never much after), and a stalled attempt is cut
/// short at its end.
#[tokio::test]
async fn the_retry_budget_bounds_a_call_in_time() {
    bounded(async {
        let node = Fake::new(1, vec![]);
        *node.always.lock().unwrap() = Some(Step::Fail(|| Status::unavailable("no leader yet")));
        let address = serve(&node).await;
        let budget = Duration::from_millis(800);
        let options = ClientOptions { retry_budget: budget, max_attempts: u32::MAX, ..fast_options() };
        let client = client(&[&address], options.clone());

        let started = Instant::now();
        let result = client.put(b"k", b"v").await;
        let took = started.elapsed();
        match result {
            Err(ClientError::Unavailable { attempts, elapsed, last }) => {
                // Every attempt reached the node, except perhaps a last one that the budget cut
                // short before its request arrived (and then the error says so).
                let calls = node.calls();
                let last_cut_short = last.contains("cut short by the retry budget");
                assert!(
                    attempts > 8 && (attempts == calls || (attempts == calls + 1 && last_cut_short)),
                    "{attempts} attempts, {calls} calls, last: {last}"
                );
                assert!(elapsed <= took && last.contains("no leader yet"), "{elapsed:?} {last}");
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
        // Gives up once the next backoff (at most 20 ms) would end past the budget (the upper bound
        // leaves room for a loaded machine).
        assert!(
            took >= budget - Duration::from_millis(100) && took <= budget + Duration::from_secs(1),
            "{took:?}"
        );

        // An attempt that hangs is cut at the end of the budget, not at its own 2 s timeout.
        // The failure before it is kept in the error: a timeout the budget forced says little.
        // First the put's last attempt, cut short by its budget, may still reach the node: the
        // script below is for the get alone (a loaded CI machine delivered it late once).
        let mut calls = node.calls();
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if node.calls() == calls {
                break;
            }
            calls = node.calls();
        }
        node.script.lock().unwrap().push_back(Step::Fail(|| Status::unavailable("no leader yet")));
        *node.always.lock().unwrap() = Some(Step::Stall(Duration::from_secs(10)));
        let started = Instant::now();
        let result = client.get(b"k").await;
        let took = started.elapsed();
        match result {
            Err(ClientError::Unavailable { attempts: 2, last, .. }) => assert!(
                last.contains("cut short by the retry budget") && last.contains("no leader yet"),
                "{last}"
            ),
            other => panic!("expected Unavailable after 2 attempts, got {other:?}"),
        }
        assert!(took >= budget && took < budget + Duration::from_secs(1), "{took:?}");
    })
    .await;
}

/// The fast path counts an answer for the node that gave it, not for the node the client meant to
/// ask: a node reached at another's address (it moved, a proxy) must not make a write look done
/// on a voter that never got it.
#[tokio::test]
async fn a_fast_answer_from_another_node_than_the_one_asked_counts_for_neither() {
    bounded(async {
        let durable = |node_id, leader| onekv_proto::FastWriteResponse {
            node_id,
            applied_index: 0,
            term: 3,
            leader,
            voters: vec![1, 2],
        };
        let map = onekv_placement::ClusterMap::build(&[1, 2], 1, 2).unwrap().encode();
        let listeners = [
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        ];
        let addresses: Vec<String> = listeners.iter().map(|l| l.local_addr().unwrap().to_string()).collect();
        let members: Vec<onekv_proto::Member> = (1..)
            .zip(&addresses)
            .map(|(id, address)| onekv_proto::Member { id, address: address.clone() })
            .collect();
        let fake = |node_id| {
            Arc::new(Fake { node_id, cluster_map: map.clone(), members: members.clone(), ..Fake::default() })
        };
        let (one, two) = (fake(1), fake(2));
        let [first, second] = listeners;
        for (fake, listener) in [(&one, first), (&two, second)] {
            let service = KvServer::from_arc(Arc::clone(fake));
            tokio::spawn(
                Server::builder().add_service(service).serve_with_incoming(TcpIncoming::from(listener)),
            );
        }
        let (at_one, at_two) = (&addresses[0], &addresses[1]);
        *two.fast_answer.lock().unwrap() = Some(durable(2, true));
        let options = ClientOptions { fast_path_wait: Some(Duration::from_millis(300)), ..fast_options() };
        let client = client(&[at_one, at_two], options);
        // Node 1's address answers as node 2: not done, the Raft path takes the write.
        *one.fast_answer.lock().unwrap() = Some(durable(2, true));
        let written = client.put_fast(b"k", b"v").await.unwrap();
        assert!(!written.fast && written.index == Some(42), "{written:?}");
        assert!(*one.fast_calls.lock().unwrap() >= 1 && *two.fast_calls.lock().unwrap() >= 1);
        // Answering as itself, it is done fast again once the client identified the address anew
        // (it stopped trusting it, and asks the nodes in the background).
        *one.fast_answer.lock().unwrap() = Some(durable(1, false));
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let written = client.put_fast(b"k", b"v").await.unwrap();
            if written.fast {
                assert!(written.index.is_none(), "{written:?}");
                break;
            }
            assert!(Instant::now() < deadline, "never fast again");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}
