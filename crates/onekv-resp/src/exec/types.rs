//! The type of a value (string, hash, set, list, sorted set) and the encoding the collection types
//! share.
//!
//! Every onekv value is bytes. The front end stores a collection (a hash, a set) as one value: a
//! marker naming its type (`00 FF onekv-<type> 00 01`), the number of entries (u32,
//! little-endian), then each entry's byte strings, each as a u32 little-endian length and the
//! bytes ([`encode_items`]). Any other value is a string. The front end refuses to write a string
//! that begins with the markers' common prefix ([`reserved_string`]), so a string never turns into
//! a collection; a value written through the gRPC API that begins with a marker reads as that
//! type here.
//!
//! Owns: the markers, [`kind_of`], the type errors, and the item codec. Does not own what a type's
//! commands do (`hashes`, `sets`, `lists`, `zsets`).

use onekv_client::Expiry;

use super::combine::Change;
use super::{MAX_REPLY_BYTES, Outcome};
use crate::protocol::Reply;

/// The bytes every collection's marker begins with; no string written through the front end may.
const RESERVED_PREFIX: &[u8] = b"\x00\xffonekv-";
/// The first bytes of a hash.
pub(super) const HASH_MARKER: &[u8] = b"\x00\xffonekv-hash\x00\x01";
/// The first bytes of a set.
pub(super) const SET_MARKER: &[u8] = b"\x00\xffonekv-set\x00\x01";
/// The first bytes of a list.
pub(super) const LIST_MARKER: &[u8] = b"\x00\xffonekv-list\x00\x01";
/// The first bytes of a sorted set.
pub(super) const ZSET_MARKER: &[u8] = b"\x00\xffonekv-zset\x00\x01";

/// A value's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    String,
    Hash,
    Set,
    List,
    Zset,
}

impl Kind {
    /// TYPE's name for it.
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::String => "string",
            Kind::Hash => "hash",
            Kind::Set => "set",
            Kind::List => "list",
            Kind::Zset => "zset",
        }
    }
}

/// The type of `value`.
pub(super) fn kind_of(value: &[u8]) -> Kind {
    if value.starts_with(HASH_MARKER) {
        Kind::Hash
    } else if value.starts_with(SET_MARKER) {
        Kind::Set
    } else if value.starts_with(LIST_MARKER) {
        Kind::List
    } else if value.starts_with(ZSET_MARKER) {
        Kind::Zset
    } else {
        Kind::String
    }
}

/// `TYPE`'s answer for a value (`None`: absent).
pub(super) fn type_name(value: Option<&[u8]>) -> &'static str {
    value.map_or("none", |value| kind_of(value).name())
}

/// Redis's error for a command on a value of another type.
pub(super) fn wrong_type() -> Reply {
    Reply::Error("WRONGTYPE Operation against a key holding the wrong kind of value".into())
}

/// `value`, if it is a string (absent: `None`); [`wrong_type`] if it is a collection. String
/// commands read their value through this.
pub(super) fn string_value(value: Option<&[u8]>) -> Outcome<Option<&[u8]>> {
    match value {
        Some(value) if kind_of(value) != Kind::String => Err(wrong_type()),
        value => Ok(value),
    }
}

/// Whether `value` is a string (MGET answers nil for the others).
pub(super) fn is_string(value: &[u8]) -> bool {
    kind_of(value) == Kind::String
}

/// The error for a string value a client may not write, if `value` is one: it begins as the
/// collections' markers do.
pub(super) fn reserved_string(value: &[u8]) -> Option<Reply> {
    value.starts_with(RESERVED_PREFIX).then(|| {
        Reply::err(
            "onekv: string values beginning with the bytes 00 FF 'onekv-' are reserved \
             (they mark hashes, sets, lists and sorted sets)",
        )
    })
}

/// The encoded length of `entries` entries of `items` (their byte strings, in order) behind a
/// marker of `marker_len` bytes.
pub(super) fn encoded_len<'a>(marker_len: usize, items: impl IntoIterator<Item = &'a [u8]>) -> usize {
    marker_len + 4 + items.into_iter().map(|item| 4 + item.len()).sum::<usize>()
}

