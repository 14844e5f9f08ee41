//! An endpoint's rules for the budgets its callers declare.

use std::time::Duration;

use super::egress::EgressPolicy;
use super::service_budget::MAX_PRIORITY;
use super::shadow::Mode;
use super::stage::Stage;
use crate::budget::EndpointBudget;

mod rollout;

/// Presets for how far an endpoint believes its callers: all of the policy's trust settings at
/// once.
///
/// Trust is several decisions, each a setting of [`EndpointPolicy`] of its own; the presets set
/// them all:
///
/// | setting | [`Untrusted`](Trust::Untrusted) (default) | [`Trusted`](Trust::Trusted) |
/// |---|---|---|
/// | [`envoy_timeout`](EndpointPolicy::envoy_timeout): `x-envoy-expected-rq-timeout-ms` | ignored | read, like the other budget headers |
/// | [`caller_priority`](EndpointPolicy::caller_priority): `prio` | the policy's; a caller may only ask for *less* urgency | the caller's, else the policy's |
/// | [`caller_operation`](EndpointPolicy::caller_operation): `op` and `gen` | a fresh local id, generation 0 (the caller's are kept for audit) | the caller's, if it sends an `op` |
/// | [`error_detail`](EndpointPolicy::error_detail): refusal and error texts | one fixed text per kind | the detail (values, header, cause) |
///
/// Neither can extend a budget past the endpoint's maximum, and the raw budget headers never
/// reach the handler (see [`Incoming`](super::Incoming)). An edge behind Envoy starts from
/// `Untrusted` and reads Envoy's timeout, without letting its clients pick their priority or
/// operation id:
///
/// # Examples
///
/// ```
/// use cancel_scope::wire::{EndpointPolicy, Trust};
/// use std::time::Duration;
/// let edge = EndpointPolicy::new(Duration::from_secs(2), Duration::from_secs(1))
///     .trust(Trust::Untrusted)
///     .envoy_timeout(true);
/// assert!(edge.reads_envoy_timeout());
/// assert!(!edge.accepts_caller_priority() && !edge.accepts_caller_operation());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Trust {
    /// Callers across a boundary (the public edge): their headers can only shorten the budget
    /// and lower the priority; refusals tell them the kind, not the detail.
    #[default]
    Untrusted,
    /// Our own services, or a proxy that sets the headers itself.
    Trusted,
}

/// Which of a caller's claims the policy believes (see [`Trust`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Believed {
    envoy_timeout: bool,
    priority: bool,
    operation: bool,
    detail: bool,
}

impl Believed {
    const fn preset(trust: Trust) -> Self {
        let all = matches!(trust, Trust::Trusted);
        Believed {
            envoy_timeout: all,
            priority: all,
            operation: all,
            detail: all,
        }
    }
}

/// What admission does with a budget header it cannot decode (garbage, unknown version,
/// negative, duplicated).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::wire::OnBadInput;
/// let lenient = OnBadInput::Fallback(Duration::from_millis(200));
/// assert_ne!(lenient, OnBadInput::Reject);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OnBadInput {
    /// Refuse the request with a typed error (HTTP 400 / gRPC `INVALID_ARGUMENT`).
    #[default]
    Reject,
    /// Admit it with this budget, or the endpoint's default if that is smaller; the bad
    /// header is ignored (any valid header that is shorter still wins).
    Fallback(Duration),
}

/// What admission does with a budget that is longer than the endpoint's maximum.
///
/// # Examples
///
/// ```
/// use cancel_scope::wire::OverCap;
/// assert_eq!(OverCap::default(), OverCap::Clamp);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OverCap {
    /// Admit it with the maximum (gRPC clients commonly send long default deadlines).
    #[default]
    Clamp,
    /// Refuse the request with a typed error.
    Reject,
}

/// The priority the policy gives when a caller says nothing: `3`, RFC 9218's default
/// urgency.
const DEFAULT_PRIORITY: u8 = 3;

