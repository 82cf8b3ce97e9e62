//! The node's configuration: the TOML file, its defaults, and the checks run before any data is
//! touched.
//!
//! Owns the file format (`ServerConfig` and its sections), parsing of the `--members` flag syntax,
//! validation with messages that name the offending field, and the translation into the replica's
//! [`ReplicaConfig`]. Does not own the meaning of the tuning values (the replica does) nor how
//! command-line flags override the file (the `onekv` binary does).
//!
//! Every field has a default except `node_id`, `listen`, `data_dir`, `members` and (when there are
//! other members) `peer_secret_file`, so a file (or a command line) needs only those. The defaults
//! of the tuning fields come from the replica's own defaults ([`ReplicaConfig::new`],
//! [`Limits::default`]) so the two cannot drift apart.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use onekv_replica::{Limits, ReplicaConfig};
use serde::{Deserialize, Serialize};

pub use onekv_replica::StorageMode;

/// Limits on sizes, chosen so a misconfiguration is caught by `validate` rather than surfacing as a
/// failure deep in the index, the log or gRPC.
pub mod bounds {
    /// The index stores keys with a 16-bit length; half of it leaves room for the replica's own
    /// prefixes.
    pub const MAX_KEY_BYTES: usize = 32 << 10;
    /// A value must fit in one gRPC message and one log record with room to spare.
    pub const MAX_VALUE_BYTES: usize = 64 << 20;
    /// A batch or a scan response is one gRPC message and (for a batch) one Raft entry.
    pub const MAX_BATCH_OR_SCAN_BYTES: usize = 128 << 20;
    /// More operations than this in one entry would make applying it a long pause of the loop.
    pub const MAX_BATCH_OPS: usize = 100_000;
    /// Pairs in one scan response.
    pub const MAX_SCAN_PAIRS: usize = 1_000_000;
    /// Memtable budget of one index tree.
    pub const MEMTABLE_BYTES: (u64, u64) = (64 << 10, 16 << 30);
    /// `index.follower_memtable_bytes` when not 0 (off): the bounds of one tree's memtable.
    pub const FOLLOWER_MEMTABLE_BYTES: (u64, u64) = MEMTABLE_BYTES;
    /// `index.follower_runs`: the index's own bound on sorted runs.
    pub const FOLLOWER_RUNS: (u64, u64) = (1, onekv_replica::IndexLayout::MAX_FOLLOWER_RUNS as u64);
    /// Size of one log segment file: the log's own rule (a segment holds the largest record, at
    /// most 1 GiB), 16 MiB + 52 bytes..=1 GiB.
    pub const SEGMENT_BYTES: (u64, u64) = onekv_replica::ReplicaConfig::SEGMENT_BYTES_RANGE;
    /// Reclaimed segment files a log keeps for reuse: the log's own bound.
    pub const RECYCLED_SEGMENTS: (u64, u64) = (0, onekv_log::MAX_RECYCLED_SEGMENTS as u64);
    /// Raft's logical clock.
    pub const TICK_MS: (u64, u64) = (1, 10_000);
    /// A client request's budget.
    pub const REQUEST_TIMEOUT_MS: (u64, u64) = (1, 600_000);
    /// Threads of the async runtime.
    pub const WORKER_THREADS: (u64, u64) = (1, 1024);
    /// Raft entries kept for lagging followers.
    pub const RAFT_LOG_KEEP_ENTRIES: (u64, u64) = (1, 1_000_000_000);
    /// Client calls decoded and handled at once.
    pub const MAX_CONCURRENT_REQUESTS: (u64, u64) = (1, 65_536);
    /// Peer calls decoded and handled at once (their bytes are bounded on their own).
    pub const MAX_CONCURRENT_PEER_CALLS: (u64, u64) = (1, 1024);
    /// The "disk full" threshold (0: no alarm).
    pub const MIN_FREE_BYTES: (u64, u64) = (0, 1 << 40);
    /// The disk reserve (0: none).
    pub const RESERVE_BYTES: (u64, u64) = (0, 64 << 30);
    /// Pause between the log GC's rounds, in milliseconds.
    pub const GC_INTERVAL_MS: (u64, u64) = (10, 60_000);
}

/// The whole configuration of one node, as read from its TOML file (see `docs/config-example.toml`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// This node's id: non-zero and one of `members`. Required (the default, 0, is rejected).
    pub node_id: u64,
    /// Address to listen on, `host:port`. One port serves both clients (the `Kv` service) and peers
    /// (the `Peer` service). Required.
    pub listen: String,
    /// Address of the node's HTTP endpoint, `host:port`: Prometheus metrics (`GET /metrics`), the
    /// status page (`GET /`), `GET /cluster.json` and `GET /healthz`. Unset: no HTTP endpoint.
    pub http_listen: Option<String>,
    /// Address of the node's Redis-protocol (RESP2/RESP3) front end, `host:port`, for redis-cli,
    /// redis-benchmark and Redis client libraries (see `docs/redis.md`). Unset: no RESP front end.
    pub resp_listen: Option<String>,
    /// Least severe log level written: `error`, `warn`, `info`, `debug` or `trace`. Unset: `info`.
    /// The `--log-level` flag and then `RUST_LOG` win over it.
    pub log_level: Option<String>,
    /// Log line format on standard error: `text` (default) or `json` (one object per line).
    pub log_format: LogFormat,
    /// Directory of the node's logs and index. In a file, a relative path is resolved against the
    /// file's own directory. Required.
    pub data_dir: PathBuf,
    /// `"onelog"` (default), `"separated"` or `"classic"` (see DESIGN.md §4). Fixed when the data
    /// directory is created.
    #[serde(with = "storage_mode")]
    pub storage: StorageMode,
    /// How long a client request may wait for its write to commit or its read barrier to complete,
    /// in milliseconds, before it fails with DEADLINE_EXCEEDED. Default 5000.
    pub request_timeout_ms: u64,
    /// Threads of the node's async runtime, which serves clients, peers, the HTTP endpoint and the
    /// Redis front end (the node loop, the log writer and the background work have threads of
    /// their own). Unset: `TOKIO_WORKER_THREADS` if set, else one per core. Nodes that share a machine do better with the cores
    /// divided between them: every idle worker is woken and put back to sleep as requests arrive,
    /// so more workers than cores cost CPU on every request (`onekv cluster start` writes
    /// cores ÷ nodes, at least 1, into the files it creates; docs/benchmarks/profile.md).
    pub worker_threads: Option<u64>,
    /// File holding the cluster secret (hex; `onekv cluster start` writes one of 32 random bytes,
    /// mode 0600), the same on every member: peers send it with every Raft message and a node
    /// refuses messages without it. In a file, a relative path is resolved against the file's own
    /// directory. Required when there are other members; unset on a single node, which then
    /// accepts no peer calls at all.
    pub peer_secret_file: Option<PathBuf>,
    /// Every voting member, this node included, as `[[members]]` tables. Required. Used to create
    /// the cluster, to address peers, and to name the leader in not-leader errors. Only the first
    /// start reads it: afterwards the data directory's member list (`MEMBERS`, changed with `onekv
    /// node add|remove`) wins.
    pub members: Vec<MemberConfig>,
    /// This node joins a running cluster instead of creating one: at its first start it copies the
    /// cluster map and member list from one of the other `members` (the cluster's nodes it can
    /// reach; this node's own entry gives its address), and holds no shard until `onekv node add`
    /// adds it. `cluster` then plays no part. Default false.
    pub join: bool,
    /// Raft timing and log retention.
    pub raft: RaftConfig,
    /// Bounds on what one request may carry.
    pub limits: LimitsConfig,
    /// The key index.
    pub index: IndexConfig,
    /// The node's log.
    pub log: LogConfig,
    /// What the node does as its disk fills.
    pub disk: DiskConfig,
    /// The log garbage collector.
    pub gc: GcConfig,
    /// See [`DedupConfig`].
    pub dedup: DedupConfig,
    /// How the store is split into shards and replicated.
    pub cluster: ClusterConfig,
}

