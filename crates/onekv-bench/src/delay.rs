//! Network delay for a local cluster: a TCP proxy on every link that holds each byte a fixed time
//! before passing it on, so that a benchmark on one machine sees round trips like a network's.
//! (There is no netem here; this is the user-space stand-in.)
//!
//! Owns: one listening port per directed link (node → node, and the benchmark client → each node),
//! the forwarding threads, and stopping them. Each direction of each connection is a reader thread
//! that stamps what it reads and a writer thread that sends it once `delay` has passed since, so
//! the delay is one way and does not grow with the data (no bandwidth limit is modelled). Threads
//! rather than tokio tasks because tokio's timer has millisecond granularity and the delays that
//! matter here are half a millisecond. Does not own the nodes' configurations
//! ([`crate::local_cluster`] points them at these ports).

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// Bytes read at once by a forwarding thread.
const READ_BYTES: usize = 64 << 10;

/// Reads (of at most [`READ_BYTES`] each) a direction holds in flight before its reader waits.
const QUEUED_READS: usize = 256;

/// Where a link's traffic comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum From {
    /// The node with this id (its configuration names the other nodes at proxies).
    Node(u64),
    /// The benchmark's client.
    Client,
}

/// The running proxies of one cluster; dropping them closes every port and connection.
pub struct DelayedLinks {
    addresses: HashMap<(From, u64), String>,
    stopping: Arc<AtomicBool>,
    /// The open connections' two sockets, to shut down on drop (which ends their threads); a
    /// connection leaves once both its directions have ended.
    sockets: Sockets,
}

type Sockets = Arc<Mutex<HashMap<u64, [TcpStream; 2]>>>;

impl DelayedLinks {
    /// Starts a proxy for every link to each of `nodes` (id, real address): from every other node
    /// and from the client, each adding `delay` one way in both directions.
    pub fn start(nodes: &[(u64, String)], delay: Duration) -> std::io::Result<DelayedLinks> {
        // Built first, so that a failure part-way stops the proxies already started (drop).
        let mut links = DelayedLinks {
            addresses: HashMap::new(),
            stopping: Arc::new(AtomicBool::new(false)),
            sockets: Arc::new(Mutex::new(HashMap::new())),
        };
        for (to, target) in nodes {
            let froms = nodes.iter().filter(|(id, _)| id != to).map(|(id, _)| From::Node(*id));
            for from in froms.chain([From::Client]) {
                let listener = TcpListener::bind("127.0.0.1:0")?;
                links.addresses.insert((from, *to), listener.local_addr()?.to_string());
                let link = Link {
                    target: target.clone(),
                    delay,
                    stopping: Arc::clone(&links.stopping),
                    sockets: Arc::clone(&links.sockets),
                };
                std::thread::Builder::new()
                    .name("bench-delay-accept".into())
                    .spawn(move || link.accept(listener))?;
            }
        }
        Ok(links)
    }

    /// The address `from` reaches node `to` at.
    pub fn address(&self, from: From, to: u64) -> &str {
        &self.addresses[&(from, to)]
    }
}

impl Drop for DelayedLinks {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wakes every accept loop, which then sees `stopping`.
        for address in self.addresses.values() {
            let _ = TcpStream::connect(address);
        }
        for sockets in self.sockets.lock().unwrap_or_else(|e| e.into_inner()).drain().map(|(_, both)| both) {
            for socket in sockets {
                let _ = socket.shutdown(Shutdown::Both);
            }
        }
    }
}

struct Link {
    target: String,
    delay: Duration,
    stopping: Arc<AtomicBool>,
    sockets: Sockets,
}

/// Numbers the proxied connections of every link (the keys of [`Sockets`]).
static CONNECTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Link {
    fn accept(self, listener: TcpListener) {
        for incoming in listener.incoming() {
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            let Ok(incoming) = incoming else { continue };
            // A node that is not up yet (or stopped) refuses: so does the link.
            let Ok(outgoing) = TcpStream::connect(&self.target) else { continue };
            let _ = self.forward(incoming, outgoing);
        }
    }

    fn forward(&self, a: TcpStream, b: TcpStream) -> std::io::Result<()> {
        a.set_nodelay(true)?;
        b.set_nodelay(true)?;
        let connection = CONNECTIONS.fetch_add(1, Ordering::Relaxed);
        self.sockets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(connection, [a.try_clone()?, b.try_clone()?]);
        // The second direction to end forgets the connection.
        let ended = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let forget = move |sockets: &Sockets| {
            if ended.fetch_add(1, Ordering::SeqCst) == 1 {
                sockets.lock().unwrap_or_else(|e| e.into_inner()).remove(&connection);
            }
        };
        let (first, second) = (forget.clone(), forget);
        let sockets = (Arc::clone(&self.sockets), Arc::clone(&self.sockets));
        pipe(a.try_clone()?, b.try_clone()?, self.delay, move || first(&sockets.0))?;
        pipe(b, a, self.delay, move || second(&sockets.1))
    }
}

/// Forwards everything read from `from` to `to`, each read `delay` after it arrived; when `from`
/// ends (or fails), `to`'s writing side is shut once what was read has gone, and `ended` runs.
fn pipe(
    mut from: TcpStream,
    mut to: TcpStream,
    delay: Duration,
    ended: impl FnOnce() + Send + 'static,
) -> std::io::Result<()> {
    let (queue, queued) = mpsc::sync_channel::<(Instant, Vec<u8>)>(QUEUED_READS);
    std::thread::Builder::new().name("bench-delay-read".into()).spawn(move || {
        let mut buffer = vec![0; READ_BYTES];
        while let Ok(read @ 1..) = from.read(&mut buffer) {
            if queue.send((Instant::now(), buffer[..read].to_vec())).is_err() {
                break;
            }
        }
    })?;
    std::thread::Builder::new().name("bench-delay-write".into()).spawn(move || {
        for (arrived, bytes) in queued {
            let due = arrived + delay;
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
        ended();
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server behind a link of 5 ms each way: a round trip takes at least 10 ms, and the
    /// bytes come back whole and in order.
    #[test]
    fn a_round_trip_through_a_link_takes_twice_its_delay() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = echo.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for stream in echo.incoming() {
                let mut stream = stream.unwrap();
                let mut reader = stream.try_clone().unwrap();
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut reader, &mut stream);
                });
            }
        });
        let delay = Duration::from_millis(5);
        let links = DelayedLinks::start(&[(1, target)], delay).unwrap();
        let mut client = TcpStream::connect(links.address(From::Client, 1)).unwrap();
        let message: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let started = Instant::now();
        client.write_all(&message).unwrap();
        let mut back = vec![0; message.len()];
        client.read_exact(&mut back).unwrap();
        let took = started.elapsed();
        assert_eq!(back, message);
        assert!(took >= 2 * delay, "a round trip took {took:?}");
        assert!(took < Duration::from_secs(2), "a round trip took {took:?}");
        drop(links);
    }
}
