//! Ingress admission and egress (`wire::EndpointPolicy::admit`, `wire::EgressPolicy`), on
//! tokio's virtual clock.

use std::time::Duration;

use cancel_scope::wire::{
    service_budget, BudgetSource, EgressPolicy, EndpointPolicy, Incoming, OnBadInput,
    OperationSource, OverCap, PrioritySource, ServiceBudget, Trust,
};
use cancel_scope::{Cause, Scope};
use proptest::prelude::*;
use tokio::time::{advance, Instant};

use crate::support::time::{ms, paused_runtime};

/// max 2 s, default 1 s, reserve 50 ms.
fn policy() -> EndpointPolicy {
    EndpointPolicy::builder(ms(2000))
        .default_budget(ms(1000))
        .reserve(ms(50))
        .build()
}

#[tokio::test(start_paused = true)]
async fn no_headers_get_the_default_minus_reserve() {
    let (scope, a) = policy().admit(Incoming::new(), Instant::now()).unwrap();
    assert_eq!(scope.remaining(), Some(ms(950)));
    assert_eq!(a.initial_remaining(), ms(950));
    assert_eq!(a.declared(), None);
    assert_eq!(a.budget_source(), BudgetSource::Default);
    assert!(!a.was_clamped());
    assert_eq!(a.header_version(), None);
    assert_eq!(a.generation(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_shortest_valid_header_wins() {
    let both = Incoming::new()
        .grpc_timeout(b"700m")
        .service_budget(b"v=1, rem=600");
    let (scope, a) = policy().admit(both, Instant::now()).unwrap();
    assert_eq!(scope.remaining(), Some(ms(550)));
    assert_eq!(a.declared(), Some(ms(600)));
    assert_eq!(a.budget_source(), BudgetSource::ServiceBudget);

    let grpc_shorter = Incoming::new()
        .grpc_timeout(b"300m")
        .service_budget(b"v=1, rem=600");
    let (_, a) = policy().admit(grpc_shorter, Instant::now()).unwrap();
    assert_eq!(a.budget_source(), BudgetSource::GrpcTimeout);
    assert_eq!(a.initial_remaining(), ms(250));
}

#[tokio::test(start_paused = true)]
async fn hostile_budgets_get_at_most_the_maximum() {
    let hostile = Incoming::new()
        .grpc_timeout(b"99999999H")
        .service_budget(b"v=1, rem=86400000, prio=0, gen=7");
    let (scope, a) = policy().admit(hostile, Instant::now()).unwrap();
    assert_eq!(scope.remaining(), Some(ms(1950)));
    assert!(a.was_clamped());
    assert_eq!(a.declared(), Some(ms(86_400_000)));
    // Untrusted: no priority raise.
    assert_eq!(a.priority(), 3);
    assert_eq!(a.priority_source(), PrioritySource::Policy);
}

#[tokio::test(start_paused = true)]
async fn over_cap_can_be_rejected() {
    let p = policy().to_builder().over_cap(OverCap::Reject).build();
    let err = p
        .admit(Incoming::new().grpc_timeout(b"3S"), Instant::now())
        .unwrap_err();
    assert!(err.is_invalid());
    assert!(!err.is_budget_exhausted());
    assert_eq!(err.header(), None);
    // At the cap exactly is fine.
    assert!(p
        .admit(Incoming::new().grpc_timeout(b"2S"), Instant::now())
        .is_ok());
}

#[tokio::test(start_paused = true)]
async fn malformed_headers_are_typed_errors() {
    let cases: Vec<(Incoming, &str)> = vec![
        (Incoming::new().grpc_timeout(b"-1S"), "grpc-timeout"),
        (Incoming::new().grpc_timeout(b"1 hour"), "grpc-timeout"),
        (Incoming::new().grpc_timeout(b""), "grpc-timeout"),
        (Incoming::new().grpc_timeout(b"123456789m"), "grpc-timeout"),
        (
            Incoming::new().service_budget(b"v=2, rem=10"),
            "service-budget",
        ),
        (
            Incoming::new().service_budget(b"v=1, rem=-5"),
            "service-budget",
        ),
        (
            Incoming::new().service_budget(b"v=1, rem=1.5"),
            "service-budget",
        ),
        (
            Incoming::new().service_budget(b"v=1, rem=10, rem=99999"),
            "service-budget",
        ),
        (
            Incoming::new().service_budget(b"\xff\xfe"),
            "service-budget",
        ),
        (
            Incoming::new().grpc_timeout(b"1S").grpc_timeout(b"2S"),
            "grpc-timeout",
        ),
        (
            Incoming::new()
                .service_budget(b"v=1, rem=10")
                .service_budget(b"v=1, rem=20"),
            "service-budget",
        ),
        // A valid header does not excuse a bad one.
        (
            Incoming::new()
                .grpc_timeout(b"1S")
                .service_budget(b"garbage"),
            "service-budget",
        ),
    ];
    for (incoming, header) in cases {
        let shown = format!("{incoming:?}");
        let err = policy().admit(incoming, Instant::now()).unwrap_err();
        assert!(err.is_invalid(), "{shown}");
        assert_eq!(err.header(), Some(header), "{shown}");
        assert!(!err.to_string().is_empty());
    }
}

#[tokio::test(start_paused = true)]
async fn fallback_replaces_bad_input_with_a_smaller_local_default() {
    let p = policy()
        .to_builder()
        .on_bad_input(OnBadInput::Fallback(ms(300)))
        .build();
    let (scope, a) = p
        .admit(Incoming::new().grpc_timeout(b"forever"), Instant::now())
        .unwrap();
    assert_eq!(scope.remaining(), Some(ms(250)));
    assert_eq!(a.budget_source(), BudgetSource::Fallback);

    // A valid header that is shorter still wins.
    let mixed = Incoming::new()
        .grpc_timeout(b"100m")
        .service_budget(b"v=9, rem=5000");
    let (_, a) = p.admit(mixed, Instant::now()).unwrap();
    assert_eq!(a.initial_remaining(), ms(50));
    assert_eq!(a.budget_source(), BudgetSource::GrpcTimeout);

    // A valid header that is longer does not: bad input only ever shortens.
    let mixed = Incoming::new()
        .grpc_timeout(b"2S")
        .service_budget(b"v=1, rem=x");
    let (_, a) = p.admit(mixed, Instant::now()).unwrap();
    assert_eq!(a.initial_remaining(), ms(250));

    // The fallback is never more than the default.
    let generous = policy()
        .to_builder()
        .on_bad_input(OnBadInput::Fallback(ms(60_000)))
        .build();
    let (_, a) = generous
        .admit(Incoming::new().grpc_timeout(b"?"), Instant::now())
        .unwrap();
    assert_eq!(a.initial_remaining(), ms(950));
}

#[tokio::test(start_paused = true)]
async fn queueing_counts_against_the_budget() {
    // The design notes' request: 1000 ms, 60 ms queued, 90 ms in the handler, 100 ms kept
    // for the response: 750 ms for the dependency.
    let p = EndpointPolicy::builder(ms(2000))
        .default_budget(ms(1000))
        .build();
    let ingress = Instant::now();
    advance(ms(60)).await;
    let (request, a) = p
        .admit(Incoming::new().grpc_timeout(b"1S"), ingress)
        .unwrap();
    assert_eq!(a.queued(), ms(60));
    assert_eq!(request.remaining(), Some(ms(940)));
    advance(ms(90)).await;
    let egress = EgressPolicy::builder().reserve(ms(100)).build();
    let call = egress.call_scope(&request).unwrap();
    assert_eq!(call.remaining(), Some(ms(750)));
    assert_eq!(egress.outgoing(&call).unwrap().remaining(), Some(ms(750)));
}

#[tokio::test(start_paused = true)]
async fn too_little_budget_on_arrival_is_refused() {
    let p = policy().to_builder().min_useful(ms(100)).build();
    let err = p
        .admit(Incoming::new().grpc_timeout(b"140m"), Instant::now())
        .unwrap_err();
    assert!(err.is_budget_exhausted());
    assert_eq!(err.budget().unwrap().available(), ms(90));
    assert_eq!(err.budget().unwrap().needed(), ms(100));

    // Queued past the whole budget: zero left, refused even without a minimum.
    let ingress = Instant::now();
    advance(ms(500)).await;
    let err = policy()
        .admit(Incoming::new().grpc_timeout(b"400m"), ingress)
        .unwrap_err();
    assert!(err.is_budget_exhausted());
    // A zero grpc-timeout is a budget that is already spent.
    assert!(policy()
        .admit(Incoming::new().grpc_timeout(b"0n"), Instant::now())
        .unwrap_err()
        .is_budget_exhausted());
}

#[tokio::test(start_paused = true)]
async fn envoy_is_read_only_from_trusted_callers() {
    let envoy = || Incoming::new().envoy_expected_timeout(b"400");
    let (_, a) = policy().admit(envoy(), Instant::now()).unwrap();
    assert_eq!(a.budget_source(), BudgetSource::Default);
    // Untrusted: even garbage in it is ignored, as if absent.
    let garbage = || Incoming::new().envoy_expected_timeout(b"soon");
    assert!(policy().admit(garbage(), Instant::now()).is_ok());

    let trusted = policy().to_builder().trust(Trust::Trusted).build();
    let (_, a) = trusted.admit(envoy(), Instant::now()).unwrap();
    assert_eq!(a.budget_source(), BudgetSource::Envoy);
    assert_eq!(a.initial_remaining(), ms(350));
    let err = trusted.admit(garbage(), Instant::now()).unwrap_err();
    assert_eq!(err.header(), Some("x-envoy-expected-rq-timeout-ms"));
    // Trusted or not, it cannot extend the budget either.
    let huge = Incoming::new().envoy_expected_timeout(b"9999999999");
    let (_, a) = trusted.admit(huge, Instant::now()).unwrap();
    assert_eq!(a.initial_remaining(), ms(1950));
}

#[tokio::test(start_paused = true)]
async fn untrusted_callers_cannot_raise_priority_but_may_lower_it() {
    let p = policy().to_builder().priority(3).build();
    let ask = |prio: &str| {
        let header = format!("v=1, rem=500, prio={prio}");
        let (_, a) = p
            .admit(
                Incoming::new().service_budget(header.as_bytes()),
                Instant::now(),
            )
            .unwrap();
        (a.priority(), a.priority_source())
    };
    assert_eq!(ask("0"), (3, PrioritySource::Policy));
    assert_eq!(ask("3"), (3, PrioritySource::Policy));
    assert_eq!(ask("6"), (6, PrioritySource::Caller));

    let trusted = p.to_builder().trust(Trust::Trusted).build();
    let (_, a) = trusted
        .admit(
            Incoming::new().service_budget(b"v=1, rem=500, prio=0"),
            Instant::now(),
        )
        .unwrap();
    assert_eq!(
        (a.priority(), a.priority_source()),
        (0, PrioritySource::Caller)
    );
}

#[tokio::test(start_paused = true)]
async fn operation_ids_come_from_trusted_callers_only() {
    let incoming = || Incoming::new().service_budget(b"v=1, rem=500, op=\"checkout-7\", gen=4");
    let (scope, a) = policy().admit(incoming(), Instant::now()).unwrap();
    assert_eq!(a.caller_operation_id(), Some("checkout-7"));
    assert_ne!(a.operation_id(), "checkout-7");
    assert_eq!(scope.name(), Some(a.operation_id()));
    assert_eq!(a.operation_source(), OperationSource::Local);
    // A fresh local operation starts from generation 0: the caller's `gen` is kept for audit,
    // never used (and so never forwarded).
    assert_eq!(a.generation(), 0);
    assert_eq!(scope.operation().unwrap().generation(), 0);
    assert_eq!(a.caller_budget().unwrap().generation(), 4);
    assert_eq!(a.header_version(), Some(1));

    let (scope, a) = policy()
        .to_builder()
        .trust(Trust::Trusted)
        .build()
        .admit(incoming(), Instant::now())
        .unwrap();
    assert_eq!(a.operation_id(), "checkout-7");
    assert_eq!(scope.operation().unwrap().id(), "checkout-7");
    assert_eq!(a.generation(), 4);
    assert_eq!(a.operation_source(), OperationSource::Caller);

    // A trusted caller's `gen` without an `op` belongs to no operation of ours: a fresh one.
    let (_, a) = policy()
        .to_builder()
        .trust(Trust::Trusted)
        .build()
        .admit(
            Incoming::new().service_budget(b"v=1, rem=500, gen=4"),
            Instant::now(),
        )
        .unwrap();
    assert_eq!(
        (a.operation_source(), a.generation()),
        (OperationSource::Local, 0)
    );

    // Fresh ids differ.
    let (_, a1) = policy().admit(Incoming::new(), Instant::now()).unwrap();
    let (_, a2) = policy().admit(Incoming::new(), Instant::now()).unwrap();
    assert_ne!(a1.operation_id(), a2.operation_id());
}

/// The settings of trust are separate decisions: an edge behind Envoy reads Envoy's timeout
/// and still gives its clients neither their priority nor their operation; each of the others
/// can be turned on alone; a setting after a preset changes that setting only.
#[tokio::test(start_paused = true)]
async fn trust_is_several_decisions() {
    let hostile = || {
        Incoming::new()
            .envoy_expected_timeout(b"400")
            .service_budget(b"v=1, rem=86400000, prio=0, op=victim-op, gen=9")
    };
    let admit = |p: EndpointPolicy| p.admit(hostile(), Instant::now()).unwrap().1;
    let sources = |a: &cancel_scope::wire::Admission| {
        (a.budget_source(), a.priority_source(), a.operation_source())
    };

    let edge = admit(
        policy()
            .to_builder()
            .trust(Trust::Untrusted)
            .envoy_timeout(true)
            .build(),
    );
    assert_eq!(
        sources(&edge),
        (
            BudgetSource::Envoy,
            PrioritySource::Policy,
            OperationSource::Local
        )
    );
    assert_eq!(edge.initial_remaining(), ms(350));
    assert_eq!((edge.priority(), edge.generation()), (3, 0));
    assert_ne!(edge.operation_id(), "victim-op");

    let untrusted = admit(policy());
    assert_eq!(
        sources(&untrusted),
        (
            BudgetSource::ServiceBudget,
            PrioritySource::Policy,
            OperationSource::Local
        )
    );
    assert_eq!(untrusted.initial_remaining(), ms(1950)); // clamped, Envoy's 400 ignored
    assert_eq!(untrusted.envoy_timeout(), Some(ms(400))); // but kept for audit

    let priority_only = admit(policy().to_builder().caller_priority(true).build());
    assert_eq!(
        sources(&priority_only),
        (
            BudgetSource::ServiceBudget,
            PrioritySource::Caller,
            OperationSource::Local
        )
    );
    assert_eq!(priority_only.priority(), 0);

    let operation_only = admit(policy().to_builder().caller_operation(true).build());
    assert_eq!(
        sources(&operation_only),
        (
            BudgetSource::ServiceBudget,
            PrioritySource::Policy,
            OperationSource::Caller
        )
    );
    assert_eq!(
        (operation_only.operation_id(), operation_only.generation()),
        ("victim-op", 9)
    );

    let trusted = policy().to_builder().trust(Trust::Trusted).build();
    assert_eq!(
        sources(&admit(trusted)),
        (
            BudgetSource::Envoy,
            PrioritySource::Caller,
            OperationSource::Caller
        )
    );
    let all_but_operation = admit(trusted.to_builder().caller_operation(false).build());
    assert_eq!(
        sources(&all_but_operation),
        (
            BudgetSource::Envoy,
            PrioritySource::Caller,
            OperationSource::Local
        )
    );
    assert!(trusted.shows_error_detail() && !policy().shows_error_detail());
}

/// A `service-budget` header on two lines is ambiguous: under a falling-back policy its
/// shortest line still shortens the budget, but none of its claims counts, however trusted
/// the caller (a smuggled second line must not pick the priority or the operation).
#[tokio::test(start_paused = true)]
async fn the_claims_of_a_repeated_service_budget_count_for_nothing() {
    let p = policy()
        .to_builder()
        .trust(Trust::Trusted)
        .on_bad_input(OnBadInput::Fallback(ms(800)))
        .build();
    let twice = Incoming::new()
        .service_budget(b"v=1, rem=500, prio=5, op=first, gen=1")
        .service_budget(b"v=1, rem=900, prio=0, op=victim-op, gen=9");
    let (_, a) = p.admit(twice, Instant::now()).unwrap();
    assert_eq!(a.initial_remaining(), ms(450));
    assert_eq!(
        (a.priority_source(), a.operation_source()),
        (PrioritySource::Policy, OperationSource::Local)
    );
    assert_eq!((a.priority(), a.generation()), (3, 0));
    assert!(a.caller_budget().is_none());
    assert_eq!(a.header_version(), None);

    // A malformed second line likewise.
    let bad_second = Incoming::new()
        .service_budget(b"v=1, rem=500, op=first")
        .service_budget(b"(((");
    let (_, a) = p.admit(bad_second, Instant::now()).unwrap();
    assert_eq!(a.operation_source(), OperationSource::Local);
}

/// Every refusal has one fixed text per kind, with no numbers or header values; the `Display`
/// text starts with it and adds the detail.
#[tokio::test(start_paused = true)]
async fn refusals_have_one_fixed_text_per_kind() {
    let refused = |p: EndpointPolicy, incoming: Incoming| {
        p.admit(incoming, Instant::now()).map(|_| ()).unwrap_err()
    };
    let cases = [
        (
            refused(policy(), Incoming::new().grpc_timeout(b"-1S")),
            "invalid budget header",
        ),
        (
            refused(
                policy(),
                Incoming::new().service_budget(b"v=1, rem=10, rem=99999"),
            ),
            "invalid budget header",
        ),
        (
            refused(
                policy(),
                Incoming::new().grpc_timeout(b"1S").grpc_timeout(b"2S"),
            ),
            "invalid budget header",
        ),
        (
            refused(
                policy().to_builder().envoy_timeout(true).build(),
                Incoming::new().envoy_expected_timeout(b"soon"),
            ),
            "invalid budget header",
        ),
        (
            refused(
                policy().to_builder().over_cap(OverCap::Reject).build(),
                Incoming::new().service_budget(b"v=1, rem=86400000"),
            ),
            "budget exceeds the endpoint's maximum",
        ),
        (
            refused(
                policy().to_builder().min_useful(ms(100)).build(),
                Incoming::new().grpc_timeout(b"120m"),
            ),
            "budget exhausted",
        ),
    ];
    for (err, text) in cases {
        assert_eq!(err.public_message(), text, "{err}");
        assert!(!err.public_message().contains(|c: char| c.is_ascii_digit()));
        let detail = err.to_string();
        assert!(detail.starts_with(text), "{detail}");
        assert!(detail.len() > text.len(), "{detail}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_root_scope_ends_at_the_admitted_deadline() {
    let p = policy().to_builder().version(9).build();
    let (scope, a) = p
        .admit(Incoming::new().grpc_timeout(b"200m"), Instant::now())
        .unwrap();
    assert_eq!(a.policy_version(), 9);
    assert_eq!(scope.deadline(), Some(a.deadline()));
    let child = scope.child().name("db").build().unwrap();
    // Every scope of the request shares its operation.
    assert_eq!(child.operation(), Some(a.operation()));
    advance(ms(149)).await;
    assert!(!scope.is_cancelled());
    child.cancelled().await;
    assert_eq!(Instant::now() - a.admitted_at(), ms(150));
    assert_eq!(scope.cause(), Some(Cause::DeadlineExceeded));
}

#[tokio::test(start_paused = true)]
async fn egress_audit_deadline_is_the_budget_the_header_carries() {
    // 48 h left: `rem` says the most a header can carry (24 h), and so does the audit
    // deadline, not the 48 h the callee is never told.
    let call = Scope::with_timeout(Duration::from_secs(48 * 3600));
    let out = EgressPolicy::new().outgoing(&call).unwrap();
    let sent = out.service_budget().unwrap();
    assert_eq!(sent.remaining(), service_budget::MAX_REMAINING);
    let unix_ms = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
    };
    let told = unix_ms(std::time::SystemTime::now() + service_budget::MAX_REMAINING);
    let dl = sent.audit_deadline_unix_ms().unwrap();
    assert!(dl.abs_diff(told) < 60_000, "dl {dl}, told {told}");
}

#[tokio::test(start_paused = true)]
async fn egress_tells_the_callee_less_than_the_call_has() {
    let p = policy()
        .to_builder()
        .trust(Trust::Trusted)
        .transport_pad(ms(10))
        .min_useful(ms(20))
        .priority(5)
        .build();
    let incoming = Incoming::new().service_budget(b"v=1, rem=500, op=op-1, gen=2");
    let (request, _) = p.admit(incoming, Instant::now()).unwrap();
    // The endpoint's egress defaults travel with the operation.
    let egress = EgressPolicy::for_scope(&request);
    assert_eq!(egress, *p.egress());
    let call = egress.call_scope(&request).unwrap();
    assert_eq!(call.remaining(), Some(ms(450)));
    let out = egress.outgoing(&call).unwrap();
    assert_eq!(out.remaining(), Some(ms(440)));
    assert_eq!(out.grpc_timeout().as_deref(), Some("440000u"));
    let sent = out.service_budget().unwrap();
    let header = sent.to_header_value();
    let parsed = ServiceBudget::parse(&header).unwrap();
    assert_eq!(parsed.remaining(), ms(440));
    assert_eq!(parsed.operation_id(), Some("op-1"));
    assert_eq!(parsed.priority(), Some(5));
    assert_eq!(parsed.generation(), 2);
    assert!(parsed.audit_deadline_unix_ms().is_some());

    // Below the minimum useful budget after the pad: fail fast.
    advance(ms(421)).await; // 29 ms left, 19 ms after the pad
    assert!(egress.outgoing(&call).unwrap_err().is_budget_exhausted());
    assert!(egress
        .call_scope(&request)
        .unwrap_err()
        .is_budget_exhausted());
}

#[tokio::test(start_paused = true)]
async fn egress_refuses_a_cancelled_call_and_passes_unbounded_scopes() {
    let call = Scope::with_timeout(ms(100));
    call.cancel_with("user left");
    let err = EgressPolicy::new().outgoing(&call).unwrap_err();
    assert!(err.is_cancelled());

    let out = EgressPolicy::builder()
        .transport_pad(ms(5))
        .build()
        .outgoing(&Scope::new())
        .unwrap();
    assert_eq!(out.remaining(), None);
    assert_eq!(out.grpc_timeout(), None);
    assert!(out.service_budget().is_none());
}

/// `service-budget` carries whole milliseconds, and a callee reads `rem=0` as a budget that is
/// already spent: a call with less than 1 ms left after the pad is refused before anything is
/// sent, as one with nothing left is, instead of being sent to a callee bound to refuse it.
#[tokio::test(start_paused = true)]
async fn egress_refuses_a_call_whose_budget_header_would_say_zero() {
    let callee = EndpointPolicy::builder(ms(1000)).build();
    let admitted = |out: &cancel_scope::wire::Outgoing| {
        let incoming = Incoming::new()
            .grpc_timeout(out.grpc_timeout().unwrap().as_bytes())
            .service_budget(out.service_budget().unwrap().to_header_value().as_bytes());
        callee.admit(incoming, Instant::now())
    };
    for (left, pad) in [
        (Duration::from_nanos(1), Duration::ZERO),
        (Duration::from_micros(999), Duration::ZERO),
        (Duration::from_micros(10_999), ms(10)),
    ] {
        let call = Scope::with_timeout(left);
        let egress = EgressPolicy::builder().transport_pad(pad).build();
        match egress.outgoing(&call) {
            Err(err) => assert!(err.is_budget_exhausted(), "{left:?}: {err}"),
            Ok(out) => panic!(
                "{left:?} left, {pad:?} pad: sent {:?} and {:?}, which the callee refuses: {:?}",
                out.grpc_timeout(),
                out.service_budget().map(ServiceBudget::to_header_value),
                admitted(&out).map(|_| ()),
            ),
        }
    }
    // A whole millisecond after the pad is sent, and admitted.
    let call = Scope::with_timeout(ms(11));
    let out = EgressPolicy::builder()
        .transport_pad(ms(10))
        .build()
        .outgoing(&call)
        .unwrap();
    assert_eq!(out.service_budget().unwrap().remaining(), ms(1));
    assert_eq!(admitted(&out).unwrap().1.initial_remaining(), ms(1));
}

/// `EgressPolicyBuilder::rules` sets the reserve, the cap and the minimum useful budget at
/// once: a call gets the deadline the three setters give it, and is refused where they refuse.
#[tokio::test(start_paused = true)]
async fn egress_rules_give_a_call_what_the_three_setters_give() {
    use cancel_scope::budget::Rules;
    let rules = Rules::new()
        .reserve(ms(100))
        .cap(ms(300))
        .min_useful(ms(50));
    let by_rules = EgressPolicy::builder()
        .rules(rules)
        .transport_pad(ms(10))
        .build();
    let by_setters = EgressPolicy::builder()
        .reserve(ms(100))
        .cap(ms(300))
        .min_useful(ms(50))
        .transport_pad(ms(10))
        .build();
    assert_eq!(by_rules, by_setters);
    // 1000 ms: the cap; 350 ms: less the reserve; 159 ms: 59 ms, 49 ms after the pad: refused.
    for (request_ms, call) in [(1000, Some(ms(300))), (350, Some(ms(250))), (159, None)] {
        let request = Scope::with_timeout(ms(request_ms));
        for egress in [by_rules, by_setters] {
            match (egress.call_scope(&request), call) {
                (Ok(scope), Some(call)) => assert_eq!(scope.remaining(), Some(call)),
                (Err(e), None) => assert!(e.is_budget_exhausted(), "{e}"),
                (got, want) => panic!("{request_ms} ms: {got:?}, expected {want:?}"),
            }
        }
    }
}

/// The constructor and setters of the policies from before their builders still work, and
/// give the policies the builders give.
#[test]
#[allow(deprecated)]
fn the_deprecated_constructor_and_setters_give_the_builders_policies() {
    use cancel_scope::wire::{Mode, Stage};
    let old = EndpointPolicy::new(ms(2000), ms(1000))
        .reserve(ms(50))
        .transport_pad(ms(5))
        .min_useful(ms(20))
        .trust(Trust::Trusted)
        .envoy_timeout(false)
        .caller_priority(false)
        .caller_operation(true)
        .error_detail(false)
        .on_bad_input(OnBadInput::Fallback(ms(300)))
        .over_cap(OverCap::Reject)
        .version(7)
        .priority(9)
        .mode(Mode::Shadow)
        .enforce_for(Stage::Idempotent)
        .enforced_percent(40);
    let new = EndpointPolicy::builder(ms(2000))
        .default_budget(ms(1000))
        .reserve(ms(50))
        .transport_pad(ms(5))
        .min_useful(ms(20))
        .trust(Trust::Trusted)
        .envoy_timeout(false)
        .caller_priority(false)
        .caller_operation(true)
        .error_detail(false)
        .on_bad_input(OnBadInput::Fallback(ms(300)))
        .over_cap(OverCap::Reject)
        .version(7)
        .priority(9)
        .mode(Mode::Shadow)
        .enforce_for(Stage::Idempotent)
        .enforced_percent(40)
        .build();
    assert_eq!(old, new);
    assert_eq!(new.to_builder().build(), new);
    // The default is clamped to the maximum either way, and is the maximum when unset.
    assert_eq!(EndpointPolicy::new(ms(10), ms(99)).default_budget(), ms(10));
    assert_eq!(
        EndpointPolicy::builder(ms(10)).build(),
        EndpointPolicy::new(ms(10), ms(10))
    );

    let old = EgressPolicy::new()
        .reserve(ms(30))
        .cap(ms(300))
        .transport_pad(ms(5))
        .min_useful(ms(20));
    let new = EgressPolicy::builder()
        .reserve(ms(30))
        .cap(ms(300))
        .transport_pad(ms(5))
        .min_useful(ms(20))
        .build();
    assert_eq!(old, new);
    assert_eq!(new.to_builder().build(), new);
}

#[tokio::test(start_paused = true)]
async fn egress_caps_and_reserves() {
    let request = Scope::with_timeout(ms(1000));
    let capped = EgressPolicy::builder()
        .cap(ms(300))
        .reserve(ms(100))
        .build();
    assert_eq!(
        capped.call_scope(&request).unwrap().remaining(),
        Some(ms(300))
    );
    advance(ms(700)).await;
    assert_eq!(
        capped.call_scope(&request).unwrap().remaining(),
        Some(ms(200))
    );
    assert_eq!(
        capped.call_budget(request.remaining()).unwrap(),
        Some(ms(200))
    );
}

proptest! {
    /// Whatever the caller sends, and however long it queued, the handler never gets more than
    /// the policy's maximum, nor more than the shortest budget it declared, nor more than the
    /// default when it declared none.
    #[test]
    fn admission_never_exceeds_max_or_declared(
        max_ms in 0u64..100_000,
        default_ms in 0u64..100_000,
        reserve_ms in 0u64..1_000,
        queued_ms in 0u64..2_000,
        grpc in proptest::option::of((0u64..=99_999_999, 0usize..6)),
        rem in proptest::option::of(0u64..=86_400_000),
        envoy in proptest::option::of(0u64..=9_999_999_999),
        trusted in any::<bool>(),
        fallback in proptest::option::of(0u64..100_000),
        garbage in any::<bool>(),
    ) {
        paused_runtime().block_on(async move {
            let mut p = EndpointPolicy::builder(ms(max_ms))
                .default_budget(ms(default_ms))
                .reserve(ms(reserve_ms))
                .trust(if trusted { Trust::Trusted } else { Trust::Untrusted });
            if let Some(f) = fallback {
                p = p.on_bad_input(OnBadInput::Fallback(ms(f)));
            }
            let p = p.build();
            let grpc_value = grpc.map(|(v, u)| format!("{v}{}", ["n", "u", "m", "S", "M", "H"][u]));
            let rem_value = rem.map(|r| format!("v=1, rem={r}"));
            let envoy_value = envoy.map(|e| e.to_string());
            let mut incoming = Incoming::new();
            let mut declared: Vec<Duration> = vec![];
            if let Some(v) = &grpc_value {
                incoming = incoming.grpc_timeout(v.as_bytes());
                declared.push(cancel_scope::wire::grpc_timeout::decode(v).unwrap());
            }
            if let Some(v) = &rem_value {
                incoming = incoming.service_budget(v.as_bytes());
                declared.push(ms(rem.unwrap()));
            }
            if let Some(v) = &envoy_value {
                incoming = incoming.envoy_expected_timeout(v.as_bytes());
                if trusted {
                    declared.push(ms(envoy.unwrap()));
                }
            }
            if garbage {
                incoming = incoming.grpc_timeout(b"oops"); // bad, or repeated
            }
            let ingress = Instant::now();
            advance(ms(queued_ms)).await;
            match p.admit(incoming, ingress) {
                Ok((scope, a)) => {
                    let got = a.initial_remaining();
                    assert_eq!(scope.remaining(), Some(got));
                    assert!(got <= ms(max_ms), "{got:?} > max");
                    assert!(got <= p.default_budget() || !declared.is_empty(), "{got:?} > default");
                    if let Some(&shortest) = declared.iter().min() {
                        assert!(got <= shortest, "{got:?} > declared {shortest:?}");
                    }
                    assert!(got <= ms(max_ms).saturating_sub(ms(queued_ms)));
                    assert!(!got.is_zero());
                    assert!(!garbage || fallback.is_some());
                }
                Err(e) => {
                    if e.is_invalid() {
                        assert!(garbage && fallback.is_none());
                    }
                }
            }
        });
    }

    /// The callee is never told more than the call has left, nor more than the caller has.
    #[test]
    fn egress_never_exceeds_local_remaining(
        remaining_ms in 0u64..10_000_000,
        reserve_ms in 0u64..1_000,
        cap_ms in proptest::option::of(0u64..100_000),
        pad_ms in 0u64..1_000,
        min_ms in 0u64..1_000,
        elapsed_ms in 0u64..1_000,
    ) {
        paused_runtime().block_on(async move {
            let request = Scope::with_timeout(ms(remaining_ms));
            let mut egress = EgressPolicy::builder()
                .reserve(ms(reserve_ms))
                .transport_pad(ms(pad_ms))
                .min_useful(ms(min_ms));
            if let Some(c) = cap_ms {
                egress = egress.cap(ms(c));
            }
            let egress = egress.build();
            let Ok(call) = egress.call_scope(&request) else { return };
            assert!(call.deadline() <= request.deadline());
            advance(ms(elapsed_ms)).await;
            if let Ok(out) = egress.outgoing(&call) {
                let told = out.remaining().unwrap();
                let local = call.remaining().unwrap();
                assert!(told <= local.saturating_sub(ms(pad_ms)), "{told:?} vs {local:?}");
                assert!(told <= request.remaining().unwrap());
                assert!(told >= ms(min_ms) && !told.is_zero());
                let wire = out.service_budget().unwrap().remaining();
                assert!(wire <= told);
                let grpc = cancel_scope::wire::grpc_timeout::decode(&out.grpc_timeout().unwrap()).unwrap();
                assert!(grpc <= told);
            }
        });
    }
}

/// Admission of real header maps, through the scan the tower layer makes
/// (`Incoming::take_from`): disagreeing, repeated, malformed and hostile lines of all three
/// budget headers, under every combination of the trust settings. A model written here from
/// the documented rules gives what each value must be (budget, refusal, priority, operation
/// id, generation, and which source decided each).
#[cfg(feature = "tower")]
mod header_maps {
    use super::*;
    use http::{HeaderMap, HeaderName, HeaderValue};

    /// A `service-budget` line's claims, as the model reads them.
    #[derive(Clone, Debug)]
    struct Claims {
        rem: Duration,
        prio: Option<u8>,
        op: Option<&'static str>,
        gen: u64,
    }

    /// One header line: its bytes and, if it is valid, what it says.
    #[derive(Clone, Debug)]
    enum Line {
        Grpc(Vec<u8>, Option<Duration>),
        Budget(Vec<u8>, Option<Claims>),
        Envoy(Vec<u8>, Option<Duration>),
    }

    /// One of `values`, each invalid for its header, as a line made by `line`.
    fn malformed(
        values: Vec<&'static [u8]>,
        line: fn(Vec<u8>) -> Line,
    ) -> impl Strategy<Value = Line> {
        prop::sample::select(values).prop_map(move |b| line(b.to_vec()))
    }

    fn grpc_line() -> impl Strategy<Value = Line> {
        type Unit = (&'static str, fn(u64) -> Duration);
        let units: [Unit; 6] = [
            ("n", Duration::from_nanos),
            ("u", Duration::from_micros),
            ("m", Duration::from_millis),
            ("S", Duration::from_secs),
            ("M", |v| Duration::from_secs(v * 60)),
            ("H", |v| Duration::from_secs(v * 3600)),
        ];
        let valid = (0u64..=99_999_999, 0usize..6).prop_map(move |(v, u)| {
            let (unit, of) = units[u];
            Line::Grpc(format!("{v}{unit}").into_bytes(), Some(of(v)))
        });
        let hostile = Just(Line::Grpc(
            b"99999999H".to_vec(),
            Some(Duration::from_secs(99_999_999 * 3600)),
        ));
        let malformed = malformed(
            vec![
                b"-1S",
                b"+5S",
                b" 5S",
                b"1 hour",
                b"",
                b"123456789m",
                b"1s",
                b"5",
                b"S",
                b"0x10S",
                b"\xff5S",
            ],
            |b| Line::Grpc(b, None),
        );
        prop_oneof![4 => valid, 1 => hostile, 2 => malformed]
    }

    fn budget_line() -> impl Strategy<Value = Line> {
        let ops = prop::sample::select(vec!["checkout-7", "victim-op", "a b"]);
        let valid = (
            0u64..=86_400_000,
            proptest::option::of(0u8..=7),
            proptest::option::of(ops),
            proptest::option::of(0u64..1_000),
        )
            .prop_map(|(rem, prio, op, gen)| {
                let mut v = format!("v=1, rem={rem}");
                if let Some(p) = prio {
                    v.push_str(&format!(", prio={p}"));
                }
                if let Some(o) = op {
                    v.push_str(&format!(", op=\"{o}\""));
                }
                if let Some(g) = gen {
                    v.push_str(&format!(", gen={g}"));
                }
                let claims = Claims {
                    rem: ms(rem),
                    prio,
                    op,
                    gen: gen.unwrap_or(0),
                };
                Line::Budget(v.into_bytes(), Some(claims))
            });
        let hostile = Just(Line::Budget(
            b"v=1, rem=86400000, prio=0, op=\"victim-op\", gen=999999999999999".to_vec(),
            Some(Claims {
                rem: ms(86_400_000),
                prio: Some(0),
                op: Some("victim-op"),
                gen: 999_999_999_999_999,
            }),
        ));
        let malformed = malformed(
            vec![
                b"v=2, rem=10",
                b"v=1, rem=-1",
                b"v=1, rem=86400001",
                b"v=1, rem=10, rem=99999",
                b"v=1, rem=1.5",
                b"v=1, rem=10, prio=9",
                b"v=1, rem=10, op=\"\"",
                b"v=1",
                b"(((",
                b"",
                b"\xff\xfe",
            ],
            |b| Line::Budget(b, None),
        );
        prop_oneof![4 => valid, 1 => hostile, 2 => malformed]
    }

    fn envoy_line() -> impl Strategy<Value = Line> {
        let valid = (0u64..=9_999_999_999)
            .prop_map(|v| Line::Envoy(v.to_string().into_bytes(), Some(ms(v))));
        let malformed = malformed(vec![b"-5", b"soon", b"", b"1.5", b"99999999999"], |b| {
            Line::Envoy(b, None)
        });
        prop_oneof![3 => valid, 1 => malformed]
    }

    /// 0 to 3 lines of each header, interleaved in a random order.
    fn lines() -> impl Strategy<Value = Vec<Line>> {
        (
            prop::collection::vec(grpc_line(), 0..=3),
            prop::collection::vec(budget_line(), 0..=3),
            prop::collection::vec(envoy_line(), 0..=3),
        )
            .prop_flat_map(|(a, b, c)| {
                let all: Vec<Line> = a.into_iter().chain(b).chain(c).collect();
                Just(all).prop_shuffle()
            })
    }

    /// The lines of one header as the model reads them: how many, any bad one, the shortest
    /// valid value.
    #[derive(Default)]
    struct Header {
        lines: usize,
        bad: bool,
        shortest: Option<Duration>,
    }

    impl Header {
        fn add(&mut self, value: Option<Duration>) {
            self.lines += 1;
            match value {
                Some(d) => self.shortest = Some(self.shortest.map_or(d, |s| s.min(d))),
                None => self.bad = true,
            }
        }

        /// Bad input: a malformed line, or more than one line.
        fn is_bad(&self) -> bool {
            self.bad || self.lines > 1
        }
    }

    /// Header names as a client may spell them (HTTP names are case-insensitive).
    fn name(lower: &'static str, shout: bool) -> HeaderName {
        if shout {
            HeaderName::from_bytes(lower.to_ascii_uppercase().as_bytes()).unwrap()
        } else {
            HeaderName::from_static(lower)
        }
    }

    proptest! {
        #[test]
        fn admission_of_hostile_header_maps_follows_the_policy(
            lines in lines(),
            shout in any::<bool>(),
            max_ms in 1u64..100_000,
            default_ms in 1u64..100_000,
            reserve_ms in 0u64..1_000,
            policy_priority in 0u8..=7,
            fallback in proptest::option::of(0u64..100_000),
            reject_over_cap in any::<bool>(),
        ) {
            let mut map = HeaderMap::new();
            map.insert("x-request-id", HeaderValue::from_static("7"));
            let mut grpc = Header::default();
            let mut budget = Header::default();
            let mut envoy = Header::default();
            let mut budget_lines = vec![];
            for line in &lines {
                let (header, bytes) = match line {
                    Line::Grpc(b, v) => {
                        grpc.add(*v);
                        ("grpc-timeout", b)
                    }
                    Line::Budget(b, c) => {
                        budget.add(c.as_ref().map(|c| c.rem));
                        budget_lines.push(c.clone());
                        ("service-budget", b)
                    }
                    Line::Envoy(b, v) => {
                        envoy.add(*v);
                        ("x-envoy-expected-rq-timeout-ms", b)
                    }
                };
                map.append(name(header, shout), HeaderValue::from_bytes(bytes).unwrap());
            }
            // The claims count only from one valid line.
            let claims = match budget_lines.as_slice() {
                [Some(c)] => Some(c.clone()),
                _ => None,
            };
            // Entered, not run: the paused clock stands still for the whole case.
            let runtime = paused_runtime();
            let _entered = runtime.enter();
            for settings in 0u8..8 {
                let (read_envoy, accept_prio, accept_op) =
                    (settings & 1 != 0, settings & 2 != 0, settings & 4 != 0);
                let mut p = EndpointPolicy::builder(ms(max_ms))
                    .default_budget(ms(default_ms))
                    .reserve(ms(reserve_ms))
                    .priority(policy_priority)
                    .envoy_timeout(read_envoy)
                    .caller_priority(accept_prio)
                    .caller_operation(accept_op);
                if let Some(f) = fallback {
                    p = p.on_bad_input(OnBadInput::Fallback(ms(f)));
                }
                if reject_over_cap {
                    p = p.over_cap(OverCap::Reject);
                }
                let p = p.build();
                let mut headers = map.clone();
                let incoming = Incoming::take_from(&mut headers);
                // The handler would see none of them, and everything else.
                prop_assert!(!headers.contains_key("grpc-timeout"));
                prop_assert!(!headers.contains_key("service-budget"));
                prop_assert!(!headers.contains_key("x-envoy-expected-rq-timeout-ms"));
                prop_assert_eq!(headers.len(), 1);
                let admitted = p.admit(incoming, Instant::now());

                // The model.
                let read: Vec<&Header> = [Some(&budget), Some(&grpc), read_envoy.then_some(&envoy)]
                    .into_iter()
                    .flatten()
                    .collect();
                let bad = read.iter().any(|h| h.is_bad());
                let mut declared = read.iter().filter_map(|h| h.shortest).min();
                if bad {
                    let Some(f) = fallback else {
                        let err = admitted.map(|_| ()).unwrap_err();
                        prop_assert!(err.is_invalid() && !err.is_over_cap(), "{}", err);
                        prop_assert_eq!(err.public_message(), "invalid budget header");
                        continue;
                    };
                    let f = ms(f).min(p.default_budget());
                    declared = Some(declared.map_or(f, |d| d.min(f)));
                }
                if reject_over_cap && declared.is_some_and(|d| d > ms(max_ms)) {
                    let err = admitted.map(|_| ()).unwrap_err();
                    prop_assert!(err.is_over_cap(), "{}", err);
                    continue;
                }
                let expected = declared
                    .unwrap_or(p.default_budget())
                    .min(ms(max_ms))
                    .saturating_sub(ms(reserve_ms));
                if expected.is_zero() {
                    let err = admitted.map(|_| ()).unwrap_err();
                    prop_assert!(err.is_budget_exhausted(), "{}", err);
                    continue;
                }
                let (scope, a) = match admitted {
                    Ok(ok) => ok,
                    Err(e) => return Err(TestCaseError::fail(format!("refused: {e}"))),
                };
                prop_assert_eq!(a.initial_remaining(), expected);
                prop_assert_eq!(scope.remaining(), Some(expected));
                prop_assert_eq!(a.declared(), declared);
                prop_assert!(a.budget_source() != BudgetSource::Envoy || read_envoy);
                // Values kept for audit, read or not.
                prop_assert_eq!(a.grpc_timeout(), grpc.shortest);
                prop_assert_eq!(a.envoy_timeout(), envoy.shortest);
                prop_assert_eq!(a.caller_budget().is_some(), claims.is_some());

                // Priority: the caller's if accepted, or if it asks for less urgency.
                let asked = claims.as_ref().and_then(|c| c.prio);
                let (priority, priority_source) = match asked {
                    Some(prio) if accept_prio || prio > policy_priority => {
                        (prio, PrioritySource::Caller)
                    }
                    _ => (policy_priority, PrioritySource::Policy),
                };
                prop_assert_eq!(a.priority(), priority);
                prop_assert_eq!(a.priority_source(), priority_source);
                prop_assert_eq!(scope.operation().unwrap().priority(), priority);

                // Operation: the caller's id and gen only if accepted and it sent an id.
                let theirs = claims
                    .as_ref()
                    .filter(|_| accept_op)
                    .and_then(|c| Some((c.op?, c.gen)));
                match theirs {
                    Some((id, gen)) => {
                        prop_assert_eq!(a.operation_id(), id);
                        prop_assert_eq!(a.generation(), gen);
                        prop_assert_eq!(a.operation_source(), OperationSource::Caller);
                    }
                    None => {
                        prop_assert_eq!(a.operation_id().len(), 32);
                        prop_assert!(a.operation_id().bytes().all(|b| b.is_ascii_hexdigit()));
                        prop_assert_eq!(a.generation(), 0);
                        prop_assert_eq!(a.operation_source(), OperationSource::Local);
                    }
                }
                let op = scope.operation().unwrap();
                prop_assert_eq!(op.id(), a.operation_id());
                prop_assert_eq!(op.generation(), a.generation());
            }
        }
    }
}
