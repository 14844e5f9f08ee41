//! Retries and hedges that pay from the scope's budget, with one ledger per call.
//!
//! # Why a ledger and not "3 attempts of 300 ms"?
//!
//! Today's retry helpers count attempts and sleeps, and give every attempt a fixed timeout: three
//! attempts of 300 ms plus backoff take a second even when the user was promised 800 ms, the
//! sleeps are free, and a retry in the SDK, one in the sidecar and one in the business code
//! multiply to 27 calls. Here a retry runs *inside* a [`Scope`] and everything it does is paid
//! from that scope's one budget:
//!
//! * **Every attempt is a child.** It gets its own child scope whose budget comes from the
//!   ledger ([`Split::Even`]: `min(cap, remaining / attempts left)`,
//!   or [`Split::Greedy`]: `min(cap, remaining − reserve)`), is
//!   registered and dispatched like any child (so none starts after the scope's cancel —
//!   invariant 2), and ends with a [`Receipt`](crate::Receipt).
//! * **Sleeps pay too.** A backoff delay is slept only while the scope is not cancelled, and
//!   not at all when no attempt could start after it.
//! * **Nothing starts past the reserve line** (the time kept for the response), even with
//!   attempts left, nor with less than the minimum useful budget (e.g. the dependency's p95).
//! * **Only safe work retries.** The [`ChildSpec`] says what the work is: read-only and
//!   idempotent work (every attempt reuses the idempotency key) retries; side-effecting work
//!   makes one attempt, and one that timed out after dispatch ends
//!   [`EffectUnknown`](crate::Receipt::EffectUnknown) — reported for reconciliation, never
//!   counted as "no effect".
//! * **The caller classifies errors** ([`Decision`]): retry now, after a backoff (possibly on
//!   another endpoint), after the dependency's retry-after hint (failing fast if that is too
//!   late), never, or effect unknown.
//! * **One retry owner.** A retry running inside an attempt of another retry for the same
//!   dependency makes a single attempt: three layers of "3 attempts" make 3 calls, not 27.
//! * **A process-wide [`RetryBudget`]** caps retries and hedges to a ratio of requests.
//! * **Hedging** ([`Hedge`]) starts a second attempt after a delay for read-only or idempotent
//!   work; the first success wins and the call returns only after the losers have receipts.
//!
//! Each call's [`Ledger`] (attempts, budgets, elapsed time, concurrency, the last moment the
//! next attempt may start, why it stopped) comes back with the result and appears in the
//! [`Report`](crate::Report::retry_ledgers) of its scope and of every scope above it (the
//! request's report has the ledgers of the calls made below it) — also the ledger of a call
//! dropped before it ended
//! ([`Stop::Dropped`]: a `timeout` around it) or unwound by a panic of its operation or
//! classifier ([`Stop::Panicked`]).
//!
//! # Examples
//!
//! The 800 ms budget of `docs/design.md`, three attempts with a 300 ms hop cap, against a
//! dependency that hangs: the attempts get 266, 267 and 267 ms — never more than the request
//! has.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! use std::time::Duration;
//! use cancel_scope::budget::Split;
//! use cancel_scope::retry::{Decision, Retry};
//! use cancel_scope::{ChildSpec, Scope};
//!
//! let ms = Duration::from_millis;
//! let request = Scope::with_timeout(ms(800));
//! let retry = Retry::new(|_: &std::io::Error| Decision::Backoff)
//!     .max_attempts(3)
//!     .split(Split::Even { cap: Some(ms(300)) })
//!     .backoff(std::iter::repeat(Duration::ZERO));
//!
//! let err = retry
//!     .run(&request, ChildSpec::read_only("libraryd"), |_attempt| async {
//!         std::future::pending::<Result<(), std::io::Error>>().await
//!     })
//!     .await
//!     .unwrap_err();
//! let budgets: Vec<_> = err.ledger().attempts().iter().map(|a| a.budget().unwrap()).collect();
//! assert_eq!(budgets, [ms(266), ms(267), ms(267)]);
//! assert!(err.is_deadline_exceeded()); // the last attempt ran to the request's deadline
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::budget::{Rules, Split};
use crate::scope::Scope;
use crate::spec::ChildSpec;

mod attempt;
mod backoff;
mod boxed;
mod budget;
mod call;
mod call_guards;
mod classify;
mod error;
mod hedge;
mod ledger;
mod run;
mod stop;
#[cfg(feature = "tower-retry")]
mod tower_budget;

pub use attempt::Attempt;
pub use backoff::{backoff_fn, BackoffFn, Exponential, ExponentialIter, Jitter};
pub use boxed::{BoxClassify, BoxRetry};
pub use budget::RetryBudget;
pub use classify::{Classify, Decision};
pub use error::RetryError;
pub use hedge::{Hedge, HedgeDelay, HedgeRun, HedgeRunWithLedger, Latencies};
pub use ledger::{AttemptRecord, Ledger};
pub use run::{Run, RunWithLedger};
pub use stop::{AttemptEnd, Stop};

