//! Registration and dispatch of one child.

use std::fmt;
use std::time::Duration;

use super::receipt::Receipt;
use crate::error::Error;
use crate::scope::Scope;
use crate::spec::ChildSpec;
use crate::sync::Arc;
use crate::time::now_stamp;
use crate::tree::{self, Kind, TicketCell, TicketState};

/// A registered child that has not been dispatched yet (state PREPARED).
///
/// Made by [`Scope::register`]. Registration comes first, so that a cancel always knows about
/// every child that might start; [`dispatch`](Ticket::dispatch) then succeeds only if the scope's
/// generation is unchanged and its watermark open. Dropping a ticket records
/// [`Receipt::Cancelled`]: nothing was sent.
///
/// # Examples
///
/// ```
/// use cancel_scope::{ChildSpec, Scope};
///
/// let scope = Scope::new();
/// let ticket = scope.register(ChildSpec::read_only("lookup")).unwrap();
/// scope.cancel();
/// // The cancel came between registration and dispatch: nothing may be sent.
/// assert!(ticket.dispatch().unwrap_err().is_cancelled());
/// ```
#[must_use = "a ticket that is dropped records a Cancelled receipt"]
pub struct Ticket {
    inner: Inner,
}

/// A dispatched child (state DISPATCHING): the work may have started and must end with a
/// receipt.
///
/// Dropping it without one records [`Receipt::Cancelled`] for read-only work and
/// [`Receipt::EffectUnknown`] for work that may have had an effect (also on panic).
///
/// # Examples
///
/// ```
/// use cancel_scope::{ChildSpec, Scope};
///
/// let scope = Scope::new();
/// let call = scope.register(ChildSpec::read_only("lookup")).unwrap().dispatch().unwrap();
/// // ... send the request ...
/// call.succeed();
/// ```
#[must_use = "a dispatched child that is dropped records Cancelled or EffectUnknown"]
pub struct Dispatched {
    inner: Inner,
}

struct Inner {
    scope: Scope,
    cell: Arc<TicketCell<ChildSpec>>,
    spec: ChildSpec,
    budget: Option<Duration>,
}

impl Inner {
    /// Records `receipt` unless quarantine got there first (invariant 5).
    fn finish(&mut self, receipt: Receipt) {
        let record = self.spec.listed_by(&receipt);
        self.record(receipt.kind(), record.as_slice());
    }

    /// Records a receipt of `kind` that lists `records`, unless quarantine got there first
    /// (invariant 5).
    fn record(&mut self, kind: Kind, records: &[ChildSpec]) {
        let Some(was) = self.cell.finish_as(TicketState::Done) else {
            return;
        };
        let ran = was == TicketState::Dispatched;
        tree::record_receipt(&self.scope.node, &self.cell, kind, records, ran, now_stamp);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if matches!(
            self.cell.state(),
            TicketState::Prepared | TicketState::Dispatched
        ) {
            let dispatched = self.cell.state() == TicketState::Dispatched;
            let receipt = self.spec.default_receipt(dispatched);
            self.finish(receipt);
        }
    }
}

impl Scope {
    /// Registers a child (PREPARED): its identity, the generation it saw, its budget and its
    /// effect kind. The scope's [`quiesce`](Scope::quiesce) waits for its receipt.
    ///
    /// # Errors
    ///
    /// [`Error::is_cancelled`] or [`Error::is_closed`] once the registration watermark is
    /// closed: no registration after cancel or close.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{ChildSpec, Scope};
    /// let scope = Scope::new();
    /// let t = scope.register(ChildSpec::idempotent("put", "order-1")).unwrap();
    /// assert_eq!(t.generation(), scope.generation());
    /// scope.close();
    /// assert!(scope.register(ChildSpec::read_only("late")).unwrap_err().is_closed());
    /// # drop(t);
    /// ```
    pub fn register(&self, spec: ChildSpec) -> Result<Ticket, Error> {
        let budget = self.remaining();
        let cell = tree::register(&self.node, |key, generation| {
            TicketCell::new(key, generation, spec.clone())
        })?;
        Ok(Ticket {
            inner: Inner {
                scope: self.clone(),
                cell,
                spec,
                budget,
            },
        })
    }

    /// Registers the child of a shielded cleanup: allowed while the scope is not yet quiet,
    /// even after a cancel (the one exception to the watermark, see [`Scope::shield`]).
    pub(crate) fn register_shielded(&self, spec: ChildSpec) -> Result<Dispatched, Error> {
        // It may start after the cancel: its orphan work counts from its start.
        let started = now_stamp();
        let cell = tree::register_shielded(&self.node, |key, generation| {
            TicketCell::new(key, generation, spec.clone()).started_at(started)
        })?;
        cell.mark_dispatched();
        Ok(Dispatched {
            inner: Inner {
                scope: self.clone(),
                cell,
                spec,
                budget: self.remaining(),
            },
        })
    }
}

