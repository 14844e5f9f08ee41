//! One attempt: its budget, its child scope and ticket, its receipt; and the bookkeeping of a
//! call that the sequential retry and the hedge share.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;

use super::budget::RetryBudget;
use super::classify::{Classify, Decision};
use super::ledger::{AttemptEnd, Ledger, Stop};
use crate::budget::Split;
use crate::cause::Cause;
use crate::child::{OwnRun, OwnTicket, Receipt};
use crate::error::Error;
use crate::guard::Tethered;
use crate::panic::Caught;
use crate::scope::{ChildBuilder, Note, Scope};
use crate::spec::{ChildSpec, Effect};
use crate::time::sleepable_after;

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
    number: u32,
    endpoint: u32,
    hedge: bool,
    scope: Scope,
    effect: Effect,
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
    /// declared [`ChildSpec::idempotent`]).
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

fn stop_of(e: &Error) -> Stop {
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

/// What a settled attempt's ticket gets, once the call holds the scope.
enum Ending {
    Succeed,
    Fail,
    Finish(Receipt),
    /// Dropped: it records its own default receipt (`EffectUnknown` where it may have had an
    /// effect).
    Forget,
}

impl Ending {
    fn give(self, dispatched: OwnTicket) {
        match self {
            Ending::Succeed => dispatched.succeed(),
            Ending::Fail => dispatched.fail(),
            Ending::Finish(receipt) => dispatched.finish(receipt),
            Ending::Forget => drop(dispatched),
        }
    }
}

/// The ledger of a call in progress: allocated once at [`Call::open`] and written in place
/// until the call ends and shares it (attached to the scope's report, returned to the
/// caller), so that it is never copied into an allocation at the end.
pub(crate) struct CallLedger(Arc<Ledger>);

impl CallLedger {
    /// The ledger, to write: nobody else holds it before the call ends.
    pub(crate) fn get(&mut self) -> &mut Ledger {
        let Some(ledger) = Arc::get_mut(&mut self.0) else {
            unreachable!("a call's ledger is shared only when the call ends");
        };
        ledger
    }
}

impl std::ops::Deref for CallLedger {
    type Target = Ledger;

    fn deref(&self) -> &Ledger {
        &self.0
    }
}

/// The bookkeeping of one call (sequential retry or hedge).
///
/// # Holding the scope until the ledger is attached
///
/// The ledger must be in the scope's report, so the scope must not reach quiescence between
/// the call's start and the ledger's attachment: at every moment the call owns a unit of the
/// scope — a ticket without receipt (the attempt in flight, a parked or held-back attempt) or
/// the `hold`. A hedge takes the hold at [`admit`](Self::admit). A sequential retry takes it
/// only when an attempt ends without success (before that attempt's receipt), so that a first
/// attempt that succeeds never pays for it: its own ticket holds the scope until the ledger
/// is attached, and gets its receipt right after ([`succeed`](Self::succeed)).
///
/// The same holds for a call that does not end by itself (its future dropped, or unwound by
/// a panic of user code): [`abandon`](Self::abandon) attaches the ledger before the units go.
/// Rust's drop order does not give that for free — locals are dropped in reverse order of
/// declaration, so the attempt's ticket (or the temporary of the `.await` running it) would be
/// dropped before the call — so the caller keeps the call in guards declared after it:
/// [`Live`] for the whole call, [`Keep`] and [`Attempting`] around the ticket of the attempt
/// in flight, each of which ends the call in its own `drop`, before the fields it guards.
pub(crate) struct Call<'s> {
    pub(crate) scope: &'s Scope,
    pub(crate) limits: Limits,
    retry_budget: Option<&'s RetryBudget>,
    /// Also holds the call's [`ChildSpec`] (`ledger.spec`).
    pub(crate) ledger: CallLedger,
    /// Idempotent attempts whose outcome is unknown: a later success with the same key settles
    /// them (`Cancelled`: stopped, their effect accounted for by the key); otherwise they end
    /// `EffectUnknown`. Dropped with the call, they record `EffectUnknown` themselves.
    parked: Vec<OwnTicket>,
    /// Attempts whose receipt waits for the ledger: the hold could not be taken (the scope was
    /// closed while they ran), so their tickets keep the scope from quiescence instead.
    held_back: Vec<(OwnTicket, Ending)>,
    /// A unit of the scope, for when no ticket of the call holds it (see above).
    hold: Option<Tethered<()>>,
    /// The clock read of `open`, for the first `start` that follows at once.
    opened_at: Option<Instant>,
    /// A retry-budget token already taken for the next attempt (see
    /// [`prepay_retry`](Self::prepay_retry)).
    prepaid: bool,
}

