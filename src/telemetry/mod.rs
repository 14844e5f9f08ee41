//! Telemetry: `tracing` spans and events (feature `tracing`) and `metrics` counters and
//! histograms (feature `metrics`) for the decisions the crate makes.
//!
//! Nothing here is in the default build: with both features off, every hook the crate calls
//! is an empty inline function and the types below carry nothing. Telemetry is emitted where
//! a decision is made (admission, the server and client layers, the call path, retry, the
//! request's report), never inside the cancellation tree itself.
//!
//! # Metrics
//!
//! Through the [`metrics`](https://docs.rs/metrics) facade, to whatever recorder is installed
//! (Prometheus, StatsD, a test's `DebuggingRecorder`). Time is in seconds. Call `describe`
//! once, after installing the recorder, so that it knows the units and descriptions.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | [`ADMISSION_BUDGET`] | histogram (s): the budget a request was admitted with | `source` (`grpc_timeout`, `service_budget`, `envoy`, `default`), `clamped` (`true`, `false`) |
//! | [`ADMISSION_QUEUE_WAIT`] | histogram (s): the time a request waited before admission | |
//! | [`ADMISSION_REJECTED`] | counter: requests refused at admission | `reason` (`invalid`, `exhausted`, `over_cap`, `shutdown`, `operation_cancelled`: a cancelled operation or an older generation, with the registry) |
//! | [`CALL_BUDGET`] | histogram (s): the budget of an outgoing call's scope | `dependency` |
//! | [`CALL_REFUSED`] | counter: outgoing calls refused before they were sent | `dependency`, `reason` (`cancelled`, `deadline`, `min_useful`, `no_scope`) |
//! | [`SCOPE_CANCELLED`] | counter: admitted requests, calls and the application's root scopes that were cancelled | `cause` (`deadline_exceeded`, `cancelled`, `client_gone`, `shutdown`) |
//! | [`SCOPE_CANCEL_TO_QUIET`] | histogram (s): from an admitted request's cancel to its quiescence | |
//! | [`SCOPE_ORPHAN_WORK`] | histogram (s): the work of an admitted request that ran on after its cancel | |
//! | [`RECEIPTS`] | counter: the receipts in admitted requests' reports | `kind` (`succeeded`, `failed`, `cancelled`, `quarantined`, `effect_unknown`) |
//! | [`RETRY_ATTEMPTS`] | counter: retry and hedge attempts, when they end | `outcome` (`succeeded`, `failed`, `timed_out`, `stopped`, `panicked`) |
//! | [`RETRY_BUDGET_EXHAUSTED`] | counter: retries and hedges a [`RetryBudget`](crate::retry::RetryBudget) refused | |
//! | [`ADMISSION_REJECTION_CAPPED`] | counter: refusals the rejection cap let through ([`RejectionCap`](crate::wire::RejectionCap)): the request ran shadowed | `reason`, as [`ADMISSION_REJECTED`] |
//! | [`SHADOW_ADMISSION_REJECTED`] | counter: requests admission would have refused, in shadow mode ([`Mode::Shadow`](crate::wire::Mode)) or beyond the rejection cap | `reason`, as [`ADMISSION_REJECTED`] |
//! | [`SHADOW_CALL_REFUSED`] | counter: outgoing calls that would not have been sent, in shadow mode | |
//! | [`SHADOW_DEADLINE_EXCEEDED`] | counter: admitted requests that ended (answered, or stopped: the client gone, the hard cap) after the would-be deadline, in shadow mode, and their child scopes that ended after a would-be deadline of their own ([`WouldBe::is_child_late`](crate::wire::WouldBe::is_child_late)) (the cancels `SCOPE_CANCELLED{cause="deadline_exceeded"}` would have counted) | |
//!
//! A budget that was not valid and replaced by the policy's fallback
//! ([`BudgetSource::Fallback`](crate::wire::BudgetSource::Fallback)) counts as `default`: the
//! label says who decided the budget, the caller's header or the service's own rules.
//! `dependency` is the static name given on the client layer
//! (`integrations::tower::PropagateLayer::dependency`) or the call
//! (`integrations::reqwest::ScopedRequest::dependency`),
//! [`UNNAMED_DEPENDENCY`] where none is given: never a host or an address. Every label value is
//! one of a bounded set.
//!
//! `cancel_scope.scope.cancelled` counts each admitted request and each call once, at its
//! end, by the cause it was itself cancelled with (a call cancelled because its request was
//! is not counted again), and each root scope the application makes (`Scope::new`,
//! `with_timeout`, `with_deadline`, `detach`) once, when it is cancelled — explicitly, by its
//! deadline, by a token: not once per descendant inside a cancel walk. The crate's own roots
//! are not counted apart: a shield's clean-up is part of its request, and a `ServerScope`'s
//! shutdown is counted in the requests it cancels.
//!
//! **Handles.** The hot path does no registry lookup: each thread keeps the handles it
//! registered, per label set, with the recorder they came from (by its address). `metrics`
//! 0.24 binds a handle to the recorder that made it, and a recorder installed later
//! ([`metrics::set_global_recorder`](https://docs.rs/metrics/0.24/metrics/fn.set_global_recorder.html)
//! after the first request, or a thread-local one with `with_local_recorder`) would never see
//! a handle made before it: so the handles are made anew on a thread the first time it
//! records under another recorder than before. What was recorded before a recorder was
//! installed is lost, as with any `metrics` call.
//!
//! # Spans and events
//!
//! Through [`tracing`](https://docs.rs/tracing), target `cancel_scope`:
//!
//! * a DEBUG span [`REQUEST_SPAN`] per admitted request (a child of the span current when
//!   the server layer is called, entered while the handler runs), with the fields
//!   `cancel_scope.operation_id`, `cancel_scope.budget_in_ms` (what the caller declared),
//!   `cancel_scope.budget_out_ms` (what the request was given), `cancel_scope.budget_source`,
//!   `cancel_scope.clamped`, `cancel_scope.priority`, `cancel_scope.priority_source`,
//!   `cancel_scope.policy_version`, `cancel_scope.mode` (`enforce` or `shadow`: in shadow
//!   mode, shadowed by staged enforcement, or let through by the rejection cap), for a
//!   shadowed request `cancel_scope.would_be` (the decision enforcing admission would have
//!   made: `admitted`, `clamped` or `refused`), `cancel_scope.would_be_budget_ms` (the budget
//!   it would have given) or `cancel_scope.would_be_refused = true`,
//!   `cancel_scope.over_rejection_cap = true` for a refusal the rejection cap let through, and
//!   `cancel_scope.would_be_late_ms` when the request ended after the would-be deadline
//!   (how long after), and, recorded at the answer, `http.response.status_code`
//!   or `rpc.response.status_code` (the gRPC status name: from the head of a trailers-only
//!   answer, else from the trailers the answer's body ends with, the layer's own at a cut) and
//!   `error.type = "deadline_exceeded"` when the request's own deadline stopped it;
//! * a DEBUG span [`CALL_SPAN`] per outgoing call (a child of the current span: the request's,
//!   when the call is made from its handler), entered while the call is polled, with
//!   `cancel_scope.dependency`, `cancel_scope.budget_in_ms` (the caller's budget),
//!   `cancel_scope.budget_out_ms` (what the callee is told), the answer's status (for gRPC
//!   the status name, from the head of a trailers-only answer or, where a call's own status
//!   is, the trailers) and
//!   `error.type = "deadline_exceeded"` when the call's deadline stopped it;
//! * an event at report time, once the request is quiet: its lifecycle, cause, receipt counts,
//!   `cancel_scope.cancel_to_quiet_ms` and `cancel_scope.orphan_work_ms`; at WARN when a child
//!   was quarantined or an effect is unknown (an operator must reconcile), at DEBUG otherwise;
//! * an event for a request refused at admission: WARN for a malformed or over-cap budget
//!   header (hostile or broken input), DEBUG for a budget that ran out or a server shutting
//!   down (a plain deadline is not an operator's problem).
//!
//! What is known only after the response (the report) is an event, not a span held open.
//! `tracing` records only the fields a span declared when it was made: to have the request's
//! fields on the server's own request span too (the shadow fields included), make that span
//! with `RequestSpan` (features `tracing`, `tower`) (a `MakeSpan` for tower-http's
//! `TraceLayer`, or a function for tonic's `trace_fn`).

