//! A retry or hedge call that does not end by itself — its future dropped by a `timeout` or
//! `select!` around it, or unwound by a panic of the user's code it runs (the operation, the
//! future it returned, the classifier) — still attaches its ledger to the scope's report,
//! finished with `Stop::Dropped` or `Stop::Panicked`, and attaches it while the call still
//! holds the scope: the report of a scope whose only work was that call has the ledger
//! (invariant 6). The attempts' receipts are the ones a dropped attempt always recorded.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use cancel_scope::retry::{AttemptEnd, Decision, HedgeDelay, Ledger, Retry, Stop};
use cancel_scope::{ChildSpec, Quiesce, Report, Scope};
use tokio::time::Instant;

use crate::support::panics::{panic_of_future, report_of};
use crate::support::time::MS;

/// The one ledger of the report.
fn only_ledger(report: &Report) -> &Ledger {
    let ledgers = report.retry_ledgers();
    assert_eq!(ledgers.len(), 1, "{report}");
    ledgers[0]
}

/// The attempts' ends.
fn ends(ledger: &Ledger) -> Vec<Option<AttemptEnd>> {
    ledger.attempts().iter().map(|a| a.end()).collect()
}

/// An operation that never answers.
fn hangs(_: cancel_scope::retry::Attempt) -> std::future::Pending<Result<(), &'static str>> {
    std::future::pending()
}

mod sequential {
    use super::*;

    /// A read-only call dropped by a `timeout` while its first attempt runs: the ledger is in
    /// the report, `Dropped`, its attempt `Stopped` at the drop; the attempt's receipt is
    /// `Cancelled`, as a dropped read-only attempt's always was.
    #[tokio::test(start_paused = true)]
    async fn dropped_during_an_attempt_attaches_the_ledger_read_only() {
        let scope = Scope::with_timeout(Duration::from_secs(10));
        let t0 = Instant::now();
        let retry = Retry::new(|_: &&str| Decision::Backoff).max_attempts(3);
        let call = retry.run(&scope, ChildSpec::read_only("db"), hangs);
        assert!(tokio::time::timeout(50 * MS, call).await.is_err());

        let report = report_of(&scope).await;
        assert_eq!((report.cancelled(), report.total()), (1, 1), "{report}");
        let ledger = only_ledger(&report);
        assert_eq!(ledger.stop(), Some(&Stop::Dropped));
        assert_eq!(ends(ledger), [Some(AttemptEnd::Stopped)]);
        assert_eq!(ledger.attempts()[0].ended_at(), Some(t0 + 50 * MS));
        assert_eq!(ledger.elapsed(), 50 * MS);
        assert_eq!(ledger.concurrent(), 0);
    }

    /// The same for idempotent work, dropped by a `select!` branch that wins: the attempt's
    /// receipt stays `EffectUnknown` (nobody will learn its outcome).
    #[tokio::test(start_paused = true)]
    async fn dropped_during_an_attempt_attaches_the_ledger_idempotent() {
        let scope = Scope::with_timeout(Duration::from_secs(10));
        let retry = Retry::new(|_: &&str| Decision::Backoff).max_attempts(3);
        tokio::select! {
            _ = retry.run(&scope, ChildSpec::idempotent("put", "key-1"), hangs) => {
                unreachable!("the attempt hangs")
            }
            () = tokio::time::sleep(20 * MS) => {}
        }

        let report = report_of(&scope).await;
        assert_eq!(report.effect_unknown(), 1, "{report}");
        assert_eq!(report.pending_effects()[0].effect_id(), "key-1");
        let ledger = only_ledger(&report);
        assert_eq!(ledger.stop(), Some(&Stop::Dropped));
        assert_eq!(ends(ledger), [Some(AttemptEnd::Stopped)]);
    }

