//! The log garbage collector (XLL §4.2.3): bounded disk in `onelog` mode, where values live inside
//! the Raft entries of the node's one log and nothing else would ever free them.
//!
//! One collector per node, on a thread of its own, over the shared log. The log is reclaimed from
//! its oldest end (a prefix of whole segments: `Log::reclaim_below`), so no hole ever appears in
//! the log's address space and recovery's contiguity checks stay as they are. Each round:
//!
//! 1. **Census.** Sealed segments are scanned at a bounded rate, least recently scanned first: every
//!    value a record holds (puts inside ENTRY records, snapshot chunks, earlier relocations) is
//!    looked up in its shard's index; it is live if the key's current locator still points at it.
//!    The sum over segments (unscanned ones and the segment being appended to count as all live)
//!    estimates the live bytes; log bytes ÷ live is the space amplification.
//! 2. **Decide.** Only when that exceeds `target_space_amp` is the oldest segment collected. It must
//!    lie wholly below the node's **persistence point** (the lowest recovery point of all shards:
//!    recovery never reads below it, and every Raft entry below it is below its shard's Raft log
//!    compaction point, so no follower is served from it either). Shards whose recovery point still
//!    falls inside it are asked to flush (an idle shard also lets Raft forget every applied entry its
//!    followers have, so its recovery point can move at all).
//! 3. **Relocate.** The oldest segment's live values are appended at the log's head as RELOCATED
//!    records (durable before anything else changes), then the loop points each key at its new copy
//!    if the key still points at the old one ([`crate::group::Group::relocate`], at a sequence number
//!    no replay or later write can collide with: `state::relocation_seqno`), publishes, and flushes
//!    the shard's tree.
//! 4. **Reclaim.** Once every touched tree's flush covering the new locators is durable and every
//!    reader that might still hold an old locator is done (`pins`), the segment file is deleted.
//!
//! A crash anywhere loses nothing: before the flush, the trees on disk still point at the old
//! segment, which still exists; after it, they point at the RELOCATED records, which were durable
//! first. Crash points: `gc-after-relocate-append`, `gc-after-index-update`, `gc-before-reclaim`,
//! `gc-after-reclaim` (feature `failpoints`).
//!
//! In `separated` and `classic` mode no locator points into the Raft log: it is reclaimed below the
//! persistence point without relocation. Classic's data WAL is reclaimed below the position it had
//! when every write before it was already in a durable table. Separated's value log is not
//! collected yet (its VALUE records do not name their keys).
//!
//! What this module does not own: the index updates themselves (the loop's, in `group`), when
//! trees flush (the loop's), the log's files (`onekv-log`).

use crate::StorageMode;
use crate::codec::{self, DecodedCommand, ValueSpan};
use crate::node::Input;
use crate::pins::ReadPins;
use crate::records;
use crate::state::State;
use onekv_index::IndexValue;
use onekv_log::{Locator, Log, RecordKind, SegmentInfo};
use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A segment's census is redone once it is this old.
const CENSUS_MAX_AGE: Duration = Duration::from_secs(30);

/// Largest RELOCATED record the collector writes.
const RELOCATE_BATCH_BYTES: usize = 4 << 20;

/// How long the collector waits for the loop to answer, for a flush covering its relocations, or
/// for readers of old locators, before it gives the round up (and tries again next round).
const WAIT_LIMIT: Duration = Duration::from_secs(60);

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
}

