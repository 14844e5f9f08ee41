//! Policy versions (`wire::PolicyHandle`, feature `rollout`): set, rollback, the version a
//! request is admitted under and what it names downstream, on tokio's virtual clock.

use cancel_scope::wire::{
    service_budget::ServiceBudget, EgressPolicy, EndpointPolicy, Incoming, PolicyHandle, Trust,
    MAX_CAP,
};
use cancel_scope::Scope;
use proptest::prelude::*;
use tokio::time::Instant;

use crate::support::time::{ms, paused_runtime, secs};

/// A policy of version `v` with maximum `max_ms` and a default of half of it.
fn policy(v: u32, max_ms: u64) -> EndpointPolicy {
    EndpointPolicy::builder(ms(max_ms))
        .default_budget(ms(max_ms / 2))
        .version(v)
        .build()
}

/// A caller's `service-budget` that names policy version `pv`, with `rem_ms` left.
fn naming(pv: u32, rem_ms: u64) -> Incoming {
    Incoming::new().service_budget(format!("v=1, rem={rem_ms}, op=op-1, pv={pv}").as_bytes())
}

#[test]
fn no_version_removes_the_deadline() {
    let unbounded = EndpointPolicy::builder(secs(86_401))
        .default_budget(secs(1))
        .version(2)
        .build();
    assert!(PolicyHandle::new(unbounded).unwrap_err().is_unbounded());
    let h = PolicyHandle::new(policy(1, 2000)).unwrap();
    let err = h.set(unbounded).unwrap_err();
    assert!(err.is_unbounded(), "{err}");
    assert!(h
        .set(
            EndpointPolicy::builder(std::time::Duration::MAX)
                .default_budget(secs(1))
                .version(3)
                .build()
        )
        .unwrap_err()
        .is_unbounded());
    // The 24 h limit itself is a deadline.
    h.set(
        EndpointPolicy::builder(MAX_CAP)
            .default_budget(secs(1))
            .version(4)
            .build(),
    )
    .unwrap();
    assert_eq!(h.versions(), [4, 1]);
}

#[test]
fn versions_only_go_forward() {
    let h = PolicyHandle::new(policy(3, 2000)).unwrap();
    assert!(h.set(policy(3, 1000)).unwrap_err().is_stale_version());
    assert!(h.set(policy(2, 1000)).unwrap_err().is_stale_version());
    h.set(policy(4, 1000)).unwrap();
    h.rollback().unwrap();
    // The number rolled back from names rules nobody holds any more: not reused.
    assert!(h.set(policy(4, 1000)).unwrap_err().is_stale_version());
    h.set(policy(5, 1000)).unwrap();
    assert_eq!(h.versions(), [5, 3]);
}

#[test]
fn a_rollback_with_nothing_before_fails_and_changes_nothing() {
    let h = PolicyHandle::new(policy(1, 2000)).unwrap();
    assert!(h.rollback().unwrap_err().is_no_previous());
    assert_eq!(h.current(), policy(1, 2000));
}

#[test]
fn the_handle_keeps_the_eight_newest_earlier_versions() {
    let h = PolicyHandle::new(policy(1, 2000)).unwrap();
    for v in 2..=12 {
        h.set(policy(v, 2000)).unwrap();
    }
    assert_eq!(h.versions(), [12, 11, 10, 9, 8, 7, 6, 5, 4]);
}

#[tokio::test(start_paused = true)]
async fn a_rollback_keeps_the_previous_rules_within_the_smaller_cap() {
    let wide = EndpointPolicy::builder(secs(10))
        .default_budget(secs(8))
        .reserve(ms(40))
        .version(1)
        .build();
    let h = PolicyHandle::new(wide).unwrap();
    h.set(
        EndpointPolicy::builder(secs(3))
            .default_budget(secs(1))
            .version(2)
            .build(),
    )
    .unwrap();
    let back = h.rollback().unwrap();
    assert_eq!(back.policy_version(), 1);
    assert_eq!(back.max_budget(), secs(3));
    assert_eq!(back.default_budget(), secs(3));
    assert_eq!(back.reserve_budget(), ms(40));

    // A hostile caller after the rollback gets version 1's rules within version 2's cap.
    let hostile = Incoming::new().grpc_timeout(b"99999999H");
    let (scope, a) = h.admit(hostile, Instant::now()).unwrap();
    assert_eq!(a.policy_version(), 1);
    assert_eq!(scope.remaining(), Some(secs(3) - ms(40)));
}