// Each feature uses its part of the labels and records.
#![cfg_attr(not(all(feature = "tracing", feature = "metrics")), allow(dead_code))]

mod events;
#[cfg(feature = "metrics")]
mod handles;
#[cfg(all(feature = "tracing", feature = "tower"))]
mod make_span;
#[cfg(feature = "tracing")]
mod spans;

use std::time::Duration;

use crate::Cause;

pub(crate) use events::*;
#[cfg(all(feature = "tracing", feature = "tower"))]
pub use make_span::RequestSpan;

/// `cancel_scope.admission.budget`: histogram, seconds.
pub const ADMISSION_BUDGET: &str = "cancel_scope.admission.budget";
/// `cancel_scope.admission.queue_wait`: histogram, seconds.
pub const ADMISSION_QUEUE_WAIT: &str = "cancel_scope.admission.queue_wait";
/// `cancel_scope.admission.rejected`: counter.
pub const ADMISSION_REJECTED: &str = "cancel_scope.admission.rejected";
/// `cancel_scope.admission.rejection_capped`: counter.
pub const ADMISSION_REJECTION_CAPPED: &str = "cancel_scope.admission.rejection_capped";
/// `cancel_scope.call.budget`: histogram, seconds.
pub const CALL_BUDGET: &str = "cancel_scope.call.budget";
/// `cancel_scope.call.refused`: counter.
pub const CALL_REFUSED: &str = "cancel_scope.call.refused";
/// `cancel_scope.scope.cancelled`: counter.
pub const SCOPE_CANCELLED: &str = "cancel_scope.scope.cancelled";
/// `cancel_scope.scope.cancel_to_quiet`: histogram, seconds.
pub const SCOPE_CANCEL_TO_QUIET: &str = "cancel_scope.scope.cancel_to_quiet";
/// `cancel_scope.scope.orphan_work`: histogram, seconds.
pub const SCOPE_ORPHAN_WORK: &str = "cancel_scope.scope.orphan_work";
/// `cancel_scope.receipts`: counter.
pub const RECEIPTS: &str = "cancel_scope.receipts";
/// `cancel_scope.retry.attempts`: counter.
pub const RETRY_ATTEMPTS: &str = "cancel_scope.retry.attempts";
/// `cancel_scope.retry.budget_exhausted`: counter.
pub const RETRY_BUDGET_EXHAUSTED: &str = "cancel_scope.retry.budget_exhausted";
/// `cancel_scope.shadow.admission.rejected`: counter.
pub const SHADOW_ADMISSION_REJECTED: &str = "cancel_scope.shadow.admission.rejected";
/// `cancel_scope.shadow.call.refused`: counter.
pub const SHADOW_CALL_REFUSED: &str = "cancel_scope.shadow.call.refused";
/// `cancel_scope.shadow.deadline_exceeded`: counter.
pub const SHADOW_DEADLINE_EXCEEDED: &str = "cancel_scope.shadow.deadline_exceeded";

