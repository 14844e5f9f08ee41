//! loom models of stable quiescence: late registrations, guard releases and child scopes
//! racing `close`/`cancel` and `quiesce()` (docs/design.md invariants 3, 5 and 6).
#![cfg(loom)]

use cancel_scope::{ChildSpec, Lifecycle, Scope, Ticket};
use cancel_scope_loom_tests::model;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

/// Model 7: a registration and a tethered guard are attempted while the scope is closed and
/// quiesced.
///
/// Invariant 6: once `quiesce()` has resolved, a registration or tether that comes after it
/// fails; one that succeeded before is counted in the report; the report never changes
/// afterwards (read again after everything finished and compared). The "after" is made
/// observable by a flag the quiescing thread sets once `quiesce()` returned, which the late
/// thread reads before each attempt.
#[test]
fn late_register_racing_quiesce() {
    model("late_register_racing_quiesce", || {
        let scope = Scope::new();
        let quiet = Arc::new(AtomicBool::new(false));

        let late = {
            let (scope, quiet) = (scope.clone(), quiet.clone());
            thread::spawn(move || {
                let was_quiet = quiet.load(Ordering::SeqCst);
                let registered = match scope.register(ChildSpec::read_only("late")) {
                    Ok(ticket) => {
                        // Invariant 6: nothing registers after quiescence was observed.
                        assert!(!was_quiet, "registered after quiesce() resolved");
                        Some(finish(ticket))
                    }
                    Err(e) => {
                        assert!(e.is_closed(), "unexpected error {e:?}");
                        None
                    }
                };
                let was_quiet = quiet.load(Ordering::SeqCst);
                match scope.tether("conn") {
                    Ok(guard) => {
                        assert!(!was_quiet, "tethered after quiesce() resolved");
                        drop(guard);
                    }
                    Err(e) => assert!(e.is_closed(), "unexpected error {e:?}"),
                }
                registered
            })
        };
        scope.close();
        let report = loom::future::block_on(scope.quiesce());
        quiet.store(true, Ordering::SeqCst);
        let late = late.join().unwrap();

        // Invariant 5/6: a registration that got in has its receipt in the report ...
        assert_eq!(report.total(), u64::from(late.is_some()));
        assert_eq!(report.succeeded(), u64::from(late == Some(true)));
        assert_eq!(report.state(), Lifecycle::Completed);
        // ... and the report is stable: nothing changed after it was taken.
        let again = loom::future::block_on(scope.quiesce());
        assert_eq!(again, report);
        assert_eq!(scope.lifecycle(), report.state());
    });
}

/// Dispatches `ticket` and records success; a dispatch refused by a close that came in between
/// records `Cancelled` instead. Returns whether it was dispatched.
fn finish(ticket: Ticket) -> bool {
    match ticket.dispatch() {
        Ok(call) => {
            call.succeed();
            true
        }
        Err(e) => {
            assert!(e.is_closed(), "unexpected error {e:?}");
            false
        }
    }
}

/// Model 9: a guard is released while the scope is cancelled and quiesced.
///
/// Invariant 6: `quiesce()` resolves only after the guard is dropped. The holder sets a flag
/// (`Relaxed`) just before dropping the guard; the quiescing thread must see it once
/// `quiesce()` returns (release of the guard's unit happens-before the quiet observation).
#[test]
fn guard_release_racing_quiesce() {
    model("guard_release_racing_quiesce", || {
        let scope = Scope::new();
        let guard = scope.tether("permit").unwrap();
        let releasing = Arc::new(AtomicBool::new(false));

        let holder = {
            let releasing = releasing.clone();
            thread::spawn(move || {
                releasing.store(true, Ordering::Relaxed);
                drop(guard);
            })
        };
        scope.cancel();
        let report = loom::future::block_on(scope.quiesce());
        assert!(
            releasing.load(Ordering::Relaxed),
            "quiesce() resolved while the guard was held"
        );
        holder.join().unwrap();
        assert_eq!(report.state(), Lifecycle::CancelledStable);
        // Guards are not children: no receipts.
        assert_eq!(report.total(), 0);
    });
}

