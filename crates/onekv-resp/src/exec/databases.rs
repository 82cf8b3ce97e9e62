//! Redis's numbered databases (`SELECT 0` to `SELECT 15`) as ranges of onekv's one key space.
//!
//! Database 0 is every key that does not begin with the reserved bytes `FF FF`, so its keys are
//! the gRPC API's keys unchanged (`onekv put k v` and `redis-cli GET k` see the same data).
//! Database n (1 to 15) is the keys that begin with `FF FF n`: a command's key arguments are
//! stored with that prefix ([`translate`]) and keys in replies are shown without it. A key of
//! database 0 that begins with `FF FF` is refused, since it would lie in another database's range.
//!
//! A cluster created by this release hashes a key without its database prefix
//! (`onekv_placement::KeyHashing::DatabaseBlind`), so a key lies in the same shard in every database:
//! `MOVE`, `COPY ... DB` and transactions over several databases stay within one shard. (A cluster
//! created before keeps hashing whole keys; there only keys that share a `{hash tag}` share a shard
//! across databases, the tag being left where it was by the prefix.)
//!
//! Owns: the mapping between a database's keys and stored keys, and each database's range. Does
//! not own the commands that scan a range (`keyspace`).

use super::{Outcome, not_an_integer, parse_integer};
use crate::commands::CommandSpec;
use crate::protocol::Reply;

/// The first bytes of every key of databases 1 to 15 (one definition, with the key hashing that
/// skips it).
use onekv_placement::DATABASE_PREFIX as RESERVED;
pub use onekv_placement::DATABASES;

/// The stored form of `key` in database `db`.
pub(super) fn stored_key(db: u8, key: &[u8]) -> Vec<u8> {
    if db == 0 {
        return key.to_vec();
    }
    let mut stored = Vec::with_capacity(key.len() + 3);
    stored.extend_from_slice(&RESERVED);
    stored.push(db);
    stored.extend_from_slice(key);
    stored
}

/// The key a client of database `db` sees for `stored`, a key of that database's range.
pub(super) fn user_key(db: u8, mut stored: Vec<u8>) -> Vec<u8> {
    if db != 0 {
        stored.drain(..RESERVED.len() + 1);
    }
    stored
}

/// The stored keys of database `db`: `start..end` (`None`: no end).
pub(super) fn range(db: u8) -> (Vec<u8>, Option<Vec<u8>>) {
    if db == 0 {
        return (Vec::new(), Some(RESERVED.to_vec()));
    }
    (stored_key(db, &[]), Some(stored_key(db + 1, &[])))
}

/// The database a stored key belongs to; `None` for a key under the reserved prefix that names no
/// database (written through the gRPC API).
pub(super) fn database_of(stored: &[u8]) -> Option<u8> {
    match stored.strip_prefix(&RESERVED[..]) {
        None => Some(0),
        Some([db, ..]) if (1..DATABASES).contains(db) => Some(*db),
        Some(_) => None,
    }
}

/// `SELECT`'s, `MOVE`'s and `COPY ... DB`'s database index.
pub(super) fn parse_index(arg: &[u8]) -> Outcome<u8> {
    let index = parse_integer(arg).ok_or_else(not_an_integer)?;
    u8::try_from(index)
        .ok()
        .filter(|&db| db < DATABASES)
        .ok_or_else(|| Reply::err("DB index is out of range"))
}

