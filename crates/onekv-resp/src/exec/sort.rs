//! SORT and SORT_RO: the elements of a list, set or sorted set, sorted as numbers or (ALPHA) as
//! bytes, with LIMIT, ASC/DESC, and STORE into a list.
//!
//! `BY` and `GET` with a pattern read other keys, named by each element: onekv refuses them (a
//! transaction must know its keys before it reads them). `BY` with a pattern without `*` (Redis's
//! "do not sort") and `GET #` (the element itself) are supported.
//!
//! Owns: the options, the order, and STORE into another shard (read, then written: not atomic).
//! Does not own reading the source (a linearizable read) or STORE within one shard (a transaction
//! of its own, `transaction`).

use std::cmp::Ordering;

use super::types::{self, Kind};
use super::{MAX_REPLY_BYTES, Outcome, RespContext, lists, not_an_integer, parse_integer, sets, zsets};
use crate::protocol::Reply;

/// SORT's options.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct SortOptions {
    /// Keep the stored order (`BY` a pattern without `*`).
    pub unsorted: bool,
    pub descending: bool,
    pub alpha: bool,
    /// `LIMIT offset count`: the offset (at least 0) and the count (`None`: the rest).
    pub limit: Option<(usize, Option<usize>)>,
    /// Position of STORE's destination in the arguments.
    pub store: Option<usize>,
    /// How many `GET #` were given (each repeats the element in the reply).
    pub gets: usize,
}

/// SORT's (or, `read_only`, SORT_RO's) options from its arguments (`args[1]` is the key).
pub(super) fn parse(args: &[Vec<u8>], read_only: bool) -> Outcome<SortOptions> {
    let mut options = SortOptions::default();
    let mut position = 2;
    while position < args.len() {
        let option = args[position].to_ascii_uppercase();
        let next = args.get(position + 1);
        match (option.as_slice(), next) {
            (b"ASC", _) => options.descending = false,
            (b"DESC", _) => options.descending = true,
            (b"ALPHA", _) => options.alpha = true,
            (b"LIMIT", Some(offset)) if position + 2 < args.len() => {
                let offset = parse_integer(offset).ok_or_else(not_an_integer)?;
                let count = parse_integer(&args[position + 2]).ok_or_else(not_an_integer)?;
                let offset = usize::try_from(offset).unwrap_or(0);
                options.limit = Some((offset, usize::try_from(count).ok()));
                position += 2;
            }
            (b"STORE", Some(_)) if !read_only => {
                options.store = Some(position + 1);
                position += 1;
            }
            (b"BY", Some(pattern)) => {
                if pattern.contains(&b'*') {
                    return Err(refused_pattern("BY"));
                }
                options.unsorted = true;
                position += 1;
            }
            (b"GET", Some(pattern)) => {
                if pattern.as_slice() != b"#" {
                    return Err(refused_pattern("GET"));
                }
                options.gets += 1;
                position += 1;
            }
            _ => return Err(Reply::err("syntax error")),
        }
        position += 1;
    }
    Ok(options)
}

fn refused_pattern(option: &str) -> Reply {
    Reply::err(format!(
        "onekv: SORT ... {option} with a pattern is not supported (it reads keys named by each element); \
         BY without '*' and GET # are"
    ))
}

/// The elements of `value` (a list, set or sorted set; absent: none) in the order SORT gives them.
pub(super) fn sorted(value: Option<&[u8]>, options: &SortOptions) -> Outcome<Vec<Vec<u8>>> {
    let mut elements: Vec<Vec<u8>> = match value {
        None => Vec::new(),
        Some(value) => match types::kind_of(value) {
            Kind::List => lists::decode(value)?,
            Kind::Set => sets::decode(value)?.into_iter().collect(),
            Kind::Zset => {
                zsets::ranked(&zsets::decode(value)?).into_iter().map(|(member, _)| member.clone()).collect()
            }
            Kind::String | Kind::Hash => return Err(types::wrong_type()),
        },
    };
    if !options.unsorted {
        if options.alpha {
            elements.sort();
        } else {
            let mut scored = elements
                .into_iter()
                .map(|element| Ok((score(&element)?, element)))
                .collect::<Outcome<Vec<(f64, Vec<u8>)>>>()?;
            // Equal numbers are ordered by their bytes, as in Redis.
            scored
                .sort_by(|(a, x), (b, y)| a.partial_cmp(b).unwrap_or(Ordering::Equal).then_with(|| x.cmp(y)));
            elements = scored.into_iter().map(|(_, element)| element).collect();
        }
        if options.descending {
            elements.reverse();
        }
    }
    if let Some((offset, count)) = options.limit {
        let start = offset.min(elements.len());
        let end = count.map_or(elements.len(), |count| start.saturating_add(count).min(elements.len()));
        elements = elements[start..end].to_vec();
    }
    Ok(elements)
}

/// An element as a number, as Redis reads it for SORT.
fn score(element: &[u8]) -> Outcome<f64> {
    std::str::from_utf8(element)
        .ok()
        .map(str::trim_start)
        .and_then(|text| text.parse::<f64>().ok())
        .filter(|score| !score.is_nan())
        .ok_or_else(|| Reply::err("One or more scores can't be converted into double"))
}

