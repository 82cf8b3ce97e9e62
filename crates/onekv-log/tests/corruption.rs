//! Damage at rest: every flipped byte is detected (never a panic, never silently accepted), and
//! recovery tells a torn last write (cut off) from damage to records that were durable (refused,
//! with the position, until the caller asks to truncate there).

use onekv_log::io::{Dir, MemDir};
use onekv_log::segment::parse_file_name;
use onekv_log::{Log, LogConfig, LogError, OpenOptions, RECORD_HEADER_LEN, RecordKind};
use std::sync::Arc;

const K: RecordKind = RecordKind::new(3).unwrap();

fn config() -> LogConfig {
    LogConfig { segment_size_bytes: 4096, max_record_bytes: 1000, ..LogConfig::default() }
}

/// A log of several segments written one record per append; returns the payload locators.
fn build(dir: &MemDir) -> Vec<onekv_log::Locator> {
    let (log, _) = Log::open(Arc::new(dir.clone()), config(), OpenOptions::default()).unwrap();
    let locs =
        (0..100u32).map(|i| log.append(&[(K, &vec![i as u8; 150 + i as usize % 50])]).unwrap()[0]).collect();
    log.close().unwrap();
    locs
}

fn segment_names(dir: &MemDir) -> Vec<String> {
    let mut names: Vec<_> =
        dir.list().unwrap().into_iter().filter(|n| parse_file_name(n).is_some()).collect();
    names.sort();
    names
}

fn open_and_verify(dir: &MemDir) -> Result<u64, LogError> {
    let (log, _) = Log::open(Arc::new(dir.clone()), config(), OpenOptions::default())?;
    log.verify()
}

#[test]
fn every_byte_flip_in_a_sealed_segment_is_detected() {
    let pristine = MemDir::new();
    build(&pristine);
    let names = segment_names(&pristine);
    assert!(names.len() >= 3);
    let total = open_and_verify(&pristine).unwrap();
    for name in &names[..names.len() - 1] {
        let original = pristine.read_file(name).unwrap();
        for i in 0..original.len() {
            {
                let mask = if i % 2 == 0 { 0x01u8 } else { 0x80 };
                let dir = MemDir::new();
                for n in &names {
                    dir.write_file(n, pristine.read_file(n).unwrap());
                }
                let mut bytes = original.clone();
                bytes[i] ^= mask;
                dir.write_file(name, bytes);
                match open_and_verify(&dir) {
                    Err(LogError::Corruption { .. } | LogError::UnsupportedFormat { .. }) => {}
                    Ok(n) => panic!("flip of byte {i} in {name} undetected ({n} of {total} records)"),
                    Err(e) => panic!("flip of byte {i} in {name}: unexpected error {e}"),
                }
            }
        }
    }
}

#[test]
fn damage_before_a_later_write_in_the_last_segment_is_corruption_until_truncated() {
    let dir = MemDir::new();
    let locs = build(&dir);
    let last = segment_names(&dir).pop().unwrap();
    let base = parse_file_name(&last).unwrap();
    let in_last: Vec<_> = locs.iter().filter(|l| l.position > base).copied().collect();
    assert!(in_last.len() >= 3, "the last segment holds several writes");
    let victim = in_last[1];
    let record_start = victim.position - RECORD_HEADER_LEN as u64;
    let mut bytes = dir.read_file(&last).unwrap();
    bytes[(victim.position - base) as usize + 5] ^= 0xff;
    dir.write_file(&last, bytes);

    let err = Log::open(Arc::new(dir.clone()), config(), OpenOptions::default()).unwrap_err();
    match err {
        LogError::Corruption { position, ref segment, .. } => {
            assert_eq!((position, segment.as_str()), (record_start, last.as_str()), "{err}")
        }
        other => panic!("expected corruption, got {other}"),
    }

    let repair = OpenOptions { truncate_at: Some(record_start) };
    let (log, report) = Log::open(Arc::new(dir.clone()), config(), repair).unwrap();
    assert!(report.truncated_bytes > 0);
    assert_eq!(log.end_position(), record_start);
    for loc in locs.iter().filter(|l| l.position < record_start) {
        assert!(log.read(*loc).is_ok());
    }
    assert_eq!(log.verify().unwrap() as usize, locs.iter().filter(|l| l.position < record_start).count());
}

