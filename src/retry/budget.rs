//! The process-wide retry budget: retries may be at most a fraction of requests.
//!
//! # Why a budget and not only a maximum number of attempts?
//!
//! "3 attempts" per call is harmless while the dependency is healthy and triples its load the
//! moment it is not: every caller retries at once, and a dependency that was slow becomes one
//! that is down. A budget shared by every call to the dependency (Finagle's `RetryBudget`, gRPC
//! retry throttling, Envoy's retry budgets) lets retries through while they are rare and refuses
//! them once they would exceed a fixed ratio of the requests.

use std::fmt;

use crate::sync::{AtomicU64, Ordering};

/// Milli-tokens per token.
const MILLI: u64 = 1000;

/// A token bucket shared by all calls to one dependency: each request deposits `percent / 100`
/// of a token, each retry or hedge withdraws one, and a retry without a whole token is refused
/// (and counted).
///
/// The bucket starts full and holds at most `burst` tokens (default 10), so a quiet period
/// cannot bank an unbounded storm. It needs no clock: the ratio holds over any window. Share
/// it by `Arc` (one per dependency, for the life of the process).
///
/// # Examples
///
/// ```
/// use cancel_scope::retry::RetryBudget;
///
/// let budget = RetryBudget::new(10).burst(2); // 10 % of requests, 2 retries in reserve
/// assert!(budget.withdraw());
/// assert!(budget.withdraw());
/// assert!(!budget.withdraw()); // storm: refused
/// for _ in 0..10 {
///     budget.deposit(); // ten requests earn one retry
/// }
/// assert!(budget.withdraw());
/// assert_eq!((budget.requests(), budget.retries(), budget.refused()), (10, 3, 1));
/// ```
pub struct RetryBudget {
    /// Milli-tokens a request deposits.
    per_request: u64,
    /// Most milli-tokens the bucket holds.
    cap: u64,
    /// Milli-tokens now. Every update is a CAS loop on this word alone: `Relaxed` suffices
    /// (it orders nothing else; the counters below are statistics).
    balance: AtomicU64,
    requests: AtomicU64,
    retries: AtomicU64,
    refused: AtomicU64,
}

impl RetryBudget {
    /// A budget that lets retries be `percent` % of requests (more than 100 is allowed), with
    /// 10 tokens in reserve.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::retry::RetryBudget;
    /// let b = RetryBudget::new(20);
    /// assert_eq!(b.balance(), 10.0);
    /// ```
    pub fn new(percent: u32) -> Self {
        let cap = 10 * MILLI;
        RetryBudget {
            per_request: u64::from(percent) * MILLI / 100,
            cap,
            balance: AtomicU64::new(cap),
            requests: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// How many tokens the bucket starts with and holds at most (0 is taken as 1: a bucket that
    /// can never hold a token would refuse every retry).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::retry::RetryBudget;
    /// assert_eq!(RetryBudget::new(10).burst(3).balance(), 3.0);
    /// ```
    pub fn burst(self, tokens: u32) -> Self {
        let cap = u64::from(tokens.max(1)) * MILLI;
        self.balance.store(cap, Ordering::Relaxed);
        RetryBudget { cap, ..self }
    }

    /// Counts a request (a call's first attempt): deposits its share of a token.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::retry::RetryBudget;
    /// let b = RetryBudget::new(50).burst(1);
    /// assert!(b.withdraw());
    /// b.deposit();
    /// assert_eq!(b.balance(), 0.5);
    /// ```
    pub fn deposit(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let _ = self
            .balance
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(b.saturating_add(self.per_request).min(self.cap))
            });
    }

    /// Takes one token for a retry or a hedge; `false` (and counted as refused) if there is no
    /// whole token.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::retry::RetryBudget;
    /// let b = RetryBudget::new(0).burst(1);
    /// assert!(b.withdraw());
    /// assert!(!b.withdraw());
    /// assert_eq!(b.refused(), 1);
    /// ```
    pub fn withdraw(&self) -> bool {
        let ok = self
            .balance
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                b.checked_sub(MILLI)
            })
            .is_ok();
        let counter = if ok { &self.retries } else { &self.refused };
        counter.fetch_add(1, Ordering::Relaxed);
        if !ok {
            crate::telemetry::retry_budget_exhausted();
        }
        ok
    }

    /// Tokens in the bucket now.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::retry::RetryBudget;
    /// assert_eq!(RetryBudget::new(10).burst(4).balance(), 4.0);
    /// ```
    pub fn balance(&self) -> f64 {
        // Exact: milli-tokens fit an f64 mantissa far beyond any bucket's size.
        self.balance.load(Ordering::Relaxed) as f64 / MILLI as f64
    }

    /// Requests counted so far.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::retry::RetryBudget;
    /// let b = RetryBudget::new(10);
    /// b.deposit();
    /// assert_eq!(b.requests(), 1);
    /// ```
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Retries and hedges let through so far.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::retry::RetryBudget;
    /// let b = RetryBudget::new(10);
    /// assert!(b.withdraw());
    /// assert_eq!(b.retries(), 1);
    /// ```
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Retries and hedges refused so far.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::retry::RetryBudget;
    /// let b = RetryBudget::new(10).burst(1);
    /// b.withdraw();
    /// b.withdraw();
    /// assert_eq!(b.refused(), 1);
    /// ```
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("percent", &(self.per_request * 100 / MILLI))
            .field("burst", &(self.cap / MILLI))
            .field("balance", &self.balance())
            .field("requests", &self.requests())
            .field("retries", &self.retries())
            .field("refused", &self.refused())
            .finish()
    }
}
