//! The retry ledger: per-attempt budgets from the seed tables, the reserve line, backoff paid
//! from the budget, cancel during a backoff, and the ledger in the scope's report.

use std::time::Duration;

use cancel_scope::budget::Split;
use cancel_scope::retry::{AttemptEnd, Decision, Retry, Stop};
use cancel_scope::{Cause, ChildSpec, Lifecycle, Scope};
use tokio::time::Instant;

use crate::support::time::ms;
use crate::Unavailable;

/// Seed 003: deadline 1000, reserve 100, cap 500. Queued until 120, the first attempt gets 500
/// and fails after 400; a 180 ms backoff brings us to 700, where the second gets 200; at 900
/// nothing may start, although an attempt is left.
#[tokio::test(start_paused = true)]
async fn seed_003_greedy_grants_500_then_200_then_nothing() {
    let t0 = Instant::now();
    let request = Scope::with_deadline(t0 + ms(1000));
    tokio::time::sleep(ms(120)).await; // queueing, on the same clock

    let retry = Retry::new(|_: &Unavailable| Decision::Backoff)
        .max_attempts(3)
        .split(Split::Greedy { cap: Some(ms(500)) })
        .reserve(ms(100))
        .backoff(std::iter::repeat(ms(180)));
    let err = retry
        .run(&request, ChildSpec::read_only("grant"), |a| async move {
            if a.number() == 1 {
                tokio::time::sleep(ms(400)).await;
                Err::<(), _>(Unavailable)
            } else {
                std::future::pending().await // uses all it was granted
            }
        })
        .await
        .unwrap_err();

    let ledger = err.ledger();
    let plan: Vec<_> = ledger
        .attempts()
        .iter()
        .map(|a| {
            (
                (a.started_at() - t0).as_millis(),
                a.budget().unwrap().as_millis(),
            )
        })
        .collect();
    assert_eq!(plan, [(120, 500), (700, 200)]);
    assert_eq!(ledger.attempts()[1].ended_at(), Some(t0 + ms(900)));
    assert_eq!(ledger.attempts()[1].end(), Some(AttemptEnd::TimedOut));
    assert_eq!(err.stop(), &Stop::ReserveReached);
    assert_eq!(ledger.last_start(), Some(t0 + ms(900)));
    assert_eq!(ledger.max_attempts(), 3);
    // The call returned at the reserve line: the response keeps its 100 ms.
    assert_eq!(Instant::now() - t0, ms(900));
    assert_eq!(request.remaining(), Some(ms(100)));
    assert!(!request.is_cancelled());
}

async fn even_split_plan(total: Duration) -> (Vec<u128>, Stop, Duration) {
    let t0 = Instant::now();
    let request = Scope::with_timeout(total);
    let retry = Retry::new(|_: &Unavailable| Decision::Backoff)
        .max_attempts(3)
        .split(Split::Even { cap: Some(ms(300)) })
        .backoff(std::iter::repeat(Duration::ZERO));
    let err = retry
        .run(&request, ChildSpec::read_only("libraryd"), |_| {
            std::future::pending::<Result<(), Unavailable>>()
        })
        .await
        .unwrap_err();
    let budgets = err
        .ledger()
        .attempts()
        .iter()
        .map(|a| a.budget().unwrap().as_millis())
        .collect();
    (budgets, err.stop().clone(), t0.elapsed())
}

/// Seed 004: 800 ms over 3 attempts with a 300 ms hop cap gives 266 / 267 / 267 (together
/// exactly the budget); with 10 s the cap holds: 300 each.
#[tokio::test(start_paused = true)]
async fn seed_004_even_split_266_267_267_and_capped_300() {
    let (budgets, stop, took) = even_split_plan(ms(800)).await;
    assert_eq!(budgets, [266, 267, 267]);
    assert_eq!(stop, Stop::Cancelled(Cause::DeadlineExceeded));
    assert_eq!(took, ms(800));

    let (budgets, stop, took) = even_split_plan(Duration::from_secs(10)).await;
    assert_eq!(budgets, [300, 300, 300]);
    assert_eq!(stop, Stop::AttemptsExhausted);
    assert_eq!(took, ms(900));
}

