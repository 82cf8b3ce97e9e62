//! Data and admin subcommands (`put`, `get`, `delete`, `scan`, `cas`, `status`) over the client library.
//!
//! Owns: parsing these subcommands, turning their UTF-8 arguments into bytes, printing results and
//! choosing exit codes. Does not own: talking to the cluster (leader discovery, retries and request ids
//! are `onekv_client`'s).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::PathBuf;

use anyhow::Context as _;
use onekv_client::{Client, ClientOptions, ClusterSecret, Expiry, StatusResponse};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What `--endpoints` is when neither the flag nor the environment variable gives it: the addresses
/// `onekv cluster start` uses.
const DEFAULT_ENDPOINTS: &str = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003";
/// The environment variable read when `--endpoints` is absent.
const ENDPOINTS_ENV: &str = "ONEKV_ENDPOINTS";

/// The client subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ClientCommand {
    /// Sets KEY to VALUE (with --ttl-ms, a key that expires).
    Put(PutArgs),
    /// Prints the value of KEY; prints "(not found)" to stderr and exits 1 if it is absent. With
    /// --show-expiry, prints when the key expires on a second line.
    Get(GetArgs),
    /// Deletes KEY (deleting an absent key succeeds).
    Delete(DeleteArgs),
    /// Prints `key<TAB>value` lines of a key range, then "(more)" if the range holds more.
    Scan(ScanArgs),
    /// Deletes every key of a range, in every shard, a page (one Raft entry) at a time, and prints
    /// how many it deleted. Not atomic; safe to re-run. Every key: --all.
    DeleteRange(DeleteRangeArgs),
    /// Compare-and-swap: changes KEY only if it holds the expected value; exits 1 if it did not.
    Cas(CasArgs),
    /// Prints one table row per node: its role, leader, Raft indexes and storage counters.
    Status(StatusArgs),
    /// Moves the leadership of SHARD to NODE (a voter of it) and waits until NODE leads it; NODE
    /// then stays the shard's preferred leader until it restarts. Safe to re-run.
    Lead(LeadArgs),
}

/// Arguments of `lead`.
#[derive(Debug, clap::Args)]
pub struct LeadArgs {
    /// The shard (`status --shards` lists them).
    shard: u64,
    /// The node id to hand its leadership to.
    node: u64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,
    #[command(flatten)]
    secret: SecretArg,
    #[command(flatten)]
    connection: Connection,
}

/// Where the cluster is.
#[derive(Debug, clap::Args)]
pub struct Connection {
    /// Comma-separated `host:port` addresses of the cluster's nodes [env: ONEKV_ENDPOINTS]
    /// [default: 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003]
    #[arg(long, value_name = "HOST:PORT,...")]
    endpoints: Option<String>,
}

/// Where the cluster secret is: the commands that move leadership or replicas, or change the
/// member list, must send it.
#[derive(Debug, clap::Args)]
pub struct SecretArg {
    /// The cluster secret file (the nodes' peer_secret_file), which moving leaderships and
    /// replicas and changing the member list need [env: ONEKV_PEER_SECRET_FILE] [default:
    /// ./onekv-data/cluster.secret, where `onekv cluster start` keeps it].
    #[arg(long, value_name = "FILE")]
    peer_secret_file: Option<PathBuf>,
}

impl SecretArg {
    /// The secret, from the flag's file, the environment's or the local cluster's.
    pub(crate) fn load(&self) -> anyhow::Result<ClusterSecret> {
        let path = self
            .peer_secret_file
            .clone()
            .or_else(|| std::env::var_os("ONEKV_PEER_SECRET_FILE").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("onekv-data/cluster.secret"));
        let secret = onekv_server::PeerSecret::load(&path).with_context(|| {
            format!(
                "this command needs the cluster secret: give --peer-secret-file (the nodes' \
                 peer_secret_file; `onekv cluster start` keeps it in DIR/cluster.secret); tried {}",
                path.display()
            )
        })?;
        Ok(ClusterSecret::new(secret.metadata_value().to_str().unwrap_or_default())?)
    }
}