/// `[cluster]`: shards and replication, fixed when the cluster is created (every member must say
/// the same; a node refuses to start with a placement other than the one its data was created
/// with). See `docs/design/placement.md`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// Shards the key space is split into (1 to 1024): each key belongs to one, by Redis Cluster's
    /// hash slot of the key or its `{hash tag}`. Default 16.
    pub shards: u32,
    /// Replicas of each shard, on distinct members (1 to 7, at most the number of members).
    /// Unset: 3, or every member when there are fewer.
    pub replicas: Option<u32>,
    /// Which bytes of a key are hashed to its slot. `whole-key` (the default, and what every
    /// cluster created before this setting uses): the whole key. `database-blind` (what `onekv
    /// cluster start` writes for a new cluster): a key of Redis database 1..15 without its database
    /// prefix, so a key has the same shard in every database (`MOVE`, `COPY ... DB`). Fixed when
    /// the cluster is created, like `shards`.
    pub key_hashing: KeyHashingName,
    /// Blind writes in one round trip (`docs/design/fast-path.md`): this node's replicas accept
    /// FastWrite calls, and its Redis front end sends SET without options and MSET (each shard's
    /// part) by the fast path. Set it the same on every member (a node with it off refuses fast
    /// writes, so they take the Raft path). May change across restarts; writes made durable while
    /// it was on are still ordered after it is turned off. Needs `storage = "onelog"`. Default
    /// false.
    pub fast_path: bool,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            shards: onekv_placement::DEFAULT_SHARDS,
            replicas: None,
            key_hashing: KeyHashingName::default(),
            fast_path: false,
        }
    }
}

/// `cluster.key_hashing`: the configuration's names of [`onekv_placement::KeyHashing`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyHashingName {
    /// [`onekv_placement::KeyHashing::WholeKey`].
    #[default]
    WholeKey,
    /// [`onekv_placement::KeyHashing::DatabaseBlind`].
    DatabaseBlind,
}

impl KeyHashingName {
    /// The placement rule it names.
    pub fn rule(self) -> onekv_placement::KeyHashing {
        match self {
            KeyHashingName::WholeKey => onekv_placement::KeyHashing::WholeKey,
            KeyHashingName::DatabaseBlind => onekv_placement::KeyHashing::DatabaseBlind,
        }
    }
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The log levels `log_level` accepts.
pub const LOG_LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];

/// One voting member of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberConfig {
    /// The member's node id (non-zero, unique).
    pub id: u64,
    /// Where clients and peers reach it, `host:port` (unique).
    pub address: String,
}

/// `[raft]`: Raft timing and log retention.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaftConfig {
    /// Interval of Raft's logical clock, in milliseconds. Default 100.
    pub tick_ms: u64,
    /// Ticks without hearing from a leader before a follower campaigns; must exceed
    /// `heartbeat_ticks`. Default 10.
    pub election_ticks: usize,
    /// Ticks between leader heartbeats; at least 1. Default 2.
    pub heartbeat_ticks: usize,
    /// Whether a shard leader that a quorum confirmed within the last `election_ticks - 2` ticks
    /// answers linearizable reads without asking the followers again (a lease); needs
    /// `election_ticks` of at least 3, and the same `tick_ms` and `election_ticks` on every node.
    /// Default false. See docs/config.md for what it assumes.
    pub lease_reads: bool,
    /// Raft entries kept below the applied index for lagging followers before the Raft log is
    /// compacted (older entries are sent as a snapshot). Default 10000.
    pub raft_log_keep_entries: u64,
    /// Bytes of keys and values a follower fetches per chunk of a streamed snapshot; 4 KiB to
    /// 64 MiB. Default 4 MiB.
    pub snapshot_chunk_bytes: u64,
    /// Whether a follower that needs a snapshot fetches it from another up-to-date replica of
    /// the shard rather than the leader (the leader's is the fallback). Default true.
    pub snapshot_from_followers: bool,
    /// Bytes per second a node's snapshot fetches store at most, all together; 0 (the default)
    /// for no bound.
    pub snapshot_fetch_bytes_per_sec: u64,
}

