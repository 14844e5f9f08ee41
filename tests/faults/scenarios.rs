//! Budget exhaustion and cancellation as injectable faults: the nine scenarios,
//! each on virtual time against the fake downstream of `support::fault`, each ending with the
//! six common invariants (`Net::assert_invariants`): unregistered children sent = 0; no child
//! deadline later than the parent's reserve line; budgets never grew across hops or retries; no
//! call created under an old generation; unknown effects not counted as zero; permits and
//! connections outstanding after quiescence = 0.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cancel_scope::budget::EndpointBudget;
use cancel_scope::retry::{Decision, Ledger, Retry, RetryError, Stop};
use cancel_scope::wire::ServiceBudget;
use cancel_scope::{Cause, ChildSpec, Lifecycle, Report, Scope};
use tokio::sync::Semaphore;
use tokio::time::{sleep, sleep_until, Instant};

use crate::support::fault::{quiesce_and_check, CallError, Fault, Net, Origin, Outcome, Refusal};
use crate::support::time::ms;

/// Quiesces several client trees (closing those not cancelled) and checks the invariants over
/// all of them at once.
async fn quiesce_all_and_check(net: &Net, roots: &[(u64, &Scope)]) -> Vec<Report> {
    let mut reports = Vec::new();
    for (_, root) in roots {
        if !root.is_cancelled() {
            root.close();
        }
        reports.push(root.quiesce().await);
    }
    net.settle().await;
    let trees: Vec<(u64, &Report)> = roots.iter().map(|(t, _)| *t).zip(&reports).collect();
    net.assert_invariants(&trees);
    reports
}

/// 1. A request declares 200 ms; a worker is busy for 100 ms, so the request waits in the
/// ingress queue for half its budget. The queueing is paid from the budget: the dependency is
/// sent what is left minus the reserve (80 ms), never the 200 ms that were declared. A second
/// request whose queueing leaves less than the dependency's minimum useful budget fails fast:
/// nothing is sent.
#[tokio::test(start_paused = true)]
async fn s1_ingress_queueing_eats_half_the_budget_before_the_handler_starts() {
    let net = Net::new(8);
    let policy = EndpointBudget::builder(ms(2000))
        .default_budget(ms(500))
        .build();
    let workers = Arc::new(Semaphore::new(1));
    let start = Instant::now();

    // Another request holds the only worker for 100 ms.
    let busy = workers.clone().acquire_owned().await.unwrap();
    tokio::spawn(async move {
        sleep(ms(100)).await;
        drop(busy);
    });

    // Admission at arrival: the budget's clock starts now, not when a worker is free.
    let declared = ServiceBudget::parse("v=1, rem=200").unwrap().remaining();
    let request = Scope::with_timeout(policy.admit(Some(declared), Duration::ZERO));
    let late = Scope::with_timeout(policy.admit(Some(declared), Duration::ZERO));
    let worker = request.acquire(&workers).await.unwrap();
    assert_eq!(start.elapsed(), ms(100), "queued behind the busy worker");
    assert_eq!(
        request.remaining(),
        Some(ms(100)),
        "half of the budget is gone"
    );

    let call = request
        .child()
        .reserve(ms(20))
        .min_useful(ms(30))
        .build()
        .unwrap();
    let from = Origin::root(&request, 0).child(&call, ms(20));
    net.call(&from, "inventory", ChildSpec::read_only("stock"))
        .await
        .unwrap();
    let sent = net.received_by("inventory");
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].carried,
        ms(80),
        "200 declared - 100 queued - 20 reserve"
    );
    assert_eq!(sent[0].header, "v=1, rem=80, gen=0");
    drop((call, worker));

    // The second request got the worker only after 180 of its 200 ms.
    sleep(ms(80)).await;
    let worker = late.acquire(&workers).await.unwrap();
    let err = late
        .child()
        .reserve(ms(20))
        .min_useful(ms(30))
        .build()
        .unwrap_err();
    assert!(err.is_budget_exhausted(), "fails fast: {err:?}");
    assert_eq!(err.budget().unwrap().available(), Duration::ZERO);
    drop(worker);
    assert_eq!(net.received().len(), 1, "the late request sent nothing");

    quiesce_all_and_check(&net, &[(0, &request), (1, &late)]).await;
}