/// The names of the gRPC status codes, by code (as OpenTelemetry's
/// `rpc.response.status_code` and the crate's receipts say them).
pub(crate) const GRPC_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The name of the span of an admitted request.
pub const REQUEST_SPAN: &str = "cancel_scope.request";
/// The name of the span of an outgoing call.
pub const CALL_SPAN: &str = "cancel_scope.call";
/// The `dependency` label of a call that was given no name.
pub const UNNAMED_DEPENDENCY: &str = "unnamed";

/// Every metric name, with its description and whether it is a histogram of seconds.
const METRICS: [(&str, &str, Kind); 15] = [
    (
        ADMISSION_BUDGET,
        "The budget a request was admitted with.",
        Kind::Seconds,
    ),
    (
        ADMISSION_QUEUE_WAIT,
        "How long a request waited before it was admitted (taken off its budget).",
        Kind::Seconds,
    ),
    (
        ADMISSION_REJECTED,
        "Requests refused at admission.",
        Kind::Count,
    ),
    (
        ADMISSION_REJECTION_CAPPED,
        "Refusals the rejection cap let through (run as shadow decisions).",
        Kind::Count,
    ),
    (
        CALL_BUDGET,
        "The budget of an outgoing call.",
        Kind::Seconds,
    ),
    (
        CALL_REFUSED,
        "Outgoing calls refused before they were sent.",
        Kind::Count,
    ),
    (
        SCOPE_CANCELLED,
        "Admitted requests and outgoing calls that were cancelled, by cause.",
        Kind::Count,
    ),
    (
        SCOPE_CANCEL_TO_QUIET,
        "From the cancel of an admitted request to its quiescence.",
        Kind::Seconds,
    ),
    (
        SCOPE_ORPHAN_WORK,
        "Work of an admitted request that ran on after its cancel.",
        Kind::Seconds,
    ),
    (
        RECEIPTS,
        "Receipts of the children of admitted requests, by kind.",
        Kind::Count,
    ),
    (
        RETRY_ATTEMPTS,
        "Retry and hedge attempts, by how they ended.",
        Kind::Count,
    ),
    (
        RETRY_BUDGET_EXHAUSTED,
        "Retries and hedges refused by a retry budget.",
        Kind::Count,
    ),
    (
        SHADOW_ADMISSION_REJECTED,
        "Requests admission would have refused (shadow mode).",
        Kind::Count,
    ),
    (
        SHADOW_CALL_REFUSED,
        "Outgoing calls that would not have been sent (shadow mode).",
        Kind::Count,
    ),
    (
        SHADOW_DEADLINE_EXCEEDED,
        "Requests and child scopes that ended after their would-be deadline (shadow mode).",
        Kind::Count,
    ),
];

