//! A request on an endpoint with `DetachLayer` outside `AdmitLayer`, on tokio's virtual clock:
//! it runs on after its client goes away, for at most the layer's bound and never past its own
//! deadline, its answer's body read to its end; a client that waits gets the answer as without
//! the layer.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use cancel_scope::integrations::tower::{AdmitLayer, DetachLayer};
use cancel_scope::wire::EndpointPolicy;
use cancel_scope::{Cause, Lifecycle, Scope};
use http::{Request, Response};
use http_body::Frame;
use tokio::time::{advance, sleep, Instant};
use tower_layer::{Layer, Stack};
use tower_service::Service;

use crate::support::time::ms;
use crate::support::tower::{next_frame, next_report, reporting, stuck, Fn_, Frames};

/// The policy of these tests: a 5 s budget for a caller that declares none.
fn policy() -> EndpointPolicy {
    EndpointPolicy::builder(ms(5_000)).build()
}

/// Admission under `policy` with `DetachLayer::new(bound)` outside it.
fn detaching(
    policy: EndpointPolicy,
    bound: Duration,
) -> (
    Stack<AdmitLayer, DetachLayer>,
    crate::support::tower::Reports,
) {
    let (admit, reports) = reporting(policy);
    (Stack::new(admit, DetachLayer::new(bound)), reports)
}

/// Polls `fut` once (the request is admitted and its handler starts), then drops it: the
/// client goes away.
async fn leave<F: Future>(fut: F) {
    let mut fut = Box::pin(fut);
    assert!(poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_pending())).await);
    drop(fut);
}

/// The future of a handler made by [`working`].
type Answer = std::pin::Pin<Box<dyn Future<Output = Result<Response<String>, Infallible>> + Send>>;

