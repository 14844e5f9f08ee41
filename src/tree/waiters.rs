//! The waiter lists of a node, under its `inner` lock: tasks waiting in `cancelled()` and in
//! `quiesce()`, and `on_cancel` callbacks. Registered under the same lock that the waking side
//! takes, so that no wake-up is lost; woken with no lock held.

use std::task::Waker;

use slab::Slab;

use super::Node;
use crate::cause::Cause;
use crate::panic::Caught;
use crate::sync::{downgrade, Arc, Mutex, Weak};

pub(super) type Callback = Box<dyn FnOnce(&Cause) + Send>;

pub(super) struct Inner<X, R> {
    /// Set once, together with `CANCELLED` (invariant 1).
    pub(super) cause: Option<Cause>,
    /// Stamp of the cancel (caller-supplied clock, nanoseconds); 0 while not cancelled.
    pub(super) cancelled_at: u64,
    /// The first task waiting in `cancelled()`, kept inline: most scopes that are waited on
    /// at all have one waiter (the `run` around their work), which then costs no allocation.
    pub(super) first_waiter: Option<Waker>,
    /// Waiters and callbacks, allocated by the first one that does not fit inline (most nodes
    /// never have any).
    pub(super) lists: Option<Box<Lists<X, R>>>,
    /// Bit `i`: registry shard `i` has had a child. Set (under this lock) before the first
    /// child of a shard reads the state word, read by cancel and close under this lock, so
    /// that they visit only shards in use (see `new_child`).
    pub(super) shards_in_use: u8,
}

pub(super) struct Lists<X, R> {
    /// Tasks waiting in `cancelled()`.
    pub(super) cancel_waiters: Slab<Waker>,
    /// Tasks waiting in `quiesce()`.
    pub(super) quiet_waiters: Slab<QuietWaiter<X, R>>,
    /// `on_cancel` callbacks.
    pub(super) callbacks: Slab<Callback>,
}

impl<X, R> Default for Lists<X, R> {
    fn default() -> Self {
        Lists {
            cancel_waiters: Slab::new(),
            quiet_waiters: Slab::new(),
            callbacks: Slab::new(),
        }
    }
}

/// A task waiting in `quiesce()`, with the scopes cancelled while busy (its own, or below it) that
/// it has not been handed yet (see [`hand_over`](super::cancel::hand_over) and [`poll_quiet`]).
/// Weak: a handed scope that finishes and goes is freed at once (invariant 7), not when it is
/// taken.
pub(crate) struct QuietWaiter<X, R> {
    pub(super) waker: Waker,
    pub(super) cancelled: Vec<Weak<Node<X, R>>>,
    /// The length of `cancelled` at which the gone scopes are dropped from it (a waiter not
    /// polled for a long time does not collect them without bound).
    pub(super) prune_at: usize,
}

impl<X, R> QuietWaiter<X, R> {
    /// The fewest handed scopes at which gone ones are dropped.
    const PRUNE_MIN: usize = 32;

    /// Hands `node` over and returns the waker to wake once no lock is held.
    pub(super) fn hand(&mut self, node: &Arc<Node<X, R>>) -> Waker {
        if self.cancelled.len() >= self.prune_at {
            // Amortized: at least as many pushes as this keeps come before the next one.
            self.cancelled.retain(|n| n.strong_count() > 0);
            self.prune_at = (2 * self.cancelled.len()).max(Self::PRUNE_MIN);
        }
        self.cancelled.push(downgrade(node));
        self.waker.clone()
    }
}

impl<X, R> Inner<X, R> {
    /// A fresh node's `inner`. A constant, so that a new node copies it from one place
    /// instead of assembling it field by field on the stack (which costs a store-forwarding
    /// stall per node when the pieces are copied on into the node).
    const EMPTY: Inner<X, R> = Inner {
        cause: None,
        cancelled_at: 0,
        first_waiter: None,
        lists: None,
        shards_in_use: 0,
    };

    /// A fresh node's locked `inner`, copied from a constant (see [`Inner::EMPTY`]).
    #[cfg(not(loom))]
    #[allow(clippy::declare_interior_mutable_const)] // copied, never shared
    const LOCK: Mutex<Inner<X, R>> = Mutex::new(Inner::EMPTY);

    #[cfg(not(loom))]
    pub(super) fn new_lock() -> Mutex<Inner<X, R>> {
        Self::LOCK
    }

    #[cfg(loom)]
    pub(super) fn new_lock() -> Mutex<Inner<X, R>> {
        Mutex::new(Inner::EMPTY)
    }

