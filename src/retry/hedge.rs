//! Hedged requests: a second attempt after a delay, the first success wins.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::attempt::{Limits, Started, Unknown, Verdict};
use super::call::Call;
use super::call_guards::Live;
use super::classify::{Classify, Decision};
use super::error::RetryError;
use super::ledger::Ledger;
use super::stop::{AttemptEnd, Stop};
use super::{Attempt, Retry};
use crate::budget::Split;
use crate::child::{Finished, InFlight};
use crate::panic::Caught;
use crate::scope::Scope;
use crate::spec::ChildSpec;
use crate::sync::Mutex;
use crate::time::sleepable_after;

/// When a hedge starts after the attempt before it.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use cancel_scope::retry::{HedgeDelay, Latencies};
/// let fixed = HedgeDelay::Fixed(Duration::from_millis(40));
/// let p95 = HedgeDelay::Percentile {
///     latencies: Arc::new(Latencies::new(256)),
///     percentile: 95,
///     fallback: Duration::from_millis(40), // until enough latencies are known
/// };
/// # let _ = (fixed, p95);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum HedgeDelay {
    /// A fixed delay.
    Fixed(Duration),
    /// The dependency's observed latency percentile (successful attempts of hedge calls are
    /// recorded into `latencies`; you may record more), or `fallback` while fewer than 10 are
    /// known (or, in a window that holds fewer, until it is full).
    Percentile {
        /// The observed latencies.
        latencies: Arc<Latencies>,
        /// Which percentile (0–100; larger values are taken as 100).
        percentile: u8,
        /// The delay while too few latencies are known.
        fallback: Duration,
    },
}

impl HedgeDelay {
    fn delay(&self) -> Duration {
        match self {
            HedgeDelay::Fixed(d) => *d,
            HedgeDelay::Percentile {
                latencies,
                percentile,
                fallback,
            } => {
                // A window that holds fewer than 10 is used once it is full.
                if latencies.len() < latencies.capacity.min(10) {
                    *fallback
                } else {
                    latencies.percentile(*percentile).unwrap_or(*fallback)
                }
            }
        }
    }

    fn record(&self, latency: Duration) {
        if let HedgeDelay::Percentile { latencies, .. } = self {
            latencies.record(latency);
        }
    }
}

/// The most recent latencies of a dependency (a bounded window), for percentile hedge delays.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::retry::Latencies;
/// let l = Latencies::new(100);
/// for ms in 1..=100 {
///     l.record(Duration::from_millis(ms));
/// }
/// assert_eq!(l.percentile(95), Some(Duration::from_millis(95)));
/// assert_eq!(l.percentile(50), Some(Duration::from_millis(50)));
/// ```
pub struct Latencies {
    capacity: usize,
    window: Mutex<VecDeque<Duration>>,
}

impl Latencies {
    /// A window of the last `capacity` latencies (0 is taken as 1).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::retry::Latencies;
    /// assert!(Latencies::new(64).is_empty());
    /// ```
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Latencies {
            capacity,
            window: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
        }
    }

    /// Records one latency (the oldest goes when the window is full).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::retry::Latencies;
    /// let l = Latencies::new(1);
    /// l.record(Duration::from_millis(5));
    /// l.record(Duration::from_millis(7));
    /// assert_eq!(l.percentile(100), Some(Duration::from_millis(7)));
    /// ```
    pub fn record(&self, latency: Duration) {
        let mut w = self.window.lock();
        if w.len() == self.capacity {
            w.pop_front();
        }
        w.push_back(latency);
    }

    /// The `p`-th percentile (nearest rank) of the window, `None` if it is empty.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::retry::Latencies;
    /// assert_eq!(Latencies::new(8).percentile(99), None);
    /// ```
    pub fn percentile(&self, p: u8) -> Option<Duration> {
        let mut v: Vec<Duration> = self.window.lock().iter().copied().collect();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        let p = usize::from(p.min(100));
        // Nearest rank: ceil(p/100 * n), at least 1.
        let rank = (p * v.len()).div_ceil(100).max(1);
        v.get(rank - 1).copied()
    }

    /// How many latencies the window holds.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::retry::Latencies;
    /// let l = Latencies::new(8);
    /// l.record(Duration::from_millis(1));
    /// assert_eq!(l.len(), 1);
    /// ```
    pub fn len(&self) -> usize {
        self.window.lock().len()
    }

    /// Whether no latency was recorded.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::retry::Latencies;
    /// assert!(Latencies::new(8).is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for Latencies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Latencies")
            .field("capacity", &self.capacity)
            .field("len", &self.len())
            .finish()
    }
}

