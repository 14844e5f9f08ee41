//! The process-wide retry budget: retries stay a fixed ratio of requests during a storm, and
//! refused retries are counted.

use std::sync::Arc;
use std::time::Duration;

use cancel_scope::retry::{Decision, HedgeDelay, Retry, RetryBudget, Stop};
use cancel_scope::{ChildSpec, Scope};
use tokio::time::Instant;

use crate::support::time::ms;
use crate::{Failure, Unavailable};

#[tokio::test(start_paused = true)]
async fn a_storm_is_capped_to_the_ratio_and_refusals_are_counted() {
    let budget = Arc::new(RetryBudget::new(10).burst(5));
    let retry = Retry::new(|_: &Unavailable| Decision::RetryNow)
        .max_attempts(3)
        .budget(budget.clone());
    let request = Scope::with_timeout(Duration::from_secs(60));

    let mut attempts = 0;
    let mut refused_in_ledgers = 0;
    let mut stopped_by_budget = 0;
    for _ in 0..100 {
        let err = retry
            .run(&request, ChildSpec::read_only("inventory"), |_| async {
                Err::<(), _>(Unavailable)
            })
            .await
            .unwrap_err();
        attempts += err.ledger().started();
        refused_in_ledgers += err.ledger().refused_by_budget();
        if err.stop() == &Stop::RetryBudget {
            stopped_by_budget += 1;
        }
    }
    assert_eq!(budget.requests(), 100);
    // Without the budget: 300 attempts. With it: 100 requests + the burst + 10 % of requests.
    assert!(budget.retries() <= 5 + 10, "{} retries", budget.retries());
    assert_eq!(u64::from(attempts), 100 + budget.retries());
    assert_eq!(u64::from(refused_in_ledgers), budget.refused());
    assert_eq!(stopped_by_budget, budget.refused());
    assert!(budget.refused() >= 80);
}

#[tokio::test(start_paused = true)]
async fn healthy_traffic_earns_retries_back() {
    let budget = Arc::new(RetryBudget::new(20).burst(1));
    let retry = Retry::new(|_: &Unavailable| Decision::RetryNow)
        .max_attempts(2)
        .budget(budget.clone());
    let scope = Scope::new();
    let fail = |_| async { Err::<(), _>(Unavailable) };

    assert_eq!(
        retry
            .run(&scope, ChildSpec::read_only("db"), fail)
            .await
            .unwrap_err()
            .ledger()
            .started(),
        2
    );
    let err = retry
        .run(&scope, ChildSpec::read_only("db"), fail)
        .await
        .unwrap_err();
    assert_eq!(err.stop(), &Stop::RetryBudget);
    // Five successful requests deposit one token.
    for _ in 0..5 {
        retry
            .run(&scope, ChildSpec::read_only("db"), |_| async {
                Ok::<_, Unavailable>(())
            })
            .await
            .unwrap();
    }
    let err = retry
        .run(&scope, ChildSpec::read_only("db"), fail)
        .await
        .unwrap_err();
    assert_eq!(err.stop(), &Stop::AttemptsExhausted);
    assert_eq!(err.ledger().started(), 2);
}

/// Nested calls (not the retry owner) neither count as requests nor draw retries.
#[tokio::test(start_paused = true)]
async fn nested_calls_do_not_touch_the_budget() {
    let budget = Arc::new(RetryBudget::new(10).burst(10));
    let outer = Retry::new(|_: &cancel_scope::retry::RetryError<Unavailable>| Decision::RetryNow)
        .max_attempts(3)
        .budget(budget.clone());
    let inner = Retry::new(|_: &Unavailable| Decision::RetryNow)
        .max_attempts(3)
        .budget(budget.clone());
    let scope = Scope::new();
    let _ = outer
        .run(&scope, ChildSpec::read_only("db"), |a| {
            let inner = &inner;
            async move {
                inner
                    .run(a.scope(), ChildSpec::read_only("db"), |_| async {
                        Err::<(), _>(Unavailable)
                    })
                    .await
            }
        })
        .await;
    assert_eq!(
        (budget.requests(), budget.retries(), budget.refused()),
        (1, 2, 0)
    );
}

/// The budget is shared across threads without losing updates.
#[test]
fn concurrent_withdrawals_never_overdraw() {
    let budget = Arc::new(RetryBudget::new(0).burst(1000));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let b = budget.clone();
            std::thread::spawn(move || (0..500).filter(|_| b.withdraw()).count())
        })
        .collect();
    let granted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(granted, 1000);
    assert_eq!((budget.retries(), budget.refused()), (1000, 1000));
    assert_eq!(budget.balance(), 0.0);
}

