//! The node's copy of the cluster's member list, and how the cluster agrees on it.
//!
//! The agreed list lives in the store itself, under the reserved key [`MEMBERS_KEY`]: a change is a
//! compare-and-swap of that key through its shard's Raft group (`Kv.SetMembers`, served by
//! `service`), so two changes can never both succeed from the same epoch. The first list (epoch 1) is
//! the configuration's `members`, and the key is absent until the first change. Each node keeps the
//! newest list it has seen in its data directory (`MEMBERS`, [`MemberList`]'s checksummed encoding,
//! rewritten whole with fsync, rename and directory fsync) and reads the key again every
//! [`REFRESH_EVERY`] ([`refresh_forever`]), so a node that was down or unreachable during a change
//! learns it within seconds of being reachable. The data directory's list wins over the
//! configuration at every start after the first: the configuration only seeds it.
//!
//! Everything that turns a node id into an address or a peer into a member reads the
//! [`Directory`]: the peer transport (new members get a queue), the `Peer` service (which senders it
//! accepts), redirects to leaders, and `Status`. Which shards a node holds is not here: that is each
//! shard's own Raft membership.
//!
//! A new node is started with `join` set: at its first start it copies the cluster map and member
//! list from a member that answers ([`join`]) and hosts no shard; `onekv node add` then adds it to
//! the list and moves replicas onto it.
//!
//! Keys under [`SYSTEM_PREFIX`] belong to onekv: clients may read them, never write them, and scans
//! skip them (`service`).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use onekv_placement::{ClusterMap, Member, MemberList};
use tokio::sync::watch;

use crate::config::ServerConfig;

pub use onekv_placement::{MEMBERS_KEY, SYSTEM_PREFIX};
/// The member list's file in the data directory (the replica lets it precede its identity file).
pub const FILE: &str = onekv_replica::MEMBERS_FILE;
/// How often a node reads the agreed list again.
pub const REFRESH_EVERY: Duration = Duration::from_secs(2);
/// How long a joining node keeps asking the members it was given for the cluster's map and list.
const JOIN_PATIENCE: Duration = Duration::from_secs(60);

/// Whether `key` is under [`SYSTEM_PREFIX`].
pub fn is_system_key(key: &[u8]) -> bool {
    key.starts_with(SYSTEM_PREFIX)
}

/// The newest member list this node knows, shared by everything that reaches other nodes.
pub struct Directory {
    current: watch::Sender<Arc<MemberList>>,
    /// Held across an adoption's check, file write and publication, so two adoptions (a change
    /// this node made and one it read) never interleave their writes of the one file.
    adopting: std::sync::Mutex<()>,
    /// The data directory's file; `None` for a directory kept only in memory (tests, tools).
    file: Option<PathBuf>,
}

impl Directory {
    /// A directory of the configuration's members at epoch 1, kept only in memory.
    pub fn from_config(config: &ServerConfig) -> anyhow::Result<Directory> {
        Ok(Directory {
            current: watch::Sender::new(Arc::new(configured(config)?)),
            adopting: Default::default(),
            file: None,
        })
    }

    /// The list in the data directory, or (first start) the configuration's, written there.
    pub fn load_or_create(config: &ServerConfig) -> anyhow::Result<Directory> {
        let path = config.data_dir.join(FILE);
        let list = match fs::read(&path) {
            Ok(bytes) => MemberList::decode(&bytes)
                .with_context(|| format!("{} is damaged or not a member list", path.display()))?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let list = configured(config)?;
                write(&config.data_dir, &list)?;
                list
            }
            Err(error) => return Err(error).with_context(|| format!("cannot read {}", path.display())),
        };
        Ok(Directory {
            current: watch::Sender::new(Arc::new(list)),
            adopting: Default::default(),
            file: Some(path),
        })
    }

    /// The newest list this node knows.
    pub fn current(&self) -> Arc<MemberList> {
        Arc::clone(&self.current.borrow())
    }

    /// Tells of every list adopted from now on.
    pub fn subscribe(&self) -> watch::Receiver<Arc<MemberList>> {
        self.current.subscribe()
    }

    /// Takes `list` if it is newer than the current one: written to the data directory first, then
    /// shown to every subscriber. Returns whether it was taken. Blocks on the file's fsync.
    pub fn adopt(&self, list: MemberList) -> anyhow::Result<bool> {
        let _adopting = self.adopting.lock().unwrap_or_else(|e| e.into_inner());
        if list.epoch <= self.current.borrow().epoch {
            return Ok(false);
        }
        if let Some(dir) = self.file.as_deref().and_then(Path::parent) {
            onekv_replica::failpoint!("before-member-list-write");
            write(dir, &list)?;
            onekv_replica::failpoint!("after-member-list-write");
        }
        self.current.send_replace(Arc::new(list));
        Ok(true)
    }
}

/// The configuration's members as the first list.
fn configured(config: &ServerConfig) -> anyhow::Result<MemberList> {
    let members = config
        .members
        .iter()
        .map(|member| Member { id: member.id, address: member.address.clone() })
        .collect();
    MemberList::new(1, members).context("the configured members are not a valid member list")
}

fn write(dir: &Path, list: &MemberList) -> anyhow::Result<()> {
    crate::cluster_map::replace_file(dir, FILE, &list.encode())
}

