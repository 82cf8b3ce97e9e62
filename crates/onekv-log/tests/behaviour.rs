//! The log's contract, one behaviour per test: appends, reads, iteration, segment rolls,
//! reclamation, limits, and refusing to write after a failed write or fsync.

use onekv_log::io::{Dir, FaultyDir, MemDir};
use onekv_log::{
    Locator, Log, LogConfig, LogError, OpenOptions, RECORD_HEADER_LEN, RecordKind, SEGMENT_HEADER_LEN,
};
use std::sync::Arc;

const K: RecordKind = RecordKind::new(1).unwrap();

fn small() -> LogConfig {
    LogConfig {
        segment_size_bytes: 4096,
        max_record_bytes: 1000,
        recycled_segments: 2,
        ..LogConfig::default()
    }
}

fn open(dir: &MemDir, config: LogConfig) -> Log {
    Log::open(Arc::new(dir.clone()), config, OpenOptions::default()).expect("open").0
}

/// Names in `dir` ending in `suffix` (".seg": segments; ".free": kept files), sorted.
fn files(dir: &MemDir, suffix: &str) -> Vec<String> {
    let mut names: Vec<_> = dir.list().unwrap().into_iter().filter(|n| n.ends_with(suffix)).collect();
    names.sort();
    names
}

#[test]
fn append_returns_payload_locators_and_reads_return_exact_bytes() {
    let dir = MemDir::new();
    let log = open(&dir, small());
    let locs = log.append(&[(K, b"first value"), (RecordKind::new(9).unwrap(), b"second")]).unwrap();
    assert_eq!(locs[0], Locator::new((SEGMENT_HEADER_LEN + RECORD_HEADER_LEN) as u64, 11));
    assert_eq!(locs[1].position, locs[0].end() + RECORD_HEADER_LEN as u64);
    assert_eq!(log.read(locs[0]).unwrap(), b"first value");
    assert_eq!(log.read(locs[0].slice(6, 5).unwrap()).unwrap(), b"value");
    assert_eq!(log.read_record(locs[1]).unwrap(), (RecordKind::new(9).unwrap(), b"second".to_vec()));
    assert!(matches!(log.read_record(locs[0].slice(1, 3).unwrap()), Err(LogError::NotARecord(_))));
    assert_eq!(log.end_position(), locs[1].end());
}

#[test]
fn reads_outside_the_durable_log_are_refused() {
    let dir = MemDir::new();
    let log = open(&dir, small());
    let loc = log.append(&[(K, b"x")]).unwrap()[0];
    for bad in [Locator::new(loc.position, 2), Locator::new(0, 4), Locator::new(u64::MAX, 1)] {
        let err = log.read(bad).unwrap_err();
        assert!(matches!(err, LogError::OutOfRange { .. }), "{bad}: {err}");
    }
}

#[test]
fn records_survive_reopen_and_iterate_in_order_across_segments() {
    let dir = MemDir::new();
    let log = open(&dir, small());
    let mut expected = Vec::new();
    for i in 0..200u32 {
        let payload = vec![i as u8; (i as usize * 7) % 300];
        let loc = log.append(&[(K, &payload)]).unwrap()[0];
        expected.push((loc, payload));
    }
    assert!(log.stats().segments_created > 5, "small segments must roll");
    drop(log);
    let (log, report) = Log::open(Arc::new(dir.clone()), small(), OpenOptions::default()).unwrap();
    assert_eq!(report.torn_tail, None);
    assert!(report.segments > 5);
    let got: Vec<_> = log.iter_from(log.first_position()).map(|e| e.unwrap()).collect();
    assert_eq!(got.len(), expected.len());
    for (entry, (loc, payload)) in got.iter().zip(&expected) {
        assert_eq!((entry.locator, &entry.payload), (*loc, payload));
        assert_eq!(&log.read(*loc).unwrap(), payload);
    }
    // Resume from the middle, at a record's start.
    let mid = &got[100];
    let rest: Vec<_> = log.iter_from(mid.position).map(|e| e.unwrap().locator).collect();
    assert_eq!(rest.len(), 100);
    assert_eq!(rest[0], mid.locator);
    assert_eq!(log.verify().unwrap(), 200);
}

