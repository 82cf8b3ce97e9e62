//! The node's connections as CLIENT LIST and CLIENT INFO describe them.
//!
//! Owns: the registry of connected clients (one small entry per connection, bounded by the
//! front end's connection limit), kept current when a connection's visible state changes (HELLO,
//! CLIENT SETNAME/SETINFO, SELECT), and the one-line format both commands print. Does not own the
//! connections themselves (`server`).

use std::net::SocketAddr;
use std::time::Instant;

use super::{RespContext, Session};

/// What CLIENT LIST shows of one connection.
#[derive(Debug, Clone)]
pub(super) struct ClientEntry {
    id: u64,
    addr: Option<SocketAddr>,
    connected: Instant,
    name: Vec<u8>,
    db: u8,
    resp: i64,
    lib_name: Vec<u8>,
    lib_version: Vec<u8>,
}

impl ClientEntry {
    pub(super) fn of(session: &Session) -> ClientEntry {
        ClientEntry {
            id: session.id,
            addr: session.peer,
            connected: session.connected,
            name: session.name.clone().unwrap_or_default(),
            db: session.db,
            resp: session.protocol.version(),
            lib_name: session.lib_name.clone(),
            lib_version: session.lib_version.clone(),
        }
    }

    /// The connection's line, in Redis's `field=value` format (a subset of Redis's fields: the
    /// ones client libraries and operators read).
    pub(super) fn line(&self, local_address: &str) -> String {
        format!(
            "id={} addr={} laddr={local_address} name={} age={} idle=0 flags=N db={} sub=0 psub=0 ssub=0 \
             user=default resp={} lib-name={} lib-ver={}\n",
            self.id,
            self.addr.map(|addr| addr.to_string()).unwrap_or_default(),
            String::from_utf8_lossy(&self.name),
            self.connected.elapsed().as_secs(),
            self.db,
            self.resp,
            String::from_utf8_lossy(&self.lib_name),
            String::from_utf8_lossy(&self.lib_version),
        )
    }
}

/// A connection's place in the registry; dropping it removes the connection.
#[derive(Debug)]
pub struct Registration {
    context: RespContext,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.context.lock_clients().remove(&self.id);
    }
}

impl RespContext {
    /// Adds a connection to the registry until the returned registration is dropped (the listener
    /// holds it for the connection's lifetime).
    pub fn register(&self, session: &Session) -> Registration {
        self.lock_clients().insert(session.id, ClientEntry::of(session));
        Registration { context: self.clone(), id: session.id }
    }

    /// Brings a registered connection's entry up to date after a command that may have changed it.
    pub(super) fn publish(&self, session: &Session) {
        if let Some(entry) = self.lock_clients().get_mut(&session.id) {
            *entry = ClientEntry::of(session);
        }
    }

    /// The registered connections in id order (those whose id is in `ids`, when given).
    pub(super) fn client_list(&self, ids: Option<&[u64]>) -> String {
        let mut entries: Vec<ClientEntry> = self
            .lock_clients()
            .values()
            .filter(|entry| ids.is_none_or(|ids| ids.contains(&entry.id)))
            .cloned()
            .collect();
        entries.sort_by_key(|entry| entry.id);
        let local = &self.shared.settings.resp_address;
        entries.iter().map(|entry| entry.line(local)).collect()
    }

    fn lock_clients(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, ClientEntry>> {
        self.shared.clients.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
