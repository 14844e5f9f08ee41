//! Lifecycle and stable quiescence: a scope that can prove it has stopped.
//!
//! [`Scope::quiesce`] resolves once the scope's registration watermark is closed (by
//! [`Scope::close`] or a cancel), every registered child of its subtree has a terminal receipt
//! (or was quarantined after the grace period), and every guard was released. From then on
//! nothing of that scope can start or commit and no number in its [`Report`] changes
//! (invariant 6): new registrations are refused by the closed watermark, and a child scope can
//! only take work through a unit of this one.

use std::collections::binary_heap::{BinaryHeap, PeekMut};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::cause::Cause;
use crate::child::Failure;
use crate::scope::{Core, Note, Scope};
use crate::spec::{ChildSpec, EffectRecord};
use crate::sync::{downgrade, Arc, Weak};
use crate::time::{instant_of, nanos, now_stamp, sleepable_after};
use crate::tree::{self, Kind, Wait, WaiterKey};

/// Where a scope is in its life.
///
/// `Accepted -> Running -> Cancelling -> CancelledStable | Completed | NeedsReconciliation`
/// (a scope closed without a cancel goes from `Running` straight to a final state).
///
/// # Examples
///
/// ```
/// use cancel_scope::{ChildSpec, Lifecycle, Scope};
/// let s = Scope::new();
/// assert_eq!(s.lifecycle(), Lifecycle::Accepted);
/// let t = s.register(ChildSpec::read_only("x")).unwrap();
/// assert_eq!(s.lifecycle(), Lifecycle::Running);
/// s.cancel();
/// assert_eq!(s.lifecycle(), Lifecycle::Cancelling);
/// drop(t);
/// assert_eq!(s.lifecycle(), Lifecycle::CancelledStable);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Lifecycle {
    /// Created; no work was registered yet.
    Accepted,
    /// Work was registered; not cancelled.
    Running,
    /// Cancelled; some children have no receipt yet.
    Cancelling,
    /// Cancelled and quiet; nothing's effect is unknown.
    CancelledStable,
    /// Closed without a cancel and quiet; nothing's effect is unknown.
    Completed,
    /// Quiet, but some effects are unknown or a child that may have effects was quarantined:
    /// see [`Report::pending_effects`].
    NeedsReconciliation,
}

impl Lifecycle {
    /// Whether this is one of the three final states.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Lifecycle;
    /// assert!(Lifecycle::Completed.is_final());
    /// assert!(!Lifecycle::Cancelling.is_final());
    /// ```
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Lifecycle::CancelledStable | Lifecycle::Completed | Lifecycle::NeedsReconciliation
        )
    }
}

/// What a scope did, as of the moment it became quiet. Returned by [`Scope::quiesce`].
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use cancel_scope::{ChildSpec, Lifecycle, Scope};
///
/// let s = Scope::new();
/// s.spawn(async {}).unwrap().await.unwrap();
/// let pay = s.register(ChildSpec::side_effecting("charge", "payment-7")).unwrap();
/// let pay = pay.dispatch().unwrap();
/// s.cancel();
/// drop(pay); // dispatched, may have charged: outcome unknown
///
/// let report = s.quiesce().await;
/// assert_eq!(report.state(), Lifecycle::NeedsReconciliation);
/// assert_eq!(report.succeeded(), 1);
/// assert_eq!(report.effect_unknown(), 1);
/// assert_eq!(report.pending_effects()[0].effect_id(), "payment-7");
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    state: Lifecycle,
    cause: Option<Cause>,
    counts: [u64; 5],
    pending_effects: Vec<EffectRecord>,
    quarantined_children: Vec<ChildSpec>,
    cancel_to_quiet: Option<Duration>,
    orphan_work: Duration,
    /// Values the layers above attached to the scope or below it (retry ledgers, failures),
    /// oldest first.
    notes: Vec<Note>,
    /// How many older notes the scope dropped (it keeps the newest 64).
    dropped_notes: u64,
}

