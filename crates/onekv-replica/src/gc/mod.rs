//! The log garbage collector (XLL §4.2.3): bounded disk in `onelog` mode, where values live inside
//! the Raft entries of the node's one log and nothing else would ever free them.
//!
//! One collector per node, on a thread of its own over the shared log (in a simulation, between
//! the node's turns on the driving thread: `link`). The log is reclaimed from
//! its oldest end (a prefix of whole segments: `Log::reclaim_below`), so no hole ever appears in
//! the log's address space and recovery's contiguity checks stay as they are. Each round:
//!
//! 1. **Census.** Every shard's index is walked (keys and locators only, at a bounded rate) and the
//!    bytes moving each live value would write (key and stored value, a packed value's share of
//!    its compressed block) are summed per segment: the live bytes, and log bytes ÷ live is the space
//!    amplification (segments begun during the walk count as wholly live). For the oldest sealed
//!    segments it also keeps the keys that point into them (up to a bound): those are all of their
//!    live values, since no key gains a locator into a sealed segment once the loop turn that
//!    appended into it has ended (separated mode: the census waits for the turns under way,
//!    `Link::barrier`) or, in onelog mode, once the entries in it are applied (only segments below
//!    the persistence point as the census begins are collected). A snapshot install is the
//!    exception (its keys point at chunks, or copies, written before it ends): a pass whose census
//!    an install overlapped collects nothing.
//! 2. **Decide.** Only when that exceeds `target_space_amp` is the oldest segment collected. It must
//!    lie wholly below the node's **persistence point** (the lowest recovery point of all shards:
//!    recovery never reads below it, and every Raft entry below it is below its shard's Raft log
//!    compaction point, so no follower is served from it either). Shards whose recovery point still
//!    falls inside it are asked to flush (an idle shard also lets Raft forget every applied entry its
//!    followers have, so its recovery point can move at all).
//! 3. **Relocate.** The chosen segments' live values (read by locator when the census kept their
//!    keys, else found by reading the whole segment and looking each value up) are appended at the
//!    log's head as RELOCATED
//!    records (durable before anything else changes), then the loop points each key at its new copy
//!    if the key still points at the old one ([`crate::group::Group::relocate`], at a sequence number
//!    no replay or later write can collide with: `state::relocation_seqno`) and publishes.
//! 4. **Reclaim.** Every shard flushes past this point
//!    (a value judged dead from the index in memory must stay dead after a crash: the write that
//!    killed it must be durable too); once those flushes are durable and every reader that might
//!    still hold an old locator is done (`pins`), the segment file is deleted.
//!
//! A crash anywhere loses nothing: before the flush, the trees on disk still point at the old
//! segment, which still exists; after it, they point at the RELOCATED records, which were durable
//! first. Crash points ([`GcPoint`]): `gc-after-relocate-append`, `gc-after-index-update`,
//! `gc-before-reclaim`, `gc-after-reclaim` (feature `failpoints`; the simulation's crash hook).
//!
//! In `separated` mode the same rounds run over the value log, where the locators point (recovery
//! replays the Raft log and copies its values again, so the persistence point does not bound the
//! value log). Its VALUE records do not name their keys, so only segments whose live keys the
//! census kept are collected (the oldest ones, up to [`MAX_KEPT_KEYS`] keys). In `separated` and
//! `classic` mode no locator points into the Raft log: it is reclaimed below the persistence point
//! without relocation. Classic's data WAL is reclaimed below the position it had when every write
//! before it was already in a durable table.
//!
//! With deduplication on (`dedup`), keys may share a copy ([`IndexValue::Shared`]): a segment
//! a shared locator points into is collected only from the census's kept keys (its records do not
//! name every key pointing at it; past the bound its shared keys are moved out first), a pass
//! raises the deduplication fence over what it collects, and it gives up segments a reference was
//! made into during its census (`Collector::fence_off`). Moving values keeps keys that shared a
//! copy sharing one, and in `offline`/`elastic` mode merges moved values with identical copies.
//!
//! What this module does not own: the index updates themselves (the loop's, in `group`), when
//! trees flush (the loop's), the log's files (`onekv-log`).

mod batch;
mod link;
mod values;

pub(crate) use link::{Gc, InlineGc, Link, take_late_references};

use crate::StorageMode;
use crate::dedup::Dedup;
use crate::pins::ReadPins;
use crate::records;
use crate::state::{HostedStates, State};
use crate::{codec, packed};
use batch::Batch;
use onekv_index::IndexValue;
use onekv_log::{Locator, Log, SegmentInfo};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use values::{ValueInRecord, packed_values_in_record, values_in_record};

/// Keys read per page of the census's walk of a shard's index (one consistent view each).
const CENSUS_PAGE: usize = 1024;

/// What one key costs the census against the rate limit, beyond its key and index value bytes.
const CENSUS_KEY_COST: u64 = 32;

/// Most keys the census keeps for the segments it may collect next (about 100 bytes each).
pub(crate) const MAX_KEPT_KEYS: usize = 1 << 20;

/// Most segments one pass collects (one flush of their shards covers them all).
const MAX_SEGMENTS_PER_PASS: usize = 8;

/// Passes per round at most (each takes a census, collects, and waits for a flush).
const PASSES_PER_ROUND: usize = 4;
/// Times a pass moves the late references into its segments before it gives up on them.
const LATE_REFERENCE_ROUNDS: usize = 3;

/// How long the collector waits for the loop to answer, for a flush covering its relocations, or
/// for readers of old locators, before it gives the round up (and tries again next round).
pub(crate) const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// Settings of the log garbage collector.
#[derive(Clone, Debug, PartialEq)]
pub struct GcConfig {
    /// Whether the collector runs. Off, the log grows without bound (for comparisons).
    pub enabled: bool,
    /// The collector reclaims while the log holds more than this many times its live bytes.
    /// At least 1.1.
    pub target_space_amp: f64,
    /// Bytes per second the collector reads and writes (census scans and relocations together),
    /// so it takes a bounded share of the disk from foreground writes. 0: unlimited.
    pub bytes_per_sec: u64,
    /// Pause between rounds.
    pub interval: Duration,
    /// Values smaller than this many bytes are moved into LZ4-compressed blocks of several values
    /// (`packed`); larger ones are moved as they are. 0: nothing is compressed.
    pub compress_below: u64,
}

impl Default for GcConfig {
    fn default() -> Self {
        GcConfig {
            enabled: true,
            target_space_amp: 1.5,
            bytes_per_sec: 64 << 20,
            interval: Duration::from_secs(1),
            compress_below: 4 << 10,
        }
    }
}

impl GcConfig {
    /// The smallest `target_space_amp` accepted: below it the collector would rewrite live data
    /// over and over for almost nothing.
    pub const MIN_TARGET_SPACE_AMP: f64 = 1.1;

