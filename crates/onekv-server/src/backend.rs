//! The part of a node the gRPC services use, as a trait.
//!
//! The services are written against [`Backend`] rather than [`Node`] so their request checking,
//! error mapping and timeouts can be tested with a scripted fake. [`Node`] is the only production
//! implementation; this module owns nothing but the delegation. Every call names the shard it is
//! for; the services choose it from the key (placement), never the backend.

use onekv_replica::{
    ChunkRequest, Command, Done, FastAck, Members, MembershipChange, Message, Node, Outcome, ReplicaError,
    ReplicaStatus, RequestId, SnapshotChunk, WriteOp,
};

/// Pairs a scan returns, and whether more remain in the range.
pub type ScanResult = (Vec<(Vec<u8>, Vec<u8>)>, bool);

/// What the `Kv` and `Peer` services need from a node. See [`onekv_replica::Replica`] for each
/// method's contract; in particular `Done` callbacks run on the node's loop thread and must not
/// block. A call for a shard the node holds no replica of fails with
/// [`ReplicaError::NotLeader`] without a leader (a message is dropped).
pub trait Backend: Send + Sync + 'static {
    /// The shards this node holds a replica of, in order.
    fn shards(&self) -> Vec<u64>;
    /// Whether this node holds a replica of `shard` (on every request: no list is built).
    fn hosts(&self, shard: u64) -> bool {
        self.shards().contains(&shard)
    }
    /// [`onekv_replica::Node::step`].
    fn step(&self, shard: u64, message: Message);
    /// [`onekv_replica::Replica::propose`].
    fn propose(&self, shard: u64, request_id: RequestId, command: Command, done: Done<Outcome>);
    /// [`onekv_replica::Replica::read_barrier`].
    fn read_barrier(&self, shard: u64, done: Done<()>);
    /// [`onekv_replica::Replica::fast_write`]. The default refuses it (no fast path here).
    fn fast_write(&self, shard: u64, request_id: RequestId, ops: Vec<WriteOp>, done: Done<FastAck>) {
        let _ = (request_id, ops);
        done(Err(ReplicaError::InvalidArgument(format!("shard {shard}: the fast path is off on this node"))))
    }
    /// [`onekv_replica::Replica::get_with_expiry`]: the value and when it expires.
    fn get(&self, shard: u64, key: &[u8]) -> Result<Option<onekv_replica::ValueWithExpiry>, ReplicaError>;
    /// [`onekv_replica::Replica::scan`].
    fn scan(
        &self,
        shard: u64,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        reverse: bool,
    ) -> Result<ScanResult, ReplicaError>;
    /// [`onekv_replica::Replica::scan_keys`]: the same pairs with empty values. The default scans
    /// and drops the values, which is correct but reads them; [`Node`] overrides it to read none.
    fn scan_keys(
        &self,
        shard: u64,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        reverse: bool,
    ) -> Result<ScanResult, ReplicaError> {
        let (pairs, more) = self.scan(shard, start, end, limit, reverse)?;
        Ok((pairs.into_iter().map(|(key, _)| (key, Vec::new())).collect(), more))
    }
    /// [`onekv_replica::Replica::transfer_leadership`].
    fn transfer_leadership(&self, shard: u64, to: u64, done: Done<()>);
    /// [`onekv_replica::Replica::change_members`].
    fn change_members(&self, shard: u64, change: MembershipChange, done: Done<Members>) {
        let _ = change;
        done(Err(ReplicaError::InvalidArgument(format!(
            "shard {shard}: membership changes are not served here"
        ))))
    }
    /// [`onekv_replica::Node::add_replica`]. Blocking (it writes and fsyncs).
    fn add_replica(&self, shard: u64) -> Result<(), ReplicaError> {
        Err(ReplicaError::InvalidArgument(format!("shard {shard}: replicas cannot be added here")))
    }
    /// [`onekv_replica::Node::remove_replica`]. Blocking (it waits for the loop and fsyncs).
    fn remove_replica(&self, shard: u64) -> Result<(), ReplicaError> {
        Err(ReplicaError::InvalidArgument(format!("shard {shard}: replicas cannot be removed here")))
    }
    /// [`onekv_replica::Node::last_voters_of_removed`]: where a shard this node no longer hosts
    /// went.
    fn last_voters_of_removed(&self, _shard: u64) -> Option<Vec<u64>> {
        None
    }
    /// The status of each replica of the node, by shard ([`onekv_replica::Node::statuses`]).
    fn statuses(&self) -> Vec<ReplicaStatus>;
    /// The status of the node's replica of `shard`, if it holds one.
    fn status(&self, shard: u64) -> Option<ReplicaStatus> {
        self.statuses().into_iter().find(|status| status.shard == shard)
    }
    /// The node as a whole ([`ReplicaStatus::summarize`] of [`Backend::statuses`]).
    fn summary(&self) -> ReplicaStatus {
        ReplicaStatus::summarize(&self.statuses())
    }
    /// [`onekv_replica::Node::snapshot_chunk`]. The default serves none.
    fn snapshot_chunk(&self, request: &ChunkRequest) -> Result<SnapshotChunk, ReplicaError> {
        Err(ReplicaError::Dropped(format!("no snapshot of shard {} is served here", request.shard)))
    }
    /// The storage failure that stopped the node, if one did (every replica shares it: one disk).
    fn failure(&self) -> Option<String> {
        self.statuses().into_iter().find_map(|status| status.failure)
    }
}

