//! The process-wide retry budget as tower's retry `Budget` (feature `tower-retry`).

use super::budget::RetryBudget;

/// The same bucket for tower's `retry` middleware: a `tower::retry::Policy` that deposits on
/// every request and withdraws before every retry shares its ratio with this crate's
/// [`Retry`](super::Retry) and [`Hedge`](super::Hedge) calls to the same dependency (one
/// `Arc<RetryBudget>` for both).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use tower::retry::budget::Budget;
/// use cancel_scope::retry::RetryBudget;
///
/// fn retry_allowed(budget: &impl Budget) -> bool {
///     budget.withdraw()
/// }
///
/// let budget = Arc::new(RetryBudget::new(10).burst(1));
/// assert!(retry_allowed(&*budget));
/// assert!(!retry_allowed(&*budget)); // refused until ten requests deposit a token
/// (0..10).for_each(|_| Budget::deposit(&*budget));
/// assert!(retry_allowed(&*budget));
/// assert_eq!(budget.refused(), 1);
/// ```
impl tower::retry::budget::Budget for RetryBudget {
    fn deposit(&self) {
        RetryBudget::deposit(self);
    }

    fn withdraw(&self) -> bool {
        RetryBudget::withdraw(self)
    }
}
