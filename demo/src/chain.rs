//! The four services: real axum servers on 127.0.0.1, calling each other with reqwest.
//!
//! The handlers are the same in every mode; what differs is marked `Mode::PerHop` /
//! `Mode::Scoped`, and is small:
//!
//! | | per-hop timeouts | scoped budgets |
//! |---|---|---|
//! | server | plain axum router | the same router under [`AdmitLayer`]: the request's scope is [`Scope::current`] |
//! | outgoing call | `.timeout(fixed)` | `.send_scoped()`: a child scope, the budget in `grpc-timeout` / `service-budget` |
//! | inventory's work | `tokio::spawn(work)`: nothing can stop it | `Scope::current().spawn(work)`: stopped with the request |
//!
//! `Mode::Shadow` is the scoped chain whose layers read their policy from a [`PolicyHandle`]
//! ([`AdmitLayer::versioned`]): version 1 in shadow mode, then version 2 enforcing, set while
//! the servers run ([`Chain::enforce`]).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use cancel_scope::integrations::reqwest::RequestBuilderExt;
use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::integrations::CallError;
use cancel_scope::wire::{EndpointPolicy, PolicyHandle, Trust};
use cancel_scope::Scope;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::options::{Mode, Timing};
use crate::record::{Hop, Recorder, What};

/// The header that carries the request id from hop to hop.
pub(crate) const REQUEST_ID: &str = "x-request-id";

/// Per-hop mode: frontend's fixed timeout for its call to orders (before the time scale, as
/// every duration below).
pub const FRONTEND_TIMEOUT: Duration = Duration::from_millis(1_500);
/// Per-hop mode: orders' fixed timeout for each of its calls (inventory, external-stub).
pub const ORDERS_TIMEOUT: Duration = Duration::from_millis(1_000);

/// Scoped mode: what each hop keeps for its own answer (taken off the budget it admits).
pub const RESERVE: Duration = Duration::from_millis(5);
/// Scoped mode: what each call tells its callee less than it has itself, for the trip back.
pub const TRANSPORT_PAD: Duration = Duration::from_millis(5);
/// Scoped mode: below this budget a request is refused and a call is not made.
pub const MIN_USEFUL: Duration = Duration::from_millis(10);

/// The edge's policy: callers are untrusted (their budget can only shorten ours, up to 5 s;
/// 1 s if they declare none, times the time scale).
fn edge_policy(t: &Timing) -> EndpointPolicy {
    EndpointPolicy::builder(t.edge_max)
        .default_budget(t.edge_default)
        .reserve(t.reserve)
        .transport_pad(t.pad)
        .min_useful(t.min_useful)
        .build()
}

/// The inner hops' policy: the same, but the caller is one of ours (its operation id is kept).
fn inner_policy(t: &Timing) -> EndpointPolicy {
    edge_policy(t).to_builder().trust(Trust::Trusted).build()
}

/// The policy version a shadow chain starts with (in shadow mode), and the one it is switched
/// to (enforcing).
pub(crate) const SHADOW_VERSION: u32 = 1;
pub(crate) const ENFORCED_VERSION: u32 = 2;

/// `hop`'s policy in a scoped chain.
fn policy(hop: Hop, t: &Timing) -> EndpointPolicy {
    match hop {
        Hop::Frontend => edge_policy(t),
        _ => inner_policy(t),
    }
}

/// One service of one chain.
#[derive(Clone, Debug)]
struct Service {
    hop: Hop,
    mode: Mode,
    rec: Recorder,
    http: reqwest::Client,
    /// The services it calls, in order.
    downstream: Vec<String>,
    /// The run's durations: inventory's quote, the per-hop timeouts, the policies.
    timing: Timing,
}

/// A running chain; its servers stop when it is dropped.
#[derive(Debug)]
pub(crate) struct Chain {
    /// The edge's address.
    pub(crate) frontend: String,
    servers: Vec<JoinHandle<()>>,
    /// Shadow mode: each hop's policy versions, read by its layer per request.
    policies: Vec<(Hop, PolicyHandle)>,
    timing: Timing,
}

