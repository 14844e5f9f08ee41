//! Overhead of a guarded trivial query against the same query unguarded, side by side in one
//! criterion group, on SQLite in-memory (target ≤ 1.1x).
//!
//! * `sqlx_sqlite_select_1`: `SELECT 1` on a connection already held — the per-statement cost
//!   of the guard (budget check, register, dispatch, race against the cancel, receipt).
//! * `sqlx_sqlite_acquire_select_1`: acquire, `SELECT 1`, release — adds the per-acquisition
//!   cost (the scope's guard unit and the SQLite progress handler, one round trip to the
//!   connection's worker thread).
//!
//! Run: `cargo bench --bench sqlx_guard --features sqlx-sqlite`

// `criterion_group!` defines a `pub fn` without documentation.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use cancel_scope::integrations::sqlx::GuardedPool;
use cancel_scope::{ChildSpec, Scope};
use criterion::{criterion_group, criterion_main, Criterion};
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{Row, SqlitePool};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn pool(rt: &tokio::runtime::Runtime, test_before_acquire: bool) -> SqlitePool {
    rt.block_on(
        SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .test_before_acquire(test_before_acquire)
            .connect("sqlite::memory:"),
    )
    .expect("open sqlite")
}

fn select_1(c: &mut Criterion) {
    let rt = runtime();
    let pool = pool(&rt, true);
    let db = GuardedPool::new(pool.clone());
    // A request scope with a deadline, as in a server: the guard reads the clock per statement.
    let scope = rt.block_on(async { Scope::with_timeout(Duration::from_secs(24 * 3600)) });

    let mut group = c.benchmark_group("sqlx_sqlite_select_1");
    group.bench_function("unguarded", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut conn = pool.acquire().await.expect("acquire");
                let start = Instant::now();
                for _ in 0..iters {
                    let row = sqlx::query("SELECT 1")
                        .fetch_one(&mut *conn)
                        .await
                        .expect("select");
                    black_box(row.get::<i64, _>(0));
                }
                start.elapsed()
            })
        })
    });
    group.bench_function("guarded", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut conn = db.acquire(&scope).await.expect("acquire");
                let start = Instant::now();
                for _ in 0..iters {
                    let row = conn
                        .fetch_one(ChildSpec::read_only("select-1"), sqlx::query("SELECT 1"))
                        .await
                        .expect("select");
                    black_box(row.get::<i64, _>(0));
                }
                start.elapsed()
            })
        })
    });
    group.finish();
}

fn acquire_select_1(c: &mut Criterion) {
    let rt = runtime();
    // sqlx's default (test-before-acquire ping) for the unguarded side; the guarded side as
    // the module docs recommend (the progress-handler install replaces the ping).
    let pool = pool(&rt, true);
    let db = GuardedPool::new(pool.clone());
    let db_no_ping = GuardedPool::new(self::pool(&rt, false));
    let scope = rt.block_on(async { Scope::with_timeout(Duration::from_secs(24 * 3600)) });

    let mut group = c.benchmark_group("sqlx_sqlite_acquire_select_1");
    group.bench_function("unguarded", |b| {
        b.to_async(&rt).iter(|| async {
            let mut conn = pool.acquire().await.expect("acquire");
            let row = sqlx::query("SELECT 1")
                .fetch_one(&mut *conn)
                .await
                .expect("select");
            black_box(row.get::<i64, _>(0));
        })
    });
    group.bench_function("guarded", |b| {
        b.to_async(&rt).iter(|| async {
            let mut conn = db.acquire(&scope).await.expect("acquire");
            let row = conn
                .fetch_one(ChildSpec::read_only("select-1"), sqlx::query("SELECT 1"))
                .await
                .expect("select");
            black_box(row.get::<i64, _>(0));
        })
    });
    group.bench_function("guarded_no_test_before_acquire", |b| {
        b.to_async(&rt).iter(|| async {
            let mut conn = db_no_ping.acquire(&scope).await.expect("acquire");
            let row = conn
                .fetch_one(ChildSpec::read_only("select-1"), sqlx::query("SELECT 1"))
                .await
                .expect("select");
            black_box(row.get::<i64, _>(0));
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    targets = select_1, acquire_select_1
}
criterion_main!(benches);
