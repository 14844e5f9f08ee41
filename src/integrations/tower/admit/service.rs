use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tokio::time::Instant;
use tower_service::Service;

use super::answer::Answers;
use super::body::ResponseBody;
use super::finish::Finish;
use super::future::ResponseFuture;
use super::layer::AdmitLayer;
use crate::integrations::effect::{Class, IDEMPOTENCY_KEY};
use crate::integrations::tower::headers;
use crate::registry::Operations;
use crate::wire::{
    Admission, AdmissionError, EndpointPolicy, Incoming, PolicySource, RejectionCap, RequestClass,
    ServerScope,
};
use crate::Report;

pub(super) type ReportFn = Arc<dyn Fn(&Admission, &Report) + Send + Sync>;
pub(super) type RefusalFn = Arc<dyn Fn(&AdmissionError) + Send + Sync>;

/// The callbacks of a layer, and the server it admits under.
#[derive(Clone, Default)]
pub(super) struct Hooks {
    pub(super) on_report: Option<ReportFn>,
    pub(super) on_refusal: Option<RefusalFn>,
    pub(super) server: Option<ServerScope>,
    /// The rejection cap the layer's refusals count in.
    pub(super) cap: Option<RejectionCap>,
    /// The layer's own window, made at the first request whose policy (or version) has
    /// rejection cap settings (see `EndpointPolicyBuilder::rejection_cap`), and shared by the
    /// layer's services.
    pub(super) configured_cap: Option<Arc<crate::sync::OnceLock<RejectionCap>>>,
}

impl Hooks {
    /// The window of a layer (or service) made with `policy`: its own, if the policy brings
    /// rejection cap settings (see `EndpointPolicyBuilder::rejection_cap`).
    pub(super) fn window_for(
        policy: &EndpointPolicy,
    ) -> Option<Arc<crate::sync::OnceLock<RejectionCap>>> {
        policy
            .rejection_limit()
            .map(|_| Arc::new(crate::sync::OnceLock::new()))
    }

    /// The layer's own window under `policy`'s rejection cap settings, if it has them (made on
    /// the first ask; see `EndpointPolicyBuilder::rejection_cap`).
    fn configured_cap(&self, policy: &EndpointPolicy) -> Option<&RejectionCap> {
        let (percent, window) = policy.rejection_limit()?;
        let cap = self
            .configured_cap
            .as_ref()?
            .get_or_init(|| RejectionCap::new(percent, window));
        cap.apply(percent, window, Instant::now());
        Some(cap)
    }
}

/// When a request arrived, if an outer layer (or the accept loop) knows better than
/// [`Admit`], which otherwise takes the moment its `poll_ready` first found the service not
/// ready (the request waited for it, as `oneshot` and servers drive a service), or else the
/// moment it is called. Put it in the request's extensions; the time since then counts as
/// queued and is taken off the budget. (A service polled ready ahead of its requests, with no
/// request waiting, should put it there.)
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use cancel_scope::integrations::tower::Ingress;
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(Ingress(tokio::time::Instant::now()));
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ingress(pub Instant);

/// Admits every request into its own root scope (see [the module docs](super)).
///
/// The handler runs with the request's scope as [`Scope::current`](crate::Scope::current);
/// the request's extensions also carry the [`Scope`](crate::Scope) and the [`Admission`]. The
/// raw budget headers (`grpc-timeout`, `service-budget`, `x-envoy-expected-rq-timeout-ms`)
/// are taken off the request before the handler sees it ([`Incoming::take_from`]): what they
/// said is in the `Admission`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::integrations::tower::Admit;
/// use cancel_scope::wire::EndpointPolicy;
///
/// let policy = EndpointPolicy::builder(Duration::from_secs(2))
///     .default_budget(Duration::from_secs(1))
///     .build();
/// let svc = Admit::new((), policy);
/// assert_eq!(svc.policy().max_budget(), Duration::from_secs(2));
/// ```
///
/// `R` is `()`, or [`Operations`] for a layer whose requests join their operation in the
/// registry ([`AdmitLayer::operations`]); that one calls its handler once the registry has
/// answered, by the service polled ready, so it needs a `Clone` service (as axum's and
/// tonic's are).
pub struct Admit<S, R = ()> {
    inner: S,
    policy: PolicySource,
    hooks: Hooks,
    registry: R,
    /// When `poll_ready` first found the inner service not ready since the last `call`: the
    /// next request has been waiting since then at the latest (queued, off its budget).
    not_ready_since: Option<Instant>,
}

