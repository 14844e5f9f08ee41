//! The outermost layer of every service of phase 2 (HTTP and gRPC alike): logs, per client
//! request, each request that arrives at a hop and each part of each answer a hop sends (head
//! and body frames). The last of them after a client's cancel is that request's
//! cancel-to-no-new-I/O time, on the real clock.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use cancel_scope::wire::service_budget::{self, ServiceBudget};
use cancel_scope::wire::{grpc_timeout, Admission};
use cancel_scope::{Report, Scope};
use http_body::Frame;
use tokio::time::Instant;

/// The client request a request is made for (set by the client, copied by every hop).
pub const REQ: &str = "x-gate-req";
/// The hop (its key in the log) that sent a request.
pub const PARENT: &str = "x-gate-parent";
/// The sender's call the request is (with [`PARENT`], the key of its [`CallRec`]).
pub const CALL: &str = "x-gate-call";
/// The key of a request in the log, set by this layer for the hop's handler.
pub const HOP: &str = "x-gate-hop";

/// One request a service received.
#[derive(Debug, Default)]
pub struct Hop {
    pub req: u64,
    pub parent: Option<(u64, u64)>,
    /// The budget its headers carried (the shorter of `service-budget` and `grpc-timeout`).
    pub carried: Option<Duration>,
    pub entered: bool,
    pub ingress: Option<Instant>,
    pub deadline: Option<Instant>,
    /// Admitted past the rejection cap (a refusal turned into a shadow decision).
    pub over_cap: bool,
    pub report: Option<Report>,
}

/// One call a hop made, as it was about to send it.
#[derive(Debug)]
pub struct CallRec {
    pub before: Instant,
    pub deadline: Option<Instant>,
    pub cancelled: bool,
    pub live: bool,
}

/// Everything phase 2 logs.
#[derive(Debug, Default)]
pub struct Log {
    pub hops: Vec<Hop>,
    pub calls: HashMap<(u64, u64), CallRec>,
    pub ops: HashMap<String, u64>,
    pub early_reports: HashMap<String, Report>,
    pub last_io: HashMap<u64, (Instant, &'static str)>,
}

pub type Shared = Arc<Mutex<Log>>;

/// Logs I/O `what` for the client request `req`, now.
pub fn io(log: &Shared, req: u64, what: &'static str) {
    let now = Instant::now();
    let mut log = log.lock().unwrap();
    let last = log.last_io.entry(req).or_insert((now, what));
    if now >= last.0 {
        *last = (now, what);
    }
}

pub fn header_u64<B>(req: &http::Request<B>, name: &str) -> Option<u64> {
    req.headers().get(name)?.to_str().ok()?.parse().ok()
}

/// The budget `headers` carry: the shorter of `service-budget` and `grpc-timeout`.
fn carried(headers: &http::HeaderMap) -> Option<Duration> {
    let budget = headers
        .get(service_budget::HEADER)
        .and_then(|v| ServiceBudget::parse(v.as_bytes()).ok())
        .map(|b| b.remaining());
    let timeout = headers
        .get(grpc_timeout::HEADER)
        .and_then(|v| grpc_timeout::decode_bytes(v.as_bytes()).ok());
    budget.into_iter().chain(timeout).min()
}

/// The handler of the hop `key` starts in its scope: notes what admission decided, and takes
/// the report that came first, if it did. Returns the client request's id.
pub fn enter(log: &Shared, key: u64, admission: Option<&Admission>) -> u64 {
    let scope = Scope::current();
    let mut l = log.lock().unwrap();
    let op = scope
        .operation()
        .map(|o| o.id().to_owned())
        .unwrap_or_default();
    let early = l.early_reports.remove(&op);
    l.ops.insert(op, key);
    let hop = &mut l.hops[key as usize];
    hop.entered = true;
    hop.deadline = scope.deadline();
    hop.ingress = admission.map(Admission::ingress);
    hop.over_cap = admission.is_some_and(Admission::is_over_rejection_cap);
    if early.is_some() {
        hop.report = early;
    }
    hop.req
}

/// The layer of [`IoLog`].
#[derive(Clone, Debug)]
pub struct IoLogLayer(pub Shared);

impl<S> tower::Layer<S> for IoLogLayer {
    type Service = IoLog<S>;

    fn layer(&self, inner: S) -> IoLog<S> {
        IoLog {
            inner,
            log: self.0.clone(),
        }
    }
}

/// Logs a request's arrival and every part of its answer.
#[derive(Clone, Debug)]
pub struct IoLog<S> {
    inner: S,
    log: Shared,
}

type Answer<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, B, RB> tower::Service<http::Request<B>> for IoLog<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    RB: Send + 'static,
{
    type Response = http::Response<Logged<RB>>;
    type Error = S::Error;
    type Future = Answer<Self::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let id = header_u64(&req, REQ).unwrap_or(u64::MAX);
        let parent = header_u64(&req, PARENT).zip(header_u64(&req, CALL));
        let below = parent.is_some();
        io(
            &self.log,
            id,
            if below {
                "a request arriving below frontend"
            } else {
                "a request arriving at frontend"
            },
        );
        let key = {
            let mut l = self.log.lock().unwrap();
            l.hops.push(Hop {
                req: id,
                parent,
                carried: carried(req.headers()),
                ..Hop::default()
            });
            l.hops.len() as u64 - 1
        };
        req.headers_mut().insert(HOP, key.into());
        let answer = self.inner.call(req);
        let log = self.log.clone();
        Box::pin(async move {
            let res = answer.await?;
            io(
                &log,
                id,
                if below {
                    "an answer head below frontend"
                } else {
                    "frontend's answer head"
                },
            );
            Ok(res.map(|body| Logged { body, log, id }))
        })
    }
}

/// A response body that logs each frame it yields.
#[derive(Debug)]
pub struct Logged<B> {
    body: B,
    log: Shared,
    id: u64,
}

impl<B: http_body::Body + Unpin> http_body::Body for Logged<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(Some(_)) = &polled {
            io(&self.log, self.id, "a frame of an answer");
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