impl<'s> Call<'s> {
    /// Opens a call in `scope`. A call nested in an attempt of another call for the same
    /// dependency is not the retry owner and makes one attempt; side-effecting work makes one.
    /// [`admit`](Self::admit) must follow.
    #[inline]
    pub(crate) fn open(
        scope: &'s Scope,
        spec: ChildSpec,
        limits: Limits,
        retry_budget: Option<&'s RetryBudget>,
    ) -> Call<'s> {
        let owner = !scope.has_mark(spec.name());
        // A fresh value, not a field written into `limits`: the struct is copied into the
        // call right away, and a copy of a struct just written field by field stalls.
        let limits = Limits {
            max_attempts: if !owner || matches!(spec.effect(), Effect::SideEffecting) {
                limits.max_attempts.min(1)
            } else {
                limits.max_attempts
            },
            ..limits
        };
        let last_start = limits.last_start(scope.deadline(), limits.max_attempts);
        let now = Instant::now();
        Call {
            scope,
            limits,
            retry_budget: retry_budget.filter(|_| owner),
            // Built in its allocation (`new_cyclic` runs the closure after allocating), not
            // on the stack and copied.
            ledger: CallLedger(Arc::new_cyclic(|_| {
                Ledger::new(spec, owner, limits.max_attempts, last_start, now)
            })),
            parked: Vec::new(),
            held_back: Vec::new(),
            hold: None,
            opened_at: Some(now),
            prepaid: false,
        }
    }

    /// Admits the opened call: a closed scope refuses it (`Err`: end it with
    /// [`refused`](Self::refused), its ledger is not attached). `hold`: take the hold on the
    /// scope now (a hedge, whose attempts end in tasks of their own); otherwise it is taken
    /// when first needed.
    #[inline]
    pub(crate) fn admit(&mut self, hold: bool) -> Result<(), Stop> {
        if hold || self.scope.is_closed() {
            match self.scope.tether(()) {
                Ok(h) => self.hold = Some(h),
                Err(e) => return Err(stop_of(&e)),
            }
        }
        Ok(())
    }

    /// Ends a call that [`admit`](Self::admit) refused, without attaching its ledger.
    pub(crate) fn refused(self, stop: &Stop) -> Arc<Ledger> {
        let mut ledger = self.ledger;
        let began = ledger.began;
        ledger.get().finish(stop, began);
        ledger.0
    }

    fn spec(&self) -> &ChildSpec {
        &self.ledger.spec
    }

    pub(crate) fn started(&self) -> u32 {
        self.ledger.started()
    }

    pub(crate) fn attempts_left(&self) -> u32 {
        self.limits.max_attempts.saturating_sub(self.started())
    }

    /// Whether another attempt could start after waiting `wait` (the scope's cancel or close,
    /// the attempt count, the reserve line, the minimum useful budget): checked before a
    /// backoff sleep, so that a sleep after which nothing may start is not slept.
    pub(crate) fn check_after(&self, wait: Duration) -> Result<(), Stop> {
        // A cancel closes the watermark too: `closed` tells the two apart.
        if let Some(stop) = self.closed() {
            return Err(stop);
        }
        let remaining = self.scope.remaining().map(|r| r.saturating_sub(wait));
        attempt_budget(&self.limits, remaining, self.attempts_left()).map(|_| ())
    }

    /// When the next attempt may start after the dependency's pushback `hint`
    /// ([`Decision::RetryAfter`]): [`Stop::RetryAfterTooLong`] if nothing could start then (the
    /// reserve line, the minimum useful budget, or past any representable instant, in a scope
    /// without deadline), or why nothing can start at all.
    pub(crate) fn after_pushback(&self, hint: Duration) -> Result<Instant, Stop> {
        let too_long = Stop::RetryAfterTooLong(hint);
        match self.check_after(hint) {
            Err(Stop::ReserveReached | Stop::BelowMinUseful) => Err(too_long),
            Err(stop) => Err(stop),
            Ok(()) => sleepable_after(Instant::now(), hint).ok_or(too_long),
        }
    }

    /// Takes the retry-budget token of the next attempt now, when a sequential retry decides
    /// to retry, before its backoff sleep (as Finagle's and gRPC's retry budgets decide at the
    /// failure): a retry the budget refuses stops the call at once, without sleeping, and is
    /// counted refused once. The token is the next `start`'s; it is spent even if the sleep is
    /// cut short. Called only after an attempt (the first never takes a token).
    pub(crate) fn prepay_retry(&mut self) -> Result<(), Stop> {
        let Some(b) = self.retry_budget else {
            return Ok(());
        };
        if self.prepaid {
            return Ok(());
        }
        if !b.withdraw() {
            self.ledger.get().refused_by_budget += 1;
            return Err(Stop::RetryBudget);
        }
        self.prepaid = true;
        Ok(())
    }

    /// Why no attempt can start in the scope any more, if its watermark is closed: its cancel
    /// (a cancel closes the watermark before the cause is readable, so the state decides), or
    /// its close.
    fn closed(&self) -> Option<Stop> {
        if !self.scope.is_closed() {
            return None;
        }
        Some(if self.scope.is_cancelled() {
            Stop::Cancelled(self.scope.cause_or_cancelled())
        } else {
            Stop::Closed
        })
    }

    /// Starts the next attempt: budget from the ledger, retry budget for every attempt after
    /// the first, and the attempt's child scope, which is also its ticket in the scope
    /// (registered and dispatched by the CAS that fails if the scope was cancelled since:
    /// invariant 2).
    ///
    /// Always inlined: returned by value, `Started` would be copied out of the result right
    /// after it was written (a store-forwarding stall per attempt).
    #[inline(always)]
    pub(crate) fn start(&mut self, hedge: bool, endpoint: u32) -> Result<Started, Stop> {
        // The first start follows `open` at once: its clock read serves both.
        let opened_at = self.opened_at.take();
        if let Some(cause) = self.scope.cause() {
            return Err(Stop::Cancelled(cause));
        }
        let limits = self.limits;
        let now = opened_at.unwrap_or_else(Instant::now);
        let deadline = self.scope.deadline();
        let remaining = deadline.map(|d| d.saturating_duration_since(now));
        let budget = attempt_budget(&limits, remaining, self.attempts_left())?;
        if self.started() > 0 {
            // A closed scope refuses the attempt below: no token is spent on it.
            if let Some(stop) = self.closed() {
                return Err(stop);
            }
            if let Some(b) = self.retry_budget {
                if !std::mem::take(&mut self.prepaid) && !b.withdraw() {
                    self.ledger.get().refused_by_budget += 1;
                    return Err(Stop::RetryBudget);
                }
            }
        } else if let Some(b) = self.retry_budget {
            b.deposit();
        }
        // The attempt is a child of the retry's scope and, the same node, a ticket
        // dispatched there: its unit is taken by the CAS that fails once that scope was
        // cancelled (invariant 2), and its receipt is counted there. Named after the
        // dependency (its ticket's name), and marked (one retry owner).
        let scope = ChildBuilder::attempt(self.scope, &self.ledger.spec, budget, now)
            .map_err(|e| stop_of(&e))?;
        // Nothing is sent at or after the attempt's own deadline either: a budget with nothing
        // left (no minimum useful budget) is its cancel now, and the attempt never starts.
        if scope.expire_if_due(now) || scope.is_cancelled() {
            // The retry's scope's own cause if it was cancelled (as on every other path),
            // otherwise the attempt's deadline.
            let cause = self
                .scope
                .cause()
                .or_else(|| scope.cause())
                .unwrap_or(Cause::DeadlineExceeded);
            OwnTicket::new(scope).finish(Receipt::Cancelled);
            return Err(stop_of(&Error::cancelled(cause)));
        }
        let index = self.ledger.get().start(hedge, endpoint, budget, now);
        // Under the even split the next attempt's share needs more time left than this one's
        // did: its last start moves earlier with every start (until none is left to start).
        let left = self.attempts_left();
        if left > 0 && limits.last_start_moves() {
            self.ledger.get().last_start = limits.last_start(deadline, left);
        }
        let attempt = Attempt {
            number: self.ledger.attempts[index].number,
            endpoint,
            hedge,
            scope: scope.clone(),
            effect: self.ledger.spec.effect().clone(),
        };
        Ok(Started {
            dispatched: OwnTicket::new(scope),
            index,
            attempt,
        })
    }

    /// Records an attempt's end in the ledger and gives it its receipt.
    pub(crate) fn settle(
        &mut self,
        index: usize,
        dispatched: OwnTicket,
        end: AttemptEnd,
        unknown: Option<Unknown>,
    ) {
        let now = Instant::now();
        self.ledger.get().end(index, end, now);
        let ending = match (end, unknown) {
            (AttemptEnd::Succeeded, _) => Ending::Succeed,
            (_, None) => Ending::Fail,
            (_, Some(how)) => match self.spec().effect() {
                Effect::ReadOnly => match how {
                    Unknown::Reported => Ending::Fail,
                    Unknown::Stopped => Ending::Finish(Receipt::Cancelled),
                },
                Effect::Idempotent { .. } => {
                    // Its ticket stays until the call ends; the hold is for the receipt then.
                    self.take_hold();
                    self.parked.push(dispatched);
                    return;
                }
                // Side-effecting (and any effect class added later): unknown stays unknown.
                _ => match self.spec().effect_record().cloned() {
                    Some(rec) => Ending::Finish(Receipt::EffectUnknown(rec)),
                    None => Ending::Forget,
                },
            },
        };
        if self.take_hold() {
            ending.give(dispatched);
        } else {
            self.held_back.push((dispatched, ending));
        }
    }

    /// Takes the hold on the scope unless the call has it; `false` if the scope refused it
    /// (closed: no attempt can start any more, the call is about to end).
    fn take_hold(&mut self) -> bool {
        if self.hold.is_none() {
            self.hold = self.scope.tether(()).ok();
        }
        self.hold.is_some()
    }

    /// Settles an attempt that returned the error `e`: classified, recorded
    /// [`AttemptEnd::Failed`] and given a failed receipt, or, if the classification says its
    /// effect is unknown, kept unknown (parked until the call ends, for idempotent work).
    /// Returns the decision. Also for an attempt drained after the call ended (a hedge's
    /// loser whose error came back as it was cancelled): its answer was definite, so it is not
    /// recorded as stopped.
    ///
    /// The ticket is taken out of `dispatched` only once the classifier has returned: if it
    /// panics, the ticket is still the caller's (see [`Keep`]).
    pub(crate) fn fail<E>(
        &mut self,
        index: usize,
        dispatched: &mut OwnTicket,
        e: &E,
        classify: &impl Classify<E>,
    ) -> Decision {
        let d = classify.classify(e);
        let unknown = (d == Decision::EffectUnknown).then_some(Unknown::Reported);
        self.settle(index, dispatched.take(), AttemptEnd::Failed(d), unknown);
        d
    }

    /// Judges a finished attempt: gives it its receipt and its place in the ledger, and says
    /// whether the call succeeded, must stop, or may try again (and how). The ticket is taken
    /// out of `dispatched` as in [`fail`](Self::fail).
    pub(crate) fn judge<T, E>(
        &mut self,
        index: usize,
        dispatched: &mut OwnTicket,
        out: Result<Result<T, E>, Error>,
        classify: &impl Classify<E>,
        on_timeout: Decision,
    ) -> (Verdict<T>, Option<E>) {
        let side_effecting = matches!(self.spec().effect(), Effect::SideEffecting);
        match out {
            Ok(Ok(value)) => {
                self.settle(index, dispatched.take(), AttemptEnd::Succeeded, None);
                (Verdict::Success(value), None)
            }
            Ok(Err(e)) => {
                let d = self.fail(index, dispatched, &e, classify);
                let unknown = d == Decision::EffectUnknown;
                let verdict = if d == Decision::Never {
                    Verdict::Stop(Stop::NotRetryable)
                } else if side_effecting && unknown {
                    Verdict::Stop(Stop::EffectUnknown)
                } else if side_effecting {
                    Verdict::Stop(Stop::NotIdempotent)
                } else {
                    Verdict::Again(d)
                };
                (verdict, Some(e))
            }
            Err(stopped) => {
                if let Some(cause) = self.scope.cause() {
                    // The request is over: the attempt was stopped and nothing else starts
                    // (seed: 0 ms left -> cancel downstream and end).
                    self.settle(
                        index,
                        dispatched.take(),
                        AttemptEnd::Stopped,
                        Some(Unknown::Stopped),
                    );
                    return (Verdict::Stop(Stop::Cancelled(cause)), None);
                }
                let end = if stopped.is_deadline_exceeded() {
                    AttemptEnd::TimedOut
                } else {
                    AttemptEnd::Stopped
                };
                self.settle(index, dispatched.take(), end, Some(Unknown::Stopped));
                let verdict = if side_effecting {
                    Verdict::Stop(Stop::EffectUnknown)
                } else if on_timeout == Decision::Never {
                    Verdict::Stop(Stop::NotRetryable)
                } else {
                    Verdict::Again(on_timeout)
                };
                (verdict, None)
            }
        }
    }

    /// The attempt at `index` succeeded: ends the call. The ledger is attached to the scope's
    /// report before the attempt gets its receipt, so that the attempt's own ticket holds the
    /// scope until then — a first attempt that succeeds needs no hold.
    ///
    /// Returns the ledger if `keep`; otherwise the report has the only reference (none is
    /// taken and dropped).
    ///
    /// Always inlined: the call, passed by value, would be copied right after its fields were
    /// written (a store-forwarding stall on every successful call).
    #[inline(always)]
    pub(crate) fn succeed(
        mut self,
        index: usize,
        dispatched: OwnTicket,
        keep: bool,
    ) -> Option<Arc<Ledger>> {
        let now = Instant::now();
        let ledger = self.ledger.get();
        ledger.end(index, AttemptEnd::Succeeded, now);
        if self.hold.is_some() || !self.parked.is_empty() || !self.held_back.is_empty() {
            let ledger = self.close_at(&Stop::Succeeded, now, Some(dispatched));
            return keep.then_some(ledger);
        }
        // Nothing else to settle (a first attempt): the same steps as `close_at`, without
        // moving the call apart.
        ledger.finish(&Stop::Succeeded, now);
        let ledger = self.ledger.0;
        let kept = keep.then(|| ledger.clone());
        self.scope.add_note(Note::new(ledger));
        dispatched.succeed();
        kept
    }

    /// Ends the call: finishes the ledger, attaches it to the scope's report and only then
    /// gives the receipts that waited for it (parked and held-back attempts) and releases the
    /// hold.
    pub(crate) fn close(self, stop: &Stop) -> Arc<Ledger> {
        self.close_at(stop, Instant::now(), None)
    }

    #[inline]
    fn close_at(self, stop: &Stop, at: Instant, winner: Option<OwnTicket>) -> Arc<Ledger> {
        let Call {
            scope,
            mut ledger,
            parked,
            held_back,
            mut hold,
            ..
        } = self;
        let success = *stop == Stop::Succeeded;
        ledger.get().finish(stop, at);
        let ledger = ledger.0;
        let ticket_held = winner.is_some() || !parked.is_empty() || !held_back.is_empty();
        if hold.is_none() && !ticket_held {
            // No attempt was registered (the first could not start): take the hold now. If the
            // scope was closed meanwhile, attach nothing, as for a call refused at `open`.
            hold = scope.tether(()).ok();
        }
        if hold.is_some() || ticket_held {
            scope.add_note(Note::new(ledger.clone()));
        }
        // Giving a receipt may make an attempt's scope quiet and wake its `quiesce()`s: the
        // panic of one of their wakers comes out once every receipt is given and the hold is
        // released (the attempts after it are not dropped into their default receipts, e.g.
        // a winner into `EffectUnknown`).
        let mut caught = Caught::default();
        for d in parked {
            caught.run(|| {
                if success {
                    d.finish(Receipt::Cancelled);
                } else if let Some(rec) = d.spec().effect_record().cloned() {
                    d.finish(Receipt::EffectUnknown(rec));
                }
            });
        }
        for (d, ending) in held_back {
            caught.run(|| ending.give(d));
        }
        if let Some(d) = winner {
            caught.run(|| d.succeed());
        }
        caught.run(|| drop(hold));
        caught.resume();
        ledger
    }

    /// Ends a call that is dropped, or unwound by a panic, before it ended: every attempt
    /// without an end is recorded ended now ([`AttemptEnd::Stopped`]; the one whose ticket the
    /// caller still holds, `in_flight`, [`AttemptEnd::Panicked`] if `panicked`), the ledger is
    /// finished with [`Stop::Dropped`] (or [`Stop::Panicked`]) and attached to the scope's
    /// report. Nothing if the call has ended already.
    ///
    /// `panicked`: user code the call ran panicked (`op`, its future, the classifier, the
    /// backoff schedule, a waker run by a receipt). A call dropped while its thread unwinds
    /// from a panic elsewhere (a `select!` branch next to it) was dropped, not panicked.
    ///
    /// Called while the call still holds its unit of the scope (see [`Call`]): the ticket of
    /// the attempt in flight (`ticket_held`; given its receipt by the caller afterwards), the
    /// hold, parked or held-back attempts (given theirs as the call's fields are dropped).
    /// Holding none, it takes the hold as [`close`](Self::close) does, and attaches nothing if
    /// the scope is closed.
    #[cold]
    #[inline(never)]
    pub(crate) fn abandon(&mut self, in_flight: Option<usize>, ticket_held: bool, panicked: bool) {
        if self.ledger.stop.is_some() {
            return;
        }
        let now = Instant::now();
        let ledger = self.ledger.get();
        for i in 0..ledger.attempts.len() {
            let end = if panicked && in_flight == Some(i) {
                AttemptEnd::Panicked
            } else {
                AttemptEnd::Stopped
            };
            ledger.end(i, end, now);
        }
        ledger.finish(
            if panicked {
                &Stop::Panicked
            } else {
                &Stop::Dropped
            },
            now,
        );
        let held = ticket_held
            || self.hold.is_some()
            || !self.parked.is_empty()
            || !self.held_back.is_empty();
        if !held {
            self.hold = self.scope.tether(()).ok();
        }
        if held || self.hold.is_some() {
            self.scope.add_note(Note::new(self.ledger.0.clone()));
        }
    }
}

