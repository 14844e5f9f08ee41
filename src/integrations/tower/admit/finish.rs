//! How an admitted request ends: its handler's receipt, its scope closed, its report.

use http::{HeaderMap, Response, StatusCode};

use super::answer::Answers;
use super::body::ResponseBody;

use super::service::ReportFn;
use crate::child::HandlerTicket;
use crate::panic::Caught;
use crate::telemetry;
use crate::wire::{Admission, ServiceEffect};
use crate::{Cause, Scope};

/// The reason of the cancel of a request whose handler panicked.
pub(super) const HANDLER_PANICKED: &str = "the handler panicked";

/// What happens to a request's scope when its response future ends or is dropped.
pub(super) struct Finish {
    scope: Scope,
    admission: Admission,
    on_report: Option<ReportFn>,
    /// The handler, one child of the request until it answered (see `HandlerTicket`);
    /// dropped unanswered, it is `Cancelled`.
    handler: Option<HandlerTicket>,
    /// The request's span (see [`telemetry`]).
    telemetry: telemetry::Request,
    /// Records the request's report once it is quiet, where telemetry is on and no
    /// `on_report` waits for the report anyway; handed to a tracked response body, whose end
    /// is the request's.
    reporter: Option<Reporter>,
    /// Whether the request's end was checked against its would-be deadline (shadow mode).
    late_noted: bool,
}

/// Records a request's report in telemetry once the request is quiet: at once if it is quiet
/// when this is dropped (a request whose last work just ended: no task, no waiter), else from
/// a task that waits for it.
/// Boxed: it is there only with telemetry on, and the request's future and body should not
/// carry its size otherwise.
pub(super) struct Reporter {
    /// Reports as it is dropped.
    _reporting: Box<Reporting>,
}

/// What a [`Reporter`] reports.
struct Reporting {
    scope: Scope,
    admission: Admission,
    telemetry: telemetry::Request,
}

impl Drop for Reporting {
    fn drop(&mut self) {
        if let Some(report) = self.scope.report_if_quiet() {
            self.telemetry
                .report(self.admission.operation_id(), &report.telemetry());
            return;
        }
        // Inside a server there is always a runtime; without one there is nobody to wait.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (scope, admission) = (self.scope.clone(), self.admission.clone());
            let telemetry = self.telemetry.clone();
            rt.spawn(async move {
                let report = scope.quiesce().await;
                telemetry.report(admission.operation_id(), &report.telemetry());
            });
        }
    }
}

impl Finish {
    pub(super) fn new(
        scope: Scope,
        admission: Admission,
        on_report: Option<ReportFn>,
        handler: HandlerTicket,
    ) -> Self {
        let telemetry = telemetry::Request::new(&admission.telemetry());
        let reporter = (telemetry::REPORTS && on_report.is_none()).then(|| Reporter {
            _reporting: Box::new(Reporting {
                scope: scope.clone(),
                admission: admission.clone(),
                telemetry: telemetry.clone(),
            }),
        });
        Finish {
            scope,
            admission,
            on_report,
            handler: Some(handler),
            telemetry,
            reporter,
            late_noted: false,
        }
    }

    /// Where the request's telemetry report goes when it is not made here: a tracked response
    /// body takes it.
    pub(super) fn reporter(&mut self) -> &mut Option<Reporter> {
        &mut self.reporter
    }

    /// The request's telemetry (its span).
    pub(super) fn telemetry(&self) -> telemetry::Request {
        self.telemetry.clone()
    }

