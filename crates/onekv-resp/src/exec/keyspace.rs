//! The keyspace: SCAN and its cursors (numbers naming the last key of a page, kept per node and
//! bounded), the commands that page through every key with keys-only scans: counting them
//! (DBSIZE, INFO keyspace), KEYS and RANDOMKEY; and FLUSHALL/FLUSHDB, one replicated range
//! deletion of the database's range (`Client::delete_range`), which reads no key here.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::databases::{self, DATABASES};
use super::types;
use super::{Outcome, RespContext, not_an_integer, parse_integer};
use crate::pattern::Pattern;
use crate::protocol::Reply;

/// SCAN cursors kept per node; the oldest is forgotten first.
const MAX_CURSORS: usize = 4096;
/// Most levels RANDOMKEY's descent goes down before it takes the first key under its prefix.
const RANDOM_KEY_LEVELS: usize = 16;
/// How old INFO keyspace's counts may be. DBSIZE always counts.
const KEY_COUNTS_MAX_AGE: Duration = Duration::from_secs(5);
/// How long a failed count is answered again rather than retried.
const KEY_COUNT_ERROR_MAX_AGE: Duration = Duration::from_secs(1);
/// Bytes a key costs in KEYS's reply beyond its own (the reply element and its allocation).
const KEY_REPLY_OVERHEAD: usize = 48;
/// Largest reply KEYS builds (its keys' bytes and [`KEY_REPLY_OVERHEAD`] per key), so one call
/// cannot make the node buffer gigabytes.
const MAX_KEYS_REPLY_BYTES: usize = 64 << 20;

/// Pages of keys in `start..end`, read by linearizable keys-only scans, each page continuing just
/// after the last key of the one before.
struct KeyPages {
    start: Vec<u8>,
    end: Option<Vec<u8>>,
    /// The key the next page starts at and must skip (see [`start_after`]).
    skip: Option<Vec<u8>>,
    page_size: u32,
    done: bool,
}

impl KeyPages {
    fn new(start: Vec<u8>, end: Option<Vec<u8>>, page_size: usize) -> KeyPages {
        let page_size = u32::try_from(page_size).unwrap_or(u32::MAX).max(1);
        KeyPages { start, end, skip: None, page_size, done: false }
    }

    /// The next page's keys; `None` after the last.
    async fn next(&mut self, context: &RespContext) -> Outcome<Option<Vec<Vec<u8>>>> {
        if self.done {
            return Ok(None);
        }
        let client = &context.shared.client;
        let limit = self.page_size.saturating_add(u32::from(self.skip.is_some()));
        let page = client.scan_keys(&self.start, self.end.as_deref(), limit, false).await?;
        let mut keys = page.keys;
        if self.skip.take().is_some_and(|skip| keys.first() == Some(&skip)) {
            keys.remove(0);
        }
        match keys.last() {
            Some(last) if page.more => {
                (self.start, self.skip) = start_after(last, context.shared.settings.max_key_bytes);
            }
            _ => self.done = true,
        }
        Ok(Some(keys))
    }
}

impl RespContext {
    /// Every key, counted by paging through a linearizable keys-only scan: the node reads no value
    /// (INFO is many clients' ready check, and 1 MiB values would otherwise all be read to count).
    pub(super) async fn count_keys(&self, db: u8) -> Outcome<u64> {
        let (start, end) = databases::range(db);
        let mut pages = KeyPages::new(start, end, self.shared.settings.max_scan_pairs);
        let mut count = 0u64;
        while let Some(keys) = pages.next(self).await? {
            count += keys.len() as u64;
        }
        Ok(count)
    }

    /// The keys of every database for INFO keyspace: counted in one pass over the whole key space,
    /// at most once per [`KEY_COUNTS_MAX_AGE`] per node (INFO is many clients' ready check, sent on
    /// every new connection, and a count costs O(keys)); concurrent callers share one count.
    /// A failed count is reused too, for [`KEY_COUNT_ERROR_MAX_AGE`]: the INFOs waiting behind it
    /// must not each spend the client's retry budget on the same outage, one after another.
    pub(super) async fn key_counts(&self) -> Outcome<[u64; DATABASES as usize]> {
        let mut cached = self.shared.key_counts.lock().await;
        if let Some((taken, counts)) = &*cached {
            let max_age = if counts.is_ok() { KEY_COUNTS_MAX_AGE } else { KEY_COUNT_ERROR_MAX_AGE };
            if taken.elapsed() < max_age {
                return counts.clone();
            }
        }
        let taken = Instant::now();
        let counts = self.count_keys_per_database().await;
        *cached = Some((taken, counts.clone()));
        counts
    }

