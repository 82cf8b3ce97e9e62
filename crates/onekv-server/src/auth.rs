//! Peer authentication: the cluster secret that proves a `Peer` call comes from a member.
//!
//! Owns the secret ([`PeerSecret`]: generating it, the file that holds it, its wire form), the
//! metadata key the transport sends it under ([`PEER_SECRET_METADATA`]), and [`PeerAuth`], the
//! interceptor that refuses a `Peer` call without the right secret (UNAUTHENTICATED) before its
//! body is read, comparing in constant time.
//!
//! The secret travels as is in gRPC metadata over plaintext HTTP/2: enough on a loopback or
//! private cluster network, where it keeps out anything that can reach the port but not read the
//! traffic (a client, a scanner, a misdirected node of another cluster). Anyone who can sniff the
//! network can replay it; across untrusted networks the answer is mutual TLS, which onekv does not
//! offer yet. Does not own which members exist (the `Peer` service checks that after decoding).

use std::fmt;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use rand::TryRngCore as _;
use subtle::ConstantTimeEq as _;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::{Request, Status};

/// The gRPC metadata key a `Peer` call (and an administrative `Kv` call) carries the cluster secret under.
pub use onekv_proto::PEER_SECRET_METADATA;

/// Random bytes in a secret that `onekv cluster start` (or [`PeerSecret::generate`]) makes.
pub const SECRET_BYTES: usize = 32;

/// Fewest bytes a secret written by hand may have: shorter ones are guessable.
const MIN_SECRET_BYTES: usize = 16;
/// Most hex digits a secret file may hold; anything longer is not a secret file.
const MAX_SECRET_HEX: usize = 1024;

/// The cluster secret, as the lowercase hex text that travels in [`PEER_SECRET_METADATA`]. Every
/// member has the same one. `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct PeerSecret {
    hex: Arc<str>,
}

impl fmt::Debug for PeerSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PeerSecret(..)")
    }
}

impl PeerSecret {
    /// A new secret of [`SECRET_BYTES`] random bytes from the operating system's generator.
    pub fn generate() -> PeerSecret {
        let mut bytes = [0u8; SECRET_BYTES];
        rand::rngs::OsRng.try_fill_bytes(&mut bytes).expect("the operating system's random generator works");
        let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
        PeerSecret { hex: hex.into() }
    }

    /// Parses a secret file's text: hex digits (at least 16 bytes' worth, an even number), with
    /// surrounding whitespace ignored. The error says what is wrong, never the secret.
    pub fn parse(text: &str) -> Result<PeerSecret, String> {
        let hex = text.trim();
        if hex.len() > MAX_SECRET_HEX {
            return Err(format!("is longer than {MAX_SECRET_HEX} characters; expected hex digits"));
        }
        if !hex.bytes().all(|byte| byte.is_ascii_hexdigit()) {
            return Err("holds something other than hex digits (and surrounding whitespace)".into());
        }
        if !hex.len().is_multiple_of(2) || hex.len() < 2 * MIN_SECRET_BYTES {
            return Err(format!(
                "holds {} hex digits; expected an even number, at least {} (e.g. `openssl rand -hex {SECRET_BYTES}`)",
                hex.len(),
                2 * MIN_SECRET_BYTES
            ));
        }
        Ok(PeerSecret { hex: hex.to_ascii_lowercase().into() })
    }

    /// Reads the secret file at `path`. Warns (it does not refuse) when the file can be read by
    /// others than its owner.
    pub fn load(path: &Path) -> anyhow::Result<PeerSecret> {
        let text = std::fs::read_to_string(path).with_context(|| {
            format!("cannot read the peer secret file {} (peer_secret_file)", path.display())
        })?;
        let secret = PeerSecret::parse(&text).map_err(|reason| {
            anyhow::anyhow!("the peer secret file {} (peer_secret_file) {reason}", path.display())
        })?;
        if let Ok(metadata) = std::fs::metadata(path)
            && metadata.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(
                path = %path.display(),
                mode = format!("{:o}", metadata.permissions().mode() & 0o777),
                "the peer secret file can be read by others than its owner; chmod 600 it"
            );
        }
        Ok(secret)
    }

    /// Writes this secret to a new file at `path`, readable and writable by its owner only (mode
    /// 0600 from the start, so it is never readable by others), and fsyncs it. Fails if the file
    /// exists.
    pub fn write_new(&self, path: &Path) -> anyhow::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("cannot create the peer secret file {}", path.display()))?;
        file.write_all(format!("{}\n", self.hex).as_bytes())
            .and_then(|()| file.sync_all())
            .with_context(|| format!("cannot write the peer secret file {}", path.display()))?;
        Ok(())
    }

    /// The value to send in [`PEER_SECRET_METADATA`], marked sensitive: HTTP/2 header compression
    /// never puts it in its tables.
    pub fn metadata_value(&self) -> AsciiMetadataValue {
        let mut value: AsciiMetadataValue =
            MetadataValue::try_from(&*self.hex).expect("hex digits are a valid header value");
        value.set_sensitive(true);
        value
    }

    /// Whether `presented` is this secret, compared in constant time (for equal lengths; the length
    /// of a secret is no secret).
    pub fn matches(&self, presented: &[u8]) -> bool {
        self.hex.as_bytes().ct_eq(presented).into()
    }
}

