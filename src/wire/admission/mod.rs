//! Ingress admission: from the budget headers of an incoming request to its root scope.

mod error;
mod fields;
mod incoming;
mod join;
mod record;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::envoy;
use super::grpc_timeout;
use super::operation::Operation;
use super::policy::{EndpointPolicy, OnBadInput, OverCap};
use super::rejection_cap::RejectionCap;
use super::server::ServerScope;
use super::service_budget::{self, ServiceBudget};
use super::shadow::{Mode, Shadowed, WouldBe};
use super::stage::RequestClass;
use crate::budget::ChildBudget;
use crate::registry::OperationId;
use crate::telemetry;
use crate::time::deadline_after;
use crate::Scope;
use error::ErrorKind;
use incoming::Field;

pub use error::AdmissionError;
pub use incoming::Incoming;
pub use record::{Admission, BudgetSource, OperationSource, PrioritySource, RegistryTerm};

/// The budgets the caller declared, and what was wrong with them.
struct Declared {
    /// The shortest valid declared budget and where it came from.
    best: Option<(Duration, BudgetSource)>,
    /// The first bad header, if any.
    bad: Option<ErrorKind>,
}

impl Declared {
    /// Counts `field` (unless it is not `read`: then it decides nothing, and its shortest
    /// valid line is only returned, for audit).
    fn take<E>(
        &mut self,
        field: Field<E>,
        read: bool,
        source: BudgetSource,
        header: &'static str,
        kind: impl FnOnce(E) -> ErrorKind,
    ) -> Option<Duration> {
        if !read {
            return field.shortest;
        }
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
        field.shortest
    }
}

/// What the budget headers said: the budgets declared, and the values kept for audit.
struct Decoded {
    declared: Declared,
    /// The caller's `service-budget`, if it came on one line and was valid: only then do its
    /// claims (`op`, `gen`, `prio`) count (a smuggled second line must not pick them).
    caller: Option<ServiceBudget>,
    grpc_timeout: Option<Duration>,
    envoy_timeout: Option<Duration>,
}

fn decode(incoming: Incoming, policy: &EndpointPolicy) -> Decoded {
    let mut declared = Declared {
        best: None,
        bad: None,
    };
    let unambiguous = incoming.service_budget.lines == 1 && incoming.service_budget.error.is_none();
    let caller = incoming.caller.filter(|_| unambiguous);
    declared.take(
        incoming.service_budget,
        true,
        BudgetSource::ServiceBudget,
        service_budget::HEADER,
        ErrorKind::ServiceBudget,
    );
    let grpc_timeout = declared.take(
        incoming.grpc_timeout,
        true,
        BudgetSource::GrpcTimeout,
        grpc_timeout::HEADER,
        ErrorKind::GrpcTimeout,
    );
    // Envoy's header is only believed from behind an Envoy that sets it.
    let envoy_timeout = declared.take(
        incoming.envoy,
        policy.reads_envoy_timeout(),
        BudgetSource::Envoy,
        envoy::EXPECTED_RQ_TIMEOUT_MS,
        ErrorKind::Envoy,
    );
    Decoded {
        declared,
        caller,
        grpc_timeout,
        envoy_timeout,
    }
}

/// What admission decided before the registry (see [`EndpointPolicy::prepare`]).
pub(super) struct Prepared {
    now: Instant,
    ingress: Instant,
    /// The budget left by the headers and the endpoint's rules (already at least the
    /// minimum useful budget).
    pub(super) remaining: Duration,
    caller: Option<ServiceBudget>,
    grpc_timeout: Option<Duration>,
    envoy_timeout: Option<Duration>,
    asked: Option<Duration>,
    clamped: bool,
    budget_source: BudgetSource,
    priority: u8,
    priority_source: PrioritySource,
    /// In shadow mode: the enforcing decision, not enforced.
    shadow: Option<Shadowed>,
    /// The enforcing decision's refusal, if it refused (shadowed, enforced by a stage, or let
    /// through by the rejection cap).
    refusal: Option<AdmissionError>,
    /// The budget of a refusal the rejection cap lets through (see [`RejectionCap`]).
    overflow: Duration,
    /// The rejection cap the decision is yet to be counted in (once the operation is settled:
    /// a staged decision depends on it).
    cap: Option<RejectionCap>,
    /// What the request does (for staged enforcement).
    class: RequestClass,
}

