//! `onekv node add|remove|replace|drain|fill`: nodes joining and leaving the cluster's member list,
//! and replicas moved off one node or onto one, a shard at a time, with `shard move`'s steps.
//!
//! Each move is chosen from the cluster's state as the nodes report it now (every shard's members
//! as its leader knows them, every node's replicas), so an interrupted command is finished by
//! running it again. One move at a time: the rate is bounded by one shard's copy.
//!
//! A node joins in two steps: the member list gains it (a compare-and-swap the cluster agrees on,
//! `Kv.SetMembers`), and once every member has adopted that list, replicas move onto it. A node
//! leaves the other way round: replicas move off it, then the list loses it.
//!
//! Owns: the choice of which shard goes where, and the order of those steps. Does not own: the
//! steps of a move (`shard_cmd`) or how the member list is agreed and spread (`onekv-server`'s
//! `members`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::time::{Duration, Instant};

use onekv_client::{Client, ClientOptions, ClusterSecret, Member};

use crate::client_cmd::{Connection, SecretArg};
use crate::shard_cmd::{connect_all, member_list, move_replica};

/// The `node` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum NodeCommand {
    /// Adds the node at ADDR (started with `--join`, or `onekv cluster start --spare`) to the
    /// cluster's member list, then moves replicas onto it until it holds its share. Safe to re-run.
    Add(AddArgs),
    /// Moves every replica off node ID (as `drain`; it may be down), then removes it from the
    /// member list; refused when fewer nodes than the replication factor would remain. Stop the
    /// node afterwards. Safe to re-run.
    Remove(RemoveArgs),
    /// Replaces node ID (lost, or to be retired) by the node at ADDR (started with `--join`): adds
    /// ADDR to the member list, moves each of ID's replicas straight to it, then removes ID.
    /// Safe to re-run.
    Replace(ReplaceArgs),
    /// Moves every replica off node ID (each to the node that holds the fewest replicas among
    /// those without one of its shard), so the node can be stopped; refused when a shard has a
    /// replica on every other node (it would be left a replica short). Safe to re-run.
    Drain(NodeArgs),
    /// Moves replicas onto node ID (from the nodes that hold the most) until it holds its share,
    /// e.g. a node that was drained or holds none, then leaderships until it leads its share of
    /// the shards it votes in. Safe to re-run.
    Fill(NodeArgs),
}

/// Arguments of `node drain` and `node fill`.
#[derive(Debug, clap::Args)]
pub struct NodeArgs {
    /// The node.
    id: u64,
    #[command(flatten)]
    secret: SecretArg,
    #[command(flatten)]
    reach: Reach,
}

/// How long a `node` command may take, and how it reaches the cluster.
#[derive(Debug, clap::Args)]
pub struct Reach {
    /// Give up after this many seconds (each move copies a shard).
    #[arg(long, default_value_t = 3600)]
    timeout_secs: u64,
    #[command(flatten)]
    connection: Connection,
}

impl Reach {
    /// When the command gives up, counted from now.
    fn deadline(&self) -> Instant {
        Instant::now() + Duration::from_secs(self.timeout_secs)
    }
}

/// Arguments of `node add`.
#[derive(Debug, clap::Args)]
pub struct AddArgs {
    /// The new node's address (`host:port`), as the other nodes and clients will reach it.
    address: String,
    #[command(flatten)]
    secret: SecretArg,
    #[command(flatten)]
    reach: Reach,
}

/// Arguments of `node remove`.
#[derive(Debug, clap::Args)]
pub struct RemoveArgs {
    /// The node.
    id: u64,
    #[command(flatten)]
    secret: SecretArg,
    #[command(flatten)]
    reach: Reach,
}

/// Arguments of `node replace`.
#[derive(Debug, clap::Args)]
pub struct ReplaceArgs {
    /// The node to replace.
    id: u64,
    /// The replacement's address (`host:port`); it was started with `--join` and another id.
    address: String,
    #[command(flatten)]
    secret: SecretArg,
    #[command(flatten)]
    reach: Reach,
}

