//! Shadow mode at admission and egress (`wire::Mode::Shadow`), on tokio's virtual clock: every
//! decision computed as when enforcing, none enforced but the hard cap.

use std::time::Duration;

use cancel_scope::wire::{
    EgressPolicy, EndpointPolicy, Incoming, Mode, OverCap, ServiceBudget, WouldBe,
};
use proptest::prelude::*;
use tokio::time::{advance, Instant};

use crate::support::time::{ms, paused_runtime};

/// max 5 s (the hard cap), default 1 s, reserve 50 ms, minimum useful 20 ms.
fn enforcing() -> EndpointPolicy {
    EndpointPolicy::builder(ms(5_000))
        .default_budget(ms(1_000))
        .reserve(ms(50))
        .min_useful(ms(20))
        .build()
}

fn shadowing() -> EndpointPolicy {
    enforcing().to_builder().mode(Mode::Shadow).build()
}

#[tokio::test(start_paused = true)]
async fn a_refusal_is_recorded_and_the_request_runs_bounded_by_the_hard_cap() {
    let now = Instant::now();
    type Case = (fn() -> Incoming, &'static str);
    let cases: [Case; 4] = [
        (|| Incoming::new().grpc_timeout(b"-5m"), "malformed"),
        (
            || Incoming::new().grpc_timeout(b"1S").grpc_timeout(b"2S"),
            "repeated",
        ),
        (
            || Incoming::new().service_budget(b"v=2, rem=9"),
            "unknown version",
        ),
        (
            || Incoming::new().grpc_timeout(b"60m"),
            "below the minimum useful",
        ),
    ];
    for (incoming, why) in cases {
        assert!(enforcing().admit(incoming(), now).is_err(), "{why}");
        let (scope, a) = shadowing().admit(incoming(), now).unwrap();
        assert_eq!(scope.remaining(), Some(ms(5_000)), "{why}");
        assert!(a.is_shadowed());
        assert_eq!(a.would_be_deadline(), None);
        assert_eq!(a.would_be().len(), 1);
        assert!(a.would_be()[0].is_refusal(), "{:?}", a.would_be());
        scope.close();
        let report = scope.quiesce().await;
        assert!(report.would_be()[0].is_refusal());
        assert!(
            report.to_string().contains("would have refused"),
            "{report}"
        );
    }
    let over = enforcing()
        .to_builder()
        .over_cap(OverCap::Reject)
        .mode(Mode::Shadow)
        .build();
    let (scope, a) = over
        .admit(Incoming::new().grpc_timeout(b"9S"), now)
        .unwrap();
    assert_eq!(scope.remaining(), Some(ms(5_000)));
    assert!(a.would_be()[0].is_refusal());
}

#[tokio::test(start_paused = true)]
async fn a_clamp_is_recorded_and_the_would_be_deadline_is_the_enforcing_one() {
    let now = Instant::now();
    let (scope, a) = shadowing()
        .admit(Incoming::new().grpc_timeout(b"300m"), now)
        .unwrap();
    assert_eq!(a.would_be_deadline(), Some(now + ms(250)));
    assert!(a.would_be().is_empty());
    assert_eq!(scope.deadline(), Some(now + ms(5_000)));
    let (_, a) = shadowing()
        .admit(Incoming::new().grpc_timeout(b"9S"), now)
        .unwrap();
    assert!(a.would_be()[0].is_clamp());
    assert_eq!(a.would_be_deadline(), Some(now + ms(4_950)));
}

#[tokio::test(start_paused = true)]
async fn the_hard_cap_is_enforced_in_every_mode() {
    let ingress = Instant::now();
    advance(ms(5_000)).await;
    let err = shadowing().admit(Incoming::new(), ingress).unwrap_err();
    assert!(err.is_budget_exhausted());
    // A hostile header never buys more than the hard cap.
    let (scope, _) = shadowing()
        .admit(Incoming::new().grpc_timeout(b"99999999H"), Instant::now())
        .unwrap();
    assert_eq!(scope.remaining(), Some(ms(5_000)));
}

proptest! {
    /// The would-be decision is exactly the enforcing one: the same budget, or a refusal.
    #[test]
    fn shadow_computes_what_enforcing_decides(
        grpc in proptest::option::of((0u64..20_000, prop_oneof![Just("m"), Just("S"), Just("u")])),
        rem in proptest::option::of(0u64..20_000),
        bad in any::<bool>(),
        queued in 0u64..2_000,
        reject_over_cap in any::<bool>(),
    ) {
        paused_runtime().block_on(async {
            let incoming = || {
                let mut i = Incoming::new();
                if let Some((n, unit)) = grpc {
                    i = i.grpc_timeout(format!("{n}{unit}").as_bytes());
                }
                if let Some(r) = rem {
                    i = i.service_budget(format!("v=1, rem={r}").as_bytes());
                }
                if bad {
                    i = i.grpc_timeout(b"+1S");
                }
                i
            };
            let over = if reject_over_cap { OverCap::Reject } else { OverCap::Clamp };
            let ingress = Instant::now();
            advance(ms(queued)).await;
            let now = Instant::now();
            let enforced = enforcing().to_builder().over_cap(over).build().admit(incoming(), ingress);
            let shadowed = enforcing().to_builder().over_cap(over).mode(Mode::Shadow).build().admit(incoming(), ingress);
            let (scope, a) = shadowed.expect("the hard cap leaves 3 s at least");
            prop_assert_eq!(scope.deadline(), Some(now + ms(5_000) - ms(queued)));
            match enforced {
                Ok((s, _)) => {
                    prop_assert_eq!(a.would_be_deadline(), s.deadline());
                    prop_assert!(a.would_be().iter().all(|d| !d.is_refusal()));
                }
                Err(e) => {
                    prop_assert_eq!(a.would_be_deadline(), None);
                    prop_assert_eq!(a.would_be()[0].why(), e.to_string());
                }
            }
            Ok(())
        })?;
    }
}

#[tokio::test(start_paused = true)]
async fn the_wire_carries_the_enforced_bound_and_the_would_be_budget_beside_it() {
    let now = Instant::now();
    let (scope, _) = shadowing()
        .admit(Incoming::new().grpc_timeout(b"300m"), now)
        .unwrap();
    let call = scope.child().build().unwrap();
    let out = EgressPolicy::builder()
        .transport_pad(ms(5))
        .build()
        .outgoing(&call)
        .unwrap();
    assert_eq!(out.remaining(), Some(ms(4_995)));
    assert_eq!(out.grpc_timeout().unwrap(), "4995000u");
    let sent = out.service_budget().unwrap();
    assert_eq!(sent.remaining(), ms(4_995));
    assert_eq!(sent.would_be(), Some(ms(245)));

    // The next hop in shadow mode decides from the would-be budget; enforcing, it ignores it
    // and enforces `rem`, the upstream's enforced bound.
    let header = sent.to_header_value();
    let next = || Incoming::new().service_budget(header.as_bytes());
    let (_, a) = shadowing().admit(next(), now).unwrap();
    assert_eq!(a.would_be_deadline(), Some(now + ms(195)));
    let (s, _) = enforcing().admit(next(), now).unwrap();
    assert_eq!(s.remaining(), Some(ms(4_995 - 50)));

    // Past the would-be deadline: the call goes out (bounded by the hard cap), noted as one
    // that would not have been sent.
    advance(ms(300)).await;
    let out = EgressPolicy::new().outgoing(&call).unwrap();
    assert_eq!(
        out.service_budget().unwrap().would_be(),
        Some(Duration::ZERO)
    );
    drop(call);
    scope.close();
    let report = scope.quiesce().await;
    assert!(report.would_be()[0].is_not_sent(), "{report}");

    // Enforcing, nothing of this is written.
    let (scope, _) = enforcing().admit(Incoming::new(), now).unwrap();
    let out = EgressPolicy::new().outgoing(&scope).unwrap();
    assert_eq!(out.service_budget().unwrap().would_be(), None);
    let _ = ServiceBudget::parse(out.service_budget().unwrap().to_header_value()).unwrap();
}

/// `scope` closed and quiet: its report, and the decisions of it that `kind` says.
async fn quiet_with(
    scope: &cancel_scope::Scope,
    kind: fn(&WouldBe) -> bool,
) -> (cancel_scope::Report, Vec<WouldBe>) {
    scope.close();
    let report = scope.quiesce().await;
    let of_kind = report
        .would_be()
        .into_iter()
        .filter(|d| kind(d))
        .cloned()
        .collect();
    (report, of_kind)
}

/// A request admitted in shadow mode with a would-be budget of 100 ms (hard cap 5 s).
fn shadowed_request() -> cancel_scope::Scope {
    let policy = EndpointPolicy::builder(ms(5_000))
        .default_budget(ms(1_000))
        .mode(Mode::Shadow)
        .build();
    let (scope, _) = policy
        .admit(Incoming::new().grpc_timeout(b"100m"), Instant::now())
        .unwrap();
    scope
}

#[tokio::test(start_paused = true)]
async fn inside_the_handler_a_child_the_would_be_budget_refuses_is_made_and_recorded() {
    let scope = shadowed_request();
    advance(ms(60)).await; // 40 ms of the would-be budget left
                           // Needs 50 ms: enforcing would refuse it; shadowed, it is made with the enforced bound.
    let child = scope.child().min_useful(ms(50)).build().unwrap();
    assert_eq!(child.remaining(), Some(ms(4_940)));
    // A reserve that eats the would-be budget: refused too.
    let reserved = scope.child().reserve(ms(45)).build().unwrap();
    // One the would-be budget allows: nothing recorded.
    let fits = scope.child().min_useful(ms(10)).build().unwrap();
    drop((child, reserved, fits));
    let (report, refused) = quiet_with(&scope, WouldBe::is_child_refusal).await;
    assert_eq!(refused.len(), 2, "{report}");
    assert!(refused[0].why().contains("50ms"), "{}", refused[0]);
    assert!(
        report.to_string().contains("would have refused a child"),
        "{report}"
    );

    // Enforcing, the same child is refused.
    let enforced = EndpointPolicy::builder(ms(5_000))
        .default_budget(ms(1_000))
        .build();
    let (scope, _) = enforced
        .admit(Incoming::new().grpc_timeout(b"100m"), Instant::now())
        .unwrap();
    advance(ms(60)).await;
    assert!(scope.child().min_useful(ms(50)).build().is_err());
}

#[tokio::test(start_paused = true)]
async fn inside_the_handler_a_retry_the_would_be_budget_stops_runs_on_and_is_recorded() {
    use cancel_scope::budget::Split;
    use cancel_scope::retry::{Decision, Retry};
    use cancel_scope::ChildSpec;
    let scope = shadowed_request();
    let retry = Retry::new(|_: &()| Decision::RetryNow)
        .max_attempts(3)
        .split(Split::Greedy { cap: None })
        .min_useful(ms(30));
    // Each attempt fails after 40 ms: the second one would start with 60 ms of the would-be
    // budget left, the third with 20 ms, under the 30 ms minimum: enforcing would stop there.
    let (result, ledger) = scope
        .run(
            retry.run_with_ledger(&scope, ChildSpec::read_only("inventory"), |_| async {
                tokio::time::sleep(ms(40)).await;
                Err::<(), ()>(())
            }),
        )
        .await
        .unwrap();
    assert!(result.is_err());
    assert_eq!(ledger.started(), 3, "shadowed: every attempt ran");
    let (report, stops) = quiet_with(&scope, WouldBe::is_retry_stop).await;
    assert_eq!(stops.len(), 1, "{report}");
    assert!(stops[0].why().contains("before attempt 3"), "{}", stops[0]);
}

#[tokio::test(start_paused = true)]
async fn a_shielded_cleanup_is_judged_on_its_own_budget_in_shadow_mode() {
    let scope = shadowed_request();
    advance(ms(200)).await; // past the would-be deadline
    let shielded = scope
        .shield(ms(500), async {
            // The cleanup's own 500 ms bound its call in every mode: no would-be budget goes
            // out with it (one would tell a shadowed next hop to refuse it).
            let cleanup = cancel_scope::Scope::current();
            let call = cleanup.child().min_useful(ms(100)).build().unwrap();
            let out = EgressPolicy::new().outgoing(&call).unwrap();
            out.service_budget().unwrap().would_be()
        })
        .unwrap();
    assert_eq!(shielded.await.unwrap(), None);
    // A call of the request's own, past its would-be deadline, says it would not be sent.
    let call = scope.child().build().unwrap();
    let out = EgressPolicy::new().outgoing(&call).unwrap();
    assert_eq!(out.service_budget().unwrap().would_be(), Some(ms(0)));
}
