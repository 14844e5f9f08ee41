//! The retry ledger: what one call spent on its attempts, hedges and backoffs.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::stop::{AttemptEnd, Stop};
use crate::quiesce::Report;
use crate::spec::ChildSpec;
use crate::telemetry::Attempt;

/// One attempt in a [`Ledger`].
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::{retry::{AttemptEnd, Decision, Retry}, ChildSpec, Scope};
/// let scope = Scope::with_timeout(Duration::from_secs(1));
/// let retry = Retry::new(|_: &()| Decision::Never);
/// let (_, ledger) = retry
///     .run_with_ledger(&scope, ChildSpec::read_only("db"), |_| async { Ok::<_, ()>(1) })
///     .await;
/// let a = &ledger.attempts()[0];
/// assert_eq!((a.number(), a.end()), (1, Some(AttemptEnd::Succeeded)));
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptRecord {
    pub(crate) number: u32,
    pub(crate) hedge: bool,
    pub(crate) endpoint: u32,
    pub(crate) started_at: Instant,
    pub(crate) budget: Option<Duration>,
    pub(crate) ended_at: Option<Instant>,
    pub(crate) end: Option<AttemptEnd>,
}

impl AttemptRecord {
    /// 1 for the first attempt.
    ///
    /// # Examples
    ///
    /// See [`AttemptRecord`].
    pub fn number(&self) -> u32 {
        self.number
    }

    /// Whether it was a hedge (started while another attempt was in flight).
    ///
    /// # Examples
    ///
    /// See [`Hedge`](super::Hedge).
    pub fn is_hedge(&self) -> bool {
        self.hedge
    }

    /// The endpoint index it was told to use (see
    /// [`Decision::SwitchEndpoint`](super::Decision::SwitchEndpoint)).
    ///
    /// # Examples
    ///
    /// See [`Attempt::endpoint`](super::Attempt::endpoint).
    pub fn endpoint(&self) -> u32 {
        self.endpoint
    }

    /// When it was dispatched.
    ///
    /// # Examples
    ///
    /// See [`Ledger::attempts`].
    pub fn started_at(&self) -> Instant {
        self.started_at
    }

    /// The budget it was given (`None`: unbounded).
    ///
    /// # Examples
    ///
    /// See [`Ledger::attempts`].
    pub fn budget(&self) -> Option<Duration> {
        self.budget
    }

    /// When it ended (`None` while in flight).
    ///
    /// # Examples
    ///
    /// See [`Ledger::attempts`].
    pub fn ended_at(&self) -> Option<Instant> {
        self.ended_at
    }

    /// How it ended (`None` while in flight).
    ///
    /// # Examples
    ///
    /// See [`AttemptRecord`].
    pub fn end(&self) -> Option<AttemptEnd> {
        self.end
    }
}

/// The ledger of one retry or hedge call: every attempt it started, what they cost and why it
/// stopped. Returned with the result ([`Retry::run_with_ledger`](super::Retry::run_with_ledger),
/// [`RetryError::ledger`](super::RetryError::ledger)) and attached to the report of the scope the
/// call ran in and of its ancestors ([`Report::retry_ledgers`]).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::{retry::{Decision, Retry, Stop}, ChildSpec, Scope};
///
/// let ms = Duration::from_millis;
/// let scope = Scope::with_timeout(ms(1000));
/// let retry = Retry::new(|_: &&str| Decision::RetryNow).max_attempts(3);
/// let (result, ledger) = retry
///     .run_with_ledger(&scope, ChildSpec::read_only("inventory"), |a| async move {
///         if a.number() < 2 { Err("unavailable") } else { Ok("in stock") }
///     })
///     .await;
/// assert_eq!(result.unwrap(), "in stock");
/// assert_eq!((ledger.max_attempts(), ledger.started()), (3, 2));
/// assert_eq!(ledger.stop(), Some(&Stop::Succeeded));
/// assert_eq!(ledger.attempts()[0].budget(), Some(ms(333))); // an even split of 1000 ms
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ledger {
    pub(crate) spec: ChildSpec,
    pub(crate) owner: bool,
    pub(crate) max_attempts: u32,
    pub(crate) began: Instant,
    pub(crate) elapsed: Duration,
    /// The next attempt's last start: set at `open`, moved by each start under the even split.
    pub(crate) last_start: Option<Instant>,
    pub(crate) attempts: Attempts,
    pub(crate) in_flight: u32,
    pub(crate) peak_in_flight: u32,
    pub(crate) refused_by_budget: u32,
    pub(crate) stop: Option<Stop>,
}

