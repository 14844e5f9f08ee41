//! loom models of spawned tasks: the one compare-and-swap that registers and dispatches a task
//! racing a cancel, the cancel waking the tasks that wait, and a task's receipt racing a
//! quarantine (docs/design.md invariants 2, 5 and 6).
//!
//! There is no runtime under loom: `Scope::__task` gives the future that `spawn` would hand
//! to tokio, and a model thread polls it with `block_on` (running the task) or drops it
//! unpolled (aborting it).
#![cfg(loom)]

use cancel_scope::{Cause, Error, Lifecycle, Scope};
use cancel_scope_loom_tests::{model, model_bounded, THREE_THREAD_PREEMPTIONS};
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

/// Model 15: two tasks are spawned in one scope, each on its own thread, and wait (their work
/// never completes) while the scope's deadline cancel runs on a third.
///
/// Invariant 2: spawning either fails with the cancel's cause or happens-before the cancel.
/// The witness, as in model 6: each spawner writes a flag (`Relaxed`) just before `__task`,
/// the canceller reads both after `cancel_because` returns; a task that was registered and
/// dispatched (by one CAS) must have its flag seen. No lost wake-up: each dispatched task,
/// waiting with its waker in the scope's in-flight list, is woken by the cancel, which marks
/// that list and wakes the wakers it holds, and ends `Err(deadline)` —
/// loom reports a deadlock if a `block_on` is never woken. Invariant 5: the report counts one
/// `Cancelled` receipt per dispatched task.
#[test]
fn spawned_tasks_waiting_racing_cancel() {
    model_bounded(
        "spawned_tasks_waiting_racing_cancel",
        THREE_THREAD_PREEMPTIONS,
        || {
            let scope = Scope::new();
            let spawner = |flag: Arc<AtomicBool>| {
                let scope = scope.clone();
                thread::spawn(move || {
                    flag.store(true, Ordering::Relaxed);
                    match scope.__task(std::future::pending::<()>()) {
                        Ok(task) => {
                            let err = loom::future::block_on(task).unwrap_err();
                            assert!(err.is_deadline_exceeded(), "unexpected error {err:?}");
                            true
                        }
                        Err(e) => {
                            assert!(e.is_deadline_exceeded(), "unexpected error {e:?}");
                            false
                        }
                    }
                })
            };
            let flags = [
                Arc::new(AtomicBool::new(false)),
                Arc::new(AtomicBool::new(false)),
            ];
            let spawners = flags.clone().map(spawner);
            scope.cancel_because(Cause::DeadlineExceeded);
            let seen = flags.map(|f| f.load(Ordering::Relaxed));
            let mut dispatched = 0;
            for (spawner, seen) in spawners.into_iter().zip(seen) {
                if spawner.join().unwrap() {
                    dispatched += 1;
                    assert!(seen, "a task dispatched after the cancel");
                }
            }
            let report = loom::future::block_on(scope.quiesce());
            assert_eq!(report.total(), dispatched);
            assert_eq!(report.cancelled(), dispatched);
            assert_eq!(report.state(), Lifecycle::CancelledStable);
        },
    );
}

/// Model 16: a task in a child scope is spawned and waits while the root is cancelled: the
/// cancel walks down to the child scope, marks its in-flight list and wakes the task
/// (invariants 1, 2).
#[test]
fn spawned_task_in_child_scope_racing_root_cancel() {
    model("spawned_task_in_child_scope_racing_root_cancel", || {
        let root = Scope::new();
        let sub = root.child().build().unwrap();
        let flag = Arc::new(AtomicBool::new(false));
        let spawner = {
            let (sub, flag) = (sub.clone(), flag.clone());
            thread::spawn(move || {
                flag.store(true, Ordering::Relaxed);
                match sub.__task(std::future::pending::<()>()) {
                    Ok(task) => {
                        let err = loom::future::block_on(task).unwrap_err();
                        assert_eq!(
                            err.cause().map(Cause::origin),
                            Some(&Cause::ClientGone),
                            "{err:?}"
                        );
                        assert!(matches!(err.cause(), Some(Cause::ParentCancelled(_))));
                        true
                    }
                    Err(_) => false,
                }
            })
        };
        root.cancel_because(Cause::ClientGone);
        let seen = flag.load(Ordering::Relaxed);
        let dispatched = spawner.join().unwrap();
        if dispatched {
            assert!(seen, "a task dispatched after the cancel");
        }
        let report = loom::future::block_on(root.quiesce());
        assert_eq!(report.cancelled(), u64::from(dispatched));
        assert_eq!(report.state(), Lifecycle::CancelledStable);
    });
}

