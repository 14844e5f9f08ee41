//! One retry owner: nested retries of the same dependency do not multiply.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cancel_scope::retry::{Decision, Retry, RetryError, Stop};
use cancel_scope::{ChildSpec, Scope};

use crate::Unavailable;

/// What a layer (SDK, sidecar, business code) returns: the dependency's error, or that the
/// layer below gave up.
#[derive(Debug)]
enum LayerError {
    Leaf,
    Nested,
}

/// Three layers, each "retry 3 times", around a dependency that always fails.
async fn three_layers(request: &Scope, deps: [&'static str; 3], calls: Arc<AtomicU32>) -> u32 {
    let [a, b, c] = deps;
    let _ = Retry::new(|_: &LayerError| Decision::RetryNow)
        .max_attempts(3)
        .run(request, ChildSpec::read_only(a), |attempt| {
            let calls = calls.clone();
            async move {
                retry_layer(attempt.scope(), b, |scope| {
                    let calls = calls.clone();
                    async move {
                        retry_layer(&scope, c, |_| {
                            let calls = calls.clone();
                            async move {
                                calls.fetch_add(1, Ordering::SeqCst);
                                Err(LayerError::Leaf)
                            }
                        })
                        .await
                    }
                })
                .await
            }
        })
        .await;
    calls.load(Ordering::SeqCst)
}

async fn retry_layer<F, Fut>(scope: &Scope, dep: &'static str, mut f: F) -> Result<(), LayerError>
where
    F: FnMut(Scope) -> Fut,
    Fut: std::future::Future<Output = Result<(), LayerError>>,
{
    Retry::new(|_: &LayerError| Decision::RetryNow)
        .max_attempts(3)
        .run(scope, ChildSpec::read_only(dep), |a| f(a.scope().clone()))
        .await
        .map_err(|_: RetryError<LayerError>| LayerError::Nested)
}

#[tokio::test(start_paused = true)]
async fn three_layers_of_three_attempts_make_3_calls_not_27() {
    let request = Scope::with_timeout(Duration::from_secs(60));
    let calls = Arc::new(AtomicU32::new(0));
    let n = three_layers(&request, ["inventory"; 3], calls).await;
    assert_eq!(n, 3);
}

/// The contrast: layers around *different* dependencies each own their retries, as declared.
#[tokio::test(start_paused = true)]
async fn different_dependencies_multiply_as_declared() {
    let request = Scope::with_timeout(Duration::from_secs(60));
    let calls = Arc::new(AtomicU32::new(0));
    let n = three_layers(&request, ["gateway", "orders", "inventory"], calls).await;
    assert_eq!(n, 27);
}

/// The nested calls know they are not the owner, and say so in their ledgers; the owner's
/// ledger has the three attempts.
#[tokio::test(start_paused = true)]
async fn nested_ledgers_are_not_owners() {
    let request = Scope::with_timeout(Duration::from_secs(60));
    let outer = Retry::new(|_: &RetryError<Unavailable>| Decision::RetryNow).max_attempts(3);
    let inner = Retry::new(|_: &Unavailable| Decision::RetryNow).max_attempts(3);
    let nested = std::sync::Mutex::new(Vec::new());
    let err = outer
        .run(&request, ChildSpec::read_only("inventory"), |a| {
            let (inner, nested) = (&inner, &nested);
            async move {
                let (res, ledger) = inner
                    .run_with_ledger(a.scope(), ChildSpec::read_only("inventory"), |_| async {
                        Err::<(), _>(Unavailable)
                    })
                    .await;
                nested.lock().unwrap().push(ledger);
                res
            }
        })
        .await
        .unwrap_err();
    assert!(err.ledger().is_owner());
    assert_eq!(err.ledger().started(), 3);
    let nested = nested.into_inner().unwrap();
    assert_eq!(nested.len(), 3);
    for l in &nested {
        assert!(!l.is_owner());
        assert_eq!((l.max_attempts(), l.started()), (1, 1));
        assert_eq!(l.stop(), Some(&Stop::AttemptsExhausted));
    }
}

/// The owner mark follows the attempt's scope into tasks spawned inside the attempt.
#[tokio::test(start_paused = true)]
async fn ownership_crosses_spawned_tasks() {
    let request = Scope::with_timeout(Duration::from_secs(60));
    let calls = Arc::new(AtomicU32::new(0));
    let outer = Retry::new(|_: &&str| Decision::RetryNow).max_attempts(3);
    let _ = outer
        .run(&request, ChildSpec::read_only("inventory"), |a| {
            let calls = calls.clone();
            async move {
                let task = a
                    .scope()
                    .spawn(async move {
                        Retry::new(|_: &Unavailable| Decision::RetryNow)
                            .max_attempts(3)
                            .run(&Scope::current(), ChildSpec::read_only("inventory"), |_| {
                                calls.fetch_add(1, Ordering::SeqCst);
                                async { Err::<(), _>(Unavailable) }
                            })
                            .await
                    })
                    .unwrap();
                match task.await {
                    Ok(Ok(())) => Ok(()),
                    _ => Err("inventory failed"),
                }
            }
        })
        .await;
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}
