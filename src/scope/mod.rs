//! The public [`Scope`] handle: roots, children, deadlines, cancel, and the current scope.
//!
//! `Scope` is a thin handle over a tree node ([`Core`]). This file has the methods the scope
//! layer implements; the rest of the folder is the machinery behind them:
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Scope`] and its methods: cancel, children, deadline, `run`, the current scope |
//! | `ext.rs` | what a node keeps ([`ScopeExt`]): deadline, name, what it shares with its parent |
//! | `deadline.rs` | roots, child handles, arming a deadline timer, expiring a passed deadline |
//! | `current.rs` | the thread-local current scope |
//! | `note.rs` | values the layers above attach for the report (retry ledgers, failures) |
//! | `builder.rs` | [`ChildBuilder`] |
//! | `future.rs` | [`Cancelled`], [`Run`], [`OnCancel`] |
//! | `timer.rs` | the deadline timers |
//! | `quiet.rs` | the wait for quiet, with the grace periods and the quarantine at their end |
//!
//! The layers above add the methods of their own concern, in their own folders, so that this
//! layer imports none of them: `register` (`child/ticket.rs`), `spawn`, `spawn_fallible`,
//! `spawn_blocking` (`child/task.rs`), `shield` and `detach` (`child/shield.rs`), `acquire` and
//! `tether` (`guard`), `quiesce` and `lifecycle` (`quiesce`), `operation` (`wire/operation.rs`).

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::cause::Cause;
use crate::spec::ChildSpec;
use crate::sync::{Arc, Ordering};
use crate::time::now_stamp;
use crate::tree::{self, Node};

mod builder;
mod carry;
mod current;
mod deadline;
mod effect;
mod ext;
mod future;
mod note;
mod quiet;
mod request;
mod shadow;
#[cfg(feature = "stream")]
mod stream;
mod timer;
#[cfg(feature = "tokio-util")]
mod token;

pub use builder::ChildBuilder;
pub use carry::{Carried, CarryScope};
pub(crate) use current::with_current;
pub(crate) use effect::EffectFlag;
pub(crate) use ext::{unshadowed, Context, RequestContext, ScopeExt};
pub use future::{Cancelled, OnCancel, Run};
pub(crate) use note::Note;
pub(crate) use quiet::Quiet;
pub use shadow::WouldBe;
#[cfg(feature = "stream")]
pub use stream::RunStream;
pub(crate) use timer::Timers;

use current::swap_current;
use ext::{name_of, Shared, ARMED};

/// The tree node behind a [`Scope`].
pub(crate) type Core = Node<ScopeExt, ChildSpec>;

/// How long [`Scope::quiesce`](crate::Scope::quiesce) waits after a cancel before it
/// quarantines children that have not stopped.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(1);

/// The budget to give a [`shield`](crate::Scope::shield)ed cleanup when there is no better
/// figure: half of [`DEFAULT_GRACE`], so that with the defaults a cleanup shielded as its
/// scope is cancelled, stopped by its own deadline at its next `.await`, ends with its own
/// receipt (its effects cut off listed as `EffectUnknown`) before the grace period ends and
/// the quarantine would cut it.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use cancel_scope::{ChildSpec, Scope, DEFAULT_CLEANUP_BUDGET, DEFAULT_GRACE};
/// assert!(DEFAULT_CLEANUP_BUDGET < DEFAULT_GRACE);
/// let s = Scope::new();
/// let request = s.register(ChildSpec::read_only("request")).unwrap();
/// s.cancel();
/// let cleanup = s.shield(DEFAULT_CLEANUP_BUDGET, std::future::pending::<()>()).unwrap();
/// drop(request);
/// assert!(cleanup.await.unwrap_err().is_deadline_exceeded()); // its own budget, not the quarantine
/// assert_eq!(s.quiesce().await.quarantined(), 0);
/// # }
/// ```
pub const DEFAULT_CLEANUP_BUDGET: Duration = Duration::from_millis(500);

