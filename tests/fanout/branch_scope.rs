//! What a fan-out branch sees of its own scope: the branch's scope is also its ticket in the
//! fan-out's scope (one node), the branch's work is part of it, and the scope's name is the
//! branch's (kept once, in the ticket: `name()` and `detach` read it there).

use std::time::Duration;

use cancel_scope::fanout::FanOut;
use cancel_scope::{Lifecycle, Scope};

use crate::support::time::ms;

/// The branch's scope holds the branch's ticket: `Running` while the branch runs, not quiet
/// even once closed, quiet (and `Completed`) after the branch's receipt. The request counts
/// the branch once.
#[tokio::test(start_paused = true)]
async fn a_branch_scope_holds_the_branch_until_its_receipt() {
    let request = Scope::with_timeout(ms(500));
    let mut fan = FanOut::new(&request);
    let h = fan.required("price", |s: Scope| async move {
        assert_eq!(s.name(), Some("price"));
        let before = s.lifecycle();
        s.close();
        let quiet_inside = tokio::time::timeout(ms(50), s.quiesce()).await.is_ok();
        Ok::<_, std::io::Error>((before, quiet_inside, s))
    });
    let mut page = fan.join().await.unwrap();
    let (before, quiet_inside, branch_scope) = page.required(h);
    assert_eq!(before, Lifecycle::Running);
    assert!(!quiet_inside, "quiet while its branch runs");
    let branch_report = branch_scope.quiesce().await;
    assert_eq!(branch_report.state(), Lifecycle::Completed);
    // The branch's receipt is its parent's (the fan-out's), not its own scope's.
    assert_eq!(branch_report.total(), 0);
    request.close();
    let report = request.quiesce().await;
    assert_eq!((report.total(), report.succeeded()), (1, 1), "{report:?}");
}

/// A branch that closed its own scope is still running in it: the request's cancel stops it at
/// once.
// regression: the closed branch scope went quiet at once and the cancel passed it by.
#[tokio::test(start_paused = true)]
async fn a_branch_that_closed_its_scope_is_still_stopped_by_the_request_cancel() {
    let request = Scope::with_timeout(ms(500));
    let mut fan = FanOut::new(&request);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let _h = fan.required("price", move |s: Scope| async move {
        s.close();
        tx.send(()).unwrap();
        let _ = tokio::time::timeout(ms(100), s.cancelled()).await;
        Ok::<_, std::io::Error>(())
    });
    let t0 = tokio::time::Instant::now();
    let (out, ()) = tokio::join!(fan.join(), async {
        rx.await.unwrap();
        request.cancel();
    });
    assert!(out.is_err());
    assert_eq!(
        t0.elapsed(),
        Duration::ZERO,
        "the branch ran on after the request's cancel"
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
