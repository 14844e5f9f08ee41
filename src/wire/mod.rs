//! Wire codecs for time budgets that cross process boundaries.
//!
//! # Why these formats exist
//!
//! A request's budget does not stop at the process edge. When a frontend with 100 ms left calls
//! `orders`, which calls `inventory`, each hop must know how much of the *original* budget is
//! still there, or every hop starts a fresh timeout and work keeps running long after the client
//! gave up. This module holds the pure codecs that put a budget on the wire and read it back:
//!
//! | header | module | format |
//! |---|---|---|
//! | `grpc-timeout` | [`grpc_timeout`] | gRPC PROTOCOL-HTTP2: 1–8 ASCII digits and a unit (`H M S m u n`) |
//! | `service-budget` | [`service_budget`] | this crate's own RFC 8941 dictionary, version 1 |
//! | `x-envoy-expected-rq-timeout-ms` | [`envoy`] | Envoy's decimal milliseconds, read only |
//! | `service-effect` (responses) | [`service_effect`] | `none` / `unknown`: whether a request the server stopped may have had an effect |
//! | `service-operation` (responses) | [`service_operation`] | an RFC 8941 String: the operation an admitted request ran under, for the client's retry |
//!
//! # Remaining time, never absolute deadlines
//!
//! Every format here carries the time that is *left*, not the instant at which it runs out.
//! Two machines' clocks differ by more than a typical budget, so a wall-clock deadline from a
//! peer cannot be compared with our own clock; a duration can be added to our own monotonic
//! clock on arrival. (The `service-budget` header has an optional wall-clock `dl` member, but it
//! is for audit logs only and never enters budget arithmetic.)
//!
//! # Never extend
//!
//! A codec may lose precision, but only downwards: encoders truncate, never round up, and
//! saturate at a maximum rather than wrap; decoders reject anything they cannot represent
//! exactly instead of guessing. A hop can therefore only ever see *less* time than its caller
//! had, which is invariant 4 of `docs/design.md` ("budgets never grow") carried over the
//! network.
//! Transport padding (`outgoing remaining = local remaining − pad`) and clamping to an
//! endpoint's policy (`incoming remaining = min(header, endpoint cap, ...)`) belong to the
//! ingress/egress layers built on top of these codecs, not to the codecs.
//!
//! # Untrusted input
//!
//! Everything decoded here may come from an untrusted peer. The decoders never panic, never
//! overflow, bound their work by the input length (the `service-budget` header is also capped
//! in length before it is parsed), and report every rejection as a typed error so that the
//! caller can answer HTTP 400 / gRPC `INVALID_ARGUMENT` or fall back to a smaller local
//! default, as its policy says. The `Display` text of those errors is for humans and logs; it is
//! not API and may change. What a refused caller is told is one fixed text per kind
//! ([`AdmissionError::public_message`]: `invalid budget header`, `budget exceeds the
//! endpoint's maximum`, `budget exhausted`), without numbers, header values or internal
//! cancel reasons, unless the policy shows it the detail.
//!
//! # Header ownership and trust
//!
//! * **Admission owns the incoming budget headers.** They are decoded into the
//!   [`Admission`] and taken off the request the handler sees (`Incoming::take_from`, as the
//!   tower layer does): a handler that copies its incoming headers onto a call of its own
//!   cannot pass a caller's budget, priority, operation id or generation on. Egress writes the
//!   outgoing headers from the call's own scope and the request's [`Operation`].
//! * **A caller's budget can only shorten what a hop gets**: the handler gets
//!   `min(declared, endpoint maximum) − queued − reserve`, whatever the caller sends and
//!   however much it is trusted.
//! * **Trust is several decisions**, each a setting of [`EndpointPolicy`], with [`Trust`] as
//!   presets: reading Envoy's `x-envoy-expected-rq-timeout-ms`
//!   ([`envoy_timeout`](crate::wire::EndpointPolicyBuilder::envoy_timeout)), taking a caller's priority
//!   ([`caller_priority`](crate::wire::EndpointPolicyBuilder::caller_priority); otherwise it may only ask for
//!   less urgency), adopting its operation id and generation
//!   ([`caller_operation`](crate::wire::EndpointPolicyBuilder::caller_operation); otherwise a fresh local
//!   operation starts at generation 0, so a caller's `gen` is never forwarded), and showing it
//!   the detail of refusals ([`error_detail`](crate::wire::EndpointPolicyBuilder::error_detail)). An edge behind
//!   Envoy reads Envoy's timeout without letting its clients pick priority 0 or an operation.
//! * **Claims come from one unambiguous header.** A budget header sent on more than one line
//!   is bad input; the `op`, `gen` and `prio` of a `service-budget` header count only if it
//!   came on one line and was valid. The [`Admission`] records which source decided the
//!   budget ([`BudgetSource`]), the priority ([`PrioritySource`]) and the operation
//!   ([`OperationSource`]), and keeps what the caller sent for audit.
//! * **Operations are the registry's.** With an operation registry
//!   ([`EndpointPolicy::admit_joined`]) a request's budget is also at most what its operation
//!   has left ([`RegistryTerm`]); only a caller trusted with its operation id may create an
//!   operation, an untrusted caller's id only continues one the registry holds, and a request
//!   of a cancelled operation or an older generation is refused
//!   ([`AdmissionError::is_operation_cancelled`]).
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use cancel_scope::wire::{grpc_timeout, service_budget::ServiceBudget};
//!
//! // Egress: put what is left of the budget on the wire.
//! let left = Duration::from_millis(250);
//! assert_eq!(grpc_timeout::encode(left), "250000u");
//! let header = ServiceBudget::new(left).to_header_value();
//! assert_eq!(header, "v=1, rem=250, gen=0");
//!
//! // Ingress: read it back, never longer than what was sent.
//! assert_eq!(grpc_timeout::decode("250000u")?, left);
//! assert_eq!(ServiceBudget::parse(&header)?.remaining(), left);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod admission;
mod egress;
pub mod envoy;
pub mod grpc_timeout;
mod operation;
mod policy;
mod rejection_cap;
mod server;
pub mod service_budget;
pub mod service_effect;
pub mod service_operation;
mod shadow;
mod stage;
mod versions;

pub use admission::{
    Admission, AdmissionError, BudgetSource, Incoming, OperationSource, PrioritySource,
    RegistryTerm,
};
pub use egress::{EgressPolicy, EgressPolicyBuilder, Outgoing};
pub use envoy::EnvoyTimeoutError;
pub use grpc_timeout::GrpcTimeoutError;
pub use operation::Operation;
pub use policy::{EndpointPolicy, EndpointPolicyBuilder, OnBadInput, OverCap, Trust};
pub use rejection_cap::RejectionCap;
pub use server::{ServerScope, ShutdownReport};
pub use service_budget::{ServiceBudget, ServiceBudgetError, ServiceBudgetErrorKind};
pub use service_effect::ServiceEffect;
pub use shadow::{Mode, WouldBe};
pub use stage::{fraction_bucket, RequestClass, Stage};
#[cfg(feature = "rollout")]
pub use versions::PolicyHandle;
#[cfg(feature = "tower")]
pub(crate) use versions::PolicySource;
#[cfg(feature = "serde")]
pub use versions::{
    ModeConfig, OverCapConfig, PolicyConfig, RejectionCapConfig, StageConfig, TrustConfig,
};
pub use versions::{PolicyError, MAX_CAP};
