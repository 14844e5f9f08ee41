//! The name of a scope that is also its parent's ticket (a retry attempt, a fan-out branch):
//! kept once, in the ticket, since the attempt's name comes from its ticket. Everything that
//! reads a scope's name must see it there too: `name()`, `detach` ("it keeps this scope's
//! name") and `shield` (whose cleanup runs in a root named after the scope).

use std::time::Duration;

use cancel_scope::fanout::FanOut;
use cancel_scope::Scope;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
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
