//! MULTI/EXEC/WATCH through [`RespContext::execute`] against a small in-memory `Kv` server (no
//! replica): what EXEC reads, commits and answers; WATCH aborting on a changed value; another
//! client's write between EXEC's read and its commit making the transaction decide again; and a
//! runtime error of one queued command leaving the others applied. Also the commands that are
//! transactions of their own (MSETNX, RENAME, COPY, MOVE) and those that page through every key (KEYS,
//! RANDOMKEY, and FLUSHALL through the store's range-deletion pages) over more keys than one page
//! holds. Lua scripts as transactions (a conflicting write making one run again, undeclared keys,
//! the script cache, a runaway script making the node answer BUSY), LMOVE and the blocking pops (a timeout, a push waking a waiter, a push the
//! front end did not see found by polling, MULTI never waiting). The real 3-node cluster with redis-py
//! is `crates/onekv/tests/redis_tools.rs`, and Redis's own test suite `tests/redis-suite`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use onekv_proto::kv_server::{Kv, KvServer};
use onekv_proto::{
    BatchRequest, CasRequest, CasResponse, DeleteRequest, GetRequest, GetResponse, KeyValue, PutRequest,
    ScanRequest, ScanResponse, StatusRequest, StatusResponse, TxnRequest, TxnResponse, WriteResponse,
};
use onekv_resp::exec::Session;
use onekv_resp::{Reply, RespContext, RespSettings};
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// Most pairs one scan of the store returns: small, so the commands that page through every key
/// are tested over many pages.
const SCAN_PAGE: usize = 64;

/// A store that applies each call atomically under one lock, as the replica applies entries.
#[derive(Default)]
struct Store {
    data: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
    /// Written just before the next transaction is evaluated: another client's write racing EXEC.
    interfere: Mutex<Vec<(Vec<u8>, Vec<u8>)>>,
    /// Transactions committed and refused.
    txns: Mutex<(u32, u32)>,
    /// Compare-and-swaps still to answer ABORTED without applying (a retry of one that took no
    /// effect, whose answer was lost, while the compared value matches now).
    abort_cas: Mutex<u32>,
}

#[tonic::async_trait]
impl Kv for Store {
    /// Each call as if it came alone, one after the other.
    type MultiStream = futures_util::stream::BoxStream<'static, Result<onekv_proto::MultiResult, Status>>;

    async fn multi(
        &self,
        request: Request<onekv_proto::MultiRequest>,
    ) -> Result<Response<Self::MultiStream>, Status> {
        let mut results = Vec::new();
        for (at, call) in (0u32..).zip(request.into_inner().calls) {
            results.push(Ok(onekv_client::coalesce::answer_alone(self, at, call).await));
        }
        Ok(Response::new(Box::pin(futures_util::stream::iter(results))))
    }

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let value = self.data.lock().unwrap().get(&request.into_inner().key).cloned();
        Ok(Response::new(GetResponse {
            found: value.is_some(),
            value: value.unwrap_or_default(),
            expires_at_unix_ms: 0,
        }))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<WriteResponse>, Status> {
        let request = request.into_inner();
        self.data.lock().unwrap().insert(request.key, request.value);
        Ok(Response::new(WriteResponse { index: 1 }))
    }

    async fn delete(&self, request: Request<DeleteRequest>) -> Result<Response<WriteResponse>, Status> {
        self.data.lock().unwrap().remove(&request.into_inner().key);
        Ok(Response::new(WriteResponse { index: 1 }))
    }

    async fn batch(&self, request: Request<BatchRequest>) -> Result<Response<WriteResponse>, Status> {
        let mut data = self.data.lock().unwrap();
        for op in request.into_inner().ops {
            match op.value {
                Some(value) => data.insert(op.key, value),
                None => data.remove(&op.key),
            };
        }
        Ok(Response::new(WriteResponse { index: 1 }))
    }

    async fn cas(&self, request: Request<CasRequest>) -> Result<Response<CasResponse>, Status> {
        {
            let mut abort = self.abort_cas.lock().unwrap();
            if *abort > 0 {
                *abort -= 1;
                return Err(Status::aborted("this request was evaluated at entry 7 and took no effect"));
            }
        }
        let request = request.into_inner();
        let mut data = self.data.lock().unwrap();
        let swapped = data.get(&request.key) == request.expected.as_ref();
        if swapped {
            match request.new_value {
                Some(value) => data.insert(request.key.clone(), value),
                None => data.remove(&request.key),
            };
        }
        let current = data.get(&request.key).cloned();
        Ok(Response::new(CasResponse {
            swapped,
            found: current.is_some(),
            current: current.unwrap_or_default(),
            index: 1,
        }))
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let request = request.into_inner();
        let mut data = self.data.lock().unwrap();
        for (key, value) in self.interfere.lock().unwrap().drain(..) {
            data.insert(key, value);
        }
        let applied = request
            .conditions
            .iter()
            .all(|condition| data.get(&condition.key) == condition.expected.as_ref());
        if applied {
            for op in request.ops {
                match op.value {
                    Some(value) => data.insert(op.key, value),
                    None => data.remove(&op.key),
                };
            }
        }
        let mut txns = self.txns.lock().unwrap();
        if applied {
            txns.0 += 1;
        } else {
            txns.1 += 1;
        }
        Ok(Response::new(TxnResponse { applied, index: 1 }))
    }

    /// Forward or reverse over `start..end`, at most `limit` pairs (the store's own bound is
    /// [`SCAN_PAGE`], as a node caps a page at `limits.max_scan_pairs`).
    async fn scan(&self, request: Request<ScanRequest>) -> Result<Response<ScanResponse>, Status> {
        let request = request.into_inner();
        let data = self.data.lock().unwrap();
        let end = (!request.end.is_empty()).then_some(request.end);
        let in_range = data
            .range(request.start..)
            .filter(|(key, _)| end.as_ref().is_none_or(|end| *key < end))
            .map(|(key, value)| KeyValue {
                key: key.clone(),
                value: if request.keys_only { Vec::new() } else { value.clone() },
            });
        let limit = (request.limit as usize).clamp(1, SCAN_PAGE);
        let mut pairs: Vec<KeyValue> = if request.reverse {
            in_range.rev().take(limit + 1).collect()
        } else {
            in_range.take(limit + 1).collect()
        };
        let more = pairs.len() > limit;
        pairs.truncate(limit);
        Ok(Response::new(ScanResponse { pairs, more }))
    }

