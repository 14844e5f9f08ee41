//! Lifecycle and stable quiescence: a scope that can prove it has stopped.
//!
//! [`Scope::quiesce`] resolves once the scope's registration watermark is closed (by
//! [`Scope::close`] or a cancel), every registered child of its subtree has a terminal receipt
//! (or was quarantined after the grace period), and every guard was released. From then on
//! nothing of that scope can start or commit and no number in its [`Report`] changes
//! (invariant 6): new registrations are refused by the closed watermark, and a child scope can
//! only take work through a unit of this one.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::cause::Cause;
use crate::child::{ChildSpec, EffectRecord};
use crate::scope::{instant_of, nanos, now_stamp, Note, Scope};
use crate::tree::{self, Kind, Wait, WaiterKey};

/// Where a scope is in its life.
///
/// `Accepted -> Running -> Cancelling -> CancelledStable | Completed | NeedsReconciliation`
/// (a scope closed without a cancel goes from `Running` straight to a final state).
///
/// # Examples
///
/// ```
/// use cancel_scope::{ChildSpec, Lifecycle, Scope};
/// let s = Scope::new();
/// assert_eq!(s.lifecycle(), Lifecycle::Accepted);
/// let t = s.register(ChildSpec::read_only("x")).unwrap();
/// assert_eq!(s.lifecycle(), Lifecycle::Running);
/// s.cancel();
/// assert_eq!(s.lifecycle(), Lifecycle::Cancelling);
/// drop(t);
/// assert_eq!(s.lifecycle(), Lifecycle::CancelledStable);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Lifecycle {
    /// Created; no work was registered yet.
    Accepted,
    /// Work was registered; not cancelled.
    Running,
    /// Cancelled; some children have no receipt yet.
    Cancelling,
    /// Cancelled and quiet; nothing's effect is unknown.
    CancelledStable,
    /// Closed without a cancel and quiet; nothing's effect is unknown.
    Completed,
    /// Quiet, but some effects are unknown or a child that may have effects was quarantined:
    /// see [`Report::pending_effects`].
    NeedsReconciliation,
}

impl Lifecycle {
    /// Whether this is one of the three final states.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Lifecycle;
    /// assert!(Lifecycle::Completed.is_final());
    /// assert!(!Lifecycle::Cancelling.is_final());
    /// ```
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Lifecycle::CancelledStable | Lifecycle::Completed | Lifecycle::NeedsReconciliation
        )
    }
}

/// What a scope did, as of the moment it became quiet. Returned by [`Scope::quiesce`].
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use cancel_scope::{ChildSpec, Lifecycle, Scope};
///
/// let s = Scope::new();
/// s.spawn(async {}).unwrap().await.unwrap();
/// let pay = s.register(ChildSpec::side_effecting("charge", "payment-7")).unwrap();
/// let pay = pay.dispatch().unwrap();
/// s.cancel();
/// drop(pay); // dispatched, may have charged: outcome unknown
///
/// let report = s.quiesce().await;
/// assert_eq!(report.state(), Lifecycle::NeedsReconciliation);
/// assert_eq!(report.succeeded(), 1);
/// assert_eq!(report.effect_unknown(), 1);
/// assert_eq!(report.pending_effects()[0].effect_id(), "payment-7");
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    state: Lifecycle,
    cause: Option<Cause>,
    counts: [u64; 5],
    pending_effects: Vec<EffectRecord>,
    quarantined_children: Vec<ChildSpec>,
    cancel_to_quiet: Option<Duration>,
    orphan_work: Duration,
    /// Values the layers above attached to the scope (retry ledgers), oldest first.
    notes: Vec<Note>,
}

impl Report {
    /// The final state.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::{Lifecycle, Scope};
    /// let s = Scope::new();
    /// s.close();
    /// assert_eq!(s.quiesce().await.state(), Lifecycle::Completed);
    /// # }
    /// ```
    pub fn state(&self) -> Lifecycle {
        self.state
    }

    /// The cancel cause, if the scope was cancelled.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::{Cause, Scope};
    /// let s = Scope::new();
    /// s.cancel_because(Cause::ClientGone);
    /// assert_eq!(s.quiesce().await.cause(), Some(&Cause::ClientGone));
    /// # }
    /// ```
    pub fn cause(&self) -> Option<&Cause> {
        self.cause.as_ref()
    }

    /// Children that succeeded (in the whole subtree).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.spawn(async {}).unwrap().await.unwrap();
    /// s.close();
    /// assert_eq!(s.quiesce().await.succeeded(), 1);
    /// # }
    /// ```
    pub fn succeeded(&self) -> u64 {
        self.counts[Kind::Succeeded as usize]
    }

