//! Quarantine of spawned tasks that have not yet waited: a task is counted, not listed, until
//! its first `Pending`, and must still be quarantined if its first poll never ends, while its
//! late end (ready, pending, or dropped) records no second receipt.
//!
//! The stuck tasks run on a runtime of their own (a worker thread they can block), while the
//! test, and so `quiesce()`'s grace period, runs on a paused clock: the grace period ends as
//! soon as the test has nothing else to do. A `quiesce()` that waits for a receipt that never
//! comes hits the one-hour timeout (virtual) and fails instead of hanging.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use cancel_scope::{Lifecycle, Report, Scope};

use crate::support::panics::{quiet_panics, SetOnDrop};
use crate::support::wakers::Counts;

/// A runtime for the tasks that block their thread (not the test's paused one).
fn stuck_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap()
}

/// A task whose first poll blocks its worker thread (ignoring any cancel) until released.
struct Stuck<T> {
    handle: cancel_scope::JoinHandle<T>,
    /// Resolves once the first poll has started.
    started: tokio::sync::oneshot::Receiver<()>,
    /// Ends the blocking part of the first poll; the task then runs `then`.
    release: mpsc::Sender<()>,
}

/// Spawns a [`Stuck`] task of `s` on `rt`: after its blocking part it runs `then`.
fn spawn_stuck<T: Send + 'static>(
    rt: &tokio::runtime::Runtime,
    s: &Scope,
    then: impl std::future::Future<Output = T> + Send + 'static,
) -> Stuck<T> {
    let (release, release_rx) = mpsc::channel::<()>();
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let _on = rt.enter();
    let handle = s
        .spawn(async move {
            started_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            then.await
        })
        .unwrap();
    Stuck {
        handle,
        started,
        release,
    }
}

/// `quiesce()`, failing instead of hanging if it waits for a receipt that never comes.
async fn quiesce(s: &Scope) -> Report {
    tokio::time::timeout(Duration::from_secs(3600), s.quiesce())
        .await
        .expect("quiesce() waits for a task that has no receipt coming")
}

/// A scope with a grace period of 20 ms (virtual).
fn scope() -> Scope {
    Scope::new()
        .child()
        .grace(Duration::from_millis(20))
        .build()
        .unwrap()
}

/// Blocks its thread inside the first poll until released, then returns "late".
#[tokio::test(start_paused = true)]
async fn a_task_stuck_in_its_first_poll_is_quarantined_and_its_late_output_records_nothing() {
    let rt = stuck_runtime();
    let s = scope();
    let stuck = spawn_stuck(&rt, &s, async { "late" });
    stuck.started.await.unwrap();
    s.cancel();
    let report = quiesce(&s).await;
    assert_eq!((report.quarantined(), report.total()), (1, 1), "{report:?}");
    assert_eq!(report.quarantined_children()[0].name(), "task");
    assert_eq!(report.state(), Lifecycle::CancelledStable);
    // The first poll ends with the output: the handle yields it, and nothing is recorded.
    stuck.release.send(()).unwrap();
    assert_eq!(stuck.handle.await.unwrap(), "late");
    assert_eq!(quiesce(&s).await, report);
    rt.shutdown_background();
}

/// The same task, released after the quarantine into an `.await` that does not complete: its
/// first `Pending` finds it quarantined, so it is stopped (its work dropped) and records nothing.
#[tokio::test(start_paused = true)]
async fn a_quarantined_task_whose_first_poll_ends_pending_is_stopped_and_records_nothing() {
    let rt = stuck_runtime();
    let s = scope();
    let dropped = Arc::new(AtomicBool::new(false));
    let guard = SetOnDrop(dropped.clone());
    let stuck = spawn_stuck(&rt, &s, async move {
        let _guard = guard;
        std::future::pending::<()>().await;
    });
    stuck.started.await.unwrap();
    s.cancel();
    let report = quiesce(&s).await;
    assert_eq!((report.quarantined(), report.total()), (1, 1), "{report:?}");
    assert!(
        !dropped.load(Ordering::SeqCst),
        "the work is still in its poll"
    );
    stuck.release.send(()).unwrap();
    assert!(stuck.handle.await.unwrap_err().is_cancelled());
    assert!(dropped.load(Ordering::SeqCst), "a quarantined task stops");
    assert_eq!(quiesce(&s).await, report);
    rt.shutdown_background();
}

