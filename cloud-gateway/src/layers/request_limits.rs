//! What a client can make the gateway hold, and for how long. Anyone who
//! reaches the gRPC port could otherwise take the gateway's memory, and
//! with it every controller: the health and reflection services need no
//! token. So every resource a connection or a request can pin is bounded:
//!
//! - connections: at most `max_connections` at once (more are closed as
//!   they arrive), each closed after `idle_timeout` without a byte either
//!   way; HTTP/2 keepalive pings find dead peers;
//! - per connection: at most `max_concurrent_streams` streams, and HTTP/2
//!   flow-control windows cap the bytes a client can send ahead of what the
//!   gateway reads (`stream_window`, `connection_window`);
//! - per request: the message may be no larger than the largest valid
//!   request of its method ([`crate::limits::max_request_bytes`]),
//!   which is checked from the length prefix before the body is read; the
//!   whole body must arrive within `request_receive_timeout`;
//! - across the process: at most `max_in_flight` requests (a request counts
//!   until its response is sent), at most `max_in_flight_per_caller` of one
//!   authenticated caller (so one identity cannot take them all), at most
//!   `max_in_flight_public` unauthenticated, and at most
//!   `max_request_bytes` of request bodies held at once. Past a limit a
//!   call is refused at once with `RESOURCE_EXHAUSTED` and a retry delay;
//!   only a caller past its own share waits, two seconds at most;
//! - the unauthenticated services get the smallest limits: 1 KiB messages,
//!   64 KiB per reflection stream, and streams that end after
//!   `public_stream_max_age`.
//!
//! The layer sits inside auth, so no request body is read before its
//! caller was authenticated (the public services excepted).

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt as _;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tonic::body::Body;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};
use tower::{Layer, Service};

use crate::metrics::{Metrics, RefusalLabels};

/// The gateway's limits; see the module documentation.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    pub max_connections: usize,
    pub max_concurrent_streams: u32,
    pub stream_window: u32,
    pub connection_window: u32,
    pub max_in_flight: usize,
    pub max_in_flight_per_caller: usize,
    pub max_in_flight_public: usize,
    pub max_request_bytes: usize,
    pub request_receive_timeout: Duration,
    pub idle_timeout: Duration,
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    pub public_stream_max_age: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 128,
            max_concurrent_streams: 100,
            stream_window: 64 * 1024,
            connection_window: 256 * 1024,
            max_in_flight: 512,
            max_in_flight_per_caller: 128,
            max_in_flight_public: 32,
            max_request_bytes: 64 * 1024 * 1024,
            request_receive_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            public_stream_max_age: Duration::from_secs(60),
        }
    }
}

/// The largest message of an unauthenticated unary call (a health check
/// names a service) and of unknown paths.
const PUBLIC_MESSAGE: usize = 1024;
/// The most bytes a client may send on one reflection stream.
const REFLECTION_STREAM: usize = 64 * 1024;
/// How long a call waits for a slot of its caller's share.
const CALLER_WAIT: Duration = Duration::from_secs(2);
/// The retry delay of a call refused for load.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// A gRPC message's prefix: a compression flag and a 4-byte length.
const PREFIX: usize = 5;
/// Responses go out in pieces of at most this size. HTTP/2 takes the next
/// piece only when the client's window has room, so a response the client
/// does not read stays in its body, held by the request's permits, and
/// not in the connection's send buffer.
const PIECE: usize = 8 * 1024;

/// How a method is admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Class {
    /// Needs no token.
    public: bool,
    /// The client streams (reflection) or the server does (health Watch):
    /// the body passes through, counted, instead of being read whole.
    streaming: bool,
    /// The largest message (unary), or all bytes of the stream.
    max_bytes: usize,
}

