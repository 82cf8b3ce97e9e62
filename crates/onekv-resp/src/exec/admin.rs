//! The node's own answers, which never reach the cluster: HELLO (the connection's protocol), CLIENT,
//! COMMAND (from the command table), CONFIG GET (onekv described in Redis's terms) and INFO.

use std::sync::atomic::{AtomicU64, Ordering};

use super::clients::ClientEntry;
use super::databases::DATABASES;
use super::{
    Outcome, REDIS_COMPATIBLE_VERSION, RespContext, Session, parse_integer, unknown_subcommand, wrong_arity,
};
use crate::commands::{self, CommandSpec};
use crate::pattern::Pattern;
use crate::protocol::{Protocol, Reply};

impl RespContext {
    /// `HELLO [protover [AUTH username password] [SETNAME clientname]]`. Like Redis, every option is
    /// checked before anything changes, and the reply is in the protocol just chosen. onekv has no
    /// users or passwords, which is Redis's default user without a password: `AUTH default <any
    /// password>` succeeds, any other user name is refused with Redis's `WRONGPASS` error.
    pub(super) fn hello(&self, session: &mut Session, args: &[Vec<u8>]) -> Outcome {
        let mut protocol = session.protocol;
        if let Some(version) = args.get(1) {
            protocol = match parse_integer(version) {
                Some(2) => Protocol::Resp2,
                Some(3) => Protocol::Resp3,
                Some(_) => {
                    return Err(Reply::Error("NOPROTO sorry, this protocol version is not supported".into()));
                }
                None => return Err(Reply::err("Protocol version is not an integer or out of range")),
            };
        }
        let mut name = None;
        let mut options = args.iter().skip(2);
        while let Some(option) = options.next() {
            match option.to_ascii_uppercase().as_slice() {
                b"SETNAME" => {
                    let value = options.next().ok_or_else(|| Reply::err("syntax error"))?;
                    name = Some(check_client_name(value)?);
                }
                b"AUTH" => {
                    let (Some(user), Some(_password)) = (options.next(), options.next()) else {
                        return Err(Reply::err("syntax error"));
                    };
                    if user.as_slice() != b"default" {
                        return Err(Reply::Error(
                            "WRONGPASS invalid username-password pair or user is disabled.".into(),
                        ));
                    }
                }
                _ => {
                    return Err(Reply::err(format!(
                        "Syntax error in HELLO option '{}'",
                        String::from_utf8_lossy(option)
                    )));
                }
            }
        }
        if let Some(name) = name {
            session.name = Some(name).filter(|name| !name.is_empty());
        }
        session.protocol = protocol;
        Ok(Reply::map([
            ("server", Reply::text("onekv")),
            ("version", Reply::text(REDIS_COMPATIBLE_VERSION)),
            ("proto", Reply::Integer(protocol.version())),
            ("id", Reply::Integer(i64::try_from(session.id).unwrap_or(i64::MAX))),
            ("mode", Reply::text("standalone")),
            ("role", Reply::text("master")),
            ("modules", Reply::Array(Vec::new())),
        ]))
    }

    /// The parameters CONFIG GET answers, describing onekv in Redis's terms.
    fn config_parameters(&self) -> Vec<(&'static str, String)> {
        let settings = &self.shared.settings;
        let (host, port) = settings.resp_address.rsplit_once(':').unwrap_or(("", &settings.resp_address));
        let encodings = *self.shared.encodings.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        vec![
            ("appendfsync", "always".into()),
            ("appendonly", "yes".into()),
            ("bind", host.trim_start_matches('[').trim_end_matches(']').to_string()),
            ("busy-reply-threshold", self.shared.scripts.busy_threshold().as_millis().to_string()),
            ("cluster-enabled", "no".into()),
            ("databases", DATABASES.to_string()),
            ("hash-max-listpack-entries", encodings.hash_entries.to_string()),
            ("hash-max-listpack-value", encodings.hash_value.to_string()),
            ("hash-max-ziplist-entries", encodings.hash_entries.to_string()),
            ("hash-max-ziplist-value", encodings.hash_value.to_string()),
            ("lua-time-limit", self.shared.scripts.busy_threshold().as_millis().to_string()),
            ("maxclients", settings.max_connections.to_string()),
            ("maxmemory", "0".into()),
            ("maxmemory-policy", "noeviction".into()),
            ("port", port.to_string()),
            ("proto-max-bulk-len", self.shared.parser_limits.max_bulk_bytes.to_string()),
            ("save", String::new()),
            ("set-max-intset-entries", encodings.set_intset_entries.to_string()),
            ("timeout", "0".into()),
            ("zset-max-listpack-entries", encodings.zset_entries.to_string()),
            ("zset-max-listpack-value", encodings.zset_value.to_string()),
            ("zset-max-ziplist-entries", encodings.zset_entries.to_string()),
            ("zset-max-ziplist-value", encodings.zset_value.to_string()),
        ]
    }

