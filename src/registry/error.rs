//! Why a registry call gave no answer, and why a request may not join its operation.

use std::fmt;
use std::time::Duration;

/// The error source a store hands back (a Redis, SQL or I/O error).
pub(crate) type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a store gave no answer: shared by the registry's and the intent store's errors.
pub(crate) enum Fault {
    Full { max: usize },
    Unreachable(Source),
    Timeout(Duration),
    Store(Source),
}

impl Fault {
    /// Writes the fault, `what` naming the store ("operation registry").
    pub(crate) fn fmt_for(&self, what: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Full { max } => write!(
                f,
                "{what} full: it holds {max} entries and takes no more until some go"
            ),
            Fault::Unreachable(e) => write!(f, "{what} unreachable: {e}"),
            Fault::Timeout(after) => write!(f, "{what} did not answer within {after:?}"),
            Fault::Store(e) => write!(f, "{what} error: {e}"),
        }
    }

    pub(crate) fn debug_into(&self, d: &mut fmt::DebugStruct<'_, '_>) {
        match self {
            Fault::Full { max } => d.field("full", max),
            Fault::Unreachable(e) => d.field("unreachable", e),
            Fault::Timeout(after) => d.field("timeout", after),
            Fault::Store(e) => d.field("store", e),
        };
    }

    pub(crate) fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Fault::Unreachable(e) | Fault::Store(e) => Some(&**e),
            Fault::Full { .. } | Fault::Timeout(_) => None,
        }
    }
}

/// Why an [`OperationRegistry`](super::OperationRegistry) call did not answer.
///
/// One opaque type with predicates. Everything but [`is_invalid`](Self::is_invalid) is a
/// *fault* ([`is_fault`](Self::is_fault)): the registry could not say, which is not the same as
/// saying "unknown operation" or "cancelled" — admission then goes on with the endpoint's own
/// cap (never without a deadline) and counts it. The `Display` text is for logs and is not API.
///
/// The constructors are public so that an implementation of the trait outside this crate can
/// report the same kinds.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::registry::RegistryError;
///
/// let e = RegistryError::timeout(Duration::from_millis(50));
/// assert!(e.is_timeout() && e.is_fault());
/// assert!(!RegistryError::invalid("bad id").is_fault());
/// ```
pub struct RegistryError {
    kind: Kind,
}

enum Kind {
    Invalid(&'static str),
    Fault(Fault),
}

impl RegistryError {
    fn of(fault: Fault) -> RegistryError {
        RegistryError {
            kind: Kind::Fault(fault),
        }
    }

    /// Bad input from the caller: an id or a budget the registry cannot hold.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::RegistryError;
    /// assert!(RegistryError::invalid("an operation id must not be empty").is_invalid());
    /// ```
    pub fn invalid(what: &'static str) -> RegistryError {
        RegistryError {
            kind: Kind::Invalid(what),
        }
    }

    /// The registry holds `max` operations already and creates no more until some expire.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::RegistryError;
    /// assert!(RegistryError::full(10).is_full());
    /// ```
    pub fn full(max: usize) -> RegistryError {
        RegistryError::of(Fault::Full { max })
    }

    /// The store could not be reached (connection refused, reset, closed).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::RegistryError;
    /// let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    /// assert!(RegistryError::unreachable(io).is_unreachable());
    /// ```
    pub fn unreachable(source: impl Into<Source>) -> RegistryError {
        RegistryError::of(Fault::Unreachable(source.into()))
    }

    /// No answer within `after`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::registry::RegistryError;
    /// assert!(RegistryError::timeout(Duration::from_millis(5)).is_timeout());
    /// ```
    pub fn timeout(after: Duration) -> RegistryError {
        RegistryError::of(Fault::Timeout(after))
    }

    /// The store answered with an error or with something this crate did not write.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::RegistryError;
    /// let e = RegistryError::store("WRONGTYPE");
    /// assert!(e.is_fault() && !e.is_unreachable() && !e.is_timeout());
    /// ```
    pub fn store(source: impl Into<Source>) -> RegistryError {
        RegistryError::of(Fault::Store(source.into()))
    }

    /// The caller's input was bad; retrying it will not help.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::OperationId;
    /// assert!(OperationId::new("").unwrap_err().is_invalid());
    /// ```
    pub fn is_invalid(&self) -> bool {
        matches!(self.kind, Kind::Invalid(_))
    }

