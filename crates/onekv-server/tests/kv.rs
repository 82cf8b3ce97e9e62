//! The `Kv` service over a scripted backend: limits, proposals, read barriers, timeouts, the
//! error-to-status mapping, status; and the whole server over TCP with graceful shutdown.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Answer, FakeBackend};
use onekv_proto::{
    BatchOp, BatchRequest, CasRequest, Consistency, DeleteRangeRequest, DeleteRequest, GetRequest,
    PeerMessages, PutRequest, ScanRequest, StatusRequest, TxnCondition, TxnRequest, kv_client::KvClient,
    kv_server::Kv, peer_client::PeerClient,
};
use onekv_replica::{
    CasOutcome, Command, Condition, Outcome, RangeDeletion, ReplicaError, ReplicaStatus, RequestId,
    StorageMode, WriteOp,
};
use onekv_server::{KvService, ServerConfig};
use tonic::{Code, Request, Status};

fn config() -> ServerConfig {
    let mut config = common::three_node_config(Path::new("/unused"));
    config.limits.max_key_bytes = 10;
    config.limits.max_value_bytes = 20;
    config.limits.max_batch_ops = 3;
    config.limits.max_batch_bytes = 40;
    config.limits.max_scan_pairs = 5;
    config.limits.max_scan_bytes = 100;
    config.request_timeout_ms = 200;
    config
}

fn service() -> (Arc<FakeBackend>, KvService<FakeBackend>) {
    let backend = Arc::new(FakeBackend::default());
    (
        Arc::clone(&backend),
        KvService::new(Arc::clone(&backend), &config(), Arc::new(config().cluster_map().unwrap())),
    )
}

fn id(client: u64, seq: u64) -> Option<onekv_proto::RequestId> {
    Some(onekv_proto::RequestId { client, seq })
}

fn put(key: &[u8], value: &[u8]) -> Request<PutRequest> {
    Request::new(PutRequest { key: key.to_vec(), value: value.to_vec(), request_id: id(5, 6), expiry: None })
}

#[track_caller]
fn assert_invalid(result: Result<impl std::fmt::Debug, Status>, needle: &str) {
    let status = result.expect_err("should be rejected");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains(needle), "{:?} should mention {needle:?}", status.message());
}

#[tokio::test]
async fn writes_become_proposals_with_their_request_ids() {
    let (backend, service) = service();
    let response = service.put(put(b"k", b"v")).await.unwrap().into_inner();
    assert_eq!(response.index, 7);
    service.delete(Request::new(DeleteRequest { key: b"d".to_vec(), request_id: None })).await.unwrap();
    let ops = vec![
        BatchOp { key: b"a".to_vec(), value: Some(b"1".to_vec()), expiry: None },
        BatchOp { key: b"b".to_vec(), value: None, expiry: None },
    ];
    service.batch(Request::new(BatchRequest { ops, request_id: id(5, 7) })).await.unwrap();
    let proposed = backend.proposed.lock().unwrap().clone();
    assert_eq!(
        proposed,
        vec![
            (
                RequestId { client: 5, seq: 6 },
                Command::Write(vec![WriteOp {
                    key: b"k".to_vec(),
                    value: Some(b"v".to_vec()),
                    expiry: Default::default()
                }])
            ),
            (
                RequestId::default(),
                Command::Write(vec![WriteOp { key: b"d".to_vec(), value: None, expiry: Default::default() }])
            ),
            (
                RequestId { client: 5, seq: 7 },
                Command::Write(vec![
                    WriteOp { key: b"a".to_vec(), value: Some(b"1".to_vec()), expiry: Default::default() },
                    WriteOp { key: b"b".to_vec(), value: None, expiry: Default::default() }
                ])
            ),
        ]
    );
}

/// A TTL goes to the replica as a TTL (its leader makes it absolute from the entry's own time, so
/// every replica applies the same one); an absolute time and "keep" pass as given; nonsense is
/// refused.
#[tokio::test]
async fn expiries_are_fixed_by_the_leader_before_proposing() {
    use onekv_proto::{Expiry as Wire, expiry::When};
    use onekv_replica::Expiry;
    let (backend, service) = service();
    let expiring = |when| Some(Wire { when: Some(when) });
    let mut request = put(b"k", b"v").into_inner();
    request.expiry = expiring(When::TtlMs(60_000));
    service.put(Request::new(request)).await.unwrap();
    let ops = vec![
        BatchOp { key: b"a".to_vec(), value: Some(b"1".to_vec()), expiry: expiring(When::AtUnixMs(12_345)) },
        BatchOp { key: b"b".to_vec(), value: Some(b"2".to_vec()), expiry: expiring(When::Keep(true)) },
    ];
    service.batch(Request::new(BatchRequest { ops, request_id: None })).await.unwrap();
    let cas = CasRequest {
        key: b"c".to_vec(),
        expected: None,
        new_value: Some(b"3".to_vec()),
        request_id: None,
        new_expiry: expiring(When::TtlMs(1)),
    };
    // (The fake answers without a swap's outcome: only the proposal matters here.)
    let _ = service.cas(Request::new(cas)).await;
    let proposed = backend.proposed.lock().unwrap().clone();
    let Command::Write(ops) = &proposed[0].1 else { panic!("{proposed:?}") };
    assert_eq!(ops[0].expiry, Expiry::AfterMs(60_000));
    let Command::Write(ops) = &proposed[1].1 else { panic!("{proposed:?}") };
    assert_eq!((ops[0].expiry, ops[1].expiry), (Expiry::At(12_345), Expiry::Keep));
    let Command::Cas { new_expiry, .. } = proposed[2].1 else { panic!("{proposed:?}") };
    assert_eq!(new_expiry, Expiry::AfterMs(1));

    for (when, needle) in [
        (When::TtlMs(0), "expiry: ttl_ms must be at least 1"),
        (When::AtUnixMs(0), "expiry: at_unix_ms must be at least 1"),
        (When::Keep(false), "expiry: keep must be true"),
    ] {
        let mut request = put(b"k", b"v").into_inner();
        request.expiry = expiring(when);
        assert_invalid(service.put(Request::new(request)).await, needle);
    }
    let ops =
        vec![BatchOp { key: b"a".to_vec(), value: Some(b"1".to_vec()), expiry: expiring(When::TtlMs(0)) }];
    assert_invalid(
        service.batch(Request::new(BatchRequest { ops, request_id: None })).await,
        "ops[0].expiry",
    );
    assert_eq!(backend.proposed.lock().unwrap().len(), 3, "nothing refused was proposed");
}