    pub(super) fn config(&self, args: &[Vec<u8>]) -> Outcome {
        let subcommand = args[1].to_ascii_uppercase();
        match subcommand.as_slice() {
            b"GET" if args.len() >= 3 => {
                let patterns: Vec<Pattern> =
                    args[2..].iter().map(|pattern| Pattern::parse(&pattern.to_ascii_lowercase())).collect();
                let mut reply = Vec::new();
                for (name, value) in self.config_parameters() {
                    if patterns.iter().any(|pattern| pattern.matches(name.as_bytes())) {
                        reply.push((name, Reply::text(value)));
                    }
                }
                Ok(Reply::map(reply))
            }
            b"GET" => Err(wrong_arity("config|get")),
            b"SET" => self.config_set(&args[2..]),
            b"RESETSTAT" => Ok(Reply::ok()),
            _ => Err(unknown_subcommand(&args[1], "CONFIG")),
        }
    }

    /// `CONFIG SET parameter value [parameter value ...]`: only the collections' encoding
    /// thresholds, which change nothing but OBJECT ENCODING's answers on this node, and
    /// `busy-reply-threshold` (alias `lua-time-limit`, milliseconds; see `scripting`); all or
    /// nothing, as in Redis 7, and for this node only, until it restarts. Anything else is
    /// configured in the node's TOML file.
    fn config_set(&self, pairs: &[Vec<u8>]) -> Outcome {
        if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
            return Err(wrong_arity("config|set"));
        }
        let mut encodings = *self.shared.encodings.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut busy_threshold_ms = None;
        for pair in pairs.chunks_exact(2) {
            let name = String::from_utf8_lossy(&pair[0]).to_ascii_lowercase();
            let threshold = match name.as_str() {
                "busy-reply-threshold" | "lua-time-limit" => busy_threshold_ms.insert(0),
                "hash-max-listpack-entries" | "hash-max-ziplist-entries" => &mut encodings.hash_entries,
                "hash-max-listpack-value" | "hash-max-ziplist-value" => &mut encodings.hash_value,
                "set-max-intset-entries" => &mut encodings.set_intset_entries,
                "zset-max-listpack-entries" | "zset-max-ziplist-entries" => &mut encodings.zset_entries,
                "zset-max-listpack-value" | "zset-max-ziplist-value" => &mut encodings.zset_value,
                _ => {
                    // Redis's wording for a parameter it refuses, so clients and tests that look
                    // for "CONFIG SET failed" recognise it.
                    return Err(Reply::err(format!(
                        "CONFIG SET failed (possibly related to argument '{name}') - not supported by onekv: \
                         configure onekv in the node's TOML file (only the encoding thresholds hash-max-*, \
                         set-max-intset-entries and zset-max-*, and busy-reply-threshold, can be set)"
                    )));
                }
            };
            // At most i64::MAX, Redis's bound for these (a long long).
            *threshold = std::str::from_utf8(&pair[1])
                .ok()
                .and_then(|text| text.parse::<u64>().ok())
                .filter(|value| i64::try_from(*value).is_ok())
                .ok_or_else(|| {
                    Reply::err(format!(
                        "CONFIG SET failed (possibly related to argument '{name}') - argument couldn't be \
                         parsed into an integer"
                    ))
                })?;
        }
        *self.shared.encodings.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = encodings;
        if let Some(milliseconds) = busy_threshold_ms {
            self.shared.scripts.set_busy_threshold(milliseconds);
        }
        Ok(Reply::ok())
    }

    pub(super) async fn info(&self, args: &[Vec<u8>]) -> Outcome {
        // Redis's order; `default` (and no argument) is every section but commandstats.
        const SECTIONS: [&str; 8] =
            ["server", "clients", "memory", "stats", "replication", "cpu", "commandstats", "keyspace"];
        let requested: Vec<String> =
            args[1..].iter().map(|section| String::from_utf8_lossy(section).to_ascii_lowercase()).collect();
        let all = requested.iter().any(|section| matches!(section.as_str(), "all" | "everything"));
        let default = requested.is_empty() || requested.iter().any(|section| section == "default");
        let wanted = |section: &str| {
            all || (default && section != "commandstats")
                || requested.iter().any(|requested| requested == section)
        };
        let settings = &self.shared.settings;
        let stats = &self.shared.stats;
        let mut text = String::new();
        for section in SECTIONS.into_iter().filter(|section| wanted(section)) {
            if !text.is_empty() {
                text.push_str("\r\n");
            }
            let mut title = section.to_string();
            title[..1].make_ascii_uppercase();
            text.push_str(&format!("# {title}\r\n"));
            let mut field = |name: &str, value: String| text.push_str(&format!("{name}:{value}\r\n"));
            match section {
                "server" => {
                    let port = settings.resp_address.rsplit_once(':').map_or("", |(_, port)| port);
                    field("redis_version", REDIS_COMPATIBLE_VERSION.into());
                    field("onekv_version", env!("CARGO_PKG_VERSION").into());
                    field("redis_mode", "standalone".into());
                    field("os", std::env::consts::OS.into());
                    field("arch_bits", (usize::BITS).to_string());
                    field("process_id", std::process::id().to_string());
                    field("tcp_port", port.into());
                    field("uptime_in_seconds", self.shared.started.elapsed().as_secs().to_string());
                    field("onekv_node_id", settings.node_id.to_string());
                }
                "clients" => {
                    field("connected_clients", stats.connected.load(Ordering::Relaxed).to_string());
                    field("maxclients", settings.max_connections.to_string());
                }
                "replication" => {
                    // Every node accepts writes (it forwards them to the leader), so to a Redis
                    // client each one is a master; the Raft role is reported beside it.
                    field("role", "master".into());
                    field("connected_slaves", "0".into());
                    match self.shared.client.status(&settings.endpoints[0]).await {
                        Ok(status) => {
                            let leader = status.members.iter().find(|member| member.id == status.leader_id);
                            field("master_repl_offset", status.applied_index.to_string());
                            field("onekv_raft_role", status.role.clone());
                            field("onekv_leader_id", status.leader_id.to_string());
                            field(
                                "onekv_leader_address",
                                leader.map(|member| member.address.clone()).unwrap_or_default(),
                            );
                            field("onekv_term", status.term.to_string());
                            field("onekv_commit_index", status.commit_index.to_string());
                            field("onekv_applied_index", status.applied_index.to_string());
                            field("onekv_members", status.members.len().to_string());
                            field("onekv_storage", status.storage_mode.clone());
                            field("onekv_log_bytes", status.log_bytes.to_string());
                            field("onekv_write_amplification", format!("{:.2}", status.write_amplification));
                        }
                        Err(error) => field("onekv_status_error", error.to_string()),
                    }
                }
                "memory" => {
                    let resident = resident_bytes().unwrap_or(0);
                    field("used_memory", resident.to_string());
                    field("used_memory_human", format!("{:.2}M", resident as f64 / (1 << 20) as f64));
                    field("used_memory_rss", resident.to_string());
                    field("maxmemory", "0".into());
                    field("maxmemory_policy", "noeviction".into());
                    // Rust's system allocator (glibc's malloc): not jemalloc.
                    field("mem_allocator", "libc".into());
                    let (scripts, script_bytes) = self.cached_scripts();
                    field("number_of_cached_scripts", scripts.to_string());
                    field("used_memory_scripts_eval", script_bytes.to_string());
                }
                "cpu" => {
                    let [user, system, children_user, children_system] = cpu_seconds().unwrap_or_default();
                    field("used_cpu_sys", format!("{system:.6}"));
                    field("used_cpu_user", format!("{user:.6}"));
                    field("used_cpu_sys_children", format!("{children_system:.6}"));
                    field("used_cpu_user_children", format!("{children_user:.6}"));
                }
                "commandstats" => {
                    for (spec, counters) in commands::COMMANDS.iter().zip(stats.per_command.iter()) {
                        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
                        let (calls, rejected) = (load(&counters.calls), load(&counters.rejected));
                        if calls == 0 && rejected == 0 {
                            continue;
                        }
                        let micros = load(&counters.micros);
                        field(
                            &format!("cmdstat_{}", spec.name),
                            format!(
                                "calls={calls},usec={micros},usec_per_call={:.2},rejected_calls={rejected},failed_calls={}",
                                micros as f64 / calls.max(1) as f64,
                                load(&counters.failed)
                            ),
                        );
                    }
                }
                "stats" => {
                    let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed).to_string();
                    field("total_connections_received", load(&stats.connections_received));
                    field("total_commands_processed", load(&stats.commands_processed));
                    field("rejected_connections", load(&stats.rejected));
                    field("onekv_write_timeout_disconnections", load(&stats.write_timeouts));
                }
                _ => {
                    let counts = self.key_counts().await?;
                    for (db, keys) in counts.into_iter().enumerate().filter(|(_, keys)| *keys > 0) {
                        field(&format!("db{db}"), format!("keys={keys},expires=0,avg_ttl=0"));
                    }
                }
            }
        }
        // Plain text, which Redis sends as a verbatim string in RESP3 (a bulk string in RESP2).
        Ok(Reply::Verbatim(text))
    }
}

