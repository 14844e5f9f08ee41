//! The grace period: work that ignores its scope's cancel is quarantined when the grace
//! period after the cancel ends, and the shorter grace period of a scope below holds,
//! whichever scope's `quiesce()` waits (the races of cancel walks and quiesces are in
//! `racing_cancels` and `handover`).

use std::time::Duration;

use cancel_scope::{ChildSpec, Dispatched, Lifecycle, Scope};
use futures::FutureExt;

use crate::support::time::ms;

#[tokio::test(start_paused = true)]
async fn a_read_only_child_that_ignores_cancel_is_quarantined_after_grace() {
    let s = Scope::new()
        .child()
        .grace(Duration::from_millis(100))
        .build()
        .unwrap();
    let stuck = s
        .register(ChildSpec::read_only("stuck"))
        .unwrap()
        .dispatch()
        .unwrap();
    s.cancel();
    let start = tokio::time::Instant::now();
    let report = s.quiesce().await;
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    assert_eq!(report.quarantined(), 1);
    assert_eq!(report.state(), Lifecycle::CancelledStable);
    assert!(stuck.is_quarantined());
    stuck.succeed(); // ignored
    assert_eq!(s.quiesce().await, report);
}

#[tokio::test(start_paused = true)]
async fn a_quarantined_side_effect_needs_reconciliation() {
    let s = Scope::new()
        .child()
        .grace(Duration::from_millis(10))
        .build()
        .unwrap();
    let stuck = s
        .register(ChildSpec::side_effecting("pay", "p-1"))
        .unwrap()
        .dispatch()
        .unwrap();
    s.cancel();
    let report = s.quiesce().await;
    assert_eq!(report.state(), Lifecycle::NeedsReconciliation);
    assert_eq!(report.pending_effects()[0].effect_id(), "p-1");
    drop(stuck);
    assert_eq!(s.quiesce().await, report);
}

/// A side-effecting child registered but never dispatched, held past the grace period: the
/// quarantine ends it (it can never be dispatched now), but it sent nothing, so it is
/// `Cancelled`, not quarantined work with an unknown effect.
// regression: the report was `NeedsReconciliation` for an effect that cannot have happened.
#[tokio::test(start_paused = true)]
async fn a_side_effect_never_dispatched_is_cancelled_not_unknown_at_the_grace_end() {
    let s = Scope::new()
        .child()
        .grace(Duration::from_millis(10))
        .build()
        .unwrap();
    let held = s.register(ChildSpec::side_effecting("pay", "p-2")).unwrap();
    s.cancel();
    let report = s.quiesce().await;
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
    assert_eq!(
        (report.cancelled(), report.quarantined()),
        (1, 0),
        "{report}"
    );
    assert!(report.pending_effects().is_empty(), "{report}");
    assert!(report.quarantined_children().is_empty(), "{report}");
    assert!(held.dispatch().is_err(), "dispatched after quiesce");
    assert_eq!(s.quiesce().await, report);
}

/// A child of `parent` with a grace period of `grace_ms` (and a timeout of `timeout_ms`), and
/// a dispatched child `spec` of it whose work ignores the cancel.
fn child_with_stuck_work(
    parent: &Scope,
    grace_ms: u64,
    timeout_ms: Option<u64>,
    spec: ChildSpec,
) -> (Scope, Dispatched) {
    let mut builder = parent.child().grace(Duration::from_millis(grace_ms));
    if let Some(t) = timeout_ms {
        builder = builder.cap(Duration::from_millis(t));
    }
    let child = builder.build().unwrap();
    let stuck = child.register(spec).unwrap().dispatch().unwrap();
    (child, stuck)
}

/// A closed (not cancelled) parent's `quiesce()` over a cancelled child whose work ignores the
/// cancel: the child's work is quarantined when the child's own grace period ends, as the
/// child's `quiesce()` would (before, the parent's waited for ever).
#[tokio::test(start_paused = true)]
async fn a_closed_parent_quiesces_over_a_cancelled_child_whose_work_is_stuck() {
    let parent = Scope::new();
    let (child, stuck) = child_with_stuck_work(
        &parent,
        10,
        None,
        ChildSpec::side_effecting("ignores the cancel", "pay-1"),
    );
    parent.close();
    child.cancel();
    let start = tokio::time::Instant::now();
    let report = tokio::time::timeout(Duration::from_secs(3600), parent.quiesce())
        .await
        .expect("the closed parent's quiesce() waits for ever");
    assert_eq!(start.elapsed(), Duration::from_millis(10));
    assert_eq!(report.quarantined(), 1, "{report}");
    assert_eq!(report.state(), Lifecycle::NeedsReconciliation);
    assert!(stuck.is_quarantined());
    drop(stuck);
    assert_eq!(parent.quiesce().await, report);
}

