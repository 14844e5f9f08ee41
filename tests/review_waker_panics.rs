//! Review of 42b0f54 (a waker that panics when woken no longer cuts short the step that wakes
//! it): wake sites the fix left out.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use cancel_scope::{ChildSpec, Scope};
use futures::FutureExt;

/// Panics when woken.
struct Panics;

impl Wake for Panics {
    fn wake(self: Arc<Self>) {
        panic!("this waker panics");
    }
}

/// Counts its wake-ups.
#[derive(Default)]
struct Counts(AtomicUsize);

impl Wake for Counts {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn panics() -> Waker {
    Waker::from(Arc::new(Panics))
}

/// Polls `fut` once with `waker`: it must be pending.
fn pending_with<F: Future>(fut: std::pin::Pin<&mut F>, waker: &Waker) {
    assert!(fut.poll(&mut Context::from_waker(waker)).is_pending());
}

/// The message of a caught panic.
fn message(panic: Box<dyn std::any::Any + Send>) -> String {
    match panic.downcast::<&str>() {
        Ok(s) => (*s).to_owned(),
        Err(p) => *p.downcast::<String>().unwrap(),
    }
}

/// A quarantine gives back the units of what it takes with `release_unit`, which (since
/// 42b0f54) resumes the panic of a `quiesce()`'s waker of a scope that the release makes
/// quiet. Inside the quarantine walk that panic cut the walk short: the sibling scopes not
/// walked yet kept their work (unquarantined), and the `quiesce()` that ran the quarantine
/// had already popped its grace end, so re-polled it waited for ever.
#[tokio::test(start_paused = true)]
async fn a_quiesce_waker_that_panics_when_a_quarantine_makes_a_child_quiet_does_not_stop_the_quarantine(
) {
    let root = Scope::new();
    // Two child scopes, each with a task that never ends (its waker listed), and each with
    // a waiting `quiesce()` whose waker panics. A grace period that never ends of their own:
    // only the root's grace end quarantines (and their `quiesce()`s set no timer).
    let a = root.child().grace(Duration::MAX).build().unwrap();
    let b = root.child().grace(Duration::MAX).build().unwrap();
    let count = Arc::new(Counts::default());
    let waker = Waker::from(count.clone());
    let mut task_a = Box::pin(a.__task(std::future::pending::<()>()).unwrap());
    pending_with(task_a.as_mut(), &waker);
    let mut task_b = Box::pin(b.__task(std::future::pending::<()>()).unwrap());
    pending_with(task_b.as_mut(), &waker);
    root.cancel();
    let mut quiesce_a = pin!(a.quiesce());
    pending_with(quiesce_a.as_mut(), &panics());
    let mut quiesce_b = pin!(b.quiesce());
    pending_with(quiesce_b.as_mut(), &panics());

    // At the root's grace end its quiesce quarantines both tasks; the first child made quiet
    // wakes its `quiesce()`, whose waker panics, out of the root's quiesce's poll.
    let mut of_root = Box::pin(root.quiesce());
    let quiesced = std::panic::AssertUnwindSafe(of_root.as_mut()).catch_unwind();
    assert_eq!(message(quiesced.await.unwrap_err()), "this waker panics");

    // The quarantine went on to its end: both children are quiet.
    assert!(a.lifecycle().is_final(), "a: {:?}", a.lifecycle());
    assert!(b.lifecycle().is_final(), "b: {:?}", b.lifecycle());
    // And the root's quiesce, polled again, resolves.
    let report = tokio::time::timeout(Duration::from_secs(3600), of_root)
        .await
        .expect("the root's quiesce resolves");
    assert_eq!(report.quarantined(), 2);
    drop((task_a, task_b));
}

/// As above, for children that are their parent's tickets themselves (the retry layer's
/// attempts, fan-out branches): their own tickets are quarantined by `end_own`, which gave
/// back the child's unit with `release_unit` and so unwound out of the walk too.
#[tokio::test(start_paused = true)]
async fn a_quiesce_waker_that_panics_when_a_quarantined_own_ticket_makes_its_scope_quiet_does_not_stop_the_quarantine(
) {
    let root = Scope::new();
    let (a, own_a) = root.__child_dispatched(&ChildSpec::read_only("a")).unwrap();
    let (b, own_b) = root.__child_dispatched(&ChildSpec::read_only("b")).unwrap();
    // Each child's `quiesce()` waits with a waker that panics (polled before the cancel: it
    // sets no timer of its own).
    let mut quiesce_a = pin!(a.quiesce());
    pending_with(quiesce_a.as_mut(), &panics());
    let mut quiesce_b = pin!(b.quiesce());
    pending_with(quiesce_b.as_mut(), &panics());
    // The cancel hands each busy child to its waiting `quiesce()`, and wakes it: that panic
    // comes out of the cancel, once it is done.
    let cancelled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| root.cancel()));
    assert_eq!(message(cancelled.unwrap_err()), "this waker panics");
    assert!(a.is_cancelled() && b.is_cancelled());

    // At the root's grace end its quiesce quarantines both own tickets; the first child made
    // quiet wakes its `quiesce()`, whose waker panics, out of the root's quiesce's poll.
    let mut of_root = Box::pin(root.quiesce());
    let quiesced = std::panic::AssertUnwindSafe(of_root.as_mut()).catch_unwind();
    assert_eq!(message(quiesced.await.unwrap_err()), "this waker panics");

    assert!(a.lifecycle().is_final(), "a: {:?}", a.lifecycle());
    assert!(b.lifecycle().is_final(), "b: {:?}", b.lifecycle());
    let report = tokio::time::timeout(Duration::from_secs(3600), of_root)
        .await
        .expect("the root's quiesce resolves");
    assert_eq!(report.quarantined(), 2);
    drop((own_a, own_b));
}

