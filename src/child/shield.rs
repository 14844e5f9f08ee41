//! Shielded cleanup: work that must happen although its scope is cancelled, under a root of
//! its own with its own small budget, still counted (and, past the grace period, quarantined)
//! in the scope.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use pin_project_lite::pin_project;

use super::receipt::Receipt;
use super::task::{cancel_error, JoinHandle, TaskReceipt};
use crate::error::Error;
use crate::panic::contain_panic;
use crate::scope::Scope;
use crate::spec::{task_spec, ChildSpec};
use crate::time::now_stamp;
use crate::tree;
use crate::Cause;

/// The reason of the cancel of a quarantined shield's own scope.
const SHIELD_QUARANTINED: &str = "the shield was quarantined";

/// The waker a shield's task leaves for the quarantine of its child (see [`Shielded`]).
struct ShieldStop {
    root: Scope,
    /// The scope the shield is a child of: where the effects the cleanup left open in `root`
    /// are noted when the shield is quarantined. Weak: this waker is kept in the shield's
    /// ticket, which that scope lists.
    parent: crate::sync::Weak<crate::scope::Core>,
    /// The task's own waker, woken after the cancel.
    task: crate::sync::Mutex<Option<Waker>>,
}

impl ShieldStop {
    /// The stop of a shield of `parent` whose cleanup runs under `root`.
    fn new(root: Scope, parent: &Scope) -> std::sync::Arc<ShieldStop> {
        std::sync::Arc::new(ShieldStop {
            root,
            parent: crate::sync::downgrade(&parent.node),
            task: crate::sync::Mutex::new(None),
        })
    }

    fn set_task_waker(&self, waker: &Waker) {
        let mut kept = self.task.lock();
        let old = tree::keep_waker(&mut kept, waker);
        drop(kept);
        drop(old);
    }
}

impl std::task::Wake for ShieldStop {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        // Called by the quarantine, before the scope it quarantines can be quiet. A panic of
        // an `on_cancel` callback in the shield's scope must not cut the quarantine short:
        // contained and dropped, as the deadline timer does.
        let root = &self.root;
        contain_panic(|| {
            root.cancel_because(Cause::cancelled(SHIELD_QUARANTINED));
        });
        // The cleanup's work is quarantined with it: whatever in the cleanup's scope has no
        // receipt yet is decided now. An effect left open there (a call dispatched and not
        // answered) may still commit, so it is the parent's pending effect, in the report the
        // quarantine is about to make final (its receipt is `Quarantined`, and the shield is
        // read-only: without this the report would count the effect as none).
        //
        // The cleanup's scope is another tree: the parent's quiet does not wait for its
        // receipts. One that its owner on another thread (or the cleanup scope's own
        // `quiesce()`) has won but not recorded yet would land in the cleanup's records after
        // they are read here: such a receipt in progress on a child that may have had an
        // effect counts as a pending effect (a false alarm if it succeeded, never a lost
        // effect; loom models 43–45). The walk finds those; the records are read after it.
        let mut in_progress = Vec::new();
        contain_panic(|| {
            let stamp = now_stamp();
            tree::quarantine_subtree_noting(&root.node, &task_spec(), stamp, &mut in_progress);
        });
        in_progress.retain(|child| child.effect().may_have_effect());
        let mut unknown = in_progress;
        unknown.extend(root.unknown_effects());
        if let Some(parent) = self.parent.upgrade().filter(|_| !unknown.is_empty()) {
            tree::note_effects(&parent, &unknown);
        }
        let task = self.task.lock().take();
        if let Some(w) = task {
            w.wake();
        }
    }
}

pin_project! {
    /// The task of a [`Scope::shield`]: runs the cleanup (under its own root scope) until it
    /// ends or its child is quarantined, and then stops it and cancels its root (invariant 6:
    /// once `quiesce()` resolved, the cleanup is not polled again, nor is anything it
    /// started; a poll already under way on another thread may still finish, as for any
    /// quarantined child).
    struct Shielded<F: Future> {
        #[pin]
        run: Option<F>,
        // The cleanup's outcome once it returned, kept while the work it started in its own
        // scope (closed then) is waited for: that work is part of the cleanup (invariant 6).
        out: Option<F::Output>,
        // The quiescence of the cleanup's own scope, once the cleanup returned.
        quiet: Option<crate::scope::Quiet>,
        // What the quarantine wakes: it cancels the cleanup's own root scope at once, so that
        // work the cleanup started there (what `Scope::current()` is inside it) stops too,
        // and then wakes this task.
        stop: std::sync::Arc<ShieldStop>,
        stop_waker: Waker,
        receipt: TaskReceipt,
    }
}

