//! Model-based crash testing: random appends, reclaims, failures and crashes against a model.
//!
//! The model is the list of records the log acknowledged (appends that returned `Ok`) plus the
//! records that were submitted but never acknowledged. After every crash and reopen:
//! - every acknowledged record not yet reclaimed is present, at its locator, byte-identical;
//! - every other record the log returns is one that was submitted (never garbage), and its
//!   position follows the acknowledged ones in submission order;
//! - the whole log verifies.
//!
//! Records that survive a crash without having been acknowledged are durable from then on (open
//! fsyncs them), so they join the acknowledged set and must survive the next crash too.
//!
//! Each seed is one independent run. `ONEKV_LOG_SEEDS=N` runs more seeds; `ONEKV_LOG_SEED=S`
//! replays one. A failure prints the seed.

use onekv_log::io::{CrashMode, FaultyDir, MemDir};
use onekv_log::{Locator, Log, LogConfig, OpenOptions, RecordKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::mpsc;

struct Model {
    /// Acknowledged (or recovered) records by locator: id and payload.
    durable: BTreeMap<Locator, (RecordKind, Vec<u8>)>,
    /// Submitted but not acknowledged since the last reopen, by id.
    unacked: HashMap<u64, (RecordKind, Vec<u8>)>,
    next_id: u64,
}

impl Model {
    fn record(&mut self, rng: &mut StdRng) -> (RecordKind, Vec<u8>) {
        let id = self.next_id;
        self.next_id += 1;
        let len = if rng.random_bool(0.1) { rng.random_range(400..1000) } else { rng.random_range(8..200) };
        let mut payload = id.to_le_bytes().to_vec();
        payload.resize(len, 0);
        rng.fill(&mut payload[8..]);
        let kind = RecordKind::new(rng.random_range(1..=255)).unwrap();
        self.unacked.insert(id, (kind, payload.clone()));
        (kind, payload)
    }

    fn acked(&mut self, loc: Locator, kind: RecordKind, payload: Vec<u8>) {
        let id = u64::from_le_bytes(payload[..8].try_into().unwrap());
        self.unacked.remove(&id);
        self.durable.insert(loc, (kind, payload));
    }
}

fn config(rng: &mut StdRng) -> LogConfig {
    LogConfig {
        segment_size_bytes: rng.random_range(4096..16384),
        max_record_bytes: 1000,
        max_write_bytes: rng.random_range(1..8192),
        max_queued_bytes: 64 << 10,
        // Reclaimed files reused as later segments, holding stale records after the new ones.
        recycled_segments: rng.random_range(0..=3),
    }
}

/// Submits `n` appends of 1–3 records each without waiting, then waits for all; returns how many
/// were acknowledged.
fn burst(log: &Log, model: &mut Model, rng: &mut StdRng, n: usize) -> usize {
    let (tx, rx) = mpsc::channel();
    for _ in 0..n {
        let records: Vec<_> = (0..rng.random_range(1..=3)).map(|_| model.record(rng)).collect();
        let tx = tx.clone();
        let sent = records.clone();
        if log.submit(records, move |r| tx.send((sent, r)).unwrap()).is_err() {
            break;
        }
    }
    drop(tx);
    let mut acked = 0;
    for (records, result) in rx {
        if let Ok(locs) = result {
            assert_eq!(locs.len(), records.len());
            for (loc, (kind, payload)) in locs.into_iter().zip(records) {
                model.acked(loc, kind, payload);
            }
            acked += 1;
        }
    }
    acked
}

/// Reopens after a crash and checks the log against the model.
fn check(seed: u64, mem: &MemDir, config: &LogConfig, model: &mut Model) -> Log {
    let (log, _report) = Log::open(Arc::new(mem.clone()), config.clone(), OpenOptions::default())
        .unwrap_or_else(|e| panic!("seed {seed}: reopen failed: {e}"));
    let first = log.first_position();
    model.durable.retain(|loc, _| loc.position >= first);
    let acked: Vec<Locator> = model.durable.keys().copied().collect();
    let mut seen = std::collections::BTreeSet::new();
    let mut last_unacked_id = None;
    for entry in log.iter_from(first) {
        let entry = entry.unwrap_or_else(|e| panic!("seed {seed}: iteration failed: {e}"));
        seen.insert(entry.locator);
        match model.durable.get(&entry.locator) {
            Some((kind, payload)) => {
                assert_eq!(
                    (entry.kind, &entry.payload),
                    (*kind, payload),
                    "seed {seed}: acked record changed"
                );
                assert_eq!(last_unacked_id, None, "seed {seed}: an acked record follows an unacked one");
            }
            None => {
                let id = u64::from_le_bytes(entry.payload[..8].try_into().expect("payload has an id"));
                let submitted = model.unacked.get(&id);
                assert_eq!(
                    submitted,
                    Some(&(entry.kind, entry.payload.clone())),
                    "seed {seed}: the log returned a record nobody submitted at {}",
                    entry.locator
                );
                assert!(last_unacked_id < Some(id), "seed {seed}: survivors out of submission order");
                last_unacked_id = Some(id);
                model.acked(entry.locator, entry.kind, entry.payload);
            }
        }
    }
    for loc in acked {
        assert!(seen.contains(&loc), "seed {seed}: acknowledged record at {loc} lost");
    }
    for (loc, (_, payload)) in &model.durable {
        assert_eq!(&log.read(*loc).unwrap(), payload, "seed {seed}: targeted read differs");
    }
    model.unacked.clear();
    log
}

fn run(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mem = MemDir::new();
    let config = config(&mut rng);
    let mut model = Model { durable: BTreeMap::new(), unacked: HashMap::new(), next_id: 0 };
    let faulty = FaultyDir::new(Arc::new(mem.clone()));
    let mut faults = faulty.faults();
    let mut log = Log::open(Arc::new(faulty), config.clone(), OpenOptions::default()).unwrap().0;
    for step in 0..60 {
        match rng.random_range(0..10) {
            0..=3 => {
                let records: Vec<_> = (0..rng.random_range(1..=4)).map(|_| model.record(&mut rng)).collect();
                let borrowed: Vec<_> = records.iter().map(|(k, p)| (*k, p.as_slice())).collect();
                let locs = log.append(&borrowed).unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
                for (loc, (kind, payload)) in locs.into_iter().zip(records) {
                    model.acked(loc, kind, payload);
                }
            }
            4..=5 => {
                let n = rng.random_range(2..10);
                assert_eq!(burst(&log, &mut model, &mut rng, n), n, "seed {seed} step {step}");
            }
            6 if rng.random_bool(0.2) => {
                // A disk-full alarm raised or cleared: kept files deleted, or kept again.
                log.set_recycling(rng.random_bool(0.5)).unwrap();
            }
            6 => {
                if let Some(loc) = model.durable.keys().nth(rng.random_range(0..model.durable.len().max(1))) {
                    log.reclaim_below(loc.position).unwrap();
                }
            }
            _ => {
                // A crash: the process dies after a few more I/O operations (or an fsync fails
                // first), with appends in flight; then power is lost.
                if rng.random_bool(0.3) {
                    faults.fail_sync_after(rng.random_range(0..3));
                } else {
                    faults.kill_after(rng.random_range(0..12));
                }
                let n = rng.random_range(1..8);
                burst(&log, &mut model, &mut rng, n);
                drop(log);
                let mode = [CrashMode::LoseUnsynced, CrashMode::TornPrefix, CrashMode::ScrambleSectors]
                    [rng.random_range(0..3)];
                mem.crash(mode, rng.random());
                check(seed, &mem, &config, &mut model).close().unwrap();
                let faulty = FaultyDir::new(Arc::new(mem.clone()));
                faults = faulty.faults();
                log = Log::open(Arc::new(faulty), config.clone(), OpenOptions::default()).unwrap().0;
            }
        }
    }
    log.close().unwrap();
    mem.crash(CrashMode::LoseUnsynced, 0);
    check(seed, &mem, &config, &mut model).close().unwrap();
}

#[test]
fn crashes_lose_nothing_acknowledged_and_return_no_garbage() {
    if let Ok(seed) = std::env::var("ONEKV_LOG_SEED") {
        run(seed.parse().expect("ONEKV_LOG_SEED is a number"));
        return;
    }
    let seeds: u64 = std::env::var("ONEKV_LOG_SEEDS").map_or(300, |s| s.parse().expect("a number"));
    for seed in 0..seeds {
        run(seed);
    }
}