#[tokio::test]
async fn cas_reports_the_outcome() {
    let (backend, service) = service();
    *backend.propose_answer.lock().unwrap() =
        Answer::Now(Ok(Outcome::swap(11, CasOutcome { swapped: false, current: Some(b"x".to_vec()) })));
    let request = CasRequest {
        key: b"k".to_vec(),
        expected: None,
        new_value: Some(b"n".to_vec()),
        request_id: id(1, 2),
        new_expiry: None,
    };
    let response = service.cas(Request::new(request)).await.unwrap().into_inner();
    assert_eq!(
        (response.swapped, response.found, response.current, response.index),
        (false, true, b"x".to_vec(), 11)
    );
    assert_eq!(
        backend.proposed.lock().unwrap()[0].1,
        Command::Cas {
            key: b"k".to_vec(),
            expected: None,
            new: Some(b"n".to_vec()),
            new_expiry: Default::default()
        }
    );

    *backend.propose_answer.lock().unwrap() =
        Answer::Now(Ok(Outcome::swap(12, CasOutcome { swapped: true, current: None })));
    let request = CasRequest {
        key: b"k".to_vec(),
        expected: Some(b"x".to_vec()),
        new_value: None,
        request_id: None,
        new_expiry: None,
    };
    let response = service.cas(Request::new(request)).await.unwrap().into_inner();
    assert_eq!((response.swapped, response.found, response.current.len()), (true, false, 0));
}

