//! Fan-out: branches share the parent's budget; required branches fail the fan-out, optional
//! ones are cut at an earlier sub-deadline and yield "absent"; a concurrency limit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cancel_scope::fanout::FanOut;
use cancel_scope::{Cause, Lifecycle, Scope};
use tokio::time::Instant;

use crate::support::time::ms;

async fn answer<T>(after: Duration, value: T) -> Result<T, std::io::Error> {
    tokio::time::sleep(after).await;
    Ok(value)
}

/// Seed 001: a common deadline of 500 ms; price and stock required; recommendations and reviews
/// optional, cut at 350 ms; 150 ms left for aggregation.
#[tokio::test(start_paused = true)]
async fn seed_001_aggregation_page() {
    let t0 = Instant::now();
    let request = Scope::with_timeout(ms(500));
    let deadlines = Arc::new(Mutex::new(Vec::new()));
    let mut fan = FanOut::new(&request).aggregate_reserve(ms(150));
    let d = deadlines.clone();
    let price = fan.required("price", move |s| {
        d.lock()
            .unwrap()
            .push(("price", s.deadline().unwrap() - t0));
        answer(ms(120), 1999_u32)
    });
    let d = deadlines.clone();
    let stock = fan.required("stock", move |s| {
        d.lock()
            .unwrap()
            .push(("stock", s.deadline().unwrap() - t0));
        answer(ms(200), 7_u32)
    });
    let d = deadlines.clone();
    let recs = fan.optional("recommendations", move |s| {
        d.lock()
            .unwrap()
            .push(("recommendations", s.deadline().unwrap() - t0));
        answer(ms(400), vec!["socks", "shoes"])
    });
    let d = deadlines.clone();
    let reviews = fan.optional("reviews", move |s| {
        d.lock()
            .unwrap()
            .push(("reviews", s.deadline().unwrap() - t0));
        answer(ms(300), 4.5_f32)
    });

    let mut page = fan.join().await.unwrap();
    assert_eq!(page.required(price), 1999);
    assert_eq!(page.required(stock), 7);
    assert_eq!(page.optional(recs), None);
    assert_eq!(page.optional(reviews), Some(4.5));
    assert_eq!(page.absent().collect::<Vec<_>>(), ["recommendations"]);

    // Required branches share the common deadline; optional ones end at 350 ms.
    let mut deadlines = deadlines.lock().unwrap().clone();
    deadlines.sort();
    assert_eq!(
        deadlines,
        [
            ("price", ms(500)),
            ("recommendations", ms(350)),
            ("reviews", ms(350)),
            ("stock", ms(500)),
        ]
    );
    // The fan-out returned at the optional cut-off: the 150 ms aggregation reserve is intact.
    assert_eq!(t0.elapsed(), ms(350));
    assert_eq!(request.remaining(), Some(ms(150)));

    request.close();
    let report = request.quiesce().await;
    assert_eq!(report.state(), Lifecycle::Completed);
    assert_eq!((report.succeeded(), report.cancelled()), (3, 1));
}

/// When every branch answers early, the fan-out returns early: the optional sub-deadline is a
/// limit, not a wait.
#[tokio::test(start_paused = true)]
async fn fast_branches_return_early() {
    let request = Scope::with_timeout(ms(500));
    let mut fan = FanOut::new(&request).aggregate_reserve(ms(150));
    let a = fan.required("price", |_| answer(ms(30), 1));
    let b = fan.optional("reviews", |_| answer(ms(40), 2));
    let mut out = fan.join().await.unwrap();
    assert_eq!((out.required(a), out.optional(b)), (1, Some(2)));
    assert_eq!(request.remaining(), Some(ms(460)));
}

/// A required branch that fails cancels its siblings (which record their receipts) and fails
/// the fan-out at once.
#[tokio::test(start_paused = true)]
async fn a_failed_required_branch_cancels_the_siblings() {
    let request = Scope::with_timeout(ms(500));
    let sibling_causes = Arc::new(Mutex::new(Vec::new()));
    let mut fan = FanOut::new(&request).aggregate_reserve(ms(150));
    let _price = fan.required("price", |_| async {
        tokio::time::sleep(ms(100)).await;
        Err::<u32, _>("pricing: invalid currency")
    });
    for name in ["stock", "reviews"] {
        let causes = sibling_causes.clone();
        let _ = fan.required(name, move |s| {
            causes.lock().unwrap().push(s);
            answer(ms(300), ())
        });
    }
    let t0 = Instant::now();
    let err = fan.join().await.unwrap_err();
    assert_eq!(err.branch(), Some("price"));
    assert_eq!(
        err.to_string(),
        "required branch price failed: pricing: invalid currency"
    );
    assert_eq!(t0.elapsed(), ms(100));
    assert!(!request.is_cancelled()); // the request itself goes on (to answer the error)
    let siblings = sibling_causes.lock().unwrap().clone();
    assert_eq!(siblings.len(), 2);
    for s in siblings {
        assert_eq!(
            s.cause().unwrap().reason(),
            Some("a required branch failed")
        );
    }

    request.close();
    let report = request.quiesce().await;
    assert_eq!((report.failed(), report.cancelled()), (1, 2));
}

