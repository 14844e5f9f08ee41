//! Pins the auto traits of the retry and fan-out types, and that their futures can be spawned.

use std::panic::{RefUnwindSafe, UnwindSafe};

use cancel_scope::fanout::{FanOut, FanOutError, Join, Joined, Optional, Required};
use cancel_scope::retry::{
    Attempt, AttemptEnd, AttemptRecord, Decision, Exponential, ExponentialIter, Hedge, HedgeDelay,
    HedgeRun, HedgeRunWithLedger, Jitter, Latencies, Ledger, Retry, RetryBudget, RetryError, Stop,
};
use cancel_scope::{ChildSpec, Report, Scope};

fn send_sync<T: Send + Sync>() {}
fn send<T: Send>() {}
fn unpin<T: Unpin>() {}
fn unwind_safe<T: UnwindSafe + RefUnwindSafe>() {}
fn spawnable<F: std::future::Future + Send + 'static>(f: F) -> F {
    f
}

type Classifier = fn(&std::io::Error) -> Decision;

#[test]
fn auto_traits() {
    send_sync::<Retry<Classifier>>();
    send_sync::<Hedge<Classifier, Exponential>>();
    send_sync::<Ledger>();
    send_sync::<AttemptRecord>();
    send_sync::<AttemptEnd>();
    send_sync::<Stop>();
    send_sync::<Decision>();
    send_sync::<Attempt>();
    send_sync::<Exponential>();
    send_sync::<ExponentialIter>();
    send_sync::<Jitter>();
    send_sync::<RetryBudget>();
    send_sync::<Latencies>();
    send_sync::<HedgeDelay>();
    send_sync::<RetryError<std::io::Error>>();
    send_sync::<FanOutError>();
    send_sync::<Required<u32>>();
    send_sync::<Optional<u32>>();
    send::<Joined>();
    send::<FanOut<'static>>();
    send::<Join<'static>>();
    unpin::<Join<'static>>();
    // The named futures are `Send` when the hedge is `Sync` and the operation, its value and
    // its error are `Send`.
    type Op = fn(Attempt) -> std::future::Ready<Result<u32, std::io::Error>>;
    send::<HedgeRun<'static, Classifier, Exponential, Op, u32, std::io::Error>>();
    send::<HedgeRunWithLedger<'static, Classifier, Exponential, Op, u32, std::io::Error>>();
    // The report carries ledgers now and keeps its auto traits.
    send_sync::<Report>();
    unwind_safe::<Report>();
    unwind_safe::<Ledger>();
}

#[tokio::test]
async fn retry_hedge_and_fan_out_futures_can_be_spawned() {
    let scope = Scope::new();
    let s = scope.clone();
    let retry = spawnable(async move {
        Retry::new(|_: &std::io::Error| Decision::Backoff)
            .run(&s, ChildSpec::read_only("db"), |_| async {
                Ok::<_, std::io::Error>(1)
            })
            .await
    });
    assert_eq!(tokio::spawn(retry).await.unwrap().unwrap(), 1);

    let s = scope.clone();
    let hedge = spawnable(async move {
        Retry::new(|_: &std::io::Error| Decision::Backoff)
            .hedge(HedgeDelay::Fixed(std::time::Duration::from_millis(10)))
            .run(&s, ChildSpec::read_only("db"), |_| async {
                Ok::<_, std::io::Error>(2)
            })
            .await
    });
    assert_eq!(tokio::spawn(hedge).await.unwrap().unwrap(), 2);

    let s = scope.clone();
    let fan = spawnable(async move {
        let mut fan = FanOut::new(&s);
        let a = fan.required("a", |_| async { Ok::<_, std::io::Error>(3) });
        fan.join().await.map(|mut j| j.required(a))
    });
    assert_eq!(tokio::spawn(fan).await.unwrap().unwrap(), 3);
}