    /// Checks the values; an error names the first one that is off.
    pub fn validate(&self) -> Result<(), String> {
        if !self.target_space_amp.is_finite() || self.target_space_amp < Self::MIN_TARGET_SPACE_AMP {
            return Err(format!(
                "gc target_space_amp = {} must be at least {}",
                self.target_space_amp,
                Self::MIN_TARGET_SPACE_AMP
            ));
        }
        if self.interval.is_zero() {
            return Err("gc interval must be positive".into());
        }
        if self.compress_below > crate::packed::MAX_COMPRESS_BELOW {
            return Err(format!(
                "gc compress_below = {} must be at most {}",
                self.compress_below,
                crate::packed::MAX_COMPRESS_BELOW
            ));
        }
        Ok(())
    }
}

/// What the collector has done since the node started (node-wide; every shard's status carries
/// the same copy).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GcStatus {
    /// Whether the collector runs on this node.
    pub enabled: bool,
    /// Bytes in the log's segment files at the last round.
    pub log_bytes: u64,
    /// Estimated live bytes in the log: for every value some key points at, its key and stored
    /// bytes (a packed value's at the compression ratio seen so far); segments begun since the
    /// last census count as wholly live.
    pub live_bytes: u64,
    /// `log_bytes / live_bytes` at the last round (1 when the log is empty).
    pub space_amp: f64,
    /// Rounds run.
    pub rounds: u64,
    /// Bytes of log segments read to find the values to move.
    pub bytes_scanned: u64,
    /// Values moved to the log's head, and their bytes.
    pub values_relocated: u64,
    /// Bytes of values moved (with their checksums).
    pub bytes_relocated: u64,
    /// Values moved into compressed blocks (counted in `values_relocated` too).
    pub values_packed: u64,
    /// Bytes of the pairs (keys and stored values) put into compressed blocks.
    pub packed_raw_bytes: u64,
    /// Bytes those blocks take in the log (frames included).
    pub packed_bytes: u64,
    /// Segment files deleted, and their bytes.
    pub segments_reclaimed: u64,
    /// Bytes of the segment files deleted.
    pub bytes_reclaimed: u64,
    /// Milliseconds spent in rounds.
    pub busy_ms: u64,
    /// What the collector is waiting for, when it cannot reclaim (e.g. a shard's flush).
    pub waiting: Option<String>,
    /// The last round's error, if it failed (the next round tries again).
    pub last_error: Option<String>,
}

/// A value to move: `key` of the group's shard points at `from` and should point at `to`.
pub(crate) struct Move {
    pub key: Vec<u8>,
    pub from: IndexValue,
    pub to: IndexValue,
}

/// What the loop did with a batch of [`Move`]s.
#[derive(Debug)]
pub(crate) struct Relocated {
    /// Keys now pointing at their new copies.
    pub moved: usize,
    /// Keys still pointing at their old copies (the loop could not move them now).
    pub left: usize,
}

/// Where a crash may stop the collector, between its durable steps (real processes: the
/// `failpoints` of the same names; a simulation: its crash hook, as [`crate::CrashPoint`]s).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GcPoint {
    /// The relocated copies are durable; no key points at them yet.
    AfterRelocateAppend,
    /// Keys point at the copies in memory; the flush that makes it durable has not run.
    AfterIndexUpdate,
    /// The flush is durable; the old segment is not deleted yet.
    BeforeReclaim,
    /// The old segment is deleted.
    AfterReclaim,
}

impl GcPoint {
    /// The failpoint of this step.
    pub fn failpoint(self) -> &'static str {
        match self {
            GcPoint::AfterRelocateAppend => "gc-after-relocate-append",
            GcPoint::AfterIndexUpdate => "gc-after-index-update",
            GcPoint::BeforeReclaim => "gc-before-reclaim",
            GcPoint::AfterReclaim => "gc-after-reclaim",
        }
    }
}

/// Requests from the collector to the node loop.
pub(crate) enum GcInput {
    /// Point keys at relocated copies (only those still pointing at the old ones).
    Relocate { shard: u64, moves: Vec<Move>, done: SyncSender<Result<Relocated, String>> },
    /// Flush these shards' trees soon, letting Raft forget every entry it can, so their recovery
    /// points move up.
    Flush { shards: Vec<u64> },
    /// Answer once every turn begun before this arrived has ended (deduplication's fence).
    Barrier { done: SyncSender<()> },
    /// Take the late references into these log positions (between two turns: each one made is
    /// published and listed).
    TakeLateReferences { range: std::ops::Range<u64>, done: SyncSender<link::LateReferences> },
}

/// Why a round ended early.
pub(crate) enum RoundError {
    /// The collector was asked to stop (or, in a simulation, the node crashed).
    Stopped,
    Failed(String),
}

impl From<String> for RoundError {
    fn from(error: String) -> Self {
        RoundError::Failed(error)
    }
}

/// A value to move with its number among a relocation's copies.
type Numbered = (usize, LiveValue);

/// The values of numbered values.
fn values_of(list: &[Numbered]) -> Vec<&LiveValue> {
    list.iter().map(|(_, value)| value).collect()
}

/// Places several keys point at, in the segment being collected, and where each was moved to.
struct Sharing {
    repeated: std::collections::HashSet<Locator>,
    moved: HashMap<Locator, Locator>,
}

/// A value in the log with its key: one some key still points at, once the collector checked.
struct LiveValue {
    shard: u64,
    key: Vec<u8>,
    /// Where it is now (a locator, or a place in a compressed block).
    at: IndexValue,
    /// Its stored bytes (checksum and value), shared by the keys of one shared copy.
    stored: Arc<[u8]>,
}

/// The last census: live bytes per segment, from one walk of every shard's index.
#[derive(Default)]
struct Census {
    /// Segment base -> bytes of the values keys pointed at in it during the walk.
    live: BTreeMap<u64, u64>,
    /// The log's end when the walk started: segments from there on count as wholly live.
    end: u64,
    /// For the oldest sealed segments (whole lists only), every key that pointed into each during
    /// the walk: all of its live values, since no key gains a locator into a sealed segment once
    /// what was appended into it is applied (see the module documentation; a snapshot install
    /// does, so a census it overlapped is not acted on: `installs`).
    keys: BTreeMap<u64, Vec<LiveKey>>,
    /// Each shard's `State::installs` before the walk. A snapshot install is the one writer that
    /// points keys into sealed segments (after the walk may have counted them dead), so a census
    /// that an install overlapped is not acted on ([`Census::overlapped_an_install`]).
    installs: BTreeMap<u64, u64>,
    /// Segments some deduplicated key points into ([`IndexValue::Shared`]): their records do not
    /// name every key pointing at them, so they are collected only from the keys the census kept.
    shared: BTreeSet<u64>,
}

impl Census {
    /// A shard whose snapshot install ran, or runs, since the census began (one under way now, or
    /// begun or ended since), given each shard's `State::installs` now.
    fn overlapped_an_install(&self, now: impl IntoIterator<Item = (u64, u64)>) -> Option<u64> {
        now.into_iter().find_map(|(shard, installs)| {
            let before = self.installs.get(&shard).copied().unwrap_or(0);
            (installs % 2 == 1 || installs != before).then_some(shard)
        })
    }
}

