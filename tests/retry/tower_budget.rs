//! `RetryBudget` as tower's retry `Budget`: tower's `Retry` middleware and this crate's
//! retries to one dependency draw on one bucket.

use std::future::{ready, Ready};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use cancel_scope::retry::{Decision, Retry, RetryBudget, Stop};
use cancel_scope::{ChildSpec, Scope};
use tower::retry::budget::Budget;
use tower::retry::{Policy, RetryLayer};
use tower::{service_fn, ServiceBuilder, ServiceExt};

use crate::support::time::ms;
use crate::Unavailable;

/// The policy of tower's own documentation, on a shared budget of this crate: every request
/// deposits, every retry withdraws, a refused withdrawal ends the retries.
struct BudgetPolicy<B>(Arc<B>);

impl<B> Clone for BudgetPolicy<B> {
    fn clone(&self) -> Self {
        BudgetPolicy(self.0.clone())
    }
}

impl<B: Budget> Policy<u32, (), Unavailable> for BudgetPolicy<B> {
    type Future = Ready<()>;

    fn retry(&mut self, _: &mut u32, result: &mut Result<(), Unavailable>) -> Option<Ready<()>> {
        match result {
            Ok(()) => None,
            Err(_) => self.0.withdraw().then(|| ready(())),
        }
    }

    fn clone_request(&mut self, req: &u32) -> Option<u32> {
        self.0.deposit();
        Some(*req)
    }
}

/// tower's retries spend the tokens of the shared bucket (two in reserve: the third retry is
/// refused); a retry of this crate to the same dependency is then refused too.
#[tokio::test(start_paused = true)]
async fn tower_retries_and_ours_share_one_bucket() {
    let budget = Arc::new(RetryBudget::new(0).burst(2));
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let down = service_fn(move |_: u32| {
        counted.fetch_add(1, Ordering::SeqCst);
        ready(Err::<(), _>(Unavailable))
    });
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(BudgetPolicy(budget.clone())))
        .service(down);
    assert!(svc.oneshot(7).await.is_err());
    // The first try and two retries; the third retry was refused by the budget.
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!((budget.retries(), budget.refused()), (2, 1));

    let request = Scope::with_timeout(ms(1000));
    let err = Retry::new(|_: &Unavailable| Decision::RetryNow)
        .max_attempts(3)
        .budget(budget.clone())
        .run(&request, ChildSpec::read_only("inventory"), |_| async {
            Err::<(), _>(Unavailable)
        })
        .await
        .unwrap_err();
    assert_eq!(err.stop(), &Stop::RetryBudget);
    assert_eq!(err.ledger().started(), 1);
    assert_eq!(budget.refused(), 2);
}
