//! The retry decision table of the design notes (seed 001), one test per row, plus the other
//! classifications: a retry-after hint, side-effecting work.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cancel_scope::budget::Split;
use cancel_scope::retry::{AttemptEnd, Decision, Exponential, HedgeDelay, Retry, Stop};
use cancel_scope::{Cause, ChildSpec, Lifecycle, Scope};
use tokio::time::Instant;

use crate::support::time::{latest_instant, ms};
use crate::Failure;

#[derive(Debug, Clone, PartialEq, Eq)]
enum CallError {
    Connect,
    Unavailable,
    InvalidArgument,
    WriteTimeout,
    Pushback(Duration),
}

fn classify(e: &CallError) -> Decision {
    match e {
        CallError::Connect => Decision::SwitchEndpoint,
        CallError::Unavailable => Decision::Backoff,
        CallError::InvalidArgument => Decision::Never,
        CallError::WriteTimeout => Decision::EffectUnknown,
        CallError::Pushback(d) => Decision::RetryAfter(*d),
    }
}

/// 700 ms left, connection refused: one retry after the backoff, on another node.
#[tokio::test(start_paused = true)]
async fn row_700ms_connect_error_retries_once_after_backoff_on_another_endpoint() {
    let request = Scope::with_timeout(ms(700));
    let backoff = Exponential::new(ms(20), ms(200)).seed(1);
    let expected_delay = backoff.into_iter().next().unwrap();
    let retry = Retry::new(classify).backoff(backoff);

    let (result, ledger) = retry
        .run_with_ledger(
            &request,
            ChildSpec::read_only("inventory"),
            |a| async move {
                if a.endpoint() == 0 {
                    return Err(CallError::Connect);
                }
                tokio::time::sleep(ms(50)).await;
                Ok(a.endpoint())
            },
        )
        .await;

    assert_eq!(result.unwrap(), 1);
    assert_eq!(ledger.started(), 2);
    assert_eq!(ledger.stop(), Some(&Stop::Succeeded));
    let [first, second] = ledger.attempts() else {
        panic!("two attempts expected")
    };
    assert_eq!(
        first.end(),
        Some(AttemptEnd::Failed(Decision::SwitchEndpoint))
    );
    assert_eq!(second.endpoint(), 1);
    // The backoff was slept, and paid from the same budget.
    assert!(expected_delay >= ms(10) && expected_delay <= ms(20));
    assert_eq!(
        second.started_at() - first.ended_at().unwrap(),
        expected_delay
    );
    assert_eq!(request.remaining(), Some(ms(700) - expected_delay - ms(50)));
}

/// 150 ms left and the dependency's p95 is 300 ms: no retry; the caller keeps its 150 ms to
/// degrade or answer.
#[tokio::test(start_paused = true)]
async fn row_150ms_left_below_dependency_p95_does_not_retry() {
    let request = Scope::with_timeout(ms(1000));
    let retry = Retry::new(classify)
        .split(Split::Greedy { cap: None })
        .min_useful(ms(300)) // the dependency's p95
        .backoff(vec![ms(10), ms(10)]);
    let err = retry
        .run(&request, ChildSpec::read_only("inventory"), |_| async {
            tokio::time::sleep(ms(850)).await;
            Err::<(), _>(CallError::Unavailable)
        })
        .await
        .unwrap_err();

    assert_eq!(err.stop(), &Stop::BelowMinUseful);
    assert!(err.is_budget_exhausted() && !err.is_deadline_exceeded());
    assert_eq!(err.ledger().started(), 1);
    assert_eq!(err.last_error(), Some(&CallError::Unavailable));
    // Not even the backoff was slept: nothing could have started after it.
    assert_eq!(request.remaining(), Some(ms(150)));
    assert_eq!(err.ledger().elapsed(), ms(850));
}

/// 500 ms left, invalid argument: fail at once.
#[tokio::test(start_paused = true)]
async fn row_500ms_invalid_argument_fails_at_once() {
    let request = Scope::with_timeout(ms(500));
    let retry = Retry::new(classify).max_attempts(5);
    let err = retry
        .run(&request, ChildSpec::read_only("inventory"), |_| async {
            Err::<(), _>(CallError::InvalidArgument)
        })
        .await
        .unwrap_err();

    assert_eq!(err.stop(), &Stop::NotRetryable);
    assert_eq!(err.ledger().started(), 1);
    assert_eq!(err.ledger().elapsed(), Duration::ZERO);
    assert_eq!(request.remaining(), Some(ms(500)));
    assert_eq!(err.into_last_error(), Some(CallError::InvalidArgument));
}

