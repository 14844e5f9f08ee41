//! Budget arithmetic: pure functions over durations, no clock and no runtime.
//!
//! # Why one budget and not per-hop timeouts?
//!
//! A gateway with a 3 s timeout in front of a service with a 3 s timeout in front of another
//! with 3 s does not give the user 3 s: each hop restarts the clock, queueing and retries are
//! free, and the work goes on long after the user left. Here every hop receives what is *left*
//! of one budget, minus what it must keep for itself:
//!
//! ```text
//! child = min(parent_remaining - response_reserve, dependency_cap, operation_remaining)
//! ```
//!
//! and a child that would get less than its minimum useful budget is not started at all
//! ([`BudgetExhausted`]): sending a request that is bound to time out only loads the dependency.
//!
//! Everything here takes *remaining* durations (`deadline - now`, computed by the caller from
//! a monotonic clock) and returns durations that are never longer than what went in
//! (invariant 4 of the crate).
//!
//! # Examples
//!
//! The 1000 ms request of `docs/design.md`: 60 ms queued at ingress, 90 ms spent in the
//! handler and 100 ms kept for the response leave 750 ms for the dependency.
//!
//! ```
//! use std::time::Duration;
//! use cancel_scope::budget::ChildBudget;
//!
//! let ms = Duration::from_millis;
//! let remaining = ms(1000) - ms(60) - ms(90);
//! let child = ChildBudget::new().reserve(ms(100)).compute(Some(remaining)).unwrap();
//! assert_eq!(child, Some(ms(750)));
//! ```

use std::fmt;
use std::time::Duration;

mod endpoint;
mod rules;

pub use endpoint::{EndpointBudget, EndpointBudgetBuilder};
pub use rules::Rules;

/// The inputs of one child budget: `min(parent - reserve, cap, operation)`, failing below
/// `min_useful`.
///
/// The rules only ever tighten: each setter called twice keeps the stricter value (the larger
/// reserve and minimum, the smaller cap and operation limit), so a rule added later cannot
/// loosen one set before it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::budget::ChildBudget;
///
/// let ms = Duration::from_millis;
/// let b = ChildBudget::new().reserve(ms(20)).cap(ms(300)).min_useful(ms(50));
/// assert_eq!(b.compute(Some(ms(1000))).unwrap(), Some(ms(300)));
/// assert_eq!(b.compute(Some(ms(200))).unwrap(), Some(ms(180)));
/// assert!(b.compute(Some(ms(60))).is_err()); // 40 ms left after the reserve: not useful
/// assert_eq!(b.compute(None).unwrap(), Some(ms(300))); // an unbounded parent: the cap
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChildBudget {
    rules: Rules,
    operation: Option<Duration>,
}

impl ChildBudget {
    /// No reserve, no cap, no operation limit, no minimum.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::ChildBudget;
    /// assert_eq!(ChildBudget::new().compute(Some(Duration::from_secs(1))).unwrap(),
    ///            Some(Duration::from_secs(1)));
    /// ```
    pub const fn new() -> Self {
        ChildBudget {
            rules: Rules::new(),
            operation: None,
        }
    }

    /// Time the parent keeps for itself after the child returns (serializing, replying). Set
    /// twice, the larger reserve holds.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::ChildBudget;
    /// let ms = Duration::from_millis;
    /// let b = ChildBudget::new().reserve(ms(100));
    /// assert_eq!(b.compute(Some(ms(150))).unwrap(), Some(ms(50)));
    /// assert_eq!(b.reserve(ms(20)).compute(Some(ms(150))).unwrap(), Some(ms(50)));
    /// ```
    pub const fn reserve(mut self, reserve: Duration) -> Self {
        self.rules = self.rules.reserve(reserve);
        self
    }

    /// The most this dependency may ever get, however much the parent has. Set twice, the
    /// smaller cap holds.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::ChildBudget;
    /// let ms = Duration::from_millis;
    /// let b = ChildBudget::new().cap(ms(300));
    /// assert_eq!(b.compute(Some(Duration::from_secs(10))).unwrap(), Some(ms(300)));
    /// assert_eq!(b.cap(ms(900)).compute(Some(Duration::from_secs(10))).unwrap(), Some(ms(300)));
    /// ```
    pub const fn cap(mut self, cap: Duration) -> Self {
        self.rules = self.rules.cap(cap);
        self
    }

    /// What the operation as a whole still has (e.g. from an operation registry). Set twice,
    /// the smaller one holds.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::ChildBudget;
    /// let ms = Duration::from_millis;
    /// let b = ChildBudget::new().operation(ms(40));
    /// assert_eq!(b.compute(Some(Duration::from_secs(1))).unwrap(), Some(ms(40)));
    /// assert_eq!(b.operation(ms(60)).compute(Some(Duration::from_secs(1))).unwrap(), Some(ms(40)));
    /// ```
    pub const fn operation(mut self, remaining: Duration) -> Self {
        self.operation = Some(shorter_of(self.operation, remaining));
        self
    }