/// A node of the cancellation tree: a deadline, a cancel cause, and the work registered under
/// it.
///
/// A `Scope` is a cheap handle (clone it freely); every clone refers to the same node. Roots come
/// from [`Scope::new`], [`Scope::with_timeout`] and [`Scope::with_deadline`] (or from admitting
/// an incoming request); children from [`Scope::child`].
///
/// * **Budgets only shrink.** A child's deadline is never later than its parent's.
/// * **Cancel flows down.** Cancelling a scope cancels every descendant with
///   [`Cause::ParentCancelled`] (except one that already completed: see [`Scope::cancel`]);
///   it never touches the parent or siblings. The first cause wins.
/// * **Deadlines fire by themselves.** When a deadline passes the scope and its descendants are
///   cancelled with [`Cause::DeadlineExceeded`], whether or not anything polls them.
/// * **No new work after cancel.** Children, tasks and tickets are refused once the scope is
///   cancelled or closed.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::Scope;
///
/// let request = Scope::with_timeout(Duration::from_millis(1000));
/// let db = request
///     .child()
///     .reserve(Duration::from_millis(100)) // keep 100 ms to answer
///     .cap(Duration::from_millis(300))     // the database never gets more than 300 ms
///     .build()
///     .unwrap();
/// assert_eq!(db.remaining(), Some(Duration::from_millis(300)));
///
/// // Work that outlives the budget is stopped, and says why.
/// let err = db.run(tokio::time::sleep(Duration::from_secs(5))).await.unwrap_err();
/// assert!(err.is_deadline_exceeded());
/// assert!(!request.is_cancelled());
/// # }
/// ```
pub struct Scope {
    pub(crate) node: Arc<Core>,
}

impl Scope {
    /// A root scope without a deadline; it ends only when cancelled.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// assert_eq!(s.deadline(), None);
    /// assert!(!s.is_cancelled());
    /// ```
    pub fn new() -> Scope {
        Scope::root(None, None)
    }

    /// A root scope that is cancelled with [`Cause::DeadlineExceeded`] after `timeout`.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime or in one without a timer (the deadline needs tokio's timer),
    /// unless `timeout` is zero.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::Scope;
    /// let s = Scope::with_timeout(Duration::from_millis(50));
    /// s.cancelled().await;
    /// assert!(s.cause().unwrap().is_deadline_exceeded());
    /// # }
    /// ```
    #[track_caller]
    pub fn with_timeout(timeout: Duration) -> Scope {
        Scope::root_after(Instant::now(), timeout, None, None, None)
    }

    /// A root scope that is cancelled with [`Cause::DeadlineExceeded`] at `deadline`.
    ///
    /// A deadline already in the past gives a scope that is cancelled at once.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime or in one without a timer, unless `deadline` has already passed.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use cancel_scope::Scope;
    /// let at = Instant::now() + Duration::from_secs(1);
    /// let s = Scope::with_deadline(at);
    /// assert_eq!(s.deadline(), Some(at));
    /// # }
    /// ```
    #[track_caller]
    pub fn with_deadline(deadline: Instant) -> Scope {
        Scope::root(Some(deadline), None)
    }

