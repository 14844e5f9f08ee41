//! The fast path of a call whose first attempt succeeds (no hold on the scope, the ledger
//! attached before the attempt's receipt), and the receipts that wait for the ledger when the
//! scope closes under a running attempt: the ledger and the report say the same as on the
//! general path.

use std::sync::Arc;
use std::time::Duration;

use cancel_scope::budget::Split;
use cancel_scope::retry::{AttemptEnd, Decision, HedgeDelay, Ledger, Retry, RetryError, Stop};
use cancel_scope::{Cause, ChildSpec, Lifecycle, Report, Scope};
use tokio::time::Instant;

use crate::support::time::ms;
use crate::Unavailable;

/// Everything the ledger of a first attempt that succeeded after 40 ms must say.
fn assert_first_attempt_ledger(ledger: &Ledger, t0: Instant, budget: Duration, scope: &Scope) {
    assert_eq!(ledger.dependency(), "users");
    assert!(ledger.is_owner());
    assert_eq!((ledger.max_attempts(), ledger.started()), (3, 1));
    assert_eq!(ledger.hedges(), 0);
    assert_eq!(ledger.began(), t0);
    assert_eq!(ledger.elapsed(), ms(40));
    assert_eq!(ledger.last_start(), scope.deadline());
    assert_eq!((ledger.concurrent(), ledger.peak_concurrent()), (0, 1));
    assert_eq!(ledger.refused_by_budget(), 0);
    assert_eq!(ledger.stop(), Some(&Stop::Succeeded));
    let [a] = ledger.attempts() else {
        panic!("one attempt expected: {ledger:?}")
    };
    assert_eq!((a.number(), a.is_hedge(), a.endpoint()), (1, false, 0));
    assert_eq!(a.started_at(), t0);
    assert_eq!(a.budget(), Some(budget));
    assert_eq!(a.ended_at(), Some(t0 + ms(40)));
    assert_eq!(a.end(), Some(AttemptEnd::Succeeded));
}

/// The ledger of a first attempt that succeeds is complete, comes back with the result, and is
/// the very ledger in the scope's report (for both split policies: the greedy attempt keeps the
/// request's deadline, the even one arms a timer of its own).
#[tokio::test(start_paused = true)]
async fn a_first_attempt_success_returns_and_reports_the_full_ledger() {
    for (split, budget) in [
        (Split::Greedy { cap: None }, ms(900)),
        (Split::Even { cap: None }, ms(300)),
    ] {
        let request = Scope::with_timeout(ms(900));
        let t0 = Instant::now();
        let retry = Retry::new(|_: &Unavailable| Decision::Backoff).split(split);
        let (result, ledger) = retry
            .run_with_ledger(&request, ChildSpec::read_only("users"), |a| async move {
                assert_eq!(a.remaining(), Some(budget));
                tokio::time::sleep(ms(40)).await;
                Ok::<_, Unavailable>(a.number())
            })
            .await;
        assert_eq!(result.unwrap(), 1);
        assert_first_attempt_ledger(&ledger, t0, budget, &request);

        request.close();
        let report = request.quiesce().await;
        assert_eq!(report.state(), Lifecycle::Completed);
        assert_eq!((report.succeeded(), report.total()), (1, 1));
        let [reported] = report.retry_ledgers()[..] else {
            panic!("one ledger expected")
        };
        assert!(std::ptr::eq(reported, Arc::as_ptr(&ledger)));
    }
}

/// The fast path's ledger is the one the general path writes: a hedge (which holds the scope
/// from the start and settles its winner before closing) whose first attempt wins before any
/// hedge starts produces an equal ledger.
#[tokio::test(start_paused = true)]
async fn the_fast_path_ledger_equals_the_general_paths() {
    let op = |_| async {
        tokio::time::sleep(ms(40)).await;
        Ok::<_, Unavailable>(())
    };
    let policy = Retry::new(|_: &Unavailable| Decision::Backoff).split(Split::Greedy { cap: None });

    // Side by side, so that both start at the same instant.
    let (a, b) = (Scope::with_timeout(ms(900)), Scope::with_timeout(ms(900)));
    let hedge = policy.clone().hedge(HedgeDelay::Fixed(ms(500)));
    let ((fast, fast_ledger), (general, general_ledger)) = tokio::join!(
        policy.run_with_ledger(&a, ChildSpec::read_only("users"), op),
        hedge.run_with_ledger(&b, ChildSpec::read_only("users"), op),
    );
    fast.unwrap();
    general.unwrap();

    assert_eq!(fast_ledger, general_ledger);
    assert_eq!(fast_ledger.to_string(), general_ledger.to_string());
    assert_eq!(format!("{fast_ledger:?}"), format!("{general_ledger:?}"));
}

