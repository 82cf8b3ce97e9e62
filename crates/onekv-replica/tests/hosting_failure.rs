//! A replica whose removal could not be written to the node's list of replicas stays listed (and
//! protected from the log collector), and asking again finishes the removal: after a restart the
//! node does not open it. Its own test binary, because failpoints are process-wide. Needs the
//! `failpoints` feature (`scripts/test` turns it on).

mod common;

use common::cluster::Cluster;
use onekv_replica::{MembershipChange, Node, ReplicaError, StorageMode};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[test]
fn a_removal_that_could_not_be_written_is_finished_by_asking_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 1, StorageMode::OneLog, |_| {});
    cluster.put("a", b"1");
    let mut config = cluster.config(2);
    config.shards.clear();
    let node = Node::open(config.clone(), cluster.router.clone()).unwrap();
    cluster.router.add(2, node.add_replica(1).unwrap());
    let change = |cluster: &Cluster, step: MembershipChange| {
        let (tx, rx) = mpsc::channel();
        cluster.replica(1).change_members(step, Box::new(move |r| tx.send(r).unwrap()));
        rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap()
    };
    change(&cluster, MembershipChange { add_learners: vec![2], ..Default::default() });
    let last = cluster.put_indexed("b", b"2");
    cluster.wait_applied(2, last);
    change(&cluster, MembershipChange { remove: vec![2], ..Default::default() });
    cluster.router.remove(2);

    onekv_replica::failpoints::arm("fail-replicas-write", "return").unwrap();
    let error = node.remove_replica(1).unwrap_err();
    onekv_replica::failpoints::arm("fail-replicas-write", "off").unwrap();
    assert!(matches!(&error, ReplicaError::Storage(m) if m.contains("fail-replicas-write")), "{error}");
    // Still listed, so still shown: whoever removes it sees it is not gone yet.
    assert_eq!(node.shards(), vec![1]);
    node.remove_replica(1).unwrap();
    assert!(node.shards().is_empty());
    assert_eq!(node.last_voters_of_removed(1), Some(vec![1]), "the voters the first attempt learnt");
    node.shutdown();

    let node = Node::open(config, cluster.router.clone()).unwrap();
    assert!(node.shards().is_empty(), "the removed replica came back: {:?}", node.shards());
    node.shutdown();
    let deadline = Instant::now() + Duration::from_secs(5);
    while cluster.replica(1).status().learners != Vec::<u64>::new() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    cluster.shutdown();
}
