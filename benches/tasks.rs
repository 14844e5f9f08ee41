//! Spawning into a scope against tokio's `spawn`, tokio-util's `TaskTracker` and `JoinSet`,
//! side by side in one group each, and against the same anchors with a tokio-util
//! `CancellationToken` that stops each task (`*_until_cancelled`: the scope's job done with
//! tokio-util, minus receipts and the report). The sides of a group are measured in the same iterations
//! (`support/paired.rs`), and the group ends with a `RATIO` line per side.
//!
//! `cargo bench --bench tasks`

// `criterion_group!` defines a `pub fn` without documentation.
#![allow(missing_docs)]

use std::future::Future;
use std::hint::black_box;
use std::time::{Duration, Instant};

use cancel_scope::Scope;
use criterion::{criterion_group, criterion_main, Criterion};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[path = "support/paired.rs"]
mod paired;
use paired::Paired;

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
    let scope = Scope::new();
    Paired::new("spawn_join", 128)
        .side("tokio_spawn", |n| {
            rt.block_on(async {
                let t = Instant::now();
                for _ in 0..n {
                    black_box(tokio::spawn(async { 1u64 }).await.unwrap());
                }
                t.elapsed()
            })
        })
        .side("cancel_scope", |n| scope_spawn_join(&rt, &scope, n))
        .run(c.benchmark_group("spawn_join"));

    // What tokio and tokio-util offer for the same job (a task that a cancel stops), as the
    // anchor of a group of its own: a third side in the group above changes its anchor's
    // figure (tokio_spawn ran faster beside it, in every run).
    let token = CancellationToken::new();
    Paired::new("spawn_join_until_cancelled", 128)
        .side("tokio_spawn_until_cancelled", |n| {
            rt.block_on(async {
                let t = Instant::now();
                for _ in 0..n {
                    let run = token.clone().run_until_cancelled_owned(async { 1u64 });
                    black_box(tokio::spawn(run).await.unwrap());
                }
                t.elapsed()
            })
        })
        .side("cancel_scope", |n| scope_spawn_join(&rt, &scope, n))
        .run(c.benchmark_group("spawn_join_until_cancelled"));
}

/// `n` spawns into `scope`, each joined before the next, and how long they took.
fn scope_spawn_join(rt: &tokio::runtime::Runtime, scope: &Scope, n: u64) -> Duration {
    rt.block_on(async {
        let t = Instant::now();
        for _ in 0..n {
            black_box(scope.spawn(async { 1u64 }).unwrap().await.unwrap());
        }
        t.elapsed()
    })
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

/// `TaskTracker` with a `CancellationToken` that each task stops at: what tokio-util offers
/// for the scope's job (tasks a cancel stops, and a wait for all of them), without receipts or
/// a report.
async fn task_tracker_until_cancelled() {
    let tracker = TaskTracker::new();
    let token = CancellationToken::new();
    for _ in 0..TASKS {
        let run = token
            .clone()
            .run_until_cancelled_owned(async { tokio::task::yield_now().await });
        tracker.spawn(run);
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

/// The four side by side, spawning from the benchmark's `block_on` thread (one task at a time
/// through the runtime's injection queue) or, `in_a_worker`, from inside a task on a worker,
/// as a request handler spawns (into that worker's run queue, which moves half of itself to
/// the injection queue, in a batch, whenever it is full).
fn spawn_many_then_wait(c: &mut Criterion, group: &str, in_a_worker: bool) {
    let rt = runtime();
    let mut g = c.benchmark_group(group);
    g.sample_size(20);
    Paired::new(group, 1)
        .side("task_tracker", |n| {
            rounds(&rt, n, in_a_worker, task_tracker)
        })
        .side("cancel_scope_quiesce", |n| {
            rounds(&rt, n, in_a_worker, || async {
                black_box(scope_quiesce().await);
            })
        })
        .side("join_set", |n| rounds(&rt, n, in_a_worker, join_set))
        .side("task_tracker_until_cancelled", |n| {
            rounds(&rt, n, in_a_worker, task_tracker_until_cancelled)
        })
        .run(g);
}

/// `n` rounds of one side, from `block_on` or in a worker task, and how long they took.
fn rounds<F>(rt: &tokio::runtime::Runtime, n: u64, in_a_worker: bool, side: fn() -> F) -> Duration
where
    F: Future<Output = ()> + Send + 'static,
{
    rt.block_on(async {
        let t = Instant::now();
        for _ in 0..n {
            if in_a_worker {
                tokio::spawn(side()).await.unwrap();
            } else {
                side().await;
            }
        }
        t.elapsed()
    })
}

fn spawn_many_then_quiesce(c: &mut Criterion) {
    spawn_many_then_wait(c, "spawn_10000_then_wait_for_all", false);
    spawn_many_then_wait(c, "spawn_10000_then_wait_for_all_in_a_worker", true);
}

criterion_group!(benches, spawn_join, spawn_many_then_quiesce);
criterion_main!(benches);