/// Without a hold, the running attempt's own ticket keeps the scope from quiescence: a quiesce
/// that starts while the first attempt runs returns after the call, with its ledger.
#[tokio::test(start_paused = true)]
async fn a_quiesce_racing_a_first_attempt_waits_for_its_ledger() {
    let request = Scope::with_timeout(ms(900));
    let t0 = Instant::now();
    let r = request.clone();
    let call = tokio::spawn(async move {
        Retry::new(|_: &Unavailable| Decision::Backoff)
            .run_with_ledger(&r, ChildSpec::read_only("users"), |_| async {
                tokio::time::sleep(ms(40)).await;
                Ok::<_, Unavailable>(())
            })
            .await
    });
    tokio::time::sleep(ms(10)).await; // the first attempt is running
    request.close();
    let report = request.quiesce().await;
    assert_eq!(Instant::now(), t0 + ms(40));
    let (result, ledger) = call.await.unwrap();
    result.unwrap();
    assert_first_attempt_ledger(&ledger, t0, ms(300), &request);
    assert_eq!(report.state(), Lifecycle::Completed);
    assert_eq!(report.succeeded(), 1);
    assert_eq!(report.retry_ledgers(), [&*ledger]);
}

/// Runs a call whose first attempt fails after 40 ms (classified `decision`, then a 100 ms
/// backoff) in a scope that is closed 10 ms in; returns the call's error, the scope's report
/// and when the quiesce returned.
async fn close_under_a_failing_first_attempt(
    decision: Decision,
    spec: ChildSpec,
) -> (RetryError<Unavailable>, Report, Duration) {
    let request = Scope::with_timeout(ms(900));
    let t0 = Instant::now();
    let r = request.clone();
    let call = tokio::spawn(async move {
        Retry::new(move |_: &Unavailable| decision)
            .backoff(vec![ms(100)])
            .run(&r, spec, |_| async {
                tokio::time::sleep(ms(40)).await;
                Err::<(), _>(Unavailable)
            })
            .await
            .unwrap_err()
    });
    tokio::time::sleep(ms(10)).await; // the first attempt is running
    request.close();
    let report = request.quiesce().await;
    let quiet_after = Instant::now() - t0;
    (call.await.unwrap(), report, quiet_after)
}

/// A scope closed while the first attempt runs refuses the hold that a retry needs: the failed
/// attempt's receipt then waits for the ledger, and the report still has both. The call finds
/// the watermark closed when the attempt fails and stops with `Closed` at once: no backoff is
/// slept after which nothing may start.
#[tokio::test(start_paused = true)]
async fn a_scope_closed_under_a_failing_first_attempt_reports_ledger_and_receipt() {
    let t0 = Instant::now();
    let (err, report, quiet_after) =
        close_under_a_failing_first_attempt(Decision::Backoff, ChildSpec::read_only("users")).await;
    assert_eq!(quiet_after, ms(40)); // the attempt, and no backoff
    assert_eq!(err.stop(), &Stop::Closed);
    let ledger = err.ledger();
    assert_eq!(ledger.started(), 1);
    assert_eq!(
        ledger.attempts()[0].end(),
        Some(AttemptEnd::Failed(Decision::Backoff))
    );
    assert_eq!(ledger.attempts()[0].ended_at(), Some(t0 + ms(40)));
    assert_eq!(report.retry_ledgers(), [&**ledger]);
    assert_eq!((report.failed(), report.total()), (1, 1));
}

/// The same for idempotent work whose outcome is unknown: its ticket is parked until the call
/// ends and then records `EffectUnknown` (the call failed), after the ledger was attached.
#[tokio::test(start_paused = true)]
async fn a_scope_closed_under_an_unknown_idempotent_attempt_reports_its_effect() {
    let (err, report, quiet_after) = close_under_a_failing_first_attempt(
        Decision::EffectUnknown,
        ChildSpec::idempotent("put-order", "order-7"),
    )
    .await;
    assert_eq!(quiet_after, ms(40));
    assert_eq!(err.stop(), &Stop::Closed);
    assert_eq!(report.retry_ledgers(), [&**err.ledger()]);
    assert_eq!((report.effect_unknown(), report.total()), (1, 1));
    assert_eq!(report.pending_effects().len(), 1);
    assert_eq!(report.pending_effects()[0].effect_id(), "order-7");
}

/// A cancel under the first attempt: the attempt is stopped (`Cancelled` receipt), the call
/// stops with the cause, and the ledger is in the report.
#[tokio::test(start_paused = true)]
async fn a_cancel_under_the_first_attempt_reports_ledger_and_receipt() {
    let request = Scope::with_timeout(ms(900));
    let r = request.clone();
    let call = tokio::spawn(async move {
        Retry::new(|_: &Unavailable| Decision::Backoff)
            .run(&r, ChildSpec::read_only("users"), |_| {
                std::future::pending::<Result<(), Unavailable>>()
            })
            .await
            .unwrap_err()
    });
    tokio::time::sleep(ms(10)).await;
    request.cancel();
    let report = request.quiesce().await;
    let err = call.await.unwrap();
    assert!(matches!(
        err.stop(),
        Stop::Cancelled(Cause::Cancelled { .. })
    ));
    assert_eq!(err.ledger().attempts()[0].end(), Some(AttemptEnd::Stopped));
    assert_eq!(report.retry_ledgers(), [&**err.ledger()]);
    assert_eq!((report.cancelled(), report.total()), (1, 1));
}