/// Hedged calls: if an attempt has not answered after a delay, a second one starts (and a third
/// after another delay, up to the policy's maximum attempts and the [`RetryBudget`]); the first
/// success wins, the others are cancelled, and the call returns only after every loser has its
/// receipt — no orphan attempt keeps loading the dependency. A loser stopped by that cancel is
/// recorded [`AttemptEnd::Stopped`]; one whose error came back before the cancel reached it is
/// recorded as the failure it was ([`AttemptEnd::Failed`], classified as any other error).
///
/// Only read-only and idempotent work is hedged (every attempt reuses the idempotency key);
/// side-effecting work makes a single attempt. Hedges overlap, so each may use what is left of
/// the budget (the policy's cap and reserve still apply). An attempt that fails while none is in
/// flight is followed at once by the next, as the classification allows: no backoff is slept,
/// but [`Decision::SwitchEndpoint`] moves the next attempts to the next endpoint, and
/// [`Decision::RetryAfter`] (or `EffectUnknownAfter`) holds every later start (retry or
/// hedge) until the hint has passed, or ends the call with [`Stop::RetryAfterTooLong`] if
/// nothing could start then and nothing is in flight.
///
/// [`Decision::SwitchEndpoint`]: super::Decision::SwitchEndpoint
/// [`Decision::RetryAfter`]: super::Decision::RetryAfter
///
/// [`RetryBudget`]: super::RetryBudget
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::retry::{Decision, HedgeDelay, Retry};
/// use cancel_scope::{ChildSpec, Scope};
///
/// let ms = Duration::from_millis;
/// let request = Scope::with_timeout(ms(1000));
/// let hedge = Retry::new(|_: &()| Decision::Backoff)
///     .max_attempts(2)
///     .hedge(HedgeDelay::Fixed(ms(50)));
/// let (winner, ledger) = hedge
///     .run_with_ledger(&request, ChildSpec::read_only("search"), |a| async move {
///         // The first replica is stuck in a long GC pause; the hedge answers in 10 ms.
///         let took = if a.is_hedge() { ms(10) } else { ms(900) };
///         tokio::time::sleep(took).await;
///         Ok::<_, ()>(a.number())
///     })
///     .await;
/// assert_eq!(winner.unwrap(), 2);
/// assert_eq!((ledger.started(), ledger.hedges(), ledger.peak_concurrent()), (2, 1, 2));
/// assert_eq!(request.remaining(), Some(ms(940)));
///
/// request.close();
/// let report = request.quiesce().await;
/// assert_eq!((report.succeeded(), report.cancelled()), (1, 1)); // the loser has its receipt
/// # }
/// ```
pub struct Hedge<C, B> {
    retry: Retry<C, B>,
    delay: HedgeDelay,
}

impl<C, B> Hedge<C, B> {
    pub(super) fn with(retry: Retry<C, B>, delay: HedgeDelay) -> Self {
        Hedge { retry, delay }
    }

    /// Hedging with `retry`'s limits, classification and budget, a hedge every `delay`: the
    /// former spelling of [`Retry::hedge`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #![allow(deprecated)]
    /// use std::time::Duration;
    /// use cancel_scope::retry::{Decision, Hedge, HedgeDelay, Retry};
    /// let h = Hedge::new(Retry::new(|_: &()| Decision::Backoff), HedgeDelay::Fixed(Duration::from_millis(20)));
    /// # let _ = h;
    /// ```
    #[deprecated(since = "0.1.0", note = "one way to say it: use `retry.hedge(delay)`")]
    pub fn new(retry: Retry<C, B>, delay: HedgeDelay) -> Self {
        retry.hedge(delay)
    }

