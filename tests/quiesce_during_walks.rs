//! A `quiesce()` racing cancel walks, and chains cancelled bottom-up.
//!
//! - A `quiesce()` first polled *during* the cancel walk of its own scope, or of a scope that
//!   walk marks (as the common "await the cancel, then drain" supervisor does on a
//!   multi-thread runtime), was not registered when its scope was marked, so it is handed
//!   nothing: its look waits on the scopes the walk has not reached yet, and the
//!   shorter grace period of a child holds (10 ms, not the parent's 1 h; an end also under a
//!   never-ending grace): `a_quiesce_first_polled_during_*`,
//!   `a_quiesce_first_polled_when_a_deep_walk_wakes_an_inner_scope_*` (deterministic, a waker
//!   that polls when woken), `a_supervisor_awaiting_the_cancel_then_quiesce_*` (two workers).
//! - A chain of nested scopes cancelled bottom-up (nested deadlines fire deepest first) under
//!   a waiting `quiesce()`: each handed scope is put on the quiesce's heap once (the look of a
//!   handed scope passes over the scopes below cancelled before it), so the heap is linear in
//!   the chain, and so are the quarantine walks at the grace ends when a guard keeps the chain
//!   busy (before: N(N+1)/2 entries and about N³/6 scopes visited):
//!   `bottom_up_nested_deadlines_*` (count-based: bytes held, allocations).
//!
//! Other races checked (two cancellers, deadline timers, shields, a grace end passing while the
//! quiesce arms its timer) are at the end.

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use cancel_scope::{Dispatched, Scope};
use tokio::time::Instant;

mod support;
use support::quiesce::*;

// ------------------------------------------------------------------------------------------
// Bytes allocated and not freed by this thread (the tests that read it run on a
// current-thread runtime: the quiesce task, the timer driver and the scopes are all here).

#[global_allocator]
static ALLOC: support::quiesce::Counting = support::quiesce::Counting;

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
// A chain cancelled bottom-up under a waiting quiesce: one heap entry per scope.

/// Builds a chain of `n` nested scopes under `top`, each with a deadline 1 ms tighter than
/// its parent's (the deepest expires first, as nested budgets do), stuck work at the bottom;
/// returns the scopes and the work.
fn nested_deadlines(top: &Scope, n: u64) -> (Vec<Scope>, Dispatched) {
    let mut chain: Vec<Scope> = Vec::new();
    for i in 0..n {
        let parent = chain.last().unwrap_or(top);
        let s = parent.child().timeout(ms(10 + n - i)).build().unwrap();
        chain.push(s);
    }
    let work = stuck(chain.last().unwrap(), "deepest call");
    (chain, work)
}

/// Bytes held after the `n` deadlines of [`nested_deadlines`] fired, with a `quiesce()`
/// waiting on the closed top (grace 1 h, inherited: nothing expires meanwhile) or not.
async fn held_after_bottom_up_deadlines(n: u64, quiesce_waits: bool) -> isize {
    let top = Scope::new().child().grace(secs(3600)).build().unwrap();
    let (chain, work) = nested_deadlines(&top, n);
    top.close();
    let q = if quiesce_waits {
        Some(waiting_quiesce(&top).await)
    } else {
        None
    };
    let before = live_bytes();
    // Every deadline fires, the deepest first, one per millisecond.
    tokio::time::sleep(ms(10 + n + 1)).await;
    tokio::task::yield_now().await;
    assert!(chain.iter().all(Scope::is_cancelled));
    let held = live_bytes() - before;
    drop(work);
    if let Some(q) = q {
        q.await.unwrap();
    }
    drop(chain);
    held
}

