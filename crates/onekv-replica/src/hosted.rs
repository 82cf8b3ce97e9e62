//! Which shards this node hosts a replica of, kept in the data directory so that replicas added
//! or removed while the node runs survive a restart.
//!
//! The configuration's shards (the cluster's first placement) only seed the list: the first open
//! of a data directory writes them here, and later opens take the list from here. A replica added
//! at runtime ([`crate::Node::add_replica`]) is listed before it takes part in Raft; one removed
//! ([`crate::Node::remove_replica`]) is moved to the retired list, with the last voters it knew (so
//! the node can point clients at them), before its index tree is forgotten.
//!
//! Each replica's index trees carry a *generation* in their names: a shard removed and later added
//! again gets fresh trees, never the retired ones, whose directories are deleted at the next open
//! (while the node runs, a flush or compaction may still hold them). Log records of a retired
//! replica are skipped by recovery (before the new replica's recovery point) and are garbage to
//! the log collector, which keeps only values some hosted replica's tree points at.
//!
//! The file (`REPLICAS`) is text with a CRC-32C, rewritten whole (temporary name, fsync, rename,
//! directory fsync), like the identity and rejoining files. At most [`crate::MAX_SHARDS_PER_NODE`]
//! hosted and as many retired entries (one per shard, the latest).
//!
//! Does not decide where shards go (the placement and the operator's commands do) or when a
//! replica may be removed (its group's membership, checked by the caller).

use crate::ReplicaError;
use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::path::Path;

/// The file listing the hosted and retired replicas.
pub const FILE: &str = "REPLICAS";
const TMP_FILE: &str = "REPLICAS.tmp";

/// A retired replica: its trees' generation (to delete them) and the voters it last knew.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Retired {
    pub generation: u32,
    pub last_voters: Vec<u64>,
}

/// The node's replicas: hosted ones by shard with their trees' generation, and retired ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hosted {
    pub hosted: BTreeMap<u64, u32>,
    pub retired: BTreeMap<u64, Retired>,
}

impl Hosted {
    /// The generation a replica of `shard` added now gets: above every one it had here.
    pub fn next_generation(&self, shard: u64) -> u32 {
        let hosted = self.hosted.get(&shard).map_or(0, |g| g + 1);
        let retired = self.retired.get(&shard).map_or(0, |r| r.generation + 1);
        hosted.max(retired)
    }

    /// Lists `shard` as hosted with `generation` (no longer retired).
    pub fn host(&mut self, shard: u64, generation: u32) {
        self.retired.remove(&shard);
        self.hosted.insert(shard, generation);
    }

    /// Moves `shard` from hosted to retired, remembering `last_voters`.
    pub fn retire(&mut self, shard: u64, last_voters: Vec<u64>) {
        if let Some(generation) = self.hosted.remove(&shard) {
            self.retired.insert(shard, Retired { generation, last_voters });
        }
    }
}

/// The name of the index tree of `shard`'s replica of `generation` (generation 0 keeps the name
/// trees had before generations existed).
pub fn shard_tree_name(shard: u64, generation: u32) -> String {
    match generation {
        0 => format!("shard-{shard}"),
        g => format!("shard-{shard}.{g}"),
    }
}

/// The name of the Raft entry tree (classic mode) of `shard`'s replica of `generation`.
pub fn entry_tree_name(shard: u64, generation: u32) -> String {
    match generation {
        0 => format!("raft-entries-{shard}"),
        g => format!("raft-entries-{shard}.{g}"),
    }
}

/// The list in `dir`, if the file exists.
pub fn load(dir: &Path) -> Result<Option<Hosted>, ReplicaError> {
    let path = dir.join(FILE);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ReplicaError::Open(format!("reading {}: {e}", path.display()))),
    };
    parse(&text).map(Some).map_err(|reason| {
        ReplicaError::Open(format!("{} is damaged or not an onekv replicas file: {reason}", path.display()))
    })
}

/// Makes `hosted` the list of `dir`, durably.
pub fn store(dir: &Path, hosted: &Hosted) -> std::io::Result<()> {
    if crate::failpoints::hit("fail-replicas-write") {
        return Err(std::io::Error::other("injected failure (fail-replicas-write)"));
    }
    let tmp = dir.join(TMP_FILE);
    let mut file = fs::File::create(&tmp)?;
    file.write_all(render(hosted).as_bytes())?;
    file.sync_all()?;
    fs::rename(&tmp, dir.join(FILE))?;
    fs::File::open(dir)?.sync_all()
}

fn render(hosted: &Hosted) -> String {
    let list: Vec<String> = hosted.hosted.iter().map(|(shard, g)| format!("{shard}:{g}")).collect();
    let retired: Vec<String> = hosted
        .retired
        .iter()
        .map(|(shard, r)| {
            let voters: Vec<String> = r.last_voters.iter().map(u64::to_string).collect();
            format!("{shard}:{}:{}", r.generation, voters.join("/"))
        })
        .collect();
    crate::identity::with_checksum(format!(
        "onekv-replicas=1\nhosted={}\nretired={}\n",
        list.join(","),
        retired.join(",")
    ))
}

