//! loom models 26–29 (written by an independent review of the one-node attempt): nested
//! attempts (an attempt inside an attempt), the own ticket as the last handle of its scope,
//! quarantines rooted at the attempt's own scope versus at the request, and hedged attempts.
#![cfg(loom)]

use cancel_scope::{ChildSpec, Lifecycle, Scope};
use cancel_scope_loom_tests::{assert_one_success_one_unknown_effect, model};
use loom::thread;

/// A quarantine rooted at an attempt's own scope `a` (cancelled, grace over) takes the tickets
/// of its subtree (the inner attempt `b`) but never `a`'s own ticket, which belongs to the
/// request. The owners of both record on another thread. Whatever wins: `a`'s report counts
/// `b` once and never `a`; the request counts both once, `a`'s as its owner's.
#[test]
fn quarantine_at_the_attempt_scope_leaves_its_own_ticket() {
    model(
        "quarantine_at_the_attempt_scope_leaves_its_own_ticket",
        || {
            let request = Scope::new();
            let (a_scope, a) = request
                .__child_dispatched(&ChildSpec::read_only("a"))
                .unwrap();
            let (b_scope, b) = a_scope
                .__child_dispatched(&ChildSpec::read_only("b"))
                .unwrap();
            drop(b_scope);
            let owner = thread::spawn(move || {
                b.succeed();
                a.succeed();
            });
            a_scope.cancel();
            let q = a_scope.__quarantine_now();
            assert!(
                q <= 1,
                "the attempt's own ticket quarantined in its own scope"
            );
            let a_report = loom::future::block_on(a_scope.quiesce());
            assert_eq!(a_report.total(), 1, "{a_report:?}");
            assert_eq!(a_report.quarantined(), q as u64);
            owner.join().unwrap();
            assert_eq!(loom::future::block_on(a_scope.quiesce()), a_report);

            request.close();
            let r = loom::future::block_on(request.quiesce());
            assert_eq!(r.total(), 2, "{r:?}");
            assert_eq!(r.quarantined(), q as u64);
            assert_eq!(r.succeeded(), 2 - q as u64);
            assert_eq!(r.state(), Lifecycle::Completed);
            drop(a_scope);
            assert_eq!(request.__live_children(), 0);
        },
    );
}

/// A request with an attempt `a` and an attempt `b` inside it, both own tickets the last
/// handles of their scopes, dropped/succeeding on one thread while the request is cancelled,
/// quarantined and quiesced on another. One receipt per ticket (`b` counted in `a` and the
/// request, `a` in the request), the side effect listed once, the report stable, and both
/// nodes unlinked once at the end (invariant 7).
#[test]
fn nested_attempts_racing_the_request_quarantine() {
    model("nested_attempts_racing_the_request_quarantine", || {
        let request = Scope::new();
        let (a_scope, a) = request
            .__child_dispatched(&ChildSpec::side_effecting("pay", "pay-1"))
            .unwrap();
        let (b_scope, b) = a_scope
            .__child_dispatched(&ChildSpec::read_only("b"))
            .unwrap();
        drop((a_scope, b_scope));
        let owner = thread::spawn(move || {
            b.succeed();
            // No receipt: `EffectUnknown`, unless quarantined first.
            drop(a);
        });
        request.cancel();
        let q = request.__quarantine_now();
        let report = loom::future::block_on(request.quiesce());
        owner.join().unwrap();
        assert_one_success_one_unknown_effect(&report, q, "pay-1");
        assert_eq!(loom::future::block_on(request.quiesce()), report);
        assert_eq!(request.__live_children(), 0);
    });
}

/// An attempt `b` started inside a running attempt `a` (its unit CAS is in `a`, which holds a
/// unit of the request for its own ticket) while the request is cancelled, quarantined and quiesced on
/// another thread; `b`'s owner stalls until after that. A `b` that started was found by the
/// quarantine (else `quiesce()` waits for a receipt that comes after it: deadlock), one that
/// was refused gave back both units.
#[test]
fn inner_attempt_start_racing_request_cancel_and_quarantine() {
    model(
        "inner_attempt_start_racing_request_cancel_and_quarantine",
        || {
            let request = Scope::new();
            let (a_scope, a) = request
                .__child_dispatched(&ChildSpec::read_only("a"))
                .unwrap();
            let starter = {
                let a_scope = a_scope.clone();
                thread::spawn(move || a_scope.__child_dispatched(&ChildSpec::read_only("b")))
            };
            request.cancel();
            let q = request.__quarantine_now();
            let report = loom::future::block_on(request.quiesce());
            let b = starter.join().unwrap();
            let started = b.is_ok();
            if let Ok((b_scope, b)) = b {
                assert!(b_scope.is_cancelled());
                b.succeed();
            } else {
                assert!(b.unwrap_err().is_cancelled());
            }
            a.succeed();
            assert_eq!(q, 1 + usize::from(started), "{report:?}");
            assert_eq!(report.total(), q as u64);
            assert_eq!(report.state(), Lifecycle::CancelledStable);
            assert_eq!(loom::future::block_on(request.quiesce()), report);
            drop(a_scope);
            assert_eq!(request.__live_children(), 0);
        },
    );
}

/// Hedged attempts (or fan-out branches): two attempts of one request end on two threads (one
/// succeeds, one is dropped with its outcome unknown) while the request is cancelled,
/// quarantined and quiesced on a third. One receipt each, the effect listed once, report
/// stable, both nodes unlinked.
#[test]
fn hedged_attempts_ending_on_two_threads_racing_quarantine() {
    cancel_scope_loom_tests::model_bounded(
        "hedged_attempts_ending_on_two_threads_racing_quarantine",
        cancel_scope_loom_tests::THREE_THREAD_PREEMPTIONS,
        || {
            let request = Scope::new();
            let (s1, first) = request
                .__child_dispatched(&ChildSpec::read_only("first"))
                .unwrap();
            let (s2, hedge) = request
                .__child_dispatched(&ChildSpec::side_effecting("hedge", "h-1"))
                .unwrap();
            drop((s1, s2));
            let t1 = thread::spawn(move || first.succeed());
            let t2 = thread::spawn(move || drop(hedge));
            request.cancel();
            let q = request.__quarantine_now();
            let report = loom::future::block_on(request.quiesce());
            t1.join().unwrap();
            t2.join().unwrap();
            assert_eq!(report.total(), 2, "{report:?}");
            assert_eq!(report.quarantined(), q as u64);
            assert_eq!(report.pending_effects().len(), 1, "{report:?}");
            assert_eq!(loom::future::block_on(request.quiesce()), report);
            assert_eq!(request.__live_children(), 0);
        },
    );
}