/// Spawns two tasks of `scope` (unspawned, see `__task`) that end on a new thread: one runs
/// its work (ready with 7), one is dropped unpolled (aborted). Yields the first one's outcome.
fn end_two_tasks_on_a_thread(scope: &Scope) -> thread::JoinHandle<Result<i32, Error>> {
    let runs = scope.__task(std::future::ready(7)).unwrap();
    let aborted = scope.__task(std::future::ready(8)).unwrap();
    thread::spawn(move || {
        let out = loom::future::block_on(runs);
        drop(aborted);
        out
    })
}

/// Model 17: two tasks end on one thread — one runs to completion, one is dropped unpolled
/// (aborted) — while the scope is cancelled, quarantined and quiesced on another.
///
/// Invariant 5: each task has exactly one receipt — its own (`Succeeded`, `Cancelled`) or
/// `Quarantined` — whoever takes its entry out of the in-flight list first. Invariant 6: the
/// report read when `quiesce()` resolves does not change with the late receipts.
#[test]
fn task_receipt_racing_quarantine() {
    model("task_receipt_racing_quarantine", || {
        let scope = Scope::new();
        let owner = end_two_tasks_on_a_thread(&scope);
        scope.cancel();
        let quarantined = scope.__quarantine_now();
        let report = loom::future::block_on(scope.quiesce());
        let out = owner.join().unwrap();

        assert_eq!(report.total(), 2, "{report:?}");
        assert_eq!(report.quarantined(), quarantined as u64);
        assert_eq!(
            report.cancelled() + report.succeeded() + report.quarantined(),
            2
        );
        // The task's work ran only if it was not stopped by the cancel first.
        assert!(report.succeeded() <= u64::from(out.is_ok()));
        assert_eq!(report.quarantined_children().len(), quarantined);
        assert_eq!(report.state(), Lifecycle::CancelledStable);
        // Invariant 6: the late receipts changed nothing.
        assert_eq!(loom::future::block_on(scope.quiesce()), report);
    });
}

/// Model 21: a task waits in a grandchild scope while the root is cancelled on one thread and
/// quarantined (what `quiesce()` does when a grace period of zero ends, once it sees the root
/// cancelled) on another.
///
/// The quarantine can overtake the cancel walk (under loom the walk holds its locks one level
/// down only, so the grandchild's parent is walked from the work list, after the locks were
/// released): it then takes the task out of the in-flight list before the walk reaches the
/// grandchild, and the walk finds no task to wake. The quarantine must wake it itself, or
/// the task of a cancelled scope waits forever (loom reports the `block_on` that is never
/// woken). Invariant 5: one receipt, the task's own `Cancelled` or `Quarantined`.
#[test]
fn quarantine_overtaking_the_cancel_walk_wakes_the_task() {
    model_bounded(
        "quarantine_overtaking_the_cancel_walk_wakes_the_task",
        THREE_THREAD_PREEMPTIONS,
        || {
            let root = Scope::new();
            let child = root.child().build().unwrap();
            let grandchild = child.child().build().unwrap();
            let task = grandchild.__task(std::future::pending::<()>()).unwrap();
            let runner = thread::spawn(move || loom::future::block_on(task));
            let canceller = {
                let root = root.clone();
                thread::spawn(move || root.cancel())
            };
            // A `quiesce()` with a grace period of zero: waits for the cancel, then quarantines.
            while !root.is_cancelled() {
                thread::yield_now();
            }
            let quarantined = root.__quarantine_now();
            let out = runner.join().unwrap();
            canceller.join().unwrap();
            assert!(out.unwrap_err().is_cancelled());
            assert!(grandchild.is_cancelled());
            let report = loom::future::block_on(root.quiesce());
            assert_eq!(report.total(), 1, "{report:?}");
            assert_eq!(report.quarantined(), quarantined as u64);
            assert_eq!(report.cancelled() + report.quarantined(), 1, "{report:?}");
            assert_eq!(report.state(), Lifecycle::CancelledStable);
        },
    );
}

