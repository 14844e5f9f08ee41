//! The last quiet waiter to leave a scope takes the scope's waiter lists with it: every other
//! kind of registration keeps working (`a_dropped_watch_does_not_invalidate_*`), and a stale
//! key of a drained list meets nothing (`a_stale_quiet_key_after_quiet_meets_nothing`).
//! (How many scopes the looks of waiting quiesces visit is counted by a unit test in
//! `src/quiesce`, `a_chain_cancelled_bottom_up_is_looked_through_as_often_whatever_the_grace`.)

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use cancel_scope::{Quiesce, Report, Scope};

mod support;
use support::quiesce::*;

/// A waker that counts its wake-ups.
struct CountWake(AtomicUsize);

impl std::task::Wake for CountWake {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn poll_q(q: &mut Quiesce, w: &Waker) -> Poll<Report> {
    Pin::new(q).poll(&mut Context::from_waker(w))
}

/// A `cancelled()` waiter in the inline slot, a second one in the list, an `on_cancel`
/// callback and two quiesce waiters; the quiesce waiters go one after the other (the last one
/// drops the lists only if nothing else is in them), then new quiesce waiters come, and the
/// cancel must still wake both `cancelled()` futures and run the callback exactly once.
#[tokio::test(start_paused = true)]
async fn a_dropped_watch_does_not_invalidate_cancel_waiters_or_callbacks() {
    let s = Scope::new().child().grace(ms(10)).build().unwrap();
    let work = stuck(&s, "w");
    let ran = Arc::new(AtomicUsize::new(0));
    let wc = Arc::new(CountWake(AtomicUsize::new(0)));
    let waker = Waker::from(wc.clone());
    let mut c1 = Box::pin(s.cancelled());
    let mut c2 = Box::pin(s.cancelled());
    let cx = &mut Context::from_waker(&waker);
    assert!(c1.as_mut().poll(cx).is_pending());
    // A different waker object so it is a second registration.
    let wc2 = Arc::new(CountWake(AtomicUsize::new(0)));
    let waker2 = Waker::from(wc2.clone());
    assert!(c2
        .as_mut()
        .poll(&mut Context::from_waker(&waker2))
        .is_pending());
    let on = {
        let ran = ran.clone();
        s.on_cancel(move |_| {
            ran.fetch_add(1, Ordering::SeqCst);
        })
    };
    for _ in 0..3 {
        let mut q1 = s.quiesce();
        let mut q2 = s.quiesce();
        assert!(poll_q(&mut q1, &waker).is_pending());
        assert!(poll_q(&mut q2, &waker).is_pending());
        drop(q1);
        drop(q2);
    }
    // Only quiesce waiters: their lists go with the last; then again.
    let t = Scope::new().child().build().unwrap();
    let tw = stuck(&t, "t");
    for _ in 0..3 {
        let mut q = t.quiesce();
        assert!(poll_q(&mut q, &waker).is_pending());
        drop(q);
    }
    let mut q = s.quiesce();
    assert!(poll_q(&mut q, &waker).is_pending());
    s.cancel();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert!(c1.as_mut().poll(cx).is_ready());
    assert!(c2
        .as_mut()
        .poll(&mut Context::from_waker(&waker2))
        .is_ready());
    assert!(wc2.0.load(Ordering::SeqCst) >= 1);
    drop(on);
    drop(work);
    let report = q.await;
    assert_eq!(report.total(), 1, "{report}");
    t.cancel();
    drop(tw);
    let mut q = t.quiesce();
    assert!(poll_q(&mut q, &waker).is_ready());
}

/// A quiesce waiter dropped after its scope became quiet (stale key of a drained list),
/// while another scope's lists are made again: nothing registers on a quiet scope, and a
/// second quiesce of it resolves at once.
#[tokio::test(start_paused = true)]
async fn a_stale_quiet_key_after_quiet_meets_nothing() {
    let wc = Arc::new(CountWake(AtomicUsize::new(0)));
    let waker = Waker::from(wc.clone());
    let s = Scope::new().child().build().unwrap();
    let work = stuck(&s, "w");
    let mut q1 = s.quiesce();
    assert!(poll_q(&mut q1, &waker).is_pending());
    s.close();
    drop(work);
    // Quiet now; the list was drained. A new quiesce resolves without registering.
    let mut q2 = s.quiesce();
    assert!(poll_q(&mut q2, &waker).is_ready());
    drop(q1);
    let mut q3 = s.quiesce();
    assert!(poll_q(&mut q3, &waker).is_ready());
}