/// A chain of N nested scopes whose deadlines fire bottom-up (each tighter than its parent's)
/// under a `quiesce()` waiting on the closed top: each fired scope is handed over and looked
/// through, passing over the deeper scopes, cancelled before it, so the heap holds one entry
/// per scope (a few hundred bytes per scope at most, with the handed weak references and
/// capacity slack). Before, each look pushed the whole cancelled subtree again (every deeper
/// scope's grace ends earlier): N²/2 entries, none prunable (all busy), about 1.9 MB for
/// N = 400. Without a waiting quiesce nothing is held.
/// (The cancel walks themselves are quadratic here, before and after the change: each
/// deadline's cancel walks the already cancelled chain below it; but they hold nothing.)
#[tokio::test(start_paused = true)]
async fn bottom_up_nested_deadlines_keep_the_waiting_quiesce_heap_linear() {
    let mut got = Vec::new();
    for n in [200_u64, 400] {
        for quiesce_waits in [false, true] {
            let held = held_after_bottom_up_deadlines(n, quiesce_waits).await;
            got.push((n, quiesce_waits, held));
        }
    }
    eprintln!("(scopes, quiesce waits, bytes held): {got:?}");
    // Linear: a few hundred bytes per scope (an entry, a handed weak reference, capacity
    // slack) is plenty.
    assert!(
        got.iter().all(|&(n, _, held)| held < n as isize * 256),
        "(scopes, quiesce waits, bytes held after the deadlines fired): {got:?}"
    );
}

/// Allocations made while the grace ends of the chain of [`nested_deadlines`] pass, with a
/// guard (a tethered connection, which quarantine does not end) held at the bottom: nothing
/// becomes quiet, so every entry of the waiting quiesce's heap that expires runs
/// `quarantine_subtree` (a cancel walk and a quarantine walk of the entry's subtree).
async fn allocs_at_grace_ends(n: u64) -> usize {
    let top = Scope::new().child().grace(secs(3600)).build().unwrap();
    let (chain, work) = nested_deadlines(&top, n);
    let conn = chain.last().unwrap().tether("connection").unwrap();
    top.close();
    let q = waiting_quiesce(&top).await;
    tokio::time::sleep(ms(10 + n + 1)).await;
    assert!(chain.iter().all(Scope::is_cancelled));
    let before = allocs();
    tokio::time::sleep(secs(3600)).await;
    tokio::task::yield_now().await;
    let made = allocs() - before;
    assert!(!q.is_finished(), "the guard holds it");
    drop(conn);
    let report = q.await.unwrap();
    assert_eq!(report.quarantined(), 1, "{report}");
    drop((chain, work));
    made
}

/// The work at the grace ends of the same chain, with a guard held at the bottom
/// (quarantine does not end a guard, so nothing becomes quiet and every entry that expires
/// runs `quarantine_subtree` of its scope): with one entry per scope, the walks of the
/// scopes' subtrees make the allocations grow at most 4 times when N doubles (they are
/// quadratic in the chain's depth, as the cancel walks of the chain are). Before, the
/// N(N+1)/2 entries visited about N³/6 scopes: 39,836 allocations for N = 60, 302,866 for
/// N = 120 (debug build).
#[tokio::test(start_paused = true)]
async fn bottom_up_nested_deadlines_expire_once_per_scope_under_a_held_guard() {
    let small = allocs_at_grace_ends(60).await;
    let large = allocs_at_grace_ends(120).await;
    eprintln!("allocations at the grace ends: N = 60: {small}, N = 120: {large}");
    assert!(
        large < 5 * small,
        "allocations at the grace ends grow like N³ (duplicate entries): N = 60: {small}, N = 120: {large}"
    );
}

// ------------------------------------------------------------------------------------------
// Other races: two cancellers, deadline timers, shields, the grace timer.

/// A quiesce registered before a deadline timer cancels an ancestor of its scope is handed its
/// scope (marked busy by the timer's walk, in `Due::quiet`) and keeps a grandchild's shorter
/// grace.
#[tokio::test(start_paused = true)]
async fn a_quiesce_below_a_deadline_cancel_keeps_the_shorter_grace_below_it() {
    let top = Scope::new();
    let req = top
        .child()
        .timeout(ms(100))
        .grace(secs(3600))
        .build()
        .unwrap();
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