impl<F, T> Future for Shielded<F>
where
    F: Future<Output = Result<T, Error>>,
{
    type Output = Result<T, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Some(dispatched) = &this.receipt.0 else {
            unreachable!("a shield polled after it ended");
        };
        this.stop.set_task_waker(cx.waker());
        if dispatched.poll_quarantined(this.stop_waker) {
            let err = dispatched.quarantined_error();
            // Stopped (its root was cancelled by the quarantine); the quarantine recorded the
            // receipt (the late one is ignored).
            this.run.set(None);
            *this.out = None;
            *this.quiet = None;
            this.receipt.0 = None;
            return Poll::Ready(Err(err));
        }
        if this.out.is_none() {
            let Some(run) = this.run.as_mut().as_pin_mut() else {
                unreachable!("the cleanup goes with the receipt");
            };
            let out = std::task::ready!(run.poll(cx));
            this.run.set(None);
            *this.out = Some(out);
            // Work the cleanup started in its own scope and left running is still the
            // cleanup's: the receipt waits until that scope is quiet (its budget bounds it).
            this.stop.root.close();
            *this.quiet = Some(this.stop.root.quiet());
        }
        let Some(quiet) = this.quiet.as_mut() else {
            unreachable!("the cleanup's scope is waited for once it returned");
        };
        std::task::ready!(Pin::new(quiet).poll(cx));
        *this.quiet = None;
        let Some(out) = this.out.take() else {
            unreachable!("the cleanup's outcome is kept until its scope is quiet");
        };
        // The cleanup ran under its own root scope: an effect it left unknown there (a call
        // cut off by the shield's budget) is this child's, and never counts as none.
        let unknown = this.stop.root.unknown_effects();
        if unknown.is_empty() {
            this.receipt.finish(match &out {
                Ok(_) => Receipt::Succeeded,
                Err(_) => Receipt::Failed,
            });
        } else {
            this.receipt.finish_unknown(&unknown);
        }
        Poll::Ready(out)
    }
}

