//! A `quiesce()` racing cancel walks: first polled while a walk is under way, or meeting walks
//! that overtake one another. The shorter grace period below holds, no cancel is lost, and
//! `on_cancel` callbacks stay on the cancelling thread.
//!
//! The interleavings are made deterministic by wakers registered for a scope's cancel
//! (`scope.cancelled()` polled with a waker of ours): a cancel wakes them right after it marks
//! the scope, before its walk goes below it, on the thread that marks it, so a waker that
//! blocks there stands in for that thread being preempted at that point; one that polls stands
//! in for another worker polling at that moment. Timing is virtual (paused clock) wherever
//! timing is asserted; the threads that cancel enter the runtime, so they read the same
//! (virtual) clock as the test.
//!
//! - A `quiesce()` first polled *during* the cancel walk of its own scope, or of a scope that
//!   walk marks (as the common "await the cancel, then drain" supervisor does on a
//!   multi-thread runtime), was not registered when its scope was marked, so it is handed
//!   nothing: its look waits on the scopes the walk has not reached yet, and the
//!   shorter grace period of a child holds (10 ms, not the parent's 1 h; an end also under a
//!   never-ending grace): `a_quiesce_first_polled_during_*`,
//!   `a_quiesce_first_polled_when_a_deep_walk_wakes_an_inner_scope_*` (deterministic, a waker
//!   that polls when woken), `a_supervisor_awaiting_the_cancel_then_quiesce_*` (two workers).
//! - Other races: two cancellers, deadline timers, shields, a grace end passing while the
//!   quiesce arms its timer.
//! - A `quiesce()` first polled while a walk is under way does not run the walk's `on_cancel`
//!   callbacks: they run on the cancelling thread, before `cancel()` returns, and a callback's
//!   panic comes out of `cancel()` (`a_callback_panic_*`, `an_on_cancel_callback_*`). (A
//!   version that finished the walk inside the quiesce's poll broke both.)
//! - The look of a handed scope passes over only the scopes this quiesce has looked at
//!   already: a scope below it marked by the walk of an *ancestor* of the quiesce's scope,
//!   which overtook the handed scope's own walk, is looked at, and its shorter grace holds
//!   (`a_quiesce_handed_its_scope_*`, `an_inner_quiesce_*`; a version that passed over scopes
//!   with an earlier cancel stamp lost it: 1 h instead of 10 ms).
//!
//! A chain of scopes cancelled bottom-up under a waiting `quiesce()` is in `memory`.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use cancel_scope::{Quiesce, Scope};
use tokio::time::Instant;

use crate::support::quiesce::*;

// ------------------------------------------------------------------------------------------
// A quiesce first polled during its own scope's cancel walk.

/// A parent (grace 1 h) whose child (grace 10 ms) has stuck work is cancelled; the parent's
/// own `quiesce()` makes its first poll while the cancel walk has marked the parent but not
/// yet the child (deterministic here through a waker woken by the parent's cancel, before the
/// walk goes down; on a multi-thread runtime another worker does it, see
/// `a_supervisor_awaiting_the_cancel_then_quiesce_keeps_the_childs_shorter_grace`). Not
/// registered at the parent's mark, it is handed nothing; its look waits on the child, which
/// the walk has not reached, and the child's work is quarantined at the child's grace end (10 ms), as when it is
/// first polled once `cancel()` returned (the control). Before, it looked at once and used
/// the parent's 1 h.
#[tokio::test(start_paused = true)]
async fn a_quiesce_first_polled_during_its_scopes_cancel_walk_keeps_the_childs_shorter_grace() {
    let mut got = Vec::new();
    for during_walk in [false, true] {
        let parent = Scope::new().child().grace(secs(3600)).build().unwrap();
        let child = parent.child().grace(ms(10)).build().unwrap();
        let _work = stuck(&child, "stuck");
        let w = FirstPollOnWake::new(&parent, &child);
        let _cancelled = during_walk.then(|| w.arm_on_cancel_of(&parent));
        let start = Instant::now();
        parent.cancel();
        if during_walk {
            assert_eq!(
                *w.child_seen_cancelled.lock().unwrap(),
                Some(false),
                "the first poll ran before the walk reached the child"
            );
        }
        let report = w.report().await;
        assert_eq!(report.quarantined(), 1, "{report}");
        got.push((during_walk, start.elapsed()));
    }
    assert_eq!(
        got,
        [(false, ms(10)), (true, ms(10))],
        "(first polled during the cancel walk, time to quiet)"
    );
}