/// Runs one `node` subcommand.
pub fn run(command: NodeCommand) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut out = io::stdout().lock();
    match command {
        NodeCommand::Add(args) => runtime.block_on(add(&args, &mut out)),
        NodeCommand::Remove(args) => runtime.block_on(remove(&args, &mut out)),
        NodeCommand::Replace(args) => runtime.block_on(replace(&args, &mut out)),
        NodeCommand::Drain(args) => runtime.block_on(async {
            let (client, node, deadline) = start(&args).await?;
            drain(&client, node, deadline, &mut out).await
        }),
        NodeCommand::Fill(args) => runtime.block_on(async {
            let (client, node, deadline) = start(&args).await?;
            fill(&client, node, deadline, &mut out).await
        }),
    }
}

/// Where every shard's replicas are now.
#[derive(Debug, Default)]
struct Placement {
    /// Every shard's voters and learners, as its leader knows them (shards without a known
    /// leader are missing).
    members: BTreeMap<u64, BTreeSet<u64>>,
    /// Every shard's voters, as its leader knows them.
    voters: BTreeMap<u64, BTreeSet<u64>>,
    /// The nodes that answered, with the shards they host a replica of.
    hosted: BTreeMap<u64, BTreeSet<u64>>,
    /// Shards whose leader is not known, or that are between two configurations.
    unsettled: BTreeSet<u64>,
    /// Every shard's leader (of the highest term among the nodes that answered).
    leaders: BTreeMap<u64, u64>,
    /// The cluster's shard count, as the nodes that answered report it.
    shards: u64,
}

impl Placement {
    async fn read(client: &Client) -> Placement {
        let mut placement = Placement::default();
        let mut leaders: BTreeMap<u64, (u64, u64, onekv_client::ShardStatus)> = BTreeMap::new();
        for status in client.status_all().await.into_iter().filter_map(|(_, status)| status.ok()) {
            placement.shards = placement.shards.max(u64::from(status.shard_count));
            let hosted = placement.hosted.entry(status.node_id).or_default();
            for replica in status.shards {
                hosted.insert(replica.shard);
                placement.unsettled.insert(replica.shard);
                if replica.role == "leader"
                    && leaders.get(&replica.shard).is_none_or(|(term, _, _)| *term < replica.term)
                {
                    leaders.insert(replica.shard, (replica.term, status.node_id, replica));
                }
            }
        }
        for (shard, (_, node, leader)) in leaders {
            placement.leaders.insert(shard, node);
            if leader.outgoing_voters.is_empty() {
                placement.unsettled.remove(&shard);
            }
            placement.members.insert(shard, leader.voters.iter().chain(&leader.learners).copied().collect());
            placement.voters.insert(shard, leader.voters.iter().copied().collect());
        }
        placement
    }

    /// Whether every shard's members are known (a leader answered) and none is between two
    /// configurations: only then does a shard missing from `members` mean what it says.
    fn settled(&self) -> bool {
        self.unsettled.is_empty() && self.shards > 0 && self.members.len() as u64 == self.shards
    }

    /// Prints which shards the command waits for (no known leader, or between configurations),
    /// when that changed since `last`.
    fn report_waiting(&self, last: &mut String, out: &mut impl Write) -> io::Result<()> {
        let unknown: Vec<u64> = (1..=self.shards).filter(|shard| !self.members.contains_key(shard)).collect();
        let line = format!(
            "waiting for shards {unknown:?} to have a known leader and {:?} to leave their joint \
             configuration",
            self.unsettled
        );
        if line != *last {
            writeln!(out, "{line}")?;
            *last = line;
        }
        Ok(())
    }

    /// Replicas each answering node is a member with.
    fn load(&self) -> BTreeMap<u64, usize> {
        let mut load: BTreeMap<u64, usize> = self.hosted.keys().map(|node| (*node, 0)).collect();
        for members in self.members.values() {
            for node in members {
                if let Some(count) = load.get_mut(node) {
                    *count += 1;
                }
            }
        }
        load
    }
}

