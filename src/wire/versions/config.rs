//! An endpoint policy as configuration (feature `serde`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bounded, ErrorKind, PolicyError};
use crate::wire::{EndpointPolicy, Mode, OnBadInput, OverCap, Stage, Trust};

/// An [`EndpointPolicy`] as it is written in configuration (any `serde` format: TOML, JSON,
/// YAML): durations in whole milliseconds, unknown fields refused. Turned into a policy with
/// `EndpointPolicy::try_from`, which refuses a maximum over [`MAX_CAP`](crate::wire::MAX_CAP)
/// (no version may remove the deadline); `EndpointPolicy` also deserializes from it directly.
///
/// | field | meaning | default |
/// |---|---|---|
/// | `version` | [`EndpointPolicyBuilder::version`](crate::wire::EndpointPolicyBuilder::version) | required |
/// | `max_ms` | [`EndpointPolicy::max_budget`], the hard cap | required |
/// | `default_ms` | [`EndpointPolicy::default_budget`] | required |
/// | `reserve_ms`, `transport_pad_ms`, `min_useful_ms` | [`reserve`](crate::wire::EndpointPolicyBuilder::reserve), [`transport_pad`](crate::wire::EndpointPolicyBuilder::transport_pad), [`min_useful`](crate::wire::EndpointPolicyBuilder::min_useful) | `0` |
/// | `trust` | `"untrusted"` or `"trusted"` ([`Trust`]) | `"untrusted"` |
/// | `envoy_timeout`, `caller_priority`, `caller_operation`, `error_detail` | one trust setting each, after `trust` | the preset's |
/// | `bad_input_fallback_ms` | [`OnBadInput::Fallback`] with this budget; absent: [`OnBadInput::Reject`] | absent |
/// | `over_cap` | `"clamp"` or `"reject"` ([`OverCap`]) | `"clamp"` |
/// | `priority` | [`EndpointPolicyBuilder::priority`](crate::wire::EndpointPolicyBuilder::priority) | `3` |
/// | `mode` | `"enforce"` or `"shadow"` ([`Mode`]) | `"enforce"` |
/// | `enforce_for` | `"read_only"`, `"idempotent"` or `"all"` ([`Stage`], [`EndpointPolicyBuilder::enforce_for`](crate::wire::EndpointPolicyBuilder::enforce_for)) | `"all"` |
/// | `enforced_percent` | [`EndpointPolicyBuilder::enforced_percent`](crate::wire::EndpointPolicyBuilder::enforced_percent) | `100` |
/// | `rejection_cap` | `{ "percent": 20, "window_ms": 10000 }` ([`RejectionCapConfig`], [`EndpointPolicyBuilder::rejection_cap`](crate::wire::EndpointPolicyBuilder::rejection_cap)): the settings of a layer's own rejection cap; a percent over 100 or a zero window is refused ([`PolicyError::is_invalid_rejection_cap`]) | absent: no cap from configuration |
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::wire::EndpointPolicy;
///
/// let json = r#"{ "version": 7, "max_ms": 2000, "default_ms": 1000, "reserve_ms": 50,
///                 "trust": "untrusted", "envoy_timeout": true, "over_cap": "reject" }"#;
/// let policy: EndpointPolicy = serde_json::from_str(json).unwrap();
/// assert_eq!((policy.policy_version(), policy.max_budget()), (7, Duration::from_secs(2)));
/// assert!(policy.reads_envoy_timeout() && !policy.accepts_caller_operation());
///
/// let unbounded = r#"{ "version": 8, "max_ms": 100000000000, "default_ms": 1000 }"#;
/// assert!(serde_json::from_str::<EndpointPolicy>(unbounded).is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// The policy's version.
    pub version: u32,
    /// The maximum (the hard cap), in milliseconds.
    pub max_ms: u64,
    /// The budget of a caller that declares none, in milliseconds.
    pub default_ms: u64,
    /// The endpoint's reserve, in milliseconds.
    #[serde(default)]
    pub reserve_ms: u64,
    /// The transport pad of outgoing calls, in milliseconds.
    #[serde(default)]
    pub transport_pad_ms: u64,
    /// The minimum useful budget, in milliseconds.
    #[serde(default)]
    pub min_useful_ms: u64,
    /// The trust preset.
    #[serde(default)]
    pub trust: TrustConfig,
    /// Whether Envoy's timeout header is read (else the preset's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_timeout: Option<bool>,
    /// Whether a caller's priority is taken (else the preset's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller_priority: Option<bool>,
    /// Whether a caller's operation is adopted (else the preset's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller_operation: Option<bool>,
    /// Whether refusals carry the detail (else the preset's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_detail: Option<bool>,
    /// Bad input falls back to this budget (milliseconds); absent, it is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bad_input_fallback_ms: Option<u64>,
    /// Whether an over-long budget is clamped or refused.
    #[serde(default)]
    pub over_cap: OverCapConfig,
    /// The endpoint's priority (RFC 9218 urgency).
    #[serde(default = "default_priority")]
    pub priority: u8,
    /// Whether the decisions are enforced or shadowed.
    #[serde(default)]
    pub mode: ModeConfig,
    /// Which classes of requests are enforced.
    #[serde(default)]
    pub enforce_for: StageConfig,
    /// The percentage of operations enforced.
    #[serde(default = "all_percent")]
    pub enforced_percent: u8,
    /// The settings of the layer's own rejection cap; absent, none from configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejection_cap: Option<RejectionCapConfig>,
}