/// A key the census found pointing into a segment.
struct LiveKey {
    shard: u64,
    key: Vec<u8>,
    at: IndexValue,
    /// The log bytes `at` occupies (its block's, for a packed value).
    bytes: Locator,
}

/// A replica's state and the highest seqno its tree had written when a data-WAL checkpoint was
/// taken (classic mode); weak, so a removed replica's trees are not kept alive by it.
type TreeMark = (std::sync::Weak<State>, u64);

/// The collector's state between rounds; each round reaches the node loop through a [`Link`].
pub(crate) struct Collector {
    config: GcConfig,
    mode: StorageMode,
    /// The node's Raft log (in `onelog` mode also where the values live).
    raft_log: Arc<Log>,
    /// The log the index's locators point into: the Raft log in `onelog` mode, the value log in
    /// `separated` mode (none in `classic` mode, where values are inline).
    values: Option<Arc<Log>>,
    /// The node's hosted replicas, which change while it runs.
    hosted: HostedStates,
    /// The hosted replicas as of the pass's start ([`Collector::refresh_hosted`]).
    states: BTreeMap<u64, Arc<State>>,
    /// The Raft log's and the values log's ends read just before `states`: no segment past them
    /// goes in this pass.
    horizon: (u64, u64),
    pins: Arc<ReadPins>,
    status: Arc<Mutex<GcStatus>>,
    census: Census,
    /// A broken variant for the simulation ([`crate::Mutation::GcReclaimsBeforeFlush`]).
    pub reclaim_before_flush: bool,
    /// A broken variant for the simulation ([`crate::Mutation::GcIgnoresSharedValues`]).
    pub ignores_shared_values: bool,
    /// Most keys a census keeps ([`MAX_KEPT_KEYS`]; the simulation lowers it so that segments are
    /// also collected by reading them whole).
    pub max_kept_keys: usize,
    /// Classic mode: a data WAL position and the highest seqno each shard's tree had written when
    /// it was taken; once every tree's durable seqno reaches its own, the WAL below is obsolete.
    data_wal_checkpoint: Option<(u64, Vec<TreeMark>)>,
    /// Classic mode: the data WAL.
    data_wal: Option<Arc<Log>>,
    /// The node's deduplication (onelog mode, whatever `dedup.mode`): its fence keeps new references
    /// out of the segments a pass collects (late references aside), and moved values are
    /// deduplicated against its content index when its mode says so.
    dedup: Option<Arc<Dedup>>,
}

impl Collector {
    /// A collector for the node's logs (`log`, and `second_log` in `separated` and `classic`
    /// mode) and the replicas in `hosted` (their trees say what is live and where recovery starts).
    pub fn new(
        config: GcConfig,
        (mode, log, second_log): (StorageMode, Arc<Log>, Option<Arc<Log>>),
        (hosted, dedup): (HostedStates, Option<Arc<Dedup>>),
        pins: Arc<ReadPins>,
        status: Arc<Mutex<GcStatus>>,
    ) -> Collector {
        let values = match mode {
            StorageMode::OneLog => Some(log.clone()),
            StorageMode::Separated => second_log.clone(),
            StorageMode::Classic => None,
        };
        lock(&status).enabled = true;
        Collector {
            config,
            mode,
            raft_log: log,
            values,
            hosted,
            states: BTreeMap::new(),
            horizon: (0, 0),
            data_wal: match mode {
                StorageMode::Classic => second_log,
                _ => None,
            },
            pins,
            status,
            census: Census::default(),
            reclaim_before_flush: false,
            ignores_shared_values: false,
            max_kept_keys: MAX_KEPT_KEYS,
            data_wal_checkpoint: None,
            dedup,
        }
    }

    /// Takes the hosted replicas as they are now, at the start of each pass, and the logs' ends
    /// just before. The pass takes no segment past those ends ([`Collector::horizon`]), so a
    /// replica added during the pass is safe from it: it is protected from before its creation
    /// is recorded (`hosting`), so its recovery point and every record of it lie at or above the
    /// ends read here. One removed during a pass is garbage (its node retired it first).
    fn refresh_hosted(&mut self) {
        self.horizon =
            (self.raft_log.end_position(), self.values.as_ref().map_or(0, |log| log.end_position()));
        self.states = lock(&self.hosted).clone();
    }

    /// The pause between rounds.
    pub fn interval(&self) -> Duration {
        self.config.interval
    }

    /// One round, with its outcome in status; `false` if the collector must stop.
    pub fn run_round(&mut self, link: &mut dyn Link) -> bool {
        let started = Instant::now();
        let outcome = match self.mode {
            StorageMode::OneLog => self.round(link),
            StorageMode::Separated => self.round(link).and_then(|()| self.truncate_round(link)),
            StorageMode::Classic => self.truncate_round(link),
        };
        // No handle of a replica removed meanwhile outlives the round.
        self.states.clear();
        let mut status = lock(&self.status);
        status.rounds += 1;
        status.busy_ms += started.elapsed().as_millis() as u64;
        match outcome {
            Ok(()) => status.last_error = None,
            Err(RoundError::Stopped) => return false,
            Err(RoundError::Failed(error)) => {
                if status.last_error.as_ref() != Some(&error) {
                    tracing::warn!(%error, "a log GC round failed; trying again next round");
                }
                status.last_error = Some(error);
            }
        }
        true
    }

    /// One round over the log values live in (see the module documentation): while it is over its
    /// target, takes a census and collects its oldest segments, several at once (one flush of
    /// their shards covers them all), a few passes per round. In `onelog` mode only segments below
    /// the persistence point go; a pass's flush moves every shard's recovery point to the log's
    /// head, so the next pass finds the segments the previous one could not take yet.
    fn round(&mut self, link: &mut dyn Link) -> Result<(), RoundError> {
        for _ in 0..PASSES_PER_ROUND {
            if !self.pass(link)? {
                break;
            }
        }
        Ok(())
    }

    /// The log the index's locators point into (not in `classic` mode).
    fn values_log(&self) -> Arc<Log> {
        self.values.clone().expect("only onelog and separated mode relocate values")
    }