/// An endpoint's budget rules: the maximum a caller can get, the default when it declares
/// none, the endpoint's own reserve, the defaults for its outgoing calls, which of a caller's
/// claims are believed (see [`Trust`]), what to do with bad or over-long headers, a version for
/// audits and a priority.
///
/// Admission ([`EndpointPolicy::admit`]) computes
///
/// ```text
/// remaining = min(declared or default, max) − time already queued − reserve
/// ```
///
/// with [`EndpointBudget`], so a caller can shorten its budget but never lengthen it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::wire::{EndpointPolicy, OnBadInput, Trust};
///
/// let ms = Duration::from_millis;
/// let policy = EndpointPolicy::new(ms(2000), ms(1000))
///     .reserve(ms(50))
///     .transport_pad(ms(5))
///     .min_useful(ms(20))
///     .trust(Trust::Untrusted)
///     .on_bad_input(OnBadInput::Fallback(ms(300)))
///     .version(7)
///     .priority(4);
/// assert_eq!(policy.max_budget(), ms(2000));
/// assert_eq!(policy.default_budget(), ms(1000));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(try_from = "super::PolicyConfig")
)]
pub struct EndpointPolicy {
    budget: EndpointBudget,
    egress: EgressPolicy,
    believed: Believed,
    on_bad_input: OnBadInput,
    over_cap: OverCap,
    version: u32,
    priority: u8,
    mode: Mode,
    stage: Stage,
    percent: u8,
    /// The rejection cap's settings for a layer's own window: percent, window.
    rejection: Option<(u8, Duration)>,
}

impl EndpointPolicy {
    /// A policy with a maximum and a default for callers that declare nothing (clamped to the
    /// maximum); untrusted callers, bad input rejected, over-long budgets clamped, version 0,
    /// priority 3.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(9));
    /// assert_eq!(p.default_budget(), Duration::from_secs(1));
    /// ```
    pub const fn new(max: Duration, default: Duration) -> Self {
        EndpointPolicy {
            budget: EndpointBudget::new(max, default),
            egress: EgressPolicy::new(),
            believed: Believed::preset(Trust::Untrusted),
            on_bad_input: OnBadInput::Reject,
            over_cap: OverCap::Clamp,
            version: 0,
            priority: DEFAULT_PRIORITY,
            mode: Mode::Enforce,
            stage: Stage::All,
            percent: 100,
            rejection: None,
        }
    }

    /// Time the endpoint keeps for its own response; the handler's scope ends this much before
    /// the caller's budget.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1))
    ///     .reserve(Duration::from_millis(10));
    /// assert_eq!(p.reserve_budget(), Duration::from_millis(10));
    /// ```
    pub const fn reserve(mut self, reserve: Duration) -> Self {
        self.budget = self.budget.reserve(reserve);
        self
    }

    /// The transport pad of outgoing calls made while serving this endpoint (see
    /// [`EgressPolicy::transport_pad`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1))
    ///     .transport_pad(Duration::from_millis(5));
    /// assert_eq!(p.egress().transport_pad_budget(), Duration::from_millis(5));
    /// ```
    pub const fn transport_pad(mut self, pad: Duration) -> Self {
        self.egress = self.egress.transport_pad(pad);
        self
    }

    /// The minimum useful budget: a request admitted with less is refused (it would only time
    /// out), and so is an outgoing call that would tell its callee less.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1))
    ///     .min_useful(Duration::from_millis(20));
    /// assert_eq!(p.min_useful_budget(), Duration::from_millis(20));
    /// ```
    pub const fn min_useful(mut self, min_useful: Duration) -> Self {
        self.egress = self.egress.min_useful(min_useful);
        self
    }

    /// Sets every trust setting to a preset (see [`Trust`]); a setting made after this one
    /// changes that setting only.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Trust};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1))
    ///     .trust(Trust::Trusted);
    /// assert!(p.reads_envoy_timeout() && p.accepts_caller_priority());
    /// assert!(p.accepts_caller_operation() && p.shows_error_detail());
    /// ```
    pub const fn trust(mut self, trust: Trust) -> Self {
        self.believed = Believed::preset(trust);
        self
    }

