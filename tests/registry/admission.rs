//! Admission with the operation registry (`EndpointPolicy::admit_joined`) on the in-process
//! registry, on virtual time: the registry's term, who may name an operation, cancels and
//! generations, and faults.

use std::sync::Arc;
use std::time::Duration;

use cancel_scope::registry::{
    Begun, BoxFuture, CancelOutcome, InProcessRegistry, LocalScopes, OperationId,
    OperationRegistry, OperationState, Operations, RegistryError, OPERATION_CANCELLED,
};
use cancel_scope::wire::{
    BudgetSource, EndpointPolicy, Incoming, OperationSource, RegistryTerm, Trust,
};
use tokio::time::{advance, Instant};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn ops() -> Operations {
    Operations::new(Arc::new(InProcessRegistry::new()))
}

/// An edge: untrusted callers, at most 2 s.
fn edge() -> EndpointPolicy {
    EndpointPolicy::builder(ms(2000)).build()
}

/// An inner service that trusts its callers' operation ids.
fn inner() -> EndpointPolicy {
    EndpointPolicy::builder(ms(30_000))
        .trust(Trust::Trusted)
        .build()
}

fn budget(rem: u64, op: &str, gen: Option<u64>) -> Incoming {
    let header = match gen {
        Some(g) => format!("v=1, rem={rem}, op=\"{op}\", gen={g}"),
        None => format!("v=1, rem={rem}, op=\"{op}\""),
    };
    Incoming::new().service_budget(header.as_bytes())
}

