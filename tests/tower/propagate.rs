//! The propagation layer with in-process transports on tokio's virtual clock (no sockets):
//! a slow body cut at the deadline, statuses rewritten by how the call ended, receipts by the
//! call's end and effect class, copied or incoming budget headers replaced, calls outside a
//! scope, and what an outgoing call is told (never more than the calling code allows).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use cancel_scope::integrations::tower::{AdmitLayer, PropagateLayer};
use cancel_scope::wire::service_budget::ServiceBudget;
use cancel_scope::wire::{grpc_timeout, EgressPolicy, EndpointPolicy};
use cancel_scope::{ChildSpec, Lifecycle, Scope};
use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame};
use tokio::time::{advance, Instant};
use tower_layer::Layer;
use tower_service::Service;

use crate::support::time::ms;
use crate::support::tower::{next_frame, verdict, Fn_, Frames};

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
        .egress(EgressPolicy::builder().transport_pad(ms(20)).build())
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
        .egress(EgressPolicy::builder().transport_pad(ms(20)).build())
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
    let policy = EndpointPolicy::builder(ms(2_000))
        .default_budget(ms(1_000))
        .build();
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

/// A journaled gRPC call: its intent is written before the transport is called, and left
/// pending by the trailers' `UNAVAILABLE` (the effect is unknown); with that intent the store
/// is full, so the next call is answered with a trailers-only `UNAVAILABLE` (nothing was
/// sent: safe to retry) and the transport is never called for it.
#[tokio::test(start_paused = true)]
async fn propagate_journals_a_grpc_call_and_refuses_one_the_store_cannot_take() {
    use cancel_scope::reconcile::{InMemoryIntents, IntentStore, Journal};

    let store = Arc::new(InMemoryIntents::new().max(1));
    let journal = Journal::new(store.clone());
    let sent = Arc::new(AtomicUsize::new(0));
    let transport = Fn_({
        let (sent, store) = (sent.clone(), store.clone());
        move |_: Request<()>| {
            let (sent, store) = (sent.clone(), store.clone());
            async move {
                sent.fetch_add(1, Ordering::SeqCst);
                assert_eq!(
                    store.len(),
                    1,
                    "the intent is written before the call is sent"
                );
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", "14".parse().unwrap());
                let frames = VecDeque::from([Frame::trailers(trailers)]);
                let mut res = Response::new(Frames::<false>(frames));
                res.headers_mut()
                    .insert("content-type", "application/grpc".parse().unwrap());
                Ok::<_, Infallible>(res)
            }
        }
    });
    let journaled = |effect: &str| {
        PropagateLayer::new()
            .spec(ChildSpec::side_effecting("pay", effect))
            .journal(&journal)
    };

    let scope = Scope::with_timeout(ms(1_000));
    let mut client = journaled("p-1").layer(transport.clone());
    let res = call_in(&scope, &mut client, grpc_request()).await;
    let mut body = Box::pin(res.into_body());
    while next_frame(&mut body).await.is_some() {}
    let record = store.get("p-1").await.unwrap().unwrap();
    assert!(record.is_pending());

    let mut client = journaled("p-2").layer(transport);
    let res = call_in(&scope, &mut client, grpc_request()).await;
    assert_eq!(res.headers()["grpc-status"], "14");
    assert_eq!(sent.load(Ordering::SeqCst), 1, "nothing more was sent");
    assert!(store.get("p-2").await.unwrap().is_none());
    scope.close();
    let report = scope.quiesce().await;
    assert_eq!(report.effect_unknown(), 1, "{report}");
    assert_eq!(report.pending_effects()[0].effect_id(), "p-1");
}