impl Chain {
    /// Starts external-stub, inventory, orders and frontend, each on an ephemeral loopback
    /// port.
    pub(crate) fn start(mode: Mode, timing: &Timing, rec: &Recorder) -> io::Result<Chain> {
        Chain::start_with(mode, timing, rec, |_| {
            std::net::TcpListener::bind("127.0.0.1:0")
        })
    }

    /// [`start`](Self::start), with `bind` making each hop's listener. Every hop gets its
    /// listener before any server starts (so that each knows where the next one listens):
    /// if one cannot listen, the listeners made so far are closed as they are dropped and no
    /// server was started, so a start that fails part way leaves nothing listening or
    /// running.
    fn start_with(
        mode: Mode,
        timing: &Timing,
        rec: &Recorder,
        mut bind: impl FnMut(Hop) -> io::Result<std::net::TcpListener>,
    ) -> io::Result<Chain> {
        // Redirects stay within the origin the call was made to (none here: good practice for
        // clients between services, whose calls carry a budget and an operation id).
        let http = reqwest::Client::builder()
            .redirect(cancel_scope::integrations::reqwest::redirect_policy())
            .build()
            .map_err(io::Error::other)?;
        let mut listen = |hop| bind(hop).and_then(Listening::new);
        let external = listen(Hop::External)?;
        let inventory = listen(Hop::Inventory)?;
        let orders = listen(Hop::Orders)?;
        let frontend = listen(Hop::Frontend)?;
        // Nothing fails from here on.
        let service = |hop, downstream| Service {
            hop,
            mode,
            rec: rec.clone(),
            http: http.clone(),
            downstream,
            timing: *timing,
        };
        let mut chain = Chain {
            frontend: frontend.url.clone(),
            servers: Vec::new(),
            policies: Vec::new(),
            timing: *timing,
        };
        let (inventory_url, external_url) = (inventory.url.clone(), external.url.clone());
        chain.serve(service(Hop::External, vec![]), external);
        chain.serve(service(Hop::Inventory, vec![]), inventory);
        let orders_url = orders.url.clone();
        let downstream = vec![inventory_url, external_url];
        chain.serve(service(Hop::Orders, downstream), orders);
        chain.serve(service(Hop::Frontend, vec![orders_url]), frontend);
        Ok(chain)
    }
}

/// A hop's listener, and the URL it is reached at.
struct Listening {
    listener: TcpListener,
    url: String,
}

impl Listening {
    fn new(listener: std::net::TcpListener) -> io::Result<Listening> {
        listener.set_nonblocking(true)?;
        let url = format!("http://{}/", listener.local_addr()?);
        Ok(Listening {
            listener: TcpListener::from_std(listener)?,
            url,
        })
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        for s in &self.servers {
            s.abort();
        }
    }
}

impl Chain {
    /// Serves `svc` on `on`; the server stops when the chain is dropped.
    fn serve(&mut self, svc: Service, on: Listening) {
        let versions = (svc.mode == Mode::Shadow).then(|| {
            let shadow = policy(svc.hop, &svc.timing)
                .to_builder()
                .version(SHADOW_VERSION)
                .mode(cancel_scope::wire::Mode::Shadow)
                .build();
            // A bounded policy: its maximum is the edge's, far below `MAX_CAP`.
            let handle = PolicyHandle::new(shadow).expect("a bounded policy");
            self.policies.push((svc.hop, handle.clone()));
            handle
        });
        let task = server(svc, on.listener, versions);
        self.servers.push(tokio::spawn(task));
    }

    /// Shadow mode: makes every hop's policy enforcing (version 2, the same rules), from its
    /// next request on, while its server keeps running.
    pub(crate) fn enforce(&self) {
        for (hop, handle) in &self.policies {
            let enforcing = policy(*hop, &self.timing)
                .to_builder()
                .version(ENFORCED_VERSION)
                .build();
            // Version 2 is above 1, and bounded as version 1 is.
            if let Err(e) = handle.set(enforcing) {
                tracing::error!(%hop, error = %e, "could not switch to enforcing");
            } else {
                tracing::info!(%hop, version = ENFORCED_VERSION, "policy switched to enforcing");
            }
        }
    }
}

