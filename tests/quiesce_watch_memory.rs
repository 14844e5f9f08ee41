//! What a waiting `quiesce()` keeps: nothing of the scopes it looked at but those with a
//! grace end of their own on its heap, and nothing on the scopes it watched while a cancel walk
//! was under way.
//!
//! Interleavings are made deterministic as in `quiesce_overtaken_walks.rs`: a waker registered
//! for a scope's cancel runs on the cancelling thread right after the scope's mark, before
//! the walk goes below it. Memory is counted by a global allocator (bytes live on this
//! thread); timing is virtual.
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

use std::future::Future;
use std::pin::Pin;
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Waker};

use cancel_scope::Scope;
use tokio::time::Instant;

mod support;
use support::quiesce::*;

#[global_allocator]
static ALLOC: support::quiesce::Counting = support::quiesce::Counting;

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