    /// One page of at most `limit` keys (the store's own bound is [`SCAN_PAGE`]), as a replica
    /// applies it, sparing onekv's own keys.
    async fn delete_range(
        &self,
        request: Request<onekv_proto::DeleteRangeRequest>,
    ) -> Result<Response<onekv_proto::DeleteRangeResponse>, Status> {
        let request = request.into_inner();
        let mut data = self.data.lock().unwrap();
        let end = (!request.end.is_empty()).then_some(request.end);
        let limit = (request.limit as usize).clamp(1, SCAN_PAGE);
        let mut in_range = data
            .range(request.start..)
            .map(|(key, _)| key.clone())
            .take_while(|key| end.as_ref().is_none_or(|end| key < end))
            .filter(|key| !key.starts_with(b"\xffonekv/"));
        let page: Vec<Vec<u8>> = in_range.by_ref().take(limit).collect();
        let resume = in_range.next();
        for key in &page {
            data.remove(key);
        }
        Ok(Response::new(onekv_proto::DeleteRangeResponse {
            deleted: page.len() as u64,
            more: resume.is_some(),
            resume: resume.unwrap_or_default(),
            index: 1,
        }))
    }

    async fn fast_write(
        &self,
        _: Request<onekv_proto::FastWriteRequest>,
    ) -> Result<Response<onekv_proto::FastWriteResponse>, Status> {
        Err(Status::invalid_argument("the fast path is off on this node"))
    }

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

    /// No cluster map: the client takes the store for one shard.
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        Ok(Response::new(StatusResponse { node_id: 1, role: "leader".into(), ..Default::default() }))
    }
}

impl Store {
    fn value(&self, key: &str) -> Option<String> {
        self.data.lock().unwrap().get(key.as_bytes()).map(|value| String::from_utf8_lossy(value).into_owned())
    }

    fn set(&self, key: &str, value: &str) {
        self.data.lock().unwrap().insert(key.into(), value.into());
    }
}

