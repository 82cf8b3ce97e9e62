//! The keyspace: SCAN and its cursors (numbers naming the last key of a page, kept per node and
//! bounded), and counting every key (DBSIZE, INFO keyspace) with keys-only scans.

use std::collections::{HashMap, VecDeque};

use super::{Outcome, RespContext, not_an_integer, parse_integer};
use crate::pattern::Pattern;
use crate::protocol::Reply;

/// SCAN cursors kept per node; the oldest is forgotten first.
const MAX_CURSORS: usize = 4096;

impl RespContext {
    /// Every key, counted by paging through a linearizable keys-only scan: the node reads no value
    /// (INFO is many clients' ready check, and 1 MiB values would otherwise all be read to count).
    pub(super) async fn count_keys(&self) -> Outcome<u64> {
        let page_size = u32::try_from(self.shared.settings.max_scan_pairs).unwrap_or(u32::MAX);
        let (mut start, mut skip) = (Vec::new(), None);
        let mut count = 0u64;
        loop {
            let page = self.shared.client.scan_keys(&start, None, page_size, false).await?;
            count += page.keys.iter().filter(|key| skip.as_ref() != Some(*key)).count() as u64;
            match page.keys.last() {
                Some(last) if page.more && skip.as_ref() != Some(last) => {
                    (start, skip) = start_after(last, self.shared.settings.max_key_bytes);
                }
                _ => return Ok(count),
            }
        }
    }

    /// `SCAN cursor [MATCH pattern] [COUNT n] [TYPE type]`.
    pub(super) async fn scan(&self, args: &[Vec<u8>]) -> Outcome {
        let cursor = std::str::from_utf8(&args[1])
            .ok()
            .and_then(|text| text.parse::<u64>().ok())
            .ok_or_else(|| Reply::err("invalid cursor"))?;
        let mut pattern: Option<Pattern> = None;
        let mut count: usize = 10;
        let mut only_strings = true;
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
                b"TYPE" => only_strings = value.eq_ignore_ascii_case(b"string"),
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
        let prefix = pattern.as_ref().map(Pattern::literal_prefix).unwrap_or_default();
        let end = successor_of_prefix(&prefix);
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
        // Keys only: SCAN never returns values, so the node need not read them.
        let page = self.shared.client.scan_keys(&start, end.as_deref(), limit as u32, false).await?;
        let last = page.keys.last().cloned();
        let keys: Vec<Reply> = page
            .keys
            .into_iter()
            .filter(|key| skip.as_ref() != Some(key))
            .filter(|key| only_strings && pattern.as_ref().is_none_or(|pattern| pattern.matches(key)))
            .map(Reply::Bulk)
            .collect();
        let next = match last {
            Some(last) if page.more && skip.as_ref() != Some(&last) => {
                let mut cursors = self.shared.cursors.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                cursors.insert(last)
            }
            _ => 0,
        };
        Ok(Reply::Array(vec![Reply::text(next.to_string()), Reply::Array(keys)]))
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