#[tokio::test]
async fn txn_proposes_conditions_and_ops_and_reports_whether_it_applied() {
    let (backend, service) = service();
    let condition = |key: &[u8], expected: Option<&[u8]>| TxnCondition {
        key: key.to_vec(),
        expected: expected.map(<[u8]>::to_vec),
    };
    let op = |key: &[u8], value: Option<&[u8]>| BatchOp {
        key: key.to_vec(),
        value: value.map(<[u8]>::to_vec),
        expiry: None,
    };
    let txn = |conditions, ops| Request::new(TxnRequest { conditions, ops, request_id: id(3, 4) });
    *backend.propose_answer.lock().unwrap() =
        Answer::Now(Ok(Outcome::swap(13, CasOutcome { swapped: false, current: None })));
    let response = service
        .txn(txn(vec![condition(b"a", Some(b"1")), condition(b"b", None)], vec![op(b"a", Some(b"2"))]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((response.applied, response.index), (false, 13));
    assert_eq!(
        backend.proposed.lock().unwrap()[0],
        (
            RequestId { client: 3, seq: 4 },
            Command::Txn {
                conditions: vec![
                    Condition { key: b"a".to_vec(), expected: Some(b"1".to_vec()) },
                    Condition { key: b"b".to_vec(), expected: None },
                ],
                ops: vec![WriteOp {
                    key: b"a".to_vec(),
                    value: Some(b"2".to_vec()),
                    expiry: Default::default()
                }],
            }
        )
    );
    *backend.propose_answer.lock().unwrap() =
        Answer::Now(Ok(Outcome::swap(14, CasOutcome { swapped: true, current: None })));
    let response = service.txn(txn(vec![], vec![op(b"a", None)])).await.unwrap().into_inner();
    assert_eq!((response.applied, response.index), (true, 14));
    // Limits, checked by the replica's own rule before anything is proposed.
    let proposals = backend.proposed.lock().unwrap().len();
    assert_invalid(service.txn(txn(vec![], vec![])).await, "empty transaction");
    assert_invalid(service.txn(txn(vec![condition(b"", None)], vec![])).await, "empty key");
    assert_invalid(service.txn(txn(vec![condition(b"k", None); 4], vec![])).await, "max_batch_ops = 3");
    assert_invalid(
        service.txn(txn(vec![condition(b"k", Some(&[0; 20]))], vec![op(b"k", Some(&[0; 20]))])).await,
        "max_batch_bytes = 40",
    );
    assert_eq!(backend.proposed.lock().unwrap().len(), proposals);
}

/// A range deletion's page: the command proposed (onekv's own keys spared, the node's page size
/// when none is asked, the limit at most max_batch_ops), its outcome, and refusals before
/// anything is proposed.
#[tokio::test]
async fn a_range_deletion_proposes_one_page_and_reports_where_the_next_starts() {
    let (backend, service) = service();
    let page = |start: &[u8], end: &[u8], limit| {
        Request::new(DeleteRangeRequest {
            shard: 0,
            start: start.to_vec(),
            end: end.to_vec(),
            limit,
            request_id: id(8, 9),
        })
    };
    *backend.propose_answer.lock().unwrap() = Answer::Now(Ok(Outcome {
        index: 21,
        cas: None,
        range: Some(RangeDeletion { deleted: 3, resume: Some(b"m".to_vec()) }),
    }));
    let response = service.delete_range(page(b"a", b"z", 0)).await.unwrap().into_inner();
    assert_eq!(
        (response.deleted, response.more, response.resume, response.index),
        (3, true, b"m".to_vec(), 21)
    );
    assert_eq!(
        backend.proposed.lock().unwrap()[0],
        (
            RequestId { client: 8, seq: 9 },
            Command::DeleteRange {
                start: b"a".to_vec(),
                end: Some(b"z".to_vec()),
                // No limit asked: the node's page, cut to its max_batch_ops (3 here).
                limit: 3,
                spare: onekv_placement::SYSTEM_PREFIX.to_vec(),
            }
        )
    );
    *backend.propose_answer.lock().unwrap() = Answer::Now(Ok(Outcome {
        index: 22,
        cas: None,
        range: Some(RangeDeletion { deleted: 0, resume: None }),
    }));
    let response = service.delete_range(page(b"", b"", 2)).await.unwrap().into_inner();
    assert_eq!((response.deleted, response.more, response.index), (0, false, 22));
    assert_eq!(
        backend.proposed.lock().unwrap()[1].1,
        Command::DeleteRange {
            start: vec![],
            end: None,
            limit: 2,
            spare: onekv_placement::SYSTEM_PREFIX.to_vec(),
        }
    );
    let proposals = backend.proposed.lock().unwrap().len();
    assert_invalid(service.delete_range(page(b"z", b"a", 0)).await, "start is after end");
    assert_invalid(service.delete_range(page(b"a", b"z", 4)).await, "max_batch_ops (3)");
    assert_invalid(service.delete_range(page(&[b'k'; 11], b"", 0)).await, "max_key_bytes = 10");
    assert_eq!(backend.proposed.lock().unwrap().len(), proposals);
}

#[tokio::test]
async fn requests_over_a_limit_are_rejected_naming_it_before_reaching_the_replica() {
    let (backend, service) = service();
    assert_invalid(service.put(put(b"", b"v")).await, "key is empty");
    assert_invalid(service.put(put(&[b'k'; 11], b"v")).await, "limits.max_key_bytes = 10");
    assert_invalid(service.put(put(b"k", &[0; 21])).await, "limits.max_value_bytes = 20");
    assert_invalid(
        service.delete(Request::new(DeleteRequest { key: vec![], request_id: None })).await,
        "key is empty",
    );
    let op = |key: &[u8], value: Option<&[u8]>| BatchOp {
        key: key.to_vec(),
        value: value.map(<[u8]>::to_vec),
        expiry: None,
    };
    let batch = |ops| Request::new(BatchRequest { ops, request_id: None });
    assert_invalid(service.batch(batch(vec![])).await, "no operations");
    assert_invalid(service.batch(batch(vec![op(b"a", None); 4])).await, "limits.max_batch_ops = 3");
    assert_invalid(service.batch(batch(vec![op(b"a", None), op(b"", None)])).await, "ops[1].key is empty");
    assert_invalid(service.batch(batch(vec![op(b"a", Some(&[0; 21]))])).await, "ops[0].value is 21 bytes");
    assert_invalid(
        service.batch(batch(vec![op(b"a", Some(&[0; 20])), op(b"b", Some(&[0; 20]))])).await,
        "limits.max_batch_bytes = 40",
    );
    let cas = |expected: Option<Vec<u8>>, new_value: Option<Vec<u8>>| {
        Request::new(CasRequest {
            key: b"k".to_vec(),
            expected,
            new_value,
            request_id: None,
            new_expiry: None,
        })
    };
    assert_invalid(service.cas(cas(Some(vec![0; 21]), None)).await, "expected is 21 bytes");
    assert_invalid(service.cas(cas(None, Some(vec![0; 21]))).await, "new_value is 21 bytes");
    assert_invalid(service.cas(cas(Some(vec![0; 20]), Some(vec![0; 20]))).await, "limits.max_batch_bytes");
    let get = |key: &[u8], consistency| Request::new(GetRequest { key: key.to_vec(), consistency });
    assert_invalid(service.get(get(b"", 0)).await, "key is empty");
    assert_invalid(service.get(get(&[1; 11], 0)).await, "limits.max_key_bytes");
    assert_invalid(service.get(get(b"k", 7)).await, "unknown consistency 7");
    let scan = |start: &[u8], end: &[u8], limit| {
        Request::new(ScanRequest {
            shard: 0,
            start: start.to_vec(),
            end: end.to_vec(),
            limit,
            reverse: false,
            consistency: 0,
            keys_only: false,
        })
    };
    assert_invalid(service.scan(scan(b"", b"", 6)).await, "limits.max_scan_pairs = 5");
    assert_invalid(service.scan(scan(&[1; 11], b"", 1)).await, "start is 11 bytes");
    assert_invalid(service.scan(scan(b"", &[1; 11], 1)).await, "end is 11 bytes");
    assert_invalid(service.scan(scan(b"b", b"a", 1)).await, "start is after end");
    assert!(backend.calls().is_empty(), "nothing reached the replica: {:?}", backend.calls());
}

#[tokio::test]
async fn linearizable_reads_wait_for_the_barrier_and_stale_reads_do_not() {
    let (backend, service) = service();
    backend.data.lock().unwrap().insert(b"k".to_vec(), b"v".to_vec());
    let get = |consistency: Consistency| {
        Request::new(GetRequest { key: b"k".to_vec(), consistency: consistency as i32 })
    };
    let response = service.get(get(Consistency::Linearizable)).await.unwrap().into_inner();
    assert_eq!((response.found, response.value), (true, b"v".to_vec()));
    assert_eq!(backend.calls(), vec!["barrier", "get"]);
    let response = service.get(get(Consistency::Stale)).await.unwrap().into_inner();
    assert!(response.found);
    assert_eq!(backend.calls(), vec!["barrier", "get", "get"]);
    let missing =
        service.get(Request::new(GetRequest { key: b"zz".to_vec(), consistency: 1 })).await.unwrap();
    assert!(!missing.into_inner().found);

    // A failed barrier fails the read without reading.
    *backend.barrier_answer.lock().unwrap() = Answer::Now(Err(ReplicaError::NotLeader { leader: Some(2) }));
    let status = service.get(get(Consistency::Linearizable)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(backend.calls().last(), Some(&"barrier"));
}

#[tokio::test]
async fn scans_pass_their_range_and_limit() {
    let (backend, service) = service();
    for key in [b"a", b"b", b"c", b"d"] {
        backend.data.lock().unwrap().insert(key.to_vec(), b"v".to_vec());
    }
    let request = ScanRequest {
        shard: 0,
        start: b"b".to_vec(),
        end: vec![],
        limit: 0,
        reverse: true,
        consistency: 1,
        keys_only: false,
    };
    let response = service.scan(Request::new(request)).await.unwrap().into_inner();
    let keys: Vec<Vec<u8>> = response.pairs.into_iter().map(|pair| pair.key).collect();
    assert_eq!(keys, vec![b"d".to_vec(), b"c".to_vec(), b"b".to_vec()]);
    assert!(!response.more);
    // limit 0 means the maximum; an empty end means no end; one more is asked for, in case
    // onekv's own key is among them.
    assert_eq!(backend.scans.lock().unwrap()[0], (b"b".to_vec(), None, 6, true));

    let request = ScanRequest {
        shard: 0,
        start: vec![],
        end: b"d".to_vec(),
        limit: 2,
        reverse: false,
        consistency: 0,
        keys_only: false,
    };
    let response = service.scan(Request::new(request)).await.unwrap().into_inner();
    assert_eq!(response.pairs.len(), 2);
    assert!(response.more);
    assert_eq!(backend.scans.lock().unwrap()[1], (vec![], Some(b"d".to_vec()), 3, false));
    assert_eq!(backend.calls(), vec!["scan", "barrier", "scan"]);
}

#[tokio::test]
async fn keys_only_scans_return_keys_without_values() {
    let (backend, service) = service();
    for key in [b"a", b"b", b"c"] {
        backend.data.lock().unwrap().insert(key.to_vec(), b"value".to_vec());
    }
    let request = ScanRequest {
        shard: 0,
        start: b"b".to_vec(),
        end: vec![],
        limit: 0,
        reverse: false,
        consistency: 1,
        keys_only: true,
    };
    let response = service.scan(Request::new(request)).await.unwrap().into_inner();
    let pairs: Vec<(Vec<u8>, Vec<u8>)> =
        response.pairs.into_iter().map(|pair| (pair.key, pair.value)).collect();
    assert_eq!(pairs, vec![(b"b".to_vec(), vec![]), (b"c".to_vec(), vec![])]);
    assert!(!response.more);
    assert_eq!(backend.scans.lock().unwrap()[0], (b"b".to_vec(), None, 6, false));
}

#[tokio::test]
async fn onekvs_own_keys_are_read_only_and_left_out_of_scans() {
    let (backend, service) = service();
    // Under the reserved prefix, and short enough for this test's key limit.
    let system: &[u8] = b"\xffonekv/x";
    assert!(onekv_server::members::is_system_key(system));
    assert_invalid(service.put(put(system, b"v")).await, "reserves");
    assert_invalid(
        service.delete(Request::new(DeleteRequest { key: system.to_vec(), request_id: None })).await,
        "reserves",
    );
    let ops = vec![BatchOp { key: system.to_vec(), value: None, expiry: None }];
    assert_invalid(service.batch(Request::new(BatchRequest { ops, request_id: None })).await, "reserves");
    let cas = CasRequest {
        key: system.to_vec(),
        expected: None,
        new_value: Some(b"v".to_vec()),
        request_id: None,
        new_expiry: None,
    };
    assert_invalid(service.cas(Request::new(cas)).await, "reserves");
    let ops = vec![BatchOp { key: system.to_vec(), value: Some(b"v".to_vec()), expiry: None }];
    let txn = TxnRequest { conditions: vec![], ops, request_id: None };
    assert_invalid(service.txn(Request::new(txn)).await, "reserves");
    assert!(backend.proposed.lock().unwrap().is_empty(), "nothing reached the replica");

    // Reads are allowed; scans skip the key and still fill their page.
    backend.data.lock().unwrap().insert(system.to_vec(), b"list".to_vec());
    for key in [b"a", b"b"] {
        backend.data.lock().unwrap().insert(key.to_vec(), b"v".to_vec());
    }
    let get = GetRequest { key: system.to_vec(), consistency: 1 };
    assert_eq!(service.get(Request::new(get)).await.unwrap().into_inner().value, b"list");
    let scan = |reverse, limit| ScanRequest {
        shard: 0,
        start: vec![],
        end: vec![],
        limit,
        reverse,
        consistency: 1,
        keys_only: false,
    };
    let response = service.scan(Request::new(scan(true, 2))).await.unwrap().into_inner();
    let keys: Vec<Vec<u8>> = response.pairs.into_iter().map(|pair| pair.key).collect();
    assert_eq!((keys, response.more), (vec![b"b".to_vec(), b"a".to_vec()], false));
    let response = service.scan(Request::new(scan(false, 1))).await.unwrap().into_inner();
    let keys: Vec<Vec<u8>> = response.pairs.into_iter().map(|pair| pair.key).collect();
    assert_eq!((keys, response.more), (vec![b"a".to_vec()], true));
}

/// A `Multi` answers each call as that call alone would have been answered (its limits, its
/// not-leader metadata), each as soon as it is done: a call that never commits holds back no other.
#[tokio::test]
async fn a_multi_answers_each_call_as_if_alone_and_as_soon_as_it_is_done() {
    use onekv_client::coalesce::MAX_MULTI_CALLS;
    use onekv_proto::multi_call::Call;
    use onekv_proto::multi_result::Result as Reply;
    use onekv_proto::{MultiCall, MultiRequest, MultiResult};

    async fn answers(service: &KvService<FakeBackend>, calls: &[Call], wanted: usize) -> Vec<MultiResult> {
        let calls = calls.iter().map(|call| MultiCall { call: Some(call.clone()) }).collect();
        let mut stream = service.multi(Request::new(MultiRequest { calls })).await.unwrap().into_inner();
        let mut answers = Vec::new();
        while answers.len() < wanted {
            answers.push(futures_util::StreamExt::next(&mut stream).await.unwrap().unwrap());
        }
        answers
    }

    let (backend, service) = service();
    backend.data.lock().unwrap().insert(b"g".to_vec(), b"found".to_vec());
    let calls = vec![
        Call::Put(put(b"k", b"v").into_inner()),
        Call::Put(put(b"k", &[0; 21]).into_inner()),
        Call::Delete(DeleteRequest { key: b"d".to_vec(), request_id: id(5, 8) }),
        Call::Get(GetRequest { key: b"g".to_vec(), consistency: 0 }),
        Call::Get(GetRequest { key: b"zz".to_vec(), consistency: 0 }),
    ];
    let mut results = answers(&service, &calls, 5).await;
    results.sort_by_key(|result| result.call);
    let results: Vec<Reply> = results.into_iter().map(|result| result.result.unwrap()).collect();
    assert!(matches!(&results[0], Reply::Write(w) if w.index == 7));
    assert!(
        matches!(&results[1], Reply::Error(e) if e.code == Code::InvalidArgument as i32 && e.message.contains("max_value_bytes")),
        "{:?}",
        results[1]
    );
    assert!(matches!(&results[2], Reply::Write(_)));
    assert!(matches!(&results[3], Reply::Get(g) if g.found && g.value == b"found"));
    assert!(matches!(&results[4], Reply::Get(g) if !g.found));
    assert_eq!(backend.proposed.lock().unwrap().len(), 2, "the put over the limit never reached the replica");

    // A not-leader answer carries the leader, as its own call's metadata would.
    *backend.propose_answer.lock().unwrap() = Answer::Now(Err(ReplicaError::NotLeader { leader: Some(3) }));
    match answers(&service, &calls[..1], 1).await[0].result.clone().unwrap() {
        Reply::Error(e) => {
            assert_eq!(
                (e.code, e.leader_id, e.leader_addr.as_str()),
                (Code::FailedPrecondition as i32, 3, "127.0.0.1:7003")
            )
        }
        other => panic!("{other:?}"),
    }

    // A put that never commits: the get after it is answered anyway.
    *backend.propose_answer.lock().unwrap() = Answer::Hold;
    let first = tokio::time::timeout(
        Duration::from_secs(1),
        answers(&service, &[calls[0].clone(), calls[3].clone()], 1),
    )
    .await
    .expect("the get is answered while the put waits");
    assert_eq!(first[0].call, 1);

    let too_many = vec![calls[3].clone(); MAX_MULTI_CALLS + 1];
    let too_many = too_many.into_iter().map(|call| MultiCall { call: Some(call) }).collect();
    assert_invalid(
        service.multi(Request::new(MultiRequest { calls: too_many })).await.map(|_| ()),
        "at most 256",
    );
}

#[tokio::test]
async fn not_leader_names_the_leader_in_metadata() {
    let (backend, service) = service();
    *backend.propose_answer.lock().unwrap() = Answer::Now(Err(ReplicaError::NotLeader { leader: Some(3) }));
    let status = service.put(put(b"k", b"v")).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    let metadata = status.metadata();
    assert_eq!(metadata.get(onekv_proto::LEADER_ID_METADATA).unwrap().to_str().unwrap(), "3");
    assert_eq!(metadata.get(onekv_proto::LEADER_ADDR_METADATA).unwrap().to_str().unwrap(), "127.0.0.1:7003");
    assert!(status.message().contains("node 3 at 127.0.0.1:7003"), "{}", status.message());

    // No known leader: UNAVAILABLE, as the protocol says, without leader metadata.
    *backend.propose_answer.lock().unwrap() = Answer::Now(Err(ReplicaError::NotLeader { leader: None }));
    let status = service.put(put(b"k", b"v")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert!(status.metadata().get(onekv_proto::LEADER_ID_METADATA).is_none());
}

#[tokio::test]
async fn replica_errors_map_to_the_documented_codes() {
    let cases = [
        (ReplicaError::InvalidArgument("bad".into()), Code::InvalidArgument),
        (ReplicaError::Dropped("leader changed".into()), Code::Unavailable),
        (ReplicaError::Stopping, Code::Unavailable),
        (ReplicaError::Storage("disk".into()), Code::Unavailable),
        (ReplicaError::Open("no".into()), Code::Internal),
    ];
    let (backend, service) = service();
    for (error, code) in cases {
        *backend.propose_answer.lock().unwrap() = Answer::Now(Err(error.clone()));
        let status = service.put(put(b"k", b"v")).await.unwrap_err();
        assert_eq!(status.code(), code, "{error:?}");
    }
}

/// A damaged stored value is DATA_LOSS naming the key and the position, not a node-wide failure.
#[test]
fn a_damaged_value_is_data_loss() {
    let error = ReplicaError::Corrupt { key: b"k1".to_vec(), position: 4096 };
    let members = onekv_server::members::Directory::from_config(&config()).unwrap().current();
    let status = onekv_server::service::replica_error_status(error, &members);
    assert_eq!(status.code(), Code::DataLoss);
    assert!(status.message().contains("\"k1\"") && status.message().contains("4096"), "{}", status.message());
}

/// A read that meets a damaged value waits for the replica's repair and is served; without one
/// within half the request timeout it answers DATA_LOSS.
#[tokio::test]
async fn a_read_of_a_damaged_value_waits_for_its_repair() {
    let (backend, service) = service();
    backend.data.lock().unwrap().insert(b"k".to_vec(), b"healthy".to_vec());
    let corrupt = || ReplicaError::Corrupt { key: b"k".to_vec(), position: 1 };
    backend.get_errors.lock().unwrap().extend([corrupt(), corrupt(), corrupt()]);
    let get =
        || Request::new(GetRequest { key: b"k".to_vec(), consistency: Consistency::Linearizable as i32 });
    let response = service.get(get()).await.unwrap().into_inner();
    assert_eq!((response.found, response.value.as_slice()), (true, &b"healthy"[..]));
    assert_eq!(backend.calls.lock().unwrap().iter().filter(|call| **call == "get").count(), 4);

    // Never repaired: DATA_LOSS once half the 200 ms request timeout has passed.
    backend.get_errors.lock().unwrap().extend((0..1000).map(|_| corrupt()));
    let started = Instant::now();
    let status = service.get(get()).await.unwrap_err();
    assert_eq!(status.code(), Code::DataLoss, "{status:?}");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(100) && waited < Duration::from_secs(2), "{waited:?}");
}

#[tokio::test]
async fn status_reports_damaged_values_and_the_scrub() {
    let (backend, service) = service();
    *backend.status.lock().unwrap() = ReplicaStatus {
        corrupt_values: 2,
        repaired_values: 1,
        scrub: onekv_replica::ScrubStatus {
            enabled: true,
            passes: 3,
            values_checked: 30,
            last_pass_finished_unix_ms: 1_700_000_000_000,
            last_pass_values: 10,
            last_pass_corrupt: 1,
        },
        ..ReplicaStatus::default()
    };
    let status = service.status(Request::new(StatusRequest {})).await.unwrap().into_inner();
    assert_eq!((status.corrupt_values, status.repaired_values), (2, 1));
    let scrub = status.scrub.unwrap();
    assert!(scrub.enabled);
    assert_eq!(
        (scrub.passes, scrub.values_checked, scrub.last_pass_finished_unix_ms),
        (3, 30, 1_700_000_000_000)
    );
    assert_eq!((scrub.last_pass_values, scrub.last_pass_corrupt), (10, 1));
}

#[tokio::test]
async fn a_failed_replica_answers_unavailable_with_the_failure_and_no_leader_hint() {
    let (backend, service) = service();
    let failure = "appending Raft entries: No space left on device";
    *backend.propose_answer.lock().unwrap() = Answer::Now(Err(ReplicaError::Storage(failure.into())));
    *backend.barrier_answer.lock().unwrap() = Answer::Now(Err(ReplicaError::Storage(failure.into())));
    let write = service.put(put(b"k", b"v")).await.unwrap_err();
    let read =
        service.get(Request::new(GetRequest { key: b"k".to_vec(), consistency: 0 })).await.unwrap_err();
    for status in [write, read] {
        // UNAVAILABLE is what makes the client forget this node as leader and ask another one.
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(status.message().contains(failure), "{}", status.message());
        assert!(status.metadata().get(onekv_proto::LEADER_ID_METADATA).is_none());
        assert!(status.metadata().get(onekv_proto::LEADER_ADDR_METADATA).is_none());
    }

    // A read that fails on one value while the replica still serves stays INTERNAL: another
    // member would only send the client back here.
    *backend.get_error.lock().unwrap() = Some(ReplicaError::Storage("checksum mismatch".into()));
    let stale = || Request::new(GetRequest { key: b"k".to_vec(), consistency: Consistency::Stale.into() });
    let status = service.get(stale()).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    // Once the replica has failed, its frozen copy is not read even stale, and a read error that
    // races with the failure is the failed-node answer too.
    backend.status.lock().unwrap().failure = Some(failure.into());
    let status = service.get(stale()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains(failure), "{}", status.message());
    *backend.get_error.lock().unwrap() = None;
    let status = service.get(stale()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let scan = ScanRequest {
        shard: 0,
        start: vec![],
        end: vec![],
        limit: 0,
        reverse: false,
        consistency: 1,
        keys_only: false,
    };
    let status = service.scan(Request::new(scan)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains(failure), "{}", status.message());
}

/// Serves a `Kv` service over `backend` on a fresh port of 127.0.0.1; returns `host:port`.
async fn serve_kv(backend: &Arc<FakeBackend>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let service = KvService::new(Arc::clone(backend), &config(), Arc::new(config().cluster_map().unwrap()))
        .into_server();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming));
    address
}

/// Puts that never commit, coalesced into `Multi` calls that take every in-flight slot the client
/// has for the node, do not hold back later reads to it beyond a slot's short hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_never_commit_do_not_hold_back_later_reads_to_the_node() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let backend = Arc::new(FakeBackend::default());
        backend.data.lock().unwrap().insert(b"k".to_vec(), b"v".to_vec());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let mut slow = config();
        slow.request_timeout_ms = 20_000;
        let service =
            KvService::new(Arc::clone(&backend), &slow, Arc::new(slow.cluster_map().unwrap())).into_server();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tokio::spawn(tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming));
        let options = onekv_client::ClientOptions {
            request_timeout: Duration::from_secs(25),
            retry_budget: Duration::from_secs(25),
            ..onekv_client::ClientOptions::default()
        };
        let client = onekv_client::Client::new(vec![address], options).unwrap();
        assert_eq!(client.get(b"k").await.unwrap(), Some(b"v".to_vec()));

        *backend.propose_answer.lock().unwrap() = Answer::Hold;
        let mut writers = tokio::task::JoinSet::new();
        for i in 0..16u8 {
            let client = client.clone();
            writers.spawn(async move { client.put(&[b'w', i], b"x").await });
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        for _ in 0..5 {
            assert_eq!(client.get(b"k").await.unwrap(), Some(b"v".to_vec()));
        }
        assert!(started.elapsed() < Duration::from_secs(2), "reads took {:?}", started.elapsed());
        assert!(writers.try_join_next().is_none(), "the puts are still waiting for their commit");
        writers.abort_all();
    })
    .await
    .expect("bounded");
}