/// How to print keys and values.
#[derive(Debug, clap::Args)]
pub struct Output {
    /// Print keys and values as lowercase hex instead of (lossy) UTF-8.
    #[arg(long)]
    hex: bool,
}

/// Arguments of `put`.
#[derive(Debug, clap::Args)]
pub struct PutArgs {
    /// The key (UTF-8).
    key: String,
    /// The value (UTF-8).
    value: String,
    /// The key expires this many milliseconds after the shard's leader receives the write (at
    /// least 1); it then reads as absent everywhere and is deleted in the background. Without it
    /// the key never expires (any expiry it had is dropped).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    ttl_ms: Option<u64>,
    #[command(flatten)]
    connection: Connection,
}

/// Arguments of `get`.
#[derive(Debug, clap::Args)]
pub struct GetArgs {
    /// The key (UTF-8).
    key: String,
    /// Read from any node what it has applied (may be stale) instead of from the leader.
    #[arg(long)]
    stale: bool,
    /// Ask only this node (`host:port`); implies --stale.
    #[arg(long, value_name = "HOST:PORT")]
    endpoint: Option<String>,
    /// Also print when the key expires: `expires at <Unix ms> (in <ms> ms)`, or `no expiry`.
    #[arg(long)]
    show_expiry: bool,
    #[command(flatten)]
    output: Output,
    #[command(flatten)]
    connection: Connection,
}

/// Arguments of `delete`.
#[derive(Debug, clap::Args)]
pub struct DeleteArgs {
    /// The key (UTF-8).
    key: String,
    #[command(flatten)]
    connection: Connection,
}

/// Arguments of `scan`.
#[derive(Debug, clap::Args)]
pub struct ScanArgs {
    /// First key of the range, inclusive [default: the first key].
    #[arg(long)]
    start: Option<String>,
    /// End of the range, exclusive [default: no end].
    #[arg(long)]
    end: Option<String>,
    /// At most this many pairs; 0 means the node's maximum.
    #[arg(long, default_value_t = 0)]
    limit: u32,
    /// Newest key first: from the last key below --end down to --start.
    #[arg(long)]
    reverse: bool,
    #[command(flatten)]
    output: Output,
    #[command(flatten)]
    connection: Connection,
}

/// Arguments of `delete-range`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("range").required(true).multiple(true).args(["start", "end", "all"])))]
pub struct DeleteRangeArgs {
    /// First key of the range, inclusive [default: the first key].
    #[arg(long)]
    start: Option<String>,
    /// End of the range, exclusive [default: no end].
    #[arg(long)]
    end: Option<String>,
    /// Delete every key (onekv's own keys excepted): needed when neither --start nor --end is given.
    #[arg(long, conflicts_with_all = ["start", "end"])]
    all: bool,
    #[command(flatten)]
    connection: Connection,
}

/// Arguments of `cas`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("expectation").required(true).args(["expected", "expect_absent"])))]
#[command(group(clap::ArgGroup::new("replacement").required(true).args(["new", "delete"])))]
pub struct CasArgs {
    /// The key (UTF-8).
    key: String,
    /// Swap only if the key holds this value.
    #[arg(long, value_name = "V")]
    expected: Option<String>,
    /// Swap only if the key is absent.
    #[arg(long)]
    expect_absent: bool,
    /// The value to set.
    #[arg(long, value_name = "V")]
    new: Option<String>,
    /// Delete the key instead of setting a value.
    #[arg(long)]
    delete: bool,
    #[command(flatten)]
    output: Output,
    #[command(flatten)]
    connection: Connection,
}

/// Arguments of `status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Also list every shard replica: its node, role, leader, term, commit, applied and flushed
    /// index, and what the last start replayed into it.
    #[arg(long)]
    shards: bool,
    #[command(flatten)]
    connection: Connection,
}