/// Model 33: a task whose work ends at its first poll (it never waits, so it is only counted
/// in its in-flight shard's unlisted word, never listed), and a task dropped unpolled (aborted),
/// end on one thread while the scope is quarantined on another (no cancel: the work runs).
///
/// Invariant 5: each task has exactly one receipt — its own (`Succeeded`, `Cancelled`) if its
/// epoch-checked decrement of the count came first, `Quarantined` if the quarantine's bump of
/// the epoch (which takes the whole count) did; the loser records nothing. Units: the scope,
/// closed afterwards, becomes quiet (a unit released twice or never makes `quiesce()` wait
/// forever, which loom reports). Invariant 6: the report does not change.
#[test]
fn unlisted_task_ending_at_first_poll_racing_quarantine() {
    model(
        "unlisted_task_ending_at_first_poll_racing_quarantine",
        || {
            let scope = Scope::new();
            let owner = end_two_tasks_on_a_thread(&scope);
            let quarantined = scope.__quarantine_now();
            // Not cancelled: the work runs and its output comes back, quarantined or not.
            assert_eq!(owner.join().unwrap().unwrap(), 7);
            scope.close();
            let report = loom::future::block_on(scope.quiesce());
            assert_eq!(report.total(), 2, "{report:?}");
            assert_eq!(report.quarantined(), quarantined as u64);
            assert_eq!(report.quarantined_children().len(), quarantined);
            assert_eq!(
                report.succeeded() + report.cancelled() + report.quarantined(),
                2
            );
            assert!(report.succeeded() <= 1 && report.cancelled() <= 1);
            assert_eq!(report.state(), Lifecycle::Completed);
            assert_eq!(loom::future::block_on(scope.quiesce()), report);
        },
    );
}

/// Model 34: a task whose work waits (its first poll returns `Pending`, and nothing but the
/// scope wakes it) lists itself while the scope is quarantined on another thread.
///
/// The task moves from its shard's unlisted count into the list of another shard (the polling
/// thread's; here the count is the main thread's shard and the list the runner's) under that
/// shard's lock, and the quarantine takes every shard's count before it takes any shard's
/// lock: it meets the task exactly once, in the count (the listing then fails and the task
/// stops at once) or in the list (it takes the entry and wakes the task, which finds itself
/// unlisted and stops). Invariant 5: one `Quarantined` receipt; the task ends
/// `Err(cancelled)`. Walking the shards before taking the counts (or each shard's slab right
/// after its own count), or taking the task out of the count outside the lock, lets the
/// quarantine miss it: the count is 0 and the task waits forever (loom reports the deadlock).
#[test]
fn first_pending_listing_racing_quarantine() {
    model("first_pending_listing_racing_quarantine", || {
        let scope = Scope::new();
        let task = scope.__task(std::future::pending::<()>()).unwrap();
        let runner = thread::spawn(move || loom::future::block_on(task));
        let quarantined = scope.__quarantine_now();
        assert_eq!(quarantined, 1, "the quarantine missed the task");
        let err = runner.join().unwrap().unwrap_err();
        assert!(err.is_cancelled(), "{err:?}");
        scope.close();
        let report = loom::future::block_on(scope.quiesce());
        assert_eq!((report.total(), report.quarantined()), (1, 1), "{report:?}");
        assert_eq!(report.state(), Lifecycle::Completed);
    });
}

/// Model 35: a task whose work waits lists itself, with its waker, at its first `Pending`
/// while the scope is cancelled on another thread.
///
/// No lost wake-up: until it lists itself the task is not waiting (it is in its first poll),
/// and it lists itself under its shard's lock and then reads the cancel mark, which the cancel
/// sets before it takes each shard's lock to wake the listed tasks: either the cancel finds the
/// waker, or the task sees the mark. Reading the mark before listing loses the wake-up (loom
/// reports the deadlock). Invariant 5: one `Cancelled` receipt.
#[test]
fn first_pending_listing_racing_cancel() {
    model("first_pending_listing_racing_cancel", || {
        let scope = Scope::new();
        let task = scope.__task(std::future::pending::<()>()).unwrap();
        let runner = thread::spawn(move || loom::future::block_on(task));
        scope.cancel();
        let err = runner.join().unwrap().unwrap_err();
        assert!(err.is_cancelled(), "{err:?}");
        let report = loom::future::block_on(scope.quiesce());
        assert_eq!((report.total(), report.cancelled()), (1, 1), "{report:?}");
        assert_eq!(report.state(), Lifecycle::CancelledStable);
    });
}
