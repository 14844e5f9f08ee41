//! [`HedgeRun`] and [`HedgeRunWithLedger`], the futures of [`Hedge::run`] and
//! [`Hedge::run_with_ledger`]: a state machine that starts attempts and hedges, judges them as
//! they end, and once the call has stopped cancels the others and collects every receipt.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use super::Hedge;
use crate::budget::Split;
use crate::child::{Finished, InFlight};
use crate::panic::Caught;
use crate::retry::attempt::{Limits, Started, Unknown, Verdict};
use crate::retry::call::Call;
use crate::retry::call_guards::Live;
use crate::retry::classify::{Classify, Decision};
use crate::retry::error::RetryError;
use crate::retry::ledger::Ledger;
use crate::retry::stop::{AttemptEnd, Stop};
use crate::retry::Attempt;
use crate::scope::{Cancelled, Scope};
use crate::spec::ChildSpec;
use crate::time::sleepable_after;

pin_project! {
    /// The future of [`Hedge::run_with_ledger`]: the hedged call, resolving to its result
    /// and its [`Ledger`].
    ///
    /// A named type, so that a struct can hold a hedged call in progress and a function can
    /// return it without boxing. Like every future it does nothing until polled: the call is
    /// opened (its ledger begins, the scope admits it) at the first poll. Its cancel safety
    /// and panics are those of [`Hedge::run`]. It is `Send` when the hedge is `Sync` and the
    /// operation, its value and its error are `Send`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::future::Ready;
    /// use cancel_scope::retry::{Attempt, Decision, Hedge, HedgeDelay, HedgeRunWithLedger, Retry};
    /// use cancel_scope::{ChildSpec, Scope};
    ///
    /// type Classifier = fn(&()) -> Decision;
    /// type Op = fn(Attempt) -> Ready<Result<u32, ()>>;
    ///
    /// fn search<'a>(
    ///     hedge: &'a Hedge<Classifier, cancel_scope::retry::Exponential>,
    ///     scope: &'a Scope,
    /// ) -> HedgeRunWithLedger<'a, Classifier, cancel_scope::retry::Exponential, Op, u32, ()> {
    ///     hedge.run_with_ledger(scope, ChildSpec::read_only("search"), |a| {
    ///         std::future::ready(Ok(a.number()))
    ///     })
    /// }
    ///
    /// let hedge = Retry::new((|_| Decision::Backoff) as Classifier)
    ///     .hedge(HedgeDelay::Fixed(std::time::Duration::from_millis(50)));
    /// let request = Scope::new();
    /// let (answer, ledger) = search(&hedge, &request).await;
    /// assert_eq!((answer.unwrap(), ledger.started()), (1, 1));
    /// # }
    /// ```
    #[must_use = "futures do nothing unless polled"]
    pub struct HedgeRunWithLedger<'a, C, B, F, T, E> {
        // First, so that it is dropped first: the call ends before `op` is dropped.
        core: Core<'a, T, E>,
        // The next hedge's timer (or the end of a pushback), while one is due.
        #[pin]
        timer: Option<Sleep>,
        hedge: &'a Hedge<C, B>,
        op: F,
    }
}

pin_project! {
    /// The future of [`Hedge::run`]: the hedged call, resolving to its result.
    ///
    /// [`HedgeRunWithLedger`] without the ledger (it is in the scope's report all the same,
    /// and in a [`RetryError`]); see there.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::retry::{Decision, HedgeDelay, HedgeRun, Retry, RetryError};
    /// use cancel_scope::{ChildSpec, Scope};
    ///
    /// // A caller's own future, holding the hedged call as a field.
    /// struct Lookup<F> {
    ///     call: F,
    /// }
    ///
    /// let hedge = Retry::new(|_: &()| Decision::Backoff).hedge(HedgeDelay::Fixed(Duration::from_millis(5)));
    /// let request = Scope::new();
    /// let lookup = Lookup {
    ///     call: hedge.run(&request, ChildSpec::read_only("dns"), |_| async { Ok::<_, ()>("10.0.0.7") }),
    /// };
    /// fn is_hedge_run<C, B, F, T, E>(_: &HedgeRun<'_, C, B, F, T, E>) {}
    /// is_hedge_run(&lookup.call);
    /// let answer: Result<&str, RetryError<()>> = lookup.call.await;
    /// assert_eq!(answer.unwrap(), "10.0.0.7");
    /// # }
    /// ```
    #[must_use = "futures do nothing unless polled"]
    pub struct HedgeRun<'a, C, B, F, T, E> {
        #[pin]
        inner: HedgeRunWithLedger<'a, C, B, F, T, E>,
    }
}