impl Ticket {
    /// The scope generation this child was registered in.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{ChildSpec, Scope};
    /// let s = Scope::new();
    /// assert_eq!(s.register(ChildSpec::read_only("x")).unwrap().generation(), 0);
    /// ```
    pub fn generation(&self) -> u64 {
        self.inner.cell.generation()
    }

    /// The scope's remaining budget when the child was registered (`None`: unbounded).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{ChildSpec, Scope};
    /// let s = Scope::new();
    /// assert_eq!(s.register(ChildSpec::read_only("x")).unwrap().budget(), None);
    /// ```
    pub fn budget(&self) -> Option<std::time::Duration> {
        self.inner.budget
    }

    /// What was registered.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{ChildSpec, Scope};
    /// let s = Scope::new();
    /// assert_eq!(s.register(ChildSpec::read_only("x")).unwrap().spec().name(), "x");
    /// ```
    pub fn spec(&self) -> &ChildSpec {
        &self.inner.spec
    }

    /// The scope the child belongs to.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{ChildSpec, Scope};
    /// let s = Scope::new();
    /// let t = s.register(ChildSpec::read_only("x")).unwrap();
    /// assert_eq!(t.scope().generation(), s.generation());
    /// ```
    pub fn scope(&self) -> &Scope {
        &self.inner.scope
    }

    /// Moves the child to DISPATCHING by a compare-and-swap that succeeds only if the scope's
    /// generation is the one the ticket saw and its watermark is open: no child is ever
    /// dispatched after its scope was cancelled, whatever the interleaving.
    ///
    /// A scope whose deadline has passed counts as cancelled even if its timer has not fired
    /// yet: the dispatch cancels it with [`Cause::DeadlineExceeded`](crate::Cause) and fails.
    ///
    /// # Errors
    ///
    /// [`Error::is_cancelled`] (also [`Error::is_deadline_exceeded`]) / [`Error::is_closed`];
    /// the ticket then records
    /// [`Receipt::Cancelled`] (nothing was sent).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{ChildSpec, Scope};
    /// let s = Scope::new();
    /// let d = s.register(ChildSpec::read_only("x")).unwrap().dispatch().unwrap();
    /// d.succeed();
    /// ```
    pub fn dispatch(self) -> Result<Dispatched, Error> {
        let inner = self.inner;
        // A passed deadline is made the cancel now, so that the CAS below fails.
        inner.scope.expire_if_passed();
        let seen = inner.cell.generation();
        if inner.spec.effect().may_have_effect() && can_dispatch(&inner.scope, seen) {
            // Before the CAS: a request's answer that reads the flag after its cancel then
            // sees every dispatch that succeeded (see `scope::effect`).
            inner.scope.note_effect();
        }
        tree::dispatch(&inner.scope.node, seen)?;
        if !inner.cell.mark_dispatched() {
            // Ended by a quarantine while prepared: it has its receipt (`Cancelled`) already.
            return Err(Error::closed());
        }
        Ok(Dispatched { inner })
    }
}

/// Whether the dispatch CAS of a ticket of `scope` registered in generation `seen` can
/// succeed now: the watermark open, the generation unchanged (a refused dispatch does not
/// note an effect).
fn can_dispatch(scope: &Scope, seen: u64) -> bool {
    let state = scope.node.state();
    !state.is_closed() && state.generation() == seen
}

impl Dispatched {
    /// Records [`Receipt::Succeeded`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use cancel_scope::{ChildSpec, Scope};
    /// let s = Scope::new();
    /// s.register(ChildSpec::read_only("x")).unwrap().dispatch().unwrap().succeed();
    /// ```
    pub fn succeed(self) {
        self.finish(Receipt::Succeeded);
    }

    /// Records [`Receipt::Failed`]: it finished with an error and has stopped.
    ///
    /// # Examples
    ///
    /// ```
    /// # use cancel_scope::{ChildSpec, Scope};
    /// let s = Scope::new();
    /// s.register(ChildSpec::read_only("x")).unwrap().dispatch().unwrap().fail();
    /// ```
    pub fn fail(self) {
        self.finish(Receipt::Failed);
    }

    /// Records [`Receipt::EffectUnknown`] for work whose unknown effects are `effects` (the
    /// children of another scope that ended so: a shielded cleanup's own scope), each listed
    /// as a pending effect of this scope.
    pub(crate) fn finish_unknown(mut self, effects: &[ChildSpec]) {
        self.inner.record(Kind::EffectUnknown, effects);
    }