    /// One pass of a round; `false` when there is nothing more to do this round.
    fn pass(&mut self, link: &mut dyn Link) -> Result<bool, RoundError> {
        if let Some(dedup) = &self.dedup {
            // References made from here on are reported by `take_lowest_target` (a replica added
            // after the reset and before `refresh_hosted` too); those made before are published
            // once the loop's current turn ends, which the census waits for before its walk.
            dedup.take_lowest_target();
            // Late references of the last pass point into segments it left (it moved the others'
            // along with their copies): this pass's census sees them in the trees.
            dedup.forget_late_references();
        }
        self.refresh_hosted();
        // In onelog mode a key gains a locator into a sealed segment when its entry is applied,
        // which may be turns after the entry was appended: only segments below the persistence
        // point as the walk begins had all their entries applied (and published) before it.
        let point_at_census = self.persistence_point();
        self.take_census(link)?;
        let log = self.values_log();
        let segments = log.segments();
        let Some((_, sealed)) = segments.split_last() else { return Ok(false) };
        let live_in = |s: &SegmentInfo| match s.base < self.census.end {
            true => self.census.live.get(&s.base).copied().unwrap_or(0),
            false => s.len,
        };
        let log_bytes: u64 = segments.iter().map(|s| s.len).sum();
        let live: u64 = segments.iter().map(live_in).sum();
        {
            // In separated mode the Raft log's bytes count against the live values too.
            let other: u64 = match self.mode {
                StorageMode::Separated => self.raft_log.segments().iter().map(|s| s.len).sum(),
                _ => 0,
            };
            let mut status = lock(&self.status);
            status.log_bytes = log_bytes + other;
            status.live_bytes = live;
            status.space_amp = if live == 0 { 1.0 } else { (log_bytes + other) as f64 / live as f64 };
            status.waiting = None;
        }
        let target = (self.config.target_space_amp * live as f64) as u64;
        // The oldest segments whose garbage brings the log back to its target (a segment's live
        // bytes are written again at the head).
        let mut excess = log_bytes.saturating_sub(target);
        let mut chosen = Vec::new();
        for segment in sealed.iter().take_while(|segment| segment.end() <= self.horizon.1) {
            if excess == 0 || chosen.len() == MAX_SEGMENTS_PER_PASS {
                break;
            }
            if self.mode == StorageMode::Separated && !self.census.keys.contains_key(&segment.base) {
                // A value-log record does not name its key, so a segment is collected only when
                // the census kept its keys (it keeps those of the oldest segments, up to a bound).
                if chosen.is_empty() {
                    lock(&self.status).waiting = Some(format!(
                        "the value-log segment at {} has more live values than the census keeps \
                         ({})",
                        segment.base, self.max_kept_keys
                    ));
                }
                break;
            }
            if self.census.shared.contains(&segment.base)
                && !self.census.keys.contains_key(&segment.base)
                && !self.ignores_shared_values
            {
                // A record does not name the deduplicated keys pointing into it: only the census's
                // kept keys say which those are, and it kept too few. Move shared keys out of it
                // (a bounded number per pass) until it can keep them all.
                if chosen.is_empty() {
                    self.drain_shared(*segment, link)?;
                }
                break;
            }
            excess = excess.saturating_sub(segment.len.saturating_sub(live_in(segment)));
            chosen.push(*segment);
        }
        let Some(last) = chosen.last().copied() else { return Ok(false) };
        // Recovery replays the Raft log from each shard's recovery point: in onelog mode, where
        // the values are the Raft entries, no segment at or above the lowest of them may go.
        // In separated mode replay copies values again, so the value log has no such bound.
        let ready = match self.mode {
            StorageMode::OneLog => {
                let point = self.persistence_point().min(point_at_census);
                chosen.iter().take_while(|segment| segment.end() <= point).count()
            }
            _ => chosen.len(),
        };
        if ready == 0 {
            // Every shard whose recovery point is below the last chosen segment's end flushes, so
            // the next round may take them all.
            self.ask_holders_to_flush(last, link)?;
            return Ok(false);
        }
        // Read after the persistence point: an install that moved a recovery point past its
        // chunks began before that, so it shows here.
        let installs =
            self.states.iter().map(|(shard, state)| (*shard, state.installs.load(Ordering::SeqCst)));
        if let Some(shard) = self.census.overlapped_an_install(installs) {
            lock(&self.status).waiting =
                Some(format!("shard {shard} installed a snapshot during the census; counting again"));
            return Ok(false);
        }
        let ready = self.fence_off(&chosen[..ready], link)?;
        if ready == 0 {
            return Ok(false);
        }
        self.collect(&chosen[..ready], link)?;
        Ok(true)
    }

    /// Moves up to `max_kept_keys` of the keys that share values in `segment` (shared locators into
    /// it) to one new copy per value at the log's head, so that a segment too many keys point into
    /// for the census to keep them all gets there, and can then be collected. Raises the fence
    /// over it first, so no new reference is made into it meanwhile. Nothing is deleted here: a
    /// crash leaves keys pointing at the old copies, which are still there.
    fn drain_shared(&mut self, segment: SegmentInfo, link: &mut dyn Link) -> Result<(), RoundError> {
        if let Some(dedup) = &self.dedup {
            dedup.raise_fence(segment.end());
        }
        let rate = self.config.bytes_per_sec;
        let limit = self.max_kept_keys.max(1);
        let mut keys = Vec::new();
        for (shard, state) in &self.states {
            walk_index(&state.tree, link, rate, |key, stored| {
                if keys.len() < limit
                    && let Ok(value @ IndexValue::Shared(at)) = IndexValue::decode(stored)
                    && (segment.base..segment.end()).contains(&at.position)
                {
                    keys.push(LiveKey { shard: *shard, key: key.clone(), at: value, bytes: at });
                }
            })?;
        }
        lock(&self.status).waiting = Some(format!(
            "the segment at {} has more live keys than the census keeps ({}); moving {} of its shared \
             values' keys out first",
            segment.base,
            self.max_kept_keys,
            keys.len()
        ));
        let live = self.read_live(keys, link)?;
        self.relocate_segment_values(live, link)
    }

    /// With a node's deduplication (onelog mode): raises its fence over `chosen` (no reference is
    /// made into them from now on) and returns how many of them no reference was made into since the census began
    /// (the census may have counted such a value dead). Without it, all of them.
    fn fence_off(&mut self, chosen: &[SegmentInfo], link: &mut dyn Link) -> Result<usize, RoundError> {
        let Some(dedup) = self.dedup.clone().filter(|_| !self.ignores_shared_values) else {
            return Ok(chosen.len());
        };
        let Some(last) = chosen.last() else { return Ok(0) };
        dedup.raise_fence(last.end());
        // A reference decided before the fence rose is noted by the end of the turn it was
        // decided in.
        link.barrier()?;
        let lowest = dedup.take_lowest_target();
        let safe = chosen.iter().take_while(|segment| segment.end() <= lowest).count();
        if safe == 0 {
            lock(&self.status).waiting = Some(format!(
                "a deduplicated value was pointed at in the segment at {} during the census; counting again",
                chosen[0].base
            ));
        }
        Ok(safe)
    }

    /// The lowest recovery point of all shards: recovery never reads the Raft log below it.
    fn persistence_point(&self) -> u64 {
        self.states.iter().map(|(shard, state)| recovery_point(*shard, state)).min().unwrap_or(0)
    }

    /// Asks the shards whose recovery points are below `segment`'s end to flush, and says so in
    /// status.
    fn ask_holders_to_flush(&mut self, segment: SegmentInfo, link: &mut dyn Link) -> Result<(), RoundError> {
        let holders: Vec<u64> = self
            .states
            .iter()
            .filter(|(shard, state)| recovery_point(**shard, state) < segment.end())
            .map(|(shard, _)| *shard)
            .collect();
        lock(&self.status).waiting = Some(format!(
            "the recovery points of shards {holders:?} are below the end of the segment at {}; they were \
             asked to flush",
            segment.base
        ));
        link.flush(holders)
    }

