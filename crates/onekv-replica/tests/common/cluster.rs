//! A shard's replicas in one process, wired by an in-memory transport, for the tests that run a
//! cluster: start, stop and restart nodes, add new ones, propose and read.

use onekv_replica::local::Router;
use onekv_replica::{
    Command, Outcome, Replica, ReplicaConfig, ReplicaError, RequestId, StorageMode, WriteOp,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Replicas of one shard in one process, each in its own directory under `root`, wired by an
/// in-memory [`Router`].
pub struct Cluster {
    pub router: Arc<Router>,
    pub root: PathBuf,
    /// Every node started so far (running or stopped).
    pub ids: Vec<u64>,
    /// The shard's voters when it was created; nodes that joined later start with no members.
    pub founders: Vec<u64>,
    pub mode: StorageMode,
    pub tweak: fn(&mut ReplicaConfig),
    pub next_seq: u64,
}

impl Cluster {
    pub fn start(root: &Path, nodes: u64, mode: StorageMode, tweak: fn(&mut ReplicaConfig)) -> Cluster {
        let mut cluster = Cluster {
            router: Arc::new(Router::default()),
            root: root.to_path_buf(),
            ids: (1..=nodes).collect(),
            founders: (1..=nodes).collect(),
            mode,
            tweak,
            next_seq: 1,
        };
        for id in cluster.ids.clone() {
            cluster.open(id);
        }
        cluster
    }

    pub fn config(&self, id: u64) -> ReplicaConfig {
        let voters = if self.founders.contains(&id) { self.founders.clone() } else { Vec::new() };
        let mut config = ReplicaConfig::new(id, voters, self.root.join(format!("node{id}")));
        config.storage = self.mode;
        config.tick = Duration::from_millis(20);
        (self.tweak)(&mut config);
        config
    }

    pub fn open(&mut self, id: u64) {
        let replica = Replica::open(self.config(id), self.router.clone()).expect("open");
        self.router.add(id, replica);
    }

    pub fn stop(&mut self, id: u64) {
        self.router.remove(id).expect("running").shutdown();
    }

    pub fn replica(&self, id: u64) -> Replica {
        self.router.get(id).expect("running")
    }

    pub fn leader(&self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(id) = self.router.leader() {
                return id;
            }
            assert!(Instant::now() < deadline, "no leader elected");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn propose(&mut self, command: Command) -> Result<Outcome, ReplicaError> {
        let request_id = RequestId { client: 1, seq: self.next_seq };
        self.next_seq += 1;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let replica = self.replica(self.leader());
            let (tx, rx) = mpsc::channel();
            replica.propose(request_id, command.clone(), Box::new(move |r| tx.send(r).unwrap()));
            match rx.recv_timeout(Duration::from_secs(10)).expect("a reply") {
                Err(ReplicaError::NotLeader { .. }) | Err(ReplicaError::Dropped(_))
                    if Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20))
                }
                other => return other,
            }
        }
    }

    pub fn put(&mut self, key: &str, value: &[u8]) {
        self.propose(Command::Write(vec![WriteOp {
            key: key.into(),
            value: Some(value.to_vec()),
            expiry: Default::default(),
        }]))
        .unwrap();
    }

    /// Writes `key` and returns the index of its entry.
    pub fn put_indexed(&mut self, key: &str, value: &[u8]) -> u64 {
        let write = Command::Write(vec![WriteOp {
            key: key.into(),
            value: Some(value.to_vec()),
            expiry: Default::default(),
        }]);
        self.propose(write).unwrap().index
    }

    pub fn linearizable_get(&self, key: &str) -> Option<Vec<u8>> {
        let replica = self.replica(self.leader());
        let (tx, rx) = mpsc::channel();
        replica.read_barrier(Box::new(move |r| tx.send(r).unwrap()));
        rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
        replica.get(key.as_bytes()).unwrap()
    }

    /// Waits until `id` has applied at least `index`.
    pub fn wait_applied(&self, id: u64, index: u64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.replica(id).status().applied_index < index {
            assert!(
                Instant::now() < deadline,
                "node {id} did not apply {index}: {:?}",
                self.replica(id).status()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts node `id`, new to the shard: it has no members until the leader adds it.
    pub fn join(&mut self, id: u64) {
        assert!(!self.ids.contains(&id), "node {id} was started before");
        self.ids.push(id);
        self.open(id);
    }

    pub fn shutdown(mut self) {
        for id in self.ids.clone() {
            if self.router.get(id).is_some() {
                self.stop(id);
            }
        }
    }
}