impl Ledger {
    pub(crate) fn new(
        spec: ChildSpec,
        owner: bool,
        max_attempts: u32,
        last_start: Option<Instant>,
        began: Instant,
    ) -> Self {
        Ledger {
            spec,
            owner,
            max_attempts,
            began,
            elapsed: Duration::ZERO,
            last_start,
            attempts: Attempts::None,
            in_flight: 0,
            peak_in_flight: 0,
            refused_by_budget: 0,
            stop: None,
        }
    }

    /// Notes a dispatched attempt; returns its index.
    pub(crate) fn start(
        &mut self,
        hedge: bool,
        endpoint: u32,
        budget: Option<Duration>,
        at: Instant,
    ) -> usize {
        let number = u32::try_from(self.attempts.len() + 1).unwrap_or(u32::MAX);
        self.attempts.push(AttemptRecord {
            number,
            hedge,
            endpoint,
            started_at: at,
            budget,
            ended_at: None,
            end: None,
        });
        self.in_flight += 1;
        self.peak_in_flight = self.peak_in_flight.max(self.in_flight);
        self.attempts.len() - 1
    }

    pub(crate) fn end(&mut self, index: usize, end: AttemptEnd, at: Instant) {
        if let Some(a) = self.attempts.get_mut(index) {
            if a.end.is_none() {
                a.end = Some(end);
                a.ended_at = Some(at);
                self.in_flight -= 1;
                crate::telemetry::attempt(match end {
                    AttemptEnd::Succeeded => Attempt::Succeeded,
                    AttemptEnd::Failed(_) => Attempt::Failed,
                    AttemptEnd::TimedOut => Attempt::TimedOut,
                    AttemptEnd::Stopped => Attempt::Stopped,
                    AttemptEnd::Panicked => Attempt::Panicked,
                });
            }
        }
    }

    /// Ends the ledger at `at` with `stop`. By reference: a `Stop` passed by value is copied
    /// right after the caller wrote it (a store-forwarding stall on every successful call);
    /// `&Stop::Succeeded` is a constant.
    pub(crate) fn finish(&mut self, stop: &Stop, at: Instant) {
        self.elapsed = at.saturating_duration_since(self.began);
        self.stop = Some(stop.clone());
    }

    /// The dependency (the name of the child spec the attempts were registered with).
    ///
    /// # Examples
    ///
    /// See [`Ledger`]: `ledger.dependency() == "inventory"`.
    pub fn dependency(&self) -> &str {
        self.spec.name()
    }

    /// What every attempt was registered as (its effect class and idempotency key).
    ///
    /// # Examples
    ///
    /// See [`Ledger`].
    pub fn spec(&self) -> &ChildSpec {
        &self.spec
    }

    /// Whether this call owned the retries of its dependency: `false` when it ran inside an
    /// attempt of another retry for the same dependency, and so made one attempt only.
    ///
    /// # Examples
    ///
    /// See [`Retry`](super::Retry) ("one retry owner").
    pub fn is_owner(&self) -> bool {
        self.owner
    }

    /// The most attempts this call could make (1 for side-effecting work and for a call that is
    /// not the owner).
    ///
    /// # Examples
    ///
    /// See [`Ledger`].
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Attempts started (dispatched), hedges included.
    ///
    /// # Examples
    ///
    /// See [`Ledger`].
    pub fn started(&self) -> u32 {
        u32::try_from(self.attempts.len()).unwrap_or(u32::MAX)
    }

