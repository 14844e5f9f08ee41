//! The tower layers on tokio's virtual clock, with in-process services (no sockets): exact
//! deadlines, status mapping, client-gone on drop, receipts, and the client body cut-off.
//! `tower_http.rs` and `tower_grpc.rs` run the same layers over real loopback servers.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use cancel_scope::integrations::tower::{AdmitLayer, PropagateLayer};
use cancel_scope::wire::service_budget::ServiceBudget;
use cancel_scope::wire::{grpc_timeout, Admission, EgressPolicy, EndpointPolicy};
use cancel_scope::{Cause, ChildSpec, Lifecycle, Report, Scope};
use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame};
use tokio::sync::mpsc;
use tokio::time::{advance, Instant};
use tower_layer::Layer;
use tower_service::Service;

mod support;
use support::tower::{verdict, Fn_};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A handler that spawns 60 s of work in the request's scope and waits for it.
async fn stuck(_: Request<()>) -> Result<Response<String>, Infallible> {
    let work = Scope::current()
        .spawn(tokio::time::sleep(Duration::from_secs(60)))
        .unwrap();
    let _ = work.await;
    Ok(Response::new("finished".to_owned()))
}

fn reporting(policy: EndpointPolicy) -> (AdmitLayer, mpsc::UnboundedReceiver<(Admission, Report)>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let layer = AdmitLayer::new(policy).on_report(move |a, r| {
        let _ = tx.send((a.clone(), r.clone()));
    });
    (layer, rx)
}

#[tokio::test(start_paused = true)]
async fn admit_answers_504_exactly_at_the_deadline_and_reports() {
    let (layer, mut reports) = reporting(EndpointPolicy::new(ms(5_000), ms(1_000)).reserve(ms(10)));
    let mut svc = layer.layer(Fn_(stuck));
    let start = Instant::now();
    let req = Request::builder()
        .header("grpc-timeout", "250m")
        .body(())
        .unwrap();
    let res = svc.call(req).await.unwrap();
    assert_eq!(res.status(), 504);
    assert_eq!(Instant::now() - start, ms(240));
    let (a, report) = reports.recv().await.unwrap();
    assert_eq!(a.initial_remaining(), ms(240));
    assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded));
    assert_eq!(report.state(), Lifecycle::CancelledStable);
    // The handler and its work, stopped.
    assert_eq!(report.cancelled(), 2);

    // gRPC: trailers-only DEADLINE_EXCEEDED.
    let req = Request::builder()
        .header("content-type", "application/grpc+proto")
        .body(())
        .unwrap();
    let res = svc.call(req).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["grpc-status"], "4");
    assert!(!res.headers()["grpc-message"].is_empty());
    assert_eq!(Instant::now() - start, ms(240 + 990)); // the default, less the reserve
}

