//! The cancel walk and close: marking a subtree cancelled (or closed), handing busy cancelled
//! scopes over to the `quiesce()`s waiting on them, and running wakers and callbacks once no
//! lock is held (invariants 1, 2; the walk keeps the lock order of the module docs).

use std::task::Waker;

use super::waiters::{wake_quiet, Callback};
use super::{ancestors, Node, State, CANCELLED, CLOSED, GEN_ONE};
use crate::cause::Cause;
use crate::panic::Caught;
use crate::sync::{Arc, Ordering, Shared};

/// Cancels `node` and every descendant that is not quiet yet. Returns whether this call did
/// it (first cause wins; a node that already completed — quiet without a cancel — is left as
/// it is, with its subtree, and so is a quiet closed descendant: invariants 1 and 6).
///
/// Every call returns only once every such descendant is cancelled, also one that lost the race
/// for the first cause: a node found already cancelled is still walked, with its own cause,
/// because whoever cancelled it may not have reached its children yet (invariants 1 and 2:
/// otherwise work could be dispatched below after this call returned). A repeated cancel of a
/// large subtree therefore costs a walk of it.
///
/// `stamp` is the caller's clock reading, recorded as the cancel time of every node reached.
pub(crate) fn cancel<X, R>(node: &Arc<Node<X, R>>, cause: Cause, stamp: u64) -> bool {
    cancel_then(node, cause, stamp, || ()).0
}

/// [`cancel`], and `then` once the whole subtree is cancelled, before the `on_cancel`
/// callbacks run (a panicking callback, resumed after all of them ran, cannot skip `then`).
///
/// A waker that panics when woken does not stop the walk either: its panic is kept (see
/// [`Caught`]) and resumed at the very end. If several wakers or callbacks panic, the first
/// panic comes out.
pub(super) fn cancel_then<X, R, T>(
    node: &Arc<Node<X, R>>,
    cause: Cause,
    stamp: u64,
    then: impl FnOnce() -> T,
) -> (bool, T) {
    let mut due = Due::default();
    let mut first = None;
    let marked = mark_cancelled(node, &cause, stamp, &mut due, &mut first);
    due.wake();
    if marked.in_use == 0 {
        // A leaf (or a completed node): nothing to walk.
        due.hand_over(node, marked.busy);
        let out = then();
        due.finish();
        return (marked.did, out);
    }
    // The cause of everything below: the same `ParentCancelled` for the whole walk, except
    // under a node that someone else had cancelled first (its own cause wins below it).
    let below = first.take().as_ref().unwrap_or(&cause).for_child();
    let mut walk = CancelWalk {
        stamp,
        due,
        first,
        work: vec![Walk {
            node: node.clone(),
            own: None,
            in_use: usize::from(marked.in_use),
        }],
    };
    while let Some(Walk {
        node: n,
        own,
        in_use,
    }) = walk.work.pop()
    {
        walk.children(&below, &n, &own, in_use as u8, 0);
        // Wakers run with no lock held.
        walk.due.wake();
    }
    walk.due.hand_over(node, marked.busy);
    let out = then();
    // Callbacks run once the whole subtree is cancelled, so a panicking one cannot leave part
    // of it running (invariants 1, 2); the first panic (of a waker or a callback) is resumed
    // after all of them ran.
    walk.due.finish();
    (marked.did, out)
}