/// With the process-wide retry budget empty, the call stops with `RetryBudget` before the
/// backoff sleep: a sleep after which nothing may start is not slept. The refusal is counted.
// regression: the call slept its backoff, then stopped.
#[tokio::test(start_paused = true)]
async fn an_empty_retry_budget_is_checked_before_the_backoff_sleep() {
    let budget = Arc::new(RetryBudget::new(0).burst(1));
    assert!(budget.withdraw()); // the storm emptied it
    let request = Scope::with_timeout(ms(5000));
    let retry = Retry::new(|_: &()| Decision::Backoff)
        .max_attempts(3)
        .budget(budget.clone())
        .backoff(vec![ms(1000), ms(1000)]);
    let t0 = Instant::now();
    let err = retry
        .run(&request, ChildSpec::read_only("db"), |_| async {
            Err::<(), _>(())
        })
        .await
        .unwrap_err();
    assert_eq!(err.stop(), &Stop::RetryBudget);
    assert_eq!(
        t0.elapsed(),
        Duration::ZERO,
        "slept a backoff that could not be used"
    );
    assert_eq!((budget.retries(), budget.refused()), (1, 1));
    assert_eq!(err.ledger().refused_by_budget(), 1);
}

/// A scope closed while an attempt runs: the call ends `Closed` without withdrawing a retry
/// token for an attempt that could not be registered.
// regression: a token was spent on an attempt the closed scope could not register.
#[tokio::test(start_paused = true)]
async fn a_closed_scope_does_not_spend_a_retry_token() {
    let budget = Arc::new(RetryBudget::new(0).burst(5));
    let request = Scope::with_timeout(ms(5000));
    let retry = Retry::new(|_: &()| Decision::Backoff)
        .max_attempts(3)
        .budget(budget.clone())
        .backoff(vec![ms(1000), ms(1000)]);
    let err = retry
        .run(&request, ChildSpec::read_only("db"), |a| {
            let request = request.clone();
            async move {
                assert_eq!(a.number(), 1);
                request.close(); // the handler is done and closes the request
                Err::<(), _>(())
            }
        })
        .await
        .unwrap_err();
    assert_eq!(err.stop(), &Stop::Closed);
    assert_eq!(
        budget.retries(),
        0,
        "a token was spent on an attempt that never started"
    );
    assert_eq!(budget.balance(), 5.0);
}

/// A hedge counts one refused retry once, in the budget and in the ledger, and a hedged call
/// that succeeds counts no refusal for a retry it never needed.
// regression: a hedge counted refusals twice, and for calls it won.
#[tokio::test(start_paused = true)]
async fn a_hedge_counts_a_refused_retry_once_and_a_needless_one_not_at_all() {
    for (second_succeeds, refused) in [(false, 1u32), (true, 0)] {
        let budget = Arc::new(RetryBudget::new(0).burst(1));
        let request = Scope::with_timeout(ms(1000));
        let hedge = Retry::new(|_: &Failure| Decision::RetryAfter(ms(10)))
            .max_attempts(3)
            .budget(budget.clone())
            .hedge(HedgeDelay::Fixed(ms(100)));
        let (out, ledger) = hedge
            .run_with_ledger(&request, ChildSpec::read_only("quota"), |a| async move {
                if a.number() == 1 {
                    tokio::time::sleep(ms(150)).await;
                    Err(Failure::Busy)
                } else if second_succeeds {
                    tokio::time::sleep(ms(60)).await;
                    Ok(())
                } else {
                    tokio::time::sleep(ms(80)).await;
                    Err(Failure::Busy)
                }
            })
            .await;
        assert_eq!(out.is_ok(), second_succeeds);
        if !second_succeeds {
            assert_eq!(out.unwrap_err().stop(), &Stop::RetryBudget);
        }
        assert_eq!(
            (budget.refused(), ledger.refused_by_budget()),
            (u64::from(refused), refused)
        );
        assert_eq!(budget.retries(), 1); // the hedge
    }
}

/// A sequential retry takes its token when it decides to retry, before the backoff: one
/// withdrawal per retry, whether the retry is decided by a backoff or a `RetryAfter` hint.
// regression: the token was withdrawn after the backoff, behind a read-only check before it.
#[tokio::test(start_paused = true)]
async fn a_retry_takes_one_token_per_retry_before_its_backoff() {
    let budget = Arc::new(RetryBudget::new(0).burst(5));
    let request = Scope::with_timeout(ms(5000));
    let retry = Retry::new(|e: &Failure| match e {
        Failure::Busy => Decision::RetryAfter(ms(50)),
        Failure::Down => Decision::Backoff,
    })
    .max_attempts(3)
    .budget(budget.clone())
    .backoff(vec![ms(100), ms(100)]);
    let (out, ledger) = retry
        .run_with_ledger(&request, ChildSpec::read_only("db"), |a| async move {
            match a.number() {
                1 => Err(Failure::Busy),
                2 => Err(Failure::Down),
                _ => Ok(()),
            }
        })
        .await;
    out.unwrap();
    assert_eq!(ledger.started(), 3);
    assert_eq!((budget.retries(), budget.refused()), (2, 0));
    assert_eq!(budget.balance(), 3.0);
    assert_eq!(ledger.elapsed(), ms(150));
}