#[tokio::test(start_paused = true)]
async fn admit_rejects_bad_or_useless_budgets_without_calling_the_handler() {
    let policy = EndpointPolicy::new(ms(5_000), ms(1_000)).min_useful(ms(100));
    let ran = Arc::new(AtomicBool::new(false));
    let flag = ran.clone();
    let mut svc = AdmitLayer::new(policy).layer(Fn_(move |_: Request<()>| {
        flag.store(true, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new(String::new())) }
    }));
    let with = |k: &str, v: &str, grpc: bool| {
        let mut b = Request::builder().header(k, v);
        if grpc {
            b = b.header("content-type", "application/grpc");
        }
        b.body(()).unwrap()
    };
    let res = svc
        .call(with("service-budget", "v=7, rem=1", false))
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    let res = svc
        .call(with("service-budget", "v=7, rem=1", true))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["grpc-status"], "3");
    // Too little left on arrival: 504 / DEADLINE_EXCEEDED.
    let res = svc.call(with("grpc-timeout", "50m", false)).await.unwrap();
    assert_eq!(res.status(), 504);
    let res = svc.call(with("grpc-timeout", "50m", true)).await.unwrap();
    assert_eq!(res.headers()["grpc-status"], "4");
    // A media type is case-insensitive: still a gRPC call, answered as one.
    let mut req = with("grpc-timeout", "50m", false);
    req.headers_mut()
        .insert("content-type", "Application/GRPC+proto".parse().unwrap());
    let res = svc.call(req).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["grpc-status"], "4");
    assert!(!ran.load(Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn dropping_the_response_future_is_client_gone() {
    let (layer, mut reports) = reporting(EndpointPolicy::new(ms(5_000), ms(1_000)));
    let mut svc = layer.layer(Fn_(stuck));
    let mut fut = Box::pin(svc.call(Request::new(())));
    // Let the handler start its work, then go away.
    assert!(poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_pending())).await);
    advance(ms(10)).await;
    drop(fut);
    let (_, report) = reports.recv().await.unwrap();
    assert_eq!(report.cause(), Some(&Cause::ClientGone));
    // The handler and its work.
    assert_eq!(report.cancelled(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_handler_sees_its_scope_and_admission() {
    let mut svc = AdmitLayer::new(EndpointPolicy::new(ms(5_000), ms(1_000))).layer(Fn_(
        |req: Request<()>| async move {
            let a = req.extensions().get::<Admission>().unwrap();
            let scope = req.extensions().get::<Scope>().unwrap();
            assert_eq!(scope.deadline(), Scope::current().deadline());
            Ok::<_, Infallible>(Response::new(format!(
                "{} {}",
                a.initial_remaining().as_millis(),
                Scope::current().remaining().unwrap().as_millis()
            )))
        },
    ));
    let req = Request::builder()
        .header("grpc-timeout", "700m")
        .body(())
        .unwrap();
    let body = svc.call(req).await.unwrap().into_body();
    assert_eq!(body.into_inner().unwrap(), "700 700");
}

/// A response body that yields the given frames, then stays pending (or, `ENDS`, has ended).
struct Frames<const ENDS: bool>(VecDeque<Frame<&'static [u8]>>);

impl<const ENDS: bool> Body for Frames<ENDS> {
    type Data = &'static [u8];
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<&'static [u8]>, Infallible>>> {
        match self.0.pop_front() {
            Some(f) => Poll::Ready(Some(Ok(f))),
            None if ENDS => Poll::Ready(None),
            None => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        ENDS && self.0.is_empty()
    }
}

async fn next_frame<B: Body + Unpin>(body: &mut B) -> Option<Result<Frame<B::Data>, B::Error>> {
    poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
}

/// Calls `client` with `scope` current (as a handler would), expecting a response.
async fn call_in<S>(scope: &Scope, client: &mut S, req: Request<()>) -> S::Response
where
    S: Service<Request<()>>,
    S::Error: std::fmt::Debug,
{
    scope
        .run(async { client.call(req).await })
        .await
        .unwrap()
        .unwrap()
}

/// The gRPC method `grpc_request` calls.
const METHOD: &str = "/test.Budget/Probe";

fn grpc_request() -> Request<()> {
    Request::post(METHOD)
        .header("content-type", "application/grpc")
        .body(())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn propagate_cuts_a_slow_body_at_the_deadline() {
    let transport = Fn_(|_: Request<()>| async {
        let first = Frame::data(&b"first"[..]);
        Ok::<_, Infallible>(Response::new(Frames::<false>(VecDeque::from([first]))))
    });
    let mut client = PropagateLayer::new().layer(transport);
    let scope = Scope::with_timeout(ms(300));

    // gRPC: the body ends with DEADLINE_EXCEEDED trailers.
    let res = call_in(&scope, &mut client, grpc_request()).await;
    let mut body = Box::pin(res.into_body());
    assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
    let trailers = next_frame(&mut body).await.unwrap().unwrap();
    assert_eq!(trailers.trailers_ref().unwrap()["grpc-status"], "4");
    assert!(next_frame(&mut body).await.is_none());
    assert_eq!(Some(Instant::now()), scope.deadline());

    // Plain HTTP: an error.
    let scope = Scope::with_timeout(ms(300));
    let res = call_in(&scope, &mut client, Request::new(())).await;
    let mut body = Box::pin(res.into_body());
    assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
    let err = next_frame(&mut body).await.unwrap().unwrap_err();
    assert!(err.is_deadline_exceeded());
    let report = scope.quiesce().await;
    assert_eq!(report.cancelled(), 1);
}

#[tokio::test(start_paused = true)]
async fn propagate_rewrites_cancelled_after_the_budget_ran_out() {
    // A callee that times out on `grpc-timeout` itself says CANCELLED; after the budget it was
    // told has run out, that is a deadline.
    let transport = Fn_(|req: Request<()>| async move {
        let told = cancel_scope::wire::grpc_timeout::decode(
            req.headers()["grpc-timeout"].to_str().unwrap(),
        )
        .unwrap();
        tokio::time::sleep(told).await;
        let mut res = Response::new(Frames::<false>(VecDeque::new()));
        res.headers_mut()
            .insert("grpc-status", "1".parse().unwrap());
        Ok::<_, Infallible>(res)
    });
    let mut client = PropagateLayer::new()
        .egress(EgressPolicy::new().transport_pad(ms(20)))
        .layer(transport);
    let scope = Scope::with_timeout(ms(300));
    let res = call_in(&scope, &mut client, grpc_request()).await;
    assert_eq!(res.headers()["grpc-status"], "4");

    // Before the budget ran out, CANCELLED stays CANCELLED.
    let early = Fn_(|_: Request<()>| async {
        let mut res = Response::new(Frames::<false>(VecDeque::new()));
        res.headers_mut()
            .insert("grpc-status", "1".parse().unwrap());
        Ok::<_, Infallible>(res)
    });
    let mut client = PropagateLayer::new().layer(early);
    let scope = Scope::with_timeout(ms(300));
    let res = call_in(&scope, &mut client, grpc_request()).await;
    assert_eq!(res.headers()["grpc-status"], "1");
}

/// A response body that sends one data frame, then fails (as a stream reset does) at `reset`.
struct ResetAt {
    sent: bool,
    reset: Pin<Box<tokio::time::Sleep>>,
}

impl Body for ResetAt {
    type Data = &'static [u8];
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<&'static [u8]>, std::io::Error>>> {
        if !self.sent {
            self.sent = true;
            return Poll::Ready(Some(Ok(Frame::data(&b"first"[..]))));
        }
        self.reset.as_mut().poll(cx).map(|()| {
            let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "stream reset");
            Some(Err(reset))
        })
    }
}

/// A callee (or a proxy: Envoy resets a stream whose route timeout fires after the response
/// started) that gives up mid-body when the budget it was told runs out resets the stream.
/// After that budget that is our deadline, mid-body as at the head: a gRPC body ends with
/// `DEADLINE_EXCEEDED` trailers (a tonic client reports `Code::DeadlineExceeded`), not with an
/// error that tonic would report as CANCELLED or UNKNOWN.
#[tokio::test(start_paused = true)]
async fn propagate_reports_a_reset_after_the_budget_ran_out_as_deadline_exceeded_mid_body() {
    let transport = Fn_(|req: Request<()>| async move {
        let told = grpc_timeout::decode_bytes(req.headers()["grpc-timeout"].as_bytes()).unwrap();
        let reset = Box::pin(tokio::time::sleep(told));
        Ok::<_, Infallible>(Response::new(ResetAt { sent: false, reset }))
    });
    let mut client = PropagateLayer::new()
        .egress(EgressPolicy::new().transport_pad(ms(20)))
        .read_only_method(METHOD)
        .layer(transport);
    let scope = Scope::with_timeout(ms(300));
    let res = call_in(&scope, &mut client, grpc_request()).await;
    let mut body = Box::pin(res.into_body());
    assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
    let end = next_frame(&mut body).await.unwrap();
    // Reset when the 280 ms it was told ran out, before our own deadline fired.
    assert!(!scope.is_cancelled());
    let trailers = end.expect("the reset came out as an error, not as DEADLINE_EXCEEDED");
    assert_eq!(trailers.trailers_ref().unwrap()["grpc-status"], "4");
    assert!(next_frame(&mut body).await.is_none());
    drop(body);
    scope.close();
    // Stopped by the deadline it told: a read-only call's receipt is `Cancelled`.
    let report = scope.quiesce().await;
    assert_eq!(report.cancelled(), 1, "{report}");
}

/// `grpc-timeout` truncates a budget of 100 s or more to whole milliseconds (8 digits), so
/// the callee is told a little less than the call has: its own timeout on the header fires
/// first. The CANCELLED it answers then is still our deadline, not a cancel.
#[tokio::test(start_paused = true)]
async fn propagate_rewrites_cancelled_at_the_truncated_budget_it_told() {
    let transport = Fn_(|req: Request<()>| async move {
        let told = grpc_timeout::decode_bytes(req.headers()["grpc-timeout"].as_bytes()).unwrap();
        tokio::time::sleep(told).await;
        let mut res = Response::new(Frames::<false>(VecDeque::new()));
        res.headers_mut()
            .insert("grpc-status", "1".parse().unwrap());
        Ok::<_, Infallible>(res)
    });
    let mut client = PropagateLayer::new().layer(transport);
    // 100 s and 0.5 ms: sent as `100000m`.
    let scope = Scope::with_timeout(Duration::from_micros(100_000_500));
    let res = call_in(&scope, &mut client, grpc_request()).await;
    assert_eq!(res.headers()["grpc-status"], "4");
}

#[tokio::test(start_paused = true)]
async fn propagate_does_not_forward_an_incoming_envoy_timeout() {
    let transport = Fn_(|req: Request<()>| async move {
        let mut res = Response::new(Frames::<false>(VecDeque::new()));
        let envoy = req.headers().get_all("x-envoy-expected-rq-timeout-ms");
        res.headers_mut().insert(
            "x-envoy-lines",
            envoy.iter().count().to_string().parse().unwrap(),
        );
        res.headers_mut()
            .insert("x-grpc-timeout", req.headers()["grpc-timeout"].clone());
        Ok::<_, Infallible>(res)
    });
    let mut client = PropagateLayer::new().layer(transport);
    // A handler that copied its incoming headers: a caller's Envoy value (here a forged,
    // malformed one, which a trusted callee would answer with 400) must not go on.
    let mut req = grpc_request();
    req.headers_mut()
        .append("x-envoy-expected-rq-timeout-ms", "99999x".parse().unwrap());
    req.headers_mut()
        .append("x-envoy-expected-rq-timeout-ms", "5000".parse().unwrap());
    let scope = Scope::with_timeout(ms(1_000));
    let res = call_in(&scope, &mut client, req).await;
    assert_eq!(res.headers()["x-envoy-lines"], "0");
    assert_eq!(res.headers()["x-grpc-timeout"], "1000000u");
    // A valid one may only shorten the call, as any budget header on the request.
    let mut req = grpc_request();
    req.headers_mut()
        .append("x-envoy-expected-rq-timeout-ms", "5".parse().unwrap());
    let res = call_in(&scope, &mut client, req).await;
    assert_eq!(res.headers()["x-envoy-lines"], "0");
    assert_eq!(res.headers()["x-grpc-timeout"], "5000000n");
}

#[tokio::test(start_paused = true)]
async fn propagate_receipts_an_explicit_spec_by_how_the_call_ended() {
    let complete = Fn_(|_: Request<()>| async move {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let frames = VecDeque::from([Frame::data(&b"ok"[..]), Frame::trailers(trailers)]);
        Ok::<_, Infallible>(Response::new(Frames::<false>(frames)))
    });
    let mut client = PropagateLayer::new()
        .spec(ChildSpec::side_effecting("pay", "p-1"))
        .layer(complete);

    // Read to its trailers (`OK`): Succeeded.
    let scope = Scope::with_timeout(ms(1_000));
    let res = call_in(&scope, &mut client, grpc_request()).await;
    let mut body = Box::pin(res.into_body());
    while next_frame(&mut body).await.is_some() {}
    // Dropped unread: an effectful call's outcome is unknown.
    let res = call_in(&scope, &mut client, grpc_request()).await;
    drop(res);
    scope.close();
    let report = scope.quiesce().await;
    assert_eq!(report.succeeded(), 1, "{report}");
    assert_eq!(report.effect_unknown(), 1, "{report}");
    assert_eq!(report.state(), Lifecycle::NeedsReconciliation);
    assert_eq!(report.pending_effects()[0].effect_id(), "p-1");
}

/// A transport that answers with the budget headers it got, one response header per line:
/// `x-seen-<name>: <value>` (as `Fn_(shows_budget_headers)`).
fn shows_budget_headers(
    req: Request<()>,
) -> std::future::Ready<Result<Response<String>, Infallible>> {
    let mut res = Response::new(String::new());
    for name in [
        "grpc-timeout",
        "service-budget",
        "x-envoy-expected-rq-timeout-ms",
    ] {
        for v in req.headers().get_all(name) {
            let seen: http::HeaderName = format!("x-seen-{name}").parse().unwrap();
            res.headers_mut().append(seen, v.clone());
        }
    }
    std::future::ready(Ok(res))
}

/// The budget headers a caller of ours sent, copied by a handler onto its own call.
fn with_copied_headers(mut req: Request<()>) -> Request<()> {
    let h = req.headers_mut();
    h.insert(
        "service-budget",
        r#"v=1, rem=86400000, prio=0, op="victim-op", gen=9"#
            .parse()
            .unwrap(),
    );
    h.insert(
        "x-envoy-expected-rq-timeout-ms",
        "86400000".parse().unwrap(),
    );
    req
}

fn seen(res: &Response<impl Body>, name: &str) -> Vec<String> {
    res.headers()
        .get_all(format!("x-seen-{name}"))
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

/// A call made outside any scope (a bare `tokio::spawn` task, a background thread) is refused
/// as the reqwest extension refuses it: nothing is sent. A gRPC caller gets a trailers-only
/// `FAILED_PRECONDITION` (a tonic client reads that status; it would make an error it cannot
/// downcast `UNKNOWN`), any other an error that `is_no_scope`.
#[tokio::test(start_paused = true)]
async fn propagate_refuses_a_call_outside_any_scope() {
    let sent = Arc::new(AtomicUsize::new(0));
    let counted = sent.clone();
    let transport = Fn_(move |_: Request<()>| {
        counted.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok::<_, Infallible>(Response::new(String::new())))
    });
    let mut client = PropagateLayer::new().layer(transport);
    let err = client.call(Request::new(())).await.unwrap_err();
    assert!(err.is_no_scope(), "{err}");
    let res = client
        .call(with_copied_headers(grpc_request()))
        .await
        .unwrap();
    assert_eq!(res.headers()["grpc-status"], "9");
    let message = res.headers()["grpc-message"].to_str().unwrap();
    assert!(message.contains("no current scope"), "{message}");
    assert_eq!(sent.load(Ordering::SeqCst), 0);
}

/// The explicit opt-in: a call outside any scope is sent, without the `service-budget` or
/// Envoy header a handler copied onto it, with the caller's own `grpc-timeout` kept but
/// never above the layer's cap (and the cap where there was none).
#[tokio::test(start_paused = true)]
async fn propagate_lets_unscoped_calls_through_only_when_allowed_and_capped() {
    let mut client = PropagateLayer::new()
        .allow_unscoped(ms(2_000))
        .layer(Fn_(shows_budget_headers));
    let res = client
        .call(with_copied_headers(Request::new(())))
        .await
        .unwrap();
    assert_eq!(seen(&res, "service-budget"), Vec::<String>::new());
    assert_eq!(
        seen(&res, "x-envoy-expected-rq-timeout-ms"),
        Vec::<String>::new()
    );
    assert_eq!(seen(&res, "grpc-timeout"), ["2000000u"]);
    let mut req = with_copied_headers(grpc_request());
    req.headers_mut()
        .insert("grpc-timeout", "99999999H".parse().unwrap());
    let res = client.call(req).await.unwrap();
    assert_eq!(seen(&res, "grpc-timeout"), ["2000000u"]);
    let mut req = Request::new(());
    req.headers_mut()
        .insert("grpc-timeout", "150m".parse().unwrap());
    let res = client.call(req).await.unwrap();
    assert_eq!(seen(&res, "grpc-timeout"), ["150000u"]);
}

/// Egress owns the budget headers: a `service-budget` that a handler copied from its caller
/// onto a call is not passed on, also when the call's scope has no deadline (a root from
/// `Scope::new()`): its priority, operation id and generation never, its budget only where it
/// shortens a call that has one.
#[tokio::test(start_paused = true)]
async fn propagate_replaces_copied_budget_headers_also_without_a_deadline() {
    let mut client = PropagateLayer::new().layer(Fn_(shows_budget_headers));
    // No deadline: no budget headers at all (the callee applies its own default).
    let unbounded = Scope::new();
    let res = call_in(
        &unbounded,
        &mut client,
        with_copied_headers(Request::new(())),
    )
    .await;
    assert_eq!(seen(&res, "service-budget"), Vec::<String>::new());
    assert_eq!(seen(&res, "grpc-timeout"), Vec::<String>::new());
    assert_eq!(
        seen(&res, "x-envoy-expected-rq-timeout-ms"),
        Vec::<String>::new()
    );
    // ... unless the caller set its own per-call timeout (tonic's `Request::set_timeout`).
    let mut req = with_copied_headers(Request::new(()));
    req.headers_mut()
        .insert("grpc-timeout", "300m".parse().unwrap());
    let res = call_in(&unbounded, &mut client, req).await;
    assert_eq!(seen(&res, "grpc-timeout"), ["300000u"]);
    let budget = ServiceBudget::parse(&seen(&res, "service-budget")[0]).unwrap();
    assert_eq!(budget.remaining(), ms(300));
    assert_eq!((budget.priority(), budget.operation_id()), (None, None));
    assert_eq!(budget.generation(), 0);

    // With a deadline: our own header, with the scope's budget.
    let bounded = Scope::with_timeout(ms(1_000));
    let res = call_in(&bounded, &mut client, with_copied_headers(Request::new(()))).await;
    let budget = ServiceBudget::parse(&seen(&res, "service-budget")[0]).unwrap();
    assert_eq!(budget.remaining(), ms(1_000));
    assert_eq!((budget.priority(), budget.operation_id()), (None, None));
    assert_eq!(budget.generation(), 0);
    assert_eq!(seen(&res, "grpc-timeout"), ["1000000u"]);
    assert_eq!(
        seen(&res, "x-envoy-expected-rq-timeout-ms"),
        Vec::<String>::new()
    );
}

/// Without a spec, a call's effect class comes from its request: a `GET` cut off is
/// `Cancelled` (the scope stays `CancelledStable`); a `PUT`, a `DELETE`, a `POST` and a gRPC
/// call (side-effecting unless declared) cut off after they were sent may have had their
/// effect: `EffectUnknown`, and the report needs reconciliation, each listed once.
#[tokio::test(start_paused = true)]
async fn propagate_takes_the_effect_class_from_the_request() {
    let mut client = PropagateLayer::new().layer(silent());
    let cut = |method: &str, uri: &str, grpc: bool| {
        let mut req = Request::builder().method(method).uri(uri);
        if grpc {
            req = req.header("content-type", "application/grpc");
        }
        req.body(()).unwrap()
    };
    let get = Scope::with_timeout(ms(1_000));
    let call = start_in(
        &get,
        &mut client,
        cut("GET", "http://orders/orders/1", false),
    )
    .await;
    get.cancel();
    assert!(call.await.unwrap_err().is_cancelled());
    assert_eq!(get.quiesce().await.state(), Lifecycle::CancelledStable);

    let writes = Scope::with_timeout(ms(1_000));
    let mut calls = Vec::new();
    for (method, uri, grpc) in [
        ("PUT", "http://orders/orders/1", false),
        ("DELETE", "http://orders/orders/1", false),
        ("POST", "http://orders/orders", false),
        ("POST", "http://orders/orders", false),
        ("POST", METHOD, true),
    ] {
        calls.push(start_in(&writes, &mut client, cut(method, uri, grpc)).await);
    }
    writes.cancel();
    for call in calls {
        drop(call.await);
    }
    let report = writes.quiesce().await;
    assert_eq!(report.state(), Lifecycle::NeedsReconciliation, "{report}");
    assert_eq!(report.effect_unknown(), 5, "{report}");
    let ids: Vec<_> = report
        .pending_effects()
        .iter()
        .map(|e| e.effect_id())
        .collect();
    assert_eq!(
        ids.len(),
        5,
        "two POSTs to one address are two effects: {ids:?}"
    );
    assert_eq!(ids[0], "PUT http://orders/orders/1");
    assert_eq!(ids[1], "DELETE http://orders/orders/1");
    assert!(
        ids[2].starts_with("POST http://orders/orders (call "),
        "{ids:?}"
    );
    assert!(
        ids[4].starts_with("POST /test.Budget/Probe (call "),
        "{ids:?}"
    );

    // Declared read-only, the gRPC method is cut off as a read.
    let mut client = PropagateLayer::new()
        .read_only_method(METHOD)
        .layer(silent());
    let scope = Scope::with_timeout(ms(1_000));
    let call = start_in(&scope, &mut client, grpc_request()).await;
    scope.cancel();
    drop(call.await);
    assert_eq!(scope.quiesce().await.state(), Lifecycle::CancelledStable);
}

/// A transport that answers every request with the trailers-only gRPC status `code`.
fn grpc_answers(
    code: &'static str,
) -> impl Service<
    Request<()>,
    Response = Response<Frames<true>>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Frames<true>>, Infallible>>,
> + Clone {
    Fn_(move |_: Request<()>| async move {
        let mut res = Response::new(Frames::<true>(VecDeque::new()));
        res.headers_mut()
            .insert("grpc-status", code.parse().unwrap());
        Ok::<_, Infallible>(res)
    })
}

/// A trailers-only gRPC answer decides the receipt at the head: `OK` succeeds; an error is
/// `Failed` for a read-only method and for a refusal (`NOT_FOUND`), and `EffectUnknown`, with
/// the status in the record, for a call that may have had its effect.
#[tokio::test(start_paused = true)]
async fn propagate_receipts_a_trailers_only_grpc_status() {
    for (code, read_only, want) in [
        ("0", false, "s"),
        ("14", true, "f"),
        ("5", false, "f"),
        ("14", false, "u gRPC UNAVAILABLE"),
        ("13", false, "u gRPC INTERNAL"),
    ] {
        let layer = PropagateLayer::new();
        let layer = if read_only {
            layer.read_only_method(METHOD)
        } else {
            layer
        };
        let mut client = layer.layer(grpc_answers(code));
        let scope = Scope::with_timeout(ms(1_000));
        let res = call_in(&scope, &mut client, grpc_request()).await;
        assert_eq!(res.headers()["grpc-status"], code);
        drop(res);
        scope.close();
        let report = scope.quiesce().await;
        let what = format!("grpc-status {code}, read-only {read_only}: {report}");
        assert_eq!(verdict(&report), want, "{what}");
    }
}

/// A gRPC body that ends without trailers has no status: a protocol error, which an
/// effectful call cannot take as done.
#[tokio::test(start_paused = true)]
async fn propagate_does_not_take_a_grpc_body_without_a_status_as_success() {
    let no_status = Fn_(|_: Request<()>| async {
        let frames = VecDeque::from([Frame::data(&b"msg"[..])]);
        Ok::<_, Infallible>(Response::new(Frames::<true>(frames)))
    });
    let mut client = PropagateLayer::new().layer(no_status);
    let scope = Scope::with_timeout(ms(1_000));
    let res = call_in(&scope, &mut client, grpc_request()).await;
    let mut body = Box::pin(res.into_body());
    while next_frame(&mut body).await.is_some() {}
    scope.close();
    let report = scope.quiesce().await;
    assert_eq!(report.effect_unknown(), 1, "{report}");
    let effect = &report.pending_effects()[0];
    assert_eq!(effect.status_str(), Some("gRPC status missing"));
}

/// A reader that stops at `is_end_stream` (hyper's server does, forwarding a proxied body:
/// after the last data frame it ends the message and drops the body unpolled) has read the
/// whole exchange: `Succeeded`, not the `EffectUnknown` (or `Cancelled`) of a body dropped
/// before its end.
#[tokio::test(start_paused = true)]
async fn propagate_completes_a_body_read_to_its_end_stream_and_dropped_unpolled() {
    let sized = Fn_(|_: Request<()>| async {
        let frames = VecDeque::from([Frame::data(&b"all of it"[..])]);
        Ok::<_, Infallible>(Response::new(Frames::<true>(frames)))
    });
    let mut client = PropagateLayer::new()
        .spec(ChildSpec::side_effecting("pay", "p-2"))
        .layer(sized);
    let scope = Scope::with_timeout(ms(1_000));
    let res = call_in(&scope, &mut client, Request::new(())).await;
    let mut body = Box::pin(res.into_body());
    assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
    assert!(body.is_end_stream());
    drop(body);
    scope.close();
    let report = scope.quiesce().await;
    assert_eq!(report.succeeded(), 1, "{report}");
    assert_eq!(report.effect_unknown(), 0, "{report}");
}

#[test]
fn auto_traits() {
    use cancel_scope::integrations::tower::{admit, propagate, Admit, Propagate};
    use cancel_scope::integrations::CallError;
    fn send_sync<T: Send + Sync + 'static>() {}
    fn send<T: Send + 'static>() {}
    fn error<E: std::error::Error + Send + Sync + 'static>() {}
    type Fut = std::future::Ready<Result<Response<String>, Infallible>>;
    send_sync::<AdmitLayer>();
    send_sync::<PropagateLayer>();
    send_sync::<Admit<()>>();
    send_sync::<Propagate<()>>();
    send::<admit::future::ResponseFuture<Fut, String>>();
    send::<propagate::future::ResponseFuture<Fut>>();
    send_sync::<propagate::ResponseBody<String>>();
    error::<CallError>();
}

/// A handler whose future panics is answered 500 / `INTERNAL` (not a reset: the panic does
/// not reach the server), is receipted `Failed` with the panic's message in the report, and
/// its request is cancelled with "the handler panicked" (not `ClientGone`).
#[tokio::test(start_paused = true)]
async fn a_handler_panic_answers_500_or_internal_and_is_failed() {
    let (layer, mut reports) = reporting(EndpointPolicy::new(ms(5_000), ms(1_000)));
    let mut svc = layer.layer(Fn_(|_: Request<()>| async {
        if true {
            panic!("handler bug");
        }
        Ok::<_, Infallible>(Response::new(String::new()))
    }));
    let res = tokio::spawn(svc.call(Request::new(())))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), 500);
    assert_eq!(res.headers()["service-effect"], "none");
    let (_, report) = reports.recv().await.unwrap();
    let cause = report.cause().cloned().unwrap();
    assert_eq!(
        cause,
        Cause::cancelled("the handler panicked"),
        "{report:?}"
    );
    assert_eq!(report.failed(), 1, "{report}");
    let failures = report.failures();
    assert_eq!(failures.len(), 1, "{report:?}");
    assert_eq!(failures[0].child(), "handler");
    assert_eq!(failures[0].error(), "panicked: handler bug");

    // gRPC: a trailers-only `INTERNAL`, the panic's message kept from the caller.
    let grpc = Request::builder()
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let res = svc.call(grpc).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["grpc-status"], "13");
    assert_eq!(res.headers()["grpc-message"], "internal error");
}