    /// Forgets INFO keyspace's counts (after a flush, so the next INFO counts again).
    async fn forget_key_counts(&self) {
        *self.shared.key_counts.lock().await = None;
    }

    /// The keys of every database, counted in one pass over the whole key space.
    async fn count_keys_per_database(&self) -> Outcome<[u64; DATABASES as usize]> {
        let mut pages = KeyPages::new(Vec::new(), None, self.shared.settings.max_scan_pairs);
        let mut counts = [0u64; DATABASES as usize];
        while let Some(keys) = pages.next(self).await? {
            for db in keys.iter().filter_map(|key| databases::database_of(key)) {
                counts[usize::from(db)] += 1;
            }
        }
        Ok(counts)
    }

    /// `KEYS pattern`: every matching key, by paging through keys-only scans of the range the
    /// pattern's literal prefix allows. A full scan, as in Redis; the reply is bounded in bytes.
    pub(super) async fn keys(&self, db: u8, pattern: &[u8]) -> Outcome {
        let pattern = Pattern::parse(pattern);
        let prefix = databases::stored_key(db, &pattern.literal_prefix());
        if prefix.len() > self.shared.settings.max_key_bytes {
            return Ok(Reply::Array(Vec::new()));
        }
        let end = end_within(&prefix, db);
        if end.as_ref().is_some_and(|end| prefix >= *end) {
            return Ok(Reply::Array(Vec::new()));
        }
        let mut pages = KeyPages::new(prefix, end, self.shared.settings.max_scan_pairs);
        let (mut matched, mut bytes) = (Vec::new(), 0usize);
        while let Some(keys) = pages.next(self).await? {
            let keys = keys.into_iter().map(|key| databases::user_key(db, key));
            for key in keys.filter(|key| pattern.matches(key)) {
                // The key and what holding it as a reply costs besides its bytes.
                bytes += key.len() + KEY_REPLY_OVERHEAD;
                if bytes > MAX_KEYS_REPLY_BYTES {
                    return Err(Reply::err(format!(
                        "onekv: KEYS would build a reply of more than {MAX_KEYS_REPLY_BYTES} bytes; use SCAN"
                    )));
                }
                matched.push(Reply::Bulk(key));
            }
        }
        Ok(Reply::Array(matched))
    }

    /// `RANDOMKEY`: a key reached by a random descent through the key space. At each step the
    /// smallest and largest key under the current prefix are read, and the next byte is drawn
    /// between theirs (an empty branch leads to the next one that holds keys). Any key can come
    /// back and dense ranges are sampled about evenly, but the draw is not uniform: keys next to
    /// gaps are favoured. Costs a few keys-only scans per level, at most [`RANDOM_KEY_LEVELS`].
    pub(super) async fn random_key(&self, db: u8) -> Outcome {
        let (first, _) = databases::range(db);
        let mut prefix = first.clone();
        // Whether the prefix is itself a key that was passed over (the next step starts after it).
        let mut after_prefix = false;
        for _ in 0..RANDOM_KEY_LEVELS {
            let mut start = prefix.clone();
            if after_prefix {
                start.push(0);
            }
            let end = end_within(&prefix, db);
            let Some(low) = self.first_key(&start, end.as_deref(), false).await? else { break };
            let high = self.first_key(&start, end.as_deref(), true).await?.unwrap_or_else(|| low.clone());
            if low == high {
                return Ok(Reply::Bulk(databases::user_key(db, low)));
            }
            let common = low.iter().zip(&high).take_while(|(a, b)| a == b).count();
            if common == low.len() {
                // `low` is a key and a prefix of every other key in range.
                if rand::random_bool(0.5) || low.len() >= self.shared.settings.max_key_bytes {
                    return Ok(Reply::Bulk(databases::user_key(db, low)));
                }
                (prefix, after_prefix) = (low, true);
                continue;
            }
            let mut branch = low[..common].to_vec();
            branch.push(rand::random_range(low[common]..=high[common]));
            let found = self.first_key(&branch, end.as_deref(), false).await?.unwrap_or(high);
            (prefix, after_prefix) = (found[..=common].to_vec(), false);
        }
        let end = end_within(&first, db);
        let key = match self.first_key(&prefix, end.as_deref(), false).await? {
            Some(key) => Some(key),
            None => self.first_key(&first, end.as_deref(), false).await?,
        };
        Ok(Reply::optional(key.map(|key| databases::user_key(db, key))))
    }