/// `[limits]`: bounds on what one request may carry; requests over a bound are rejected with
/// INVALID_ARGUMENT naming it. Defaults are the replica's ([`Limits::default`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Longest key, in bytes (keys must also be non-empty). Default 4096, at most 32768.
    pub max_key_bytes: usize,
    /// Longest value, in bytes. Default 1048576 (1 MiB), at most 64 MiB.
    pub max_value_bytes: usize,
    /// Most operations in one batch. Default 1024.
    pub max_batch_ops: usize,
    /// Most key and value bytes in one batch or write; at least `max_key_bytes + max_value_bytes`.
    /// Default 4194304 (4 MiB).
    pub max_batch_bytes: usize,
    /// Most pairs one scan returns. Default 10000.
    pub max_scan_pairs: usize,
    /// Most key and value bytes one scan returns; at least `max_key_bytes + max_value_bytes` so the
    /// largest pair always fits. Default 4194304 (4 MiB).
    pub max_scan_bytes: usize,
    /// Most client (`Kv`) calls decoded and handled at once (a call waiting for its write to commit
    /// counts); more are refused at once with UNAVAILABLE, which clients retry with backoff.
    /// Bounds the memory requests hold, each up to about `max_batch_bytes`. Default 512.
    pub max_concurrent_requests: usize,
    /// Most peer (`Peer`) calls decoded and handled at once; more are refused (UNAVAILABLE; the
    /// sender backs off and Raft retransmits). Every peer sends one call at a time, so the number
    /// of other members is enough. Whatever the count, the messages being handled hold at most
    /// about 400 MiB (two whole snapshots). Default 16.
    pub max_concurrent_peer_calls: usize,
}

/// The default `limits.max_concurrent_requests`.
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 512;
/// The default `limits.max_concurrent_peer_calls`.
pub const DEFAULT_MAX_CONCURRENT_PEER_CALLS: usize = 16;

/// `[index]`: the key index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IndexConfig {
    /// Flush an index tree's memtable once it holds this many bytes. Default 16777216 (16 MiB).
    pub memtable_bytes: u64,
    /// How shards' index trees are shaped: `decoupled` (default: leveled for the shards this node
    /// leads or is the primary of, at most `follower_runs` sorted runs for the others) or `uniform`
    /// (every tree leveled).
    pub layout: IndexLayoutName,
    /// DEPART's `S`: flushed sorted runs a followed shard's tree keeps before merging them, 1..=64.
    /// Default 8.
    pub follower_runs: u8,
    /// Under `decoupled`: bytes the memtables of all the shards this node only follows may hold
    /// together; once they do, the largest is flushed. 0, or 65536..=17179869184. Default 268435456
    /// (256 MiB). 0: each followed shard's tree flushes at `memtable_bytes` on its own.
    pub follower_memtable_bytes: u64,
}

/// `index.layout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexLayoutName {
    /// Trees shaped by this node's role in each shard.
    Decoupled,
    /// Every tree leveled.
    Uniform,
}

/// `[log]`: the node's log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// Size of one log segment file, in bytes: 16777268 (16 MiB + 52, the largest log record and
    /// its framing) ..= 1073741824 (1 GiB), and at least twice `limits.max_batch_bytes` so the
    /// largest write's Raft entry fits in one segment. Default 67108864 (64 MiB).
    pub segment_bytes: u64,
    /// Reclaimed segment files the log keeps to become later segments, 0..=64; 0 deletes them.
    /// Overwriting a file's blocks makes each group commit's fsync cheaper than growing a file
    /// (no size or allocation to write); the kept files hold up to this many segments of disk,
    /// and are deleted while the disk-full alarm is raised. Default 1.
    pub recycled_segments: u32,
    /// Bytes per second the background scrub reads to verify stored values' checksums; 0 turns
    /// it off. Default 8388608 (8 MiB/s).
    pub scrub_bytes_per_sec: u64,
}

/// `[gc]`: the log garbage collector, which keeps the log's disk use bounded (see
/// `docs/design/replica.md`, "The log garbage collector").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GcConfig {
    /// Whether the collector runs. Off, the log grows with every write (for comparisons).
    /// Default true.
    pub enabled: bool,
    /// The collector reclaims while the log holds more than this many times its live bytes; at
    /// least 1.1. Default 1.5.
    pub target_space_amp: f64,
    /// Bytes per second the collector may read and write (its share of the disk); 0: unlimited.
    /// Default 67108864 (64 MiB/s).
    pub bytes_per_sec: u64,
    /// Milliseconds between the collector's rounds, 10 ..= 60000. Default 1000.
    pub interval_ms: u64,
    /// Values smaller than this many bytes are LZ4-compressed, in blocks of several values, when
    /// the collector moves them; 0 compresses nothing; at most 65536. Default 4096.
    pub compress_below_bytes: u64,
}

impl Default for GcConfig {
    fn default() -> Self {
        let defaults = onekv_replica::GcConfig::default();
        GcConfig {
            enabled: defaults.enabled,
            target_space_amp: defaults.target_space_amp,
            bytes_per_sec: defaults.bytes_per_sec,
            interval_ms: defaults.interval.as_millis() as u64,
            compress_below_bytes: defaults.compress_below,
        }
    }
}

/// `[dedup]`: identical values stored once (onelog mode; see `docs/design/replica.md`,
/// "Deduplication").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DedupConfig {
    /// `off`, `inline` (at apply), `offline` (when the log GC moves values) or `elastic` (both,
    /// inline only while duplicates are common). Default `off`.
    pub mode: DedupModeName,
    /// Values shorter than this many bytes are never deduplicated, at least 64. Default 1024.
    pub min_value_bytes: u64,
    /// Memory of the content index (about 96 bytes per distinct value), at least 131072.
    /// Default 67108864 (64 MiB).
    pub memory_bytes: u64,
    /// With `inline` or `elastic`: a leader proposes a put of a value a key of the shard holds
    /// as a reference to that key, so the value is neither sent nor logged again. Default true.
    pub references: bool,
}

/// `dedup.mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DedupModeName {
    /// Every value has its own copy.
    Off,
    /// At apply.
    Inline,
    /// In the log GC.
    Offline,
    /// In the log GC, and at apply while duplicates are common.
    Elastic,
}

