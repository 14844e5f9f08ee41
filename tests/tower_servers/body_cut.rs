//! `admit::ResponseBody` gives its unit of the request's scope back at the scope's cancel
//! (`BodyStop` in the scope's cancel waiters), not at the server's next poll of the body:
//!
//! * the handler's body after the cut: never polled again, its late drop changes nothing
//!   (invariant 6), and `into_inner` gives no body back;
//! * a poll of the handler's body that panics (the body is left `BUSY`): reported as the
//!   handler panicking, not `ClientGone`;
//! * the cut racing polls (with a new waker at each poll, so that every poll hands its waker
//!   over under the lock), drops and `into_inner` on other threads: one report, never under a
//!   poll, and no lost wake-up of a server waiting on the body;
//! * the cost on the normal path, counted (allocations, clones of the server's waker);
//! * on the wire: an HTTP/2 client whose flow-control window is closed, a tonic streaming
//!   response whose client stops reading and then reads again, many stalled, reading and
//!   gone HTTP/1 clients at once on a multi-thread server, and whether hyper polls a body with
//!   one waker (h1 and h2).

use std::cell::Cell;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Wake, Waker};
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::wire::{Admission, EndpointPolicy};
use cancel_scope::{Cause, Lifecycle, Report, Scope};
use http::{Request, Response};
use http_body::{Body, Frame};
use tokio::sync::oneshot;
use tokio::time::{advance, timeout, Instant};
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status};
use tower::{Layer, Service, ServiceExt as _};

use crate::support::alloc;
use crate::support::grpc::Utf8;
use crate::support::servers::{next_report, serve, OnDrop, CUT_AFTER, PATIENCE};
use crate::support::time::ms;
use crate::support::tower::{
    assert_no_more_reports, next_frame, reporting, scope_of, Fn_, Reports,
};

// --- counting (per thread: `cargo test` runs the tests of a binary on threads of one
// process) --------------------------------------------------------------------------------

thread_local! {
    static WAKER_CLONES: Cell<u64> = const { Cell::new(0) };
}

/// Allocations made by this thread, reallocations included (`support::alloc`, the binary's
/// allocator).
fn allocs() -> u64 {
    (alloc::allocs() + alloc::reallocs()) as u64
}

/// A waker that does nothing and counts its clones (on the thread that clones it). Wakers
/// made with different `id`s are different wakers (`will_wake` is false between them).
fn counting_waker(id: usize) -> Waker {
    // A `static`, not a `const`: every use of a `const` may be promoted to a `static` of its
    // own, and a clone whose vtable has another address would not `will_wake` the original.
    static VTABLE: RawWakerVTable = RawWakerVTable::new(
        |data| {
            let _ = WAKER_CLONES.try_with(|c| c.set(c.get() + 1));
            RawWaker::new(data, &VTABLE)
        },
        |_| {},
        |_| {},
        |_| {},
    );
    // SAFETY: the vtable's functions do nothing with the data pointer (an id, never read).
    unsafe { Waker::from_raw(RawWaker::new(std::ptr::without_provenance(id), &VTABLE)) }
}

fn waker_clones() -> u64 {
    WAKER_CLONES.with(Cell::get)
}

// --- layer-level helpers ----------------------------------------------------------------

fn request(method: http::Method) -> Request<()> {
    Request::builder()
        .method(method)
        .header("grpc-timeout", "250m")
        .body(())
        .unwrap()
}

/// The same with a budget no round of the real-clock races below comes near (the policy's
/// 60 s maximum): their cancels must come from the race, not from the deadline. (With 250 ms,
/// a round that a loaded machine held up was cancelled by its deadline, and the race test
/// that asks for a cancel of its own failed with no bug behind it.)
fn unhurried_request() -> Request<()> {
    let mut req = request(http::Method::GET);
    req.headers_mut()
        .insert("grpc-timeout", http::HeaderValue::from_static("60S"));
    req
}

/// The request's scope as the handler's body's drop saw it.
type Seen = (Lifecycle, Option<Cause>);

/// What the test sees of a handler's body: its polls, and what its drop saw.
#[derive(Clone, Default)]
struct Probe {
    polls: Arc<AtomicUsize>,
    /// Polls that found the request's scope final (reported): the report came while the
    /// handler's body was polled, or the handler's body was polled after the report.
    polls_after_report: Arc<AtomicUsize>,
    gone: Arc<AtomicBool>,
    /// The scope's lifecycle and cause when the handler's body was dropped.
    at_drop: Arc<Mutex<Option<Seen>>>,
}

/// A handler's body: `frames` data frames at once, then `Pending` for ever (without a
/// wake-up of its own); with `panic_at`, that poll panics. Checks at the start and the end of
/// each poll that the request is not reported.
struct Watched {
    scope: Scope,
    probe: Probe,
    frames: usize,
    panic_at: Option<usize>,
}

