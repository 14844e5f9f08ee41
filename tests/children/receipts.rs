//! Registration, dispatch and receipts: exactly one terminal receipt per child, on every path.

use std::time::Duration;

use cancel_scope::{ChildSpec, EffectRecord, Lifecycle, Receipt, Scope};

#[tokio::test]
async fn each_explicit_receipt_is_counted_once() {
    let s = Scope::new();
    let ok = s
        .register(ChildSpec::read_only("a"))
        .unwrap()
        .dispatch()
        .unwrap();
    let bad = s
        .register(ChildSpec::read_only("b"))
        .unwrap()
        .dispatch()
        .unwrap();
    let gone = s
        .register(ChildSpec::read_only("c"))
        .unwrap()
        .dispatch()
        .unwrap();
    let unknown = s
        .register(ChildSpec::side_effecting("d", "pay-1"))
        .unwrap()
        .dispatch()
        .unwrap();
    ok.succeed();
    bad.fail();
    gone.finish(Receipt::Cancelled);
    unknown.finish(Receipt::EffectUnknown(
        EffectRecord::new("pay-1").provider_handle("psp-9"),
    ));
    s.close();
    let r = s.quiesce().await;
    assert_eq!(
        (
            r.succeeded(),
            r.failed(),
            r.cancelled(),
            r.effect_unknown(),
            r.total()
        ),
        (1, 1, 1, 1, 4)
    );
    assert_eq!(
        r.pending_effects(),
        [EffectRecord::new("pay-1").provider_handle("psp-9")]
    );
    assert_eq!(r.state(), Lifecycle::NeedsReconciliation);
}

#[tokio::test]
async fn a_dropped_ticket_records_cancelled_even_for_side_effects() {
    // Registration comes first: a ticket that was never dispatched sent nothing.
    let s = Scope::new();
    drop(s.register(ChildSpec::side_effecting("w", "e-1")).unwrap());
    drop(s.register(ChildSpec::read_only("r")).unwrap());
    s.close();
    let r = s.quiesce().await;
    assert_eq!((r.cancelled(), r.effect_unknown()), (2, 0));
    assert_eq!(r.state(), Lifecycle::Completed);
}

#[tokio::test]
async fn a_dropped_dispatched_child_records_cancelled_or_effect_unknown() {
    let s = Scope::new();
    drop(
        s.register(ChildSpec::read_only("r"))
            .unwrap()
            .dispatch()
            .unwrap(),
    );
    let mut w = s
        .register(ChildSpec::side_effecting("w", "e-1").payload_digest("sha256:00"))
        .unwrap()
        .dispatch()
        .unwrap();
    w.set_provider_handle("txn-5");
    drop(w);
    drop(
        s.register(ChildSpec::idempotent("put", "order-7"))
            .unwrap()
            .dispatch()
            .unwrap(),
    );
    s.close();
    let r = s.quiesce().await;
    assert_eq!((r.cancelled(), r.effect_unknown()), (1, 2));
    let ids: Vec<_> = r.pending_effects().iter().map(|e| e.effect_id()).collect();
    assert_eq!(ids, ["e-1", "order-7"]);
    let first = &r.pending_effects()[0];
    assert_eq!(first.payload_digest_str(), Some("sha256:00"));
    assert_eq!(first.provider_handle_str(), Some("txn-5"));
    assert_eq!(r.state(), Lifecycle::NeedsReconciliation);
}

#[tokio::test]
async fn a_panic_while_holding_a_read_only_child_records_failed() {
    let s = Scope::new();
    let d = s
        .register(ChildSpec::read_only("r"))
        .unwrap()
        .dispatch()
        .unwrap();
    let t = std::thread::spawn(move || {
        let _held = d;
        panic!("boom");
    });
    assert!(t.join().is_err());
    s.close();
    assert_eq!(s.quiesce().await.failed(), 1);
}

#[tokio::test]
async fn a_panic_after_dispatching_a_side_effect_records_effect_unknown() {
    let s = Scope::new();
    let d = s
        .register(ChildSpec::side_effecting("w", "e-9"))
        .unwrap()
        .dispatch()
        .unwrap();
    let t = std::thread::spawn(move || {
        let _held = d;
        panic!("boom");
    });
    assert!(t.join().is_err());
    s.close();
    let r = s.quiesce().await;
    assert_eq!(
        r.effect_unknown(),
        1,
        "an unknown effect is never counted as none"
    );
}

#[test]
fn registration_fails_after_cancel_and_dispatch_fails_after_cancel() {
    let s = Scope::new();
    let t = s.register(ChildSpec::read_only("r")).unwrap();
    assert_eq!(t.generation(), 0);
    s.cancel_with("stop");
    let err = t.dispatch().unwrap_err();
    assert_eq!(err.cause().unwrap().reason(), Some("stop"));
    let err = s.register(ChildSpec::read_only("late")).unwrap_err();
    assert!(err.is_cancelled());
}

#[test]
fn dispatch_fails_after_close_and_a_parent_cancel() {
    let s = Scope::new();
    let t = s.register(ChildSpec::read_only("r")).unwrap();
    s.close();
    assert!(t.dispatch().unwrap_err().is_closed());

    let root = Scope::new();
    let child = root.child().build().unwrap();
    let t = child.register(ChildSpec::read_only("r")).unwrap();
    root.cancel();
    assert!(t.dispatch().unwrap_err().is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn a_ticket_records_its_registration_budget() {
    let s = Scope::with_timeout(Duration::from_millis(300));
    let t = s.register(ChildSpec::read_only("r")).unwrap();
    assert_eq!(t.budget(), Some(Duration::from_millis(300)));
    assert_eq!(t.spec().name(), "r");
}

#[tokio::test]
async fn receipts_roll_up_to_every_ancestor() {
    let root = Scope::new();
    let mid = root.child().build().unwrap();
    let leaf = mid.child().build().unwrap();
    leaf.register(ChildSpec::read_only("x"))
        .unwrap()
        .dispatch()
        .unwrap()
        .succeed();
    mid.register(ChildSpec::read_only("y"))
        .unwrap()
        .dispatch()
        .unwrap()
        .fail();
    root.close();
    let r = root.quiesce().await;
    assert_eq!((r.succeeded(), r.failed()), (1, 1));
    let leaf_report = leaf.quiesce().await;
    assert_eq!((leaf_report.succeeded(), leaf_report.failed()), (1, 0));
}