use attempt::Limits;

/// A retry policy: how many attempts, how they split the budget, what they keep for the
/// response, how long to back off, and how errors are classified. Cheap to clone; reuse it for
/// every call to a dependency.
///
/// Defaults: 3 attempts, [`Split::Even`] without cap, no reserve, no minimum useful budget,
/// [`Exponential`] backoff (10 ms doubling to 1 s, equal jitter), no [`RetryBudget`], and an
/// attempt that runs out of its own budget is retried after the backoff
/// ([`on_timeout`](Self::on_timeout)).
///
/// The attempts' rules only ever tighten: [`reserve`](Self::reserve),
/// [`min_useful`](Self::min_useful) and the per-attempt cap of [`split`](Self::split) set twice
/// keep the stricter value, as a scope's [`ChildBuilder`](crate::ChildBuilder) does: a policy
/// handed on to another layer can be narrowed there, never widened.
///
/// # Examples
///
/// Three layers that each "retry 3 times" the same dependency make 3 calls, not 27: the
/// layers below the first are inside one of its attempts and are not the retry owner.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use std::time::Duration;
/// use cancel_scope::retry::{Decision, Retry, RetryError};
/// use cancel_scope::{ChildSpec, Scope};
///
/// let calls = AtomicU32::new(0);
/// let retry = Retry::new(|_: &RetryError<&str>| Decision::RetryNow).max_attempts(3);
/// let leaf = Retry::new(|_: &&str| Decision::RetryNow).max_attempts(3);
/// let spec = || ChildSpec::read_only("inventory");
/// let request = Scope::with_timeout(Duration::from_secs(10));
///
/// let _ = retry.run(&request, spec(), |a| {
///     let (leaf, calls) = (&leaf, &calls);
///     async move {
///         leaf.run(a.scope(), spec(), |_| async {
///             calls.fetch_add(1, Ordering::SeqCst);
///             Err::<(), _>("unavailable")
///         }).await
///     }
/// }).await;
/// assert_eq!(calls.load(Ordering::SeqCst), 3);
/// # }
/// ```
#[derive(Clone)]
pub struct Retry<C, B = Exponential> {
    classify: C,
    backoff: B,
    limits: Limits,
    budget: Option<Arc<RetryBudget>>,
    on_timeout: Decision,
}

impl<C> Retry<C> {
    /// A policy with the default limits and `classify` to judge errors.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::retry::{Decision, Retry};
    /// let retry = Retry::new(|e: &std::io::Error| match e.kind() {
    ///     std::io::ErrorKind::ConnectionRefused => Decision::SwitchEndpoint,
    ///     std::io::ErrorKind::InvalidInput => Decision::Never,
    ///     _ => Decision::Backoff,
    /// });
    /// # let _ = retry;
    /// ```
    pub fn new(classify: C) -> Self {
        Retry {
            classify,
            backoff: Exponential::default(),
            limits: Limits {
                max_attempts: 3,
                split: Split::Even { cap: None },
                reserve: Duration::ZERO,
                min_useful: Duration::ZERO,
            },
            budget: None,
            on_timeout: Decision::Backoff,
        }
    }
}

