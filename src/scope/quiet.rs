//! The wait for a scope's quiet, with the grace periods of the cancelled scopes of its subtree:
//! once one ends, the work below that scope is quarantined (see [`Scope::quiesce`]). The report
//! is built above, in `quiesce`; a shielded cleanup waits for its own scope with this alone.

use std::collections::binary_heap::{BinaryHeap, PeekMut};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use super::{Core, Scope};
use crate::spec::task_spec;
use crate::sync::{downgrade, Arc, Weak};
use crate::time::{instant_of, now_stamp, sleepable_after};
use crate::tree::{self, Wait, WaiterKey};

/// The wait of [`Scope::quiesce`](crate::Scope::quiesce) for the scope's quiet: resolves once
/// the scope is quiet, quarantining the work below a cancelled scope of the subtree once its
/// grace period ends (see `Scope::quiesce`). Also what a shielded cleanup waits for its own
/// scope with.
///
/// # Cancel safety
///
/// Cancel safe: dropping it unregisters its waker; a new wait picks up where it was.
#[must_use = "futures do nothing unless polled"]
pub(crate) struct Quiet {
    scope: Scope,
    key: WaiterKey,
    grace: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether the scope's subtree was looked through for cancelled scopes (at the first
    /// poll; later cancels are handed over).
    looked: bool,
    /// Cancelled scopes whose grace period has not ended, soonest end first.
    due: BinaryHeap<GraceEnd>,
    /// The scopes put on `due`, and the handed scopes looked through (by address; the weak
    /// reference keeps the address from being reused), which the look of a scope handed over
    /// later passes over, with their subtrees (looked through when they were put here).
    seen: HashMap<usize, Weak<Core>>,
    /// Scopes a cancel walk still under way had not reached when a look met them (below a
    /// cancelled scope): this future waits on each, and is handed it once that walk is done.
    watching: Vec<(Arc<Core>, WaiterKey)>,
    /// The size of `due` or `seen` at which scopes that are quiet or gone are dropped.
    prune_at: usize,
    /// The earliest grace end of a cancelled ancestor of the scope put on `due` for the scope
    /// (see [`cancelled_grace_end`]).
    outer: Option<tokio::time::Instant>,
}

/// The fewest entries of `Quiet::due` at which it is pruned.
const PRUNE_MIN: usize = 64;

/// A cancelled scope of a quiescing subtree, and when its grace period ends. Weak: a scope
/// that finishes and goes is freed at once (invariant 7), not at its grace end.
struct GraceEnd {
    at: tokio::time::Instant,
    node: Weak<Core>,
}

