//! Durable intents around dispatches, with the in-memory store, through the public
//! `Scope::register` / `Ticket::dispatch` path, on virtual time.

use std::sync::Arc;
use std::time::Duration;

use cancel_scope::reconcile::{
    EffectClass, InMemoryIntents, Intent, IntentError, IntentRecord, IntentStore, Journal,
    Journaled, Reconciler, Resolution, Resolved,
};
use cancel_scope::registry::BoxFuture;
use cancel_scope::{ChildSpec, EffectRecord, Lifecycle, Receipt, Scope};
use tokio::sync::{Notify, Semaphore};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn journal() -> (Arc<InMemoryIntents>, Journal) {
    let store = Arc::new(InMemoryIntents::new());
    (store.clone(), Journal::new(store))
}

async fn intent(store: &dyn IntentStore, id: &str) -> IntentRecord {
    store.get(id).await.unwrap().expect("an intent")
}

/// Registers a side-effecting child `pay` with effect id `id` under `scope` and dispatches it
/// through `journal`.
async fn pay(journal: &Journal, scope: &Scope, id: &str) -> Result<Journaled, IntentError> {
    let ticket = scope
        .register(ChildSpec::side_effecting("pay", id))
        .unwrap();
    journal.dispatch(ticket, None).await
}

#[test]
fn reconcile_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Journal>();
    send_sync::<cancel_scope::reconcile::Journaled>();
    send_sync::<Reconciler>();
    send_sync::<InMemoryIntents>();
    send_sync::<Arc<dyn IntentStore>>();
    send_sync::<IntentError>();
    send_sync::<IntentRecord>();
}

#[tokio::test(start_paused = true)]
async fn the_intent_is_pending_while_the_call_runs_and_resolved_by_its_success() {
    let (store, journal) = journal();
    let scope = Scope::with_timeout(ms(1000));
    let spec = ChildSpec::side_effecting("charge-card", "pay-7").payload_digest("sha256:ab12");
    let mut call = journal
        .dispatch(scope.register(spec).unwrap(), Some("checkout-7f3a"))
        .await
        .unwrap();
    assert!(call.is_journaled());

    let rec = intent(&*store, "pay-7").await;
    assert!(rec.is_pending());
    let i = rec.intent();
    assert_eq!(
        (
            i.name(),
            i.class(),
            i.payload_digest_str(),
            i.operation_id()
        ),
        (
            "charge-card",
            EffectClass::SideEffecting,
            Some("sha256:ab12"),
            Some("checkout-7f3a")
        )
    );

    call.set_provider_handle("psp-42");
    call.succeed().await.unwrap();
    let rec = intent(&*store, "pay-7").await;
    assert_eq!(rec.resolution(), Some(Resolution::Applied));
    assert_eq!(rec.intent().provider_handle_str(), Some("psp-42"));
    scope.close();
    assert_eq!(scope.quiesce().await.state(), Lifecycle::Completed);
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_after_dispatch_leaves_a_pending_intent_that_is_resolved_once() {
    let (store, journal) = journal();
    let scope = Scope::with_timeout(ms(1000));
    let spec = ChildSpec::side_effecting("charge-card", "pay-7");
    let call = journal
        .dispatch(scope.register(spec).unwrap(), Some("op-1"))
        .await
        .unwrap();
    drop(call); // sent, then nothing more is known

    scope.close();
    let report = scope.quiesce().await;
    assert_eq!(report.state(), Lifecycle::NeedsReconciliation);
    assert_eq!(report.pending_effects()[0].effect_id(), "pay-7");

    let reconciler = Reconciler::new(store.clone());
    let pending = reconciler.pending(Duration::ZERO, 10).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].intent().effect_id(), "pay-7");
    assert_eq!(
        reconciler
            .resolve("pay-7", Resolution::Applied)
            .await
            .unwrap(),
        Resolved::Now
    );
    assert_eq!(
        reconciler
            .resolve("pay-7", Resolution::NotApplied)
            .await
            .unwrap(),
        Resolved::Already(Resolution::Applied)
    );
    assert!(reconciler
        .pending(Duration::ZERO, 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        intent(&*store, "pay-7").await.resolution(),
        Some(Resolution::Applied)
    );
}

#[tokio::test(start_paused = true)]
async fn receipts_resolve_the_intent_as_they_say() {
    let (store, journal) = journal();
    let scope = Scope::with_timeout(ms(1000));
    let run = |effect_id: &'static str| {
        let journal = journal.clone();
        let scope = scope.clone();
        async move {
            let spec = ChildSpec::side_effecting("write", effect_id);
            journal
                .dispatch(scope.register(spec).unwrap(), None)
                .await
                .unwrap()
        }
    };
    run("failed").await.fail().await.unwrap();
    run("cancelled")
        .await
        .finish(Receipt::Cancelled)
        .await
        .unwrap();
    run("unknown")
        .await
        .finish(Receipt::EffectUnknown(
            EffectRecord::new("unknown").provider_handle("psp-9"),
        ))
        .await
        .unwrap();
    run("quarantined")
        .await
        .finish(Receipt::Quarantined)
        .await
        .unwrap();

    for (id, resolution) in [
        ("failed", Some(Resolution::NotApplied)),
        ("cancelled", Some(Resolution::NotApplied)),
        ("unknown", None),
        ("quarantined", None),
    ] {
        assert_eq!(intent(&*store, id).await.resolution(), resolution, "{id}");
    }
    assert_eq!(
        intent(&*store, "unknown")
            .await
            .intent()
            .provider_handle_str(),
        Some("psp-9")
    );
}

