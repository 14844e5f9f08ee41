//! Egress: the budget of an outgoing call, and the headers that carry it.
//!
//! An outgoing call gets a child scope of the caller's scope ([`EgressPolicy::call_scope`]),
//! cut by the usual rule `min(parent − reserve, cap)`. What the *callee* is told is a little
//! less than that, the transport pad ([`EgressPolicy::outgoing`]):
//!
//! ```text
//! outgoing remaining = call remaining − transport pad
//! ```
//!
//! so that the callee gives up (and answers) before the caller's own timer fires and the
//! answer is lost on the way back. If what is left is below the minimum useful budget (and in
//! any case below 1 ms, which `service-budget` would carry as a spent `rem=0`) the call fails
//! fast and nothing is sent: a request that is bound to time out only loads the dependency.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::grpc_timeout;
use super::service_budget::ServiceBudget;
use super::shadow::WouldBe;
use crate::budget::{ChildBudget, Rules};
use crate::error::Error;
use crate::{ChildBuilder, Scope};

/// How outgoing calls take their budget from the caller's scope: a reserve, a cap, a transport
/// pad and a minimum useful budget.
///
/// The default (everything zero, no cap) passes the caller's whole remaining budget on. An
/// admitted request carries its endpoint's transport pad and minimum useful budget
/// ([`Operation::egress`](super::Operation::egress)); [`EgressPolicy::for_scope`] picks those
/// up.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), cancel_scope::Error> {
/// use std::time::Duration;
/// use cancel_scope::{wire::EgressPolicy, Scope};
///
/// let ms = Duration::from_millis;
/// let request = Scope::with_timeout(ms(500));
/// let egress = EgressPolicy::builder()
///     .reserve(ms(50))
///     .transport_pad(ms(10))
///     .min_useful(ms(20))
///     .build();
///
/// let call = egress.call_scope(&request)?;   // the local timeout: 450 ms
/// assert_eq!(call.remaining(), Some(ms(450)));
/// let out = egress.outgoing(&call)?;         // what the callee is told: 440 ms
/// assert_eq!(out.remaining(), Some(ms(440)));
/// assert_eq!(out.grpc_timeout().as_deref(), Some("440000u"));
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    rules: Rules,
    pad: Duration,
}

/// Builds an [`EgressPolicy`] ([`EgressPolicy::builder`]): each setter sets its value, the
/// last call wins.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::wire::EgressPolicy;
/// let p = EgressPolicy::builder().reserve(Duration::from_millis(30)).build();
/// assert_eq!(p.reserve_budget(), Duration::from_millis(30));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct EgressPolicyBuilder {
    policy: EgressPolicy,
}

impl EgressPolicy {
    /// No reserve, no cap, no pad, no minimum: the callee is told all that is left.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::EgressPolicy;
    /// assert_eq!(EgressPolicy::new(), EgressPolicy::default());
    /// ```
    pub const fn new() -> Self {
        EgressPolicy {
            rules: Rules::new(),
            pad: Duration::ZERO,
        }
    }

    /// A builder that starts from [`EgressPolicy::new`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EgressPolicy;
    /// let p = EgressPolicy::builder().cap(Duration::from_millis(300)).build();
    /// assert_eq!(p.cap_budget(), Some(Duration::from_millis(300)));
    /// ```
    pub const fn builder() -> EgressPolicyBuilder {
        EgressPolicy::new().to_builder()
    }

    /// A builder that starts from this policy: "this policy with one change".
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EgressPolicy;
    /// let p = EgressPolicy::builder().reserve(Duration::from_millis(30)).build();
    /// let q = p.to_builder().transport_pad(Duration::from_millis(5)).build();
    /// assert_eq!((q.reserve_budget(), q.transport_pad_budget()), (Duration::from_millis(30), Duration::from_millis(5)));
    /// ```
    pub const fn to_builder(&self) -> EgressPolicyBuilder {
        EgressPolicyBuilder { policy: *self }
    }

    /// The egress policy of calls made under `scope`: its operation's (set by admission), or
    /// the default.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{wire::EgressPolicy, Scope};
    /// assert_eq!(EgressPolicy::for_scope(&Scope::new()), EgressPolicy::new());
    /// ```
    pub fn for_scope(scope: &Scope) -> Self {
        scope.operation().map(|op| *op.egress()).unwrap_or_default()
    }