impl DedupModeName {
    /// The configuration spelling.
    pub fn name(self) -> &'static str {
        self.mode().name()
    }

    /// Parses the configuration spelling.
    pub fn parse(name: &str) -> Option<DedupModeName> {
        [DedupModeName::Off, DedupModeName::Inline, DedupModeName::Offline, DedupModeName::Elastic]
            .into_iter()
            .find(|mode| mode.name() == name)
    }

    /// The replica's mode.
    pub fn mode(self) -> onekv_replica::DedupMode {
        match self {
            DedupModeName::Off => onekv_replica::DedupMode::Off,
            DedupModeName::Inline => onekv_replica::DedupMode::Inline,
            DedupModeName::Offline => onekv_replica::DedupMode::Offline,
            DedupModeName::Elastic => onekv_replica::DedupMode::Elastic,
        }
    }
}

impl Default for DedupConfig {
    fn default() -> Self {
        let defaults = onekv_replica::DedupConfig::default();
        DedupConfig {
            mode: DedupModeName::Off,
            min_value_bytes: defaults.min_value_bytes,
            memory_bytes: defaults.memory_bytes,
            references: defaults.references,
        }
    }
}

/// `[disk]`: what the node does as its data directory's disk fills (see `docs/design/replica.md`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiskConfig {
    /// Below this many free bytes (the reserve aside) the "disk full" alarm is raised: the leader
    /// refuses new writes with RESOURCE_EXHAUSTED and hands leadership to another node; reads go on;
    /// the alarm clears by itself once space is freed. 0 disables the alarm. Default 268435456
    /// (256 MiB).
    pub min_free_bytes: u64,
    /// Size of the reserve file (`DATA_DIR/RESERVED`), deleted when free space falls below half of
    /// `min_free_bytes` or the node fails, so flushes and recovery still find room; re-created at
    /// the next start when space allows. 0: no reserve. Default 67108864 (64 MiB).
    pub reserve_bytes: u64,
}

/// The replica's defaults, the single source of every tuning default here.
fn replica_defaults() -> ReplicaConfig {
    ReplicaConfig::new(0, Vec::new(), PathBuf::new())
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            node_id: 0,
            listen: String::new(),
            http_listen: None,
            resp_listen: None,
            join: false,
            log_level: None,
            log_format: LogFormat::default(),
            data_dir: PathBuf::new(),
            storage: StorageMode::default(),
            request_timeout_ms: 5000,
            worker_threads: None,
            peer_secret_file: None,
            members: Vec::new(),
            raft: RaftConfig::default(),
            limits: LimitsConfig::default(),
            index: IndexConfig::default(),
            log: LogConfig::default(),
            disk: DiskConfig::default(),
            gc: GcConfig::default(),
            dedup: DedupConfig::default(),
            cluster: ClusterConfig::default(),
        }
    }
}

impl Default for RaftConfig {
    fn default() -> Self {
        let defaults = replica_defaults();
        RaftConfig {
            tick_ms: u64::try_from(defaults.tick.as_millis()).unwrap_or(u64::MAX),
            election_ticks: defaults.election_ticks,
            lease_reads: defaults.lease_reads,
            heartbeat_ticks: defaults.heartbeat_ticks,
            raft_log_keep_entries: defaults.raft_log_keep_entries,
            snapshot_chunk_bytes: defaults.snapshot_chunk_bytes as u64,
            snapshot_from_followers: defaults.snapshot_from_followers,
            snapshot_fetch_bytes_per_sec: defaults.snapshot_fetch_bytes_per_sec,
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig::from(&Limits::default())
    }
}

impl From<&Limits> for LimitsConfig {
    fn from(limits: &Limits) -> Self {
        LimitsConfig {
            max_key_bytes: limits.max_key_bytes,
            max_value_bytes: limits.max_value_bytes,
            max_batch_ops: limits.max_batch_ops,
            max_batch_bytes: limits.max_batch_bytes,
            max_scan_pairs: limits.max_scan_pairs,
            max_scan_bytes: limits.max_scan_bytes,
            // Not the replica's: bounds of the gRPC services.
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
            max_concurrent_peer_calls: DEFAULT_MAX_CONCURRENT_PEER_CALLS,
        }
    }
}

impl LimitsConfig {
    /// The replica's form of these limits.
    pub fn to_limits(&self) -> Limits {
        Limits {
            max_key_bytes: self.max_key_bytes,
            max_value_bytes: self.max_value_bytes,
            max_batch_ops: self.max_batch_ops,
            max_batch_bytes: self.max_batch_bytes,
            max_scan_pairs: self.max_scan_pairs,
            max_scan_bytes: self.max_scan_bytes,
        }
    }
}

impl Default for IndexConfig {
    fn default() -> Self {
        let follower_runs = match replica_defaults().index_layout {
            onekv_replica::IndexLayout::Decoupled { follower_runs } => follower_runs,
            onekv_replica::IndexLayout::Uniform => onekv_replica::IndexLayout::DEFAULT_FOLLOWER_RUNS,
        };
        IndexConfig {
            memtable_bytes: replica_defaults().memtable_bytes,
            layout: IndexLayoutName::Decoupled,
            follower_runs,
            follower_memtable_bytes: replica_defaults().follower_memtable_bytes,
        }
    }
}

impl Default for DiskConfig {
    fn default() -> Self {
        let defaults = replica_defaults();
        DiskConfig { min_free_bytes: defaults.min_free_bytes, reserve_bytes: defaults.reserve_bytes }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: replica_defaults().segment_bytes,
            recycled_segments: replica_defaults().recycled_segments,
            scrub_bytes_per_sec: replica_defaults().scrub_bytes_per_sec,
        }
    }
}

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read configuration file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not match the format (unknown field, wrong type, ...).
    #[error("cannot parse configuration file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, which names the line and the field.
        message: String,
    },
    /// The configuration parsed but breaks one or more rules.
    #[error("invalid configuration:{}", DisplayProblems(.0))]
    Invalid(Vec<Problem>),
    /// A `--members` list could not be parsed.
    #[error("invalid members list {list:?}: {reason} (expected ID=HOST:PORT,ID=HOST:PORT,...)")]
    Members {
        /// The list as given.
        list: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// One broken rule: the field (as written in the file, e.g. `raft.election_ticks`) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The field, with its section: `node_id`, `members[2].address`, `limits.max_key_bytes`, ...
    pub field: String,
    /// What is wrong and what is expected.
    pub reason: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

struct DisplayProblems<'a>(&'a [Problem]);