    /// Children that failed (including panics).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use cancel_scope::Scope;
    /// let s = Scope::new();
    /// let _ = s.spawn(async { panic!("boom") }).unwrap().await;
    /// s.close();
    /// assert_eq!(s.quiesce().await.failed(), 1);
    /// # }
    /// ```
    pub fn failed(&self) -> u64 {
        self.counts[Kind::Failed as usize]
    }

    /// Children confirmed stopped (or never started) because of a cancel.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use cancel_scope::Scope;
    /// let s = Scope::new();
    /// let h = s.spawn(std::future::pending::<()>()).unwrap();
    /// s.cancel();
    /// assert_eq!(s.quiesce().await.cancelled(), 1);
    /// # drop(h);
    /// # }
    /// ```
    pub fn cancelled(&self) -> u64 {
        self.counts[Kind::Cancelled as usize]
    }

    /// Children quarantined after the grace period.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.close();
    /// assert_eq!(s.quiesce().await.quarantined(), 0);
    /// # }
    /// ```
    pub fn quarantined(&self) -> u64 {
        self.counts[Kind::Quarantined as usize]
    }

    /// Children whose effect is unknown.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.close();
    /// assert_eq!(s.quiesce().await.effect_unknown(), 0);
    /// # }
    /// ```
    pub fn effect_unknown(&self) -> u64 {
        self.counts[Kind::EffectUnknown as usize]
    }

    /// All receipts.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.spawn(async {}).unwrap().await.unwrap();
    /// s.close();
    /// assert_eq!(s.quiesce().await.total(), 1);
    /// # }
    /// ```
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Effects to reconcile: every `EffectUnknown` receipt, and quarantined children that may
    /// have had an effect — one record per effect (a retry attempt and the call inside it
    /// that both end `EffectUnknown` report the same effect once; the receipt counts keep
    /// both). Records of one effect id that disagree (two provider handles or payload digests)
    /// are listed each.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.close();
    /// assert!(s.quiesce().await.pending_effects().is_empty());
    /// # }
    /// ```
    pub fn pending_effects(&self) -> &[EffectRecord] {
        &self.pending_effects
    }

    /// The children that were quarantined.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.close();
    /// assert!(s.quiesce().await.quarantined_children().is_empty());
    /// # }
    /// ```
    pub fn quarantined_children(&self) -> &[ChildSpec] {
        &self.quarantined_children
    }

    /// Time from the cancel to the last receipt or guard release (`None` if not cancelled).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// let lease = s.tether(()).unwrap();
    /// s.cancel();
    /// tokio::time::sleep(Duration::from_millis(7)).await;
    /// drop(lease);
    /// assert_eq!(s.quiesce().await.cancel_to_quiet(), Some(Duration::from_millis(7)));
    /// # }
    /// ```
    pub fn cancel_to_quiet(&self) -> Option<Duration> {
        self.cancel_to_quiet
    }

    /// Orphan work: summed over children that ended after the cancel, how long each ran on.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{ChildSpec, Scope};
    /// let s = Scope::new();
    /// let a = s.register(ChildSpec::read_only("a")).unwrap().dispatch().unwrap();
    /// s.cancel();
    /// tokio::time::sleep(Duration::from_millis(20)).await;
    /// a.succeed(); // it ignored the cancel for 20 ms
    /// assert_eq!(s.quiesce().await.orphan_work(), Duration::from_millis(20));
    /// # }
    /// ```
    pub fn orphan_work(&self) -> Duration {
        self.orphan_work
    }

    /// The notes attached to the scope, oldest first (read through typed accessors such as
    /// `Report::retry_ledgers`).
    pub(crate) fn notes(&self) -> &[Note] {
        &self.notes
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?}: {} succeeded, {} failed, {} cancelled, {} quarantined, {} effect unknown",
            self.state,
            self.succeeded(),
            self.failed(),
            self.cancelled(),
            self.quarantined(),
            self.effect_unknown()
        )?;
        if let Some(c) = &self.cause {
            write!(f, "; cause: {c}")?;
        }
        if let Some(d) = self.cancel_to_quiet {
            write!(
                f,
                "; cancel to quiet {d:?}, orphan work {:?}",
                self.orphan_work
            )?;
        }
        Ok(())
    }
}