    /// Dropped during the backoff sleep after a failed attempt: the ledger says how the
    /// attempt ended (`Failed`), and the call `Dropped`; the attempt's receipt is `Failed`.
    #[tokio::test(start_paused = true)]
    async fn dropped_during_a_backoff_sleep_attaches_the_ledger() {
        let scope = Scope::with_timeout(Duration::from_secs(10));
        let t0 = Instant::now();
        let retry = Retry::new(|_: &&str| Decision::Backoff)
            .max_attempts(3)
            .backoff(vec![Duration::from_secs(1)]);
        let call = retry.run(&scope, ChildSpec::read_only("db"), |_| async {
            Err::<(), _>("unavailable")
        });
        assert!(tokio::time::timeout(100 * MS, call).await.is_err());

        let report = report_of(&scope).await;
        assert_eq!((report.failed(), report.total()), (1, 1), "{report}");
        let ledger = only_ledger(&report);
        assert_eq!(ledger.stop(), Some(&Stop::Dropped));
        assert_eq!(ends(ledger), [Some(AttemptEnd::Failed(Decision::Backoff))]);
        assert_eq!(ledger.attempts()[0].ended_at(), Some(t0));
        assert_eq!(ledger.elapsed(), 100 * MS);
    }

    /// Dropped during the backoff sleep after an idempotent attempt whose effect is unknown
    /// (parked until the call's end): it still records `EffectUnknown`.
    #[tokio::test(start_paused = true)]
    async fn dropped_during_a_backoff_sleep_keeps_a_parked_attempt_unknown() {
        let scope = Scope::with_timeout(Duration::from_secs(10));
        let retry = Retry::new(|_: &&str| Decision::EffectUnknown)
            .max_attempts(3)
            .backoff(vec![Duration::from_secs(1)]);
        let call = retry.run(&scope, ChildSpec::idempotent("put", "key-2"), |_| async {
            Err::<(), _>("write timed out")
        });
        assert!(tokio::time::timeout(100 * MS, call).await.is_err());

        let report = report_of(&scope).await;
        assert_eq!(
            (report.effect_unknown(), report.total()),
            (1, 1),
            "{report}"
        );
        let ledger = only_ledger(&report);
        assert_eq!(ledger.stop(), Some(&Stop::Dropped));
        assert_eq!(
            ends(ledger),
            [Some(AttemptEnd::Failed(Decision::EffectUnknown))]
        );
    }

    /// The operation (the closure) panics when asked for the first attempt: the panic comes
    /// out of the call, the ledger is attached `Panicked` with the attempt `Panicked`, and the
    /// attempt's ticket records its default receipt.
    #[tokio::test(start_paused = true)]
    async fn the_operation_panicking_attaches_the_ledger() {
        let scope = Scope::with_timeout(Duration::from_secs(10));
        let retry = Retry::new(|_: &&str| Decision::Backoff);
        let message = panic_of_future(retry.run(
            &scope,
            ChildSpec::idempotent("put", "key-3"),
            |_| -> std::future::Ready<Result<(), &str>> { panic!("this operation panics") },
        ))
        .await;
        assert_eq!(message, "this operation panics");

        let report = report_of(&scope).await;
        assert_eq!(report.effect_unknown(), 1, "{report}");
        let ledger = only_ledger(&report);
        assert_eq!(ledger.stop(), Some(&Stop::Panicked));
        assert_eq!(ends(ledger), [Some(AttemptEnd::Panicked)]);
    }

    /// The future of the second attempt panics when polled (after a first attempt failed and
    /// a backoff): the ledger has both attempts, the second `Panicked` (its receipt: `Failed`,
    /// as a read-only attempt that panicked always recorded).
    #[tokio::test(start_paused = true)]
    async fn the_attempts_future_panicking_attaches_the_ledger() {
        let scope = Scope::with_timeout(Duration::from_secs(10));
        let retry = Retry::new(|_: &&str| Decision::Backoff).backoff(vec![10 * MS]);
        let message =
            panic_of_future(
                retry.run(&scope, ChildSpec::read_only("db"), |a| async move {
                    if a.number() == 1 {
                        return Err("unavailable");
                    }
                    tokio::time::sleep(5 * MS).await;
                    panic!("this future panics");
                    #[allow(unreachable_code)]
                    Ok::<(), _>(())
                }),
            )
            .await;
        assert_eq!(message, "this future panics");

        let report = report_of(&scope).await;
        assert_eq!((report.failed(), report.total()), (2, 2), "{report}");
        let ledger = only_ledger(&report);
        assert_eq!(ledger.stop(), Some(&Stop::Panicked));
        assert_eq!(
            ends(ledger),
            [
                Some(AttemptEnd::Failed(Decision::Backoff)),
                Some(AttemptEnd::Panicked)
            ]
        );
    }