    /// Whether Envoy's `x-envoy-expected-rq-timeout-ms` is read, like the other budget headers
    /// (the shortest wins, a malformed one is bad input). Turn it on only behind an Envoy that
    /// sets the header itself: from anyone else it is just a number a client chose (which can
    /// only shorten the budget, but can also fail the request as bad input).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1))
    ///     .envoy_timeout(true);
    /// assert!(p.reads_envoy_timeout());
    /// ```
    pub const fn envoy_timeout(mut self, read: bool) -> Self {
        self.believed.envoy_timeout = read;
        self
    }

    /// Whether a caller's `prio` is taken as it is. If not, the request gets the policy's
    /// [`priority`](Self::priority), unless the caller asks for less urgency (a larger number),
    /// which is always granted.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1))
    ///     .caller_priority(true);
    /// assert!(p.accepts_caller_priority());
    /// ```
    pub const fn caller_priority(mut self, accept: bool) -> Self {
        self.believed.priority = accept;
        self
    }

    /// Whether a caller's operation (its `op` id and the `gen` that goes with it) is adopted.
    /// If not, or if the caller sends no `op`, the request runs under a fresh local operation
    /// id with generation 0, and the caller's values are kept for audit only (in the
    /// [`Admission`](super::Admission)): they are never forwarded downstream.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1))
    ///     .caller_operation(true);
    /// assert!(p.accepts_caller_operation());
    /// ```
    pub const fn caller_operation(mut self, accept: bool) -> Self {
        self.believed.operation = accept;
        self
    }

    /// Whether refusals and the layer's own error answers tell the caller the detail (which
    /// header, which values, the cancel's cause and reason). If not, each kind of answer has
    /// one fixed text (`invalid budget header`, `budget exceeds the endpoint's maximum`,
    /// `budget exhausted`, `deadline exceeded`, ...), without numbers or internal reasons; the
    /// detail goes to the logs and reports.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1))
    ///     .error_detail(true);
    /// assert!(p.shows_error_detail());
    /// ```
    pub const fn error_detail(mut self, show: bool) -> Self {
        self.believed.detail = show;
        self
    }

    /// What to do with a budget header that cannot be decoded (see [`OnBadInput`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, OnBadInput};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1))
    ///     .on_bad_input(OnBadInput::Fallback(Duration::from_millis(100)));
    /// assert_eq!(p.bad_input(), OnBadInput::Fallback(Duration::from_millis(100)));
    /// ```
    pub const fn on_bad_input(mut self, on_bad_input: OnBadInput) -> Self {
        self.on_bad_input = on_bad_input;
        self
    }

    /// What to do with a budget longer than the maximum (see [`OverCap`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, OverCap};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1))
    ///     .over_cap(OverCap::Reject);
    /// assert_eq!(p.over_cap_rule(), OverCap::Reject);
    /// ```
    pub const fn over_cap(mut self, over_cap: OverCap) -> Self {
        self.over_cap = over_cap;
        self
    }

    /// The policy's version, recorded in every [`Admission`](super::Admission) for audits.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1)).version(3);
    /// assert_eq!(p.policy_version(), 3);
    /// ```
    pub const fn version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    /// The priority this endpoint gives its requests (RFC 9218 urgency, `0` most urgent to `7`
    /// least; larger values are taken as `7`).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1)).priority(9);
    /// assert_eq!(p.policy_priority(), 7);
    /// ```
    pub const fn priority(mut self, priority: u8) -> Self {
        self.priority = if priority > MAX_PRIORITY {
            MAX_PRIORITY
        } else {
            priority
        };
        self
    }

    /// This policy with its maximum (the hard cap) lowered to `cap`, if `cap` is smaller; the
    /// default follows it down. Never raises anything.
    #[cfg_attr(not(feature = "rollout"), allow(dead_code))]
    pub(crate) const fn capped_at(mut self, cap: Duration) -> Self {
        if cap.as_nanos() < self.max_budget().as_nanos() {
            let reserve = self.reserve_budget();
            self.budget = EndpointBudget::new(cap, self.default_budget()).reserve(reserve);
        }
        self
    }

