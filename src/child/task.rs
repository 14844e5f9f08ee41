//! Tasks spawned into a scope.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use super::receipt::{ChildSpec, Receipt};
use super::ticket::Dispatched;
use crate::error::Error;
use crate::scope::Scope;

/// Waits for a task spawned with [`Scope::spawn`], [`Scope::spawn_blocking`] or
/// [`Scope::shield`]: yields its output, or the error that stopped it.
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
    inner: tokio::task::JoinHandle<Result<T, Error>>,
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
struct TaskReceipt(Option<Dispatched>);

impl TaskReceipt {
    fn finish(&mut self, receipt: Receipt) {
        if let Some(d) = self.0.take() {
            d.finish(receipt);
        }
    }
}

fn task_spec() -> ChildSpec {
    ChildSpec::read_only_static("task")
}

impl Scope {
    /// Spawns `fut` as a tokio task that is registered and dispatched in this scope in one
    /// step: after a cancel or close it is refused without being run.
    ///
    /// The task sees this scope as [`Scope::current`], is stopped at its next `.await` when the
    /// scope is cancelled, and ends with a receipt: `Succeeded` when `fut` completes,
    /// `Cancelled` when it was stopped, `Failed` when it panicked.
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
        let dispatched = self.register(task_spec())?.dispatch()?;
        let run = self.run(fut);
        let inner = tokio::spawn(async move {
            let mut receipt = TaskReceipt(Some(dispatched));
            let out = run.await;
            receipt.finish(match &out {
                Ok(_) => Receipt::Succeeded,
                Err(_) => Receipt::Cancelled,
            });
            out
        });
        Ok(JoinHandle { inner })
    }

    /// Runs blocking `f` on tokio's blocking pool, tracked by this scope.
    ///
    /// A cancel cannot interrupt it: if it has not finished within the grace period after a
    /// cancel, [`quiesce`](Scope::quiesce) quarantines it (receipt `Quarantined`, listed in the
    /// report) and ignores its late outcome. The handle still yields its output when it ends.
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
            let mut receipt = TaskReceipt(Some(dispatched));
            let out = scope.sync_scope(f);
            receipt.finish(Receipt::Succeeded);
            Ok(out)
        });
        Ok(JoinHandle { inner })
    }

    /// Runs cleanup that must happen even though this scope is cancelled, bounded by its own
    /// small `budget` (like Trio's shielded scopes or Kotlin's `NonCancellable`).
    ///
    /// `fut` runs as its own task under a fresh root scope with `budget` (that is what
    /// [`Scope::current`] is inside it), so it goes on when the caller is stopped; it is
    /// counted in this scope, so [`quiesce`](Scope::quiesce) waits for it. It can be started
    /// after a cancel as long as the scope is not yet quiet.
    ///
    /// # Errors
    ///
    /// The scope is already quiet (nothing of it may start any more), or — from the handle —
    /// the cleanup ran out of its `budget`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::Scope;
    ///
    /// let s = Scope::new();
    /// let work = s.register(cancel_scope::ChildSpec::read_only("request")).unwrap();
    /// s.cancel();
    /// // The request is being torn down: release its lease anyway, within 50 ms.
    /// let cleanup = s.shield(Duration::from_millis(50), async { "released" }).unwrap();
    /// drop(work);
    /// assert_eq!(cleanup.await.unwrap(), "released");
    /// # }
    /// ```
    #[track_caller]
    pub fn shield<F>(&self, budget: Duration, fut: F) -> Result<JoinHandle<F::Output>, Error>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let dispatched = self.register_shielded(ChildSpec::read_only_static("shield"))?;
        let shielded = Scope::root(
            Some(crate::scope::deadline_after(
                tokio::time::Instant::now(),
                budget,
            )),
            self.node.ext.name.clone(),
        );
        let run = shielded.run(fut);
        let inner = tokio::spawn(async move {
            let mut receipt = TaskReceipt(Some(dispatched));
            let out = run.await;
            receipt.finish(match &out {
                Ok(_) => Receipt::Succeeded,
                Err(_) => Receipt::Failed,
            });
            out
        });
        Ok(JoinHandle { inner })
    }

    /// A new root for work that must outlive this scope (e.g. sending an async message after
    /// the response): it keeps this scope's name but not its cancel, and has its own bounded
    /// budget. This is the one explicit way out of the rule that budgets only shrink.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (the new root has a deadline).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::Scope;
    /// let request = Scope::new();
    /// let outbox = request.detach(Duration::from_secs(30));
    /// request.cancel();
    /// assert!(!outbox.is_cancelled());
    /// assert_eq!(outbox.remaining(), Some(Duration::from_secs(30)));
    /// # }
    /// ```
    #[track_caller]
    pub fn detach(&self, timeout: Duration) -> Scope {
        Scope::root(
            Some(crate::scope::deadline_after(
                tokio::time::Instant::now(),
                timeout,
            )),
            self.node.ext.name.clone(),
        )
    }
}
