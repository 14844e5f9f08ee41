//! What a report says: orphan work and the time from cancel to quiet, and the pending
//! effects. Records of one effect id are listed once only when they describe the same effect
//! (what one knows the other does not contradict); records that disagree (two provider
//! handles, two payload digests) are each kept, or what reconciliation needs is lost.

use std::time::Duration;

use cancel_scope::{ChildSpec, Lifecycle, Receipt, Scope};

#[tokio::test]
async fn two_unknown_effects_of_one_id_with_different_provider_handles_keep_both_handles() {
    // E.g. two attempts of an idempotent call, each of whose transport calls reached the
    // provider and got its own request id before the outcome was lost.
    let s = Scope::new();
    let spec = ChildSpec::side_effecting("charge", "payment-7");
    let mut first = s.register(spec.clone()).unwrap().dispatch().unwrap();
    first.set_provider_handle("psp-1");
    let mut second = s.register(spec).unwrap().dispatch().unwrap();
    second.set_provider_handle("psp-2");
    drop(first);
    drop(second);
    s.close();
    let r = s.quiesce().await;
    assert_eq!(r.effect_unknown(), 2, "{r:?}");
    assert_eq!(r.state(), Lifecycle::NeedsReconciliation);
    let handles: Vec<_> = r
        .pending_effects()
        .iter()
        .map(|e| e.provider_handle_str())
        .collect();
    assert!(
        handles.contains(&Some("psp-1")) && handles.contains(&Some("psp-2")),
        "a provider handle to reconcile was dropped: {r:?}"
    );
}

#[tokio::test]
async fn two_unknown_effects_of_one_id_with_different_payloads_keep_both_digests() {
    let s = Scope::new();
    let a = s
        .register(ChildSpec::side_effecting("charge", "payment-7").payload_digest("sha256:aaa"))
        .unwrap()
        .dispatch()
        .unwrap();
    let b = s
        .register(ChildSpec::side_effecting("charge", "payment-7").payload_digest("sha256:bbb"))
        .unwrap()
        .dispatch()
        .unwrap();
    drop(a);
    drop(b);
    s.close();
    let r = s.quiesce().await;
    let digests: Vec<_> = r
        .pending_effects()
        .iter()
        .map(|e| e.payload_digest_str())
        .collect();
    assert!(
        digests.contains(&Some("sha256:aaa")) && digests.contains(&Some("sha256:bbb")),
        "a payload digest to reconcile was dropped: {r:?}"
    );
}

#[tokio::test]
async fn records_of_one_effect_that_agree_are_still_listed_once_with_what_either_knew() {
    let s = Scope::new();
    let attempt = s
        .register(ChildSpec::side_effecting("charge", "payment-7"))
        .unwrap()
        .dispatch()
        .unwrap();
    let mut call = s
        .register(ChildSpec::side_effecting("charge", "payment-7").payload_digest("sha256:abc"))
        .unwrap()
        .dispatch()
        .unwrap();
    call.set_provider_handle("psp-1");
    drop(call);
    drop(attempt);
    s.close();
    let r = s.quiesce().await;
    assert_eq!(r.effect_unknown(), 2);
    assert_eq!(r.pending_effects().len(), 1, "{r:?}");
    let e = &r.pending_effects()[0];
    assert_eq!(e.payload_digest_str(), Some("sha256:abc"));
    assert_eq!(e.provider_handle_str(), Some("psp-1"));
}

