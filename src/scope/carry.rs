//! Carrying a scope into a future (or stream) that runs somewhere else — a bare
//! `tokio::spawn`, a library's own spawn — without making it work of the scope.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::{with_current, Scope};

/// Carries a scope into a future or stream, as tracing's `Instrument` carries a span: every
/// poll (and the drop) of the wrapped value runs with that scope as [`Scope::current`].
///
/// Implemented for every type; the wrapper is a future when the value is one (and a
/// `futures_core::Stream` when it is one, with the `stream` feature).
///
/// # What it does
///
/// Code inside sees the scope ([`Scope::current`], [`Scope::try_current`]), so the calls it
/// makes are bounded by it: a child it builds gets at most the scope's budget and is
/// cancelled with it, a database or HTTP call of this crate's integrations that takes the
/// current scope is registered in it, and nothing new starts there after the scope's cancel.
///
/// # What it does not do
///
/// The carried future is *not* work of the scope:
///
/// * it is not registered: it has no [`Receipt`](crate::Receipt), and a
///   [`Report`](crate::Report) does not count it;
/// * it is not stopped when the scope is cancelled: it runs on (what it starts there is
///   refused or cancelled, but its own code goes on) until it ends or its task is dropped;
/// * [`quiesce`](Scope::quiesce) does not wait for it: the scope can be quiet, and its report
///   final, while the carried future still runs.
///
/// So carry a scope only into work that something else already bounds (a library's task that
/// ends with the call that started it), or that must outlive the scope's accounting. For
/// work that belongs to the scope, use [`Scope::spawn`] (registered: a receipt, stopped at the
/// cancel, quarantined if it does not stop, waited for by `quiesce`) or move a
/// [`Scope::run`] into the spawn (`tokio::spawn(scope.run(fut))`: stopped at the cancel, and
/// `quiesce` waits for it, but no receipt of its own).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::{CarryScope, Scope};
///
/// let request = Scope::with_timeout(Duration::from_millis(100));
/// let remaining = request.run(async {
///     // A bare spawn starts with no current scope; the carried future has the request's.
///     tokio::spawn(async { Scope::current().remaining() }.in_current_scope()).await
/// });
/// let remaining = remaining.await.unwrap().unwrap();
/// assert_eq!(remaining, Some(Duration::from_millis(100)));
/// # }
/// ```
pub trait CarryScope: Sized {
    /// Wraps `self` so that it is polled (and dropped) with `scope` current.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::{CarryScope, Scope};
    /// let scope = Scope::new();
    /// let seen = tokio::spawn(async { Scope::try_current().is_some() }.with_scope(&scope));
    /// assert!(seen.await.unwrap());
    /// # }
    /// ```
    fn with_scope(self, scope: &Scope) -> Carried<Self> {
        Carried::new(self, Some(scope.clone()))
    }

    /// Wraps `self` so that it is polled (and dropped) with the scope that is current here, if
    /// any (if none is, none is current inside either, wherever it is polled).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::{CarryScope, Scope};
    /// let scope = Scope::new();
    /// let carried = scope.run(async { async { Scope::current() }.in_current_scope() })
    ///     .await
    ///     .unwrap();
    /// let seen = tokio::spawn(carried).await.unwrap();
    /// assert_eq!(seen.generation(), scope.generation());
    /// # }
    /// ```
    fn in_current_scope(self) -> Carried<Self> {
        Carried::new(self, Scope::try_current())
    }
}

impl<T> CarryScope for T {}

pin_project! {
    /// A future or stream polled with a scope current; made by [`CarryScope`], which says what
    /// it does and does not do.
    ///
    /// # Cancel safety
    ///
    /// As cancel safe as the wrapped future or stream.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::{Carried, CarryScope, Scope};
    /// let scope = Scope::new();
    /// let carried: Carried<_> = async { Scope::current().is_cancelled() }.with_scope(&scope);
    /// assert!(!carried.await);
    /// # }
    /// ```
    #[must_use = "futures and streams do nothing unless polled"]
    pub struct Carried<T> {
        // `None` once dropped (with the scope current, see the drop).
        #[pin]
        inner: Option<T>,
        // In the current-scope slot while `inner` is polled or dropped, here otherwise.
        scope: Option<Scope>,
    }

    impl<T> PinnedDrop for Carried<T> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            let mut inner = this.inner;
            // Dropped as it ran: with the scope current (a drop that cleans up may ask).
            with_current(this.scope, || inner.set(None));
        }
    }
}

impl<T> Carried<T> {
    fn new(inner: T, scope: Option<Scope>) -> Self {
        Carried {
            inner: Some(inner),
            scope,
        }
    }

    /// The scope carried in (`None`: none was current where it was made).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{CarryScope, Scope};
    /// assert!(async {}.in_current_scope().scope().is_none());
    /// ```
    pub fn scope(&self) -> Option<&Scope> {
        self.scope.as_ref()
    }

    /// Polls the wrapped value with the scope current.
    fn poll_with<R>(self: Pin<&mut Self>, f: impl FnOnce(Pin<&mut T>) -> R) -> R {
        let this = self.project();
        let Some(inner) = this.inner.as_pin_mut() else {
            unreachable!("`Carried` holds its value until dropped");
        };
        with_current(this.scope, || f(inner))
    }
}

impl<F: Future> Future for Carried<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.poll_with(|f| f.poll(cx))
    }
}

#[cfg(feature = "stream")]
impl<S: futures_core::Stream> futures_core::Stream for Carried<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        self.poll_with(|s| s.poll_next(cx))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.as_ref().map_or((0, Some(0)), |s| s.size_hint())
    }
}

impl<T> fmt::Debug for Carried<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Carried")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}