    /// The registry is at its bound of operations.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::RegistryError;
    /// assert!(!RegistryError::invalid("x").is_full());
    /// ```
    pub fn is_full(&self) -> bool {
        matches!(self.kind, Kind::Fault(Fault::Full { .. }))
    }

    /// The store could not be reached.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::RegistryError;
    /// assert!(!RegistryError::full(1).is_unreachable());
    /// ```
    pub fn is_unreachable(&self) -> bool {
        matches!(self.kind, Kind::Fault(Fault::Unreachable(_)))
    }

    /// The store did not answer in time.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::RegistryError;
    /// assert!(!RegistryError::full(1).is_timeout());
    /// ```
    pub fn is_timeout(&self) -> bool {
        matches!(self.kind, Kind::Fault(Fault::Timeout(_)))
    }

    /// The registry gave no answer (anything but bad input): the caller falls back to its own
    /// limits.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::RegistryError;
    /// assert!(RegistryError::full(1).is_fault());
    /// ```
    pub fn is_fault(&self) -> bool {
        matches!(self.kind, Kind::Fault(_))
    }
}

impl fmt::Debug for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RegistryError");
        match &self.kind {
            Kind::Invalid(what) => {
                d.field("invalid", what);
            }
            Kind::Fault(fault) => fault.debug_into(&mut d),
        }
        d.finish()
    }
}

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Invalid(what) => write!(f, "operation registry: {what}"),
            Kind::Fault(fault) => fault.fmt_for("operation registry", f),
        }
    }
}

impl std::error::Error for RegistryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Kind::Invalid(_) => None,
            Kind::Fault(fault) => fault.source(),
        }
    }
}

/// Why a request may not join its operation ([`Operations::join`](super::Operations::join),
/// [`Operations::attach`](super::Operations::attach)).
///
/// | predicate | what it means | what admission answers |
/// |---|---|---|
/// | [`is_cancelled`](Self::is_cancelled) | the operation was cancelled | HTTP 409 / gRPC `ABORTED` |
/// | [`is_stale_generation`](Self::is_stale_generation) | the request was cut under another generation than the operation's | HTTP 409 / gRPC `ABORTED` |
/// | [`is_unknown`](Self::is_unknown) | no such operation, and the caller may not create it | not an error to the caller: a fresh operation |
/// | [`is_fault`](Self::is_fault) | the registry gave no answer ([`fault`](Self::fault)) | go on with the endpoint's cap; count it |
///
/// [`is_refused`](Self::is_refused) is the first two together. The `Display` text is for logs
/// and is not API (send an untrusted caller a fixed text, not this).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use cancel_scope::registry::{InProcessRegistry, Join, OperationId, Operations};
///
/// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
/// let id = OperationId::new("op-1").unwrap();
/// ops.join(Join::new(id.clone(), Duration::from_secs(1)).create(true)).await.unwrap();
/// ops.cancel(&id).await.unwrap();
/// let err = ops.join(Join::new(id, Duration::from_secs(1))).await.unwrap_err();
/// assert!(err.is_cancelled() && err.is_refused());
/// # }
/// ```
pub struct JoinError {
    kind: JoinKind,
}

enum JoinKind {
    Cancelled { generation: Option<u64> },
    Stale { caller: u64, current: u64 },
    Unknown,
    Fault(RegistryError),
}

impl JoinError {
    pub(crate) fn cancelled(generation: Option<u64>) -> JoinError {
        JoinError {
            kind: JoinKind::Cancelled { generation },
        }
    }

    pub(crate) fn stale(caller: u64, current: u64) -> JoinError {
        JoinError {
            kind: JoinKind::Stale { caller, current },
        }
    }

    pub(crate) fn unknown() -> JoinError {
        JoinError {
            kind: JoinKind::Unknown,
        }
    }

    pub(crate) fn from_fault(e: RegistryError) -> JoinError {
        JoinError {
            kind: JoinKind::Fault(e),
        }
    }

    /// The operation was cancelled (in the registry, or in this process).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::{LocalScopes, OperationId};
    /// use cancel_scope::Scope;
    /// let scopes = LocalScopes::new();
    /// let id = OperationId::new("op-1").unwrap();
    /// scopes.cancel(&id, None);
    /// assert!(scopes.attach(&id, &Scope::new()).unwrap_err().is_cancelled());
    /// ```
    pub fn is_cancelled(&self) -> bool {
        matches!(self.kind, JoinKind::Cancelled { .. })
    }