/// The same with the parent's grace period never ending (`grace(Duration::MAX)`, "wait for
/// the receipts"): the child's 10 ms holds. (Before, the `quiesce()` did not resolve within a
/// day of virtual time while the child's work was stuck.) Control as above.
#[tokio::test(start_paused = true)]
async fn a_quiesce_first_polled_during_the_walk_under_a_never_ending_grace_still_ends() {
    let mut got = Vec::new();
    for during_walk in [false, true] {
        let parent = Scope::new().child().grace(Duration::MAX).build().unwrap();
        let child = parent.child().grace(ms(10)).build().unwrap();
        let _work = stuck(&child, "stuck");
        let w = FirstPollOnWake::new(&parent, &child);
        let _cancelled = during_walk.then(|| w.arm_on_cancel_of(&parent));
        let start = Instant::now();
        parent.cancel();
        let resolved = tokio::time::timeout(secs(24 * 3600), w.report())
            .await
            .is_ok();
        got.push((during_walk, resolved.then(|| start.elapsed())));
    }
    assert_eq!(
        got,
        [(false, Some(ms(10))), (true, Some(ms(10)))],
        "(first polled during the cancel walk, time to quiet; None: not within a day)"
    );
}

/// Not only the scope `cancel()` is called on: any scope the walk marks can be quiesced
/// during the walk. Here the cancelled top is 33 scopes above `inner` (grace 1 h), whose
/// child `db` (grace 10 ms) has stuck work: the walk holds its locks down 32 levels, marks
/// `inner` there, and goes on below it from its work list after waking what it collected (so
/// a task waiting for `inner`'s cancel runs before `db` is marked). `inner.quiesce()`, first
/// polled then, is handed nothing (no waiter at `inner`'s mark, not an ancestor of the top);
/// it waits on `db`, which the walk has not reached, and quarantines `db`'s work at 10 ms, as the control
/// (first polled once `cancel()` returned). Before: 1 h.
#[tokio::test(start_paused = true)]
async fn a_quiesce_first_polled_when_a_deep_walk_wakes_an_inner_scope_keeps_the_shorter_grace() {
    let mut got = Vec::new();
    for during_walk in [false, true] {
        let top = Scope::new();
        let mut chain = vec![top.clone()];
        for _ in 0..32 {
            let s = chain.last().unwrap().child().build().unwrap();
            chain.push(s);
        }
        let inner = chain
            .last()
            .unwrap()
            .child()
            .grace(secs(3600))
            .build()
            .unwrap();
        let db = inner.child().grace(ms(10)).build().unwrap();
        let _work = stuck(&db, "db");
        let w = FirstPollOnWake::new(&inner, &db);
        let _cancelled = during_walk.then(|| w.arm_on_cancel_of(&inner));
        let start = Instant::now();
        top.cancel();
        if during_walk {
            assert_eq!(
                *w.child_seen_cancelled.lock().unwrap(),
                Some(false),
                "the first poll ran after `inner`'s mark, before `db`'s"
            );
        }
        let report = w.report().await;
        assert_eq!(report.quarantined(), 1, "{report}");
        got.push((during_walk, start.elapsed()));
    }
    assert_eq!(
        got,
        [(false, ms(10)), (true, ms(10))],
        "(first polled during the cancel walk, time to quiet)"
    );
}

