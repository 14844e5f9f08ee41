//! loom models of an own ticket's run (`OwnTicket::run`, the way a retry attempt, a hedge or a
//! fan-out branch runs its work on the ticket of its own child scope): the run's cancel waiter
//! racing the cancel of the scope above (DESIGN.md invariant 1: the cancel reaches it, no lost
//! wake-up), its work stopped before the ticket comes back or its receipt is recorded
//! (invariant 6), and a run given up by its caller leaving nothing of the caller behind.
#![cfg(loom)]

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::AtomicUsize;
use std::task::{Context, Poll, Wake, Waker};

use cancel_scope::{Cause, ChildSpec, Lifecycle, Receipt, Scope};
use cancel_scope_loom_tests::model;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

/// Work that never ends on its own and keeps no waker (the run's cancel waiter is the only
/// way out); it notes when it is dropped, and checks then that the scope above has not been
/// seen quiet yet (its ticket's receipt must come after it).
struct Stuck {
    dropped: Arc<AtomicBool>,
    request: Scope,
}

impl Stuck {
    fn new(request: &Scope) -> (Self, Arc<AtomicBool>) {
        let dropped = Arc::new(AtomicBool::new(false));
        let work = Stuck {
            dropped: dropped.clone(),
            request: request.clone(),
        };
        (work, dropped)
    }
}

impl Future for Stuck {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        Poll::Pending
    }
}

impl Drop for Stuck {
    fn drop(&mut self) {
        assert!(
            !self.request.lifecycle().is_final(),
            "the work was dropped after its scope's receipt made the request quiet"
        );
        self.dropped.store(true, Ordering::Release);
    }
}

/// A waker that counts its wakes, and whose clones can be counted (`std`'s `Arc`, which
/// `Waker::from` needs: loom runs every model thread on one OS thread, so plain atomics read
/// the current value).
#[derive(Default)]
struct Counted {
    wakes: AtomicUsize,
}

impl Wake for Counted {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.wakes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Model 36: the run of an attempt's own ticket, whose work waits for ever, on one thread
/// while the request is cancelled on another.
///
/// Invariant 1: the request's cancel walk reaches the attempt's scope and wakes the run's
/// cancel waiter, whether the run registered it before the walk or after (then it reads the
/// cancel mark under the node's lock): `block_on` returns in every interleaving (loom reports
/// a deadlock otherwise) with the request's cause. Invariant 6: the work was dropped before
/// the ticket came back. The request ends `CancelledStable` with the attempt's one receipt.
#[test]
fn own_run_racing_request_cancel() {
    model("own_run_racing_request_cancel", || {
        let request = Scope::new();
        let (attempt, own) = request
            .__child_dispatched(&ChildSpec::read_only("inventory"))
            .unwrap();
        let runner = {
            let request = request.clone();
            thread::spawn(move || {
                let (work, dropped) = Stuck::new(&request);
                // Polled in place, not moved into `block_on`: the run itself is still alive
                // when its output is checked.
                let mut run = pin!(own.run(work));
                let (out, own) = loom::future::block_on(poll_fn(|cx| run.as_mut().poll(cx)));
                assert!(
                    dropped.load(Ordering::Acquire),
                    "the ticket came back before its work was dropped"
                );
                own.finish(Receipt::Cancelled);
                out.unwrap_err()
            })
        };
        request.cancel_with("client gone");
        let err = runner.join().unwrap();
        assert!(err.is_cancelled());
        assert_eq!(
            err.cause().map(Cause::origin),
            Some(&Cause::cancelled("client gone"))
        );
        assert!(attempt.is_cancelled());
        drop(attempt);
        let report = loom::future::block_on(request.quiesce());
        assert_eq!(report.state(), Lifecycle::CancelledStable);
        assert_eq!((report.total(), report.cancelled()), (1, 1));
    });
}

/// Model 37: the run is polled once (its waker registered, or the cancel already seen) and
/// then given up by its caller — a losing hedge, a call future dropped — on one thread, while
/// the request is cancelled on another. The attempt's scope outlives the run (the operation
/// kept a clone of it).
///
/// Invariant 6: dropping the run drops its work and records the ticket's default receipt
/// (read-only: `Cancelled`), once, whether or not the cancel came first. And the scope that
/// outlives the run keeps no clone of the caller's waker, whichever side took it out of the
/// waiter slot: a cancel later than the drop must not wake (or keep alive) a caller that has
/// moved on.
#[test]
fn own_run_dropped_racing_request_cancel() {
    model("own_run_dropped_racing_request_cancel", || {
        let request = Scope::new();
        let (attempt, own) = request
            .__child_dispatched(&ChildSpec::read_only("inventory"))
            .unwrap();
        let counted = std::sync::Arc::new(Counted::default());
        let gone = Arc::new(AtomicBool::new(false));
        let quitter = {
            let (request, counted, gone) = (request.clone(), counted.clone(), gone.clone());
            thread::spawn(move || {
                let (work, dropped) = Stuck::new(&request);
                {
                    let mut run = pin!(own.run(work));
                    let waker = Waker::from(counted);
                    let mut cx = Context::from_waker(&waker);
                    if let Poll::Ready((out, own)) = run.as_mut().poll(&mut cx) {
                        // The cancel came first: the run saw it at once.
                        assert!(out.unwrap_err().is_cancelled());
                        own.finish(Receipt::Cancelled);
                    }
                }
                assert!(
                    dropped.load(Ordering::Acquire),
                    "the run went without dropping its work"
                );
                gone.store(true, Ordering::Release);
            })
        };
        let after_the_run = gone.load(Ordering::Acquire);
        if after_the_run {
            assert_eq!(
                std::sync::Arc::strong_count(&counted),
                1,
                "the attempt's scope kept a clone of the caller's waker"
            );
        }
        request.cancel();
        if after_the_run {
            assert_eq!(
                counted.wakes.load(std::sync::atomic::Ordering::Relaxed),
                0,
                "a cancel after the run was dropped woke its caller"
            );
        }
        quitter.join().unwrap();
        assert_eq!(std::sync::Arc::strong_count(&counted), 1);
        assert!(attempt.is_cancelled());
        drop(attempt);
        let report = loom::future::block_on(request.quiesce());
        assert_eq!(report.state(), Lifecycle::CancelledStable);
        assert_eq!((report.total(), report.cancelled()), (1, 1));
    });
}