/// A required branch that runs out of the common budget fails the fan-out with a deadline.
#[tokio::test(start_paused = true)]
async fn a_required_branch_out_of_time_is_a_deadline_failure() {
    let request = Scope::with_timeout(ms(500));
    let mut fan = FanOut::new(&request).reserve(ms(50));
    let _ = fan.required("stock", |_| answer(ms(600), 7));
    let t0 = Instant::now();
    let err = fan.join().await.unwrap_err();
    assert!(err.is_deadline_exceeded());
    assert_eq!(err.branch(), Some("stock"));
    // The response reserve is untouched.
    assert_eq!(t0.elapsed(), ms(450));
    assert_eq!(request.remaining(), Some(ms(50)));
}

/// An optional branch that fails is absent, not an error.
#[tokio::test(start_paused = true)]
async fn a_failed_optional_branch_is_absent() {
    let request = Scope::with_timeout(ms(500));
    let mut fan = FanOut::new(&request);
    let price = fan.required("price", |_| answer(ms(10), 5));
    let recs = fan.optional("recommendations", |_| async {
        Err::<Vec<u8>, _>("model server down")
    });
    let mut out = fan.join().await.unwrap();
    assert_eq!(out.required(price), 5);
    assert_eq!(out.optional(recs), None);
}

/// The concurrency limit bounds the branches in flight; queued branches use what is left of the
/// same budget, and an optional branch queued past its sub-deadline is absent without running.
#[tokio::test(start_paused = true)]
async fn the_concurrency_limit_bounds_branches_in_flight() {
    let request = Scope::with_timeout(ms(500));
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicUsize::new(0));
    let mut fan = FanOut::new(&request).limit(2).aggregate_reserve(ms(150));
    let mut handles = Vec::new();
    for _ in 0..4 {
        let (running, peak, started) = (running.clone(), peak.clone(), started.clone());
        handles.push(fan.required("shard", move |_| async move {
            started.fetch_add(1, Ordering::SeqCst);
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(ms(100)).await;
            running.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(now)
        }));
    }
    let s = started.clone();
    let late = fan.optional("late-optional", move |_| {
        s.fetch_add(1, Ordering::SeqCst);
        answer(ms(1), ())
    });
    let t0 = Instant::now();
    let mut out = fan.join().await.unwrap();
    assert_eq!(peak.load(Ordering::SeqCst), 2);
    for h in handles {
        assert!(out.required(h) <= 2);
    }
    assert_eq!(t0.elapsed(), ms(201)); // two waves of two, then the optional one
    assert_eq!(out.optional(late), Some(()));
    assert_eq!(started.load(Ordering::SeqCst), 5);
}