    /// Runs `op` hedged in `scope`; see [`Hedge`].
    ///
    /// # Errors
    ///
    /// [`RetryError`]: no attempt succeeded (the reason, the last error, the ledger).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future cancels the attempts in flight; each records its receipt when it
    /// has stopped (`Cancelled` for read-only work, `EffectUnknown` otherwise). The call's
    /// ledger is still attached to the scope's report, finished with [`Stop::Dropped`], the
    /// attempts in flight recorded [`AttemptEnd::Stopped`] at the drop.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (attempts are tasks). If `op` or the classifier panics, the
    /// call stops ([`Stop::Panicked`] in its ledger, which is attached to the scope's report),
    /// the other attempts are cancelled and have their receipts, and then the panic comes
    /// out. So does the panic of a waker or `on_cancel` callback run by a receipt or a cancel
    /// of the call, once every attempt is collected.
    ///
    /// # Examples
    ///
    /// See [`Hedge`].
    pub async fn run<T, E, F, Fut>(
        &self,
        scope: &Scope,
        spec: ChildSpec,
        op: F,
    ) -> Result<T, RetryError<E>>
    where
        C: Classify<E>,
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        self.run_with_ledger(scope, spec, op).await.0
    }

    /// [`run`](Self::run), also returning the call's [`Ledger`].
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    ///
    /// # Cancel safety
    ///
    /// As [`run`](Self::run).
    ///
    /// # Panics
    ///
    /// As [`run`](Self::run).
    ///
    /// # Examples
    ///
    /// See [`Hedge`].
    pub async fn run_with_ledger<T, E, F, Fut>(
        &self,
        scope: &Scope,
        spec: ChildSpec,
        mut op: F,
    ) -> (Result<T, RetryError<E>>, Arc<Ledger>)
    where
        C: Classify<E>,
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        let policy = &self.retry;
        // Hedges overlap: each may use what is left, not a share of it.
        let limits = Limits {
            split: Split::Greedy {
                cap: match policy.limits.split {
                    Split::Even { cap } | Split::Greedy { cap } => cap,
                },
            },
            ..policy.limits
        };
        let mut owned = Call::open(scope, spec, limits, policy.budget.as_deref());
        if let Err(stop) = owned.admit(true) {
            // Not attached: the scope refused the call.
            let ledger = owned.refused(&stop);
            return (Err(RetryError::new(stop, None, ledger.clone())), ledger);
        }
        // Dropped before the call ends (its future dropped), this attaches the ledger while
        // the call's hold keeps the scope from quiet; `inflight`, declared after it, has
        // cancelled the attempts by then (their tasks give the receipts when they stop).
        let mut call = Live::new(&mut owned);

        let mut inflight: InFlight<usize, Result<T, E>> = InFlight::new();
        let mut last: Option<E> = None;
        let mut winner: Option<T> = None;
        let mut next_hedge: Option<Instant> = None;
        let mut endpoint = 0u32;
        // The dependency's pushback (`Decision::RetryAfter`): nothing starts before it, and
        // once nothing could start after it, the call ends when nothing is in flight.
        let mut not_before: Option<Instant> = None;
        let mut no_more: Option<Stop> = None;
        // A user's code that panics in the call (`op`, the classifier, an `on_cancel`
        // callback or a waker run by a cancel or a receipt) is kept until every attempt is
        // collected and the call closed (see below), then goes on.
        let mut caught = Caught::default();
        let stop = 'call: {
            // The first attempt (and, later, one after a failure with nothing in flight).
            let mut start_now = true;
            loop {
                if start_now {
                    start_now = false;
                    let hedge = !inflight.is_empty();
                    match call.start(hedge, endpoint) {
                        Ok(Started {
                            dispatched,
                            index,
                            attempt,
                        }) => {
                            let Some(fut) = caught.run(|| op(attempt)) else {
                                // `op` panicked: no work started for this attempt. The others
                                // are collected below, then the panic goes on.
                                caught.run(|| {
                                    call.settle(index, dispatched, AttemptEnd::Panicked, None);
                                });
                                break 'call Stop::Panicked;
                            };
                            inflight.spawn(index, dispatched, fut);
                            // A delay too long to represent never hedges.
                            next_hedge = if call.attempts_left() > 0 {
                                sleepable_after(Instant::now(), self.delay.delay())
                                    .map(|at| not_before.map_or(at, |nb| at.max(nb)))
                            } else {
                                None
                            };
                        }
                        // Nothing more may start: wait for what is in flight, if anything.
                        Err(stop) if inflight.is_empty() => break 'call stop,
                        Err(_) => next_hedge = None,
                    }
                }
                // An attempt that has finished is judged before the scope's cancel is seen: one
                // that succeeded before the cancel reached it wins, as in a sequential retry
                // (its receipt says it succeeded; the call must not say it was cancelled).
                tokio::select! {
                    biased;
                    (index, _, res) = inflight.next() => {
                        let Ok(Finished { dispatched, out }) = res else {
                            // Panicked (its receipt was recorded as the task unwound).
                            call.ledger.get().end(index, AttemptEnd::Panicked, Instant::now());
                            break 'call Stop::Panicked;
                        };
                        let judged = caught.run(|| {
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
                            // The classifier (or a waker run by the receipt) panicked: the
                            // others are collected below, then the panic goes on. A waker's
                            // panic comes after the attempt's end was recorded: an attempt
                            // that succeeded stays the call's success (no attempt panicked;
                            // as when the same waker panics at a receipt given later).
                            let ended = call.ledger.attempts[index].end;
                            call.ledger.get().end(index, AttemptEnd::Panicked, Instant::now());
                            if ended == Some(AttemptEnd::Succeeded) {
                                break 'call Stop::Succeeded;
                            }
                            break 'call Stop::Panicked;
                        };
                        if error.is_some() {
                            last = error;
                        }
                        match verdict {
                            Verdict::Success(value) => {
                                let a = &call.ledger.attempts[index];
                                if let Some(end) = a.ended_at {
                                    self.delay.record(end - a.started_at);
                                }
                                winner = Some(value);
                                break 'call Stop::Succeeded;
                            }
                            Verdict::Stop(stop) => break 'call stop,
                            Verdict::Again(Decision::SwitchEndpoint) => {
                                endpoint = endpoint.wrapping_add(1);
                            }
                            Verdict::Again(
                                Decision::RetryAfter(hint) | Decision::EffectUnknownAfter(hint),
                            ) => {
                                match call.after_pushback(hint) {
                                    Ok(at) => {
                                        not_before = not_before.max(Some(at));
                                        next_hedge = next_hedge.map(|h| h.max(at));
                                    }
                                    Err(stop) if inflight.is_empty() => break 'call stop,
                                    // Nothing more starts: wait for what is in flight, then
                                    // end with this (unless one of them succeeds).
                                    Err(stop) => {
                                        next_hedge = None;
                                        no_more = Some(stop);
                                    }
                                }
                            }
                            Verdict::Again(_) => {}
                        }
                        if inflight.is_empty() {
                            if let Some(stop) = no_more.take() {
                                break 'call stop;
                            }
                            if call.attempts_left() == 0 {
                                break 'call Stop::AttemptsExhausted;
                            }
                            match not_before.filter(|at| *at > Instant::now()) {
                                // Started when the hint has passed (or the scope is cancelled).
                                Some(at) => next_hedge = Some(at),
                                None => start_now = true,
                            }
                        }
                    }
                    cause = scope.cancelled_cause() => break 'call Stop::Cancelled(cause),
                    () = sleep_until(next_hedge), if next_hedge.is_some() => {
                        start_now = true;
                    }
                }
            }
        };
        // Losers (and attempts still running after a failure or a cancel) are cancelled and
        // awaited: the call returns only once every attempt has its receipt.
        // A panic kept (`caught`) waits until every attempt is collected and the call closed,
        // so that none is left running or dropped into its default receipt (a parked loser of
        // a call that succeeded would be reported as an unknown effect).
        caught.run(|| {
            inflight.cancel_all(if stop == Stop::Succeeded {
                "lost the hedge"
            } else {
                "hedged call ended"
            });
        });
        while !inflight.is_empty() {
            let (index, _, res) = inflight.next().await;
            let recorded = caught.run(|| {
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
        call.end();
        let ledger = owned.close(&stop);
        caught.resume();
        match winner {
            Some(value) => (Ok(value), ledger),
            None => (Err(RetryError::new(stop, last, ledger.clone())), ledger),
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl<C, B: fmt::Debug> fmt::Debug for Hedge<C, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hedge")
            .field("retry", &self.retry)
            .field("delay", &self.delay)
            .finish()
    }
}