impl<C, B> Retry<C, B> {
    /// The most attempts per call, the first included (0 is taken as 1).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::retry::{Decision, Retry};
    /// let retry = Retry::new(|_: &()| Decision::Backoff).max_attempts(5);
    /// # let _ = retry;
    /// ```
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.limits.max_attempts = n.max(1);
        self
    }

    /// How attempts share the budget (default [`Split::Even`] without cap). The cap is the
    /// dependency's per-attempt maximum. Set twice, the later split's way of sharing holds,
    /// with the smaller of the two caps.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{budget::Split, retry::{Decision, Retry}, ChildSpec, Scope};
    /// let ms = Duration::from_millis;
    /// let retry = Retry::new(|_: &()| Decision::Backoff)
    ///     .split(Split::Greedy { cap: Some(ms(500)) })
    ///     .split(Split::Greedy { cap: None }); // keeps the 500 ms cap
    /// let scope = Scope::with_timeout(Duration::from_secs(2));
    /// let got = retry
    ///     .run(&scope, ChildSpec::read_only("db"), |a| async move { Ok(a.remaining()) })
    ///     .await
    ///     .unwrap();
    /// assert_eq!(got, Some(ms(500)));
    /// # }
    /// ```
    pub fn split(mut self, split: Split) -> Self {
        self.limits.split = split.capped(self.limits.split.cap());
        self
    }

    /// Time kept for the response: attempts end this long before the scope's deadline, and
    /// none starts once only this much is left (the reserve line). Set twice, the larger
    /// reserve holds.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{retry::{Decision, Retry}, ChildSpec, Scope};
    /// let scope = Scope::with_timeout(Duration::from_millis(100));
    /// let left = Retry::new(|_: &()| Decision::Backoff)
    ///     .max_attempts(1)
    ///     .reserve(Duration::from_millis(30))
    ///     .run(&scope, ChildSpec::read_only("db"), |a| async move { Ok(a.remaining()) })
    ///     .await
    ///     .unwrap();
    /// assert_eq!(left, Some(Duration::from_millis(70)));
    /// # }
    /// ```
    pub fn reserve(mut self, reserve: Duration) -> Self {
        self.limits.reserve = self.limits.reserve.max(reserve);
        self
    }

    /// The least budget worth an attempt (e.g. the dependency's p95 latency): below it no
    /// attempt starts. Set twice, the larger minimum holds.
    ///
    /// # Examples
    ///
    /// See [`RetryError::is_budget_exhausted`].
    pub fn min_useful(mut self, min_useful: Duration) -> Self {
        self.limits.min_useful = self.limits.min_useful.max(min_useful);
        self
    }

    /// The reserve, cap and minimum useful budget of `rules` at once: the same as
    /// [`reserve`](Self::reserve) and [`min_useful`](Self::min_useful), with the rules' cap
    /// as the per-attempt cap (as a cap in [`split`](Self::split) would be; the way of sharing
    /// stays). Each only tightens what is set already.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{budget::Rules, retry::{Decision, Retry}, ChildSpec, Scope};
    /// let ms = Duration::from_millis;
    /// let scope = Scope::with_timeout(ms(1000));
    /// let got = Retry::new(|_: &()| Decision::Backoff)
    ///     .max_attempts(1)
    ///     .rules(Rules::new().reserve(ms(100)).cap(ms(300)))
    ///     .run(&scope, ChildSpec::read_only("db"), |a| async move { Ok(a.remaining()) })
    ///     .await
    ///     .unwrap();
    /// assert_eq!(got, Some(ms(300)));
    /// # }
    /// ```
    pub fn rules(mut self, rules: Rules) -> Self {
        self.limits.split = self.limits.split.capped(rules.cap);
        self.reserve(rules.reserve).min_useful(rules.min_useful)
    }

    /// The process-wide retry budget every retry after the first attempt must draw from.
    ///
    /// A sequential retry takes its token when it decides to retry, before its backoff sleep
    /// (as Finagle's and gRPC's retry budgets decide at the failure): a refused retry ends the
    /// call at once instead of after a sleep. A hedge takes it when the hedge or retry starts.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::sync::Arc;
    /// use cancel_scope::{retry::{Decision, Retry, RetryBudget, Stop}, ChildSpec, Scope};
    /// let budget = Arc::new(RetryBudget::new(10).burst(1));
    /// let retry = Retry::new(|_: &()| Decision::RetryNow).budget(budget.clone());
    /// let op = |_| async { Err::<(), ()>(()) };
    /// let first = retry.run(&Scope::new(), ChildSpec::read_only("db"), op).await.unwrap_err();
    /// assert_eq!(first.ledger().started(), 2); // one retry from the burst, then refused
    /// assert_eq!(first.stop(), &Stop::RetryBudget);
    /// assert_eq!(budget.refused(), 1);
    /// # }
    /// ```
    pub fn budget(mut self, budget: Arc<RetryBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// What to do when an attempt runs out of its own budget (default [`Decision::Backoff`];
    /// idempotent work then retries with the same key, side-effecting work never retries).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::retry::{Decision, Retry};
    /// let retry = Retry::new(|_: &()| Decision::Backoff).on_timeout(Decision::Never);
    /// # let _ = retry;
    /// ```
    pub fn on_timeout(mut self, decision: Decision) -> Self {
        self.on_timeout = decision;
        self
    }

    /// The backoff schedule: any cloneable iterator of delays (a `Vec`, `std::iter::repeat`,
    /// [`Exponential`]), or [`backoff_fn`] around a function that makes one (a `backon`
    /// builder's `build()`). Each call starts it afresh; when it ends, the retries end.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::retry::{Decision, Retry};
    /// let ms = Duration::from_millis;
    /// let retry = Retry::new(|_: &()| Decision::Backoff).backoff(vec![ms(50), ms(100)]);
    /// # let _ = retry;
    /// ```
    pub fn backoff<B2>(self, backoff: B2) -> Retry<C, B2>
    where
        B2: IntoIterator<Item = Duration> + Clone,
    {
        Retry {
            classify: self.classify,
            backoff,
            limits: self.limits,
            budget: self.budget,
            on_timeout: self.on_timeout,
        }
    }

    /// Hedging with this policy: see [`Hedge`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::retry::{Decision, HedgeDelay, Retry};
    /// let hedge = Retry::new(|_: &()| Decision::Backoff)
    ///     .hedge(HedgeDelay::Fixed(Duration::from_millis(50)));
    /// # let _ = hedge;
    /// ```
    pub fn hedge(self, delay: HedgeDelay) -> Hedge<C, B> {
        Hedge::with(self, delay)
    }
}