/// The race of the tests above without any special waker, on a two-worker runtime:
/// a supervisor task does the usual `scope.cancelled().await; scope.quiesce().await`; the
/// parent (grace 1 h) has many idle children walked before the busy one (grace 1 ms), so the
/// supervisor, woken by the cancel before its walk goes down, makes its first poll (its one
/// look) while the walk is still on its way. The quiesce must end about 1 ms after the cancel
/// (before, it did not end within 5 s; real time: a multi-thread runtime cannot pause the
/// clock; the bound is 5,000 times the expected wait, a failure bound only). Control (first
/// rounds): the supervisor starts its quiesce once `cancel()` returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_awaiting_the_cancel_then_quiesce_keeps_the_childs_shorter_grace() {
    const IDLE: usize = 20_000;
    const ROUNDS: usize = 30;
    for (round, after_cancel_returned) in (0..ROUNDS).map(|r| (r, r < 2)) {
        let parent = Scope::new().child().grace(secs(3600)).build().unwrap();
        // Created first: walked before the busy child (same thread, same registry shard).
        let idle: Vec<Scope> = (0..IDLE).map(|_| parent.child().build().unwrap()).collect();
        let child = parent.child().grace(ms(1)).build().unwrap();
        let work = stuck(&child, "stuck");
        let (registered, is_registered) = tokio::sync::oneshot::channel();
        let (returned, cancel_returned) = tokio::sync::oneshot::channel::<()>();
        let supervisor = tokio::spawn({
            let parent = parent.clone();
            async move {
                let mut cancelled = std::pin::pin!(parent.cancelled());
                // Registered for the cancel before the test cancels.
                std::future::poll_fn(|cx| {
                    assert!(cancelled.as_mut().poll(cx).is_pending());
                    Poll::Ready(())
                })
                .await;
                registered.send(()).unwrap();
                cancelled.await;
                if after_cancel_returned {
                    cancel_returned.await.unwrap();
                }
                parent.quiesce().await
            }
        });
        is_registered.await.unwrap();
        parent.cancel();
        let _ = returned.send(());
        let report = tokio::time::timeout(secs(5), supervisor)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "round {round} (quiesce started after cancel() returned: \
                     {after_cancel_returned}): the supervisor's quiesce did not end within \
                     5 s: the child's 1 ms grace was lost (its look ran before the walk \
                     reached it)"
                )
            })
            .unwrap();
        assert_eq!(report.quarantined(), 1, "round {round}: {report}");
        drop((idle, child, work));
    }
}

// ------------------------------------------------------------------------------------------
// Other races: two cancellers, deadline timers, shields, the grace timer.

/// A quiesce registered before a deadline timer cancels an ancestor of its scope is handed its
/// scope (marked busy by the timer's walk, in `Due::quiet`) and keeps a grandchild's shorter
/// grace.
#[tokio::test(start_paused = true)]
async fn a_quiesce_below_a_deadline_cancel_keeps_the_shorter_grace_below_it() {
    let top = Scope::new();
    let req = top.child().cap(ms(100)).grace(secs(3600)).build().unwrap();
    let mid = req.child().build().unwrap();
    let db = mid.child().grace(ms(10)).build().unwrap();
    let _work = stuck(&db, "db");
    let q = waiting_quiesce(&mid).await;
    let start = Instant::now();
    let report = q.await.unwrap();
    assert_eq!(report.quarantined(), 1, "{report}");
    assert_eq!(start.elapsed(), ms(110), "{report}");
}

/// Two cancellers racing on two threads (the one that finds a scope already cancelled hands
/// nothing over for it: the first one does, after its own walk, which finds the whole
/// subtree cancelled). A quiesce waiting on the closed top keeps the innermost 1 ms grace
/// every round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_cancellers_racing_each_hand_over_what_they_marked() {
    for round in 0..300 {
        let top = Scope::new();
        let mid = top.child().grace(secs(3600)).build().unwrap();
        let a = mid.child().grace(secs(3600)).build().unwrap();
        let b = a.child().grace(ms(1)).build().unwrap();
        let work = stuck(&b, "w");
        top.close();
        let q = tokio::spawn({
            let top = top.clone();
            async move { top.quiesce().await }
        });
        let t1 = tokio::spawn({
            let mid = mid.clone();
            async move { mid.cancel() }
        });
        let t2 = tokio::spawn({
            let a = a.clone();
            async move { a.cancel() }
        });
        t1.await.unwrap();
        t2.await.unwrap();
        let report = tokio::time::timeout(secs(5), q)
            .await
            .unwrap_or_else(|_| panic!("round {round}: lost"))
            .unwrap();
        assert_eq!(report.quarantined(), 1, "round {round}: {report}");
        drop((work, mid, a, b));
    }
}

