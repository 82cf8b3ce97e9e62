//! The onekv client library: a `Client` handle that finds the leader, follows redirects and retries
//! with jittered exponential backoff for a bounded time that outlasts an election
//! (`ClientOptions::retry_budget`), giving every write a request id that its retries reuse so the
//! server applies it at most once. A node that answers UNAVAILABLE (no leader known, shutting
//! down, or failed) is forgotten as leader and another one is asked; a node that refused a
//! connection is, for a short while, not trusted as the target of a redirect. Get, Put and Delete
//! calls that wait for the same node at the same time travel to it in one `Multi` call, each still
//! its own call ([`coalesce`]).
//!
//! Owns: talking to a cluster over the `Kv` gRPC service (`onekv-proto`): connections, leader
//! discovery, retries, request ids, coalescing. Does not own: anything about server internals (it
//! knows only the wire protocol and the cluster map), the placement rules (`onekv-placement`), the
//! node's side of the fast path (the client's is [`Client::put_fast`]: `docs/design/fast-path.md`),
//! or the command line (the `onekv` binary).
//!
//! ```no_run
//! # async fn example() -> Result<(), onekv_client::ClientError> {
//! use onekv_client::{Client, ClientOptions};
//! let client = Client::new(vec!["127.0.0.1:7001".into()], ClientOptions::default())?;
//! client.put(b"k", b"v").await?;
//! assert_eq!(client.get(b"k").await?, Some(b"v".to_vec()));
//! # Ok(())
//! # }
//! ```

mod client;
pub mod coalesce;
mod error;
mod retry;
mod routing;

pub use client::{
    BatchItem, BlindWrite, CasResult, Client, ClientOptions, ClusterSecret, Expiry, KeyPage, LocalKv,
    MAX_RESPONSE_BYTES, ScanPage, TxnResult, WriteItem, fast_write_completes,
};
pub use error::{ClientError, Result};
pub use onekv_proto::{DedupProgress, Member, ShardStatus, StatusResponse};