    /// Hedges started.
    ///
    /// # Examples
    ///
    /// See [`Hedge`](super::Hedge).
    pub fn hedges(&self) -> u32 {
        let n = self.attempts.iter().filter(|a| a.hedge).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// When the call began.
    ///
    /// # Examples
    ///
    /// See [`Ledger::elapsed`].
    pub fn began(&self) -> Instant {
        self.began
    }

    /// Time from the call's start to its end: attempts, backoff sleeps and waiting for losers,
    /// all paid from the same budget.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{retry::{Decision, Retry}, ChildSpec, Scope};
    /// let scope = Scope::with_timeout(Duration::from_secs(1));
    /// let (_, ledger) = Retry::new(|_: &()| Decision::Never)
    ///     .run_with_ledger(&scope, ChildSpec::read_only("db"), |_| async {
    ///         tokio::time::sleep(Duration::from_millis(40)).await;
    ///         Ok::<_, ()>(())
    ///     })
    ///     .await;
    /// assert_eq!(ledger.elapsed(), Duration::from_millis(40));
    /// # }
    /// ```
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// The last moment the call's next attempt may start (`None` in a scope without
    /// deadline): nothing starts after it, and a backoff sleep that would end after it is not
    /// slept.
    ///
    /// It is the deadline minus the response reserve minus the least time past the reserve
    /// that still gives the next attempt the minimum useful budget under the call's split:
    ///
    /// * [`Split::Greedy`] (and every [`Hedge`](super::Hedge), whose attempts overlap): the
    ///   attempt may use all of it, so the minimum useful budget itself. It does not move.
    /// * [`Split::Even`]: the attempt gets an even share of it (whole milliseconds, over the
    ///   attempts left, itself included), so the attempts left times the minimum useful budget
    ///   (rounded up to whole milliseconds). It moves earlier with every start: read after the
    ///   call, it is the next attempt's, or, once every attempt started, the last one's. (A
    ///   minimum useful budget of at most 1 ms is reached as soon as it is left past the
    ///   reserve: a share below 1 ms is 1 ms or what is left.)
    ///
    /// With a minimum useful budget an attempt may still start at that very moment; without
    /// one, only before it (at it, only the reserve is left). The per-attempt cap is not
    /// counted: a cap below the minimum useful budget lets no attempt start at all.
    ///
    /// [`Split::Greedy`]: crate::budget::Split::Greedy
    /// [`Split::Even`]: crate::budget::Split::Even
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{budget::Split, retry::{Decision, Retry}, ChildSpec, Scope};
    /// let ms = Duration::from_millis;
    /// let scope = Scope::with_timeout(ms(1000));
    /// let deadline = scope.deadline().unwrap();
    /// let retry = Retry::new(|_: &()| Decision::Backoff)
    ///     .max_attempts(3)
    ///     .reserve(ms(100))
    ///     .min_useful(ms(50));
    ///
    /// // Greedy: an attempt gets all that is left past the reserve.
    /// let (_, ledger) = retry
    ///     .clone()
    ///     .split(Split::Greedy { cap: None })
    ///     .run_with_ledger(&scope, ChildSpec::read_only("db"), |_| async { Ok::<_, ()>(()) })
    ///     .await;
    /// assert_eq!(ledger.last_start(), Some(deadline - ms(100 + 50)));
    ///
    /// // Even (the default): once the first attempt started, 2 are left, and the next one's
    /// // share of what is left past the reserve reaches 50 ms only until 200 ms of it remain.
    /// let (_, ledger) = retry
    ///     .run_with_ledger(&scope, ChildSpec::read_only("db"), |_| async { Ok::<_, ()>(()) })
    ///     .await;
    /// assert_eq!(ledger.last_start(), Some(deadline - ms(100 + 2 * 50)));
    /// # }
    /// ```
    pub fn last_start(&self) -> Option<Instant> {
        self.last_start
    }

    /// Attempts in flight when this ledger was read (0 once the call returned: it waits for
    /// every attempt).
    ///
    /// # Examples
    ///
    /// See [`Ledger::peak_concurrent`].
    pub fn concurrent(&self) -> u32 {
        self.in_flight
    }

    /// The most attempts that were in flight at once (1 without hedging).
    ///
    /// # Examples
    ///
    /// See [`Hedge`](super::Hedge).
    pub fn peak_concurrent(&self) -> u32 {
        self.peak_in_flight
    }

    /// Retries and hedges the process-wide [`RetryBudget`](super::RetryBudget) refused.
    ///
    /// # Examples
    ///
    /// See [`RetryBudget`](super::RetryBudget).
    pub fn refused_by_budget(&self) -> u32 {
        self.refused_by_budget
    }

    /// Why the call stopped (`None` only while it runs).
    ///
    /// # Examples
    ///
    /// See [`Ledger`].
    pub fn stop(&self) -> Option<&Stop> {
        self.stop.as_ref()
    }

    /// Every attempt, in start order.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{retry::{AttemptEnd, Decision, Retry}, ChildSpec, Scope};
    /// let ms = Duration::from_millis;
    /// let scope = Scope::with_timeout(ms(900));
    /// let (_, ledger) = Retry::new(|_: &()| Decision::RetryNow)
    ///     .on_timeout(Decision::RetryNow)
    ///     .run_with_ledger(&scope, ChildSpec::read_only("db"), |_| std::future::pending::<Result<(), ()>>())
    ///     .await;
    /// let a = &ledger.attempts()[1];
    /// assert_eq!(a.budget(), Some(ms(300)));
    /// assert_eq!(a.started_at() + ms(300), a.ended_at().unwrap());
    /// assert_eq!(a.end(), Some(AttemptEnd::TimedOut));
    /// # }
    /// ```
    pub fn attempts(&self) -> &[AttemptRecord] {
        &self.attempts
    }
}

/// The attempts of a call, in start order: the first one inline, so that a call whose first
/// attempt succeeds (the common case) allocates nothing for them; from the second on, a `Vec`.
#[derive(Clone, Default)]
pub(crate) enum Attempts {
    #[default]
    None,
    One([AttemptRecord; 1]),
    Many(Vec<AttemptRecord>),
}

impl Attempts {
    fn push(&mut self, record: AttemptRecord) {
        match self {
            Attempts::None => *self = Attempts::One([record]),
            Attempts::Many(v) => v.push(record),
            Attempts::One(_) => {
                if let Attempts::One([first]) = std::mem::take(self) {
                    let mut v = Vec::with_capacity(4);
                    v.push(first);
                    v.push(record);
                    *self = Attempts::Many(v);
                }
            }
        }
    }
}

impl std::ops::Deref for Attempts {
    type Target = [AttemptRecord];