impl Default for GcConfig {
    fn default() -> Self {
        GcConfig {
            enabled: true,
            target_space_amp: 1.5,
            bytes_per_sec: 64 << 20,
            interval: Duration::from_secs(1),
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
    /// Estimated live bytes in the log (records whose values some key still points at; segments not
    /// scanned yet count as live).
    pub live_bytes: u64,
    /// `log_bytes / live_bytes` at the last round (1 when the log is empty).
    pub space_amp: f64,
    /// Rounds run.
    pub rounds: u64,
    /// Bytes of segments read by census scans and collections.
    pub bytes_scanned: u64,
    /// Values moved to the log's head, and their bytes.
    pub values_relocated: u64,
    /// Bytes of values moved (with their checksums).
    pub bytes_relocated: u64,
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
    pub from: Locator,
    pub to: Locator,
}

/// What the loop did with a batch of [`Move`]s.
#[derive(Debug)]
pub(crate) struct Relocated {
    /// Keys now pointing at their new copies.
    pub moved: usize,
    /// Keys still pointing at their old copies (the loop could not move them now).
    pub left: usize,
    /// The sequence number the moves were written at (0 if none).
    pub seqno: u64,
}

/// Requests from the collector to the node loop.
pub(crate) enum GcInput {
    /// Point keys at relocated copies (only those still pointing at the old ones).
    Relocate { shard: u64, moves: Vec<Move>, done: SyncSender<Result<Relocated, String>> },
    /// Flush these shards' trees soon, letting Raft forget every entry it can, so their recovery
    /// points move up.
    Flush { shards: Vec<u64> },
}

/// The running collector; stops when dropped.
pub(crate) struct Gc {
    stop: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Gc {
    /// Starts the collector over `log` for the shards in `states` (their trees say what is live and
    /// where recovery starts), talking to the loop through `inbox`.
    pub fn start(
        config: GcConfig,
        log: Arc<Log>,
        states: BTreeMap<u64, Arc<State>>,
        inbox: SyncSender<Input>,
        pins: Arc<ReadPins>,
        status: Arc<Mutex<GcStatus>>,
    ) -> Result<Gc, String> {
        let (stop, stopped) = std::sync::mpsc::sync_channel(1);
        let mode = states.values().next().map_or(StorageMode::OneLog, |state| state.mode);
        lock(&status).enabled = true;
        let mut collector = Collector {
            config,
            mode,
            log,
            states,
            inbox,
            pins,
            status,
            census: BTreeMap::new(),
            stopped,
            window_start: Instant::now(),
            window_bytes: 0,
            data_wal_checkpoint: None,
        };
        let thread = std::thread::Builder::new()
            .name("onekv-gc".into())
            .spawn(move || collector.run())
            .map_err(|e| format!("starting the log garbage collector: {e}"))?;
        Ok(Gc { stop: Some(stop), thread: Some(thread) })
    }

    /// Stops the collector and waits for its thread (a round in progress ends at its next wait).
    pub fn stop(&mut self) {
        self.stop.take();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the log garbage collector panicked");
        }
    }
}

impl Drop for Gc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The collector was asked to stop.
struct Stopped;

/// Why a round ended early.
enum RoundError {
    Stopped,
    Failed(String),
}

impl From<Stopped> for RoundError {
    fn from(_: Stopped) -> Self {
        RoundError::Stopped
    }
}

impl From<String> for RoundError {
    fn from(error: String) -> Self {
        RoundError::Failed(error)
    }
}

/// What a scan of one segment found.
struct SegmentScan {
    /// Bytes of live values (their stored bytes, checksums included).
    live_bytes: u64,
    /// The live values themselves, when asked for.
    live: Vec<LiveValue>,
}

/// A value some key still points at.
struct LiveValue {
    shard: u64,
    key: Vec<u8>,
    /// Where it is now.
    at: Locator,
    /// Its stored bytes (checksum and value).
    stored: Vec<u8>,
}

/// A value inside a record: its shard and key, and its span in the record's payload (covering
/// the value's checksum and bytes, as a locator does).
#[derive(Clone, Copy)]
struct ValueInRecord<'a> {
    shard: u64,
    key: &'a [u8],
    span: ValueSpan,
}

/// A census entry: a segment's live bytes when it was last scanned.
struct Census {
    live: u64,
    scanned: Instant,
}

struct Collector {
    config: GcConfig,
    mode: StorageMode,
    log: Arc<Log>,
    states: BTreeMap<u64, Arc<State>>,
    inbox: SyncSender<Input>,
    pins: Arc<ReadPins>,
    status: Arc<Mutex<GcStatus>>,
    census: BTreeMap<u64, Census>,
    stopped: Receiver<()>,
    /// The rate limit's current one-second window.
    window_start: Instant,
    window_bytes: u64,
    /// Classic mode: a data WAL position and the highest seqno each shard's tree had written when
    /// it was taken; once every tree's durable seqno reaches its own, the WAL below is obsolete.
    data_wal_checkpoint: Option<(u64, BTreeMap<u64, u64>)>,
}

impl Collector {
    fn run(&mut self) {
        loop {
            match self.stopped.recv_timeout(self.config.interval) {
                Err(RecvTimeoutError::Timeout) => {}
                Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
            }
            let started = Instant::now();
            let outcome = match self.mode {
                StorageMode::OneLog => self.round(),
                StorageMode::Separated | StorageMode::Classic => self.truncate_round(),
            };
            let mut status = lock(&self.status);
            status.rounds += 1;
            status.busy_ms += started.elapsed().as_millis() as u64;
            match outcome {
                Ok(()) => status.last_error = None,
                Err(RoundError::Stopped) => return,
                Err(RoundError::Failed(error)) => {
                    if status.last_error.as_ref() != Some(&error) {
                        tracing::warn!(%error, "a log GC round failed; trying again next round");
                    }
                    status.last_error = Some(error);
                }
            }
        }
    }

