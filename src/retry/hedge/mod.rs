//! Hedged requests: a second attempt after a delay, the first success wins.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::classify::Classify;
use super::{Attempt, Retry};
use crate::scope::Scope;
use crate::spec::ChildSpec;
use crate::sync::Mutex;

mod run;

pub use run::{HedgeRun, HedgeRunWithLedger};

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
/// [`AttemptEnd::Stopped`]: super::AttemptEnd::Stopped
/// [`AttemptEnd::Failed`]: super::AttemptEnd::Failed
/// [`Stop::RetryAfterTooLong`]: super::Stop::RetryAfterTooLong
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
    /// Dropping the future ([`HedgeRun`]) cancels the attempts in flight; each records its
    /// receipt when it has stopped (`Cancelled` for read-only work, `EffectUnknown` otherwise). The call's
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
    ///
    /// [`RetryError`]: super::RetryError
    /// [`Stop::Dropped`]: super::Stop::Dropped
    /// [`Stop::Panicked`]: super::Stop::Panicked
    /// [`AttemptEnd::Stopped`]: super::AttemptEnd::Stopped
    pub fn run<'a, T, E, F, Fut>(
        &'a self,
        scope: &'a Scope,
        spec: ChildSpec,
        op: F,
    ) -> HedgeRun<'a, C, B, F, T, E>
    where
        C: Classify<E>,
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        HedgeRun::new(self.run_with_ledger(scope, spec, op))
    }

    /// [`run`](Self::run), also returning the call's [`Ledger`](super::Ledger): its future is
    /// [`HedgeRunWithLedger`].
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
    pub fn run_with_ledger<'a, T, E, F, Fut>(
        &'a self,
        scope: &'a Scope,
        spec: ChildSpec,
        op: F,
    ) -> HedgeRunWithLedger<'a, C, B, F, T, E>
    where
        C: Classify<E>,
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        HedgeRunWithLedger::new(self, scope, spec, op)
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
