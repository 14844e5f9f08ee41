//! `GuardedTransaction` on SQLite: commit, rollback, rolled back on drop, bounded by the
//! scope; a `COMMIT` cut off after it was sent is `EffectUnknown`, a rollback after a cancel
//! leaves the connection clean for the pool. Real time, as `sqlx_sqlite.rs` (each connection
//! has a worker thread of its own).

use std::time::Duration;

use cancel_scope::integrations::sqlx::GuardedPool;
use cancel_scope::{ChildSpec, Lifecycle, Scope};
use sqlx::sqlite::SqliteJournalMode;
use sqlx::Sqlite;

use crate::support::sqlx::{
    assert_one_unknown_effect, cancel_after, commit_cut_off, count_orders,
    drop_two_open_transactions, file_database, nested_statement_cut_off, nested_transactions,
    one_connection,
};

/// The pool's only connection is not left in a transaction block: `BEGIN` works on it
/// (SQLite refuses a `BEGIN` inside a block), and then it is rolled back.
async fn no_block_left(db: &GuardedPool<Sqlite>) {
    let mut conn = db.pool().acquire().await.unwrap();
    sqlx::raw_sql("BEGIN; ROLLBACK")
        .execute(&mut *conn)
        .await
        .expect("no transaction block was left open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_transaction_persists_and_each_statement_is_a_child() {
    let db = one_connection().await;
    let scope = Scope::new();
    let mut tx = db
        .begin(&scope, ChildSpec::idempotent("place-order", "order-1"))
        .await
        .unwrap();
    tx.execute("insert", sqlx::query("INSERT INTO orders VALUES ('o-1')"))
        .await
        .unwrap();
    let n: i64 = tx
        .fetch_one("count", sqlx::query_scalar("SELECT count(*) FROM orders"))
        .await
        .unwrap();
    assert_eq!(n, 1, "its own writes are visible inside");
    tx.commit().await.unwrap();
    assert_eq!(count_orders(&db).await, 1);
    scope.close();
    let report = scope.quiesce().await;
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
    assert_eq!(report.succeeded(), 4, "BEGIN, INSERT, SELECT, COMMIT");
    no_block_left(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_open_it_is_rolled_back() {
    let db = one_connection().await;
    let scope = Scope::new();
    let mut conn = drop_two_open_transactions(&db, &scope).await;
    let n: i64 = conn
        .fetch_one("count", sqlx::query_scalar("SELECT count(*) FROM orders"))
        .await
        .unwrap();
    assert_eq!(n, 0);
    // And a new transaction can begin on it: the block was ended.
    conn.begin("again").await.unwrap().rollback().await.unwrap();
    conn.release().await;
    assert_eq!(count_orders(&db).await, 0);
    no_block_left(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_cancel_the_commit_is_refused_and_the_rollback_leaves_the_connection_clean() {
    let db = one_connection().await;
    let scope = Scope::new();
    let mut conn = db.acquire(&scope).await.unwrap();
    let mut tx = conn.begin("place-order").await.unwrap();
    tx.execute("insert", sqlx::query("INSERT INTO orders VALUES ('o-1')"))
        .await
        .unwrap();
    scope.cancel_with("client left");
    let err = tx.commit().await.unwrap_err();
    assert!(err.is_cancelled() && !err.is_effect_unknown(), "{err:?}");

    let mut tx = conn.begin("place-order").await.err();
    assert!(
        tx.take().unwrap().is_cancelled(),
        "nothing new after the cancel"
    );
    drop(conn);
    let report = scope.quiesce().await;
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
    assert!(report.pending_effects().is_empty(), "nothing was committed");
    assert_eq!(count_orders(&db).await, 0);
    no_block_left(&db).await;

    // The same with an explicit rollback, on a transaction that owns its connection: when it
    // returns, the connection is back in the pool, clean.
    let scope = Scope::new();
    let mut tx = db.begin(&scope, "place-order").await.unwrap();
    tx.execute("insert", sqlx::query("INSERT INTO orders VALUES ('o-2')"))
        .await
        .unwrap();
    scope.cancel();
    tx.rollback().await.unwrap();
    no_block_left(&db).await;
    assert_eq!(count_orders(&db).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_cut_off_inside_the_transaction_is_cancelled_not_an_unknown_effect() {
    let db = one_connection().await;
    let scope = Scope::new();
    let mut tx = db.begin(&scope, "bulk-load").await.unwrap();
    let canceller = cancel_after(&scope, Duration::from_millis(50));
    let err = tx
        .execute(
            "insert-many",
            sqlx::query(
                "INSERT INTO orders WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 \
                 FROM c WHERE x < 2000000000) SELECT 'o-' || x FROM c",
            ),
        )
        .await
        .unwrap_err();
    canceller.await.unwrap();
    assert!(err.is_cancelled() && !err.is_effect_unknown(), "{err:?}");
    // Cut off, it is rolled back with its transaction, which can never commit.
    tx.rollback().await.unwrap();
    let report = scope.quiesce().await;
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
    assert!(report.pending_effects().is_empty(), "{report}");
    assert_eq!(count_orders(&db).await, 0);
    no_block_left(&db).await;
}

/// A `COMMIT` waiting for its lock (another connection reads, in a rollback-journal database)
/// when the scope is cancelled: the call returns at the cancel, and may have committed (here
/// it does, once the reader lets go): `EffectUnknown`, never `Cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_cut_off_after_it_was_sent_is_an_unknown_effect() {
    let (_dir, mut reader, db) = file_database(
        |o| o.journal_mode(SqliteJournalMode::Delete),
        Duration::from_secs(5),
    )
    .await;
    // A read transaction: its shared lock keeps any COMMIT from taking the file.
    sqlx::raw_sql("BEGIN; SELECT count(*) FROM orders")
        .execute(&mut reader)
        .await
        .unwrap();

    let scope = Scope::new();
    commit_cut_off(&db, &scope, "order-7", Duration::from_millis(100)).await;

    sqlx::raw_sql("COMMIT").execute(&mut reader).await.unwrap();
    assert_one_unknown_effect(&scope.quiesce().await, "order-7");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_are_send_and_can_run_in_a_spawned_task() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<cancel_scope::integrations::sqlx::GuardedTransaction<'static, Sqlite>>();
    let db = one_connection().await;
    let scope = Scope::new();
    let task = tokio::spawn({
        let (db, scope) = (db.clone(), scope.clone());
        async move {
            let mut conn = db.acquire(&scope).await?;
            let mut tx = conn.begin("spawned").await?;
            tx.execute("insert", sqlx::query("INSERT INTO orders VALUES ('o-1')"))
                .await?;
            tx.commit().await
        }
    });
    task.await.unwrap().unwrap();
    assert_eq!(count_orders(&db).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_transactions_are_savepoints_committed_only_with_the_outermost() {
    let db = one_connection().await;
    let report = nested_transactions(&db).await;
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
    assert_eq!(report.succeeded(), 20, "{report}");
    assert!(report.pending_effects().is_empty(), "{report}");
    let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM orders ORDER BY id")
        .fetch_all(db.pool())
        .await
        .unwrap();
    assert_eq!(ids, ["o-1", "o-4", "o-6"]);
    no_block_left(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_statement_cut_off_is_cancelled_and_nothing_commits() {
    let db = one_connection().await;
    let report = nested_statement_cut_off(
        &db,
        "INSERT INTO orders WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 \
         FROM c WHERE x < 2000000000) SELECT 'o-2' FROM c",
    )
    .await;
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
    assert!(report.pending_effects().is_empty(), "{report}");
    assert_eq!(count_orders(&db).await, 0);
    no_block_left(&db).await;
}