/// The same with the child cancelled while the parent's `quiesce()` already waits, by its
/// deadline and by an explicit cancel: each cancel wakes the wait, which then waits out that
/// child's grace period.
#[tokio::test(start_paused = true)]
async fn a_waiting_quiesce_learns_of_a_later_cancel_below_it() {
    let parent = Scope::new();
    let (by_deadline, _a) =
        child_with_stuck_work(&parent, 10, Some(100), ChildSpec::read_only("a"));
    let (by_cancel, _b) = child_with_stuck_work(&parent, 30, None, ChildSpec::read_only("b"));
    parent.close();
    let start = tokio::time::Instant::now();
    let waiting = tokio::spawn({
        let parent = parent.clone();
        async move { parent.quiesce().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The deadline's grace period ended at 110 ms: `a` is quarantined, `b` still runs.
    assert!(!waiting.is_finished());
    assert_eq!(by_deadline.lifecycle(), Lifecycle::CancelledStable);
    by_cancel.cancel();
    let report = tokio::time::timeout(Duration::from_secs(3600), waiting)
        .await
        .expect("the waiting quiesce() never learned of the cancel")
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(230));
    assert_eq!(report.quarantined(), 2, "{report}");
    assert_eq!(report.state(), Lifecycle::Completed);
}

/// Nested cancelled scopes with different grace periods: `inner` (grace 10 ms) is cancelled
/// first, its parent `mid` (grace 1 h) 5 ms later. The stuck work of `inner` is quarantined
/// when `inner`'s grace period ends, as `inner`'s own `quiesce()` would: the later cancel of
/// `mid` does not lengthen it. The same whether the closed top's `quiesce()` waited before
/// the cancels (handed over) or started after them (looked up).
#[tokio::test(start_paused = true)]
async fn a_closed_parent_quarantines_a_nested_cancelled_child_at_its_own_grace_end() {
    for waits_before in [true, false] {
        let top = Scope::new();
        let mid = top
            .child()
            .grace(Duration::from_secs(3600))
            .build()
            .unwrap();
        let (inner, _stuck) = child_with_stuck_work(&mid, 10, None, ChildSpec::read_only("s"));
        top.close();
        let start = tokio::time::Instant::now();
        let quiesce = || {
            let top = top.clone();
            tokio::spawn(async move { top.quiesce().await })
        };
        let early = waits_before.then(quiesce);
        inner.cancel();
        tokio::time::sleep(Duration::from_millis(5)).await;
        mid.cancel();
        let waiting = early.unwrap_or_else(quiesce);
        let report = waiting.await.unwrap();
        assert_eq!(
            start.elapsed(),
            ms(10),
            "waits before: {waits_before}, {report}"
        );
        assert_eq!(report.quarantined(), 1, "{report}");
    }
}

/// A cancelled scope's own `quiesce()` also takes the shorter grace period of a child
/// cancelled before it: the child's stuck work is quarantined at the child's grace end
/// (10 ms), not at the parent's (1 h after its own cancel).
#[tokio::test(start_paused = true)]
async fn a_cancelled_scopes_quiesce_keeps_the_shorter_grace_of_a_child_cancelled_before() {
    let parent = Scope::new()
        .child()
        .grace(Duration::from_secs(3600))
        .build()
        .unwrap();
    let (child, _stuck) = child_with_stuck_work(&parent, 10, None, ChildSpec::read_only("s"));
    let start = tokio::time::Instant::now();
    child.cancel();
    tokio::time::sleep(ms(5)).await;
    parent.cancel();
    let report = parent.quiesce().await;
    assert_eq!(start.elapsed(), ms(10), "{report}");
    assert_eq!(report.quarantined(), 1, "{report}");
}

/// A cancel that reaches a child scope through its parent gives the child's work the
/// shorter of the two grace periods, whichever scope's `quiesce()` waits, including a
/// `quiesce()` that was already waiting when the parent was cancelled.
#[tokio::test(start_paused = true)]
async fn a_parents_cancel_gives_the_work_below_the_shorter_of_the_two_grace_periods() {
    for (parent_grace, child_grace) in [(3600, 10), (10, 3600)] {
        for waits_before in [true, false] {
            let parent = Scope::new()
                .child()
                .grace(ms(parent_grace))
                .build()
                .unwrap();
            let (_child, _stuck) =
                child_with_stuck_work(&parent, child_grace, None, ChildSpec::read_only("s"));
            parent.close();
            let quiesce = || {
                let parent = parent.clone();
                tokio::spawn(async move { parent.quiesce().await })
            };
            let early = waits_before.then(quiesce);
            tokio::task::yield_now().await;
            let start = tokio::time::Instant::now();
            parent.cancel();
            let report = early.unwrap_or_else(quiesce).await.unwrap();
            assert_eq!(
                start.elapsed(),
                ms(10),
                "grace {parent_grace}/{child_grace} ms, waits before: {waits_before}: {report}"
            );
            assert_eq!(report.quarantined(), 1, "{report}");
        }
    }
}

/// The same when the child's own `quiesce()` waits: the parent's cancel reaches the child,
/// and the parent's grace period, which ends first, holds for the child's work too ("the
/// grace period that ends first holds for the work below both"). Before, the child's
/// `quiesce()` looked only at the scopes of its own subtree and waited for the child's own
/// grace period, an hour here, where the parent's `quiesce()` took 10 ms.
#[tokio::test(start_paused = true)]
async fn a_childs_own_quiesce_keeps_the_shorter_grace_of_the_cancelled_parent() {
    for waits_before in [true, false] {
        let parent = Scope::new().child().grace(ms(10)).build().unwrap();
        let (child, _stuck) =
            child_with_stuck_work(&parent, 3_600_000, None, ChildSpec::read_only("s"));
        let quiesce = || {
            let child = child.clone();
            tokio::spawn(async move { child.quiesce().await })
        };
        let early = waits_before.then(quiesce);
        tokio::task::yield_now().await;
        let start = tokio::time::Instant::now();
        parent.cancel();
        let waiting = early.unwrap_or_else(quiesce);
        let report = tokio::time::timeout(ms(60_000), waiting)
            .await
            .unwrap_or_else(|_| panic!("waits before: {waits_before}: still waiting after 60 s"))
            .unwrap();
        assert_eq!(
            start.elapsed(),
            ms(10),
            "waits before: {waits_before}: {report}"
        );
        assert_eq!(report.quarantined(), 1, "{report}");
    }
}

/// Control: awaiting the cancelled child's own `quiesce()` quarantines its stuck work, and the
/// parent's then resolves at once.
#[tokio::test(start_paused = true)]
async fn the_cancelled_childs_own_quiesce_unblocks_the_closed_parent() {
    let parent = Scope::new();
    let (child, _stuck) = child_with_stuck_work(
        &parent,
        10,
        None,
        ChildSpec::read_only("ignores the cancel"),
    );
    parent.close();
    child.cancel();
    let start = tokio::time::Instant::now();
    assert_eq!(child.quiesce().await.quarantined(), 1);
    let report = parent.quiesce().await;
    assert_eq!(start.elapsed(), Duration::from_millis(10));
    assert_eq!(report.quarantined(), 1, "{report}");
}

/// A `quiesce()` that started waiting before the cancel still quarantines the stuck children
/// once the grace period after the cancel has ended.
// regression: the cancel never woke the waiting quiesce(), so its grace period never began.
#[tokio::test(start_paused = true)]
async fn a_quiesce_started_before_the_cancel_still_quarantines_after_grace() {
    let s = Scope::new();
    let stuck = s
        .register(ChildSpec::read_only("stuck"))
        .unwrap()
        .dispatch()
        .unwrap();
    let q = tokio::spawn({
        let s = s.clone();
        async move { s.quiesce().await }
    });
    tokio::task::yield_now().await; // the quiesce task polls once: registered, not cancelled
    s.cancel();
    // grace is 1 s: after 10 s the stuck child must have been quarantined
    let r = tokio::time::timeout(Duration::from_secs(10), q).await;
    // control: a quiesce started after the cancel does finish
    let late = tokio::time::timeout(Duration::from_secs(10), s.quiesce()).await;
    drop(stuck);
    assert!(late.is_ok(), "control: quiesce after cancel finishes");
    assert!(
        r.is_ok(),
        "quiesce started before the cancel hung past the grace period"
    );
}

/// A huge grace period (`Duration::MAX`) does not make `quiesce()` panic.
// regression: `Instant + Duration` overflowed inside `Quiesce::poll`.
#[tokio::test]
async fn a_huge_grace_period_does_not_panic() {
    let root = Scope::new();
    let s = root.child().grace(Duration::MAX).build().unwrap();
    let _t = s.register(ChildSpec::read_only("r")).unwrap();
    s.cancel();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.quiesce().now_or_never()));
    assert!(r.is_ok(), "quiesce panicked on grace(Duration::MAX)");
}
