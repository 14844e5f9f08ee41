//! `GuardedTransaction` on a real PostgreSQL server (a throwaway cluster per test, see
//! `support/postgres.rs`): commit, rollback and rollback on drop; after a cancel the
//! connection goes back to the pool clean; a `COMMIT` cut off after it was sent is
//! `EffectUnknown`. Real sockets, real time.

use std::time::Duration;

use crate::support::postgres::*;
use crate::support::sqlx::{
    assert_one_unknown_effect, begin_order, cancel_after, commit_cut_off,
    drop_two_open_transactions, nested_statement_cut_off, nested_transactions,
};
use cancel_scope::integrations::sqlx::GuardedPool;
use cancel_scope::{Lifecycle, Scope};
use sqlx::Postgres;

/// The pool's connection (pool of one: the very connection the test used) is clean: not in
/// a transaction block (`now()`, the start of the transaction, is the time of this query
/// string only outside one) and with the server's `statement_timeout` back.
async fn clean_for_the_next_user(db: &GuardedPool<Postgres>) {
    use sqlx::Row;
    // The simple protocol: one statement timestamp for the query string.
    let row = sqlx::raw_sql(
        "SELECT pg_catalog.now() = pg_catalog.statement_timestamp(), \
         pg_catalog.current_setting('statement_timeout')",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    let (outside_a_block, timeout): (bool, String) = (row.get(0), row.get(1));
    assert!(outside_a_block, "a transaction block was left open");
    assert_eq!(timeout, "0", "statement_timeout was not restored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_persists_and_a_transaction_dropped_open_is_rolled_back() {
    let Some(pg) = PgCluster::start("pg_tx_commit_and_drop") else {
        return;
    };
    let db = guarded(&pg, 1).await;
    create_orders(&db).await;
    let scope = Scope::with_timeout(Duration::from_secs(10));

    let tx = begin_order(&db, &scope).await;
    tx.commit().await.unwrap();
    assert_eq!(count_orders(&db).await, 1);
    clean_for_the_next_user(&db).await;

    // Dropped open, owning its connection and on a borrowed one: rolled back.
    let mut conn = drop_two_open_transactions(&db, &scope).await;
    let n: i64 = conn
        .fetch_one("count", sqlx::query_scalar("SELECT count(*) FROM orders"))
        .await
        .unwrap();
    assert_eq!(n, 1);
    conn.release().await;
    assert_eq!(count_orders(&db).await, 1);
    clean_for_the_next_user(&db).await;

    scope.close();
    let report = scope.quiesce().await;
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_cancel_the_transaction_is_rolled_back_and_the_connection_is_clean() {
    let Some(pg) = PgCluster::start("pg_tx_cancel") else {
        return;
    };
    let db = guarded(&pg, 1).await;
    create_orders(&db).await;

    // Cancelled between statements: the commit is refused, the rollback needs nothing sent.
    let scope = Scope::with_timeout(Duration::from_secs(10));
    let mut tx = db.begin(&scope, "place-order").await.unwrap();
    tx.execute("insert", sqlx::query("INSERT INTO orders VALUES ('o-1')"))
        .await
        .unwrap();
    scope.cancel();
    tx.rollback().await.unwrap();
    clean_for_the_next_user(&db).await;
    assert_eq!(count_orders(&db).await, 0);

    // Cancelled while a write of the transaction runs: the write is stopped on the server,
    // `Cancelled` (it is rolled back with the transaction, which can never commit), and the
    // clean-up rolls the block back before the connection goes back to the pool.
    let scope = Scope::with_timeout(Duration::from_secs(10));
    let mut tx = db.begin(&scope, "bulk-load").await.unwrap();
    tx.execute("insert", sqlx::query("INSERT INTO orders VALUES ('o-2')"))
        .await
        .unwrap();
    let canceller = cancel_after(&scope, Duration::from_millis(200));
    let err = tx
        .execute(
            "slow-insert",
            sqlx::query("INSERT INTO orders SELECT 'o-3' FROM pg_catalog.pg_sleep(30)"),
        )
        .await
        .unwrap_err();
    canceller.await.unwrap();
    assert!(err.is_cancelled() && !err.is_effect_unknown(), "{err:?}");
    drop(tx);
    let report = scope.quiesce().await;
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
    assert!(report.pending_effects().is_empty(), "{report}");
    assert!(report.undelivered_cancels().is_empty(), "{report}");
    clean_for_the_next_user(&db).await;
    assert_eq!(count_orders(&db).await, 0);
}

/// A `COMMIT` that runs a deferred constraint trigger taking 30 s: the scope is cancelled
/// while it runs, so the call returns at the cancel not knowing whether it committed:
/// `EffectUnknown` (here the server cancel stops the trigger, so it did not), and the
/// connection is clean for the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_cut_off_after_it_was_sent_is_an_unknown_effect() {
    let Some(pg) = PgCluster::start("pg_tx_commit_cut") else {
        return;
    };
    let db = guarded(&pg, 1).await;
    create_orders(&db).await;
    sqlx::raw_sql(
        "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS \
           $$ BEGIN PERFORM pg_catalog.pg_sleep(30); RETURN NULL; END $$; \
         CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON orders \
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();",
    )
    .execute(db.pool())
    .await
    .unwrap();

    let scope = Scope::with_timeout(Duration::from_secs(10));
    commit_cut_off(&db, &scope, "order-9", Duration::from_millis(300)).await;

    assert_one_unknown_effect(&scope.quiesce().await, "order-9");
    clean_for_the_next_user(&db).await;
    assert_eq!(
        count_orders(&db).await,
        0,
        "the server cancel stopped the commit"
    );
}

/// A statement of the transaction fails, so the block is aborted; PostgreSQL answers the
/// `COMMIT` of an aborted block with `ROLLBACK`. The commit is an error
/// ([`is_rolled_back`](cancel_scope::integrations::sqlx::Error::is_rolled_back)), its receipt
/// `Failed` (nothing committed, nothing to reconcile), and the connection is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commit_of_an_aborted_transaction_is_reported_rolled_back() {
    let Some(pg) = PgCluster::start("pg_tx_commit_aborted") else {
        return;
    };
    let db = guarded(&pg, 1).await;
    create_orders(&db).await;
    let scope = Scope::with_timeout(Duration::from_secs(10));

    let mut tx = begin_order(&db, &scope).await;
    let err = tx
        .fetch_one("typo", sqlx::query_scalar::<_, i32>("SELECT 1 / 0"))
        .await
        .unwrap_err();
    assert!(err.is_database(), "{err:?}");
    let err = tx.commit().await.unwrap_err();
    assert!(err.is_rolled_back(), "{err:?}");
    assert!(!err.is_effect_unknown() && !err.is_database(), "{err:?}");
    assert_eq!(count_orders(&db).await, 0);
    clean_for_the_next_user(&db).await;

    // The same for a raw `COMMIT` run through a connection.
    let mut conn = db.acquire(&scope).await.unwrap();
    conn.execute("begin", sqlx::raw_sql("BEGIN")).await.unwrap();
    conn.execute("insert", sqlx::query("INSERT INTO orders VALUES ('o-2')"))
        .await
        .unwrap();
    conn.execute("dup", sqlx::query("CREATE TABLE orders (id text)"))
        .await
        .unwrap_err();
    let err = conn
        .execute("commit", sqlx::raw_sql("COMMIT"))
        .await
        .unwrap_err();
    assert!(err.is_rolled_back(), "{err:?}");
    conn.release().await;
    assert_eq!(count_orders(&db).await, 0);
    clean_for_the_next_user(&db).await;

    scope.close();
    let report = scope.quiesce().await;
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
    assert_eq!(
        (report.succeeded(), report.failed()),
        (4, 4),
        "each BEGIN and INSERT succeeded; the failed statements and each COMMIT failed: {report}"
    );
    assert!(report.pending_effects().is_empty(), "{report}");
}

async fn order_ids(db: &GuardedPool<Postgres>) -> Vec<String> {
    sqlx::query_scalar("SELECT id FROM orders ORDER BY id")
        .fetch_all(db.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_transactions_are_savepoints_committed_only_with_the_outermost() {
    let Some(pg) = PgCluster::start("pg_tx_nested") else {
        return;
    };
    let db = guarded(&pg, 1).await;
    create_orders(&db).await;
    let report = nested_transactions(&db).await;
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
    assert_eq!(report.succeeded(), 20, "{report}");
    assert!(report.pending_effects().is_empty(), "{report}");
    assert_eq!(order_ids(&db).await, ["o-1", "o-4", "o-6"]);
    clean_for_the_next_user(&db).await;
}

/// A statement of a nested transaction fails, aborting the block; the nested transaction,
/// dropped, is rolled back to its savepoint, which ends the aborted state: the outer one goes
/// on and commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_nested_transaction_dropped_leaves_the_outer_one_able_to_commit() {
    let Some(pg) = PgCluster::start("pg_tx_nested_failed") else {
        return;
    };
    let db = guarded(&pg, 1).await;
    create_orders(&db).await;
    let scope = Scope::with_timeout(Duration::from_secs(10));
    let mut tx = begin_order(&db, &scope).await;
    let mut coupon = tx.begin("coupon").await.unwrap();
    coupon
        .execute("insert", sqlx::query("INSERT INTO orders VALUES ('o-2')"))
        .await
        .unwrap();
    let err = coupon
        .fetch_one("bad", sqlx::query_scalar::<_, i32>("SELECT 1 / 0"))
        .await
        .unwrap_err();
    assert!(err.is_database(), "{err:?}");
    drop(coupon);
    tx.execute("insert", sqlx::query("INSERT INTO orders VALUES ('o-3')"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(order_ids(&db).await, ["o-1", "o-3"]);
    clean_for_the_next_user(&db).await;
    scope.close();
    let report = scope.quiesce().await;
    assert_eq!((report.succeeded(), report.failed()), (7, 1), "{report}");
    assert!(report.pending_effects().is_empty(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_statement_cut_off_is_cancelled_and_nothing_commits() {
    let Some(pg) = PgCluster::start("pg_tx_nested_cut") else {
        return;
    };
    let db = guarded(&pg, 1).await;
    create_orders(&db).await;
    let report = nested_statement_cut_off(
        &db,
        "INSERT INTO orders SELECT 'o-2' FROM pg_catalog.pg_sleep(30)",
    )
    .await;
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
    assert!(report.pending_effects().is_empty(), "{report}");
    assert!(report.undelivered_cancels().is_empty(), "{report}");
    clean_for_the_next_user(&db).await;
    assert_eq!(count_orders(&db).await, 0);
}
