//! The rollout settings of an [`EndpointPolicy`]: staged enforcement, shadow mode and the
//! rejection cap's settings.

use std::time::Duration;

use crate::wire::shadow::Mode;
use crate::wire::stage::{fraction_bucket, RequestClass, Stage};

use super::EndpointPolicy;

impl EndpointPolicy {
    /// The [`Stage`] of enforcement.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Stage};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build();
    /// assert_eq!(p.enforcement_stage(), Stage::All);
    /// ```
    pub const fn enforcement_stage(&self) -> Stage {
        self.stage
    }

    /// The percentage of operations enforced (see [`enforced_percent`](super::EndpointPolicyBuilder::enforced_percent)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build();
    /// assert_eq!(p.enforced_fraction(), 100);
    /// ```
    pub const fn enforced_fraction(&self) -> u8 {
        self.percent
    }

    /// Whether an enforcing policy leaves some requests shadowed (a stage or a fraction).
    pub(crate) const fn is_staged(&self) -> bool {
        matches!(self.mode, Mode::Enforce)
            && (!matches!(self.stage, Stage::All) || self.percent < 100)
    }

    /// Whether a staged policy enforces a request of `class` in operation `operation_id`.
    pub(crate) fn enforces(&self, class: RequestClass, operation_id: &str) -> bool {
        self.stage.covers(class) && fraction_bucket(operation_id) < self.percent
    }

    /// The policy's [`Mode`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Mode};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// assert_eq!(p.enforcement(), Mode::Enforce);
    /// ```
    pub const fn enforcement(&self) -> Mode {
        self.mode
    }

    /// The rejection cap's settings that come with this policy, if any: percent and window
    /// (see [`rejection_cap`](super::EndpointPolicyBuilder::rejection_cap)).
    ///
    /// # Examples
    ///
    /// See [`rejection_cap`](super::EndpointPolicyBuilder::rejection_cap).
    pub const fn rejection_limit(&self) -> Option<(u8, Duration)> {
        self.rejection
    }
}