/// No attempt's deadline is later than the request's deadline minus the reserve, and each
/// attempt's child scope carries exactly its ledger budget.
#[tokio::test(start_paused = true)]
async fn attempt_deadlines_never_pass_the_reserve_line() {
    let request = Scope::with_timeout(ms(1000));
    let line = request.deadline().unwrap() - ms(100);
    let retry = Retry::new(|_: &Unavailable| Decision::RetryNow)
        .max_attempts(4)
        .split(Split::Greedy { cap: None })
        .reserve(ms(100));
    let deadlines = std::sync::Mutex::new(Vec::new());
    let err = retry
        .run(&request, ChildSpec::read_only("db"), |a| {
            deadlines
                .lock()
                .unwrap()
                .push((a.scope().deadline().unwrap(), a.remaining()));
            async {
                tokio::time::sleep(ms(200)).await;
                Err::<(), _>(Unavailable)
            }
        })
        .await
        .unwrap_err();
    assert_eq!(err.stop(), &Stop::AttemptsExhausted);
    let deadlines = deadlines.into_inner().unwrap();
    assert_eq!(deadlines.len(), 4);
    for ((deadline, remaining), rec) in deadlines.iter().zip(err.ledger().attempts()) {
        assert!(*deadline <= line);
        assert_eq!(*remaining, rec.budget());
    }
}

/// Even split of 1 s over 3 attempts, 100 ms minimum useful, every attempt failing at once
/// and followed by the given backoffs: (attempt start times in ms, why the call stopped, when,
/// the ledger's last start in ms).
async fn even_split_last_start(backoff: Vec<Duration>) -> (Vec<u128>, Stop, Duration, Duration) {
    let t0 = Instant::now();
    let request = Scope::with_timeout(ms(1000));
    let err = Retry::new(|_: &Unavailable| Decision::Backoff)
        .max_attempts(3)
        .split(Split::Even { cap: None })
        .min_useful(ms(100))
        .backoff(backoff)
        .run(&request, ChildSpec::read_only("db"), |_| async {
            Err::<(), _>(Unavailable)
        })
        .await
        .unwrap_err();
    let ledger = err.ledger();
    let starts = ledger
        .attempts()
        .iter()
        .map(|a| (a.started_at() - t0).as_millis())
        .collect();
    let last_start = ledger.last_start().unwrap() - t0;
    (starts, err.stop().clone(), t0.elapsed(), last_start)
}

/// The ledger's last start is the last moment the next attempt can start under the even
/// split (a share of what is left over the attempts left must reach the minimum useful
/// budget), not the deadline minus the minimum useful budget: with 2 attempts left the line is
/// 1000 - 2 × 100 = 800 ms, with 1 left 900 ms. A backoff that ends before the reported line
/// is slept and the attempt starts, even at the line itself; one that ends after it is not.
#[tokio::test(start_paused = true)]
async fn last_start_is_a_moment_an_even_split_attempt_can_start() {
    // An 850 ms backoff would start the 2nd attempt with a 75 ms share.
    let (starts, stop, at, last_start) = even_split_last_start(vec![ms(850)]).await;
    assert_eq!(
        (starts, stop, at, last_start),
        (vec![0], Stop::BackoffTooLong(ms(850)), ms(0), ms(800))
    );
    // Just past the line: not slept either.
    let (starts, stop, at, last_start) = even_split_last_start(vec![ms(801)]).await;
    assert_eq!(
        (starts, stop, at, last_start),
        (vec![0], Stop::BackoffTooLong(ms(801)), ms(0), ms(800))
    );
    // At each line: the 2nd attempt starts at 800 ms, the 3rd (the last) at 900 ms.
    let (starts, stop, at, last_start) = even_split_last_start(vec![ms(800), ms(100)]).await;
    assert_eq!(
        (starts, stop, at, last_start),
        (vec![0, 800, 900], Stop::AttemptsExhausted, ms(900), ms(900))
    );
}

/// A backoff sleep pays from the budget and is cut short by the scope's cancel; nothing starts
/// after the cancel.
#[tokio::test(start_paused = true)]
async fn cancel_during_backoff_stops_at_once() {
    let request = Scope::with_timeout(ms(1000));
    let canceller = request.clone();
    tokio::spawn(async move {
        tokio::time::sleep(ms(50)).await;
        canceller.cancel_with("client closed the page");
    });
    let retry = Retry::new(|_: &Unavailable| Decision::Backoff).backoff(vec![ms(200), ms(200)]);
    let t0 = Instant::now();
    let err = retry
        .run(&request, ChildSpec::read_only("db"), |_| async {
            Err::<(), _>(Unavailable)
        })
        .await
        .unwrap_err();
    assert_eq!(t0.elapsed(), ms(50));
    assert_eq!(
        err.cause(),
        Some(&Cause::cancelled("client closed the page"))
    );
    assert_eq!(err.ledger().started(), 1);
    assert_eq!(err.ledger().elapsed(), ms(50));
}

/// When the backoff schedule ends, the retries end.
#[tokio::test(start_paused = true)]
async fn an_exhausted_backoff_schedule_ends_the_retries() {
    let request = Scope::with_timeout(ms(1000));
    let retry = Retry::new(|_: &Unavailable| Decision::Backoff)
        .max_attempts(10)
        .backoff(vec![ms(5)]);
    let err = retry
        .run(&request, ChildSpec::read_only("db"), |_| async {
            Err::<(), _>(Unavailable)
        })
        .await
        .unwrap_err();
    assert_eq!(err.stop(), &Stop::BackoffExhausted);
    assert_eq!(err.ledger().started(), 2);
}