    /// This policy with its reserve set.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EgressPolicy;
    /// // Written with the builder:
    /// let p = EgressPolicy::builder().reserve(Duration::from_millis(30)).build();
    /// assert_eq!(p.reserve_budget(), Duration::from_millis(30));
    /// ```
    #[deprecated(since = "0.2.0", note = "use `EgressPolicy::builder().reserve(..)`")]
    pub const fn reserve(self, reserve: Duration) -> Self {
        self.to_builder().reserve(reserve).build()
    }

    /// This policy with its cap set.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EgressPolicy;
    /// // Written with the builder:
    /// let p = EgressPolicy::builder().cap(Duration::from_millis(300)).build();
    /// assert_eq!(p.cap_budget(), Some(Duration::from_millis(300)));
    /// ```
    #[deprecated(since = "0.2.0", note = "use `EgressPolicy::builder().cap(..)`")]
    pub const fn cap(self, cap: Duration) -> Self {
        self.to_builder().cap(cap).build()
    }

    /// This policy with its transport pad set.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EgressPolicy;
    /// // Written with the builder:
    /// let p = EgressPolicy::builder().transport_pad(Duration::from_millis(5)).build();
    /// assert_eq!(p.transport_pad_budget(), Duration::from_millis(5));
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `EgressPolicy::builder().transport_pad(..)`"
    )]
    pub const fn transport_pad(self, pad: Duration) -> Self {
        self.to_builder().transport_pad(pad).build()
    }

    /// This policy with its minimum useful budget set.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EgressPolicy;
    /// // Written with the builder:
    /// let p = EgressPolicy::builder().min_useful(Duration::from_millis(20)).build();
    /// assert_eq!(p.min_useful_budget(), Duration::from_millis(20));
    /// ```
    #[deprecated(since = "0.2.0", note = "use `EgressPolicy::builder().min_useful(..)`")]
    pub const fn min_useful(self, min_useful: Duration) -> Self {
        self.to_builder().min_useful(min_useful).build()
    }

    /// The reserve.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::EgressPolicy;
    /// assert!(EgressPolicy::new().reserve_budget().is_zero());
    /// ```
    pub const fn reserve_budget(&self) -> Duration {
        self.rules.reserve
    }

    /// The cap, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::EgressPolicy;
    /// assert_eq!(EgressPolicy::new().cap_budget(), None);
    /// ```
    pub const fn cap_budget(&self) -> Option<Duration> {
        self.rules.cap
    }

    /// The transport pad.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::EgressPolicy;
    /// assert!(EgressPolicy::new().transport_pad_budget().is_zero());
    /// ```
    pub const fn transport_pad_budget(&self) -> Duration {
        self.pad
    }

    /// The minimum useful outgoing budget.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::EgressPolicy;
    /// assert!(EgressPolicy::new().min_useful_budget().is_zero());
    /// ```
    pub const fn min_useful_budget(&self) -> Duration {
        self.rules.min_useful
    }

    /// The budget arithmetic of a call given what its parent has left: the call's own
    /// timeout, `min(parent − reserve, cap)`, refusing anything that would leave the callee
    /// less than the minimum useful budget after the pad.
    ///
    /// # Errors
    ///
    /// [`BudgetExhausted`](crate::budget::BudgetExhausted) when the call would be useless.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EgressPolicy;
    ///
    /// let ms = Duration::from_millis;
    /// let p = EgressPolicy::builder()
    ///     .reserve(ms(50))
    ///     .transport_pad(ms(10))
    ///     .min_useful(ms(20))
    ///     .build();
    /// assert_eq!(p.call_budget(Some(ms(500))).unwrap(), Some(ms(450)));
    /// assert!(p.call_budget(Some(ms(79))).is_err()); // 29 ms - 10 ms pad < 20 ms
    /// ```
    pub fn call_budget(
        &self,
        parent_remaining: Option<Duration>,
    ) -> Result<Option<Duration>, crate::budget::BudgetExhausted> {
        ChildBudget::new()
            .rules(self.call_rules())
            .compute(parent_remaining)
    }

    /// The rules of the call's child: the callee must be left `min_useful` after the pad.
    const fn call_rules(&self) -> Rules {
        let Rules {
            reserve,
            cap,
            min_useful,
        } = self.rules;
        let rules = Rules::new()
            .reserve(reserve)
            .min_useful(min_useful.saturating_add(self.pad));
        match cap {
            Some(c) => rules.cap(c),
            None => rules,
        }
    }

    /// Creates the child scope of one outgoing call: its deadline is the call's local
    /// timeout, `min(parent − reserve, cap)`.
    ///
    /// # Errors
    ///
    /// [`Error::is_budget_exhausted`] when the callee would get less than the minimum useful
    /// budget after the pad (nothing should be sent), [`Error::is_cancelled`] /
    /// [`Error::is_closed`] when `parent` accepts no new work.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime when the call tightens the deadline.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{wire::EgressPolicy, Scope};
    ///
    /// let ms = Duration::from_millis;
    /// let request = Scope::with_timeout(ms(40));
    /// let egress = EgressPolicy::builder().transport_pad(ms(10)).min_useful(ms(50)).build();
    /// assert!(egress.call_scope(&request).unwrap_err().is_budget_exhausted());
    /// # }
    /// ```
    #[track_caller]
    pub fn call_scope(&self, parent: &Scope) -> Result<Scope, Error> {
        self.call_child(parent).build()
    }

    /// The builder of [`call_scope`](Self::call_scope), for callers that bound the call
    /// further (a deadline of their own) before building it.
    pub(crate) fn call_child<'a>(&self, parent: &'a Scope) -> ChildBuilder<'a> {
        // The same arithmetic as `call_budget`, done by the child builder against its clock.
        let rules = self.call_rules();
        let child = parent
            .child()
            .reserve(rules.reserve)
            .min_useful(rules.min_useful);
        match rules.cap {
            Some(c) => child.cap(c),
            None => child,
        }
    }

    /// The budget headers of a call made in `call` (usually from
    /// [`call_scope`](Self::call_scope)): what it has left minus the transport pad.
    ///
    /// A scope without a deadline gives an [`Outgoing`] without a budget (no headers).
    ///
    /// # Errors
    ///
    /// [`Error::is_cancelled`] if `call` is cancelled; [`Error::is_budget_exhausted`] if less
    /// than the minimum useful budget, or less than 1 ms (what `service-budget` would carry as
    /// `rem=0`, a spent budget), is left after the pad. Either way: send nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), cancel_scope::Error> {
    /// use std::time::Duration;
    /// use cancel_scope::{wire::EgressPolicy, Scope};
    ///
    /// let ms = Duration::from_millis;
    /// let call = Scope::with_timeout(ms(100));
    /// let egress = EgressPolicy::builder().transport_pad(ms(10)).min_useful(ms(20)).build();
    /// let out = egress.outgoing(&call)?;
    /// let header = out.service_budget().unwrap().to_header_value();
    /// assert!(header.starts_with("v=1, rem=90, gen=0, dl="), "{header}");
    ///
    /// tokio::time::sleep(ms(75)).await; // 25 ms left, 15 ms after the pad
    /// assert!(egress.outgoing(&call).unwrap_err().is_budget_exhausted());
    /// # Ok(()) }
    /// ```
    pub fn outgoing(&self, call: &Scope) -> Result<Outgoing, Error> {
        if let Some(cause) = call.cause() {
            return Err(Error::cancelled(cause));
        }
        let Some(left) = call.remaining() else {
            return Ok(Outgoing {
                remaining: None,
                budget: None,
            });
        };
        // `service-budget` carries whole milliseconds, and a callee reads `rem=0` as a budget
        // already spent (it refuses the request): less than 1 ms is as useless as nothing.
        let remaining = ChildBudget::new()
            .reserve(self.pad)
            .min_useful(self.rules.min_useful.max(MIN_ON_THE_WIRE))
            .compute(Some(left))
            .map_err(Error::exhausted)?
            .unwrap_or(Duration::ZERO);
        let mut budget = service_budget(call, remaining);
        if let Some(would_be) = call.shadow_state() {
            budget = budget.with_would_be(self.would_be(call, would_be));
        }
        Ok(Outgoing {
            remaining: Some(remaining),
            budget: Some(budget),
        })
    }

    /// In shadow mode: what the call would be told if its request's policy enforced (its
    /// would-be deadline, `None` if admission would have refused it), noting a call that
    /// would not have been sent.
    fn would_be(&self, call: &Scope, deadline: Option<Instant>) -> Duration {
        let now = Instant::now();
        let left = deadline.map_or(Duration::ZERO, |d| d.saturating_duration_since(now));
        match ChildBudget::new()
            .reserve(self.pad)
            .min_useful(self.rules.min_useful.max(MIN_ON_THE_WIRE))
            .compute(Some(left))
        {
            Ok(wb) => wb.unwrap_or(Duration::ZERO),
            Err(e) => {
                crate::telemetry::shadow_call_refused();
                call.note_would_be(WouldBe::not_sent(
                    now,
                    format!("a would-be budget of {left:?} left: {e}"),
                ));
                Duration::ZERO
            }
        }
    }
}

