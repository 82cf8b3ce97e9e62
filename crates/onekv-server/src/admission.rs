//! Admission of gRPC calls before their bodies are decoded: how many calls of one service are
//! decoded and handled at once, and how large a message it reads at all.
//!
//! Owns [`Admitted`], a wrapper around one tonic service (`Kv` or `Peer`; the two share a port, so
//! each has its own bound and neither can use up the other's), and [`Admission`], its settings. A
//! call first takes one of the service's permits, or is refused at once (UNAVAILABLE, naming the
//! bound; clients and the peer transport retry), then its message's length is read from the gRPC
//! frame header, before the message is buffered: a message over the service's largest is refused
//! with the service's own status (the `Kv` service's names the limits, where tonic would answer a
//! bare OUT_OF_RANGE). Memory spent on requests is then at most the permits times the largest
//! message (times the decoding copies). The permit is held until the answer has been sent (the
//! response body is done), so a streamed answer keeps its call admitted until its last result.
//!
//! Calls over the bound are refused rather than queued: a queued call's body stays unread, and
//! unread bodies hold the HTTP/2 connection's flow-control window, so on a connection shared by
//! many calls (a client's) the queued calls would stall the admitted ones until they gave up.
//!
//! Does not own authentication (that is [`crate::auth`], an interceptor outside this wrapper, so a
//! refused call takes no permit) nor what the services do with the calls.

use std::convert::Infallible;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body as _, Frame, SizeHint};
use tokio::sync::Semaphore;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;

/// Length of a gRPC message's frame header: a compression flag and a 4-byte big-endian length.
const GRPC_HEADER_BYTES: usize = 5;

/// Builds the status for a message of the given length over the limit.
type TooLarge = dyn Fn(usize) -> Status + Send + Sync;

/// The bounds of one service.
pub struct Admission {
    /// Calls decoded and handled at once.
    max_concurrent: usize,
    /// What the bound is called in messages (a configuration key).
    limit_name: &'static str,
    /// Largest message read.
    max_message_bytes: usize,
    too_large: Box<TooLarge>,
    permits: Arc<Semaphore>,
    /// Optional budget of message bytes admitted at once, in KiB units, and its total.
    bytes: Option<(Arc<Semaphore>, u32)>,
}

/// The unit of the bytes budget.
const BUDGET_UNIT: usize = 1024;

impl Admission {
    /// At most `max_concurrent` calls (at least 1) at once, called `limit_name` in refusals.
    /// Messages over `max_message_bytes` get `too_large(length)`.
    pub fn new(
        max_concurrent: usize,
        limit_name: &'static str,
        max_message_bytes: usize,
        too_large: impl Fn(usize) -> Status + Send + Sync + 'static,
    ) -> Admission {
        let max_concurrent = max_concurrent.max(1);
        Admission {
            max_concurrent,
            limit_name,
            max_message_bytes,
            too_large: Box::new(too_large),
            permits: Arc::new(Semaphore::new(max_concurrent)),
            bytes: None,
        }
    }

    /// Also admits at most `budget` bytes of messages at once (by the lengths their frame headers
    /// declare; raised to the largest message if below it, so any one message can get in alone).
    /// Calls over it are refused like calls over the count, so a few large messages cannot make
    /// the small ones wait.
    pub fn with_bytes_budget(mut self, budget: usize) -> Admission {
        let units = budget.max(self.max_message_bytes).div_ceil(BUDGET_UNIT);
        let units = u32::try_from(units).unwrap_or(u32::MAX).min(Semaphore::MAX_PERMITS as u32);
        self.bytes = Some((Arc::new(Semaphore::new(units as usize)), units));
        self
    }

    /// Bytes of messages admitted now, rounded up to KiB (0 without a bytes budget).
    pub fn bytes_in_flight(&self) -> usize {
        self.bytes
            .as_ref()
            .map_or(0, |(semaphore, total)| (*total as usize - semaphore.available_permits()) * BUDGET_UNIT)
    }

    /// Calls admitted now (holding a permit).
    pub fn in_flight(&self) -> usize {
        self.max_concurrent - self.permits.available_permits()
    }