/// The server of `svc` on `listener` (shadow mode: under the policy `versions`).
fn server(
    svc: Service,
    listener: TcpListener,
    versions: Option<PolicyHandle>,
) -> impl std::future::Future<Output = ()> {
    let handler = match svc.hop {
        Hop::Frontend => get(frontend),
        Hop::Orders => get(orders),
        Hop::Inventory => get(inventory),
        Hop::External => get(external),
    };
    let (hop, mode, rec, timing) = (svc.hop, svc.mode, svc.rec.clone(), svc.timing);
    let mut app = Router::new().route("/", handler).with_state(svc);
    if mode != Mode::PerHop {
        let layer = match versions {
            Some(versions) => AdmitLayer::versioned(&versions),
            None => AdmitLayer::new(policy(hop, &timing)),
        };
        // Once a request's scope is quiet (its handler answered or was stopped, and all its
        // work has a receipt), the layer hands over the report.
        let rec = rec.clone();
        app = app.layer(layer.on_report(move |admission, report| {
            let id = rec.request_of(admission.operation_id());
            rec.record(
                hop,
                &id,
                What::Quiet {
                    report: report.clone(),
                    would_be_deadline: admission
                        .is_shadowed()
                        .then(|| admission.would_be_deadline()),
                },
            );
        }));
    }
    // Outermost: what reached this server at all, admitted or not, and when it was done with
    // it. The run waits on these, not only on the handlers, because a server on a loaded
    // machine can read a request after its caller has given up.
    app = app.layer(middleware::from_fn_with_state((hop, rec), arrival));
    async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(%hop, error = %e, "server stopped");
        }
    }
}

/// Records that a request reached `hop`'s server, then that the server is done with it.
async fn arrival(
    State((hop, rec)): State<(Hop, Recorder)>,
    request: Request,
    next: Next,
) -> Response {
    let id: Arc<str> = request_id(request.headers()).into();
    rec.record(hop, &id, What::Received);
    let mut left = Left {
        hop,
        rec,
        id,
        status: None,
    };
    let response = next.run(request).await;
    left.status = Some(response.status().as_u16());
    response
}

/// Records [`What::Left`] when the server is done with a request, answered or dropped.
struct Left {
    hop: Hop,
    rec: Recorder,
    id: Arc<str>,
    status: Option<u16>,
}

impl Drop for Left {
    fn drop(&mut self) {
        let status = self.status;
        self.rec.record(self.hop, &self.id, What::Left { status });
    }
}

/// The edge: passes the client's request on to orders.
async fn frontend(State(svc): State<Service>, headers: HeaderMap) -> Response {
    let run = Run::start(&svc, &headers);
    match svc.call(&run, Hop::Orders, &svc.downstream[0]).await {
        Ok((status, body)) => run.answer(status, body),
        Err((status, why)) => run.answer(status, why),
    }
}

/// Orders: a quote from inventory, then — only if that succeeded — external-stub.
async fn orders(State(svc): State<Service>, headers: HeaderMap) -> Response {
    let run = Run::start(&svc, &headers);
    let quote = match svc.call(&run, Hop::Inventory, &svc.downstream[0]).await {
        Ok((StatusCode::OK, body)) => body,
        Ok((status, body)) => {
            return run.answer(
                passed_on(status),
                format!("inventory: {status} {body}").trim_end().to_owned(),
            )
        }
        Err((status, why)) => return run.answer(status, why),
    };
    match svc.call(&run, Hop::External, &svc.downstream[1]).await {
        Ok((StatusCode::OK, body)) => run.answer(StatusCode::OK, format!("{quote} | {body}")),
        Ok((status, body)) => run.answer(
            passed_on(status),
            format!("external-stub: {status} {body}")
                .trim_end()
                .to_owned(),
        ),
        Err((status, why)) => run.answer(status, why),
    }
}

