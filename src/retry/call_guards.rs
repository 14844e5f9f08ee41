//! What ends a call that does not end by itself: its future dropped, or user code of the call
//! (the operation, the classifier, the backoff schedule) unwound by a panic. Each guard ends
//! the call in its own `drop`, before the fields it guards.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::attempt::Verdict;
use super::call::Call;
use super::classify::{Classify, Decision};
use crate::child::{OwnRun, OwnTicket};
use crate::error::Error;

/// A call from its admission to its end, in the keeping of this guard: dropped before the
/// call ended (the call's future dropped, e.g. during a backoff sleep or while a hedge's
/// attempts run, or unwound by a panic), it ends the call ([`Call::abandon`]) — before the
/// call itself is dropped, so while the call's hold, parked and held-back attempts still hold
/// the scope. Declared after the call, it is dropped before it.
///
/// [`end`](Self::end) it (no cost) before the call ends normally ([`succeed`](Call::succeed),
/// [`close`](Call::close)). Dropped, it records the call [`Stop::Dropped`](super::Stop::Dropped):
/// its own steps run no user code (those that do are in [`Keep`], [`Attempting`] or
/// [`user_code`](Self::user_code)), so an unwind that drops it is not the call's panic.
pub(crate) struct Live<'c, 's>(&'c mut Call<'s>);

impl<'c, 's> Live<'c, 's> {
    #[inline(always)]
    pub(crate) fn new(call: &'c mut Call<'s>) -> Self {
        Live(call)
    }

    /// Gives the call back, to end it normally.
    #[inline(always)]
    pub(crate) fn end(self) {
        std::mem::forget(self);
    }

    /// Runs `f`, user code of the call that holds no ticket (the backoff schedule): if it panics,
    /// the call ends [`Stop::Panicked`](super::Stop::Panicked) ([`Call::abandon`]).
    pub(crate) fn user_code<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let unwinding = OnUnwind(&mut *self.0);
        let r = f();
        std::mem::forget(unwinding);
        r
    }
}

/// Ends the call [`Stop::Panicked`](super::Stop::Panicked) if dropped: forgotten unless unwinding.
struct OnUnwind<'c, 's>(&'c mut Call<'s>);

impl Drop for OnUnwind<'_, '_> {
    fn drop(&mut self) {
        self.0.abandon(None, false, true);
    }
}

/// Sets its flag if dropped: forgotten unless unwinding (so free on the normal path).
struct SetOnUnwind<'a>(&'a mut bool);

impl Drop for SetOnUnwind<'_> {
    fn drop(&mut self) {
        *self.0 = true;
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

    /// Runs the attempt's work `fut` on the ticket (see [`OwnTicket::run`]), keeping the same
    /// promise until the work has stopped ([`Attempting`]).
    #[inline(always)]
    pub(crate) fn run<F: Future>(mut self, fut: F) -> Attempting<'c, 's, F> {
        Attempting {
            call: self.call.take(),
            index: self.index,
            panicked: false,
            run: self.ticket.take().run(fut),
        }
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

pin_project! {
    /// The work of a sequential call's attempt in flight, run on its ticket (an [`OwnRun`]),
    /// with the call: dropped before the work is done (the call's future dropped, e.g. by a
    /// `timeout` around it, or the work's poll panicked), it ends the call
    /// ([`Call::abandon`]) while the run still holds the ticket, and only then is the run
    /// dropped (the work stops, then the ticket records its default receipt). As for
    /// [`Keep`]: the run as a temporary of the `.await` would be dropped before the call.
    pub(crate) struct Attempting<'c, 's, F: Future> {
        // `None` once the work is done.
        call: Option<&'c mut Call<'s>>,
        index: usize,
        // A poll of the work panicked (not: dropped by an unwind from elsewhere).
        panicked: bool,
        #[pin]
        run: OwnRun<F>,
    }

    impl<'c, 's, F: Future> PinnedDrop for Attempting<'c, 's, F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(call) = this.call.take() {
                call.abandon(Some(*this.index), true, *this.panicked);
            }
        }
    }
}

impl<F: Future> Future for Attempting<'_, '_, F> {
    type Output = (Result<F::Output, Error>, OwnTicket);

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let unwinding = SetOnUnwind(this.panicked);
        let out = this.run.poll(cx);
        std::mem::forget(unwinding);
        let out = std::task::ready!(out);
        *this.call = None;
        Poll::Ready(out)
    }
}