    /// Walks every shard's index (keys and locators, no value read), a page per consistent view,
    /// at the rate limit, and sums the bytes keys point at per segment. A segment's live bytes
    /// only drop after the walk (new values go to the log's head), so the census may overstate
    /// what is live, never understate it: the collector may wait longer, never reclaim early.
    fn take_census(&mut self, link: &mut dyn Link) -> Result<(), RoundError> {
        let installs = self
            .states
            .iter()
            .map(|(shard, state)| (*shard, state.installs.load(Ordering::SeqCst)))
            .collect();
        let log = self.values_log();
        let end = log.end_position();
        let segments = log.segments();
        let sealed_end = segments.last().map_or(0, |active| active.base);
        // A value appended before this point may sit in a segment sealed by now while its key is
        // not yet published (separated mode appends a batch's values, then indexes them in the
        // same turn; the append itself may seal the segment): the walk would miss the key and
        // the segment would go with its value. Every such turn ends before the walk starts (so
        // do those that made deduplicated references before `pass` reset its lowest target).
        link.barrier()?;
        let mut live: BTreeMap<u64, u64> = segments.iter().map(|s| (s.base, 0)).collect();
        // The keys of the oldest segments' live values are kept, so collecting them reads only
        // those values; past a bound on their number, the later segments are scanned instead.
        // Only segments sealed when the walk starts (ending at or before the active one's base):
        // no key can gain a locator into those during or after the walk (but through a snapshot
        // install, which `installs` tells of).
        let window_end = segments
            .iter()
            .take_while(|s| s.end() <= sealed_end)
            .take(MAX_SEGMENTS_PER_PASS)
            .last()
            .map_or(0, |s| s.end());
        let mut keys: BTreeMap<u64, Vec<LiveKey>> = BTreeMap::new();
        // A packed value counts its share of its block: its pair's bytes at the compression ratio
        // seen so far (a block mostly dead is mostly garbage, though it cannot go alone).
        let packed_ratio = {
            let status = lock(&self.status);
            match status.packed_raw_bytes {
                0 => 1.0,
                raw => status.packed_bytes as f64 / raw as f64,
            }
        };
        let mut kept = 0usize;
        let mut keys_end = window_end;
        let mut shared = BTreeSet::new();
        let mut counted_places = std::collections::HashSet::new();
        let may_be_shared =
            |len: u64| self.dedup.as_ref().is_some_and(|dedup| dedup.is_candidate(len as usize));
        let rate = self.config.bytes_per_sec;
        for (shard, state) in &self.states {
            walk_index(&state.tree, link, rate, |key, stored| {
                let Ok(value) = IndexValue::decode(stored) else { return };
                if let Some(at) = value.log_bytes()
                    && let Some((base, bytes)) = live.range_mut(..=at.position).next_back()
                {
                    // What moving it would write: its key and stored value in a pair.
                    *bytes += match value {
                        IndexValue::Packed(packed) => {
                            (pair_bytes(key, u64::from(packed.len)) as f64 * packed_ratio) as u64
                        }
                        // A value several keys share counts once (up to a bound on the
                        // places remembered; past it, once per key: more, never less). Its
                        // own key's locator may be among them, so with deduplication on a
                        // locator to a value it could share is remembered too.
                        IndexValue::Shared(_) | IndexValue::Locator(_)
                            if (matches!(value, IndexValue::Shared(_)) || may_be_shared(at.len))
                                && counted_places.len() < MAX_KEPT_KEYS
                                && !counted_places.insert(at) =>
                        {
                            pair_bytes(key, 0)
                        }
                        _ => pair_bytes(key, at.len),
                    };
                    if matches!(value, IndexValue::Shared(_)) {
                        shared.insert(*base);
                        // Keys share copies here (puts by reference, before a restart too): from
                        // now on values that could be shared are moved whole.
                        if let Some(dedup) = &self.dedup {
                            dedup.note_references_seen(at.len);
                        }
                    }
                    if at.position < keys_end {
                        if kept == self.max_kept_keys {
                            // Keep only the segments below this one whole.
                            keys_end = *base;
                            keys.retain(|kept_base, _| *kept_base < keys_end);
                        } else {
                            kept += 1;
                            keys.entry(*base).or_default().push(LiveKey {
                                shard: *shard,
                                key: key.clone(),
                                at: value,
                                bytes: at,
                            });
                        }
                    }
                }
            })?;
        }
        // Segments below `keys_end` with no live value have an (empty) list too.
        for base in live.keys().filter(|base| **base < keys_end) {
            keys.entry(*base).or_default();
        }
        self.census = Census { live, end, keys, installs, shared };
        Ok(())
    }

    /// Moves the live values out of `oldest` (the log's first segments, in order) and deletes them.
    fn collect(&mut self, oldest: &[SegmentInfo], link: &mut dyn Link) -> Result<(), RoundError> {
        let log = self.values_log();
        // Tests act here (a callback), with the fence raised over `oldest` and nothing read yet.
        let _ = crate::failpoints::hit("gc-before-collect");
        for segment in oldest {
            // A segment whose live keys the census kept is not read: only its live values are.
            // Otherwise the whole segment is read, and its live values found by lookups.
            let live = match self.census.keys.remove(&segment.base) {
                Some(keys) => self.read_live(keys, link)?,
                None if self.mode == StorageMode::Separated => {
                    // `pass` chooses only segments whose keys were kept: a value-log record does
                    // not name its key, so a scan would find nothing live.
                    return Err(RoundError::Failed(format!(
                        "the census kept no keys for the value-log segment at {}",
                        segment.base
                    )));
                }
                None => self.live_values(*segment, link)?,
            };
            self.relocate_segment_values(live, link)?;
        }
        self.move_late_references(oldest, link)?;
        link.crash_point(GcPoint::AfterIndexUpdate)?;
        // Every shard flushes past this moment before the segment goes: the moved values' new
        // locators must be durable, and so must whatever made the others dead (a later write or
        // delete that only a memtable holds would be undone by a crash, and the key would point
        // into the deleted segment again). Every shard, not only those whose records are in the
        // segment: a key of any shard may have shared a value there (deduplication, on now or
        // before a restart) until such a write.
        let targets: Vec<(u64, u64)> =
            self.states.iter().map(|(shard, state)| (*shard, state.tree.last_written_seqno())).collect();
        if !self.reclaim_before_flush {
            link.flush(self.states.keys().copied().collect())?;
        }
        for (shard, seqno) in targets.iter().filter(|_| !self.reclaim_before_flush) {
            let state = self.states[shard].clone();
            let hosted = self.hosted.clone();
            // A replica removed meanwhile flushes no more; its values are garbage anyway.
            let removed = || lock(&hosted).get(shard).is_none_or(|now| !Arc::ptr_eq(now, &state));
            link.wait_until(&|| state.tree.durable_seqno() >= *seqno || removed()).map_err(|error| {
                match error {
                    RoundError::Failed(why) => RoundError::Failed(format!(
                        "shard {shard} did not flush before its values' segment could go: {why}"
                    )),
                    stopped => stopped,
                }
            })?;
        }
        link.crash_point(GcPoint::BeforeReclaim)?;
        if !self.pins.wait_for_earlier_readers(WAIT_LIMIT) {
            lock(&self.status).waiting =
                Some("a reader (a snapshot build?) still holds locators into the oldest segments".into());
            return Ok(());
        }
        let end = oldest.last().map_or(0, |segment| segment.end());
        let reclaimed = log.reclaim_below(end).map_err(|e| format!("reclaiming log segments: {e}"))?;
        link.crash_point(GcPoint::AfterReclaim)?;
        self.census.live.retain(|base, _| *base >= end);
        let mut status = lock(&self.status);
        status.segments_reclaimed += reclaimed.segments;
        status.bytes_reclaimed += reclaimed.bytes;
        Ok(())
    }

