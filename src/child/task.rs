//! Tasks spawned into a scope.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::failure::Failure;
use super::receipt::Receipt;
use super::ticket::Dispatched;
use crate::error::Error;
use crate::scope::{with_current, Scope};
use crate::spec::{task_spec, ChildSpec};
use crate::time::now_stamp;
use crate::tree::{self, Kind, TaskKey};

/// Waits for a task spawned with [`Scope::spawn`], [`Scope::spawn_fallible`],
/// [`Scope::spawn_blocking`] or [`Scope::shield`]: yields its output, or the error that
/// stopped it.
///
/// Dropping the handle does not stop the task (it is stopped by its scope).
///
/// # Cancel safety
///
/// Cancel safe: the task keeps running and keeps its receipt.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use cancel_scope::Scope;
/// let s = Scope::new();
/// let h = s.spawn(async { 1 + 1 }).unwrap();
/// assert_eq!(h.await.unwrap(), 2);
/// # }
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct JoinHandle<T> {
    pub(super) inner: tokio::task::JoinHandle<Result<T, Error>>,
}

impl<T> JoinHandle<T> {
    /// Stops the task now (its receipt is [`Receipt::Cancelled`]); blocking tasks cannot be
    /// stopped this way.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// let h = s.spawn(std::future::pending::<()>()).unwrap();
    /// h.abort();
    /// assert!(h.await.unwrap_err().is_cancelled());
    /// # }
    /// ```
    pub fn abort(&self) {
        self.inner.abort();
    }

    /// Whether the task has finished.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::Scope;
    /// let h = Scope::new().spawn(async {}).unwrap();
    /// tokio::task::yield_now().await;
    /// assert!(h.is_finished());
    /// # }
    /// ```
    pub fn is_finished(&self) -> bool {
        self.inner.is_finished()
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.inner).poll(cx).map(|r| match r {
            Ok(out) => out,
            Err(e) if e.is_panic() => Err(Error::panicked()),
            Err(_) => Err(Error::cancelled(crate::Cause::Cancelled { reason: None })),
        })
    }
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle")
            .field("finished", &self.inner.is_finished())
            .finish()
    }
}

/// Receipt of a task: `Failed` if it unwinds, `Cancelled` if it is dropped (abort, runtime
/// shutdown) — both through `Dispatched`'s drop.
pub(super) struct TaskReceipt(pub(super) Option<Dispatched>);

impl TaskReceipt {
    pub(super) fn finish(&mut self, receipt: Receipt) {
        if let Some(d) = self.0.take() {
            d.finish(receipt);
        }
    }

    /// See [`Dispatched::finish_unknown`].
    pub(super) fn finish_unknown(&mut self, effects: &[ChildSpec]) {
        if let Some(d) = self.0.take() {
            d.finish_unknown(effects);
        }
    }
}

/// How a task's output decides its receipt.
trait Outcome<T> {
    /// The text of the error an output that is a failure carries (`None`: it succeeded). Runs
    /// the user's `Display`, while the task's work is polled (a panic there is the task's).
    fn failure(out: &T) -> Option<String>;
}

/// [`Scope::spawn`]: a task that completes has succeeded, whatever it returned.
enum Completion {}

impl<T> Outcome<T> for Completion {
    #[inline(always)]
    fn failure(_: &T) -> Option<String> {
        None
    }
}

/// [`Scope::spawn_fallible`]: a task that returns `Err` has failed, with that error.
enum ResultOf {}

impl<T, E: fmt::Display> Outcome<Result<T, E>> for ResultOf {
    fn failure(out: &Result<T, E>) -> Option<String> {
        out.as_ref().err().map(ToString::to_string)
    }
}