#[derive(Clone, Copy)]
enum Kind {
    Seconds,
    Count,
}

/// Describes every metric of the crate (unit and description) to the installed recorder.
///
/// Call it once, after installing the recorder (a recorder installed later knows nothing of
/// it). Describing is optional: the metrics are recorded either way.
///
/// # Examples
///
/// ```
/// let recorder = metrics_util::debugging::DebuggingRecorder::new();
/// let snapshotter = recorder.snapshotter();
/// metrics::with_local_recorder(&recorder, cancel_scope::telemetry::describe);
/// # let _ = snapshotter;
/// ```
#[cfg(feature = "metrics")]
pub fn describe() {
    for (name, description, kind) in METRICS {
        match kind {
            Kind::Seconds => {
                metrics::describe_histogram!(name, metrics::Unit::Seconds, description);
            }
            Kind::Count => metrics::describe_counter!(name, metrics::Unit::Count, description),
        }
    }
}

/// Where an admitted request's budget came from, as the `source` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    GrpcTimeout,
    ServiceBudget,
    Envoy,
    Default,
}

impl Source {
    const ALL: [Source; 4] = [
        Source::GrpcTimeout,
        Source::ServiceBudget,
        Source::Envoy,
        Source::Default,
    ];

    fn label(self) -> &'static str {
        match self {
            Source::GrpcTimeout => "grpc_timeout",
            Source::ServiceBudget => "service_budget",
            Source::Envoy => "envoy",
            Source::Default => "default",
        }
    }
}

