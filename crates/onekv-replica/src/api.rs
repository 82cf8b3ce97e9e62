//! The replica's public surface: configuration, commands, outcomes, errors and the handle.

use std::path::PathBuf;
use std::time::Duration;

pub use raft::eraftpb::Message;

/// Which bytes go where on disk; the same binary runs all three so every claim is measured side by
/// side (DESIGN.md §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StorageMode {
    /// One log per node holds Raft entries; the index points at value bytes inside them.
    #[default]
    OneLog,
    /// Raft entries in one log; applying copies each value into a second log the index points at.
    Separated,
    /// Raft entries in a tree with its own write-ahead log; values inline in a data tree with its
    /// own write-ahead log (TiKV-like).
    Classic,
}

impl StorageMode {
    /// The name used in configuration files and status output.
    pub fn name(self) -> &'static str {
        match self {
            StorageMode::OneLog => "onelog",
            StorageMode::Separated => "separated",
            StorageMode::Classic => "classic",
        }
    }

    /// The logs of this mode, by directory name inside the data directory: the Raft log first,
    /// then the second log if the mode has one.
    pub fn log_names(self) -> &'static [&'static str] {
        match self {
            StorageMode::OneLog => &["log"],
            StorageMode::Separated => &["log", "values"],
            StorageMode::Classic => &["raft-wal", "data-wal"],
        }
    }

    /// Parses a name as [`StorageMode::name`] prints it.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "onelog" => Some(StorageMode::OneLog),
            "separated" => Some(StorageMode::Separated),
            "classic" => Some(StorageMode::Classic),
            _ => None,
        }
    }
}

/// Largest snapshot a replica builds to send whole, in one Raft message, in bytes of snapshot data
/// (every key and value, framed): only a simulation does (a running node streams snapshots in
/// chunks of `snapshot_chunk_bytes`, whatever their size). The server's peer message limit is still
/// derived from it, which leaves room for the largest Raft entry and any chunk.
pub const MAX_SNAPSHOT_BYTES: usize = 200 << 20;

/// Bounds on what one request may carry. Anything over a bound is rejected with
/// [`ReplicaError::InvalidArgument`] before it reaches Raft.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest key, in bytes (keys must also be non-empty).
    pub max_key_bytes: usize,
    /// Longest value, in bytes.
    pub max_value_bytes: usize,
    /// Most operations in one batch.
    pub max_batch_ops: usize,
    /// Most key and value bytes in one batch or write.
    pub max_batch_bytes: usize,
    /// Most pairs one scan returns.
    pub max_scan_pairs: usize,
    /// Most key and value bytes one scan returns (it stops early, with `more` set).
    pub max_scan_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_bytes: 4 << 10,
            max_value_bytes: 1 << 20,
            max_batch_ops: 16_384,
            max_batch_bytes: 4 << 20,
            max_scan_pairs: 10_000,
            max_scan_bytes: 4 << 20,
        }
    }
}

