//! A retry attempt is one node: the attempt's child scope and its ticket in the request's
//! scope. These tests check what that ticket still does: a stalled attempt is quarantined in
//! the request (invariant 5, listed for reconciliation when it may have had an effect), its
//! late end changes nothing (invariant 6), and the attempt's own scope is a scope like any
//! other (its own `quiesce` does not wait for the attempt's ticket).

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

#[tokio::test(start_paused = true)]
async fn an_attempt_can_wait_for_its_own_scope_to_go_quiet() {
    let request = Scope::with_timeout(Duration::from_secs(1));
    let retry = Retry::new(|_: &()| Decision::Backoff);
    let spawned = retry
        .run(&request, ChildSpec::read_only("search"), |a| async move {
            let scope = a.scope();
            // Its handle is not needed: the scope's quiesce waits for it.
            drop(
                scope
                    .spawn(tokio::time::sleep(Duration::from_millis(5)))
                    .unwrap(),
            );
            scope.close();
            // The attempt's ticket is the request's child: its own scope goes quiet without it.
            let report = scope.quiesce().await;
            Ok::<_, ()>(report.succeeded())
        })
        .await
        .unwrap();
    assert_eq!(spawned, 1);
    request.close();
    let report = request.quiesce().await;
    // The attempt and the task spawned in it.
    assert_eq!(report.succeeded(), 2, "{report:?}");
    assert_eq!(report.state(), Lifecycle::Completed);
}