impl Body for Watched {
    type Data = &'static [u8];
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<&'static [u8]>, Infallible>>> {
        let reported = || self.scope.lifecycle().is_final();
        if reported() {
            self.probe.polls_after_report.fetch_add(1, Ordering::SeqCst);
        }
        let n = self.probe.polls.fetch_add(1, Ordering::SeqCst) + 1;
        // A poll that takes a while: a cancel on another thread may come in the middle.
        for _ in 0..100 {
            std::hint::spin_loop();
        }
        if reported() {
            self.probe.polls_after_report.fetch_add(1, Ordering::SeqCst);
        }
        if self.panic_at == Some(n) {
            panic!("the handler's body panics");
        }
        if n <= self.frames {
            Poll::Ready(Some(Ok(Frame::data(&b"x"[..]))))
        } else {
            Poll::Pending
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        *self.probe.at_drop.lock().unwrap() = Some((self.scope.lifecycle(), self.scope.cause()));
        self.probe.gone.store(true, Ordering::SeqCst);
    }
}

/// A handler answering with a [`Watched`] body; the response carries the request's scope
/// and the probe.
fn watched_service(
    layer: &AdmitLayer,
    frames: usize,
    panic_at: Option<usize>,
) -> impl Service<
    Request<()>,
    Response = Response<cancel_scope::integrations::tower::admit::ResponseBody<Watched>>,
    Error = Infallible,
> {
    layer.layer(Fn_(move |req: Request<()>| {
        let scope = req.extensions().get::<Scope>().unwrap().clone();
        async move {
            let probe = Probe::default();
            let body = Watched {
                scope: scope.clone(),
                probe: probe.clone(),
                frames,
                panic_at,
            };
            let mut res = Response::new(body);
            res.extensions_mut().insert(scope);
            res.extensions_mut().insert(probe);
            Ok::<_, Infallible>(res)
        }
    }))
}

// --- 1. the handler's body after the cut (invariant 6) ------------------------------------

/// At the cut the handler's body is dropped (the scope still busy: stopped before it is
/// counted) and the request is reported; the server goes on polling the response body (the
/// client reads again) and drops it much later: the handler's body is never polled again,
/// and the response's drop neither cancels nor reports anything.
#[tokio::test(start_paused = true)]
async fn after_the_cut_the_handlers_body_is_dropped_never_polled_and_the_late_drop_changes_nothing()
{
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
    let mut svc = watched_service(&layer, usize::MAX, None);
    let res = svc.call(request(http::Method::GET)).await.unwrap();
    let scope = scope_of(&res);
    let probe = res.extensions().get::<Probe>().unwrap().clone();
    let mut body = Box::pin(res.into_body());
    assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
    // The client stops reading; the deadline passes.
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded), "{report}");
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
    // The handler's body went at the cut, before the report (its request still busy then).
    assert!(probe.gone.load(Ordering::SeqCst));
    assert_eq!(
        *probe.at_drop.lock().unwrap(),
        Some((Lifecycle::Cancelling, Some(Cause::DeadlineExceeded)))
    );
    let polls = probe.polls.load(Ordering::SeqCst);
    // The client reads again, much later: the body ends, without the handler's body.
    advance(Duration::from_secs(600)).await;
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let end = body.as_mut().poll_frame(&mut cx);
    assert!(matches!(end, Poll::Ready(Some(Err(_)))));
    for _ in 0..10 {
        assert!(matches!(
            body.as_mut().poll_frame(&mut cx),
            Poll::Ready(None)
        ));
    }
    assert_eq!(probe.polls.load(Ordering::SeqCst), polls);
    assert_eq!(probe.polls_after_report.load(Ordering::SeqCst), 0);
    drop(body);
    assert_eq!(scope.cause(), Some(Cause::DeadlineExceeded));
    assert_eq!(scope.lifecycle(), Lifecycle::CancelledStable);
    assert_no_more_reports(&mut reports).await;
}

/// As above, but the server never polls again: the connection goes an hour later and the
/// server drops the response. The handler's body went at the cut; no `ClientGone`, no second
/// report.
#[tokio::test(start_paused = true)]
async fn a_response_dropped_long_after_the_cut_is_not_client_gone() {
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
    let mut svc = watched_service(&layer, usize::MAX, None);
    let res = svc.call(request(http::Method::GET)).await.unwrap();
    let scope = scope_of(&res);
    let probe = res.extensions().get::<Probe>().unwrap().clone();
    let mut body = Box::pin(res.into_body());
    assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded), "{report}");
    assert!(probe.gone.load(Ordering::SeqCst));
    advance(Duration::from_secs(3600)).await;
    drop(body);
    assert_eq!(
        *probe.at_drop.lock().unwrap(),
        Some((Lifecycle::Cancelling, Some(Cause::DeadlineExceeded)))
    );
    assert_eq!(probe.polls.load(Ordering::SeqCst), 1);
    assert_eq!(scope.cause(), Some(Cause::DeadlineExceeded));
    assert_no_more_reports(&mut reports).await;
}

