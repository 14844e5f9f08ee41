//! The futures and guards of a scope.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::{with_current, Scope};
use crate::cause::Cause;
use crate::error::Error;
use crate::time::now_stamp;
use crate::tree::{self, Wait, WaiterKey};

/// Completes when its scope is cancelled. Returned by [`Scope::cancelled`].
///
/// # Cancel safety
///
/// Cancel safe: dropping it unregisters its waker.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use cancel_scope::Scope;
/// let s = Scope::new();
/// s.cancel();
/// s.cancelled().await; // already cancelled: ready at once
/// # }
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct Cancelled {
    scope: Scope,
    key: WaiterKey,
}

impl Cancelled {
    pub(super) fn new(scope: Scope) -> Self {
        Cancelled {
            scope,
            key: WaiterKey::default(),
        }
    }

    /// Polls without a `Pin` (the future is `Unpin`), for use inside other futures.
    pub(crate) fn poll_cancelled(&mut self, cx: &mut Context<'_>) -> Poll<Cause> {
        if tree::poll_cancelled(&self.scope.node, &mut self.key, cx.waker()) {
            Poll::Ready(self.scope.cause_or_cancelled())
        } else {
            Poll::Pending
        }
    }
}

impl Future for Cancelled {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.get_mut().poll_cancelled(cx).map(|_| ())
    }
}

impl Drop for Cancelled {
    fn drop(&mut self) {
        tree::forget_waiter(&self.scope.node, Wait::Cancel, &mut self.key);
    }
}

impl fmt::Debug for Cancelled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cancelled")
            .field("scope", &self.scope)
            .finish()
    }
}

pin_project! {
    /// Runs a future with a scope current, stopping it on cancel. Returned by [`Scope::run`].
    ///
    /// The future is the scope's body and holds it from quiet until it has stopped: see
    /// [`Scope::run`].
    ///
    /// # Cancel safety
    ///
    /// As cancel safe as the inner future.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// assert_eq!(s.run(async { 7 }).await.unwrap(), 7);
    /// s.cancel();
    /// assert!(s.run(async { 7 }).await.unwrap_err().is_cancelled());
    /// # }
    /// ```
    #[must_use = "futures do nothing unless polled"]
    pub struct Run<F: Future> {
        // The work; `None` once it has stopped (finished, stopped by the cancel, dropped).
        #[pin]
        fut: Option<F>,
        // The scope's handle: in the current-scope slot while the work is polled or dropped,
        // here otherwise.
        scope: Option<Scope>,
        // Its entry in the scope's cancel waiters, once a poll of the work was pending.
        key: WaiterKey,
        // What the run holds of its scope.
        hold: Hold,
    }

    impl<F: Future> PinnedDrop for Run<F> {
        fn drop(this: Pin<&mut Self>) {
            this.stop(None);
        }
    }
}

/// What a [`Run`] (or a [`RunStream`](super::RunStream)) holds of its scope.
#[derive(Debug)]
pub(super) enum Hold {
    /// A unit: the body is work of the scope, which is not quiet until the body has stopped.
    Unit,
    /// Nothing: the scope (or an ancestor, on the way up) refused the body when the run was
    /// made (cancelled, or closed and quiet), for this reason.
    Refused(tree::Refused),
    /// Nothing of its own: the run of an own ticket (the ticket is the unit), or the unit was
    /// given back.
    Nothing,
}

impl Hold {
    /// A unit of `scope` for a body, or why the scope refuses one (see [`Scope::run`]).
    #[inline(always)]
    pub(super) fn take(scope: &Scope) -> Hold {
        // Refused as `spawn` and `dispatch` refuse their work once the deadline has passed.
        scope.expire_if_passed();
        match tree::take_unit_while_busy(&scope.node, true) {
            Ok(_) => Hold::Unit,
            Err(refused) => Hold::Refused(refused),
        }
    }
}

impl<F: Future> Run<F> {
    /// A body of `scope`: takes a unit of it (see [`Scope::run`] for when it is refused).
    #[inline(always)]
    pub(super) fn new(scope: Scope, fut: F) -> Self {
        let hold = Hold::take(&scope);
        Run::with_hold(scope, fut, hold)
    }

    /// A body whose unit is held elsewhere: the run of an own ticket (see `child::OwnRun`),
    /// whose ticket is its scope's first unit, taken when it was built.
    #[inline(always)]
    pub(crate) fn unheld(scope: Scope, fut: F) -> Self {
        Run::with_hold(scope, fut, Hold::Nothing)
    }

    #[inline(always)]
    fn with_hold(scope: Scope, fut: F, hold: Hold) -> Self {
        Run {
            fut: Some(fut),
            scope: Some(scope),
            key: WaiterKey::default(),
            hold,
        }
    }

    /// Stops the body: leaves the cancel waiters, drops the work with the scope current (as it
    /// ran), and only then gives back the run's unit, so that a scope seen quiet has no body
    /// left that could still commit anything (invariant 6). `own`: also takes the scope's
    /// handle and gives it to `own`, which records the default receipt of the own ticket whose
    /// scope this is (see `child::OwnRun`); otherwise the handle stays.
    ///
    /// What the run holds is given back also if dropping the work panics: the work is gone
    /// then too, and a unit (or an own ticket) kept would keep the scope (or its parent) from
    /// quiet for good, out of reach of a quarantine (invariant 5).
    pub(crate) fn stop(self: Pin<&mut Self>, own: Option<fn(Scope)>) {
        let this = self.project();
        stop_body(this.scope, this.key, this.hold, own, this.fut);
    }