/// Inventory v1: a read-only quote that takes `work`. The handler never looks at
/// cancellation itself; where its work runs decides whether anything can stop it.
async fn inventory(State(svc): State<Service>, headers: HeaderMap) -> Response {
    let run = Run::start(&svc, &headers);
    let work = quote(svc.rec.clone(), run.id.clone(), svc.timing.quote);
    let quoted = match svc.mode {
        // Like a handler that sleeps without watching its context: the work is
        // not tied to the request. When the caller hangs up, this handler is dropped, but the
        // task runs on to the end.
        Mode::PerHop => tokio::spawn(work).await.map_err(|e| e.to_string()),
        // The same work as a task of the request's scope: stopped at its next `.await` when
        // the scope is cancelled (deadline or client gone), and receipted.
        Mode::Scoped | Mode::Shadow => match Scope::current().spawn(work) {
            Ok(task) => task.await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        },
    };
    match quoted {
        Ok(price) => run.answer(StatusCode::OK, format!("inventory v1: quote {price}")),
        Err(e) => run.answer(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

/// External-stub: records the request id and answers.
async fn external(State(svc): State<Service>, headers: HeaderMap) -> Response {
    let run = Run::start(&svc, &headers);
    run.answer(StatusCode::OK, "external-stub: ok".to_owned())
}

/// The quote: `work` of (simulated) computation, logged at its start and at its end or stop.
async fn quote(rec: Recorder, id: Arc<str>, work: Duration) -> u32 {
    let mut guard = Work {
        rec,
        id,
        scope: Scope::try_current(),
        started: Instant::now(),
        done: false,
    };
    guard.rec.record(
        Hop::Inventory,
        &guard.id,
        What::WorkStarted { planned: work },
    );
    tokio::time::sleep(work).await;
    guard.done = true;
    let worked = guard.started.elapsed();
    guard
        .rec
        .record(Hop::Inventory, &guard.id, What::WorkFinished { worked });
    42
}

/// Logs a quote that was stopped before its end (its future dropped).
struct Work {
    rec: Recorder,
    id: Arc<str>,
    scope: Option<Scope>,
    started: Instant,
    done: bool,
}

impl Drop for Work {
    fn drop(&mut self) {
        if !self.done {
            let cause = self.scope.as_ref().and_then(Scope::cause);
            let worked = self.started.elapsed();
            self.rec.record(
                Hop::Inventory,
                &self.id,
                What::WorkStopped { worked, cause },
            );
        }
    }
}

/// One handler call: logs its start (with the budget its scope has), its answer, or its being
/// dropped without an answer (and why, if its scope knows).
struct Run {
    hop: Hop,
    rec: Recorder,
    id: Arc<str>,
    scope: Option<Scope>,
    answered: bool,
}

impl Run {
    fn start(svc: &Service, headers: &HeaderMap) -> Run {
        let id: Arc<str> = request_id(headers).into();
        // Per-hop mode: no layer, no scope.
        let scope = Scope::try_current();
        if let Some(op) = scope.as_ref().and_then(Scope::operation) {
            svc.rec.operation(op.id(), &id);
        }
        let budget = scope.as_ref().and_then(Scope::remaining);
        let deadline = scope.as_ref().and_then(Scope::deadline);
        svc.rec
            .record(svc.hop, &id, What::Started { budget, deadline });
        Run {
            hop: svc.hop,
            rec: svc.rec.clone(),
            id,
            scope,
            answered: false,
        }
    }

    fn answer(mut self, status: StatusCode, body: String) -> Response {
        self.answered = true;
        self.rec.record(
            self.hop,
            &self.id,
            What::Answered {
                status: status.as_u16(),
            },
        );
        (status, body).into_response()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if !self.answered {
            // Scoped: the `Admit` layer cancels the scope (deadline, or `ClientGone` when the
            // connection closed) before it drops the handler, so the cause is known here.
            let cause = self.scope.as_ref().and_then(Scope::cause);
            self.rec.record(self.hop, &self.id, What::Dropped { cause });
        }
    }
}

/// The request id header, or `-` (printable ASCII only, at most 64 bytes).
fn request_id(headers: &HeaderMap) -> String {
    headers
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64)
        .unwrap_or("-")
        .to_owned()
}

/// What a hop answers when a callee answered `status`: a deadline stays a deadline.
fn passed_on(status: StatusCode) -> StatusCode {
    if status == StatusCode::GATEWAY_TIMEOUT {
        status
    } else {
        StatusCode::BAD_GATEWAY
    }
}

/// A call's answer (status and body), or the status this hop answers when there is none.
type Called = Result<(StatusCode, String), (StatusCode, String)>;

impl Service {
    /// Calls `to` at `url` with the request id: with a fixed timeout (per-hop) or in a child
    /// of the request's scope (scoped).
    async fn call(&self, run: &Run, to: Hop, url: &str) -> Called {
        self.rec.record(self.hop, &run.id, What::Calling { to });
        let request = self.http.get(url).header(REQUEST_ID, &*run.id);
        let called = match self.mode {
            Mode::PerHop => {
                let timeout = match self.hop {
                    Hop::Frontend => self.timing.frontend_timeout,
                    _ => self.timing.orders_timeout,
                };
                match request.timeout(timeout).send().await {
                    Ok(res) => {
                        let status = res.status();
                        res.text()
                            .await
                            .map(|body| (status, body))
                            .map_err(|e| per_hop_failure(to, timeout, &e))
                    }
                    Err(e) => Err(per_hop_failure(to, timeout, &e)),
                }
            }
            Mode::Scoped | Mode::Shadow => match request.send_scoped().await {
                Ok(res) => {
                    let status = res.status();
                    res.text()
                        .await
                        .map(|body| (status, body))
                        .map_err(|e| scoped_failure(to, &e))
                }
                Err(e) => Err(scoped_failure(to, &e)),
            },
        };
        let outcome = match &called {
            Ok((status, _)) => status.to_string(),
            Err((_, why)) => why.clone(),
        };
        self.rec
            .record(self.hop, &run.id, What::CallEnded { to, outcome });
        called
    }
}

fn per_hop_failure(to: Hop, timeout: Duration, e: &reqwest::Error) -> (StatusCode, String) {
    if e.is_timeout() {
        let ms = timeout.as_millis();
        (
            StatusCode::GATEWAY_TIMEOUT,
            format!("{to}: no answer within the fixed {ms} ms"),
        )
    } else {
        (StatusCode::BAD_GATEWAY, format!("{to}: {e}"))
    }
}

fn scoped_failure(to: Hop, e: &CallError) -> (StatusCode, String) {
    let status = if e.is_deadline_exceeded() || e.is_budget_exhausted() {
        StatusCode::GATEWAY_TIMEOUT
    } else if e.is_cancelled() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::BAD_GATEWAY
    };
    (status, format!("{to}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Options;

    /// A chain whose third server cannot listen leaves nothing listening or running: the two
    /// listeners made before are closed (a connection to them is refused at once) and no
    /// server was started. (Before, the servers started until then went on serving: their
    /// handles were dropped, which detaches a tokio task rather than stopping it.)
    #[tokio::test]
    async fn a_chain_that_cannot_start_leaves_no_server_behind() {
        let mut bound = Vec::new();
        let started = Chain::start_with(
            Mode::Scoped,
            &Options::default().timing(),
            &Recorder::new(),
            |hop| {
                if hop == Hop::Orders {
                    return Err(io::Error::new(io::ErrorKind::AddrInUse, "taken"));
                }
                let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
                bound.push((hop, listener.local_addr()?));
                Ok(listener)
            },
        );
        let err = started.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        let hops: Vec<_> = bound.iter().map(|(hop, _)| *hop).collect();
        assert_eq!(hops, [Hop::External, Hop::Inventory]);
        for (hop, addr) in bound {
            let refused = std::net::TcpStream::connect(addr).unwrap_err();
            assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused, "{hop}");
        }
    }
}