/// This process's resident memory in bytes (Linux's `/proc/self/statm`; `None` elsewhere).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // The kernel's page size on every platform onekv is built for.
    Some(pages * 4096)
}

/// This process's CPU time in seconds: user, system, and the same for its waited-for children
/// (Linux's `/proc/self/stat`, in clock ticks of 1/100 s; `None` elsewhere).
fn cpu_seconds() -> Option<[f64; 4]> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may contain spaces), from field 3 (the state) on.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |field: usize| -> Option<f64> { Some(fields.get(field - 3)?.parse::<f64>().ok()? / 100.0) };
    Some([ticks(14)?, ticks(15)?, ticks(16)?, ticks(17)?])
}

/// `FUNCTION FLUSH [ASYNC|SYNC]` and `FUNCTION LIST`: onekv runs no server-side functions, so there
/// is never one to flush or list (Redis's test harness flushes them before every test file).
pub(super) fn function_command(args: &[Vec<u8>]) -> Outcome {
    let subcommand = args[1].to_ascii_uppercase();
    match (subcommand.as_slice(), &args[2..]) {
        (b"FLUSH", []) => Ok(Reply::ok()),
        (b"FLUSH", [mode]) if mode.eq_ignore_ascii_case(b"ASYNC") || mode.eq_ignore_ascii_case(b"SYNC") => {
            Ok(Reply::ok())
        }
        (b"FLUSH", _) => Err(Reply::err("syntax error")),
        (b"LIST", _) => Ok(Reply::Array(Vec::new())),
        _ => Err(Reply::err(format!(
            "onekv runs no functions: FUNCTION {} is not supported",
            String::from_utf8_lossy(&subcommand[..subcommand.len().min(64)])
        ))),
    }
}

