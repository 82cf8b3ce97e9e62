//! The system under test, behind a small async trait, and its onekv implementation.
//!
//! Owns: how each YCSB operation maps onto a store's API. Does not own: choosing operations
//! (`workload`) or timing them (`runner`). etcd (`crate::etcd`) is one more implementation of
//! [`Target`]; nothing else in the harness knows which store it drives.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use onekv_client::Client;

/// Why an operation failed. The runner counts failures per operation type and keeps the first
/// message of each, so the text should say what went wrong.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct TargetError(pub String);

impl From<onekv_client::ClientError> for TargetError {
    fn from(error: onekv_client::ClientError) -> Self {
        TargetError(error.to_string())
    }
}

/// The outcome of one operation.
pub type TargetResult<T> = Result<T, TargetError>;

/// A store the harness can drive. Each method is one YCSB operation; a call that returns `Ok` was
/// acknowledged by the store. Implementations are shared by every client task.
pub trait Target: Send + Sync + 'static {
    /// Reads `key`; `Ok(false)` if it is absent.
    fn read(&self, key: &[u8]) -> impl Future<Output = TargetResult<bool>> + Send;
    /// Overwrites `key` with `value`.
    fn update(&self, key: &[u8], value: &[u8]) -> impl Future<Output = TargetResult<()>> + Send;
    /// Writes the new record `key`.
    fn insert(&self, key: &[u8], value: &[u8]) -> impl Future<Output = TargetResult<()>> + Send;
    /// Reads up to `count` records from `start` on; returns how many it read.
    fn scan(&self, start: &[u8], count: u32) -> impl Future<Output = TargetResult<usize>> + Send;
    /// Reads `key`, then writes `value` to it (as YCSB does: the new value does not depend on the
    /// old one); `Ok(false)` if the read found nothing (the write is still made).
    fn read_modify_write(&self, key: &[u8], value: &[u8]) -> impl Future<Output = TargetResult<bool>> + Send;
}

/// onekv through its client library: update and insert are puts (by the fast path when asked), a scan is one linearizable
/// `scan(start, None, count)` page, a read-modify-write is a linearizable get then a put.
#[derive(Debug, Clone)]
pub struct OnekvTarget {
    client: Client,
    /// Whether puts take the fast path (`Client::put_fast`), and how many were done fast and how
    /// many fell back to the Raft path.
    fast_path: bool,
    fast_counts: Arc<[AtomicU64; 2]>,
}

impl OnekvTarget {
    /// Drives the cluster `client` talks to.
    pub fn new(client: Client) -> OnekvTarget {
        OnekvTarget { client, fast_path: false, fast_counts: Arc::default() }
    }

    /// Puts through the fast path when `on`.
    pub fn with_fast_path(mut self, on: bool) -> OnekvTarget {
        self.fast_path = on;
        self
    }

    /// With the fast path: puts done fast, and puts that fell back to the Raft path.
    pub fn fast_writes(&self) -> (u64, u64) {
        let [fast, fell_back] = &*self.fast_counts;
        (fast.load(Ordering::Relaxed), fell_back.load(Ordering::Relaxed))
    }

    async fn put(&self, key: &[u8], value: &[u8]) -> TargetResult<()> {
        if self.fast_path {
            let done = self.client.put_fast(key, value).await?;
            self.fast_counts[usize::from(!done.fast)].fetch_add(1, Ordering::Relaxed);
        } else {
            self.client.put(key, value).await?;
        }
        Ok(())
    }
}

impl Target for OnekvTarget {
    async fn read(&self, key: &[u8]) -> TargetResult<bool> {
        Ok(self.client.get(key).await?.is_some())
    }

    async fn update(&self, key: &[u8], value: &[u8]) -> TargetResult<()> {
        self.put(key, value).await
    }

    async fn insert(&self, key: &[u8], value: &[u8]) -> TargetResult<()> {
        self.put(key, value).await
    }

    async fn scan(&self, start: &[u8], count: u32) -> TargetResult<usize> {
        Ok(self.client.scan(start, None, count, false).await?.pairs.len())
    }

    async fn read_modify_write(&self, key: &[u8], value: &[u8]) -> TargetResult<bool> {
        let found = self.client.get(key).await?.is_some();
        self.put(key, value).await?;
        Ok(found)
    }
}
