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

/// The children of `report` that ended after a would-be deadline of their own: each one's
/// name (as `why` gives it), would-be deadline and lateness.
fn late_children(report: &cancel_scope::Report) -> Vec<(String, Instant, Duration)> {
    report
        .would_be()
        .into_iter()
        .filter(|d| d.is_child_late())
        .map(|d| (d.why().to_owned(), d.at(), d.late_by().unwrap()))
        .collect()
}

/// Runs `scope` for `ms` in a body (bounded, shadowed, by the hard cap alone).
async fn work(scope: &cancel_scope::Scope, n: u64) -> Result<(), cancel_scope::Error> {
    scope.run(tokio::time::sleep(ms(n))).await
}

#[tokio::test(start_paused = true)]
async fn a_child_past_its_own_would_be_deadline_records_how_late_it_ended() {
    let t0 = Instant::now();
    let scope = shadowed_request(); // would-be deadline t0 + 100 ms
    let db = scope.child().name("db").reserve(ms(30)).build().unwrap();
    assert_eq!(db.deadline(), Some(t0 + ms(4_970)), "the enforced bound");
    // Its calls tell the next hop its own would-be budget, as enforcing would tell `rem`.
    let out = EgressPolicy::new().outgoing(&db).unwrap();
    assert_eq!(out.service_budget().unwrap().would_be(), Some(ms(70)));
    // Past its would-be deadline (t0 + 70 ms), within the enforced bound: it runs on.
    work(&db, 85).await.unwrap();
    drop(db);
    let (report, late) = quiet_with(&scope, WouldBe::is_child_late).await;
    assert_eq!(late.len(), 1, "{report}");
    assert_eq!(late[0].late_by(), Some(ms(15)));
    assert_eq!(late[0].at(), t0 + ms(70));
    assert_eq!(late[0].why(), "child `db`");
    assert!(!late[0].is_refusal() && !late[0].is_child_refusal());
    assert!(
        report.to_string().contains(
            "shadow: would have cancelled child `db` at its deadline: finished 15 ms after it"
        ),
        "{report}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_child_that_ends_within_its_would_be_deadline_records_nothing() {
    let scope = shadowed_request(); // would-be deadline t0 + 100 ms
    let db = scope.child().name("db").reserve(ms(30)).build().unwrap();
    work(&db, 70).await.unwrap(); // ends at its would-be deadline, not after it
    drop(db);
    // No rule of its own: its would-be deadline is the request's, whose lateness the layer
    // that admitted it reports (at the answer), not a child's.
    let plain = scope.child().name("plain").cap(ms(900)).build().unwrap();
    work(&plain, 60).await.unwrap(); // ends at t0 + 130 ms
    drop(plain);
    let (report, _) = quiet_with(&scope, |_| true).await;
    assert!(report.would_be().is_empty(), "{report}");
}

#[tokio::test(start_paused = true)]
async fn a_nested_child_with_its_own_cap_is_bounded_by_its_parents_would_be_deadline() {
    let t0 = Instant::now();
    let scope = shadowed_request(); // would-be deadline t0 + 100 ms
    let outer = scope.child().name("outer").reserve(ms(20)).build().unwrap(); // t0 + 80
    advance(ms(10)).await;
    // Its cap allows 100 ms, its parent's would-be budget less its reserve 65 ms: its would-be
    // deadline is t0 + 75 ms, its enforced one t0 + 110 ms.
    let inner = outer
        .child()
        .name("inner")
        .cap(ms(100))
        .reserve(ms(5))
        .build()
        .unwrap();
    assert_eq!(inner.deadline(), Some(t0 + ms(110)));
    // A cap is enforced in every mode: this child stops at it, and has nothing to report.
    let capped = outer.child().name("capped").cap(ms(30)).build().unwrap();
    assert!(work(&capped, 40).await.unwrap_err().is_deadline_exceeded());
    drop(capped);
    // A cap longer than what the outer child would have: its would-be deadline is the outer
    // one's, reported for the outer child only.
    let within = outer.child().name("within").cap(ms(500)).build().unwrap();
    work(&inner, 40).await.unwrap(); // ends at t0 + 80 ms
    drop((inner, within));
    advance(ms(5)).await;
    drop(outer); // ends at t0 + 85 ms
    let (report, _) = quiet_with(&scope, |_| true).await;
    assert_eq!(
        late_children(&report),
        [
            ("child `inner`".to_owned(), t0 + ms(75), ms(5)),
            ("child `outer`".to_owned(), t0 + ms(80), ms(5)),
        ],
        "{report}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fan_out_branch_past_its_would_be_deadline_records_how_late_it_ended() {
    use cancel_scope::fanout::FanOut;
    let t0 = Instant::now();
    let scope = shadowed_request(); // would-be deadline t0 + 100 ms
    async fn answer(after: u64) -> Result<u32, std::io::Error> {
        tokio::time::sleep(ms(after)).await;
        Ok(7)
    }
    // Optional branches end 30 ms before the required ones: at t0 + 70 ms, would-be.
    let mut fan = FanOut::new(&scope).aggregate_reserve(ms(30));
    let price = fan.required("price", |_| answer(90));
    let reviews = fan.optional("reviews", |_| answer(85));
    let mut page = fan.join().await.unwrap();
    assert_eq!(page.required(price), 7);
    assert_eq!(
        page.optional(reviews),
        Some(7),
        "shadowed: it ran to its end"
    );
    let (report, _) = quiet_with(&scope, |_| true).await;
    assert_eq!(
        late_children(&report),
        [("child `reviews`".to_owned(), t0 + ms(70), ms(15))],
        "{report}"
    );
}

/// Two attempts at `inventory`, each failing after 60 ms, the budget split evenly.
async fn retried_twice(scope: &cancel_scope::Scope) -> std::sync::Arc<cancel_scope::retry::Ledger> {
    use cancel_scope::budget::Split;
    use cancel_scope::retry::{Decision, Retry};
    use cancel_scope::ChildSpec;
    let retry = Retry::new(|_: &()| Decision::RetryNow)
        .max_attempts(2)
        .split(Split::Even { cap: None });
    let (_, ledger) = retry
        .run_with_ledger(scope, ChildSpec::read_only("inventory"), |_| async {
            tokio::time::sleep(ms(60)).await;
            Err::<(), ()>(())
        })
        .await;
    ledger
}

#[tokio::test(start_paused = true)]
async fn a_retry_attempt_past_its_would_be_share_records_how_late_it_ended() {
    let t0 = Instant::now();
    let scope = shadowed_request(); // would-be deadline t0 + 100 ms
                                    // The first attempt's would-be share is half of 100 ms: it ends 10 ms after it. The
                                    // second's is all that is left, the request's own would-be deadline: not a child's.
    let ledger = retried_twice(&scope).await;
    assert_eq!(ledger.started(), 2);
    let (report, _) = quiet_with(&scope, |_| true).await;
    assert_eq!(
        late_children(&report),
        [("child `inventory`".to_owned(), t0 + ms(50), ms(10))],
        "{report}"
    );
}

#[tokio::test(start_paused = true)]
async fn enforcing_cancels_the_same_children_at_the_deadlines_shadow_mode_reported() {
    let admit = |mode| {
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .mode(mode)
            .build()
            .admit(Incoming::new().grpc_timeout(b"100m"), Instant::now())
            .unwrap()
            .0
    };
    // The same work in both modes: a call with a reserve, a nested call with a cap, a retry.
    async fn calls(scope: &cancel_scope::Scope) -> Vec<(&'static str, Option<Instant>)> {
        let mut ended = Vec::new();
        let outer = scope.child().name("outer").reserve(ms(20)).build().unwrap();
        let inner = outer.child().name("inner").reserve(ms(5)).cap(ms(100));
        let inner = inner.build().unwrap();
        let r = work(&inner, 80).await;
        ended.push(("inner", r.is_err().then(Instant::now)));
        drop(inner);
        let r = work(&outer, 50).await;
        ended.push(("outer", r.is_err().then(Instant::now)));
        drop(outer);
        ended
    }
    let t0 = Instant::now();
    let shadowed = admit(Mode::Shadow);
    assert!(calls(&shadowed).await.iter().all(|(_, c)| c.is_none()));
    let (report, _) = quiet_with(&shadowed, |_| true).await;
    let reported = late_children(&report);
    assert_eq!(reported.len(), 2, "{report}");

    tokio::time::advance(ms(1_000)).await;
    let t1 = Instant::now();
    let enforced = admit(Mode::Enforce);
    let cancelled = calls(&enforced).await;
    // Each child cancelled at its deadline, where shadow mode said it would have been.
    for ((name, at), (why, would_be, _)) in cancelled.iter().zip(&reported) {
        assert_eq!(why, &format!("child `{name}`"));
        assert_eq!(at.map(|at| at - t1), Some(*would_be - t0), "{name}");
    }
    enforced.close();
    assert!(enforced.quiesce().await.would_be().is_empty());

    // A retry attempt: cancelled at the share's end that shadow mode reported.
    let shadowed = admit(Mode::Shadow);
    let t2 = Instant::now();
    retried_twice(&shadowed).await;
    let (report, _) = quiet_with(&shadowed, |_| true).await;
    let [(_, would_be, _)] = late_children(&report)[..] else {
        panic!("{report}")
    };
    let enforced = admit(Mode::Enforce);
    let t3 = Instant::now();
    let ledger = retried_twice(&enforced).await;
    let first = &ledger.attempts()[0];
    assert_eq!(first.budget(), Some(ms(50)));
    assert_eq!(first.ended_at().map(|at| at - t3), Some(would_be - t2));
}
