//! The response future of [`Admit`](super::Admit).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Response, StatusCode};
use pin_project_lite::pin_project;

use super::answer::Answers;
use super::body::ResponseBody;
use super::service::ReportFn;
use crate::tree::Caught;
use crate::wire::{Admission, AdmissionError, ServiceEffect};
use crate::Run;
use crate::{Cause, Scope};

/// The reason of the cancel of a request whose handler panicked.
pub(super) const HANDLER_PANICKED: &str = "the handler panicked";

/// What happens to a request's scope when its response future ends or is dropped.
pub(super) struct Finish {
    scope: Scope,
    admission: Admission,
    on_report: Option<ReportFn>,
}

impl Finish {
    pub(super) fn new(scope: Scope, admission: Admission, on_report: Option<ReportFn>) -> Self {
        Finish {
            scope,
            admission,
            on_report,
        }
    }

    /// The request's scope.
    pub(super) fn scope(&self) -> &Scope {
        &self.scope
    }

    /// For the answer of a request that stopped: its scope's cause and whether a child that
    /// may have had an effect was dispatched (read after a cancel that reaches the whole
    /// request: see `Scope::cancel_then_effect`).
    pub(super) fn stopped(&self) -> (Cause, ServiceEffect) {
        let dispatched = self.scope.cancel_then_effect();
        (
            self.scope.cause_or_cancelled(),
            ServiceEffect::from_dispatched(dispatched),
        )
    }

    /// Ends a request whose handler panicked before its response future existed (in the
    /// service's `call`): cancelled with "the handler panicked", closed, reported.
    pub(super) fn handler_panicked(self) {
        self.cancel_then_done(Cause::cancelled(HANDLER_PANICKED));
    }

    /// Cancels the scope with `cause`, then [`done`](Self::done), also if the cancel panics (a
    /// waker or `on_cancel` callback of the request's): the panic comes out after, and the
    /// request is still reported.
    fn cancel_then_done(self, cause: Cause) {
        let mut caught = Caught::default();
        caught.run(|| {
            self.scope.cancel_because(cause);
        });
        self.done();
        caught.resume();
    }

    /// Closes the scope (no new work; running work goes on until done or the deadline) and
    /// reports once it is quiet. The close may make the scope quiet and wake its
    /// `quiesce()`s: the panic of one of their wakers comes out once the report is on its way.
    fn done(self) {
        let mut caught = Caught::default();
        caught.run(|| self.scope.close());
        if let Some(report) = self.on_report {
            let (scope, admission) = (self.scope, self.admission);
            // Inside a server there is always a runtime; without one there is nobody to wait.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let r = scope.quiesce().await;
                    report(&admission, &r);
                });
            }
        }
        caught.resume();
    }
}

pin_project! {
    #[project = StateProj]
    #[project_replace = StateReplace]
    enum State<F: Future, B> {
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
    /// [`Cause::ClientGone`] — or, if the handler panicked while it was polled, with
    /// `Cause::Cancelled` and the reason "the handler panicked".
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
        }
    }

    pub(super) fn admitted(
        run: Run<F>,
        finish: Finish,
        answers: Answers,
        track_body: bool,
    ) -> Self {
        ResponseFuture {
            state: State::Running { run },
            finish: Some(finish),
            answers,
            track_body,
            polling: false,
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: http_body::Body + Send + 'static,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let out = match this.state.as_mut().project() {
            StateProj::Answer { response } => match response.take() {
                Some(r) => Ok(r),
                None => panic!("ResponseFuture polled after completion"),
            },
            StateProj::Done => panic!("ResponseFuture polled after completion"),
            StateProj::Running { run } => match poll_marked(this.polling, run, cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(Ok(late))) if finish_expired(this.finish.as_ref()) => {
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
                Poll::Ready(Ok(out)) => {
                    // Reading the handler's body (its size hint, its end) runs the handler's
                    // code: a panic there is the handler's, not the client's going away.
                    *this.polling = true;
                    let out = out.map(|response| match this.finish.as_ref() {
                        // The body is tracked from before the scope is closed (below).
                        Some(f) => {
                            let track = *this.track_body && has_body(response.status());
                            let length = content_length(response.headers());
                            response.map(|body| {
                                ResponseBody::admitted(
                                    body,
                                    f.scope(),
                                    *this.answers,
                                    track,
                                    length,
                                )
                            })
                        }
                        None => unreachable!("a running request is finished once"),
                    });
                    *this.polling = false;
                    out
                }
                Poll::Ready(Err(stopped)) => {
                    let cause = stopped.cause().cloned().unwrap_or(Cause::DeadlineExceeded);
                    let effect = this
                        .finish
                        .as_ref()
                        .map_or(ServiceEffect::Unknown, |f| f.stopped().1);
                    Ok(this.answers.stopped(&cause, effect))
                }
            },
        };
        // Drop the handler's future before reporting: its work is over.
        this.state.project_replace(State::Done);
        if let Some(finish) = this.finish.take() {
            finish.done();
        }
        Poll::Ready(out)
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

/// Polls the handler's `run` with `polling` set for the length of the poll (left set if the
/// poll unwinds).
fn poll_marked<F: Future>(
    polling: &mut bool,
    run: Pin<&mut Run<F>>,
    cx: &mut Context<'_>,
) -> Poll<<Run<F> as Future>::Output> {
    *polling = true;
    let polled = run.poll(cx);
    *polling = false;
    polled
}

impl<F: Future, B> fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("grpc", &self.answers.grpc)
            .field("admitted", &self.finish.is_some())
            .finish_non_exhaustive()
    }
}
