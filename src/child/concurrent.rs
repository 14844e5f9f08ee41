//! Concurrent registered children (hedged attempts, fan-out branches): each runs as a tokio
//! task under its own child scope and carries that scope's [`OwnTicket`], so that its receipt is
//! recorded when the work has really stopped — whoever waits for it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::task::{JoinError, JoinHandle};

use super::OwnTicket;
use crate::error::Error;
use crate::panic::Caught;
use crate::scope::Scope;

/// What a child task hands back: its ticket (to receive a receipt) and what it returned, or
/// the cancel that stopped it.
pub(crate) struct Finished<T> {
    pub(crate) dispatched: OwnTicket,
    pub(crate) out: Result<T, Error>,
}

/// A child that ended: its key, its scope, and what its task handed back (an `Err` if it
/// panicked).
pub(crate) type Ended<K, T> = (K, Scope, Result<Finished<T>, JoinError>);

/// A set of child tasks. Dropping it cancels the scopes of the children still running: they
/// stop at their next `.await` and record their receipts (no orphan attempt or branch).
pub(crate) struct InFlight<K, T> {
    tasks: Vec<(K, Scope, JoinHandle<Finished<T>>)>,
}

impl<K, T> InFlight<K, T> {
    pub(crate) fn new() -> Self {
        InFlight { tasks: Vec::new() }
    }

    pub(crate) fn len(&self) -> usize {
        self.tasks.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Runs `fut` in the scope that `dispatched` is the ticket of.
    #[track_caller]
    pub(crate) fn spawn<F>(&mut self, key: K, dispatched: OwnTicket, fut: F)
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let scope = dispatched.scope().clone();
        let run = dispatched.run(fut);
        let handle = tokio::spawn(async move {
            let (out, dispatched) = run.await;
            Finished { dispatched, out }
        });
        self.tasks.push((key, scope, handle));
    }

    /// Polls for the next child to end (pending when there is none), for the hand-written
    /// futures that wait on the set. A child that has not ended stays in the set.
    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Ended<K, T>> {
        // A handful of attempts or branches: polling each is cheaper than a JoinSet's
        // bookkeeping and keeps the key with its handle.
        let tasks = &mut self.tasks;
        for i in 0..tasks.len() {
            if let Poll::Ready(res) = Pin::new(&mut tasks[i].2).poll(cx) {
                let (key, scope, _) = tasks.swap_remove(i);
                return Poll::Ready((key, scope, res));
            }
        }
        Poll::Pending
    }

    /// Cancels every child still running, with `reason`. A cancel that panics (a waker or an
    /// `on_cancel` callback of its scope) does not keep the others running: the first panic
    /// comes out once every child is cancelled.
    pub(crate) fn cancel_all(&self, reason: &'static str) {
        let mut caught = Caught::default();
        for (_, scope, _) in &self.tasks {
            caught.run(|| scope.cancel_with(reason));
        }
        caught.resume();
    }
}

impl<K, T> Drop for InFlight<K, T> {
    fn drop(&mut self) {
        // No orphan attempt or branch.
        self.cancel_all("abandoned by its caller");
    }
}
