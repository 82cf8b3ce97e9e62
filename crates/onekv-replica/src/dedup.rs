//! Identical values stored once (DEDUPKV, §4), in the one log: a key whose value is already in the
//! log, byte for byte, points at that copy ([`IndexValue::Shared`]) instead of its own.
//!
//! One [`Dedup`] per node, shared by every shard's replica and the log GC:
//!
//! - **The content index** maps a value's 128-bit fingerprint (XXH3) to the place of one copy of
//!   it in the log (its *canonical* copy), for values of at least `min_value_bytes`. It is a hint:
//!   a hit is used only after the canonical copy's bytes were read back and compared with the new
//!   value's (and checked against the GC's fence, below), so a stale entry, a collision or a
//!   damaged copy costs a read, never a wrong value. Because it is a hint it lives in memory only,
//!   bounded by `memory_bytes` (least recently used entries go first), and is not persisted: after a
//!   restart it fills again from the values written and moved since.
//! - **At apply (inline)**: the applier asks [`Dedup::inline_place`] for each large value; a hit
//!   makes the key point at the canonical copy, and the value's bytes in the new entry become
//!   garbage for the log GC at once.
//! - **In the GC (offline)**: values the collector moves are compared against the content index the
//!   same way, so duplicates written while inline dedup was off are merged when their segment is
//!   collected; and keys that shared a copy before the move share the moved copy.
//! - **On the wire**: with [`DedupConfig::references`] a leader deduplicating inline proposes a
//!   put whose value a key of the shard already holds, byte for byte, as a reference to that key
//!   (`wire_refs`): neither the network nor any replica's log carries the value again. Applying
//!   it points the new key at the copy the source key points at on every onelog replica, whatever
//!   its `dedup.mode` ([`Dedup::reference_place`]; replicas in the other storage modes copy it).
//! - **Elastic**: inline dedup watches its hit ratio over windows of [`ELASTIC_WINDOW`] candidate
//!   values; below [`ELASTIC_OFF_RATIO`] it switches itself off (the GC still deduplicates), and
//!   while off it keeps sampling one candidate in [`ELASTIC_SAMPLE`] (fingerprint only) and
//!   switches back on above [`ELASTIC_ON_RATIO`]. Switches are logged and counted.
//!
//! **Why no reference counts.** DEDUPKV counts references to know when a shared copy becomes
//! garbage. Here the log GC already decides liveness from the trees themselves (its census walks
//! every shard's index), so a copy is live exactly while some key points at it: the counts are
//! derived by each census and cannot drift from the data trees. What sharing changes for the GC is
//! that a record no longer names every key pointing into it, and that a key may gain a locator into
//! an old segment; the GC handles both ([`Dedup::fence`], [`Dedup::take_lowest_target`], and the
//! census's rule that a segment with shared references into it is collected only from the keys
//! the census kept: `gc`).
//!
//! Not owned here: reading the log (the caller's), the index writes (the applier's and the loop's),
//! what the GC collects.

use onekv_log::{Locator, Log};
use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Candidate values per window over which elastic mode judges its hit ratio.
pub const ELASTIC_WINDOW: u64 = 4096;
/// Elastic mode turns inline dedup off when fewer than this share of a window's candidates hit.
pub const ELASTIC_OFF_RATIO: f64 = 0.02;
/// ... and on again when at least this share of the sampled candidates hit.
pub const ELASTIC_ON_RATIO: f64 = 0.05;
/// While inline dedup is off, elastic mode looks up one candidate in this many.
pub const ELASTIC_SAMPLE: u64 = 8;
/// Bytes one content-index entry is charged against `memory_bytes` (fingerprint, locator and the
/// LRU's own links and hash slot).
pub const ENTRY_BYTES: u64 = 96;
/// Bytes of late references a node holds (keys applied by reference below the GC's fence, which
/// its collection must move along: [`Dedup::reference_place`]), each charged its key's length and
/// [`LATE_KEY_OVERHEAD`]; past it a reference still applies, unrecorded, and the GC's pass keeps
/// its segments.
pub const MAX_LATE_REFERENCE_BYTES: u64 = 16 << 20;
/// Bytes charged per late reference besides its key (the vector, the map's slot).
pub const LATE_KEY_OVERHEAD: u64 = 64;

