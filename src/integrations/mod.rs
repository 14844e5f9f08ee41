//! Feature-gated adapters that make other libraries' work children of a [`Scope`](crate::Scope).
//!
//! | module | feature | what |
//! |---|---|---|
//! | `sqlx` | `sqlx`, `sqlx-postgres`, `sqlx-sqlite` | database calls that really stop on cancel |
//! | `tower` | `tower` | a server layer that admits requests into scopes, a client layer that propagates budgets |
//! | `reqwest` | `reqwest` | reqwest calls made in a child scope, headers injected, body read bounded |
//!
//! The tower and reqwest client sides work alike: they fail with the same `CallError`, and own
//! the budget headers of the requests they send (a header already on a request may only
//! shorten the call, and is replaced).

#[cfg(any(feature = "tower", feature = "reqwest"))]
mod call;
#[cfg(any(feature = "tower", feature = "reqwest"))]
mod error;
#[cfg(any(feature = "tower", feature = "reqwest"))]
mod headers;
#[cfg(feature = "reqwest")]
pub mod reqwest;
#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
pub mod sqlx;
#[cfg(feature = "tower")]
pub mod tower;

#[cfg(any(feature = "tower", feature = "reqwest"))]
pub use error::CallError;
