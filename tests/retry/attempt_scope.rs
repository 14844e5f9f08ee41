//! The attempt's scope: the attempt's ticket is its first unit, with other work in that scope
//! (spawned tasks and guards that outlive the attempt, a hedge loser that closed its scope,
//! the attempt's scope quiesced from outside after the call), and the scope's name is the
//! attempt's. (A fan-out branch's scope is the same: see the `fanout` tests.)

use cancel_scope::retry::{Decision, HedgeDelay, Retry};
use cancel_scope::{ChildSpec, Lifecycle, Scope};

use crate::support::time::ms;

/// A task spawned in the attempt's scope outlives the attempt: the request is not quiet until
/// it ends, the attempt's receipt and the task's are counted once each, and the attempt's
/// scope, quiesced from outside, counts the task only.
#[tokio::test(start_paused = true)]
async fn a_task_in_the_attempt_scope_outlives_the_attempt() {
    let request = Scope::with_timeout(ms(1000));
    let retry = Retry::new(|_: &()| Decision::Backoff);
    let attempt_scope = retry
        .run(&request, ChildSpec::read_only("search"), |a| async move {
            let s = a.scope().clone();
            drop(s.spawn(tokio::time::sleep(ms(200))).unwrap());
            Ok::<_, ()>(s)
        })
        .await
        .unwrap();
    assert_eq!(attempt_scope.lifecycle(), Lifecycle::Running);
    request.close();
    let t0 = tokio::time::Instant::now();
    let report = request.quiesce().await;
    assert_eq!(
        t0.elapsed(),
        ms(200),
        "quiet before the task in the attempt ended"
    );
    assert_eq!(report.succeeded(), 2, "{report:?}");
    assert_eq!(report.state(), Lifecycle::Completed);
    let own = attempt_scope.quiesce().await;
    assert_eq!((own.total(), own.succeeded()), (1, 1), "{own:?}");
}

/// A guard tethered to the attempt's scope outlives the attempt: the request is quiet only
/// once it is dropped; a cancel of the request in between still reaches the attempt's scope.
#[tokio::test(start_paused = true)]
async fn a_guard_in_the_attempt_scope_outlives_the_attempt() {
    let request = Scope::with_timeout(ms(1000));
    let retry = Retry::new(|_: &()| Decision::Backoff);
    let (guard, attempt_scope) = retry
        .run(&request, ChildSpec::read_only("search"), |a| async move {
            let s = a.scope().clone();
            s.close();
            Ok::<_, ()>((s.tether(()).map_err(|_| ()), s))
        })
        .await
        .unwrap();
    // Closed before the guard: tethering is refused like any registration.
    assert!(guard.is_err());
    assert_eq!(attempt_scope.lifecycle(), Lifecycle::Completed);
    let (guard, attempt_scope) = retry
        .run(&request, ChildSpec::read_only("search"), |a| async move {
            let s = a.scope().clone();
            let g = s.tether(()).unwrap();
            s.close();
            Ok::<_, ()>((g, s))
        })
        .await
        .unwrap();
    assert_eq!(attempt_scope.lifecycle(), Lifecycle::Running);
    request.cancel();
    assert_eq!(attempt_scope.lifecycle(), Lifecycle::Cancelling);
    let quiet = tokio::time::timeout(ms(10), request.quiesce()).await;
    assert!(
        quiet.is_err(),
        "quiet while a guard of the attempt's scope is held"
    );
    drop(guard);
    let report = request.quiesce().await;
    assert_eq!(report.succeeded(), 2, "{report:?}");
    assert_eq!(report.state(), Lifecycle::CancelledStable);
    assert_eq!(attempt_scope.lifecycle(), Lifecycle::CancelledStable);
}

/// A hedge loser that closed its own scope is still stopped by the hedge's cancel of the
/// losers: the call returns when the winner does, not when the loser would have.
#[tokio::test(start_paused = true)]
async fn a_hedge_loser_that_closed_its_scope_is_stopped() {
    let request = Scope::with_timeout(ms(5000));
    let hedge = Retry::new(|_: &()| Decision::Backoff)
        .max_attempts(2)
        .hedge(HedgeDelay::Fixed(ms(50)));
    let t0 = tokio::time::Instant::now();
    let (out, ledger) = hedge
        .run_with_ledger(&request, ChildSpec::read_only("search"), |a| async move {
            a.scope().close();
            let took = if a.number() == 1 { ms(3000) } else { ms(5) };
            tokio::time::sleep(took).await;
            Ok::<_, ()>(a.number())
        })
        .await;
    assert_eq!(out.unwrap(), 2);
    assert_eq!(t0.elapsed(), ms(55), "the loser ran on: {ledger:?}");
    request.close();
    let report = request.quiesce().await;
    assert_eq!(report.total(), 2, "{report:?}");
}