/// `marker`, the number of entries, then every item (each entry's byte strings, in order) with its
/// length.
pub(super) fn encode_items<'a>(
    marker: &[u8],
    entries: usize,
    items: impl IntoIterator<Item = &'a [u8]>,
) -> Vec<u8> {
    let mut out = marker.to_vec();
    out.extend_from_slice(&(entries as u32).to_le_bytes());
    for item in items {
        out.extend_from_slice(&(item.len() as u32).to_le_bytes());
        out.extend_from_slice(item);
    }
    out
}

/// The items of a value [`encode_items`] made with `marker` and entries of `width` byte strings,
/// in order. A value that does not decode (no marker, truncated, trailing bytes) is an error
/// naming the damage: it was not written by this front end.
pub(super) fn decode_items<'a>(value: &'a [u8], marker: &[u8], width: usize) -> Outcome<Vec<&'a [u8]>> {
    let mut rest = value.strip_prefix(marker).ok_or_else(|| damaged("no marker"))?;
    let mut take = |len: usize| -> Outcome<&'a [u8]> {
        if rest.len() < len {
            return Err(damaged("truncated"));
        }
        let (taken, after) = rest.split_at(len);
        rest = after;
        Ok(taken)
    };
    let length = |bytes: &[u8]| u32::from_le_bytes(bytes.try_into().expect("four bytes")) as usize;
    let entries = length(take(4)?);
    // Every item takes at least its length's four bytes: a count larger than that is damage, not
    // an allocation to make.
    let count = entries
        .checked_mul(width)
        .filter(|&count| count <= value.len() / 4)
        .ok_or_else(|| damaged("count"))?;
    let mut items = Vec::with_capacity(count);
    for _ in 0..count {
        let len = length(take(4)?);
        items.push(take(len)?);
    }
    if encoded_len(marker.len(), items.iter().copied()) != value.len() {
        return Err(damaged("trailing bytes"));
    }
    Ok(items)
}

/// A value as a command of type `kind` finds it: `None` for an absent key, [`wrong_type`] for a
/// value of another type, else `decode`'s reading of it.
pub(super) fn decode_as<T>(
    value: Option<&[u8]>,
    kind: Kind,
    decode: impl Fn(&[u8]) -> Outcome<T>,
) -> Outcome<Option<T>> {
    match value {
        None => Ok(None),
        Some(value) if kind_of(value) == kind => decode(value).map(Some),
        Some(_) => Err(wrong_type()),
    }
}

/// LRANGE's, LTRIM's and ZRANGE's inclusive `start..=stop` (negative: from the end) within `len`
/// entries, as a half-open range; empty when nothing lies in it. (GETRANGE's rule for a string
/// differs: `bytes::inclusive_range`.)
pub(super) fn rank_range(start: i64, stop: i64, len: usize) -> std::ops::Range<usize> {
    let len = i64::try_from(len).unwrap_or(i64::MAX);
    let start = if start < 0 { len.saturating_add(start).max(0) } else { start };
    let stop = if stop < 0 { len.saturating_add(stop) } else { stop.min(len - 1) };
    if start > stop || start >= len { 0..0 } else { start as usize..stop as usize + 1 }
}

/// The error for a collection value that does not decode.
pub(super) fn damaged(what: &str) -> Reply {
    Reply::err(format!("onekv: the key holds a damaged value ({what})"))
}

/// The write of a collection's new `encoded` value, keeping the key's expiry (an empty collection,
/// `None`, deletes the key, as in Redis), answering `reply`; refused when the value would be over
/// `max_value_bytes`.
pub(super) fn store(
    encoded: Option<Vec<u8>>,
    max_value_bytes: usize,
    what: &str,
    reply: Reply,
) -> Outcome<Change> {
    let Some(encoded) = encoded else {
        return Ok(Change::Write(None, Expiry::Never, reply));
    };
    if encoded.len() > max_value_bytes {
        return Err(Reply::err(format!(
            "onekv: a {what} is stored as one value of at most limits.max_value_bytes = {max_value_bytes} \
             bytes; this write would make it {}",
            encoded.len()
        )));
    }
    Ok(Change::Write(Some(encoded), Expiry::Keep, reply))
}

/// Redis's thresholds for keeping a collection compact, which decide what OBJECT ENCODING calls
/// it: `hash-max-listpack-entries` (128) and `hash-max-listpack-value` (64) (`-ziplist-` before
/// Redis 7), `set-max-intset-entries` (512), `zset-max-listpack-entries` (128) and
/// `zset-max-listpack-value` (64). CONFIG SET changes them on a node until it restarts;
/// onekv stores every collection the same way whatever they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Encodings {
    /// Most fields of a `listpack` hash.
    pub hash_entries: u64,
    /// Longest field or value of a `listpack` hash.
    pub hash_value: u64,
    /// Most members of an `intset` set.
    pub set_intset_entries: u64,
    /// Most members of a `listpack` sorted set.
    pub zset_entries: u64,
    /// Longest member of a `listpack` sorted set.
    pub zset_value: u64,
}

