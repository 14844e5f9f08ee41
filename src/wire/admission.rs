//! Ingress admission: from the budget headers of an incoming request to its root scope.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::envoy::{self, EnvoyTimeoutError};
use super::grpc_timeout::{self, GrpcTimeoutError};
use super::operation::Operation;
use super::policy::{EndpointPolicy, OnBadInput, OverCap, Trust};
use super::service_budget::{self, ServiceBudget, ServiceBudgetError};
use crate::budget::{BudgetExhausted, ChildBudget};
use crate::scope::deadline_after;
use crate::Scope;

/// One budget header, decoded line by line as the request's lines are added.
#[derive(Debug)]
struct Field<E> {
    lines: u32,
    /// The shortest valid value among the lines.
    shortest: Option<Duration>,
    /// The first decoding error among the lines.
    error: Option<E>,
}

impl<E> Field<E> {
    const fn new() -> Self {
        Field {
            lines: 0,
            shortest: None,
            error: None,
        }
    }

    fn add(&mut self, line: Result<Duration, E>) {
        self.lines = self.lines.saturating_add(1);
        match line {
            Ok(d) => self.shortest = Some(self.shortest.map_or(d, |s| s.min(d))),
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
    }
}

/// The budget headers of an incoming request, for [`EndpointPolicy::admit`].
///
/// Call a setter once per header line, with the raw bytes of the value; each line is decoded
/// as it is added. A header sent on more than one line is ambiguous (a smuggled second
/// `grpc-timeout: 99999999H` behind a proxy that read the first is exactly what an attacker
/// would try) and counts as bad input; if the policy falls back rather than rejects, the
/// shortest valid line still counts, so a repeat can never lengthen the budget.
///
/// # Examples
///
/// ```
/// use cancel_scope::wire::Incoming;
///
/// let incoming = Incoming::new()
///     .grpc_timeout(b"250m")
///     .service_budget(b"v=1, rem=240, op=checkout-7");
/// # let _ = incoming;
/// ```
#[derive(Debug)]
pub struct Incoming {
    grpc_timeout: Field<GrpcTimeoutError>,
    service_budget: Field<ServiceBudgetError>,
    envoy: Field<EnvoyTimeoutError>,
    /// The first valid `service-budget` line (operation id, priority, generation).
    caller: Option<ServiceBudget>,
}

impl Incoming {
    /// A request without budget headers.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::Incoming;
    /// let incoming = Incoming::new();
    /// # let _ = incoming;
    /// ```
    pub const fn new() -> Self {
        Incoming {
            grpc_timeout: Field::new(),
            service_budget: Field::new(),
            envoy: Field::new(),
            caller: None,
        }
    }

    /// Adds a `grpc-timeout` header line.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::Incoming;
    /// let incoming = Incoming::new().grpc_timeout(b"1S");
    /// # let _ = incoming;
    /// ```
    pub fn grpc_timeout(mut self, value: &[u8]) -> Self {
        self.grpc_timeout.add(grpc_timeout::decode_bytes(value));
        self
    }

    /// Adds a `service-budget` header line.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::Incoming;
    /// let incoming = Incoming::new().service_budget(b"v=1, rem=100");
    /// # let _ = incoming;
    /// ```
    pub fn service_budget(mut self, value: &[u8]) -> Self {
        let parsed = ServiceBudget::parse(value).map(|b| {
            let rem = b.remaining();
            self.caller.get_or_insert(b);
            rem
        });
        self.service_budget.add(parsed);
        self
    }

