//! loom models of waiting for a cancel: the `cancelled()` future and `on_cancel` callbacks
//! racing the cancel (docs/design.md invariant 1: a cancel reaches everything registered on the
//! scope, once).
#![cfg(loom)]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use cancel_scope::{Cause, Scope};
use cancel_scope_loom_tests::model;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

/// Model 3: `cancelled()` is first polled (and registers its waker) while another thread
/// cancels.
///
/// Invariant 1: no lost wake-up — `block_on` returns in every interleaving (loom reports a
/// deadlock otherwise), and the waiter then sees the cause.
#[test]
fn cancelled_future_racing_cancel() {
    model("cancelled_future_racing_cancel", || {
        let scope = Scope::new();
        let waiter = {
            let scope = scope.clone();
            thread::spawn(move || {
                loom::future::block_on(scope.cancelled());
                scope.cause()
            })
        };
        scope.cancel_because(Cause::ClientGone);
        assert_eq!(waiter.join().unwrap(), Some(Cause::ClientGone));
    });
}

/// Model 3 (propagated): a waiter on a grandchild while the root is cancelled; the wake-up
/// comes from the cancel walk, not from a direct cancel.
///
/// Invariant 1: the cancel reaches the grandchild's waiter; no lost wake-up.
#[test]
fn descendant_waiter_racing_root_cancel() {
    model("descendant_waiter_racing_root_cancel", || {
        let root = Scope::new();
        let middle = root.child().build().unwrap();
        let leaf = middle.child().build().unwrap();
        let waiter = thread::spawn(move || {
            loom::future::block_on(leaf.cancelled());
            leaf.cause()
        });
        root.cancel_with("bye");
        let cause = waiter.join().unwrap().unwrap();
        assert_eq!(cause.origin(), &Cause::cancelled("bye"));
        drop(middle);
    });
}

/// Model 3 (cancel safety): a `cancelled()` future is polled once and dropped while the
/// cancel drains the waiter list; a second waiter on the same scope must still be woken.
///
/// Invariant 1: dropping a registered waiter neither loses another waiter's wake-up nor
/// disturbs the list the cancel drains.
#[test]
fn dropped_waiter_racing_cancel() {
    model("dropped_waiter_racing_cancel", || {
        let scope = Scope::new();
        let quitter = {
            let scope = scope.clone();
            thread::spawn(move || {
                let mut fut = pin!(scope.cancelled());
                let mut cx = Context::from_waker(Waker::noop());
                // Registered (or already cancelled); then given up, as a losing select! branch.
                let _ = fut.as_mut().poll(&mut cx);
            })
        };
        let waiter = {
            let scope = scope.clone();
            thread::spawn(move || loom::future::block_on(scope.cancelled()))
        };
        scope.cancel();
        quitter.join().unwrap();
        waiter.join().unwrap();
        // A new waiter after the fact completes at once.
        let mut fut = pin!(scope.cancelled());
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Ready(()));
    });
}

/// Model 3 (`on_cancel`): a callback is registered and then stopped while another thread
/// cancels.
///
/// Invariant 1 (a cancel reaches everything registered, once): the callback runs exactly once
/// if `stop()` says it was too late, and never if `stop()` stopped it.
#[test]
fn on_cancel_racing_cancel() {
    model("on_cancel_racing_cancel", || {
        let scope = Scope::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let registrar = {
            let (scope, runs) = (scope.clone(), runs.clone());
            thread::spawn(move || {
                let guard = scope.on_cancel(move |cause| {
                    assert_eq!(cause, &Cause::ClientGone);
                    runs.fetch_add(1, Ordering::SeqCst);
                });
                guard.stop()
            })
        };
        scope.cancel_because(Cause::ClientGone);
        let stopped = registrar.join().unwrap();
        let ran = runs.load(Ordering::SeqCst);
        if stopped {
            assert_eq!(ran, 0, "a stopped callback ran");
        } else {
            assert_eq!(
                ran, 1,
                "a callback that was too late to stop ran {ran} times"
            );
        }
    });
}