/// A closed scope takes no new attempts: the call stops with `Closed`.
#[tokio::test(start_paused = true)]
async fn a_closed_scope_starts_no_attempt() {
    let request = Scope::new();
    request.close();
    let err = Retry::new(|_: &Unavailable| Decision::Backoff)
        .run(&request, ChildSpec::read_only("db"), |_| async { Ok(()) })
        .await
        .unwrap_err();
    assert_eq!(err.stop(), &Stop::Closed);
    assert_eq!(err.ledger().started(), 0);
}

/// Every call's ledger appears in the report of the scope it ran in, with what it spent.
#[tokio::test(start_paused = true)]
async fn ledgers_appear_in_the_scope_report() {
    let request = Scope::with_timeout(ms(1000));
    let retry = Retry::new(|_: &Unavailable| Decision::RetryNow).max_attempts(2);
    retry
        .run(&request, ChildSpec::read_only("users"), |a| async move {
            tokio::time::sleep(ms(10)).await;
            if a.number() == 1 {
                Err(Unavailable)
            } else {
                Ok(())
            }
        })
        .await
        .unwrap();
    let _ = retry
        .run(&request, ChildSpec::read_only("orders"), |_| async {
            Err::<(), _>(Unavailable)
        })
        .await;

    // The ledger is attached before the call returns: a quiesce racing the call still sees it.
    request.close();
    let report = request.quiesce().await;
    assert_eq!(report.state(), Lifecycle::Completed);
    let ledgers = report.retry_ledgers();
    assert_eq!(ledgers.len(), 2);
    let users = ledgers[0];
    assert_eq!(users.dependency(), "users");
    assert_eq!((users.max_attempts(), users.started()), (2, 2));
    assert_eq!((users.concurrent(), users.peak_concurrent()), (0, 1));
    assert_eq!(users.elapsed(), ms(20));
    assert_eq!(users.stop(), Some(&Stop::Succeeded));
    assert_eq!(users.last_start(), request.deadline());
    assert_eq!(ledgers[1].stop(), Some(&Stop::AttemptsExhausted));
    assert_eq!(
        ledgers[1].to_string(),
        "retry orders: 2/2 attempts (0 hedges, peak 1 concurrent) in 0ns, stopped: attempts exhausted"
    );
    // Four attempts, four receipts.
    assert_eq!((report.succeeded(), report.failed()), (1, 3));
    // The report's `Display` shows both, oldest first.
    let shown = report.to_string();
    let users = shown.find("; retry users: 2/2 attempts").expect(&shown);
    let orders = shown.find("; retry orders: 2/2 attempts").expect(&shown);
    assert!(users < orders, "{shown}");
}

/// A `RetryError` reads well for any error type: its `Display` needs no `E: Display` and says
/// what stopped the call and how the last attempt ended, its alternate form lists the
/// attempts, and its `Debug` is short and structured (not the ledger's every field).
#[tokio::test(start_paused = true)]
async fn a_retry_error_is_short_and_its_ledger_one_format_away() {
    #[derive(Debug)]
    struct Opaque; // neither `Display` nor `std::error::Error`
    let request = Scope::with_timeout(ms(1000));
    let err = Retry::new(|_: &Opaque| Decision::Backoff)
        .max_attempts(3)
        .backoff(std::iter::repeat(ms(10)))
        .run(&request, ChildSpec::read_only("stock"), |_| async {
            Err::<(), _>(Opaque)
        })
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "stock: gave up after 3 of 3 attempts in 20ms: attempts exhausted \
         (the last attempt failed: Backoff)"
    );
    let debug = format!("{err:?}");
    assert_eq!(
        debug,
        "RetryError { dependency: \"stock\", stop: AttemptsExhausted, attempts: 3, \
         elapsed: 20ms, last_error: Some(Opaque) }"
    );
    let full = format!("{err:#}");
    let lines: Vec<_> = full.lines().skip(1).collect();
    assert_eq!(
        lines,
        [
            "  attempt 1 at +0ns, budget 333ms: failed: Backoff",
            "  attempt 2 at +10ms, budget 495ms: failed: Backoff",
            "  attempt 3 at +20ms, budget 980ms: failed: Backoff",
        ],
        "{full}"
    );
    assert_eq!(err.ledger().started(), 3);
}

