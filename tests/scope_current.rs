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

/// Work that takes the current scope when it is dropped (and is never ready).
struct TakesCurrentOnDrop(std::sync::Arc<std::sync::Mutex<Option<Scope>>>);

impl TakesCurrentOnDrop {
    /// The work, and where it leaves the scope it took.
    fn new() -> (Self, std::sync::Arc<std::sync::Mutex<Option<Scope>>>) {
        let slot = std::sync::Arc::new(std::sync::Mutex::new(None));
        (TakesCurrentOnDrop(slot.clone()), slot)
    }
}

/// The scope the work took when it was dropped.
fn taken(slot: &std::sync::Mutex<Option<Scope>>) -> Scope {
    slot.lock()
        .unwrap()
        .take()
        .expect("current while the work is dropped")
}

impl std::future::Future for TakesCurrentOnDrop {
    type Output = ();
    fn poll(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        std::task::Poll::Pending
    }
}

impl Drop for TakesCurrentOnDrop {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = Scope::try_current();
    }
}

#[test]
fn the_current_scope_taken_while_run_drops_its_work_is_a_live_handle() {
    let parent = Scope::new();
    let work = parent.child().name("work").build().unwrap();
    let (work_future, slot) = TakesCurrentOnDrop::new();
    let run = work.run(work_future);
    drop(work);
    // The run future holds the last handle; its work is dropped with `work` current.
    drop(run);
    let taken = taken(&slot);
    assert_eq!(taken.name(), Some("work"));
    assert_eq!(
        parent.__live_children(),
        1,
        "the taken handle keeps it linked"
    );
    let sibling = parent.child().build().unwrap();
    drop(taken);
    assert_eq!(
        parent.__live_children(),
        1,
        "unlinked once, the sibling stays"
    );
    parent.cancel();
    assert!(sibling.is_cancelled());
}

#[tokio::test]
async fn a_task_drops_its_work_with_its_scope_current_as_run_does() {
    let s = Scope::new().child().name("work").build().unwrap();
    let (work, slot) = TakesCurrentOnDrop::new();
    let h = s.spawn(work).unwrap();
    // Stopped at its first poll: the work is dropped unpolled.
    s.cancel();
    assert!(h.await.unwrap_err().is_cancelled());
    assert_eq!(taken(&slot).name(), Some("work"));
}
