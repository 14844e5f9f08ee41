//! Spawning into a scope against tokio's `spawn`, tokio-util's `TaskTracker` and `JoinSet`,
//! side by side in one group each.
//!
//! `cargo bench --bench tasks`

use cancel_scope::Scope;
use criterion::{criterion_group, criterion_main, Criterion};
use tokio::task::JoinSet;
use tokio_util::task::TaskTracker;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap()
}

fn spawn_join(c: &mut Criterion) {
    // One thread: a cross-thread wake-up would dominate (and blur) the difference.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("spawn_join");
    let scope = Scope::new();
    g.bench_function("cancel_scope", |b| {
        b.to_async(&rt)
            .iter(|| async { scope.spawn(async { 1u64 }).unwrap().await.unwrap() })
    });
    g.bench_function("tokio_spawn", |b| {
        b.to_async(&rt)
            .iter(|| async { tokio::spawn(async { 1u64 }).await.unwrap() })
    });
    g.finish();
}

const TASKS: usize = 10_000;

/// 10,000 tasks spawned into a scope, which is then closed and quiesced.
async fn scope_quiesce() -> u64 {
    let scope = Scope::new();
    for _ in 0..TASKS {
        // The handle is not needed: quiesce waits for every task.
        drop(
            scope
                .spawn(async { tokio::task::yield_now().await })
                .unwrap(),
        );
    }
    scope.close();
    scope.quiesce().await.succeeded()
}

/// The same with tokio-util's `TaskTracker`: spawn, close, wait.
async fn task_tracker() {
    let tracker = TaskTracker::new();
    for _ in 0..TASKS {
        tracker.spawn(async { tokio::task::yield_now().await });
    }
    tracker.close();
    tracker.wait().await;
}

/// The same with tokio's `JoinSet`: spawn, then join every task.
async fn join_set() {
    let mut set = JoinSet::new();
    for _ in 0..TASKS {
        set.spawn(async { tokio::task::yield_now().await });
    }
    while set.join_next().await.is_some() {}
}

/// The three side by side, spawning from the benchmark's `block_on` thread (one task at a time
/// through the runtime's injection queue) or, `in_a_worker`, from inside a task on a worker,
/// as a request handler spawns (into that worker's run queue, which moves half of itself to
/// the injection queue, in a batch, whenever it is full).
fn spawn_many_then_wait(c: &mut Criterion, group: &str, in_a_worker: bool) {
    let rt = runtime();
    let mut g = c.benchmark_group(group);
    g.sample_size(20);
    g.bench_function("cancel_scope_quiesce", |b| {
        b.to_async(&rt).iter(|| async {
            if in_a_worker {
                tokio::spawn(scope_quiesce()).await.unwrap()
            } else {
                scope_quiesce().await
            }
        })
    });
    g.bench_function("task_tracker", |b| {
        b.to_async(&rt).iter(|| async {
            if in_a_worker {
                tokio::spawn(task_tracker()).await.unwrap()
            } else {
                task_tracker().await
            }
        })
    });
    g.bench_function("join_set", |b| {
        b.to_async(&rt).iter(|| async {
            if in_a_worker {
                tokio::spawn(join_set()).await.unwrap()
            } else {
                join_set().await
            }
        })
    });
    g.finish();
}

fn spawn_many_then_quiesce(c: &mut Criterion) {
    spawn_many_then_wait(c, "spawn_10000_then_wait_for_all", false);
    spawn_many_then_wait(c, "spawn_10000_then_wait_for_all_in_a_worker", true);
}

criterion_group!(benches, spawn_join, spawn_many_then_quiesce);
criterion_main!(benches);