/// A quiesce started while a retry sleeps in its backoff waits for the call to end, and the
/// report then holds its ledger.
#[tokio::test(start_paused = true)]
async fn quiesce_waits_for_a_retry_in_backoff() {
    let request = Scope::with_timeout(ms(1000));
    let r = request.clone();
    let call = tokio::spawn(async move {
        Retry::new(|_: &Unavailable| Decision::Backoff)
            .max_attempts(2)
            .backoff(vec![ms(100)])
            .run(&r, ChildSpec::read_only("db"), |_| async {
                Err::<(), _>(Unavailable)
            })
            .await
            .unwrap_err()
    });
    tokio::time::sleep(ms(10)).await; // the call is in its backoff now
    request.close();
    let report = request.quiesce().await;
    let err = call.await.unwrap();
    // The closed watermark refused the second attempt.
    assert_eq!(err.stop(), &Stop::Closed);
    assert_eq!(report.retry_ledgers().len(), 1);
    assert_eq!(report.retry_ledgers()[0].stop(), Some(&Stop::Closed));
}

/// The ledgers of calls made below the request — in a handler's child scope, and by a retry
/// nested in another's attempt — roll up into the request's report, as their receipts do
/// (before, the request's report had none of them: each stayed in the scope it ran in).
#[tokio::test(start_paused = true)]
async fn ledgers_of_calls_in_nested_scopes_roll_up_into_the_requests_report() {
    let request = Scope::with_timeout(ms(1000));
    let handler = request.child().name("handler").build().unwrap();
    let retry = Retry::new(|_: &Unavailable| Decision::RetryNow).max_attempts(2);
    retry
        .run(&handler, ChildSpec::read_only("users"), |_| async {
            Ok::<_, Unavailable>(())
        })
        .await
        .unwrap();
    // A retry of another dependency inside an attempt of the call to "orders": its ledger is
    // attached to the attempt's scope, two levels below the request.
    retry
        .run(&handler, ChildSpec::read_only("orders"), |a| {
            let retry = &retry;
            async move {
                retry
                    .run(a.scope(), ChildSpec::read_only("stock"), |_| async {
                        Ok::<_, Unavailable>(())
                    })
                    .await
                    .map_err(|_| Unavailable)
            }
        })
        .await
        .unwrap();
    request.close();
    let report = request.quiesce().await;
    let deps: Vec<_> = report
        .retry_ledgers()
        .iter()
        .map(|l| l.dependency())
        .collect();
    // Oldest first: the nested call ends (and is attached) before the call around it.
    assert_eq!(deps, ["users", "stock", "orders"], "{report}");
    assert_eq!(report.dropped_notes(), 0);
    // The handler's own report has them too.
    let handler = handler.quiesce().await;
    assert_eq!(handler.retry_ledgers().len(), 3);
}

/// A scope keeps the newest 64 notes; its report counts the older ones it dropped, and says
/// so (before, they went without a trace). A scope above many children keeps the newest 64 of
/// theirs, each child its own.
#[tokio::test(start_paused = true)]
async fn a_report_counts_the_notes_its_scope_dropped_and_says_so() {
    let retry = Retry::new(|_: &Unavailable| Decision::Backoff).max_attempts(1);
    let call = |scope: Scope| {
        let retry = retry.clone();
        async move {
            retry
                .run(&scope, ChildSpec::read_only("db"), |_| async {
                    Ok::<_, Unavailable>(())
                })
                .await
                .unwrap();
        }
    };
    let scope = Scope::new();
    for _ in 0..70 {
        call(scope.clone()).await;
    }
    scope.close();
    let report = scope.quiesce().await;
    assert_eq!(report.retry_ledgers().len(), 64);
    assert_eq!(report.dropped_notes(), 6);
    assert!(
        report
            .to_string()
            .ends_with("; 6 older notes dropped (retry ledgers and failures)"),
        "{report}"
    );

    let root = Scope::new();
    let mut children = Vec::new();
    for _ in 0..65 {
        let child = root.child().build().unwrap();
        call(child.clone()).await;
        children.push(child);
    }
    root.close();
    let report = root.quiesce().await;
    assert_eq!(
        (report.retry_ledgers().len(), report.dropped_notes()),
        (64, 1)
    );
    assert!(report
        .to_string()
        .ends_with("; 1 older note dropped (retry ledgers and failures)"));
    let child = children[0].quiesce().await;
    assert_eq!((child.retry_ledgers().len(), child.dropped_notes()), (1, 0));
    assert!(!child.to_string().contains("dropped"), "{child}");
}

/// The even split with less than 1 ms per attempt left (9 ms, 10 attempts) still starts an
/// attempt with what is left (1 ms), instead of stopping `BelowMinUseful` with no minimum
/// useful budget set.
// regression: the whole-ms share rounded to nothing and no attempt started.
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
// regression: `Ledger::last_start` said a line where the next attempt could not start.
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