impl PartialEq for GraceEnd {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl Eq for GraceEnd {}

impl PartialOrd for GraceEnd {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for GraceEnd {
    /// Reversed, so that the max-heap `BinaryHeap` gives the soonest end first.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.at.cmp(&self.at)
    }
}

impl Future for Quiet {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let mut handed = Vec::new();
        if tree::poll_quiet(&this.scope.node, &mut this.key, cx.waker(), &mut handed) {
            this.stop_watching();
            return Poll::Ready(());
        }
        if cfg!(loom) {
            // Under loom there is no tokio timer: the models wait for receipts.
            return Poll::Pending;
        }
        // The work below a cancelled scope (this one, or a descendant: a child's deadline,
        // its own cancel) is quarantined once its grace period after the cancel ends, or that
        // of a cancelled scope between, whichever ends first. The subtree is looked through
        // once (this future is registered by now); every later busy cancel in it is handed to
        // this future once its cancel walk is done, with a wake-up (`tree::hand_over`), and
        // only the handed scope's subtree is looked through, passing over what was seen.
        let mut looks = Vec::new();
        if !std::mem::replace(&mut this.looked, true) {
            looks.push((this.scope.node.clone(), false));
        }
        this.take_watched(cx.waker(), &mut handed);
        looks.extend(handed.iter().filter_map(|d| Some((d.upgrade()?, true))));
        this.look(looks, cx.waker());
        // A cancel that reached this scope from above counts with its own grace period: the
        // grace period that ends first holds for the work below both (that cancel hands this
        // scope to its own waiters, so this poll comes after it).
        if this.scope.node.state().is_cancelled() {
            if let Some(at) = cancelled_grace_end(tree::ancestors(&*this.scope.node).skip(1))
                .filter(|&at| this.outer.is_none_or(|o| at < o))
            {
                this.outer = Some(at);
                this.due.push(GraceEnd {
                    at,
                    node: downgrade(&this.scope.node),
                });
            }
        }
        if this.due.len().max(this.seen.len()) >= this.prune_at {
            // Amortized: at least as many entries as this keeps come before the next one.
            let live = |n: &Weak<Core>| n.upgrade().is_some_and(|n| !n.state().is_quiet());
            this.due.retain(|e| live(&e.node));
            this.seen.retain(|_, n| live(n));
            this.prune_at = (2 * this.due.len().max(this.seen.len())).max(PRUNE_MIN);
        }
        let now = tokio::time::Instant::now();
        while let Some(first) = this.due.peek_mut() {
            if first.at > now {
                break;
            }
            if let Some(d) = PeekMut::pop(first).node.upgrade() {
                if !d.state().is_quiet() {
                    tree::quarantine_subtree(&d, &task_spec(), now_stamp());
                }
            }
        }
        match this.due.peek() {
            // In the future when `now` was read: this registers the timer's wake-up. If that end
            // has passed since (a slow waker or callback of the quarantine above, the thread
            // descheduled), a new timer is ready at once and will not wake this future: it
            // wakes itself, and its next poll quarantines what is due.
            Some(first) => {
                if poll_grace(&mut this.grace, first.at, cx).is_ready() {
                    cx.waker().wake_by_ref();
                }
            }
            None => this.grace = None,
        }
        // Guards are not quarantined: wait for them (or resolve if quiet now). A cancel below
        // since the look above is handed over with a wake-up: the next poll takes it.
        if this.scope.node.state().is_quiet() {
            tree::forget_waiter(&this.scope.node, Wait::Quiet, &mut this.key);
            this.stop_watching();
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Quiet {
    /// Takes what the scopes watched were handed; stops watching those that are quiet, or
    /// that were handed themselves (their walk is done: the look of them sees it all).
    fn take_watched(&mut self, waker: &Waker, handed: &mut Vec<Weak<Core>>) {
        let mut i = 0;
        while i < self.watching.len() {
            let (c, key) = &mut self.watching[i];
            let from = handed.len();
            let quiet = tree::poll_quiet(c, key, waker, handed);
            let reached = handed[from..]
                .iter()
                .any(|d| d.upgrade().is_some_and(|d| Arc::ptr_eq(&d, c)));
            if quiet || reached {
                let (c, mut key) = self.watching.swap_remove(i);
                tree::forget_waiter(&c, Wait::Quiet, &mut key);
            } else {
                i += 1;
            }
        }
    }

    /// Looks through each scope of `looks` (`true`: handed over, so its cancel walk is done)
    /// and watches the scopes a walk under way has not reached yet (see `look_below`). One
    /// that the walk reaches before it is watched is looked through at once (its own
    /// subtree may still be on the way: that look watches below it).
    fn look(&mut self, mut looks: Vec<(Arc<Core>, bool)>, waker: &Waker) {
        let mut unreached = Vec::new();
        while let Some((d, handed)) = looks.pop() {
            look_below(&d, handed, &mut self.due, &mut self.seen, &mut unreached);
            for c in unreached.drain(..) {
                let mut key = WaiterKey::default();
                if tree::poll_quiet(&c, &mut key, waker, &mut Vec::new()) {
                    continue;
                }
                if c.state().is_cancelled() {
                    // Reached before it was watched: it will not be handed to this waiter.
                    tree::forget_waiter(&c, Wait::Quiet, &mut key);
                    looks.push((c, false));
                } else {
                    self.watching.push((c, key));
                }
            }
        }
    }

    /// Takes this future's waiters off the scopes it watches (it resolved, or is dropped).
    fn stop_watching(&mut self) {
        for (c, mut key) in self.watching.drain(..) {
            tree::forget_waiter(&c, Wait::Quiet, &mut key);
        }
    }
}

/// Puts on `due` the scopes of the subtree of `node` (itself included) that are cancelled,
/// not quiet yet, and whose grace period ends before that of every cancelled scope above them
/// within the subtree: their work is quarantined at that end. Those go into `seen` too, and
/// so does a `handed` scope (its cancel walk is done) once looked through; its look passes
/// over the scopes below it already seen, with their subtrees (so a chain of nested deadlines
/// firing bottom-up puts each scope on `due` once, and is looked through once, not once per
/// scope above it). Other scopes are not kept (a finished one is freed at once, invariant 7).
/// A scope that is neither cancelled nor quiet below a cancelled one has not been reached by
/// a cancel walk still under way (on another thread, or this one's caller): it goes into
/// `unreached`, to be watched. One registry shard lock at a time, only to clone `Arc`s.
fn look_below(
    node: &Arc<Core>,
    handed: bool,
    due: &mut BinaryHeap<GraceEnd>,
    seen: &mut HashMap<usize, Weak<Core>>,
    unreached: &mut Vec<Arc<Core>>,
) {
    // Each with the earliest grace end above it (`None`: none, or never), and whether a
    // scope above it is cancelled.
    let mut work = vec![(node.clone(), None, false)];
    let mut children = Vec::new();
    while let Some((n, above, under_cancelled)) = work.pop() {
        #[cfg(test)]
        tests::LOOKED_AT.with(|c| c.set(c.get() + 1));
        let state = n.state();
        if state.is_quiet() {
            continue;
        }
        let mut bound = above;
        if state.is_cancelled() {
            let addr = Arc::as_ptr(&n).addr();
            let root = Arc::ptr_eq(&n, node);
            if handed && !root && seen.contains_key(&addr) {
                continue;
            }
            if let Some(at) = grace_end(&n).filter(|&at| above.is_none_or(|a| at < a)) {
                bound = Some(at);
                seen.insert(addr, downgrade(&n));
                due.push(GraceEnd {
                    at,
                    node: downgrade(&n),
                });
            } else if handed && root {
                // Looked through once its walk was done, though it has no end of its own (a
                // grace period that never ends): passed over as well.
                seen.insert(addr, downgrade(&n));
            }
        } else if under_cancelled {
            unreached.push(n);
            continue;
        }
        let cancelled = state.is_cancelled() || under_cancelled;
        tree::push_children(&n, &mut children);
        work.extend(children.drain(..).map(|c| (c, bound, cancelled)));
    }
}

/// The earliest end of the grace periods of the cancelled scopes among `scopes` (a walk up
/// the tree; `None`: none is cancelled, or none ends).
fn cancelled_grace_end<'a>(scopes: impl Iterator<Item = &'a Core>) -> Option<tokio::time::Instant> {
    scopes
        .filter(|c| c.state().is_cancelled())
        .filter_map(grace_end)
        .min()
}

/// Polls the grace timer in `grace`, set to end at `at`.
fn poll_grace(
    grace: &mut Option<Pin<Box<tokio::time::Sleep>>>,
    at: tokio::time::Instant,
    cx: &mut Context<'_>,
) -> Poll<()> {
    let sleep = match grace {
        Some(sleep) => {
            if sleep.deadline() != at {
                sleep.as_mut().reset(at);
            }
            sleep
        }
        slot => slot.insert(Box::pin(tokio::time::sleep_until(at))),
    };
    sleep.as_mut().poll(cx)
}

/// When the grace period after the cancel of `node` ends (`None`: too far to represent).
fn grace_end(node: &Core) -> Option<tokio::time::Instant> {
    sleepable_after(instant_of(node.cancelled_at()), node.ext.grace())
}

impl Drop for Quiet {
    fn drop(&mut self) {
        tree::forget_waiter(&self.scope.node, Wait::Quiet, &mut self.key);
        self.stop_watching();
    }
}

impl fmt::Debug for Quiet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quiet")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl Scope {
    /// Waits for this scope's quiet, quarantining as [`quiesce`](Scope::quiesce) does.
    pub(crate) fn quiet(&self) -> Quiet {
        Quiet {
            scope: self.clone(),
            key: WaiterKey::default(),
            grace: None,
            looked: false,
            due: BinaryHeap::new(),
            seen: HashMap::new(),
            watching: Vec::new(),
            prune_at: PRUNE_MIN,
            outer: None,
        }
    }

