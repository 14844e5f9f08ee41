//! loom models of a quarantined shield: the report of the scope whose quarantine stops a
//! shielded cleanup never loses an effect the cleanup left open in its own scope, whoever is
//! recording that effect's receipt as the quarantine comes (docs/design.md invariants 5 and 6).
//!
//! A shield runs its cleanup under a root scope of its own (a separate tree), so the scope's
//! quiet does not wait for the receipts of the cleanup's children: its quarantine copies the
//! effects they left unknown into the scope's report when it stops the cleanup. A receipt
//! that was won (by its owner, or by the cleanup scope's own quarantine) but whose record was
//! not written yet counts as a pending effect (a false alarm is acceptable, a lost effect is
//! not). `Scope::__shield_of` arms the shield's stop on its ticket as a shield's task does,
//! without the task (no tokio under loom); `Scope::__quarantine_now` is the end of the grace
//! period.
#![cfg(loom)]

use cancel_scope::{ChildSpec, Dispatched, Lifecycle, Report, Scope};
use cancel_scope_loom_tests::model;
use loom::thread;

/// The scope's report lists the cleanup's effect `pay-1` for reconciliation, once, and
/// counts the shield quarantined.
fn assert_the_effect_is_pending(report: &Report) {
    assert_eq!((report.total(), report.quarantined()), (1, 1), "{report}");
    let pending = report.pending_effects();
    assert_eq!(
        pending.len(),
        1,
        "the cleanup's effect was lost: {report:?}"
    );
    assert_eq!(pending[0].effect_id(), "pay-1");
    assert_eq!(report.state(), Lifecycle::NeedsReconciliation);
}

/// A scope with a shield whose cleanup's own scope has dispatched a side-effecting call
/// (`pay-1`): the scope, the cleanup's scope, the call and the shield's ticket.
fn a_shield_with_a_call() -> (Scope, Scope, Dispatched, Dispatched) {
    let scope = Scope::new();
    let cleanup = Scope::new();
    let pay = cleanup
        .register(ChildSpec::side_effecting("pay", "pay-1"))
        .unwrap()
        .dispatch()
        .unwrap();
    let shield = scope.__shield_of(&cleanup).unwrap();
    (scope, cleanup, pay, shield)
}

/// Drops `call` (the owner's end of the cleanup's call, `EffectUnknown` when dropped) on
/// another thread while `scope` is cancelled and its grace period ends (which quarantines
/// `shield` and so stops the cleanup); checks the report, and that it never changes.
fn dropped_as_the_shield_is_quarantined<T: Send + 'static>(
    scope: &Scope,
    shield: Dispatched,
    call: T,
) {
    let owner = thread::spawn(move || drop(call));
    scope.cancel();
    scope.__quarantine_now();
    let report = loom::future::block_on(scope.quiesce());
    owner.join().unwrap();

    assert_the_effect_is_pending(&report);
    drop(shield);
    assert_eq!(loom::future::block_on(scope.quiesce()), report);
}

/// Model 43: the cleanup's side-effecting call ends without an answer (its handle dropped:
/// `EffectUnknown`) on one thread while the scope is cancelled and its grace period ends on
/// the other, which quarantines the shield and so stops the cleanup.
///
/// The owner wins its receipt by the ticket's state CAS and then writes its record in the
/// cleanup's scope; the quarantine walks the cleanup's subtree and then reads the records.
/// Between the two steps of the owner the walk finds the ticket decided (not its own to
/// quarantine) and the record not there yet: it counts the ticket, still listed, as a pending
/// effect. Without that the report says `CancelledStable` although the call may have charged.
#[test]
fn a_receipt_recorded_as_the_shield_is_quarantined() {
    model("a_receipt_recorded_as_the_shield_is_quarantined", || {
        let (scope, _cleanup, pay, shield) = a_shield_with_a_call();
        dropped_as_the_shield_is_quarantined(&scope, shield, pay);
    });
}

/// Model 44: the cleanup's own scope is quarantined by its own `quiesce()` (its grace period
/// after its budget ran out ended) on one thread, while the scope's quarantine stops the
/// shield on the other. The cleanup's quarantine wins the call's receipt and then writes its
/// record; the shield's quarantine in between finds the call decided and counts it.
#[test]
fn the_cleanups_own_quarantine_racing_the_shields() {
    model("the_cleanups_own_quarantine_racing_the_shields", || {
        let (scope, cleanup, pay, shield) = a_shield_with_a_call();

        let own = {
            let cleanup = cleanup.clone();
            thread::spawn(move || {
                cleanup.cancel();
                cleanup.__quarantine_now();
            })
        };
        scope.cancel();
        scope.__quarantine_now();
        let report = loom::future::block_on(scope.quiesce());
        own.join().unwrap();

        assert_the_effect_is_pending(&report);
        // The call's late end changes nothing: it was quarantined.
        drop(pay);
        drop(shield);
        assert_eq!(loom::future::block_on(scope.quiesce()), report);
    });
}

/// Model 45: as model 43, for a child of the cleanup that is its own ticket (a retry attempt
/// of a side-effecting call, `__child_dispatched`), whose owner drops it (`EffectUnknown`)
/// while the shield is quarantined. Its receipt is won by a CAS of the attempt's own state and
/// then recorded in the cleanup's scope; the walk in between finds it ended and not recorded,
/// and counts it.
#[test]
fn an_attempts_receipt_recorded_as_the_shield_is_quarantined() {
    model(
        "an_attempts_receipt_recorded_as_the_shield_is_quarantined",
        || {
            let scope = Scope::new();
            let cleanup = Scope::new();
            let (attempt, ticket) = cleanup
                .__child_dispatched(&ChildSpec::side_effecting("pay", "pay-1"))
                .unwrap();
            drop(attempt);
            let shield = scope.__shield_of(&cleanup).unwrap();
            dropped_as_the_shield_is_quarantined(&scope, shield, ticket);
        },
    );
}