    /// Adds an `x-envoy-expected-rq-timeout-ms` header line (read only when the policy
    /// [trusts](Trust::Trusted) its callers).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::Incoming;
    /// let incoming = Incoming::new().envoy_expected_timeout(b"15000");
    /// # let _ = incoming;
    /// ```
    pub fn envoy_expected_timeout(mut self, value: &[u8]) -> Self {
        self.envoy.add(envoy::decode_expected_timeout_bytes(value));
        self
    }
}

impl Default for Incoming {
    fn default() -> Self {
        Incoming::new()
    }
}

/// Where an admitted request's budget came from.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::wire::{BudgetSource, EndpointPolicy, Incoming};
///
/// let policy = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
/// let (_, a) = policy.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
/// assert_eq!(a.budget_source(), BudgetSource::Default);
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BudgetSource {
    /// The caller declared nothing: the policy's default.
    Default,
    /// The `grpc-timeout` header (the shortest of those present wins).
    GrpcTimeout,
    /// The `service-budget` header.
    ServiceBudget,
    /// Envoy's `x-envoy-expected-rq-timeout-ms` (trusted callers only).
    Envoy,
    /// A header was bad and the policy fell back to its local default
    /// ([`OnBadInput::Fallback`]).
    Fallback,
}

/// Where an admitted request's priority came from.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::wire::{EndpointPolicy, Incoming, PrioritySource};
///
/// let policy = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1)).priority(3);
/// // An untrusted caller asking for urgency 0 does not get it.
/// let incoming = Incoming::new().service_budget(b"v=1, rem=100, prio=0");
/// let (_, a) = policy.admit(incoming, tokio::time::Instant::now()).unwrap();
/// assert_eq!((a.priority(), a.priority_source()), (3, PrioritySource::Policy));
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PrioritySource {
    /// The endpoint policy's priority.
    Policy,
    /// The caller's `prio`: from a trusted caller, or an untrusted caller asking for less
    /// urgency than the policy gives.
    Caller,
}

/// The audit record of one admitted request: who it is, what it asked for, what it got and
/// why.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use tokio::time::Instant;
/// use cancel_scope::wire::{BudgetSource, EndpointPolicy, Incoming};
///
/// let ms = Duration::from_millis;
/// let policy = EndpointPolicy::new(ms(2000), ms(1000)).reserve(ms(50)).version(4);
/// let ingress = Instant::now();
/// tokio::time::sleep(ms(60)).await; // queued
/// let (scope, a) = policy.admit(Incoming::new().grpc_timeout(b"1S"), ingress).unwrap();
///
/// assert_eq!(a.initial_remaining(), ms(1000 - 60 - 50));
/// assert_eq!(scope.deadline(), Some(a.deadline()));
/// assert_eq!((a.declared(), a.budget_source()), (Some(ms(1000)), BudgetSource::GrpcTimeout));
/// assert_eq!((a.policy_version(), a.header_version()), (4, None));
/// assert_eq!(a.queued(), ms(60));
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admission {
    operation: Arc<Operation>,
    caller_operation_id: Option<Arc<str>>,
    policy_version: u32,
    header_version: Option<u32>,
    trust: Trust,
    ingress: Instant,
    admitted_at: Instant,
    deadline: Instant,
    audit_deadline: SystemTime,
    initial_remaining: Duration,
    declared: Option<Duration>,
    clamped: bool,
    budget_source: BudgetSource,
    priority_source: PrioritySource,
}

impl Admission {
    /// The operation id the request runs under (see [`Trust`] for where it comes from).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
    /// let (_, a) = p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.operation_id().len(), 16); // a fresh local id
    /// # }
    /// ```
    pub fn operation_id(&self) -> &str {
        self.operation.id()
    }

    /// The operation the request's scopes share (id, priority, generation, egress defaults).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
    /// let (scope, a) = p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(scope.operation(), Some(a.operation()));
    /// # }
    /// ```
    pub fn operation(&self) -> &Operation {
        &self.operation
    }

    /// The operation id the caller sent (`op`), kept for audit even when an untrusted caller's
    /// id is not used.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
    /// let incoming = Incoming::new().service_budget(b"v=1, rem=10, op=theirs");
    /// let (_, a) = p.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.caller_operation_id(), Some("theirs"));
    /// assert_ne!(a.operation_id(), "theirs"); // untrusted: a local id
    /// # }
    /// ```
    pub fn caller_operation_id(&self) -> Option<&str> {
        self.caller_operation_id.as_deref()
    }

    /// The endpoint policy's version.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1)).version(2);
    /// let (_, a) = p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.policy_version(), 2);
    /// # }
    /// ```
    pub fn policy_version(&self) -> u32 {
        self.policy_version
    }

    /// The `service-budget` format version the caller sent, if it sent a valid one.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
    /// let incoming = Incoming::new().service_budget(b"v=1, rem=10");
    /// let (_, a) = p.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.header_version(), Some(1));
    /// # }
    /// ```
    pub fn header_version(&self) -> Option<u32> {
        self.header_version
    }

    /// The trust level the request was admitted under.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, Trust};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
    /// let (_, a) = p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.trust(), Trust::Untrusted);
    /// # }
    /// ```
    pub fn trust(&self) -> Trust {
        self.trust
    }

    /// When the request arrived (as given to [`EndpointPolicy::admit`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
    /// let at = tokio::time::Instant::now();
    /// let (_, a) = p.admit(Incoming::new(), at).unwrap();
    /// assert_eq!(a.ingress(), at);
    /// # }
    /// ```
    pub fn ingress(&self) -> Instant {
        self.ingress
    }

