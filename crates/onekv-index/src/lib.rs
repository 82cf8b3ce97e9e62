//! The index: per-shard trees mapping keys to where their values live, on `lsm-tree`, with no WAL.
//!
//! An [`Index`] is a directory of named [`Tree`]s (`shard-1`, `raft-entries`, ...). A replica applies
//! committed Raft entries into a tree as `key -> IndexValue`, where an [`IndexValue`] is usually a
//! [`onekv_log::Locator`] naming the value's bytes inside the Raft entry in the node's log.
//!
//! # Durability: flush flags instead of a WAL
//!
//! Trees keep no write-ahead log: the Raft log already holds every write, so after a crash the
//! replica replays it. For that, each tree records how far it is durable. [`Tree::flush`] writes a
//! **flush flag** (the last applied Raft index whose effects are in the memtable) into the memtable,
//! then rotates and flushes it to a table; lsm-tree fsyncs the table and the manifest before the
//! atomic switch of its `current` file. After reopening, [`Tree::flush_flag`] is the flag of the
//! last flush that completed, and the replica replays from the entry after it. Writes made after
//! that flush are gone after a crash, by design, except those a rewrite flushed without moving the
//! flag ([`Tree::flush_keeping_flag`], and [`Tree::clear`] as it goes): they are on disk above the
//! flag, and the caller redoes the rewrite above them.
//!
//! # Keys on disk
//!
//! Every user key is stored as `0x01 ++ key`; the flag lives at the reserved key `[0x00]`. So the
//! flag never collides with a user key, any byte string is a valid user key (including the empty
//! one, which lsm-tree alone would reject), and user ranges map to `[0x01 ++ start, 0x01 ++ end)` or
//! `[0x01 ++ start, [0x02])`. Callers never see the prefix.
//!
//! # Sequence numbers and visibility
//!
//! The caller supplies a sequence number with every write, derived from the Raft index so that a
//! replay reproduces it exactly. Valid seqnos are [`MIN_SEQNO`]`..=`[`MAX_SEQNO`]: lsm-tree reserves
//! the top bit of its counter (`SequenceNumberCounter::next` asserts `seqno < 2^63`; fjall uses the
//! bit for transactions), and seqno 0 is kept out so that version bookkeeping below stays sound.
//! Writes arrive in non-decreasing seqno order from one thread and stay invisible until
//! [`Tree::publish`] makes everything up to a seqno visible at once, so a batch appears atomically.
//!
//! Reads run at the published seqno from any thread. Two lsm-tree 3.1.10 behaviours shape them:
//!
//! - lsm-tree tags each tree version ("super version") with a number drawn from its
//!   `SequenceNumberCounter` and serves a read at seqno `R` from the newest version tagged below `R`.
//!   We pin that counter to 0 before every flush and compaction (which are serialized), so every
//!   version is tagged 0, every read (at `R >= 1`) uses the newest version, and version garbage
//!   collection can never remove the version a read needs (the panic "should always find a
//!   SuperVersion"). This is why we do **not** `fetch_max` the counter to the highest seqno on open:
//!   a counter above the data seqnos would make reads pick older versions that lack newer memtables.
//! - The MVCC garbage collection of flush and compaction drops every version older than the
//!   watermark that has a newer version, even when that newer version is not yet visible to every
//!   reader (upstream issue fjall-rs/lsm-tree#321). So we pass a real watermark only when it cannot
//!   hurt: when every write is below the oldest read seqno in use (in-flight reads are tracked);
//!   otherwise we pass 1, which collects nothing (see `Tree::gc_watermark`).
//!
//! # Layouts
//!
//! A tree is compacted into the [`Layout`] its caller names at each step: leveled, or at most `S`
//! sorted runs (DEPART's cheaper layout for redundant copies; see the `layout` module). The shape
//! may change from one step to the next.
//!
//! # What this crate does not do
//!
//! It knows nothing of Raft, shards or the network, does not read the log (a locator is 16 opaque
//! bytes here), does not decide when to flush or compact or which layout a tree should have
//! (callers ask, using [`Tree::memtable_bytes`] and their role), and does not replay anything
//! after a crash.

mod config;
mod error;
mod fsutil;
mod index;
mod keys;
mod layout;
mod reads;
mod tree;
mod value;

pub use config::IndexConfig;
pub use error::IndexError;
pub use index::Index;
pub use layout::{Layout, MAX_RUNS};
pub use tree::{Tree, TreeSnapshot};
pub use value::{IndexValue, Packed, decode_stored, expired_at, stored_expiry};

/// The smallest sequence number a write may carry.
pub const MIN_SEQNO: u64 = 1;

/// The largest sequence number a write may carry: lsm-tree reserves the top bit.
pub const MAX_SEQNO: u64 = (1 << 63) - 1;

/// The longest user key: lsm-tree keys are at most `u16::MAX` bytes and we prefix one byte.
pub const MAX_KEY_LEN: usize = u16::MAX as usize - keys::PREFIX_LEN;

/// The longest value: lsm-tree stores value lengths as `u32`.
pub const MAX_VALUE_LEN: u64 = u32::MAX as u64;
