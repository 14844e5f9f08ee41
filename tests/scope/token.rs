//! tokio-util `CancellationToken` interop, both ways: a scope's token is cancelled with the
//! scope (and when the scope is gone), a child scope is cancelled by a token; neither runs a
//! task, keeps the other alive, or leaves anything behind per call.

use std::time::Duration;

use cancel_scope::{Cause, Lifecycle, Scope};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const MS: Duration = Duration::from_millis(1);

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

// Scope -> token.

#[tokio::test(start_paused = true)]
async fn the_token_is_cancelled_at_the_scope_deadline() {
    let request = Scope::with_timeout(100 * MS);
    let token = request.cancellation_token();
    let start = Instant::now();
    token.cancelled().await;
    assert_eq!(start.elapsed(), 100 * MS);
    assert!(request.cause().unwrap().is_deadline_exceeded());
}

#[tokio::test(start_paused = true)]
async fn the_token_is_cancelled_by_the_scope_and_its_ancestors_never_the_reverse() {
    let root = Scope::new();
    let child = root.child().build().unwrap();
    let (a, b) = (child.cancellation_token(), child.cancellation_token());
    // A holder that cancels its own token stops only itself.
    a.cancel();
    assert!(!b.is_cancelled());
    assert!(!child.is_cancelled() && !root.is_cancelled());
    root.cancel_with("shutdown");
    // Cancelled by the time the cancel returns.
    assert!(b.is_cancelled());
    // Asked after the cancel: cancelled already.
    assert!(child.cancellation_token().is_cancelled());
    assert!(root.cancellation_token().is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn the_token_does_not_keep_the_scope_alive_and_is_cancelled_when_it_goes() {
    let root = Scope::new();
    let child = root.child().build().unwrap();
    let token = child.cancellation_token();
    let freed = child.__freed_probe();
    drop(child);
    assert!(freed(), "the token does not hold the scope");
    assert!(token.is_cancelled(), "nothing of the scope runs any more");
    assert_eq!(root.__live_children(), 0);
    assert!(!root.is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn a_completed_scope_still_held_keeps_its_token() {
    let root = Scope::new();
    let done = root.child().build().unwrap();
    let token = done.cancellation_token();
    done.close();
    assert_eq!(done.lifecycle(), Lifecycle::Completed);
    root.cancel();
    // The cancel does not reach a completed scope, nor its token.
    assert!(!done.is_cancelled() && !token.is_cancelled());
    drop(done);
    assert!(token.is_cancelled());
}

#[tokio::test(start_paused = true, flavor = "current_thread")]
async fn tokens_cost_no_task_and_nothing_per_call() {
    let scope = Scope::new();
    let tasks = alive_tasks();
    // Warm up: the scope's own token and the token tree's storage.
    drop(scope.cancellation_token());
    let before = crate::support::alloc::live_bytes();
    for _ in 0..10_000 {
        let token = scope.cancellation_token();
        assert!(!token.is_cancelled());
    }
    assert_eq!(
        crate::support::alloc::live_bytes(),
        before,
        "a token handed out leaves nothing"
    );
    assert_eq!(alive_tasks(), tasks);
}

// Token -> scope.

#[tokio::test(start_paused = true)]
async fn a_token_cancels_its_child_and_the_work_in_it_with_a_cause_that_says_so() {
    let shutdown = CancellationToken::new();
    let server = Scope::new();
    let job = server.child().cancelled_by(&shutdown).build().unwrap();
    let below = job.child().build().unwrap();
    let work = job
        .spawn(tokio::time::sleep(Duration::from_secs(60)))
        .unwrap();
    let cancel = shutdown.clone();
    tokio::spawn(async move {
        tokio::time::sleep(20 * MS).await;
        cancel.cancel();
    });
    let start = Instant::now();
    let err = work.await.unwrap_err();
    assert_eq!(start.elapsed(), 20 * MS);
    assert_eq!(
        err.cause().unwrap().reason(),
        Some("cancellation token cancelled")
    );
    assert_eq!(
        job.cause(),
        Some(Cause::cancelled("cancellation token cancelled"))
    );
    assert!(matches!(below.cause(), Some(Cause::ParentCancelled(_))));
    assert!(!server.is_cancelled(), "the parent goes on");
    let report = job.quiesce().await;
    assert_eq!(report.state(), Lifecycle::CancelledStable);
    assert_eq!(report.cancelled(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_cause_can_be_given_and_any_of_several_tokens_cancels() {
    let (a, b) = (CancellationToken::new(), CancellationToken::new());
    let child = Scope::new()
        .child()
        .cancelled_by(&a)
        .cancelled_by_because(&b, Cause::ClientGone)
        .build()
        .unwrap();
    b.cancel();
    assert_eq!(child.cause(), Some(Cause::ClientGone));
    a.cancel(); // first cause wins
    assert_eq!(child.cause(), Some(Cause::ClientGone));
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_token_refuses_the_child() {
    let token = CancellationToken::new();
    token.cancel();
    let parent = Scope::new();
    let err = parent
        .child()
        .cancelled_by_because(&token, Cause::cancelled("drained"))
        .build()
        .unwrap_err();
    assert!(err.is_cancelled());
    assert_eq!(err.cause().unwrap().reason(), Some("drained"));
    assert_eq!(parent.__live_children(), 0, "nothing was started");
}

#[tokio::test(start_paused = true)]
async fn the_child_is_not_kept_alive_by_its_token_and_a_late_cancel_is_harmless() {
    let token = CancellationToken::new();
    let parent = Scope::new();
    let child = parent.child().cancelled_by(&token).build().unwrap();
    let freed = child.__freed_probe();
    drop(child);
    assert!(freed(), "the token's waiters do not hold the child");
    token.cancel();
    assert!(!parent.is_cancelled());
}

#[tokio::test(start_paused = true, flavor = "current_thread")]
async fn children_of_a_long_lived_token_cost_no_task_and_leave_nothing_behind() {
    let shutdown = CancellationToken::new();
    let server = Scope::new();
    let tasks = alive_tasks();
    let cycle = |cancel_it: bool| {
        let child = server.child().cancelled_by(&shutdown).build().unwrap();
        let _in_it = child.child().build().unwrap();
        if cancel_it {
            child.cancel();
        }
        assert_eq!(alive_tasks(), tasks, "no task per child");
    };
    // Warm up the token's waiter list and the registry's slab.
    cycle(false);
    cycle(true);
    let before = crate::support::alloc::live_bytes();
    for i in 0..10_000 {
        // Quiet ones dropped as they are, and cancelled ones.
        cycle(i % 2 == 0);
    }
    assert_eq!(
        crate::support::alloc::live_bytes(),
        before,
        "each child left nothing"
    );
    assert_eq!(server.__live_children(), 0);
    shutdown.cancel();
    assert!(!server.is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn a_token_cancelled_while_the_child_is_cancelled_or_dropped_elsewhere() {
    // The two cancels, and a cancel and the drop, race on two threads; every order ends with
    // one cause and nothing left.
    for round in 0..200 {
        let token = CancellationToken::new();
        let parent = Scope::new();
        let child = parent.child().cancelled_by(&token).build().unwrap();
        let freed = child.__freed_probe();
        let fire = {
            let token = token.clone();
            std::thread::spawn(move || token.cancel())
        };
        if round % 2 == 0 {
            child.cancel_with("own");
            fire.join().unwrap();
            let reason = child.cause().unwrap().reason().map(str::to_owned);
            assert!(
                matches!(
                    reason.as_deref(),
                    Some("own" | "cancellation token cancelled")
                ),
                "{reason:?}"
            );
            drop(child);
        } else {
            drop(child);
            fire.join().unwrap();
        }
        assert!(freed());
        assert!(!parent.is_cancelled());
    }
}
