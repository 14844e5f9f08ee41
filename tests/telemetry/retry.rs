//! Retry attempts by outcome, and the retries a retry budget refused.

use cancel_scope::retry::{Decision, Retry, RetryBudget};
use cancel_scope::telemetry;
use cancel_scope::{ChildSpec, Scope};

use crate::capture::Telemetry;
use crate::support::time::ms;

#[tokio::test(start_paused = true)]
async fn attempts_count_by_outcome_and_a_refused_retry_as_budget_exhausted() {
    let t = Telemetry::install();
    let scope = Scope::with_timeout(ms(1_000));
    let retry = Retry::new(|_: &&str| Decision::RetryNow).max_attempts(3);
    let out = retry
        .run(&scope, ChildSpec::read_only("inventory"), |a| async move {
            if a.number() < 3 {
                Err("unavailable")
            } else {
                Ok("in stock")
            }
        })
        .await;
    assert_eq!(out.unwrap(), "in stock");

    // A budget of one token: the first retry takes it, the second is refused.
    let empty = std::sync::Arc::new(RetryBudget::new(10).burst(1));
    let retry = Retry::new(|_: &&str| Decision::RetryNow)
        .max_attempts(3)
        .budget(empty.clone());
    let out = retry
        .run(&scope, ChildSpec::read_only("inventory"), |_| async {
            Err::<(), _>("unavailable")
        })
        .await;
    assert!(out.is_err());

    let m = t.metrics();
    // Two failed attempts of each call.
    assert_eq!(
        m.counter(telemetry::RETRY_ATTEMPTS, &[("outcome", "failed")]),
        4
    );
    assert_eq!(
        m.counter(telemetry::RETRY_ATTEMPTS, &[("outcome", "succeeded")]),
        1
    );
    assert_eq!(m.label_sets(telemetry::RETRY_ATTEMPTS).len(), 2);
    assert_eq!(m.counter(telemetry::RETRY_BUDGET_EXHAUSTED, &[]), 1);
}

#[tokio::test(start_paused = true)]
async fn an_attempt_cut_by_its_budget_counts_as_timed_out() {
    let t = Telemetry::install();
    // Two attempts share 1 s: the first is cut at its half, the second answers.
    let scope = Scope::with_timeout(ms(1_000));
    let retry = Retry::new(|_: &()| Decision::RetryNow).max_attempts(2);
    let out = retry
        .run(&scope, ChildSpec::read_only("slow"), |a| async move {
            if a.number() == 1 {
                tokio::time::sleep(ms(1_000)).await;
            }
            Ok::<_, ()>(())
        })
        .await;
    assert!(out.is_ok());
    let m = t.metrics();
    assert_eq!(
        m.counter(telemetry::RETRY_ATTEMPTS, &[("outcome", "timed_out")]),
        1
    );
    assert_eq!(
        m.counter(telemetry::RETRY_ATTEMPTS, &[("outcome", "succeeded")]),
        1
    );
    assert_eq!(m.label_sets(telemetry::RETRY_ATTEMPTS).len(), 2);
}