/// The settings of a [`RejectionCap`](crate::wire::RejectionCap) in configuration
/// ([`PolicyConfig::rejection_cap`], [`EndpointPolicyBuilder::rejection_cap`](crate::wire::EndpointPolicyBuilder::rejection_cap)): at most `percent` %
/// of the requests refused over `window_ms` milliseconds. Both are required; a percent over
/// 100 or a zero window is refused when the configuration becomes a policy
/// ([`PolicyError::is_invalid_rejection_cap`]).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::wire::EndpointPolicy;
///
/// let json = r#"{ "version": 2, "max_ms": 2000, "default_ms": 1000,
///                 "rejection_cap": { "percent": 50, "window_ms": 5000 } }"#;
/// let policy: EndpointPolicy = serde_json::from_str(json).unwrap();
/// assert_eq!(policy.rejection_limit(), Some((50, Duration::from_secs(5))));
///
/// let zero = r#"{ "version": 2, "max_ms": 2000, "default_ms": 1000,
///                 "rejection_cap": { "percent": 50, "window_ms": 0 } }"#;
/// assert!(serde_json::from_str::<EndpointPolicy>(zero).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RejectionCapConfig {
    /// The most requests refused, in percent of those decided (`0` to `100`).
    pub percent: u8,
    /// The window the percentage holds over, in milliseconds (not zero).
    pub window_ms: u64,
}

fn all_percent() -> u8 {
    100
}

/// [`Stage`] in configuration: `"read_only"`, `"idempotent"` or `"all"`.
///
/// # Examples
///
/// ```
/// use cancel_scope::wire::StageConfig;
/// assert_eq!(serde_json::from_str::<StageConfig>(r#""read_only""#).unwrap(), StageConfig::ReadOnly);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StageConfig {
    /// [`Stage::ReadOnly`].
    ReadOnly,
    /// [`Stage::Idempotent`].
    Idempotent,
    /// [`Stage::All`].
    #[default]
    All,
}

/// [`Mode`] in configuration: `"enforce"` or `"shadow"`.
///
/// # Examples
///
/// ```
/// use cancel_scope::wire::ModeConfig;
/// assert_eq!(serde_json::from_str::<ModeConfig>(r#""shadow""#).unwrap(), ModeConfig::Shadow);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ModeConfig {
    /// [`Mode::Enforce`].
    #[default]
    Enforce,
    /// [`Mode::Shadow`].
    Shadow,
}

fn default_priority() -> u8 {
    EndpointPolicy::builder(Duration::ZERO)
        .build()
        .policy_priority()
}

/// [`Trust`] in configuration: `"untrusted"` or `"trusted"`.
///
/// # Examples
///
/// ```
/// use cancel_scope::wire::TrustConfig;
/// assert_eq!(serde_json::from_str::<TrustConfig>(r#""trusted""#).unwrap(), TrustConfig::Trusted);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum TrustConfig {
    /// [`Trust::Untrusted`].
    #[default]
    Untrusted,
    /// [`Trust::Trusted`].
    Trusted,
}

