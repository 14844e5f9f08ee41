//! The body of `Scope::run` is work of its scope, as the body of a Trio cancel scope is (and
//! as a spawned task or a retry attempt is): the scope is not quiet while a body runs, so a
//! body that closed its own scope is still reached by a later cancel or deadline, and once
//! `quiesce` has resolved no body of the scope is running (invariant 6). A closed scope
//! accepts a new body only from work it still has.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Context;
use std::time::Duration;

use cancel_scope::{Cause, Lifecycle, Scope};

use crate::support::time::MS;
use crate::support::wakers::{borrowed_waker, Slot};

/// A handler's pattern: close the request's scope (no new work), wait for the work it
/// started, then go on (render the response). The client leaving after that still stops it.
#[tokio::test(start_paused = true)]
async fn a_body_that_closed_its_scope_and_waited_for_its_work_is_stopped_by_a_later_cancel() {
    let server = Scope::new();
    let request = server.child().build().unwrap();
    let body_scope = request.clone();
    let body = tokio::spawn(request.run(async move {
        let sub = body_scope.child().build().unwrap();
        drop(sub.spawn(tokio::time::sleep(5 * MS)).unwrap());
        sub.close();
        sub.quiesce().await;
        body_scope.close();
        // Goes on working after the scope's own work is done.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        "rendered"
    }));
    tokio::time::sleep(10 * MS).await;
    assert!(request.is_closed());
    assert_eq!(
        request.lifecycle(),
        Lifecycle::Running,
        "quiet while its body runs"
    );

    server.cancel_because(Cause::ClientGone);
    let out = tokio::time::timeout(MS, body)
        .await
        .expect("the body was not stopped by the cancel")
        .unwrap();
    let err = out.unwrap_err();
    assert!(err.is_cancelled());
    assert_eq!(err.cause().map(Cause::origin), Some(&Cause::ClientGone));
    let report = request.quiesce().await;
    assert_eq!(report.state(), Lifecycle::CancelledStable);
    assert_eq!(report.cancel_to_quiet(), Some(Duration::ZERO));
}

/// The same with the scope's own deadline: a closed scope's body does not outlive its budget.
#[tokio::test(start_paused = true)]
async fn a_body_that_closed_its_scope_is_stopped_by_the_scope_deadline() {
    let request = Scope::with_timeout(100 * MS);
    let body_scope = request.clone();
    let start = tokio::time::Instant::now();
    let out = request
        .run(async move {
            body_scope.close();
            tokio::time::sleep(Duration::from_secs(3600)).await;
        })
        .await;
    assert!(out.unwrap_err().is_deadline_exceeded());
    assert_eq!(start.elapsed(), 100 * MS);
    assert_eq!(request.quiesce().await.state(), Lifecycle::CancelledStable);
}

/// `quiesce` waits for a running body: once it resolves, no body of the scope runs any more
/// (its work, dropped or finished, can commit nothing).
#[tokio::test(start_paused = true)]
async fn quiesce_waits_for_a_running_body() {
    let s = Scope::new();
    let done = Arc::new(AtomicBool::new(false));
    let flag = done.clone();
    let body = tokio::spawn(s.run(async move {
        tokio::time::sleep(30 * MS).await;
        flag.store(true, Ordering::SeqCst);
    }));
    s.close();
    let start = tokio::time::Instant::now();
    let report = s.quiesce().await;
    assert_eq!(start.elapsed(), 30 * MS);
    assert!(done.load(Ordering::SeqCst), "quiet before the body ended");
    assert_eq!(report.state(), Lifecycle::Completed);
    // A body is no child: it has no receipt.
    assert_eq!(report.total(), 0);
    body.await.unwrap().unwrap();
}

