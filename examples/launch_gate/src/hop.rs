//! Phase 1's network in process: every hop is the real `Admit` layer under an endpoint policy,
//! every call goes out through the real `Propagate` layer, and between them a transport that
//! logs what crossed the wire (the budget headers the egress wrote, on a real `HeaderMap`),
//! takes a connection permit, plays the seed's faults and hands the request to the next hop's
//! admission.

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use cancel_scope::integrations::tower::{AdmitLayer, PropagateLayer};
use cancel_scope::wire::service_budget::{self, ServiceBudget};
use cancel_scope::wire::{EgressPolicy, EndpointPolicy};
use cancel_scope::{Lifecycle, Report, Scope};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tower::{Layer as _, Service, ServiceExt as _};

/// A boxed `Send` future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The header that names a request on the gate's wire (its index in the log).
const SEND_ID: &str = "x-gate-send";

/// A deliberate bug in the harness, to show that the gate it breaks fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sabotage {
    /// None: the library's own behaviour.
    None,
    /// A hop's egress writes a budget 50 ms longer than the one the library wrote.
    GrowBudget,
    /// A hop with calls to make sends one more, bypassing the library, once it is cancelled.
    SendAfterCancel,
    /// The transport never releases the connection permit of a tree's first call.
    LeakPermit,
    /// The client calls without the library, and the first hop's answer takes 5 ms more on
    /// the way back.
    LateAnswer,
}

/// What a leaf does with a request.
#[derive(Clone, Copy, Debug)]
pub enum Leaf {
    /// Works this long (stopping on cancel), answers 200.
    Respond(Duration),
    /// Works this long, answers 500.
    Fail(Duration),
    /// Never answers.
    Hang,
    /// Works this long whatever happens (no scope), answers 200.
    IgnoreCancel(Duration),
}

/// How a hop makes one of its calls.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// Once.
    Once,
    /// Up to this many attempts while they fail (idempotent `PUT`s).
    Retry(u32),
    /// A second copy after this delay if the first has not answered; the first answer wins.
    Hedge(Duration),
}

/// The seed's faults on one call's transport.
#[derive(Clone, Copy, Debug)]
pub struct Wire {
    /// Connect time; `None`: the connect never completes.
    pub connect: Option<Duration>,
    /// The answer is lost on the way back (the call waits until its budget ends).
    pub lose_response: bool,
}

impl Wire {
    /// No fault: connected at once, the answer delivered.
    pub const CLEAN: Wire = Wire {
        connect: Some(Duration::ZERO),
        lose_response: false,
    };
}

/// One outgoing call of a hop.
#[derive(Clone, Debug)]
pub struct Call {
    /// How the call is made.
    pub mode: Mode,
    /// The HTTP method (`GET` read-only, `PUT` idempotent, `POST` side-effecting).
    pub method: http::Method,
    /// The call's egress policy: reserve, cap, pad, minimum useful budget.
    pub egress: EgressPolicy,
    /// The transport's faults.
    pub wire: Wire,
    /// The hop called.
    pub node: Arc<Node>,
}

/// A hop of a tree.
#[derive(Clone, Debug)]
pub struct Node {
    /// Its admission policy.
    pub policy: EndpointPolicy,
    /// What it does.
    pub kind: Kind,
}

/// A hop's work.
#[derive(Clone, Debug)]
pub enum Kind {
    /// A leaf.
    Leaf(Leaf),
    /// Calls, all at once (a fan-out when there are several).
    Calls(Vec<Call>),
}

/// One request on the wire.
#[derive(Clone, Debug)]
pub struct Sent {
    /// The admitted request that sent it (`None`: the client).
    pub from: Option<u64>,
    /// When the egress wrote its headers.
    pub written: Instant,
    /// The `service-budget` remaining it carried, as decoded.
    pub carried: Option<Duration>,
    /// The sender scope's deadline.
    pub sender_deadline: Option<Instant>,
    /// The sender was cancelled when it wrote.
    pub sender_cancelled: bool,
    /// The sender could hold a live registered child when it wrote: not cancelled, and
    /// running (not closed with its work done).
    pub sender_live: bool,
    /// When it reached the downstream (after its connection wait).
    pub arrived: Instant,
    /// The downstream admitted it: its deadline (`None`: refused, or not there yet).
    pub admitted: Option<Option<Instant>>,
    /// The downstream's report, once quiet.
    pub report: Option<Report>,
    /// The last instant a byte of this request or of its answer crossed the wire.
    pub last_io: Instant,
}

/// The log and the resources of one tree.
#[derive(Debug)]
pub struct World {
    /// The harness's bug, if any.
    pub sabotage: Sabotage,
    /// The connection pool.
    pub pool: Arc<Semaphore>,
    /// Its size.
    pub pool_size: usize,
    /// Connections open.
    pub conns: AtomicU64,
    /// Transports still running.
    pub in_flight: AtomicU64,
    /// The wire's log.
    pub sent: Mutex<Vec<Sent>>,
    /// Permits forgotten by [`Sabotage::LeakPermit`] (one per tree).
    pub leaked: AtomicU64,
}

