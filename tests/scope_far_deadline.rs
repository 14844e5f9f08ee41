//! A deadline at the far end of what an `Instant` can hold (a caller's computed value) does
//! not make the deadline timer task panic: tokio rounds a sleep's deadline up to the next
//! millisecond, which overflows there. Its own binary: it counts every panic of the process.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cancel_scope::Scope;
use tokio::time::Instant;

/// The latest instant after `now` that can be represented, to the nanosecond.
fn latest_instant(now: Instant) -> Instant {
    let (mut ok, mut step) = (Duration::ZERO, Duration::MAX);
    while step > Duration::ZERO {
        if let Some(d) = ok
            .checked_add(step)
            .filter(|d| now.checked_add(*d).is_some())
        {
            ok = d;
        }
        step /= 2;
    }
    now + ok
}

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
