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
use crate::integrations::tower::headers;
use crate::wire::{Admission, AdmissionError, EndpointPolicy, Incoming, ServerScope};
use crate::Report;

pub(super) type ReportFn = Arc<dyn Fn(&Admission, &Report) + Send + Sync>;
pub(super) type RefusalFn = Arc<dyn Fn(&AdmissionError) + Send + Sync>;

/// The callbacks of a layer, and the server it admits under.
#[derive(Clone, Default)]
pub(super) struct Hooks {
    pub(super) on_report: Option<ReportFn>,
    pub(super) on_refusal: Option<RefusalFn>,
    pub(super) server: Option<ServerScope>,
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
/// let policy = EndpointPolicy::new(Duration::from_secs(2), Duration::from_secs(1));
/// let svc = Admit::new((), policy);
/// assert_eq!(svc.policy().max_budget(), Duration::from_secs(2));
/// ```
pub struct Admit<S> {
    inner: S,
    policy: EndpointPolicy,
    hooks: Hooks,
    /// When `poll_ready` first found the inner service not ready since the last `call`: the
    /// next request has been waiting since then at the latest (queued, off its budget).
    not_ready_since: Option<Instant>,
}

impl<S: Clone> Clone for Admit<S> {
    /// A clone has not been polled ready (tower's rule), so it has waited for nothing yet.
    fn clone(&self) -> Self {
        Admit::from_parts(self.inner.clone(), self.policy, self.hooks.clone())
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
    /// let svc = Admit::new((), EndpointPolicy::new(Duration::from_secs(1), Duration::ZERO));
    /// # let _ = svc;
    /// ```
    pub const fn new(inner: S, policy: EndpointPolicy) -> Self {
        Admit {
            inner,
            policy,
            hooks: Hooks {
                on_report: None,
                on_refusal: None,
                server: None,
            },
            not_ready_since: None,
        }
    }

    pub(super) fn from_parts(inner: S, policy: EndpointPolicy, hooks: Hooks) -> Self {
        Admit {
            inner,
            policy,
            hooks,
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
    /// let layer = Admit::<()>::layer(EndpointPolicy::new(Duration::from_secs(1), Duration::ZERO));
    /// # let _ = layer;
    /// ```
    pub const fn layer(policy: EndpointPolicy) -> AdmitLayer {
        AdmitLayer::new(policy)
    }

    /// The policy.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::Admit;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::ZERO);
    /// assert_eq!(*Admit::new((), p).policy(), p);
    /// ```
    pub fn policy(&self) -> &EndpointPolicy {
        &self.policy
    }

    /// The inner service.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::Admit;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let svc = Admit::new(7, EndpointPolicy::new(Duration::from_secs(1), Duration::ZERO));
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
    /// let mut svc = Admit::new(7, EndpointPolicy::new(Duration::from_secs(1), Duration::ZERO));
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
    /// let svc = Admit::new(7, EndpointPolicy::new(Duration::from_secs(1), Duration::ZERO));
    /// assert_eq!(svc.into_inner(), 7);
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
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

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let not_ready_since = self.not_ready_since.take();
        let ingress = match req.extensions().get::<Ingress>() {
            Some(i) => i.0,
            None => not_ready_since.unwrap_or_else(Instant::now),
        };
        let server = self.hooks.server.as_ref();
        let answers = Answers {
            grpc: headers::is_grpc(req.headers()),
            detail: self.policy.shows_error_detail(),
            retry_after: server.map(ServerScope::retry_after_hint),
        };
        // The response to a `HEAD` request has no body to send (the server drops it unread).
        let track_body = req.method() != http::Method::HEAD;
        // The handler never sees the raw budget headers: a handler that copies its incoming
        // headers onto a call of its own would pass the caller's claims on unchecked.
        let incoming = Incoming::take_from(req.headers_mut());
        let admitted = match server {
            Some(server) => self.policy.admit_in(server, incoming, ingress),
            None => self.policy.admit(incoming, ingress),
        };
        // The handler is a child of the request from here until it answers (see `Finish`):
        // taken at once, so that the request is in flight for a server, or refused by its
        // shutdown as one that came after it (a unit of a closed server's cannot be had).
        let admitted = admitted.and_then(|(scope, admission)| match scope.handler_ticket() {
            Ok(handler) => Ok((scope, admission, handler)),
            Err(_) => Err(AdmissionError::unavailable()),
        });
        let (scope, admission, handler) = match admitted {
            Ok(a) => a,
            Err(e) => {
                if let Some(f) = &self.hooks.on_refusal {
                    f(&e);
                }
                return ResponseFuture::rejected(&e, answers);
            }
        };
        req.extensions_mut().insert(scope.clone());
        req.extensions_mut().insert(admission.clone());
        let finish = Finish::new(scope, admission, self.hooks.on_report.clone(), handler);
        // `call` itself may already run handler code: make the scope current for it too. A
        // panic there is the handler's: answered 500 / `INTERNAL`, not passed on to the
        // server (which would reset the connection).
        let inner = &mut self.inner;
        let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            finish.scope().sync_scope(|| inner.call(req))
        }));
        match called {
            Ok(fut) => {
                let run = finish.scope().run(fut);
                ResponseFuture::admitted(run, finish, answers, track_body)
            }
            Err(panic) => ResponseFuture::panicked(finish, answers, &*panic),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Admit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admit")
            .field("inner", &self.inner)
            .field("policy", &self.policy)
            .field("on_report", &self.hooks.on_report.is_some())
            .field("on_refusal", &self.hooks.on_refusal.is_some())
            .finish()
    }
}