    fn lists(&mut self) -> &mut Lists<X, R> {
        self.lists.get_or_insert_with(Box::default)
    }

    /// Takes every `quiesce()` waiter (the node became quiet; cancel drains its own lists in
    /// `mark_cancelled`). The caller drops them with no lock held (they hold nodes).
    fn take_quiet_waiters(&mut self) -> Vec<QuietWaiter<X, R>> {
        self.lists
            .as_mut()
            .map_or_else(Vec::new, |l| l.quiet_waiters.drain().collect())
    }
}

/// Wakes the `quiesce()`s of `node`, which became quiet (a panic is kept in `caught`).
pub(super) fn wake_quiet<X, R>(node: &Node<X, R>, caught: &mut Caught) {
    let waiters = node.inner.lock().take_quiet_waiters();
    for w in waiters {
        caught.wake(w.waker);
    }
}

/// A registered waiter: its key in one of the node's waiter slabs.
#[derive(Debug, Default)]
pub(crate) struct WaiterKey {
    slot: Option<usize>,
    /// What identifies the waker in `slot` (see [`WakerId`]): a poll with a waker that is
    /// the same needs no lock (the registered one is still in the list until the waking side
    /// drains it).
    waker: Option<WakerId>,
}

/// A waker's data and vtable addresses: equal for two wakers exactly when `will_wake` is
/// true. Kept instead of a clone of the registered waker (no reference count taken and
/// dropped per registration). It cannot name a reused address: it is taken from the clone
/// in the node's list (not from the waker it was cloned from, which may be gone, its address
/// reused by another waker, when its clone is a new object), which stays alive there until
/// the waking side drains the list, which it does only once the condition holds for good,
/// and a poll checks the condition first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WakerId(usize, usize);

impl WakerId {
    fn of(waker: &Waker) -> WakerId {
        WakerId(
            waker.data().addr(),
            std::ptr::from_ref(waker.vtable()).addr(),
        )
    }
}

/// Which waiter list.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Wait {
    Cancel,
    Quiet,
}

/// Polls for cancel: returns `true` if reached; otherwise registers `waker` (once, updated on
/// later polls) under the same lock that cancel takes to wake, so no wake-up is lost.
pub(crate) fn poll_cancelled<X, R>(node: &Node<X, R>, key: &mut WaiterKey, waker: &Waker) -> bool {
    if node.state().is_cancelled() {
        forget_waiter(node, Wait::Cancel, key);
        return true;
    }
    if key.slot.is_some() && key.waker == Some(WakerId::of(waker)) {
        // Registered with an equivalent waker: the waking side will wake it.
        return false;
    }
    let mut inner = node.inner.lock();
    // Re-check under the lock: the waking side changes the state before it takes this lock.
    if node.state().is_cancelled() {
        let removed = key.slot.take().and_then(|k| take_waiter(&mut inner, k));
        drop(inner);
        // Wakers are dropped with no lock held (dropping one may drop a task's output).
        drop(removed);
        key.waker = None;
        return true;
    }
    // The identity of the clone that goes into the list, not of `waker`: only the clone is
    // kept alive there (a waker whose clone is a new object, e.g. one borrowed from a slot
    // that is reused, would otherwise be named by an address that another waker can take).
    let kept = waker.clone();
    let id = WakerId::of(&kept);
    let replaced = match key.slot {
        Some(INLINE) => inner.first_waiter.replace(kept),
        Some(k) => inner
            .lists()
            .cancel_waiters
            .get_mut(k)
            .map(|w| std::mem::replace(w, kept)),
        None if inner.first_waiter.is_none() => {
            inner.first_waiter = Some(kept);
            key.slot = Some(INLINE);
            None
        }
        None => {
            key.slot = Some(inner.lists().cancel_waiters.insert(kept));
            None
        }
    };
    drop(inner);
    drop(replaced);
    key.waker = Some(id);
    false
}

