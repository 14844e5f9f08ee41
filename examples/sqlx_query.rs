//! Database calls as children of a request's scope, on SQLite in-process (runs anywhere):
//! a guarded pool, a typed query under the request's budget, a slow query stopped at the
//! deadline, and the request's report.
//!
//! ```sh
//! cargo run --example sqlx_query --features sqlx-sqlite
//! ```

use std::time::{Duration, Instant};

use cancel_scope::integrations::sqlx::GuardedPool;
use cancel_scope::{ChildSpec, Lifecycle, Scope};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions, SqliteRow};
use sqlx::{FromRow, Row};

/// A row as the handler wants it (`#[derive(sqlx::FromRow)]` writes the same).
#[derive(Debug)]
struct Order {
    id: String,
    total_cents: i64,
}

impl FromRow<'_, SqliteRow> for Order {
    fn from_row(row: &SqliteRow) -> Result<Self, sqlx::Error> {
        Ok(Order {
            id: row.try_get("id")?,
            total_cents: row.try_get("total_cents")?,
        })
    }
}

/// Counts to two billion: minutes of work, unless something stops it.
const SLOW_REPORT: &str = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c \
                           WHERE x < 2000000000) SELECT count(*) FROM c";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A database file of its own (every connection of an in-memory pool would get a database
    // of its own), and a pool guarded by the scopes of the requests that use it.
    let dir = tempfile::tempdir()?;
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("shop.db"))
        .create_if_missing(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await?;
    sqlx::raw_sql(
        "CREATE TABLE orders (id TEXT PRIMARY KEY, total_cents INTEGER); \
         INSERT INTO orders VALUES ('o-1', 1250), ('o-2', 990), ('o-3', 4400);",
    )
    .execute(&pool)
    .await?;
    let db = GuardedPool::new(pool).min_useful(Duration::from_millis(5));

    // One request with a 300 ms budget, as an edge would admit it.
    let request = Scope::with_timeout(Duration::from_millis(300));
    // The handler's code runs with the request's scope current (as under `AdmitLayer`).
    request
        .run({
            let db = db.clone();
            async move {
                // No scope passed: the current one. Just a name: the statement's effect class
                // comes from its SQL (this SELECT is read-only).
                let orders: Vec<Order> = db
                    .fetch_all(
                        None,
                        "list-orders",
                        sqlx::query_as("SELECT id, total_cents FROM orders ORDER BY id"),
                    )
                    .await?;
                for o in &orders {
                    println!("{} {:>6.2}", o.id, o.total_cents as f64 / 100.0);
                }
                // A write says what it is: cut off after it was sent, it would be reported
                // as an effect to reconcile, never as "nothing happened".
                db.execute(
                    None,
                    ChildSpec::idempotent("mark-seen", "orders-seen-42"),
                    sqlx::query("UPDATE orders SET total_cents = total_cents WHERE id = ?")
                        .bind("o-1"),
                )
                .await?;
                Ok::<_, cancel_scope::integrations::sqlx::Error>(())
            }
        })
        .await??;

    // A slow report under what is left of the budget: stopped inside SQLite at the
    // request's deadline, not minutes later.
    let started = Instant::now();
    let err = db
        .fetch_one(
            &request,
            "slow-report",
            sqlx::query_scalar::<_, i64>(SLOW_REPORT),
        )
        .await
        .expect_err("the deadline stops it");
    println!("slow report: {err} after {:?}", started.elapsed());
    assert!(err.is_deadline_exceeded());

    // Every statement has a receipt, and the connections are back in the pool.
    let report = request.quiesce().await;
    println!("{report}");
    assert_eq!(report.state(), Lifecycle::CancelledStable);
    assert!(report.cause().is_some_and(|c| c.is_deadline_exceeded()));
    assert!(report.pending_effects().is_empty());

    // The pool serves the next request at once.
    let next = Scope::with_timeout(Duration::from_secs(1));
    let n: i64 = db
        .fetch_one(
            &next,
            "count",
            sqlx::query_scalar("SELECT count(*) FROM orders"),
        )
        .await?;
    println!("next request: {n} orders");
    Ok(())
}
