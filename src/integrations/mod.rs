//! Adapters to other crates, each behind its cargo feature.
//!
//! | feature | module | what |
//! |---|---|---|
//! | `tower` | `tower` | a server layer that admits requests into scopes, a client layer that propagates budgets |
//! | `reqwest` | `reqwest` | reqwest calls made in a child scope, headers injected, body read bounded |
//!
//! Both client sides fail with the same [`CallError`].

#[cfg(any(feature = "tower", feature = "reqwest"))]
mod call;
#[cfg(any(feature = "tower", feature = "reqwest"))]
mod error;
#[cfg(any(feature = "tower", feature = "reqwest"))]
mod headers;
#[cfg(feature = "reqwest")]
pub mod reqwest;
#[cfg(feature = "tower")]
pub mod tower;

#[cfg(any(feature = "tower", feature = "reqwest"))]
pub use error::CallError;