/// A task quarantined before it is first polled (no cancel has reached it: the quarantine of
/// an ended grace period can overtake the cancel walk) runs its work once; its output records
/// nothing, and so does the drop of one that is aborted before its first poll.
#[tokio::test(start_paused = true)]
async fn tasks_quarantined_before_their_first_poll_record_nothing_when_they_end() {
    let s = Scope::new();
    let polls = Arc::new(AtomicUsize::new(0));
    let p = polls.clone();
    let finishes = s
        .spawn(async move {
            p.fetch_add(1, Ordering::SeqCst);
            7
        })
        .unwrap();
    let aborted = s.spawn(std::future::pending::<()>()).unwrap();
    // Neither has been polled: the test has not yielded.
    assert_eq!(s.__quarantine_now(), 2);
    aborted.abort();
    assert_eq!(finishes.await.unwrap(), 7);
    assert!(aborted.await.unwrap_err().is_cancelled());
    assert_eq!(polls.load(Ordering::SeqCst), 1);
    s.close();
    let report = quiesce(&s).await;
    assert_eq!((report.quarantined(), report.total()), (2, 2), "{report:?}");
    assert_eq!(report.quarantined_children().len(), 2);
    // Quarantined without a cancel, read-only: nothing to reconcile.
    assert_eq!(report.state(), Lifecycle::Completed);
}

/// A task that has waited (listed) and one still in its first poll (counted) are both
/// quarantined, once each, and a second quarantine finds neither.
#[tokio::test(start_paused = true)]
async fn listed_and_unlisted_tasks_are_each_quarantined_once() {
    let rt = stuck_runtime();
    let s = scope();
    let stuck = spawn_stuck(&rt, &s, async {});
    // Waits on the test's runtime: listed at its first `Pending`.
    let (_never_tx, never_rx) = tokio::sync::oneshot::channel::<()>();
    let waiting = s.spawn(never_rx).unwrap();
    stuck.started.await.unwrap();
    tokio::task::yield_now().await; // `waiting` polls once and lists itself
    assert_eq!(s.__quarantine_now(), 2);
    assert_eq!(s.__quarantine_now(), 0);
    // The listed one is woken by the quarantine and stops; the stuck one ends late.
    assert!(waiting.await.unwrap_err().is_cancelled());
    stuck.release.send(()).unwrap();
    stuck.handle.await.unwrap();
    s.close();
    let report = quiesce(&s).await;
    assert_eq!((report.quarantined(), report.total()), (2, 2), "{report:?}");
    rt.shutdown_background();
}

