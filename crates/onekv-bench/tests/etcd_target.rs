//! `EtcdTarget` against a real local 3-member etcd cluster (`LocalEtcd`): every YCSB operation
//! does what the harness counts on, and dropping the cluster leaves no member running.
//!
//! Needs `etcd` on PATH: without it the test fails (it must not pass silently); CI installs it
//! with scripts/install-etcd.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use onekv_bench::Target as _;
use onekv_bench::local_etcd::LocalEtcd;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_against_a_local_etcd_cluster() {
    let found = Command::new("etcd").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    assert!(
        matches!(found, Ok(status) if status.success()),
        "`etcd` is not on PATH: run `bash scripts/install-etcd` (CI does) to install it"
    );
    let test = async {
        let mut cluster = LocalEtcd::start(Path::new("etcd"), None, 3).expect("starting etcd");
        let pids = cluster.pids();
        assert_eq!(pids.len(), 3);
        cluster.wait_ready(Duration::from_secs(30)).await.expect("etcd ready");
        let target = cluster.target();

        assert!(!target.read(b"user1").await.unwrap());
        for key in [b"user1", b"user2", b"user3", b"user4"] {
            target.insert(key, b"v").await.unwrap();
        }
        assert!(target.read(b"user1").await.unwrap());
        target.update(b"user1", b"w").await.unwrap();
        // From user2 on, at most 2: the limit holds; from user3 on there are exactly 2.
        assert_eq!(target.scan(b"user2", 2).await.unwrap(), 2);
        assert_eq!(target.scan(b"user3", 10).await.unwrap(), 2);
        assert_eq!(target.scan(b"user5", 10).await.unwrap(), 0);
        assert!(target.read_modify_write(b"user2", b"x").await.unwrap());
        assert!(!target.read_modify_write(b"user9", b"x").await.unwrap());
        assert!(target.read(b"user9").await.unwrap(), "the write of a read-modify-write is made");

        let probes = cluster.probes();
        assert!(probes.iter().all(|probe| probe.pid.is_some() && probe.data_dir.is_some()));

        // The first endpoint (where requests start) killed: requests move on to the others. If it
        // led, the others answer UNAVAILABLE until they elect a new leader, hence the retries.
        let status = Command::new("kill").arg("-KILL").arg(pids[0].to_string()).status().unwrap();
        assert!(status.success());
        let mut attempts = 0;
        let found = loop {
            attempts += 1;
            match target.read(b"user1").await {
                Ok(found) => break found,
                Err(error) if attempts < 50 => {
                    eprintln!("read after a member's death: {error}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(error) => panic!("no failover: {error}"),
            }
        };
        assert!(found);
        drop(cluster);
        for pid in pids {
            assert!(!Path::new(&format!("/proc/{pid}")).exists(), "etcd member {pid} still running");
        }
    };
    tokio::time::timeout(Duration::from_secs(60), test).await.expect("within 60 s");
}
