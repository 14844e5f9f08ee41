//! Helpers of the `quiesce_*` tests: a counting allocator (bytes live and allocations made by
//! the current thread), stuck work, and a `quiesce()` already waiting.
//!
//! A test file that counts declares the allocator itself (one per test binary):
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: support::quiesce::Counting = support::quiesce::Counting;
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use cancel_scope::{Cancelled, ChildSpec, Dispatched, Quiesce, Report, Scope};

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

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

/// A waker that runs its closure once, the first time it is woken.
struct OnWake(Mutex<Option<Box<dyn FnOnce() + Send>>>);

impl Wake for OnWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let f = self.0.lock().unwrap().take();
        if let Some(f) = f {
            f();
        }
    }
}

/// Runs `f` when `scope` is marked cancelled (its cancel waiters are woken right after the
/// mark, before the walk goes below it), on the thread that marks it. Keep the returned
/// future until then.
pub fn on_mark(scope: &Scope, f: impl FnOnce() + Send + 'static) -> Pin<Box<Cancelled>> {
    let mut cancelled = Box::pin(scope.cancelled());
    let waker = Waker::from(Arc::new(OnWake(Mutex::new(Some(Box::new(f))))));
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

/// Counts the bytes allocated and not freed, and the allocations made, by each thread (the
/// tests that read them run on a current-thread runtime: the quiesce task, the timer driver
/// and the scopes are all on the test's thread).
pub struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

fn count(delta: isize, allocation: bool) {
    let _ = LIVE.try_with(|c| c.set(c.get() + delta));
    if allocation {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
    }
}

// SAFETY: forwards to `System`, only counting sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            count(layout.size() as isize, true);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            count(layout.size() as isize, true);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        count(-(layout.size() as isize), false);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            count(new_size as isize - layout.size() as isize, false);
        }
        p
    }
}

/// Bytes allocated and not freed by this thread (with [`Counting`] as the allocator).
pub fn live_bytes() -> isize {
    LIVE.with(Cell::get)
}

/// Allocations made by this thread (each cancel walk and each quarantine walk allocates its
/// work list: a count of walks, give or take a constant factor).
pub fn allocs() -> usize {
    ALLOCS.with(Cell::get)
}
