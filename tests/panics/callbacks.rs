//! `on_cancel` callbacks that panic, run by a cancel or by the timer task at a deadline: the
//! cancel walk goes on below, and later deadlines still fire.

use std::time::Duration;

use cancel_scope::{ChildSpec, Scope};

/// A panicking `on_cancel` callback does not stop the cancel walk: the descendants are
/// cancelled and their waiters woken.
// regression: the panic aborted the walk: descendants stayed uncancelled, their waiters asleep.
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

/// A callback that panics when its scope's deadline fires does not stop the timer task: later
/// deadlines of the tree still fire.
// regression: the panic killed the shared timer task, and later deadlines never fired.
#[tokio::test(start_paused = true)]
async fn a_panicking_callback_on_the_timer_does_not_kill_later_deadlines() {
    let root = Scope::with_timeout(Duration::from_secs(100));
    let a = root.child().cap(Duration::from_millis(10)).build().unwrap();
    let _g = a.on_cancel(|_| panic!("user bug"));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(a.is_cancelled());
    let b = root.child().cap(Duration::from_millis(10)).build().unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        b.is_cancelled(),
        "b's deadline never fired: timer driver is dead"
    );
}
