//! The retry policy: what each gRPC status means for the next attempt, and how long to wait.
//!
//! Owns: the mapping from a failed attempt to "follow the redirect", "back off and try another
//! node" or "give up now", and the backoff schedule. Does not own: choosing the node (that is
//! `routing`) or running the attempts within the retry budget (that is `client`).
//!
//! UNAVAILABLE covers every "this node cannot serve you, another may": no leader known yet, the
//! node is shutting down, or its replica has failed (a storage failure; such a node stays up but
//! takes no part in Raft, and names no leader). All of them mean: forget this node as leader and
//! try another after a backoff.

use std::error::Error as _;
use std::time::Duration;

use rand::Rng as _;
use tonic::{Code, Status};

use crate::error::ClientError;
use crate::routing::normalize;

/// Why one attempt failed, and what to do about it.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The node is not the leader and named the one that is: ask it at once.
    Redirect {
        /// The leader's normalized address.
        leader: String,
        cause: String,
    },
    /// Worth retrying on another node after a backoff: no leader yet, the node is stopping, it
    /// could not be reached, or it did not answer in time (a write may still commit, which is
    /// why writes are retried with the same request id).
    Retry {
        cause: String,
        /// The node was not reached or did not answer at all (as opposed to answering with an
        /// error status).
        transport: bool,
        /// The connection to the node failed (refused, reset, broken): the node is probably down,
        /// so for a short while redirects naming it are not followed (`routing`). A node that was
        /// reached but did not answer in time is not marked: it may only be slow.
        unreachable: bool,
    },
    /// Retrying cannot help.
    Fatal(ClientError),
}

impl Failure {
    /// The error to report when there is only one node to ask and so no retry; the attempt took
    /// `elapsed`.
    pub(crate) fn into_single_node_error(self, elapsed: Duration) -> ClientError {
        match self {
            Failure::Redirect { cause, .. } => ClientError::Server(cause),
            Failure::Retry { cause, transport: true, .. } => ClientError::Transport(cause),
            Failure::Retry { cause, transport: false, .. } => {
                ClientError::Unavailable { attempts: 1, elapsed, last: cause }
            }
            Failure::Fatal(error) => error,
        }
    }
}

/// An attempt that got no answer within the per-attempt timeout.
pub(crate) fn timed_out(endpoint: &str, timeout: Duration) -> Failure {
    Failure::Retry {
        cause: format!("{endpoint}: no answer within {timeout:?}"),
        transport: true,
        unreachable: false,
    }
}

/// Decides what a failed attempt at `endpoint` means.
pub(crate) fn classify(endpoint: &str, status: &Status) -> Failure {
    let cause = describe(endpoint, status);
    // A status built on this side from a connection or HTTP/2 error carries that error as its
    // source; one sent by a server never does. Such failures are retried whatever code tonic gave
    // them, because the request may not have reached the node (and writes carry request ids, so a
    // duplicate is harmless).
    if status.source().is_some() {
        return Failure::Retry { cause, transport: true, unreachable: true };
    }
    match status.code() {
        Code::InvalidArgument => Failure::Fatal(ClientError::InvalidArgument(status.message().to_string())),
        // A retry of a compare-and-swap or transaction that took no effect (see the variant).
        Code::Aborted => Failure::Fatal(ClientError::NotApplied(status.message().to_string())),
        Code::FailedPrecondition => match leader_address(status) {
            Some(leader) if leader != endpoint => Failure::Redirect { leader, cause },
            // Not the leader and no (other) leader known: an election is probably under way.
            _ => Failure::Retry { cause, transport: false, unreachable: false },
        },
        // CANCELLED is what a tonic server answers when its own request timeout expires.
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
            Failure::Retry { cause, transport: false, unreachable: false }
        }
        // A leader whose disk is nearly full refuses the write before proposing it and hands
        // leadership to a node with room within moments: ask again (elsewhere) within the budget.
        Code::ResourceExhausted if status.message().starts_with(DISK_FULL_PREFIX) => {
            Failure::Retry { cause, transport: false, unreachable: false }
        }
        _ => Failure::Fatal(ClientError::Server(cause)),
    }
}

/// How a node's "disk full" refusal (RESOURCE_EXHAUSTED) begins; other RESOURCE_EXHAUSTED answers
/// are not retried.
const DISK_FULL_PREFIX: &str = "disk full: ";

/// The leader address a not-leader error names, if it names a usable one.
fn leader_address(status: &Status) -> Option<String> {
    let value = status.metadata().get(onekv_proto::LEADER_ADDR_METADATA)?.to_str().ok()?;
    normalize(value).ok()
}