impl Scope {
    /// Runs cleanup that must happen even though this scope is cancelled, bounded by its own
    /// small `budget` (like Trio's shielded scopes or Kotlin's `NonCancellable`).
    ///
    /// `fut` runs as its own task under a fresh root scope with `budget` (that is what
    /// [`Scope::current`] is inside it; it keeps this scope's name and the operation identity
    /// of its request, as [`detach`](Scope::detach) does), so it goes on when the caller is
    /// stopped; it is counted in this scope, so [`quiesce`](Scope::quiesce) waits for it. It
    /// can be started after a cancel as long as the scope is not yet quiet (and its grace
    /// period has not ended). Keep `budget` within the scope's grace period
    /// ([`DEFAULT_CLEANUP_BUDGET`](crate::DEFAULT_CLEANUP_BUDGET) is within the default one,
    /// [`DEFAULT_GRACE`](crate::DEFAULT_GRACE)): a cleanup still running when the grace period
    /// after the cancel ends is quarantined like any other child, and stopped (after
    /// `quiesce` nothing of the scope may commit). A cleanup that
    /// ends with effects left unknown in its own scope (a call cut off by `budget`) ends
    /// [`Receipt::EffectUnknown`], and those effects are this scope's pending effects; so are
    /// the effects a quarantined cleanup left open (dispatched, not answered), which may still
    /// commit (its work is quarantined with it, and the report is `NeedsReconciliation`). A
    /// child of the cleanup that may have had an effect and whose receipt was being recorded
    /// (on another thread, or by the cleanup scope's own `quiesce`) as the quarantine came
    /// counts as a pending effect too: a false alarm if it turns out to have succeeded, never
    /// a lost effect. Work
    /// the cleanup started in its own scope is part of it: the cleanup ends (its handle
    /// resolves, its receipt is recorded) once that work has ended too.
    ///
    /// # Errors
    ///
    /// The scope is already quiet (nothing of it may start any more), or its grace period
    /// (or that of a cancelled ancestor) has ended, whether or not a `quiesce` has run
    /// since ([`Error::is_cancelled`]); from the handle: the cleanup ran out of its `budget`
    /// ([`Error::is_deadline_exceeded`]) or was quarantined ([`Error::is_cancelled`]).
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
        // Too late once a grace period over this scope has ended, even if no `quiesce` has
        // quarantined its work yet: the first one would at once.
        if self.grace_ended() {
            return Err(cancel_error(self));
        }
        let dispatched = self.register_shielded(ChildSpec::read_only_static("shield"))?;
        // The cleanup is still the request's: its operation identity (and priority) go with
        // it, as with `detach`; the cancel does not.
        // And its effect flag: an effectful call the cleanup dispatches is the request's.
        // Its own budget bounds its children in every mode: not the request's shadow state.
        let shielded = Scope::root_after(
            tokio::time::Instant::now(),
            budget,
            self.shared_name(),
            self.context().map(crate::scope::unshadowed),
            self.effect_flag().cloned(),
        );
        let run = shielded.run(fut);
        let stop = ShieldStop::new(shielded, self);
        let inner = tokio::spawn(Shielded {
            run: Some(run),
            out: None,
            quiet: None,
            stop_waker: Waker::from(stop.clone()),
            stop,
            receipt: TaskReceipt(Some(dispatched)),
        });
        Ok(JoinHandle { inner })
    }

    /// A shield's child of this scope whose cleanup runs under `cleanup` (a root), with the
    /// shield's stop armed on it as its task arms it, but no task, no budget and no timer: the
    /// quarantine of this scope then stops `cleanup` and notes its open effects here as
    /// [`shield`](Scope::shield)'s does. For the loom models; the returned ticket is the
    /// shield's receipt side.
    #[doc(hidden)]
    #[cfg(any(test, feature = "__test-hooks"))]
    pub fn __shield_of(&self, cleanup: &Scope) -> Result<super::Dispatched, Error> {
        let dispatched = self.register_shielded(ChildSpec::read_only_static("shield"))?;
        let stop = Waker::from(ShieldStop::new(cleanup.clone(), self));
        if dispatched.poll_quarantined(&stop) {
            stop.wake();
        }
        Ok(dispatched)
    }

    /// A new root for work that must outlive this scope (e.g. sending an async message after
    /// the response): it keeps this scope's name and the operation identity of its request
    /// ([`Scope::operation`], if the request was admitted) but not its cancel, and has its own
    /// bounded budget. This is the one explicit way out of the rule that budgets only shrink.
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
        // A new operation: the request's effect flag stays behind (what the detached work
        // does is not what the request's answer says).
        Scope::root_after(
            tokio::time::Instant::now(),
            timeout,
            self.shared_name(),
            self.context().map(crate::scope::unshadowed),
            None,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{ChildSpec, Dispatched, EffectRecord, JoinHandle, Lifecycle, Receipt, Scope};

    /// A shield of `scope` whose cleanup dispatches a call described by `spec` in its own
    /// scope and then waits for ever; the call's handle.
    async fn shield_calling(scope: &Scope, spec: ChildSpec) -> (JoinHandle<()>, Dispatched) {
        let (sent, call) = tokio::sync::oneshot::channel();
        let cleanup = scope
            .shield(Duration::from_secs(60), async move {
                let call = Scope::current().register(spec).unwrap().dispatch().unwrap();
                sent.send(call).unwrap();
                std::future::pending::<()>().await;
            })
            .unwrap();
        (cleanup, call.await.unwrap())
    }

    /// A quarantined shield's report keeps an effect whose receipt its owner has won but not
    /// recorded yet when the quarantine stops the cleanup (loom model 43 explores every
    /// interleaving; here the owner is held between its two steps): the call may have
    /// charged, so the scope's report lists it (before, it said `CancelledStable`: the record
    /// landed in the cleanup's own scope after the quarantine had read it).
    #[tokio::test(start_paused = true)]
    async fn a_receipt_in_progress_in_a_quarantined_shield_is_a_pending_effect() {
        let scope = Scope::new();
        let (cleanup, pay) =
            shield_calling(&scope, ChildSpec::side_effecting("pay", "pay-1")).await;
        let record = pay.win_receipt(Receipt::EffectUnknown(EffectRecord::new("pay-1")));

        scope.cancel();
        // The grace period ends: the quarantine stops the cleanup and makes the report.
        let report = scope.quiesce().await;
        record(); // the owner's record, too late for that report
        assert_eq!(report.state(), Lifecycle::NeedsReconciliation, "{report}");
        let pending = report.pending_effects();
        assert_eq!(pending.len(), 1, "{report:?}");
        assert_eq!(pending[0].effect_id(), "pay-1");
        assert!(cleanup.await.unwrap_err().is_cancelled());
        assert_eq!(scope.quiesce().await, report, "the report never changes");
    }

    /// The conservative count is only for children that may have had an effect: a read-only
    /// one whose receipt is in progress is no pending effect.
    #[tokio::test(start_paused = true)]
    async fn a_read_only_receipt_in_progress_is_no_pending_effect() {
        let scope = Scope::new();
        let (_cleanup, get) = shield_calling(&scope, ChildSpec::read_only("get")).await;
        let record = get.win_receipt(Receipt::Cancelled);
        scope.cancel();
        let report = scope.quiesce().await;
        record();
        assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
        assert!(report.pending_effects().is_empty());
    }
}
