//! A node's replicas of its shards: onekv's state machine replicated with Raft, one group per
//! shard, all on the node's one log.
//!
//! This crate owns everything between a client command and the bytes on disk:
//! - the command codec ([`codec`]), which reports where each value sits inside an encoded entry;
//! - the replica's log records (`records`) and Raft's storage served from the log (`raft_store`);
//! - the node loop (`node`): one thread drives every shard's Raft group (`group`); one append
//!   and fsync per turn covers every entry and hard state of every group in that turn;
//! - applying committed entries into the index (`apply`) and recovery directed by consensus
//!   (`recovery`);
//! - what the replica does about a filling disk: the "disk full" alarm, the reserve file and
//!   handing leadership away (`disk_space`);
//! - the storage modes (`onelog`, `separated`, `classic`, see [`StorageMode`]) and crash points for
//!   tests ([`failpoints`]);
//! - finding damaged values: every read verifies the value's checksum and reports damage as
//!   [`ReplicaError::Corrupt`] (`state`), and a background scrub verifies every value at a bounded
//!   rate (`scrub`);
//! - changing a shard's members with joint consensus (`membership`), and adding or removing a
//!   shard's replica on a running node (`hosting`; the node's list of them is `hosted`);
//! - expiring keys: puts carry an absolute expiry time ([`Expiry`]), expired keys read as absent,
//!   and each shard's leader deletes them through Raft at a bounded rate (`expiry`);
//! - the log garbage collector (`gc`): relocates live values out of the log's oldest segment and
//!   deletes it, so disk stays bounded; readers pin what they read (`pins`).
//!
//! It does not own the network (the caller passes a [`Transport`] and feeds peer messages to
//! [`Replica::step`]), the wire format, configuration files or processes: those are the server's.

mod api;
mod apply;
pub mod codec;
mod dedup;
mod disk_space;
mod expiry;
pub mod failpoints;
mod fast;
mod gc;
mod group;
mod hosted;
mod hosting;
mod identity;
mod lease;
pub mod local;
mod maintenance;
mod membership;
mod node;
pub mod packed;
mod pins;
mod raft_store;
pub mod records;
mod recovery;
mod rejoin;
mod replica;
mod requests;
mod scrub;
mod slog_bridge;
mod snapshot;
mod state;
mod wire_refs;

pub use api::*;
pub use dedup::{DedupConfig, DedupMode, DedupStatus};
pub use disk_space::RESERVE_FILE;
pub use fast::FastAck;
pub use gc::{GcConfig, GcStatus};
pub use identity::{CLUSTER_MAP_FILE, MEMBERS_FILE, create_dir_all_synced};
pub use lease::MIN_LEASE_ELECTION_TICKS;
pub use maintenance::{CrashHook, CrashPoint, GcPoint};
pub use membership::{MAX_PROMOTION_LAG, Members, MembershipChange};
pub use replica::{DrivenLoop, Node, Replica};
