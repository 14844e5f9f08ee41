//! The in-process operation registry, the local scope index and `Operations`, on virtual time.

use std::sync::Arc;
use std::time::Duration;

use cancel_scope::registry::{
    CancelOutcome, InProcessRegistry, Join, LocalScopes, OperationId, OperationRegistry,
    Operations, MAX_ID_LEN, MAX_LIFETIME, OPERATION_CANCELLED,
};
use cancel_scope::{Cause, Scope};
use tokio::time::{advance, Instant};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn id(s: &str) -> OperationId {
    OperationId::new(s).unwrap()
}

fn ops() -> (Arc<InProcessRegistry>, Operations) {
    let registry = Arc::new(InProcessRegistry::new());
    (registry.clone(), Operations::new(registry))
}

#[test]
fn registry_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<InProcessRegistry>();
    send_sync::<Arc<dyn OperationRegistry>>();
    send_sync::<Operations>();
    send_sync::<LocalScopes>();
    send_sync::<OperationId>();
    send_sync::<cancel_scope::registry::RegistryError>();
    send_sync::<cancel_scope::registry::JoinError>();
    send_sync::<cancel_scope::registry::Joined>();
}

#[tokio::test(start_paused = true)]
async fn a_second_begin_never_lengthens_an_operation() {
    let registry = InProcessRegistry::new();
    let op = id("op-1");
    let first = registry.begin(&op, ms(1000)).await.unwrap();
    assert!(first.created());
    assert_eq!(first.state().remaining(), ms(1000));

    advance(ms(400)).await;
    let again = registry.begin(&op, ms(5000)).await.unwrap();
    assert!(!again.created());
    assert_eq!(again.state().remaining(), ms(600));
    assert_eq!(registry.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_retry_under_the_edges_id_gets_only_what_the_operation_has_left() {
    let (_, ops) = ops();
    let op = OperationId::random();
    let start = Instant::now();
    let edge = ops
        .join(Join::new(op.clone(), ms(2000)).create(true))
        .await
        .unwrap();
    assert!(edge.created());
    assert_eq!(edge.deadline(), start + ms(2000));

    // The client gave up at 1.5 s and retries under the same id, asking for 30 s; a trusted
    // hop may create, but the operation exists: it is continued, not lengthened.
    advance(ms(1500)).await;
    let retry = ops
        .join(Join::new(op.clone(), ms(30_000)).create(true).generation(0))
        .await
        .unwrap();
    assert!(!retry.created());
    assert_eq!(retry.deadline(), start + ms(2000));
    assert_eq!(retry.remaining(), ms(500));
    assert_eq!(retry.generation(), 0);

    // Past its deadline the operation is gone; an untrusted retry cannot bring it back.
    advance(ms(500)).await;
    let late = ops.join(Join::new(op, ms(30_000))).await.unwrap_err();
    assert!(late.is_unknown());
    assert_eq!(ops.counts().created(), 1);
    assert_eq!(ops.counts().joined(), 2);
    assert_eq!(ops.counts().unknown(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_untrusted_caller_cannot_create_an_operation() {
    let (registry, ops) = ops();
    let victim = id("victim-op");
    let err = ops
        .join(Join::new(victim.clone(), ms(1)))
        .await
        .unwrap_err();
    assert!(err.is_unknown() && !err.is_refused() && !err.is_fault());
    assert!(registry.is_empty());

    // The real owner still begins it with its own budget.
    let owner = ops
        .join(Join::new(victim, ms(2000)).create(true))
        .await
        .unwrap();
    assert!(owner.created());
    assert_eq!(owner.remaining(), ms(2000));
}

#[tokio::test(start_paused = true)]
async fn an_entry_read_after_its_deadline_is_gone_and_removed() {
    let registry = InProcessRegistry::new();
    let op = id("op-1");
    registry.begin(&op, ms(100)).await.unwrap();
    advance(ms(99)).await;
    assert_eq!(registry.get(&op).await.unwrap().unwrap().remaining(), ms(1));
    advance(ms(1)).await;
    assert_eq!(registry.len(), 1); // not swept yet
    assert!(registry.get(&op).await.unwrap().is_none());
    assert_eq!(registry.len(), 0); // the read removed it
}

#[tokio::test(start_paused = true)]
async fn every_begin_sweeps_out_the_expired_entries() {
    let registry = InProcessRegistry::new();
    for i in 1..=10u64 {
        registry
            .begin(&id(&format!("op-{i}")), ms(100 * i))
            .await
            .unwrap();
    }
    advance(ms(550)).await;
    assert_eq!(registry.len(), 10);
    registry.begin(&id("new"), ms(100)).await.unwrap();
    // op-1..op-5 are gone, op-6..op-10 and the new one stay.
    assert_eq!(registry.len(), 6);
    assert!(registry.get(&id("op-5")).await.unwrap().is_none());
    assert_eq!(
        registry
            .get(&id("op-6"))
            .await
            .unwrap()
            .unwrap()
            .remaining(),
        ms(50)
    );
    advance(ms(1000)).await;
    assert_eq!(registry.sweep(), 6);
    assert!(registry.is_empty());
}

#[tokio::test(start_paused = true)]
async fn at_the_bound_a_new_operation_is_a_fault_and_the_held_ones_still_answer() {
    let registry = Arc::new(InProcessRegistry::new().max_entries(2));
    let ops = Operations::new(registry.clone());
    ops.join(Join::new(id("a"), ms(100)).create(true))
        .await
        .unwrap();
    ops.join(Join::new(id("b"), ms(300)).create(true))
        .await
        .unwrap();

    let full = ops
        .join(Join::new(id("c"), ms(100)).create(true))
        .await
        .unwrap_err();
    assert!(full.is_fault() && full.fault().unwrap().is_full());
    assert_eq!(ops.counts().faults(), 1);
    // Nothing was evicted: both held operations answer, and can be cancelled.
    assert_eq!(
        ops.join(Join::new(id("a"), ms(1000)))
            .await
            .unwrap()
            .remaining(),
        ms(100)
    );
    assert!(matches!(
        ops.cancel(&id("b")).await.unwrap(),
        CancelOutcome::Cancelled(_)
    ));
    assert!(registry
        .begin(&id("c"), ms(100))
        .await
        .unwrap_err()
        .is_full());

    // Once `a` expires there is room again; the cancelled `b` is kept until its deadline.
    advance(ms(100)).await;
    assert!(registry.begin(&id("c"), ms(100)).await.unwrap().created());
    assert!(registry
        .get(&id("b"))
        .await
        .unwrap()
        .unwrap()
        .is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn a_budget_too_short_to_begin_with_is_refused_and_a_huge_one_is_shortened() {
    let registry = InProcessRegistry::new();
    let err = registry.begin(&id("a"), Duration::from_micros(999)).await;
    assert!(err.unwrap_err().is_invalid());
    assert!(registry.is_empty());
    let huge = registry.begin(&id("b"), Duration::MAX).await.unwrap();
    assert_eq!(huge.state().remaining(), MAX_LIFETIME);

    let (_, ops) = ops();
    let err = ops
        .join(Join::new(id("c"), Duration::ZERO).create(true))
        .await
        .unwrap_err();
    assert!(err.is_fault() && err.fault().unwrap().is_invalid());
}

#[tokio::test(start_paused = true)]
async fn a_cancel_bumps_the_generation_once_and_refuses_the_operations_requests() {
    let (registry, ops) = ops();
    let op = id("op-1");
    ops.join(Join::new(op.clone(), ms(1000)).create(true))
        .await
        .unwrap();
    let outcome = ops.cancel(&op).await.unwrap();
    let state = outcome.state().unwrap();
    assert!(matches!(outcome, CancelOutcome::Cancelled(_)));
    assert_eq!((state.generation(), state.is_cancelled()), (1, true));
    let again = ops.cancel(&op).await.unwrap();
    assert!(matches!(again, CancelOutcome::AlreadyCancelled(s) if s.generation() == 1));

    for join in [
        Join::new(op.clone(), ms(1000)),
        Join::new(op.clone(), ms(1000)).generation(0),
        Join::new(op.clone(), ms(1000)).generation(1).create(true),
    ] {
        let err = ops.join(join).await.unwrap_err();
        assert!(err.is_cancelled() && err.is_refused(), "{err:?}");
    }
    assert_eq!(ops.counts().refused(), 3);
    // Refused by the local record, before the registry: the registry still says generation 1.
    assert_eq!(registry.get(&op).await.unwrap().unwrap().generation(), 1);

    assert!(registry.get(&op).await.unwrap().unwrap().is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn a_request_of_another_generation_is_refused() {
    let (_, ops) = ops();
    let op = id("op-1");
    ops.join(Join::new(op.clone(), ms(1000)).create(true))
        .await
        .unwrap();
    let ahead = ops
        .join(Join::new(op.clone(), ms(1000)).generation(4))
        .await
        .unwrap_err();
    assert!(ahead.is_stale_generation() && ahead.is_refused());
    assert_eq!(ahead.generation(), Some(0));
    // Generation 0 is the operation's: admitted.
    ops.join(Join::new(op, ms(1000)).generation(0))
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_cancel_stops_every_local_scope_of_the_operation_and_no_other() {
    let (_, ops) = ops();
    let (a, b) = (id("op-a"), id("op-b"));
    let first = Scope::with_timeout(ms(1000));
    let second = Scope::with_timeout(ms(1000));
    let handler = second.child().build().unwrap();
    let unrelated = Scope::with_timeout(ms(1000));
    ops.attach(&a, &first).unwrap();
    ops.attach(&a, &second).unwrap();
    ops.attach(&b, &unrelated).unwrap();

    ops.cancel(&a).await.unwrap(); // unknown to the registry: local scopes stop all the same
    assert_eq!(first.cause(), Some(Cause::cancelled(OPERATION_CANCELLED)));
    assert!(second.is_cancelled() && handler.is_cancelled());
    assert!(!unrelated.is_cancelled());
    assert_eq!(ops.registry().scopes().live(&a), 0);
    assert_eq!(ops.registry().scopes().live(&b), 1);
}

#[tokio::test(start_paused = true)]
async fn a_scope_attached_after_the_cancel_is_cancelled_at_once() {
    let (_, ops) = ops();
    let op = id("op-1");
    ops.join(Join::new(op.clone(), ms(1000)).create(true))
        .await
        .unwrap();
    ops.cancel(&op).await.unwrap();
    let late = Scope::with_timeout(ms(1000));
    let err = ops.attach(&op, &late).unwrap_err();
    assert!(err.is_cancelled());
    assert_eq!(late.cause(), Some(Cause::cancelled(OPERATION_CANCELLED)));
    assert!(ops.check(&op).unwrap_err().is_refused());
}

#[test]
fn the_index_does_not_keep_a_scope_alive() {
    let scopes = LocalScopes::new();
    let op = id("op-1");
    let request = Scope::new();
    let child = request.child().build().unwrap();
    let freed = request.__freed_probe();
    scopes.attach(&op, &request).unwrap();
    drop(request);
    // The child keeps its parent's node linked (a cancel must still reach the child).
    assert!(!freed());
    assert_eq!(scopes.live(&op), 1);
    assert_eq!(scopes.cancel(&op, None), 1);
    assert!(child.is_cancelled());
    drop(child);
    assert!(freed());
    assert_eq!(scopes.live(&op), 0);
}

#[test]
fn a_quiet_scope_leaves_the_index() {
    let scopes = LocalScopes::new();
    let op = id("op-1");
    let request = Scope::new();
    scopes.attach(&op, &request).unwrap();
    assert_eq!(scopes.live(&op), 1);
    request.close(); // no work: quiet, for good
    assert_eq!(scopes.live(&op), 0);
    assert_eq!(scopes.sweep(), 0);
    assert_eq!(scopes.cancel(&op, None), 0);
    assert!(!request.is_cancelled());
}

#[test]
fn the_index_stays_flat_under_many_short_lived_scopes() {
    let scopes = LocalScopes::new();
    let keep: Vec<Scope> = (0..100).map(|_| Scope::new()).collect();
    for (i, s) in keep.iter().enumerate() {
        scopes.attach(&id(&format!("long-{i}")), s).unwrap();
    }
    for i in 0..100_000 {
        let request = Scope::new();
        scopes
            .attach(&id(&format!("short-{}", i % 1000)), &request)
            .unwrap();
        // At most about twice the live scopes, plus 64.
        assert!(
            scopes.entries() <= 2 * 101 + 64,
            "{} entries",
            scopes.entries()
        );
    }
    assert_eq!(scopes.sweep(), 100);
    assert_eq!(scopes.operations().len(), 100);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_operation_is_remembered_until_its_deadline() {
    let (_, ops) = ops();
    let op = id("op-1");
    ops.join(Join::new(op.clone(), ms(1000)).create(true))
        .await
        .unwrap();
    advance(ms(200)).await;
    ops.cancel(&op).await.unwrap();
    let scopes = ops.registry().scopes();
    assert_eq!(scopes.closed(), 1);
    advance(ms(799)).await;
    assert!(scopes.check(&op).is_err());
    advance(ms(1)).await;
    assert!(scopes.check(&op).is_ok());
    assert_eq!(scopes.closed(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_record_of_cancelled_operations_is_bounded() {
    let scopes = LocalScopes::new().max_closed(2);
    let now = Instant::now();
    scopes.cancel(&id("a"), Some(now + ms(300)));
    scopes.cancel(&id("b"), Some(now + ms(100)));
    scopes.cancel(&id("c"), Some(now + ms(200)));
    assert_eq!(scopes.closed(), 2);
    // The one due to be forgotten first went.
    assert!(scopes.check(&id("b")).is_ok());
    assert!(scopes.check(&id("a")).is_err() && scopes.check(&id("c")).is_err());

    // Without a known deadline: the latest of the attached scopes', else the default life.
    let unbounded = LocalScopes::new().closed_life(ms(50));
    let request = Scope::with_timeout(ms(400));
    unbounded.attach(&id("x"), &request).unwrap();
    unbounded.cancel(&id("x"), None);
    unbounded.cancel(&id("y"), None);
    advance(ms(50)).await;
    assert!(unbounded.check(&id("y")).is_ok());
    assert!(unbounded.check(&id("x")).is_err());
    advance(ms(350)).await;
    assert!(unbounded.check(&id("x")).is_ok());
}

#[test]
fn operation_ids_are_validated_and_random_ones_are_128_bits() {
    for bad in ["", "a\nb", "tab\there", "é", "\u{7f}"] {
        assert!(OperationId::new(bad).unwrap_err().is_invalid(), "{bad:?}");
    }
    assert!(OperationId::new("a".repeat(MAX_ID_LEN + 1)).is_err());
    assert!(OperationId::new("with space and ~!").is_ok());
    let ids: std::collections::HashSet<_> = (0..1000).map(|_| OperationId::random()).collect();
    assert_eq!(ids.len(), 1000);
    for id in &ids {
        assert_eq!(id.as_str().len(), 32);
        assert!(id
            .as_str()
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    }
}

/// Ids drawn from several threads' pools of random bits (each refilled many times) never
/// repeat, and use every hex digit in every position about as often (no byte of a pool is
/// handed out twice, none left zero).
#[test]
fn random_ids_from_many_threads_never_repeat() {
    let per_thread = 20_000;
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                (0..per_thread)
                    .map(|_| OperationId::random())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let ids: Vec<OperationId> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let distinct: std::collections::HashSet<&str> = ids.iter().map(OperationId::as_str).collect();
    assert_eq!(distinct.len(), ids.len());
    // A zeroed (reused) pool would show as a run of '0' digits: each position is '0' in about
    // one id in 16.
    for pos in 0..32 {
        let zeros = ids
            .iter()
            .filter(|id| id.as_str().as_bytes()[pos] == b'0')
            .count();
        let expected = ids.len() / 16;
        assert!(
            zeros < expected * 2,
            "position {pos}: {zeros} zeros of {} ids",
            ids.len()
        );
    }
}