/// What a hedged call resolves to: its result and its ledger.
type Answer<T, E> = (Result<T, RetryError<E>>, Arc<Ledger>);

/// The state of a hedged call that has no user type in it (but its values and errors), so
/// that it can end the call on its own: dropped before the call ended (the future dropped),
/// or unwound by a poll that panicked, it cancels the attempts in flight and then ends the
/// call ([`Call::abandon`], in [`Live`]'s drop) while the call still holds the scope.
struct Core<'a, T, E> {
    scope: &'a Scope,
    /// The call's spec, until the call is opened at the first poll.
    spec: Option<ChildSpec>,
    /// The call, from its admission to its end (`close`): while it is here, it is live.
    call: Option<Call<'a>>,
    inflight: InFlight<usize, Result<T, E>>,
    /// The scope's cancel, while the call runs.
    cancelled: Option<Cancelled>,
    last: Option<E>,
    winner: Option<T>,
    next_hedge: Option<Instant>,
    endpoint: u32,
    /// The dependency's pushback (`Decision::RetryAfter`): nothing starts before it, and
    /// once nothing could start after it, the call ends when nothing is in flight.
    not_before: Option<Instant>,
    no_more: Option<Stop>,
    /// The first attempt (and, later, one after a failure with nothing in flight, or a hedge
    /// whose delay has passed) starts at the next step.
    start_now: bool,
    /// Why the call stopped, once it has: the attempts left are cancelled and collected.
    stop: Option<Stop>,
    /// A user's code that panics in the call (`op`, the classifier, an `on_cancel` callback
    /// or a waker run by a cancel or a receipt) is kept until every attempt is collected and
    /// the call closed, then goes on.
    caught: Caught,
    /// Resolved, or its poll panicked.
    done: bool,
}

impl<'a, C, B, F, T, E> HedgeRunWithLedger<'a, C, B, F, T, E> {
    pub(super) fn new(hedge: &'a Hedge<C, B>, scope: &'a Scope, spec: ChildSpec, op: F) -> Self {
        HedgeRunWithLedger {
            core: Core {
                scope,
                spec: Some(spec),
                call: None,
                inflight: InFlight::new(),
                cancelled: None,
                last: None,
                winner: None,
                next_hedge: None,
                endpoint: 0,
                not_before: None,
                no_more: None,
                start_now: true,
                stop: None,
                caught: Caught::default(),
                done: false,
            },
            timer: None,
            hedge,
            op,
        }
    }
}

impl<'a, C, B, F, T, E> HedgeRun<'a, C, B, F, T, E> {
    pub(super) fn new(inner: HedgeRunWithLedger<'a, C, B, F, T, E>) -> Self {
        HedgeRun { inner }
    }
}

impl<C, B, F, Fut, T, E> Future for HedgeRunWithLedger<'_, C, B, F, T, E>
where
    C: Classify<E>,
    F: FnMut(Attempt) -> Fut,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: Send + 'static,
{
    type Output = (Result<T, RetryError<E>>, Arc<Ledger>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        assert!(
            !this.core.done,
            "`HedgeRunWithLedger` polled after completion"
        );
        // A poll that unwinds (an attempt spawned outside a runtime) ends the call as its
        // drop would, at once.
        let unwinding = EndOnUnwind(this.core);
        let out = unwinding.0.step(this.hedge, this.op, this.timer, cx);
        std::mem::forget(unwinding);
        out
    }
}

impl<'a, C, B, F, T, E> Future for HedgeRun<'a, C, B, F, T, E>
where
    HedgeRunWithLedger<'a, C, B, F, T, E>: Future<Output = (Result<T, RetryError<E>>, Arc<Ledger>)>,
{
    type Output = Result<T, RetryError<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx).map(|(out, _)| out)
    }
}

/// Ends the call of its core if dropped: forgotten unless unwinding.
struct EndOnUnwind<'c, 'a, T, E>(&'c mut Core<'a, T, E>);