/// `into_inner` after the cut: the request was reported, the scope stopped waiting for the
/// body and counts it as stopped ("from the cancel on it is polled only to be ended"), so
/// `into_inner` gives `None`, as for a body that was stopped, and drops the handler's body
/// (before, it gave it back, to be polled after the report).
#[tokio::test(start_paused = true)]
async fn into_inner_after_the_cut_gives_no_body_to_poll_after_the_report() {
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
    let mut svc = watched_service(&layer, usize::MAX, None);
    let res = svc.call(request(http::Method::GET)).await.unwrap();
    let mut body = Box::pin(res.into_body());
    assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded), "{report}");
    let inner = (*Pin::into_inner(body)).into_inner();
    assert!(
        inner.is_none(),
        "the handler's body, stopped by the cut and reported, is handed out to be polled"
    );
}

/// A handler's body that holds work of the request's scope itself (a tethered resource, as a
/// connection from a pool would be, and a semaphore permit acquired through the scope), with
/// a client that stopped reading: at the deadline the handler's body is dropped, without a
/// poll, so the resource and the permit go back, and the request is reported then.
#[tokio::test(start_paused = true)]
async fn a_body_holding_resources_of_the_scope_lets_them_go_at_the_cut() {
    struct Holding {
        _conn: cancel_scope::Tethered<()>,
        _permit: cancel_scope::Tethered<tokio::sync::OwnedSemaphorePermit>,
    }
    impl Body for Holding {
        type Data = &'static [u8];
        type Error = Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<&'static [u8]>, Infallible>>> {
            Poll::Ready(Some(Ok(Frame::data(&b"x"[..]))))
        }
    }
    let pool = Arc::new(tokio::sync::Semaphore::new(1));
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
    let mut svc = layer.layer(Fn_({
        let pool = pool.clone();
        move |req: Request<()>| {
            let scope = req.extensions().get::<Scope>().unwrap().clone();
            let pool = pool.clone();
            async move {
                let body = Holding {
                    _conn: scope.tether(()).unwrap(),
                    _permit: scope.acquire(&pool).await.unwrap(),
                };
                let mut res = Response::new(body);
                res.extensions_mut().insert(scope);
                Ok::<_, Infallible>(res)
            }
        }
    }));
    let start = Instant::now();
    let res = svc.call(request(http::Method::GET)).await.unwrap();
    let scope = scope_of(&res);
    let mut body = Box::pin(res.into_body());
    assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
    assert_eq!(pool.available_permits(), 0);
    // The client reads no more; the server keeps the response.
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(Instant::now() - start, ms(250));
    assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded), "{report}");
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
    assert_eq!(pool.available_permits(), 1, "the permit is still held");
    assert_eq!(scope.lifecycle(), Lifecycle::CancelledStable);
    drop(body);
    assert_no_more_reports(&mut reports).await;
}

// --- 2. a poll of the handler's body that panics ------------------------------------------

/// Polls `body` once, catching a panic of the poll (as a server that catches panics would).
fn poll_catching<B: Body + Unpin>(body: &mut B) -> std::thread::Result<Poll<Option<()>>> {
    let waker = futures::task::noop_waker();
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Pin::new(&mut *body)
            .poll_frame(&mut Context::from_waker(&waker))
            .map(|f| f.map(|_| ()))
    }))
}

/// The handler's body panics in a poll; the server catches it and keeps the body (it is left
/// `BUSY`). The cut at the deadline then leaves the unit to that poll, which is over: the
/// report waits for the body's drop (as the module docs say), past the deadline and the
/// grace period; it comes at the drop, once.
#[tokio::test(start_paused = true)]
async fn after_a_caught_panic_the_report_waits_for_the_bodys_drop() {
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
    let mut svc = watched_service(&layer, usize::MAX, Some(2));
    let res = svc.call(request(http::Method::GET)).await.unwrap();
    let scope = scope_of(&res);
    let mut body = Box::pin(res.into_body());
    assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
    assert!(poll_catching(&mut body).is_err(), "the poll did not panic");
    // The deadline passes (250 ms), and the default grace period (1 s) and more.
    let late = timeout(Duration::from_secs(60), reports.recv()).await;
    assert!(late.is_err(), "reported with the body kept: {late:?}");
    assert_eq!(scope.cause(), Some(Cause::DeadlineExceeded));
    assert_eq!(scope.lifecycle(), Lifecycle::Cancelling);
    drop(body);
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded), "{report}");
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
    assert_no_more_reports(&mut reports).await;
}

/// The same with a poll after the panic and the cut: it ends the body and gives the unit
/// back (the handler's body is not polled again).
#[tokio::test(start_paused = true)]
async fn after_a_caught_panic_a_poll_after_the_cut_lets_go() {
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
    let mut svc = watched_service(&layer, usize::MAX, Some(2));
    let res = svc.call(request(http::Method::GET)).await.unwrap();
    let probe = res.extensions().get::<Probe>().unwrap().clone();
    let mut body = Box::pin(res.into_body());
    assert!(next_frame(&mut body).await.unwrap().unwrap().is_data());
    assert!(poll_catching(&mut body).is_err(), "the poll did not panic");
    advance(ms(300)).await;
    let polls = probe.polls.load(Ordering::SeqCst);
    let end = poll_catching(&mut body).unwrap();
    assert_eq!(end, Poll::Ready(Some(())));
    assert_eq!(probe.polls.load(Ordering::SeqCst), polls);
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded), "{report}");
    drop(body);
    assert_no_more_reports(&mut reports).await;
}

