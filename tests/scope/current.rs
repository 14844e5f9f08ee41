//! The current scope: `run`, `spawn` and `Scope::current()` read like Go's context without
//! passing the scope by hand.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use cancel_scope::Scope;

#[tokio::test]
async fn run_makes_the_scope_current_and_returns_the_output() {
    assert!(Scope::try_current().is_none());
    let s = Scope::new();
    let child = s.child().name("handler").build().unwrap();
    let name = child
        .run(async { Scope::current().name().map(str::to_owned) })
        .await
        .unwrap();
    assert_eq!(name.as_deref(), Some("handler"));
    assert!(Scope::try_current().is_none(), "current only inside run");
}

#[tokio::test]
async fn nested_runs_see_the_innermost_scope() {
    let outer = Scope::new();
    let inner = outer.child().name("inner").build().unwrap();
    outer
        .run(async {
            assert_eq!(Scope::current().name(), None);
            inner
                .run(async { assert_eq!(Scope::current().name(), Some("inner")) })
                .await
                .unwrap();
            assert_eq!(Scope::current().name(), None);
        })
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn run_stops_the_future_when_the_scope_is_cancelled() {
    let s = Scope::with_timeout(Duration::from_millis(100));
    let start = tokio::time::Instant::now();
    let err = s
        .run(tokio::time::sleep(Duration::from_secs(10)))
        .await
        .unwrap_err();
    assert!(err.is_deadline_exceeded());
    assert_eq!(start.elapsed(), Duration::from_millis(100));
}

#[tokio::test]
async fn run_on_a_cancelled_scope_never_polls_the_future() {
    let s = Scope::new();
    s.cancel_with("gone");
    let err = s
        .run(async { panic!("must not be polled") })
        .await
        .unwrap_err();
    assert_eq!(err.cause().unwrap().reason(), Some("gone"));
}

#[tokio::test]
async fn spawned_tasks_see_their_scope_as_current() {
    let s = Scope::new();
    let child = s.child().name("worker").build().unwrap();
    let h = child
        .spawn(async {
            let me = Scope::current();
            let nested = me.spawn(async { Scope::current().name().map(str::to_owned) });
            nested.unwrap().await.unwrap()
        })
        .unwrap();
    assert_eq!(h.await.unwrap().as_deref(), Some("worker"));
}

#[tokio::test]
#[should_panic(expected = "no current scope")]
async fn current_outside_a_scope_panics_with_a_clear_message() {
    let _ = Scope::current();
}

#[tokio::test(start_paused = true)]
async fn handler_code_derives_children_from_the_current_scope() {
    let request = Scope::with_timeout(Duration::from_millis(500));
    let remaining = request
        .run(async {
            // Deep inside handler code, without a scope parameter:
            let db = Scope::current()
                .child()
                .reserve(Duration::from_millis(50))
                .build()
                .unwrap();
            db.remaining()
        })
        .await
        .unwrap();
    assert_eq!(remaining, Some(Duration::from_millis(450)));
}

/// Work that takes the current scope when it is dropped (and is never ready).
struct TakesCurrentOnDrop(std::sync::Arc<std::sync::Mutex<Option<Scope>>>);

impl TakesCurrentOnDrop {
    /// The work, and where it leaves the scope it took.
    fn new() -> (Self, std::sync::Arc<std::sync::Mutex<Option<Scope>>>) {
        let slot = std::sync::Arc::new(std::sync::Mutex::new(None));
        (TakesCurrentOnDrop(slot.clone()), slot)
    }
}

/// The scope the work took when it was dropped.
fn taken(slot: &std::sync::Mutex<Option<Scope>>) -> Scope {
    slot.lock()
        .unwrap()
        .take()
        .expect("current while the work is dropped")
}

impl std::future::Future for TakesCurrentOnDrop {
    type Output = ();
    fn poll(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        std::task::Poll::Pending
    }
}

impl Drop for TakesCurrentOnDrop {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = Scope::try_current();
    }
}

#[test]
fn the_current_scope_taken_while_run_drops_its_work_is_a_live_handle() {
    let parent = Scope::new();
    let work = parent.child().name("work").build().unwrap();
    let (work_future, slot) = TakesCurrentOnDrop::new();
    let run = work.run(work_future);
    drop(work);
    // The run future holds the last handle; its work is dropped with `work` current.
    drop(run);
    let taken = taken(&slot);
    assert_eq!(taken.name(), Some("work"));
    assert_eq!(
        parent.__live_children(),
        1,
        "the taken handle keeps it linked"
    );
    let sibling = parent.child().build().unwrap();
    drop(taken);
    assert_eq!(
        parent.__live_children(),
        1,
        "unlinked once, the sibling stays"
    );
    parent.cancel();
    assert!(sibling.is_cancelled());
}

#[tokio::test]
async fn a_task_drops_its_work_with_its_scope_current_as_run_does() {
    let s = Scope::new().child().name("work").build().unwrap();
    let (work, slot) = TakesCurrentOnDrop::new();
    let h = s.spawn(work).unwrap();
    // Stopped at its first poll: the work is dropped unpolled.
    s.cancel();
    assert!(h.await.unwrap_err().is_cancelled());
    assert_eq!(taken(&slot).name(), Some("work"));
}

// The current-scope slot holds the scope's handle itself, moved in and out by `run`'s future
// and a spawned task: every path (a panicking drop, a run polled and dropped inside another,
// a forgotten run, a thread-local destructor, an aborted task whose work panics on drop)
// leaves the slot empty and drops the handle exactly once.

/// Pending for ever; panics when dropped.
struct PendingPanicsOnDrop;