impl<S: Clone, R: Clone> Clone for Admit<S, R> {
    /// A clone has not been polled ready (tower's rule), so it has waited for nothing yet.
    fn clone(&self) -> Self {
        Admit::from_parts(
            self.inner.clone(),
            self.policy.clone(),
            self.hooks.clone(),
            self.registry.clone(),
        )
    }
}

impl<S> Admit<S> {
    /// Wraps `inner`, admitting its requests under `policy`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::Admit;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let svc = Admit::new((), EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build());
    /// # let _ = svc;
    /// ```
    pub fn new(inner: S, policy: EndpointPolicy) -> Self {
        Admit {
            inner,
            policy: PolicySource::Fixed(policy),
            hooks: Hooks {
                on_report: None,
                on_refusal: None,
                server: None,
                cap: None,
                configured_cap: Hooks::window_for(&policy),
            },
            registry: (),
            not_ready_since: None,
        }
    }

    /// A layer for this middleware ([`AdmitLayer::new`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::Admit;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let layer = Admit::<()>::layer(EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build());
    /// # let _ = layer;
    /// ```
    pub fn layer(policy: EndpointPolicy) -> AdmitLayer {
        AdmitLayer::new(policy)
    }
}

impl<S, R> Admit<S, R> {
    pub(super) fn from_parts(inner: S, policy: PolicySource, hooks: Hooks, registry: R) -> Self {
        Admit {
            inner,
            policy,
            hooks,
            registry,
            not_ready_since: None,
        }
    }

    /// The policy.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::Admit;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build();
    /// assert_eq!(*Admit::new((), p).policy(), p);
    /// ```
    pub fn policy(&self) -> &EndpointPolicy {
        self.policy.policy()
    }

