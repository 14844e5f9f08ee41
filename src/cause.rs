//! Why a scope was cancelled.

use std::fmt;
use std::sync::Arc;

/// Why a scope was cancelled.
///
/// The first cause wins: once a scope is cancelled its cause never changes, and every descendant
/// sees [`Cause::ParentCancelled`] wrapping the *origin* (the cause of the scope where the cancel
/// started), so a grandchild of a scope that ran out of time still answers
/// [`is_deadline_exceeded`](Cause::is_deadline_exceeded) with `true`.
///
/// Cloning is cheap (a reason is shared, not copied).
///
/// # Examples
///
/// ```
/// use cancel_scope::{Cause, Scope};
///
/// let root = Scope::new();
/// let child = root.child().build().unwrap();
/// root.cancel_with("shutting down");
///
/// assert_eq!(root.cause(), Some(Cause::cancelled("shutting down")));
/// let inherited = child.cause().unwrap();
/// assert!(matches!(inherited, Cause::ParentCancelled(_)));
/// assert_eq!(inherited.origin(), &Cause::cancelled("shutting down"));
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cause {
    /// The scope's deadline passed.
    DeadlineExceeded,
    /// Somebody called [`Scope::cancel`](crate::Scope::cancel) or
    /// [`Scope::cancel_with`](crate::Scope::cancel_with).
    Cancelled {
        /// The reason given to `cancel_with`, if any.
        reason: Option<Arc<str>>,
    },
    /// An ancestor was cancelled; holds the ancestor's origin cause (never another
    /// `ParentCancelled`).
    ParentCancelled(Arc<Cause>),
    /// The client that the scope serves went away (connection closed, stream reset).
    ClientGone,
    /// The server is shutting down: its grace period for the requests in flight ended (see
    /// `wire::ServerScope::shutdown`).
    Shutdown,
}

impl Cause {
    /// An explicit cancel with a reason.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Cause;
    /// assert_eq!(Cause::cancelled("bye").reason(), Some("bye"));
    /// ```
    pub fn cancelled(reason: impl Into<Arc<str>>) -> Self {
        Cause::Cancelled {
            reason: Some(reason.into()),
        }
    }

    /// The cause where the cancel started: `self` unless this is [`Cause::ParentCancelled`],
    /// looking through any nesting (a `ParentCancelled` built by hand around another one, e.g.
    /// a cause forwarded from another tree with
    /// [`Scope::cancel_because`](crate::Scope::cancel_because)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cancel_scope::Cause;
    /// assert_eq!(Cause::ClientGone.origin(), &Cause::ClientGone);
    /// let nested = Cause::ParentCancelled(Arc::new(Cause::ParentCancelled(Arc::new(
    ///     Cause::DeadlineExceeded,
    /// ))));
    /// assert_eq!(nested.origin(), &Cause::DeadlineExceeded);
    /// ```
    pub fn origin(&self) -> &Cause {
        let mut c = self;
        while let Cause::ParentCancelled(origin) = c {
            c = origin;
        }
        c
    }

    /// Whether the origin of this cause is a deadline.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Cause;
    /// assert!(Cause::DeadlineExceeded.is_deadline_exceeded());
    /// assert!(!Cause::ClientGone.is_deadline_exceeded());
    /// ```
    pub fn is_deadline_exceeded(&self) -> bool {
        matches!(self.origin(), Cause::DeadlineExceeded)
    }

    /// Whether the origin of this cause is the client going away.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Cause;
    /// assert!(Cause::ClientGone.is_client_gone());
    /// ```
    pub fn is_client_gone(&self) -> bool {
        matches!(self.origin(), Cause::ClientGone)
    }

    /// Whether the origin of this cause is a server's shutdown.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cancel_scope::Cause;
    /// assert!(Cause::ParentCancelled(Arc::new(Cause::Shutdown)).is_shutdown());
    /// assert!(!Cause::ClientGone.is_shutdown());
    /// ```
    pub fn is_shutdown(&self) -> bool {
        matches!(self.origin(), Cause::Shutdown)
    }

    /// The reason of an explicit cancel (looking through `ParentCancelled`).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Cause;
    /// assert_eq!(Cause::DeadlineExceeded.reason(), None);
    /// ```
    pub fn reason(&self) -> Option<&str> {
        match self.origin() {
            Cause::Cancelled { reason } => reason.as_deref(),
            _ => None,
        }
    }

    /// What a child of a scope cancelled with `self` gets.
    pub(crate) fn for_child(&self) -> Cause {
        Cause::ParentCancelled(self.origin_shared())
    }

    /// The origin cause, shared (what `ParentCancelled` holds for the children of a scope
    /// cancelled with `self`).
    pub(crate) fn origin_shared(&self) -> Arc<Cause> {
        let Cause::ParentCancelled(outer) = self else {
            return Arc::new(self.clone());
        };
        // A `ParentCancelled` built by hand may nest: share the innermost one (see `origin`).
        let mut origin: &Arc<Cause> = outer;
        while let Cause::ParentCancelled(inner) = &**origin {
            origin = inner;
        }
        origin.clone()
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::DeadlineExceeded => f.write_str("DeadlineExceeded"),
            Cause::Cancelled { reason: None } => f.write_str("Cancelled"),
            Cause::Cancelled { reason: Some(r) } => write!(f, "Cancelled({r:?})"),
            Cause::ParentCancelled(origin) => write!(f, "ParentCancelled({origin:?})"),
            Cause::ClientGone => f.write_str("ClientGone"),
            Cause::Shutdown => f.write_str("Shutdown"),
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::DeadlineExceeded => f.write_str("deadline exceeded"),
            Cause::Cancelled { reason: None } => f.write_str("cancelled"),
            Cause::Cancelled { reason: Some(r) } => write!(f, "cancelled: {r}"),
            Cause::ParentCancelled(origin) => write!(f, "parent cancelled ({origin})"),
            Cause::ClientGone => f.write_str("client gone"),
            Cause::Shutdown => f.write_str("server shutting down"),
        }
    }
}