    /// When it was admitted.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
    /// let (_, a) = p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert!(a.admitted_at() >= a.ingress());
    /// # }
    /// ```
    pub fn admitted_at(&self) -> Instant {
        self.admitted_at
    }

    /// How long the request waited between ingress and admission.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
    /// let (_, a) = p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.queued(), Duration::ZERO);
    /// # }
    /// ```
    pub fn queued(&self) -> Duration {
        self.admitted_at.saturating_duration_since(self.ingress)
    }

    /// The root scope's deadline (monotonic).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
    /// let (s, a) = p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(s.deadline(), Some(a.deadline()));
    /// # }
    /// ```
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The deadline on the wall clock, for logs and audits only (never for budget arithmetic).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::{Duration, SystemTime};
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
    /// let (_, a) = p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert!(a.audit_deadline() > SystemTime::UNIX_EPOCH);
    /// # }
    /// ```
    pub fn audit_deadline(&self) -> SystemTime {
        self.audit_deadline
    }

    /// The budget the handler was given: `min(declared, max) − queued − reserve`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
    /// let incoming = Incoming::new().grpc_timeout(b"99999999H");
    /// let (_, a) = p.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.initial_remaining(), Duration::from_secs(1));
    /// # }
    /// ```
    pub fn initial_remaining(&self) -> Duration {
        self.initial_remaining
    }

    /// What the caller declared (the shortest valid budget header; the fallback budget when a
    /// header was bad and the policy falls back), before clamping.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
    /// let incoming = Incoming::new().grpc_timeout(b"5S");
    /// let (_, a) = p.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.declared(), Some(Duration::from_secs(5)));
    /// assert!(a.was_clamped());
    /// # }
    /// ```
    pub fn declared(&self) -> Option<Duration> {
        self.declared
    }

    /// Whether the declared budget was over the policy's maximum and clamped to it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
    /// let (_, a) = p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert!(!a.was_clamped());
    /// # }
    /// ```
    pub fn was_clamped(&self) -> bool {
        self.clamped
    }

    /// Where the budget came from.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{BudgetSource, EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
    /// let incoming = Incoming::new().grpc_timeout(b"500m").service_budget(b"v=1, rem=400");
    /// let (_, a) = p.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.budget_source(), BudgetSource::ServiceBudget); // the shorter one
    /// # }
    /// ```
    pub fn budget_source(&self) -> BudgetSource {
        self.budget_source
    }

    /// The cancel generation the caller's budget was cut from (`gen`, `0` if none).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
    /// let incoming = Incoming::new().service_budget(b"v=1, rem=400, gen=2");
    /// let (_, a) = p.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.generation(), 2);
    /// # }
    /// ```
    pub fn generation(&self) -> u64 {
        self.operation.generation()
    }

    /// The request's priority (RFC 9218 urgency).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1)).priority(1);
    /// let (_, a) = p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.priority(), 1);
    /// # }
    /// ```
    pub fn priority(&self) -> u8 {
        self.operation.priority()
    }

    /// Where the priority came from.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, PrioritySource, Trust};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1))
    ///     .trust(Trust::Trusted);
    /// let incoming = Incoming::new().service_budget(b"v=1, rem=400, prio=0");
    /// let (_, a) = p.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// assert_eq!((a.priority(), a.priority_source()), (0, PrioritySource::Caller));
    /// # }
    /// ```
    pub fn priority_source(&self) -> PrioritySource {
        self.priority_source
    }
}

/// Why a request was not admitted.
///
/// One opaque type with predicates: [`is_invalid`](Self::is_invalid) (answer HTTP 400 / gRPC
/// `INVALID_ARGUMENT`) and [`is_exhausted`](Self::is_exhausted) (too little budget was left
/// on arrival: HTTP 504 / gRPC `DEADLINE_EXCEEDED`). The `Display` text is for logs and is not
/// API.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::wire::{EndpointPolicy, Incoming};
///
/// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
/// let err = p.admit(Incoming::new().grpc_timeout(b"-1S"), tokio::time::Instant::now())
///     .unwrap_err();
/// assert!(err.is_invalid());
/// assert_eq!(err.header(), Some("grpc-timeout"));
/// # }
/// ```
#[derive(Debug)]
pub struct AdmissionError {
    kind: ErrorKind,
}

#[derive(Debug)]
enum ErrorKind {
    GrpcTimeout(GrpcTimeoutError),
    ServiceBudget(ServiceBudgetError),
    Envoy(EnvoyTimeoutError),
    Repeated(&'static str),
    OverCap { declared: Duration, max: Duration },
    Exhausted(BudgetExhausted),
}

impl AdmissionError {
    /// A budget header was malformed, repeated or (with [`OverCap::Reject`]) over the maximum:
    /// the caller's fault.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
    /// let twice = Incoming::new().grpc_timeout(b"1S").grpc_timeout(b"2S");
    /// assert!(p.admit(twice, tokio::time::Instant::now()).unwrap_err().is_invalid());
    /// # }
    /// ```
    pub fn is_invalid(&self) -> bool {
        !self.is_exhausted()
    }

