//! `onekv shard move`: moves one replica of a shard from one node to another while the cluster
//! serves, through the shard's own membership changes.
//!
//! Each round reads every node's status, takes the shard's members from its leader, and does the
//! one next step that brings the shard closer to "TO votes, FROM is not a member and holds no
//! replica": create TO's replica (empty, waiting); add it as a learner; wait until it has caught
//! up (by the log or a snapshot); move the leadership off FROM if FROM leads; promote TO and
//! remove FROM in one joint step; remove FROM's replica. Every step is idempotent and decided from
//! the cluster's state, never from what this command did before, so an interrupted move is
//! finished by running the same command again.
//!
//! Owns: the command line of `shard` and the order of the steps. Does not own: the checks that
//! make each step safe (the shard's leader refuses a step that is not: `onekv-replica`'s
//! `membership`) or talking to nodes (`onekv_client`).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::time::{Duration, Instant};

use onekv_client::{Client, ClientOptions, ClusterSecret, StatusResponse};

use crate::client_cmd::{Connection, SecretArg, connect};

/// The `shard` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ShardCommand {
    /// Moves SHARD's replica on node FROM to node TO (which must not hold one of its voters): TO
    /// joins as a learner, catches up, is promoted while FROM is removed (leadership moves off
    /// FROM first), then FROM's replica is deleted. Writes go on meanwhile. Safe to re-run: an
    /// interrupted move continues where it stopped.
    Move(MoveArgs),
}

/// Arguments of `shard move`.
#[derive(Debug, clap::Args)]
pub struct MoveArgs {
    /// The shard (`status --shards` lists them).
    shard: u64,
    /// The node whose replica leaves.
    from: u64,
    /// The node that gets the replica (a member of the cluster, running).
    to: u64,
    /// Give up after this many seconds (a move copies the shard's data to TO).
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    #[command(flatten)]
    secret: SecretArg,
    #[command(flatten)]
    connection: Connection,
}

/// How far a learner may trail the leader's commit index to be promoted: half the leader's own
/// bound (`onekv_replica::MAX_PROMOTION_LAG`), since writes go on while the promotion travels.
const PROMOTE_WITHIN: u64 = 512;
/// Pause between rounds.
const ROUND: Duration = Duration::from_millis(200);

/// Runs one `shard` subcommand.
pub fn run(command: ShardCommand) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match command {
        ShardCommand::Move(args) => runtime.block_on(move_command(&args, &mut io::stdout().lock())),
    }
}

/// The shard as one round saw it.
struct View {
    /// The leader's node and its replica's members.
    leader: Option<(u64, onekv_client::ShardStatus)>,
    /// Each node's replica of the shard, if it hosts one.
    replicas: BTreeMap<u64, onekv_client::ShardStatus>,
    /// Every member node's address, as the nodes report them.
    addresses: BTreeMap<u64, String>,
    /// The nodes that answered.
    answered: std::collections::BTreeSet<u64>,
}

fn view(shard: u64, statuses: &[(String, onekv_client::Result<StatusResponse>)]) -> View {
    let mut replicas = BTreeMap::new();
    let mut addresses = BTreeMap::new();
    let mut answered = std::collections::BTreeSet::new();
    for status in statuses.iter().filter_map(|(_, status)| status.as_ref().ok()) {
        answered.insert(status.node_id);
        for member in &status.members {
            addresses.insert(member.id, member.address.clone());
        }
        if let Some(replica) = status.shards.iter().find(|replica| replica.shard == shard) {
            replicas.insert(status.node_id, replica.clone());
        }
    }
    let leader = replicas
        .iter()
        .filter(|(_, replica)| replica.role == "leader")
        .max_by_key(|(_, replica)| replica.term)
        .map(|(node, replica)| (*node, replica.clone()));
    View { leader, replicas, addresses, answered }
}

/// The newest member list the nodes `client` knows report: its epoch and the members' addresses by
/// node id (empty if none answered).
pub(crate) async fn member_list(client: &Client) -> (u64, BTreeMap<u64, String>) {
    crate::client_cmd::newest_members(&client.status_all().await)
}

/// A client of every member of the cluster (the nodes `connection` reaches report the members'
/// addresses: the newest list any of them knows) that sends `secret` with administrative calls,
/// and those addresses by node id.
pub(crate) async fn connect_all(
    connection: &Connection,
    secret: &ClusterSecret,
) -> anyhow::Result<(Client, BTreeMap<u64, String>)> {
    let first = connect(connection)?;
    let (_, addresses) = member_list(&first).await;
    anyhow::ensure!(!addresses.is_empty(), "no node answered; is the cluster running?");
    let options = ClientOptions { cluster_secret: Some(secret.clone()), ..ClientOptions::default() };
    let client = Client::new(addresses.values().cloned().collect(), options)?;
    Ok((client, addresses))
}

async fn move_command(args: &MoveArgs, out: &mut impl Write) -> anyhow::Result<()> {
    anyhow::ensure!(args.from != args.to, "FROM and TO are the same node ({})", args.from);
    let (client, addresses) = connect_all(&args.connection, &args.secret.load()?).await?;
    for node in [args.from, args.to] {
        anyhow::ensure!(addresses.contains_key(&node), "node {node} is not a member of the cluster");
    }
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    move_replica(&client, (args.shard, args.from, args.to), deadline, out).await
}

