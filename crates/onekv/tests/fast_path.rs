//! The fast path through real `onekv server` processes and the client (`cluster.fast_path`,
//! `Client::put_fast`): blind writes done in one round trip to every voter, applied on every
//! replica from its own durability record and read back linearizably; with a voter stopped they
//! fall back to the Raft path with the same request id and stay bounded in latency (at R = 3; at
//! R = 5 they stay fast, 4 of 5); with the leader killed no acknowledged write is lost; with the
//! fast path off they take the Raft path.
//! The Redis front end sends SET and MSET by the fast path.

mod common;

use common::{TestCluster, run_bounded, test_client_options};
use onekv_client::{Client, ClientOptions};
use std::time::{Duration, Instant};

const SHARDS: u32 = 4;

fn fast_cluster(config: &mut onekv_server::ServerConfig) {
    config.cluster.fast_path = true;
    config.cluster.shards = SHARDS;
}

fn client(cluster: &TestCluster) -> Client {
    let endpoints = cluster.ids().iter().map(|&id| cluster.endpoint(id).to_string()).collect();
    Client::new(
        endpoints,
        ClientOptions { fast_path_wait: Some(Duration::from_millis(500)), ..test_client_options() },
    )
    .expect("a client")
}

/// Sums a per-shard counter over every node's status.
async fn fast_counters(cluster: &TestCluster) -> (u64, u64, u64) {
    let client = cluster.client();
    let mut sums = (0, 0, 0);
    for id in cluster.ids() {
        let status = client.status(cluster.endpoint(id)).await.expect("status");
        for shard in status.shards {
            sums.0 += shard.fast_pending;
            sums.1 += shard.fast_from_record;
            sums.2 += shard.fast_from_inline;
        }
    }
    sums
}

