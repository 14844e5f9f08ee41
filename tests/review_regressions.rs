//! Regressions for the findings of an independent review of the core (each failed before
//! its fix).

use std::time::Duration;

use cancel_scope::{ChildSpec, Lifecycle, Receipt, Scope};
use futures::FutureExt;

/// F1: a quiesce() that started waiting before the cancel is never woken by the cancel, so
/// its grace period never starts and stuck children are never quarantined.
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

/// F2: a panicking on_cancel callback aborts the cancel walk: descendants stay uncancelled and
/// their waiters are never woken.
#[tokio::test]
async fn a_panicking_on_cancel_callback_does_not_stop_the_cancel_walk() {
    let root = Scope::new();
    let child = root.child().build().unwrap();
    let ticket = child.register(ChildSpec::read_only("t")).unwrap();
    let waiter = tokio::spawn({
        let c = child.clone();
        async move { c.cancelled().await }
    });
    tokio::task::yield_now().await;
    let _g = root.on_cancel(|_| panic!("user bug"));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| root.cancel()));
    assert!(r.is_err());
    assert!(root.is_cancelled());
    let child_cancelled = child.is_cancelled();
    let dispatched = ticket.dispatch().is_ok();
    let woke = tokio::time::timeout(Duration::from_millis(200), waiter)
        .await
        .is_ok();
    eprintln!(
        "child_cancelled={child_cancelled} dispatched_after_cancel={dispatched} waiter_woke={woke}"
    );
    assert!(
        child_cancelled && !dispatched && woke,
        "cancel walk aborted by callback panic"
    );
}

/// F2b: with a deadline the panic kills the shared timer driver: later deadlines in that tree
/// never fire.
#[tokio::test(start_paused = true)]
async fn a_panicking_callback_on_the_timer_does_not_kill_later_deadlines() {
    let root = Scope::with_timeout(Duration::from_secs(100));
    let a = root
        .child()
        .timeout(Duration::from_millis(10))
        .build()
        .unwrap();
    let _g = a.on_cancel(|_| panic!("user bug"));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(a.is_cancelled());
    let b = root
        .child()
        .timeout(Duration::from_millis(10))
        .build()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        b.is_cancelled(),
        "b's deadline never fired: timer driver is dead"
    );
}

/// F4: a quarantined child is reported with its registration-time spec: the provider handle
/// set on the Dispatched is lost from pending_effects.
#[tokio::test(start_paused = true)]
async fn a_quarantined_child_keeps_its_provider_handle() {
    let s = Scope::new();
    let mut d = s
        .register(ChildSpec::side_effecting("pay", "p-1"))
        .unwrap()
        .dispatch()
        .unwrap();
    d.set_provider_handle("psp-7");
    s.cancel();
    let r = s.quiesce().await; // grace 1 s, then quarantine
    assert_eq!(r.quarantined(), 1);
    assert_eq!(r.pending_effects().len(), 1);
    let handle = r.pending_effects()[0]
        .provider_handle_str()
        .map(str::to_owned);
    drop(d);
    assert_eq!(
        handle.as_deref(),
        Some("psp-7"),
        "provider handle lost on quarantine"
    );
}

/// F5: Dispatched::finish(Receipt::Quarantined) on side-effecting work is counted but not listed:
/// the report says CancelledStable with no pending effect.
#[tokio::test]
async fn a_quarantined_receipt_given_by_the_owner_is_listed() {
    let s = Scope::new();
    let d = s
        .register(ChildSpec::side_effecting("pay", "p-1"))
        .unwrap()
        .dispatch()
        .unwrap();
    s.cancel();
    d.finish(Receipt::Quarantined);
    let r = s.quiesce().await;
    assert_eq!(r.quarantined(), 1);
    assert_eq!(r.quarantined_children().len(), 1, "count and list disagree");
    assert_eq!(
        r.state(),
        Lifecycle::NeedsReconciliation,
        "unknown effect counted as none"
    );
}

/// F6: the report is not stable: close -> quiesce (Completed), then cancel changes it.
#[tokio::test]
async fn a_cancel_after_quiesce_does_not_change_the_report() {
    let s = Scope::new();
    s.close();
    let r1 = s.quiesce().await;
    let g1 = s.generation();
    s.cancel();
    let r2 = s.quiesce().await;
    eprintln!("r1={r1:?}\nr2={r2:?} gen {g1} -> {}", s.generation());
    assert_eq!(r1, r2, "report changed after quiesce resolved");
}

/// F7: orphan work counts never-dispatched tickets.
#[tokio::test(start_paused = true)]
async fn orphan_work_counts_only_dispatched_children() {
    let s = Scope::new();
    let t = s.register(ChildSpec::read_only("never-sent")).unwrap();
    s.cancel();
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(t);
    assert_eq!(
        s.quiesce().await.orphan_work(),
        Duration::ZERO,
        "nothing ran, yet orphan work > 0"
    );
}

/// F8: a huge grace overflows `Instant + Duration` inside Quiesce::poll.
#[tokio::test]
async fn a_huge_grace_period_does_not_panic() {
    let root = Scope::new();
    let s = root.child().grace(Duration::MAX).build().unwrap();
    let _t = s.register(ChildSpec::read_only("r")).unwrap();
    s.cancel();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.quiesce().now_or_never()));
    assert!(r.is_ok(), "quiesce panicked on grace(Duration::MAX)");
}