/// A server task whose poll of the body panics (hyper's connection task does not catch it):
/// tokio drops the task and the body with it. The request is reported at once; its cause is
/// the handler's panic, as for a panic of the handler's future (the module docs of `admit`),
/// not a client that went away: the body is left `BUSY` by the unwound poll, and its drop
/// tells.
#[tokio::test(start_paused = true)]
async fn a_panic_of_the_handlers_body_is_not_reported_as_client_gone() {
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
    let mut svc = watched_service(&layer, usize::MAX, Some(2));
    let res = svc.call(request(http::Method::GET)).await.unwrap();
    let mut body = Box::pin(res.into_body());
    let server = tokio::spawn(async move {
        loop {
            next_frame(&mut body).await;
        }
    });
    assert!(server.await.unwrap_err().is_panic());
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
    assert_eq!(
        report.cause(),
        Some(&Cause::cancelled("the handler panicked")),
        "{report}"
    );
}

// --- 3. races on other threads -------------------------------------------------------------

/// A waker for a thread that waits: set when woken.
#[derive(Default)]
struct Signal {
    woken: Mutex<bool>,
    cv: Condvar,
    wakes: AtomicUsize,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        *self.woken.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

impl Signal {
    /// Waits until woken, at most `d`; whether it was.
    fn wait(&self, d: Duration) -> bool {
        let woken = self.woken.lock().unwrap();
        let (woken, _) = self.cv.wait_timeout_while(woken, d, |w| !*w).unwrap();
        *woken
    }
}

/// How a round's server ends with the body.
#[derive(Clone, Copy, Debug)]
enum End {
    /// Polls until the body ends (the cut), waiting for a wake-up whenever it is pending.
    Cut,
    /// Drops the body after `k` polls (or at its end).
    Drop(usize),
    /// Takes the handler's body out after `k` polls (or at its end), then drops it.
    IntoInner(usize),
}

/// The cut (a cancel from a thread of its own) races the server's polls, drops and
/// `into_inner` on this thread, which polls with a new waker each time (so that every poll
/// hands its waker over under the lock, racing the cut's `take`). The handler's body stalls
/// (`Pending`, no wake-up of its own) after a few frames: only the cut wakes the server.
/// Each request is reported once, never while the handler's body is polled; a server
/// waiting on a stalled body is always woken by the cut (no lost wake-up); the handler's body
/// is never polled after the report.
#[test]
fn a_cut_racing_polls_with_new_wakers_drops_and_into_inner_lets_go_once_and_always_wakes() {
    const ROUNDS: usize = 3_000;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (layer, mut reports) = reporting(EndpointPolicy::builder(ms(60_000)).build());
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n) as usize
    };
    // Cancels each scope it is sent once its handler's body was polled `at` times (or is
    // gone, or out of the layer's hands).
    let (to_canceller, jobs) = std::sync::mpsc::channel::<(Scope, Probe, Arc<AtomicBool>, usize)>();
    let canceller = std::thread::spawn(move || {
        for (scope, probe, out, at) in jobs {
            while probe.polls.load(Ordering::SeqCst) < at
                && !probe.gone.load(Ordering::SeqCst)
                && !out.load(Ordering::SeqCst)
            {
                std::hint::spin_loop();
            }
            scope.cancel_with("race");
        }
    });
    let (mut cut, mut dropped, mut taken, mut completed) = (0, 0, 0, 0);
    for round in 0..ROUNDS {
        let frames = next(6);
        let mut svc = watched_service(&layer, frames, None);
        let res = rt
            .block_on(async { svc.ready().await.unwrap().call(unhurried_request()).await })
            .unwrap();
        let scope = scope_of(&res);
        let probe = res.extensions().get::<Probe>().unwrap().clone();
        let out = Arc::new(AtomicBool::new(false));
        let end = match next(3) {
            0 => End::Cut,
            1 => End::Drop(next(8)),
            _ => End::IntoInner(next(8)),
        };
        to_canceller
            .send((
                scope.clone(),
                probe.clone(),
                out.clone(),
                next(frames as u64 + 2),
            ))
            .unwrap();
        let mut body = Box::pin(res.into_body());
        let mut polls = 0;
        let mut kept = None;
        loop {
            match end {
                End::Drop(k) if polls >= k => {
                    drop(body);
                    dropped += 1;
                    break;
                }
                End::IntoInner(k) if polls >= k => {
                    // Unpin: the box's content moves out.
                    let inner = (*Pin::into_inner(body)).into_inner();
                    out.store(true, Ordering::SeqCst);
                    kept = inner;
                    taken += 1;
                    break;
                }
                _ => {}
            }
            let signal = Arc::new(Signal::default());
            let waker = Waker::from(signal.clone());
            polls += 1;
            match body.as_mut().poll_frame(&mut Context::from_waker(&waker)) {
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(_))) => {
                    cut += 1;
                    drop(body);
                    break;
                }
                Poll::Ready(None) => unreachable!("round {round}: the handler's body never ends"),
                Poll::Pending => {
                    assert!(
                        signal.wait(PATIENCE),
                        "round {round} ({end:?}, {frames} frames, poll {polls}): a server \
                         waiting on the body was not woken by the cut"
                    );
                }
            }
        }
        let (_, report) = rt
            .block_on(async { timeout(PATIENCE, reports.recv()).await })
            .unwrap_or_else(|_| panic!("round {round} ({end:?}): no report"))
            .unwrap();
        assert!(report.state().is_final(), "round {round}: {report}");
        match report.cause() {
            Some(c) => assert!(
                *c == Cause::ClientGone || c.reason() == Some("race"),
                "round {round}: {report}"
            ),
            None => {
                // Taken out of the layer's hands before the cancel: the request completed.
                assert!(matches!(end, End::IntoInner(_)), "round {round}: {report}");
                completed += 1;
            }
        }
        drop(kept);
        assert!(probe.gone.load(Ordering::SeqCst), "round {round}");
        assert_eq!(
            probe.polls_after_report.load(Ordering::SeqCst),
            0,
            "round {round} ({end:?}): the handler's body was polled with the request reported"
        );
        assert!(scope.lifecycle().is_final());
    }
    drop(to_canceller);
    canceller.join().unwrap();
    assert!(
        cut > 0 && dropped > 0 && taken > 0,
        "{cut} cut, {dropped} dropped, {taken} taken ({completed} completed)"
    );
    assert!(reports.try_recv().is_err(), "a request reported twice");
}