/// Issue 13, finding 4: a leader whose storage failed kept every client, because its INTERNAL
/// answer was final for the client. Now the real client, talking to the real service, moves on.
#[tokio::test]
async fn the_client_leaves_a_leader_whose_storage_failed() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let failing = Arc::new(FakeBackend::default());
        let healthy = Arc::new(FakeBackend::default());
        let failing_address = serve_kv(&failing).await;
        let healthy_address = serve_kv(&healthy).await;
        let options = onekv_client::ClientOptions {
            backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(20),
            ..onekv_client::ClientOptions::default()
        };
        let client =
            onekv_client::Client::new(vec![failing_address.clone(), healthy_address.clone()], options)
                .unwrap();
        client.put(b"k", b"v").await.unwrap();
        assert_eq!(client.cached_leader().as_deref(), Some(failing_address.as_str()));

        // Its disk fills: the replica fails every request from now on.
        let failure = "appending Raft entries: No space left on device (os error 28)";
        failing.status.lock().unwrap().failure = Some(failure.into());
        *failing.propose_answer.lock().unwrap() = Answer::Now(Err(ReplicaError::Storage(failure.into())));
        *failing.barrier_answer.lock().unwrap() = Answer::Now(Err(ReplicaError::Storage(failure.into())));
        assert_eq!(client.put(b"k", b"v2").await.unwrap(), 7, "served by the healthy node");
        assert_eq!(client.cached_leader().as_deref(), Some(healthy_address.as_str()));
        let failing_calls = failing.calls().len();
        client.put(b"k", b"v3").await.unwrap();
        client.get(b"k").await.unwrap();
        assert_eq!(failing.calls().len(), failing_calls, "the failed node gets no more traffic");
        assert_eq!(healthy.calls(), ["propose", "propose", "barrier", "get"]);
    })
    .await
    .expect("the test exceeded its time bound");
}