    /// The classifier panics on the first attempt's error: the ledger is attached
    /// `Panicked`, the attempt `Panicked`, and its ticket records its default receipt
    /// (`Failed` for read-only work that panicked).
    #[tokio::test(start_paused = true)]
    async fn the_classifier_panicking_attaches_the_ledger() {
        let scope = Scope::with_timeout(Duration::from_secs(10));
        let retry = Retry::new(|_: &&str| -> Decision { panic!("this classifier panics") });
        let message = panic_of_future(retry.run(&scope, ChildSpec::read_only("db"), |_| async {
            Err::<(), _>("unavailable")
        }))
        .await;
        assert_eq!(message, "this classifier panics");

        let report = report_of(&scope).await;
        assert_eq!((report.failed(), report.total()), (1, 1), "{report}");
        let ledger = only_ledger(&report);
        assert_eq!(ledger.stop(), Some(&Stop::Panicked));
        assert_eq!(ends(ledger), [Some(AttemptEnd::Panicked)]);
    }

    /// The backoff schedule (user code too) panics when asked for the first delay: the
    /// ledger is attached `Panicked`; the failed attempt keeps its end.
    #[tokio::test(start_paused = true)]
    async fn the_backoff_schedule_panicking_attaches_the_ledger() {
        let scope = Scope::with_timeout(Duration::from_secs(10));
        let retry = Retry::new(|_: &&str| Decision::Backoff).backoff(std::iter::from_fn(
            || -> Option<Duration> { panic!("this schedule panics") },
        ));
        let message = panic_of_future(retry.run(&scope, ChildSpec::read_only("db"), |_| async {
            Err::<(), _>("unavailable")
        }))
        .await;
        assert_eq!(message, "this schedule panics");

        let report = report_of(&scope).await;
        assert_eq!((report.failed(), report.total()), (1, 1), "{report}");
        let ledger = only_ledger(&report);
        assert_eq!(ledger.stop(), Some(&Stop::Panicked));
        assert_eq!(ends(ledger), [Some(AttemptEnd::Failed(Decision::Backoff))]);
    }

    /// A call dropped by the panic of code next to it (another `select!` branch) did not
    /// panic: it is `Dropped`, its attempt `Stopped`. (The attempt's receipt is the one a
    /// ticket dropped during an unwind records: `Failed` for read-only work.)
    #[tokio::test(start_paused = true)]
    async fn a_call_dropped_by_a_panic_next_to_it_is_dropped_not_panicked() {
        let scope = Scope::with_timeout(Duration::from_secs(10));
        let retry = Retry::new(|_: &&str| Decision::Backoff);
        let message = panic_of_future(async {
            tokio::select! {
                _ = retry.run(&scope, ChildSpec::read_only("db"), hangs) => {}
                () = async {
                    tokio::time::sleep(20 * MS).await;
                    panic!("a branch next to the call panics");
                } => {}
            }
        })
        .await;
        assert_eq!(message, "a branch next to the call panics");

        let report = report_of(&scope).await;
        assert_eq!((report.failed(), report.total()), (1, 1), "{report}");
        let ledger = only_ledger(&report);
        assert_eq!(ledger.stop(), Some(&Stop::Dropped));
        assert_eq!(ends(ledger), [Some(AttemptEnd::Stopped)]);
    }

    /// The order that invariant 6 needs: a closed scope whose only unit is the attempt in
    /// flight of a call (a first attempt holds no hold) goes quiet at that attempt's receipt.
    /// The ledger of the dropped call must be attached before it, so that the report built at
    /// the very moment the scope is quiet (by a waker that polls `quiesce()` as soon as it is
    /// woken) already has it. Attached after the receipt, it would be missing there, and
    /// would change a report that had already been given.
    #[tokio::test(start_paused = true)]
    async fn the_ledger_of_a_dropped_call_is_in_the_report_of_the_moment_of_quiet() {
        let scope = Scope::new();
        let retry = Retry::new(|_: &&str| Decision::Backoff);
        let mut call = Box::pin(retry.run(&scope, ChildSpec::read_only("db"), hangs));
        assert!(futures::poll!(call.as_mut()).is_pending()); // the attempt is in flight
        scope.close();

        let at_quiet = ReportAtWake::watch(&scope);
        assert!(at_quiet.report().is_none());
        drop(call);
        let report = at_quiet
            .report()
            .expect("the scope is quiet once the call is dropped");
        assert_eq!(report.cancelled(), 1, "{report}");
        let ledger = only_ledger(&report);
        assert_eq!(ledger.stop(), Some(&Stop::Dropped));
    }