    /// One round in onelog mode (see the module documentation): collects oldest segments while
    /// the log is over its target and they are below the persistence point.
    fn round(&mut self) -> Result<(), RoundError> {
        let mut refreshed = false;
        loop {
            let segments = self.log.segments();
            self.census.retain(|base, _| segments.iter().any(|s| s.base == *base));
            let Some((active, sealed)) = segments.split_last() else { return Ok(()) };
            if !refreshed {
                self.refresh_census(sealed)?;
                refreshed = true;
            }
            let log_bytes: u64 = segments.iter().map(|s| s.len).sum();
            let live: u64 = active.len
                + sealed.iter().map(|s| self.census.get(&s.base).map_or(s.len, |c| c.live)).sum::<u64>();
            let space_amp = if live == 0 { 1.0 } else { log_bytes as f64 / live as f64 };
            {
                let mut status = lock(&self.status);
                status.log_bytes = log_bytes;
                status.live_bytes = live;
                status.space_amp = space_amp;
            }
            let Some(oldest) = sealed.first().copied() else {
                lock(&self.status).waiting = None;
                return Ok(());
            };
            if space_amp <= self.config.target_space_amp {
                lock(&self.status).waiting = None;
                return Ok(());
            }
            if !self.below_persistence_point(oldest)? || !self.collect(oldest)? {
                return Ok(());
            }
        }
    }

    /// Whether `segment` lies wholly below every shard's recovery point; if not, asks the shards
    /// that hold it to flush, and says so in status.
    fn below_persistence_point(&mut self, segment: SegmentInfo) -> Result<bool, RoundError> {
        let holders: Vec<u64> = self
            .states
            .iter()
            .filter(|(shard, state)| recovery_point(**shard, state) < segment.end())
            .map(|(shard, _)| *shard)
            .collect();
        if holders.is_empty() {
            return Ok(true);
        }
        lock(&self.status).waiting = Some(format!(
            "the recovery points of shards {holders:?} are in the oldest segment (at {}); they were asked \
             to flush",
            segment.base
        ));
        self.send(Input::Gc(GcInput::Flush { shards: holders }))?;
        Ok(false)
    }

