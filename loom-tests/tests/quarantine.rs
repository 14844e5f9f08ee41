//! loom models of quarantine: the grace period of `quiesce()` ending while a child records its
//! own receipt (docs/design.md invariants 5 and 6).
//!
//! `quiesce()` has no timer under loom; `Scope::__quarantine_now` runs the step it takes when
//! the grace period after a cancel ends.
#![cfg(loom)]

use cancel_scope::{ChildSpec, Scope};
use cancel_scope_loom_tests::{assert_one_success_one_unknown_effect, model};
use loom::sync::{Arc, Mutex};
use loom::thread;

/// Model 12: two dispatched children — a read-only one that succeeds late and a
/// side-effecting one whose handle is dropped (its outcome unknown) — finish on one thread
/// while the scope is cancelled, quarantined and quiesced on another.
///
/// Invariant 5: each child ends with exactly one receipt, its own or `Quarantined`, whoever
/// wins the ticket's state CAS; the side effect is listed for reconciliation exactly once
/// (as `EffectUnknown`, or as a quarantined child that may have had an effect). Invariant 6:
/// the report read as soon as `quiesce()` resolves is the one read after the late receipts
/// were attempted.
#[test]
fn receipt_racing_quarantine() {
    model("receipt_racing_quarantine", || {
        let scope = Scope::new();
        let read = scope
            .register(ChildSpec::read_only("read"))
            .unwrap()
            .dispatch()
            .unwrap();
        let pay = scope
            .register(ChildSpec::side_effecting("pay", "pay-1"))
            .unwrap()
            .dispatch()
            .unwrap();

        let owner = thread::spawn(move || {
            read.succeed();
            drop(pay);
        });
        scope.cancel();
        let quarantined = scope.__quarantine_now();
        let report = loom::future::block_on(scope.quiesce());
        owner.join().unwrap();

        // Invariant 5: one receipt per child, whoever won; the unknown effect listed once.
        assert_one_success_one_unknown_effect(&report, quarantined, "pay-1");
        // Invariant 6: the late receipts changed nothing.
        assert_eq!(loom::future::block_on(scope.quiesce()), report);
    });
}

/// Model 40: a child is registered on one thread while the scope is cancelled, quarantined
/// and quiesced on another; its owner then holds the ticket (it neither dispatches nor drops
/// it before the quiesce is over), as a stuck owner would.
///
/// The registration takes its unit and then lists the ticket, and the cancel and the
/// quarantine can both fall between the two. The ticket is then ended by the quarantine
/// (listed first; `Cancelled`, as it was never dispatched) or refused (the quarantine took
/// the list first); a quarantine that missed it would leave `quiesce()` waiting for the
/// owner to drop it, a deadlock here. Invariant 6: the report read as soon as `quiesce()`
/// resolves stays the same when the held ticket is dropped.
#[test]
fn register_racing_cancel_and_quarantine() {
    model("register_racing_cancel_and_quarantine", || {
        let scope = Scope::new();
        let held = Arc::new(Mutex::new(None));
        let owner = {
            let (scope, held) = (scope.clone(), held.clone());
            thread::spawn(move || match scope.register(ChildSpec::read_only("late")) {
                Ok(ticket) => *held.lock().unwrap() = Some(ticket),
                Err(e) => assert!(e.is_cancelled(), "refused as cancelled, not {e}"),
            })
        };
        scope.cancel();
        scope.__quarantine_now();
        let report = loom::future::block_on(scope.quiesce());
        owner.join().unwrap();

        let ticket = held.lock().unwrap().take();
        // Held: it was listed before the quarantine, which ended it (`Cancelled`: it was never
        // dispatched, and now never can be). Refused: no receipt.
        let expected = u64::from(ticket.is_some());
        assert_eq!(
            (report.total(), report.cancelled(), report.quarantined()),
            (expected, expected, 0),
            "{report}"
        );
        if let Some(ticket) = ticket {
            assert!(ticket.dispatch().is_err(), "no dispatch after the cancel");
        }
        assert_eq!(loom::future::block_on(scope.quiesce()), report);
    });
}