impl World {
    /// A world for one tree.
    pub fn new(sabotage: Sabotage, pool_size: usize) -> Arc<World> {
        Arc::new(World {
            sabotage,
            pool: Arc::new(Semaphore::new(pool_size)),
            pool_size,
            conns: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            sent: Mutex::new(Vec::new()),
            leaked: AtomicU64::new(0),
        })
    }

    fn update(&self, id: u64, f: impl FnOnce(&mut Sent)) {
        f(&mut self.sent.lock().unwrap()[id as usize]);
    }

    /// Permits and connections held now.
    pub fn held(&self) -> u64 {
        (self.pool_size - self.pool.available_permits()) as u64 + self.conns.load(Ordering::SeqCst)
    }
}

/// Counted while a transport runs or a connection is open.
struct Counted<'a>(&'a AtomicU64);

impl<'a> Counted<'a> {
    fn new(c: &'a AtomicU64) -> Self {
        c.fetch_add(1, Ordering::SeqCst);
        Counted(c)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The transport between a sender's `Propagate` and the next hop's `Admit`.
#[derive(Clone, Debug)]
pub struct Transport {
    /// The tree's world.
    pub world: Arc<World>,
    /// The hop called.
    pub node: Arc<Node>,
    /// The sender's admitted request (`None`: the client).
    pub from: Option<u64>,
    /// The sender's scope.
    pub sender: Scope,
    /// The call's faults.
    pub wire: Wire,
}

impl Service<Request<String>> for Transport {
    type Response = Response<String>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response<String>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<String>) -> Self::Future {
        // `Propagate` calls this in the instant it wrote the headers.
        let world = self.world.clone();
        if world.sabotage == Sabotage::GrowBudget && self.from.is_some() {
            grow(&mut req);
        }
        let written = Instant::now();
        let carried = req
            .headers()
            .get(service_budget::HEADER)
            .and_then(|v| ServiceBudget::parse(v.as_bytes()).ok())
            .map(|b| b.remaining());
        let (node, from, wire) = (self.node.clone(), self.from, self.wire);
        let sender_deadline = self.sender.deadline();
        let sender_cancelled = self.sender.is_cancelled();
        let sender_live = !sender_cancelled && self.sender.lifecycle() == Lifecycle::Running;
        Box::pin(async move {
            let _running = Counted::new(&world.in_flight);
            let mut permit = Some(world.pool.clone().acquire_owned().await?);
            if world.sabotage == Sabotage::LeakPermit && world.leaked.swap(1, Ordering::SeqCst) == 0
            {
                std::mem::forget(permit.take());
            }
            let _conn = Counted::new(&world.conns);
            match wire.connect {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
            let id = {
                let mut sent = world.sent.lock().unwrap();
                sent.push(Sent {
                    from,
                    written,
                    carried,
                    sender_deadline,
                    sender_cancelled,
                    sender_live,
                    arrived: Instant::now(),
                    admitted: None,
                    report: None,
                    last_io: Instant::now(),
                });
                sent.len() as u64 - 1
            };
            req.headers_mut().insert(SEND_ID, HeaderValue::from(id));
            // The next hop: its handler under the real admission layer, whose report goes to
            // the log.
            let on_report = world.clone();
            let admit = AdmitLayer::new(node.policy).on_report(move |_, report| {
                let report = report.clone();
                on_report.update(id, |s| s.report = Some(report));
            });
            let hop = world.clone();
            let res = admit
                .layer(tower::service_fn(move |req: Request<String>| {
                    handle(hop.clone(), node.clone(), id, req)
                }))
                .oneshot(req)
                .await?;
            let (parts, body) = res.into_parts();
            let text = collect(body).await;
            world.update(id, |s| s.last_io = Instant::now());
            let text = text?;
            if wire.lose_response {
                std::future::pending::<()>().await;
            }
            if world.sabotage == Sabotage::LateAnswer && from.is_none() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            drop(permit);
            Ok(Response::from_parts(parts, text))
        })
    }
}

/// Rewrites the request's `service-budget` 50 ms longer (the sabotage of a hop's egress).
fn grow(req: &mut Request<String>) {
    let longer = req
        .headers()
        .get(service_budget::HEADER)
        .and_then(|v| ServiceBudget::parse(v.as_bytes()).ok())
        .map(|b| ServiceBudget::new(b.remaining() + Duration::from_millis(50)).to_header_value());
    if let Some(v) = longer {
        req.headers_mut()
            .insert(service_budget::HEADER, HeaderValue::from_str(&v).unwrap());
    }
}

/// Reads a whole body.
pub async fn collect<B: Body>(body: B) -> Result<String, B::Error> {
    let mut body = std::pin::pin!(body);
    let mut out = Vec::new();
    while let Some(frame) = poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        if let Ok(data) = frame?.into_data() {
            use bytes::Buf as _;
            let mut data = data;
            while data.has_remaining() {
                let chunk = data.chunk();
                out.extend_from_slice(chunk);
                let n = chunk.len();
                data.advance(n);
            }
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn status(code: StatusCode) -> Result<Response<String>, Infallible> {
    let mut res = Response::new(String::new());
    *res.status_mut() = code;
    Ok(res)
}

/// A hop's handler, under its admitted scope (`Scope::current()`).
fn handle(
    world: Arc<World>,
    node: Arc<Node>,
    id: u64,
    _req: Request<String>,
) -> BoxFuture<Result<Response<String>, Infallible>> {
    Box::pin(async move {
        let scope = Scope::current();
        world.update(id, |s| s.admitted = Some(scope.deadline()));
        match &node.kind {
            Kind::Leaf(leaf) => match *leaf {
                Leaf::Respond(d) => match scope.run(tokio::time::sleep(d)).await {
                    Ok(()) => status(StatusCode::OK),
                    Err(_) => status(StatusCode::SERVICE_UNAVAILABLE),
                },
                Leaf::Fail(d) => {
                    let _ = scope.run(tokio::time::sleep(d)).await;
                    status(StatusCode::INTERNAL_SERVER_ERROR)
                }
                Leaf::Hang => std::future::pending().await,
                Leaf::IgnoreCancel(d) => {
                    tokio::time::sleep(d).await;
                    status(StatusCode::OK)
                }
            },
            Kind::Calls(calls) => {
                if world.sabotage == Sabotage::SendAfterCancel {
                    send_after_cancel(&world, id, &scope, &calls[0]);
                }
                let results =
                    futures::future::join_all(calls.iter().map(|c| call(&world, id, &scope, c)))
                        .await;
                if results.iter().all(|ok| *ok) {
                    status(StatusCode::OK)
                } else {
                    status(StatusCode::BAD_GATEWAY)
                }
            }
        }
    })
}

/// The sabotage of [`Sabotage::SendAfterCancel`]: a fire-and-forget task that sends one more
/// request straight to the transport once the hop is cancelled.
fn send_after_cancel(world: &Arc<World>, id: u64, scope: &Scope, c: &Call) {
    let mut transport = Transport {
        world: world.clone(),
        node: c.node.clone(),
        from: Some(id),
        sender: scope.clone(),
        wire: Wire::CLEAN,
    };
    let scope = scope.clone();
    tokio::spawn(async move {
        scope.cancelled().await;
        let req = Request::get("/")
            .header(service_budget::HEADER, "v=1, rem=50")
            .body(String::new())
            .unwrap();
        let _ = transport.call(req).await;
    });
}

/// Makes one call of a hop (its attempts or hedges), each through the real `Propagate`.
async fn call(world: &Arc<World>, from: u64, scope: &Scope, c: &Call) -> bool {
    let transport = Transport {
        world: world.clone(),
        node: c.node.clone(),
        from: Some(from),
        sender: scope.clone(),
        wire: c.wire,
    };
    let client = PropagateLayer::new().egress(c.egress).layer(transport);
    let once = || {
        let req = Request::builder()
            .method(c.method.clone())
            .uri("/")
            .body(String::new())
            .unwrap();
        let client = client.clone();
        async move {
            match client.oneshot(req).await {
                Ok(res) => {
                    let ok = res.status().is_success();
                    collect(res.into_body()).await.is_ok() && ok
                }
                Err(_) => false,
            }
        }
    };
    match c.mode {
        Mode::Once => once().await,
        Mode::Retry(n) => {
            for _ in 0..n {
                if once().await {
                    return true;
                }
                if scope.is_cancelled() {
                    break;
                }
            }
            false
        }
        Mode::Hedge(after) => {
            let first = once();
            let second = async {
                tokio::time::sleep(after).await;
                once().await
            };
            tokio::select! {
                // In a fixed order: the same seed makes the same run.
                biased;
                ok = first => ok,
                ok = second => ok,
            }
        }
    }
}

/// The client's call of a tree's first hop: through `Propagate` in the client's scope, or,
/// with [`Sabotage::LateAnswer`], straight to the transport with a header written by hand.
pub async fn client_call(world: &Arc<World>, root: &Scope, node: Arc<Node>) -> bool {
    let transport = Transport {
        world: world.clone(),
        node,
        from: None,
        sender: root.clone(),
        wire: Wire::CLEAN,
    };
    let mut req = Request::get("/").body(String::new()).unwrap();
    if world.sabotage == Sabotage::LateAnswer {
        let left = root.remaining().unwrap_or_default();
        let header = ServiceBudget::new(left).to_header_value();
        req.headers_mut().insert(
            service_budget::HEADER,
            HeaderValue::from_str(&header).unwrap(),
        );
        return match transport.oneshot(req).await {
            Ok(res) => res.status().is_success(),
            Err(_) => false,
        };
    }
    let client = PropagateLayer::new().layer(transport);
    match root.run(client.oneshot(req)).await {
        Ok(Ok(res)) => {
            let ok = res.status().is_success();
            root.run(collect(res.into_body()))
                .await
                .is_ok_and(|r| r.is_ok())
                && ok
        }
        _ => false,
    }
}