    /// Less than the minimum useful budget was left on arrival.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1))
    ///     .min_useful(Duration::from_millis(50));
    /// let short = Incoming::new().grpc_timeout(b"10m");
    /// assert!(p.admit(short, tokio::time::Instant::now()).unwrap_err().is_exhausted());
    /// # }
    /// ```
    pub fn is_exhausted(&self) -> bool {
        matches!(self.kind, ErrorKind::Exhausted(_))
    }

    /// The header at fault, if one was.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
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
            ErrorKind::OverCap { .. } | ErrorKind::Exhausted(_) => None,
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
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1))
    ///     .min_useful(Duration::from_millis(50));
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
            ErrorKind::GrpcTimeout(e) => write!(f, "bad request budget: {e}"),
            ErrorKind::ServiceBudget(e) => write!(f, "bad request budget: {e}"),
            ErrorKind::Envoy(e) => write!(f, "bad request budget: {e}"),
            ErrorKind::Repeated(h) => write!(f, "bad request budget: {h} sent more than once"),
            ErrorKind::OverCap { declared, max } => write!(
                f,
                "bad request budget: {declared:?} is over this endpoint's maximum of {max:?}"
            ),
            ErrorKind::Exhausted(b) => write!(f, "request arrived with too little budget: {b}"),
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
            ErrorKind::Repeated(_) | ErrorKind::OverCap { .. } => None,
        }
    }
}

/// The budgets the caller declared, and what was wrong with them.
struct Declared {
    /// The shortest valid declared budget and where it came from.
    best: Option<(Duration, BudgetSource)>,
    /// The first bad header, if any.
    bad: Option<ErrorKind>,
}

impl Declared {
    fn take<E>(
        &mut self,
        field: Field<E>,
        source: BudgetSource,
        header: &'static str,
        kind: impl FnOnce(E) -> ErrorKind,
    ) {
        if let Some(d) = field.shortest {
            // Strictly shorter wins: the earlier source keeps ties.
            if self.best.is_none_or(|(b, _)| d < b) {
                self.best = Some((d, source));
            }
        }
        let bad = match field.error {
            Some(e) => Some(kind(e)),
            None if field.lines > 1 => Some(ErrorKind::Repeated(header)),
            None => None,
        };
        if let Some(bad) = bad {
            self.bad.get_or_insert(bad);
        }
    }
}

fn decode(incoming: Incoming, trust: Trust) -> (Declared, Option<ServiceBudget>) {
    let mut out = Declared {
        best: None,
        bad: None,
    };
    out.take(
        incoming.service_budget,
        BudgetSource::ServiceBudget,
        service_budget::HEADER,
        ErrorKind::ServiceBudget,
    );
    out.take(
        incoming.grpc_timeout,
        BudgetSource::GrpcTimeout,
        grpc_timeout::HEADER,
        ErrorKind::GrpcTimeout,
    );
    // Envoy's header is only believed from behind a trusted proxy.
    if trust == Trust::Trusted {
        out.take(
            incoming.envoy,
            BudgetSource::Envoy,
            envoy::EXPECTED_RQ_TIMEOUT_MS,
            ErrorKind::Envoy,
        );
    }
    (out, incoming.caller)
}

/// A fresh operation id: 16 hex digits from a randomly keyed hash (std's `RandomState` gets
/// new keys for every instance), no shared counter.
fn fresh_operation_id() -> Arc<str> {
    let mut h = RandomState::new().build_hasher();
    h.write_u8(0);
    format!("{:016x}", h.finish()).into()
}

