//! Keys that expire: SET's and GETEX's expiry options, SETEX/PSETEX, EXPIRE/PEXPIRE/EXPIREAT/
//! PEXPIREAT (NX, XX, GT, LT), PERSIST, and the TTL family (TTL, PTTL, EXPIRETIME, PEXPIRETIME).
//!
//! Owns: turning Redis's expiry arguments into the [`Expiry`] a write carries, the decisions of
//! the commands that change only a key's expiry, and the TTL family's answers. The node does the
//! rest (see `docs/redis.md`): a relative time becomes an absolute one on the shard's leader, an
//! expired key reads as absent everywhere at once, and the leader deletes it through Raft later.
//!
//! A change of expiry alone (EXPIRE, PERSIST, GETEX with an option) is a compare-and-swap of the
//! key's value for itself with the new expiry, through the combiner (`combine`): it writes the
//! value again. Its conditions (NX, XX, GT, LT) are decided on the expiry read just before the
//! swap; the swap checks the value, not the expiry, so an expiry changed meanwhile through
//! another node (its value unchanged) is not noticed.

use onekv_client::Expiry;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::combine::{Change, Decide};
use super::{Outcome, not_an_integer, parse_integer};
use crate::commands::{ExpiryOption, parse_getex_options};
use crate::protocol::Reply;

/// Whether `name` is a command of this module that decides from the key's expiry (run through
/// the combiner with `needs_expiry`).
pub(super) fn needs_expiry(name: &str) -> bool {
    matches!(name, "expire" | "pexpire" | "expireat" | "pexpireat" | "persist" | "getex")
}

/// Whether `name` is one of the TTL family (answered from the key's expiry).
pub(super) fn is_expiry_read(name: &str) -> bool {
    matches!(name, "ttl" | "pttl" | "expiretime" | "pexpiretime")
}

/// This node's wall clock, in ms since the Unix epoch.
pub(super) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// When a key written with `expiry` at `now_ms` expires, as far as this node can tell (a relative
/// time is fixed by the leader a moment later): for the later commands of one combined batch or
/// one transaction.
pub(super) fn expires_at(expiry: Expiry, now_ms: u64) -> Option<u64> {
    match expiry {
        Expiry::Never | Expiry::Keep => None,
        Expiry::After(ttl) => Some(now_ms.saturating_add(ttl.as_millis() as u64)),
        Expiry::AtUnixMs(at) => Some(at),
    }
}

/// The expiry a write carries for `option` of `command`, with Redis's check that the time fits
/// (in ms, and added to now for a relative one): else `invalid expire time in '<command>' command`.
pub(super) fn expiry_of(option: ExpiryOption, command: &str) -> Outcome<Expiry> {
    let invalid = || Reply::err(format!("invalid expire time in '{command}' command"));
    let ms =
        |n: i64, scale: i64| n.checked_mul(scale).and_then(|ms| u64::try_from(ms).ok()).ok_or_else(invalid);
    Ok(match option {
        ExpiryOption::Seconds(n) | ExpiryOption::Milliseconds(n) => {
            let ms = ms(n, if matches!(option, ExpiryOption::Seconds(_)) { 1000 } else { 1 })?;
            now_ms().checked_add(ms).filter(|&at| at <= i64::MAX as u64).ok_or_else(invalid)?;
            Expiry::After(Duration::from_millis(ms))
        }
        ExpiryOption::AtSeconds(n) => Expiry::AtUnixMs(ms(n, 1000)?),
        ExpiryOption::AtMilliseconds(n) => Expiry::AtUnixMs(ms(n, 1)?),
        ExpiryOption::KeepTtl => Expiry::Keep,
        ExpiryOption::Persist => Expiry::Never,
    })
}

/// SETEX's and PSETEX's expiry (`args`: name, key, time, value).
pub(super) fn setex_expiry(command: &str, args: &[Vec<u8>]) -> Outcome<Expiry> {
    let ttl = parse_integer(&args[2]).ok_or_else(not_an_integer)?;
    if ttl <= 0 {
        return Err(Reply::err(format!("invalid expire time in '{command}' command")));
    }
    let option =
        if command == "setex" { ExpiryOption::Seconds(ttl) } else { ExpiryOption::Milliseconds(ttl) };
    expiry_of(option, command)
}

