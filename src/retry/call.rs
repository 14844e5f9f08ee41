//! The bookkeeping of a call that the sequential retry and the hedge share: its limits, its
//! ledger, its attempts' tickets and the unit of the scope it holds until the ledger is attached.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::attempt::{attempt_budget, stop_of, Attempt, Limits, Started, Unknown, Verdict};
use super::budget::RetryBudget;
use super::classify::{Classify, Decision};
use super::ledger::Ledger;
use super::stop::{AttemptEnd, Stop};
use crate::cause::Cause;
use crate::child::{OwnTicket, Receipt};
use crate::error::Error;
use crate::guard::Tethered;
use crate::panic::Caught;
use crate::scope::{ChildBuilder, Note, Scope};
use crate::spec::{ChildSpec, Effect};
use crate::time::sleepable_after;

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
/// The same holds for a call that does not end by itself (its future dropped, or unwound by a panic
/// of user code): [`abandon`](Self::abandon) attaches the ledger before the units go. Rust's drop
/// order does not give that for free — locals are dropped in reverse order of declaration, so the
/// attempt's ticket (or the temporary of the `.await` running it) would be dropped before the call
/// — so the caller keeps the call in guards that end it in their own `drop`, before the fields
/// they guard: a hedge in [`Live`](super::call_guards::Live) for the whole call, a sequential
/// retry in its future ([`Run`](super::Run), whose drop ends the call before its attempt in flight
/// and the call are dropped) and, within a poll, in [`Keep`](super::call_guards::Keep) around the
/// ticket of the attempt in flight and [`OnUnwind`](super::call_guards::OnUnwind) around user code.
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
    /// Shadow mode: the request's would-be budget would have stopped the call, and that is
    /// recorded (once a call).
    would_have_stopped: bool,
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
            would_have_stopped: false,
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
    /// backoff sleep, so that a sleep after which nothing may start is not slept. If one could
    /// start now but not after `wait`, the wait is what stops the call
    /// ([`Stop::BackoffTooLong`]).
    pub(crate) fn check_after(&self, wait: Duration) -> Result<(), Stop> {
        // A cancel closes the watermark too: `closed` tells the two apart.
        if let Some(stop) = self.closed() {
            return Err(stop);
        }
        let left = self.scope.remaining();
        attempt_budget(&self.limits, left, self.attempts_left())?;
        let remaining = left.map(|r| r.saturating_sub(wait));
        attempt_budget(&self.limits, remaining, self.attempts_left())
            .map(|_| ())
            .map_err(|_| Stop::BackoffTooLong(wait))
    }

    /// When the next attempt may start after the dependency's pushback `hint`
    /// ([`Decision::RetryAfter`]): [`Stop::RetryAfterTooLong`] if nothing could start then (the
    /// reserve line, the minimum useful budget, or past any representable instant, in a scope
    /// without deadline), or why nothing can start at all.
    pub(crate) fn after_pushback(&self, hint: Duration) -> Result<Instant, Stop> {
        let too_long = Stop::RetryAfterTooLong(hint);
        match self.check_after(hint) {
            Err(Stop::ReserveReached | Stop::BelowMinUseful | Stop::BackoffTooLong(_)) => {
                Err(too_long)
            }
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

    /// Shadow mode: whether the request's would-be budget (`left` at `now`, within the
    /// scope's `remaining`) would have stopped the call before this attempt; recorded for the
    /// report, the attempt starting with the enforced bound. Returns the budget the attempt
    /// would have had (`None` if it would not have started). Out of line: only a shadowed
    /// request's calls come here.
    #[cold]
    #[inline(never)]
    fn shadow_stop(
        &mut self,
        remaining: Option<Duration>,
        left: Duration,
        now: Instant,
    ) -> Option<Duration> {
        let would_be = remaining.map_or(left, |r| r.min(left));
        match attempt_budget(&self.limits, Some(would_be), self.attempts_left()) {
            Ok(budget) => budget,
            Err(stop) => {
                self.would_have_stopped = true;
                let why = format!(
                    "{} before attempt {}: {stop}",
                    self.ledger.spec.name(),
                    self.started() + 1
                );
                self.scope
                    .note_would_be(crate::scope::WouldBe::retry_stopped(now, why));
                None
            }
        }
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
        let mut would_be = None;
        if !self.would_have_stopped {
            if let Some(left) = self.scope.would_be_left(now) {
                would_be = self.shadow_stop(remaining, left, now);
            }
        }
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
        let scope = ChildBuilder::attempt(self.scope, &self.ledger.spec, budget, now, would_be)
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
    /// panics, the ticket is still the caller's (see [`Keep`](super::call_guards::Keep)).
    pub(crate) fn fail<E>(
        &mut self,
        index: usize,
        dispatched: &mut OwnTicket,
        e: &E,
        classify: &impl Classify<E>,
    ) -> Decision {
        let d = classify.classify(e);
        let unknown = d.is_effect_unknown().then_some(Unknown::Reported);
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
                let unknown = d.is_effect_unknown();
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
        self.scope.add_note(Note::shown(ledger));
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
            scope.add_note(Note::shown(ledger.clone()));
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
            self.scope.add_note(Note::shown(self.ledger.0.clone()));
        }
    }
}
