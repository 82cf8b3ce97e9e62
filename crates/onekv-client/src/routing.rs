//! Which node to ask: the known endpoints, the cached leader, round-robin order, which endpoints
//! refused a connection moments ago, and one lazily created gRPC channel per endpoint.
//!
//! Owns: the mutable routing state shared by every clone of a `Client`. Does not own: the retry
//! policy (that is `retry`), or anything about what the requests mean.
//!
//! All methods are synchronous and hold the lock only briefly, so no lock is ever held across an
//! `.await` and the client's futures stay `Send`.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};

use crate::error::{ClientError, Result};

/// Turns a user- or server-supplied address into the form the client stores: `host:port`, without
/// a scheme, so that an address from a redirect and the same address from the command line compare
/// equal.
pub(crate) fn normalize(endpoint: &str) -> Result<String> {
    let invalid = |reason: &str| ClientError::InvalidEndpoint {
        endpoint: endpoint.to_string(),
        reason: reason.to_string(),
    };
    let trimmed = endpoint.trim();
    let address = trimmed.strip_prefix("http://").unwrap_or(trimmed).trim_end_matches('/');
    if address.is_empty() {
        return Err(invalid("empty address"));
    }
    if address.contains("://") {
        return Err(invalid("only plain http://host:port is supported (no TLS)"));
    }
    if address.contains('/') {
        return Err(invalid("expected host:port without a path"));
    }
    Endpoint::from_shared(uri(address)).map_err(|error| invalid(&error.to_string()))?;
    Ok(address.to_string())
}

fn uri(address: &str) -> String {
    format!("http://{address}")
}

/// How long an endpoint that could not be reached stays suspect: it is not chosen round-robin
/// while another endpoint is not suspect, and redirects naming it are not followed. Long enough to
/// cover the moments after a leader dies, while followers still name it (until the election that
/// follows, one or two election timeouts); short enough that a restarted node is used again soon.
/// Every new refusal starts the period again.
pub(crate) const UNREACHABLE_MEMORY: Duration = Duration::from_secs(2);

/// What a call goes through: a connection to the node, or the node's own `Kv` service when the
/// client runs inside it ([`crate::LocalKv`]).
pub(crate) type Conn = tower::util::Either<Channel, crate::LocalKv>;

/// How channels are configured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChannelSettings {
    pub(crate) connect_timeout: Duration,
}

/// The routing state shared by all clones of one client.
#[derive(Debug)]
pub(crate) struct Routing {
    settings: ChannelSettings,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The configured endpoints followed by leader addresses learnt from redirects, no duplicates.
    known: Vec<String>,
    /// Per shard, the endpoint that last served a leader-only request of it (or, until one did,
    /// the address of the shard's primary, its preferred leader).
    leaders: HashMap<u64, String>,
    /// Round-robin cursor into `known`.
    next: usize,
    /// Endpoints that could not be reached (connection refused or broken), and when that was last
    /// seen. Entries older than [`UNREACHABLE_MEMORY`] no longer count; an endpoint that answers
    /// anything is removed.
    unreachable: HashMap<String, Instant>,
    channels: HashMap<String, Channel>,
    /// The endpoint served in this process, and its service ([`Routing::serve_locally`]).
    local: Option<(String, crate::LocalKv)>,
}

impl State {
    fn is_unreachable(&self, endpoint: &str, now: Instant) -> bool {
        self.unreachable.get(endpoint).is_some_and(|since| now.duration_since(*since) < UNREACHABLE_MEMORY)
    }
}