impl EgressPolicyBuilder {
    /// Time the caller keeps for itself after the call returns.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EgressPolicy;
    /// let p = EgressPolicy::builder().reserve(Duration::from_millis(30)).build();
    /// assert_eq!(p.reserve_budget(), Duration::from_millis(30));
    /// ```
    pub const fn reserve(mut self, reserve: Duration) -> Self {
        self.policy.rules.reserve = reserve;
        self
    }

    /// The most this dependency may ever get.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EgressPolicy;
    /// let p = EgressPolicy::builder().cap(Duration::from_millis(300)).build();
    /// assert_eq!(p.cap_budget(), Some(Duration::from_millis(300)));
    /// ```
    pub const fn cap(mut self, cap: Duration) -> Self {
        self.policy.rules.cap = Some(cap);
        self
    }

    /// Time the request and its answer spend on the wire: the callee is told this much less
    /// than the call's own timeout.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EgressPolicy;
    /// let p = EgressPolicy::builder().transport_pad(Duration::from_millis(5)).build();
    /// assert_eq!(p.transport_pad_budget(), Duration::from_millis(5));
    /// ```
    pub const fn transport_pad(mut self, pad: Duration) -> Self {
        self.policy.pad = pad;
        self
    }

    /// Below this much outgoing budget the call is not made.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EgressPolicy;
    /// let p = EgressPolicy::builder().min_useful(Duration::from_millis(20)).build();
    /// assert_eq!(p.min_useful_budget(), Duration::from_millis(20));
    /// ```
    pub const fn min_useful(mut self, min_useful: Duration) -> Self {
        self.policy.rules.min_useful = min_useful;
        self
    }

