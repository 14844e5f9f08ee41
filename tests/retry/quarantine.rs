//! A retry attempt is one node: the attempt's child scope and its ticket in the request's
//! scope. These tests check what that ticket still does: a stalled attempt is quarantined in
//! the request (invariant 5, listed for reconciliation when it may have had an effect), its
//! late end changes nothing (invariant 6), and the attempt is part of its own scope's work
//! (that scope is not quiet, and so not passed by a cancel, until the attempt has ended).

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use cancel_scope::retry::{Decision, Retry};
use cancel_scope::{ChildSpec, Lifecycle, Scope};

const GRACE: Duration = Duration::from_millis(100);

fn request() -> Scope {
    Scope::new().child().grace(GRACE).build().unwrap()
}

/// Polls `fut` once and keeps it, pending, without polling it again: the call stalls (a
/// caller that stopped polling it, a worker stuck elsewhere).
async fn poll_once<F: Future>(fut: std::pin::Pin<&mut F>) {
    let mut fut = fut;
    std::future::poll_fn(|cx| {
        assert!(fut.as_mut().poll(cx).is_pending(), "the call must stall");
        Poll::Ready(())
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_stalled_side_effecting_attempt_is_quarantined_and_listed_for_reconciliation() {
    let request = request();
    let retry = Retry::new(|_: &()| Decision::Backoff);
    let mut call = pin!(retry.run(
        &request,
        ChildSpec::side_effecting("charge", "charge-7"),
        |_| std::future::pending::<Result<(), ()>>(),
    ));
    poll_once(call.as_mut()).await;

    request.cancel();
    let start = tokio::time::Instant::now();
    let report = request.quiesce().await;
    // Nothing polls the attempt any more: only the end of the grace period ends it.
    assert_eq!(start.elapsed(), GRACE);
    assert_eq!(report.quarantined(), 1, "{report:?}");
    assert_eq!(report.total(), 1);
    assert_eq!(report.quarantined_children()[0].name(), "charge");
    // A charge that may have happened is never counted as none.
    assert_eq!(report.state(), Lifecycle::NeedsReconciliation);
    assert_eq!(report.pending_effects()[0].effect_id(), "charge-7");

    // The call wakes up late, sees the cancel and ends its attempt: that receipt is ignored.
    let out = call.await;
    assert!(out.unwrap_err().is_cancelled());
    let after = request.quiesce().await;
    assert_eq!(
        (after.total(), after.quarantined(), after.state()),
        (report.total(), report.quarantined(), report.state())
    );
    assert_eq!(after.pending_effects(), report.pending_effects());
}

#[tokio::test(start_paused = true)]
async fn a_dropped_stalled_read_only_attempt_is_quarantined_once() {
    let request = request();
    let retry = Retry::new(|_: &()| Decision::Backoff);
    {
        let mut call = pin!(retry.run(&request, ChildSpec::read_only("catalog"), |_| {
            std::future::pending::<Result<(), ()>>()
        }));
        poll_once(call.as_mut()).await;
        request.cancel();
        let report = request.quiesce().await;
        assert_eq!(report.quarantined(), 1, "{report:?}");
        assert_eq!(report.state(), Lifecycle::CancelledStable);
        assert!(report.pending_effects().is_empty());
    }
    // The call is dropped: its attempt's own receipt comes too late to count.
    let report = request.quiesce().await;
    assert_eq!(report.quarantined(), 1);
    assert_eq!(report.total(), 1);
}

/// The attempt is part of its own scope's work (as the body of a Trio cancel scope): the scope
/// holds the attempt's ticket, is `Running` and not quiet while the attempt runs. Work spawned
/// by the attempt that it must wait for goes into a child scope.
#[tokio::test(start_paused = true)]
async fn an_attempt_scope_is_quiet_only_after_the_attempt_and_sub_work_goes_in_a_child() {
    let request = Scope::with_timeout(Duration::from_secs(1));
    let retry = Retry::new(|_: &()| Decision::Backoff);
    let (spawned, attempt_scope) = retry
        .run(&request, ChildSpec::read_only("search"), |a| async move {
            let scope = a.scope().clone();
            // Named after its dependency, by the one copy of the name in its ticket.
            assert_eq!(scope.name(), Some("search"));
            assert_eq!(scope.lifecycle(), Lifecycle::Running);
            let sub = scope.child().build().unwrap();
            // Its handle is not needed: the sub-scope's quiesce waits for it.
            drop(
                sub.spawn(tokio::time::sleep(Duration::from_millis(5)))
                    .unwrap(),
            );
            sub.close();
            let report = sub.quiesce().await;
            // Its own scope, closed, still waits for the attempt itself.
            scope.close();
            let waited = tokio::time::timeout(Duration::from_millis(50), scope.quiesce()).await;
            assert!(waited.is_err(), "quiet while its attempt runs");
            Ok::<_, ()>((report.succeeded(), scope))
        })
        .await
        .unwrap();
    assert_eq!(spawned, 1);
    // Quiet once the attempt has its receipt.
    assert_eq!(attempt_scope.quiesce().await.state(), Lifecycle::Completed);
    request.close();
    let report = request.quiesce().await;
    // The attempt and the task spawned below it.
    assert_eq!(report.succeeded(), 2, "{report:?}");
    assert_eq!(report.state(), Lifecycle::Completed);
}

/// An attempt that closed its own scope is still running in it: the request's deadline stops
/// it.
// regression: the closed attempt scope went quiet at once and the deadline passed it by.
#[tokio::test(start_paused = true)]
async fn an_attempt_that_closed_its_scope_is_still_stopped_by_the_request_deadline() {
    let request = Scope::with_timeout(Duration::from_millis(100));
    let retry = Retry::new(|_: &()| Decision::Backoff);
    let t0 = tokio::time::Instant::now();
    let out = retry
        .run(&request, ChildSpec::read_only("search"), |a| async move {
            a.scope().close();
            tokio::time::sleep(Duration::from_millis(1000)).await;
            Ok::<_, ()>(())
        })
        .await;
    assert!(request.is_cancelled());
    assert!(out.is_err(), "the attempt was never stopped");
    assert_eq!(t0.elapsed(), Duration::from_millis(100));
}