fn parse(text: &str) -> Result<Hosted, String> {
    let body = crate::identity::checked_body(text)?;
    let number = |s: &str| s.parse::<u64>().map_err(|e| format!("{s:?}: {e}"));
    let generation = |s: &str| s.parse::<u32>().map_err(|e| format!("{s:?}: {e}"));
    let mut out = Hosted::default();
    let mut version = false;
    for line in body.lines() {
        match line.split_once('=') {
            Some(("onekv-replicas", "1")) => version = true,
            Some(("onekv-replicas", v)) => return Err(format!("unsupported version {v}")),
            Some(("hosted", list)) => {
                for item in list.split(',').filter(|item| !item.is_empty()) {
                    let (shard, g) = item.split_once(':').ok_or(format!("bad entry {item:?}"))?;
                    out.hosted.insert(number(shard)?, generation(g)?);
                }
            }
            Some(("retired", list)) => {
                for item in list.split(',').filter(|item| !item.is_empty()) {
                    let mut parts = item.splitn(3, ':');
                    let (Some(shard), Some(g), Some(voters)) = (parts.next(), parts.next(), parts.next())
                    else {
                        return Err(format!("bad entry {item:?}"));
                    };
                    let last_voters = voters
                        .split('/')
                        .filter(|v| !v.is_empty())
                        .map(number)
                        .collect::<Result<Vec<u64>, String>>()?;
                    out.retired.insert(number(shard)?, Retired { generation: generation(g)?, last_voters });
                }
            }
            _ => return Err(format!("unexpected line {line:?}")),
        }
    }
    if !version {
        return Err("no version line".into());
    }
    if out.hosted.len() > crate::MAX_SHARDS_PER_NODE || out.retired.len() > crate::MAX_SHARDS_PER_NODE {
        return Err(format!("more than {} entries", crate::MAX_SHARDS_PER_NODE));
    }
    Ok(out)
}

/// Deletes every shard tree directory in `index_dir` that no hosted replica uses (those of
/// retired replicas, and of a replica whose addition a crash interrupted before it was listed).
/// Called before the node opens its trees, when no handle holds them.
pub fn delete_unused_trees(index_dir: &Path, hosted: &Hosted) -> Result<(), ReplicaError> {
    let in_use: std::collections::BTreeSet<String> = hosted
        .hosted
        .iter()
        .flat_map(|(shard, g)| [shard_tree_name(*shard, *g), entry_tree_name(*shard, *g)])
        .collect();
    let entries = match fs::read_dir(index_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ReplicaError::Open(format!("listing {}: {e}", index_dir.display()))),
    };
    let mut deleted = false;
    for entry in entries {
        let entry = entry.map_err(|e| ReplicaError::Open(format!("listing {}: {e}", index_dir.display())))?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
        let is_shard_tree =
            name.strip_prefix("shard-").or_else(|| name.strip_prefix("raft-entries-")).is_some_and(|rest| {
                let (id, generation) = rest.split_once('.').unwrap_or((rest, "0"));
                id.parse::<u64>().is_ok() && generation.parse::<u32>().is_ok()
            });
        if !is_shard_tree || in_use.contains(&name) || !entry.path().is_dir() {
            continue;
        }
        fs::remove_dir_all(entry.path())
            .map_err(|e| ReplicaError::Open(format!("deleting {}: {e}", entry.path().display())))?;
        tracing::info!(tree = %name, "deleted the index tree of a replica this node no longer hosts");
        deleted = true;
    }
    if deleted {
        fs::File::open(index_dir)
            .and_then(|dir| dir.sync_all())
            .map_err(|e| ReplicaError::Open(format!("syncing {}: {e}", index_dir.display())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_round_trips_and_damage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), None);
        let mut hosted = Hosted::default();
        hosted.host(1, 0);
        hosted.host(7, 0);
        hosted.retire(7, vec![2, 3, 4]);
        assert_eq!(hosted.next_generation(7), 1);
        let index = dir.path().join("index");
        for tree in ["shard-1", "shard-7", "shard-9.2", "raft-entries-7", "meta"] {
            fs::create_dir_all(index.join(tree)).unwrap();
        }
        hosted.host(9, hosted.next_generation(9));
        store(dir.path(), &hosted).unwrap();
        assert_eq!(load(dir.path()).unwrap(), Some(hosted.clone()));
        delete_unused_trees(&index, &hosted).unwrap();
        let mut left: Vec<String> =
            fs::read_dir(&index).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, ["meta", "shard-1"]);
        assert_eq!(hosted.retired[&7], Retired { generation: 0, last_voters: vec![2, 3, 4] });

        let path = dir.path().join(FILE);
        let text = fs::read_to_string(&path).unwrap().replace("hosted=1:0", "hosted=1:1");
        fs::write(&path, text).unwrap();
        let error = load(dir.path()).unwrap_err().to_string();
        assert!(error.contains("is damaged or not an onekv replicas file: checksum mismatch"), "{error}");
    }

    #[test]
    fn a_shard_added_again_gets_fresh_trees() {
        let mut hosted = Hosted::default();
        hosted.host(3, 0);
        hosted.retire(3, vec![1, 2]);
        let generation = hosted.next_generation(3);
        assert_eq!(generation, 1);
        hosted.host(3, generation);
        assert!(hosted.retired.is_empty());
        assert_ne!(shard_tree_name(3, 0), shard_tree_name(3, generation));
        hosted.retire(3, vec![1]);
        assert_eq!(hosted.next_generation(3), 2);
    }
}