/// What one late reference is charged against [`MAX_LATE_REFERENCE_BYTES`].
fn late_key_bytes(key: &[u8]) -> u64 {
    key.len() as u64 + LATE_KEY_OVERHEAD
}

/// Where identical values are stored once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DedupMode {
    /// Every value has its own copy (the behaviour before deduplication).
    #[default]
    Off,
    /// At apply only.
    Inline,
    /// In the log GC only, when it moves values.
    Offline,
    /// In the log GC, and at apply while the measured duplicate ratio makes it worth it.
    Elastic,
}

impl DedupMode {
    /// The configuration spelling.
    pub fn name(self) -> &'static str {
        match self {
            DedupMode::Off => "off",
            DedupMode::Inline => "inline",
            DedupMode::Offline => "offline",
            DedupMode::Elastic => "elastic",
        }
    }

    /// Parses the configuration spelling.
    pub fn parse(name: &str) -> Option<DedupMode> {
        [DedupMode::Off, DedupMode::Inline, DedupMode::Offline, DedupMode::Elastic]
            .into_iter()
            .find(|mode| mode.name() == name)
    }

    /// Whether the log GC deduplicates the values it moves.
    pub fn offline(self) -> bool {
        matches!(self, DedupMode::Offline | DedupMode::Elastic)
    }
}

/// Settings of value deduplication (onelog mode only).
#[derive(Clone, Debug, PartialEq)]
pub struct DedupConfig {
    /// Where duplicates are found.
    pub mode: DedupMode,
    /// Values shorter than this are always stored as they are (a locator and a lookup cost more
    /// than they would save). At least [`DedupConfig::MIN_VALUE_BYTES`].
    pub min_value_bytes: u64,
    /// Memory the content index may use, in bytes (about [`ENTRY_BYTES`] per distinct value).
    pub memory_bytes: u64,
    /// Bits of the fingerprint kept: 128, or fewer only to force collisions (tests and the
    /// simulation check that a collision never makes a key read another value).
    pub fingerprint_bits: u32,
    /// Whether this node, leading a shard and deduplicating inline, proposes a put of a value a
    /// key of the shard holds as a reference to that key instead of the value (`wire_refs`).
    pub references: bool,
}

impl Default for DedupConfig {
    fn default() -> Self {
        DedupConfig {
            mode: DedupMode::Off,
            min_value_bytes: 1024,
            memory_bytes: 64 << 20,
            fingerprint_bits: 128,
            references: true,
        }
    }
}

impl DedupConfig {
    /// The smallest `min_value_bytes`: a shared locator is 17 bytes in the index.
    pub const MIN_VALUE_BYTES: u64 = 64;
    /// The smallest `memory_bytes` (a thousand entries or so).
    pub const MIN_MEMORY_BYTES: u64 = 1 << 17;

    /// Checks the values; an error names the first one that is off.
    pub fn validate(&self) -> Result<(), String> {
        if self.min_value_bytes < Self::MIN_VALUE_BYTES {
            return Err(format!(
                "dedup min_value_bytes = {} must be at least {}",
                self.min_value_bytes,
                Self::MIN_VALUE_BYTES
            ));
        }
        if self.memory_bytes < Self::MIN_MEMORY_BYTES {
            return Err(format!(
                "dedup memory_bytes = {} must be at least {}",
                self.memory_bytes,
                Self::MIN_MEMORY_BYTES
            ));
        }
        if !(1..=128).contains(&self.fingerprint_bits) {
            return Err(format!("dedup fingerprint_bits = {} must be 1 to 128", self.fingerprint_bits));
        }
        Ok(())
    }

    /// Entries the content index holds at most.
    fn capacity(&self) -> NonZeroUsize {
        NonZeroUsize::new((self.memory_bytes / ENTRY_BYTES).max(1) as usize).expect("at least 1")
    }
}