/// A call for a shard this node does not host (any more, or yet): the services check first, so
/// only a replica added or removed in between gets here; another node may serve it.
fn no_replica() -> ReplicaError {
    ReplicaError::NotLeader { leader: None }
}

impl Backend for Node {
    fn shards(&self) -> Vec<u64> {
        Node::shards(self)
    }

    fn hosts(&self, shard: u64) -> bool {
        self.replica(shard).is_some()
    }

    fn step(&self, shard: u64, message: Message) {
        Node::step(self, shard, message)
    }

    fn propose(&self, shard: u64, request_id: RequestId, command: Command, done: Done<Outcome>) {
        match self.replica(shard) {
            Some(replica) => replica.propose(request_id, command, done),
            None => done(Err(no_replica())),
        }
    }

    fn read_barrier(&self, shard: u64, done: Done<()>) {
        match self.replica(shard) {
            Some(replica) => replica.read_barrier(done),
            None => done(Err(no_replica())),
        }
    }

    fn fast_write(&self, shard: u64, request_id: RequestId, ops: Vec<WriteOp>, done: Done<FastAck>) {
        match self.replica(shard) {
            Some(replica) => replica.fast_write(request_id, ops, done),
            None => done(Err(no_replica())),
        }
    }

    fn transfer_leadership(&self, shard: u64, to: u64, done: Done<()>) {
        match self.replica(shard) {
            Some(replica) => replica.transfer_leadership(to, done),
            None => done(Err(no_replica())),
        }
    }

    fn change_members(&self, shard: u64, change: MembershipChange, done: Done<Members>) {
        match self.replica(shard) {
            Some(replica) => replica.change_members(change, done),
            None => done(Err(no_replica())),
        }
    }

    fn add_replica(&self, shard: u64) -> Result<(), ReplicaError> {
        Node::add_replica(self, shard).map(drop)
    }

    fn remove_replica(&self, shard: u64) -> Result<(), ReplicaError> {
        Node::remove_replica(self, shard)
    }

    fn last_voters_of_removed(&self, shard: u64) -> Option<Vec<u64>> {
        Node::last_voters_of_removed(self, shard)
    }

    fn get(&self, shard: u64, key: &[u8]) -> Result<Option<onekv_replica::ValueWithExpiry>, ReplicaError> {
        self.replica(shard).ok_or_else(no_replica)?.get_with_expiry(key)
    }

    fn scan(
        &self,
        shard: u64,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        reverse: bool,
    ) -> Result<ScanResult, ReplicaError> {
        self.replica(shard).ok_or_else(no_replica)?.scan(start, end, limit, reverse)
    }

    fn scan_keys(
        &self,
        shard: u64,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
        reverse: bool,
    ) -> Result<ScanResult, ReplicaError> {
        self.replica(shard).ok_or_else(no_replica)?.scan_keys(start, end, limit, reverse)
    }

    fn statuses(&self) -> Vec<ReplicaStatus> {
        Node::statuses(self)
    }

    fn status(&self, shard: u64) -> Option<ReplicaStatus> {
        self.replica(shard).map(|replica| replica.status())
    }

    fn snapshot_chunk(&self, request: &ChunkRequest) -> Result<SnapshotChunk, ReplicaError> {
        Node::snapshot_chunk(self, request)
    }
}
