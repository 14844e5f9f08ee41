//! What a waiting `quiesce()` keeps: nothing of the scopes it looked at but those with a
//! grace end of their own on its heap, nothing on the scopes it watched while a cancel walk
//! was under way, and nothing of the scopes handed to it once they finish and go; a chain
//! cancelled bottom-up puts one heap entry per scope on it. The last quiet waiter to leave a
//! scope takes the scope's waiter lists with it, and every other registration keeps working.
//!
//! Interleavings are made deterministic as in `racing_cancels`: a waker registered for a
//! scope's cancel runs on the cancelling thread right after the scope's mark, before the walk
//! goes below it. Memory is counted by the binary's allocator (`support::quiesce::Counting`:
//! bytes live and allocations made on this thread); timing is virtual.
//!
//! - Finished, unlinked children a look met are freed at once (invariant 7), not kept until
//!   a prune: `finished_children_a_quiesce_looked_at_are_freed_while_it_waits` (before: ~364
//!   bytes per child held for the grace period).
//! - A watch leaves no waiter lists on the watched scopes once it ends:
//!   `a_quiesce_first_polled_during_a_wide_walk_leaves_nothing_on_the_children` (before: ~312
//!   bytes per child).
//! - A watched scope cancelled by its own cancel (not by the walk the look met) is handed by
//!   that cancel, and its shorter grace holds:
//!   `a_watched_scope_cancelled_by_its_own_cancel_keeps_its_grace`.
//! - A chain of nested scopes cancelled bottom-up (nested deadlines fire deepest first) under
//!   a waiting `quiesce()`: each handed scope is put on the quiesce's heap once (the look of a
//!   handed scope passes over the scopes below cancelled before it), so the heap is linear in
//!   the chain, and so are the quarantine walks at the grace ends when a guard keeps the chain
//!   busy (before: N(N+1)/2 entries and about N³/6 scopes visited):
//!   `bottom_up_nested_deadlines_*` (count-based: bytes held, allocations), also when the
//!   deadlines fire in one timer batch (one stamp for all):
//!   `bottom_up_deadlines_fired_in_one_timer_batch_*`.
//! - A dropped watch does not invalidate cancel waiters or callbacks
//!   (`a_dropped_watch_does_not_invalidate_*`), and a stale key of a drained list meets
//!   nothing (`a_stale_quiet_key_after_quiet_meets_nothing`). (How many scopes the looks of
//!   waiting quiesces visit is counted by a unit test in `src/quiesce`,
//!   `a_chain_cancelled_bottom_up_is_looked_through_as_often_whatever_the_grace`.)

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use cancel_scope::{Dispatched, Quiesce, Report, Scope};
use tokio::time::Instant;

use crate::support::quiesce::*;
use crate::support::wakers::Counts;

/// A server scope (grace 1 h) is cancelled at shutdown with `n` requests in flight, each a
/// child scope with work; one task of the server ignores the cancel (stuck at the root), so
/// its `quiesce()` waits for the grace end. The requests stop at the cancel and finish, and
/// their scopes are dropped (unlinked: invariant 7, flat memory). Bytes still held (on this
/// thread, the quiesce included) once they are gone, when the quiesce looked at them while
/// they were busy, against a quiesce first polled after they finished (control). Each has
/// the root's grace, so none has a heap entry of its own, and the quiesce keeps nothing of
/// them. (Before, its `seen` map kept a weak reference to each, the node's allocation, until
/// a prune that only came once the map doubled.)
#[tokio::test(start_paused = true)]
async fn finished_children_a_quiesce_looked_at_are_freed_while_it_waits() {
    let n = 10_000;
    let mut got = Vec::new();
    for looked_while_busy in [false, true] {
        let root = Scope::new().child().grace(secs(3600)).build().unwrap();
        let keep = stuck(&root, "ignores the cancel");
        let before = live_bytes();
        let mut kids = Vec::new();
        let mut works = Vec::new();
        for _ in 0..n {
            let c = root.child().build().unwrap();
            works.push(stuck(&c, "request"));
            kids.push(c);
        }
        root.cancel();
        let mut q = root.quiesce();
        if looked_while_busy {
            assert!(poll_once(&mut q).await.is_pending());
        }
        drop(works);
        drop(kids);
        assert!(poll_once(&mut q).await.is_pending());
        tokio::time::advance(secs(1)).await;
        assert!(poll_once(&mut q).await.is_pending());
        got.push((looked_while_busy, live_bytes() - before));
        drop(q);
        drop(keep);
    }
    eprintln!("(looked while busy, bytes held for {n} finished children): {got:?}");
    let control = got[0].1;
    assert!(
        got.iter()
            .all(|&(_, held)| held - control < (n as isize) * 16),
        "(looked while busy, bytes held for {n} finished children): {got:?}"
    );
}

