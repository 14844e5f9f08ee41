//! User code that panics (a waker, an `on_cancel` callback, a retry's operation or
//! classifier, a fan-out branch's constructor, a handler's body) does not leave the library
//! in a broken state: every admitted request is reported, every registered child gets its one
//! receipt (a winner stays `Succeeded`), no attempt or branch is left running, every unit goes
//! back. The panic comes out after that.

#[cfg(feature = "tower")]
use std::pin::pin;

use crate::support;
use crate::support::panics::{message, panics, pending_with};

#[cfg(feature = "tower")]
mod admit {
    use std::convert::Infallible;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use cancel_scope::integrations::tower::AdmitLayer;
    use cancel_scope::wire::EndpointPolicy;
    use cancel_scope::Scope;
    use http::{Request, Response};
    use http_body::{Body, Frame};
    use tower_layer::Layer;
    use tower_service::Service;

    use super::support::tower::Fn_;
    use super::{message, panics, pending_with, pin};

    /// A body with nothing to send (the admission layer does not track it).
    struct Empty;

    impl Body for Empty {
        type Data = &'static [u8];
        type Error = Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<&'static [u8]>, Infallible>>> {
            Poll::Ready(None)
        }

        fn is_end_stream(&self) -> bool {
            true
        }
    }

    /// A handler's body whose `size_hint` panics (the layer reads it to decide how to track
    /// the body).
    struct BadHint;

    impl Body for BadHint {
        type Data = &'static [u8];
        type Error = Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<&'static [u8]>, Infallible>>> {
            Poll::Ready(None)
        }

        fn size_hint(&self) -> http_body::SizeHint {
            panic!("this size hint panics")
        }
    }

    /// A panic of the handler's own code (here its body's `size_hint`, read by the layer as
    /// the response comes out) is the handler's: the request's scope is cancelled with "the
    /// handler panicked", as for a panic in the handler's future, not with `ClientGone` (the
    /// client is still there; the report would blame it).
    #[tokio::test(start_paused = true)]
    async fn a_panic_of_the_handlers_body_as_the_response_comes_out_is_not_blamed_on_the_client() {
        let layer = AdmitLayer::new(
            EndpointPolicy::builder(Duration::from_secs(5))
                .default_budget(Duration::from_secs(1))
                .build(),
        );
        let slot = Arc::new(std::sync::Mutex::new(None::<Scope>));
        let seen = slot.clone();
        let mut svc = layer.layer(Fn_(move |req: Request<()>| {
            *seen.lock().unwrap() = Some(req.extensions().get::<Scope>().unwrap().clone());
            async move { Ok::<_, Infallible>(Response::new(BadHint)) }
        }));
        let mut answer = Box::pin(svc.call(Request::new(())));
        let noop = futures::task::noop_waker();
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            answer.as_mut().poll(&mut Context::from_waker(&noop))
        }));
        assert_eq!(message(polled.unwrap_err()), "this size hint panics");
        // The server drops the future that panicked.
        drop(answer);
        let scope = slot.lock().unwrap().clone().unwrap();
        let cause = scope.cause().expect("the request's scope is cancelled");
        assert_ne!(cause, cancel_scope::Cause::ClientGone);
        assert!(
            cause.to_string().contains("the handler panicked"),
            "{cause}"
        );
    }

    /// A request that answers is closed, then reported once quiet (`Finish::done`). Closing
    /// a scope with no work left makes it quiet at once and wakes its `quiesce()`s; one whose
    /// waker panics must not keep the request from being reported.
    #[tokio::test(start_paused = true)]
    async fn a_request_that_answers_is_reported_even_if_a_quiesce_waker_panics_at_its_close() {
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
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let mut wait = Some(wait);
        let mut svc = layer.layer(Fn_(move |req: Request<()>| {
            *seen.lock().unwrap() = Some(req.extensions().get::<Scope>().unwrap().clone());
            let wait = wait.take().unwrap();
            async move {
                let _ = wait.await;
                Ok::<_, Infallible>(Response::new(Empty))
            }
        }));
        let mut answer = Box::pin(svc.call(Request::new(())));
        let noop = futures::task::noop_waker();
        assert!(answer
            .as_mut()
            .poll(&mut Context::from_waker(&noop))
            .is_pending());
        let scope = slot.lock().unwrap().clone().unwrap();
        // Something waits for the request to be quiet, with a waker that panics.
        let mut waiting = pin!(scope.quiesce());
        pending_with(waiting.as_mut(), &panics());

        // The handler answers; the layer closes the request's scope, which is quiet then.
        go.send(()).unwrap();
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            answer.as_mut().poll(&mut Context::from_waker(&noop))
        }));
        // The waker's panic comes out of the poll that answered (the library's rule).
        assert_eq!(message(polled.unwrap_err()), "this waker panics");
        assert!(scope.is_closed());
        assert!(scope.lifecycle().is_final(), "{:?}", scope.lifecycle());
        let report = tokio::time::timeout(Duration::from_secs(3600), reports.recv())
            .await
            .expect("the request is reported")
            .expect("the report callback is kept");
        assert_eq!(report.cause(), None);
    }
}