    fn deref(&self) -> &[AttemptRecord] {
        match self {
            Attempts::None => &[],
            Attempts::One(one) => one,
            Attempts::Many(v) => v,
        }
    }
}

impl std::ops::DerefMut for Attempts {
    fn deref_mut(&mut self) -> &mut [AttemptRecord] {
        match self {
            Attempts::None => &mut [],
            Attempts::One(one) => one,
            Attempts::Many(v) => v,
        }
    }
}

/// Equal when the attempts are, however they are stored.
impl PartialEq for Attempts {
    fn eq(&self, other: &Attempts) -> bool {
        **self == **other
    }
}

impl Eq for Attempts {}

/// Prints like the slice of attempts (as the `Vec` it replaced did).
impl fmt::Debug for Attempts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

/// One line, which the reports of the scopes the call's ledger is attached to show too:
/// `retry inventory: 2/3 attempts (0 hedges, peak 1 concurrent) in 20ms, stopped: succeeded`.
impl fmt::Display for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "retry {}: {}/{} attempts ({} hedges, peak {} concurrent) in {:?}",
            self.dependency(),
            self.started(),
            self.max_attempts,
            self.hedges(),
            self.peak_in_flight,
            self.elapsed
        )?;
        if self.refused_by_budget > 0 {
            write!(
                f,
                ", {} refused by the retry budget",
                self.refused_by_budget
            )?;
        }
        if !self.owner {
            f.write_str(", nested (not the retry owner)")?;
        }
        if let Some(s) = &self.stop {
            write!(f, ", stopped: {s}")?;
        }
        Ok(())
    }
}

impl Report {
    /// The ledgers of the retry and hedge calls that ran in this scope or in a scope below it
    /// (a handler's child scope, a retry nested in another's attempt), oldest first: the newest
    /// 64 at most, the older ones counted in [`dropped_notes`](Report::dropped_notes).
    ///
    /// A call's ledger is attached to the scope it was given and to each of its ancestors,
    /// before the call returns and before its last receipt, so the report of the request
    /// (the root) has the ledgers of all of its calls, as its receipt counts have their
    /// receipts. A long-lived scope above many requests keeps the newest 64 (flat memory);
    /// each call then also takes that scope's notes lock once.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{retry::{Decision, Retry}, ChildSpec, Scope};
    /// let request = Scope::with_timeout(Duration::from_secs(1));
    /// let handler = request.child().name("handler").build().unwrap();
    /// let retry = Retry::new(|_: &()| Decision::Backoff);
    /// retry.run(&handler, ChildSpec::read_only("db"), |_| async { Ok::<_, ()>(()) }).await.unwrap();
    /// request.close();
    /// let report = request.quiesce().await;
    /// assert_eq!(report.retry_ledgers().len(), 1); // the handler's call, in the request's report
    /// assert_eq!(report.retry_ledgers()[0].dependency(), "db");
    /// # }
    /// ```
    pub fn retry_ledgers(&self) -> Vec<&Ledger> {
        self.notes()
            .iter()
            .filter_map(|n| n.get::<Ledger>())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(number: u32, at: Instant) -> AttemptRecord {
        AttemptRecord {
            number,
            hedge: false,
            endpoint: 0,
            started_at: at,
            budget: None,
            ended_at: None,
            end: None,
        }
    }

    /// The inline first attempt reads, compares and prints like the `Vec` it stands for, and
    /// keeps its place when more attempts follow.
    #[test]
    fn attempts_read_like_a_vec_however_stored() {
        let t = Instant::now();
        let mut attempts = Attempts::default();
        let mut vec = Vec::new();
        assert!(attempts.is_empty());
        for n in 1..=5 {
            attempts.push(record(n, t));
            vec.push(record(n, t));
            assert_eq!(&*attempts, &vec[..]);
            assert_eq!(format!("{attempts:?}"), format!("{vec:?}"));
            let inline = matches!(attempts, Attempts::One(_));
            assert_eq!(inline, n == 1);
        }
        attempts[0].end = Some(AttemptEnd::Succeeded);
        assert_eq!(vec[0].end, None);
        assert_ne!(&*attempts, &vec[..]);

        let mut one = Attempts::default();
        one.push(record(1, t));
        let many = Attempts::Many(vec![record(1, t)]);
        assert_eq!(one, many); // equal by content, not by storage
    }
}
