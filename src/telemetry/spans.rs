//! The `tracing` spans and events of the crate.

use std::time::Duration;

use tracing::field::Empty;
use tracing::{Level, Span};

use super::{Admitted, Refused, Rejected, Reported};

/// The target of every span and event of the crate.
const TARGET: &str = "cancel_scope";

/// Whole milliseconds, for the `_ms` fields.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The name of gRPC status `code` (as `rpc.response.status_code` says it).
fn grpc_name(code: u32) -> &'static str {
    usize::try_from(code)
        .ok()
        .and_then(|i| super::GRPC_NAMES.get(i).copied())
        .unwrap_or("UNKNOWN")
}

/// Records an answer on `span`: the HTTP status, or for gRPC the status in the head (nothing
/// when the status comes in the trailers).
pub(super) fn answered(span: &Span, status: u16, grpc: Option<Option<u32>>) {
    match grpc {
        None => {
            span.record("http.response.status_code", status);
        }
        Some(Some(code)) => {
            span.record("rpc.response.status_code", grpc_name(code));
        }
        Some(None) => {}
    }
}

/// Records on `span` the gRPC status `code` that came in the trailers.
pub(super) fn grpc_status(span: &Span, code: u32) {
    span.record("rpc.response.status_code", grpc_name(code));
}

/// Records on `span` that a deadline of ours stopped its work.
pub(super) fn deadline(span: &Span) {
    span.record("error.type", "deadline_exceeded");
}

/// Records on `span` the request's mode and, shadowed, its would-be decision at admission:
/// `admitted`, `clamped` or `refused`, the would-be budget or `would_be_refused`, and whether
/// the rejection cap let it through.
fn shadow(span: &Span, a: &Admitted<'_>) {
    let Some(would_be) = a.shadow else {
        span.record("cancel_scope.mode", "enforce");
        return;
    };
    span.record("cancel_scope.mode", "shadow");
    match would_be {
        Some(budget) => {
            span.record("cancel_scope.would_be_budget_ms", ms(budget));
            let decision = if a.would_be_clamped {
                "clamped"
            } else {
                "admitted"
            };
            span.record("cancel_scope.would_be", decision);
        }
        None => {
            span.record("cancel_scope.would_be", "refused");
            span.record("cancel_scope.would_be_refused", true);
        }
    }
    if a.over_rejection_cap {
        span.record("cancel_scope.over_rejection_cap", true);
    }
}

/// The spans of an admitted request: its own, and the one that was current when it was
/// admitted (the server's request span), with whether that one declared our fields.
#[derive(Clone, Debug)]
pub(super) struct RequestSpans {
    pub(super) own: Span,
    outer: Span,
    outer_declares: bool,
}

impl RequestSpans {
    pub(super) fn new(a: &Admitted<'_>) -> Self {
        let own = tracing::debug_span!(
            target: TARGET,
            "cancel_scope.request",
            cancel_scope.operation_id = a.operation_id,
            cancel_scope.budget_in_ms = Empty,
            cancel_scope.budget_out_ms = ms(a.granted),
            cancel_scope.budget_source = a.source.label(),
            cancel_scope.clamped = a.clamped,
            cancel_scope.priority = a.priority,
            cancel_scope.priority_source = a.priority_source,
            cancel_scope.policy_version = a.policy_version,
            cancel_scope.mode = Empty,
            cancel_scope.would_be = Empty,
            cancel_scope.would_be_budget_ms = Empty,
            cancel_scope.would_be_refused = Empty,
            cancel_scope.would_be_late_ms = Empty,
            cancel_scope.over_rejection_cap = Empty,
            http.response.status_code = Empty,
            rpc.response.status_code = Empty,
            "error.type" = Empty,
        );
        if let Some(d) = a.declared {
            own.record("cancel_scope.budget_in_ms", ms(d));
        }
        shadow(&own, a);
        let outer = Span::current();
        let outer_declares = outer
            .metadata()
            .is_some_and(|m| m.fields().field("cancel_scope.operation_id").is_some());
        if outer_declares {
            outer.record("cancel_scope.operation_id", a.operation_id);
            if let Some(d) = a.declared {
                outer.record("cancel_scope.budget_in_ms", ms(d));
            }
            outer.record("cancel_scope.budget_out_ms", ms(a.granted));
            outer.record("cancel_scope.budget_source", a.source.label());
            outer.record("cancel_scope.clamped", a.clamped);
            outer.record("cancel_scope.priority", a.priority);
            outer.record("cancel_scope.priority_source", a.priority_source);
            outer.record("cancel_scope.policy_version", a.policy_version);
            shadow(&outer, a);
        }
        RequestSpans {
            own,
            outer,
            outer_declares,
        }
    }

