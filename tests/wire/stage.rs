//! Staged enforcement (`EndpointPolicy::enforce_for`, `enforced_percent`): by request class and
//! by a fixed hash of the operation id, on tokio's virtual clock.

use cancel_scope::wire::{fraction_bucket, EndpointPolicy, Incoming, RequestClass, Stage, Trust};
use tokio::time::Instant;

use crate::support::time::ms;

/// A policy that refuses a 10 ms budget as below its minimum useful 50 ms.
fn strict() -> EndpointPolicy {
    EndpointPolicy::builder(ms(5_000))
        .default_budget(ms(1_000))
        .min_useful(ms(50))
        .trust(Trust::Trusted)
        .build()
}

/// A too-short request of operation `op` and `class`.
fn short(op: &str, class: RequestClass) -> Incoming {
    Incoming::new()
        .service_budget(format!("v=1, rem=10, op={op}").as_bytes())
        .class(class)
}

/// Whether `policy` enforces (refuses) the too-short request `op`.
fn enforced(policy: EndpointPolicy, op: &str, class: RequestClass) -> bool {
    match policy.admit(short(op, class), Instant::now()) {
        Err(e) => {
            assert!(e.is_budget_exhausted(), "{e}");
            true
        }
        Ok((scope, a)) => {
            assert!(a.is_shadowed() && a.would_be()[0].is_refusal(), "{op}");
            assert_eq!(scope.remaining(), Some(ms(5_000)));
            false
        }
    }
}

#[test]
fn the_bucket_is_fnv_1a_64_and_stable() {
    // FNV-1a 64 reference values (draft-eastlake-fnv): "" and "a", "foobar".
    assert_eq!(fraction_bucket(""), (0xcbf2_9ce4_8422_2325_u64 % 100) as u8);
    assert_eq!(
        fraction_bucket("a"),
        (0xaf63_dc4c_8601_ec8c_u64 % 100) as u8
    );
    assert_eq!(
        fraction_bucket("foobar"),
        (0x8594_4171_f739_67e8_u64 % 100) as u8
    );
}

#[tokio::test(start_paused = true)]
async fn each_stage_enforces_its_classes_and_shadows_the_rest() {
    use RequestClass::*;
    for (stage, expect) in [
        (Stage::ReadOnly, [true, false, false]),
        (Stage::Idempotent, [true, true, false]),
        (Stage::All, [true, true, true]),
    ] {
        let policy = strict().to_builder().enforce_for(stage).build();
        let got = [ReadOnly, Idempotent, SideEffecting].map(|c| enforced(policy, "op-1", c));
        assert_eq!(got, expect, "{stage:?}");
    }
    // A request whose class nobody said is side-effecting: the last to be enforced.
    let policy = strict().to_builder().enforce_for(Stage::Idempotent).build();
    let unsaid = Incoming::new().service_budget(b"v=1, rem=10, op=op-1");
    assert!(policy
        .admit(unsaid, Instant::now())
        .unwrap()
        .1
        .is_shadowed());
}

#[tokio::test(start_paused = true)]
async fn the_enforced_fraction_nests_and_is_the_same_for_an_operation_everywhere() {
    let ops: Vec<String> = (0..1_000).map(|i| format!("checkout-{i}")).collect();
    let at = |percent| -> Vec<bool> {
        let policy = strict().to_builder().enforced_percent(percent).build();
        ops.iter()
            .map(|op| enforced(policy, op, RequestClass::ReadOnly))
            .collect()
    };
    let (none, ten, half, all) = (at(0), at(10), at(50), at(100));
    assert!(none.iter().all(|e| !e));
    assert!(all.iter().all(|e| *e));
    for (i, op) in ops.iter().enumerate() {
        assert!(!ten[i] || half[i], "{op}: enforced at 10 % but not at 50 %");
        assert_eq!(half[i], fraction_bucket(op) < 50, "{op}");
    }
    let count = |v: &[bool]| v.iter().filter(|e| **e).count();
    // A fair hash: near the fraction (1000 ids; bounds far from chance).
    assert!((50..=150).contains(&count(&ten)), "{}", count(&ten));
    assert!((400..=600).contains(&count(&half)), "{}", count(&half));
    // Another hop, another policy at 50 %: the same operations.
    assert_eq!(at(50), half);
}

#[tokio::test(start_paused = true)]
async fn a_caller_picks_no_bucket_it_is_not_trusted_with() {
    // Untrusted: the caller's operation id is not adopted, a fresh one decides.
    let policy = EndpointPolicy::builder(ms(5_000))
        .default_budget(ms(1_000))
        .min_useful(ms(50))
        .enforced_percent(50)
        .build();
    let chosen = (0..)
        .map(|i| format!("op-{i}"))
        .find(|op| fraction_bucket(op) >= 50)
        .unwrap();
    let mut shadowed = 0;
    for _ in 0..200 {
        if policy
            .admit(short(&chosen, RequestClass::ReadOnly), Instant::now())
            .is_ok()
        {
            shadowed += 1;
        }
    }
    // Not all shadowed, as the chosen id would make them: each got a fresh id.
    assert!(shadowed < 200, "{shadowed}");
}

#[tokio::test(start_paused = true)]
async fn an_enforced_staged_request_gets_the_enforcing_budget() {
    let policy = strict()
        .to_builder()
        .reserve(ms(20))
        .enforce_for(Stage::ReadOnly)
        .build();
    let ok = |class| {
        Incoming::new()
            .service_budget(b"v=1, rem=300, op=op-1")
            .class(class)
    };
    let (scope, a) = policy
        .admit(ok(RequestClass::ReadOnly), Instant::now())
        .unwrap();
    assert!(!a.is_shadowed());
    assert_eq!(scope.remaining(), Some(ms(280)));
    let (scope, a) = policy
        .admit(ok(RequestClass::SideEffecting), Instant::now())
        .unwrap();
    assert!(a.is_shadowed());
    assert_eq!(scope.remaining(), Some(ms(5_000)));
    assert_eq!(a.would_be_deadline(), Some(Instant::now() + ms(280)));
}
