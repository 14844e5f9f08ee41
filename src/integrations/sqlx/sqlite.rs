//! SQLite: statements interrupted through a progress handler.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ::sqlx::pool::PoolConnection;
use ::sqlx::{Execute, Executor, Pool, Sqlite, SqliteConnection};

use super::{sealed, Backend, BoxFuture, CloseOnDrop, Cut, Release};

/// Virtual-machine instructions between two calls of the progress handler: an atomic load
/// every ~1000 instructions costs nothing measurable and stops a statement within
/// microseconds of the flag being set.
const PROGRESS_OPS: i32 = 1000;

/// Nothing per pool.
#[derive(Debug)]
pub struct SqlitePoolState(());

/// The interrupt flag read by the connection's progress handler and commit hook.
pub struct SqliteConnState {
    /// Set (Release) by `interrupt`; read (Acquire) by the handler on the worker thread.
    interrupt: Arc<AtomicBool>,
    /// Whether a statement of this acquisition may have opened a transaction block (then the
    /// release rolls back a block left open).
    may_open_block: bool,
}

impl fmt::Debug for SqliteConnState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteConnState")
            .field("interrupt", &self.interrupt.load(Ordering::Relaxed))
            .finish()
    }
}

impl sealed::Sealed for Sqlite {}

impl Backend for Sqlite {
    type PoolState = SqlitePoolState;
    type ConnState = SqliteConnState;

    const ROLLBACK: &'static str = "SAVEPOINT cancel_scope_rollback; ROLLBACK";

    fn pool_state(_pool: &Pool<Self>) -> SqlitePoolState {
        SqlitePoolState(())
    }

    async fn on_acquire(conn: &mut PoolConnection<Self>) -> Result<SqliteConnState, ::sqlx::Error> {
        let interrupt = Arc::new(AtomicBool::new(false));
        let flag = interrupt.clone();
        // A fresh handler per acquisition: sqlx gives no way to recognise a connection we have
        // seen before, so the flag cannot be looked up, only installed. Replacing the handler
        // drops the previous acquisition's closure.
        let mut handle = conn.lock_handle().await?;
        handle.set_progress_handler(PROGRESS_OPS, move || !flag.load(Ordering::Acquire));
        // The progress handler stops running statements, but not one that runs fewer
        // instructions than PROGRESS_OPS after the flag is raised, e.g. a short write that
        // was sleeping in the busy handler for another connection's lock: once the flag is
        // raised the commit hook turns its commit (any commit) into a rollback, so nothing of
        // the scope commits after the cancel, even when the clean-up gives up on the
        // statement and `quiesce` returns first (invariant 6).
        let veto = interrupt.clone();
        handle.set_commit_hook(move || !veto.load(Ordering::Acquire));
        Ok(SqliteConnState {
            interrupt,
            may_open_block: false,
        })
    }

