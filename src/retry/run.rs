//! The futures of a sequential retry call ([`Retry::run`], [`Retry::run_with_ledger`]): the
//! call's loop as the `poll` of a state machine, a type callers can name.
//!
//! # How a call that does not end by itself ends
//!
//! The call ends by itself only in `poll`. Dropped before that (a `timeout` around it), the
//! future's own drop ends it ([`Call::abandon`], [`Stop::Dropped`]) while the attempt in flight
//! still holds its ticket, and only then are the attempt and the call dropped (its fields are
//! dropped after its `drop`, the state first). Unwound by a panic in a `poll`, the call is ended
//! before the panic leaves the poll, by the guards of that poll: [`Keep`] around `op` and the
//! classifier and [`OnUnwind`] around the attempt's work and the backoff schedule
//! ([`Stop::Panicked`]), then [`Polling`] ([`Stop::Dropped`] if nothing ended it yet: no user
//! code panicked), which also drops the attempt in flight and the call, as the unwind of an
//! `async fn` drops its locals. The user's values (`op`, the backoff schedule, the last error)
//! stay until the future is dropped.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Sleep;

use super::attempt::{Attempt, Started, Verdict};
use super::call::Call;
use super::call_guards::{Keep, OnUnwind};
use super::classify::{Classify, Decision};
use super::error::RetryError;
use super::ledger::Ledger;
use super::stop::Stop;
use super::Retry;
use crate::child::{OwnRun, OwnTicket};
use crate::error::Error;
use crate::scope::{Cancelled, Scope};
use crate::spec::ChildSpec;

pin_project! {
    /// Where a call is between two polls.
    #[project = StateProj]
    #[project_replace = StateOwn]
    enum State<'a, Fut: Future> {
        /// Not polled yet: the call opens at its first poll, as an `async fn` would.
        Start { scope: &'a Scope, spec: ChildSpec },
        /// A backoff sleep, cut short by the scope's cancel (which wins a tie).
        Sleeping {
            #[pin]
            sleep: Sleep,
            cancel: Cancelled,
        },
        /// The attempt at `index` in the ledger, its work running on its ticket.
        Attempting {
            index: usize,
            #[pin]
            run: OwnRun<Fut>,
        },
        /// No sleep and no attempt: between two steps of a poll, or the call has ended (a
        /// poll that finds it so panics).
        Idle,
    }
}

pin_project! {
    /// The future of [`Retry::run`]: resolves to the first success, or to the [`RetryError`]
    /// of a call that a limit stopped.
    ///
    /// `F` and `Fut` are the operation and the future it returns, `T` and `E` what that future
    /// resolves to (`Result<T, E>`), `C` and `B` the policy's classifier and backoff. The type
    /// is `Send` when the operation, its future, its error and the schedule's iterator are
    /// `Send` and the policy is `Sync`; a `!Send` operation runs on a current-thread runtime or
    /// a `LocalSet`.
    ///
    /// Cancel safety and panics: see [`Retry::run`].
    ///
    /// # Examples
    ///
    /// A struct that keeps a call in flight, for a hand-written future or a poll loop:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::future::{ready, Ready};
    /// use cancel_scope::retry::{self, Attempt, Decision, Retry};
    /// use cancel_scope::{ChildSpec, Scope};
    ///
    /// type Classifier = fn(&()) -> Decision;
    /// type Op = fn(Attempt) -> Ready<Result<u32, ()>>;
    ///
    /// struct Pending<'a> {
    ///     call: retry::Run<'a, Classifier, retry::Exponential, Op, Ready<Result<u32, ()>>, u32, ()>,
    /// }
    ///
    /// let retry: Retry<Classifier> = Retry::new(|_| Decision::Backoff);
    /// let scope = Scope::new();
    /// let op: Op = |a| ready(Ok(a.number()));
    /// let pending = Pending { call: retry.run(&scope, ChildSpec::read_only("db"), op) };
    /// assert_eq!(pending.call.await.unwrap(), 1);
    /// # }
    /// ```
    #[must_use = "futures do nothing unless polled"]
    pub struct Run<'a, C, B, F, Fut, T, E>
    where
        B: IntoIterator,
        Fut: Future,
    {
        // Dropped first (the attempt in flight stops and records its default receipt), once
        // the drop below has attached the ledger; the call (its hold, its parked attempts)
        // after it.
        #[pin]
        state: State<'a, Fut>,
        last: Option<E>,
        // Made on the first retry only: a call that succeeds at once pays nothing for it.
        backoff: Option<B::IntoIter>,
        // From the call's admission to its end.
        call: Option<Call<'a>>,
        op: F,
        retry: &'a Retry<C, B>,
        endpoint: u32,
        output: PhantomData<fn() -> T>,
    }

    impl<'a, C, B, F, Fut, T, E> PinnedDrop for Run<'a, C, B, F, Fut, T, E>
    where
        B: IntoIterator,
        Fut: Future,
    {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // Dropped before it ended, during a backoff sleep or with an attempt in flight: a
            // drop, even by an unwind from elsewhere (a panic in a poll ended the call there).
            if let Some(call) = this.call.as_mut() {
                match this.state.project() {
                    StateProj::Attempting { index, .. } => call.abandon(Some(*index), true, false),
                    _ => call.abandon(None, false, false),
                }
            }
        }
    }
}