/// 2. DNS/connect never completes. The call registered its child first, then waited for the
/// connection; at the call's deadline it is stopped: nothing was sent, so even a
/// side-effecting call ends `Cancelled` (not `EffectUnknown`), and the permit and the
/// connection are given back. A second call queued behind it for the only pooled connection
/// pays its queueing from its budget and stops at the same deadline.
#[tokio::test(start_paused = true)]
async fn s2_dns_or_connect_stuck_until_the_deadline() {
    let net = Net::new(1);
    net.set_default("payments", Fault::respond(ms(5)).connect_stuck());
    let start = Instant::now();
    let request = Scope::with_timeout(ms(300));
    let root = Origin::root(&request, 0);

    let call = request.child().reserve(ms(50)).build().unwrap();
    let from = root.child(&call, ms(50));
    let (a, b) = tokio::join!(
        net.call(
            &from,
            "payments",
            ChildSpec::side_effecting("charge", "pay-1")
        ),
        async {
            tokio::task::yield_now().await; // the first call takes the connection
            assert_eq!(net.permits_out(), 1);
            net.call(&from, "payments", ChildSpec::read_only("quote"))
                .await
        }
    );
    assert_eq!(start.elapsed(), ms(250), "stopped at the call's deadline");
    for err in [a.unwrap_err(), b.unwrap_err()] {
        match err {
            CallError::Stopped(e) => assert!(e.is_deadline_exceeded(), "{e:?}"),
            other => panic!("expected a stop at the deadline, got {other:?}"),
        }
    }
    assert!(net.received().is_empty(), "nothing reached the downstream");
    assert_eq!((net.permits_out(), net.open_connections()), (0, 0));

    let report = quiesce_and_check(&net, &request, 0).await;
    assert_eq!(report.cancelled(), 2);
    assert_eq!(report.effect_unknown(), 0, "never dispatched: no effect");
    assert_eq!(report.state(), Lifecycle::Completed);
}

/// 3. Three children of one request: one fast, one slow, one whose driver and downstream
/// ignore the cancel. The fast one succeeds, the slow one is stopped at the deadline, and the
/// stubborn one is quarantined after the grace period; its late answer changes nothing. The
/// request is quiet only once its connection is given back.
#[tokio::test(start_paused = true)]
async fn s3_three_children_fast_slow_and_one_that_ignores_cancellation() {
    let net = Net::new(8);
    net.script("fast", [Fault::respond(ms(10))]);
    net.script("slow", [Fault::respond(ms(500))]);
    net.script("stubborn", [Fault::ignore_cancel(ms(5000))]);
    let start = Instant::now();
    let request = Scope::with_timeout(ms(200));
    let root = Origin::root(&request, 0);

    let (fast, slow, stubborn) = tokio::join!(
        net.call(&root, "fast", ChildSpec::read_only("fast")),
        net.call(&root, "slow", ChildSpec::read_only("slow")),
        net.call(&root, "stubborn", ChildSpec::read_only("stubborn")),
    );
    assert_eq!(start.elapsed(), ms(200));
    assert!(fast.is_ok());
    // The slow downstream's own budget (what it was sent) ends in the same instant as the
    // caller's: the caller either stops first or reads the downstream's "stopped" answer.
    let slow_read_answer = match slow.unwrap_err() {
        CallError::Stopped(e) => {
            assert!(e.is_deadline_exceeded(), "{e:?}");
            false
        }
        CallError::Downstream(Refusal::Stopped(c)) => {
            assert!(c.is_deadline_exceeded(), "{c:?}");
            true
        }
        other => panic!("slow: {other:?}"),
    };
    assert!(matches!(stubborn, Err(CallError::Stopped(e)) if e.is_deadline_exceeded()));

    let report = quiesce_and_check(&net, &request, 0).await;
    assert_eq!(
        start.elapsed(),
        ms(5000),
        "quiet once the stubborn driver gave its connection back"
    );
    assert_eq!(
        (report.succeeded(), report.quarantined()),
        (1, 1),
        "the late answer of the quarantined child changed nothing"
    );
    assert_eq!(report.failed(), u64::from(slow_read_answer));
    assert_eq!(report.cancelled(), u64::from(!slow_read_answer));
    assert_eq!(report.quarantined_children()[0].name(), "stubborn");
    assert_eq!(report.state(), Lifecycle::CancelledStable);

    let stubborn = &net.received_by("stubborn")[0];
    assert_eq!(stubborn.outcome, Outcome::Answered, "it ran to the end");
    assert_eq!(stubborn.delivered, Some(true), "its driver read the answer");
    let slow = &net.received_by("slow")[0];
    assert!(matches!(slow.outcome, Outcome::Stopped { at, .. } if at - start <= ms(200)));
}

