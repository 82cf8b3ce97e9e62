//! The RESP listener over real sockets, without a cluster: only commands a node answers by itself
//! (PING, ECHO, CLIENT, ...) are sent, so the client inside never needs to reach anyone.
//!
//! Checks pipelined replies in order (multibulk and inline, written a byte at a time), a protocol
//! error closing only its own connection, the connection limit, QUIT, shutdown, the write timeout
//! closing a connection whose client stopped reading, HELLO switching between RESP2 and RESP3, and
//! CLIENT LIST following connections as they open, change and close.

use std::time::{Duration, Instant};

use onekv_resp::{RespContext, RespSettings, serve_resp};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;

const TIMEOUT: Duration = Duration::from_secs(10);

/// A front end on an ephemeral port allowing `max_connections`; returns its address and the
/// sender that stops it.
async fn start(max_connections: usize) -> (String, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    start_with(|settings| settings.max_connections = max_connections).await
}

/// [`start`] with the default settings changed by `tweak`.
async fn start_with(
    tweak: impl FnOnce(&mut RespSettings),
) -> (String, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    // Nothing listens on port 1: data commands would fail, and none is sent.
    let mut settings = RespSettings::new(1, vec!["127.0.0.1:1".into()], address.clone());
    tweak(&mut settings);
    let context = RespContext::new(settings).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        serve_resp(listener, context, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    (address, stop, task)
}

/// Reads until `expected.len()` bytes arrived (or the peer closed) and returns them.
async fn read_exactly(stream: &mut TcpStream, len: usize) -> Vec<u8> {
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    while received.len() < len {
        let read =
            tokio::time::timeout(TIMEOUT, stream.read(&mut buffer)).await.expect("a reply in time").unwrap();
        if read == 0 {
            break;
        }
        received.extend_from_slice(&buffer[..read]);
    }
    received
}

/// Whether the server closed `stream` (reads end of file in time).
async fn closed(stream: &mut TcpStream) -> bool {
    let mut buffer = [0u8; 64];
    matches!(tokio::time::timeout(TIMEOUT, stream.read(&mut buffer)).await, Ok(Ok(0)) | Ok(Err(_)))
}

#[tokio::test]
async fn pipelined_requests_split_into_single_bytes_are_answered_in_order() {
    let (address, _stop, _task) = start(8).await;
    let mut stream = TcpStream::connect(&address).await.unwrap();
    let request: &[u8] = b"*1\r\n$4\r\nPING\r\nECHO \"a b\"\r\n*2\r\n$4\r\nECHO\r\n$3\r\nx\ny\r\n\
        CLIENT SETNAME me\nCLIENT GETNAME\r\n*3\r\n$3\r\nGET\r\n$1\r\na\r\n$1\r\nb\r\nPING hi\r\n";
    for byte in request {
        stream.write_all(&[*byte]).await.unwrap();
    }
    let expected: &[u8] = b"+PONG\r\n$3\r\na b\r\n$3\r\nx\ny\r\n+OK\r\n$2\r\nme\r\n\
        -ERR wrong number of arguments for 'get' command\r\n$2\r\nhi\r\n";
    assert_eq!(read_exactly(&mut stream, expected.len()).await, expected);
}

#[tokio::test]
async fn a_protocol_error_closes_only_its_connection() {
    let (address, _stop, _task) = start(8).await;
    let mut good = TcpStream::connect(&address).await.unwrap();
    let mut bad = TcpStream::connect(&address).await.unwrap();
    bad.write_all(b"*1\r\n$-5\r\n").await.unwrap();
    let reply = read_exactly(&mut bad, 1).await;
    assert!(
        reply.starts_with(b"-ERR Protocol error: invalid bulk length"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    assert!(closed(&mut bad).await, "the bad connection is closed");
    // An oversized bulk announcement is refused before anything is allocated.
    let mut huge = TcpStream::connect(&address).await.unwrap();
    huge.write_all(b"*2\r\n$3\r\nSET\r\n$999999999999\r\n").await.unwrap();
    let reply = read_exactly(&mut huge, 1).await;
    assert!(
        reply.starts_with(b"-ERR Protocol error: invalid bulk length"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    good.write_all(b"PING\r\n").await.unwrap();
    assert_eq!(read_exactly(&mut good, 7).await, b"+PONG\r\n");
}

#[tokio::test]
async fn connections_over_the_limit_are_refused_and_quit_frees_a_slot() {
    let (address, _stop, _task) = start(2).await;
    let mut first = TcpStream::connect(&address).await.unwrap();
    let mut second = TcpStream::connect(&address).await.unwrap();
    for stream in [&mut first, &mut second] {
        stream.write_all(b"PING\r\n").await.unwrap();
        assert_eq!(read_exactly(stream, 7).await, b"+PONG\r\n");
    }
    let mut third = TcpStream::connect(&address).await.unwrap();
    let refusal = b"-ERR max number of clients reached\r\n";
    assert_eq!(read_exactly(&mut third, refusal.len()).await, refusal);
    assert!(closed(&mut third).await);

    first.write_all(b"QUIT\r\n").await.unwrap();
    assert_eq!(read_exactly(&mut first, 5).await, b"+OK\r\n");
    assert!(closed(&mut first).await);
    // The slot is released once the connection's task has ended: retry briefly.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let mut fourth = TcpStream::connect(&address).await.unwrap();
        fourth.write_all(b"PING\r\n").await.unwrap();
        let reply = read_exactly(&mut fourth, 7).await;
        if reply == b"+PONG\r\n" {
            break;
        }
        assert!(reply.starts_with(b"-ERR max number"), "{}", String::from_utf8_lossy(&reply));
        assert!(tokio::time::Instant::now() < deadline, "the QUIT connection's slot was never released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn shutdown_closes_idle_connections_and_returns() {
    let (address, stop, task) = start(8).await;
    let mut idle = TcpStream::connect(&address).await.unwrap();
    idle.write_all(b"PING\r\n").await.unwrap();
    assert_eq!(read_exactly(&mut idle, 7).await, b"+PONG\r\n");
    stop.send(()).unwrap();
    tokio::time::timeout(TIMEOUT, task).await.expect("the server stops in time").unwrap();
    assert!(closed(&mut idle).await);
    assert!(TcpStream::connect(&address).await.is_err(), "the listener is closed");
}

#[tokio::test]
async fn a_client_that_stops_reading_is_disconnected_after_the_write_timeout() {
    let write_timeout = Duration::from_millis(500);
    let (address, _stop, _task) = start_with(|settings| settings.write_timeout = write_timeout).await;
    // A small receive buffer, and 64 KiB echoes pipelined without ever reading: the replies fill
    // this socket's buffer and the server's send buffer, then the server's write can make no
    // progress (and it reads no more requests until it has answered, so this side's writes block
    // too, once the server's receive buffer is full).
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket.connect(address.parse().unwrap()).await.unwrap();
    let (_reader, mut writer) = stream.into_split();
    let value = "x".repeat(64 << 10);
    let echo = format!("*2\r\n$4\r\nECHO\r\n${}\r\n{value}\r\n", value.len());
    let started = Instant::now();
    let sender = tokio::spawn(async move {
        // Ends only when the server closed the connection (the write then fails).
        while writer.write_all(echo.as_bytes()).await.is_ok() {}
    });
    tokio::time::timeout(write_timeout + TIMEOUT, sender)
        .await
        .expect("the server closed the connection of the client that stopped reading")
        .unwrap();
    let elapsed = started.elapsed();
    assert!(elapsed >= write_timeout, "closed after {elapsed:?}, before the write timeout");

    // It was the write timeout that closed it (counted), and the connection is gone: this is the
    // only one left.
    let mut other = TcpStream::connect(&address).await.unwrap();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        other.write_all(b"INFO clients stats\r\n").await.unwrap();
        let info = read_bulk(&mut other).await;
        if info.contains("connected_clients:1\r\n") {
            assert!(info.contains("onekv_write_timeout_disconnections:1\r\n"), "{info}");
            break;
        }
        assert!(Instant::now() < deadline, "the stalled connection was not released: {info}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads one bulk string reply (`$len\r\n...\r\n`, nothing after it) and returns its text.
async fn read_bulk(stream: &mut TcpStream) -> String {
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        if let Some(end) = received.windows(2).position(|pair| pair == b"\r\n") {
            let header = std::str::from_utf8(&received[..end]).unwrap();
            let len: usize = header.strip_prefix('$').and_then(|len| len.parse().ok()).expect("a bulk reply");
            let body = end + 2;
            if received.len() >= body + len + 2 {
                return String::from_utf8(received[body..body + len].to_vec()).unwrap();
            }
        }
        let read =
            tokio::time::timeout(TIMEOUT, stream.read(&mut buffer)).await.expect("a reply in time").unwrap();
        assert!(read > 0, "the connection closed mid-reply");
        received.extend_from_slice(&buffer[..read]);
    }
}

#[tokio::test]
async fn hello_switches_the_connection_between_resp2_and_resp3() {
    let (address, _stop, _task) = start(8).await;
    let mut stream = TcpStream::connect(&address).await.unwrap();
    let hello = |proto: u8, map: &str| {
        format!(
            "{map}$6\r\nserver\r\n$5\r\nonekv\r\n$7\r\nversion\r\n$5\r\n7.0.0\r\n$5\r\nproto\r\n:{proto}\r\n\
             $2\r\nid\r\n:1\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n\
             $7\r\nmodules\r\n*0\r\n"
        )
    };
    // RESP3: a map, and nulls as `_` (the empty key reads as absent without asking the cluster).
    stream
        .write_all(b"HELLO 3\r\nGET \"\"\r\nMGET \"\"\r\nCONFIG GET port\r\nCLIENT SETINFO lib-name t\r\nHELLO 4\r\n")
        .await
        .unwrap();
    let port = address.rsplit_once(':').unwrap().1;
    let expected = format!(
        "{}_\r\n*1\r\n_\r\n%1\r\n$4\r\nport\r\n${}\r\n{port}\r\n+OK\r\n\
         -NOPROTO sorry, this protocol version is not supported\r\n",
        hello(3, "%7\r\n"),
        port.len()
    );
    let received = read_exactly(&mut stream, expected.len()).await;
    assert_eq!(String::from_utf8_lossy(&received), expected);
    stream.write_all(b"CLIENT INFO\r\n").await.unwrap();
    let received = String::from_utf8(read_exactly(&mut stream, 8).await).unwrap();
    assert!(received.starts_with("=") && received.contains("txt:id=1 addr=127.0.0.1:"), "{received}");
    // Back to RESP2: the HELLO reply is a flat array, the null a `$-1`.
    let mut stream = TcpStream::connect(&address).await.unwrap();
    stream.write_all(b"HELLO 3\r\nHELLO 2\r\nGET \"\"\r\nMGET \"\"\r\n").await.unwrap();
    let first = hello(3, "%7\r\n").replace(":1\r\n$4", ":2\r\n$4");
    let expected =
        format!("{first}{}$-1\r\n*1\r\n$-1\r\n", hello(2, "*14\r\n").replace(":1\r\n$4", ":2\r\n$4"));
    let received = read_exactly(&mut stream, expected.len()).await;
    assert_eq!(String::from_utf8_lossy(&received), expected);
}

#[tokio::test]
async fn pipelined_reads_inside_multi_are_queued_on_the_connection() {
    let (address, _stop, _task) = start_with(|settings| settings.client_options.max_attempts = 1).await;
    let mut stream = TcpStream::connect(&address).await.unwrap();
    // Outside MULTI a run of GETs runs concurrently on copies of the connection's state; inside
    // it each must be queued on the connection itself, or EXEC would run without them.
    stream.write_all(b"MULTI\r\nGET a\r\nGET b\r\nSTRLEN c\r\nDISCARD\r\nEXEC\r\n").await.unwrap();
    let expected: &[u8] = b"+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n+OK\r\n-ERR EXEC without MULTI\r\n";
    assert_eq!(read_exactly(&mut stream, expected.len()).await, expected);
    // EXEC of queued reads needs the cluster (which this test has not): it fails, which shows
    // the reads were in the queue (lost, EXEC would answer just the ECHO).
    stream.write_all(b"MULTI\r\nGET a\r\nGET b\r\nECHO x\r\nEXEC\r\n").await.unwrap();
    let queued: &[u8] = b"+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n-ERR onekv";
    let received = read_exactly(&mut stream, queued.len()).await;
    assert!(received.starts_with(queued), "{}", String::from_utf8_lossy(&received));
}

/// Sends one inline command and reads its reply: a bulk string's payload, or the line.
async fn inline(stream: &mut TcpStream, command: &str) -> String {
    stream.write_all(format!("{command}\r\n").as_bytes()).await.unwrap();
    let mut reply = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let read =
            tokio::time::timeout(TIMEOUT, stream.read(&mut buffer)).await.expect("a reply in time").unwrap();
        assert!(read > 0, "closed before replying to {command}");
        reply.extend_from_slice(&buffer[..read]);
        let text = String::from_utf8_lossy(&reply).into_owned();
        let Some((header, rest)) = text.split_once("\r\n") else { continue };
        match header.strip_prefix('$') {
            Some(len) if rest.len() >= len.parse::<usize>().unwrap() + 2 => {
                return rest[..len.parse::<usize>().unwrap()].to_string();
            }
            Some(_) => continue,
            None => return header.to_string(),
        }
    }
}

#[tokio::test]
async fn client_list_shows_each_open_connection_and_forgets_closed_ones() {
    let (address, _stop, _task) = start(8).await;
    let mut first = TcpStream::connect(&address).await.unwrap();
    let mut second = TcpStream::connect(&address).await.unwrap();
    assert_eq!(inline(&mut second, "CLIENT SETNAME second").await, "+OK");
    assert_eq!(inline(&mut second, "SELECT 4").await, "+OK");
    let list = inline(&mut first, "CLIENT LIST").await;
    assert_eq!(list.lines().count(), 2, "{list}");
    let second_line = list.lines().find(|line| line.contains("name=second")).expect("the named connection");
    assert!(second_line.contains(" db=4 "), "{second_line}");
    assert!(second_line.contains(&format!("addr={}", second.local_addr().unwrap())), "{second_line}");
    drop(second);
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let list = inline(&mut first, "CLIENT LIST").await;
        if list.lines().count() == 1 {
            assert!(!list.contains("name=second"), "{list}");
            break;
        }
        assert!(Instant::now() < deadline, "the closed connection is still listed: {list}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
