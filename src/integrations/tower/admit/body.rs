//! The response body of [`Admit`](super::Admit).

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::guard::Tethered;
use crate::integrations::tower::headers;
use crate::{Cancelled, Cause, Error, Scope};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A body still being sent: the request's scope bounds it and waits for it.
struct Streaming {
    scope: Scope,
    cancelled: Cancelled,
    /// Keeps the request's scope from being quiet (and reported) until the body is done.
    /// `None` if the scope was cancelled as the handler answered: the body stops at once.
    _unit: Option<Tethered<()>>,
    grpc: bool,
    /// Bytes still to send when the length is known (the body's exact size, or the response's
    /// `content-length`): a server stops after the last of them and drops the body without
    /// polling it to its end (hyper's HTTP/1 encoder does), so the body ends there.
    left: Option<u64>,
}

pin_project! {
    /// The response body of a request admitted by [`Admit`](super::Admit): the handler's
    /// body, bounded by the request's scope.
    ///
    /// The request's scope is closed when the handler returns the response head, and its
    /// report waits for the body as well as for the work the handler left running:
    /// * when the scope's deadline passes (or the scope is cancelled) before the body is
    ///   sent, the body stops: a gRPC body ends with `grpc-status` trailers
    ///   (`DEADLINE_EXCEEDED` for the deadline), any other body with an [`Error`], on which
    ///   the server aborts the response (the client sees a cut body, never a short one that
    ///   looks complete);
    /// * dropped before its end (the server drops it when the client goes away), it cancels
    ///   the scope with [`Cause::ClientGone`];
    /// * read to its end (its last frame, trailers, or an error of its own), it lets the
    ///   scope become quiet.
    ///
    /// A body that is empty when the handler answers, one of a known length once that many
    /// bytes are sent, the body of a `HEAD` request or of a status without a body (1xx, 204,
    /// 304) and the bodies of the layer's own answers are not tracked.
    ///
    /// The cut happens when the server polls the body: a client that stops reading (so that
    /// the server cannot send, and does not poll) keeps the request's scope busy, and its
    /// report unsent, until the connection goes (the server then drops the body:
    /// `ClientGone`).
    ///
    /// # Examples
    ///
    /// ```
    /// use http_body::Body;
    /// use cancel_scope::integrations::tower::admit::ResponseBody;
    /// let body: ResponseBody<String> = ResponseBody::empty();
    /// assert!(body.is_end_stream());
    /// ```
    pub struct ResponseBody<B> {
        #[pin]
        inner: Option<B>,
        streaming: Option<Streaming>,
    }

    impl<B> PinnedDrop for ResponseBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            // Still tracked: not sent to its end (every poll that ends it, and a body found
            // ended after a frame, stops the tracking). The client went away (the first
            // cause wins: a deadline that fired stays the cause).
            if let Some(streaming) = this.streaming.take() {
                streaming.scope.cancel_because(Cause::ClientGone);
                // The body goes first, then the unit (stopped before it is counted).
                this.inner.set(None);
                drop(streaming);
            }
        }
    }
}

impl<B> ResponseBody<B> {
    /// A body with nothing in it (the body of an answer the layer made itself).
    ///
    /// # Examples
    ///
    /// ```
    /// use http_body::Body;
    /// use cancel_scope::integrations::tower::admit::ResponseBody;
    /// assert_eq!(ResponseBody::<String>::empty().size_hint().exact(), Some(0));
    /// ```
    pub fn empty() -> Self {
        ResponseBody {
            inner: None,
            streaming: None,
        }
    }

    /// The handler's body, taken out of the layer's hands: the request's scope stops waiting
    /// for it and no longer bounds it. `None` for a body the layer made, or one that was read
    /// to its end or stopped.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::admit::ResponseBody;
    /// assert_eq!(ResponseBody::<String>::empty().into_inner(), None);
    /// ```
    pub fn into_inner(mut self) -> Option<B> {
        self.streaming = None;
        self.inner.take()
    }

    /// The handler's `body` for a request admitted into `scope`, tracked unless `track` is
    /// false (a `HEAD` request, or a status without a body) or it is empty already. `length`:
    /// the response's `content-length`, if any.
    pub(super) fn admitted(
        body: B,
        scope: &Scope,
        grpc: bool,
        track: bool,
        length: Option<u64>,
    ) -> Self
    where
        B: Body,
    {
        let left = body.size_hint().exact().or(length);
        let streaming = (track && !body.is_end_stream() && left != Some(0)).then(|| Streaming {
            scope: scope.clone(),
            cancelled: scope.cancelled(),
            _unit: scope.tether(()).ok(),
            grpc,
            left,
        });
        ResponseBody {
            inner: Some(body),
            streaming,
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        if let Some(s) = this.streaming.as_mut() {
            // The scope first: after its cancel nothing more is sent.
            if let Poll::Ready(cause) = s.cancelled.poll_cancelled(cx) {
                let grpc = s.grpc;
                this.inner.set(None);
                *this.streaming = None;
                return Poll::Ready(Some(if grpc {
                    Ok(Frame::trailers(headers::grpc_status_headers(
                        headers::grpc_code_of(&cause),
                        &cause.to_string(),
                    )))
                } else {
                    Err(Box::new(Error::cancelled(cause)))
                }));
            }
        }
        let Some(inner) = this.inner.as_mut().as_pin_mut() else {
            return Poll::Ready(None);
        };
        let polled = match inner.poll_frame(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(polled) => polled,
        };
        let ended = match &polled {
            None | Some(Err(_)) => true,
            // Trailers are the last frame; a body that says it has ended may never be polled
            // again.
            Some(Ok(frame)) => {
                frame.is_trailers()
                    || this
                        .inner
                        .as_ref()
                        .as_pin_ref()
                        .is_none_or(|b| b.is_end_stream())
            }
        };
        if ended {
            this.inner.set(None);
            *this.streaming = None;
        } else if let (
            Some(Streaming {
                left: Some(left), ..
            }),
            Some(Ok(frame)),
        ) = (this.streaming.as_mut(), &polled)
        {
            // All the bytes its length announced are sent: the server may drop the body now
            // without polling it again, and that is no client going away. (Kept: it may still
            // have trailers to send.)
            *left = left.saturating_sub(frame.data_ref().map_or(0, |d| d.remaining() as u64));
            if *left == 0 {
                *this.streaming = None;
            }
        }
        Poll::Ready(polled.map(|r| r.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(B::is_end_stream)
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
            .field("tracked", &self.streaming.is_some())
            .finish()
    }
}
