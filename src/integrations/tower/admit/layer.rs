use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::service::{Admit, Hooks};
use crate::wire::{Admission, AdmissionError, EndpointPolicy};
use crate::Report;

/// Applies [`Admit`] to a service: admission of every request under an
/// [`EndpointPolicy`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::integrations::tower::AdmitLayer;
/// use cancel_scope::wire::EndpointPolicy;
///
/// let layer = AdmitLayer::new(EndpointPolicy::new(Duration::from_secs(2), Duration::from_secs(1)));
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct AdmitLayer {
    policy: EndpointPolicy,
    hooks: Hooks,
}

impl AdmitLayer {
    /// A layer admitting requests under `policy`, without a report callback.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::AdmitLayer;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let layer = AdmitLayer::new(EndpointPolicy::new(Duration::from_secs(1), Duration::ZERO));
    /// assert_eq!(layer.policy().max_budget(), Duration::from_secs(1));
    /// ```
    pub const fn new(policy: EndpointPolicy) -> Self {
        AdmitLayer {
            policy,
            hooks: Hooks {
                on_report: None,
                on_refusal: None,
            },
        }
    }

    /// Calls `f` with every request's admission record and [`Report`] once its scope is
    /// quiet: the handler has answered (or the deadline passed, or the client left) and every
    /// child and task of the request has its receipt.
    ///
    /// `f` runs on a tokio task; keep it short.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::AdmitLayer;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let layer = AdmitLayer::new(EndpointPolicy::new(Duration::from_secs(1), Duration::ZERO))
    ///     .on_report(|admission, report| eprintln!("{} {report}", admission.operation_id()));
    /// # let _ = layer;
    /// ```
    pub fn on_report<F>(mut self, f: F) -> Self
    where
        F: Fn(&Admission, &Report) + Send + Sync + 'static,
    {
        self.hooks.on_report = Some(Arc::new(f));
        self
    }

    /// Calls `f` with the error of every request the layer refuses (a bad, repeated or
    /// rejected budget header, too little budget left on arrival), before it answers: the
    /// detail that a caller the policy does not
    /// [show it to](crate::wire::EndpointPolicy::error_detail) gets as one fixed text. The
    /// handler never runs for such a request, and no report follows.
    ///
    /// `f` runs in the service's `call`; keep it short.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::AdmitLayer;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let layer = AdmitLayer::new(EndpointPolicy::new(Duration::from_secs(1), Duration::ZERO))
    ///     .on_refusal(|err| eprintln!("refused: {err}"));
    /// # let _ = layer;
    /// ```
    pub fn on_refusal<F>(mut self, f: F) -> Self
    where
        F: Fn(&AdmissionError) + Send + Sync + 'static,
    {
        self.hooks.on_refusal = Some(Arc::new(f));
        self
    }

    /// The policy.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::AdmitLayer;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::ZERO);
    /// assert_eq!(*AdmitLayer::new(p).policy(), p);
    /// ```
    pub fn policy(&self) -> &EndpointPolicy {
        &self.policy
    }
}

impl<S> Layer<S> for AdmitLayer {
    type Service = Admit<S>;

    fn layer(&self, inner: S) -> Admit<S> {
        Admit::from_parts(inner, self.policy, self.hooks.clone())
    }
}

impl fmt::Debug for AdmitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmitLayer")
            .field("policy", &self.policy)
            .field("on_report", &self.hooks.on_report.is_some())
            .field("on_refusal", &self.hooks.on_refusal.is_some())
            .finish()
    }
}