/// What deduplication has done since the node started (node-wide; every shard's status carries
/// the same copy).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DedupStatus {
    /// The configured mode (`off`, `inline`, `offline`, `elastic`).
    pub mode: String,
    /// Whether values are deduplicated at apply now (elastic mode switches this).
    pub inline_active: bool,
    /// Values at or above the size threshold seen at apply.
    pub candidates: u64,
    /// Values that pointed at an existing copy at apply.
    pub inline_hits: u64,
    /// Values the log GC pointed at an existing copy instead of moving them.
    pub offline_hits: u64,
    /// Keys a snapshot install pointed at a copy another key of the snapshot brought (the
    /// snapshot sent that copy once, `snapshot::copies`).
    pub snapshot_hits: u64,
    /// Fingerprint matches whose bytes differed (a collision, or a damaged copy).
    pub mismatches: u64,
    /// Puts applied here by reference to another key's value (`wire_refs`): their values
    /// crossed no network and were written to no log.
    pub references_applied: u64,
    /// References applied while their copy was below the GC's fence (moved with it).
    pub late_references: u64,
    /// Value bytes not stored again (inline, and puts by reference) or not moved again (offline).
    pub bytes_saved: u64,
    /// Entries in the content index now.
    pub entries: u64,
    /// Times elastic mode switched inline dedup off or on.
    pub switches: u64,
}

/// The node's deduplication: its content index, the GC's fence, and counters.
pub(crate) struct Dedup {
    config: DedupConfig,
    table: Mutex<Table>,
    /// No new reference may point below this log position: the log GC raises it over the segments
    /// it is about to collect (see `gc`), so nothing it counted dead gains a key meanwhile.
    fence: AtomicU64,
    /// The lowest log position a reference was made to since the GC last took it (`u64::MAX`:
    /// none); the GC's check that nothing pointed into its segments while it counted them.
    lowest_target: AtomicU64,
    inline_active: AtomicBool,
    counters: Counters,
    /// Fingerprints are masked with this: all ones, except in tests that force collisions.
    fingerprint_mask: u128,
    /// The broken variant [`crate::Mutation::DedupTrustsFingerprint`]: a fingerprint match is
    /// taken without comparing bytes.
    trusts_fingerprint: bool,
    /// Stored values at least this long are moved whole by the GC, never into a compressed
    /// block (a reference cannot point into one), whatever the mode: `u64::MAX` until this node
    /// meets a put by reference, then the shortest of its own threshold and the values referred
    /// to (a leader's `min_value_bytes` may be below this node's).
    whole_from: AtomicU64,
    /// References applied below the fence since the GC's pass began: `(shard, place)` → keys now
    /// pointing there that the pass's census did not see ([`Dedup::reference_place`]).
    late: Mutex<LateReferences>,
}

/// Late references taken from [`Dedup`]: `(shard, place, keys)`.
pub type LateKeys = Vec<(u64, Locator, Vec<Vec<u8>>)>;

#[derive(Default)]
struct LateReferences {
    keys: std::collections::HashMap<(u64, Locator), Vec<Vec<u8>>>,
    /// Bytes charged for the keys held (bounded by [`MAX_LATE_REFERENCE_BYTES`]).
    bytes: u64,
    /// A late reference was not held (the bound): the pass keeps its segments.
    overflowed: bool,
}

#[derive(Default)]
struct Counters {
    candidates: AtomicU64,
    inline_hits: AtomicU64,
    offline_hits: AtomicU64,
    snapshot_hits: AtomicU64,
    mismatches: AtomicU64,
    bytes_saved: AtomicU64,
    switches: AtomicU64,
    references_applied: AtomicU64,
    late_references: AtomicU64,
}

struct Table {
    places: lru::LruCache<u128, Locator>,
    /// Elastic mode's current window: candidates looked up, and hits among them.
    window_seen: u64,
    window_hits: u64,
    /// Candidates since inline dedup went off (one in [`ELASTIC_SAMPLE`] is looked up).
    skipped: u64,
}

/// What a lookup found for a value.
enum Found {
    /// A copy with these bytes, at this place.
    Copy(Locator),
    /// Nothing usable (the entry was replaced by the value's own place if it has one).
    Nothing,
}