#[test]
fn reclaim_deletes_whole_segments_below_a_position_and_keeps_the_rest_addressable() {
    let dir = MemDir::new();
    let log = open(&dir, small());
    let locs: Vec<_> = (0..100u8).map(|i| log.append(&[(K, &[i; 200])]).unwrap()[0]).collect();
    let files_before = files(&dir, ".seg").len();
    let cut = locs[50].position;
    let reclaimed = log.reclaim_below(cut).unwrap();
    assert!(reclaimed.segments >= 2);
    assert_eq!(files(&dir, ".seg").len(), files_before - reclaimed.segments as usize);
    // Two files kept for reuse (the default), the others deleted.
    assert_eq!(files(&dir, ".free").len(), 2);
    assert_eq!(dir.list().unwrap().len(), files_before - reclaimed.segments as usize + 2);
    assert!(log.first_position() <= cut);
    for (i, loc) in locs.iter().enumerate() {
        match log.read(*loc) {
            Ok(bytes) => assert_eq!(bytes, vec![i as u8; 200]),
            Err(LogError::OutOfRange { .. }) => assert!(loc.position < log.first_position()),
            Err(e) => panic!("{e}"),
        }
    }
    assert!(log.read(locs[50]).is_ok());
    // Reclaiming everything never deletes the segment being appended to.
    log.reclaim_below(u64::MAX).unwrap();
    assert_eq!(files(&dir, ".seg").len(), 1);
    assert_eq!(log.read(locs[99]).unwrap(), vec![99u8; 200]);
    let next = log.append(&[(K, b"after")]).unwrap()[0];
    assert!(next.position > locs[99].position, "positions are never reused");
    let first = log.first_position();
    drop(log);
    let log = open(&dir, small());
    assert_eq!(log.first_position(), first, "reopening keeps the reclaimed prefix gone");
    assert!(matches!(log.read(locs[0]), Err(LogError::OutOfRange { .. })));
    assert_eq!(log.read(next).unwrap(), b"after");
}

#[test]
fn reclaimed_files_become_later_segments_and_their_old_records_never_come_back() {
    let dir = MemDir::new();
    let log = open(&dir, small());
    let old: Vec<_> = (0..60u8).map(|i| log.append(&[(K, &[i; 200])]).unwrap()[0]).collect();
    log.reclaim_below(old[40].position).unwrap();
    let kept = files(&dir, ".free");
    assert_eq!((kept.len(), log.free_files()), (2, 2));
    let kept_bytes: Vec<_> = kept.iter().map(|name| dir.read_file(name).unwrap()).collect();

    // New segments take the kept files: no new file is created until they are used up.
    let created = log.stats().segments_created;
    let new: Vec<_> = (0..45u8).map(|i| log.append(&[(K, &[100 + i; 300])]).unwrap()[0]).collect();
    let stats = log.stats();
    assert_eq!(stats.segments_reused, 2, "{stats:?}");
    assert!(stats.segments_created > created, "a third roll creates a file");
    assert!(files(&dir, ".free").is_empty());
    // A sealed recycled segment was cut to its data; the active one still holds old bytes.
    let segments = log.segments();
    for (info, name) in segments.iter().zip(files(&dir, ".seg")) {
        let len = dir.read_file(&name).unwrap().len() as u64;
        if info.base != log.segments().last().unwrap().base {
            assert_eq!(len, info.len, "sealed segment {name} ends at its data");
        }
    }
    assert!(kept_bytes.iter().all(|b| b.len() as u64 > SEGMENT_HEADER_LEN as u64));
    let check = |log: &Log| {
        for (i, loc) in new.iter().enumerate() {
            assert_eq!(log.read_record(*loc).unwrap().1, vec![100 + i as u8; 300]);
        }
        let entries: Vec<_> = log.iter_from(log.first_position()).map(|e| e.unwrap()).collect();
        assert!(entries.iter().all(|e| e.payload.len() == 200 || e.payload.len() == 300));
        assert_eq!(entries.iter().filter(|e| e.payload.len() == 300).count(), new.len());
    };
    check(&log);

    // Make the active segment a recycled one with old records after its data, then reopen.
    log.reclaim_below(new[0].position).unwrap();
    while log.stats().segments_reused < 3 {
        log.append(&[(K, &[7; 300])]).unwrap();
    }
    let last = log.append(&[(K, b"last")]).unwrap()[0];
    let active = log.segments().last().copied().unwrap();
    let active_file = dir.read_file(&files(&dir, ".seg").pop().unwrap()).unwrap();
    assert!(active_file.len() as u64 > active.len, "the active recycled segment holds old bytes");
    drop(log);
    for crash in [false, true] {
        if crash {
            dir.crash(onekv_log::io::CrashMode::LoseUnsynced, 1);
        }
        let (log, report) = Log::open(Arc::new(dir.clone()), small(), OpenOptions::default()).unwrap();
        assert_eq!(log.end_position(), last.end(), "{report:?}");
        assert_eq!(log.read_record(last).unwrap().1, b"last");
        if !crash {
            assert_eq!(report.stale_tail.map(|(at, _)| at), Some(active.end()), "{report:?}");
            assert_eq!(report.torn_tail, None);
        }
        assert!(log.verify().is_ok());
        log.close().unwrap();
    }
}