pin_project! {
    /// The future of [`Retry::run_with_ledger`]: [`Run`], also resolving to the call's
    /// [`Ledger`].
    ///
    /// Cancel safety and panics: see [`Retry::run`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::future::{ready, Ready};
    /// use cancel_scope::retry::{self, Attempt, Decision, Retry};
    /// use cancel_scope::{ChildSpec, Scope};
    ///
    /// type Classifier = fn(&&str) -> Decision;
    /// type Op = fn(Attempt) -> Ready<Result<u32, &'static str>>;
    ///
    /// fn call<'a>(
    ///     retry: &'a Retry<Classifier, Vec<std::time::Duration>>,
    ///     scope: &'a Scope,
    /// ) -> retry::RunWithLedger<'a, Classifier, Vec<std::time::Duration>, Op, Ready<Result<u32, &'static str>>, u32, &'static str> {
    ///     let op: Op = |a| ready(if a.number() < 2 { Err("busy") } else { Ok(a.number()) });
    ///     retry.run_with_ledger(scope, ChildSpec::read_only("db"), op)
    /// }
    ///
    /// let retry = Retry::new((|_| Decision::RetryNow) as Classifier).backoff(Vec::new());
    /// let scope = Scope::new();
    /// let (out, ledger) = call(&retry, &scope).await;
    /// assert_eq!(out.unwrap(), 2);
    /// assert_eq!(ledger.started(), 2);
    /// # }
    /// ```
    #[must_use = "futures do nothing unless polled"]
    pub struct RunWithLedger<'a, C, B, F, Fut, T, E>
    where
        B: IntoIterator,
        Fut: Future,
    {
        #[pin]
        run: Run<'a, C, B, F, Fut, T, E>,
        ledger: Option<Arc<Ledger>>,
    }
}

/// What a step of a poll leads to.
enum Next<T, E> {
    /// Start the next attempt after this wait (at once if zero).
    After(Duration),
    Stop(Stop),
    Pending,
    Ready(Result<T, RetryError<E>>),
}

impl<'a, C, B, F, Fut, T, E> Run<'a, C, B, F, Fut, T, E>
where
    B: IntoIterator,
    Fut: Future,
{
    /// The call of `op` under `retry` in `scope`; nothing happens before its first poll.
    #[inline]
    pub(super) fn new(retry: &'a Retry<C, B>, scope: &'a Scope, spec: ChildSpec, op: F) -> Self {
        Run {
            state: State::Start { scope, spec },
            last: None,
            backoff: None,
            call: None,
            op,
            retry,
            endpoint: 0,
            output: PhantomData,
        }
    }
}