    /// Below this the child is not started: [`compute`](Self::compute) fails. Set twice, the
    /// larger minimum holds.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::ChildBudget;
    /// let ms = Duration::from_millis;
    /// let b = ChildBudget::new().min_useful(ms(50));
    /// assert!(b.compute(Some(ms(49))).is_err());
    /// assert!(b.min_useful(ms(5)).compute(Some(ms(49))).is_err());
    /// ```
    pub const fn min_useful(mut self, min_useful: Duration) -> Self {
        self.rules = self.rules.min_useful(min_useful);
        self
    }

    /// The reserve, cap and minimum useful budget at once, each as its own setter would set
    /// it (the stricter value holds).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::{ChildBudget, Rules};
    /// let ms = Duration::from_millis;
    /// let rules = Rules::new().reserve(ms(20)).cap(ms(300)).min_useful(ms(50));
    /// let b = ChildBudget::new().rules(rules);
    /// assert_eq!(b, ChildBudget::new().reserve(ms(20)).cap(ms(300)).min_useful(ms(50)));
    /// assert!(b.compute(Some(ms(60))).is_err());
    /// ```
    pub const fn rules(mut self, rules: Rules) -> Self {
        self.rules = self.rules.and(rules);
        self
    }

    /// The child's budget given what the parent has left (`None`: unbounded).
    ///
    /// Returns `Ok(None)` only when nothing bounds the child (unbounded parent, no cap, no
    /// operation limit). The result is never longer than `parent_remaining`.
    ///
    /// # Errors
    ///
    /// [`BudgetExhausted`] when the result is zero or shorter than the minimum useful budget.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::ChildBudget;
    /// let err = ChildBudget::new().compute(Some(Duration::ZERO)).unwrap_err();
    /// assert_eq!(err.available(), Duration::ZERO);
    /// ```
    #[inline]
    pub fn compute(
        &self,
        parent_remaining: Option<Duration>,
    ) -> Result<Option<Duration>, BudgetExhausted> {
        let Rules {
            reserve,
            cap,
            min_useful,
        } = self.rules;
        let from_parent = parent_remaining.map(|r| r.saturating_sub(reserve));
        let budget = tighter(tighter(from_parent, cap), self.operation);
        match budget {
            Some(b) if b.is_zero() || b < min_useful => Err(BudgetExhausted {
                available: b,
                needed: min_useful,
            }),
            other => Ok(other),
        }
    }
}

/// The smaller of two limits, either of which may be absent (no limit).
#[inline]
fn tighter(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The longer of two durations (`Ord::max` is not `const`).
const fn longer(a: Duration, b: Duration) -> Duration {
    if a.as_nanos() >= b.as_nanos() {
        a
    } else {
        b
    }
}

/// The shorter of a limit set before (if any) and `b`.
const fn shorter_of(a: Option<Duration>, b: Duration) -> Duration {
    match a {
        Some(a) if a.as_nanos() <= b.as_nanos() => a,
        _ => b,
    }
}

/// Too little budget is left for the work to be useful; nothing was started.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::budget::ChildBudget;
/// let ms = Duration::from_millis;
/// let err = ChildBudget::new().min_useful(ms(50)).compute(Some(ms(30))).unwrap_err();
/// assert_eq!((err.available(), err.needed()), (ms(30), ms(50)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetExhausted {
    available: Duration,
    needed: Duration,
}

impl BudgetExhausted {
    /// What the child would have got.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::ChildBudget;
    /// let e = ChildBudget::new().compute(Some(Duration::ZERO)).unwrap_err();
    /// assert!(e.available().is_zero());
    /// ```
    pub fn available(&self) -> Duration {
        self.available
    }

    /// The minimum useful budget it needed.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::ChildBudget;
    /// let e = ChildBudget::new().compute(Some(Duration::ZERO)).unwrap_err();
    /// assert!(e.needed().is_zero());
    /// ```
    pub fn needed(&self) -> Duration {
        self.needed
    }
}

impl fmt::Display for BudgetExhausted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "budget exhausted: {:?} left, {:?} needed",
            self.available, self.needed
        )
    }
}

impl std::error::Error for BudgetExhausted {}

/// How a retry splits what is left among the attempts.
///
/// # Examples
///
/// 800 ms over 3 attempts with a 300 ms hop cap, each attempt using all it got:
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::budget::Split;
///
/// let ms = Duration::from_millis;
/// let split = Split::Even { cap: Some(ms(300)) };
/// let mut left = ms(800);
/// let mut got = vec![];
/// for attempts_left in (1..=3).rev() {
///     let a = split.attempt(left, attempts_left, Duration::ZERO);
///     got.push(a.as_millis());
///     left -= a;
/// }
/// assert_eq!(got, [266, 267, 267]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// `min(cap, remaining / attempts_left)` in whole milliseconds: every attempt gets a fair
    /// share. A share that rounds down to nothing is not a reason to start nothing: while
    /// time is left, an attempt gets at least `min(1 ms, what is left)`.
    Even {
        /// Per-attempt cap.
        cap: Option<Duration>,
    },
    /// `min(cap, remaining - reserve)`: each attempt may use all that is left.
    Greedy {
        /// Per-attempt cap.
        cap: Option<Duration>,
    },
}