proptest! {
    /// Any sequence of sets and rollbacks: a rollback's cap is at most both versions' caps,
    /// the current cap is never over `MAX_CAP`, and no request, whatever it declares, gets more
    /// than the current cap.
    #[test]
    fn a_rollback_never_yields_an_unbounded_budget_or_a_larger_cap(
        steps in proptest::collection::vec(proptest::option::of(1u64..200_000_000), 1..40),
        declared_ms in proptest::option::of(0u64..=99_999_999),
    ) {
        paused_runtime().block_on(async {
            let h = PolicyHandle::new(policy(1, 5_000)).unwrap();
            let mut next = 2;
            for step in steps {
                let before = h.current();
                match step {
                    Some(max_ms) => {
                        let set = h.set(policy(next, max_ms));
                        next += 1;
                        prop_assert_eq!(set.is_err(), ms(max_ms) > MAX_CAP);
                    }
                    None => {
                        if let Ok(back) = h.rollback() {
                            prop_assert!(back.max_budget() <= before.max_budget());
                        }
                    }
                }
                let now = h.current();
                prop_assert!(now.max_budget() <= MAX_CAP);
                let incoming = match declared_ms {
                    Some(d) => Incoming::new().grpc_timeout(format!("{d}m").as_bytes()),
                    None => Incoming::new(),
                };
                if let Ok((scope, a)) = h.admit(incoming, Instant::now()) {
                    prop_assert_eq!(a.policy_version(), now.policy_version());
                    prop_assert!(scope.remaining().unwrap() <= now.max_budget());
                }
            }
            Ok(())
        })?;
    }
}

