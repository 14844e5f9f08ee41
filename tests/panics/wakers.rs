//! A waker that panics when it is woken (a user's own `Wake` implementation with a bug) does
//! not cut short the step of the tree that wakes it: the cancel walk still reaches every scope
//! below and wakes every other waiter (invariant 1), a scope that becomes quiet still gives
//! its unit back to its parent and wakes its other `quiesce()`s, and a quarantine still
//! records and releases every child it took (invariant 6), and the layers above that cancel
//! several scopes in a row (a hedge's attempts, an admitted request's end) finish their work.
//! The panic comes out of the call that ran the step, once the step is done (or is dropped, if
//! the thread is unwinding already).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use cancel_scope::{ChildSpec, Scope};
use futures::FutureExt;

use crate::support::panics::{message, panic_of, panics, pending_with};
use crate::support::wakers::Counts;

#[test]
fn a_waker_that_panics_at_the_cancel_does_not_stop_the_walk_below() {
    let root = Scope::new();
    let child = root.child().build().unwrap();
    let grandchild = child.child().build().unwrap();

    // The root's first waiter panics; a second waiter of the root and one of the grandchild
    // count.
    let mut first = pin!(root.cancelled());
    pending_with(first.as_mut(), &panics());
    let second_count = Arc::new(Counts::default());
    let mut second = pin!(root.cancelled());
    pending_with(second.as_mut(), &Waker::from(second_count.clone()));
    let below_count = Arc::new(Counts::default());
    let mut below = pin!(grandchild.cancelled());
    pending_with(below.as_mut(), &Waker::from(below_count.clone()));

    assert_eq!(panic_of(|| root.cancel()), "this waker panics");

    // The whole subtree is cancelled, and nothing new starts in it.
    assert!(child.is_cancelled() && grandchild.is_cancelled());
    assert!(grandchild
        .register(ChildSpec::read_only("late"))
        .unwrap_err()
        .is_cancelled());
    // The other waiters were woken.
    assert_eq!(second_count.woken(), 1);
    assert_eq!(below_count.woken(), 1);
    assert!(second.now_or_never().is_some());
    assert!(below.now_or_never().is_some());
}

#[test]
fn a_waker_that_panics_in_a_task_list_does_not_stop_the_walk() {
    let root = Scope::new();
    let child = root.child().build().unwrap();
    // Two tasks of the root waiting (listed with their wakers): the first one's waker panics.
    let mut first = pin!(root.__task(std::future::pending::<()>()).unwrap());
    pending_with(first.as_mut(), &panics());
    let count = Arc::new(Counts::default());
    let mut second = pin!(root.__task(std::future::pending::<()>()).unwrap());
    pending_with(second.as_mut(), &Waker::from(count.clone()));

    assert_eq!(panic_of(|| root.cancel()), "this waker panics");

    assert!(child.is_cancelled());
    assert_eq!(count.woken(), 1);
    // Woken, the second task stops with its receipt.
    let waker = Waker::from(count.clone());
    let Poll::Ready(out) = second.as_mut().poll(&mut Context::from_waker(&waker)) else {
        panic!("a cancelled task stops when polled");
    };
    assert!(out.unwrap_err().is_cancelled());
}

#[test]
fn a_waker_that_panics_when_its_scope_goes_quiet_leaves_the_release_whole() {
    let root = Scope::new();
    let child = root.child().build().unwrap();
    let guard = child.tether(()).unwrap();
    root.close();

    // Two `quiesce()`s of the child, the first with a waker that panics, and one of the root.
    let mut first = pin!(child.quiesce());
    pending_with(first.as_mut(), &panics());
    let child_count = Arc::new(Counts::default());
    let mut second = pin!(child.quiesce());
    pending_with(second.as_mut(), &Waker::from(child_count.clone()));
    let root_count = Arc::new(Counts::default());
    let mut of_root = pin!(root.quiesce());
    pending_with(of_root.as_mut(), &Waker::from(root_count.clone()));

    // The guard's release makes the child quiet, which wakes its waiters.
    assert_eq!(panic_of(|| drop(guard)), "this waker panics");

    // The other waiter of the child was woken, and the child's unit in the root went back:
    // the root is quiet too, and its waiter was woken.
    assert_eq!(child_count.woken(), 1);
    assert_eq!(root_count.woken(), 1);
    assert!(second.now_or_never().is_some());
    assert!(of_root.now_or_never().is_some());
}

