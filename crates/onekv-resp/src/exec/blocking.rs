//! Blocking pops: BLPOP, BRPOP, BLMOVE, BRPOPLPUSH, BZPOPMIN, BZPOPMAX.
//!
//! One attempt is the command without waiting, run as a transaction of its own (`transaction`:
//! the first non-empty key is popped, atomically; several keys must share a shard). While every
//! key is empty the command waits and tries again: at once when a write goes through this node's
//! front end, else after a pause that doubles from 1 ms to [`MAX_POLL_PAUSE`] (a push through
//! another node is seen within that pause). Inside MULTI the command is its one attempt, never
//! waiting, as in Redis. The connection stays blocked meanwhile, as in Redis; if its client leaves,
//! the server signals the session's `Cancel` (`server`) and the command stops at its next wait,
//! never in the middle of an attempt (a pop half done would lose its element). Differences from Redis: clients blocked on one key are
//! not served in the order they blocked, and each wait costs a poll of the keys per pause.
//!
//! Owns: the timeout, the waiting and the shape of a pop's reply. Does not own the pops themselves
//! (`lists`, `zsets`, through `transaction`).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Outcome, RespContext, Session, databases};
use crate::commands::CommandSpec;
use crate::protocol::Reply;

/// The longest pause between two attempts of a blocked command.
pub(super) const MAX_POLL_PAUSE: Duration = Duration::from_millis(100);

/// The shortest pause between two attempts of a blocked command, even when a write woke it.
const MIN_POLL_PAUSE: Duration = Duration::from_millis(1);