    /// Scans sealed segments never scanned, then those scanned longest ago if that was more than
    /// [`CENSUS_MAX_AGE`] ago, up to half a round's share of the rate limit (liveness only drops,
    /// so an old count overstates what is live: the collector then waits longer, never too little).
    fn refresh_census(&mut self, sealed: &[SegmentInfo]) -> Result<(), RoundError> {
        let stale = |census: Option<&Census>| census.is_none_or(|c| c.scanned.elapsed() >= CENSUS_MAX_AGE);
        let mut order: Vec<SegmentInfo> =
            sealed.iter().filter(|s| stale(self.census.get(&s.base))).copied().collect();
        // Never scanned first (oldest first among them), then the least recently scanned.
        order.sort_by_key(|s| (self.census.get(&s.base).map(|c| c.scanned), s.base));
        let budget = match self.config.bytes_per_sec {
            0 => u64::MAX,
            rate => (rate as f64 * self.config.interval.as_secs_f64().max(1.0) / 2.0) as u64,
        };
        let mut spent = 0u64;
        for segment in order {
            if spent >= budget {
                break;
            }
            let scan = self.scan(segment, false)?;
            spent += segment.len;
            self.census.insert(segment.base, Census { live: scan.live_bytes, scanned: Instant::now() });
        }
        Ok(())
    }

    /// Moves the live values out of `oldest` and deletes it; `false` if it must wait (readers).
    fn collect(&mut self, oldest: SegmentInfo) -> Result<bool, RoundError> {
        let scan = self.scan(oldest, true)?;
        let mut by_shard: BTreeMap<u64, Vec<LiveValue>> = BTreeMap::new();
        for value in scan.live {
            by_shard.entry(value.shard).or_default().push(value);
        }
        let mut written: BTreeMap<u64, u64> = BTreeMap::new();
        for (shard, values) in by_shard {
            let mut batch: Vec<LiveValue> = Vec::new();
            let mut bytes = 0usize;
            let mut values = values.into_iter().peekable();
            while let Some(value) = values.next() {
                bytes += value.key.len() + value.stored.len() + 8;
                batch.push(value);
                if bytes >= RELOCATE_BATCH_BYTES || values.peek().is_none() {
                    let seqno = self.relocate(shard, std::mem::take(&mut batch))?;
                    bytes = 0;
                    if seqno > 0 {
                        written.insert(shard, seqno);
                    }
                }
            }
        }
        crate::failpoint!("gc-after-index-update");
        // The new locators must be in durable tables before the old copies go: the loop flushes
        // a tree soon after a relocation.
        let deadline = Instant::now() + WAIT_LIMIT;
        for (shard, seqno) in &written {
            let state = &self.states[shard];
            while state.tree.durable_seqno() < *seqno {
                if Instant::now() >= deadline {
                    return Err(RoundError::Failed(format!(
                        "shard {shard} did not flush the relocated locators within {WAIT_LIMIT:?}"
                    )));
                }
                self.sleep(Duration::from_millis(10))?;
            }
        }
        crate::failpoint!("gc-before-reclaim");
        if !self.pins.wait_for_earlier_readers(WAIT_LIMIT) {
            lock(&self.status).waiting =
                Some("a reader (a snapshot build?) still holds locators into the oldest segment".into());
            return Ok(false);
        }
        let reclaimed =
            self.log.reclaim_below(oldest.end()).map_err(|e| format!("reclaiming log segments: {e}"))?;
        crate::failpoint!("gc-after-reclaim");
        self.census.remove(&oldest.base);
        let mut status = lock(&self.status);
        status.segments_reclaimed += reclaimed.segments;
        status.bytes_reclaimed += reclaimed.bytes;
        status.waiting = None;
        Ok(true)
    }

