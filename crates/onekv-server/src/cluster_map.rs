//! The node's copy of the cluster map: which shards exist and which nodes hold each.
//!
//! The map is a pure function of the members, `cluster.shards` and `cluster.replicas`
//! ([`ServerConfig::cluster_map`]), computed when the cluster is created and kept in the data
//! directory (`CLUSTER_MAP`, the placement crate's checksummed encoding) so a restart keeps its
//! placement: a node whose configuration would place shards differently refuses to start, naming
//! both, rather than open trees of shards it never held and lose sight of those it did.
//!
//! Written before the node's data directory is first used (to a temporary name, fsynced, renamed,
//! directory fsynced). A data directory created before shards existed (an identity file and no
//! map) held one shard on every member: it opens only with that placement (`cluster.shards = 1`,
//! `cluster.replicas` = the number of members), which is then recorded.
//!
//! Does not own the rules of placement (`onekv-placement`) or agreeing on a map across nodes (the
//! metadata group, not built yet: today every member computes the same map from the same
//! configuration).

use std::fs;
use std::io::Write as _;
use std::path::Path;

use anyhow::{Context as _, bail};
use onekv_placement::ClusterMap;

use crate::config::ServerConfig;

/// The map's file in the data directory (the replica lets it precede its identity file).
pub const FILE: &str = onekv_replica::CLUSTER_MAP_FILE;
/// The replica's identity file: its presence means the data directory was used before.
const IDENTITY_FILE: &str = "IDENTITY";