impl Report {
    /// The final state.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::{Lifecycle, Scope};
    /// let s = Scope::new();
    /// s.close();
    /// assert_eq!(s.quiesce().await.state(), Lifecycle::Completed);
    /// # }
    /// ```
    pub fn state(&self) -> Lifecycle {
        self.state
    }

    /// The cancel cause, if the scope was cancelled.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::{Cause, Scope};
    /// let s = Scope::new();
    /// s.cancel_because(Cause::ClientGone);
    /// assert_eq!(s.quiesce().await.cause(), Some(&Cause::ClientGone));
    /// # }
    /// ```
    pub fn cause(&self) -> Option<&Cause> {
        self.cause.as_ref()
    }

    /// Children that succeeded (in the whole subtree).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.spawn(async {}).unwrap().await.unwrap();
    /// s.close();
    /// assert_eq!(s.quiesce().await.succeeded(), 1);
    /// # }
    /// ```
    pub fn succeeded(&self) -> u64 {
        self.counts[Kind::Succeeded as usize]
    }

    /// Children that failed (including panics).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use cancel_scope::Scope;
    /// let s = Scope::new();
    /// let _ = s.spawn(async { panic!("boom") }).unwrap().await;
    /// s.close();
    /// assert_eq!(s.quiesce().await.failed(), 1);
    /// # }
    /// ```
    pub fn failed(&self) -> u64 {
        self.counts[Kind::Failed as usize]
    }

    /// Children confirmed stopped (or never started) because of a cancel.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use cancel_scope::Scope;
    /// let s = Scope::new();
    /// let h = s.spawn(std::future::pending::<()>()).unwrap();
    /// s.cancel();
    /// assert_eq!(s.quiesce().await.cancelled(), 1);
    /// # drop(h);
    /// # }
    /// ```
    pub fn cancelled(&self) -> u64 {
        self.counts[Kind::Cancelled as usize]
    }

    /// Children quarantined after the grace period.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.close();
    /// assert_eq!(s.quiesce().await.quarantined(), 0);
    /// # }
    /// ```
    pub fn quarantined(&self) -> u64 {
        self.counts[Kind::Quarantined as usize]
    }

    /// Children whose effect is unknown.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.close();
    /// assert_eq!(s.quiesce().await.effect_unknown(), 0);
    /// # }
    /// ```
    pub fn effect_unknown(&self) -> u64 {
        self.counts[Kind::EffectUnknown as usize]
    }

    /// All receipts.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.spawn(async {}).unwrap().await.unwrap();
    /// s.close();
    /// assert_eq!(s.quiesce().await.total(), 1);
    /// # }
    /// ```
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Effects to reconcile: every `EffectUnknown` receipt, quarantined children that may
    /// have had an effect, and the effects a quarantined [`shield`](Scope::shield)'s cleanup
    /// left open in its own scope (no receipt of this scope counts those; a receipt being
    /// recorded there as the quarantine came counts, if that child may have had an effect) —
    /// one record per
    /// effect (a retry attempt and the call inside it that both end `EffectUnknown` report the
    /// same effect once; the receipt counts keep both). Records of one effect id that disagree
    /// (two provider handles or payload digests) are listed each.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.close();
    /// assert!(s.quiesce().await.pending_effects().is_empty());
    /// # }
    /// ```
    pub fn pending_effects(&self) -> &[EffectRecord] {
        &self.pending_effects
    }

    /// The children that were quarantined.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.close();
    /// assert!(s.quiesce().await.quarantined_children().is_empty());
    /// # }
    /// ```
    pub fn quarantined_children(&self) -> &[ChildSpec] {
        &self.quarantined_children
    }

    /// Time from the cancel to the last receipt or guard release (`None` if not cancelled).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// let lease = s.tether(()).unwrap();
    /// s.cancel();
    /// tokio::time::sleep(Duration::from_millis(7)).await;
    /// drop(lease);
    /// assert_eq!(s.quiesce().await.cancel_to_quiet(), Some(Duration::from_millis(7)));
    /// # }
    /// ```
    pub fn cancel_to_quiet(&self) -> Option<Duration> {
        self.cancel_to_quiet
    }