impl RespContext {
    /// `CLIENT SETNAME|GETNAME|ID|SETINFO|INFO|LIST`.
    pub(super) fn client_command(&self, session: &mut Session, args: &[Vec<u8>]) -> Outcome {
        let subcommand = args[1].to_ascii_uppercase();
        match (subcommand.as_slice(), args.len()) {
            (b"SETNAME", 3) => {
                session.name = Some(check_client_name(&args[2])?).filter(|name| !name.is_empty());
                Ok(Reply::ok())
            }
            (b"GETNAME", 2) => Ok(Reply::optional(session.name.clone())),
            (b"ID", 2) => Ok(Reply::Integer(i64::try_from(session.id).unwrap_or(i64::MAX))),
            (b"SETINFO", 4) => {
                let value = &args[3];
                if value.iter().any(|&byte| !(b'!'..=b'~').contains(&byte)) {
                    return Err(Reply::err(format!(
                        "{} cannot contain spaces, newlines or special characters.",
                        String::from_utf8_lossy(&args[2])
                    )));
                }
                match args[2].to_ascii_lowercase().as_slice() {
                    b"lib-name" => session.lib_name = value.clone(),
                    b"lib-ver" => session.lib_version = value.clone(),
                    _ => {
                        return Err(Reply::err(format!(
                            "Unrecognized option '{}'",
                            String::from_utf8_lossy(&args[2])
                        )));
                    }
                }
                Ok(Reply::ok())
            }
            (b"INFO", 2) => {
                Ok(Reply::Verbatim(ClientEntry::of(session).line(&self.shared.settings.resp_address)))
            }
            (b"LIST", _) => {
                // `[TYPE normal|master|replica|pubsub] [ID id...]`: every connection is a normal one.
                let mut ids: Option<Vec<u64>> = None;
                let mut normal = true;
                let mut options = args[2..].iter();
                while let Some(option) = options.next() {
                    match option.to_ascii_uppercase().as_slice() {
                        b"TYPE" => {
                            let kind = options
                                .next()
                                .ok_or_else(|| Reply::err("syntax error"))?
                                .to_ascii_lowercase();
                            match kind.as_slice() {
                                b"normal" => {}
                                b"master" | b"replica" | b"slave" | b"pubsub" => normal = false,
                                _ => {
                                    return Err(Reply::err(format!(
                                        "Unknown client type '{}'",
                                        String::from_utf8_lossy(&kind)
                                    )));
                                }
                            }
                        }
                        b"ID" => {
                            let listed: Vec<u64> = options
                                .by_ref()
                                .map(|id| {
                                    parse_integer(id)
                                        .and_then(|id| u64::try_from(id).ok())
                                        .filter(|&id| id > 0)
                                        .ok_or_else(|| Reply::err("Invalid client ID"))
                                })
                                .collect::<Outcome<_>>()?;
                            if listed.is_empty() {
                                return Err(Reply::err("syntax error"));
                            }
                            ids = Some(listed);
                        }
                        _ => return Err(Reply::err("syntax error")),
                    }
                }
                let list = if normal { self.client_list(ids.as_deref()) } else { String::new() };
                Ok(Reply::Verbatim(list))
            }
            (b"SETNAME" | b"GETNAME" | b"ID" | b"SETINFO" | b"INFO", _) => Err(wrong_arity(&format!(
                "client|{}",
                String::from_utf8_lossy(&args[1]).to_ascii_lowercase()
            ))),
            _ => Err(unknown_subcommand(&args[1], "CLIENT")),
        }
    }
}