#[test]
fn damage_in_the_last_write_is_a_torn_tail_and_cut_off() {
    let dir = MemDir::new();
    let locs = build(&dir);
    let last_name = segment_names(&dir).pop().unwrap();
    let base = parse_file_name(&last_name).unwrap();
    let last = *locs.last().unwrap();
    let mut bytes = dir.read_file(&last_name).unwrap();
    bytes[(last.position - base) as usize + 3] ^= 0x10;
    dir.write_file(&last_name, bytes);
    let (log, report) = Log::open(Arc::new(dir.clone()), config(), OpenOptions::default()).unwrap();
    assert_eq!(report.torn_tail.map(|(at, _)| at), Some(last.position - RECORD_HEADER_LEN as u64));
    assert_eq!(log.verify().unwrap(), locs.len() as u64 - 1);
}

#[test]
fn a_missing_middle_segment_is_corruption() {
    let dir = MemDir::new();
    build(&dir);
    let names = segment_names(&dir);
    dir.remove(&names[1]).unwrap();
    dir.sync().unwrap();
    let err = Log::open(Arc::new(dir.clone()), config(), OpenOptions::default()).unwrap_err();
    assert!(matches!(err, LogError::Corruption { .. }), "{err}");
}

#[test]
fn a_segment_from_a_newer_format_is_refused_by_name() {
    let dir = MemDir::new();
    build(&dir);
    let first = segment_names(&dir).remove(0);
    let mut bytes = dir.read_file(&first).unwrap();
    bytes[4] = 3; // version 3
    let crc = crc32c::crc32c(&bytes[..28]);
    bytes[28..32].copy_from_slice(&crc.to_le_bytes());
    dir.write_file(&first, bytes);
    let err = Log::open(Arc::new(dir.clone()), config(), OpenOptions::default()).unwrap_err();
    assert!(matches!(err, LogError::UnsupportedFormat { version: 3, .. }), "{err}");
}

mod arbitrary_bytes {
    use super::*;
    use onekv_log::record::Place;
    use onekv_log::segment::{encode_header, file_name, salt_for};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The same property as the `log_open` fuzz target, run on every `cargo test`.
        #[test]
        fn opening_arbitrary_segment_bytes_never_panics(
            garbage in proptest::collection::vec(any::<u8>(), 0..2048),
            with_header in any::<bool>(),
            valid_prefix in 0usize..6,
        ) {
            let dir = MemDir::new();
            let mut bytes = if with_header { encode_header(0).to_vec() } else { Vec::new() };
            if with_header {
                // Some real records first, so damage can land after valid data.
                let mut out = Vec::new();
                for i in 0..valid_prefix {
                    let position = (bytes.len() + out.len()) as u64;
                    let at = Place { position, salt: salt_for(0) };
                    onekv_log::record::encode(&mut out, at, 0, K, &[i as u8; 40]);
                }
                bytes.extend_from_slice(&out);
            }
            bytes.extend_from_slice(&garbage);
            dir.write_file(&file_name(0), bytes);
            if let Ok((log, _)) = Log::open(Arc::new(dir), config(), OpenOptions::default()) {
                let records = log.verify().expect("an opened log verifies");
                if with_header {
                    prop_assert!(records >= valid_prefix as u64, "valid records before the damage are kept");
                }
                prop_assert!(log.append(&[(K, b"after")]).is_ok());
            }
        }
    }
}

#[test]
fn a_record_claiming_its_write_began_before_its_segment_is_no_evidence() {
    // Regression: the tail scan computed `offset - batch_offset` and underflowed for a checksum-valid
    // record whose batch offset reaches before the segment (possible only for crafted bytes, and a
    // segment with a base above 0, as after reclamation).
    use onekv_log::record::Place;
    use onekv_log::segment::{encode_header, file_name, salt_for};
    let base = 8192;
    let mut bytes = encode_header(base).to_vec();
    bytes.extend_from_slice(&[0xAB; 30]);
    let q = bytes.len() as u64;
    onekv_log::record::encode(
        &mut bytes,
        Place { position: base + q, salt: salt_for(base) },
        5000,
        K,
        b"crafted",
    );
    let dir = MemDir::new();
    dir.write_file(&file_name(base), bytes);
    let (log, report) = Log::open(Arc::new(dir), config(), OpenOptions::default()).unwrap();
    assert_eq!(report.torn_tail.map(|(at, _)| at), Some(base + 32));
    assert_eq!(log.verify().unwrap(), 0);
}
