//! Wire types of onekv: the client API (`Kv` service) and the peer transport (`Peer` service),
//! generated from `proto/onekv.proto` by tonic and prost.
//!
//! This crate owns the schema and nothing else: no limits, no behaviour. Raft's own messages are
//! carried as opaque bytes so rust-protobuf types (which raft-rs uses) stay out of this format.

#![allow(missing_docs)]

/// Version 1 of the protocol.
pub mod v1 {
    tonic::include_proto!("onekv.v1");
}

pub use v1::*;

/// gRPC metadata key naming the leader's node id on a not-leader error.
pub const LEADER_ID_METADATA: &str = "onekv-leader-id";
/// gRPC metadata key naming the leader's client address (`host:port`) on a not-leader error.
pub const LEADER_ADDR_METADATA: &str = "onekv-leader-addr";
/// gRPC metadata key carrying the cluster secret: on every `Peer` call, and on the administrative
/// `Kv` calls (`TransferLeader`, `ChangeMembers`, `AddReplica`, `RemoveReplica`, `SetMembers`).
pub const PEER_SECRET_METADATA: &str = "onekv-peer-secret";
