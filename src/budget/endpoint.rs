//! [`EndpointBudget`]: an endpoint's rules for a budget that a caller declares.

use std::time::Duration;

/// An endpoint's rules for a budget that a caller declares.
///
/// `admit = min(declared or default, max) - queued - reserve`: a caller can shorten its budget
/// but never lengthen it past `max`. Made by [`EndpointBudget::builder`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::budget::EndpointBudget;
/// let ms = Duration::from_millis;
/// let policy = EndpointBudget::builder(ms(2000)).default_budget(ms(500)).reserve(ms(50)).build();
/// assert_eq!(policy.admit(Some(ms(60_000)), ms(0)), ms(1950)); // clamped to max
/// assert_eq!(policy.admit(None, ms(100)), ms(350));            // default, minus queueing
/// assert_eq!(policy.admit(Some(ms(100)), ms(80)), ms(0));       // nothing useful left
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointBudget {
    max: Duration,
    default: Duration,
    reserve: Duration,
}

/// Builds an [`EndpointBudget`]: the maximum is given first, the default (the maximum unless
/// set) and the reserve (none unless set) after it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::budget::EndpointBudget;
/// let b = EndpointBudget::builder(Duration::from_secs(2)).build();
/// assert_eq!(b.default_budget(), Duration::from_secs(2));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct EndpointBudgetBuilder {
    budget: EndpointBudget,
}

impl EndpointBudget {
    /// A builder of a budget with this maximum: no caller gets more. The default is the
    /// maximum and there is no reserve until they are set.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::EndpointBudget;
    /// let p = EndpointBudget::builder(Duration::from_secs(1)).build();
    /// assert_eq!((p.max(), p.default_budget()), (Duration::from_secs(1), Duration::from_secs(1)));
    /// ```
    pub const fn builder(max: Duration) -> EndpointBudgetBuilder {
        EndpointBudgetBuilder {
            budget: EndpointBudget {
                max,
                default: max,
                reserve: Duration::ZERO,
            },
        }
    }

    /// A builder that starts from this budget: "this budget with one change".
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::EndpointBudget;
    /// let p = EndpointBudget::builder(Duration::from_secs(1)).build();
    /// let q = p.to_builder().reserve(Duration::from_millis(10)).build();
    /// assert_eq!((q.max(), q.reserve_budget()), (p.max(), Duration::from_millis(10)));
    /// ```
    pub const fn to_builder(&self) -> EndpointBudgetBuilder {
        EndpointBudgetBuilder { budget: *self }
    }

    /// A policy with a maximum and a default for callers that declare nothing (the default is
    /// clamped to the maximum).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::EndpointBudget;
    /// // Written with the builder:
    /// let p = EndpointBudget::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::from_secs(5))
    ///     .build();
    /// assert_eq!(p.default_budget(), Duration::from_secs(1));
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `EndpointBudget::builder(max).default_budget(default).build()`"
    )]
    pub const fn new(max: Duration, default: Duration) -> Self {
        EndpointBudget::builder(max).default_budget(default).build()
    }

    /// This budget with its reserve set.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::EndpointBudget;
    /// // Written with the builder:
    /// let p = EndpointBudget::builder(Duration::from_secs(1))
    ///     .reserve(Duration::from_millis(10))
    ///     .build();
    /// assert_eq!(p.admit(None, Duration::ZERO), Duration::from_millis(990));
    /// ```
    #[deprecated(
        since = "0.2.0",
        note = "use `EndpointBudgetBuilder::reserve` (`to_builder().reserve(r).build()`)"
    )]
    pub const fn reserve(self, reserve: Duration) -> Self {
        self.to_builder().reserve(reserve).build()
    }

    /// The maximum any caller can get.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::EndpointBudget;
    /// let p = EndpointBudget::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build();
    /// assert_eq!(p.max(), Duration::from_secs(1));
    /// ```
    pub const fn max(&self) -> Duration {
        self.max
    }

    /// The budget of a caller that declared none.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::EndpointBudget;
    /// let p = EndpointBudget::builder(Duration::from_secs(2))
    ///     .default_budget(Duration::from_secs(1))
    ///     .build();
    /// assert_eq!(p.default_budget(), Duration::from_secs(1));
    /// ```
    pub const fn default_budget(&self) -> Duration {
        self.default
    }

    /// The endpoint's reserve.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::EndpointBudget;
    /// let p = EndpointBudget::builder(Duration::from_secs(2)).build();
    /// assert_eq!(p.reserve_budget(), Duration::ZERO);
    /// ```
    pub const fn reserve_budget(&self) -> Duration {
        self.reserve
    }

    /// The declared budget clamped to the maximum (the default if none was declared).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::EndpointBudget;
    /// let p = EndpointBudget::builder(Duration::from_secs(2))
    ///     .default_budget(Duration::from_secs(1))
    ///     .build();
    /// assert_eq!(p.clamp(Some(Duration::from_secs(9))), Duration::from_secs(2));
    /// ```
    pub fn clamp(&self, declared: Option<Duration>) -> Duration {
        declared.unwrap_or(self.default).min(self.max)
    }

    /// What the handler gets: the clamped budget minus time already queued and the reserve.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::EndpointBudget;
    /// let p = EndpointBudget::builder(Duration::from_secs(2))
    ///     .default_budget(Duration::from_secs(1))
    ///     .build();
    /// assert_eq!(p.admit(Some(Duration::from_secs(1)), Duration::from_millis(250)),
    ///            Duration::from_millis(750));
    /// ```
    pub fn admit(&self, declared: Option<Duration>, queued: Duration) -> Duration {
        self.clamp(declared)
            .saturating_sub(queued)
            .saturating_sub(self.reserve)
    }
}

impl EndpointBudgetBuilder {
    /// The budget of a caller that declares none; clamped to the maximum.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::EndpointBudget;
    /// let p = EndpointBudget::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::from_secs(5))
    ///     .build();
    /// assert_eq!(p.default_budget(), Duration::from_secs(1));
    /// ```
    pub const fn default_budget(mut self, default: Duration) -> Self {
        self.budget.default = if default.as_nanos() > self.budget.max.as_nanos() {
            self.budget.max
        } else {
            default
        };
        self
    }

    /// Time the endpoint keeps for its own response.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::EndpointBudget;
    /// let p = EndpointBudget::builder(Duration::from_secs(1))
    ///     .reserve(Duration::from_millis(10))
    ///     .build();
    /// assert_eq!(p.admit(None, Duration::ZERO), Duration::from_millis(990));
    /// ```
    pub const fn reserve(mut self, reserve: Duration) -> Self {
        self.budget.reserve = reserve;
        self
    }

    /// The budget.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::budget::EndpointBudget;
    /// let p = EndpointBudget::builder(Duration::from_secs(1)).build();
    /// assert_eq!(p.max(), Duration::from_secs(1));
    /// ```
    pub const fn build(self) -> EndpointBudget {
        self.budget
    }
}