pin_project! {
    /// The future of a task spawned with [`Scope::spawn`] (or [`Scope::spawn_fallible`]: `O`
    /// says how its output decides its receipt): runs `fut` with the scope current, stops it
    /// when the scope is cancelled, and records the task's receipt.
    ///
    /// One struct instead of nested `async` blocks: it holds one handle of the scope (moved
    /// into the current-scope slot for each poll) and the task's in-flight key, so the task
    /// that tokio allocates and moves stays small.
    struct Task<F, O> {
        // `None` once stopped: the work is dropped before its receipt is recorded, as a
        // stopped child must have stopped before it is counted (invariant 6).
        #[pin]
        fut: Option<F>,
        // The task's handle of its scope: in the current-scope slot while `fut` is polled or
        // dropped, here otherwise.
        scope: Option<Scope>,
        // Its place in the scope's in-flight list: counted until its first `Pending`, then an
        // entry that holds its waker while it waits (for the scope's cancel); `None` once the
        // receipt is recorded (with `fut`).
        task: Option<TaskKey>,
        // Set while `fut` is polled: if the task is dropped with it set, that poll unwound,
        // and the receipt is `Failed`.
        polling: bool,
        outcome: PhantomData<fn() -> O>,
    }

    impl<F, O> PinnedDrop for Task<F, O> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(task) = this.task.take() {
                // Aborted, dropped by a runtime shutting down, or unwound from a poll.
                let kind = if *this.polling { Kind::Failed } else { Kind::Cancelled };
                stop(this.fut, this.scope, task, kind);
            }
        }
    }
}

/// Stops a task's work and then records its receipt, `kind` (invariant 6: a child has stopped
/// before it is counted). The work is dropped with the scope current, as it ran; if its drop
/// panics, the receipt is `Failed` and the panic goes on once it is recorded.
fn stop<F>(mut fut: Pin<&mut Option<F>>, scope: &mut Option<Scope>, task: TaskKey, kind: Kind) {
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        with_current(scope, || fut.set(None));
    }));
    let Some(scope) = scope.as_ref() else {
        unreachable!("the scope is back after the drop");
    };
    let kind = if dropped.is_err() { Kind::Failed } else { kind };
    // Invariant 5: unless a quarantine took the task out of the list first.
    tree::record_task_receipt(&scope.node, task, kind, true, now_stamp);
    if let Err(panic) = dropped {
        std::panic::resume_unwind(panic);
    }
}

/// What a task's work ended with: its output, the panic of its drop if any, and the error of
/// an output that is a failure (see [`Outcome`]).
type Ended<T> = (T, std::thread::Result<()>, Option<String>);

/// Polls a task's work; the caller has made its scope current. Work that finishes is dropped
/// at once, still with its scope current, as [`stop`] would drop it (with one swap of the
/// current scope per task instead of two); the drop's panic, if any, is returned with the
/// output, and so is the error of an output that is a failure.
fn poll_work<F: Future, O: Outcome<F::Output>>(
    mut fut: Pin<&mut Option<F>>,
    cx: &mut Context<'_>,
) -> Poll<Ended<F::Output>> {
    let Some(work) = fut.as_mut().as_pin_mut() else {
        unreachable!("checked before the poll");
    };
    let out = std::task::ready!(work.poll(cx));
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.set(None)));
    let failure = O::failure(&out);
    Poll::Ready((out, dropped, failure))
}

