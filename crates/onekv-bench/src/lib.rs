//! onekv's benchmark harness: the YCSB core workloads (Load, A–F) with YCSB's request
//! distributions, a closed-loop runner with HDR latency histograms per operation type, and write
//! and space amplification per node.
//!
//! Owns: workload definitions (`generator`, `workload`), the system-under-test abstraction
//! (`target`, with a onekv implementation), running and reporting (`runner`), and amplification
//! figures (`amplification`), fresh local clusters of `onekv server` processes (`local_cluster`) and
//! side-by-side comparisons of storage modes on them (`compare`). Does not own the command line (the `onekv bench` subcommand in the
//! `onekv` binary) nor any store's internals: it talks to onekv only through `onekv-client`.

pub mod amplification;
pub mod compare;
pub mod generator;
pub mod local_cluster;
pub mod runner;
pub mod target;
pub mod workload;

pub use runner::{BenchReport, OpReport, RunConfig, RunError, RunReport, live_bytes, run, run_phases};
pub use target::{OnekvTarget, Target, TargetError, TargetResult};
pub use workload::{Distribution, OpType, WorkloadKind, WorkloadSpec};
