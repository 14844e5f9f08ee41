//! The report's pending effects: records of one effect id are listed once only when they
//! describe the same effect (what one knows the other does not contradict); records that
//! disagree (two provider handles, two payload digests) are each kept, or what reconciliation
//! needs is lost.

use cancel_scope::{ChildSpec, Lifecycle, Scope};

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
