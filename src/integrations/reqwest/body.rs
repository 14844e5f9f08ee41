//! The body of a scoped call handed over as a plain `reqwest::Response`
//! (`ScopedResponse::into_inner`, and the responses of the `reqwest-middleware` middleware):
//! cut at the call's deadline or its scope's cancel, and, while the call has no receipt yet,
//! giving it one at its end.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::response::Call;
use crate::integrations::CallError;
use crate::Cancelled;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response body bounded by its call.
///
/// At the call's deadline or its scope's cancel the transport's body is let go (its
/// connection closed, or its HTTP/2 stream reset) and the reader gets an error: for the
/// deadline an I/O `TimedOut` error (so that reqwest's `is_timeout()` says so), otherwise the
/// [`CallError`]. The call's receipt, if it has none yet, is given by the response's status
/// when the body has been read to its end, as failed or stopped when reading fails or is cut,
/// and as stopped when the body is dropped before its end (`Call`'s drop).
pub(super) struct CallBody {
    inner: Option<reqwest::Body>,
    /// The call, while its receipt waits for the body's end.
    call: Option<Call>,
    /// The call's scope's cancel (its deadline included). Holds the scope, and so its timer.
    stop: Cancelled,
}

impl CallBody {
    /// `inner`, bounded by `call`'s scope; `receipt`: whether the call's receipt waits for the
    /// body's end (otherwise it was given already).
    pub(super) fn new(inner: reqwest::Body, mut call: Call, receipt: bool) -> Self {
        let stop = call.scope.cancelled();
        if !receipt || inner.is_end_stream() {
            // Nothing more will be read (readers may not poll an empty body at all): the
            // answer decides now.
            call.complete();
        }
        CallBody {
            inner: Some(inner),
            call: Some(call),
            stop,
        }
    }

    fn end(&mut self) {
        self.inner = None;
        if let Some(mut call) = self.call.take() {
            call.complete();
        }
    }
}

impl Body for CallBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        // The scope first: after a cancel nothing more is read (invariant 2).
        if let Poll::Ready(cause) = this.stop.poll_cancelled(cx) {
            // The body goes first, then the receipt: once the scope is quiet, nothing of the
            // call is left open (invariant 6).
            this.inner = None;
            let err = match this.call.as_mut() {
                Some(call) => call.stopped(),
                None => CallError::cancelled(cause.clone()),
            };
            this.call = None;
            if cause.is_deadline_exceeded() {
                let timed_out = std::io::Error::new(std::io::ErrorKind::TimedOut, err);
                return Poll::Ready(Some(Err(timed_out.into())));
            }
            return Poll::Ready(Some(Err(err.into())));
        }
        match Pin::new(inner).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                this.end();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(frame))) => {
                if this.inner.as_ref().is_none_or(Body::is_end_stream) {
                    // A body that says it has ended may never be polled again.
                    this.end();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.inner = None;
                let err = match this.call.take() {
                    Some(mut call) => call.failed(e),
                    None => CallError::transport(e),
                };
                Poll::Ready(Some(Err(err.into())))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}
