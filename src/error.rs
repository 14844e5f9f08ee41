//! The crate's one error type.

use std::fmt;
use std::time::Duration;

use crate::budget::BudgetExhausted;
use crate::cause::Cause;

/// Why an operation of this crate did not run or did not finish.
///
/// One opaque type with predicates, so that new reasons can be added without breaking callers.
/// The `Display` text is for people and is not part of the API; match on the predicates.
///
/// # Examples
///
/// ```
/// use cancel_scope::Scope;
///
/// let scope = Scope::new();
/// scope.cancel();
/// let err = scope.child().build().unwrap_err();
/// assert!(err.is_cancelled());
/// assert!(!err.is_deadline_exceeded());
/// ```
#[derive(Clone)]
pub struct Error {
    kind: Kind,
}

#[derive(Clone, Debug)]
pub(crate) enum Kind {
    Cancelled(Cause),
    Closed,
    StaleGeneration,
    BudgetExhausted(BudgetExhausted),
    Panicked,
    IdleTimeout(Duration),
}

impl Error {
    pub(crate) fn cancelled(cause: Cause) -> Self {
        Error {
            kind: Kind::Cancelled(cause),
        }
    }
    pub(crate) fn closed() -> Self {
        Error { kind: Kind::Closed }
    }
    pub(crate) fn stale() -> Self {
        Error {
            kind: Kind::StaleGeneration,
        }
    }
    pub(crate) fn exhausted(e: BudgetExhausted) -> Self {
        Error {
            kind: Kind::BudgetExhausted(e),
        }
    }
    pub(crate) fn panicked() -> Self {
        Error {
            kind: Kind::Panicked,
        }
    }
    #[cfg_attr(not(feature = "stream"), allow(dead_code))]
    pub(crate) fn idle(idle: Duration) -> Self {
        Error {
            kind: Kind::IdleTimeout(idle),
        }
    }

    /// The scope was cancelled, for any cause (including its deadline).
    ///
    /// # Examples
    ///
    /// ```
    /// # use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.cancel();
    /// assert!(s.child().build().unwrap_err().is_cancelled());
    /// ```
    pub fn is_cancelled(&self) -> bool {
        matches!(self.kind, Kind::Cancelled(_))
    }

    /// The scope (or an ancestor) ran out of time.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::Scope;
    /// let s = Scope::with_timeout(Duration::from_millis(10));
    /// let err = s.run(std::future::pending::<()>()).await.unwrap_err();
    /// assert!(err.is_deadline_exceeded());
    /// # }
    /// ```
    pub fn is_deadline_exceeded(&self) -> bool {
        matches!(&self.kind, Kind::Cancelled(c) if c.is_deadline_exceeded())
    }

    /// The client the scope served went away.
    ///
    /// # Examples
    ///
    /// ```
    /// # use cancel_scope::{Cause, Scope};
    /// let s = Scope::new();
    /// s.cancel_because(Cause::ClientGone);
    /// assert!(s.child().build().unwrap_err().is_client_gone());
    /// ```
    pub fn is_client_gone(&self) -> bool {
        matches!(&self.kind, Kind::Cancelled(c) if c.is_client_gone())
    }

    /// Too little budget was left for the work to be useful, so it was not started.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::Scope;
    /// let s = Scope::with_timeout(Duration::from_millis(30));
    /// let err = s.child().min_useful(Duration::from_millis(50)).build().unwrap_err();
    /// assert!(err.is_budget_exhausted());
    /// # }
    /// ```
    pub fn is_budget_exhausted(&self) -> bool {
        matches!(self.kind, Kind::BudgetExhausted(_))
    }

    /// The scope's registration watermark was closed ([`Scope::close`](crate::Scope::close))
    /// or a registration came from an older generation: no new work may start.
    ///
    /// # Examples
    ///
    /// ```
    /// # use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.close();
    /// assert!(s.child().build().unwrap_err().is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        matches!(self.kind, Kind::Closed | Kind::StaleGeneration)
    }

    /// A spawned task panicked.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// let h = s.spawn(async { panic!("boom") }).unwrap();
    /// assert!(h.await.unwrap_err().is_panic());
    /// # }
    /// ```
    pub fn is_panic(&self) -> bool {
        matches!(self.kind, Kind::Panicked)
    }

    /// A stream bounded by a scope (`Scope::run_stream`, feature `stream`) had no item for its
    /// idle timeout, and ended. The scope itself goes on.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// # #[cfg(feature = "stream")] {
    /// use std::time::Duration;
    /// use futures::StreamExt;
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// let mut quiet = s.run_stream(futures::stream::pending::<u8>()).idle_timeout(Duration::from_secs(1));
    /// let err = quiet.next().await.unwrap().unwrap_err();
    /// assert!(err.is_idle_timeout() && !err.is_cancelled());
    /// assert_eq!(err.idle_timeout(), Some(Duration::from_secs(1)));
    /// # }
    /// # }
    /// ```
    pub fn is_idle_timeout(&self) -> bool {
        matches!(self.kind, Kind::IdleTimeout(_))
    }

    /// The idle timeout that ran out, when [`is_idle_timeout`](Self::is_idle_timeout).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.cancel();
    /// assert_eq!(s.child().build().unwrap_err().idle_timeout(), None);
    /// ```
    pub fn idle_timeout(&self) -> Option<Duration> {
        match self.kind {
            Kind::IdleTimeout(d) => Some(d),
            _ => None,
        }
    }

    /// The cancel cause, when [`is_cancelled`](Self::is_cancelled).
    ///
    /// # Examples
    ///
    /// ```
    /// # use cancel_scope::{Cause, Scope};
    /// let s = Scope::new();
    /// s.cancel_with("bye");
    /// assert_eq!(s.child().build().unwrap_err().cause(), Some(&Cause::cancelled("bye")));
    /// ```
    pub fn cause(&self) -> Option<&Cause> {
        match &self.kind {
            Kind::Cancelled(c) => Some(c),
            _ => None,
        }
    }

    /// The budget shortfall, when [`is_budget_exhausted`](Self::is_budget_exhausted).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::Scope;
    /// let s = Scope::with_timeout(Duration::from_millis(30));
    /// let err = s.child().min_useful(Duration::from_millis(50)).build().unwrap_err();
    /// assert_eq!(err.budget().unwrap().needed(), Duration::from_millis(50));
    /// # }
    /// ```
    pub fn budget(&self) -> Option<&BudgetExhausted> {
        match &self.kind {
            Kind::BudgetExhausted(b) => Some(b),
            _ => None,
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Error").field(&self.kind).finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Cancelled(c) => write!(f, "scope cancelled: {c}"),
            Kind::Closed => f.write_str("scope closed: no new work may start"),
            Kind::StaleGeneration => f.write_str("stale generation: the scope was cancelled since"),
            Kind::BudgetExhausted(b) => fmt::Display::fmt(b, f),
            Kind::Panicked => f.write_str("task panicked"),
            Kind::IdleTimeout(d) => write!(f, "no item within the idle timeout ({d:?})"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Kind::BudgetExhausted(b) => Some(b),
            _ => None,
        }
    }
}