#[tokio::test(start_paused = true)]
async fn a_trusted_caller_naming_a_held_version_is_admitted_under_it_within_the_current_cap() {
    let trusted = |v, max_ms| policy(v, max_ms).to_builder().trust(Trust::Trusted).build();
    let h = PolicyHandle::new(trusted(1, 9_000)).unwrap();
    h.set(trusted(2, 4_000)).unwrap();

    let (scope, a) = h.admit(naming(1, 60_000), Instant::now()).unwrap();
    assert_eq!(
        (a.policy_version(), a.caller_policy_version()),
        (1, Some(1))
    );
    // Version 1 would grant 9 s; the current version's cap is 4 s.
    assert_eq!(scope.remaining(), Some(secs(4)));

    // A version the handle does not hold: its own current version.
    let (_, a) = h.admit(naming(7, 60_000), Instant::now()).unwrap();
    assert_eq!(
        (a.policy_version(), a.caller_policy_version()),
        (2, Some(7))
    );

    // After a rollback, the version rolled back from is unknown here.
    h.rollback().unwrap();
    let (_, a) = h.admit(naming(2, 60_000), Instant::now()).unwrap();
    assert_eq!(a.policy_version(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_untrusted_caller_never_picks_the_version() {
    let h = PolicyHandle::new(policy(1, 9_000)).unwrap();
    h.set(policy(2, 4_000)).unwrap();
    let (_, a) = h.admit(naming(1, 60_000), Instant::now()).unwrap();
    assert_eq!(
        (a.policy_version(), a.caller_policy_version()),
        (2, Some(1))
    );
    // A repeated header's claims never count.
    let smuggled = Incoming::new()
        .service_budget(b"v=1, rem=100, pv=1")
        .service_budget(b"v=1, rem=100, pv=1");
    let trusted =
        PolicyHandle::new(policy(1, 9_000).to_builder().trust(Trust::Trusted).build()).unwrap();
    trusted
        .set(policy(2, 4_000).to_builder().trust(Trust::Trusted).build())
        .unwrap();
    assert_eq!(trusted.policy_for(&smuggled).policy_version(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_malformed_policy_version_is_bad_input() {
    let h = PolicyHandle::new(policy(1, 2_000)).unwrap();
    for bad in ["pv=-1", "pv=4294967296", "pv=1.5", "pv=\"2\"", "pv=1, pv=2"] {
        let incoming = Incoming::new().service_budget(format!("v=1, rem=100, {bad}").as_bytes());
        let err = h.admit(incoming, Instant::now()).unwrap_err();
        assert!(err.is_invalid(), "{bad}: {err}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_admitting_version_is_in_the_report_and_on_the_wire() {
    let h = PolicyHandle::new(policy(6, 2_000)).unwrap();
    let (scope, a) = h.admit(Incoming::new(), Instant::now()).unwrap();
    h.set(policy(7, 2_000)).unwrap();
    assert_eq!(a.policy_version(), 6);
    let call = scope.child().build().unwrap();
    let out = EgressPolicy::new().outgoing(&call).unwrap();
    let sent = ServiceBudget::parse(out.service_budget().unwrap().to_header_value()).unwrap();
    assert_eq!(sent.policy_version(), Some(6));
    drop(call);
    scope.close();
    assert_eq!(scope.quiesce().await.policy_version(), Some(6));

    // A scope admission did not make names no version; version 0 writes no `pv`.
    let plain = Scope::with_timeout(secs(1));
    plain.close();
    assert_eq!(plain.quiesce().await.policy_version(), None);
    let (scope, _) = policy(0, 2_000)
        .admit(Incoming::new(), Instant::now())
        .unwrap();
    let out = EgressPolicy::new().outgoing(&scope).unwrap();
    assert!(!out
        .service_budget()
        .unwrap()
        .to_header_value()
        .contains("pv="));
}

#[cfg(feature = "serde")]
#[test]
fn a_policy_loads_from_configuration_and_never_without_a_deadline() {
    use cancel_scope::wire::{OnBadInput, OverCap, PolicyConfig};
    let json = r#"{ "version": 3, "max_ms": 2000, "default_ms": 1000, "reserve_ms": 50,
                    "transport_pad_ms": 5, "min_useful_ms": 20, "trust": "trusted",
                    "error_detail": false, "bad_input_fallback_ms": 300,
                    "over_cap": "reject", "priority": 2 }"#;
    let p: EndpointPolicy = serde_json::from_str(json).unwrap();
    let expected = EndpointPolicy::builder(ms(2000))
        .default_budget(ms(1000))
        .reserve(ms(50))
        .transport_pad(ms(5))
        .min_useful(ms(20))
        .trust(Trust::Trusted)
        .error_detail(false)
        .on_bad_input(OnBadInput::Fallback(ms(300)))
        .over_cap(OverCap::Reject)
        .priority(2)
        .version(3)
        .build();
    assert_eq!(p, expected);
    // Back and forth: the configuration says the same policy.
    let again: EndpointPolicy =
        serde_json::from_str(&serde_json::to_string(&PolicyConfig::from(p)).unwrap()).unwrap();
    assert_eq!(again, p);

    for bad in [
        r#"{ "version": 4, "max_ms": 86400001, "default_ms": 1 }"#,
        r#"{ "version": 4, "default_ms": 1 }"#,
        r#"{ "version": 4, "max_ms": 10, "default_ms": 1, "max": 99 }"#,
        r#"{ "version": 4, "max_ms": -1, "default_ms": 1 }"#,
    ] {
        assert!(
            serde_json::from_str::<EndpointPolicy>(bad).is_err(),
            "{bad}"
        );
    }
    let h = PolicyHandle::new(p).unwrap();
    h.set(serde_json::from_str(r#"{ "version": 4, "max_ms": 900, "default_ms": 500 }"#).unwrap())
        .unwrap();
    assert_eq!(h.current().max_budget(), ms(900));
}

#[cfg(feature = "serde")]
#[test]
fn a_rejection_cap_loads_from_configuration_and_is_validated() {
    use cancel_scope::wire::{PolicyConfig, RejectionCapConfig};
    let json = r#"{ "version": 5, "max_ms": 2000, "default_ms": 1000,
                    "rejection_cap": { "percent": 20, "window_ms": 10000 } }"#;
    let p: EndpointPolicy = serde_json::from_str(json).unwrap();
    let want = policy(5, 2000)
        .to_builder()
        .rejection_cap(20, ms(10_000))
        .build();
    assert_eq!(p, want);
    assert_eq!(p.rejection_limit(), Some((20, ms(10_000))));
    // Back and forth, with and without one.
    let config = PolicyConfig::from(p);
    assert_eq!(
        config.rejection_cap,
        Some(RejectionCapConfig {
            percent: 20,
            window_ms: 10_000
        })
    );
    let again: EndpointPolicy =
        serde_json::from_str(&serde_json::to_string(&config).unwrap()).unwrap();
    assert_eq!(again, p);
    let none = PolicyConfig::from(policy(5, 2000));
    assert_eq!(none.rejection_cap, None);
    assert!(!serde_json::to_string(&none)
        .unwrap()
        .contains("rejection_cap"));

    // A percent over 100 and a zero window are refused, as the other fields' errors are.
    for (percent, window_ms) in [(101, 10_000), (255, 1), (20, 0)] {
        let config = PolicyConfig {
            rejection_cap: Some(RejectionCapConfig { percent, window_ms }),
            ..none.clone()
        };
        let err = EndpointPolicy::try_from(config).unwrap_err();
        assert!(err.is_invalid_rejection_cap(), "{err}");
        assert!(!err.is_unbounded());
        let json = format!(
            r#"{{ "version": 5, "max_ms": 2000, "default_ms": 1000,
                  "rejection_cap": {{ "percent": {percent}, "window_ms": {window_ms} }} }}"#
        );
        let err = serde_json::from_str::<EndpointPolicy>(&json).unwrap_err();
        assert!(err.to_string().contains("rejection cap"), "{err}");
    }
    // Both members are required, no other is accepted.
    for bad in [
        r#"{ "percent": 20 }"#,
        r#"{ "window_ms": 10000 }"#,
        r#"{ "percent": 20, "window_ms": 10000, "slices": 5 }"#,
        r#"{ "percent": 300, "window_ms": 10000 }"#,
    ] {
        let json = format!(
            r#"{{ "version": 5, "max_ms": 2000, "default_ms": 1000, "rejection_cap": {bad} }}"#
        );
        assert!(
            serde_json::from_str::<EndpointPolicy>(&json).is_err(),
            "{bad}"
        );
    }
    // 100 % over 1 ms, the edges that are accepted.
    let edge = PolicyConfig {
        rejection_cap: Some(RejectionCapConfig {
            percent: 100,
            window_ms: 1,
        }),
        ..none
    };
    let p = EndpointPolicy::try_from(edge).unwrap();
    assert_eq!(p.rejection_limit(), Some((100, ms(1))));
}
