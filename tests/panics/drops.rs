//! A body of `Scope::run` (and a retry attempt's run on its ticket) whose drop panics is still
//! stopped: what it holds of its scope (a unit, the attempt's ticket) is given back, or the
//! scope would never be quiet (neither is in reach of a quarantine). Invariants 5 and 6.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use cancel_scope::retry::{Decision, Retry};
use cancel_scope::{ChildSpec, Lifecycle, Scope};

use crate::support::time::MS;

/// Panics when dropped (a guard in the body whose drop asserts, a poisoned lock...).
struct PanicOnDrop;

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("the body's drop panicked");
    }
}

async fn pending_with_panicking_drop() {
    let _guard = PanicOnDrop;
    std::future::pending::<()>().await;
}

/// Polls `fut` once; it must be pending.
async fn poll_once<F: Future>(fut: Pin<&mut F>) {
    let mut fut = fut;
    std::future::poll_fn(|cx| {
        assert!(fut.as_mut().poll(cx).is_pending());
        Poll::Ready(())
    })
    .await;
}

/// A body whose drop panics is still stopped (its work is gone): its scope's unit must come
/// back, or the scope is never quiet (a body's unit is not quarantined: `quiesce` hangs even
/// after the cancel and the grace period).
#[tokio::test(start_paused = true)]
async fn a_body_whose_drop_panics_gives_its_scope_back() {
    let s = Scope::new().child().grace(10 * MS).build().unwrap();
    let mut run = Box::pin(s.run(pending_with_panicking_drop()));
    poll_once(run.as_mut()).await;
    let dropped = std::panic::catch_unwind(AssertUnwindSafe(|| drop(run)));
    assert!(dropped.is_err(), "the body's drop panics");
    s.cancel();
    let report = tokio::time::timeout(Duration::from_secs(60), s.quiesce())
        .await
        .expect("the scope never went quiet: the body's unit was not given back");
    assert_eq!(report.state(), Lifecycle::CancelledStable);
}

/// The same for a body in a task that is aborted (tokio catches the panic of the drop).
#[tokio::test(start_paused = true)]
async fn an_aborted_task_whose_body_drop_panics_gives_its_scope_back() {
    let s = Scope::new();
    let task = tokio::spawn(s.run(pending_with_panicking_drop()));
    tokio::task::yield_now().await;
    task.abort();
    assert!(task.await.unwrap_err().is_panic());
    s.close();
    assert_eq!(
        s.lifecycle(),
        Lifecycle::Completed,
        "the body's unit leaked"
    );
}

/// A retry attempt whose work panics when dropped (the call dropped while the attempt runs):
/// the attempt's ticket must still get its receipt. Otherwise its node retires with the
/// ticket's unit of the request still taken, out of reach of the request's quarantine: the
/// request is never quiet.
#[tokio::test(start_paused = true)]
async fn a_dropped_attempt_whose_work_drop_panics_still_gets_its_receipt() {
    let request = Scope::new().child().grace(10 * MS).build().unwrap();
    let retry = Retry::new(|_: &()| Decision::Backoff);
    let dropped = {
        let mut call = Box::pin(
            retry.run(&request, ChildSpec::read_only("catalog"), |_| async {
                pending_with_panicking_drop().await;
                Ok::<(), ()>(())
            }),
        );
        poll_once(call.as_mut()).await;
        std::panic::catch_unwind(AssertUnwindSafe(|| drop(call)))
    };
    assert!(dropped.is_err(), "the attempt's drop panics");
    request.cancel();
    let report = tokio::time::timeout(Duration::from_secs(60), request.quiesce())
        .await
        .expect("the request never went quiet: the attempt's ticket got no receipt");
    assert_eq!(report.total(), 1, "{report:?}");
}

/// The same for a hedged attempt run in a task of its own that is aborted: see
/// `a_dropped_attempt_whose_work_drop_panics_still_gets_its_receipt`.
#[tokio::test(start_paused = true)]
async fn a_spawned_call_whose_attempt_drop_panics_is_aborted_and_still_gets_its_receipt() {
    let request = Scope::new().child().grace(10 * MS).build().unwrap();
    let r = request.clone();
    let task = tokio::spawn(async move {
        let retry = Retry::new(|_: &()| Decision::Backoff);
        retry
            .run(&r, ChildSpec::read_only("catalog"), |_| async {
                pending_with_panicking_drop().await;
                Ok::<(), ()>(())
            })
            .await
    });
    tokio::task::yield_now().await;
    task.abort();
    assert!(task.await.unwrap_err().is_panic());
    request.close();
    let report = tokio::time::timeout(Duration::from_secs(60), request.quiesce())
        .await
        .expect("the request never went quiet: the attempt's ticket got no receipt");
    assert_eq!(report.total(), 1, "{report:?}");
}
