//! The YCSB core workloads: Load and A–F, as operation mixes over a request distribution.
//!
//! Owns: which operation comes next and which record it touches (per client task, from its own
//! RNG), and the shared count of records that exist (grown by inserts). Does not own: executing
//! operations (`target`), timing them (`runner`).

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::generator::{Latest, ScrambledZipfian, uniform};

/// The operation types YCSB's core workload issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpType {
    /// Read one record.
    Read,
    /// Overwrite an existing record.
    Update,
    /// Write a new record.
    Insert,
    /// Read a range of records from a key on.
    Scan,
    /// Read a record, then write it back changed.
    ReadModifyWrite,
}

impl OpType {
    /// Every type, in the order tables list them.
    pub const ALL: [OpType; 5] =
        [OpType::Read, OpType::Update, OpType::Insert, OpType::Scan, OpType::ReadModifyWrite];

    /// The name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            OpType::Read => "read",
            OpType::Update => "update",
            OpType::Insert => "insert",
            OpType::Scan => "scan",
            OpType::ReadModifyWrite => "read_modify_write",
        }
    }

    /// Position in [`OpType::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for OpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a workload picks the record an operation touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Distribution {
    /// Every existing record equally likely.
    Uniform,
    /// YCSB's scrambled zipfian (constant 0.99): a few hot records scattered over the key space.
    Zipfian,
    /// The newest records are the hottest.
    Latest,
}

/// One of YCSB's core workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadKind {
    /// Inserts every record once (`--records` of them), in parallel.
    Load,
    /// Update heavy: 50% read, 50% update, zipfian.
    A,
    /// Read mostly: 95% read, 5% update, zipfian.
    B,
    /// Read only: 100% read, zipfian.
    C,
    /// Read latest: 95% read, 5% insert, latest.
    D,
    /// Short ranges: 95% scan (length uniform in 1..=100), 5% insert, zipfian.
    E,
    /// Read-modify-write: 50% read, 50% read-modify-write, zipfian.
    F,
    /// Not one of YCSB's: write only, 100% update, uniform. Endless overwrites of the loaded
    /// records, the case that needs the log garbage collector.
    W,
}

impl WorkloadKind {
    /// Every workload, Load first.
    pub const ALL: [WorkloadKind; 8] = [
        WorkloadKind::Load,
        WorkloadKind::A,
        WorkloadKind::B,
        WorkloadKind::C,
        WorkloadKind::D,
        WorkloadKind::E,
        WorkloadKind::F,
        WorkloadKind::W,
    ];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Load => "load",
            WorkloadKind::A => "a",
            WorkloadKind::B => "b",
            WorkloadKind::C => "c",
            WorkloadKind::D => "d",
            WorkloadKind::E => "e",
            WorkloadKind::F => "f",
            WorkloadKind::W => "w",
        }
    }

    /// The operation mix and distribution of this workload (YCSB's `workloads/workloada`..`f`).
    pub fn spec(self) -> WorkloadSpec {
        let mix = |read, update, insert, scan, read_modify_write| Mix {
            read,
            update,
            insert,
            scan,
            read_modify_write,
        };
        let (mix, distribution) = match self {
            WorkloadKind::Load => (mix(0.0, 0.0, 1.0, 0.0, 0.0), Distribution::Uniform),
            WorkloadKind::A => (mix(0.5, 0.5, 0.0, 0.0, 0.0), Distribution::Zipfian),
            WorkloadKind::B => (mix(0.95, 0.05, 0.0, 0.0, 0.0), Distribution::Zipfian),
            WorkloadKind::C => (mix(1.0, 0.0, 0.0, 0.0, 0.0), Distribution::Zipfian),
            WorkloadKind::D => (mix(0.95, 0.0, 0.05, 0.0, 0.0), Distribution::Latest),
            WorkloadKind::E => (mix(0.0, 0.0, 0.05, 0.95, 0.0), Distribution::Zipfian),
            WorkloadKind::F => (mix(0.5, 0.0, 0.0, 0.0, 0.5), Distribution::Zipfian),
            WorkloadKind::W => (mix(0.0, 1.0, 0.0, 0.0, 0.0), Distribution::Uniform),
        };
        WorkloadSpec { kind: self, mix, distribution, max_scan_length: 100 }
    }
}

impl fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WorkloadKind {
    type Err = String;