impl EndpointPolicy {
    /// Admits an incoming request: decodes its budget headers, applies this policy, and
    /// returns the request's root scope and its admission record.
    ///
    /// `ingress` is when the request arrived; the time since then counts as queued and is
    /// taken off the budget:
    ///
    /// ```text
    /// remaining = min(declared or default, max) − (now − ingress) − reserve
    /// ```
    ///
    /// The declared budget is the shortest valid one among `service-budget`, `grpc-timeout`
    /// and (for trusted callers) Envoy's header. A caller can never get more than the
    /// policy's maximum nor more than it declared, whatever it sends; see [`Trust`] for what
    /// trust changes. The root scope is named after the operation id and carries the
    /// [`Operation`] (see [`Scope::operation`]).
    ///
    /// # Errors
    ///
    /// [`AdmissionError::is_invalid`]: a header is malformed or repeated and the policy
    /// rejects bad input ([`OnBadInput::Reject`]), or it is over the maximum and the policy
    /// rejects that ([`OverCap::Reject`]). [`AdmissionError::is_exhausted`]: the budget left is
    /// zero or below the minimum useful budget.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (the root scope's deadline needs tokio's timer).
    ///
    /// # Examples
    ///
    /// A hostile caller cannot buy more time than the endpoint allows:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    ///
    /// let policy = EndpointPolicy::new(Duration::from_secs(2), Duration::from_secs(1));
    /// let hostile = Incoming::new()
    ///     .grpc_timeout(b"99999999H")
    ///     .service_budget(b"v=1, rem=86400000, prio=0");
    /// let (scope, admission) = policy.admit(hostile, Instant::now()).unwrap();
    /// assert_eq!(scope.remaining(), Some(Duration::from_secs(2)));
    /// assert_eq!(admission.priority(), 3);
    /// # }
    /// ```
    #[track_caller]
    pub fn admit(
        &self,
        incoming: Incoming,
        ingress: Instant,
    ) -> Result<(Scope, Admission), AdmissionError> {
        let now = Instant::now();
        let trust = self.trust_level();
        let (mut declared, caller) = decode(incoming, trust);

        if let Some(bad) = declared.bad.take() {
            match self.bad_input() {
                OnBadInput::Reject => return Err(AdmissionError { kind: bad }),
                OnBadInput::Fallback(f) => {
                    let fallback = f.min(self.default_budget());
                    if declared.best.is_none_or(|(b, _)| fallback < b) {
                        declared.best = Some((fallback, BudgetSource::Fallback));
                    }
                }
            }
        }
        let asked = declared.best.map(|(d, _)| d);
        let budget_source = declared.best.map_or(BudgetSource::Default, |(_, s)| s);
        let clamped = asked.is_some_and(|d| d > self.max_budget());
        if clamped && self.over_cap_rule() == OverCap::Reject {
            return Err(AdmissionError {
                kind: ErrorKind::OverCap {
                    declared: asked.unwrap_or_default(),
                    max: self.max_budget(),
                },
            });
        }
        let queued = now.saturating_duration_since(ingress);
        let remaining = self.budget().admit(asked, queued);
        // The same "useless below the minimum" rule as every child budget.
        ChildBudget::new()
            .min_useful(self.min_useful_budget())
            .compute(Some(remaining))
            .map_err(|e| AdmissionError {
                kind: ErrorKind::Exhausted(e),
            })?;

        let caller = caller.as_ref();
        let caller_priority = caller.and_then(ServiceBudget::priority);
        let (priority, priority_source) = match (trust, caller_priority) {
            (Trust::Trusted, Some(p)) => (p, PrioritySource::Caller),
            // Untrusted callers may ask for less urgency (a larger number), never more.
            (Trust::Untrusted, Some(p)) if p > self.policy_priority() => {
                (p, PrioritySource::Caller)
            }
            _ => (self.policy_priority(), PrioritySource::Policy),
        };
        let caller_operation_id: Option<Arc<str>> =
            caller.and_then(ServiceBudget::operation_id).map(Arc::from);
        let operation_id = match (trust, &caller_operation_id) {
            (Trust::Trusted, Some(id)) => id.clone(),
            _ => fresh_operation_id(),
        };
        let operation = Arc::new(Operation::new(
            operation_id,
            priority,
            caller.map_or(0, ServiceBudget::generation),
            *self.egress(),
        ));
        let deadline = deadline_after(now, remaining);
        let scope = Scope::root_after(
            now,
            remaining,
            Some(operation.id_arc().clone()),
            Some(operation.clone()),
        );
        let admission = Admission {
            operation,
            caller_operation_id,
            policy_version: self.policy_version(),
            header_version: caller.map(ServiceBudget::version),
            trust,
            ingress,
            admitted_at: now,
            deadline,
            audit_deadline: SystemTime::now()
                .checked_add(remaining)
                .unwrap_or_else(SystemTime::now),
            initial_remaining: remaining,
            declared: asked,
            clamped,
            budget_source,
            priority_source,
        };
        Ok((scope, admission))
    }
}
