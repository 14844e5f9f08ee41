//! The audit record of an admitted request, and where each of its values came from.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::super::operation::Operation;
use super::super::service_budget::ServiceBudget;

/// Where an admitted request's budget came from.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::wire::{BudgetSource, EndpointPolicy, Incoming};
///
/// let policy = EndpointPolicy::builder(Duration::from_secs(1)).build();
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
    /// Envoy's `x-envoy-expected-rq-timeout-ms` (only where the policy
    /// [reads it](crate::wire::EndpointPolicyBuilder::envoy_timeout)).
    Envoy,
    /// A header was bad and the policy fell back to its local default
    /// ([`OnBadInput::Fallback`](crate::wire::OnBadInput::Fallback)).
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
/// let policy = EndpointPolicy::builder(Duration::from_secs(1)).priority(3).build();
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
    /// The caller's `prio`: where the policy
    /// [accepts it](crate::wire::EndpointPolicyBuilder::caller_priority), or where the caller asks
    /// for less urgency than the policy gives.
    Caller,
}

/// Where an admitted request's operation (its id and generation) came from.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::wire::{EndpointPolicy, Incoming, OperationSource};
///
/// let policy = EndpointPolicy::builder(Duration::from_secs(1)).build();
/// let incoming = Incoming::new().service_budget(b"v=1, rem=100, op=victim-op, gen=9");
/// let (_, a) = policy.admit(incoming, tokio::time::Instant::now()).unwrap();
/// // Not accepted: a fresh local operation, whose generation starts at 0.
/// assert_eq!(a.operation_source(), OperationSource::Local);
/// assert_ne!(a.operation_id(), "victim-op");
/// assert_eq!(a.generation(), 0);
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OperationSource {
    /// A fresh local operation id, generation 0: the caller sent no `op`, or the policy does
    /// not [accept](crate::wire::EndpointPolicyBuilder::caller_operation) the caller's.
    Local,
    /// The caller's `op`, and its `gen` (0 if it sent none).
    Caller,
    /// The `op` of a caller the policy does not trust to name operations, continued because
    /// the operation registry knew it
    /// ([`EndpointPolicy::admit_joined`](crate::wire::EndpointPolicy::admit_joined)); the
    /// generation is the registry's.
    Known,
}

/// Whether the operation registry's term applied to an admitted request
/// ([`EndpointPolicy::admit_joined`](crate::wire::EndpointPolicy::admit_joined)).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use cancel_scope::registry::{InProcessRegistry, Operations};
/// use cancel_scope::wire::{EndpointPolicy, Incoming, RegistryTerm};
///
/// let policy = EndpointPolicy::builder(Duration::from_secs(2))
///     .default_budget(Duration::from_secs(1))
///     .build();
/// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
/// let (_, a) = policy.admit_joined(&ops, Incoming::new(), tokio::time::Instant::now()).await.unwrap();
/// assert_eq!(a.registry(), RegistryTerm::Created);
/// let (_, b) = policy.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
/// assert_eq!(b.registry(), RegistryTerm::None);
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RegistryTerm {
    /// Admitted without a registry ([`EndpointPolicy::admit`](crate::wire::EndpointPolicy::admit)).
    None,
    /// The request began its operation in the registry, with its own budget.
    Created,
    /// The request joined an operation the registry held: its budget is at most what the
    /// operation had left.
    Joined,
    /// The registry failed (unreachable, slower than its bound, full): the request was
    /// admitted on the endpoint's own terms, the fault counted
    /// ([`JoinCounts::faults`](crate::registry::JoinCounts::faults)) and noted in its report
    /// ([`Report::registry_faults`](crate::Report::registry_faults)).
    Fault,
}

