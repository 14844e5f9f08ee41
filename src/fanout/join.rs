//! [`Join`], the future of [`FanOut::join`]: a state machine that starts the branches, waits
//! for them, and after a failure cancels the others and collects every receipt.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::{BoxError, FanOut, FanOutError, Joined, Value};
use crate::child::{Finished, InFlight, OwnTicket, Receipt};
use crate::panic::Caught;
use crate::scope::{Cancelled, Scope};
use crate::spec::ChildSpec;

/// The future of [`FanOut::join`]: runs the branches and resolves once each has ended.
///
/// A named type, so that a struct can hold a fan-out in progress and a function can return it
/// without boxing. Like every future it does nothing until polled: the fan-out's scope is
/// built, and the first branches start, at the first poll. Dropping it cancels the branches
/// still running; each records its receipt when it has stopped (see [`FanOut::join`]).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use cancel_scope::fanout::{FanOut, Join, Required};
/// use cancel_scope::Scope;
///
/// fn price(scope: &Scope) -> (Join<'_>, Required<u32>) {
///     let mut fan = FanOut::new(scope);
///     let price = fan.required("price", |_| async { Ok::<_, std::io::Error>(1999_u32) });
///     (fan.join(), price)
/// }
///
/// let request = Scope::new();
/// let (join, handle) = price(&request);
/// assert_eq!(join.await.unwrap().required(handle), 1999);
/// # }
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct Join<'s> {
    // First, so that it is dropped first: the branches are cancelled before the fan-out's
    // closures not started yet are dropped.
    state: State,
    fan: FanOut<'s>,
}

// The state lives in the future, as an `async fn`'s would: no allocation per join.
#[allow(clippy::large_enum_variant)]
enum State {
    /// Not polled yet.
    Start,
    Running(Running),
    /// Resolved (or its poll panicked).
    Done,
}

/// A fan-out whose scope is built: its branches are queued, running or ended.
struct Running {
    fan_scope: Scope,
    /// The cancel of the fan-out's caller's scope.
    cancelled: Cancelled,
    values: Vec<Option<Value>>,
    absent: Vec<Arc<str>>,
    queue: VecDeque<usize>,
    inflight: InFlight<usize, Result<Value, BoxError>>,
    /// A user's code that panics inside `join` (a branch's constructor; a waker or an
    /// `on_cancel` callback run by a receipt or a cancel) does not cut the join short (no
    /// branch left running, none without its receipt): its panic comes out at the end.
    caught: Caught,
    /// `Some` once the fan-out has failed: the siblings are cancelled and drained.
    failure: Option<Failure>,
}

/// Why a fan-out failed, while its other branches are drained.
struct Failure {
    err: FanOutError,
    /// The scope's deadline cut the fan-out: the error names the first required branch it cut
    /// off (see [`Running::drain`]).
    at_deadline: bool,
    named: Option<(usize, FanOutError)>,
}

impl<'s> Join<'s> {
    pub(super) fn new(fan: FanOut<'s>) -> Self {
        Join {
            state: State::Start,
            fan,
        }
    }
}

impl Future for Join<'_> {
    type Output = Result<Joined, FanOutError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        // A poll that unwinds (a task spawned outside a runtime) ends the join as it is: the
        // branches still running are cancelled and record their receipts.
        let done_on_unwind = DoneOnUnwind(&mut this.state);
        let out = step(&mut this.fan, done_on_unwind.0, cx);
        std::mem::forget(done_on_unwind);
        out
    }
}

/// Sets its state [`State::Done`] if dropped: forgotten unless unwinding.
struct DoneOnUnwind<'a>(&'a mut State);

impl Drop for DoneOnUnwind<'_> {
    fn drop(&mut self) {
        *self.0 = State::Done;
    }
}

