//! A replica of one shard: onekv's state machine replicated with Raft on the node's one log.
//!
//! This crate owns everything between a client command and the bytes on disk:
//! - the command codec ([`codec`]), which reports where each value sits inside an encoded entry;
//! - Raft's storage ([`raft_store`]), served from the log through an index → locator map;
//! - the node loop ([`node`]): one thread drives the Raft groups, one fsync covers all of them;
//! - applying committed entries into the index ([`apply`]) and recovery directed by consensus
//!   ([`recovery`]);
//! - the storage modes (`onelog`, `separated`, `classic`, see [`StorageMode`]).
//!
//! It does not own the network (the caller passes a [`Transport`] and feeds peer messages to
//! [`Replica::step`]), the wire format, configuration files or processes: those are the server's.

mod api;

pub use api::*;