    /// Moves the keys that puts by reference pointed into `oldest` below the fence, during this
    /// pass, and that no move of their copy carried along (their source key was written again
    /// before its segment was read, so the copy was not moved for it): each to a copy of its own at
    /// the log's head. Waits for the loop's turn first, so every such reference decided is listed;
    /// once none is left, no key points into the segments (a new reference finds its source's
    /// copy elsewhere). `Failed` if references keep coming: the next pass's census sees them.
    fn move_late_references(
        &mut self,
        oldest: &[SegmentInfo],
        link: &mut dyn Link,
    ) -> Result<(), RoundError> {
        if self.dedup.is_none() {
            return Ok(());
        }
        let (Some(first), Some(last)) = (oldest.first(), oldest.last()) else { return Ok(()) };
        for round in 0..=LATE_REFERENCE_ROUNDS {
            // Taken on the loop between two turns: a reference made after that resolves its
            // source's place then, and every key this takes is moved below before the next take.
            let mut keys = Vec::new();
            let Some(taken) = link.take_late_references(first.base..last.end())? else {
                return Err(RoundError::Failed(format!(
                    "more puts by reference pointed into the segments being collected than the \
                     {} MiB held for them: the segments stay, and the next pass's census sees the keys",
                    crate::dedup::MAX_LATE_REFERENCE_BYTES >> 20
                )));
            };
            for (shard, at, names) in taken {
                let Some(state) = self.states.get(&shard) else { continue };
                for key in names {
                    if state.points_at(&key, &IndexValue::Shared(at))? {
                        keys.push(LiveKey { shard, key, at: IndexValue::Shared(at), bytes: at });
                    }
                }
            }
            if keys.is_empty() {
                return Ok(());
            }
            if round == LATE_REFERENCE_ROUNDS {
                break;
            }
            let live = self.read_live(keys, link)?;
            self.relocate_segment_values(live, link)?;
        }
        Err(RoundError::Failed(
            "puts by reference kept pointing into the segments being collected; the next pass counts them"
                .into(),
        ))
    }

    /// Moves the live values of one segment (in batches per shard): a place several keys point at
    /// (a deduplicated value) is moved once, and every key that shared it shares the copy.
    fn relocate_segment_values(
        &mut self,
        live: Vec<LiveValue>,
        link: &mut dyn Link,
    ) -> Result<(), RoundError> {
        let batch_bytes = records::chunk_bytes(self.values_log().config().max_record_bytes);
        let mut seen = HashMap::new();
        for at in live.iter().filter_map(|value| value.at.whole_locator()) {
            *seen.entry(at).or_insert(0usize) += 1;
        }
        let mut sharing = Sharing {
            repeated: seen.into_iter().filter(|(_, n)| *n > 1).map(|(at, _)| at).collect(),
            moved: HashMap::new(),
        };
        let mut by_shard: BTreeMap<u64, Vec<LiveValue>> = BTreeMap::new();
        for value in live {
            by_shard.entry(value.shard).or_default().push(value);
        }
        for (shard, values) in by_shard {
            let mut batch: Vec<LiveValue> = Vec::new();
            let mut bytes = 0usize;
            let mut values = values.into_iter().peekable();
            while let Some(value) = values.next() {
                bytes += value.key.len() + value.stored.len() + 8;
                batch.push(value);
                if bytes >= batch_bytes || values.peek().is_none() {
                    self.relocate(shard, std::mem::take(&mut batch), &mut sharing, link)?;
                    bytes = 0;
                }
            }
        }
        Ok(())
    }

