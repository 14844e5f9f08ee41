//! Why a request was not admitted.

use std::fmt;
use std::time::Duration;

use super::super::envoy::{self, EnvoyTimeoutError};
use super::super::grpc_timeout::{self, GrpcTimeoutError};
use super::super::service_budget::{self, ServiceBudgetError};
use crate::budget::BudgetExhausted;
use crate::registry::JoinError;

/// [`AdmissionError::public_message`] of a malformed or repeated budget header.
const INVALID: &str = "invalid budget header";
/// [`AdmissionError::public_message`] of a budget over a rejecting maximum.
const OVER_CAP: &str = "budget exceeds the endpoint's maximum";
/// [`AdmissionError::public_message`] of a request with too little budget left.
const EXHAUSTED: &str = "budget exhausted";
const UNAVAILABLE: &str = "service unavailable";
/// [`AdmissionError::public_message`] of a request of a cancelled operation.
const OPERATION_CANCELLED: &str = "operation cancelled";

/// Why a request was not admitted.
///
/// One opaque type with predicates: [`is_invalid`](Self::is_invalid) (answer HTTP 400 / gRPC
/// `INVALID_ARGUMENT`; [`is_over_cap`](Self::is_over_cap) among them) and
/// [`is_exhausted`](Self::is_exhausted) (too little budget was left on arrival: HTTP 504 /
/// gRPC `DEADLINE_EXCEEDED`), [`is_unavailable`](Self::is_unavailable) (a server's shutdown
/// has begun: 503 / `UNAVAILABLE`) and
/// [`is_operation_cancelled`](Self::is_operation_cancelled) (the operation registry says the
/// request's operation was cancelled: 409 / `ABORTED`).
///
/// Two texts: [`public_message`](Self::public_message), one fixed text per kind, is what a
/// caller that is not [shown the detail](crate::wire::EndpointPolicyBuilder::error_detail) is told;
/// the `Display` text adds the detail (the header, the values) for logs and trusted callers,
/// and is not API.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::wire::{EndpointPolicy, Incoming};
///
/// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
/// let err = p.admit(Incoming::new().grpc_timeout(b"-1S"), tokio::time::Instant::now())
///     .unwrap_err();
/// assert!(err.is_invalid());
/// assert_eq!(err.header(), Some("grpc-timeout"));
/// # }
/// ```
#[derive(Debug)]
pub struct AdmissionError {
    pub(super) kind: ErrorKind,
}

#[derive(Debug)]
pub(super) enum ErrorKind {
    GrpcTimeout(GrpcTimeoutError),
    ServiceBudget(ServiceBudgetError),
    Envoy(EnvoyTimeoutError),
    Repeated(&'static str),
    OverCap {
        declared: Duration,
        max: Duration,
    },
    Exhausted(BudgetExhausted),
    /// The server's shutdown has begun: it admits no one.
    Unavailable,
    /// The registry refused the request's operation: cancelled, or another generation.
    Operation(JoinError),
}

impl AdmissionError {
    /// A budget header was malformed, repeated or (with
    /// [`OverCap::Reject`](crate::wire::OverCap::Reject)) over the maximum: the caller's fault.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let twice = Incoming::new().grpc_timeout(b"1S").grpc_timeout(b"2S");
    /// assert!(p.admit(twice, tokio::time::Instant::now()).unwrap_err().is_invalid());
    /// # }
    /// ```
    pub fn is_invalid(&self) -> bool {
        !matches!(
            self.kind,
            ErrorKind::Exhausted(_) | ErrorKind::Unavailable | ErrorKind::Operation(_)
        )
    }

    /// The server's shutdown has begun ([`ServerScope::shutdown`](crate::wire::ServerScope::shutdown)):
    /// the request was refused before anything was done for it (answer 503 / `UNAVAILABLE`,
    /// with a `Retry-After`: another instance can take it).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, ServerScope};
    /// let server = ServerScope::new();
    /// server.shutdown(Duration::ZERO).await;
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let err = p.admit_in(&server, Incoming::new(), tokio::time::Instant::now()).unwrap_err();
    /// assert!(err.is_unavailable() && !err.is_invalid());
    /// assert_eq!(err.public_message(), "service unavailable");
    /// # }
    /// ```
    pub fn is_unavailable(&self) -> bool {
        matches!(self.kind, ErrorKind::Unavailable)
    }