/// Runs the test `name` of this binary again in a child process with `REVIEW_CHILD` set,
/// and returns whether that process ended normally (a panic while unwinding aborts it).
fn in_child_process(name: &str) -> std::process::Output {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("REVIEW_CHILD", "1")
        .output()
        .unwrap()
}

/// A ticket dropped while its thread unwinds (the work that held it panicked, the most
/// ordinary way a ticket ends without a receipt) records its default receipt and gives back
/// its unit from `Drop`. If that makes the scope quiet and a `quiesce()`'s waker panics,
/// `release_unit` resumed that panic inside a destructor that runs during an unwind: the
/// process aborted ("panic in a destructor during cleanup"). Run in a child process, which
/// must end normally, with the scope quiet.
#[test]
fn a_ticket_dropped_while_unwinding_does_not_abort_when_a_quiesce_waker_panics() {
    const NAME: &str =
        "a_ticket_dropped_while_unwinding_does_not_abort_when_a_quiesce_waker_panics";
    if std::env::var_os("REVIEW_CHILD").is_none() {
        let out = in_child_process(NAME);
        assert!(
            out.status.success(),
            "the child process failed ({:?}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
        return;
    }
    let root = Scope::new();
    let ticket = root.register(ChildSpec::read_only("work")).unwrap();
    root.close();
    let mut waiting = pin!(root.quiesce());
    pending_with(waiting.as_mut(), &panics());

    // The work panics while it holds the ticket: the ticket is dropped during the unwind.
    let worked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _ticket = ticket;
        panic!("the work panics");
    }));
    // The work's panic comes out (the waker's, raised while unwinding, cannot).
    assert_eq!(message(worked.unwrap_err()), "the work panics");
    assert!(root.lifecycle().is_final(), "{:?}", root.lifecycle());
}

/// The cut of a tracked response body (`admit::BodyStop`, woken by the request scope's
/// cancel) gives the body's unit back and then wakes the server's task, so that the server
/// polls the body to end it. Giving the unit back may make the request's scope quiet; if a
/// `quiesce()` of it has a waker that panics, that panic (kept by the tree, resumed by
/// `release_unit`) came out of the unit's drop and skipped the server's wake-up: the server
/// was never told to end the body.
#[cfg(feature = "tower")]
mod body_cut {
    use std::convert::Infallible;
    use std::future::Future;
    use std::pin::{pin, Pin};
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    use cancel_scope::integrations::tower::AdmitLayer;
    use cancel_scope::wire::EndpointPolicy;
    use cancel_scope::Scope;
    use http::{Request, Response};
    use http_body::{Body, Frame};
    use tower_layer::Layer;
    use tower_service::Service;

    use super::{message, panics, pending_with, Counts};

    /// A handler's body that never sends anything (and has no wake-up of its own).
    struct Never;

