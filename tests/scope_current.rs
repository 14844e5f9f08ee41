//! The current scope: `run`, `spawn` and `Scope::current()` read like Go's context without
//! passing the scope by hand.

use std::time::Duration;

use cancel_scope::Scope;

#[tokio::test]
async fn run_makes_the_scope_current_and_returns_the_output() {
    assert!(Scope::try_current().is_none());
    let s = Scope::new();
    let child = s.child().name("handler").build().unwrap();
    let name = child
        .run(async { Scope::current().name().map(str::to_owned) })
        .await
        .unwrap();
    assert_eq!(name.as_deref(), Some("handler"));
    assert!(Scope::try_current().is_none(), "current only inside run");
}

#[tokio::test]
async fn nested_runs_see_the_innermost_scope() {
    let outer = Scope::new();
    let inner = outer.child().name("inner").build().unwrap();
    outer
        .run(async {
            assert_eq!(Scope::current().name(), None);
            inner
                .run(async { assert_eq!(Scope::current().name(), Some("inner")) })
                .await
                .unwrap();
            assert_eq!(Scope::current().name(), None);
        })
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn run_stops_the_future_when_the_scope_is_cancelled() {
    let s = Scope::with_timeout(Duration::from_millis(100));
    let start = tokio::time::Instant::now();
    let err = s
        .run(tokio::time::sleep(Duration::from_secs(10)))
        .await
        .unwrap_err();
    assert!(err.is_deadline_exceeded());
    assert_eq!(start.elapsed(), Duration::from_millis(100));
}

#[tokio::test]
async fn run_on_a_cancelled_scope_never_polls_the_future() {
    let s = Scope::new();
    s.cancel_with("gone");
    let err = s
        .run(async { panic!("must not be polled") })
        .await
        .unwrap_err();
    assert_eq!(err.cause().unwrap().reason(), Some("gone"));
}

#[tokio::test]
async fn spawned_tasks_see_their_scope_as_current() {
    let s = Scope::new();
    let child = s.child().name("worker").build().unwrap();
    let h = child
        .spawn(async {
            let me = Scope::current();
            let nested = me.spawn(async { Scope::current().name().map(str::to_owned) });
            nested.unwrap().await.unwrap()
        })
        .unwrap();
    assert_eq!(h.await.unwrap().as_deref(), Some("worker"));
}

#[tokio::test]
#[should_panic(expected = "no current scope")]
async fn current_outside_a_scope_panics_with_a_clear_message() {
    let _ = Scope::current();
}

#[tokio::test(start_paused = true)]
async fn handler_code_derives_children_from_the_current_scope() {
    let request = Scope::with_timeout(Duration::from_millis(500));
    let remaining = request
        .run(async {
            // Deep inside handler code, without a scope parameter:
            let db = Scope::current()
                .child()
                .reserve(Duration::from_millis(50))
                .build()
                .unwrap();
            db.remaining()
        })
        .await
        .unwrap();
    assert_eq!(remaining, Some(Duration::from_millis(450)));
}