/// A handler that panics in `call` itself (before its future exists: code a service runs
/// synchronously, with the scope current) is a handler panic too: answered 500, the request's
/// scope cancelled with "the handler panicked" and reported, and work it spawned into the
/// scope stopped, not left running until the deadline.
#[tokio::test(start_paused = true)]
async fn a_handler_panic_in_call_cancels_and_reports_the_request() {
    let (layer, mut reports) = reporting(EndpointPolicy::new(ms(5_000), ms(1_000)));
    let mut svc = layer.layer(Fn_(|_: Request<()>| {
        let _spawned = Scope::current()
            .spawn(std::future::pending::<()>())
            .unwrap();
        if true {
            panic!("handler bug in call");
        }
        async { Ok::<_, Infallible>(Response::new(String::new())) }
    }));
    let res = svc.call(Request::new(())).await.unwrap();
    assert_eq!(res.status(), 500);
    let start = Instant::now();
    let report = tokio::time::timeout(ms(10_000), reports.recv())
        .await
        .expect("the request is reported")
        .unwrap()
        .1;
    assert_eq!(
        report.cause().cloned(),
        Some(Cause::cancelled("the handler panicked")),
        "{report:?}"
    );
    assert!(
        start.elapsed() < ms(5_000),
        "the spawned work was stopped at once"
    );
}

