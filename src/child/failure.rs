//! A child that ended with an error, as its report lists it.

use std::fmt;
use std::sync::Arc;

use crate::scope::{Note, Scope};

/// A child that ended with an error: where it ran and what the error said. Listed by the
/// [`Report`](crate::Report) of its scope and of every scope above it
/// ([`Report::failures`](crate::Report::failures)); its receipt is
/// [`Receipt::Failed`](crate::Receipt::Failed), which carries nothing itself.
///
/// Made for a task spawned with [`Scope::spawn_fallible`] that returned `Err`. The error is
/// kept as its `Display` text (the error value itself goes to whoever awaits the task).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use cancel_scope::Scope;
/// let request = Scope::new();
/// let handler = request.child().name("handler").build().unwrap();
/// let task = handler.spawn_fallible(async { Err::<(), _>("inventory: no such item") }).unwrap();
/// assert_eq!(task.await.unwrap(), Err("inventory: no such item"));
///
/// request.close();
/// let report = request.quiesce().await;
/// let failure = report.failures()[0];
/// assert_eq!((failure.scope(), failure.child()), (Some("handler"), "task"));
/// assert_eq!(failure.error(), "inventory: no such item");
/// assert_eq!(failure.to_string(), "task in handler: inventory: no such item");
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    scope: Option<Arc<str>>,
    child: Arc<str>,
    error: Arc<str>,
}

impl Failure {
    /// The note that lists the failure of `child`, in `scope`, with `error`.
    pub(crate) fn note(scope: &Scope, child: Arc<str>, error: String) -> Note {
        Note::new(Arc::new(Failure {
            scope: scope.shared_name(),
            child,
            error: error.into(),
        }))
    }

    /// The name of the scope the child ran in, if it has one.
    ///
    /// # Examples
    ///
    /// See [`Failure`].
    pub fn scope(&self) -> Option<&str> {
        self.scope.as_deref()
    }

    /// The child's name (`"task"` for a spawned task).
    ///
    /// # Examples
    ///
    /// See [`Failure`].
    pub fn child(&self) -> &str {
        &self.child
    }

    /// The error's text (its `Display`).
    ///
    /// # Examples
    ///
    /// See [`Failure`].
    pub fn error(&self) -> &str {
        &self.error
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.scope {
            Some(scope) => write!(f, "{} in {scope}: {}", self.child, self.error),
            None => write!(f, "{}: {}", self.child, self.error),
        }
    }
}
