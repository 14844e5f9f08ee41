//! The budget arithmetic reproduces the seeds' figures exactly and never yields more than it
//! was given.

use std::time::Duration;

use cancel_scope::budget::{grant, hop_timeout, ChildBudget, EndpointBudget, Split};
use proptest::prelude::*;

use crate::support::time::ms;

#[test]
fn request_of_1000ms_leaves_750_after_queue_handler_and_reserve() {
    // Seed 001: 1000 - 60 (queued) - 90 (handler so far) - 100 (response reserve) = 750.
    let remaining = ms(1000) - ms(60) - ms(90);
    let child = ChildBudget::new().reserve(ms(100)).compute(Some(remaining));
    assert_eq!(child, Ok(Some(ms(750))));
}

#[test]
fn child_budget_is_the_minimum_of_parent_cap_and_operation() {
    let b = ChildBudget::new()
        .reserve(ms(20))
        .cap(ms(300))
        .operation(ms(250));
    assert_eq!(b.compute(Some(ms(1000))), Ok(Some(ms(250))));
    assert_eq!(b.compute(Some(ms(200))), Ok(Some(ms(180))));
    assert_eq!(b.compute(None), Ok(Some(ms(250))));
    assert_eq!(ChildBudget::new().compute(None), Ok(None));
}

#[test]
fn below_minimum_useful_budget_fails_fast() {
    let b = ChildBudget::new().reserve(ms(100)).min_useful(ms(50));
    let err = b.compute(Some(ms(140))).unwrap_err();
    assert_eq!((err.available(), err.needed()), (ms(40), ms(50)));
    assert!(b.compute(Some(ms(150))).is_ok());
    // Nothing left at all is exhausted even without a minimum.
    assert!(ChildBudget::new().compute(Some(ms(0))).is_err());
    assert!(ChildBudget::new()
        .reserve(ms(100))
        .compute(Some(ms(80)))
        .is_err());
}

#[test]
fn even_split_of_800ms_over_3_attempts_with_cap_300_is_266_267_267() {
    // Seed 004: per attempt min(hopCap, remaining / attemptsLeft), each attempt using it all.
    let split = Split::Even { cap: Some(ms(300)) };
    let mut left = ms(800);
    let mut got = Vec::new();
    for attempts_left in (1..=3).rev() {
        let a = split.attempt(left, attempts_left, Duration::ZERO);
        got.push(a);
        left -= a;
    }
    assert_eq!(got, [ms(266), ms(267), ms(267)]);
    assert_eq!(got.iter().sum::<Duration>(), ms(800));
}

#[test]
fn even_split_of_10s_is_capped_at_300ms() {
    let split = Split::Even { cap: Some(ms(300)) };
    assert_eq!(
        split.attempt(Duration::from_secs(10), 3, Duration::ZERO),
        ms(300)
    );
}

#[test]
fn greedy_grant_at_120_700_900_gives_500_200_nothing() {
    // Seed 003: deadline 1000, reserve 100, cap 500.
    let at = |now: u64| grant(ms(1000 - now), ms(100), Some(ms(500)));
    assert_eq!(at(120), ms(500));
    assert_eq!(at(700), ms(200));
    assert_eq!(at(900), Duration::ZERO);
    let greedy = Split::Greedy { cap: Some(ms(500)) };
    assert_eq!(greedy.attempt(ms(1000 - 700), 2, ms(100)), ms(200));
}

#[test]
fn hop_timeout_is_min_300_max_1_remaining_minus_20() {
    // Seed 004: hop = min(300, max(1, remaining - 20)).
    let hop = |r| hop_timeout(ms(r), ms(20), ms(300), ms(1));
    assert_eq!(hop(1000), ms(300));
    assert_eq!(hop(320), ms(300));
    assert_eq!(hop(200), ms(180));
    assert_eq!(hop(21), ms(1));
    assert_eq!(hop(10), ms(1));
    // The floor never lifts a hop above what remains.
    assert_eq!(
        hop_timeout(Duration::from_micros(300), ms(20), ms(300), ms(1)),
        Duration::from_micros(300)
    );
    assert_eq!(hop(0), Duration::ZERO);
}

#[test]
fn endpoint_policy_clamps_defaults_and_subtracts_queueing_and_reserve() {
    let p = EndpointBudget::builder(ms(2000))
        .default_budget(ms(500))
        .reserve(ms(50))
        .build();
    assert_eq!(p.clamp(Some(ms(60_000))), ms(2000));
    assert_eq!(p.clamp(Some(ms(100))), ms(100));
    assert_eq!(p.clamp(None), ms(500));
    assert_eq!(p.admit(Some(ms(60_000)), ms(100)), ms(1850));
    assert_eq!(p.admit(None, ms(1000)), Duration::ZERO);
    // A default above the maximum is clamped to it.
    assert_eq!(
        EndpointBudget::builder(ms(10))
            .default_budget(ms(99))
            .build()
            .default_budget(),
        ms(10)
    );
}

