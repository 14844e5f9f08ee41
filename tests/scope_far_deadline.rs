//! A deadline or a grace period at the far end of what an `Instant` can hold (a caller's
//! computed value) panics nothing: tokio rounds a sleep's deadline up to the next
//! millisecond, which overflows there. Its own binary: it counts every panic of the process.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cancel_scope::{ChildSpec, Scope};
use futures::FutureExt;
use tokio::time::Instant;

mod support;
use support::latest_instant;

#[tokio::test(start_paused = true)]
async fn a_deadline_at_the_end_of_time_does_not_panic_the_timer_task() {
    let panics = Arc::new(AtomicUsize::new(0));
    let seen = panics.clone();
    std::panic::set_hook(Box::new(move |info| {
        eprintln!("{info}");
        seen.fetch_add(1, Ordering::SeqCst);
    }));
    let far = Scope::with_deadline(latest_instant(Instant::now()));
    // A second scope, due first: when its deadline fires, the timer task goes on to sleep
    // until the far one, in the same poll, before this task runs again.
    let soon = Scope::with_timeout(Duration::from_millis(1));
    soon.cancelled().await;
    assert_eq!(panics.load(Ordering::SeqCst), 0);
    assert!(!far.is_cancelled());
    // And it still serves the thread's deadlines.
    let next = Scope::with_timeout(Duration::from_millis(5));
    next.cancelled().await;
    assert_eq!(panics.load(Ordering::SeqCst), 0);
    let _ = std::panic::take_hook();
}

#[tokio::test(start_paused = true)]
async fn a_grace_period_to_the_end_of_time_is_never_over() {
    let now = Instant::now();
    let s = Scope::new()
        .child()
        .grace(latest_instant(now) - now)
        .build()
        .unwrap();
    let stuck = s
        .register(ChildSpec::read_only("stuck"))
        .unwrap()
        .dispatch()
        .unwrap();
    s.cancel();
    // Too far to sleep until: the stuck child is never quarantined, and waiting panics nothing.
    let mut quiet = Box::pin(s.quiesce());
    let waited = tokio::time::timeout(Duration::from_secs(3600), &mut quiet).await;
    assert!(waited.is_err(), "quarantined at the end of time?");
    stuck.succeed();
    assert!(quiet.now_or_never().is_some());
}
