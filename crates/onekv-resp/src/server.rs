//! The RESP listener: [`serve_resp`] accepts connections and runs one task per connection.
//!
//! Owns: connection lifetimes and their bounds. At most `max_connections` connections are served
//! at once; one more is told `-ERR max number of clients reached` and closed, as Redis does. Each
//! connection reads only when every complete command in its buffer has been answered, so its input
//! buffer holds at most one partial request (bounded by the parser's limits) plus one read; its
//! pipelined replies are written in order, flushed whenever 64 KiB are waiting or no complete
//! command is left. Consecutive pipelined reads ([`commands::is_pipelinable_read`]) run
//! concurrently, since each starts after every earlier command was answered; everything else runs
//! one at a time, in order. A protocol error is answered and closes that connection only. A reply
//! the socket takes no byte of for `write_timeout` (the client stopped reading, its buffers are
//! full) closes the connection, logged, so such a client cannot hold its task and its queued
//! replies forever. Does not own parsing (`protocol`) or what commands do (`exec`).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::commands;
use crate::exec::{RespContext, Session};
use crate::protocol::{Reply, RequestParser};

/// Replies are written once this many bytes are waiting, even mid-pipeline.
const FLUSH_BYTES: usize = 64 << 10;
/// Most pipelined reads of one connection run at once (their replies are held until all are done:
/// a GET or STRLEN holds at most one value, an EXISTS an integer while it reads up to 32 values).
const MAX_CONCURRENT_READS: usize = 16;
/// Bytes asked of the socket per read.
const READ_BYTES: usize = 16 << 10;
/// A connection's buffers are shrunk back when they grew past this (after a large value).
const KEEP_BUFFER_BYTES: usize = 1 << 20;
/// After the shutdown signal, how long connections get to finish the command they are running.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// The reply to a connection over the limit.
const TOO_MANY_CLIENTS: &[u8] = b"-ERR max number of clients reached\r\n";

/// Serves RESP2 and RESP3 (each connection chooses with `HELLO`) on `listener` until `shutdown`
/// completes, then stops accepting, lets each connection finish its current command (bounded by a
/// grace period) and closes them. Errors accepting a connection are logged and do not stop the
/// server.
pub async fn serve_resp(
    listener: TcpListener,
    ctx: RespContext,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let address = listener.local_addr()?;
    let permits = Arc::new(Semaphore::new(ctx.settings().max_connections.max(1)));
    let (stop, stopped) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    tracing::info!(%address, "RESP front end accepting connections");
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Typically out of file descriptors: wait rather than spin.
                        tracing::warn!(%error, "RESP accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                ctx.stats().connections_received.fetch_add(1, Ordering::Relaxed);
                let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                    ctx.stats().rejected.fetch_add(1, Ordering::Relaxed);
                    // A fresh socket's send buffer takes this short line at once; if not, the
                    // client is not told, and that is all.
                    let _ = stream.try_write(TOO_MANY_CLIENTS);
                    continue;
                };
                let ctx = ctx.clone();
                let stopped = stopped.clone();
                connections.spawn(async move {
                    ctx.stats().connected.fetch_add(1, Ordering::Relaxed);
                    match serve_connection(stream, peer, &ctx, stopped).await {
                        Ok(()) => {}
                        Err(Ended::WriteTimeout(timeout)) => {
                            ctx.stats().write_timeouts.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(
                                %peer,
                                ?timeout,
                                "closing a RESP connection: its client has read no reply bytes for the write timeout"
                            );
                        }
                        Err(Ended::Io(error)) => {
                            tracing::debug!(%peer, %error, "RESP connection ended with an error");
                        }
                    }
                    ctx.stats().connected.fetch_sub(1, Ordering::Relaxed);
                    drop(permit);
                });
            }
        }
    }
    drop(listener);
    let _ = stop.send(true);
    let drained =
        tokio::time::timeout(SHUTDOWN_GRACE, async { while connections.join_next().await.is_some() {} })
            .await;
    if drained.is_err() {
        tracing::warn!(?SHUTDOWN_GRACE, "RESP connections still busy after the grace period; closing them");
        connections.shutdown().await;
    }
    Ok(())
}

/// Why a connection ended other than normally.
#[derive(Debug)]
enum Ended {
    /// A reply waited this long without the socket taking a byte.
    WriteTimeout(Duration),
    /// The socket failed (the client reset the connection, ...).
    Io(std::io::Error),
}

impl From<std::io::Error> for Ended {
    fn from(error: std::io::Error) -> Ended {
        Ended::Io(error)
    }
}

/// Writes all of `bytes`, or fails once the socket has taken nothing for `timeout`. The bound is on
/// progress, not on the whole write, so a large reply to a slow but reading client still goes out.
async fn write_all(stream: &mut TcpStream, mut bytes: &[u8], timeout: Duration) -> Result<(), Ended> {
    while !bytes.is_empty() {
        match tokio::time::timeout(timeout, stream.write(bytes)).await {
            Ok(Ok(0)) => return Err(Ended::Io(std::io::ErrorKind::WriteZero.into())),
            Ok(Ok(written)) => bytes = &bytes[written..],
            Ok(Err(error)) => return Err(Ended::Io(error)),
            Err(_elapsed) => return Err(Ended::WriteTimeout(timeout)),
        }
    }
    Ok(())
}