/// `node` was just cancelled while it had work, and the cancel has reached its whole subtree: its
/// grace period now counts, also for a `quiesce()` waiting on an ancestor (which quarantines the
/// work below a cancelled scope once its grace period ends, or that of a cancelled scope between,
/// whichever ends first). Hands `node` to each of those waits
/// ([`QuietWaiter::hand`](super::waiters::QuietWaiter::hand); the node's own waits, and those of
/// every busy scope the walk cancelled, get theirs from [`Due::hand_over`]), which look through its
/// subtree once (for scopes below with a shorter grace period) instead of through theirs again, and
/// collects their wakers (they stay registered). One ancestor's `inner` at a time, with no other
/// lock held.
///
/// Nothing is missed: a waiting `quiesce()` registers under its node's `inner` before it
/// first looks through its subtree, and is handed every later cancel. If this takes that
/// lock before the registration, the cancel walk (done before) happens-before the look,
/// which finds it all; otherwise this hands it over, and the look of `node`'s subtree comes
/// after the walk as well. A `quiesce()` of a scope that a walk still under way has marked
/// (its own cancel, or an ancestor's) is handed nothing if it registered after the mark: its
/// look meets scopes that walk has not reached yet (neither cancelled nor quiet, below a
/// cancelled one) and registers on each, so that each is handed to it (as a busy scope with
/// a waiter, by [`Due::hand_over`]) once the walk is done. (loom models in `loom_handover`.)
pub(super) fn hand_over<X, R>(node: &Arc<Node<X, R>>, wakers: &mut Vec<Waker>) {
    for p in ancestors(node).skip(1) {
        hand_to_waiters_of(p, node, wakers);
    }
}

/// Hands `node` to every `quiesce()` waiting on `waited` (`node` itself or an ancestor) and
/// collects their wakers, under `waited`'s `inner`.
fn hand_to_waiters_of<X, R>(waited: &Node<X, R>, node: &Arc<Node<X, R>>, wakers: &mut Vec<Waker>) {
    if let Some(lists) = waited.inner.lock().lists.as_mut() {
        wakers.extend(lists.quiet_waiters.iter_mut().map(|(_, w)| w.hand(node)));
    }
}

/// How deep the cancel walk descends while holding the registry locks of the way down: a node
/// met within this depth is walked at once, with no reference count taken on it; deeper ones
/// go on the work list (so a deep tree costs no deep stack).
#[cfg(not(loom))]
const HELD_DEPTH: usize = 32;

/// Under loom: 1, so that the models' shallow trees (a root, a child, a grandchild) take both
/// ways of walking — a child walked holding its parent's shard, a grandchild's parent taken
/// from the work list with the cause it passes on (`Walk::own`).
#[cfg(loom)]
const HELD_DEPTH: usize = 1;

/// A node the cancel walk has still to visit. Every field is a word (no byte fields, no
/// `Cause` by value): items are moved in and out of a vector, and mixed-width copies cost
/// store-forwarding stalls.
struct Walk<X, R> {
    node: Arc<Node<X, R>>,
    /// The origin of its children's cause, if not the one of `below`.
    own: Option<Shared<Cause>>,
    in_use: usize,
}

/// The state of one cancel's walk below the cancelled node.
struct CancelWalk<X, R> {
    stamp: u64,
    due: Due<X, R>,
    /// Out-parameter of [`mark_cancelled`].
    first: Option<Cause>,
    work: Vec<Walk<X, R>>,
}

impl<X, R> CancelWalk<X, R> {
    /// Marks the children of `n` (its shards `in_use`) with `below` (or `own`'s cause, see
    /// [`Walk`]) and, within [`HELD_DEPTH`], their subtrees, holding the registry lock of each
    /// node on the way. Lock order: a node's shard, then a child's `inner`, then the child's
    /// shards — always downwards, as everything else that takes two of them (`new_child`
    /// takes one node's shard, then its own `inner`). Wakers and callbacks are only
    /// collected: they run once no lock is held.
    fn children(
        &mut self,
        below: &Cause,
        n: &Node<X, R>,
        own: &Option<Shared<Cause>>,
        in_use: u8,
        depth: usize,
    ) {
        let own_cause;
        let child_cause = match own {
            Some(origin) => {
                own_cause = Cause::ParentCancelled(origin.clone());
                &own_cause
            }
            None => below,
        };
        for shard in n.shards_in(in_use) {
            let data = shard.data.lock();
            for (_, child) in data.children.iter() {
                let marked = mark_cancelled(
                    child,
                    child_cause,
                    self.stamp,
                    &mut self.due,
                    &mut self.first,
                );
                let first = self.first.take();
                if marked.in_use == 0 {
                    // Only nodes that ever had children are walked.
                    continue;
                }
                // Below a node someone else cancelled first, its cause holds at every depth
                // (invariant 1): a child this walk marked passes on the cause it got.
                let own = match first {
                    Some(existing) => Some(existing.origin_shared()),
                    None => own.clone(),
                };
                if depth < HELD_DEPTH {
                    self.children(below, child, &own, marked.in_use, depth + 1);
                } else {
                    self.work.push(Walk {
                        node: child.clone(),
                        own,
                        in_use: usize::from(marked.in_use),
                    });
                }
            }
        }
    }
}

