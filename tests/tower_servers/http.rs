//! The tower server layer (`Admit`) and the reqwest client extension over real HTTP: axum
//! servers and reqwest clients on loopback.
//!
//! Real sockets run on the real clock, so budgets are generous and the assertions are about
//! order, causes and inequalities, never exact milliseconds. Nothing here sleeps to "let
//! things settle": every wait is on an observable event (a response, a report, a signal from a
//! handler), bounded by a generous timeout so that a bug fails the test instead of hanging it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{any, get};
use axum::{Extension, Router};
use cancel_scope::integrations::reqwest::RequestBuilderExt;
use cancel_scope::integrations::tower::{AdmitLayer, Propagate, PropagateLayer};
use cancel_scope::wire::{
    Admission, BudgetSource, EgressPolicy, EndpointPolicy, OperationSource, OverCap,
    PrioritySource, Trust,
};
use cancel_scope::{Cause, Lifecycle, Scope};
use futures::StreamExt as _;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{timeout, Instant};
use tower::{Layer as _, ServiceExt as _};

use crate::support::servers::{next_report, read_body, OnDrop, CUT_AFTER, PATIENCE};
use crate::support::time::ms;
use crate::support::tower::{reporting as admit, verdict, Reports};

async fn serve(app: Router) -> String {
    let addr = crate::support::servers::serve(app).await;
    format!("http://{addr}/")
}

/// What one hop saw when its handler started.
#[derive(Clone, Debug)]
struct Seen {
    hop: &'static str,
    at: Instant,
    remaining: Duration,
    operation: String,
}

#[derive(Clone)]
struct Hop {
    name: &'static str,
    next: Option<String>,
    seen: Arc<Mutex<Vec<Seen>>>,
    client: reqwest::Client,
}

async fn hop(State(h): State<Hop>) -> Result<String, StatusCode> {
    let scope = Scope::current();
    h.seen.lock().unwrap().push(Seen {
        hop: h.name,
        at: Instant::now(),
        remaining: scope.remaining().unwrap(),
        operation: scope.operation().unwrap().id().to_owned(),
    });
    let Some(next) = &h.next else {
        return Ok(h.name.to_owned());
    };
    let res = h
        .client
        .get(next)
        .send_scoped()
        .await
        .map_err(|_| StatusCode::BAD_GATEWAY)?;
    let below = res.text().await.map_err(|_| StatusCode::BAD_GATEWAY)?;
    Ok(format!("{} > {below}", h.name))
}

#[tokio::test]
async fn budgets_shrink_hop_by_hop_across_three_services() {
    // The pad covers the trip over loopback (from the budget header's making to the next
    // hop's admission, a new connection included), generously even on a loaded machine: a
    // trip longer than pad + reserve makes a downstream deadline later than the upstream one
    // (no clock is shared: the wire carries a duration), and so does the first check below.
    // (With 50 ms, trips of 50-220 ms on a loaded 2-core machine failed it, no bug behind it.)
    let pad = ms(5_000);
    let reserve = ms(20);
    let edge = EndpointPolicy::builder(ms(120_000))
        .default_budget(ms(2_000))
        .reserve(reserve)
        .transport_pad(pad)
        .build();
    let inner = edge.to_builder().trust(Trust::Trusted).build();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let client = reqwest::Client::new();

    let mut next = None;
    let mut reports = Vec::new();
    for (name, policy) in [("inventory", inner), ("orders", inner), ("frontend", edge)] {
        let (layer, rx) = admit(policy);
        reports.push(rx);
        let state = Hop {
            name,
            next: next.take(),
            seen: seen.clone(),
            client: client.clone(),
        };
        let app = Router::new()
            .route("/", get(hop))
            .with_state(state)
            .layer(layer);
        next = Some(serve(app).await);
    }

    let res = client
        .get(next.unwrap())
        .header("grpc-timeout", "60S")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.text().await.unwrap(), "frontend > orders > inventory");

    let seen = seen.lock().unwrap().clone();
    let hops: Vec<_> = seen.iter().map(|s| s.hop).collect();
    assert_eq!(hops, ["frontend", "orders", "inventory"]);
    assert!(seen[0].remaining <= ms(60_000) - reserve, "{seen:?}");
    for pair in seen.windows(2) {
        let (up, down) = (&pair[0], &pair[1]);
        let elapsed = down.at - up.at;
        // Each hop has at least the elapsed time less than the one before...
        assert!(
            down.remaining + elapsed <= up.remaining,
            "{up:?} -> {down:?} after {elapsed:?}"
        );
        // ... and, as long as the trip took less than the pad, also the reserve less: the
        // downstream deadline is never later than the upstream one minus its reserve.
        assert!(
            down.remaining + elapsed + reserve <= up.remaining,
            "{up:?} -> {down:?} after {elapsed:?}"
        );
    }
    // The edge made up an operation id; the trusted hops below kept it.
    assert!(seen.iter().all(|s| s.operation == seen[0].operation));

    // Every hop's scope went quiet, and the calls each made were receipted (and its handler:
    // one more).
    for (rx, calls) in reports.iter_mut().zip([1, 2, 2]) {
        let (admission, report) = next_report(rx).await;
        assert_eq!(admission.operation_id(), seen[0].operation);
        assert_eq!(report.state(), Lifecycle::Completed, "{report}");
        assert_eq!(report.succeeded(), calls, "{report}");
    }
}

#[derive(Clone, Default)]
struct Calls(Arc<AtomicUsize>);

async fn count(State(calls): State<Calls>, Extension(a): Extension<Admission>) -> String {
    calls.0.fetch_add(1, Ordering::SeqCst);
    let left = Scope::current().remaining().unwrap();
    format!(
        "{} {} {} {:?}",
        left.as_millis(),
        a.was_clamped(),
        a.priority(),
        a.priority_source()
    )
}

async fn counting_server(policy: EndpointPolicy) -> (String, Calls) {
    let calls = Calls::default();
    let app = Router::new()
        .route("/", get(count))
        .with_state(calls.clone())
        .layer(AdmitLayer::new(policy));
    (serve(app).await, calls)
}

