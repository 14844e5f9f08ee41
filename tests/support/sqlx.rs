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

/// A database file in a temporary directory (`options` on top of its defaults, with a 10 s
/// busy timeout), a connection to it outside the pool that created table `orders` (to hold
/// locks), and a guarded pool of one connection with `cleanup` as its clean-up budget. The
/// directory goes with the returned `TempDir`.
#[cfg(feature = "sqlx-sqlite")]
pub async fn file_database(
    options: impl FnOnce(sqlx::sqlite::SqliteConnectOptions) -> sqlx::sqlite::SqliteConnectOptions,
    cleanup: std::time::Duration,
) -> (
    tempfile::TempDir,
    sqlx::SqliteConnection,
    GuardedPool<sqlx::Sqlite>,
) {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let options = options(
        sqlx::sqlite::SqliteConnectOptions::new()
            .filename(dir.path().join("orders.db"))
            .create_if_missing(true)
            .busy_timeout(std::time::Duration::from_secs(10)),
    );
    let mut holder = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE orders (id TEXT)")
        .execute(&mut holder)
        .await
        .unwrap();
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    (dir, holder, GuardedPool::new(pool).cleanup_budget(cleanup))
}

/// Drops two transactions open, each after an `INSERT` into `orders`: one that owns its
/// connection, then one on a connection of `scope`, which is returned (its next statement
/// rolls the second one back first).
pub async fn drop_two_open_transactions<DB: Backend>(
    db: &GuardedPool<DB>,
    scope: &Scope,
) -> cancel_scope::integrations::sqlx::GuardedConnection<DB>
where
    for<'q> <DB as sqlx::Database>::Arguments<'q>: IntoArguments<'q, DB>,
{
    let mut tx = db.begin(scope, "discarded").await.unwrap();
    tx.execute(
        "insert",
        sqlx::query::<DB>("INSERT INTO orders VALUES ('o-2')"),
    )
    .await
    .unwrap();
    drop(tx);
    let mut conn = db.acquire(scope).await.unwrap();
    let mut tx = conn.begin("discarded too").await.unwrap();
    tx.execute(
        "insert",
        sqlx::query::<DB>("INSERT INTO orders VALUES ('o-3')"),
    )
    .await
    .unwrap();
    drop(tx);
    conn
}

/// Begins a transaction whose `COMMIT` is registered with effect id `effect`, inserts an
/// order, and has `scope` cancelled `after` the `COMMIT` was sent; checks that the call says
/// the effect is unknown.
pub async fn commit_cut_off<DB: Backend>(
    db: &GuardedPool<DB>,
    scope: &Scope,
    effect: &str,
    after: std::time::Duration,
) where
    for<'q> <DB as sqlx::Database>::Arguments<'q>: IntoArguments<'q, DB>,
{
    let mut tx = db
        .begin(scope, ChildSpec::side_effecting("place-order", effect))
        .await
        .unwrap();
    tx.execute(
        "insert",
        sqlx::query::<DB>("INSERT INTO orders VALUES ('o-9')"),
    )
    .await
    .unwrap();
    let canceller = cancel_after(scope, after);
    let err = tx.commit().await.unwrap_err();
    canceller.await.unwrap();
    assert!(err.is_cancelled() && err.is_effect_unknown(), "{err:?}");
}

/// The report of a scope whose one unknown effect is `effect`.
pub fn assert_one_unknown_effect(report: &Report, effect: &str) {
    assert_eq!(
        report.state(),
        cancel_scope::Lifecycle::NeedsReconciliation,
        "{report}"
    );
    assert_eq!(report.effect_unknown(), 1, "{report}");
    assert_eq!(report.pending_effects()[0].effect_id(), effect);
}

/// Inserts order `id` through `tx` (any transaction, nested or not).
async fn insert<DB: Backend>(
    tx: &mut cancel_scope::integrations::sqlx::GuardedTransaction<'_, DB>,
    id: &str,
) where
    for<'q> <DB as sqlx::Database>::Arguments<'q>: IntoArguments<'q, DB>,
{
    let sql = format!("INSERT INTO orders VALUES ('{id}')");
    tx.execute("insert", sqlx::query::<DB>(&sql)).await.unwrap();
}