    /// The reserve, cap and minimum useful budget at once: all three replaced by the rules'
    /// (as the setters here do, the last call wins; rules without a cap leave the calls
    /// uncapped). The transport pad is not one of them.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::{budget::Rules, wire::EgressPolicy};
    /// let ms = Duration::from_millis;
    /// let rules = Rules::new().reserve(ms(30)).cap(ms(300)).min_useful(ms(20));
    /// let p = EgressPolicy::builder().rules(rules).build();
    /// assert_eq!(p, EgressPolicy::builder()
    ///     .reserve(ms(30))
    ///     .cap(ms(300))
    ///     .min_useful(ms(20))
    ///     .build());
    /// ```
    pub const fn rules(mut self, rules: Rules) -> Self {
        self.policy.rules = rules;
        self
    }

    /// The policy.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::EgressPolicy;
    /// assert_eq!(EgressPolicy::builder().build(), EgressPolicy::new());
    /// ```
    pub const fn build(self) -> EgressPolicy {
        self.policy
    }
}

/// The least budget a callee can be told: `service-budget` counts whole milliseconds.
const MIN_ON_THE_WIRE: Duration = Duration::from_millis(1);

/// The `service-budget` header of a call with `remaining` left, made in `call`.
fn service_budget(call: &Scope, remaining: Duration) -> ServiceBudget {
    let mut b = ServiceBudget::new(remaining);
    if let Some(op) = call.operation() {
        // Every member below was validated when the operation was admitted; an error here
        // would only drop that member, never lengthen the budget.
        b = b.clone().with_operation_id(op.id()).unwrap_or(b);
        b = b.clone().with_priority(op.priority()).unwrap_or(b);
        b = b.clone().with_generation(op.generation()).unwrap_or(b);
        // Version 0 is a policy without one: nothing to tell the next hop.
        if op.policy_version() != 0 {
            b = b.with_policy_version(op.policy_version());
        }
    }
    // The budget the header carries (`rem` is capped at 24 h), not what the call has beyond it.
    let audit = SystemTime::now()
        .checked_add(b.remaining())
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .and_then(|d| u64::try_from(d.as_millis()).ok());
    if let Some(ms) = audit {
        b = b.clone().with_audit_deadline_unix_ms(ms).unwrap_or(b);
    }
    b
}