/// Reads the agreed list every [`REFRESH_EVERY`] and adopts it when it is newer; runs until
/// dropped. A failed read (no leader yet, a partition) is tried again at the next round.
pub async fn refresh_forever(directory: Arc<Directory>, node_id: u64) {
    let mut client: Option<(u64, onekv_client::Client)> = None;
    loop {
        let list = directory.current();
        if client.as_ref().is_none_or(|(epoch, _)| *epoch != list.epoch) {
            let endpoints = list.members().iter().map(|member| member.address.clone()).collect();
            let options = onekv_client::ClientOptions {
                request_timeout: Duration::from_secs(2),
                retry_budget: Duration::from_secs(2),
                ..onekv_client::ClientOptions::default()
            };
            client = onekv_client::Client::new(endpoints, options).ok().map(|client| (list.epoch, client));
        }
        if let Some((_, client)) = &client {
            match client.get(MEMBERS_KEY).await {
                Ok(Some(bytes)) => match MemberList::decode(&bytes) {
                    Ok(agreed) if agreed.epoch > list.epoch => {
                        let epoch = agreed.epoch;
                        let directory = Arc::clone(&directory);
                        match tokio::task::spawn_blocking(move || directory.adopt(agreed)).await {
                            Ok(Ok(true)) => {
                                tracing::info!(node = node_id, epoch, "adopted the cluster's member list")
                            }
                            Ok(Ok(false)) => {}
                            Ok(Err(error)) => tracing::error!(%error, "cannot keep the new member list"),
                            Err(error) => tracing::error!(%error, "keeping the member list panicked"),
                        }
                    }
                    Ok(_) => {}
                    Err(error) => tracing::error!(%error, "the stored member list does not decode"),
                },
                Ok(None) => {}
                Err(error) => tracing::debug!(%error, "cannot read the cluster's member list yet"),
            }
        }
        tokio::time::sleep(REFRESH_EVERY).await;
    }
}

/// For a node started with `join` and a data directory that holds no cluster map yet: asks the
/// other configured members (each in turn, for up to a minute) for the cluster's map and member
/// list, and writes both into the data directory. The node then hosts no shard until replicas are
/// moved onto it (`onekv node add`). Nothing happens for a data directory that was used before.
pub async fn join(config: &ServerConfig) -> anyhow::Result<()> {
    if !config.join || config.data_dir.join(crate::cluster_map::FILE).exists() {
        return Ok(());
    }
    let seeds: Vec<String> = config
        .members
        .iter()
        .filter(|member| member.id != config.node_id)
        .map(|member| member.address.clone())
        .collect();
    if seeds.is_empty() {
        bail!("join is set but no other member is listed: list at least one node of the cluster to join");
    }
    let deadline = tokio::time::Instant::now() + JOIN_PATIENCE;
    let mut last_error = String::new();
    loop {
        for seed in &seeds {
            match ask(seed).await {
                Ok((map, list)) => {
                    if list.contains(config.node_id)
                        && list.address(config.node_id) != Some(own_address(config))
                    {
                        bail!(
                            "node {} is already a member of the cluster at {}: give this node another id",
                            config.node_id,
                            list.address(config.node_id).unwrap_or_default()
                        );
                    }
                    let dir = config.data_dir.clone();
                    tokio::task::spawn_blocking(move || {
                        write(&dir, &list)?;
                        // The map is written last: a start that finds it does not join again.
                        onekv_replica::failpoint!("join-before-map");
                        crate::cluster_map::write(&dir, &map)
                    })
                    .await
                    .context("writing the joined cluster's map panicked")??;
                    tracing::info!(node = config.node_id, %seed, "copied the cluster map and member list to join");
                    return Ok(());
                }
                Err(error) => last_error = format!("{seed}: {error:#}"),
            }
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("no member of the cluster to join answered within {JOIN_PATIENCE:?} (last: {last_error})");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// This node's address as the configuration gives it.
fn own_address(config: &ServerConfig) -> &str {
    config.member_address(config.node_id).unwrap_or(&config.listen)
}

/// The cluster map and member list `seed` reports.
async fn ask(seed: &str) -> anyhow::Result<(ClusterMap, MemberList)> {
    let client = onekv_client::Client::new(vec![seed.to_string()], onekv_client::ClientOptions::default())?;
    let status = client.status(seed).await?;
    let map = ClusterMap::decode(&status.cluster_map).context("its cluster map does not decode")?;
    let members = status.members.into_iter().map(|m| Member { id: m.id, address: m.address }).collect();
    let list =
        MemberList::new(status.members_epoch.max(1), members).context("its member list is not valid")?;
    Ok((map, list))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::node_one_of_three as config;

    #[test]
    fn the_data_directory_keeps_the_newest_list_over_the_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let directory = Directory::load_or_create(&config(dir.path())).unwrap();
        let first = directory.current();
        assert_eq!((first.epoch, first.members().len()), (1, 3));
        let grown = first.with(Member { id: 4, address: "127.0.0.1:7004".into() }).unwrap();
        let changes = directory.subscribe();
        assert!(directory.adopt(grown.clone()).unwrap());
        assert!(changes.has_changed().unwrap());
        // An older or equal epoch is not taken.
        assert!(!directory.adopt(first.as_ref().clone()).unwrap());
        assert!(!directory.adopt(grown.clone()).unwrap());
        // A restart with the same configuration keeps the grown list.
        let reopened = Directory::load_or_create(&config(dir.path())).unwrap();
        assert_eq!(*reopened.current(), grown);
    }

    #[test]
    fn a_damaged_file_stops_the_start() {
        let dir = tempfile::tempdir().unwrap();
        Directory::load_or_create(&config(dir.path())).unwrap();
        let path = dir.path().join(FILE);
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 6;
        bytes[last] ^= 1;
        fs::write(&path, bytes).unwrap();
        let error = Directory::load_or_create(&config(dir.path())).err().unwrap();
        assert!(format!("{error:#}").contains("checksum"), "{error:#}");
    }

    #[test]
    fn system_keys_are_told_apart() {
        assert!(is_system_key(MEMBERS_KEY));
        assert!(!is_system_key(b"\xffonekv"));
        assert!(!is_system_key(b"user/key"));
    }
}
