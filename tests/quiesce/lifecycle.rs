//! A scope's way to quiet: close, cancel and work ending give `Completed` or
//! `CancelledStable`, `quiesce()` waits for it, and the report never changes once it resolved.

use std::time::Duration;

use cancel_scope::{ChildSpec, Lifecycle, Scope};
use futures::FutureExt;

#[tokio::test]
async fn lifecycle_goes_accepted_running_cancelling_cancelled_stable() {
    let s = Scope::new();
    assert_eq!(s.lifecycle(), Lifecycle::Accepted);
    let d = s
        .register(ChildSpec::read_only("r"))
        .unwrap()
        .dispatch()
        .unwrap();
    assert_eq!(s.lifecycle(), Lifecycle::Running);
    s.cancel();
    assert_eq!(s.lifecycle(), Lifecycle::Cancelling);
    assert!(s.quiesce().now_or_never().is_none());
    d.succeed();
    assert_eq!(s.lifecycle(), Lifecycle::CancelledStable);
    assert!(s.lifecycle().is_final());
}

#[tokio::test]
async fn a_closed_scope_completes_once_running_work_finishes() {
    let s = Scope::new();
    let d = s
        .register(ChildSpec::read_only("r"))
        .unwrap()
        .dispatch()
        .unwrap();
    s.close();
    assert_eq!(s.lifecycle(), Lifecycle::Running);
    let mut q = s.quiesce();
    assert!((&mut q).now_or_never().is_none());
    d.succeed();
    let r = q.await;
    assert_eq!(r.state(), Lifecycle::Completed);
    assert_eq!(r.cause(), None);
    assert_eq!(r.cancel_to_quiet(), None);
}

#[tokio::test]
async fn quiesce_without_close_waits() {
    let s = Scope::new();
    assert!(
        s.quiesce().now_or_never().is_none(),
        "an open scope is never quiet"
    );
    s.close();
    assert!(s.quiesce().now_or_never().is_some());
}

#[tokio::test]
async fn after_quiesce_nothing_starts_and_the_report_never_changes() {
    let root = Scope::new();
    let child = root.child().build().unwrap();
    let t = child.register(ChildSpec::read_only("r")).unwrap();
    root.cancel();
    drop(t);
    let report = root.quiesce().await;
    assert!(root.spawn(async {}).is_err());
    assert!(child.spawn(async {}).is_err());
    assert!(child.register(ChildSpec::read_only("late")).is_err());
    assert!(child.tether(()).is_err());
    assert!(root.child().build().is_err());
    assert!(root.shield(Duration::from_secs(1), async {}).is_err());
    assert_eq!(root.quiesce().await, report);
    assert_eq!(report.cancelled(), 1);
}

#[tokio::test]
async fn a_close_reaches_child_scopes() {
    let root = Scope::new();
    let child = root.child().build().unwrap();
    root.close();
    assert!(child.is_closed());
    assert!(child.spawn(async {}).unwrap_err().is_closed());
}

/// Completed is a final state: a deadline that passes after a closed scope became quiet (or a
/// later cancel) finds nothing to stop and changes neither its lifecycle nor its report.
// regression: the quiet request turned `CancelledStable` when its deadline passed (call trees).
#[tokio::test(start_paused = true)]
async fn a_completed_scope_stays_completed_when_its_deadline_passes_or_it_is_cancelled() {
    let s = Scope::with_timeout(Duration::from_millis(100));
    let child = s.child().build().unwrap();
    s.spawn(async {}).unwrap().await.unwrap();
    s.close();
    let report = s.quiesce().await;
    assert_eq!(report.state(), Lifecycle::Completed);

    tokio::time::sleep(Duration::from_millis(200)).await; // the deadline passes
    assert_eq!(s.lifecycle(), Lifecycle::Completed);
    assert!(!s.is_cancelled() && !child.is_cancelled());
    assert!(!s.cancel_because(cancel_scope::Cause::ClientGone));
    assert_eq!(s.quiesce().await, report, "the report never changes");
    assert_eq!(s.cause(), None);
}

/// A cancel after `quiesce()` resolved (closed, `Completed`) does not change the report.
// regression: the cancel changed the report of the completed scope.
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
