//! Lifecycle and stable quiescence: a scope that can prove it has stopped.
//!
//! [`Scope::quiesce`] resolves once the scope's registration watermark is closed (by
//! [`Scope::close`] or a cancel), every registered child of its subtree has a terminal receipt
//! (or was quarantined after the grace period), and every guard was released. From then on
//! nothing of that scope can start or commit and no number in its [`Report`] changes
//! (invariant 6): new registrations are refused by the closed watermark, and a child scope can
//! only take work through a unit of this one.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::child::unknown_in;
use crate::scope::{Quiet, Scope};
use crate::tree::Kind;

mod report;

pub use report::Report;

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
    quiet: Quiet,
}

impl Future for Quiesce {
    type Output = Report;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Report> {
        std::task::ready!(Pin::new(&mut self.quiet).poll(cx));
        Poll::Ready(self.quiet.scope().report())
    }
}

impl fmt::Debug for Quiesce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quiesce")
            .field("scope", self.quiet.scope())
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
            quiet: self.quiet(),
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
    #[cfg(any(test, feature = "__test-hooks"))]
    pub fn __quarantine_now(&self) -> usize {
        use crate::{spec::task_spec, time::now_stamp, tree};
        tree::quarantine_subtree(&self.node, &task_spec(), now_stamp())
    }
}
