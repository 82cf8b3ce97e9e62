//! MULTI/EXEC/WATCH through [`RespContext::execute`] against a small in-memory `Kv` server (no
//! replica): what EXEC reads, commits and answers; WATCH aborting on a changed value; another
//! client's write between EXEC's read and its commit making the transaction decide again; and a
//! runtime error of one queued command leaving the others applied. The real 3-node cluster with
//! redis-py is `crates/onekv/tests/redis_tools.rs`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use onekv_proto::kv_server::{Kv, KvServer};
use onekv_proto::{
    BatchRequest, CasRequest, CasResponse, DeleteRequest, GetRequest, GetResponse, PutRequest, ScanRequest,
    ScanResponse, StatusRequest, StatusResponse, TxnRequest, TxnResponse, WriteResponse,
};
use onekv_resp::exec::Session;
use onekv_resp::{Reply, RespContext, RespSettings};
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// A store that applies each call atomically under one lock, as the replica applies entries.
#[derive(Default)]
struct Store {
    data: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
    /// Written just before the next transaction is evaluated: another client's write racing EXEC.
    interfere: Mutex<Vec<(Vec<u8>, Vec<u8>)>>,
    /// Transactions committed and refused.
    txns: Mutex<(u32, u32)>,
}

#[tonic::async_trait]
impl Kv for Store {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let value = self.data.lock().unwrap().get(&request.into_inner().key).cloned();
        Ok(Response::new(GetResponse { found: value.is_some(), value: value.unwrap_or_default() }))
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

    async fn scan(&self, _: Request<ScanRequest>) -> Result<Response<ScanResponse>, Status> {
        Err(Status::unimplemented("not needed here"))
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