/// How a replica runs. The server builds this from its configuration file and validates it there;
/// [`Replica::open`] checks it again before touching any data.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// This node's id (non-zero).
    pub node_id: u64,
    /// The shards this node holds a replica of, each with the ids of its voting members (this node
    /// included) when the cluster is first created, or none for a replica that waits to be added
    /// to a running shard. The voters are ignored once the shard's Raft state is on disk (its
    /// members are then the replicated ones). At most [`MAX_SHARDS_PER_NODE`].
    pub shards: Vec<ShardConfig>,
    /// Where the log(s) and the index live.
    pub data_dir: PathBuf,
    /// See [`StorageMode`]. Fixed when the data directory is created.
    pub storage: StorageMode,
    /// Interval of Raft's logical clock.
    pub tick: Duration,
    /// Ticks without a heartbeat before a follower campaigns.
    pub election_ticks: usize,
    /// Ticks between leader heartbeats.
    pub heartbeat_ticks: usize,
    /// Whether a leader a quorum confirmed within the last `election_ticks - 2` ticks answers
    /// linearizable reads without a ReadIndex round (`lease`); a replica that opens then refuses
    /// votes for `election_ticks` ticks. Assumes clocks whose rates differ by far less than a tick
    /// in `election_ticks`, and the same `tick` and `election_ticks` on every node. Needs
    /// `election_ticks` of at least 3.
    pub lease_reads: bool,
    /// Whether this node takes fast writes (`Replica::fast_write`, the fast path: blind writes
    /// durable on a fast quorum of the voters in one round trip, ordered by the leader
    /// afterwards; onelog mode only). The server's `cluster.fast_path`.
    pub fast_path: bool,
    /// Request bounds.
    pub limits: Limits,
    /// Flush an index tree's memtable once it holds this many bytes (the trees of the shards this
    /// node leads or is the primary of; and every tree under [`IndexLayout::Uniform`] or when
    /// `follower_memtable_bytes` is 0).
    pub memtable_bytes: u64,
    /// Under [`IndexLayout::Decoupled`]: bytes the memtables of all the shards this node only
    /// follows may hold together; once they do, the largest is flushed (DEPART's memtable shared by
    /// the redundant copies). So their memory is bounded whatever the number of shards, and a busy
    /// followed shard gets more of it than an idle one (larger, fewer runs). 0: each followed
    /// shard's tree flushes at `memtable_bytes` on its own, as a leader's does.
    pub follower_memtable_bytes: u64,
    /// Flush the index once this many entries were applied since the last flush, however few
    /// bytes they wrote (bounds the replay after a crash and Raft's in-memory metadata).
    pub flush_every_entries: u64,
    /// Flush the index at least this often while entries are applied.
    pub flush_every: Duration,
    /// Largest snapshot this node builds to send whole, in one message, in bytes of keys and
    /// values; at most [`MAX_SNAPSHOT_BYTES`], which is what peers accept. Only a simulation
    /// (driven mode) sends snapshots whole: a running node streams them in chunks of
    /// `snapshot_chunk_bytes`, whatever their size.
    pub max_snapshot_bytes: usize,
    /// Bytes of keys and values a follower asks for in one chunk of a streamed snapshot (cut to
    /// half the log's record limit: each chunk is stored as it arrives, in records of its own);
    /// between [`SNAPSHOT_CHUNK_BYTES_RANGE`]'s bounds.
    pub snapshot_chunk_bytes: usize,
    /// Whether a follower fetches a streamed snapshot from another replica of its shard than the
    /// leader when one is up to date (at the snapshot's index or later), sparing the leader,
    /// which serves the clients, the reads and sends; the leader's snapshot is the fallback.
    pub snapshot_from_followers: bool,
    /// Bytes per second this node's snapshot fetches store at most, all together (0: as fast as
    /// they can): a node catching up leaves the rest of its disk, CPU and network, and its
    /// senders', to the clients, at the cost of a longer catch-up.
    pub snapshot_fetch_bytes_per_sec: u64,
    /// Raft entries kept below the applied index for lagging followers before the Raft log is
    /// compacted (older entries are sent as a snapshot).
    pub raft_log_keep_entries: u64,
    /// Size of one log segment file.
    pub segment_bytes: u64,
    /// Reclaimed segment files each log keeps to reuse as later segments (cheaper group-commit
    /// fsyncs; `onekv_log::LogConfig::recycled_segments`), at most
    /// [`onekv_log::MAX_RECYCLED_SEGMENTS`]; 0 deletes them. None are kept while the disk-full
    /// alarm is raised.
    pub recycled_segments: u32,
    /// Largest log record (default the log's, 16 MiB): a Raft entry must fit in one, so it bounds
    /// `limits.max_batch_bytes`, and snapshot chunks and relocated batches are cut to half of it
    /// ([`crate::records::chunk_bytes`]). Smaller only where small segments are wanted (the
    /// simulation, so its log GC reclaims constantly); servers keep the default.
    pub max_record_bytes: u32,
    /// How long a follower may stay waiting for a snapshot before the leader gives up on that send
    /// and tries again (a snapshot lost by the transport would otherwise stall that follower).
    pub snapshot_timeout: Duration,
    /// Whether index trees are compacted after flushes (off only to measure write amplification
    /// "before any compaction", as the papers do).
    pub index_compaction: bool,
    /// Below this many usable bytes on the data directory's file system the "disk full" alarm is
    /// raised: a leader refuses new writes with [`ReplicaError::DiskFull`] and hands leadership
    /// away; reads go on. 0 disables the alarm.
    pub min_free_bytes: u64,
    /// Size of the reserve file kept in the data directory and deleted when the disk is nearly full
    /// or the replica fails, so flushes, the last hard state and recovery find room. 0: none.
    pub reserve_bytes: u64,
    /// Bytes per second the background scrub reads to verify every stored value's checksum (so
    /// damage is found before a read or a snapshot build hits it); 0 disables the scrub. Never
    /// runs in a simulation (driven mode), whose outcome must not depend on a thread's timing.
    pub scrub_bytes_per_sec: u64,
    /// The log garbage collector: bounded disk in every mode. Never runs in a simulation (driven
    /// mode) yet.
    pub gc: crate::GcConfig,
    /// Passes of each leader's expiry sweep (which deletes expired keys through Raft) begin at
    /// least this far apart, by the leader's clock.
    pub expiry_sweep_interval: Duration,
    /// How each shard's index tree is shaped: by this node's role in the shard (DEPART's replica
    /// decoupling), or leveled for every shard.
    pub index_layout: IndexLayout,
    /// Identical values stored once (onelog mode only; `docs/design/replica.md`, "Deduplication").
    pub dedup: crate::DedupConfig,
}

impl ReplicaConfig {
    /// The sizes `segment_bytes` may take (inclusive): a segment must hold the largest log record
    /// the replica writes (the log's default record limit, 16 MiB, plus the segment's and the
    /// record's headers), and the log addresses at most 1 GiB in a segment. The log's own rule, so
    /// configuration layers report what opening the log would refuse.
    pub const SEGMENT_BYTES_RANGE: (u64, u64) = (
        onekv_log::LogConfig::min_segment_bytes(onekv_log::DEFAULT_MAX_RECORD_BYTES),
        onekv_log::MAX_SEGMENT_BYTES,
    );

