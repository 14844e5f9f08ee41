//! [`EndpointPolicyBuilder`]: every setting of an [`EndpointPolicy`], set one by one.

use std::time::Duration;

use super::{Believed, MAX_PRIORITY};
use super::{EndpointPolicy, OnBadInput, OverCap, Trust};
use crate::wire::shadow::Mode;
use crate::wire::stage::Stage;

/// Builds an [`EndpointPolicy`] ([`EndpointPolicy::builder`] from a maximum,
/// [`EndpointPolicy::to_builder`] from a policy): a setter per setting, then
/// [`build`](Self::build). Every setter is `const`, so a policy can be a `const`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::wire::{EndpointPolicy, OnBadInput, Trust};
///
/// const MS: fn(u64) -> Duration = Duration::from_millis;
/// const POLICY: EndpointPolicy = EndpointPolicy::builder(Duration::from_secs(2))
///     .default_budget(Duration::from_secs(1))
///     .reserve(Duration::from_millis(50))
///     .trust(Trust::Untrusted)
///     .version(7)
///     .build();
/// assert_eq!(POLICY.default_budget(), MS(1000));
/// let lenient = POLICY.to_builder().on_bad_input(OnBadInput::Fallback(MS(300))).build();
/// assert_eq!(lenient.policy_version(), 7);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct EndpointPolicyBuilder {
    policy: EndpointPolicy,
}

impl EndpointPolicyBuilder {
    pub(super) const fn new(policy: EndpointPolicy) -> Self {
        EndpointPolicyBuilder { policy }
    }

    /// The budget of a caller that declares none (clamped to the maximum; unset, it is the
    /// maximum).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::builder(Duration::from_secs(2))
    ///     .default_budget(Duration::from_secs(1))
    ///     .build();
    /// assert_eq!(p.default_budget(), Duration::from_secs(1));
    /// ```
    pub const fn default_budget(mut self, default: Duration) -> Self {
        self.policy.budget = self
            .policy
            .budget
            .to_builder()
            .default_budget(default)
            .build();
        self
    }

    /// Time the endpoint keeps for its own response; the handler's scope ends this much before
    /// the caller's budget.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .reserve(Duration::from_millis(10))
    ///     .build();
    /// assert_eq!(p.reserve_budget(), Duration::from_millis(10));
    /// ```
    pub const fn reserve(mut self, reserve: Duration) -> Self {
        self.policy.budget = self.policy.budget.to_builder().reserve(reserve).build();
        self
    }