/// Wakers and callbacks collected under locks, run after they are released.
struct Due<X, R> {
    wakers: Vec<Waker>,
    /// Scopes this cancel cancelled while busy that have waiting `quiesce()`s: they are
    /// handed to those once the whole walk is done ([`Due::hand_over`]).
    quiet: Vec<Arc<Node<X, R>>>,
    callbacks: Vec<(Callback, Cause)>,
    /// The first panic of a waker or callback, resumed by [`Due::finish`].
    caught: Caught,
}

impl<X, R> Default for Due<X, R> {
    fn default() -> Self {
        Due {
            wakers: Vec::new(),
            quiet: Vec::new(),
            callbacks: Vec::new(),
            caught: Caught::default(),
        }
    }
}

impl<X, R> Due<X, R> {
    /// Wakes the wakers collected so far; a panic is kept for [`Due::finish`], so that the
    /// walk goes on.
    fn wake(&mut self) {
        for w in self.wakers.drain(..) {
            self.caught.wake(w);
        }
    }

    /// Once the cancel walk from `top` is done: hands each scope in `quiet` to its own
    /// waiting `quiesce()`s, and `top`, if `busy`, to those of its ancestors (see
    /// [`hand_over`]), then wakes them all. After the walk, so that a `quiesce()` that looks
    /// through a handed scope's subtree finds it all cancelled, with the grace periods of its
    /// scopes (also when it is polled during the walk for another reason: it is handed
    /// nothing before). One that registered after its scope's mark is not handed it, and
    /// waits on the scopes below that the walk has not reached yet (see [`hand_over`]).
    fn hand_over(&mut self, top: &Arc<Node<X, R>>, busy: bool) {
        for n in self.quiet.drain(..) {
            hand_to_waiters_of(&n, &n, &mut self.wakers);
        }
        if busy {
            hand_over(top, &mut self.wakers);
        }
        self.wake();
    }

    /// Runs the callbacks, once the whole walk is done, then resumes the first panic of a
    /// waker or callback (each of them ran).
    fn finish(&mut self) {
        for (cb, cause) in self.callbacks.drain(..) {
            self.caught.run(move || cb(&cause));
        }
        std::mem::take(&mut self.caught).resume();
    }
}

/// What [`mark_cancelled`] did (returned in registers).
#[derive(Clone, Copy)]
struct Marked {
    /// This call cancelled the node.
    did: bool,
    /// This call cancelled it while it had work (it is not quiet: its grace period counts).
    busy: bool,
    /// The registry shards to walk (read under `inner`, see `new_child`).
    in_use: u8,
}