fn check_client_name(name: &[u8]) -> Outcome<Vec<u8>> {
    if name.iter().any(|&byte| !(b'!'..=b'~').contains(&byte)) {
        return Err(Reply::err("Client names cannot contain spaces, newlines or special characters."));
    }
    Ok(name.to_vec())
}

pub(super) fn command_command(args: &[Vec<u8>]) -> Outcome {
    let Some(subcommand) = args.get(1) else {
        return Ok(Reply::Array(commands::COMMANDS.iter().map(command_info).collect()));
    };
    let names = &args[2..];
    match subcommand.to_ascii_uppercase().as_slice() {
        b"COUNT" => Ok(Reply::Integer(commands::COMMANDS.len() as i64)),
        b"LIST" => Ok(Reply::Array(commands::COMMANDS.iter().map(|spec| Reply::text(spec.name)).collect())),
        b"INFO" => {
            let specs: Vec<Reply> = if names.is_empty() {
                commands::COMMANDS.iter().map(command_info).collect()
            } else {
                names
                    .iter()
                    .map(|name| commands::lookup(name).map_or(Reply::NilArray, command_info))
                    .collect()
            };
            Ok(Reply::Array(specs))
        }
        b"DOCS" => {
            let specs: Vec<&CommandSpec> = if names.is_empty() {
                commands::COMMANDS.iter().collect()
            } else {
                names.iter().filter_map(|name| commands::lookup(name)).collect()
            };
            let mut reply = Vec::new();
            for spec in specs {
                let mut doc = vec![
                    ("summary", Reply::text(spec.summary)),
                    ("since", Reply::text(spec.since)),
                    ("group", Reply::text(spec.group)),
                ];
                let arguments = argument_docs(commands::syntax(spec.name));
                if !arguments.is_empty() {
                    doc.push(("arguments", Reply::Array(arguments)));
                }
                reply.push((spec.name, Reply::map(doc)));
            }
            Ok(Reply::map(reply))
        }
        _ => Err(unknown_subcommand(subcommand, "COMMAND")),
    }
}