/// A shield started on a cancelled scope within its grace period while that scope's own
/// quiesce waits is quarantined at the scope's grace end with the rest (the quiesce's entry
/// for the scope quarantines its whole subtree), and a shield asked for after that is refused.
#[tokio::test(start_paused = true)]
async fn a_shield_under_a_waiting_quiesce_is_quarantined_at_the_grace_end() {
    let s = Scope::new().child().grace(ms(50)).build().unwrap();
    let _w = stuck(&s, "request");
    s.cancel();
    let q = waiting_quiesce(&s).await;
    tokio::time::sleep(ms(10)).await;
    let h = s
        .shield(secs(3600), std::future::pending::<()>())
        .expect("within the grace period");
    let start = Instant::now();
    let report = q.await.unwrap();
    assert_eq!(start.elapsed(), ms(40), "{report}");
    assert_eq!(report.quarantined(), 2, "{report}");
    assert!(h.await.is_err(), "the shield was stopped");
    assert!(s.shield(secs(1), async {}).is_err(), "quiet: refused");
}

/// A waker that, when first woken, blocks its thread until `go` is signalled (at most 10 s, a
/// failure bound only): what a slow waker, or the OS descheduling the thread, does in the
/// middle of a `quiesce()`'s poll.
struct BlockingWaker {
    go: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    /// Whether it was signalled (not released by the 10 s bound).
    released: std::sync::atomic::AtomicBool,
}

impl std::task::Wake for BlockingWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        if let Some(go) = self.go.lock().unwrap().take() {
            let signalled = go.recv_timeout(secs(10)).is_ok();
            self.released
                .store(signalled, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// A grace period that ends while the waiting `quiesce()` is between its clock reading and the
/// arming of its grace timer (here: the quarantine of a scope with a zero grace period, in the
/// same poll, wakes a waker that blocks until the timer driver on the other worker has passed
/// the end of `second`'s 250 ms grace; on a loaded machine, the thread descheduled there).
/// The timer is new (none was armed before), so tokio finds its deadline passed when it is
/// registered and the sleep is ready at its first poll, with no wake-up to come. Before, that
/// was ignored: the `quiesce()` returned `Pending` with nothing left to wake it, `second`'s
/// work was never quarantined and it waited for the parent's 1 h (the one failure, "lost", of
/// `two_cancellers_racing_each_hand_over_what_they_marked` under load, with `b`'s 1 ms).
/// Real time: the race needs the timer driver to run on another worker during the poll, and a
/// multi-thread runtime cannot pause the clock (5 s is a failure bound only; if the first poll
/// came more than 250 ms after the cancel, it would quarantine `second` at once and pass).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grace_end_passing_while_the_quiesce_arms_its_timer_is_not_lost() {
    let s = Scope::new().child().grace(secs(3600)).build().unwrap();
    let first = s.child().grace(Duration::ZERO).build().unwrap();
    let second = s.child().grace(ms(250)).build().unwrap();
    let owner = stuck(&first, "first");
    let _work = stuck(&second, "second");
    let (go, wait) = std::sync::mpsc::channel();
    let blocking = std::sync::Arc::new(BlockingWaker {
        go: std::sync::Mutex::new(Some(wait)),
        released: std::sync::atomic::AtomicBool::new(false),
    });
    let waker = std::task::Waker::from(blocking.clone());
    // Woken by `first`'s quarantine, in the quiesce's first poll (grace 0: at once).
    let mut quarantined = std::pin::pin!(owner.__quarantined());
    let cx = &mut std::task::Context::from_waker(&waker);
    assert!(quarantined.as_mut().poll(cx).is_pending());
    s.cancel();
    let cancel_returned = Instant::now();
    // On the other worker (the quiesce's is blocked in the waker): the driver has then
    // processed the timer wheel past the end of `second`'s grace period.
    tokio::spawn(async move {
        tokio::time::sleep_until(cancel_returned + ms(252)).await;
        go.send(()).unwrap();
    });
    let q = tokio::spawn({
        let s = s.clone();
        async move { s.quiesce().await }
    });
    let report = tokio::time::timeout(secs(5), q)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the quiesce did not end within 5 s: the end of `second`'s grace was lost \
                 (the waker was released by the timer: {})",
                blocking.released.load(std::sync::atomic::Ordering::SeqCst)
            )
        })
        .unwrap();
    assert!(
        blocking.released.load(std::sync::atomic::Ordering::SeqCst),
        "the waker ran and was released by the timer on the other worker"
    );
    assert_eq!(report.quarantined(), 2, "{report}");
}