/// A body that is dropped before it ends (its caller stopped waiting) gives its scope back.
#[tokio::test(start_paused = true)]
async fn a_dropped_body_no_longer_keeps_its_scope_from_quiet() {
    let s = Scope::new();
    let run = s.run(std::future::pending::<()>());
    s.close();
    assert_eq!(s.lifecycle(), Lifecycle::Running);
    drop(run);
    assert_eq!(s.lifecycle(), Lifecycle::Completed);
    assert_eq!(s.quiesce().await.state(), Lifecycle::Completed);
}

/// No new work after close: a body made for a closed scope is refused without being polled,
/// as a spawn would be.
#[tokio::test(start_paused = true)]
async fn a_closed_scope_refuses_a_new_body_without_polling_it() {
    let s = Scope::new();
    s.close();
    let polled = Arc::new(AtomicBool::new(false));
    let flag = polled.clone();
    let err = s
        .run(async move { flag.store(true, Ordering::SeqCst) })
        .await
        .unwrap_err();
    assert!(err.is_closed() && !err.is_cancelled());
    assert!(!polled.load(Ordering::SeqCst));

    let c = Scope::new();
    c.cancel_with("stop");
    let err = c.run(async {}).await.unwrap_err();
    assert_eq!(err.cause().and_then(Cause::reason), Some("stop"));
}

/// A body made before the close is work the scope already had: it runs, and the scope is quiet
/// after it.
#[tokio::test(start_paused = true)]
async fn a_body_made_before_close_runs_after_it() {
    let s = Scope::new();
    let run = s.run(async { 7 });
    s.close();
    assert_eq!(run.await.unwrap(), 7);
    assert_eq!(s.lifecycle(), Lifecycle::Completed);
}

/// A task spawned before the close is work the scope still has: a body it runs after the
/// close (an outgoing call made with the scope current, say) is part of that work, accepted,
/// waited for and stopped by the cancel. Once the scope is quiet, a body is refused.
#[tokio::test(start_paused = true)]
async fn work_still_running_in_a_closed_scope_can_run_a_body_in_it() {
    let s = Scope::with_timeout(Duration::from_secs(1));
    let task = s
        .spawn(async {
            tokio::time::sleep(10 * MS).await;
            // After the close below: the scope still has this task.
            Scope::current()
                .run(tokio::time::sleep(Duration::from_secs(3600)))
                .await
        })
        .unwrap();
    s.close();
    let start = tokio::time::Instant::now();
    let report = s.quiesce().await;
    // Accepted: the body ran until the deadline stopped it (and its task), and quiesce waited
    // for it. (Refused, it would have ended the task at 10 ms with `is_closed`.)
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert!(task.await.unwrap_err().is_deadline_exceeded());
    assert_eq!(report.state(), Lifecycle::CancelledStable);

    let quiet = Scope::new();
    quiet.close();
    assert!(quiet.run(async {}).await.unwrap_err().is_closed());
}

/// A body of `Scope::run` polled again through a reused waker address (see
/// `cancel::a_waiter_polled_by_another_task_through_a_reused_waker_address_is_woken`: the
/// body's cancel waiter is in the same list) is woken by the cancel.
// regression: the body was taken for the one the list kept, and never woken.
#[test]
fn a_body_polled_by_another_task_through_a_reused_waker_address_is_woken() {
    let scope = Scope::new();
    let first = Arc::new(AtomicBool::new(false));
    let second = Arc::new(AtomicBool::new(false));
    let slot = Slot {
        task: std::sync::Mutex::new(first.clone()),
    };
    let mut run = pin!(scope.run(std::future::pending::<()>()));
    let w = borrowed_waker(&slot);
    assert!(run.as_mut().poll(&mut Context::from_waker(&w)).is_pending());
    drop(w);
    *slot.task.lock().unwrap() = second.clone();
    let w = borrowed_waker(&slot);
    assert!(run.as_mut().poll(&mut Context::from_waker(&w)).is_pending());
    drop(w);
    scope.cancel();
    assert!(
        second.load(Ordering::SeqCst),
        "the task waiting now was not woken (lost wake-up)"
    );
}