#[tokio::test(start_paused = true)]
async fn an_optional_branch_queued_past_its_cut_off_does_not_start() {
    let request = Scope::with_timeout(ms(500));
    let ran = Arc::new(AtomicUsize::new(0));
    let mut fan = FanOut::new(&request).limit(1).aggregate_reserve(ms(150));
    let _ = fan.required("stock", |_| answer(ms(400), ()));
    let r = ran.clone();
    let recs = fan.optional("recommendations", move |_| {
        r.fetch_add(1, Ordering::SeqCst);
        answer(ms(1), ())
    });
    let mut out = fan.join().await.unwrap();
    assert_eq!(out.optional(recs), None);
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

/// The request's cancel (the client left) stops every branch and fails the fan-out with the
/// cause.
#[tokio::test(start_paused = true)]
async fn the_scope_cancel_stops_every_branch() {
    let request = Scope::with_timeout(ms(500));
    let r = request.clone();
    tokio::spawn(async move {
        tokio::time::sleep(ms(30)).await;
        r.cancel_because(Cause::ClientGone);
    });
    let mut fan = FanOut::new(&request);
    let _ = fan.required("a", |_| answer(ms(300), ()));
    let _ = fan.optional("b", |_| answer(ms(300), ()));
    let err = fan.join().await.unwrap_err();
    assert!(err.is_cancelled() && !err.is_deadline_exceeded());
    assert_eq!(err.cause(), Some(&Cause::ClientGone));
    // Not the deadline: the branches did not fail, they were stopped with the request.
    assert_eq!(err.branch(), None, "{err}");
    let report = request.quiesce().await;
    assert_eq!(report.state(), Lifecycle::CancelledStable);
    assert_eq!(report.cancelled(), 2);
}

/// Finishing early returns no time: a branch's deadline is fixed when it starts.
#[tokio::test(start_paused = true)]
async fn finishing_one_branch_gives_no_time_to_the_others() {
    let request = Scope::with_timeout(ms(500));
    let mut fan = FanOut::new(&request);
    let _ = fan.required("fast", |_| answer(ms(10), ()));
    let slow = fan.required("slow", |s| async move {
        tokio::time::sleep(ms(50)).await;
        Ok::<_, std::io::Error>(s.remaining())
    });
    let mut out = fan.join().await.unwrap();
    assert_eq!(out.required(slow), Some(ms(450)));
}

/// A fan-out of optional branches whose response reserve leaves no budget: the branches are
/// absent (as a queued optional branch past its cut-off is), not an error for the whole
/// fan-out.
// regression: `join` failed "fan-out not started: budget exhausted", failing the request.
#[tokio::test(start_paused = true)]
async fn optional_branches_without_budget_for_the_fan_out_are_absent() {
    let request = Scope::with_timeout(ms(100));
    let ran = Arc::new(AtomicUsize::new(0));
    let mut fan = FanOut::new(&request).reserve(ms(150));
    let r = ran.clone();
    let recs = fan.optional("recommendations", move |_| {
        r.fetch_add(1, Ordering::SeqCst);
        answer(ms(1), ())
    });
    let mut out = fan
        .join()
        .await
        .expect("optional branches are absent, not an error");
    assert_eq!(out.optional(recs), None);
    assert_eq!(out.absent().collect::<Vec<_>>(), ["recommendations"]);
    assert_eq!(ran.load(Ordering::SeqCst), 0, "a branch ran with no budget");
    assert_eq!(request.remaining(), Some(ms(100)));

    // A required branch in the same position still fails the fan-out.
    let mut fan = FanOut::new(&request).reserve(ms(150));
    let _ = fan.required("price", |_| answer(ms(1), ()));
    let _ = fan.optional("reviews", |_| answer(ms(1), ()));
    assert!(fan.join().await.unwrap_err().is_deadline_exceeded());
}

/// Builder rules only ever tighten: a fan-out's reserve and aggregation reserve set twice keep
/// the larger value, in either order.
#[tokio::test(start_paused = true)]
async fn a_fan_out_reserve_set_twice_keeps_the_larger_value() {
    for (a, b) in [(ms(100), ms(20)), (ms(20), ms(100))] {
        let request = Scope::with_timeout(ms(500));
        let mut fan = FanOut::new(&request)
            .reserve(a)
            .reserve(b)
            .aggregate_reserve(b)
            .aggregate_reserve(a);
        let required = fan.required("price", |s| async move {
            Ok::<_, std::io::Error>(s.remaining())
        });
        let optional = fan.optional("reviews", |s| async move {
            Ok::<_, std::io::Error>(s.remaining())
        });
        let mut out = fan.join().await.unwrap();
        assert_eq!(out.required(required), Some(ms(400)));
        assert_eq!(out.optional(optional), Some(Some(ms(300))));
    }
}

/// `FanOut::rules` is the reserve and the minimum useful budget at once (the cap is not a
/// fan-out's): its branches get what the two setters give them, and are refused where those
/// refuse.
#[tokio::test(start_paused = true)]
async fn fan_out_rules_give_the_branches_what_the_setters_give() {
    use cancel_scope::budget::Rules;
    fn by_rules(fan: FanOut<'_>) -> FanOut<'_> {
        fan.rules(
            Rules::new()
                .reserve(ms(100))
                .cap(ms(50))
                .min_useful(ms(350)),
        )
    }
    fn by_setters(fan: FanOut<'_>) -> FanOut<'_> {
        fan.reserve(ms(100)).min_useful(ms(350))
    }
    type Make = for<'s> fn(FanOut<'s>) -> FanOut<'s>;
    for (name, make) in [("rules", by_rules as Make), ("setters", by_setters)] {
        // 500 ms: 400 ms after the reserve, the cap ignored.
        let request = Scope::with_timeout(ms(500));
        let mut fan = make(FanOut::new(&request));
        let price = fan.required("price", |s| async move {
            Ok::<_, std::io::Error>(s.remaining())
        });
        let mut out = fan.join().await.unwrap();
        assert_eq!(out.required(price), Some(ms(400)), "{name}");
        // 400 ms: 300 ms after the reserve, below the 350 ms minimum: not started.
        let request = Scope::with_timeout(ms(400));
        let mut fan = make(FanOut::new(&request));
        let _ = fan.required("price", |s| async move {
            Ok::<_, std::io::Error>(s.remaining())
        });
        let err = fan.join().await.unwrap_err();
        assert!(err.to_string().contains("not started"), "{name}: {err}");
    }
}

/// Fan-out branches have their own minimum useful budget (the larger one when set twice): a
/// required branch that would get less fails the fan-out, named and not started; an optional
/// one is absent. Nothing below the minimum runs.
#[tokio::test(start_paused = true)]
async fn a_branch_below_its_minimum_useful_budget_does_not_start() {
    let ran = Arc::new(AtomicUsize::new(0));
    let request = Scope::with_timeout(ms(100));
    let mut fan = FanOut::new(&request)
        .aggregate_reserve(ms(60))
        .min_useful(ms(50))
        .min_useful(ms(10));
    let r = ran.clone();
    let price = fan.required("price", move |_| {
        r.fetch_add(1, Ordering::SeqCst);
        answer(ms(1), 1999_u32)
    });
    let r = ran.clone();
    let reviews = fan.optional("reviews", move |_| {
        r.fetch_add(1, Ordering::SeqCst);
        answer(ms(1), 4.5_f32)
    });
    let mut out = fan.join().await.unwrap();
    assert_eq!(out.required(price), 1999);
    assert_eq!(
        out.optional(reviews),
        None,
        "40 ms is below the 50 ms minimum"
    );
    assert_eq!(out.absent().collect::<Vec<_>>(), ["reviews"]);
    assert_eq!(ran.load(Ordering::SeqCst), 1);

    let mut fan = FanOut::new(&request).min_useful(ms(10)).min_useful(ms(500));
    let r = ran.clone();
    let _ = fan.required("stock", move |_| {
        r.fetch_add(1, Ordering::SeqCst);
        answer(ms(1), 7_u32)
    });
    let err = fan.join().await.unwrap_err();
    assert_eq!(err.branch(), Some("stock"));
    assert!(err.is_deadline_exceeded(), "{err}");
    assert!(err.to_string().contains("not started"), "{err}");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "a branch ran below its minimum"
    );
}

/// A required branch still running when the scope's own deadline passes (no reserve: the
/// fan-out's deadline is the scope's) is named in the error, as one cut by a reserve's
/// earlier deadline is, rather than the fan-out just being "cancelled".
#[tokio::test(start_paused = true)]
async fn a_required_branch_cut_at_the_exact_deadline_is_named() {
    let request = Scope::with_timeout(ms(500));
    let mut fan = FanOut::new(&request);
    let _ = fan.required("price", |_| answer(ms(100), 1999));
    let _ = fan.required("stock", |_| answer(ms(600), 7));
    let _ = fan.required("reviews", |_| answer(ms(900), 4));
    let t0 = Instant::now();
    let err = fan.join().await.unwrap_err();
    assert_eq!(t0.elapsed(), ms(500));
    assert_eq!(err.branch(), Some("stock"), "{err}");
    assert!(err.is_deadline_exceeded(), "{err}");
    assert!(err.cause().unwrap().is_deadline_exceeded());
    assert!(
        err.to_string().starts_with("required branch stock stopped"),
        "{err}"
    );

    let report = request.quiesce().await;
    assert_eq!((report.succeeded(), report.cancelled()), (1, 2), "{report}");
}

/// A required branch that fails with its own error in the very instant the scope's deadline
/// passes is named too, whichever of the two the runtime gets to first (the branch's error,
/// or the deadline stopping it).
#[tokio::test(start_paused = true)]
async fn a_required_branch_that_fails_at_the_exact_deadline_is_named() {
    let request = Scope::with_timeout(ms(500));
    let deadline = request.deadline().unwrap();
    let mut fan = FanOut::new(&request);
    let _ = fan.required("stock", move |_| async move {
        tokio::time::sleep_until(deadline).await;
        Err::<u32, _>("inventory: upstream timed out")
    });
    let err = fan.join().await.unwrap_err();
    assert_eq!(err.branch(), Some("stock"), "{err}");
    assert!(err.to_string().contains("stock"), "{err}");
    // One receipt: its failure, or its stop.
    let report = request.quiesce().await;
    assert_eq!(report.failed() + report.cancelled(), 1, "{report}");
}
