//! A follower that was down through more writes than the leader keeps in its Raft log catches up
//! through a snapshot streamed in chunks over the peer service (issue 15: a state over one
//! message's bound was never sent, and such a follower stayed behind for good), also when the
//! sender is killed part-way through the stream: the sender is the other follower, which serves
//! the snapshot in the leader's stead; the follower drops the broken fetch and fetches the
//! leader's snapshot. Real `onekv server` processes; every acknowledged write must read back from
//! the follower's own copy.

mod common;

use std::time::{Duration, Instant};

use common::{TestCluster, run_bounded, write_keys};

#[test]
fn a_follower_catches_up_through_a_streamed_snapshot_even_when_its_sender_dies_mid_stream() {
    run_bounded(Duration::from_secs(240), async {
        let mut cluster = TestCluster::start(3, |config| {
            config.raft.raft_log_keep_entries = 20;
            config.index.memtable_bytes = 256 << 10;
            // 16 MiB of keys and values in 16 KiB chunks: a stream long enough to cut.
            config.raft.snapshot_chunk_bytes = 16 << 10;
        })
        .await;
        let client = cluster.client();
        cluster.leaders().await;
        let leader = cluster.leader().await;
        let lagging = cluster.ids().into_iter().find(|&id| id != leader).expect("a follower");
        let sender = cluster.ids().into_iter().find(|&id| id != leader && id != lagging).expect("a sender");
        cluster.kill9(lagging);
        let mut acked = write_keys(&client, "down", 16_000).await;
        cluster.restart(lagging).await;

        // Wait until the follower is part-way through fetching, then kill the sender.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let status = cluster.status(lagging).await.expect("the follower's status");
            if status.snapshot.contains("fetching a snapshot") && !status.snapshot.contains(": 0 chunks") {
                break;
            }
            assert!(Instant::now() < deadline, "the follower never started fetching: {status:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let serving = cluster.status(sender).await.expect("the sender's status").snapshot;
        assert!(serving.contains("in the leader's stead"), "the other follower does not serve: {serving:?}");
        cluster.kill9(sender);
        cluster.restart(sender).await;
        // Writes go on while the follower fetches again.
        acked.extend(write_keys(&client, "after", 500).await);
        cluster.wait_caught_up(lagging).await;

        let log = cluster.log_text(lagging);
        assert!(
            log.contains("a snapshot fetch from another replica failed"),
            "the fetch was not cut:\n{}",
            common::tail(&cluster.data_dir(lagging).with_file_name("server.log"), 30)
        );
        assert!(log.contains("fetched a snapshot"), "no snapshot was fetched whole");
        assert!(!log.contains("panicked"), "the follower panicked");
        let (missing, examples) = common::read_back_from(&client, cluster.endpoint(lagging), &acked).await;
        assert_eq!(missing, 0, "acknowledged writes missing on the follower: {examples:?}");
    });
}