/// 600 ms left, the write timed out: retried with the same idempotency key; the key settles the
/// first attempt's unknown outcome, so nothing needs reconciling.
#[tokio::test(start_paused = true)]
async fn row_600ms_write_timeout_retries_with_the_same_idempotency_key() {
    let request = Scope::with_timeout(ms(600));
    let seen_keys = Arc::new(Mutex::new(Vec::new()));
    let retry = Retry::new(classify).max_attempts(2).backoff(vec![ms(0)]);

    let (result, ledger) = retry
        .run_with_ledger(
            &request,
            ChildSpec::idempotent("put-order", "order-42"),
            |a| {
                let seen_keys = seen_keys.clone();
                async move {
                    seen_keys
                        .lock()
                        .unwrap()
                        .push(a.idempotency_key().unwrap().to_owned());
                    if a.number() == 1 {
                        std::future::pending::<()>().await; // the write hangs
                    }
                    tokio::time::sleep(ms(50)).await;
                    Ok::<_, CallError>("created")
                }
            },
        )
        .await;

    assert_eq!(result.unwrap(), "created");
    assert_eq!(*seen_keys.lock().unwrap(), ["order-42", "order-42"]);
    let budgets: Vec<_> = ledger.attempts().iter().map(|a| a.budget()).collect();
    assert_eq!(budgets, [Some(ms(300)), Some(ms(300))]);
    assert_eq!(ledger.attempts()[0].end(), Some(AttemptEnd::TimedOut));

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

/// The same write, reported by the client as "timed out after sending", with no attempt that
/// succeeds: the effect stays unknown and is reported for reconciliation under its key.
#[tokio::test(start_paused = true)]
async fn idempotent_write_with_unknown_outcome_and_no_success_needs_reconciliation() {
    let request = Scope::with_timeout(ms(600));
    let retry = Retry::new(classify).max_attempts(2).backoff(vec![ms(10)]);
    let err = retry
        .run(
            &request,
            ChildSpec::idempotent("put-order", "order-42"),
            |_| async { Err::<(), _>(CallError::WriteTimeout) },
        )
        .await
        .unwrap_err();
    assert_eq!(err.stop(), &Stop::AttemptsExhausted);
    assert_eq!(err.ledger().started(), 2);

    request.close();
    let report = request.quiesce().await;
    assert_eq!(report.state(), Lifecycle::NeedsReconciliation);
    assert_eq!(report.effect_unknown(), 2);
    assert!(report
        .pending_effects()
        .iter()
        .all(|e| e.effect_id() == "order-42"));
}

/// 0 ms left: nothing starts.
#[tokio::test(start_paused = true)]
async fn row_0ms_left_starts_nothing() {
    let request = Scope::with_timeout(ms(0));
    let called = Arc::new(Mutex::new(0));
    let c = called.clone();
    let err = Retry::new(classify)
        .run(&request, ChildSpec::read_only("inventory"), move |_| {
            *c.lock().unwrap() += 1;
            async { Ok::<_, CallError>(()) }
        })
        .await
        .unwrap_err();
    assert_eq!(*called.lock().unwrap(), 0);
    assert_eq!(err.stop(), &Stop::Cancelled(Cause::DeadlineExceeded));
    assert!(err.is_deadline_exceeded() && err.is_cancelled() && !err.is_budget_exhausted());
    assert_eq!(err.ledger().started(), 0);
}

/// The budget runs out while an attempt is in flight: the attempt is cancelled downstream and
/// the call ends, although attempts remain.
#[tokio::test(start_paused = true)]
async fn row_0ms_reached_during_an_attempt_cancels_it_and_stops() {
    let request = Scope::with_timeout(ms(200));
    let attempt_scopes = Arc::new(Mutex::new(Vec::new()));
    let retry = Retry::new(classify)
        .max_attempts(3)
        .split(Split::Greedy { cap: None });
    let s = attempt_scopes.clone();
    let err = retry
        .run(&request, ChildSpec::read_only("inventory"), move |a| {
            s.lock().unwrap().push(a.scope().clone());
            std::future::pending::<Result<(), CallError>>()
        })
        .await
        .unwrap_err();

    assert_eq!(err.stop(), &Stop::Cancelled(Cause::DeadlineExceeded));
    assert_eq!(err.ledger().started(), 1);
    assert_eq!(err.ledger().attempts()[0].end(), Some(AttemptEnd::Stopped));
    let attempt = attempt_scopes.lock().unwrap()[0].clone();
    assert!(attempt.cause().unwrap().is_deadline_exceeded());
    drop(attempt);

    let report = request.quiesce().await;
    assert_eq!(report.state(), Lifecycle::CancelledStable);
    assert_eq!(report.cancelled(), 1);
}

/// A retry-after hint within the budget is waited for exactly; one past the last start fails
/// fast, without sleeping.
#[tokio::test(start_paused = true)]
async fn retry_after_hint_is_honoured_or_fails_fast() {
    let request = Scope::with_timeout(ms(1000));
    let retry = Retry::new(classify).split(Split::Greedy { cap: Some(ms(200)) });
    let (result, ledger) = retry
        .run_with_ledger(&request, ChildSpec::read_only("quota"), |a| async move {
            if a.number() == 1 {
                Err(CallError::Pushback(ms(120)))
            } else {
                Ok(())
            }
        })
        .await;
    result.unwrap();
    assert_eq!(ledger.attempts()[1].started_at() - ledger.began(), ms(120));

    let t0 = Instant::now();
    let err = retry
        .run(&request, ChildSpec::read_only("quota"), |_| async {
            Err::<(), _>(CallError::Pushback(ms(5000)))
        })
        .await
        .unwrap_err();
    assert_eq!(err.stop(), &Stop::RetryAfterTooLong(ms(5000)));
    assert!(err.is_budget_exhausted());
    assert_eq!(t0.elapsed(), Duration::ZERO);
}

/// Side-effecting work never retries; one that timed out after dispatch ends EffectUnknown.
#[tokio::test(start_paused = true)]
async fn side_effecting_work_never_retries_and_a_timeout_is_effect_unknown() {
    let request = Scope::with_timeout(ms(1000));
    let retry = Retry::new(classify)
        .max_attempts(3)
        .split(Split::Greedy { cap: Some(ms(300)) });

    let err = retry
        .run(
            &request,
            ChildSpec::side_effecting("charge-card", "payment-7"),
            |_| std::future::pending::<Result<(), CallError>>(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.stop(), &Stop::EffectUnknown);
    assert_eq!(err.ledger().max_attempts(), 1);
    assert_eq!(err.ledger().started(), 1);
    assert_eq!(err.ledger().attempts()[0].end(), Some(AttemptEnd::TimedOut));

    let err = retry
        .run(
            &request,
            ChildSpec::side_effecting("charge-card", "payment-8"),
            |_| async { Err::<(), _>(CallError::Unavailable) },
        )
        .await
        .unwrap_err();
    assert_eq!(err.stop(), &Stop::NotIdempotent);
    assert_eq!(err.ledger().started(), 1);

    request.close();
    let report = request.quiesce().await;
    assert_eq!(report.state(), Lifecycle::NeedsReconciliation);
    assert_eq!((report.effect_unknown(), report.failed()), (1, 1));
    assert_eq!(report.pending_effects()[0].effect_id(), "payment-7");
}

/// An answer that may have had its effect and says when to come back (a 503 with
/// `Retry-After`): read-only and idempotent work retry after exactly that delay, the
/// idempotent attempt kept `EffectUnknown` until the success; side-effecting work stops at
/// once with `EffectUnknown`, not "not idempotent", and sleeps nothing.
#[tokio::test(start_paused = true)]
async fn effect_unknown_after_a_delay_waits_for_safe_work_and_stops_a_write() {
    let busy = |_: &()| Decision::EffectUnknownAfter(ms(120));
    let retry = Retry::new(busy).max_attempts(2);
    for spec in [
        ChildSpec::read_only("stock"),
        ChildSpec::idempotent("put-order", "order-9"),
    ] {
        let request = Scope::with_timeout(ms(1000));
        let (result, ledger) = retry
            .run_with_ledger(&request, spec, |a| async move {
                if a.number() == 1 {
                    Err(())
                } else {
                    Ok(())
                }
            })
            .await;
        result.unwrap();
        assert_eq!(ledger.attempts()[1].started_at() - ledger.began(), ms(120));
        assert_eq!(
            ledger.attempts()[0].end(),
            Some(AttemptEnd::Failed(Decision::EffectUnknownAfter(ms(120))))
        );
    }

    let request = Scope::with_timeout(ms(1000));
    let t0 = Instant::now();
    let err = retry
        .run(
            &request,
            ChildSpec::side_effecting("charge-card", "payment-9"),
            |_| async { Err::<(), _>(()) },
        )
        .await
        .unwrap_err();
    assert_eq!(err.stop(), &Stop::EffectUnknown);
    assert_eq!(err.ledger().started(), 1);
    assert_eq!(t0.elapsed(), Duration::ZERO);
    request.close();
    let report = request.quiesce().await;
    assert_eq!(report.state(), Lifecycle::NeedsReconciliation);
    assert_eq!(report.pending_effects()[0].effect_id(), "payment-9");
}

/// Builder rules only ever tighten: a retry policy's reserve, minimum useful budget and
/// per-attempt cap set twice keep the stricter value, in either order (a layer that narrows a
/// policy it was handed cannot widen it by accident).
#[tokio::test(start_paused = true)]
async fn a_retry_rule_set_twice_keeps_the_stricter_value() {
    let budget_of = |retry: Retry<fn(&CallError) -> Decision>| async move {
        let request = Scope::with_timeout(ms(1000));
        retry
            .max_attempts(1)
            .run(&request, ChildSpec::read_only("db"), |a| async move {
                Ok::<_, CallError>(a.remaining())
            })
            .await
    };
    let greedy = |cap| Split::Greedy { cap };
    let policy = || Retry::new(classify as fn(&CallError) -> Decision).split(greedy(None));
    // The larger reserve.
    for (a, b) in [(ms(300), ms(100)), (ms(100), ms(300))] {
        let got = budget_of(policy().reserve(a).reserve(b)).await.unwrap();
        assert_eq!(got, Some(ms(700)));
    }
    // The smaller per-attempt cap, whichever split came last (the later one's way of sharing).
    for (a, b) in [
        (Some(ms(200)), None),
        (None, Some(ms(200))),
        (Some(ms(200)), Some(ms(600))),
    ] {
        let got = budget_of(policy().split(greedy(a)).split(greedy(b)))
            .await
            .unwrap();
        assert_eq!(got, Some(ms(200)));
    }
    let even = policy()
        .split(greedy(Some(ms(200))))
        .split(Split::Even { cap: None });
    assert_eq!(budget_of(even).await.unwrap(), Some(ms(200)));
    // The larger minimum useful budget: no attempt starts with 1000 ms for 1200 ms.
    for (a, b) in [(ms(1200), ms(10)), (ms(10), ms(1200))] {
        let err = budget_of(policy().min_useful(a).min_useful(b))
            .await
            .unwrap_err();
        assert_eq!(err.stop(), &Stop::BelowMinUseful);
        assert_eq!(err.ledger().started(), 0);
    }
}

/// `Retry::rules` is the reserve, the minimum useful budget and the per-attempt cap at once:
/// the attempts get what the three setters give them, and are refused where those refuse.
#[tokio::test(start_paused = true)]
async fn retry_rules_give_the_attempts_what_the_three_setters_give() {
    use cancel_scope::budget::Rules;
    let budget_of = |retry: Retry<fn(&CallError) -> Decision>, request_ms| async move {
        let request = Scope::with_timeout(ms(request_ms));
        retry
            .max_attempts(1)
            .run(&request, ChildSpec::read_only("db"), |a| async move {
                Ok::<_, CallError>(a.remaining())
            })
            .await
    };
    let policy =
        || Retry::new(classify as fn(&CallError) -> Decision).split(Split::Greedy { cap: None });
    let rules = Rules::new()
        .reserve(ms(100))
        .cap(ms(300))
        .min_useful(ms(200));
    let by_setters = || {
        policy()
            .reserve(ms(100))
            .split(Split::Greedy { cap: Some(ms(300)) })
            .min_useful(ms(200))
    };
    // 1000 ms: the cap; 350 ms: less the reserve.
    for (request_ms, attempt) in [(1000, ms(300)), (350, ms(250))] {
        let got = budget_of(policy().rules(rules), request_ms).await.unwrap();
        assert_eq!(got, Some(attempt));
        assert_eq!(budget_of(by_setters(), request_ms).await.unwrap(), got);
    }
    // 250 ms: 150 ms after the reserve, below the minimum: no attempt either way.
    for retry in [policy().rules(rules), by_setters()] {
        let err = budget_of(retry, 250).await.unwrap_err();
        assert_eq!(err.stop(), &Stop::BelowMinUseful);
        assert_eq!(err.ledger().started(), 0);
    }
}

/// A dependency's pushback that lands at the very end of what an `Instant` holds, in a scope
/// without deadline, is too long (it would never be slept to its end), not a panic.
// regression: a pushback at the end of what an `Instant` holds was slept, for 30 years.
#[tokio::test(start_paused = true)]
async fn a_pushback_to_the_end_of_time_is_too_long() {
    let request = Scope::new();
    let hint = latest_instant(Instant::now()) - Instant::now();
    let retry = Retry::new(move |_: &()| Decision::RetryAfter(hint)).max_attempts(2);
    let err = retry
        .run(&request, ChildSpec::read_only("db"), |_| async {
            Err::<(), _>(())
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err.stop(), Stop::RetryAfterTooLong(d) if *d == hint),
        "{err:?}"
    );
}

/// A retry or a hedge told to come back after a hint too long to represent (`Duration::MAX`),
/// in a scope without deadline, never starts again: it ends `RetryAfterTooLong` at once.
// regression: a retry slept until a cancel, a hedge ignored the hint and started at once.
#[tokio::test(start_paused = true)]
async fn an_endless_retry_after_ends_the_call() {
    let request = Scope::new();
    let spec = ChildSpec::read_only("quota");
    let retry = Retry::new(|_: &Failure| Decision::RetryAfter(Duration::MAX)).max_attempts(3);
    let op = |_| async { Err::<(), _>(Failure::Busy) };
    let sequential = retry.run_with_ledger(&request, spec.clone(), op).await;
    let hedged = retry
        .hedge(HedgeDelay::Fixed(ms(100)))
        .run_with_ledger(&request, spec, op)
        .await;
    for (out, ledger) in [sequential, hedged] {
        assert_eq!(ledger.started(), 1);
        assert_eq!(
            out.unwrap_err().stop(),
            &Stop::RetryAfterTooLong(Duration::MAX)
        );
    }
}

/// A policy kept in application state is named `BoxRetry<E>`: a closure that captures what it
/// needs (which a `fn` pointer cannot) or a built-in classifier, no cast; clones share it.
#[tokio::test(start_paused = true)]
async fn a_boxed_policy_is_nameable_and_classifies_as_its_closure() {
    use cancel_scope::retry::BoxRetry;

    struct State {
        inventory: BoxRetry<CallError>,
    }
    let retryable = [CallError::Unavailable];
    let state = State {
        inventory: Retry::boxed(move |e: &CallError| {
            if retryable.contains(e) {
                Decision::RetryNow
            } else {
                Decision::Never
            }
        })
        .max_attempts(3),
    };
    let request = Scope::with_timeout(ms(1000));
    let policy = state.inventory.clone();
    let err = policy
        .run(&request, ChildSpec::read_only("inventory"), |_| async {
            Err::<(), _>(CallError::Unavailable)
        })
        .await
        .unwrap_err();
    assert_eq!(err.stop(), &Stop::AttemptsExhausted);
    let err = state
        .inventory
        .run(&request, ChildSpec::read_only("inventory"), |_| async {
            Err::<(), _>(CallError::InvalidArgument)
        })
        .await
        .unwrap_err();
    assert_eq!(err.stop(), &Stop::NotRetryable);
    assert_eq!(err.ledger().started(), 1);
}
