//! Guards: permits wait at most the budget, are counted while alive, and are released on drop.

use std::sync::Arc;
use std::time::Duration;

use cancel_scope::{Lifecycle, Scope};
use tokio::sync::Semaphore;
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn waiting_for_a_permit_pays_from_the_budget() {
    let pool = Arc::new(Semaphore::new(1));
    let held = pool.clone().acquire_owned().await.unwrap();
    let s = Scope::with_timeout(Duration::from_millis(200));
    let start = Instant::now();
    let err = s.acquire(&pool).await.unwrap_err();
    assert!(err.is_deadline_exceeded());
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    drop(held);
    assert_eq!(
        pool.available_permits(),
        1,
        "the waiter left no permit behind"
    );
}

#[tokio::test(start_paused = true)]
async fn a_permit_freed_in_time_is_granted_and_counted() {
    let pool = Arc::new(Semaphore::new(1));
    let held = pool.clone().acquire_owned().await.unwrap();
    let s = Scope::with_timeout(Duration::from_millis(200));
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(held);
    });
    let start = Instant::now();
    let permit = s.acquire(&pool).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(50));
    assert_eq!(s.remaining(), Some(Duration::from_millis(150)));
    assert_eq!(s.lifecycle(), Lifecycle::Running);
    drop(permit);
    assert_eq!(pool.available_permits(), 1);
}

#[tokio::test(start_paused = true)]
async fn cancel_while_waiting_and_after_cancel_no_permit_is_taken() {
    let pool = Arc::new(Semaphore::new(0));
    let s = Scope::new();
    let waiter = tokio::spawn({
        let (s, pool) = (s.clone(), pool.clone());
        async move { s.acquire(&pool).await }
    });
    tokio::task::yield_now().await;
    s.cancel_with("bye");
    assert!(waiter.await.unwrap().unwrap_err().is_cancelled());
    pool.add_permits(1);
    assert!(s.acquire(&pool).await.unwrap_err().is_cancelled());
    assert_eq!(pool.available_permits(), 1);
}

#[tokio::test(start_paused = true)]
async fn quiesce_waits_for_every_guard_and_permits_are_zero_after() {
    let pool = Arc::new(Semaphore::new(4));
    let s = Scope::new();
    let mut permits = Vec::new();
    for _ in 0..4 {
        permits.push(s.acquire(&pool).await.unwrap());
    }
    let conn = s.tether(String::from("conn")).unwrap();
    s.cancel();
    let mut quiesce = tokio::spawn({
        let s = s.clone();
        async move { s.quiesce().await }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        futures::poll!(&mut quiesce).is_pending(),
        "guards are not quarantined: quiesce waits for them"
    );
    permits.clear();
    assert!(
        futures::poll!(&mut quiesce).is_pending(),
        "the tethered conn is still held"
    );
    assert_eq!(conn.into_inner(), "conn");
    let report = quiesce.await.unwrap();
    assert_eq!(report.state(), Lifecycle::CancelledStable);
    assert_eq!(pool.available_permits(), 4);
    assert_eq!(report.cancel_to_quiet(), Some(Duration::from_secs(5)));
}

#[tokio::test]
async fn a_closed_semaphore_is_an_error_not_a_hang() {
    let pool = Arc::new(Semaphore::new(0));
    pool.close();
    let s = Scope::new();
    assert!(s.acquire(&pool).await.unwrap_err().is_closed());
    s.close();
    assert_eq!(s.quiesce().await.total(), 0);
}

#[tokio::test(start_paused = true)]
async fn no_permit_is_granted_once_the_deadline_passed_before_its_timer_ran() {
    // Woken at the deadline by a sleep of our own, in the same tick as the scope's timer,
    // whose task has not run yet: the budget is spent, so queueing has nothing left to pay.
    let pool = Arc::new(Semaphore::new(1));
    let s = Scope::with_timeout(Duration::from_millis(100));
    tokio::time::sleep_until(s.deadline().unwrap()).await;
    assert_eq!(s.remaining(), Some(Duration::ZERO));
    let err = s.acquire(&pool).await.unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err:?}");
    assert!(s.is_cancelled(), "the passed deadline counts as the cancel");
    assert_eq!(pool.available_permits(), 1, "no permit was kept");
    let report = s.quiesce().await;
    assert_eq!(report.state(), Lifecycle::CancelledStable);
}

#[tokio::test(start_paused = true)]
async fn nothing_is_tethered_once_the_deadline_passed_before_its_timer_ran() {
    let s = Scope::with_timeout(Duration::from_millis(100));
    tokio::time::sleep_until(s.deadline().unwrap()).await;
    let err = s.tether("conn").unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err:?}");
    assert!(s.is_cancelled(), "the passed deadline counts as the cancel");
    assert_eq!(s.quiesce().await.state(), Lifecycle::CancelledStable);
}

#[tokio::test(start_paused = true)]
async fn a_permit_freed_at_the_deadline_is_not_granted() {
    // The waiter is queued; the holder lets go in the very tick of the deadline and the
    // waiter runs before the scope's timer task: it must not get the permit with nothing
    // left of its budget.
    let pool = Arc::new(Semaphore::new(1));
    let held = pool.clone().acquire_owned().await.unwrap();
    let s = Scope::with_timeout(Duration::from_millis(100));
    let mut waiter = std::pin::pin!(s.acquire(&pool));
    assert!(futures::poll!(&mut waiter).is_pending());
    tokio::time::sleep_until(s.deadline().unwrap()).await;
    drop(held);
    let err = waiter.await.map(drop).unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err:?}");
    assert_eq!(
        pool.available_permits(),
        1,
        "the permit went back to the pool"
    );
}
