//! A waker that panics when it is woken (a user's own `Wake` implementation with a bug) does
//! not cut short the step of the tree that wakes it: the cancel walk still reaches every scope
//! below and wakes every other waiter (invariant 1), a scope that becomes quiet still gives
//! its unit back to its parent and wakes its other `quiesce()`s, and a quarantine still
//! records and releases every child it took (invariant 6). The panic comes out of the call
//! that ran the step, once the step is done.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use cancel_scope::{ChildSpec, Scope};
use futures::FutureExt;

/// Panics when woken.
struct Panics;

impl Wake for Panics {
    fn wake(self: Arc<Self>) {
        panic!("this waker panics");
    }
}

/// Counts its wake-ups.
#[derive(Default)]
struct Counts(AtomicUsize);

impl Wake for Counts {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Counts {
    fn woken(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

fn panics() -> Waker {
    Waker::from(Arc::new(Panics))
}

/// Polls `fut` once with `waker`: it must be pending.
fn pending_with<F: Future>(fut: std::pin::Pin<&mut F>, waker: &Waker) {
    assert!(fut.poll(&mut Context::from_waker(waker)).is_pending());
}

/// Runs `f`, which must panic, and returns the panic's message.
fn panic_of(f: impl FnOnce()) -> String {
    let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) else {
        panic!("expected a panic");
    };
    message(panic)
}

/// The message of a caught panic.
fn message(panic: Box<dyn std::any::Any + Send>) -> String {
    match panic.downcast::<&str>() {
        Ok(s) => (*s).to_owned(),
        Err(p) => *p.downcast::<String>().unwrap(),
    }
}

#[test]
fn a_waker_that_panics_at_the_cancel_does_not_stop_the_walk_below() {
    let root = Scope::new();
    let child = root.child().build().unwrap();
    let grandchild = child.child().build().unwrap();

    // The root's first waiter panics; a second waiter of the root and one of the grandchild
    // count.
    let mut first = pin!(root.cancelled());
    pending_with(first.as_mut(), &panics());
    let second_count = Arc::new(Counts::default());
    let mut second = pin!(root.cancelled());
    pending_with(second.as_mut(), &Waker::from(second_count.clone()));
    let below_count = Arc::new(Counts::default());
    let mut below = pin!(grandchild.cancelled());
    pending_with(below.as_mut(), &Waker::from(below_count.clone()));

    assert_eq!(panic_of(|| root.cancel()), "this waker panics");

    // The whole subtree is cancelled, and nothing new starts in it.
    assert!(child.is_cancelled() && grandchild.is_cancelled());
    assert!(grandchild
        .register(ChildSpec::read_only("late"))
        .unwrap_err()
        .is_cancelled());
    // The other waiters were woken.
    assert_eq!(second_count.woken(), 1);
    assert_eq!(below_count.woken(), 1);
    assert!(second.now_or_never().is_some());
    assert!(below.now_or_never().is_some());
}

#[test]
fn a_waker_that_panics_in_a_task_list_does_not_stop_the_walk() {
    let root = Scope::new();
    let child = root.child().build().unwrap();
    // Two tasks of the root waiting (listed with their wakers): the first one's waker panics.
    let mut first = pin!(root.__task(std::future::pending::<()>()).unwrap());
    pending_with(first.as_mut(), &panics());
    let count = Arc::new(Counts::default());
    let mut second = pin!(root.__task(std::future::pending::<()>()).unwrap());
    pending_with(second.as_mut(), &Waker::from(count.clone()));

    assert_eq!(panic_of(|| root.cancel()), "this waker panics");

    assert!(child.is_cancelled());
    assert_eq!(count.woken(), 1);
    // Woken, the second task stops with its receipt.
    let waker = Waker::from(count.clone());
    let Poll::Ready(out) = second.as_mut().poll(&mut Context::from_waker(&waker)) else {
        panic!("a cancelled task stops when polled");
    };
    assert!(out.unwrap_err().is_cancelled());
}

#[test]
fn a_waker_that_panics_when_its_scope_goes_quiet_leaves_the_release_whole() {
    let root = Scope::new();
    let child = root.child().build().unwrap();
    let guard = child.tether(()).unwrap();
    root.close();

    // Two `quiesce()`s of the child, the first with a waker that panics, and one of the root.
    let mut first = pin!(child.quiesce());
    pending_with(first.as_mut(), &panics());
    let child_count = Arc::new(Counts::default());
    let mut second = pin!(child.quiesce());
    pending_with(second.as_mut(), &Waker::from(child_count.clone()));
    let root_count = Arc::new(Counts::default());
    let mut of_root = pin!(root.quiesce());
    pending_with(of_root.as_mut(), &Waker::from(root_count.clone()));

    // The guard's release makes the child quiet, which wakes its waiters.
    assert_eq!(panic_of(|| drop(guard)), "this waker panics");

    // The other waiter of the child was woken, and the child's unit in the root went back:
    // the root is quiet too, and its waiter was woken.
    assert_eq!(child_count.woken(), 1);
    assert_eq!(root_count.woken(), 1);
    assert!(second.now_or_never().is_some());
    assert!(of_root.now_or_never().is_some());
}

#[test]
fn a_waker_that_panics_at_close_does_not_stop_the_close_below() {
    let root = Scope::new();
    let idle = root.child().build().unwrap();
    let grandchild = idle.child().build().unwrap();
    // A quiesce of the idle child waits for the close; its waker panics when the close makes
    // the child quiet.
    let mut waiting = pin!(idle.quiesce());
    pending_with(waiting.as_mut(), &panics());

    assert_eq!(panic_of(|| root.close()), "this waker panics");

    // The close reached the whole subtree (invariant 3): the grandchild, idle, is quiet.
    assert!(grandchild.quiesce().now_or_never().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_waker_that_panics_in_a_quarantine_does_not_stop_it() {
    let root = Scope::new();
    // Two tasks that never end, waiting with their wakers listed: the first one's panics.
    let mut first = Box::pin(root.__task(std::future::pending::<()>()).unwrap());
    pending_with(first.as_mut(), &panics());
    let count = Arc::new(Counts::default());
    let mut second = Box::pin(root.__task(std::future::pending::<()>()).unwrap());
    pending_with(second.as_mut(), &Waker::from(count.clone()));
    assert_eq!(panic_of(|| root.cancel()), "this waker panics");
    assert_eq!(count.woken(), 1);

    // Neither task is polled again: at the end of the grace period the quarantine takes them
    // both, and wakes them (the first waker panics, out of the quiesce's poll).
    let quiesced = std::panic::AssertUnwindSafe(root.quiesce()).catch_unwind();
    assert_eq!(message(quiesced.await.unwrap_err()), "this waker panics");
    assert_eq!(count.woken(), 2);

    // The quarantine is whole: both tasks have their receipt and gave their unit back.
    let report = tokio::time::timeout(Duration::from_secs(3600), root.quiesce())
        .await
        .expect("the quarantine released both tasks");
    assert_eq!(report.quarantined(), 2);
    drop((first, second));
}