#[tokio::test]
async fn a_hostile_budget_gets_at_most_the_policy_maximum() {
    let policy = EndpointPolicy::builder(ms(3_000))
        .default_budget(ms(1_000))
        .priority(4)
        .build();
    let (url, _) = counting_server(policy).await;
    let client = reqwest::Client::new();
    for (name, value) in [
        ("grpc-timeout", "99999999H"),
        ("service-budget", "v=1, rem=86400000, prio=0"),
        ("x-envoy-expected-rq-timeout-ms", "9999999999"),
    ] {
        let text = client
            .get(&url)
            .header(name, value)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let mut parts = text.split(' ');
        let left: u64 = parts.next().unwrap().parse().unwrap();
        assert!(left <= 3_000, "{name}: {text}");
        let rest: Vec<_> = parts.collect();
        // Untrusted: Envoy's header is not even read; the others are clamped; the caller's
        // urgency 0 is ignored.
        let clamped = name != "x-envoy-expected-rq-timeout-ms";
        assert_eq!(
            rest,
            [&clamped.to_string(), "4", "Policy"],
            "{name}: {text}"
        );
        if !clamped {
            assert!(left <= 1_000, "{name}: {text}");
        }
    }
    assert_eq!(format!("{:?}", PrioritySource::Policy), "Policy");
}

#[tokio::test]
async fn malformed_budget_headers_get_400_and_never_reach_the_handler() {
    let (url, calls) = counting_server(
        EndpointPolicy::builder(ms(3_000))
            .default_budget(ms(1_000))
            .build(),
    )
    .await;
    let client = reqwest::Client::new();
    let bad: &[&[(&str, &str)]] = &[
        &[("grpc-timeout", "-1S")],
        &[("grpc-timeout", "1 hour")],
        &[("grpc-timeout", "123456789m")],
        &[("service-budget", "v=2, rem=10")],
        &[("service-budget", "v=1, rem=-1")],
        &[("service-budget", "v=1, rem=10, rem=99999")],
        &[("service-budget", "(((")],
        &[("grpc-timeout", "1S"), ("grpc-timeout", "2S")],
    ];
    for headers in bad {
        let mut req = client.get(&url);
        for (k, v) in *headers {
            req = req.header(*k, *v);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), 400, "{headers:?}");
    }
    // The same for a gRPC caller: a trailers-only INVALID_ARGUMENT.
    let res = client
        .post(&url)
        .header("content-type", "application/grpc")
        .header("grpc-timeout", "soon")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["grpc-status"], "3");
    assert_eq!(calls.0.load(Ordering::SeqCst), 0);
}

/// The budget headers of the attack: a day of budget, the most urgent priority, someone
/// else's operation and generation, and Envoy's header from a client that is no Envoy.
const HOSTILE: [(&str, &str); 3] = [
    ("grpc-timeout", "99999999H"),
    (
        "service-budget",
        "v=1, rem=86400000, prio=0, op=\"victim-op\", gen=9",
    ),
    ("x-envoy-expected-rq-timeout-ms", "9999999999"),
];

/// A plain server (no layer) that answers with the names of the headers it got, sorted.
async fn header_echo() -> String {
    async fn names(headers: axum::http::HeaderMap) -> String {
        let mut names: Vec<_> = headers.keys().map(|k| k.as_str().to_owned()).collect();
        names.sort();
        names.join(",")
    }
    serve(Router::new().route("/", any(names))).await
}

/// A handler that copies every header it got onto a call of its own, made with plain reqwest
/// (no scope, nothing of this crate in the way), and answers with what the callee saw.
async fn copier(
    State(next): State<String>,
    Extension(a): Extension<Admission>,
    headers: axum::http::HeaderMap,
) -> String {
    let seen = reqwest::Client::new()
        .get(&next)
        .headers(headers)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let caller = a
        .caller_budget()
        .map(|b| b.operation_id().unwrap().to_owned());
    format!("{seen} {caller:?}")
}

/// `Admit` takes the raw budget headers off the request: a handler that copies its incoming
/// headers onto an outgoing request passes none of them on (the callee would otherwise be
/// told a day of budget, priority 0 and the caller's operation). What they said is still in
/// the `Admission`.
#[tokio::test]
async fn a_handler_that_copies_its_headers_forwards_no_budget_header() {
    let echo = header_echo().await;
    let app = Router::new()
        .route("/", get(copier))
        .with_state(echo)
        .layer(AdmitLayer::new(
            EndpointPolicy::builder(ms(2_000))
                .default_budget(ms(1_000))
                .build(),
        ));
    let url = serve(app).await;
    let mut req = reqwest::Client::new().get(&url).header("x-request-id", "7");
    for (name, value) in HOSTILE {
        req = req.header(name, value);
    }
    let text = req.send().await.unwrap().text().await.unwrap();
    let (seen, caller) = text.split_once(' ').unwrap();
    let seen: Vec<_> = seen.split(',').collect();
    assert!(seen.contains(&"x-request-id"), "{text}");
    for (name, _) in HOSTILE {
        assert!(!seen.contains(&name), "{name} reached the callee: {text}");
    }
    assert_eq!(caller, "Some(\"victim-op\")", "{text}");
}

/// A trusted inner service: answers with the operation, generation and priority it was
/// admitted under, and the budget its handler got, in ms.
async fn inner(Extension(a): Extension<Admission>) -> String {
    let left = Scope::current().remaining().unwrap();
    format!(
        "{} {} {} {}",
        a.operation_id(),
        a.generation(),
        a.priority(),
        left.as_millis()
    )
}

/// An edge behind Envoy: what it was admitted under, then what its call to `inner` saw.
async fn edge(State(next): State<String>, Extension(a): Extension<Admission>) -> String {
    let below = reqwest::Client::new()
        .get(&next)
        .send_scoped()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    format!(
        "{} {:?} {:?} {:?} {} {} {} | {below}",
        a.operation_id(),
        a.budget_source(),
        a.priority_source(),
        a.operation_source(),
        a.generation(),
        a.priority(),
        a.initial_remaining().as_millis(),
    )
}