impl Routing {
    /// `endpoints` must already be normalized and free of duplicates.
    pub(crate) fn new(endpoints: Vec<String>, settings: ChannelSettings) -> Routing {
        Routing {
            settings,
            state: Mutex::new(State {
                known: endpoints,
                leaders: HashMap::new(),
                next: 0,
                unreachable: HashMap::new(),
                channels: HashMap::new(),
                local: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent even if a holder panicked: every update is a single assignment.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every endpoint the client knows now: the configured ones, then learnt leaders.
    pub(crate) fn known(&self) -> Vec<String> {
        self.lock().known.clone()
    }

    /// The cached leader of `shard`, if any.
    pub(crate) fn leader(&self, shard: u64) -> Option<String> {
        self.lock().leaders.get(&shard).cloned()
    }

    /// Remembers `endpoint` as the leader of `shard`.
    pub(crate) fn set_leader(&self, shard: u64, endpoint: &str) {
        let mut state = self.lock();
        if state.leaders.get(&shard).map(String::as_str) != Some(endpoint) {
            state.leaders.insert(shard, endpoint.to_string());
        }
    }

    /// Guesses `endpoint` as the leader of `shard` unless one is cached already (a shard's primary,
    /// before any request of it was served).
    pub(crate) fn guess_leader(&self, shard: u64, endpoint: &str) {
        self.lock().leaders.entry(shard).or_insert_with(|| endpoint.to_string());
    }

    /// Forgets the cached leader of `shard` if it is `endpoint` (another task may already have
    /// found a newer one, which must not be thrown away).
    pub(crate) fn forget_leader(&self, shard: u64, endpoint: &str) {
        let mut state = self.lock();
        if state.leaders.get(&shard).map(String::as_str) == Some(endpoint) {
            state.leaders.remove(&shard);
        }
    }

    /// Adds `endpoint` (normalized) to the known endpoints if it is new.
    pub(crate) fn learn(&self, endpoint: &str) {
        let mut state = self.lock();
        if !state.known.iter().any(|known| known == endpoint) {
            state.known.push(endpoint.to_string());
        }
    }

    /// Remembers that `endpoint` could not be reached just now (see [`UNREACHABLE_MEMORY`]).
    pub(crate) fn mark_unreachable(&self, endpoint: &str) {
        self.lock().unreachable.insert(endpoint.to_string(), Instant::now());
    }

    /// Forgets that `endpoint` could not be reached: it answered.
    pub(crate) fn mark_reachable(&self, endpoint: &str) {
        let mut state = self.lock();
        if !state.unreachable.is_empty() {
            state.unreachable.remove(endpoint);
        }
    }

    /// Whether `endpoint` could not be reached within the last [`UNREACHABLE_MEMORY`].
    pub(crate) fn is_unreachable(&self, endpoint: &str) -> bool {
        self.lock().is_unreachable(endpoint, Instant::now())
    }

    /// The cached leader of `shard` unless it is `avoid`, else the next endpoint in round-robin
    /// order.
    pub(crate) fn leader_or_next(&self, shard: u64, avoid: Option<&str>) -> String {
        {
            let state = self.lock();
            if let Some(leader) = state.leaders.get(&shard)
                && Some(leader.as_str()) != avoid
            {
                return leader.clone();
            }
        }
        self.next(avoid)
    }

    /// The next endpoint in round-robin order, preferring one that is neither `avoid` nor
    /// recently unreachable, then one that is not `avoid`; with no other choice, `avoid` itself.
    pub(crate) fn next(&self, avoid: Option<&str>) -> String {
        let mut state = self.lock();
        let now = Instant::now();
        let count = state.known.len();
        let start = state.next;
        let order: Vec<usize> = (0..count).map(|step| start.wrapping_add(step) % count).collect();
        let pick = order
            .iter()
            .copied()
            .find(|&i| Some(state.known[i].as_str()) != avoid && !state.is_unreachable(&state.known[i], now))
            .or_else(|| order.iter().copied().find(|&i| Some(state.known[i].as_str()) != avoid))
            // Only `avoid` is known (`Client::new` guarantees at least one endpoint).
            .unwrap_or(start % count);
        state.next = pick.wrapping_add(1);
        state.known[pick].clone()
    }

    /// Calls to `endpoint` (normalized) go to `service` from now on, not over a connection.
    pub(crate) fn serve_locally(&self, endpoint: String, service: crate::LocalKv) {
        self.lock().local = Some((endpoint, service));
    }

    /// Whether calls to `endpoint` (normalized) are served in this process.
    pub(crate) fn is_local(&self, endpoint: &str) -> bool {
        self.lock().local.as_ref().is_some_and(|(local, _)| local == endpoint)
    }

    /// The way to `endpoint` (normalized): the local service if it is the one served in this
    /// process, else its channel, created on first use. Creating a channel does not connect: tonic
    /// connects on the first request and reconnects after a failure.
    ///
    /// Must be called inside a tokio runtime (a channel spawns its worker task there).
    pub(crate) fn channel(&self, endpoint: &str) -> Result<Conn> {
        let mut state = self.lock();
        if let Some((local, service)) = &state.local
            && local == endpoint
        {
            return Ok(Conn::Right(service.clone()));
        }
        if let Some(channel) = state.channels.get(endpoint) {
            return Ok(Conn::Left(channel.clone()));
        }
        let channel = Endpoint::from_shared(uri(endpoint))
            .map_err(|error| ClientError::InvalidEndpoint {
                endpoint: endpoint.to_string(),
                reason: error.to_string(),
            })?
            .connect_timeout(self.settings.connect_timeout)
            .tcp_nodelay(true)
            .connect_lazy();
        state.channels.insert(endpoint.to_string(), channel.clone());
        Ok(Conn::Left(channel))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routing(endpoints: &[&str]) -> Routing {
        Routing::new(
            endpoints.iter().map(|e| e.to_string()).collect(),
            ChannelSettings { connect_timeout: Duration::from_secs(1) },
        )
    }

    #[test]
    fn normalize_accepts_host_port_and_http_and_rejects_others() {
        assert_eq!(normalize(" 127.0.0.1:7001 ").unwrap(), "127.0.0.1:7001");
        assert_eq!(normalize("http://localhost:7001/").unwrap(), "localhost:7001");
        assert!(matches!(normalize(""), Err(ClientError::InvalidEndpoint { .. })));
        assert!(matches!(normalize("https://a:1"), Err(ClientError::InvalidEndpoint { .. })));
        assert!(matches!(normalize("a:1/path"), Err(ClientError::InvalidEndpoint { .. })));
        assert!(matches!(normalize("a b:1"), Err(ClientError::InvalidEndpoint { .. })));
    }

    #[test]
    fn round_robin_skips_the_endpoint_to_avoid() {
        let routing = routing(&["a:1", "b:1", "c:1"]);
        assert_eq!(routing.next(None), "a:1");
        assert_eq!(routing.next(Some("b:1")), "c:1");
        assert_eq!(routing.next(None), "a:1");
        let single = self::routing(&["a:1"]);
        assert_eq!(single.next(Some("a:1")), "a:1");
    }

    #[test]
    fn leader_is_preferred_unless_avoided_and_forgotten_only_if_it_matches() {
        let routing = routing(&["a:1", "b:1"]);
        routing.set_leader(1, "b:1");
        assert_eq!(routing.leader_or_next(1, None), "b:1");
        assert_eq!(routing.leader_or_next(1, Some("b:1")), "a:1");
        routing.forget_leader(1, "a:1");
        assert_eq!(routing.leader(1).as_deref(), Some("b:1"));
        // Each shard has its own leader.
        routing.guess_leader(2, "c:1");
        routing.guess_leader(1, "c:1");
        assert_eq!(routing.leader(2).as_deref(), Some("c:1"));
        assert_eq!(routing.leader(1).as_deref(), Some("b:1"), "a guess never replaces a leader");
        routing.forget_leader(1, "b:1");
        assert_eq!(routing.leader(1), None);
        assert_eq!(routing.leader(2).as_deref(), Some("c:1"));
    }

    #[test]
    fn round_robin_passes_over_unreachable_endpoints_while_there_is_another_choice() {
        let routing = routing(&["a:1", "b:1", "c:1"]);
        routing.mark_unreachable("b:1");
        assert!(routing.is_unreachable("b:1"));
        assert_eq!(routing.next(None), "a:1");
        assert_eq!(routing.next(None), "c:1");
        assert_eq!(routing.next(None), "a:1");
        // Avoiding the only reachable one leaves the unreachable ones, in order.
        routing.mark_unreachable("c:1");
        assert_eq!(routing.next(Some("a:1")), "b:1");
        // An answer clears the mark.
        routing.mark_reachable("b:1");
        assert!(!routing.is_unreachable("b:1"));
        assert_eq!(routing.next(Some("a:1")), "b:1");
        let single = self::routing(&["a:1"]);
        single.mark_unreachable("a:1");
        assert_eq!(single.next(Some("a:1")), "a:1");
    }

    #[test]
    fn an_unreachable_mark_expires() {
        let routing = routing(&["a:1"]);
        routing.lock().unreachable.insert("a:1".into(), Instant::now() - UNREACHABLE_MEMORY);
        assert!(!routing.is_unreachable("a:1"));
    }

    #[test]
    fn learnt_endpoints_are_added_once() {
        let routing = routing(&["a:1"]);
        routing.learn("b:1");
        routing.learn("b:1");
        routing.learn("a:1");
        assert_eq!(routing.known(), vec!["a:1".to_string(), "b:1".to_string()]);
    }
}