/// A call from its admission to its end, in the keeping of this guard: dropped before the
/// call ended (the call's future dropped, e.g. during a backoff sleep or while a hedge's
/// attempts run, or unwound by a panic), it ends the call ([`Call::abandon`]) — before the
/// call itself is dropped, so while the call's hold, parked and held-back attempts still hold
/// the scope. Declared after the call, it is dropped before it.
///
/// [`end`](Self::end) it (no cost) before the call ends normally
/// ([`succeed`](Call::succeed), [`close`](Call::close)). Dropped, it records the call
/// [`Stop::Dropped`]: its own steps run no user code (those that do are in [`Keep`],
/// [`Attempting`] or [`user_code`](Self::user_code)), so an unwind that drops it is not the
/// call's panic.
pub(crate) struct Live<'c, 's>(&'c mut Call<'s>);

impl<'c, 's> Live<'c, 's> {
    #[inline(always)]
    pub(crate) fn new(call: &'c mut Call<'s>) -> Self {
        Live(call)
    }

    /// Gives the call back, to end it normally.
    #[inline(always)]
    pub(crate) fn end(self) {
        std::mem::forget(self);
    }

    /// Runs `f`, user code of the call that holds no ticket (the backoff schedule): if it
    /// panics, the call ends [`Stop::Panicked`] ([`Call::abandon`]).
    pub(crate) fn user_code<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let unwinding = OnUnwind(&mut *self.0);
        let r = f();
        std::mem::forget(unwinding);
        r
    }
}