    /// Enters the request's span, for the length of a call into the handler.
    pub(super) fn enter(&self) -> telemetry::Entered<'_> {
        self.telemetry.enter()
    }

    /// Records the answer `response` on the request's span (`grpc`: a gRPC request, whose
    /// status is in the head only when the answer is trailers-only).
    pub(super) fn record_answer<B>(&self, response: &http::Response<B>, grpc: bool) {
        let code = grpc.then(|| {
            response
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok()?.trim().parse::<u32>().ok())
        });
        let deadline = self
            .scope
            .cause()
            .is_some_and(|c| c.origin().is_deadline_exceeded());
        self.telemetry
            .answered(response.status().as_u16(), code, deadline);
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

    /// Shadow mode: a request that ends (answered, stopped by the hard cap, its client gone)
    /// after its would-be deadline meets the cancel that did not happen; noted once, while the
    /// handler's unit still holds the request open.
    fn note_late(&mut self) {
        if std::mem::replace(&mut self.late_noted, true) {
            return;
        }
        if let Some(late) = self.admission.late_by(tokio::time::Instant::now()) {
            if let Some(by) = late.late_by() {
                self.telemetry.late(by);
            }
            self.scope.note_would_be(late);
            telemetry::shadow_deadline_exceeded();
        }
    }

    /// The handler answered with `status` (for gRPC, `headers` may hold a trailers-only
    /// status): `Succeeded`, or `Failed` for a server error of its own.
    pub(super) fn answered(&mut self, status: StatusCode, headers: &HeaderMap, grpc: bool) {
        let Some(handler) = self.handler.take() else {
            return;
        };
        self.note_late();
        let grpc_error = grpc
            .then(|| headers.get("grpc-status"))
            .flatten()
            .and_then(|v| v.to_str().ok()?.trim().parse::<u16>().ok())
            // UNKNOWN, DEADLINE_EXCEEDED, INTERNAL, UNAVAILABLE, DATA_LOSS: the server's.
            .filter(|code| [2, 4, 13, 14, 15].contains(code));
        match grpc_error {
            Some(code) => handler.fail(Some(format!("answered gRPC status {code}"))),
            None if status.is_server_error() => {
                handler.fail(Some(format!("answered HTTP {}", status.as_u16())));
            }
            None => handler.succeed(),
        }
    }

    /// Ends a request whose handler panicked (`message`: the panic's, for the report):
    /// `Failed`, the scope cancelled with "the handler panicked" (what it left running
    /// stops), closed, reported. Returns the answer of `answers` for it, which says what it
    /// knows of its effects (read after the cancel).
    pub(super) fn panicked<B>(
        mut self,
        message: String,
        answers: Answers,
    ) -> Response<ResponseBody<B>> {
        if let Some(handler) = self.handler.take() {
            handler.fail(Some(format!("panicked: {message}")));
        }
        let mut caught = Caught::default();
        let effect = caught
            .run(|| ServiceEffect::from_dispatched(self.cancel_for(HANDLER_PANICKED)))
            .unwrap_or(ServiceEffect::Unknown);
        let answer = answers.panicked(effect);
        self.record_answer(&answer, answers.grpc);
        self.done(true);
        caught.resume();
        answer
    }

    /// Cancels the scope with the reason `why` and reads the effect flag after it.
    fn cancel_for(&self, why: &'static str) -> bool {
        self.scope.cancel_because(Cause::cancelled(why));
        self.scope.cancel_then_effect()
    }

    /// Cancels the scope with `cause`, then [`done`](Self::done), also if the cancel panics (a
    /// waker or `on_cancel` callback of the request's): the panic comes out after, and the
    /// request is still reported.
    pub(super) fn cancel_then_done(self, cause: Cause) {
        let mut caught = Caught::default();
        caught.run(|| {
            self.scope.cancel_because(cause);
        });
        self.done(true);
        caught.resume();
    }

    /// Gives the handler its receipt if it has none (`Cancelled`: stopped before it
    /// answered), closes the scope if `close` (no new work; running work goes on until done or
    /// the deadline) — a response body still streaming closes it at its end instead — and
    /// reports once it is quiet. The close may make the scope quiet and wake its
    /// `quiesce()`s: the panic of one of their wakers comes out once the report is on its way.
    pub(super) fn done(mut self, close: bool) {
        self.note_late();
        let mut caught = Caught::default();
        if close {
            caught.run(|| self.scope.close());
        }
        // After the close: the handler's unit is the last the request may hold, and its
        // release may make it quiet (and, under a closed server, add it to the server's
        // report before the server's unit goes: see `scope::request`).
        caught.run(|| drop(self.handler.take()));
        // Made at once if the request is quiet now, else once it is (see `Reporter`).
        caught.run(|| drop(self.reporter.take()));
        if let Some(report) = self.on_report.take() {
            let (scope, admission) = (self.scope.clone(), self.admission.clone());
            let telemetry = self.telemetry.clone();
            // Inside a server there is always a runtime; without one there is nobody to wait.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let r = scope.quiesce().await;
                    telemetry.report(admission.operation_id(), &r.telemetry());
                    report(&admission, &r);
                });
            }
        }
        caught.resume();
    }
}

/// The message of a panic's payload, if it is a string (as `panic!` makes).
pub(super) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(not a string)".to_owned())
}