/// `endpoint: Code: message: root cause`, one line.
fn describe(endpoint: &str, status: &Status) -> String {
    let mut text = format!("{endpoint}: {:?}", status.code());
    if !status.message().is_empty() {
        text.push_str(": ");
        text.push_str(status.message());
    }
    // Transport errors nest several layers that repeat each other ("tcp connect error: transport
    // error: tcp connect error: ..."); the innermost one says what actually happened.
    let mut root = None;
    let mut source = status.source();
    while let Some(error) = source {
        root = Some(error);
        source = error.source();
    }
    if let Some(root) = root.map(ToString::to_string)
        && !text.contains(&root)
    {
        text.push_str(": ");
        text.push_str(&root);
    }
    text
}

/// How long to wait before the retry that follows `backoffs_so_far` earlier waits: `base` doubling
/// each time up to `cap`, then a random point in the upper half of that, so that many clients
/// failing together do not retry in lockstep.
pub(crate) fn backoff_delay(base: Duration, cap: Duration, backoffs_so_far: u32) -> Duration {
    let doubled = base.saturating_mul(1u32.checked_shl(backoffs_so_far.min(31)).unwrap_or(u32::MAX));
    let full = doubled.min(cap);
    let full_nanos = u64::try_from(full.as_nanos()).unwrap_or(u64::MAX);
    if full_nanos < 2 {
        return full;
    }
    Duration::from_nanos(rand::rng().random_range(full_nanos / 2..=full_nanos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataValue;

    fn not_leader(address: Option<&str>) -> Status {
        let mut status = Status::failed_precondition("not the leader");
        if let Some(address) = address {
            status
                .metadata_mut()
                .insert(onekv_proto::LEADER_ADDR_METADATA, MetadataValue::try_from(address).unwrap());
        }
        status
    }

    #[test]
    fn statuses_map_to_the_documented_actions() {
        assert!(matches!(
            classify("a:1", &Status::invalid_argument("key too long")),
            Failure::Fatal(ClientError::InvalidArgument(message)) if message == "key too long"
        ));
        assert!(matches!(
            classify("a:1", &not_leader(Some("b:2"))),
            Failure::Redirect { leader, .. } if leader == "b:2"
        ));
        assert!(matches!(classify("a:1", &not_leader(None)), Failure::Retry { transport: false, .. }));
        // A redirect to the node itself would loop: treat it as "no leader known".
        assert!(matches!(classify("a:1", &not_leader(Some("a:1"))), Failure::Retry { .. }));
        assert!(matches!(classify("a:1", &not_leader(Some("https://x:1"))), Failure::Retry { .. }));
        assert!(matches!(classify("a:1", &Status::unavailable("no leader")), Failure::Retry { .. }));
        // A failed node: retried elsewhere, and its text is kept for the caller.
        assert!(matches!(
            classify("a:1", &Status::unavailable("this node failed and no longer serves (storage failure: disk)")),
            Failure::Retry { cause, transport: false, unreachable: false } if cause.contains("storage failure: disk")
        ));
        assert!(matches!(classify("a:1", &Status::deadline_exceeded("slow")), Failure::Retry { .. }));
        // A retried compare-and-swap that took no effect and cannot be answered: not retried.
        assert!(matches!(
            classify("a:1", &Status::aborted("this request was evaluated at entry 9 and took no effect")),
            Failure::Fatal(ClientError::NotApplied(message)) if message.contains("entry 9")
        ));
        // A leader in its disk-full alarm is handing leadership away: retried; other exhaustion not.
        assert!(matches!(
            classify("a:1", &Status::resource_exhausted("disk full: /data has 10 bytes free")),
            Failure::Retry { transport: false, .. }
        ));
        assert!(matches!(
            classify("a:1", &Status::resource_exhausted("too many requests")),
            Failure::Fatal(ClientError::Server(_))
        ));
        // A failure on this side of the connection carries its cause as the source.
        let refused =
            Status::from_error(Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)));
        assert!(matches!(
            classify("a:1", &refused),
            Failure::Retry { transport: true, unreachable: true, .. }
        ));
        assert!(matches!(
            classify("a:1", &Status::internal("disk")),
            Failure::Fatal(ClientError::Server(message)) if message == "a:1: Internal: disk"
        ));
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter_in_the_upper_half() {
        let base = Duration::from_millis(50);
        let cap = Duration::from_secs(1);
        for (n, full) in [(0, 50), (1, 100), (2, 200), (4, 800), (5, 1000), (40, 1000)] {
            for _ in 0..20 {
                let delay = backoff_delay(base, cap, n);
                let full = Duration::from_millis(full);
                assert!(
                    delay <= full && delay >= full / 2,
                    "n={n}: {delay:?} not in [{:?}, {full:?}]",
                    full / 2
                );
            }
        }
        assert_eq!(backoff_delay(Duration::ZERO, cap, 3), Duration::ZERO);
    }
}