impl<F: Future, O: Outcome<F::Output>> Future for Task<F, O> {
    type Output = Result<F::Output, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Some(scope) = this.scope.as_ref() else {
            unreachable!("the scope is back after every poll");
        };
        // A cancelled scope never polls its work again (invariant 2): one load decides.
        if !tree::task_cancelled(&scope.node) {
            assert!(this.fut.is_some(), "a scope task polled after it completed");
            let fut = this.fut.as_mut();
            *this.polling = true;
            let polled = with_current(this.scope, || poll_work::<F, O>(fut, cx));
            *this.polling = false;
            let Some(scope) = this.scope.as_ref() else {
                unreachable!("the scope is back after every poll");
            };
            match polled {
                // The work has finished and is dropped (invariant 6: stopped before it is
                // counted); if its drop panicked, the receipt is `Failed` and the panic goes
                // on once it is recorded. So it is if it returned a failure, whose error is
                // attached to the report with the receipt.
                Poll::Ready((out, dropped, failure)) => {
                    let kind = if dropped.is_ok() && failure.is_none() {
                        Kind::Succeeded
                    } else {
                        Kind::Failed
                    };
                    if let Some(task) = this.task.take() {
                        // Invariant 5: unless a quarantine took the task first (then its late
                        // failure is not attached either: the report may be final already).
                        let listed = || {
                            if let Some(error) = failure {
                                let child = task_spec().shared_name();
                                scope.add_note(Failure::note(scope, child, error));
                            }
                        };
                        tree::record_task_receipt_and(
                            &scope.node,
                            task,
                            kind,
                            true,
                            now_stamp,
                            listed,
                        );
                    }
                    if let Err(panic) = dropped {
                        std::panic::resume_unwind(panic);
                    }
                    return Poll::Ready(Ok(out));
                }
                // Pending: only now leave the waker for the cancel (work that finishes on its
                // first poll never does). A cancel that came meanwhile is seen. The first
                // `Pending` lists the task, with its waker (one lock): until then it was only
                // counted (no lock), and a quarantine still finds it if its first poll is stuck.
                Poll::Pending => {
                    let Some(task) = this.task.as_mut() else {
                        unreachable!("the task's entry goes with the future");
                    };
                    if !tree::poll_cancel_task(&scope.node, task, cx.waker()) {
                        return Poll::Pending;
                    }
                }
            }
        }
        // Cancelled (before this poll, or while the work waited) or quarantined: stopped.
        let Some(scope) = this.scope.as_ref() else {
            unreachable!("the scope is back after every poll");
        };
        let err = cancel_error(scope);
        if let Some(task) = this.task.take() {
            stop(this.fut, this.scope, task, Kind::Cancelled);
        }
        Poll::Ready(Err(err))
    }
}

pub(super) fn cancel_error(scope: &Scope) -> Error {
    Error::cancelled(scope.cause_or_cancelled())
}

