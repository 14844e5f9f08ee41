//! The events of telemetry: one function per decision the layers above report.

#[allow(unused_imports)] // which names are used depends on the features
use super::*;

/// A request was admitted: its budget and queue wait.
#[inline]
pub(crate) fn admitted(a: &Admitted<'_>) {
    #[cfg(feature = "metrics")]
    handles::admitted(a.source, a.clamped, a.granted, a.queued);
    let _ = a;
}

/// A request was refused at admission for `reason` (`error` says why, for the event).
#[inline]
pub(crate) fn rejected(reason: Rejected, error: &dyn std::fmt::Display) {
    #[cfg(feature = "metrics")]
    handles::rejected(reason);
    #[cfg(feature = "tracing")]
    spans::rejected(reason, error);
    let _ = (reason, error);
}

/// Admission in shadow mode would have refused a request for `reason`.
#[inline]
pub(crate) fn shadow_rejected(reason: Rejected) {
    #[cfg(feature = "metrics")]
    handles::shadow(SHADOW_ADMISSION_REJECTED, &[("reason", reason.label())]);
    let _ = reason;
}

/// An enforcing policy refused a request for `reason`, and its rejection cap let it through.
#[inline]
pub(crate) fn rejection_capped(reason: Rejected) {
    #[cfg(feature = "metrics")]
    handles::shadow(ADMISSION_REJECTION_CAPPED, &[("reason", reason.label())]);
    let _ = reason;
}

/// An outgoing call in shadow mode would not have been sent.
#[inline]
pub(crate) fn shadow_call_refused() {
    #[cfg(feature = "metrics")]
    handles::shadow(SHADOW_CALL_REFUSED, &[]);
}

/// A request in shadow mode ended after its would-be deadline, or a child scope of one after
/// its own.
#[inline]
pub(crate) fn shadow_deadline_exceeded() {
    #[cfg(feature = "metrics")]
    handles::shadow(SHADOW_DEADLINE_EXCEEDED, &[]);
}

/// An outgoing call to `dependency` was refused before it was sent.
#[inline]
pub(crate) fn call_refused(dependency: &'static str, reason: Refused) {
    #[cfg(feature = "metrics")]
    handles::call_refused(dependency, reason);
    #[cfg(feature = "tracing")]
    spans::call_refused(dependency, reason);
    let _ = (dependency, reason);
}

/// A retry or hedge attempt ended.
#[inline]
pub(crate) fn attempt(outcome: Attempt) {
    #[cfg(feature = "metrics")]
    handles::attempt(outcome);
    let _ = outcome;
}

/// A root scope the application made was cancelled by a cause of its own (see
/// `Scope::cancel_node`): counted in [`SCOPE_CANCELLED`].
#[inline]
pub(crate) fn root_cancelled(cause: &Cause) {
    #[cfg(feature = "metrics")]
    handles::cancelled(CancelCause::of(cause));
    let _ = cause;
}

/// A retry budget refused a retry or a hedge.
#[inline]
pub(crate) fn retry_budget_exhausted() {
    #[cfg(feature = "metrics")]
    handles::retry_budget_exhausted();
}