/// Why a request was refused at admission (`reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rejected {
    Invalid,
    Exhausted,
    OverCap,
    Shutdown,
    OperationCancelled,
}

impl Rejected {
    const ALL: [Rejected; 5] = [
        Rejected::Invalid,
        Rejected::Exhausted,
        Rejected::OverCap,
        Rejected::Shutdown,
        Rejected::OperationCancelled,
    ];

    fn label(self) -> &'static str {
        match self {
            Rejected::Invalid => "invalid",
            Rejected::Exhausted => "exhausted",
            Rejected::OverCap => "over_cap",
            Rejected::Shutdown => "shutdown",
            Rejected::OperationCancelled => "operation_cancelled",
        }
    }

    /// Hostile or broken input: what an operator must look at.
    fn is_bad_input(self) -> bool {
        matches!(self, Rejected::Invalid | Rejected::OverCap)
    }
}

/// Why an outgoing call was refused before it was sent (`reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    Cancelled,
    Deadline,
    MinUseful,
    NoScope,
}

impl Refused {
    const ALL: [Refused; 4] = [
        Refused::Cancelled,
        Refused::Deadline,
        Refused::MinUseful,
        Refused::NoScope,
    ];

    fn label(self) -> &'static str {
        match self {
            Refused::Cancelled => "cancelled",
            Refused::Deadline => "deadline",
            Refused::MinUseful => "min_useful",
            Refused::NoScope => "no_scope",
        }
    }

    /// Why `e` (an error of preparing a call) refused it.
    pub(crate) fn of(e: &crate::Error) -> Self {
        if e.is_deadline_exceeded() {
            return Refused::Deadline;
        }
        match e.budget() {
            Some(b) if b.available().is_zero() => Refused::Deadline,
            Some(_) => Refused::MinUseful,
            None => Refused::Cancelled,
        }
    }
}

/// The cause a scope was cancelled with (`cause`): the origin of a parent's cancel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CancelCause {
    DeadlineExceeded,
    Cancelled,
    ClientGone,
    Shutdown,
}

impl CancelCause {
    const ALL: [CancelCause; 4] = [
        CancelCause::DeadlineExceeded,
        CancelCause::Cancelled,
        CancelCause::ClientGone,
        CancelCause::Shutdown,
    ];

    fn of(cause: &Cause) -> Self {
        match cause.origin() {
            Cause::DeadlineExceeded => CancelCause::DeadlineExceeded,
            Cause::ClientGone => CancelCause::ClientGone,
            Cause::Shutdown => CancelCause::Shutdown,
            _ => CancelCause::Cancelled,
        }
    }

    fn label(self) -> &'static str {
        match self {
            CancelCause::DeadlineExceeded => "deadline_exceeded",
            CancelCause::Cancelled => "cancelled",
            CancelCause::ClientGone => "client_gone",
            CancelCause::Shutdown => "shutdown",
        }
    }
}

/// The `kind` label of [`RECEIPTS`], in the order of [`Report`]'s counts.
const RECEIPT_KINDS: [&str; 5] = [
    "succeeded",
    "failed",
    "cancelled",
    "quarantined",
    "effect_unknown",
];

/// What a quiet request's report says, as telemetry records it (the layer that has the
/// report fills it in: `Report::telemetry`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reported<'a> {
    /// The final lifecycle, as its `Debug` says it.
    pub(crate) lifecycle: &'a dyn std::fmt::Debug,
    pub(crate) cause: Option<&'a Cause>,
    /// The receipts, in the order of [`RECEIPT_KINDS`].
    pub(crate) receipts: [u64; 5],
    pub(crate) cancel_to_quiet: Option<Duration>,
    pub(crate) orphan_work: Duration,
}