/// `args` with every key argument stored as database `db` holds it. `COPY`'s `DB n` option is
/// applied here: its destination is stored in database n and the option removed; so is `MOVE`'s
/// database: `MOVE key n` becomes `MOVE key key-in-database-n`. In database 0 a
/// key under the reserved prefix is refused.
pub(super) fn translate(db: u8, spec: &CommandSpec, mut args: Vec<Vec<u8>>) -> Outcome<Vec<Vec<u8>>> {
    let positions: Vec<usize> = spec.key_positions(args.len()).collect();
    let mut destination_db = db;
    if spec.name == "move" {
        // MOVE key db: the database number is replaced by the key as stored there.
        destination_db = parse_index(&args[2])?;
        if destination_db == db {
            return Err(Reply::err("source and destination objects are the same"));
        }
        args[2] = args[1].clone();
    }
    if spec.name == "copy" {
        // Every `DB n` is taken out; the last one counts, as in Redis.
        while let Some(option) = args.iter().skip(3).position(|arg| arg.eq_ignore_ascii_case(b"DB")) {
            let option = option + 3;
            let index = args.get(option + 1).ok_or_else(|| Reply::err("syntax error"))?;
            destination_db = parse_index(index)?;
            args.drain(option..option + 2);
        }
    }
    let mut positions = positions;
    if spec.name == "sort"
        && let Ok(options) = super::sort::parse(&args, false)
        && let Some(store) = options.store
    {
        // SORT ... STORE destination: a key the table's positions do not name.
        positions.push(store);
    }
    for position in positions {
        let target = if matches!(spec.name, "copy" | "move") && position == 2 { destination_db } else { db };
        let key = &mut args[position];
        if target == 0 && key.starts_with(&RESERVED) {
            return Err(Reply::err(
                "onekv: keys beginning with the bytes FF FF are reserved for databases 1 to 15 (SELECT)",
            ));
        }
        // The empty key stays empty, so every database refuses it alike.
        if !key.is_empty() {
            *key = stored_key(target, key);
        }
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands;

    fn args(items: &[&str]) -> Vec<Vec<u8>> {
        items.iter().map(|item| item.as_bytes().to_vec()).collect()
    }

    fn translated(db: u8, command: &[&str]) -> Outcome<Vec<Vec<u8>>> {
        let command = args(command);
        translate(db, commands::lookup(&command[0]).unwrap(), command)
    }

    #[test]
    fn database_zero_is_the_plain_key_space() {
        assert_eq!(translated(0, &["SET", "k", "v"]), Ok(args(&["SET", "k", "v"])));
        assert_eq!(stored_key(0, b"k"), b"k");
        assert_eq!(database_of(b"k"), Some(0));
        assert!(translated(0, &["GET", "\u{ffff}"]).is_ok(), "UTF-8 of U+FFFF begins EF, not FF");
        let reserved = vec![b"GET".to_vec(), vec![0xFF, 0xFF, 1, b'k']];
        assert!(translate(0, commands::lookup(b"get").unwrap(), reserved).is_err());
    }

    #[test]
    fn other_databases_prefix_their_keys() {
        let stored = stored_key(9, b"k");
        assert_eq!(stored, [0xFF, 0xFF, 9, b'k']);
        assert_eq!(user_key(9, stored.clone()), b"k");
        assert_eq!(database_of(&stored), Some(9));
        assert_eq!(database_of(&[0xFF, 0xFF, 200]), None);
        let (start, end) = range(9);
        assert!(start <= stored && Some(&stored) < end.as_ref());
        assert!(range(0).1.unwrap() <= range(1).0, "database 0 ends where database 1 starts");
        assert_eq!(range(15).1, Some(vec![0xFF, 0xFF, 16]));
        assert_eq!(
            translated(3, &["MSET", "a", "1", "b", "2"]),
            Ok(vec![
                b"MSET".to_vec(),
                stored_key(3, b"a"),
                b"1".to_vec(),
                stored_key(3, b"b"),
                b"2".to_vec()
            ])
        );
        assert_eq!(
            translated(3, &["COPY", "a", "b", "DB", "5", "REPLACE"]),
            Ok(vec![b"COPY".to_vec(), stored_key(3, b"a"), stored_key(5, b"b"), b"REPLACE".to_vec()])
        );
        assert_eq!(
            translated(0, &["COPY", "a", "b", "DB", "16"]),
            Err(Reply::err("DB index is out of range"))
        );
        assert_eq!(
            translated(0, &["COPY", "a", "b", "DB", "3", "DB", "4"]),
            Ok(vec![b"COPY".to_vec(), b"a".to_vec(), stored_key(4, b"b")]),
            "the last DB counts"
        );
        assert_eq!(translated(2, &["GET", ""]), Ok(args(&["GET", ""])), "the empty key is refused alike");
        // The reserved prefix is checked in the database each key is stored in.
        let into_zero =
            vec![b"COPY".to_vec(), b"a".to_vec(), vec![0xFF, 0xFF, 5, b'x'], b"DB".to_vec(), b"0".to_vec()];
        assert!(translate(1, commands::lookup(b"copy").unwrap(), into_zero).is_err());
        let into_three =
            vec![b"COPY".to_vec(), b"a".to_vec(), vec![0xFF, 0xFF, b'z'], b"DB".to_vec(), b"3".to_vec()];
        assert!(translate(0, commands::lookup(b"copy").unwrap(), into_three).is_ok());
        assert_eq!(translated(0, &["COPY", "a", "b", "DB"]), Err(Reply::err("syntax error")));
        assert_eq!(parse_index(b"15"), Ok(15));
        assert_eq!(parse_index(b"-1"), Err(Reply::err("DB index is out of range")));
        assert_eq!(parse_index(b"x"), Err(not_an_integer()));
    }
}
