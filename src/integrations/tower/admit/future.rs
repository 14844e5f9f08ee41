//! The response future of [`Admit`](super::Admit).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{HeaderValue, Response, StatusCode};
use pin_project_lite::pin_project;

use super::answer::Answers;
use super::body::ResponseBody;
use super::finish::{panic_message, Finish, HANDLER_PANICKED};
use crate::integrations::tower::headers::SERVICE_OPERATION;
use crate::wire::{Admission, AdmissionError, ServiceEffect};
use crate::Cause;
use crate::Run;
use crate::Scope;

/// The admission of a request whose operation the registry is asked about.
pub(super) type Admitting =
    Pin<Box<dyn Future<Output = Result<(Scope, Admission), AdmissionError>> + Send>>;

/// What follows that admission: the request's future as without a registry.
pub(super) type Then<F, B> =
    Box<dyn FnOnce(Result<(Scope, Admission), AdmissionError>) -> ResponseFuture<F, B> + Send>;

pin_project! {
    #[project = StateProj]
    #[project_replace = StateReplace]
    enum State<F: Future, B> {
        // The registry is being asked; then the request is admitted (or refused) by `then`.
        Joining { admit: Admitting, then: Option<Then<F, B>> },
        Running { #[pin] run: Run<F> },
        Answer { response: Option<Response<ResponseBody<B>>> },
        Done,
    }
}

pin_project! {
    /// The response future of [`Admit`](super::Admit): the handler's future run in the
    /// request's scope, or the answer the layer gives for the scope.
    ///
    /// Dropping it before it completes cancels the request's scope with
    /// [`Cause::ClientGone`]. A handler that panics (in the service's `call`, or while its
    /// future is polled) is answered 500 / `INTERNAL`; its request is cancelled with
    /// `Cause::Cancelled` and the reason "the handler panicked", and reported with the
    /// handler `Failed`.
    ///
    /// # Cancel safety
    ///
    /// Dropping it is how a server says the client went away: the scope is cancelled.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<F: Future, B> {
        #[pin]
        state: State<F, B>,
        finish: Option<Finish>,
        answers: Answers,
        // Whether the response body is sent (not for a `HEAD` request), and so tracked.
        track_body: bool,
        // Set while the handler's future is polled: dropped with it set, that poll unwound
        // (the handler panicked), which is not the client going away.
        polling: bool,
        // The `service-operation` value put on the answer of an admitted request.
        operation: Option<HeaderValue>,
    }

    impl<F: Future, B> PinnedDrop for ResponseFuture<F, B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(finish) = this.finish.take() {
                // Dropped before it answered: the client is gone, or the handler panicked
                // (invariant 1: the first cause wins, so a deadline that already fired stays
                // the cause).
                let cause = if *this.polling {
                    Cause::cancelled(HANDLER_PANICKED)
                } else {
                    Cause::ClientGone
                };
                finish.cancel_then_done(cause);
            }
        }
    }
}

impl<F: Future, B> ResponseFuture<F, B> {
    pub(super) fn rejected(e: &AdmissionError, answers: Answers) -> Self {
        ResponseFuture {
            state: State::Answer {
                response: Some(answers.refusal(e)),
            },
            finish: None,
            answers,
            track_body: false,
            polling: false,
            operation: None,
        }
    }

    /// The answer for a request whose handler panicked in the service's `call`.
    pub(super) fn panicked(
        finish: Finish,
        answers: Answers,
        payload: &(dyn std::any::Any + Send),
        operation: Option<HeaderValue>,
    ) -> Self {
        ResponseFuture {
            state: State::Answer {
                response: Some(finish.panicked(panic_message(payload), answers)),
            },
            finish: None,
            answers,
            track_body: false,
            polling: false,
            operation,
        }
    }

    /// A request whose admission waits for the registry: `then` makes the request's future
    /// once `admit` has answered.
    pub(super) fn joining(admit: Admitting, then: Then<F, B>) -> Self {
        ResponseFuture {
            state: State::Joining {
                admit,
                then: Some(then),
            },
            finish: None,
            answers: Answers {
                grpc: false,
                detail: false,
                retry_after: None,
            },
            track_body: false,
            polling: false,
            operation: None,
        }
    }