/// Nested attempts: an attempt of another dependency inside an attempt. Every unit goes back
/// once: the request is quiet right after the call, its report counts both.
#[tokio::test(start_paused = true)]
async fn nested_attempts_give_back_every_unit() {
    let request = Scope::with_timeout(ms(1000));
    let outer = Retry::new(|_: &()| Decision::Backoff);
    let (a_scope, b_scope) = outer
        .run(&request, ChildSpec::read_only("search"), |a| async move {
            let inner = Retry::new(|_: &()| Decision::Backoff);
            let b_scope = inner
                .run(a.scope(), ChildSpec::read_only("index"), |b| async move {
                    Ok::<_, ()>(b.scope().clone())
                })
                .await
                .unwrap();
            Ok::<_, ()>((a.scope().clone(), b_scope))
        })
        .await
        .unwrap();
    assert!(format!("{a_scope:?}").contains("active: 0"), "{a_scope:?}");
    assert!(format!("{b_scope:?}").contains("active: 0"), "{b_scope:?}");
    request.close();
    let report = tokio::time::timeout(ms(1), request.quiesce())
        .await
        .unwrap();
    assert_eq!(report.succeeded(), 2, "{report:?}");
    let a_report = a_scope.quiesce().await;
    assert_eq!(a_report.total(), 1, "{a_report:?}");
}

/// The attempt's scope is quiet only when its ticket has its receipt, so its report's "cancel
/// to quiet" runs to that receipt: an attempt scope cancelled (here: by the request) whose
/// owner gives the receipt 30 ms later went quiet 30 ms after the cancel.
// regression: the attempt scope's `cancel_to_quiet` ignored the receipt that made it quiet.
#[tokio::test(start_paused = true)]
async fn an_attempt_scope_reports_the_time_its_ticket_kept_it_from_quiet() {
    let request = Scope::with_timeout(ms(1000));
    let (attempt_scope, own) = request
        .__child_dispatched(&ChildSpec::read_only("search"))
        .unwrap();
    request.cancel();
    let early = tokio::time::timeout(ms(30), attempt_scope.quiesce()).await;
    assert!(early.is_err(), "quiet before the attempt's receipt");
    own.finish(cancel_scope::Receipt::Cancelled);
    let report = attempt_scope.quiesce().await;
    assert_eq!(report.state(), Lifecycle::CancelledStable);
    assert_eq!(
        report.cancel_to_quiet(),
        Some(ms(30)),
        "the attempt's scope went quiet 30 ms after its cancel"
    );
}

// The name of a scope that is also its parent's ticket (a retry attempt, a fan-out branch):
// kept once, in the ticket, since the attempt's name comes from its ticket. Everything that
// reads a scope's name must see it there too: `name()`, `detach` ("it keeps this scope's
// name") and `shield` (whose cleanup runs in a root named after the scope).

/// `detach` of an attempt's scope keeps the attempt's name (the dependency).
#[tokio::test(start_paused = true)]
async fn an_attempt_scope_detached_keeps_its_name() {
    let request = Scope::with_timeout(ms(1000));
    let retry = Retry::new(|_: &()| Decision::Backoff);
    let (name, detached) = retry
        .run(&request, ChildSpec::read_only("search"), |a| async move {
            let name = a.scope().name().map(str::to_owned);
            Ok::<_, ()>((name, a.scope().detach(ms(30_000))))
        })
        .await
        .unwrap();
    assert_eq!(name.as_deref(), Some("search"));
    assert_eq!(
        detached.name(),
        Some("search"),
        "detach lost the attempt's name"
    );
}

/// A cleanup shielded from an attempt's scope runs in a root named after that scope.
#[tokio::test(start_paused = true)]
async fn a_cleanup_shielded_in_an_attempt_runs_under_the_attempt_name() {
    let request = Scope::with_timeout(ms(1000));
    let retry = Retry::new(|_: &()| Decision::Backoff);
    let inside = retry
        .run(&request, ChildSpec::read_only("search"), |a| async move {
            let cleanup = a
                .scope()
                .shield(ms(50), async { Scope::current().name().map(str::to_owned) })
                .unwrap();
            Ok::<_, ()>(cleanup.await.unwrap())
        })
        .await
        .unwrap();
    assert_eq!(
        inside.as_deref(),
        Some("search"),
        "shield lost the attempt's name"
    );
}
