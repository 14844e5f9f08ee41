//! The admission layer with in-process services on tokio's virtual clock (no sockets): the
//! exact deadline and its 504, bad or useless budgets refused, client-gone on drop, handler
//! panics, back-pressure as queueing time, a late answer, and the response body run with the
//! request's scope current. The response body's cut is in `body_cut`; `tower_servers` runs the
//! same layers over real loopback servers.

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::wire::{Admission, EndpointPolicy};
use cancel_scope::{Cause, Lifecycle, Scope};
use http::{Request, Response};
use http_body::{Body, Frame};
use tokio::time::{advance, Instant};
use tower_layer::Layer;
use tower_service::Service;

use crate::support::time::ms;
use crate::support::tower::{next_frame, next_report, reporting, stuck, Fn_};

#[tokio::test(start_paused = true)]
async fn admit_answers_504_exactly_at_the_deadline_and_reports() {
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .reserve(ms(10))
            .build(),
    );
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
    let policy = EndpointPolicy::builder(ms(5_000))
        .default_budget(ms(1_000))
        .min_useful(ms(100))
        .build();
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
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
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
async fn a_shadowed_request_whose_client_leaves_past_the_would_be_deadline_records_the_cancel() {
    use cancel_scope::wire::Mode;
    let policy = EndpointPolicy::builder(ms(5_000))
        .default_budget(ms(1_000))
        .mode(Mode::Shadow)
        .build();
    let (layer, mut reports) = reporting(policy);
    let mut svc = layer.layer(Fn_(stuck));
    let req = Request::builder()
        .header("grpc-timeout", "100m")
        .body(())
        .unwrap();
    let mut fut = Box::pin(svc.call(req));
    assert!(poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_pending())).await);
    // The would-be deadline passes (not enforced), then the client goes away.
    advance(ms(130)).await;
    assert!(poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_pending())).await);
    drop(fut);
    let (_, report) = reports.recv().await.unwrap();
    assert_eq!(report.cause(), Some(&Cause::ClientGone));
    let late = report.would_be().iter().find_map(|d| d.late_by());
    assert_eq!(late, Some(ms(30)), "{report}");
}

#[tokio::test(start_paused = true)]
async fn the_handler_sees_its_scope_and_admission() {
    let mut svc = AdmitLayer::new(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    )
    .layer(Fn_(|req: Request<()>| async move {
        let a = req.extensions().get::<Admission>().unwrap();
        let scope = req.extensions().get::<Scope>().unwrap();
        assert_eq!(scope.deadline(), Scope::current().deadline());
        Ok::<_, Infallible>(Response::new(format!(
            "{} {}",
            a.initial_remaining().as_millis(),
            Scope::current().remaining().unwrap().as_millis()
        )))
    }));
    let req = Request::builder()
        .header("grpc-timeout", "700m")
        .body(())
        .unwrap();
    let body = svc.call(req).await.unwrap().into_body();
    assert_eq!(body.into_inner().unwrap(), "700 700");
}

/// A handler whose future panics is answered 500 / `INTERNAL` (not a reset: the panic does
/// not reach the server), is receipted `Failed` with the panic's message in the report, and
/// its request is cancelled with "the handler panicked" (not `ClientGone`).
#[tokio::test(start_paused = true)]
async fn a_handler_panic_answers_500_or_internal_and_is_failed() {
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
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
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
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
    let policy = EndpointPolicy::builder(ms(5_000))
        .default_budget(ms(1_000))
        .min_useful(ms(10))
        .build();
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
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
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
    let mut svc = AdmitLayer::new(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    )
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
    let mut svc = AdmitLayer::new(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    )
    .layer(Fn_(move |_: Request<()>| {
        // What the handler sees (its `call` runs with the scope current).
        s.lock().unwrap().push(Scope::current().deadline());
        let body = SeesScope(s.clone(), false);
        async move { Ok::<_, Infallible>(Response::new(body)) }
    }));
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

#[cfg(feature = "rollout")]
#[tokio::test(start_paused = true)]
async fn a_versions_longer_rejection_window_keeps_the_counts_it_had() {
    use cancel_scope::wire::PolicyHandle;
    async fn ok(_: Request<()>) -> Result<Response<String>, Infallible> {
        Ok(Response::new("ok".to_owned()))
    }
    let at_half = |v, window_ms| {
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .version(v)
            .rejection_cap(50, ms(window_ms))
            .build()
    };
    let policies = PolicyHandle::new(at_half(1, 10_000)).unwrap();
    let mut svc = AdmitLayer::versioned(&policies).layer(Fn_(ok));
    let mut status = |bad: bool| {
        let mut req = Request::builder();
        if bad {
            req = req.header("grpc-timeout", "-1S");
        }
        svc.call(req.body(()).unwrap())
    };
    // Ten requests decided, none refused, in the 10 s window.
    for _ in 0..10 {
        assert_eq!(status(false).await.unwrap().status(), 200);
    }
    // The window grows to 20 s, and 12 s pass: the ten are still counted, so three bad
    // requests in a row are refused within 50 % (counts that the change dropped, or the old
    // 10 s window, would refuse one of them and let two through).
    policies.set(at_half(2, 20_000)).unwrap();
    advance(ms(12_000)).await;
    for _ in 0..3 {
        assert_eq!(status(true).await.unwrap().status(), 400);
    }
    // Another 20 s, and nothing is counted any more: the first refusal of an empty window is
    // beyond 50 % (`100 × 1 > 50 × 1`), so it runs shadowed.
    advance(ms(20_000)).await;
    assert_eq!(status(true).await.unwrap().status(), 200);
}

/// A layer with one fixed policy that brings rejection cap settings (as a policy loaded from
/// configuration does) counts its refusals in one window, shared by the services it makes:
/// beyond 50 % a bad request runs shadowed instead of being refused.
#[tokio::test(start_paused = true)]
async fn a_fixed_policys_rejection_cap_settings_apply_to_its_layer() {
    async fn ok(_: Request<()>) -> Result<Response<String>, Infallible> {
        Ok(Response::new("ok".to_owned()))
    }
    let policy = EndpointPolicy::builder(ms(5_000))
        .default_budget(ms(1_000))
        .rejection_cap(50, ms(10_000))
        .build();
    let layer = AdmitLayer::new(policy);
    // Two services of the layer (two connections, two routes): one window.
    let (mut a, mut b) = (layer.layer(Fn_(ok)), layer.layer(Fn_(ok)));
    let bad = || {
        Request::builder()
            .header("grpc-timeout", "-1S")
            .body(())
            .unwrap()
    };
    for _ in 0..2 {
        assert_eq!(a.call(Request::new(())).await.unwrap().status(), 200);
    }
    // Two good and two refused on `a` and `b` together: 50 %, within the cap.
    assert_eq!(a.call(bad()).await.unwrap().status(), 400);
    assert_eq!(b.call(bad()).await.unwrap().status(), 400);
    // A third refusal would be 60 %: it runs, on either service.
    assert_eq!(b.call(bad()).await.unwrap().status(), 200);
    // Without the settings, every bad request is refused.
    let plain = EndpointPolicy::builder(ms(5_000))
        .default_budget(ms(1_000))
        .build();
    let mut c = AdmitLayer::new(plain).layer(Fn_(ok));
    for _ in 0..3 {
        assert_eq!(c.call(bad()).await.unwrap().status(), 400);
    }
}
