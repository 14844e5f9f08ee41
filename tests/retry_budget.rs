//! The process-wide retry budget: retries stay a fixed ratio of requests during a storm, and
//! refused retries are counted.

use std::sync::Arc;
use std::time::Duration;

use cancel_scope::retry::{Decision, Retry, RetryBudget, Stop};
use cancel_scope::{ChildSpec, Scope};

#[derive(Debug)]
struct Unavailable;

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