/// Stress: tasks of every kind (ready at once, waiting once, blocking their first poll for a
/// moment, panicking, never ending) spawned on two worker threads while other threads run
/// quarantines and a cancel: every task has exactly one receipt, the quarantine counts agree
/// with the report, the scope (and its parent) reach quiet (units balanced), and the late
/// ends change nothing.
#[test]
fn receipts_and_units_balance_when_quarantines_race_spawns_and_first_polls() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    quiet_panics(|m| m.starts_with("task ") && m.ends_with(" panics")); // kind 3 below
    for round in 0..40u64 {
        let root = Scope::new();
        let s = root.child().build().unwrap();
        let started = Arc::new(AtomicUsize::new(0));
        // Quarantines (and, every other round, the cancel first) while the workers poll the
        // tasks, once a number of them that grows with the round has started.
        let quarantined = Arc::new(AtomicUsize::new(0));
        let quarantiner = {
            let (s, q, started) = (s.clone(), quarantined.clone(), started.clone());
            std::thread::spawn(move || {
                while started.load(Ordering::SeqCst) < (round as usize * 12).min(450) {
                    std::thread::yield_now();
                }
                if round % 2 == 1 {
                    s.cancel();
                }
                for _ in 0..20 {
                    q.fetch_add(s.__quarantine_now(), Ordering::SeqCst);
                    std::thread::yield_now();
                }
            })
        };
        let mut handles = Vec::new();
        for i in 0..500u64 {
            let kind = (i * 7 + round) % 5;
            let started = started.clone();
            let work = async move {
                started.fetch_add(1, Ordering::SeqCst);
                match kind {
                    0 => {}
                    1 => tokio::task::yield_now().await,
                    2 => std::thread::sleep(Duration::from_micros(20)), // a first poll that blocks
                    3 => panic!("task {i} panics"),
                    _ => std::future::pending::<()>().await,
                }
            };
            let _on = rt.enter();
            match s.spawn(work) {
                Ok(h) => handles.push(h),
                Err(e) => assert!(e.is_cancelled()),
            }
        }
        quarantiner.join().unwrap();
        s.cancel();
        quarantined.fetch_add(s.__quarantine_now(), Ordering::SeqCst);
        let report = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(60), s.quiesce())
                .await
                .expect("a task without its receipt")
        });
        let q = quarantined.load(Ordering::SeqCst) as u64;
        assert_eq!(report.total(), handles.len() as u64, "one receipt per task");
        assert_eq!(report.quarantined(), q, "{report:?}");
        assert_eq!(report.quarantined_children().len() as u64, q);
        assert_eq!(report.state(), Lifecycle::CancelledStable);
        rt.block_on(async {
            for h in handles {
                let _ = h.await;
            }
        });
        assert_eq!(rt.block_on(s.quiesce()), report, "the report is stable");
        root.close();
        let top = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(60), root.quiesce())
                .await
                .expect("the parent keeps a unit of a quiet child")
        });
        assert_eq!(top.total(), report.total());
    }
}

/// A quarantine that overtakes a cancel walk, below the depth the walk holds its locks to, and
/// takes a waiting task out of its scope's in-flight list wakes that task: once polled, it
/// stops (it is not left waiting forever with its scope cancelled and its unit given back).
///
/// The quarantine is what `quiesce()` does when its grace period ends (with a grace of zero,
/// at once) on another thread once it sees the root cancelled. Here it runs from a waker that
/// the walk wakes between two of its steps (after the locks of the first 32 levels are
/// released, before the deeper part of the chain is walked), which makes the interleaving
/// deterministic.
// regression: the quarantine dropped the task's waker unwoken: the task waited forever.
#[test]
fn a_task_quarantined_before_the_cancel_walk_reaches_its_scope_is_still_woken() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    let mut chain = vec![Scope::new()];
    for _ in 0..40 {
        let next = chain.last().unwrap().child().build().unwrap();
        chain.push(next);
    }
    let root = chain[0].clone();

    // A task waiting in the deepest scope (its work never completes by itself).
    let mut task = Box::pin(
        chain[40]
            .__task(std::future::pending::<()>())
            .expect("spawned before the cancel"),
    );
    let task_waker = Arc::new(Counts::default());
    let waker = Waker::from(task_waker.clone());
    assert!(task
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());

    // Woken by the walk with its first steps done: quarantine, as an ended grace period does.
    let quarantined = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let hook = {
        let (root, quarantined) = (root.clone(), quarantined.clone());
        Counts::with_hook(move || {
            let n = root.__quarantine_now();
            quarantined.store(n, std::sync::atomic::Ordering::SeqCst);
        })
    };
    let mut waiting = Box::pin(chain[1].cancelled());
    let hook_waker = Waker::from(hook.clone());
    assert!(waiting
        .as_mut()
        .poll(&mut Context::from_waker(&hook_waker))
        .is_pending());

    root.cancel();
    assert_eq!(hook.woken(), 1);
    assert_eq!(
        quarantined.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the task was quarantined while the walk was under way"
    );
    assert!(chain[40].is_cancelled());
    // The task's scope is cancelled: the task must have been told, or it never stops.
    assert!(
        task_waker.woken() > 0,
        "a task of a cancelled scope was quarantined without ever being woken"
    );
    // And once polled, it stops.
    let polled = task.as_mut().poll(&mut Context::from_waker(&waker));
    assert!(
        matches!(polled, Poll::Ready(Err(ref e)) if e.is_cancelled()),
        "{polled:?}"
    );
}