    /// The transport pad of outgoing calls made while serving this endpoint (see
    /// [`EgressPolicyBuilder::transport_pad`](crate::wire::EgressPolicyBuilder::transport_pad)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .transport_pad(Duration::from_millis(5))
    ///     .build();
    /// assert_eq!(p.egress().transport_pad_budget(), Duration::from_millis(5));
    /// ```
    pub const fn transport_pad(mut self, pad: Duration) -> Self {
        self.policy.egress = self.policy.egress.to_builder().transport_pad(pad).build();
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
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .min_useful(Duration::from_millis(20))
    ///     .build();
    /// assert_eq!(p.min_useful_budget(), Duration::from_millis(20));
    /// ```
    pub const fn min_useful(mut self, min_useful: Duration) -> Self {
        self.policy.egress = self
            .policy
            .egress
            .to_builder()
            .min_useful(min_useful)
            .build();
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
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .trust(Trust::Trusted)
    ///     .build();
    /// assert!(p.reads_envoy_timeout() && p.accepts_caller_priority());
    /// assert!(p.accepts_caller_operation() && p.shows_error_detail());
    /// ```
    pub const fn trust(mut self, trust: Trust) -> Self {
        self.policy.believed = Believed::preset(trust);
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
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .envoy_timeout(true)
    ///     .build();
    /// assert!(p.reads_envoy_timeout());
    /// ```
    pub const fn envoy_timeout(mut self, read: bool) -> Self {
        self.policy.believed.envoy_timeout = read;
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
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .caller_priority(true)
    ///     .build();
    /// assert!(p.accepts_caller_priority());
    /// ```
    pub const fn caller_priority(mut self, accept: bool) -> Self {
        self.policy.believed.priority = accept;
        self
    }

    /// Whether a caller's operation (its `op` id and the `gen` that goes with it) is adopted.
    /// If not, or if the caller sends no `op`, the request runs under a fresh local operation
    /// id with generation 0, and the caller's values are kept for audit only (in the
    /// [`Admission`](crate::wire::Admission)): they are never forwarded downstream.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .caller_operation(true)
    ///     .build();
    /// assert!(p.accepts_caller_operation());
    /// ```
    pub const fn caller_operation(mut self, accept: bool) -> Self {
        self.policy.believed.operation = accept;
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
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .error_detail(true)
    ///     .build();
    /// assert!(p.shows_error_detail());
    /// ```
    pub const fn error_detail(mut self, show: bool) -> Self {
        self.policy.believed.detail = show;
        self
    }

    /// What to do with a budget header that cannot be decoded (see [`OnBadInput`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, OnBadInput};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .on_bad_input(OnBadInput::Fallback(Duration::from_millis(100)))
    ///     .build();
    /// assert_eq!(p.bad_input(), OnBadInput::Fallback(Duration::from_millis(100)));
    /// ```
    pub const fn on_bad_input(mut self, on_bad_input: OnBadInput) -> Self {
        self.policy.on_bad_input = on_bad_input;
        self
    }

    /// What to do with a budget longer than the maximum (see [`OverCap`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, OverCap};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .over_cap(OverCap::Reject)
    ///     .build();
    /// assert_eq!(p.over_cap_rule(), OverCap::Reject);
    /// ```
    pub const fn over_cap(mut self, over_cap: OverCap) -> Self {
        self.policy.over_cap = over_cap;
        self
    }

    /// The policy's version, recorded in every [`Admission`](crate::wire::Admission) for audits.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).version(3).build();
    /// assert_eq!(p.policy_version(), 3);
    /// ```
    pub const fn version(mut self, version: u32) -> Self {
        self.policy.version = version;
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
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).priority(9).build();
    /// assert_eq!(p.policy_priority(), 7);
    /// ```
    pub const fn priority(mut self, priority: u8) -> Self {
        self.policy.priority = if priority > MAX_PRIORITY {
            MAX_PRIORITY
        } else {
            priority
        };
        self
    }

    /// Which classes of requests an enforcing policy enforces (see [`Stage`]); the others are
    /// shadowed, as in [`Mode::Shadow`]. Goes with [`enforced_percent`](Self::enforced_percent):
    /// a request is enforced where both say so. No effect in shadow mode.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, RequestClass, Stage};
    /// let ms = Duration::from_millis;
    /// let p = EndpointPolicy::builder(ms(5_000))
    ///     .default_budget(ms(1_000))
    ///     .min_useful(ms(50))
    ///     .enforce_for(Stage::ReadOnly)
    ///     .build();
    /// let short = |class| Incoming::new().grpc_timeout(b"10m").class(class);
    /// assert!(p.admit(short(RequestClass::ReadOnly), tokio::time::Instant::now()).is_err());
    /// let (_, write) = p.admit(short(RequestClass::SideEffecting), tokio::time::Instant::now()).unwrap();
    /// assert!(write.is_shadowed() && write.would_be()[0].is_refusal());
    /// # }
    /// ```
    pub const fn enforce_for(mut self, stage: Stage) -> Self {
        self.policy.stage = stage;
        self
    }

    /// The percentage (`0` to `100`, larger values are `100`) of operations an enforcing
    /// policy enforces; the others are shadowed. An operation is enforced where its
    /// [`fraction_bucket`](crate::wire::fraction_bucket) (a fixed hash of its id, the same in every process) is below the
    /// percentage: the operations enforced at 10 % are among those enforced at 50 %, on every
    /// hop that runs them under the same id.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .enforced_percent(120)
    ///     .build();
    /// assert_eq!(p.enforced_fraction(), 100);
    /// ```
    pub const fn enforced_percent(mut self, percent: u8) -> Self {
        self.policy.percent = if percent > 100 { 100 } else { percent };
        self
    }

    /// Whether the policy's decisions are enforced or only computed and recorded (see
    /// [`Mode`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Mode};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).mode(Mode::Shadow).build();
    /// assert_eq!(p.enforcement(), Mode::Shadow);
    /// ```
    pub const fn mode(mut self, mode: Mode) -> Self {
        self.policy.mode = mode;
        self
    }

    /// The settings of a [`RejectionCap`](crate::wire::RejectionCap) that come with this
    /// policy: at most `percent` % (`0` to `100`; larger values are `100`) of the requests
    /// refused over `window` (at least 10 ns), so that the cap can come from configuration
    /// with the rest of a policy version
    /// ([`PolicyConfig::rejection_cap`](crate::wire::PolicyConfig::rejection_cap), feature
    /// `serde`).
    ///
    /// A layer that reads versions
    /// ([`AdmitLayer::versioned`](crate::integrations::tower::AdmitLayer::versioned), feature
    /// `rollout`) and has no cap of its own counts its refusals in one window of its own,
    /// made at its first request that needs it, under the settings of the version that admits
    /// each request: the window is kept across [`set`](crate::wire::PolicyHandle::set) and
    /// [`rollback`](crate::wire::PolicyHandle::rollback) (a swap does not reset its counts,
    /// and a rollback brings back the earlier version's settings); under a version without
    /// settings every refusal is enforced. A cap given to the layer
    /// ([`AdmitLayer::rejection_cap`](crate::integrations::tower::AdmitLayer::rejection_cap))
    /// wins over these settings. A layer with one fixed policy that brings them
    /// ([`AdmitLayer::new`](crate::integrations::tower::AdmitLayer::new)) counts in one window
    /// of its own, shared by the services it makes. Admission without a layer
    /// ([`EndpointPolicy::admit`](super::EndpointPolicy::admit) and the others) does not read
    /// them: give it a [`RejectionCap`](crate::wire::RejectionCap) on the
    /// [`Incoming`](crate::wire::Incoming).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let s = Duration::from_secs;
    /// let p = EndpointPolicy::builder(s(1)).rejection_cap(120, s(30)).build();
    /// assert_eq!(p.rejection_limit(), Some((100, s(30))));
    /// assert_eq!(EndpointPolicy::builder(s(1)).build().rejection_limit(), None);
    /// ```
    pub const fn rejection_cap(mut self, percent: u8, window: Duration) -> Self {
        let percent = if percent > 100 { 100 } else { percent };
        let least = Duration::from_nanos(10);
        let window = if window.as_nanos() < least.as_nanos() {
            least
        } else {
            window
        };
        self.policy.rejection = Some((percent, window));
        self
    }

    /// The policy.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// assert_eq!(p.max_budget(), Duration::from_secs(1));
    /// ```
    pub const fn build(self) -> EndpointPolicy {
        self.policy
    }
}
