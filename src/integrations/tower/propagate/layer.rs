use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use tower_layer::Layer;

use super::service::Propagate;
use crate::integrations::effect::{self, Class, UriTarget};
use crate::integrations::tower::headers;
use crate::reconcile::Journal;
use crate::wire::EgressPolicy;
use crate::ChildSpec;

/// Applies [`Propagate`] to a client service.
///
/// Calls are registered with the effect class their request shows (see
/// [`spec_for`](Self::spec_for)) unless a [`ChildSpec`] says otherwise: one in the request's
/// extensions, or the layer's own ([`spec`](Self::spec)).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::integrations::tower::PropagateLayer;
/// use cancel_scope::wire::EgressPolicy;
///
/// let layer = PropagateLayer::new()
///     .egress(EgressPolicy::builder().cap(Duration::from_millis(300)).build())
///     .name("inventory")
///     .read_only_method("/inventory.Inventory/Quote")
///     .idempotent_method("/inventory.Inventory/SetStock");
/// # let _ = layer;
/// ```
#[derive(Clone, Debug)]
pub struct PropagateLayer<J = ()> {
    config: Config,
    /// `()`, or the [`Journal`] the calls' intents are written to ([`journal`](Self::journal)).
    journal: J,
}

/// What a [`PropagateLayer`] was told, shared by the services it makes.
#[derive(Clone, Debug)]
pub(super) struct Config {
    pub(super) egress: Option<EgressPolicy>,
    /// A spec for every call: wins over the request's method.
    spec: Option<ChildSpec>,
    name: Arc<str>,
    /// gRPC methods (`/pkg.Service/Method`) or whole services (`/pkg.Service/`) that are not
    /// side-effecting.
    methods: HashMap<Box<str>, Class>,
    /// Calls outside any scope may pass, with at most this `grpc-timeout`.
    pub(super) unscoped: Option<Duration>,
    /// The `dependency` label of the calls' telemetry.
    pub(super) dependency: &'static str,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            egress: None,
            spec: None,
            name: Arc::from("call"),
            methods: HashMap::new(),
            unscoped: None,
            dependency: crate::telemetry::UNNAMED_DEPENDENCY,
        }
    }
}

impl Config {
    /// The spec of a call made with `req`, when its extensions hold none.
    pub(super) fn spec_for<B>(&self, req: &Request<B>) -> ChildSpec {
        if let Some(spec) = &self.spec {
            return spec.clone();
        }
        let class = if headers::is_grpc(req.headers()) {
            self.grpc_class(req.uri().path())
        } else {
            Class::of_method(req.method())
        };
        effect::spec(
            self.name.clone(),
            class,
            req.method(),
            &UriTarget(req.uri()),
            req.headers(),
        )
    }

    /// A gRPC call's class: the method's, else its service's, else side-effecting.
    fn grpc_class(&self, path: &str) -> Class {
        let service = path.rfind('/').map(|i| &path[..=i]);
        self.methods
            .get(path)
            .or_else(|| service.and_then(|s| self.methods.get(s)))
            .copied()
            .unwrap_or(Class::SideEffecting)
    }
}

impl PropagateLayer {
    /// Calls take the egress policy of their scope's operation, are named `"call"` and have
    /// the effect class of their request ([`spec_for`](Self::spec_for)); a call outside any
    /// scope is refused.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::PropagateLayer;
    /// let layer = PropagateLayer::new();
    /// assert!(layer.child_spec().is_none());
    /// assert_eq!(layer.unscoped_cap(), None);
    /// ```
    pub fn new() -> Self {
        PropagateLayer {
            config: Config::default(),
            journal: (),
        }
    }
}