    /// Starts building a child scope (see [`ChildBuilder`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Scope;
    /// let parent = Scope::new();
    /// let child = parent.child().name("fetch-user").build().unwrap();
    /// parent.cancel();
    /// assert!(child.is_cancelled());
    /// ```
    #[inline]
    pub fn child(&self) -> ChildBuilder<'_> {
        ChildBuilder::new(self)
    }

    /// The deadline, if any (inherited from the parent or tightened).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Scope;
    /// assert!(Scope::new().deadline().is_none());
    /// ```
    pub fn deadline(&self) -> Option<Instant> {
        self.node.ext.deadline
    }

    /// Time left until the deadline (`None` without one; zero once it has passed).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::Scope;
    /// let s = Scope::with_timeout(Duration::from_millis(100));
    /// tokio::time::sleep(Duration::from_millis(30)).await;
    /// assert_eq!(s.remaining(), Some(Duration::from_millis(70)));
    /// # }
    /// ```
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline()
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// The scope's name, if it was given one.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// assert_eq!(s.child().name("db").build().unwrap().name(), Some("db"));
    /// ```
    pub fn name(&self) -> Option<&str> {
        name_of(&self.node)
    }

    /// Cancels this scope and every descendant with [`Cause::Cancelled`] (no reason).
    ///
    /// Idempotent: the first cause wins. Returns once every descendant is cancelled, so no work
    /// of this subtree can be dispatched after `cancel` returns.
    ///
    /// A scope that has already completed ([`close`](Scope::close)d and quiet:
    /// [`Lifecycle::Completed`](crate::Lifecycle::Completed), a final state) has nothing left
    /// to stop: cancelling it, or its deadline passing, leaves it and its report as they are.
    /// That holds for a descendant too: a closed child that is already quiet is out of a later
    /// cancel's reach. It (and its subtree, quiet as well) is not cancelled, has no
    /// [`cause`](Scope::cause) and keeps reporting `Completed`; it refuses new work all the
    /// same, being closed. A closed child that still has work is cancelled as any other.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{Lifecycle, Scope};
    /// let s = Scope::new();
    /// let done = s.child().build().unwrap();
    /// done.close(); // no work: quiet, it has completed
    /// s.cancel();
    /// s.cancel_with("too late"); // no effect: first cause wins
    /// assert_eq!(s.cause().unwrap().reason(), None);
    /// assert!(!done.is_cancelled()); // out of the cancel's reach
    /// assert_eq!(done.lifecycle(), Lifecycle::Completed);
    /// ```
    pub fn cancel(&self) {
        self.cancel_because(Cause::Cancelled { reason: None });
    }

    /// Cancels with a reason (see [`Scope::cancel`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.cancel_with("user pressed stop");
    /// assert_eq!(s.cause().unwrap().reason(), Some("user pressed stop"));
    /// ```
    pub fn cancel_with(&self, reason: impl Into<std::sync::Arc<str>>) {
        self.cancel_because(Cause::cancelled(reason));
    }

    /// Cancels with any cause, e.g. [`Cause::ClientGone`] from a server that saw its client
    /// disconnect. Returns `true` if this call cancelled the scope (`false`: it already was,
    /// or it had already completed — see [`Scope::cancel`]).
    ///
    /// A [`Cause::ParentCancelled`] passed here is recorded as it is.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{Cause, Scope};
    /// let s = Scope::new();
    /// assert!(s.cancel_because(Cause::ClientGone));
    /// assert!(!s.cancel_because(Cause::DeadlineExceeded));
    /// assert_eq!(s.cause(), Some(Cause::ClientGone));
    /// ```
    pub fn cancel_because(&self, cause: Cause) -> bool {
        deadline::cancel_node(&self.node, cause, now_stamp())
    }

    /// Whether the scope is cancelled: one atomic load.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// assert!(!s.is_cancelled());
    /// s.cancel();
    /// assert!(s.is_cancelled());
    /// ```
    #[inline]
    pub fn is_cancelled(&self) -> bool {
        self.node.state().is_cancelled()
    }

    /// The cause of a scope seen cancelled: `Cancelled` without a reason if the cause is not
    /// visible yet (a cancel in progress).
    pub(crate) fn cause_or_cancelled(&self) -> Cause {
        self.cause().unwrap_or(Cause::Cancelled { reason: None })
    }

    /// Why the scope was cancelled (`None` while it is not).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{Cause, Scope};
    /// let s = Scope::new();
    /// assert_eq!(s.cause(), None);
    /// s.cancel_because(Cause::ClientGone);
    /// assert_eq!(s.cause(), Some(Cause::ClientGone));
    /// ```
    pub fn cause(&self) -> Option<Cause> {
        self.node.cause()
    }

    /// The scope's generation: bumped by the cancel, in the same atomic step that closes the
    /// registration watermark. Tickets remember the generation they were registered in and
    /// cannot be dispatched in another.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// let g = s.generation();
    /// s.cancel();
    /// assert_eq!(s.generation(), g + 1);
    /// ```
    pub fn generation(&self) -> u64 {
        self.node.state().generation()
    }

    /// Closes the registration watermark of this scope and its descendants without cancelling:
    /// running work goes on, new work (children, tasks, tickets, guards) is refused, and so is
    /// a body to [`run`](Scope::run) once the scope has no work left. This is how a scope
    /// completes normally before [`quiesce`](Scope::quiesce).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.close();
    /// assert!(!s.is_cancelled());
    /// assert!(s.child().build().unwrap_err().is_closed());
    /// ```
    pub fn close(&self) {
        tree::close(&self.node);
    }

    /// Whether the registration watermark is closed (by [`close`](Scope::close) or a cancel).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.cancel();
    /// assert!(s.is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        self.node.state().is_closed()
    }

    /// A future that completes when the scope is cancelled.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if it is dropped (e.g. another `select!` branch won) it leaves nothing
    /// registered, and a new call observes the same cancel.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// let waiter = tokio::spawn({
    ///     let s = s.clone();
    ///     async move { s.cancelled().await; s.cause() }
    /// });
    /// s.cancel_with("done");
    /// assert_eq!(waiter.await.unwrap().unwrap().reason(), Some("done"));
    /// # }
    /// ```
    pub fn cancelled(&self) -> Cancelled {
        Cancelled::new(self.clone())
    }

    /// Runs `f` once when the scope is cancelled (at once if it already is), like Go's
    /// `context.AfterFunc`. `f` runs on the thread that cancels, after every lock is released;
    /// keep it short and spawn if it needs to do async work.
    ///
    /// Dropping the returned guard unregisters `f` (if it has not run); [`OnCancel::stop`]
    /// does the same and says whether `f` was stopped before it ran.
    ///
    /// # Panics
    ///
    /// A panic of `f` comes out of the call that ran it, once that call has done its work:
    /// the cancel (the whole subtree is cancelled and every other callback has run), or a
    /// [`quiesce`](Scope::quiesce) whose grace period ended first reaching this scope (its
    /// quarantine is done); the timer that cancels at a deadline drops it, and so does the
    /// quarantine of a [`shield`](Scope::shield) that cancels the shield's own scope.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use std::sync::Arc;
    /// use cancel_scope::Scope;
    ///
    /// let s = Scope::new();
    /// let ran = Arc::new(AtomicBool::new(false));
    /// let flag = ran.clone();
    /// let guard = s.on_cancel(move |cause| {
    ///     assert_eq!(cause.reason(), Some("stop"));
    ///     flag.store(true, Ordering::SeqCst);
    /// });
    /// s.cancel_with("stop");
    /// assert!(ran.load(Ordering::SeqCst));
    /// assert!(!guard.stop()); // it already ran
    /// ```
    pub fn on_cancel<F>(&self, f: F) -> OnCancel
    where
        F: FnOnce(&Cause) + Send + 'static,
    {
        let key = tree::on_cancel(&self.node, Box::new(f));
        OnCancel::new(self.clone(), key)
    }

    /// Runs `fut` with this scope as [`Scope::current`], stopping it when the scope is
    /// cancelled.
    ///
    /// Returns `Err` with the cause if the scope is cancelled first (or already was: then `fut`
    /// is not polled at all). Dropping `fut` is how it is stopped, at its next `.await`.
    ///
    /// `fut` is the scope's *body*, and work of the scope, as the body of a Trio cancel scope
    /// is: from this call until it has stopped (finished, stopped by the cancel, or dropped
    /// with the returned future) the scope is not quiet. So a body that
    /// [`close`](Scope::close)s its scope and goes on is still stopped by a later cancel of an
    /// ancestor or by the deadline, and once [`quiesce`](Scope::quiesce) has resolved no body
    /// runs any more. Consequently:
    ///
    /// * a scope that is cancelled, or closed and quiet, when `run` is called refuses the body:
    ///   the future yields the cancel (or [`Error::is_closed`](crate::Error::is_closed))
    ///   without polling it. A deadline that has passed is the cancel, even before its timer
    ///   has fired (as for [`spawn`](Scope::spawn)). A closed scope that still has work (a
    ///   task spawned before the close, a body) accepts a body made by that work: it is part
    ///   of work the scope already has;
    /// * as a guard, a body is waited for, not quarantined: a `Run` kept but no longer polled
    ///   keeps its scope from quiet until it is dropped;
    /// * a body must not await its own scope's `quiesce` (it would wait for itself until a
    ///   cancel or the deadline stops it): work it must wait for goes into a child scope.
    ///
    /// # Cancel safety
    ///
    /// As cancel safe as `fut`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::Scope;
    ///
    /// let s = Scope::with_timeout(Duration::from_millis(100));
    /// let v = s.run(async { Scope::current().remaining() }).await.unwrap();
    /// assert_eq!(v, Some(Duration::from_millis(100)));
    ///
    /// // A body that closed its scope is still stopped by the deadline.
    /// let body = s.run(async {
    ///     Scope::current().close();
    ///     tokio::time::sleep(Duration::from_secs(60)).await;
    /// });
    /// assert!(body.await.unwrap_err().is_deadline_exceeded());
    /// // And a closed scope takes no new body.
    /// assert!(s.run(async {}).await.unwrap_err().is_cancelled());
    /// # }
    /// ```
    pub fn run<F: Future>(&self, fut: F) -> Run<F> {
        Run::new(self.clone(), fut)
    }

    /// The scope of the running task, set by [`Scope::run`], [`Scope::spawn`] and the
    /// server layers.
    ///
    /// # Panics
    ///
    /// If no scope is current; see [`Scope::try_current`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.run(async {
    ///     let child = Scope::current().child().build().unwrap();
    ///     assert!(!child.is_cancelled());
    /// }).await.unwrap();
    /// # }
    /// ```
    #[track_caller]
    pub fn current() -> Scope {
        match Scope::try_current() {
            Some(s) => s,
            None => panic!("no current scope: run this code inside Scope::run or Scope::spawn"),
        }
    }

    /// The scope of the running task, if there is one.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Scope;
    /// assert!(Scope::try_current().is_none());
    /// ```
    pub fn try_current() -> Option<Scope> {
        let current = swap_current(None);
        let scope = current.clone();
        swap_current(current);
        scope
    }

    /// Waits for the cancel and returns its cause.
    pub(crate) async fn cancelled_cause(&self) -> Cause {
        let mut c = self.cancelled();
        std::future::poll_fn(|cx| c.poll_cancelled(cx)).await
    }

    /// The request-wide context of this scope's root, if it was given one.
    pub(crate) fn context(&self) -> Option<&Context> {
        self.node.ext.shared().context.as_ref()
    }

    /// Runs `f` with this scope current (synchronous code: a tower service's `call`).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn sync_scope<R>(&self, f: impl FnOnce() -> R) -> R {
        with_current(&mut Some(self.clone()), f)
    }

    /// Whether this scope or an ancestor carries `key` (a retry attempt marks its scope with
    /// its dependency, see `ChildBuilder::attempt`). Walks up the tree: marks are rare, and a
    /// scope keeps its own only (no allocation per mark).
    pub(crate) fn has_mark(&self, key: &str) -> bool {
        tree::ancestors(&*self.node).any(|node| node.ext.marked && name_of(node) == Some(key))
    }

    /// Whether this scope is `other` or one of its descendants. Walks up the tree (a client
    /// layer given two scopes asks it once per call, to take the more specific one).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn is_within(&self, other: &Scope) -> bool {
        tree::ancestors(&*self.node).any(|node| std::ptr::eq(node, &*other.node))
    }

    /// Number of live child scopes (for memory tests).
    #[doc(hidden)]
    #[cfg(any(test, feature = "__test-hooks"))]
    pub fn __live_children(&self) -> usize {
        self.node.child_count()
    }

    /// Number of entries in this scope's tree's deadline timers, live and dead (for memory
    /// tests: dead entries are dropped lazily, see `scope::timer`).
    #[doc(hidden)]
    #[cfg(any(test, feature = "__test-hooks"))]
    pub fn __timer_entries(&self) -> usize {
        self.node.ext.timers().map_or(0, |t| t.entries())
    }

    /// A probe that tells whether this scope's node has been freed (for memory tests: no
    /// reference cycle keeps a finished tree alive).
    #[doc(hidden)]
    #[cfg(not(loom))]
    #[cfg(any(test, feature = "__test-hooks"))]
    pub fn __freed_probe(&self) -> impl Fn() -> bool + Send + Sync + 'static {
        let node = Arc::downgrade(&self.node);
        move || node.strong_count() == 0
    }
}