    /// The request carries another generation than the operation's: an older one (it was cut
    /// before a cancel whose message this hop never got), or a newer one than the store knows
    /// (the store lost the cancel that made it).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use cancel_scope::registry::{InProcessRegistry, Join, OperationId, Operations};
    ///
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// let id = OperationId::new("op-1").unwrap();
    /// ops.join(Join::new(id.clone(), Duration::from_secs(1)).create(true)).await.unwrap();
    /// let err = ops.join(Join::new(id, Duration::from_secs(1)).generation(3)).await.unwrap_err();
    /// assert!(err.is_stale_generation());
    /// # }
    /// ```
    pub fn is_stale_generation(&self) -> bool {
        matches!(self.kind, JoinKind::Stale { .. })
    }

    /// [`is_cancelled`](Self::is_cancelled) or
    /// [`is_stale_generation`](Self::is_stale_generation): refuse the request (HTTP 409 / gRPC
    /// `ABORTED`).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::{LocalScopes, OperationId};
    /// let scopes = LocalScopes::new();
    /// let id = OperationId::new("op-1").unwrap();
    /// scopes.cancel(&id, None);
    /// assert!(scopes.check(&id).unwrap_err().is_refused());
    /// ```
    pub fn is_refused(&self) -> bool {
        self.is_cancelled() || self.is_stale_generation()
    }

    /// The registry knows no such operation and the caller may not create it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use cancel_scope::registry::{InProcessRegistry, Join, OperationId, Operations};
    ///
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// let victim = OperationId::new("victim-op").unwrap();
    /// let err = ops.join(Join::new(victim, Duration::from_millis(1))).await.unwrap_err();
    /// assert!(err.is_unknown()); // an untrusted caller cannot create it
    /// # }
    /// ```
    pub fn is_unknown(&self) -> bool {
        matches!(self.kind, JoinKind::Unknown)
    }

    /// The registry gave no answer.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::{LocalScopes, OperationId};
    /// let scopes = LocalScopes::new();
    /// let id = OperationId::new("op-1").unwrap();
    /// scopes.cancel(&id, None);
    /// assert!(!scopes.check(&id).unwrap_err().is_fault());
    /// ```
    pub fn is_fault(&self) -> bool {
        matches!(self.kind, JoinKind::Fault(_))
    }

    /// The registry's error, when [`is_fault`](Self::is_fault).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::{LocalScopes, OperationId};
    /// let scopes = LocalScopes::new();
    /// let id = OperationId::new("op-1").unwrap();
    /// scopes.cancel(&id, None);
    /// assert!(scopes.check(&id).unwrap_err().fault().is_none());
    /// ```
    pub fn fault(&self) -> Option<&RegistryError> {
        match &self.kind {
            JoinKind::Fault(e) => Some(e),
            _ => None,
        }
    }

    /// The operation's current generation, where the registry said it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use cancel_scope::registry::{InProcessRegistry, Join, OperationId, Operations};
    ///
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// let id = OperationId::new("op-1").unwrap();
    /// ops.join(Join::new(id.clone(), Duration::from_secs(1)).create(true)).await.unwrap();
    /// let err = ops.join(Join::new(id, Duration::from_secs(1)).generation(2)).await.unwrap_err();
    /// assert_eq!(err.generation(), Some(0));
    /// # }
    /// ```
    pub fn generation(&self) -> Option<u64> {
        match self.kind {
            JoinKind::Cancelled { generation } => generation,
            JoinKind::Stale { current, .. } => Some(current),
            _ => None,
        }
    }
}

impl fmt::Debug for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("JoinError");
        match &self.kind {
            JoinKind::Cancelled { generation } => d.field("cancelled", generation),
            JoinKind::Stale { caller, current } => d
                .field("caller_generation", caller)
                .field("generation", current),
            JoinKind::Unknown => d.field("unknown", &true),
            JoinKind::Fault(e) => d.field("fault", e),
        };
        d.finish()
    }
}

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            JoinKind::Cancelled { .. } => f.write_str("the operation was cancelled"),
            JoinKind::Stale { caller, current } => write!(
                f,
                "the request's generation {caller} is not the operation's ({current})"
            ),
            JoinKind::Unknown => f.write_str("no such operation"),
            JoinKind::Fault(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl std::error::Error for JoinError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            JoinKind::Fault(e) => Some(e),
            _ => None,
        }
    }
}
