//! A `quiesce()` and cancel walks that overtake one another or that it meets under way.
//!
//! The interleavings are made deterministic by wakers registered for a scope's cancel
//! (`scope.cancelled()` polled with a waker of ours): a cancel wakes them right after it marks
//! the scope, before its walk goes below it, on the thread that marks it, so a waker that
//! blocks there stands in for that thread being preempted at that point; one that polls stands
//! in for another worker polling at that moment. Timing is virtual (paused clock) wherever
//! timing is asserted; the threads that cancel enter the runtime, so they read the same
//! (virtual) clock as the test.
//!
//! - A `quiesce()` first polled while a walk is under way does not run the walk's `on_cancel`
//!   callbacks: they run on the cancelling thread, before `cancel()` returns, and a callback's
//!   panic comes out of `cancel()` (`a_callback_panic_*`, `an_on_cancel_callback_*`). (A
//!   version that finished the walk inside the quiesce's poll broke both.)
//! - The look of a handed scope passes over only the scopes this quiesce has looked at
//!   already: a scope below it marked by the walk of an *ancestor* of the quiesce's scope,
//!   which overtook the handed scope's own walk, is looked at, and its shorter grace holds
//!   (`a_quiesce_handed_its_scope_*`, `an_inner_quiesce_*`; a version that passed over scopes
//!   with an earlier cancel stamp lost it: 1 h instead of 10 ms).
//! - A chain fired bottom-up in one timer batch (one stamp for all) puts one heap entry per
//!   scope on a waiting quiesce: `bottom_up_deadlines_fired_in_one_timer_batch_*`.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Wake, Waker};

use cancel_scope::{Quiesce, Scope};
use tokio::time::Instant;

mod support;
use support::quiesce::*;

// ------------------------------------------------------------------------------------------
// Callbacks stay on the cancelling thread.

/// A waker that makes the first poll of a `Quiesce` when woken once armed (as another worker
/// does with a supervisor task that awaited `scope.cancelled()` and then calls
/// `scope.quiesce()`: woken by the cancel, before the walk goes down).
struct FirstPollOnWake {
    armed: AtomicBool,
    quiesce: Mutex<Option<Quiesce>>,
}

impl Wake for FirstPollOnWake {
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
        let w = Arc::new(FirstPollOnWake {
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

// ------------------------------------------------------------------------------------------
// Equal stamps: a chain fired bottom-up in one timer batch.

#[global_allocator]
static ALLOC: support::quiesce::Counting = support::quiesce::Counting;

/// Bytes held after a chain of `n` nested scopes under a closed `top` (grace 1 h, a quiesce
/// waiting) had their deadlines fire bottom-up (each deadline 1 ms tighter than its
/// parent's; each scope's grace 1 ms shorter than its parent's, as inner calls get less time
/// to stop), stuck work at the bottom. `one_batch`: the runtime was busy (here: the clock
/// jumps) past all the deadlines, so the timer driver fires them all in one round, deepest
/// first, with one stamp; otherwise one per millisecond.
async fn held_after_bottom_up_chain(n: u64, one_batch: bool) -> isize {
    let top = Scope::new().child().grace(secs(3600)).build().unwrap();
    let mut chain: Vec<Scope> = Vec::new();
    for i in 0..n {
        let parent = chain.last().unwrap_or(&top);
        let s = parent
            .child()
            .timeout(ms(10 + n - i))
            .grace(secs(3600) - ms(i + 1))
            .build()
            .unwrap();
        chain.push(s);
    }
    let work = stuck(chain.last().unwrap(), "deepest call");
    top.close();
    let q = waiting_quiesce(&top).await;
    let before = live_bytes();
    if one_batch {
        tokio::time::advance(ms(10 + n + 1)).await;
    } else {
        tokio::time::sleep(ms(10 + n + 1)).await;
    }
    // The driver cancels them in batches of a few dozen (one stamp for the round), letting
    // other tasks run in between: wait for all of them.
    for s in &chain {
        s.cancelled().await;
    }
    let held = live_bytes() - before;
    drop(work);
    q.await.unwrap();
    drop(chain);
    held
}

/// A chain cancelled bottom-up puts one heap entry per scope on a waiting quiesce, also when
/// the deadlines fire in one timer round (the driver stamps them all with the `now` it read
/// once: deadlines within one tick, or overdue after the runtime was busy), as when they fire
/// one per millisecond (control). (A look that passed over scopes with an earlier stamp kept
/// every scope of equal stamp below each handed one: N²/2 entries, several MB for N = 400,
/// none prunable.)
#[tokio::test(start_paused = true)]
async fn bottom_up_deadlines_fired_in_one_timer_batch_keep_the_heap_linear() {
    let mut got = Vec::new();
    for one_batch in [false, true] {
        let n = 400;
        got.push((one_batch, held_after_bottom_up_chain(n, one_batch).await));
    }
    eprintln!("(one timer batch, bytes held for 400 scopes): {got:?}");
    assert!(
        got.iter().all(|&(_, held)| held < 400 * 256),
        "(one timer batch, bytes held for 400 scopes): {got:?}"
    );
}