/// EXPIRE's conditions on the key's current expiry (any that are given must all hold).
#[derive(Clone, Copy, Default)]
struct Conditions {
    /// Only if it has none.
    nx: bool,
    /// Only if it has one.
    xx: bool,
    /// Only if the new time is later (a key without one never expires: never later).
    gt: bool,
    /// Only if the new time is earlier (a key without one never expires: always earlier).
    lt: bool,
}

impl Conditions {
    fn hold(&self, when: i64, expires_at: Option<u64>) -> bool {
        let current = expires_at.map(|at| at as i64);
        !(self.nx && current.is_some()
            || self.xx && current.is_none()
            || self.gt && current.is_none_or(|at| when <= at)
            || self.lt && current.is_some_and(|at| when >= at))
    }
}

/// The decision of EXPIRE, PEXPIRE, EXPIREAT or PEXPIREAT (`name`; `args`: name, key, time,
/// options), with Redis's checks and replies: 1 if the expiry was set (or the key deleted, for a
/// time already past), 0 if the key is absent or a condition failed.
pub(super) fn expire_decision(name: &str, args: &[Vec<u8>]) -> Outcome<Decide> {
    let time = parse_integer(&args[2]).ok_or_else(not_an_integer)?;
    let mut conditions = Conditions::default();
    for option in &args[3..] {
        match option.to_ascii_uppercase().as_slice() {
            b"NX" => conditions.nx = true,
            b"XX" => conditions.xx = true,
            b"GT" => conditions.gt = true,
            b"LT" => conditions.lt = true,
            _ => {
                return Err(Reply::err(format!("Unsupported option {}", String::from_utf8_lossy(option))));
            }
        }
    }
    if conditions.nx && (conditions.xx || conditions.gt || conditions.lt) {
        return Err(Reply::err("NX and XX, GT or LT options at the same time are not compatible"));
    }
    if conditions.gt && conditions.lt {
        return Err(Reply::err("GT and LT options at the same time are not compatible"));
    }
    let invalid = || Reply::err(format!("invalid expire time in '{name}' command"));
    let (scale, relative) = match name {
        "expire" => (1000, true),
        "pexpire" => (1, true),
        "expireat" => (1000, false),
        _ => (1, false),
    };
    let ms = time.checked_mul(scale).ok_or_else(invalid)?;
    let when = if relative { ms.checked_add(now_ms() as i64).ok_or_else(invalid)? } else { ms };
    // A relative time is fixed by the shard's leader when it receives the write; an absolute one
    // is written as given.
    let expiry = if relative && ms > 0 {
        Expiry::After(Duration::from_millis(ms as u64))
    } else {
        Expiry::AtUnixMs(when.max(1) as u64)
    };
    Ok(Box::new(move |current, expires_at| {
        let Some(value) = current else { return Ok(Change::Keep(Reply::Integer(0))) };
        if !conditions.hold(when, expires_at) {
            return Ok(Change::Keep(Reply::Integer(0)));
        }
        if when <= now_ms() as i64 {
            // A time already past deletes the key, as in Redis.
            return Ok(Change::Write(None, Expiry::Never, Reply::Integer(1)));
        }
        Ok(Change::Write(Some(value.to_vec()), expiry, Reply::Integer(1)))
    }))
}

/// PERSIST's decision: 1 if the key had an expiry (now removed), else 0.
pub(super) fn persist_decision() -> Decide {
    Box::new(|current, expires_at| {
        Ok(match (current, expires_at) {
            (Some(value), Some(_)) => Change::Write(Some(value.to_vec()), Expiry::Never, Reply::Integer(1)),
            _ => Change::Keep(Reply::Integer(0)),
        })
    })
}

/// GETEX's decision (`args`: name, key, options): the value, and its expiry set or removed as the
/// option says (a time already past deletes the key, as in Redis).
pub(super) fn getex_decision(args: &[Vec<u8>]) -> Outcome<Decide> {
    let option = parse_getex_options(&args[2..]).map_err(Reply::err)?;
    let expiry = option.map(|option| expiry_of(option, "getex")).transpose()?;
    Ok(Box::new(move |current, expires_at| {
        let Some(value) = current else { return Ok(Change::Keep(Reply::Nil)) };
        let reply = Reply::Bulk(value.to_vec());
        Ok(match expiry {
            None => Change::Keep(reply),
            Some(Expiry::Never) if expires_at.is_none() => Change::Keep(reply),
            Some(Expiry::AtUnixMs(at)) if at <= now_ms() => Change::Write(None, Expiry::Never, reply),
            Some(expiry) => Change::Write(Some(value.to_vec()), expiry, reply),
        })
    }))
}

