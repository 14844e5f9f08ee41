//! Why a fan-out failed.

use std::fmt;
use std::sync::Arc;

use crate::cause::Cause;
use crate::error::Error;

/// A branch's own error, boxed (branches may fail with different error types).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A fan-out that failed: a required branch failed, ran out of time or could not start, or the
/// scope was cancelled. Its siblings were cancelled and have their receipts.
///
/// The `Display` text is for people and is not part of the API.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::{fanout::FanOut, Scope};
///
/// let scope = Scope::with_timeout(Duration::from_millis(500));
/// let mut fan = FanOut::new(&scope);
/// fan.required("price", |_| async { Err::<u32, _>("pricing down") });
/// let err = fan.join().await.unwrap_err();
/// assert_eq!(err.branch(), Some("price"));
/// assert_eq!(err.to_string(), "required branch price failed: pricing down");
/// # }
/// ```
pub struct FanOutError {
    branch: Option<Arc<str>>,
    kind: Kind,
}

enum Kind {
    Failed(BoxError),
    Stopped(Cause),
    Panicked,
    NotStarted(Error),
    Cancelled(Cause),
}

impl FanOutError {
    pub(crate) fn failed(branch: Arc<str>, e: BoxError) -> Self {
        FanOutError {
            branch: Some(branch),
            kind: Kind::Failed(e),
        }
    }
    pub(crate) fn stopped(branch: Arc<str>, cause: Cause) -> Self {
        FanOutError {
            branch: Some(branch),
            kind: Kind::Stopped(cause),
        }
    }
    pub(crate) fn panicked(branch: Arc<str>) -> Self {
        FanOutError {
            branch: Some(branch),
            kind: Kind::Panicked,
        }
    }
    pub(crate) fn not_started(branch: Option<Arc<str>>, e: Error) -> Self {
        FanOutError {
            branch,
            kind: Kind::NotStarted(e),
        }
    }
    pub(crate) fn cancelled(cause: Cause) -> Self {
        FanOutError {
            branch: None,
            kind: Kind::Cancelled(cause),
        }
    }

    /// The required branch that failed (`None` when the scope itself was cancelled). The
    /// scope's deadline passing while required branches run is their failure as much as the
    /// scope's: the error names the first of them (in declaration order) with its own end, as
    /// it does when a [`reserve`](super::FanOut::reserve) makes the branches' deadline earlier.
    ///
    /// # Examples
    ///
    /// See [`FanOutError`].
    pub fn branch(&self) -> Option<&str> {
        self.branch.as_deref()
    }

    /// Whether the fan-out ran out of time: the scope's deadline, or a required branch's.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{fanout::FanOut, Scope};
    /// let scope = Scope::with_timeout(Duration::from_millis(100));
    /// let mut fan = FanOut::new(&scope);
    /// fan.required("slow", |_| async {
    ///     tokio::time::sleep(Duration::from_secs(1)).await;
    ///     Ok::<_, std::io::Error>(())
    /// });
    /// assert!(fan.join().await.unwrap_err().is_deadline_exceeded());
    /// # }
    /// ```
    pub fn is_deadline_exceeded(&self) -> bool {
        match &self.kind {
            Kind::Stopped(c) | Kind::Cancelled(c) => c.is_deadline_exceeded(),
            Kind::NotStarted(e) => e.is_deadline_exceeded() || e.is_budget_exhausted(),
            _ => false,
        }
    }

    /// Whether a branch was not started because too little budget was left for it to be
    /// useful (the fan-out's [`min_useful`](super::FanOut::min_useful)). Also
    /// [`is_deadline_exceeded`](Self::is_deadline_exceeded), which counts every way the
    /// fan-out ran out of time.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{fanout::FanOut, Scope};
    /// let scope = Scope::with_timeout(Duration::from_millis(100));
    /// let mut fan = FanOut::new(&scope).min_useful(Duration::from_millis(300));
    /// fan.required("price", |_| async { Ok::<_, std::io::Error>(()) });
    /// assert!(fan.join().await.unwrap_err().is_budget_exhausted());
    /// # }
    /// ```
    pub fn is_budget_exhausted(&self) -> bool {
        matches!(&self.kind, Kind::NotStarted(e) if e.is_budget_exhausted())
    }

    /// Whether the client the scope served went away (the scope's cancel, or a branch's).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::{fanout::FanOut, Cause, Scope};
    /// let scope = Scope::new();
    /// scope.cancel_because(Cause::ClientGone);
    /// let mut fan = FanOut::new(&scope);
    /// fan.required("a", |_| async { Ok::<_, std::io::Error>(()) });
    /// assert!(fan.join().await.unwrap_err().is_client_gone());
    /// # }
    /// ```
    pub fn is_client_gone(&self) -> bool {
        self.cause().is_some_and(Cause::is_client_gone)
    }

    /// Whether the scope the fan-out ran in was cancelled.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::{fanout::FanOut, Scope};
    /// let scope = Scope::new();
    /// scope.cancel();
    /// let mut fan = FanOut::new(&scope);
    /// fan.required("a", |_| async { Ok::<_, std::io::Error>(()) });
    /// assert!(fan.join().await.unwrap_err().is_cancelled());
    /// # }
    /// ```
    pub fn is_cancelled(&self) -> bool {
        match &self.kind {
            Kind::Cancelled(_) => true,
            Kind::NotStarted(e) => e.is_cancelled(),
            _ => false,
        }
    }

    /// The cancel cause that stopped the fan-out or the failed branch, if that is what ended it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::{fanout::FanOut, Cause, Scope};
    /// let scope = Scope::new();
    /// scope.cancel_because(Cause::ClientGone);
    /// let mut fan = FanOut::new(&scope);
    /// fan.required("a", |_| async { Ok::<_, std::io::Error>(()) });
    /// assert_eq!(fan.join().await.unwrap_err().cause(), Some(&Cause::ClientGone));
    /// # }
    /// ```
    pub fn cause(&self) -> Option<&Cause> {
        match &self.kind {
            Kind::Stopped(c) | Kind::Cancelled(c) => Some(c),
            Kind::NotStarted(e) => e.cause(),
            _ => None,
        }
    }
}

impl fmt::Debug for FanOutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("FanOutError");
        d.field("branch", &self.branch);
        match &self.kind {
            Kind::Failed(e) => d.field("failed", e),
            Kind::Stopped(c) => d.field("stopped", c),
            Kind::Panicked => d.field("panicked", &true),
            Kind::NotStarted(e) => d.field("not_started", e),
            Kind::Cancelled(c) => d.field("cancelled", c),
        };
        d.finish()
    }
}

impl fmt::Display for FanOutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.branch.as_deref().unwrap_or("?");
        match &self.kind {
            Kind::Failed(e) => write!(f, "required branch {name} failed: {e}"),
            Kind::Stopped(c) => write!(f, "required branch {name} stopped: {c}"),
            Kind::Panicked => write!(f, "required branch {name} panicked"),
            Kind::NotStarted(e) => match &self.branch {
                Some(_) => write!(f, "required branch {name} not started: {e}"),
                None => write!(f, "fan-out not started: {e}"),
            },
            Kind::Cancelled(c) => write!(f, "fan-out cancelled: {c}"),
        }
    }
}

impl std::error::Error for FanOutError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Kind::Failed(e) => Some(&**e),
            Kind::NotStarted(e) => Some(e),
            _ => None,
        }
    }
}