    impl Body for Never {
        type Data = &'static [u8];
        type Error = Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<&'static [u8]>, Infallible>>> {
            Poll::Pending
        }
    }

    /// A service from an async closure.
    #[derive(Clone)]
    struct Fn_<F>(F);

    impl<F, R, Fut, T> Service<R> for Fn_<F>
    where
        F: FnMut(R) -> Fut,
        Fut: Future<Output = Result<T, Infallible>>,
    {
        type Response = T;
        type Error = Infallible;
        type Future = Fut;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, r: R) -> Fut {
            (self.0)(r)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_server_is_woken_at_the_cut_even_if_a_quiesce_waker_panics() {
        let layer = AdmitLayer::new(EndpointPolicy::new(
            Duration::from_secs(5),
            Duration::from_secs(1),
        ));
        let mut svc = layer.layer(Fn_(|req: Request<()>| {
            let scope = req.extensions().get::<Scope>().unwrap().clone();
            async move {
                let mut res = Response::new(Never);
                res.extensions_mut().insert(scope);
                Ok::<_, Infallible>(res)
            }
        }));
        let res = svc.call(Request::new(())).await.unwrap();
        let scope = res.extensions().get::<Scope>().unwrap().clone();
        let mut body = Box::pin(res.into_body());
        // The server polls the body, which waits: the server's waker is handed over.
        let server = Arc::new(Counts::default());
        let server_waker = Waker::from(server.clone());
        assert!(body
            .as_mut()
            .poll_frame(&mut Context::from_waker(&server_waker))
            .is_pending());
        // A `quiesce()` of the request's scope waits with a waker that panics.
        let mut waiting = pin!(scope.quiesce());
        pending_with(waiting.as_mut(), &panics());

        // The cancel cuts the body: its unit goes back, the scope is quiet, the waiter's
        // waker panics (out of the cancel, once it is done).
        let cancelled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scope.cancel()));
        assert_eq!(message(cancelled.unwrap_err()), "this waker panics");
        assert!(scope.lifecycle().is_final(), "{:?}", scope.lifecycle());
        // The server was told to poll the body again, and that poll ends it.
        assert_eq!(server.0.load(std::sync::atomic::Ordering::SeqCst), 1);
        let end = body
            .as_mut()
            .poll_frame(&mut Context::from_waker(&server_waker));
        assert!(matches!(end, Poll::Ready(Some(Err(_)))), "{end:?}");
    }
    /// A response future dropped before it answered (the client went away) cancels the
    /// request's scope with `ClientGone`, then closes it and sends its report once it is quiet
    /// (`Finish::done`). The cancel resumes a waker's (or `on_cancel` callback's) panic once
    /// its walk is done; that skipped `done`: the request was never reported.
    #[tokio::test(start_paused = true)]
    async fn a_request_whose_response_future_is_dropped_is_reported_even_if_a_cancel_waker_panics()
    {
        let (tx, mut reports) = tokio::sync::mpsc::unbounded_channel();
        let layer = AdmitLayer::new(EndpointPolicy::new(
            Duration::from_secs(5),
            Duration::from_secs(1),
        ))
        .on_report(move |_, r| {
            let _ = tx.send(r.clone());
        });
        let slot = Arc::new(std::sync::Mutex::new(None::<Scope>));
        let seen = slot.clone();
        let mut svc = layer.layer(Fn_(move |req: Request<()>| {
            *seen.lock().unwrap() = Some(req.extensions().get::<Scope>().unwrap().clone());
            async move {
                // A handler that never answers.
                std::future::pending::<()>().await;
                Ok::<_, Infallible>(Response::new(Never))
            }
        }));
        let mut answer = Box::pin(svc.call(Request::new(())));
        let noop = futures::task::noop_waker();
        assert!(answer
            .as_mut()
            .poll(&mut Context::from_waker(&noop))
            .is_pending());
        let scope = slot.lock().unwrap().clone().unwrap();
        // Something of the handler waits for the request's cancel with a waker that panics.
        let mut waiting = pin!(scope.cancelled());
        pending_with(waiting.as_mut(), &panics());

        // The client goes away: the server drops the response future.
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(answer)));
        assert_eq!(message(dropped.unwrap_err()), "this waker panics");
        assert_eq!(scope.cause(), Some(cancel_scope::Cause::ClientGone));
        let report = tokio::time::timeout(Duration::from_secs(3600), reports.recv())
            .await
            .expect("the request is reported")
            .unwrap();
        assert_eq!(report.cause(), Some(&cancel_scope::Cause::ClientGone));
    }
    /// A handler's body that sends one frame, then waits for ever; its drop notes whether
    /// the request's scope was quiet (reported) by then.
    struct OneFrame {
        scope: Scope,
        sent: bool,
        final_at_drop: Arc<std::sync::Mutex<Option<bool>>>,
    }

    impl Body for OneFrame {
        type Data = &'static [u8];
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<&'static [u8]>, Infallible>>> {
            if std::mem::replace(&mut self.sent, true) {
                Poll::Pending
            } else {
                Poll::Ready(Some(Ok(Frame::data(&b"x"[..]))))
            }
        }
    }

    impl Drop for OneFrame {
        fn drop(&mut self) {
            *self.final_at_drop.lock().unwrap() = Some(self.scope.lifecycle().is_final());
        }
    }

    /// A response body dropped while it is sent (the client went away) cancels the request's
    /// scope, then drops the handler's body, then gives its unit back (invariant 6: stopped
    /// before it is counted). A cancel that resumed a waker's panic unwound out of the drop
    /// before the handler's body went: the unwind gave the unit back (with the body's
    /// tracking) first, and the request was quiet, its report due, while the handler's body
    /// still existed.
    #[tokio::test(start_paused = true)]
    async fn a_dropped_body_goes_before_its_unit_even_if_a_cancel_waker_panics() {
        let layer = AdmitLayer::new(EndpointPolicy::new(
            Duration::from_secs(5),
            Duration::from_secs(1),
        ));
        let final_at_drop = Arc::new(std::sync::Mutex::new(None));
        let seen = final_at_drop.clone();
        let mut svc = layer.layer(Fn_(move |req: Request<()>| {
            let scope = req.extensions().get::<Scope>().unwrap().clone();
            let final_at_drop = seen.clone();
            async move {
                let body = OneFrame {
                    scope: scope.clone(),
                    sent: false,
                    final_at_drop,
                };
                let mut res = Response::new(body);
                res.extensions_mut().insert(scope);
                Ok::<_, Infallible>(res)
            }
        }));
        let res = svc.call(Request::new(())).await.unwrap();
        let scope = res.extensions().get::<Scope>().unwrap().clone();
        let mut body = Box::pin(res.into_body());
        let noop = futures::task::noop_waker();
        let mut cx = Context::from_waker(&noop);
        assert!(matches!(
            body.as_mut().poll_frame(&mut cx),
            Poll::Ready(Some(Ok(_)))
        ));
        assert!(body.as_mut().poll_frame(&mut cx).is_pending());
        let mut waiting = pin!(scope.cancelled());
        pending_with(waiting.as_mut(), &panics());

        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(body)));
        assert_eq!(message(dropped.unwrap_err()), "this waker panics");
        assert_eq!(*final_at_drop.lock().unwrap(), Some(false));
        assert!(scope.lifecycle().is_final(), "{:?}", scope.lifecycle());
    }
}