#[test]
fn a_kept_file_a_reader_still_holds_is_not_reused() {
    let dir = MemDir::new();
    let config = LogConfig { recycled_segments: 1, ..small() };
    let log = open(&dir, config);
    let locs: Vec<_> = (0..40u8).map(|i| log.append(&[(K, &[i; 200])]).unwrap()[0]).collect();
    // An iterator parked on the first segment holds it.
    let mut iter = log.iter_from(log.first_position());
    assert_eq!(iter.next().unwrap().unwrap().payload, vec![0u8; 200]);
    let first_end = log.segments()[0].end();
    log.reclaim_below(first_end).unwrap();
    assert_eq!(log.free_files(), 1);
    while log.segments().len() < 4 {
        log.append(&[(K, &[9; 300])]).unwrap();
    }
    assert_eq!(log.stats().segments_reused, 0, "the held file was not reused");
    // The iterator still reads the old segment's records, unchanged.
    let rest: Vec<_> = iter.by_ref().take(3).map(|e| e.unwrap().payload).collect();
    assert_eq!(rest, vec![vec![1u8; 200], vec![2u8; 200], vec![3u8; 200]]);
    drop(iter);
    let before = log.segments().len();
    while log.segments().len() == before {
        log.append(&[(K, &[9; 300])]).unwrap();
    }
    assert_eq!(log.stats().segments_reused, 1, "reused once nobody held it");
    assert!(log.read(locs[39]).is_ok());
}

#[test]
fn turning_recycling_off_deletes_kept_files() {
    let dir = MemDir::new();
    let log = open(&dir, small());
    let locs: Vec<_> = (0..60u8).map(|i| log.append(&[(K, &[i; 200])]).unwrap()[0]).collect();
    log.reclaim_below(locs[40].position).unwrap();
    assert_eq!(files(&dir, ".free").len(), 2);
    let freed = log.set_recycling(false).unwrap();
    assert!(freed > 2 * 3000, "{freed}");
    assert!(files(&dir, ".free").is_empty());
    log.reclaim_below(locs[59].position).unwrap();
    assert!(files(&dir, ".free").is_empty(), "reclaimed files are deleted while recycling is off");
    log.set_recycling(true).unwrap();
    drop(log);
    // A lower limit on reopening deletes the surplus.
    let log = open(&dir, small());
    let more: Vec<_> = (0..60u8).map(|i| log.append(&[(K, &[i; 200])]).unwrap()[0]).collect();
    log.reclaim_below(more[50].position).unwrap();
    assert_eq!(files(&dir, ".free").len(), 2);
    drop(log);
    let (_log, report) = Log::open(
        Arc::new(dir.clone()),
        LogConfig { recycled_segments: 1, ..small() },
        OpenOptions::default(),
    )
    .unwrap();
    assert_eq!((report.free_files, files(&dir, ".free").len()), (1, 1));
}

#[test]
fn oversized_records_and_batches_are_rejected_with_clear_errors() {
    let dir = MemDir::new();
    let config = LogConfig { max_queued_bytes: 3000, ..small() };
    let log = open(&dir, config);
    let err = log.append(&[(K, &[0; 1001])]).unwrap_err();
    assert!(matches!(err, LogError::RecordTooLarge { len: 1001, max: 1000 }), "{err}");
    let err = log.append(&[(K, &[0; 1000]), (K, &[0; 1000]), (K, &[0; 1000])]).unwrap_err();
    assert!(matches!(err, LogError::BatchTooLarge { .. }), "{err}");
    assert_eq!(log.append(&[]).unwrap(), vec![]);
    assert!(log.append(&[(K, &[0; 1000])]).is_ok(), "the log keeps working after a rejection");
}

