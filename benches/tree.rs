//! The cancellation tree against its anchors, side by side in one group each, so that the
//! result is a ratio: tokio-util's `CancellationToken` (and an `AtomicBool` as the floor).
//!
//! `cargo bench --bench tree`

// `criterion_group!` defines a `pub fn` without documentation.
#![allow(missing_docs)]

use std::future::Future;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use cancel_scope::Scope;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use tokio_util::sync::CancellationToken;

fn is_cancelled(c: &mut Criterion) {
    let mut g = c.benchmark_group("is_cancelled");
    let scope = Scope::new();
    let token = CancellationToken::new();
    let flag = AtomicBool::new(false);
    g.bench_function("cancel_scope", |b| {
        b.iter(|| black_box(&scope).is_cancelled())
    });
    g.bench_function("tokio_util", |b| {
        b.iter(|| black_box(&token).is_cancelled())
    });
    g.bench_function("atomic_bool", |b| {
        b.iter(|| black_box(&flag).load(Ordering::Acquire))
    });
    g.finish();
}

fn child_create_drop(c: &mut Criterion) {
    let mut g = c.benchmark_group("child_create_drop");
    let scope = Scope::new();
    let token = CancellationToken::new();
    g.bench_function("cancel_scope", |b| {
        b.iter(|| drop(black_box(scope.child().build().unwrap())))
    });
    g.bench_function("tokio_util", |b| {
        b.iter(|| drop(black_box(token.child_token())))
    });
    g.finish();
}

fn child_with_deadline(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let mut g = c.benchmark_group("child_with_deadline_create_drop");
    let scope = Scope::with_timeout(Duration::from_secs(3600));
    let token = CancellationToken::new();
    let waker = futures::task::noop_waker();
    g.bench_function("cancel_scope", |b| {
        b.iter(|| {
            drop(black_box(
                scope.child().cap(Duration::from_secs(30)).build().unwrap(),
            ))
        })
    });
    // What users compose today: a child token plus a tokio sleep that is registered in the
    // timer (polled once) and dropped.
    g.bench_function("tokio_util_plus_sleep", |b| {
        b.iter(|| {
            let child = token.child_token();
            let mut sleep = Box::pin(tokio::time::sleep(Duration::from_secs(30)));
            let mut cx = std::task::Context::from_waker(&waker);
            let _ = sleep.as_mut().poll(&mut cx);
            drop(black_box((child, sleep)));
        })
    });
    g.finish();
}

/// A request's root with a deadline, made, run around the handler and dropped, as the
/// admission layer does per request: against a bare `tokio::time::timeout` and what users
/// compose today (a root token plus that timeout). The handler awaits once, so that the
/// timeout really arms its timer.
fn request_root_with_deadline(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    async fn handler() -> u64 {
        tokio::task::yield_now().await;
        42
    }
    let mut g = c.benchmark_group("request_root_with_deadline");
    g.bench_function("cancel_scope", |b| {
        b.to_async(&rt).iter(|| async {
            let request = Scope::with_timeout(Duration::from_secs(1));
            request.run(handler()).await.unwrap()
        })
    });
    g.bench_function("tokio_timeout", |b| {
        b.to_async(&rt).iter(|| async {
            tokio::time::timeout(Duration::from_secs(1), handler())
                .await
                .unwrap()
        })
    });
    g.bench_function("tokio_util_plus_timeout", |b| {
        b.to_async(&rt).iter(|| async {
            let token = CancellationToken::new();
            let out =
                tokio::time::timeout(Duration::from_secs(1), token.run_until_cancelled(handler()))
                    .await
                    .unwrap()
                    .unwrap();
            drop(black_box(token));
            out
        })
    });
    g.finish();
}