    /// The first key of `start..end` (the last with `reverse`), by a linearizable keys-only scan.
    async fn first_key(&self, start: &[u8], end: Option<&[u8]>, reverse: bool) -> Outcome<Option<Vec<u8>>> {
        Ok(self.shared.client.scan_keys(start, end, 1, reverse).await?.keys.pop())
    }

    /// `FLUSHALL` (`db` is `None`: every key) and `FLUSHDB [ASYNC|SYNC]` (the keys of database
    /// `db`): one replicated range deletion per shard, page by page (the client's `delete_range`:
    /// no key crosses the network, and each page is one bounded Raft entry). Not atomic: a write
    /// that races the flush may survive it. `ASYNC` answers as `SYNC` does, once every key is gone.
    pub(super) async fn flush(&self, db: Option<u8>, args: &[Vec<u8>]) -> Outcome {
        match &args[1..] {
            [] => {}
            [mode] if mode.eq_ignore_ascii_case(b"ASYNC") || mode.eq_ignore_ascii_case(b"SYNC") => {}
            _ => return Err(Reply::err("syntax error")),
        }
        let (start, end) = db.map_or((Vec::new(), None), databases::range);
        let deleted = self.shared.client.delete_range(&start, end.as_deref()).await?;
        self.forget_all();
        self.forget_key_counts().await;
        tracing::info!(deleted, database = db, "FLUSHALL/FLUSHDB deleted every key");
        Ok(Reply::ok())
    }

    /// `SCAN cursor [MATCH pattern] [COUNT n] [TYPE type]`.
    pub(super) async fn scan(&self, db: u8, args: &[Vec<u8>]) -> Outcome {
        let cursor = std::str::from_utf8(&args[1])
            .ok()
            .and_then(|text| text.parse::<u64>().ok())
            .ok_or_else(|| Reply::err("invalid cursor"))?;
        let mut pattern: Option<Pattern> = None;
        let mut count: usize = 10;
        // TYPE: only keys of this type (`None`: every key).
        let mut only_type: Option<Vec<u8>> = None;
        let mut options = args[2..].iter();
        while let Some(option) = options.next() {
            let value = options.next().ok_or_else(|| Reply::err("syntax error"))?;
            match option.to_ascii_uppercase().as_slice() {
                b"MATCH" => pattern = Some(Pattern::parse(value)),
                b"COUNT" => {
                    count = parse_integer(value)
                        .ok_or_else(not_an_integer)?
                        .try_into()
                        .ok()
                        .filter(|&count: &usize| count >= 1)
                        .ok_or_else(|| Reply::err("syntax error"))?;
                }
                b"TYPE" => only_type = Some(value.to_ascii_lowercase()),
                _ => return Err(Reply::err("syntax error")),
            }
        }
        let resume = if cursor == 0 {
            None
        } else {
            let cursors = self.shared.cursors.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            Some(cursors.get(cursor).ok_or_else(|| {
                Reply::err("invalid cursor (unknown to this node, or forgotten: cursors live on the node that made them)")
            })?)
        };
        let prefix =
            databases::stored_key(db, &pattern.as_ref().map(Pattern::literal_prefix).unwrap_or_default());
        let end = end_within(&prefix, db);
        let (mut start, skip) = match &resume {
            Some(resume) => start_after(resume, self.shared.settings.max_key_bytes),
            None => (Vec::new(), None),
        };
        if start < prefix {
            start = prefix.clone();
        }
        let done = Reply::Array(vec![Reply::text("0"), Reply::Array(Vec::new())]);
        // A prefix longer than any key onekv can hold matches nothing (and the node would refuse
        // it as a scan bound).
        if prefix.len() > self.shared.settings.max_key_bytes || end.as_ref().is_some_and(|end| start >= *end)
        {
            return Ok(done);
        }
        let limit = (count + usize::from(skip.is_some())).min(self.shared.settings.max_scan_pairs);
        // Keys only, unless TYPE asks what the values are: SCAN never returns values.
        let (found, more) = match &only_type {
            None => {
                let page = self.shared.client.scan_keys(&start, end.as_deref(), limit as u32, false).await?;
                (page.keys.into_iter().map(|key| (key, true)).collect::<Vec<_>>(), page.more)
            }
            Some(wanted) => {
                let page = self.shared.client.scan(&start, end.as_deref(), limit as u32, false).await?;
                let typed = |value: &[u8]| types::type_name(Some(value)).as_bytes() == wanted.as_slice();
                (page.pairs.into_iter().map(|(key, value)| (key, typed(&value))).collect(), page.more)
            }
        };
        let last = found.last().map(|(key, _)| key.clone());
        let keys: Vec<Reply> = found
            .into_iter()
            .filter(|(key, wanted)| *wanted && skip.as_ref() != Some(key))
            .map(|(key, _)| databases::user_key(db, key))
            .filter(|key| pattern.as_ref().is_none_or(|pattern| pattern.matches(key)))
            .map(Reply::Bulk)
            .collect();
        let next = match last {
            Some(last) if more && skip.as_ref() != Some(&last) => {
                let mut cursors = self.shared.cursors.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                cursors.insert(last)
            }
            _ => 0,
        };
        Ok(Reply::Array(vec![Reply::text(next.to_string()), Reply::Array(keys)]))
    }
}