// ------------------------------------------------------------------------------------------
// Callbacks stay on the cancelling thread.

/// A waker that makes the first poll of a `Quiesce` when woken once armed (as another worker
/// does with a supervisor task that awaited `scope.cancelled()` and then calls
/// `scope.quiesce()`: woken by the cancel, before the walk goes down); support's
/// `FirstPollOnWake` without the test task's waker.
struct PollsWhenArmed {
    armed: AtomicBool,
    quiesce: Mutex<Option<Quiesce>>,
}

impl Wake for PollsWhenArmed {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if self.armed.swap(false, Ordering::SeqCst) {
            let waker = Waker::from(self.clone());
            let mut q = self.quiesce.lock().unwrap();
            let _ = Pin::new(q.as_mut().unwrap()).poll(&mut Context::from_waker(&waker));
        }
    }
}

/// `on_cancel`'s `# Panics`: "A panic of `f` comes out of the call that ran it, once that call
/// has done its work: the cancel ...". A child's callback that panics makes `parent.cancel()`
/// panic, also when the supervisor's `quiesce()` makes its first poll while the walk is on its
/// way (a second worker; here a waker woken by the parent's mark): the quiesce does not run
/// the walk (control: the supervisor's quiesce first polled after `cancel()` returned).
#[tokio::test(start_paused = true)]
async fn a_callback_panic_still_comes_out_of_cancel_when_a_quiesce_first_polls_during_the_walk() {
    let mut got = Vec::new();
    for during_walk in [false, true] {
        let parent = Scope::new();
        let child = parent.child().build().unwrap();
        let work = stuck(&child, "stuck");
        let _callback = child.on_cancel(|_| panic!("the child's cleanup failed"));
        let w = Arc::new(PollsWhenArmed {
            armed: AtomicBool::new(false),
            quiesce: Mutex::new(Some(parent.quiesce())),
        });
        let mut cancelled = Box::pin(parent.cancelled());
        let _ = cancelled
            .as_mut()
            .poll(&mut Context::from_waker(&Waker::from(w.clone())));
        w.armed.store(during_walk, Ordering::SeqCst);
        let panicked = std::panic::catch_unwind(AssertUnwindSafe(|| parent.cancel())).is_err();
        got.push((during_walk, panicked));
        drop(work);
    }
    assert_eq!(
        got,
        [(false, true), (true, true)],
        "(a quiesce first polled during the walk, the callback's panic came out of cancel())"
    );
}