/// A front end whose client talks to a fresh [`Store`].
async fn start() -> (RespContext, Arc<Store>) {
    let store = Arc::new(Store::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let service = KvServer::from_arc(Arc::clone(&store));
    tokio::spawn(Server::builder().add_service(service).serve_with_incoming(TcpIncoming::from(listener)));
    let context = RespContext::new(RespSettings::new(1, vec![address], "127.0.0.1:6379".into())).unwrap();
    (context, store)
}

async fn run(context: &RespContext, session: &mut Session, command: &[&str]) -> Reply {
    let args = command.iter().map(|arg| arg.as_bytes().to_vec()).collect();
    context.execute(session, args).await.reply
}

fn queued() -> Reply {
    Reply::Simple("QUEUED".into())
}

#[tokio::test]
async fn exec_applies_the_queue_atomically_and_answers_each_reply() {
    let (context, store) = start().await;
    let mut session = context.new_session();
    let s = &mut session;
    store.set("s", "text");
    assert_eq!(run(&context, s, &["MULTI"]).await, Reply::ok());
    for command in [
        &["INCR", "n"][..],
        &["SET", "a", "1"],
        &["INCR", "s"],
        &["GET", "n"],
        &["MSET", "b", "2", "c", "3"],
        &["DEL", "c"],
        &["PING"],
    ] {
        assert_eq!(run(&context, s, command).await, queued());
    }
    // Nothing ran yet.
    assert_eq!(store.value("n"), None);
    assert_eq!(store.value("a"), None);
    assert_eq!(
        run(&context, s, &["EXEC"]).await.to_bytes(onekv_resp::Protocol::Resp2),
        Reply::Array(vec![
            Reply::Integer(1),
            Reply::ok(),
            Reply::err("value is not an integer or out of range"),
            Reply::text("1"),
            Reply::ok(),
            Reply::Integer(1),
            Reply::Simple("PONG".into()),
        ])
        .to_bytes(onekv_resp::Protocol::Resp2)
    );
    assert_eq!(
        [store.value("n"), store.value("a"), store.value("s"), store.value("b"), store.value("c")],
        [Some("1".into()), Some("1".into()), Some("text".into()), Some("2".into()), None]
    );
    // One transaction, committed at once.
    assert_eq!(*store.txns.lock().unwrap(), (1, 0));
}

#[tokio::test]
async fn watch_aborts_exec_when_a_watched_value_changed() {
    let (context, store) = start().await;
    let (mut first, mut other) = (context.new_session(), context.new_session());
    store.set("k", "1");
    assert_eq!(run(&context, &mut first, &["WATCH", "k"]).await, Reply::ok());
    assert_eq!(run(&context, &mut other, &["SET", "k", "2"]).await, Reply::ok());
    assert_eq!(run(&context, &mut first, &["MULTI"]).await, Reply::ok());
    assert_eq!(run(&context, &mut first, &["SET", "k", "mine"]).await, queued());
    assert_eq!(run(&context, &mut first, &["SET", "unrelated", "x"]).await, queued());
    assert_eq!(run(&context, &mut first, &["EXEC"]).await, Reply::NilArray);
    assert_eq!(store.value("k").as_deref(), Some("2"));
    assert_eq!(store.value("unrelated"), None);
    // EXEC forgot the watch: the next transaction runs.
    assert_eq!(run(&context, &mut first, &["MULTI"]).await, Reply::ok());
    assert_eq!(run(&context, &mut first, &["SET", "k", "mine"]).await, queued());
    assert_eq!(run(&context, &mut first, &["EXEC"]).await, Reply::Array(vec![Reply::ok()]));
    assert_eq!(store.value("k").as_deref(), Some("mine"));

    // Unchanged: EXEC runs (a write of the same value is not a change: values are compared).
    assert_eq!(run(&context, &mut first, &["WATCH", "k", "absent"]).await, Reply::ok());
    assert_eq!(run(&context, &mut other, &["SET", "k", "mine"]).await, Reply::ok());
    assert_eq!(run(&context, &mut first, &["MULTI"]).await, Reply::ok());
    assert_eq!(run(&context, &mut first, &["INCR", "counter"]).await, queued());
    assert_eq!(run(&context, &mut first, &["EXEC"]).await, Reply::Array(vec![Reply::Integer(1)]));

    // UNWATCH forgets: a change after it does not abort.
    assert_eq!(run(&context, &mut first, &["WATCH", "k"]).await, Reply::ok());
    assert_eq!(run(&context, &mut first, &["UNWATCH"]).await, Reply::ok());
    assert_eq!(run(&context, &mut other, &["SET", "k", "3"]).await, Reply::ok());
    assert_eq!(run(&context, &mut first, &["MULTI"]).await, Reply::ok());
    assert_eq!(run(&context, &mut first, &["GET", "k"]).await, queued());
    assert_eq!(run(&context, &mut first, &["EXEC"]).await, Reply::Array(vec![Reply::text("3")]));

    // A watched key that changes while EXEC is committing aborts too.
    assert_eq!(run(&context, &mut first, &["WATCH", "k"]).await, Reply::ok());
    assert_eq!(run(&context, &mut first, &["MULTI"]).await, Reply::ok());
    assert_eq!(run(&context, &mut first, &["INCR", "counter"]).await, queued());
    store.interfere.lock().unwrap().push((b"k".to_vec(), b"4".to_vec()));
    assert_eq!(run(&context, &mut first, &["EXEC"]).await, Reply::NilArray);
    assert_eq!(store.value("counter").as_deref(), Some("1"));
}

#[tokio::test]
async fn a_write_racing_exec_makes_it_decide_again_on_the_new_value() {
    let (context, store) = start().await;
    let mut session = context.new_session();
    let s = &mut session;
    store.set("n", "10");
    assert_eq!(run(&context, s, &["MULTI"]).await, Reply::ok());
    assert_eq!(run(&context, s, &["INCR", "n"]).await, queued());
    assert_eq!(run(&context, s, &["GET", "n"]).await, queued());
    // Between EXEC's read and its commit another client sets n = 100: the first commit's
    // condition (n = 10) fails, and EXEC reads and decides again.
    store.interfere.lock().unwrap().push((b"n".to_vec(), b"100".to_vec()));
    assert_eq!(
        run(&context, s, &["EXEC"]).await,
        Reply::Array(vec![Reply::Integer(101), Reply::text("101")])
    );
    assert_eq!(store.value("n").as_deref(), Some("101"));
    assert_eq!(*store.txns.lock().unwrap(), (1, 1));
}

#[tokio::test]
async fn read_only_transactions_commit_nothing_unless_several_keys_must_agree() {
    let (context, store) = start().await;
    let mut session = context.new_session();
    let s = &mut session;
    store.set("a", "1");
    store.set("b", "2");
    assert_eq!(run(&context, s, &["MULTI"]).await, Reply::ok());
    assert_eq!(run(&context, s, &["GET", "a"]).await, queued());
    assert_eq!(run(&context, s, &["STRLEN", "a"]).await, queued());
    assert_eq!(run(&context, s, &["EXEC"]).await, Reply::Array(vec![Reply::text("1"), Reply::Integer(1)]));
    assert_eq!(*store.txns.lock().unwrap(), (0, 0), "one key read: its read is the transaction");
    assert_eq!(run(&context, s, &["MULTI"]).await, Reply::ok());
    assert_eq!(run(&context, s, &["MGET", "a", "b"]).await, queued());
    assert_eq!(
        run(&context, s, &["EXEC"]).await,
        Reply::Array(vec![Reply::Array(vec![Reply::text("1"), Reply::text("2")])])
    );
    assert_eq!(*store.txns.lock().unwrap(), (1, 0), "two keys: a conditions-only transaction");
}

#[tokio::test]
async fn multi_key_writes_are_one_transaction_each() {
    let (context, store) = start().await;
    let mut session = context.new_session();
    let s = &mut session;
    store.set("a", "1");
    assert_eq!(run(&context, s, &["MSETNX", "a", "x", "b", "y"]).await, Reply::Integer(0));
    assert_eq!((store.value("a").as_deref(), store.value("b")), (Some("1"), None));
    assert_eq!(run(&context, s, &["MSETNX", "b", "y", "c", "z"]).await, Reply::Integer(1));
    assert_eq!((store.value("b").as_deref(), store.value("c").as_deref()), (Some("y"), Some("z")));
    assert_eq!(
        run(&context, s, &["MSETNX", "d", "1", "e"]).await,
        Reply::err("wrong number of arguments for 'msetnx' command")
    );

    assert_eq!(run(&context, s, &["RENAME", "a", "moved"]).await, Reply::ok());
    assert_eq!((store.value("a"), store.value("moved").as_deref()), (None, Some("1")));
    assert_eq!(run(&context, s, &["RENAME", "a", "moved"]).await, Reply::err("no such key"));
    assert_eq!(run(&context, s, &["RENAMENX", "moved", "b"]).await, Reply::Integer(0));
    assert_eq!(run(&context, s, &["RENAMENX", "moved", "fresh"]).await, Reply::Integer(1));
    assert_eq!(store.value("fresh").as_deref(), Some("1"));

    assert_eq!(run(&context, s, &["COPY", "fresh", "b"]).await, Reply::Integer(0));
    assert_eq!(run(&context, s, &["COPY", "fresh", "b", "REPLACE"]).await, Reply::Integer(1));
    assert_eq!(store.value("b").as_deref(), Some("1"));
    assert_eq!(run(&context, s, &["COPY", "nothing", "b2"]).await, Reply::Integer(0));
    assert_eq!(
        run(&context, s, &["COPY", "b", "b"]).await,
        Reply::err("source and destination objects are the same")
    );
    assert_eq!(
        run(&context, s, &["COPY", "b", "c", "DB", "16"]).await,
        Reply::err("DB index is out of range")
    );
    assert_eq!(run(&context, s, &["COPY", "b", "c", "BOGUS"]).await, Reply::err("syntax error"));

    // MOVE: to another database only if the key is not there yet, as one transaction.
    let in_db = |db: u8, key: &str| [&[0xFF, 0xFF, db][..], key.as_bytes()].concat();
    let stored = |key: Vec<u8>| store.data.lock().unwrap().get(&key).map(|value| value.to_vec());
    store.set("mv", "here");
    assert_eq!(run(&context, s, &["MOVE", "mv", "10"]).await, Reply::Integer(1));
    assert_eq!((store.value("mv"), stored(in_db(10, "mv"))), (None, Some(b"here".to_vec())));
    assert_eq!(run(&context, s, &["MOVE", "mv", "10"]).await, Reply::Integer(0), "nothing to move");
    store.set("mv", "again");
    assert_eq!(run(&context, s, &["MOVE", "mv", "10"]).await, Reply::Integer(0), "there already");
    assert_eq!(
        (store.value("mv").as_deref(), stored(in_db(10, "mv"))),
        (Some("again"), Some(b"here".to_vec()))
    );
    assert_eq!(run(&context, s, &["SELECT", "10"]).await, Reply::ok());
    assert_eq!(run(&context, s, &["MOVE", "mv", "0"]).await, Reply::Integer(0), "database 0 has it");
    assert_eq!(run(&context, s, &["MOVE", "mv", "3"]).await, Reply::Integer(1));
    assert_eq!(stored(in_db(3, "mv")), Some(b"here".to_vec()));
    assert_eq!(run(&context, s, &["SELECT", "0"]).await, Reply::ok());
    assert_eq!(
        run(&context, s, &["MOVE", "mv", "0"]).await,
        Reply::err("source and destination objects are the same")
    );
    assert_eq!(
        run(&context, s, &["MOVE", "mv", "notanumber"]).await,
        Reply::err("value is not an integer or out of range")
    );
    assert_eq!(run(&context, s, &["MOVE", "mv", "16"]).await, Reply::err("DB index is out of range"));

    // A racing write between the read and the commit makes it decide again on the new value.
    store.interfere.lock().unwrap().push((b"src".to_vec(), b"new".to_vec()));
    store.set("src", "old");
    assert_eq!(run(&context, s, &["RENAME", "src", "dst"]).await, Reply::ok());
    assert_eq!((store.value("src"), store.value("dst").as_deref()), (None, Some("new")));

    // Inside MULTI they are part of the one transaction.
    assert_eq!(run(&context, s, &["MULTI"]).await, Reply::ok());
    assert_eq!(run(&context, s, &["RENAME", "dst", "t1"]).await, queued());
    assert_eq!(run(&context, s, &["GETRANGE", "t1", "0", "1"]).await, queued());
    assert_eq!(run(&context, s, &["SETRANGE", "t1", "1", "EW!"]).await, queued());
    assert_eq!(run(&context, s, &["TYPE", "dst"]).await, queued());
    assert_eq!(
        run(&context, s, &["EXEC"]).await,
        Reply::Array(vec![Reply::ok(), Reply::text("ne"), Reply::Integer(4), Reply::Simple("none".into())])
    );
    assert_eq!(store.value("t1").as_deref(), Some("nEW!"));
}

#[tokio::test]
async fn single_key_commands_decide_on_the_value_they_find() {
    let (context, store) = start().await;
    let mut session = context.new_session();
    let s = &mut session;
    assert_eq!(run(&context, s, &["GETSET", "k", "one"]).await, Reply::Nil);
    assert_eq!(run(&context, s, &["GETSET", "k", "two"]).await, Reply::text("one"));
    assert_eq!(run(&context, s, &["SETRANGE", "k", "5", "x"]).await, Reply::Integer(6));
    assert_eq!(store.value("k").as_deref(), Some("two\0\0x"));
    assert_eq!(run(&context, s, &["SETRANGE", "absent", "5", ""]).await, Reply::Integer(0));
    assert_eq!(store.value("absent"), None);
    assert_eq!(run(&context, s, &["SETBIT", "bits", "9", "1"]).await, Reply::Integer(0));
    assert_eq!(run(&context, s, &["SETBIT", "bits", "9", "1"]).await, Reply::Integer(1));
    assert_eq!(run(&context, s, &["GETBIT", "bits", "9"]).await, Reply::Integer(1));
    assert_eq!(run(&context, s, &["BITCOUNT", "bits"]).await, Reply::Integer(1));
    assert_eq!(run(&context, s, &["BITPOS", "bits", "1"]).await, Reply::Integer(9));
    assert_eq!(run(&context, s, &["INCRBYFLOAT", "f", "10.5"]).await, Reply::text("10.5"));
    assert_eq!(run(&context, s, &["INCRBYFLOAT", "f", "0.1"]).await, Reply::text("10.6"));
    assert_eq!(
        run(&context, s, &["INCRBYFLOAT", "f", "inf"]).await,
        Reply::err("increment would produce NaN or Infinity")
    );
    assert_eq!(store.value("f").as_deref(), Some("10.6"));
    assert_eq!(run(&context, s, &["INCRBYFLOAT", "k", "1"]).await, Reply::err("value is not a valid float"));
    assert_eq!(run(&context, s, &["TTL", "f"]).await, Reply::Integer(-1));
    assert_eq!(run(&context, s, &["TTL", "nothing"]).await, Reply::Integer(-2));
    assert_eq!(run(&context, s, &["TOUCH", "f", "k", "nothing"]).await, Reply::Integer(2));
    store.set("a", "ohmytext");
    store.set("b", "mynewtext");
    assert_eq!(run(&context, s, &["LCS", "a", "b"]).await, Reply::text("mytext"));
    // Inside MULTI too (its evaluation then runs on a blocking thread).
    assert_eq!(run(&context, s, &["MULTI"]).await, Reply::ok());
    assert_eq!(run(&context, s, &["LCS", "a", "b", "LEN"]).await, queued());
    assert_eq!(run(&context, s, &["SET", "a", "x"]).await, queued());
    assert_eq!(run(&context, s, &["EXEC"]).await, Reply::Array(vec![Reply::Integer(6), Reply::ok()]));
    assert_eq!(store.value("a").as_deref(), Some("x"));
}

#[tokio::test]
async fn keys_flushall_and_randomkey_page_through_every_key() {
    let (context, store) = start().await;
    let mut session = context.new_session();
    let s = &mut session;
    // Many times more keys than one scan page holds.
    let keys = SCAN_PAGE * 10 + 7;
    for i in 0..keys {
        store.set(&format!("user:{i:05}"), "v");
    }
    store.set("other", "v");
    let Reply::Array(matched) = run(&context, s, &["KEYS", "user:*"]).await else { panic!() };
    assert_eq!(matched.len(), keys);
    let Reply::Array(matched) = run(&context, s, &["KEYS", "*9"]).await else { panic!() };
    assert_eq!(matched.len(), (0..keys).filter(|i| i % 10 == 9).count());
    assert_eq!(run(&context, s, &["KEYS", "nope*"]).await, Reply::Array(Vec::new()));
    assert_eq!(run(&context, s, &["DBSIZE"]).await, Reply::Integer(keys as i64 + 1));
    let mut seen = std::collections::HashSet::new();
    for _ in 0..200 {
        let Reply::Bulk(key) = run(&context, s, &["RANDOMKEY"]).await else { panic!() };
        assert!(store.value(std::str::from_utf8(&key).unwrap()).is_some());
        seen.insert(key);
    }
    assert!(seen.len() > 20, "RANDOMKEY returned only {} distinct keys", seen.len());
    // INFO keyspace reuses its count for a few seconds (clients send INFO on every connection);
    // DBSIZE always counts, and a flush forgets the reused count.
    let info = |reply: Reply| match reply {
        Reply::Verbatim(text) => text,
        other => panic!("{other:?}"),
    };
    let expected = format!("db0:keys={},", keys + 1);
    assert!(info(run(&context, s, &["INFO", "keyspace"]).await).contains(&expected));
    store.set("one-more", "v");
    assert!(info(run(&context, s, &["INFO", "keyspace"]).await).contains(&expected));
    assert_eq!(run(&context, s, &["DBSIZE"]).await, Reply::Integer(keys as i64 + 2));
    assert_eq!(run(&context, s, &["FLUSHALL", "bogus"]).await, Reply::err("syntax error"));
    // Not atomic, so not part of a transaction: refused while queueing, which dooms it.
    assert_eq!(run(&context, s, &["MULTI"]).await, Reply::ok());
    assert_eq!(run(&context, s, &["SET", "queued", "v"]).await, queued());
    assert!(run(&context, s, &["FLUSHDB"]).await.is_error());
    assert_eq!(
        run(&context, s, &["EXEC"]).await,
        Reply::Error("EXECABORT Transaction discarded because of previous errors.".into())
    );
    assert_eq!(store.value("queued"), None);
    assert_eq!(run(&context, s, &["DBSIZE"]).await, Reply::Integer(keys as i64 + 2));
    assert_eq!(run(&context, s, &["FLUSHALL"]).await, Reply::ok());
    assert!(store.data.lock().unwrap().is_empty());
    assert!(!info(run(&context, s, &["INFO", "keyspace"]).await).contains("db0:"));
    assert_eq!(run(&context, s, &["RANDOMKEY"]).await, Reply::Nil);
    assert_eq!(run(&context, s, &["FLUSHDB", "ASYNC"]).await, Reply::ok());
}

#[tokio::test]
async fn databases_are_separate_key_spaces() {
    let (context, store) = start().await;
    let (mut zero, mut three) = (context.new_session(), context.new_session());
    store.set("k", "zero");
    store.set("only-zero", "x");
    assert_eq!(run(&context, &mut three, &["SELECT", "3"]).await, Reply::ok());
    assert_eq!(run(&context, &mut three, &["GET", "k"]).await, Reply::Nil);
    assert_eq!(run(&context, &mut three, &["SET", "k", "three"]).await, Reply::ok());
    assert_eq!(run(&context, &mut three, &["INCR", "n"]).await, Reply::Integer(1));
    assert_eq!(run(&context, &mut three, &["GET", "k"]).await, Reply::text("three"));
    assert_eq!(run(&context, &mut zero, &["GET", "k"]).await, Reply::text("zero"));
    assert_eq!(store.value("k").as_deref(), Some("zero"), "database 0 is the plain key space");
    assert_eq!(
        run(&context, &mut three, &["KEYS", "*"]).await,
        Reply::Array(vec![Reply::text("k"), Reply::text("n")])
    );
    assert_eq!(
        run(&context, &mut three, &["SCAN", "0", "COUNT", "100"]).await,
        Reply::Array(vec![Reply::text("0"), Reply::Array(vec![Reply::text("k"), Reply::text("n")])])
    );
    assert_eq!(run(&context, &mut zero, &["DBSIZE"]).await, Reply::Integer(2));
    assert_eq!(run(&context, &mut three, &["DBSIZE"]).await, Reply::Integer(2));
    let Reply::Bulk(random) = run(&context, &mut three, &["RANDOMKEY"]).await else { panic!() };
    assert!(random == b"k" || random == b"n", "{random:?}");
    let Reply::Verbatim(info) = run(&context, &mut zero, &["INFO", "keyspace"]).await else { panic!() };
    assert!(info.contains("db0:keys=2,") && info.contains("db3:keys=2,"), "{info}");
    // COPY ... DB moves across databases; a transaction sees the connection's database.
    assert_eq!(
        run(&context, &mut zero, &["COPY", "only-zero", "copied", "DB", "3"]).await,
        Reply::Integer(1)
    );
    assert_eq!(run(&context, &mut three, &["GET", "copied"]).await, Reply::text("x"));
    assert_eq!(run(&context, &mut three, &["MULTI"]).await, Reply::ok());
    assert_eq!(run(&context, &mut three, &["RENAME", "copied", "renamed"]).await, queued());
    assert_eq!(run(&context, &mut three, &["EXEC"]).await, Reply::Array(vec![Reply::ok()]));
    assert_eq!(run(&context, &mut three, &["EXISTS", "copied", "renamed"]).await, Reply::Integer(1));
    // A SELECT queued inside MULTI applies to the commands queued after it, as they run after it.
    assert_eq!(run(&context, &mut zero, &["MULTI"]).await, Reply::ok());
    assert_eq!(run(&context, &mut zero, &["SELECT", "3"]).await, queued());
    assert_eq!(run(&context, &mut zero, &["GET", "renamed"]).await, queued());
    assert_eq!(run(&context, &mut zero, &["EXEC"]).await, Reply::Array(vec![Reply::ok(), Reply::text("x")]));
    assert_eq!(run(&context, &mut zero, &["SELECT", "0"]).await, Reply::ok());
    // FLUSHDB empties one database, FLUSHALL all of them.
    assert_eq!(run(&context, &mut three, &["FLUSHDB"]).await, Reply::ok());
    assert_eq!(run(&context, &mut three, &["DBSIZE"]).await, Reply::Integer(0));
    assert_eq!(run(&context, &mut zero, &["DBSIZE"]).await, Reply::Integer(2));
    assert_eq!(run(&context, &mut three, &["SET", "again", "1"]).await, Reply::ok());
    assert_eq!(run(&context, &mut zero, &["FLUSHALL"]).await, Reply::ok());
    assert!(store.data.lock().unwrap().is_empty());
    // Database 0 cannot hold keys in the other databases' range.
    let reserved = vec![b"SET".to_vec(), vec![0xFF, 0xFF, 3, b'k'], b"v".to_vec()];
    assert!(context.execute(&mut zero, reserved).await.reply.is_error());
    assert!(store.data.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_compare_and_swap_that_was_not_applied_is_decided_again_or_reported_as_not_set() {
    let (context, store) = start().await;
    let mut session = context.new_session();
    let s = &mut session;
    store.set("n", "5");
    // INCR reads again and swaps on the value it finds.
    *store.abort_cas.lock().unwrap() = 1;
    assert_eq!(run(&context, s, &["INCR", "n"]).await, Reply::Integer(6));
    assert_eq!(store.value("n"), Some("6".into()));
    // SET NX: nothing was set, and the command says so.
    *store.abort_cas.lock().unwrap() = 1;
    assert_eq!(run(&context, s, &["SET", "k", "v", "NX"]).await, Reply::Nil);
    assert_eq!(store.value("k"), None);
    assert_eq!(*store.abort_cas.lock().unwrap(), 0);
}

#[tokio::test]
async fn a_script_is_one_transaction_run_again_when_a_key_it_read_changed() {
    let (context, store) = start().await;
    let mut session = context.new_session();
    let s = &mut session;
    store.set("n", "10");
    let script = "local n = redis.call('INCR', KEYS[1]) redis.call('SET', KEYS[2], 'saw ' .. n) return n";
    // Between the script's read and its commit another client sets n = 100: the commit's condition
    // (n = 10) fails, nothing is written, and the script runs again on the new value.
    store.interfere.lock().unwrap().push((b"n".to_vec(), b"100".to_vec()));
    assert_eq!(run(&context, s, &["EVAL", script, "2", "n", "m"]).await, Reply::Integer(101));
    assert_eq!(store.value("n").as_deref(), Some("101"));
    assert_eq!(store.value("m").as_deref(), Some("saw 101"));
    assert_eq!(*store.txns.lock().unwrap(), (1, 1));
    // A key the script did not declare is read, then the script runs again; its write commits
    // with a condition on it.
    store.set("undeclared", "7");
    let script = "return redis.call('INCRBY', 'undeclared', ARGV[1])";
    assert_eq!(run(&context, s, &["EVAL", script, "0", "5"]).await, Reply::Integer(12));
    assert_eq!(store.value("undeclared").as_deref(), Some("12"));
    // One key read, nothing written: no transaction at all.
    assert_eq!(
        run(&context, s, &["EVAL", "return redis.call('GET', KEYS[1])", "1", "n"]).await,
        Reply::text("101")
    );
    assert_eq!(*store.txns.lock().unwrap(), (2, 1));
    // EVALSHA finds what EVAL and SCRIPT LOAD cached; SCRIPT FLUSH forgets it.
    let sha = match run(&context, s, &["SCRIPT", "LOAD", "return ARGV[1]"]).await {
        Reply::Bulk(sha) => String::from_utf8(sha).unwrap(),
        other => panic!("SCRIPT LOAD answered {other:?}"),
    };
    assert_eq!(run(&context, s, &["EVALSHA", &sha.to_uppercase(), "0", "x"]).await, Reply::text("x"));
    assert_eq!(
        run(&context, s, &["SCRIPT", "EXISTS", &sha, "ffff"]).await,
        Reply::Array(vec![Reply::Integer(1), Reply::Integer(0)])
    );
    assert_eq!(run(&context, s, &["SCRIPT", "FLUSH"]).await, Reply::ok());
    assert_eq!(
        run(&context, s, &["EVALSHA", &sha, "0"]).await,
        Reply::Error("NOSCRIPT No matching script. Please use EVAL.".into())
    );
    // Argument errors, and scripts refused inside MULTI.
    assert_eq!(
        run(&context, s, &["EVAL", "return 1", "2", "a"]).await,
        Reply::err("Number of keys can't be greater than number of args")
    );
    assert_eq!(
        run(&context, s, &["EVAL", "return 1", "-1"]).await,
        Reply::err("Number of keys can't be negative")
    );
    assert_eq!(
        run(&context, s, &["SCRIPT", "KILL"]).await,
        Reply::Error("NOTBUSY No scripts in execution right now.".into())
    );
    assert_eq!(run(&context, s, &["MULTI"]).await, Reply::ok());
    assert!(run(&context, s, &["EVAL", "return 1", "0"]).await.is_error());
    assert!(run(&context, s, &["EXEC"]).await.is_error(), "EXECABORT");
    // Keys of the script's database.
    assert_eq!(run(&context, s, &["SELECT", "2"]).await, Reply::ok());
    assert_eq!(
        run(&context, s, &["EVAL", "return redis.call('SET', KEYS[1], 'v')", "1", "k"]).await,
        Reply::ok()
    );
    assert_eq!(store.value("k"), None);
    assert_eq!(run(&context, s, &["GET", "k"]).await, Reply::text("v"));
}

#[tokio::test]
async fn a_script_past_the_busy_threshold_makes_the_node_answer_busy_until_it_is_killed() {
    let (context, store) = start().await;
    const BUSY: &str =
        "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.";
    let busy = Reply::Error(BUSY.into());
    let mut other = context.new_session();
    let o = &mut other;
    store.set("xx", "1");
    assert_eq!(run(&context, o, &["CONFIG", "SET", "lua-time-limit", "50"]).await, Reply::ok());
    assert_eq!(
        run(&context, o, &["CONFIG", "GET", "busy-reply-threshold"]).await,
        Reply::map([("busy-reply-threshold", Reply::text("50"))])
    );
    // A transaction queued before the script starts, and a script that never ends.
    assert_eq!(run(&context, o, &["MULTI"]).await, Reply::ok());
    assert_eq!(run(&context, o, &["INCR", "xx"]).await, queued());
    let script = {
        let context = context.clone();
        let mut session = context.new_session();
        tokio::spawn(async move { run(&context, &mut session, &["EVAL", "while true do end", "0"]).await })
    };
    // Under the threshold the node serves as usual.
    let mut third = context.new_session();
    assert_eq!(run(&context, &mut third, &["PING"]).await, Reply::Simple("PONG".into()));
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    // Past it: commands are refused, a refused one dooms the transaction, EXEC discards it.
    assert_eq!(run(&context, &mut third, &["GET", "xx"]).await, busy);
    assert_eq!(run(&context, o, &["INCR", "xx"]).await, busy);
    assert_eq!(
        run(&context, o, &["EXEC"]).await,
        Reply::Error(format!("EXECABORT Transaction discarded because of: {BUSY}"))
    );
    assert!(!o.in_transaction(), "EXEC refused while busy ends the transaction");
    // MULTI is allowed (so a pipelined transaction is refused whole, never half), and SCRIPT KILL.
    assert_eq!(run(&context, o, &["MULTI"]).await, Reply::ok());
    assert_eq!(run(&context, o, &["INCR", "xx"]).await, busy);
    assert_eq!(run(&context, &mut third, &["SCRIPT", "KILL"]).await, Reply::ok());
    let killed = tokio::time::timeout(std::time::Duration::from_secs(10), script).await.unwrap().unwrap();
    assert!(matches!(&killed, Reply::Error(text) if text.contains("Script killed")), "{killed:?}");
    assert_eq!(run(&context, o, &["INCR", "xx"]).await, queued());
    assert_eq!(
        run(&context, o, &["EXEC"]).await,
        Reply::Error("EXECABORT Transaction discarded because of previous errors.".into())
    );
    assert_eq!(run(&context, &mut third, &["GET", "xx"]).await, Reply::text("1"), "nothing ran");
    // With the threshold at 0 a script never makes the node busy.
    assert_eq!(run(&context, o, &["CONFIG", "SET", "busy-reply-threshold", "0"]).await, Reply::ok());
    let script = {
        let context = context.clone();
        let mut session = context.new_session();
        tokio::spawn(async move { run(&context, &mut session, &["EVAL", "while true do end", "0"]).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(run(&context, &mut third, &["GET", "xx"]).await, Reply::text("1"));
    assert_eq!(run(&context, &mut third, &["SCRIPT", "KILL"]).await, Reply::ok());
    tokio::time::timeout(std::time::Duration::from_secs(10), script).await.unwrap().unwrap();
    assert!(run(&context, o, &["CONFIG", "SET", "lua-time-limit", "-1"]).await.is_error());
    assert!(run(&context, o, &["CONFIG", "SET", "lua-time-limit", "9223372036854775808"]).await.is_error());
}

#[tokio::test]
async fn blocking_pops_wait_for_a_push_and_lmove_moves_atomically() {
    let (context, store) = start().await;
    let mut session = context.new_session();
    let s = &mut session;
    // LMOVE and RPOPLPUSH: one transaction each.
    assert_eq!(run(&context, s, &["RPUSH", "{q}src", "a", "b", "c"]).await, Reply::Integer(3));
    assert_eq!(run(&context, s, &["LMOVE", "{q}src", "{q}dst", "LEFT", "RIGHT"]).await, Reply::text("a"));
    assert_eq!(run(&context, s, &["RPOPLPUSH", "{q}src", "{q}dst"]).await, Reply::text("c"));
    assert_eq!(
        run(&context, s, &["LRANGE", "{q}dst", "0", "-1"]).await,
        Reply::Array(vec![Reply::text("c"), Reply::text("a")])
    );
    assert_eq!(
        run(&context, s, &["LMOVE", "{q}src", "{q}src", "RIGHT", "LEFT"]).await,
        Reply::text("b"),
        "rotate"
    );
    assert_eq!(run(&context, s, &["LMOVE", "{q}empty", "{q}dst", "LEFT", "LEFT"]).await, Reply::Nil);
    assert_eq!(
        run(&context, s, &["LMOVE", "{q}src", "{q}dst", "UP", "LEFT"]).await,
        Reply::err("syntax error")
    );
    assert_eq!(run(&context, s, &["SET", "{q}str", "x"]).await, Reply::ok());
    assert!(run(&context, s, &["LMOVE", "{q}src", "{q}str", "LEFT", "LEFT"]).await.is_error(), "WRONGTYPE");
    assert_eq!(run(&context, s, &["LLEN", "{q}src"]).await, Reply::Integer(1), "nothing moved");

    // Nothing to pop: the timeout passes, and the null array answers.
    let started = std::time::Instant::now();
    assert_eq!(run(&context, s, &["BLPOP", "{q}none", "{q}none2", "0.2"]).await, Reply::NilArray);
    assert!(started.elapsed() >= std::time::Duration::from_millis(200));
    assert_eq!(run(&context, s, &["BLPOP", "{q}none", "-1"]).await, Reply::err("timeout is negative"));
    // Something to pop at once: the first non-empty key, named as the client named it.
    assert_eq!(
        run(&context, s, &["BRPOP", "{q}none", "{q}dst", "1"]).await,
        Reply::Array(vec![Reply::text("{q}dst"), Reply::text("a")])
    );
    // A push through this front end wakes a waiting BLPOP at once (no timeout: it waits for ever).
    let (waiter, pusher) = (context.clone(), context.clone());
    let blocked = tokio::spawn(async move {
        let mut session = waiter.new_session();
        run(&waiter, &mut session, &["BLPOP", "{q}jobs", "0"]).await
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!blocked.is_finished(), "BLPOP returned with nothing to pop");
    let mut other = pusher.new_session();
    assert_eq!(run(&pusher, &mut other, &["RPUSH", "{q}jobs", "job1"]).await, Reply::Integer(1));
    let popped = tokio::time::timeout(std::time::Duration::from_secs(5), blocked).await.unwrap().unwrap();
    assert_eq!(popped, Reply::Array(vec![Reply::text("{q}jobs"), Reply::text("job1")]));
    // A push this front end did not see (another node's) is found by the next poll.
    let (waiter, pushed_elsewhere) = (context.clone(), Arc::clone(&store));
    let blocked = tokio::spawn(async move {
        let mut session = waiter.new_session();
        run(&waiter, &mut session, &["BLMOVE", "{q}remote", "{q}done", "LEFT", "LEFT", "5"]).await
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let mut list = Vec::new();
    let mut session_for_encoding = context.new_session();
    assert_eq!(
        run(&context, &mut session_for_encoding, &["RPUSH", "{q}model", "r1"]).await,
        Reply::Integer(1)
    );
    list.extend(store.data.lock().unwrap().get(b"{q}model".as_slice()).cloned());
    pushed_elsewhere.data.lock().unwrap().insert(b"{q}remote".to_vec(), list.remove(0));
    let moved = tokio::time::timeout(std::time::Duration::from_secs(5), blocked).await.unwrap().unwrap();
    assert_eq!(moved, Reply::text("r1"));
    assert_eq!(
        run(&context, s, &["LRANGE", "{q}done", "0", "-1"]).await,
        Reply::Array(vec![Reply::text("r1")])
    );
    // Sorted sets.
    assert_eq!(run(&context, s, &["ZADD", "{q}z", "2", "b", "1", "a"]).await, Reply::Integer(2));
    let Reply::Array(items) = run(&context, s, &["BZPOPMIN", "{q}z", "1"]).await else { panic!("an array") };
    assert_eq!(&items[..2], &[Reply::text("{q}z"), Reply::text("a")]);
    // Inside MULTI a blocking pop never waits.
    assert_eq!(run(&context, s, &["MULTI"]).await, Reply::ok());
    assert_eq!(run(&context, s, &["BLPOP", "{q}none", "0"]).await, queued());
    assert_eq!(run(&context, s, &["EXEC"]).await, Reply::Array(vec![Reply::NilArray]));
}

#[tokio::test]
async fn sort_reads_or_stores_and_a_store_is_seen_by_watch() {
    let (context, store) = start().await;
    let mut session = context.new_session();
    let s = &mut session;
    assert_eq!(run(&context, s, &["RPUSH", "{s}l", "3", "10", "1"]).await, Reply::Integer(3));
    assert_eq!(
        run(&context, s, &["SORT", "{s}l", "DESC"]).await,
        Reply::Array(vec![Reply::text("10"), Reply::text("3"), Reply::text("1")])
    );
    assert_eq!(
        run(&context, s, &["SORT_RO", "{s}l", "ALPHA", "LIMIT", "0", "2"]).await,
        Reply::Array(vec![Reply::text("1"), Reply::text("10")])
    );
    assert_eq!(*store.txns.lock().unwrap(), (0, 0), "a SORT without STORE only reads");
    assert_eq!(run(&context, s, &["SORT", "{s}l", "STORE", "{s}out"]).await, Reply::Integer(3));
    assert_eq!(
        run(&context, s, &["LRANGE", "{s}out", "0", "-1"]).await,
        Reply::Array(vec![Reply::text("1"), Reply::text("3"), Reply::text("10")])
    );
    assert!(run(&context, s, &["SORT", "{s}l", "BY", "weight_*"]).await.is_error());
    // A watched key that SORT ... STORE empties (an empty result deletes the destination) aborts EXEC.
    assert_eq!(run(&context, s, &["WATCH", "{s}out"]).await, Reply::ok());
    assert_eq!(run(&context, s, &["SORT", "{s}empty", "STORE", "{s}out"]).await, Reply::Integer(0));
    assert_eq!(store.value("{s}out"), None);
    assert_eq!(run(&context, s, &["MULTI"]).await, Reply::ok());
    assert_eq!(run(&context, s, &["PING"]).await, queued());
    assert_eq!(run(&context, s, &["EXEC"]).await, Reply::NilArray);
    // In another database the destination is that database's key too.
    assert_eq!(run(&context, s, &["SELECT", "4"]).await, Reply::ok());
    assert_eq!(run(&context, s, &["RPUSH", "{s}l", "2", "1"]).await, Reply::Integer(2));
    assert_eq!(run(&context, s, &["SORT", "{s}l", "STORE", "{s}out"]).await, Reply::Integer(2));
    assert_eq!(store.value("{s}out"), None, "not database 0's key");
    assert_eq!(
        run(&context, s, &["LRANGE", "{s}out", "0", "-1"]).await,
        Reply::Array(vec![Reply::text("1"), Reply::text("2")])
    );
}
