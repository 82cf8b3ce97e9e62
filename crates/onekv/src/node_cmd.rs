//! `onekv node drain|fill`: moves replicas off one node, or onto one, a shard at a time, with
//! `shard move`'s steps.
//!
//! Each move is chosen from the cluster's state as the nodes report it now (every shard's members
//! as its leader knows them, every node's replicas), so an interrupted command is finished by
//! running it again. One move at a time: the rate is bounded by one shard's copy.
//!
//! Owns: the choice of which shard goes where. Does not own: the steps of a move (`shard_cmd`) or
//! the cluster's member list (fixed at creation: a node cannot join or leave it yet).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::time::{Duration, Instant};

use onekv_client::Client;

use crate::client_cmd::Connection;
use crate::shard_cmd::{connect_all, move_replica};

/// The `node` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum NodeCommand {
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
    /// Give up after this many seconds (each move copies a shard).
    #[arg(long, default_value_t = 3600)]
    timeout_secs: u64,
    #[command(flatten)]
    connection: Connection,
}

/// Runs one `node` subcommand.
pub fn run(command: NodeCommand) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut out = io::stdout().lock();
    match command {
        NodeCommand::Drain(args) => runtime.block_on(drain(&args, &mut out)),
        NodeCommand::Fill(args) => runtime.block_on(fill(&args, &mut out)),
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
}

impl Placement {
    async fn read(client: &Client) -> Placement {
        let mut placement = Placement::default();
        let mut leaders: BTreeMap<u64, (u64, u64, onekv_client::ShardStatus)> = BTreeMap::new();
        for status in client.status_all().await.into_iter().filter_map(|(_, status)| status.ok()) {
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
    let (client, addresses) = connect_all(&args.connection).await?;
    anyhow::ensure!(addresses.contains_key(&args.id), "node {} is not a member of the cluster", args.id);
    Ok((client, args.id, Instant::now() + Duration::from_secs(args.timeout_secs)))
}

async fn drain(args: &NodeArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let (client, node, deadline) = start(args).await?;
    let mut moved = 0;
    loop {
        anyhow::ensure!(
            Instant::now() < deadline,
            "node {node} was not drained in time; run the command again"
        );
        let placement = Placement::read(&client).await;
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
                move_replica(&client, (shard, node, voter), deadline, out).await?;
                continue;
            }
            if placement.unsettled.is_empty() && placement.hosted.get(&node).is_some_and(BTreeSet::is_empty) {
                writeln!(out, "node {node} holds no replica ({moved} moved); it can be stopped")?;
                return Ok(());
            }
            // A shard without a known leader (an election) or between configurations, or the node
            // did not answer (its replicas are unknown): decide again in a moment.
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
        move_replica(&client, (shard, node, target), deadline, out).await?;
        moved += 1;
    }
}

async fn fill(args: &NodeArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let (client, node, deadline) = start(args).await?;
    let mut moved = 0;
    loop {
        anyhow::ensure!(
            Instant::now() < deadline,
            "node {node} was not filled in time; run the command again"
        );
        let placement = Placement::read(&client).await;
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
            return lead_share(&client, node, deadline, out).await;
        };
        writeln!(
            out,
            "moving shard {shard} from node {donor} to node {node} ({mine} of its share of {share})"
        )?;
        move_replica(&client, (shard, donor, node), deadline, out).await?;
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