    pub(super) fn admitted(
        run: Run<F>,
        finish: Finish,
        answers: Answers,
        track_body: bool,
        operation: Option<HeaderValue>,
    ) -> Self {
        ResponseFuture {
            state: State::Running { run },
            finish: Some(finish),
            answers,
            track_body,
            polling: false,
            operation,
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: http_body::Body + Send + 'static,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let next = match self.as_mut().project().state.project() {
            StateProj::Joining { admit, then } => match admit.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(admitted) => match then.take() {
                    Some(then) => Some(then(admitted)),
                    None => panic!("ResponseFuture polled after completion"),
                },
            },
            _ => None,
        };
        if let Some(next) = next {
            // Nothing was admitted before: replacing this future drops nothing of a request.
            self.set(next);
        }
        let mut this = self.project();
        // Whether the scope closes now (`false`: the response body streams, and closes it at
        // its end, so that the handler can still start work for it).
        let mut close = true;
        let mut out = match this.state.as_mut().project() {
            StateProj::Answer { response } => match response.take() {
                Some(r) => Ok(r),
                None => panic!("ResponseFuture polled after completion"),
            },
            StateProj::Done | StateProj::Joining { .. } => {
                panic!("ResponseFuture polled after completion")
            }
            StateProj::Running { run } => {
                match in_span(this.finish.as_ref(), || poll_marked(this.polling, run, cx)) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(panic)) => {
                        // The handler's future panicked: answered 500 / `INTERNAL`, its work
                        // (dropped below) and the rest of the request cancelled.
                        this.state.project_replace(State::Done);
                        let Some(finish) = this.finish.take() else {
                            unreachable!("a running request is finished once");
                        };
                        let mut response = finish.panicked(panic_message(&*panic), *this.answers);
                        name_operation(&mut response, this.operation.take());
                        return Poll::Ready(Ok(response));
                    }
                    Poll::Ready(Ok(polled)) => match polled {
                        Ok(Ok(late)) if finish_expired(this.finish.as_ref()) => {
                            // Answered at or after the deadline, before its timer ran (the handler
                            // held the thread past it): the deadline's answer, as for a handler still
                            // running then; the late answer is dropped (its drop is the handler's).
                            *this.polling = true;
                            drop(late);
                            *this.polling = false;
                            let (cause, effect) = this.finish.as_ref().map_or(
                                (Cause::DeadlineExceeded, ServiceEffect::Unknown),
                                Finish::stopped,
                            );
                            Ok(this.answers.stopped(&cause, effect))
                        }
                        Ok(out) => {
                            // Reading the handler's body (its size hint, its end) runs the handler's
                            // code: a panic there is the handler's, not the client's going away.
                            *this.polling = true;
                            let out = out.map(|response| match this.finish.as_mut() {
                                // The body is tracked from before the handler's unit goes (below).
                                Some(f) => {
                                    let status = response.status();
                                    let track = *this.track_body && has_body(status);
                                    let length = content_length(response.headers());
                                    // A tracked body takes the report with it.
                                    let mut reporter = f.reporter().take();
                                    let mut response = response.map(|body| {
                                        ResponseBody::admitted(
                                            body,
                                            f.scope(),
                                            *this.answers,
                                            track,
                                            length,
                                            &mut reporter,
                                        )
                                    });
                                    *f.reporter() = reporter;
                                    if this.answers.grpc
                                        && cfg!(feature = "tracing")
                                        && !response.headers().contains_key("grpc-status")
                                    {
                                        // The status comes in the trailers: the body records it.
                                        response.body_mut().record_trailers(f.telemetry());
                                    }
                                    // After the body took its unit: the handler's may be the last.
                                    f.answered(status, response.headers(), this.answers.grpc);
                                    close = !response.body().is_tracked();
                                    response
                                }
                                None => unreachable!("a running request is finished once"),
                            });
                            *this.polling = false;
                            out
                        }
                        Err(stopped) => {
                            let cause = stopped.cause().cloned().unwrap_or(Cause::DeadlineExceeded);
                            let effect = this
                                .finish
                                .as_ref()
                                .map_or(ServiceEffect::Unknown, |f| f.stopped().1);
                            Ok(this.answers.stopped(&cause, effect))
                        }
                    },
                }
            }
        };
        if let Ok(response) = &mut out {
            name_operation(response, this.operation.take());
        }
        // Drop the handler's future before reporting: its work is over.
        this.state.project_replace(State::Done);
        if let Some(finish) = this.finish.take() {
            if let Ok(response) = &out {
                finish.record_answer(response, this.answers.grpc);
            }
            finish.done(close);
        }
        Poll::Ready(out)
    }
}

/// Names the operation of an admitted request on its answer (`service-operation`), in place
/// of any the handler set: the client may retry under it.
fn name_operation<B>(response: &mut Response<B>, operation: Option<HeaderValue>) {
    if let Some(value) = operation {
        response.headers_mut().insert(SERVICE_OPERATION, value);
    }
}

/// Whether the deadline of the request `finish` ends has passed: if so its scope is
/// cancelled with `DeadlineExceeded` now (unless it was cancelled already), as its timer would.
fn finish_expired(finish: Option<&Finish>) -> bool {
    finish.is_some_and(|f| f.scope().expire_if_passed())
}

/// Whether a response with `status` sends a body: 1xx, 204 and 304 never do (a server drops
/// such a body unread).
fn has_body(status: StatusCode) -> bool {
    !(status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED)
}

/// The `content-length` of a response, if it has one valid value.
fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    let mut values = headers.get_all(http::header::CONTENT_LENGTH).iter();
    let one = values.next()?;
    if values.next().is_some() {
        return None;
    }
    one.to_str().ok()?.trim().parse().ok()
}

/// Runs `f` (a poll of the handler) in the request's span, if the request is still running.
fn in_span<T>(finish: Option<&Finish>, f: impl FnOnce() -> T) -> T {
    let _in_span = finish.map(Finish::enter);
    f()
}

/// Polls the handler's `run` with `polling` set for the length of the poll; a panic of the
/// handler's is caught and returned.
fn poll_marked<F: Future>(
    polling: &mut bool,
    run: Pin<&mut Run<F>>,
    cx: &mut Context<'_>,
) -> Poll<std::thread::Result<<Run<F> as Future>::Output>> {
    *polling = true;
    let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run.poll(cx)));
    *polling = false;
    match polled {
        Ok(Poll::Pending) => Poll::Pending,
        Ok(Poll::Ready(out)) => Poll::Ready(Ok(out)),
        Err(panic) => Poll::Ready(Err(panic)),
    }
}

impl<F: Future, B> fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("grpc", &self.answers.grpc)
            .field("admitted", &self.finish.is_some())
            .finish_non_exhaustive()
    }
}