/// The cluster map this node runs with: the one in its data directory, which must equal the one
/// `config` describes; or, for a new data directory, the one `config` describes, written first.
pub fn load_or_create(config: &ServerConfig) -> anyhow::Result<ClusterMap> {
    let dir = &config.data_dir;
    let path = dir.join(FILE);
    match fs::read(&path) {
        // A joined node's map is the cluster's, copied at its first start ([`crate::members::join`]):
        // its configuration never described it.
        Ok(bytes) if config.join => ClusterMap::decode(&bytes)
            .with_context(|| format!("{} is damaged or not a cluster map", path.display())),
        Ok(bytes) => {
            let wanted = config.cluster_map().context("cannot place the shards")?;
            let stored = ClusterMap::decode(&bytes)
                .with_context(|| format!("{} is damaged or not a cluster map", path.display()))?;
            if !same_placement(&stored, &wanted) {
                bail!(
                    "{} was created with {}; this configuration gives {} (cluster.shards, \
                     cluster.replicas, cluster.key_hashing and the members must stay as they were when \
                     the cluster was created)",
                    dir.display(),
                    describe(&stored),
                    describe(&wanted)
                );
            }
            Ok(stored)
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            if config.join {
                bail!("{} has no cluster map: a joining node copies it from a member first", dir.display());
            }
            let wanted = config.cluster_map().context("cannot place the shards")?;
            if dir.join(IDENTITY_FILE).exists() {
                let members: Vec<u64> = config.members.iter().map(|member| member.id).collect();
                let mut legacy = ClusterMap::build(&members, 1, members.len() as u32)
                    .context("cannot place the single shard of an older data directory")?;
                // One shard holds every key, however keys are hashed.
                legacy.key_hashing = wanted.key_hashing;
                if !same_placement(&legacy, &wanted) {
                    bail!(
                        "{} was created before shards existed and holds one shard on every member; \
                         start it with cluster.shards = 1 and cluster.replicas = {} (this configuration \
                         gives {})",
                        dir.display(),
                        members.len(),
                        describe(&wanted)
                    );
                }
            }
            write(dir, &wanted)?;
            Ok(wanted)
        }
        Err(error) => Err(error).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Whether two maps place the same shards on the same nodes and hash keys alike (the epoch aside).
fn same_placement(a: &ClusterMap, b: &ClusterMap) -> bool {
    a.nodes == b.nodes && a.shards == b.shards && a.key_hashing == b.key_hashing
}

fn describe(map: &ClusterMap) -> String {
    let nodes: Vec<String> = map.nodes.iter().map(u64::to_string).collect();
    let hashing = match map.key_hashing {
        onekv_placement::KeyHashing::WholeKey => "whole-key",
        onekv_placement::KeyHashing::DatabaseBlind => "database-blind",
    };
    format!(
        "{} shards of {} replicas on nodes {}, {hashing} key hashing",
        map.shard_count(),
        map.shards.first().map_or(0, |shard| shard.replicas.len()),
        nodes.join(", ")
    )
}

pub(crate) fn write(dir: &Path, map: &ClusterMap) -> anyhow::Result<()> {
    replace_file(dir, FILE, &map.encode())
}

/// Makes `dir/name` hold `bytes` durably: the data directory and any missing ancestor are created
/// (each entry made durable, as the node does), the bytes written to `name.tmp`, fsynced, renamed
/// over `name` and the directory fsynced. A crash leaves the old file or the new one whole.
pub(crate) fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
    onekv_replica::create_dir_all_synced(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = dir.join(format!("{name}.tmp"));
    let mut file = fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    file.write_all(bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    file.sync_all().with_context(|| format!("cannot sync {}", tmp.display()))?;
    drop(file);
    fs::rename(&tmp, dir.join(name)).with_context(|| format!("cannot rename {}", tmp.display()))?;
    fs::File::open(dir)
        .and_then(|handle| handle.sync_all())
        .with_context(|| format!("cannot sync the directory {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path, shards: u32) -> ServerConfig {
        let mut config = crate::config::node_one_of_three(dir);
        config.cluster.shards = shards;
        config
    }

    #[test]
    fn a_restart_keeps_the_placement_and_refuses_another() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(&config(dir.path(), 16)).unwrap();
        assert_eq!(first.shard_count(), 16);
        assert_eq!(load_or_create(&config(dir.path(), 16)).unwrap(), first);
        let error = load_or_create(&config(dir.path(), 8)).unwrap_err().to_string();
        assert!(error.contains("was created with 16 shards of 3 replicas on nodes 1, 2, 3"), "{error}");
        assert!(error.contains("gives 8 shards"), "{error}");
    }

    /// The key hashing is fixed at creation too: a data directory made with whole-key hashing (as
    /// every cluster before `cluster.key_hashing`, whose map is of format 1) keeps it, and a
    /// configuration naming the other rule (a node wiped and restarted with a newer default, say)
    /// is refused rather than routing keys of databases 1..15 to other shards than its peers.
    #[test]
    fn the_key_hashing_stays_as_created() {
        use crate::config::KeyHashingName;
        let dir = tempfile::tempdir().unwrap();
        let whole = load_or_create(&config(dir.path(), 16)).unwrap();
        assert_eq!(whole.key_hashing, onekv_placement::KeyHashing::WholeKey);
        assert_eq!(&fs::read(dir.path().join(FILE)).unwrap()[4..6], &1u16.to_le_bytes(), "format 1");
        let mut blind = config(dir.path(), 16);
        blind.cluster.key_hashing = KeyHashingName::DatabaseBlind;
        let error = load_or_create(&blind).unwrap_err().to_string();
        assert!(error.contains("whole-key key hashing; this configuration gives"), "{error}");
        assert!(error.contains("database-blind key hashing"), "{error}");
        let other = tempfile::tempdir().unwrap();
        let mut blind = config(other.path(), 16);
        blind.cluster.key_hashing = KeyHashingName::DatabaseBlind;
        assert_eq!(load_or_create(&blind).unwrap().key_hashing, onekv_placement::KeyHashing::DatabaseBlind);
        assert_eq!(load_or_create(&blind).unwrap().key_hashing, onekv_placement::KeyHashing::DatabaseBlind);
        assert!(load_or_create(&config(other.path(), 16)).is_err(), "whole-key over a database-blind map");
    }

    #[test]
    fn a_damaged_map_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        load_or_create(&config(dir.path(), 4)).unwrap();
        let path = dir.path().join(FILE);
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        fs::write(&path, bytes).unwrap();
        let error = format!("{:#}", load_or_create(&config(dir.path(), 4)).unwrap_err());
        assert!(error.contains("is damaged or not a cluster map"), "{error}");
    }

    #[test]
    fn a_data_directory_from_before_shards_opens_only_as_one_shard() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(IDENTITY_FILE), "used").unwrap();
        let error = load_or_create(&config(dir.path(), 16)).unwrap_err().to_string();
        assert!(error.contains("start it with cluster.shards = 1"), "{error}");
        assert!(!dir.path().join(FILE).exists());
        let map = load_or_create(&config(dir.path(), 1)).unwrap();
        assert_eq!(map.shard_count(), 1);
        assert_eq!(map.shards[0].replicas.len(), 3);
    }
}