    /// Records any receipt. A [`Receipt::Quarantined`] given here is recorded as such.
    ///
    /// # Examples
    ///
    /// ```
    /// # use cancel_scope::{ChildSpec, EffectRecord, Receipt, Scope};
    /// let s = Scope::new();
    /// let d = s.register(ChildSpec::side_effecting("pay", "p-1")).unwrap().dispatch().unwrap();
    /// d.finish(Receipt::EffectUnknown(EffectRecord::new("p-1").provider_handle("psp-7")));
    /// ```
    pub fn finish(mut self, receipt: Receipt) {
        self.inner.finish(receipt);
    }

    /// Records the provider's handle for the effect (shown if its outcome becomes unknown).
    ///
    /// # Examples
    ///
    /// ```
    /// # use cancel_scope::{ChildSpec, Scope};
    /// let s = Scope::new();
    /// let mut d = s.register(ChildSpec::side_effecting("pay", "p-1")).unwrap().dispatch().unwrap();
    /// d.set_provider_handle("psp-7");
    /// d.succeed();
    /// ```
    pub fn set_provider_handle(&mut self, handle: impl Into<std::sync::Arc<str>>) {
        let handle = handle.into();
        self.inner.spec.set_provider_handle(handle.clone());
        // Also where a quarantine reads it.
        self.inner
            .cell
            .update_info(|spec| spec.set_provider_handle(handle));
    }

    /// The scope the child belongs to.
    ///
    /// # Examples
    ///
    /// ```
    /// # use cancel_scope::{ChildSpec, Scope};
    /// let s = Scope::new();
    /// let d = s.register(ChildSpec::read_only("x")).unwrap().dispatch().unwrap();
    /// assert!(!d.scope().is_cancelled());
    /// # d.succeed();
    /// ```
    pub fn scope(&self) -> &Scope {
        &self.inner.scope
    }

    /// What was registered.
    ///
    /// # Examples
    ///
    /// ```
    /// # use cancel_scope::{ChildSpec, Scope};
    /// let s = Scope::new();
    /// let d = s.register(ChildSpec::read_only("x")).unwrap().dispatch().unwrap();
    /// assert_eq!(d.spec().name(), "x");
    /// # d.succeed();
    /// ```
    pub fn spec(&self) -> &ChildSpec {
        &self.inner.spec
    }

    /// Whether the scope quarantined this child: its outcome will be ignored.
    ///
    /// # Examples
    ///
    /// ```
    /// # use cancel_scope::{ChildSpec, Scope};
    /// let s = Scope::new();
    /// let d = s.register(ChildSpec::read_only("x")).unwrap().dispatch().unwrap();
    /// assert!(!d.is_quarantined());
    /// # d.succeed();
    /// ```
    pub fn is_quarantined(&self) -> bool {
        self.inner.cell.state() == TicketState::Quarantined
    }

    /// Whether the scope quarantined this child; if not, `waker` is woken when it does.
    pub(crate) fn poll_quarantined(&self, waker: &std::task::Waker) -> bool {
        self.inner.cell.poll_quarantined(waker)
    }

    /// Resolves once the scope quarantines this child (what a shield's task waits for along
    /// with its cleanup); for the loom models.
    #[doc(hidden)]
    #[cfg(any(test, feature = "__test-hooks"))]
    pub fn __quarantined(&self) -> impl std::future::Future<Output = ()> + '_ {
        std::future::poll_fn(|cx| {
            if self.poll_quarantined(cx.waker()) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
    }

    /// The error a quarantined child's work ends with: the cancel of its scope.
    pub(crate) fn quarantined_error(&self) -> Error {
        Error::cancelled(self.inner.scope.cause_or_cancelled())
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("spec", &self.inner.spec)
            .field("generation", &self.inner.cell.generation())
            .finish()
    }
}

impl fmt::Debug for Dispatched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dispatched")
            .field("spec", &self.inner.spec)
            .field("state", &self.inner.cell.state())
            .finish()
    }
}

#[cfg(test)]
impl Dispatched {
    /// Wins this child's receipt, `receipt`, by the ticket's state CAS without recording it:
    /// where an owner on another thread is between the two steps of its receipt. The
    /// returned closure takes the second step (records it and releases the unit).
    pub(crate) fn win_receipt(self, receipt: Receipt) -> impl FnOnce() {
        let inner = self.inner;
        let won = inner.cell.finish_as(TicketState::Done);
        assert_eq!(won, Some(TicketState::Dispatched), "not the owner's to win");
        move || {
            let record = inner.spec.listed_by(&receipt);
            let kind = receipt.kind();
            let records = record.as_slice();
            tree::record_receipt(
                &inner.scope.node,
                &inner.cell,
                kind,
                records,
                true,
                now_stamp,
            );
        }
    }
}