/// Moves `shard`'s replica on node `from` to node `to` (see the module documentation), giving up
/// at `deadline`; prints each step on `out`.
pub(crate) async fn move_replica(
    client: &Client,
    (shard, from, to): (u64, u64, u64),
    deadline: Instant,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut last_report = String::new();
    let mut report = |out: &mut dyn Write, line: String| -> io::Result<()> {
        if line != last_report {
            writeln!(out, "[{:>5.1}s] {line}", started.elapsed().as_secs_f64())?;
            last_report = line;
        }
        Ok(())
    };
    loop {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the move of shard {shard} from node {from} to node {to} did not finish in time ({last_report}); \
             run the command again to continue it"
        );
        let view = view(shard, &client.status_all().await);
        let address = |node: u64| view.addresses.get(&node).cloned().unwrap_or_default();
        let Some((leader, members)) = view.leader.clone() else {
            report(out, format!("waiting for shard {shard} to have a leader"))?;
            tokio::time::sleep(ROUND).await;
            continue;
        };
        let is_member = |node: u64| members.voters.contains(&node) || members.learners.contains(&node);
        anyhow::ensure!(
            members.voters != [from],
            "node {from} is shard {shard}'s only voter: a shard of one replica cannot move this way (the \
             leader cannot remove itself); give it more replicas first"
        );
        anyhow::ensure!(
            is_member(from) || members.voters.contains(&to),
            "node {from} holds no replica of shard {shard} (voters {:?}, learners {:?})",
            members.voters,
            members.learners
        );
        let step = if !members.outgoing_voters.is_empty() {
            report(out, "waiting for the shard to leave its joint configuration".into())?;
            Ok(())
        } else if members.voters.contains(&to) && !is_member(from) {
            if view.replicas.contains_key(&from) {
                // The status read above may come from a leader deposed since; the leader confirms
                // with a quorum that FROM is no longer a member before FROM's copy goes.
                report(out, format!("removing node {from}'s replica of shard {shard}"))?;
                match client.members(shard).await {
                    Ok(now)
                        if [&now.voters, &now.learners, &now.outgoing_voters]
                            .iter()
                            .any(|m| m.contains(&from)) =>
                    {
                        Err(onekv_client::ClientError::Server(format!(
                            "node {from} is a member of shard {shard} again"
                        )))
                    }
                    Ok(_) => client.remove_replica(&address(from), shard).await.map(drop),
                    Err(error) => Err(error),
                }
            } else {
                let voters: Vec<String> = members.voters.iter().map(u64::to_string).collect();
                writeln!(
                    out,
                    "moved shard {shard} from node {from} to node {to} in {:.1} s; voters now {}",
                    started.elapsed().as_secs_f64(),
                    voters.join(", ")
                )?;
                if !view.answered.contains(&from) {
                    writeln!(
                        out,
                        "node {from} did not answer: once it is up, run this again to delete its replica \
                         (it takes no part in the shard meanwhile)"
                    )?;
                }
                return Ok(());
            }
        } else if !view.replicas.contains_key(&to) {
            report(out, format!("creating a replica of shard {shard} on node {to}"))?;
            client.add_replica(&address(to), shard).await.map(drop)
        } else if !is_member(to) {
            report(out, format!("adding node {to} to shard {shard} as a learner"))?;
            client.change_members(shard, vec![to], Vec::new(), Vec::new()).await.map(drop)
        } else if members.learners.contains(&to) {
            let applied = view.replicas.get(&to).map_or(0, |replica| replica.applied_index);
            let behind = members.commit_index.saturating_sub(applied);
            if behind > PROMOTE_WITHIN {
                report(out, format!("node {to} is catching up: {behind} entries behind leader {leader}"))?;
                Ok(())
            } else if leader == from {
                // The other voter that answered with the most applied (one that is down or behind
                // would not take the lead), else any other voter.
                let answering = members.voters.iter().filter(|&&voter| voter != from).filter_map(|voter| {
                    view.replicas.get(voter).map(|replica| (replica.applied_index, *voter))
                });
                let successor = answering
                    .max()
                    .map(|(_, voter)| voter)
                    .or_else(|| members.voters.iter().copied().find(|&voter| voter != from))
                    .expect("checked above: another voter exists");
                report(
                    out,
                    format!("moving shard {shard}'s leadership from node {from} to node {successor}"),
                )?;
                client.transfer_leadership(shard, successor).await
            } else {
                report(out, format!("promoting node {to} and removing node {from} (one joint step)"))?;
                client.change_members(shard, Vec::new(), vec![to], vec![from]).await.map(drop)
            }
        } else {
            // TO votes and FROM is still a member: this move never leads here (it promotes TO and
            // removes FROM in one step), so something else changed the shard; removing FROM now
            // would leave it a replica short.
            anyhow::bail!(
                "node {to} already holds a voting replica of shard {shard} and node {from} is still a member \
                 (voters {:?}, learners {:?}): moving FROM's replica there would leave the shard a replica \
                 short; choose a TO that holds none",
                members.voters,
                members.learners
            );
        };
        if let Err(error) = step {
            // A step the leader refused for now (one pending, leadership moving, a learner that
            // fell behind again) or a node that did not answer: the next round decides again.
            report(out, format!("step not taken yet: {error}"))?;
        }
        out.flush()?;
        tokio::time::sleep(ROUND).await;
    }
}
