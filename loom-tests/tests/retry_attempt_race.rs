//! loom model: a retry attempt racing the scope's cancel never dispatches after it.
//!
//! The retry layer starts every attempt with the same synchronous steps modelled here (see
//! `Call::start` in `src/retry/attempt.rs`): build the attempt's child scope, register its
//! ticket in the retry's scope, dispatch it there. Whatever the interleaving with `cancel`,
//! either the attempt is refused (and nothing was sent) or it was dispatched before the
//! cancel, which then reached the attempt's scope.
#![cfg(loom)]

use cancel_scope::{ChildSpec, Lifecycle, Receipt, Scope, Ticket};
use cancel_scope_loom_tests::model;

#[test]
fn attempt_never_dispatches_after_cancel() {
    model("attempt_never_dispatches_after_cancel", || {
        let request = Scope::new();
        let canceller = {
            let request = request.clone();
            loom::thread::spawn(move || request.cancel())
        };
        let attempt = request.child().name("inventory").build().and_then(|child| {
            let d = request
                .register(ChildSpec::idempotent("inventory", "order-42"))
                .and_then(Ticket::dispatch)?;
            Ok((child, d))
        });
        canceller.join().unwrap();
        if let Ok((child, dispatched)) = attempt {
            // Dispatched before the cancel: the cancel reached the attempt.
            assert!(child.is_cancelled());
            dispatched.finish(Receipt::Cancelled);
        }
        assert_eq!(request.lifecycle(), Lifecycle::CancelledStable);
    });
}
