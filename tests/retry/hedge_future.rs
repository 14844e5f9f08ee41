//! `Hedge::run` and `Hedge::run_with_ledger` return the named futures `retry::HedgeRun` and
//! `retry::HedgeRunWithLedger`: a function can return them and a struct can hold them; they
//! do nothing until polled.

use std::future::Future;
use std::time::Duration;

use cancel_scope::retry::{
    Attempt, Decision, Exponential, Hedge, HedgeDelay, HedgeRun, HedgeRunWithLedger, Retry,
    RetryError, Stop,
};
use cancel_scope::{ChildSpec, Scope};

use crate::support::time::ms;

type Classifier = fn(&()) -> Decision;

fn policy() -> Hedge<Classifier, Exponential> {
    Retry::new((|_| Decision::Backoff) as Classifier)
        .max_attempts(2)
        .hedge(HedgeDelay::Fixed(ms(50)))
}

/// A hedged call returned by a function, for any operation.
fn search<'a, F, Fut>(
    hedge: &'a Hedge<Classifier, Exponential>,
    scope: &'a Scope,
    op: F,
) -> HedgeRun<'a, Classifier, Exponential, F, u32, ()>
where
    F: FnMut(Attempt) -> Fut,
    Fut: Future<Output = Result<u32, ()>> + Send + 'static,
{
    hedge.run(scope, ChildSpec::read_only("search"), op)
}

/// A caller's struct that holds a hedged call in progress as a field.
struct Pending<'a, F> {
    call: HedgeRunWithLedger<'a, Classifier, Exponential, F, u32, ()>,
}

async fn slow_first(a: Attempt) -> Result<u32, ()> {
    let took = if a.is_hedge() { ms(10) } else { ms(900) };
    tokio::time::sleep(took).await;
    Ok(a.number())
}

#[tokio::test(start_paused = true)]
async fn a_function_can_return_the_hedged_call() {
    let request = Scope::with_timeout(Duration::from_secs(1));
    let hedge = policy();
    let winner: Result<u32, RetryError<()>> = search(&hedge, &request, slow_first).await;
    assert_eq!(winner.unwrap(), 2);
    assert_eq!(request.remaining(), Some(ms(940)));
}

#[tokio::test(start_paused = true)]
async fn a_struct_can_hold_the_hedged_call_with_its_ledger() {
    let request = Scope::with_timeout(Duration::from_secs(1));
    let hedge = policy();
    let pending = Pending {
        call: hedge.run_with_ledger(&request, ChildSpec::read_only("search"), slow_first),
    };
    let (winner, ledger) = pending.call.await;
    assert_eq!(winner.unwrap(), 2);
    assert_eq!((ledger.started(), ledger.hedges()), (2, 1));
    assert_eq!(ledger.stop(), Some(&Stop::Succeeded));
}

#[tokio::test(start_paused = true)]
async fn the_hedged_call_starts_nothing_until_polled() {
    let request = Scope::with_timeout(Duration::from_secs(1));
    let hedge = policy();
    let call = search(&hedge, &request, slow_first);
    tokio::time::sleep(ms(100)).await;
    assert_eq!(
        request.__live_children(),
        0,
        "an attempt started before a poll"
    );
    drop(call);
    request.close();
    let report = request.quiesce().await;
    assert_eq!(report.total(), 0);
    assert!(
        report.retry_ledgers().is_empty(),
        "a call never polled has no ledger"
    );
}