impl Reported<'_> {
    /// A child was quarantined or an effect is unknown: an operator must reconcile.
    fn must_act(&self) -> bool {
        self.receipts[3] > 0 || self.receipts[4] > 0
    }
}

/// How a retry or hedge attempt ended (`outcome`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Attempt {
    Succeeded,
    Failed,
    TimedOut,
    Stopped,
    Panicked,
}

impl Attempt {
    const ALL: [Attempt; 5] = [
        Attempt::Succeeded,
        Attempt::Failed,
        Attempt::TimedOut,
        Attempt::Stopped,
        Attempt::Panicked,
    ];

    fn label(self) -> &'static str {
        match self {
            Attempt::Succeeded => "succeeded",
            Attempt::Failed => "failed",
            Attempt::TimedOut => "timed_out",
            Attempt::Stopped => "stopped",
            Attempt::Panicked => "panicked",
        }
    }
}

/// An admission decision, as telemetry sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Admitted<'a> {
    pub(crate) operation_id: &'a str,
    pub(crate) source: Source,
    pub(crate) clamped: bool,
    /// What the caller declared, if anything.
    pub(crate) declared: Option<Duration>,
    /// What the request was given.
    pub(crate) granted: Duration,
    pub(crate) queued: Duration,
    pub(crate) priority: u8,
    /// `policy` or `caller`.
    pub(crate) priority_source: &'static str,
    pub(crate) policy_version: u32,
    /// In shadow mode: the would-be budget, `None` if admission would have refused.
    pub(crate) shadow: Option<Option<Duration>>,
    /// In shadow mode: admission would have clamped the declared budget.
    pub(crate) would_be_clamped: bool,
    /// A refusal the rejection cap let through.
    pub(crate) over_rejection_cap: bool,
}

/// Whether metrics are recorded (feature `metrics`): a counted cancel keeps its cause's label.
pub(crate) const COUNTS: bool = cfg!(feature = "metrics");

/// Whether anything is recorded at report time (so whether a request's report is waited for
/// when nobody else asked for it).
pub(crate) const REPORTS: bool = cfg!(any(feature = "tracing", feature = "metrics"));

/// The telemetry of one admitted request: its span.
#[derive(Clone, Debug)]
pub(crate) struct Request {
    #[cfg(feature = "tracing")]
    span: spans::RequestSpans,
}

impl Request {
    /// The span of the request `a`, a child of the current span.
    #[inline]
    pub(crate) fn new(a: &Admitted<'_>) -> Self {
        let _ = a;
        Request {
            #[cfg(feature = "tracing")]
            span: spans::RequestSpans::new(a),
        }
    }

    /// Enters the request's span (for one poll of its handler).
    #[inline]
    pub(crate) fn enter(&self) -> Entered<'_> {
        Entered {
            #[cfg(feature = "tracing")]
            _entered: self.span.own.enter(),
            _life: std::marker::PhantomData,
        }
    }

    /// The request, shadowed, answered `late` after its would-be deadline.
    #[inline]
    pub(crate) fn late(&self, late: Duration) {
        #[cfg(feature = "tracing")]
        self.span.late(late);
        let _ = late;
    }

    /// The request was answered with `status` (and, for gRPC, the status code in its head, if
    /// it had one); `stopped` when its own deadline stopped it.
    #[inline]
    pub(crate) fn answered(&self, status: u16, grpc: Option<Option<u32>>, deadline: bool) {
        #[cfg(feature = "tracing")]
        self.span.answered(status, grpc, deadline);
        let _ = (status, grpc, deadline);
    }

    /// The request's answer ended with `trailers` (a gRPC answer whose status was not in its
    /// head): their `grpc-status` on the span; `deadline` when the request's own deadline
    /// stopped it.
    #[cfg(feature = "tower")]
    #[inline]
    pub(crate) fn trailers(&self, trailers: &http::HeaderMap, deadline: bool) {
        #[cfg(feature = "tracing")]
        self.span.trailers(trailers, deadline);
        let _ = (trailers, deadline);
    }

    /// The request is quiet: its report (`operation_id` names it in the event).
    pub(crate) fn report(&self, operation_id: &str, report: &Reported<'_>) {
        #[cfg(feature = "metrics")]
        {
            if let Some(cause) = report.cause {
                handles::cancelled(CancelCause::of(cause));
            }
            handles::report(report.receipts, report.cancel_to_quiet, report.orphan_work);
        }
        #[cfg(feature = "tracing")]
        self.span.report(operation_id, report);
        let _ = (operation_id, report);
    }
}