    fn arm<'a>(
        _conn: &'a mut SqliteConnection,
        _state: &'a mut SqliteConnState,
        _budget: Option<Duration>,
    ) -> impl Future<Output = Result<(), ::sqlx::Error>> + Send + 'a {
        // No server to tell: the deadline is this process's, and the handler enforces it.
        std::future::ready(Ok(()))
    }

    fn note_statement(state: &mut SqliteConnState, sql: &str) {
        state.may_open_block |= may_open_block(sql);
    }

    fn interrupt(state: &SqliteConnState) {
        state.interrupt.store(true, Ordering::Release);
    }

    fn provider_handle(_state: &SqliteConnState) -> Option<String> {
        None
    }

    fn is_query_canceled(_err: &::sqlx::Error) -> bool {
        // Only our own handler interrupts, and only after the call has returned.
        false
    }

    fn is_session_lost(err: &::sqlx::Error) -> bool {
        // The worker thread died under the statement (its database errors are the
        // statement's own).
        matches!(
            err,
            ::sqlx::Error::WorkerCrashed | ::sqlx::Error::Io(_) | ::sqlx::Error::Protocol(_)
        )
    }

    fn release(
        _pool: &Arc<SqlitePoolState>,
        conn: PoolConnection<Self>,
        state: SqliteConnState,
        cut: Option<Cut>,
    ) -> Release<Self> {
        let abandoned = cut.is_some();
        // The interrupt flag is up: the progress handler stops the statement at its next
        // check, and the commit hook vetoes any commit of it.
        if let Some(cut) = cut {
            cut.finish();
        }
        if !abandoned && !state.may_open_block {
            // The handler and hook stay installed with their flag down: inert.
            return Release::Return(conn);
        }
        let mut conn = CloseOnDrop::new(conn);
        Release::CleanUp(Box::pin(async move {
            if abandoned {
                // `lock_handle` queues behind the interrupted statement on the worker thread,
                // so when it returns the statement has ended; then the raised flag is removed
                // with its handler and hook before anyone else gets the connection.
                match conn.conn().lock_handle().await {
                    Ok(mut handle) => {
                        handle.remove_progress_handler();
                        handle.remove_commit_hook();
                    }
                    Err(_) => return,
                }
            }
            // A transaction block the scope left open (a raw `BEGIN` whose `COMMIT` never
            // ran; an interrupted read does not end its block) must not reach the pool's next
            // user, whose `COMMIT` would commit this scope's writes after its `quiesce`
            // (invariant 6). SQLite cannot be asked without `unsafe`, so: `SAVEPOINT` opens
            // a block if none is open, and `ROLLBACK` then always has one to end.
            if !state.may_open_block
                || (&mut **conn.conn())
                    .execute(::sqlx::raw_sql(<Sqlite as Backend>::ROLLBACK))
                    .await
                    .is_ok()
            {
                conn.release();
            }
        }))
    }

    fn execute<'e, 'q: 'e, E: 'q + Execute<'q, Self>>(
        conn: &'e mut SqliteConnection,
        query: E,
    ) -> BoxFuture<'e, Result<::sqlx::sqlite::SqliteQueryResult, ::sqlx::Error>> {
        conn.execute(query)
    }

    fn fetch_all<'e, 'q: 'e, E: 'q + Execute<'q, Self>>(
        conn: &'e mut SqliteConnection,
        query: E,
    ) -> BoxFuture<'e, Result<Vec<::sqlx::sqlite::SqliteRow>, ::sqlx::Error>> {
        conn.fetch_all(query)
    }

    fn fetch_one<'e, 'q: 'e, E: 'q + Execute<'q, Self>>(
        conn: &'e mut SqliteConnection,
        query: E,
    ) -> BoxFuture<'e, Result<::sqlx::sqlite::SqliteRow, ::sqlx::Error>> {
        conn.fetch_one(query)
    }

    fn fetch<'e, 'q: 'e, E: 'q + Execute<'q, Self>>(
        conn: &'e mut SqliteConnection,
        query: E,
    ) -> futures_core::stream::BoxStream<'e, Result<::sqlx::sqlite::SqliteRow, ::sqlx::Error>> {
        conn.fetch(query)
    }

    fn fetch_optional<'e, 'q: 'e, E: 'q + Execute<'q, Self>>(
        conn: &'e mut SqliteConnection,
        query: E,
    ) -> BoxFuture<'e, Result<Option<::sqlx::sqlite::SqliteRow>, ::sqlx::Error>> {
        conn.fetch_optional(query)
    }
}

/// Whether `sql` may open a transaction block: only `BEGIN` and `SAVEPOINT` (outside a block)
/// do in SQLite. Conservative — the words anywhere, in any case — since a false alarm costs
/// only the release's rollback round trip, and a miss would hand an open block to the pool.
fn may_open_block(sql: &str) -> bool {
    let has = |word: &[u8]| {
        sql.as_bytes()
            .windows(word.len())
            .any(|w| w.eq_ignore_ascii_case(word))
    };
    has(b"begin") || has(b"savepoint")
}

#[cfg(test)]
mod tests {
    use super::may_open_block;

    #[test]
    fn statements_that_may_open_a_block_are_noticed() {
        for sql in [
            "BEGIN",
            "begin immediate",
            "  BeGiN TRANSACTION;",
            "SAVEPOINT sp1",
            "INSERT INTO t VALUES (1); begin; UPDATE t SET v = 2",
        ] {
            assert!(may_open_block(sql), "{sql}");
        }
        for sql in [
            "SELECT 1",
            "INSERT INTO t VALUES (1)",
            "COMMIT",
            "ROLLBACK",
            "",
        ] {
            assert!(!may_open_block(sql), "{sql}");
        }
    }
}