    /// The same when the call is unwound by its attempt's panic.
    #[tokio::test(start_paused = true)]
    async fn the_ledger_of_a_panicked_call_is_in_the_report_of_the_moment_of_quiet() {
        let scope = Scope::new();
        let retry = Retry::new(|_: &&str| Decision::Backoff);
        let at_quiet: Arc<Mutex<Option<Arc<ReportAtWake>>>> = Arc::default();
        let watch = at_quiet.clone();
        let s = scope.clone();
        let message = panic_of_future(retry.run(&scope, ChildSpec::read_only("db"), move |_| {
            let (watch, s) = (watch.clone(), s.clone());
            async move {
                tokio::task::yield_now().await;
                // The attempt is the scope's only work: close it and watch for quiet.
                s.close();
                *watch.lock().unwrap() = Some(ReportAtWake::watch(&s));
                panic!("this future panics");
                #[allow(unreachable_code)]
                Ok::<(), &str>(())
            }
        }))
        .await;
        assert_eq!(message, "this future panics");
        let at_quiet = at_quiet.lock().unwrap().take().unwrap();
        let report = at_quiet.report().expect("quiet once the call is unwound");
        assert_eq!(only_ledger(&report).stop(), Some(&Stop::Panicked));
    }

    /// A call refused at its start (the scope was closed) attaches nothing, as before: the
    /// scope may be quiet already.
    #[tokio::test(start_paused = true)]
    async fn a_refused_call_attaches_nothing() {
        let scope = Scope::new();
        scope.close();
        let retry = Retry::new(|_: &&str| Decision::Backoff);
        let err = retry
            .run(&scope, ChildSpec::read_only("db"), hangs)
            .await
            .unwrap_err();
        assert_eq!(err.stop(), &Stop::Closed);
        assert!(report_of(&scope).await.retry_ledgers().is_empty());
    }
}

mod hedge {
    use super::*;

    /// A hedged call dropped while its two attempts run: the ledger is attached `Dropped`,
    /// both attempts `Stopped`; both are cancelled and record `Cancelled` (read-only).
    #[tokio::test(start_paused = true)]
    async fn dropped_during_its_attempts_attaches_the_ledger() {
        let scope = Scope::with_timeout(Duration::from_secs(10));
        let t0 = Instant::now();
        let hedge = Retry::new(|_: &&str| Decision::Backoff)
            .max_attempts(2)
            .hedge(HedgeDelay::Fixed(10 * MS));
        let call = hedge.run(&scope, ChildSpec::read_only("search"), hangs);
        assert!(tokio::time::timeout(50 * MS, call).await.is_err());

        let report = report_of(&scope).await;
        assert_eq!((report.cancelled(), report.total()), (2, 2), "{report}");
        let ledger = only_ledger(&report);
        assert_eq!(ledger.stop(), Some(&Stop::Dropped));
        assert_eq!(ends(ledger), [Some(AttemptEnd::Stopped); 2]);
        assert!(ledger
            .attempts()
            .iter()
            .all(|a| a.ended_at() == Some(t0 + 50 * MS)));
        assert_eq!(ledger.concurrent(), 0);
    }

