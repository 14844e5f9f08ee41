//! The name of a scope that is also its parent's ticket (a retry attempt, a fan-out branch):
//! kept once, in the ticket, since the attempt's name comes from its ticket. Everything that
//! reads a scope's name must see it there too: `name()`, `detach` ("it keeps this scope's
//! name") and `shield` (whose cleanup runs in a root named after the scope).

use std::time::Duration;

use cancel_scope::fanout::FanOut;
use cancel_scope::retry::{Decision, Retry};
use cancel_scope::{ChildSpec, Scope};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `detach` of an attempt's scope keeps the attempt's name (the dependency), as it did when
/// the attempt's scope carried the name itself.
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

/// `detach` of a fan-out branch's scope keeps the branch's name.
#[tokio::test(start_paused = true)]
async fn a_branch_scope_detached_keeps_its_name() {
    let request = Scope::with_timeout(ms(500));
    let mut fan = FanOut::new(&request);
    let h = fan.required("price", |s: Scope| async move {
        Ok::<_, std::io::Error>((s.name().map(str::to_owned), s.detach(ms(30_000))))
    });
    let mut page = fan.join().await.unwrap();
    let (name, detached) = page.required(h);
    assert_eq!(name.as_deref(), Some("price"));
    assert_eq!(
        detached.name(),
        Some("price"),
        "detach lost the branch's name"
    );
}
