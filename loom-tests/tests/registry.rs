//! loom models of the child registry: registration, the dispatch compare-and-swap and
//! receipts racing a cancel (docs/design.md invariants 2, 3 and 5).
#![cfg(loom)]

use cancel_scope::{Cause, ChildSpec, Lifecycle, Scope, Ticket};
use cancel_scope_loom_tests::{model, model_bounded, THREE_THREAD_PREEMPTIONS};
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

/// Model 5: a child is registered (in the scope and in a child scope) while the root is
/// cancelled.
///
/// Invariant 3: a registration either fails (the watermark was closed) or it is reached by
/// the cancel — its generation is stale and its dispatch fails. Invariant 5: every ticket that
/// was registered is counted by the report.
#[test]
fn register_racing_cancel() {
    model("register_racing_cancel", || {
        let root = Scope::new();
        let sub = root.child().build().unwrap();

        let registrar = {
            let (root, sub) = (root.clone(), sub.clone());
            thread::spawn(move || {
                let here = root.register(ChildSpec::read_only("here"));
                let below = sub.register(ChildSpec::read_only("below"));
                (here, below)
            })
        };
        root.cancel_because(Cause::DeadlineExceeded);
        let (here, below) = registrar.join().unwrap();

        let mut registered = 0;
        for (ticket, scope) in [(here, &root), (below, &sub)] {
            match ticket {
                Ok(ticket) => {
                    registered += 1;
                    // Reached by the cancel: the ticket's generation is the old one ...
                    assert_eq!(ticket.generation(), 0);
                    assert_eq!(scope.generation(), 1);
                    // ... and it can never be dispatched (invariant 2).
                    let err = ticket.dispatch().unwrap_err();
                    assert!(err.is_deadline_exceeded(), "unexpected error {err:?}");
                }
                // Invariant 3: refused by the closed watermark, with the cancel's cause.
                Err(e) => assert!(e.is_deadline_exceeded(), "unexpected error {e:?}"),
            }
        }

        // Invariant 5: every registration got exactly one receipt (the failed dispatch's).
        let report = loom::future::block_on(root.quiesce());
        assert_eq!(report.total(), registered);
        assert_eq!(report.cancelled(), registered);
        assert_eq!(report.state(), Lifecycle::CancelledStable);
    });
}

/// Model 6: the dispatch compare-and-swap races a deadline cancel.
///
/// Invariant 2: a dispatch either happens-before the cancel or fails. The witness: the
/// dispatcher writes a flag (`Relaxed`) just before `dispatch()`; the canceller reads it
/// (`Relaxed`) just after `cancel_because` returns. If the dispatch succeeded it is ordered
/// before the cancel, so the canceller must see the flag — only the happens-before edge that
/// the dispatch CAS and the cancel's read-modify-write of the same state word create can make
/// it visible. The ticket is in a child scope, so the cancel reaches it through the walk.
#[test]
fn dispatch_racing_deadline_cancel() {
    model("dispatch_racing_deadline_cancel", || {
        let (root, sub, about_to_dispatch, dispatcher) = spawn_dispatcher();
        let canceller = {
            let (root, sub, flag) = (root.clone(), sub.clone(), about_to_dispatch.clone());
            thread::spawn(move || {
                // What a deadline timer does when it fires.
                root.cancel_because(Cause::DeadlineExceeded);
                assert!(sub.is_cancelled());
                flag.load(Ordering::Relaxed)
            })
        };
        let dispatched = dispatcher.join().unwrap();
        let saw_flag = canceller.join().unwrap();

        if dispatched {
            // Invariant 2: the dispatch happened-before the cancel.
            assert!(
                saw_flag,
                "a dispatch that succeeded is not ordered before the cancel"
            );
        }
        assert_eq!(sub.generation(), 1);
    });
}

