//! Helpers of the quiesce tests: stuck work, a `quiesce()` already waiting, wakers that act
//! at a cancel's mark, and the bytes and allocations of this thread (`support::alloc`, the
//! binary's allocator).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use cancel_scope::{Cancelled, ChildSpec, Dispatched, Quiesce, Report, Scope};

pub use super::alloc::{allocs, live_bytes};
pub use super::time::{ms, secs};
use super::wakers::Counts;

/// A dispatched read-only child of `scope` whose work ignores the cancel.
pub fn stuck(scope: &Scope, name: &'static str) -> Dispatched {
    scope
        .register(ChildSpec::read_only(name))
        .unwrap()
        .dispatch()
        .unwrap()
}

/// Quiesces `scope` on a task of its own, polled once before this returns (so it waits).
pub async fn waiting_quiesce(scope: &Scope) -> tokio::task::JoinHandle<Report> {
    let q = tokio::spawn({
        let s = scope.clone();
        async move { s.quiesce().await }
    });
    tokio::task::yield_now().await;
    assert!(!q.is_finished());
    q
}

/// Long enough for a blocked thread to be released in any sane run; a failure bound only.
pub const HANG: Duration = Duration::from_secs(10);

/// Runs `f` when `scope` is marked cancelled (its cancel waiters are woken right after the
/// mark, before the walk goes below it), on the thread that marks it. Keep the returned
/// future until then.
pub fn on_mark(scope: &Scope, f: impl FnOnce() + Send + 'static) -> Pin<Box<Cancelled>> {
    let mut cancelled = Box::pin(scope.cancelled());
    let waker = Waker::from(Counts::with_hook(f));
    assert!(cancelled
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    cancelled
}

/// Polls `q` once from the test's task.
pub async fn poll_once(q: &mut Quiesce) -> Poll<Report> {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *q).poll(cx))).await
}

/// A waker that, the first time it is woken once armed, polls the `Quiesce` it holds at once
/// (as a second worker of a multi-thread runtime does with a task that awaited
/// `scope.cancelled()` and then `scope.quiesce()`: it is woken by the cancel before the walk
/// goes down; the quiesce's first poll unless the test polled it before), then wakes the
/// test's task on later wake-ups.
pub struct FirstPollOnWake {
    armed: AtomicBool,
    quiesce: Mutex<Option<Quiesce>>,
    task: Mutex<Option<Waker>>,
    /// Whether the child was cancelled yet when that first poll ran.
    pub child_seen_cancelled: Mutex<Option<bool>>,
    child: Scope,
}

impl FirstPollOnWake {
    pub fn new(scope: &Scope, child: &Scope) -> Arc<Self> {
        Arc::new(FirstPollOnWake {
            armed: AtomicBool::new(false),
            quiesce: Mutex::new(Some(scope.quiesce())),
            task: Mutex::new(None),
            child_seen_cancelled: Mutex::new(None),
            child: child.clone(),
        })
    }

    pub fn poll_now(self: &Arc<Self>) -> Poll<Report> {
        let waker = Waker::from(self.clone());
        let mut cx = Context::from_waker(&waker);
        let Ok(mut q) = self.quiesce.try_lock() else {
            return Poll::Pending;
        };
        Pin::new(q.as_mut().expect("polled after ready")).poll(&mut cx)
    }

    /// Waits for the scope's cancel with this waker, armed: the cancel makes the first poll.
    pub fn arm_on_cancel_of(self: &Arc<Self>, scope: &Scope) -> impl Sized {
        let mut cancelled = Box::pin(scope.cancelled());
        let waker = Waker::from(self.clone());
        assert!(cancelled
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        self.armed.store(true, Ordering::SeqCst);
        cancelled
    }

    pub async fn report(self: &Arc<Self>) -> Report {
        std::future::poll_fn(|cx| {
            *self.task.lock().unwrap() = Some(cx.waker().clone());
            self.poll_now()
        })
        .await
    }
}

impl Wake for FirstPollOnWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if self.armed.swap(false, Ordering::SeqCst) {
            *self.child_seen_cancelled.lock().unwrap() = Some(self.child.is_cancelled());
            let _ = self.poll_now();
        }
        if let Some(w) = self.task.lock().unwrap().as_ref() {
            w.wake_by_ref();
        }
    }
}
