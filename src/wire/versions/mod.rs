//! Policy versions: which [`EndpointPolicy`] admits a request, when the policy can change at
//! run time ([`PolicyHandle`], feature `rollout`).
//!
//! A policy is a value: an [`AdmitLayer`](crate::integrations::tower::AdmitLayer) built with
//! one admits every request under it. A [`PolicyHandle`] holds a current version and the
//! versions before it, shared by every layer and clone it is given to; the layer reads the
//! current version for each request, so [`set`](PolicyHandle::set) and
//! [`rollback`](PolicyHandle::rollback) take effect at the next request, without a restart.
//! A request admitted under a version keeps it to the end (its deadline was computed from it),
//! and says which one: [`Admission::policy_version`](super::Admission::policy_version), the
//! `pv` member of the `service-budget` header of its outgoing calls, and
//! [`Report::policy_version`](crate::Report::policy_version).
//!
//! The rules are in [`PolicyHandle`]'s docs (feature `rollout`).

#[cfg(feature = "serde")]
mod config;
#[cfg(feature = "rollout")]
mod handle;

use std::time::Duration;

#[cfg(feature = "serde")]
pub use config::{
    ModeConfig, OverCapConfig, PolicyConfig, RejectionCapConfig, StageConfig, TrustConfig,
};
#[cfg(feature = "rollout")]
pub use handle::PolicyHandle;

use super::admission::Incoming;
use super::policy::EndpointPolicy;
use super::service_budget::MAX_REMAINING;

/// The longest hard cap (a policy's maximum) a versioned policy may have: 24 hours, the most
/// a `service-budget` header carries ([`MAX_REMAINING`]). A longer one would be a policy
/// without a deadline.
///
/// # Examples
///
/// ```
/// assert_eq!(cancel_scope::wire::MAX_CAP, std::time::Duration::from_secs(24 * 60 * 60));
/// ```
pub const MAX_CAP: Duration = MAX_REMAINING;

/// Why a policy version was refused, or a rollback could not be made.
///
/// # Examples
///
/// ```
/// # #[cfg(feature = "rollout")] {
/// use std::time::Duration;
/// use cancel_scope::wire::{EndpointPolicy, PolicyHandle};
/// let unbounded = EndpointPolicy::builder(Duration::MAX)
///     .default_budget(Duration::from_secs(1))
///     .build();
/// let err = PolicyHandle::new(unbounded).unwrap_err();
/// assert!(err.is_unbounded());
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    kind: ErrorKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "rollout"), allow(dead_code))]
enum ErrorKind {
    Unbounded {
        max: Duration,
    },
    StaleVersion {
        version: u32,
        highest: u32,
    },
    NoPrevious,
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    InvalidRejectionCap {
        percent: u8,
        window_ms: u64,
    },
}

impl PolicyError {
    /// The policy's maximum is over [`MAX_CAP`]: it would remove the deadline.
    ///
    /// # Examples
    ///
    /// See [`PolicyError`].
    pub fn is_unbounded(&self) -> bool {
        matches!(self.kind, ErrorKind::Unbounded { .. })
    }

    /// The version number is not above every number the handle has held.
    ///
    /// # Examples
    ///
    /// See [`PolicyHandle::set`] (feature `rollout`).
    pub fn is_stale_version(&self) -> bool {
        matches!(self.kind, ErrorKind::StaleVersion { .. })
    }

    /// A rollback with no earlier version held.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(feature = "rollout")] {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, PolicyHandle};
    /// let one = PolicyHandle::new(EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build())?;
    /// assert!(one.rollback().unwrap_err().is_no_previous());
    /// # }
    /// # Ok::<(), cancel_scope::wire::PolicyError>(())
    /// ```
    pub fn is_no_previous(&self) -> bool {
        self.kind == ErrorKind::NoPrevious
    }

    /// A configuration's rejection cap has a percent over 100 or a zero window (see
    /// [`PolicyConfig::rejection_cap`], feature `serde`).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(feature = "serde")] {
    /// use cancel_scope::wire::{EndpointPolicy, PolicyConfig};
    /// let json = r#"{ "version": 1, "max_ms": 1000, "default_ms": 500,
    ///                 "rejection_cap": { "percent": 120, "window_ms": 10000 } }"#;
    /// let config: PolicyConfig = serde_json::from_str(json).unwrap();
    /// let err = EndpointPolicy::try_from(config).unwrap_err();
    /// assert!(err.is_invalid_rejection_cap() && !err.is_unbounded());
    /// assert!(err.to_string().contains("120"), "{err}");
    /// # }
    /// ```
    pub fn is_invalid_rejection_cap(&self) -> bool {
        matches!(self.kind, ErrorKind::InvalidRejectionCap { .. })
    }
}

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            ErrorKind::Unbounded { max } => write!(
                f,
                "policy maximum {max:?} is over the hard cap limit {MAX_CAP:?}: no version may remove the deadline"
            ),
            ErrorKind::StaleVersion { version, highest } => write!(
                f,
                "policy version {version} is not above {highest}, the highest version held so far"
            ),
            ErrorKind::NoPrevious => f.write_str("no previous policy version to roll back to"),
            ErrorKind::InvalidRejectionCap { percent, window_ms } => write!(
                f,
                "rejection cap of {percent} % over {window_ms} ms: the percent must be at most 100 and the window more than zero"
            ),
        }
    }
}

impl std::error::Error for PolicyError {}

/// Refuses a policy whose hard cap would remove the deadline.
#[cfg_attr(not(any(feature = "rollout", feature = "serde")), allow(dead_code))]
fn bounded(policy: EndpointPolicy) -> Result<EndpointPolicy, PolicyError> {
    if policy.max_budget() > MAX_CAP {
        return Err(PolicyError {
            kind: ErrorKind::Unbounded {
                max: policy.max_budget(),
            },
        });
    }
    Ok(policy)
}

/// Where a layer takes the policy of each request from: one fixed policy, or a handle's
/// current version (with the version current when the layer was made, for `policy()`).
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "tower"), allow(dead_code))]
pub(crate) enum PolicySource {
    Fixed(EndpointPolicy),
    #[cfg(feature = "rollout")]
    Versions {
        handle: PolicyHandle,
        made_with: EndpointPolicy,
    },
}

#[cfg_attr(not(feature = "tower"), allow(dead_code))]
impl PolicySource {
    /// The policy that admits `incoming`.
    #[cfg_attr(not(feature = "rollout"), allow(unused_variables))]
    pub(crate) fn for_request(&self, incoming: &Incoming) -> EndpointPolicy {
        match self {
            PolicySource::Fixed(p) => *p,
            #[cfg(feature = "rollout")]
            PolicySource::Versions { handle, .. } => handle.policy_for(incoming),
        }
    }

    /// The fixed policy, or the version current when the layer was made.
    pub(crate) const fn policy(&self) -> &EndpointPolicy {
        match self {
            PolicySource::Fixed(p) => p,
            #[cfg(feature = "rollout")]
            PolicySource::Versions { made_with, .. } => made_with,
        }
    }

    /// The handle, if the policy is versioned.
    #[cfg(feature = "rollout")]
    pub(crate) fn handle(&self) -> Option<&PolicyHandle> {
        match self {
            PolicySource::Fixed(_) => None,
            PolicySource::Versions { handle, .. } => Some(handle),
        }
    }
}
