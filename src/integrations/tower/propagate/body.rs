use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{HeaderMap, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::integrations::call::Prepared;
use crate::integrations::outcome::{self, Answer, End, GRPC_CANCELLED, GRPC_DEADLINE_EXCEEDED};
use crate::integrations::tower::headers;
use crate::integrations::CallError;
use crate::reconcile::PendingIntent;
use crate::telemetry;
use crate::wire::ServiceEffect;
use crate::{Cancelled, Dispatched, Scope};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One call in flight: its scope, its receipt, and what it told the callee.
///
/// Dropped before the exchange ended (the scope cut it, its reader let go of it), it gives the
/// call its receipt as stopped (see `integrations::outcome`).
pub(super) struct Tracking {
    /// Keeps the call's scope (and its deadline timer) alive until the body is done.
    _call: Scope,
    cancelled: Cancelled,
    dispatched: Option<Dispatched>,
    grpc: bool,
    /// When the budget the callee was told runs out.
    announced: Option<Instant>,
    /// What the response head said: its HTTP status; for gRPC, a trailers-only status or an
    /// HTTP error status (a gRPC call's own status is in its trailers).
    head: Option<Answer>,
    /// The head carried a gRPC status that our own deadline explains (see `by_deadline`).
    head_by_deadline: bool,
    /// What the callee said of its effects (`service-effect`, head and trailers).
    server: Option<ServiceEffect>,
    /// The call's span and metrics.
    telemetry: telemetry::Call,
    /// The call's intent, if it was journaled: resolved by its receipt.
    intent: Option<PendingIntent>,
}

impl Tracking {
    /// The tracking of the `prepared` call (`grpc`: a gRPC call), whose `intent` (if it was
    /// journaled) its receipt resolves.
    pub(super) fn new(prepared: Prepared, grpc: bool, intent: Option<PendingIntent>) -> Self {
        let Prepared {
            call,
            dispatched,
            announced,
            telemetry,
        } = prepared;
        Tracking {
            telemetry,
            cancelled: call.cancelled(),
            _call: call,
            dispatched: Some(dispatched),
            grpc,
            announced,
            head: None,
            head_by_deadline: false,
            server: None,
            intent,
        }
    }

    pub(super) fn grpc(&self) -> bool {
        self.grpc
    }

    /// Enters the call's span, for one poll of the call.
    pub(super) fn enter(&self) -> telemetry::Entered<'_> {
        self.telemetry.enter()
    }

    /// Whether the budget the callee was told has run out.
    pub(super) fn expired(&self) -> bool {
        self.announced.is_some_and(|a| Instant::now() >= a)
    }

    /// Ready with the cause once the call's scope is cancelled.
    pub(super) fn poll_stopped(&mut self, cx: &mut Context<'_>) -> Poll<crate::Cause> {
        self.cancelled.poll_cancelled(cx)
    }

    /// The response head came: notes what it says (and rewrites a `CANCELLED` that came
    /// after the budget ran out).
    pub(super) fn at_head(&mut self, status: StatusCode, headers: &mut HeaderMap) {
        self.fix_status(headers);
        self.server = outcome::service_effect_in(headers);
        let code = self.grpc.then(|| match Answer::grpc_in(headers) {
            Some(Answer::Grpc(code)) => Some(code),
            _ => None,
        });
        self.telemetry.answered(status.as_u16(), code);
        if !self.grpc {
            self.head = Some(Answer::Http(status));
            return;
        }
        match Answer::grpc_in(headers) {
            Some(a) if self.by_deadline(a) => self.head_by_deadline = true,
            Some(a) => self.head = Some(a),
            // A proxy's (or a server's) HTTP error, with no gRPC status.
            None if status != StatusCode::OK => self.head = Some(Answer::Http(status)),
            None => {}
        }
    }

    /// A gRPC `CANCELLED` or `DEADLINE_EXCEEDED` after the budget the callee was told ran out
    /// is our deadline (the callee or its transport gave up at it): the call was stopped, as
    /// if our own timer had fired first.
    fn by_deadline(&self, a: Answer) -> bool {
        matches!(a, Answer::Grpc(GRPC_CANCELLED | GRPC_DEADLINE_EXCEEDED)) && self.expired()
    }

    /// The exchange completed, with `trailers` if it had them: the receipt by its status (for
    /// gRPC, the trailers' status, else the head's; none at all is a protocol error).
    pub(super) fn complete(&mut self, trailers: Option<&mut HeaderMap>) {
        if !self.grpc {
            let end = self.head.map_or(End::Stopped, End::Answered);
            return self.end(end);
        }
        let status = trailers.and_then(|t| {
            self.fix_status(t);
            self.server = outcome::said_effect(self.server, outcome::service_effect_in(t));
            Answer::grpc_in(t)
        });
        if let Some(Answer::Grpc(code)) = status {
            // The call's own status (as the caller sees it, a late `CANCELLED` rewritten).
            self.telemetry.grpc_status(code);
        }
        let end = match status {
            Some(a) if self.by_deadline(a) => End::Stopped,
            Some(a) => End::Answered(a),
            None if self.head_by_deadline => End::Stopped,
            None => End::Answered(self.head.unwrap_or(Answer::GrpcMissing)),
        };
        self.end(end);
    }

    fn end(&mut self, end: End) {
        if let Some(d) = self.dispatched.take() {
            let resolution = outcome::receipt(d, end, self.head, None, self.server);
            if let Some(intent) = self.intent.take() {
                intent.resolve(resolution);
            }
            self.telemetry.ended(self._call.cause().as_ref());
        }
    }

    /// The error for a transport failure `e`.
    pub(super) fn transport_error(&mut self, e: impl Into<BoxError>) -> CallError {
        if self.expired() {
            // Stopped by the deadline, not failed.
            self.end(End::Stopped);
            CallError::transport_after_deadline(e)
        } else {
            self.end(End::Failed);
            CallError::transport(e)
        }
    }

    /// Rewrites a CANCELLED status that arrived after the budget ran out.
    fn fix_status(&self, headers: &mut HeaderMap) {
        if self.grpc && self.expired() {
            headers::fix_expired_status(headers);
        }
    }
}

