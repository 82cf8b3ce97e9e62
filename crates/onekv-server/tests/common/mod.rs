//! A scripted [`Backend`] for testing the services without a replica.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Mutex;

use onekv_replica::{Command, Done, Message, Outcome, ReplicaError, ReplicaStatus, RequestId};
use onekv_server::Backend;
use onekv_server::backend::ScanResult;
use onekv_server::config::{MemberConfig, ServerConfig};

/// The arguments of one `scan` call: start, end, limit, reverse.
pub type ScanCall = (Vec<u8>, Option<Vec<u8>>, usize, bool);

/// How the fake answers a proposal or a read barrier.
#[derive(Clone, Debug)]
pub enum Answer<T> {
    /// Calls `done` at once with this result.
    Now(Result<T, ReplicaError>),
    /// Keeps `done` without calling it (a request that never commits).
    Hold,
    /// Drops `done` without calling it (a replica that loses the request).
    Drop,
}

/// A backend whose answers the test chooses and whose calls it can inspect.
pub struct FakeBackend {
    pub propose_answer: Mutex<Answer<Outcome>>,
    pub barrier_answer: Mutex<Answer<()>>,
    pub data: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
    pub status: Mutex<ReplicaStatus>,
    /// When set, `get` fails with this error.
    pub get_error: Mutex<Option<ReplicaError>>,
    /// Every call, in order: "step", "propose", "barrier", "get", "scan".
    pub calls: Mutex<Vec<&'static str>>,
    pub stepped: Mutex<Vec<Message>>,
    pub proposed: Mutex<Vec<(RequestId, Command)>>,
    pub scans: Mutex<Vec<ScanCall>>,
    /// Errors `get` answers first, one per call, before reading `data`.
    pub get_errors: Mutex<std::collections::VecDeque<ReplicaError>>,
    held_proposals: Mutex<Vec<Done<Outcome>>>,
    held_barriers: Mutex<Vec<Done<()>>>,
}

impl Default for FakeBackend {
    fn default() -> Self {
        FakeBackend {
            propose_answer: Mutex::new(Answer::Now(Ok(Outcome::at(7)))),
            barrier_answer: Mutex::new(Answer::Now(Ok(()))),
            data: Mutex::default(),
            status: Mutex::default(),
            get_error: Mutex::default(),
            calls: Mutex::default(),
            stepped: Mutex::default(),
            proposed: Mutex::default(),
            scans: Mutex::default(),
            get_errors: Mutex::default(),
            held_proposals: Mutex::default(),
            held_barriers: Mutex::default(),
        }
    }
}

fn answer<T>(answer: Answer<T>, done: Done<T>, held: &Mutex<Vec<Done<T>>>) {
    match answer {
        Answer::Now(result) => done(result),
        Answer::Hold => held.lock().unwrap().push(done),
        Answer::Drop => drop(done),
    }
}

impl FakeBackend {
    pub fn calls(&self) -> Vec<&'static str> {
        self.calls.lock().unwrap().clone()
    }
}

/// The fake holds every shard and ignores which one a call names.
impl Backend for FakeBackend {
    fn shards(&self) -> Vec<u64> {
        vec![1]
    }

    fn hosts(&self, _shard: u64) -> bool {
        true
    }

    fn step(&self, _shard: u64, message: Message) {
        self.calls.lock().unwrap().push("step");
        self.stepped.lock().unwrap().push(message);
    }

    fn propose(&self, _shard: u64, request_id: RequestId, command: Command, done: Done<Outcome>) {
        self.calls.lock().unwrap().push("propose");
        self.proposed.lock().unwrap().push((request_id, command));
        answer(self.propose_answer.lock().unwrap().clone(), done, &self.held_proposals);
    }

    fn read_barrier(&self, _shard: u64, done: Done<()>) {
        self.calls.lock().unwrap().push("barrier");
        answer(self.barrier_answer.lock().unwrap().clone(), done, &self.held_barriers);
    }

    fn transfer_leadership(&self, _shard: u64, _to: u64, done: Done<()>) {
        self.calls.lock().unwrap().push("transfer");
        done(Ok(()));
    }

    fn get(&self, _shard: u64, key: &[u8]) -> Result<Option<onekv_replica::ValueWithExpiry>, ReplicaError> {
        self.calls.lock().unwrap().push("get");
        if let Some(error) = self.get_errors.lock().unwrap().pop_front() {
            return Err(error);
        }
        if let Some(error) = self.get_error.lock().unwrap().clone() {
            return Err(error);
        }
        Ok(self.data.lock().unwrap().get(key).cloned().map(|value| (value, None)))
    }

    fn scan(
        &self,
        _shard: u64,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        reverse: bool,
    ) -> Result<ScanResult, ReplicaError> {
        self.calls.lock().unwrap().push("scan");
        self.scans.lock().unwrap().push((start.to_vec(), end.map(<[u8]>::to_vec), limit, reverse));
        let data = self.data.lock().unwrap();
        let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = data
            .iter()
            .filter(|(key, _)| key.as_slice() >= start && end.is_none_or(|end| key.as_slice() < end))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        if reverse {
            pairs.reverse();
        }
        let more = pairs.len() > limit;
        pairs.truncate(limit);
        Ok((pairs, more))
    }

    fn statuses(&self) -> Vec<ReplicaStatus> {
        vec![self.status.lock().unwrap().clone()]
    }
}

/// A valid three-node configuration for node 1, with its data under `data_dir`. Its
/// `peer_secret_file` (beside `data_dir`) does not exist: see [`with_secret_file`].
pub fn three_node_config(data_dir: &std::path::Path) -> ServerConfig {
    ServerConfig {
        node_id: 1,
        listen: "127.0.0.1:7001".into(),
        data_dir: data_dir.to_path_buf(),
        peer_secret_file: Some(data_dir.with_file_name("peer-secret")),
        members: (1..=3).map(|id| MemberConfig { id, address: format!("127.0.0.1:{}", 7000 + id) }).collect(),
        // One shard: the fake backend is one replica.
        cluster: onekv_server::config::ClusterConfig { shards: 1, ..Default::default() },
        ..ServerConfig::default()
    }
}

/// Writes a new cluster secret into a file in `dir` and points `config` at it.
pub fn with_secret_file(config: &mut ServerConfig, dir: &std::path::Path) -> onekv_server::PeerSecret {
    let secret = onekv_server::PeerSecret::generate();
    let path = dir.join("peer-secret");
    secret.write_new(&path).expect("writing the secret file");
    config.peer_secret_file = Some(path);
    secret
}