/// A handler that works `work` in the request's scope, sets `done` and answers.
fn working(work: Duration, done: Arc<AtomicBool>) -> impl FnMut(Request<()>) -> Answer + Clone {
    move |_| {
        let done = done.clone();
        Box::pin(async move {
            Scope::current().spawn(sleep(work)).unwrap().await.unwrap();
            done.store(true, Ordering::SeqCst);
            Ok(Response::new("committed".to_owned()))
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_detached_request_finishes_after_its_client_leaves() {
    let (layers, mut reports) = detaching(policy(), ms(1_000));
    let done = Arc::new(AtomicBool::new(false));
    let mut svc = layers.layer(Fn_(working(ms(300), done.clone())));
    let start = Instant::now();
    leave(svc.call(Request::new(()))).await;
    let (_, report) = next_report(&mut reports).await;
    // It ran to its answer, 300 ms in: not cancelled, the handler and its work succeeded.
    assert!(done.load(Ordering::SeqCst));
    assert_eq!(start.elapsed(), ms(300));
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
    assert_eq!((report.cause(), report.succeeded()), (None, 2), "{report}");
}

#[tokio::test(start_paused = true)]
async fn without_the_layer_the_same_request_is_cancelled_at_once() {
    let (admit, mut reports) = reporting(policy());
    let done = Arc::new(AtomicBool::new(false));
    let mut svc = admit.layer(Fn_(working(ms(300), done.clone())));
    let start = Instant::now();
    leave(svc.call(Request::new(()))).await;
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.cause(), Some(&Cause::ClientGone), "{report}");
    assert_eq!(start.elapsed(), ms(0));
    assert!(!done.load(Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn at_the_bound_a_detached_request_is_cancelled_as_client_gone() {
    let (layers, mut reports) = detaching(policy(), ms(100));
    let mut svc = layers.layer(Fn_(stuck));
    let fut = svc.call(Request::new(()));
    advance(ms(10)).await;
    let left = Instant::now();
    leave(fut).await;
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(left.elapsed(), ms(100));
    assert_eq!(report.cause(), Some(&Cause::ClientGone), "{report}");
    // The handler and its work.
    assert_eq!(report.cancelled(), 2, "{report}");
}

#[tokio::test(start_paused = true)]
async fn a_detached_request_keeps_its_own_deadline() {
    let (layers, mut reports) = detaching(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(200))
            .build(),
        ms(10_000),
    );
    let mut svc = layers.layer(Fn_(stuck));
    let start = Instant::now();
    leave(svc.call(Request::new(()))).await;
    let (_, report) = next_report(&mut reports).await;
    // The budget only shrinks: the 10 s bound does not outlast the request's 200 ms.
    assert_eq!(start.elapsed(), ms(200));
    assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded), "{report}");
}

#[tokio::test(start_paused = true)]
async fn a_client_that_waits_gets_the_answer() {
    let (layers, mut reports) = detaching(policy(), ms(1_000));
    let done = Arc::new(AtomicBool::new(false));
    let mut svc = layers.layer(Fn_(working(ms(300), done)));
    let res = svc.call(Request::new(())).await.unwrap();
    assert_eq!(res.status(), 200);
    let mut body = res.into_body();
    let frame = next_frame(&mut body).await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "committed");
    assert!(next_frame(&mut body).await.is_none());
    drop(body);
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
}

#[tokio::test(start_paused = true)]
async fn the_answer_of_a_detached_request_is_read_to_its_end() {
    let (layers, mut reports) = detaching(policy(), ms(1_000));
    // The handler answers at once with a body whose frames the request's work produces: the
    // scope closes only at the body's end, so a body nobody read would keep it open.
    let read = Arc::new(AtomicBool::new(false));
    let seen = read.clone();
    let mut svc = layers.layer(Fn_(move |_: Request<()>| {
        let seen = seen.clone();
        async move {
            sleep(ms(50)).await;
            seen.store(true, Ordering::SeqCst);
            let frames = VecDeque::from([Frame::data(&b"a"[..]), Frame::data(&b"b"[..])]);
            Ok::<_, Infallible>(Response::new(Frames::<true>(frames)))
        }
    }));
    let start = Instant::now();
    leave(svc.call(Request::new(()))).await;
    let (_, report) = next_report(&mut reports).await;
    assert!(read.load(Ordering::SeqCst));
    assert_eq!(start.elapsed(), ms(50));
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
}

#[tokio::test(start_paused = true)]
async fn an_answer_that_arrived_but_was_not_taken_is_read_to_its_end() {
    let (layers, mut reports) = detaching(policy(), ms(1_000));
    let mut svc = layers.layer(Fn_(|_: Request<()>| async {
        let frames = VecDeque::from([Frame::data(&b"a"[..]), Frame::data(&b"b"[..])]);
        Ok::<_, Infallible>(Response::new(Frames::<true>(frames)))
    }));
    let fut = svc.call(Request::new(()));
    // On the paused clock this sleep ends once every task is idle: the request has answered,
    // and its answer waits for a client that never takes it.
    sleep(ms(1)).await;
    drop(fut);
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
    assert_eq!(report.cause(), None, "{report}");
}

/// A body that always has another frame ready.
struct Endless;

impl http_body::Body for Endless {
    type Data = &'static [u8];
    type Error = Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<Frame<&'static [u8]>, Infallible>>> {
        Poll::Ready(Some(Ok(Frame::data(&b"more"[..]))))
    }
}

/// The real clock: a body that is always ready never leaves the runtime idle, so the paused
/// clock would never reach the bound.
#[tokio::test]
async fn an_endless_answer_is_read_only_until_the_bound() {
    let (layers, mut reports) = detaching(policy(), ms(50));
    let mut svc = layers.layer(Fn_(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Endless))
    }));
    let left = std::time::Instant::now();
    leave(svc.call(Request::new(()))).await;
    let (_, report) = tokio::time::timeout(Duration::from_secs(20), reports.recv())
        .await
        .expect("the body was read past the bound")
        .unwrap();
    assert!(left.elapsed() >= ms(50));
    // Cut at the bound as the server cuts a body nobody reads: the client is gone.
    assert_eq!(report.cause(), Some(&Cause::ClientGone), "{report}");
}