/// A `quiesce()` of `p` first polled while `p`'s cancel walk is under way (held right after
/// `p`'s mark, as another worker polls then) watches each of `p`'s `n` children, which the
/// walk has not reached. Once the quiesce has resolved and is dropped, bytes still held
/// while the children live (they stay: a caller keeps them), against a quiesce first polled
/// after the walk (control): the same, as the last waiter to go takes the waiter lists (box
/// and slabs) that the watch allocated with it.
#[tokio::test(start_paused = true)]
async fn a_quiesce_first_polled_during_a_wide_walk_leaves_nothing_on_the_children() {
    let n = 10_000;
    let mut got = Vec::new();
    for during_walk in [false, true] {
        let p = Scope::new().child().grace(ms(10)).build().unwrap();
        let mut kids = Vec::new();
        let mut works = Vec::new();
        for _ in 0..n {
            let c = p.child().build().unwrap();
            works.push(stuck(&c, "request"));
            kids.push(c);
        }
        let q = Arc::new(Mutex::new(p.quiesce()));
        let before = live_bytes();
        let _held = during_walk.then(|| {
            let q = q.clone();
            on_mark(&p, move || {
                let waker = Waker::noop();
                let mut q = q.lock().unwrap();
                assert!(Pin::new(&mut *q)
                    .poll(&mut Context::from_waker(waker))
                    .is_pending());
            })
        });
        p.cancel();
        let q = Arc::try_unwrap(q).ok().unwrap().into_inner().unwrap();
        let start = Instant::now();
        let report = q.await;
        assert_eq!(report.quarantined(), n as u64, "{report}");
        let took = start.elapsed();
        drop(_held);
        let held = live_bytes() - before;
        got.push((during_walk, took, held));
        drop(works);
        drop(kids);
    }
    eprintln!("(first polled during the walk, time to quiet, bytes held by {n} children): {got:?}");
    let control = got[0].2;
    assert!(
        got.iter()
            .all(|&(_, _, held)| held - control < (n as isize) * 16),
        "(first polled during the walk, time to quiet, bytes held by {n} children): {got:?}"
    );
}

/// `top` (grace 1 h) > `w` (grace 10 ms, stuck work). `top.cancel()` on a thread is held
/// right after `top`'s mark; the supervisor's `top.quiesce()` makes its first poll then (it
/// watches `w`); at +1 ms `w.cancel()` (its own) runs to the end, then `top`'s walk goes on.
/// `w`'s work is quarantined 10 ms after `w`'s cancel: 11 ms.
#[tokio::test(start_paused = true)]
async fn a_watched_scope_cancelled_by_its_own_cancel_keeps_its_grace() {
    let rt = tokio::runtime::Handle::current();
    let top = Scope::new().child().grace(secs(3600)).build().unwrap();
    let w = top.child().grace(ms(10)).build().unwrap();
    let work = stuck(&w, "db call");
    let (a_tx, a_rx) = mpsc::channel::<()>();
    let (b_tx, b_rx) = mpsc::channel::<()>();
    let _held = on_mark(&top, move || {
        a_tx.send(()).unwrap();
        let _ = b_rx.recv_timeout(HANG);
    });
    let start = Instant::now();
    let canceller = std::thread::spawn({
        let (top, rt) = (top.clone(), rt.clone());
        move || {
            let _clock = rt.enter();
            top.cancel();
        }
    });
    let mut q = top.quiesce();
    a_rx.recv_timeout(HANG).unwrap();
    assert!(poll_once(&mut q).await.is_pending());
    assert!(!w.is_cancelled());
    tokio::time::advance(ms(1)).await;
    w.cancel();
    let _ = b_tx.send(());
    canceller.join().unwrap();
    let report = q.await;
    assert_eq!(report.quarantined(), 1, "{report}");
    assert_eq!(start.elapsed(), ms(11));
    drop(work);
}