/// Ends the call [`Stop::Panicked`] if dropped: forgotten unless unwinding.
struct OnUnwind<'c, 's>(&'c mut Call<'s>);

impl Drop for OnUnwind<'_, '_> {
    fn drop(&mut self) {
        self.0.abandon(None, false, true);
    }
}

/// Sets its flag if dropped: forgotten unless unwinding (so free on the normal path).
struct SetOnUnwind<'a>(&'a mut bool);

impl Drop for SetOnUnwind<'_> {
    fn drop(&mut self) {
        *self.0 = true;
    }
}

impl<'s> std::ops::Deref for Live<'_, 's> {
    type Target = Call<'s>;

    #[inline(always)]
    fn deref(&self) -> &Call<'s> {
        self.0
    }
}

impl<'s> std::ops::DerefMut for Live<'_, 's> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut Call<'s> {
        self.0
    }
}

impl Drop for Live<'_, '_> {
    fn drop(&mut self) {
        self.0.abandon(None, false, false);
    }
}

/// The ticket of a sequential call's attempt in flight, kept with the call while user code
/// runs for it (`op`, then the classifier): unwound by a panic there, it ends the call
/// ([`Call::abandon`], the ledger attached while the ticket still holds the scope), and only
/// then is the ticket dropped into its default receipt (a field is dropped after its
/// struct's `drop`). A ticket held in a local instead would be dropped first, being declared
/// after the call: the scope could be quiet before the ledger is attached (invariant 6).
pub(crate) struct Keep<'c, 's> {
    /// `None` once the ticket is handed on (to a run, or to its receipt).
    call: Option<&'c mut Call<'s>>,
    index: usize,
    ticket: OwnTicket,
}