/// 4. An automatic retry layer below the application: the application, a sidecar and the SDK
/// each "retry 3 times" calls to the same failing dependency. One retry owner: the downstream
/// sees 3 requests, not 27, and each carries less than the one before.
#[tokio::test(start_paused = true)]
async fn s4_a_retry_layer_below_the_application_has_one_owner_not_27_calls() {
    let net = Net::new(8);
    net.set_default("inventory", Fault::fail(ms(5)));
    let request = Scope::with_timeout(ms(1000));
    let root = Origin::root(&request, 0);
    let spec = || ChildSpec::read_only("inventory");
    let nested: Arc<Mutex<Vec<Arc<Ledger>>>> = Arc::default();

    let app = Retry::new(|_: &RetryError<RetryError<CallError>>| Decision::RetryNow)
        .max_attempts(3)
        .reserve(ms(50));
    let (res, ledger) = app
        .run_with_ledger(&request, spec(), |a| {
            let (net, nested) = (net.clone(), nested.clone());
            let from = root.child(a.scope(), ms(50));
            async move {
                let sidecar =
                    Retry::new(|_: &RetryError<CallError>| Decision::RetryNow).max_attempts(3);
                let (res, l) = sidecar
                    .run_with_ledger(&from.scope, spec(), |b| {
                        let (net, nested) = (net.clone(), nested.clone());
                        let from = from.child(b.scope(), Duration::ZERO);
                        async move {
                            let sdk =
                                Retry::new(|_: &CallError| Decision::RetryNow).max_attempts(3);
                            let (res, l) = sdk
                                .run_with_ledger(&from.scope, spec(), |c| {
                                    let from = from.child(c.scope(), Duration::ZERO);
                                    let net = net.clone();
                                    async move { net.call(&from, "inventory", spec()).await }
                                })
                                .await;
                            nested.lock().unwrap().push(l);
                            res
                        }
                    })
                    .await;
                nested.lock().unwrap().push(l);
                res
            }
        })
        .await;
    assert!(res.is_err());
    assert_eq!(ledger.started(), 3);
    assert_eq!(ledger.stop(), Some(&Stop::AttemptsExhausted));
    let nested = nested.lock().unwrap().clone();
    assert_eq!(
        nested.len(),
        6,
        "a sidecar and an SDK call per application attempt"
    );
    for l in &nested {
        assert!(!l.is_owner());
        assert_eq!(l.started(), 1, "a nested layer makes one attempt");
    }

    let sent = net.received_by("inventory");
    assert_eq!(sent.len(), 3, "one retry owner: 3 calls, not 27");
    // Every attempt is paid from the one budget: none carries past the request's reserve line
    // (the invariant check below), and the last one gets exactly what is left up to it.
    let line = request.deadline().unwrap() - ms(50);
    assert!(sent.iter().all(|r| r.at + r.carried <= line));
    assert_eq!(sent[2].at + sent[2].carried, line);
    let budgets: Vec<_> = ledger
        .attempts()
        .iter()
        .map(|a| a.budget().unwrap())
        .collect();
    assert_eq!(
        budgets,
        [ms(316), ms(472), ms(940)],
        "(1000 - 50) / 3, (995 - 50) / 2, 990 - 50"
    );
    // Registrations outside the transport: every attempt of every layer.
    let attempts: u32 = ledger.started() + nested.iter().map(|l| l.started()).sum::<u32>();
    net.count(0, u64::from(attempts));
    let report = quiesce_and_check(&net, &request, 0).await;
    assert_eq!(
        report.failed(),
        3 + 9,
        "3 transport calls and 9 attempt tickets failed"
    );
}