impl<T, E> Drop for EndOnUnwind<'_, '_, T, E> {
    fn drop(&mut self) {
        self.0.done = true;
        self.0.end_dropped();
    }
}

impl<T, E> Drop for Core<'_, T, E> {
    fn drop(&mut self) {
        self.end_dropped();
    }
}

impl<'a, T: Send + 'static, E: Send + 'static> Core<'a, T, E> {
    fn step<C, B, F, Fut>(
        &mut self,
        hedge: &'a Hedge<C, B>,
        op: &mut F,
        mut timer: Pin<&mut Option<Sleep>>,
        cx: &mut Context<'_>,
    ) -> Poll<Answer<T, E>>
    where
        C: Classify<E>,
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        if let Some(spec) = self.spec.take() {
            if let Err(out) = self.open(hedge, spec) {
                self.done = true;
                return Poll::Ready(out);
            }
        }
        if self.stop.is_none() {
            match self.run(hedge, op, timer.as_mut(), cx) {
                Poll::Ready(stop) => self.stopped(stop),
                Poll::Pending => return Poll::Pending,
            }
            timer.set(None);
        }
        std::task::ready!(self.drain(hedge, cx));
        let Some(call) = self.call.take() else {
            unreachable!("a hedged call is closed once");
        };
        let Some(stop) = self.stop.take() else {
            unreachable!("a drained call has stopped");
        };
        self.done = true;
        let ledger = call.close(&stop);
        std::mem::take(&mut self.caught).resume();
        match self.winner.take() {
            Some(value) => Poll::Ready((Ok(value), ledger)),
            None => {
                let last = self.last.take();
                Poll::Ready((Err(RetryError::new(stop, last, ledger.clone())), ledger))
            }
        }
    }

    /// Opens and admits the call; `Err`: the scope refused it (its ledger is not attached).
    fn open<C, B>(&mut self, hedge: &'a Hedge<C, B>, spec: ChildSpec) -> Result<(), Answer<T, E>> {
        let policy = &hedge.retry;
        // Hedges overlap: each may use what is left, not a share of it.
        let limits = Limits {
            split: Split::Greedy {
                cap: match policy.limits.split {
                    Split::Even { cap } | Split::Greedy { cap } => cap,
                },
            },
            ..policy.limits
        };
        let mut call = Call::open(self.scope, spec, limits, policy.budget.as_deref());
        if let Err(stop) = call.admit(true) {
            let ledger = call.refused(&stop);
            return Err((Err(RetryError::new(stop, None, ledger.clone())), ledger));
        }
        // Live from here: dropped before it ends, the core ends the call (see `Core`).
        self.call = Some(call);
        self.cancelled = Some(self.scope.cancelled());
        Ok(())
    }

    /// Starts attempts and judges those that end until the call stops (`Ready`) or nothing
    /// more is ready.
    fn run<C, B, F, Fut>(
        &mut self,
        hedge: &Hedge<C, B>,
        op: &mut F,
        mut timer: Pin<&mut Option<Sleep>>,
        cx: &mut Context<'_>,
    ) -> Poll<Stop>
    where
        C: Classify<E>,
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let policy = &hedge.retry;
        let Some(call) = self.call.as_mut() else {
            unreachable!("a hedged call runs once admitted");
        };
        loop {
            if self.start_now {
                self.start_now = false;
                let is_hedge = !self.inflight.is_empty();
                match call.start(is_hedge, self.endpoint) {
                    Ok(Started {
                        dispatched,
                        index,
                        attempt,
                    }) => {
                        let Some(fut) = self.caught.run(|| op(attempt)) else {
                            // `op` panicked: no work started for this attempt. The others are
                            // collected, then the panic goes on.
                            self.caught.run(|| {
                                call.settle(index, dispatched, AttemptEnd::Panicked, None);
                            });
                            return Poll::Ready(Stop::Panicked);
                        };
                        self.inflight.spawn(index, dispatched, fut);
                        // A delay too long to represent never hedges.
                        self.next_hedge = if call.attempts_left() > 0 {
                            let not_before = self.not_before;
                            sleepable_after(Instant::now(), hedge.delay.delay())
                                .map(|at| not_before.map_or(at, |nb| at.max(nb)))
                        } else {
                            None
                        };
                    }
                    // Nothing more may start: wait for what is in flight, if anything.
                    Err(stop) if self.inflight.is_empty() => return Poll::Ready(stop),
                    Err(_) => self.next_hedge = None,
                }
            }
            // An attempt that has finished is judged before the scope's cancel is seen: one
            // that succeeded before the cancel reached it wins, as in a sequential retry (its
            // receipt says it succeeded; the call must not say it was cancelled).
            if let Poll::Ready((index, _, res)) = self.inflight.poll_next(cx) {
                let Ok(Finished { dispatched, out }) = res else {
                    // Panicked (its receipt was recorded as the task unwound).
                    call.ledger
                        .get()
                        .end(index, AttemptEnd::Panicked, Instant::now());
                    return Poll::Ready(Stop::Panicked);
                };
                let judged = self.caught.run(|| {
                    let mut dispatched = dispatched;
                    call.judge(
                        index,
                        &mut dispatched,
                        out,
                        &policy.classify,
                        policy.on_timeout,
                    )
                });
                let Some((verdict, error)) = judged else {
                    // The classifier (or a waker run by the receipt) panicked: the others are
                    // collected, then the panic goes on. A waker's panic comes after the
                    // attempt's end was recorded: an attempt that succeeded stays the call's
                    // success (no attempt panicked; as when the same waker panics at a receipt
                    // given later).
                    let ended = call.ledger.attempts[index].end;
                    call.ledger
                        .get()
                        .end(index, AttemptEnd::Panicked, Instant::now());
                    if ended == Some(AttemptEnd::Succeeded) {
                        return Poll::Ready(Stop::Succeeded);
                    }
                    return Poll::Ready(Stop::Panicked);
                };
                if error.is_some() {
                    self.last = error;
                }
                match verdict {
                    Verdict::Success(value) => {
                        let a = &call.ledger.attempts[index];
                        if let Some(end) = a.ended_at {
                            hedge.delay.record(end - a.started_at);
                        }
                        self.winner = Some(value);
                        return Poll::Ready(Stop::Succeeded);
                    }
                    Verdict::Stop(stop) => return Poll::Ready(stop),
                    Verdict::Again(Decision::SwitchEndpoint) => {
                        self.endpoint = self.endpoint.wrapping_add(1);
                    }
                    Verdict::Again(
                        Decision::RetryAfter(hint) | Decision::EffectUnknownAfter(hint),
                    ) => match call.after_pushback(hint) {
                        Ok(at) => {
                            self.not_before = self.not_before.max(Some(at));
                            self.next_hedge = self.next_hedge.map(|h| h.max(at));
                        }
                        Err(stop) if self.inflight.is_empty() => return Poll::Ready(stop),
                        // Nothing more starts: wait for what is in flight, then end with this
                        // (unless one of them succeeds).
                        Err(stop) => {
                            self.next_hedge = None;
                            self.no_more = Some(stop);
                        }
                    },
                    Verdict::Again(_) => {}
                }
                if self.inflight.is_empty() {
                    if let Some(stop) = self.no_more.take() {
                        return Poll::Ready(stop);
                    }
                    if call.attempts_left() == 0 {
                        return Poll::Ready(Stop::AttemptsExhausted);
                    }
                    match self.not_before.filter(|at| *at > Instant::now()) {
                        // Started when the hint has passed (or the scope is cancelled).
                        Some(at) => self.next_hedge = Some(at),
                        None => self.start_now = true,
                    }
                }
                continue;
            }
            if let Some(cancelled) = self.cancelled.as_mut() {
                if let Poll::Ready(cause) = cancelled.poll_cancelled(cx) {
                    return Poll::Ready(Stop::Cancelled(cause));
                }
            }
            if let Some(at) = self.next_hedge {
                if poll_timer(timer.as_mut(), at, cx).is_ready() {
                    self.start_now = true;
                    continue;
                }
            }
            return Poll::Pending;
        }
    }

    /// The call has stopped: the losers (and attempts still running after a failure or a
    /// cancel) are cancelled, and [`drain`](Self::drain) waits for them: the call returns
    /// only once every attempt has its receipt.
    fn stopped(&mut self, stop: Stop) {
        // A panic kept (`caught`) waits until every attempt is collected and the call closed,
        // so that none is left running or dropped into its default receipt (a parked loser of
        // a call that succeeded would be reported as an unknown effect).
        let inflight = &self.inflight;
        let reason = if stop == Stop::Succeeded {
            "lost the hedge"
        } else {
            "hedged call ended"
        };
        self.caught.run(|| inflight.cancel_all(reason));
        self.stop = Some(stop);
        self.cancelled = None;
        self.next_hedge = None;
    }

    /// Collects the attempts still in flight after the call stopped.
    fn drain<C: Classify<E>, B>(&mut self, hedge: &Hedge<C, B>, cx: &mut Context<'_>) -> Poll<()> {
        let policy = &hedge.retry;
        let Some(call) = self.call.as_mut() else {
            unreachable!("a hedged call is drained before it is closed");
        };
        while !self.inflight.is_empty() {
            let (index, _, res) = std::task::ready!(self.inflight.poll_next(cx));
            let recorded = self.caught.run(|| {
                match res {
                    Ok(Finished {
                        dispatched,
                        out: Ok(Ok(_)),
                    }) => call.settle(index, dispatched, AttemptEnd::Succeeded, None),
                    // It answered with an error before the cancel reached it: a definite failure
                    // (or an unknown effect, if so classified), not an attempt stopped by the
                    // cancel. Its error does not replace the one that ended the call.
                    Ok(Finished {
                        mut dispatched,
                        out: Ok(Err(e)),
                    }) => {
                        call.fail(index, &mut dispatched, &e, &policy.classify);
                    }
                    // Stopped by the cancel (or its own deadline) before it answered.
                    Ok(Finished {
                        dispatched,
                        out: Err(_),
                    }) => call.settle(
                        index,
                        dispatched,
                        AttemptEnd::Stopped,
                        Some(Unknown::Stopped),
                    ),
                    Err(_) => call
                        .ledger
                        .get()
                        .end(index, AttemptEnd::Panicked, Instant::now()),
                }
            });
            if recorded.is_none() {
                // The classifier (or a waker run by the receipt) panicked: the attempt is
                // recorded all the same (it has no end yet if the classifier panicked; its
                // ticket got its receipt as it was dropped).
                call.ledger
                    .get()
                    .end(index, AttemptEnd::Panicked, Instant::now());
            }
        }
        Poll::Ready(())
    }
}