/// [`OverCap`] in configuration: `"clamp"` or `"reject"`.
///
/// # Examples
///
/// ```
/// use cancel_scope::wire::OverCapConfig;
/// assert_eq!(serde_json::from_str::<OverCapConfig>(r#""reject""#).unwrap(), OverCapConfig::Reject);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum OverCapConfig {
    /// [`OverCap::Clamp`].
    #[default]
    Clamp,
    /// [`OverCap::Reject`].
    Reject,
}

impl TryFrom<PolicyConfig> for EndpointPolicy {
    type Error = PolicyError;

    fn try_from(c: PolicyConfig) -> Result<Self, PolicyError> {
        let ms = Duration::from_millis;
        let mut p = EndpointPolicy::builder(ms(c.max_ms))
            .default_budget(ms(c.default_ms))
            .version(c.version)
            .reserve(ms(c.reserve_ms))
            .transport_pad(ms(c.transport_pad_ms))
            .min_useful(ms(c.min_useful_ms))
            .trust(match c.trust {
                TrustConfig::Untrusted => Trust::Untrusted,
                TrustConfig::Trusted => Trust::Trusted,
            })
            .over_cap(match c.over_cap {
                OverCapConfig::Clamp => OverCap::Clamp,
                OverCapConfig::Reject => OverCap::Reject,
            })
            .priority(c.priority)
            .mode(match c.mode {
                ModeConfig::Enforce => Mode::Enforce,
                ModeConfig::Shadow => Mode::Shadow,
            })
            .enforce_for(match c.enforce_for {
                StageConfig::ReadOnly => Stage::ReadOnly,
                StageConfig::Idempotent => Stage::Idempotent,
                StageConfig::All => Stage::All,
            })
            .enforced_percent(c.enforced_percent);
        if let Some(b) = c.envoy_timeout {
            p = p.envoy_timeout(b);
        }
        if let Some(b) = c.caller_priority {
            p = p.caller_priority(b);
        }
        if let Some(b) = c.caller_operation {
            p = p.caller_operation(b);
        }
        if let Some(b) = c.error_detail {
            p = p.error_detail(b);
        }
        if let Some(f) = c.bad_input_fallback_ms {
            p = p.on_bad_input(OnBadInput::Fallback(ms(f)));
        }
        if let Some(RejectionCapConfig { percent, window_ms }) = c.rejection_cap {
            if percent > 100 || window_ms == 0 {
                return Err(PolicyError {
                    kind: ErrorKind::InvalidRejectionCap { percent, window_ms },
                });
            }
            p = p.rejection_cap(percent, ms(window_ms));
        }
        bounded(p.build())
    }
}

/// Whole milliseconds, rounded down (a configuration never says more than the policy has).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl From<EndpointPolicy> for PolicyConfig {
    /// The policy as configuration (durations rounded down to whole milliseconds).
    fn from(p: EndpointPolicy) -> Self {
        PolicyConfig {
            version: p.policy_version(),
            max_ms: millis(p.max_budget()),
            default_ms: millis(p.default_budget()),
            reserve_ms: millis(p.reserve_budget()),
            transport_pad_ms: millis(p.egress().transport_pad_budget()),
            min_useful_ms: millis(p.min_useful_budget()),
            trust: TrustConfig::Untrusted,
            envoy_timeout: Some(p.reads_envoy_timeout()),
            caller_priority: Some(p.accepts_caller_priority()),
            caller_operation: Some(p.accepts_caller_operation()),
            error_detail: Some(p.shows_error_detail()),
            bad_input_fallback_ms: match p.bad_input() {
                OnBadInput::Fallback(f) => Some(millis(f)),
                _ => None,
            },
            over_cap: match p.over_cap_rule() {
                OverCap::Reject => OverCapConfig::Reject,
                _ => OverCapConfig::Clamp,
            },
            priority: p.policy_priority(),
            mode: match p.enforcement() {
                Mode::Shadow => ModeConfig::Shadow,
                _ => ModeConfig::Enforce,
            },
            enforce_for: match p.enforcement_stage() {
                Stage::ReadOnly => StageConfig::ReadOnly,
                Stage::Idempotent => StageConfig::Idempotent,
                _ => StageConfig::All,
            },
            enforced_percent: p.enforced_fraction(),
            rejection_cap: p
                .rejection_limit()
                .map(|(percent, window)| RejectionCapConfig {
                    percent,
                    // At least 1 ms: a window below it (set in code) is not written as none.
                    window_ms: millis(window).max(1),
                }),
        }
    }
}