/// A handler whose response body yields `first` at once, then one more chunk every 100 ms for
/// ever.
fn streaming_handler(
    req: Request<()>,
) -> impl Future<Output = Result<Response<Ticks>, Infallible>> {
    drop(req);
    async { Ok(Response::new(Ticks(None))) }
}

/// A response body that never ends: a chunk at once, then one every 100 ms.
struct Ticks(Option<Pin<Box<tokio::time::Sleep>>>);

impl Body for Ticks {
    type Data = &'static [u8];
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<&'static [u8]>, Infallible>>> {
        if let Some(sleep) = self.0.as_mut() {
            std::task::ready!(sleep.as_mut().poll(cx));
        }
        self.0 = Some(Box::pin(tokio::time::sleep(ms(100))));
        Poll::Ready(Some(Ok(Frame::data(&b"tick"[..]))))
    }
}

fn streaming_request(grpc: bool, method: http::Method) -> Request<()> {
    let mut req = Request::builder()
        .method(method)
        .header("grpc-timeout", "250m");
    if grpc {
        req = req.header("content-type", "application/grpc");
    }
    req.body(()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn admit_cuts_a_streaming_body_at_the_deadline_and_reports_after_it() {
    for grpc in [false, true] {
        let (layer, mut reports) =
            reporting(EndpointPolicy::new(ms(5_000), ms(1_000)).reserve(ms(10)));
        let mut svc = layer.layer(Fn_(streaming_handler));
        let start = Instant::now();
        let res = svc
            .call(streaming_request(grpc, http::Method::GET))
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let mut body = Box::pin(res.into_body());
        for _ in 0..3 {
            assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
            // The scope is closed, but its report waits for the body.
            assert!(
                reports.try_recv().is_err(),
                "reported while the body streams"
            );
        }
        assert_eq!(Instant::now() - start, ms(200));
        let end = next_frame(&mut body).await.unwrap();
        // Cut at the request's deadline (250 ms less the 10 ms reserve), not at the next tick.
        assert_eq!(Instant::now() - start, ms(240));
        if grpc {
            let trailers = end.unwrap();
            assert_eq!(trailers.trailers_ref().unwrap()["grpc-status"], "4");
        } else {
            let err = end.unwrap_err();
            let err = err.downcast_ref::<cancel_scope::Error>().unwrap();
            assert!(err.is_deadline_exceeded(), "{err}");
        }
        assert!(next_frame(&mut body).await.is_none());
        assert!(body.is_end_stream());
        let (_, report) = next_report(&mut reports).await;
        assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded), "{report}");
        assert_eq!(report.state(), Lifecycle::CancelledStable);
    }
}

