//! A PostgreSQL cancel that could not be delivered, as the scope's report lists it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::Report;

/// A server-side cancel the guard could not deliver: the control connection could not be
/// opened in time, broke, or the server refused the signal.
///
/// The statement was cut off on the client side at once, as always, but the server may still
/// be running it: its `statement_timeout` (the budget's, set before it was sent) still stops
/// it there, and nothing else does. Listed in the report of the statement's scope
/// ([`Report::undelivered_cancels`]); the statement's receipt says it too: a read is
/// `Quarantined` (not confirmed stopped) unless its connection answered after all, a write
/// `EffectUnknown`.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use cancel_scope::Scope;
/// let scope = Scope::new();
/// scope.close();
/// let report = scope.quiesce().await;
/// for undelivered in report.undelivered_cancels() {
///     eprintln!("{}: backend {:?}: {}", undelivered.statement(), undelivered.backend_pid(),
///         undelivered.error());
/// }
/// assert!(report.undelivered_cancels().is_empty());
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UndeliveredCancel {
    pub(super) statement: Arc<str>,
    pub(super) backend_pid: Option<i32>,
    pub(super) statement_timeout: Option<Duration>,
    pub(super) error: String,
}

impl UndeliveredCancel {
    /// The name of the statement's child ([`ChildSpec::name`](crate::ChildSpec::name)).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let scope = cancel_scope::Scope::new();
    /// scope.close();
    /// assert!(scope.quiesce().await.undelivered_cancels().iter().all(|u| !u.statement().is_empty()));
    /// # }
    /// ```
    pub fn statement(&self) -> &str {
        &self.statement
    }

    /// The backend the cancel was for (`None`: the statement was cut off before its first
    /// arming told the pid, so there was nothing to address).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let scope = cancel_scope::Scope::new();
    /// scope.close();
    /// assert!(scope.quiesce().await.undelivered_cancels().iter().all(|u| u.backend_pid().is_some()));
    /// # }
    /// ```
    pub fn backend_pid(&self) -> Option<i32> {
        self.backend_pid
    }

    /// The `statement_timeout` the statement was sent with, which still bounds it on the
    /// server (`None`: the session has none, so nothing does).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let scope = cancel_scope::Scope::new();
    /// scope.close();
    /// assert!(scope.quiesce().await.undelivered_cancels().iter().all(|u| u.statement_timeout().is_some()));
    /// # }
    /// ```
    pub fn statement_timeout(&self) -> Option<Duration> {
        self.statement_timeout
    }

    /// Why the cancel was not delivered (for people; the text is not API).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let scope = cancel_scope::Scope::new();
    /// scope.close();
    /// assert!(scope.quiesce().await.undelivered_cancels().iter().all(|u| !u.error().is_empty()));
    /// # }
    /// ```
    pub fn error(&self) -> &str {
        &self.error
    }
}

impl fmt::Display for UndeliveredCancel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cancel of {:?} not delivered", self.statement)?;
        if let Some(pid) = self.backend_pid {
            write!(f, " to backend {pid}")?;
        }
        write!(f, ": {}; ", self.error)?;
        match self.statement_timeout {
            Some(t) => write!(f, "its statement_timeout ({t:?}) still bounds it"),
            None => f.write_str("no statement_timeout bounds it"),
        }
    }
}

impl Report {
    /// The PostgreSQL cancels that could not be delivered to the server for statements of
    /// this scope ([`UndeliveredCancel`]), oldest first (the last 64 at most).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let scope = cancel_scope::Scope::new();
    /// scope.close();
    /// assert!(scope.quiesce().await.undelivered_cancels().is_empty());
    /// # }
    /// ```
    pub fn undelivered_cancels(&self) -> Vec<&UndeliveredCancel> {
        self.notes()
            .iter()
            .filter_map(|n| n.get::<UndeliveredCancel>())
            .collect()
    }
}