/// A plain thread (no runtime: an admin or signal thread) cancels a scope; a child's
/// `on_cancel` callback does what a callback on such a thread may do: a synchronous
/// hand-off (`blocking_send` to the task that cleans up). `on_cancel` says "`f` runs on the
/// thread that cancels". Control (first round): it runs on the cancelling thread, before
/// `cancel()` returns, and the message arrives. The same when a supervisor's `quiesce()` makes
/// its first poll while the walk is on its way (the canceller held right after the parent's
/// mark): the quiesce waits for the walk instead of finishing it. (A version that finished
/// the walk in the quiesce's poll ran the callback on the runtime's thread, where
/// `blocking_send` panics, and the message was lost.)
#[tokio::test]
async fn an_on_cancel_callback_runs_on_the_cancelling_thread_before_cancel_returns() {
    let mut got = Vec::new();
    for during_walk in [false, true] {
        let parent = Scope::new();
        let child = parent.child().build().unwrap();
        let work = stuck(&child, "stuck");
        let ran = Arc::new(AtomicBool::new(false));
        let ran_on = Arc::new(Mutex::new(None));
        let (tx, mut rx) = tokio::sync::mpsc::channel::<&'static str>(1);
        let _callback = child.on_cancel({
            let ran = ran.clone();
            let ran_on = ran_on.clone();
            move |_| {
                *ran_on.lock().unwrap() = Some(std::thread::current().id());
                ran.store(true, Ordering::SeqCst);
                let _ = tx.blocking_send("stop the upload");
            }
        });
        // a: the parent is marked (canceller held); b: release the canceller; c: the
        // canceller's cancel() returned.
        let (a_tx, a_rx) = mpsc::channel::<()>();
        let (b_tx, b_rx) = mpsc::channel::<()>();
        let (c_tx, c_rx) = mpsc::channel::<()>();
        let main = std::thread::current().id();
        let _held = during_walk.then(|| {
            let at_parent = on_mark(&parent, move || {
                a_tx.send(()).unwrap();
                let _ = b_rx.recv_timeout(HANG);
            });
            let b_tx = b_tx.clone();
            let at_child = on_mark(&child, move || {
                let _ = b_tx.send(());
                if std::thread::current().id() == main {
                    // A walk run by the quiesce marked the child (as a version that finished
                    // the walk in the quiesce's poll did): hold it until cancel() returned.
                    let _ = c_rx.recv_timeout(HANG);
                }
            });
            (at_parent, at_child)
        });
        let canceller = std::thread::spawn({
            let parent = parent.clone();
            let ran = ran.clone();
            move || {
                parent.cancel();
                let ran_at_return = ran.load(Ordering::SeqCst);
                let _ = c_tx.send(());
                ran_at_return
            }
        });
        let canceller_id = canceller.thread().id();
        let mut supervisor = parent.quiesce();
        if during_walk {
            a_rx.recv_timeout(HANG).unwrap();
            let _ = poll_once(&mut supervisor).await;
            let _ = b_tx.send(());
        }
        let ran_before_cancel_returned = canceller.join().unwrap();
        let _ = poll_once(&mut supervisor).await;
        let on_canceller = *ran_on.lock().unwrap() == Some(canceller_id);
        let delivered = rx.try_recv().is_ok();
        got.push((
            during_walk,
            ran_before_cancel_returned,
            on_canceller,
            delivered,
        ));
        drop(work);
        drop(supervisor);
    }
    assert_eq!(
        got,
        [(false, true, true, true), (true, true, true, true)],
        "(supervisor first polled during the walk, callback ran before cancel() returned, \
         ran on the cancelling thread, its message arrived)"
    );
}

// ------------------------------------------------------------------------------------------
// Walks that overtake: the look of a handed scope passes over only what it has seen.

