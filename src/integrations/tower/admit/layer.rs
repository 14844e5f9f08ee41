use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::service::{Admit, Hooks};
use crate::registry::Operations;
#[cfg(feature = "rollout")]
use crate::wire::PolicyHandle;
use crate::wire::{
    Admission, AdmissionError, EndpointPolicy, PolicySource, RejectionCap, ServerScope,
};
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
/// let layer = AdmitLayer::new(EndpointPolicy::builder(Duration::from_secs(2))
///     .default_budget(Duration::from_secs(1))
///     .build());
/// # let _ = layer;
/// ```
///
/// `R` is `()`, or [`Operations`] once the layer is given a registry
/// ([`operations`](Self::operations)).
#[derive(Clone)]
pub struct AdmitLayer<R = ()> {
    policy: PolicySource,
    hooks: Hooks,
    registry: R,
}

// `Hooks` carries the server (see `AdmitLayer::server`): one `Arc` to clone per service.

impl AdmitLayer {
    /// A layer admitting requests under `policy`, without a report callback.
    ///
    /// A policy with rejection cap settings
    /// ([`EndpointPolicyBuilder::rejection_cap`](crate::wire::EndpointPolicyBuilder::rejection_cap))
    /// gives the layer one window, shared by every service it makes: make the layer once per
    /// endpoint, not once per connection (a window per connection would let a client that
    /// opens one per bad request through every time).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::AdmitLayer;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let layer = AdmitLayer::new(EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build());
    /// assert_eq!(layer.policy().max_budget(), Duration::from_secs(1));
    /// ```
    pub fn new(policy: EndpointPolicy) -> Self {
        AdmitLayer {
            policy: PolicySource::Fixed(policy),
            hooks: Hooks {
                on_report: None,
                on_refusal: None,
                server: None,
                cap: None,
                configured_cap: Hooks::window_for(&policy),
            },
            registry: (),
        }
    }

    /// A layer admitting each request under the current version of `policies` (see
    /// [`PolicyHandle`]): a [`set`](PolicyHandle::set) or
    /// [`rollback`](PolicyHandle::rollback) applies from the next request on, without
    /// rebuilding the layer or restarting the server. A request is admitted under one version
    /// from its headers to its report; its [`Admission`], its outgoing `service-budget`
    /// headers (`pv`) and its [`Report`] name it. The registry, the server and the hooks
    /// given to the layer are not part of a version: a rollback keeps them.
    ///
    /// A version's rejection cap settings ([`EndpointPolicyBuilder::rejection_cap`](crate::wire::EndpointPolicyBuilder::rejection_cap), from
    /// configuration: [`PolicyConfig::rejection_cap`](crate::wire::PolicyConfig::rejection_cap))
    /// apply to the requests it admits, counted in one window of the layer's, kept across
    /// swaps and rollbacks (a swap does not reset the counts). A cap given with
    /// [`rejection_cap`](Self::rejection_cap) wins over the versions' settings.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::AdmitLayer;
    /// use cancel_scope::wire::{EndpointPolicy, PolicyHandle};
    /// let s = Duration::from_secs;
    /// let policies = PolicyHandle::new(EndpointPolicy::builder(s(2))
    ///     .default_budget(s(1))
    ///     .version(1)
    ///     .build())?;
    /// let layer = AdmitLayer::versioned(&policies);
    /// policies.set(EndpointPolicy::builder(s(2))
    ///     .default_budget(s(1))
    ///     .reserve(Duration::from_millis(20))
    ///     .version(2)
    ///     .build())?;
    /// assert_eq!(layer.policies().unwrap().version(), 2);
    /// # Ok::<(), cancel_scope::wire::PolicyError>(())
    /// ```
    #[cfg(feature = "rollout")]
    pub fn versioned(policies: &PolicyHandle) -> Self {
        let mut layer = AdmitLayer {
            policy: PolicySource::Versions {
                handle: policies.clone(),
                made_with: policies.current(),
            },
            ..AdmitLayer::new(policies.current())
        };
        layer.hooks.configured_cap = Some(Arc::new(crate::sync::OnceLock::new()));
        layer
    }

    /// Admits every request with the operation registry's term
    /// ([`EndpointPolicy::admit_joined`]): the request joins its operation through `ops`, its
    /// budget is at most what the operation has left, a request of a cancelled operation (or
    /// of an older generation) is refused with 409 / `ABORTED` (`operation cancelled`,
    /// `service-effect: none`, through [`on_refusal`](Self::on_refusal)), and the request's
    /// scope is cancelled by the operation's cancel, also one made in another process. Who
    /// may name an operation follows the policy's
    /// [`caller_operation`](crate::wire::EndpointPolicyBuilder::caller_operation) (see
    /// [`admit_joined`](EndpointPolicy::admit_joined)). A registry that fails or is slow
    /// (bounded by [`Operations::timeout`] and the request's budget) does not stop
    /// admission: the request runs on the endpoint's own terms, the fault counted and in its
    /// report.
    ///
    /// The handler is then called once the registry has answered, by the service the
    /// server polled ready (a clone of it takes its place in the layer): the service must be
    /// `Clone + Send + 'static`, as axum's routers and tonic's services are.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::AdmitLayer;
    /// use cancel_scope::registry::{InProcessRegistry, Operations};
    /// use cancel_scope::wire::EndpointPolicy;
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// let layer = AdmitLayer::new(EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build())
    ///     .operations(&ops);
    /// assert_eq!(layer.registry().counts().joined(), 0);
    /// ```
    pub fn operations(self, ops: &Operations) -> AdmitLayer<Operations> {
        AdmitLayer {
            policy: self.policy,
            hooks: self.hooks,
            registry: ops.clone(),
        }
    }
}

