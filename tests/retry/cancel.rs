//! Invariant 2 for retries: an attempt racing the scope's cancel either was dispatched before
//! the cancel (and the cancel reaches it) or never runs. Real threads, no sleeps: the property
//! is about ordering, not time.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use cancel_scope::retry::{Decision, Retry, Stop};
use cancel_scope::{ChildSpec, Scope};

use crate::Unavailable;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_attempt_runs_after_the_cancel_returned() {
    for round in 0..300 {
        let scope = Scope::new();
        let cancel_returned = Arc::new(AtomicBool::new(false));
        // (attempt scope, was the cancel already complete when the attempt was handed out?)
        let handed_out = Arc::new(Mutex::new(Vec::new()));
        let bodies_after_cancel = Arc::new(AtomicU32::new(0));

        let canceller = {
            let (scope, flag) = (scope.clone(), cancel_returned.clone());
            std::thread::spawn(move || {
                for _ in 0..(round % 50) {
                    std::hint::spin_loop();
                }
                scope.cancel();
                flag.store(true, Ordering::SeqCst);
            })
        };

        let retry = Retry::new(|_: &Unavailable| Decision::RetryNow).max_attempts(10_000);
        let err = retry
            .run(&scope, ChildSpec::read_only("db"), |a| {
                let after = cancel_returned.load(Ordering::SeqCst);
                handed_out.lock().unwrap().push((a.scope().clone(), after));
                let (flag, bodies) = (cancel_returned.clone(), bodies_after_cancel.clone());
                async move {
                    if after && flag.load(Ordering::SeqCst) {
                        bodies.fetch_add(1, Ordering::SeqCst);
                    }
                    Err::<(), _>(Unavailable)
                }
            })
            .await
            .unwrap_err();
        canceller.join().unwrap();

        // Whatever the interleaving, the call stops because of the cancel (or, rarely, runs
        // out of attempts first) and nothing ran after the cancel had returned.
        assert!(matches!(
            err.stop(),
            Stop::Cancelled(_) | Stop::AttemptsExhausted
        ));
        assert_eq!(
            bodies_after_cancel.load(Ordering::SeqCst),
            0,
            "round {round}"
        );
        for (attempt_scope, after) in handed_out.lock().unwrap().iter() {
            if *after {
                // Dispatched before the cancel, handed out after it: the cancel reached it.
                assert!(attempt_scope.is_cancelled(), "round {round}");
            }
        }
        // Every attempt has its receipt; so does at most one more registration, if the cancel
        // came between its registration and its dispatch (receipt `Cancelled`: nothing sent).
        let report = scope.quiesce().await;
        let started = u64::from(err.ledger().started());
        assert!(
            report.total() == started || report.total() == started + 1,
            "round {round}: {} receipts for {started} attempts",
            report.total()
        );
    }
}
