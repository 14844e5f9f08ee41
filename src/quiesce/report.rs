//! The [`Report`] of a quiet scope: counts per receipt kind, pending effects (one record per
//! effect), quarantined children, timings and the notes of the layers above.

use std::fmt;
use std::time::Duration;

use crate::cause::Cause;
use crate::child::{unknown_in, Failure};
use crate::scope::{Note, Scope};
use crate::spec::{ChildSpec, EffectRecord};
use crate::time::nanos;
use crate::tree::Kind;

use super::Lifecycle;

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
    /// Values the layers above attached to the scope or below it (retry ledgers, failures),
    /// oldest first.
    notes: Vec<Note>,
    /// How many older notes the scope dropped (it keeps the newest 64).
    dropped_notes: u64,
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

    /// Effects to reconcile: every `EffectUnknown` receipt, quarantined children that may
    /// have had an effect, and the effects a quarantined [`shield`](Scope::shield)'s cleanup
    /// left open in its own scope (no receipt of this scope counts those; a receipt being
    /// recorded there as the quarantine came counts, if that child may have had an effect) —
    /// one record per
    /// effect (a retry attempt and the call inside it that both end `EffectUnknown` report the
    /// same effect once; the receipt counts keep both). Records of one effect id that disagree
    /// (two provider handles or payload digests) are listed each.
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

    /// The children of this scope and of the scopes below it that ended with an error that
    /// the report could list (tasks spawned with [`Scope::spawn_fallible`] that returned
    /// `Err`), oldest first: the newest 64 notes at most, as for
    /// [`retry_ledgers`](Report::retry_ledgers), the older ones counted in
    /// [`dropped_notes`](Report::dropped_notes). [`failed`](Report::failed) counts every
    /// `Failed` receipt, also those that carry no error to list (a panic, a ticket's
    /// [`fail`](crate::Dispatched::fail)).
    ///
    /// # Examples
    ///
    /// See [`Failure`].
    pub fn failures(&self) -> Vec<&Failure> {
        self.notes
            .iter()
            .filter_map(|n| n.get::<Failure>())
            .collect()
    }

    /// How many notes — the [retry ledgers](Report::retry_ledgers) and
    /// [failures](Report::failures) of this scope and the scopes below it — the scope
    /// dropped, oldest first, to keep the newest 64 (a long-lived scope keeps flat memory).
    /// The lists in this report miss that many; the receipt counts miss nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use cancel_scope::{retry::{Decision, Retry}, ChildSpec, Scope};
    /// let scope = Scope::new();
    /// let retry = Retry::new(|_: &()| Decision::Backoff);
    /// for _ in 0..70 {
    ///     retry.run(&scope, ChildSpec::read_only("db"), |_| async { Ok::<_, ()>(()) }).await.unwrap();
    /// }
    /// scope.close();
    /// let report = scope.quiesce().await;
    /// assert_eq!((report.retry_ledgers().len(), report.dropped_notes()), (64, 6));
    /// assert!(report.to_string().contains("6 older notes dropped"));
    /// # }
    /// ```
    pub fn dropped_notes(&self) -> u64 {
        self.dropped_notes
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
        // What the layers above show of their notes (a retry's ledger), oldest first.
        for shown in self.notes().iter().filter_map(|n| n.shown_as()) {
            write!(f, "; {shown}")?;
        }
        match self.dropped_notes {
            0 => {}
            1 => f.write_str("; 1 older note dropped (retry ledgers and failures)")?,
            n => write!(f, "; {n} older notes dropped (retry ledgers and failures)")?,
        }
        Ok(())
    }
}

impl Report {
    /// What telemetry records of this report (see [`telemetry`](crate::telemetry)).
    #[cfg(feature = "tower")]
    pub(crate) fn telemetry(&self) -> crate::telemetry::Reported<'_> {
        crate::telemetry::Reported {
            lifecycle: &self.state,
            cause: self.cause.as_ref(),
            receipts: [
                self.succeeded(),
                self.failed(),
                self.cancelled(),
                self.quarantined(),
                self.effect_unknown(),
            ],
            cancel_to_quiet: self.cancel_to_quiet,
            orphan_work: self.orphan_work,
        }
    }
}

impl Scope {
    /// The report, if this scope is quiet now (then nothing in it can change): what
    /// `quiesce()` would return at once, without a waiter.
    #[cfg(feature = "tower")]
    pub(crate) fn report_if_quiet(&self) -> Option<Report> {
        self.node.state().is_quiet().then(|| self.report())
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
            let records = unknown_in(r).filter_map(ChildSpec::effect_record);
            (one_per_effect(records), r.quarantined.clone())
        });
        let cause = self.cause();
        let (notes, dropped_notes) = self.notes();
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
            notes,
            dropped_notes,
        }
    }
}

/// One record per effect, in order of first appearance: a retry attempt and the transport
/// call inside it that both end `EffectUnknown` name the same effect, which is to be
/// reconciled once. What either record knows (digest, provider handle, status, redirect) is
/// kept. Records of one effect id that disagree (two provider handles, two payload digests, two
/// answered statuses) are each kept: merging them would drop what reconciliation needs.
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
/// the other (digest, provider handle, answered status, redirect).
fn agree(a: &EffectRecord, b: &EffectRecord) -> bool {
    a.details()
        .into_iter()
        .zip(b.details())
        .all(|(x, y)| x.is_none() || y.is_none() || x == y)
}
