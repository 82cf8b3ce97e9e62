//! Group commit under concurrency: many threads appending at once share writes and fsyncs, every
//! caller gets its own correct locators, and nothing is lost or interleaved within a call.

use onekv_log::io::{FaultyDir, FsDir, MemDir};
use onekv_log::{Log, LogConfig, OpenOptions, RecordKind};
use std::sync::Arc;
use std::time::Duration;

const K: RecordKind = RecordKind::new(5).unwrap();

fn hammer(log: &Arc<Log>, threads: u32, per_thread: u32) -> Vec<(u32, u32, Vec<onekv_log::Locator>)> {
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                let mut out = Vec::new();
                for i in 0..per_thread {
                    let a = format!("t{t}-i{i}-a").repeat(1 + (i as usize % 7));
                    let b = format!("t{t}-i{i}-b");
                    let locs = log.append(&[(K, a.as_bytes()), (K, b.as_bytes())]).unwrap();
                    out.push((t, i, locs));
                }
                out
            })
        })
        .collect();
    handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
}

fn check(log: &Log, results: &[(u32, u32, Vec<onekv_log::Locator>)]) {
    let mut all = Vec::new();
    for (t, i, locs) in results {
        let a = format!("t{t}-i{i}-a").repeat(1 + (*i as usize % 7));
        assert_eq!(log.read(locs[0]).unwrap(), a.as_bytes());
        assert_eq!(log.read(locs[1]).unwrap(), format!("t{t}-i{i}-b").as_bytes());
        assert!(locs[0].end() < locs[1].position, "records of one call are in order");
        all.extend(locs.iter().copied());
    }
    all.sort();
    for pair in all.windows(2) {
        assert!(pair[0].end() <= pair[1].position, "locators overlap: {} {}", pair[0], pair[1]);
    }
    assert_eq!(log.verify().unwrap(), all.len() as u64);
}

#[test]
fn concurrent_appenders_share_fsyncs() {
    let faulty = FaultyDir::new(Arc::new(MemDir::new()));
    faulty.faults().slow_syncs(Duration::from_millis(2));
    let config = LogConfig { segment_size_bytes: 64 << 10, max_record_bytes: 4096, ..LogConfig::default() };
    let log = Arc::new(Log::open(Arc::new(faulty), config, OpenOptions::default()).unwrap().0);
    let results = hammer(&log, 16, 40);
    check(&log, &results);
    let stats = log.stats();
    assert_eq!(stats.records, 16 * 40 * 2);
    // 640 appends behind a 2 ms fsync: one fsync each would take over a second; grouping makes
    // several appends share each write.
    assert!(stats.writes * 3 < 16 * 40, "only {} appends per write", 640.0 / stats.writes as f64);
}

#[test]
fn concurrent_appenders_on_the_real_file_system() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = FsDir::create_all(tmp.path().join("log")).unwrap();
    let config = LogConfig { segment_size_bytes: 32 << 10, max_record_bytes: 4096, ..LogConfig::default() };
    let log = Arc::new(Log::open(Arc::new(dir), config.clone(), OpenOptions::default()).unwrap().0);
    let results = hammer(&log, 8, 100);
    check(&log, &results);
    assert!(log.stats().segments_created > 1);
    drop(log);
    let (log, report) = Log::open_path(tmp.path().join("log"), config, OpenOptions::default()).unwrap();
    assert_eq!(report.torn_tail, None);
    check(&log, &results);
}