/// An edge behind Envoy reads Envoy's timeout and nothing else from its clients: a client
/// that also sends priority 0 and someone else's operation and generation gets the edge's
/// priority and a fresh local operation at generation 0, and that is what the trusted service
/// behind it sees (it is never told the client's values).
#[tokio::test]
async fn an_edge_behind_envoy_reads_its_timeout_but_not_the_clients_priority_or_operation() {
    let trusted = EndpointPolicy::builder(ms(30_000))
        .default_budget(ms(10_000))
        .trust(Trust::Trusted)
        .build();
    let inner_url = serve(
        Router::new()
            .route("/", get(inner))
            .layer(AdmitLayer::new(trusted)),
    )
    .await;
    let edge_policy = EndpointPolicy::builder(ms(20_000))
        .default_budget(ms(10_000))
        .trust(Trust::Untrusted)
        .envoy_timeout(true)
        .priority(4)
        .build();
    let edge_url = serve(
        Router::new()
            .route("/", get(edge))
            .with_state(inner_url)
            .layer(AdmitLayer::new(edge_policy)),
    )
    .await;
    let text = reqwest::Client::new()
        .get(&edge_url)
        .header("x-envoy-expected-rq-timeout-ms", "15000")
        .header(
            "service-budget",
            "v=1, rem=86400000, prio=0, op=\"victim-op\", gen=9",
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (at_edge, below) = text.split_once(" | ").unwrap();
    let at_edge: Vec<_> = at_edge.split(' ').collect();
    let [op, budget_source, priority_source, operation_source, gen, prio, left] = at_edge[..]
    else {
        panic!("{text}");
    };
    assert_eq!(
        budget_source,
        format!("{:?}", BudgetSource::Envoy),
        "{text}"
    );
    assert!(left.parse::<u64>().unwrap() <= 15_000, "{text}");
    assert_eq!(
        priority_source,
        format!("{:?}", PrioritySource::Policy),
        "{text}"
    );
    assert_eq!(
        operation_source,
        format!("{:?}", OperationSource::Local),
        "{text}"
    );
    assert_ne!(op, "victim-op");
    assert_eq!((gen, prio), ("0", "4"), "{text}");
    // The trusted service behind it runs under the edge's operation, not the client's.
    let below: Vec<_> = below.split(' ').collect();
    assert_eq!(below[..3], [op, "0", "4"], "{text}");
    assert!(below[3].parse::<u64>().unwrap() <= 15_000, "{text}");
}

/// A server whose handler is never to run, with a policy that rejects over-long budgets and
/// needs 100 ms at least; refusals' details go to a channel.
async fn refusing_server(
    policy: EndpointPolicy,
) -> (String, Calls, mpsc::UnboundedReceiver<String>) {
    let (tx, refusals) = mpsc::unbounded_channel();
    let calls = Calls::default();
    let policy = policy
        .to_builder()
        .over_cap(OverCap::Reject)
        .min_useful(ms(100))
        .build();
    let layer = AdmitLayer::new(policy).on_refusal(move |e| {
        let _ = tx.send(e.to_string());
    });
    let app = Router::new()
        .route("/", any(count))
        .with_state(calls.clone())
        .layer(layer);
    (serve(app).await, calls, refusals)
}

/// A GET with `headers`, or (`grpc`) a POST that says it is gRPC, sent.
async fn send(url: &str, grpc: bool, headers: &[(&str, &str)]) -> reqwest::Response {
    let client = reqwest::Client::new();
    let mut req = if grpc {
        client.post(url).header("content-type", "application/grpc")
    } else {
        client.get(url)
    };
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.send().await.unwrap()
}

/// A refusal to a caller the policy does not show the detail says its kind in one fixed text,
/// in the HTTP body or in `grpc-message`: no numbers, no header values. The detail goes to
/// `on_refusal`, and a trusted caller gets it.
#[tokio::test]
async fn refusals_to_untrusted_callers_say_the_kind_and_nothing_more() {
    let (url, calls, mut refusals) = refusing_server(
        EndpointPolicy::builder(ms(3_000))
            .default_budget(ms(1_000))
            .build(),
    )
    .await;
    let cases = [
        (("grpc-timeout", "1 hour"), 400, 3, "invalid budget header"),
        (
            ("service-budget", "v=1, rem=10, rem=99999"),
            400,
            3,
            "invalid budget header",
        ),
        (
            ("service-budget", "v=1, rem=86400000"),
            400,
            3,
            "budget exceeds the endpoint's maximum",
        ),
        (("grpc-timeout", "50m"), 504, 4, "budget exhausted"),
    ];
    for ((name, value), status, grpc_status, text) in cases {
        let res = send(&url, false, &[(name, value)]).await;
        assert_eq!(res.status(), status, "{name}: {value}");
        assert_eq!(res.headers()["content-type"], "text/plain; charset=utf-8");
        assert_eq!(res.text().await.unwrap(), text, "{name}: {value}");
        let detail = timeout(PATIENCE, refusals.recv()).await.unwrap().unwrap();
        assert!(
            detail.starts_with(text) && detail.len() > text.len(),
            "{detail}"
        );

        let res = send(&url, true, &[(name, value)]).await;
        assert_eq!(res.status(), 200);
        assert_eq!(
            res.headers()["grpc-status"],
            grpc_status.to_string().as_str()
        );
        assert_eq!(res.headers()["grpc-message"], text, "{name}: {value}");
        assert_eq!(res.text().await.unwrap(), "");
        timeout(PATIENCE, refusals.recv()).await.unwrap().unwrap();
    }
    // Repeated lines: the same text.
    let res = send(
        &url,
        false,
        &[("grpc-timeout", "1S"), ("grpc-timeout", "2S")],
    )
    .await;
    assert_eq!(res.text().await.unwrap(), "invalid budget header");
    assert_eq!(calls.0.load(Ordering::SeqCst), 0);

    // A trusted caller is told the detail.
    let (url, _, _) = refusing_server(
        EndpointPolicy::builder(ms(3_000))
            .default_budget(ms(1_000))
            .trust(Trust::Trusted)
            .build(),
    )
    .await;
    let res = send(&url, false, &[("grpc-timeout", "1 hour")]).await;
    assert_eq!(res.status(), 400);
    let body = res.text().await.unwrap();
    assert!(
        body.starts_with("invalid budget header: grpc-timeout"),
        "{body}"
    );
}

/// A handler that cancels its request with an internal reason and waits to be stopped.
async fn cancels_itself() -> &'static str {
    Scope::current().cancel_with("db password rotated");
    std::future::pending().await
}

/// The answer for a request the server stopped carries no internal cancel reason to a caller
/// the policy does not show the detail (503 "service unavailable", gRPC `UNAVAILABLE`); a
/// trusted caller gets the cause.
#[tokio::test]
async fn a_stopped_request_tells_an_untrusted_caller_no_cancel_reason() {
    for trust in [Trust::Untrusted, Trust::Trusted] {
        let policy = EndpointPolicy::builder(ms(3_000)).trust(trust).build();
        let app = Router::new()
            .route("/", any(cancels_itself))
            .layer(AdmitLayer::new(policy));
        let url = serve(app).await;
        let res = send(&url, false, &[]).await;
        assert_eq!(res.status(), 503);
        let body = res.text().await.unwrap();
        let res = send(&url, true, &[]).await;
        assert_eq!(res.headers()["grpc-status"], "14");
        let message = res.headers()["grpc-message"].to_str().unwrap().to_owned();
        if trust == Trust::Untrusted {
            assert_eq!(body, "service unavailable");
            assert_eq!(message, "service unavailable");
        } else {
            assert!(body.contains("db password rotated"), "{body}");
            assert!(message.contains("db password rotated"), "{message}");
        }
    }
}

/// A handler that starts a child doing 60 s of work and then waits for it.
#[derive(Clone)]
struct Stuck {
    started: Arc<Mutex<Option<oneshot::Sender<Scope>>>>,
}

