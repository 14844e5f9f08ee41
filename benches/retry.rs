//! Overhead of a single successful attempt through the retry ledger, side by side with calling
//! the future directly and with a bare `tokio::time::timeout` (the anchor: target <= 1.5x).
//!
//! `cargo bench --bench retry`

use std::time::Duration;

use cancel_scope::budget::Split;
use cancel_scope::retry::{Decision, Retry};
use cancel_scope::{ChildSpec, Scope};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

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

    let mut g = c.benchmark_group("single_successful_attempt");
    g.bench_function(BenchmarkId::new("direct", ""), |b| {
        b.to_async(&rt).iter(|| async { call().await.unwrap() })
    });
    g.bench_function(BenchmarkId::new("tokio_timeout", ""), |b| {
        b.to_async(&rt).iter(|| async {
            tokio::time::timeout(Duration::from_secs(1), call())
                .await
                .unwrap()
                .unwrap()
        })
    });
    // The floor the core sets: one child scope that is also the attempt's ticket in the
    // request (as the retry's attempts are: `Scope::__child_dispatched` is the step
    // `Call::start` takes), the call run in it on the ticket's handle, one receipt — what
    // every attempt must cost, without the ledger. (`child` is the handle an attempt gives
    // its operation.)
    g.bench_function(BenchmarkId::new("child_ticket_floor", ""), |b| {
        b.to_async(&rt).iter(|| async {
            let (child, own) = request.__child_dispatched(&spec).unwrap();
            let (out, own) = own.run(call()).await;
            own.succeed();
            drop(child);
            out.unwrap().unwrap()
        })
    });
    g.bench_function(BenchmarkId::new("retry_even_split", ""), |b| {
        b.to_async(&rt)
            .iter(|| async { even.run(&request, spec.clone(), |_| call()).await.unwrap() })
    });
    g.bench_function(BenchmarkId::new("retry_greedy", ""), |b| {
        b.to_async(&rt).iter(|| async {
            greedy
                .run(&request, spec.clone(), |_| call())
                .await
                .unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, single_attempt);
criterion_main!(benches);
