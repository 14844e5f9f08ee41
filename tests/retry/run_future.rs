//! `Retry::run` returns the call's own future, a named type (`retry::Run`,
//! `retry::RunWithLedger`): callers can keep it in a struct field or return it, callers that
//! borrow less than the retry, or are generic, still compile, it is `Send` when its inputs are
//! (and runs a `!Send` operation on a current-thread runtime), and a finished call leaves
//! nothing of its caller behind.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use cancel_scope::retry::{self, Attempt, Decision, Exponential, Retry, RetryError, Stop};
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

type Classifier = fn(&&'static str) -> Decision;

/// A generic struct that keeps a call in flight in a field of the named type.
struct InFlight<'a, F, Fut>
where
    Fut: Future,
{
    name: &'static str,
    call: retry::Run<'a, Classifier, Exponential, F, Fut, u32, &'static str>,
}

/// An answer at once: busy for the first two attempts.
type Answer = std::future::Ready<Result<u32, &'static str>>;

/// The call of `with_ledger`, by its type's name.
type Named<'a> = retry::RunWithLedger<
    'a,
    Classifier,
    Vec<Duration>,
    fn(Attempt) -> Answer,
    Answer,
    u32,
    &'static str,
>;

/// A function that returns the call with its ledger, by its type's name.
fn with_ledger<'a>(retry: &'a Retry<Classifier, Vec<Duration>>, scope: &'a Scope) -> Named<'a> {
    let op: fn(Attempt) -> Answer = |a| {
        std::future::ready(if a.number() < 3 {
            Err("busy")
        } else {
            Ok(a.number())
        })
    };
    retry.run_with_ledger(scope, ChildSpec::read_only("named"), op)
}

#[tokio::test(start_paused = true)]
async fn the_call_futures_have_names_a_struct_field_or_a_return_type_can_use() {
    let scope = Scope::with_timeout(Duration::from_secs(10));
    let retry: Retry<Classifier> = Retry::new(|_| Decision::Backoff);
    let in_flight = InFlight {
        name: "db",
        call: retry.run(&scope, ChildSpec::read_only("db"), |a| async move {
            tokio::task::yield_now().await;
            Ok(a.number())
        }),
    };
    assert_eq!(in_flight.name, "db");
    assert_eq!(in_flight.call.await.unwrap(), 1);

    let retry: Retry<Classifier, Vec<Duration>> =
        Retry::new((|_| Decision::RetryNow) as Classifier)
            .backoff(Vec::new())
            .max_attempts(3);
    let (out, ledger) = with_ledger(&retry, &scope).await;
    assert_eq!(out.unwrap(), 3);
    assert_eq!(ledger.started(), 3);
    assert_eq!(ledger.stop(), Some(&Stop::Succeeded));
}

fn assert_send<T: Send>(value: T) -> T {
    value
}

/// Compiles only if `T` is not `Send`: with `Send`, the two impls make the `_` ambiguous.
trait AmbiguousIfSend<A> {
    fn not_send() {}
}
impl<T: ?Sized> AmbiguousIfSend<()> for T {}
impl<T: ?Sized + Send> AmbiguousIfSend<u8> for T {}

/// The operation's future: an answer at once.
type Now<V> = std::future::Ready<Result<V, ()>>;

/// A call whose operation answers `V` at once.
type CallOf<V> =
    retry::Run<'static, fn(&()) -> Decision, Exponential, fn(Attempt) -> Now<V>, Now<V>, V, ()>;

/// The same with its ledger.
type WithLedgerOf<V> = retry::RunWithLedger<
    'static,
    fn(&()) -> Decision,
    Exponential,
    fn(Attempt) -> Now<V>,
    Now<V>,
    V,
    (),
>;

/// The auto traits follow the inputs: `Send` with an `Arc`, not with an `Rc`.
#[allow(dead_code)]
fn the_call_is_send_only_with_send_inputs() {
    fn send<T: Send>() {}
    send::<CallOf<Arc<u32>>>();
    send::<
        retry::RunWithLedger<
            'static,
            fn(&()) -> Decision,
            Exponential,
            fn(Attempt) -> std::future::Ready<Result<u32, ()>>,
            std::future::Ready<Result<u32, ()>>,
            u32,
            (),
        >,
    >();
    let _ = <CallOf<std::rc::Rc<u32>> as AmbiguousIfSend<_>>::not_send;
    let _ = <WithLedgerOf<std::rc::Rc<u32>> as AmbiguousIfSend<_>>::not_send;
}

/// With `Send` inputs the call is `Send` (checked at compile time, and spawned onto a
/// multi-threaded runtime); a `!Send` operation still runs where the caller is (a
/// current-thread runtime).
#[test]
fn the_call_is_send_when_its_inputs_are_and_runs_a_local_operation_on_one_thread() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .start_paused(false)
        .build()
        .unwrap();
    let got = rt.block_on(async {
        tokio::spawn(async {
            let scope = Scope::with_timeout(Duration::from_secs(10));
            let retry = Retry::new(|_: &std::io::Error| Decision::RetryNow);
            let shared = Arc::new(7u32);
            let call = assert_send(retry.run(&scope, ChildSpec::read_only("db"), |a| {
                let shared = shared.clone();
                async move {
                    tokio::task::yield_now().await;
                    if a.number() == 1 {
                        Err(std::io::Error::other("reset"))
                    } else {
                        Ok(*shared)
                    }
                }
            }));
            let with_ledger = assert_send(retry.run_with_ledger(
                &scope,
                ChildSpec::read_only("db"),
                |_| async { Ok::<_, std::io::Error>(1u32) },
            ));
            (call.await.unwrap(), with_ledger.await.0.unwrap())
        })
        .await
        .unwrap()
    });
    assert_eq!(got, (7, 1));

    let local = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let got = local.block_on(async {
        let scope = Scope::with_timeout(Duration::from_secs(10));
        let retry = Retry::new(|_: &&str| Decision::Backoff);
        let seen = std::rc::Rc::new(std::cell::Cell::new(0u32));
        let out = retry
            .run(&scope, ChildSpec::read_only("db"), |a| {
                let seen = seen.clone();
                async move {
                    // The `Rc` is held across an await: the attempt's future is `!Send`.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    seen.set(seen.get() + 1);
                    if a.number() == 1 {
                        Err("busy")
                    } else {
                        Ok(a.number())
                    }
                }
            })
            .await;
        (out.unwrap(), seen.get())
    });
    assert_eq!(got, (2, 2));
}