/// A cancel exactly as the handler answers (on another thread, at the moment `ResponseBody`
/// takes its unit and registers its waker): the request is reported once, and the body ends
/// at its first poll, wherever the cancel fell.
#[test]
fn a_cancel_racing_the_bodys_registration_is_seen() {
    const ROUNDS: usize = 2_000;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (layer, mut reports) = reporting(EndpointPolicy::builder(ms(60_000)).build());
    let mut ended_at_once = 0;
    for round in 0..ROUNDS {
        let (scope_tx, scope_rx) = std::sync::mpsc::channel::<Scope>();
        let spin = round % 50;
        let mut svc = layer.layer(Fn_(move |req: Request<()>| {
            let scope = req.extensions().get::<Scope>().unwrap().clone();
            let scope_tx = scope_tx.clone();
            async move {
                // The canceller is told now and cancels after a few spins, around the moment
                // the layer tracks the body.
                scope_tx.send(scope.clone()).unwrap();
                let mut res = Response::new(Watched {
                    scope: scope.clone(),
                    probe: Probe::default(),
                    frames: usize::MAX,
                    panic_at: None,
                });
                res.extensions_mut().insert(scope);
                Ok::<_, Infallible>(res)
            }
        }));
        let canceller = std::thread::spawn(move || {
            let scope = scope_rx.recv().unwrap();
            for _ in 0..spin {
                std::hint::spin_loop();
            }
            scope.cancel_with("race");
        });
        let res = rt
            .block_on(async { svc.ready().await.unwrap().call(unhurried_request()).await })
            .unwrap();
        canceller.join().unwrap();
        let mut body = Box::pin(res.into_body());
        // Cancelled by now: the first poll ends the body (the cut or the poll found it).
        let waker = futures::task::noop_waker();
        match body.as_mut().poll_frame(&mut Context::from_waker(&waker)) {
            Poll::Ready(Some(Err(_))) => ended_at_once += 1,
            // Or the handler's answer was already the layer's own answer (no body).
            Poll::Ready(None) => {}
            other => panic!("round {round}: {:?}", other.map(|f| f.map(|r| r.is_ok()))),
        }
        let (_, report) = rt
            .block_on(async { timeout(PATIENCE, reports.recv()).await })
            .unwrap_or_else(|_| panic!("round {round}: no report"))
            .unwrap();
        assert_eq!(report.state(), Lifecycle::CancelledStable, "round {round}");
        drop(body);
    }
    assert!(ended_at_once > 0);
    assert!(reports.try_recv().is_err(), "a request reported twice");
}

// --- 4. the cost on the normal path, counted ------------------------------------------------

/// A body that never ends: a frame at each poll.
struct Endless;

impl Body for Endless {
    type Data = &'static [u8];
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<&'static [u8]>, Infallible>>> {
        Poll::Ready(Some(Ok(Frame::data(&b"x"[..]))))
    }
}

/// Allocations of one request (call, two frames, end) through `Admit` on this thread.
async fn allocations_of_a_request(method: http::Method) -> u64 {
    let mut svc = AdmitLayer::new(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    )
    .layer(Fn_(|_: Request<()>| async {
        let frames = VecDeque::from([
            Frame::data(Bytes::from_static(b"a")),
            Frame::data(Bytes::from_static(b"b")),
        ]);
        Ok::<_, Infallible>(Response::new(Frames(frames)))
    }));
    let before = allocs();
    let res = svc.call(request(method)).await.unwrap();
    let mut body = Box::pin(res.into_body());
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    while let Poll::Ready(Some(_)) = body.as_mut().poll_frame(&mut cx) {}
    drop(body);
    allocs() - before
}