/// Resolves to the [`Report`] once the scope is quiet. Returned by [`Scope::quiesce`].
///
/// # Cancel safety
///
/// Cancel safe: dropping it unregisters its waker; a new `quiesce()` picks up where it was.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use cancel_scope::Scope;
/// let s = Scope::new();
/// s.close();
/// let report = s.quiesce().await;
/// assert_eq!(report.total(), 0);
/// # }
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct Quiesce {
    scope: Scope,
    key: WaiterKey,
    grace: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Future for Quiesce {
    type Output = Report;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Report> {
        let this = &mut *self;
        if tree::poll_wait(&this.scope.node, Wait::Quiet, &mut this.key, cx.waker()) {
            return Poll::Ready(this.scope.report());
        }
        if cfg!(loom) {
            // Under loom there is no tokio timer: the models wait for receipts.
            return Poll::Pending;
        }
        let node = &this.scope.node;
        if this.scope.is_cancelled() {
            // Cancelled but not quiet: children get the grace period, counted from the cancel.
            // A grace period too long to represent never ends: wait for the receipts.
            let Some(at) = grace_end(node) else {
                return Poll::Pending;
            };
            if poll_grace(&mut this.grace, at, cx).is_pending() {
                return Poll::Pending;
            }
            tree::quarantine_subtree(node, &crate::child::task_spec(), now_stamp());
            this.grace = None;
        } else {
            // Not cancelled itself, but descendants may be (a child's deadline, its own
            // cancel): their stuck work is quarantined once their own grace period ends, as
            // their own `quiesce()` would. Their cancel wakes this future (see
            // `tree::nudge_quiesce_above`), which then learns when.
            let now = tokio::time::Instant::now();
            let mut next: Option<tokio::time::Instant> = None;
            for d in tree::cancelled_below(node) {
                match grace_end(&d) {
                    Some(end) if end <= now => {
                        tree::quarantine_subtree(&d, &crate::child::task_spec(), now_stamp());
                    }
                    Some(end) => next = Some(next.map_or(end, |n| n.min(end))),
                    None => {}
                }
            }
            if let Some(at) = next {
                // In the future: this registers the timer's wake-up.
                let _ = poll_grace(&mut this.grace, at, cx);
            } else {
                this.grace = None;
            }
        }
        // Guards are not quarantined: wait for them (or resolve if quiet now).
        if tree::poll_wait(&this.scope.node, Wait::Quiet, &mut this.key, cx.waker()) {
            return Poll::Ready(this.scope.report());
        }
        Poll::Pending
    }
}

/// Polls the grace timer in `grace`, set to end at `at`.
fn poll_grace(
    grace: &mut Option<Pin<Box<tokio::time::Sleep>>>,
    at: tokio::time::Instant,
    cx: &mut Context<'_>,
) -> Poll<()> {
    let sleep = match grace {
        Some(sleep) => {
            if sleep.deadline() != at {
                sleep.as_mut().reset(at);
            }
            sleep
        }
        slot => slot.insert(Box::pin(tokio::time::sleep_until(at))),
    };
    sleep.as_mut().poll(cx)
}

/// When the grace period after the cancel of `node` ends (`None`: too far to represent).
fn grace_end(node: &crate::scope::Core) -> Option<tokio::time::Instant> {
    instant_of(node.cancelled_at()).checked_add(node.ext.grace())
}

impl Drop for Quiesce {
    fn drop(&mut self) {
        tree::forget_waiter(&self.scope.node, Wait::Quiet, &mut self.key);
    }
}

impl fmt::Debug for Quiesce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quiesce")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl Scope {
    /// Waits for *stable quiescence* and reports it.
    ///
    /// Resolves once the watermark is closed (call [`close`](Scope::close) or cancel first),
    /// every registered child of the subtree has a receipt, every guard is released and every
    /// body run with [`run`](Scope::run) has stopped. After a cancel, children still running
    /// when the grace period ends are quarantined (receipt `Quarantined`, listed in the report,
    /// late outcome ignored). The same holds below a scope that is only closed: the work of a
    /// cancelled descendant (a child scope whose deadline passed, say) is quarantined when the
    /// grace period of the topmost cancelled scope above it ends, as that scope's own
    /// `quiesce` would do. (A waiting `quiesce` of a closed scope looks through its live child
    /// scopes again each time one of them is cancelled with work running.) Once it resolves
    /// nothing of this scope can start or commit, and the report never changes.
    ///
    /// A body waits for itself: awaited inside [`run`](Scope::run) of this scope (or of a
    /// descendant), inside a task spawned in it, or inside a retry attempt or fan-out branch
    /// whose scope it is (see [`Attempt::scope`](crate::retry::Attempt::scope)), `quiesce`
    /// resolves only once that body is stopped, by a cancel or the deadline. Work a body
    /// starts and must wait for goes into a child scope, whose `quiesce` it can await.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{Lifecycle, Scope};
    ///
    /// let s = Scope::new();
    /// for _ in 0..3 {
    ///     s.spawn(tokio::time::sleep(Duration::from_secs(60))).unwrap();
    /// }
    /// s.cancel();
    /// let report = s.quiesce().await;
    /// assert_eq!(report.state(), Lifecycle::CancelledStable);
    /// assert_eq!(report.cancelled(), 3);
    /// assert!(s.spawn(async {}).is_err()); // and nothing starts any more
    /// # }
    /// ```
    pub fn quiesce(&self) -> Quiesce {
        Quiesce {
            scope: self.clone(),
            key: WaiterKey::default(),
            grace: None,
        }
    }

    /// The scope's lifecycle state now.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{Lifecycle, Scope};
    /// let s = Scope::new();
    /// s.close();
    /// assert_eq!(s.lifecycle(), Lifecycle::Completed);
    /// ```
    pub fn lifecycle(&self) -> Lifecycle {
        let st = self.node.state();
        if st.is_quiet() {
            let needs = self.node.count(Kind::EffectUnknown) > 0
                || self
                    .node
                    .with_records(|r| r.quarantined.iter().any(|c| c.effect().may_have_effect()));
            if needs {
                Lifecycle::NeedsReconciliation
            } else if st.is_cancelled() {
                Lifecycle::CancelledStable
            } else {
                Lifecycle::Completed
            }
        } else if st.is_cancelled() {
            Lifecycle::Cancelling
        } else if st.is_started() {
            Lifecycle::Running
        } else {
            Lifecycle::Accepted
        }
    }

    /// Quarantines now every registered child of this scope's subtree that has no receipt yet,
    /// as [`quiesce`](Scope::quiesce) does when the grace period after a cancel ends; returns
    /// how many. For the loom models, which have no timer to end a grace period.
    #[doc(hidden)]
    pub fn __quarantine_now(&self) -> usize {
        tree::quarantine_subtree(&self.node, &crate::child::task_spec(), now_stamp())
    }

    /// Builds the report (meaningful once quiet: then nothing in it can change).
    pub(crate) fn report(&self) -> Report {
        let node = &self.node;
        let counts = [
            Kind::Succeeded,
            Kind::Failed,
            Kind::Cancelled,
            Kind::Quarantined,
            Kind::EffectUnknown,
        ]
        .map(|k| node.count(k));
        let (pending_effects, quarantined_children) = node.with_records(|r| {
            let records = r
                .effects
                .iter()
                .chain(
                    r.quarantined
                        .iter()
                        .filter(|c| c.effect().may_have_effect()),
                )
                .filter_map(ChildSpec::effect_record);
            (one_per_effect(records), r.quarantined.clone())
        });
        let cause = self.cause();
        let cancel_to_quiet = cause.as_ref().map(|_| {
            let at = node.cancelled_at();
            nanos(node.last_stamp().saturating_sub(at))
        });
        Report {
            state: self.lifecycle(),
            cause,
            counts,
            pending_effects,
            quarantined_children,
            cancel_to_quiet,
            orphan_work: nanos(node.orphan_nanos()),
            notes: self.notes(),
        }
    }
}

