//! Wakers and helpers for the tests of user code that panics.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use cancel_scope::{Report, Scope};

/// Panics when woken.
pub struct Panics;

impl Wake for Panics {
    fn wake(self: Arc<Self>) {
        panic!("this waker panics");
    }
}

/// A waker that panics when woken.
pub fn panics() -> Waker {
    Waker::from(Arc::new(Panics))
}

/// Polls `fut` once with `waker`: it must be pending.
pub fn pending_with<F: Future>(fut: Pin<&mut F>, waker: &Waker) {
    assert!(fut.poll(&mut Context::from_waker(waker)).is_pending());
}

/// Runs `f`, which must panic, and returns the panic's message.
pub fn panic_of(f: impl FnOnce()) -> String {
    let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) else {
        panic!("expected a panic");
    };
    message(panic)
}

/// Runs `fut`, which must panic, to its panic, and returns the panic's message.
pub async fn panic_of_future(fut: impl Future) -> String {
    let Err(panic) = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(fut)).await
    else {
        panic!("expected a panic");
    };
    message(panic)
}

/// The message of a caught panic.
pub fn message(panic: Box<dyn std::any::Any + Send>) -> String {
    match panic.downcast::<&str>() {
        Ok(s) => (*s).to_owned(),
        Err(p) => *p.downcast::<String>().unwrap(),
    }
}

/// Sets its flag when dropped (the work that holds it has stopped).
pub struct SetOnDrop(pub Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Closes `scope` and waits for its report (an hour of virtual time at most: a scope that is
/// never quiet fails the test instead of hanging it).
pub async fn report_of(scope: &Scope) -> Report {
    scope.close();
    tokio::time::timeout(Duration::from_secs(3600), scope.quiesce())
        .await
        .expect("the scope is quiet")
}

/// Leaves out of the test output, for the rest of the process, the panics whose message
/// `expected` accepts (panics a test provokes by the hundred on threads it does not own, a
/// runtime's workers); every other panic goes to the hook that was there before.
pub fn quiet_panics(expected: fn(&str) -> bool) {
    let before = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let text = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
        if !text.is_some_and(expected) {
            before(info);
        }
    }));
}

/// Panics when it is dropped: a panic payload (`panic_any(PanicsOnDrop)`) that panics again as
/// the code that caught it drops it.
pub struct PanicsOnDrop;

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("the payload panics as it is dropped");
    }
}
