//! The request metrics stay bounded in memory when nobody reads `/metrics`: the recorder keeps each
//! recorded latency until its histograms are drained, which a background upkeep does. (Its own test
//! binary: it measures the process's resident memory, which other tests would disturb.)

use onekv_server::metrics::{REQUEST_DURATION_SECONDS, UPKEEP_INTERVAL, install_request_recorder};

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn recorded_latencies_are_drained_without_a_scrape() {
    assert!(install_request_recorder().is_some());
    let histogram = metrics::histogram!(REQUEST_DURATION_SECONDS, "protocol" => "grpc", "op" => "get");
    let before = resident_bytes();
    // 16 million latencies, over many upkeep intervals: kept, they took 250 MiB (8 bytes each plus
    // the recorder's own structures).
    let batches = 32;
    for _ in 0..batches {
        for i in 0..500_000u32 {
            histogram.record(f64::from(i % 1000) * 1e-6);
        }
        std::thread::sleep(UPKEEP_INTERVAL / 2);
    }
    std::thread::sleep(UPKEEP_INTERVAL * 2);
    let grown = resident_bytes().saturating_sub(before);
    assert!(grown < 48 << 20, "resident memory grew by {} MiB", grown >> 20);
}