/// Runs one client subcommand.
pub fn run(command: ClientCommand) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let outcome = runtime.block_on(execute(command))?;
    if outcome == Outcome::NegativeAnswer {
        // A negative answer ("not found", "not swapped") rather than a failure: main's error path
        // would print a misleading "Error:" line, so exit directly once everything is flushed.
        io::stdout().flush().ok();
        drop(runtime);
        std::process::exit(1);
    }
    Ok(())
}

/// How a subcommand that did not fail ended.
/// `get --show-expiry`'s second line.
fn describe_expiry(expiry: Option<u64>) -> String {
    let Some(at) = expiry else { return "no expiry".to_owned() };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    format!("expires at {at} (in {} ms)", at.saturating_sub(now))
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Done,
    /// "Not found" or "not swapped": exit code 1 without an error message.
    NegativeAnswer,
}

async fn execute(command: ClientCommand) -> anyhow::Result<Outcome> {
    let mut out = io::stdout().lock();
    match command {
        ClientCommand::Put(args) => {
            let expiry = args.ttl_ms.map_or(Expiry::Never, |ms| Expiry::After(Duration::from_millis(ms)));
            let client = connect(&args.connection)?;
            let index = client.put_with_expiry(args.key.as_bytes(), args.value.as_bytes(), expiry).await?;
            writeln!(out, "OK (index {index})")?;
        }
        ClientCommand::Get(args) => {
            let client = connect(&args.connection)?;
            let key = args.key.as_bytes();
            let found = match (&args.endpoint, args.stale) {
                (Some(endpoint), _) => client.get_stale_with_expiry(key, Some(endpoint)).await?,
                (None, true) => client.get_stale_with_expiry(key, None).await?,
                (None, false) => client.get_with_expiry(key).await?,
            };
            match found {
                Some((value, expiry)) => {
                    writeln!(out, "{}", show(&value, args.output.hex))?;
                    if args.show_expiry {
                        writeln!(out, "{}", describe_expiry(expiry))?;
                    }
                }
                None => {
                    eprintln!("(not found)");
                    return Ok(Outcome::NegativeAnswer);
                }
            }
        }
        ClientCommand::Delete(args) => {
            let index = connect(&args.connection)?.delete(args.key.as_bytes()).await?;
            writeln!(out, "OK (index {index})")?;
        }
        ClientCommand::Scan(args) => {
            let start = args.start.as_deref().unwrap_or("").as_bytes();
            let end = args.end.as_deref().map(str::as_bytes);
            let page = connect(&args.connection)?.scan(start, end, args.limit, args.reverse).await?;
            let printed = (|| -> io::Result<()> {
                for (key, value) in &page.pairs {
                    writeln!(out, "{}\t{}", show(key, args.output.hex), show(value, args.output.hex))?;
                }
                if page.more {
                    writeln!(out, "(more)")?;
                }
                out.flush()
            })();
            // `onekv scan | head` closes the pipe early; that is not an error worth reporting.
            if let Err(error) = printed
                && error.kind() != io::ErrorKind::BrokenPipe
            {
                return Err(error.into());
            }
        }
        ClientCommand::DeleteRange(args) => {
            let start = args.start.as_deref().unwrap_or("").as_bytes();
            let end = args.end.as_deref().map(str::as_bytes);
            if end.is_some_and(|end| end < start) {
                anyhow::bail!("--start is after --end");
            }
            let deleted = connect(&args.connection)?.delete_range(start, end).await?;
            writeln!(out, "deleted {deleted} keys")?;
        }
        ClientCommand::Cas(args) => {
            let expected = args.expected.as_deref().map(str::as_bytes);
            let new = args.new.as_deref().map(str::as_bytes);
            let result = connect(&args.connection)?.cas(args.key.as_bytes(), expected, new).await?;
            if result.swapped {
                writeln!(out, "swapped (index {})", result.index)?;
            } else {
                match &result.current {
                    Some(current) => {
                        writeln!(out, "not swapped: current value {}", show(current, args.output.hex))?
                    }
                    None => writeln!(out, "not swapped: the key is absent")?,
                }
                return Ok(Outcome::NegativeAnswer);
            }
        }
        ClientCommand::Lead(args) => lead(&args, &mut out).await?,
        ClientCommand::Status(args) => {
            let mut statuses = connect(&args.connection)?.status_all().await;
            // Every member of the newest member list, also those not named by --endpoints.
            let (_, members) = newest_members(&statuses);
            let missing: Vec<String> = members
                .values()
                .filter(|address| !statuses.iter().any(|(endpoint, _)| endpoint == *address))
                .cloned()
                .collect();
            if !missing.is_empty() {
                statuses.extend(Client::new(missing, ClientOptions::default())?.status_all().await);
            }
            out.write_all(status_table(&statuses).as_bytes())?;
            if args.shards {
                out.write_all(shard_table(&statuses).as_bytes())?;
            }
            for status in statuses.iter().filter_map(|(_, result)| result.as_ref().ok()) {
                if !status.failure.is_empty() {
                    writeln!(
                        out,
                        "node {} stopped on a storage failure: {}",
                        status.node_id, status.failure
                    )?;
                }
                out.write_all(lagging_followers(status).as_bytes())?;
                if !status.disk_alarm.is_empty() {
                    writeln!(out, "node {} disk full: {}", status.node_id, status.disk_alarm)?;
                }
                out.write_all(damaged_values(status).as_bytes())?;
                if let Some(gc) = status.gc.as_ref().filter(|gc| gc.enabled) {
                    if !gc.last_error.is_empty() {
                        writeln!(
                            out,
                            "node {} log GC: its last round failed: {}",
                            status.node_id, gc.last_error
                        )?;
                    } else if !gc.waiting.is_empty() {
                        writeln!(out, "node {} log GC waits: {}", status.node_id, gc.waiting)?;
                    }
                }
                if let Some(dedup) = &status.dedup {
                    writeln!(out, "node {} {}", status.node_id, dedup_line(dedup))?;
                }
            }
            if statuses.iter().all(|(_, result)| result.is_err()) {
                anyhow::bail!("no node answered");
            }
        }
    }
    out.flush()?;
    Ok(Outcome::Done)
}