/// A hedged call dropped while its attempts run cancels the scope of each (`InFlight`'s drop:
/// "no orphan attempt"). A cancel resumes the first panic of its wakers and `on_cancel`
/// callbacks once its own walk is done; the drop's loop let it through at the first attempt,
/// and the attempts after it were never cancelled: they ran on, orphaned.
#[tokio::test(start_paused = true)]
async fn dropping_a_hedged_call_cancels_every_attempt_even_if_a_cancel_panics() {
    use cancel_scope::retry::{Decision, HedgeDelay, Retry};

    let request = Scope::new();
    let hedge = Retry::new(|_: &()| Decision::Backoff)
        .max_attempts(3)
        .hedge(HedgeDelay::Fixed(Duration::from_millis(50)));
    let scopes = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = scopes.clone();
    let call = hedge.run(&request, ChildSpec::read_only("search"), move |a| {
        let scope = a.scope().clone();
        seen.lock().unwrap().push(scope.clone());
        async move {
            // The first attempt's scope has a callback that panics at its cancel.
            let _callback =
                (a.number() == 1).then(|| scope.on_cancel(|_| panic!("the callback panics")));
            tokio::time::sleep(Duration::from_secs(10)).await;
            Ok::<u32, ()>(a.number())
        }
    });
    let mut call = Box::pin(call);
    // Three attempts start (at 0, 50 and 100 ms), none ends.
    assert!(
        tokio::time::timeout(Duration::from_millis(120), call.as_mut())
            .await
            .is_err()
    );
    assert_eq!(scopes.lock().unwrap().len(), 3);

    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(call)));
    assert_eq!(message(dropped.unwrap_err()), "the callback panics");
    for (i, s) in scopes.lock().unwrap().iter().enumerate() {
        assert!(s.is_cancelled(), "attempt {} was not cancelled", i + 1);
    }
}