#[test]
fn append_in_parts_takes_a_batch_above_the_queue_bound() {
    let dir = MemDir::new();
    let config = LogConfig { max_queued_bytes: 3000, ..small() };
    let log = open(&dir, config.clone());
    let payloads: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 1000]).collect();
    let records: Vec<_> = payloads.iter().map(|p| (K, p.as_slice())).collect();
    assert!(matches!(log.append(&records), Err(LogError::BatchTooLarge { .. })));
    let locators = log.append_in_parts(&records).unwrap();
    assert_eq!(locators.len(), 10);
    assert!(locators.windows(2).all(|w| w[0].position < w[1].position), "in order");
    drop(log);
    let log = open(&dir, config);
    for (i, locator) in locators.iter().enumerate() {
        assert_eq!(log.read(*locator).unwrap(), payloads[i], "record {i} is durable");
    }
}

#[test]
fn bad_configuration_is_rejected_before_touching_anything() {
    let dir = MemDir::new();
    for config in [
        LogConfig { segment_size_bytes: 100, ..LogConfig::default() },
        LogConfig { segment_size_bytes: 2 << 30, ..LogConfig::default() },
        LogConfig { segment_size_bytes: 4096, max_record_bytes: 4096, ..LogConfig::default() },
        LogConfig { max_record_bytes: 0, ..LogConfig::default() },
        LogConfig { max_queued_bytes: 10, ..LogConfig::default() },
    ] {
        let err = Log::open(Arc::new(dir.clone()), config, OpenOptions::default()).unwrap_err();
        assert!(matches!(err, LogError::Config(_)), "{err}");
    }
    assert!(dir.list().unwrap().is_empty());
}

#[test]
fn a_failed_fsync_fails_the_append_and_every_later_one() {
    let faulty = FaultyDir::new(Arc::new(MemDir::new()));
    let faults = faulty.faults();
    let (log, _) = Log::open(Arc::new(faulty), small(), OpenOptions::default()).unwrap();
    log.append(&[(K, b"ok")]).unwrap();
    faults.fail_sync_after(0);
    let err = log.append(&[(K, b"lost")]).unwrap_err();
    assert!(matches!(err, LogError::Failed { .. }), "{err}");
    // Never retried: the next append fails at once even though a retried fsync might "succeed".
    let ops = faults.ops();
    assert!(matches!(log.append(&[(K, b"later")]), Err(LogError::Failed { .. })));
    assert_eq!(faults.ops(), ops, "no I/O after the failure");
    assert!(log.close().is_err());
}

#[test]
fn a_torn_write_fails_the_append_and_reopening_cuts_it_off() {
    let mem = MemDir::new();
    let faulty = FaultyDir::new(Arc::new(mem.clone()));
    let faults = faulty.faults();
    let (log, _) = Log::open(Arc::new(faulty), small(), OpenOptions::default()).unwrap();
    let kept = log.append(&[(K, b"durable")]).unwrap()[0];
    faults.tear_write_after(0);
    assert!(log.append(&[(K, &[7; 500])]).is_err());
    drop(log);
    let (log, report) = Log::open(Arc::new(mem.clone()), small(), OpenOptions::default()).unwrap();
    assert_eq!(report.torn_tail.map(|(at, _)| at), Some(kept.end()));
    assert_eq!(log.read(kept).unwrap(), b"durable");
    assert_eq!(log.end_position(), kept.end());
}

#[test]
fn submit_reports_durability_through_the_callback_in_order() {
    let dir = MemDir::new();
    let log = open(&dir, small());
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..50u8 {
        let tx = tx.clone();
        log.submit(vec![(K, vec![i; 10])], move |r| tx.send((i, r)).unwrap()).unwrap();
    }
    drop(tx);
    let results: Vec<_> = rx.iter().collect();
    assert_eq!(results.len(), 50);
    let mut last = 0;
    for (i, r) in results {
        let loc = r.unwrap()[0];
        assert!(loc.position > last, "appended in submission order");
        last = loc.position;
        assert_eq!(log.read(loc).unwrap(), vec![i; 10]);
    }
}