/// The end of the stored keys of database `db` that begin with `prefix` (itself a stored key of
/// `db`): the prefix's successor, or the database's end if that comes first.
fn end_within(prefix: &[u8], db: u8) -> Option<Vec<u8>> {
    let successor = successor_of_prefix(prefix);
    match (successor, databases::range(db).1) {
        (Some(successor), Some(end)) => Some(successor.min(end)),
        (successor, end) => successor.or(end),
    }
}

/// Where a scan continues after `last`: at its successor `last ++ 0x00`, or, when that would be over
/// the key limit (the node refuses such a start), at `last` itself, which is then skipped (the
/// second value).
fn start_after(last: &[u8], max_key_bytes: usize) -> (Vec<u8>, Option<Vec<u8>>) {
    if last.len() < max_key_bytes {
        let mut start = last.to_vec();
        start.push(0);
        (start, None)
    } else {
        (last.to_vec(), Some(last.to_vec()))
    }
}

/// The smallest key above every key that starts with `prefix` (`None`: no such bound, the scan
/// runs to the end).
fn successor_of_prefix(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// SCAN cursors of one node: cursor number → the last key of the page it continues.
pub(super) struct Cursors {
    next: u64,
    keys: HashMap<u64, Vec<u8>>,
    order: VecDeque<u64>,
}

impl Cursors {
    pub(super) fn new(first: u64) -> Cursors {
        Cursors { next: first, keys: HashMap::new(), order: VecDeque::new() }
    }

    fn get(&self, cursor: u64) -> Option<Vec<u8>> {
        self.keys.get(&cursor).cloned()
    }

    fn insert(&mut self, key: Vec<u8>) -> u64 {
        let cursor = self.next;
        self.next = if self.next >= (1 << 53) - 1 { 1 } else { self.next + 1 };
        self.keys.insert(cursor, key);
        self.order.push_back(cursor);
        while self.order.len() > MAX_CURSORS {
            if let Some(oldest) = self.order.pop_front() {
                self.keys.remove(&oldest);
            }
        }
        cursor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_continue_just_past_the_last_key() {
        assert_eq!(start_after(b"ab", 4), (b"ab\0".to_vec(), None));
        assert_eq!(start_after(b"abcd", 4), (b"abcd".to_vec(), Some(b"abcd".to_vec())));
    }

    #[test]
    fn prefix_successors() {
        assert_eq!(successor_of_prefix(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(successor_of_prefix(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(successor_of_prefix(b"\xff\xff"), None);
        assert_eq!(successor_of_prefix(b""), None);
    }

    #[test]
    fn cursors_are_bounded_and_forget_the_oldest() {
        let mut cursors = Cursors::new(7);
        let first = cursors.insert(b"a".to_vec());
        assert_eq!(first, 7);
        assert_eq!(cursors.get(first), Some(b"a".to_vec()));
        for i in 0..MAX_CURSORS {
            cursors.insert(i.to_string().into_bytes());
        }
        assert_eq!(cursors.get(first), None);
        assert_eq!(cursors.keys.len(), MAX_CURSORS);
        let mut wrapping = Cursors::new((1 << 53) - 1);
        wrapping.insert(Vec::new());
        assert_eq!(wrapping.insert(Vec::new()), 1);
    }
}