/// 5. The send cannot succeed where the registration failed: registration comes first. The
/// handler already answered (its scope is closed), the client went away, or the cancel came
/// while the connection was being set up — in each case the downstream sees nothing, and a
/// registration that did get in ends `Cancelled` (nothing was sent).
#[tokio::test(start_paused = true)]
async fn s5_registration_failed_so_nothing_was_sent() {
    let net = Net::new(8);
    let request = Scope::with_timeout(ms(1000));
    let root = Origin::root(&request, 0);

    // The handler already answered: its scope is closed.
    let answered = request.child().build().unwrap();
    answered.close();
    let err = net
        .call(
            &root.child(&answered, Duration::ZERO),
            "audit",
            ChildSpec::side_effecting("log", "audit-1"),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CallError::NotRegistered(e) if e.is_closed()),
        "{err:?}"
    );

    // The client went away.
    let gone = request.child().build().unwrap();
    gone.cancel_because(Cause::ClientGone);
    let err = net
        .call(
            &root.child(&gone, Duration::ZERO),
            "audit",
            ChildSpec::side_effecting("log", "audit-2"),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CallError::NotRegistered(e) if e.is_client_gone()),
        "{err:?}"
    );
    assert!(err.nothing_sent());

    // Registered, then the client went away during a 50 ms connect.
    net.script("audit", [Fault::record().connect(ms(50))]);
    let slow_connect = request.child().build().unwrap();
    let from = root.child(&slow_connect, Duration::ZERO);
    let canceller = tokio::spawn({
        let s = slow_connect.clone();
        async move {
            sleep(ms(10)).await;
            s.cancel_because(Cause::ClientGone);
        }
    });
    let err = net
        .call(&from, "audit", ChildSpec::side_effecting("log", "audit-3"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CallError::Stopped(e) if e.is_client_gone()),
        "{err:?}"
    );
    canceller.await.unwrap();

    assert!(net.received().is_empty(), "nothing was sent");
    assert_eq!(net.refused(), 2);
    let report = quiesce_and_check(&net, &request, 0).await;
    assert_eq!(report.total(), 1, "only the third call registered");
    assert_eq!(report.cancelled(), 1);
    assert!(
        report.pending_effects().is_empty(),
        "nothing sent, nothing to reconcile"
    );
}

/// 6. The deadline races the dispatch compare-and-swap. The connect step ends just before, at,
/// or just after the call's deadline (the timer task may not have run yet in that instant).
/// Either the request is dispatched strictly before the deadline — and the cancel then reaches
/// it — or it is refused: nothing is ever received at or after the deadline, and no budget is
/// ever sent from a scope whose deadline has passed.
#[tokio::test(start_paused = true)]
async fn s6_deadline_racing_the_dispatch_cas() {
    // Deadlines on and between the timer's millisecond ticks; connects ending around them.
    let mut tree = 0;
    for deadline_us in [100_000_i64, 100_500] {
        for offset_us in [-1_000_i64, -1, 0, 1, 200, 400, 999, 1_000] {
            tree += 1;
            let net = Net::new(4);
            let request = Scope::with_timeout(ms(1000));
            let start = Instant::now();
            let deadline = start + Duration::from_micros(deadline_us as u64);
            let call = request.child().deadline(deadline).build().unwrap();
            let from = Origin::root(&request, tree).child(&call, Duration::ZERO);
            let connect = Duration::from_micros((deadline_us + offset_us) as u64);
            net.script("inventory", [Fault::respond(ms(50)).connect(connect)]);
            let err = net
                .call(&from, "inventory", ChildSpec::read_only("stock"))
                .await
                .unwrap_err();
            let sent = net.received();
            drop(call);
            quiesce_all_and_check(&net, &[(tree, &request)]).await;
            let case = format!("deadline {deadline_us} µs, connect {offset_us:+} µs");
            let deadline_stop = match &err {
                CallError::Stopped(e) | CallError::NotDispatched(e) => e.is_deadline_exceeded(),
                // The downstream's own budget ended in the same instant and it answered first.
                CallError::Downstream(Refusal::Stopped(c)) => c.is_deadline_exceeded(),
                // Sent with less than a millisecond left: the header carries whole
                // milliseconds (rounded down), and the downstream refuses a zero budget.
                CallError::Downstream(Refusal::Rejected) => sent[0].carried.is_zero(),
                _ => false,
            };
            assert!(deadline_stop, "{case}: {err:?}");
            if let Some(r) = sent.first() {
                // Dispatched strictly before the deadline; the deadline then stopped it.
                assert!(r.at < deadline, "{case}: {sent:?}");
            } else {
                assert!(
                    err.nothing_sent() || matches!(err, CallError::Stopped(_)),
                    "{case}"
                );
            }
            if offset_us <= -1_000 {
                assert_eq!(sent.len(), 1, "{case}: sent before the deadline");
            }
            if offset_us >= 0 {
                assert!(sent.is_empty(), "{case}: sent at or after the deadline");
            }
        }
    }

    // The bare race: a ticket dispatched in the instant of the deadline, woken by its own
    // timer in the same millisecond tick as the scope's (whose task may run after it).
    let request = Scope::with_timeout(ms(100));
    let ticket = request.register(ChildSpec::read_only("stock")).unwrap();
    sleep_until(request.deadline().unwrap()).await;
    assert_eq!(request.remaining(), Some(Duration::ZERO));
    let err = ticket.dispatch().unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err:?}");
    assert!(
        request.is_cancelled(),
        "the passed deadline counts as the cancel"
    );
    let report = request.quiesce().await;
    assert_eq!(report.cancelled(), 1);
    assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded));
}

