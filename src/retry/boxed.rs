//! A classifier behind one nameable type, for policies stored in structs and statics.

use std::fmt;
use std::sync::Arc;

use super::backoff::Exponential;
use super::classify::{Classify, Decision};
use super::Retry;

/// Any classifier of errors `E` — a closure, a built-in classifier such as
/// `integrations::classify::HttpClassifier` — behind one type that can be named, shared and
/// cloned (an `Arc`): a policy in an application's state is then a [`BoxRetry<E>`], without
/// spelling out the closure's type or casting it to a `fn` pointer.
///
/// # Examples
///
/// ```
/// use cancel_scope::retry::{BoxClassify, Classify, Decision};
/// let classify = BoxClassify::new(|e: &std::io::Error| match e.kind() {
///     std::io::ErrorKind::ConnectionRefused => Decision::SwitchEndpoint,
///     _ => Decision::Never,
/// });
/// let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
/// assert_eq!(classify.clone().classify(&refused), Decision::SwitchEndpoint);
/// ```
pub struct BoxClassify<E>(Arc<dyn Classify<E> + Send + Sync>);

impl<E> BoxClassify<E> {
    /// `classify`, boxed.
    ///
    /// # Examples
    ///
    /// See [`BoxClassify`].
    pub fn new(classify: impl Classify<E> + Send + Sync + 'static) -> Self {
        BoxClassify(Arc::new(classify))
    }
}

impl<E> Classify<E> for BoxClassify<E> {
    fn classify(&self, error: &E) -> Decision {
        self.0.classify(error)
    }
}

impl<E> Clone for BoxClassify<E> {
    fn clone(&self) -> Self {
        BoxClassify(self.0.clone())
    }
}

impl<E> fmt::Debug for BoxClassify<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BoxClassify(..)")
    }
}

/// A retry policy whose classifier is boxed ([`BoxClassify`]): a type to name in a struct
/// field, made by [`Retry::boxed`]. `B` is the backoff schedule ([`Exponential`] unless
/// [`backoff`](Retry::backoff) changed it).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::retry::{BoxRetry, Decision, Retry};
/// use cancel_scope::{ChildSpec, Scope};
///
/// #[derive(Clone)]
/// struct AppState {
///     inventory: BoxRetry<std::io::Error>,
/// }
///
/// let state = AppState {
///     inventory: Retry::boxed(|_: &std::io::Error| Decision::Backoff).max_attempts(2),
/// };
/// let scope = Scope::with_timeout(Duration::from_secs(1));
/// let n = state
///     .inventory
///     .run(&scope, ChildSpec::read_only("inventory"), |a| async move { Ok::<_, std::io::Error>(a.number()) })
///     .await
///     .unwrap();
/// assert_eq!(n, 1);
/// # }
/// ```
pub type BoxRetry<E, B = Exponential> = Retry<BoxClassify<E>, B>;

impl<E> Retry<BoxClassify<E>> {
    /// A policy with the default limits and `classify` boxed: a [`BoxRetry<E>`].
    ///
    /// # Examples
    ///
    /// See [`BoxRetry`].
    pub fn boxed(classify: impl Classify<E> + Send + Sync + 'static) -> Self {
        Retry::new(BoxClassify::new(classify))
    }
}