/// A client for the endpoints named by `--endpoints`, else `ONEKV_ENDPOINTS`, else the defaults.
pub(crate) fn connect(connection: &Connection) -> anyhow::Result<Client> {
    connect_to(connection.endpoints.as_deref())
}

/// As [`connect`], for a client whose administrative calls carry `secret`.
pub(crate) fn connect_admin(connection: &Connection, secret: &ClusterSecret) -> anyhow::Result<Client> {
    let options = ClientOptions { cluster_secret: Some(secret.clone()), ..ClientOptions::default() };
    connect_with(connection.endpoints.as_deref(), options)
}

/// A client for `flag` (comma-separated `host:port`s), else `ONEKV_ENDPOINTS`, else the
/// addresses `onekv cluster start` uses.
pub(crate) fn connect_to(flag: Option<&str>) -> anyhow::Result<Client> {
    connect_with(flag, ClientOptions::default())
}

/// As [`connect_to`], with `options`.
fn connect_with(flag: Option<&str>, options: ClientOptions) -> anyhow::Result<Client> {
    let from_env = std::env::var(ENDPOINTS_ENV).ok().filter(|value| !value.trim().is_empty());
    let list = flag.map(str::to_string).or(from_env).unwrap_or_else(|| DEFAULT_ENDPOINTS.to_string());
    Client::new(split_endpoints(&list), options).with_context(|| format!("bad endpoint list {list:?}"))
}

/// `a:1, b:2,` → `["a:1", "b:2"]`.
pub(crate) fn split_endpoints(list: &str) -> Vec<String> {
    list.split(',').map(str::trim).filter(|endpoint| !endpoint.is_empty()).map(String::from).collect()
}