/// The budget an admission decided on, and from what.
struct Decided {
    remaining: Duration,
    asked: Option<Duration>,
    clamped: bool,
    budget_source: BudgetSource,
}

impl Prepared {
    /// The operation id and generation the caller claims (whether or not they are
    /// believed), if it sent a valid id.
    pub(super) fn claimed(&self) -> Option<(OperationId, u64)> {
        let caller = self.caller.as_ref()?;
        let id = OperationId::new(caller.operation_id()?).ok()?;
        Some((id, caller.generation()))
    }

    /// The request's deadline by the headers and the endpoint's rules alone.
    pub(super) fn deadline(&self) -> Instant {
        deadline_after(self.now, self.remaining)
    }
}

/// The operation a request runs under, once settled (with or without the registry).
pub(super) struct Settled {
    pub(super) id: OperationId,
    pub(super) generation: u64,
    pub(super) source: OperationSource,
    /// The operation's deadline, when the registry's term applies.
    pub(super) deadline: Option<Instant>,
    pub(super) registry: RegistryTerm,
}

impl Settled {
    fn without_registry(id: OperationId, generation: u64, source: OperationSource) -> Settled {
        Settled {
            id,
            generation,
            source,
            deadline: None,
            registry: RegistryTerm::None,
        }
    }
}

/// Records an admission's decision (see [`telemetry`](crate::telemetry)): the budget by its
/// source, the queue wait, or the refusal by its reason.
pub(super) fn recorded(admitted: &Result<(Scope, Admission), AdmissionError>) {
    match admitted {
        Ok((_, admission)) => telemetry::admitted(&admission.telemetry()),
        Err(e) => telemetry::rejected(e.telemetry_reason(), e),
    }
}

/// A request's scope as a root, from the clock reading, the budget left, its name and its
/// operation.
pub(super) fn request_root(
    now: Instant,
    remaining: Duration,
    name: Arc<str>,
    operation: Arc<Operation>,
) -> Result<Scope, AdmissionError> {
    // The request's effect flag: what its answer says if the server stops it.
    let flag = crate::sync::Arc::new(crate::scope::EffectFlag::new());
    Ok(Scope::root_after(
        now,
        remaining,
        Some(name),
        Some(operation),
        Some(flag),
    ))
}

