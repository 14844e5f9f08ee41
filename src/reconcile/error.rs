//! Why an intent was not written or resolved, or a journaled call not dispatched.

use std::fmt;
use std::time::Duration;

use crate::registry::error::{Fault, Source};

/// Why an [`IntentStore`](super::IntentStore) call, or a [`Journal`](super::Journal)
/// dispatch, did not go through.
///
/// One opaque type with predicates:
///
/// * [`is_refused`](Self::is_refused): the scope refused the dispatch (it was cancelled,
///   closed, or out of budget, see [`refusal`](Self::refusal)); nothing was sent.
/// * [`is_invalid`](Self::is_invalid): a field the store cannot hold.
/// * [`is_fault`](Self::is_fault): the store gave no answer — [`is_unreachable`](Self::is_unreachable),
///   [`is_timeout`](Self::is_timeout), [`is_full`](Self::is_full), or an error of its own.
///   On a dispatch the call was then not sent (no intent, no call); on a resolve the intent
///   stays pending, for the reconciler.
///
/// The constructors are public for implementations of the store outside this crate. The
/// `Display` text is for logs and is not API.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::reconcile::IntentError;
/// let e = IntentError::timeout(Duration::from_millis(100));
/// assert!(e.is_timeout() && e.is_fault() && !e.is_refused());
/// ```
pub struct IntentError {
    kind: Kind,
}

enum Kind {
    Invalid(&'static str),
    Fault(Fault),
    Refused(crate::Error),
}

impl IntentError {
    fn of(fault: Fault) -> IntentError {
        IntentError {
            kind: Kind::Fault(fault),
        }
    }

    pub(crate) fn refused(e: crate::Error) -> IntentError {
        IntentError {
            kind: Kind::Refused(e),
        }
    }

    /// The scope's refusal, if this is one; else the error itself.
    #[cfg_attr(not(any(feature = "reqwest", feature = "tower")), allow(dead_code))]
    pub(crate) fn into_refusal(self) -> Result<crate::Error, IntentError> {
        match self.kind {
            Kind::Refused(e) => Ok(e),
            kind => Err(IntentError { kind }),
        }
    }

    /// A field the store cannot hold.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::IntentError;
    /// assert!(IntentError::invalid("empty effect id").is_invalid());
    /// ```
    pub fn invalid(what: &'static str) -> IntentError {
        IntentError {
            kind: Kind::Invalid(what),
        }
    }

    /// The store holds `max` pending intents and takes no more.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::IntentError;
    /// assert!(IntentError::full(3).is_full());
    /// ```
    pub fn full(max: usize) -> IntentError {
        IntentError::of(Fault::Full { max })
    }

    /// The store could not be reached.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::IntentError;
    /// let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    /// assert!(IntentError::unreachable(io).is_unreachable());
    /// ```
    pub fn unreachable(source: impl Into<Source>) -> IntentError {
        IntentError::of(Fault::Unreachable(source.into()))
    }

    /// No answer within `after`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::reconcile::IntentError;
    /// assert!(IntentError::timeout(Duration::from_secs(1)).is_timeout());
    /// ```
    pub fn timeout(after: Duration) -> IntentError {
        IntentError::of(Fault::Timeout(after))
    }

    /// The store answered with an error.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::IntentError;
    /// assert!(IntentError::store("relation does not exist").is_fault());
    /// ```
    pub fn store(source: impl Into<Source>) -> IntentError {
        IntentError::of(Fault::Store(source.into()))
    }

    /// The scope refused the dispatch: nothing was sent.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::sync::Arc;
    /// use cancel_scope::reconcile::{InMemoryIntents, Journal};
    /// use cancel_scope::{ChildSpec, Scope};
    ///
    /// let journal = Journal::new(Arc::new(InMemoryIntents::new()));
    /// let scope = Scope::new();
    /// let ticket = scope.register(ChildSpec::side_effecting("pay", "p-1")).unwrap();
    /// scope.cancel();
    /// let err = journal.dispatch(ticket, None).await.unwrap_err();
    /// assert!(err.is_refused() && err.refusal().unwrap().is_cancelled());
    /// # }
    /// ```
    pub fn is_refused(&self) -> bool {
        matches!(self.kind, Kind::Refused(_))
    }

    /// The scope's refusal, when [`is_refused`](Self::is_refused).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::IntentError;
    /// assert!(IntentError::full(1).refusal().is_none());
    /// ```
    pub fn refusal(&self) -> Option<&crate::Error> {
        match &self.kind {
            Kind::Refused(e) => Some(e),
            _ => None,
        }
    }

    /// A field was bad.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::IntentError;
    /// assert!(!IntentError::full(1).is_invalid());
    /// ```
    pub fn is_invalid(&self) -> bool {
        matches!(self.kind, Kind::Invalid(_))
    }

    /// The store gave no answer.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::IntentError;
    /// assert!(!IntentError::invalid("x").is_fault());
    /// ```
    pub fn is_fault(&self) -> bool {
        matches!(self.kind, Kind::Fault(_))
    }

    /// The store is at its bound.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::IntentError;
    /// assert!(!IntentError::invalid("x").is_full());
    /// ```
    pub fn is_full(&self) -> bool {
        matches!(self.kind, Kind::Fault(Fault::Full { .. }))
    }

    /// The store could not be reached.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::IntentError;
    /// assert!(!IntentError::invalid("x").is_unreachable());
    /// ```
    pub fn is_unreachable(&self) -> bool {
        matches!(self.kind, Kind::Fault(Fault::Unreachable(_)))
    }

    /// The store did not answer in time.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::IntentError;
    /// assert!(!IntentError::invalid("x").is_timeout());
    /// ```
    pub fn is_timeout(&self) -> bool {
        matches!(self.kind, Kind::Fault(Fault::Timeout(_)))
    }
}

impl fmt::Debug for IntentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("IntentError");
        match &self.kind {
            Kind::Invalid(what) => {
                d.field("invalid", what);
            }
            Kind::Fault(fault) => fault.debug_into(&mut d),
            Kind::Refused(e) => {
                d.field("refused", e);
            }
        }
        d.finish()
    }
}

impl fmt::Display for IntentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Invalid(what) => write!(f, "intent store: {what}"),
            Kind::Fault(fault) => fault.fmt_for("intent store", f),
            Kind::Refused(e) => write!(f, "not dispatched: {e}"),
        }
    }
}

impl std::error::Error for IntentError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Kind::Invalid(_) => None,
            Kind::Fault(fault) => fault.source(),
            Kind::Refused(e) => Some(e),
        }
    }
}
