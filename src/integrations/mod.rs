//! Feature-gated adapters that make other libraries' work children of a [`Scope`](crate::Scope).
//!
//! | module | feature | what |
//! |---|---|---|
//! | `sqlx` | `sqlx`, `sqlx-postgres`, `sqlx-sqlite` | database calls that really stop on cancel |
//! | `tower` | `tower` | a server layer that admits requests into scopes, a client layer that propagates budgets |
//! | `reqwest` | `reqwest`, `json`, `reqwest-middleware` | reqwest calls made in a child scope, headers injected, body read bounded; a `reqwest-middleware` middleware |
//! | `classify` | `tower` or `reqwest` (`tonic` for `tonic::Status`) | retry classifiers for HTTP and gRPC answers, by what the answer says the call may have done |
//! | `redis` | `redis` | the operation registry shared by processes through Redis |
//! | `axum` | `axum` | the request's `Scope` and `Admission` as extractors; the crate's errors as responses |
//! | `tonic` | `tonic` | the crate's errors as `tonic::Status` |
//!
//! The tower and reqwest client sides work alike: they fail with the same `CallError`, own
//! the budget headers of the requests they send (a header already on a request may only
//! shorten the call, and is replaced), take a call's effect class from its request when the
//! caller does not give a `ChildSpec` (`GET` read-only, `PUT`/`DELETE` idempotent, `POST`
//! side-effecting...), and give its receipt by one table of response statuses and effect
//! classes: a read-only call's error is `Failed`; a call that may have had an effect is
//! `Failed` only when the status says the request was refused unprocessed (HTTP 4xx, gRPC
//! `NOT_FOUND`...), and `EffectUnknown` otherwise, with the status in its record. A callee of
//! this library that stopped the request itself says whether it had dispatched a call that
//! may have had an effect (`service-effect: unknown`, see
//! [`wire::service_effect`](crate::wire::service_effect)): that turns a `Failed` into
//! `EffectUnknown`, a read-only call's too; `is_effect_unknown` (features `tower`, `reqwest`)
//! is that reading for a retry classifier, and the built-in ones of `classify` use it.

#[cfg(feature = "axum")]
pub mod axum;
#[cfg(any(feature = "tower", feature = "reqwest"))]
mod call;
#[cfg(any(feature = "tower", feature = "reqwest"))]
pub mod classify;
#[cfg(any(feature = "tower", feature = "reqwest"))]
mod effect;
#[cfg(any(feature = "tower", feature = "reqwest"))]
mod error;
#[cfg(any(feature = "tower", feature = "reqwest"))]
mod headers;
#[cfg(any(feature = "tower", feature = "reqwest"))]
mod outcome;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "reqwest")]
pub mod reqwest;
#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
pub mod sqlx;
#[cfg(any(feature = "axum", feature = "tonic"))]
mod status;
#[cfg(feature = "tonic")]
pub mod tonic;
#[cfg(feature = "tower")]
pub mod tower;

#[cfg(any(feature = "tower", feature = "reqwest"))]
pub use error::CallError;
#[cfg(any(feature = "tower", feature = "reqwest"))]
pub use outcome::{is_effect_unknown, service_effect_in};
