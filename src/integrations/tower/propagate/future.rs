//! The response future of [`Propagate`](super::Propagate).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use pin_project_lite::pin_project;

use super::body::{ResponseBody, Tracking};
use crate::integrations::tower::headers;
use crate::integrations::CallError;
use crate::Cause;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A journaled call until it is sent: its intent written, then dispatched and handed to the
/// inner service (or refused).
pub(super) type Journaling<F> =
    Pin<Box<dyn Future<Output = Result<(F, Tracking), CallError>> + Send>>;

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Passthrough { #[pin] fut: F },
        Refused { error: Option<CallError>, grpc: bool },
        Journaling { start: Journaling<F>, grpc: bool },
        Running { #[pin] fut: F, tracking: Option<Tracking> },
    }
}

pin_project! {
    /// The response future of [`Propagate`](super::Propagate): the call, stopped when its
    /// scope ends.
    ///
    /// # Cancel safety
    ///
    /// Dropping it abandons the call; its receipt is `Cancelled` (or `EffectUnknown` for an
    /// effectful call that was dispatched).
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn passthrough(fut: F) -> Self {
        ResponseFuture {
            kind: Kind::Passthrough { fut },
        }
    }

    pub(super) fn refused(error: CallError, grpc: bool) -> Self {
        ResponseFuture {
            kind: Kind::Refused {
                error: Some(error),
                grpc,
            },
        }
    }

    pub(super) fn journaling(start: Journaling<F>, grpc: bool) -> Self {
        ResponseFuture {
            kind: Kind::Journaling { start, grpc },
        }
    }

    pub(super) fn running(fut: F, tracking: Tracking) -> Self {
        ResponseFuture {
            kind: Kind::Running {
                fut,
                tracking: Some(tracking),
            },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: http_body::Body,
    E: Into<BoxError>,
{
    type Output = Result<Response<ResponseBody<B>>, CallError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let KindProj::Journaling { start, grpc } = self.as_mut().project().kind.project() {
            match start.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(error)) => {
                    let grpc = *grpc;
                    let error = Kind::Refused {
                        error: Some(error),
                        grpc,
                    };
                    self.as_mut().project().kind.set(error);
                }
                Poll::Ready(Ok((fut, tracking))) => {
                    let running = Kind::Running {
                        fut,
                        tracking: Some(tracking),
                    };
                    self.as_mut().project().kind.set(running);
                }
            }
        }
        match self.project().kind.project() {
            KindProj::Passthrough { fut } => fut.poll(cx).map(|r| {
                r.map(|res| res.map(ResponseBody::passthrough))
                    .map_err(CallError::transport)
            }),
            KindProj::Refused { error, grpc } => {
                let error = error
                    .take()
                    .expect("ResponseFuture polled after completion");
                Poll::Ready(refused(error, *grpc))
            }
            KindProj::Journaling { .. } => unreachable!("left above"),
            KindProj::Running { fut, tracking } => {
                let t = tracking
                    .as_mut()
                    .expect("ResponseFuture polled after completion");
                // The scope first: a call whose scope ended is not polled again.
                if let Poll::Ready(cause) = t.poll_stopped(cx) {
                    let grpc = t.grpc();
                    // Stopped: Cancelled, or EffectUnknown for effectful calls.
                    *tracking = None;
                    return Poll::Ready(stopped(&cause, grpc));
                }
                let polled = {
                    let _in_span = t.enter();
                    fut.poll(cx)
                };
                let res = match polled {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(res) => res,
                };
                let mut t = tracking.take().expect("checked above");
                Poll::Ready(match res {
                    Ok(mut res) => {
                        let status = res.status();
                        t.at_head(status, res.headers_mut());
                        Ok(res.map(|body| ResponseBody::tracked(body, t)))
                    }
                    Err(_) if t.grpc() && t.expired() => {
                        // A transport that times out on `grpc-timeout` itself (tonic's
                        // channel) says CANCELLED; it was our deadline. Stopped by the drop.
                        drop(t);
                        Ok(grpc_stopped(&Cause::DeadlineExceeded))
                    }
                    Err(e) => Err(t.transport_error(e)),
                })
            }
        }
    }
}

/// A call that its scope stopped: a gRPC status answer, or an error.
fn stopped<B>(cause: &Cause, grpc: bool) -> Result<Response<ResponseBody<B>>, CallError> {
    if grpc {
        Ok(grpc_stopped(cause))
    } else {
        Err(CallError::cancelled(cause.clone()))
    }
}

fn grpc_stopped<B>(cause: &Cause) -> Response<ResponseBody<B>> {
    let code = headers::client_grpc_code_of(cause);
    headers::grpc_response(code, &cause.to_string(), ResponseBody::empty())
}

/// A call that was never sent: for gRPC, a trailers-only status a gRPC client reads as any
/// other (a tonic client would map an error it cannot downcast to `UNKNOWN`).
fn refused<B>(error: CallError, grpc: bool) -> Result<Response<ResponseBody<B>>, CallError> {
    if grpc {
        let code = if error.is_no_scope() {
            // A caller's mistake that no retry mends: nothing was sent.
            headers::GrpcCode::FailedPrecondition
        } else if error.is_budget_exhausted() || error.is_deadline_exceeded() {
            headers::GrpcCode::DeadlineExceeded
        } else if error.is_intent_not_recorded() {
            // Nothing was sent: safe to try again.
            headers::GrpcCode::Unavailable
        } else {
            headers::GrpcCode::Cancelled
        };
        Ok(headers::grpc_response(
            code,
            &error.to_string(),
            ResponseBody::empty(),
        ))
    } else {
        Err(error)
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.kind {
            Kind::Passthrough { .. } => "passthrough",
            Kind::Refused { .. } => "refused",
            Kind::Journaling { .. } => "journaling",
            Kind::Running { .. } => "running",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