    /// Appends `values` of `shard` as one RELOCATED record and has the loop point their keys at
    /// it; returns the seqno the loop wrote them at (0: none moved). Values the loop could not
    /// move end the round: their segment cannot be reclaimed yet.
    fn relocate(&mut self, shard: u64, values: Vec<LiveValue>) -> Result<u64, RoundError> {
        let mut pairs = Vec::new();
        let mut offsets = Vec::with_capacity(values.len());
        for value in &values {
            records::push_stored_pair(&mut pairs, &value.key, &value.stored);
            // The stored value (crc and bytes) ends the pair.
            offsets.push((pairs.len() - value.stored.len(), value.stored.len()));
        }
        let payload = records::encode_relocated(shard, &pairs);
        self.throttle(payload.len() as u64)?;
        let at = self
            .log
            .append(&[(records::RELOCATED, &payload)])
            .map_err(|e| format!("appending relocated values: {e}"))?[0];
        crate::failpoint!("gc-after-relocate-append");
        let moves: Vec<Move> = values
            .into_iter()
            .zip(offsets)
            .map(|(value, (offset, len))| Move {
                key: value.key,
                from: value.at,
                to: at.slice((records::RELOCATED_HEADER + offset) as u64, len as u64).expect("inside"),
            })
            .collect();
        let bytes: u64 = moves.iter().map(|m| m.to.len).sum();
        let (done, answer) = std::sync::mpsc::sync_channel(1);
        self.send(Input::Gc(GcInput::Relocate { shard, moves, done }))?;
        let relocated = loop {
            match answer.recv_timeout(Duration::from_millis(100)) {
                Ok(result) => break result?,
                Err(RecvTimeoutError::Timeout) => self.sleep(Duration::ZERO)?,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(RoundError::Failed("the node loop stopped".into()));
                }
            }
        };
        {
            let mut status = lock(&self.status);
            status.values_relocated += relocated.moved as u64;
            status.bytes_relocated += bytes;
        }
        if relocated.left > 0 {
            return Err(RoundError::Failed(format!(
                "shard {shard} could not move {} values now; the segment stays",
                relocated.left
            )));
        }
        Ok(relocated.seqno)
    }

    /// Reads every record of `segment` and finds its live values (kept when `keep`).
    fn scan(&mut self, segment: SegmentInfo, keep: bool) -> Result<SegmentScan, RoundError> {
        let mut scan = SegmentScan { live_bytes: 0, live: Vec::new() };
        for record in self.log.iter_from(segment.base) {
            let record = record.map_err(|e| format!("reading segment {}: {e}", segment.base))?;
            if record.position >= segment.end() {
                break;
            }
            self.throttle(record.payload.len() as u64)?;
            let values = values_in_record(record.kind, &record.payload)
                .map_err(|e| format!("record at log position {} does not decode: {e}", record.position))?;
            for ValueInRecord { shard, key, span } in values {
                let Some(state) = self.states.get(&shard) else { continue };
                let at = record.locator.slice(span.offset as u64, span.len as u64).ok_or_else(|| {
                    format!("a value span leaves its record at log position {}", record.position)
                })?;
                let current = state.tree.get(key).map_err(|e| format!("index lookup: {e}"))?;
                let live = current
                    .and_then(|stored| IndexValue::decode(&stored).ok())
                    .is_some_and(|value| value == IndexValue::Locator(at));
                if live {
                    scan.live_bytes += at.len;
                    if keep {
                        let stored = record.payload[span.offset..span.offset + span.len].to_vec();
                        scan.live.push(LiveValue { shard, key: key.to_vec(), at, stored });
                    }
                }
            }
        }
        lock(&self.status).bytes_scanned += segment.len;
        Ok(scan)
    }

