//! The setters of [`EndpointPolicy`] from before [`EndpointPolicyBuilder`](super::EndpointPolicyBuilder): each forwards to
//! the builder's setter of the same name, with the same effect.

use std::time::Duration;

use super::{EndpointPolicy, OnBadInput, OverCap, Trust};
use crate::wire::shadow::Mode;
use crate::wire::stage::Stage;

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
    /// // Written with the builder:
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::from_secs(9))
    ///     .build();
    /// assert_eq!(p.default_budget(), Duration::from_secs(1));
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `EndpointPolicy::builder(max).default_budget(default).build()`"
    )]
    pub const fn new(max: Duration, default: Duration) -> Self {
        EndpointPolicy::builder(max).default_budget(default).build()
    }

    /// This policy with [`EndpointPolicyBuilder::reserve`](super::EndpointPolicyBuilder::reserve) applied.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// // Written with the builder:
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .reserve(Duration::from_millis(10))
    ///     .build();
    /// assert!(p.reserve_budget() == Duration::from_millis(10));
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `EndpointPolicy::builder(..).reserve(..)`, or `to_builder().reserve(..).build()`"
    )]
    pub const fn reserve(self, reserve: Duration) -> Self {
        self.to_builder().reserve(reserve).build()
    }

    /// This policy with [`EndpointPolicyBuilder::transport_pad`](super::EndpointPolicyBuilder::transport_pad) applied.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// // Written with the builder:
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .transport_pad(Duration::from_millis(5))
    ///     .build();
    /// assert!(p.egress().transport_pad_budget() == Duration::from_millis(5));
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `EndpointPolicy::builder(..).transport_pad(..)`, or `to_builder().transport_pad(..).build()`"
    )]
    pub const fn transport_pad(self, pad: Duration) -> Self {
        self.to_builder().transport_pad(pad).build()
    }

    /// This policy with [`EndpointPolicyBuilder::min_useful`](super::EndpointPolicyBuilder::min_useful) applied.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// // Written with the builder:
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .min_useful(Duration::from_millis(20))
    ///     .build();
    /// assert!(p.min_useful_budget() == Duration::from_millis(20));
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `EndpointPolicy::builder(..).min_useful(..)`, or `to_builder().min_useful(..).build()`"
    )]
    pub const fn min_useful(self, min_useful: Duration) -> Self {
        self.to_builder().min_useful(min_useful).build()
    }

    /// This policy with [`EndpointPolicyBuilder::trust`](super::EndpointPolicyBuilder::trust) applied.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// // Written with the builder:
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .trust(cancel_scope::wire::Trust::Trusted)
    ///     .build();
    /// assert!(p.accepts_caller_priority());
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `EndpointPolicy::builder(..).trust(..)`, or `to_builder().trust(..).build()`"
    )]
    pub const fn trust(self, trust: Trust) -> Self {
        self.to_builder().trust(trust).build()
    }

    /// This policy with [`EndpointPolicyBuilder::envoy_timeout`](super::EndpointPolicyBuilder::envoy_timeout) applied.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// // Written with the builder:
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).envoy_timeout(true).build();
    /// assert!(p.reads_envoy_timeout());
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `EndpointPolicy::builder(..).envoy_timeout(..)`, or `to_builder().envoy_timeout(..).build()`"
    )]
    pub const fn envoy_timeout(self, read: bool) -> Self {
        self.to_builder().envoy_timeout(read).build()
    }

    /// This policy with [`EndpointPolicyBuilder::caller_priority`](super::EndpointPolicyBuilder::caller_priority) applied.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// // Written with the builder:
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).caller_priority(true).build();
    /// assert!(p.accepts_caller_priority());
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `EndpointPolicy::builder(..).caller_priority(..)`, or `to_builder().caller_priority(..).build()`"
    )]
    pub const fn caller_priority(self, accept: bool) -> Self {
        self.to_builder().caller_priority(accept).build()
    }

    /// This policy with [`EndpointPolicyBuilder::caller_operation`](super::EndpointPolicyBuilder::caller_operation) applied.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// // Written with the builder:
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).caller_operation(true).build();
    /// assert!(p.accepts_caller_operation());
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `EndpointPolicy::builder(..).caller_operation(..)`, or `to_builder().caller_operation(..).build()`"
    )]
    pub const fn caller_operation(self, accept: bool) -> Self {
        self.to_builder().caller_operation(accept).build()
    }

    /// This policy with [`EndpointPolicyBuilder::error_detail`](super::EndpointPolicyBuilder::error_detail) applied.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// // Written with the builder:
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).error_detail(true).build();
    /// assert!(p.shows_error_detail());
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `EndpointPolicy::builder(..).error_detail(..)`, or `to_builder().error_detail(..).build()`"
    )]
    pub const fn error_detail(self, show: bool) -> Self {
        self.to_builder().error_detail(show).build()
    }

    /// This policy with [`EndpointPolicyBuilder::on_bad_input`](super::EndpointPolicyBuilder::on_bad_input) applied.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// // Written with the builder:
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .on_bad_input(cancel_scope::wire::OnBadInput::Fallback(Duration::from_millis(100)))
    ///     .build();
    /// assert!(p.bad_input() == cancel_scope::wire::OnBadInput::Fallback(Duration::from_millis(100)));
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `EndpointPolicy::builder(..).on_bad_input(..)`, or `to_builder().on_bad_input(..).build()`"
    )]
    pub const fn on_bad_input(self, on_bad_input: OnBadInput) -> Self {
        self.to_builder().on_bad_input(on_bad_input).build()
    }

    /// This policy with [`EndpointPolicyBuilder::over_cap`](super::EndpointPolicyBuilder::over_cap) applied.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// // Written with the builder:
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .over_cap(cancel_scope::wire::OverCap::Reject)
    ///     .build();
    /// assert!(p.over_cap_rule() == cancel_scope::wire::OverCap::Reject);
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `EndpointPolicy::builder(..).over_cap(..)`, or `to_builder().over_cap(..).build()`"
    )]
    pub const fn over_cap(self, over_cap: OverCap) -> Self {
        self.to_builder().over_cap(over_cap).build()
    }

    /// This policy with [`EndpointPolicyBuilder::version`](super::EndpointPolicyBuilder::version) applied.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// // Written with the builder:
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).version(3).build();
    /// assert!(p.policy_version() == 3);
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `EndpointPolicy::builder(..).version(..)`, or `to_builder().version(..).build()`"
    )]
    pub const fn version(self, version: u32) -> Self {
        self.to_builder().version(version).build()
    }

    /// This policy with [`EndpointPolicyBuilder::priority`](super::EndpointPolicyBuilder::priority) applied.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// // Written with the builder:
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).priority(9).build();
    /// assert!(p.policy_priority() == 7);
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `EndpointPolicy::builder(..).priority(..)`, or `to_builder().priority(..).build()`"
    )]
    pub const fn priority(self, priority: u8) -> Self {
        self.to_builder().priority(priority).build()
    }

    /// This policy with [`EndpointPolicyBuilder::mode`](super::EndpointPolicyBuilder::mode) applied.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// // Written with the builder:
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .mode(cancel_scope::wire::Mode::Shadow)
    ///     .build();
    /// assert!(p.enforcement() == cancel_scope::wire::Mode::Shadow);
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `EndpointPolicy::builder(..).mode(..)`, or `to_builder().mode(..).build()`"
    )]
    pub const fn mode(self, mode: Mode) -> Self {
        self.to_builder().mode(mode).build()
    }

    /// This policy with [`EndpointPolicyBuilder::enforce_for`](super::EndpointPolicyBuilder::enforce_for) applied.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// // Written with the builder:
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .enforce_for(cancel_scope::wire::Stage::ReadOnly)
    ///     .build();
    /// assert!(p.enforcement_stage() == cancel_scope::wire::Stage::ReadOnly);
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `EndpointPolicy::builder(..).enforce_for(..)`, or `to_builder().enforce_for(..).build()`"
    )]
    pub const fn enforce_for(self, stage: Stage) -> Self {
        self.to_builder().enforce_for(stage).build()
    }

    /// This policy with [`EndpointPolicyBuilder::enforced_percent`](super::EndpointPolicyBuilder::enforced_percent) applied.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// // Written with the builder:
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).enforced_percent(120).build();
    /// assert!(p.enforced_fraction() == 100);
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `EndpointPolicy::builder(..).enforced_percent(..)`, or `to_builder().enforced_percent(..).build()`"
    )]
    pub const fn enforced_percent(self, percent: u8) -> Self {
        self.to_builder().enforced_percent(percent).build()
    }
}