/// One blocked command, counted in `Shared::blocked` while it lives.
struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(blocked: &'a std::sync::atomic::AtomicUsize) -> Waiting<'a> {
        blocked.fetch_add(1, Ordering::Relaxed);
        Waiting(blocked)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether command `name` may put something where a blocked command waits (a list or a sorted
/// set): after it, the node's blocked commands try again at once.
pub(super) fn may_fill(name: &str) -> bool {
    matches!(
        name,
        "lpush"
            | "rpush"
            | "lpushx"
            | "rpushx"
            | "linsert"
            | "lmove"
            | "rpoplpush"
            | "blmove"
            | "brpoplpush"
            | "zadd"
            | "zincrby"
            | "sort"
            | "copy"
            | "rename"
            | "renamenx"
            | "move"
            | "exec"
            | "eval"
            | "evalsha"
    )
}

/// Whether `name` is a blocking command (its table entry has the `blocking` flag).
pub(super) fn is_blocking(spec: &CommandSpec) -> bool {
    spec.flags.contains(&"blocking")
}

/// The command a blocking pop does in one attempt: `lpop`, `rpop`, `zpopmin`, `zpopmax`, or the
/// LMOVE family itself.
pub(super) fn single_pop(name: &str) -> Option<&'static str> {
    match name {
        "blpop" => Some("lpop"),
        "brpop" => Some("rpop"),
        "bzpopmin" => Some("zpopmin"),
        "bzpopmax" => Some("zpopmax"),
        _ => None,
    }
}

/// The reply of a blocking pop that popped `reply` (LPOP's element, ZPOPMIN's member and score)
/// from the stored key `key`: the key as its client names it, then what was popped.
pub(super) fn popped(key: &[u8], reply: Reply) -> Reply {
    let db = databases::database_of(key).unwrap_or(0);
    let key = Reply::Bulk(databases::user_key(db, key.to_vec()));
    match reply {
        Reply::Array(mut items) => {
            items.insert(0, key);
            Reply::Array(items)
        }
        element => Reply::Array(vec![key, element]),
    }
}

/// The reply when nothing came before the timeout: a null array, or for the LMOVE family a null.
pub(super) fn timed_out(name: &str) -> Reply {
    if matches!(name, "blmove" | "brpoplpush") { Reply::Nil } else { Reply::NilArray }
}

/// A blocking command's timeout (its last argument), as Redis reads it: seconds, fractions
/// allowed; `None` for 0, which waits for ever.
pub(super) fn parse_timeout(arg: &[u8]) -> Outcome<Option<Duration>> {
    let seconds: f64 = std::str::from_utf8(arg)
        .ok()
        .and_then(|text| text.parse().ok())
        .filter(|seconds: &f64| seconds.is_finite())
        .ok_or_else(|| Reply::err("timeout is not a float or out of range"))?;
    if seconds < 0.0 {
        return Err(Reply::err("timeout is negative"));
    }
    if seconds == 0.0 {
        return Ok(None);
    }
    Duration::try_from_secs_f64(seconds).map(Some).map_err(|_| Reply::err("timeout is out of range"))
}

impl RespContext {
    /// A blocking command outside MULTI: attempts until one pops or the timeout passes.
    pub(super) async fn block(&self, session: &mut Session, spec: &CommandSpec, args: &[Vec<u8>]) -> Outcome {
        let timeout = parse_timeout(args.last().expect("the arity checked"))?;
        let deadline = timeout.map(|timeout| Instant::now() + timeout);
        let mut pause = Duration::from_millis(1);
        // Counted while this command waits or attempts (a guard: also when the command is dropped),
        // so a write between an attempt and its wait still wakes it.
        let _waiting = Waiting::new(&self.shared.blocked);
        loop {
            if session.cancelled() {
                // Its client left: no attempt after that (one under way finished first).
                return Ok(timed_out(spec.name));
            }
            // Listening before the attempt, so a write between the attempt and the wait is not missed.
            let written = self.shared.written.notified();
            tokio::pin!(written);
            written.as_mut().enable();
            let reply = self.atomically(session, args).await?;
            if reply != timed_out(spec.name) {
                return Ok(reply);
            }
            let now = Instant::now();
            let wait = match deadline {
                Some(deadline) if deadline <= now => return Ok(reply),
                Some(deadline) => pause.min(deadline - now),
                None => pause,
            };
            let cancel = session.cancel.clone();
            tokio::select! {
                _ = written => {
                    // Woken by some write through this node (not necessarily to these keys): at
                    // least a short pause before the next attempt, so a busy node does not make
                    // its blocked clients poll back to back.
                    tokio::time::sleep(MIN_POLL_PAUSE.min(wait)).await;
                }
                _ = tokio::time::sleep(wait) => {}
                _ = cancel.wait() => {}
            }
            pause = (pause * 2).min(MAX_POLL_PAUSE);
        }
    }

    /// After a command that may have written (through this node): wakes the blocked commands, so
    /// a push through this node reaches them without waiting for their pause.
    pub(super) fn wake_blocked(&self) {
        if self.shared.blocked.load(Ordering::Relaxed) > 0 {
            self.shared.written.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_seconds_as_redis_reads_them() {
        assert_eq!(parse_timeout(b"0"), Ok(None));
        assert_eq!(parse_timeout(b"0.5"), Ok(Some(Duration::from_millis(500))));
        assert_eq!(parse_timeout(b"2"), Ok(Some(Duration::from_secs(2))));
        assert_eq!(parse_timeout(b"-1"), Err(Reply::err("timeout is negative")));
        for bad in [&b"x"[..], b"", b"inf", b"nan"] {
            assert_eq!(parse_timeout(bad), Err(Reply::err("timeout is not a float or out of range")));
        }
        assert!(parse_timeout(b"1e300").is_err());
    }

    #[test]
    fn a_pop_answers_the_key_as_its_client_names_it() {
        let stored = databases::stored_key(3, b"queue");
        assert_eq!(
            popped(&stored, Reply::text("job")),
            Reply::Array(vec![Reply::text("queue"), Reply::text("job")])
        );
        let member_and_score = Reply::Array(vec![Reply::text("m"), Reply::text("1")]);
        assert_eq!(
            popped(b"z", member_and_score),
            Reply::Array(vec![Reply::text("z"), Reply::text("m"), Reply::text("1")])
        );
        assert_eq!(timed_out("blpop"), Reply::NilArray);
        assert_eq!(timed_out("brpoplpush"), Reply::Nil);
    }
}