impl RegistryTerm {
    /// Whether the registry's remaining time bounds the request (`Created` or `Joined`).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::RegistryTerm;
    /// assert!(RegistryTerm::Joined.applied());
    /// assert!(!RegistryTerm::Fault.applied());
    /// ```
    pub const fn applied(self) -> bool {
        matches!(self, RegistryTerm::Created | RegistryTerm::Joined)
    }
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
/// let policy = EndpointPolicy::builder(ms(2000))
///     .default_budget(ms(1000))
///     .reserve(ms(50))
///     .version(4)
///     .build();
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
#[derive(Clone, PartialEq, Eq)]
pub struct Admission(pub(in crate::wire) Arc<super::fields::Admission>);

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl Admission {
    /// This admission, as telemetry records it. Inlined: without a telemetry feature nothing
    /// reads it, and the compiler drops the work.
    #[inline]
    pub(crate) fn telemetry(&self) -> crate::telemetry::Admitted<'_> {
        use crate::telemetry::Source;
        crate::telemetry::Admitted {
            operation_id: self.operation_id(),
            source: match self.0.budget_source {
                BudgetSource::GrpcTimeout => Source::GrpcTimeout,
                BudgetSource::ServiceBudget => Source::ServiceBudget,
                BudgetSource::Envoy => Source::Envoy,
                BudgetSource::Default | BudgetSource::Fallback => Source::Default,
            },
            clamped: self.0.clamped,
            declared: self.0.declared,
            granted: self.0.initial_remaining,
            queued: self.queued(),
            priority: self.priority(),
            priority_source: match self.0.priority_source {
                PrioritySource::Policy => "policy",
                PrioritySource::Caller => "caller",
            },
            policy_version: self.0.policy_version,
            shadow: self.0.shadow.as_ref().map(|s| {
                s.would_be_deadline
                    .map(|d| d.saturating_duration_since(self.0.admitted_at))
            }),
            would_be_clamped: self
                .0
                .shadow
                .as_ref()
                .is_some_and(|s| s.decisions.iter().any(super::super::WouldBe::is_clamp)),
            over_rejection_cap: self.0.shadow.as_ref().is_some_and(|s| s.over_rejection_cap),
        }
    }

    /// The operation id the request runs under (see [`operation_source`](Self::operation_source)
    /// for where it came from).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let (_, a) = p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.operation_id().len(), 32); // a fresh local id: 128 random bits
    /// # }
    /// ```
    pub fn operation_id(&self) -> &str {
        self.0.operation.id()
    }

    /// The operation the request's scopes share (id, priority, generation, egress defaults).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let (scope, a) = p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(scope.operation(), Some(a.operation()));
    /// # }
    /// ```
    pub fn operation(&self) -> &Operation {
        &self.0.operation
    }

    /// The operation id the caller sent (`op`), kept for audit even when the caller's id is
    /// not used.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let incoming = Incoming::new().service_budget(b"v=1, rem=10, op=theirs");
    /// let (_, a) = p.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.caller_operation_id(), Some("theirs"));
    /// assert_ne!(a.operation_id(), "theirs"); // not accepted: a local id
    /// # }
    /// ```
    pub fn caller_operation_id(&self) -> Option<&str> {
        self.0.caller.as_ref().and_then(ServiceBudget::operation_id)
    }

    /// The caller's `service-budget` header as it was sent (`rem`, `op`, `gen`, `prio`, `dl`),
    /// whether or not the policy believed its claims; `None` if the caller sent none, or sent
    /// one that was malformed or on more than one line (whose claims count for nothing).
    ///
    /// The raw header is gone from the request the handler sees: this is where its values
    /// are.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let incoming = Incoming::new().service_budget(b"v=1, rem=86400000, prio=0, gen=7");
    /// let (_, a) = p.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// let sent = a.caller_budget().unwrap();
    /// assert_eq!((sent.priority(), sent.generation()), (Some(0), 7));
    /// assert_eq!((a.priority(), a.generation()), (3, 0)); // neither was believed
    /// # }
    /// ```
    pub fn caller_budget(&self) -> Option<&ServiceBudget> {
        self.0.caller.as_ref()
    }

