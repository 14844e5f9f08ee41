//! Overhead of a single successful attempt through the retry ledger, side by side with calling
//! the future directly and with a bare `tokio::time::timeout` (the anchor: target <= 1.5x),
//! and in a second group against what a user would write instead, `backon` retrying a
//! `tokio::time::timeout` under a child `CancellationToken` per attempt (target <= 1.0x).
//! The sides are measured in the same iterations (`support/paired.rs`), and the group ends
//! with a `RATIO` line per side.
//!
//! `cargo bench --bench retry`

// `criterion_group!` defines a `pub fn` without documentation.
#![allow(missing_docs)]

use std::future::Future;
use std::hint::black_box;
use std::time::{Duration, Instant};

use cancel_scope::budget::Split;
use cancel_scope::retry::{Decision, Retry};
use cancel_scope::{ChildSpec, Scope};
use criterion::{criterion_group, criterion_main, Criterion};

#[path = "support/paired.rs"]
mod paired;
use paired::Paired;

/// The dependency call: awaits once (so that a timer would really be armed), then succeeds.
async fn call() -> Result<u64, ()> {
    tokio::task::yield_now().await;
    Ok(42)
}

fn single_attempt(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let request = rt.block_on(async { Scope::with_timeout(Duration::from_secs(3600)) });
    let spec = ChildSpec::read_only("dependency");
    // Default policy: even split over 3 attempts, so the attempt tightens the deadline.
    let even = Retry::new(|_: &()| Decision::Backoff);
    // Greedy without cap or reserve: the attempt keeps the request's deadline (no own timer).
    let greedy = Retry::new(|_: &()| Decision::Backoff).split(Split::Greedy { cap: None });

    // Both groups measure these two (the closures only borrow: each group gets a copy).
    let even_side = |n| {
        timed(&rt, n, || async {
            even.run(&request, spec.clone(), |_| call()).await.unwrap()
        })
    };
    let greedy_side = |n| {
        timed(&rt, n, || async {
            greedy
                .run(&request, spec.clone(), |_| call())
                .await
                .unwrap()
        })
    };

    Paired::new("single_successful_attempt", 128)
        .side("tokio_timeout", |n| {
            timed(&rt, n, || async {
                tokio::time::timeout(Duration::from_secs(1), call())
                    .await
                    .unwrap()
                    .unwrap()
            })
        })
        .side("direct", |n| {
            timed(&rt, n, || async { call().await.unwrap() })
        })
        // The floor the core sets: one child scope that is also the attempt's ticket in the
        // request (as the retry's attempts are: `Scope::__child_dispatched` is the step
        // `Call::start` takes), the call run in it on the ticket's handle, one receipt — what
        // every attempt must cost, without the ledger. (`child` is the handle an attempt
        // gives its operation.)
        .side("child_ticket_floor", |n| {
            timed(&rt, n, || async {
                let (child, own) = request.__child_dispatched(&spec).unwrap();
                let (out, own) = own.run(call()).await;
                own.succeed();
                drop(child);
                out.unwrap().unwrap()
            })
        })
        .side("retry_even_split", even_side)
        .side("retry_greedy", greedy_side)
        .run(c.benchmark_group("single_successful_attempt"));

    // What a user would write instead: backon retrying a `tokio::time::timeout` (the attempt's
    // budget) under a child `CancellationToken` of the request's (so that a cancel of the
    // request stops the attempt), one attempt succeeding.
    let token = tokio_util::sync::CancellationToken::new();
    let backon = || {
        let attempt = token.child_token();
        async move {
            tokio::select! {
                biased;
                () = attempt.cancelled() => Err(()),
                out = tokio::time::timeout(Duration::from_secs(1), call()) => out.map_err(|_| ())?,
            }
        }
    };
    let schedule = backon::ExponentialBuilder::default().with_max_times(2);
    Paired::new("single_successful_attempt_against_backon", 128)
        .side("backon_timeout_child_token", |n| {
            timed(&rt, n, || async {
                backon::Retryable::retry(backon, schedule)
                    .sleep(tokio::time::sleep)
                    .await
                    .unwrap()
            })
        })
        .side("retry_even_split", even_side)
        .side("retry_greedy", greedy_side)
        .run(c.benchmark_group("single_successful_attempt_against_backon"));
}

/// `n` calls of one side, one after another in one `block_on`, and how long they took.
fn timed<F: Future<Output = u64>>(
    rt: &tokio::runtime::Runtime,
    n: u64,
    side: impl Fn() -> F,
) -> Duration {
    rt.block_on(async {
        let t = Instant::now();
        for _ in 0..n {
            black_box(side().await);
        }
        t.elapsed()
    })
}

criterion_group!(benches, single_attempt);
criterion_main!(benches);