    /// Appends `values` of `shard` at the log's head (small ones in compressed blocks of a PACKED
    /// record, the others in a RELOCATED record; one append) and has the loop point their keys
    /// there. A value already moved for another key (`sharing`), or, with deduplication, found
    /// elsewhere in the log byte for byte, is not written again: its key points at that copy.
    /// Values the loop could not move end the round: their segment cannot be reclaimed yet.
    fn relocate(
        &mut self,
        shard: u64,
        values: Vec<LiveValue>,
        sharing: &mut Sharing,
        link: &mut dyn Link,
    ) -> Result<(), RoundError> {
        let log = self.values_log();
        let dedup = self.dedup.clone();
        let mut moves = Vec::new();
        // Values to write, and values that will point at one of them (`copies[leader]`): another
        // key of the same place, or (deduplicating) the same bytes.
        let mut copies: Vec<LiveValue> = Vec::new();
        let mut followers: Vec<(LiveValue, usize)> = Vec::new();
        let mut leader_of_place: HashMap<Locator, usize> = HashMap::new();
        let mut leaders_of_bytes: HashMap<u64, Vec<usize>> = HashMap::new();
        for value in values {
            let repeated = value.at.whole_locator().filter(|at| sharing.repeated.contains(at));
            if let Some(to) = repeated.and_then(|at| sharing.moved.get(&at)) {
                moves.push(Move { key: value.key, from: value.at, to: IndexValue::Shared(*to) });
                continue;
            }
            if let Some(at) = repeated
                && let Some(&leader) = leader_of_place.get(&at)
            {
                followers.push((value, leader));
                continue;
            }
            let deduplicates = dedup
                .as_ref()
                .is_some_and(|dedup| dedup.mode().offline() && dedup.is_candidate(value.stored.len()));
            if deduplicates {
                if let Some(to) = dedup.as_ref().and_then(|dedup| dedup.offline_place(&log, &value.stored)) {
                    if let Some(at) = repeated {
                        sharing.moved.insert(at, to);
                    }
                    moves.push(Move { key: value.key, from: value.at, to: IndexValue::Shared(to) });
                    continue;
                }
                let hash = xxhash_rust::xxh3::xxh3_64(&value.stored);
                let same = leaders_of_bytes.get(&hash).and_then(|leaders| {
                    leaders.iter().copied().find(|leader| copies[*leader].stored == value.stored)
                });
                if let Some(leader) = same {
                    dedup.as_ref().expect("deduplicating").count_offline_hit(value.stored.len());
                    followers.push((value, leader));
                    continue;
                }
                leaders_of_bytes.entry(hash).or_default().push(copies.len());
            }
            if let Some(at) = repeated {
                leader_of_place.insert(at, copies.len());
            }
            copies.push(value);
        }
        let led: std::collections::HashSet<usize> = followers.iter().map(|(_, leader)| *leader).collect();
        let compress_below = self.config.compress_below;
        // A block closes once it holds TARGET_BLOCK_BYTES, so its raw size stays below that plus
        // one pair; a pair with a huge key (possible with a library user's own key limit) moves
        // whole, so no block can claim more than a read accepts. A value other keys will share,
        // or one large enough to deduplicate, moves whole: only a whole value can be shared.
        let (small, large): (Vec<Numbered>, Vec<Numbered>) =
            copies.into_iter().enumerate().partition(|(i, value)| {
                let shareable = led.contains(i)
                    || value.at.whole_locator().is_some_and(|at| sharing.repeated.contains(&at))
                    || dedup.as_ref().is_some_and(|dedup| dedup.keeps_whole(value.stored.len()));
                !shareable
                    && (value.stored.len().saturating_sub(codec::STORED_VALUE_PREFIX) as u64) < compress_below
                    && value.key.len() + value.stored.len() + 8 + packed::TARGET_BLOCK_BYTES
                        <= packed::MAX_BLOCK_BYTES
            });
        let relocated = Batch::relocated(shard, &values_of(&large));
        let packed = Batch::packed(shard, &values_of(&small));
        let batches: Vec<(onekv_log::RecordKind, Batch)> =
            [(records::RELOCATED, relocated), (records::PACKED, packed)]
                .into_iter()
                .filter(|(_, batch)| !batch.places.is_empty())
                .collect();
        let bytes: u64 = batches.iter().map(|(_, batch)| batch.payload.len() as u64).sum();
        let mut places = Vec::new();
        if !batches.is_empty() {
            link.throttle(bytes, self.config.bytes_per_sec)?;
            let appended = log
                .append(&batches.iter().map(|(kind, batch)| (*kind, &batch.payload[..])).collect::<Vec<_>>())
                .map_err(|e| format!("appending relocated values: {e}"))?;
            link.crash_point(GcPoint::AfterRelocateAppend)?;
            for ((_, batch), at) in batches.iter().zip(appended) {
                places.extend(batch.places.iter().map(|place| place.at(at)));
            }
        }
        let moved_bytes: u64 = large.iter().chain(&small).map(|(_, value)| value.stored.len() as u64).sum();
        let mut copied_to: HashMap<usize, Locator> = HashMap::new();
        for ((i, value), to) in large.into_iter().chain(small).zip(places) {
            if let Some(new) = to.whole_locator() {
                copied_to.insert(i, new);
                if let Some(at) = value.at.whole_locator().filter(|at| sharing.repeated.contains(at)) {
                    sharing.moved.insert(at, new);
                }
                if let Some(dedup) = &dedup {
                    dedup.remember(&value.stored, new);
                }
            }
            moves.push(Move { key: value.key, from: value.at, to });
        }
        for (value, leader) in followers {
            let to = *copied_to.get(&leader).expect("a value others share moves whole");
            moves.push(Move { key: value.key, from: value.at, to: IndexValue::Shared(to) });
        }
        let relocated = link.relocate(shard, moves)?;
        {
            let mut status = lock(&self.status);
            status.values_relocated += relocated.moved as u64;
            status.bytes_relocated += moved_bytes;
            if let Some((_, packed)) = batches.iter().find(|(kind, _)| *kind == records::PACKED) {
                status.values_packed += packed.places.len() as u64;
                status.packed_raw_bytes += packed.raw_bytes;
                status.packed_bytes += (packed.payload.len() - records::PACKED_HEADER) as u64;
            }
        }
        if relocated.left > 0 {
            return Err(RoundError::Failed(format!(
                "shard {shard} could not move {} values now; the segment stays",
                relocated.left
            )));
        }
        Ok(())
    }

    /// Reads the stored bytes of the values `keys` point at, in log order (so a compressed block
    /// is read and decompressed once for all its keys); their checksums are kept as they are: the
    /// bytes are copied, not judged. A damaged block's values cannot be read back: each is reported
    /// as damaged (so its replica asks another for a copy, as a read would) and moved as a
    /// stand-in of its length that fails its checksum, so damage stays damage and the collector
    /// does not stop at it.
    fn read_live(
        &mut self,
        mut keys: Vec<LiveKey>,
        link: &mut dyn Link,
    ) -> Result<Vec<LiveValue>, RoundError> {
        let log = self.values_log();
        keys.sort_by_key(|key| key.bytes.position);
        let mut live = Vec::with_capacity(keys.len());
        // The last block read: its locator, and its raw bytes or why it is damaged.
        let mut block: Option<(Locator, Result<Vec<u8>, codec::CodecError>)> = None;
        // The last value read whole: its locator and bytes.
        let mut whole: Option<(Locator, Arc<[u8]>)> = None;
        for LiveKey { shard, key, at, bytes } in keys {
            let stored = match at {
                IndexValue::Packed(packed) => {
                    if block.as_ref().is_none_or(|(read, _)| *read != packed.block) {
                        link.throttle(bytes.len, self.config.bytes_per_sec)?;
                        let framed =
                            log.read(bytes).map_err(|e| format!("reading a packed block at {bytes}: {e}"))?;
                        lock(&self.status).bytes_scanned += bytes.len;
                        block = Some((packed.block, packed::unpack(&framed)));
                    }
                    let raw = &block.as_ref().expect("just read").1;
                    match raw
                        .as_ref()
                        .map_err(|e| codec::CodecError(e.0))
                        .and_then(|raw| packed::stored_value(raw, packed.offset, packed.len))
                    {
                        Ok(stored) => stored.into(),
                        Err(why) => {
                            let state = &self.states[&shard];
                            state.corruption.report(
                                state.value_log_name(),
                                &key,
                                packed.block,
                                packed.offset,
                                why.0,
                            );
                            damaged_stand_in(packed.len as usize).into()
                        }
                    }
                }
                // Keys sharing a copy (deduplication) are next to each other: one read for all,
                // and one buffer they share.
                _ => match &whole {
                    Some((read, stored)) if *read == bytes => stored.clone(),
                    _ => {
                        link.throttle(bytes.len, self.config.bytes_per_sec)?;
                        let stored: Arc<[u8]> = log
                            .read(bytes)
                            .map_err(|e| format!("reading a live value at {bytes}: {e}"))?
                            .into();
                        lock(&self.status).bytes_scanned += bytes.len;
                        whole = Some((bytes, stored.clone()));
                        stored
                    }
                },
            };
            live.push(LiveValue { shard, key, at, stored });
        }
        Ok(live)
    }