    /// A configuration with default tuning for `node_id` holding one shard
    /// ([`SINGLE_SHARD`]) replicated on `voters`.
    pub fn new(node_id: u64, voters: Vec<u64>, data_dir: impl Into<PathBuf>) -> Self {
        ReplicaConfig {
            node_id,
            shards: vec![ShardConfig { id: SINGLE_SHARD, voters, primary: None }],
            data_dir: data_dir.into(),
            storage: StorageMode::default(),
            tick: Duration::from_millis(100),
            election_ticks: 10,
            heartbeat_ticks: 2,
            lease_reads: false,
            fast_path: false,
            limits: Limits::default(),
            memtable_bytes: 16 << 20,
            follower_memtable_bytes: 256 << 20,
            flush_every_entries: 100_000,
            flush_every: Duration::from_secs(300),
            max_snapshot_bytes: MAX_SNAPSHOT_BYTES,
            snapshot_chunk_bytes: 4 << 20,
            snapshot_from_followers: true,
            snapshot_fetch_bytes_per_sec: 0,
            raft_log_keep_entries: 10_000,
            segment_bytes: 64 << 20,
            recycled_segments: 1,
            max_record_bytes: onekv_log::DEFAULT_MAX_RECORD_BYTES,
            index_compaction: true,
            snapshot_timeout: Duration::from_secs(30),
            min_free_bytes: 256 << 20,
            reserve_bytes: 64 << 20,
            scrub_bytes_per_sec: 8 << 20,
            gc: crate::GcConfig::default(),
            expiry_sweep_interval: crate::expiry::DEFAULT_PASS_INTERVAL,
            index_layout: IndexLayout::default(),
            dedup: crate::DedupConfig::default(),
        }
    }
}

/// Which shape each shard's index tree is kept in ([`onekv_index::Layout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexLayout {
    /// Replica decoupling (DEPART): the tree of a shard this node leads, or is the primary
    /// (preferred leader) of, is leveled, since it serves the shard's reads; the tree of a shard it
    /// only follows keeps up to `follower_runs` flushed sorted runs before merging them (1 to
    /// [`onekv_index::MAX_RUNS`]), which costs less compaction. A node that becomes a shard's
    /// leader levels that tree while it serves.
    Decoupled {
        /// DEPART's `S`.
        follower_runs: u8,
    },
    /// Every tree leveled, whatever the role: the behaviour before decoupling, for comparison.
    Uniform,
}

impl IndexLayout {
    /// The default `S` of [`IndexLayout::Decoupled`] (docs/benchmarks/depart.md).
    pub const DEFAULT_FOLLOWER_RUNS: u8 = 8;
    /// The largest `follower_runs` ([`onekv_index::MAX_RUNS`]).
    pub const MAX_FOLLOWER_RUNS: u8 = onekv_index::MAX_RUNS;

    /// The layout of a tree whose replica leads the shard or is its primary (`serves`), or not.
    pub fn for_role(self, serves: bool) -> onekv_index::Layout {
        match self {
            IndexLayout::Decoupled { follower_runs } if !serves => onekv_index::Layout::Runs(follower_runs),
            _ => onekv_index::Layout::Leveled,
        }
    }
}

impl Default for IndexLayout {
    fn default() -> Self {
        IndexLayout::Decoupled { follower_runs: Self::DEFAULT_FOLLOWER_RUNS }
    }
}

/// Most shards one node holds a replica of.
pub const MAX_SHARDS_PER_NODE: usize = 1024;

/// The shard id [`ReplicaConfig::new`] gives a node's only shard (a cluster of one shard).
pub const SINGLE_SHARD: u64 = 1;

/// One shard a node holds a replica of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardConfig {
    /// The shard's id (non-zero); every record of its group in the log carries it.
    pub id: u64,
    /// Its voting members when the cluster is created, this node included; empty for a replica
    /// that waits to be added to a running shard as a learner.
    pub voters: Vec<u64>,
    /// Its preferred leader (the placement's primary): a leader that is not the primary hands
    /// leadership to it once the primary is caught up, so leaders stay spread over the nodes.
    /// `None`: whoever wins an election keeps leading.
    pub primary: Option<u64>,
}

/// A client's request id: a retried write with the same id is applied at most once while it is
/// in the replica's window of recent requests. `seq == 0` means "no id".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId {
    /// Chosen at random by each client.
    pub client: u64,
    /// Increases with each request of that client.
    pub seq: u64,
}

/// One operation of a write: put `key = value`, or delete `key` when `value` is `None`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteOp {
    /// The key.
    pub key: Vec<u8>,
    /// The new value; `None` deletes.
    pub value: Option<Vec<u8>>,
    /// When a put's key expires (a delete ignores it).
    pub expiry: Expiry,
}

impl WriteOp {
    /// A put of `value` that never expires.
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> WriteOp {
        WriteOp { key: key.into(), value: Some(value.into()), expiry: Expiry::Never }
    }

    /// A delete of `key`.
    pub fn delete(key: impl Into<Vec<u8>>) -> WriteOp {
        WriteOp { key: key.into(), value: None, expiry: Expiry::Never }
    }
}

/// A key's value and when it expires (ms since the Unix epoch; `None`: never).
pub type ValueWithExpiry = (Vec<u8>, Option<u64>);

/// Keys one page of a range deletion deletes when its request names no limit: a page is one
/// entry, applied in one go on every replica, so it stays small enough not to hold up the shard's
/// other writes (about a millisecond of index work).
pub const RANGE_DELETE_PAGE_KEYS: u32 = 1024;

/// A page of a range deletion also ends once its keys add up to this many bytes, whatever its
/// limit: a constant of the code, not of a node's configuration, so every replica cuts the page at
/// the same key; it keeps the page's write (and a classic-mode data-WAL record) far below a log
/// record's size even for keys of the largest size allowed.
pub const RANGE_DELETE_PAGE_KEY_BYTES: usize = 1 << 20;

