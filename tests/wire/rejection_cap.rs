//! The rejection cap (`wire::RejectionCap`) on tokio's virtual clock: admission refuses at
//! most a fraction of requests over a sliding window, and a refusal beyond it runs as a shadow
//! decision with a budget never longer than declared.

use std::sync::Arc;

use cancel_scope::registry::{InProcessRegistry, Operations};
use cancel_scope::wire::{
    EndpointPolicy, Incoming, Mode, OverCap, RejectionCap, RequestClass, ServerScope, Stage,
};
use tokio::time::{advance, Instant};

use crate::support::time::{ms, secs};

/// max 5 s (the hard cap), default 1 s, reserve 50 ms, minimum useful 20 ms.
fn policy() -> EndpointPolicy {
    EndpointPolicy::builder(ms(5_000))
        .default_budget(ms(1_000))
        .reserve(ms(50))
        .min_useful(ms(20))
        .build()
}

fn good(cap: &RejectionCap) -> Incoming {
    Incoming::new().grpc_timeout(b"500m").rejection_cap(cap)
}

fn malformed(cap: &RejectionCap) -> Incoming {
    Incoming::new().grpc_timeout(b"-5m").rejection_cap(cap)
}

/// `n` admitted requests at the current instant.
fn admit_good(p: &EndpointPolicy, cap: &RejectionCap, n: usize) {
    for _ in 0..n {
        p.admit(good(cap), Instant::now()).unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn refusals_stay_within_the_fraction_of_all_requests_in_the_window() {
    let cap = RejectionCap::default();
    let p = policy();
    admit_good(&p, &cap, 80);
    // 80 admitted: of 100 requests, 20 may be refused; every one after that runs.
    let mut refused = 0;
    for _ in 0..40 {
        match p.admit(malformed(&cap), Instant::now()) {
            Err(e) => {
                assert!(e.is_invalid());
                refused += 1;
            }
            Ok((_, a)) => assert!(a.is_over_rejection_cap()),
        }
        let (decided, in_window) = cap.in_window(Instant::now());
        assert!(in_window * 100 <= decided * 20, "{in_window} of {decided}");
    }
    assert_eq!(refused, 24, "20 % of 120 requests");
    assert_eq!((cap.refused(), cap.let_through()), (24, 16));
}

#[tokio::test(start_paused = true)]
async fn a_fresh_cap_refuses_nothing_until_the_fraction_allows_one() {
    let cap = RejectionCap::default();
    let p = policy();
    // At 20 %, the 5th request is the first that can be refused: 1 of 5.
    for i in 1..=10 {
        let refused = p.admit(malformed(&cap), Instant::now()).is_err();
        assert_eq!(refused, i % 5 == 0, "request {i}");
    }
}

#[tokio::test(start_paused = true)]
async fn requests_leave_the_window_slice_by_slice() {
    let cap = RejectionCap::new(50, secs(10));
    let p = policy();
    admit_good(&p, &cap, 10);
    advance(secs(5)).await;
    // 10 in the window: refusing all ten next ones is 10 of 20, within 50 %.
    let refused = (0..10)
        .filter(|_| p.admit(malformed(&cap), Instant::now()).is_err())
        .count();
    assert_eq!(refused, 10, "refused ≤ 50 % of 20 allows all ten");
    assert_eq!(cap.in_window(Instant::now()), (20, 10));
    // The ten admitted ones have left the window 10 s after they came:
    advance(secs(5) + secs(1)).await;
    assert_eq!(cap.in_window(Instant::now()), (10, 10));
    // ... so the next refusal would be 11 of 11: let through.
    let (_, a) = p.admit(malformed(&cap), Instant::now()).unwrap();
    assert!(a.is_over_rejection_cap());
    // Once the refusals leave too, refusing starts over.
    advance(secs(10)).await;
    assert_eq!(cap.in_window(Instant::now()), (0, 0));
    admit_good(&p, &cap, 1);
    assert!(p.admit(malformed(&cap), Instant::now()).is_err());
}

#[tokio::test(start_paused = true)]
async fn a_refusal_let_through_never_gets_more_than_declared_nor_the_default() {
    let cap = RejectionCap::new(0, secs(10)); // nothing refused: every refusal is let through
    let p = policy();
    let now = Instant::now();
    type Case = (fn(&RejectionCap) -> Incoming, u64, &'static str);
    let cases: [Case; 5] = [
        // A malformed header gets the default, as a request that declares nothing does.
        (malformed, 1_000, "malformed"),
        // A shorter valid header beside a bad one still wins.
        (
            |c| {
                Incoming::new()
                    .grpc_timeout(b"300m")
                    .service_budget(b"v=2, rem=9")
                    .rejection_cap(c)
            },
            300,
            "malformed beside a valid one",
        ),
        // A repeated header: the shortest line.
        (
            |c| {
                Incoming::new()
                    .grpc_timeout(b"99999999H")
                    .grpc_timeout(b"2S")
                    .rejection_cap(c)
            },
            1_000,
            "repeated",
        ),
        // Too little budget: what was declared, no reserve taken off it.
        (
            |c| Incoming::new().grpc_timeout(b"10m").rejection_cap(c),
            10,
            "exhausted",
        ),
        (
            |c| {
                Incoming::new()
                    .service_budget(b"v=1, rem=60")
                    .rejection_cap(c)
            },
            60,
            "exhausted by the reserve",
        ),
    ];
    let enforced = RejectionCap::new(100, secs(10));
    for (incoming, budget, why) in cases {
        assert!(p.admit(incoming(&enforced), now).is_err(), "{why}");
        let (scope, a) = p.admit(incoming(&cap), now).unwrap();
        assert_eq!(scope.remaining(), Some(ms(budget)), "{why}");
        assert!(a.is_shadowed() && a.is_over_rejection_cap(), "{why}");
        assert_eq!(a.would_be_deadline(), None, "{why}");
        let decision = &a.would_be()[0];
        assert!(decision.is_refusal() && decision.is_over_rejection_cap());
        assert!(
            decision.to_string().starts_with("over the rejection cap"),
            "{decision}"
        );
        scope.close();
        let report = scope.quiesce().await;
        assert!(report.would_be()[0].is_over_rejection_cap(), "{report}");
    }
    // Over a rejecting maximum: the default, never the declared 9 s.
    let reject = p.to_builder().over_cap(OverCap::Reject).build();
    let (scope, _) = reject
        .admit(Incoming::new().grpc_timeout(b"9S").rejection_cap(&cap), now)
        .unwrap();
    assert_eq!(scope.remaining(), Some(ms(1_000)));
}

#[tokio::test(start_paused = true)]
async fn the_queue_is_not_taken_off_but_the_hard_cap_still_holds() {
    let cap = RejectionCap::new(0, secs(10));
    let p = EndpointPolicy::builder(ms(1_000))
        .min_useful(ms(20))
        .build();
    let ingress = Instant::now();
    advance(ms(990)).await;
    // 1 s declared, 990 ms queued: refused as exhausted; let through, within the hard cap.
    let (scope, _) = p
        .admit(
            Incoming::new().grpc_timeout(b"1S").rejection_cap(&cap),
            ingress,
        )
        .unwrap();
    assert_eq!(scope.remaining(), Some(ms(10)));
    // Nothing left at all (queued as long as the hard cap, or declared 0): refused anyway.
    advance(ms(10)).await;
    let err = p
        .admit(
            Incoming::new().grpc_timeout(b"1S").rejection_cap(&cap),
            ingress,
        )
        .unwrap_err();
    assert!(err.is_budget_exhausted());
    let err = p
        .admit(
            Incoming::new().grpc_timeout(b"0n").rejection_cap(&cap),
            Instant::now(),
        )
        .unwrap_err();
    assert!(err.is_budget_exhausted());
    assert_eq!((cap.refused(), cap.let_through()), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn at_100_percent_every_refusal_is_enforced_and_nothing_is_counted() {
    let cap = RejectionCap::new(100, secs(10));
    let p = policy();
    assert!(p.admit(malformed(&cap), Instant::now()).is_err());
    admit_good(&p, &cap, 3);
    assert_eq!(cap.in_window(Instant::now()), (0, 0));
    assert_eq!((cap.refused(), cap.let_through()), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn shadowed_requests_count_and_a_staged_refusal_is_capped_too() {
    let cap = RejectionCap::new(50, secs(10));
    // Shadow mode refuses nothing, and its requests count in the window.
    let shadow = policy().to_builder().mode(Mode::Shadow).build();
    for _ in 0..3 {
        let (_, a) = shadow.admit(malformed(&cap), Instant::now()).unwrap();
        assert!(!a.is_over_rejection_cap());
    }
    assert_eq!(cap.in_window(Instant::now()), (3, 0));
    // A read-only stage enforces a GET's refusal, within the cap; a write stays shadowed.
    let staged = policy().to_builder().enforce_for(Stage::ReadOnly).build();
    let get = || malformed(&cap).class(RequestClass::ReadOnly);
    assert!(staged.admit(get(), Instant::now()).is_err()); // 1 of 4
    assert!(staged.admit(get(), Instant::now()).is_err()); // 2 of 5
    assert!(staged.admit(get(), Instant::now()).is_err()); // 3 of 6
    let (scope, a) = staged.admit(get(), Instant::now()).unwrap(); // 4 of 7 is over 50 %
    assert!(a.is_over_rejection_cap());
    assert_eq!(scope.remaining(), Some(ms(1_000)));
    let (scope, a) = staged.admit(malformed(&cap), Instant::now()).unwrap();
    assert!(a.is_shadowed() && !a.is_over_rejection_cap());
    assert_eq!(scope.remaining(), Some(ms(5_000))); // shadowed: the hard cap
}

#[tokio::test(start_paused = true)]
async fn the_registry_path_is_capped_and_its_own_refusals_are_not_counted() {
    let cap = RejectionCap::new(0, secs(10));
    let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    let p = policy();
    let (scope, a) = p
        .admit_joined(&ops, malformed(&cap), Instant::now())
        .await
        .unwrap();
    assert!(a.is_over_rejection_cap() && a.registry().applied());
    assert_eq!(scope.remaining(), Some(ms(1_000)));
    // A server that shuts down refuses, always, and the cap does not count it.
    let server = ServerScope::new();
    server.shutdown(ms(0)).await;
    let err = p
        .admit_joined_in(&server, &ops, good(&cap), Instant::now())
        .await
        .unwrap_err();
    assert!(err.is_unavailable());
    assert_eq!((cap.refused(), cap.let_through()), (0, 1));
}