mod retry {
    use std::cell::RefCell;
    use std::pin::Pin;
    use std::rc::Rc;
    use std::time::Duration;

    use cancel_scope::retry::{Decision, Retry};
    use cancel_scope::{ChildSpec, Quiesce, Scope};
    use futures::FutureExt;

    use super::support::panics::report_of;
    use super::{message, panics, pending_with};

    /// An idempotent attempt whose effect is unknown is parked (its receipt waits for the
    /// call's end: `Cancelled` if a later attempt succeeds). At the call's end the parked
    /// attempt's receipt is given first, then the winner's `Succeeded`. Giving the parked one
    /// its receipt makes its scope quiet and wakes a `quiesce()` of it; if that waker panics,
    /// the winner must still be recorded `Succeeded` (not dropped into `EffectUnknown`, which
    /// would report a pending effect for a call that succeeded).
    #[tokio::test(start_paused = true)]
    async fn a_retry_winner_is_recorded_succeeded_even_if_a_quiesce_waker_panics_at_a_parked_receipt(
    ) {
        let scope = Scope::new();
        let watch: Rc<RefCell<Vec<Pin<Box<Quiesce>>>>> = Rc::default();
        let retry = Retry::new(|_: &&str| Decision::EffectUnknown)
            .max_attempts(2)
            .backoff(std::iter::repeat(Duration::ZERO));
        let w = watch.clone();
        let out = std::panic::AssertUnwindSafe(retry.run(
            &scope,
            ChildSpec::idempotent("pay", "key-1"),
            move |attempt| {
                let w = w.clone();
                async move {
                    if attempt.number() == 1 {
                        // The attempt takes no new work, and something waits for its scope
                        // to be quiet, with a waker that panics.
                        attempt.scope().close();
                        let mut q = Box::pin(attempt.scope().quiesce());
                        pending_with(q.as_mut(), &panics());
                        w.borrow_mut().push(q);
                        Err("lost")
                    } else {
                        Ok(7)
                    }
                }
            },
        ))
        .catch_unwind()
        .await;
        // The waker's panic comes out of the call (the library's rule).
        assert_eq!(message(out.unwrap_err()), "this waker panics");
        drop(watch);
        let report = report_of(&scope).await;
        assert_eq!(report.succeeded(), 1, "{report}");
        assert_eq!(report.cancelled(), 1, "{report}");
        assert!(report.pending_effects().is_empty(), "{report}");
    }