impl Split {
    /// The per-attempt cap.
    pub(crate) fn cap(&self) -> Option<Duration> {
        match *self {
            Split::Even { cap } | Split::Greedy { cap } => cap,
        }
    }

    /// This way of sharing, with the smaller of its own cap and `other` (rules only tighten).
    pub(crate) fn capped(self, other: Option<Duration>) -> Split {
        let cap = tighter(self.cap(), other);
        match self {
            Split::Even { .. } => Split::Even { cap },
            Split::Greedy { .. } => Split::Greedy { cap },
        }
    }

    /// The budget of the next attempt given what is left, how many attempts are left (this one
    /// included) and the reserve to keep. Zero means: start no attempt.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::Split;
    /// let ms = Duration::from_millis;
    /// let even = Split::Even { cap: None };
    /// assert_eq!(even.attempt(ms(900), 3, ms(0)), ms(300));
    /// assert_eq!(even.attempt(ms(900), 0, ms(0)), ms(0)); // no attempts left
    /// // Less than 1 ms per attempt: 1 ms, or what is left if that is less.
    /// assert_eq!(even.attempt(ms(2), 3, ms(0)), ms(1));
    /// assert_eq!(even.attempt(Duration::from_micros(400), 3, ms(0)), Duration::from_micros(400));
    /// ```
    pub fn attempt(&self, remaining: Duration, attempts_left: u32, reserve: Duration) -> Duration {
        if attempts_left == 0 {
            return Duration::ZERO;
        }
        match *self {
            Split::Even { cap } => {
                // Whole milliseconds, rounded down: the unit budgets travel in, and what one
                // attempt does not get stays for the next (800 ms / 3 = 266, 267, 267).
                let ms = remaining.saturating_sub(reserve).as_millis();
                // In 64 bits whenever it fits (every real budget): a 128-bit division is a
                // library call on every attempt. The usual counts are divided by a constant
                // (a multiplication), not by a hardware division (about 10 ns here).
                let share = match u64::try_from(ms) {
                    Ok(ms) => match attempts_left {
                        1 => ms,
                        2 => ms / 2,
                        3 => ms / 3,
                        4 => ms / 4,
                        n => ms / u64::from(n),
                    },
                    Err(_) => u64::try_from(ms / u128::from(attempts_left)).unwrap_or(u64::MAX),
                };
                let share = if share == 0 {
                    // Less than 1 ms per attempt left: this one gets 1 ms, or all that is left
                    // if that is less (a budget is never rounded up).
                    remaining
                        .saturating_sub(reserve)
                        .min(Duration::from_millis(1))
                } else {
                    Duration::from_millis(share)
                };
                cap.map_or(share, |c| share.min(c))
            }
            Split::Greedy { cap } => grant(remaining, reserve, cap),
        }
    }
}

/// The greedy grant: `max(0, min(cap, remaining - reserve))`.
///
/// # Examples
///
/// A deadline at t=1000 with a 100 ms reserve and a 500 ms cap:
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::budget::grant;
/// let ms = Duration::from_millis;
/// let at = |now: u64| grant(ms(1000 - now), ms(100), Some(ms(500)));
/// assert_eq!(at(120), ms(500));
/// assert_eq!(at(700), ms(200));
/// assert_eq!(at(900), ms(0));
/// ```
pub fn grant(remaining: Duration, reserve: Duration, cap: Option<Duration>) -> Duration {
    let left = remaining.saturating_sub(reserve);
    cap.map_or(left, |c| left.min(c))
}

/// A per-hop timeout: `min(cap, max(floor, remaining - pad))`, never more than `remaining`.
///
/// The floor keeps a hop from getting a zero timeout while a little time is left; it never
/// lifts the result above what remains.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::budget::hop_timeout;
/// let ms = Duration::from_millis;
/// let hop = |r| hop_timeout(ms(r), ms(20), ms(300), ms(1));
/// assert_eq!(hop(800), ms(300));
/// assert_eq!(hop(100), ms(80));
/// assert_eq!(hop(15), ms(1));
/// assert_eq!(hop(0), ms(0));
/// ```
pub fn hop_timeout(remaining: Duration, pad: Duration, cap: Duration, floor: Duration) -> Duration {
    remaining
        .saturating_sub(pad)
        .max(floor)
        .min(cap)
        .min(remaining)
}