impl Dedup {
    /// The node's deduplication under `config` (validated).
    pub fn new(config: DedupConfig, trusts_fingerprint: bool) -> Dedup {
        let fingerprint_mask = match config.fingerprint_bits {
            128.. => u128::MAX,
            bits => (1u128 << bits) - 1,
        };
        let inline_active = matches!(config.mode, DedupMode::Inline | DedupMode::Elastic);
        Dedup {
            table: Mutex::new(Table {
                // With the mode `off` nothing is looked up: no room is set aside.
                places: match config.mode {
                    DedupMode::Off => lru::LruCache::new(NonZeroUsize::MIN),
                    _ => lru::LruCache::new(config.capacity()),
                },
                window_seen: 0,
                window_hits: 0,
                skipped: 0,
            }),
            config,
            fence: AtomicU64::new(0),
            lowest_target: AtomicU64::new(u64::MAX),
            inline_active: AtomicBool::new(inline_active),
            counters: Counters::default(),
            fingerprint_mask,
            trusts_fingerprint,
            late: Mutex::new(LateReferences::default()),
            whole_from: AtomicU64::new(u64::MAX),
        }
    }

    fn fingerprint(&self, value: &[u8]) -> u128 {
        xxhash_rust::xxh3::xxh3_128(value) & self.fingerprint_mask
    }

    /// Whether a stored value (`crc || bytes`) of `stored_len` bytes is large enough to share
    /// (never with the mode `off`: then only keys a reference or a snapshot made share a copy).
    pub fn is_candidate(&self, stored_len: usize) -> bool {
        self.config.mode != DedupMode::Off
            && stored_len.saturating_sub(crate::codec::STORED_VALUE_PREFIX) as u64
                >= self.config.min_value_bytes
    }

    /// Whether the GC must move a stored value of `stored_len` bytes whole (a copy that is or may
    /// become shared), never into a compressed block.
    pub fn keeps_whole(&self, stored_len: usize) -> bool {
        self.is_candidate(stored_len) || stored_len as u64 >= self.whole_from.load(Ordering::Relaxed)
    }

    /// Notes that a put by reference to a stored value of `stored_len` bytes reached this node
    /// (see [`Dedup::keeps_whole`]).
    pub fn note_references_seen(&self, stored_len: u64) {
        let own = self.config.min_value_bytes.saturating_add(crate::codec::STORED_VALUE_PREFIX as u64);
        self.whole_from.fetch_min(stored_len.min(own), Ordering::Relaxed);
    }

    /// Whether this node, leading, proposes puts of values it holds as references (`wire_refs`):
    /// while it deduplicates inline.
    pub fn proposes_references(&self) -> bool {
        self.config.references
            && matches!(self.config.mode, DedupMode::Inline | DedupMode::Elastic)
            && self.inline_active.load(Ordering::Relaxed)
    }

    /// The value's fingerprint (the leader's table of values it may refer to keys by).
    pub fn fingerprint_of(&self, value: &[u8]) -> u128 {
        self.fingerprint(value)
    }

    /// Whether a value of `value_len` bytes is large enough for a reference.
    pub fn may_refer(&self, value_len: usize) -> bool {
        value_len as u64 >= self.config.min_value_bytes
    }

    /// Applying a put by reference: `key` of `shard` is about to point at `at`, the copy its
    /// source key points at (`wire_refs`). Notes the target for the GC's census, like any
    /// reference, unless the copy already lies below the fence (its segment is being collected,
    /// and the pass's census did not see `key`): then `key` is a late reference, which the loop
    /// moves along with the copy's other keys ([`Dedup::take_late_references`]), and a note would
    /// only make every later pass count again while the copy stays in the oldest segment (a
    /// recurring value keeps being referred to). Past [`MAX_LATE_REFERENCE_BYTES`] of late keys
    /// the reference still applies, unrecorded, and the pass keeps its segments
    /// ([`Dedup::take_late_references_within`]): the next census sees the key in its tree.
    pub fn reference_place(&self, shard: u64, key: &[u8], at: Locator) {
        self.note_references_seen(at.len);
        // The fence first, as in `find`: a copy above it is noted before the fence is read again,
        // so the GC sees either the note or, below the fence, the late reference.
        let below_fence = || at.position < self.fence.load(Ordering::SeqCst);
        if below_fence() || {
            self.note_target(at.position);
            below_fence()
        } {
            let mut late = self.late.lock().unwrap_or_else(|e| e.into_inner());
            let bound = crate::failpoints::late_reference_bound().unwrap_or(MAX_LATE_REFERENCE_BYTES);
            if late.bytes + late_key_bytes(key) > bound {
                late.overflowed = true;
            } else {
                late.bytes += late_key_bytes(key);
                late.keys.entry((shard, at)).or_default().push(key.to_vec());
            }
            self.counters.late_references.fetch_add(1, Ordering::Relaxed);
        }
        self.counters.references_applied.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_saved.fetch_add(at.len, Ordering::Relaxed);
        // A duplicate found before it was sent: elastic mode counts it as a hit (it never reaches
        // `inline_place`), or the window would see only the duplicates references missed.
        if self.config.mode == DedupMode::Elastic && self.inline_active.load(Ordering::Relaxed) {
            self.counters.candidates.fetch_add(1, Ordering::Relaxed);
            self.judge_window(true);
        }
    }

