//! loom models of a retry attempt (or fan-out branch): a child scope that is itself a
//! dispatched child of its parent, in one node (`build_dispatched`, see `Call::start` in
//! `src/retry/attempt.rs`).
//!
//! Model 11: racing the scope's cancel, it never dispatches after it. Model 24: racing a close
//! and the quarantine at the end of the grace period, it is refused or found by the
//! quarantine. Model 25: its receipt racing a quarantine, one receipt each.
#![cfg(loom)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cancel_scope::{ChildSpec, Lifecycle, Receipt, Scope};
use cancel_scope_loom_tests::{assert_one_success_one_unknown_effect, model};
use loom::thread;

/// Model 11: the attempt's start (`__child_dispatched`: the unit CAS in the request, which is
/// the dispatch, then the child linked under the registry lock) races the request's cancel.
///
/// Invariant 2: either the attempt is refused (nothing was sent), or it was dispatched before
/// the cancel — the canceller sees the witness flag written (`Relaxed`) just before the start,
/// which only the happens-before edge between the unit CAS and the cancel's read-modify-write
/// of the same state word makes visible — and the cancel reached the attempt's scope. The
/// request ends `CancelledStable` with the attempt's one receipt.
#[test]
fn attempt_never_dispatches_after_cancel() {
    model("attempt_never_dispatches_after_cancel", || {
        let request = Scope::new();
        let about_to_start = Arc::new(AtomicBool::new(false));
        let canceller = {
            let (request, flag) = (request.clone(), about_to_start.clone());
            thread::spawn(move || {
                request.cancel();
                flag.load(Ordering::Relaxed)
            })
        };
        about_to_start.store(true, Ordering::Relaxed);
        let attempt = request.__child_dispatched(&ChildSpec::idempotent("inventory", "order-42"));
        let saw_flag = canceller.join().unwrap();
        let started = attempt.is_ok();
        if let Ok((child, own)) = attempt {
            assert!(saw_flag, "an attempt dispatched after the cancel");
            // Dispatched before the cancel: the cancel reached the attempt.
            assert!(child.is_cancelled());
            own.finish(Receipt::Cancelled);
        }
        assert_eq!(request.lifecycle(), Lifecycle::CancelledStable);
        let report = loom::future::block_on(request.quiesce());
        assert_eq!(report.total(), u64::from(started));
    });
}

/// Model 24: an attempt starts on one thread while the request is closed, quarantined (the end
/// of a grace period) and quiesced on another, and its owner records its receipt only after
/// all that.
///
/// The attempt's unit is taken before the registry lock and the child is linked only if the
/// watermark is still open under that lock; the quarantine walks the registry under the same
/// locks after the close. So an attempt that started was found by the quarantine (otherwise
/// `quiesce()` would wait for a receipt that only comes after it: loom reports the deadlock),
/// and one that was refused gave its unit back. Invariant 5: one receipt, the quarantine's;
/// the owner's late one changes nothing (invariant 6).
#[test]
fn attempt_start_racing_close_and_quarantine() {
    model("attempt_start_racing_close_and_quarantine", || {
        let request = Scope::new();
        let starter = {
            let request = request.clone();
            thread::spawn(move || request.__child_dispatched(&ChildSpec::read_only("inventory")))
        };
        request.close();
        let quarantined = request.__quarantine_now();
        let report = loom::future::block_on(request.quiesce());
        let attempt = starter.join().unwrap();
        match attempt {
            Ok((_child, own)) => {
                assert_eq!(quarantined, 1, "a started attempt missed by the quarantine");
                own.succeed();
            }
            Err(e) => {
                assert!(e.is_closed());
                assert_eq!(quarantined, 0);
            }
        }
        assert_eq!(report.total(), quarantined as u64);
        assert_eq!(report.quarantined(), quarantined as u64);
        assert_eq!(loom::future::block_on(request.quiesce()), report);
    });
}

/// Model 25: as model 12 for attempts: a read-only attempt succeeding and a side-effecting one
/// dropped (its outcome unknown) on one thread, while the request is cancelled, quarantined
/// and quiesced on another.
///
/// Invariant 5: each attempt has exactly one receipt, its owner's or `Quarantined`, whoever
/// wins the CAS of the node's own-ticket state; the effect is listed for reconciliation exactly
/// once. Invariant 6: the report read when `quiesce()` resolved is the one read afterwards.
#[test]
fn attempt_receipt_racing_quarantine() {
    model("attempt_receipt_racing_quarantine", || {
        let request = Scope::new();
        let (read_scope, read) = request
            .__child_dispatched(&ChildSpec::read_only("read"))
            .unwrap();
        let (pay_scope, pay) = request
            .__child_dispatched(&ChildSpec::side_effecting("pay", "pay-1"))
            .unwrap();
        drop((read_scope, pay_scope));

        let owner = thread::spawn(move || {
            read.succeed();
            drop(pay);
        });
        request.cancel();
        let quarantined = request.__quarantine_now();
        let report = loom::future::block_on(request.quiesce());
        owner.join().unwrap();

        assert_one_success_one_unknown_effect(&report, quarantined, "pay-1");
        assert_eq!(loom::future::block_on(request.quiesce()), report);
    });
}