impl<'c, 's> Keep<'c, 's> {
    #[inline(always)]
    pub(crate) fn new(call: &'c mut Call<'s>, index: usize, ticket: OwnTicket) -> Self {
        Keep {
            call: Some(call),
            index,
            ticket,
        }
    }

    /// Runs the attempt's work `fut` on the ticket (see [`OwnTicket::run`]), keeping the same
    /// promise until the work has stopped ([`Attempting`]).
    #[inline(always)]
    pub(crate) fn run<F: Future>(mut self, fut: F) -> Attempting<'c, 's, F> {
        Attempting {
            call: self.call.take(),
            index: self.index,
            panicked: false,
            run: self.ticket.take().run(fut),
        }
    }

    /// [`Call::judge`] of the attempt, whose ticket stays kept while the classifier runs.
    pub(crate) fn judge<T, E>(
        mut self,
        out: Result<Result<T, E>, Error>,
        classify: &impl Classify<E>,
        on_timeout: Decision,
    ) -> (Verdict<T>, Option<E>) {
        let Some(call) = self.call.as_deref_mut() else {
            unreachable!("a kept ticket is judged once");
        };
        let judged = call.judge(self.index, &mut self.ticket, out, classify, on_timeout);
        self.call = None;
        judged
    }
}

impl Drop for Keep<'_, '_> {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            // Armed only while user code runs (`op`, the classifier, a waker of the receipt):
            // dropped so, it is unwound by that code's panic.
            let panicked = std::thread::panicking();
            call.abandon(Some(self.index), self.ticket.is_pending(), panicked);
        }
    }
}