    /// The late references of `shard` to the copy at `at`, which the loop is moving (the keys
    /// may have been written again since: the loop checks each still points there).
    pub fn take_late_references(&self, shard: u64, at: Locator) -> Vec<Vec<u8>> {
        let mut late = self.late.lock().unwrap_or_else(|e| e.into_inner());
        if late.keys.is_empty() {
            return Vec::new();
        }
        let keys = late.keys.remove(&(shard, at)).unwrap_or_default();
        late.bytes -= keys.iter().map(|key| late_key_bytes(key)).sum::<u64>();
        keys
    }

    /// Takes the late references to copies within `range` of log positions (the segments a GC
    /// pass is collecting): `(shard, place, keys)`; `None` if more were made this pass than are
    /// held (some keys pointing into the segments are not listed: the pass must keep them).
    pub fn take_late_references_within(&self, range: std::ops::Range<u64>) -> Option<LateKeys> {
        let mut late = self.late.lock().unwrap_or_else(|e| e.into_inner());
        if late.overflowed {
            return None;
        }
        let places: Vec<(u64, Locator)> =
            late.keys.keys().filter(|(_, at)| range.contains(&at.position)).copied().collect();
        let mut taken = Vec::with_capacity(places.len());
        for (shard, at) in places {
            let keys = late.keys.remove(&(shard, at)).unwrap_or_default();
            late.bytes -= keys.iter().map(|key| late_key_bytes(key)).sum::<u64>();
            taken.push((shard, at, keys));
        }
        Some(taken)
    }

    /// Forgets the late references: the GC calls this as a pass begins, before its census, which
    /// sees every key they name in the trees.
    pub fn forget_late_references(&self) {
        *self.late.lock().unwrap_or_else(|e| e.into_inner()) = LateReferences::default();
    }

    /// At apply: a place in `log` holding exactly `stored` (a stored value: checksum and bytes),
    /// for a key about to point at `own` (the value's bytes in its entry), or `None` to keep `own`
    /// (which then becomes the value's canonical copy).
    pub fn inline_place(&self, log: &Log, stored: &[u8], own: Locator) -> Option<Locator> {
        if self.config.mode == DedupMode::Off || !self.is_candidate(stored.len()) {
            return None;
        }
        self.counters.candidates.fetch_add(1, Ordering::Relaxed);
        let fingerprint = || self.fingerprint(&stored[crate::codec::STORED_VALUE_PREFIX..]);
        if !self.inline_active.load(Ordering::Relaxed) {
            // Offline mode hashes nothing here; elastic mode samples while inline is off.
            if self.config.mode == DedupMode::Elastic {
                self.sample(fingerprint, own);
            }
            return None;
        }
        let fingerprint = fingerprint();
        let found = self.find(log, fingerprint, stored, Some(own));
        if self.config.mode == DedupMode::Elastic {
            self.judge_window(matches!(found, Found::Copy(_)));
        }
        match found {
            Found::Copy(at) => {
                self.counters.inline_hits.fetch_add(1, Ordering::Relaxed);
                self.counters.bytes_saved.fetch_add(stored.len() as u64, Ordering::Relaxed);
                Some(at)
            }
            Found::Nothing => None,
        }
    }

    /// In the GC: a place holding exactly `stored` other than the segments being collected (below
    /// the fence the GC raised), or `None`. Records nothing: the GC calls [`Dedup::remember`] for
    /// the copy it writes instead.
    pub fn offline_place(&self, log: &Log, stored: &[u8]) -> Option<Locator> {
        if !self.config.mode.offline() || !self.is_candidate(stored.len()) {
            return None;
        }
        let fingerprint = self.fingerprint(&stored[crate::codec::STORED_VALUE_PREFIX..]);
        match self.find(log, fingerprint, stored, None) {
            Found::Copy(at) => {
                self.count_offline_hit(stored.len());
                Some(at)
            }
            Found::Nothing => None,
        }
    }