async fn stuck(State(s): State<Stuck>) -> &'static str {
    let scope = Scope::current();
    let child = scope.child().name("inventory").build().unwrap();
    let work = child
        .spawn(tokio::time::sleep(Duration::from_secs(60)))
        .unwrap();
    if let Some(tx) = s.started.lock().unwrap().take() {
        let _ = tx.send(child);
    }
    let _ = work.await;
    "finished"
}

async fn stuck_server(policy: EndpointPolicy) -> (String, Reports, oneshot::Receiver<Scope>) {
    let (tx, started) = oneshot::channel();
    let (layer, reports) = admit(policy);
    let app = Router::new()
        .route("/", any(stuck))
        .with_state(Stuck {
            started: Arc::new(Mutex::new(Some(tx))),
        })
        .layer(layer);
    (serve(app).await, reports, started)
}

#[tokio::test]
async fn a_client_that_disconnects_cancels_the_server_scope_and_its_children() {
    let (url, mut reports, started) =
        stuck_server(EndpointPolicy::builder(ms(60_000)).build()).await;
    let request = tokio::spawn(reqwest::Client::new().get(url).send());
    let child = timeout(PATIENCE, started).await.unwrap().unwrap();
    request.abort(); // the client goes away mid-request

    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.cause(), Some(&Cause::ClientGone), "{report}");
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
    // The child's task was stopped and receipted, and so was the handler.
    assert_eq!(report.cancelled(), 2, "{report}");
    assert_eq!(report.total(), 2, "{report}");
    assert!(child.cause().unwrap().is_client_gone());
}

#[tokio::test]
async fn the_deadline_answers_504_or_deadline_exceeded() {
    let (url, mut reports, _started) =
        stuck_server(EndpointPolicy::builder(ms(60_000)).build()).await;
    let client = reqwest::Client::new();
    let sent = Instant::now();
    let res = client
        .get(&url)
        .header("grpc-timeout", "300m")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 504);
    assert!(sent.elapsed() >= ms(300));
    let (admission, report) = next_report(&mut reports).await;
    assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded), "{report}");
    // The child's task and the handler.
    assert_eq!(report.cancelled(), 2, "{report}");
    assert!(Instant::now() >= admission.deadline());

    // A gRPC caller gets DEADLINE_EXCEEDED, not CANCELLED, in a trailers-only response.
    let res = client
        .post(&url)
        .header("content-type", "application/grpc")
        .header("grpc-timeout", "300m")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["grpc-status"], "4");
    assert_eq!(res.headers()["content-type"], "application/grpc");
    let (_, report) = next_report(&mut reports).await;
    assert!(report.cause().unwrap().is_deadline_exceeded());
}

#[tokio::test]
async fn a_cancelled_or_useless_call_is_never_sent() {
    let (url, calls) = counting_server(
        EndpointPolicy::builder(ms(3_000))
            .default_budget(ms(1_000))
            .build(),
    )
    .await;
    let client = reqwest::Client::new();

    let cancelled = Scope::with_timeout(ms(10_000));
    cancelled.cancel_with("user left");
    let err = client
        .get(&url)
        .scoped_in(&cancelled)
        .send()
        .await
        .unwrap_err();
    assert!(err.is_cancelled(), "{err}");
    assert_eq!(err.cause().unwrap().reason(), Some("user left"));

    let short = Scope::with_timeout(ms(10_000));
    let err = client
        .get(&url)
        .scoped_in(&short)
        .egress(EgressPolicy::builder().min_useful(ms(20_000)).build())
        .send()
        .await
        .unwrap_err();
    assert!(err.is_budget_exhausted(), "{err}");

    let err = client.get(&url).scoped().send().await.unwrap_err();
    assert!(err.is_no_scope());

    assert_eq!(calls.0.load(Ordering::SeqCst), 0);

    // And a call that is made carries the budget: the server sees at most what was left.
    let scope = Scope::with_timeout(ms(10_000));
    let res = client.get(&url).scoped_in(&scope).send().await.unwrap();
    let call_left = res.remaining().unwrap();
    let text = res.text().await.unwrap();
    let server_left: u64 = text.split(' ').next().unwrap().parse().unwrap();
    assert!(
        u128::from(server_left) <= call_left.as_millis() + 1,
        "{text} vs {call_left:?}"
    );
    assert!(server_left < 10_000);
    assert_eq!(calls.0.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn cancelling_the_caller_stops_the_call_and_the_server_sees_the_client_go() {
    let (url, mut reports, started) =
        stuck_server(EndpointPolicy::builder(ms(60_000)).build()).await;
    let caller = Scope::with_timeout(ms(60_000));
    let call = tokio::spawn({
        let caller = caller.clone();
        async move {
            reqwest::Client::new()
                .get(url)
                .scoped_in(&caller)
                .send()
                .await
        }
    });
    let child = timeout(PATIENCE, started).await.unwrap().unwrap();
    caller.cancel_with("user pressed stop");
    let err = call.await.unwrap().unwrap_err();
    assert!(err.is_cancelled(), "{err}");
    assert_eq!(err.cause().unwrap().reason(), Some("user pressed stop"));

    // The call's connection was dropped: the server's request scope saw its client go.
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.cause(), Some(&Cause::ClientGone), "{report}");
    assert!(child.is_cancelled());

    // On the caller's side the call was receipted as cancelled.
    let report = timeout(PATIENCE, caller.quiesce()).await.unwrap();
    assert_eq!(report.cancelled(), 1, "{report}");
}

async fn trickle() -> Body {
    // One chunk, then nothing more: a body that never ends.
    let chunks = futures::stream::once(async { Ok::<_, std::io::Error>("first chunk") })
        .chain(futures::stream::pending());
    Body::from_stream(chunks)
}

#[tokio::test]
async fn reading_the_response_body_is_bounded_by_the_same_deadline() {
    let app = Router::new().route("/", get(trickle));
    let url = serve(app).await;
    let scope = Scope::with_timeout(CUT_AFTER);
    let started = Instant::now();
    let mut res = reqwest::Client::new()
        .get(url)
        .scoped_in(&scope)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.chunk().await.unwrap().unwrap(), "first chunk");
    let err = res.chunk().await.unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err}");
    assert!(started.elapsed() >= CUT_AFTER);
    let report = timeout(PATIENCE, scope.quiesce()).await.unwrap();
    assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded));
    assert_eq!(report.cancelled(), 1, "{report}");
}