/// Model 10: a child scope takes its first unit (a registration, which must take a unit of the
/// parent: 0 -> 1 propagation) while the parent is closed and quiesced.
///
/// Invariants 3 and 6: the parent's `quiesce()` never resolves while the child holds a unit.
/// The child holder reads the parent's "quiet" flag while it holds the ticket: it must never
/// be set then. If the registration got in, its receipt is in the parent's report.
#[test]
fn child_unit_racing_parent_close() {
    model("child_unit_racing_parent_close", || {
        let parent = Scope::new();
        let child = parent.child().build().unwrap();
        // A first unit, already given back: the race below is the child's second 0 -> 1,
        // which must take a parent unit again.
        drop(child.register(ChildSpec::read_only("warm-up")).unwrap());
        let quiet = Arc::new(AtomicBool::new(false));

        let worker = {
            let quiet = quiet.clone();
            thread::spawn(move || match child.register(ChildSpec::read_only("job")) {
                Ok(ticket) => {
                    // Invariant 6: the parent cannot be quiet while this unit is held.
                    assert!(
                        !quiet.load(Ordering::SeqCst),
                        "parent quiet while a child holds a unit"
                    );
                    finish(ticket);
                    true
                }
                Err(e) => {
                    // Invariant 3: refused through the parent's closed watermark or the walk.
                    assert!(e.is_closed(), "unexpected error {e:?}");
                    false
                }
            })
        };
        parent.close();
        let report = loom::future::block_on(parent.quiesce());
        quiet.store(true, Ordering::SeqCst);
        let registered = u64::from(worker.join().unwrap());

        // Invariant 5: the warm-up's receipt and the racing registration's, if it got in.
        assert_eq!(report.total(), 1 + registered);
        assert_eq!(report.state(), Lifecycle::Completed);
        let again = loom::future::block_on(parent.quiesce());
        assert_eq!(again, report);
    });
}

/// Model 10 (guards): as above with a tethered guard in the child scope and a cancel of the
/// parent: the parent's `quiesce()` resolves only after the child's guard is dropped.
#[test]
fn child_guard_racing_parent_cancel() {
    model("child_guard_racing_parent_cancel", || {
        let parent = Scope::new();
        let child = parent.child().build().unwrap();
        let releasing = Arc::new(AtomicBool::new(false));

        let worker = {
            let releasing = releasing.clone();
            thread::spawn(move || {
                if let Ok(guard) = child.tether(()) {
                    releasing.store(true, Ordering::Relaxed);
                    drop(guard);
                    true
                } else {
                    false
                }
            })
        };
        parent.cancel();
        let _report = loom::future::block_on(parent.quiesce());
        // Read the flag only now: if the guard was taken, quiesce() must have waited for it.
        let saw_release = releasing.load(Ordering::Relaxed);
        let tethered = worker.join().unwrap();
        if tethered {
            assert!(saw_release, "parent quiet while the child's guard was held");
        }
    });
}

/// Model 14: the last receipt of a closed scope (which completes it) races a cancel.
///
/// Invariant 6: `Completed` and `CancelledStable` are final. Whichever comes first decides
/// the state: the cancel reaches the scope only while it still has work (then it ends
/// `CancelledStable`), and a cancel that finds it already quiet leaves it `Completed`. The
/// report read when `quiesce()` resolves never changes afterwards, and `cancel` says `true`
/// exactly when it cancelled.
#[test]
fn cancel_racing_completion() {
    model("cancel_racing_completion", || {
        let scope = Scope::new();
        let job = scope
            .register(ChildSpec::read_only("job"))
            .unwrap()
            .dispatch()
            .unwrap();
        scope.close();

        let finisher = thread::spawn(move || job.succeed());
        let canceller = {
            let scope = scope.clone();
            thread::spawn(move || scope.cancel_because(cancel_scope::Cause::ClientGone))
        };
        let report = loom::future::block_on(scope.quiesce());
        finisher.join().unwrap();
        let cancelled = canceller.join().unwrap();

        assert_eq!(report.succeeded(), 1);
        let expected = if cancelled {
            Lifecycle::CancelledStable
        } else {
            Lifecycle::Completed
        };
        assert_eq!(report.state(), expected);
        assert_eq!(scope.is_cancelled(), cancelled);
        assert_eq!(loom::future::block_on(scope.quiesce()), report);
    });
}