fn class(path: &str) -> Class {
    match path {
        "/grpc.health.v1.Health/Check" => Class {
            public: true,
            streaming: false,
            max_bytes: PUBLIC_MESSAGE,
        },
        "/grpc.health.v1.Health/Watch" => Class {
            public: true,
            streaming: true,
            max_bytes: PUBLIC_MESSAGE,
        },
        p if p.starts_with("/grpc.reflection.") => Class {
            public: true,
            streaming: true,
            max_bytes: REFLECTION_STREAM,
        },
        p => Class {
            public: false,
            streaming: false,
            max_bytes: crate::limits::max_request_bytes(p).unwrap_or(PUBLIC_MESSAGE),
        },
    }
}

/// The shared state of the limits.
struct Gate {
    limits: Limits,
    in_flight: Arc<Semaphore>,
    /// Per authenticated caller, so one identity cannot take every slot.
    per_caller: std::sync::Mutex<std::collections::HashMap<String, Arc<Semaphore>>>,
    public: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    metrics: Metrics,
}

impl Gate {
    fn refused(&self, why: &'static str) {
        self.metrics
            .requests_refused
            .get_or_create(&RefusalLabels { reason: why })
            .inc();
    }

    fn in_flight_changed(&self) {
        let used = self.limits.max_in_flight - self.in_flight.available_permits();
        self.metrics.requests_in_flight.set(used as i64);
        let bytes = self.limits.max_request_bytes - self.bytes.available_permits();
        self.metrics.request_bytes_in_flight.set(bytes as i64);
    }
}

/// A refusal for load: `RESOURCE_EXHAUSTED` with a retry delay.
fn busy(what: &str) -> Status {
    let mut details = ErrorDetails::with_error_info(
        ccm_proto::reason::GATEWAY_BUSY,
        ccm_proto::reason::DOMAIN,
        [],
    );
    details.set_retry_info(Some(RETRY_AFTER));
    Status::with_error_details(
        Code::ResourceExhausted,
        format!("the gateway is at its limit of {what}; retry after {RETRY_AFTER:?}"),
        details,
    )
}

/// The tower layer that applies [`Limits`] to every request.
#[derive(Clone)]
pub struct RequestLimitsLayer {
    gate: Arc<Gate>,
}

impl RequestLimitsLayer {
    /// Applies `limits`, counting refusals in `metrics`.
    pub fn new(limits: Limits, metrics: Metrics) -> Self {
        Self {
            gate: Arc::new(Gate {
                in_flight: Arc::new(Semaphore::new(limits.max_in_flight)),
                per_caller: Default::default(),
                public: Arc::new(Semaphore::new(limits.max_in_flight_public)),
                bytes: Arc::new(Semaphore::new(limits.max_request_bytes)),
                limits,
                metrics,
            }),
        }
    }
}

impl<S> Layer<S> for RequestLimitsLayer {
    type Service = RequestLimitsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestLimitsService {
            inner,
            gate: self.gate.clone(),
        }
    }
}

/// The service [`RequestLimitsLayer`] makes.
#[derive(Clone)]
pub struct RequestLimitsService<S> {
    inner: S,
    gate: Arc<Gate>,
}

/// What a request holds until its response has been sent.
struct Held {
    gate: Arc<Gate>,
    _permits: Vec<OwnedSemaphorePermit>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self._permits.clear();
        self.gate.in_flight_changed();
    }
}

impl<S, ResBody> Service<http::Request<Body>> for RequestLimitsService<S>
where
    S: Service<http::Request<Body>, Response = http::Response<ResBody>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    ResBody::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The clone is ready only after its own poll_ready; swap it in so
        // the ready one handles this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let gate = self.gate.clone();
        Box::pin(async move {
            match admit(&gate, request).await {
                Ok((request, held, deadline)) => {
                    let response = inner.call(request).await?;
                    Ok(response.map(|body| {
                        Body::new(Holding {
                            body,
                            _held: held,
                            deadline: deadline.map(|d| Box::pin(tokio::time::sleep(d))),
                            rest: Bytes::new(),
                            done: false,
                        })
                    }))
                }
                Err(status) => Ok(status.into_http()),
            }
        })
    }
}