fn step(
    fan: &mut FanOut<'_>,
    state: &mut State,
    cx: &mut Context<'_>,
) -> Poll<Result<Joined, FanOutError>> {
    if let State::Start = state {
        match start(fan) {
            Ok(running) => *state = State::Running(running),
            Err(out) => {
                *state = State::Done;
                return Poll::Ready(out);
            }
        }
    }
    let State::Running(running) = state else {
        panic!("`Join` polled after completion");
    };
    if running.failure.is_none() {
        if let Some(failure) = running.run(fan, cx) {
            running.fail(failure);
        } else if running.inflight.is_empty() {
            let State::Running(running) = std::mem::replace(state, State::Done) else {
                unreachable!();
            };
            running.caught.resume();
            return Poll::Ready(Ok(Joined {
                fan: fan.id,
                values: running.values,
                absent: running.absent,
            }));
        } else {
            return Poll::Pending;
        }
    }
    std::task::ready!(running.drain(fan, cx));
    let State::Running(running) = std::mem::replace(state, State::Done) else {
        unreachable!();
    };
    let Some(failure) = running.failure else {
        unreachable!("a drained fan-out has failed");
    };
    let err = failure.named.map_or(failure.err, |(_, e)| e);
    running.caught.resume();
    Poll::Ready(Err(err))
}

/// Builds the fan-out's scope, or ends the join at once.
fn start(fan: &FanOut<'_>) -> Result<Running, Result<Joined, FanOutError>> {
    let scope = fan.scope;
    let values: Vec<Option<Value>> = (0..fan.branches.len()).map(|_| None).collect();
    let fan_scope = match scope.child().name("fan-out").reserve(fan.reserve).build() {
        Ok(fan_scope) => fan_scope,
        // The reserve leaves no budget (the scope itself has some: it has not run out of
        // time): every branch would fail to start, and optional ones are then absent, as
        // when they are queued past their cut-off. Nothing was registered.
        Err(e)
            if e.is_budget_exhausted()
                && scope.remaining().is_none_or(|r| !r.is_zero())
                && fan.branches.iter().all(|b| !b.required) =>
        {
            return Err(Ok(Joined {
                fan: fan.id,
                values,
                absent: fan.branches.iter().map(|b| b.name.clone()).collect(),
            }));
        }
        Err(e) => return Err(Err(FanOutError::not_started(None, e))),
    };
    Ok(Running {
        fan_scope,
        cancelled: scope.cancelled(),
        values,
        absent: Vec::new(),
        queue: (0..fan.branches.len()).collect(),
        inflight: InFlight::new(),
        caught: Caught::default(),
        failure: None,
    })
}

impl Running {
    /// Starts branches up to the limit and collects those that end, until a failure (`Some`)
    /// or until nothing more is ready (`None`; done if nothing is in flight).
    fn run(&mut self, fan: &mut FanOut<'_>, cx: &mut Context<'_>) -> Option<FanOutError> {
        loop {
            while self.inflight.len() < fan.limit {
                let Some(i) = self.queue.pop_front() else {
                    break;
                };
                let branch = &mut fan.branches[i];
                // Named after the branch by its ticket (see `build_dispatched`).
                let mut child = self.fan_scope.child().min_useful(fan.min_useful);
                if !branch.required {
                    child = child.reserve(fan.aggregate);
                }
                // The branch's scope is also its ticket, dispatched in the fan-out's scope.
                let started = child
                    .build_dispatched(&ChildSpec::read_only(branch.name.clone()))
                    .map(OwnTicket::new);
                match (started, branch.start.take()) {
                    (Ok(dispatched), Some(start)) => {
                        let scope = dispatched.scope().clone();
                        if let Some(fut) = self.caught.run(|| start(scope)) {
                            self.inflight.spawn(i, dispatched, fut);
                        } else {
                            // Its constructor panicked: the branch failed, and the fan-out
                            // ends as for a failed required branch (optional or not: the panic
                            // is the caller's own and comes out of `join`, so nobody would see
                            // the other branches' results): the siblings are cancelled and
                            // awaited, then the panic goes on.
                            self.caught.run(|| dispatched.fail());
                            return Some(FanOutError::panicked(branch.name.clone()));
                        }
                    }
                    (Err(e), _) if branch.required => {
                        return Some(FanOutError::not_started(Some(branch.name.clone()), e));
                    }
                    _ => self.absent.push(branch.name.clone()),
                }
            }
            if self.inflight.is_empty() {
                return None;
            }
            // The scope's cancel is seen before the next branch's end.
            if let Poll::Ready(cause) = self.cancelled.poll_cancelled(cx) {
                return Some(FanOutError::cancelled(cause));
            }
            let Poll::Ready((i, _, res)) = self.inflight.poll_next(cx) else {
                return None;
            };
            let branch = &fan.branches[i];
            match settle(&branch.name, res, &mut self.caught) {
                Ok(v) => self.values[i] = Some(v),
                Err(e) if branch.required => return Some(e),
                Err(_) => self.absent.push(branch.name.clone()),
            }
        }
    }

