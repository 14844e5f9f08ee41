//! Tasks spawned in a scope: refused after cancel, stopped at the next await, receipted.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cancel_scope::{Cause, Lifecycle, Scope};

#[tokio::test]
async fn spawn_after_cancel_is_refused_without_running_the_future() {
    let s = Scope::new();
    s.cancel();
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let err = s
        .spawn(async move { r.store(true, Ordering::SeqCst) })
        .unwrap_err();
    assert!(err.is_cancelled());
    tokio::task::yield_now().await;
    assert!(!ran.load(Ordering::SeqCst));
    let closed = Scope::new();
    closed.close();
    assert!(closed.spawn(async {}).unwrap_err().is_closed());
    assert!(closed.spawn_blocking(|| ()).unwrap_err().is_closed());
}

#[tokio::test(start_paused = true)]
async fn a_cancel_stops_the_task_at_its_next_await_and_records_cancelled() {
    let s = Scope::new();
    let reached_end = Arc::new(AtomicBool::new(false));
    let flag = reached_end.clone();
    let h = s
        .spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            flag.store(true, Ordering::SeqCst);
        })
        .unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    s.cancel_with("client left");
    let err = h.await.unwrap_err();
    assert_eq!(err.cause().unwrap().reason(), Some("client left"));
    assert!(!reached_end.load(Ordering::SeqCst));
    let r = s.quiesce().await;
    assert_eq!((r.cancelled(), r.succeeded()), (1, 0));
    assert_eq!(r.state(), Lifecycle::CancelledStable);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_stops_tasks_with_deadline_exceeded() {
    let s = Scope::with_timeout(Duration::from_millis(100));
    let h = s
        .spawn(tokio::time::sleep(Duration::from_millis(350)))
        .unwrap();
    let start = tokio::time::Instant::now();
    assert!(h.await.unwrap_err().is_deadline_exceeded());
    assert_eq!(start.elapsed(), Duration::from_millis(100));
}

#[tokio::test]
async fn a_panicking_task_records_failed_and_the_handle_says_so() {
    let s = Scope::new();
    let h = s.spawn(async { panic!("boom") }).unwrap();
    assert!(h.await.unwrap_err().is_panic());
    s.close();
    let r = s.quiesce().await;
    assert_eq!((r.failed(), r.total()), (1, 1));
}

#[tokio::test]
async fn an_aborted_task_records_cancelled() {
    let s = Scope::new();
    let h = s.spawn(std::future::pending::<()>()).unwrap();
    h.abort();
    assert!(h.await.unwrap_err().is_cancelled());
    s.close();
    assert_eq!(s.quiesce().await.cancelled(), 1);
}

#[tokio::test]
async fn spawn_blocking_yields_the_output_and_succeeds() {
    let s = Scope::new();
    let h = s
        .spawn_blocking(|| Scope::current().is_cancelled())
        .unwrap();
    assert!(!h.await.unwrap());
    s.close();
    assert_eq!(s.quiesce().await.succeeded(), 1);
}

/// Blocks its thread until released, ignoring any cancel; says when it started.
type Stuck = Box<dyn FnOnce() + Send>;