    /// Separated and classic mode: no locator points into the Raft log, so it is reclaimed below
    /// the persistence point at once; classic's data WAL below its last checkpoint that every tree
    /// has flushed past.
    fn truncate_round(&mut self) -> Result<(), RoundError> {
        let point = self.states.iter().map(|(shard, state)| recovery_point(*shard, state)).min().unwrap_or(0);
        let before = self.log.segments();
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
            self.send(Input::Gc(GcInput::Flush { shards: holders }))?;
        }
        let mut reclaimed =
            self.log.reclaim_below(point).map_err(|e| format!("reclaiming the Raft log: {e}"))?;
        if self.mode == StorageMode::Classic
            && let Some(wal) = self.states.values().next().and_then(|state| state.second_log.clone())
        {
            if let Some((position, seqnos)) = &self.data_wal_checkpoint
                && seqnos.iter().all(|(shard, seqno)| self.states[shard].tree.durable_seqno() >= *seqno)
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
                let seqnos = self
                    .states
                    .iter()
                    .map(|(shard, state)| (*shard, state.tree.last_written_seqno()))
                    .collect();
                self.data_wal_checkpoint = Some((position, seqnos));
                let holders: Vec<u64> = self.states.keys().copied().collect();
                self.send(Input::Gc(GcInput::Flush { shards: holders }))?;
            }
        }
        let mut status = lock(&self.status);
        status.segments_reclaimed += reclaimed.segments;
        status.bytes_reclaimed += reclaimed.bytes;
        status.log_bytes = self.log.segments().iter().map(|s| s.len).sum();
        Ok(())
    }

    /// Queues `input` for the loop, waiting while its inbox is full.
    fn send(&mut self, mut input: Input) -> Result<(), RoundError> {
        loop {
            match self.inbox.try_send(input) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Full(back)) => {
                    input = back;
                    self.sleep(Duration::from_millis(5))?;
                }
                Err(TrySendError::Disconnected(_)) => return Err(RoundError::Stopped),
            }
        }
    }

    /// Accounts `bytes` of I/O against the rate limit, sleeping as long as it says.
    fn throttle(&mut self, bytes: u64) -> Result<(), Stopped> {
        let rate = self.config.bytes_per_sec;
        if rate == 0 {
            return Ok(());
        }
        if self.window_start.elapsed() >= Duration::from_secs(1) {
            self.window_start = Instant::now();
            self.window_bytes = 0;
        }
        self.window_bytes += bytes;
        let due = Duration::from_secs_f64(self.window_bytes as f64 / rate as f64);
        let elapsed = self.window_start.elapsed();
        if due > elapsed {
            self.sleep(due - elapsed)?;
        }
        Ok(())
    }

    /// Sleeps, or returns at once when asked to stop.
    fn sleep(&self, duration: Duration) -> Result<(), Stopped> {
        match self.stopped.recv_timeout(duration) {
            Err(RecvTimeoutError::Timeout) => Ok(()),
            Ok(()) | Err(RecvTimeoutError::Disconnected) => Err(Stopped),
        }
    }
}

/// The log position below which `shard`'s recovery never reads: the `scan_from` of the recovery
/// point stored with its last durable flush; 0 (nothing may go) if it has none.
fn recovery_point(shard: u64, state: &State) -> u64 {
    match state.tree.flush_note() {
        Some(note) if !note.is_empty() => {
            records::decode_recovery_point(&note, shard).map_or(0, |point| point.scan_from)
        }
        _ => 0,
    }
}