    /// A hedged call that has a winner cancels the other attempts and collects them: one that
    /// failed meanwhile gets `Failed`, one that the cancel stopped is parked (idempotent: its
    /// effect is settled by the winner) and gets `Cancelled` at the call's end. Giving the
    /// failed one its receipt makes its scope quiet and wakes a `quiesce()` of it; if that
    /// waker panics, the other attempts must still be collected and given their receipts (not
    /// dropped into `EffectUnknown`, which would report a pending effect for a call that
    /// succeeded).
    #[tokio::test(start_paused = true)]
    async fn a_hedge_collects_every_loser_even_if_a_quiesce_waker_panics_at_a_losers_receipt() {
        use cancel_scope::retry::HedgeDelay;
        use std::sync::{Arc, Mutex};

        let scope = Scope::new();
        let t0 = tokio::time::Instant::now();
        let watch: Arc<Mutex<Vec<Pin<Box<Quiesce>>>>> = Arc::default();
        let hedge = Retry::new(|_: &&str| Decision::Backoff)
            .max_attempts(3)
            .hedge(HedgeDelay::Fixed(Duration::from_millis(10)));
        let w = watch.clone();
        let out = std::panic::AssertUnwindSafe(hedge.run(
            &scope,
            ChildSpec::idempotent("pay", "key-2"),
            move |attempt| {
                let w = w.clone();
                async move {
                    let end = t0 + Duration::from_millis(25);
                    match attempt.number() {
                        // The winner, at 25 ms.
                        1 => {
                            tokio::time::sleep_until(end).await;
                            Ok(1)
                        }
                        // Fails at the same instant, after closing its scope; something waits
                        // for that scope to be quiet with a waker that panics.
                        2 => {
                            tokio::time::sleep_until(end).await;
                            attempt.scope().close();
                            let mut q = Box::pin(attempt.scope().quiesce());
                            pending_with(q.as_mut(), &panics());
                            w.lock().unwrap().push(q);
                            Err("boom")
                        }
                        // Runs until the cancel stops it.
                        _ => std::future::pending().await,
                    }
                }
            },
        ))
        .catch_unwind()
        .await;
        assert_eq!(message(out.unwrap_err()), "this waker panics");
        drop(watch);
        let report = report_of(&scope).await;
        assert_eq!(report.succeeded(), 1, "{report}");
        assert_eq!(report.failed(), 1, "{report}");
        assert_eq!(report.cancelled(), 1, "{report}");
        assert!(report.pending_effects().is_empty(), "{report}");
    }
}

mod fanout {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use cancel_scope::fanout::FanOut;
    use cancel_scope::{Cause, Scope};
    use futures::FutureExt;

    use super::message;
    use super::support::panics::{report_of, SetOnDrop};

    /// `join` returns only after every branch ended (module docs: "No orphans"). When a
    /// required branch fails, the siblings are cancelled and awaited; an `on_cancel` callback
    /// of a sibling that panics must not let `join` return (by that panic) with the sibling
    /// still running and without its receipt.
    #[tokio::test(start_paused = true)]
    async fn a_fan_out_waits_for_every_branch_even_if_cancelling_the_siblings_panics() {
        let scope = Scope::new();
        let stopped = Arc::new(AtomicBool::new(false));
        let mut fan = FanOut::new(&scope);
        let _a = fan.required("fails", |_: Scope| async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Err::<(), _>("boom")
        });
        let st = stopped.clone();
        let _b = fan.required("slow", move |s: Scope| async move {
            let _cb = s.on_cancel(|_: &Cause| panic!("this callback panics"));
            let _flag = SetOnDrop(st);
            std::future::pending::<Result<(), &str>>().await
        });
        let out = std::panic::AssertUnwindSafe(fan.join())
            .catch_unwind()
            .await;
        assert_eq!(message(out.unwrap_err()), "this callback panics");
        // Checked before anything else runs: `join` itself waited for the sibling.
        assert!(
            stopped.load(Ordering::SeqCst),
            "join ended while a branch was still running"
        );
        let report = report_of(&scope).await;
        assert_eq!(report.failed(), 1, "{report}");
        assert_eq!(report.cancelled(), 1, "{report}");
    }
}

mod fanout_start {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use cancel_scope::fanout::FanOut;
    use cancel_scope::Scope;
    use futures::FutureExt;

    use super::message;
    use super::support::panics::{report_of, SetOnDrop};

