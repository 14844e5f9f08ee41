//! Deadlines: they fire by themselves, children never outlive their parent's budget, and a
//! child that would get too little fails fast.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cancel_scope::{Cause, ChildSpec, Scope};
use tokio::time::{advance, Instant};

use crate::support::time::{latest_instant, ms};

#[tokio::test(start_paused = true)]
async fn a_deadline_cancels_the_scope_and_descendants_without_anyone_polling() {
    let start = Instant::now();
    let root = Scope::with_timeout(ms(100));
    let child = root.child().build().unwrap();
    let grandchild = child.child().build().unwrap();
    advance(ms(99)).await;
    assert!(!root.is_cancelled());
    advance(ms(1)).await;
    // Let the timer task run: an unrelated sleep of zero yields to it.
    tokio::task::yield_now().await;
    assert!(
        root.is_cancelled(),
        "deadline fired at {:?}",
        start.elapsed()
    );
    assert_eq!(root.cause(), Some(Cause::DeadlineExceeded));
    assert!(child.cause().unwrap().is_deadline_exceeded());
    assert!(grandchild.cause().unwrap().is_deadline_exceeded());
}

#[tokio::test(start_paused = true)]
async fn cancelled_resolves_exactly_at_the_deadline() {
    let start = Instant::now();
    let s = Scope::with_timeout(ms(250));
    s.cancelled().await;
    assert_eq!(start.elapsed(), ms(250));
}

#[tokio::test(start_paused = true)]
async fn a_tighter_child_deadline_fires_first_and_leaves_the_parent_alone() {
    let start = Instant::now();
    let parent = Scope::with_timeout(ms(1000));
    let child = parent.child().cap(ms(30)).build().unwrap();
    child.cancelled().await;
    assert_eq!(start.elapsed(), ms(30));
    assert_eq!(child.cause(), Some(Cause::DeadlineExceeded));
    assert!(!parent.is_cancelled());
    parent.cancelled().await;
    assert_eq!(start.elapsed(), ms(1000));
}

#[tokio::test(start_paused = true)]
async fn child_deadline_is_min_of_parent_minus_reserve_cap_timeout_and_operation() {
    let parent = Scope::with_timeout(ms(1000));
    advance(ms(150)).await; // queueing and handler time pay from the budget
    let c = parent.child().reserve(ms(100)).build().unwrap();
    assert_eq!(c.remaining(), Some(ms(750)));
    let c = parent.child().cap(ms(300)).build().unwrap();
    assert_eq!(c.remaining(), Some(ms(300)));
    let c = parent.child().cap(ms(200)).cap(ms(300)).build().unwrap();
    assert_eq!(c.remaining(), Some(ms(200)));
    let c = parent
        .child()
        .deadline(Instant::now() + ms(40))
        .build()
        .unwrap();
    assert_eq!(c.remaining(), Some(ms(40)));
}

#[tokio::test(start_paused = true)]
async fn no_option_makes_a_child_outlive_its_parent() {
    let parent = Scope::with_timeout(ms(100));
    let far = Instant::now() + Duration::from_secs(3600);
    let c = parent
        .child()
        .cap(Duration::from_secs(60))
        .cap(Duration::MAX)
        .deadline(far)
        .build()
        .unwrap();
    assert_eq!(c.deadline(), parent.deadline());
    let grandchild = c.child().cap(Duration::MAX).build().unwrap();
    assert_eq!(grandchild.deadline(), parent.deadline());
}

