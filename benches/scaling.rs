//! One request's tree worked from N threads at once, against tokio-util doing the same job:
//! throughput per thread at each thread count, and the ratio to the anchor side by side.
//!
//! * `tree`: from N OS threads, each unit of work is a child scope of the one request root, a
//!   child registered in it, dispatched and receipted `succeed`, and the scope dropped. The
//!   anchor makes a child `CancellationToken` of one root token and counts a receipt in a
//!   shared atomic (what a user would add to know how many finished).
//! * `tasks`: on a runtime of N workers, N tasks each make a child scope, spawn a task into it
//!   and join it (its receipt is the scope's own). The anchor: a child token and a task into a
//!   `TaskTracker`, joined.
//!
//! The thread counts are 1, 2, 4, ... up to the machine's parallelism (or `--threads N`), so
//! the same command measures a larger machine unchanged. Each round runs every side at every
//! count, the order alternating; the figures are medians over the rounds.
//!
//! ```sh
//! cargo bench --bench scaling -- --rounds 5
//! ```

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use cancel_scope::{ChildSpec, Scope};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Units of work per thread in one measurement.
const TREE_UNITS: u64 = 1_000_000;
const TASK_UNITS: u64 = 100_000;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let option = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let most = option(
        "--threads",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    );
    let rounds = option("--rounds", 5).max(1);
    let mut counts = vec![1];
    while counts.last().copied().unwrap_or(1) * 2 <= most {
        counts.push(counts.last().copied().unwrap_or(1) * 2);
    }
    if counts.last() != Some(&most) {
        counts.push(most);
    }
    let tree = measure(rounds, &counts, TREE_UNITS, tree_scope, tree_token);
    print("tree", &counts, TREE_UNITS, &tree);
    let tasks = measure(rounds, &counts, TASK_UNITS, tasks_scope, tasks_token);
    print("tasks", &counts, TASK_UNITS, &tasks);
}

/// One side: the time of `units` per thread on `n` threads.
type Side = fn(usize, u64) -> Duration;

/// The median time of each side at each thread count: `[count][side]`.
fn measure(
    rounds: usize,
    counts: &[usize],
    units: u64,
    ours: Side,
    anchor: Side,
) -> Vec<[Duration; 2]> {
    let mut samples = vec![[Vec::new(), Vec::new()]; counts.len()];
    for round in 0..rounds {
        for (i, &n) in counts.iter().enumerate() {
            let sides: [(usize, Side); 2] = [(0, ours), (1, anchor)];
            for k in 0..2 {
                let (side, run) = sides[(k + round) % 2];
                samples[i][side].push(run(n, units));
            }
        }
    }
    samples
        .into_iter()
        .map(|[mut a, mut b]| [median(&mut a), median(&mut b)])
        .collect()
}

fn median(d: &mut [Duration]) -> Duration {
    d.sort();
    d[d.len() / 2]
}

fn print(group: &str, counts: &[usize], units: u64, medians: &[[Duration; 2]]) {
    println!("{group}: units per thread per second (median), ratio of times to the anchor");
    println!("threads  cancel_scope   tokio_util   ratio  scaling (per thread, to 1 thread)");
    let per_thread = |d: Duration| units as f64 / d.as_secs_f64();
    let one = medians[0].map(per_thread);
    for (&n, m) in counts.iter().zip(medians) {
        let [ours, anchor] = m.map(per_thread);
        println!(
            "{n:>7}  {ours:>12.0}  {anchor:>11.0}  {:>5.2}x  {:.2} / {:.2}",
            m[0].as_secs_f64() / m[1].as_secs_f64(),
            ours / one[0],
            anchor / one[1],
        );
    }
    println!();
}

/// Runs `work(units)` on `n` threads started together; the time until the last one ends.
fn on_threads(n: usize, units: u64, work: Arc<dyn Fn(u64) + Send + Sync>) -> Duration {
    let barrier = Arc::new(Barrier::new(n + 1));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let (barrier, work) = (barrier.clone(), work.clone());
            std::thread::spawn(move || {
                barrier.wait();
                work(units);
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for t in threads {
        t.join().unwrap();
    }
    start.elapsed()
}

fn tree_scope(n: usize, units: u64) -> Duration {
    let root = Scope::new();
    on_threads(
        n,
        units,
        Arc::new(move |units| {
            // The spec made once and cloned per call (a shared name: no allocation).
            let spec = ChildSpec::read_only("query");
            for _ in 0..units {
                let child = root.child().build().unwrap();
                let call = child.register(spec.clone()).unwrap();
                call.dispatch().unwrap().succeed();
                drop(black_box(child));
            }
        }),
    )
}

fn tree_token(n: usize, units: u64) -> Duration {
    let root = CancellationToken::new();
    let receipts = Arc::new(AtomicU64::new(0));
    on_threads(
        n,
        units,
        Arc::new(move |units| {
            for _ in 0..units {
                let child = root.child_token();
                receipts.fetch_add(1, Ordering::Relaxed);
                drop(black_box(child));
            }
        }),
    )
}

/// Runs `units` of `work` in each of `n` tasks on a runtime of `n` workers.
fn on_workers<F, Fut>(n: usize, units: u64, work: F) -> Duration
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(n)
        .build()
        .unwrap();
    rt.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let work = work.clone();
                tokio::spawn(async move {
                    for _ in 0..units {
                        work().await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        start.elapsed()
    })
}

fn tasks_scope(n: usize, units: u64) -> Duration {
    let root = Scope::new();
    on_workers(n, units, move || {
        let child = root.child().build().unwrap();
        async move {
            child
                .spawn(async { black_box(1u64) })
                .unwrap()
                .await
                .unwrap();
        }
    })
}

fn tasks_token(n: usize, units: u64) -> Duration {
    let root = CancellationToken::new();
    let tracker = TaskTracker::new();
    on_workers(n, units, move || {
        let child = root.child_token();
        let task = tracker.spawn(async move {
            let _child = child;
            black_box(1u64)
        });
        async move {
            task.await.unwrap();
        }
    })
}
