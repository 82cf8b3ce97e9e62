//! etcd as a [`Target`]: the same YCSB operations over etcd's v3 gRPC KV API, so `onekv bench`
//! can put onekv next to a widely deployed Raft store.
//!
//! Owns: the mapping of each operation onto etcd's `Range` and `Put` and the choice of endpoint.
//! Does not own starting etcd (`local_etcd`) nor the wire schema beyond the few fields in
//! `proto/etcd_kv.proto`.
//!
//! Reads are linearizable (`serializable = false`, etcd's default), as onekv's are; writes go to
//! any member, which forwards them to its leader, so the target only moves to another endpoint
//! when the current one is unreachable (`UNAVAILABLE`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::target::{Target, TargetError, TargetResult};

/// The generated etcd v3 KV types (only what the harness uses).
#[allow(missing_docs)]
pub mod proto {
    tonic::include_proto!("etcdserverpb");
}

use proto::kv_client::KvClient;
use proto::{PutRequest, RangeRequest};

/// How long one request may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting to one endpoint may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// `range_end` meaning "every key from `key` on" in etcd's API.
const RANGE_TO_END: &[u8] = b"\0";

/// An etcd cluster through its v3 gRPC API; cheap to share between client tasks (the channels
/// multiplex requests).
#[derive(Debug)]
pub struct EtcdTarget {
    endpoints: Vec<String>,
    clients: Vec<KvClient<Channel>>,
    // The endpoint requests start at; moved on when it is unavailable.
    current: AtomicUsize,
}

impl EtcdTarget {
    /// Drives the etcd members at `endpoints` (`host:port` or `http://host:port`); connects lazily.
    pub fn new(endpoints: &[String]) -> TargetResult<EtcdTarget> {
        if endpoints.is_empty() {
            return Err(TargetError("no etcd endpoint given".into()));
        }
        let mut clients = Vec::new();
        let mut urls = Vec::new();
        for endpoint in endpoints {
            let url = if endpoint.contains("://") { endpoint.clone() } else { format!("http://{endpoint}") };
            let channel = Endpoint::from_shared(url.clone())
                .map_err(|error| TargetError(format!("bad etcd endpoint {endpoint:?}: {error}")))?
                .connect_timeout(CONNECT_TIMEOUT)
                .timeout(REQUEST_TIMEOUT)
                .connect_lazy();
            clients.push(KvClient::new(channel));
            urls.push(url);
        }
        Ok(EtcdTarget { endpoints: urls, clients, current: AtomicUsize::new(0) })
    }

    /// The endpoints' URLs.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Runs `call` against the current endpoint, then each other one in turn while the answer is
    /// `UNAVAILABLE` (the member is down or cut off); any other error is returned at once.
    async fn with_failover<T, F, Fut>(&self, call: F) -> TargetResult<T>
    where
        F: Fn(KvClient<Channel>) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let start = self.current.load(Ordering::Relaxed);
        let mut last = None;
        for offset in 0..self.clients.len() {
            let index = (start + offset) % self.clients.len();
            match call(self.clients[index].clone()).await {
                Ok(value) => {
                    if offset > 0 {
                        self.current.store(index, Ordering::Relaxed);
                    }
                    return Ok(value);
                }
                Err(status) if status.code() == Code::Unavailable => last = Some(status),
                Err(status) => return Err(status_error(&status)),
            }
        }
        Err(last.map_or_else(|| TargetError("no etcd endpoint".into()), |status| status_error(&status)))
    }

    async fn get(&self, key: &[u8]) -> TargetResult<bool> {
        let request =
            RangeRequest { key: key.to_vec(), range_end: Vec::new(), limit: 1, serializable: false };
        let response = self
            .with_failover(|mut client| {
                let request = request.clone();
                async move { client.range(request).await }
            })
            .await?;
        Ok(!response.into_inner().kvs.is_empty())
    }

    async fn put(&self, key: &[u8], value: &[u8]) -> TargetResult<()> {
        let request = PutRequest { key: key.to_vec(), value: value.to_vec() };
        self.with_failover(|mut client| {
            let request = request.clone();
            async move { client.put(request).await }
        })
        .await?;
        Ok(())
    }
}

fn status_error(status: &Status) -> TargetError {
    TargetError(format!("etcd: {:?}: {}", status.code(), status.message()))
}

impl Target for EtcdTarget {
    async fn read(&self, key: &[u8]) -> TargetResult<bool> {
        self.get(key).await
    }

    async fn update(&self, key: &[u8], value: &[u8]) -> TargetResult<()> {
        self.put(key, value).await
    }

    async fn insert(&self, key: &[u8], value: &[u8]) -> TargetResult<()> {
        self.put(key, value).await
    }

    async fn scan(&self, start: &[u8], count: u32) -> TargetResult<usize> {
        let request = RangeRequest {
            key: start.to_vec(),
            range_end: RANGE_TO_END.to_vec(),
            limit: i64::from(count),
            serializable: false,
        };
        let response = self
            .with_failover(|mut client| {
                let request = request.clone();
                async move { client.range(request).await }
            })
            .await?;
        Ok(response.into_inner().kvs.len())
    }

    async fn read_modify_write(&self, key: &[u8], value: &[u8]) -> TargetResult<bool> {
        let found = self.get(key).await?;
        self.put(key, value).await?;
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A runtime, because channels are created (lazily) on one.
    #[tokio::test]
    async fn endpoints_get_a_scheme_and_an_empty_list_is_refused() {
        let target = EtcdTarget::new(&["127.0.0.1:2379".into(), "http://127.0.0.1:2380".into()]).unwrap();
        assert_eq!(target.endpoints(), ["http://127.0.0.1:2379", "http://127.0.0.1:2380"]);
        assert!(EtcdTarget::new(&[]).is_err());
        assert!(EtcdTarget::new(&["bad host:1".into()]).is_err());
    }

    #[tokio::test]
    async fn an_unreachable_cluster_fails_with_unavailable_after_trying_every_endpoint() {
        // Ports bound then released: nothing listens there.
        let ports: Vec<String> = (0..2)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string())
            .collect();
        let target = EtcdTarget::new(&ports).unwrap();
        let error =
            tokio::time::timeout(Duration::from_secs(20), target.read(b"k")).await.unwrap().unwrap_err();
        assert!(error.0.contains("Unavailable"), "{error}");
    }
}
