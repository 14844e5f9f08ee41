//! Cancellation: causes, first cause wins, downward only, cancelled(), on_cancel, generation.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Context;
use std::time::Duration;

use cancel_scope::{Cause, ChildSpec, Scope};
use futures::FutureExt;

use crate::support::wakers::{borrowed_waker, Slot};

#[test]
fn cancel_reaches_every_descendant_with_the_origin_cause() {
    let root = Scope::new();
    let a = root.child().build().unwrap();
    let b = a.child().build().unwrap();
    let c = b.child().build().unwrap();
    root.cancel_with("shutdown");
    for s in [&a, &b, &c] {
        assert!(s.is_cancelled());
        assert_eq!(
            s.cause(),
            Some(Cause::ParentCancelled(Arc::new(Cause::cancelled(
                "shutdown"
            ))))
        );
    }
    assert_eq!(root.cause(), Some(Cause::cancelled("shutdown")));
}

#[test]
fn cancelling_a_child_touches_neither_parent_nor_siblings() {
    let root = Scope::new();
    let a = root.child().build().unwrap();
    let b = root.child().build().unwrap();
    let a1 = a.child().build().unwrap();
    a.cancel();
    assert!(a.is_cancelled() && a1.is_cancelled());
    assert!(!root.is_cancelled());
    assert!(!b.is_cancelled());
    assert!(root.child().build().is_ok());
}

#[test]
fn first_cause_wins_and_cancel_is_idempotent() {
    let s = Scope::new();
    let child = s.child().build().unwrap();
    assert!(s.cancel_because(Cause::ClientGone));
    assert!(!s.cancel_because(Cause::DeadlineExceeded));
    s.cancel();
    s.cancel_with("later");
    assert_eq!(s.cause(), Some(Cause::ClientGone));
    // A child cancelled after its parent keeps the inherited cause.
    assert!(!child.cancel_because(Cause::cancelled("own")));
    assert!(child.cause().unwrap().is_client_gone());
}

#[test]
fn a_child_cancelled_first_keeps_its_own_cause() {
    let root = Scope::new();
    let child = root.child().build().unwrap();
    child.cancel_with("mine");
    root.cancel_because(Cause::ClientGone);
    assert_eq!(child.cause(), Some(Cause::cancelled("mine")));
}

#[test]
fn a_sibling_cancelled_first_passes_its_cause_to_no_one_else() {
    let root = Scope::new();
    // Walked first (slot 0), a leaf cancelled first with its own cause.
    let early = root.child().build().unwrap();
    let later = root.child().build().unwrap();
    let grandchild = later.child().build().unwrap();
    early.cancel_with("early");
    root.cancel_with("root");
    assert_eq!(early.cause().unwrap().reason(), Some("early"));
    for s in [&later, &grandchild] {
        let cause = s.cause().unwrap();
        assert!(matches!(cause, Cause::ParentCancelled(_)), "{cause:?}");
        assert_eq!(cause.reason(), Some("root"));
    }
}

#[test]
fn a_deep_chain_is_cancelled_to_the_end_and_a_cause_set_midway_holds_below_it() {
    // Deeper than the walk goes holding locks, so both ways of walking are used.
    let mut chain = vec![Scope::new()];
    for _ in 0..200 {
        let next = chain.last().unwrap().child().build().unwrap();
        chain.push(next);
    }
    chain[100].cancel_with("midway");
    chain[0].cancel_with("root");
    for (depth, s) in chain.iter().enumerate().skip(1) {
        let cause = s.cause().unwrap();
        let want = match depth {
            100 => Cause::cancelled("midway"),
            d if d < 100 => Cause::ParentCancelled(Arc::new(Cause::cancelled("root"))),
            _ => Cause::ParentCancelled(Arc::new(Cause::cancelled("midway"))),
        };
        assert_eq!(cause, want, "depth {depth}");
    }
}

#[test]
fn no_child_can_be_created_under_a_cancelled_or_closed_scope() {
    let s = Scope::new();
    s.cancel_because(Cause::ClientGone);
    let err = s.child().build().unwrap_err();
    assert!(err.is_cancelled() && err.is_client_gone());

    let closed = Scope::new();
    closed.close();
    let err = closed.child().build().unwrap_err();
    assert!(err.is_closed() && !err.is_cancelled());
    assert!(!closed.is_cancelled());
}