#[tokio::test(start_paused = true)]
async fn a_client_gone_while_the_body_streams_is_client_gone() {
    let (layer, mut reports) = reporting(EndpointPolicy::new(ms(5_000), ms(1_000)));
    let mut svc = layer.layer(Fn_(streaming_handler));
    let res = svc
        .call(streaming_request(false, http::Method::GET))
        .await
        .unwrap();
    let mut body = Box::pin(res.into_body());
    assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
    // The server drops the body when the connection goes.
    drop(body);
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.cause(), Some(&Cause::ClientGone), "{report}");
}

#[tokio::test(start_paused = true)]
async fn a_body_sent_to_its_end_completes_the_request_then() {
    let (layer, mut reports) = reporting(EndpointPolicy::new(ms(5_000), ms(1_000)));
    let mut svc = layer.layer(Fn_(|_: Request<()>| async {
        let frames = VecDeque::from([Frame::data(&b"a"[..]), Frame::data(&b"b"[..])]);
        Ok::<_, Infallible>(Response::new(Frames::<true>(frames)))
    }));
    let res = svc
        .call(streaming_request(false, http::Method::GET))
        .await
        .unwrap();
    let mut body = Box::pin(res.into_body());
    assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
    assert!(
        reports.try_recv().is_err(),
        "reported while the body streams"
    );
    assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
    // The last frame: the body says it has ended, and a server polls it no more.
    assert!(body.is_end_stream());
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
    assert_eq!(report.cause(), None);
    drop(body);
}

#[tokio::test(start_paused = true)]
async fn the_body_of_a_head_request_is_not_waited_for() {
    let (layer, mut reports) = reporting(EndpointPolicy::new(ms(5_000), ms(1_000)));
    let mut svc = layer.layer(Fn_(streaming_handler));
    let res = svc
        .call(streaming_request(false, http::Method::HEAD))
        .await
        .unwrap();
    // A server sends no body for HEAD, and drops it unread: not a client gone.
    drop(res);
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
}

// ---------------------------------------------------------------------------------------------
// A body the server stops polling (its client stopped reading): the request's scope stops
// waiting for it at the cancel, without a poll.

/// A handler whose response body never ends (as [`streaming_handler`]) and whose response
/// carries the request's scope in its extensions, for the test to watch.
fn watched_handler(req: Request<()>) -> impl Future<Output = Result<Response<Ticks>, Infallible>> {
    let scope = req.extensions().get::<Scope>().unwrap().clone();
    async move {
        let mut res = Response::new(Ticks(None));
        res.extensions_mut().insert(scope);
        Ok(res)
    }
}

/// The request's scope that `watched_handler` (or another handler) put in the response.
fn scope_of<B>(res: &Response<B>) -> Scope {
    res.extensions().get::<Scope>().unwrap().clone()
}

/// No report comes any more (on the paused clock, waiting an hour costs nothing).
async fn assert_no_more_reports(reports: &mut mpsc::UnboundedReceiver<(Admission, Report)>) {
    let more = tokio::time::timeout(Duration::from_secs(3600), reports.recv()).await;
    assert!(more.is_err(), "a second report: {more:?}");
}

#[tokio::test(start_paused = true)]
async fn a_body_the_server_stops_polling_lets_the_request_report_at_the_deadline() {
    for (grpc, late_poll) in [(false, true), (true, true), (false, false), (true, false)] {
        let (layer, mut reports) =
            reporting(EndpointPolicy::new(ms(5_000), ms(1_000)).reserve(ms(10)));
        let mut svc = layer.layer(Fn_(watched_handler));
        let start = Instant::now();
        let res = svc
            .call(streaming_request(grpc, http::Method::GET))
            .await
            .unwrap();
        let scope = scope_of(&res);
        let mut body = Box::pin(res.into_body());
        assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
        // The client stops reading: the server polls the body no more. The request is still
        // reported at its deadline.
        let (_, report) = next_report(&mut reports).await;
        assert_eq!(Instant::now() - start, ms(240), "{grpc} {late_poll}");
        assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded), "{report}");
        assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
        // The handler, which answered.
        assert_eq!(report.total(), 1, "{report}");
        assert_eq!(report.succeeded(), 1, "{report}");
        assert_eq!(report.cancel_to_quiet(), Some(Duration::ZERO), "{report}");
        if late_poll {
            // The client reads again: the body ends as it would have at the deadline.
            advance(ms(500)).await;
            let end = next_frame(&mut body).await.unwrap();
            if grpc {
                let trailers = end.unwrap();
                assert_eq!(trailers.trailers_ref().unwrap()["grpc-status"], "4");
            } else {
                let err = end.unwrap_err();
                let err = err.downcast_ref::<cancel_scope::Error>().unwrap();
                assert!(err.is_deadline_exceeded(), "{err}");
            }
            assert!(next_frame(&mut body).await.is_none());
            assert!(body.is_end_stream());
        }
        // The connection goes at last: the server drops the body. Not a client gone, and
        // nothing reported again.
        drop(body);
        assert_eq!(scope.cause(), Some(Cause::DeadlineExceeded));
        assert_eq!(scope.lifecycle(), Lifecycle::CancelledStable);
        assert_no_more_reports(&mut reports).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_cancel_lets_go_of_an_unpolled_body_and_the_report_waits_for_the_rest_of_the_work() {
    let (layer, mut reports) = reporting(EndpointPolicy::new(ms(5_000), ms(1_000)));
    // The handler leaves work running in the request's scope that takes 50 ms to stop after
    // the cancel.
    let mut svc = layer.layer(Fn_(|req: Request<()>| {
        let scope = req.extensions().get::<Scope>().unwrap().clone();
        async move {
            let work = scope
                .register(ChildSpec::read_only("slow"))
                .unwrap()
                .dispatch()
                .unwrap();
            let s = scope.clone();
            tokio::spawn(async move {
                s.cancelled().await;
                tokio::time::sleep(ms(50)).await;
                work.succeed();
            });
            let mut res = Response::new(Ticks(None));
            res.extensions_mut().insert(scope);
            Ok::<_, Infallible>(res)
        }
    }));
    let res = svc
        .call(streaming_request(false, http::Method::GET))
        .await
        .unwrap();
    let scope = scope_of(&res);
    let mut body = Box::pin(res.into_body());
    assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
    advance(ms(20)).await;
    let start = Instant::now();
    scope.cancel_with("operator");
    // The body let go at once; the task's 50 ms are what the report waits for.
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(Instant::now() - start, ms(50));
    assert_eq!(
        report.cause(),
        Some(&Cause::cancelled("operator")),
        "{report}"
    );
    // The handler and its task.
    assert_eq!(report.succeeded(), 2, "{report}");
    assert_eq!(report.cancel_to_quiet(), Some(ms(50)), "{report}");
    assert_eq!(report.orphan_work(), ms(50), "{report}");
    let err = next_frame(&mut body).await.unwrap().unwrap_err();
    let err = err.downcast_ref::<cancel_scope::Error>().unwrap();
    assert_eq!(err.cause().unwrap().reason(), Some("operator"));
    drop(body);
    assert_no_more_reports(&mut reports).await;
}

#[tokio::test(start_paused = true)]
async fn a_body_read_to_its_end_before_the_deadline_is_reported_once_then() {
    let (layer, mut reports) = reporting(EndpointPolicy::new(ms(5_000), ms(1_000)));
    let mut svc = layer.layer(Fn_(|req: Request<()>| {
        let scope = req.extensions().get::<Scope>().unwrap().clone();
        async move {
            let frames = VecDeque::from([Frame::data(&b"a"[..]), Frame::data(&b"b"[..])]);
            let mut res = Response::new(Frames::<true>(frames));
            res.extensions_mut().insert(scope);
            Ok::<_, Infallible>(res)
        }
    }));
    let start = Instant::now();
    let res = svc
        .call(streaming_request(false, http::Method::GET))
        .await
        .unwrap();
    let scope = scope_of(&res);
    let mut body = Box::pin(res.into_body());
    advance(ms(100)).await;
    assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
    assert!(
        reports.try_recv().is_err(),
        "reported while the body streams"
    );
    assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(Instant::now() - start, ms(100));
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
    assert_eq!(report.cause(), None);
    // The deadline passes later (the body kept by the server, then dropped): nothing changes.
    advance(ms(1_000)).await;
    assert!(next_frame(&mut body).await.is_none());
    drop(body);
    assert!(!scope.is_cancelled());
    assert_eq!(scope.lifecycle(), Lifecycle::Completed);
    assert_no_more_reports(&mut reports).await;
}

/// A handler's body that is its request's scope's to watch: at its `cut_at`-th poll it
/// cancels the scope itself (as a cancel on another thread could come in the middle of a
/// poll), and it checks that the scope is not quiet while it is polled (the report never
/// comes while the handler's body runs).
struct CancelsInPoll {
    scope: Scope,
    polls: usize,
    cut_at: usize,
    /// What the poll that cancels returns: a frame, or `Pending` (without arranging a wake-up
    /// of its own: the cut wakes the server's task).
    ready: bool,
}