#[tokio::test]
async fn a_write_that_does_not_commit_in_time_is_deadline_exceeded() {
    let (backend, service) = service();
    *backend.propose_answer.lock().unwrap() = Answer::Hold;
    let started = Instant::now();
    let status = service.put(put(b"k", b"v")).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert!(status.message().contains("same request id"), "{}", status.message());
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(200) && waited < Duration::from_secs(3), "{waited:?}");

    *backend.barrier_answer.lock().unwrap() = Answer::Hold;
    let status =
        service.get(Request::new(GetRequest { key: b"k".to_vec(), consistency: 0 })).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);

    *backend.propose_answer.lock().unwrap() = Answer::Drop;
    let status = service.put(put(b"k", b"v")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
}

#[tokio::test]
async fn status_reports_the_replica_and_the_members() {
    let (backend, service) = service();
    *backend.status.lock().unwrap() = ReplicaStatus {
        node_id: 1,
        leader_id: Some(2),
        term: 4,
        role: "follower".into(),
        commit_index: 10,
        applied_index: 9,
        first_index: 1,
        last_index: 10,
        flushed_index: 5,
        storage: StorageMode::Separated,
        log_bytes: 1000,
        bytes_written: 300,
        user_bytes: 100,
        ..ReplicaStatus::default()
    };
    let status = service.status(Request::new(StatusRequest {})).await.unwrap().into_inner();
    assert_eq!(status.node_id, 1);
    assert_eq!(status.members.len(), 3);
    assert_eq!(status.members[2].address, "127.0.0.1:7003");
    assert_eq!((status.leader_id, status.term, status.role.as_str()), (2, 4, "follower"));
    assert_eq!(
        (status.commit_index, status.applied_index, status.first_index, status.last_index),
        (10, 9, 1, 10)
    );
    assert_eq!(
        (status.flushed_index, status.log_bytes, status.storage_mode.as_str()),
        (5, 1000, "separated")
    );
    assert_eq!(status.write_amplification, 3.0);

    *backend.status.lock().unwrap() = ReplicaStatus::default();
    let status = service.status(Request::new(StatusRequest {})).await.unwrap().into_inner();
    assert_eq!((status.leader_id, status.write_amplification), (0, 0.0));
}

