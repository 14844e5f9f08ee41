//! The ledger and receipts of a hedged call or a fan-out in which user code panics (the
//! classifier, a `quiesce()` waker, a branch's constructor), and the same paths without
//! panic: every attempt and branch is recorded once, none is left running, a call that
//! succeeded stays `Succeeded`.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cancel_scope::fanout::FanOut;
use cancel_scope::retry::{AttemptEnd, Decision, HedgeDelay, Retry, Stop};
use cancel_scope::{ChildSpec, Quiesce, Scope};
use futures::FutureExt;

use crate::support::panics::{message, panics, pending_with, report_of, SetOnDrop};
use crate::support::time::MS;

/// A hedged call with a winner (attempt 1, at 25 ms) collects the loser (attempt 2), which
/// answered an error at the same instant: its error is classified in the drain. If the
/// classifier panics there, the loser must still be recorded in the ledger (as `Panicked`, the
/// classifier's panic being the call's), and the ledger must not count it in flight after
/// the call (`concurrent() == 0`, "0 once the call returned").
#[tokio::test(start_paused = true)]
async fn a_hedge_records_a_loser_whose_error_the_classifier_panics_on_in_the_drain() {
    let scope = Scope::new();
    let t0 = tokio::time::Instant::now();
    let hedge = Retry::new(|e: &&str| -> Decision {
        if *e == "late" {
            panic!("this classifier panics");
        }
        Decision::Backoff
    })
    .max_attempts(2)
    .hedge(HedgeDelay::Fixed(10 * MS));
    let out = std::panic::AssertUnwindSafe(hedge.run_with_ledger(
        &scope,
        ChildSpec::read_only("get"),
        move |attempt| async move {
            tokio::time::sleep_until(t0 + 25 * MS).await;
            if attempt.number() == 1 {
                Ok(1)
            } else {
                Err("late")
            }
        },
    ))
    .catch_unwind()
    .await;
    assert_eq!(message(out.unwrap_err()), "this classifier panics");
    let report = report_of(&scope).await;
    let ledgers = report.retry_ledgers();
    assert_eq!(ledgers.len(), 1, "{report}");
    let ledger = ledgers[0];
    assert_eq!(ledger.started(), 2, "{report}");
    assert_eq!(
        ledger.attempts()[0].end(),
        Some(AttemptEnd::Succeeded),
        "{report}"
    );
    assert_eq!(
        ledger.attempts()[1].end(),
        Some(AttemptEnd::Panicked),
        "the loser whose classifier panicked has no end in the ledger: {report}"
    );
    assert_eq!(ledger.concurrent(), 0, "{report}");
    assert_eq!(report.total(), 2, "{report}");
}

/// A hedged call whose winner's receipt wakes a `quiesce()` of the winner's scope with a
/// waker that panics: the panic comes out of the call, but the attempt did succeed and no
/// attempt panicked. The ledger must say so, as it does when the same waker panics at a
/// loser's receipt in the drain or at a parked receipt in `close` (a winner stays
/// `Succeeded`): its stop is `Succeeded`, not `Panicked` ("an attempt panicked").
#[tokio::test(start_paused = true)]
async fn a_hedge_whose_winners_receipt_wakes_a_panicking_waker_keeps_stop_succeeded() {
    let scope = Scope::new();
    let watch: Arc<Mutex<Vec<Pin<Box<Quiesce>>>>> = Arc::default();
    let hedge = Retry::new(|_: &&str| Decision::Backoff)
        .max_attempts(2)
        .hedge(HedgeDelay::Fixed(10 * MS));
    let w = watch.clone();
    let out = std::panic::AssertUnwindSafe(hedge.run_with_ledger(
        &scope,
        ChildSpec::read_only("get"),
        move |attempt| {
            let w = w.clone();
            async move {
                // No new work in the attempt's scope, and something waits for it to be
                // quiet with a waker that panics.
                attempt.scope().close();
                let mut q = Box::pin(attempt.scope().quiesce());
                pending_with(q.as_mut(), &panics());
                w.lock().unwrap().push(q);
                Ok::<_, &str>(1)
            }
        },
    ))
    .catch_unwind()
    .await;
    assert_eq!(message(out.unwrap_err()), "this waker panics");
    drop(watch);
    let report = report_of(&scope).await;
    let ledgers = report.retry_ledgers();
    assert_eq!(ledgers.len(), 1, "{report}");
    let ledger = ledgers[0];
    assert_eq!(
        ledger.attempts()[0].end(),
        Some(AttemptEnd::Succeeded),
        "{report}"
    );
    assert_eq!(report.succeeded(), 1, "{report}");
    assert_eq!(
        ledger.stop(),
        Some(&Stop::Succeeded),
        "no attempt panicked, yet the ledger says one did: {report}"
    );
}

/// Without any panic, a hedge whose loser answered an error as the winner won records the
/// loser `Failed` (a definite answer) and the call `Succeeded`; nothing in flight after.
#[tokio::test(start_paused = true)]
async fn a_hedge_without_panic_records_the_winner_and_a_failed_loser() {
    let scope = Scope::new();
    let t0 = tokio::time::Instant::now();
    let hedge = Retry::new(|_: &&str| Decision::Backoff)
        .max_attempts(3)
        .hedge(HedgeDelay::Fixed(10 * MS));
    let (out, ledger) = hedge
        .run_with_ledger(
            &scope,
            ChildSpec::read_only("get"),
            move |attempt| async move {
                match attempt.number() {
                    1 => {
                        tokio::time::sleep_until(t0 + 25 * MS).await;
                        Ok(1)
                    }
                    2 => {
                        tokio::time::sleep_until(t0 + 25 * MS).await;
                        Err("late")
                    }
                    _ => std::future::pending().await,
                }
            },
        )
        .await;
    assert_eq!(out.unwrap(), 1);
    assert_eq!(ledger.stop(), Some(&Stop::Succeeded));
    assert_eq!(ledger.started(), 3);
    assert_eq!(ledger.attempts()[0].end(), Some(AttemptEnd::Succeeded));
    assert_eq!(
        ledger.attempts()[1].end(),
        Some(AttemptEnd::Failed(Decision::Backoff))
    );
    assert_eq!(ledger.attempts()[2].end(), Some(AttemptEnd::Stopped));
    assert_eq!(ledger.concurrent(), 0);
    assert_eq!(ledger.peak_concurrent(), 3);
    let report = report_of(&scope).await;
    assert_eq!(report.succeeded(), 1, "{report}");
    assert_eq!(report.failed(), 1, "{report}");
    assert_eq!(report.cancelled(), 1, "{report}");
    assert_eq!(report.retry_ledgers().len(), 1, "{report}");
}