    /// The `reason` label of this refusal (see [`telemetry`](crate::telemetry)).
    pub(crate) fn telemetry_reason(&self) -> crate::telemetry::Rejected {
        use crate::telemetry::Rejected;
        match self.kind {
            ErrorKind::OverCap { .. } => Rejected::OverCap,
            ErrorKind::Exhausted(_) => Rejected::Exhausted,
            ErrorKind::Unavailable => Rejected::Shutdown,
            ErrorKind::Operation(_) => Rejected::OperationCancelled,
            _ => Rejected::Invalid,
        }
    }

    /// The refusal of a request that reached a server whose shutdown has begun.
    pub(crate) fn unavailable() -> Self {
        AdmissionError {
            kind: ErrorKind::Unavailable,
        }
    }

    /// The request's operation was cancelled: the registry (or this process's record of the
    /// cancel) says so, or the request carries an older generation than the operation's
    /// (it was cut before a cancel). Answer HTTP 409 / gRPC `ABORTED` with
    /// `service-effect: none`: nothing was done, and retrying under the same operation is
    /// refused again. [`operation_error`](Self::operation_error) says which.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use cancel_scope::registry::{InProcessRegistry, OperationId, Operations};
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    ///
    /// let policy = EndpointPolicy::builder(Duration::from_secs(2))
    ///     .default_budget(Duration::from_secs(1))
    ///     .build();
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// let (_, a) = policy.admit_joined(&ops, Incoming::new(), tokio::time::Instant::now()).await.unwrap();
    /// ops.cancel(&OperationId::new(a.operation_id()).unwrap()).await.unwrap();
    ///
    /// // A trusted hop's later request of that operation is refused.
    /// let trusted = policy.to_builder().caller_operation(true).build();
    /// let again = format!("v=1, rem=500, op=\"{}\"", a.operation_id());
    /// let incoming = Incoming::new().service_budget(again.as_bytes());
    /// let err = trusted.admit_joined(&ops, incoming, tokio::time::Instant::now()).await.unwrap_err();
    /// assert!(err.is_operation_cancelled() && !err.is_invalid());
    /// assert_eq!(err.public_message(), "operation cancelled");
    /// # }
    /// ```
    pub fn is_operation_cancelled(&self) -> bool {
        matches!(self.kind, ErrorKind::Operation(_))
    }

    /// The registry's refusal, when [`is_operation_cancelled`](Self::is_operation_cancelled).
    ///
    /// # Examples
    ///
    /// See [`is_operation_cancelled`](Self::is_operation_cancelled).
    pub fn operation_error(&self) -> Option<&JoinError> {
        match &self.kind {
            ErrorKind::Operation(e) => Some(e),
            _ => None,
        }
    }

    /// The refusal of a request whose operation the registry refused.
    pub(crate) fn operation(e: JoinError) -> Self {
        AdmissionError {
            kind: ErrorKind::Operation(e),
        }
    }

    /// Less than the minimum useful budget was left on arrival.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .min_useful(Duration::from_millis(50))
    ///     .build();
    /// let short = Incoming::new().grpc_timeout(b"10m");
    /// assert!(p.admit(short, tokio::time::Instant::now()).unwrap_err().is_budget_exhausted());
    /// # }
    /// ```
    pub fn is_budget_exhausted(&self) -> bool {
        matches!(self.kind, ErrorKind::Exhausted(_))
    }