impl<'a, C, B, F, Fut, T, E> Run<'a, C, B, F, Fut, T, E>
where
    C: Classify<E>,
    B: IntoIterator<Item = Duration> + Clone,
    F: FnMut(Attempt) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    /// Polls the call; it puts the ledger into `keep` if given one when it ends. The outcome
    /// is returned alone, not in a tuple with the ledger: `run` would copy it out of the
    /// tuple right after it was written (a store-forwarding stall on every call), and it
    /// needs no ledger of its own (the report's is moved, not shared).
    #[inline]
    fn poll_call(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut keep: Option<&mut Option<Arc<Ledger>>>,
    ) -> Poll<Result<T, RetryError<E>>> {
        let this = self.project();
        let retry: &'a Retry<C, B> = this.retry;
        let mut polling = Polling {
            call: this.call,
            state: this.state,
        };
        loop {
            let next = match polling.state.as_mut().project() {
                StateProj::Start { .. } => {
                    let StateOwn::Start { scope, spec } =
                        polling.state.as_mut().project_replace(State::Idle)
                    else {
                        unreachable!("a call starts from its start");
                    };
                    let mut call = Call::open(scope, spec, retry.limits, retry.budget.as_deref());
                    if let Err(stop) = call.admit(false) {
                        // Not attached: the scope refused the call.
                        let ledger = call.refused(&stop);
                        Next::Ready(Err(RetryError::new(
                            stop,
                            None,
                            kept(keep.as_deref_mut(), ledger),
                        )))
                    } else {
                        // From here on, a call dropped or unwound before it ends attaches its
                        // ledger all the same, while it still holds the scope.
                        *polling.call = Some(call);
                        Next::After(Duration::ZERO)
                    }
                }
                StateProj::Sleeping { sleep, cancel } => {
                    // Biased toward the cancel: a cancel and the sleep's end at once stop it.
                    if let Poll::Ready(cause) = cancel.poll_cancelled(cx) {
                        Next::Stop(Stop::Cancelled(cause))
                    } else if sleep.poll(cx).is_pending() {
                        Next::Pending
                    } else {
                        polling.state.set(State::Idle);
                        Next::After(Duration::ZERO)
                    }
                }
                StateProj::Attempting { index, run } => {
                    let index = *index;
                    let Some(call) = polling.call.as_mut() else {
                        unreachable!("an attempt runs in a call");
                    };
                    // The work is user code: a panic of its poll ends the call `Panicked`.
                    let unwinding = OnUnwind::new(call, Some(index), true);
                    let polled = run.poll(cx);
                    unwinding.pass();
                    match polled {
                        Poll::Pending => Next::Pending,
                        Poll::Ready((out, dispatched)) => {
                            // The work has stopped; its run goes before the receipt.
                            polling.state.set(State::Idle);
                            match out {
                                // The fast path of a success (often the first attempt): no
                                // hold, no verdict.
                                Ok(Ok(value)) => {
                                    let Some(call) = polling.call.take() else {
                                        unreachable!("an attempt runs in a call");
                                    };
                                    let ledger = call.succeed(index, dispatched, keep.is_some());
                                    if let Some(keep) = keep.as_deref_mut() {
                                        *keep = ledger;
                                    }
                                    Next::Ready(Ok(value))
                                }
                                out => judged(
                                    polling.call,
                                    retry,
                                    this.last,
                                    this.backoff,
                                    this.endpoint,
                                    (index, dispatched, out),
                                    keep.as_deref_mut(),
                                ),
                            }
                        }
                    }
                }
                StateProj::Idle => panic!("`retry::Run` polled after it completed"),
            };
            let stop = match next {
                Next::Pending => {
                    polling.pass();
                    return Poll::Pending;
                }
                Next::Ready(out) => {
                    polling.pass();
                    return Poll::Ready(out);
                }
                Next::Stop(stop) => stop,
                Next::After(wait) => {
                    let Some(call) = polling.call.as_mut() else {
                        unreachable!("an attempt starts in a call");
                    };
                    match begin(call, polling.state.as_mut(), this.op, *this.endpoint, wait) {
                        Ok(()) => continue,
                        Err(stop) => stop,
                    }
                }
            };
            // A sleep cut short goes before the call ends.
            polling.state.set(State::Idle);
            let Some(call) = polling.call.take() else {
                unreachable!("a call stops once");
            };
            polling.pass();
            let ledger = call.close(&stop);
            return Poll::Ready(Err(RetryError::new(
                stop,
                this.last.take(),
                kept(keep.as_deref_mut(), ledger),
            )));
        }
    }
}

/// The next attempt after `wait`: a backoff sleep first unless `wait` is zero, or the attempt
/// started and `op` called for it.
#[inline(always)]
fn begin<'a, F, Fut>(
    call: &mut Call<'a>,
    mut state: Pin<&mut State<'a, Fut>>,
    op: &mut F,
    endpoint: u32,
    wait: Duration,
) -> Result<(), Stop>
where
    F: FnMut(Attempt) -> Fut,
    Fut: Future,
{
    if !wait.is_zero() {
        // The sleep pays from the budget: skip it if nothing could start after it.
        call.check_after(wait).and_then(|()| call.prepay_retry())?;
        let cancel = call.scope.cancelled();
        state.set(State::Sleeping {
            sleep: tokio::time::sleep(wait),
            cancel,
        });
        return Ok(());
    }
    let Started {
        dispatched,
        index,
        attempt,
    } = call.start(false, endpoint)?;
    // The attempt runs on its ticket's handle, which comes back for the receipt; the ticket
    // is kept with the call while `op` runs.
    let held = Keep::new(call, index, dispatched);
    let fut = op(attempt);
    let run = held.run(fut);
    state.set(State::Attempting { index, run });
    Ok(())
}