/// When a key written by a put expires. Times are in ms since the Unix epoch; a relative one is
/// made absolute by the shard's leader when it proposes the command (from the entry's own time),
/// so every replica applies the same time. An expired key reads as absent and is deleted later
/// through Raft.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Expiry {
    /// The key never expires (any expiry it had is dropped: Redis's `SET`).
    #[default]
    Never,
    /// The key expires at this time. A time already past is allowed: the key reads as absent.
    At(u64),
    /// The key expires this many ms after the time of the entry that writes it (a client's TTL;
    /// the entry carries the absolute time, [`Expiry::At`]).
    AfterMs(u64),
    /// The key keeps the expiry it has when the command applies (none if it is absent or expired):
    /// Redis's `KEEPTTL`, and what `INCR` or `APPEND` do.
    Keep,
}

/// A command that goes through Raft.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Puts and deletes applied atomically.
    Write(Vec<WriteOp>),
    /// Compare-and-swap: if the key's value equals `expected` (`None`: the key must be absent),
    /// set it to `new` (`None`: delete it).
    Cas {
        /// The key.
        key: Vec<u8>,
        /// The value the key must have.
        expected: Option<Vec<u8>>,
        /// The value to set.
        new: Option<Vec<u8>>,
        /// When the new value expires (ignored when `new` is `None`).
        new_expiry: Expiry,
    },
    /// A conditional transaction: if every condition holds (each key currently has its expected
    /// value), apply every op atomically, as one write; otherwise change nothing. The outcome's
    /// `cas.swapped` says which. A transaction with no ops checks its conditions and writes
    /// nothing (a consistent multi-key read, validated at one point of the log).
    Txn {
        /// Values keys must have, all at once.
        conditions: Vec<Condition>,
        /// Puts and deletes applied together when the conditions hold.
        ops: Vec<WriteOp>,
    },
    /// One page of a range deletion: deletes the first `limit` keys (at most) with
    /// `start <= key < end` (`end` `None`: no end), except those beginning with `spare` (when not
    /// empty), as one write. Each replica finds the keys in its own index, at the entry's place in
    /// the log, so every replica deletes the same ones and the entry carries no key. The outcome's
    /// [`Outcome::range`] says how many it deleted and where the next page starts. A range of any
    /// size is deleted page by page (the client's `delete_range` does it), so applying one entry
    /// stays bounded and the node's other writes go on between pages.
    DeleteRange {
        /// The first key of the range (inclusive).
        start: Vec<u8>,
        /// The end of the range (exclusive); `None`: no end.
        end: Option<Vec<u8>>,
        /// The most keys this page deletes (`1..=max_batch_ops`).
        limit: u32,
        /// Keys with this prefix are left as they are (the server's own keys); empty: none.
        spare: Vec<u8>,
    },
}

/// One condition of a [`Command::Txn`]: `key` currently holds `expected` (`None`: it is absent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    /// The key.
    pub key: Vec<u8>,
    /// The value it must have.
    pub expected: Option<Vec<u8>>,
}

/// What a committed command did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The Raft index the command was committed at.
    pub index: u64,
    /// For a compare-and-swap: whether it swapped, and the key's value afterwards. For a
    /// transaction: whether its conditions held and its ops were applied (`swapped`; `current` is
    /// always `None`).
    pub cas: Option<CasOutcome>,
    /// For a page of a range deletion: what it deleted and where the next page starts.
    pub range: Option<RangeDeletion>,
}

impl Outcome {
    /// The outcome of a command that reports nothing but where it was committed.
    pub fn at(index: u64) -> Self {
        Outcome { index, cas: None, range: None }
    }

    /// The outcome of a compare-and-swap or transaction committed at `index`.
    pub fn swap(index: u64, cas: CasOutcome) -> Self {
        Outcome { index, cas: Some(cas), range: None }
    }
}

/// What one page of a range deletion ([`Command::DeleteRange`]) did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeDeletion {
    /// Keys it deleted.
    pub deleted: u64,
    /// Where the next page starts (inclusive) when the range may hold more keys; `None` when the
    /// page reached the range's end. A retry answered from the window of recent requests says the
    /// page's own start again (its count is then 0): re-running a page is harmless.
    pub resume: Option<Vec<u8>>,
}

/// The result of a compare-and-swap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CasOutcome {
    /// Whether the new value was set.
    pub swapped: bool,
    /// The key's value after the operation.
    pub current: Option<Vec<u8>>,
}