impl Body for CancelsInPoll {
    type Data = &'static [u8];
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<&'static [u8]>, Infallible>>> {
        assert_eq!(
            self.scope.lifecycle(),
            Lifecycle::Running,
            "polled after the cut"
        );
        self.polls += 1;
        if self.polls == self.cut_at {
            self.scope.cancel_with("mid-poll");
            // Still in this poll: the scope waits for it.
            assert_eq!(self.scope.lifecycle(), Lifecycle::Cancelling);
            if !self.ready {
                return Poll::Pending;
            }
        }
        Poll::Ready(Some(Ok(Frame::data(&b"x"[..]))))
    }
}

#[tokio::test(start_paused = true)]
async fn a_cancel_during_a_poll_lets_go_of_the_body_when_that_poll_returns_and_only_once() {
    for ready in [true, false] {
        let (layer, mut reports) = reporting(EndpointPolicy::new(ms(5_000), ms(1_000)));
        let mut svc = layer.layer(Fn_(move |req: Request<()>| {
            let scope = req.extensions().get::<Scope>().unwrap().clone();
            async move {
                let body = CancelsInPoll {
                    scope: scope.clone(),
                    polls: 0,
                    cut_at: 2,
                    ready,
                };
                let mut res = Response::new(body);
                res.extensions_mut().insert(scope);
                Ok::<_, Infallible>(res)
            }
        }));
        let res = svc
            .call(streaming_request(false, http::Method::GET))
            .await
            .unwrap();
        let scope = scope_of(&res);
        let mut body = Box::pin(res.into_body());
        assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
        let waker = futures::task::noop_waker();
        let polled = body.as_mut().poll_frame(&mut Context::from_waker(&waker));
        // The poll that cancelled has returned: the request is quiet without another poll.
        assert_eq!(scope.lifecycle(), Lifecycle::CancelledStable, "{ready}");
        if ready {
            assert!(matches!(polled, Poll::Ready(Some(Ok(_)))));
        } else {
            assert!(polled.is_pending());
        }
        let (_, report) = next_report(&mut reports).await;
        assert_eq!(
            report.cause(),
            Some(&Cause::cancelled("mid-poll")),
            "{report}"
        );
        assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
        // The next poll ends the body, without polling the handler's body again.
        let err = next_frame(&mut body).await.unwrap().unwrap_err();
        let err = err.downcast_ref::<cancel_scope::Error>().unwrap();
        assert_eq!(err.cause().unwrap().reason(), Some("mid-poll"));
        drop(body);
        assert_no_more_reports(&mut reports).await;
    }
}

/// A handler's body that a server polls while the scope is cancelled, after the cut: the
/// pending poll is woken by the cut itself (the handler's body never wakes it).
#[tokio::test(start_paused = true)]
async fn a_server_waiting_on_a_body_is_woken_by_the_cut() {
    let (layer, mut reports) = reporting(EndpointPolicy::new(ms(5_000), ms(1_000)));
    let mut svc = layer.layer(Fn_(|req: Request<()>| {
        let scope = req.extensions().get::<Scope>().unwrap().clone();
        async move {
            let mut res = Response::new(Frames::<false>(VecDeque::new()));
            res.extensions_mut().insert(scope);
            Ok::<_, Infallible>(res)
        }
    }));
    let res = svc
        .call(streaming_request(true, http::Method::GET))
        .await
        .unwrap();
    let scope = scope_of(&res);
    let mut body = Box::pin(res.into_body());
    let server = tokio::spawn(async move {
        let end = next_frame(&mut body).await;
        (end, body)
    });
    tokio::task::yield_now().await;
    scope.cancel();
    let (end, body) = tokio::time::timeout(ms(1), server).await.unwrap().unwrap();
    let trailers = end.unwrap().unwrap();
    // A cancel that is not the deadline nor the client: UNAVAILABLE.
    assert_eq!(trailers.trailers_ref().unwrap()["grpc-status"], "14");
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
    drop(body);
    assert_no_more_reports(&mut reports).await;
}

/// The handler's body that a client gone drops is dropped before the request is reported
/// (the scope is not quiet during that drop), also though the drop's cancel reaches the body's
/// own cut.
struct DroppedBeforeTheReport(Scope);

impl Body for DroppedBeforeTheReport {
    type Data = &'static [u8];
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<&'static [u8]>, Infallible>>> {
        Poll::Ready(Some(Ok(Frame::data(&b"x"[..]))))
    }
}

impl Drop for DroppedBeforeTheReport {
    fn drop(&mut self) {
        assert_eq!(self.0.lifecycle(), Lifecycle::Cancelling);
    }
}

#[tokio::test(start_paused = true)]
async fn a_client_gone_drops_the_handlers_body_before_the_report() {
    let (layer, mut reports) = reporting(EndpointPolicy::new(ms(5_000), ms(1_000)));
    let mut svc = layer.layer(Fn_(|req: Request<()>| {
        let scope = req.extensions().get::<Scope>().unwrap().clone();
        async move {
            let mut res = Response::new(DroppedBeforeTheReport(scope.clone()));
            res.extensions_mut().insert(scope);
            Ok::<_, Infallible>(res)
        }
    }));
    let res = svc
        .call(streaming_request(false, http::Method::GET))
        .await
        .unwrap();
    let scope = scope_of(&res);
    let mut body = Box::pin(res.into_body());
    assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
    drop(body);
    assert_eq!(scope.lifecycle(), Lifecycle::CancelledStable);
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.cause(), Some(&Cause::ClientGone), "{report}");
    assert_no_more_reports(&mut reports).await;
}

/// What the test sees of a [`Racing`] body: how often it was polled, and whether it is gone.
#[derive(Clone, Default)]
struct Probe {
    polls: Arc<AtomicUsize>,
    gone: Arc<AtomicBool>,
}

/// A never-ending handler's body that counts its polls and checks, at the start and at the end
/// of each, that its request's scope is not quiet (the report never comes while the
/// handler's body is polled). One poll in three is `Pending` with an immediate wake-up.
struct Racing {
    scope: Scope,
    probe: Probe,
    /// Polls that saw the scope quiet (shared by every request).
    bad: Arc<AtomicUsize>,
}

impl Body for Racing {
    type Data = &'static [u8];
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<&'static [u8]>, Infallible>>> {
        let quiet = || self.scope.lifecycle().is_final();
        if quiet() {
            self.bad.fetch_add(1, Ordering::SeqCst);
        }
        let n = self.probe.polls.fetch_add(1, Ordering::SeqCst);
        // A poll that takes a while: a cancel on another thread may come in the middle.
        for _ in 0..200 {
            std::hint::spin_loop();
        }
        if quiet() {
            self.bad.fetch_add(1, Ordering::SeqCst);
        }
        if n % 3 == 2 {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(Some(Ok(Frame::data(&b"x"[..]))))
    }
}

impl Drop for Racing {
    fn drop(&mut self) {
        self.probe.gone.store(true, Ordering::SeqCst);
    }
}