#[test]
fn a_waker_that_panics_at_close_does_not_stop_the_close_below() {
    let root = Scope::new();
    let idle = root.child().build().unwrap();
    let grandchild = idle.child().build().unwrap();
    // A quiesce of the idle child waits for the close; its waker panics when the close makes
    // the child quiet.
    let mut waiting = pin!(idle.quiesce());
    pending_with(waiting.as_mut(), &panics());

    assert_eq!(panic_of(|| root.close()), "this waker panics");

    // The close reached the whole subtree (invariant 3): the grandchild, idle, is quiet.
    assert!(grandchild.quiesce().now_or_never().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_waker_that_panics_in_a_quarantine_does_not_stop_it() {
    let root = Scope::new();
    // Two tasks that never end, waiting with their wakers listed: the first one's panics.
    let mut first = Box::pin(root.__task(std::future::pending::<()>()).unwrap());
    pending_with(first.as_mut(), &panics());
    let count = Arc::new(Counts::default());
    let mut second = Box::pin(root.__task(std::future::pending::<()>()).unwrap());
    pending_with(second.as_mut(), &Waker::from(count.clone()));
    assert_eq!(panic_of(|| root.cancel()), "this waker panics");
    assert_eq!(count.woken(), 1);

    // Neither task is polled again: at the end of the grace period the quarantine takes them
    // both, and wakes them (the first waker panics, out of the quiesce's poll).
    let quiesced = std::panic::AssertUnwindSafe(root.quiesce()).catch_unwind();
    assert_eq!(message(quiesced.await.unwrap_err()), "this waker panics");
    assert_eq!(count.woken(), 2);

    // The quarantine is whole: both tasks have their receipt and gave their unit back.
    let report = tokio::time::timeout(Duration::from_secs(3600), root.quiesce())
        .await
        .expect("the quarantine released both tasks");
    assert_eq!(report.quarantined(), 2);
    drop((first, second));
}

/// A quarantine gives back the units of what it takes, which may make a scope quiet and wake
/// that scope's `quiesce()`s. A waker among those that panics does not stop the quarantine:
/// the sibling scopes not walked yet are quarantined too, the panic comes out of the
/// `quiesce()` that ran the quarantine, and that `quiesce()`, polled again, resolves.
#[tokio::test(start_paused = true)]
async fn a_quiesce_waker_that_panics_when_a_quarantine_makes_a_child_quiet_does_not_stop_the_quarantine(
) {
    let root = Scope::new();
    // Two child scopes, each with a task that never ends (its waker listed), and each with
    // a waiting `quiesce()` whose waker panics. A grace period that never ends of their own:
    // only the root's grace end quarantines (and their `quiesce()`s, polled before the cancel
    // and not again, set no timer for it).
    let a = root.child().grace(Duration::MAX).build().unwrap();
    let b = root.child().grace(Duration::MAX).build().unwrap();
    let count = Arc::new(Counts::default());
    let waker = Waker::from(count.clone());
    let mut task_a = Box::pin(a.__task(std::future::pending::<()>()).unwrap());
    pending_with(task_a.as_mut(), &waker);
    let mut task_b = Box::pin(b.__task(std::future::pending::<()>()).unwrap());
    pending_with(task_b.as_mut(), &waker);
    let mut quiesce_a = pin!(a.quiesce());
    pending_with(quiesce_a.as_mut(), &panics());
    let mut quiesce_b = pin!(b.quiesce());
    pending_with(quiesce_b.as_mut(), &panics());
    // The cancel hands each busy child to its waiting `quiesce()`, and wakes it: that panic
    // comes out of the cancel, once it is done.
    assert_eq!(panic_of(|| root.cancel()), "this waker panics");
    assert!(a.is_cancelled() && b.is_cancelled());

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
/// attempts, fan-out branches), whose own tickets the quarantine ends.
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

/// Runs the test `name` of this module again in a child process with `WAKER_PANICS_CHILD`
/// set, and returns its output (a panic while unwinding would abort that process).
fn in_child_process(name: &str) -> std::process::Output {
    // The test's path in the binary: this module's path without the binary's name.
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &format!("{module}::{name}"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env("WAKER_PANICS_CHILD", "1")
        .output()
        .unwrap()
}

/// A ticket dropped while its thread unwinds (the work that held it panicked, the most
/// ordinary way a ticket ends without a receipt) records its default receipt and gives back
/// its unit from `Drop`. If that makes the scope quiet and a `quiesce()`'s waker panics, that
/// second panic is dropped (it would abort the process, unwinding out of a destructor during
/// an unwind), and the first goes on. Run in a child process, which must end normally, with
/// the scope quiet.
#[test]
fn a_ticket_dropped_while_unwinding_does_not_abort_when_a_quiesce_waker_panics() {
    const NAME: &str =
        "a_ticket_dropped_while_unwinding_does_not_abort_when_a_quiesce_waker_panics";
    if std::env::var_os("WAKER_PANICS_CHILD").is_none() {
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
/// `quiesce()` of it has a waker that panics, the server's task is still woken (and the
/// panic comes out of the cut after).
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

    use crate::support::panics::{message, panics, pending_with};
    use crate::support::tower::Fn_;
    use crate::support::wakers::Counts;

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

    #[tokio::test(start_paused = true)]
    async fn the_server_is_woken_at_the_cut_even_if_a_quiesce_waker_panics() {
        let layer = AdmitLayer::new(
            EndpointPolicy::builder(Duration::from_secs(5))
                .default_budget(Duration::from_secs(1))
                .build(),
        );
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
        assert_eq!(server.woken(), 1);
        let end = body
            .as_mut()
            .poll_frame(&mut Context::from_waker(&server_waker));
        assert!(matches!(end, Poll::Ready(Some(Err(_)))), "{end:?}");
    }
    /// A response future dropped before it answered (the client went away) cancels the
    /// request's scope with `ClientGone`, then closes it and sends its report once it is quiet
    /// (`Finish::done`). A waker (or `on_cancel` callback) of the request's that panics at
    /// the cancel does not keep the request from being closed and reported.
    #[tokio::test(start_paused = true)]
    async fn a_request_whose_response_future_is_dropped_is_reported_even_if_a_cancel_waker_panics()
    {
        let (tx, mut reports) = tokio::sync::mpsc::unbounded_channel();
        let layer = AdmitLayer::new(
            EndpointPolicy::builder(Duration::from_secs(5))
                .default_budget(Duration::from_secs(1))
                .build(),
        )
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
    /// before it is counted), in that order also when a waker of the request's panics at the
    /// cancel: the request is not quiet, its report not due, while the handler's body
    /// exists.
    #[tokio::test(start_paused = true)]
    async fn a_dropped_body_goes_before_its_unit_even_if_a_cancel_waker_panics() {
        let layer = AdmitLayer::new(
            EndpointPolicy::builder(Duration::from_secs(5))
                .default_budget(Duration::from_secs(1))
                .build(),
        );
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
/// "no orphan attempt"), also when one of those cancels panics (a waker or `on_cancel`
/// callback of the attempt's): the attempts after it are cancelled too.
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
