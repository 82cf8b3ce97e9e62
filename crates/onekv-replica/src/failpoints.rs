//! Crash points for tests (XLL Table 4): named places where a test can make the process exit at
//! once, as if killed, to check what recovery makes of the disk at that moment.
//!
//! Compiled in only with the `failpoints` feature (the `fail` crate); without it every check is a
//! constant `false`. A test arms points through the environment variable `ONEKV_FAILPOINTS`, e.g.
//! `after-raft-append=20*off->return` (crash at the 21st time the point is reached); the action
//! `return` means "crash here". Points: `before-raft-append`, `during-raft-append` (half of a
//! multi-entry append is made durable, then crash), `after-raft-append`, `before-apply`,
//! `after-apply`, `after-reply`; `after-fast-durable` (a group commit's fast-path DURABILITY
//! records are durable, their writers not answered yet); on a follower installing a streamed snapshot,
//! `during-snapshot-fetch` (after a chunk is stored), `after-snapshot-meta` (its metadata is
//! durable, the index not yet rebuilt) and `during-snapshot-install` (part of the rebuilt index
//! flushed under the old flag). The server's member list: `before-member-list-write` and
//! `after-member-list-write` (a node adopting a new list, around its `MEMBERS` file's replacement),
//! `join-before-map` (a joining node wrote the cluster's member list, not yet its map). The server
//! arms the points before its join and `Node::open` arms them again: a counted action
//! (`20*off->return`) restarts its count there, so count hits of the replica's points from the
//! node's open. One point injects an error instead of a crash: `fail-raft-append` makes the Raft
//! append fail as a failed write or fsync would. Two only delay (action `sleep(ms)`, or a callback):
//! `value-log-sealed` holds a separated-mode apply whose value-log append sealed a segment holding
//! some of its values between that append and its index publish; `snapshot-install-chunk` holds a
//! snapshot's install before each of its chunks (a test's callback watches the node meanwhile);
//! `gc-before-collect` holds the log GC with its fence raised over the segments it is about to
//! read. `gc-census-keeps-few-keys` (action `return(N)`, read when the GC starts) makes its census
//! keep N keys (2^20 otherwise).
//! One moves time: `node-clock-ahead` (action `return(ms)`) puts every node clock in the process
//! that far ahead ([`clock_ahead_ms`]). One stalls: `apply-stalls-node` (action `return(id)`) makes
//! that node's replicas stop applying, as if they could not ([`stalled_node`]). One lowers a bound:
//! `late-references-bound` (action `return(bytes)`, [`late_reference_bound`]).

/// Exit code of a process stopped at a crash point.
pub const CRASH_EXIT_CODE: i32 = 86;

/// Reads `ONEKV_FAILPOINTS` (`name=actions;name=actions`) and arms those points. Returns an error
/// naming a malformed entry.
#[cfg(feature = "failpoints")]
pub fn arm_from_env() -> Result<(), String> {
    let Ok(spec) = std::env::var("ONEKV_FAILPOINTS") else { return Ok(()) };
    for item in spec.split(';').filter(|s| !s.trim().is_empty()) {
        let (name, actions) =
            item.split_once('=').ok_or_else(|| format!("failpoint {item:?}: expected name=actions"))?;
        fail::cfg(name.trim(), actions.trim())?;
    }
    Ok(())
}

/// Without the feature there is nothing to arm.
#[cfg(not(feature = "failpoints"))]
pub fn arm_from_env() -> Result<(), String> {
    Ok(())
}

/// Arms the point `name` with `fail` crate actions (e.g. `return`, `3*off->return`) in this
/// process, for tests that run the replica in-process.
#[cfg(feature = "failpoints")]
pub fn arm(name: &str, actions: &str) -> Result<(), String> {
    fail::cfg(name, actions)
}

/// Runs `callback` each time the point `name` is reached (tests count hits with it).
#[cfg(feature = "failpoints")]
pub fn arm_callback(name: &str, callback: impl Fn() + Send + Sync + 'static) -> Result<(), String> {
    fail::cfg_callback(name, callback)
}

/// Whether the point `name` fires now.
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) -> bool {
    fail::eval(name, |_| ()).is_some()
}

/// Without the feature no point fires.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) -> bool {
    false
}

/// How far ahead the point `node-clock-ahead` (action `return(ms)`) moves every node clock in
/// this process: tests that need the request window to forget ids (two minutes of leader time)
/// move time on instead of waiting.
#[cfg(feature = "failpoints")]
pub fn clock_ahead_ms() -> u64 {
    fail::eval("node-clock-ahead", |arg| arg.and_then(|ms| ms.parse().ok()).unwrap_or(0)).unwrap_or(0)
}

/// Without the feature clocks keep time.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn clock_ahead_ms() -> u64 {
    0
}

/// The node the point `apply-stalls-node` (action `return(id)`) stalls: its replicas in this
/// process stop applying at their next committed entries and wait for a snapshot past them, as a
/// replica that cannot apply an entry does (`Group::stall`).
#[cfg(feature = "failpoints")]
pub fn stalled_node() -> Option<u64> {
    fail::eval("apply-stalls-node", |arg| arg.and_then(|id| id.parse().ok())).flatten()
}

/// Without the feature no node stalls.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn stalled_node() -> Option<u64> {
    None
}

/// The bound on late references the point `late-references-bound` (action `return(bytes)`) puts
/// in place of [`crate::dedup::MAX_LATE_REFERENCE_BYTES`].
#[cfg(feature = "failpoints")]
pub fn late_reference_bound() -> Option<u64> {
    fail::eval("late-references-bound", |arg| arg.and_then(|bytes| bytes.parse().ok())).flatten()
}

/// Without the feature the bound is the real one.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn late_reference_bound() -> Option<u64> {
    None
}

/// Ends the process at once, as a crash would: no destructors, no flushing of anything.
pub fn crash(name: &str) -> ! {
    eprintln!("onekv: crash point {name} reached, exiting");
    std::process::exit(CRASH_EXIT_CODE)
}

/// Crashes here if the named point is armed.
#[macro_export]
#[doc(hidden)]
macro_rules! failpoint {
    ($name:literal) => {
        if $crate::failpoints::hit($name) {
            $crate::failpoints::crash($name)
        }
    };
}