impl Scope {
    /// Spawns `fut` as a tokio task that is registered and dispatched in this scope in one
    /// step: after a cancel or close it is refused without being run.
    ///
    /// The task sees this scope as [`Scope::current`], is stopped at its next `.await` when the
    /// scope is cancelled, and ends with a receipt: `Succeeded` when `fut` completes (whatever
    /// it returns: for a task whose `Err` is a failure, see
    /// [`spawn_fallible`](Scope::spawn_fallible)), `Cancelled` when it was stopped, `Failed`
    /// when it panicked.
    ///
    /// # Errors
    ///
    /// [`Error::is_cancelled`] / [`Error::is_closed`]: the scope accepts no new work.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// let h = s.spawn(async { Scope::current().name().map(str::to_owned) }).unwrap();
    /// assert_eq!(h.await.unwrap(), None);
    ///
    /// s.cancel();
    /// assert!(s.spawn(async {}).unwrap_err().is_cancelled());
    /// # }
    /// ```
    #[track_caller]
    pub fn spawn<F>(&self, fut: F) -> Result<JoinHandle<F::Output>, Error>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let inner = tokio::spawn(self.task::<F, Completion>(fut)?);
        Ok(JoinHandle { inner })
    }

    /// Spawns `fut`, which returns a `Result`, as [`spawn`](Scope::spawn) does, with a receipt
    /// that follows the result: `Succeeded` for `Ok`, `Failed` for `Err` — and the error's
    /// text listed, with the scope's name, in the report of this scope and of every scope
    /// above it ([`Report::failures`](crate::Report::failures); the receipt itself carries
    /// nothing) — besides `Cancelled` when it was stopped and `Failed` when it panicked.
    ///
    /// The handle yields what `fut` returned, the error value itself included, or the error
    /// that stopped the task. A quarantined task's late `Err` is neither its receipt nor in the
    /// report (the report may be final already).
    ///
    /// # Errors
    ///
    /// [`Error::is_cancelled`] / [`Error::is_closed`]: the scope accepts no new work.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// let ok = s.spawn_fallible(async { Ok::<_, std::io::Error>(7) }).unwrap();
    /// assert_eq!(ok.await.unwrap().unwrap(), 7);
    /// let bad = s.spawn_fallible(async { "x".parse::<u32>() }).unwrap();
    /// assert!(bad.await.unwrap().is_err()); // the error, for the caller...
    ///
    /// s.close();
    /// let report = s.quiesce().await;
    /// assert_eq!((report.succeeded(), report.failed()), (1, 1));
    /// assert_eq!(report.failures()[0].error(), "invalid digit found in string"); // ...and the report
    /// # }
    /// ```
    #[track_caller]
    pub fn spawn_fallible<F, T, E>(&self, fut: F) -> Result<JoinHandle<Result<T, E>>, Error>
    where
        F: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let inner = tokio::spawn(self.task::<F, ResultOf>(fut)?);
        Ok(JoinHandle { inner })
    }

    /// The future of a task: registered and dispatched, not spawned yet.
    fn task<F: Future, O>(&self, fut: F) -> Result<Task<F, O>, Error> {
        let task = self.register_task()?;
        Ok(Task {
            fut: Some(fut),
            scope: Some(self.clone()),
            task: Some(task),
            polling: false,
            outcome: PhantomData,
        })
    }

    /// What [`spawn`](Scope::spawn) would run as the task, registered and dispatched but not
    /// spawned: for the loom models, which have no runtime to spawn on (polling it is running
    /// the task; dropping it unpolled is aborting it).
    #[doc(hidden)]
    #[cfg(any(test, feature = "__test-hooks"))]
    pub fn __task<F: Future>(
        &self,
        fut: F,
    ) -> Result<impl Future<Output = Result<F::Output, Error>>, Error> {
        self.task::<F, Completion>(fut)
    }

    /// Registers a task and dispatches it at once.
    ///
    /// One CAS on the scope's state word takes the unit and dispatches (see
    /// `tree::register_task`, invariant 2). Then, as [`Ticket::dispatch`](super::Ticket::dispatch)
    /// does, a deadline that has passed is made the cancel and the task is refused, with a
    /// `Cancelled` receipt (registered, never run): nothing is sent at or after its deadline.
    fn register_task(&self) -> Result<TaskKey, Error> {
        let task = tree::register_task(&self.node)?;
        if !self.expire_if_passed() {
            return Ok(task);
        }
        tree::record_task_receipt(&self.node, task, Kind::Cancelled, false, now_stamp);
        Err(cancel_error(self))
    }

    /// Runs blocking `f` on tokio's blocking pool, tracked by this scope.
    ///
    /// A cancel cannot interrupt it once it runs: if it has not finished within the grace
    /// period after a cancel, [`quiesce`](Scope::quiesce) quarantines it (receipt
    /// `Quarantined`, listed in the report) and ignores its late outcome. The handle still
    /// yields its output when it ends. One still waiting for a thread of the blocking pool when
    /// the scope is cancelled never starts (receipt `Cancelled` unless it was quarantined
    /// first; the handle yields [`Error::is_cancelled`]).
    ///
    /// # Errors
    ///
    /// [`Error::is_cancelled`] / [`Error::is_closed`]: the scope accepts no new work.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// let h = s.spawn_blocking(|| 6 * 7).unwrap();
    /// assert_eq!(h.await.unwrap(), 42);
    /// # }
    /// ```
    #[track_caller]
    pub fn spawn_blocking<F, T>(&self, f: F) -> Result<JoinHandle<T>, Error>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let dispatched = self
            .register(ChildSpec::read_only_static("blocking"))?
            .dispatch()?;
        let scope = self.clone();
        let inner = tokio::task::spawn_blocking(move || {
            // Still queued for a thread when the scope was cancelled (and perhaps quarantined,
            // `quiesce()` resolved): it never starts, as a task is not polled after the cancel
            // (invariants 2, 6). The quarantine's receipt, if it came first, stands.
            if dispatched.is_quarantined() || scope.is_cancelled() {
                let err = cancel_error(&scope);
                dispatched.finish(Receipt::Cancelled);
                return Err(err);
            }
            let mut receipt = TaskReceipt(Some(dispatched));
            let out = with_current(&mut Some(scope), f);
            receipt.finish(Receipt::Succeeded);
            Ok(out)
        });
        Ok(JoinHandle { inner })
    }
}