    /// The configured mode.
    pub fn mode(&self) -> DedupMode {
        self.config.mode
    }

    /// Counts a value the GC found twice among those it moves at once (it writes one copy).
    pub fn count_offline_hit(&self, stored_len: usize) {
        self.counters.offline_hits.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_saved.fetch_add(stored_len as u64, Ordering::Relaxed);
    }

    /// Counts a key a snapshot install pointed at a copy of `stored_len` bytes another key of the
    /// snapshot brought.
    pub fn count_snapshot_hit(&self, stored_len: u64) {
        self.counters.snapshot_hits.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_saved.fetch_add(stored_len, Ordering::Relaxed);
    }

    /// Records `at` as the canonical copy of `stored` (a copy the GC just wrote).
    pub fn remember(&self, stored: &[u8], at: Locator) {
        if self.config.mode == DedupMode::Off || !self.is_candidate(stored.len()) {
            return;
        }
        let fingerprint = self.fingerprint(&stored[crate::codec::STORED_VALUE_PREFIX..]);
        self.table().places.put(fingerprint, at);
    }

    /// Looks `fingerprint` up and confirms a candidate copy by its bytes; on a miss, `own` (if
    /// any) becomes the entry.
    fn find(&self, log: &Log, fingerprint: u128, stored: &[u8], own: Option<Locator>) -> Found {
        let candidate = self.table().places.get(&fingerprint).copied();
        if let Some(at) = candidate
            && Some(at) != own
            && at.len == stored.len() as u64
        {
            // The fence first: below it the GC may be deleting the segment as we read. A reference
            // is noted before the fence is read again, so the GC sees either the fence's effect
            // or the note (a lookup the fence already refuses notes nothing).
            let above_fence = || at.position >= self.fence.load(Ordering::SeqCst);
            if above_fence() && {
                self.note_target(at.position);
                above_fence()
            } {
                let same = self.trusts_fingerprint || log.read(at).is_ok_and(|bytes| bytes == stored);
                if same {
                    return Found::Copy(at);
                }
                self.counters.mismatches.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(own) = own {
            self.table().places.put(fingerprint, own);
        }
        Found::Nothing
    }

    /// Records that a reference to `position` may be made (before the fence is read, so the GC
    /// sees either the fence's effect or the target: [`Dedup::take_lowest_target`]).
    fn note_target(&self, position: u64) {
        self.lowest_target.fetch_min(position, Ordering::SeqCst);
    }

    /// Elastic mode while inline dedup is off: one candidate in [`ELASTIC_SAMPLE`] is looked up by
    /// fingerprint alone (no read), to see whether duplicates came back.
    fn sample(&self, fingerprint: impl FnOnce() -> u128, own: Locator) {
        let mut table = self.table();
        table.skipped += 1;
        if !table.skipped.is_multiple_of(ELASTIC_SAMPLE) {
            return;
        }
        let fingerprint = fingerprint();
        let hit = table.places.get(&fingerprint).is_some();
        if !hit {
            table.places.put(fingerprint, own);
        }
        drop(table);
        self.judge_window(hit);
    }

    /// Counts one looked-up candidate in elastic mode's window, and switches inline dedup at the
    /// window's end when its hit ratio says so.
    fn judge_window(&self, hit: bool) {
        let mut table = self.table();
        table.window_seen += 1;
        table.window_hits += u64::from(hit);
        let window = if self.inline_active.load(Ordering::Relaxed) {
            ELASTIC_WINDOW
        } else {
            ELASTIC_WINDOW / ELASTIC_SAMPLE
        };
        if table.window_seen < window {
            return;
        }
        let ratio = table.window_hits as f64 / table.window_seen as f64;
        table.window_seen = 0;
        table.window_hits = 0;
        drop(table);
        let active = self.inline_active.load(Ordering::Relaxed);
        let switch_to = match active {
            true if ratio < ELASTIC_OFF_RATIO => Some(false),
            false if ratio >= ELASTIC_ON_RATIO => Some(true),
            _ => None,
        };
        if let Some(on) = switch_to {
            self.inline_active.store(on, Ordering::Relaxed);
            self.counters.switches.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                duplicate_ratio = ratio,
                "inline dedup switched {}; the log GC still deduplicates what it moves",
                if on { "on" } else { "off" }
            );
        }
    }

    /// The GC raises the fence to `position` before collecting the segments below it: from then
    /// on no reference is made below it (a reference decided before shows in
    /// [`Dedup::take_lowest_target`] once the loop has finished the turn it was decided in).
    pub fn raise_fence(&self, position: u64) {
        self.fence.fetch_max(position, Ordering::SeqCst);
    }

    /// The lowest position a reference was made to since the last call (`u64::MAX`: none), and
    /// starts counting again.
    pub fn take_lowest_target(&self) -> u64 {
        self.lowest_target.swap(u64::MAX, Ordering::SeqCst)
    }

    /// The counters and the content index's size.
    pub fn status(&self) -> DedupStatus {
        let c = &self.counters;
        DedupStatus {
            mode: self.config.mode.name().to_owned(),
            inline_active: self.inline_active.load(Ordering::Relaxed),
            candidates: c.candidates.load(Ordering::Relaxed),
            inline_hits: c.inline_hits.load(Ordering::Relaxed),
            offline_hits: c.offline_hits.load(Ordering::Relaxed),
            snapshot_hits: c.snapshot_hits.load(Ordering::Relaxed),
            mismatches: c.mismatches.load(Ordering::Relaxed),
            references_applied: c.references_applied.load(Ordering::Relaxed),
            late_references: c.late_references.load(Ordering::Relaxed),
            bytes_saved: c.bytes_saved.load(Ordering::Relaxed),
            entries: self.table().places.len() as u64,
            switches: c.switches.load(Ordering::Relaxed),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dedup(min_value_bytes: u64) -> Dedup {
        Dedup::new(DedupConfig { mode: DedupMode::Off, min_value_bytes, ..DedupConfig::default() }, false)
    }

    #[test]
    fn a_reference_below_the_fence_is_a_late_reference_and_holds_no_pass_back() {
        let dedup = dedup(1024);
        dedup.raise_fence(1000);
        let below = Locator { position: 10, len: 100 };
        dedup.reference_place(1, b"late", below);
        // Noted, it would make every pass "count again" while the copy stays the oldest.
        assert_eq!(dedup.take_lowest_target(), u64::MAX);
        assert_eq!(
            dedup.take_late_references_within(0..1000),
            Some(vec![(1, below, vec![b"late".to_vec()])])
        );
        let above = Locator { position: 2000, len: 100 };
        dedup.reference_place(1, b"noted", above);
        assert_eq!(dedup.take_lowest_target(), 2000);
        assert_eq!(dedup.take_late_references_within(0..u64::MAX), Some(Vec::new()));
    }

    #[test]
    fn past_their_bound_late_references_still_apply_and_the_pass_keeps_its_segments() {
        let dedup = dedup(1024);
        dedup.raise_fence(1000);
        let key = vec![b'k'; 1 << 20];
        for position in 0..=(MAX_LATE_REFERENCE_BYTES >> 20) {
            dedup.reference_place(1, &key, Locator { position, len: 100 });
        }
        assert!(dedup.late.lock().unwrap().bytes <= MAX_LATE_REFERENCE_BYTES);
        assert_eq!(dedup.take_late_references_within(0..1000), None);
        // The next pass's census sees the keys in the trees.
        dedup.forget_late_references();
        assert_eq!(dedup.take_late_references_within(0..1000), Some(Vec::new()));
    }

    #[test]
    fn a_node_that_met_a_reference_moves_values_that_long_whole() {
        let dedup = dedup(4096);
        let stored = |value_len: usize| crate::codec::STORED_VALUE_PREFIX + value_len;
        assert!(!dedup.keeps_whole(stored(8192)), "mode off, no reference met");
        dedup.note_references_seen(stored(1024) as u64);
        assert!(dedup.keeps_whole(stored(1024)), "a leader's threshold below this node's");
        assert!(dedup.keeps_whole(stored(8192)));
        assert!(!dedup.keeps_whole(stored(1023)));
    }
}
