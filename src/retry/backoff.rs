//! The default backoff schedule: exponential with jitter, from a tiny seedable generator.
//!
//! Any `IntoIterator<Item = Duration> + Clone` is a schedule (a `Vec`, `std::iter::repeat`), and
//! [`backoff_fn`] makes one of any function returning delays (e.g. a `backon` builder's
//! `build()`); [`Exponential`] is the default. Whatever the schedule says, a backoff
//! delay is paid from the scope's budget: the retry loop does not sleep when the next attempt
//! could not start after the sleep.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use std::time::Duration;

/// How much randomness spreads the delays of callers that failed together.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::retry::{Exponential, Jitter};
/// let ms = Duration::from_millis;
/// let plain: Vec<_> = Exponential::new(ms(10), ms(100)).jitter(Jitter::None)
///     .into_iter().take(5).collect();
/// assert_eq!(plain, [ms(10), ms(20), ms(40), ms(80), ms(100)]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Jitter {
    /// The exact exponential delays (callers that failed together retry together).
    None,
    /// Uniform in `[0, d]` ("full jitter"): spreads load best, may retry at once.
    Full,
    /// Uniform in `[d/2, d]` ("equal jitter"): never shorter than half the delay.
    Equal,
}

/// Exponential backoff with jitter: `base * factor^n`, at most `max`, jittered.
///
/// The default schedule of [`Retry`](super::Retry): 10 ms base, factor 2, at most 1 s, equal
/// jitter. Jittered delays are rounded down to whole milliseconds (tokio's timer resolution). The jitter comes from a xorshift generator: seeded with [`seed`](Self::seed) it
/// repeats exactly (for tests); unseeded, every iteration starts from a fresh process-unique
/// seed, so callers that failed together do not retry in lockstep.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::retry::Exponential;
/// let ms = Duration::from_millis;
/// let b = Exponential::new(ms(100), ms(1000)).seed(7);
/// let first: Vec<_> = b.clone().into_iter().take(4).collect();
/// let again: Vec<_> = b.into_iter().take(4).collect();
/// assert_eq!(first, again); // seeded: deterministic
/// assert!(first[0] >= ms(50) && first[0] <= ms(100)); // equal jitter: [d/2, d]
/// assert!(first[3] >= ms(400) && first[3] <= ms(800));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exponential {
    base: Duration,
    max: Duration,
    factor: u32,
    jitter: Jitter,
    seed: Option<u64>,
}

impl Default for Exponential {
    fn default() -> Self {
        Exponential::new(Duration::from_millis(10), Duration::from_secs(1))
    }
}

impl Exponential {
    /// Delays from `base`, doubling, never above `max` (a `base` above `max` is lowered to it),
    /// with equal jitter.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::retry::{Exponential, Jitter};
    /// let b = Exponential::new(Duration::from_secs(5), Duration::from_secs(1)).jitter(Jitter::None);
    /// assert_eq!(b.into_iter().next(), Some(Duration::from_secs(1)));
    /// ```
    pub const fn new(base: Duration, max: Duration) -> Self {
        let base = if base.as_nanos() > max.as_nanos() {
            max
        } else {
            base
        };
        Exponential {
            base,
            max,
            factor: 2,
            jitter: Jitter::Equal,
            seed: None,
        }
    }

    /// The growth factor (default 2; 0 is taken as 1: constant delays).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::retry::{Exponential, Jitter};
    /// let ms = Duration::from_millis;
    /// let b = Exponential::new(ms(10), ms(1000)).factor(3).jitter(Jitter::None);
    /// assert_eq!(b.into_iter().take(3).collect::<Vec<_>>(), [ms(10), ms(30), ms(90)]);
    /// ```
    pub const fn factor(mut self, factor: u32) -> Self {
        self.factor = if factor == 0 { 1 } else { factor };
        self
    }

    /// The jitter (default [`Jitter::Equal`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::retry::{Exponential, Jitter};
    /// let b = Exponential::new(Duration::from_millis(10), Duration::from_secs(1));
    /// assert_eq!(b.jitter(Jitter::Full).jitter(Jitter::None).into_iter().next(),
    ///            Some(Duration::from_millis(10)));
    /// ```
    pub const fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Seeds the jitter: every iteration then yields the same delays.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::retry::Exponential;
    /// let b = Exponential::default().seed(42);
    /// assert!(b.into_iter().take(3).eq(b.into_iter().take(3)));
    /// ```
    pub const fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
}

impl IntoIterator for Exponential {
    type Item = Duration;
    type IntoIter = ExponentialIter;

    fn into_iter(self) -> ExponentialIter {
        let seed = self.seed.unwrap_or_else(fresh_seed);
        ExponentialIter {
            next: self.base,
            policy: self,
            rng: XorShift::new(seed),
        }
    }
}