#[test]
fn cancel_bumps_the_generation_once() {
    let s = Scope::new();
    let child = s.child().build().unwrap();
    assert_eq!((s.generation(), child.generation()), (0, 0));
    s.cancel();
    s.cancel();
    assert_eq!((s.generation(), child.generation()), (1, 1));
    // Children start at their parent's generation.
    let other = Scope::new();
    assert_eq!(other.child().build().unwrap().generation(), 0);
}

#[tokio::test]
async fn cancelled_wakes_every_waiter() {
    let s = Scope::new();
    let woken = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let (s, woken) = (s.clone(), woken.clone());
        tasks.push(tokio::spawn(async move {
            s.cancelled().await;
            woken.fetch_add(1, Ordering::SeqCst);
        }));
    }
    tokio::task::yield_now().await;
    assert_eq!(woken.load(Ordering::SeqCst), 0);
    s.child().build().unwrap().child().build().unwrap();
    s.cancel();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(woken.load(Ordering::SeqCst), 100);
}

#[tokio::test]
async fn a_parent_cancel_wakes_waiters_of_descendants() {
    let root = Scope::new();
    let leaf = root.child().build().unwrap().child().build().unwrap();
    let waiter = tokio::spawn({
        let leaf = leaf.clone();
        async move {
            leaf.cancelled().await;
            leaf.cause()
        }
    });
    tokio::task::yield_now().await;
    root.cancel_because(Cause::DeadlineExceeded);
    assert!(waiter.await.unwrap().unwrap().is_deadline_exceeded());
}

#[test]
fn cancelled_future_is_cancel_safe() {
    let s = Scope::new();
    // Poll once (registers a waker), then drop: nothing is left behind.
    let mut f = s.cancelled();
    assert!((&mut f).now_or_never().is_none());
    drop(f);
    let mut g = s.cancelled();
    assert!((&mut g).now_or_never().is_none());
    s.cancel();
    assert!(g.now_or_never().is_some());
    // A new call after the cancel completes at once.
    assert!(s.cancelled().now_or_never().is_some());
}

#[test]
fn on_cancel_runs_once_with_the_cause_and_stop_prevents_it() {
    let s = Scope::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let kept = s.on_cancel(move |cause| {
        assert!(cause.is_client_gone());
        r.fetch_add(1, Ordering::SeqCst);
    });
    let stopped = s.on_cancel(|_| panic!("stopped callbacks never run"));
    assert!(stopped.stop());
    let dropped = s.on_cancel(|_| panic!("dropped guards unregister"));
    drop(dropped);

    s.cancel_because(Cause::ClientGone);
    s.cancel();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(!kept.stop(), "it already ran");

    // Registering after the cancel runs at once.
    let r = runs.clone();
    let late = s.on_cancel(move |_| {
        r.fetch_add(1, Ordering::SeqCst);
    });
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert!(!late.stop());
}

#[test]
fn on_cancel_of_a_descendant_runs_on_parent_cancel() {
    let root = Scope::new();
    let child = root.child().build().unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let _g = child.on_cancel(move |c| {
        assert!(matches!(c, Cause::ParentCancelled(_)));
        r.fetch_add(1, Ordering::SeqCst);
    });
    root.cancel();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[test]
fn concurrent_cancels_from_many_threads_agree_on_one_cause() {
    for _ in 0..200 {
        let root = Scope::new();
        let leaf = root.child().build().unwrap().child().build().unwrap();
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let root = root.clone();
                std::thread::spawn(move || root.cancel_with(format!("t{i}")))
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let cause = root.cause().unwrap();
        assert_eq!(leaf.cause().unwrap().origin(), &cause);
        assert_eq!(root.generation(), 1);
    }
}

/// A cause forwarded from another tree as "my parent was cancelled" (`cancel_because` with a
/// `ParentCancelled` wrapping a cause that is itself `ParentCancelled`, the cause of a child
/// there) still has the origin where the cancel started: a deadline stays a deadline for the
/// scope, its descendants and the errors they yield (a server answers 504, not 503).
// regression: `origin()` looked through one level only, so `is_deadline_exceeded` was false.
#[test]
fn a_forwarded_parent_cancel_keeps_its_origin_through_any_nesting() {
    let other = Scope::new();
    let other_child = other.child().build().unwrap();
    let mine = Scope::new();
    let below = mine.child().build().unwrap();
    let bridge = {
        let mine = mine.clone();
        other_child.on_cancel(move |c| {
            mine.cancel_because(Cause::ParentCancelled(Arc::new(c.clone())));
        })
    };
    other.cancel_because(Cause::DeadlineExceeded);
    assert!(!bridge.stop(), "the bridge ran");
    let cause = mine.cause().unwrap();
    assert_eq!(cause.origin(), &Cause::DeadlineExceeded, "{cause:?}");
    assert!(cause.is_deadline_exceeded());
    assert_eq!(below.cause().unwrap().origin(), &Cause::DeadlineExceeded);
    let err = below.run(async {}).now_or_never().unwrap().unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err:?}");

    let reason = Cause::ParentCancelled(Arc::new(Cause::ParentCancelled(Arc::new(
        Cause::cancelled("bye"),
    ))));
    assert_eq!(reason.reason(), Some("bye"));
    assert_eq!(reason.origin(), &Cause::cancelled("bye"));
}

