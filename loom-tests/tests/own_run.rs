//! loom models of an own ticket's run (`OwnTicket::run`, the way a retry attempt, a hedge or a
//! fan-out branch runs its work on the ticket of its own child scope): the run's cancel waiter
//! racing the cancel of the scope above (docs/design.md invariant 1: the cancel reaches it, no lost
//! wake-up), its work stopped before the ticket comes back or its receipt is recorded
//! (invariant 6), and a run given up by its caller leaving nothing of the caller behind.
#![cfg(loom)]

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::task::{Context, Poll, Wake, Waker};

use cancel_scope::{__OwnTicket as OwnTicket, Cause, ChildSpec, Error, Lifecycle, Receipt, Scope};
use cancel_scope_loom_tests::model;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

/// Work that never ends on its own and keeps no waker (the run's cancel waiter is the only
/// way out); it notes when it is dropped. Given the request, it also checks then that the
/// request has not been seen quiet yet (its ticket's receipt must come after it).
struct Stuck {
    dropped: Arc<AtomicBool>,
    request: Option<Scope>,
}

impl Stuck {
    fn new(request: Option<&Scope>) -> (Self, Arc<AtomicBool>) {
        let dropped = Arc::new(AtomicBool::new(false));
        let work = Stuck {
            dropped: dropped.clone(),
            request: request.cloned(),
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
        // Not while unwinding from another failed check: a second panic would abort the
        // test binary and hide the first.
        if let Some(request) = self.request.as_ref().filter(|_| !std::thread::panicking()) {
            assert!(
                !request.lifecycle().is_final(),
                "the work was dropped after its scope's receipt made the request quiet"
            );
        }
        self.dropped.store(true, Ordering::Release);
    }
}

/// A waker that does nothing, whose clones can be counted (`std`'s `Arc`, which
/// `Waker::from` needs: loom runs every model thread on one OS thread, so the count read is
/// the current one).
struct Counted;

impl Wake for Counted {
    fn wake(self: std::sync::Arc<Self>) {}
}

/// A request and one attempt in it, as a retry starts one: the attempt's scope, which is also
/// its ticket in the request, and that own ticket.
fn request_with_attempt() -> (Scope, Scope, OwnTicket) {
    let request = Scope::new();
    let (attempt, own) = request
        .__child_dispatched(&ChildSpec::read_only("inventory"))
        .unwrap();
    (request, attempt, own)
}

/// The request's cancel (`cancel_with("client gone")`) is the cause `err` carries.
fn assert_client_gone(err: &Error) {
    assert_eq!(
        err.cause().map(Cause::origin),
        Some(&Cause::cancelled("client gone"))
    );
}

/// After the request's cancel: it reached the attempt, and the request ends `CancelledStable`
/// with the attempt's one receipt, `Cancelled`.
fn assert_cancelled_then_quiet(request: &Scope, attempt: Scope) {
    assert!(attempt.is_cancelled());
    drop(attempt);
    let report = loom::future::block_on(request.quiesce());
    assert_eq!(report.state(), Lifecycle::CancelledStable);
    assert_eq!((report.total(), report.cancelled()), (1, 1));
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
        let (request, attempt, own) = request_with_attempt();
        let runner = thread::spawn(move || {
            let (work, dropped) = Stuck::new(None);
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
        });
        request.cancel_with("client gone");
        let err = runner.join().unwrap();
        assert!(err.is_cancelled());
        assert_client_gone(&err);
        assert_cancelled_then_quiet(&request, attempt);
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
/// waiter slot: a cancel later than the drop can neither wake nor keep alive a caller that
/// has moved on.
#[test]
fn own_run_dropped_racing_request_cancel() {
    model("own_run_dropped_racing_request_cancel", || {
        let (request, attempt, own) = request_with_attempt();
        let counted = std::sync::Arc::new(Counted);
        let gone = Arc::new(AtomicBool::new(false));
        let quitter = {
            let (request, counted, gone) = (request.clone(), counted.clone(), gone.clone());
            thread::spawn(move || {
                let (work, dropped) = Stuck::new(Some(&request));
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
        if gone.load(Ordering::Acquire) {
            // Before the cancel: nothing of the caller is left for it to wake.
            assert_eq!(
                std::sync::Arc::strong_count(&counted),
                1,
                "the attempt's scope kept a clone of the caller's waker"
            );
        }
        request.cancel();
        quitter.join().unwrap();
        assert_eq!(std::sync::Arc::strong_count(&counted), 1);
        assert_cancelled_then_quiet(&request, attempt);
    });
}

/// Model 38: the request is closed (its normal end: the attempt's scope is
/// closed with it), then cancelled on one thread while, on another, the quarantine that
/// `quiesce()` runs once the grace period after the cancel ends (here zero) runs as soon as
/// the cancel mark is set, possibly before the cancel walk reached the attempt; the attempt's
/// run starts (or goes on) only after that.
///
/// Invariants 1 and 6: the quarantine, which gives back the unit of the attempt's own ticket
/// and so makes the closed attempt scope quiet, must not leave that scope out of the cancel
/// (a quiet scope is never cancelled afterwards): the attempt is cancelled, and its run
/// stops with the request's cause instead of waiting for ever (loom reports the deadlock).
/// The ticket is counted once, `Quarantined`.
#[test]
fn quarantine_overtaking_the_cancel_walk_still_cancels_a_closed_attempt() {
    model(
        "quarantine_overtaking_the_cancel_walk_still_cancels_a_closed_attempt",
        || {
            let (request, attempt, own) = request_with_attempt();
            request.close();
            let canceller = {
                let request = request.clone();
                thread::spawn(move || request.cancel_with("client gone"))
            };
            while !request.is_cancelled() {
                thread::yield_now();
            }
            assert_eq!(request.__quarantine_now(), 1);
            // The request is quiet once its one ticket is quarantined: no check at the drop.
            let (work, dropped) = Stuck::new(None);
            let (out, own) = loom::future::block_on(own.run(work));
            assert!(dropped.load(Ordering::Acquire));
            let err = out.unwrap_err();
            assert_client_gone(&err);
            own.finish(Receipt::Cancelled);
            canceller.join().unwrap();
            assert!(attempt.is_cancelled());
            drop(attempt);
            let report = loom::future::block_on(request.quiesce());
            assert_eq!((report.total(), report.quarantined()), (1, 1));
        },
    );
}