    /// The same for idempotent work: the attempts record `EffectUnknown`, as before.
    #[tokio::test(start_paused = true)]
    async fn dropped_during_its_attempts_keeps_idempotent_attempts_unknown() {
        let scope = Scope::with_timeout(Duration::from_secs(10));
        let hedge = Retry::new(|_: &&str| Decision::Backoff)
            .max_attempts(2)
            .hedge(HedgeDelay::Fixed(10 * MS));
        let call = hedge.run_with_ledger(&scope, ChildSpec::idempotent("put", "key-4"), hangs);
        assert!(tokio::time::timeout(50 * MS, call).await.is_err());

        let report = report_of(&scope).await;
        assert_eq!(
            (report.effect_unknown(), report.total()),
            (2, 2),
            "{report}"
        );
        let ledger = only_ledger(&report);
        assert_eq!(ledger.stop(), Some(&Stop::Dropped));
        assert_eq!(ends(ledger), [Some(AttemptEnd::Stopped); 2]);
    }

    /// Dropped while it waits, with nothing in flight, for the dependency's retry-after hint
    /// to pass (the hedge's wait between attempts): the failed attempt keeps its end.
    #[tokio::test(start_paused = true)]
    async fn dropped_while_waiting_for_a_retry_after_hint_attaches_the_ledger() {
        let scope = Scope::with_timeout(Duration::from_secs(10));
        let hedge = Retry::new(|_: &&str| Decision::RetryAfter(Duration::from_secs(1)))
            .max_attempts(2)
            .hedge(HedgeDelay::Fixed(10 * MS));
        let call = hedge.run(&scope, ChildSpec::read_only("search"), |_| async {
            Err::<(), _>("slow down")
        });
        assert!(tokio::time::timeout(100 * MS, call).await.is_err());

        let report = report_of(&scope).await;
        assert_eq!((report.failed(), report.total()), (1, 1), "{report}");
        let ledger = only_ledger(&report);
        assert_eq!(ledger.stop(), Some(&Stop::Dropped));
        assert_eq!(
            ends(ledger),
            [Some(AttemptEnd::Failed(Decision::RetryAfter(
                Duration::from_secs(1)
            )))]
        );
    }

    /// A closed scope whose only work is a dropped hedged call has its ledger in the report
    /// of the moment it is quiet. (Less tight than for the sequential call: the hedge's hold
    /// is released after the ledger is attached, and the attempts' tasks give their receipts
    /// later still, when they stop.)
    #[tokio::test(start_paused = true)]
    async fn the_ledger_of_a_dropped_hedge_is_in_the_report_of_the_moment_of_quiet() {
        let scope = Scope::new();
        let hedge = Retry::new(|_: &&str| Decision::Backoff)
            .max_attempts(2)
            .hedge(HedgeDelay::Fixed(10 * MS));
        let mut call = Box::pin(hedge.run(&scope, ChildSpec::read_only("search"), hangs));
        assert!(futures::poll!(call.as_mut()).is_pending());
        scope.close();

        let at_quiet = ReportAtWake::watch(&scope);
        drop(call);
        // The attempts' tasks stop at their next poll, and give their receipts then.
        tokio::time::sleep(MS).await;
        let report = at_quiet
            .report()
            .expect("quiet once the attempts have stopped");
        assert_eq!(report.cancelled(), 1, "{report}");
        assert_eq!(only_ledger(&report).stop(), Some(&Stop::Dropped));
    }
}

/// Polls a scope's `quiesce()` as soon as it is woken, so that the report is the one of the
/// moment the scope went quiet (not of a later poll, by which a late note could have come).
struct ReportAtWake {
    quiesce: Mutex<Option<Pin<Box<Quiesce>>>>,
    report: Mutex<Option<Report>>,
}

impl ReportAtWake {
    fn watch(scope: &Scope) -> Arc<ReportAtWake> {
        let this = Arc::new(ReportAtWake {
            quiesce: Mutex::new(Some(Box::pin(scope.quiesce()))),
            report: Mutex::new(None),
        });
        this.poll();
        this
    }

    fn poll(self: &Arc<Self>) {
        let waker = Waker::from(self.clone());
        let mut q = self.quiesce.lock().unwrap();
        if let Some(fut) = q.as_mut() {
            if let Poll::Ready(report) = fut.as_mut().poll(&mut Context::from_waker(&waker)) {
                *self.report.lock().unwrap() = Some(report);
                *q = None;
            }
        }
    }

    fn report(&self) -> Option<Report> {
        self.report.lock().unwrap().clone()
    }
}

impl Wake for ReportAtWake {
    fn wake(self: Arc<Self>) {
        self.poll();
    }
}