impl AdmitLayer<Operations> {
    /// The operation registry the layer's requests join.
    ///
    /// # Examples
    ///
    /// See [`operations`](AdmitLayer::operations).
    pub fn registry(&self) -> &Operations {
        &self.registry
    }
}

impl<R> AdmitLayer<R> {
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
    /// let layer = AdmitLayer::new(EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build())
    ///     .server(&server);
    /// assert!(layer.server_scope().is_some());
    /// ```
    pub fn server(mut self, server: &ServerScope) -> Self {
        self.hooks.server = Some(server.clone());
        self
    }

    /// Caps the layer's refusals: at most `cap`'s percentage of the requests over its window
    /// are refused by the budget rules (a malformed, repeated or over-long budget header, too
    /// little budget left); beyond it a refusal runs as a shadow decision, bounded by
    /// `min(declared or default, default, maximum − queued)`, recorded in its
    /// [`Admission`] and [`Report`] (see [`RejectionCap`]). The window is `cap`'s, shared by
    /// its clones: give each endpoint its own. It belongs to the layer, not to a policy
    /// version: a [versioned](AdmitLayer::versioned) layer keeps its window across swaps and
    /// rollbacks. This cap wins over the settings a version brings
    /// ([`EndpointPolicyBuilder::rejection_cap`](crate::wire::EndpointPolicyBuilder::rejection_cap)): its percentage and window hold whatever the
    /// versions say. Without a cap, and under a policy (or version) without settings, every
    /// refusal is enforced.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::AdmitLayer;
    /// use cancel_scope::wire::{EndpointPolicy, RejectionCap};
    /// let cap = RejectionCap::default(); // 20 % over 10 s, as Finagle's DeadlineFilter
    /// let layer = AdmitLayer::new(EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build())
    ///     .rejection_cap(&cap);
    /// assert_eq!(layer.rejections().map(RejectionCap::percent), Some(20));
    /// # }
    /// ```
    pub fn rejection_cap(mut self, cap: &RejectionCap) -> Self {
        self.hooks.cap = Some(cap.clone());
        self
    }

    /// The rejection cap given to the layer, if any (see
    /// [`rejection_cap`](Self::rejection_cap)); not the window a layer keeps for its policy's
    /// or its versions' settings
    /// ([`EndpointPolicyBuilder::rejection_cap`](crate::wire::EndpointPolicyBuilder::rejection_cap)).
    ///
    /// # Examples
    ///
    /// See [`rejection_cap`](Self::rejection_cap).
    pub fn rejections(&self) -> Option<&RejectionCap> {
        self.hooks.cap.as_ref()
    }

    /// The server the layer admits requests under, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::AdmitLayer;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let layer = AdmitLayer::new(EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build());
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
    /// let layer = AdmitLayer::new(EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build())
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
    /// [show it to](crate::wire::EndpointPolicyBuilder::error_detail) gets as one fixed text. The
    /// handler never runs for such a request, and no report follows.
    ///
    /// `f` runs in the service's `call` (with a [registry](Self::operations), when the
    /// response future is first polled after the registry answered); keep it short.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::AdmitLayer;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let layer = AdmitLayer::new(EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build())
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

    /// The policy: the one given to [`new`](AdmitLayer::new), or for a
    /// [versioned](AdmitLayer::versioned) layer, the version that was current when it was
    /// made (its requests are admitted under the handle's version of the moment:
    /// [`policies`](Self::policies)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::AdmitLayer;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build();
    /// assert_eq!(*AdmitLayer::new(p).policy(), p);
    /// ```
    pub fn policy(&self) -> &EndpointPolicy {
        self.policy.policy()
    }

    /// The policy versions the layer reads per request, if it was made with
    /// [`versioned`](AdmitLayer::versioned).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::AdmitLayer;
    /// use cancel_scope::wire::{EndpointPolicy, PolicyHandle};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build();
    /// assert!(AdmitLayer::new(p).policies().is_none());
    /// let h = PolicyHandle::new(p.to_builder().version(1).build())?;
    /// assert_eq!(AdmitLayer::versioned(&h).policies().map(|h| h.version()), Some(1));
    /// # Ok::<(), cancel_scope::wire::PolicyError>(())
    /// ```
    #[cfg(feature = "rollout")]
    pub fn policies(&self) -> Option<&PolicyHandle> {
        self.policy.handle()
    }
}

impl<S, R: Clone> Layer<S> for AdmitLayer<R> {
    type Service = Admit<S, R>;

    fn layer(&self, inner: S) -> Admit<S, R> {
        Admit::from_parts(
            inner,
            self.policy.clone(),
            self.hooks.clone(),
            self.registry.clone(),
        )
    }
}

impl<R: fmt::Debug> fmt::Debug for AdmitLayer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmitLayer")
            .field("policy", &self.policy)
            .field("on_report", &self.hooks.on_report.is_some())
            .field("on_refusal", &self.hooks.on_refusal.is_some())
            .field("server", &self.hooks.server)
            .field("rejection_cap", &self.hooks.cap)
            .field("registry", &self.registry)
            .finish()
    }
}