/// The cut races with the server's polls and its drop of the body, on other threads: each
/// request is reported once, never while the handler's body is polled, and its scope's unit
/// is given back once (a second give-back would wrap the scope's count of work: it would not
/// read as quiet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_racing_polls_and_drops_on_other_threads_lets_go_once() {
    const ROUNDS: usize = 2_000;
    let (layer, mut reports) = reporting(EndpointPolicy::new(ms(60_000), ms(60_000)));
    let bad = Arc::new(AtomicUsize::new(0));
    let mut svc = layer.layer(Fn_({
        let bad = bad.clone();
        move |req: Request<()>| {
            let scope = req.extensions().get::<Scope>().unwrap().clone();
            let probe = Probe::default();
            let body = Racing {
                scope: scope.clone(),
                probe: probe.clone(),
                bad: bad.clone(),
            };
            async move {
                let mut res = Response::new(body);
                res.extensions_mut().insert(scope);
                res.extensions_mut().insert(probe);
                Ok::<_, Infallible>(res)
            }
        }
    }));
    // Cancels each scope it is sent once its body was polled `at` times (or is gone), from a
    // thread of its own.
    let (to_canceller, jobs) = std::sync::mpsc::channel::<(Scope, Probe, usize)>();
    let canceller = std::thread::spawn(move || {
        for (scope, probe, at) in jobs {
            while probe.polls.load(Ordering::SeqCst) < at && !probe.gone.load(Ordering::SeqCst) {
                std::hint::spin_loop();
            }
            scope.cancel_with("race");
        }
    });
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n) as usize
    };
    let (mut cut, mut dropped) = (0, 0);
    for round in 0..ROUNDS {
        // The request's deadline is the policy's 60 s, not streaming_request()'s 250 ms (meant
        // for the paused clock): a round that a loaded machine holds up must still be ended by
        // the race's cancel or the drop, as the cause check below asks, not by the deadline.
        let mut req = streaming_request(false, http::Method::GET);
        req.headers_mut()
            .insert("grpc-timeout", http::HeaderValue::from_static("60S"));
        let res = svc.call(req).await.unwrap();
        let scope = scope_of(&res);
        let probe = res.extensions().get::<Probe>().unwrap().clone();
        let (cancel_at, drop_at) = (next(8), next(12));
        to_canceller
            .send((scope.clone(), probe.clone(), cancel_at))
            .unwrap();
        // The server, on a worker thread: polls until the body ends or it has seen `drop_at`
        // frames, then drops it.
        let mut body = Box::pin(res.into_body());
        let server = tokio::spawn(async move {
            let mut frames = 0;
            while frames < drop_at {
                match next_frame(&mut body).await {
                    Some(Ok(_)) => frames += 1,
                    Some(Err(_)) => return true,
                    None => unreachable!("the body never ends"),
                }
            }
            false
        });
        if tokio::time::timeout(Duration::from_secs(20), server)
            .await
            .expect("the server's polls hang")
            .unwrap()
        {
            cut += 1;
        } else {
            dropped += 1;
        }
        let (_, report) = tokio::time::timeout(Duration::from_secs(20), reports.recv())
            .await
            .expect("no report: the request never went quiet")
            .unwrap();
        assert_eq!(
            report.state(),
            Lifecycle::CancelledStable,
            "round {round}: {report}"
        );
        let cause = report.cause().unwrap();
        assert!(
            *cause == Cause::ClientGone || cause.reason() == Some("race"),
            "round {round}: {report}"
        );
        assert_eq!(
            scope.lifecycle(),
            Lifecycle::CancelledStable,
            "round {round}"
        );
        assert!(probe.gone.load(Ordering::SeqCst));
    }
    drop(to_canceller);
    canceller.join().unwrap();
    assert_eq!(
        bad.load(Ordering::SeqCst),
        0,
        "polled with the request reported"
    );
    // Both ends were reached (the cut before the drop, and the reverse), and nothing was
    // reported twice.
    assert!(cut > 0 && dropped > 0, "{cut} cut, {dropped} dropped");
    assert!(reports.try_recv().is_err());
}

/// The next report, or a failure if none comes (rather than a test that hangs): on the
/// paused clock the timeout fires as soon as nothing else can happen.
async fn next_report(
    reports: &mut mpsc::UnboundedReceiver<(Admission, Report)>,
) -> (Admission, Report) {
    tokio::time::timeout(Duration::from_secs(3600), reports.recv())
        .await
        .expect("no report: the request never went quiet")
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// What an outgoing call is told: never more than the calling code allows at the moment of the
// call (the current scope, a scope in the request's extensions, a budget header already on the
// request: the shortest wins).

/// A transport that answers with the budget it was told, as `x-told: <grpc-timeout ms> <rem
/// ms>` (`u128::MAX` for a missing header).
fn echo() -> impl Service<
    Request<()>,
    Response = Response<String>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<String>, Infallible>>,
> + Clone {
    Fn_(|req: Request<()>| async move {
        let grpc = req
            .headers()
            .get("grpc-timeout")
            .map(|v| grpc_timeout::decode_bytes(v.as_bytes()).unwrap());
        let rem = req
            .headers()
            .get("service-budget")
            .map(|v| ServiceBudget::parse(v.as_bytes()).unwrap().remaining());
        let told = format!(
            "{} {}",
            grpc.map_or(u128::MAX, |d| d.as_millis()),
            rem.map_or(u128::MAX, |d| d.as_millis())
        );
        let mut res = Response::new(String::new());
        res.headers_mut().insert("x-told", told.parse().unwrap());
        Ok::<_, Infallible>(res)
    })
}

/// What `echo` was told: (grpc-timeout, service-budget rem), in ms.
fn told_by<B>(res: &Response<B>) -> (u128, u128) {
    let mut it = res.headers()["x-told"]
        .to_str()
        .unwrap()
        .split(' ')
        .map(|s| s.parse::<u128>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

/// What `silent` answers: nothing, ever.
type Never = std::future::Pending<Result<Response<String>, Infallible>>;

/// A transport that never answers: the call ends when its scope stops it.
fn silent() -> Fn_<fn(Request<()>) -> Never> {
    Fn_(|_| std::future::pending())
}

/// Calls `client` inside `scope` (so that `call` sees it as the current scope) and returns
/// the call's future to be awaited *outside* it: the call then ends when its own scope stops
/// it, not when `scope`'s body is cut, which shows the call's own deadline.
#[allow(clippy::async_yields_async)] // On purpose: made inside the scope, awaited outside it.
async fn start_in<S>(scope: &Scope, client: &mut S, req: Request<()>) -> S::Future
where
    S: Service<Request<()>>,
{
    scope.run(async { client.call(req) }).await.unwrap()
}

/// A proxy handler forwards the request it was given (which carries the admission `Scope` in
/// its extensions, as `Admit` puts it there) from a child scope capped at 100 ms: the callee
/// is told at most those 100 ms, and the call is cut at them, not at the request's 1 s.
#[tokio::test(start_paused = true)]
async fn propagate_takes_the_current_scope_over_the_requests_root() {
    let root = Scope::with_timeout(ms(1_000));
    let tight = root.child().cap(ms(100)).build().unwrap();
    let mut client = PropagateLayer::new().layer(echo());
    let mut req = Request::new(());
    req.extensions_mut().insert(root.clone());
    let res = call_in(&tight, &mut client, req).await;
    let (grpc, rem) = told_by(&res);
    assert!(
        grpc <= 100 && rem <= 100,
        "callee told grpc-timeout {grpc} ms, rem {rem} ms while the calling scope has 100 ms"
    );

    let mut client = PropagateLayer::new().layer(silent());
    let mut req = Request::new(());
    req.extensions_mut().insert(root.clone());
    let call = start_in(&tight, &mut client, req).await;
    let start = Instant::now();
    let err = call.await.unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err}");
    assert_eq!(Instant::now() - start, ms(100));
    assert!(!root.is_cancelled());
}

/// The same through a real `Admit` in front: the handler forwards the request it was given
/// (a reverse proxy) from a child scope capped at 100 ms.
#[tokio::test(start_paused = true)]
async fn behind_admit_a_forwarded_request_is_not_told_more_than_the_handler_has() {
    let policy = EndpointPolicy::new(ms(2_000), ms(1_000));
    let mut svc = AdmitLayer::new(policy).layer(Fn_(|req: Request<()>| async move {
        assert!(req.extensions().get::<Scope>().is_some());
        let mut client = PropagateLayer::new().layer(echo());
        let tight = Scope::current().child().cap(ms(100)).build().unwrap();
        let res = call_in(&tight, &mut client, req).await;
        let mut out = Response::new(String::new());
        out.headers_mut()
            .insert("x-told", res.headers()["x-told"].clone());
        Ok::<_, Infallible>(out)
    }));
    let res = svc.call(Request::new(())).await.unwrap();
    let (grpc, rem) = told_by(&res);
    assert!(
        grpc <= 100 && rem <= 100,
        "behind Admit: callee told grpc-timeout {grpc} ms, rem {rem} ms; the handler's scope has 100 ms"
    );
}

/// A scope in the request's extensions that is *inside* the current one is the more specific:
/// the call is its child (its cancel stops the call); one from another tree caps the call's
/// deadline.
#[tokio::test(start_paused = true)]
async fn propagate_is_bounded_by_both_the_current_and_the_requests_scope() {
    // Inside: the call is a child of the request's scope.
    let root = Scope::with_timeout(ms(1_000));
    let inner = root.child().cap(ms(100)).build().unwrap();
    let mut client = PropagateLayer::new().layer(silent());
    let mut req = Request::new(());
    req.extensions_mut().insert(inner.clone());
    let call = start_in(&root, &mut client, req).await;
    let stop = inner.clone();
    let (err, ()) = tokio::join!(call, async move {
        advance(ms(30)).await;
        stop.cancel_with("stop");
    });
    let err = err.unwrap_err();
    assert!(err.is_cancelled() && !err.is_deadline_exceeded(), "{err}");
    assert!(!root.is_cancelled());

    // Another tree: the current scope is the parent, the other one's deadline a cap.
    let current = Scope::with_timeout(ms(1_000));
    let other = Scope::with_timeout(ms(50));
    let mut client = PropagateLayer::new().layer(echo());
    let mut req = Request::new(());
    req.extensions_mut().insert(other.clone());
    let res = call_in(&current, &mut client, req).await;
    assert_eq!(told_by(&res), (50, 50));

    let mut client = PropagateLayer::new().layer(silent());
    let mut req = Request::new(());
    req.extensions_mut().insert(other.clone());
    let call = start_in(&current, &mut client, req).await;
    let start = Instant::now();
    assert!(call.await.unwrap_err().is_deadline_exceeded());
    assert_eq!(Instant::now() - start, ms(50));
    // Both calls were children of the current scope.
    current.cancel();
    let report = current.quiesce().await;
    assert_eq!(report.succeeded() + report.cancelled(), 2, "{report}");
}

/// A caller that set a shorter per-call timeout itself (tonic's `Request::set_timeout` writes
/// `grpc-timeout`, and tonic's channel enforces the header it finds) keeps it: the callee is
/// told at most that, and the call is cut at it.
#[tokio::test(start_paused = true)]
async fn propagate_keeps_a_shorter_preset_budget_header() {
    let scope = Scope::with_timeout(ms(1_000));
    let mut client = PropagateLayer::new().layer(echo());
    let with = |k: &str, v: &str| Request::builder().header(k, v).body(()).unwrap();

    // tonic's encoding of 50 ms.
    let res = call_in(&scope, &mut client, with("grpc-timeout", "50000u")).await;
    assert_eq!(told_by(&res), (50, 50));
    let res = call_in(&scope, &mut client, with("service-budget", "v=1, rem=50")).await;
    assert_eq!(told_by(&res), (50, 50));
    // The shorter of the two.
    let req = Request::builder()
        .header("grpc-timeout", "80m")
        .header("service-budget", "v=1, rem=30")
        .body(())
        .unwrap();
    let res = call_in(&scope, &mut client, req).await;
    assert_eq!(told_by(&res), (30, 30));
    // A longer preset changes nothing: budgets only shrink.
    let res = call_in(&scope, &mut client, with("grpc-timeout", "5S")).await;
    assert_eq!(told_by(&res), (1_000, 1_000));
    // A malformed one is replaced, not trusted, and is no error.
    let res = call_in(&scope, &mut client, with("grpc-timeout", "50 ms")).await;
    assert_eq!(told_by(&res), (1_000, 1_000));
    let res = call_in(&scope, &mut client, with("service-budget", "v=9, rem=5")).await;
    assert_eq!(told_by(&res), (1_000, 1_000));

    // The call's own deadline shrinks with it.
    let mut client = PropagateLayer::new().layer(silent());
    let call = start_in(&scope, &mut client, with("grpc-timeout", "50000u")).await;
    let start = Instant::now();
    assert!(call.await.unwrap_err().is_deadline_exceeded());
    assert_eq!(Instant::now() - start, ms(50));
    assert!(!scope.is_cancelled());
}

#[test]
fn admit_response_body_is_send_sync_unpin() {
    fn send_sync_unpin<T: Send + Sync + Unpin + 'static>() {}
    send_sync_unpin::<cancel_scope::integrations::tower::admit::ResponseBody<String>>();
}

// ---------------------------------------------------------------------------------------------
// Back-pressure: the time a request waits for the service to be ready is queueing time.

/// A handler service that is not ready until `until` (a concurrency limit, a full pool...),
/// and answers with the budget its request's scope has left, in ms.
struct NotReadyUntil(Pin<Box<tokio::time::Sleep>>);

impl Service<Request<()>> for NotReadyUntil {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.as_mut().poll(cx).map(Ok)
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        let left = Scope::current().remaining().unwrap().as_millis();
        std::future::ready(Ok(Response::new(left.to_string())))
    }
}

/// A request that waits 100 ms for the service behind `Admit` to be ready (`poll_ready`
/// pending, the request already in hand, as `oneshot` and every server drive it) has spent
/// those 100 ms of its 250: the handler gets 150, not a fresh 250, and a request whose budget
/// ran out while it waited is refused with 504 instead of running with the whole budget again.
#[tokio::test(start_paused = true)]
async fn time_waiting_for_poll_ready_is_taken_off_the_budget() {
    let policy = EndpointPolicy::new(ms(5_000), ms(1_000)).min_useful(ms(10));
    let mut svc =
        AdmitLayer::new(policy).layer(NotReadyUntil(Box::pin(tokio::time::sleep(ms(100)))));
    let req = Request::builder()
        .header("grpc-timeout", "250m")
        .body(())
        .unwrap();
    poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
    let res = svc.call(req).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.into_body().into_inner().unwrap(), "150");

    // Ready at once: nothing was queued (an earlier wait is not charged again).
    advance(ms(1_000)).await;
    let req = Request::builder()
        .header("grpc-timeout", "250m")
        .body(())
        .unwrap();
    poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
    let res = svc.call(req).await.unwrap();
    assert_eq!(res.into_body().into_inner().unwrap(), "250");

    // Waited longer than its budget: refused as exhausted.
    let mut svc =
        AdmitLayer::new(policy).layer(NotReadyUntil(Box::pin(tokio::time::sleep(ms(300)))));
    let req = Request::builder()
        .header("grpc-timeout", "250m")
        .body(())
        .unwrap();
    poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
    assert_eq!(svc.call(req).await.unwrap().status(), 504);
}