impl<T, E> Core<'_, T, E> {
    /// Ends a call that is dropped (or unwound) before it ended: the attempts in flight are
    /// cancelled (their tasks give the receipts when they stop), then the call is abandoned
    /// ([`Live`]'s drop: the ledger attached, finished with [`Stop::Dropped`]) while the call's
    /// hold still keeps the scope from quiet, and only then is the call dropped.
    fn end_dropped(&mut self) {
        let Some(mut call) = self.call.take() else {
            return;
        };
        let _live = Live::new(&mut call);
        self.inflight.cancel_all("abandoned by its caller");
    }
}

/// Polls the timer set to `at` (reset if it was set to another instant).
fn poll_timer(mut timer: Pin<&mut Option<Sleep>>, at: Instant, cx: &mut Context<'_>) -> Poll<()> {
    match timer.as_mut().as_pin_mut() {
        Some(sleep) if sleep.deadline() == at => {}
        Some(sleep) => sleep.reset(at),
        None => timer.set(Some(tokio::time::sleep_until(at))),
    }
    match timer.as_pin_mut() {
        Some(sleep) => sleep.poll(cx),
        None => unreachable!("the timer was just set"),
    }
}

impl<C, B, F, T, E> fmt::Debug for HedgeRunWithLedger<'_, C, B, F, T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let core = &self.core;
        let state = if core.done {
            "done"
        } else if core.spec.is_some() {
            "not started"
        } else if core.stop.is_some() {
            "draining"
        } else {
            "running"
        };
        f.debug_struct("HedgeRunWithLedger")
            .field("state", &state)
            .field("in_flight", &core.inflight.len())
            .field("next_hedge", &core.next_hedge)
            .finish()
    }
}

impl<C, B, F, T, E> fmt::Debug for HedgeRun<'_, C, B, F, T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HedgeRun").field(&self.inner).finish()
    }
}