/// Model 6 (two cancellers): as above, with the deadline and an explicit cancel racing each
/// other. Whichever cancel call returns, no dispatch may succeed after it: the one that loses
/// the first-cause race must not return before the subtree is cancelled.
#[test]
fn dispatch_racing_two_cancels() {
    model_bounded(
        "dispatch_racing_two_cancels",
        THREE_THREAD_PREEMPTIONS,
        || {
            let (root, _sub, about_to_dispatch, dispatcher) = spawn_dispatcher();
            let canceller = |cause: Cause| {
                let (root, flag) = (root.clone(), about_to_dispatch.clone());
                thread::spawn(move || {
                    root.cancel_because(cause);
                    flag.load(Ordering::Relaxed)
                })
            };
            let deadline = canceller(Cause::DeadlineExceeded);
            let explicit = canceller(Cause::cancelled("stop"));
            let dispatched = dispatcher.join().unwrap();
            let saw_deadline = deadline.join().unwrap();
            let saw_explicit = explicit.join().unwrap();

            if dispatched {
                // Invariant 2, for both cancels.
                assert!(
                    saw_deadline,
                    "dispatch succeeded after the deadline cancel returned"
                );
                assert!(
                    saw_explicit,
                    "dispatch succeeded after the explicit cancel returned"
                );
            }
        },
    );
}

/// A root, a child scope with one registered ticket, the witness flag, and a thread that
/// dispatches the ticket with [`dispatch_with_witness`] (joining it says whether it succeeded).
fn spawn_dispatcher() -> (Scope, Scope, Arc<AtomicBool>, thread::JoinHandle<bool>) {
    let root = Scope::new();
    let sub = root.child().build().unwrap();
    let ticket = sub.register(ChildSpec::read_only("call")).unwrap();
    let about_to_dispatch = Arc::new(AtomicBool::new(false));
    let dispatcher = {
        let flag = about_to_dispatch.clone();
        thread::spawn(move || dispatch_with_witness(ticket, &flag))
    };
    (root, sub, about_to_dispatch, dispatcher)
}

/// Sets the witness, dispatches, and finishes the child; returns whether the dispatch
/// succeeded.
fn dispatch_with_witness(ticket: Ticket, about_to_dispatch: &AtomicBool) -> bool {
    about_to_dispatch.store(true, Ordering::Relaxed);
    match ticket.dispatch() {
        Ok(call) => {
            call.succeed();
            true
        }
        Err(e) => {
            // Invariant 2: refused because of the cancel, whichever cause won.
            assert!(e.is_cancelled(), "unexpected error {e:?}");
            false
        }
    }
}

/// Model 8: tickets end with their default receipt (dropped while prepared, dropped after
/// dispatch with a possible effect, a dispatch that loses to the cancel) while the scope is
/// cancelled and quiesced.
///
/// Invariant 5: every registered ticket gets exactly one receipt — the report's total equals
/// the number registered — and an unknown effect is counted as unknown, never as zero.
#[test]
fn receipt_on_drop_racing_cancel() {
    model_bounded(
        "receipt_on_drop_racing_cancel",
        THREE_THREAD_PREEMPTIONS,
        || {
            let scope = Scope::new();
            let sub = scope.child().build().unwrap();
            let prepared = scope.register(ChildSpec::read_only("lookup")).unwrap();
            let payment = sub
                .register(ChildSpec::side_effecting("charge", "payment-7"))
                .unwrap();

            let dropper = thread::spawn(move || drop(prepared));
            let dispatcher = thread::spawn(move || match payment.dispatch() {
                // Dispatched, then dropped without a receipt: it may have charged.
                Ok(call) => {
                    drop(call);
                    true
                }
                Err(e) => {
                    assert!(e.is_cancelled(), "unexpected error {e:?}");
                    false
                }
            });
            scope.cancel();
            let report = loom::future::block_on(scope.quiesce());
            dropper.join().unwrap();
            let charged = u64::from(dispatcher.join().unwrap());

            // Invariant 5: exactly one receipt per registration.
            assert_eq!(report.total(), 2);
            assert_eq!(report.effect_unknown(), charged);
            assert_eq!(report.cancelled(), 2 - charged);
            if charged == 1 {
                assert_eq!(report.state(), Lifecycle::NeedsReconciliation);
                assert_eq!(report.pending_effects()[0].effect_id(), "payment-7");
            } else {
                assert_eq!(report.state(), Lifecycle::CancelledStable);
                assert!(report.pending_effects().is_empty());
            }
        },
    );
}