/// A hedge whose `op` panics when asked for the hedge (attempt 2): attempt 2 is recorded
/// `Panicked` (once: in flight 0 after, peak 2), attempt 1 `Stopped`, the call `Panicked`;
/// each attempt has one receipt (attempt 2's `Failed`, attempt 1's `Cancelled`), and the
/// ledger is in the report.
#[tokio::test(start_paused = true)]
async fn a_hedge_whose_op_panics_records_that_attempt_panicked_once() {
    let scope = Scope::new();
    let hedge = Retry::new(|_: &&str| Decision::Backoff)
        .max_attempts(3)
        .hedge(HedgeDelay::Fixed(10 * MS));
    let out = std::panic::AssertUnwindSafe(hedge.run_with_ledger(
        &scope,
        ChildSpec::read_only("get"),
        move |attempt| {
            if attempt.number() == 2 {
                panic!("this op panics");
            }
            std::future::pending::<Result<(), &str>>()
        },
    ))
    .catch_unwind()
    .await;
    assert_eq!(message(out.unwrap_err()), "this op panics");
    let report = report_of(&scope).await;
    let ledgers = report.retry_ledgers();
    assert_eq!(ledgers.len(), 1, "{report}");
    let ledger = ledgers[0];
    assert_eq!(ledger.stop(), Some(&Stop::Panicked), "{report}");
    assert_eq!(ledger.started(), 2, "{report}");
    assert_eq!(
        ledger.attempts()[0].end(),
        Some(AttemptEnd::Stopped),
        "{report}"
    );
    assert_eq!(
        ledger.attempts()[1].end(),
        Some(AttemptEnd::Panicked),
        "{report}"
    );
    assert_eq!(ledger.concurrent(), 0, "{report}");
    assert_eq!(ledger.peak_concurrent(), 2, "{report}");
    assert_eq!(report.failed(), 1, "{report}");
    assert_eq!(report.cancelled(), 1, "{report}");
    assert_eq!(report.total(), 2, "{report}");
}

/// A fan-out whose optional branch's constructor panics: the panic is the caller's (the
/// constructor runs in `join`), so it comes out of `join`, and the fan-out ends as for a
/// failed required branch: the running sibling is cancelled and awaited (not left to run to
/// its end, whose result nobody would see), each branch with one receipt (the optional one
/// `Failed`).
#[tokio::test(start_paused = true)]
async fn a_fan_out_whose_optional_constructor_panics_cancels_its_siblings_then_panics() {
    let scope = Scope::new();
    let t0 = tokio::time::Instant::now();
    let stopped = Arc::new(AtomicBool::new(false));
    let mut fan = FanOut::new(&scope);
    let st = stopped.clone();
    let _a = fan.required("slow", move |_: Scope| {
        // Dropped with the branch's future (whether or not it was ever polled).
        let flag = SetOnDrop(st);
        async move {
            let _flag = flag;
            tokio::time::sleep(50 * MS).await;
            Ok::<_, &str>(1)
        }
    });
    let _b = fan.optional("bad", |_: Scope| -> std::future::Ready<Result<(), &str>> {
        panic!("this constructor panics")
    });
    let out = std::panic::AssertUnwindSafe(fan.join())
        .catch_unwind()
        .await;
    assert_eq!(message(out.unwrap_err()), "this constructor panics");
    assert!(
        stopped.load(Ordering::SeqCst),
        "join waited for the sibling"
    );
    assert_eq!(
        tokio::time::Instant::now(),
        t0,
        "the sibling was cancelled at once"
    );
    let report = report_of(&scope).await;
    assert_eq!(report.cancelled(), 1, "{report}");
    assert_eq!(report.failed(), 1, "{report}");
    assert_eq!(report.total(), 2, "{report}");
}

/// Without panic, a fan-out whose required branch fails cancels its running sibling and
/// waits for it; each has one receipt.
#[tokio::test(start_paused = true)]
async fn a_fan_out_without_panic_cancels_and_awaits_the_siblings_of_a_failed_branch() {
    let scope = Scope::new();
    let stopped = Arc::new(AtomicBool::new(false));
    let mut fan = FanOut::new(&scope);
    let _a = fan.required("fails", |_: Scope| async {
        tokio::time::sleep(10 * MS).await;
        Err::<(), _>("boom")
    });
    let st = stopped.clone();
    let _b = fan.optional("slow", move |_: Scope| async move {
        let _flag = SetOnDrop(st);
        std::future::pending::<Result<(), &str>>().await
    });
    let err = fan.join().await.unwrap_err();
    assert!(err.to_string().contains("fails"), "{err}");
    assert!(stopped.load(Ordering::SeqCst));
    let report = report_of(&scope).await;
    assert_eq!(report.failed(), 1, "{report}");
    assert_eq!(report.cancelled(), 1, "{report}");
}