/// Admits `request`: takes its permits and, for a unary call, reads its
/// body whole within the receive timeout. Returns the request to serve,
/// what it holds, and a streaming call's lifetime limit.
async fn admit(
    gate: &Arc<Gate>,
    request: http::Request<Body>,
) -> Result<(http::Request<Body>, Held, Option<Duration>), Status> {
    let class = class(request.uri().path());
    let mut permits = Vec::with_capacity(4);
    if let Some(caller) = request.extensions().get::<crate::identity::Caller>() {
        let slots = gate
            .per_caller
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(caller.name.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(gate.limits.max_in_flight_per_caller)))
            .clone();
        // A caller's burst past its share waits briefly for its own calls
        // to finish; only then is it refused.
        match tokio::time::timeout(CALLER_WAIT, slots.acquire_owned()).await {
            Ok(Ok(p)) => permits.push(p),
            _ => {
                gate.refused("caller_in_flight");
                return Err(busy("requests in flight for one caller"));
            }
        }
    }
    match gate.in_flight.clone().try_acquire_owned() {
        Ok(p) => permits.push(p),
        Err(_) => {
            gate.refused("in_flight");
            return Err(busy("requests in flight"));
        }
    }
    if class.public {
        match gate.public.clone().try_acquire_owned() {
            Ok(p) => permits.push(p),
            Err(_) => {
                gate.refused("public_in_flight");
                return Err(busy("unauthenticated requests in flight"));
            }
        }
    }
    gate.in_flight_changed();
    let limits = &gate.limits;
    let (parts, body) = request.into_parts();
    if class.streaming {
        let body = Counted {
            body,
            left: class.max_bytes,
        };
        let held = Held {
            gate: gate.clone(),
            _permits: permits,
        };
        let request = http::Request::from_parts(parts, Body::new(body));
        return Ok((request, held, Some(limits.public_stream_max_age)));
    }
    let read = read_unary(gate, body, class.max_bytes, &parts.uri);
    let (bytes, reservation) =
        match tokio::time::timeout(limits.request_receive_timeout, read).await {
            Ok(result) => result?,
            Err(_) => {
                gate.refused("receive_timeout");
                return Err(Status::deadline_exceeded(format!(
                    "the request did not arrive within {:?}",
                    limits.request_receive_timeout
                )));
            }
        };
    permits.extend(reservation);
    let held = Held {
        gate: gate.clone(),
        _permits: permits,
    };
    gate.in_flight_changed();
    let request = http::Request::from_parts(parts, Body::new(http_body_util::Full::new(bytes)));
    Ok((request, held, None))
}

/// Reads a unary request's one message: refused before it is read when
/// its length prefix says it is larger than any valid request of the
/// method, or when the process holds too many request bytes already.
async fn read_unary(
    gate: &Gate,
    mut body: Body,
    max: usize,
    uri: &http::Uri,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), Status> {
    let mut buf = BytesMut::new();
    let mut reservation = None;
    let mut expected = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Status::cancelled(format!("request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        if expected.is_none() && buf.len() >= PREFIX {
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if len > max {
                gate.refused("too_large");
                return Err(Status::resource_exhausted(format!(
                    "a message of {len} bytes is larger than any valid request to {} ({max} bytes)",
                    uri.path()
                )));
            }
            let total = PREFIX + len;
            match u32::try_from(total)
                .ok()
                .and_then(|n| gate.bytes.clone().try_acquire_many_owned(n).ok())
            {
                Some(permit) => reservation = Some(permit),
                None => {
                    gate.refused("request_bytes");
                    return Err(busy("request bytes held"));
                }
            }
            buf.reserve(total.saturating_sub(buf.len()));
            expected = Some(total);
        }
        if let Some(total) = expected
            && buf.len() > total
        {
            return Err(Status::invalid_argument(
                "a unary request carries exactly one message",
            ));
        }
    }
    Ok((buf.freeze(), reservation))
}

