//! Backoff schedules: any iterator of delays plugs in (backon's builders included), the default
//! exponential jitter is reproducible with a seed, and every delay is paid from the budget.

use std::time::Duration;

use backon::BackoffBuilder;
use cancel_scope::retry::{backoff_fn, Decision, Exponential, Jitter, Retry, Stop};
use cancel_scope::{ChildSpec, Scope};
use tokio::time::Instant;

use crate::support::time::ms;
use crate::Unavailable;

/// The gaps between the attempts of a call that always fails.
async fn gaps<B>(retry: Retry<fn(&Unavailable) -> Decision, B>) -> (Vec<Duration>, Stop)
where
    B: IntoIterator<Item = Duration> + Clone,
{
    let request = Scope::with_timeout(Duration::from_secs(10));
    let err = retry
        .run(&request, ChildSpec::read_only("db"), |_| async {
            Err::<(), _>(Unavailable)
        })
        .await
        .unwrap_err();
    let a = err.ledger().attempts();
    let gaps = a
        .windows(2)
        .map(|w| w[1].started_at() - w[0].ended_at().unwrap())
        .collect();
    (gaps, err.stop().clone())
}

fn backoff_always(_: &Unavailable) -> Decision {
    Decision::Backoff
}

#[tokio::test(start_paused = true)]
async fn a_backon_builder_plugs_in() {
    let builder = backon::ExponentialBuilder::default()
        .with_min_delay(ms(10))
        .with_max_delay(ms(1000))
        .with_factor(2.0)
        .with_max_times(3);
    let schedule = backoff_fn(move || builder.build());
    let retry = Retry::new(backoff_always as fn(&Unavailable) -> Decision)
        .max_attempts(10)
        .backoff(schedule);
    let (gaps, stop) = gaps(retry).await;
    assert_eq!(gaps, [ms(10), ms(20), ms(40)]);
    // backon's max_times ended the schedule: the retries end with it.
    assert_eq!(stop, Stop::BackoffExhausted);
}

#[tokio::test(start_paused = true)]
async fn plain_iterators_plug_in() {
    let retry = Retry::new(backoff_always as fn(&Unavailable) -> Decision)
        .max_attempts(4)
        .backoff(vec![ms(5), ms(50), ms(500)]);
    let (gaps, stop) = gaps(retry).await;
    assert_eq!(gaps, [ms(5), ms(50), ms(500)]);
    assert_eq!(stop, Stop::AttemptsExhausted);
}

#[tokio::test(start_paused = true)]
async fn seeded_jitter_is_reproducible_and_within_bounds() {
    let schedule = Exponential::new(ms(100), ms(1000))
        .jitter(Jitter::Full)
        .seed(2024);
    let retry = Retry::new(backoff_always as fn(&Unavailable) -> Decision)
        .max_attempts(5)
        .backoff(schedule);
    let (first, _) = gaps(retry.clone()).await;
    let (second, _) = gaps(retry).await;
    assert_eq!(first, second);
    let expected: Vec<_> = schedule.into_iter().take(4).collect();
    assert_eq!(first, expected);
    for (gap, cap) in first.iter().zip([100, 200, 400, 800]) {
        assert!(*gap <= ms(cap));
    }
}

/// A delay longer than what is left is not slept: the call ends at once, and says that the
/// backoff is what stopped it (no reserve was set, so "reserve reached" would be false).
#[tokio::test(start_paused = true)]
async fn a_delay_past_the_last_start_is_not_slept() {
    let request = Scope::with_timeout(ms(300));
    let t0 = tokio::time::Instant::now();
    let err = Retry::new(backoff_always as fn(&Unavailable) -> Decision)
        .backoff(vec![ms(400)])
        .run(&request, ChildSpec::read_only("db"), |_| async {
            Err::<(), _>(Unavailable)
        })
        .await
        .unwrap_err();
    assert_eq!(err.stop(), &Stop::BackoffTooLong(ms(400)));
    assert!(err.is_budget_exhausted() && !err.is_deadline_exceeded());
    assert!(
        err.to_string()
            .contains("the next backoff (400ms) ends past the last start"),
        "{err}"
    );
    assert_eq!(t0.elapsed(), Duration::ZERO);
}

/// A scope closed while an attempt runs: the call ends `Closed` at once, without sleeping a
/// backoff after which nothing may start.
// regression: the call slept the backoff, then stopped `Closed`.
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