/// The delays of an [`Exponential`] schedule (endless: the retry's limits end it).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::retry::{Exponential, Jitter};
/// let mut it = Exponential::new(Duration::from_millis(1), Duration::from_millis(2))
///     .jitter(Jitter::None).into_iter();
/// assert_eq!(it.nth(10), Some(Duration::from_millis(2)));
/// ```
#[derive(Clone, Debug)]
pub struct ExponentialIter {
    policy: Exponential,
    next: Duration,
    rng: XorShift,
}

impl Iterator for ExponentialIter {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let d = self.next;
        self.next = d
            .checked_mul(self.policy.factor)
            .map_or(self.policy.max, |n| n.min(self.policy.max));
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let jittered = match self.policy.jitter {
            Jitter::None => nanos,
            Jitter::Full => self.rng.below(nanos),
            Jitter::Equal => nanos - nanos / 2 + self.rng.below(nanos / 2),
        };
        // Whole milliseconds (tokio's timer resolution and the unit budgets travel in), so
        // that the delay slept is the delay the ledger shows; sub-millisecond delays stay.
        const MS: u64 = 1_000_000;
        let rounded = if jittered >= MS {
            jittered - jittered % MS
        } else {
            jittered
        };
        Some(Duration::from_nanos(rounded))
    }
}

/// A backoff schedule made afresh by `f` for every call: for schedules whose iterator is not
/// `Clone`, such as those `backon`'s builders build.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::retry::{backoff_fn, Decision, Retry};
/// // e.g. `backoff_fn(|| backon::ExponentialBuilder::default().build())`
/// let retry = Retry::new(|_: &()| Decision::Backoff)
///     .backoff(backoff_fn(|| (1..=3).map(Duration::from_millis)));
/// # let _ = retry;
/// ```
pub fn backoff_fn<F, I>(f: F) -> BackoffFn<F>
where
    F: Fn() -> I + Clone,
    I: IntoIterator<Item = Duration>,
{
    BackoffFn(f)
}

/// A schedule made by a function; see [`backoff_fn`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::retry::backoff_fn;
/// let s = backoff_fn(|| vec![Duration::from_millis(5)]);
/// assert_eq!(s.clone().into_iter().collect::<Vec<_>>(), [Duration::from_millis(5)]);
/// ```
#[derive(Clone, Copy)]
pub struct BackoffFn<F>(F);

impl<F, I> IntoIterator for BackoffFn<F>
where
    F: Fn() -> I,
    I: IntoIterator<Item = Duration>,
{
    type Item = Duration;
    type IntoIter = I::IntoIter;

    fn into_iter(self) -> I::IntoIter {
        (self.0)().into_iter()
    }
}

impl<F> std::fmt::Debug for BackoffFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BackoffFn")
    }
}

/// xorshift64* (Vigna): tiny, fast, plenty for spreading delays. Not for anything secret.
#[derive(Clone, Debug)]
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        // splitmix64 of the seed: any seed (0 included) gives a well-mixed non-zero state.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        XorShift(if z == 0 { 0x9E37_79B9_7F4A_7C15 } else { z })
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[0, n]` (inclusive; the modulo bias is irrelevant for delays).
    fn below(&mut self, n: u64) -> u64 {
        match n.checked_add(1) {
            Some(m) => self.next_u64() % m,
            None => self.next_u64(),
        }
    }
}

/// A process-unique seed: a per-process random base (from std's `RandomState`, hashed once)
/// mixed with a counter by splitmix64 in [`XorShift::new`]. (Process-global bookkeeping outside
/// the tree, like the scope clock base: not loom-modeled.)
fn fresh_seed() -> u64 {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    static BASE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(|| RandomState::new().build_hasher().finish());
    // Relaxed: only makes seeds distinct, orders nothing.
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    base ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_range() {
        let ms = Duration::from_millis;
        for seed in 0..200 {
            let full: Vec<_> = Exponential::new(ms(8), ms(64))
                .jitter(Jitter::Full)
                .seed(seed)
                .into_iter()
                .take(6)
                .collect();
            for (d, cap) in full.iter().zip([8, 16, 32, 64, 64, 64]) {
                assert!(*d <= ms(cap));
            }
            let equal: Vec<_> = Exponential::new(ms(8), ms(64))
                .seed(seed)
                .into_iter()
                .take(6)
                .collect();
            for (d, cap) in equal.iter().zip([8, 16, 32, 64, 64, 64]) {
                assert!(*d <= ms(cap) && *d >= ms(cap / 2));
            }
        }
    }

    #[test]
    fn unseeded_schedules_differ() {
        let b = Exponential::new(Duration::from_secs(1), Duration::from_secs(60));
        let a: Vec<_> = b.into_iter().take(4).collect();
        let c: Vec<_> = b.into_iter().take(4).collect();
        assert_ne!(a, c);
    }

    #[test]
    fn huge_values_saturate() {
        let mut it = Exponential::new(Duration::MAX, Duration::MAX)
            .jitter(Jitter::None)
            .into_iter();
        assert!(it.nth(3).is_some());
    }
}
