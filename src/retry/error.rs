//! The error of a retry, hedge or fan-out call.

use std::fmt;
use std::sync::Arc;

use super::ledger::Ledger;
use super::stop::{AttemptEnd, Stop};
use crate::cause::Cause;

/// A retry or hedge call that did not succeed: why it stopped, the last attempt's error (if an
/// attempt returned one) and the call's [`Ledger`].
///
/// The `Display` text is for people and is not part of the API; it needs nothing of `E` (the last
/// error is the [`source`](std::error::Error::source)), its alternate form `{:#}` lists the
/// ledger's attempts, and `Debug` is short.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::{retry::{Decision, Retry, Stop}, ChildSpec, Scope};
///
/// let scope = Scope::with_timeout(Duration::from_millis(500));
/// let retry = Retry::new(|_: &&str| Decision::Never);
/// let err = retry
///     .run(&scope, ChildSpec::read_only("users"), |_| async { Err::<(), _>("invalid argument") })
///     .await
///     .unwrap_err();
/// assert_eq!(err.stop(), &Stop::NotRetryable);
/// assert_eq!(err.last_error(), Some(&"invalid argument"));
/// assert_eq!(err.ledger().started(), 1);
/// # }
/// ```
pub struct RetryError<E> {
    stop: Stop,
    last: Option<E>,
    ledger: Arc<Ledger>,
}

impl<E> RetryError<E> {
    pub(crate) fn new(stop: Stop, last: Option<E>, ledger: Arc<Ledger>) -> Self {
        RetryError { stop, last, ledger }
    }

    /// Why the call stopped.
    ///
    /// # Examples
    ///
    /// See [`RetryError`].
    pub fn stop(&self) -> &Stop {
        &self.stop
    }

    /// The error of the last attempt that returned one (`None` if no attempt did: none started,
    /// or they timed out or were cancelled). An error a hedge's other attempts returned while
    /// the call waited for them, after it had stopped, does not replace it: it is in the
    /// ledger ([`AttemptEnd::Failed`](super::AttemptEnd::Failed)), not here.
    ///
    /// # Examples
    ///
    /// See [`RetryError`].
    pub fn last_error(&self) -> Option<&E> {
        self.last.as_ref()
    }

    /// Takes the last attempt's error.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// # use cancel_scope::{retry::{Decision, Retry}, ChildSpec, Scope};
    /// let err = Retry::new(|_: &u8| Decision::Never)
    ///     .run(&Scope::new(), ChildSpec::read_only("x"), |_| async { Err::<(), _>(7u8) })
    ///     .await
    ///     .unwrap_err();
    /// assert_eq!(err.into_last_error(), Some(7));
    /// # }
    /// ```
    pub fn into_last_error(self) -> Option<E> {
        self.last
    }

    /// The call's ledger.
    ///
    /// # Examples
    ///
    /// See [`RetryError`].
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// Whether the scope was cancelled (for any cause).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use cancel_scope::{retry::{Decision, Retry}, ChildSpec, Scope};
    /// let scope = Scope::new();
    /// scope.cancel();
    /// let err = Retry::new(|_: &()| Decision::Backoff)
    ///     .run(&scope, ChildSpec::read_only("x"), |_| async { Ok::<_, ()>(()) })
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.is_cancelled());
    /// assert_eq!(err.ledger().started(), 0); // nothing starts after a cancel
    /// # }
    /// ```
    pub fn is_cancelled(&self) -> bool {
        matches!(self.stop, Stop::Cancelled(_))
    }

    /// Whether the scope's deadline (or an ancestor's) passed: the attempt in flight was
    /// stopped and no other starts. Also [`is_cancelled`](Self::is_cancelled).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// # use std::time::Duration;
    /// # use cancel_scope::{retry::{Decision, Retry}, ChildSpec, Scope};
    /// let scope = Scope::with_timeout(Duration::from_millis(100));
    /// let err = Retry::new(|_: &()| Decision::Backoff)
    ///     .run(&scope, ChildSpec::read_only("x"), |_| std::future::pending::<Result<(), ()>>())
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.is_deadline_exceeded() && err.is_cancelled());
    /// # }
    /// ```
    pub fn is_deadline_exceeded(&self) -> bool {
        self.stop.is_deadline_exceeded()
    }

    /// Whether too little budget was left for another attempt to be useful: the reserve line,
    /// the minimum useful budget, a retry hint or a backoff delay past the last start.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// # use std::time::Duration;
    /// # use cancel_scope::{retry::{Decision, Retry}, ChildSpec, Scope};
    /// let scope = Scope::with_timeout(Duration::from_millis(100));
    /// let err = Retry::new(|_: &()| Decision::Backoff)
    ///     .min_useful(Duration::from_millis(300)) // the dependency's p95
    ///     .run(&scope, ChildSpec::read_only("x"), |_| async { Ok::<_, ()>(()) })
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.is_budget_exhausted());
    /// # }
    /// ```
    pub fn is_budget_exhausted(&self) -> bool {
        self.stop.is_budget_exhausted()
    }

    /// Whether the client the scope served went away. Also
    /// [`is_cancelled`](Self::is_cancelled).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use cancel_scope::{retry::{Decision, Retry}, Cause, ChildSpec, Scope};
    /// let scope = Scope::new();
    /// scope.cancel_because(Cause::ClientGone);
    /// let err = Retry::new(|_: &()| Decision::Backoff)
    ///     .run(&scope, ChildSpec::read_only("x"), |_| async { Ok::<_, ()>(()) })
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.is_client_gone());
    /// # }
    /// ```
    pub fn is_client_gone(&self) -> bool {
        self.cause().is_some_and(Cause::is_client_gone)
    }

    /// Whether the call ran out of time: [`is_deadline_exceeded`] or [`is_budget_exhausted`].
    ///
    /// [`is_deadline_exceeded`]: Self::is_deadline_exceeded
    /// [`is_budget_exhausted`]: Self::is_budget_exhausted
    ///
    /// # Examples
    ///
    /// ```
    /// # #![allow(deprecated)]
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// # use std::time::Duration;
    /// # use cancel_scope::{retry::{Decision, Retry}, ChildSpec, Scope};
    /// let scope = Scope::with_timeout(Duration::from_millis(100));
    /// let err = Retry::new(|_: &()| Decision::Backoff)
    ///     .min_useful(Duration::from_millis(300))
    ///     .run(&scope, ChildSpec::read_only("x"), |_| async { Ok::<_, ()>(()) })
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.is_out_of_time());
    /// # }
    /// ```
    #[deprecated(
        since = "0.1.0",
        note = "the predicates of every error type: use `is_deadline_exceeded() || is_budget_exhausted()`"
    )]
    pub fn is_out_of_time(&self) -> bool {
        self.is_deadline_exceeded() || self.is_budget_exhausted()
    }

    /// The cancel cause, when [`is_cancelled`](Self::is_cancelled).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use cancel_scope::{retry::{Decision, Retry}, Cause, ChildSpec, Scope};
    /// let scope = Scope::new();
    /// scope.cancel_because(Cause::ClientGone);
    /// let err = Retry::new(|_: &()| Decision::Backoff)
    ///     .run(&scope, ChildSpec::read_only("x"), |_| async { Ok::<_, ()>(()) })
    ///     .await
    ///     .unwrap_err();
    /// assert_eq!(err.cause(), Some(&Cause::ClientGone));
    /// # }
    /// ```
    pub fn cause(&self) -> Option<&Cause> {
        match &self.stop {
            Stop::Cancelled(c) => Some(c),
            _ => None,
        }
    }
}