    /// Orphan work: summed over children that ended after the cancel, how long each ran on.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{ChildSpec, Scope};
    /// let s = Scope::new();
    /// let a = s.register(ChildSpec::read_only("a")).unwrap().dispatch().unwrap();
    /// s.cancel();
    /// tokio::time::sleep(Duration::from_millis(20)).await;
    /// a.succeed(); // it ignored the cancel for 20 ms
    /// assert_eq!(s.quiesce().await.orphan_work(), Duration::from_millis(20));
    /// # }
    /// ```
    pub fn orphan_work(&self) -> Duration {
        self.orphan_work
    }

    /// The children of this scope and of the scopes below it that ended with an error that
    /// the report could list (tasks spawned with [`Scope::spawn_fallible`] that returned
    /// `Err`), oldest first: the newest 64 notes at most, as for
    /// [`retry_ledgers`](Report::retry_ledgers), the older ones counted in
    /// [`dropped_notes`](Report::dropped_notes). [`failed`](Report::failed) counts every
    /// `Failed` receipt, also those that carry no error to list (a panic, a ticket's
    /// [`fail`](crate::Dispatched::fail)).
    ///
    /// # Examples
    ///
    /// See [`Failure`].
    pub fn failures(&self) -> Vec<&Failure> {
        self.notes
            .iter()
            .filter_map(|n| n.get::<Failure>())
            .collect()
    }

    /// How many notes — the [retry ledgers](Report::retry_ledgers) and
    /// [failures](Report::failures) of this scope and the scopes below it — the scope
    /// dropped, oldest first, to keep the newest 64 (a long-lived scope keeps flat memory).
    /// The lists in this report miss that many; the receipt counts miss nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use cancel_scope::{retry::{Decision, Retry}, ChildSpec, Scope};
    /// let scope = Scope::new();
    /// let retry = Retry::new(|_: &()| Decision::Backoff);
    /// for _ in 0..70 {
    ///     retry.run(&scope, ChildSpec::read_only("db"), |_| async { Ok::<_, ()>(()) }).await.unwrap();
    /// }
    /// scope.close();
    /// let report = scope.quiesce().await;
    /// assert_eq!((report.retry_ledgers().len(), report.dropped_notes()), (64, 6));
    /// assert!(report.to_string().contains("6 older notes dropped"));
    /// # }
    /// ```
    pub fn dropped_notes(&self) -> u64 {
        self.dropped_notes
    }

    /// The notes attached to the scope, oldest first (read through typed accessors such as
    /// `Report::retry_ledgers`).
    pub(crate) fn notes(&self) -> &[Note] {
        &self.notes
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?}: {} succeeded, {} failed, {} cancelled, {} quarantined, {} effect unknown",
            self.state,
            self.succeeded(),
            self.failed(),
            self.cancelled(),
            self.quarantined(),
            self.effect_unknown()
        )?;
        if let Some(c) = &self.cause {
            write!(f, "; cause: {c}")?;
        }
        if let Some(d) = self.cancel_to_quiet {
            write!(
                f,
                "; cancel to quiet {d:?}, orphan work {:?}",
                self.orphan_work
            )?;
        }
        match self.dropped_notes {
            0 => {}
            1 => f.write_str("; 1 older note dropped (retry ledgers and failures)")?,
            n => write!(f, "; {n} older notes dropped (retry ledgers and failures)")?,
        }
        Ok(())
    }
}