impl RespContext {
    /// SORT ... STORE into a key of another shard than the source's: `elements` written as the
    /// list at `destination` (none: the key deleted), without an expiry. The count.
    pub(super) async fn store_list(&self, destination: &[u8], elements: Vec<Vec<u8>>) -> Outcome {
        if let Some(error) = self.unwritable(destination, &[]) {
            return Err(error);
        }
        let count = elements.len() as i64;
        let client = &self.shared.client;
        if elements.is_empty() {
            client.delete(destination).await?;
        } else {
            let value = lists::encode(&elements);
            self.check_value(&value)?;
            client.put(destination, &value).await?;
        }
        self.forget(destination);
        Ok(Reply::Integer(count))
    }
}

/// SORT's result: the elements, each repeated once per `GET #` (what the reply lists and STORE
/// stores), at most [`MAX_REPLY_BYTES`] of them.
pub(super) fn result(elements: Vec<Vec<u8>>, options: &SortOptions) -> Outcome<Vec<Vec<u8>>> {
    let repeat = options.gets.max(1);
    let bytes = elements.iter().map(|element| element.len() + 16).sum::<usize>().saturating_mul(repeat);
    if bytes > MAX_REPLY_BYTES {
        return Err(Reply::err(format!("onekv: SORT's result would exceed {MAX_REPLY_BYTES} bytes")));
    }
    Ok(elements.into_iter().flat_map(|element| std::iter::repeat_n(element, repeat)).collect())
}

/// SORT's reply (without STORE).
pub(super) fn reply(elements: Vec<Vec<u8>>, options: &SortOptions) -> Outcome {
    Ok(Reply::Array(result(elements, options)?.into_iter().map(Reply::Bulk).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(items: &[&str]) -> Vec<Vec<u8>> {
        items.iter().map(|item| item.as_bytes().to_vec()).collect()
    }

    fn sort(value: Option<&[u8]>, options: &[&str]) -> Outcome<Vec<String>> {
        let mut command = args(&["SORT", "k"]);
        command.extend(args(options));
        let options = parse(&command, false)?;
        Ok(sorted(value, &options)?.into_iter().map(|e| String::from_utf8(e).unwrap()).collect())
    }

    #[test]
    fn numbers_bytes_limits_and_order() {
        let list = lists::encode(&args(&["10", "9", "2.5", "-1", "9"]));
        assert_eq!(sort(Some(&list), &[]).unwrap(), ["-1", "2.5", "9", "9", "10"]);
        assert_eq!(sort(Some(&list), &["DESC", "LIMIT", "1", "2"]).unwrap(), ["9", "9"]);
        assert_eq!(sort(Some(&list), &["ALPHA"]).unwrap(), ["-1", "10", "2.5", "9", "9"]);
        assert_eq!(sort(Some(&list), &["BY", "nosort"]).unwrap(), ["10", "9", "2.5", "-1", "9"]);
        assert_eq!(sort(Some(&list), &["LIMIT", "3", "-1"]).unwrap(), ["9", "10"]);
        assert_eq!(sort(Some(&list), &["LIMIT", "-5", "1"]).unwrap(), ["-1"]);
        assert_eq!(sort(None, &[]).unwrap(), Vec::<String>::new());
        let words = lists::encode(&args(&["b", "a"]));
        assert_eq!(
            sort(Some(&words), &[]),
            Err(Reply::err("One or more scores can't be converted into double"))
        );
        assert_eq!(sort(Some(&words), &["alpha"]).unwrap(), ["a", "b"]);
        assert_eq!(sort(Some(b"a string"), &[]), Err(types::wrong_type()));
    }

    #[test]
    fn options_are_checked() {
        assert_eq!(parse(&args(&["SORT", "k", "STORE", "d"]), false).unwrap().store, Some(3));
        assert_eq!(parse(&args(&["SORT_RO", "k", "STORE", "d"]), true), Err(Reply::err("syntax error")));
        assert_eq!(parse(&args(&["SORT", "k", "LIMIT", "1"]), false), Err(Reply::err("syntax error")));
        assert_eq!(parse(&args(&["SORT", "k", "LIMIT", "x", "1"]), false), Err(not_an_integer()));
        assert!(parse(&args(&["SORT", "k", "BY", "w_*"]), false).is_err());
        assert!(parse(&args(&["SORT", "k", "GET", "o_*"]), false).is_err());
        assert_eq!(parse(&args(&["SORT", "k", "GET", "#", "GET", "#"]), false).unwrap().gets, 2);
        let twice = SortOptions { gets: 2, ..SortOptions::default() };
        assert_eq!(reply(args(&["a"]), &twice), Ok(Reply::Array(vec![Reply::text("a"), Reply::text("a")])));
        // Many GET # over many elements: refused before anything is built.
        let many = SortOptions { gets: 300_000, ..SortOptions::default() };
        assert!(result(vec![b"element".to_vec(); 100_000], &many).is_err());
    }
}
