//! The client's error type.
//!
//! Owns: how a failed call is reported to the caller. Does not own: deciding which gRPC statuses are
//! retried (that is `retry`).

/// What a client call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server rejected the input (a key, value, batch or scan over its limit; an empty key).
    /// Never retried: the same request would be rejected again.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No node served the request within the retry budget (or the allowed attempts). `last` is the
    /// cause of the last failed attempt. A write that failed this way may still have been applied
    /// (for example after a deadline was exceeded); calling again issues a new request id, so read
    /// first if applying it twice would matter.
    #[error("gave up after {attempts} attempt(s) in {} ms; last error: {last}", elapsed.as_millis())]
    Unavailable {
        /// How many attempts were made.
        attempts: u32,
        /// How long the call took, attempts and backoffs together.
        elapsed: std::time::Duration,
        /// The cause of the last failed attempt.
        last: String,
    },
    /// A call to one named node (`status`, or a stale read at an explicit endpoint) could not reach
    /// it: the connection failed or the node did not answer in time.
    #[error("transport error: {0}")]
    Transport(String),
    /// A compare-and-swap or transaction took no effect, but its answer cannot be given: an
    /// attempt of this call was evaluated and did not swap (its answer was lost), and the values
    /// it compares have matched since. Nothing was written; read again and decide anew.
    #[error("not applied: {0}")]
    NotApplied(String),
    /// The server answered with an error the client does not retry (INTERNAL, UNIMPLEMENTED, ...).
    #[error("server error: {0}")]
    Server(String),
    /// `Client::new` was given no endpoints.
    #[error("no endpoints given")]
    NoEndpoints,
    /// An endpoint is not a usable `host:port` address.
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it cannot be used.
        reason: String,
    },
}

/// The result of a client call.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;
