//! A child scope that is itself a dispatched child of its parent (a retry attempt, a fan-out
//! branch): its receipt side, [`OwnTicket`], and the run of its body on the ticket's handle,
//! [`OwnRun`].

// `OwnTicket` is public for the loom models and the crate's tests only (`__OwnTicket`, feature
// `__test-hooks`); without that feature nothing outside the crate reaches it.
#![cfg_attr(not(feature = "__test-hooks"), allow(unreachable_pub))]

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::receipt::Receipt;
use crate::error::Error;
use crate::scope::{Run, Scope};
use crate::spec::ChildSpec;
use crate::time::now_stamp;
use crate::tree;

impl Scope {
    /// A child scope that is also a dispatched child of this scope, described by `spec` (one
    /// node instead of a child scope and a ticket), as the retry layer and fan-out start their
    /// attempts and branches; for the loom models.
    #[doc(hidden)]
    #[cfg(any(test, feature = "__test-hooks"))]
    pub fn __child_dispatched(&self, spec: &ChildSpec) -> Result<(Scope, OwnTicket), Error> {
        let child = self.child().build_dispatched(spec)?;
        Ok((child.clone(), OwnTicket::new(child)))
    }
}

/// The receipt side of a child scope that is itself a dispatched child of its parent (made by
/// `ChildBuilder::build_dispatched`: a retry attempt), in place of a [`Dispatched`].
///
/// It holds a handle of the child, which keeps the child linked in its parent (where the
/// parent's quarantine finds it) until the receipt. Dropping it without a receipt records the
/// one a dropped [`Dispatched`] records.
///
/// Public but hidden only for the loom models (see [`Scope::__child_dispatched`]).
#[doc(hidden)]
#[must_use = "an own ticket that is dropped records Cancelled or EffectUnknown"]
pub struct OwnTicket {
    /// `None` once the receipt is recorded, or while [`run`](Self::run) holds the handle.
    scope: Option<Scope>,
}

impl OwnTicket {
    /// The ticket of `scope`, which `build_dispatched` made.
    pub(crate) fn new(scope: Scope) -> OwnTicket {
        debug_assert!(
            tree::own_info(&scope.node).is_some(),
            "not built dispatched"
        );
        OwnTicket { scope: Some(scope) }
    }

    /// The child scope this is the ticket of.
    pub(crate) fn scope(&self) -> &Scope {
        let Some(scope) = &self.scope else {
            unreachable!("an own ticket keeps its scope until its receipt");
        };
        scope
    }

    /// What was dispatched.
    pub(crate) fn spec(&self) -> &ChildSpec {
        own_spec(self.scope())
    }

    /// Runs `fut` in the ticket's scope, as [`Scope::run`] does, on the ticket's own handle:
    /// the future yields the ticket back with the outcome (its work already dropped, so that
    /// it stopped before its receipt), and dropping the future before that records the
    /// ticket's default receipt after dropping the work.
    #[inline(always)]
    pub fn run<F: std::future::Future>(mut self, fut: F) -> OwnRun<F> {
        let Some(scope) = self.scope.take() else {
            unreachable!("an own ticket keeps its scope until its receipt");
        };
        OwnRun::new(scope, fut)
    }

    /// Whether the ticket still waits for its receipt (not taken by [`take`](Self::take)).
    pub(crate) fn is_pending(&self) -> bool {
        self.scope.is_some()
    }

    /// Takes the ticket out, leaving one that has nothing to record (its drop does nothing).
    #[inline(always)]
    pub(crate) fn take(&mut self) -> OwnTicket {
        OwnTicket {
            scope: self.scope.take(),
        }
    }

    /// Records [`Receipt::Succeeded`].
    pub fn succeed(self) {
        self.finish(Receipt::Succeeded);
    }

    /// Records [`Receipt::Failed`].
    pub fn fail(self) {
        self.finish(Receipt::Failed);
    }

    /// Records `receipt` unless a quarantine got there first (invariant 5).
    pub fn finish(mut self, receipt: Receipt) {
        if let Some(scope) = self.scope.take() {
            record_own(&scope, &receipt);
        }
    }
}

/// What `scope`, made by `build_dispatched`, was dispatched as.
fn own_spec(scope: &Scope) -> &ChildSpec {
    let Some(spec) = tree::own_info(&scope.node) else {
        unreachable!("an own ticket's scope was built dispatched");
    };
    spec
}

/// Records the receipt of `scope`'s own ticket unless a quarantine got there first. By
/// reference: a receipt passed on by value is copied right after its tag was written (a
/// store-forwarding stall on every attempt's end).
fn record_own(scope: &Scope, receipt: &Receipt) {
    let record = own_spec(scope).listed_by(receipt);
    tree::record_own_receipt(&scope.node, receipt.kind(), record.as_ref(), now_stamp);
}

impl Drop for OwnTicket {
    // Inlined: a ticket handed on (`take`, `run`) leaves one with nothing to record, whose
    // drop then costs nothing where it is known empty.
    #[inline]
    fn drop(&mut self) {
        if let Some(scope) = self.scope.take() {
            // Always dispatched: it was built so.
            record_own(&scope, &own_spec(&scope).default_receipt(true));
        }
    }
}

impl fmt::Debug for OwnTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("OwnTicket");
        if let Some(scope) = &self.scope {
            d.field("spec", self.spec())
                .field("quarantined", &tree::own_quarantined(&scope.node));
        }
        d.finish()
    }
}

pin_project! {
    /// [`Run`](crate::Run) on the handle of an own ticket (see [`OwnTicket::run`]): yields the ticket back
    /// with the outcome; dropped before that, it records the ticket's default receipt.
    ///
    /// Public but hidden only for the floor bench (see [`OwnTicket`]).
    #[doc(hidden)]
    #[must_use = "futures do nothing unless polled"]
    pub struct OwnRun<F: Future> {
        #[pin]
        run: Run<F>,
    }

    impl<F: Future> PinnedDrop for OwnRun<F> {
        fn drop(this: Pin<&mut Self>) {
            let run = this.project().run;
            // Not finished (the scope is still here): the work stops first, then the ticket
            // records its default receipt (invariant 6).
            run.stop(Some(record_default));
        }
    }
}

impl<F: Future> OwnRun<F> {
    #[inline(always)]
    pub(crate) fn new(scope: Scope, fut: F) -> Self {
        OwnRun {
            // The ticket is the body's unit (its scope's first, taken when it was built).
            run: Run::unheld(scope, fut),
        }
    }
}

impl<F: Future> Future for OwnRun<F> {
    type Output = (Result<F::Output, Error>, OwnTicket);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut run = self.project().run;
        // Once ready, the work has stopped, before the ticket goes back for its receipt
        // (invariant 6).
        let out = std::task::ready!(run.as_mut().poll_work(cx));
        let Some(scope) = run.take_scope() else {
            unreachable!("the scope is back after every poll");
        };
        Poll::Ready((out, OwnTicket::new(scope)))
    }
}

/// What a dropped [`OwnRun`] does with its scope's handle once the work stopped: records the
/// ticket's default receipt.
fn record_default(scope: Scope) {
    drop(OwnTicket::new(scope));
}