#[tokio::test]
async fn a_streaming_response_is_cut_at_the_deadline_and_reported_after_it() {
    let (layer, mut reports) = admit(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
    let url = serve(Router::new().route("/", get(trickle)).layer(layer)).await;
    let started = Instant::now();
    let mut res = reqwest::Client::new()
        .get(url)
        .header("grpc-timeout", "2S")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.chunk().await.unwrap().unwrap(), "first chunk");
    // The server aborts the body at its deadline: an error, not a clean short body.
    let cut = timeout(PATIENCE, res.chunk()).await.unwrap();
    assert!(cut.is_err(), "the body ended cleanly: {cut:?}");
    assert!(started.elapsed() >= CUT_AFTER);
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded), "{report}");
    assert_eq!(report.state(), Lifecycle::CancelledStable);
}

#[tokio::test]
async fn a_client_that_leaves_while_the_body_streams_is_client_gone() {
    let (layer, mut reports) = admit(EndpointPolicy::builder(ms(5_000)).build());
    let url = serve(Router::new().route("/", get(trickle)).layer(layer)).await;
    let mut res = reqwest::Client::new().get(url).send().await.unwrap();
    assert_eq!(res.chunk().await.unwrap().unwrap(), "first chunk");
    // Nothing else was reported: the body is still streaming.
    assert!(reports.try_recv().is_err());
    drop(res);
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.cause(), Some(&Cause::ClientGone), "{report}");
}

// A streaming body whose length is given by a `content-length` header. hyper's h1
// encoder knows the body is complete after the last byte and drops it without polling it to
// its end (StreamBody::is_end_stream is false), as for tower-http's ServeFile/ServeDir.
async fn sized_stream() -> axum::response::Response {
    let chunks = futures::stream::iter([Ok::<_, std::io::Error>("hello "), Ok("world")]);
    axum::response::Response::builder()
        .header("content-length", "11")
        .body(Body::from_stream(chunks))
        .unwrap()
}

#[tokio::test]
async fn a_body_sent_whole_under_content_length_is_not_client_gone() {
    let (layer, mut reports) = admit(EndpointPolicy::builder(ms(5_000)).build());
    let url = serve(Router::new().route("/", get(sized_stream)).layer(layer)).await;
    let res = reqwest::Client::new().get(url).send().await.unwrap();
    assert_eq!(res.status(), 200);
    // The client reads the whole body and keeps the connection (no disconnect).
    assert_eq!(res.text().await.unwrap(), "hello world");
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.cause(), None, "a complete body reported as {report}");
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
}

// A 204/304 answer has no body on the wire (hyper forces its length to 0 and drops
// the body unpolled), whatever body the handler gave.
async fn not_modified() -> axum::response::Response {
    let chunks = futures::stream::iter([Ok::<_, std::io::Error>("stale")]);
    axum::response::Response::builder()
        .status(StatusCode::NOT_MODIFIED)
        .body(Body::from_stream(chunks))
        .unwrap()
}

#[tokio::test]
async fn a_304_answer_is_not_client_gone() {
    let (layer, mut reports) = admit(EndpointPolicy::builder(ms(5_000)).build());
    let url = serve(Router::new().route("/", get(not_modified)).layer(layer)).await;
    let res = reqwest::Client::new().get(url).send().await.unwrap();
    assert_eq!(res.status(), 304);
    assert_eq!(res.text().await.unwrap(), "");
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(
        report.cause(),
        None,
        "a complete answer reported as {report}"
    );
}

/// What `flood` holds: the test's ear for the drop of its body, and a pool of one connection
/// permit.
#[derive(Clone)]
struct Flood {
    gone: Arc<Mutex<Option<oneshot::Sender<()>>>>,
    pool: Arc<tokio::sync::Semaphore>,
}

/// A body of 16 MiB chunks for ever, as fast as the connection takes them, holding a permit
/// of the pool acquired through the request's scope (as a database connection would be).
/// `gone` hears when the body is dropped.
///
/// hyper polls a body only while its own write queue has room (less than about 400 KiB
/// queued), and only when its task is woken: a chunk much larger than the socket's buffers
/// (a few MiB on loopback) leaves the queue full once the client stops reading, so that
/// hyper polls the body no more, even when the cut at the deadline wakes it.
async fn flood(State(f): State<Flood>) -> Body {
    let permit = Scope::current().acquire(&f.pool).await.unwrap();
    let guard = (OnDrop(f.gone.lock().unwrap().take()), permit);
    let chunk = bytes::Bytes::from(vec![b'x'; 16 << 20]);
    let chunks = futures::stream::unfold(guard, move |guard| {
        let chunk = chunk.clone();
        async move { Some((Ok::<_, std::io::Error>(chunk), guard)) }
    });
    Body::from_stream(chunks)
}

/// A client that stops reading a large streamed body (and keeps its connection open), so that
/// the server cannot send and stops polling the body: at the deadline the handler's body is
/// dropped all the same, its pool permit goes back, and the request is reported; when the
/// client reads again, the response is cut.
#[tokio::test]
async fn a_client_that_stops_reading_pins_nothing_past_the_deadline() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let (layer, mut reports) = admit(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
    let (gone_tx, mut gone) = oneshot::channel();
    let pool = Arc::new(tokio::sync::Semaphore::new(1));
    let app = Router::new()
        .route("/", get(flood))
        .with_state(Flood {
            gone: Arc::new(Mutex::new(Some(gone_tx))),
            pool: pool.clone(),
        })
        .layer(layer);
    let url = serve(app).await;
    let addr = url.trim_start_matches("http://").trim_end_matches('/');
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let sent = Instant::now();
    conn.write_all(b"GET / HTTP/1.1\r\nhost: test\r\ngrpc-timeout: 2S\r\n\r\n")
        .await
        .unwrap();
    // The head and the first bytes of the body...
    let mut got = Vec::new();
    let mut buf = [0; 4096];
    let head_end = loop {
        let n = conn.read(&mut buf).await.unwrap();
        assert_ne!(n, 0, "the server closed the connection");
        got.extend_from_slice(&buf[..n]);
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            if got.len() > i + 4 {
                break i + 4;
            }
        }
    };
    assert!(got.starts_with(b"HTTP/1.1 200"), "{:?}", &got[..head_end]);
    assert_eq!(pool.available_permits(), 0);
    // ... and then the client reads no more, and keeps the connection open. The server fills
    // the socket's buffers and stops polling the body; the deadline passes.
    let (_, report) = next_report(&mut reports).await;
    assert!(sent.elapsed() >= CUT_AFTER);
    assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded), "{report}");
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
    // The handler's body was dropped before the report, without the server polling it (the
    // response is still stuck behind the client): its permit is back.
    assert_eq!(
        gone.try_recv(),
        Ok(()),
        "reported with the body still there"
    );
    assert_eq!(
        pool.available_permits(),
        1,
        "the body's permit is still held"
    );

    // The client reads again: the response is cut (the connection closes without the
    // chunked body's last chunk).
    let mut tail = Vec::new();
    timeout(PATIENCE, conn.read_to_end(&mut tail))
        .await
        .expect("the response was not cut")
        .unwrap();
    assert!(!tail.ends_with(b"0\r\n\r\n"), "the body ended cleanly");
}

