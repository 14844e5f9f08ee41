//! Durations, instants and runtimes for tests on tokio's clock (paused wherever no socket is
//! involved).

use std::time::Duration;

use tokio::time::Instant;

/// One millisecond (`10 * MS`).
pub const MS: Duration = Duration::from_millis(1);

/// `n` milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `n` seconds.
pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The latest instant after `now` that an `Instant` can hold, to the nanosecond: where a
/// caller's computed deadline or delay can land, and tokio's rounding of a sleep's deadline
/// up to the next millisecond would overflow.
pub fn latest_instant(now: Instant) -> Instant {
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

/// A current-thread runtime with timers, its clock paused (for tests that make or drop
/// runtimes themselves).
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}
