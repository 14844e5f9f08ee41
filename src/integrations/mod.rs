//! Feature-gated adapters that make other libraries' work children of a [`Scope`](crate::Scope).
//!
//! | module | feature | what |
//! |---|---|---|
//! | [`sqlx`] | `sqlx`, `sqlx-postgres`, `sqlx-sqlite` | database calls that really stop on cancel |

#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
pub mod sqlx;