impl fmt::Display for DisplayProblems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for problem in self.0 {
            write!(f, "\n  - {problem}")?;
        }
        Ok(())
    }
}

impl ConfigError {
    /// The broken rules, when the error is [`ConfigError::Invalid`].
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Invalid(problems) => problems,
            _ => &[],
        }
    }
}

impl ServerConfig {
    /// Reads and parses a TOML file. A relative `data_dir` is resolved against the file's directory,
    /// so a node directory can be moved with its configuration. Does not validate: flags may still
    /// override fields; call [`ServerConfig::validate`] once they have.
    pub fn load(path: &Path) -> Result<ServerConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        let mut config = ServerConfig::parse(&text)
            .map_err(|message| ConfigError::Parse { path: path.to_path_buf(), message })?;
        if let Some(secret) = &config.peer_secret_file
            && secret.is_relative()
            && !secret.as_os_str().is_empty()
        {
            config.peer_secret_file = Some(path.parent().unwrap_or(Path::new("")).join(secret));
        }
        if config.data_dir.is_relative() && !config.data_dir.as_os_str().is_empty() {
            let base = path.parent().unwrap_or(Path::new(""));
            config.data_dir = if config.data_dir == Path::new(".") {
                base.to_path_buf()
            } else {
                base.join(&config.data_dir)
            };
            if config.data_dir.as_os_str().is_empty() {
                // The file was in the working directory and data_dir was ".".
                config.data_dir = PathBuf::from(".");
            }
        }
        Ok(config)
    }

    /// Parses TOML text (paths are taken as written). The error is the parser's message.
    pub fn parse(text: &str) -> Result<ServerConfig, String> {
        toml::from_str(text).map_err(|error| error.to_string())
    }

    /// The configuration as TOML text that [`ServerConfig::parse`] reads back.
    pub fn to_toml(&self) -> String {
        // Every field is a plain value, string or table of them: serialization cannot fail.
        toml::to_string(self).expect("a ServerConfig always serializes to TOML")
    }

    /// Checks every rule and reports every broken one, each naming its field. Run it before
    /// touching any data.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        let mut problem = |field: &str, reason: String| {
            problems.push(Problem { field: field.to_string(), reason });
        };

        if self.node_id == 0 {
            problem("node_id", "is missing or 0; node ids are non-zero".into());
        } else if !self.members.is_empty() && !self.members.iter().any(|member| member.id == self.node_id) {
            let ids: Vec<String> = self.members.iter().map(|member| member.id.to_string()).collect();
            problem("node_id", format!("{} is not among the members ({})", self.node_id, ids.join(", ")));
        }
        if self.listen.is_empty() {
            problem("listen", "is missing; expected host:port".into());
        } else if let Err(reason) = check_address(&self.listen) {
            problem("listen", format!("{:?} {reason}", self.listen));
        }
        if let Some(http_listen) = &self.http_listen {
            if let Err(reason) = check_address(http_listen) {
                problem("http_listen", format!("{http_listen:?} {reason}"));
            } else if http_listen.eq_ignore_ascii_case(&self.listen) {
                problem("http_listen", format!("{http_listen:?} is also `listen`; give HTTP its own port"));
            }
        }
        if let Some(resp_listen) = &self.resp_listen {
            if let Err(reason) = check_address(resp_listen) {
                problem("resp_listen", format!("{resp_listen:?} {reason}"));
            } else if resp_listen.eq_ignore_ascii_case(&self.listen)
                || self.http_listen.as_ref().is_some_and(|http| resp_listen.eq_ignore_ascii_case(http))
            {
                problem(
                    "resp_listen",
                    format!("{resp_listen:?} is also `listen` or `http_listen`; give RESP its own port"),
                );
            }
        }
        if let Some(level) = &self.log_level
            && !LOG_LEVELS.contains(&level.as_str())
        {
            problem("log_level", format!("{level:?} is not one of {}", LOG_LEVELS.join(", ")));
        }
        if self.data_dir.as_os_str().is_empty() {
            problem("data_dir", "is missing".into());
        }
        check_range(&mut problem, "request_timeout_ms", self.request_timeout_ms, bounds::REQUEST_TIMEOUT_MS);
        if let Some(threads) = self.worker_threads {
            check_range(&mut problem, "worker_threads", threads, bounds::WORKER_THREADS);
        }

        if self.members.is_empty() {
            problem("members", "is empty; list every voting member, this node included".into());
        }
        let mut ids = HashMap::new();
        let mut addresses = HashMap::new();
        for (i, member) in self.members.iter().enumerate() {
            if member.id == 0 {
                problem(&format!("members[{i}].id"), "is 0; node ids are non-zero".into());
            } else if let Some(first) = ids.insert(member.id, i) {
                problem(
                    &format!("members[{i}].id"),
                    format!("{} is also the id of members[{first}]", member.id),
                );
            }
            match check_address(&member.address) {
                Err(reason) => {
                    problem(&format!("members[{i}].address"), format!("{:?} {reason}", member.address))
                }
                Ok(()) => {
                    if let Some(first) = addresses.insert(member.address.to_ascii_lowercase(), i) {
                        problem(
                            &format!("members[{i}].address"),
                            format!("{:?} is also the address of members[{first}]", member.address),
                        );
                    }
                }
            }
        }

        match &self.peer_secret_file {
            Some(path) if path.as_os_str().is_empty() => {
                problem("peer_secret_file", "is empty; name the file holding the cluster secret".into())
            }
            None if self.members.iter().any(|member| member.id != self.node_id) => problem(
                "peer_secret_file",
                "is missing; with other members, peers must prove they belong to the cluster: name a \
                 file holding the cluster secret, the same on every member (`onekv cluster start` \
                 writes one; or `openssl rand -hex 32 > FILE; chmod 600 FILE`)"
                    .into(),
            ),
            _ => {}
        }

        let raft = &self.raft;
        check_range(&mut problem, "raft.tick_ms", raft.tick_ms, bounds::TICK_MS);
        if raft.heartbeat_ticks == 0 {
            problem("raft.heartbeat_ticks", "is 0; must be at least 1".into());
        }
        if raft.election_ticks <= raft.heartbeat_ticks {
            problem(
                "raft.election_ticks",
                format!(
                    "= {} must be greater than raft.heartbeat_ticks = {}",
                    raft.election_ticks, raft.heartbeat_ticks
                ),
            );
        }
        if raft.lease_reads && raft.election_ticks < onekv_replica::MIN_LEASE_ELECTION_TICKS {
            problem(
                "raft.lease_reads",
                format!(
                    "needs raft.election_ticks of at least {} (it is {}): the lease lasts election_ticks - 2 ticks",
                    onekv_replica::MIN_LEASE_ELECTION_TICKS,
                    raft.election_ticks
                ),
            );
        }
        check_range(
            &mut problem,
            "raft.raft_log_keep_entries",
            raft.raft_log_keep_entries,
            bounds::RAFT_LOG_KEEP_ENTRIES,
        );
        let (low, high) = onekv_replica::SNAPSHOT_CHUNK_BYTES_RANGE;
        check_range(
            &mut problem,
            "raft.snapshot_chunk_bytes",
            raft.snapshot_chunk_bytes,
            (low as u64, high as u64),
        );

        let limits = &self.limits;
        let as_u64 = |n: usize| n as u64;
        check_range(
            &mut problem,
            "limits.max_key_bytes",
            as_u64(limits.max_key_bytes),
            (1, as_u64(bounds::MAX_KEY_BYTES)),
        );
        check_range(
            &mut problem,
            "limits.max_value_bytes",
            as_u64(limits.max_value_bytes),
            (1, as_u64(bounds::MAX_VALUE_BYTES)),
        );
        check_range(
            &mut problem,
            "limits.max_batch_ops",
            as_u64(limits.max_batch_ops),
            (1, as_u64(bounds::MAX_BATCH_OPS)),
        );
        check_range(
            &mut problem,
            "limits.max_scan_pairs",
            as_u64(limits.max_scan_pairs),
            // At least 2: a page may hold onekv's own key, which the service leaves out, and a
            // page must never come back empty while more follows.
            (2, as_u64(bounds::MAX_SCAN_PAIRS)),
        );
        check_range(
            &mut problem,
            "limits.max_concurrent_requests",
            as_u64(limits.max_concurrent_requests),
            bounds::MAX_CONCURRENT_REQUESTS,
        );
        check_range(
            &mut problem,
            "limits.max_concurrent_peer_calls",
            as_u64(limits.max_concurrent_peer_calls),
            bounds::MAX_CONCURRENT_PEER_CALLS,
        );
        let largest_pair = limits.max_key_bytes.saturating_add(limits.max_value_bytes);
        for (field, value) in [
            ("limits.max_batch_bytes", limits.max_batch_bytes),
            ("limits.max_scan_bytes", limits.max_scan_bytes),
        ] {
            if value < largest_pair {
                problem(
                    field,
                    format!(
                        "= {value} is below limits.max_key_bytes + limits.max_value_bytes = {largest_pair}; \
                         the largest pair must fit"
                    ),
                );
            } else if value > bounds::MAX_BATCH_OR_SCAN_BYTES {
                problem(field, format!("= {value} is above the maximum {}", bounds::MAX_BATCH_OR_SCAN_BYTES));
            }
        }

        check_range(&mut problem, "index.memtable_bytes", self.index.memtable_bytes, bounds::MEMTABLE_BYTES);
        if self.index.follower_memtable_bytes != 0 {
            check_range(
                &mut problem,
                "index.follower_memtable_bytes",
                self.index.follower_memtable_bytes,
                bounds::FOLLOWER_MEMTABLE_BYTES,
            );
        }
        check_range(
            &mut problem,
            "index.follower_runs",
            u64::from(self.index.follower_runs),
            bounds::FOLLOWER_RUNS,
        );
        check_range(&mut problem, "log.segment_bytes", self.log.segment_bytes, bounds::SEGMENT_BYTES);
        check_range(
            &mut problem,
            "log.recycled_segments",
            u64::from(self.log.recycled_segments),
            bounds::RECYCLED_SEGMENTS,
        );
        check_range(&mut problem, "disk.min_free_bytes", self.disk.min_free_bytes, bounds::MIN_FREE_BYTES);
        check_range(&mut problem, "disk.reserve_bytes", self.disk.reserve_bytes, bounds::RESERVE_BYTES);
        check_range(&mut problem, "gc.interval_ms", self.gc.interval_ms, bounds::GC_INTERVAL_MS);
        check_range(
            &mut problem,
            "gc.compress_below_bytes",
            self.gc.compress_below_bytes,
            (0, onekv_replica::packed::MAX_COMPRESS_BELOW),
        );
        let least_amp = onekv_replica::GcConfig::MIN_TARGET_SPACE_AMP;
        if !(self.gc.target_space_amp >= least_amp && self.gc.target_space_amp <= 100.0) {
            problem(
                "gc.target_space_amp",
                format!("= {} is outside {least_amp}..=100", self.gc.target_space_amp),
            );
        }
        check_range(
            &mut problem,
            "dedup.min_value_bytes",
            self.dedup.min_value_bytes,
            (onekv_replica::DedupConfig::MIN_VALUE_BYTES, u64::MAX),
        );
        check_range(
            &mut problem,
            "dedup.memory_bytes",
            self.dedup.memory_bytes,
            (onekv_replica::DedupConfig::MIN_MEMORY_BYTES, u64::MAX),
        );
        if self.dedup.mode != DedupModeName::Off && self.storage != onekv_replica::StorageMode::OneLog {
            problem(
                "dedup.mode",
                format!(
                    "= \"{}\" needs storage = \"onelog\" (the other modes keep no value in the Raft log)",
                    self.dedup.mode.mode().name()
                ),
            );
        }
        if self.cluster.fast_path && self.storage != onekv_replica::StorageMode::OneLog {
            problem(
                "cluster.fast_path",
                "= true needs storage = \"onelog\" (a fast write's value is applied from its durability \
                 record in the Raft log)"
                    .into(),
            );
        }
        check_range(
            &mut problem,
            "cluster.shards",
            u64::from(self.cluster.shards),
            (1, u64::from(onekv_placement::MAX_SHARDS)),
        );
        // A joining node's `cluster` plays no part: it copies the cluster's map.
        if let Some(replicas) = self.cluster.replicas.filter(|_| !self.join) {
            let most = onekv_placement::MAX_REPLICAS.min(self.members.len().max(1) as u32);
            check_range(&mut problem, "cluster.replicas", u64::from(replicas), (1, u64::from(most)));
        }
        let needed = as_u64(limits.max_batch_bytes).saturating_mul(2);
        if self.log.segment_bytes < needed {
            problem(
                "log.segment_bytes",
                format!(
                    "= {} is below twice limits.max_batch_bytes = {needed}; the largest write must fit in \
                     one segment",
                    self.log.segment_bytes
                ),
            );
        }

        // The replica checks its configuration again when it opens (including constraints of its own,
        // such as a batch fitting one log record); asking it now reports them before any data is
        // touched. Its messages name its fields, which are ours without the section.
        if problems.is_empty() {
            // A joining node's placement is the cluster's, copied at its first start: check the
            // rest of its configuration with a placement of its own members.
            let map = if self.join {
                let ids: Vec<u64> = self.members.iter().map(|member| member.id).collect();
                onekv_placement::ClusterMap::build(&ids, self.cluster.shards, 1)
            } else {
                self.cluster_map()
            };
            match map {
                Err(error) => problems.push(Problem { field: "cluster".into(), reason: error.to_string() }),
                Ok(map) => {
                    if let Err(error) = self.to_replica_config(&map).validate() {
                        problems.push(Problem { field: "(replica)".into(), reason: error.to_string() });
                    }
                }
            }
        }

        if problems.is_empty() { Ok(()) } else { Err(ConfigError::Invalid(problems)) }
    }

    /// Reads the cluster secret `peer_secret_file` names; `None` when it names none.
    pub fn peer_secret(&self) -> anyhow::Result<Option<crate::auth::PeerSecret>> {
        self.peer_secret_file.as_deref().map(crate::auth::PeerSecret::load).transpose()
    }

    /// The request budget as a duration.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// The address of member `id`, if it is one.
    pub fn member_address(&self, id: u64) -> Option<&str> {
        self.members.iter().find(|member| member.id == id).map(|member| member.address.as_str())
    }

    /// Replicas of each shard: `cluster.replicas`, or 3 (every member when there are fewer).
    pub fn replication_factor(&self) -> u32 {
        self.cluster.replicas.unwrap_or_else(|| 3.min(self.members.len().max(1) as u32))
    }

    /// The placement of a cluster created with this configuration: a pure function of the
    /// members, `cluster.shards` and the replication factor.
    pub fn cluster_map(&self) -> Result<onekv_placement::ClusterMap, onekv_placement::PlacementError> {
        let ids: Vec<u64> = self.members.iter().map(|member| member.id).collect();
        let mut map =
            onekv_placement::ClusterMap::build(&ids, self.cluster.shards, self.replication_factor())?;
        map.key_hashing = self.cluster.key_hashing.rule();
        Ok(map)
    }

    /// The node's configuration, holding the shards `map` places on this node. Call after
    /// [`ServerConfig::validate`] succeeded.
    pub fn to_replica_config(&self, map: &onekv_placement::ClusterMap) -> ReplicaConfig {
        let mut config = ReplicaConfig::new(self.node_id, Vec::new(), self.data_dir.clone());
        config.shards = map
            .shards
            .iter()
            .filter(|shard| shard.replicas.contains(&self.node_id))
            .map(|shard| onekv_replica::ShardConfig {
                id: shard.id,
                voters: shard.replicas.clone(),
                primary: shard.replicas.first().copied(),
            })
            .collect();
        config.storage = self.storage;
        config.tick = Duration::from_millis(self.raft.tick_ms);
        config.election_ticks = self.raft.election_ticks;
        config.heartbeat_ticks = self.raft.heartbeat_ticks;
        config.lease_reads = self.raft.lease_reads;
        config.fast_path = self.cluster.fast_path;
        config.raft_log_keep_entries = self.raft.raft_log_keep_entries;
        config.snapshot_chunk_bytes = self.raft.snapshot_chunk_bytes as usize;
        config.snapshot_from_followers = self.raft.snapshot_from_followers;
        config.snapshot_fetch_bytes_per_sec = self.raft.snapshot_fetch_bytes_per_sec;
        config.limits = self.limits.to_limits();
        config.memtable_bytes = self.index.memtable_bytes;
        config.follower_memtable_bytes = self.index.follower_memtable_bytes;
        config.index_layout = match self.index.layout {
            IndexLayoutName::Decoupled => {
                onekv_replica::IndexLayout::Decoupled { follower_runs: self.index.follower_runs }
            }
            IndexLayoutName::Uniform => onekv_replica::IndexLayout::Uniform,
        };
        config.segment_bytes = self.log.segment_bytes;
        config.recycled_segments = self.log.recycled_segments;
        config.min_free_bytes = self.disk.min_free_bytes;
        config.reserve_bytes = self.disk.reserve_bytes;
        config.scrub_bytes_per_sec = self.log.scrub_bytes_per_sec;
        config.gc = onekv_replica::GcConfig {
            enabled: self.gc.enabled,
            target_space_amp: self.gc.target_space_amp,
            bytes_per_sec: self.gc.bytes_per_sec,
            interval: Duration::from_millis(self.gc.interval_ms),
            compress_below: self.gc.compress_below_bytes,
        };
        config.dedup = onekv_replica::DedupConfig {
            mode: self.dedup.mode.mode(),
            min_value_bytes: self.dedup.min_value_bytes,
            memory_bytes: self.dedup.memory_bytes,
            references: self.dedup.references,
            ..onekv_replica::DedupConfig::default()
        };
        config
    }
}