impl Default for Encodings {
    fn default() -> Self {
        Encodings {
            hash_entries: 128,
            hash_value: 64,
            set_intset_entries: 512,
            zset_entries: 128,
            zset_value: 64,
        }
    }
}

/// Most elements a random pick with a negative count (repeats allowed) returns, so one command
/// cannot make the node build an unbounded reply from a small collection (of short members; long
/// ones are bounded by their bytes, [`MAX_REPLY_BYTES`]).
pub(super) const MAX_RANDOM_PICKS: u64 = 1 << 20;

/// HRANDFIELD's and SRANDMEMBER's choice of `count` entries of `items`, as Redis 7 makes it: a
/// positive count that many distinct entries (at most all), in random order; a negative one that
/// many drawn with repeats, refused when more than [`MAX_RANDOM_PICKS`] or when their `size`s add
/// up to more than [`MAX_REPLY_BYTES`]. A count below `-limit` is Redis's "value is out of range".
pub(super) fn random_picks<T>(
    items: &[T],
    count: i64,
    limit: i64,
    size: impl Fn(&T) -> usize,
) -> Outcome<Vec<&T>> {
    use rand::Rng as _;
    use rand::seq::SliceRandom as _;
    if count < -limit {
        return Err(Reply::err("value is out of range"));
    }
    let mut rng = rand::rng();
    if items.is_empty() {
        return Ok(Vec::new());
    }
    if count >= 0 {
        // Distinct entries: at most the collection, itself at most one value.
        let mut picked: Vec<&T> = items.iter().collect();
        picked.shuffle(&mut rng);
        picked.truncate(usize::try_from(count).unwrap_or(usize::MAX));
        return Ok(picked);
    }
    let wanted = count.unsigned_abs();
    if wanted > MAX_RANDOM_PICKS {
        return Err(Reply::err(format!(
            "onekv: a negative count returns at most {MAX_RANDOM_PICKS} elements"
        )));
    }
    let mut picked = Vec::with_capacity(wanted as usize);
    let mut bytes = 0usize;
    for _ in 0..wanted {
        let item = &items[rng.random_range(0..items.len())];
        bytes += size(item);
        if bytes > MAX_REPLY_BYTES {
            return Err(Reply::err(format!(
                "onekv: the reply would exceed {MAX_REPLY_BYTES} bytes; ask for fewer elements"
            )));
        }
        picked.push(item);
    }
    Ok(picked)
}

/// The options of HSCAN and SSCAN after the key.
pub(super) struct ScanOptions {
    /// `MATCH pattern`.
    pub pattern: Option<crate::pattern::Pattern>,
    /// Whether values are returned (HSCAN without `NOVALUES`).
    pub with_values: bool,
}

/// Checks a collection scan's `cursor` and parses its `options` (`MATCH`, `COUNT`, and `NOVALUES`
/// where `novalues` allows it). A collection is one value read whole, so every scan answers in one
/// page and `COUNT` is checked and otherwise ignored.
pub(super) fn parse_scan_options(cursor: &[u8], options: &[Vec<u8>], novalues: bool) -> Outcome<ScanOptions> {
    std::str::from_utf8(cursor)
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
        .ok_or_else(|| Reply::err("invalid cursor"))?;
    let mut parsed = ScanOptions { pattern: None, with_values: true };
    let mut options = options.iter();
    let syntax = || Reply::err("syntax error");
    while let Some(option) = options.next() {
        match option.to_ascii_uppercase().as_slice() {
            b"NOVALUES" if novalues => parsed.with_values = false,
            b"MATCH" => {
                parsed.pattern = Some(crate::pattern::Pattern::parse(options.next().ok_or_else(syntax)?))
            }
            b"COUNT" => {
                let count = options.next().ok_or_else(syntax)?;
                let count = super::parse_integer(count).ok_or_else(super::not_an_integer)?;
                if count < 1 {
                    return Err(syntax());
                }
            }
            _ => return Err(syntax()),
        }
    }
    Ok(parsed)
}

