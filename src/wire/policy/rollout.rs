//! The rollout settings of an [`EndpointPolicy`]: staged enforcement and shadow mode.

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
}