    /// The caller's `grpc-timeout` (the shortest valid line), whether or not it decided the
    /// budget.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let incoming = Incoming::new().grpc_timeout(b"5S");
    /// let (_, a) = p.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.grpc_timeout(), Some(Duration::from_secs(5)));
    /// # }
    /// ```
    pub fn grpc_timeout(&self) -> Option<Duration> {
        self.0.grpc_timeout
    }

    /// Envoy's `x-envoy-expected-rq-timeout-ms` (the shortest valid line), kept for audit
    /// also where the policy does not read it (then it decided nothing).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{BudgetSource, EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let incoming = Incoming::new().envoy_expected_timeout(b"300");
    /// let (_, a) = p.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.envoy_timeout(), Some(Duration::from_millis(300)));
    /// assert_eq!(a.budget_source(), BudgetSource::Default); // not read
    /// # }
    /// ```
    pub fn envoy_timeout(&self) -> Option<Duration> {
        self.0.envoy_timeout
    }

    /// The endpoint policy's version.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).version(2).build();
    /// let (_, a) = p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.policy_version(), 2);
    /// # }
    /// ```
    pub fn policy_version(&self) -> u32 {
        self.0.policy_version
    }

    /// The policy version the caller's `service-budget` named (its `pv`), if it sent a valid
    /// one, believed or not: the version of the hop upstream that admitted the operation.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).version(3).build();
    /// let incoming = Incoming::new().service_budget(b"v=1, rem=10, pv=9");
    /// let (_, a) = p.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// assert_eq!((a.caller_policy_version(), a.policy_version()), (Some(9), 3));
    /// # }
    /// ```
    pub fn caller_policy_version(&self) -> Option<u32> {
        self.0
            .caller
            .as_ref()
            .and_then(ServiceBudget::policy_version)
    }

    /// The `service-budget` format version the caller sent, if it sent a valid one.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let incoming = Incoming::new().service_budget(b"v=1, rem=10");
    /// let (_, a) = p.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.header_version(), Some(1));
    /// # }
    /// ```
    pub fn header_version(&self) -> Option<u32> {
        self.0.caller.as_ref().map(ServiceBudget::version)
    }

    /// When the request arrived (as given to
    /// [`EndpointPolicy::admit`](crate::wire::EndpointPolicy::admit)).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let at = tokio::time::Instant::now();
    /// let (_, a) = p.admit(Incoming::new(), at).unwrap();
    /// assert_eq!(a.ingress(), at);
    /// # }
    /// ```
    pub fn ingress(&self) -> Instant {
        self.0.ingress
    }

    /// When it was admitted.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let (_, a) = p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert!(a.admitted_at() >= a.ingress());
    /// # }
    /// ```
    pub fn admitted_at(&self) -> Instant {
        self.0.admitted_at
    }

    /// How long the request waited between ingress and admission.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let (_, a) = p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.queued(), Duration::ZERO);
    /// # }
    /// ```
    pub fn queued(&self) -> Duration {
        self.0.admitted_at.saturating_duration_since(self.0.ingress)
    }

    /// The root scope's deadline (monotonic).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let (s, a) = p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(s.deadline(), Some(a.deadline()));
    /// # }
    /// ```
    pub fn deadline(&self) -> Instant {
        self.0.deadline
    }

    /// The deadline on the wall clock, for logs and audits only (never for budget arithmetic).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::{Duration, SystemTime};
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let (_, a) = p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert!(a.audit_deadline() > SystemTime::UNIX_EPOCH);
    /// # }
    /// ```
    pub fn audit_deadline(&self) -> SystemTime {
        self.0.audit_deadline
    }