    fn from_str(text: &str) -> Result<WorkloadKind, String> {
        WorkloadKind::ALL
            .into_iter()
            .find(|kind| kind.name().eq_ignore_ascii_case(text))
            .ok_or_else(|| format!("unknown workload {text:?}; expected one of load, a, b, c, d, e, f, w"))
    }
}

/// The share of each operation type (they add up to 1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Mix {
    /// Share of reads.
    pub read: f64,
    /// Share of updates.
    pub update: f64,
    /// Share of inserts.
    pub insert: f64,
    /// Share of scans.
    pub scan: f64,
    /// Share of read-modify-writes.
    pub read_modify_write: f64,
}

impl Mix {
    /// The share of `op`.
    pub fn share(&self, op: OpType) -> f64 {
        match op {
            OpType::Read => self.read,
            OpType::Update => self.update,
            OpType::Insert => self.insert,
            OpType::Scan => self.scan,
            OpType::ReadModifyWrite => self.read_modify_write,
        }
    }

    /// Picks an operation type with these shares, from `u` uniform in `[0, 1)`.
    fn pick(&self, u: f64) -> OpType {
        let mut cumulative = 0.0;
        let mut last = OpType::Read;
        for op in OpType::ALL {
            let share = self.share(op);
            if share <= 0.0 {
                continue;
            }
            cumulative += share;
            last = op;
            if u < cumulative {
                return op;
            }
        }
        // Rounding left `u` just above the sum: the last type with a share takes it.
        last
    }
}

/// A workload: its mix, its request distribution and its scan lengths.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WorkloadSpec {
    /// Which core workload this is.
    pub kind: WorkloadKind,
    /// The operation mix.
    pub mix: Mix,
    /// How records are chosen for reads, updates, scans and read-modify-writes.
    pub distribution: Distribution,
    /// Scans read a uniform number of records in `1..=max_scan_length`.
    pub max_scan_length: u32,
}

/// One operation to issue: its type, the record it targets, and for scans how many records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    /// The operation type.
    pub op: OpType,
    /// The record ordinal (see `generator::record_key`).
    pub ordinal: u64,
    /// Records to scan (0 for other types).
    pub scan_length: u32,
}

/// The records that exist, shared by every client task: the initial `records`, plus inserts handed
/// out (`next_insert`) and acknowledged (`acknowledged`).
///
/// Departure from YCSB, on purpose: YCSB's `AcknowledgedCounterGenerator` exposes only the
/// contiguous prefix of acknowledged inserts; here `acknowledged` is the highest acknowledged
/// ordinal + 1, so a read may rarely target an insert still in flight (it then counts as not found,
/// never as an error). It avoids a shared window structure on the hot path.
#[derive(Debug)]
pub struct KeySpace {
    next_insert: AtomicU64,
    acknowledged: AtomicU64,
}

impl KeySpace {
    /// A key space holding records `0..records`; inserts continue from `records`.
    pub fn new(records: u64) -> KeySpace {
        KeySpace { next_insert: AtomicU64::new(records), acknowledged: AtomicU64::new(records) }
    }

    /// The ordinal for a new insert.
    pub fn next_insert(&self) -> u64 {
        self.next_insert.fetch_add(1, Ordering::Relaxed)
    }

    /// Records that insert `ordinal` was acknowledged.
    pub fn acknowledge(&self, ordinal: u64) {
        self.acknowledged.fetch_max(ordinal + 1, Ordering::Relaxed);
    }

    /// How many records reads may target: `0..count()`.
    pub fn count(&self) -> u64 {
        self.acknowledged.load(Ordering::Relaxed)
    }

    /// How many inserts were handed out beyond the initial records (acknowledged or not).
    pub fn inserted_since(&self, records: u64) -> u64 {
        self.next_insert.load(Ordering::Relaxed).saturating_sub(records)
    }
}

/// One client task's view of a workload: its own generators (no sharing on the hot path).
#[derive(Debug, Clone)]
pub struct OpChooser {
    spec: WorkloadSpec,
    scrambled: ScrambledZipfian,
    latest: Latest,
}

impl OpChooser {
    /// A chooser for `spec` over a key space that starts with `records` records.
    pub fn new(spec: WorkloadSpec, records: u64) -> OpChooser {
        OpChooser { spec, scrambled: ScrambledZipfian::new(), latest: Latest::new(records) }
    }

