//! How a retry or hedge call stopped ([`Stop`]), and how each of its attempts ended
//! ([`AttemptEnd`]).

use std::fmt;
use std::time::Duration;

use super::classify::Decision;
use crate::cause::Cause;

/// Why a retry or hedge call stopped starting attempts.
///
/// # Examples
///
/// ```
/// use cancel_scope::retry::Stop;
/// assert!(Stop::ReserveReached.is_budget_exhausted());
/// assert!(!Stop::NotRetryable.is_budget_exhausted());
/// assert!(!Stop::Dropped.is_deadline_exceeded());
/// ```
///
/// A call dropped by a `timeout` around it still leaves its ledger in the scope's report:
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::retry::{AttemptEnd, Decision, Retry, Stop};
/// use cancel_scope::{ChildSpec, Scope};
///
/// let scope = Scope::with_timeout(Duration::from_secs(1));
/// let retry = Retry::new(|_: &()| Decision::Backoff);
/// let call = retry.run(&scope, ChildSpec::read_only("db"), |_| {
///     std::future::pending::<Result<(), ()>>()
/// });
/// assert!(tokio::time::timeout(Duration::from_millis(50), call).await.is_err());
/// scope.close();
/// let report = scope.quiesce().await;
/// let ledger = report.retry_ledgers()[0];
/// assert_eq!(ledger.stop(), Some(&Stop::Dropped));
/// assert_eq!(ledger.attempts()[0].end(), Some(AttemptEnd::Stopped));
/// assert_eq!(report.cancelled(), 1); // the read-only attempt's receipt
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stop {
    /// An attempt succeeded.
    Succeeded,
    /// The scope was cancelled (its deadline, an explicit cancel, the client leaving): the
    /// attempt in flight was stopped and no other starts.
    Cancelled(Cause),
    /// The scope's registration watermark was closed: no new work may start.
    Closed,
    /// Every allowed attempt was made.
    AttemptsExhausted,
    /// The response-reserve line was reached: the time left belongs to the response, even if
    /// attempts remain.
    ReserveReached,
    /// The next attempt would get less than the minimum useful budget.
    BelowMinUseful,
    /// The error was classified [`Decision::Never`].
    NotRetryable,
    /// Side-effecting work failed and is not retried.
    NotIdempotent,
    /// Side-effecting work ended with an unknown effect (timed out after dispatch, or an error
    /// classified [`Decision::EffectUnknown`]): recorded for reconciliation, not retried.
    EffectUnknown,
    /// The dependency asked to come back later than the last moment an attempt may start.
    RetryAfterTooLong(Duration),
    /// The next delay of the backoff schedule would end later than the last moment an attempt
    /// may start (the deadline, less the reserve and the minimum useful budget): it is not
    /// slept.
    BackoffTooLong(Duration),
    /// The process-wide [`RetryBudget`](super::RetryBudget) refused the retry.
    RetryBudget,
    /// The backoff schedule ended.
    BackoffExhausted,
    /// User code the call ran panicked: an attempt's operation (`op`, or the future it
    /// returned) or the classifier. The panic goes on after the ledger, finished so, is
    /// attached to the scope's report; the attempt it came from is recorded
    /// [`AttemptEnd::Panicked`].
    Panicked,
    /// The call's future was dropped before the call ended (by a `timeout` or `select!` around
    /// it, or its task's abort), during an attempt or a backoff sleep. Only in the ledger
    /// attached to the scope's report (the caller gets no result): the attempts in flight are
    /// recorded [`AttemptEnd::Stopped`] at the drop, and get the receipts a dropped attempt
    /// records (`Cancelled` for read-only work, `EffectUnknown` otherwise).
    Dropped,
}

impl Stop {
    /// Whether the scope's deadline (or an ancestor's) passed: a cancel whose cause is
    /// [`Cause::DeadlineExceeded`].
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{retry::Stop, Cause};
    /// assert!(Stop::Cancelled(Cause::DeadlineExceeded).is_deadline_exceeded());
    /// assert!(!Stop::BelowMinUseful.is_deadline_exceeded());
    /// ```
    pub fn is_deadline_exceeded(&self) -> bool {
        matches!(self, Stop::Cancelled(c) if c.is_deadline_exceeded())
    }