/// Every value a record holds that an index may point at.
fn values_in_record(kind: RecordKind, payload: &[u8]) -> Result<Vec<ValueInRecord<'_>>, codec::CodecError> {
    let pairs_at = |shard: u64, start: usize| -> Result<Vec<ValueInRecord<'_>>, codec::CodecError> {
        let pairs = payload.get(start..).ok_or(codec::CodecError("record too short"))?;
        records::SnapshotPairs::new(pairs)
            .filter(|pair| !matches!(pair, Ok((key, _)) if key.is_empty()))
            .map(|pair| {
                pair.map(|(key, span)| ValueInRecord {
                    shard,
                    key,
                    span: ValueSpan { offset: start + span.offset, len: span.len },
                })
            })
            .collect()
    };
    match kind {
        records::ENTRY => {
            let entry = records::decode_entry(payload)?;
            // Only normal entries carry commands (type 0); no-ops carry nothing.
            if entry.entry_type != 0 || entry.data.is_empty() {
                return Ok(Vec::new());
            }
            let decoded = codec::decode(entry.data)?;
            let shard = entry.shard;
            let value = |key, span: ValueSpan| ValueInRecord {
                shard,
                key,
                span: ValueSpan { offset: entry.data_offset + span.offset, len: span.len },
            };
            Ok(match decoded.command {
                DecodedCommand::Write(ops) | DecodedCommand::Txn { ops, .. } => {
                    ops.into_iter().filter_map(|op| op.value.map(|span| value(op.key, span))).collect()
                }
                DecodedCommand::Cas { key, new, .. } => {
                    new.map(|span| value(key, span)).into_iter().collect()
                }
                DecodedCommand::Repair { key, value: span } => vec![value(key, span)],
                DecodedCommand::RepairRequest { .. } => Vec::new(),
            })
        }
        records::SNAP_CHUNK => {
            let (shard, ..) = records::decode_snapshot_chunk(payload)?;
            pairs_at(shard, records::SNAP_CHUNK_HEADER)
        }
        records::RELOCATED => {
            let shard = records::record_shard(kind, payload)?;
            pairs_at(shard, records::RELOCATED_HEADER)
        }
        _ => Ok(Vec::new()),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Command, RequestId, WriteOp};

    #[test]
    fn a_record_names_every_value_an_index_may_point_at() {
        let command = Command::Write(vec![
            WriteOp { key: b"a".to_vec(), value: Some(b"one".to_vec()) },
            WriteOp { key: b"b".to_vec(), value: None },
            WriteOp { key: b"c".to_vec(), value: Some(b"three".to_vec()) },
        ]);
        let entry = raft::eraftpb::Entry {
            term: 2,
            index: 9,
            data: codec::encode(RequestId { client: 1, seq: 1 }, 0, &command).into(),
            ..Default::default()
        };
        let payload = records::encode_entry(7, &entry);
        let found = values_in_record(records::ENTRY, &payload).unwrap();
        let values: Vec<(u64, &[u8], &[u8])> = found
            .iter()
            .map(|v| (v.shard, v.key, &payload[v.span.offset + 4..v.span.offset + v.span.len]))
            .collect();
        assert_eq!(values, vec![(7, &b"a"[..], &b"one"[..]), (7, &b"c"[..], &b"three"[..])]);

        let mut pairs = Vec::new();
        records::push_snapshot_pair(&mut pairs, b"k", b"value");
        records::push_snapshot_pair(&mut pairs, b"", b"window ids");
        let stored = codec::stored_value(b"moved");
        records::push_stored_pair(&mut pairs, b"m", &stored);
        let payload = records::encode_relocated(3, &pairs);
        let found = values_in_record(records::RELOCATED, &payload).unwrap();
        assert_eq!(found.len(), 2, "the request-window pair (empty key) is no value");
        let ValueInRecord { shard, key, span } = found[1];
        assert_eq!((shard, key), (3, &b"m"[..]));
        assert_eq!(&payload[span.offset..span.offset + span.len], &stored[..]);
        codec::verify_stored_value(&payload[span.offset..span.offset + span.len]).unwrap();

        let chunk = records::encode_snapshot_chunk(5, 40, 0, &pairs);
        let found = values_in_record(records::SNAP_CHUNK, &chunk).unwrap();
        assert_eq!(
            found.iter().map(|v| (v.shard, v.key)).collect::<Vec<_>>(),
            vec![(5, &b"k"[..]), (5, &b"m"[..])]
        );
        assert!(values_in_record(records::HARD_STATE, &[0; 32]).unwrap().is_empty());
        assert!(values_in_record(records::ENTRY, &payload[..3]).is_err());
    }
}