impl<C, B> Retry<C, B>
where
    B: IntoIterator<Item = Duration> + Clone,
{
    /// Runs `op` under the policy in `scope`: one registered child per attempt, each with its
    /// budget from the ledger, until an attempt succeeds or a limit stops the call.
    ///
    /// `spec` declares the work ([`ChildSpec::read_only`], [`ChildSpec::idempotent`] — every
    /// attempt reuses the key — or [`ChildSpec::side_effecting`], which never retries); its
    /// name is the dependency (for the one-retry-owner rule and the ledger).
    ///
    /// The call is the returned [`Run`], a future that does nothing until polled (the call
    /// opens at its first poll) and whose type a struct field or a return type can name.
    ///
    /// # Errors
    ///
    /// [`RetryError`] with the reason ([`Stop`]), the last attempt's error and the ledger.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future (a `timeout` or `select!` around it) drops the attempt in flight:
    /// read-only attempts record `Cancelled`, idempotent and side-effecting ones
    /// `EffectUnknown` (nobody will learn their outcome); attempts parked with an unknown
    /// effect stay `EffectUnknown`. The call's ledger is still attached to the scope's report,
    /// finished with [`Stop::Dropped`], the attempt in flight recorded
    /// [`AttemptEnd::Stopped`] at the drop — before the attempt's receipt, so that a
    /// `quiesce()` of the scope that the drop ends reports it.
    ///
    /// # Panics
    ///
    /// If `op`, the future it returned, the classifier or the backoff schedule panics, the
    /// panic comes out of the call; before it does, the ledger is attached to the scope's
    /// report, finished with [`Stop::Panicked`] (the attempt in flight
    /// [`AttemptEnd::Panicked`]), and the attempt records the receipt of a dropped attempt
    /// (`Failed` for read-only work, `EffectUnknown` otherwise). The panic of a waker run by a
    /// receipt of the call comes out of it as well. A call dropped by a panic next to it (in
    /// another branch of a `select!`) is [`Stop::Dropped`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{retry::{Decision, Exponential, Jitter, Retry}, ChildSpec, Scope};
    ///
    /// let ms = Duration::from_millis;
    /// let request = Scope::with_timeout(ms(700));
    /// let retry = Retry::new(|_: &&str| Decision::SwitchEndpoint)
    ///     .backoff(Exponential::new(ms(20), ms(200)).jitter(Jitter::None));
    /// let node = retry
    ///     .run(&request, ChildSpec::read_only("inventory"), |a| async move {
    ///         if a.endpoint() == 0 { Err("connect: connection refused") } else { Ok(a.endpoint()) }
    ///     })
    ///     .await
    ///     .unwrap();
    /// assert_eq!(node, 1); // one retry, after 20 ms, on the next node
    /// assert_eq!(request.remaining(), Some(ms(680)));
    /// # }
    /// ```
    #[inline]
    pub fn run<'a, T, E, F, Fut>(
        &'a self,
        scope: &'a Scope,
        spec: ChildSpec,
        op: F,
    ) -> Run<'a, C, B, F, Fut, T, E>
    where
        C: Classify<E>,
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        Run::new(self, scope, spec, op)
    }

    /// [`run`](Self::run), also returning the call's [`Ledger`] on success: the future is a
    /// [`RunWithLedger`].
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    ///
    /// # Cancel safety
    ///
    /// As [`run`](Self::run): the ledger of a dropped call is in the scope's report only.
    ///
    /// # Panics
    ///
    /// As [`run`](Self::run).
    ///
    /// # Examples
    ///
    /// See [`Ledger`].
    #[inline]
    pub fn run_with_ledger<'a, T, E, F, Fut>(
        &'a self,
        scope: &'a Scope,
        spec: ChildSpec,
        op: F,
    ) -> RunWithLedger<'a, C, B, F, Fut, T, E>
    where
        C: Classify<E>,
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        RunWithLedger::new(Run::new(self, scope, spec, op))
    }
}

impl<C, B: fmt::Debug> fmt::Debug for Retry<C, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("max_attempts", &self.limits.max_attempts)
            .field("split", &self.limits.split)
            .field("reserve", &self.limits.reserve)
            .field("min_useful", &self.limits.min_useful)
            .field("backoff", &self.backoff)
            .field("budget", &self.budget)
            .field("on_timeout", &self.on_timeout)
            .finish_non_exhaustive()
    }
}