/// `COMMAND DOCS`'s argument specs for a [`commands::syntax`] string: one map (a flat array in
/// RESP2) per argument with its `name`, `type`, and `token`, `flags` and nested `arguments` where
/// they apply, as Redis 7 documents its own commands.
fn argument_docs(syntax: &str) -> Vec<Reply> {
    let mut docs = Vec::new();
    let mut rest = syntax.trim();
    while !rest.is_empty() {
        let end = match rest.as_bytes()[0] {
            b'[' => rest.find(']').map_or(rest.len(), |close| close + 1),
            // A block runs to its `)` and any `...` after it.
            b'(' => rest.find(')').map_or(rest.len(), |close| {
                rest[close..].find(' ').map_or(rest.len(), |space| close + space)
            }),
            _ => rest.find(' ').unwrap_or(rest.len()),
        };
        let (item, after) = rest.split_at(end);
        docs.push(argument_doc(item));
        rest = after.trim_start();
    }
    docs
}

fn argument_doc(item: &str) -> Reply {
    let (item, optional) = match item.strip_prefix('[').and_then(|inner| inner.strip_suffix(']')) {
        Some(inner) => (inner, true),
        None => (item, false),
    };
    let (item, multiple) = match item.strip_suffix("...") {
        Some(inner) => (inner, true),
        None => (item, false),
    };
    let mut fields = Vec::new();
    let mut field = |name: &'static str, value: Reply| fields.push((name, value));
    let is_token = |word: &str| word.chars().all(|c| c.is_ascii_uppercase());
    if let Some(block) = item.strip_prefix('(').and_then(|inner| inner.strip_suffix(')')) {
        field("name", Reply::text(block.replace(' ', "_")));
        field("type", Reply::text("block"));
        field("arguments", Reply::Array(argument_docs(block)));
    } else if item.contains('|') {
        field("name", Reply::text(item.to_ascii_lowercase().replace('|', "_")));
        field("type", Reply::text("oneof"));
        field("arguments", Reply::Array(argument_docs(&item.replace('|', " "))));
    } else if let Some((token, name)) = item.split_once(' ') {
        field("name", Reply::text(name));
        field("type", Reply::text("string"));
        field("token", Reply::text(token));
    } else if is_token(item) {
        field("name", Reply::text(item.to_ascii_lowercase()));
        field("type", Reply::text("pure-token"));
        field("token", Reply::text(item));
    } else {
        field("name", Reply::text(item));
        field("type", Reply::text(if item.starts_with("key") { "key" } else { "string" }));
    }
    let flags: Vec<Reply> = [("optional", optional), ("multiple", multiple)]
        .into_iter()
        .filter(|(_, set)| *set)
        .map(|(flag, _)| Reply::Simple(flag.into()))
        .collect();
    if !flags.is_empty() {
        field("flags", Reply::Array(flags));
    }
    Reply::map(fields)
}

