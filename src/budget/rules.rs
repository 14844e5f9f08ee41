//! [`Rules`]: the reserve, cap and minimum useful budget that several builders share.

use std::time::Duration;

use super::{longer, shorter_of};

/// The rules a piece of work's budget is cut by, as one value: the reserve its parent keeps,
/// the cap it never gets more than, and the minimum useful budget below which it is not
/// started.
///
/// The builders that take these rules ([`ChildBuilder`](crate::ChildBuilder),
/// [`Retry`](crate::retry::Retry), [`FanOut`](crate::fanout::FanOut),
/// [`EgressPolicyBuilder`](crate::wire::EgressPolicyBuilder),
/// [`ChildBudget`](super::ChildBudget) and, with feature `sqlx-*`, `GuardedPool`) take all
/// three at once with `.rules(rules)`, so one value written down once applies everywhere.
/// The default is no rule: no reserve, no cap, no minimum. Like the builders' own setters,
/// each setter called twice keeps the stricter value (the larger reserve and minimum, the
/// smaller cap).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::budget::{ChildBudget, Rules};
///
/// let ms = Duration::from_millis;
/// const DB: Rules = Rules::new()
///     .reserve(Duration::from_millis(20))
///     .cap(Duration::from_millis(300));
/// assert_eq!(ChildBudget::new().rules(DB).compute(Some(ms(1000))), Ok(Some(ms(300))));
/// assert_eq!(ChildBudget::new().rules(DB).compute(Some(ms(200))), Ok(Some(ms(180))));
/// assert_eq!(DB.reserve_budget(), ms(20));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Rules {
    pub(crate) reserve: Duration,
    pub(crate) cap: Option<Duration>,
    pub(crate) min_useful: Duration,
}

impl Rules {
    /// No rule: no reserve, no cap, no minimum useful budget (the same as `Rules::default()`).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::budget::Rules;
    /// assert_eq!(Rules::new(), Rules::default());
    /// assert_eq!(Rules::new().cap_budget(), None);
    /// ```
    pub const fn new() -> Self {
        Rules {
            reserve: Duration::ZERO,
            cap: None,
            min_useful: Duration::ZERO,
        }
    }

    /// Time the parent keeps for itself after the work returns. Set twice, the larger reserve
    /// holds.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::Rules;
    /// let ms = Duration::from_millis;
    /// assert_eq!(Rules::new().reserve(ms(30)).reserve(ms(10)).reserve_budget(), ms(30));
    /// ```
    pub const fn reserve(mut self, reserve: Duration) -> Self {
        self.reserve = longer(self.reserve, reserve);
        self
    }

    /// The most the work may ever get, however much its parent has. Set twice, the smaller
    /// cap holds.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::Rules;
    /// let ms = Duration::from_millis;
    /// assert_eq!(Rules::new().cap(ms(300)).cap(ms(900)).cap_budget(), Some(ms(300)));
    /// ```
    pub const fn cap(mut self, cap: Duration) -> Self {
        self.cap = Some(shorter_of(self.cap, cap));
        self
    }

    /// Below this much budget the work is not started. Set twice, the larger minimum holds.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::Rules;
    /// let ms = Duration::from_millis;
    /// assert_eq!(Rules::new().min_useful(ms(5)).min_useful(ms(50)).min_useful_budget(), ms(50));
    /// ```
    pub const fn min_useful(mut self, min_useful: Duration) -> Self {
        self.min_useful = longer(self.min_useful, min_useful);
        self
    }

    /// These rules tightened by `other`'s: each of the three set as its setter would.
    pub(crate) const fn and(self, other: Rules) -> Self {
        let r = self.reserve(other.reserve).min_useful(other.min_useful);
        match other.cap {
            Some(cap) => r.cap(cap),
            None => r,
        }
    }

    /// The reserve (zero: none).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::budget::Rules;
    /// assert!(Rules::new().reserve_budget().is_zero());
    /// ```
    pub const fn reserve_budget(&self) -> Duration {
        self.reserve
    }

    /// The cap, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::Rules;
    /// assert_eq!(Rules::new().cap(Duration::from_secs(1)).cap_budget(), Some(Duration::from_secs(1)));
    /// ```
    pub const fn cap_budget(&self) -> Option<Duration> {
        self.cap
    }

    /// The minimum useful budget (zero: none).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::budget::Rules;
    /// assert!(Rules::new().min_useful_budget().is_zero());
    /// ```
    pub const fn min_useful_budget(&self) -> Duration {
        self.min_useful
    }
}