/// `x` (grace 1 h) > `s` (grace 1 h, a `quiesce()` waiting on it) > `d` (grace 10 ms, stuck
/// work). `x.cancel()` takes its stamp (t0) and marks `x`; before its walk goes down (its
/// thread held there), another thread cancels `s` at t0 + 1 ms and marks it; before that
/// walk goes down (held), `x`'s walk goes on, finds `s` cancelled and marks `d`, with t0.
/// Then `s`'s walk ends and hands `s` to the quiesce (`s` was busy, with a quiet waiter).
/// Nothing else hands `d` over: `x`'s walk marked it but hands `x` only to `x`'s ancestors.
/// The look of `s`
/// (which has not seen `d`) finds it, and the quiesce quarantines `d`'s work at `d`'s grace
/// end (t0 + 10 ms, as the control: `x.cancel()` alone), not at `s`'s (1 h, which a look
/// passing over scopes with an earlier stamp than `s` gave).
#[tokio::test(start_paused = true)]
async fn a_quiesce_handed_its_scope_keeps_a_shorter_grace_below_that_an_ancestors_walk_marked() {
    let rt = tokio::runtime::Handle::current();
    let mut got = Vec::new();
    for race in [false, true] {
        let x = Scope::new().child().grace(secs(3600)).build().unwrap();
        let s = x.child().grace(secs(3600)).build().unwrap();
        let d = s.child().grace(ms(10)).build().unwrap();
        let work = stuck(&d, "db call");
        let q = waiting_quiesce(&s).await;

        let (a_tx, a_rx) = mpsc::channel::<()>();
        let (b_tx, b_rx) = mpsc::channel::<()>();
        let (c_tx, c_rx) = mpsc::channel::<()>();
        let d_marked_when_s_was = Arc::new(Mutex::new(None));
        let _held = race.then(|| {
            let at_x = on_mark(&x, move || {
                a_tx.send(()).unwrap();
                let _ = b_rx.recv_timeout(HANG);
            });
            let d2 = d.clone();
            let seen = d_marked_when_s_was.clone();
            let at_s = on_mark(&s, move || {
                *seen.lock().unwrap() = Some(d2.is_cancelled());
                let _ = b_tx.send(());
                let _ = c_rx.recv_timeout(HANG);
            });
            (at_x, at_s)
        });
        let start = Instant::now();
        let cancel_x = std::thread::spawn({
            let (x, rt) = (x.clone(), rt.clone());
            move || {
                let _clock = rt.enter();
                x.cancel();
                let _ = c_tx.send(());
            }
        });
        if race {
            a_rx.recv_timeout(HANG).unwrap();
            tokio::time::advance(ms(1)).await;
            let cancel_s = std::thread::spawn({
                let (s, rt) = (s.clone(), rt.clone());
                move || {
                    let _clock = rt.enter();
                    s.cancel();
                }
            });
            cancel_s.join().unwrap();
            assert_eq!(*d_marked_when_s_was.lock().unwrap(), Some(false));
        }
        cancel_x.join().unwrap();
        assert!(d.is_cancelled());
        let report = q.await.unwrap();
        assert_eq!(report.quarantined(), 1, "{report}");
        got.push((race, start.elapsed()));
        drop(work);
    }
    assert_eq!(
        got,
        [(false, ms(10)), (true, ms(10))],
        "(s cancelled 1 ms after x by another thread, time to quiet)"
    );
}

/// One `cancel()` with a supervisor's `top.quiesce()` first polled during its walk: `top`
/// (grace 1 h) is cancelled on a thread at t0; a scope `inner` 33 levels below (grace 1 h)
/// has a `quiesce()` waiting on it, and `db` below it (grace 10 ms) stuck work. The canceller
/// is held right after `top`'s mark; at t0 + 1 ms the supervisor's quiesce makes its first
/// poll (it waits on the scopes the walk has not reached), then the canceller goes on. `db`'s
/// work is quarantined at 10 ms by `inner`'s quiesce, as without the supervisor (control).
/// (A version whose supervisor finished the walk itself stamped `inner` later than `db`, and
/// passing over scopes with an earlier stamp then lost `db`'s grace: 1 h.)
#[tokio::test(start_paused = true)]
async fn an_inner_quiesce_keeps_the_shorter_grace_when_a_supervisors_walk_is_overtaken() {
    let rt = tokio::runtime::Handle::current();
    let mut got = Vec::new();
    for race in [false, true] {
        let top = Scope::new().child().grace(secs(3600)).build().unwrap();
        let mut chain = vec![top.clone()];
        for _ in 0..32 {
            let s = chain.last().unwrap().child().build().unwrap();
            chain.push(s);
        }
        let inner = chain.last().unwrap().child().build().unwrap();
        let db = inner.child().grace(ms(10)).build().unwrap();
        let work = stuck(&db, "db");
        let q = waiting_quiesce(&inner).await;

        let (a_tx, a_rx) = mpsc::channel::<()>();
        let (b_tx, b_rx) = mpsc::channel::<()>();
        let (c_tx, c_rx) = mpsc::channel::<()>();
        let main = std::thread::current().id();
        let db_marked_with_inner = Arc::new(Mutex::new(None));
        let _held = race.then(|| {
            let at_top = on_mark(&top, move || {
                a_tx.send(()).unwrap();
                let _ = b_rx.recv_timeout(HANG);
            });
            let b_tx = b_tx.clone();
            let seen = db_marked_with_inner.clone();
            let db2 = db.clone();
            let at_inner = on_mark(&inner, move || {
                *seen.lock().unwrap() = Some(db2.is_cancelled());
                let _ = b_tx.send(());
                if std::thread::current().id() == main {
                    let _ = c_rx.recv_timeout(HANG);
                }
            });
            (at_top, at_inner)
        });
        let start = Instant::now();
        let canceller = std::thread::spawn({
            let (top, rt) = (top.clone(), rt.clone());
            move || {
                let _clock = rt.enter();
                top.cancel();
                let _ = c_tx.send(());
            }
        });
        let mut supervisor = top.quiesce();
        if race {
            a_rx.recv_timeout(HANG).unwrap();
            tokio::time::advance(ms(1)).await;
            let _ = poll_once(&mut supervisor).await;
            let _ = b_tx.send(());
        }
        canceller.join().unwrap();
        if race {
            assert_eq!(*db_marked_with_inner.lock().unwrap(), Some(false));
        }
        assert!(db.is_cancelled());
        let report = q.await.unwrap();
        assert_eq!(report.quarantined(), 1, "{report}");
        got.push((race, start.elapsed()));
        drop((work, supervisor, chain));
    }
    assert_eq!(
        got,
        [(false, ms(10)), (true, ms(10))],
        "(supervisor's quiesce first polled during the walk, time to quiet)"
    );
}