    /// Less than the minimum useful budget was left on arrival: the former name of
    /// [`is_budget_exhausted`](Self::is_budget_exhausted).
    ///
    /// # Examples
    ///
    /// ```
    /// # #![allow(deprecated)]
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .min_useful(Duration::from_millis(50))
    ///     .build();
    /// let short = Incoming::new().grpc_timeout(b"10m");
    /// assert!(p.admit(short, tokio::time::Instant::now()).unwrap_err().is_exhausted());
    /// # }
    /// ```
    #[deprecated(
        since = "0.1.0",
        note = "renamed `is_budget_exhausted`, as on every error type"
    )]
    pub fn is_exhausted(&self) -> bool {
        self.is_budget_exhausted()
    }

    /// The budget declared was over the maximum and the policy rejects that
    /// ([`OverCap::Reject`](crate::wire::OverCap::Reject)); also
    /// [`is_invalid`](Self::is_invalid).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, OverCap};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .over_cap(OverCap::Reject)
    ///     .build();
    /// let err = p.admit(Incoming::new().grpc_timeout(b"5S"), tokio::time::Instant::now())
    ///     .unwrap_err();
    /// assert!(err.is_over_cap() && err.is_invalid());
    /// # }
    /// ```
    pub fn is_over_cap(&self) -> bool {
        matches!(self.kind, ErrorKind::OverCap { .. })
    }

    /// The fixed text of this kind of refusal, the same for every request of the kind, with
    /// no numbers and no header values: `invalid budget header` (malformed or repeated),
    /// `budget exceeds the endpoint's maximum` ([`is_over_cap`](Self::is_over_cap)) or
    /// `budget exhausted` ([`is_exhausted`](Self::is_exhausted)), `service unavailable`
    /// ([`is_unavailable`](Self::is_unavailable)) or `operation cancelled`
    /// ([`is_operation_cancelled`](Self::is_operation_cancelled)). These texts are API.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let err = p.admit(Incoming::new().grpc_timeout(b"1 hour"), tokio::time::Instant::now())
    ///     .unwrap_err();
    /// assert_eq!(err.public_message(), "invalid budget header");
    /// assert!(err.to_string().starts_with("invalid budget header: grpc-timeout"));
    /// # }
    /// ```
    pub fn public_message(&self) -> &'static str {
        match self.kind {
            ErrorKind::OverCap { .. } => OVER_CAP,
            ErrorKind::Exhausted(_) => EXHAUSTED,
            ErrorKind::Unavailable => UNAVAILABLE,
            ErrorKind::Operation(_) => OPERATION_CANCELLED,
            _ => INVALID,
        }
    }

    /// The header at fault, if one was.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let bad = Incoming::new().service_budget(b"v=2, rem=10");
    /// let err = p.admit(bad, tokio::time::Instant::now()).unwrap_err();
    /// assert_eq!(err.header(), Some("service-budget"));
    /// # }
    /// ```
    pub fn header(&self) -> Option<&'static str> {
        match &self.kind {
            ErrorKind::GrpcTimeout(_) => Some(grpc_timeout::HEADER),
            ErrorKind::ServiceBudget(_) => Some(service_budget::HEADER),
            ErrorKind::Envoy(_) => Some(envoy::EXPECTED_RQ_TIMEOUT_MS),
            ErrorKind::Repeated(h) => Some(h),
            ErrorKind::OverCap { .. }
            | ErrorKind::Exhausted(_)
            | ErrorKind::Unavailable
            | ErrorKind::Operation(_) => None,
        }
    }

    /// The shortfall, when [`is_exhausted`](Self::is_exhausted).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .min_useful(Duration::from_millis(50))
    ///     .build();
    /// let err = p.admit(Incoming::new().grpc_timeout(b"10m"), tokio::time::Instant::now())
    ///     .unwrap_err();
    /// assert_eq!(err.budget().unwrap().available(), Duration::from_millis(10));
    /// # }
    /// ```
    pub fn budget(&self) -> Option<&BudgetExhausted> {
        match &self.kind {
            ErrorKind::Exhausted(b) => Some(b),
            _ => None,
        }
    }
}

impl fmt::Display for AdmissionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::GrpcTimeout(e) => write!(f, "{INVALID}: {}: {e}", grpc_timeout::HEADER),
            ErrorKind::ServiceBudget(e) => {
                write!(f, "{INVALID}: {}: {e}", service_budget::HEADER)
            }
            ErrorKind::Envoy(e) => write!(f, "{INVALID}: {}: {e}", envoy::EXPECTED_RQ_TIMEOUT_MS),
            ErrorKind::Repeated(h) => write!(f, "{INVALID}: {h} sent more than once"),
            ErrorKind::OverCap { declared, max } => {
                write!(f, "{OVER_CAP}: {declared:?} declared, {max:?} at most")
            }
            ErrorKind::Exhausted(b) => write!(f, "{EXHAUSTED}: {b}"),
            ErrorKind::Unavailable => write!(f, "{UNAVAILABLE}: the server is shutting down"),
            ErrorKind::Operation(e) => write!(f, "{OPERATION_CANCELLED}: {e}"),
        }
    }
}

impl std::error::Error for AdmissionError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::GrpcTimeout(e) => Some(e),
            ErrorKind::ServiceBudget(e) => Some(e),
            ErrorKind::Envoy(e) => Some(e),
            ErrorKind::Exhausted(b) => Some(b),
            ErrorKind::Operation(e) => Some(e),
            ErrorKind::Repeated(_) | ErrorKind::OverCap { .. } | ErrorKind::Unavailable => None,
        }
    }
}
