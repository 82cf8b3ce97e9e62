//! A node whose data directory was wiped comes back into a running cluster of real `onekv server`
//! processes (issue 15's finding: it panicked with "to_commit ... is out of range" on its first
//! heartbeat and stayed failed). It must start, be sent the data again (a snapshot here: the
//! leader keeps only a few entries), report itself rejoining until it has caught up, hold every
//! acknowledged write in its own copy afterwards, and then count in the majority: with the other
//! follower killed, writes still commit. (Its votes while rejoining are the simulation's to test:
//! `onekv-sim`, `Bug::VotesWhileRejoining`.)

mod common;

use std::time::{Duration, Instant};

use common::{TestCluster, run_bounded, write_keys};

#[test]
fn a_wiped_follower_rejoins_catches_up_and_counts_in_the_majority_again() {
    run_bounded(Duration::from_secs(150), async {
        // Few entries kept, and small memtables so the index flushes and the log can be compacted.
        let mut cluster = TestCluster::start(3, |config| {
            config.raft.raft_log_keep_entries = 20;
            config.index.memtable_bytes = 64 << 10;
            // The snapshot streams in many chunks (2.3 MiB of keys and values).
            config.raft.snapshot_chunk_bytes = 64 << 10;
        })
        .await;
        let client = cluster.client();
        let mut acked = write_keys(&client, "before", 2_000).await;
        // Leadership settled on the primary, so the leader that sees the wipe keeps leading.
        cluster.leaders().await;
        let leader = cluster.leader().await;
        let wiped = cluster.ids().into_iter().find(|&id| id != leader).expect("a follower");
        let other =
            cluster.ids().into_iter().find(|&id| id != leader && id != wiped).expect("another follower");

        cluster.kill9(wiped);
        std::fs::remove_dir_all(cluster.data_dir(wiped)).expect("wiping the follower's data directory");
        cluster.restart(wiped).await;
        // Writes go on while it rejoins.
        acked.extend(write_keys(&client, "during", 300).await);

        let deadline = Instant::now() + Duration::from_secs(60);
        let target = cluster.status(leader).await.expect("the leader's status").shards[0].commit_index;
        loop {
            let status = cluster.status(wiped).await.expect("the wiped node's status");
            let shard = &status.shards[0];
            if !shard.rejoining && shard.applied_index >= target {
                // The leader kept 20 entries: the node got a snapshot, and its log starts above it.
                assert!(status.first_index > 1, "caught up without a snapshot: {status:?}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the wiped node did not catch up within 60 s (applied {} of {target}, rejoining: {}); its log:\n{}",
                shard.applied_index,
                shard.rejoining,
                common::tail(&cluster.data_dir(wiped).with_file_name("server.log"), 30)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let wiped_log = cluster.log_text(wiped);
        assert!(!wiped_log.contains("panicked"), "the wiped node panicked:\n{wiped_log}");
        assert!(wiped_log.contains("fetched a snapshot"), "no streamed snapshot:\n{wiped_log}");
        let leader_log = cluster.log_text(leader);
        assert!(
            leader_log.contains("lost Raft entries it acknowledged"),
            "the leader never noticed the follower lost its log:\n{}",
            common::tail(&cluster.data_dir(leader).with_file_name("server.log"), 30)
        );

        // Its own copy holds every acknowledged write.
        let endpoint = cluster.endpoint(wiped).to_string();
        for (key, value) in &acked {
            let stored =
                client.get_stale(key, Some(&endpoint)).await.expect("a stale read from the wiped node");
            assert_eq!(
                stored.as_deref(),
                Some(&value[..]),
                "{} on the wiped node",
                String::from_utf8_lossy(key)
            );
        }

        // It acknowledges writes again: with the other follower gone, the leader needs it.
        cluster.kill9(other);
        acked.extend(write_keys(&client, "after", 200).await);
        for (key, value) in &acked {
            let stored = client.get(key).await.expect("a read");
            assert_eq!(stored.as_deref(), Some(&value[..]), "{}", String::from_utf8_lossy(key));
        }
    });
}