fn dur() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0u64..5_000).prop_map(Duration::from_millis),
        (0u64..u64::MAX).prop_map(Duration::from_nanos),
        Just(Duration::MAX),
        Just(Duration::ZERO),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn no_child_budget_exceeds_its_parent(
        parent in proptest::option::of(dur()),
        reserve in dur(),
        cap in proptest::option::of(dur()),
        operation in proptest::option::of(dur()),
        min_useful in dur(),
    ) {
        let mut b = ChildBudget::new().reserve(reserve).min_useful(min_useful);
        if let Some(c) = cap { b = b.cap(c); }
        if let Some(o) = operation { b = b.operation(o); }
        match b.compute(parent) {
            Ok(Some(got)) => {
                if let Some(p) = parent { prop_assert!(got <= p.saturating_sub(reserve)); }
                if let Some(c) = cap { prop_assert!(got <= c); }
                if let Some(o) = operation { prop_assert!(got <= o); }
                prop_assert!(got >= min_useful);
                prop_assert!(!got.is_zero());
            }
            Ok(None) => prop_assert!(parent.is_none() && cap.is_none() && operation.is_none()),
            Err(e) => prop_assert!(e.available() < e.needed() || e.available().is_zero()),
        }
    }

    /// Builder rules only ever tighten: each rule set twice, in either order, computes what
    /// the stricter value alone computes (the larger reserve and minimum, the smaller cap and
    /// operation limit).
    #[test]
    fn a_rule_set_twice_keeps_the_stricter_value(
        parent in proptest::option::of(dur()),
        reserve in (dur(), dur()),
        cap in (dur(), dur()),
        operation in (dur(), dur()),
        min_useful in (dur(), dur()),
    ) {
        let twice = |first: bool| {
            let pick = |p: (Duration, Duration)| if first { p } else { (p.1, p.0) };
            let (r, c, o, m) = (pick(reserve), pick(cap), pick(operation), pick(min_useful));
            ChildBudget::new()
                .reserve(r.0).cap(c.0).operation(o.0).min_useful(m.0)
                .reserve(r.1).cap(c.1).operation(o.1).min_useful(m.1)
        };
        let strictest = ChildBudget::new()
            .reserve(reserve.0.max(reserve.1))
            .cap(cap.0.min(cap.1))
            .operation(operation.0.min(operation.1))
            .min_useful(min_useful.0.max(min_useful.1));
        for first in [true, false] {
            prop_assert_eq!(twice(first), strictest);
            prop_assert_eq!(twice(first).compute(parent), strictest.compute(parent));
        }
    }

    #[test]
    fn no_attempt_exceeds_what_remains(
        remaining in dur(), attempts in 0u32..10, reserve in dur(), cap in proptest::option::of(dur()),
    ) {
        for split in [Split::Even { cap }, Split::Greedy { cap }] {
            let a = split.attempt(remaining, attempts, reserve);
            prop_assert!(a <= remaining.saturating_sub(reserve));
            if let Some(c) = cap { prop_assert!(a <= c); }
        }
    }

    #[test]
    fn an_even_share_is_the_whole_milliseconds_left_divided_by_the_attempts_left(
        remaining in dur(), attempts in 1u32..12, reserve in dur(),
    ) {
        // The reference in 128 bits (every count, whether divided by a constant or not); a
        // share under 1 ms is 1 ms, or all that is left if that is less.
        let left = remaining.saturating_sub(reserve);
        let ms = left.as_millis() / u128::from(attempts);
        let want = if ms == 0 {
            left.min(Duration::from_millis(1))
        } else {
            Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
        };
        prop_assert_eq!(Split::Even { cap: None }.attempt(remaining, attempts, reserve), want);
    }

    #[test]
    fn attempts_together_never_exceed_the_budget(remaining in 0u64..100_000, attempts in 1u32..8) {
        let split = Split::Even { cap: None };
        let mut left = ms(remaining);
        for n in (1..=attempts).rev() {
            let a = split.attempt(left, n, Duration::ZERO);
            left = left.checked_sub(a).expect("an attempt took more than was left");
        }
    }

    #[test]
    fn hops_and_admission_never_exceed_their_inputs(
        remaining in dur(), pad in dur(), cap in dur(), floor in dur(),
        max in dur(), default in dur(), declared in proptest::option::of(dur()), queued in dur(),
    ) {
        let h = hop_timeout(remaining, pad, cap, floor);
        prop_assert!(h <= remaining && h <= cap);
        let p = EndpointBudget::builder(max).default_budget(default).build();
        let a = p.admit(declared, queued);
        prop_assert!(a <= max);
        if let Some(d) = declared { prop_assert!(a <= d); }
    }
}

#[test]
fn rules_on_a_child_budget_are_the_three_setters() {
    use cancel_scope::budget::Rules;
    let rules = Rules::new().reserve(ms(20)).cap(ms(300)).min_useful(ms(50));
    let by_rules = ChildBudget::new().rules(rules);
    let by_setters = ChildBudget::new()
        .reserve(ms(20))
        .cap(ms(300))
        .min_useful(ms(50));
    for parent in [
        None,
        Some(ms(1000)),
        Some(ms(200)),
        Some(ms(69)),
        Some(ms(60)),
    ] {
        assert_eq!(
            by_rules.compute(parent),
            by_setters.compute(parent),
            "{parent:?}"
        );
    }
    assert_eq!(by_rules.compute(Some(ms(200))), Ok(Some(ms(180))));
    assert!(by_rules.compute(Some(ms(60))).is_err());
    assert_eq!(Rules::default(), Rules::new());
    assert_eq!(ChildBudget::new().rules(Rules::new()), ChildBudget::new());
}

#[test]
fn an_endpoint_budget_builder_defaults_to_the_maximum_and_the_old_forms_agree() {
    let built = EndpointBudget::builder(ms(2000)).reserve(ms(50)).build();
    assert_eq!(built.default_budget(), ms(2000));
    assert_eq!(built.admit(None, ms(0)), ms(1950));
    #[allow(deprecated)]
    let old = EndpointBudget::new(ms(2000), ms(500)).reserve(ms(50));
    let new = EndpointBudget::builder(ms(2000))
        .default_budget(ms(500))
        .reserve(ms(50))
        .build();
    assert_eq!(old, new);
    assert_eq!(new.to_builder().build(), new);
}