/// One record per effect, in order of first appearance: a retry attempt and the transport
/// call inside it that both end `EffectUnknown` name the same effect, which is to be
/// reconciled once. What either record knows (digest, provider handle) is kept. Records of one
/// effect id that disagree (two provider handles, two payload digests) are each kept: merging
/// them would drop what reconciliation needs.
fn one_per_effect<'a>(records: impl Iterator<Item = &'a EffectRecord>) -> Vec<EffectRecord> {
    let mut effects: Vec<EffectRecord> = Vec::new();
    let mut seen: std::collections::HashMap<&'a str, Vec<usize>> = std::collections::HashMap::new();
    for record in records {
        let same = seen.entry(record.effect_id()).or_default();
        match same.iter().find(|&&i| agree(&effects[i], record)) {
            Some(&i) => effects[i].absorb(record),
            None => {
                same.push(effects.len());
                effects.push(record.clone());
            }
        }
    }
    effects
}

/// Whether two records of one effect id can be the same effect: nothing one knows contradicts
/// the other.
fn agree(a: &EffectRecord, b: &EffectRecord) -> bool {
    fn compatible(x: Option<&str>, y: Option<&str>) -> bool {
        x.is_none() || y.is_none() || x == y
    }
    compatible(a.payload_digest_str(), b.payload_digest_str())
        && compatible(a.provider_handle_str(), b.provider_handle_str())
}