impl Default for Scope {
    fn default() -> Self {
        Scope::new()
    }
}

impl Clone for Scope {
    fn clone(&self) -> Self {
        tree::add_handle(&self.node);
        Scope {
            node: self.node.clone(),
        }
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        // A node is gone once neither handles nor children are left; until then its timer
        // stays armed, because children that inherit its deadline rely on it. Its entry is
        // not taken out: it dies with the node (see `timer`).
        tree::drop_handle(&self.node, |node| {
            let armed = node.ext.timer.load(Ordering::Relaxed) & ARMED != 0;
            if let Some(timers) = node.ext.timers().filter(|_| armed) {
                timers.count_gone();
            }
            if node.ext.own_would_be {
                shadow::child_retired(node);
            }
        });
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.node.state();
        f.debug_struct("Scope")
            .field("name", &self.name())
            .field("deadline", &self.deadline())
            .field("cancelled", &st.is_cancelled())
            .field("closed", &st.is_closed())
            .field("generation", &st.generation())
            .field("active", &st.active())
            .finish()
    }
}

impl Scope {
    /// The scope's name (see `name_of`) as a shared string, for a new root that keeps it
    /// (`detach`, `shield`).
    pub(crate) fn shared_name(&self) -> Option<std::sync::Arc<str>> {
        let node = &self.node;
        node.ext
            .name
            .clone()
            .or_else(|| tree::own_info(node).map(ChildSpec::shared_name))
    }
}
