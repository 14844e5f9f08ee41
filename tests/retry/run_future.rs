//! `Retry::run` returns the call's own future: callers that borrow less than the retry, or
//! are generic, still compile, and a finished call leaves nothing of its caller behind.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use cancel_scope::retry::{Attempt, Decision, Retry, RetryError};
use cancel_scope::{ChildSpec, Scope};

use crate::support::wakers::Counts;

/// An attempt that waited once and whose scope outlives the call (the operation returns it):
/// the finished call's waker is not kept by that scope, and its later cancel wakes nobody.
#[tokio::test(start_paused = true)]
async fn an_attempt_scope_that_outlives_its_call_keeps_no_waker_of_the_caller() {
    let request = Scope::with_timeout(Duration::from_secs(10));
    let retry = Retry::new(|_: &()| Decision::Backoff);
    let counter = Arc::new(Counts::default());
    let waker = Waker::from(counter.clone());
    let references = Arc::strong_count(&counter);
    let escaped = {
        let mut call = pin!(
            retry.run(&request, ChildSpec::read_only("x"), |a| async move {
                // Pending once (and woken at once): the attempt's run waits for its cancel.
                let mut waited = false;
                std::future::poll_fn(|cx| {
                    if waited {
                        Poll::Ready(())
                    } else {
                        waited = true;
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }
                })
                .await;
                Ok::<_, ()>(a.scope().clone())
            })
        );
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(out) = call.as_mut().poll(&mut cx) {
                break out.unwrap();
            }
        }
    };
    assert_eq!(
        Arc::strong_count(&counter),
        references,
        "the attempt's scope keeps a clone of the finished call's waker"
    );
    let wakes = counter.woken();
    escaped.cancel();
    assert_eq!(counter.woken(), wakes);
}

/// Generic callers with no lifetime bounds of their own.
#[allow(dead_code)]
async fn generic_caller<T, E, F, Fut>(
    retry: &Retry<fn(&E) -> Decision>,
    scope: &Scope,
    op: F,
) -> Result<T, RetryError<E>>
where
    F: FnMut(Attempt) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    retry.run(scope, ChildSpec::read_only("g"), op).await
}

/// A future that borrows the retry (and a client) for less than the scope.
#[allow(dead_code)]
fn returns_the_future<'r, 's: 'r>(
    retry: &'r Retry<fn(&()) -> Decision>,
    scope: &'s Scope,
    client: &'r str,
) -> impl Future<Output = Result<usize, RetryError<()>>> + 'r {
    retry.run(scope, ChildSpec::read_only("g"), move |_| async move {
        Ok(client.len())
    })
}

/// An operation that borrows a local that lives shorter than the retry and the scope.
#[allow(dead_code)]
fn an_operation_borrowing_a_local(
    retry: &'static Retry<fn(&()) -> Decision>,
    scope: &'static Scope,
) {
    let local = String::from("x");
    let borrowed = &local;
    let call = retry.run(scope, ChildSpec::read_only("g"), move |_| async move {
        Ok(borrowed.len())
    });
    drop(call);
}
