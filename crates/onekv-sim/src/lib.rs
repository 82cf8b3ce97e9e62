//! Deterministic simulation of a onekv cluster.
//!
//! Several real replicas (the same `onekv-replica` code the server runs, opened with
//! [`onekv_replica::Replica::open_driven`]) take turns on one thread in simulated time. A seeded
//! random source drives everything else: a network that loses, delays, reorders and duplicates
//! messages and is partitioned and healed; disks that lose unsynced bytes, tear the last write or
//! scramble sectors on power loss and fail fsyncs and writes on command; crashes, restarts and
//! pauses of nodes; and clients issuing gets, puts, deletes and compare-and-swaps on a few keys.
//! Independent checkers then judge the clients' history and the replicas' final state.
//!
//! A failing run prints its seed; [`run`] with that seed replays it exactly (the report's digest
//! shows it). `cargo run --release -p onekv-sim -- --help` runs many seeds (docs/TESTING.md).
//!
//! Owns: the driver ([`sim`]), the simulated network ([`network`]), the history format
//! ([`history`]) and the checkers ([`checker`]). Does not own the replica, the log or the index:
//! it uses their public APIs and the log's fault-injecting I/O (`onekv_log::io`).

pub mod checker;
pub mod history;
pub mod network;
pub mod sim;

pub use sim::{Bug, Report, SimConfig, run};