/// A deliberately broken behaviour of the replica, for showing that the deterministic simulation
/// catches it. Only [`crate::Replica::open_driven`] accepts one; a server never runs one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// A read barrier succeeds at once on any replica, without confirming leadership through
    /// ReadIndex or waiting for the applied index: "linearizable" reads may be stale.
    ReadsWithoutReadIndex,
    /// The log GC deletes a segment without waiting for the flush that makes the moved values'
    /// new locators durable (driven mode's collector only).
    GcReclaimsBeforeFlush,
    /// A replica that lost its Raft state (a wiped data directory) votes at once, as if it held
    /// the log it acknowledged, instead of waiting until it has caught up.
    VotesWhileRejoining,
    /// A restarted replica takes the shard's members from its configuration (those it was
    /// created with) instead of the replicated ones: it forgets every membership change.
    MembersFromConfig,
    /// A replica added again to a node that removed it reuses the removed replica's trees (their
    /// data, recovery point and members) instead of starting from fresh ones.
    ReplicaReusesRetiredTrees,
    /// Applying a deletion of expired keys deletes every key it names, without checking that the
    /// key is still expired at the entry's time: a key written again after the leader's sweep
    /// found it expired, but before the deletion applied, is lost.
    DeletesExpiredUnchecked,
    /// Deduplication points a key at a copy whose fingerprint matches without comparing its
    /// bytes: with fingerprints cut short (a forced collision), a key reads another value.
    DedupTrustsFingerprint,
    /// A leader proposes a put by reference to a key that an entry it proposed earlier, not yet
    /// applied, writes (`wire_refs`): the put takes whatever that entry leaves there.
    ReferencesIgnoreUnapplied,
    /// The log GC treats a segment deduplicated keys point into like any other: it finds the
    /// live values of a segment it reads whole only from the keys its records name, and raises
    /// no fence against new references (driven mode's collector only).
    GcIgnoresSharedValues,
    /// A range deletion's page finds its keys in the index as it was when the batch of entries
    /// being applied began, missing the keys written by earlier entries of the same batch: replicas
    /// that apply the log in different batches delete different keys.
    RangePageReadsBatchStart,
    /// A snapshot install resolves a key sent as a reference to an earlier key's value by reading
    /// that key as published (the state before the snapshot) instead of as the install wrote it:
    /// the key gets the earlier key's old value, or the install fails.
    InstallResolvesReferencesAsPublished,
    /// A read lease, once a round confirmed it, lasts as long as the node leads (raft-rs's
    /// `LeaseBased` reads): a leader whose Raft clock stalls never notices it lost its quorum and
    /// keeps answering reads after a new leader was elected and took writes.
    LeaseIgnoresTime,
    /// Applying an ORDER applies a fast write whose id the window already holds (the Raft path,
    /// or an earlier ORDER, applied it): the write takes effect twice, the second time over later
    /// writes of its key.
    OrderSkipsWindow,
    /// A new leader whose fast quorum is below every voter (R = 5) recovers the fast writes of
    /// older terms from its own pending set only, without gathering a majority's: a write done on
    /// four of five voters, the new leader not among them, is lost.
    FastRecoversWithoutGather,
}

/// Why a request failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplicaError {
    /// This node is not the leader; `leader` is the leader's id when known.
    #[error("not the leader (leader: {leader:?})")]
    NotLeader {
        /// The leader's node id, if this node knows it.
        leader: Option<u64>,
    },
    /// The request is malformed or over a limit.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The proposal was dropped (for example by a leader change) before it committed; retrying
    /// with the same request id is safe.
    #[error("dropped before commit: {0}")]
    Dropped(String),
    /// The replica is shutting down.
    #[error("the replica is stopping")]
    Stopping,
    /// The disk failed; the replica serves no more writes.
    #[error("storage failure: {0}")]
    Storage(String),
    /// The configuration or the data directory cannot be used.
    #[error("cannot open: {0}")]
    Open(String),
    /// A retry (same request id) of a compare-and-swap or transaction that took no effect when it
    /// was first evaluated, at entry `index`, while the values it compares now match: its first
    /// answer ("not swapped") may have reached the client, so it can neither swap now nor answer
    /// "not swapped" consistently. Read again and ask with a new request id.
    #[error(
        "this request was evaluated at entry {index} and took no effect (a compare-and-swap that did not swap, \
         or a transaction whose conditions failed); the values it compares have matched since, so the \
         retry cannot be answered: read again and retry with a new request id"
    )]
    AlreadyEvaluated {
        /// The entry that first evaluated the request.
        index: u64,
    },
    /// The leader's disk is nearly full (its "disk full" alarm is raised): new writes are refused
    /// until space is freed, while leadership moves to a node with room. Reads go on.
    #[error("disk full: {0}")]
    DiskFull(String),
    /// This node's stored copy of `key`'s value is damaged (it does not match its checksum): the
    /// bytes at `position` in its log changed after they were written. Only this key's reads on
    /// this node fail; other replicas hold their own copies.
    #[error(
        "the stored value of key {:?} at log position {position} is damaged on this node (it does not match its checksum)",
        String::from_utf8_lossy(key)
    )]
    Corrupt {
        /// The key whose value is damaged.
        key: Vec<u8>,
        /// Where the damaged value starts in the log locators point into (`log`, or `values` in
        /// separated mode).
        position: u64,
    },
}