#[test]
fn blind_writes_complete_in_one_round_and_read_back() {
    run_bounded(Duration::from_secs(120), async {
        let cluster = TestCluster::start(3, fast_cluster).await;
        let client = client(&cluster);
        let mut fast = 0;
        for i in 0..200 {
            let done = client.put_fast(format!("k{i}").as_bytes(), format!("v{i}").as_bytes()).await.unwrap();
            fast += usize::from(done.fast);
        }
        // A new client's first writes, or a leader's first ones, may fall back; most are fast.
        assert!(fast >= 150, "only {fast} of 200 writes were done fast");
        for i in 0..200 {
            assert_eq!(
                client.get(format!("k{i}").as_bytes()).await.unwrap(),
                Some(format!("v{i}").into_bytes())
            );
        }
        let deleted = client.delete_fast(b"k0").await.unwrap();
        assert_eq!(client.get(b"k0").await.unwrap(), None, "{deleted:?}");
        let tagged = vec![(b"{t}a".to_vec(), Some(b"1".to_vec())), (b"{t}b".to_vec(), None)];
        client.batch_fast(tagged).await.unwrap();
        assert_eq!(client.get(b"{t}a").await.unwrap(), Some(b"1".to_vec()));
        let split = vec![(b"a".to_vec(), Some(b"1".to_vec())), (b"b".to_vec(), Some(b"2".to_vec()))];
        if client.shard_of(b"a").await.unwrap() != client.shard_of(b"b").await.unwrap() {
            assert!(client.batch_fast(split).await.is_err(), "a batch over two shards is refused");
        }
        // Every replica applies the writes, from its own record (the value written once) for most:
        // the leader orders by reference once every replica said it holds them.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (pending, from_record, from_inline) = fast_counters(&cluster).await;
            if pending == 0 && from_record + from_inline >= 3 * fast as u64 {
                assert!(from_record >= from_inline, "record {from_record}, inline {from_inline}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "pending {pending}, record {from_record}, inline {from_inline}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // A stale read at every node sees every write (each applied them).
        for id in cluster.ids() {
            let got = client.get_stale(b"k199", Some(cluster.endpoint(id))).await.unwrap();
            assert_eq!(got, Some(b"v199".to_vec()), "node {id}");
        }
    });
}

#[test]
fn with_a_voter_stopped_writes_fall_back_and_stay_bounded() {
    run_bounded(Duration::from_secs(120), async {
        let mut cluster = TestCluster::start(3, fast_cluster).await;
        let client = client(&cluster);
        client.put_fast(b"warm", b"up").await.unwrap();
        // A follower of the key's shard stops answering (its sockets stay open: no refusal).
        let shard = client.shard_of(b"slow").await.unwrap();
        let leader = cluster.leader_of(shard).await;
        let stopped = cluster.ids().into_iter().find(|&id| id != leader).unwrap();
        cluster.pause(stopped);
        let mut fast = 0;
        let mut slowest = Duration::ZERO;
        for i in 0..50 {
            let started = Instant::now();
            let done = client.put_fast(b"slow", format!("v{i}").as_bytes()).await.unwrap();
            slowest = slowest.max(started.elapsed());
            fast += usize::from(done.fast);
            assert_eq!(client.get(b"slow").await.unwrap(), Some(format!("v{i}").into_bytes()));
        }
        assert_eq!(fast, 0, "no write can complete fast at R = 3 without every voter");
        // The first waits the fast path's wait (500 ms here), then the shard goes straight to Raft
        // for a while; none waits twice.
        assert!(slowest < Duration::from_secs(3), "slowest write took {slowest:?}");
        cluster.resume(stopped);
        // Once the voter is back (and the shard's pause over) writes are fast again.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut i = 0;
        while !client.put_fast(b"slow", format!("again{i}").as_bytes()).await.unwrap().fast {
            assert!(Instant::now() < deadline, "the fast path never came back");
            i += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(client.get(b"slow").await.unwrap(), Some(format!("again{i}").into_bytes()));
    });
}

#[test]
fn killing_the_leader_loses_no_acknowledged_fast_write() {
    run_bounded(Duration::from_secs(180), async {
        let mut cluster = TestCluster::start(3, |config| {
            fast_cluster(config);
            config.cluster.shards = 1;
        })
        .await;
        let client = client(&cluster);
        let writer = {
            let client = client.clone();
            tokio::spawn(async move {
                let mut acked = Vec::new();
                let started = Instant::now();
                while started.elapsed() < Duration::from_secs(6) {
                    let i = acked.len();
                    match client.put_fast(format!("k{i}").as_bytes(), format!("v{i}").as_bytes()).await {
                        Ok(_) => acked.push(i),
                        Err(error) => panic!("write {i} failed: {error}"),
                    }
                }
                acked
            })
        };
        tokio::time::sleep(Duration::from_secs(2)).await;
        let leader = cluster.leader().await;
        cluster.kill9(leader);
        let acked = writer.await.unwrap();
        assert!(acked.len() > 20, "only {} writes", acked.len());
        cluster.restart(leader).await;
        for i in acked {
            assert_eq!(
                client.get(format!("k{i}").as_bytes()).await.unwrap(),
                Some(format!("v{i}").into_bytes()),
                "k{i}"
            );
        }
    });
}

#[test]
fn at_five_replicas_writes_stay_fast_with_a_voter_stopped_and_survive_the_leader() {
    run_bounded(Duration::from_secs(180), async {
        let mut cluster = TestCluster::start(5, |config| {
            fast_cluster(config);
            config.cluster.shards = 1;
            config.cluster.replicas = Some(5);
        })
        .await;
        let client = client(&cluster);
        client.put_fast(b"warm", b"up").await.unwrap();
        // A follower stops answering: four of five still make a fast write done, without a wait.
        let leader = cluster.leader().await;
        let stopped = cluster.ids().into_iter().find(|&id| id != leader).unwrap();
        cluster.pause(stopped);
        let mut fast = 0;
        let mut slowest = Duration::ZERO;
        for i in 0..100 {
            let started = Instant::now();
            let done = client.put_fast(format!("k{i}").as_bytes(), format!("v{i}").as_bytes()).await.unwrap();
            slowest = slowest.max(started.elapsed());
            fast += usize::from(done.fast);
        }
        assert!(fast >= 95, "only {fast} of 100 writes were done fast with one voter of five stopped");
        assert!(slowest < Duration::from_millis(500), "a write waited {slowest:?}: it fell back");
        // The leader dies too: three of five are left, a majority; the new leader gathers what
        // the others hold (it may lack writes the stopped voter and it were not asked for).
        cluster.kill9(leader);
        for i in 0..100 {
            assert_eq!(
                client.get(format!("k{i}").as_bytes()).await.unwrap(),
                Some(format!("v{i}").into_bytes()),
                "k{i}"
            );
        }
        // Two of five out: no write can be done fast (it needs four), each takes the Raft path.
        let done = client.put_fast(b"two-out", b"v").await.unwrap();
        assert!(!done.fast, "{done:?}");
        assert_eq!(client.get(b"two-out").await.unwrap(), Some(b"v".to_vec()));
        // With the stopped voter back, four of five answer again: fast once more.
        cluster.resume(stopped);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut i = 0;
        while !client.put_fast(format!("after{i}").as_bytes(), b"v").await.unwrap().fast {
            assert!(Instant::now() < deadline, "no fast write done with four of five up");
            i += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(client.get(format!("after{i}").as_bytes()).await.unwrap(), Some(b"v".to_vec()));
    });
}

#[test]
fn with_the_fast_path_off_blind_writes_take_the_raft_path() {
    run_bounded(Duration::from_secs(60), async {
        let cluster = TestCluster::start(3, |config| config.cluster.shards = SHARDS).await;
        let client = client(&cluster);
        for i in 0..5 {
            let done = client.put_fast(b"k", format!("v{i}").as_bytes()).await.unwrap();
            assert!(!done.fast && done.index.is_some(), "{done:?}");
        }
        assert_eq!(client.get(b"k").await.unwrap(), Some(b"v4".to_vec()));
    });
}

#[test]
fn the_redis_front_end_sends_set_and_mset_by_the_fast_path() {
    use std::io::{BufRead, BufReader, Write};
    run_bounded(Duration::from_secs(60), async {
        let resp_port = common::free_port();
        let cluster = TestCluster::start(3, move |config| {
            fast_cluster(config);
            if config.node_id == 1 {
                config.resp_listen = Some(format!("127.0.0.1:{resp_port}"));
            }
        })
        .await;
        let (_, before, _) = fast_counters(&cluster).await;
        let stream = std::net::TcpStream::connect(("127.0.0.1", resp_port)).expect("the RESP port");
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut writer = stream;
        let mut command = |args: &[&str]| {
            let mut text = format!("*{}\r\n", args.len());
            for arg in args {
                text.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
            }
            writer.write_all(text.as_bytes()).unwrap();
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            line
        };
        for i in 0..20 {
            assert_eq!(command(&["SET", &format!("r{i}"), "v"]), "+OK\r\n");
        }
        assert_eq!(command(&["MSET", "{m}a", "1", "{m}b", "2", "x", "3"]), "+OK\r\n");
        // Applied fast on every replica (from their own records), and read back.
        let deadline = Instant::now() + Duration::from_secs(20);
        while fast_counters(&cluster).await.1 < before + 3 * 20 {
            assert!(Instant::now() < deadline, "the SETs were not applied by the fast path");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let client = client(&cluster);
        assert_eq!(client.get(b"r19").await.unwrap(), Some(b"v".to_vec()));
        assert_eq!(client.get(b"{m}b").await.unwrap(), Some(b"2".to_vec()));
        assert_eq!(client.get(b"x").await.unwrap(), Some(b"3".to_vec()));
    });
}