/// Starts a child with `start` (which runs the `Stuck` it is given, then returns `late`) in a
/// scope with a short grace period, cancels the scope while the child is stuck, and checks that
/// `quiesce()` quarantines it under `name` and that its late outcome changes nothing.
async fn stuck_child_is_quarantined<T: PartialEq + std::fmt::Debug>(
    name: &str,
    late: T,
    start: impl FnOnce(&Scope, Stuck) -> cancel_scope::JoinHandle<T>,
) {
    let s = Scope::new()
        .child()
        .grace(Duration::from_millis(20))
        .build()
        .unwrap();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let h = start(
        &s,
        Box::new(move || {
            started_tx.send(()).unwrap();
            release_rx.recv().unwrap(); // ignores the cancel until released
        }),
    );
    started_rx.await.unwrap();
    s.cancel();
    let report = s.quiesce().await;
    assert_eq!((report.quarantined(), report.total()), (1, 1));
    assert_eq!(report.quarantined_children()[0].name(), name);
    assert_eq!(report.state(), Lifecycle::CancelledStable);
    // The late outcome is ignored: the report does not change.
    release_tx.send(()).unwrap();
    assert_eq!(h.await.unwrap(), late);
    assert_eq!(s.quiesce().await, report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_child_that_outlives_the_grace_period_is_quarantined() {
    stuck_child_is_quarantined("blocking", "late", |s, stuck| {
        s.spawn_blocking(move || {
            stuck();
            "late"
        })
        .unwrap()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_ignores_the_cancel_is_quarantined_and_its_late_outcome_ignored() {
    stuck_child_is_quarantined("task", "late", |s, stuck| {
        // Blocks its worker thread: the cancel cannot stop it at an await point.
        s.spawn(async move {
            stuck();
            "late"
        })
        .unwrap()
    })
    .await;
}

/// A fallible task quarantined while stuck, whose late `Err` comes after `quiesce()`
/// resolved: neither its receipt nor its error reaches the report, which is final.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantined_fallible_tasks_late_error_is_not_in_the_report() {
    stuck_child_is_quarantined("task", Err("late"), |s, stuck| {
        s.spawn_fallible(async move {
            stuck();
            Err::<(), _>("late")
        })
        .unwrap()
    })
    .await;
}

/// `spawn_fallible`: a task that returns `Err` ends `Failed`, its error listed (with where
/// it ran) in the report of its scope and of the request above it, while the caller gets the
/// error value itself; `Ok` is `Succeeded`. `spawn` receipts completion: its `Err` is a
/// success as far as the scope knows.
#[tokio::test]
async fn a_fallible_task_that_returns_err_is_failed_with_its_error_in_the_report() {
    #[derive(Debug, PartialEq)]
    struct OutOfStock(u32);
    impl std::fmt::Display for OutOfStock {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "item {} is out of stock", self.0)
        }
    }
    let request = Scope::new();
    let handler = request.child().name("checkout").build().unwrap();
    let ok = handler
        .spawn_fallible(async { Ok::<_, OutOfStock>(3) })
        .unwrap();
    let bad = handler
        .spawn_fallible(async { Err::<u32, _>(OutOfStock(42)) })
        .unwrap();
    let plain = handler
        .spawn(async { Err::<u32, _>(OutOfStock(7)) })
        .unwrap();
    assert_eq!(ok.await.unwrap(), Ok(3));
    assert_eq!(bad.await.unwrap(), Err(OutOfStock(42)));
    assert_eq!(plain.await.unwrap(), Err(OutOfStock(7)));

    request.close();
    for report in [request.quiesce().await, handler.quiesce().await] {
        assert_eq!((report.succeeded(), report.failed()), (2, 1), "{report}");
        let failures = report.failures();
        assert_eq!(failures.len(), 1, "{report}");
        assert_eq!(failures[0].scope(), Some("checkout"));
        assert_eq!(failures[0].child(), "task");
        assert_eq!(failures[0].error(), "item 42 is out of stock");
        assert_eq!(report.state(), Lifecycle::Completed);
    }
}

/// An error whose `Display` panics is the task's panic: `Failed`, nothing listed, the handle
/// says it panicked, and the scope goes quiet.
#[tokio::test]
async fn a_fallible_task_whose_error_cannot_be_displayed_records_failed() {
    #[derive(Debug)]
    struct Unprintable;
    impl std::fmt::Display for Unprintable {
        fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            panic!("cannot print this error")
        }
    }
    let s = Scope::new();
    let h = s
        .spawn_fallible(async { Err::<(), _>(Unprintable) })
        .unwrap();
    assert!(h.await.unwrap_err().is_panic());
    s.close();
    let report = s.quiesce().await;
    assert_eq!((report.failed(), report.total()), (1, 1), "{report}");
    assert!(report.failures().is_empty());
}

/// A blocking child still queued for a thread of the blocking pool when its scope is
/// cancelled and quarantined never starts: after `quiesce()` resolved nothing of the scope
/// may start (invariant 6), as a task is not polled once its scope is cancelled.
// regression: the closure ran when a thread was free, after the report said it had stopped.
#[test]
fn a_blocking_child_not_started_by_the_quarantine_never_runs() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(1)
        .build()
        .unwrap();
    rt.block_on(async {
        // The pool's one thread is taken until released.
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let busy = tokio::task::spawn_blocking(move || {
            started_tx.send(()).unwrap();
            release_rx.recv().unwrap();
        });
        started_rx.await.unwrap();
        let s = Scope::new().child().grace(Duration::ZERO).build().unwrap();
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        // Queued: no thread is free.
        let h = s
            .spawn_blocking(move || flag.store(true, Ordering::SeqCst))
            .unwrap();
        s.cancel();
        let report = s.quiesce().await;
        assert_eq!((report.quarantined(), report.total()), (1, 1), "{report}");
        release_tx.send(()).unwrap();
        busy.await.unwrap();
        assert!(h.await.unwrap_err().is_cancelled());
        assert!(
            !ran.load(Ordering::SeqCst),
            "the blocking child started after quiesce() resolved"
        );
        assert_eq!(s.quiesce().await, report);
    });
}