/// A call that its scope stops mid-body (`chunk()` fails) lets go of its connection then,
/// not when the caller gets round to dropping the response: once the caller's scope reports
/// quiet, nothing of the call is left open (invariant 6), and the server sees its client go.
#[tokio::test]
async fn a_call_stopped_mid_body_closes_its_connection_while_the_response_is_held() {
    let (layer, mut reports) = admit(EndpointPolicy::builder(ms(60_000)).build());
    let url = serve(Router::new().route("/", get(trickle)).layer(layer)).await;
    let caller = Scope::with_timeout(ms(60_000));
    let mut res = reqwest::Client::new()
        .get(url)
        .scoped_in(&caller)
        .send()
        .await
        .unwrap();
    assert_eq!(res.chunk().await.unwrap().unwrap(), "first chunk");
    caller.cancel_with("user pressed stop");
    let err = res.chunk().await.unwrap_err();
    assert!(err.is_cancelled(), "{err}");
    // Stopped reads stay stopped.
    assert!(res.chunk().await.unwrap_err().is_cancelled());
    let report = timeout(PATIENCE, caller.quiesce()).await.unwrap();
    assert_eq!(report.cancelled(), 1, "{report}");
    // `res` is still held: the connection must be gone all the same.
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.cause(), Some(&Cause::ClientGone), "{report}");
    assert_eq!(res.status(), 200);
    drop(res);
}

/// `into_inner` hands the body over to plain reqwest, which still stops reading it at the
/// call's deadline (the docs say so): a body that trickles on is not read past it.
#[tokio::test]
async fn a_body_taken_out_with_into_inner_is_still_cut_at_the_deadline() {
    let url = serve(Router::new().route("/", get(trickle))).await;
    let scope = Scope::with_timeout(CUT_AFTER);
    let started = Instant::now();
    let res = reqwest::Client::new()
        .get(&url)
        .scoped_in(&scope)
        .send()
        .await
        .unwrap();
    let mut res = res.into_inner();
    assert_eq!(res.url().as_str(), url);
    assert_eq!(res.chunk().await.unwrap().unwrap(), "first chunk");
    let err = timeout(PATIENCE, res.chunk())
        .await
        .expect("the body was read on past the call's deadline")
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(started.elapsed() >= CUT_AFTER);
    // The call itself was receipted when the body was handed over.
    let report = timeout(PATIENCE, scope.quiesce()).await.unwrap();
    assert_eq!(report.succeeded(), 1, "{report}");
}

// ---------------------------------------------------------------------------------------------
// Egress owns the budget headers, and receipts follow the call: both clients (the reqwest
// extension, and `Propagate` around a plain hyper client) against axum servers.

type HyperClient =
    hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, String>;

/// `Propagate` around a plain hyper client.
fn propagated_hyper(layer: PropagateLayer) -> Propagate<HyperClient> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    layer.layer(client)
}

fn http_request(method: &str, url: &str) -> http::Request<String> {
    http::Request::builder()
        .method(method)
        .uri(url)
        .body(String::new())
        .unwrap()
}

/// The headers a request arrived with, before any layer of the server looked at them.
#[derive(Clone)]
struct Raw(axum::http::HeaderMap);

/// Keeps a copy of every request's headers as they arrived (in the extension `Raw`).
fn keep_raw_headers<S>(router: Router<S>) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    router.layer(tower::util::MapRequestLayer::new(
        |mut req: axum::http::Request<Body>| {
            let raw = Raw(req.headers().clone());
            req.extensions_mut().insert(raw);
            req
        },
    ))
}

/// What the inner service saw of one call.
#[derive(Clone, Debug)]
struct InnerSaw {
    declared: Option<Duration>,
    caller_operation: Option<String>,
    operation: String,
    priority: u8,
    service_budget: Option<String>,
}

/// A trusted inner service (at most 30 s, priority 5 by policy) that records what it saw.
async fn trusted_inner() -> (String, Arc<Mutex<Vec<InnerSaw>>>) {
    let saw = Arc::new(Mutex::new(Vec::new()));
    let policy = EndpointPolicy::builder(ms(30_000))
        .default_budget(ms(10_000))
        .trust(Trust::Trusted)
        .priority(5)
        .build();
    let app = Router::new()
        .route(
            "/",
            any(
                |State(saw): State<Arc<Mutex<Vec<InnerSaw>>>>,
                 Extension(a): Extension<Admission>,
                 Extension(Raw(raw)): Extension<Raw>| async move {
                    saw.lock().unwrap().push(InnerSaw {
                        declared: a.declared(),
                        caller_operation: a.caller_operation_id().map(str::to_owned),
                        operation: a.operation_id().to_owned(),
                        priority: a.priority(),
                        service_budget: raw
                            .get("service-budget")
                            .map(|v| v.to_str().unwrap().to_owned()),
                    });
                    "inner"
                },
            ),
        )
        .with_state(saw.clone())
        .layer(AdmitLayer::new(policy));
    (serve(keep_raw_headers(app)).await, saw)
}

/// What a caller of the edge sends: the most it may ask for, the most urgent priority, and
/// the operation id of someone else's request.
const HOSTILE_SERVICE_BUDGET: &str = r#"v=1, rem=86400000, prio=0, op="victim-op", gen=7"#;

/// The budget headers of `raw`, as a handler that forwards its caller's headers copies them.
fn budget_headers_of(raw: &axum::http::HeaderMap) -> reqwest::header::HeaderMap {
    let mut copied = reqwest::header::HeaderMap::new();
    for name in [
        "service-budget",
        "grpc-timeout",
        "x-envoy-expected-rq-timeout-ms",
    ] {
        for v in raw.get_all(name) {
            copied.append(name, v.clone());
        }
    }
    copied
}