/// Polls for quiet, for a `quiesce()`: returns `true` if reached; otherwise registers `waker`
/// (once, updated on later polls) under the same lock that close, release and cancel take to wake,
/// so no wake-up is lost, and moves onto `cancelled` the scopes (its own, or below it) handed to
/// this waiter since its last poll (see [`hand_over`](super::cancel::hand_over)). Always takes the
/// lock (a `quiesce()` is polled rarely: at its start, at a cancel below, at a grace end).
pub(crate) fn poll_quiet<X, R>(
    node: &Node<X, R>,
    key: &mut WaiterKey,
    waker: &Waker,
    cancelled: &mut Vec<Weak<Node<X, R>>>,
) -> bool {
    if node.state().is_quiet() {
        forget_waiter(node, Wait::Quiet, key);
        return true;
    }
    let mut inner = node.inner.lock();
    // Re-check under the lock: the waking side changes the state before it takes this lock.
    if node.state().is_quiet() {
        let removed = key
            .slot
            .take()
            .and_then(|k| inner.lists.as_mut()?.quiet_waiters.try_remove(k));
        drop(inner);
        // Dropped with no lock held (a waker may drop a task's output, a node its data).
        drop(removed);
        key.waker = None;
        return true;
    }
    let lists = inner.lists();
    let mut replaced = None;
    match key.slot.and_then(|k| lists.quiet_waiters.get_mut(k)) {
        Some(w) => {
            cancelled.append(&mut w.cancelled);
            if key.waker != Some(WakerId::of(waker)) {
                // The identity of the clone kept in the list (see `poll_cancelled`).
                let kept = waker.clone();
                key.waker = Some(WakerId::of(&kept));
                replaced = Some(std::mem::replace(&mut w.waker, kept));
            }
        }
        None => {
            let kept = waker.clone();
            key.waker = Some(WakerId::of(&kept));
            key.slot = Some(lists.quiet_waiters.insert(QuietWaiter {
                waker: kept,
                cancelled: Vec::new(),
                prune_at: QuietWaiter::<X, R>::PRUNE_MIN,
            }));
        }
    }
    drop(inner);
    drop(replaced);
    false
}

/// The key of the inline cancel waiter (`Inner::first_waiter`); slab keys never reach it.
const INLINE: usize = usize::MAX;

/// Takes the cancel waiter registered under `key` (inline or in its list), if still there.
fn take_waiter<X, R>(inner: &mut Inner<X, R>, key: usize) -> Option<Waker> {
    if key == INLINE {
        inner.first_waiter.take()
    } else {
        inner.lists.as_mut()?.cancel_waiters.try_remove(key)
    }
}

/// Removes a registered waiter (future dropped before completion). Cancel safety of the public
/// futures rests on this: dropping one leaves nothing behind.
pub(crate) fn forget_waiter<X, R>(node: &Node<X, R>, which: Wait, key: &mut WaiterKey) {
    key.waker = None;
    if let Some(k) = key.slot.take() {
        let mut inner = node.inner.lock();
        // If the waking side drained the list, the key is stale, but its slot cannot have been
        // reused: lists are drained only when their condition (cancelled / quiet) has become
        // permanent, and a poll never registers once it holds. So removing is safe.
        let (waker, quiet, lists) = match which {
            Wait::Cancel => (take_waiter(&mut inner, k), None, None),
            Wait::Quiet => {
                let quiet = inner
                    .lists
                    .as_mut()
                    .and_then(|l| l.quiet_waiters.try_remove(k));
                // The last waiter of any kind gone: the lists go too (a `quiesce()` that
                // watched many scopes for a while leaves nothing on them). A stale key of a
                // drained list cannot meet a new entry in lists made again: they are drained
                // only once their condition holds for good, and nothing registers after.
                let empty = inner.lists.as_ref().is_some_and(|l| {
                    l.quiet_waiters.is_empty()
                        && l.cancel_waiters.is_empty()
                        && l.callbacks.is_empty()
                });
                (None, quiet, if empty { inner.lists.take() } else { None })
            }
        };
        drop(inner);
        // Dropped with no lock held (a waker may drop a task's output, a node its data).
        drop(waker);
        drop(quiet);
        drop(lists);
    }
}

/// Registers an `on_cancel` callback; runs it at once (returning `None`) if already cancelled.
pub(crate) fn on_cancel<X, R>(node: &Node<X, R>, f: Callback) -> Option<usize> {
    let cause = {
        let mut inner = node.inner.lock();
        match &inner.cause {
            None => return Some(inner.lists().callbacks.insert(f)),
            Some(c) => c.clone(),
        }
    };
    f(&cause);
    None
}

/// Unregisters an `on_cancel` callback. Returns `true` if it was still registered (so it will
/// never run).
pub(crate) fn stop_callback<X, R>(node: &Node<X, R>, key: usize) -> bool {
    // The closure is dropped after the lock is released: it may own tickets, guards or scopes
    // of this node whose drop takes the lock again.
    let removed = node.inner.lock().lists().callbacks.try_remove(key);
    removed.is_some()
}
