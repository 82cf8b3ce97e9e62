//! The data directory's identity file: which node and storage mode the directory belongs to.
//!
//! Written once when the directory is created (to a temporary name, fsynced, renamed, directory
//! fsynced) and checked on every open, so a node never runs on another node's data or in another
//! mode than the one that wrote it. Layout (text, one `key=value` per line, then a CRC-32C of the
//! lines above it):
//!
//! ```text
//! onekv-data-dir=1
//! node_id=3
//! storage=onelog
//! crc32c=1a2b3c4d
//! ```
//!
//! A crash while the file is first written can leave `IDENTITY.tmp` and no `IDENTITY`: the
//! directory was never used (only the cluster map and the rejoining marker are written before the
//! identity exists), so the leftover is removed and, if nothing else is there, the directory is
//! set up as new.
//!
//! Also owns [`create_dir_all_synced`], which makes the data directory durable: creating a
//! directory is an entry in its parent, lost on power failure until the parent is fsynced.

use crate::{ReplicaError, StorageMode};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

const FILE: &str = "IDENTITY";
const TMP_FILE: &str = "IDENTITY.tmp";

/// The cluster map the server keeps in the data directory (`onekv-server`'s `cluster_map`): it
/// may be there before the identity, since it is written first.
pub const CLUSTER_MAP_FILE: &str = "CLUSTER_MAP";
/// The cluster's member list the server keeps in the data directory (`onekv-server`'s
/// `members`): written with the cluster map, before the identity.
pub const MEMBERS_FILE: &str = "MEMBERS";

/// The files a new data directory may hold before its identity: the cluster map and member list
/// (and their temporary names), and the rejoining marker (`rejoin`), written first so that no
/// crash leaves a new directory whose replicas would vote as if they held their logs.
const MAY_PRECEDE_IDENTITY: [&str; 6] = [
    CLUSTER_MAP_FILE,
    "CLUSTER_MAP.tmp",
    MEMBERS_FILE,
    "MEMBERS.tmp",
    crate::rejoin::FILE,
    crate::rejoin::TMP_FILE,
];

