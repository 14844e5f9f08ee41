//! Support for the loom models of `cancel-scope` (the models themselves are in `tests/`).
//!
//! Build and run with `RUSTFLAGS="--cfg loom"` (see `README.md`): the crate's `sync` shim then
//! swaps every atomic, lock and `Arc` of the cancellation tree for loom's, and each model below
//! explores the interleavings of the public synchronous API. Without `cfg(loom)` this crate is
//! empty.

#![warn(unreachable_pub)]
#![forbid(unsafe_code)]

#[cfg(loom)]
mod support {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

    /// The preemption bound of the two-thread models (unless `LOOM_MAX_PREEMPTIONS` is set).
    ///
    /// The races these models check need at most two preemptions (one to stop a canceller
    /// half way, one to let another thread overtake it); three leaves a margin and every
    /// two-thread model still runs in a few seconds. The three-thread models use
    /// [`THREE_THREAD_PREEMPTIONS`].
    pub const DEFAULT_PREEMPTIONS: usize = 3;

    /// The preemption bound of the models with three threads: at 3 they take minutes each (over
    /// 300,000 interleavings), at 2 a few seconds.
    pub const THREE_THREAD_PREEMPTIONS: usize = 2;

    /// Runs `f` under loom with [`DEFAULT_PREEMPTIONS`] (or `LOOM_MAX_PREEMPTIONS` if set).
    ///
    /// # Examples
    ///
    /// ```ignore
    /// // Only under RUSTFLAGS="--cfg loom", inside a #[test].
    /// cancel_scope_loom_tests::model("smoke", || cancel_scope::Scope::new().cancel());
    /// ```
    pub fn model<F>(name: &str, f: F)
    where
        F: Fn() + Sync + Send + 'static,
    {
        model_bounded(name, DEFAULT_PREEMPTIONS, f);
    }

    /// Runs `f` under loom with at most `bound` preemptions per execution (`LOOM_MAX_PREEMPTIONS`
    /// overrides it), and prints the bound, the number of interleavings explored and the wall
    /// time to stderr (`--nocapture` shows it).
    pub fn model_bounded<F>(name: &str, bound: usize, f: F)
    where
        F: Fn() + Sync + Send + 'static,
    {
        let mut builder = loom::model::Builder::new();
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = Some(bound);
        }
        let used = builder.preemption_bound;
        // A plain std counter: it is outside the model and counts executions, not events.
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = runs.clone();
        let start = Instant::now();
        builder.check(move || {
            counter.fetch_add(1, Ordering::Relaxed);
            f();
        });
        eprintln!(
            "loom model {name}: preemption bound {}, {} interleavings, {:.2?}",
            used.map_or_else(|| "none".to_owned(), |b| b.to_string()),
            runs.load(Ordering::Relaxed),
            start.elapsed()
        );
    }

    /// Checks the report of a scope with two children that ended while it was cancelled,
    /// quarantined (`quarantined`: what the quarantine returned) and quiesced: one that
    /// succeeded and one whose effect `effect_id` has an unknown outcome. Invariant 5: one
    /// receipt each, its owner's or `Quarantined`; the effect is listed for reconciliation
    /// exactly once (as `EffectUnknown`, or as a quarantined child that may have had an effect)
    /// and never counted as none.
    ///
    /// # Examples
    ///
    /// ```ignore
    /// // Only under RUSTFLAGS="--cfg loom", inside a model.
    /// assert_one_success_one_unknown_effect(&report, quarantined, "pay-1");
    /// ```
    pub fn assert_one_success_one_unknown_effect(
        report: &cancel_scope::Report,
        quarantined: usize,
        effect_id: &str,
    ) {
        assert_eq!(report.total(), 2, "{report:?}");
        assert_eq!(report.quarantined(), quarantined as u64);
        assert_eq!(
            report.succeeded() + report.effect_unknown() + report.quarantined(),
            2
        );
        let pending = report.pending_effects();
        assert_eq!(pending.len(), 1, "{report:?}");
        assert_eq!(pending[0].effect_id(), effect_id);
        assert_eq!(report.state(), cancel_scope::Lifecycle::NeedsReconciliation);
    }
}

#[cfg(loom)]
pub use support::{
    assert_one_success_one_unknown_effect, model, model_bounded, DEFAULT_PREEMPTIONS,
    THREE_THREAD_PREEMPTIONS,
};