/// `COMMAND INFO`'s ten-element description of a command (Redis 7's layout).
fn command_info(spec: &CommandSpec) -> Reply {
    let mut categories = Vec::new();
    for flag in spec.flags {
        match *flag {
            "readonly" => categories.push("@read"),
            "write" => categories.push("@write"),
            "fast" => categories.push("@fast"),
            _ => {}
        }
    }
    categories.push(match spec.group {
        "string" => "@string",
        "generic" => "@keyspace",
        "connection" => "@connection",
        "transactions" => "@transaction",
        _ => "@admin",
    });
    let simple =
        |items: &[&str]| Reply::Array(items.iter().map(|item| Reply::Simple((*item).into())).collect());
    Reply::Array(vec![
        Reply::text(spec.name),
        Reply::Integer(spec.arity),
        simple(spec.flags),
        Reply::Integer(spec.first_key),
        Reply::Integer(spec.last_key),
        Reply::Integer(spec.step),
        simple(&categories),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands;
    use crate::protocol::Protocol;

    #[test]
    fn argument_docs_follow_redis_layout() {
        let text = |s: &str| Reply::text(s);
        assert_eq!(argument_docs("key"), vec![Reply::map([("name", text("key")), ("type", text("key"))])]);
        let set = argument_docs(commands::syntax("set"));
        assert_eq!(set.len(), 5);
        let token = |name: &str, token: &str| {
            Reply::map([("name", text(name)), ("type", text("pure-token")), ("token", text(token))])
        };
        assert_eq!(
            set[2],
            Reply::map([
                ("name", text("nx_xx")),
                ("type", text("oneof")),
                ("arguments", Reply::Array(vec![token("nx", "NX"), token("xx", "XX")])),
                ("flags", Reply::Array(vec![Reply::Simple("optional".into())])),
            ])
        );
        // In RESP2 the maps are flat arrays, as Redis sends them.
        assert_eq!(
            set[2].to_bytes(Protocol::Resp2),
            Reply::Array(vec![
                text("name"),
                text("nx_xx"),
                text("type"),
                text("oneof"),
                text("arguments"),
                Reply::Array(vec![
                    Reply::Array(vec![
                        text("name"),
                        text("nx"),
                        text("type"),
                        text("pure-token"),
                        text("token"),
                        text("NX")
                    ]),
                    Reply::Array(vec![
                        text("name"),
                        text("xx"),
                        text("type"),
                        text("pure-token"),
                        text("token"),
                        text("XX")
                    ]),
                ]),
                text("flags"),
                Reply::Array(vec![Reply::Simple("optional".into())]),
            ])
            .to_bytes(Protocol::Resp2)
        );
        let scan = argument_docs(commands::syntax("scan"));
        assert_eq!(
            scan[1],
            Reply::map([
                ("name", text("pattern")),
                ("type", text("string")),
                ("token", text("MATCH")),
                ("flags", Reply::Array(vec![Reply::Simple("optional".into())])),
            ])
        );
        let mset = argument_docs(commands::syntax("mset"));
        let Reply::Map(fields) = &mset[0] else { panic!() };
        assert_eq!(fields[..2], [(text("name"), text("key_value")), (text("type"), text("block"))]);
        assert_eq!(fields[3], (text("flags"), Reply::Array(vec![Reply::Simple("multiple".into())])));
        // Every documented command's syntax parses into named, typed arguments.
        for spec in commands::COMMANDS {
            for doc in argument_docs(commands::syntax(spec.name)) {
                let Reply::Map(fields) = doc else { panic!() };
                assert_eq!(fields[0].0, text("name"), "{}", spec.name);
                assert_eq!(fields[1].0, text("type"), "{}", spec.name);
            }
        }
    }
}