fn op(id: &str) -> OperationId {
    OperationId::new(id).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_retry_under_the_edges_id_never_gets_more_than_the_operation_has_left() {
    let ops = ops();
    let (_, first) = edge()
        .admit_joined(&ops, Incoming::new(), Instant::now())
        .await
        .unwrap();
    assert_eq!(first.registry(), RegistryTerm::Created);
    assert_eq!(first.operation_source(), OperationSource::Local);
    assert_eq!(first.operation_id().len(), 32);
    let id = first.operation_id().to_owned();

    // The client retries 1.5 s later under the id the edge gave it, asking for 10 s.
    advance(ms(1500)).await;
    let (scope, retry) = edge()
        .admit_joined(&ops, budget(10_000, &id, None), Instant::now())
        .await
        .unwrap();
    assert_eq!(retry.operation_id(), id);
    assert_eq!(retry.operation_source(), OperationSource::Known);
    assert_eq!(retry.registry(), RegistryTerm::Joined);
    assert_eq!(retry.budget_source(), BudgetSource::ServiceBudget);
    assert_eq!(scope.remaining(), Some(ms(500)));
    assert_eq!(retry.initial_remaining(), ms(500));
    assert_eq!(retry.operation_deadline(), Some(retry.deadline()));

    // Without the registry the same retry would get the endpoint's 2 s.
    let (plain, _) = edge()
        .admit(budget(10_000, &id, None), Instant::now())
        .unwrap();
    assert_eq!(plain.remaining(), Some(ms(2000)));

    // A shorter header still wins over the registry.
    let (short, _) = edge()
        .admit_joined(&ops, budget(100, &id, None), Instant::now())
        .await
        .unwrap();
    assert_eq!(short.remaining(), Some(ms(100)));
    assert_eq!(ops.counts().created(), 1);
    assert_eq!(ops.counts().joined(), 3);
}

#[tokio::test(start_paused = true)]
async fn an_untrusted_caller_can_neither_create_an_operation_nor_pick_an_unknown_one() {
    let ops = ops();
    // "victim-op" with 1 ms, to starve its real owner: not created.
    let (_, a) = edge()
        .admit_joined(&ops, budget(1, "victim-op", Some(7)), Instant::now())
        .await
        .unwrap();
    assert_ne!(a.operation_id(), "victim-op");
    assert_eq!(a.operation_source(), OperationSource::Local);
    assert_eq!(a.generation(), 0);
    assert_eq!(a.caller_operation_id(), Some("victim-op"));
    assert!(ops
        .registry()
        .get(&op("victim-op"))
        .await
        .unwrap()
        .is_none());

    // The real owner, a trusted hop, begins it later with its own budget.
    let (owner, _) = inner()
        .admit_joined(&ops, budget(20_000, "victim-op", Some(0)), Instant::now())
        .await
        .unwrap();
    assert_eq!(owner.remaining(), Some(ms(20_000)));

    // An untrusted caller that knows the id now can only shorten its own request.
    let (short, joined) = edge()
        .admit_joined(&ops, budget(5, "victim-op", None), Instant::now())
        .await
        .unwrap();
    assert_eq!(joined.operation_source(), OperationSource::Known);
    assert_eq!(short.remaining(), Some(ms(5)));
    let state = ops.registry().get(&op("victim-op")).await.unwrap().unwrap();
    assert_eq!(state.remaining(), ms(20_000));
    // And its generation is never its own: an untrusted `gen` is not believed.
    let (_, j) = edge()
        .admit_joined(&ops, budget(500, "victim-op", Some(9)), Instant::now())
        .await
        .unwrap();
    assert_eq!(j.generation(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_trusted_caller_begins_its_operation_and_carries_its_generation() {
    let ops = ops();
    let (_, a) = inner()
        .admit_joined(&ops, budget(800, "checkout-7", Some(0)), Instant::now())
        .await
        .unwrap();
    assert_eq!(a.operation_id(), "checkout-7");
    assert_eq!(a.operation_source(), OperationSource::Caller);
    assert_eq!(a.registry(), RegistryTerm::Created);
    advance(ms(300)).await;
    let (scope, b) = inner()
        .admit_joined(&ops, budget(10_000, "checkout-7", Some(0)), Instant::now())
        .await
        .unwrap();
    assert_eq!(b.registry(), RegistryTerm::Joined);
    assert_eq!(scope.remaining(), Some(ms(500)));
    assert_eq!(scope.operation().unwrap().generation(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_stops_the_admitted_scope_and_refuses_the_operations_requests() {
    let ops = ops();
    let (scope, a) = edge()
        .admit_joined(&ops, Incoming::new(), Instant::now())
        .await
        .unwrap();
    let id = op(a.operation_id());
    let outcome = ops.cancel(&id).await.unwrap();
    assert!(matches!(outcome, CancelOutcome::Cancelled(s) if s.generation() == 1));
    assert_eq!(scope.cause().unwrap().reason(), Some(OPERATION_CANCELLED));

    // Its later requests are refused, from trusted and untrusted callers alike.
    for policy in [edge(), inner()] {
        let err = policy
            .admit_joined(&ops, budget(500, id.as_str(), Some(0)), Instant::now())
            .await
            .unwrap_err();
        assert!(err.is_operation_cancelled() && !err.is_invalid(), "{err}");
        assert_eq!(err.public_message(), "operation cancelled");
        assert!(err.operation_error().unwrap().is_cancelled());
    }
}

#[tokio::test(start_paused = true)]
async fn a_budget_the_registry_shortens_below_the_minimum_useful_is_exhausted() {
    let ops = ops();
    let (_, a) = inner()
        .admit_joined(&ops, budget(100, "short-op", None), Instant::now())
        .await
        .unwrap();
    advance(ms(90)).await;
    let policy = inner().to_builder().min_useful(ms(50)).build();
    let err = policy
        .admit_joined(&ops, budget(1000, a.operation_id(), None), Instant::now())
        .await
        .unwrap_err();
    assert!(err.is_budget_exhausted(), "{err}");
}

/// A registry that never answers: a hung store.
#[derive(Debug, Default)]
struct Hung {
    scopes: LocalScopes,
}

impl OperationRegistry for Hung {
    fn begin<'a>(
        &'a self,
        _: &'a OperationId,
        _: Duration,
    ) -> BoxFuture<'a, Result<Begun, RegistryError>> {
        Box::pin(std::future::pending())
    }

    fn get<'a>(
        &'a self,
        _: &'a OperationId,
    ) -> BoxFuture<'a, Result<Option<OperationState>, RegistryError>> {
        Box::pin(std::future::pending())
    }

    fn cancel<'a>(
        &'a self,
        _: &'a OperationId,
    ) -> BoxFuture<'a, Result<CancelOutcome, RegistryError>> {
        Box::pin(std::future::pending())
    }

    fn scopes(&self) -> &LocalScopes {
        &self.scopes
    }
}

#[tokio::test(start_paused = true)]
async fn a_hung_registry_admits_on_the_endpoints_cap_within_its_bound_counted_and_noted() {
    let ops = Operations::new(Arc::new(Hung::default())).timeout(ms(20));
    for (policy, incoming) in [
        (edge(), Incoming::new()),
        (edge(), budget(60_000, "some-op", None)),
        (inner(), budget(60_000, "trusted-op", Some(4))),
    ] {
        let start = Instant::now();
        let (scope, a) = policy
            .admit_joined(&ops, incoming, Instant::now())
            .await
            .unwrap();
        // Bounded by the registry's timeout: 20 ms, taken off the request's budget.
        assert_eq!(start.elapsed(), ms(20));
        assert_eq!(a.registry(), RegistryTerm::Fault);
        assert!(!a.registry().applied());
        assert_eq!(a.operation_deadline(), None);
        let cap = policy.max_budget().min(ms(60_000));
        assert_eq!(a.deadline(), start + cap);
        assert_eq!(scope.remaining(), Some(cap - ms(20)));
        assert_eq!(a.initial_remaining(), cap - ms(20));
        match a.operation_source() {
            // A trusted caller's id and generation are kept.
            OperationSource::Caller => {
                assert_eq!(a.operation_id(), "trusted-op");
                assert_eq!(a.generation(), 4);
            }
            // An untrusted caller's id cannot be checked: never adopted.
            source => {
                assert_eq!(source, OperationSource::Local);
                assert_ne!(a.operation_id(), "some-op");
                assert_eq!(a.generation(), 0);
            }
        }
        scope.close();
        let report = scope.quiesce().await;
        let faults = report.registry_faults();
        assert_eq!(faults.len(), 1);
        assert_eq!(faults[0].operation().as_str(), a.operation_id());
        assert!(
            faults[0].error().contains("did not answer"),
            "{}",
            faults[0]
        );
    }
    assert_eq!(ops.counts().faults(), 3);

    // Never longer than the request's own budget: a 5 ms request waits 5 ms at most, and is
    // then refused as exhausted rather than admitted without time.
    let ops = ops.timeout(ms(100));
    let start = Instant::now();
    let err = edge()
        .admit_joined(&ops, Incoming::new().grpc_timeout(b"5m"), start)
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), ms(5));
    assert!(err.is_budget_exhausted(), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_full_registry_is_a_fault_and_a_local_cancel_still_reaches_the_request() {
    let ops = Operations::new(Arc::new(InProcessRegistry::new().max_entries(1)));
    let _first = edge()
        .admit_joined(&ops, Incoming::new(), Instant::now())
        .await
        .unwrap();
    let (scope, a) = edge()
        .admit_joined(&ops, Incoming::new(), Instant::now())
        .await
        .unwrap();
    assert_eq!(a.registry(), RegistryTerm::Fault);
    assert_eq!(scope.remaining(), Some(ms(2000)));
    assert_eq!(ops.counts().faults(), 1);
    // Attached all the same: the operation's cancel here stops it.
    ops.cancel(&op(a.operation_id())).await.unwrap();
    assert!(scope.is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn bad_input_is_refused_before_the_registry_is_asked() {
    let ops = Operations::new(Arc::new(Hung::default()));
    let start = Instant::now();
    let err = edge()
        .admit_joined(&ops, Incoming::new().grpc_timeout(b"1 hour"), start)
        .await
        .unwrap_err();
    assert!(err.is_invalid());
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(ops.counts().faults(), 0);
}