/// Bytes as lossy UTF-8, or lowercase hex.
fn show(bytes: &[u8], hex: bool) -> String {
    if hex {
        bytes.iter().map(|byte| format!("{byte:02x}")).collect()
    } else {
        String::from_utf8_lossy(bytes).into_owned()
    }
}

/// Lines about a leader's followers that are not streaming entries (catching up, waiting for a
/// snapshot, silent), and about its snapshot builder; empty when all is well.
fn lagging_followers(status: &StatusResponse) -> String {
    let mut out = String::new();
    for follower in &status.followers {
        let behind = status.last_index.saturating_sub(follower.matched);
        if follower.state != "replicate" || !follower.active {
            let why = match (follower.state.as_str(), follower.active) {
                (_, false) => "not answering",
                ("snapshot", _) => "behind the leader's Raft log: needs a snapshot",
                _ => "catching up",
            };
            out.push_str(&format!(
                "node {} is {} entries behind leader {} ({}; state {})\n",
                follower.id, behind, status.node_id, why, follower.state
            ));
        }
    }
    if !status.snapshot.is_empty() {
        out.push_str(&format!("leader {} snapshot: {}\n", status.node_id, status.snapshot));
    }
    out
}

/// A line about the damaged values a node found (reads, snapshot builds, its scrub) and its last
/// scrub pass; empty when it found none.
fn damaged_values(status: &StatusResponse) -> String {
    if status.corrupt_values == 0 {
        return String::new();
    }
    let scrub = match &status.scrub {
        Some(scrub) if scrub.enabled && scrub.passes > 0 => format!(
            "its last scrub pass checked {} values and found {} damaged",
            scrub.last_pass_values, scrub.last_pass_corrupt
        ),
        Some(scrub) if scrub.enabled => "its first scrub pass is under way".to_string(),
        _ => "its scrub is off".to_string(),
    };
    format!(
        "node {} found {} damaged stored value(s) and repaired {} from other replicas (a key answers DATA_LOSS there until repaired; see its log for keys and positions); {scrub}\n",
        status.node_id, status.corrupt_values, status.repaired_values
    )
}

