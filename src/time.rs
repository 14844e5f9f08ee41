//! Clock helpers: deadlines that saturate instead of overflowing, and the tree's `u64` clock
//! stamps (the tree core has no clock of its own: its callers pass stamps made here).

use std::time::Duration;

use tokio::time::Instant;

use crate::sync::OnceLock;

/// Thirty years: as good as no deadline, and far enough from the end of what an `Instant` can
/// hold for tokio's timer arithmetic.
pub(crate) const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `t + d`, if a tokio sleep can be set for it: `None` if it is past what an `Instant` holds,
/// or so close to that end that tokio's rounding of a sleep's deadline up to the next
/// millisecond would overflow (a panic in the task that sleeps). For waits that may simply
/// never end (a hedge, a pushback, a grace period): too far to represent is never.
pub(crate) fn sleepable_after(t: Instant, d: Duration) -> Option<Instant> {
    t.checked_add(d)
        .filter(|at| at.checked_add(Duration::from_millis(1)).is_some())
}

/// `now + timeout`, saturating at [`FAR`] from now instead of overflowing.
pub(crate) fn deadline_after(now: Instant, timeout: Duration) -> Instant {
    now.checked_add(timeout).unwrap_or_else(|| now + FAR)
}

static STAMP_BASE: OnceLock<std::time::Instant> = OnceLock::new();

/// Maps an instant to the tree's `u64` clock stamps: nanoseconds around a process-wide base,
/// biased so that instants before the base (other runtimes' paused clocks) stay ordered.
pub(crate) fn stamp_of(t: Instant) -> u64 {
    const BIAS: u64 = 1 << 62;
    let t = t.into_std();
    let base = *STAMP_BASE.get_or_init(|| t);
    match t.checked_duration_since(base) {
        Some(d) => BIAS.saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        None => BIAS
            .saturating_sub(u64::try_from(base.duration_since(t).as_nanos()).unwrap_or(u64::MAX)),
    }
}

pub(crate) fn now_stamp() -> u64 {
    stamp_of(Instant::now())
}

/// The instant of a stamp made by [`stamp_of`].
pub(crate) fn instant_of(stamp: u64) -> Instant {
    const BIAS: u64 = 1 << 62;
    let base = Instant::from_std(*STAMP_BASE.get_or_init(std::time::Instant::now));
    if stamp >= BIAS {
        base + Duration::from_nanos(stamp - BIAS)
    } else {
        base - Duration::from_nanos(BIAS - stamp)
    }
}

/// A stamp difference as a duration.
pub(crate) fn nanos(d: u64) -> Duration {
    Duration::from_nanos(d)
}