/// An in-memory store whose `record` writes, then waits for the test to let it answer: the
/// window between the intent being written and the dispatch.
#[derive(Debug)]
struct Gated {
    inner: InMemoryIntents,
    written: Notify,
    gate: Semaphore,
}

impl Gated {
    fn new() -> Arc<Gated> {
        Arc::new(Gated {
            inner: InMemoryIntents::new(),
            written: Notify::new(),
            gate: Semaphore::new(0),
        })
    }
}

impl IntentStore for Gated {
    fn record<'a>(&'a self, intent: &'a Intent) -> BoxFuture<'a, Result<(), IntentError>> {
        Box::pin(async move {
            self.inner.record(intent).await?;
            self.written.notify_one();
            let _permit = self.gate.acquire().await;
            Ok(())
        })
    }
    fn note_provider_handle<'a>(
        &'a self,
        effect_id: &'a str,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<(), IntentError>> {
        self.inner.note_provider_handle(effect_id, handle)
    }
    fn resolve<'a>(
        &'a self,
        effect_id: &'a str,
        resolution: Resolution,
        provider_handle: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Resolved, IntentError>> {
        self.inner.resolve(effect_id, resolution, provider_handle)
    }
    fn pending<'a>(
        &'a self,
        older_than: Duration,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<IntentRecord>, IntentError>> {
        self.inner.pending(older_than, limit)
    }
    fn get<'a>(
        &'a self,
        effect_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<IntentRecord>, IntentError>> {
        self.inner.get(effect_id)
    }
}

#[tokio::test(start_paused = true)]
async fn a_cancel_while_the_intent_is_written_dispatches_nothing_and_resolves_it_not_applied() {
    let store = Gated::new();
    let journal = Journal::new(store.clone());
    let scope = Scope::with_timeout(ms(1000));
    let ticket = scope
        .register(ChildSpec::side_effecting("pay", "pay-1"))
        .unwrap();
    let dispatch = tokio::spawn({
        let journal = journal.clone();
        async move { journal.dispatch(ticket, None).await }
    });
    store.written.notified().await;
    assert!(intent(&*store, "pay-1").await.is_pending());

    scope.cancel_with("client gone");
    let err = dispatch.await.unwrap().unwrap_err();
    assert!(err.is_refused());
    assert_eq!(
        err.refusal().unwrap().cause().unwrap().reason(),
        Some("client gone")
    );
    assert_eq!(
        intent(&*store, "pay-1").await.resolution(),
        Some(Resolution::NotApplied)
    );
    let report = scope.quiesce().await;
    assert_eq!(report.state(), Lifecycle::CancelledStable);
    assert_eq!(report.cancelled(), 1); // the ticket: never dispatched
}

/// Dispatches a child of `spec` under `scope` through a journal on a store that never
/// answers a write; returns the journal's error.
async fn dispatch_on_a_hung_store(
    store: &Arc<Gated>,
    timeout: Duration,
    scope: &Scope,
    spec: ChildSpec,
) -> IntentError {
    let journal = Journal::new(store.clone()).timeout(timeout);
    let ticket = scope.register(spec).unwrap();
    journal.dispatch(ticket, None).await.unwrap_err()
}

#[tokio::test(start_paused = true)]
async fn a_deadline_that_passes_while_the_intent_is_written_dispatches_nothing() {
    let store = Gated::new();
    let scope = Scope::with_timeout(ms(100));
    let spec = ChildSpec::idempotent("put", "order-1");
    let err = dispatch_on_a_hung_store(&store, ms(5000), &scope, spec).await;
    assert!(err.is_refused() && err.refusal().unwrap().is_deadline_exceeded());
    assert_eq!(
        intent(&*store, "order-1").await.resolution(),
        Some(Resolution::NotApplied)
    );
    assert_eq!(scope.quiesce().await.state(), Lifecycle::CancelledStable);
}