/// The budget of one outgoing call, ready to be written as `grpc-timeout` and
/// `service-budget` headers. Made by [`EgressPolicy::outgoing`].
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), cancel_scope::Error> {
/// use std::time::Duration;
/// use cancel_scope::{wire::EgressPolicy, Scope};
///
/// let out = EgressPolicy::new().outgoing(&Scope::with_timeout(Duration::from_secs(2)))?;
/// assert_eq!(out.grpc_timeout().as_deref(), Some("2000000u"));
/// assert_eq!(out.service_budget().unwrap().remaining(), Duration::from_secs(2));
///
/// // No deadline, no budget headers.
/// assert_eq!(EgressPolicy::new().outgoing(&Scope::new())?.remaining(), None);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    remaining: Option<Duration>,
    budget: Option<ServiceBudget>,
}

impl Outgoing {
    /// What the callee is told it has (`None`: the caller has no deadline).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), cancel_scope::Error> {
    /// use std::time::Duration;
    /// use cancel_scope::{wire::EgressPolicy, Scope};
    /// let out = EgressPolicy::new().outgoing(&Scope::with_timeout(Duration::from_secs(1)))?;
    /// assert_eq!(out.remaining(), Some(Duration::from_secs(1)));
    /// # Ok(()) }
    /// ```
    pub fn remaining(&self) -> Option<Duration> {
        self.remaining
    }

    /// The shortest budget the headers actually carry: `grpc-timeout` truncates
    /// [`remaining`](Self::remaining) to its unit (whole milliseconds from 100 s on, whole
    /// seconds from about 28 h on) and `service-budget` to whole milliseconds. A callee, or a
    /// transport that enforces `grpc-timeout` itself, may give up as soon as this has passed.
    #[cfg_attr(not(any(feature = "tower", feature = "reqwest")), allow(dead_code))]
    pub(crate) fn told(&self) -> Option<Duration> {
        let grpc = grpc_timeout::truncate(self.remaining?);
        Some(
            self.budget
                .as_ref()
                .map_or(grpc, |b| grpc.min(b.remaining())),
        )
    }

    /// The `grpc-timeout` header value ([`grpc_timeout::encode`] of
    /// [`remaining`](Self::remaining)).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), cancel_scope::Error> {
    /// use std::time::Duration;
    /// use cancel_scope::{wire::EgressPolicy, Scope};
    /// let out = EgressPolicy::new().outgoing(&Scope::with_timeout(Duration::from_millis(5)))?;
    /// assert_eq!(out.grpc_timeout().as_deref(), Some("5000000n"));
    /// # Ok(()) }
    /// ```
    pub fn grpc_timeout(&self) -> Option<String> {
        self.remaining.map(grpc_timeout::encode)
    }

    /// The `service-budget` header (remaining in whole milliseconds, rounded down, with the
    /// operation's id, priority and generation and an audit deadline).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), cancel_scope::Error> {
    /// use std::time::Duration;
    /// use cancel_scope::{wire::EgressPolicy, Scope};
    /// let out = EgressPolicy::new().outgoing(&Scope::with_timeout(Duration::from_micros(2500)))?;
    /// assert_eq!(out.service_budget().unwrap().remaining(), Duration::from_millis(2));
    /// # Ok(()) }
    /// ```
    pub fn service_budget(&self) -> Option<&ServiceBudget> {
        self.budget.as_ref()
    }
}