pin_project! {
    /// The work of a sequential call's attempt in flight, run on its ticket (an [`OwnRun`]),
    /// with the call: dropped before the work is done (the call's future dropped, e.g. by a
    /// `timeout` around it, or the work's poll panicked), it ends the call
    /// ([`Call::abandon`]) while the run still holds the ticket, and only then is the run
    /// dropped (the work stops, then the ticket records its default receipt). As for
    /// [`Keep`]: the run as a temporary of the `.await` would be dropped before the call.
    pub(crate) struct Attempting<'c, 's, F: Future> {
        // `None` once the work is done.
        call: Option<&'c mut Call<'s>>,
        index: usize,
        // A poll of the work panicked (not: dropped by an unwind from elsewhere).
        panicked: bool,
        #[pin]
        run: OwnRun<F>,
    }

    impl<'c, 's, F: Future> PinnedDrop for Attempting<'c, 's, F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(call) = this.call.take() {
                call.abandon(Some(*this.index), true, *this.panicked);
            }
        }
    }
}

impl<F: Future> Future for Attempting<'_, '_, F> {
    type Output = (Result<F::Output, Error>, OwnTicket);

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let unwinding = SetOnUnwind(this.panicked);
        let out = this.run.poll(cx);
        std::mem::forget(unwinding);
        let out = std::task::ready!(out);
        *this.call = None;
        Poll::Ready(out)
    }
}