    /// The next operation. Inserts take a fresh ordinal from `keys`; the caller acknowledges it
    /// once the insert succeeded.
    pub fn next(&mut self, rng: &mut impl Rng, keys: &KeySpace) -> Op {
        let op = self.spec.mix.pick(rng.random());
        if op == OpType::Insert {
            return Op { op, ordinal: keys.next_insert(), scan_length: 0 };
        }
        let count = keys.count();
        let ordinal = match self.spec.distribution {
            Distribution::Uniform => uniform(rng, count),
            Distribution::Zipfian => self.scrambled.next(rng, count),
            Distribution::Latest => self.latest.next(rng, count),
        };
        let scan_length =
            if op == OpType::Scan { rng.random_range(1..=self.spec.max_scan_length.max(1)) } else { 0 };
        Op { op, ordinal, scan_length }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn mixes_add_up_and_parse() {
        for kind in WorkloadKind::ALL {
            let mix = kind.spec().mix;
            let total: f64 = OpType::ALL.iter().map(|&op| mix.share(op)).sum();
            assert!((total - 1.0).abs() < 1e-9, "{kind}: {total}");
            assert_eq!(kind.name().parse::<WorkloadKind>(), Ok(kind));
        }
        assert_eq!("A".parse::<WorkloadKind>(), Ok(WorkloadKind::A));
        assert!("g".parse::<WorkloadKind>().is_err());
    }

    /// Draws `draws` operations of `kind` over 1000 records; returns the count of each type.
    fn draw(kind: WorkloadKind, draws: usize) -> ([usize; 5], Vec<Op>) {
        let keys = KeySpace::new(1000);
        let mut chooser = OpChooser::new(kind.spec(), 1000);
        let mut rng = StdRng::seed_from_u64(11);
        let mut counts = [0; 5];
        let mut ops = Vec::new();
        for _ in 0..draws {
            let op = chooser.next(&mut rng, &keys);
            if op.op == OpType::Insert {
                keys.acknowledge(op.ordinal);
            }
            counts[op.op.index()] += 1;
            ops.push(op);
        }
        (counts, ops)
    }

    #[test]
    fn each_workload_issues_its_mix() {
        const DRAWS: usize = 40_000;
        for kind in WorkloadKind::ALL {
            let (counts, _) = draw(kind, DRAWS);
            let mix = kind.spec().mix;
            for op in OpType::ALL {
                let share = counts[op.index()] as f64 / DRAWS as f64;
                assert!((share - mix.share(op)).abs() < 0.01, "{kind} {op}: {share} vs {}", mix.share(op));
            }
        }
    }

    #[test]
    fn inserts_extend_the_key_space_and_reads_stay_inside_it() {
        let (_, ops) = draw(WorkloadKind::D, 20_000);
        let inserts: Vec<u64> =
            ops.iter().filter(|op| op.op == OpType::Insert).map(|op| op.ordinal).collect();
        // Fresh ordinals, consecutive from the initial record count.
        assert_eq!(inserts, (1000..1000 + inserts.len() as u64).collect::<Vec<_>>());
        let mut existing = 1000;
        for op in &ops {
            if op.op == OpType::Insert {
                existing = op.ordinal + 1;
            } else {
                assert!(op.ordinal < existing, "{op:?} beyond {existing}");
            }
        }
        // Workload D reads mostly what was inserted last.
        let reads: Vec<&Op> = ops.iter().filter(|op| op.op == OpType::Read).collect();
        let late = reads[reads.len() / 2..].iter().filter(|op| op.ordinal >= 1000).count();
        assert!(late * 2 > reads.len() / 2, "only {late} of the later reads hit inserted records");
    }

    #[test]
    fn scans_have_lengths_within_bounds() {
        let (_, ops) = draw(WorkloadKind::E, 10_000);
        let lengths: Vec<u32> =
            ops.iter().filter(|op| op.op == OpType::Scan).map(|op| op.scan_length).collect();
        assert!(lengths.iter().all(|&length| (1..=100).contains(&length)));
        assert!(lengths.contains(&1) && lengths.contains(&100));
        let mean = lengths.iter().map(|&l| f64::from(l)).sum::<f64>() / lengths.len() as f64;
        assert!((mean - 50.5).abs() < 2.0, "mean scan length {mean}");
    }

    #[test]
    fn a_key_space_acknowledges_the_highest_insert() {
        let keys = KeySpace::new(10);
        let first = keys.next_insert();
        let second = keys.next_insert();
        assert_eq!((first, second), (10, 11));
        assert_eq!(keys.count(), 10);
        keys.acknowledge(second);
        keys.acknowledge(first);
        assert_eq!(keys.count(), 12);
        assert_eq!(keys.inserted_since(10), 2);
    }
}