    /// The poll of [`Run`] (always inlined into [`OwnRun`](crate::child::OwnRun)'s too: an output
    /// returned through memory would be copied there right after it was written, a store-forwarding
    /// stall per attempt). Once it is ready, the body has stopped.
    #[inline(always)]
    pub(crate) fn poll_work(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<F::Output, Error>> {
        let out = self.as_mut().poll_body(cx);
        if out.is_ready() {
            self.stop(None);
        }
        out
    }

    /// Takes the scope's handle out of a run whose work has stopped (`None` once taken).
    pub(crate) fn take_scope(self: Pin<&mut Self>) -> Option<Scope> {
        self.project().scope.take()
    }

    #[inline(always)]
    fn poll_body(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<F::Output, Error>> {
        let this = self.project();
        let Some(scope) = this.scope.as_ref() else {
            panic!("`Run` polled after it completed");
        };
        if let Hold::Refused(refused) = this.hold {
            // Refused (the scope cancelled, or closed with no work left): never polled.
            return Poll::Ready(Err(Error::from(refused.clone())));
        }
        // A cancelled scope never polls its work again (invariant 2): one load decides.
        if scope.is_cancelled() {
            return Poll::Ready(Err(Error::cancelled(scope.cause_or_cancelled())));
        }
        let Some(fut) = this.fut.as_pin_mut() else {
            panic!("`Run` polled after it completed");
        };
        if let Poll::Ready(out) = with_current(this.scope, || fut.poll(cx)) {
            return Poll::Ready(Ok(out));
        }
        let Some(scope) = this.scope.as_ref() else {
            unreachable!("the scope is back after every poll");
        };
        // Pending: only now register for the cancel (work that finishes on its first poll
        // never touches the waiter list). A cancel that came meanwhile is seen here.
        if tree::poll_cancelled(&scope.node, this.key, cx.waker()) {
            Poll::Ready(Err(Error::cancelled(scope.cause_or_cancelled())))
        } else {
            Poll::Pending
        }
    }
}

impl<F: Future> Future for Run<F> {
    type Output = Result<F::Output, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.poll_work(cx)
    }
}

/// [`Run::stop`] (and the end of a [`RunStream`](super::RunStream)), on the parts of the body:
/// `work` is dropped with `scope` current, after it left the cancel waiters under `key` and
/// before what `hold` holds is given back.
#[inline(always)]
pub(super) fn stop_body<W>(
    scope: &mut Option<Scope>,
    key: &mut WaiterKey,
    hold: &mut Hold,
    own: Option<fn(Scope)>,
    mut work: Pin<&mut Option<W>>,
) {
    let Some(s) = scope.as_ref() else {
        return;
    };
    tree::forget_waiter(&s.node, Wait::Cancel, key);
    let back = GiveBack { scope, hold, own };
    if work.is_some() {
        with_current(&mut *back.scope, || work.set(None));
    }
    drop(back);
}

/// What a stopping [`Run`] gives back once its work is dropped (see [`Run::stop`]), in a drop
/// of its own so that a panic of the work's drop gives it back too.
struct GiveBack<'a> {
    scope: &'a mut Option<Scope>,
    hold: &'a mut Hold,
    own: Option<fn(Scope)>,
}

impl Drop for GiveBack<'_> {
    fn drop(&mut self) {
        if matches!(self.hold, Hold::Unit) {
            *self.hold = Hold::Nothing;
            if let Some(scope) = self.scope.as_ref() {
                tree::release_guard(&scope.node, now_stamp);
            }
        }
        if let Some(own) = self.own {
            if let Some(scope) = self.scope.take() {
                own(scope);
            }
        }
    }
}

impl<F: Future> fmt::Debug for Run<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// A callback registered with [`Scope::on_cancel`]. Dropping it unregisters the callback.
///
/// # Examples
///
/// ```
/// use cancel_scope::Scope;
/// let s = Scope::new();
/// let g = s.on_cancel(|_| unreachable!("stopped before the cancel"));
/// assert!(g.stop());
/// s.cancel();
/// ```
#[must_use = "dropping the guard unregisters the callback"]
pub struct OnCancel {
    scope: Scope,
    key: Option<usize>,
}

impl OnCancel {
    pub(super) fn new(scope: Scope, key: Option<usize>) -> Self {
        OnCancel { scope, key }
    }

    /// Unregisters the callback. Returns `true` if this stopped it from running, `false` if it
    /// already ran (or is running).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.cancel();
    /// let g = s.on_cancel(|_| {}); // runs at once: the scope is cancelled
    /// assert!(!g.stop());
    /// ```
    pub fn stop(mut self) -> bool {
        self.key
            .take()
            .is_some_and(|k| tree::stop_callback(&self.scope.node, k))
    }
}

impl Drop for OnCancel {
    fn drop(&mut self) {
        if let Some(k) = self.key.take() {
            tree::stop_callback(&self.scope.node, k);
        }
    }
}

impl fmt::Debug for OnCancel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OnCancel")
            .field("registered", &self.key.is_some())
            .finish()
    }
}
