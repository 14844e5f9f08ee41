//! The application's own root scopes in `cancel_scope.scope.cancelled`: each counted once, by
//! the cause it was cancelled with — explicitly, by its deadline (also one already passed when
//! it was made), after `detach` — and never its descendants, a scope that had completed, or a
//! server's scope at its shutdown.

use std::time::Duration;

use cancel_scope::telemetry;
use cancel_scope::wire::ServerScope;
use cancel_scope::{Cause, Scope};
use tokio::time::Instant;

use crate::capture::Telemetry;
use crate::support::time::ms;

#[tokio::test(start_paused = true)]
async fn a_root_counts_its_own_cancel_once_and_its_descendants_not_at_all() {
    let t = Telemetry::install();

    // Cancelled explicitly, twice: the first cause wins, counted once; the children and
    // grandchild the cancel walk reaches are not counted.
    let root = Scope::new();
    let child = root.child().build().unwrap();
    let _grandchild = child.child().cap(ms(50)).build().unwrap();
    let _sibling = root.child().build().unwrap();
    root.cancel();
    root.cancel_with("again");
    assert!(!root.cancel_because(Cause::ClientGone));

    // By its deadline (its timer), and by a deadline already passed when it was made.
    let timed = Scope::with_timeout(ms(100));
    let _timed_child = timed.child().build().unwrap();
    let past = Scope::with_deadline(Instant::now());
    assert!(past.is_cancelled());
    timed.cancelled().await;
    assert!(timed.cause().unwrap().is_deadline_exceeded());

    // A detached root is a root: its own deadline counts.
    let request = Scope::new();
    let outbox = request.detach(ms(30));
    outbox.cancelled().await;
    assert!(!request.is_cancelled());

    // Another cause.
    Scope::new().cancel_because(Cause::ClientGone);

    // A root that had completed is out of a cancel's reach: nothing to count.
    let done = Scope::new();
    done.close();
    done.quiesce().await;
    done.cancel();
    assert!(!done.is_cancelled());

    // A server's shutdown is counted in the requests it cancels (none here), not as a root.
    ServerScope::new().shutdown(Duration::ZERO).await;

    let m = t.metrics();
    assert_eq!(
        m.counter(telemetry::SCOPE_CANCELLED, &[("cause", "cancelled")]),
        1
    );
    assert_eq!(
        m.counter(
            telemetry::SCOPE_CANCELLED,
            &[("cause", "deadline_exceeded")]
        ),
        3
    );
    assert_eq!(
        m.counter(telemetry::SCOPE_CANCELLED, &[("cause", "client_gone")]),
        1
    );
    assert_eq!(
        m.label_sets(telemetry::SCOPE_CANCELLED).len(),
        3,
        "no shutdown"
    );
}
