//! Helpers shared by integration tests.

#![allow(dead_code)]

#[cfg(feature = "sqlx-postgres")]
pub mod postgres;

pub mod fault;
#[cfg(feature = "__test-servers")]
pub mod grpc;
pub mod panics;
pub mod quiesce;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
pub mod sqlx;
#[cfg(feature = "tower")]
pub mod tower;

/// The latest instant after `now` that an `Instant` can hold, to the nanosecond: where a
/// caller's computed deadline or delay can land, and tokio's rounding of a sleep's deadline
/// up to the next millisecond would overflow.
pub fn latest_instant(now: tokio::time::Instant) -> tokio::time::Instant {
    use std::time::Duration;
    let (mut ok, mut step) = (Duration::ZERO, Duration::MAX);
    while step > Duration::ZERO {
        if let Some(d) = ok
            .checked_add(step)
            .filter(|d| now.checked_add(*d).is_some())
        {
            ok = d;
        }
        step /= 2;
    }
    now + ok
}