/// The message of the callback that panics in model 41.
const CALLBACK_PANIC: &str = "on_cancel callback panics";

/// Runs `f`; `true` if it panicked with [`CALLBACK_PANIC`] (any other panic, loom's own
/// included, goes on unwinding). That panic is not printed.
fn ran_panicking_callback(f: impl FnOnce()) -> bool {
    static QUIET_HOOK: std::sync::Once = std::sync::Once::new();
    QUIET_HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&CALLBACK_PANIC) {
                default(info);
            }
        }));
    });
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(()) => false,
        Err(p) if p.downcast_ref::<&str>() == Some(&CALLBACK_PANIC) => true,
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// Model 41: a child scope with a panicking `on_cancel` callback and a ticket its owner
/// holds; the root is cancelled on one thread and, as soon as it reads cancelled, quarantined
/// and quiesced on another.
///
/// The quarantine walks the root's cancel through the subtree first (model 38), and that walk
/// may be the one that reaches the child and runs its callback. The callback runs exactly
/// once, and its panic comes out of whichever call ran it; a quarantine that ran it has
/// ended the ticket all the same (a panic that skipped it would leave `quiesce()`
/// waiting for the held ticket: a deadlock here).
#[test]
fn panicking_callback_in_the_quarantine_walk() {
    model("panicking_callback_in_the_quarantine_walk", || {
        let scope = Scope::new();
        let child = scope.child().build().unwrap();
        let _callback = child.on_cancel(|_| std::panic::panic_any(CALLBACK_PANIC));
        let ticket = child.register(ChildSpec::read_only("stuck")).unwrap();
        let canceller = {
            let scope = scope.clone();
            thread::spawn(move || ran_panicking_callback(|| scope.cancel_with("stop")))
        };
        while !scope.is_cancelled() {
            thread::yield_now();
        }
        let quarantine_ran_it = ran_panicking_callback(|| {
            scope.__quarantine_now();
        });
        let report = loom::future::block_on(scope.quiesce());
        let cancel_ran_it = canceller.join().unwrap();

        assert!(
            quarantine_ran_it != cancel_ran_it,
            "the callback ran once: quarantine {quarantine_ran_it}, cancel {cancel_ran_it}"
        );
        // The held ticket was never dispatched: the quarantine ends it `Cancelled`.
        assert_eq!((report.total(), report.cancelled()), (1, 1), "{report}");
        drop(ticket);
        assert_eq!(loom::future::block_on(scope.quiesce()), report);
    });
}

/// Model 42: the owner of a dispatched child waits to hear of its quarantine (as a shield's
/// task does, along with its cleanup) on one thread, while the scope is cancelled and
/// quarantined on another.
///
/// The quarantine moves the ticket's state and then takes the owner's waker under the
/// ticket's lock; the owner keeps its waker and then reads the state under that lock: the
/// owner is woken whichever comes first (a lost wake-up is a deadlock here), and the quarantine
/// is the child's one receipt.
#[test]
fn quarantine_wakes_the_owner_waiting_for_it() {
    model("quarantine_wakes_the_owner_waiting_for_it", || {
        let scope = Scope::new();
        let dispatched = scope
            .register(ChildSpec::read_only("cleanup"))
            .unwrap()
            .dispatch()
            .unwrap();
        let owner = thread::spawn(move || {
            loom::future::block_on(dispatched.__quarantined());
            assert!(dispatched.is_quarantined());
            dispatched.succeed();
        });
        scope.cancel();
        assert_eq!(scope.__quarantine_now(), 1);
        owner.join().unwrap();
        let report = loom::future::block_on(scope.quiesce());
        assert_eq!((report.total(), report.quarantined()), (1, 1), "{report}");
    });
}