impl Drop for Tracking {
    fn drop(&mut self) {
        self.end(End::Stopped);
    }
}

pin_project! {
    /// The response body of a call made through [`Propagate`](super::Propagate): the
    /// transport's body, stopped when the call's scope ends.
    ///
    /// When the call's deadline passes (or its scope is cancelled) mid-body, a gRPC body ends
    /// with `grpc-status` trailers (`DEADLINE_EXCEEDED` / `CANCELLED`), any other body with a
    /// [`CallError`]. A gRPC body that fails after the budget the callee was told has run out
    /// (a callee or proxy that resets the stream at that deadline) ends with
    /// `DEADLINE_EXCEEDED` trailers too. The call's receipt is recorded when the body has been
    /// read to its end (by the response's status: for gRPC the one in the trailers), when it
    /// fails, or when it is dropped before its end (see the [module docs](super) for the
    /// table).
    ///
    /// # Examples
    ///
    /// ```
    /// use http_body::Body;
    /// use cancel_scope::integrations::tower::propagate::ResponseBody;
    /// let body: ResponseBody<String> = ResponseBody::empty();
    /// assert!(body.is_end_stream());
    /// ```
    pub struct ResponseBody<B> {
        #[pin]
        inner: Option<B>,
        tracking: Option<Tracking>,
        trailers: Option<HeaderMap>,
    }

}

impl<B> ResponseBody<B> {
    /// A body with nothing in it (the body of a response the layer made itself).
    ///
    /// # Examples
    ///
    /// ```
    /// use http_body::Body;
    /// use cancel_scope::integrations::tower::propagate::ResponseBody;
    /// assert_eq!(ResponseBody::<String>::empty().size_hint().exact(), Some(0));
    /// ```
    pub fn empty() -> Self {
        ResponseBody {
            inner: None,
            tracking: None,
            trailers: None,
        }
    }

    pub(super) fn passthrough(inner: B) -> Self {
        ResponseBody {
            inner: Some(inner),
            tracking: None,
            trailers: None,
        }
    }

    pub(super) fn tracked(inner: B, mut tracking: Tracking) -> Self
    where
        B: Body,
    {
        if inner.is_end_stream() {
            // Nothing more will be read (and readers may not poll it at all): complete, by
            // the head (a trailers-only gRPC response decides there).
            tracking.complete(None);
            return ResponseBody::passthrough(inner);
        }
        ResponseBody {
            inner: Some(inner),
            tracking: Some(tracking),
            trailers: None,
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = CallError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        if let Some(t) = this.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        if let Some(t) = this.tracking.as_mut() {
            // The scope first: after a cancel nothing more is read (invariant 2).
            if let Poll::Ready(cause) = t.poll_stopped(cx) {
                let grpc = t.grpc();
                this.inner.set(None);
                // Stopped: Cancelled, or EffectUnknown for effectful calls.
                *this.tracking = None;
                return Poll::Ready(Some(if grpc {
                    let code = headers::client_grpc_code_of(&cause);
                    Ok(Frame::trailers(headers::grpc_status_headers(
                        code,
                        &cause.to_string(),
                    )))
                } else {
                    Err(CallError::cancelled(cause))
                }));
            }
        }
        let Some(inner) = this.inner.as_mut().as_pin_mut() else {
            return Poll::Ready(None);
        };
        match inner.poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                this.inner.set(None);
                if let Some(mut t) = this.tracking.take() {
                    t.complete(None);
                }
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(mut frame))) => {
                if let Some(trailers) = frame.trailers_mut() {
                    // Trailers are the last frame: the exchange is complete (readers such as
                    // tonic stop polling here), and nothing is read after them.
                    this.inner.set(None);
                    if let Some(mut t) = this.tracking.take() {
                        t.complete(Some(trailers));
                    }
                } else if this
                    .inner
                    .as_ref()
                    .as_pin_ref()
                    .is_none_or(|b| b.is_end_stream())
                {
                    // A body that says it has ended may never be polled again (hyper's server,
                    // forwarding it, drops it here): the exchange is complete.
                    this.inner.set(None);
                    if let Some(mut t) = this.tracking.take() {
                        t.complete(None);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.inner.set(None);
                Poll::Ready(Some(match this.tracking.take() {
                    // A callee or proxy that resets the stream when the budget it was told
                    // runs out: our deadline, mid-body as at the head (`ResponseFuture`).
                    // Stopped, by the drop.
                    Some(t) if t.grpc() && t.expired() => {
                        let deadline = crate::Cause::DeadlineExceeded;
                        Ok(Frame::trailers(headers::grpc_status_headers(
                            headers::client_grpc_code_of(&deadline),
                            &deadline.to_string(),
                        )))
                    }
                    Some(mut t) => Err(t.transport_error(e)),
                    None => Err(CallError::transport(e)),
                }))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.trailers.is_none() && self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Some(b) => b.size_hint(),
            None => SizeHint::with_exact(0),
        }
    }
}

impl<B> Default for ResponseBody<B> {
    fn default() -> Self {
        ResponseBody::empty()
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseBody")
            .field("done", &self.inner.is_none())
            .field("tracked", &self.tracking.is_some())
            .finish()
    }
}