/// A snapshot of a replica's state, for `status` and tests.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplicaStatus {
    /// This node.
    pub node_id: u64,
    /// The shard this replica belongs to.
    pub shard: u64,
    /// Voting members (of the new configuration while the shard is joint).
    pub voters: Vec<u64>,
    /// Non-voting members (catching up before they are promoted).
    pub learners: Vec<u64>,
    /// While the shard is between two configurations (joint consensus): the old configuration's
    /// voters, who must agree too until the leader leaves it. Empty otherwise.
    pub outgoing_voters: Vec<u64>,
    /// The leader this node knows of.
    pub leader_id: Option<u64>,
    /// Current Raft term.
    pub term: u64,
    /// "leader", "follower", "candidate" or "pre-candidate".
    pub role: String,
    /// Raft commit index.
    pub commit_index: u64,
    /// Highest index applied to the index trees.
    pub applied_index: u64,
    /// First Raft index still available in this node's Raft log.
    pub first_index: u64,
    /// Last Raft index in this node's Raft log.
    pub last_index: u64,
    /// The lowest flush flag of the index trees: how far the index is persisted.
    pub flushed_index: u64,
    /// The storage mode.
    pub storage: StorageMode,
    /// Bytes in the data directory's log files now.
    pub log_bytes: u64,
    /// Bytes the replica wrote to disk since it started (logs and index tables).
    pub bytes_written: u64,
    /// User payload bytes (keys and values) applied since the replica started.
    pub user_bytes: u64,
    /// Log records the recovery at open read: bounded by the recovery point of the last index
    /// flush, not by the size of the log.
    pub recovery_records: u64,
    /// Committed entries the recovery at open replayed into this shard's index tree (those above
    /// its flush flag).
    pub recovery_replayed: u64,
    /// The storage failure that stopped this replica's writes, if one did: it then takes no part in
    /// replication until restarted (the log refuses every write after a failed fsync).
    pub failure: Option<String>,
    /// Whether this replica is rejoining its group after losing its Raft state (a new or wiped
    /// data directory): until it has caught up it votes for no candidate that has entries.
    pub rejoining: bool,
    /// Times this node learned of a new leader (another node, or a new term's) since it started.
    pub leader_changes: u64,
    /// Each log of the data directory, by directory name, with its counters since open.
    pub logs: Vec<LogStatus>,
    /// Memtable flushes of the index trees since the replica started.
    pub index_flushes: u64,
    /// Compaction steps that changed an index tree since the replica started.
    pub index_compactions: u64,
    /// Bytes of tables and manifests the index wrote since the replica started.
    pub index_bytes_written: u64,
    /// Bytes in the active memtable of the shard's index tree (not yet flushed).
    pub memtable_bytes: u64,
    /// The layout the shard's tree is kept in now: `leveled` or `runs` (`IndexLayout`).
    pub index_layout: String,
    /// Sorted runs of the shard's tree on disk (L0 tables and non-empty deeper levels).
    pub index_sorted_runs: u64,
    /// Whether the shard's tree is in the leveled form (a leveled compaction step found nothing to
    /// do since the last flush).
    pub index_leveled: bool,
    /// How long the last change of this shard's tree from runs to leveled took (it began when this
    /// node started serving the shard), in milliseconds.
    pub last_leveling_ms: Option<u64>,
    /// Memtable flushes of followed shards' trees started because their memtables together held
    /// `ReplicaConfig::follower_memtable_bytes`, node-wide, since the replica started.
    pub index_budget_flushes: u64,
    /// Bytes written by compactions of leveled trees, node-wide, since the replica started.
    pub index_leveled_compaction_bytes: u64,
    /// Bytes written by compactions of runs-layout trees, node-wide, since the replica started.
    pub index_runs_compaction_bytes: u64,
    /// On a leader: each other member's replication progress (a follower that is catching up,
    /// waiting for a snapshot, or stuck shows here).
    pub followers: Vec<FollowerStatus>,
    /// The snapshots this replica serves (a leader its own, another replica in the leader's stead),
    /// fetches or installs, and how they stand (building, ready, or failing and why).
    pub snapshot: Option<String>,
    /// Request ids in the window of recent requests.
    pub request_ids: u64,
    /// The data directory's disk: free space, the reserve, the "disk full" alarm.
    pub disk: DiskStatus,
    /// Distinct stored values found damaged (not matching their checksum) since the replica
    /// started, by reads, snapshot builds and the scrub.
    pub corrupt_values: u64,
    /// Damaged values replaced by another replica's healthy copy since the replica started.
    pub repaired_values: u64,
    /// Expired keys deleted here since the replica started (the leaders' expiry sweeps).
    pub expired_keys_deleted: u64,
    /// The background scrub's progress.
    pub scrub: ScrubStatus,
    /// The node's log garbage collector (the same for every shard of the node).
    pub gc: crate::GcStatus,
    /// The node's value deduplication (the same for every shard of the node; mode empty in the
    /// storage modes without it).
    pub dedup: crate::DedupStatus,
    /// Bytes of Raft messages this node delivered to peers since it started (node-wide).
    pub peer_bytes_sent: u64,
    /// Read barriers this replica answered as leader since it started by its read lease
    /// (`ReplicaConfig::lease_reads`), without a ReadIndex round.
    pub reads_by_lease: u64,
    /// Read barriers this replica sent through a ReadIndex round since it started.
    pub reads_by_read_index: u64,
    /// Fast writes made durable here and not applied yet (`Replica::fast_write`).
    pub fast_pending: u64,
    /// Fast writes applied here from this replica's own durability record (the value written
    /// once) since it opened.
    pub fast_from_record: u64,
    /// Fast writes applied here from the copy the leader's ORDER carried (this replica did not
    /// hold the record, or the leader could not know it did) since it opened.
    pub fast_from_inline: u64,
}

