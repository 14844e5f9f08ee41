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
pub struct Propagate<S> {
    inner: S,
    config: Arc<Config>,
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
        Propagate::from_config(inner, Arc::default())
    }

    pub(super) fn from_config(inner: S, config: Arc<Config>) -> Self {
        Propagate { inner, config }
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

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let grpc = headers::is_grpc(req.headers());
        let named = req.extensions().get::<Scope>().cloned();
        let Some((parent, within)) = parent_of(Scope::try_current(), named) else {
            return match self.config.unscoped {
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
            };
        };
        let spec = match req.extensions().get::<ChildSpec>() {
            Some(spec) => spec.clone(),
            None => self.config.spec_for(&req),
        };
        let egress = self.config.egress;
        let dependency = self.config.dependency;
        match call::prepare(dependency, &parent, within, egress, spec, req.headers_mut()) {
            Ok(p) => {
                let tracking = Tracking::new(p.call, p.dispatched, grpc, p.announced, p.telemetry);
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