impl<J> PropagateLayer<J> {
    /// Writes the intent of every call whose effect class `journal` records
    /// ([`Journal::records`]: by default side-effecting and idempotent calls) to its store
    /// before the call is sent, as [`Journal::dispatch`] does (the effect id and idempotency
    /// key of the call's [`ChildSpec`], the operation of its scope): a process killed after
    /// sending a write leaves an intent that a [`Reconciler`](crate::reconcile::Reconciler)
    /// finds. The call's receipt resolves it, off the call's path: `Succeeded` applied,
    /// `Failed` (refused unprocessed) not applied, `EffectUnknown` left pending.
    ///
    /// A store that fails, is slower than the journal's timeout or is full refuses the call
    /// before anything is sent: a plain request fails with
    /// [`CallError::is_intent_not_recorded`](crate::integrations::CallError::is_intent_not_recorded),
    /// a gRPC request gets a trailers-only `UNAVAILABLE`. The write is on the call's path:
    /// one store round trip per journaled call. Read-only calls are sent as without a journal.
    ///
    /// The services a journaling layer makes wait for the store before they call the inner
    /// service, so the inner service must be `Clone` (as hyper's and tonic's clients are):
    /// the one that was polled ready goes with the call, a clone takes its place.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cancel_scope::integrations::tower::PropagateLayer;
    /// use cancel_scope::reconcile::{InMemoryIntents, Journal};
    ///
    /// let journal = Journal::new(Arc::new(InMemoryIntents::new()));
    /// let layer = PropagateLayer::new().dependency("payments").journal(&journal);
    /// assert!(layer.journal_ref().records(&cancel_scope::ChildSpec::side_effecting("pay", "p-1")));
    /// ```
    pub fn journal(self, journal: &Journal) -> PropagateLayer<Journal> {
        PropagateLayer {
            config: self.config,
            journal: journal.clone(),
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
    /// let p = EgressPolicy::builder().reserve(Duration::from_millis(5)).build();
    /// assert_eq!(PropagateLayer::new().egress(p).egress_policy(), Some(&p));
    /// ```
    pub fn egress(mut self, egress: EgressPolicy) -> Self {
        self.config.egress = Some(egress);
        self
    }

    /// Registers every call as `spec`, whatever its request (a [`ChildSpec`] in a request's
    /// extensions still wins, e.g. for one call with an idempotency key).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::PropagateLayer;
    /// use cancel_scope::ChildSpec;
    /// let layer = PropagateLayer::new().spec(ChildSpec::read_only("users"));
    /// assert_eq!(layer.child_spec().unwrap().name(), "users");
    /// ```
    pub fn spec(mut self, spec: ChildSpec) -> Self {
        self.config.spec = Some(spec);
        self
    }

    /// Names the calls' children `name` (default `"call"`), keeping the effect class of each
    /// request.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::PropagateLayer;
    /// let layer = PropagateLayer::new().name("inventory");
    /// assert_eq!(layer.spec_for(&http::Request::new(())).name(), "inventory");
    /// ```
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.config.name = name.into();
        self
    }

    /// Names the service these calls go to in telemetry: the `dependency` label of the
    /// call metrics and the `cancel_scope.dependency` field of the call span (default
    /// [`UNNAMED_DEPENDENCY`](crate::telemetry::UNNAMED_DEPENDENCY)). A static name, as a
    /// label must be one of a bounded set: never a host or an address.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::PropagateLayer;
    /// let layer = PropagateLayer::new().dependency("inventory");
    /// assert_eq!(layer.dependency_name(), "inventory");
    /// ```
    pub fn dependency(mut self, name: &'static str) -> Self {
        self.config.dependency = name;
        self
    }

    /// The name of the service these calls go to, in telemetry ([`dependency`](Self::dependency)).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::PropagateLayer;
    /// assert_eq!(PropagateLayer::new().dependency_name(), "unnamed");
    /// ```
    pub fn dependency_name(&self) -> &'static str {
        self.config.dependency
    }