/// Checked and fine: a scope below the handed one, cancelled *earlier by its own cancel* whose
/// walk was overtaken, is passed over by the look of the later-cancelled scope above it but
/// is handed over by its own cancel once that walk ends (it was busy at its mark). `s`
/// (closed, grace 1 h, a quiesce waiting) > `d` (grace 1 h) > `e` (grace 10 ms, stuck work).
/// `e.cancel()` on a thread at t0 is held right after `e`'s mark; `d.cancel()` at t0 + 1 ms
/// runs to the end (hands `d` over; the look of `d` passes over `e`); then `e`'s cancel goes
/// on and hands `e` over: 10 ms after t0, as with `e.cancel()` alone (control).
#[tokio::test(start_paused = true)]
async fn a_scope_cancelled_first_whose_walk_was_overtaken_is_handed_over_by_its_own_cancel() {
    let rt = tokio::runtime::Handle::current();
    let mut got = Vec::new();
    for race in [false, true] {
        let s = Scope::new().child().grace(secs(3600)).build().unwrap();
        let d = s.child().build().unwrap();
        let e = d.child().grace(ms(10)).build().unwrap();
        let work = stuck(&e, "db call");
        s.close();
        let q = waiting_quiesce(&s).await;
        let (a_tx, a_rx) = mpsc::channel::<()>();
        let (b_tx, b_rx) = mpsc::channel::<()>();
        let _held = race.then(|| {
            on_mark(&e, move || {
                a_tx.send(()).unwrap();
                let _ = b_rx.recv_timeout(HANG);
            })
        });
        let start = Instant::now();
        let cancel_e = std::thread::spawn({
            let (e, rt) = (e.clone(), rt.clone());
            move || {
                let _clock = rt.enter();
                e.cancel();
            }
        });
        if race {
            a_rx.recv_timeout(HANG).unwrap();
            tokio::time::advance(ms(1)).await;
            d.cancel();
            // The quiesce takes `d` (and passes over `e`) before `e`'s cancel goes on.
            tokio::task::yield_now().await;
            let _ = b_tx.send(());
        }
        cancel_e.join().unwrap();
        let report = q.await.unwrap();
        assert_eq!(report.quarantined(), 1, "{report}");
        got.push((race, start.elapsed()));
        drop(work);
    }
    assert_eq!(
        got,
        [(false, ms(10)), (true, ms(10))],
        "(d cancelled while e's walk was held, time to quiet)"
    );
}
