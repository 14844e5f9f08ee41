//! The rollout settings of an [`EndpointPolicy`]: staged enforcement, shadow mode and the
//! rejection cap's settings.

use std::time::Duration;

use crate::wire::shadow::Mode;
use crate::wire::stage::{fraction_bucket, RequestClass, Stage};

use super::EndpointPolicy;

impl EndpointPolicy {
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
    /// let p = EndpointPolicy::new(ms(5_000), ms(1_000)).min_useful(ms(50)).enforce_for(Stage::ReadOnly);
    /// let short = |class| Incoming::new().grpc_timeout(b"10m").class(class);
    /// assert!(p.admit(short(RequestClass::ReadOnly), tokio::time::Instant::now()).is_err());
    /// let (_, write) = p.admit(short(RequestClass::SideEffecting), tokio::time::Instant::now()).unwrap();
    /// assert!(write.is_shadowed() && write.would_be()[0].is_refusal());
    /// # }
    /// ```
    pub const fn enforce_for(mut self, stage: Stage) -> Self {
        self.stage = stage;
        self
    }

    /// The percentage (`0` to `100`, larger values are `100`) of operations an enforcing
    /// policy enforces; the others are shadowed. An operation is enforced where its
    /// [`fraction_bucket`] (a fixed hash of its id, the same in every process) is below the
    /// percentage: the operations enforced at 10 % are among those enforced at 50 %, on every
    /// hop that runs them under the same id.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::ZERO).enforced_percent(120);
    /// assert_eq!(p.enforced_fraction(), 100);
    /// ```
    pub const fn enforced_percent(mut self, percent: u8) -> Self {
        self.percent = if percent > 100 { 100 } else { percent };
        self
    }

    /// The [`Stage`] of enforcement.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Stage};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::ZERO);
    /// assert_eq!(p.enforcement_stage(), Stage::All);
    /// ```
    pub const fn enforcement_stage(&self) -> Stage {
        self.stage
    }

    /// The percentage of operations enforced (see [`enforced_percent`](Self::enforced_percent)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::ZERO);
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

    /// Whether the policy's decisions are enforced or only computed and recorded (see
    /// [`Mode`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Mode};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1)).mode(Mode::Shadow);
    /// assert_eq!(p.enforcement(), Mode::Shadow);
    /// ```
    pub const fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The policy's [`Mode`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Mode};
    /// let p = EndpointPolicy::new(Duration::from_secs(1), Duration::from_secs(1));
    /// assert_eq!(p.enforcement(), Mode::Enforce);
    /// ```
    pub const fn enforcement(&self) -> Mode {
        self.mode
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
    /// wins over these settings. A layer with one fixed policy, and admission without a layer
    /// ([`EndpointPolicy::admit`] and the others), do not read them: give them a
    /// [`RejectionCap`](crate::wire::RejectionCap) (on the layer, or on the
    /// [`Incoming`](crate::wire::Incoming)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::EndpointPolicy;
    /// let s = Duration::from_secs;
    /// let p = EndpointPolicy::new(s(1), s(1)).rejection_cap(120, s(30));
    /// assert_eq!(p.rejection_limit(), Some((100, s(30))));
    /// assert_eq!(EndpointPolicy::new(s(1), s(1)).rejection_limit(), None);
    /// ```
    pub const fn rejection_cap(mut self, percent: u8, window: Duration) -> Self {
        let percent = if percent > 100 { 100 } else { percent };
        let least = Duration::from_nanos(10);
        let window = if window.as_nanos() < least.as_nanos() {
            least
        } else {
            window
        };
        self.rejection = Some((percent, window));
        self
    }

    /// The rejection cap's settings that come with this policy, if any: percent and window
    /// (see [`rejection_cap`](Self::rejection_cap)).
    ///
    /// # Examples
    ///
    /// See [`rejection_cap`](Self::rejection_cap).
    pub const fn rejection_limit(&self) -> Option<(u8, Duration)> {
        self.rejection
    }
}