    /// The budget arithmetic of this policy.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(2), Duration::from_secs(1));
    /// assert_eq!(p.budget().clamp(Some(Duration::from_secs(5))), Duration::from_secs(2));
    /// ```
    pub const fn budget(&self) -> &EndpointBudget {
        &self.budget
    }

    /// The defaults of outgoing calls made while serving this endpoint.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EgressPolicy, EndpointPolicy};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
    /// assert_eq!(*p.egress(), EgressPolicy::new());
    /// ```
    pub const fn egress(&self) -> &EgressPolicy {
        &self.egress
    }

    /// The maximum any caller can get.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(2), Duration::from_secs(1));
    /// assert_eq!(p.max_budget(), Duration::from_secs(2));
    /// ```
    pub const fn max_budget(&self) -> Duration {
        self.budget.max()
    }

    /// The budget of a caller that declares none.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(2), Duration::from_secs(1));
    /// assert_eq!(p.default_budget(), Duration::from_secs(1));
    /// ```
    pub const fn default_budget(&self) -> Duration {
        self.budget.default_budget()
    }

    /// The endpoint's reserve.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(2), Duration::from_secs(1));
    /// assert!(p.reserve_budget().is_zero());
    /// ```
    pub const fn reserve_budget(&self) -> Duration {
        self.budget.reserve_budget()
    }

    /// The minimum useful budget.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(2), Duration::from_secs(1));
    /// assert!(p.min_useful_budget().is_zero());
    /// ```
    pub const fn min_useful_budget(&self) -> Duration {
        self.egress.min_useful_budget()
    }

    /// Whether Envoy's timeout header is read (see [`envoy_timeout`](Self::envoy_timeout)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(2), Duration::from_secs(1));
    /// assert!(!p.reads_envoy_timeout());
    /// ```
    pub const fn reads_envoy_timeout(&self) -> bool {
        self.believed.envoy_timeout
    }

    /// Whether a caller's priority is taken as it is (see
    /// [`caller_priority`](Self::caller_priority)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(2), Duration::from_secs(1));
    /// assert!(!p.accepts_caller_priority());
    /// ```
    pub const fn accepts_caller_priority(&self) -> bool {
        self.believed.priority
    }

    /// Whether a caller's operation id and generation are adopted (see
    /// [`caller_operation`](Self::caller_operation)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(2), Duration::from_secs(1));
    /// assert!(!p.accepts_caller_operation());
    /// ```
    pub const fn accepts_caller_operation(&self) -> bool {
        self.believed.operation
    }

    /// Whether refusals and error answers carry the detail (see
    /// [`error_detail`](Self::error_detail)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(2), Duration::from_secs(1));
    /// assert!(!p.shows_error_detail());
    /// ```
    pub const fn shows_error_detail(&self) -> bool {
        self.believed.detail
    }

    /// The bad-input rule.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, OnBadInput};
    /// let p = EndpointPolicy::new(Duration::from_secs(2), Duration::from_secs(1));
    /// assert_eq!(p.bad_input(), OnBadInput::Reject);
    /// ```
    pub const fn bad_input(&self) -> OnBadInput {
        self.on_bad_input
    }

    /// The over-cap rule.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, OverCap};
    /// let p = EndpointPolicy::new(Duration::from_secs(2), Duration::from_secs(1));
    /// assert_eq!(p.over_cap_rule(), OverCap::Clamp);
    /// ```
    pub const fn over_cap_rule(&self) -> OverCap {
        self.over_cap
    }

    /// The policy's version.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(2), Duration::from_secs(1));
    /// assert_eq!(p.policy_version(), 0);
    /// ```
    pub const fn policy_version(&self) -> u32 {
        self.version
    }

    /// The policy's priority.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(2), Duration::from_secs(1));
    /// assert_eq!(p.policy_priority(), 3);
    /// ```
    pub const fn policy_priority(&self) -> u8 {
        self.priority
    }
}