/// What follows an attempt that ended without success (`ended`: its index, ticket and
/// outcome): its verdict (the classifier judges an error), then the wait before the next
/// attempt, or why the call stops.
fn judged<C, B, T, E>(
    slot: &mut Option<Call<'_>>,
    retry: &Retry<C, B>,
    last: &mut Option<E>,
    backoff: &mut Option<B::IntoIter>,
    endpoint: &mut u32,
    ended: (usize, OwnTicket, Result<Result<T, E>, Error>),
    keep: Option<&mut Option<Arc<Ledger>>>,
) -> Next<T, E>
where
    C: Classify<E>,
    B: IntoIterator<Item = Duration> + Clone,
{
    let (index, dispatched, out) = ended;
    let Some(call) = slot.as_mut() else {
        unreachable!("an attempt runs in a call");
    };
    let (verdict, error) =
        Keep::new(call, index, dispatched).judge(out, &retry.classify, retry.on_timeout);
    if error.is_some() {
        *last = error;
    }
    let decision = match verdict {
        // (Not reached: a success takes the fast path.)
        Verdict::Success(value) => {
            let Some(call) = slot.take() else {
                unreachable!("an attempt runs in a call");
            };
            kept(keep, call.close(&Stop::Succeeded));
            return Next::Ready(Ok(value));
        }
        Verdict::Stop(stop) => return Next::Stop(stop),
        Verdict::Again(decision) => decision,
    };
    if call.attempts_left() == 0 {
        return Next::Stop(Stop::AttemptsExhausted);
    }
    match decision {
        Decision::RetryNow => Next::After(Duration::ZERO),
        Decision::RetryAfter(hint) | Decision::EffectUnknownAfter(hint) => {
            match call.after_pushback(hint) {
                Err(stop) => Next::Stop(stop),
                Ok(_) => Next::After(hint),
            }
        }
        decision => {
            if decision == Decision::SwitchEndpoint {
                *endpoint = endpoint.wrapping_add(1);
            }
            // The schedule is the user's code: a panic there ends the call `Panicked`.
            let unwinding = OnUnwind::new(call, None, false);
            let next = backoff
                .get_or_insert_with(|| retry.backoff.clone().into_iter())
                .next();
            unwinding.pass();
            match next {
                Some(d) => Next::After(d),
                None => Next::Stop(Stop::BackoffExhausted),
            }
        }
    }
}

/// The call and its state in the keeping of one poll: unwound by a panic there, it ends the
/// call ([`Call::abandon`]: [`Stop::Dropped`], unless a guard of user code ended it
/// [`Stop::Panicked`] first), then drops the state (the attempt in flight stops and records
/// its default receipt) and the call, before the panic leaves the poll. Passed (no cost) when
/// the poll returns.
struct Polling<'p, 'a, Fut: Future> {
    call: &'p mut Option<Call<'a>>,
    state: Pin<&'p mut State<'a, Fut>>,
}

impl<Fut: Future> Polling<'_, '_, Fut> {
    #[inline(always)]
    fn pass(self) {
        std::mem::forget(self);
    }
}

impl<Fut: Future> Drop for Polling<'_, '_, Fut> {
    fn drop(&mut self) {
        if let Some(call) = self.call.as_mut() {
            call.abandon(None, false, false);
        }
        self.state.set(State::Idle);
        *self.call = None;
    }
}

impl<C, B, F, Fut, T, E> Future for Run<'_, C, B, F, Fut, T, E>
where
    C: Classify<E>,
    B: IntoIterator<Item = Duration> + Clone,
    F: FnMut(Attempt) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    type Output = Result<T, RetryError<E>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.poll_call(cx, None)
    }
}

impl<'a, C, B, F, Fut, T, E> RunWithLedger<'a, C, B, F, Fut, T, E>
where
    B: IntoIterator,
    Fut: Future,
{
    #[inline]
    pub(super) fn new(run: Run<'a, C, B, F, Fut, T, E>) -> Self {
        RunWithLedger { run, ledger: None }
    }
}

impl<C, B, F, Fut, T, E> Future for RunWithLedger<'_, C, B, F, Fut, T, E>
where
    C: Classify<E>,
    B: IntoIterator<Item = Duration> + Clone,
    F: FnMut(Attempt) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    type Output = (Result<T, RetryError<E>>, Arc<Ledger>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let out = std::task::ready!(this.run.poll_call(cx, Some(this.ledger)));
        let Some(ledger) = this.ledger.take() else {
            unreachable!("every call leaves its ledger when asked to");
        };
        Poll::Ready((out, ledger))
    }
}

/// Puts a copy of `ledger` into `keep`, if given one; returns `ledger`.
fn kept(keep: Option<&mut Option<Arc<Ledger>>>, ledger: Arc<Ledger>) -> Arc<Ledger> {
    if let Some(keep) = keep {
        *keep = Some(ledger.clone());
    }
    ledger
}