#[tokio::test(start_paused = true)]
async fn too_little_budget_fails_fast() {
    let parent = Scope::with_timeout(ms(100));
    advance(ms(60)).await;
    let err = parent
        .child()
        .reserve(ms(10))
        .min_useful(ms(50))
        .build()
        .unwrap_err();
    assert!(err.is_budget_exhausted());
    let shortfall = err.budget().unwrap();
    assert_eq!(
        (shortfall.available(), shortfall.needed()),
        (ms(30), ms(50))
    );
    // Nothing was linked under the parent.
    assert_eq!(parent.__live_children(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_passed_deadline_that_has_not_fired_yet_still_refuses_children() {
    let parent = Scope::with_timeout(ms(10));
    // Jump past the deadline without yielding to the timer task.
    advance(ms(20)).await;
    let err = parent.child().build();
    assert!(err.is_err(), "remaining budget is zero");
}

/// A child asked of a scope whose deadline passed before its timer ran is refused with the
/// deadline (as `spawn`, `run` and `dispatch` are), and the deadline is made the scope's
/// cancel, not reported as "budget exhausted" with the scope left running.
// regression: the child was refused as "budget exhausted" and the scope left running.
#[tokio::test(start_paused = true)]
async fn a_child_of_a_scope_whose_deadline_passed_is_refused_with_the_deadline() {
    use futures::FutureExt;
    let parent = Scope::with_timeout(ms(10));
    assert!(advance(ms(20)).now_or_never().is_none());
    assert!(!parent.is_cancelled(), "the timer task has not run yet");
    for err in [
        parent.child().build().unwrap_err(),
        parent.child().cap(ms(5)).build().unwrap_err(),
    ] {
        assert!(err.is_deadline_exceeded(), "{err:?}");
        assert!(!err.is_budget_exhausted(), "{err:?}");
    }
    assert_eq!(parent.cause(), Some(Cause::DeadlineExceeded));
}

#[tokio::test(start_paused = true)]
async fn unbounded_scopes_have_no_deadline_until_a_child_sets_one() {
    let root = Scope::new();
    assert_eq!(root.remaining(), None);
    let c = root.child().build().unwrap();
    assert_eq!(c.deadline(), None);
    let t = root.child().cap(ms(5)).build().unwrap();
    assert_eq!(t.remaining(), Some(ms(5)));
    t.cancelled().await;
    assert!(!root.is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn a_deadline_in_the_past_gives_a_cancelled_scope() {
    let s = Scope::with_deadline(Instant::now() - ms(1));
    assert!(s.is_cancelled());
    assert_eq!(s.cause(), Some(Cause::DeadlineExceeded));
    let s = Scope::with_timeout(Duration::ZERO);
    assert!(s.is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn huge_timeouts_saturate_instead_of_overflowing() {
    let s = Scope::with_timeout(Duration::MAX);
    assert!(s.remaining().unwrap() > Duration::from_secs(86_400 * 365));
    let c = s.child().cap(Duration::MAX).build().unwrap();
    assert!(c.deadline() <= s.deadline());
}

#[tokio::test(start_paused = true)]
async fn many_children_with_deadlines_each_fire_at_their_own_time() {
    let start = Instant::now();
    let root = Scope::with_timeout(Duration::from_secs(10));
    let children: Vec<_> = (1..=50u64)
        .rev()
        .map(|i| root.child().cap(ms(i * 10)).build().unwrap())
        .collect();
    for (i, c) in children.iter().enumerate().rev() {
        c.cancelled().await;
        let expected = ms((50 - i as u64) * 10);
        assert_eq!(start.elapsed(), expected);
        assert_eq!(c.cause(), Some(Cause::DeadlineExceeded));
    }
    assert!(!root.is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn dropping_a_scope_disarms_its_timer() {
    let root = Scope::new();
    for _ in 0..1000 {
        let c = root.child().cap(Duration::from_secs(30)).build().unwrap();
        drop(c);
    }
    assert_eq!(root.__live_children(), 0);
    // A later deadline still fires.
    let c = root.child().cap(ms(5)).build().unwrap();
    c.cancelled().await;
}

#[tokio::test(start_paused = true)]
async fn a_cancel_before_the_deadline_keeps_the_explicit_cause() {
    let s = Scope::with_timeout(ms(50));
    s.cancel_with("early");
    advance(ms(100)).await;
    tokio::task::yield_now().await;
    assert_eq!(s.cause(), Some(Cause::cancelled("early")));
}

/// `run` on a scope whose deadline has passed, before its timer task ran (tokio fires timers
/// on millisecond ticks, and the task may be scheduled later still), refuses the body with
/// the deadline, as `spawn`, `child().build()` and `dispatch` of the same scope do: nothing
/// starts at or after its deadline with nothing left of its budget.
// regression: the body was polled and its output returned.
#[tokio::test(start_paused = true)]
async fn run_on_a_scope_whose_deadline_passed_before_its_timer_fired_refuses_the_body() {
    use futures::FutureExt;
    let s = Scope::with_timeout(ms(10));
    // Move the clock past the deadline without letting the timer task run: `advance` moves
    // the clock on its first poll, then yields (dropped here).
    assert!(advance(ms(20)).now_or_never().is_none());
    assert!(!s.is_cancelled(), "the timer task has not run yet");
    let polled = std::sync::atomic::AtomicBool::new(false);
    let out = s
        .run(async { polled.store(true, std::sync::atomic::Ordering::SeqCst) })
        .now_or_never()
        .expect("a refused body is ready at once");
    assert!(
        !polled.load(std::sync::atomic::Ordering::SeqCst),
        "the body ran after its deadline"
    );
    let err = out.unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err:?}");
    assert_eq!(s.cause(), Some(Cause::DeadlineExceeded));
}

/// A passed deadline made the cancel before the timer task ran (here by a `spawn` in a
/// grandchild) gives every scope the cause its timer would have given it: a child whose own,
/// tighter deadline passed first was stopped by its deadline (`DeadlineExceeded`), not by its
/// parent's.
// regression: the child said `ParentCancelled(DeadlineExceeded)`, not `DeadlineExceeded`.
#[tokio::test(start_paused = true)]
async fn a_deadline_made_the_cancel_before_its_timer_fired_gives_the_timers_causes() {
    use futures::FutureExt;
    let parent = Scope::with_timeout(ms(100));
    let child = parent.child().cap(ms(50)).build().unwrap();
    let grandchild = child.child().build().unwrap();
    // Past both deadlines without letting the timer task run (see above).
    assert!(advance(ms(120)).now_or_never().is_none());
    assert!(!parent.is_cancelled(), "the timer task has not run yet");
    assert!(grandchild
        .spawn(async {})
        .unwrap_err()
        .is_deadline_exceeded());
    assert_eq!(parent.cause(), Some(Cause::DeadlineExceeded));
    assert_eq!(child.cause(), Some(Cause::DeadlineExceeded));
    assert_eq!(
        grandchild.cause(),
        Some(Cause::ParentCancelled(std::sync::Arc::new(
            Cause::DeadlineExceeded
        )))
    );
}

/// A deadline needs tokio's timer: in a runtime built without it (no `enable_time`), a scope
/// with a deadline panics in the caller, as `tokio::time::sleep` would, rather than being made
/// with a deadline that never fires (its timer task panicking where nobody sees it).
#[test]
fn a_deadline_in_a_runtime_without_timers_panics_in_the_caller() {
    use std::panic::{catch_unwind, AssertUnwindSafe};

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let root = catch_unwind(|| Scope::with_timeout(ms(10)));
        assert!(root.is_err(), "a root with a deadline was made");
        let root = Scope::new();
        let child = catch_unwind(AssertUnwindSafe(|| root.child().cap(ms(10)).build()));
        assert!(child.is_err(), "a child with a deadline was made");
        // The timers are left as they were: a scope without a deadline is still fine.
        assert!(root.child().build().is_ok());
    });
}

/// Builder rules only ever tighten: `reserve`, `min_useful`, `cap` (and `timeout`) and
/// `deadline` set twice keep the stricter value, in either order.
#[tokio::test(start_paused = true)]
#[allow(deprecated)] // `timeout`, until it is removed
async fn a_child_builder_rule_set_twice_keeps_the_stricter_value() {
    let parent = Scope::with_timeout(ms(1000));
    let remaining = |b: cancel_scope::ChildBuilder<'_>| b.build().unwrap().remaining().unwrap();
    // The larger reserve.
    assert_eq!(
        remaining(parent.child().reserve(ms(300)).reserve(ms(100))),
        ms(700)
    );
    assert_eq!(
        remaining(parent.child().reserve(ms(100)).reserve(ms(300))),
        ms(700)
    );
    // The smaller cap, also when the deprecated `timeout` (another name for `cap`) says it.
    assert_eq!(remaining(parent.child().cap(ms(200)).cap(ms(600))), ms(200));
    assert_eq!(
        remaining(parent.child().timeout(ms(600)).cap(ms(200))),
        ms(200)
    );
    assert_eq!(
        remaining(parent.child().cap(ms(200)).timeout(ms(600))),
        ms(200)
    );
    // The earlier deadline.
    let (early, late) = (Instant::now() + ms(250), Instant::now() + ms(800));
    assert_eq!(
        remaining(parent.child().deadline(early).deadline(late)),
        ms(250)
    );
    assert_eq!(
        remaining(parent.child().deadline(late).deadline(early)),
        ms(250)
    );
    // The larger minimum useful budget: 1000 ms is not enough for 1200 ms, whichever came last.
    for (a, b) in [(ms(1200), ms(10)), (ms(10), ms(1200))] {
        let err = parent
            .child()
            .min_useful(a)
            .min_useful(b)
            .build()
            .unwrap_err();
        assert!(err.is_budget_exhausted(), "{err}");
    }
    assert!(parent
        .child()
        .min_useful(ms(10))
        .min_useful(ms(900))
        .build()
        .is_ok());
}

// A deadline or a grace period at the far end of what an `Instant` can hold (a caller's
// computed value) panics nothing: tokio rounds a sleep's deadline up to the next
// millisecond, which overflows there.

#[tokio::test(start_paused = true)]
async fn a_deadline_at_the_end_of_time_does_not_panic_the_timer_task() {
    // Every panic of this thread, where the timer task of this current-thread runtime runs (the
    // hook is the process's: the other tests of this binary run on threads of their own).
    let panics = Arc::new(AtomicUsize::new(0));
    let seen = panics.clone();
    let this_thread = std::thread::current().id();
    std::panic::set_hook(Box::new(move |info| {
        eprintln!("{info}");
        if std::thread::current().id() == this_thread {
            seen.fetch_add(1, Ordering::SeqCst);
        }
    }));
    let far = Scope::with_deadline(latest_instant(Instant::now()));
    // A second scope, due first: when its deadline fires, the timer task goes on to sleep
    // until the far one, in the same poll, before this task runs again.
    let soon = Scope::with_timeout(Duration::from_millis(1));
    soon.cancelled().await;
    assert_eq!(panics.load(Ordering::SeqCst), 0);
    assert!(!far.is_cancelled());
    // And it still serves the thread's deadlines.
    let next = Scope::with_timeout(Duration::from_millis(5));
    next.cancelled().await;
    assert_eq!(panics.load(Ordering::SeqCst), 0);
    let _ = std::panic::take_hook();
}

#[tokio::test(start_paused = true)]
async fn a_grace_period_to_the_end_of_time_is_never_over() {
    use futures::FutureExt;
    let now = Instant::now();
    let s = Scope::new()
        .child()
        .grace(latest_instant(now) - now)
        .build()
        .unwrap();
    let stuck = s
        .register(ChildSpec::read_only("stuck"))
        .unwrap()
        .dispatch()
        .unwrap();
    s.cancel();
    // Too far to sleep until: the stuck child is never quarantined, and waiting panics nothing.
    let mut quiet = Box::pin(s.quiesce());
    let waited = tokio::time::timeout(Duration::from_secs(3600), &mut quiet).await;
    assert!(waited.is_err(), "quarantined at the end of time?");
    stuck.succeed();
    assert!(quiet.now_or_never().is_some());
}

#[tokio::test(start_paused = true)]
async fn child_rules_cut_and_refuse_as_the_three_setters_do() {
    use cancel_scope::budget::Rules;
    let rules = Rules::new()
        .reserve(ms(100))
        .cap(ms(300))
        .min_useful(ms(50));
    for parent_ms in [1000, 350, 149, 120] {
        let parent = Scope::with_timeout(ms(parent_ms));
        let by_rules = parent.child().rules(rules).build();
        let by_setters = parent
            .child()
            .reserve(ms(100))
            .cap(ms(300))
            .min_useful(ms(50))
            .build();
        match (by_rules, by_setters) {
            (Ok(a), Ok(b)) => assert_eq!(a.deadline(), b.deadline(), "parent {parent_ms} ms"),
            (Err(a), Err(b)) => {
                assert!(
                    a.is_budget_exhausted() && b.is_budget_exhausted(),
                    "{a} / {b}"
                )
            }
            (a, b) => panic!("parent {parent_ms} ms: {a:?} vs {b:?}"),
        }
    }
    // 1000 ms: the cap; 350 ms: less the reserve; 149 and 120 ms: refused (49, 20 ms < 50 ms).
    let parent = Scope::with_timeout(ms(350));
    assert_eq!(
        parent.child().rules(rules).build().unwrap().remaining(),
        Some(ms(250))
    );
    let parent = Scope::with_timeout(ms(149));
    assert!(parent
        .child()
        .rules(rules)
        .build()
        .unwrap_err()
        .is_budget_exhausted());
    // Rules tighten what is set, as the setters do: a smaller reserve loosens nothing.
    let parent = Scope::with_timeout(ms(1000));
    let c = parent
        .child()
        .reserve(ms(800))
        .rules(rules)
        .build()
        .unwrap();
    assert_eq!(c.remaining(), Some(ms(200)));
}