    /// Ends the run with `err`: cancels the siblings, which [`drain`](Self::drain) collects.
    fn fail(&mut self, err: FanOutError) {
        // The scope's deadline (this fan-out's, with no reserve) cut the required branches
        // still running, as a reserve's earlier deadline would: the error names the first
        // of them in declaration order, with its own end (stopped by the deadline, or its
        // error in the same instant), not just "the fan-out was cancelled".
        let at_deadline =
            err.branch().is_none() && err.is_cancelled() && err.is_deadline_exceeded();
        self.failure = Some(Failure {
            err,
            at_deadline,
            named: None,
        });
        let fan_scope = &self.fan_scope;
        self.caught
            .run(|| fan_scope.cancel_with("a required branch failed"));
    }

    /// Waits for the receipts of the branches still running after a failure.
    fn drain(&mut self, fan: &FanOut<'_>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(failure) = self.failure.as_mut() else {
            unreachable!("only a failed fan-out is drained");
        };
        while !self.inflight.is_empty() {
            let (i, _, res) = std::task::ready!(self.inflight.poll_next(cx));
            let branch = &fan.branches[i];
            if let Err(e) = settle(&branch.name, res, &mut self.caught) {
                if failure.at_deadline
                    && branch.required
                    && failure.named.as_ref().is_none_or(|n| i < n.0)
                {
                    failure.named = Some((i, e));
                }
            }
        }
        Poll::Ready(())
    }
}

/// Gives the receipt of a branch that ended (`res`, from its task) and returns its value, or
/// the error that names it (failed, stopped by a cancel, panicked). A waker's or callback's
/// panic run by the receipt is kept in `caught`.
fn settle(
    name: &Arc<str>,
    res: Result<Finished<Result<Value, BoxError>>, tokio::task::JoinError>,
    caught: &mut Caught,
) -> Result<Value, FanOutError> {
    match res {
        Ok(Finished {
            dispatched,
            out: Ok(Ok(v)),
        }) => {
            caught.run(|| dispatched.succeed());
            Ok(v)
        }
        Ok(Finished {
            dispatched,
            out: Ok(Err(e)),
        }) => {
            caught.run(|| dispatched.fail());
            Err(FanOutError::failed(name.clone(), e))
        }
        Ok(Finished {
            dispatched,
            out: Err(stopped),
        }) => {
            caught.run(|| dispatched.finish(Receipt::Cancelled));
            let cause = stopped.cause().cloned();
            let cause = cause.unwrap_or(crate::Cause::Cancelled { reason: None });
            Err(FanOutError::stopped(name.clone(), cause))
        }
        // Its ticket was dropped with the task: its default receipt is recorded.
        Err(_) => Err(FanOutError::panicked(name.clone())),
    }
}

impl fmt::Debug for Join<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (state, running) = match &self.state {
            State::Start => ("not started", 0),
            State::Running(r) if r.failure.is_some() => ("draining", r.inflight.len()),
            State::Running(r) => ("running", r.inflight.len()),
            State::Done => ("done", 0),
        };
        f.debug_struct("Join")
            .field("fan", &self.fan)
            .field("state", &state)
            .field("running", &running)
            .finish()
    }
}