impl ReplicaStatus {
    /// The node as a whole, from the statuses of its replicas (ordered by shard): node-wide
    /// figures (logs, index, disk, bytes written, failure) as any replica reports them, per-shard
    /// counters summed, the flushed index the lowest flush flag (the node's global persistence
    /// point, in each shard's own index space), and the Raft fields those of the first replica.
    pub fn summarize(statuses: &[ReplicaStatus]) -> ReplicaStatus {
        let Some(first) = statuses.first() else { return ReplicaStatus::default() };
        let mut node = first.clone();
        node.user_bytes = statuses.iter().map(|s| s.user_bytes).sum();
        node.memtable_bytes = statuses.iter().map(|s| s.memtable_bytes).sum();
        node.request_ids = statuses.iter().map(|s| s.request_ids).sum();
        node.corrupt_values = statuses.iter().map(|s| s.corrupt_values).sum();
        node.repaired_values = statuses.iter().map(|s| s.repaired_values).sum();
        node.expired_keys_deleted = statuses.iter().map(|s| s.expired_keys_deleted).sum();
        node.reads_by_lease = statuses.iter().map(|s| s.reads_by_lease).sum();
        node.reads_by_read_index = statuses.iter().map(|s| s.reads_by_read_index).sum();
        node.recovery_records = statuses.iter().map(|s| s.recovery_records).sum();
        node.recovery_replayed = statuses.iter().map(|s| s.recovery_replayed).sum();
        node.flushed_index = statuses.iter().map(|s| s.flushed_index).min().unwrap_or(0);
        node.leader_changes = statuses.iter().map(|s| s.leader_changes).sum();
        node.scrub.passes = statuses.iter().map(|s| s.scrub.passes).min().unwrap_or(0);
        node.scrub.values_checked = statuses.iter().map(|s| s.scrub.values_checked).sum();
        node.scrub.last_pass_values = statuses.iter().map(|s| s.scrub.last_pass_values).sum();
        node.scrub.last_pass_corrupt = statuses.iter().map(|s| s.scrub.last_pass_corrupt).sum();
        node.scrub.last_pass_finished_unix_ms =
            statuses.iter().map(|s| s.scrub.last_pass_finished_unix_ms).min().unwrap_or(0);
        node
    }
}

/// What the background scrub has verified, for status and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubStatus {
    /// Whether a scrub runs (`scrub_bytes_per_sec` > 0 and not a simulation).
    pub enabled: bool,
    /// Full passes over the shard's values finished since the replica started.
    pub passes: u64,
    /// Values verified since the replica started, in finished and current passes.
    pub values_checked: u64,
    /// When the last full pass finished, in milliseconds since the Unix epoch (0: none yet).
    pub last_pass_finished_unix_ms: u64,
    /// Values the last full pass verified.
    pub last_pass_values: u64,
    /// Damaged values the last full pass found.
    pub last_pass_corrupt: u64,
}

/// How far a follower is, as its leader sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FollowerStatus {
    /// The follower's node id.
    pub id: u64,
    /// The highest index known to be in its log.
    pub matched: u64,
    /// "replicate" (streaming entries), "probe" (finding where its log diverges), or
    /// "snapshot" (it is behind the leader's Raft log and needs a snapshot).
    pub state: String,
    /// Whether it answered the leader recently.
    pub active: bool,
}

/// The disk of a replica's data directory in a [`ReplicaStatus`], as of the last check (at most a
/// fraction of a second old).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskStatus {
    /// Bytes the file system still has for the node (0 before the first check, or when unmonitored).
    pub free_bytes: u64,
    /// Size of the file system.
    pub total_bytes: u64,
    /// The alarm threshold ([`ReplicaConfig::min_free_bytes`]; 0: no alarm).
    pub min_free_bytes: u64,
    /// Bytes of reserve held now: the configured size, or 0 once given up (or not created for lack
    /// of space; it is created at the next open when space allows).
    pub reserve_bytes: u64,
    /// Why writes are refused, while the "disk full" alarm is raised.
    pub alarm: Option<String>,
}

/// One of a replica's logs in a [`ReplicaStatus`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogStatus {
    /// Its directory inside the data directory: `log`, `values`, `raft-wal` or `data-wal`.
    pub name: String,
    /// Bytes between its first retained and its end position (what its segments hold).
    pub bytes: u64,
    /// What it wrote and synced since open, and its fsync latencies.
    pub stats: onekv_log::LogStats,
}

/// Carries Raft messages to peers. Must not block: a transport that cannot keep up drops messages
/// (Raft retransmits).
pub trait Transport: Send + Sync + 'static {
    /// Sends each message of `shard`'s group to the node `message.to`.
    fn send(&self, shard: u64, messages: Vec<Message>);

    /// Asks the node `to` for a chunk of the snapshot it is streaming (it calls
    /// [`crate::Node::snapshot_chunk`]). Called on a thread of the replica's own, never on its
    /// loop; may block, and must give up within a bounded time. A transport that cannot reach
    /// peers this way keeps the default: snapshots sent to this node are then dropped, so only a
    /// simulation, whose snapshots travel whole, may use one.
    fn fetch_snapshot_chunk(&self, to: u64, request: &ChunkRequest) -> Result<SnapshotChunk, String> {
        let _ = request;
        Err(format!("this transport cannot fetch snapshot chunks from node {to}"))
    }

    /// Bytes of Raft messages delivered to peers since the transport started (0 if not counted).
    fn bytes_sent(&self) -> u64 {
        0
    }
}

/// Pairs a scan returned, and whether more remain in its range.
pub type ScanResult = (Vec<(Vec<u8>, Vec<u8>)>, bool);

/// Where the next chunk of a streamed snapshot starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChunkCursor {
    /// At the first key.
    Start,
    /// After this key (the last one the previous chunk held).
    AfterKey(Vec<u8>),
    /// At this pair of the request-id window, which follows the keys.
    Window(u32),
}

