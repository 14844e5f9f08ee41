//! Steps the sqlx tests of both backends share.

use cancel_scope::integrations::sqlx::{Backend, GuardedPool};
use cancel_scope::{ChildSpec, Report, Scope};
use sqlx::IntoArguments;

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