#[test]
fn grpc_message_limits_admit_what_the_limits_allow() {
    let limits = onekv_replica::Limits::default();
    assert!(onekv_server::service::max_request_bytes(&limits) > limits.max_batch_bytes);
    assert!(onekv_server::service::max_request_bytes(&limits) < 2 * limits.max_batch_bytes);
    assert!(onekv_server::service::max_response_bytes(&limits) > limits.max_scan_bytes);
    // However small the limits, the largest `Multi` a client coalesces gets in (each of its calls
    // is checked alone).
    let multi = onekv_client::coalesce::MAX_MULTI_BYTES + onekv_client::coalesce::MAX_MULTI_CALLS * 64;
    assert!(onekv_server::service::max_request_bytes(&config().limits.to_limits()) > multi);
}

/// The real server over TCP: requests larger than tonic's 4 MiB default get through, and shutdown
/// waits for an in-flight request (refusing new ones, while Raft messages still reach the replica)
/// and then stops accepting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_backend_over_tcp_and_stop_gracefully() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let backend = Arc::new(FakeBackend::default());
        let mut config = common::three_node_config(Path::new("/unused"));
        let secret_dir = tempfile::tempdir().unwrap();
        let secret = common::with_secret_file(&mut config, secret_dir.path());
        config.request_timeout_ms = 2000;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn({
            let backend = Arc::clone(&backend);
            async move {
                onekv_server::serve_backend(listener, &config, backend, async {
                    let _ = stopped.await;
                })
                .await
            }
        });

        let mut client = KvClient::connect(format!("http://{address}")).await.unwrap();
        let value = vec![7u8; 1 << 20];
        let ops: Vec<BatchOp> = (0..4u8)
            .map(|i| BatchOp {
                key: vec![b'k', i],
                value: Some(value[..(1 << 20) - 10].to_vec()),
                expiry: None,
            })
            .collect();
        client.batch(BatchRequest { ops, request_id: None }).await.expect("a ~4 MiB batch is accepted");

        // A write held by the replica is in flight when shutdown begins: it completes (with its
        // timeout) before the server stops.
        *backend.propose_answer.lock().unwrap() = Answer::Hold;
        let in_flight = tokio::spawn({
            let mut client = client.clone();
            async move {
                client
                    .put(PutRequest {
                        key: b"k".to_vec(),
                        value: b"v".to_vec(),
                        request_id: None,
                        expiry: None,
                    })
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;

        // Draining: a new client request is refused, a peer's Raft message still gets through.
        let refused = client.get(GetRequest { key: b"k".to_vec(), consistency: 0 }).await.unwrap_err();
        assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
        let mut message = raft::eraftpb::Message::default();
        message.set_msg_type(raft::eraftpb::MessageType::MsgHeartbeat);
        (message.from, message.to, message.term) = (2, 1, 5);
        let mut peer = PeerClient::connect(format!("http://{address}")).await.unwrap();
        let mut request = Request::new(PeerMessages {
            from: 2,
            messages: vec![protobuf::Message::write_to_bytes(&message).unwrap()],
            shards: vec![1],
        });
        request.metadata_mut().insert(onekv_server::auth::PEER_SECRET_METADATA, secret.metadata_value());
        peer.send(request).await.expect("the Peer service keeps serving while the node drains");
        assert_eq!(backend.stepped.lock().unwrap().len(), 1, "the message reached the replica");

        let result = in_flight.await.unwrap();
        assert_eq!(
            result.unwrap_err().code(),
            Code::DeadlineExceeded,
            "the in-flight request got its answer"
        );
        server.await.unwrap().expect("the server stops cleanly");
        assert!(tokio::net::TcpStream::connect(address).await.is_err(), "no longer accepting");
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn serve_refuses_an_invalid_config_before_touching_data() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let mut config = common::three_node_config(&data_dir);
    config.raft.election_ticks = 1;
    let error = onekv_server::serve(config, std::future::pending()).await.unwrap_err();
    let message = format!("{error:#}");
    assert!(message.contains("raft.election_ticks"), "{message}");
    assert!(!data_dir.exists(), "the data directory was not created");
}

/// Serves `backend` with `config` on a free port; returns the address and the server task (which
/// stops when the returned sender is used or dropped).
async fn serve_on_tcp(
    config: ServerConfig,
    backend: Arc<FakeBackend>,
) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<anyhow::Result<()>>) {
    // These tests use no peer; the configuration's secret file does not exist.
    let mut config = config;
    config.peer_secret_file = None;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        onekv_server::serve_backend(listener, &config, backend, async {
            let _ = stopped.await;
        })
        .await
    });
    (address, stop, server)
}