/// The status a call was answered with, and where a redirect took it, are part of the record:
/// the retry attempt's record (which knows neither) and its transport call's are one effect
/// with both; two calls of one key answered differently are two things to reconcile.
#[tokio::test]
async fn the_answered_status_and_a_redirect_are_kept_and_told_apart() {
    use cancel_scope::{EffectRecord, Receipt};
    let s = Scope::new();
    let spec = ChildSpec::idempotent("put", "order-42");
    let attempt = s.register(spec.clone()).unwrap().dispatch().unwrap();
    let call = s.register(spec.clone()).unwrap().dispatch().unwrap();
    let again = s.register(spec).unwrap().dispatch().unwrap();
    call.finish(Receipt::EffectUnknown(
        EffectRecord::new("order-42")
            .status("HTTP 503")
            .redirected_to("http://orders-2/orders/42"),
    ));
    again.finish(Receipt::EffectUnknown(
        EffectRecord::new("order-42").status("HTTP 500"),
    ));
    drop(attempt);
    s.close();
    let r = s.quiesce().await;
    assert_eq!(r.effect_unknown(), 3, "{r:?}");
    let listed: Vec<_> = r
        .pending_effects()
        .iter()
        .map(|e| (e.status_str(), e.redirected_to_str()))
        .collect();
    assert_eq!(
        listed,
        [
            (Some("HTTP 503"), Some("http://orders-2/orders/42")),
            (Some("HTTP 500"), None)
        ],
        "{r:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn orphan_work_and_cancel_to_quiet_are_measured_from_the_cancel() {
    let s = Scope::new();
    let a = s
        .register(ChildSpec::read_only("a"))
        .unwrap()
        .dispatch()
        .unwrap();
    let b = s
        .register(ChildSpec::read_only("b"))
        .unwrap()
        .dispatch()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    s.cancel();
    tokio::time::sleep(Duration::from_millis(10)).await;
    a.succeed();
    tokio::time::sleep(Duration::from_millis(20)).await;
    b.finish(cancel_scope::Receipt::Cancelled);
    let r = s.quiesce().await;
    assert_eq!(r.orphan_work(), Duration::from_millis(10 + 30));
    assert_eq!(r.cancel_to_quiet(), Some(Duration::from_millis(30)));
}

/// Orphan work counts how long a child ran after the cancel: a shielded cleanup started 100 ms
/// after the cancel that runs 10 ms adds 10 ms, not 110 ms.
// regression: a child started after the cancel was counted from the cancel, not from its start.
#[tokio::test(start_paused = true)]
async fn orphan_work_of_a_shield_started_after_the_cancel_counts_from_its_start() {
    let s = Scope::new();
    let hold = s.tether(()).unwrap();
    s.cancel();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cleanup = s
        .shield(Duration::from_millis(50), async {
            tokio::time::sleep(Duration::from_millis(10)).await;
        })
        .unwrap();
    cleanup.await.unwrap();
    drop(hold);
    let r = s.quiesce().await;
    assert_eq!(r.succeeded(), 1);
    assert_eq!(r.orphan_work(), Duration::from_millis(10), "{r}");
    assert_eq!(r.cancel_to_quiet(), Some(Duration::from_millis(110)));
}

/// The same for a shield that the grace period after the cancel quarantines: it ran from its
/// start to the quarantine.
#[tokio::test(start_paused = true)]
async fn orphan_work_of_a_quarantined_shield_counts_from_its_start() {
    let s = Scope::new();
    let hold = s.tether(()).unwrap();
    s.cancel();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let cleanup = s
        .shield(Duration::from_secs(10), std::future::pending::<()>())
        .unwrap();
    drop(hold);
    let r = s.quiesce().await;
    assert_eq!(r.quarantined(), 1);
    assert!(cleanup.await.unwrap_err().is_cancelled());
    let ran = r.cancel_to_quiet().unwrap() - Duration::from_millis(400);
    assert_eq!(r.orphan_work(), ran, "{r}");
}

/// A retry attempt and the call inside it both end `EffectUnknown` for one effect: the report
/// lists the effect once, with what either record knew, and counts both receipts.
#[tokio::test(start_paused = true)]
async fn one_effect_left_unknown_by_an_attempt_and_the_call_inside_it_is_listed_once() {
    use cancel_scope::retry::{Decision, Retry};
    let request = Scope::with_timeout(Duration::from_millis(100));
    let spec = ChildSpec::side_effecting("charge", "payment-7");
    let call = spec.clone().payload_digest("sha256:abc");
    let err = Retry::new(|_: &()| Decision::Backoff)
        .run(&request, spec, |attempt| {
            let call = call.clone();
            async move {
                // The transport sends the call in the attempt's scope; the deadline stops it
                // before an answer comes.
                let _sent = attempt.scope().register(call).unwrap().dispatch().unwrap();
                std::future::pending::<Result<(), ()>>().await
            }
        })
        .await
        .unwrap_err();
    assert_eq!(
        err.ledger().started(),
        1,
        "side-effecting work is never retried"
    );
    let report = request.quiesce().await;
    assert_eq!(report.effect_unknown(), 2, "{report:?}");
    assert_eq!(report.pending_effects().len(), 1, "{report:?}");
    let effect = &report.pending_effects()[0];
    assert_eq!(effect.effect_id(), "payment-7");
    assert_eq!(effect.payload_digest_str(), Some("sha256:abc"));
    assert_eq!(report.state(), Lifecycle::NeedsReconciliation);
}

/// A quarantined child is listed with the provider handle set on its `Dispatched`.
// regression: it was listed with its registration-time spec, the provider handle lost.
#[tokio::test(start_paused = true)]
async fn a_quarantined_child_keeps_its_provider_handle() {
    let s = Scope::new();
    let mut d = s
        .register(ChildSpec::side_effecting("pay", "p-1"))
        .unwrap()
        .dispatch()
        .unwrap();
    d.set_provider_handle("psp-7");
    s.cancel();
    let r = s.quiesce().await; // grace 1 s, then quarantine
    assert_eq!(r.quarantined(), 1);
    assert_eq!(r.pending_effects().len(), 1);
    let handle = r.pending_effects()[0]
        .provider_handle_str()
        .map(str::to_owned);
    drop(d);
    assert_eq!(
        handle.as_deref(),
        Some("psp-7"),
        "provider handle lost on quarantine"
    );
}

/// `Dispatched::finish(Receipt::Quarantined)` of side-effecting work is counted and listed, and
/// the report needs reconciliation.
// regression: it was counted but not listed, and the report said `CancelledStable`.
#[tokio::test]
async fn a_quarantined_receipt_given_by_the_owner_is_listed() {
    let s = Scope::new();
    let d = s
        .register(ChildSpec::side_effecting("pay", "p-1"))
        .unwrap()
        .dispatch()
        .unwrap();
    s.cancel();
    d.finish(Receipt::Quarantined);
    let r = s.quiesce().await;
    assert_eq!(r.quarantined(), 1);
    assert_eq!(r.quarantined_children().len(), 1, "count and list disagree");
    assert_eq!(
        r.state(),
        Lifecycle::NeedsReconciliation,
        "unknown effect counted as none"
    );
}

/// Orphan work counts dispatched children only: a ticket never dispatched ran nothing.
// regression: orphan work counted never-dispatched tickets.
#[tokio::test(start_paused = true)]
async fn orphan_work_counts_only_dispatched_children() {
    let s = Scope::new();
    let t = s.register(ChildSpec::read_only("never-sent")).unwrap();
    s.cancel();
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(t);
    assert_eq!(
        s.quiesce().await.orphan_work(),
        Duration::ZERO,
        "nothing ran, yet orphan work > 0"
    );
}