    /// Reads every record of `segment` and returns the values keys still point at.
    fn live_values(
        &mut self,
        segment: SegmentInfo,
        link: &mut dyn Link,
    ) -> Result<Vec<LiveValue>, RoundError> {
        let mut live = Vec::new();
        for record in self.values_log().iter_from(segment.base) {
            let record = record.map_err(|e| format!("reading segment {}: {e}", segment.base))?;
            if record.position >= segment.end() {
                break;
            }
            link.throttle(record.payload.len() as u64, self.config.bytes_per_sec)?;
            let undecodable = |e: codec::CodecError| {
                format!("record at log position {} does not decode: {e}", record.position)
            };
            // Every value in the record; those whose keys still point at them are live.
            let found = if record.kind == records::PACKED {
                packed_values_in_record(&record.payload, record.locator).map_err(undecodable)?
            } else {
                let values = values_in_record(record.kind, &record.payload).map_err(undecodable)?;
                let mut found = Vec::with_capacity(values.len());
                for ValueInRecord { shard, key, span } in values {
                    let at = record.locator.slice(span.offset as u64, span.len as u64).ok_or_else(|| {
                        format!("a value span leaves its record at log position {}", record.position)
                    })?;
                    let stored = record.payload[span.offset..span.offset + span.len].into();
                    found.push(LiveValue { shard, key: key.to_vec(), at: IndexValue::Locator(at), stored });
                }
                found
            };
            for value in found {
                let Some(state) = self.states.get(&value.shard) else { continue };
                if state.points_at(&value.key, &value.at)? {
                    live.push(value);
                }
            }
        }
        lock(&self.status).bytes_scanned += segment.len;
        Ok(live)
    }

    /// Separated and classic mode: no locator points into the Raft log, so it is reclaimed below
    /// the persistence point at once; classic's data WAL below its last checkpoint that every tree
    /// has flushed past.
    fn truncate_round(&mut self, link: &mut dyn Link) -> Result<(), RoundError> {
        self.refresh_hosted();
        let point = self.persistence_point().min(self.horizon.0);
        let before = self.raft_log.segments();
        if let Some(oldest) = before.first()
            && before.len() > 1
            && point < oldest.end()
        {
            let holders: Vec<u64> = self
                .states
                .iter()
                .filter(|(shard, state)| recovery_point(**shard, state) < oldest.end())
                .map(|(shard, _)| *shard)
                .collect();
            link.flush(holders)?;
        }
        let mut reclaimed =
            self.raft_log.reclaim_below(point).map_err(|e| format!("reclaiming the Raft log: {e}"))?;
        if self.mode == StorageMode::Classic
            && let Some(wal) = self.data_wal.clone()
        {
            if let Some((position, seqnos)) = &self.data_wal_checkpoint
                && seqnos.iter().all(|(state, seqno)| {
                    // A replica removed since (its state gone, or no longer the hosted one of its
                    // shard: a replica added again has new trees) has nothing more to make durable.
                    let hosted = lock(&self.hosted);
                    state.upgrade().is_none_or(|state| {
                        let current = hosted.values().any(|other| Arc::ptr_eq(other, &state));
                        !current || state.tree.durable_seqno() >= *seqno
                    })
                })
            {
                let more =
                    wal.reclaim_below(*position).map_err(|e| format!("reclaiming the data WAL: {e}"))?;
                reclaimed.segments += more.segments;
                reclaimed.bytes += more.bytes;
                self.data_wal_checkpoint = None;
            }
            if self.data_wal_checkpoint.is_none() {
                // The position first: every APPLIED record below it was written after its writes
                // reached the tree, so their seqnos are at most what the trees say next.
                let position = wal.end_position();
                // The replicas hosted now, after the position: one added later writes above it.
                let seqnos = lock(&self.hosted)
                    .values()
                    .map(|state| (Arc::downgrade(state), state.tree.last_written_seqno()))
                    .collect();
                // No flush is asked for: the trees' own flushes (on size, entries or age) pass it.
                self.data_wal_checkpoint = Some((position, seqnos));
            }
        }
        let mut status = lock(&self.status);
        status.segments_reclaimed += reclaimed.segments;
        status.bytes_reclaimed += reclaimed.bytes;
        if self.mode == StorageMode::Classic {
            status.log_bytes = self.raft_log.segments().iter().map(|s| s.len).sum();
        }
        Ok(())
    }
}

/// Walks `tree` (keys and index values, no value read), a page per consistent view, at the
/// collector's rate limit (`rate` bytes per second), calling `visit` for each pair.
fn walk_index(
    tree: &onekv_index::Tree,
    link: &mut dyn Link,
    rate: u64,
    mut visit: impl FnMut(&Vec<u8>, &Vec<u8>),
) -> Result<(), RoundError> {
    let mut start: Vec<u8> = Vec::new();
    let mut first = true;
    loop {
        let (page, more) = tree
            .snapshot()
            .range(&start, None, CENSUS_PAGE + 1, false)
            .map_err(|e| format!("walking the index: {e}"))?;
        // Pages after the first start at the previous page's last key, already visited.
        let skip = usize::from(!first);
        let visited = &page[skip.min(page.len())..page.len().min(skip + CENSUS_PAGE)];
        let mut cost = 0;
        for (key, stored) in visited {
            cost += (key.len() + stored.len()) as u64 + CENSUS_KEY_COST;
            visit(key, stored);
        }
        link.throttle(cost, rate)?;
        match visited.last() {
            Some((key, _)) if more || page.len() > skip + visited.len() => {
                start = key.clone();
                first = false;
            }
            _ => return Ok(()),
        }
    }
}

/// A stored value of `len` bytes (at least its checksum's) that fails its checksum: what a value
/// of a damaged block becomes when it moves, so it keeps reading as damaged (and keeps its length,
/// which a repair from another replica checks).
fn damaged_stand_in(len: usize) -> Vec<u8> {
    let mut stored = vec![0u8; len.max(codec::STORED_VALUE_PREFIX)];
    let crc = crc32c::crc32c(&stored[codec::STORED_VALUE_PREFIX..]) ^ 1;
    stored[..codec::STORED_VALUE_PREFIX].copy_from_slice(&crc.to_le_bytes());
    stored
}

/// Bytes a pair of `key` and a stored value of `stored` bytes takes in a moved record (lengths
/// and all): what the census counts as live for a value, so that log ÷ live is what moving every
/// live value would bring the log down to, whatever the size of keys and values.
fn pair_bytes(key: &[u8], stored: u64) -> u64 {
    key.len() as u64 + stored + 8
}

/// The log position below which `shard`'s recovery never reads: the lower of the two starts of the
/// recovery point stored with its last durable flush; 0 (nothing may go) if it has none.
fn recovery_point(shard: u64, state: &State) -> u64 {
    match state.tree.flush_note() {
        Some(note) if !note.is_empty() => {
            records::decode_recovery_point(&note, shard).map_or(0, |point| point.lowest())
        }
        _ => 0,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::Census;

    #[test]
    fn a_census_that_an_install_overlapped_is_not_acted_on() {
        let census = Census { installs: [(1, 0), (2, 2)].into(), ..Census::default() };
        assert_eq!(census.overlapped_an_install([(1, 0), (2, 2)]), None, "no install since");
        assert_eq!(census.overlapped_an_install([(1, 1), (2, 2)]), Some(1), "one under way");
        assert_eq!(census.overlapped_an_install([(1, 0), (2, 4)]), Some(2), "one began and ended");
        assert_eq!(census.overlapped_an_install([(1, 0), (3, 0)]), None, "a replica added since");
        assert_eq!(census.overlapped_an_install([(3, 2)]), Some(3), "added since, and installed");
    }
}
