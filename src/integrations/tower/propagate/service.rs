use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::body::{ResponseBody, Tracking};
use super::future::ResponseFuture;
use super::layer::PropagateLayer;
use crate::integrations::tower::headers;
use crate::integrations::{call, CallError};
use crate::wire::EgressPolicy;
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
    egress: Option<EgressPolicy>,
    spec: ChildSpec,
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
        Propagate::from_parts(inner, None, ChildSpec::read_only("call"))
    }

    pub(super) fn from_parts(inner: S, egress: Option<EgressPolicy>, spec: ChildSpec) -> Self {
        Propagate {
            inner,
            egress,
            spec,
        }
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
        let parent = req
            .extensions()
            .get::<Scope>()
            .cloned()
            .or_else(Scope::try_current);
        let Some(parent) = parent else {
            return ResponseFuture::passthrough(self.inner.call(req));
        };
        let spec = req
            .extensions()
            .get::<ChildSpec>()
            .cloned()
            .unwrap_or_else(|| self.spec.clone());
        let grpc = headers::is_grpc(req.headers());
        match call::prepare(&parent, self.egress, spec, req.headers_mut()) {
            Ok(p) => ResponseFuture::running(
                self.inner.call(req),
                Tracking::new(p.call, p.dispatched, grpc, p.announced),
            ),
            Err(e) => ResponseFuture::refused(e, grpc),
        }
    }
}
