use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tokio::time::Instant;
use tower_service::Service;

use super::body::{ResponseBody, Tracking};
use super::future::ResponseFuture;
use super::layer::{Config, PropagateLayer};
use crate::integrations::tower::headers;
use crate::integrations::{call, headers as budget_headers, CallError};
use crate::reconcile::Journal;
use crate::{ChildSpec, Scope};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Makes every outgoing call in a child scope with its budget on the wire (see
/// [the module docs](super)).
///
/// # Examples
///
/// ```
/// use cancel_scope::integrations::tower::Propagate;
/// let client = Propagate::new(());
/// assert_eq!(client.get_ref(), &());
/// ```
#[derive(Clone, Debug)]
pub struct Propagate<S, J = ()> {
    inner: S,
    config: Arc<Config>,
    /// `()`, or the [`Journal`] the calls' intents are written to
    /// ([`PropagateLayer::journal`]).
    journal: J,
}

impl<S> Propagate<S> {
    /// Wraps `inner` with the defaults of [`PropagateLayer::new`].
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::Propagate;
    /// let client = Propagate::new(());
    /// # let _ = client;
    /// ```
    pub fn new(inner: S) -> Self {
        Propagate::from_parts(inner, Arc::default(), ())
    }

    /// A layer for this middleware ([`PropagateLayer::new`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::Propagate;
    /// let layer = Propagate::<()>::layer();
    /// # let _ = layer;
    /// ```
    pub fn layer() -> PropagateLayer {
        PropagateLayer::new()
    }
}

impl<S, J> Propagate<S, J> {
    pub(super) fn from_parts(inner: S, config: Arc<Config>, journal: J) -> Self {
        Propagate {
            inner,
            config,
            journal,
        }
    }

    /// The inner service.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::Propagate;
    /// assert_eq!(*Propagate::new(3).get_ref(), 3);
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::Propagate;
    /// let mut c = Propagate::new(3);
    /// *c.get_mut() = 4;
    /// assert_eq!(c.into_inner(), 4);
    /// ```
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::Propagate;
    /// assert_eq!(Propagate::new(3).into_inner(), 3);
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Propagate<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    ResBody: http_body::Body,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = CallError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(CallError::transport)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        match self.plan(req) {
            Plan::Call(planned) => self.send_now(planned),
            Plan::Answered(early) => early,
        }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Propagate<S, Journal>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    ReqBody: Send + 'static,
    ResBody: http_body::Body,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = CallError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(CallError::transport)
    }

    /// As without a journal, except that a call whose effect class the journal records is
    /// registered, its intent written and then dispatched and sent in the returned future
    /// (by the service that was polled ready; a clone takes its place here).
    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let planned = match self.plan(req) {
            Plan::Call(planned) if self.journal.records(&planned.spec) => planned,
            Plan::Call(planned) => return self.send_now(planned),
            Plan::Answered(early) => return early,
        };
        let Planned {
            mut req,
            parent,
            within,
            spec,
            grpc,
        } = planned;
        let (dependency, egress) = (self.config.dependency, self.config.egress);
        let journal = self.journal.clone();
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let start = Box::pin(async move {
            let headers = req.headers_mut();
            let (p, intent) = call::prepare_journaled(
                dependency, &parent, within, egress, spec, headers, &journal,
            )
            .await?;
            // Dispatched, its intent in the store: sent now, nothing awaited in between.
            let tracking = Tracking::new(p, grpc, intent);
            let fut = {
                let _in_span = tracking.enter();
                inner.call(req)
            };
            Ok((fut, tracking))
        });
        ResponseFuture::journaling(start, grpc)
    }
}

impl<S, J> Propagate<S, J> {
    /// What every call starts from: its parent scope (and a deadline that bounds it too),
    /// its spec, whether it is gRPC; or, for a call outside any scope, its answer (passed
    /// through under [`allow_unscoped`](PropagateLayer::allow_unscoped), else refused).
    fn plan<ReqBody, ResBody>(&mut self, mut req: Request<ReqBody>) -> Plan<ReqBody, S::Future>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    {
        let grpc = headers::is_grpc(req.headers());
        let named = req.extensions().get::<Scope>().cloned();
        let Some((parent, within)) = parent_of(Scope::try_current(), named) else {
            return Plan::Answered(match self.config.unscoped {
                Some(cap) => {
                    budget_headers::unscoped(req.headers_mut(), cap);
                    ResponseFuture::passthrough(self.inner.call(req))
                }
                None => {
                    crate::telemetry::call_refused(
                        self.config.dependency,
                        crate::telemetry::Refused::NoScope,
                    );
                    ResponseFuture::refused(CallError::no_scope(), grpc)
                }
            });
        };
        let spec = match req.extensions().get::<ChildSpec>() {
            Some(spec) => spec.clone(),
            None => self.config.spec_for(&req),
        };
        Plan::Call(Planned {
            req,
            parent,
            within,
            spec,
            grpc,
        })
    }
}

impl<S, J> Propagate<S, J> {
    /// Registers, dispatches and sends a planned call at once (no intent to write first).
    fn send_now<ReqBody, ResBody>(&mut self, planned: Planned<ReqBody>) -> ResponseFuture<S::Future>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    {
        let Planned {
            mut req,
            parent,
            within,
            spec,
            grpc,
        } = planned;
        let (dependency, egress) = (self.config.dependency, self.config.egress);
        match call::prepare(dependency, &parent, within, egress, spec, req.headers_mut()) {
            Ok(p) => {
                let tracking = Tracking::new(p, grpc, None);
                let fut = {
                    // The inner service's `call` may already do the call's work.
                    let _in_span = tracking.enter();
                    self.inner.call(req)
                };
                ResponseFuture::running(fut, tracking)
            }
            Err(e) => ResponseFuture::refused(e.into(), grpc),
        }
    }
}

/// What [`Propagate::plan`] found: a call to make, or the answer already.
enum Plan<B, F> {
    Call(Planned<B>),
    Answered(ResponseFuture<F>),
}

/// A call in a scope, about to be registered: see [`Propagate::plan`].
struct Planned<B> {
    req: Request<B>,
    parent: Scope,
    /// A deadline that bounds the call besides its parent's.
    within: Option<Instant>,
    spec: ChildSpec,
    grpc: bool,
}

/// The parent of a call made with `current` as the current scope, for a request that carries
/// the scope `named` in its extensions, and the deadline of the other one when it bounds the
/// call too.
///
/// The more specific scope is the parent: normally the current one, since `Admit` puts the
/// request's *root* scope into the extensions and a handler that forwards its request (a
/// proxy) calls from inside the scope it is running in, often a tighter child. Taking the
/// root there would tell the callee the root's budget and cut the call only at the root's
/// deadline. A named scope inside the current one is the more specific in turn (it was put
/// there for this call), and stays the parent so that its cancel stops the call. Two scopes
/// of different trees both bound the call: the current one is its parent, the named one's
/// deadline a cap (budgets only shrink; its cancel does not reach the call).
fn parent_of(current: Option<Scope>, named: Option<Scope>) -> Option<(Scope, Option<Instant>)> {
    match (current, named) {
        (Some(current), Some(named)) => {
            if current.is_within(&named) {
                // Its deadline is no later than `named`'s (invariant 4).
                Some((current, None))
            } else if named.is_within(&current) {
                Some((named, None))
            } else {
                let within = named.deadline();
                Some((current, within))
            }
        }
        (Some(only), None) | (None, Some(only)) => Some((only, None)),
        (None, None) => None,
    }
}