/// The edge (untrusted callers, at most 10 s) has a handler that copies its caller's budget
/// headers onto calls to a trusted inner service (at most 30 s, which believes its callers'
/// priority and operation id) — from a bare `tokio::spawn` task, from a root scope with no
/// deadline, and from the request's own scope — through both clients. The inner service never
/// sees the caller's 86400000 ms, priority 0 or operation "victim-op": outside any scope the
/// call is refused, without a deadline it carries no budget header, and within the request's
/// scope it carries the edge's own header (the edge's operation, and at most the edge's 10 s).
#[tokio::test]
async fn a_handler_that_copies_its_callers_budget_headers_does_not_pass_them_on() {
    let (inner_url, saw) = trusted_inner().await;
    let refused = Arc::new(Mutex::new(Vec::new()));
    let edge_policy = EndpointPolicy::builder(ms(10_000))
        .default_budget(ms(1_000))
        .priority(4)
        .build();
    let state = (inner_url.clone(), refused.clone());
    let edge = Router::new()
        .route(
            "/",
            get(
                |State((inner, refused)): State<(String, Arc<Mutex<Vec<bool>>>)>,
                 Extension(Raw(raw)): Extension<Raw>| async move {
                    let copied = budget_headers_of(&raw);
                    let client = reqwest::Client::new();
                    let hyper_call = |copied: &reqwest::header::HeaderMap| {
                        let mut req = http_request("GET", &inner);
                        req.headers_mut().extend(copied.clone());
                        req
                    };
                    // (a) A bare task: no scope at all.
                    let (c, to, h) = (client.clone(), inner.clone(), copied.clone());
                    let spawned = tokio::spawn(async move {
                        let reqwest = c.get(&to).headers(h.clone()).send_scoped().await;
                        let mut req = http::Request::get(&to).body(String::new()).unwrap();
                        req.headers_mut().extend(h);
                        let tower = propagated_hyper(PropagateLayer::new()).oneshot(req).await;
                        (
                            reqwest.unwrap_err().is_no_scope(),
                            tower.unwrap_err().is_no_scope(),
                        )
                    });
                    let (a, b) = spawned.await.unwrap();
                    refused.lock().unwrap().extend([a, b]);
                    // (b) A root scope with no deadline.
                    let root = Scope::new();
                    let res = client
                        .get(&inner)
                        .headers(copied.clone())
                        .scoped_in(&root)
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(res.text().await.unwrap(), "inner");
                    let tower = propagated_hyper(PropagateLayer::new());
                    let res = root
                        .run(tower.oneshot(hyper_call(&copied)))
                        .await
                        .unwrap()
                        .unwrap();
                    read_body(res.into_body()).await.unwrap();
                    // (c) The request's own scope.
                    let res = client
                        .get(&inner)
                        .headers(copied.clone())
                        .send_scoped()
                        .await
                        .unwrap();
                    assert_eq!(res.text().await.unwrap(), "inner");
                    let tower = propagated_hyper(PropagateLayer::new());
                    let res = Scope::current()
                        .run(async move { tower.oneshot(hyper_call(&copied)).await })
                        .await
                        .unwrap()
                        .unwrap();
                    read_body(res.into_body()).await.unwrap();
                    "edge"
                },
            ),
        )
        .with_state(state)
        .layer(AdmitLayer::new(edge_policy));
    let edge_url = serve(keep_raw_headers(edge)).await;

    let res = reqwest::Client::new()
        .get(&edge_url)
        .header("service-budget", HOSTILE_SERVICE_BUDGET)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.text().await.unwrap(), "edge");

    assert_eq!(
        *refused.lock().unwrap(),
        [true, true],
        "unscoped calls were sent"
    );
    let saw = saw.lock().unwrap().clone();
    assert_eq!(saw.len(), 4, "{saw:?}");
    for s in &saw {
        assert_ne!(s.caller_operation.as_deref(), Some("victim-op"), "{s:?}");
        assert_ne!(s.operation, "victim-op", "{s:?}");
        assert_ne!(s.priority, 0, "{s:?}");
        assert!(s.declared.is_none_or(|d| d <= ms(10_000)), "{s:?}");
        let raw = s.service_budget.as_deref().unwrap_or_default();
        assert!(
            !raw.contains("86400000") && !raw.contains("victim-op"),
            "{s:?}"
        );
    }
    // (b): no deadline, no budget header: the inner service's own default and priority.
    for s in &saw[..2] {
        assert_eq!((s.declared, s.priority), (None, 5), "{s:?}");
        assert_eq!(s.service_budget, None, "{s:?}");
    }
    // (c): the edge's own header: its operation, its priority (4), at most its 10 s.
    for s in &saw[2..] {
        assert!(s.declared.is_some(), "{s:?}");
        assert_eq!(s.priority, 4, "{s:?}");
        assert_eq!(s.caller_operation, Some(s.operation.clone()), "{s:?}");
    }
    assert_eq!(saw[2].operation, saw[3].operation);
}

/// A server whose handler tells the test it got the request (`got`), then never answers.
async fn holding_server() -> (String, mpsc::UnboundedReceiver<String>) {
    let (tx, got) = mpsc::unbounded_channel();
    let app =
        Router::new()
            .route(
                "/{*path}",
                any(
                    |State(tx): State<mpsc::UnboundedSender<String>>,
                     method: axum::http::Method| async move {
                        let _ = tx.send(method.to_string());
                        std::future::pending::<()>().await;
                    },
                ),
            )
            .with_state(tx);
    (serve(app).await, got)
}

/// A `POST`, a `PUT` and a `DELETE` that the server got, cut off by their caller's cancel
/// before the answer, may have had their effect: `EffectUnknown`, and the report needs
/// reconciliation (a `PUT` is idempotent, safe to retry, but not "no effect"). A `GET` cut
/// off the same way is `Cancelled`, and the scope `CancelledStable`. Through both clients.
#[tokio::test]
async fn writes_cut_off_after_the_server_got_them_need_reconciliation() {
    let (url, mut got) = holding_server().await;
    let client = reqwest::Client::new();
    for method in ["POST", "PUT", "DELETE", "GET"] {
        for via_tower in [false, true] {
            let scope = Scope::with_timeout(ms(60_000));
            let target = format!("{url}orders/1");
            let call = tokio::spawn({
                let (client, scope) = (client.clone(), scope.clone());
                let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
                async move {
                    if via_tower {
                        // The call's scope in the request: the layer itself stops the call.
                        let tower = propagated_hyper(PropagateLayer::new());
                        let mut req = http_request(method.as_str(), &target);
                        req.extensions_mut().insert(scope);
                        tower.oneshot(req).await.unwrap_err().is_cancelled()
                    } else {
                        let sent = client.request(method, &target).scoped_in(&scope).send();
                        sent.await.unwrap_err().is_cancelled()
                    }
                }
            });
            let arrived = timeout(PATIENCE, got.recv()).await.unwrap().unwrap();
            assert_eq!(arrived, method);
            scope.cancel_with("user pressed stop");
            assert!(call.await.unwrap(), "{method}: not stopped by the cancel");
            let report = timeout(PATIENCE, scope.quiesce()).await.unwrap();
            let what = format!("{method} (tower: {via_tower}): {report}");
            if method == "GET" {
                assert_eq!(report.state(), Lifecycle::CancelledStable, "{what}");
                assert_eq!(report.cancelled(), 1, "{what}");
            } else {
                assert_eq!(report.state(), Lifecycle::NeedsReconciliation, "{what}");
                assert_eq!(report.effect_unknown(), 1, "{what}");
                let effect = &report.pending_effects()[0];
                assert!(
                    effect
                        .effect_id()
                        .starts_with(&format!("{method} {url}orders/1")),
                    "{what}: {effect:?}"
                );
            }
        }
    }
}

