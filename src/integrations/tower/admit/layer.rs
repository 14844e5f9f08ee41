use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::service::{Admit, Hooks};
use crate::wire::{Admission, AdmissionError, EndpointPolicy, ServerScope};
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

// `Hooks` carries the server (see `AdmitLayer::server`): one `Arc` to clone per service.

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
                server: None,
            },
        }
    }

    /// Admits every request as a child of `server`'s scope
    /// ([`EndpointPolicy::admit_in`]): its shutdown ([`ServerScope::shutdown`]) stops
    /// admitting (503 / `UNAVAILABLE` with `Retry-After`, `service-effect: none`), waits for
    /// the requests in flight, cancels the stragglers with
    /// [`Cause::Shutdown`](crate::Cause::Shutdown) and reports. Several layers (routes with
    /// different policies, an HTTP and a gRPC server) can share one server.
    ///
    /// Without a server, each request's scope is a root, and nothing drains them.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::AdmitLayer;
    /// use cancel_scope::wire::{EndpointPolicy, ServerScope};
    /// let server = ServerScope::new();
    /// let layer = AdmitLayer::new(EndpointPolicy::new(Duration::from_secs(1), Duration::ZERO))
    ///     .server(&server);
    /// assert!(layer.server_scope().is_some());
    /// ```
    pub fn server(mut self, server: &ServerScope) -> Self {
        self.hooks.server = Some(server.clone());
        self
    }

    /// The server the layer admits requests under, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::AdmitLayer;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let layer = AdmitLayer::new(EndpointPolicy::new(Duration::from_secs(1), Duration::ZERO));
    /// assert!(layer.server_scope().is_none());
    /// ```
    pub fn server_scope(&self) -> Option<&ServerScope> {
        self.hooks.server.as_ref()
    }

    /// Calls `f` with every request's admission record and [`Report`] once its scope is
    /// quiet: the handler has answered (or the deadline passed, or the client left) and every
    /// child and task of the request has its receipt. The handler itself is one child of the
    /// request: `Succeeded` once it answered (`Failed` for a 5xx of its own, or a panic, whose
    /// message the report lists as a failure of `handler`; `Cancelled` if the request was
    /// stopped first). A request the layer refuses is not admitted, so it has no report: it
    /// goes to [`on_refusal`](Self::on_refusal).
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
    /// rejected budget header, too little budget left on arrival, a server whose shutdown
    /// began: [`AdmissionError::is_unavailable`]), before it answers: the
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
            .field("server", &self.hooks.server)
            .finish()
    }
}
