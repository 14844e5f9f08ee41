use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::service::{Admit, ReportFn};
use crate::wire::{Admission, EndpointPolicy};
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
    on_report: Option<ReportFn>,
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
            on_report: None,
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
        self.on_report = Some(Arc::new(f));
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
        Admit::from_parts(inner, self.policy, self.on_report.clone())
    }
}

impl fmt::Debug for AdmitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmitLayer")
            .field("policy", &self.policy)
            .field("on_report", &self.on_report.is_some())
            .finish()
    }
}
