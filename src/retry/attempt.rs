//! One attempt: its budget, its child scope and ticket, what its end means for the call.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::classify::Decision;
use super::stop::Stop;
use crate::budget::Split;
use crate::cause::Cause;
use crate::child::OwnTicket;
use crate::error::Error;
use crate::scope::Scope;
use crate::spec::Effect;

/// What an attempt knows about itself; passed to the operation for every attempt.
///
/// Its [`scope`](Self::scope) is the attempt's own child scope (also [`Scope::current`] inside
/// the attempt): pass it on to the call you make so that the call stops when the attempt's
/// budget runs out or the request is cancelled.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::{retry::{Decision, Retry}, ChildSpec, Scope};
///
/// let scope = Scope::with_timeout(Duration::from_millis(600));
/// let retry = Retry::new(|_: &&str| Decision::EffectUnknown).max_attempts(2);
/// let keys = retry
///     .run(&scope, ChildSpec::idempotent("put-order", "order-42"), |attempt| async move {
///         if attempt.number() == 1 {
///             // An even share of the budget: 600 ms over 2 attempts.
///             assert_eq!(attempt.scope().remaining(), Some(Duration::from_millis(300)));
///             return Err("write timed out");
///         }
///         Ok(attempt.idempotency_key().map(str::to_owned))
///     })
///     .await
///     .unwrap();
/// assert_eq!(keys.as_deref(), Some("order-42")); // every attempt reuses the key
/// # }
/// ```
#[derive(Clone)]
pub struct Attempt {
    pub(super) number: u32,
    pub(super) endpoint: u32,
    pub(super) hedge: bool,
    pub(super) scope: Scope,
    pub(super) effect: Effect,
}

impl Attempt {
    /// 1 for the first attempt.
    ///
    /// # Examples
    ///
    /// See [`Attempt`].
    pub fn number(&self) -> u32 {
        self.number
    }

    /// Which endpoint to use: 0 at first, one more after every [`Decision::SwitchEndpoint`]
    /// (take it modulo the number of endpoints you have).
    ///
    /// [`Decision::SwitchEndpoint`]: super::Decision::SwitchEndpoint
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use cancel_scope::{retry::{Decision, Retry}, ChildSpec, Scope};
    /// let nodes = ["10.0.0.1", "10.0.0.2"];
    /// let used = Retry::new(|_: &()| Decision::SwitchEndpoint)
    ///     .run(&Scope::new(), ChildSpec::read_only("db"), |a| async move {
    ///         let node = nodes[a.endpoint() as usize % nodes.len()];
    ///         if a.number() == 1 { Err(()) } else { Ok(node) }
    ///     })
    ///     .await
    ///     .unwrap();
    /// assert_eq!(used, "10.0.0.2");
    /// # }
    /// ```
    pub fn endpoint(&self) -> u32 {
        self.endpoint
    }

    /// Whether this attempt is a hedge (started while another attempt was in flight).
    ///
    /// # Examples
    ///
    /// See [`Hedge`](super::Hedge).
    pub fn is_hedge(&self) -> bool {
        self.hedge
    }

    /// The attempt's own scope: its deadline is the attempt's budget.
    ///
    /// The attempt itself is part of that scope's work (it is the scope's ticket in the
    /// retry's scope): the scope is `Running`, and not quiet even once closed, until the
    /// attempt has ended. Work the attempt spawns and must wait for goes into a child of it,
    /// whose `quiesce` the attempt can await.
    ///
    /// # Examples
    ///
    /// See [`Attempt`].
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The idempotency key every attempt of the call reuses (`None` unless the work was
    /// declared [`ChildSpec::idempotent`](crate::ChildSpec::idempotent)).
    ///
    /// # Examples
    ///
    /// See [`Attempt`].
    pub fn idempotency_key(&self) -> Option<&str> {
        self.effect.key()
    }

    /// Time this attempt has left (`None`: unbounded).
    ///
    /// # Examples
    ///
    /// See [`Attempt`].
    pub fn remaining(&self) -> Option<Duration> {
        self.scope.remaining()
    }
}

impl fmt::Debug for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attempt")
            .field("number", &self.number)
            .field("endpoint", &self.endpoint)
            .field("hedge", &self.hedge)
            .field("scope", &self.scope)
            .finish()
    }
}

/// The limits of a call, copied out of the policy.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) max_attempts: u32,
    pub(crate) split: Split,
    pub(crate) reserve: Duration,
    pub(crate) min_useful: Duration,
}

