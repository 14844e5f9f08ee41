//! loom models of quarantine: the grace period of `quiesce()` ending while a child records its
//! own receipt (DESIGN.md invariants 5 and 6).
//!
//! `quiesce()` has no timer under loom; `Scope::__quarantine_now` runs the step it takes when
//! the grace period after a cancel ends.
#![cfg(loom)]

use cancel_scope::{ChildSpec, Scope};
use cancel_scope_loom_tests::{assert_one_success_one_unknown_effect, model};
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