    /// The most calls admitted at once.
    pub fn max_concurrent(&self) -> usize {
        self.max_concurrent
    }

    /// Takes a permit and checks the message length; gives back the request with its body intact.
    async fn admit(&self, request: http::Request<Body>) -> Result<(http::Request<Body>, Permits), Status> {
        let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
            // (The semaphore is never closed: no permit means all are taken.)
            return Err(Status::unavailable(format!(
                "overloaded: {} = {} calls are in flight; retry shortly",
                self.limit_name, self.max_concurrent
            )));
        };
        let (parts, mut body) = request.into_parts();
        let Peek { frames, length, ended } = peek_message_length(&mut body).await?;
        if let Some(length) = length
            && length > self.max_message_bytes
        {
            return Err((self.too_large)(length));
        }
        let bytes = match &self.bytes {
            None => None,
            Some((semaphore, total)) => {
                let units = u32::try_from(length.unwrap_or(0).div_ceil(BUDGET_UNIT)).unwrap_or(u32::MAX);
                let units = units.clamp(1, *total);
                let Ok(permit) = Arc::clone(semaphore).try_acquire_many_owned(units) else {
                    return Err(Status::unavailable(format!(
                        "overloaded: {} KiB of messages are being read and handled, and this one's \
                         {} KiB do not fit within the node's {} KiB; retry shortly",
                        *total as usize - semaphore.available_permits(),
                        units,
                        total
                    )));
                };
                Some(permit)
            }
        };
        let permit = Permits { _count: permit, _bytes: bytes };
        let body = Body::new(Peeked { peeked: frames.into_iter().collect(), rest: body, rest_done: ended });
        Ok((http::Request::from_parts(parts, body), permit))
    }
}

/// What an admitted call holds until its answer has been sent: until its response body is done
/// (so a streamed answer, a `Multi`'s, keeps its call admitted while results are still coming).
struct Permits {
    _count: tokio::sync::OwnedSemaphorePermit,
    _bytes: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// A response body and the permits of its call, given back when the body is dropped.
struct Answering {
    body: Body,
    _permits: Permits,
}

impl http_body::Body for Answering {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// What reading the start of a body found.
struct Peek {
    /// The frames read, to be replayed.
    frames: Vec<Frame<Bytes>>,
    /// The first message's length, or `None` if the body ended first (tonic then reports it).
    length: Option<usize>,
    /// Whether the body has ended (it is not polled again).
    ended: bool,
}

/// Reads the body until the first message's frame header is in.
async fn peek_message_length(body: &mut Body) -> Result<Peek, Status> {
    let mut frames = Vec::new();
    let mut header = BytesMut::new();
    while header.len() < GRPC_HEADER_BYTES {
        match poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
            None => return Ok(Peek { frames, length: None, ended: true }),
            Some(Err(status)) => return Err(status),
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let wanted = (GRPC_HEADER_BYTES - header.len()).min(data.len());
                    header.extend_from_slice(&data[..wanted]);
                }
                let trailers = frame.is_trailers();
                frames.push(frame);
                if trailers {
                    // Trailers end a body.
                    return Ok(Peek { frames, length: None, ended: true });
                }
            }
        }
    }
    let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    Ok(Peek { frames, length: Some(length), ended: false })
}

/// A request body whose first frames were read to peek at the message length: replays them, then
/// the rest.
struct Peeked {
    peeked: std::collections::VecDeque<Frame<Bytes>>,
    rest: Body,
    /// Set once `rest` returned `None` (it is not polled again).
    rest_done: bool,
}

impl http_body::Body for Peeked {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(frame) = self.peeked.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if self.rest_done {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut self.rest).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.rest_done = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.peeked.is_empty() && (self.rest_done || self.rest.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let peeked: usize = self.peeked.iter().filter_map(Frame::data_ref).map(Bytes::len).sum();
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + peeked as u64);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + peeked as u64);
        }
        hint
    }
}