    /// A branch's constructor (the closure given to `required`) that panics, after a sibling
    /// started: `join` must not end (by that panic) with the sibling still running; the
    /// sibling is cancelled and awaited, each branch has one receipt, then the panic goes on.
    #[tokio::test(start_paused = true)]
    async fn a_fan_out_whose_branch_constructor_panics_leaves_no_branch_running() {
        let scope = Scope::new();
        let stopped = Arc::new(AtomicBool::new(false));
        let mut fan = FanOut::new(&scope);
        let st = stopped.clone();
        let _a = fan.required("slow", move |_: Scope| {
            // Dropped with the branch's future (whether or not it was ever polled).
            let flag = SetOnDrop(st);
            async move {
                let _flag = flag;
                std::future::pending::<Result<(), &str>>().await
            }
        });
        let _b = fan.required("bad", |_: Scope| -> std::future::Ready<Result<(), &str>> {
            panic!("this constructor panics")
        });
        let out = std::panic::AssertUnwindSafe(fan.join())
            .catch_unwind()
            .await;
        assert_eq!(message(out.unwrap_err()), "this constructor panics");
        assert!(
            stopped.load(Ordering::SeqCst),
            "join ended while a branch was still running"
        );
        let report = report_of(&scope).await;
        assert_eq!(report.failed(), 1, "{report}");
        assert_eq!(report.cancelled(), 1, "{report}");
    }
}

mod hedge_op {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use cancel_scope::retry::{Decision, HedgeDelay, Retry};
    use cancel_scope::{ChildSpec, Scope};
    use futures::FutureExt;

    use super::message;
    use super::support::panics::{report_of, SetOnDrop};

    /// A hedged call returns only once every attempt has its receipt (no orphan attempt). If
    /// `op` panics when asked for the hedge, the first attempt, still running, must be
    /// cancelled and awaited before the panic comes out of the call.
    #[tokio::test(start_paused = true)]
    async fn a_hedge_whose_op_panics_leaves_no_attempt_running() {
        let scope = Scope::new();
        let stopped = Arc::new(AtomicBool::new(false));
        let hedge = Retry::new(|_: &&str| Decision::Backoff)
            .max_attempts(2)
            .hedge(HedgeDelay::Fixed(Duration::from_millis(10)));
        let st = stopped.clone();
        let out = std::panic::AssertUnwindSafe(hedge.run(
            &scope,
            ChildSpec::read_only("get"),
            move |attempt| {
                if attempt.number() == 2 {
                    panic!("this op panics");
                }
                let flag = SetOnDrop(st.clone());
                async move {
                    let _flag = flag;
                    std::future::pending::<Result<(), &str>>().await
                }
            },
        ))
        .catch_unwind()
        .await;
        assert_eq!(message(out.unwrap_err()), "this op panics");
        assert!(
            stopped.load(Ordering::SeqCst),
            "the call ended while an attempt was still running"
        );
        let report = report_of(&scope).await;
        assert_eq!(report.total(), 2, "{report}");
    }

    /// The same when the classifier panics on a failed attempt while another runs.
    #[tokio::test(start_paused = true)]
    async fn a_hedge_whose_classifier_panics_leaves_no_attempt_running() {
        let scope = Scope::new();
        let stopped = Arc::new(AtomicBool::new(false));
        let hedge = Retry::new(|_: &&str| -> Decision { panic!("this classifier panics") })
            .max_attempts(2)
            .hedge(HedgeDelay::Fixed(Duration::from_millis(10)));
        let st = stopped.clone();
        let out = std::panic::AssertUnwindSafe(hedge.run(
            &scope,
            ChildSpec::read_only("get"),
            move |attempt| {
                // Only the first attempt's: the second ends at once.
                let flag = (attempt.number() == 1).then(|| SetOnDrop(st.clone()));
                async move {
                    let _flag = flag;
                    if attempt.number() == 2 {
                        return Err("boom");
                    }
                    std::future::pending::<Result<(), &str>>().await
                }
            },
        ))
        .catch_unwind()
        .await;
        assert_eq!(message(out.unwrap_err()), "this classifier panics");
        assert!(
            stopped.load(Ordering::SeqCst),
            "the call ended while an attempt was still running"
        );
    }
}