    /// Whether too little budget was left for another attempt to be useful: the reserve line,
    /// the minimum useful budget, a retry hint or a backoff delay past the last start.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::retry::Stop;
    /// assert!(Stop::ReserveReached.is_budget_exhausted());
    /// assert!(Stop::BackoffTooLong(Duration::from_secs(1)).is_budget_exhausted());
    /// assert!(!Stop::AttemptsExhausted.is_budget_exhausted());
    /// ```
    pub fn is_budget_exhausted(&self) -> bool {
        matches!(
            self,
            Stop::ReserveReached
                | Stop::BelowMinUseful
                | Stop::RetryAfterTooLong(_)
                | Stop::BackoffTooLong(_)
        )
    }

    /// Whether the call stopped because the budget ran out: [`is_deadline_exceeded`] or
    /// [`is_budget_exhausted`].
    ///
    /// [`is_deadline_exceeded`]: Self::is_deadline_exceeded
    /// [`is_budget_exhausted`]: Self::is_budget_exhausted
    ///
    /// # Examples
    ///
    /// ```
    /// # #![allow(deprecated)]
    /// use cancel_scope::{retry::Stop, Cause};
    /// assert!(Stop::Cancelled(Cause::DeadlineExceeded).is_out_of_time());
    /// assert!(!Stop::Cancelled(Cause::ClientGone).is_out_of_time());
    /// ```
    #[deprecated(
        since = "0.1.0",
        note = "the predicates of every error type: use `is_deadline_exceeded() || is_budget_exhausted()`"
    )]
    pub fn is_out_of_time(&self) -> bool {
        self.is_deadline_exceeded() || self.is_budget_exhausted()
    }
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stop::Succeeded => f.write_str("succeeded"),
            Stop::Cancelled(c) => write!(f, "scope cancelled ({c})"),
            Stop::Closed => f.write_str("scope closed"),
            Stop::AttemptsExhausted => f.write_str("attempts exhausted"),
            Stop::ReserveReached => f.write_str("response reserve reached"),
            Stop::BelowMinUseful => f.write_str("less than the minimum useful budget left"),
            Stop::NotRetryable => f.write_str("error not retryable"),
            Stop::NotIdempotent => f.write_str("side-effecting work is not retried"),
            Stop::EffectUnknown => f.write_str("effect unknown"),
            Stop::RetryAfterTooLong(d) => write!(f, "retry-after {d:?} is past the last start"),
            Stop::BackoffTooLong(d) => {
                write!(f, "the next backoff ({d:?}) ends past the last start")
            }
            Stop::RetryBudget => f.write_str("retry budget exhausted"),
            Stop::BackoffExhausted => f.write_str("backoff schedule ended"),
            Stop::Panicked => f.write_str("attempt panicked"),
            Stop::Dropped => f.write_str("call dropped"),
        }
    }
}

/// How one attempt ended.
///
/// # Examples
///
/// ```
/// use cancel_scope::retry::{AttemptEnd, Decision};
/// assert!(AttemptEnd::Succeeded.is_success());
/// assert!(!AttemptEnd::Failed(Decision::Backoff).is_success());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttemptEnd {
    /// It succeeded.
    Succeeded,
    /// It returned an error, classified so.
    Failed(Decision),
    /// Its own budget ran out.
    TimedOut,
    /// It was stopped: the scope was cancelled, another attempt won the hedge, or the call
    /// was dropped while it ran ([`Stop::Dropped`]).
    Stopped,
    /// It panicked.
    Panicked,
}

impl AttemptEnd {
    /// Whether the attempt succeeded.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::retry::AttemptEnd;
    /// assert!(!AttemptEnd::TimedOut.is_success());
    /// ```
    pub fn is_success(self) -> bool {
        matches!(self, AttemptEnd::Succeeded)
    }
}