/// Node 1 of three members on 127.0.0.1:7001..7003, its data in `dir`: the unit tests' node.
#[cfg(test)]
pub(crate) fn node_one_of_three(dir: &Path) -> ServerConfig {
    ServerConfig {
        node_id: 1,
        listen: "127.0.0.1:7001".into(),
        data_dir: dir.to_path_buf(),
        members: (1..=3).map(|id| MemberConfig { id, address: format!("127.0.0.1:{}", 7000 + id) }).collect(),
        ..ServerConfig::default()
    }
}

/// [`ServerConfig::worker_threads`] for each of `nodes` nodes that share this machine: its cores
/// divided between them, at least 1.
pub fn worker_threads_sharing_cores(nodes: u64) -> u64 {
    let cores = std::thread::available_parallelism().map_or(1, |cores| cores.get() as u64);
    (cores / nodes.max(1)).max(1)
}

fn check_range(problem: &mut impl FnMut(&str, String), field: &str, value: u64, (min, max): (u64, u64)) {
    if value < min || value > max {
        problem(field, format!("= {value} is outside the allowed range {min}..={max}"));
    }
}

/// Checks `host:port` syntax without resolving the host (validation must not depend on DNS).
/// Returns the reason when it is not.
pub fn check_address(address: &str) -> Result<(), String> {
    if address.contains("://") {
        return Err("must be host:port, without a scheme".into());
    }
    if address.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err("must be host:port (no spaces or slashes)".into());
    }
    if address.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(());
    }
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err("must be host:port (no port)".into());
    };
    if host.is_empty() {
        return Err("must be host:port (no host)".into());
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err("must be host:port (write IPv6 addresses as [addr]:port)".into());
    }
    match port.parse::<u16>() {
        Ok(0) => Err("has port 0; peers and clients need a fixed port".into()),
        Ok(_) => Ok(()),
        Err(_) => Err(format!("has an invalid port {port:?} (expected 1..=65535)")),
    }
}