/// 7. The cancel message to the downstream is lost. The downstream still stops — on its own
/// budget, which it admitted from the header the request carried — rather than running on.
/// With the message delivered it stops at the cancel.
#[tokio::test(start_paused = true)]
async fn s7_a_lost_cancel_message_and_the_downstream_stops_on_its_own_budget() {
    let net = Net::new(8);
    let start = Instant::now();
    net.script("inventory", [Fault::hang().lose_cancel(), Fault::hang()]);
    let lost = Scope::with_timeout(ms(1000));
    let delivered = Scope::with_timeout(ms(1000));
    let call = |tree: u64, request: &Scope| {
        let call = request.child().reserve(ms(100)).build().unwrap();
        let from = Origin::root(request, tree).child(&call, ms(100));
        let net = net.clone();
        async move {
            net.call(&from, "inventory", ChildSpec::read_only("stock"))
                .await
        }
    };
    let client_gone = async {
        sleep(ms(50)).await;
        lost.cancel_because(Cause::ClientGone);
        delivered.cancel_because(Cause::ClientGone);
    };
    let (a, b, ()) = tokio::join!(call(0, &lost), call(1, &delivered), client_gone);
    for err in [a.unwrap_err(), b.unwrap_err()] {
        assert!(
            matches!(&err, CallError::Stopped(e) if e.is_client_gone()),
            "{err:?}"
        );
    }
    assert_eq!(start.elapsed(), ms(50));
    quiesce_all_and_check(&net, &[(0, &lost), (1, &delivered)]).await;

    let sent = net.received_by("inventory");
    assert_eq!(sent[0].carried, ms(900));
    assert_eq!(
        sent[0].outcome,
        Outcome::Stopped {
            at: start + ms(900),
            cause: Cause::DeadlineExceeded
        },
        "the message was lost: it stopped at the end of the budget it was sent"
    );
    assert_eq!(
        sent[1].outcome,
        Outcome::Stopped {
            at: start + ms(50),
            cause: Cause::cancelled("cancel message")
        },
        "the message arrived: it stopped at the cancel"
    );
}

