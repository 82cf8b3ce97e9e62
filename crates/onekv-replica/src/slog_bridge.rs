//! raft-rs logs through `slog`; this forwards its records to `tracing` so the node has one log
//! stream with one level filter.

use slog::{Drain, KV, Level, OwnedKVList, Record, Serializer};
use std::fmt::{self, Write};

/// A `slog::Logger` whose records become `tracing` events (target `raft`).
pub(crate) fn logger(node_id: u64, shard: u64) -> slog::Logger {
    slog::Logger::root(TracingDrain.fuse(), slog::o!("node" => node_id, "shard" => shard))
}

struct TracingDrain;

impl Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), slog::Never> {
        // raft-rs logs every message it sends at debug level with the whole message (entries and
        // values included) as a field: formatting that when nobody listens cost seconds per turn
        // with 1 MiB values. Only records that will be emitted are formatted.
        let enabled = match record.level() {
            Level::Critical | Level::Error => tracing::enabled!(target: "raft", tracing::Level::ERROR),
            Level::Warning => tracing::enabled!(target: "raft", tracing::Level::WARN),
            Level::Info => tracing::enabled!(target: "raft", tracing::Level::INFO),
            Level::Debug => tracing::enabled!(target: "raft", tracing::Level::DEBUG),
            Level::Trace => tracing::enabled!(target: "raft", tracing::Level::TRACE),
        };
        if !enabled {
            return Ok(());
        }
        let mut fields = Fields(String::new());
        let _ = record.kv().serialize(record, &mut fields);
        let _ = values.serialize(record, &mut fields);
        let message = record.msg();
        let fields = fields.0;
        match record.level() {
            Level::Critical | Level::Error => tracing::error!(target: "raft", "{message}{fields}"),
            Level::Warning => tracing::warn!(target: "raft", "{message}{fields}"),
            Level::Info => tracing::info!(target: "raft", "{message}{fields}"),
            Level::Debug => tracing::debug!(target: "raft", "{message}{fields}"),
            Level::Trace => tracing::trace!(target: "raft", "{message}{fields}"),
        }
        Ok(())
    }
}

struct Fields(String);

impl Serializer for Fields {
    fn emit_arguments(&mut self, key: slog::Key, value: &fmt::Arguments<'_>) -> slog::Result {
        let _ = write!(self.0, " {key}={value}");
        Ok(())
    }
}
