//! What ends a call that does not end by itself: its future dropped, or user code of the call
//! (the operation, the classifier, the backoff schedule) unwound by a panic. Each guard ends
//! the call in its own `drop`, before the fields it guards.

use std::future::Future;

use super::attempt::Verdict;
use super::call::Call;
use super::classify::{Classify, Decision};
use crate::child::{OwnRun, OwnTicket};
use crate::error::Error;

/// A dropped hedge's call, in the keeping of this guard while it is ended: made in the drop of
/// a hedge's future that had not ended its call, it ends the call ([`Call::abandon`],
/// [`Stop::Dropped`](super::Stop::Dropped)) as it is dropped in turn, before the call itself
/// is, so while the call's hold, parked and held-back attempts still hold the scope. Its own
/// steps run no user code (those that do are in [`Keep`] or [`OnUnwind`]), so an unwind that
/// drops it is not the call's panic.
pub(crate) struct Live<'c, 's>(&'c mut Call<'s>);

impl<'c, 's> Live<'c, 's> {
    #[inline(always)]
    pub(crate) fn new(call: &'c mut Call<'s>) -> Self {
        Live(call)
    }
}

/// Kept while user code of the call runs (the backoff schedule, the poll of an attempt's work):
/// unwound by its panic, it ends the call [`Stop::Panicked`](super::Stop::Panicked)
/// ([`Call::abandon`], `in_flight` the attempt whose work panicked, whose ticket the caller
/// still holds if `ticket_held`). [`pass`](Self::pass) it (no cost) when the code returns.
pub(crate) struct OnUnwind<'c, 's> {
    call: &'c mut Call<'s>,
    in_flight: Option<usize>,
    ticket_held: bool,
}

impl<'c, 's> OnUnwind<'c, 's> {
    #[inline(always)]
    pub(crate) fn new(call: &'c mut Call<'s>, in_flight: Option<usize>, ticket_held: bool) -> Self {
        OnUnwind {
            call,
            in_flight,
            ticket_held,
        }
    }

    /// The code returned: nothing to end.
    #[inline(always)]
    pub(crate) fn pass(self) {
        std::mem::forget(self);
    }
}

impl Drop for OnUnwind<'_, '_> {
    fn drop(&mut self) {
        self.call.abandon(self.in_flight, self.ticket_held, true);
    }
}

impl<'s> std::ops::Deref for Live<'_, 's> {
    type Target = Call<'s>;

    #[inline(always)]
    fn deref(&self) -> &Call<'s> {
        self.0
    }
}

impl<'s> std::ops::DerefMut for Live<'_, 's> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut Call<'s> {
        self.0
    }
}

impl Drop for Live<'_, '_> {
    fn drop(&mut self) {
        self.0.abandon(None, false, false);
    }
}

/// The ticket of a sequential call's attempt in flight, kept with the call while user code
/// runs for it (`op`, then the classifier): unwound by a panic there, it ends the call
/// ([`Call::abandon`], the ledger attached while the ticket still holds the scope), and only
/// then is the ticket dropped into its default receipt (a field is dropped after its
/// struct's `drop`). A ticket held in a local instead would be dropped first, being declared
/// after the call: the scope could be quiet before the ledger is attached (invariant 6).
pub(crate) struct Keep<'c, 's> {
    /// `None` once the ticket is handed on (to a run, or to its receipt).
    call: Option<&'c mut Call<'s>>,
    index: usize,
    ticket: OwnTicket,
}

impl<'c, 's> Keep<'c, 's> {
    #[inline(always)]
    pub(crate) fn new(call: &'c mut Call<'s>, index: usize, ticket: OwnTicket) -> Self {
        Keep {
            call: Some(call),
            index,
            ticket,
        }
    }

    /// Runs the attempt's work `fut` on the ticket (see [`OwnTicket::run`]): from here on the
    /// run holds the ticket, and the caller keeps the run with the call until the work has
    /// stopped (see `retry::run`).
    #[inline(always)]
    pub(crate) fn run<F: Future>(mut self, fut: F) -> OwnRun<F> {
        self.call = None;
        self.ticket.take().run(fut)
    }

    /// [`Call::judge`] of the attempt, whose ticket stays kept while the classifier runs.
    pub(crate) fn judge<T, E>(
        mut self,
        out: Result<Result<T, E>, Error>,
        classify: &impl Classify<E>,
        on_timeout: Decision,
    ) -> (Verdict<T>, Option<E>) {
        let Some(call) = self.call.as_deref_mut() else {
            unreachable!("a kept ticket is judged once");
        };
        let judged = call.judge(self.index, &mut self.ticket, out, classify, on_timeout);
        self.call = None;
        judged
    }
}

impl Drop for Keep<'_, '_> {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            // Armed only while user code runs (`op`, the classifier, a waker of the receipt):
            // dropped so, it is unwound by that code's panic.
            let panicked = std::thread::panicking();
            call.abandon(Some(self.index), self.ticket.is_pending(), panicked);
        }
    }
}