/// Frames, then the end (`is_end_stream` only once empty; no size hint: tracked). `Bytes`, as
/// servers send (other data is copied into `Bytes`).
struct Frames(VecDeque<Frame<Bytes>>);

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// Tracking a body costs two allocations (the `BodyStop`, and the handler's body boxed in it,
/// where the cut can drop it): the stop's waker takes the scope's inline cancel-waiter slot.
/// Counted as the difference between a `GET` (tracked) and a `HEAD` (untracked) of the same
/// response.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn tracking_a_body_costs_two_allocations() {
    // The fewest of a few rounds (the first ones warm up lazy statics and the timers).
    let (mut tracked, mut untracked) = (u64::MAX, u64::MAX);
    for _ in 0..5 {
        tracked = tracked.min(allocations_of_a_request(http::Method::GET).await);
        untracked = untracked.min(allocations_of_a_request(http::Method::HEAD).await);
    }
    // Before 9e91ab3: 19 and 19; after: 20 and 19. With the handler's body boxed in the stop,
    // one more: 18 and 16 here, against 17 and 16 just before.
    eprintln!("allocations: tracked {tracked}, untracked {untracked}");
    assert!(
        tracked <= untracked + 2,
        "tracked {tracked}, untracked {untracked}"
    );
}

/// The server's waker is cloned (and the lock taken) at the first poll only while the
/// server polls with the same waker; a server whose waker changes at each poll pays a clone
/// pair and a lock at each poll.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_servers_waker_is_handed_over_once_while_it_stays_the_same() {
    let mut svc = AdmitLayer::new(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    )
    .layer(Fn_(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Endless))
    }));
    let res = svc.call(request(http::Method::GET)).await.unwrap();
    let mut body = Box::pin(res.into_body());
    let (a, b) = (counting_waker(1), counting_waker(2));
    let before = waker_clones();
    for _ in 0..100 {
        assert!(body
            .as_mut()
            .poll_frame(&mut Context::from_waker(&a))
            .is_ready());
    }
    let same = waker_clones() - before;
    let before = waker_clones();
    for i in 0..100 {
        let w = if i % 2 == 0 { &b } else { &a };
        assert!(body
            .as_mut()
            .poll_frame(&mut Context::from_waker(w))
            .is_ready());
    }
    let alternating = waker_clones() - before;
    eprintln!("waker clones: 100 polls, same waker {same}; alternating {alternating}");
    assert!(same <= 2, "{same}");
    assert!(alternating <= 200, "{alternating}");
}

// --- 5. on the wire ----------------------------------------------------------------------

type Gone = Arc<Mutex<Option<oneshot::Sender<()>>>>;

/// 16 KiB chunks for ever, as fast as the connection takes them.
async fn trickle(axum::extract::State(gone): axum::extract::State<Gone>) -> axum::body::Body {
    let guard = OnDrop(gone.lock().unwrap().take());
    let chunk = Bytes::from(vec![b'x'; 16 << 10]);
    let chunks = futures::stream::unfold(guard, move |guard| {
        let chunk = chunk.clone();
        async move { Some((Ok::<_, Infallible>(chunk), guard)) }
    });
    axum::body::Body::from_stream(chunks)
}

/// An HTTP/2 client with a 64 KiB window (a raw h2 client: tonic's channel).
async fn h2_client(addr: std::net::SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .unwrap()
}

/// An HTTP/2 client that does not read the response body: its window closes and hyper's h2
/// server stops polling the body (it waits for send capacity). At the deadline the handler's
/// body is dropped all the same, without being polled, and then the request is reported; when
/// the client resets the stream at last nothing is reported again.
#[tokio::test]
async fn an_h2_client_whose_window_is_closed_does_not_keep_the_request_from_its_report() {
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
    let (gone_tx, mut gone) = oneshot::channel();
    let app = Router::new()
        .route("/", get(trickle))
        .with_state(Arc::new(Mutex::new(Some(gone_tx))))
        .layer(layer);
    let addr = serve(app).await;
    let client = h2_client(addr).await;
    let sent = Instant::now();
    let req = Request::builder()
        .uri(format!("http://{addr}/"))
        .header("grpc-timeout", "2S")
        .body(tonic::body::Body::empty())
        .unwrap();
    let res = timeout(PATIENCE, client.oneshot(req))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.version(), http::Version::HTTP_2);
    // The client reads nothing: after 64 KiB the server cannot send.
    let (_, report) = next_report(&mut reports).await;
    assert!(sent.elapsed() >= CUT_AFTER);
    assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded), "{report}");
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
    assert_eq!(
        gone.try_recv(),
        Ok(()),
        "reported with the handler's body still there"
    );
    // The client goes (RST_STREAM): the server drops the response; no second report.
    drop(res);
    let again = timeout(ms(200), reports.recv()).await;
    assert!(again.is_err(), "a second report: {again:?}");
}