/// Creates `dir` and every missing ancestor, like [`fs::create_dir_all`], then fsyncs the parent
/// of each directory it created, so the new entries survive a power failure. Returns the
/// directories it synced (parents first), for tests.
pub fn create_dir_all_synced(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    // The ancestors that do not exist yet, deepest first; `create_dir_all` makes them.
    let missing: Vec<&Path> = dir
        .ancestors()
        .filter(|ancestor| !ancestor.as_os_str().is_empty())
        .take_while(|ancestor| !ancestor.exists())
        .collect();
    fs::create_dir_all(dir)?;
    let mut synced = Vec::new();
    for created in missing.iter().rev() {
        // The parent of a relative single component ("data") is "", the working directory.
        let parent = match created.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        sync_dir(parent)?;
        synced.push(parent.to_path_buf());
    }
    Ok(synced)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

/// Checks the identity of `dir` against `node_id` and `storage`. If the directory is new, first
/// calls `on_new` (which may write the files a new directory starts with: see
/// [`MAY_PRECEDE_IDENTITY`]), then writes the identity.
pub(crate) fn check_or_create(
    dir: &Path,
    node_id: u64,
    storage: StorageMode,
    on_new: impl FnOnce() -> Result<(), ReplicaError>,
) -> Result<(), ReplicaError> {
    let path = dir.join(FILE);
    let open_err =
        |what: &str, e: std::io::Error| ReplicaError::Open(format!("{what} {}: {e}", path.display()));
    match fs::read_to_string(&path) {
        Ok(text) => {
            let (found_node, found_storage) = parse(&text).map_err(|reason| {
                ReplicaError::Open(format!(
                    "{} is damaged or not an onekv identity file: {reason}",
                    path.display()
                ))
            })?;
            if found_node != node_id {
                return Err(ReplicaError::Open(format!(
                    "{} belongs to node {found_node}, not node {node_id}",
                    dir.display()
                )));
            }
            if found_storage != storage {
                return Err(ReplicaError::Open(format!(
                    "{} was created with storage = {}; it cannot be opened with storage = {}",
                    dir.display(),
                    found_storage.name(),
                    storage.name()
                )));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let tmp = dir.join(TMP_FILE);
            match fs::remove_file(&tmp) {
                Ok(()) => {
                    // A first start died while writing the identity; nothing else was written
                    // yet, so the directory is still new (if anything else is there, the check
                    // below refuses it as before).
                    tracing::warn!(path = %tmp.display(), "removed a half-written identity file left by a crash");
                    sync_dir(dir).map_err(|e| open_err("syncing the directory of", e))?;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(ReplicaError::Open(format!("removing the leftover {}: {e}", tmp.display())));
                }
            }
            let mut entries = fs::read_dir(dir).map_err(|e| open_err("listing", e))?;
            let foreign = entries.try_fold(false, |found, entry| {
                let entry = entry.map_err(|e| open_err("listing", e))?;
                let name = entry.file_name();
                let ours = name.to_str().is_some_and(|name| MAY_PRECEDE_IDENTITY.contains(&name));
                Ok::<_, ReplicaError>(found || !ours)
            })?;
            if foreign {
                return Err(ReplicaError::Open(format!(
                    "{} is not empty but has no {FILE} file: refusing to use a directory onekv did not create",
                    dir.display()
                )));
            }
            on_new()?;
            let text = render(node_id, storage);
            let mut file = fs::File::create(&tmp).map_err(|e| open_err("creating", e))?;
            file.write_all(text.as_bytes()).map_err(|e| open_err("writing", e))?;
            file.sync_all().map_err(|e| open_err("syncing", e))?;
            fs::rename(&tmp, &path).map_err(|e| open_err("renaming to", e))?;
            sync_dir(dir).map_err(|e| open_err("syncing the directory of", e))?;
            Ok(())
        }
        Err(e) => Err(open_err("reading", e)),
    }
}

fn render(node_id: u64, storage: StorageMode) -> String {
    with_checksum(format!("onekv-data-dir=1\nnode_id={node_id}\nstorage={}\n", storage.name()))
}

/// `body` (`key=value` lines) followed by the line with its CRC-32C: the form of the data
/// directory's small text files (this one, and `rejoin`'s).
pub(crate) fn with_checksum(body: String) -> String {
    format!("{body}crc32c={:08x}\n", crc32c::crc32c(body.as_bytes()))
}

/// The body of a text written by [`with_checksum`], if its checksum line matches it.
pub(crate) fn checked_body(text: &str) -> Result<&str, String> {
    let split = text.rfind("crc32c=").ok_or("no checksum line")?;
    let (body, crc_line) = text.split_at(split);
    let crc =
        u32::from_str_radix(crc_line.trim_start_matches("crc32c=").trim(), 16).map_err(|e| e.to_string())?;
    if crc != crc32c::crc32c(body.as_bytes()) {
        return Err("checksum mismatch".into());
    }
    Ok(body)
}

fn parse(text: &str) -> Result<(u64, StorageMode), String> {
    let body = checked_body(text)?;
    let mut node_id = None;
    let mut storage = None;
    for line in body.lines() {
        match line.split_once('=') {
            Some(("onekv-data-dir", "1")) => {}
            Some(("onekv-data-dir", v)) => return Err(format!("unsupported layout version {v}")),
            Some(("node_id", v)) => node_id = Some(v.parse::<u64>().map_err(|e| e.to_string())?),
            Some(("storage", v)) => {
                storage = Some(StorageMode::parse(v).ok_or(format!("unknown storage {v}"))?)
            }
            _ => return Err(format!("unexpected line {line:?}")),
        }
    }
    Ok((node_id.ok_or("no node_id")?, storage.ok_or("no storage")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_is_written_once_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        check_or_create(dir.path(), 2, StorageMode::OneLog, || Ok(())).unwrap();
        check_or_create(dir.path(), 2, StorageMode::OneLog, || Ok(())).unwrap();
        let other_node = check_or_create(dir.path(), 3, StorageMode::OneLog, || Ok(())).unwrap_err();
        assert!(other_node.to_string().contains("belongs to node 2"), "{other_node}");
        let other_mode = check_or_create(dir.path(), 2, StorageMode::Classic, || Ok(())).unwrap_err();
        assert!(other_mode.to_string().contains("storage = onelog"), "{other_mode}");
        let path = dir.path().join(FILE);
        let text = fs::read_to_string(&path).unwrap().replace("node_id=2", "node_id=3");
        fs::write(&path, text).unwrap();
        assert!(
            check_or_create(dir.path(), 3, StorageMode::OneLog, || Ok(()))
                .unwrap_err()
                .to_string()
                .contains("damaged")
        );
    }

    #[test]
    fn a_leftover_temporary_identity_from_a_crashed_first_start_is_removed() {
        // A crash after IDENTITY.tmp was created and before the rename.
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(TMP_FILE), b"onekv-data-dir=1\nnode_").unwrap();
        check_or_create(dir.path(), 1, StorageMode::OneLog, || Ok(())).unwrap();
        assert!(!dir.path().join(TMP_FILE).exists());
        check_or_create(dir.path(), 1, StorageMode::OneLog, || Ok(())).unwrap();
        // With something else beside it, the directory is still not onekv's: refused.
        let foreign = tempfile::tempdir().unwrap();
        fs::write(foreign.path().join(TMP_FILE), b"").unwrap();
        fs::write(foreign.path().join("something"), b"x").unwrap();
        let error = check_or_create(foreign.path(), 1, StorageMode::OneLog, || Ok(())).unwrap_err();
        assert!(error.to_string().contains("not empty"), "{error}");
    }

    #[test]
    fn the_cluster_map_may_precede_the_identity_and_nothing_else_may() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(CLUSTER_MAP_FILE), b"map").unwrap();
        check_or_create(dir.path(), 1, StorageMode::OneLog, || Ok(())).unwrap();
        assert!(dir.path().join(FILE).exists());
        let other = tempfile::tempdir().unwrap();
        fs::write(other.path().join(CLUSTER_MAP_FILE), b"map").unwrap();
        fs::write(other.path().join("CLUSTER_MAP.old"), b"x").unwrap();
        let error = check_or_create(other.path(), 1, StorageMode::OneLog, || Ok(())).unwrap_err();
        assert!(error.to_string().contains("not empty"), "{error}");
    }

    #[test]
    fn a_new_directory_s_first_files_are_written_before_the_identity_and_again_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let calls = std::cell::Cell::new(0);
        let write_first = || {
            calls.set(calls.get() + 1);
            crate::rejoin::store(dir.path(), &[1, 2].into()).map_err(|e| ReplicaError::Open(e.to_string()))
        };
        // A crash after the rejoining file was written and before the identity: still a new
        // directory, set up again.
        write_first().unwrap();
        fs::write(dir.path().join(TMP_FILE), b"onekv-data-dir=1\n").unwrap();
        check_or_create(dir.path(), 1, StorageMode::OneLog, write_first).unwrap();
        assert_eq!(calls.get(), 2);
        assert!(dir.path().join(FILE).exists());
        assert_eq!(crate::rejoin::load(dir.path()).unwrap(), [1, 2].into());
        // Opened again: not new, nothing written first.
        check_or_create(dir.path(), 1, StorageMode::OneLog, || panic!("not a new directory")).unwrap();
    }

    #[test]
    fn creating_the_data_directory_syncs_each_new_entry_s_parent() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a").join("b").join("data");
        let synced = create_dir_all_synced(&dir).unwrap();
        assert!(dir.is_dir());
        let expected: Vec<PathBuf> =
            vec![root.path().into(), root.path().join("a"), root.path().join("a").join("b")];
        assert_eq!(synced, expected);
        // Nothing new, nothing to sync.
        assert!(create_dir_all_synced(&dir).unwrap().is_empty());
    }

    #[test]
    fn a_foreign_non_empty_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("something"), b"x").unwrap();
        assert!(check_or_create(dir.path(), 1, StorageMode::OneLog, || Ok(())).is_err());
    }
}