    /// Whether the grace period after the cancel of this scope, or of a cancelled ancestor, has
    /// ended (the work below is quarantined by the next `quiesce`, if none did yet). Reads
    /// the clock only if one of them is cancelled.
    pub(crate) fn grace_ended(&self) -> bool {
        cancelled_grace_end(tree::ancestors(&*self.node))
            .is_some_and(|at| at <= tokio::time::Instant::now())
    }
}

impl Quiet {
    /// The scope waited for.
    pub(crate) fn scope(&self) -> &Scope {
        &self.scope
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::time::Duration;

    use crate::{ChildSpec, Scope};

    thread_local! {
        /// Scopes `look_below` visited on this thread.
        pub(super) static LOOKED_AT: Cell<usize> = const { Cell::new(0) };
    }

    /// A closed scope's waiting `quiesce()` over N busy child scopes that are cancelled one by
    /// one looks through its subtree once (N + 1 scopes), not once per cancel (N² in all):
    /// each cancel hands the cancelled child to it, and it looks through that child's
    /// subtree only (one scope here).
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_waiting_quiesce_looks_through_its_subtree_once_however_many_cancels_come() {
        const N: usize = 300;
        let parent = Scope::new();
        let mut kids = Vec::new();
        for _ in 0..N {
            let c = parent
                .child()
                .grace(Duration::from_secs(1))
                .build()
                .unwrap();
            let work = c
                .register(ChildSpec::read_only("w"))
                .unwrap()
                .dispatch()
                .unwrap();
            kids.push((c, work));
        }
        parent.close();
        let waiting = tokio::spawn({
            let parent = parent.clone();
            async move { parent.quiesce().await }
        });
        tokio::task::yield_now().await;
        let before = LOOKED_AT.with(Cell::get);
        assert_eq!(before, N + 1, "the first poll looks through the subtree");
        for (c, _) in &kids {
            c.cancel();
            // The waiting quiesce runs after each cancel (it was woken).
            tokio::task::yield_now().await;
        }
        assert_eq!(
            LOOKED_AT.with(Cell::get),
            before + N,
            "a cancel made it look through more than the cancelled child"
        );
        let report = waiting.await.unwrap();
        assert_eq!(report.quarantined(), N as u64, "{report}");
    }

    /// Scopes visited by the looks of N `quiesce()`s, one waiting on each scope of a chain of
    /// N busy scopes that are cancelled deepest first (each cancel is handed to every waiter
    /// above it).
    async fn looks_over_a_chain_cancelled_bottom_up(grace: Duration) -> usize {
        const N: usize = 60;
        let mut chain: Vec<Scope> = Vec::new();
        for _ in 0..N {
            let parent = chain.last().cloned().unwrap_or_else(Scope::new);
            chain.push(parent.child().grace(grace).build().unwrap());
        }
        let work = chain.last().unwrap();
        let work = work.register(ChildSpec::read_only("w")).unwrap();
        let work = work.dispatch().unwrap();
        let waiting: Vec<_> = chain
            .iter()
            .map(|s| {
                let s = s.clone();
                tokio::spawn(async move { s.quiesce().await })
            })
            .collect();
        tokio::task::yield_now().await;
        let before = LOOKED_AT.with(Cell::get);
        for s in chain.iter().rev() {
            s.cancel();
            tokio::task::yield_now().await;
        }
        let visits = LOOKED_AT.with(Cell::get) - before;
        drop(work);
        for w in waiting {
            w.await.unwrap();
        }
        visits
    }

    /// The looks of a chain cancelled bottom-up visit no more scopes when the grace period
    /// never ends (no heap entries) than with one that does: each handed scope is passed over
    /// by the looks of the scopes handed after it (before, with no entry to mark it seen, each
    /// look went through the whole cancelled chain below: about N³/6 visits).
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_chain_cancelled_bottom_up_is_looked_through_as_often_whatever_the_grace() {
        let finite = looks_over_a_chain_cancelled_bottom_up(Duration::from_secs(3600)).await;
        let never = looks_over_a_chain_cancelled_bottom_up(Duration::MAX).await;
        assert!(
            never <= finite,
            "scopes visited: {never} with a grace period that never ends, {finite} with 1 h"
        );
    }
}
