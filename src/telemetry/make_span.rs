//! A request span for the server's own tracing layer that declares the crate's fields.

use tracing::field::Empty;
use tracing::{Level, Span};

/// Makes a server's request span (method, URI, version, as tower-http's default one) that
/// also declares the request's `cancel_scope.*` fields (the budget, its source, priority,
/// policy version, the mode and, shadowed, the would-be decision, budget and lateness, and
/// whether the rejection cap let it through; see [the module docs](super)) and `error.type`, so that
/// [`Admit`](crate::integrations::tower::Admit) records them on it (`tracing` records only the
/// fields a span declared when it was made).
///
/// With the `tower-http` feature it is a `MakeSpan` for tower-http's `TraceLayer`
/// (`TraceLayer::new_for_http().make_span_with(RequestSpan::new())`, with `AdmitLayer` inside
/// it); for tonic, `Server::builder().trace_fn(|req| RequestSpan::new().make(req))`.
///
/// # Examples
///
/// ```
/// use cancel_scope::telemetry::RequestSpan;
/// let span = RequestSpan::new().level(tracing::Level::INFO).make(&http::Request::new(()));
/// # let _ = span;
/// ```
#[derive(Clone, Copy, Debug)]
pub struct RequestSpan {
    level: Level,
}

impl Default for RequestSpan {
    fn default() -> Self {
        RequestSpan::new()
    }
}

impl RequestSpan {
    /// Spans at DEBUG, as tower-http's.
    ///
    /// # Examples
    ///
    /// ```
    /// let _ = cancel_scope::telemetry::RequestSpan::new();
    /// ```
    pub const fn new() -> Self {
        RequestSpan {
            level: Level::DEBUG,
        }
    }

    /// Spans at `level`.
    ///
    /// # Examples
    ///
    /// ```
    /// let _ = cancel_scope::telemetry::RequestSpan::new().level(tracing::Level::INFO);
    /// ```
    pub const fn level(mut self, level: Level) -> Self {
        self.level = level;
        self
    }

    /// The span of `request`.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::telemetry::RequestSpan;
    /// let span = RequestSpan::new().make(&http::Request::new(()));
    /// # let _ = span;
    /// ```
    pub fn make<B>(&self, request: &http::Request<B>) -> Span {
        macro_rules! make {
            ($level:expr) => {
                tracing::span!(
                    $level,
                    "request",
                    method = %request.method(),
                    uri = %request.uri(),
                    version = ?request.version(),
                    cancel_scope.operation_id = Empty,
                    cancel_scope.budget_in_ms = Empty,
                    cancel_scope.budget_out_ms = Empty,
                    cancel_scope.budget_source = Empty,
                    cancel_scope.clamped = Empty,
                    cancel_scope.priority = Empty,
                    cancel_scope.priority_source = Empty,
                    cancel_scope.policy_version = Empty,
                    cancel_scope.mode = Empty,
                    cancel_scope.would_be = Empty,
                    cancel_scope.would_be_budget_ms = Empty,
                    cancel_scope.would_be_refused = Empty,
                    cancel_scope.would_be_late_ms = Empty,
                    cancel_scope.over_rejection_cap = Empty,
                    "error.type" = Empty,
                )
            };
        }
        match self.level {
            Level::ERROR => make!(Level::ERROR),
            Level::WARN => make!(Level::WARN),
            Level::INFO => make!(Level::INFO),
            Level::DEBUG => make!(Level::DEBUG),
            Level::TRACE => make!(Level::TRACE),
        }
    }
}

#[cfg(feature = "tower-http")]
impl<B> tower_http::trace::MakeSpan<B> for RequestSpan {
    fn make_span(&mut self, request: &http::Request<B>) -> Span {
        self.make(request)
    }
}