/// Parses the `--members` flag syntax, `ID=HOST:PORT,ID=HOST:PORT,...`. Checks syntax only;
/// [`ServerConfig::validate`] checks the rest.
pub fn parse_members(list: &str) -> Result<Vec<MemberConfig>, ConfigError> {
    let error = |reason: String| ConfigError::Members { list: list.to_string(), reason };
    let mut members = Vec::new();
    for item in list.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(error("an entry is empty".into()));
        }
        let Some((id, address)) = item.split_once('=') else {
            return Err(error(format!("{item:?} has no '='")));
        };
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| error(format!("{item:?} has an id that is not a non-negative integer")))?;
        members.push(MemberConfig { id, address: address.trim().to_string() });
    }
    Ok(members)
}

/// (De)serializes [`StorageMode`] by its configuration name.
mod storage_mode {
    use onekv_replica::StorageMode;
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(mode: &StorageMode, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(mode.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<StorageMode, D::Error> {
        let name = String::deserialize(deserializer)?;
        StorageMode::parse(&name).ok_or_else(|| {
            D::Error::custom(format!(
                "unknown storage mode {name:?} (expected \"onelog\", \"separated\" or \"classic\")"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        for good in ["127.0.0.1:7001", "localhost:1", "[::1]:7001", "node-3.example.com:65535"] {
            assert_eq!(check_address(good), Ok(()), "{good}");
        }
        for bad in
            ["", "127.0.0.1", ":7001", "host:0", "host:65536", "host:x", "http://h:1", "a b:1", "::1:7"]
        {
            assert!(check_address(bad).is_err(), "{bad}");
        }
    }

    /// A valid configuration of a one-node cluster.
    fn one_node_config() -> ServerConfig {
        ServerConfig {
            node_id: 1,
            listen: "127.0.0.1:7001".into(),
            data_dir: PathBuf::from("data"),
            members: vec![MemberConfig { id: 1, address: "127.0.0.1:7001".into() }],
            ..ServerConfig::default()
        }
    }

    #[test]
    fn a_snapshot_fetch_rate_is_none_or_fast_enough_for_a_chunk_to_wait_10_s_at_most() {
        let mut config = one_node_config();
        config.raft.snapshot_fetch_bytes_per_sec = 0;
        config.validate().unwrap();
        config.raft.snapshot_fetch_bytes_per_sec = 512 << 10;
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("snapshot_fetch_bytes_per_sec must be 0 (no bound) or at least"), "{error}");
        // The default 4 MiB chunks need 1 MiB/s; 64 MiB chunks need two of them per 10 s.
        config.raft.snapshot_fetch_bytes_per_sec = 1 << 20;
        config.validate().unwrap();
        config.raft.snapshot_chunk_bytes = 64 << 20;
        assert!(config.validate().is_err());
        config.raft.snapshot_fetch_bytes_per_sec = 64 << 20;
        config.validate().unwrap();
        assert_eq!(ServerConfig::parse(&config.to_toml()).unwrap(), config);
    }

    #[test]
    fn resp_listen_needs_its_own_valid_address() {
        let mut config = one_node_config();
        config.validate().unwrap();
        config.resp_listen = Some("127.0.0.1:6379".into());
        config.validate().unwrap();
        let fields = |config: &ServerConfig| -> Vec<String> {
            config.validate().unwrap_err().problems().iter().map(|problem| problem.field.clone()).collect()
        };
        config.resp_listen = Some("127.0.0.1".into());
        assert_eq!(fields(&config), ["resp_listen"]);
        config.resp_listen = Some("127.0.0.1:7001".into());
        assert_eq!(fields(&config), ["resp_listen"]);
        config.http_listen = Some("127.0.0.1:9001".into());
        config.resp_listen = Some("127.0.0.1:9001".into());
        assert_eq!(fields(&config), ["resp_listen"]);
        // It survives the trip through TOML.
        config.resp_listen = Some("127.0.0.1:6379".into());
        assert_eq!(ServerConfig::parse(&config.to_toml()).unwrap(), config);
    }

    #[test]
    fn members_flag() {
        let members = parse_members("1=127.0.0.1:7001, 2=h:7002").unwrap();
        assert_eq!(
            members,
            vec![
                MemberConfig { id: 1, address: "127.0.0.1:7001".into() },
                MemberConfig { id: 2, address: "h:7002".into() }
            ]
        );
        for bad in ["", "1=a:1,", "a:1", "x=a:1", "-1=a:1"] {
            assert!(matches!(parse_members(bad), Err(ConfigError::Members { .. })), "{bad}");
        }
    }
}