/// A follower's request for the next chunk of the snapshot its leader sent it
/// ([`Transport::fetch_snapshot_chunk`], answered by [`crate::Node::snapshot_chunk`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkRequest {
    /// The node asking.
    pub from: u64,
    /// The shard whose snapshot it is.
    pub shard: u64,
    /// The snapshot's index (a node serves at most one snapshot per shard at a time), or with
    /// `any_view` the lowest index the asker can use.
    pub index: u64,
    /// Asks another replica than the leader for the first chunk of a view of its own, at
    /// `index` or after (it makes one at its applied index if it serves none that fits): the
    /// chunk says which view it is ([`SnapshotChunk::view`]), and the next requests name it.
    pub any_view: bool,
    /// The asker takes references in the pairs (a key sent as "the same value as this earlier
    /// key"; `records::PairValue::SameAs`), so a copy several keys share is sent once.
    pub references: bool,
    /// Where the chunk starts.
    pub cursor: ChunkCursor,
    /// About how many bytes of pairs to answer (a chunk holds at least one pair, so a large value
    /// may exceed it); clamped to [`SNAPSHOT_CHUNK_BYTES_RANGE`].
    pub max_bytes: u32,
}

/// One chunk of a streamed snapshot: pairs in the snapshot-pairs format (values with their
/// checksums, or references to earlier keys when asked for; the request-id window's pairs under
/// the empty key, after every user key).
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotChunk {
    /// Whole pairs.
    pub pairs: Vec<u8>,
    /// Where the next chunk starts; `None` after the last one.
    pub next: Option<ChunkCursor>,
    /// The served view's index, term and members, in the answer to an `any_view` request only.
    pub view: Option<raft::eraftpb::SnapshotMetadata>,
}

/// The sizes a snapshot chunk may be asked for (inclusive): large enough that a chunk is not
/// mostly overhead, small enough to stay a bounded buffer on both sides.
pub const SNAPSHOT_CHUNK_BYTES_RANGE: (usize, usize) = (4 << 10, 64 << 20);

/// Called once with the result of a proposal or read barrier, on the replica's loop thread: it
/// must not block.
pub type Done<T> = Box<dyn FnOnce(Result<T, ReplicaError>) + Send + 'static>;

impl Limits {
    /// Checks one command against the limits; the error names the limit.
    pub fn check(&self, command: &Command) -> Result<(), ReplicaError> {
        let bad = |m: String| Err(ReplicaError::InvalidArgument(m));
        let check_key = |key: &[u8]| {
            if key.is_empty() {
                return bad("empty key".into());
            }
            if key.len() > self.max_key_bytes {
                return bad(format!(
                    "key of {} bytes exceeds max_key_bytes = {}",
                    key.len(),
                    self.max_key_bytes
                ));
            }
            Ok(())
        };
        let check_value = |value: &[u8]| {
            if value.len() > self.max_value_bytes {
                return bad(format!(
                    "value of {} bytes exceeds max_value_bytes = {}",
                    value.len(),
                    self.max_value_bytes
                ));
            }
            Ok(())
        };
        // Every key and value of a list of pairs; their bytes together.
        let check_pairs = |pairs: &mut dyn Iterator<Item = (&Vec<u8>, &Option<Vec<u8>>)>| {
            let mut bytes = 0;
            for (key, value) in pairs {
                check_key(key)?;
                if let Some(value) = value {
                    check_value(value)?;
                }
                bytes += key.len() + value.as_ref().map_or(0, Vec::len);
            }
            Ok(bytes)
        };
        match command {
            Command::Write(ops) => {
                if ops.is_empty() {
                    return bad("empty batch".into());
                }
                if ops.len() > self.max_batch_ops {
                    return bad(format!(
                        "batch of {} ops exceeds max_batch_ops = {}",
                        ops.len(),
                        self.max_batch_ops
                    ));
                }
                let bytes = check_pairs(&mut ops.iter().map(|op| (&op.key, &op.value)))?;
                if bytes > self.max_batch_bytes {
                    return bad(format!(
                        "batch of {bytes} bytes exceeds max_batch_bytes = {}",
                        self.max_batch_bytes
                    ));
                }
                Ok(())
            }
            Command::Cas { key, expected, new, .. } => {
                check_key(key)?;
                for value in [expected, new].into_iter().flatten() {
                    check_value(value)?;
                }
                Ok(())
            }
            Command::Txn { conditions, ops } => {
                if conditions.is_empty() && ops.is_empty() {
                    return bad("empty transaction".into());
                }
                for (what, count) in [("conditions", conditions.len()), ("ops", ops.len())] {
                    if count > self.max_batch_ops {
                        return bad(format!(
                            "transaction of {count} {what} exceeds max_batch_ops = {}",
                            self.max_batch_ops
                        ));
                    }
                }
                let bytes = check_pairs(&mut conditions.iter().map(|c| (&c.key, &c.expected)))?
                    + check_pairs(&mut ops.iter().map(|op| (&op.key, &op.value)))?;
                if bytes > self.max_batch_bytes {
                    return bad(format!(
                        "transaction of {bytes} bytes (conditions and ops) exceeds max_batch_bytes = {}",
                        self.max_batch_bytes
                    ));
                }
                Ok(())
            }
            Command::DeleteRange { start, end, limit, spare } => {
                for key in [Some(start), end.as_ref(), Some(spare)].into_iter().flatten() {
                    if key.len() > self.max_key_bytes {
                        return bad(format!(
                            "range bound of {} bytes exceeds max_key_bytes = {}",
                            key.len(),
                            self.max_key_bytes
                        ));
                    }
                }
                if end.as_ref().is_some_and(|end| end < start) {
                    return bad("range deletion: start is after end".into());
                }
                if *limit == 0 || *limit as usize > self.max_batch_ops {
                    return bad(format!(
                        "range deletion page of {limit} keys: must be 1..=max_batch_ops ({})",
                        self.max_batch_ops
                    ));
                }
                Ok(())
            }
        }
    }
}
