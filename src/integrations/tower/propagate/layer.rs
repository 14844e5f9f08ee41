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
    egress: Option<EgressPolicy>,
    spec: ChildSpec,
}

impl PropagateLayer {
    /// Calls take the egress policy of their scope's operation and are registered as
    /// read-only children named `"call"`.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::PropagateLayer;
    /// assert_eq!(PropagateLayer::new().child_spec().name(), "call");
    /// ```
    pub fn new() -> Self {
        PropagateLayer {
            egress: None,
            spec: ChildSpec::read_only("call"),
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
        self.egress = Some(egress);
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
        self.spec = spec;
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
        self.egress.as_ref()
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
        &self.spec
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
        Propagate::from_parts(inner, self.egress, self.spec.clone())
    }
}
