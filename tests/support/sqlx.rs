//! Steps the sqlx tests of both backends share.

use cancel_scope::integrations::sqlx::{Backend, GuardedPool};
use cancel_scope::{ChildSpec, Report, Scope};
use sqlx::IntoArguments;
use tokio::time::Instant;

/// Leaves a transaction block open on `db`'s connection, as a cancelled request does: `BEGIN`,
/// an `INSERT` of order `o-1`, the scope cancelled, its `COMMIT` refused; then the connection
/// is dropped and the scope's report returned once it is quiet.
pub async fn leave_a_block_open<DB: Backend>(db: &GuardedPool<DB>) -> Report
where
    for<'q> <DB as sqlx::Database>::Arguments<'q>: IntoArguments<'q, DB>,
{
    let scope = Scope::new();
    let mut conn = db.acquire(&scope).await.unwrap();
    conn.execute(ChildSpec::read_only("begin"), sqlx::query::<DB>("BEGIN"))
        .await
        .unwrap();
    conn.execute(
        ChildSpec::side_effecting("insert", "o-1"),
        sqlx::query::<DB>("INSERT INTO orders VALUES ('o-1')"),
    )
    .await
    .unwrap();
    scope.cancel();
    let err = conn
        .execute(
            ChildSpec::side_effecting("commit", "o-1"),
            sqlx::query::<DB>("COMMIT"),
        )
        .await
        .err()
        .expect("the call fails");
    assert!(err.is_cancelled(), "{err:?}");
    drop(conn);
    scope.quiesce().await
}

#[cfg(feature = "sqlx-sqlite")]
/// One in-memory database behind a pool of exactly one connection: "the next query on the same
/// pool" is then a query on the very connection that was interrupted.
pub async fn one_connection() -> GuardedPool<sqlx::Sqlite> {
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect("sqlite::memory:")
        .await
        .expect("open sqlite");
    sqlx::query("CREATE TABLE orders (id TEXT)")
        .execute(&pool)
        .await
        .unwrap();
    GuardedPool::new(pool).cleanup_budget(std::time::Duration::from_secs(5))
}

/// Cancels `scope` after `after`, returning when it did.
pub fn cancel_after(scope: &Scope, after: std::time::Duration) -> tokio::task::JoinHandle<Instant> {
    let scope = scope.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        scope.cancel();
        Instant::now()
    })
}

/// The number of orders on SQLite.
#[cfg(feature = "sqlx-sqlite")]
pub async fn count_orders(db: &GuardedPool<sqlx::Sqlite>) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(db.pool())
        .await
        .unwrap()
}