#[tokio::test(start_paused = true)]
async fn a_cancel_wakes_every_waiting_task_of_the_scope_and_its_children() {
    let root = Scope::new();
    let children: Vec<Scope> = (0..3).map(|_| root.child().build().unwrap()).collect();
    let mut handles = Vec::new();
    for i in 0..60 {
        // Work that never completes and no timer: only the cancel can end it.
        let scope = if i % 4 == 0 { &root } else { &children[i % 3] };
        handles.push(scope.spawn(std::future::pending::<()>()).unwrap());
    }
    tokio::task::yield_now().await; // let the tasks poll once and wait
    root.cancel_because(Cause::ClientGone);
    for h in handles {
        assert_eq!(
            h.await.unwrap_err().cause().map(Cause::origin),
            Some(&Cause::ClientGone)
        );
    }
    let r = root.quiesce().await;
    assert_eq!((r.cancelled(), r.total()), (60, 60));
    assert_eq!(r.state(), Lifecycle::CancelledStable);
}

#[tokio::test]
async fn a_task_whose_finished_work_panics_when_dropped_records_failed() {
    struct PanicsOnDrop;
    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            panic!("drop");
        }
    }
    /// Ready at once, and keeps its guard until the task drops it.
    struct Work(#[allow(dead_code)] PanicsOnDrop);
    impl std::future::Future for Work {
        type Output = ();
        fn poll(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<()> {
            std::task::Poll::Ready(())
        }
    }
    let s = Scope::new();
    let h = s.spawn(Work(PanicsOnDrop)).unwrap();
    assert!(h.await.unwrap_err().is_panic());
    s.close();
    let r = s.quiesce().await;
    assert_eq!((r.failed(), r.total()), (1, 1));
}

#[tokio::test]
async fn a_task_whose_work_panics_after_a_pending_poll_records_failed_once() {
    let s = Scope::new();
    let h = s
        .spawn(async {
            tokio::task::yield_now().await;
            panic!("boom");
        })
        .unwrap();
    assert!(h.await.unwrap_err().is_panic());
    s.close();
    let r = s.quiesce().await;
    assert_eq!((r.failed(), r.total()), (1, 1));
}

#[tokio::test(flavor = "current_thread")]
async fn current_is_the_task_scope_then_a_nested_run_then_the_task_scope_again() {
    let parent = Scope::new();
    let task_scope = parent.child().name("task").build().unwrap();
    let inner = task_scope.child().name("inner").build().unwrap();
    let names = task_scope
        .spawn(async move {
            let before = Scope::current().name().map(str::to_owned);
            let during = inner
                .run(async {
                    tokio::task::yield_now().await;
                    Scope::current().name().map(str::to_owned)
                })
                .await
                .unwrap();
            tokio::task::yield_now().await;
            let after = Scope::current().name().map(str::to_owned);
            (before, during, after)
        })
        .unwrap()
        .await
        .unwrap();
    assert_eq!(
        names,
        (
            Some("task".to_owned()),
            Some("inner".to_owned()),
            Some("task".to_owned())
        )
    );
    // Outside any task the thread has no current scope left behind.
    assert!(Scope::try_current().is_none());
}

#[tokio::test(flavor = "current_thread")]
async fn a_panicking_poll_leaves_no_current_scope_behind() {
    let scope = Scope::new();
    let failing = scope.child().name("failing").build().unwrap();
    let h = failing
        .spawn(async {
            tokio::task::yield_now().await;
            panic!("boom");
        })
        .unwrap();
    assert!(h.await.is_err());
    assert!(Scope::try_current().is_none());
    // The next task polled on this thread sees its own scope, and its receipt is recorded.
    let next = scope.child().name("next").build().unwrap();
    let name = next
        .spawn(async { Scope::current().name().map(str::to_owned) })
        .unwrap()
        .await
        .unwrap();
    assert_eq!(name.as_deref(), Some("next"));
    failing.close();
    let report = failing.quiesce().await;
    assert_eq!(report.failed(), 1);
}

#[tokio::test]
async fn a_task_woken_after_the_cancel_never_polls_its_work_again() {
    use std::sync::atomic::AtomicUsize;
    let s = Scope::new();
    let polls = Arc::new(AtomicUsize::new(0));
    let first_poll = Arc::new(tokio::sync::Notify::new());
    let (p, f) = (polls.clone(), first_poll.clone());
    let h = s
        .spawn(std::future::poll_fn(move |_| {
            p.fetch_add(1, Ordering::SeqCst);
            f.notify_one();
            std::task::Poll::<()>::Pending
        }))
        .unwrap();
    first_poll.notified().await;
    // The cancel wakes the task; its next poll must end it without touching the work.
    s.cancel();
    assert!(h.await.unwrap_err().is_cancelled());
    assert_eq!(polls.load(Ordering::SeqCst), 1);
}
