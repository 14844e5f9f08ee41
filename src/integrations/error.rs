//! The error of an outgoing call made through a client integration.

use std::fmt;

use crate::{Cause, Error};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why an outgoing call made through `tower::Propagate` or the `reqwest` extension did not
/// complete.
///
/// Either the scope stopped it — the call's deadline passed, its scope was cancelled, or too
/// little budget was left to send it at all (then nothing was sent) — or the transport failed.
/// One opaque type with predicates, in the manner of `hyper::Error`; the `Display` text is not
/// API.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::{integrations::CallError, Scope};
///
/// let scope = Scope::with_timeout(Duration::from_millis(10));
/// let err: CallError = scope.run(std::future::pending::<()>()).await.unwrap_err().into();
/// assert!(err.is_deadline_exceeded());
/// assert!(!err.is_transport());
/// # }
/// ```
pub struct CallError {
    kind: Kind,
}

enum Kind {
    Scope(Error),
    Transport(BoxError),
    /// The transport failed after the budget the callee was told had run out: a timeout in
    /// all but name (e.g. tonic's own `grpc-timeout` timer, which says CANCELLED).
    TransportAfterDeadline(BoxError),
    NoScope,
}

impl CallError {
    pub(crate) fn transport(e: impl Into<BoxError>) -> Self {
        CallError {
            kind: Kind::Transport(e.into()),
        }
    }

    pub(crate) fn transport_after_deadline(e: impl Into<BoxError>) -> Self {
        CallError {
            kind: Kind::TransportAfterDeadline(e.into()),
        }
    }

    pub(crate) fn no_scope() -> Self {
        CallError {
            kind: Kind::NoScope,
        }
    }

    pub(crate) fn cancelled(cause: Cause) -> Self {
        CallError {
            kind: Kind::Scope(Error::cancelled(cause)),
        }
    }

    /// The call ran out of time: its scope's deadline (or an ancestor's) passed, or the
    /// transport gave up after the budget the callee was told had run out.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{integrations::CallError, Cause, Scope};
    /// let s = Scope::new();
    /// s.cancel_because(Cause::DeadlineExceeded);
    /// let err = CallError::from(s.child().build().unwrap_err());
    /// assert!(err.is_deadline_exceeded());
    /// ```
    pub fn is_deadline_exceeded(&self) -> bool {
        match &self.kind {
            Kind::Scope(e) => e.is_deadline_exceeded(),
            Kind::TransportAfterDeadline(_) => true,
            _ => false,
        }
    }

    /// Too little budget was left for the call to be useful: nothing was sent.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{integrations::CallError, Scope};
    /// let s = Scope::with_timeout(Duration::from_millis(5));
    /// let err = s.child().min_useful(Duration::from_millis(50)).build().unwrap_err();
    /// assert!(CallError::from(err).is_budget_exhausted());
    /// # }
    /// ```
    pub fn is_budget_exhausted(&self) -> bool {
        matches!(&self.kind, Kind::Scope(e) if e.is_budget_exhausted())
    }

    /// The call's scope was cancelled or closed for any cause (deadline included), so the call
    /// was not sent or was stopped.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{integrations::CallError, Scope};
    /// let s = Scope::new();
    /// s.cancel();
    /// assert!(CallError::from(s.child().build().unwrap_err()).is_cancelled());
    /// ```
    pub fn is_cancelled(&self) -> bool {
        matches!(&self.kind, Kind::Scope(e) if e.is_cancelled() || e.is_closed())
    }

    /// The transport failed (connection refused, reset, protocol error...).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{integrations::CallError, Scope};
    /// let s = Scope::new();
    /// s.cancel();
    /// assert!(!CallError::from(s.child().build().unwrap_err()).is_transport());
    /// ```
    pub fn is_transport(&self) -> bool {
        matches!(
            self.kind,
            Kind::Transport(_) | Kind::TransportAfterDeadline(_)
        )
    }

    /// There was no current scope to make the call in ([`Scope::try_current`](crate::Scope::try_current)).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{integrations::CallError, Scope};
    /// let s = Scope::new();
    /// s.cancel();
    /// assert!(!CallError::from(s.child().build().unwrap_err()).is_no_scope());
    /// ```
    pub fn is_no_scope(&self) -> bool {
        matches!(self.kind, Kind::NoScope)
    }

    /// The cancel cause, when the scope stopped the call.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{integrations::CallError, Cause, Scope};
    /// let s = Scope::new();
    /// s.cancel_because(Cause::ClientGone);
    /// let err = CallError::from(s.child().build().unwrap_err());
    /// assert!(err.cause().unwrap().is_client_gone());
    /// ```
    pub fn cause(&self) -> Option<&Cause> {
        match &self.kind {
            Kind::Scope(e) => e.cause(),
            _ => None,
        }
    }
}

impl From<Error> for CallError {
    fn from(e: Error) -> Self {
        CallError {
            kind: Kind::Scope(e),
        }
    }
}

impl fmt::Debug for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Scope(e) => f.debug_tuple("CallError::Scope").field(e).finish(),
            Kind::Transport(e) => f.debug_tuple("CallError::Transport").field(e).finish(),
            Kind::TransportAfterDeadline(e) => f
                .debug_tuple("CallError::TransportAfterDeadline")
                .field(e)
                .finish(),
            Kind::NoScope => f.write_str("CallError::NoScope"),
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Scope(e) => write!(f, "call stopped by its scope: {e}"),
            Kind::Transport(e) => write!(f, "call failed: {e}"),
            Kind::TransportAfterDeadline(e) => {
                write!(f, "call failed after its budget ran out: {e}")
            }
            Kind::NoScope => f.write_str("no current scope to make the call in"),
        }
    }
}

impl std::error::Error for CallError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Kind::Scope(e) => Some(e),
            Kind::Transport(e) | Kind::TransportAfterDeadline(e) => Some(&**e),
            Kind::NoScope => None,
        }
    }
}
