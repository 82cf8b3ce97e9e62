//! Opening a log whose files hold arbitrary bytes: open either fails with an error or succeeds, and
//! then every record it iterates verifies and reads back the same through its locator. No panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onekv_log::io::MemDir;
use onekv_log::{Log, LogConfig, OpenOptions, segment};
use std::sync::Arc;

fuzz_target!(|input: &[u8]| {
    // First byte: how many bytes go to a first (sealed) segment; the rest is the last segment,
    // which gets a valid header half of the time so the record scan is reached.
    let Some((&split, rest)) = input.split_first() else { return };
    let split = (usize::from(split) * 64).min(rest.len());
    let dir = MemDir::new();
    let (first, last) = rest.split_at(split);
    let mut last_bytes = Vec::new();
    let last_base = first.len() as u64;
    if split % 128 == 0 {
        last_bytes.extend_from_slice(&segment::encode_header(last_base));
    }
    last_bytes.extend_from_slice(last);
    if !first.is_empty() {
        dir.write_file(&segment::file_name(0), first.to_vec());
    }
    dir.write_file(&segment::file_name(last_base), last_bytes);
    let config = LogConfig { segment_size_bytes: 4096, max_record_bytes: 2048, ..LogConfig::default() };
    let Ok((log, _)) = Log::open(Arc::new(dir), config, OpenOptions::default()) else { return };
    for entry in log.iter_from(log.first_position()) {
        let Ok(entry) = entry else { break };
        assert_eq!(log.read(entry.locator).expect("iterated records are readable"), entry.payload);
        let (kind, payload) = log.read_record(entry.locator).expect("iterated records verify");
        assert_eq!((kind, payload), (entry.kind, entry.payload));
    }
    log.append(&[(onekv_log::RecordKind::new(1).unwrap(), b"after")]).expect("an opened log takes appends");
});