// ------------------------------------------------------------------------------------------
// Resource retention: scopes handed to a waiting quiesce are freed when they finish and go,
// not at their grace end.

/// A request scope under `server`, busy, cancelled (client gone), finished and dropped.
fn one_cancelled_request(server: &Scope, timeout: Option<Duration>) -> impl Fn() -> bool {
    let mut b = server.child();
    if let Some(t) = timeout {
        b = b.cap(t);
    }
    let req = b.build().unwrap();
    let call = stuck(&req, "call");
    let freed = req.__freed_probe();
    req.cancel();
    drop(call); // its receipt (Cancelled): the request is quiet
    drop(req);
    freed
}

/// Invariant 7's "a finished scope is freed at once" (see
/// `timers::a_dropped_scope_is_freed_at_once_and_later_deadlines_still_fire` of the `scope` tests)
/// also with a `quiesce()` waiting on the long-lived server scope (grace 60 s): a request
/// scope that was cancelled busy, then finished and was dropped, is freed at once, though its
/// grace period has not ended. (Before, the waiter held it until then.)
#[tokio::test(start_paused = true)]
async fn a_finished_request_scope_is_freed_at_once_while_a_quiesce_waits_above_it() {
    for quiesce_waits in [false, true] {
        let server = Scope::new().child().grace(secs(60)).build().unwrap();
        let q = if quiesce_waits {
            Some(waiting_quiesce(&server).await)
        } else {
            None
        };
        let freed = one_cancelled_request(&server, None);
        tokio::task::yield_now().await; // the quiesce takes what it was handed
        assert_eq!(server.__live_children(), 0, "unlinked");
        assert!(
            freed(),
            "quiesce waits: {quiesce_waits}: the request's node is held"
        );
        server.close();
        if let Some(q) = q {
            q.await.unwrap();
        }
    }
}

/// The same seen through the deadline timers: a timer entry dies with its node, so with a
/// waiting quiesce the timers' heap stays at a handful of entries over 10,000 cancelled
/// requests, as without one. (Before, it kept every request cancelled during the last grace
/// period.)
#[tokio::test(start_paused = true)]
async fn cancelled_request_scopes_leave_flat_timers_while_a_quiesce_waits_above_them() {
    let mut got = Vec::new();
    for quiesce_waits in [false, true] {
        let root = Scope::with_timeout(secs(3600));
        let server = root.child().grace(secs(60)).build().unwrap();
        let q = if quiesce_waits {
            Some(waiting_quiesce(&server).await)
        } else {
            None
        };
        for _ in 0..10_000 {
            let _ = one_cancelled_request(&server, Some(secs(30)));
            tokio::task::yield_now().await;
        }
        got.push((quiesce_waits, server.__timer_entries()));
        server.close();
        if let Some(q) = q {
            q.await.unwrap();
        }
    }
    assert!(
        got.iter().all(|&(_, n)| n <= 16),
        "(quiesce waits, timer entries): {got:?}"
    );
}