/// Resolves to the [`Report`] once the scope is quiet. Returned by [`Scope::quiesce`].
///
/// # Cancel safety
///
/// Cancel safe: dropping it unregisters its waker; a new `quiesce()` picks up where it was.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use cancel_scope::Scope;
/// let s = Scope::new();
/// s.close();
/// let report = s.quiesce().await;
/// assert_eq!(report.total(), 0);
/// # }
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct Quiesce {
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

/// The fewest entries of `Quiesce::due` at which it is pruned.
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

impl Future for Quiesce {
    type Output = Report;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Report> {
        let this = &mut *self;
        let mut handed = Vec::new();
        if tree::poll_quiet(&this.scope.node, &mut this.key, cx.waker(), &mut handed) {
            this.stop_watching();
            return Poll::Ready(this.scope.report());
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
                    tree::quarantine_subtree(&d, &crate::child::task_spec(), now_stamp());
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
            return Poll::Ready(this.scope.report());
        }
        Poll::Pending
    }
}

impl Quiesce {
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
fn grace_end(node: &crate::scope::Core) -> Option<tokio::time::Instant> {
    sleepable_after(instant_of(node.cancelled_at()), node.ext.grace())
}

impl Drop for Quiesce {
    fn drop(&mut self) {
        tree::forget_waiter(&self.scope.node, Wait::Quiet, &mut self.key);
        self.stop_watching();
    }
}

impl fmt::Debug for Quiesce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quiesce")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl Scope {
    /// Waits for *stable quiescence* and reports it.
    ///
    /// Resolves once the watermark is closed (call [`close`](Scope::close) or cancel first),
    /// every registered child of the subtree has a receipt, every guard is released and every
    /// body run with [`run`](Scope::run) has stopped. After a cancel, children still running
    /// when the grace period ends are quarantined (receipt `Quarantined`, listed in the report,
    /// late outcome ignored). Each cancelled scope of the subtree counts its own
    /// [grace period](crate::ChildBuilder::grace) from its cancel, and the work below it is
    /// quarantined at the first such end above it: a child scope whose deadline passed, in a
    /// scope that is only closed, gets its own; a child with a shorter grace period than a
    /// cancelled parent gets its shorter one; a later cancel of a parent never lengthens it.
    /// A cancelled ancestor of this scope counts too: the work is quarantined at the
    /// ancestor's grace end if that comes first, as the ancestor's `quiesce` would (one
    /// already waiting learns of it when that cancel is the one that cancels this scope).
    /// (Each `quiesce` looks through the subtree once; a later cancel below is handed to it,
    /// and it looks through the subtree of that scope only.) Once it resolves nothing of this
    /// scope can start or commit, and the report never changes.
    ///
    /// A body waits for itself: awaited inside [`run`](Scope::run) of this scope (or of a
    /// descendant), inside a task spawned in it, or inside a retry attempt or fan-out branch
    /// whose scope it is (see [`Attempt::scope`](crate::retry::Attempt::scope)), `quiesce`
    /// resolves only once that body is stopped, by a cancel or the deadline. Work a body
    /// starts and must wait for goes into a child scope, whose `quiesce` it can await.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{Lifecycle, Scope};
    ///
    /// let s = Scope::new();
    /// for _ in 0..3 {
    ///     s.spawn(tokio::time::sleep(Duration::from_secs(60))).unwrap();
    /// }
    /// s.cancel();
    /// let report = s.quiesce().await;
    /// assert_eq!(report.state(), Lifecycle::CancelledStable);
    /// assert_eq!(report.cancelled(), 3);
    /// assert!(s.spawn(async {}).is_err()); // and nothing starts any more
    /// # }
    /// ```
    pub fn quiesce(&self) -> Quiesce {
        Quiesce {
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

    /// The scope's lifecycle state now.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{Lifecycle, Scope};
    /// let s = Scope::new();
    /// s.close();
    /// assert_eq!(s.lifecycle(), Lifecycle::Completed);
    /// ```
    pub fn lifecycle(&self) -> Lifecycle {
        let st = self.node.state();
        if st.is_quiet() {
            // Effects with no receipt of their own too: those a quarantined shield left open
            // (see `ShieldStop`).
            let needs = self.node.count(Kind::EffectUnknown) > 0
                || self.node.with_records(|r| unknown_in(r).next().is_some());
            if needs {
                Lifecycle::NeedsReconciliation
            } else if st.is_cancelled() {
                Lifecycle::CancelledStable
            } else {
                Lifecycle::Completed
            }
        } else if st.is_cancelled() {
            Lifecycle::Cancelling
        } else if st.is_started() {
            Lifecycle::Running
        } else {
            Lifecycle::Accepted
        }
    }

    /// Quarantines now every registered child of this scope's subtree that has no receipt yet,
    /// as [`quiesce`](Scope::quiesce) does when the grace period after a cancel ends; returns
    /// how many (a ticket never dispatched is ended `Cancelled` instead, and not counted). For
    /// the loom models, which have no timer to end a grace period.
    #[doc(hidden)]
    pub fn __quarantine_now(&self) -> usize {
        tree::quarantine_subtree(&self.node, &crate::child::task_spec(), now_stamp())
    }

    /// Whether the grace period after the cancel of this scope, or of a cancelled ancestor, has
    /// ended (the work below is quarantined by the next `quiesce`, if none did yet). Reads
    /// the clock only if one of them is cancelled.
    pub(crate) fn grace_ended(&self) -> bool {
        cancelled_grace_end(tree::ancestors(&*self.node))
            .is_some_and(|at| at <= tokio::time::Instant::now())
    }

    /// The children of this scope's subtree whose effect is unknown so far: `EffectUnknown`
    /// receipts and quarantined children that may have had an effect (what makes a quiet
    /// scope `NeedsReconciliation`).
    pub(crate) fn unknown_effects(&self) -> Vec<ChildSpec> {
        self.node.with_records(|r| unknown_in(r).cloned().collect())
    }

    /// Builds the report (meaningful once quiet: then nothing in it can change).
    pub(crate) fn report(&self) -> Report {
        let node = &self.node;
        let counts = [
            Kind::Succeeded,
            Kind::Failed,
            Kind::Cancelled,
            Kind::Quarantined,
            Kind::EffectUnknown,
        ]
        .map(|k| node.count(k));
        let (pending_effects, quarantined_children) = node.with_records(|r| {
            let records = unknown_in(r).filter_map(ChildSpec::effect_record);
            (one_per_effect(records), r.quarantined.clone())
        });
        let cause = self.cause();
        let (notes, dropped_notes) = self.notes();
        let cancel_to_quiet = cause.as_ref().map(|_| {
            let at = node.cancelled_at();
            nanos(node.last_stamp().saturating_sub(at))
        });
        Report {
            state: self.lifecycle(),
            cause,
            counts,
            pending_effects,
            quarantined_children,
            cancel_to_quiet,
            orphan_work: nanos(node.orphan_nanos()),
            notes,
            dropped_notes,
        }
    }
}

/// The children whose effect is unknown: `EffectUnknown` receipts, and quarantined children
/// that may have had an effect.
fn unknown_in(r: &tree::Records<ChildSpec>) -> impl Iterator<Item = &ChildSpec> {
    let quarantined = r.quarantined.iter();
    r.effects
        .iter()
        .chain(quarantined.filter(|c| c.effect().may_have_effect()))
}

/// One record per effect, in order of first appearance: a retry attempt and the transport
/// call inside it that both end `EffectUnknown` name the same effect, which is to be
/// reconciled once. What either record knows (digest, provider handle, status, redirect) is
/// kept. Records of one effect id that disagree (two provider handles, two payload digests, two
/// answered statuses) are each kept: merging them would drop what reconciliation needs.
fn one_per_effect<'a>(records: impl Iterator<Item = &'a EffectRecord>) -> Vec<EffectRecord> {
    let mut effects: Vec<EffectRecord> = Vec::new();
    let mut seen: std::collections::HashMap<&'a str, Vec<usize>> = std::collections::HashMap::new();
    for record in records {
        let same = seen.entry(record.effect_id()).or_default();
        match same.iter().find(|&&i| agree(&effects[i], record)) {
            Some(&i) => effects[i].absorb(record),
            None => {
                same.push(effects.len());
                effects.push(record.clone());
            }
        }
    }
    effects
}

/// Whether two records of one effect id can be the same effect: nothing one knows contradicts
/// the other (digest, provider handle, answered status, redirect).
fn agree(a: &EffectRecord, b: &EffectRecord) -> bool {
    a.details()
        .into_iter()
        .zip(b.details())
        .all(|(x, y)| x.is_none() || y.is_none() || x == y)
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