impl Future for PendingPanicsOnDrop {
    type Output = ();
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        Poll::Pending
    }
}

impl Drop for PendingPanicsOnDrop {
    fn drop(&mut self) {
        // Never while already unwinding (that would abort the test binary).
        if !std::thread::panicking() {
            panic!("the work panics when dropped");
        }
    }
}

fn poll_once<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn a_run_whose_work_panics_when_dropped_leaves_no_current_scope_and_drops_its_handle_once() {
    let parent = Scope::new();
    let work = parent.child().name("work").build().unwrap();
    let mut run = Box::pin(work.run(PendingPanicsOnDrop));
    // Pending: the run is now among the scope's cancel waiters.
    assert!(poll_once(run.as_mut()).is_pending());
    drop(work);
    assert_eq!(parent.__live_children(), 1, "the run holds the last handle");
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(run)));
    assert!(dropped.is_err(), "the work's panic goes on");
    assert!(Scope::try_current().is_none(), "the slot is empty again");
    assert_eq!(
        parent.__live_children(),
        0,
        "the run's handle was dropped (once): the child retired"
    );
    let sibling = parent.child().build().unwrap();
    assert_eq!(parent.__live_children(), 1);
    parent.cancel();
    assert!(sibling.is_cancelled());
}

#[test]
fn a_run_polled_and_dropped_inside_another_runs_poll_gives_the_outer_scope_back() {
    let outer = Scope::new().child().name("outer").build().unwrap();
    let inner = outer.child().name("inner").build().unwrap();
    let inner_probe = inner.__freed_probe();
    let mut run = Box::pin(outer.run(std::future::poll_fn(move |cx| {
        assert_eq!(Scope::current().name(), Some("outer"));
        let mut nested = Box::pin(inner.clone().run(std::future::pending::<()>()));
        assert!(nested.as_mut().poll(cx).is_pending());
        assert_eq!(
            Scope::current().name(),
            Some("outer"),
            "back after the poll"
        );
        drop(nested);
        assert_eq!(
            Scope::current().name(),
            Some("outer"),
            "back after the drop"
        );
        // A nested run forgotten after its poll leaks its handle but not the slot.
        let mut forgotten = Box::pin(inner.clone().run(std::future::pending::<()>()));
        assert!(forgotten.as_mut().poll(cx).is_pending());
        std::mem::forget(forgotten);
        assert_eq!(
            Scope::current().name(),
            Some("outer"),
            "back after a forget"
        );
        Poll::Ready(())
    })));
    assert!(matches!(poll_once(run.as_mut()), Poll::Ready(Ok(()))));
    assert!(Scope::try_current().is_none());
    drop(run);
    assert!(Scope::try_current().is_none());
    // The forgotten run's handle keeps `inner` alive (a leak, as forgetting any handle is);
    // the dropped one released its own.
    assert!(!inner_probe());
}

#[test]
fn a_run_polled_and_dropped_in_a_thread_local_destructor_sees_its_scope() {
    struct OnExit {
        run: Option<Pin<Box<cancel_scope::Run<std::future::Pending<()>>>>>,
        scope: Scope,
        seen: std::sync::mpsc::Sender<Option<String>>,
    }
    impl Drop for OnExit {
        fn drop(&mut self) {
            // A run made and polled while the thread's locals are being destroyed.
            let mut run = Box::pin(
                self.scope
                    .run(async { Scope::try_current().and_then(|s| s.name().map(str::to_owned)) }),
            );
            let seen = match poll_once(run.as_mut()) {
                Poll::Ready(Ok(name)) => name,
                _ => None,
            };
            // And one polled earlier, dropped here.
            drop(self.run.take());
            let _ = self.seen.send(seen);
            let _ = self
                .seen
                .send(Scope::try_current().map(|_| "left".to_owned()));
        }
    }
    thread_local! {
        static ON_EXIT: std::cell::RefCell<Option<OnExit>> = const { std::cell::RefCell::new(None) };
    }
    let scope = Scope::new().child().name("exit").build().unwrap();
    let probe = scope.__freed_probe();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut run = Box::pin(scope.run(std::future::pending::<()>()));
        assert!(poll_once(run.as_mut()).is_pending());
        ON_EXIT.with(|s| {
            *s.borrow_mut() = Some(OnExit {
                run: Some(run),
                scope,
                seen: tx,
            })
        });
    })
    .join()
    .expect("no panic in the thread's destructors");
    assert_eq!(rx.recv().unwrap().as_deref(), Some("exit"));
    assert_eq!(rx.recv().unwrap(), None, "the slot is empty after");
    assert!(probe(), "every handle was dropped");
}

#[tokio::test]
async fn an_aborted_task_whose_work_panics_when_dropped_records_failed_once() {
    let s = Scope::new();
    let h = s.spawn(PendingPanicsOnDrop).unwrap();
    tokio::task::yield_now().await;
    h.abort();
    assert!(h.await.unwrap_err().is_panic());
    assert!(Scope::try_current().is_none());
    s.close();
    let r = s.quiesce().await;
    assert_eq!((r.failed(), r.total()), (1, 1), "{r:?}");
}

#[tokio::test]
async fn a_cancelled_task_whose_work_panics_when_dropped_records_failed_once() {
    let s = Scope::new();
    let h = s.spawn(PendingPanicsOnDrop).unwrap();
    tokio::task::yield_now().await;
    s.cancel();
    assert!(h.await.unwrap_err().is_panic());
    let r = s.quiesce().await;
    assert_eq!((r.failed(), r.total()), (1, 1), "{r:?}");
}