/// Cancels one node (not its children) unless it already is. If someone else cancelled it
/// first, their cause is put in `first` (it holds for the node's children).
fn mark_cancelled<X, R>(
    n: &Arc<Node<X, R>>,
    cause: &Cause,
    stamp: u64,
    due: &mut Due<X, R>,
    first: &mut Option<Cause>,
) -> Marked {
    let mut inner = n.inner.lock();
    let walk = inner.shards_in_use;
    if let Some(existing) = &inner.cause {
        // Invariant 1: someone else cancelled it; its cause wins here and below. It may still
        // be walking below, so the caller walks too; its wakers and callbacks are its own.
        *first = Some(existing.clone());
        return Marked {
            did: false,
            busy: false,
            in_use: walk,
        };
    }
    // Invariant 2: one RMW sets CANCELLED|CLOSED and bumps the generation. AcqRel: Release
    // publishes the cause (written below, before the lock is released; readers take the lock)
    // to `is_cancelled` readers; Acquire orders this after every dispatch CAS that came before
    // it. Invariant 6: a node already quiet without a cancel has completed; the update is
    // refused and neither it nor its (quiet) subtree changes.
    let Ok(prev) = n
        .state
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
            (!State(s).is_quiet()).then_some((s | CLOSED | CANCELLED).wrapping_add(GEN_ONE))
        })
    else {
        return Marked {
            did: false,
            busy: false,
            in_use: 0,
        };
    };
    let prev = State(prev);
    inner.cause = Some(cause.clone());
    inner.cancelled_at = stamp;
    due.wakers.extend(inner.first_waiter.take());
    if let Some(in_flight) = n.in_flight.get() {
        // Spawned tasks waiting in this node (see `poll_cancel_task`). Lock order: `inner`,
        // then an in-flight shard, a leaf lock.
        in_flight.cancel(&mut due.wakers);
    }
    let mut gone = Vec::new();
    if let Some(lists) = inner.lists.as_mut() {
        due.wakers.extend(lists.cancel_waiters.drain());
        due.callbacks
            .extend(lists.callbacks.drain().map(|cb| (cb, cause.clone())));
        if prev.active() == 0 {
            for w in lists.quiet_waiters.drain() {
                due.wakers.push(w.waker);
                // The scopes it was handed (weak) are dropped once this node's lock is released.
                gone.push(w.cancelled);
            }
        } else if !lists.quiet_waiters.is_empty() {
            // Not quiet yet, but a waiting `quiesce()` must learn of the cancel to start its
            // grace period: it is handed the node (it stays registered) once the whole
            // cancel walk is done.
            due.quiet.push(n.clone());
        }
    }
    drop(inner);
    drop(gone);
    Marked {
        did: true,
        busy: prev.active() != 0,
        in_use: walk,
    }
}

/// Closes the registration watermark of `node` and its descendants without cancelling.
pub(crate) fn close<X, R>(node: &Arc<Node<X, R>>) {
    // The panic of a `quiesce()`'s waker comes out once the whole subtree is closed.
    let mut caught = Caught::default();
    // Descendants still to close: empty, and so never allocated, for a node with no children
    // (a request's root closed as its handler answers).
    let mut work = Vec::new();
    close_one(node, &mut work, &mut caught);
    while let Some(n) = work.pop() {
        close_one(&n, &mut work, &mut caught);
    }
    caught.resume();
}

/// Closes the watermark of `n` and pushes its children onto `work`.
fn close_one<X, R>(n: &Node<X, R>, work: &mut Vec<Arc<Node<X, R>>>, caught: &mut Caught) {
    // AcqRel: pairs with `take_unit`'s CAS (which fails once this is visible) and with
    // `release_unit`'s decrement (one of the two sees the other and wakes quiesce waiters).
    let prev = State(n.state.fetch_or(CLOSED, Ordering::AcqRel));
    if !prev.is_closed() && prev.active() == 0 {
        wake_quiet(n, caught);
    }
    // Walked even if it was closed already: whoever closed it may not have reached its
    // descendants yet, and a `close()` that returns leaves the whole subtree closed
    // (invariant 3; loom model 22).
    // Under `inner`: pairs with the announcement of a shard in `new_child`.
    let in_use = n.inner.lock().shards_in_use;
    for shard in n.shards_in(in_use) {
        let data = shard.data.lock();
        work.extend(data.children.iter().map(|(_, c)| c.clone()));
    }
}

/// Closes the registration watermark of `node` alone, not its descendants' (a server that stops
/// admitting, see the module docs): returns the state before. Its children keep theirs; one
/// with no unit can take none any more (its first needs one of `node`'s, invariant 3), so
/// `node` is quiet, for good, once its children's units are gone (invariant 6).
pub(crate) fn close_own<X, R>(node: &Node<X, R>) -> State {
    let mut caught = Caught::default();
    // AcqRel: as `close`.
    let prev = State(node.state.fetch_or(CLOSED, Ordering::AcqRel));
    if !prev.is_closed() && prev.active() == 0 {
        wake_quiet(node, &mut caught);
    }
    caught.resume();
    prev
}