/// A tonic service with its [`Admission`] in front. Keeps the inner service's name, so it is added
/// to a server like the service itself.
pub struct Admitted<S> {
    inner: S,
    admission: Arc<Admission>,
}

impl<S: Clone> Clone for Admitted<S> {
    fn clone(&self) -> Self {
        Admitted { inner: self.inner.clone(), admission: Arc::clone(&self.admission) }
    }
}

impl<S> Admitted<S> {
    /// `inner` behind `admission`.
    pub fn new(inner: S, admission: Admission) -> Admitted<S> {
        Admitted { inner, admission: Arc::new(admission) }
    }

    /// The bounds, shared by every clone.
    pub fn admission(&self) -> &Arc<Admission> {
        &self.admission
    }
}

impl<S: NamedService> NamedService for Admitted<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Admitted<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<http::Response<Body>, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Readiness is the permit, taken per call in `call` (refusing clearly when there is none),
        // not here, where a call over the bound would wait unanswered.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The usual tower dance: the clone that was (trivially) made ready is the one called.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let admission = Arc::clone(&self.admission);
        Box::pin(async move {
            let (request, permit) = match admission.admit(request).await {
                Ok(admitted) => admitted,
                Err(status) => return Ok(status.into_http()),
            };
            poll_fn(|cx| inner.poll_ready(cx)).await?;
            let response = inner.call(request).await?;
            Ok(response.map(|body| Body::new(Answering { body, _permits: permit })))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body yielding the given chunks one frame at a time.
    struct Chunks(std::collections::VecDeque<Bytes>);

    impl http_body::Body for Chunks {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            Poll::Ready(self.0.pop_front().map(|chunk| Ok(Frame::data(chunk))))
        }
    }

    fn body(chunks: &[&'static [u8]]) -> Body {
        Body::new(Chunks(chunks.iter().map(|chunk| Bytes::from_static(chunk)).collect()))
    }

    async fn read_all(mut body: Body) -> Vec<u8> {
        let mut bytes = Vec::new();
        while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            bytes.extend_from_slice(frame.unwrap().data_ref().unwrap());
        }
        bytes
    }

    #[tokio::test]
    async fn a_header_split_across_frames_is_read_and_every_byte_replayed() {
        let mut original = body(&[b"\x00\x00", b"\x00\x00\x05he", b"llo"]);
        let peek = peek_message_length(&mut original).await.unwrap();
        assert_eq!(peek.length, Some(5));
        assert!(!peek.ended);
        let replayed =
            Body::new(Peeked { peeked: peek.frames.into_iter().collect(), rest: original, rest_done: false });
        assert_eq!(read_all(replayed).await, b"\x00\x00\x00\x00\x05hello");
    }

    /// A streamed answer (a `Multi`'s) keeps its call admitted until its body is done, not only
    /// until the handler has returned the (lazy) stream.
    #[tokio::test]
    async fn a_call_stays_admitted_until_its_answer_has_been_sent() {
        use tower::ServiceExt as _;
        let inner = tower::service_fn(|_request: http::Request<Body>| async {
            Ok::<_, Infallible>(http::Response::new(body(&[b"first", b"last"])))
        });
        let served = Admitted::new(
            inner,
            Admission::new(4, "limit", 1 << 20, |length| Status::invalid_argument(length.to_string())),
        );
        let counts = Arc::clone(served.admission());
        let request = http::Request::new(body(&[b"\x00\x00\x00\x00\x02hi"]));
        let response = served.oneshot(request).await.unwrap();
        assert_eq!(counts.in_flight(), 1, "answered but not yet sent");
        assert_eq!(read_all(response.into_body()).await, b"firstlast");
        assert_eq!(counts.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_body_too_short_for_a_header_has_no_length_and_is_replayed_as_is() {
        let mut original = body(&[b"\x00\x01"]);
        let peek = peek_message_length(&mut original).await.unwrap();
        assert_eq!((peek.length, peek.ended), (None, true));
        let replayed =
            Body::new(Peeked { peeked: peek.frames.into_iter().collect(), rest: original, rest_done: true });
        assert_eq!(read_all(replayed).await, b"\x00\x01");
    }
}