/// A streaming request's body, ended with an error once the client sent
/// more than its share.
struct Counted {
    body: Body,
    left: usize,
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let len = frame.data_ref().map_or(0, Bytes::len);
                if len > this.left {
                    this.left = 0;
                    return Poll::Ready(Some(Err(Status::resource_exhausted(
                        "this stream sent more than an unauthenticated stream may",
                    ))));
                }
                this.left -= len;
                Poll::Ready(Some(Ok(frame)))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A response body that holds its request's permits until it has been
/// sent (an unread response still costs memory), hands it out in pieces
/// of [`PIECE`] bytes, and ends a streaming response with
/// `DEADLINE_EXCEEDED` at its deadline.
struct Holding<B> {
    body: B,
    _held: Held,
    deadline: Option<Pin<Box<Sleep>>>,
    /// What is left of the last data frame.
    rest: Bytes,
    done: bool,
}

impl<B> http_body::Body for Holding<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Data = Bytes;
    type Error = tonic::codegen::StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(deadline) = &mut this.deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            this.done = true;
            let mut trailers = http::HeaderMap::new();
            let status = Status::deadline_exceeded("unauthenticated streams end after a while");
            let _ = status.add_header(&mut trailers);
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        if this.rest.is_empty() {
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => this.rest = data,
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                other => return other.map(|f| f.map(|r| r.map_err(Into::into))),
            }
        }
        let piece = this.rest.split_to(this.rest.len().min(PIECE));
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.done || (self.rest.is_empty() && self.body.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Accepted connections, at most `max_connections` at once; more are
/// closed as they arrive. Each closes after `idle_timeout` without traffic.
pub fn incoming(
    listener: TcpListener,
    limits: &Limits,
    metrics: Metrics,
) -> impl Stream<Item = io::Result<Guarded>> + Send + 'static {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let idle = limits.idle_timeout;
    futures::stream::unfold(listener, move |listener| {
        let (slots, metrics) = (slots.clone(), metrics.clone());
        async move {
            loop {
                let (stream, remote) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    // Out of file descriptors and the like: wait a little
                    // rather than spin.
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    metrics.connections_refused.inc();
                    drop(stream);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                metrics.connections.inc();
                let guarded = Guarded {
                    local: stream.local_addr().ok(),
                    remote: Some(remote),
                    stream,
                    _slot: slot,
                    idle,
                    timer: Box::pin(tokio::time::sleep(idle)),
                    metrics: metrics.clone(),
                };
                return Some((Ok(guarded), listener));
            }
        }
    })
    .boxed()
}

/// A connection holding one of the connection slots.
pub struct Guarded {
    stream: TcpStream,
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
    _slot: OwnedSemaphorePermit,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
    metrics: Metrics,
}

impl Guarded {
    /// The peer's address.
    pub fn remote(&self) -> Option<SocketAddr> {
        self.remote
    }

    fn touched(&mut self) {
        self.timer.as_mut().reset(Instant::now() + self.idle);
    }

    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.timer.as_mut().poll(cx).is_ready()
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.metrics.connections.dec();
    }
}

impl Connected for Guarded {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        TcpConnectInfo {
            local_addr: self.local,
            remote_addr: self.remote,
        }
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    self.touched();
                }
                Poll::Ready(result)
            }
            Poll::Pending => {
                if self.idle_expired(cx) {
                    Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "connection idle for too long",
                    )))
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write(cx, buf);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.touched();
        }
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_methods_get_the_smallest_limits() {
        let health = class("/grpc.health.v1.Health/Check");
        assert!(health.public && !health.streaming);
        assert_eq!(health.max_bytes, PUBLIC_MESSAGE);
        let reflection = class("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo");
        assert!(reflection.public && reflection.streaming);
        let lookup = class("/cloudgateway.v1.Instances/GetInstances");
        assert!(!lookup.public && lookup.max_bytes > 1_000_000);
        assert_eq!(class("/nobody.Knows/This").max_bytes, PUBLIC_MESSAGE);
    }
}