/// Sends `req` as the one call of a scope of its own (a minute), reads the whole body, and
/// returns the response's status and the call's receipt (see `verdict`).
async fn receipt_of_call(req: reqwest::RequestBuilder) -> (u16, String) {
    let scope = Scope::with_timeout(ms(60_000));
    let res = req.scoped_in(&scope).send().await.unwrap();
    let status = res.status().as_u16();
    res.bytes().await.unwrap();
    scope.close();
    let report = timeout(PATIENCE, scope.quiesce()).await.unwrap();
    (status, verdict(&report))
}

/// Answers `/status/{code}` with that status and a short body.
async fn status_server() -> String {
    let app = Router::new().route(
        "/status/{code}",
        any(
            |axum::extract::Path(code): axum::extract::Path<u16>| async move {
                (StatusCode::from_u16(code).unwrap(), "answer")
            },
        ),
    );
    serve(app).await
}

/// Receipts follow the status and the effect class, the same through both clients: a
/// read-only call with any error status is `Failed`; a call that may have had an effect is
/// `Failed` on a 4xx (refused unprocessed) and `EffectUnknown` on a 5xx, the status kept in
/// the record for whoever reconciles it.
#[tokio::test]
async fn receipts_follow_the_status_and_the_effect_class() {
    let url = status_server().await;
    let client = reqwest::Client::new();
    for (method, code, want) in [
        ("GET", 200, "s"),
        ("GET", 404, "f"),
        ("GET", 500, "f"),
        ("GET", 503, "f"),
        ("POST", 201, "s"),
        ("POST", 302, "s"),
        ("POST", 400, "f"),
        ("POST", 409, "f"),
        ("POST", 500, "u HTTP 500"),
        ("POST", 503, "u HTTP 503"),
        ("PUT", 503, "u HTTP 503"),
        ("DELETE", 404, "f"),
    ] {
        let target = format!("{url}status/{code}");
        for via_tower in [false, true] {
            if via_tower {
                let scope = Scope::with_timeout(ms(60_000));
                let tower = propagated_hyper(PropagateLayer::new());
                let req = http_request(method, &target);
                let res = scope
                    .run(async move { tower.oneshot(req).await })
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(res.status(), code);
                read_body(res.into_body()).await.unwrap();
                scope.close();
                let report = timeout(PATIENCE, scope.quiesce()).await.unwrap();
                assert_eq!(verdict(&report), want, "{method} {code} (tower): {report}");
            } else {
                let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
                let got = receipt_of_call(client.request(method.clone(), &target)).await;
                assert_eq!(got, (code, want.to_owned()), "{method} answered {code}");
            }
        }
    }
}

/// What a redirect server's `/landing` saw.
type Landings = Arc<Mutex<Vec<Option<String>>>>;

/// A server with `/landing` (records the `service-budget` it got, answers 200), `/away` (307
/// to `away`'s `/landing`), `/here` (307 to its own `/landing`) and `/made` (303 to its own
/// `/gone`, which answers 404).
async fn redirecting_server(away: Option<String>) -> (String, Landings) {
    let landings = Landings::default();
    let landing = {
        let landings = landings.clone();
        move |headers: axum::http::HeaderMap| async move {
            let budget = headers
                .get("service-budget")
                .map(|v| v.to_str().unwrap().to_owned());
            landings.lock().unwrap().push(budget);
            "landed"
        }
    };
    let to = |location: String| {
        move || async move {
            (
                StatusCode::TEMPORARY_REDIRECT,
                [(axum::http::header::LOCATION, location)],
            )
        }
    };
    let mut app = Router::new()
        .route("/landing", any(landing))
        .route("/here", any(to("/landing".to_owned())))
        .route(
            "/made",
            any(|| async {
                (
                    StatusCode::SEE_OTHER,
                    [(axum::http::header::LOCATION, "/gone")],
                )
            }),
        )
        .route("/gone", any(|| async { StatusCode::NOT_FOUND }));
    if let Some(away) = away {
        app = app.route("/away", any(to(format!("{away}landing"))));
    }
    (serve(app).await, landings)
}

/// With `redirect_policy`, a scoped call is not redirected to another origin (another port on
/// the same host is one): the other server never sees it, nor its budget, operation or
/// priority, and the caller gets the 307. Within the origin the redirect is followed. A write
/// that was redirected is receipted as such: its effect may have happened at the first
/// address, so the 404 of the last one is no proof that nothing happened (`EffectUnknown`,
/// not `Failed`), and the record says where the call ended up.
#[tokio::test]
async fn a_redirect_to_another_origin_does_not_carry_the_budget() {
    let (other, other_landings) = redirecting_server(None).await;
    let (url, landings) = redirecting_server(Some(other)).await;
    let client = reqwest::Client::builder()
        .redirect(cancel_scope::integrations::reqwest::redirect_policy())
        .build()
        .unwrap();

    // To another origin: not followed, the 307 is the answer.
    let got = receipt_of_call(client.post(format!("{url}away"))).await;
    assert_eq!(got, (307, "s".to_owned()));
    let other = other_landings.lock().unwrap().clone();
    assert!(other.is_empty(), "followed to another origin: {other:?}");

    // Within the origin: followed, with the budget.
    let got = receipt_of_call(client.get(format!("{url}here"))).await;
    assert_eq!(got, (200, "s".to_owned()));
    let landed = landings.lock().unwrap().clone();
    assert_eq!(landed.len(), 1);
    let budget = landed[0].as_deref().unwrap_or_default();
    assert!(budget.starts_with("v=1, rem="), "{landed:?}");

    // A write redirected (303: processed, see elsewhere) to an address that answers 404.
    let scope = Scope::with_timeout(ms(60_000));
    let res = client
        .post(format!("{url}made"))
        .scoped_in(&scope)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    res.bytes().await.unwrap();
    scope.close();
    let report = timeout(PATIENCE, scope.quiesce()).await.unwrap();
    assert_eq!(verdict(&report), "u HTTP 404", "{report}");
    assert_eq!(report.state(), Lifecycle::NeedsReconciliation);
    let effect = &report.pending_effects()[0];
    let id = effect.effect_id();
    assert!(id.starts_with(&format!("POST {url}made")), "{effect:?}");
    assert_eq!(effect.redirected_to_str(), Some(&*format!("{url}gone")));

    // The same POST without a redirect is refused unprocessed: `Failed`.
    let got = receipt_of_call(client.post(format!("{url}gone"))).await;
    assert_eq!(got, (404, "f".to_owned()));
}