fn cancel_wide(c: &mut Criterion) {
    let mut g = c.benchmark_group("cancel_root_with_10000_children");
    g.sample_size(30);
    g.bench_function("cancel_scope", |b| {
        b.iter_batched(
            || {
                let root = Scope::new();
                let kids: Vec<_> = (0..10_000).map(|_| root.child().build().unwrap()).collect();
                (root, kids)
            },
            |(root, kids)| {
                root.cancel();
                (root, kids)
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("tokio_util", |b| {
        b.iter_batched(
            || {
                let root = CancellationToken::new();
                let kids: Vec<_> = (0..10_000).map(|_| root.child_token()).collect();
                (root, kids)
            },
            |(root, kids)| {
                root.cancel();
                (root, kids)
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn cancel_deep(c: &mut Criterion) {
    let mut g = c.benchmark_group("cancel_chain_of_depth_1000");
    g.sample_size(30);
    g.bench_function("cancel_scope", |b| {
        b.iter_batched(
            || {
                let mut chain = vec![Scope::new()];
                for _ in 0..1000 {
                    let next = chain.last().unwrap().child().build().unwrap();
                    chain.push(next);
                }
                chain
            },
            |chain| {
                chain[0].cancel();
                chain
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("tokio_util", |b| {
        b.iter_batched(
            || {
                let mut chain = vec![CancellationToken::new()];
                for _ in 0..1000 {
                    let next = chain.last().unwrap().child_token();
                    chain.push(next);
                }
                chain
            },
            |chain| {
                chain[0].cancel();
                chain
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

/// Time from `cancel()` until 10,000 waiting tasks have all observed it.
fn cancel_observed_by_waiters(c: &mut Criterion) {
    const TASKS: usize = 10_000;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let mut g = c.benchmark_group("cancel_observed_by_10000_tasks");
    g.sample_size(20);

    async fn run<F, Fut>(wait: F, cancel: impl FnOnce()) -> Duration
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let ready = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::with_capacity(TASKS);
        for _ in 0..TASKS {
            let fut = wait();
            let ready = ready.clone();
            tasks.push(tokio::spawn(async move {
                let mut fut = std::pin::pin!(fut);
                // Poll once so the waiter is registered, then count it as ready.
                let _ = futures::poll!(fut.as_mut());
                ready.fetch_add(1, Ordering::SeqCst);
                fut.await;
            }));
        }
        while ready.load(Ordering::SeqCst) < TASKS {
            tokio::task::yield_now().await;
        }
        let start = Instant::now();
        cancel();
        for t in tasks {
            t.await.unwrap();
        }
        start.elapsed()
    }

    g.bench_function("cancel_scope", |b| {
        b.to_async(&rt).iter_custom(|iters| async move {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let s = Scope::new();
                let w = s.clone();
                total += run(move || w.cancelled(), || s.cancel()).await;
            }
            total
        })
    });
    g.bench_function("tokio_util", |b| {
        b.to_async(&rt).iter_custom(|iters| async move {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t = CancellationToken::new();
                let w = t.clone();
                total += run(move || w.clone().cancelled_owned(), || t.cancel()).await;
            }
            total
        })
    });
    g.finish();
}

/// Two threads creating and dropping children of one shared parent: time per create+drop.
fn contended_children(c: &mut Criterion) {
    const PER_THREAD: u64 = 50_000;
    let mut g = c.benchmark_group("two_threads_children_of_one_parent");
    g.sample_size(20);

    fn two_threads(iters: u64, work: Arc<dyn Fn() + Send + Sync>) -> Duration {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            let barrier = Arc::new(Barrier::new(3));
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let (barrier, work) = (barrier.clone(), work.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        for _ in 0..PER_THREAD {
                            work();
                        }
                    })
                })
                .collect();
            barrier.wait();
            let start = Instant::now();
            for t in threads {
                t.join().unwrap();
            }
            total += start.elapsed();
        }
        total
    }

    let scope = Scope::new();
    g.bench_function("cancel_scope", |b| {
        let scope = scope.clone();
        let work: Arc<dyn Fn() + Send + Sync> =
            Arc::new(move || drop(black_box(scope.child().build().unwrap())));
        b.iter_custom(|iters| two_threads(iters, work.clone()))
    });
    let token = CancellationToken::new();
    g.bench_function("tokio_util", |b| {
        let token = token.clone();
        let work: Arc<dyn Fn() + Send + Sync> =
            Arc::new(move || drop(black_box(token.child_token())));
        b.iter_custom(|iters| two_threads(iters, work.clone()))
    });
    g.finish();
}

criterion_group!(
    benches,
    is_cancelled,
    child_create_drop,
    child_with_deadline,
    request_root_with_deadline,
    cancel_wide,
    cancel_deep,
    cancel_observed_by_waiters,
    contended_children
);
criterion_main!(benches);
