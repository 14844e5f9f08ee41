//! Hedged requests: a second attempt after a delay, the first success wins, and the call
//! returns only after the losers have their receipts.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cancel_scope::retry::{
    AttemptEnd, Classify, Decision, HedgeDelay, Latencies, Retry, RetryBudget, RetryError, Stop,
};
use cancel_scope::{Cause, ChildSpec, Lifecycle, Report, Scope};
use tokio::time::Instant;

use crate::support::time::{latest_instant, ms};
use crate::Failure;

#[derive(Debug, PartialEq)]
enum SearchError {
    Overloaded,
    BadQuery,
}

fn classify(e: &SearchError) -> Decision {
    match e {
        SearchError::Overloaded => Decision::Backoff,
        SearchError::BadQuery => Decision::Never,
    }
}

#[tokio::test(start_paused = true)]
async fn losers_have_receipts_when_the_call_returns() {
    let request = Scope::with_timeout(ms(1000));
    let hedge = Retry::new(classify)
        .max_attempts(3)
        .hedge(HedgeDelay::Fixed(ms(50)));
    let t0 = Instant::now();
    let (winner, ledger) = hedge
        .run_with_ledger(&request, ChildSpec::read_only("search"), |a| async move {
            // The first two replicas stall; the third answers in 5 ms.
            let took = if a.number() < 3 { ms(10_000) } else { ms(5) };
            tokio::time::sleep(took).await;
            Ok::<_, SearchError>(a.number())
        })
        .await;
    assert_eq!(winner.unwrap(), 3);
    assert_eq!(t0.elapsed(), ms(105));
    assert_eq!(
        (ledger.started(), ledger.hedges(), ledger.peak_concurrent()),
        (3, 2, 3)
    );
    assert_eq!(ledger.concurrent(), 0);
    let starts: Vec<_> = ledger
        .attempts()
        .iter()
        .map(|a| a.started_at() - t0)
        .collect();
    assert_eq!(starts, [ms(0), ms(50), ms(100)]);
    let ends: Vec<_> = ledger.attempts().iter().map(|a| a.end().unwrap()).collect();
    assert_eq!(
        ends,
        [
            AttemptEnd::Stopped,
            AttemptEnd::Stopped,
            AttemptEnd::Succeeded
        ]
    );

    // No yield since the call returned: every attempt already has its receipt.
    request.close();
    assert_eq!(request.lifecycle(), Lifecycle::Completed);
    let report = request.quiesce().await;
    assert_eq!((report.succeeded(), report.cancelled()), (1, 2));
    assert_eq!(report.retry_ledgers()[0].hedges(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_fast_first_attempt_starts_no_hedge() {
    let request = Scope::with_timeout(ms(1000));
    let hedge = Retry::new(classify).hedge(HedgeDelay::Fixed(ms(50)));
    let (winner, ledger) = hedge
        .run_with_ledger(&request, ChildSpec::read_only("search"), |_| async {
            tokio::time::sleep(ms(20)).await;
            Ok::<_, SearchError>("hit")
        })
        .await;
    assert_eq!(winner.unwrap(), "hit");
    assert_eq!(
        (ledger.started(), ledger.hedges(), ledger.peak_concurrent()),
        (1, 0, 1)
    );
}

/// The delay is the dependency's observed p95.
#[tokio::test(start_paused = true)]
async fn percentile_delay_follows_observed_latency() {
    let latencies = Arc::new(Latencies::new(100));
    for n in 1..=100 {
        latencies.record(ms(n));
    }
    let request = Scope::with_timeout(ms(1000));
    let hedge = Retry::new(classify)
        .max_attempts(2)
        .hedge(HedgeDelay::Percentile {
            latencies: latencies.clone(),
            percentile: 95,
            fallback: ms(10),
        });
    let t0 = Instant::now();
    let (winner, ledger) = hedge
        .run_with_ledger(&request, ChildSpec::read_only("search"), |a| async move {
            tokio::time::sleep(if a.is_hedge() { ms(3) } else { ms(500) }).await;
            Ok::<_, SearchError>(a.is_hedge())
        })
        .await;
    assert!(winner.unwrap());
    assert_eq!(ledger.attempts()[1].started_at() - t0, ms(95));
    // The winner's latency joined the window.
    assert_eq!(latencies.len(), 100);
    assert_eq!(latencies.percentile(1), Some(ms(2))); // 1 ms fell out, 3 ms came in
}

/// A window smaller than 10 latencies is used once it is full: the delay follows the observed
/// percentile, not the fallback forever.
#[tokio::test(start_paused = true)]
async fn a_small_latency_window_is_used_once_full() {
    let latencies = Arc::new(Latencies::new(4));
    for n in [20, 30, 40, 50] {
        latencies.record(ms(n));
    }
    let request = Scope::with_timeout(ms(1000));
    let hedge = Retry::new(classify)
        .max_attempts(2)
        .hedge(HedgeDelay::Percentile {
            latencies,
            percentile: 50,
            fallback: ms(500),
        });
    let t0 = Instant::now();
    let (winner, ledger) = hedge
        .run_with_ledger(&request, ChildSpec::read_only("search"), |a| async move {
            tokio::time::sleep(if a.is_hedge() { ms(3) } else { ms(900) }).await;
            Ok::<_, SearchError>(a.is_hedge())
        })
        .await;
    assert!(winner.unwrap());
    assert_eq!(ledger.attempts()[1].started_at() - t0, ms(30));
}

/// Hedges draw from the process-wide retry budget; refused hedges are counted and the call goes
/// on with the attempts it has.
#[tokio::test(start_paused = true)]
async fn hedges_are_limited_by_the_retry_budget() {
    let budget = Arc::new(RetryBudget::new(0).burst(1));
    let request = Scope::with_timeout(ms(1000));
    let hedge = Retry::new(classify)
        .max_attempts(3)
        .budget(budget.clone())
        .hedge(HedgeDelay::Fixed(ms(50)));
    let (winner, ledger) = hedge
        .run_with_ledger(&request, ChildSpec::read_only("search"), |a| async move {
            tokio::time::sleep(ms(200)).await;
            Ok::<_, SearchError>(a.number())
        })
        .await;
    assert_eq!(winner.unwrap(), 1);
    assert_eq!(
        (
            ledger.started(),
            ledger.hedges(),
            ledger.refused_by_budget()
        ),
        (2, 1, 1)
    );
    assert_eq!((budget.retries(), budget.refused()), (1, 1));
}

/// Side-effecting work is never hedged.
#[tokio::test(start_paused = true)]
async fn side_effecting_work_is_not_hedged() {
    let request = Scope::with_timeout(ms(1000));
    let calls = AtomicU32::new(0);
    let hedge = Retry::new(classify)
        .max_attempts(3)
        .hedge(HedgeDelay::Fixed(ms(10)));
    let (res, ledger) = hedge
        .run_with_ledger(
            &request,
            ChildSpec::side_effecting("send-mail", "mail-1"),
            |_| {
                calls.fetch_add(1, Ordering::SeqCst);
                async {
                    tokio::time::sleep(ms(100)).await;
                    Ok::<_, SearchError>(())
                }
            },
        )
        .await;
    res.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!((ledger.max_attempts(), ledger.hedges()), (1, 0));
}

/// An error that retrying cannot fix fails the call at once and stops the other attempts.
#[tokio::test(start_paused = true)]
async fn a_non_retryable_error_fails_at_once_and_stops_the_others() {
    let request = Scope::with_timeout(ms(1000));
    let hedge = Retry::new(classify)
        .max_attempts(3)
        .hedge(HedgeDelay::Fixed(ms(50)));
    let t0 = Instant::now();
    let err = hedge
        .run(&request, ChildSpec::read_only("search"), |a| async move {
            if a.is_hedge() {
                tokio::time::sleep(ms(5)).await;
                Err(SearchError::BadQuery)
            } else {
                tokio::time::sleep(ms(900)).await;
                Ok(())
            }
        })
        .await
        .unwrap_err();
    assert_eq!(err.stop(), &Stop::NotRetryable);
    assert_eq!(err.last_error(), Some(&SearchError::BadQuery));
    assert_eq!(t0.elapsed(), ms(55));
    assert_eq!(err.ledger().attempts()[0].end(), Some(AttemptEnd::Stopped));
    request.close();
    assert_eq!(request.lifecycle(), Lifecycle::Completed);
}

/// A retryable failure with nothing else in flight starts the next attempt at once.
#[tokio::test(start_paused = true)]
async fn a_failure_with_nothing_in_flight_starts_the_next_attempt() {
    let request = Scope::with_timeout(ms(1000));
    let hedge = Retry::new(classify)
        .max_attempts(2)
        .hedge(HedgeDelay::Fixed(ms(50)));
    let t0 = Instant::now();
    let (res, ledger) = hedge
        .run_with_ledger(&request, ChildSpec::read_only("search"), |a| async move {
            tokio::time::sleep(ms(10)).await;
            if a.number() == 1 {
                Err(SearchError::Overloaded)
            } else {
                Ok(a.number())
            }
        })
        .await;
    assert_eq!(res.unwrap(), 2);
    assert_eq!(t0.elapsed(), ms(20));
    assert!(!ledger.attempts()[1].is_hedge());
}

/// Idempotent losers share the winner's key: their effect is accounted for, nothing to
/// reconcile.
#[tokio::test(start_paused = true)]
async fn idempotent_losers_need_no_reconciliation() {
    let request = Scope::with_timeout(ms(1000));
    let hedge = Retry::new(classify)
        .max_attempts(2)
        .hedge(HedgeDelay::Fixed(ms(50)));
    let keys = std::sync::Mutex::new(Vec::new());
    hedge
        .run(
            &request,
            ChildSpec::idempotent("put-profile", "user-9:v3"),
            |a| {
                keys.lock()
                    .unwrap()
                    .push(a.idempotency_key().unwrap().to_owned());
                async move {
                    tokio::time::sleep(if a.is_hedge() { ms(10) } else { ms(500) }).await;
                    Ok::<_, SearchError>(())
                }
            },
        )
        .await
        .unwrap();
    assert_eq!(*keys.lock().unwrap(), ["user-9:v3", "user-9:v3"]);
    request.close();
    let report = request.quiesce().await;
    assert_eq!(report.state(), Lifecycle::Completed);
    assert_eq!(
        (
            report.succeeded(),
            report.cancelled(),
            report.effect_unknown()
        ),
        (1, 1, 0)
    );
}

/// An attempt that succeeded before the request's cancel reached it (its answer is in, the
/// cancel comes before the hedged call looks) wins, as it does in a sequential retry: the
/// call returns its value and its ledger says `Succeeded`, not `Cancelled` beside an attempt
/// recorded succeeded.
#[tokio::test(start_paused = true)]
async fn a_success_collected_with_the_scope_cancel_still_wins() {
    let request = Scope::with_timeout(ms(1000));
    let r = request.clone();
    let (out, ledger) = Retry::new(classify)
        .max_attempts(2)
        .hedge(HedgeDelay::Fixed(ms(50)))
        .run_with_ledger(&request, ChildSpec::idempotent("put", "k-1"), move |_| {
            let r = r.clone();
            async move {
                tokio::time::sleep(ms(10)).await;
                r.cancel_with("client gone"); // arrives with the answer
                Ok::<_, SearchError>("written")
            }
        })
        .await;
    assert_eq!(out.unwrap(), "written");
    assert_eq!(ledger.stop(), Some(&Stop::Succeeded));
    assert_eq!(ledger.attempts()[0].end(), Some(AttemptEnd::Succeeded));
    let report = request.quiesce().await;
    assert_eq!((report.succeeded(), report.effect_unknown()), (1, 0));
}

/// The request's cancel stops every attempt; the call returns with the cause.
#[tokio::test(start_paused = true)]
async fn the_scope_cancel_stops_every_attempt() {
    let request = Scope::with_timeout(ms(80));
    let hedge = Retry::new(classify)
        .max_attempts(3)
        .hedge(HedgeDelay::Fixed(ms(30)));
    let err = hedge
        .run(&request, ChildSpec::read_only("search"), |_| {
            std::future::pending::<Result<(), SearchError>>()
        })
        .await
        .unwrap_err();
    assert_eq!(err.stop(), &Stop::Cancelled(Cause::DeadlineExceeded));
    assert_eq!(err.ledger().started(), 3);
    let report = request.quiesce().await;
    assert_eq!(report.state(), Lifecycle::CancelledStable);
    assert_eq!(report.cancelled(), 3);
}

/// Dropping the hedged call (its caller gave up) cancels the attempts in flight; each still
/// records its receipt.
#[tokio::test(start_paused = true)]
async fn dropping_the_call_leaves_no_orphan_attempt() {
    let request = Scope::with_timeout(ms(1000));
    let hedge = Retry::new(classify)
        .max_attempts(2)
        .hedge(HedgeDelay::Fixed(ms(10)));
    let call = hedge.run(&request, ChildSpec::read_only("search"), |_| {
        std::future::pending::<Result<(), SearchError>>()
    });
    assert!(tokio::time::timeout(ms(50), call).await.is_err());
    request.close();
    let report = request.quiesce().await;
    assert_eq!(report.state(), Lifecycle::Completed);
    assert_eq!(report.cancelled(), 2);
    assert_eq!(report.orphan_work(), Duration::ZERO);
}

/// A hedge of two attempts (the hedge 50 ms after the first) that both answer at 100 ms, the
/// first with `answer(false)`, the hedge with `answer(true)`: the call ends on the first's
/// answer and drains the hedge, which answered before the cancel reached it. Returns the
/// call's result, how each attempt ended, and the request's report.
async fn both_answer_at_100ms<E, C>(
    classify: C,
    spec: ChildSpec,
    answer: impl Fn(bool) -> Result<u32, E> + Copy + Send + 'static,
) -> (Result<u32, RetryError<E>>, Vec<Option<AttemptEnd>>, Report)
where
    C: Classify<E>,
    E: Send + 'static,
{
    let request = Scope::with_timeout(ms(1000));
    let t0 = Instant::now();
    let hedge = Retry::new(classify)
        .max_attempts(2)
        .hedge(HedgeDelay::Fixed(ms(50)));
    let (res, ledger) = hedge
        .run_with_ledger(&request, spec, move |a| async move {
            tokio::time::sleep_until(t0 + ms(100)).await;
            answer(a.is_hedge())
        })
        .await;
    let ends = ledger.attempts().iter().map(|a| a.end()).collect();
    request.close();
    (res, ends, request.quiesce().await)
}

/// A loser that really failed (its error came back as the hedge was won, at the same instant)
/// is recorded as the failure it was, not as stopped by the cancel: `Failed`, a `Failed`
/// receipt, no `Cancelled` one.
#[tokio::test(start_paused = true)]
async fn a_hedge_loser_that_failed_is_recorded_failed() {
    let (winner, ends, report) =
        both_answer_at_100ms(classify, ChildSpec::read_only("search"), |hedge| {
            if hedge {
                Err(SearchError::Overloaded)
            } else {
                Ok(1)
            }
        })
        .await;
    assert_eq!(winner.unwrap(), 1);
    assert_eq!(
        ends,
        [
            Some(AttemptEnd::Succeeded),
            Some(AttemptEnd::Failed(Decision::Backoff))
        ]
    );
    assert_eq!(
        (
            report.state(),
            report.succeeded(),
            report.failed(),
            report.cancelled()
        ),
        (Lifecycle::Completed, 1, 1, 0),
        "{report}"
    );
}

/// Idempotent work, a failed call: the first attempt's definite `BadQuery` ends the call, and
/// the hedge's `Overloaded`, returned at the same instant, is drained as the definite failure
/// it was. Neither answer leaves an effect to reconcile, and the call's error stays the one
/// that ended it.
#[tokio::test(start_paused = true)]
async fn a_drained_hedge_with_a_definite_error_is_not_a_pending_effect() {
    let (res, ends, report) =
        both_answer_at_100ms(classify, ChildSpec::idempotent("put", "order-1"), |hedge| {
            Err(if hedge {
                SearchError::Overloaded
            } else {
                SearchError::BadQuery
            })
        })
        .await;
    let err = res.unwrap_err();
    assert_eq!(err.stop(), &Stop::NotRetryable);
    assert_eq!(err.last_error(), Some(&SearchError::BadQuery));
    assert_eq!(
        ends,
        [
            Some(AttemptEnd::Failed(Decision::Never)),
            Some(AttemptEnd::Failed(Decision::Backoff))
        ]
    );
    assert_eq!(
        (
            report.state(),
            report.failed(),
            report.cancelled(),
            report.effect_unknown(),
            report.pending_effects().len()
        ),
        (Lifecycle::Completed, 2, 0, 0, 0),
        "{report}"
    );
}

/// A drained loser whose error says its effect is unknown stays unknown: in a failed call it
/// is listed for reconciliation (as a failure, not as stopped by the cancel); in a call that
/// succeeded with the same idempotency key, the winner's effect accounts for it.
#[tokio::test(start_paused = true)]
async fn a_drained_hedge_whose_effect_is_unknown_is_settled_by_the_key() {
    #[derive(Debug)]
    enum PutError {
        Invalid,
        WriteTimedOut,
    }
    let classify = |e: &PutError| match e {
        PutError::Invalid => Decision::Never,
        PutError::WriteTimedOut => Decision::EffectUnknown,
    };
    // (state, succeeded, failed, cancelled, effect unknown, pending effects)
    let unknown = (Lifecycle::NeedsReconciliation, 0, 1, 0, 1, 1);
    let settled = (Lifecycle::Completed, 1, 0, 1, 0, 0);
    for (first_succeeds, expected) in [(false, unknown), (true, settled)] {
        let (res, ends, report) = both_answer_at_100ms(
            classify,
            ChildSpec::idempotent("put", "order-2"),
            move |hedge| match (hedge, first_succeeds) {
                (true, _) => Err(PutError::WriteTimedOut),
                (false, true) => Ok(1),
                (false, false) => Err(PutError::Invalid),
            },
        )
        .await;
        assert_eq!(res.is_ok(), first_succeeds);
        assert_eq!(ends[1], Some(AttemptEnd::Failed(Decision::EffectUnknown)));
        assert_eq!(
            (
                report.state(),
                report.succeeded(),
                report.failed(),
                report.cancelled(),
                report.effect_unknown(),
                report.pending_effects().len()
            ),
            expected,
            "{report}"
        );
    }
}

/// A hedge delay too long to represent (`Duration::MAX`: "never hedge"), or one that lands at
/// the very end of what an `Instant` holds (a computed value, where tokio's rounding of a
/// sleep's deadline would overflow), never hedges, and panics nothing.
// regression: a hedge delay too long to represent, or at the end of time, panicked the call.
#[tokio::test(start_paused = true)]
async fn a_huge_hedge_delay_does_not_panic() {
    for at_the_end in [false, true] {
        // Read now: the hedge's clock reading is the same virtual instant.
        let now = Instant::now();
        let delay = if at_the_end {
            latest_instant(now) - now
        } else {
            Duration::MAX
        };
        let request = Scope::with_timeout(ms(1000));
        let hedge = Retry::new(|_: &()| Decision::Backoff)
            .max_attempts(2)
            .hedge(HedgeDelay::Fixed(delay));
        let out = hedge
            .run(&request, ChildSpec::read_only("search"), |_| async {
                tokio::time::sleep(ms(10)).await;
                Ok::<_, ()>(7)
            })
            .await;
        assert_eq!(out.unwrap(), 7, "{delay:?}");
    }
}

/// A hedged call told `RetryAfter(300 ms)` starts its next attempt only once the hint has
/// passed, as a sequential retry does.
// regression: a hedge ignored `RetryAfter` and started its next attempt at once.
#[tokio::test(start_paused = true)]
async fn a_hedge_honours_the_retry_after_hint() {
    let request = Scope::with_timeout(ms(1000));
    let hedge = Retry::new(|_: &()| Decision::RetryAfter(ms(300)))
        .max_attempts(2)
        .hedge(HedgeDelay::Fixed(ms(500)));
    let (out, ledger) = hedge
        .run_with_ledger(&request, ChildSpec::read_only("quota"), |a| async move {
            if a.number() == 1 {
                Err(())
            } else {
                Ok(())
            }
        })
        .await;
    out.unwrap();
    assert!(
        ledger.attempts()[1].started_at() - ledger.began() == ms(300),
        "retried {:?} after a 300 ms Retry-After",
        ledger.attempts()[1].started_at() - ledger.began()
    );
}

/// A hedged call told `SwitchEndpoint` moves its next attempt to the next endpoint.
// regression: a hedge ignored `SwitchEndpoint`.
#[tokio::test(start_paused = true)]
async fn a_hedge_switches_endpoint_when_told_to() {
    let request = Scope::with_timeout(ms(1000));
    let hedge = Retry::new(|_: &&str| Decision::SwitchEndpoint)
        .max_attempts(3)
        .hedge(HedgeDelay::Fixed(ms(500)));
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let out = hedge
        .run(&request, ChildSpec::read_only("db"), move |a| {
            c.fetch_add(1, Ordering::SeqCst);
            async move {
                if a.endpoint() == 0 {
                    Err("connection refused")
                } else {
                    Ok(a.endpoint())
                }
            }
        })
        .await;
    assert_eq!(out.unwrap(), 1, "all attempts went to the dead endpoint 0");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A hedge told `RetryAfter` longer than its budget allows, while another attempt is in
/// flight, starts nothing more: when the other attempt fails too, the call ends
/// `RetryAfterTooLong`, not with an attempt started at once.
// regression: the hedge started another attempt at once.
#[tokio::test(start_paused = true)]
async fn a_hedge_keeps_a_too_long_retry_after_while_another_attempt_is_in_flight() {
    let request = Scope::with_timeout(ms(1000));
    let hedge = Retry::new(|e: &Failure| match e {
        Failure::Busy => Decision::RetryAfter(ms(2000)),
        Failure::Down => Decision::Backoff,
    })
    .max_attempts(3)
    .hedge(HedgeDelay::Fixed(ms(100)));
    let (out, ledger) = hedge
        .run_with_ledger(&request, ChildSpec::read_only("quota"), |a| async move {
            match a.number() {
                1 => {
                    tokio::time::sleep(ms(150)).await;
                    Err(Failure::Busy)
                }
                2 => {
                    tokio::time::sleep(ms(100)).await;
                    Err(Failure::Down)
                }
                _ => Ok(()),
            }
        })
        .await;
    assert_eq!(ledger.started(), 2);
    assert_eq!(out.unwrap_err().stop(), &Stop::RetryAfterTooLong(ms(2000)));
}