/// Begins transaction `place-order` (its `COMMIT` registered idempotent with key
/// `order-1`) on a connection of its own for `scope`, and inserts order o-1 in it.
pub async fn begin_order<DB: Backend>(
    db: &GuardedPool<DB>,
    scope: &Scope,
) -> cancel_scope::integrations::sqlx::GuardedTransaction<'static, DB>
where
    for<'q> <DB as sqlx::Database>::Arguments<'q>: IntoArguments<'q, DB>,
{
    let mut tx = db
        .begin(scope, ChildSpec::idempotent("place-order", "order-1"))
        .await
        .unwrap();
    insert(&mut tx, "o-1").await;
    tx
}

/// Nested transactions (savepoints) ended every way, on one scope, whose report is returned
/// once it is quiet. Leaves exactly orders o-1, o-4 and o-6 committed:
/// * o-2 and o-3: two nested levels dropped open (the inner one first), rolled back to the
///   outer savepoint before o-4 is inserted;
/// * o-5: a nested transaction rolled back;
/// * o-6: a nested transaction committed, then its outer one;
/// * o-7: a nested transaction committed (released), then its outer one rolled back — a
///   released savepoint commits nothing.
///
/// 20 statements, each `Succeeded`.
pub async fn nested_transactions<DB: Backend>(db: &GuardedPool<DB>) -> Report
where
    for<'q> <DB as sqlx::Database>::Arguments<'q>: IntoArguments<'q, DB>,
{
    let scope = Scope::new();
    let mut tx = begin_order(db, &scope).await;
    let mut lines = tx.begin("lines").await.unwrap();
    insert(&mut lines, "o-2").await;
    let mut coupon = lines.begin("coupon").await.unwrap();
    insert(&mut coupon, "o-3").await;
    drop(coupon);
    drop(lines);
    insert(&mut tx, "o-4").await; // after the rollback to the savepoint of `lines`
    let mut gift = tx.begin("gift").await.unwrap();
    insert(&mut gift, "o-5").await;
    gift.rollback().await.unwrap();
    let mut note = tx.begin("note").await.unwrap();
    insert(&mut note, "o-6").await;
    note.commit().await.unwrap();
    tx.commit().await.unwrap();

    let mut tx = db.begin(&scope, "second").await.unwrap();
    let mut inner = tx.begin("inner").await.unwrap();
    insert(&mut inner, "o-7").await;
    inner.commit().await.unwrap();
    tx.rollback().await.unwrap();

    scope.close();
    scope.quiesce().await
}

/// A statement of a nested transaction (`slow`, inserting order o-2) cut off by the scope's
/// cancel, after order o-1 was inserted in the outer one: the call is cancelled, not an
/// unknown effect (nothing commits before the outermost `COMMIT`, which can never be sent
/// now), and nothing more is sent. Returns the scope's report once it is quiet.
pub async fn nested_statement_cut_off<DB: Backend>(db: &GuardedPool<DB>, slow: &str) -> Report
where
    for<'q> <DB as sqlx::Database>::Arguments<'q>: IntoArguments<'q, DB>,
{
    let scope = Scope::new();
    let mut tx = begin_order(db, &scope).await;
    let mut lines = tx.begin("lines").await.unwrap();
    let canceller = cancel_after(&scope, std::time::Duration::from_millis(200));
    let err = lines
        .execute("slow", sqlx::query::<DB>(slow))
        .await
        .err()
        .expect("the call fails");
    canceller.await.unwrap();
    assert!(err.is_cancelled() && !err.is_effect_unknown(), "{err:?}");
    assert!(lines.commit().await.is_err(), "nothing more is sent");
    assert!(tx.commit().await.is_err(), "nothing more is sent");
    scope.quiesce().await
}