/// A client of every member, the node, and when to give up.
async fn start(args: &NodeArgs) -> anyhow::Result<(Client, u64, Instant)> {
    let (client, addresses) = connect_all(&args.reach.connection, &args.secret.load()?).await?;
    anyhow::ensure!(addresses.contains_key(&args.id), "node {} is not a member of the cluster", args.id);
    Ok((client, args.id, args.reach.deadline()))
}

/// Moves every replica off `node` (see `NodeCommand::Drain`).
async fn drain(client: &Client, node: u64, deadline: Instant, out: &mut impl Write) -> anyhow::Result<()> {
    let mut moved = 0;
    let mut waiting = String::new();
    loop {
        anyhow::ensure!(
            Instant::now() < deadline,
            "node {node} was not drained in time; run the command again"
        );
        let placement = Placement::read(client).await;
        let shard =
            placement.members.iter().find(|(_, members)| members.contains(&node)).map(|(shard, _)| *shard);
        let Some(shard) = shard else {
            // A replica its shard no longer counts (a move cut short after its membership step):
            // finishing that move deletes it.
            let left = placement.hosted.get(&node).into_iter().flatten().find_map(|shard| {
                let voter = placement.voters.get(shard)?.iter().copied().find(|&voter| voter != node)?;
                Some((*shard, voter))
            });
            if let Some((shard, voter)) = left {
                move_replica(client, (shard, node, voter), deadline, out).await?;
                continue;
            }
            if placement.settled() && placement.hosted.get(&node).is_some_and(BTreeSet::is_empty) {
                writeln!(out, "node {node} holds no replica ({moved} moved); it can be stopped")?;
                return Ok(());
            }
            if placement.settled() && !placement.hosted.contains_key(&node) {
                writeln!(
                    out,
                    "no shard counts node {node} ({moved} moved); it did not answer, so any copies it still \
                     has are left on its disk"
                )?;
                return Ok(());
            }
            // A shard without a known leader (an election) or between configurations, or the node
            // did not answer (its replicas are unknown): decide again in a moment.
            placement.report_waiting(&mut waiting, out)?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        let members = &placement.members[&shard];
        let load = placement.load();
        let target = load
            .iter()
            .filter(|(candidate, _)| !members.contains(candidate) && **candidate != node)
            .min_by_key(|(candidate, count)| (**count, **candidate))
            .map(|(candidate, _)| *candidate);
        let Some(target) = target else {
            anyhow::bail!(
                "shard {shard} has a replica on every other node that answered ({:?}): moving node {node}'s \
                 away would leave it a replica short; start another node (or bring one back) first",
                members
            );
        };
        writeln!(out, "moving shard {shard} from node {node} to node {target}")?;
        move_replica(client, (shard, node, target), deadline, out).await?;
        moved += 1;
    }
}

/// Moves replicas, then leaderships, onto `node` (see `NodeCommand::Fill`).
async fn fill(client: &Client, node: u64, deadline: Instant, out: &mut impl Write) -> anyhow::Result<()> {
    let mut moved = 0;
    loop {
        anyhow::ensure!(
            Instant::now() < deadline,
            "node {node} was not filled in time; run the command again"
        );
        let placement = Placement::read(client).await;
        let load = placement.load();
        anyhow::ensure!(load.contains_key(&node), "node {node} did not answer; start it first");
        let total: usize = load.values().sum();
        let share = total / load.len();
        let mine = load[&node];
        // The most loaded node with a shard this node lacks, if it holds more than one more.
        let donor = load
            .iter()
            .filter(|(donor, count)| **donor != node && **count > mine + 1)
            .max_by_key(|(donor, count)| (**count, std::cmp::Reverse(**donor)))
            .and_then(|(donor, _)| {
                // A shard the donor votes in (moving a learner's replica would add a voter).
                let shard = placement
                    .members
                    .iter()
                    .find(|(shard, members)| {
                        placement.voters.get(shard).is_some_and(|voters| voters.contains(donor))
                            && !members.contains(&node)
                            && !placement.unsettled.contains(shard)
                    })
                    .map(|(shard, _)| *shard)?;
                Some((*donor, shard))
            });
        if mine < share && donor.is_none() && !placement.unsettled.is_empty() {
            // A shard without a known leader or between configurations may be the one to move.
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        let Some((donor, shard)) = donor.filter(|_| mine < share) else {
            writeln!(
                out,
                "node {node} holds {mine} replicas, its share of {total} on {} nodes ({moved} moved)",
                load.len()
            )?;
            return lead_share(client, node, deadline, out).await;
        };
        writeln!(
            out,
            "moving shard {shard} from node {donor} to node {node} ({mine} of its share of {share})"
        )?;
        move_replica(client, (shard, donor, node), deadline, out).await?;
        moved += 1;
    }
}

/// Moves leaderships to `node` (of shards it votes in, from the nodes that lead the most) until it
/// leads its share of the shards: a filled node would otherwise lead none, as leadership follows
/// the first placement's primaries. Each moved leadership stays until its new leader restarts
/// (`onekv lead`). A hand-off that does not happen in time is reported, not retried.
async fn lead_share(
    client: &Client,
    node: u64,
    deadline: Instant,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut moved = 0;
    loop {
        let placement = Placement::read(client).await;
        let mut led: BTreeMap<u64, usize> = placement.hosted.keys().map(|n| (*n, 0)).collect();
        for leader in placement.leaders.values() {
            *led.entry(*leader).or_default() += 1;
        }
        let mine = led.get(&node).copied().unwrap_or(0);
        let share = placement.leaders.len() / led.len().max(1);
        let shard = (mine < share)
            .then(|| {
                placement
                    .leaders
                    .iter()
                    .filter(|(shard, leader)| {
                        **leader != node
                            && led[*leader] > mine + 1
                            && placement.voters.get(*shard).is_some_and(|voters| voters.contains(&node))
                    })
                    .max_by_key(|(shard, leader)| (led[*leader], std::cmp::Reverse(**shard)))
                    .map(|(shard, _)| *shard)
            })
            .flatten();
        let Some(shard) = shard else {
            writeln!(out, "node {node} leads {mine} shard(s) ({moved} leadership(s) moved to it)")?;
            return Ok(());
        };
        writeln!(out, "moving the leadership of shard {shard} to node {node}")?;
        client.transfer_leadership(shard, node).await?;
        let until = (Instant::now() + Duration::from_secs(10)).min(deadline);
        loop {
            if Placement::read(client).await.leaders.get(&shard) == Some(&node) {
                moved += 1;
                break;
            }
            if Instant::now() >= until {
                writeln!(
                    out,
                    "node {node} did not take the lead of shard {shard}; leaving leaderships as they are"
                )?;
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Adds the node at `args.address` to the member list, then fills it.
async fn add(args: &AddArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let deadline = args.reach.deadline();
    let secret = args.secret.load()?;
    let node = admit(&args.reach.connection, &args.address, &secret, deadline, out).await?;
    let (client, _) = connect_all(&args.reach.connection, &secret).await?;
    fill(&client, node, deadline, out).await
}

/// Moves node `args.id`'s replicas off it, then removes it from the member list.
async fn remove(args: &RemoveArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let secret = args.secret.load()?;
    let (client, addresses) = connect_all(&args.reach.connection, &secret).await?;
    let node = args.id;
    let deadline = args.reach.deadline();
    if !addresses.contains_key(&node) {
        writeln!(out, "node {node} is not a member of the cluster (nothing to do)")?;
        return Ok(());
    }
    let replicas = replication_factor(&client).await?;
    anyhow::ensure!(
        addresses.len() > replicas,
        "removing node {node} would leave {} node(s) for shards of {replicas} replicas; add a node first",
        addresses.len() - 1
    );
    drain(&client, node, deadline, out).await?;
    leave(&client, node, deadline, out).await?;
    writeln!(out, "node {node} left the cluster; stop it")?;
    Ok(())
}

/// Adds the node at `args.address`, moves every replica of node `args.id` to it, then removes
/// node `args.id` from the member list.
async fn replace(args: &ReplaceArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let deadline = args.reach.deadline();
    let secret = args.secret.load()?;
    let (client, addresses) = connect_all(&args.reach.connection, &secret).await?;
    let old = args.id;
    let new = match addresses.iter().find(|(_, address)| **address == args.address) {
        Some((id, _)) => *id,
        None => {
            anyhow::ensure!(addresses.contains_key(&old), "node {old} is not a member of the cluster");
            admit(&args.reach.connection, &args.address, &secret, deadline, out).await?
        }
    };
    anyhow::ensure!(
        new != old,
        "node {old} is at {} already: start the replacement with another id",
        args.address
    );
    let (client, _) = if addresses.contains_key(&new) {
        (client, addresses)
    } else {
        connect_all(&args.reach.connection, &secret).await?
    };
    let mut waiting = String::new();
    loop {
        anyhow::ensure!(
            Instant::now() < deadline,
            "node {old} was not replaced in time; run the command again"
        );
        let placement = Placement::read(&client).await;
        let Some(shard) = placement
            .members
            .iter()
            .find(|(shard, members)| members.contains(&old) && !placement.unsettled.contains(shard))
            .map(|(shard, _)| *shard)
        else {
            if placement.settled() {
                break;
            }
            placement.report_waiting(&mut waiting, out)?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        if placement.members[&shard].contains(&new) {
            anyhow::bail!(
                "node {new} already holds a replica of shard {shard}, which node {old} also holds: move \
                 node {old}'s elsewhere first (onekv shard move {shard} {old} OTHER)"
            );
        }
        writeln!(out, "moving shard {shard} from node {old} to node {new}")?;
        move_replica(&client, (shard, old, new), deadline, out).await?;
    }
    if member_list(&client).await.1.contains_key(&old) {
        leave(&client, old, deadline, out).await?;
    }
    writeln!(out, "node {new} replaced node {old}; stop node {old} if it runs")?;
    Ok(())
}

/// Puts the node at `address` (asked for its id) in the member list, unless it is there already,
/// and waits until every member has adopted the list. Returns the node's id.
async fn admit(
    connection: &Connection,
    address: &str,
    secret: &ClusterSecret,
    deadline: Instant,
    out: &mut impl Write,
) -> anyhow::Result<u64> {
    let (client, _) = connect_all(connection, secret).await?;
    let newcomer = Client::new(vec![address.to_string()], ClientOptions::default())?;
    let status = newcomer.status(address).await.map_err(|error| {
        anyhow::anyhow!("the node at {address} did not answer ({error}); start it (with --join) first")
    })?;
    let node = status.node_id;
    loop {
        let (epoch, members) = member_list(&client).await;
        anyhow::ensure!(epoch > 0, "no node of the cluster answered");
        match members.get(&node) {
            Some(known) if known == address => {
                wait_adopted(&client, epoch, deadline, out).await?;
                writeln!(out, "node {node} at {address} is a member (member list epoch {epoch})")?;
                return Ok(node);
            }
            Some(known) => anyhow::bail!(
                "node {node} is already a member at {known}: the node at {address} needs another id (or remove \
                 node {node} first)"
            ),
            None => {}
        }
        if let Some((other, _)) = members.iter().find(|(_, known)| *known == address) {
            anyhow::bail!("{address} is node {other}'s address, but the node there says it is node {node}");
        }
        let ours = client.status_all().await.into_iter().find_map(|(_, status)| status.ok());
        anyhow::ensure!(
            ours.is_some_and(|ours| ours.cluster_map == status.cluster_map),
            "the node at {address} (node {node}) has another cluster map than this cluster: it joined \
             another cluster (or none); wipe its data directory and start it with --join and this \
             cluster's nodes in --members"
        );
        // A node started without `join` made a cluster of its own: its replicas would disrupt
        // the shards it is added to.
        let hosted: Vec<u64> = status.shards.iter().map(|replica| replica.shard).collect();
        anyhow::ensure!(
            hosted.is_empty(),
            "the node at {address} (node {node}) already holds replicas of shards {hosted:?}: it was not \
             started with --join (it made a cluster of its own); wipe its data directory and start it \
             with --join"
        );
        let mut list: Vec<Member> = members.into_iter().map(|(id, address)| Member { id, address }).collect();
        list.push(Member { id: node, address: address.to_string() });
        writeln!(out, "adding node {node} at {address} to the member list (epoch {epoch} -> {})", epoch + 1)?;
        set_members(&client, epoch, list, out).await?;
    }
}

/// Asks for the member list `list` in place of the list of `epoch`. A change that lost a race is
/// reported and not an error: the caller reads the list again and decides anew.
async fn set_members(
    client: &Client,
    epoch: u64,
    list: Vec<Member>,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    match client.set_members(epoch, list).await {
        Ok(_) => Ok(()),
        Err(onekv_client::ClientError::NotApplied(reason)) => Ok(writeln!(out, "not applied: {reason}")?),
        Err(error) => Err(error.into()),
    }
}

/// Removes `node` from the member list and waits until the remaining members have adopted it.
async fn leave(client: &Client, node: u64, deadline: Instant, out: &mut impl Write) -> anyhow::Result<()> {
    loop {
        let (epoch, members) = member_list(client).await;
        anyhow::ensure!(epoch > 0, "no node of the cluster answered");
        if !members.contains_key(&node) {
            return wait_adopted(client, epoch, deadline, out).await;
        }
        let list = members
            .into_iter()
            .filter(|(id, _)| *id != node)
            .map(|(id, address)| Member { id, address })
            .collect();
        writeln!(out, "removing node {node} from the member list (epoch {epoch} -> {})", epoch + 1)?;
        set_members(client, epoch, list, out).await?;
    }
}

/// Waits until every member in the list of `epoch` that answers reports that list (or a newer
/// one), printing who is behind every few seconds. A member that does not answer is named once and
/// not waited for: it reads the list when it is back.
async fn wait_adopted(
    client: &Client,
    epoch: u64,
    deadline: Instant,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let (_, members) = member_list(client).await;
    let client = Client::new(members.values().cloned().collect(), ClientOptions::default())?;
    let mut last_report = Instant::now();
    let mut silent_reported = false;
    loop {
        let statuses = client.status_all().await;
        let silent: Vec<&str> = statuses
            .iter()
            .filter(|(_, status)| status.is_err())
            .map(|(endpoint, _)| endpoint.as_str())
            .collect();
        if !silent.is_empty() && !silent_reported {
            writeln!(out, "not answering (they will read the member list when back): {}", silent.join(", "))?;
            silent_reported = true;
        }
        let behind: Vec<String> = statuses
            .iter()
            .filter_map(|(_, status)| status.as_ref().ok())
            .filter(|status| status.members_epoch < epoch)
            .map(|status| format!("node {} (epoch {})", status.node_id, status.members_epoch))
            .collect();
        if behind.is_empty() {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "not every member adopted member list epoch {epoch} in time: {}",
            behind.join(", ")
        );
        if last_report.elapsed() >= Duration::from_secs(3) {
            writeln!(
                out,
                "waiting for every member to adopt member list epoch {epoch}: {}",
                behind.join(", ")
            )?;
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The cluster's replication factor, from the cluster map a node reports.
async fn replication_factor(client: &Client) -> anyhow::Result<usize> {
    for (_, status) in client.status_all().await {
        if let Ok(status) = status
            && let Ok(map) = onekv_placement::ClusterMap::decode(&status.cluster_map)
        {
            return Ok(map.replication_factor() as usize);
        }
    }
    anyhow::bail!("no node reported the cluster map")
}