    /// The inner service.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::Admit;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let svc = Admit::new(7, EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build());
    /// assert_eq!(*svc.get_ref(), 7);
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::Admit;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let mut svc = Admit::new(7, EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build());
    /// *svc.get_mut() += 1;
    /// assert_eq!(svc.into_inner(), 8);
    /// ```
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::Admit;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let svc = Admit::new(7, EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build());
    /// assert_eq!(svc.into_inner(), 7);
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, R> Admit<S, R> {
    /// `poll_ready` of the inner service, noting when it was first found not ready.
    fn poll_inner<Req>(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>>
    where
        S: Service<Req>,
    {
        let ready = self.inner.poll_ready(cx);
        match &ready {
            // Back-pressure: the request waiting for this pays for the wait from its budget.
            Poll::Pending => {
                self.not_ready_since.get_or_insert_with(Instant::now);
            }
            Poll::Ready(Err(_)) => self.not_ready_since = None,
            Poll::Ready(Ok(())) => {}
        }
        ready
    }

    /// What every request's admission starts from: its arrival, how the layer answers it,
    /// whether its body is tracked, its budget headers (taken off the request), the policy
    /// that admits it.
    fn begin<B>(
        &mut self,
        req: &mut Request<B>,
    ) -> (Instant, Answers, bool, Incoming, EndpointPolicy) {
        let not_ready_since = self.not_ready_since.take();
        // The handler never sees the raw budget headers: a handler that copies its incoming
        // headers onto a call of its own would pass the caller's claims on unchecked.
        let mut incoming = Incoming::take_from(req.headers_mut()).class(class_of(req));
        // One version for the whole request (a swap in between must not mix two).
        let policy = self.policy.for_request(&incoming);
        // The layer's own cap wins over the version's settings.
        let cap = self.hooks.cap.as_ref();
        let cap = cap.or_else(|| self.hooks.configured_cap(&policy));
        if let Some(cap) = cap {
            incoming = incoming.rejection_cap(cap);
        }
        let ingress = match req.extensions().get::<Ingress>() {
            Some(i) => i.0,
            None => not_ready_since.unwrap_or_else(Instant::now),
        };
        let answers = Answers {
            grpc: headers::is_grpc(req.headers()),
            detail: policy.shows_error_detail(),
            retry_after: self
                .hooks
                .server
                .as_ref()
                .map(ServerScope::retry_after_hint),
        };
        // The response to a `HEAD` request has no body to send (the server drops it unread).
        let track_body = req.method() != http::Method::HEAD;
        (ingress, answers, track_body, incoming, policy)
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Admit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: http_body::Body + Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.poll_inner(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let (ingress, answers, track_body, incoming, policy) = self.begin(&mut req);
        let admitted = match &self.hooks.server {
            Some(server) => policy.admit_in(server, incoming, ingress),
            None => policy.admit(incoming, ingress),
        };
        start(
            &mut self.inner,
            req,
            admitted,
            &self.hooks,
            answers,
            track_body,
        )
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Admit<S, Operations>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    ReqBody: Send + 'static,
    ResBody: http_body::Body + Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.poll_inner(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let (ingress, answers, track_body, incoming, policy) = self.begin(&mut req);
        // The registry answers asynchronously: the handler is called once it has, by the
        // service that was polled ready (a clone takes its place here, tower's way).
        let server = self.hooks.server.clone();
        let ops = self.registry.clone();
        let admit = Box::pin(async move {
            match &server {
                Some(s) => policy.admit_joined_in(s, &ops, incoming, ingress).await,
                None => policy.admit_joined(&ops, incoming, ingress).await,
            }
        });
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let hooks = self.hooks.clone();
        ResponseFuture::joining(
            admit,
            Box::new(move |admitted| start(&mut inner, req, admitted, &hooks, answers, track_body)),
        )
    }
}

/// What a request does, for staged enforcement: by its method, as a call's effect class is
/// taken (gRPC calls are POSTs: side-effecting).
fn class_of<B>(req: &Request<B>) -> RequestClass {
    match Class::of_method(req.method()) {
        Class::ReadOnly => RequestClass::ReadOnly,
        _ if req.headers().contains_key(IDEMPOTENCY_KEY) => RequestClass::Idempotent,
        Class::Idempotent => RequestClass::Idempotent,
        Class::SideEffecting => RequestClass::SideEffecting,
    }
}

/// The rest of a request's way in once it is admitted (or refused): the handler's unit, the
/// request's extensions, the handler called in the request's scope.
fn start<S, ReqBody, ResBody>(
    inner: &mut S,
    mut req: Request<ReqBody>,
    admitted: Result<(crate::Scope, Admission), AdmissionError>,
    hooks: &Hooks,
    answers: Answers,
    track_body: bool,
) -> ResponseFuture<S::Future, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: http_body::Body + Send + 'static,
{
    // The handler is a child of the request from here until it answers (see `Finish`):
    // taken at once, so that the request is in flight for a server, or refused by its
    // shutdown as one that came after it (a unit of a closed server's cannot be had).
    let admitted = admitted.and_then(|(scope, admission)| match scope.handler_ticket() {
        Ok(handler) => Ok((scope, admission, handler)),
        Err(_) => {
            let e = AdmissionError::unavailable();
            crate::telemetry::rejected(e.telemetry_reason(), &e);
            Err(e)
        }
    });
    let (scope, admission, handler) = match admitted {
        Ok(a) => a,
        Err(e) => {
            if let Some(f) = &hooks.on_refusal {
                f(&e);
            }
            return ResponseFuture::rejected(&e, answers);
        }
    };
    req.extensions_mut().insert(scope.clone());
    // Said on the answer: an id this server issued, or one it trusts or its registry holds
    // (admission never keeps a claim it did not believe), for the client's retry.
    let operation = headers::operation_value(admission.operation_id());
    req.extensions_mut().insert(admission.clone());
    let finish = Finish::new(scope, admission, hooks.on_report.clone(), handler);
    // `call` itself may already run handler code: make the scope current for it too. A
    // panic there is the handler's: answered 500 / `INTERNAL`, not passed on to the
    // server (which would reset the connection).
    let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _in_span = finish.enter();
        finish.scope().sync_scope(|| inner.call(req))
    }));
    match called {
        Ok(fut) => {
            let run = finish.scope().run(fut);
            ResponseFuture::admitted(run, finish, answers, track_body, operation)
        }
        Err(panic) => ResponseFuture::panicked(finish, answers, &*panic, operation),
    }
}

impl<S: fmt::Debug, R: fmt::Debug> fmt::Debug for Admit<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admit")
            .field("inner", &self.inner)
            .field("policy", &self.policy)
            .field("on_report", &self.hooks.on_report.is_some())
            .field("on_refusal", &self.hooks.on_refusal.is_some())
            .field("registry", &self.registry)
            .finish()
    }
}
