//! The cut of a streaming response body at the request's deadline or cancel, in process on
//! tokio's virtual clock: the body is cut and reported after the cut, a client gone while it
//! streams is client-gone, a body sent to its end completes the request, and a body the server
//! stops polling (its client stopped reading) lets the request's scope stop waiting for it at
//! the cancel, without a poll, also when the cut races polls and drops on other threads.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use cancel_scope::wire::EndpointPolicy;
use cancel_scope::{Cause, ChildSpec, Lifecycle, Scope};
use http::{Request, Response};
use http_body::{Body, Frame};
use tokio::time::{advance, Instant};
use tower_layer::Layer;
use tower_service::Service;

use crate::support::time::ms;
use crate::support::tower::{
    assert_no_more_reports, next_frame, next_report, reporting, scope_of, Fn_, Frames,
};

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
        let (layer, mut reports) = reporting(
            EndpointPolicy::builder(ms(5_000))
                .default_budget(ms(1_000))
                .reserve(ms(10))
                .build(),
        );
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
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
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
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
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
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
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

#[tokio::test(start_paused = true)]
async fn a_body_the_server_stops_polling_lets_the_request_report_at_the_deadline() {
    for (grpc, late_poll) in [(false, true), (true, true), (false, false), (true, false)] {
        let (layer, mut reports) = reporting(
            EndpointPolicy::builder(ms(5_000))
                .default_budget(ms(1_000))
                .reserve(ms(10))
                .build(),
        );
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
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
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
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
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
        let (layer, mut reports) = reporting(
            EndpointPolicy::builder(ms(5_000))
                .default_budget(ms(1_000))
                .build(),
        );
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
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
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
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
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
    let (layer, mut reports) = reporting(EndpointPolicy::builder(ms(60_000)).build());
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