/// The answer of a TTL-family command (`name`) for a key that `exists`, expiring at `expires_at`.
pub(super) fn answer_expiry_read(name: &str, exists: bool, expires_at: Option<u64>, now_ms: u64) -> Reply {
    let Some(at) = expires_at.filter(|_| exists) else {
        return Reply::Integer(if exists { -1 } else { -2 });
    };
    let at = at as i64;
    let left = (at - now_ms as i64).max(0);
    Reply::Integer(match name {
        "ttl" => (left + 500) / 1000,
        "pttl" => left,
        "expiretime" => (at + 500) / 1000,
        _ => at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(items: &[&str]) -> Vec<Vec<u8>> {
        items.iter().map(|item| item.as_bytes().to_vec()).collect()
    }

    fn decide(
        mut decide: Decide,
        current: Option<&str>,
        expires_at: Option<u64>,
    ) -> (Option<Option<Vec<u8>>>, Option<Expiry>, Reply) {
        match decide(current.map(str::as_bytes), expires_at).unwrap() {
            Change::Write(value, expiry, reply) => (Some(value), Some(expiry), reply),
            Change::Keep(reply) => (None, None, reply),
        }
    }

    #[test]
    fn expire_follows_redis_conditions_and_deletes_for_a_past_time() {
        let later = now_ms() + 3_600_000;
        let expire =
            |command: &[&str]| expire_decision(&command[0].to_ascii_lowercase(), &args(command)).unwrap();
        // Absent: 0, nothing written.
        assert_eq!(decide(expire(&["EXPIRE", "k", "10"]), None, None), (None, None, Reply::Integer(0)));
        // Set: the value again, with a relative expiry the leader fixes.
        let (value, expiry, reply) = decide(expire(&["EXPIRE", "k", "10"]), Some("v"), None);
        assert_eq!(
            (value, expiry, reply),
            (Some(Some(b"v".to_vec())), Some(Expiry::After(Duration::from_secs(10))), Reply::Integer(1))
        );
        let at = (later / 1000) as i64;
        let (_, expiry, _) = decide(expire(&["EXPIREAT", "k", &at.to_string()]), Some("v"), None);
        assert_eq!(expiry, Some(Expiry::AtUnixMs(at as u64 * 1000)));
        // A time already past deletes the key.
        let (value, _, reply) = decide(expire(&["PEXPIRE", "k", "-5"]), Some("v"), None);
        assert_eq!((value, reply), (Some(None), Reply::Integer(1)));
        let (value, _, _) = decide(expire(&["EXPIREAT", "k", "1"]), Some("v"), Some(later));
        assert_eq!(value, Some(None));
        // NX, XX, GT, LT against the current expiry.
        let cases = [
            (&["EXPIRE", "k", "10", "NX"][..], None, 1),
            (&["EXPIRE", "k", "10", "NX"], Some(later), 0),
            (&["EXPIRE", "k", "10", "XX"], None, 0),
            (&["EXPIRE", "k", "10", "XX"], Some(later), 1),
            (&["EXPIRE", "k", "10", "GT"], None, 0),
            (&["EXPIRE", "k", "10", "GT"], Some(later), 0),
            (&["EXPIRE", "k", "100000", "GT"], Some(later), 1),
            (&["EXPIRE", "k", "10", "LT"], None, 1),
            (&["EXPIRE", "k", "10", "LT"], Some(later), 1),
            (&["EXPIRE", "k", "100000", "LT"], Some(later), 0),
            (&["EXPIRE", "k", "10", "LT", "XX"], None, 0),
            (&["EXPIRE", "k", "10", "XX", "LT"], Some(later), 1),
        ];
        for (command, current, expected) in cases {
            assert_eq!(
                decide(expire(command), Some("v"), current).2,
                Reply::Integer(expected),
                "{command:?} {current:?}"
            );
        }
        for (command, error) in [
            (
                &["EXPIRE", "k", "10", "NX", "XX"][..],
                "NX and XX, GT or LT options at the same time are not compatible",
            ),
            (&["EXPIRE", "k", "10", "GT", "LT"], "GT and LT options at the same time are not compatible"),
            (&["EXPIRE", "k", "10", "FOO"], "Unsupported option FOO"),
            (&["EXPIRE", "k", "ten"], "value is not an integer or out of range"),
            (&["EXPIRE", "k", "9223372036854775807"], "invalid expire time in 'expire' command"),
        ] {
            let Err(Reply::Error(message)) = expire_decision("expire", &args(command)) else {
                panic!("{command:?} accepted")
            };
            assert_eq!(message, format!("ERR {error}"), "{command:?}");
        }
    }

    #[test]
    fn persist_getex_and_the_ttl_family() {
        assert_eq!(decide(persist_decision(), Some("v"), None).2, Reply::Integer(0));
        assert_eq!(decide(persist_decision(), None, None).2, Reply::Integer(0));
        let (value, expiry, reply) = decide(persist_decision(), Some("v"), Some(5));
        assert_eq!(
            (value, expiry, reply),
            (Some(Some(b"v".to_vec())), Some(Expiry::Never), Reply::Integer(1))
        );

        let getex = |options: &[&str]| {
            let mut command = vec!["GETEX", "k"];
            command.extend_from_slice(options);
            getex_decision(&args(&command)).unwrap()
        };
        assert_eq!(decide(getex(&[]), Some("v"), Some(9)), (None, None, Reply::text("v")));
        assert_eq!(decide(getex(&["EX", "5"]), None, None), (None, None, Reply::Nil));
        let (_, expiry, reply) = decide(getex(&["PX", "50"]), Some("v"), None);
        assert_eq!((expiry, reply), (Some(Expiry::After(Duration::from_millis(50))), Reply::text("v")));
        assert_eq!(decide(getex(&["PERSIST"]), Some("v"), None).0, None, "no expiry: nothing to write");
        assert_eq!(decide(getex(&["PERSIST"]), Some("v"), Some(9)).1, Some(Expiry::Never));
        assert_eq!(decide(getex(&["PXAT", "1"]), Some("v"), None).0, Some(None), "a past time deletes");
        assert!(getex_decision(&args(&["GETEX", "k", "EX", "0"])).is_err());

        let now = 1_000_000;
        assert_eq!(answer_expiry_read("ttl", false, None, now), Reply::Integer(-2));
        assert_eq!(answer_expiry_read("pttl", true, None, now), Reply::Integer(-1));
        assert_eq!(answer_expiry_read("ttl", true, Some(now + 9_600), now), Reply::Integer(10));
        assert_eq!(answer_expiry_read("pttl", true, Some(now + 9_600), now), Reply::Integer(9_600));
        assert_eq!(
            answer_expiry_read("expiretime", true, Some(1_700_000_000_400), now),
            Reply::Integer(1_700_000_000)
        );
        assert_eq!(
            answer_expiry_read("pexpiretime", true, Some(1_700_000_000_400), now),
            Reply::Integer(1_700_000_000_400)
        );
        assert_eq!(answer_expiry_read("pttl", true, Some(now - 5), now), Reply::Integer(0));
    }

    #[test]
    fn expiry_options_become_what_a_write_carries() {
        assert_eq!(
            expiry_of(ExpiryOption::Seconds(2), "set").unwrap(),
            Expiry::After(Duration::from_secs(2))
        );
        assert_eq!(expiry_of(ExpiryOption::AtSeconds(3), "set").unwrap(), Expiry::AtUnixMs(3000));
        assert_eq!(expiry_of(ExpiryOption::KeepTtl, "set").unwrap(), Expiry::Keep);
        assert!(expiry_of(ExpiryOption::Seconds(i64::MAX / 10), "set").is_err());
        assert!(expiry_of(ExpiryOption::AtSeconds(i64::MAX), "set").is_err());
        assert_eq!(
            setex_expiry("psetex", &args(&["PSETEX", "k", "100", "v"])).unwrap(),
            Expiry::After(Duration::from_millis(100))
        );
        assert!(setex_expiry("setex", &args(&["SETEX", "k", "0", "v"])).is_err());
        assert!(setex_expiry("setex", &args(&["SETEX", "k", "x", "v"])).is_err());
    }
}