/// "/test.Feed/Feed": 16 KiB messages for ever. `gone` hears when the stream is dropped.
#[derive(Clone)]
struct Feed {
    gone: Gone,
}

impl tonic::server::NamedService for Feed {
    const NAME: &'static str = "test.Feed";
}

type Messages = Pin<Box<dyn futures::Stream<Item = Result<String, Status>> + Send>>;

struct FeedCall(Gone);

impl tonic::server::ServerStreamingService<String> for FeedCall {
    type Response = String;
    type ResponseStream = Messages;
    type Future = std::future::Ready<Result<tonic::Response<Messages>, Status>>;

    fn call(&mut self, _: tonic::Request<String>) -> Self::Future {
        let guard = OnDrop(self.0.lock().unwrap().take());
        let message = "x".repeat(16 << 10);
        let messages = futures::stream::unfold(guard, move |guard| {
            let m = message.clone();
            async move { Some((Ok(m), guard)) }
        });
        std::future::ready(Ok(tonic::Response::new(Box::pin(messages) as Messages)))
    }
}

impl tower::Service<Request<tonic::body::Body>> for Feed {
    type Response = Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<tonic::body::Body>) -> Self::Future {
        let gone = self.gone.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(Utf8);
            Ok(grpc.server_streaming(FeedCall(gone), req).await)
        })
    }
}

/// A tonic streaming response whose client reads one message and stops: at the deadline the
/// stream is dropped (without a poll: the client's window is closed) and the request is
/// reported; when the client reads again it gets what was sent, then `DEADLINE_EXCEEDED` (the
/// trailers of the poll after the cut); nothing is reported again.
#[tokio::test]
async fn a_tonic_stream_whose_client_pauses_is_reported_at_the_deadline_then_ends_with_deadline_exceeded(
) {
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
    let (gone_tx, mut gone) = oneshot::channel();
    let feed = Feed {
        gone: Arc::new(Mutex::new(Some(gone_tx))),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Server::builder().layer(layer).add_service(feed);
    tokio::spawn(router.serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)));
    let mut grpc = tonic::client::Grpc::new(h2_client(addr).await);
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new(String::new());
    request.set_timeout(CUT_AFTER);
    let sent = Instant::now();
    let mut stream = grpc
        .server_streaming(
            request,
            http::uri::PathAndQuery::from_static("/test.Feed/Feed"),
            Utf8,
        )
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stream.message().await.unwrap().unwrap().len(), 16 << 10);
    // The client stops reading.
    let (_, report) = next_report(&mut reports).await;
    assert!(sent.elapsed() >= CUT_AFTER);
    assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded), "{report}");
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
    assert_eq!(
        gone.try_recv(),
        Ok(()),
        "reported with the stream still there"
    );
    // It reads again: what was sent, then the status.
    let status = timeout(PATIENCE, async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => {}
                Ok(None) => panic!("the stream ended without a status"),
                Err(status) => break status,
            }
        }
    })
    .await
    .expect("the stream did not end");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    let again = timeout(ms(200), reports.recv()).await;
    assert!(again.is_err(), "a second report: {again:?}");
}

// --- does hyper poll a body with one waker? -------------------------------------------------

/// A body that counts the polls whose waker would not wake the task of the poll before (as
/// `ResponseBody` decides whether to hand its waker over under the lock).
struct WakerLog<B> {
    inner: B,
    last: Option<Waker>,
    polls: Arc<AtomicUsize>,
    changes: Arc<AtomicUsize>,
}

impl<B: Body + Unpin> Body for WakerLog<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        if !self.last.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            self.changes.fetch_add(1, Ordering::SeqCst);
            self.last = Some(cx.waker().clone());
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// 4 MiB in 4 KiB chunks, each after a yield (so that the server's poll is often pending).
async fn four_mib() -> axum::body::Body {
    let chunks = futures::stream::unfold(0, |n| async move {
        if n == 1024 {
            return None;
        }
        tokio::task::yield_now().await;
        Some((Ok::<_, Infallible>(Bytes::from(vec![b'x'; 4096])), n + 1))
    });
    axum::body::Body::from_stream(chunks)
}

