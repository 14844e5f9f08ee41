//! What a failed attempt means for the next one.

use std::time::Duration;

/// What to do after an attempt failed: the caller's classification of its error.
///
/// The retry loop applies it within the ledger's limits: whatever the decision, no attempt
/// starts after the scope's cancel, past the response-reserve line, below the minimum useful
/// budget, beyond the maximum number of attempts, or against the process-wide
/// [`RetryBudget`](super::RetryBudget); and side-effecting work never retries.
///
/// # Examples
///
/// The decision table of `docs/design.md`:
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::retry::Decision;
///
/// enum CallError { Connect, InvalidArgument, Unavailable { retry_after: Duration }, WriteTimeout }
///
/// fn classify(e: &CallError) -> Decision {
///     match e {
///         CallError::Connect => Decision::SwitchEndpoint,       // back off, try another node
///         CallError::InvalidArgument => Decision::Never,        // fail at once
///         CallError::Unavailable { retry_after } => Decision::RetryAfter(*retry_after),
///         CallError::WriteTimeout => Decision::EffectUnknown,   // retried only with a key
///     }
/// }
/// assert_eq!(classify(&CallError::InvalidArgument), Decision::Never);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Decision {
    /// Retry at once, without a backoff delay (e.g. a connection that was closed before the
    /// request was written).
    RetryNow,
    /// Retry after the next delay of the backoff schedule.
    Backoff,
    /// Retry after the backoff on another endpoint: [`Attempt::endpoint`](super::Attempt::endpoint)
    /// moves on, for callers that can choose one (e.g. connection refused).
    SwitchEndpoint,
    /// The dependency said when to come back (`Retry-After`, gRPC pushback). Fails fast if that
    /// is later than the last moment an attempt may start (or than any instant that can be
    /// represented, in a scope without deadline).
    RetryAfter(Duration),
    /// Retrying cannot help (invalid argument, not found, permission denied): fail at once.
    Never,
    /// The attempt may have had its effect and nobody knows: retried (after the backoff) only
    /// for read-only or idempotent work, which repeats its idempotency key; side-effecting work
    /// stops with [`Receipt::EffectUnknown`](crate::Receipt::EffectUnknown). An answer whose
    /// `service-effect` header says `unknown` (a server of this crate stopped the request after
    /// it dispatched a possibly-effectful call; `integrations::is_effect_unknown` reads it) is
    /// one, whatever its status.
    EffectUnknown,
    /// As [`EffectUnknown`](Self::EffectUnknown), and the dependency said when to come back
    /// (a `503` with `Retry-After`, gRPC `UNAVAILABLE` with pushback): read-only and idempotent
    /// work retries after that delay, as with [`RetryAfter`](Self::RetryAfter);
    /// side-effecting work stops with [`Receipt::EffectUnknown`](crate::Receipt::EffectUnknown).
    EffectUnknownAfter(Duration),
}

impl Decision {
    /// Whether this decision asks for another attempt at all.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::retry::Decision;
    /// assert!(Decision::Backoff.retries());
    /// assert!(!Decision::Never.retries());
    /// ```
    pub fn retries(self) -> bool {
        !matches!(self, Decision::Never)
    }

    /// Whether the failed attempt may have had its effect ([`EffectUnknown`](Self::EffectUnknown)
    /// or [`EffectUnknownAfter`](Self::EffectUnknownAfter)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::retry::Decision;
    /// assert!(Decision::EffectUnknownAfter(Duration::from_secs(1)).is_effect_unknown());
    /// assert!(!Decision::RetryAfter(Duration::from_secs(1)).is_effect_unknown());
    /// ```
    pub fn is_effect_unknown(self) -> bool {
        matches!(
            self,
            Decision::EffectUnknown | Decision::EffectUnknownAfter(_)
        )
    }

    /// The delay the dependency asked for, if the decision carries one.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::retry::Decision;
    /// let d = Duration::from_millis(250);
    /// assert_eq!(Decision::RetryAfter(d).retry_after(), Some(d));
    /// assert_eq!(Decision::EffectUnknownAfter(d).retry_after(), Some(d));
    /// assert_eq!(Decision::Backoff.retry_after(), None);
    /// ```
    pub fn retry_after(self) -> Option<Duration> {
        match self {
            Decision::RetryAfter(d) | Decision::EffectUnknownAfter(d) => Some(d),
            _ => None,
        }
    }
}

/// Classifies the errors of an operation. Implemented for every `Fn(&E) -> Decision`.
///
/// # Examples
///
/// ```
/// use cancel_scope::retry::{Classify, Decision};
///
/// struct HttpStatus;
/// impl Classify<u16> for HttpStatus {
///     fn classify(&self, status: &u16) -> Decision {
///         match status {
///             429 | 503 => Decision::Backoff,
///             502 => Decision::SwitchEndpoint,
///             _ => Decision::Never,
///         }
///     }
/// }
/// assert_eq!(HttpStatus.classify(&503), Decision::Backoff);
/// assert_eq!((|_: &u16| Decision::Never).classify(&500), Decision::Never);
/// ```
pub trait Classify<E> {
    /// What to do after an attempt failed with `error`.
    fn classify(&self, error: &E) -> Decision;
}

impl<E, F> Classify<E> for F
where
    F: Fn(&E) -> Decision,
{
    fn classify(&self, error: &E) -> Decision {
        self(error)
    }
}