/// `status --shards`: one row per shard replica, by shard then node.
fn shard_table(statuses: &[(String, onekv_client::Result<StatusResponse>)]) -> String {
    const HEADER: [&str; 11] = [
        "SHARD", "NODE", "ROLE", "LEADER", "TERM", "COMMIT", "APPLIED", "FLUSHED", "REPLAYED", "INDEX",
        "MEMBERS",
    ];
    let mut rows: Vec<[String; 11]> = statuses
        .iter()
        .filter_map(|(_, result)| result.as_ref().ok())
        .flat_map(|status| {
            status.shards.iter().map(|replica| {
                [
                    replica.shard.to_string(),
                    status.node_id.to_string(),
                    replica.role.clone(),
                    if replica.leader_id == 0 { "-".to_string() } else { replica.leader_id.to_string() },
                    replica.term.to_string(),
                    replica.commit_index.to_string(),
                    replica.applied_index.to_string(),
                    replica.flushed_index.to_string(),
                    replica.recovery_replayed.to_string(),
                    // The tree's layout and its sorted runs on disk, e.g. `runs:5`.
                    format!("{}:{}", replica.index_layout, replica.index_sorted_runs),
                    members(replica),
                ]
            })
        })
        .collect();
    rows.sort_by_key(|row| (row[0].parse::<u64>().unwrap_or(0), row[1].parse::<u64>().unwrap_or(0)));
    let mut widths = HEADER.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let mut table = String::from("\n");
    let mut push = |cells: &[&str]| {
        let line: Vec<String> =
            cells.iter().zip(widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        table.push_str(line.join("  ").trim_end());
        table.push('\n');
    };
    push(&HEADER);
    for row in &rows {
        push(&row.each_ref().map(String::as_str));
    }
    table
}

/// A replica's view of its shard's members: the voters, then learners and the outgoing voters of a
/// joint configuration when there are any ("1,2,4 learners 5 joint with 1,2,3").
fn members(replica: &onekv_client::ShardStatus) -> String {
    let list = |ids: &[u64]| ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let mut text = if replica.voters.is_empty() { "none".to_string() } else { list(&replica.voters) };
    if !replica.learners.is_empty() {
        text.push_str(&format!(" learners {}", list(&replica.learners)));
    }
    if !replica.outgoing_voters.is_empty() {
        text.push_str(&format!(" joint with {}", list(&replica.outgoing_voters)));
    }
    text
}

/// What a node's deduplication did: its mode, and values and bytes it did not store or move again.
fn dedup_line(dedup: &onekv_client::DedupProgress) -> String {
    let inline = match dedup.mode.as_str() {
        "elastic" if dedup.inline_active => " (inline on)",
        "elastic" => " (inline off: few duplicates)",
        _ => "",
    };
    format!(
        "dedup {}{inline}: {} values shared as written, {} when moved, {} from snapshots, {} by reference, {:.1} MiB not stored again, {} fingerprints",
        dedup.mode,
        dedup.inline_hits,
        dedup.offline_hits,
        dedup.snapshot_hits,
        dedup.references_applied,
        dedup.bytes_saved as f64 / (1u64 << 20) as f64,
        dedup.entries
    )
}

/// The log's bytes over its live bytes, as the node's log GC estimates them ("-" without a
/// collector or before its first round).
fn disk_per_live(status: &StatusResponse) -> String {
    match &status.gc {
        Some(gc) if gc.enabled && gc.live_bytes > 0 => format!("{:.2}", gc.space_amp),
        _ => "-".to_string(),
    }
}

/// The role of a node: its replica's role in a cluster of one shard, else how many of the shards
/// it holds it leads.
fn node_role(status: &StatusResponse) -> String {
    if status.shards.len() <= 1 {
        return status.role.clone();
    }
    let led = status.shards.iter().filter(|replica| replica.role == "leader").count();
    format!("leads {led}/{}", status.shards.len())
}

/// `lead`: asks the shard's leader to hand over (again every few seconds: raft-rs abandons a
/// hand-off that does not finish within an election timeout) until `node` reports leading it.
async fn lead(args: &LeadArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let secret = args.secret.load()?;
    let client = connect_admin(&args.connection, &secret)?;
    let started = std::time::Instant::now();
    let deadline = started + std::time::Duration::from_secs(args.timeout_secs);
    let mut asked_at: Option<std::time::Instant> = None;
    let mut reported = std::time::Instant::now();
    loop {
        let statuses = client.status_all().await;
        let leader = statuses
            .iter()
            .filter_map(|(_, status)| status.as_ref().ok())
            .flat_map(|status| status.shards.iter().map(move |replica| (status.node_id, replica)))
            .filter(|(_, replica)| replica.shard == args.shard && replica.role == "leader")
            .max_by_key(|(_, replica)| replica.term)
            .map(|(node, _)| node);
        if leader == Some(args.node) {
            writeln!(
                out,
                "node {} leads shard {} ({} ms)",
                args.node,
                args.shard,
                started.elapsed().as_millis()
            )?;
            return Ok(());
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            anyhow::bail!(
                "node {} did not take the lead of shard {} within {} s (leader now: {}); \
                 it may be behind or down (see `status --shards`); run again to retry",
                args.node,
                args.shard,
                args.timeout_secs,
                leader.map_or("none".to_string(), |id| id.to_string())
            );
        }
        if asked_at.is_none_or(|at| now.duration_since(at) >= std::time::Duration::from_secs(3)) {
            client.transfer_leadership(args.shard, args.node).await?;
            asked_at = Some(now);
        }
        if now.duration_since(reported) >= std::time::Duration::from_secs(1) {
            let current = leader.map_or("none".to_string(), |id| id.to_string());
            writeln!(
                out,
                "waiting for node {} to lead shard {} (leader now: {current})",
                args.node, args.shard
            )?;
            reported = now;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The `status` table: a header, then one row per endpoint; an unreachable node shows its error
/// after its address. For a node of several shards, LEADER and TERM are "-" (they differ by shard:
/// `--shards` lists them) and COMMIT and APPLIED are summed over its shards.
/// The newest member list among `statuses`: its epoch and the members' addresses by node id
/// (epoch 0 and none if no node answered).
pub(crate) fn newest_members(
    statuses: &[(String, onekv_client::Result<StatusResponse>)],
) -> (u64, BTreeMap<u64, String>) {
    let mut newest = (0, BTreeMap::new());
    for status in statuses.iter().filter_map(|(_, status)| status.as_ref().ok()) {
        if status.members_epoch.max(1) > newest.0 {
            let members = status.members.iter().map(|member| (member.id, member.address.clone())).collect();
            newest = (status.members_epoch.max(1), members);
        }
    }
    newest
}

fn status_table(statuses: &[(String, onekv_client::Result<StatusResponse>)]) -> String {
    let (_, members) = newest_members(statuses);
    const HEADER: [&str; 11] = [
        "ID",
        "ADDRESS",
        "ROLE",
        "LEADER",
        "TERM",
        "COMMIT",
        "APPLIED",
        "LOG",
        "DISK/LIVE",
        "WRITTEN",
        "WRITE-AMP",
    ];
    let rows: Vec<Result<[String; 11], [String; 3]>> = statuses
        .iter()
        .map(|(endpoint, result)| match result {
            Ok(status) => Ok([
                status.node_id.to_string(),
                endpoint.clone(),
                if !status.failure.is_empty() {
                    format!("{} (FAILED)", node_role(status))
                } else if !status.disk_alarm.is_empty() {
                    format!("{} (DISK FULL)", node_role(status))
                } else if status.shards.iter().any(|replica| replica.rejoining) {
                    format!("{} (REJOINING)", node_role(status))
                } else if !members.is_empty() && !members.contains_key(&status.node_id) {
                    format!("{} (NOT A MEMBER)", node_role(status))
                } else {
                    node_role(status)
                },
                if status.leader_id == 0 || status.shards.len() > 1 {
                    "-".to_string()
                } else {
                    status.leader_id.to_string()
                },
                if status.shards.len() > 1 { "-".to_string() } else { status.term.to_string() },
                if status.shards.len() > 1 {
                    status.shards.iter().map(|r| r.commit_index).sum::<u64>().to_string()
                } else {
                    status.commit_index.to_string()
                },
                if status.shards.len() > 1 {
                    status.shards.iter().map(|r| r.applied_index).sum::<u64>().to_string()
                } else {
                    status.applied_index.to_string()
                },
                human_bytes(status.log_bytes),
                disk_per_live(status),
                human_bytes(status.bytes_written),
                if status.user_bytes == 0 {
                    "-".to_string()
                } else {
                    format!("{:.2}", status.write_amplification)
                },
            ]),
            Err(error) => Err(["-".to_string(), endpoint.clone(), format!("error: {error}")]),
        })
        .collect();
    let mut widths = HEADER.map(str::len);
    for row in &rows {
        let cells: &[String] = match row {
            Ok(cells) => cells,
            // Only the id and address of an error row are aligned; the message runs to the end.
            Err(cells) => &cells[..2],
        };
        for (width, cell) in widths.iter_mut().zip(cells) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut table = String::new();
    let mut push_row = |cells: &[&str]| {
        let line: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(column, cell)| {
                let last = column + 1 == cells.len();
                if last { cell.to_string() } else { format!("{cell:<width$}", width = widths[column]) }
            })
            .collect();
        table.push_str(line.join("  ").trim_end());
        table.push('\n');
    };
    push_row(&HEADER);
    for row in &rows {
        match row {
            Ok(cells) => push_row(&cells.each_ref().map(String::as_str)),
            Err(cells) => push_row(&cells.each_ref().map(String::as_str)),
        }
    }
    table
}

/// `bytes` in binary units with one decimal, e.g. `12.5 MiB`.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use onekv_client::ClientError;

    #[test]
    fn a_shards_members_show_learners_and_a_joint_configuration() {
        let mut replica = onekv_client::ShardStatus { voters: vec![1, 2, 4], ..Default::default() };
        assert_eq!(members(&replica), "1,2,4");
        replica.learners = vec![5];
        replica.outgoing_voters = vec![1, 2, 3];
        assert_eq!(members(&replica), "1,2,4 learners 5 joint with 1,2,3");
        assert_eq!(members(&onekv_client::ShardStatus::default()), "none");
    }

    #[test]
    fn values_print_as_lossy_utf8_or_hex() {
        assert_eq!(show(b"caf\xc3\xa9", false), "café");
        assert_eq!(show(b"a\xff", false), "a\u{fffd}");
        assert_eq!(show(b"\x00\xab", true), "00ab");
    }

    #[test]
    fn byte_counts_use_binary_units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(5 * 1024 * 1024 * 1024), "5.0 GiB");
    }

    #[test]
    fn status_table_aligns_rows_and_shows_errors() {
        let up = StatusResponse {
            node_id: 1,
            role: "leader".into(),
            leader_id: 1,
            term: 3,
            commit_index: 10,
            applied_index: 9,
            log_bytes: 2048,
            bytes_written: 4096,
            user_bytes: 1000,
            write_amplification: 4.096,
            gc: Some(onekv_proto::GcProgress {
                enabled: true,
                log_bytes: 2048,
                live_bytes: 1024,
                space_amp: 2.0,
                ..Default::default()
            }),
            ..Default::default()
        };
        let table = status_table(&[
            ("127.0.0.1:7001".into(), Ok(up)),
            ("127.0.0.1:7002".into(), Err(ClientError::Transport("refused".into()))),
        ]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("ID  ADDRESS         ROLE    LEADER"), "{table}");
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            [
                "1",
                "127.0.0.1:7001",
                "leader",
                "1",
                "3",
                "10",
                "9",
                "2.0",
                "KiB",
                "2.00",
                "4.0",
                "KiB",
                "4.10"
            ]
        );
        assert_eq!(lines[2], "-   127.0.0.1:7002  error: transport error: refused");
        // Columns line up: the role starts at the same offset in the header and the row.
        assert_eq!(lines[0].find("ROLE"), lines[1].find("leader"));
    }

    #[test]
    fn damaged_values_are_reported_with_the_scrub() {
        let mut status = StatusResponse { node_id: 2, ..Default::default() };
        assert_eq!(damaged_values(&status), "");
        status.corrupt_values = 3;
        status.repaired_values = 1;
        status.scrub = Some(onekv_proto::ScrubProgress {
            enabled: true,
            passes: 1,
            last_pass_values: 40,
            last_pass_corrupt: 2,
            ..Default::default()
        });
        let line = damaged_values(&status);
        assert!(line.starts_with("node 2 found 3 damaged stored value(s) and repaired 1"), "{line}");
        assert!(line.contains("checked 40 values and found 2 damaged"), "{line}");
    }

    #[test]
    fn cas_needs_exactly_one_expectation_and_one_replacement() {
        use clap::Parser;
        #[derive(Debug, clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            command: ClientCommand,
        }
        assert!(Cli::try_parse_from(["onekv", "cas", "k", "--expected", "a", "--new", "b"]).is_ok());
        assert!(Cli::try_parse_from(["onekv", "cas", "k", "--expect-absent", "--delete"]).is_ok());
        assert!(Cli::try_parse_from(["onekv", "cas", "k", "--new", "b"]).is_err());
        assert!(Cli::try_parse_from(["onekv", "cas", "k", "--expected", "a"]).is_err());
        assert!(
            Cli::try_parse_from(["onekv", "cas", "k", "--expected", "a", "--expect-absent", "--new", "b"])
                .is_err()
        );
        assert!(
            Cli::try_parse_from(["onekv", "cas", "k", "--expected", "a", "--new", "b", "--delete"]).is_err()
        );
    }
}