/// Invariant 1 as worded: a closed child that is already quiet has completed and is out of a
/// later cancel's reach (with its quiet subtree), while a closed child that still has work is
/// cancelled like any other.
#[test]
fn a_closed_child_that_is_already_quiet_is_out_of_a_later_cancels_reach() {
    use cancel_scope::{ChildSpec, Lifecycle};
    let root = Scope::new();
    let done = root.child().build().unwrap();
    let done_below = done.child().build().unwrap();
    let busy = root.child().build().unwrap();
    let work = busy.register(ChildSpec::read_only("work")).unwrap();
    done.close();
    busy.close();

    root.cancel_with("shutdown");
    for quiet in [&done, &done_below] {
        assert!(!quiet.is_cancelled());
        assert_eq!(quiet.cause(), None);
        assert_eq!(quiet.lifecycle(), Lifecycle::Completed);
    }
    assert_eq!(
        busy.cause(),
        Some(Cause::ParentCancelled(Arc::new(Cause::cancelled(
            "shutdown"
        ))))
    );
    assert_eq!(busy.lifecycle(), Lifecycle::Cancelling);
    drop(work);
    assert_eq!(busy.lifecycle(), Lifecycle::CancelledStable);
}

/// A waiter kept registered because a later poll came with "the same" waker must really be
/// the same: here the slot that the first poll's waker borrowed from now holds another task,
/// which must be the one woken by the cancel (the first task no longer waits). Keeping only
/// the passed waker's addresses, not those of the clone in the list, takes the second waker
/// for the first (the address is reused, the first waker is gone): a lost wake-up.
// regression: the waiter re-polled through a reused address was never woken.
#[test]
fn a_waiter_polled_by_another_task_through_a_reused_waker_address_is_woken() {
    let scope = Scope::new();
    let first = Arc::new(AtomicBool::new(false));
    let second = Arc::new(AtomicBool::new(false));
    let slot = Slot {
        task: std::sync::Mutex::new(first.clone()),
    };
    let mut cancelled = scope.cancelled();

    let w = borrowed_waker(&slot);
    assert!(Pin::new(&mut cancelled)
        .poll(&mut Context::from_waker(&w))
        .is_pending());
    drop(w);

    // The executor reuses the slot for the task that now owns the future.
    *slot.task.lock().unwrap() = second.clone();
    let w = borrowed_waker(&slot);
    assert!(Pin::new(&mut cancelled)
        .poll(&mut Context::from_waker(&w))
        .is_pending());
    drop(w);

    scope.cancel();
    assert!(
        second.load(Ordering::SeqCst),
        "the task waiting now was not woken (lost wake-up)"
    );
    drop(cancelled);
}

/// Dropping an `on_cancel` guard drops the user's closure, which may own a ticket of the same
/// (closed) scope: its drop makes the scope quiet without a deadlock.
// regression: the closure was dropped under the node's lock, and the ticket's drop deadlocked.
#[test]
fn dropping_an_on_cancel_guard_whose_closure_owns_a_ticket_does_not_deadlock() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let s = Scope::new();
        let t = s.register(ChildSpec::read_only("r")).unwrap();
        let g = s.on_cancel(move |_| drop(t));
        s.close();
        drop(g); // the closure's drop -> the ticket's drop -> the scope goes quiet (takes its lock)
        tx.send(()).unwrap();
    });
    assert!(
        rx.recv_timeout(Duration::from_secs(3)).is_ok(),
        "deadlock: dropping an OnCancel guard whose closure owns a ticket"
    );
}