/// Short and structured: the dependency, why the call stopped, how many attempts it made
/// and the last error. The whole ledger is [`ledger`](RetryError::ledger), or the alternate
/// `Display` (`{:#}`).
impl<E: fmt::Debug> fmt::Debug for RetryError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryError")
            .field("dependency", &self.ledger.dependency())
            .field("stop", &self.stop)
            .field("attempts", &self.ledger.started())
            .field("elapsed", &self.ledger.elapsed())
            .field("last_error", &self.last)
            .finish()
    }
}

/// What stopped the call and how its last attempt ended, for any error type: the last error
/// itself is not repeated (it is the error's [`source`](std::error::Error::source) when it is
/// an error, and [`last_error`](RetryError::last_error) in any case; an error reporter that
/// prints the chain, such as `anyhow`'s `{:#}`, shows it).
///
/// The alternate form (`{:#}`) adds the ledger, one line per attempt.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::{retry::{Decision, Retry}, ChildSpec, Scope};
///
/// struct Unavailable; // not `Display`, not `Debug`
/// let scope = Scope::with_timeout(Duration::from_secs(1));
/// let err = Retry::new(|_: &Unavailable| Decision::RetryNow)
///     .max_attempts(2)
///     .run(&scope, ChildSpec::read_only("stock"), |_| async { Err::<(), _>(Unavailable) })
///     .await
///     .unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "stock: gave up after 2 of 2 attempts in 0ns: attempts exhausted \
///      (the last attempt failed: RetryNow)"
/// );
/// let ledger = format!("{err:#}");
/// assert!(ledger.ends_with("\n  attempt 2 at +0ns, budget 1s: failed: RetryNow"), "{ledger}");
/// # }
/// ```
impl<E> fmt::Display for RetryError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = &self.ledger;
        write!(
            f,
            "{}: gave up after {} of {} attempts in {:?}: {}",
            l.dependency(),
            l.started(),
            l.max_attempts(),
            l.elapsed(),
            self.stop
        )?;
        match l.attempts().last().and_then(|a| a.end()) {
            Some(end) => write!(f, " (the last attempt {})", Ended(end))?,
            None if l.started() == 0 => f.write_str(" (no attempt started)")?,
            None => {}
        }
        if f.alternate() {
            for a in l.attempts() {
                let at = a.started_at().saturating_duration_since(l.began());
                write!(f, "\n  attempt {} at +{at:?}", a.number())?;
                if a.is_hedge() {
                    f.write_str(" (hedge)")?;
                }
                if a.endpoint() > 0 {
                    write!(f, " on endpoint {}", a.endpoint())?;
                }
                match a.budget() {
                    Some(b) => write!(f, ", budget {b:?}")?,
                    None => f.write_str(", unbounded")?,
                }
                match a.end() {
                    Some(end) => write!(f, ": {}", Ended(end))?,
                    None => f.write_str(": in flight")?,
                }
            }
        }
        Ok(())
    }
}

/// How an attempt ended, as the `Display` of [`RetryError`] says it.
struct Ended(AttemptEnd);

impl fmt::Display for Ended {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            AttemptEnd::Succeeded => f.write_str("succeeded"),
            AttemptEnd::Failed(d) => write!(f, "failed: {d:?}"),
            AttemptEnd::TimedOut => f.write_str("ran out of its budget"),
            AttemptEnd::Stopped => f.write_str("was stopped"),
            AttemptEnd::Panicked => f.write_str("panicked"),
        }
    }
}

impl<E> std::error::Error for RetryError<E>
where
    E: std::error::Error + 'static,
{
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.last.as_ref().map(|e| e as _)
    }
}
