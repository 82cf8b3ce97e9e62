//! onekv's benchmark harness: the YCSB core workloads (Load, A–F) with YCSB's request
//! distributions, a closed-loop runner with HDR latency histograms per operation type, and write
//! and space amplification per node.
//!
//! Owns: workload definitions (`generator`, `workload`), the system-under-test abstraction
//! (`target`, with a onekv implementation, and `etcd`), running and reporting (`runner`),
//! amplification figures (`amplification`), CPU time per operation (`cpu`), fresh local clusters of `onekv server` processes
//! (`local_cluster`), optionally with every link delayed by a proxy (`delay`), and of `etcd` processes (`local_etcd`), and side-by-side comparisons of storage
//! modes and etcd on them (`compare`). Does not own the command line (the `onekv bench` subcommand
//! in the `onekv` binary) nor any store's internals: it talks to onekv only through `onekv-client`
//! and to etcd only through its public gRPC API.

pub mod amplification;
pub mod compare;
pub mod cpu;
pub mod delay;
pub mod etcd;
pub mod generator;
pub mod local_cluster;
pub mod local_etcd;
pub mod runner;
pub mod target;
pub mod values;
pub mod workload;

pub use cpu::CpuProbe;
pub use etcd::EtcdTarget;
pub use runner::{BenchReport, OpReport, RunConfig, RunError, RunReport, live_bytes, run, run_phases};
pub use target::{OnekvTarget, Target, TargetError, TargetResult};
pub use values::ValueKind;
pub use workload::{Distribution, OpType, WorkloadKind, WorkloadSpec};