    /// Declares a gRPC method (`"/pkg.Service/Method"`), or every method of a service
    /// (`"/pkg.Service/"`), read-only: a call to it that is cut off is `Cancelled`, and an error
    /// status makes it `Failed`. gRPC calls are side-effecting otherwise.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::PropagateLayer;
    /// use cancel_scope::Effect;
    /// let layer = PropagateLayer::new().read_only_method("/inventory.Inventory/");
    /// let req = http::Request::post("/inventory.Inventory/Quote")
    ///     .header("content-type", "application/grpc")
    ///     .body(())
    ///     .unwrap();
    /// assert_eq!(layer.spec_for(&req).effect(), &Effect::ReadOnly);
    /// ```
    pub fn read_only_method(mut self, path: impl Into<Box<str>>) -> Self {
        self.config.methods.insert(path.into(), Class::ReadOnly);
        self
    }

    /// Declares a gRPC method (or, ending in `/`, a whole service) idempotent: safe to retry,
    /// still an effect (cut off after it was sent, it is `EffectUnknown`). Its key is the
    /// request's `idempotency-key` metadata, else the method and target.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::PropagateLayer;
    /// let layer = PropagateLayer::new().idempotent_method("/inventory.Inventory/SetStock");
    /// let req = http::Request::post("/inventory.Inventory/SetStock")
    ///     .header("content-type", "application/grpc")
    ///     .header("idempotency-key", "stock-7")
    ///     .body(())
    ///     .unwrap();
    /// assert_eq!(layer.spec_for(&req).effect().key(), Some("stock-7"));
    /// ```
    pub fn idempotent_method(mut self, path: impl Into<Box<str>>) -> Self {
        self.config.methods.insert(path.into(), Class::Idempotent);
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

    /// The spec every call is registered as, if one was set ([`spec`](Self::spec)).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::PropagateLayer;
    /// assert!(PropagateLayer::new().child_spec().is_none());
    /// ```
    pub fn child_spec(&self) -> Option<&ChildSpec> {
        self.config.spec.as_ref()
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

    /// What a call made with `req` is registered as when its extensions hold no
    /// [`ChildSpec`]: the layer's [`spec`](Self::spec) if set, else by the request:
    ///
    /// | request | effect | id / key |
    /// |---|---|---|
    /// | `GET`, `HEAD`, `OPTIONS`, `TRACE` | read-only | – |
    /// | with an `Idempotency-Key` (not read-only) | idempotent | the header's value |
    /// | `PUT`, `DELETE`; a gRPC method declared [idempotent](Self::idempotent_method) | idempotent | `"PUT http://host/path"`: method and target |
    /// | `POST`, `PATCH`, other methods; gRPC | side-effecting | `"POST http://host/path (call N)"`, N unique in the process |
    /// | a gRPC method declared [read-only](Self::read_only_method) | read-only | – |
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::PropagateLayer;
    /// use cancel_scope::Effect;
    /// let layer = PropagateLayer::new();
    /// let put = http::Request::put("http://orders/orders/42").body(()).unwrap();
    /// assert_eq!(layer.spec_for(&put).effect().key(), Some("PUT http://orders/orders/42"));
    /// let post = http::Request::post("http://orders/orders").body(()).unwrap();
    /// assert_eq!(layer.spec_for(&post).effect(), &Effect::SideEffecting);
    /// ```
    pub fn spec_for<B>(&self, req: &Request<B>) -> ChildSpec {
        self.config.spec_for(req)
    }
}

impl Default for PropagateLayer {
    fn default() -> Self {
        PropagateLayer::new()
    }
}

impl PropagateLayer<Journal> {
    /// The journal the calls' intents are written to ([`journal`](Self::journal)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cancel_scope::integrations::tower::PropagateLayer;
    /// use cancel_scope::reconcile::{InMemoryIntents, Journal};
    /// let journal = Journal::new(Arc::new(InMemoryIntents::new()));
    /// let layer = PropagateLayer::new().journal(&journal);
    /// assert!(Arc::ptr_eq(layer.journal_ref().store(), journal.store()));
    /// ```
    pub fn journal_ref(&self) -> &Journal {
        &self.journal
    }
}

impl<S, J: Clone> Layer<S> for PropagateLayer<J> {
    type Service = Propagate<S, J>;

    fn layer(&self, inner: S) -> Propagate<S, J> {
        Propagate::from_parts(inner, Arc::new(self.config.clone()), self.journal.clone())
    }
}