// ---------------------------------------------------------------------------------------------
// A handler that answers after its deadline (it blocked: CPU-bound work, a synchronous call),
// before the deadline's timer got to run.

/// A handler that holds the thread for 300 ms (the clock moves on under it, as it would
/// while it blocks) and then answers 200 "late", all in one poll.
async fn blocks_past_the_deadline(_: Request<()>) -> Result<Response<String>, Infallible> {
    use futures::FutureExt;
    // The first poll of `advance` moves the clock; its timers have not fired after it.
    let _ = advance(ms(300)).now_or_never();
    Ok(Response::new("late".to_owned()))
}

/// A handler whose answer comes after its request's deadline gets the deadline's answer (504,
/// gRPC `DEADLINE_EXCEEDED`), as one that is still running then does, not a 200 whose body
/// is then cut (HTTP: aborted) or sent although the budget is spent; the report says the
/// deadline stopped it.
#[tokio::test(start_paused = true)]
async fn an_answer_after_the_deadline_is_504_not_the_late_answer() {
    let (layer, mut reports) = reporting(EndpointPolicy::new(ms(5_000), ms(1_000)));
    let mut svc = layer.layer(Fn_(blocks_past_the_deadline));
    let req = Request::builder()
        .header("grpc-timeout", "250m")
        .body(())
        .unwrap();
    let res = svc.call(req).await.unwrap();
    assert_eq!(res.status(), 504);
    assert_eq!(res.into_body().into_inner(), None);
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded), "{report:?}");

    let req = Request::builder()
        .header("grpc-timeout", "250m")
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let res = svc.call(req).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["grpc-status"], "4");
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded), "{report:?}");

    // In time: the handler's answer.
    let mut svc = AdmitLayer::new(EndpointPolicy::new(ms(5_000), ms(1_000)))
        .layer(Fn_(blocks_past_the_deadline));
    let req = Request::builder()
        .header("grpc-timeout", "301m")
        .body(())
        .unwrap();
    let res = svc.call(req).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.into_body().into_inner().unwrap(), "late");
}

// ---------------------------------------------------------------------------------------------
// The response body is the handler's code too: it runs with the request's scope current.

/// A body that records, at each poll and at its drop, the deadline of the scope current then
/// (`None`: no scope current), and yields one chunk, then stays pending.
struct SeesScope(Arc<std::sync::Mutex<Vec<Option<Instant>>>>, bool);

impl SeesScope {
    fn record(&self) {
        let seen = Scope::try_current().and_then(|s| s.deadline());
        self.0.lock().unwrap().push(seen);
    }
}

impl Body for SeesScope {
    type Data = &'static [u8];
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<&'static [u8]>, Infallible>>> {
        self.record();
        if std::mem::replace(&mut self.1, true) {
            Poll::Pending
        } else {
            Poll::Ready(Some(Ok(Frame::data(b"chunk".as_slice()))))
        }
    }
}

impl Drop for SeesScope {
    fn drop(&mut self) {
        self.record();
    }
}

/// A streaming body (an `async-stream` generator, a tonic server stream) runs the handler's
/// code at each poll: it does so with the request's scope current, as the handler did, so
/// that `Scope::current()` there does not panic and an outgoing call made there is bounded by
/// the request (or refused once it is closed) rather than sent with no budget at all.
#[tokio::test(start_paused = true)]
async fn the_response_body_is_polled_and_dropped_with_the_requests_scope_current() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    let mut svc = AdmitLayer::new(EndpointPolicy::new(ms(5_000), ms(1_000))).layer(Fn_(
        move |_: Request<()>| {
            // What the handler sees (its `call` runs with the scope current).
            s.lock().unwrap().push(Scope::current().deadline());
            let body = SeesScope(s.clone(), false);
            async move { Ok::<_, Infallible>(Response::new(body)) }
        },
    ));
    let res = svc.call(Request::new(())).await.unwrap();
    let mut body = res.into_body();
    assert!(next_frame(&mut body).await.unwrap().is_ok());
    let pending = poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx).is_pending())).await;
    assert!(pending);
    drop(body);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert!(
        seen.iter().all(Option::is_some),
        "no scope current: {seen:?}"
    );
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
}