/// The telemetry of one outgoing call: its span.
#[derive(Debug)]
pub(crate) struct Call {
    #[cfg(feature = "tracing")]
    span: tracing::Span,
}

impl Call {
    /// A call to `dependency` made from a scope with `budget_in` left, in a scope with
    /// `budget` left, that tells the callee `told`.
    #[inline]
    pub(crate) fn new(
        dependency: &'static str,
        budget_in: Option<Duration>,
        budget: Option<Duration>,
        told: Option<Duration>,
    ) -> Self {
        #[cfg(feature = "metrics")]
        if let Some(b) = budget {
            handles::call_budget(dependency, b);
        }
        let _ = (dependency, budget_in, budget, told);
        Call {
            #[cfg(feature = "tracing")]
            span: spans::call(dependency, budget_in, told),
        }
    }

    /// Enters the call's span (for one poll of the call).
    #[inline]
    pub(crate) fn enter(&self) -> Entered<'_> {
        Entered {
            #[cfg(feature = "tracing")]
            _entered: self.span.enter(),
            _life: std::marker::PhantomData,
        }
    }

    /// `fut`, in the call's span.
    #[inline]
    pub(crate) fn instrument<F: std::future::Future>(&self, fut: F) -> Instrumented<F> {
        #[cfg(feature = "tracing")]
        return tracing::Instrument::instrument(fut, self.span.clone());
        #[cfg(not(feature = "tracing"))]
        fut
    }

    /// The callee answered with HTTP `status` (and, for gRPC, `grpc`: the status in the head).
    #[inline]
    pub(crate) fn answered(&self, status: u16, grpc: Option<Option<u32>>) {
        #[cfg(feature = "tracing")]
        spans::answered(&self.span, status, grpc);
        let _ = (status, grpc);
    }

    /// The callee's gRPC status `code` came in the trailers (where a call's own status is).
    #[inline]
    pub(crate) fn grpc_status(&self, code: u32) {
        #[cfg(feature = "tracing")]
        spans::grpc_status(&self.span, code);
        let _ = code;
    }

    /// The call ended; `cause` is its scope's cause, if it was cancelled. Counted in
    /// [`SCOPE_CANCELLED`] when it was cancelled by a cause of its own (not its parent's).
    #[inline]
    pub(crate) fn ended(&self, cause: Option<&Cause>) {
        let own = cause.filter(|c| !matches!(c, Cause::ParentCancelled(_)));
        #[cfg(feature = "metrics")]
        if let Some(c) = own {
            handles::cancelled(CancelCause::of(c));
        }
        #[cfg(feature = "tracing")]
        if cause.is_some_and(|c| c.origin().is_deadline_exceeded()) {
            spans::deadline(&self.span);
        }
        let _ = own;
    }
}

/// A future in a call's span.
#[cfg(feature = "tracing")]
pub(crate) type Instrumented<F> = tracing::instrument::Instrumented<F>;
/// A future in a call's span.
#[cfg(not(feature = "tracing"))]
pub(crate) type Instrumented<F> = F;

/// A span entered for the length of a poll.
#[must_use = "the span is left when this is dropped"]
pub(crate) struct Entered<'a> {
    #[cfg(feature = "tracing")]
    _entered: tracing::span::Entered<'a>,
    _life: std::marker::PhantomData<&'a ()>,
}