/// A put whose value is over tonic's 4 MiB (and over the largest request the limits allow) is
/// refused before it is read, with INVALID_ARGUMENT naming the limits, as a slightly oversized
/// value is, not with tonic's bare OUT_OF_RANGE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_put_is_invalid_argument_naming_the_limit() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let backend = Arc::new(FakeBackend::default());
        let config = common::three_node_config(Path::new("/unused"));
        let limits = config.limits.to_limits();
        let (address, _stop, _server) = serve_on_tcp(config, Arc::clone(&backend)).await;
        let mut client = KvClient::connect(format!("http://{address}")).await.unwrap();
        let put = |len: usize| PutRequest {
            key: b"k".to_vec(),
            value: vec![1; len],
            request_id: None,
            expiry: None,
        };

        // Over max_value_bytes but within what the transport reads: the service's own check.
        let status = client.put(put(limits.max_value_bytes + 1)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains("limits.max_value_bytes"), "{}", status.message());

        // Over the largest request the limits allow (about 4 MiB): refused from the frame header.
        let largest = onekv_server::service::max_request_bytes(&limits);
        for len in [largest + 1, 2 * largest, 64 << 20] {
            let status = client.put(put(len)).await.unwrap_err();
            assert_eq!(status.code(), Code::InvalidArgument, "a {len}-byte value: {status:?}");
            for named in ["limits.max_value_bytes", "limits.max_batch_bytes", &largest.to_string()] {
                assert!(status.message().contains(named), "{named} in {}", status.message());
            }
        }
        assert!(backend.proposed.lock().unwrap().is_empty(), "nothing oversized was proposed");

        // The connection still serves.
        client.put(put(10)).await.expect("a small put after the refusals");
    })
    .await
    .unwrap();
}