/// Helpers for the collection modules' unit tests.
#[cfg(test)]
pub(super) mod test_support {
    use super::super::combine::{Change, Decide};
    use super::Outcome;
    use crate::protocol::Reply;

    /// An array of bulk strings of `items`.
    pub fn bulks(items: &[&str]) -> Reply {
        Reply::Array(items.iter().map(|item| Reply::text(*item)).collect())
    }

    /// A read's reply (`answer` of its arguments and its one key's value), errors included.
    pub fn read(
        answer: impl Fn(&str, &[Vec<u8>], Option<&[u8]>) -> Outcome,
        command: &[&str],
        value: &Option<Vec<u8>>,
    ) -> Reply {
        answer(command[0], &args(command), value.as_deref()).unwrap_or_else(|error| error)
    }

    /// A command's arguments from text.
    pub fn args(items: &[&str]) -> Vec<Vec<u8>> {
        items.iter().map(|item| item.as_bytes().to_vec()).collect()
    }

    /// Runs a write's decision (`decision` of its arguments) against `value`: the new value (the old
    /// one if nothing was written) and the reply.
    pub fn write(
        decision: impl Fn(&str, &[Vec<u8>], usize) -> Outcome<Decide>,
        command: &[&str],
        value: Option<Vec<u8>>,
    ) -> (Option<Vec<u8>>, Reply) {
        let mut decide = match decision(command[0], &args(command), 1 << 20) {
            Ok(decide) => decide,
            Err(error) => return (value, error),
        };
        match decide(value.as_deref(), None) {
            Ok(Change::Write(new, _, reply)) => (new, reply),
            Ok(Change::Keep(reply)) => (value, reply),
            Err(error) => (value, error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_round_trip_and_damage_is_an_error() {
        let items: Vec<&[u8]> = vec![b"a", b"", b"ccc", b"dd"];
        let encoded = encode_items(SET_MARKER, 2, items.iter().copied());
        assert_eq!(encoded.len(), encoded_len(SET_MARKER.len(), items.iter().copied()));
        assert_eq!(decode_items(&encoded, SET_MARKER, 2).unwrap(), items);
        assert!(decode_items(&encoded, HASH_MARKER, 2).is_err(), "another type's marker");
        assert!(decode_items(&encoded, SET_MARKER, 1).is_err(), "entries of another width");
        for cut in SET_MARKER.len()..encoded.len() {
            assert!(decode_items(&encoded[..cut], SET_MARKER, 2).is_err(), "cut at {cut}");
        }
        let mut longer = encoded.clone();
        longer.push(0);
        assert!(decode_items(&longer, SET_MARKER, 2).is_err());
        // A count far beyond the bytes: refused before allocating.
        let mut huge = SET_MARKER.to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_items(&huge, SET_MARKER, 2).is_err());
    }

    #[test]
    fn random_picks_with_repeats_are_bounded_in_bytes() {
        let items = [vec![7u8; 1 << 20]];
        // 100 repeats of a 1 MiB member would be a 100 MiB reply.
        let Err(Reply::Error(error)) = random_picks(&items, -100, i64::MAX, Vec::len) else { panic!() };
        assert!(error.contains("bytes"), "{error}");
        assert_eq!(random_picks(&items, -60, i64::MAX, Vec::len).unwrap().len(), 60);
        assert_eq!(random_picks(&items, 100, i64::MAX, Vec::len).unwrap().len(), 1);
        let small = [vec![1u8]];
        assert!(random_picks(&small, -(MAX_RANDOM_PICKS as i64) - 1, i64::MAX, Vec::len).is_err());
    }

    #[test]
    fn kinds_and_reserved_strings() {
        let set = encode_items(SET_MARKER, 0, []);
        let hash = encode_items(HASH_MARKER, 0, []);
        assert_eq!((kind_of(&set), kind_of(&hash), kind_of(b"x")), (Kind::Set, Kind::Hash, Kind::String));
        assert_eq!((type_name(None), type_name(Some(&set)), type_name(Some(b""))), ("none", "set", "string"));
        assert_eq!(string_value(Some(&hash)), Err(wrong_type()));
        assert_eq!(string_value(Some(b"x")), Ok(Some(&b"x"[..])));
        assert!(
            reserved_string(b"\x00\xffonekv-anything").is_some()
                && reserved_string(b"\x00\xffonek").is_none()
        );
    }
}
