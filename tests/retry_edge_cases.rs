//! Edge cases of retries and hedges (found by review): a huge hedge delay, an empty retry
//! budget or a closed scope met before a backoff sleep, a hedge told to switch endpoint or to
//! come back later, an even split with less than 1 ms per attempt, the even split's last start
//! where shares round.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cancel_scope::retry::{Decision, HedgeDelay, Retry, RetryBudget, Stop};
use cancel_scope::{ChildSpec, Scope};
use tokio::time::Instant;

mod support;
use support::time::latest_instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A hedge delay too long to represent (`Duration::MAX`: "never hedge"), or one that lands at
/// the very end of what an `Instant` holds (a computed value, where tokio's rounding of a
/// sleep's deadline would overflow), never hedges, and panics nothing.
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

/// A dependency's pushback that lands at the very end of what an `Instant` holds, in a scope
/// without deadline, is too long (it would never be slept to its end), not a panic.
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

/// With the process-wide retry budget empty, the call stops with `RetryBudget` before the
/// backoff sleep: a sleep after which nothing may start is not slept. The refusal is counted.
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

/// A hedged call told `RetryAfter(300 ms)` starts its next attempt only once the hint has
/// passed, as a sequential retry does.
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

/// A scope closed while an attempt runs: the call ends `Closed` at once, without sleeping a
/// backoff after which nothing may start.
#[tokio::test(start_paused = true)]
async fn a_closed_scope_does_not_sleep_the_backoff() {
    let request = Scope::with_timeout(ms(5000));
    let retry = Retry::new(|_: &()| Decision::Backoff)
        .max_attempts(3)
        .backoff(vec![ms(1000), ms(1000)]);
    let t0 = Instant::now();
    let err = retry
        .run(&request, ChildSpec::read_only("db"), |_| {
            let request = request.clone();
            async move {
                request.close();
                Err::<(), _>(())
            }
        })
        .await
        .unwrap_err();
    assert_eq!((err.stop(), t0.elapsed()), (&Stop::Closed, Duration::ZERO));
}

/// The even split with less than 1 ms per attempt left (9 ms, 10 attempts) still starts an
/// attempt with what is left (1 ms), instead of stopping `BelowMinUseful` with no minimum
/// useful budget set.
#[tokio::test(start_paused = true)]
async fn an_even_split_below_one_ms_per_attempt_still_starts_an_attempt() {
    let request = Scope::with_timeout(ms(9));
    let retry = Retry::new(|_: &()| Decision::Backoff).max_attempts(10);
    let err = retry
        .run(&request, ChildSpec::read_only("db"), |_| async {
            Err::<(), _>(())
        })
        .await
        .unwrap_err();
    assert!(
        err.ledger().started() >= 1,
        "{:?} with nothing started",
        err.stop()
    );
    assert_eq!(err.ledger().attempts()[0].budget(), Some(ms(1)));
}

/// The even split's last start is exact where its shares round: a minimum useful budget that
/// is not whole milliseconds needs a whole-millisecond share above it (100.5 ms: 101 ms per
/// attempt left), and one of at most 1 ms is reached by the share below 1 ms (`min(1 ms,
/// what is left)`), whatever the attempts left. After a first attempt that fails at once,
/// a backoff to the reported last start starts the next attempt; one nanosecond later it
/// does not.
#[tokio::test(start_paused = true)]
async fn the_even_split_last_start_is_exact_where_shares_round() {
    // (timeout, minimum useful budget, the last start after the first attempt, 3 attempts)
    let cases = [
        (ms(1000), Duration::from_micros(100_500), ms(1000 - 2 * 101)),
        (ms(10), ms(1), ms(10 - 1)),
    ];
    for (timeout, min_useful, line) in cases {
        for (late, started) in [(Duration::ZERO, 2), (Duration::from_nanos(1), 1)] {
            let request = Scope::with_timeout(timeout);
            let t0 = Instant::now();
            let err = Retry::new(|_: &()| Decision::Backoff)
                .max_attempts(3)
                .min_useful(min_useful)
                .backoff(vec![line + late])
                .run(&request, ChildSpec::read_only("db"), |_| async {
                    Err::<(), _>(())
                })
                .await
                .unwrap_err();
            let ledger = err.ledger();
            let why = format!("{min_useful:?}, {late:?} late: {:?}", err.stop());
            assert_eq!(ledger.started(), started, "{why}");
            if started == 1 {
                assert_eq!(ledger.last_start(), Some(t0 + line), "{why}");
            }
        }
    }
}

#[derive(Debug)]
enum Failure {
    Busy,
    Down,
}

/// A hedge told `RetryAfter` longer than its budget allows, while another attempt is in
/// flight, starts nothing more: when the other attempt fails too, the call ends
/// `RetryAfterTooLong`, not with an attempt started at once.
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

/// A hedge counts one refused retry once, in the budget and in the ledger, and a hedged call
/// that succeeds counts no refusal for a retry it never needed.
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

/// A retry or a hedge told to come back after a hint too long to represent (`Duration::MAX`),
/// in a scope without deadline, never starts again: it ends `RetryAfterTooLong` at once.
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