#[tokio::test(start_paused = true)]
async fn a_store_that_does_not_answer_in_time_stops_the_dispatch() {
    let store = Gated::new();
    let scope = Scope::with_timeout(ms(1000));
    let spec = ChildSpec::side_effecting("pay", "pay-1");
    let err = dispatch_on_a_hung_store(&store, ms(50), &scope, spec).await;
    assert!(err.is_timeout() && err.is_fault() && !err.is_refused());
    scope.close();
    let report = scope.quiesce().await;
    assert_eq!(report.state(), Lifecycle::Completed);
    assert_eq!((report.cancelled(), report.effect_unknown()), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn a_full_store_refuses_the_intent_and_nothing_is_dispatched() {
    let store = Arc::new(InMemoryIntents::new().max(1));
    let journal = Journal::new(store.clone());
    let scope = Scope::with_timeout(ms(1000));
    let first = pay(&journal, &scope, "pay-1").await.unwrap();
    let err = pay(&journal, &scope, "pay-2").await.unwrap_err();
    assert!(err.is_full());
    assert!(store.get("pay-2").await.unwrap().is_none());

    // Once the first is resolved, its record makes room (a pending one never does).
    first.succeed().await.unwrap();
    let third = pay(&journal, &scope, "pay-3").await.unwrap();
    assert!(store.get("pay-1").await.unwrap().is_none());
    assert_eq!(store.len(), 1);
    drop(third);
}

#[tokio::test(start_paused = true)]
async fn only_the_classes_the_journal_records_get_an_intent() {
    let (store, journal) = journal();
    let journal = journal.record(EffectClass::Idempotent, false);
    let scope = Scope::with_timeout(ms(1000));
    for spec in [
        ChildSpec::read_only("get"),
        ChildSpec::idempotent("put", "order-1"),
    ] {
        let call = journal
            .dispatch(scope.register(spec).unwrap(), None)
            .await
            .unwrap();
        assert!(!call.is_journaled());
        call.succeed().await.unwrap();
    }
    assert!(store.is_empty());
    let call = pay(&journal, &scope, "pay-1").await.unwrap();
    assert!(call.is_journaled());
    call.succeed().await.unwrap();
    assert_eq!(store.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn every_attempt_of_an_idempotent_effect_records_the_same_intent() {
    let (store, journal) = journal();
    let scope = Scope::with_timeout(ms(1000));
    let attempt = || {
        let spec = ChildSpec::idempotent("put-order", "order-42").payload_digest("sha256:1");
        journal.dispatch(scope.register(spec).unwrap(), Some("op-1"))
    };
    drop(attempt().await.unwrap()); // cut off: unknown
    let rec = intent(&*store, "order-42").await;
    assert_eq!((rec.attempts(), rec.is_pending()), (1, true));
    attempt().await.unwrap().succeed().await.unwrap();
    let rec = intent(&*store, "order-42").await;
    assert_eq!(rec.attempts(), 2);
    assert_eq!(rec.resolution(), Some(Resolution::Applied));
    assert_eq!(rec.intent().payload_digest_str(), Some("sha256:1"));
    assert_eq!(store.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_scope_writes_no_intent() {
    let (store, journal) = journal();
    let scope = Scope::with_timeout(ms(1000));
    let ticket = scope
        .register(ChildSpec::side_effecting("pay", "pay-1"))
        .unwrap();
    scope.cancel();
    let err = journal.dispatch(ticket, None).await.unwrap_err();
    assert!(err.refusal().unwrap().is_cancelled());
    assert!(store.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_reconciler_run_resolves_what_it_can_decide() {
    let (store, journal) = journal();
    let scope = Scope::with_timeout(ms(1000));
    for id in ["pay-1", "pay-2", "pay-3"] {
        drop(pay(&journal, &scope, id).await.unwrap()); // unknown outcomes
    }
    let reconciler = Reconciler::new(store.clone());
    let done = reconciler
        .run(Duration::ZERO, 10, |rec| {
            let id = rec.intent().effect_id().to_owned();
            let store = store.clone();
            async move {
                match id.as_str() {
                    // Someone resolved it between the listing and this decision.
                    "pay-1" => {
                        store
                            .resolve("pay-1", Resolution::Applied, None)
                            .await
                            .unwrap();
                        Some(Resolution::Applied)
                    }
                    "pay-2" => Some(Resolution::NotApplied),
                    _ => None,
                }
            }
        })
        .await
        .unwrap();
    assert_eq!(
        (done.resolved(), done.already(), done.undecided()),
        (1, 1, 1)
    );
    let left = reconciler.pending(Duration::ZERO, 10).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].intent().effect_id(), "pay-3");
}

#[tokio::test]
async fn intents_with_fields_a_store_cannot_hold_are_refused() {
    let store = InMemoryIntents::new();
    let long = "x".repeat(cancel_scope::reconcile::MAX_FIELD_LEN + 1);
    for bad in [
        Intent::new("", "n", EffectClass::SideEffecting),
        Intent::new("e", "", EffectClass::SideEffecting),
        Intent::new(long.as_str(), "n", EffectClass::SideEffecting),
        Intent::new("e", "n", EffectClass::SideEffecting).provider_handle(long.as_str()),
    ] {
        assert!(store.record(&bad).await.unwrap_err().is_invalid());
    }
    assert!(store.is_empty());
    let reconciler = Reconciler::new(Arc::new(store));
    assert!(reconciler
        .resolve(&long, Resolution::Applied)
        .await
        .unwrap_err()
        .is_invalid());
}