/// Whether `request` carries `secret` (`None`: this node has none, so nothing passes); `what`
/// names the call in the refusal.
pub fn check_secret<T>(secret: Option<&PeerSecret>, request: &Request<T>, what: &str) -> Result<(), Status> {
    let Some(secret) = secret else {
        return Err(Status::unauthenticated(
            "this node has no peer secret (peer_secret_file): it accepts no Raft messages and no \
             administrative call (leadership, shard members, replicas, member list)",
        ));
    };
    match request.metadata().get(PEER_SECRET_METADATA) {
        None => Err(Status::unauthenticated(format!(
            "{what} must carry the cluster secret ({PEER_SECRET_METADATA}); is the sender a member of this \
             cluster, with its peer_secret_file?"
        ))),
        Some(value) if secret.matches(value.as_bytes()) => Ok(()),
        Some(_) => Err(Status::unauthenticated(
            "wrong cluster secret: the sender's peer_secret_file differs from this node's",
        )),
    }
}

/// The interceptor in front of the `Peer` service: a call passes only with the right secret in
/// [`PEER_SECRET_METADATA`]. It runs on the call's headers, before the body is read or decoded.
/// Without a secret (a node configured without `peer_secret_file`, which validation allows only
/// for a single member, who has no peers) every call is refused.
#[derive(Clone, Debug)]
pub struct PeerAuth {
    secret: Option<PeerSecret>,
    /// Unix seconds of the last refusal logged at WARN, so a flood of forged calls logs once per
    /// [`REFUSAL_LOG_INTERVAL_S`], not per call.
    last_logged: Arc<AtomicU64>,
}

/// Seconds between two WARN lines about refused peer calls.
const REFUSAL_LOG_INTERVAL_S: u64 = 10;

impl PeerAuth {
    /// Admits calls carrying `secret`; `None` admits none.
    pub fn new(secret: Option<PeerSecret>) -> PeerAuth {
        PeerAuth { secret, last_logged: Arc::new(AtomicU64::new(0)) }
    }

    fn check<T>(&self, request: &Request<T>) -> Result<(), Status> {
        check_secret(self.secret.as_ref(), request, "a Peer call")
    }

    fn log_refusal<T>(&self, request: &Request<T>, status: &Status) {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs());
        let last = self.last_logged.load(Ordering::Relaxed);
        let remote =
            request.remote_addr().map_or_else(|| "unknown".to_string(), |address| address.to_string());
        if now >= last + REFUSAL_LOG_INTERVAL_S
            && self.last_logged.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            tracing::warn!(%remote, reason = status.message(), "refused a Peer call (further refusals for a while at DEBUG)");
        } else {
            tracing::debug!(%remote, reason = status.message(), "refused a Peer call");
        }
    }
}

impl tonic::service::Interceptor for PeerAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        match self.check(&request) {
            Ok(()) => Ok(request),
            Err(status) => {
                self.log_refusal(&request, &status);
                Err(status)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_secrets_parse_back_and_differ() {
        let one = PeerSecret::generate();
        let two = PeerSecret::generate();
        assert_ne!(one, two);
        assert_eq!(one.hex.len(), 2 * SECRET_BYTES);
        assert_eq!(PeerSecret::parse(&format!("  {}\n", one.hex.to_uppercase())).unwrap(), one);
        assert_eq!(format!("{one:?}"), "PeerSecret(..)");
    }

    #[test]
    fn short_odd_or_non_hex_secrets_are_refused() {
        for bad in ["", "abcd", &"a".repeat(33), &"g".repeat(64), &"ab ".repeat(20), &"a".repeat(2000)] {
            assert!(PeerSecret::parse(bad).is_err(), "{bad:?}");
        }
        assert!(PeerSecret::parse(&"0f".repeat(16)).is_ok());
    }

    #[test]
    fn the_file_is_created_owner_only_and_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        let secret = PeerSecret::generate();
        secret.write_new(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(PeerSecret::load(&path).unwrap(), secret);
        assert!(PeerSecret::generate().write_new(&path).is_err());
        assert_eq!(PeerSecret::load(&path).unwrap(), secret);
    }

    #[test]
    fn only_the_right_secret_passes() {
        let secret = PeerSecret::generate();
        let mut auth = PeerAuth::new(Some(secret.clone()));
        let with = |value: Option<&str>| {
            let mut request = Request::new(());
            if let Some(value) = value {
                request.metadata_mut().insert(PEER_SECRET_METADATA, value.parse().unwrap());
            }
            request
        };
        use tonic::service::Interceptor as _;
        assert!(auth.call(with(Some(&secret.hex))).is_ok());
        for refused in [None, Some("00"), Some(&*PeerSecret::generate().hex), Some(&secret.hex[1..])] {
            let status = auth.call(with(refused)).unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{refused:?}");
        }
        let mut none = PeerAuth::new(None);
        let status = none.call(with(Some(&secret.hex))).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(status.message().contains("no peer secret"), "{}", status.message());
    }
}