/// Runs one connection: parse, execute in order, reply, until the client leaves, sends QUIT or
/// malformed input, stops reading its replies, or the server stops.
async fn serve_connection(
    mut stream: TcpStream,
    peer: std::net::SocketAddr,
    ctx: &RespContext,
    mut stopped: watch::Receiver<bool>,
) -> Result<(), Ended> {
    stream.set_nodelay(true)?;
    // A zero timeout would close every connection at its first reply.
    let write_timeout = ctx.settings().write_timeout.max(Duration::from_millis(1));
    let mut parser = RequestParser::new(ctx.parser_limits());
    let mut session = ctx.new_session().with_peer(peer);
    // Listed by CLIENT LIST while the connection lasts, however it ends.
    let _registration = ctx.register(&session);
    let mut input = BytesMut::with_capacity(READ_BYTES);
    let mut output: Vec<u8> = Vec::with_capacity(READ_BYTES);
    loop {
        // Every complete command in the buffer, parsed as it is reached (at most one run of reads
        // and the command after it are held at once).
        let mut lookahead: Option<Vec<Vec<u8>>> = None;
        let mut malformed = None;
        loop {
            let args = match lookahead.take() {
                Some(args) => args,
                None if malformed.is_some() => break,
                None => match parser.parse(&mut input) {
                    Ok(Some(args)) => args,
                    Ok(None) => break,
                    Err(error) => {
                        malformed = Some(error);
                        break;
                    }
                },
            };
            if commands::is_pipelinable_read(&args) && !session.in_transaction() {
                // A run of pipelined reads: every command before it has been answered, so each
                // read sees them, and none affects another: run them at once, reply in order.
                // (Inside MULTI they are queued instead, one by one, on the session itself.)
                let mut run = vec![args];
                while run.len() < MAX_CONCURRENT_READS {
                    match parser.parse(&mut input) {
                        Ok(Some(args)) if commands::is_pipelinable_read(&args) => run.push(args),
                        Ok(Some(args)) => {
                            lookahead = Some(args);
                            break;
                        }
                        Ok(None) => break,
                        Err(error) => {
                            malformed = Some(error);
                            break;
                        }
                    }
                }
                for reply in execute_reads(ctx, &session, run).await? {
                    reply.encode(&mut output, session.protocol());
                }
            } else if commands::may_run_long(&args) && !session.in_transaction() {
                // A blocking command waits for as long as its timeout says, a script as long as it
                // runs: meanwhile a client that leaves (or the server stopping) tells it to stop at
                // its next chance (not in the middle of a pop, which would lose the element), so
                // nothing polls or computes for nobody. Bytes that arrive are kept for after it,
                // up to one request's worth. The replies before it go out first: it may take long.
                if !output.is_empty() {
                    write_all(&mut stream, &output, write_timeout).await?;
                    output.clear();
                }
                let max_pending = ctx.parser_limits().max_request_bytes;
                let cancel = session.cancel_handle();
                let mut gone = false;
                let executed = {
                    let command = ctx.execute(&mut session, args);
                    tokio::pin!(command);
                    loop {
                        tokio::select! {
                            executed = &mut command => break executed,
                            _ = stopped.changed(), if !gone => {
                                gone = true;
                                cancel.cancel();
                            }
                            read = stream.read_buf(&mut input), if !gone && input.len() < max_pending => {
                                if !matches!(read, Ok(read) if read > 0) {
                                    gone = true;
                                    cancel.cancel();
                                }
                            }
                        }
                    }
                };
                if gone {
                    return Ok(());
                }
                executed.reply.encode(&mut output, session.protocol());
            } else {
                let executed = ctx.execute(&mut session, args).await;
                // In the protocol after the command: HELLO answers in the one it chose.
                executed.reply.encode(&mut output, session.protocol());
                if executed.close {
                    return write_all(&mut stream, &output, write_timeout).await;
                }
            }
            if output.len() >= FLUSH_BYTES {
                write_all(&mut stream, &output, write_timeout).await?;
                output.clear();
            }
        }
        if let Some(error) = malformed {
            Reply::err(&error).encode(&mut output, session.protocol());
            return write_all(&mut stream, &output, write_timeout).await;
        }
        if !output.is_empty() {
            write_all(&mut stream, &output, write_timeout).await?;
            output.clear();
        }
        if output.capacity() > KEEP_BUFFER_BYTES {
            output = Vec::with_capacity(READ_BYTES);
        }
        if input.is_empty() && input.capacity() > KEEP_BUFFER_BYTES {
            input = BytesMut::with_capacity(READ_BYTES);
        }
        if *stopped.borrow() {
            return Ok(());
        }
        input.reserve(READ_BYTES);
        tokio::select! {
            _ = stopped.changed() => return Ok(()),
            read = stream.read_buf(&mut input) => {
                if read? == 0 {
                    return Ok(());
                }
            }
        }
    }
}

/// Runs `reads` (pipelinable reads, see [`commands::is_pipelinable_read`]) concurrently; their
/// replies in order.
async fn execute_reads(
    ctx: &RespContext,
    session: &Session,
    mut reads: Vec<Vec<Vec<u8>>>,
) -> std::io::Result<Vec<Reply>> {
    if reads.len() == 1 {
        let mut session = session.clone();
        return Ok(vec![ctx.execute(&mut session, reads.remove(0)).await.reply]);
    }
    let mut tasks = JoinSet::new();
    for (position, args) in reads.into_iter().enumerate() {
        let (ctx, mut session) = (ctx.clone(), session.clone());
        tasks.spawn(async move { (position, ctx.execute(&mut session, args).await.reply) });
    }
    let mut replies = Vec::with_capacity(tasks.len());
    while let Some(joined) = tasks.join_next().await {
        replies.push(joined.map_err(std::io::Error::other)?);
    }
    replies.sort_by_key(|(position, _)| *position);
    Ok(replies.into_iter().map(|(_, reply)| reply).collect())
}
