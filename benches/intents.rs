//! The cost of a durable intent on the dispatch path: a side-effecting child registered,
//! dispatched and given its receipt, plainly (the anchor) and through a `Journal` that writes
//! the intent before the dispatch and resolves it after — in memory, and in PostgreSQL on a
//! throwaway cluster (`tests/support/postgres.rs`; skipped without the binaries), next to the
//! same two statements sent bare, the round trips' floor. The sides are measured in the same
//! iterations (`support/paired.rs`); each group ends with a `RATIO` line per side.
//!
//! `cargo bench --bench intents --features sqlx-postgres`

// `criterion_group!` defines a `pub fn` without documentation.
#![allow(missing_docs)]

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cancel_scope::integrations::sqlx::PgIntentStore;
use cancel_scope::reconcile::{InMemoryIntents, Journal};
use cancel_scope::{ChildSpec, Scope};
use criterion::{criterion_group, criterion_main, Criterion};
use sqlx::postgres::PgPoolOptions;

#[path = "support/paired.rs"]
mod paired;
use paired::Paired;

#[allow(dead_code)]
#[path = "../tests/support/postgres.rs"]
mod postgres;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A fresh effect id per call (a real workload's ids differ: every intent is a new row).
fn next_spec(counter: &Cell<u64>, side: &str) -> ChildSpec {
    let n = counter.get();
    counter.set(n + 1);
    ChildSpec::side_effecting("charge", format!("{side}-{n}")).payload_digest("sha256:ab12")
}

/// `n` calls of one side in one `block_on`, and how long they took.
fn timed<F: Future<Output = ()>>(
    rt: &tokio::runtime::Runtime,
    n: u64,
    side: impl Fn() -> F,
) -> Duration {
    rt.block_on(async {
        let t = Instant::now();
        for _ in 0..n {
            side().await;
        }
        t.elapsed()
    })
}

/// The anchor: register, dispatch, succeed.
fn plain(scope: &Scope, counter: &Cell<u64>) {
    let spec = next_spec(counter, "plain");
    scope.register(spec).unwrap().dispatch().unwrap().succeed();
}

async fn journaled(journal: &Journal, scope: &Scope, counter: &Cell<u64>, side: &str) {
    let spec = next_spec(counter, side);
    let ticket = scope.register(spec).unwrap();
    let call = journal.dispatch(ticket, Some("op-1")).await.unwrap();
    call.succeed().await.unwrap();
}

fn in_memory(c: &mut Criterion) {
    let rt = runtime();
    let scope = rt.block_on(async { Scope::with_timeout(Duration::from_secs(24 * 3600)) });
    // Big enough that the bound (resolved intents forgotten first) is never what is measured.
    let journal = Journal::new(Arc::new(InMemoryIntents::new().max(usize::MAX)));
    let counter = Cell::new(0);
    Paired::new("durable_dispatch_in_memory", 64)
        .side("plain", |n| {
            timed(&rt, n, || async { plain(&scope, &counter) })
        })
        .side("journal_in_memory", |n| {
            timed(&rt, n, || journaled(&journal, &scope, &counter, "mem"))
        })
        .run(c.benchmark_group("durable_dispatch_in_memory"));
}

fn in_postgres(c: &mut Criterion) {
    let Some(pg) = postgres::PgCluster::start("bench durable_dispatch_postgres") else {
        return;
    };
    let rt = runtime();
    let pool = rt
        .block_on(
            PgPoolOptions::new()
                .max_connections(1)
                .connect_with(pg.options()),
        )
        .expect("connect");
    let store = rt
        .block_on(PgIntentStore::builder(pool.clone()).open())
        .expect("open the intent store");
    let bare_insert = format!(
        "INSERT INTO {} (effect_id, name, class) VALUES ($1, 'charge', 'side-effecting')",
        store.table()
    );
    let bare_update = format!(
        "UPDATE {} SET resolution = 'applied' WHERE effect_id = $1 AND resolution IS NULL",
        store.table()
    );
    let journal = Journal::new(Arc::new(store));
    let scope = rt.block_on(async { Scope::with_timeout(Duration::from_secs(24 * 3600)) });
    let counter = Cell::new(0);
    Paired::new("durable_dispatch_postgres", 16)
        .side("plain", |n| {
            timed(&rt, n, || async { plain(&scope, &counter) })
        })
        .side("bare_insert_update", |n| {
            timed(&rt, n, || async {
                let spec = next_spec(&counter, "bare");
                let id = spec.effect_record().unwrap().effect_id().to_owned();
                sqlx::query(&bare_insert)
                    .bind(&id)
                    .execute(&pool)
                    .await
                    .unwrap();
                sqlx::query(&bare_update)
                    .bind(&id)
                    .execute(&pool)
                    .await
                    .unwrap();
            })
        })
        .side("journal_postgres", |n| {
            timed(&rt, n, || journaled(&journal, &scope, &counter, "pg"))
        })
        .run(c.benchmark_group("durable_dispatch_postgres"));
    // The cluster is stopped here, after the group.
    drop(pg);
}

criterion_group!(benches, in_memory, in_postgres);
criterion_main!(benches);