/// Memory stays flat: bytes still allocated after 10,000 request scopes were cancelled busy,
/// finished and dropped under a long-lived server scope (grace 60 s), with and without a
/// `quiesce()` waiting on it, are under 64 KiB. (Before: 1.2 KiB per request, for the grace
/// period.)
#[tokio::test(start_paused = true)]
async fn memory_stays_flat_under_cancelled_request_scopes_while_a_quiesce_waits() {
    const N: isize = 10_000;
    let mut got = Vec::new();
    for quiesce_waits in [false, true] {
        let server = Scope::new().child().grace(secs(60)).build().unwrap();
        let q = if quiesce_waits {
            Some(waiting_quiesce(&server).await)
        } else {
            None
        };
        // Warm up (slab slots, vector capacities), then measure.
        for _ in 0..N {
            let _ = one_cancelled_request(&server, None);
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(secs(61)).await;
        let before = live_bytes();
        for _ in 0..N {
            let _ = one_cancelled_request(&server, None);
            tokio::task::yield_now().await;
        }
        let held = live_bytes() - before;
        tokio::time::sleep(secs(61)).await;
        let after_grace = live_bytes() - before;
        eprintln!(
            "quiesce waits: {quiesce_waits}: {held} bytes held after {N} requests \
             ({} per request), {after_grace} once their grace periods ended",
            held / N
        );
        got.push((quiesce_waits, held));
        server.close();
        if let Some(q) = q {
            q.await.unwrap();
        }
    }
    assert!(
        got.iter().all(|&(_, held)| held < 64 * 1024),
        "(quiesce waits, bytes held): {got:?}"
    );
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
        let s = parent.child().cap(ms(10 + n - i)).build().unwrap();
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
// Equal stamps: a chain fired bottom-up in one timer batch.

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
            .cap(ms(10 + n - i))
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

// ------------------------------------------------------------------------------------------
// The last quiet waiter takes the waiter lists: other registrations keep working.

fn poll_q(q: &mut Quiesce, w: &Waker) -> Poll<Report> {
    Pin::new(q).poll(&mut Context::from_waker(w))
}

/// A `cancelled()` waiter in the inline slot, a second one in the list, an `on_cancel`
/// callback and two quiesce waiters; the quiesce waiters go one after the other (the last one
/// drops the lists only if nothing else is in them), then new quiesce waiters come, and the
/// cancel must still wake both `cancelled()` futures and run the callback exactly once.
#[tokio::test(start_paused = true)]
async fn a_dropped_watch_does_not_invalidate_cancel_waiters_or_callbacks() {
    let s = Scope::new().child().grace(ms(10)).build().unwrap();
    let work = stuck(&s, "w");
    let ran = Arc::new(AtomicUsize::new(0));
    let wc = Arc::new(Counts::default());
    let waker = Waker::from(wc.clone());
    let mut c1 = Box::pin(s.cancelled());
    let mut c2 = Box::pin(s.cancelled());
    let cx = &mut Context::from_waker(&waker);
    assert!(c1.as_mut().poll(cx).is_pending());
    // A different waker object so it is a second registration.
    let wc2 = Arc::new(Counts::default());
    let waker2 = Waker::from(wc2.clone());
    assert!(c2
        .as_mut()
        .poll(&mut Context::from_waker(&waker2))
        .is_pending());
    let on = {
        let ran = ran.clone();
        s.on_cancel(move |_| {
            ran.fetch_add(1, Ordering::SeqCst);
        })
    };
    for _ in 0..3 {
        let mut q1 = s.quiesce();
        let mut q2 = s.quiesce();
        assert!(poll_q(&mut q1, &waker).is_pending());
        assert!(poll_q(&mut q2, &waker).is_pending());
        drop(q1);
        drop(q2);
    }
    // Only quiesce waiters: their lists go with the last; then again.
    let t = Scope::new().child().build().unwrap();
    let tw = stuck(&t, "t");
    for _ in 0..3 {
        let mut q = t.quiesce();
        assert!(poll_q(&mut q, &waker).is_pending());
        drop(q);
    }
    let mut q = s.quiesce();
    assert!(poll_q(&mut q, &waker).is_pending());
    s.cancel();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert!(c1.as_mut().poll(cx).is_ready());
    assert!(c2
        .as_mut()
        .poll(&mut Context::from_waker(&waker2))
        .is_ready());
    assert!(wc2.woken() >= 1);
    drop(on);
    drop(work);
    let report = q.await;
    assert_eq!(report.total(), 1, "{report}");
    t.cancel();
    drop(tw);
    let mut q = t.quiesce();
    assert!(poll_q(&mut q, &waker).is_ready());
}

/// A quiesce waiter dropped after its scope became quiet (stale key of a drained list),
/// while another scope's lists are made again: nothing registers on a quiet scope, and a
/// second quiesce of it resolves at once.
#[tokio::test(start_paused = true)]
async fn a_stale_quiet_key_after_quiet_meets_nothing() {
    let wc = Arc::new(Counts::default());
    let waker = Waker::from(wc.clone());
    let s = Scope::new().child().build().unwrap();
    let work = stuck(&s, "w");
    let mut q1 = s.quiesce();
    assert!(poll_q(&mut q1, &waker).is_pending());
    s.close();
    drop(work);
    // Quiet now; the list was drained. A new quiesce resolves without registering.
    let mut q2 = s.quiesce();
    assert!(poll_q(&mut q2, &waker).is_ready());
    drop(q1);
    let mut q3 = s.quiesce();
    assert!(poll_q(&mut q3, &waker).is_ready());
}