/// 8. A stale retry from an old generation tries to start. The first attempt fails, and the
/// request is cancelled (superseded) during the backoff: no second attempt starts. Later a
/// retry timer that prepared its ticket in the old generation fires, and a retry is started
/// on the old scope: both are refused, and nothing reaches the downstream under the old
/// generation.
#[tokio::test(start_paused = true)]
async fn s8_a_stale_retry_from_an_old_generation_is_refused() {
    let net = Net::new(8);
    net.script("inventory", [Fault::fail(ms(10))]);
    let start = Instant::now();
    let request = Scope::with_timeout(ms(1000));
    let root = Origin::root(&request, 0);
    let retry = Retry::new(|_: &CallError| Decision::Backoff)
        .max_attempts(3)
        .backoff(vec![ms(100), ms(100)]);
    let op = |a: cancel_scope::retry::Attempt| {
        let (net, from) = (net.clone(), root.child(a.scope(), Duration::ZERO));
        async move {
            net.call(&from, "inventory", ChildSpec::read_only("stock"))
                .await
        }
    };

    // A sidecar's retry timer prepares its ticket now, in generation 0.
    let stale = request.register(ChildSpec::read_only("stock")).unwrap();
    let old = stale.generation();
    tokio::spawn({
        let r = request.clone();
        async move {
            sleep(ms(50)).await;
            r.cancel_with("superseded");
        }
    });
    let err = retry
        .run(&request, ChildSpec::read_only("inventory"), op)
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), ms(50), "the backoff is cut by the cancel");
    assert!(matches!(err.stop(), Stop::Cancelled(c) if c.reason() == Some("superseded")));
    assert_eq!(err.ledger().started(), 1);
    assert_eq!(request.generation(), old + 1);

    // The stale timer fires at 200 ms.
    sleep(ms(150)).await;
    assert!(stale.dispatch().unwrap_err().is_cancelled());
    let late = retry
        .run(&request, ChildSpec::read_only("inventory"), op)
        .await
        .unwrap_err();
    assert_eq!(
        late.ledger().started(),
        0,
        "a retry on the old scope starts nothing"
    );
    assert!(late.is_cancelled());

    let sent = net.received();
    assert_eq!(sent.len(), 1, "only the first attempt was sent");
    assert_eq!(sent[0].generation, old);
    net.count(0, 2); // the stale ticket and the first attempt's ticket
    let report = quiesce_and_check(&net, &request, 0).await;
    assert_eq!((report.failed(), report.cancelled()), (2, 1));
}

/// 9. The downstream committed a write and the response was lost. The caller cannot know
/// whether it happened: its child ends `EffectUnknown`, is listed for reconciliation with its
/// effect id and payload digest, and the request ends `NeedsReconciliation` — an unknown
/// effect is not counted as no effect. Through the retry layer a side-effecting call is not
/// retried and ends the same way.
#[tokio::test(start_paused = true)]
async fn s9_a_committed_write_whose_response_was_lost_is_listed_for_reconciliation() {
    let net = Net::new(8);
    net.set_default("payments", Fault::lose_response(ms(30)));
    let start = Instant::now();
    let request = Scope::with_timeout(ms(500));
    let root = Origin::root(&request, 0);

    let call = request.child().reserve(ms(50)).build().unwrap();
    let from = root.child(&call, ms(50));
    let spec = ChildSpec::side_effecting("charge", "pay-42").payload_digest("sha256:9f2c");
    let err = net.call(&from, "payments", spec).await.unwrap_err();
    assert!(
        matches!(&err, CallError::Stopped(e) if e.is_deadline_exceeded()),
        "{err:?}"
    );
    assert_eq!(start.elapsed(), ms(450));

    // Through the retry layer, in a second request: one attempt (side-effecting work is not
    // retried), which runs out of its own budget while the request still has time.
    let request2 = Scope::with_timeout(ms(500));
    let root2 = Origin::root(&request2, 1);
    let retry = Retry::new(|_: &CallError| Decision::Backoff)
        .max_attempts(3)
        .reserve(ms(100));
    let err = retry
        .run(
            &request2,
            ChildSpec::side_effecting("charge", "pay-43"),
            |a| {
                let (net, from) = (net.clone(), root2.child(a.scope(), ms(100)));
                async move {
                    net.call(
                        &from,
                        "payments",
                        ChildSpec::side_effecting("charge", "pay-43"),
                    )
                    .await
                }
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.stop(), &Stop::EffectUnknown);
    assert_eq!(
        err.ledger().started(),
        1,
        "side-effecting work is not retried"
    );
    net.count(1, 1);

    let sent = net.received_by("payments");
    assert_eq!(sent.len(), 2);
    assert!(sent
        .iter()
        .all(|r| r.committed && r.outcome == Outcome::Lost));
    let reports = quiesce_all_and_check(&net, &[(0, &request), (1, &request2)]).await;
    for report in &reports {
        assert_eq!(report.state(), Lifecycle::NeedsReconciliation);
    }
    assert_eq!(reports[0].effect_unknown(), 1);
    let first = &reports[0].pending_effects()[0];
    assert_eq!(first.effect_id(), "pay-42");
    assert_eq!(first.payload_digest_str(), Some("sha256:9f2c"));
    // The attempt and the transport child inside it both record the unknown effect.
    assert_eq!(reports[1].effect_unknown(), 2);
    assert!(reports[1]
        .pending_effects()
        .iter()
        .all(|e| e.effect_id() == "pay-43"));
}
