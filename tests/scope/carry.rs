//! `CarryScope`: the current scope carried across a bare `tokio::spawn` (or a library's own
//! spawn) without making the moved future work of the scope.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cancel_scope::{CarryScope, Lifecycle, Scope};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);

#[tokio::test(start_paused = true)]
async fn a_bare_spawn_sees_the_carried_scope_and_its_calls_are_bounded_by_it() {
    let request = Scope::with_timeout(100 * MS);
    // Without the adapter, a bare spawn has no current scope.
    let bare = request.run(async {
        tokio::spawn(async { Scope::try_current().is_none() })
            .await
            .unwrap()
    });
    assert!(bare.await.unwrap());

    let start = Instant::now();
    // The task is spawned from the request's body, which returns at once (a body is stopped
    // at the deadline: the spawned task is not).
    let carried = request.run(async {
        Some(tokio::spawn(
            async {
                let inner = Scope::current();
                // Work it starts in the scope stops at the scope's deadline.
                let err = inner
                    .run(tokio::time::sleep(Duration::from_secs(10)))
                    .await
                    .unwrap_err();
                (inner.deadline(), err.is_deadline_exceeded())
            }
            .in_current_scope(),
        ))
    });
    let task = carried.await.unwrap().unwrap();
    let (deadline, stopped) = task.await.unwrap();
    assert_eq!(deadline, request.deadline());
    assert!(stopped);
    assert_eq!(start.elapsed(), 100 * MS);
}

#[tokio::test(start_paused = true)]
async fn the_carried_future_is_not_registered_stopped_or_waited_for() {
    let scope = Scope::new();
    let ran_on = Arc::new(AtomicBool::new(false));
    let flag = ran_on.clone();
    let task = tokio::spawn(
        async move {
            tokio::time::sleep(50 * MS).await;
            // Still running after the cancel, with the cancelled scope current.
            flag.store(Scope::current().is_cancelled(), Ordering::SeqCst);
            // New work there is refused.
            Scope::current().child().build().unwrap_err().is_cancelled()
        }
        .with_scope(&scope),
    );
    tokio::time::sleep(10 * MS).await;
    scope.cancel();
    // Quiet at once: the carried task holds nothing of the scope.
    let report = scope.quiesce().await;
    assert_eq!(report.state(), Lifecycle::CancelledStable);
    assert_eq!(report.cancelled() + report.succeeded(), 0);
    assert!(!task.is_finished());
    assert!(task.await.unwrap(), "new work was refused");
    assert!(ran_on.load(Ordering::SeqCst), "it ran on after the cancel");
}

#[tokio::test]
async fn the_scope_is_current_only_while_the_wrapped_future_is_polled() {
    let outer = Scope::new();
    let carried = outer.child().name("carried").build().unwrap();
    outer
        .run(async {
            let inner = async {
                assert_eq!(Scope::current().name(), Some("carried"));
                tokio::task::yield_now().await;
                assert_eq!(Scope::current().name(), Some("carried"));
            }
            .with_scope(&carried);
            inner.await;
            assert_eq!(Scope::current().name(), None, "the outer scope is back");
        })
        .await
        .unwrap();
    assert!(Scope::try_current().is_none());
}

#[tokio::test]
async fn none_current_where_it_was_made_is_none_current_inside() {
    let carried = async { Scope::try_current().is_none() }.in_current_scope();
    assert!(carried.scope().is_none());
    // Polled inside another scope's body, it still sees what was current where it was made.
    assert!(Scope::new().run(carried).await.unwrap());
}

#[tokio::test]
async fn the_wrapped_future_is_dropped_with_the_scope_current() {
    struct SeesScope(Arc<AtomicBool>);
    impl Drop for SeesScope {
        fn drop(&mut self) {
            let seen = Scope::try_current().is_some_and(|s| s.name() == Some("cleanup"));
            self.0.store(seen, Ordering::SeqCst);
        }
    }
    let seen = Arc::new(AtomicBool::new(false));
    let guard = SeesScope(seen.clone());
    let scope = Scope::new().child().name("cleanup").build().unwrap();
    let carried = async move {
        let _guard = guard;
        std::future::pending::<()>().await;
    }
    .with_scope(&scope);
    let task = tokio::spawn(carried);
    tokio::task::yield_now().await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert!(seen.load(Ordering::SeqCst));
}

#[cfg(feature = "stream")]
#[tokio::test]
async fn a_carried_stream_is_polled_with_the_scope_current() {
    use futures::StreamExt;
    let scope = Scope::new().child().name("rows").build().unwrap();
    let names: Vec<_> = futures::stream::repeat_with(|| Scope::current().name().map(str::to_owned))
        .take(2)
        .with_scope(&scope)
        .collect()
        .await;
    assert_eq!(names, [Some("rows".to_owned()), Some("rows".to_owned())]);
}