#[test]
fn counters_add_up() {
    let dir = MemDir::new();
    let log = open(&dir, small());
    for _ in 0..10 {
        log.append(&[(K, &[1; 100]), (K, &[2; 50])]).unwrap();
    }
    let s = log.stats();
    assert_eq!(s.records, 20);
    assert_eq!(s.payload_bytes, 1500);
    assert_eq!(s.writes, 10);
    let segment_header = SEGMENT_HEADER_LEN as u64; // written when the log was created
    assert_eq!(s.bytes_written, segment_header + 1500 + 20 * RECORD_HEADER_LEN as u64);
    assert_eq!(s.bytes_synced, s.bytes_written);
    assert!(s.fsyncs >= 10);
    assert_eq!(s.fsync_buckets.iter().sum::<u64>(), s.fsyncs);
}

#[test]
fn a_panicking_completion_does_not_stop_the_log() {
    let dir = MemDir::new();
    let log = open(&dir, small());
    log.submit(vec![(K, b"one".to_vec())], |_| panic!("caller bug in a completion")).unwrap();
    let loc = log.append(&[(K, b"two")]).expect("the writer survives a panicking completion");
    assert_eq!(log.read(loc[0]).unwrap(), b"two");
}

#[test]
fn a_failed_directory_sync_while_reclaiming_stops_appends() {
    let faulty = FaultyDir::new(Arc::new(MemDir::new()));
    let faults = faulty.faults();
    let (log, _) = Log::open(Arc::new(faulty), small(), OpenOptions::default()).unwrap();
    let locs: Vec<_> = (0..40u8).map(|i| log.append(&[(K, &[i; 300])]).unwrap()[0]).collect();
    faults.fail_sync_after(0);
    let err = log.reclaim_below(locs[39].position).unwrap_err();
    assert!(matches!(err, LogError::Io { .. }), "{err}");
    // No later append may sync the directory (a segment roll would) and pass for a retry.
    let ops = faults.ops();
    assert!(matches!(log.append(&[(K, b"after")]), Err(LogError::Failed { .. })));
    assert_eq!(faults.ops(), ops, "no I/O after the failure");
    assert_eq!(log.read(locs[39]).unwrap(), vec![39u8; 300], "reads still work");
}

#[test]
fn a_failed_directory_sync_while_deleting_kept_files_stops_appends() {
    let faulty = FaultyDir::new(Arc::new(MemDir::new()));
    let faults = faulty.faults();
    let (log, _) = Log::open(Arc::new(faulty), small(), OpenOptions::default()).unwrap();
    let locs: Vec<_> = (0..40u8).map(|i| log.append(&[(K, &[i; 300])]).unwrap()[0]).collect();
    log.reclaim_below(locs[30].position).unwrap();
    assert!(log.free_files() > 0);
    faults.fail_sync_after(0);
    assert!(matches!(log.set_recycling(false), Err(LogError::Io { .. })));
    let ops = faults.ops();
    assert!(matches!(log.append(&[(K, b"after")]), Err(LogError::Failed { .. })));
    assert_eq!(faults.ops(), ops, "no I/O after the failure");
}

#[test]
fn a_segment_whose_file_cannot_be_renamed_stays_in_the_log() {
    let dir = MemDir::new();
    let log = open(&dir, small());
    let locs: Vec<_> = (0..40u8).map(|i| log.append(&[(K, &[i; 300])]).unwrap()[0]).collect();
    let first = log.segments()[0];
    // A stray file under the first segment's free name makes the rename fail.
    dir.create(&onekv_log::segment::free_file_name(first.base)).unwrap();
    dir.sync().unwrap();
    assert!(matches!(log.reclaim_below(locs[39].position), Err(LogError::Io { .. })));
    assert_eq!(log.segments()[0], first, "the segment is still the log's first");
    assert_eq!(log.read(locs[0]).unwrap(), vec![0u8; 300]);
    let next = log.append(&[(K, b"after")]).unwrap()[0];
    drop(log);
    // No hole: the log opens (the stray file is kept as a free one) with every record.
    let log = open(&dir, small());
    assert_eq!(log.first_position(), first.base);
    assert_eq!(log.read(next).unwrap(), b"after");
    assert_eq!(log.verify().unwrap(), 41);
}