/// hyper polls a response body with its task's waker (one per connection in h1, one per
/// stream in h2): the lock of `ResponseBody::enter` is taken once per body, not per poll.
#[tokio::test]
async fn hyper_polls_a_response_body_with_one_waker_in_h1_and_h2() {
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(30_000))
            .default_budget(ms(10_000))
            .build(),
    );
    let polls = Arc::new(AtomicUsize::new(0));
    let changes = Arc::new(AtomicUsize::new(0));
    let log = {
        let (polls, changes) = (polls.clone(), changes.clone());
        tower::util::MapResponseLayer::new(move |res: Response<axum::body::Body>| {
            let (polls, changes) = (polls.clone(), changes.clone());
            res.map(|inner| {
                axum::body::Body::new(WakerLog {
                    inner,
                    last: None,
                    polls,
                    changes,
                })
            })
        })
    };
    let app = Router::new()
        .route("/", get(four_mib))
        .layer(layer)
        .layer(log);
    let addr = serve(app).await;

    // h1: reqwest.
    let res = reqwest::Client::new()
        .get(format!("http://{addr}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.bytes().await.unwrap().len(), 4 << 20);
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
    let (h1_polls, h1_changes) = (
        polls.swap(0, Ordering::SeqCst),
        changes.swap(0, Ordering::SeqCst),
    );

    // h2: a raw h2 client, reading the body to its end.
    let req = Request::builder()
        .uri(format!("http://{addr}/"))
        .body(tonic::body::Body::empty())
        .unwrap();
    let res = h2_client(addr).await.oneshot(req).await.unwrap();
    assert_eq!(res.version(), http::Version::HTTP_2);
    let mut body = res.into_body();
    let mut len = 0;
    while let Some(frame) = timeout(PATIENCE, next_frame(&mut body)).await.unwrap() {
        len += frame.unwrap().into_data().map_or(0, |d| d.len());
    }
    assert_eq!(len, 4 << 20);
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
    let (h2_polls, h2_changes) = (polls.load(Ordering::SeqCst), changes.load(Ordering::SeqCst));
    eprintln!(
        "h1: {h1_polls} polls, {h1_changes} wakers; h2: {h2_polls} polls, {h2_changes} wakers"
    );
    assert!(h1_polls > 1024 && h2_polls > 1024);
    assert_eq!(h1_changes, 1, "h1: {h1_polls} polls");
    assert_eq!(h2_changes, 1, "h2: {h2_polls} polls");
}

// --- many stalled HTTP/1 clients on a multi-thread server -----------------------------------

/// 16 MiB chunks (one buffer, shared) for ever: more than the socket's buffers take, so that
/// hyper's write queue stays full once the client stops reading and hyper polls the body no
/// more, even when its task is woken (with 1 MiB chunks the queue drains below hyper's limit
/// and the server's next poll ends the body, with or without the change).
async fn flood() -> axum::body::Body {
    let chunk = Bytes::from(vec![b'x'; 16 << 20]);
    let chunks = futures::stream::repeat_with(move || Ok::<_, Infallible>(chunk.clone()));
    axum::body::Body::from_stream(chunks)
}

/// Reads the response head (and a little of the body) from `conn`.
async fn read_head(conn: &mut tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt as _;
    let mut got = Vec::new();
    let mut buf = [0; 4096];
    loop {
        let n = conn.read(&mut buf).await.unwrap();
        assert_ne!(n, 0, "the server closed the connection");
        got.extend_from_slice(&buf[..n]);
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            if got.len() > i + 4 {
                assert!(got.starts_with(b"HTTP/1.1 200"));
                return;
            }
        }
    }
}

/// Clients at once on a multi-thread server: some stop reading after the head, some read
/// on until the cut, some go before the deadline. Every request is reported once, at its
/// deadline (the stalled and the reading ones) or when its client went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_reading_and_gone_clients_at_once_are_each_reported_once() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    const STALLED: usize = 8;
    const READING: usize = 2;
    const GOING: usize = 4;
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
    let app = Router::new().route("/", get(flood)).layer(layer);
    let addr = serve(app).await;
    let sent = Instant::now();
    let mut stalled = Vec::new();
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..STALLED + READING + GOING {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET / HTTP/1.1\r\nhost: test\r\ngrpc-timeout: 2S\r\n\r\n")
            .await
            .unwrap();
        if i < STALLED {
            read_head(&mut conn).await;
            stalled.push(conn);
        } else if i < STALLED + READING {
            clients.spawn(async move {
                read_head(&mut conn).await;
                let mut buf = vec![0; 1 << 16];
                // Until the server cuts the response (and closes the connection).
                while let Ok(n) = conn.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            });
        } else {
            read_head(&mut conn).await;
            drop(conn);
        }
    }
    let mut causes = Vec::new();
    for _ in 0..STALLED + READING + GOING {
        let (_, report) = next_report_in(&mut reports, PATIENCE).await;
        assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
        causes.push(report.cause().cloned().unwrap());
    }
    let deadline = causes
        .iter()
        .filter(|c| **c == Cause::DeadlineExceeded)
        .count();
    let gone = causes.iter().filter(|c| **c == Cause::ClientGone).count();
    assert_eq!((deadline, gone), (STALLED + READING, GOING), "{causes:?}");
    assert!(sent.elapsed() >= CUT_AFTER);
    timeout(PATIENCE, async {
        while let Some(r) = clients.join_next().await {
            r.unwrap();
        }
    })
    .await
    .expect("a reading client was not cut");
    // The stalled clients go: nothing more is reported.
    drop(stalled);
    let again = timeout(ms(300), reports.recv()).await;
    assert!(again.is_err(), "a second report: {again:?}");
}

async fn next_report_in(reports: &mut Reports, d: Duration) -> (Admission, Report) {
    timeout(d, reports.recv())
        .await
        .expect("no report in time")
        .unwrap()
}
