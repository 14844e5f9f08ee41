//! loom models of the handover between a busy cancel and a waiting `quiesce()`: once the
//! cancel walk is done, `Due::hand_over` hands the cancelled node to every `QuietWaiter` of it
//! and of its ancestors; `poll_quiet` registers one and drains it. `Quiesce` itself has no
//! timer under loom (and so no look), so these drive the tree functions directly: the "look"
//! is the state read of the cancelled node that `quiesce::look_below` makes after the
//! registration.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p cancel-scope --lib --release loom_handover`.

use std::task::Waker;

use super::units::release_unit;
use super::*;

type N = Arc<Node<(), ()>>;

/// Runs `f` under loom with at most `bound` preemptions; prints the interleavings explored.
fn model(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(bound);
    b.check(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        f();
    });
    eprintln!(
        "bound {bound}: {} interleavings",
        runs.load(Ordering::Relaxed)
    );
}

fn cause() -> Cause {
    Cause::Cancelled { reason: None }
}

/// Drops the public handle of each node (as `Scope`'s drop does: this breaks the parent-link
/// cycle, loom's leak check needs it), leaves first.
fn drop_handles(nodes: &[&N]) {
    for n in nodes {
        drop_handle(n, |_| ());
    }
}

/// A closed root, a middle scope and a busy leaf (one unit).
fn tree() -> (N, N, N) {
    let q = new_root(());
    let mid = new_child(&q, |_| ()).unwrap();
    let d = new_child(&mid, |_| ()).unwrap();
    take_unit(&d).unwrap();
    close(&q);
    (q, mid, d)
}

/// The argument in the doc of `nudge_quiesce_above`: a busy cancel of a descendant racing the
/// first poll of a `quiesce()` (registration, then the look) is seen by the look or handed
/// over to the waiter, never neither. loom also checks that every handed `Arc` is freed.
#[test]
fn loom_handover_busy_cancel_racing_registration_then_look() {
    model(3, || {
        let (q, mid, d) = tree();
        let canceller = {
            let d = d.clone();
            loom::thread::spawn(move || cancel(&d, cause(), 1))
        };
        let mut key = WaiterKey::default();
        let mut handed = Vec::new();
        assert!(!poll_quiet(&q, &mut key, Waker::noop(), &mut handed));
        let looked = d.state().is_cancelled();
        assert!(canceller.join().unwrap());
        assert!(!poll_quiet(&q, &mut key, Waker::noop(), &mut handed));
        let was_handed = handed
            .iter()
            .any(|n| n.upgrade().is_some_and(|n| Arc::ptr_eq(&n, &d)));
        assert!(
            looked || was_handed,
            "the cancel was neither looked up nor handed over"
        );
        drop(handed);
        forget_waiter(&q, Wait::Quiet, &mut key);
        release_unit(&d);
        assert!(q.state().is_quiet());
        drop_handles(&[&d, &mid, &q]);
    });
}

/// Control: the model has teeth. Looking *before* registering loses the cancel in some
/// interleaving (the look misses it, and the nudge finds no waiter).
#[test]
#[should_panic(expected = "neither looked up nor handed over")]
fn loom_handover_look_before_registration_is_caught() {
    model(3, || {
        let (q, mid, d) = tree();
        let canceller = {
            let d = d.clone();
            loom::thread::spawn(move || cancel(&d, cause(), 1))
        };
        let looked = d.state().is_cancelled();
        let mut key = WaiterKey::default();
        let mut handed = Vec::new();
        assert!(!poll_quiet(&q, &mut key, Waker::noop(), &mut handed));
        canceller.join().unwrap();
        assert!(!poll_quiet(&q, &mut key, Waker::noop(), &mut handed));
        let was_handed = handed
            .iter()
            .any(|n| n.upgrade().is_some_and(|n| Arc::ptr_eq(&n, &d)));
        assert!(
            looked || was_handed,
            "the cancel was neither looked up nor handed over"
        );
        drop(handed);
        forget_waiter(&q, Wait::Quiet, &mut key);
        release_unit(&d);
        drop_handles(&[&d, &mid, &q]);
    });
}

/// A `quiesce()` dropped (`forget_waiter`) while the cancel hands over to it, and a second
/// waiter on the same scope that stays: the dropped waiter's handed `Arc`s are freed (loom's
/// leak check), the staying one gets the cancel (its registration came before the cancel
/// started, so the look may not be relied on), no lock is held twice.
#[test]
fn loom_handover_racing_a_dropped_waiter() {
    model(3, || {
        let (q, mid, d) = tree();
        let mut stay = WaiterKey::default();
        let mut handed = Vec::new();
        assert!(!poll_quiet(&q, &mut stay, Waker::noop(), &mut handed));
        let dropper = {
            let q = q.clone();
            loom::thread::spawn(move || {
                let mut key = WaiterKey::default();
                let mut handed = Vec::new();
                assert!(!poll_quiet(&q, &mut key, Waker::noop(), &mut handed));
                forget_waiter(&q, Wait::Quiet, &mut key);
            })
        };
        cancel(&d, cause(), 1);
        dropper.join().unwrap();
        assert!(!poll_quiet(&q, &mut stay, Waker::noop(), &mut handed));
        assert!(handed
            .iter()
            .any(|n| n.upgrade().is_some_and(|n| Arc::ptr_eq(&n, &d))));
        drop(handed);
        forget_waiter(&q, Wait::Quiet, &mut stay);
        release_unit(&d);
        drop_handles(&[&d, &mid, &q]);
    });
}

/// A waiter on an open scope handed a busy cancel below, then drained by the scope's own
/// cancel, which may find it idle (the leaf finished meanwhile: `mark_cancelled` drains the
/// waiters and drops their handed nodes) or busy (it wakes them): either way the next poll
/// sees quiet, and every `Arc` is freed.
#[test]
fn loom_handover_then_drained_by_an_idle_cancel() {
    model(2, || {
        let q: N = new_root(());
        let d = new_child(&q, |_| ()).unwrap();
        take_unit(&d).unwrap();
        let mut key = WaiterKey::default();
        let mut handed = Vec::new();
        assert!(!poll_quiet(&q, &mut key, Waker::noop(), &mut handed));
        let leaf = {
            let d = d.clone();
            loom::thread::spawn(move || {
                cancel(&d, cause(), 1);
                release_unit(&d);
            })
        };
        let top = {
            let q = q.clone();
            loom::thread::spawn(move || cancel(&q, cause(), 2))
        };
        leaf.join().unwrap();
        top.join().unwrap();
        assert!(poll_quiet(&q, &mut key, Waker::noop(), &mut handed));
        drop(handed);
        drop_handles(&[&d, &q]);
    });
}