/// At most `limits.max_concurrent_requests` client calls are handled at once: one more is refused
/// at once (UNAVAILABLE, which clients retry, naming the bound) and never reaches the replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_calls_beyond_the_bound_are_refused() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let backend = Arc::new(FakeBackend::default());
        *backend.propose_answer.lock().unwrap() = Answer::Hold;
        let mut config = common::three_node_config(Path::new("/unused"));
        config.limits.max_concurrent_requests = 2;
        config.request_timeout_ms = 1000;
        let (address, _stop, _server) = serve_on_tcp(config, Arc::clone(&backend)).await;
        let client = KvClient::connect(format!("http://{address}")).await.unwrap();
        let put = |i: u8| {
            let mut client = client.clone();
            tokio::spawn(async move {
                client
                    .put(PutRequest {
                        key: vec![b'k', i],
                        value: b"v".to_vec(),
                        request_id: None,
                        expiry: None,
                    })
                    .await
            })
        };
        let held = [put(0), put(1)];
        let deadline = Instant::now() + Duration::from_secs(5);
        while backend.proposed.lock().unwrap().len() < 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let status = put(2).await.unwrap().unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(status.message().contains("limits.max_concurrent_requests = 2"), "{}", status.message());
        assert_eq!(backend.proposed.lock().unwrap().len(), 2, "the refused call reached nothing");
        for call in held {
            assert_eq!(call.await.unwrap().unwrap_err().code(), Code::DeadlineExceeded);
        }
        // Their permits are back.
        *backend.propose_answer.lock().unwrap() = Answer::Now(Ok(Outcome::at(9)));
        put(3).await.unwrap().expect("admitted again");
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_disk_full_refusal_is_resource_exhausted_and_says_disk_full() {
    let (backend, service) = service();
    let refusal = ReplicaError::DiskFull("/data has 10 bytes free, below min_free_bytes = 100".into());
    *backend.propose_answer.lock().unwrap() = Answer::Now(Err(refusal));
    let status = service.put(put(b"k", b"v")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().starts_with("disk full: /data has 10 bytes free"), "{}", status.message());
}

#[tokio::test]
async fn a_client_in_the_node_reaches_its_own_service_without_a_connection() {
    // Members on ports nothing listens on: a call that went over a connection would be refused.
    let mut config = config();
    for member in &mut config.members {
        member.address = format!("127.0.0.1:{}", member.id);
    }
    config.listen = config.members[0].address.clone();
    let backend = Arc::new(FakeBackend::default());
    let map = Arc::new(config.cluster_map().unwrap());
    let service = KvService::new(Arc::clone(&backend), &config, map);
    let options =
        onekv_client::ClientOptions { retry_budget: Duration::from_millis(300), ..Default::default() };
    let client = onekv_client::Client::new(vec![config.listen.clone()], options).unwrap();
    let refused = client.put(b"k", b"v").await.expect_err("nothing listens on port 1");
    assert!(backend.proposed.lock().unwrap().is_empty(), "{refused}");

    client.serve_locally(&config.listen, onekv_server::local_kv_service(service.into_server())).unwrap();
    client.put(b"k", b"v").await.unwrap();
    assert_eq!(
        backend.proposed.lock().unwrap().last().map(|(_, command)| command.clone()),
        Some(Command::Write(vec![WriteOp {
            key: b"k".to_vec(),
            value: Some(b"v".to_vec()),
            expiry: Default::default()
        }]))
    );
    backend.data.lock().unwrap().insert(b"k".to_vec(), b"stored".to_vec());
    assert_eq!(client.get(b"k").await.unwrap(), Some(b"stored".to_vec()));
    // The service's limits hold in process as over the network.
    let error = client.put(b"k", &[0; 21]).await.expect_err("over limits.max_value_bytes");
    assert!(error.to_string().contains("max_value_bytes"), "{error}");
}

/// A fast write is checked like a batch, needs a request id, and is refused once its deadline
/// passed (a write delayed that long must not be taken as new); the backend's refusal (no fast
/// path here) reaches the client as the error the client falls back on.
#[tokio::test]
async fn fast_writes_are_checked_and_refused_after_their_deadline() {
    use onekv_proto::FastWriteRequest;
    let (_backend, service) = service();
    let op = |key: &[u8]| BatchOp { key: key.to_vec(), value: Some(b"v".to_vec()), expiry: None };
    let now_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let request = |ops, request_id, deadline_unix_ms| {
        Request::new(FastWriteRequest { ops, request_id, deadline_unix_ms })
    };
    assert_invalid(service.fast_write(request(vec![], id(1, 1), 0)).await, "no operations");
    assert_invalid(service.fast_write(request(vec![op(b"k")], None, 0)).await, "request id");
    assert_invalid(
        service.fast_write(request(vec![op(b"a-key-too-long")], id(1, 1), 0)).await,
        "max_key_bytes",
    );
    let late = service.fast_write(request(vec![op(b"k")], id(1, 1), now_ms - 1_000)).await.unwrap_err();
    assert_eq!(late.code(), Code::DeadlineExceeded, "{late:?}");
    let off = service.fast_write(request(vec![op(b"k")], id(1, 1), now_ms + 30_000)).await.unwrap_err();
    assert_eq!(off.code(), Code::InvalidArgument, "{off:?}");
    assert!(off.message().contains("fast path is off"), "{off:?}");
}
