//! The part of a replica the gRPC services use, as a trait.
//!
//! The services are written against [`Backend`] rather than [`Replica`] so their request checking,
//! error mapping and timeouts can be tested with a scripted fake. [`Replica`] is the only production
//! implementation; this module owns nothing but the delegation.

use onekv_replica::{Command, Done, Message, Outcome, Replica, ReplicaError, ReplicaStatus, RequestId};

/// Pairs a scan returns, and whether more remain in the range.
pub type ScanResult = (Vec<(Vec<u8>, Vec<u8>)>, bool);

/// What the `Kv` and `Peer` services need from a replica. See [`Replica`] for each method's
/// contract; in particular `Done` callbacks run on the replica's loop thread and must not block.
pub trait Backend: Send + Sync + 'static {
    /// [`Replica::step`].
    fn step(&self, message: Message);
    /// [`Replica::propose`].
    fn propose(&self, request_id: RequestId, command: Command, done: Done<Outcome>);
    /// [`Replica::read_barrier`].
    fn read_barrier(&self, done: Done<()>);
    /// [`Replica::get`].
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ReplicaError>;
    /// [`Replica::scan`].
    fn scan(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        reverse: bool,
    ) -> Result<ScanResult, ReplicaError>;
    /// [`Replica::scan_keys`]: the same pairs with empty values. The default scans and drops the
    /// values, which is correct but reads them; [`Replica`] overrides it to read none.
    fn scan_keys(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        reverse: bool,
    ) -> Result<ScanResult, ReplicaError> {
        let (pairs, more) = self.scan(start, end, limit, reverse)?;
        Ok((pairs.into_iter().map(|(key, _)| (key, Vec::new())).collect(), more))
    }
    /// [`Replica::status`].
    fn status(&self) -> ReplicaStatus;
}

impl Backend for Replica {
    fn step(&self, message: Message) {
        Replica::step(self, message)
    }

    fn propose(&self, request_id: RequestId, command: Command, done: Done<Outcome>) {
        Replica::propose(self, request_id, command, done)
    }

    fn read_barrier(&self, done: Done<()>) {
        Replica::read_barrier(self, done)
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, ReplicaError> {
        Replica::get(self, key)
    }

    fn scan(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        reverse: bool,
    ) -> Result<ScanResult, ReplicaError> {
        Replica::scan(self, start, end, limit, reverse)
    }

    fn scan_keys(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        reverse: bool,
    ) -> Result<ScanResult, ReplicaError> {
        Replica::scan_keys(self, start, end, limit, reverse)
    }

    fn status(&self) -> ReplicaStatus {
        Replica::status(self)
    }
}
