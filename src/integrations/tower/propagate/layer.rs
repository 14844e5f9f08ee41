use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::service::Propagate;
use crate::wire::EgressPolicy;
use crate::ChildSpec;

/// Applies [`Propagate`] to a client service.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::integrations::tower::PropagateLayer;
/// use cancel_scope::wire::EgressPolicy;
/// use cancel_scope::ChildSpec;
///
/// let layer = PropagateLayer::new()
///     .egress(EgressPolicy::new().cap(Duration::from_millis(300)))
///     .spec(ChildSpec::read_only("inventory"));
/// # let _ = layer;
/// ```
#[derive(Clone, Debug)]
pub struct PropagateLayer {
    config: Config,
}

/// What a [`PropagateLayer`] was told, shared by the services it makes.
#[derive(Clone, Debug)]
pub(super) struct Config {
    pub(super) egress: Option<EgressPolicy>,
    pub(super) spec: ChildSpec,
    /// Calls outside any scope may pass, with at most this `grpc-timeout`.
    pub(super) unscoped: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            egress: None,
            spec: ChildSpec::read_only("call"),
            unscoped: None,
        }
    }
}

impl PropagateLayer {
    /// Calls take the egress policy of their scope's operation and are registered as
    /// read-only children named `"call"`; a call outside any scope is refused.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::PropagateLayer;
    /// assert_eq!(PropagateLayer::new().child_spec().name(), "call");
    /// assert_eq!(PropagateLayer::new().unscoped_cap(), None);
    /// ```
    pub fn new() -> Self {
        PropagateLayer {
            config: Config::default(),
        }
    }

    /// Uses `egress` for every call instead of the scope's operation's.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::PropagateLayer;
    /// use cancel_scope::wire::EgressPolicy;
    /// let p = EgressPolicy::new().reserve(Duration::from_millis(5));
    /// assert_eq!(PropagateLayer::new().egress(p).egress_policy(), Some(&p));
    /// ```
    pub fn egress(mut self, egress: EgressPolicy) -> Self {
        self.config.egress = Some(egress);
        self
    }

    /// Registers calls as `spec` (a [`ChildSpec`] in a request's extensions overrides it, e.g.
    /// for a side-effecting call with an idempotency key).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::PropagateLayer;
    /// use cancel_scope::ChildSpec;
    /// let layer = PropagateLayer::new().spec(ChildSpec::read_only("users"));
    /// assert_eq!(layer.child_spec().name(), "users");
    /// ```
    pub fn spec(mut self, spec: ChildSpec) -> Self {
        self.config.spec = spec;
        self
    }

    /// Lets calls made outside any scope through, instead of refusing them: such a call is
    /// not registered anywhere (nothing stops it, nothing reports it), its `service-budget`
    /// and Envoy headers are removed, and it carries a `grpc-timeout` of at most `cap` (the
    /// caller's own, if shorter and valid).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::PropagateLayer;
    /// let layer = PropagateLayer::new().allow_unscoped(Duration::from_secs(2));
    /// assert_eq!(layer.unscoped_cap(), Some(Duration::from_secs(2)));
    /// ```
    pub fn allow_unscoped(mut self, cap: Duration) -> Self {
        self.config.unscoped = Some(cap);
        self
    }

    /// The explicit egress policy, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::PropagateLayer;
    /// assert_eq!(PropagateLayer::new().egress_policy(), None);
    /// ```
    pub fn egress_policy(&self) -> Option<&EgressPolicy> {
        self.config.egress.as_ref()
    }

    /// The spec calls are registered as.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::PropagateLayer;
    /// assert!(!PropagateLayer::new().child_spec().effect().may_have_effect());
    /// ```
    pub fn child_spec(&self) -> &ChildSpec {
        &self.config.spec
    }

    /// The most a call outside any scope may carry as `grpc-timeout`, if such calls are let
    /// through ([`allow_unscoped`](Self::allow_unscoped)).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::PropagateLayer;
    /// assert_eq!(PropagateLayer::new().unscoped_cap(), None);
    /// ```
    pub fn unscoped_cap(&self) -> Option<Duration> {
        self.config.unscoped
    }
}

impl Default for PropagateLayer {
    fn default() -> Self {
        PropagateLayer::new()
    }
}

impl<S> Layer<S> for PropagateLayer {
    type Service = Propagate<S>;

    fn layer(&self, inner: S) -> Propagate<S> {
        Propagate::from_config(inner, Arc::new(self.config.clone()))
    }
}
