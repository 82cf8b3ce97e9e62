//! The RESP2/RESP3 (Redis serialization protocol) front end of a onekv node, so redis-cli,
//! redis-benchmark and Redis client libraries work against onekv unmodified.
//!
//! Owns:
//! - [`protocol`]: the incremental, bounded request parser (inline and multibulk) and the reply
//!   encoder;
//! - [`commands`]: the command table (name, arity, flags, docs) and the one place that decides which
//!   commands are blind writes;
//! - [`pattern`]: Redis glob patterns (SCAN's MATCH, CONFIG GET);
//! - [`exec`]: running one command through [`onekv_client::Client`], which routes it to the shard's
//!   leader and retries with request ids;
//! - [`server`]: [`serve_resp`], the listener with one task per connection, bounded connections and
//!   buffers, pipelined replies in order.
//!
//! Does not own the store's semantics (the replica), routing and retries (the client), the node's
//! configuration or process (`onekv-server`). Every difference from Redis is listed in `docs/redis.md`.

pub mod commands;
pub mod exec;
pub mod pattern;
pub mod protocol;
pub mod server;

pub use exec::{DEFAULT_WRITE_TIMEOUT, RespContext, RespSettings};
pub use protocol::{ParserLimits, Protocol, ProtocolError, Reply, RequestParser};
pub use server::serve_resp;