/// A request's scope as a child of `server`'s, as [`request_root`] makes a root.
pub(super) fn request_child_of(
    server: &ServerScope,
) -> impl FnOnce(Instant, Duration, Arc<str>, Arc<Operation>) -> Result<Scope, AdmissionError> + '_
{
    move |now, remaining, name, operation| {
        server
            .scope()
            .request_child_after(now, remaining, Some(name), Some(operation))
            .map_err(|_| AdmissionError::unavailable())
    }
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
    /// and (where the policy [reads it](crate::wire::EndpointPolicyBuilder::envoy_timeout)) Envoy's header. A
    /// caller can never get more than the policy's maximum nor more than it declared, whatever
    /// it sends. Its priority, operation id and generation count only where the policy
    /// accepts them ([`caller_priority`](crate::wire::EndpointPolicyBuilder::caller_priority),
    /// [`caller_operation`](crate::wire::EndpointPolicyBuilder::caller_operation); see
    /// [`Trust`](super::Trust)), and only from a `service-budget` header sent once and valid;
    /// the [`Admission`] records which source decided each value. The root scope is named
    /// after the operation id and carries the [`Operation`] (see [`Scope::operation`]).
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
    /// let policy = EndpointPolicy::builder(Duration::from_secs(2))
    ///     .default_budget(Duration::from_secs(1))
    ///     .build();
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
        self.admit_with(incoming, ingress, request_root)
    }

    /// [`admit`](Self::admit), with the request's scope a child of `server`'s: cancelled by
    /// its shutdown, waited for by it, and refused once it has begun (see [`ServerScope`]).
    /// The scope is in flight for the server while it has work (the handler run with
    /// [`Scope::run`], a task, a registered child): the server's shutdown waits for it then.
    ///
    /// # Errors
    ///
    /// Those of [`admit`](Self::admit), and [`AdmissionError::is_unavailable`]: the server's
    /// shutdown has begun (answer 503 / `UNAVAILABLE` with a `Retry-After`: nothing was done).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, as [`admit`](Self::admit).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, ServerScope};
    ///
    /// let server = ServerScope::new();
    /// let policy = EndpointPolicy::builder(Duration::from_secs(2))
    ///     .default_budget(Duration::from_secs(1))
    ///     .build();
    /// let (scope, _) = policy.admit_in(&server, Incoming::new(), Instant::now()).unwrap();
    /// assert_eq!(scope.remaining(), Some(Duration::from_secs(1)));
    /// drop(scope);
    /// let report = server.shutdown(Duration::from_secs(5)).await;
    /// assert_eq!(report.in_flight(), 0);
    /// let late = policy.admit_in(&server, Incoming::new(), Instant::now()).unwrap_err();
    /// assert!(late.is_unavailable());
    /// # }
    /// ```
    #[track_caller]
    pub fn admit_in(
        &self,
        server: &ServerScope,
        incoming: Incoming,
        ingress: Instant,
    ) -> Result<(Scope, Admission), AdmissionError> {
        self.admit_with(incoming, ingress, request_child_of(server))
    }

    /// Admission, with `scope` making the request's scope from the clock reading, the budget
    /// left, the scope's name and the request's operation; the decision is recorded (see
    /// [`telemetry`](crate::telemetry)).
    #[track_caller]
    fn admit_with(
        &self,
        incoming: Incoming,
        ingress: Instant,
        scope: impl FnOnce(Instant, Duration, Arc<str>, Arc<Operation>) -> Result<Scope, AdmissionError>,
    ) -> Result<(Scope, Admission), AdmissionError> {
        let admitted = match self.prepare(incoming, ingress) {
            Ok(prepared) => {
                let settled = self.unregistered(&prepared);
                self.settle(prepared, settled, scope)
            }
            Err(e) => Err(e),
        };
        recorded(&admitted);
        admitted
    }

    /// The part of admission before the registry: the budget headers decoded and checked,
    /// the budget left, the priority, the caller's claims. In shadow mode the budget left is
    /// the hard cap's, and the enforcing decision is kept beside it.
    pub(super) fn prepare(
        &self,
        mut incoming: Incoming,
        ingress: Instant,
    ) -> Result<Prepared, AdmissionError> {
        let now = Instant::now();
        let class = incoming.class;
        let mut cap = incoming.cap.take();
        let Decoded {
            mut declared,
            caller,
            grpc_timeout,
            envoy_timeout,
        } = decode(incoming, self);
        let queued = now.saturating_duration_since(ingress);
        let mut refusal = None;
        let mut overflow = Duration::ZERO;
        let (decided, shadow) = match self.enforcement() {
            Mode::Enforce if !self.is_staged() => match self.decide(&mut declared, queued) {
                Ok(decided) => {
                    if let Some(cap) = cap.take() {
                        cap.admitted(now);
                    }
                    (decided, None)
                }
                Err(e) => {
                    let Some(cap) = cap.take() else {
                        return Err(e);
                    };
                    let decided = self.let_through(&declared, queued);
                    if cap.refuse(now, decided.remaining.is_zero()) {
                        return Err(e);
                    }
                    let shadow = Shadowed::over_rejection_cap(now, &e);
                    refusal = Some(e);
                    (decided, Some(shadow))
                }
            },
            // Shadow mode, or staged enforcement that may shadow this request (decided once
            // its operation is settled).
            _ => {
                let heard = declared.best;
                // The would-be decision also counts what the caller would have had.
                if let Some(wb) = caller.as_ref().and_then(ServiceBudget::would_be) {
                    if declared.best.is_none_or(|(b, _)| wb < b) {
                        declared.best = Some((wb, BudgetSource::ServiceBudget));
                    }
                }
                let would_be = self.decide(&mut declared, queued);
                // Enforced: the hard cap alone.
                let remaining = self.max_budget().saturating_sub(queued);
                ChildBudget::new()
                    .compute(Some(remaining))
                    .map_err(|e| AdmissionError {
                        kind: ErrorKind::Exhausted(e),
                    })?;
                let enforced = Decided {
                    remaining,
                    asked: heard.map(|(d, _)| d),
                    clamped: heard.is_some_and(|(d, _)| d > self.max_budget()),
                    budget_source: heard.map_or(BudgetSource::Default, |(_, s)| s),
                };
                let shadow = self.shadow_of(&would_be, now);
                if would_be.is_err() {
                    overflow = self.let_through(&declared, queued).remaining;
                }
                refusal = would_be.err();
                (enforced, Some(shadow))
            }
        };
        let (priority, priority_source) = self.priority_of(caller.as_ref());
        Ok(Prepared {
            now,
            ingress,
            remaining: decided.remaining,
            caller,
            grpc_timeout,
            envoy_timeout,
            asked: decided.asked,
            clamped: decided.clamped,
            budget_source: decided.budget_source,
            priority,
            priority_source,
            shadow,
            refusal,
            overflow,
            cap,
            class,
        })
    }

    /// The budget of a refusal that the rejection cap lets through:
    /// `min(declared or default, default, maximum − queued)` (the queue and the reserve are not
    /// taken off the declared budget: that is what refused it).
    fn let_through(&self, declared: &Declared, queued: Duration) -> Decided {
        let asked = declared.best.map(|(d, _)| d);
        let default = self.default_budget();
        let remaining = asked
            .map_or(default, |d| d.min(default))
            .min(self.max_budget().saturating_sub(queued));
        Decided {
            remaining,
            asked,
            clamped: asked.is_some_and(|d| d > self.max_budget()),
            budget_source: declared.best.map_or(BudgetSource::Default, |(_, s)| s),
        }
    }

    /// The enforcing decision on the declared budgets: bad input, the maximum, the queue, the
    /// reserve, the minimum useful budget.
    fn decide(&self, declared: &mut Declared, queued: Duration) -> Result<Decided, AdmissionError> {
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
        let remaining = self.budget().admit(asked, queued);
        self.check_useful(remaining)?;
        Ok(Decided {
            remaining,
            asked,
            clamped,
            budget_source,
        })
    }

    /// What shadow mode records of the enforcing decision `would_be`, made at `now`.
    fn shadow_of(&self, would_be: &Result<Decided, AdmissionError>, now: Instant) -> Shadowed {
        match would_be {
            Ok(d) => Shadowed {
                over_rejection_cap: false,
                would_be_deadline: Some(deadline_after(now, d.remaining)),
                decisions: d
                    .clamped
                    .then(|| {
                        WouldBe::clamped(
                            now,
                            format!(
                                "declared {:?}, over the maximum {:?}",
                                d.asked.unwrap_or_default(),
                                self.max_budget()
                            ),
                        )
                    })
                    .into_iter()
                    .collect(),
            },
            Err(e) => Shadowed {
                would_be_deadline: None,
                decisions: vec![WouldBe::refused(now, e.to_string())],
                over_rejection_cap: false,
            },
        }
    }

    /// Refuses a budget below the minimum useful one: the same rule as every child budget.
    pub(super) fn check_useful(&self, remaining: Duration) -> Result<(), AdmissionError> {
        ChildBudget::new()
            .min_useful(self.min_useful_budget())
            .compute(Some(remaining))
            .map(|_| ())
            .map_err(|e| AdmissionError {
                kind: ErrorKind::Exhausted(e),
            })
    }

    /// The operation of a request admitted without a registry: the caller's, where the
    /// policy accepts it, else a fresh one.
    fn unregistered(&self, prepared: &Prepared) -> Settled {
        match prepared
            .claimed()
            .filter(|_| self.accepts_caller_operation())
        {
            Some((id, generation)) => {
                Settled::without_registry(id, generation, OperationSource::Caller)
            }
            // A fresh operation starts from generation 0: a caller's `gen` that is not
            // adopted is never used, and so never forwarded.
            None => Settled::without_registry(OperationId::random(), 0, OperationSource::Local),
        }
    }

    /// The rest of admission once the operation is settled: the request's scope and its
    /// record.
    #[track_caller]
    pub(super) fn settle(
        &self,
        mut prepared: Prepared,
        settled: Settled,
        scope: impl FnOnce(Instant, Duration, Arc<str>, Arc<Operation>) -> Result<Scope, AdmissionError>,
    ) -> Result<(Scope, Admission), AdmissionError> {
        let now = prepared.now;
        let mut shadow = prepared.shadow.take();
        let cap = prepared.cap.take();
        // Staged enforcement: by the request's class and its operation's bucket.
        if self.is_staged() && self.enforces(prepared.class, settled.id.as_str()) {
            if let Some(refused) = prepared.refusal.take() {
                // Beyond the rejection cap, the refusal runs as a shadow decision.
                let Some(cap) = cap else {
                    return Err(refused);
                };
                if cap.refuse(now, prepared.overflow.is_zero()) {
                    return Err(refused);
                }
                prepared.remaining = prepared.overflow;
                shadow = Some(Shadowed::over_rejection_cap(now, &refused));
                prepared.refusal = Some(refused);
            } else {
                if let Some(cap) = cap {
                    cap.admitted(now);
                }
                if let Some(d) = shadow.take().and_then(|s| s.would_be_deadline) {
                    prepared.remaining = d.saturating_duration_since(now);
                }
            }
        } else if let Some(cap) = cap {
            // Shadowed: admitted, whatever it would have been.
            cap.admitted(now);
        }
        if let (Some(s), Some(refused)) = (&shadow, &prepared.refusal) {
            telemetry::shadow_rejected(refused.telemetry_reason());
            if s.over_rejection_cap {
                telemetry::rejection_capped(refused.telemetry_reason());
            }
        }
        if let (Some(s), Some(d)) = (&mut shadow, settled.deadline) {
            // The registry's term is enforced; the would-be deadline is within it too.
            s.would_be_deadline = s.would_be_deadline.map(|w| w.min(d));
        }
        // The registry's term: what the operation has left, on this process's clock.
        let remaining = settled.deadline.map_or(prepared.remaining, |d| {
            prepared.remaining.min(d.saturating_duration_since(now))
        });
        let deadline = deadline_after(now, remaining);
        // Time spent asking the registry counts as queued: admitted now.
        let admitted_at = match settled.registry {
            RegistryTerm::None => now,
            _ => Instant::now().max(now),
        };
        let left = deadline.saturating_duration_since(admitted_at);
        let over_cap = shadow.as_ref().is_some_and(|s| s.over_rejection_cap);
        if settled.registry != RegistryTerm::None {
            // The registry may have shortened it, and its answer took time. A refusal the
            // rejection cap let through was below the minimum already: it is refused only if
            // the registry's term shortened it, or nothing is left.
            let shortened = settled
                .deadline
                .is_some_and(|d| d < deadline_after(now, prepared.remaining));
            if !over_cap || shortened {
                self.check_useful(left)?;
            } else if left.is_zero() {
                ChildBudget::new()
                    .compute(Some(left))
                    .map_err(|e| AdmissionError {
                        kind: ErrorKind::Exhausted(e),
                    })?;
            }
        }
        let operation = Arc::new(
            Operation::new(
                settled.id.as_shared().clone(),
                prepared.priority,
                settled.generation,
                *self.egress(),
            )
            .admitted_under(self.policy_version())
            .would_be(shadow.as_ref().map(|s| s.would_be_deadline)),
        );
        let context: Arc<Operation> = operation.clone();
        let scope = scope(now, remaining, operation.id_arc().clone(), context)?;
        scope.note_policy_version(self.policy_version());
        for decision in shadow.iter().flat_map(|s| &s.decisions) {
            scope.note_would_be(decision.clone());
        }
        let admission = Admission(Arc::new(fields::Admission {
            operation,
            caller: prepared.caller,
            grpc_timeout: prepared.grpc_timeout,
            envoy_timeout: prepared.envoy_timeout,
            policy_version: self.policy_version(),
            ingress: prepared.ingress,
            admitted_at,
            deadline,
            audit_deadline: SystemTime::now()
                .checked_add(left)
                .unwrap_or_else(SystemTime::now),
            initial_remaining: left,
            declared: prepared.asked,
            clamped: prepared.clamped,
            budget_source: prepared.budget_source,
            priority_source: prepared.priority_source,
            operation_source: settled.source,
            registry: settled.registry,
            operation_deadline: settled.deadline,
            shadow: shadow.map(Arc::new),
        }));
        Ok((scope, admission))
    }

    /// The priority of a request whose `service-budget` (if one counts) is `caller`.
    fn priority_of(&self, caller: Option<&ServiceBudget>) -> (u8, PrioritySource) {
        match caller.and_then(ServiceBudget::priority) {
            Some(p) if self.accepts_caller_priority() => (p, PrioritySource::Caller),
            // Otherwise a caller may ask for less urgency (a larger number), never more.
            Some(p) if p > self.policy_priority() => (p, PrioritySource::Caller),
            _ => (self.policy_priority(), PrioritySource::Policy),
        }
    }
}