impl Limits {
    /// The last moment the next attempt can start while `attempts_left` attempts are left (it
    /// included): the deadline minus the reserve minus the least time past the reserve that
    /// still gives it `min_useful` under the split (`None` without deadline). The inverse of
    /// [`attempt_budget`]'s minimum useful check, the per-attempt cap aside.
    ///
    /// A line before any instant the clock can represent (an absurd minimum useful budget) is
    /// reported as the deadline itself.
    pub(crate) fn last_start(
        &self,
        deadline: Option<Instant>,
        attempts_left: u32,
    ) -> Option<Instant> {
        let d = deadline?;
        let back = self
            .reserve
            .saturating_add(self.least_useful(attempts_left));
        Some(d.checked_sub(back).unwrap_or(d))
    }

    /// Whether [`last_start`](Self::last_start) moves with the attempts left: only the even
    /// split's shares depend on them, and only a minimum useful budget above 1 ms feels it.
    pub(crate) fn last_start_moves(&self) -> bool {
        matches!(self.split, Split::Even { .. }) && self.min_useful > Duration::from_millis(1)
    }

    /// The least time past the reserve for which the next attempt's budget reaches
    /// `min_useful`, while `attempts_left` are left.
    fn least_useful(&self, attempts_left: u32) -> Duration {
        let min = self.min_useful;
        if !self.last_start_moves() {
            // Greedy: the attempt gets all of it. The even split with a `min_useful` of at most
            // 1 ms: a share that rounds down to nothing is `min(1 ms, what is left)` (see
            // `Split::attempt`), so `min_useful` past the reserve is enough.
            return min;
        }
        // Even: `floor(ms left past the reserve) / attempts_left`, in whole milliseconds, must
        // reach `min_useful` rounded up to whole milliseconds (the share is whole
        // milliseconds), so `attempts_left` times that must be left. In 128 bits: no overflow.
        let per = min.as_millis() + u128::from(!min.subsec_nanos().is_multiple_of(1_000_000));
        let total = per * u128::from(attempts_left.max(1));
        Duration::from_millis(u64::try_from(total).unwrap_or(u64::MAX))
    }
}

/// The budget of the next attempt given what the scope will have left, or why none may start.
///
/// `None` inside `Ok`: an unbounded attempt (no deadline and no cap).
pub(crate) fn attempt_budget(
    limits: &Limits,
    remaining: Option<Duration>,
    attempts_left: u32,
) -> Result<Option<Duration>, Stop> {
    if attempts_left == 0 {
        return Err(Stop::AttemptsExhausted);
    }
    let budget = match remaining {
        None => match limits.split {
            Split::Even { cap } | Split::Greedy { cap } => cap,
        },
        Some(rem) => {
            if rem.is_zero() && limits.reserve.is_zero() {
                // No reserve to reach: the deadline itself has come.
                return Err(Stop::Cancelled(Cause::DeadlineExceeded));
            }
            if rem <= limits.reserve {
                return Err(Stop::ReserveReached);
            }
            Some(limits.split.attempt(rem, attempts_left, limits.reserve))
        }
    };
    match budget {
        Some(b) if b.is_zero() || b < limits.min_useful => Err(Stop::BelowMinUseful),
        b => Ok(b),
    }
}

pub(super) fn stop_of(e: &Error) -> Stop {
    if let Some(c) = e.cause() {
        Stop::Cancelled(c.clone())
    } else if e.is_budget_exhausted() {
        Stop::BelowMinUseful
    } else {
        Stop::Closed
    }
}

/// A dispatched attempt: its ticket (which holds its scope) and its place in the ledger.
pub(crate) struct Started {
    pub(crate) dispatched: OwnTicket,
    pub(crate) index: usize,
    pub(crate) attempt: Attempt,
}

/// How an attempt that did not simply succeed or fail ended, for its receipt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unknown {
    /// It returned an error classified `EffectUnknown`.
    Reported,
    /// It was stopped (own deadline, the scope's cancel, a lost hedge) after dispatch.
    Stopped,
}

/// What a finished attempt means for the call.
pub(crate) enum Verdict<T> {
    /// It succeeded with this value.
    Success(T),
    /// The call must stop.
    Stop(Stop),
    /// Another attempt may follow, as this decision says (limits permitting).
    Again(Decision),
}