    /// The request, shadowed, answered `late` after its would-be deadline.
    pub(super) fn late(&self, late: Duration) {
        self.own.record("cancel_scope.would_be_late_ms", ms(late));
        if self.outer_declares {
            self.outer.record("cancel_scope.would_be_late_ms", ms(late));
        }
    }

    pub(super) fn answered(&self, status: u16, grpc: Option<Option<u32>>, stopped: bool) {
        answered(&self.own, status, grpc);
        if stopped {
            deadline(&self.own);
            if self.outer_declares {
                deadline(&self.outer);
            }
        }
    }

    /// The answer's trailers came: their gRPC status, and the deadline that stopped it.
    #[cfg(feature = "tower")]
    pub(super) fn trailers(&self, trailers: &http::HeaderMap, deadline: bool) {
        if let Some(code) = trailers
            .get("grpc-status")
            .and_then(|v| v.to_str().ok()?.trim().parse::<u32>().ok())
        {
            grpc_status(&self.own, code);
        }
        if deadline {
            self::deadline(&self.own);
            if self.outer_declares {
                self::deadline(&self.outer);
            }
        }
    }

    /// The report event: WARN when an operator must act (a quarantined child, an unknown
    /// effect), DEBUG otherwise. Its parent is the request's span, or the server's when ours
    /// is not enabled.
    pub(super) fn report(&self, operation_id: &str, report: &Reported<'_>) {
        let parent = self.own.id().or_else(|| self.outer.id());
        let warn = report.must_act();
        let cause = report.cause.map(tracing::field::display);
        macro_rules! report_event {
            ($level:expr) => {
                tracing::event!(
                    target: TARGET,
                    parent: parent,
                    $level,
                    cancel_scope.operation_id = operation_id,
                    cancel_scope.lifecycle = ?report.lifecycle,
                    cancel_scope.cause = cause,
                    cancel_scope.receipts.succeeded = report.receipts[0],
                    cancel_scope.receipts.failed = report.receipts[1],
                    cancel_scope.receipts.cancelled = report.receipts[2],
                    cancel_scope.receipts.quarantined = report.receipts[3],
                    cancel_scope.receipts.effect_unknown = report.receipts[4],
                    cancel_scope.cancel_to_quiet_ms = report.cancel_to_quiet.map(ms),
                    cancel_scope.orphan_work_ms = ms(report.orphan_work),
                    "request report"
                )
            };
        }
        if warn {
            report_event!(Level::WARN);
        } else {
            report_event!(Level::DEBUG);
        }
    }
}

/// The event of a request refused at admission: WARN for bad input, DEBUG otherwise.
pub(super) fn rejected(reason: Rejected, error: &dyn std::fmt::Display) {
    macro_rules! rejected_event {
        ($level:expr) => {
            tracing::event!(
                target: TARGET,
                $level,
                cancel_scope.reason = reason.label(),
                error = %error,
                "request refused at admission"
            )
        };
    }
    if reason.is_bad_input() {
        rejected_event!(Level::WARN);
    } else {
        rejected_event!(Level::DEBUG);
    }
}

/// The span of an outgoing call to `dependency`, a child of the current span.
pub(super) fn call(
    dependency: &'static str,
    budget_in: Option<Duration>,
    told: Option<Duration>,
) -> Span {
    tracing::debug_span!(
        target: TARGET,
        "cancel_scope.call",
        cancel_scope.dependency = dependency,
        cancel_scope.budget_in_ms = budget_in.map(ms),
        cancel_scope.budget_out_ms = told.map(ms),
        http.response.status_code = Empty,
        rpc.response.status_code = Empty,
        "error.type" = Empty,
    )
}

/// The event of an outgoing call refused before it was sent (DEBUG: the budget did its job).
pub(super) fn call_refused(dependency: &'static str, reason: Refused) {
    tracing::event!(
        target: TARGET,
        Level::DEBUG,
        cancel_scope.dependency = dependency,
        cancel_scope.reason = reason.label(),
        "call refused before it was sent"
    );
}