    /// The budget the handler was given: `min(declared, max) − queued − reserve`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let incoming = Incoming::new().grpc_timeout(b"99999999H");
    /// let (_, a) = p.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.initial_remaining(), Duration::from_secs(1));
    /// # }
    /// ```
    pub fn initial_remaining(&self) -> Duration {
        self.0.initial_remaining
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
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let incoming = Incoming::new().grpc_timeout(b"5S");
    /// let (_, a) = p.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.declared(), Some(Duration::from_secs(5)));
    /// assert!(a.was_clamped());
    /// # }
    /// ```
    pub fn declared(&self) -> Option<Duration> {
        self.0.declared
    }

    /// Whether the declared budget was over the policy's maximum and clamped to it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let (_, a) = p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert!(!a.was_clamped());
    /// # }
    /// ```
    pub fn was_clamped(&self) -> bool {
        self.0.clamped
    }

    /// Where the budget came from.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{BudgetSource, EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let incoming = Incoming::new().grpc_timeout(b"500m").service_budget(b"v=1, rem=400");
    /// let (_, a) = p.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.budget_source(), BudgetSource::ServiceBudget); // the shorter one
    /// # }
    /// ```
    pub fn budget_source(&self) -> BudgetSource {
        self.0.budget_source
    }

    /// The operation's cancel generation: the caller's `gen` where its operation was adopted
    /// (see [`operation_source`](Self::operation_source)), else 0, the start of a fresh local
    /// operation. This is what outgoing calls carry; a `gen` that was not adopted is in
    /// [`caller_budget`](Self::caller_budget) only.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, Trust};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .trust(Trust::Trusted)
    ///     .build();
    /// let incoming = Incoming::new().service_budget(b"v=1, rem=400, op=checkout-7, gen=2");
    /// let (_, a) = p.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.generation(), 2);
    /// # }
    /// ```
    pub fn generation(&self) -> u64 {
        self.0.operation.generation()
    }

    /// The request's priority (RFC 9218 urgency).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).priority(1).build();
    /// let (_, a) = p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.priority(), 1);
    /// # }
    /// ```
    pub fn priority(&self) -> u8 {
        self.0.operation.priority()
    }

    /// Where the priority came from.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, PrioritySource, Trust};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .trust(Trust::Trusted)
    ///     .build();
    /// let incoming = Incoming::new().service_budget(b"v=1, rem=400, prio=0");
    /// let (_, a) = p.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// assert_eq!((a.priority(), a.priority_source()), (0, PrioritySource::Caller));
    /// # }
    /// ```
    pub fn priority_source(&self) -> PrioritySource {
        self.0.priority_source
    }

    /// Where the operation id and generation came from.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, OperationSource};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .caller_operation(true)
    ///     .build();
    /// let incoming = Incoming::new().service_budget(b"v=1, rem=400, op=checkout-7");
    /// let (_, a) = p.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.operation_id(), "checkout-7");
    /// assert_eq!(a.operation_source(), OperationSource::Caller);
    /// # }
    /// ```
    pub fn operation_source(&self) -> OperationSource {
        self.0.operation_source
    }

    /// Whether the operation registry's term applied, and how (see [`RegistryTerm`]).
    ///
    /// # Examples
    ///
    /// See [`RegistryTerm`].
    pub fn registry(&self) -> RegistryTerm {
        self.0.registry
    }

    /// The operation's deadline by the registry, on this process's clock, when its term
    /// applied: the request's [`deadline`](Self::deadline) is never later.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use cancel_scope::registry::{InProcessRegistry, Operations};
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let policy = EndpointPolicy::builder(Duration::from_secs(2))
    ///     .default_budget(Duration::from_secs(1))
    ///     .build();
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// let (_, a) = policy.admit_joined(&ops, Incoming::new(), tokio::time::Instant::now()).await.unwrap();
    /// assert_eq!(a.operation_deadline(), Some(a.deadline()));
    /// # }
    /// ```
    pub fn operation_deadline(&self) -> Option<Instant> {
        self.0.operation_deadline
    }
}
